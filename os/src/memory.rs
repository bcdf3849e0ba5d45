//! Shared memory: memfds, their seals, and `MAP_SHARED` mappings.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::check;

const PROT_READ_WRITE: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;

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

/// A `MAP_SHARED` mapping: of a file ([`MappedRegion::map`]: the bytes another process
/// sees through its own mapping of the same file, or a PCI BAR through its sysfs
/// `resourceN` file), or of pinned anonymous memory ([`MappedRegion::anonymous_locked`]:
/// DMA memory a device reaches by physical address). Accesses are bounds-checked and go
/// through raw pointers, volatile accesses or atomics only. Unmapped on drop.
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

/// The page size backing [`MappedRegion::anonymous_locked`] memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// The host's base pages (4 KiB on x86-64): never physically contiguous beyond one.
    Base,
    /// 2 MiB hugetlb pages (`MAP_HUGETLB | MAP_HUGE_2MB`), from the pool the
    /// administrator reserves in `/proc/sys/vm/nr_hugepages`: each one is physically
    /// contiguous.
    Huge2M,
}

impl PageSize {
    /// Size of one page in bytes.
    pub fn bytes(self) -> u64 {
        match self {
            PageSize::Base => host_page_size(),
            PageSize::Huge2M => 2 << 20,
        }
    }
}

