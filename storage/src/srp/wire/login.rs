//! Login: SRP_LOGIN_REQ in its two forms, SRP_LOGIN_RSP and SRP_LOGIN_REJ
//! (storage-and-cm.md C.1–C.3).
//!
//! Over InfiniBand's CM the 64-byte SRP_LOGIN_REQ is the REQ's private data. Over
//! RDMA-CM (RoCE) the REQ has only 56 bytes left after the 36-byte IP header, so Linux
//! sends the compact `srp_login_req_rdma`: the same fields, reordered, tag first and the
//! opcode at byte 11. The reply is SRP_LOGIN_RSP in the REP, or SRP_LOGIN_REJ in a REJ
//! with reason 28 (consumer defined).

use std::fmt;

use super::{be, check_len, opcode, WireError};

/// Bytes of the full SRP_LOGIN_REQ.
pub const LOGIN_REQ_LEN: usize = 64;
/// Bytes of the compact `srp_login_req_rdma`.
pub const COMPACT_LOGIN_REQ_LEN: usize = 56;
/// Bytes of SRP_LOGIN_RSP.
pub const LOGIN_RSP_LEN: usize = 52;
/// Bytes of SRP_LOGIN_REJ.
pub const LOGIN_REJ_LEN: usize = 32;

/// Login request flag: multi-channel action "multiple" (keep other channels of the
/// I_T nexus); 0 is "single" (terminate them).
pub const MULTICHANNEL_MULTI: u8 = 0x01;
/// Login request flag: immediate data requested (SRP-2).
pub const IMMEDIATE_REQUESTED: u8 = 0x80;
/// Login response flag: immediate data supported.
pub const IMMEDIATE_SUPPORTED: u8 = 0x80;

/// A 16-byte SRP port identifier: identifier extension, then GUID (rev. 16a order).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PortId(pub [u8; 16]);

impl PortId {
    /// From the two halves.
    pub fn new(id_ext: u64, guid: u64) -> Self {
        let mut bytes = [0u8; 16];
        be::set_u64(&mut bytes[..8], id_ext);
        be::set_u64(&mut bytes[8..], guid);
        Self(bytes)
    }
    /// Identifier extension (the first 8 bytes).
    pub fn id_ext(&self) -> u64 {
        be::u64(&self.0[..8])
    }
    /// GUID (the last 8 bytes).
    pub fn guid(&self) -> u64 {
        be::u64(&self.0[8..])
    }
}

impl fmt::Debug for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}:{:016x}", self.id_ext(), self.guid())
    }
}

fn port_id(bytes: &[u8]) -> PortId {
    let mut id = [0u8; 16];
    id.copy_from_slice(&bytes[..16]);
    PortId(id)
}

/// The content of a login request (either form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginReqRepr {
    /// Tag, echoed in the response.
    pub tag: u64,
    /// Largest initiator-to-target IU the initiator will send, bytes.
    pub req_it_iu_len: u32,
    /// Required buffer formats ([`super::buffer_format`] bits).
    pub req_buf_fmt: u16,
    /// Flags: multi-channel action (bits 1:0), [`IMMEDIATE_REQUESTED`].
    pub req_flags: u8,
    /// Where immediate data starts in an SRP_CMD, bytes from its start (SRP-2).
    pub imm_data_offset: u16,
    /// Initiator port identifier.
    pub initiator_port_id: PortId,
    /// Target port identifier.
    pub target_port_id: PortId,
}

mod full {
    use core::ops::Range;
    pub const TAG: Range<usize> = 8..16;
    pub const REQ_IT_IU_LEN: Range<usize> = 16..20;
    pub const REQ_BUF_FMT: Range<usize> = 24..26;
    pub const REQ_FLAGS: usize = 26;
    pub const IMM_DATA_OFFSET: Range<usize> = 28..30;
    pub const INITIATOR: Range<usize> = 32..48;
    pub const TARGET: Range<usize> = 48..64;
}

