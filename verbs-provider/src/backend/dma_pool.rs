//! DMA memory bookkeeping shared by the backends whose driver memory lives in this
//! process but is reached by the device at bus addresses: [`vfio_user`](super::vfio_user)
//! (memfd arenas DMA_MAPped at IOVAs) and [`pci`](super::pci) (pinned huge pages at
//! physical addresses).
//!
//! Only the memory behind the addresses differs between them, so everything about the
//! addresses themselves is here, once:
//!
//! * [`AddressSpace`]: the free ranges of bus-address space, first-fit carving with
//!   alignment, scattered 4 KiB pages, and giving back with merging of adjacent ranges.
//! * [`DmaPool`]: the address space plus what the [`DeviceAccess`](crate::device_access::DeviceAccess)
//!   methods keep: bytes mapped, the tokens of driver buffers and application
//!   registrations, and which ranges each one holds.
//! * [`check_dma_request`]: the validation and rounding `allocate_dma` does before any
//!   memory is touched.
//!
//! The backends map memory, copy bytes and log (each under its own tracing target);
//! nothing here touches memory.

use std::collections::{BTreeMap, HashMap};

use crate::device_access::{AccessError, DmaBuffer, UserMemory, USER_PAGE_SIZE};

const PAGE: u64 = USER_PAGE_SIZE as u64;

/// Free ranges of a bus-address space: address → length, coalesced (two ranges that
/// touch are always one entry, so adjacent memory is found as one run).
#[derive(Debug, Default)]
pub(crate) struct AddressSpace {
    free: BTreeMap<u64, u64>,
}

impl AddressSpace {
    /// First fit of `size` bytes at a multiple of `align` (a power of two); `None` when
    /// no free range holds it.
    pub(crate) fn take(&mut self, size: u64, align: u64) -> Option<u64> {
        let (start, length, address) = self.free.iter().find_map(|(&start, &length)| {
            let address = start.checked_next_multiple_of(align)?;
            (address.checked_add(size)? <= start + length).then_some((start, length, address))
        })?;
        self.split_out(start, length, address, size);
        Some(address)
    }

    /// `pages` 4 KiB pages from wherever they are free, lowest addresses first, as runs
    /// of (address, length); `None` (and nothing taken) when fewer are free.
    pub(crate) fn take_pages(&mut self, pages: u64) -> Option<Vec<(u64, u64)>> {
        if self.free.values().map(|l| l / PAGE).sum::<u64>() < pages {
            return None;
        }
        let mut runs = Vec::new();
        let mut missing = pages;
        while missing > 0 {
            let (&start, &length) = self.free.iter().find(|(_, &length)| length >= PAGE)?;
            let take = (length / PAGE).min(missing) * PAGE;
            self.free.remove(&start);
            if take < length {
                self.free.insert(start + take, length - take);
            }
            runs.push((start, take));
            missing -= take / PAGE;
        }
        Some(runs)
    }

    /// Makes `address..address+size` free again, merging it with the free ranges it
    /// touches.
    pub(crate) fn give_back(&mut self, mut address: u64, mut size: u64) {
        if let Some((&before, &length)) = self.free.range(..address).next_back() {
            if before + length == address {
                self.free.remove(&before);
                address = before;
                size += length;
            }
        }
        if let Some(length) = self.free.remove(&(address + size)) {
            size += length;
        }
        self.free.insert(address, size);
    }

    /// Removes `address..address+size` from the free ranges (memory that is going away).
    /// Does nothing unless the whole range is free.
    pub(crate) fn withdraw(&mut self, address: u64, size: u64) {
        let Some((&start, &length)) = self.free.range(..=address).next_back() else {
            return;
        };
        if start + length < address + size {
            return;
        }
        self.split_out(start, length, address, size);
    }

