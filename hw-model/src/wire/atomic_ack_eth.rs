//! Atomic acknowledge extended transport header (roce-wire §1.3), 8 bytes: the original
//! remote value, big-endian, after the AETH of an ATOMIC Acknowledge.

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;
    pub const ORIGINAL_REMOTE_DATA: Range<usize> = 0..8;
}

fixed_header_view!("AtomicAckETH", 8);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The value at the remote address before the atomic operation.
    pub fn original_remote_data(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::ORIGINAL_REMOTE_DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the original remote value.
    pub fn set_original_remote_data(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::ORIGINAL_REMOTE_DATA], value);
    }
}

/// The semantic content of an AtomicAckETH ([`RoceRepr::atomic_ack`](super::RoceRepr) holds
/// the bare `u64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The value at the remote address before the atomic operation.
    pub original_remote_data: u64,
}

impl AtomicAckEthRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 8 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<AtomicAckEthRepr, WireError> {
        packet.check_len()?;
        Ok(AtomicAckEthRepr {
            original_remote_data: packet.original_remote_data(),
        })
    }

    /// Header length: always 8.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_original_remote_data(self.original_remote_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// Hand-written: original value 0x0123_4567_89AB_CDEF.
    const BYTES: [u8; 8] = [0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF];
    const REPR: AtomicAckEthRepr = AtomicAckEthRepr {
        original_remote_data: 0x0123_4567_89AB_CDEF,
    };

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(AtomicAckEthRepr::parse(&packet).unwrap(), REPR);
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0u8; 8];
        REPR.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xAAE);
        for _ in 0..1000 {
            let repr = AtomicAckEthRepr {
                original_remote_data: rng.next_u64(),
            };
            let mut bytes = [0u8; 8];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                AtomicAckEthRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
                repr
            );
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..HEADER_LEN {
            assert!(
                matches!(
                    Packet::new_checked(&BYTES[..len]),
                    Err(WireError::Truncated {
                        layer: "AtomicAckETH",
                        ..
                    })
                ),
                "length {len}"
            );
        }
    }
}
