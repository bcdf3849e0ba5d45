//! QP context (`Qpc`, 256 bytes): the hns "v2" QPC (HIP08 size; HIP09's second 256 bytes,
//! the congestion-control extension `QPCEX_*`, are not part of this layout).
//!
//! A QPC is never created directly: RESET→INIT is a MODIFY_QPC with an all-zero mask, and
//! every later modify sends a new context followed by a mask (mask bit 1 = keep the
//! device's bit, see [`Layout::all_ones`] and [`Layout::open_field`]).
//!
//! Positions are those of the reference sheet (§5.3, §6.2, §10). The sheet names a few
//! fields that the driver only clears (RX_REQ_MSN, IRRL_PSN, …) without giving their bits;
//! those are declared at their `hns_roce_hw_v2.h` positions and say so in their docs.
//! `V2_IRRL_HEAD` (hns 1543:1536) overlaps `OWNER_MODE` (1536) and `DCA_MODE` (1542) and is
//! not declared; see [`Qpc::OWNER_MODE`].

use super::{ContextError, Mtu, QpState, ServiceType};
#[cfg(doc)]
use crate::bits::Layout;

crate::layout! {
    /// QP context, 256 bytes (hns `struct hns_roce_v2_qp_context` without the extension).
    pub struct Qpc[256] {
        /// Transport service type: RC 0, UC 1, RD 2, UD 3 (incl. GSI), XRC 5; see `ServiceType`.
        TST / service_type_raw / set_service_type_raw: u8 = 2:0,
        /// log2(number of 16-byte extended-SGE slots), page-aligned; 0 if the QP has none.
        SGE_SHIFT / sge_shift / set_sge_shift: u8 = 7:3,
        /// Congestion-notification-packet timer (HIP09 congestion control; unit not documented).
        CNP_TIMER / cnp_timer / set_cnp_timer: u32 = 31:8,
        /// QP buffer (SQ, extended SGE, RQ regions) root BT address >> 3 (hns WQE_SGE_BA_L/_H).
        WQE_SGE_BA / wqe_sge_base_address / set_wqe_sge_base_address: u64 = 92:32,
        /// SQ region hop number: 0 = direct, 1..3 BT levels.
        SQ_HOP_NUM / sq_hop_number / set_sq_hop_number: u8 = 94:93,
        /// QP buffer BT page size, encoded page_shift − 12.
        WQE_SGE_BA_PG_SZ / wqe_sge_ba_page_size / set_wqe_sge_ba_page_size: u8 = 99:96,
        /// QP buffer data page size, encoded page_shift − 12.
        WQE_SGE_BUF_PG_SZ / wqe_sge_buffer_page_size / set_wqe_sge_buffer_page_size: u8 = 103:100,
        /// Protection domain number (24 bits).
        PD / protection_domain / set_protection_domain: u32 = 127:104,
        /// RQ region hop number: 0 = direct, 1..3 BT levels.
        RQ_HOP_NUM / rq_hop_number / set_rq_hop_number: u8 = 129:128,
        /// Extended-SGE region hop number: 0 = direct, 1..3 BT levels.
        SGE_HOP_NUM / sge_hop_number / set_sge_hop_number: u8 = 131:130,
        /// log2(max SGEs per RQ WQE); the RQ WQE stride is 16 B << RQWS.
        RQWS / rq_max_sge_shift / set_rq_max_sge_shift: u8 = 135:132,
        /// log2(SQ depth in WQEs).
        SQ_SHIFT / sq_shift / set_sq_shift: u8 = 139:136,
        /// log2(RQ depth in WQEs); 0 with no RQ.
        RQ_SHIFT / rq_shift / set_rq_shift: u8 = 143:140,
        /// Source GID index (GMV table entry on HIP09, SGID table index on HIP08).
        GMV_IDX / sgid_index / set_sgid_index: u16 = 159:144,
        /// IP hop limit / TTL for outgoing packets.
        HOPLIMIT / hop_limit / set_hop_limit: u8 = 167:160,
        /// IP traffic class (RoCEv2: DSCP = TC >> 2, ECN in bits 1:0).
        TC / traffic_class / set_traffic_class: u8 = 175:168,
        /// VLAN id; 0xFFF = no VLAN.
        VLAN_ID / vlan_id / set_vlan_id: u16 = 187:176,
        /// Path MTU, IB enum 1 = 256 … 5 = 4096; see `Mtu`.
        MTU / mtu_raw / set_mtu_raw: u8 = 191:188,
        /// IPv6 flow label (20 bits).
        FL / flow_label / set_flow_label: u32 = 211:192,
        /// Service level (0..7; priority of the QP's traffic).
        SL / service_level / set_service_level: u8 = 215:212,
        /// A CNP is to be sent (HIP09 congestion control state).
        CNP_TX_FLAG / cnp_tx_flag / set_cnp_tx_flag: bool = 216:216,
        /// A CE-marked packet was received (HIP09 congestion control state).
        CE_FLAG / ce_flag / set_ce_flag: bool = 217:217,
        /// Loopback indicator: the destination MAC is the port's own, deliver internally.
        LBI / loopback / set_loopback: bool = 218:218,
        /// Local ACK timeout exponent: 4.096 µs × 2^AT (HIP08 driver adds 10, range 0..20).
        AT / ack_timeout / set_ack_timeout: u8 = 223:219,
        /// Destination GID bytes 0..7 as stored at byte 28 (read as LE u64); use `Qpc::dgid`.
        DGID_L / dgid_low / set_dgid_low: u64 = 287:224,
        /// Destination GID bytes 8..15 as stored at byte 36 (read as LE u64); use `Qpc::dgid`.
        DGID_H / dgid_high / set_dgid_high: u64 = 351:288,
        /// Destination MAC, MAC byte 0 in the lowest byte (byte 44) (hns DMAC_L 383:352 + DMAC_H 399:384); use `Qpc::dmac`.
        DMAC / dmac_raw / set_dmac_raw: u64 = 399:352,
        /// RoCEv2 UDP source port (0 for RoCEv1).
        UDPSPN / udp_source_port / set_udp_source_port: u16 = 415:400,
        /// Destination QP number (24 bits).
        DQPN / destination_qpn / set_destination_qpn: u32 = 439:416,
        /// SQ transmit-side error flag (hns status bit; bit order from hns_roce_hw_v2.h).
        SQ_TX_ERR / sq_tx_error / set_sq_tx_error: bool = 440:440,
        /// SQ receive-side (ACK) error flag (hns status bit).
        SQ_RX_ERR / sq_rx_error / set_sq_rx_error: bool = 441:441,
        /// RQ transmit-side (response) error flag (hns status bit).
        RQ_TX_ERR / rq_tx_error / set_rq_tx_error: bool = 442:442,
        /// RQ receive-side (request) error flag (hns status bit).
        RQ_RX_ERR / rq_rx_error / set_rq_rx_error: bool = 443:443,
        /// log2 of packets per long-message chunk; the driver writes log2(max(mtu, 1024) / mtu).
        LP_PKTN_INI / lp_packet_count_init / set_lp_packet_count_init: u8 = 447:444,
        /// Congestion algorithm template id: firmware cong_algo_tmpl_id + type × 64 (HIP09).
        CONG_ALGO_TMPL_ID / congestion_template_id / set_congestion_template_id: u8 = 455:448,
        /// Congestion-control token count (HIP09; unit not documented).
        SCC_TOKEN / scc_token / set_scc_token: u32 = 474:456,
        /// An SQ doorbell is being processed (hardware state).
        SQ_DB_DOING / sq_doorbell_in_progress / set_sq_doorbell_in_progress: bool = 475:475,
        /// An RQ doorbell is being processed (hardware state).
        RQ_DB_DOING / rq_doorbell_in_progress / set_rq_doorbell_in_progress: bool = 476:476,
        /// QP state, IB numbering 0 RESET … 7 SQ_DRAINING; see `QpState`.
        QP_ST / qp_state_raw / set_qp_state_raw: u8 = 479:477,
        /// Q_Key (UD/GSI) or XRC domain number (XRC target).
        QKEY_XRCD / qkey_xrcd / set_qkey_xrcd: u32 = 511:480,
        /// RQ record doorbell enable: the device reads the RQ head from host memory.
        RQ_RECORD_EN / rq_record_enable / set_rq_record_enable: bool = 512:512,
        /// RQ record doorbell DMA address >> 1 (hns RQ_DB_RECORD_ADDR_L/_H); use `Qpc::rq_record_address`.
        RQ_DB_RECORD_ADDR / rq_record_address_raw / set_rq_record_address_raw: u64 = 575:513,
        /// SRQ number used for receives when SRQ_EN is set (24 bits).
        SRQN / srq_number / set_srq_number: u32 = 599:576,
        /// Receives consume WQEs from SRQ `SRQN` instead of the QP's own RQ.
        SRQ_EN / srq_enable / set_srq_enable: bool = 600:600,
        /// Remote read enable (IB_ACCESS_REMOTE_READ).
        RRE / remote_read_enable / set_remote_read_enable: bool = 601:601,
        /// Remote write enable (IB_ACCESS_REMOTE_WRITE).
        RWE / remote_write_enable / set_remote_write_enable: bool = 602:602,
        /// Remote atomic enable (IB_ACCESS_REMOTE_ATOMIC).
        ATE / remote_atomic_enable / set_remote_atomic_enable: bool = 603:603,
        /// RQ inline enable: small receives are written into the RQ WQE (RC only).
        RQIE / rq_inline_enable / set_rq_inline_enable: bool = 604:604,
        /// Extended (masked) atomic enable.
        EXT_ATE / extended_atomic_enable / set_extended_atomic_enable: bool = 605:605,
        /// Insert the VLAN tag on responses (HIP08).
        RQ_VLAN_EN / rq_vlan_enable / set_rq_vlan_enable: bool = 606:606,
        /// CQ number for receive completions (24 bits).
        RX_CQN / receive_cq_number / set_receive_cq_number: u32 = 631:608,
        /// XRC QP type flag, set for XRC targets.
        XRC_QP_TYPE / xrc_qp_type / set_xrc_qp_type: bool = 632:632,
        /// CQE inline enable: small receives are written into the CQE (HIP09).
        CQEIE / cqe_inline_enable / set_cqe_inline_enable: bool = 633:633,
        /// CQE inline companion bit (hns CQEIS; the driver writes 0, meaning not documented).
        CQEIS / cqe_inline_select / set_cqe_inline_select: bool = 634:634,
        /// Minimum RNR NAK timer, IB 5-bit encoding (HIP08 driver forces 1).
        MIN_RNR_TIME / min_rnr_timer / set_min_rnr_timer: u8 = 639:635,
        /// RQ producer index (16-bit free-running WQE count); written at →ERR to bound the flush.
        RQ_PRODUCER_IDX / rq_producer_index / set_rq_producer_index: u16 = 655:640,
        /// RQ consumer index (16-bit free-running WQE count).
        RQ_CONSUMER_IDX / rq_consumer_index / set_rq_consumer_index: u16 = 671:656,
        /// First RQ page address >> 12 (hns RQ_CUR_BLK_ADDR_L/_H).
        RQ_CUR_BLK_ADDR / rq_current_block_address / set_rq_current_block_address: u64 = 723:672,
        /// Responder message sequence number (hns_roce_hw_v2.h position; sheet names it without bits).
        RX_REQ_MSN / rx_request_msn / set_rx_request_msn: u32 = 759:736,
        /// Second RQ page address >> 12 (hns RQ_NXT_BLK_ADDR_L/_H).
        RQ_NXT_BLK_ADDR / rq_next_block_address / set_rq_next_block_address: u64 = 819:768,
        /// Flush enable: the QP is flushing its WQEs with WR_FLUSH_ERR completions.
        FLUSH_EN / flush_enable / set_flush_enable: bool = 821:821,
        /// Invalid credit: no end-to-end credits are advertised (set for XRC and SRQ QPs).
        INV_CREDIT / invalid_credit / set_invalid_credit: bool = 832:832,
        /// Responder saw a PSN sequence error (hns_roce_hw_v2.h position; sheet names it without bits).
        RX_REQ_PSN_ERR / rx_request_psn_error / set_rx_request_psn_error: bool = 835:835,
        /// Responder: type of the last request opcode (hns_roce_hw_v2.h position; sheet names it without bits).
        RX_REQ_LAST_OPTYPE / rx_request_last_optype / set_rx_request_last_optype: u8 = 838:836,
        /// Responder expected PSN (24 bits); set to rq_psn.
        RX_REQ_EPSN / rx_request_expected_psn / set_rx_request_expected_psn: u32 = 863:840,
        /// Responder RNR timer state (hns_roce_hw_v2.h position; sheet names it without bits).
        RQ_RNR_TIMER / rq_rnr_timer / set_rq_rnr_timer: u32 = 895:864,
        /// Responder: remaining length of the message in progress, bytes.
        RX_MSG_LEN / rx_message_length / set_rx_message_length: u32 = 927:896,
        /// Responder: R_Key (packet info) of the RDMA request in progress.
        RX_RKEY_PKT_INFO / rx_rkey / set_rx_rkey: u32 = 959:928,
        /// Responder: current virtual address of the RDMA request in progress.
        RX_VA / rx_virtual_address / set_rx_virtual_address: u64 = 1023:960,
        /// TRRL head limit (hns_roce_hw_v2.h position; sheet names it without bits).
        TRRL_HEAD_MAX / trrl_head_max / set_trrl_head_max: u8 = 1031:1024,
        /// TRRL tail limit (hns_roce_hw_v2.h position; sheet names it without bits).
        TRRL_TAIL_MAX / trrl_tail_max / set_trrl_tail_max: u8 = 1039:1032,
        /// Responder read list (TRRL) address >> 4 (hns TRRL_BA_L 16 b / _M 32 b / _H 12 b).
        TRRL_BA / trrl_base_address / set_trrl_base_address: u64 = 1099:1040,
        /// Responder resources: log2 of max_dest_rd_atomic rounded up (fls(n − 1)).
        RR_MAX / responder_resources_log2 / set_responder_resources_log2: u8 = 1102:1100,
        /// Responder: PSN of the last acknowledged request, initialised to rq_psn − 1.
        RAQ_PSN / raq_psn / set_raq_psn: u32 = 1207:1184,
        /// SQ producer index (16-bit free-running WQE count); written at →ERR to bound the flush.
        SQ_PRODUCER_IDX / sq_producer_index / set_sq_producer_index: u16 = 1263:1248,
        /// SQ consumer index (16-bit free-running WQE count).
        SQ_CONSUMER_IDX / sq_consumer_index / set_sq_consumer_index: u16 = 1279:1264,
        /// First SQ page address >> 12 (hns SQ_CUR_BLK_ADDR_L/_H).
        SQ_CUR_BLK_ADDR / sq_current_block_address / set_sq_current_block_address: u64 = 1331:1280,
        /// Long-message SGE count initial value; the driver writes 3.
        LP_SGEN_INI / lp_sge_count_init / set_lp_sge_count_init: u8 = 1335:1334,
        /// Insert the VLAN tag on requests (HIP08).
        SQ_VLAN_EN / sq_vlan_enable / set_sq_vlan_enable: bool = 1336:1336,
        /// ACK request frequency, log2 packets; the driver writes LP_PKTN_INI's value.
        ACK_REQ_FREQ / ack_request_frequency / set_ack_request_frequency: u8 = 1349:1344,
        /// Fast-register (FRMR) work requests allowed; the driver sets 1 at RESET→INIT.
        FRE / fast_register_enable / set_fast_register_enable: bool = 1351:1351,
        /// Requester: PSN of the next packet to send (24 bits); set to sq_psn.
        SQ_CUR_PSN / sq_current_psn / set_sq_current_psn: u32 = 1375:1352,
        /// First extended-SGE page address >> 12 (hns SQ_CUR_SGE_BLK_ADDR_L/_H).
        SQ_CUR_SGE_BLK_ADDR / sq_current_sge_block_address / set_sq_current_sge_block_address: u64 = 1459:1408,
        /// Owner-bit (SDI) mode: the device may fetch WQEs past the doorbell PI by owner bit (hns V2_IRRL_HEAD 1543:1536 overlaps; not declared).
        OWNER_MODE / owner_mode / set_owner_mode: bool = 1536:1536,
        /// DCA (dynamic context attach) mode (HIP09; overlaps hns V2_IRRL_HEAD, not declared).
        DCA_MODE / dca_mode / set_dca_mode: bool = 1542:1542,
        /// Requester: highest PSN sent so far (24 bits); set to sq_psn.
        SQ_MAX_PSN / sq_max_psn / set_sq_max_psn: u32 = 1567:1544,
        /// Requester read list (IRRL) address >> 6 (hns IRRL_BA_L/_H).
        IRRL_BA / irrl_base_address / set_irrl_base_address: u64 = 1657:1600,
        /// Remote end-to-end credit checking; the driver sets 1 at INIT→RTR.
        RMT_E2E / remote_end_to_end_credit / set_remote_end_to_end_credit: bool = 1660:1660,
        /// Outstanding reads/atomics as initiator: log2 of max_rd_atomic rounded up (fls(n − 1)).
        SR_MAX / initiator_depth_log2 / set_initiator_depth_log2: u8 = 1663:1661,
        /// Limit sequence number: requester credit limit from the peer's AETH (24 bits).
        LSN / limit_sequence_number / set_limit_sequence_number: u32 = 1687:1664,
        /// Transport retry count as configured (retry_cnt, 0..7).
        RETRY_NUM_INIT / retry_count_init / set_retry_count_init: u8 = 1690:1688,
        /// Check flags cleared at RTR→RTS (hns_roce_hw_v2.h position; sheet names it without bits).
        CHECK_FLG / check_flag / set_check_flag: u8 = 1692:1691,
        /// Transport retries remaining (starts at retry_cnt).
        RETRY_CNT / retry_count / set_retry_count: u8 = 1695:1693,
        /// Requester retransmission timer state (unit not documented).
        SQ_TIMER / sq_timer / set_sq_timer: u32 = 1727:1696,
        /// MSN of the message to retry (hns_roce_hw_v2.h position; sheet names it without bits).
        RETRY_MSG_MSN / retry_message_msn / set_retry_message_msn: u16 = 1743:1728,
        /// PSN of the message to retry, 24 bits (hns RETRY_MSG_PSN_L = psn bits 15:0, _H = psn >> 16).
        RETRY_MSG_PSN / retry_message_psn / set_retry_message_psn: u32 = 1767:1744,
        /// PSN of the first packet of the message to retry (24 bits).
        RETRY_MSG_FPKT_PSN / retry_message_first_packet_psn / set_retry_message_first_packet_psn: u32 = 1791:1768,
        /// First SQ page address >> 12 for the ACK-receive side (hns RX_SQ_CUR_BLK_ADDR_L/_H).
        RX_SQ_CUR_BLK_ADDR / rx_sq_current_block_address / set_rx_sq_current_block_address: u64 = 1843:1792,
        /// IRRL SGE index (hns_roce_hw_v2.h position; sheet names it without bits).
        IRRL_SGE_IDX / irrl_sge_index / set_irrl_sge_index: u8 = 1851:1844,
        /// IRRL tail (hns_roce_hw_v2.h position; sheet names it without bits).
        IRRL_TAIL_REAL / irrl_tail_real / set_irrl_tail_real: u8 = 1895:1888,
        /// Requester: MSN of the last ACK received (hns_roce_hw_v2.h position; sheet names it without bits).
        RX_ACK_MSN / rx_ack_msn / set_rx_ack_msn: u16 = 1919:1904,
        /// Requester: expected PSN of the next ACK/response (24 bits); set to sq_psn.
        RX_ACK_EPSN / rx_ack_expected_psn / set_rx_ack_expected_psn: u32 = 1943:1920,
        /// RNR retry count as configured (rnr_retry, 0..7; 7 = infinite).
        RNR_NUM_INIT / rnr_retry_init / set_rnr_retry_init: u8 = 1946:1944,
        /// RNR retries remaining (starts at rnr_retry).
        RNR_CNT / rnr_retry_count / set_rnr_retry_count: u8 = 1949:1947,
        /// PSN tracked by the IRRL (hns_roce_hw_v2.h position; sheet names it without bits).
        IRRL_PSN / irrl_psn / set_irrl_psn: u32 = 1975:1952,
        /// Type of the last ACK opcode (hns_roce_hw_v2.h position; sheet names it without bits).
        ACK_LAST_OPTYPE / ack_last_optype / set_ack_last_optype: u8 = 1978:1977,
        /// IRRL_PSN is valid (hns_roce_hw_v2.h position; sheet names it without bits).
        IRRL_PSN_VLD / irrl_psn_valid / set_irrl_psn_valid: bool = 1979:1979,
        /// An RNR retry is pending (hns_roce_hw_v2.h position; sheet names it without bits).
        RNR_RETRY_FLAG / rnr_retry_flag / set_rnr_retry_flag: bool = 1980:1980,
        /// CQ number for send completions (24 bits).
        TX_CQN / send_cq_number / set_send_cq_number: u32 = 2007:1984,
        /// Signal type: 0 = every WR completes with a CQE, 1 = only WRs that request it.
        SIG_TYPE / signal_requested_only / set_signal_requested_only: bool = 2008:2008,
        /// Error cause recorded when the QP entered ERR (vendor code, 7 bits).
        ERR_TYPE / error_type / set_error_type: u8 = 2015:2009,
        /// RQ WQE index for the next receive (flush) CQE, 16 bits.
        RQ_CQE_IDX / rq_cqe_index / set_rq_cqe_index: u16 = 2031:2016,
        /// SQ index up to which flush CQEs have been generated, 16 bits.
        SQ_FLUSH_IDX / sq_flush_index / set_sq_flush_index: u16 = 2047:2032,
    }
}

