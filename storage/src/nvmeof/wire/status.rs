//! The status field of a completion (CQE bytes 14–15 without the phase bit): status code
//! type (SCT), status code (SC), command retry delay (CRD), More and Do Not Retry (DNR).
//! The codes are those of storage-and-cm.md B.6 and B.12.

use std::fmt;

/// Status code types.
pub mod sct {
    /// Generic command status.
    pub const GENERIC: u8 = 0;
    /// Command specific status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = 2;
    /// Path related status.
    pub const PATH: u8 = 3;
}

/// A completion status. `Status::SUCCESS` is all zeroes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status code type (3 bits).
    pub sct: u8,
    /// Status code.
    pub sc: u8,
    /// Command retry delay index (2 bits).
    pub crd: u8,
    /// More status information in the error log page.
    pub more: bool,
    /// Do not retry: the same command would fail again.
    pub dnr: bool,
}

macro_rules! statuses {
    ($($(#[$doc:meta])* $name:ident = ($sct:expr, $sc:expr, $dnr:expr);)*) => {
        impl Status {
            $($(#[$doc])* pub const $name: Status = Status { sct: $sct, sc: $sc, crd: 0, more: false, dnr: $dnr };)*
        }

        /// The name of a known (SCT, SC) pair.
        fn known_name(sct: u8, sc: u8) -> Option<&'static str> {
            $(if sct == $sct && sc == $sc { return Some(stringify!($name)); })*
            None
        }
    };
}

statuses! {
    /// Generic 0x00: the command completed successfully.
    SUCCESS = (sct::GENERIC, 0x00, false);
    /// Generic 0x01: the opcode is not supported on this queue.
    INVALID_OPCODE = (sct::GENERIC, 0x01, true);
    /// Generic 0x02: a field of the command is invalid.
    INVALID_FIELD = (sct::GENERIC, 0x02, true);
    /// Generic 0x03: the command identifier is in use by an outstanding command.
    COMMAND_ID_CONFLICT = (sct::GENERIC, 0x03, true);
    /// Generic 0x04: moving the command's data failed.
    DATA_TRANSFER_ERROR = (sct::GENERIC, 0x04, false);
    /// Generic 0x06: the controller failed internally (a backend I/O error).
    INTERNAL_ERROR = (sct::GENERIC, 0x06, false);
    /// Generic 0x07: aborted by an Abort command.
    ABORTED_BY_REQUEST = (sct::GENERIC, 0x07, false);
    /// Generic 0x08: aborted because its queue was deleted.
    ABORTED_SQ_DELETION = (sct::GENERIC, 0x08, false);
    /// Generic 0x0B: the namespace or format is invalid.
    INVALID_NAMESPACE_OR_FORMAT = (sct::GENERIC, 0x0B, true);
    /// Generic 0x0C: the command violates the command sequence (e.g. before Connect or
    /// while the controller is disabled).
    COMMAND_SEQUENCE_ERROR = (sct::GENERIC, 0x0C, true);
    /// Generic 0x0D: an SGL segment descriptor is invalid.
    INVALID_SGL_SEGMENT_DESCRIPTOR = (sct::GENERIC, 0x0D, true);
    /// Generic 0x0E: more SGL descriptors than allowed.
    INVALID_NUMBER_OF_SGL_DESCRIPTORS = (sct::GENERIC, 0x0E, true);
    /// Generic 0x0F: the SGL's length does not match the command's transfer.
    DATA_SGL_LENGTH_INVALID = (sct::GENERIC, 0x0F, true);
    /// Generic 0x11: the SGL descriptor type is not supported here.
    SGL_DESCRIPTOR_TYPE_INVALID = (sct::GENERIC, 0x11, true);
    /// Generic 0x16: the SGL offset is invalid (in-capsule data not at offset 0).
    INVALID_SGL_OFFSET = (sct::GENERIC, 0x16, true);
    /// Generic 0x19: the keep-alive timer expired.
    KEEP_ALIVE_EXPIRED = (sct::GENERIC, 0x19, false);
    /// Generic 0x1A: the keep-alive timeout is invalid.
    KEEP_ALIVE_INVALID = (sct::GENERIC, 0x1A, true);
    /// Generic 0x22: a transient transport error; the command may succeed if retried
    /// (given to a command that overruns its submission queue).
    TRANSIENT_TRANSPORT_ERROR = (sct::GENERIC, 0x22, false);
    /// Generic 0x80: the LBA range reaches past the namespace.
    LBA_OUT_OF_RANGE = (sct::GENERIC, 0x80, true);
    /// Generic 0x81: the namespace's capacity is exceeded.
    CAPACITY_EXCEEDED = (sct::GENERIC, 0x81, true);
    /// Generic 0x82: the namespace is not ready.
    NAMESPACE_NOT_READY = (sct::GENERIC, 0x82, false);
    /// Command specific 0x01: invalid queue identifier.
    INVALID_QUEUE_IDENTIFIER = (sct::COMMAND_SPECIFIC, 0x01, true);
    /// Command specific 0x02: invalid queue size.
    INVALID_QUEUE_SIZE = (sct::COMMAND_SPECIFIC, 0x02, true);
    /// Command specific 0x05: too many Asynchronous Event Requests outstanding.
    AER_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x05, true);
    /// Command specific 0x09: the log page is not supported.
    INVALID_LOG_PAGE = (sct::COMMAND_SPECIFIC, 0x09, true);
    /// Command specific 0x0D: the feature cannot be saved.
    FEATURE_NOT_SAVEABLE = (sct::COMMAND_SPECIFIC, 0x0D, true);
    /// Command specific 0x80 (Connect): incompatible format.
    CONNECT_INCOMPATIBLE_FORMAT = (sct::COMMAND_SPECIFIC, 0x80, true);
    /// Command specific 0x81 (Connect): controller busy.
    CONNECT_CONTROLLER_BUSY = (sct::COMMAND_SPECIFIC, 0x81, false);
    /// Command specific 0x82 (Connect): invalid parameters (DW0 says which).
    CONNECT_INVALID_PARAMETERS = (sct::COMMAND_SPECIFIC, 0x82, true);
    /// Command specific 0x83 (Connect): restart discovery.
    CONNECT_RESTART_DISCOVERY = (sct::COMMAND_SPECIFIC, 0x83, true);
    /// Command specific 0x84 (Connect): the host may not use this subsystem.
    CONNECT_INVALID_HOST = (sct::COMMAND_SPECIFIC, 0x84, true);
    /// Media 0x80: write fault.
    WRITE_FAULT = (sct::MEDIA, 0x80, false);
    /// Media 0x81: unrecovered read error.
    UNRECOVERED_READ_ERROR = (sct::MEDIA, 0x81, false);
    /// Media 0x85: Compare found a difference.
    COMPARE_FAILURE = (sct::MEDIA, 0x85, true);
    /// Media 0x86: access denied.
    ACCESS_DENIED = (sct::MEDIA, 0x86, true);
    /// Path 0x00: internal path error.
    INTERNAL_PATH_ERROR = (sct::PATH, 0x00, false);
}

impl Status {
    /// Whether the command succeeded.
    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    /// The 16-bit CQE status word (bit 0 is the phase tag, 0 on fabrics).
    pub fn to_field(self, phase: bool) -> u16 {
        u16::from(phase)
            | u16::from(self.sc) << 1
            | u16::from(self.sct & 0x7) << 9
            | u16::from(self.crd & 0x3) << 12
            | u16::from(self.more) << 14
            | u16::from(self.dnr) << 15
    }

    /// The status of a 16-bit CQE status word and its phase bit.
    pub fn from_field(field: u16) -> (Self, bool) {
        (
            Self {
                sc: (field >> 1) as u8,
                sct: ((field >> 9) & 0x7) as u8,
                crd: ((field >> 12) & 0x3) as u8,
                more: field & (1 << 14) != 0,
                dnr: field & (1 << 15) != 0,
            },
            field & 1 != 0,
        )
    }

    /// This status with DNR cleared (an error that may go away).
    pub const fn retryable(self) -> Self {
        Self { dnr: false, ..self }
    }

    /// The name of a known status, if it is one.
    pub fn name(&self) -> Option<&'static str> {
        known_name(self.sct, self.sc)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (SCT {:#x} SC {:#04x})", self.sct, self.sc)?,
            None => write!(f, "SCT {:#x} SC {:#04x}", self.sct, self.sc)?,
        }
        if self.dnr {
            f.write_str(" DNR")?;
        }
        Ok(())
    }
}

/// DW0 of a Connect that failed with [`Status::CONNECT_INVALID_PARAMETERS`]: which byte
/// was wrong, in the SQE or in the Connect data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InvalidParameter {
    /// Byte offset of the field (IPO).
    pub offset: u16,
    /// Whether the offset is into the Connect data (IATTR 1) rather than the SQE (0).
    pub in_data: bool,
}

impl InvalidParameter {
    /// A field of the Connect data (IPO 16 CNTLID, 256 SUBNQN, 512 HOSTNQN).
    pub const fn data(offset: u16) -> Self {
        Self { offset, in_data: true }
    }
    /// A field of the Connect SQE (e.g. 42 QID, 44 SQSIZE).
    pub const fn sqe(offset: u16) -> Self {
        Self { offset, in_data: false }
    }
    /// DW0: IPO in bits 15:0, IATTR in bits 23:16.
    pub fn to_dw0(self) -> u32 {
        u32::from(self.offset) | u32::from(self.in_data) << 16
    }
    /// The parameter a DW0 names.
    pub fn from_dw0(dw0: u32) -> Self {
        Self {
            offset: dw0 as u16,
            in_data: (dw0 >> 16) & 0xFF == 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_status_word() {
        // Invalid Opcode with DNR: SC 1 in bits 8:1, DNR bit 15.
        assert_eq!(Status::INVALID_OPCODE.to_field(false), 0x8002);
        // Connect Invalid Host: SCT 1, SC 0x84, DNR.
        assert_eq!(Status::CONNECT_INVALID_HOST.to_field(false), 0x8000 | 0x200 | 0x84 << 1);
        assert_eq!(Status::SUCCESS.to_field(true), 1);
        assert_eq!(
            Status::from_field(0x8000 | 0x200 | 0x84 << 1),
            (Status::CONNECT_INVALID_HOST, false)
        );
    }

    #[test]
    fn round_trips_every_word() {
        for field in 0..=u16::MAX {
            let (status, phase) = Status::from_field(field);
            assert_eq!(status.to_field(phase), field);
        }
    }

    #[test]
    fn names_known_statuses() {
        assert_eq!(Status::LBA_OUT_OF_RANGE.name(), Some("LBA_OUT_OF_RANGE"));
        assert_eq!(Status::INVALID_FIELD.to_string(), "INVALID_FIELD (SCT 0x0 SC 0x02) DNR");
        assert!(Status {
            sct: 7,
            sc: 0xC0,
            ..Status::SUCCESS
        }
        .name()
        .is_none());
    }

    #[test]
    fn encodes_invalid_parameters() {
        assert_eq!(InvalidParameter::data(256).to_dw0(), 0x1_0100);
        assert_eq!(InvalidParameter::sqe(42).to_dw0(), 42);
        assert_eq!(InvalidParameter::from_dw0(0x1_0200), InvalidParameter::data(512));
    }
}
