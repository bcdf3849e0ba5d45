//! Why an object engine refused a mailbox command: the status the driver sees and the
//! diagnostic it can read.

use rnic_firmware_if::mailbox::MailboxCompletion;

/// A refused mailbox command: the completion status plus what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Status reported in QUERY_MB_ST / the MB event.
    pub status: MailboxCompletion,
    /// The context field (or parameter) at fault.
    pub field: &'static str,
    /// The value the driver supplied.
    pub value: u64,
    /// What was expected, in words.
    pub expected: String,
}

impl Rejection {
    /// A context field out of range.
    pub fn parameter(field: &'static str, value: u64, expected: impl Into<String>) -> Self {
        Self {
            status: MailboxCompletion::InvalidParameter,
            field,
            value,
            expected: expected.into(),
        }
    }

    /// The object is in the wrong state for the command.
    pub fn state(field: &'static str, value: u64, expected: impl Into<String>) -> Self {
        Self {
            status: MailboxCompletion::InvalidState,
            field,
            value,
            expected: expected.into(),
        }
    }

    /// The object index is outside the table.
    pub fn index(value: u64, limit: u64) -> Self {
        Self {
            status: MailboxCompletion::InvalidIndex,
            field: "tag",
            value,
            expected: format!("an index below {limit}"),
        }
    }

    /// A DMA access failed.
    pub fn dma(field: &'static str, address: u64, error: impl std::fmt::Display) -> Self {
        Self {
            status: MailboxCompletion::DmaError,
            field,
            value: address,
            expected: format!("reachable host memory ({error})"),
        }
    }

    /// The context table has no base address for the object.
    pub fn no_table(field: &'static str, value: u64, error: impl std::fmt::Display) -> Self {
        Self {
            status: MailboxCompletion::NoContextTable,
            field,
            value,
            expected: format!("a context table entry ({error})"),
        }
    }
}
