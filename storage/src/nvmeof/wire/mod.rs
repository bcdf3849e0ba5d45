//! NVMe and NVMe-oF/RDMA wire formats, in the smoltcp manner: a view over bytes checked
//! once (`new_checked`), typed little-endian accessors, and a parsed representation
//! (`…Repr`) with `parse` and `emit`.
//!
//! | Module | Format | Size |
//! |---|---|---|
//! | [`cm`] | RDMA CM private data of an NVMe queue: REQ, REP, REJ | 32, 32, 4 B |
//! | [`sqe`] | submission queue entry (the first 64 bytes of a command capsule) | 64 B |
//! | [`cqe`] | completion queue entry (the response capsule) | 16 B |
//! | [`sgl`] | SGL descriptor (SGL1 of a command) | 16 B |
//! | [`command`] | typed commands over an [`sqe::SqeRepr`]: Fabrics, admin, NVM I/O | — |
//! | [`connect_data`] | the data of a Fabrics Connect | 1024 B |
//! | [`properties`] | the controller properties CAP, VS, CC, CSTS | 4/8 B |
//! | [`identify`] | Identify Controller, Identify Namespace, active NSID list, NS descriptors | 4096 B |
//! | [`log`] | error, SMART / health, firmware slot and discovery log pages | 64, 512, 512, 1024·(1+n) B |
//! | [`status`] | the status field of a completion | 15 bits |
//!
//! Everything here is little-endian (NVMe), unlike the RoCE headers underneath.
//! Field offsets follow `storage-and-cm.md` part B (which printed them from SPDK's packed
//! structures and checked them with tshark).
//!
//! Parsers never panic on any input: [`parse_command_capsule`] and [`parse_sgl`] are the
//! entry points fuzz targets call with arbitrary bytes.

pub mod cm;
pub mod command;
pub mod connect_data;
pub mod cqe;
pub mod identify;
pub mod log;
pub mod properties;
pub mod sgl;
pub mod sqe;
pub mod status;

/// Why bytes do not parse as a format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the format needs.
    #[error("{format}: truncated, need {needed} bytes, have {available}")]
    Truncated {
        /// Format name ("SQE", "CQE", "SGL descriptor", ...).
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
        /// Field name, spelled as in the specification.
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

/// Little-endian field helpers. Each takes a slice of exactly the field's width (a
/// `mod field` range), so a wrong width is a programming error caught by the tests.
pub(crate) mod le {
    #[inline]
    pub fn u16(bytes: &[u8]) -> u16 {
        u16::from_le_bytes([bytes[0], bytes[1]])
    }
    #[inline]
    pub fn u24(bytes: &[u8]) -> u32 {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], 0])
    }
    #[inline]
    pub fn u32(bytes: &[u8]) -> u32 {
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
    #[inline]
    pub fn u64(bytes: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[..8]);
        u64::from_le_bytes(b)
    }
    #[inline]
    pub fn set_u16(bytes: &mut [u8], value: u16) {
        bytes[..2].copy_from_slice(&value.to_le_bytes());
    }
    #[inline]
    pub fn set_u24(bytes: &mut [u8], value: u32) {
        bytes[..3].copy_from_slice(&value.to_le_bytes()[..3]);
    }
    #[inline]
    pub fn set_u32(bytes: &mut [u8], value: u32) {
        bytes[..4].copy_from_slice(&value.to_le_bytes());
    }
    #[inline]
    pub fn set_u64(bytes: &mut [u8], value: u64) {
        bytes[..8].copy_from_slice(&value.to_le_bytes());
    }
}

/// A fixed-size view: `new_unchecked`, `new_checked`, `check_len`, `into_inner`, `bytes`.
macro_rules! fixed_view {
    ($(#[$doc:meta])* $name:ident, $format:literal, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Bytes of the format.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking its length.
            ///
            /// # Errors
            /// [`WireError::Truncated`](crate::nvmeof::wire::WireError::Truncated) on a short buffer.
            pub fn new_checked(buffer: T) -> Result<Self, $crate::nvmeof::wire::WireError> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Ensures no accessor panics: the buffer holds the whole format.
            ///
            /// # Errors
            /// [`WireError::Truncated`](crate::nvmeof::wire::WireError::Truncated) on a short buffer.
            pub fn check_len(&self) -> Result<(), $crate::nvmeof::wire::WireError> {
                $crate::nvmeof::wire::check_len($format, $len, self.buffer.as_ref().len())
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The bytes of the format (the first `LEN` of the buffer).
            pub fn bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..$len]
            }

            /// The bytes after the format.
            pub fn payload(&self) -> &[u8] {
                &self.buffer.as_ref()[$len..]
            }
        }
    };
}
pub(crate) use fixed_view;

/// Reads a NUL-terminated ASCII string of at most `field.len() - 1` bytes (NQNs, serial
/// numbers): the bytes before the first NUL must be printable ASCII, and a NUL must come.
pub(crate) fn parse_nul_terminated(
    format: &'static str,
    name: &'static str,
    field: &[u8],
) -> Result<String, WireError> {
    let Some(end) = field.iter().position(|b| *b == 0) else {
        return Err(WireError::Malformed {
            format,
            field: name,
            value: field.len() as u64,
        });
    };
    if let Some(bad) = field[..end].iter().find(|b| !(0x20..0x7F).contains(*b)) {
        return Err(WireError::Malformed {
            format,
            field: name,
            value: u64::from(*bad),
        });
    }
    Ok(String::from_utf8_lossy(&field[..end]).into_owned())
}

/// Writes `value` into `field`, NUL-padded; at most `field.len() - 1` bytes are kept so a
/// NUL always ends it.
pub(crate) fn emit_nul_terminated(field: &mut [u8], value: &str) {
    field.fill(0);
    let n = value.len().min(field.len() - 1);
    field[..n].copy_from_slice(&value.as_bytes()[..n]);
}

/// Writes `value` into `field`, space-padded (Identify's ASCII fields: SN, MN, FR).
pub(crate) fn emit_space_padded(field: &mut [u8], value: &str) {
    field.fill(b' ');
    let n = value.len().min(field.len());
    field[..n].copy_from_slice(&value.as_bytes()[..n]);
}

/// Reads a space-padded ASCII field, trailing spaces removed.
pub(crate) fn parse_space_padded(field: &[u8]) -> String {
    String::from_utf8_lossy(field).trim_end_matches([' ', '\0']).to_string()
}

pub use command::parse_command_capsule;
pub use sgl::parse_sgl;

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
}
