//! Diagnostics: what a misbehaving driver did wrong, in words.
//!
//! Every rejected input produces one [`Diagnostic`] naming the object, the field, the bad
//! value and what was expected. It is counted by kind (source and field) and kept in a
//! bounded log so tests and tools can assert on it; the first occurrences of a kind are
//! emitted as `tracing` warnings (target `rnic::diag`), later ones only as totals
//! ([`rnic_diag::Limiter`], default [`rnic_diag::Policy::DEFAULT`]: the first 10 of a kind,
//! then one line per 100 000), so hostile input cannot flood the log. The model never
//! reads a clock: time-based totals are its owner's choice ([`DiagnosticLog::tick`]).

use std::collections::VecDeque;

use rnic_diag::{Kind, Limiter, Policy};

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

impl Source {
    /// The source's name in diagnostics kinds and totals lines.
    pub const fn name(self) -> &'static str {
        match self {
            Source::Register => "register",
            Source::CommandQueue => "cmdq",
            Source::Mailbox => "mailbox",
            Source::Doorbell => "doorbell",
            Source::EventQueue => "eq",
            Source::CompletionQueue => "cq",
            Source::Pci => "pci",
            Source::Transport => "transport",
        }
    }
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

impl Diagnostic {
    /// Its kind for counting and rate limiting: source and field.
    pub fn kind(&self) -> Kind {
        Kind::new(self.source.name(), self.field)
    }
}

/// Bounded log of the most recent diagnostics, plus counts by kind.
#[derive(Debug, Clone, Default)]
pub struct DiagnosticLog {
    recent: VecDeque<Diagnostic>,
    limiter: Limiter,
}

/// How many diagnostics the log keeps.
pub const LOG_CAPACITY: usize = 256;

impl DiagnosticLog {
    /// Records a diagnostic: counted always, emitted through `tracing` when the limiter
    /// admits its kind.
    pub fn record(&mut self, diagnostic: Diagnostic) {
        if self.limiter.admit(diagnostic.kind()) {
            tracing::warn!(target: "rnic::diag", "{diagnostic}");
        }
        if self.recent.len() == LOG_CAPACITY {
            self.recent.pop_front();
        }
        self.recent.push_back(diagnostic);
    }

    /// The counters by kind and the logging policy.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Sets how much is logged (counting is unaffected).
    pub fn set_policy(&mut self, policy: Policy) {
        self.limiter.set_policy(policy);
    }

    /// Passes the owner's time to the limiter, for [`Policy::period`] totals; the device
    /// never calls it (it would be virtual time, and the device reads no other clock).
    pub fn tick(&mut self, now: u64) {
        self.limiter.tick(now);
    }

    /// Replaces the limiter (an owner that rebuilds the device keeps its counts and quiet
    /// kinds).
    pub fn replace_limiter(&mut self, limiter: Limiter) -> Limiter {
        std::mem::replace(&mut self.limiter, limiter)
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
        self.limiter.total()
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

    #[test]
    fn diagnostics_are_counted_by_source_and_field() {
        let mut log = DiagnosticLog::default();
        for v in 0..1000 {
            log.record(sample(v));
        }
        let kind = Kind::new("doorbell", "TAG");
        assert_eq!(sample(0).kind(), kind);
        assert_eq!(log.limiter().count(kind), 1000);
        // The default policy: 10 in full and the "only counted" note.
        assert_eq!(log.limiter().lines(), 11);
    }
}
