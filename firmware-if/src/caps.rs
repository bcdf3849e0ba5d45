//! Device capabilities (reference sheet §11): the five 24-byte response payloads of
//! `QUERY_PF_CAPS_NUM` (cmdq opcode 0x8408, five chained descriptors A..E), the capability
//! flag bits, and [`DeviceCaps`], the same information as plain Rust integers.
//!
//! Descriptor fields are either counts/sizes or, where noted, log2 of a count; in
//! [`DeviceCaps`] every log2 field appears as the count itself. [`DeviceCaps::to_descriptors`]
//! and [`DeviceCaps::from_descriptors`] convert between the two without any of the driver's
//! adjustments (rounding `max_rq_sges` up to a power of two, dividing by the function
//! count, substituting a page-size mask, ...): those belong to the driver.
//!
//! The sixth descriptor of newer HIP09 kernels and the positions of `NUM_XRCDS` /
//! `RSV_XRCDS` are not confirmed from public sources (sheet §16) and are not modelled.

use crate::bits::{Field, Layout};
use crate::layout;

/// Size of one caps descriptor payload in bytes (the 24-byte `data[6]` of a cmdq descriptor).
pub const CAPS_DESCRIPTOR_SIZE: usize = 24;
/// Number of chained descriptors in a `QUERY_PF_CAPS_NUM` response.
pub const CAPS_DESCRIPTOR_COUNT: usize = 5;
/// Bit of [`CapFlags`] where the extended flags (`CAP_FLAGS_EX` of descriptor D) start.
pub const CAP_FLAGS_EX_SHIFT: u32 = 12;

const _: () = assert!(<CapsA as Layout>::SIZE == CAPS_DESCRIPTOR_SIZE);
const _: () = assert!(<CapsB as Layout>::SIZE == CAPS_DESCRIPTOR_SIZE);
const _: () = assert!(<CapsC as Layout>::SIZE == CAPS_DESCRIPTOR_SIZE);
const _: () = assert!(<CapsD as Layout>::SIZE == CAPS_DESCRIPTOR_SIZE);
const _: () = assert!(<CapsE as Layout>::SIZE == CAPS_DESCRIPTOR_SIZE);

/// Why capabilities could not be converted to or from descriptors. `field` names the
/// descriptor field (`CapsA`..`CapsE` constant name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CapsError {
    /// A count stored as log2 is not a power of two.
    #[error("{field}: {value} is not a power of two")]
    NotPowerOfTwo {
        /// Descriptor field.
        field: &'static str,
        /// The count.
        value: u64,
    },
    /// A value does not fit its descriptor field.
    #[error("{field}: {value} exceeds the field maximum {max}")]
    OutOfRange {
        /// Descriptor field.
        field: &'static str,
        /// The value.
        value: u64,
        /// Largest encodable value.
        max: u64,
    },
    /// A log2 field read from a descriptor is 32 or more (the count would not fit a u32).
    #[error("{field}: log2 value {log2} is too large")]
    Log2TooLarge {
        /// Descriptor field.
        field: &'static str,
        /// The log2 value read.
        log2: u64,
    },
}

bitflags::bitflags! {
    /// Capability flag bits (`caps.flags`, §11.2): bits 11:0 come from `CAP_FLAGS` of
    /// descriptor C, bits 12 and up from `CAP_FLAGS_EX` of descriptor D.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct CapFlags: u32 {
        /// Re-registration of memory regions.
        const REREG_MR = 1 << 0;
        /// RoCEv2 (UDP encapsulation) supported besides RoCEv1.
        const ROCE_V1_V2 = 1 << 1;
        /// RQ inline: small incoming SENDs written into the RQ WQE buffer.
        const RQ_INLINE = 1 << 2;
        /// CQ record doorbell (consumer index in host memory).
        const CQ_RECORD_DB = 1 << 3;
        /// QP record doorbells (RQ/SQ producer indices in host memory).
        const QP_RECORD_DB = 1 << 4;
        /// Shared receive queues.
        const SRQ = 1 << 5;
        /// XRC transport.
        const XRC = 1 << 6;
        /// Memory windows.
        const MW = 1 << 7;
        /// Fast-register memory regions.
        const FRMR = 1 << 8;
        /// QP flow control (SCC context).
        const QP_FLOW_CTRL = 1 << 9;
        /// Atomic operations.
        const ATOMIC = 1 << 10;
        /// Direct WQE through the BAR 4 window.
        const DIRECT_WQE = 1 << 12;
        /// Owner-bit WQE fetch (SDI mode).
        const SDI_MODE = 1 << 14;
        /// Cache stashing.
        const STASH = 1 << 17;
        /// CQE inline (payload in the 64-byte CQE).
        const CQE_INLINE = 1 << 19;
        /// Port bonding.
        const BOND = 1 << 21;
        /// SRQ record doorbell.
        const SRQ_RECORD_DB = 1 << 22;
        /// Limited banks: reported max_qp / max_cq are halved.
        const LIMIT_BANK = 1 << 23;
    }
}

layout! {
    /// `QUERY_PF_CAPS_NUM` descriptor A (`hns_roce_query_pf_caps_a`): ports, SGE and inline
    /// limits, timers, vectors, descriptor sizes.
    pub struct CapsA[24] {
        /// Number of ports.
        NUMBER_PORTS / number_ports / set_number_ports: u8 = 7:0,
        /// Local CA ACK delay (IB encoding).
        LOCAL_CA_ACK_DELAY / local_ca_ack_delay / set_local_ca_ack_delay: u8 = 15:8,
        /// Maximum SGEs per send WR (count).
        MAX_SQ_SG / max_sq_sges / set_max_sq_sges: u16 = 31:16,
        /// Maximum inline data per send WR in bytes.
        MAX_SQ_INLINE / max_sq_inline / set_max_sq_inline: u16 = 47:32,
        /// Maximum SGEs per receive WR (count; the driver rounds it up to a power of two).
        MAX_RQ_SG / max_rq_sges / set_max_rq_sges: u16 = 63:48,
        /// Total extended SGE slots (count).
        MAX_EXTEND_SG / max_extend_sges / set_max_extend_sges: u32 = 95:64,
        /// Number of QPC timer entries.
        NUM_QPC_TIMER / num_qpc_timers / set_num_qpc_timers: u16 = 111:96,
        /// Number of CQC timer entries.
        NUM_CQC_TIMER / num_cqc_timers / set_num_cqc_timers: u16 = 127:112,
        /// Maximum SGEs per SRQ WR (count; the driver rounds it up to a power of two).
        MAX_SRQ_SGES / max_srq_sges / set_max_srq_sges: u16 = 143:128,
        /// Number of AEQ interrupt vectors.
        NUM_AEQ_VECTORS / num_aeq_vectors / set_num_aeq_vectors: u8 = 151:144,
        /// Number of other (abnormal) interrupt vectors.
        NUM_OTHER_VECTORS / num_other_vectors / set_num_other_vectors: u8 = 159:152,
        /// Maximum SQ WQE size in bytes.
        MAX_SQ_DESC_SZ / max_sq_desc_size / set_max_sq_desc_size: u8 = 167:160,
        /// Maximum RQ WQE size in bytes.
        MAX_RQ_DESC_SZ / max_rq_desc_size / set_max_rq_desc_size: u8 = 175:168,
        /// Maximum SRQ WQE size in bytes.
        MAX_SRQ_DESC_SZ / max_srq_desc_size / set_max_srq_desc_size: u8 = 183:176,
        /// CQE size in bytes (32 or 64).
        CQE_SZ / cqe_size / set_cqe_size: u8 = 191:184,
    }
}

