//! Work-queue entries (reference sheet §7): the 16-byte scatter/gather element, the
//! 64-byte RC/XRC and UD send WQEs, the send opcodes and the owner-bit rule.
//!
//! Receive WQEs (RQ and SRQ) have no header: a receive WQE is an array of [`Sge`]s,
//! `2^max_sge_log2` slots long ([`rq_wqe_stride`]). Valid SGEs are filled from slot 0;
//! a device that reserves one slot (HIP08) marks the end of the list with an SGE whose
//! length is [`RQ_INVALID_SGE_LENGTH`] ([`Sge::terminator`]), otherwise unused slots are zero.

use crate::bits::Layout;
use crate::layout;

/// Size of one send-queue WQE in bytes (`HNS_ROCE_SQWQE_SHIFT = 6`).
pub const SQ_WQE_SIZE: usize = 64;
/// Size of one scatter/gather element in bytes.
pub const SGE_SIZE: usize = 16;
/// Size of the RC/XRC send WQE header in bytes; the SGE slots / inline data follow it.
pub const SQ_WQE_HEADER_SIZE: usize = 32;
/// Number of SGE slots inside an RC/XRC send WQE; further SGEs go to the extended SGE ring.
pub const SGES_IN_RC_WQE: usize = 2;
/// SGE length that terminates a receive WQE's SGE list (`HNS_ROCE_INVALID_SGE_LENGTH`).
pub const RQ_INVALID_SGE_LENGTH: u32 = 0x8000_0000;
/// Largest inline payload (bytes) carried inside an RC send WQE (`MAX_RC_INL_INN_SZ`);
/// larger inline payloads go to the extended SGE ring with `INLINE_TYPE = 1`.
pub const MAX_INLINE_IN_WQE: usize = 32;

/// Byte offset of the atomic segment inside an RC send WQE (swap/add operand, then compare).
const ATOMIC_SEGMENT_OFFSET: usize = 48;
/// Byte offset of the UD WQE's destination MAC.
const UD_DMAC_OFFSET: usize = 40;
/// Byte offset of the UD WQE's destination GID.
const UD_DGID_OFFSET: usize = 48;

const _: () = assert!(<Sge as Layout>::SIZE == SGE_SIZE);
const _: () = assert!(<RcSqWqe as Layout>::SIZE == SQ_WQE_SIZE);
const _: () = assert!(<UdSqWqe as Layout>::SIZE == SQ_WQE_SIZE);
const _: () = assert!(SQ_WQE_HEADER_SIZE + SGES_IN_RC_WQE * SGE_SIZE == SQ_WQE_SIZE);
const _: () = assert!(SQ_WQE_HEADER_SIZE + MAX_INLINE_IN_WQE == SQ_WQE_SIZE);

/// Why a WQE value could not be interpreted or built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WqeError {
    /// The 5-bit opcode field holds a value that is not in §7.2.
    #[error("unknown SQ opcode {0:#x}")]
    UnknownSqOpcode(u8),
    /// Inline data longer than the in-WQE inline area.
    #[error("inline data of {len} bytes does not fit the {max}-byte in-WQE area")]
    InlineTooLong {
        /// Bytes offered.
        len: usize,
        /// Bytes available ([`MAX_INLINE_IN_WQE`]).
        max: usize,
    },
}

layout! {
    /// Scatter/gather element (`hns_roce_v2_wqe_data_seg`, 16 bytes): one local buffer.
    /// Used in send WQEs, in the extended SGE ring and as the slots of RQ/SRQ WQEs.
    pub struct Sge[16] {
        /// Buffer length in bytes ([`RQ_INVALID_SGE_LENGTH`] terminates a receive SGE list).
        LEN / length / set_length: u32 = 31:0,
        /// Local key of the memory region holding the buffer.
        LKEY / lkey / set_lkey: u32 = 63:32,
        /// Buffer address (I/O virtual address within the region).
        ADDR / address / set_address: u64 = 127:64,
    }
}

impl Sge {
    /// An SGE for `length` bytes at `address` in the region of `lkey`.
    pub fn new(length: u32, lkey: u32, address: u64) -> Self {
        let mut sge = Self::zeroed();
        sge.set_length(length);
        sge.set_lkey(lkey);
        sge.set_address(address);
        sge
    }

    /// The receive-list terminator written after the last valid SGE when a slot is
    /// reserved (HIP08): `{len = 0x8000_0000, lkey = 0, addr = 0}`.
    pub fn terminator() -> Self {
        Self::new(RQ_INVALID_SGE_LENGTH, 0, 0)
    }

    /// Whether this SGE is the receive-list terminator (length = [`RQ_INVALID_SGE_LENGTH`]).
    pub fn is_terminator(&self) -> bool {
        self.length() == RQ_INVALID_SGE_LENGTH
    }
}

/// Stride in bytes of an RQ or SRQ WQE that holds `2^max_sge_log2` SGE slots
/// (`16 × max_gs`, with `max_gs` already a power of two).
pub const fn rq_wqe_stride(max_sge_log2: u32) -> usize {
    SGE_SIZE << max_sge_log2
}

