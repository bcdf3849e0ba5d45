//! Base transport header (roce-wire §1.2), 12 bytes, and PSN arithmetic (§1.7).
//!
//! ```text
//! byte 0     OpCode
//! byte 1     SE(7) M(6) PadCnt(5:4) TVer(3:0)
//! bytes 2-3  P_Key
//! byte 4     FECN(7) BECN(6) resv6(5:0)     -- "resv8a", masked out of the ICRC
//! bytes 5-7  DestQP
//! byte 8     AckReq(7) resv7(6:0)
//! bytes 9-11 PSN
//! ```

use core::cmp::Ordering;

use super::opcode::BthOpcode;
use super::{be, check_len, WireError};

/// Header length.
pub const HEADER_LEN: usize = 12;
/// PSNs and QPNs are 24-bit.
pub const PSN_MASK: u32 = 0x00FF_FFFF;
/// The default partition key (full member, P_Key 0x7FFF).
pub const DEFAULT_PARTITION_KEY: u16 = 0xFFFF;

mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    /// SE, M, PadCnt, TVer.
    pub const FLAGS: usize = 1;
    pub const PARTITION_KEY: Range<usize> = 2..4;
    /// FECN, BECN, resv6 ("resv8a").
    pub const RESV8A: usize = 4;
    pub const DESTINATION_QP: Range<usize> = 5..8;
    /// AckReq, resv7.
    pub const ACK_REQUEST: usize = 8;
    pub const PSN: Range<usize> = 9..12;
}

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const TVER: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const RESV6: u8 = 0x3F;
const ACK_REQ: u8 = 0x80;
const RESV7: u8 = 0x7F;

/// Byte offset of the masked "resv8a" byte (FECN, BECN, resv6) within the BTH.
pub const RESV8A_OFFSET: usize = field::RESV8A;

/// Signed distance `a - b` between two 24-bit PSNs in the half-space sense (rxe
/// `psn_compare`): positive if `a` is after `b`, within ±2^23.
#[inline]
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    (a.wrapping_sub(b) << 8) as i32 >> 8
}

/// Orders two 24-bit PSNs modulo 2^24 with the half-space rule.
#[inline]
pub fn psn_cmp(a: u32, b: u32) -> Ordering {
    psn_diff(a, b).cmp(&0)
}

