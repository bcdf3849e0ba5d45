//! Shared memory: memfds, their seals, and `MAP_SHARED` mappings.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::check;

/// The host's page size (4096 if `sysconf` cannot tell).
pub fn host_page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// Creates an anonymous shared-memory file (memfd) of `size` bytes, zero-filled. With
/// `seal`, its size is sealed (no shrink, no grow, no further seals), so a process it is
/// passed to cannot truncate it under our mappings (which would turn our accesses into
/// SIGBUS).
pub fn memfd_create(name: &str, size: u64, seal: bool) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: memfd_create just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = File::from(fd);
    file.set_len(size)?;
    let fd = OwnedFd::from(file);
    if seal {
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own; no pointers involved.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    }
    Ok(fd)
}

/// The seals of a memfd (`F_SEAL_*` bits), or 0 for a file that cannot be sealed.
pub fn file_seals(fd: BorrowedFd<'_>) -> u32 {
    // SAFETY: fcntl(F_GET_SEALS) on a valid borrowed descriptor; no pointers involved.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    u32::try_from(seals).unwrap_or(0)
}

/// Whether a mapping may be read and/or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protection {
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
}

impl Protection {
    /// Read and write.
    pub const READ_WRITE: Self = Self {
        read: true,
        write: true,
    };

    fn bits(self) -> libc::c_int {
        let mut prot = libc::PROT_NONE;
        if self.read {
            prot |= libc::PROT_READ;
        }
        if self.write {
            prot |= libc::PROT_WRITE;
        }
        prot
    }
}

/// A `MAP_SHARED` mapping of a file: the bytes another process sees through its own
/// mapping of the same file. Accesses are bounds-checked and go through raw pointers or
/// atomics only. Unmapped on drop.
#[derive(Debug)]
pub struct MappedRegion {
    /// Start of the mmap (page aligned) and its length, for munmap.
    base: NonNull<u8>,
    map_len: usize,
    /// First byte the caller asked for (inside the first page) and the length asked for.
    data: NonNull<u8>,
    len: usize,
    protection: Protection,
}

