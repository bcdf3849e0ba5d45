//! Immediate data (roce-wire §1.3), 4 bytes: opaque to the transport. The `u32` in the repr
//! is the big-endian reading of the four wire bytes, so the verbs `imm_data` (a `__be32`)
//! of a completion is `data.to_be_bytes()` in memory order.

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;
    pub const DATA: Range<usize> = 0..4;
}

fixed_header_view!("ImmDt", 4);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate data, read big-endian.
    pub fn data(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::DATA])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the immediate data (written big-endian).
    pub fn set_data(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::DATA], value);
    }
}

/// The semantic content of an ImmDt ([`RoceRepr::immediate`](super::RoceRepr) holds the
/// bare `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// The immediate data, read big-endian.
    pub data: u32,
}

impl ImmDtRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<ImmDtRepr, WireError> {
        packet.check_len()?;
        Ok(ImmDtRepr { data: packet.data() })
    }

    /// Header length: always 4.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_data(self.data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// Hand-written: immediate 0xDEADBEEF.
    const BYTES: [u8; 4] = [0xDE, 0xAD, 0xBE, 0xEF];

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(ImmDtRepr::parse(&packet).unwrap(), ImmDtRepr { data: 0xDEAD_BEEF });
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0u8; 4];
        ImmDtRepr { data: 0xDEAD_BEEF }.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x1DD);
        for _ in 0..1000 {
            let repr = ImmDtRepr { data: rng.u32() };
            let mut bytes = [0u8; 4];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                ImmDtRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
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
                    Err(WireError::Truncated { layer: "ImmDt", .. })
                ),
                "length {len}"
            );
        }
    }
}
