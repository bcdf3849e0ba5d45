//! # rnic-diag — bounded diagnostics
//!
//! Every input the project refuses (a bad register value from a driver, a malformed frame
//! from the network, a broken request from an application) is a *diagnostic*, logged as a
//! `tracing` warning under the target [`TARGET`] (`rnic::diag`). Hostile input can be sent
//! at line rate, so one log line per refused input would let any peer fill a disk. This
//! crate bounds the log without losing the count:
//!
//! * every diagnostic has a [`Kind`] (an area and a name, both `'static`, so the number of
//!   kinds is bounded by the code, never by the input);
//! * a [`Limiter`] counts every occurrence of every kind, always;
//! * the first [`Policy::first`] occurrences of a kind are logged in full (the caller logs
//!   them when [`Limiter::admit`] says so); the next one adds one line saying that further
//!   ones are only counted;
//! * after that the kind is quiet, and totals are logged instead: one line for a kind every
//!   [`Policy::every`] further occurrences (a bound by input volume, deterministic), and one
//!   line for all quiet kinds when [`Policy::period`] has passed ([`Limiter::tick`], a bound
//!   by time, in a time unit the owner chooses);
//! * [`Limiter::counts`] and [`Limiter::summary`] give the counters at any time (status
//!   output, the `rnic::diag` summary line, tests).
//!
//! **The bound.** A limiter writes at most `first + 1` lines per kind, plus one line per
//! `every` occurrences of a kind, plus one line per `period` (and one per
//! [`Limiter::log_summary`] call). With `every` off, the log grows with time, never with
//! the rate of hostile input.
//!
//! The limiter never reads a clock: time is what the owner passes to [`Limiter::tick`]
//! (the device model passes nothing and stays deterministic; the emulator passes wall
//! nanoseconds). For code with no single owner (a library used from several threads)
//! [`SharedLimiter`] wraps one in a mutex, and [`global`] is a process-wide one with the
//! default policy.
//!
//! ```
//! use rnic_diag::{Kind, Limiter, Policy};
//!
//! const BAD_KEY: Kind = Kind::new("storage", "bad key");
//! let mut limiter = Limiter::new(Policy { first: 2, every: None, period: None });
//! let mut logged = 0;
//! for key in 0..1000u32 {
//!     rnic_diag::warn!(limiter, BAD_KEY, key, "bad key {key:#x}");
//!     logged += u32::from(limiter.last_admitted());
//! }
//! assert_eq!(logged, 2);
//! assert_eq!(limiter.total(), 1000);
//! assert_eq!(limiter.count(BAD_KEY), 1000);
//! ```
#![deny(unsafe_code)]

use std::fmt;
use std::sync::{Mutex, OnceLock};

/// The `tracing` target of every diagnostic and of the limiter's own lines.
pub const TARGET: &str = "rnic::diag";

/// What a diagnostic is about: an area (`"transport"`, `"vfio-user"`, `"storage"`…) and a
/// name within it (a field, a check). Both are `'static`, so hostile input cannot make new
/// kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    /// The block or protocol that noticed the problem.
    pub area: &'static str,
    /// The field or check that failed.
    pub name: &'static str,
}

impl Kind {
    /// A kind named `area/name`.
    pub const fn new(area: &'static str, name: &'static str) -> Self {
        Self { area, name }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.area, self.name)
    }
}

/// How much of a kind is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Occurrences of one kind logged in full before the kind goes quiet.
    pub first: u32,
    /// Once quiet, a totals line for the kind every this many further occurrences
    /// (`None`: never by count).
    pub every: Option<u64>,
    /// Once quiet, one totals line for all quiet kinds with new occurrences when this much
    /// time has passed since the previous one, in the unit of the times given to
    /// [`Limiter::tick`] (`None`: never by time).
    pub period: Option<u64>,
}

impl Policy {
    /// The first 10 occurrences of a kind, then a total every 100 000: needs no clock, so
    /// deterministic code (the device model) can use it.
    pub const DEFAULT: Policy = Policy {
        first: 10,
        every: Some(100_000),
        period: None,
    };