/// Owner bit software writes into the send WQE at free-running `index` of a ring of
/// `depth` entries (a power of two): 1 on even laps of the ring, 0 on odd laps —
/// `!(index & wqe_cnt)` (§7.3 `OWNER`).
pub fn sq_owner_bit(index: u32, depth: u32) -> bool {
    index & depth == 0
}

/// Send-queue opcodes (`HNS_ROCE_V2_WQE_OP_*`, §7.2), the 5-bit `OPCODE` of a send WQE.
/// Send-side CQEs report the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SqOpcode {
    /// SEND.
    Send = 0x0,
    /// SEND with invalidate; `inv_key` holds the rkey to invalidate.
    SendWithInv = 0x1,
    /// SEND with immediate data.
    SendWithImm = 0x2,
    /// RDMA WRITE.
    RdmaWrite = 0x3,
    /// RDMA WRITE with immediate data.
    RdmaWriteWithImm = 0x4,
    /// RDMA READ (inline not allowed).
    RdmaRead = 0x5,
    /// Atomic compare-and-swap.
    AtomCmpAndSwap = 0x6,
    /// Atomic fetch-and-add.
    AtomFetchAndAdd = 0x7,
    /// Masked atomic compare-and-swap (kernel only).
    AtomMskCmpAndSwap = 0x8,
    /// Masked atomic fetch-and-add (kernel only).
    AtomMskFetchAndAdd = 0x9,
    /// Fast register of a memory region (`IB_WR_REG_MR`, HIP09+).
    FastRegPmr = 0xA,
    /// Local invalidate (sets `SO` + `inv_key`; removed from later kernels).
    LocalInv = 0xB,
    /// Bind memory window (defined; completion maps to REG_MR).
    BindMw = 0xC,
    /// Marks an invalid / unknown opcode.
    Mask = 0x1F,
}

impl SqOpcode {
    /// Every opcode, in value order.
    pub const ALL: [SqOpcode; 14] = [
        Self::Send,
        Self::SendWithInv,
        Self::SendWithImm,
        Self::RdmaWrite,
        Self::RdmaWriteWithImm,
        Self::RdmaRead,
        Self::AtomCmpAndSwap,
        Self::AtomFetchAndAdd,
        Self::AtomMskCmpAndSwap,
        Self::AtomMskFetchAndAdd,
        Self::FastRegPmr,
        Self::LocalInv,
        Self::BindMw,
        Self::Mask,
    ];

    /// Whether a UD QP accepts this opcode (only SEND and SEND_WITH_IMM).
    pub fn allowed_on_ud(self) -> bool {
        matches!(self, Self::Send | Self::SendWithImm)
    }
}

impl From<SqOpcode> for u8 {
    fn from(value: SqOpcode) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for SqOpcode {
    type Error = WqeError;

    fn try_from(value: u8) -> Result<Self, WqeError> {
        Self::ALL
            .into_iter()
            .find(|op| *op as u8 == value)
            .ok_or(WqeError::UnknownSqOpcode(value))
    }
}

layout! {
    /// RC / XRC send WQE (`hns_roce_v2_rc_send_wqe`, §7.3): a 32-byte header followed by
    /// 32 bytes that hold, depending on the opcode, two SGEs ([`RcSqWqe::sge`]), inline
    /// data ([`RcSqWqe::inline_bytes`]), SGE 0 plus the atomic segment
    /// ([`RcSqWqe::atomic_swap_add`], [`RcSqWqe::atomic_compare`]) or an FRMR segment.
    ///
    /// FAST_REG_PMR reuses the header: `MSG_LEN` = PBL base address bits 31:0,
    /// `IMMTDATA` = PBL base address bits 63:32, bits 127:96 = MR length bits 31:0,
    /// bits 159:128 = MR length bits 63:32, `RKEY` = the new key, `VA` = the iova.
    pub struct RcSqWqe[64] {
        /// Operation, a [`SqOpcode`] value.
        OPCODE / opcode / set_opcode: u8 = 4:0,
        /// Direct WQE only: service level bits 1:0.
        DB_SL_L / direct_sl_low / set_direct_sl_low: u8 = 6:5,
        /// Owner bit: 1 on even laps of the ring, 0 on odd laps ([`sq_owner_bit`]).
        OWNER / owner / set_owner: bool = 7:7,
        /// Signaled: generate a CQE when the WQE completes.
        CQE / signaled / set_signaled: bool = 8:8,
        /// Fence: wait for prior RDMA READ / atomic operations (IB_SEND_FENCE).
        FENCE / fence / set_fence: bool = 9:9,
        /// Strong order (rdma-core's classic post_send maps IBV_SEND_FENCE here).
        SO / strong_order / set_strong_order: bool = 10:10,
        /// Solicited event requested at the responder.
        SE / solicited_event / set_solicited_event: bool = 11:11,
        /// The payload is inline data rather than SGEs.
        INLINE / inline / set_inline: bool = 12:12,
        /// Direct WQE only: service level bits 3:2.
        DB_SL_H / direct_sl_high / set_direct_sl_high: u8 = 14:13,
        /// Direct WQE only: the SQ producer index after this WQE.
        WQE_IDX / direct_wqe_index / set_direct_wqe_index: u16 = 30:15,
        /// Direct WQE marker (1 = the WQE was written to the direct-WQE window).
        FLAG / direct_flag / set_direct_flag: bool = 31:31,
        /// Total payload length in bytes (sum of the non-zero SGE lengths).
        MSG_LEN / message_length / set_message_length: u32 = 63:32,
        /// Immediate data (little-endian), or `inv_key` (rkey to invalidate) for SEND_WITH_INV.
        IMMTDATA / immediate_data / set_immediate_data: u32 = 95:64,
        /// XRC initiator: remote XRC SRQ number.
        XRC_SRQN / xrc_srq_number / set_xrc_srq_number: u32 = 119:96,
        /// Number of valid SGEs (zero-length ones skipped), or of SGE slots used by inline data.
        SGE_NUM / sge_count / set_sge_count: u8 = 127:120,
        /// First extended-SGE slot of this WQE (already masked with `sge_cnt - 1`).
        MSG_START_SGE_IDX / message_start_sge_index / set_message_start_sge_index: u32 = 151:128,
        /// Reduce code (meaning not documented by the drivers).
        REDUCE_CODE / reduce_code / set_reduce_code: u8 = 158:152,
        /// Inline data location: 0 = inside the WQE (bytes 32..64), 1 = extended SGE ring.
        INLINE_TYPE / inline_type / set_inline_type: bool = 159:159,
        /// Remote key for RDMA and atomic operations (new key for FAST_REG_PMR).
        RKEY / rkey / set_rkey: u32 = 191:160,
        /// Remote virtual address for RDMA and atomic operations (iova for FAST_REG_PMR).
        VA / remote_address / set_remote_address: u64 = 255:192,
    }
}

impl RcSqWqe {
    /// `inv_key` view of `IMMTDATA`: the rkey a SEND_WITH_INV / LOCAL_INV invalidates.
    pub fn inv_key(&self) -> u32 {
        self.immediate_data()
    }

