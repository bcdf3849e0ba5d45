//! Sense data: what went wrong with a command that ended in CHECK CONDITION. The target
//! sends fixed format (response code 0x70, 18 bytes, what Linux and LIO use by default);
//! the initiator also reads descriptor format (0x72).

use super::{check_len, WireError};

/// Bytes of fixed-format sense data as sent here.
pub const FIXED_SENSE_LEN: usize = 18;

/// A sense key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenseKey {
    /// NO SENSE.
    NoSense,
    /// RECOVERED ERROR.
    RecoveredError,
    /// NOT READY.
    NotReady,
    /// MEDIUM ERROR.
    MediumError,
    /// HARDWARE ERROR.
    HardwareError,
    /// ILLEGAL REQUEST.
    IllegalRequest,
    /// UNIT ATTENTION.
    UnitAttention,
    /// DATA PROTECT.
    DataProtect,
    /// ABORTED COMMAND.
    AbortedCommand,
    /// Another key.
    Other(u8),
}

impl SenseKey {
    /// The 4-bit code.
    pub fn code(self) -> u8 {
        match self {
            Self::NoSense => 0x0,
            Self::RecoveredError => 0x1,
            Self::NotReady => 0x2,
            Self::MediumError => 0x3,
            Self::HardwareError => 0x4,
            Self::IllegalRequest => 0x5,
            Self::UnitAttention => 0x6,
            Self::DataProtect => 0x7,
            Self::AbortedCommand => 0xB,
            Self::Other(code) => code & 0x0F,
        }
    }
    /// From the 4-bit code.
    pub fn from_code(code: u8) -> Self {
        match code & 0x0F {
            0x0 => Self::NoSense,
            0x1 => Self::RecoveredError,
            0x2 => Self::NotReady,
            0x3 => Self::MediumError,
            0x4 => Self::HardwareError,
            0x5 => Self::IllegalRequest,
            0x6 => Self::UnitAttention,
            0x7 => Self::DataProtect,
            0xB => Self::AbortedCommand,
            other => Self::Other(other),
        }
    }
}

/// Sense data: key, additional sense code and qualifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SenseData {
    /// Sense key.
    pub key: SenseKey,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// Sense-key specific bytes 15..18 of fixed format (SKSV in bit 7 of the first),
    /// e.g. the field pointer of an invalid CDB field.
    pub sense_key_specific: Option<[u8; 3]>,
}

