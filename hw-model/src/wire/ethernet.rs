//! Ethernet II header, with at most one 802.1Q VLAN tag (roce-wire §1.1). No FCS: frames
//! handled here end with the ICRC; the FCS is the port's business.

use super::{be, check_len, WireError};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// Tag protocol identifier of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Header length without a VLAN tag.
pub const HEADER_LEN: usize = 14;
/// Header length with one VLAN tag.
pub const VLAN_HEADER_LEN: usize = 18;

mod field {
    use core::ops::Range;
    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    /// EtherType, or the TPID 0x8100 when a VLAN tag follows.
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// VLAN tag control information (PCP 15:13, DEI 12, VID 11:0).
    pub const VLAN_TCI: Range<usize> = 14..16;
    /// EtherType after the VLAN tag.
    pub const VLAN_ETHERTYPE: Range<usize> = 16..18;
}

/// A read/write view of an Ethernet II header and what follows it.
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

    /// Ensures that no accessor panics: the buffer holds the 14-byte header, and the 4-byte
    /// tag too if the outer EtherType is 0x8100. [`Packet::set_outer_ethertype`] can
    /// invalidate this.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        check_len("Ethernet", HEADER_LEN, len)?;
        check_len("Ethernet", self.header_len(), len)
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC address.
    pub fn destination(&self) -> [u8; 6] {
        let mut mac = [0; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION]);
        mac
    }

    /// Source MAC address.
    pub fn source(&self) -> [u8; 6] {
        let mut mac = [0; 6];
        mac.copy_from_slice(&self.buffer.as_ref()[field::SOURCE]);
        mac
    }

    /// The EtherType at bytes 12-13 (0x8100 when tagged).
    pub fn outer_ethertype(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::ETHERTYPE])
    }

    /// Whether an 802.1Q tag follows the source address.
    pub fn has_vlan(&self) -> bool {
        self.outer_ethertype() == ETHERTYPE_VLAN
    }

    /// The VLAN tag control information, if tagged.
    pub fn vlan_tci(&self) -> Option<u16> {
        self.has_vlan().then(|| be::u16(&self.buffer.as_ref()[field::VLAN_TCI]))
    }

    /// The EtherType of the payload (after the VLAN tag, if any).
    pub fn ethertype(&self) -> u16 {
        if self.has_vlan() {
            be::u16(&self.buffer.as_ref()[field::VLAN_ETHERTYPE])
        } else {
            self.outer_ethertype()
        }
    }

    /// Header length: 14, or 18 when tagged.
    pub fn header_len(&self) -> usize {
        if self.has_vlan() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the destination MAC address.
    pub fn set_destination(&mut self, mac: [u8; 6]) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&mac);
    }

    /// Sets the source MAC address.
    pub fn set_source(&mut self, mac: [u8; 6]) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&mac);
    }

    /// Sets bytes 12-13 (the TPID 0x8100 for a tagged frame). Changes the header length.
    pub fn set_outer_ethertype(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::ETHERTYPE], value);
    }

    /// Sets the VLAN TCI (only meaningful when the outer EtherType is 0x8100).
    pub fn set_vlan_tci(&mut self, tci: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::VLAN_TCI], tci);
    }

    /// Sets the payload EtherType: bytes 16-17 when tagged, else 12-13.
    pub fn set_ethertype(&mut self, value: u16) {
        let range = if self.has_vlan() {
            field::VLAN_ETHERTYPE
        } else {
            field::ETHERTYPE
        };
        be::set_u16(&mut self.buffer.as_mut()[range], value);
    }

    /// The bytes after the header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }
}

/// An 802.1Q VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    /// Decodes a tag control information word.
    pub const fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0FFF,
        }
    }

    /// Encodes the tag control information word (out-of-range bits are dropped).
    pub const fn tci(&self) -> u16 {
        ((self.pcp as u16 & 0x7) << 13) | ((self.dei as u16) << 12) | (self.vid & 0x0FFF)
    }
}

