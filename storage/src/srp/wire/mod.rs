//! SRP wire formats (SRP-2 as Linux `include/scsi/srp.h` lays it out), in the smoltcp
//! manner: a view over bytes checked once ([`Iu::new_checked`]), typed big-endian
//! accessors, and parsed representations (`…Repr`) with `parse` and `emit`.
//!
//! | Module | Format | Size |
//! |---|---|---|
//! | [`login`] | SRP_LOGIN_REQ (full, and the compact `srp_login_req_rdma` of RDMA-CM), SRP_LOGIN_RSP, SRP_LOGIN_REJ | 64 / 56, 52, 32 B |
//! | [`descriptor`] | memory descriptors: direct, indirect table, immediate data length | 16, 20 + 16·n, 4 B |
//! | [`iu`] | SRP_CMD, SRP_RSP, SRP_TSK_MGMT, SRP_I_LOGOUT, SRP_T_LOGOUT, SRP_CRED_REQ/RSP, SRP_AER_REQ/RSP | 48+, 36+, 48, 16, 16, 16, 36+/16 B |
//!
//! Everything is big-endian. Byte 0 of every IU is its opcode and bytes 8..16 its tag.
//! Parsers never panic on any input: [`parse_iu`], [`parse_login_request`] and
//! [`parse_compact_login_request`] are the entry points fuzz targets call with arbitrary
//! bytes.

pub mod descriptor;
pub mod iu;
pub mod login;

pub use descriptor::{DataDescriptor, DescriptorFormat, DirectDescriptor};
pub use iu::{
    parse_iu, AerReqRepr, CmdRepr, CredReqRepr, IuRepr, ResidualCount, RspRepr, TLogoutRepr, TaskManagementFunction,
    TskMgmtRepr,
};
pub use login::{
    parse_compact_login_request, parse_login_request, LoginRejReason, LoginRejRepr, LoginReqRepr, LoginRspRepr, PortId,
};

/// IU opcodes (byte 0).
pub mod opcode {
    /// SRP_LOGIN_REQ.
    pub const LOGIN_REQ: u8 = 0x00;
    /// SRP_TSK_MGMT.
    pub const TSK_MGMT: u8 = 0x01;
    /// SRP_CMD.
    pub const CMD: u8 = 0x02;
    /// SRP_I_LOGOUT.
    pub const I_LOGOUT: u8 = 0x03;
    /// SRP_T_LOGOUT.
    pub const T_LOGOUT: u8 = 0x80;
    /// SRP_CRED_REQ.
    pub const CRED_REQ: u8 = 0x81;
    /// SRP_AER_REQ.
    pub const AER_REQ: u8 = 0x82;
    /// SRP_CRED_RSP.
    pub const CRED_RSP: u8 = 0x41;
    /// SRP_AER_RSP.
    pub const AER_RSP: u8 = 0x42;
    /// SRP_LOGIN_RSP.
    pub const LOGIN_RSP: u8 = 0xC0;
    /// SRP_RSP.
    pub const RSP: u8 = 0xC1;
    /// SRP_LOGIN_REJ.
    pub const LOGIN_REJ: u8 = 0xC2;

    /// The IU's name, for logs and dissectors.
    pub fn name(opcode: u8) -> &'static str {
        match opcode {
            LOGIN_REQ => "SRP_LOGIN_REQ",
            TSK_MGMT => "SRP_TSK_MGMT",
            CMD => "SRP_CMD",
            I_LOGOUT => "SRP_I_LOGOUT",
            T_LOGOUT => "SRP_T_LOGOUT",
            CRED_REQ => "SRP_CRED_REQ",
            AER_REQ => "SRP_AER_REQ",
            CRED_RSP => "SRP_CRED_RSP",
            AER_RSP => "SRP_AER_RSP",
            LOGIN_RSP => "SRP_LOGIN_RSP",
            RSP => "SRP_RSP",
            LOGIN_REJ => "SRP_LOGIN_REJ",
            _ => "unknown",
        }
    }
}

