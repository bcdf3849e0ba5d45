//! What an object block answers to a mailbox command: a [`Rejection`] (the status the
//! driver sees and the diagnostic it can read) and the hns mask rule of MODIFY commands
//! ([`merge_under_mask`], [`merge_modifiable`]). Every object block (QP, CQ, SRQ, MPT, EQ)
//! and the context tables use these; the firmware reports them.

use rnic_firmware_if::bits::{Field, Layout};
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

/// Applies a MODIFY mailbox's context ‖ mask to `current` (the hns rule: a mask bit of 1
/// keeps the current bit, 0 takes the new one).
pub(crate) fn merge_under_mask<L: Layout>(current: &L, new: &L, mask: &L) -> L {
    let mut merged = L::zeroed();
    for (((out, cur), new), mask) in merged
        .bytes_mut()
        .iter_mut()
        .zip(current.bytes())
        .zip(new.bytes())
        .zip(mask.bytes())
    {
        *out = (cur & mask) | (new & !mask);
    }
    merged
}

/// [`merge_under_mask`], refusing a change to any field outside `modifiable`; `command`
/// names the mailbox command in the diagnostic.
pub(crate) fn merge_modifiable<L: Layout>(
    current: &L,
    new: &L,
    mask: &L,
    modifiable: &[Field],
    command: &str,
) -> Result<L, Rejection> {
    let merged = merge_under_mask(current, new, mask);
    let is_modifiable = |field: &Field| modifiable.iter().any(|m| m.name == field.name);
    for field in L::FIELDS.iter().filter(|f| !is_modifiable(f)) {
        let (old, new) = (field.get(current.bytes()), field.get(merged.bytes()));
        if old != new {
            let names: Vec<&str> = modifiable.iter().map(|f| f.name).collect();
            return Err(Rejection::parameter(
                field.name,
                new,
                format!(
                    "the current value {old:#x}: {command} changes only {}",
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(merged)
}
