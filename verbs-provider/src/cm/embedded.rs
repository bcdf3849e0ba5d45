//! Driving connection managers whose devices are embedded NICs, on the fabric's virtual
//! time, from one thread: what a test or an in-process tool runs instead of a progress
//! thread. The same seeds give the same run.

use rnic_hw_model::time::Picoseconds;

use super::manager::ConnectionManager;
use crate::backend::EmbeddedFabric;

/// Rounds of [`ConnectionManager::progress`] over every manager before time may pass: a
/// MAD one manager sends can land at another during the same round.
const SETTLE_ROUNDS: usize = 64;

/// Runs every manager until none has anything to do at the current instant.
pub fn settle(managers: &[&ConnectionManager]) {
    for _ in 0..SETTLE_ROUNDS {
        let mut any = false;
        for manager in managers {
            any |= manager.progress();
        }
        if !any {
            return;
        }
    }
}

/// Settles, then lets virtual time pass to the next thing that can happen — a frame, a
/// device event, a connection-manager timer — but at most `limit_ns`.
pub fn step(fabric: &EmbeddedFabric, managers: &[&ConnectionManager], limit_ns: u64) {
    settle(managers);
    // Frames a doorbell made are on the wire for the fabric only once collected.
    fabric.advance(Picoseconds::ZERO);
    let now = fabric.now().0 / 1000;
    let timer = managers.iter().filter_map(|m| m.next_deadline_ns()).min();
    let limit = timer.map_or(limit_ns, |t| t.saturating_sub(now).clamp(1, limit_ns));
    fabric.advance_to_next_event(Picoseconds::from_nanos(limit.max(1)));
}

/// Steps until `done` says so or `limit_ns` of virtual time passed; returns whether `done`.
pub fn run_until(
    fabric: &EmbeddedFabric,
    managers: &[&ConnectionManager],
    limit_ns: u64,
    mut done: impl FnMut() -> bool,
) -> bool {
    let end = (fabric.now().0 / 1000).saturating_add(limit_ns);
    loop {
        settle(managers);
        if done() {
            return true;
        }
        if fabric.now().0 / 1000 >= end {
            return false;
        }
        step(fabric, managers, end - fabric.now().0 / 1000);
    }
}