    /// The first 10 occurrences of a kind, then one totals line per `period` for all kinds
    /// (for owners with a clock; the emulator passes 10 s in nanoseconds).
    pub const fn timed(period: u64) -> Policy {
        Policy {
            first: 10,
            every: None,
            period: Some(period),
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The counters of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindCount {
    /// The kind.
    pub kind: Kind,
    /// Occurrences ever counted.
    pub total: u64,
    /// Occurrences logged in full.
    pub logged: u64,
    /// Occurrences since the kind's last totals line that no line has reported yet.
    pub unreported: u64,
}

/// Counts diagnostics by kind and decides which are logged; see the crate documentation.
#[derive(Debug, Clone)]
pub struct Limiter {
    policy: Policy,
    /// Few kinds (bounded by the code), so a vector searched from the most recent is
    /// faster than a map.
    kinds: Vec<KindCount>,
    total: u64,
    lines: u64,
    last_period: Option<u64>,
    last_admitted: bool,
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new(Policy::DEFAULT)
    }
}

impl Limiter {
    /// An empty limiter.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            kinds: Vec::new(),
            total: 0,
            lines: 0,
            last_period: None,
            last_admitted: false,
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Changes the policy; counters are kept.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    fn slot(&mut self, kind: Kind) -> usize {
        match self.kinds.iter().rposition(|k| k.kind == kind) {
            Some(index) => index,
            None => {
                self.kinds.push(KindCount {
                    kind,
                    total: 0,
                    logged: 0,
                    unreported: 0,
                });
                self.kinds.len() - 1
            }
        }
    }

    /// Counts one occurrence of `kind`; true when the caller should log it in full (one
    /// of the kind's first [`Policy::first`]). Logs the limiter's own lines (the "only
    /// counted from now on" note, a totals line every [`Policy::every`]) itself.
    pub fn admit(&mut self, kind: Kind) -> bool {
        let first = u64::from(self.policy.first);
        let every = self.policy.every;
        let index = self.slot(kind);
        self.total += 1;
        let count = &mut self.kinds[index];
        count.total += 1;
        if count.logged < first {
            count.logged += 1;
            self.lines += 1;
            self.last_admitted = true;
            return true;
        }
        if count.unreported == 0 && count.total == count.logged + 1 {
            // The kind's first quiet occurrence.
            self.lines += 1;
            tracing::warn!(
                target: "rnic::diag",
                kind = %kind,
                "{kind}: {first} occurrences logged; further ones are counted, with totals in later lines"
            );
        }
        count.unreported += 1;
        if every.is_some_and(|every| count.unreported >= every) {
            let (total, unreported) = (count.total, count.unreported);
            count.unreported = 0;
            self.lines += 1;
            tracing::warn!(
                target: "rnic::diag",
                kind = %kind,
                total,
                "{kind}: {total} in total, {unreported} not logged since the last line"
            );
        }
        self.last_admitted = false;
        false
    }

    /// Whether the last [`Limiter::admit`] said "log it" (for callers behind [`warn!`]).
    pub fn last_admitted(&self) -> bool {
        self.last_admitted
    }

    /// Tells the limiter the time is `now` (in the unit of [`Policy::period`]): when a
    /// period has passed since the last totals line (or the first tick), logs one line with
    /// the kinds that had unlogged occurrences since. Cheap when nothing is due.
    pub fn tick(&mut self, now: u64) {
        let Some(period) = self.policy.period else { return };
        let Some(last) = self.last_period else {
            self.last_period = Some(now);
            return;
        };
        if now.saturating_sub(last) < period {
            return;
        }
        self.last_period = Some(now);
        if self.kinds.iter().all(|k| k.unreported == 0) {
            return;
        }
        let mut text = String::new();
        for count in self.kinds.iter_mut().filter(|k| k.unreported > 0) {
            if !text.is_empty() {
                text.push_str(", ");
            }
            text.push_str(&format!(
                "{} +{} ({} in total)",
                count.kind, count.unreported, count.total
            ));
            count.unreported = 0;
        }
        self.lines += 1;
        tracing::warn!(target: "rnic::diag", total = self.total, "diagnostics not logged in the last period: {text}");
    }

    /// Every occurrence counted so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Occurrences of `kind` counted so far.
    pub fn count(&self, kind: Kind) -> u64 {
        self.kinds.iter().find(|k| k.kind == kind).map_or(0, |k| k.total)
    }

    /// The counters of every kind seen, in the order first seen.
    pub fn counts(&self) -> &[KindCount] {
        &self.kinds
    }

    /// Lines this limiter logged or let its callers log (the log's size in lines).
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The counters as one line of text.
    pub fn summary(&self) -> Summary<'_> {
        Summary(self)
    }

    /// Logs [`Limiter::summary`] as one `rnic::diag` line (at shutdown, or when asked),
    /// and forgets what it reports.
    pub fn log_summary(&mut self) {
        self.lines += 1;
        tracing::warn!(target: "rnic::diag", total = self.total, "summary: {}", self.summary());
        for count in &mut self.kinds {
            count.unreported = 0;
        }
    }

    /// Adds `other`'s counters to this one's (an owner that rebuilds a component keeps its
    /// counts and its quiet kinds).
    pub fn absorb(&mut self, other: &Limiter) {
        for theirs in &other.kinds {
            let index = self.slot(theirs.kind);
            let mine = &mut self.kinds[index];
            mine.total += theirs.total;
            mine.logged += theirs.logged;
            mine.unreported += theirs.unreported;
        }
        self.total += other.total;
        self.lines += other.lines;
    }
}

/// [`Limiter::summary`]: `N diagnostics (area/name: count, ...)`.
pub struct Summary<'a>(&'a Limiter);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} diagnostics", self.0.total)?;
        let mut sorted: Vec<&KindCount> = self.0.kinds.iter().collect();
        sorted.sort_by(|a, b| b.total.cmp(&a.total).then(a.kind.cmp(&b.kind)));
        for (i, count) in sorted.iter().enumerate() {
            f.write_str(if i == 0 { " (" } else { ", " })?;
            write!(f, "{}: {}", count.kind, count.total)?;
        }
        if !sorted.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// A [`Limiter`] behind a mutex, for code used from several threads.
