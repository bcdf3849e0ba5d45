//! Completion queue entries (reference sheet §8): the CQE layout, completion status
//! codes, receive-side opcodes and the owner-bit (validity) rule.
//!
//! A CQE is 32 bytes (HIP08) or 64 bytes (HIP09, CQC `CQE_SIZE = 1`). [`Cqe`] always
//! holds 64 bytes; a 32-byte entry is the first half ([`Cqe::parse_32`], [`Cqe::emit_32`]).
//! Bytes 32..64 of a 64-byte CQE carry the CQE-inline payload (HIP09 `CQE_INLINE`).

use crate::bits::{Layout, LayoutError};
use crate::layout;

/// Size of a HIP08 CQE in bytes (`CQE_SIZE_32B`).
pub const CQE_SIZE_32: usize = 32;
/// Size of a HIP09 CQE in bytes (CQC `CQE_SIZE` = 1).
pub const CQE_SIZE_64: usize = 64;

const _: () = assert!(<Cqe as Layout>::SIZE == CQE_SIZE_64);

/// Why a CQE value could not be interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CqeError {
    /// The `STATUS` byte is not a §8 status code (hns drivers report it as a general error).
    #[error("unknown CQE status {0:#x}")]
    UnknownStatus(u8),
    /// The `OPCODE` of a receive-side CQE is not a §8 receive opcode.
    #[error("unknown receive CQE opcode {0:#x}")]
    UnknownRecvOpcode(u8),
}

layout! {
    /// Completion queue entry (`hns_roce_v2_cqe`, §8), 64-byte form. Fields up to bit 255
    /// exist in both sizes; bytes 32..64 are the inline payload ([`Cqe::inline_payload`]).
    pub struct Cqe[64] {
        /// Send side: the WQE's [`SqOpcode`](crate::wqe::SqOpcode); receive side: a [`RecvOpcode`].
        OPCODE / opcode / set_opcode: u8 = 4:0,
        /// The received data was placed in the RQ WQE buffer (RQ inline).
        RQ_INLINE / rq_inline / set_rq_inline: bool = 5:5,
        /// Side: 0 = send-queue completion, 1 = receive completion.
        S_R / receive_side / set_receive_side: bool = 6:6,
        /// Owner bit; see [`cqe_is_valid`] and [`owner_bit_for_producer`].
        OWNER / owner / set_owner: bool = 7:7,
        /// Completion status, a [`CqeStatus`] value.
        STATUS / status / set_status: u8 = 15:8,
        /// Index of the completed SQ WQE, RQ WQE, or SRQ WQE slot.
        WQE_IDX / wqe_index / set_wqe_index: u16 = 31:16,
        /// Immediate data (little-endian), or the invalidated rkey for SEND_WITH_INV.
        IMMTDATA / immediate_data / set_immediate_data: u32 = 63:32,
        /// XRC target: number of the SRQ that supplied the receive WQE.
        XRC_SRQN / xrc_srq_number / set_xrc_srq_number: u32 = 87:64,
        /// CQE-inline indication (HIP09): the payload is in bytes 32..64.
        CQE_INLINE / cqe_inline / set_cqe_inline: u8 = 89:88,
        /// Local QP number.
        LCL_QPN / local_qp_number / set_local_qp_number: u32 = 119:96,
        /// Vendor-specific error detail.
        SUB_STATUS / sub_status / set_sub_status: u8 = 127:120,
        /// Bytes received, read, or 8 for an atomic.
        BYTE_CNT / byte_count / set_byte_count: u32 = 159:128,
        /// UD: source MAC; bits 7:0 are the first octet (byte 20) — see [`Cqe::source_mac_bytes`].
        SMAC / source_mac / set_source_mac: u64 = 207:160,
        /// Packet type of the received packet (encoding unverified, sheet §16).
        PORT_TYPE / port_type / set_port_type: u8 = 209:208,
        /// VLAN id of the received packet.
        VID / vlan_id / set_vlan_id: u16 = 221:210,
        /// The received packet had a VLAN tag.
        VID_VLD / vlan_valid / set_vlan_valid: bool = 222:222,
        /// UD: source QP number.
        RMT_QPN / remote_qp_number / set_remote_qp_number: u32 = 247:224,
        /// Service level of the received packet.
        SL / service_level / set_service_level: u8 = 250:248,
        /// Port number.
        PORTN / port_number / set_port_number: u8 = 253:251,
        /// A GRH was present.
        GRH / grh_present / set_grh_present: bool = 254:254,
        /// Loopback packet.
        LPK / loopback / set_loopback: bool = 255:255,
    }
}

