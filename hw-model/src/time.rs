//! Virtual time: integer picoseconds and a deterministic event scheduler.
//!
//! The model never reads the wall clock. Every action that takes time is an event at a
//! virtual instant; events at the same instant run in the order they were scheduled, so
//! the same inputs always give the same sequence.

use std::collections::{BTreeMap, VecDeque};

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

/// Items ordered by time; items with the same time leave in the order they were pushed.
///
/// Mostly a deque kept sorted by time. The model mostly schedules in nondecreasing time
/// order (a stage's end, a frame's arrival one link latency later), or sooner than
/// everything pending (a pipeline step while frames wait for the receive pipeline), so a
/// push is usually an append or a push at the front and a pop takes the front: O(1)
/// each, with no sequence number and no sifting of 30-60 byte entries as a binary heap
/// does. A push that belongs among the last few items steps past them from the back.
/// Anything else (a timer among thousands of other QPs' timers) goes to an ordered map
/// on the side, so no push costs more than O(log n) however a driver spreads its timers.
///
/// The deque's head is always the earliest item (a pop moves the side's first item to
/// the head when it is due first), so looking at the next time never looks aside.
/// Same-time order across the two: every deque item at a time was pushed before every
/// side item at that time (a push goes to the side if the side holds its time), so on a
/// tie the deque's item comes first.
#[derive(Debug, Clone)]
pub struct TimeQueue<T> {
    sorted: VecDeque<(Picoseconds, T)>,
    /// Far-from-the-ends pushes, by (time, push number).
    overflow: BTreeMap<(Picoseconds, u64), T>,
    overflow_pushes: u64,
}

impl<T> Default for TimeQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TimeQueue<T> {
    /// How many later items a push steps past in the deque before it goes to the side.
    const NEAR: usize = 8;

    /// An empty queue.
    pub const fn new() -> Self {
        Self {
            sorted: VecDeque::new(),
            overflow: BTreeMap::new(),
            overflow_pushes: 0,
        }
    }

    /// Adds `item` at `at`, behind every item at `at` or earlier.
    #[inline]
    pub fn push(&mut self, at: Picoseconds, item: T) {
        if !self.overflow.is_empty() && self.overflow.range((at, 0)..=(at, u64::MAX)).next().is_some() {
            self.push_overflow(at, item);
            return;
        }
        let (Some((first, _)), Some((last, _))) = (self.sorted.front(), self.sorted.back()) else {
            self.sorted.push_back((at, item));
            return;
        };
        if *last <= at {
            self.sorted.push_back((at, item));
            return;
        }
        if *first > at {
            self.sorted.push_front((at, item));
            return;
        }
        self.push_between(at, item);
    }

    /// A push strictly between the deque's head and back.
    fn push_between(&mut self, at: Picoseconds, item: T) {
        let later = self
            .sorted
            .iter()
            .rev()
            .take(Self::NEAR + 1)
            .take_while(|(t, _)| *t > at)
            .count();
        if later > Self::NEAR {
            self.push_overflow(at, item);
            return;
        }
        self.sorted.push_back((at, item));
        let last = self.sorted.len() - 1;
        for index in (last - later..last).rev() {
            self.sorted.swap(index, index + 1);
        }
    }

    fn push_overflow(&mut self, at: Picoseconds, item: T) {
        self.overflow.insert((at, self.overflow_pushes), item);
        self.overflow_pushes += 1;
    }

    /// Time of the earliest item.
    #[inline]
    pub fn peek_time(&self) -> Option<Picoseconds> {
        self.sorted.front().map(|(at, _)| *at)
    }

    /// Removes and returns the earliest item (the first pushed among the earliest).
    #[inline]
    pub fn pop(&mut self) -> Option<(Picoseconds, T)> {
        let earliest = self.sorted.pop_front();
        if !self.overflow.is_empty() {
            self.refill_head();
        }
        earliest
    }

    /// Keeps the deque's head the earliest item after a pop: the side's first item moves
    /// to the head if it is earlier than the new head (on a tie the deque's item was
    /// pushed first), or if the deque ran empty.
    fn refill_head(&mut self) {
        let side_first = match (self.sorted.front(), self.overflow.first_key_value()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some((head, _)), Some(((side, _), _))) => side < head,
        };
        if side_first {
            if let Some(((at, _), item)) = self.overflow.pop_first() {
                self.sorted.push_front((at, item));
            }
        }
    }

    /// Removes and returns the earliest item if it is due at or before `limit`.
    #[inline]
    pub fn pop_due(&mut self, limit: Picoseconds) -> Option<(Picoseconds, T)> {
        if self.peek_time()? > limit {
            return None;
        }
        self.pop()
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.sorted.len() + self.overflow.len()
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty() && self.overflow.is_empty()
    }

    /// Drops every item.
    pub fn clear(&mut self) {
        self.sorted.clear();
        self.overflow.clear();
    }
}

/// A queue of events ordered by time, then by scheduling order.
#[derive(Debug, Clone)]
pub struct Scheduler<E> {
    now: Picoseconds,
    queue: TimeQueue<E>,
}

impl<E> Default for Scheduler<E> {
    fn default() -> Self {
        Self {
            now: Picoseconds::ZERO,
            queue: TimeQueue::new(),
        }
    }
}

