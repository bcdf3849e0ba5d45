//! IPv4 header as RoCEv2 uses it (roce-wire §1.1): 20 bytes, no options, protocol UDP,
//! not fragmented. TOS (DSCP+ECN), TTL and the header checksum are masked out of the ICRC.

use super::{be, check_len, WireError};

/// Header length (IHL = 5; RoCEv2 senders use no options).
pub const HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

mod field {
    use core::ops::Range;
    /// Version (7:4) and IHL (3:0).
    pub const VER_IHL: usize = 0;
    /// DSCP (7:2) and ECN (1:0).
    pub const DSCP_ECN: usize = 1;
    pub const TOTAL_LENGTH: Range<usize> = 2..4;
    pub const IDENTIFICATION: Range<usize> = 4..6;
    /// Flags (15:13: reserved, DF, MF) and fragment offset (12:0, 8-byte units).
    pub const FLAGS_FRAGMENT: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SOURCE: Range<usize> = 12..16;
    pub const DESTINATION: Range<usize> = 16..20;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAGMENT_OFFSET: u16 = 0x1FFF;

/// The Internet checksum (RFC 1071) of `data`: the ones' complement of the ones'-complement
/// sum of its big-endian 16-bit words (an odd last byte is padded with zero).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut words = data.chunks_exact(2);
    for word in &mut words {
        sum += u32::from(u16::from_be_bytes([word[0], word[1]]));
    }
    if let [last] = words.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// A read/write view of an IPv4 header and its payload.
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

    /// Ensures that no accessor panics: the buffer holds 20 bytes, the IHL is at least 5 and
    /// the header fits, the total length covers the header and fits in the buffer (bytes
    /// after the total length, such as Ethernet padding, are allowed).
    /// [`Packet::set_header_len`] and [`Packet::set_total_len`] can invalidate this.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        check_len("IPv4", HEADER_LEN, len)?;
        let header_len = self.header_len();
        if header_len < HEADER_LEN {
            return Err(WireError::Malformed {
                layer: "IPv4",
                field: "IHL",
                value: (header_len / 4) as u64,
            });
        }
        check_len("IPv4", header_len, len)?;
        let total_len = usize::from(self.total_len());
        if total_len < header_len {
            return Err(WireError::Malformed {
                layer: "IPv4",
                field: "total length",
                value: total_len as u64,
            });
        }
        check_len("IPv4", total_len, len)
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0F) * 4
    }

    /// Differentiated services code point (6 bits).
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// Explicit congestion notification (2 bits).
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 0x3
    }

    /// Total length (header + payload) in bytes.
    pub fn total_len(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::TOTAL_LENGTH])
    }

    /// Identification.
    pub fn identification(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::IDENTIFICATION])
    }

    fn flags_fragment(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::FLAGS_FRAGMENT])
    }

    /// Don't-fragment flag.
    pub fn dont_fragment(&self) -> bool {
        self.flags_fragment() & FLAG_DF != 0
    }

    /// More-fragments flag.
    pub fn more_fragments(&self) -> bool {
        self.flags_fragment() & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn fragment_offset(&self) -> u16 {
        (self.flags_fragment() & FRAGMENT_OFFSET) << 3
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload (17 = UDP).
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    /// Header checksum as found.
    pub fn checksum(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::CHECKSUM])
    }

    /// Source address.
    pub fn source(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        a
    }

    /// Destination address.
    pub fn destination(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        a
    }

    /// Whether the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }

    /// The payload: from the end of the header to the total length (Ethernet padding
    /// excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length (a multiple of 4, 20..=60).
    pub fn set_header_len(&mut self, len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((len / 4) as u8 & 0x0F);
    }

    /// Sets DSCP (6 bits) and ECN (2 bits).
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = (dscp << 2) | (ecn & 0x3);
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, len: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::TOTAL_LENGTH], len);
    }

    /// Sets the identification.
    pub fn set_identification(&mut self, id: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::IDENTIFICATION], id);
    }

    /// Sets the flags to DF (or none) and the fragment offset to 0.
    pub fn set_dont_fragment(&mut self, df: bool) {
        be::set_u16(
            &mut self.buffer.as_mut()[field::FLAGS_FRAGMENT],
            if df { FLAG_DF } else { 0 },
        );
    }

    /// Sets the time to live.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, protocol: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = protocol;
    }

    /// Sets the header checksum field as given.
    pub fn set_checksum(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::CHECKSUM], value);
    }

    /// Sets the source address.
    pub fn set_source(&mut self, address: [u8; 4]) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&address);
    }

    /// Sets the destination address.
    pub fn set_destination(&mut self, address: [u8; 4]) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&address);
    }

    /// Computes and writes the header checksum (call after every other header field).
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let sum = checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(sum);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.header_len()..usize::from(self.total_len());
        &mut self.buffer.as_mut()[range]
    }
}