impl Cqe {
    /// The invalidated-rkey view of `IMMTDATA` (SEND_WITH_INV receive completions).
    pub fn invalidated_rkey(&self) -> u32 {
        self.immediate_data()
    }

    /// Sets the invalidated-rkey view of `IMMTDATA`.
    pub fn set_invalidated_rkey(&mut self, rkey: u32) {
        self.set_immediate_data(rkey);
    }

    /// The source MAC in wire order (`SMAC`, bytes 20..26).
    pub fn source_mac_bytes(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&self.source_mac().to_le_bytes()[..6]);
        mac
    }

    /// Sets the source MAC from wire-order octets.
    pub fn set_source_mac_bytes(&mut self, mac: [u8; 6]) {
        let mut word = [0u8; 8];
        word[..6].copy_from_slice(&mac);
        self.set_source_mac(u64::from_le_bytes(word));
    }

    /// The CQE-inline payload area, bytes 32..64 of a 64-byte CQE.
    pub fn inline_payload(&self) -> &[u8] {
        &self.0[CQE_SIZE_32..]
    }

    /// Copies `data` to the start of the inline payload area and zeroes the rest of it.
    ///
    /// # Panics
    /// If `data` is longer than 32 bytes.
    pub fn set_inline_payload(&mut self, data: &[u8]) {
        let area = &mut self.0[CQE_SIZE_32..];
        assert!(
            data.len() <= area.len(),
            "CQE inline payload of {} bytes exceeds 32",
            data.len()
        );
        area[..data.len()].copy_from_slice(data);
        area[data.len()..].fill(0);
    }

    /// Reads a 32-byte (HIP08) CQE; the inline payload area reads as zero.
    pub fn parse_32(bytes: &[u8]) -> Result<Self, LayoutError> {
        let Some(source) = bytes.get(..CQE_SIZE_32) else {
            return Err(LayoutError::Truncated {
                layout: "Cqe (32-byte)",
                expected: CQE_SIZE_32,
                actual: bytes.len(),
            });
        };
        let mut cqe = Self::zeroed();
        cqe.0[..CQE_SIZE_32].copy_from_slice(source);
        Ok(cqe)
    }

    /// Writes the first 32 bytes (a HIP08 CQE) to the start of `out`.
    pub fn emit_32(&self, out: &mut [u8]) -> Result<(), LayoutError> {
        let actual = out.len();
        let Some(target) = out.get_mut(..CQE_SIZE_32) else {
            return Err(LayoutError::Truncated {
                layout: "Cqe (32-byte)",
                expected: CQE_SIZE_32,
                actual,
            });
        };
        target.copy_from_slice(&self.0[..CQE_SIZE_32]);
        Ok(())
    }
}

/// Whether the CQE software finds at free-running consumer index `consumer_index` (ring
/// of `depth` entries, a power of two) is new: `OWNER ^ ((ci & depth) != 0)`. The buffer
/// starts zeroed, so nothing is valid on lap 0 until the device writes it.
pub fn cqe_is_valid(owner: bool, consumer_index: u32, depth: u32) -> bool {
    owner ^ (consumer_index & depth != 0)
}

/// The owner bit the device writes into the CQE at free-running producer index
/// `producer_index`: 1 on lap 0, 0 on lap 1, and so on.
pub fn owner_bit_for_producer(producer_index: u32, depth: u32) -> bool {
    producer_index & depth == 0
}

/// Completion status codes (§8 `STATUS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqeStatus {
    /// Success.
    Success = 0x00,
    /// Local length error.
    LocalLengthErr = 0x01,
    /// Local QP operation error.
    LocalQpOpErr = 0x02,
    /// Local protection error.
    LocalProtErr = 0x04,
    /// Work request flushed (the QP is in error).
    WrFlushErr = 0x05,
    /// Memory-window bind error (user name MEM_MANAGERENT_OP_ERR).
    MwBindErr = 0x06,
    /// Bad response.
    BadRespErr = 0x10,
    /// Local access error.
    LocalAccessErr = 0x11,
    /// Remote invalid request.
    RemoteInvalReqErr = 0x12,
    /// Remote access error.
    RemoteAccessErr = 0x13,
    /// Remote operation error.
    RemoteOpErr = 0x14,
    /// Transport retry counter exceeded.
    TransportRetryExcErr = 0x15,
    /// RNR retry counter exceeded.
    RnrRetryExcErr = 0x16,
    /// Remote aborted.
    RemoteAbortErr = 0x22,
    /// Vendor-specific general error; does not move the QP to error.
    GeneralErr = 0x23,
    /// XRC violation (user space maps it to a remote invalid read request).
    XrcViolation = 0x24,
}

