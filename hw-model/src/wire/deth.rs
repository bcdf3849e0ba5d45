//! Datagram extended transport header (roce-wire §1.3, §1.10), 8 bytes: Q_Key, a reserved
//! byte and the source QP, on UD SENDs (before the ImmDt).

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 8;
/// The well-known Q_Key of QP1 (GSI).
pub const GSI_QKEY: u32 = 0x8001_0000;

mod field {
    use core::ops::Range;
    pub const QKEY: Range<usize> = 0..4;
    pub const RESERVED: usize = 4;
    pub const SOURCE_QP: Range<usize> = 5..8;
}

fixed_header_view!("DETH", 8);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::QKEY])
    }

    /// The reserved byte.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }

    /// Source QP (24 bits).
    pub fn source_qp(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::SOURCE_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::QKEY], value);
    }

    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESERVED] = value;
    }

    /// Sets the source QP (low 24 bits).
    pub fn set_source_qp(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::SOURCE_QP], value);
    }
}

/// The semantic content of a DETH (the reserved byte is dropped on parse, zero on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub source_qp: u32,
}

impl DethRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 8 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<DethRepr, WireError> {
        packet.check_len()?;
        Ok(DethRepr {
            qkey: packet.qkey(),
            source_qp: packet.source_qp(),
        })
    }

    /// Header length: always 8.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header. A source QP wider than 24 bits is a caller bug (debug assertion;
    /// masked in release builds).
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        debug_assert!(
            self.source_qp <= 0xFF_FFFF,
            "source QP {:#x} wider than 24 bits",
            self.source_qp
        );
        packet.set_qkey(self.qkey);
        packet.set_reserved(0);
        packet.set_source_qp(self.source_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// DETH of the rdma_rxe CM ConnectRequest in oracles/samples (and of oracle test frame 7):
    /// GSI Q_Key, source QP 1.
    const BYTES: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
    const REPR: DethRepr = DethRepr {
        qkey: GSI_QKEY,
        source_qp: 1,
    };

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.reserved(), 0);
        assert_eq!(DethRepr::parse(&packet).unwrap(), REPR);
        let bytes = [0x11, 0x22, 0x33, 0x44, 0xFF, 0xAB, 0xCD, 0xEF];
        assert_eq!(
            DethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
            DethRepr {
                qkey: 0x1122_3344,
                source_qp: 0xABCDEF
            }
        );
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 8];
        REPR.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xDE7);
        for _ in 0..1000 {
            let repr = DethRepr {
                qkey: rng.u32(),
                source_qp: rng.u32() & 0xFF_FFFF,
            };
            let mut bytes = [0u8; 8];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                DethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
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
                    Err(WireError::Truncated { layer: "DETH", .. })
                ),
                "length {len}"
            );
        }
    }
}
