//! Virtual time: integer picoseconds and a deterministic event scheduler.
//!
//! The model never reads the wall clock. Every action that takes time is an event at a
//! virtual instant; events at the same instant run in the order they were scheduled, so
//! the same inputs always give the same sequence.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A point or span of virtual time, in picoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Picoseconds(pub u64);

impl Picoseconds {
    /// Zero.
    pub const ZERO: Self = Self(0);

    /// From nanoseconds.
    pub const fn from_nanos(ns: u64) -> Self {
        Self(ns.saturating_mul(1_000))
    }

    /// From microseconds.
    pub const fn from_micros(us: u64) -> Self {
        Self(us.saturating_mul(1_000_000))
    }

    /// From milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms.saturating_mul(1_000_000_000))
    }

    /// Saturating addition (virtual time never wraps).
    pub const fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }

    /// The span as nanoseconds, rounded down.
    pub const fn as_nanos(self) -> u64 {
        self.0 / 1_000
    }
}

impl std::ops::Add for Picoseconds {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        self.saturating_add(other)
    }
}

impl std::fmt::Display for Picoseconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03} ns", self.0 / 1000, self.0 % 1000)
    }
}

#[derive(Debug)]
struct Entry<E: Ord> {
    at: Picoseconds,
    sequence: u64,
    event: E,
}

impl<E: Ord> Entry<E> {
    /// The order key: time, then scheduling order. Sequences are unique within a
    /// scheduler, so the key alone orders entries and the event is never compared (the
    /// heap's comparisons then touch two words, not a chain that ends in the event).
    fn key(&self) -> u128 {
        (u128::from(self.at.0) << 64) | u128::from(self.sequence)
    }
}

impl<E: Ord> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<E: Ord> Eq for Entry<E> {}

impl<E: Ord> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<E: Ord> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// A queue of events ordered by time, then by scheduling order.
#[derive(Debug)]
pub struct Scheduler<E: Ord> {
    now: Picoseconds,
    next_sequence: u64,
    queue: BinaryHeap<Reverse<Entry<E>>>,
}

impl<E: Ord> Default for Scheduler<E> {
    fn default() -> Self {
        Self {
            now: Picoseconds::ZERO,
            next_sequence: 0,
            queue: BinaryHeap::new(),
        }
    }
}

impl<E: Ord> Scheduler<E> {
    /// An empty scheduler at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current virtual time.
    pub fn now(&self) -> Picoseconds {
        self.now
    }

    /// Schedules `event` at `now + delay`.
    pub fn schedule_in(&mut self, delay: Picoseconds, event: E) {
        let at = self.now + delay;
        self.schedule_at(at, event);
    }

    /// Schedules `event` at `at` (clamped to now: the past cannot be changed).
    pub fn schedule_at(&mut self, at: Picoseconds, event: E) {
        let at = at.max(self.now);
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.queue.push(Reverse(Entry { at, sequence, event }));
    }

    /// Time of the earliest pending event.
    pub fn next_event_time(&self) -> Option<Picoseconds> {
        self.queue.peek().map(|Reverse(e)| e.at)
    }

    /// Removes and returns the earliest event due at or before `limit`, moving `now` to
    /// its time.
    pub fn pop_due(&mut self, limit: Picoseconds) -> Option<E> {
        if self.next_event_time()? > limit {
            return None;
        }
        let Reverse(entry) = self.queue.pop()?;
        self.now = entry.at;
        Some(entry.event)
    }

    /// Moves `now` forward to `t` (never backwards). Call after draining events due by `t`.
    pub fn advance_to(&mut self, t: Picoseconds) {
        self.now = self.now.max(t);
    }

    /// Number of pending events.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Drops every pending event (device reset).
    pub fn clear(&mut self) {
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_run_in_time_order_and_ties_in_scheduling_order() {
        let mut s = Scheduler::new();
        s.schedule_at(Picoseconds(30), "c");
        s.schedule_at(Picoseconds(10), "a");
        s.schedule_at(Picoseconds(30), "d");
        s.schedule_at(Picoseconds(10), "b");
        let mut order = Vec::new();
        while let Some(e) = s.pop_due(Picoseconds(u64::MAX)) {
            order.push((s.now().0, e));
        }
        assert_eq!(order, vec![(10, "a"), (10, "b"), (30, "c"), (30, "d")]);
    }

    #[test]
    fn events_after_the_limit_wait_and_time_never_goes_back() {
        let mut s = Scheduler::new();
        s.schedule_in(Picoseconds::from_nanos(5), 1u8);
        assert_eq!(s.pop_due(Picoseconds(4_999)), None);
        assert_eq!(s.pop_due(Picoseconds(5_000)), Some(1));
        s.advance_to(Picoseconds(100));
        s.advance_to(Picoseconds(50));
        assert_eq!(s.now(), Picoseconds(5_000), "advancing to an earlier time keeps now");
        s.schedule_at(Picoseconds(1), 2u8);
        assert_eq!(
            s.next_event_time(),
            Some(Picoseconds(5_000)),
            "past events are clamped to now"
        );
    }

    #[test]
    fn units_convert_exactly() {
        assert_eq!(Picoseconds::from_micros(4).0, 4_000_000);
        assert_eq!(Picoseconds::from_millis(1).as_nanos(), 1_000_000);
        assert_eq!(Picoseconds(1_500).to_string(), "1.500 ns");
    }
}
