//! ACK extended transport header (roce-wire §1.3, §1.5), 4 bytes: syndrome and MSN. On
//! Acknowledge, ATOMIC Acknowledge and RDMA READ Response First/Last/Only.
//!
//! Syndrome: bit 7 reserved (0); bits 6:5 type — 00 ACK, 01 RNR NAK, 10 reserved, 11 NAK;
//! bits 4:0 the credit code, RNR timer code or NAK code.

use super::{be, fixed_header_view, WireError};

/// Header length.
pub const HEADER_LEN: usize = 4;
/// MSNs are 24-bit.
pub const MSN_MASK: u32 = 0x00FF_FFFF;
/// ACK credit code meaning "no credit information / unlimited" (what rxe always sends).
pub const UNLIMITED_CREDITS: u8 = 31;

mod field {
    use core::ops::Range;
    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

const TYPE_MASK: u8 = 0xE0;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1F;

/// Credits per ACK credit code 0-30 (§1.5); code 31 means unlimited.
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
    8192, 12288, 16384, 24576, 32768,
];

/// Minimum RNR wait in microseconds per RNR timer code 0-31 (§1.5; code 0 is the longest).
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

/// Credits granted by an ACK credit code: `None` for 31 (no credit information, unlimited)
/// and for values above 31.
pub fn credit_count(code: u8) -> Option<u32> {
    CREDITS.get(usize::from(code)).copied()
}

/// The largest credit code (0-30) whose credit count does not exceed `available` receive
/// WQEs.
pub fn credit_code_for(available: u32) -> u8 {
    CREDITS.iter().rposition(|&c| c <= available).unwrap_or(0) as u8
}

/// Minimum wait in microseconds for an RNR NAK timer code (low 5 bits of `code` are used).
pub fn rnr_timer_us(code: u8) -> u32 {
    RNR_TIMER_US[usize::from(code & VALUE_MASK)]
}

/// NAK codes (syndrome 0x60 | code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: go back to the NAK's PSN.
    PsnSequenceError = 0,
    /// Invalid request.
    InvalidRequest = 1,
    /// Remote access error (R_Key, range, permissions).
    RemoteAccessError = 2,
    /// Remote operational error.
    RemoteOperationalError = 3,
    /// Invalid RD request.
    InvalidRdRequest = 4,
}

impl NakCode {
    /// The code for a 5-bit NAK value; `None` for the reserved values 5-31.
    pub const fn from_code(code: u8) -> Option<NakCode> {
        match code {
            0 => Some(NakCode::PsnSequenceError),
            1 => Some(NakCode::InvalidRequest),
            2 => Some(NakCode::RemoteAccessError),
            3 => Some(NakCode::RemoteOperationalError),
            4 => Some(NakCode::InvalidRdRequest),
            _ => None,
        }
    }
}

/// What an AETH syndrome means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// Positive acknowledgement; `credits` is the 5-bit credit code (see [`credit_count`]).
    Ack {
        /// Credit code 0-31 (31 = unlimited).
        credits: u8,
    },
    /// Receiver not ready; `timer` is the 5-bit RNR timer code (see [`rnr_timer_us`]).
    RnrNak {
        /// RNR timer code 0-31.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A reserved syndrome (bit 7 set, type 10, or NAK code 5-31); rxe treats unknown NAKs
    /// as remote operational errors.
    Reserved(u8),
}

fixed_header_view!("AETH", 4);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Syndrome.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// MSN (24 bits).
    pub fn msn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, value: u8) {
        self.buffer.as_mut()[field::SYNDROME] = value;
    }

    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::MSN], value);
    }
}

