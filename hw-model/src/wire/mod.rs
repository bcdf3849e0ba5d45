//! RoCEv2 wire formats: zero-copy header views and their semantic representations.
//!
//! A RoCEv2 frame, as this device puts it on the wire (`docs` reference: roce-wire §1.1):
//!
//! ```text
//! Ethernet II (14, +4 with one 802.1Q tag)
//! IPv4 (20, no options) | IPv6 (40, no extension headers)
//! UDP (8, destination port 4791, checksum 0 on emit)
//! BTH (12)
//! extension headers, as the opcode requires (0..28): DETH, RETH, AtomicETH, AETH,
//!     AtomicAckETH, ImmDt, IETH (in that order), or CNP's 16 reserved bytes
//! payload (0..MTU) + pad (0..3 zero bytes, BTH PadCnt)
//! ICRC (4, CRC-32 of the invariant fields, least-significant byte first)
//! ```
//!
//! Every header has its own module in the smoltcp style:
//!
//! * a `Packet<T: AsRef<[u8]>>` view over any buffer, with byte ranges in a private
//!   `mod field`, typed getters, and setters when `T: AsMut<[u8]>`. Construct it with
//!   `new_checked` on untrusted input (it proves that no accessor can panic), or with
//!   `new_unchecked` on a buffer you sized yourself (emission);
//! * a `Repr` holding the semantic fields, with `parse` (validates), `emit` (writes every
//!   byte of the header) and `header_len`.
//!
//! Whole frames go through [`parse_frame`] (validates everything, including the ICRC, and
//! never panics) and [`emit_frame`] / [`emit_frame_with`] (derive every length, the IPv4
//! checksum, the pad and the ICRC). Neither allocates: parsing borrows the payload from the
//! frame, emitting reuses the capacity of the output vector.
//!
//! ```
//! use rnic_hw_model::wire::{self, opcode::BthOpcode, *};
//!
//! let repr = RoceRepr::new(
//!     EthernetRepr { destination: [2, 0, 0, 0, 0, 2], source: [2, 0, 0, 0, 0, 1], vlan: None, ethertype: 0x0800 },
//!     IpRepr::V4(Ipv4Repr {
//!         source: [192, 168, 1, 1],
//!         destination: [192, 168, 1, 2],
//!         dscp: 0,
//!         ecn: 0,
//!         ttl: 64,
//!         identification: 0,
//!         dont_fragment: true,
//!     }),
//!     wire::udp_source_port(0, 0x11, 0x12),
//!     BthRepr::new(BthOpcode::RC_SEND_ONLY, 0x12, 100),
//! );
//! let mut frame = Vec::with_capacity(128);
//! wire::emit_frame(&repr, b"abc", &mut frame);
//! assert_eq!(frame.len(), wire::frame_length(&repr, 3));
//! let parsed = wire::parse_frame(&frame).unwrap();
//! assert_eq!(parsed.payload, b"abc");
//! assert_eq!(parsed.repr.bth.pad_count, 1);
//! ```

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
pub mod ethernet;
mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod opcode;
pub mod reth;
pub mod udp;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;

pub use aeth::{AethKind, AethRepr, NakCode};
pub use atomic_ack_eth::AtomicAckEthRepr;
pub use atomic_eth::AtomicEthRepr;
pub use bth::BthRepr;
pub use deth::DethRepr;
pub use ethernet::{EthernetRepr, VlanTag};
pub use frame::{
    emit_frame, emit_frame_offloaded, emit_frame_overwriting, emit_frame_with, fill_icrc, frame_length, gid_to_ipv4,
    ipv4_to_gid, pad_len, parse_frame, parse_frame_offloaded, parse_frame_with, udp_source_port, Icrc, IpRepr,
    ParsedFrame, RoceRepr,
};
pub use icrc::icrc;
pub use ieth::IethRepr;
pub use immdt::ImmDtRepr;
pub use ipv4::Ipv4Repr;
pub use ipv6::Ipv6Repr;
pub use opcode::{BthOpcode, ExtHeaders, Position, Service};
pub use reth::RethRepr;
pub use udp::UdpRepr;

