//! Doorbell pages in shared memory, and how the server notices doorbells written there.
//!
//! BAR2's doorbell pages are a sealed memfd that the server maps and hands to the client
//! (GET_REGION_INFO with the sparse-mmap capability and the fd), so a doorbell is one
//! 8-byte store into shared memory: no socket message, no VM exit.
//!
//! ## Compare-and-clear
//!
//! Each page has two doorbell registers, the queue doorbell at 0x230 and the EQ doorbell
//! at 0x238 (one cache line). A poll pass loads both words of every page; a non-zero word
//! is taken with an atomic swap to zero and handed to the model as one 8-byte
//! `bar_write(2, offset, word)`. So a register reads 0 once the device has taken its
//! doorbell, and that is the one rule a client of the mmapped page has to follow:
//!
//! > **Before storing a doorbell through the mapping, wait until the register reads 0.**
//!
//! Without that rule two doorbells stored to the same register between two poll passes
//! would collapse into the last one — and every SQ, RQ, SRQ and CQ doorbell of a context
//! goes to the same register (0x230). Through a trapped access (REGION_WRITE, or the
//! embedded backend) the register always reads 0, so a driver that follows the rule works
//! unchanged everywhere. A zero word cannot be told from "empty"; every zero doorbell is a
//! no-op anyway (SQ doorbell of the reserved QPN 0 with PI 0, AEQ CI update to 0 without
//! arming). Doorbells must be single aligned 8-byte stores: two 4-byte halves could be
//! taken apart.
//!
//! ## Cost, and how it is bounded
//!
//! One pass is two atomic loads per page (64 pages by default: 64 cache lines), a few
//! tens of nanoseconds when nothing was written. The server polls in a loop whose sleep
//! is chosen by [`PollGovernor`]: it spins (no sleep) for `spin` after the last activity
//! (a doorbell, a message, a device event), then backs off exponentially from
//! [`MIN_SLEEP`] to `max_sleep`. The worst-case extra latency of a doorbell written into
//! an idle device is therefore `max_sleep`, and the idle CPU cost is one wake-up (a
//! `ppoll` and one pass) per `max_sleep`. Messages on the socket wake the loop at once
//! whatever the sleep. `docs/guides/emulator.md` has measured numbers.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rnic_firmware_if::doorbell::{DB_OFFSET, EQ_DB_OFFSET};
use rnic_firmware_if::regs::DOORBELL_PAGE_SIZE;

use crate::os::{self, MappedRegion, Protection};

/// The offsets inside a page that are polled.
pub const POLLED_REGISTERS: [u64; 2] = [DB_OFFSET, EQ_DB_OFFSET];

/// The doorbell pages: a sealed memfd, mapped here and mmapped by the client.
#[derive(Debug)]
pub struct DoorbellPages {
    memfd: OwnedFd,
    map: MappedRegion,
    pages: u32,
}

impl DoorbellPages {
    /// `pages` zeroed doorbell pages.
    pub fn new(pages: u32) -> io::Result<Self> {
        let len = u64::from(pages.max(1)) * DOORBELL_PAGE_SIZE;
        let memfd = os::memfd_create("rnic-emu-doorbells", len, true)?;
        let map = MappedRegion::map(memfd.as_fd(), 0, len as usize, Protection::READ_WRITE)?;
        Ok(Self {
            memfd,
            map,
            pages: pages.max(1),
        })
    }

    /// The memfd to pass to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Size of the pages in bytes (the sparse-mmap area).
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Always false: there is at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Number of pages.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// One poll pass: takes every non-zero doorbell word (compare-and-clear) and gives
    /// `forward(bar2 offset, word)` each, page by page. Returns how many were taken.
    pub fn poll(&self, mut forward: impl FnMut(u64, u64)) -> usize {
        let mut taken = 0;
        for page in 0..u64::from(self.pages) {
            for register in POLLED_REGISTERS {
                let offset = page * DOORBELL_PAGE_SIZE + register;
                // Load first: a swap is a locked read-modify-write that would pull every
                // line exclusive into this core on every pass, even when idle.
                if self.map.load_u64(offset as usize).unwrap_or(0) == 0 {
                    continue;
                }
                if let Some(word) = self.map.swap_u64(offset as usize, 0) {
                    if word != 0 {
                        forward(offset, word);
                        taken += 1;
                    }
                }
            }
        }
        taken
    }

    /// Zeroes every page (device reset).
    pub fn clear(&self) {
        self.map.zero(0, self.map.len());
    }
}

/// The shortest back-off sleep. With the thread's timer slack lowered to 1 µs (see
/// [`os::set_thread_timer_slack`]) sleeps this short are honoured.
pub const MIN_SLEEP: Duration = Duration::from_micros(1);

/// Decides how long the server loop may sleep between poll passes.
#[derive(Debug, Clone)]
pub struct PollGovernor {
    spin: Duration,
    max_sleep: Duration,
    sleep: Duration,
    last_activity: Instant,
}

impl PollGovernor {
    /// Spins for `spin` after activity, then sleeps from [`MIN_SLEEP`] doubling up to
    /// `max_sleep`.
    pub fn new(spin: Duration, max_sleep: Duration) -> Self {
        Self {
            spin,
            max_sleep: max_sleep.max(MIN_SLEEP),
            sleep: MIN_SLEEP,
            last_activity: Instant::now(),
        }
    }

    /// Records activity at `now`: the next waits are spins again.
    pub fn activity(&mut self, now: Instant) {
        self.last_activity = now;
        self.sleep = MIN_SLEEP;
    }

    /// How long the loop may wait now (`Duration::ZERO`: do not sleep).
    pub fn next_wait(&mut self, now: Instant) -> Duration {
        if now.saturating_duration_since(self.last_activity) < self.spin {
            return Duration::ZERO;
        }
        let wait = self.sleep;
        self.sleep = (self.sleep * 2).min(self.max_sleep);
        wait
    }

    /// The longest the loop ever sleeps.
    pub fn max_sleep(&self) -> Duration {
        self.max_sleep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_takes_each_written_doorbell_once_and_clears_it() {
        let pages = DoorbellPages::new(4).unwrap();
        let client = MappedRegion::map(pages.fd(), 0, pages.len() as usize, Protection::READ_WRITE).unwrap();
        assert!(client.store_u64((2 * DOORBELL_PAGE_SIZE + DB_OFFSET) as usize, 0x1234));
        assert!(client.store_u64(EQ_DB_OFFSET as usize, 0x99));
        let mut seen = Vec::new();
        assert_eq!(pages.poll(|offset, word| seen.push((offset, word))), 2);
        assert_eq!(
            seen,
            vec![(EQ_DB_OFFSET, 0x99), (2 * DOORBELL_PAGE_SIZE + DB_OFFSET, 0x1234)]
        );
        assert_eq!(client.load_u64((2 * DOORBELL_PAGE_SIZE + DB_OFFSET) as usize), Some(0));
        assert_eq!(pages.poll(|_, _| panic!("nothing new")), 0);
    }

    #[test]
    fn governor_spins_then_backs_off_to_the_cap() {
        let start = Instant::now();
        let mut governor = PollGovernor::new(Duration::from_micros(100), Duration::from_micros(8));
        governor.activity(start);
        assert_eq!(governor.next_wait(start + Duration::from_micros(50)), Duration::ZERO);
        let later = start + Duration::from_millis(1);
        let waits: Vec<u64> = (0..6).map(|_| governor.next_wait(later).as_micros() as u64).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 8, 8]);
        governor.activity(later);
        assert_eq!(governor.next_wait(later), Duration::ZERO);
    }
}
