//! Invalidate extended transport header (roce-wire §1.3), 4 bytes: the R_Key to invalidate,
//! on SEND Last/Only with Invalidate.

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;
    pub const RKEY: Range<usize> = 0..4;
}

fixed_header_view!("IETH", 4);

impl<T: AsRef<[u8]>> Packet<T> {
    /// The R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::RKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], value);
    }
}

/// The semantic content of an IETH ([`RoceRepr::invalidate_rkey`](super::RoceRepr) holds
/// the bare `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<IethRepr, WireError> {
        packet.check_len()?;
        Ok(IethRepr { rkey: packet.rkey() })
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
        packet.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// Hand-written: R_Key 0x00012345.
    const BYTES: [u8; 4] = [0x00, 0x01, 0x23, 0x45];

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(IethRepr::parse(&packet).unwrap(), IethRepr { rkey: 0x12345 });
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 4];
        IethRepr { rkey: 0x12345 }.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x1E7);
        for _ in 0..1000 {
            let repr = IethRepr { rkey: rng.u32() };
            let mut bytes = [0u8; 4];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                IethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
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
                    Err(WireError::Truncated { layer: "IETH", .. })
                ),
                "length {len}"
            );
        }
    }
}