mod compact {
    use core::ops::Range;
    pub const TAG: Range<usize> = 0..8;
    pub const REQ_BUF_FMT: Range<usize> = 8..10;
    pub const REQ_FLAGS: usize = 10;
    pub const OPCODE: usize = 11;
    pub const REQ_IT_IU_LEN: Range<usize> = 12..16;
    pub const INITIATOR: Range<usize> = 16..32;
    pub const TARGET: Range<usize> = 32..48;
    pub const IMM_DATA_OFFSET: Range<usize> = 48..50;
}

impl LoginReqRepr {
    /// Whether the initiator asked to keep its other channels (multi-channel action 1).
    pub fn multichannel(&self) -> bool {
        self.req_flags & 0x03 == MULTICHANNEL_MULTI
    }
    /// Whether immediate data was requested.
    pub fn immediate_requested(&self) -> bool {
        self.req_flags & IMMEDIATE_REQUESTED != 0
    }

    /// Reads the full 64-byte SRP_LOGIN_REQ.
    ///
    /// # Errors
    /// Truncated input; an opcode other than 0; a multi-channel action above 1.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP_LOGIN_REQ", LOGIN_REQ_LEN, bytes.len())?;
        if bytes[0] != opcode::LOGIN_REQ {
            return Err(WireError::Malformed {
                format: "SRP_LOGIN_REQ",
                field: "opcode",
                value: u64::from(bytes[0]),
            });
        }
        let repr = Self {
            tag: be::u64(&bytes[full::TAG]),
            req_it_iu_len: be::u32(&bytes[full::REQ_IT_IU_LEN]),
            req_buf_fmt: be::u16(&bytes[full::REQ_BUF_FMT]),
            req_flags: bytes[full::REQ_FLAGS],
            imm_data_offset: be::u16(&bytes[full::IMM_DATA_OFFSET]),
            initiator_port_id: port_id(&bytes[full::INITIATOR]),
            target_port_id: port_id(&bytes[full::TARGET]),
        };
        repr.check("SRP_LOGIN_REQ")
    }

    /// Reads the 56-byte compact form (`srp_login_req_rdma`).
    ///
    /// # Errors
    /// Truncated input; an opcode (byte 11) other than 0; a multi-channel action above 1.
    pub fn parse_compact(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("srp_login_req_rdma", COMPACT_LOGIN_REQ_LEN, bytes.len())?;
        if bytes[compact::OPCODE] != opcode::LOGIN_REQ {
            return Err(WireError::Malformed {
                format: "srp_login_req_rdma",
                field: "opcode",
                value: u64::from(bytes[compact::OPCODE]),
            });
        }
        let repr = Self {
            tag: be::u64(&bytes[compact::TAG]),
            req_it_iu_len: be::u32(&bytes[compact::REQ_IT_IU_LEN]),
            req_buf_fmt: be::u16(&bytes[compact::REQ_BUF_FMT]),
            req_flags: bytes[compact::REQ_FLAGS],
            imm_data_offset: be::u16(&bytes[compact::IMM_DATA_OFFSET]),
            initiator_port_id: port_id(&bytes[compact::INITIATOR]),
            target_port_id: port_id(&bytes[compact::TARGET]),
        };
        repr.check("srp_login_req_rdma")
    }

    fn check(self, format: &'static str) -> Result<Self, WireError> {
        if self.req_flags & 0x03 > MULTICHANNEL_MULTI {
            return Err(WireError::Malformed {
                format,
                field: "req_flags",
                value: u64::from(self.req_flags),
            });
        }
        Ok(self)
    }

    /// Writes the full 64-byte form into `out` (at least 64 bytes; the rest untouched).
    ///
    /// # Panics
    /// If `out` is shorter than 64 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        out[..LOGIN_REQ_LEN].fill(0);
        out[0] = opcode::LOGIN_REQ;
        be::set_u64(&mut out[full::TAG], self.tag);
        be::set_u32(&mut out[full::REQ_IT_IU_LEN], self.req_it_iu_len);
        be::set_u16(&mut out[full::REQ_BUF_FMT], self.req_buf_fmt);
        out[full::REQ_FLAGS] = self.req_flags;
        be::set_u16(&mut out[full::IMM_DATA_OFFSET], self.imm_data_offset);
        out[full::INITIATOR].copy_from_slice(&self.initiator_port_id.0);
        out[full::TARGET].copy_from_slice(&self.target_port_id.0);
    }

    /// Writes the 56-byte compact form into `out`.
    ///
    /// # Panics
    /// If `out` is shorter than 56 bytes.
    pub fn emit_compact(&self, out: &mut [u8]) {
        out[..COMPACT_LOGIN_REQ_LEN].fill(0);
        be::set_u64(&mut out[compact::TAG], self.tag);
        be::set_u16(&mut out[compact::REQ_BUF_FMT], self.req_buf_fmt);
        out[compact::REQ_FLAGS] = self.req_flags;
        out[compact::OPCODE] = opcode::LOGIN_REQ;
        be::set_u32(&mut out[compact::REQ_IT_IU_LEN], self.req_it_iu_len);
        out[compact::INITIATOR].copy_from_slice(&self.initiator_port_id.0);
        out[compact::TARGET].copy_from_slice(&self.target_port_id.0);
        be::set_u16(&mut out[compact::IMM_DATA_OFFSET], self.imm_data_offset);
    }

    /// The compact form as bytes.
    pub fn to_compact_bytes(&self) -> [u8; COMPACT_LOGIN_REQ_LEN] {
        let mut out = [0u8; COMPACT_LOGIN_REQ_LEN];
        self.emit_compact(&mut out);
        out
    }

    /// The full form as bytes.
    pub fn to_bytes(&self) -> [u8; LOGIN_REQ_LEN] {
        let mut out = [0u8; LOGIN_REQ_LEN];
        self.emit(&mut out);
        out
    }
}

