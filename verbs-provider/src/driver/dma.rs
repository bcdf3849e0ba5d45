//! DMA bookkeeping and the memory-translate-region (MTR) plumbing shared by every queue
//! and memory region.
//!
//! * [`CountingAccess`] wraps the backend and counts the DMA buffers and application
//!   registrations the driver holds, so leaks show up as numbers in tests.
//! * [`QueueBuffer`] is a driver-allocated queue buffer (CQEs, EQEs, WQEs) with its page
//!   list.
//! * [`Mtr`] is one built translation: the BT pages (allocated, written to host memory)
//!   and what a context needs to point at them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rnic_firmware_if::mtr::{MtrRegion, MIN_PAGE_SHIFT};

use crate::device_access::{AccessError, DeviceAccess, DmaBuffer, UserMemory};
use crate::mtr::{build_mtr, MtrBuildError, MtrBuildRequest};

/// Hardware page size (4 KiB).
pub const PAGE_SIZE: u64 = 1 << MIN_PAGE_SHIFT;

/// Why an MTR could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MtrError {
    /// The translation is not representable (see [`MtrBuildError`]).
    #[error("cannot build the translation table: {0}")]
    Build(#[from] MtrBuildError),
    /// BT page memory could not be allocated or written.
    #[error("BT page memory: {0}")]
    Memory(#[from] AccessError),
}

/// Outstanding DMA resources the driver holds, as counted by [`CountingAccess`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DmaUsage {
    /// Driver DMA buffers allocated and not freed.
    pub buffers: usize,
    /// Bytes in those buffers.
    pub bytes: u64,
    /// Application buffers registered and not unregistered.
    pub user_registrations: usize,
}

/// A [`DeviceAccess`] that forwards everything to the backend and counts allocations.
pub struct CountingAccess {
    inner: Box<dyn DeviceAccess>,
    buffers: AtomicUsize,
    bytes: AtomicU64,
    registrations: AtomicUsize,
}

impl std::fmt::Debug for CountingAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingAccess")
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

impl CountingAccess {
    /// Wraps `inner`.
    pub fn new(inner: Box<dyn DeviceAccess>) -> Self {
        Self {
            inner,
            buffers: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            registrations: AtomicUsize::new(0),
        }
    }

    /// What the driver holds right now.
    pub fn usage(&self) -> DmaUsage {
        DmaUsage {
            buffers: self.buffers.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            user_registrations: self.registrations.load(Ordering::Relaxed),
        }
    }
}

impl DeviceAccess for CountingAccess {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.inner.config_read(offset, data)
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        self.inner.config_write(offset, data)
    }
    fn mmio_read32(&self, bar: u8, offset: u64) -> u32 {
        self.inner.mmio_read32(bar, offset)
    }
    fn mmio_write32(&self, bar: u8, offset: u64, value: u32) {
        self.inner.mmio_write32(bar, offset, value)
    }
    fn mmio_write64(&self, bar: u8, offset: u64, value: u64) {
        self.inner.mmio_write64(bar, offset, value)
    }
    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError> {
        let buffer = self.inner.allocate_dma(size, align)?;
        self.buffers.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(buffer.len() as u64, Ordering::Relaxed);
        Ok(buffer)
    }
    fn free_dma(&self, buffer: DmaBuffer) {
        self.buffers.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(buffer.len() as u64, Ordering::Relaxed);
        self.inner.free_dma(buffer)
    }
    fn dma_read(&self, address: u64, out: &mut [u8]) -> Result<(), AccessError> {
        self.inner.dma_read(address, out)
    }
    fn dma_write(&self, address: u64, data: &[u8]) -> Result<(), AccessError> {
        self.inner.dma_write(address, data)
    }
    fn register_user_memory(&self, bytes: Vec<u8>) -> Result<UserMemory, AccessError> {
        let memory = self.inner.register_user_memory(bytes)?;
        self.registrations.fetch_add(1, Ordering::Relaxed);
        Ok(memory)
    }
    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8> {
        self.registrations.fetch_sub(1, Ordering::Relaxed);
        self.inner.unregister_user_memory(memory)
    }
    fn register_application_memory(
        &self,
        range: std::sync::Arc<crate::device_access::ApplicationRange>,
    ) -> Result<UserMemory, AccessError> {
        let memory = self.inner.register_application_memory(range)?;
        self.registrations.fetch_add(1, Ordering::Relaxed);
        Ok(memory)
    }
    fn unregister_application_memory(&self, memory: UserMemory) {
        self.registrations.fetch_sub(1, Ordering::Relaxed);
        self.inner.unregister_application_memory(memory)
    }
    fn delay(&self, nanoseconds: u64) {
        self.inner.delay(nanoseconds)
    }
    fn poll_interrupts(&self) -> Vec<u16> {
        self.inner.poll_interrupts()
    }
    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16> {
        self.inner.wait_interrupt(timeout_ns)
    }
    fn idle(&self) {
        self.inner.idle()
    }
    fn driver_memory_writes(&self) -> Option<u64> {
        self.inner.driver_memory_writes()
    }
    fn mac_address(&self) -> Option<[u8; 6]> {
        self.inner.mac_address()
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
}