#[derive(Debug, Default)]
pub struct SharedLimiter(Mutex<Limiter>);

impl SharedLimiter {
    /// An empty shared limiter.
    pub const fn new(policy: Policy) -> Self {
        Self(Mutex::new(Limiter {
            policy,
            kinds: Vec::new(),
            total: 0,
            lines: 0,
            last_period: None,
            last_admitted: false,
        }))
    }

    /// Runs `f` on the limiter (a poisoned lock is taken over: counters stay usable).
    pub fn with<R>(&self, f: impl FnOnce(&mut Limiter) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }

    /// [`Limiter::admit`].
    pub fn admit(&self, kind: Kind) -> bool {
        self.with(|limiter| limiter.admit(kind))
    }

    /// [`Limiter::tick`].
    pub fn tick(&self, now: u64) {
        self.with(|limiter| limiter.tick(now));
    }

    /// A copy of the counters.
    pub fn counts(&self) -> Vec<KindCount> {
        self.with(|limiter| limiter.counts().to_vec())
    }

    /// [`Limiter::total`].
    pub fn total(&self) -> u64 {
        self.with(|limiter| limiter.total())
    }

    /// [`Limiter::last_admitted`] (meaningful only right after an admit on this thread
    /// when no other thread admits in between; [`warn!`] does not need it).
    pub fn last_admitted(&self) -> bool {
        self.with(|limiter| limiter.last_admitted())
    }
}

/// The process-wide limiter with [`Policy::DEFAULT`], for library code that has no owner to
/// hold one (the verbs provider, the storage targets, the C libraries).
pub fn global() -> &'static SharedLimiter {
    static GLOBAL: OnceLock<SharedLimiter> = OnceLock::new();
    GLOBAL.get_or_init(|| SharedLimiter::new(Policy::DEFAULT))
}

#[doc(hidden)]
pub use tracing as __tracing;