/// Parses a full SRP_LOGIN_REQ (a fuzz entry point).
///
/// # Errors
/// See [`LoginReqRepr::parse`].
pub fn parse_login_request(bytes: &[u8]) -> Result<LoginReqRepr, WireError> {
    LoginReqRepr::parse(bytes)
}

/// Parses a compact `srp_login_req_rdma` (a fuzz entry point).
///
/// # Errors
/// See [`LoginReqRepr::parse_compact`].
pub fn parse_compact_login_request(bytes: &[u8]) -> Result<LoginReqRepr, WireError> {
    LoginReqRepr::parse_compact(bytes)
}

mod rsp {
    use core::ops::Range;
    pub const REQ_LIM_DELTA: Range<usize> = 4..8;
    pub const TAG: Range<usize> = 8..16;
    pub const MAX_IT_IU_LEN: Range<usize> = 16..20;
    pub const MAX_TI_IU_LEN: Range<usize> = 20..24;
    pub const BUF_FMT: Range<usize> = 24..26;
    pub const RSP_FLAGS: usize = 26;
}

/// The content of an SRP_LOGIN_RSP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginRspRepr {
    /// Initial request limit (credits).
    pub req_lim_delta: u32,
    /// The login request's tag.
    pub tag: u64,
    /// Largest initiator-to-target IU the target accepts, bytes.
    pub max_it_iu_len: u32,
    /// Largest target-to-initiator IU the target sends, bytes.
    pub max_ti_iu_len: u32,
    /// Supported buffer formats.
    pub buf_fmt: u16,
    /// Flags: existing-channel outcome (bits 1:0), [`IMMEDIATE_SUPPORTED`].
    pub rsp_flags: u8,
}