    /// Sets the `inv_key` view of `IMMTDATA`.
    pub fn set_inv_key(&mut self, key: u32) {
        self.set_immediate_data(key);
    }

    fn sge_range(index: usize) -> core::ops::Range<usize> {
        assert!(
            index < SGES_IN_RC_WQE,
            "RC send WQE has {SGES_IN_RC_WQE} SGE slots, index {index}"
        );
        let start = SQ_WQE_HEADER_SIZE + index * SGE_SIZE;
        start..start + SGE_SIZE
    }

    /// In-WQE SGE slot `index` (0 = bytes 32..48, 1 = bytes 48..64).
    ///
    /// # Panics
    /// If `index >= 2` ([`SGES_IN_RC_WQE`]).
    pub fn sge(&self, index: usize) -> Sge {
        let mut sge = Sge::zeroed();
        sge.0.copy_from_slice(&self.0[Self::sge_range(index)]);
        sge
    }

    /// Writes in-WQE SGE slot `index`.
    ///
    /// # Panics
    /// If `index >= 2` ([`SGES_IN_RC_WQE`]).
    pub fn set_sge(&mut self, index: usize, sge: Sge) {
        self.0[Self::sge_range(index)].copy_from_slice(&sge.0);
    }

    /// The in-WQE inline data area (bytes 32..64, [`MAX_INLINE_IN_WQE`] bytes; only the
    /// first `MSG_LEN` bytes are payload).
    pub fn inline_bytes(&self) -> &[u8] {
        &self.0[SQ_WQE_HEADER_SIZE..]
    }

    /// Copies `data` to the start of the in-WQE inline area and zeroes the rest of it.
    /// Does not touch `INLINE`, `INLINE_TYPE` or `MSG_LEN`.
    pub fn set_inline_bytes(&mut self, data: &[u8]) -> Result<(), WqeError> {
        if data.len() > MAX_INLINE_IN_WQE {
            return Err(WqeError::InlineTooLong {
                len: data.len(),
                max: MAX_INLINE_IN_WQE,
            });
        }
        let area = &mut self.0[SQ_WQE_HEADER_SIZE..];
        area[..data.len()].copy_from_slice(data);
        area[data.len()..].fill(0);
        Ok(())
    }