impl<E> Scheduler<E> {
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
        self.queue.push(at.max(self.now), event);
    }

    /// Time of the earliest pending event.
    #[inline]
    pub fn next_event_time(&self) -> Option<Picoseconds> {
        self.queue.peek_time()
    }

    /// Removes and returns the earliest event due at or before `limit`, moving `now` to
    /// its time.
    #[inline]
    pub fn pop_due(&mut self, limit: Picoseconds) -> Option<E> {
        let (at, event) = self.queue.pop_due(limit)?;
        self.now = at;
        Some(event)
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
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

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

    /// xorshift64*: a seeded, deterministic source for the randomised comparisons.
    fn random(state: &mut u64) -> u64 {
        let mut x = *state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[test]
    fn time_queue_keeps_same_time_items_in_push_order() {
        let mut q = TimeQueue::new();
        // Same time pushed after a later one (the insert path) and at the back (append).
        q.push(Picoseconds(20), 0);
        q.push(Picoseconds(10), 1);
        q.push(Picoseconds(20), 2);
        q.push(Picoseconds(10), 3);
        q.push(Picoseconds(10), 4);
        q.push(Picoseconds(5), 5);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        let expected = [(5, 5), (10, 1), (10, 3), (10, 4), (20, 0), (20, 2)];
        assert_eq!(order, expected.map(|(t, i)| (Picoseconds(t), i)));
    }

    #[test]
    fn time_queue_pops_only_what_is_due() {
        let mut q = TimeQueue::new();
        q.push(Picoseconds(7), 'a');
        assert_eq!(q.pop_due(Picoseconds(6)), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop_due(Picoseconds(7)), Some((Picoseconds(7), 'a')));
        assert!(q.is_empty());
    }

    #[test]
    fn empty_time_queue_has_nothing_to_give() {
        let mut q: TimeQueue<u8> = TimeQueue::default();
        assert_eq!(q.peek_time(), None);
        assert_eq!(q.pop(), None);
        assert_eq!(q.pop_due(Picoseconds(u64::MAX)), None);
        q.push(Picoseconds(1), 1);
        q.clear();
        assert!(q.is_empty());
        assert_eq!(q.pop(), None);
    }

    /// Runs `steps` random pushes and pops on a [`TimeQueue`] and on a binary heap keyed
    /// by (time, push number), the order the scheduler promises, and checks every pop.
    fn compare_with_heap(seed: u64, steps: usize, time_span: u64, push_per_mille: u64) {
        let mut state = seed;
        let mut queue = TimeQueue::new();
        let mut reference = BinaryHeap::new();
        let mut pushed = 0u64;
        let mut now = 0u64;
        for _ in 0..steps {
            if random(&mut state) % 1000 < push_per_mille {
                // Mostly at or after the last pop, as the model schedules; some in the
                // past of the queue's back, some at exactly the same time.
                let at = now + random(&mut state) % time_span;
                queue.push(Picoseconds(at), pushed);
                reference.push(Reverse((at, pushed)));
                pushed += 1;
            } else {
                let expected = reference.pop().map(|Reverse((at, n))| (Picoseconds(at), n));
                let got = queue.pop();
                assert_eq!(got, expected, "seed {seed}");
                if let Some((at, _)) = got {
                    now = at.0;
                }
            }
            assert_eq!(queue.len(), reference.len());
            assert_eq!(
                queue.peek_time(),
                reference.peek().map(|Reverse((at, _))| Picoseconds(*at))
            );
        }
        while let Some(Reverse((at, n))) = reference.pop() {
            assert_eq!(queue.pop(), Some((Picoseconds(at), n)), "seed {seed}");
        }
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn far_middle_pushes_go_aside_and_still_leave_in_time_then_push_order() {
        let mut q = TimeQueue::new();
        // Twenty far timers, then pushes that belong in the middle of them (more than
        // `NEAR` later items: they go aside), then pushes at the same times that would
        // otherwise fit in the deque (they must still leave after the earlier ones).
        for n in 0..20u64 {
            q.push(Picoseconds(1_000 + n * 100), n);
        }
        q.push(Picoseconds(1_050), 100);
        q.push(Picoseconds(1_050), 101);
        q.push(Picoseconds(1_000), 102);
        q.push(Picoseconds(2_900), 103);
        q.push(Picoseconds(5), 104);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(at, n)| (at.0, n)).collect();
        let mut expected: Vec<_> = (0..20u64).map(|n| (1_000 + n * 100, n)).collect();
        expected.extend([(1_050, 100), (1_050, 101), (1_000, 102), (2_900, 103), (5, 104)]);
        // Time, then push order: a stable sort by time of the push sequence.
        expected.sort_by_key(|&(at, _)| at);
        assert_eq!(order, expected);
        assert!(q.is_empty());
    }

    #[test]
    fn time_queue_pops_in_the_same_order_as_a_heap_of_time_and_push_number() {
        for seed in 1..=40 {
            // Few distinct times (many ties), then widely spread ones; growing, steady
            // and shrinking queues.
            compare_with_heap(seed, 2_000, 4, 600);
            compare_with_heap(seed, 2_000, 1_000_000, 500);
            compare_with_heap(seed, 2_000, 50, 400);
        }
    }

    #[test]
    fn large_time_queue_drains_in_order() {
        let mut state = 0x1234_5678;
        let mut q = TimeQueue::new();
        for n in 0..100_000u64 {
            q.push(Picoseconds(random(&mut state) % 10_000), n);
        }
        let mut last = None;
        let mut count = 0;
        while let Some((at, n)) = q.pop() {
            // (time, push number) strictly increases: time order, ties in push order.
            assert!(last < Some((at, n)), "{at} {n} after {last:?}");
            last = Some((at, n));
            count += 1;
        }
        assert_eq!(count, 100_000);
    }
}
