//! Atomic extended transport header (roce-wire §1.3), 28 bytes: on CompareSwap and
//! FetchAdd. Operands are big-endian 64-bit; the VA must be 8-byte aligned (a responder
//! check, not a wire-format one).

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 28;

mod field {
    use core::ops::Range;
    pub const VIRTUAL_ADDRESS: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    /// Swap data (CompareSwap) or add data (FetchAdd).
    pub const SWAP_OR_ADD: Range<usize> = 12..20;
    /// Compare data (CompareSwap; unused by FetchAdd).
    pub const COMPARE: Range<usize> = 20..28;
}

fixed_header_view!("AtomicETH", 28);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote virtual address.
    pub fn virtual_address(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::VIRTUAL_ADDRESS])
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::RKEY])
    }

    /// Swap (CompareSwap) or add (FetchAdd) operand.
    pub fn swap_or_add(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::SWAP_OR_ADD])
    }

    /// Compare operand.
    pub fn compare(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the remote virtual address.
    pub fn set_virtual_address(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::VIRTUAL_ADDRESS], value);
    }

    /// Sets the R_Key.
    pub fn set_rkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::RKEY], value);
    }

    /// Sets the swap/add operand.
    pub fn set_swap_or_add(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::SWAP_OR_ADD], value);
    }

    /// Sets the compare operand.
    pub fn set_compare(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::COMPARE], value);
    }
}

/// The semantic content of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address (8-byte aligned for a valid request).
    pub virtual_address: u64,
    /// R_Key.
    pub rkey: u32,
    /// Swap (CompareSwap) or add (FetchAdd) operand.
    pub swap_or_add: u64,
    /// Compare operand (CompareSwap; 0 for FetchAdd).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 28 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<AtomicEthRepr, WireError> {
        packet.check_len()?;
        Ok(AtomicEthRepr {
            virtual_address: packet.virtual_address(),
            rkey: packet.rkey(),
            swap_or_add: packet.swap_or_add(),
            compare: packet.compare(),
        })
    }

    /// Header length: always 28.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than 28 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_virtual_address(self.virtual_address);
        packet.set_rkey(self.rkey);
        packet.set_swap_or_add(self.swap_or_add);
        packet.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// Hand-written CompareSwap: VA 0x7f00_0000_1008, R_Key 0x1234, swap 2, compare 1.
    const BYTES: [u8; 28] = [
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x08, 0x00, 0x00, 0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0,
        0, 0, 0, 0x01,
    ];
    const REPR: AtomicEthRepr = AtomicEthRepr {
        virtual_address: 0x7f00_0000_1008,
        rkey: 0x1234,
        swap_or_add: 2,
        compare: 1,
    };

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.swap_or_add(), 2);
        assert_eq!(packet.compare(), 1);
        assert_eq!(AtomicEthRepr::parse(&packet).unwrap(), REPR);
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 28];
        REPR.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xA7);
        for _ in 0..1000 {
            let repr = AtomicEthRepr {
                virtual_address: rng.next_u64(),
                rkey: rng.u32(),
                swap_or_add: rng.next_u64(),
                compare: rng.next_u64(),
            };
            let mut bytes = [0u8; 28];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                AtomicEthRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
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
                    Err(WireError::Truncated { layer: "AtomicETH", .. })
                ),
                "length {len}"
            );
        }
    }
}
