//! SRQ context (`Srqc`, 64 bytes), carried by CREATE_SRQ / MODIFY_SRQC / QUERY_SRQC.
//!
//! An SRQ has two buffers, each with its own MTR root: the WQE buffer and the index queue
//! (4-byte entries naming WQE slots). Software posts a WQE, writes its slot into the index
//! queue and publishes the index-queue head (doorbell CMD 2 or the record doorbell).
//! MODIFY_SRQC changes `LIMIT_WL` (srq_limit); resizing is not supported.

crate::layout! {
    /// SRQ context, 64 bytes (hns `struct hns_roce_srq_context`).
    pub struct Srqc[64] {
        /// SRQ state: 1 = valid (0 = not in use).
        SRQ_ST / srq_state_raw / set_srq_state_raw: u8 = 1:0,
        /// WQE buffer hop number: 0 = direct, 1..3 BT levels.
        WQE_HOP_NUM / wqe_hop_number / set_wqe_hop_number: u8 = 3:2,
        /// log2(SRQ depth in WQEs).
        SHIFT / shift / set_shift: u8 = 7:4,
        /// SRQ number (24 bits).
        SRQN / srq_number / set_srq_number: u32 = 31:8,
        /// Limit watermark (srq_limit): SRQ_LIMIT_REACH fires when free WQEs drop below it; 0 = disarmed.
        LIMIT_WL / limit_watermark / set_limit_watermark: u16 = 47:32,
        /// XRC domain number (XRC SRQs).
        XRCD / xrc_domain / set_xrc_domain: u32 = 87:64,
        /// Index-queue producer index (16-bit free-running count).
        PRODUCER_IDX / producer_index / set_producer_index: u16 = 111:96,
        /// Index-queue consumer index (16-bit free-running count).
        CONSUMER_IDX / consumer_index / set_consumer_index: u16 = 127:112,
        /// WQE buffer root BT address >> 3 (hns WQE_BT_BA_L/_H).
        WQE_BT_BA / wqe_base_address / set_wqe_base_address: u64 = 188:128,
        /// SRQ type: 1 = XRC SRQ, 0 = basic.
        SRQ_TYPE / xrc / set_xrc: bool = 191:191,
        /// Protection domain number (24 bits).
        PD / protection_domain / set_protection_domain: u32 = 215:192,
        /// log2(max SGEs per WQE) rounded up (fls(max_gs − 1)); WQE stride = 16 B << RQWS.
        RQWS / max_sge_shift / set_max_sge_shift: u8 = 219:216,
        /// Index queue root BT address >> 3 (hns IDX_BT_BA_L/_H).
        IDX_BT_BA / index_base_address / set_index_base_address: u64 = 284:224,
        /// First index-queue page address >> 12 (hns IDX_CUR_BLK_ADDR_L/_H).
        IDX_CUR_BLK_ADDR / index_current_block_address / set_index_current_block_address: u64 = 339:288,
        /// Index queue hop number: 0 = direct, 1..3 BT levels.
        IDX_HOP_NUM / index_hop_number / set_index_hop_number: u8 = 343:342,
        /// Index queue BT page size, encoded page_shift − 12.
        IDX_BA_PG_SZ / index_ba_page_size / set_index_ba_page_size: u8 = 347:344,
        /// Index queue data page size, encoded page_shift − 12.
        IDX_BUF_PG_SZ / index_buffer_page_size / set_index_buffer_page_size: u8 = 351:348,
        /// Second index-queue page address >> 12 (hns IDX_NXT_BLK_ADDR_L/_H).
        IDX_NXT_BLK_ADDR / index_next_block_address / set_index_next_block_address: u64 = 403:352,
        /// CQ number for completions of an XRC SRQ (24 bits).
        XRC_CQN / xrc_cq_number / set_xrc_cq_number: u32 = 439:416,
        /// WQE buffer BT page size, encoded page_shift − 12.
        WQE_BA_PG_SZ / wqe_ba_page_size / set_wqe_ba_page_size: u8 = 443:440,
        /// WQE buffer data page size, encoded page_shift − 12.
        WQE_BUF_PG_SZ / wqe_buffer_page_size / set_wqe_buffer_page_size: u8 = 447:444,
        /// Record doorbell enable: the device reads the index-queue head from host memory (HIP09).
        DB_RECORD_EN / record_enable / set_record_enable: bool = 448:448,
        /// SRQ record doorbell DMA address >> 1 (hns DB_RECORD_ADDR_L/_H); use `Srqc::record_address`.
        DB_RECORD_ADDR / record_address_raw / set_record_address_raw: u64 = 511:449,
    }
}

