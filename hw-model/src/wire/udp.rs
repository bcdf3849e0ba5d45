//! UDP header (roce-wire §1.1). RoCEv2 uses destination port 4791; the source port is
//! per-flow entropy ([`udp_source_port`](super::udp_source_port)). The checksum is written
//! as 0 (as rxe does, for IPv4 and IPv6) and is not verified on receive: it is masked out
//! of the ICRC, which protects the datagram end to end.

use super::{be, check_len, WireError};

/// Header length.
pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;
    pub const SOURCE_PORT: Range<usize> = 0..2;
    pub const DESTINATION_PORT: Range<usize> = 2..4;
    /// Header + payload length in bytes.
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// A read/write view of a UDP header and its payload.
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
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Ensures that no accessor panics: the buffer holds the 8-byte header, the length field
    /// is at least 8 and the datagram it announces fits in the buffer (trailing bytes are
    /// allowed, as Linux allows them). [`Packet::set_len`] can invalidate this.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        check_len("UDP", HEADER_LEN, len)?;
        let datagram_len = usize::from(self.len());
        if datagram_len < HEADER_LEN {
            return Err(WireError::Malformed {
                layer: "UDP",
                field: "length",
                value: datagram_len as u64,
            });
        }
        check_len("UDP", datagram_len, len)
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn source_port(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::SOURCE_PORT])
    }

    /// Destination port.
    pub fn destination_port(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::DESTINATION_PORT])
    }

    /// Length field: header + payload in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::LENGTH])
    }

    /// Checksum as found (0 = none).
    pub fn checksum(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    /// The payload: length-field bytes minus the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_source_port(&mut self, port: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::SOURCE_PORT], port);
    }

    /// Sets the destination port.
    pub fn set_destination_port(&mut self, port: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::DESTINATION_PORT], port);
    }

    /// Sets the length field.
    pub fn set_len(&mut self, len: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::LENGTH], len);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::CHECKSUM], value);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// The semantic content of a UDP header (length and checksum are derived on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub source_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub destination_port: u16,
}

impl UdpRepr {
    /// Reads the header. The checksum is not verified and any port is accepted
    /// ([`parse_frame`](super::parse_frame) requires destination port 4791).
    ///
    /// # Errors
    /// [`WireError::Truncated`] / [`WireError::Malformed`] from [`Packet::check_len`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<UdpRepr, WireError> {
        packet.check_len()?;
        Ok(UdpRepr {
            source_port: packet.source_port(),
            destination_port: packet.destination_port(),
        })
    }

    /// Header length: always 8.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header for a payload of `payload_len` bytes, with checksum 0.
    ///
    /// # Panics
    /// If the buffer is shorter than 8 bytes. `payload_len` above 65527 is a caller bug
    /// (debug assertion; the length field wraps in release builds).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>, payload_len: usize) {
        debug_assert!(
            payload_len <= usize::from(u16::MAX) - HEADER_LEN,
            "UDP payload too long"
        );
        packet.set_source_port(self.source_port);
        packet.set_destination_port(self.destination_port);
        packet.set_len((HEADER_LEN + payload_len) as u16);
        packet.set_checksum(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// UDP header of oracle test frame 1 (make_test_frames.py): 0xc0de → 4791, length 52.
    const HEADER: [u8; 8] = [0xc0, 0xde, 0x12, 0xb7, 0x00, 0x34, 0x00, 0x00];

    fn packet_bytes() -> [u8; 52] {
        let mut bytes = [0u8; 52];
        bytes[..8].copy_from_slice(&HEADER);
        bytes
    }

    #[test]
    fn parses_known_bytes() {
        let bytes = packet_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.source_port(), 0xc0de);
        assert_eq!(packet.destination_port(), 4791);
        assert_eq!(packet.len(), 52);
        assert_eq!(packet.checksum(), 0);
        assert_eq!(packet.payload().len(), 44);
        assert_eq!(
            UdpRepr::parse(&packet).unwrap(),
            UdpRepr {
                source_port: 0xc0de,
                destination_port: 4791
            }
        );
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 8];
        UdpRepr {
            source_port: 0xc0de,
            destination_port: 4791,
        }
        .emit(&mut Packet::new_unchecked(&mut bytes[..]), 44);
        assert_eq!(bytes, HEADER);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x0D9);
        for _ in 0..1000 {
            let repr = UdpRepr {
                source_port: rng.u16(),
                destination_port: rng.u16(),
            };
            let payload_len = rng.below(64);
            let mut bytes = vec![0u8; 8 + payload_len];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]), payload_len);
            let packet = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(packet.payload().len(), payload_len);
            assert_eq!(UdpRepr::parse(&packet).unwrap(), repr);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        let bytes = packet_bytes();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Packet::new_checked(&bytes[..len]),
                    Err(WireError::Truncated { layer: "UDP", .. })
                ),
                "length {len}"
            );
        }
        let mut bytes = packet_bytes();
        bytes[5] = 7;
        assert!(matches!(
            Packet::new_checked(&bytes[..]),
            Err(WireError::Malformed { field: "length", .. })
        ));
    }
}