/// `psn + n` modulo 2^24.
#[inline]
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// A read/write view of a BTH and what follows it.
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

    /// Ensures that no accessor panics: the buffer holds 12 bytes.
    pub fn check_len(&self) -> Result<(), WireError> {
        check_len("BTH", HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// OpCode.
    pub fn opcode(&self) -> BthOpcode {
        BthOpcode(self.buffer.as_ref()[field::OPCODE])
    }

    /// SE: solicited event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }

    /// M: migration request.
    pub fn migration(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }

    /// PadCnt: pad bytes (0-3) after the payload.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> PAD_SHIFT) & 0x3
    }

    /// TVer: transport header version (must be 0).
    pub fn transport_version(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER
    }

    /// P_Key.
    pub fn partition_key(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::PARTITION_KEY])
    }

    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & FECN != 0
    }

    /// BECN: backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & BECN != 0
    }

    /// The 6 reserved bits of byte 4.
    pub fn resv6(&self) -> u8 {
        self.buffer.as_ref()[field::RESV8A] & RESV6
    }

    /// DestQP (24 bits).
    pub fn destination_qp(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::DESTINATION_QP])
    }

    /// A: acknowledge request.
    pub fn ack_request(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQUEST] & ACK_REQ != 0
    }

    /// The 7 reserved bits of byte 8.
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQUEST] & RESV7
    }

    /// PSN (24 bits).
    pub fn psn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::PSN])
    }

    /// The bytes after the BTH.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the OpCode.
    pub fn set_opcode(&mut self, opcode: BthOpcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode.0;
    }

    /// Sets byte 1: SE, M, PadCnt (2 bits), TVer (4 bits); extra bits are dropped.
    pub fn set_flags(&mut self, solicited: bool, migration: bool, pad_count: u8, transport_version: u8) {
        self.buffer.as_mut()[field::FLAGS] = if solicited { SE } else { 0 }
            | if migration { MIG_REQ } else { 0 }
            | ((pad_count & 0x3) << PAD_SHIFT)
            | (transport_version & TVER);
    }

    /// Sets PadCnt only.
    pub fn set_pad_count(&mut self, pad_count: u8) {
        let byte = &mut self.buffer.as_mut()[field::FLAGS];
        *byte = (*byte & !(0x3 << PAD_SHIFT)) | ((pad_count & 0x3) << PAD_SHIFT);
    }

    /// Sets the P_Key.
    pub fn set_partition_key(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::PARTITION_KEY], value);
    }

    /// Sets byte 4: FECN, BECN and resv6 = 0.
    pub fn set_congestion(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::RESV8A] = if fecn { FECN } else { 0 } | if becn { BECN } else { 0 };
    }

    /// Sets the DestQP (low 24 bits of `qpn`).
    pub fn set_destination_qp(&mut self, qpn: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::DESTINATION_QP], qpn);
    }

    /// Sets AckReq, and resv7 = 0.
    pub fn set_ack_request(&mut self, value: bool) {
        self.buffer.as_mut()[field::ACK_REQUEST] = if value { ACK_REQ } else { 0 };
    }

    /// Sets the PSN (low 24 bits of `psn`).
    pub fn set_psn(&mut self, psn: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::PSN], psn);
    }

    /// The bytes after the BTH, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// The semantic content of a BTH (reserved bits are dropped on parse and zero on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: BthOpcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request.
    pub migration: bool,
    /// PadCnt (0-3). Ignored by [`emit_frame`](super::emit_frame), which derives it from the
    /// payload length.
    pub pad_count: u8,
    /// TVer (0 for every current transport; [`parse_frame`](super::parse_frame) rejects others).
    pub transport_version: u8,
    /// P_Key.
    pub partition_key: u16,
    /// FECN (masked out of the ICRC; switches may set it).
    pub fecn: bool,
    /// BECN (masked out of the ICRC).
    pub becn: bool,
    /// DestQP (24 bits).
    pub destination_qp: u32,
    /// AckReq.
    pub ack_request: bool,
    /// PSN (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// A BTH with the default P_Key 0xFFFF and every flag clear.
    pub const fn new(opcode: BthOpcode, destination_qp: u32, psn: u32) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            migration: false,
            pad_count: 0,
            transport_version: 0,
            partition_key: DEFAULT_PARTITION_KEY,
            fecn: false,
            becn: false,
            destination_qp,
            ack_request: false,
            psn,
        }
    }

    /// Reads the header. No semantic check: any opcode and TVer are accepted here
    /// ([`parse_frame`](super::parse_frame) checks both).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 12 bytes.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<BthRepr, WireError> {
        packet.check_len()?;
        // A view of exactly the header: with its length a constant, the field reads below
        // need no bounds check each.
        let header = Packet::new_unchecked(&packet.buffer.as_ref()[..HEADER_LEN]);
        Ok(BthRepr {
            opcode: header.opcode(),
            solicited: header.solicited(),
            migration: header.migration(),
            pad_count: header.pad_count(),
            transport_version: header.transport_version(),
            partition_key: header.partition_key(),
            fecn: header.fecn(),
            becn: header.becn(),
            destination_qp: header.destination_qp(),
            ack_request: header.ack_request(),
            psn: header.psn(),
        })
    }

    /// Header length: always 12.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header, reserved bits zero. DestQP and PSN wider than 24 bits and PadCnt
    /// above 3 are caller bugs (debug assertions; masked in release builds).
    ///
    /// # Panics
    /// If the buffer is shorter than 12 bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        debug_assert!(
            self.destination_qp <= PSN_MASK,
            "DestQP {:#x} wider than 24 bits",
            self.destination_qp
        );
        debug_assert!(self.psn <= PSN_MASK, "PSN {:#x} wider than 24 bits", self.psn);
        debug_assert!(self.pad_count <= 3, "PadCnt {} above 3", self.pad_count);
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.migration, self.pad_count, self.transport_version);
        packet.set_partition_key(self.partition_key);
        packet.set_congestion(self.fecn, self.becn);
        packet.set_destination_qp(self.destination_qp);
        packet.set_ack_request(self.ack_request);
        packet.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// BTH of oracle test frame 3 (make_test_frames.py): RC SEND ONLY, PadCnt 1, DestQP 0x11,
    /// AckReq, PSN 0xFFFFFF; then 3 payload bytes and 1 pad byte.
    const SEND_ONLY: [u8; 16] = [
        0x04, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0xff, 0xff, 0xff, b'a', b'b', b'c', 0x00,
    ];

    fn send_only_repr() -> BthRepr {
        BthRepr {
            pad_count: 1,
            ack_request: true,
            ..BthRepr::new(BthOpcode::RC_SEND_ONLY, 0x11, 0xFF_FFFF)
        }
    }

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&SEND_ONLY[..]).unwrap();
        assert_eq!(packet.opcode(), BthOpcode::RC_SEND_ONLY);
        assert_eq!(packet.pad_count(), 1);
        assert_eq!(packet.psn(), 0xFF_FFFF);
        assert_eq!(packet.payload(), b"abc\0");
        assert_eq!(BthRepr::parse(&packet).unwrap(), send_only_repr());

        // Hand-written: every flag set, FECN+BECN+resv6, resv7.
        let bytes = [0x65, 0xFF, 0x12, 0x34, 0xFF, 0xAB, 0xCD, 0xEF, 0xFF, 0x01, 0x02, 0x03];
        let packet = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!((packet.resv6(), packet.resv7()), (0x3F, 0x7F));
        assert_eq!(
            BthRepr::parse(&packet).unwrap(),
            BthRepr {
                opcode: BthOpcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                solicited: true,
                migration: true,
                pad_count: 3,
                transport_version: 0xF,
                partition_key: 0x1234,
                fecn: true,
                becn: true,
                destination_qp: 0xABCDEF,
                ack_request: true,
                psn: 0x010203,
            }
        );
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xEEu8; 12];
        send_only_repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, SEND_ONLY[..12]);
    }

    #[test]
    fn parse_reads_what_the_field_accessors_read_and_rejects_short_buffers() {
        let mut rng = XorShift::new(0xB7B7);
        for _ in 0..2000 {
            let mut bytes = [0u8; 20];
            rng.fill(&mut bytes);
            let len = rng.below(bytes.len() + 1);
            let packet = Packet::new_unchecked(&bytes[..len]);
            let parsed = BthRepr::parse(&packet);
            if len < HEADER_LEN {
                assert!(
                    matches!(parsed, Err(WireError::Truncated { .. })),
                    "length {len}: {parsed:?}"
                );
                continue;
            }
            let expected = BthRepr {
                opcode: packet.opcode(),
                solicited: packet.solicited(),
                migration: packet.migration(),
                pad_count: packet.pad_count(),
                transport_version: packet.transport_version(),
                partition_key: packet.partition_key(),
                fecn: packet.fecn(),
                becn: packet.becn(),
                destination_qp: packet.destination_qp(),
                ack_request: packet.ack_request(),
                psn: packet.psn(),
            };
            assert_eq!(parsed, Ok(expected), "length {len}");
        }
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xB7);
        for _ in 0..1000 {
            let repr = BthRepr {
                opcode: BthOpcode(rng.u8()),
                solicited: rng.bool(),
                migration: rng.bool(),
                pad_count: rng.u8() & 3,
                transport_version: rng.u8() & 0xF,
                partition_key: rng.u16(),
                fecn: rng.bool(),
                becn: rng.bool(),
                destination_qp: rng.u32() & PSN_MASK,
                ack_request: rng.bool(),
                psn: rng.u32() & PSN_MASK,
            };
            let mut bytes = [0u8; 12];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(BthRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..HEADER_LEN {
            assert!(
                matches!(
                    Packet::new_checked(&SEND_ONLY[..len]),
                    Err(WireError::Truncated { layer: "BTH", .. })
                ),
                "length {len}"
            );
        }
    }

    #[test]
    fn psn_arithmetic_wraps() {
        assert_eq!(psn_add(0xFF_FFFF, 1), 0);
        assert_eq!(psn_diff(0, 0xFF_FFFF), 1);
        assert_eq!(psn_diff(0xFF_FFFF, 0), -1);
        assert_eq!(psn_cmp(5, 5), Ordering::Equal);
        assert_eq!(psn_cmp(0x10, 0xFF_FFF0), Ordering::Greater);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
        assert_eq!(psn_diff(0x7F_FFFF, 0), 0x7F_FFFF);
    }
}