impl Srqc {
    /// The SRQ record doorbell DMA address (`DB_RECORD_ADDR << 1`; bit 0 is `DB_RECORD_EN`).
    pub fn record_address(&self) -> u64 {
        self.record_address_raw() << 1
    }

    /// Sets the SRQ record doorbell DMA address (bit 0 dropped). Does not touch `DB_RECORD_EN`.
    pub fn set_record_address(&mut self, address: u64) {
        self.set_record_address_raw(address >> 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{Layout, LayoutError};
    use crate::context::testutil;
    use crate::context::SRQC_SIZE;

    /// An SRQC with a handful of fields set, written byte by byte from the bit positions.
    fn known_bytes() -> [u8; SRQC_SIZE] {
        let mut b = [0u8; SRQC_SIZE];
        // Byte 0: SRQ_ST 1:0 = 1, WQE_HOP_NUM 3:2 = 1, SHIFT 7:4 = 9 -> 0x95.
        b[0] = 0x95;
        // Bytes 1..4: SRQN 31:8 = 0x000042; bytes 4..6: LIMIT_WL 47:32 = 0x0100.
        b[1..4].copy_from_slice(&[0x42, 0x00, 0x00]);
        b[4..6].copy_from_slice(&[0x00, 0x01]);
        // Bytes 16..20: WQE_BT_BA 188:128 = 0x0123_4567; byte 23 bit 7: SRQ_TYPE 191.
        b[16..20].copy_from_slice(&[0x67, 0x45, 0x23, 0x01]);
        b[23] = 0x80;
        // Byte 24: PD 215:192 = 7; byte 27 low nibble: RQWS 219:216 = 2.
        b[24] = 0x07;
        b[27] = 0x02;
        // Bytes 56..64: the word (addr & !1) | DB_RECORD_EN for addr 0xdead_bee0.
        b[56..64].copy_from_slice(&[0xe1, 0xbe, 0xad, 0xde, 0x00, 0x00, 0x00, 0x00]);
        b
    }

    #[test]
    fn parses_known_bytes() {
        let s = Srqc::parse(&known_bytes()).unwrap();
        assert_eq!(s.srq_state_raw(), 1);
        assert_eq!(s.wqe_hop_number(), 1);
        assert_eq!(s.shift(), 9);
        assert_eq!(s.srq_number(), 0x42);
        assert_eq!(s.limit_watermark(), 0x100);
        assert_eq!(s.wqe_base_address(), 0x0123_4567);
        assert!(s.xrc());
        assert_eq!(s.protection_domain(), 7);
        assert_eq!(s.max_sge_shift(), 2);
        assert!(s.record_enable());
        assert_eq!(s.record_address(), 0xdead_bee0);
        assert_eq!(s.record_address_raw(), 0xdead_bee0 >> 1);
    }

    #[test]
    fn emits_known_bytes() {
        let mut s = Srqc::zeroed();
        s.set_srq_state_raw(1);
        s.set_wqe_hop_number(1);
        s.set_shift(9);
        s.set_srq_number(0x42);
        s.set_limit_watermark(0x100);
        s.set_wqe_base_address(0x0123_4567);
        s.set_xrc(true);
        s.set_protection_domain(7);
        s.set_max_sge_shift(2);
        s.set_record_enable(true);
        s.set_record_address(0xdead_bee0);
        assert_eq!(s.bytes(), &known_bytes()[..]);
    }

    #[test]
    fn round_trips_every_field() {
        testutil::assert_round_trips_every_field::<Srqc>(0x5A5C_2024_0003);
    }

    #[test]
    fn rejects_truncated_input() {
        assert_eq!(
            Srqc::parse(&known_bytes()[..SRQC_SIZE - 1]),
            Err(LayoutError::Truncated {
                layout: "Srqc",
                expected: 64,
                actual: 63
            })
        );
        testutil::assert_rejects_truncated::<Srqc>();
    }
}
