//! Helpers shared by the MTT and HEM tests: a seeded RNG and a bus address space where
//! BT pages get real (zeroed) backing frames at random addresses.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::memory::{Backing, HostMemory, MemoryError, PagedMemory, FRAME_SIZE};

/// xorshift64: tiny, seedable, good enough for layouts.
pub(crate) struct XorShift64(u64);

impl XorShift64 {
    pub(crate) fn new(seed: u64) -> Self {
        // splitmix64 step so small seeds give unrelated streams; never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform-ish in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `num / den`.
    pub(crate) fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Prints the seed if the test panics while it is alive.
pub(crate) struct SeedGuard(pub(crate) u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failing seed: {:#x} (rerun with RNIC_TEST_SEED={:#x})", self.0, self.0);
        }
    }
}

/// The seeds to run: `RNIC_TEST_SEED` (decimal or 0x-hex) alone if set, else `0..count`
/// mixed with `salt`.
pub(crate) fn seeds(count: u64, salt: u64) -> Vec<u64> {
    if let Ok(text) = std::env::var("RNIC_TEST_SEED") {
        let text = text.trim();
        let seed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        }
        .expect("RNIC_TEST_SEED must be a number");
        return vec![seed];
    }
    (0..count)
        .map(|i| salt.wrapping_mul(0x1_0000_0001).wrapping_add(i))
        .collect()
}

/// A bus address space for one seed: BT pages are mapped onto frames of one backing made
/// once (zeroed when handed out); other pages can be mapped as aliases of two shared
/// frames. Claimed ranges never overlap.
pub(crate) struct TestSpace {
    pub(crate) memory: PagedMemory,
    backing: Arc<Backing>,
    backing_frames: usize,
    next_frame: usize,
    alias: Arc<Backing>,
    claimed: BTreeMap<u64, u64>,
}

/// Where BT pages go.
pub(crate) const BT_WINDOW: (u64, u64) = (1 << 32, 1 << 38);
/// Where data pages / chunks go.
pub(crate) const DATA_WINDOW: (u64, u64) = (1 << 40, 1 << 47);

impl TestSpace {
    pub(crate) fn new(backing_bytes: usize) -> Self {
        let backing = Backing::zeroed(backing_bytes);
        Self {
            memory: PagedMemory::new(),
            backing_frames: backing.len() / FRAME_SIZE as usize,
            backing,
            next_frame: 0,
            alias: Backing::zeroed(2 * FRAME_SIZE as usize),
            claimed: BTreeMap::new(),
        }
    }

    /// Forgets every mapping and claim (the backing is reused).
    pub(crate) fn reset(&mut self) {
        self.memory = PagedMemory::new();
        self.next_frame = 0;
        self.claimed.clear();
    }

    /// Reserves `[start, start + len)` if it overlaps nothing claimed.
    pub(crate) fn claim(&mut self, start: u64, len: u64) -> bool {
        let end = start + len;
        if let Some((_, &prev_end)) = self.claimed.range(..end).next_back() {
            if prev_end > start {
                return false;
            }
        }
        self.claimed.insert(start, end);
        true
    }

    /// A random free `align`-aligned range of `len` bytes in `window`, claimed.
    pub(crate) fn random_free(&mut self, rng: &mut XorShift64, window: (u64, u64), len: u64, align: u64) -> u64 {
        loop {
            let slots = (window.1 - window.0 - len) / align;
            let start = window.0.div_ceil(align) * align + rng.below(slots) * align;
            if self.claim(start, len) {
                return start;
            }
        }
    }

    /// Maps `len` bytes (whole frames) at `address` onto fresh zeroed backing frames.
    pub(crate) fn map_backed(&mut self, address: u64, len: u64) {
        let frames = len.div_ceil(FRAME_SIZE) as usize;
        assert!(
            self.next_frame + frames <= self.backing_frames,
            "test backing exhausted"
        );
        self.memory
            .map_contiguous(address, &self.backing, self.next_frame, frames, true);
        self.next_frame += frames;
        self.memory
            .write(address, &vec![0u8; frames * FRAME_SIZE as usize])
            .expect("zeroing a fresh BT page");
    }

    /// Maps the first and last frame of the `len`-byte page at `address` as aliases (the
    /// content is meaningless; only reachability matters).
    pub(crate) fn map_alias_ends(&self, address: u64, len: u64) {
        self.memory.map_frame(address, &self.alias, 0, true);
        let last = address + len - FRAME_SIZE;
        if last != address {
            self.memory.map_frame(last, &self.alias, 1, true);
        }
    }

    /// A zeroed, mapped BT page of `size` bytes at a random 4 KiB-aligned address.
    pub(crate) fn alloc_bt_page(&mut self, rng: &mut XorShift64, size: u64) -> u64 {
        let address = self.random_free(rng, BT_WINDOW, size, FRAME_SIZE);
        self.map_backed(address, size);
        address
    }
}

/// A [`HostMemory`] that counts reads (to check a walk reads exactly `hop` entries).
pub(crate) struct CountingMemory<'a> {
    pub(crate) inner: &'a dyn HostMemory,
    pub(crate) reads: AtomicUsize,
}

impl<'a> CountingMemory<'a> {
    pub(crate) fn new(inner: &'a dyn HostMemory) -> Self {
        Self {
            inner,
            reads: AtomicUsize::new(0),
        }
    }

    /// Reads since the last call.
    pub(crate) fn take(&self) -> usize {
        self.reads.swap(0, Ordering::Relaxed)
    }
}

impl HostMemory for CountingMemory<'_> {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(address, buffer)
    }

    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.inner.write(address, data)
    }
}
