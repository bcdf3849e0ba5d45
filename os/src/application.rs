//! A range of this process's own memory that a device model in the same process reads and
//! writes as DMA: what an RDMA application registers with `ibv_reg_mr` (heap, stack,
//! `mmap`, huge pages).
//!
//! The application keeps using the bytes while the device does, from its own threads, as
//! it would with a hardware NIC. So the range is only ever touched through raw pointer
//! copies and atomics, never through Rust references (a `&[u8]` would promise that nobody
//! writes it concurrently).
//!
//! A write stores its last byte last, with release ordering: `ib_write_lat` spins on the
//! last byte of its buffer and must then see every byte before it, as it would after a
//! PCIe write of the whole message.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU8, Ordering};

/// `length` bytes of this process's memory at `address`, as registered by an application.
/// Reads and writes are bounds-checked against the range.
#[derive(Debug)]
pub struct ApplicationRange {
    address: usize,
    length: usize,
}

impl ApplicationRange {
    /// The range `address .. address + length`.
    ///
    /// # Safety
    /// The caller promises that every byte of the range is mapped readable and writable
    /// memory of this process for as long as this value (and every clone of a reference to
    /// it) lives. That is the contract of `ibv_reg_mr`: the application keeps a registered
    /// buffer mapped until it deregisters it. The bytes may be read and written by other
    /// threads meanwhile.
    pub unsafe fn new(address: usize, length: usize) -> Option<Self> {
        address.checked_add(length)?;
        (address != 0 && length != 0).then_some(Self { address, length })
    }

    /// First byte's virtual address.
    pub fn address(&self) -> usize {
        self.address
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }

    /// True for an empty range (never: [`ApplicationRange::new`] refuses those).
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    fn pointer(&self, offset: usize, length: usize) -> Option<*mut u8> {
        let end = offset.checked_add(length)?;
        // `offset <= end <= self.length`, so the address stays inside the range.
        (end <= self.length).then_some((self.address + offset) as *mut u8)
    }

    /// Copies `out.len()` bytes at `offset` (from the range's start) out; false (and
    /// nothing copied) when the span leaves the range.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        let Some(source) = self.pointer(offset, out.len()) else {
            return false;
        };
        // SAFETY: `source..source+len` is inside the range (checked above), which the
        // constructor's caller keeps mapped and readable; `out` is a distinct Rust buffer,
        // so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(source, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` in at `offset`, the last byte last with release ordering (see the
    /// module documentation); false (and nothing written) when the span leaves the range.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        let Some(target) = self.pointer(offset, data.len()) else {
            return false;
        };
        let Some((&last, body)) = data.split_last() else {
            return true;
        };
        // SAFETY: `target..target+len` is inside the range (checked above), which the
        // constructor's caller keeps mapped and writable; `data` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), target, body.len()) };
        // SAFETY: the last byte of the checked span; an AtomicU8 has the size and
        // alignment of a u8, and every other access of the device to these bytes is a raw
        // copy or an atomic too.
        let last_byte = unsafe { AtomicU8::from_ptr(target.add(body.len())) };
        last_byte.store(last, Ordering::Release);
        true
    }
}

/// Locks the pages of `address .. address + length` in memory (`mlock`), so that their
/// physical frames stay put while a device on a PCI function reaches them by physical
/// address.
///
/// # Errors
/// What `mlock` reports (`ENOMEM` past `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`, ...).
pub fn lock_pages(address: usize, length: usize) -> std::io::Result<()> {
    // SAFETY: mlock only changes the residency of the pages; it fails (ENOMEM) for
    // addresses that are not mapped instead of touching them.
    crate::check(unsafe { libc::mlock(address as *const libc::c_void, length) }).map(|_| ())
}

/// Asks the kernel to back the whole pages of `address .. address + length` with
/// transparent huge pages where it can (`madvise(MADV_HUGEPAGE)`), as QEMU does for guest
/// RAM: a device model streaming through tens of MiB of an application's buffers then
/// takes one TLB entry per 2 MiB instead of 512. Only pages faulted in afterwards are
/// affected at once; the contents never change. The partial pages at either end are left
/// out.
///
/// # Errors
/// What `madvise` reports (`EINVAL` where transparent huge pages are not configured).
pub fn advise_huge_pages(address: usize, length: usize) -> std::io::Result<()> {
    let page = crate::host_page_size() as usize;
    let end = address.saturating_add(length) / page * page;
    let Some(start) = address.checked_next_multiple_of(page).filter(|start| *start < end) else {
        return Ok(());
    };
    // SAFETY: MADV_HUGEPAGE is advice about how the kernel backs the range: it reads and
    // writes no memory, and fails (ENOMEM) for addresses that are not mapped.
    crate::check(unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) }).map(|_| ())
}

/// Undoes [`lock_pages`] (errors ignored: the pages merely stay locked).
pub fn unlock_pages(address: usize, length: usize) {
    // SAFETY: as for mlock: residency only, no memory access.
    let _ = unsafe { libc::munlock(address as *const libc::c_void, length) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_stay_inside_the_range_and_reach_the_bytes() {
        let mut buffer = vec![0u8; 64];
        // SAFETY: `buffer` outlives `range` and is only touched through it meanwhile.
        let range = unsafe { ApplicationRange::new(buffer.as_mut_ptr() as usize, 32) }.unwrap();
        assert!(range.write_at(30, &[7, 8]));
        assert!(!range.write_at(31, &[1, 2]), "one byte past the end");
        assert!(!range.write_at(usize::MAX, &[1]), "overflowing offset");
        let mut out = [0u8; 3];
        assert!(range.read_at(29, &mut out));
        assert_eq!(out, [0, 7, 8]);
        assert!(!range.read_at(30, &mut out));
        let _ = range;
        assert_eq!(&buffer[30..33], &[7, 8, 0], "the byte after the range is untouched");
    }

    #[test]
    fn huge_page_advice_keeps_the_bytes_and_skips_partial_pages() {
        let mut buffer: Vec<u8> = (0..(8usize << 20)).map(|i| i as u8).collect();
        let address = buffer.as_ptr() as usize;
        match advise_huge_pages(address + 1, buffer.len() - 1) {
            Ok(()) => {}
            // Kernels without transparent huge pages refuse the advice; nothing changed.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        }
        buffer[4 << 20] ^= 0xff;
        assert!(buffer
            .iter()
            .enumerate()
            .all(|(i, b)| *b == if i == 4 << 20 { !(i as u8) } else { i as u8 }));
        // Less than one whole page: nothing to advise, not an error.
        advise_huge_pages(address + 1, 100).unwrap();
        advise_huge_pages(usize::MAX - 10, 20).unwrap();
    }

    #[test]
    fn empty_and_wrapping_ranges_are_refused() {
        // SAFETY: both calls fail before anything is dereferenced.
        unsafe {
            assert!(ApplicationRange::new(0x1000, 0).is_none());
            assert!(ApplicationRange::new(usize::MAX - 4, 16).is_none());
        }
    }
}
