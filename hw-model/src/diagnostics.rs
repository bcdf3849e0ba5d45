//! Diagnostics: what a misbehaving driver did wrong, in words.
//!
//! Every rejected input produces one [`Diagnostic`] naming the object, the field, the bad
//! value and what was expected. It is emitted as a `tracing` warning (target
//! `rnic::diag`) and kept in a bounded log so tests and tools can assert on it.

use std::collections::VecDeque;

/// Which part of the device noticed the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// A BAR0 register write.
    Register,
    /// The command queue ring.
    CommandQueue,
    /// A mailbox command.
    Mailbox,
    /// A doorbell write.
    Doorbell,
    /// An event queue.
    EventQueue,
    /// A completion queue.
    CompletionQueue,
    /// Configuration space or MSI-X.
    Pci,
    /// The transport: WQEs the engines refuse and packets they drop.
    Transport,
}

/// One diagnostic record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Virtual time of the event, in picoseconds.
    pub time_ps: u64,
    /// Where it was noticed.
    pub source: Source,
    /// The object concerned, e.g. "QP 0x12", "cmdq descriptor 7".
    pub object: String,
    /// The field or register concerned.
    pub field: &'static str,
    /// The value the driver supplied.
    pub value: u64,
    /// What was expected, in words.
    pub expected: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}: {}: {} = {:#x}; expected {}",
            self.source, self.object, self.field, self.value, self.expected
        )
    }
}

/// Bounded log of the most recent diagnostics, plus a total count.
#[derive(Debug, Clone, Default)]
pub struct DiagnosticLog {
    recent: VecDeque<Diagnostic>,
    total: u64,
}

/// How many diagnostics the log keeps.
pub const LOG_CAPACITY: usize = 256;

impl DiagnosticLog {
    /// Records a diagnostic and emits it through `tracing`.
    pub fn record(&mut self, diagnostic: Diagnostic) {
        tracing::warn!(target: "rnic::diag", "{diagnostic}");
        if self.recent.len() == LOG_CAPACITY {
            self.recent.pop_front();
        }
        self.recent.push_back(diagnostic);
        self.total += 1;
    }

    /// The most recent diagnostics, oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Diagnostic> {
        self.recent.iter()
    }

    /// The newest diagnostic.
    pub fn last(&self) -> Option<&Diagnostic> {
        self.recent.back()
    }

    /// Number of diagnostics ever recorded.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Removes and returns the kept diagnostics.
    pub fn drain(&mut self) -> Vec<Diagnostic> {
        self.recent.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(value: u64) -> Diagnostic {
        Diagnostic {
            time_ps: 0,
            source: Source::Doorbell,
            object: "QP 0x9".into(),
            field: "TAG",
            value,
            expected: "an existing QP".into(),
        }
    }

    #[test]
    fn display_names_object_field_value_and_expectation() {
        assert_eq!(
            sample(9).to_string(),
            "Doorbell: QP 0x9: TAG = 0x9; expected an existing QP"
        );
    }

    #[test]
    fn the_log_is_bounded_and_counts_everything() {
        let mut log = DiagnosticLog::default();
        for v in 0..(LOG_CAPACITY as u64 + 10) {
            log.record(sample(v));
        }
        assert_eq!(log.total(), LOG_CAPACITY as u64 + 10);
        assert_eq!(log.recent().count(), LOG_CAPACITY);
        assert_eq!(log.recent().next().unwrap().value, 10);
    }
}