/// The IANA UDP destination port of RoCEv2.
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// Why a frame or a header could not be parsed.
///
/// Every variant carries enough to say which layer and which field was at fault; none owns
/// heap memory, so errors are cheap on the per-packet path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A header (or the extent a length field announces) does not fit in the bytes given.
    #[error("{layer}: truncated, need {needed} bytes, have {available}")]
    Truncated {
        /// Header or layer name ("Ethernet", "IPv4", "BTH", "RETH", ...).
        layer: &'static str,
        /// Bytes needed from the start of that layer.
        needed: usize,
        /// Bytes available from the start of that layer.
        available: usize,
    },
    /// A field holds a value this layer does not accept.
    #[error("{layer}: invalid {field} {value:#x}")]
    Malformed {
        /// Header or layer name.
        layer: &'static str,
        /// Field name, spelled as in the specification.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
    /// A well-formed frame that is not RoCEv2 (another EtherType, IP protocol or UDP port).
    #[error("not RoCEv2: {layer} {field} is {value:#x}")]
    NotRoce {
        /// Layer whose field decided it.
        layer: &'static str,
        /// Field name.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// The IPv4 header checksum does not verify.
    #[error("IPv4: bad header checksum")]
    BadIpChecksum,
    /// The ICRC does not match the frame (both values as little-endian 32-bit numbers).
    #[error("bad ICRC: computed {computed:#010x}, found {found:#010x}")]
    BadIcrc {
        /// ICRC computed over the received bytes.
        computed: u32,
        /// ICRC read from the frame (little-endian).
        found: u32,
    },
    /// The BTH opcode is not one this crate knows (reserved, RD, vendor-specific, ...).
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The BTH opcode is known but cannot be carried by [`RoceRepr`] (RC FLUSH, whose FETH
    /// has no field there).
    #[error("unsupported BTH opcode {0:#04x}")]
    UnsupportedOpcode(u8),
}

/// Declares the `Packet<T>` view of a fixed-size header: the struct and its
/// `new_unchecked` / `new_checked` / `check_len` / `into_inner` / `payload` methods.
macro_rules! fixed_header_view {
    ($layer:literal, $len:literal) => {
        #[doc = concat!("A read/write view of a ", $layer, " and what follows it.")]
        #[derive(Debug, Clone)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length; accessors may panic on a short buffer.
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wraps a buffer after [`Packet::check_len`].
            pub fn new_checked(buffer: T) -> Result<Packet<T>, $crate::wire::WireError> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            #[doc = concat!("Ensures that no accessor panics: the buffer holds the ", stringify!($len), "-byte header.")]
            pub fn check_len(&self) -> Result<(), $crate::wire::WireError> {
                $crate::wire::check_len($layer, $len, self.buffer.as_ref().len())
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The bytes after the header.
            pub fn payload(&self) -> &[u8] {
                &self.buffer.as_ref()[$len..]
            }
        }
    };
}
pub(crate) use fixed_header_view;

/// Checks that `available >= needed` for `layer`.
#[inline]
pub(crate) fn check_len(layer: &'static str, needed: usize, available: usize) -> Result<(), WireError> {
    if available < needed {
        Err(WireError::Truncated {
            layer,
            needed,
            available,
        })
    } else {
        Ok(())
    }
}

/// Big-endian field helpers shared by the header modules. Each takes a slice of exactly
/// the field's width (a `mod field` range), so a wrong width is a programming error.
pub(crate) mod be {
    #[inline]
    pub fn u16(bytes: &[u8]) -> u16 {
        u16::from_be_bytes([bytes[0], bytes[1]])
    }

    #[inline]
    pub fn u24(bytes: &[u8]) -> u32 {
        u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]])
    }

    #[inline]
    pub fn u32(bytes: &[u8]) -> u32 {
        u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }

    #[inline]
    pub fn u64(bytes: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        u64::from_be_bytes(b)
    }

    #[inline]
    pub fn set_u16(bytes: &mut [u8], value: u16) {
        bytes.copy_from_slice(&value.to_be_bytes());
    }

    /// Writes the low 24 bits of `value`.
    #[inline]
    pub fn set_u24(bytes: &mut [u8], value: u32) {
        bytes.copy_from_slice(&value.to_be_bytes()[1..]);
    }

    #[inline]
    pub fn set_u32(bytes: &mut [u8], value: u32) {
        bytes.copy_from_slice(&value.to_be_bytes());
    }

    #[inline]
    pub fn set_u64(bytes: &mut [u8], value: u64) {
        bytes.copy_from_slice(&value.to_be_bytes());
    }
}