    /// The longest free range, in bytes.
    pub(crate) fn longest_free_run(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Replaces the free range `start..start+length` by what is left of it around
    /// `address..address+size`.
    fn split_out(&mut self, start: u64, length: u64, address: u64, size: u64) {
        self.free.remove(&start);
        if address > start {
            self.free.insert(start, address - start);
        }
        if address + size < start + length {
            self.free.insert(address + size, start + length - address - size);
        }
    }
}

/// One application buffer: the ranges its bytes were copied into, and the `Vec` to
/// copy them back into.
#[derive(Debug)]
pub(crate) struct Registration {
    /// (bus address, length) runs, in the order of the buffer's bytes.
    pub(crate) runs: Vec<(u64, u64)>,
    /// The application's own buffer.
    pub(crate) bytes: Vec<u8>,
}

/// The DMA bookkeeping of one device: free address space, bytes mapped, and the
/// buffers and registrations handed out (by token).
#[derive(Debug, Default)]
pub(crate) struct DmaPool {
    /// Free bus-address ranges of the mapped memory.
    pub(crate) space: AddressSpace,
    /// Bytes of memory mapped for DMA so far.
    pub(crate) mapped: u64,
    next_token: u64,
    allocations: HashMap<u64, (u64, u64)>,
    registrations: HashMap<u64, Registration>,
}

impl DmaPool {
    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// Records `address..address+rounded` as a driver buffer of `size` bytes.
    pub(crate) fn record_buffer(&mut self, address: u64, rounded: u64, size: usize) -> DmaBuffer {
        let token = self.token();
        self.allocations.insert(token, (address, rounded));
        DmaBuffer::new(address, size, token)
    }

    /// Gives a driver buffer's range back; `false` when the pool never handed it out
    /// (or it was freed already), and then nothing changes.
    pub(crate) fn release_buffer(&mut self, buffer: &DmaBuffer) -> bool {
        match self.allocations.remove(&buffer.token()) {
            Some((address, size)) => {
                self.space.give_back(address, size);
                true
            }
            None => false,
        }
    }

    /// Records an application buffer of `bytes.len()` bytes copied into `runs` (each a
    /// multiple of 4 KiB) and names its pages.
    pub(crate) fn record_registration(&mut self, runs: Vec<(u64, u64)>, bytes: Vec<u8>) -> UserMemory {
        let length = bytes.len();
        let pages = runs
            .iter()
            .flat_map(|&(address, size)| (0..size / PAGE).map(move |i| address + i * PAGE))
            .collect();
        let token = self.token();
        self.registrations.insert(token, Registration { runs, bytes });
        UserMemory::new(pages, length, token)
    }

    /// Takes a registration out of the pool; its runs are still in use until given back
    /// with [`release_runs`](Self::release_runs). `None` for a token the pool does not
    /// know.
    pub(crate) fn take_registration(&mut self, memory: &UserMemory) -> Option<Registration> {
        self.registrations.remove(&memory.token())
    }

    /// Gives every run back to the address space.
    pub(crate) fn release_runs(&mut self, runs: &[(u64, u64)]) {
        for &(address, size) in runs {
            self.space.give_back(address, size);
        }
    }

    /// Driver buffers currently allocated.
    pub(crate) fn buffers_in_use(&self) -> usize {
        self.allocations.len()
    }