impl LoginRspRepr {
    /// Reads an SRP_LOGIN_RSP.
    ///
    /// # Errors
    /// Truncated input or another opcode.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP_LOGIN_RSP", LOGIN_RSP_LEN, bytes.len())?;
        if bytes[0] != opcode::LOGIN_RSP {
            return Err(WireError::Malformed {
                format: "SRP_LOGIN_RSP",
                field: "opcode",
                value: u64::from(bytes[0]),
            });
        }
        Ok(Self {
            req_lim_delta: be::u32(&bytes[rsp::REQ_LIM_DELTA]),
            tag: be::u64(&bytes[rsp::TAG]),
            max_it_iu_len: be::u32(&bytes[rsp::MAX_IT_IU_LEN]),
            max_ti_iu_len: be::u32(&bytes[rsp::MAX_TI_IU_LEN]),
            buf_fmt: be::u16(&bytes[rsp::BUF_FMT]),
            rsp_flags: bytes[rsp::RSP_FLAGS],
        })
    }

    /// Writes the 52 bytes.
    ///
    /// # Panics
    /// If `out` is shorter than 52 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        out[..LOGIN_RSP_LEN].fill(0);
        out[0] = opcode::LOGIN_RSP;
        be::set_u32(&mut out[rsp::REQ_LIM_DELTA], self.req_lim_delta);
        be::set_u64(&mut out[rsp::TAG], self.tag);
        be::set_u32(&mut out[rsp::MAX_IT_IU_LEN], self.max_it_iu_len);
        be::set_u32(&mut out[rsp::MAX_TI_IU_LEN], self.max_ti_iu_len);
        be::set_u16(&mut out[rsp::BUF_FMT], self.buf_fmt);
        out[rsp::RSP_FLAGS] = self.rsp_flags;
    }

    /// As bytes.
    pub fn to_bytes(&self) -> [u8; LOGIN_RSP_LEN] {
        let mut out = [0u8; LOGIN_RSP_LEN];
        self.emit(&mut out);
        out
    }

    /// Whether immediate data is supported.
    pub fn immediate_supported(&self) -> bool {
        self.rsp_flags & IMMEDIATE_SUPPORTED != 0
    }
}

/// Why a login was refused (SRP_LOGIN_REJ reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoginRejReason {
    /// Unable to establish the RDMA channel, no reason given.
    UnableToEstablish,
    /// Insufficient RDMA channel resources.
    InsufficientResources,
    /// Requested maximum initiator-to-target IU length too large.
    ItIuLengthTooLarge,
    /// Unable to associate the RDMA channel with the I_T nexus (wrong target port ID).
    UnableToAssociate,
    /// One or more requested data buffer descriptor formats not supported.
    UnsupportedDescriptorFormat,
    /// Multiple RDMA channels not supported with this I_T nexus.
    MultiChannelUnsupported,
    /// RDMA channel limit reached for this initiator.
    ChannelLimitReached,
    /// A value this crate does not know.
    Other(u32),
}

impl LoginRejReason {
    /// The 32-bit reason code.
    pub fn code(self) -> u32 {
        match self {
            Self::UnableToEstablish => 0x0001_0000,
            Self::InsufficientResources => 0x0001_0001,
            Self::ItIuLengthTooLarge => 0x0001_0002,
            Self::UnableToAssociate => 0x0001_0003,
            Self::UnsupportedDescriptorFormat => 0x0001_0004,
            Self::MultiChannelUnsupported => 0x0001_0005,
            Self::ChannelLimitReached => 0x0001_0006,
            Self::Other(code) => code,
        }
    }

    /// From the 32-bit reason code.
    pub fn from_code(code: u32) -> Self {
        match code {
            0x0001_0000 => Self::UnableToEstablish,
            0x0001_0001 => Self::InsufficientResources,
            0x0001_0002 => Self::ItIuLengthTooLarge,
            0x0001_0003 => Self::UnableToAssociate,
            0x0001_0004 => Self::UnsupportedDescriptorFormat,
            0x0001_0005 => Self::MultiChannelUnsupported,
            0x0001_0006 => Self::ChannelLimitReached,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for LoginRejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::UnableToEstablish => "unable to establish the RDMA channel",
            Self::InsufficientResources => "insufficient RDMA channel resources",
            Self::ItIuLengthTooLarge => "requested IT IU length too large",
            Self::UnableToAssociate => "unable to associate the channel with the I_T nexus",
            Self::UnsupportedDescriptorFormat => "descriptor format not supported",
            Self::MultiChannelUnsupported => "multiple channels not supported",
            Self::ChannelLimitReached => "channel limit reached",
            Self::Other(_) => "unknown reason",
        };
        write!(f, "{text} ({:#010x})", self.code())
    }
}