/// Byte offset of the destination GID (`DGID_L`/`DGID_H`, bits 351:224).
const DGID_OFFSET: usize = 28;
/// Byte offset of the destination MAC (`DMAC`, bits 399:352).
const DMAC_OFFSET: usize = 44;

impl Qpc {
    /// `QP_ST` as a [`QpState`].
    pub fn qp_state(&self) -> Result<QpState, ContextError> {
        QpState::try_from(self.qp_state_raw())
    }

    /// Sets `QP_ST`.
    pub fn set_qp_state(&mut self, state: QpState) {
        self.set_qp_state_raw(state.into());
    }

    /// `TST` as a [`ServiceType`].
    pub fn service_type(&self) -> Result<ServiceType, ContextError> {
        ServiceType::try_from(self.service_type_raw())
    }

    /// Sets `TST`.
    pub fn set_service_type(&mut self, service_type: ServiceType) {
        self.set_service_type_raw(service_type.into());
    }

    /// `MTU` as an [`Mtu`].
    pub fn mtu(&self) -> Result<Mtu, ContextError> {
        Mtu::try_from(self.mtu_raw())
    }

    /// Sets `MTU`.
    pub fn set_mtu(&mut self, mtu: Mtu) {
        self.set_mtu_raw(mtu.into());
    }