// SAFETY: the region is plain shared memory with no thread affinity; every access goes
// through raw-pointer copies or atomics, which are sound from any thread (concurrent
// writers can only produce torn data, as with DMA on real hardware, never UB in Rust code,
// since no reference to the bytes is ever created).
unsafe impl Send for MappedRegion {}
// SAFETY: see `Send`: `&MappedRegion` only offers raw copies and atomics.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// Maps `len` bytes of `fd` starting at file offset `offset` (any offset: the mapping
    /// starts at the page below it). `len` must be at least 1.
    pub fn map(fd: BorrowedFd<'_>, offset: u64, len: usize, protection: Protection) -> io::Result<Self> {
        let page = host_page_size();
        let delta = offset % page;
        let map_offset = offset - delta;
        let map_len = (len as u64)
            .checked_add(delta)
            .and_then(|l| l.checked_next_multiple_of(page))
            .filter(|&l| len > 0 && l <= isize::MAX as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))? as usize;
        let map_offset = libc::off_t::try_from(map_offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED), so it
        // cannot alias any existing Rust object; the descriptor is valid for the call.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                protection.bits(),
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                map_offset,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        // SAFETY: `delta < page <= map_len`, so the result stays inside the mapping.
        let data = unsafe { base.add(delta as usize) };
        Ok(Self {
            base,
            map_len,
            data,
            len,
            protection,
        })
    }

    /// Length in bytes (as asked for, not rounded to pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The protection the region was mapped with.
    pub fn protection(&self) -> Protection {
        self.protection
    }

    fn span(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        // SAFETY: `offset <= end <= self.len`, so the pointer stays inside the mapping.
        (end <= self.len).then(|| unsafe { self.data.as_ptr().add(offset) })
    }

    /// Copies `out.len()` bytes at `offset` out of the region; false when out of bounds
    /// or the region is not readable.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        match self.span(offset, out.len()) {
            Some(source) if self.protection.read => {
                // SAFETY: `source..source+len` is inside our live readable mapping (checked
                // by `span`); `out` is a distinct Rust buffer, so they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(source, out.as_mut_ptr(), out.len()) };
                true
            }
            _ => false,
        }
    }

    /// Copies `data` into the region at `offset`; false when out of bounds or the region
    /// is not writable.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        match self.span(offset, data.len()) {
            Some(target) if self.protection.write => {
                // SAFETY: `target..target+len` is inside our live writable mapping (checked
                // by `span`); `data` is a distinct Rust buffer, so they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), target, data.len()) };
                true
            }
            _ => false,
        }
    }

    /// Zeroes `len` bytes at `offset` (`zero(0, region.len())` for the whole region);
    /// false when out of bounds or the region is not writable.
    pub fn zero(&self, offset: usize, len: usize) -> bool {
        match self.span(offset, len) {
            Some(target) if self.protection.write => {
                // SAFETY: `target..target+len` is inside our live writable mapping (checked
                // by `span`).
                unsafe { std::ptr::write_bytes(target, 0, len) };
                true
            }
            _ => false,
        }
    }

    fn atomic(&self, offset: usize) -> Option<&AtomicU64> {
        if offset % 8 != 0 || !self.protection.read {
            return None;
        }
        let pointer = self.span(offset, 8)?;
        if pointer as usize % 8 != 0 {
            return None;
        }
        // SAFETY: the pointer is 8-byte aligned, inside the live mapping (checked above),
        // and the mapping outlives the returned reference (it borrows `self`). Other
        // processes access the word too; AtomicU64 is exactly the type for memory that is
        // modified concurrently.
        Some(unsafe { AtomicU64::from_ptr(pointer.cast::<u64>()) })
    }

    /// Atomically loads the aligned 64-bit word at `offset` (acquire), or `None` when
    /// `offset` is unaligned or out of bounds.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        self.atomic(offset).map(|word| word.load(Ordering::Acquire))
    }

    /// Atomically stores `value` into the aligned 64-bit word at `offset` (release);
    /// false when `offset` is unaligned, out of bounds or the region is read-only.
    pub fn store_u64(&self, offset: usize, value: u64) -> bool {
        match self.atomic(offset) {
            Some(word) if self.protection.write => {
                word.store(value, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    /// Atomically replaces the aligned 64-bit word at `offset` by `value` and returns the
    /// old value (acquire-release), or `None` as for [`load_u64`](Self::load_u64) or when
    /// the region is read-only.
    pub fn swap_u64(&self, offset: usize, value: u64) -> Option<u64> {
        match self.atomic(offset) {
            Some(word) if self.protection.write => Some(word.swap(value, Ordering::AcqRel)),
            _ => None,
        }
    }

    /// Stores `value` into the aligned 64-bit word at `offset` if it holds `current`
    /// (acquire-release); returns `Some(Ok(()))` when stored, `Some(Err(found))` when it
    /// held something else, `None` as for [`swap_u64`](Self::swap_u64).
    pub fn compare_exchange_u64(&self, offset: usize, current: u64, value: u64) -> Option<Result<(), u64>> {
        match self.atomic(offset) {
            Some(word) if self.protection.write => Some(
                word.compare_exchange(current, value, Ordering::AcqRel, Ordering::Acquire)
                    .map(|_| ()),
            ),
            _ => None,
        }
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` are exactly what mmap returned; no reference into the
        // mapping can outlive `self` (accessors hand out copies or borrow `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn two_mappings_of_one_memfd_share_bytes_and_atomics() {
        let fd = memfd_create("rnic-os-test", 8192, true).unwrap();
        let a = MappedRegion::map(fd.as_fd(), 0, 8192, Protection::READ_WRITE).unwrap();
        let b = MappedRegion::map(fd.as_fd(), 4096, 4096, Protection::READ_WRITE).unwrap();
        assert!(a.write_at(4096 + 8, &[1, 2, 3]));
        let mut out = [0u8; 3];
        assert!(b.read_at(8, &mut out));
        assert_eq!(out, [1, 2, 3]);
        assert!(b.store_u64(0x230, 0xABCD));
        assert_eq!(a.swap_u64(4096 + 0x230, 0), Some(0xABCD));
        assert_eq!(b.load_u64(0x230), Some(0));
        assert_eq!(b.compare_exchange_u64(0x238, 0, 7), Some(Ok(())));
        assert_eq!(a.compare_exchange_u64(4096 + 0x238, 0, 9), Some(Err(7)));
        assert_eq!(a.load_u64(4096 + 0x238), Some(7));
        assert!(a.zero(4096, 4096));
        assert_eq!(b.load_u64(0x238), Some(0));
        assert!(b.write_at(0, &[5]));
        assert!(b.zero(0, b.len()));
        assert_eq!(a.load_u64(4096), Some(0));
        assert!(!a.zero(8000, 200), "out of bounds");
        assert!(!a.write_at(8190, &[0; 3]), "out of bounds");
        assert_eq!(a.load_u64(3), None, "unaligned");
        assert_ne!(file_seals(fd.as_fd()) & libc::F_SEAL_SHRINK as u32, 0);
        assert!(File::from(fd).set_len(0).is_err(), "sealed against shrinking");
    }

    #[test]
    fn unaligned_file_offsets_map_from_the_page_below() {
        let fd = memfd_create("rnic-os-test", 8192, false).unwrap();
        let whole = MappedRegion::map(fd.as_fd(), 0, 8192, Protection::READ_WRITE).unwrap();
        assert!(whole.write_at(5000, b"xy"));
        let read_only = Protection {
            read: true,
            write: false,
        };
        let part = MappedRegion::map(fd.as_fd(), 5000, 2, read_only).unwrap();
        let mut out = [0u8; 2];
        assert!(part.read_at(0, &mut out));
        assert_eq!(&out, b"xy");
        assert!(!part.write_at(0, b"z"), "read-only");
        assert!(!part.zero(0, 1), "read-only");
        let words = MappedRegion::map(fd.as_fd(), 0, 8192, read_only).unwrap();
        assert_eq!(words.compare_exchange_u64(0, 0, 1), None, "read-only");
        assert_eq!(file_seals(fd.as_fd()) & libc::F_SEAL_SHRINK as u32, 0);
    }
}