/// The semantic content of a RoCEv2 IPv4 header. Lengths, protocol (UDP) and checksum are
/// derived on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub source: [u8; 4],
    /// Destination address.
    pub destination: [u8; 4],
    /// DSCP (6 bits; the upper 6 bits of the verbs traffic class).
    pub dscp: u8,
    /// ECN (2 bits).
    pub ecn: u8,
    /// Time to live (the verbs hop limit).
    pub ttl: u8,
    /// Identification (covered by the ICRC; see roce-wire §1.6 on UDP sockets).
    pub identification: u16,
    /// Don't-fragment flag (rxe sets it).
    pub dont_fragment: bool,
}

impl Ipv4Repr {
    /// Validates and reads the header.
    ///
    /// # Errors
    /// [`WireError::Truncated`] / [`WireError::Malformed`] from [`Packet::check_len`];
    /// `Malformed` for a version other than 4, options (IHL ≠ 5) or a fragment;
    /// [`WireError::BadIpChecksum`]; [`WireError::NotRoce`] if the protocol is not UDP.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Ipv4Repr, WireError> {
        packet.check_len()?;
        if packet.version() != 4 {
            return Err(WireError::Malformed {
                layer: "IPv4",
                field: "version",
                value: packet.version().into(),
            });
        }
        if packet.header_len() != HEADER_LEN {
            return Err(WireError::Malformed {
                layer: "IPv4",
                field: "IHL",
                value: (packet.header_len() / 4) as u64,
            });
        }
        if !packet.verify_checksum() {
            return Err(WireError::BadIpChecksum);
        }
        if packet.more_fragments() || packet.fragment_offset() != 0 {
            return Err(WireError::Malformed {
                layer: "IPv4",
                field: "flags/fragment offset",
                value: packet.flags_fragment().into(),
            });
        }
        if packet.protocol() != PROTOCOL_UDP {
            return Err(WireError::NotRoce {
                layer: "IPv4",
                field: "protocol",
                value: packet.protocol().into(),
            });
        }
        Ok(Ipv4Repr {
            source: packet.source(),
            destination: packet.destination(),
            dscp: packet.dscp(),
            ecn: packet.ecn(),
            ttl: packet.ttl(),
            identification: packet.identification(),
            dont_fragment: packet.dont_fragment(),
        })
    }

    /// Header length: always 20.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header for a payload (UDP datagram) of `payload_len` bytes, checksum
    /// included. Out-of-range DSCP/ECN bits are dropped.
    ///
    /// # Panics
    /// If the buffer is shorter than 20 bytes. `payload_len` above 65515 is a caller bug
    /// (debug assertion; the length field wraps in release builds).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>, payload_len: usize) {
        debug_assert!(
            payload_len <= usize::from(u16::MAX) - HEADER_LEN,
            "IPv4 payload too long"
        );
        packet.set_header_len(HEADER_LEN);
        packet.set_dscp_ecn(self.dscp & 0x3F, self.ecn);
        packet.set_total_len((HEADER_LEN + payload_len) as u16);
        packet.set_identification(self.identification);
        packet.set_dont_fragment(self.dont_fragment);
        packet.set_ttl(self.ttl);
        packet.set_protocol(PROTOCOL_UDP);
        packet.set_source(self.source);
        packet.set_destination(self.destination);
        packet.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// The IPv4 header of oracle test frame 1 (make_test_frames.py), total length 0x48 = 72,
    /// followed by 52 bytes of (here zero) payload.
    const HEADER: [u8; 20] = [
        0x45, 0x02, 0x00, 0x48, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0xa5, 0x1b, 0xc0, 0xa8, 0x01, 0x01, 0xc0, 0xa8,
        0x01, 0x02,
    ];

    fn packet_bytes() -> [u8; 72] {
        let mut bytes = [0u8; 72];
        bytes[..20].copy_from_slice(&HEADER);
        bytes
    }

    fn known_repr() -> Ipv4Repr {
        Ipv4Repr {
            source: [192, 168, 1, 1],
            destination: [192, 168, 1, 2],
            dscp: 0,
            ecn: 2,
            ttl: 64,
            identification: 0x1234,
            dont_fragment: true,
        }
    }

    #[test]
    fn parses_known_bytes() {
        let bytes = packet_bytes();
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(packet.version(), 4);
        assert_eq!(packet.header_len(), 20);
        assert_eq!(packet.total_len(), 72);
        assert_eq!(packet.checksum(), 0xa51b);
        assert!(packet.verify_checksum());
        assert!(packet.dont_fragment() && !packet.more_fragments());
        assert_eq!(packet.payload().len(), 52);
        assert_eq!(Ipv4Repr::parse(&packet).unwrap(), known_repr());
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xFFu8; 20];
        known_repr().emit(&mut Packet::new_unchecked(&mut bytes[..]), 52);
        assert_eq!(bytes, HEADER);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x1904);
        for _ in 0..1000 {
            let repr = Ipv4Repr {
                source: rng.bytes(),
                destination: rng.bytes(),
                dscp: rng.u8() & 0x3F,
                ecn: rng.u8() & 0x3,
                ttl: rng.u8(),
                identification: rng.u16(),
                dont_fragment: rng.bool(),
            };
            let payload_len = rng.below(100);
            let mut bytes = vec![0u8; 20 + payload_len];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]), payload_len);
            let packet = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(packet.payload().len(), payload_len);
            assert_eq!(Ipv4Repr::parse(&packet).unwrap(), repr);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        let bytes = packet_bytes();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    Packet::new_checked(&bytes[..len]),
                    Err(WireError::Truncated { layer: "IPv4", .. })
                ),
                "length {len}"
            );
        }
    }

    #[test]
    fn rejects_bad_fields() {
        let parse = |bytes: &[u8]| Ipv4Repr::parse(&Packet::new_unchecked(bytes));
        let mut bytes = packet_bytes();
        bytes[10] ^= 1;
        assert_eq!(parse(&bytes), Err(WireError::BadIpChecksum));

        let fix = |bytes: &mut [u8; 72]| {
            let mut p = Packet::new_unchecked(&mut bytes[..]);
            p.fill_checksum();
        };
        let mut bytes = packet_bytes();
        bytes[9] = 6;
        fix(&mut bytes);
        assert!(matches!(
            parse(&bytes),
            Err(WireError::NotRoce {
                field: "protocol",
                value: 6,
                ..
            })
        ));

        let mut bytes = packet_bytes();
        bytes[6] |= 0x20; // MF
        fix(&mut bytes);
        assert!(matches!(
            parse(&bytes),
            Err(WireError::Malformed {
                field: "flags/fragment offset",
                ..
            })
        ));

        let mut bytes = packet_bytes();
        bytes[0] = 0x46; // options
        fix(&mut bytes);
        assert!(matches!(
            parse(&bytes),
            Err(WireError::Malformed {
                field: "IHL",
                value: 6,
                ..
            })
        ));

        let mut bytes = packet_bytes();
        bytes[0] = 0x44;
        assert!(matches!(
            parse(&bytes),
            Err(WireError::Malformed {
                field: "IHL",
                value: 4,
                ..
            })
        ));

        let mut bytes = packet_bytes();
        bytes[0] = 0x65;
        fix(&mut bytes);
        assert!(matches!(
            parse(&bytes),
            Err(WireError::Malformed {
                field: "version",
                value: 6,
                ..
            })
        ));

        let mut bytes = packet_bytes();
        bytes[3] = 19;
        assert!(matches!(
            parse(&bytes),
            Err(WireError::Malformed {
                field: "total length",
                value: 19,
                ..
            })
        ));
    }

    #[test]
    fn checksum_of_odd_length() {
        assert_eq!(checksum(&[0x01]), !0x0100);
        assert_eq!(checksum(&[]), 0xFFFF);
    }
}
