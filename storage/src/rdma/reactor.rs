//! Who lets time pass while a protocol waits.
//!
//! A target and a host are pollers (SPDK's model): they never block, they do what their
//! completion queues and timers allow and return. A blocking call (the host's
//! `identify`, a benchmark's loop) polls its own queues and, when it has to wait, calls
//! [`Reactor::idle`]:
//!
//! * [`EmbeddedReactor`] co-simulates: it steps every other poller on the same embedded
//!   fabric (the target, in a one-process test), and when nobody did anything, runs the
//!   fabric to its next event. Virtual time, deterministic.
//! * [`WallReactor`] is for a process of its own on a real device (vfio-user, PCI): time
//!   passes anyway; it yields the CPU when there was nothing to do.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rnic_hw_model::time::Picoseconds;
use rnic_verbs::backend::EmbeddedFabric;

/// Something that makes progress when polled.
pub trait Poller: Send {
    /// Does what can be done now; returns how much (0: nothing).
    fn poll(&mut self) -> usize;
}

/// A clock, in nanoseconds since some origin.
#[derive(Clone)]
pub enum Clock {
    /// The embedded fabric's virtual time.
    Virtual(EmbeddedFabric),
    /// The wall clock since `Instant`.
    Wall(Instant),
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Clock::Virtual(_) => f.write_str("Clock::Virtual"),
            Clock::Wall(_) => f.write_str("Clock::Wall"),
        }
    }
}

impl Clock {
    /// A wall clock starting now.
    pub fn wall() -> Self {
        Clock::Wall(Instant::now())
    }

    /// Now, ns.
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Virtual(fabric) => fabric.now().as_nanos(),
            Clock::Wall(start) => start.elapsed().as_nanos() as u64,
        }
    }
}

/// Lets time pass and runs whatever shares the thread.
pub trait Reactor: Send {
    /// The clock timers are measured on.
    fn clock(&self) -> &Clock;

    /// Called between a waiter's own polls: steps every other poller once and, if
    /// neither they nor the caller (`did_work`) did anything, lets time pass.
    fn idle(&mut self, did_work: bool);
}

/// How an [`EmbeddedReactor`] lets time pass when nothing happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// To the fabric's next event (at most `step` ahead): completions are seen at the
    /// instant they are written.
    NextEvent,
    /// `step` at a time: fewer, longer runs of the model (a wall-clock benchmark).
    FixedStep,
}

/// The reactor of a one-process co-simulation on an [`EmbeddedFabric`].
pub struct EmbeddedReactor {
    fabric: EmbeddedFabric,
    clock: Clock,
    pollers: Vec<Arc<Mutex<dyn Poller>>>,
    step: Picoseconds,
    pace: Pace,
}

impl EmbeddedReactor {
    /// A reactor on `fabric` that wakes at the fabric's next event, at most 2 µs ahead.
    pub fn new(fabric: EmbeddedFabric) -> Self {
        Self {
            clock: Clock::Virtual(fabric.clone()),
            fabric,
            pollers: Vec::new(),
            step: Picoseconds::from_micros(2),
            pace: Pace::NextEvent,
        }
    }

    /// Sets how time passes when nothing happened, and the longest step.
    pub fn with_pace(mut self, pace: Pace, step: Picoseconds) -> Self {
        self.pace = pace;
        self.step = step;
        self
    }

    /// Adds a poller stepped on every [`Reactor::idle`].
    pub fn add(&mut self, poller: Arc<Mutex<dyn Poller>>) {
        self.pollers.push(poller);
    }

    /// The fabric.
    pub fn fabric(&self) -> &EmbeddedFabric {
        &self.fabric
    }

    /// Steps the pollers once; returns the work they did.
    pub fn poll_all(&mut self) -> usize {
        self.pollers
            .iter()
            .map(|poller| poller.lock().unwrap_or_else(|e| e.into_inner()).poll())
            .sum()
    }

    /// Lets time pass by the reactor's pace.
    pub fn pass_time(&self) {
        match self.pace {
            Pace::NextEvent => self.fabric.advance_to_next_event(self.step),
            Pace::FixedStep => self.fabric.advance(self.step),
        }
    }

    /// Runs the pollers (time passing when they are idle) until `done()` or `limit` of
    /// virtual time passed; returns whether `done()` became true.
    pub fn run_until(&mut self, limit: Picoseconds, mut done: impl FnMut() -> bool) -> bool {
        let deadline = self.fabric.now() + limit;
        while !done() {
            if self.fabric.now() > deadline {
                return false;
            }
            self.idle(false);
        }
        true
    }
}

impl Reactor for EmbeddedReactor {
    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn idle(&mut self, did_work: bool) {
        let others = self.poll_all();
        if others == 0 && !did_work {
            self.pass_time();
        }
    }
}

/// The reactor of a process on a device that runs in real time.
pub struct WallReactor {
    clock: Clock,
    idle_polls: u32,
}

impl Default for WallReactor {
    fn default() -> Self {
        Self {
            clock: Clock::wall(),
            idle_polls: 0,
        }
    }
}

impl Reactor for WallReactor {
    fn clock(&self) -> &Clock {
        &self.clock
    }

    fn idle(&mut self, did_work: bool) {
        if did_work {
            self.idle_polls = 0;
            return;
        }
        // Spin a little (a completion is usually microseconds away), then give the CPU
        // up: the emulator process needs it to produce the completion.
        self.idle_polls = self.idle_polls.saturating_add(1);
        if self.idle_polls > 64 {
            std::thread::sleep(std::time::Duration::from_micros(20));
        } else {
            std::thread::yield_now();
        }
    }
}