/// A driver-allocated queue buffer, contiguous, whole 4 KiB pages, zero-filled.
#[derive(Debug)]
pub struct QueueBuffer {
    buffer: DmaBuffer,
    size: u64,
}

impl QueueBuffer {
    /// Allocates `size` bytes rounded up to whole pages.
    ///
    /// # Errors
    /// [`AccessError`] from the backend.
    pub fn allocate(access: &dyn DeviceAccess, size: u64) -> Result<Self, AccessError> {
        let size = size.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let buffer = access.allocate_dma(size as usize, PAGE_SIZE as usize)?;
        Ok(Self { buffer, size })
    }

    /// Bus address of the first byte.
    pub fn address(&self) -> u64 {
        self.buffer.address()
    }

    /// Size in bytes (whole pages).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bus address of each 4 KiB page.
    pub fn pages(&self) -> Vec<u64> {
        (0..self.size / PAGE_SIZE)
            .map(|i| self.buffer.address() + i * PAGE_SIZE)
            .collect()
    }

    /// Frees the buffer.
    pub fn release(self, access: &dyn DeviceAccess) {
        access.free_dma(self.buffer);
    }
}

/// A built translation: its BT pages live in driver DMA memory.
#[derive(Debug)]
pub struct Mtr {
    root: u64,
    ba_page_shift: u32,
    buffer_page_shift: u32,
    regions: Vec<MtrRegion>,
    first_pages: [u64; 2],
    bt_pages: Vec<DmaBuffer>,
}

impl Mtr {
    /// Builds the translation of `pages` (bus addresses of buffer pages of
    /// `1 << buffer_page_shift` bytes) split into `regions`, allocating and writing its BT
    /// pages of `1 << ba_page_shift` bytes.
    ///
    /// # Errors
    /// [`MtrError`]; nothing stays allocated on failure.
    pub fn create(
        access: &dyn DeviceAccess,
        regions: &[MtrRegion],
        pages: &[u64],
        buffer_page_shift: u32,
        ba_page_shift: u32,
    ) -> Result<Self, MtrError> {
        let bt_page_size = 1usize << ba_page_shift;
        let mut allocated: Vec<DmaBuffer> = Vec::new();
        let mut allocation_error = None;
        let request = MtrBuildRequest {
            ba_page_shift,
            buffer_page_shift,
            regions,
            pages,
        };
        let built = build_mtr(
            &request,
            &mut || match access.allocate_dma(bt_page_size, bt_page_size) {
                Ok(page) => {
                    let address = page.address();
                    allocated.push(page);
                    Ok(address)
                }
                Err(e) => {
                    let reason = e.to_string();
                    allocation_error = Some(e);
                    Err(MtrBuildError::BtAllocation { reason })
                }
            },
        );
        let free_all = |allocated: Vec<DmaBuffer>| {
            for page in allocated {
                access.free_dma(page);
            }
        };
        let built = match built {
            Ok(built) => built,
            Err(e) => {
                free_all(allocated);
                return Err(match allocation_error {
                    Some(access_error) => MtrError::Memory(access_error),
                    None => MtrError::Build(e),
                });
            }
        };
        for page in &built.bt_pages {
            if let Err(e) = access.dma_write(page.address, &page.to_bytes()) {
                free_all(allocated);
                return Err(e.into());
            }
        }
        Ok(Self {
            root: built.root,
            ba_page_shift,
            buffer_page_shift,
            regions: regions.to_vec(),
            first_pages: [pages.first().copied().unwrap_or(0), pages.get(1).copied().unwrap_or(0)],
            bt_pages: allocated,
        })
    }

    /// The root address a context carries (`>> 3` in most contexts).
    pub fn root(&self) -> u64 {
        self.root
    }

    /// BT page shift.
    pub fn ba_page_shift(&self) -> u32 {
        self.ba_page_shift
    }