layout! {
    /// `QUERY_PF_CAPS_NUM` descriptor B (`hns_roce_query_pf_caps_b`): context entry sizes,
    /// minimum queue sizes, page sizes and hop numbers.
    pub struct CapsB[24] {
        /// MPT entry size in bytes.
        MTPT_ENTRY_SZ / mtpt_entry_size / set_mtpt_entry_size: u8 = 7:0,
        /// IRRL entry size in bytes.
        IRRL_ENTRY_SZ / irrl_entry_size / set_irrl_entry_size: u8 = 15:8,
        /// TRRL entry size in bytes.
        TRRL_ENTRY_SZ / trrl_entry_size / set_trrl_entry_size: u8 = 23:16,
        /// CQ context size in bytes.
        CQC_ENTRY_SZ / cqc_entry_size / set_cqc_entry_size: u8 = 31:24,
        /// SRQ context size in bytes.
        SRQC_ENTRY_SZ / srqc_entry_size / set_srqc_entry_size: u8 = 39:32,
        /// SRQ index-queue entry size in bytes.
        IDX_ENTRY_SZ / idx_entry_size / set_idx_entry_size: u8 = 47:40,
        /// SCC (congestion) context size in bytes.
        SCCC_SZ / sccc_size / set_sccc_size: u8 = 55:48,
        /// Maximum path MTU (IB MTU enum: 1 = 256 … 5 = 4096).
        MAX_MTU / max_mtu / set_max_mtu: u8 = 63:56,
        /// QP context size in bytes.
        QPC_SZ / qpc_size / set_qpc_size: u16 = 79:64,
        /// QPC timer entry size in bytes.
        QPC_TIMER_ENTRY_SZ / qpc_timer_entry_size / set_qpc_timer_entry_size: u16 = 95:80,
        /// CQC timer entry size in bytes.
        CQC_TIMER_ENTRY_SZ / cqc_timer_entry_size / set_cqc_timer_entry_size: u16 = 111:96,
        /// Minimum CQ depth (count of CQEs).
        MIN_CQES / min_cqes / set_min_cqes: u8 = 119:112,
        /// Minimum WQ depth (count of WQEs).
        MIN_WQES / min_wqes / set_min_wqes: u8 = 127:120,
        /// Supported page sizes: bit n set = 2^n bytes supported.
        PAGE_SIZE_CAP / page_size_cap / set_page_size_cap: u32 = 159:128,
        /// P_Key table length (entries).
        PKEY_TABLE_LEN / pkey_table_length / set_pkey_table_length: u8 = 167:160,
        /// Number of physical UARs (doorbell pages).
        PHY_NUM_UARS / physical_uars / set_physical_uars: u8 = 175:168,
        /// Hop number of the context tables (0..=3).
        CTX_HOP_NUM / context_hops / set_context_hops: u8 = 183:176,
        /// Hop number of PBLs, CQE, SRQ WQE and index buffers (0..=3).
        PBL_HOP_NUM / pbl_hops / set_pbl_hops: u8 = 191:184,
    }
}

layout! {
    /// `QUERY_PF_CAPS_NUM` descriptor C (`hns_roce_query_pf_caps_c`): object counts and
    /// queue depths, mostly as log2, plus the low capability flags.
    pub struct CapsC[24] {
        /// log2 of the number of protection domains.
        NUM_PDS / pd_count_log2 / set_pd_count_log2: u32 = 19:0,
        /// Capability flag bits 11:0 ([`CapFlags`]).
        CAP_FLAGS / cap_flags / set_cap_flags: u16 = 31:20,
        /// log2 of the number of CQs.
        NUM_CQS / cq_count_log2 / set_cq_count_log2: u32 = 51:32,
        /// GID table length (count, not log2).
        MAX_GID / max_gids / set_max_gids: u16 = 60:52,
        /// log2 of the maximum CQ depth (CQEs).
        CQ_DEPTH / cq_depth_log2 / set_cq_depth_log2: u32 = 86:64,
        /// log2 of the number of MPT entries (MRs + MWs).
        NUM_MRWS / mtpt_count_log2 / set_mtpt_count_log2: u32 = 115:96,
        /// log2 of the number of QPs.
        NUM_QPS / qp_count_log2 / set_qp_count_log2: u32 = 147:128,
        /// Maximum outstanding RDMA READ / atomic requests per QP (count, not log2).
        MAX_ORD / max_outstanding_reads / set_max_outstanding_reads: u8 = 155:148,
        /// log2 of the maximum SQ depth (WQEs).
        SQ_DEPTH / sq_depth_log2 / set_sq_depth_log2: u16 = 175:160,
        /// log2 of the maximum RQ depth (WQEs).
        RQ_DEPTH / rq_depth_log2 / set_rq_depth_log2: u16 = 191:176,
    }
}

layout! {
    /// `QUERY_PF_CAPS_NUM` descriptor D (`hns_roce_query_pf_caps_d`): SRQs, WQE hop
    /// numbers, congestion types, EQ geometry, reserved PDs/QPs/UARs, extended flags.
    pub struct CapsD[24] {
        /// log2 of the number of SRQs.
        NUM_SRQS / srq_count_log2 / set_srq_count_log2: u32 = 19:0,
        /// Hop number of RQ WQE buffers (0..=3).
        RQWQE_HOP_NUM / rq_wqe_hops / set_rq_wqe_hops: u8 = 21:20,
        /// Hop number of extended SGE buffers (0..=3).
        EX_SGE_HOP_NUM / ext_sge_hops / set_ext_sge_hops: u8 = 23:22,
        /// Hop number of SQ WQE buffers (0..=3).
        SQWQE_HOP_NUM / sq_wqe_hops / set_sq_wqe_hops: u8 = 25:24,
        /// Supported congestion algorithms, bit mask (bit 0 DCQCN, 1 LDCP, 2 HC3, 3 DIP).
        CONG_TYPE / congestion_types / set_congestion_types: u8 = 29:26,
        /// log2 of the maximum SRQ depth (WQEs).
        SRQ_DEPTH / srq_depth_log2 / set_srq_depth_log2: u16 = 47:32,
        /// Capability flag bits 27:12 ([`CapFlags`] shifted right by 12).
        CAP_FLAGS_EX / cap_flags_extended / set_cap_flags_extended: u16 = 63:48,
        /// log2 of the CEQ depth (entries).
        CEQ_DEPTH / ceq_depth_log2 / set_ceq_depth_log2: u32 = 85:64,
        /// Number of completion EQs (count, not log2).
        NUM_CEQS / ceq_count / set_ceq_count: u16 = 95:86,
        /// log2 of the AEQ depth (entries).
        AEQ_DEPTH / aeq_depth_log2 / set_aeq_depth_log2: u32 = 117:96,
        /// Default AEQ arm state (EQC `ARM_ST` encoding; 3 = always armed).
        AEQ_ARM_ST / aeq_arm_state / set_aeq_arm_state: u8 = 119:118,
        /// Default CEQ arm state (EQC `ARM_ST` encoding; 3 = always armed).
        CEQ_ARM_ST / ceq_arm_state / set_ceq_arm_state: u8 = 121:120,
        /// Number of reserved PDs.
        RSV_PDS / reserved_pds / set_reserved_pds: u32 = 147:128,
        /// log2 of the number of UARs (doorbell pages).
        NUM_UARS / uar_count_log2 / set_uar_count_log2: u8 = 155:148,
        /// Number of reserved QPs.
        RSV_QPS / reserved_qps / set_reserved_qps: u32 = 179:160,
        /// Number of reserved UARs.
        RSV_UARS / reserved_uars / set_reserved_uars: u8 = 187:180,
    }
}