impl SenseData {
    /// Sense with `key`, `asc`, `ascq`.
    pub const fn new(key: SenseKey, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            sense_key_specific: None,
        }
    }
    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE (20/00).
    pub const INVALID_OPCODE: Self = Self::new(SenseKey::IllegalRequest, 0x20, 0x00);
    /// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE (21/00).
    pub const LBA_OUT_OF_RANGE: Self = Self::new(SenseKey::IllegalRequest, 0x21, 0x00);
    /// ILLEGAL REQUEST, INVALID FIELD IN CDB (24/00).
    pub const INVALID_FIELD_IN_CDB: Self = Self::new(SenseKey::IllegalRequest, 0x24, 0x00);
    /// ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED (25/00).
    pub const LUN_NOT_SUPPORTED: Self = Self::new(SenseKey::IllegalRequest, 0x25, 0x00);
    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST (26/00).
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Self = Self::new(SenseKey::IllegalRequest, 0x26, 0x00);
    /// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR (1A/00).
    pub const PARAMETER_LIST_LENGTH_ERROR: Self = Self::new(SenseKey::IllegalRequest, 0x1A, 0x00);
    /// MEDIUM ERROR, UNRECOVERED READ ERROR (11/00).
    pub const UNRECOVERED_READ_ERROR: Self = Self::new(SenseKey::MediumError, 0x11, 0x00);
    /// MEDIUM ERROR, WRITE ERROR (0C/00).
    pub const WRITE_ERROR: Self = Self::new(SenseKey::MediumError, 0x0C, 0x00);
    /// HARDWARE ERROR, INTERNAL TARGET FAILURE (44/00).
    pub const INTERNAL_TARGET_FAILURE: Self = Self::new(SenseKey::HardwareError, 0x44, 0x00);
    /// ABORTED COMMAND, INITIATOR DETECTED ERROR MESSAGE RECEIVED (48/00) — data the
    /// initiator described could not be reached.
    pub const DATA_TRANSFER_FAILED: Self = Self::new(SenseKey::AbortedCommand, 0x4B, 0x00);
    /// UNIT ATTENTION, POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29/00).
    pub const POWER_ON_RESET: Self = Self::new(SenseKey::UnitAttention, 0x29, 0x00);
    /// NO SENSE.
    pub const NONE: Self = Self::new(SenseKey::NoSense, 0, 0);

    /// INVALID FIELD IN CDB pointing at byte `byte` (bit `bit`) of the CDB.
    pub fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Self {
        let [hi, lo] = byte.to_be_bytes();
        let bits = bit.map_or(0, |b| 0x08 | (b & 7));
        Self {
            sense_key_specific: Some([0x80 | 0x40 | bits, hi, lo]),
            ..Self::INVALID_FIELD_IN_CDB
        }
    }

    /// Writes fixed-format sense (current error, 18 bytes).
    ///
    /// # Panics
    /// If `out` is shorter than 18 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        out[..FIXED_SENSE_LEN].fill(0);
        out[0] = 0x70;
        out[2] = self.key.code();
        out[7] = (FIXED_SENSE_LEN - 8) as u8;
        out[12] = self.asc;
        out[13] = self.ascq;
        if let Some(sks) = self.sense_key_specific {
            out[15..18].copy_from_slice(&sks);
        }
    }

    /// As fixed-format bytes.
    pub fn to_bytes(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut out = [0u8; FIXED_SENSE_LEN];
        self.emit(&mut out);
        out
    }

    /// Reads fixed (0x70/0x71) or descriptor (0x72/0x73) format sense.
    ///
    /// # Errors
    /// Truncated input or an unknown response code.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("sense data", 1, bytes.len())?;
        match bytes[0] & 0x7F {
            0x70 | 0x71 => {
                check_len("fixed sense data", 14, bytes.len())?;
                let sense_key_specific = (bytes.len() >= 18 && bytes[15] & 0x80 != 0).then(|| {
                    let mut sks = [0u8; 3];
                    sks.copy_from_slice(&bytes[15..18]);
                    sks
                });
                Ok(Self {
                    key: SenseKey::from_code(bytes[2]),
                    asc: bytes[12],
                    ascq: bytes[13],
                    sense_key_specific,
                })
            }
            0x72 | 0x73 => {
                check_len("descriptor sense data", 4, bytes.len())?;
                Ok(Self::new(SenseKey::from_code(bytes[1]), bytes[2], bytes[3]))
            }
            other => Err(WireError::Malformed {
                format: "sense data",
                field: "response code",
                value: u64::from(other),
            }),
        }
    }
}

impl std::fmt::Display for SenseData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {:02x}/{:02x}", self.key, self.asc, self.ascq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_and_parses_known_fixed_sense() {
        let known = [0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x21, 0, 0, 0, 0, 0];
        assert_eq!(SenseData::LBA_OUT_OF_RANGE.to_bytes(), known);
        assert_eq!(SenseData::parse(&known).unwrap(), SenseData::LBA_OUT_OF_RANGE);
    }

    #[test]
    fn field_pointers_round_trip() {
        let sense = SenseData::invalid_cdb_field(2, Some(5));
        let bytes = sense.to_bytes();
        assert_eq!(&bytes[15..18], &[0xCD, 0, 2]);
        assert_eq!(SenseData::parse(&bytes).unwrap(), sense);
    }

    #[test]
    fn reads_descriptor_format_and_refuses_garbage() {
        let descriptor = [0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0];
        assert_eq!(SenseData::parse(&descriptor).unwrap(), SenseData::POWER_ON_RESET);
        assert!(SenseData::parse(&[]).is_err());
        assert!(SenseData::parse(&[0x70; 13]).is_err());
        assert!(SenseData::parse(&[0x72; 3]).is_err());
        assert!(SenseData::parse(&[0x10; 18]).is_err());
    }
}