    /// Buffer page shift.
    pub fn buffer_page_shift(&self) -> u32 {
        self.buffer_page_shift
    }

    /// BT page size encoded for a `*_BA_PG_SZ` field.
    pub fn ba_page_size_field(&self) -> u8 {
        (self.ba_page_shift - MIN_PAGE_SHIFT) as u8
    }

    /// Buffer page size encoded for a `*_BUF_PG_SZ` field.
    pub fn buffer_page_size_field(&self) -> u8 {
        (self.buffer_page_shift - MIN_PAGE_SHIFT) as u8
    }

    /// The regions as built.
    pub fn regions(&self) -> &[MtrRegion] {
        &self.regions
    }

    /// Hop number of the first region (single-region buffers).
    pub fn hop(&self) -> u8 {
        self.regions.first().map_or(0, |r| r.hop)
    }

    /// Bus addresses of the first two pages ("current" and "next" block), 0 if absent.
    pub fn first_pages(&self) -> [u64; 2] {
        self.first_pages
    }

    /// Number of BT pages this translation uses.
    pub fn bt_page_count(&self) -> usize {
        self.bt_pages.len()
    }

    /// Frees the BT pages (the device must no longer use them).
    pub fn release(self, access: &dyn DeviceAccess) {
        for page in self.bt_pages {
            access.free_dma(page);
        }
    }
}

/// Page-list compression for memory regions: the largest page shift (at most
/// `max_shift`, among those `page_size_cap` allows) such that the 4 KiB `pages` form
/// naturally aligned, physically contiguous blocks of that size and `iova` is aligned to
/// it. Returns the shift and the block addresses.
pub fn largest_page_blocks(pages: &[u64], iova: u64, page_size_cap: u32, max_shift: u32) -> (u32, Vec<u64>) {
    let fits = |shift: u32| -> bool {
        let size = 1u64 << shift;
        let per_block = 1usize << (shift - MIN_PAGE_SHIFT);
        if iova & (size - 1) != 0 {
            return false;
        }
        pages.chunks(per_block).all(|block| {
            block[0] & (size - 1) == 0
                && block
                    .iter()
                    .enumerate()
                    .all(|(i, &p)| p == block[0] + i as u64 * PAGE_SIZE)
        })
    };
    // page_size_cap: bit s set = pages of 2^s bytes supported (hns caps format).
    let mut shift = max_shift.min(31);
    while shift > MIN_PAGE_SHIFT {
        let allowed = page_size_cap == 0 || page_size_cap & (1 << shift) != 0;
        // A block larger than the whole buffer only wastes translation reach.
        let useful = (pages.len() as u64) << MIN_PAGE_SHIFT > (1u64 << shift) / 2;
        if allowed && useful && fits(shift) {
            break;
        }
        shift -= 1;
    }
    let per_block = 1usize << (shift - MIN_PAGE_SHIFT);
    let blocks = pages.chunks(per_block).map(|block| block[0]).collect();
    (shift, blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_aligned_pages_become_one_large_page() {
        let pages: Vec<u64> = (0..16).map(|i| 0x100_0000 + i * PAGE_SIZE).collect();
        let (shift, blocks) = largest_page_blocks(&pages, 0x100_0000, 0xFFFF_F000, 30);
        assert_eq!(shift, 16);
        assert_eq!(blocks, vec![0x100_0000]);
    }

    #[test]
    fn scattered_pages_stay_4k() {
        let pages = [0x5000, 0x3000, 0x9000];
        let (shift, blocks) = largest_page_blocks(&pages, 0x5000, 0xFFFF_F000, 30);
        assert_eq!(shift, 12);
        assert_eq!(blocks, pages.to_vec());
    }

    #[test]
    fn iova_alignment_limits_the_page_size() {
        let pages: Vec<u64> = (0..4).map(|i| 0x10_0000 + i * PAGE_SIZE).collect();
        let (shift, _) = largest_page_blocks(&pages, 0x2000, 0xFFFF_F000, 30);
        assert_eq!(shift, 13);
    }

    #[test]
    fn pairs_of_contiguous_pages_give_8k_pages_with_a_partial_last_block() {
        let pages = [0x2_0000, 0x2_1000, 0x8_0000, 0x8_1000, 0x4_0000];
        let (shift, blocks) = largest_page_blocks(&pages, 0, 0xFFFF_F000, 30);
        assert_eq!(shift, 13);
        assert_eq!(blocks, vec![0x2_0000, 0x8_0000, 0x4_0000]);
    }
}