layout! {
    /// `QUERY_PF_CAPS_NUM` descriptor E (`hns_roce_query_pf_caps_e`): reserved MPTs, CQs,
    /// SRQs, the reserved lkey, the HEM chunk size and EQ coalescing defaults.
    pub struct CapsE[24] {
        /// Number of reserved MPT entries (MR/MW indices never handed out).
        RSV_MRWS / reserved_mrws / set_reserved_mrws: u32 = 19:0,
        /// log2 of the HEM chunk size in bytes.
        CHUNK_SIZE_SHIFT / chunk_size_shift / set_chunk_size_shift: u16 = 31:20,
        /// Number of reserved CQs.
        RSV_CQS / reserved_cqs / set_reserved_cqs: u32 = 51:32,
        /// Number of reserved SRQs.
        RSV_SRQS / reserved_srqs / set_reserved_srqs: u32 = 83:64,
        /// Reserved lkey: the device's local DMA lkey.
        RSV_LKEYS / reserved_lkey / set_reserved_lkey: u32 = 115:96,
        /// Default CEQ interrupt-coalescing count (EQEs).
        CEQ_MAX_CNT / ceq_max_count / set_ceq_max_count: u16 = 143:128,
        /// Default CEQ interrupt-coalescing period (EQC `EQ_PERIOD` units).
        CEQ_PERIOD / ceq_period / set_ceq_period: u16 = 159:144,
        /// Default AEQ interrupt-coalescing count (EQEs).
        AEQ_MAX_CNT / aeq_max_count / set_aeq_max_count: u16 = 175:160,
        /// Default AEQ interrupt-coalescing period (EQC `EQ_PERIOD` units).
        AEQ_PERIOD / aeq_period / set_aeq_period: u16 = 191:176,
    }
}

/// Device capabilities as plain numbers: everything the five `QUERY_PF_CAPS_NUM`
/// descriptors carry, with log2 fields expanded to counts (`num_qps` = 2^`NUM_QPS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    // ---- descriptor A ----
    /// Number of ports.
    pub num_ports: u8,
    /// Local CA ACK delay (IB encoding).
    pub local_ca_ack_delay: u8,
    /// Maximum SGEs per send WR.
    pub max_sq_sges: u16,
    /// Maximum inline data per send WR, bytes.
    pub max_sq_inline: u16,
    /// Maximum SGEs per receive WR.
    pub max_rq_sges: u16,
    /// Total extended SGE slots.
    pub max_extend_sges: u32,
    /// Number of QPC timer entries.
    pub num_qpc_timers: u16,
    /// Number of CQC timer entries.
    pub num_cqc_timers: u16,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sges: u16,
    /// Number of AEQ interrupt vectors.
    pub num_aeq_vectors: u8,
    /// Number of other (abnormal) interrupt vectors.
    pub num_other_vectors: u8,
    /// Maximum SQ WQE size, bytes.
    pub max_sq_desc_size: u8,
    /// Maximum RQ WQE size, bytes.
    pub max_rq_desc_size: u8,
    /// Maximum SRQ WQE size, bytes.
    pub max_srq_desc_size: u8,
    /// CQE size, bytes (32 or 64).
    pub cqe_size: u8,

    // ---- descriptor B ----
    /// MPT entry size, bytes.
    pub mtpt_entry_size: u8,
    /// IRRL entry size, bytes.
    pub irrl_entry_size: u8,
    /// TRRL entry size, bytes.
    pub trrl_entry_size: u8,
    /// CQ context size, bytes.
    pub cqc_entry_size: u8,
    /// SRQ context size, bytes.
    pub srqc_entry_size: u8,
    /// SRQ index-queue entry size, bytes.
    pub idx_entry_size: u8,
    /// SCC context size, bytes.
    pub sccc_size: u8,
    /// Maximum path MTU (IB MTU enum: 1 = 256 … 5 = 4096).
    pub max_mtu: u8,
    /// QP context size, bytes.
    pub qpc_size: u16,
    /// QPC timer entry size, bytes.
    pub qpc_timer_entry_size: u16,
    /// CQC timer entry size, bytes.
    pub cqc_timer_entry_size: u16,
    /// Minimum CQ depth, CQEs.
    pub min_cqes: u8,
    /// Minimum WQ depth, WQEs.
    pub min_wqes: u8,
    /// Supported page sizes: bit n set = 2^n bytes supported.
    pub page_size_cap: u32,
    /// P_Key table length, entries.
    pub pkey_table_length: u8,
    /// Number of physical UARs (doorbell pages).
    pub physical_uars: u8,
    /// Hop number of the context tables (0..=3).
    pub context_hops: u8,
    /// Hop number of PBLs and CQE / SRQ WQE / index buffers (0..=3).
    pub pbl_hops: u8,

    // ---- descriptor C ----
    /// Number of protection domains (power of two).
    pub num_pds: u32,
    /// Capability flags (bits 11:0 in descriptor C, 27:12 in descriptor D).
    pub flags: CapFlags,
    /// Number of CQs (power of two).
    pub num_cqs: u32,
    /// GID table length (0..=511).
    pub max_gids: u16,
    /// Maximum CQ depth, CQEs (power of two).
    pub max_cqes: u32,
    /// Number of MPT entries, MRs + MWs (power of two).
    pub num_mtpts: u32,
    /// Number of QPs (power of two).
    pub num_qps: u32,
    /// Maximum outstanding RDMA READ / atomic requests per QP.
    pub max_outstanding_reads: u8,
    /// Maximum SQ depth, WQEs (power of two).
    pub max_sq_wqes: u32,
    /// Maximum RQ depth, WQEs (power of two).
    pub max_rq_wqes: u32,

    // ---- descriptor D ----
    /// Number of SRQs (power of two).
    pub num_srqs: u32,
    /// Hop number of RQ WQE buffers (0..=3).
    pub rq_wqe_hops: u8,
    /// Hop number of extended SGE buffers (0..=3).
    pub ext_sge_hops: u8,
    /// Hop number of SQ WQE buffers (0..=3).
    pub sq_wqe_hops: u8,
    /// Supported congestion algorithms, bit mask (bit 0 DCQCN, 1 LDCP, 2 HC3, 3 DIP).
    pub congestion_types: u8,
    /// Maximum SRQ depth, WQEs (power of two).
    pub max_srq_wqes: u32,
    /// CEQ depth, entries (power of two).
    pub ceq_depth: u32,
    /// Number of completion EQs (0..=1023).
    pub num_ceqs: u16,
    /// AEQ depth, entries (power of two).
    pub aeq_depth: u32,
    /// Default AEQ arm state (EQC `ARM_ST` encoding, 0..=3).
    pub aeq_arm_state: u8,
    /// Default CEQ arm state (EQC `ARM_ST` encoding, 0..=3).
    pub ceq_arm_state: u8,
    /// Number of reserved PDs (< 2^20).
    pub reserved_pds: u32,
    /// Number of UARs (power of two).
    pub num_uars: u32,
    /// Number of reserved QPs (< 2^20).
    pub reserved_qps: u32,
    /// Number of reserved UARs.
    pub reserved_uars: u8,

    // ---- descriptor E ----
    /// Number of reserved MPT entries (< 2^20).
    pub reserved_mrws: u32,
    /// HEM chunk size, bytes (power of two).
    pub chunk_size: u32,
    /// Number of reserved CQs (< 2^20).
    pub reserved_cqs: u32,
    /// Number of reserved SRQs (< 2^20).
    pub reserved_srqs: u32,
    /// Reserved lkey, the local DMA lkey (< 2^20).
    pub reserved_lkey: u32,
    /// Default CEQ interrupt-coalescing count, EQEs.
    pub ceq_max_count: u16,
    /// Default CEQ interrupt-coalescing period (EQC `EQ_PERIOD` units).
    pub ceq_period: u16,
    /// Default AEQ interrupt-coalescing count, EQEs.
    pub aeq_max_count: u16,
    /// Default AEQ interrupt-coalescing period (EQC `EQ_PERIOD` units).
    pub aeq_period: u16,
}