impl CqeStatus {
    /// Every status, in value order.
    pub const ALL: [CqeStatus; 16] = [
        Self::Success,
        Self::LocalLengthErr,
        Self::LocalQpOpErr,
        Self::LocalProtErr,
        Self::WrFlushErr,
        Self::MwBindErr,
        Self::BadRespErr,
        Self::LocalAccessErr,
        Self::RemoteInvalReqErr,
        Self::RemoteAccessErr,
        Self::RemoteOpErr,
        Self::TransportRetryExcErr,
        Self::RnrRetryExcErr,
        Self::RemoteAbortErr,
        Self::GeneralErr,
        Self::XrcViolation,
    ];

    /// Whether a CQE with this status makes the driver move the QP to error and flush it
    /// (§12.2: every status except SUCCESS, WR_FLUSH_ERR and GENERAL_ERR).
    pub fn moves_qp_to_error(self) -> bool {
        !matches!(self, Self::Success | Self::WrFlushErr | Self::GeneralErr)
    }
}

impl From<CqeStatus> for u8 {
    fn from(value: CqeStatus) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for CqeStatus {
    type Error = CqeError;

    fn try_from(value: u8) -> Result<Self, CqeError> {
        Self::ALL
            .into_iter()
            .find(|s| *s as u8 == value)
            .ok_or(CqeError::UnknownStatus(value))
    }
}

/// Opcodes of receive-side CQEs (`S_R = 1`). Send-side CQEs carry the
/// [`SqOpcode`](crate::wqe::SqOpcode) of the completed WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecvOpcode {
    /// Incoming RDMA WRITE with immediate data (consumed a receive WQE).
    RdmaWriteWithImm = 0,
    /// Incoming SEND.
    Send = 1,
    /// Incoming SEND with immediate data.
    SendWithImm = 2,
    /// Incoming SEND with invalidate.
    SendWithInv = 3,
}

impl RecvOpcode {
    /// Every receive opcode, in value order.
    pub const ALL: [RecvOpcode; 4] = [Self::RdmaWriteWithImm, Self::Send, Self::SendWithImm, Self::SendWithInv];
}