/// Logs a diagnostic of `kind` through `limiter` (a [`Limiter`] or a [`SharedLimiter`]):
/// always counted, logged as a `rnic::diag` warning only when the limiter admits it. The
/// message is formatted only then.
///
/// `rnic_diag::warn!(limiter, KIND, field = value, ..., "format", args...)`, fields and
/// format as in `tracing::warn!`.
#[macro_export]
macro_rules! warn {
    ($limiter:expr, $kind:expr, $($rest:tt)+) => {{
        let kind: $crate::Kind = $kind;
        if $limiter.admit(kind) {
            $crate::__tracing::warn!(target: "rnic::diag", kind = %kind, $($rest)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Kind = Kind::new("test", "a");
    const B: Kind = Kind::new("test", "b");

    #[test]
    fn the_first_occurrences_are_admitted_and_every_one_is_counted() {
        let mut limiter = Limiter::new(Policy {
            first: 3,
            every: None,
            period: None,
        });
        let admitted: Vec<bool> = (0..6).map(|_| limiter.admit(A)).collect();
        assert_eq!(admitted, [true, true, true, false, false, false]);
        assert!(limiter.admit(B), "each kind has its own first occurrences");
        assert_eq!(limiter.count(A), 6);
        assert_eq!(limiter.count(B), 1);
        assert_eq!(limiter.total(), 7);
        // Three of A, its "only counted" note, one of B.
        assert_eq!(limiter.lines(), 5);
        assert_eq!(
            limiter.counts()[0],
            KindCount {
                kind: A,
                total: 6,
                logged: 3,
                unreported: 3
            }
        );
    }

    #[test]
    fn totals_by_count_bound_the_lines_by_input_volume() {
        let mut limiter = Limiter::new(Policy {
            first: 10,
            every: Some(1000),
            period: None,
        });
        for _ in 0..100_000 {
            limiter.admit(A);
        }
        // 10 + the note + one totals line per 1000 of the 99 990 quiet ones.
        assert_eq!(limiter.lines(), 10 + 1 + 99);
        assert_eq!(limiter.counts()[0].unreported, 990);
    }

    #[test]
    fn totals_by_time_bound_the_lines_by_elapsed_time() {
        let mut limiter = Limiter::new(Policy::timed(10));
        limiter.tick(0);
        for now in 0..1000u64 {
            for _ in 0..50 {
                limiter.admit(A);
                limiter.admit(B);
            }
            limiter.tick(now);
        }
        // 11 lines per kind, then one line per 10 time units (the first period ends at 10).
        assert_eq!(limiter.lines(), 2 * 11 + 99);
        assert_eq!(limiter.total(), 100_000);
    }

    #[test]
    fn a_period_without_unlogged_occurrences_logs_nothing() {
        let mut limiter = Limiter::new(Policy::timed(10));
        limiter.tick(0);
        limiter.admit(A);
        limiter.tick(100);
        limiter.tick(200);
        assert_eq!(limiter.lines(), 1);
    }

    #[test]
    fn the_summary_names_every_kind_most_frequent_first() {
        let mut limiter = Limiter::default();
        for _ in 0..3 {
            limiter.admit(B);
        }
        limiter.admit(A);
        assert_eq!(limiter.summary().to_string(), "4 diagnostics (test/b: 3, test/a: 1)");
        assert_eq!(Limiter::default().summary().to_string(), "0 diagnostics");
    }

    #[test]
    fn absorbing_keeps_counts_and_quiet_kinds() {
        let mut old = Limiter::new(Policy {
            first: 2,
            every: None,
            period: None,
        });
        for _ in 0..5 {
            old.admit(A);
        }
        let mut new = Limiter::new(old.policy());
        new.absorb(&old);
        assert!(!new.admit(A), "A stays quiet across the rebuild");
        assert_eq!(new.count(A), 6);
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use std::sync::Arc;

    /// The text a `fmt` subscriber writes while `f` runs.
    fn captured(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn the_log_holds_exactly_the_lines_the_limiter_counts() {
        let mut limiter = Limiter::new(Policy {
            first: 3,
            every: Some(400),
            period: Some(100),
        });
        let text = captured(|| {
            limiter.tick(0);
            for i in 0..2000u64 {
                warn!(limiter, Kind::new("test", "flood"), i, "hostile input {i}");
                limiter.tick(i);
            }
            limiter.log_summary();
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() as u64, limiter.lines(), "{text}");
        // 3 in full, the note, 19 totals by time (each resets what the count-based totals
        // wait for, so none of those is due: 100 quiet ones per period < 400), the summary.
        assert_eq!(lines.len(), 3 + 1 + 19 + 1, "{text}");
        assert!(lines.iter().all(|l| l.contains("rnic::diag")), "{text}");
        assert!(lines[0].contains("hostile input 0"), "{text}");
        assert!(lines[3].contains("further ones are counted"), "{text}");
        assert!(
            lines
                .last()
                .unwrap()
                .contains("summary: 2000 diagnostics (test/flood: 2000)"),
            "{text}"
        );
    }

    #[test]
    fn the_macro_formats_nothing_it_does_not_log() {
        struct Loud(u32);
        impl fmt::Display for Loud {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                assert!(self.0 < 2, "formatted a diagnostic the limiter did not admit");
                write!(f, "{}", self.0)
            }
        }
        let shared = SharedLimiter::new(Policy {
            first: 2,
            every: None,
            period: None,
        });
        let text = captured(|| {
            for i in 0..10 {
                let value = Loud(i);
                warn!(shared, Kind::new("test", "loud"), "value {value}");
            }
        });
        assert_eq!(text.lines().count(), 3, "{text}");
        assert_eq!(shared.total(), 10);
    }
}