/// Buffer-format bits of a login (required / supported data buffer descriptor formats).
pub mod buffer_format {
    /// Direct data buffer descriptors.
    pub const DIRECT: u16 = 1 << 1;
    /// Indirect data buffer descriptors.
    pub const INDIRECT: u16 = 1 << 2;
}

/// Why bytes do not parse as an SRP format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the format needs.
    #[error("{format}: truncated, need {needed} bytes, have {available}")]
    Truncated {
        /// Format name ("SRP_CMD", ...).
        format: &'static str,
        /// Bytes the format needs.
        needed: usize,
        /// Bytes given.
        available: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("{format}: invalid {field} {value:#x}")]
    Malformed {
        /// Format name.
        format: &'static str,
        /// Field name, spelled as in `srp.h`.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}

/// Checks that `available >= needed` for `format`.
pub(crate) fn check_len(format: &'static str, needed: usize, available: usize) -> Result<(), WireError> {
    if available < needed {
        Err(WireError::Truncated {
            format,
            needed,
            available,
        })
    } else {
        Ok(())
    }
}

/// Big-endian field helpers; each takes a slice at least the field's width.
pub(crate) mod be {
    #[inline]
    pub fn u16(bytes: &[u8]) -> u16 {
        u16::from_be_bytes([bytes[0], bytes[1]])
    }
    #[inline]
    pub fn u32(bytes: &[u8]) -> u32 {
        u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
    #[inline]
    pub fn u64(bytes: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[..8]);
        u64::from_be_bytes(b)
    }
    #[inline]
    pub fn set_u16(bytes: &mut [u8], value: u16) {
        bytes[..2].copy_from_slice(&value.to_be_bytes());
    }
    #[inline]
    pub fn set_u32(bytes: &mut [u8], value: u32) {
        bytes[..4].copy_from_slice(&value.to_be_bytes());
    }
    #[inline]
    pub fn set_u64(bytes: &mut [u8], value: u64) {
        bytes[..8].copy_from_slice(&value.to_be_bytes());
    }
}

/// The fields every IU shares: opcode (byte 0) and tag (bytes 8..16).
mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const TAG: Range<usize> = 8..16;
}

/// The smallest IU (I_LOGOUT, T_LOGOUT, CRED_REQ/RSP, AER_RSP), bytes.
pub const MIN_IU_LEN: usize = 16;

/// A view of any information unit: opcode and tag, checked to be present once.
#[derive(Debug, Clone)]
pub struct Iu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Iu<T> {
    /// Wraps a buffer without checking it; accessors may panic on a short one.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after checking it holds at least the 16 bytes every IU has.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len("SRP IU", MIN_IU_LEN, buffer.as_ref().len())?;
        Ok(Self { buffer })
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }

    /// The tag (echoed in responses).
    pub fn tag(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::TAG])
    }

    /// All the bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// A small deterministic generator for the round-trip tests (xorshift64*).
#[cfg(test)]
pub(crate) struct XorShift(u64);

#[cfg(test)]
impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    pub fn u16(&mut self) -> u16 {
        self.next_u64() as u16
    }
    pub fn u8(&mut self) -> u8 {
        self.next_u64() as u8
    }
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.u8();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_view_reads_opcode_and_tag() {
        let mut bytes = [0u8; 16];
        bytes[0] = opcode::I_LOGOUT;
        bytes[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        let iu = Iu::new_checked(&bytes[..]).unwrap();
        assert_eq!(iu.opcode(), 3);
        assert_eq!(iu.tag(), 0x0102_0304_0506_0708);
        assert_eq!(opcode::name(iu.opcode()), "SRP_I_LOGOUT");
        assert!(matches!(
            Iu::new_checked(&bytes[..15]),
            Err(WireError::Truncated {
                needed: 16,
                available: 15,
                ..
            })
        ));
    }
}