/// The semantic content of an AETH: the raw syndrome (see [`AethRepr::kind`]) and the MSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome byte.
    pub syndrome: u8,
    /// MSN: the responder's count of completed messages (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// An ACK with a credit code (0-31; 31 = unlimited, [`UNLIMITED_CREDITS`]).
    pub const fn ack(credits: u8, msn: u32) -> AethRepr {
        AethRepr {
            syndrome: TYPE_ACK | (credits & VALUE_MASK),
            msn,
        }
    }

    /// A NAK.
    pub const fn nak(code: NakCode, msn: u32) -> AethRepr {
        AethRepr {
            syndrome: TYPE_NAK | code as u8,
            msn,
        }
    }

    /// An RNR NAK with an RNR timer code (0-31).
    pub const fn rnr_nak(timer: u8, msn: u32) -> AethRepr {
        AethRepr {
            syndrome: TYPE_RNR_NAK | (timer & VALUE_MASK),
            msn,
        }
    }

    /// Decodes the syndrome.
    pub const fn kind(&self) -> AethKind {
        let value = self.syndrome & VALUE_MASK;
        match self.syndrome & TYPE_MASK {
            TYPE_ACK => AethKind::Ack { credits: value },
            TYPE_RNR_NAK => AethKind::RnrNak { timer: value },
            TYPE_NAK => match NakCode::from_code(value) {
                Some(code) => AethKind::Nak(code),
                None => AethKind::Reserved(self.syndrome),
            },
            _ => AethKind::Reserved(self.syndrome),
        }
    }

    /// Whether this is a positive ACK.
    pub const fn is_ack(&self) -> bool {
        matches!(self.kind(), AethKind::Ack { .. })
    }

    /// Reads the header. Reserved syndromes are accepted (see [`AethKind::Reserved`]).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if the buffer is shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<AethRepr, WireError> {
        packet.check_len()?;
        Ok(AethRepr {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Header length: always 4.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header. An MSN wider than 24 bits is a caller bug (debug assertion;
    /// masked in release builds).
    ///
    /// # Panics
    /// If the buffer is shorter than 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        debug_assert!(self.msn <= MSN_MASK, "MSN {:#x} wider than 24 bits", self.msn);
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// AETH of oracle test frame 4 (make_test_frames.py): ACK, unlimited credits, MSN 1.
    const ACK: [u8; 4] = [0x1f, 0x00, 0x00, 0x01];

    #[test]
    fn parses_known_bytes() {
        let packet = Packet::new_checked(&ACK[..]).unwrap();
        assert_eq!(packet.syndrome(), 0x1f);
        assert_eq!(packet.msn(), 1);
        let repr = AethRepr::parse(&packet).unwrap();
        assert_eq!(repr, AethRepr::ack(UNLIMITED_CREDITS, 1));
        assert_eq!(repr.kind(), AethKind::Ack { credits: 31 });
        // The syndromes tshark decoded in roce2.pcap (roce-wire §3.3): 96, 98, 46.
        let parse = |b: [u8; 4]| AethRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(parse([0x60, 0, 0, 7]).kind(), AethKind::Nak(NakCode::PsnSequenceError));
        assert_eq!(parse([0x62, 0, 0, 7]).kind(), AethKind::Nak(NakCode::RemoteAccessError));
        assert_eq!(
            parse([0x2e, 0xAB, 0xCD, 0xEF]),
            AethRepr {
                syndrome: 0x2e,
                msn: 0xABCDEF
            }
        );
        assert_eq!(parse([0x2e, 0, 0, 0]).kind(), AethKind::RnrNak { timer: 14 });
        assert_eq!(parse([0x65, 0, 0, 0]).kind(), AethKind::Reserved(0x65));
        assert_eq!(parse([0x40, 0, 0, 0]).kind(), AethKind::Reserved(0x40));
        assert_eq!(parse([0x9f, 0, 0, 0]).kind(), AethKind::Reserved(0x9f));
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = [0xEEu8; 4];
        AethRepr::ack(UNLIMITED_CREDITS, 1).emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, ACK);
        AethRepr::nak(NakCode::RemoteAccessError, 0x123456).emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, [0x62, 0x12, 0x34, 0x56]);
        AethRepr::rnr_nak(14, 2).emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, [0x2e, 0, 0, 2]);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xAE7);
        for _ in 0..1000 {
            let repr = AethRepr {
                syndrome: rng.u8(),
                msn: rng.u32() & MSN_MASK,
            };
            let mut bytes = [0u8; 4];
            repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(
                AethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap(),
                repr
            );
        }
        for code in [
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ] {
            assert_eq!(AethRepr::nak(code, 0).kind(), AethKind::Nak(code));
        }
        for v in 0..32 {
            assert_eq!(AethRepr::ack(v, 0).kind(), AethKind::Ack { credits: v });
            assert_eq!(AethRepr::rnr_nak(v, 0).kind(), AethKind::RnrNak { timer: v });
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..HEADER_LEN {
            assert!(
                matches!(
                    Packet::new_checked(&ACK[..len]),
                    Err(WireError::Truncated { layer: "AETH", .. })
                ),
                "length {len}"
            );
        }
    }

    #[test]
    fn credit_and_timer_tables() {
        assert_eq!(credit_count(0), Some(0));
        assert_eq!(credit_count(5), Some(6));
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(credit_count(UNLIMITED_CREDITS), None);
        assert_eq!(credit_code_for(0), 0);
        assert_eq!(credit_code_for(7), 5);
        assert_eq!(credit_code_for(100_000), 30);
        for code in 0..31 {
            assert_eq!(credit_code_for(credit_count(code).unwrap()), code);
        }
        assert_eq!(rnr_timer_us(0), 655_360);
        assert_eq!(rnr_timer_us(14), 1_280);
        assert_eq!(rnr_timer_us(25), 61_440);
        assert_eq!(rnr_timer_us(31), 491_520);
    }
}