    /// Application buffers currently registered.
    pub(crate) fn registrations_in_use(&self) -> usize {
        self.registrations.len()
    }
}

/// Checks an `allocate_dma(size, align)` request and returns (size rounded up to whole
/// 4 KiB pages, alignment of at least 4 KiB).
///
/// # Errors
/// [`AccessError::InvalidRequest`] for 0 bytes or an alignment that is not a power of
/// two up to `max_align` (named `max_align_name` in the message);
/// [`AccessError::OutOfMemory`] when the rounded size does not fit in 64 bits.
pub(crate) fn check_dma_request(
    size: usize,
    align: usize,
    max_align: u64,
    max_align_name: &dyn std::fmt::Display,
) -> Result<(u64, u64), AccessError> {
    if size == 0 {
        return Err(AccessError::InvalidRequest {
            reason: "a DMA buffer of 0 bytes".into(),
        });
    }
    if !align.is_power_of_two() || align as u64 > max_align {
        return Err(AccessError::InvalidRequest {
            reason: format!("alignment {align} is not a power of two up to {max_align_name}"),
        });
    }
    let align = (align as u64).max(PAGE);
    let rounded = (size as u64)
        .checked_next_multiple_of(PAGE)
        .ok_or(AccessError::OutOfMemory {
            size,
            align: align as usize,
        })?;
    Ok((rounded, align))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(ranges: &[(u64, u64)]) -> AddressSpace {
        let mut space = AddressSpace::default();
        for &(address, size) in ranges {
            space.give_back(address, size);
        }
        space
    }

    fn free_ranges(space: &AddressSpace) -> Vec<(u64, u64)> {
        space.free.iter().map(|(&a, &l)| (a, l)).collect()
    }

    #[test]
    fn take_is_first_fit_at_the_alignment_and_keeps_the_gap_before_it_free() {
        let mut space = space(&[(0x10000, 0x10000)]);
        let a = space.take(0x1000, 0x1000).unwrap();
        let b = space.take(0x2000, 0x4000).unwrap();
        assert_eq!((a, b), (0x10000, 0x14000));
        assert_eq!(free_ranges(&space), [(0x11000, 0x3000), (0x16000, 0xA000)]);
        // The lowest range that fits wins, even when a later one fits better.
        assert_eq!(space.take(0x1000, 0x1000), Some(0x11000));
    }

    #[test]
    fn take_skips_ranges_that_cannot_hold_the_size_once_aligned() {
        let mut space = space(&[(0x1000, 0x2000), (0x10000, 0x4000)]);
        // 0x1000..0x3000 holds 8 KiB, but not at an 8 KiB boundary.
        assert_eq!(space.take(0x2000, 0x2000), Some(0x10000));
        // Alignment overflow near the top of the address space is no fit, not a panic.
        let mut top = self::space(&[(u64::MAX - 0x1FFF, 0x1000)]);
        assert_eq!(top.take(0x1000, 1 << 63), None);
    }

    #[test]
    fn exhaustion_is_none_and_takes_nothing() {
        let mut space = space(&[(0x10000, 0x10000)]);
        assert_eq!(space.take(0x10001, 0x1000), None);
        assert_eq!(space.take_pages(17), None);
        assert_eq!(free_ranges(&space), [(0x10000, 0x10000)]);
        assert_eq!(space.take(0x10000, 0x1000), Some(0x10000));
        assert_eq!(space.take(0x1000, 0x1000), None);
        assert_eq!(space.longest_free_run(), 0);
    }

    #[test]
    fn give_back_merges_with_both_neighbours() {
        let mut space = space(&[(0x10000, 0x10000)]);
        let a = space.take(0x1000, 0x1000).unwrap();
        let b = space.take(0x2000, 0x4000).unwrap();
        space.give_back(a, 0x1000);
        space.give_back(b, 0x2000);
        assert_eq!(free_ranges(&space), [(0x10000, 0x10000)]);
        assert_eq!(space.take(0x10000, 0x1000), Some(0x10000));
        // Ranges given back out of order merge too; ranges that do not touch stay apart.
        let mut space = space_from_pieces();
        assert_eq!(free_ranges(&space), [(0x1000, 0x3000), (0x8000, 0x1000)]);
        assert_eq!(space.longest_free_run(), 0x3000);
        space.give_back(0x4000, 0x4000);
        assert_eq!(free_ranges(&space), [(0x1000, 0x8000)]);
    }

    fn space_from_pieces() -> AddressSpace {
        space(&[(0x3000, 0x1000), (0x1000, 0x1000), (0x8000, 0x1000), (0x2000, 0x1000)])
    }

    #[test]
    fn take_pages_gathers_scattered_pages_lowest_first() {
        let mut space = space(&[(0x1000, 0x2000), (0x10000, 0x1000), (0x20000, 0x8000)]);
        let runs = space.take_pages(5).unwrap();
        assert_eq!(runs, [(0x1000, 0x2000), (0x10000, 0x1000), (0x20000, 0x2000)]);
        assert_eq!(free_ranges(&space), [(0x22000, 0x6000)]);
    }

    #[test]
    fn withdraw_removes_only_a_wholly_free_range() {
        let mut space = space(&[(0x10000, 0x10000)]);
        space.withdraw(0x14000, 0x4000);
        assert_eq!(free_ranges(&space), [(0x10000, 0x4000), (0x18000, 0x8000)]);
        // Partly in use: left alone.
        space.withdraw(0x12000, 0x4000);
        space.withdraw(0x0, 0x1000);
        assert_eq!(free_ranges(&space), [(0x10000, 0x4000), (0x18000, 0x8000)]);
        space.withdraw(0x18000, 0x8000);
        assert_eq!(free_ranges(&space), [(0x10000, 0x4000)]);
    }

    #[test]
    fn buffers_are_tracked_by_token_and_unknown_ones_change_nothing() {
        let mut pool = DmaPool::default();
        pool.space.give_back(0x10000, 0x4000);
        let address = pool.space.take(0x2000, 0x1000).unwrap();
        let buffer = pool.record_buffer(address, 0x2000, 100);
        assert_eq!((buffer.address(), buffer.len()), (0x10000, 100));
        assert_eq!(pool.buffers_in_use(), 1);
        // A buffer this pool never handed out (another device's, say).
        let stranger = DmaBuffer::new(0x10000, 100, buffer.token() + 1);
        assert!(!pool.release_buffer(&stranger));
        assert_eq!(pool.buffers_in_use(), 1);
        assert_eq!(pool.space.longest_free_run(), 0x2000);
        assert!(pool.release_buffer(&buffer));
        assert_eq!(pool.buffers_in_use(), 0);
        assert_eq!(pool.space.longest_free_run(), 0x4000, "the whole range is free again");
        assert!(!pool.release_buffer(&buffer), "a second free is refused");
    }

    #[test]
    fn registrations_name_every_page_and_come_back_once() {
        let mut pool = DmaPool::default();
        pool.space.give_back(0x10000, 0x1000);
        pool.space.give_back(0x30000, 0x2000);
        let runs = pool.space.take_pages(3).unwrap();
        let memory = pool.record_registration(runs, vec![7; 2 * 4096 + 1]);
        assert_eq!(memory.pages(), [0x10000, 0x30000, 0x31000]);
        assert_eq!(memory.len(), 2 * 4096 + 1);
        assert_eq!(pool.registrations_in_use(), 1);
        let stranger = UserMemory::new(vec![0x10000], 1, memory.token() + 1);
        assert!(pool.take_registration(&stranger).is_none());
        let registration = pool.take_registration(&memory).unwrap();
        assert_eq!(registration.bytes, vec![7; 2 * 4096 + 1]);
        assert!(pool.take_registration(&memory).is_none(), "taken once");
        pool.release_runs(&registration.runs);
        assert_eq!(free_ranges(&pool.space), [(0x10000, 0x1000), (0x30000, 0x2000)]);
        assert_eq!(pool.registrations_in_use(), 0);
    }

    #[test]
    fn requests_are_checked_and_rounded_to_pages() {
        let reason = |result: Result<(u64, u64), AccessError>| match result {
            Err(AccessError::InvalidRequest { reason }) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(check_dma_request(100, 1, 1 << 20, &"1 MiB").unwrap(), (4096, 4096));
        assert_eq!(check_dma_request(4097, 8192, 1 << 20, &"1 MiB").unwrap(), (8192, 8192));
        assert_eq!(
            reason(check_dma_request(0, 4096, 1 << 20, &"x")),
            "a DMA buffer of 0 bytes"
        );
        assert_eq!(
            reason(check_dma_request(8, 3000, 1 << 20, &"the arena size")),
            "alignment 3000 is not a power of two up to the arena size"
        );
        assert!(reason(check_dma_request(8, 2 << 20, 1 << 20, &"x")).contains("alignment"));
        assert!(matches!(
            check_dma_request(usize::MAX, 4096, 1 << 20, &"x"),
            Err(AccessError::OutOfMemory { .. })
        ));
    }
}