/// Writes `value` into `field`, refusing values wider than the field.
fn put(bytes: &mut [u8], field: Field, value: u64) -> Result<(), CapsError> {
    if value > field.max_value() {
        return Err(CapsError::OutOfRange {
            field: field.name,
            value,
            max: field.max_value(),
        });
    }
    field.set(bytes, value);
    Ok(())
}

/// Writes log2 of `count` into `field`; `count` must be a power of two.
fn put_log2(bytes: &mut [u8], field: Field, count: u32) -> Result<(), CapsError> {
    if !count.is_power_of_two() {
        return Err(CapsError::NotPowerOfTwo {
            field: field.name,
            value: count.into(),
        });
    }
    put(bytes, field, count.trailing_zeros().into())
}

/// Reads the log2 `field` and returns the count it encodes.
fn get_log2(bytes: &[u8], field: Field) -> Result<u32, CapsError> {
    let log2 = field.get(bytes);
    if log2 >= 32 {
        return Err(CapsError::Log2TooLarge {
            field: field.name,
            log2,
        });
    }
    Ok(1 << log2)
}

impl DeviceCaps {
    /// Encodes the capabilities as the five descriptor payloads A..E.
    ///
    /// # Panics
    /// If a count kept as log2 is not a power of two or a value does not fit its field;
    /// [`DeviceCaps::try_to_descriptors`] reports those as errors instead.
    pub fn to_descriptors(&self) -> [[u8; CAPS_DESCRIPTOR_SIZE]; 5] {
        match self.try_to_descriptors() {
            Ok(descriptors) => descriptors,
            Err(error) => panic!("DeviceCaps cannot be encoded: {error}"),
        }
    }

    /// Encodes the capabilities as the five descriptor payloads A..E. Fails if a count
    /// kept as log2 is not a power of two or a value does not fit its field.
    pub fn try_to_descriptors(&self) -> Result<[[u8; CAPS_DESCRIPTOR_SIZE]; 5], CapsError> {
        let mut a = CapsA::zeroed();
        a.set_number_ports(self.num_ports);
        a.set_local_ca_ack_delay(self.local_ca_ack_delay);
        a.set_max_sq_sges(self.max_sq_sges);
        a.set_max_sq_inline(self.max_sq_inline);
        a.set_max_rq_sges(self.max_rq_sges);
        a.set_max_extend_sges(self.max_extend_sges);
        a.set_num_qpc_timers(self.num_qpc_timers);
        a.set_num_cqc_timers(self.num_cqc_timers);
        a.set_max_srq_sges(self.max_srq_sges);
        a.set_num_aeq_vectors(self.num_aeq_vectors);
        a.set_num_other_vectors(self.num_other_vectors);
        a.set_max_sq_desc_size(self.max_sq_desc_size);
        a.set_max_rq_desc_size(self.max_rq_desc_size);
        a.set_max_srq_desc_size(self.max_srq_desc_size);
        a.set_cqe_size(self.cqe_size);

        let mut b = CapsB::zeroed();
        b.set_mtpt_entry_size(self.mtpt_entry_size);
        b.set_irrl_entry_size(self.irrl_entry_size);
        b.set_trrl_entry_size(self.trrl_entry_size);
        b.set_cqc_entry_size(self.cqc_entry_size);
        b.set_srqc_entry_size(self.srqc_entry_size);
        b.set_idx_entry_size(self.idx_entry_size);
        b.set_sccc_size(self.sccc_size);
        b.set_max_mtu(self.max_mtu);
        b.set_qpc_size(self.qpc_size);
        b.set_qpc_timer_entry_size(self.qpc_timer_entry_size);
        b.set_cqc_timer_entry_size(self.cqc_timer_entry_size);
        b.set_min_cqes(self.min_cqes);
        b.set_min_wqes(self.min_wqes);
        b.set_page_size_cap(self.page_size_cap);
        b.set_pkey_table_length(self.pkey_table_length);
        b.set_physical_uars(self.physical_uars);
        b.set_context_hops(self.context_hops);
        b.set_pbl_hops(self.pbl_hops);

        let flags = u64::from(self.flags.bits());
        let low_flags = flags & CapsC::CAP_FLAGS.max_value();
        let high_flags = flags >> CAP_FLAGS_EX_SHIFT;

        let mut c = CapsC::zeroed();
        put_log2(&mut c.0, CapsC::NUM_PDS, self.num_pds)?;
        put(&mut c.0, CapsC::CAP_FLAGS, low_flags)?;
        put_log2(&mut c.0, CapsC::NUM_CQS, self.num_cqs)?;
        put(&mut c.0, CapsC::MAX_GID, self.max_gids.into())?;
        put_log2(&mut c.0, CapsC::CQ_DEPTH, self.max_cqes)?;
        put_log2(&mut c.0, CapsC::NUM_MRWS, self.num_mtpts)?;
        put_log2(&mut c.0, CapsC::NUM_QPS, self.num_qps)?;
        c.set_max_outstanding_reads(self.max_outstanding_reads);
        put_log2(&mut c.0, CapsC::SQ_DEPTH, self.max_sq_wqes)?;
        put_log2(&mut c.0, CapsC::RQ_DEPTH, self.max_rq_wqes)?;

        let mut d = CapsD::zeroed();
        put_log2(&mut d.0, CapsD::NUM_SRQS, self.num_srqs)?;
        put(&mut d.0, CapsD::RQWQE_HOP_NUM, self.rq_wqe_hops.into())?;
        put(&mut d.0, CapsD::EX_SGE_HOP_NUM, self.ext_sge_hops.into())?;
        put(&mut d.0, CapsD::SQWQE_HOP_NUM, self.sq_wqe_hops.into())?;
        put(&mut d.0, CapsD::CONG_TYPE, self.congestion_types.into())?;
        put_log2(&mut d.0, CapsD::SRQ_DEPTH, self.max_srq_wqes)?;
        put(&mut d.0, CapsD::CAP_FLAGS_EX, high_flags)?;
        put_log2(&mut d.0, CapsD::CEQ_DEPTH, self.ceq_depth)?;
        put(&mut d.0, CapsD::NUM_CEQS, self.num_ceqs.into())?;
        put_log2(&mut d.0, CapsD::AEQ_DEPTH, self.aeq_depth)?;
        put(&mut d.0, CapsD::AEQ_ARM_ST, self.aeq_arm_state.into())?;
        put(&mut d.0, CapsD::CEQ_ARM_ST, self.ceq_arm_state.into())?;
        put(&mut d.0, CapsD::RSV_PDS, self.reserved_pds.into())?;
        put_log2(&mut d.0, CapsD::NUM_UARS, self.num_uars)?;
        put(&mut d.0, CapsD::RSV_QPS, self.reserved_qps.into())?;
        d.set_reserved_uars(self.reserved_uars);

        let mut e = CapsE::zeroed();
        put(&mut e.0, CapsE::RSV_MRWS, self.reserved_mrws.into())?;
        put_log2(&mut e.0, CapsE::CHUNK_SIZE_SHIFT, self.chunk_size)?;
        put(&mut e.0, CapsE::RSV_CQS, self.reserved_cqs.into())?;
        put(&mut e.0, CapsE::RSV_SRQS, self.reserved_srqs.into())?;
        put(&mut e.0, CapsE::RSV_LKEYS, self.reserved_lkey.into())?;
        e.set_ceq_max_count(self.ceq_max_count);
        e.set_ceq_period(self.ceq_period);
        e.set_aeq_max_count(self.aeq_max_count);
        e.set_aeq_period(self.aeq_period);

        Ok([a.0, b.0, c.0, d.0, e.0])
    }

