//! Management datagrams of the communication manager, as they travel on QP1: the 24-byte
//! MAD header, the nine CM messages of IBA volume 1 chapter 12 that a RoCE CM uses, and
//! the RDMA-CM IP header at the start of a REQ's (and SIDR_REQ's) private data.
//!
//! ```text
//! UD SEND ONLY to QP1, DETH Q_Key 0x80010000, source QP 1
//! └─ MAD, always 256 bytes
//!    ├─ header (24): base version 1, class 0x07 (CM), class version 2, method SEND,
//!    │               status, class specific, transaction ID, attribute ID, modifier
//!    └─ CM message (232): REQ 0x10, MRA 0x11, REJ 0x12, REP 0x13, RTU 0x14, DREQ 0x15,
//!                         DREP 0x16, SIDR_REQ 0x17, SIDR_REP 0x18
//!                         … fixed fields, then private data up to the 232nd byte
//! ```
//!
//! Every format is built the smoltcp way, like the RoCEv2 headers of `rnic_hw_model::wire`:
//! a `Packet<T: AsRef<[u8]>>` view whose `new_checked` proves the buffer long enough, typed
//! big-endian accessors (setters when `T: AsMut<[u8]>`), and a `Repr` with `parse` and
//! `emit`. [`CmMad`] puts a header and a message together and is what the connection
//! manager parses from, and emits into, a 256-byte receive or send buffer.
//!
//! Field positions are IBA's tables as Linux encodes them (`cm_msgs.h`,
//! `ibta_vol1_c12.h`) and as Wireshark decodes them; golden bytes come from a Linux 6.1
//! rdma_rxe capture and from the frames of the project's reference sheet (see `tests`).

pub mod cma;
pub mod drep;
pub mod dreq;
pub mod header;
mod message;
pub mod mra;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod sidr;

#[cfg(test)]
mod tests;

pub use cma::{CmaHeaderRepr, PortSpace, CMA_HEADER_LEN};
pub use drep::DrepRepr;
pub use dreq::DreqRepr;
pub use header::MadHeaderRepr;
pub use message::{attribute_name, CmMad, CmMessage};
pub use mra::MraRepr;
pub use rej::{RejReason, RejRepr};
pub use rep::RepRepr;
pub use req::{CmPath, ReqRepr, TransportType};
pub use rtu::RtuRepr;
pub use sidr::{SidrRepRepr, SidrReqRepr, SidrStatus};

/// Bytes of every MAD.
pub const MAD_LEN: usize = 256;
/// Bytes of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes of a CM message (the MAD data after the header).
pub const CM_MESSAGE_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// `BaseVersion` of every MAD.
pub const BASE_VERSION: u8 = 1;
/// `MgmtClass` of the communication manager.
pub const CM_CLASS: u8 = 0x07;
/// `ClassVersion` Linux's CM agent registers (a CM MAD of another version is dropped).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Method` SEND: every CM message uses it (there are no GetResp's in the CM class).
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (IBA 16.7, Linux `ib_cm.h`).
pub mod attribute {
    /// ClassPortInfo (not used by the CM).
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connection request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Connection reject.
    pub const REJ: u16 = 0x0012;
    /// Connection reply.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnection request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnection reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution response.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path (dropped on RoCE, as Linux does).
    pub const LAP: u16 = 0x0019;
    /// Alternate path response (dropped on RoCE).
    pub const APR: u16 = 0x001A;
}

/// Why a MAD could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// The buffer is shorter than the format.
    #[error("{layer}: truncated, need {needed} bytes, have {available}")]
    Truncated {
        /// Which format ("MAD header", "REQ", "RDMA-CM IP header", …).
        layer: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes there are.
        available: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("{layer}: invalid {field} {value:#x}")]
    Malformed {
        /// Which format.
        layer: &'static str,
        /// The field, named as in IBA.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A MAD of another class, class version or method than the CM's.
    #[error("not a CM MAD: {field} is {value:#x}")]
    NotCm {
        /// The header field that decided it.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A CM MAD whose attribute this CM does not handle (ClassPortInfo, LAP, APR, unknown).
    #[error("CM attribute {0:#06x} not handled")]
    UnknownAttribute(u16),
}

pub(crate) fn check_len(layer: &'static str, needed: usize, available: usize) -> Result<(), MadError> {
    if available < needed {
        Err(MadError::Truncated {
            layer,
            needed,
            available,
        })
    } else {
        Ok(())
    }
}

/// Declares a format's `Packet<T>` view of `$len` bytes: `new_unchecked`, `new_checked`,
/// `check_len`, `into_inner`.
macro_rules! view {
    ($layer:literal, $len:expr) => {
        #[doc = concat!("A read/write view of a ", $layer, ".")]
        #[derive(Debug, Clone)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length; accessors may panic on a short one.
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wraps a buffer after [`Packet::check_len`].
            ///
            /// # Errors
            /// [`MadError::Truncated`](crate::cm::mad::MadError::Truncated).
            pub fn new_checked(buffer: T) -> Result<Packet<T>, crate::cm::mad::MadError> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Ensures that no accessor panics.
            ///
            /// # Errors
            /// [`MadError::Truncated`](crate::cm::mad::MadError::Truncated).
            pub fn check_len(&self) -> Result<(), crate::cm::mad::MadError> {
                crate::cm::mad::check_len($layer, $len, self.buffer.as_ref().len())
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use view;

/// Big-endian helpers over exact-width slices (a `mod field` range).
pub(crate) mod be {
    pub fn u16(b: &[u8]) -> u16 {
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn u24(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    pub fn u32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub fn u64(b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_be_bytes(a)
    }
    pub fn set_u16(b: &mut [u8], v: u16) {
        b.copy_from_slice(&v.to_be_bytes());
    }
    /// The low 24 bits of `v`.
    pub fn set_u24(b: &mut [u8], v: u32) {
        b.copy_from_slice(&v.to_be_bytes()[1..]);
    }
    pub fn set_u32(b: &mut [u8], v: u32) {
        b.copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_u64(b: &mut [u8], v: u64) {
        b.copy_from_slice(&v.to_be_bytes());
    }
}

/// Reads bits `hi..=lo` of a byte.
pub(crate) fn bits(byte: u8, hi: u32, lo: u32) -> u8 {
    (byte >> lo) & ((1u16 << (hi - lo + 1)) - 1) as u8
}

/// Writes `value` into bits `hi..=lo` of `byte` (wider values are masked).
pub(crate) fn set_bits(byte: &mut u8, hi: u32, lo: u32, value: u8) {
    let mask = (((1u16 << (hi - lo + 1)) - 1) as u8) << lo;
    *byte = (*byte & !mask) | ((value << lo) & mask);
}