    fn read_u64(&self, offset: usize) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.0[offset..offset + 8]);
        u64::from_le_bytes(word)
    }

    /// Atomic segment, bytes 48..56 (`fetchadd_swap_data`, little-endian): the swap value
    /// of a compare-and-swap, or the add value of a fetch-and-add.
    pub fn atomic_swap_add(&self) -> u64 {
        self.read_u64(ATOMIC_SEGMENT_OFFSET)
    }

    /// Sets the atomic swap / add operand (bytes 48..56).
    pub fn set_atomic_swap_add(&mut self, value: u64) {
        self.0[ATOMIC_SEGMENT_OFFSET..ATOMIC_SEGMENT_OFFSET + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// Atomic segment, bytes 56..64 (`cmp_data`, little-endian): the compare value of a
    /// compare-and-swap (0 for fetch-and-add).
    pub fn atomic_compare(&self) -> u64 {
        self.read_u64(ATOMIC_SEGMENT_OFFSET + 8)
    }

    /// Sets the atomic compare operand (bytes 56..64).
    pub fn set_atomic_compare(&mut self, value: u64) {
        self.0[ATOMIC_SEGMENT_OFFSET + 8..SQ_WQE_SIZE].copy_from_slice(&value.to_le_bytes());
    }
}

/// Where each piece of a small (≤ 8 byte) UD inline payload is packed (§7.4), as
/// (payload bit field, WQE field) pairs.
const UD_PACKED_INLINE: [(crate::bits::Field, crate::bits::Field); 4] = {
    const fn f(hi: u32, lo: u32) -> crate::bits::Field {
        crate::bits::Field {
            name: "UD_INLINE_DATA",
            hi,
            lo,
            doc: "",
        }
    }
    [
        (f(15, 0), f(63, 48)),
        (f(23, 16), f(127, 120)),
        (f(47, 24), f(151, 128)),
        (f(63, 48), f(175, 160)),
    ]
};

layout! {
    /// UD send WQE (`hns_roce_v2_ud_send_wqe`, §7.4). It has no in-WQE SGE slots: all SGEs
    /// are in the extended SGE ring from `MSG_START_SGE_IDX`. Bytes 40..46 hold the
    /// destination MAC and bytes 48..64 the destination GID, as byte arrays
    /// ([`UdSqWqe::dmac`], [`UdSqWqe::dgid`]).
    pub struct UdSqWqe[64] {
        /// Operation: [`SqOpcode::Send`] or [`SqOpcode::SendWithImm`].
        OPCODE / opcode / set_opcode: u8 = 4:0,
        /// Direct WQE only: service level bits 1:0.
        DB_SL_L / direct_sl_low / set_direct_sl_low: u8 = 6:5,
        /// Owner bit: 1 on even laps of the ring, 0 on odd laps ([`sq_owner_bit`]).
        OWNER / owner / set_owner: bool = 7:7,
        /// Signaled: generate a CQE when the WQE completes.
        CQE / signaled / set_signaled: bool = 8:8,
        /// Solicited event requested at the responder.
        SE / solicited_event / set_solicited_event: bool = 11:11,
        /// The payload is inline data rather than SGEs.
        INLINE / inline / set_inline: bool = 12:12,
        /// Direct WQE only: service level bits 3:2.
        DB_SL_H / direct_sl_high / set_direct_sl_high: u8 = 14:13,
        /// Direct WQE only: the SQ producer index after this WQE.
        WQE_IDX / direct_wqe_index / set_direct_wqe_index: u16 = 30:15,
        /// Direct WQE marker (1 = the WQE was written to the direct-WQE window).
        FLAG / direct_flag / set_direct_flag: bool = 31:31,
        /// Total payload length in bytes.
        MSG_LEN / message_length / set_message_length: u32 = 63:32,
        /// Immediate data (little-endian) for SEND_WITH_IMM.
        IMMTDATA / immediate_data / set_immediate_data: u32 = 95:64,
        /// Protection domain number of the address handle.
        PD / protection_domain / set_protection_domain: u32 = 119:96,
        /// Number of valid SGEs (all in the extended SGE ring), or inline SGE slots.
        SGE_NUM / sge_count / set_sge_count: u8 = 127:120,
        /// First extended-SGE slot of this WQE (already masked with `sge_cnt - 1`).
        MSG_START_SGE_IDX / message_start_sge_index / set_message_start_sge_index: u32 = 151:128,
        /// Inline data location: 0 = packed into the WQE (≤ 8 bytes), 1 = extended SGE ring.
        INLINE_TYPE / inline_type / set_inline_type: bool = 159:159,
        /// UDP source port of the RoCEv2 packet.
        UDPSPN / udp_source_port / set_udp_source_port: u16 = 191:176,
        /// Q_Key (if the WR's qkey has bit 31 set, the QP's own qkey is used instead).
        QKEY / qkey / set_qkey: u32 = 223:192,
        /// Destination QP number.
        DQPN / destination_qpn / set_destination_qpn: u32 = 247:224,
        /// VLAN tag (HIP08 only; HIP09 takes the VLAN from the GMV entry).
        VLAN / vlan / set_vlan: u16 = 271:256,
        /// IP hop limit / TTL.
        HOPLIMIT / hop_limit / set_hop_limit: u8 = 279:272,
        /// Traffic class (RoCEv2: DSCP = traffic class >> 2).
        TCLASS / traffic_class / set_traffic_class: u8 = 287:280,
        /// IPv6 flow label (20 bits).
        FLOW_LABEL / flow_label / set_flow_label: u32 = 307:288,
        /// Service level (0..=7).
        SL / service_level / set_service_level: u8 = 311:308,
        /// Port number.
        PORTN / port_number / set_port_number: u8 = 314:312,
        /// Insert the VLAN tag (HIP08).
        UD_VLAN_EN / vlan_enable / set_vlan_enable: bool = 318:318,
        /// Loopback: the destination is this device.
        LBI / loopback / set_loopback: bool = 319:319,
        /// Source GID table index (byte 46; rdma-core writes a 16-bit GMV index over bytes 46..48).
        SGID_INDEX / sgid_index / set_sgid_index: u8 = 375:368,
        /// Source MAC table index (byte 47).
        SMAC_INDEX / smac_index / set_smac_index: u8 = 383:376,
    }
}

impl UdSqWqe {
    /// Destination MAC, bytes 40..46, in wire order (byte 40 = first octet).
    pub fn dmac(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.0[UD_DMAC_OFFSET..UD_DMAC_OFFSET + 6]);
        mac
    }

    /// Sets the destination MAC (bytes 40..46, wire order).
    pub fn set_dmac(&mut self, mac: [u8; 6]) {
        self.0[UD_DMAC_OFFSET..UD_DMAC_OFFSET + 6].copy_from_slice(&mac);
    }

    /// Destination GID, bytes 48..64, in wire order (byte 48 = first octet).
    pub fn dgid(&self) -> [u8; 16] {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&self.0[UD_DGID_OFFSET..UD_DGID_OFFSET + 16]);
        gid
    }

    /// Sets the destination GID (bytes 48..64, wire order).
    pub fn set_dgid(&mut self, gid: [u8; 16]) {
        self.0[UD_DGID_OFFSET..UD_DGID_OFFSET + 16].copy_from_slice(&gid);
    }

    /// A small inline payload (≤ 8 bytes, `INLINE_TYPE = 0`) packed into spare bits, as a
    /// little-endian u64 (payload byte 0 = bits 7:0): payload bits 15:0 are in WQE bits
    /// 63:48, 23:16 in 127:120, 47:24 in 151:128 and 63:48 in 175:160. These positions
    /// overlap `MSG_LEN` bits 31:16, `SGE_NUM` and `MSG_START_SGE_IDX`, which are then
    /// unused (the length is ≤ 8 and there are no SGEs).
    pub fn packed_inline_data(&self) -> u64 {
        UD_PACKED_INLINE
            .iter()
            .fold(0, |acc, (data, wqe)| acc | (wqe.get(&self.0) << data.lo))
    }

    /// Packs a small inline payload into the WQE (see [`UdSqWqe::packed_inline_data`]).
    pub fn set_packed_inline_data(&mut self, value: u64) {
        for (data, wqe) in UD_PACKED_INLINE {
            wqe.set(&mut self.0, data.get(&value.to_le_bytes()));
        }
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
    fn assert_round_trip<L: Layout + core::fmt::Debug>(seed: u64) {
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

    // ---- Sge ----

    /// len 4096, lkey 0x0001_2300, addr 0x0000_7F00_DEAD_BEEF.
    const SGE_BYTES: [u8; 16] = [
        0x00, 0x10, 0x00, 0x00, // LEN
        0x00, 0x23, 0x01, 0x00, // LKEY
        0xEF, 0xBE, 0xAD, 0xDE, 0x00, 0x7F, 0x00, 0x00, // ADDR
    ];

    #[test]
    fn sge_parses_known_bytes() {
        let sge = Sge::parse(&SGE_BYTES).unwrap();
        assert_eq!(sge.length(), 4096);
        assert_eq!(sge.lkey(), 0x0001_2300);
        assert_eq!(sge.address(), 0x0000_7F00_DEAD_BEEF);
        assert!(!sge.is_terminator());
    }

    #[test]
    fn sge_emits_known_bytes() {
        let mut sge = Sge::zeroed();
        sge.set_length(4096);
        sge.set_lkey(0x0001_2300);
        sge.set_address(0x0000_7F00_DEAD_BEEF);
        assert_eq!(sge.0, SGE_BYTES);
        assert_eq!(Sge::new(4096, 0x0001_2300, 0x0000_7F00_DEAD_BEEF), sge);
    }

    #[test]
    fn sge_round_trips_every_field() {
        assert_round_trip::<Sge>(0x5EED_0001);
    }

    #[test]
    fn sge_parse_rejects_truncated_input() {
        assert_eq!(
            Sge::parse(&SGE_BYTES[..15]),
            Err(LayoutError::Truncated {
                layout: "Sge",
                expected: 16,
                actual: 15
            })
        );
    }

    #[test]
    fn receive_terminator_sge_has_invalid_length_and_nothing_else() {
        let t = Sge::terminator();
        assert_eq!(t.0, [0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(t.is_terminator());
    }

    #[test]
    fn rq_wqe_stride_is_sixteen_bytes_per_sge_slot() {
        assert_eq!(rq_wqe_stride(0), 16);
        assert_eq!(rq_wqe_stride(1), 32);
        assert_eq!(rq_wqe_stride(6), 1024);
    }

    // ---- RcSqWqe ----

    /// RDMA_WRITE_WITH_IMM, DB_SL_L 2, owner, signaled, solicited, DB_SL_H 1,
    /// WQE_IDX 0x1234, FLAG; msg_len 65536; imm 0xAABBCCDD; XRC SRQN 0xABCDEF; 3 SGEs;
    /// start SGE 0x102; reduce code 5; inline type 1; rkey 0x12345678; va 0x1_0000_2000.
    const RC_WQE_BYTES: [u8; 64] = [
        0xC4, 0x29, 0x1A, 0x89, // opcode|DB_SL_L|OWNER; CQE|SE|DB_SL_H; WQE_IDX; FLAG
        0x00, 0x00, 0x01, 0x00, // msg_len
        0xDD, 0xCC, 0xBB, 0xAA, // immtdata
        0xEF, 0xCD, 0xAB, 0x03, // XRC_SRQN, SGE_NUM
        0x02, 0x01, 0x00, 0x85, // MSG_START_SGE_IDX, REDUCE_CODE 5 | INLINE_TYPE
        0x78, 0x56, 0x34, 0x12, // rkey
        0x00, 0x20, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // va
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // SGE 0
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // SGE 1
    ];

    #[test]
    fn rc_sq_wqe_parses_known_bytes() {
        let wqe = RcSqWqe::parse(&RC_WQE_BYTES).unwrap();
        assert_eq!(wqe.opcode(), SqOpcode::RdmaWriteWithImm as u8);
        assert_eq!(wqe.direct_sl_low(), 2);
        assert!(wqe.owner());
        assert!(wqe.signaled());
        assert!(!wqe.fence());
        assert!(!wqe.strong_order());
        assert!(wqe.solicited_event());
        assert!(!wqe.inline());
        assert_eq!(wqe.direct_sl_high(), 1);
        assert_eq!(wqe.direct_wqe_index(), 0x1234);
        assert!(wqe.direct_flag());
        assert_eq!(wqe.message_length(), 65536);
        assert_eq!(wqe.immediate_data(), 0xAABB_CCDD);
        assert_eq!(wqe.inv_key(), 0xAABB_CCDD);
        assert_eq!(wqe.xrc_srq_number(), 0x00AB_CDEF);
        assert_eq!(wqe.sge_count(), 3);
        assert_eq!(wqe.message_start_sge_index(), 0x102);
        assert_eq!(wqe.reduce_code(), 5);
        assert!(wqe.inline_type());
        assert_eq!(wqe.rkey(), 0x1234_5678);
        assert_eq!(wqe.remote_address(), 0x1_0000_2000);
    }

    #[test]
    fn rc_sq_wqe_emits_known_bytes() {
        let mut wqe = RcSqWqe::zeroed();
        wqe.set_opcode(SqOpcode::RdmaWriteWithImm.into());
        wqe.set_direct_sl_low(2);
        wqe.set_owner(true);
        wqe.set_signaled(true);
        wqe.set_solicited_event(true);
        wqe.set_direct_sl_high(1);
        wqe.set_direct_wqe_index(0x1234);
        wqe.set_direct_flag(true);
        wqe.set_message_length(65536);
        wqe.set_immediate_data(0xAABB_CCDD);
        wqe.set_xrc_srq_number(0x00AB_CDEF);
        wqe.set_sge_count(3);
        wqe.set_message_start_sge_index(0x102);
        wqe.set_reduce_code(5);
        wqe.set_inline_type(true);
        wqe.set_rkey(0x1234_5678);
        wqe.set_remote_address(0x1_0000_2000);
        assert_eq!(wqe.0, RC_WQE_BYTES);
    }

    #[test]
    fn rc_sq_wqe_round_trips_every_field() {
        assert_round_trip::<RcSqWqe>(0x5EED_0002);
    }

    #[test]
    fn rc_sq_wqe_parse_rejects_truncated_input() {
        assert_eq!(
            RcSqWqe::parse(&RC_WQE_BYTES[..63]),
            Err(LayoutError::Truncated {
                layout: "RcSqWqe",
                expected: 64,
                actual: 63
            })
        );
    }

    #[test]
    fn rc_sq_wqe_sge_slots_are_bytes_32_and_48() {
        let mut wqe = RcSqWqe::zeroed();
        wqe.set_sge(0, Sge::new(8, 0x100, 0x3000));
        wqe.set_sge(1, Sge::new(0x20, 0x200, 0x4000_0000_0000));
        assert_eq!(&wqe.0[..32], &[0u8; 32]);
        assert_eq!(
            &wqe.0[32..48],
            &[8, 0, 0, 0, 0x00, 0x01, 0, 0, 0x00, 0x30, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            &wqe.0[48..64],
            &[0x20, 0, 0, 0, 0x00, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0]
        );
        assert_eq!(wqe.sge(0), Sge::new(8, 0x100, 0x3000));
        assert_eq!(wqe.sge(1).address(), 0x4000_0000_0000);
    }

    #[test]
    #[should_panic(expected = "SGE slots")]
    fn rc_sq_wqe_has_only_two_sge_slots() {
        RcSqWqe::zeroed().sge(2);
    }

    #[test]
    fn rc_sq_wqe_inline_data_fills_bytes_32_to_64() {
        let mut wqe = RcSqWqe::all_ones();
        wqe.set_inline_bytes(b"hello").unwrap();
        assert_eq!(&wqe.0[32..37], b"hello");
        assert_eq!(&wqe.0[37..], &[0u8; 27]);
        assert_eq!(&wqe.0[..32], &[0xFFu8; 32], "header untouched");
        assert_eq!(&wqe.inline_bytes()[..5], b"hello");
        assert_eq!(wqe.inline_bytes().len(), MAX_INLINE_IN_WQE);

        wqe.set_inline_bytes(&[0xAB; 32]).unwrap();
        assert_eq!(wqe.inline_bytes(), &[0xAB; 32]);
        assert_eq!(
            wqe.set_inline_bytes(&[0; 33]),
            Err(WqeError::InlineTooLong { len: 33, max: 32 })
        );
    }

    #[test]
    fn rc_sq_wqe_atomic_segment_is_swap_add_then_compare() {
        let mut wqe = RcSqWqe::zeroed();
        wqe.set_atomic_swap_add(0x0102_0304_0506_0708);
        wqe.set_atomic_compare(0x1122_3344_5566_7788);
        assert_eq!(
            &wqe.0[48..64],
            &[
                0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // swap / add
                0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // compare
            ]
        );
        assert_eq!(wqe.atomic_swap_add(), 0x0102_0304_0506_0708);
        assert_eq!(wqe.atomic_compare(), 0x1122_3344_5566_7788);
        assert_eq!(&wqe.0[..48], &[0u8; 48]);
    }

    // ---- UdSqWqe ----

    /// SEND_WITH_IMM, owner, signaled, inline; msg_len 300; imm 0x01020304; PD 0xABC;
    /// 1 SGE from slot 0x10; UDP sport 0xC000; qkey 0x80000001; DQPN 1; VLAN 0xFFF;
    /// hop limit 64; tclass 0x68; flow label 0xABCDE; SL 5; port 1; VLAN enable; loopback;
    /// DMAC 02:00:00:00:00:01; sgid index 3; smac index 2; DGID ::ffff:192.168.0.1.
    const UD_WQE_BYTES: [u8; 64] = [
        0x82, 0x11, 0x00, 0x00, // opcode 2 | owner; cqe | inline
        0x2C, 0x01, 0x00, 0x00, // msg_len
        0x04, 0x03, 0x02, 0x01, // immtdata
        0xBC, 0x0A, 0x00, 0x01, // PD, SGE_NUM
        0x10, 0x00, 0x00, 0x00, // MSG_START_SGE_IDX, INLINE_TYPE 0
        0x00, 0x00, 0x00, 0xC0, // UDPSPN in the upper half
        0x01, 0x00, 0x00, 0x80, // QKEY
        0x01, 0x00, 0x00, 0x00, // DQPN
        0xFF, 0x0F, 0x40, 0x68, // VLAN, HOPLIMIT, TCLASS
        0xDE, 0xBC, 0x5A, 0xC1, // FLOW_LABEL, SL 5 in 311:308; PORTN 1 | UD_VLAN_EN | LBI
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // DMAC
        0x03, 0x02, // sgid index, smac index
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 0, 1, // DGID
    ];
    const UD_DMAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    const UD_DGID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 0, 1];

    #[test]
    fn ud_sq_wqe_parses_known_bytes() {
        let wqe = UdSqWqe::parse(&UD_WQE_BYTES).unwrap();
        assert_eq!(wqe.opcode(), SqOpcode::SendWithImm as u8);
        assert_eq!(wqe.direct_sl_low(), 0);
        assert!(wqe.owner());
        assert!(wqe.signaled());
        assert!(!wqe.solicited_event());
        assert!(wqe.inline());
        assert_eq!(wqe.direct_wqe_index(), 0);
        assert!(!wqe.direct_flag());
        assert_eq!(wqe.message_length(), 300);
        assert_eq!(wqe.immediate_data(), 0x0102_0304);
        assert_eq!(wqe.protection_domain(), 0xABC);
        assert_eq!(wqe.sge_count(), 1);
        assert_eq!(wqe.message_start_sge_index(), 0x10);
        assert!(!wqe.inline_type());
        assert_eq!(wqe.udp_source_port(), 0xC000);
        assert_eq!(wqe.qkey(), 0x8000_0001);
        assert_eq!(wqe.destination_qpn(), 1);
        assert_eq!(wqe.vlan(), 0xFFF);
        assert_eq!(wqe.hop_limit(), 64);
        assert_eq!(wqe.traffic_class(), 0x68);
        assert_eq!(wqe.flow_label(), 0xABCDE);
        assert_eq!(wqe.service_level(), 5);
        assert_eq!(wqe.port_number(), 1);
        assert!(wqe.vlan_enable());
        assert!(wqe.loopback());
        assert_eq!(wqe.dmac(), UD_DMAC);
        assert_eq!(wqe.sgid_index(), 3);
        assert_eq!(wqe.smac_index(), 2);
        assert_eq!(wqe.dgid(), UD_DGID);
    }

    #[test]
    fn ud_sq_wqe_emits_known_bytes() {
        let mut wqe = UdSqWqe::zeroed();
        wqe.set_opcode(SqOpcode::SendWithImm.into());
        wqe.set_owner(true);
        wqe.set_signaled(true);
        wqe.set_inline(true);
        wqe.set_message_length(300);
        wqe.set_immediate_data(0x0102_0304);
        wqe.set_protection_domain(0xABC);
        wqe.set_sge_count(1);
        wqe.set_message_start_sge_index(0x10);
        wqe.set_udp_source_port(0xC000);
        wqe.set_qkey(0x8000_0001);
        wqe.set_destination_qpn(1);
        wqe.set_vlan(0xFFF);
        wqe.set_hop_limit(64);
        wqe.set_traffic_class(0x68);
        wqe.set_flow_label(0xABCDE);
        wqe.set_service_level(5);
        wqe.set_port_number(1);
        wqe.set_vlan_enable(true);
        wqe.set_loopback(true);
        wqe.set_dmac(UD_DMAC);
        wqe.set_sgid_index(3);
        wqe.set_smac_index(2);
        wqe.set_dgid(UD_DGID);
        assert_eq!(wqe.0, UD_WQE_BYTES);
    }

    #[test]
    fn ud_sq_wqe_round_trips_every_field() {
        assert_round_trip::<UdSqWqe>(0x5EED_0003);
    }

    #[test]
    fn ud_sq_wqe_parse_rejects_truncated_input() {
        assert_eq!(
            UdSqWqe::parse(&UD_WQE_BYTES[..63]),
            Err(LayoutError::Truncated {
                layout: "UdSqWqe",
                expected: 64,
                actual: 63
            })
        );
    }

    #[test]
    fn ud_sq_wqe_packs_small_inline_payload_into_spare_bits() {
        // Payload bytes 11 22 33 44 55 66 77 88 (LE u64 0x8877_6655_4433_2211):
        // bits 15:0 = 0x2211 -> WQE bytes 6..8; bits 23:16 = 0x33 -> byte 15;
        // bits 47:24 = 0x665544 -> bytes 16..19; bits 63:48 = 0x8877 -> bytes 20..22.
        let mut wqe = UdSqWqe::zeroed();
        wqe.set_packed_inline_data(0x8877_6655_4433_2211);
        let mut expected = [0u8; 64];
        expected[6..8].copy_from_slice(&[0x11, 0x22]);
        expected[15] = 0x33;
        expected[16..19].copy_from_slice(&[0x44, 0x55, 0x66]);
        expected[20..22].copy_from_slice(&[0x77, 0x88]);
        assert_eq!(wqe.0, expected);
        assert_eq!(wqe.packed_inline_data(), 0x8877_6655_4433_2211);
    }

    // ---- opcodes and owner bit ----

    #[test]
    fn sq_opcodes_have_the_hns_values() {
        let table = [
            (0x00, SqOpcode::Send),
            (0x01, SqOpcode::SendWithInv),
            (0x02, SqOpcode::SendWithImm),
            (0x03, SqOpcode::RdmaWrite),
            (0x04, SqOpcode::RdmaWriteWithImm),
            (0x05, SqOpcode::RdmaRead),
            (0x06, SqOpcode::AtomCmpAndSwap),
            (0x07, SqOpcode::AtomFetchAndAdd),
            (0x08, SqOpcode::AtomMskCmpAndSwap),
            (0x09, SqOpcode::AtomMskFetchAndAdd),
            (0x0A, SqOpcode::FastRegPmr),
            (0x0B, SqOpcode::LocalInv),
            (0x0C, SqOpcode::BindMw),
            (0x1F, SqOpcode::Mask),
        ];
        assert_eq!(table.len(), SqOpcode::ALL.len());
        for (value, op) in table {
            assert_eq!(u8::from(op), value);
            assert_eq!(SqOpcode::try_from(value), Ok(op));
        }
    }

    #[test]
    fn unknown_sq_opcodes_are_rejected() {
        for value in 0..=u8::MAX {
            if !SqOpcode::ALL.iter().any(|op| *op as u8 == value) {
                assert_eq!(SqOpcode::try_from(value), Err(WqeError::UnknownSqOpcode(value)));
            }
        }
        assert_eq!(SqOpcode::try_from(0x0D), Err(WqeError::UnknownSqOpcode(0x0D)));
    }

    #[test]
    fn ud_accepts_only_send_and_send_with_imm() {
        let allowed: Vec<_> = SqOpcode::ALL.into_iter().filter(|op| op.allowed_on_ud()).collect();
        assert_eq!(allowed, [SqOpcode::Send, SqOpcode::SendWithImm]);
    }

    #[test]
    fn sq_owner_bit_is_one_on_even_laps_and_zero_on_odd_laps() {
        let depth = 8;
        for index in 0..8 {
            assert!(sq_owner_bit(index, depth), "lap 0, index {index}");
        }
        for index in 8..16 {
            assert!(!sq_owner_bit(index, depth), "lap 1, index {index}");
        }
        assert!(sq_owner_bit(16, depth), "lap 2");
        assert!(!sq_owner_bit(u32::MAX, depth), "wrapping counter, odd lap");
    }
}