    /// Decodes the five descriptor payloads A..E. Fails if a log2 field is 32 or more.
    /// Capability flag bits without a [`CapFlags`] name are kept.
    pub fn from_descriptors(descriptors: &[[u8; CAPS_DESCRIPTOR_SIZE]; 5]) -> Result<DeviceCaps, CapsError> {
        let [a, b, c, d, e] = descriptors;
        let (a, b, c, d, e) = (CapsA(*a), CapsB(*b), CapsC(*c), CapsD(*d), CapsE(*e));
        let flags = u32::from(c.cap_flags()) | (u32::from(d.cap_flags_extended()) << CAP_FLAGS_EX_SHIFT);
        Ok(DeviceCaps {
            num_ports: a.number_ports(),
            local_ca_ack_delay: a.local_ca_ack_delay(),
            max_sq_sges: a.max_sq_sges(),
            max_sq_inline: a.max_sq_inline(),
            max_rq_sges: a.max_rq_sges(),
            max_extend_sges: a.max_extend_sges(),
            num_qpc_timers: a.num_qpc_timers(),
            num_cqc_timers: a.num_cqc_timers(),
            max_srq_sges: a.max_srq_sges(),
            num_aeq_vectors: a.num_aeq_vectors(),
            num_other_vectors: a.num_other_vectors(),
            max_sq_desc_size: a.max_sq_desc_size(),
            max_rq_desc_size: a.max_rq_desc_size(),
            max_srq_desc_size: a.max_srq_desc_size(),
            cqe_size: a.cqe_size(),

            mtpt_entry_size: b.mtpt_entry_size(),
            irrl_entry_size: b.irrl_entry_size(),
            trrl_entry_size: b.trrl_entry_size(),
            cqc_entry_size: b.cqc_entry_size(),
            srqc_entry_size: b.srqc_entry_size(),
            idx_entry_size: b.idx_entry_size(),
            sccc_size: b.sccc_size(),
            max_mtu: b.max_mtu(),
            qpc_size: b.qpc_size(),
            qpc_timer_entry_size: b.qpc_timer_entry_size(),
            cqc_timer_entry_size: b.cqc_timer_entry_size(),
            min_cqes: b.min_cqes(),
            min_wqes: b.min_wqes(),
            page_size_cap: b.page_size_cap(),
            pkey_table_length: b.pkey_table_length(),
            physical_uars: b.physical_uars(),
            context_hops: b.context_hops(),
            pbl_hops: b.pbl_hops(),

            num_pds: get_log2(&c.0, CapsC::NUM_PDS)?,
            flags: CapFlags::from_bits_retain(flags),
            num_cqs: get_log2(&c.0, CapsC::NUM_CQS)?,
            max_gids: c.max_gids(),
            max_cqes: get_log2(&c.0, CapsC::CQ_DEPTH)?,
            num_mtpts: get_log2(&c.0, CapsC::NUM_MRWS)?,
            num_qps: get_log2(&c.0, CapsC::NUM_QPS)?,
            max_outstanding_reads: c.max_outstanding_reads(),
            max_sq_wqes: get_log2(&c.0, CapsC::SQ_DEPTH)?,
            max_rq_wqes: get_log2(&c.0, CapsC::RQ_DEPTH)?,

            num_srqs: get_log2(&d.0, CapsD::NUM_SRQS)?,
            rq_wqe_hops: d.rq_wqe_hops(),
            ext_sge_hops: d.ext_sge_hops(),
            sq_wqe_hops: d.sq_wqe_hops(),
            congestion_types: d.congestion_types(),
            max_srq_wqes: get_log2(&d.0, CapsD::SRQ_DEPTH)?,
            ceq_depth: get_log2(&d.0, CapsD::CEQ_DEPTH)?,
            num_ceqs: d.ceq_count(),
            aeq_depth: get_log2(&d.0, CapsD::AEQ_DEPTH)?,
            aeq_arm_state: d.aeq_arm_state(),
            ceq_arm_state: d.ceq_arm_state(),
            reserved_pds: d.reserved_pds(),
            num_uars: get_log2(&d.0, CapsD::NUM_UARS)?,
            reserved_qps: d.reserved_qps(),
            reserved_uars: d.reserved_uars(),

            reserved_mrws: e.reserved_mrws(),
            chunk_size: get_log2(&e.0, CapsE::CHUNK_SIZE_SHIFT)?,
            reserved_cqs: e.reserved_cqs(),
            reserved_srqs: e.reserved_srqs(),
            reserved_lkey: e.reserved_lkey(),
            ceq_max_count: e.ceq_max_count(),
            ceq_period: e.ceq_period(),
            aeq_max_count: e.aeq_max_count(),
            aeq_period: e.aeq_period(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{check_fields, LayoutError};

    /// Tiny xorshift64 generator so the round-trip tests are reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Sets every field of `L` to a seeded pseudo-random value, emits, parses back and
    /// checks that every field reads back unchanged; also checks the field table.
    fn assert_round_trip<L: Layout>(seed: u64) {
        check_fields(L::NAME, L::SIZE, L::FIELDS).unwrap();
        let mut rng = XorShift(seed);
        let mut value = L::zeroed();
        let expected: Vec<u64> = L::FIELDS
            .iter()
            .map(|field| {
                let v = rng.next() & field.max_value();
                field.set(value.bytes_mut(), v);
                v
            })
            .collect();
        let mut wire = vec![0u8; L::SIZE];
        value.emit(&mut wire).unwrap();
        let parsed = L::parse(&wire).unwrap();
        for (field, v) in L::FIELDS.iter().zip(expected) {
            assert_eq!(field.get(parsed.bytes()), v, "{}.{}", L::NAME, field.name);
        }
    }

    /// The five descriptors of one device, written by hand; [`sample_caps`] is the same
    /// device as a `DeviceCaps`.
    const CAPS_A_BYTES: [u8; 24] = [
        0x01, 0x0F, // number_ports 1, local_ca_ack_delay 15
        0x40, 0x00, // max_sq_sg 64
        0x00, 0x04, // max_sq_inline 1024
        0x40, 0x00, // max_rq_sg 64
        0x00, 0x00, 0x20, 0x00, // max_extend_sg 0x200000
        0x00, 0x01, // num_qpc_timer 256
        0x40, 0x00, // num_cqc_timer 64
        0x40, 0x00, // max_srq_sges 64
        0x01, 0x01, // num_aeq_vectors 1, num_other_vectors 1
        0x40, 0x10, 0x10, 0x40, // max_sq/rq/srq_desc_sz 64/16/16, cqe_sz 64
    ];
    const CAPS_B_BYTES: [u8; 24] = [
        0x40, 0x40, 0x30, 0x40, // mtpt 64, irrl 64, trrl 48, cqc 64
        0x40, 0x04, 0x40, 0x05, // srqc 64, idx 4, sccc 64, max_mtu 5 (4096)
        0x00, 0x02, // qpc_sz 512
        0x00, 0x10, // qpc_timer_entry_sz 4096
        0x00, 0x10, // cqc_timer_entry_sz 4096
        0x40, 0x40, // min_cqes 64, min_wqes 64
        0x00, 0xF0, 0xFF, 0xFF, // page_size_cap 4 KiB .. 2 GiB
        0x01, 0x01, 0x01, 0x02, // pkey_table_len, phy_num_uars, ctx_hop 1, pbl_hop 2
    ];
    const CAPS_C_BYTES: [u8; 24] = [
        0x18, 0x00, 0xF0, 0x47, // NUM_PDS 24 (19:0), CAP_FLAGS 0x47F (31:20)
        0x14, 0x00, 0x00, 0x10, // NUM_CQS 20 (51:32), MAX_GID 256 (60:52)
        0x16, 0x00, 0x00, 0x00, // CQ_DEPTH 22 (86:64)
        0x14, 0x00, 0x00, 0x00, // NUM_MRWS 20 (115:96)
        0x10, 0x00, 0x00, 0x08, // NUM_QPS 16 (147:128), MAX_ORD 128 (155:148)
        0x0F, 0x00, 0x0F, 0x00, // sq_depth 15, rq_depth 15
    ];
    const CAPS_D_BYTES: [u8; 24] = [
        0x14, 0x00, 0x60, 0x3E, // NUM_SRQS 20; hops RQ 2, EX_SGE 1, SQ 2; CONG 0xF
        0x0F, 0x00, 0x25, 0x00, // srq_depth 15, cap_flags_ex 0x25
        0x0C, 0x00, 0x00, 0x01, // CEQ_DEPTH 12 (85:64), NUM_CEQS 4 (95:86)
        0x0C, 0x00, 0xC0, 0x03, // AEQ_DEPTH 12, AEQ/CEQ_ARM_ST 3 (119:118, 121:120)
        0x02, 0x00, 0x20, 0x00, // RSV_PDS 2 (147:128), NUM_UARS 2 (155:148)
        0x08, 0x00, 0x10, 0x00, // RSV_QPS 8 (179:160), RSV_UARS 1 (187:180)
    ];
    const CAPS_E_BYTES: [u8; 24] = [
        0x01, 0x00, 0x00, 0x01, // RSV_MRWS 1 (19:0), CHUNK_SIZE_SHIFT 16 (31:20)
        0x04, 0x00, 0x00, 0x00, // RSV_CQS 4 (51:32)
        0x03, 0x00, 0x00, 0x00, // RSV_SRQS 3 (83:64)
        0x00, 0x01, 0x00, 0x00, // RSV_LKEYS 0x100 (115:96)
        0x01, 0x00, 0x10, 0x00, // ceq_max_cnt 1, ceq_period 16
        0x01, 0x00, 0x10, 0x00, // aeq_max_cnt 1, aeq_period 16
    ];
    const ALL_BYTES: [[u8; 24]; 5] = [CAPS_A_BYTES, CAPS_B_BYTES, CAPS_C_BYTES, CAPS_D_BYTES, CAPS_E_BYTES];

    fn sample_flags() -> CapFlags {
        CapFlags::REREG_MR
            | CapFlags::ROCE_V1_V2
            | CapFlags::RQ_INLINE
            | CapFlags::CQ_RECORD_DB
            | CapFlags::QP_RECORD_DB
            | CapFlags::SRQ
            | CapFlags::XRC
            | CapFlags::ATOMIC
            | CapFlags::DIRECT_WQE
            | CapFlags::SDI_MODE
            | CapFlags::STASH
    }

    fn sample_caps() -> DeviceCaps {
        DeviceCaps {
            num_ports: 1,
            local_ca_ack_delay: 15,
            max_sq_sges: 64,
            max_sq_inline: 1024,
            max_rq_sges: 64,
            max_extend_sges: 0x20_0000,
            num_qpc_timers: 256,
            num_cqc_timers: 64,
            max_srq_sges: 64,
            num_aeq_vectors: 1,
            num_other_vectors: 1,
            max_sq_desc_size: 64,
            max_rq_desc_size: 16,
            max_srq_desc_size: 16,
            cqe_size: 64,

            mtpt_entry_size: 64,
            irrl_entry_size: 64,
            trrl_entry_size: 48,
            cqc_entry_size: 64,
            srqc_entry_size: 64,
            idx_entry_size: 4,
            sccc_size: 64,
            max_mtu: 5,
            qpc_size: 512,
            qpc_timer_entry_size: 4096,
            cqc_timer_entry_size: 4096,
            min_cqes: 64,
            min_wqes: 64,
            page_size_cap: 0xFFFF_F000,
            pkey_table_length: 1,
            physical_uars: 1,
            context_hops: 1,
            pbl_hops: 2,

            num_pds: 1 << 24,
            flags: sample_flags(),
            num_cqs: 1 << 20,
            max_gids: 256,
            max_cqes: 1 << 22,
            num_mtpts: 1 << 20,
            num_qps: 1 << 16,
            max_outstanding_reads: 128,
            max_sq_wqes: 1 << 15,
            max_rq_wqes: 1 << 15,

            num_srqs: 1 << 20,
            rq_wqe_hops: 2,
            ext_sge_hops: 1,
            sq_wqe_hops: 2,
            congestion_types: 0xF,
            max_srq_wqes: 1 << 15,
            ceq_depth: 1 << 12,
            num_ceqs: 4,
            aeq_depth: 1 << 12,
            aeq_arm_state: 3,
            ceq_arm_state: 3,
            reserved_pds: 2,
            num_uars: 4,
            reserved_qps: 8,
            reserved_uars: 1,

            reserved_mrws: 1,
            chunk_size: 1 << 16,
            reserved_cqs: 4,
            reserved_srqs: 3,
            reserved_lkey: 0x100,
            ceq_max_count: 1,
            ceq_period: 16,
            aeq_max_count: 1,
            aeq_period: 16,
        }
    }

    // ---- CapsA ----

    #[test]
    fn caps_a_parses_known_bytes() {
        let a = CapsA::parse(&CAPS_A_BYTES).unwrap();
        assert_eq!(a.number_ports(), 1);
        assert_eq!(a.local_ca_ack_delay(), 15);
        assert_eq!(a.max_sq_sges(), 64);
        assert_eq!(a.max_sq_inline(), 1024);
        assert_eq!(a.max_rq_sges(), 64);
        assert_eq!(a.max_extend_sges(), 0x20_0000);
        assert_eq!(a.num_qpc_timers(), 256);
        assert_eq!(a.num_cqc_timers(), 64);
        assert_eq!(a.max_srq_sges(), 64);
        assert_eq!(a.num_aeq_vectors(), 1);
        assert_eq!(a.num_other_vectors(), 1);
        assert_eq!(a.max_sq_desc_size(), 64);
        assert_eq!(a.max_rq_desc_size(), 16);
        assert_eq!(a.max_srq_desc_size(), 16);
        assert_eq!(a.cqe_size(), 64);
    }

    #[test]
    fn caps_a_emits_known_bytes() {
        let mut a = CapsA::zeroed();
        a.set_number_ports(1);
        a.set_local_ca_ack_delay(15);
        a.set_max_sq_sges(64);
        a.set_max_sq_inline(1024);
        a.set_max_rq_sges(64);
        a.set_max_extend_sges(0x20_0000);
        a.set_num_qpc_timers(256);
        a.set_num_cqc_timers(64);
        a.set_max_srq_sges(64);
        a.set_num_aeq_vectors(1);
        a.set_num_other_vectors(1);
        a.set_max_sq_desc_size(64);
        a.set_max_rq_desc_size(16);
        a.set_max_srq_desc_size(16);
        a.set_cqe_size(64);
        assert_eq!(a.0, CAPS_A_BYTES);
    }

    #[test]
    fn caps_a_round_trips_every_field() {
        assert_round_trip::<CapsA>(0x5EED_0041);
    }

    #[test]
    fn caps_a_parse_rejects_truncated_input() {
        assert_eq!(
            CapsA::parse(&CAPS_A_BYTES[..23]),
            Err(LayoutError::Truncated {
                layout: "CapsA",
                expected: 24,
                actual: 23
            })
        );
    }

    // ---- CapsB ----

    #[test]
    fn caps_b_parses_known_bytes() {
        let b = CapsB::parse(&CAPS_B_BYTES).unwrap();
        assert_eq!(b.mtpt_entry_size(), 64);
        assert_eq!(b.irrl_entry_size(), 64);
        assert_eq!(b.trrl_entry_size(), 48);
        assert_eq!(b.cqc_entry_size(), 64);
        assert_eq!(b.srqc_entry_size(), 64);
        assert_eq!(b.idx_entry_size(), 4);
        assert_eq!(b.sccc_size(), 64);
        assert_eq!(b.max_mtu(), 5);
        assert_eq!(b.qpc_size(), 512);
        assert_eq!(b.qpc_timer_entry_size(), 4096);
        assert_eq!(b.cqc_timer_entry_size(), 4096);
        assert_eq!(b.min_cqes(), 64);
        assert_eq!(b.min_wqes(), 64);
        assert_eq!(b.page_size_cap(), 0xFFFF_F000);
        assert_eq!(b.pkey_table_length(), 1);
        assert_eq!(b.physical_uars(), 1);
        assert_eq!(b.context_hops(), 1);
        assert_eq!(b.pbl_hops(), 2);
    }

    #[test]
    fn caps_b_emits_known_bytes() {
        let mut b = CapsB::zeroed();
        b.set_mtpt_entry_size(64);
        b.set_irrl_entry_size(64);
        b.set_trrl_entry_size(48);
        b.set_cqc_entry_size(64);
        b.set_srqc_entry_size(64);
        b.set_idx_entry_size(4);
        b.set_sccc_size(64);
        b.set_max_mtu(5);
        b.set_qpc_size(512);
        b.set_qpc_timer_entry_size(4096);
        b.set_cqc_timer_entry_size(4096);
        b.set_min_cqes(64);
        b.set_min_wqes(64);
        b.set_page_size_cap(0xFFFF_F000);
        b.set_pkey_table_length(1);
        b.set_physical_uars(1);
        b.set_context_hops(1);
        b.set_pbl_hops(2);
        assert_eq!(b.0, CAPS_B_BYTES);
    }

    #[test]
    fn caps_b_round_trips_every_field() {
        assert_round_trip::<CapsB>(0x5EED_0042);
    }

    #[test]
    fn caps_b_parse_rejects_truncated_input() {
        assert_eq!(
            CapsB::parse(&CAPS_B_BYTES[..23]),
            Err(LayoutError::Truncated {
                layout: "CapsB",
                expected: 24,
                actual: 23
            })
        );
    }

    // ---- CapsC ----

    #[test]
    fn caps_c_parses_known_bytes() {
        let c = CapsC::parse(&CAPS_C_BYTES).unwrap();
        assert_eq!(c.pd_count_log2(), 24);
        assert_eq!(c.cap_flags(), 0x47F);
        assert_eq!(c.cq_count_log2(), 20);
        assert_eq!(c.max_gids(), 256);
        assert_eq!(c.cq_depth_log2(), 22);
        assert_eq!(c.mtpt_count_log2(), 20);
        assert_eq!(c.qp_count_log2(), 16);
        assert_eq!(c.max_outstanding_reads(), 128);
        assert_eq!(c.sq_depth_log2(), 15);
        assert_eq!(c.rq_depth_log2(), 15);
    }

    #[test]
    fn caps_c_emits_known_bytes() {
        let mut c = CapsC::zeroed();
        c.set_pd_count_log2(24);
        c.set_cap_flags(0x47F);
        c.set_cq_count_log2(20);
        c.set_max_gids(256);
        c.set_cq_depth_log2(22);
        c.set_mtpt_count_log2(20);
        c.set_qp_count_log2(16);
        c.set_max_outstanding_reads(128);
        c.set_sq_depth_log2(15);
        c.set_rq_depth_log2(15);
        assert_eq!(c.0, CAPS_C_BYTES);
    }

    #[test]
    fn caps_c_round_trips_every_field() {
        assert_round_trip::<CapsC>(0x5EED_0043);
    }

    #[test]
    fn caps_c_parse_rejects_truncated_input() {
        assert_eq!(
            CapsC::parse(&CAPS_C_BYTES[..23]),
            Err(LayoutError::Truncated {
                layout: "CapsC",
                expected: 24,
                actual: 23
            })
        );
    }

    // ---- CapsD ----

    #[test]
    fn caps_d_parses_known_bytes() {
        let d = CapsD::parse(&CAPS_D_BYTES).unwrap();
        assert_eq!(d.srq_count_log2(), 20);
        assert_eq!(d.rq_wqe_hops(), 2);
        assert_eq!(d.ext_sge_hops(), 1);
        assert_eq!(d.sq_wqe_hops(), 2);
        assert_eq!(d.congestion_types(), 0xF);
        assert_eq!(d.srq_depth_log2(), 15);
        assert_eq!(d.cap_flags_extended(), 0x25);
        assert_eq!(d.ceq_depth_log2(), 12);
        assert_eq!(d.ceq_count(), 4);
        assert_eq!(d.aeq_depth_log2(), 12);
        assert_eq!(d.aeq_arm_state(), 3);
        assert_eq!(d.ceq_arm_state(), 3);
        assert_eq!(d.reserved_pds(), 2);
        assert_eq!(d.uar_count_log2(), 2);
        assert_eq!(d.reserved_qps(), 8);
        assert_eq!(d.reserved_uars(), 1);
    }

    #[test]
    fn caps_d_emits_known_bytes() {
        let mut d = CapsD::zeroed();
        d.set_srq_count_log2(20);
        d.set_rq_wqe_hops(2);
        d.set_ext_sge_hops(1);
        d.set_sq_wqe_hops(2);
        d.set_congestion_types(0xF);
        d.set_srq_depth_log2(15);
        d.set_cap_flags_extended(0x25);
        d.set_ceq_depth_log2(12);
        d.set_ceq_count(4);
        d.set_aeq_depth_log2(12);
        d.set_aeq_arm_state(3);
        d.set_ceq_arm_state(3);
        d.set_reserved_pds(2);
        d.set_uar_count_log2(2);
        d.set_reserved_qps(8);
        d.set_reserved_uars(1);
        assert_eq!(d.0, CAPS_D_BYTES);
    }

    #[test]
    fn caps_d_round_trips_every_field() {
        assert_round_trip::<CapsD>(0x5EED_0044);
    }

    #[test]
    fn caps_d_parse_rejects_truncated_input() {
        assert_eq!(
            CapsD::parse(&CAPS_D_BYTES[..23]),
            Err(LayoutError::Truncated {
                layout: "CapsD",
                expected: 24,
                actual: 23
            })
        );
    }

    // ---- CapsE ----

    #[test]
    fn caps_e_parses_known_bytes() {
        let e = CapsE::parse(&CAPS_E_BYTES).unwrap();
        assert_eq!(e.reserved_mrws(), 1);
        assert_eq!(e.chunk_size_shift(), 16);
        assert_eq!(e.reserved_cqs(), 4);
        assert_eq!(e.reserved_srqs(), 3);
        assert_eq!(e.reserved_lkey(), 0x100);
        assert_eq!(e.ceq_max_count(), 1);
        assert_eq!(e.ceq_period(), 16);
        assert_eq!(e.aeq_max_count(), 1);
        assert_eq!(e.aeq_period(), 16);
    }

    #[test]
    fn caps_e_emits_known_bytes() {
        let mut e = CapsE::zeroed();
        e.set_reserved_mrws(1);
        e.set_chunk_size_shift(16);
        e.set_reserved_cqs(4);
        e.set_reserved_srqs(3);
        e.set_reserved_lkey(0x100);
        e.set_ceq_max_count(1);
        e.set_ceq_period(16);
        e.set_aeq_max_count(1);
        e.set_aeq_period(16);
        assert_eq!(e.0, CAPS_E_BYTES);
    }

    #[test]
    fn caps_e_round_trips_every_field() {
        assert_round_trip::<CapsE>(0x5EED_0045);
    }

    #[test]
    fn caps_e_parse_rejects_truncated_input() {
        assert_eq!(
            CapsE::parse(&CAPS_E_BYTES[..23]),
            Err(LayoutError::Truncated {
                layout: "CapsE",
                expected: 24,
                actual: 23
            })
        );
    }

    // ---- CapFlags ----

    #[test]
    fn cap_flag_bits_have_the_hns_positions() {
        let table = [
            (0, CapFlags::REREG_MR),
            (1, CapFlags::ROCE_V1_V2),
            (2, CapFlags::RQ_INLINE),
            (3, CapFlags::CQ_RECORD_DB),
            (4, CapFlags::QP_RECORD_DB),
            (5, CapFlags::SRQ),
            (6, CapFlags::XRC),
            (7, CapFlags::MW),
            (8, CapFlags::FRMR),
            (9, CapFlags::QP_FLOW_CTRL),
            (10, CapFlags::ATOMIC),
            (12, CapFlags::DIRECT_WQE),
            (14, CapFlags::SDI_MODE),
            (17, CapFlags::STASH),
            (19, CapFlags::CQE_INLINE),
            (21, CapFlags::BOND),
            (22, CapFlags::SRQ_RECORD_DB),
            (23, CapFlags::LIMIT_BANK),
        ];
        assert_eq!(table.len(), CapFlags::all().iter().count());
        for (bit, flag) in table {
            assert_eq!(flag.bits(), 1 << bit, "{flag:?}");
        }
    }

    // ---- DeviceCaps ----

    #[test]
    fn device_caps_encode_to_the_known_descriptors() {
        let descriptors = sample_caps().to_descriptors();
        assert_eq!(descriptors[0], CAPS_A_BYTES);
        assert_eq!(descriptors, ALL_BYTES);
    }

    #[test]
    fn device_caps_decode_the_known_descriptors() {
        let caps = DeviceCaps::from_descriptors(&ALL_BYTES).unwrap();
        assert_eq!(caps, sample_caps());
        assert_eq!(caps.num_qps, 65536, "NUM_QPS 16 is 2^16 QPs");
        assert_eq!(caps.flags.bits(), 0x0002_547F);
    }

    #[test]
    fn device_caps_round_trip_through_descriptors() {
        let caps = sample_caps();
        let back = DeviceCaps::from_descriptors(&caps.to_descriptors()).unwrap();
        assert_eq!(back, caps);
    }

    #[test]
    fn random_descriptors_survive_decode_then_encode() {
        const LOG2_FIELDS: [&str; 13] = [
            "NUM_PDS",
            "NUM_CQS",
            "CQ_DEPTH",
            "NUM_MRWS",
            "NUM_QPS",
            "SQ_DEPTH",
            "RQ_DEPTH",
            "NUM_SRQS",
            "SRQ_DEPTH",
            "CEQ_DEPTH",
            "AEQ_DEPTH",
            "NUM_UARS",
            "CHUNK_SIZE_SHIFT",
        ];
        let tables: [&[Field]; 5] = [
            CapsA::FIELDS,
            CapsB::FIELDS,
            CapsC::FIELDS,
            CapsD::FIELDS,
            CapsE::FIELDS,
        ];
        let mut rng = XorShift(0x5EED_0046);
        for _ in 0..64 {
            let mut descriptors = [[0u8; 24]; 5];
            for (bytes, fields) in descriptors.iter_mut().zip(tables) {
                for field in fields {
                    let mut v = rng.next() & field.max_value();
                    if LOG2_FIELDS.contains(&field.name) {
                        v %= 32;
                    }
                    field.set(bytes, v);
                }
            }
            let caps = DeviceCaps::from_descriptors(&descriptors).unwrap();
            assert_eq!(caps.to_descriptors(), descriptors);
        }
    }

    #[test]
    fn encoding_rejects_counts_that_are_not_powers_of_two() {
        let mut caps = sample_caps();
        caps.num_qps = 1000;
        assert_eq!(
            caps.try_to_descriptors(),
            Err(CapsError::NotPowerOfTwo {
                field: "NUM_QPS",
                value: 1000
            })
        );
        let mut caps = sample_caps();
        caps.chunk_size = 0;
        assert_eq!(
            caps.try_to_descriptors(),
            Err(CapsError::NotPowerOfTwo {
                field: "CHUNK_SIZE_SHIFT",
                value: 0
            })
        );
    }

    #[test]
    fn encoding_rejects_values_wider_than_their_field() {
        let mut caps = sample_caps();
        caps.max_gids = 512;
        assert_eq!(
            caps.try_to_descriptors(),
            Err(CapsError::OutOfRange {
                field: "MAX_GID",
                value: 512,
                max: 511
            })
        );
        let mut caps = sample_caps();
        caps.sq_wqe_hops = 4;
        assert_eq!(
            caps.try_to_descriptors(),
            Err(CapsError::OutOfRange {
                field: "SQWQE_HOP_NUM",
                value: 4,
                max: 3
            })
        );
        let mut caps = sample_caps();
        caps.flags = CapFlags::from_bits_retain(1 << 28);
        assert_eq!(
            caps.try_to_descriptors(),
            Err(CapsError::OutOfRange {
                field: "CAP_FLAGS_EX",
                value: 1 << 16,
                max: 0xFFFF
            })
        );
    }

    #[test]
    #[should_panic(expected = "NUM_CQS: 3 is not a power of two")]
    fn infallible_encoding_panics_on_invalid_caps() {
        let mut caps = sample_caps();
        caps.num_cqs = 3;
        caps.to_descriptors();
    }

    #[test]
    fn decoding_rejects_log2_values_of_32_or_more() {
        let mut descriptors = ALL_BYTES;
        CapsC::NUM_QPS.set(&mut descriptors[2], 32);
        assert_eq!(
            DeviceCaps::from_descriptors(&descriptors),
            Err(CapsError::Log2TooLarge {
                field: "NUM_QPS",
                log2: 32
            })
        );
        let mut descriptors = ALL_BYTES;
        CapsD::CEQ_DEPTH.set(&mut descriptors[3], 31);
        let caps = DeviceCaps::from_descriptors(&descriptors).unwrap();
        assert_eq!(caps.ceq_depth, 1 << 31);
    }

    #[test]
    fn unnamed_flag_bits_are_kept() {
        let mut descriptors = ALL_BYTES;
        CapsC::CAP_FLAGS.set(&mut descriptors[2], 0x800); // bit 11, unnamed
        let caps = DeviceCaps::from_descriptors(&descriptors).unwrap();
        assert_eq!(caps.flags.bits() & 0x800, 0x800);
        assert_eq!(caps.to_descriptors(), descriptors);
    }
}