/// The content of an SRP_LOGIN_REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRejRepr {
    /// Why.
    pub reason: LoginRejReason,
    /// The login request's tag.
    pub tag: u64,
    /// Buffer formats the target supports.
    pub buf_fmt: u16,
}

impl LoginRejRepr {
    /// Reads an SRP_LOGIN_REJ.
    ///
    /// # Errors
    /// Truncated input or another opcode.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP_LOGIN_REJ", LOGIN_REJ_LEN, bytes.len())?;
        if bytes[0] != opcode::LOGIN_REJ {
            return Err(WireError::Malformed {
                format: "SRP_LOGIN_REJ",
                field: "opcode",
                value: u64::from(bytes[0]),
            });
        }
        Ok(Self {
            reason: LoginRejReason::from_code(be::u32(&bytes[4..8])),
            tag: be::u64(&bytes[8..16]),
            buf_fmt: be::u16(&bytes[24..26]),
        })
    }

    /// Writes the 32 bytes.
    ///
    /// # Panics
    /// If `out` is shorter than 32 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        out[..LOGIN_REJ_LEN].fill(0);
        out[0] = opcode::LOGIN_REJ;
        be::set_u32(&mut out[4..8], self.reason.code());
        be::set_u64(&mut out[8..16], self.tag);
        be::set_u16(&mut out[24..26], self.buf_fmt);
    }

    /// As bytes.
    pub fn to_bytes(&self) -> [u8; LOGIN_REJ_LEN] {
        let mut out = [0u8; LOGIN_REJ_LEN];
        self.emit(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{buffer_format, XorShift};
    use super::*;

    /// What Linux `ib_srp` sends over RDMA-CM (storage-and-cm.md C.1): tag 0, direct and
    /// indirect formats, immediate data requested, 8260-byte IUs (68 + 8 KiB), initiator
    /// port `initiator_ext ‖ GID interface ID`, target `id_ext ‖ ioc_guid`, offset 68.
    const COMPACT: [u8; 56] = [
        0, 0, 0, 0, 0, 0, 0, 0, // tag
        0x00, 0x06, // direct + indirect
        0x80, // immediate data requested, single channel
        0x00, // opcode
        0x00, 0x00, 0x20, 0x44, // 8260
        0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x52, 0x4e, 0xff, 0xfe, 0x49, 0x43, 0x02, // initiator
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, // target
        0x00, 0x44, // offset 68
        0, 0, 0, 0, 0, 0,
    ];

    fn linux_login() -> LoginReqRepr {
        LoginReqRepr {
            tag: 0,
            req_it_iu_len: 8260,
            req_buf_fmt: buffer_format::DIRECT | buffer_format::INDIRECT,
            req_flags: IMMEDIATE_REQUESTED,
            imm_data_offset: 68,
            initiator_port_id: PortId::new(0, 0x0252_4eff_fe49_4302),
            target_port_id: PortId::new(0x0011_2233_4455_6677, 0x0011_2233_4455_6677),
        }
    }

    #[test]
    fn parses_known_compact_login() {
        let repr = LoginReqRepr::parse_compact(&COMPACT).unwrap();
        assert_eq!(repr, linux_login());
        assert!(repr.immediate_requested());
        assert!(!repr.multichannel());
        assert_eq!(repr.target_port_id.to_string(), "0011223344556677:0011223344556677");
    }

    #[test]
    fn emits_known_compact_login() {
        assert_eq!(linux_login().to_compact_bytes(), COMPACT);
    }

    #[test]
    fn full_and_compact_forms_carry_the_same_fields() {
        let repr = linux_login();
        let full = repr.to_bytes();
        assert_eq!(full[0], 0);
        assert_eq!(&full[16..20], &[0, 0, 0x20, 0x44]);
        assert_eq!(&full[24..27], &[0, 6, 0x80]);
        assert_eq!(&full[28..30], &[0, 68]);
        assert_eq!(&full[48..64], &COMPACT[32..48]);
        assert_eq!(LoginReqRepr::parse(&full).unwrap(), repr);
    }

    #[test]
    fn round_trips_random_logins() {
        let mut rng = XorShift::new(5);
        for _ in 0..200 {
            let repr = LoginReqRepr {
                tag: rng.next_u64(),
                req_it_iu_len: rng.u32(),
                req_buf_fmt: rng.u16(),
                req_flags: rng.u8() & 0x81,
                imm_data_offset: rng.u16(),
                initiator_port_id: PortId(rng.bytes()),
                target_port_id: PortId(rng.bytes()),
            };
            assert_eq!(LoginReqRepr::parse(&repr.to_bytes()).unwrap(), repr);
            assert_eq!(LoginReqRepr::parse_compact(&repr.to_compact_bytes()).unwrap(), repr);
            let rsp = LoginRspRepr {
                req_lim_delta: rng.u32(),
                tag: rng.next_u64(),
                max_it_iu_len: rng.u32(),
                max_ti_iu_len: rng.u32(),
                buf_fmt: rng.u16(),
                rsp_flags: rng.u8(),
            };
            assert_eq!(LoginRspRepr::parse(&rsp.to_bytes()).unwrap(), rsp);
            let rej = LoginRejRepr {
                reason: LoginRejReason::from_code(rng.u32()),
                tag: rng.next_u64(),
                buf_fmt: rng.u16(),
            };
            assert_eq!(LoginRejRepr::parse(&rej.to_bytes()).unwrap(), rej);
        }
    }

    #[test]
    fn emits_and_parses_known_login_response_and_reject() {
        let rsp = LoginRspRepr {
            req_lim_delta: 128,
            tag: 0,
            max_it_iu_len: 8260,
            max_ti_iu_len: 256,
            buf_fmt: 6,
            rsp_flags: IMMEDIATE_SUPPORTED,
        };
        let mut known = [0u8; 52];
        known[0] = 0xC0;
        known[7] = 128;
        known[18] = 0x20;
        known[19] = 0x44;
        known[22] = 1;
        known[25] = 6;
        known[26] = 0x80;
        assert_eq!(rsp.to_bytes(), known);
        assert_eq!(LoginRspRepr::parse(&known).unwrap(), rsp);
        let rej = LoginRejRepr {
            reason: LoginRejReason::UnableToAssociate,
            tag: 7,
            buf_fmt: 6,
        };
        let mut known = [0u8; 32];
        known[0] = 0xC2;
        known[5] = 1;
        known[7] = 3;
        known[15] = 7;
        known[25] = 6;
        assert_eq!(rej.to_bytes(), known);
        assert_eq!(LoginRejRepr::parse(&known).unwrap(), rej);
    }

    #[test]
    fn refuses_truncated_and_malformed_logins() {
        for n in 0..56 {
            assert!(matches!(
                LoginReqRepr::parse_compact(&COMPACT[..n]),
                Err(WireError::Truncated { .. })
            ));
        }
        let full = linux_login().to_bytes();
        assert!(matches!(
            LoginReqRepr::parse(&full[..63]),
            Err(WireError::Truncated { .. })
        ));
        assert!(LoginRspRepr::parse(&[0xC0; 51]).is_err());
        assert!(LoginRejRepr::parse(&[0xC2; 31]).is_err());
        let mut bad = COMPACT;
        bad[11] = 0x02;
        assert!(matches!(
            LoginReqRepr::parse_compact(&bad),
            Err(WireError::Malformed { field: "opcode", .. })
        ));
        let mut bad = COMPACT;
        bad[10] = 0x03;
        assert!(matches!(
            LoginReqRepr::parse_compact(&bad),
            Err(WireError::Malformed { field: "req_flags", .. })
        ));
        assert!(LoginRspRepr::parse(&[0u8; 52]).is_err());
    }
}