impl MappedRegion {
    /// Maps `len` bytes (at least 1, rounded up to whole pages) of fresh, zero-filled
    /// anonymous memory, shared (so a `fork` never turns the pages a device writes into
    /// copy-on-write copies), populated and locked with `mlock`: every page is present
    /// and stays at its physical address for the life of the mapping (hugetlb pages are
    /// never swapped or migrated by compaction; base pages are not swapped once locked).
    ///
    /// # Errors
    /// The OS error: `ENOMEM` when the hugetlb pool has no free page left (or `mlock`
    /// exceeds `RLIMIT_MEMLOCK`), `EINVAL` for a zero length.
    pub fn anonymous_locked(len: usize, page_size: PageSize) -> io::Result<Self> {
        let page = page_size.bytes();
        let map_len = (len as u64)
            .checked_next_multiple_of(page)
            .filter(|&l| len > 0 && l <= isize::MAX as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))? as usize;
        let mut flags = libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        if page_size == PageSize::Huge2M {
            flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        }
        // SAFETY: a fresh anonymous mapping chosen by the kernel (null hint, no
        // MAP_FIXED), so it cannot alias any existing Rust object; no descriptor.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), map_len, PROT_READ_WRITE, flags, -1, 0) };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        let region = Self {
            base,
            map_len,
            data: base,
            len,
            protection: Protection::READ_WRITE,
        };
        // MAP_LOCKED would not report a failure to lock; mlock does (and the region's
        // drop unmaps what we mapped if it fails).
        // SAFETY: `base..base+map_len` is exactly the mapping made above; mlock only
        // changes its residency, not its contents.
        check(unsafe { libc::mlock(region.base.as_ptr().cast(), region.map_len) })?;
        Ok(region)
    }

    /// The virtual address of the region's first byte, as a number: for translating it
    /// to a physical address ([`crate::PageMap`]). It cannot be turned back into access
    /// to the memory outside this type.
    pub fn virtual_address(&self) -> usize {
        self.data.as_ptr() as usize
    }

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

    /// A pointer to the naturally aligned `size`-byte word at `offset`, when it is inside
    /// the region and aligned.
    fn word(&self, offset: usize, size: usize) -> Option<*mut u8> {
        let pointer = self.span(offset, size)?;
        (pointer as usize % size == 0).then_some(pointer)
    }

    /// One volatile, naturally aligned 32-bit load at `offset` (a device register read:
    /// exactly one 4-byte access, never merged, split or elided), or `None` when
    /// unaligned, out of bounds or not readable.
    pub fn read_volatile_u32(&self, offset: usize) -> Option<u32> {
        let pointer = self.word(offset, 4).filter(|_| self.protection.read)?;
        // SAFETY: the pointer is 4-byte aligned and inside the live readable mapping
        // (checked by `word`); a volatile read creates no reference to the bytes.
        Some(u32::from_le(unsafe { std::ptr::read_volatile(pointer.cast::<u32>()) }))
    }

    /// One volatile, naturally aligned 32-bit store at `offset` (a device register
    /// write); false when unaligned, out of bounds or not writable.
    pub fn write_volatile_u32(&self, offset: usize, value: u32) -> bool {
        match self.word(offset, 4) {
            Some(pointer) if self.protection.write => {
                // SAFETY: the pointer is 4-byte aligned and inside the live writable
                // mapping (checked by `word`); a volatile write creates no reference.
                unsafe { std::ptr::write_volatile(pointer.cast::<u32>(), value.to_le()) };
                true
            }
            _ => false,
        }
    }

    /// One volatile, naturally aligned 64-bit load at `offset`, or `None` as for
    /// [`read_volatile_u32`](Self::read_volatile_u32).
    pub fn read_volatile_u64(&self, offset: usize) -> Option<u64> {
        let pointer = self.word(offset, 8).filter(|_| self.protection.read)?;
        // SAFETY: the pointer is 8-byte aligned and inside the live readable mapping
        // (checked by `word`); a volatile read creates no reference to the bytes.
        Some(u64::from_le(unsafe { std::ptr::read_volatile(pointer.cast::<u64>()) }))
    }

    /// One volatile, naturally aligned 64-bit store at `offset`: a single 8-byte access
    /// on 64-bit targets, which is what a doorbell needs (its halves must not be seen
    /// apart). False as for [`write_volatile_u32`](Self::write_volatile_u32).
    pub fn write_volatile_u64(&self, offset: usize, value: u64) -> bool {
        match self.word(offset, 8) {
            Some(pointer) if self.protection.write => {
                // SAFETY: the pointer is 8-byte aligned and inside the live writable
                // mapping (checked by `word`); a volatile write creates no reference.
                unsafe { std::ptr::write_volatile(pointer.cast::<u64>(), value.to_le()) };
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
    fn volatile_accesses_are_single_aligned_words_in_bounds() {
        let fd = memfd_create("rnic-os-test", 4096, false).unwrap();
        let bar = MappedRegion::map(fd.as_fd(), 0, 4096, Protection::READ_WRITE).unwrap();
        let view = MappedRegion::map(fd.as_fd(), 0, 4096, Protection::READ_WRITE).unwrap();
        assert!(bar.write_volatile_u32(0x10, 0xDEAD_BEEF));
        let mut out = [0u8; 4];
        assert!(view.read_at(0x10, &mut out));
        assert_eq!(out, 0xDEAD_BEEFu32.to_le_bytes(), "little-endian register layout");
        assert_eq!(view.read_volatile_u32(0x10), Some(0xDEAD_BEEF));
        assert!(bar.write_volatile_u64(0x230, 0x0123_4567_89AB_CDEF));
        assert_eq!(view.load_u64(0x230), Some(0x0123_4567_89AB_CDEF));
        assert_eq!(view.read_volatile_u64(0x230), Some(0x0123_4567_89AB_CDEF));
        assert_eq!(view.read_volatile_u32(0x234), Some(0x0123_4567), "high half");
        assert_eq!(bar.read_volatile_u32(0x12), None, "unaligned");
        assert!(!bar.write_volatile_u64(0x234, 1), "unaligned");
        assert_eq!(bar.read_volatile_u64(4096), None, "out of bounds");
        assert!(!bar.write_volatile_u32(4096, 1), "out of bounds");
        assert!(!bar.write_volatile_u64(usize::MAX - 7, 1), "overflowing offset");
        let read_only = MappedRegion::map(
            fd.as_fd(),
            0,
            4096,
            Protection {
                read: true,
                write: false,
            },
        )
        .unwrap();
        assert!(!read_only.write_volatile_u32(0x10, 0), "read-only");
        assert_eq!(read_only.read_volatile_u32(0x10), Some(0xDEAD_BEEF));
    }

    #[test]
    fn locked_anonymous_memory_is_zeroed_whole_pages() {
        let page = host_page_size() as usize;
        let region = MappedRegion::anonymous_locked(page + 1, PageSize::Base).unwrap();
        assert_eq!(region.len(), page + 1);
        assert_eq!(region.virtual_address() % page, 0);
        let mut out = vec![0xFFu8; page + 1];
        assert!(region.read_at(0, &mut out));
        assert!(out.iter().all(|&b| b == 0), "fresh anonymous memory is zero-filled");
        assert!(region.write_at(page, &[7]));
        assert!(!region.write_at(page + 1, &[7]), "only the length asked for is usable");
        assert_eq!(
            MappedRegion::anonymous_locked(0, PageSize::Base).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(PageSize::Huge2M.bytes(), 2 << 20);
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