impl From<RecvOpcode> for u8 {
    fn from(value: RecvOpcode) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for RecvOpcode {
    type Error = CqeError;

    fn try_from(value: u8) -> Result<Self, CqeError> {
        Self::ALL
            .into_iter()
            .find(|op| *op as u8 == value)
            .ok_or(CqeError::UnknownRecvOpcode(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::check_fields;

    /// Tiny xorshift64 generator so the round-trip test is reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Receive CQE: SEND, S_R, owner, status 0x13, WQE index 0xBEEF, imm 0x11223344,
    /// XRC SRQN 0x305, CQE_INLINE 2, local QPN 0x123, sub-status 7, 1500 bytes,
    /// SMAC 00:11:22:33:44:55, port type 2, VID 0x123 (valid), remote QPN 0x456, SL 3,
    /// port 1, GRH.
    const CQE_BYTES: [u8; 64] = [
        0xC1, 0x13, 0xEF, 0xBE, // opcode 1 | S_R | owner; status; WQE_IDX
        0x44, 0x33, 0x22, 0x11, // immtdata
        0x05, 0x03, 0x00, 0x02, // XRC_SRQN; CQE_INLINE 2
        0x23, 0x01, 0x00, 0x07, // LCL_QPN; SUB_STATUS
        0xDC, 0x05, 0x00, 0x00, // BYTE_CNT
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, // SMAC
        0x8E, 0x44, // PORT_TYPE 2 | VID[5:0]<<2; VID[11:6] | VID_VLD
        0x56, 0x04, 0x00, 0x4B, // RMT_QPN; SL 3 | PORTN 1<<3 | GRH
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // payload
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn cqe_parses_known_bytes() {
        let cqe = Cqe::parse(&CQE_BYTES).unwrap();
        assert_eq!(cqe.opcode(), RecvOpcode::Send as u8);
        assert!(!cqe.rq_inline());
        assert!(cqe.receive_side());
        assert!(cqe.owner());
        assert_eq!(cqe.status(), 0x13);
        assert_eq!(CqeStatus::try_from(cqe.status()), Ok(CqeStatus::RemoteAccessErr));
        assert_eq!(cqe.wqe_index(), 0xBEEF);
        assert_eq!(cqe.immediate_data(), 0x1122_3344);
        assert_eq!(cqe.xrc_srq_number(), 0x305);
        assert_eq!(cqe.cqe_inline(), 2);
        assert_eq!(cqe.local_qp_number(), 0x123);
        assert_eq!(cqe.sub_status(), 7);
        assert_eq!(cqe.byte_count(), 1500);
        assert_eq!(cqe.source_mac(), 0x5544_3322_1100);
        assert_eq!(cqe.source_mac_bytes(), [0x00, 0x11, 0x22, 0x33, 0x44, 0x55]);
        assert_eq!(cqe.port_type(), 2);
        assert_eq!(cqe.vlan_id(), 0x123);
        assert!(cqe.vlan_valid());
        assert_eq!(cqe.remote_qp_number(), 0x456);
        assert_eq!(cqe.service_level(), 3);
        assert_eq!(cqe.port_number(), 1);
        assert!(cqe.grh_present());
        assert!(!cqe.loopback());
    }

    #[test]
    fn cqe_emits_known_bytes() {
        let mut cqe = Cqe::zeroed();
        cqe.set_opcode(RecvOpcode::Send.into());
        cqe.set_receive_side(true);
        cqe.set_owner(true);
        cqe.set_status(CqeStatus::RemoteAccessErr.into());
        cqe.set_wqe_index(0xBEEF);
        cqe.set_immediate_data(0x1122_3344);
        cqe.set_xrc_srq_number(0x305);
        cqe.set_cqe_inline(2);
        cqe.set_local_qp_number(0x123);
        cqe.set_sub_status(7);
        cqe.set_byte_count(1500);
        cqe.set_source_mac_bytes([0x00, 0x11, 0x22, 0x33, 0x44, 0x55]);
        cqe.set_port_type(2);
        cqe.set_vlan_id(0x123);
        cqe.set_vlan_valid(true);
        cqe.set_remote_qp_number(0x456);
        cqe.set_service_level(3);
        cqe.set_port_number(1);
        cqe.set_grh_present(true);
        assert_eq!(cqe.0, CQE_BYTES);
    }

    #[test]
    fn cqe_round_trips_every_field() {
        check_fields(Cqe::NAME, Cqe::SIZE, Cqe::FIELDS).unwrap();
        for seed in [0x5EED_0011u64, 0x5EED_0012, 0x5EED_0013] {
            let mut rng = XorShift(seed);
            let mut cqe = Cqe::zeroed();
            let expected: Vec<u64> = Cqe::FIELDS
                .iter()
                .map(|field| {
                    let v = rng.next() & field.max_value();
                    field.set(&mut cqe.0, v);
                    v
                })
                .collect();
            let mut wire = [0u8; 64];
            cqe.emit(&mut wire).unwrap();
            let parsed = Cqe::parse(&wire).unwrap();
            for (field, v) in Cqe::FIELDS.iter().zip(expected) {
                assert_eq!(field.get(&parsed.0), v, "Cqe.{}", field.name);
            }
        }
    }

    #[test]
    fn cqe_parse_rejects_truncated_input() {
        assert_eq!(
            Cqe::parse(&CQE_BYTES[..63]),
            Err(LayoutError::Truncated {
                layout: "Cqe",
                expected: 64,
                actual: 63
            })
        );
    }

    #[test]
    fn a_32_byte_cqe_is_the_first_half_of_the_64_byte_layout() {
        let cqe = Cqe::parse_32(&CQE_BYTES[..32]).unwrap();
        assert_eq!(cqe, Cqe::parse(&CQE_BYTES).unwrap());
        let mut out = [0xAAu8; 33];
        cqe.emit_32(&mut out).unwrap();
        assert_eq!(&out[..32], &CQE_BYTES[..32]);
        assert_eq!(out[32], 0xAA, "emit_32 writes only 32 bytes");
        assert_eq!(
            Cqe::parse_32(&CQE_BYTES[..31]),
            Err(LayoutError::Truncated {
                layout: "Cqe (32-byte)",
                expected: 32,
                actual: 31
            })
        );
        assert!(cqe.emit_32(&mut [0u8; 31]).is_err());
    }

    #[test]
    fn cqe_inline_payload_is_bytes_32_to_64() {
        let mut cqe = Cqe::all_ones();
        cqe.set_inline_payload(b"payload");
        assert_eq!(&cqe.0[32..39], b"payload");
        assert_eq!(&cqe.0[39..], &[0u8; 25]);
        assert_eq!(&cqe.0[..32], &[0xFFu8; 32]);
        assert_eq!(&cqe.inline_payload()[..7], b"payload");
        assert_eq!(cqe.inline_payload().len(), 32);
    }

    #[test]
    fn status_codes_have_the_hns_values() {
        let table = [
            (0x00, CqeStatus::Success),
            (0x01, CqeStatus::LocalLengthErr),
            (0x02, CqeStatus::LocalQpOpErr),
            (0x04, CqeStatus::LocalProtErr),
            (0x05, CqeStatus::WrFlushErr),
            (0x06, CqeStatus::MwBindErr),
            (0x10, CqeStatus::BadRespErr),
            (0x11, CqeStatus::LocalAccessErr),
            (0x12, CqeStatus::RemoteInvalReqErr),
            (0x13, CqeStatus::RemoteAccessErr),
            (0x14, CqeStatus::RemoteOpErr),
            (0x15, CqeStatus::TransportRetryExcErr),
            (0x16, CqeStatus::RnrRetryExcErr),
            (0x22, CqeStatus::RemoteAbortErr),
            (0x23, CqeStatus::GeneralErr),
            (0x24, CqeStatus::XrcViolation),
        ];
        assert_eq!(table.len(), CqeStatus::ALL.len());
        for (value, status) in table {
            assert_eq!(u8::from(status), value);
            assert_eq!(CqeStatus::try_from(value), Ok(status));
        }
    }

    #[test]
    fn unknown_status_codes_are_rejected() {
        for value in 0..=u8::MAX {
            if !CqeStatus::ALL.iter().any(|s| *s as u8 == value) {
                assert_eq!(CqeStatus::try_from(value), Err(CqeError::UnknownStatus(value)));
            }
        }
        assert_eq!(CqeStatus::try_from(0x03), Err(CqeError::UnknownStatus(0x03)));
    }

    #[test]
    fn only_success_flush_and_general_errors_leave_the_qp_alone() {
        let keep: Vec<_> = CqeStatus::ALL.into_iter().filter(|s| !s.moves_qp_to_error()).collect();
        assert_eq!(keep, [CqeStatus::Success, CqeStatus::WrFlushErr, CqeStatus::GeneralErr]);
    }

    #[test]
    fn receive_opcodes_have_the_hns_values() {
        let table = [
            (0, RecvOpcode::RdmaWriteWithImm),
            (1, RecvOpcode::Send),
            (2, RecvOpcode::SendWithImm),
            (3, RecvOpcode::SendWithInv),
        ];
        assert_eq!(table.len(), RecvOpcode::ALL.len());
        for (value, op) in table {
            assert_eq!(u8::from(op), value);
            assert_eq!(RecvOpcode::try_from(value), Ok(op));
        }
        for value in 4..=u8::MAX {
            assert_eq!(RecvOpcode::try_from(value), Err(CqeError::UnknownRecvOpcode(value)));
        }
    }

    #[test]
    fn device_writes_owner_one_on_lap_zero_and_zero_on_lap_one() {
        let depth = 64;
        assert!(owner_bit_for_producer(0, depth));
        assert!(owner_bit_for_producer(63, depth));
        assert!(!owner_bit_for_producer(64, depth));
        assert!(!owner_bit_for_producer(127, depth));
        assert!(owner_bit_for_producer(128, depth));
    }

    #[test]
    fn cqe_is_valid_when_owner_matches_the_consumer_lap() {
        let depth = 4;
        // Lap 0: a zeroed buffer (owner 0) is not valid; the device's owner 1 is.
        assert!(!cqe_is_valid(false, 0, depth));
        assert!(cqe_is_valid(true, 3, depth));
        // Lap 1: the stale lap-0 entries (owner 1) are not valid; owner 0 is.
        assert!(!cqe_is_valid(true, 4, depth));
        assert!(cqe_is_valid(false, 7, depth));
        // The device's owner bit for index i is valid exactly for consumer index i,
        // and stale for the consumer one lap later.
        for index in 0..4 * depth {
            let owner = owner_bit_for_producer(index, depth);
            assert!(cqe_is_valid(owner, index, depth), "index {index}");
            assert!(!cqe_is_valid(owner, index + depth, depth), "index {index}");
        }
    }
}
