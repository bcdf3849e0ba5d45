//! SCSI for block storage: the CDBs, sense data and parameter data a Linux initiator
//! uses with a disk (SPC-4/SBC-3; storage-and-cm.md C.7), and [`LogicalUnit`], the
//! block target that executes them against a [`crate::block::BlockDevice`].
//!
//! | Module | What |
//! |---|---|
//! | [`cdb`] | command descriptor blocks, parsed into [`cdb::Cdb`] and built back |
//! | [`sense`] | fixed-format sense data (descriptor format parsed too) |
//! | [`data`] | INQUIRY standard data and VPD pages, READ CAPACITY(10/16) data, MODE SENSE pages, REPORT LUNS, UNMAP parameter lists |
//! | [`lu`] | the logical unit: a command in, data and status out |
//!
//! Everything is big-endian. Parsers never panic on any input: [`cdb::parse_cdb`] is a
//! fuzz entry point.

pub mod cdb;
pub mod data;
pub mod lu;
pub mod sense;

pub use cdb::{parse_cdb, Cdb};
pub use lu::{DataDirection, LogicalUnit, LuConfig, ScsiOutcome};
pub use sense::{SenseData, SenseKey};

/// SCSI status codes.
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION (sense data follows).
    pub const CHECK_CONDITION: u8 = 0x02;
    /// BUSY.
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
    /// TASK ABORTED.
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Why bytes do not parse as a SCSI format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the format needs.
    #[error("{format}: truncated, need {needed} bytes, have {available}")]
    Truncated {
        /// Format name.
        format: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        available: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("{format}: invalid {field} {value:#x}")]
    Malformed {
        /// Format name.
        format: &'static str,
        /// Field name.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}

pub(crate) fn check_len(format: &'static str, needed: usize, available: usize) -> Result<(), WireError> {
    if available < needed {
        Err(WireError::Truncated {
            format,
            needed,
            available,
        })
    } else {
        Ok(())
    }
}

pub(crate) use crate::srp::wire::be;

/// Writes `value` into `field`, space-padded (INQUIRY's ASCII fields).
pub(crate) fn space_padded(field: &mut [u8], value: &str) {
    field.fill(b' ');
    let n = value.len().min(field.len());
    field[..n].copy_from_slice(&value.as_bytes()[..n]);
}

/// Reads a space-padded ASCII field, trailing spaces and NULs removed.
pub(crate) fn parse_space_padded(field: &[u8]) -> String {
    String::from_utf8_lossy(field).trim_end_matches([' ', '\0']).to_string()
}

/// The 8-byte SAM LUN of a LUN number (peripheral addressing below 256, flat space
/// addressing up to 16383), as the SRP_CMD carries it.
pub fn encode_lun(lun: u16) -> u64 {
    if lun < 256 {
        u64::from(lun) << 48
    } else {
        (0x4000 | u64::from(lun & 0x3FFF)) << 48
    }
}

/// The LUN number of an 8-byte SAM LUN: peripheral (`00 nn`) or flat space (`4x xx`)
/// addressing of the first level, the other levels zero; anything else is `None`.
pub fn decode_lun(lun: u64) -> Option<u16> {
    if lun & 0x0000_FFFF_FFFF_FFFF != 0 {
        return None;
    }
    let first = (lun >> 48) as u16;
    match first >> 14 {
        0 if first >> 8 == 0 => Some(first & 0xFF),
        1 => Some(first & 0x3FFF),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luns_encode_as_linux_int_to_scsilun_does() {
        assert_eq!(encode_lun(0), 0);
        assert_eq!(encode_lun(1).to_be_bytes(), [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_lun(300).to_be_bytes(), [0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
        for lun in [0u16, 1, 255, 256, 16383] {
            assert_eq!(decode_lun(encode_lun(lun)), Some(lun));
        }
        assert_eq!(decode_lun(0x0100_0000_0000_0000), None); // bus 1
        assert_eq!(decode_lun(0x0001_0001_0000_0000), None); // second level
        assert_eq!(decode_lun(0x8000_0000_0000_0000), None); // logical unit addressing
    }
}