    /// The destination GID (`DGID_L` + `DGID_H`), in network byte order as stored at byte 28.
    pub fn dgid(&self) -> [u8; 16] {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&self.0[DGID_OFFSET..DGID_OFFSET + 16]);
        gid
    }

    /// Sets the destination GID (network byte order).
    pub fn set_dgid(&mut self, gid: [u8; 16]) {
        self.0[DGID_OFFSET..DGID_OFFSET + 16].copy_from_slice(&gid);
    }

    /// The destination MAC (`DMAC`), bytes in wire order (byte 0 first), as stored at byte 44.
    pub fn dmac(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.0[DMAC_OFFSET..DMAC_OFFSET + 6]);
        mac
    }

    /// Sets the destination MAC (wire order).
    pub fn set_dmac(&mut self, mac: [u8; 6]) {
        self.0[DMAC_OFFSET..DMAC_OFFSET + 6].copy_from_slice(&mac);
    }

    /// The RQ record doorbell DMA address (`RQ_DB_RECORD_ADDR << 1`; bit 0 is `RQ_RECORD_EN`).
    pub fn rq_record_address(&self) -> u64 {
        self.rq_record_address_raw() << 1
    }

    /// Sets the RQ record doorbell DMA address (bit 0 of `address` is dropped; records are
    /// 4-byte aligned). Does not touch `RQ_RECORD_EN`.
    pub fn set_rq_record_address(&mut self, address: u64) {
        self.set_rq_record_address_raw(address >> 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{Layout, LayoutError};
    use crate::context::testutil;
    use crate::context::QPC_SIZE;

    const GID: [u8; 16] = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
    ];
    const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

    /// A QPC with a handful of fields set, written byte by byte from the bit positions.
    fn known_bytes() -> [u8; QPC_SIZE] {
        let mut b = [0u8; QPC_SIZE];
        // Byte 0: TST 2:0 = 3 (UD), SGE_SHIFT 7:3 = 5 -> 0b00101_011.
        b[0] = 0x2B;
        // Bits 92:32 WQE_SGE_BA = 0x1_2345_6789 (LE from byte 4);
        // byte 11 bits 6:5 = SQ_HOP_NUM 94:93 = 2.
        b[4..9].copy_from_slice(&[0x89, 0x67, 0x45, 0x23, 0x01]);
        b[11] = 0x40;
        // Byte 12: WQE_SGE_BUF_PG_SZ 103:100 = 2; bytes 13..16: PD 127:104 = 0x123456.
        b[12] = 0x20;
        b[13..16].copy_from_slice(&[0x56, 0x34, 0x12]);
        // Byte 23 bits 7:4: MTU 191:188 = 5 (4096).
        b[23] = 0x50;
        // Bytes 28..44: DGID, network order; bytes 44..50: DMAC, wire order.
        b[28..44].copy_from_slice(&GID);
        b[44..50].copy_from_slice(&MAC);
        // Bytes 52..55: DQPN 439:416 = 0x0ABCDE.
        b[52..55].copy_from_slice(&[0xDE, 0xBC, 0x0A]);
        // Byte 59: QP_ST 479:477 = 3 (RTS) -> 0x60, RQ_DB_DOING 476 -> 0x10.
        b[59] = 0x70;
        // Bytes 64..72: the 64-bit word (addr & !1) | RQ_RECORD_EN for addr 0x7f00_1234_5678.
        b[64..72].copy_from_slice(&[0x79, 0x56, 0x34, 0x12, 0x00, 0x7f, 0x00, 0x00]);
        // Byte 75: SRQ_EN 600 = bit 0 (clear), RRE 601 = bit 1, RWE 602 = bit 2.
        b[75] = 0x06;
        // Bytes 156..160: SQ_PRODUCER_IDX 1263:1248 = 0x1234, SQ_CONSUMER_IDX = 0x0011.
        b[156..160].copy_from_slice(&[0x34, 0x12, 0x11, 0x00]);
        // Byte 168: FRE 1351 = bit 7; bytes 169..172: SQ_CUR_PSN 1375:1352 = 0xABCDEF.
        b[168] = 0x80;
        b[169..172].copy_from_slice(&[0xEF, 0xCD, 0xAB]);
        // Bytes 248..251: TX_CQN 2007:1984 = 0x000777;
        // byte 251: SIG_TYPE 2008 = bit 0, ERR_TYPE 2015:2009 = 0x15 in bits 7:1 -> 0x2B.
        b[248..251].copy_from_slice(&[0x77, 0x07, 0x00]);
        b[251] = 0x2B;
        b
    }

    #[test]
    fn parses_known_bytes() {
        let q = Qpc::parse(&known_bytes()).unwrap();
        assert_eq!(q.service_type_raw(), 3);
        assert_eq!(q.service_type(), Ok(ServiceType::Ud));
        assert_eq!(q.sge_shift(), 5);
        assert_eq!(q.wqe_sge_base_address(), 0x1_2345_6789);
        assert_eq!(q.sq_hop_number(), 2);
        assert_eq!(q.wqe_sge_ba_page_size(), 0);
        assert_eq!(q.wqe_sge_buffer_page_size(), 2);
        assert_eq!(q.protection_domain(), 0x12_3456);
        assert_eq!(q.mtu(), Ok(Mtu::Mtu4096));
        assert_eq!(q.dgid(), GID);
        assert_eq!(q.dgid_low(), u64::from_le_bytes(GID[..8].try_into().unwrap()));
        assert_eq!(q.dgid_high(), 0x5544_33fe_ff22_1102);
        assert_eq!(q.dmac(), MAC);
        assert_eq!(q.dmac_raw(), 0xccbb_aa00_0002);
        assert_eq!(q.destination_qpn(), 0x0A_BCDE);
        assert_eq!(q.qp_state(), Ok(QpState::Rts));
        assert!(q.rq_doorbell_in_progress());
        assert!(!q.sq_doorbell_in_progress());
        assert!(q.rq_record_enable());
        assert_eq!(q.rq_record_address(), 0x7f00_1234_5678);
        assert_eq!(q.rq_record_address_raw(), 0x7f00_1234_5678 >> 1);
        assert!(!q.srq_enable());
        assert!(q.remote_read_enable());
        assert!(q.remote_write_enable());
        assert!(!q.remote_atomic_enable());
        assert_eq!(q.sq_producer_index(), 0x1234);
        assert_eq!(q.sq_consumer_index(), 0x0011);
        assert!(q.fast_register_enable());
        assert_eq!(q.ack_request_frequency(), 0);
        assert_eq!(q.sq_current_psn(), 0xAB_CDEF);
        assert_eq!(q.send_cq_number(), 0x777);
        assert!(q.signal_requested_only());
        assert_eq!(q.error_type(), 0x15);
        assert_eq!(q.sq_flush_index(), 0);
    }

    #[test]
    fn emits_known_bytes() {
        let mut q = Qpc::zeroed();
        q.set_service_type(ServiceType::Ud);
        q.set_sge_shift(5);
        q.set_wqe_sge_base_address(0x1_2345_6789);
        q.set_sq_hop_number(2);
        q.set_wqe_sge_buffer_page_size(2);
        q.set_protection_domain(0x12_3456);
        q.set_mtu(Mtu::Mtu4096);
        q.set_dgid(GID);
        q.set_dmac(MAC);
        q.set_destination_qpn(0x0A_BCDE);
        q.set_qp_state(QpState::Rts);
        q.set_rq_doorbell_in_progress(true);
        q.set_rq_record_enable(true);
        q.set_rq_record_address(0x7f00_1234_5678);
        q.set_remote_read_enable(true);
        q.set_remote_write_enable(true);
        q.set_sq_producer_index(0x1234);
        q.set_sq_consumer_index(0x0011);
        q.set_fast_register_enable(true);
        q.set_sq_current_psn(0xAB_CDEF);
        q.set_send_cq_number(0x777);
        q.set_signal_requested_only(true);
        q.set_error_type(0x15);
        assert_eq!(q.bytes(), &known_bytes()[..]);

        let mut out = [0u8; QPC_SIZE];
        q.emit(&mut out).unwrap();
        assert_eq!(out, known_bytes());
    }

    #[test]
    fn split_accessors_agree_with_their_halves() {
        let mut q = Qpc::zeroed();
        q.set_dgid_low(0x0706_0504_0302_0100);
        q.set_dgid_high(0x0f0e_0d0c_0b0a_0908);
        assert_eq!(q.dgid(), core::array::from_fn::<u8, 16, _>(|i| i as u8));
        q.set_dmac_raw(0x0605_0403_0201);
        assert_eq!(q.dmac(), [1, 2, 3, 4, 5, 6]);
        // Setting the address keeps the enable bit and vice versa.
        q.set_rq_record_enable(true);
        q.set_rq_record_address(0xffff_ffff_ffff_fffc);
        assert!(q.rq_record_enable());
        assert_eq!(q.rq_record_address(), 0xffff_ffff_ffff_fffc);
        assert_eq!(
            u64::from_le_bytes(q.0[64..72].try_into().unwrap()),
            0xffff_ffff_ffff_fffd
        );
    }

    #[test]
    fn round_trips_every_field() {
        testutil::assert_round_trips_every_field::<Qpc>(0x5150_C0DE_2024_0001);
    }

    #[test]
    fn rejects_truncated_input() {
        let bytes = known_bytes();
        assert_eq!(
            Qpc::parse(&bytes[..QPC_SIZE - 1]),
            Err(LayoutError::Truncated {
                layout: "Qpc",
                expected: 256,
                actual: 255
            })
        );
        testutil::assert_rejects_truncated::<Qpc>();
    }

    #[test]
    fn typed_accessors_reject_undefined_values() {
        let mut q = Qpc::zeroed();
        q.set_service_type_raw(4);
        assert_eq!(
            q.service_type(),
            Err(ContextError::InvalidValue { field: "TST", value: 4 })
        );
        q.set_mtu_raw(0);
        assert_eq!(q.mtu(), Err(ContextError::InvalidValue { field: "MTU", value: 0 }));
        q.set_mtu_raw(6);
        assert!(q.mtu().is_err());
        // Every 3-bit QP_ST value is a defined state.
        for raw in 0..8 {
            q.set_qp_state_raw(raw);
            assert_eq!(q.qp_state().map(u8::from), Ok(raw));
        }
    }

    #[test]
    fn fields_the_model_needs_are_declared() {
        for name in [
            "TST",
            "PD",
            "SQ_SHIFT",
            "RQ_SHIFT",
            "SGE_SHIFT",
            "RQWS",
            "WQE_SGE_BA",
            "SQ_HOP_NUM",
            "SGE_HOP_NUM",
            "RQ_HOP_NUM",
            "WQE_SGE_BA_PG_SZ",
            "WQE_SGE_BUF_PG_SZ",
            "RX_CQN",
            "TX_CQN",
            "SRQ_EN",
            "SRQN",
            "QP_ST",
            "MTU",
            "DQPN",
            "DMAC",
            "DGID_L",
            "DGID_H",
            "SL",
            "GMV_IDX",
            "HOPLIMIT",
            "TC",
            "FL",
            "UDPSPN",
            "AT",
            "RETRY_NUM_INIT",
            "RETRY_CNT",
            "RNR_NUM_INIT",
            "RNR_CNT",
            "SQ_CUR_PSN",
            "SQ_MAX_PSN",
            "RX_ACK_EPSN",
            "RX_REQ_EPSN",
            "RAQ_PSN",
            "RR_MAX",
            "SR_MAX",
            "RRE",
            "RWE",
            "ATE",
            "MIN_RNR_TIME",
            "QKEY_XRCD",
            "RQ_RECORD_EN",
            "RQ_DB_RECORD_ADDR",
            "SQ_PRODUCER_IDX",
            "SQ_CONSUMER_IDX",
            "RQ_PRODUCER_IDX",
            "RQ_CONSUMER_IDX",
            "SIG_TYPE",
            "SQ_CUR_BLK_ADDR",
            "SQ_CUR_SGE_BLK_ADDR",
            "RX_SQ_CUR_BLK_ADDR",
            "RQ_CUR_BLK_ADDR",
            "RQ_NXT_BLK_ADDR",
            "IRRL_BA",
            "TRRL_BA",
            "LBI",
            "OWNER_MODE",
            "INV_CREDIT",
            "FLUSH_EN",
            "ERR_TYPE",
        ] {
            assert!(Qpc::field(name).is_some(), "missing {name}");
        }
        assert_eq!(Qpc::RQ_DB_RECORD_ADDR.lo, 513);
        assert_eq!(Qpc::DMAC.lo, 352);
    }
}
