//! IPv6 header as RoCEv2 uses it (roce-wire §1.1): 40 bytes, next header UDP directly (no
//! extension headers). Traffic class, flow label and hop limit are masked out of the ICRC.

use super::{be, check_len, WireError};

/// Header length.
pub const HEADER_LEN: usize = 40;
/// Next-header number of UDP.
pub const NEXT_HEADER_UDP: u8 = 17;

mod field {
    use core::ops::Range;
    /// Version (31:28), traffic class (27:20), flow label (19:0).
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LENGTH: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SOURCE: Range<usize> = 8..24;
    pub const DESTINATION: Range<usize> = 24..40;
}

/// A read/write view of an IPv6 header and its payload.
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

    /// Ensures that no accessor panics: the buffer holds the 40-byte header and the payload
    /// length it announces (more bytes, such as Ethernet padding, are allowed).
    /// [`Packet::set_payload_len`] can invalidate this.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        check_len("IPv6", HEADER_LEN, len)?;
        check_len("IPv6", HEADER_LEN + usize::from(self.payload_len()), len)
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn first_word(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::VER_TC_FLOW])
    }

    /// Version (6 for IPv6).
    pub fn version(&self) -> u8 {
        (self.first_word() >> 28) as u8
    }

    /// Traffic class (DSCP 7:2, ECN 1:0).
    pub fn traffic_class(&self) -> u8 {
        (self.first_word() >> 20) as u8
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.first_word() & 0xF_FFFF
    }

    /// Payload length in bytes.
    pub fn payload_len(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::PAYLOAD_LENGTH])
    }

    /// Next header (17 = UDP).
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    pub fn source(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        a
    }

    /// Destination address.
    pub fn destination(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        a
    }

    /// The payload (payload-length bytes after the header).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + usize::from(self.payload_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 6, the traffic class and the flow label (20 bits; higher bits dropped).
    pub fn set_version_class_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let word = (6 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xF_FFFF);
        be::set_u32(&mut self.buffer.as_mut()[field::VER_TC_FLOW], word);
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::PAYLOAD_LENGTH], len);
    }

    /// Sets the next header.
    pub fn set_next_header(&mut self, value: u8) {
        self.buffer.as_mut()[field::NEXT_HEADER] = value;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = value;
    }

    /// Sets the source address.
    pub fn set_source(&mut self, address: [u8; 16]) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&address);
    }

    /// Sets the destination address.
    pub fn set_destination(&mut self, address: [u8; 16]) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&address);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// The semantic content of a RoCEv2 IPv6 header. Payload length and next header (UDP) are
/// derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address (the source GID).
    pub source: [u8; 16],
    /// Destination address (the destination GID).
    pub destination: [u8; 16],
    /// Traffic class (the verbs GRH traffic class).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// Validates and reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] from [`Packet::check_len`]; [`WireError::Malformed`] for a
    /// version other than 6; [`WireError::NotRoce`] if the next header is not UDP
    /// (extension headers are not supported).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Ipv6Repr, WireError> {
        packet.check_len()?;
        if packet.version() != 6 {
            return Err(WireError::Malformed {
                layer: "IPv6",
                field: "version",
                value: packet.version().into(),
            });
        }
        if packet.next_header() != NEXT_HEADER_UDP {
            return Err(WireError::NotRoce {
                layer: "IPv6",
                field: "next header",
                value: packet.next_header().into(),
            });
        }
        Ok(Ipv6Repr {
            source: packet.source(),
            destination: packet.destination(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
            hop_limit: packet.hop_limit(),
        })
    }

    /// Header length: always 40.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header for a payload (UDP datagram) of `payload_len` bytes. Flow-label
    /// bits above 20 are dropped.
    ///
    /// # Panics
    /// If the buffer is shorter than 40 bytes. `payload_len` above 65535 is a caller bug
    /// (debug assertion; the length field wraps in release builds).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>, payload_len: usize) {
        debug_assert!(payload_len <= usize::from(u16::MAX), "IPv6 payload too long");
        packet.set_version_class_flow(self.traffic_class, self.flow_label);
        packet.set_payload_len(payload_len as u16);
        packet.set_next_header(NEXT_HEADER_UDP);
        packet.set_hop_limit(self.hop_limit);
        packet.set_source(self.source);
        packet.set_destination(self.destination);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// The IPv6 header of oracle test frame 5 (make_test_frames.py): traffic class 0x02, flow
    /// label 0x12345, payload length 52, hop limit 64, fe80::1 → fe80::2.
    const HEADER: [u8; 40] = [
        0x60, 0x21, 0x23, 0x45, 0x00, 0x34, 0x11, 0x40, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xfe,
        0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02,
    ];

    fn known_repr() -> Ipv6Repr {
        let mut source = [0u8; 16];
        source[0] = 0xfe;
        source[1] = 0x80;
        let mut destination = source;
        source[15] = 1;
        destination[15] = 2;
        Ipv6Repr {
            source,
            destination,
            traffic_class: 0x02,
            flow_label: 0x12345,
            hop_limit: 64,
        }
    }

    fn packet_bytes() -> [u8; 92] {
        let mut bytes = [0u8; 92];
        bytes[..40].copy_from_slice(&HEADER);
        bytes
    }

    #[test]
    fn parses_known_bytes() {
        let bytes = packet_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.version(), 6);
        assert_eq!(packet.traffic_class(), 0x02);
        assert_eq!(packet.flow_label(), 0x12345);
        assert_eq!(packet.payload_len(), 52);
        assert_eq!(packet.payload().len(), 52);
        assert_eq!(Ipv6Repr::parse(&packet).unwrap(), known_repr());
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 40];
        known_repr().emit(&mut Packet::new_unchecked(&mut bytes[..]), 52);
        assert_eq!(bytes, HEADER);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x1906);
        for _ in 0..1000 {
            let repr = Ipv6Repr {
                source: rng.bytes(),
                destination: rng.bytes(),
                traffic_class: rng.u8(),
                flow_label: rng.u32() & 0xF_FFFF,
                hop_limit: rng.u8(),
            };
            let payload_len = rng.below(100);
            let mut bytes = vec![0u8; 40 + payload_len];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]), payload_len);
            let packet = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(packet.payload().len(), payload_len);
            assert_eq!(Ipv6Repr::parse(&packet).unwrap(), repr);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        let bytes = packet_bytes();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Packet::new_checked(&bytes[..len]),
                    Err(WireError::Truncated { layer: "IPv6", .. })
                ),
                "length {len}"
            );
        }
    }

    #[test]
    fn rejects_bad_fields() {
        let mut bytes = packet_bytes();
        bytes[6] = 0; // hop-by-hop options
        let packet = Packet::new_unchecked(&bytes[..]);
        assert!(matches!(
            Ipv6Repr::parse(&packet),
            Err(WireError::NotRoce {
                field: "next header",
                ..
            })
        ));
        let mut bytes = packet_bytes();
        bytes[0] = 0x40;
        let packet = Packet::new_unchecked(&bytes[..]);
        assert!(matches!(
            Ipv6Repr::parse(&packet),
            Err(WireError::Malformed {
                field: "version",
                value: 4,
                ..
            })
        ));
    }
}
