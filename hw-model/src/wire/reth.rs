//! RDMA extended transport header (roce-wire §1.3), 16 bytes: on RDMA WRITE First/Only,
//! RDMA READ Request, ATOMIC WRITE and FLUSH.

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 16;

mod field {
    use core::ops::Range;
    pub const VIRTUAL_ADDRESS: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LENGTH: Range<usize> = 12..16;
}

fixed_header_view!("RETH", 16);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Remote virtual address.
    pub fn virtual_address(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::VIRTUAL_ADDRESS])
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::RKEY])
    }

    /// DMA length: bytes of the whole message.
    pub fn dma_length(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::DMA_LENGTH])
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

    /// Sets the DMA length.
    pub fn set_dma_length(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::DMA_LENGTH], value);
    }
}

/// The semantic content of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub virtual_address: u64,
    /// R_Key.
    pub rkey: u32,
    /// DMA length: bytes of the whole message (not of this packet).
    pub dma_length: u32,
}

impl RethRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 16 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<RethRepr, WireError> {
        packet.check_len()?;
        Ok(RethRepr {
            virtual_address: packet.virtual_address(),
            rkey: packet.rkey(),
            dma_length: packet.dma_length(),
        })
    }

    /// Header length: always 16.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    ///
    /// # Panics
    /// If the buffer is shorter than 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_virtual_address(self.virtual_address);
        packet.set_rkey(self.rkey);
        packet.set_dma_length(self.dma_length);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// RETH of oracle test frame 1 (make_test_frames.py): VA 0x1000, R_Key 0xabcd, length 12.
    const BYTES: [u8; 16] = [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0xab, 0xcd, 0, 0, 0, 0x0c];
    const REPR: RethRepr = RethRepr {
        virtual_address: 0x1000,
        rkey: 0xabcd,
        dma_length: 12,
    };

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.virtual_address(), 0x1000);
        assert_eq!(RethRepr::parse(&packet).unwrap(), REPR);
        // Hand-written, every byte distinct.
        let bytes: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
        let repr = RethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            RethRepr {
                virtual_address: 0x0102_0304_0506_0708,
                rkey: 0x090A_0B0C,
                dma_length: 0x0D0E_0F10
            }
        );
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x2E7);
        for _ in 0..1000 {
            let repr = RethRepr {
                virtual_address: rng.next_u64(),
                rkey: rng.u32(),
                dma_length: rng.u32(),
            };
            let mut bytes = [0u8; 16];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                RethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
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
                    Err(WireError::Truncated { layer: "RETH", .. })
                ),
                "length {len}"
            );
            assert!(RethRepr::parse(&Packet::new_unchecked(&BYTES[..len])).is_err());
        }
    }
}