/// The semantic content of an Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination MAC address.
    pub destination: [u8; 6],
    /// Source MAC address.
    pub source: [u8; 6],
    /// The 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
    /// EtherType of the payload (after the tag).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Reads the header. Any EtherType is accepted; [`parse_frame`](super::parse_frame)
    /// requires IPv4 or IPv6 (a second tag, QinQ, is therefore not RoCEv2 to it).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than the header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<EthernetRepr, WireError> {
        packet.check_len()?;
        Ok(EthernetRepr {
            destination: packet.destination(),
            source: packet.source(),
            vlan: packet.vlan_tci().map(VlanTag::from_tci),
            ethertype: packet.ethertype(),
        })
    }

    /// Header length this repr emits: 14, or 18 with a VLAN tag.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header. An untagged repr whose `ethertype` is 0x8100 would read back as
    /// tagged; don't build one.
    ///
    /// # Panics
    /// If the buffer is shorter than [`EthernetRepr::header_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_destination(self.destination);
        packet.set_source(self.source);
        match self.vlan {
            Some(tag) => {
                packet.set_outer_ethertype(ETHERTYPE_VLAN);
                packet.set_vlan_tci(tag.tci());
                be::set_u16(&mut packet.buffer.as_mut()[field::VLAN_ETHERTYPE], self.ethertype);
            }
            None => packet.set_outer_ethertype(self.ethertype),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// Ethernet header of oracle test frame 1 (make_test_frames.py) + 2 payload bytes.
    const UNTAGGED: [u8; 16] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x45, 0x02,
    ];
    /// Hand-written: tagged, PCP 3, DEI 1, VID 0x123, IPv6.
    const TAGGED: [u8; 18] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x81, 0x00, 0x71, 0x23, 0x86, 0xdd,
    ];

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(packet.destination(), [2, 0, 0, 0, 0, 2]);
        assert_eq!(packet.source(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(packet.ethertype(), ETHERTYPE_IPV4);
        assert_eq!(packet.header_len(), 14);
        assert_eq!(packet.payload(), &[0x45, 0x02]);
        let repr = EthernetRepr::parse(&packet).unwrap();
        assert_eq!(repr.vlan, None);

        let packet = Packet::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(packet.outer_ethertype(), ETHERTYPE_VLAN);
        assert_eq!(packet.vlan_tci(), Some(0x7123));
        let repr = EthernetRepr::parse(&packet).unwrap();
        assert_eq!(
            repr,
            EthernetRepr {
                destination: [0xff; 6],
                source: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
                vlan: Some(VlanTag {
                    pcp: 3,
                    dei: true,
                    vid: 0x123
                }),
                ethertype: ETHERTYPE_IPV6,
            }
        );
        assert_eq!(repr.header_len(), 18);
    }

    #[test]
    fn emits_known_bytes() {
        let repr = EthernetRepr {
            destination: [0xff; 6],
            source: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            vlan: Some(VlanTag {
                pcp: 3,
                dei: true,
                vid: 0x123,
            }),
            ethertype: ETHERTYPE_IPV6,
        };
        let mut bytes = [0xAAu8; 18];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, TAGGED);

        let repr = EthernetRepr {
            destination: [2, 0, 0, 0, 0, 2],
            source: [2, 0, 0, 0, 0, 1],
            vlan: None,
            ethertype: ETHERTYPE_IPV4,
        };
        let mut bytes = [0u8; 14];
        repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes[..], UNTAGGED[..14]);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xE7E7);
        for _ in 0..1000 {
            let repr = EthernetRepr {
                destination: rng.bytes(),
                source: rng.bytes(),
                vlan: rng.bool().then(|| VlanTag::from_tci(rng.u16())),
                // Anything but the TPID, which would read back as a second tag.
                ethertype: rng.u16() & 0x7FFF,
            };
            let mut bytes = [0u8; 18];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..repr.header_len()]));
            let parsed = EthernetRepr::parse(&Packet::new_checked(&bytes[..repr.header_len()]).unwrap()).unwrap();
            assert_eq!(parsed, repr);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for bytes in [&UNTAGGED[..14], &TAGGED[..]] {
            for len in 0..bytes.len() {
                assert!(
                    matches!(
                        Packet::new_checked(&bytes[..len]),
                        Err(WireError::Truncated { layer: "Ethernet", .. })
                    ),
                    "length {len}"
                );
            }
        }
    }
}
