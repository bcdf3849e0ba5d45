//! The client's DMA maps, and the device's view of them as [`HostMemory`].
//!
//! * An fd-backed map is mmapped `MAP_SHARED` with exactly the protection the client
//!   granted (DMA_MAP READ/WRITE flags), so the device and the client (a VM's RAM, or a
//!   user-space driver's buffers) share the bytes.
//! * An fd-less map (QEMU sends those for ROMs, anonymous RAM and other devices' BARs) is
//!   recorded and never touched: a device access into it fails with
//!   [`MemoryError::Permission`], which the model counts as a DMA error and diagnoses.
//!   (Reaching such memory needs server→client DMA_READ/DMA_WRITE messages, not
//!   implemented.)
//! * A map is found by IOVA range; an access may span adjacent maps.
//!
//! The device loop and the protocol loop are one thread, so when DMA_UNMAP is answered no
//! device access to the range is in flight; the lock is only there because the model's
//! `HostMemory` must be `Sync`.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::RwLock;

use rnic_hw_model::memory::{AccessKind, HostMemory, MemoryError};

use super::protocol::{dma_map_flags, DmaMap, Errno};
use crate::os::{self, MappedRegion, Protection};

/// One DMA map.
#[derive(Debug)]
struct Mapping {
    size: u64,
    readable: bool,
    writable: bool,
    /// `None` for an fd-less map.
    region: Option<MappedRegion>,
    /// Whether a refused access into this fd-less map was already logged.
    warned: std::sync::atomic::AtomicBool,
}

/// The client's DMA maps, keyed by IOVA.
#[derive(Debug, Default)]
pub struct DmaSpace {
    maps: RwLock<BTreeMap<u64, Mapping>>,
}

/// A summary of one map, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSummary {
    /// IOVA of the first byte.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Whether the map has an fd (is reachable by the device).
    pub backed: bool,
}

impl DmaSpace {
    /// An empty space.
    pub fn new() -> Self {
        Self::default()
    }

    fn read_maps(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Mapping>> {
        // A panic while holding the lock cannot leave the map inconsistent.
        self.maps.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_maps(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, Mapping>> {
        self.maps.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of maps.
    pub fn len(&self) -> usize {
        self.read_maps().len()
    }

    /// True when nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every map, in address order.
    pub fn summary(&self) -> Vec<MapSummary> {
        self.read_maps()
            .iter()
            .map(|(&address, m)| MapSummary {
                address,
                size: m.size,
                backed: m.region.is_some(),
            })
            .collect()
    }

    /// Adds a map (DMA_MAP). `fd` is the descriptor that came with the message, if any.
    /// Fails with EINVAL for bad flags, sizes or alignment, EEXIST over an existing map,
    /// ENOSPC beyond `max_maps`, EBADF for an fd that is not a regular file big enough
    /// for the range, or the errno of a failed mmap.
    pub fn map(&self, request: &DmaMap, fd: Option<OwnedFd>, max_maps: usize) -> Result<(), Errno> {
        let known = dma_map_flags::READ | dma_map_flags::WRITE;
        if request.flags & !known != 0 || request.flags & known == 0 {
            return Err(Errno::EINVAL);
        }
        let page = os::PAGE_SIZE;
        let end = request.address.checked_add(request.size).ok_or(Errno::EINVAL)?;
        if request.size == 0 || request.address % page != 0 || request.size % page != 0 {
            return Err(Errno::EINVAL);
        }
        let readable = request.flags & dma_map_flags::READ != 0;
        let writable = request.flags & dma_map_flags::WRITE != 0;
        {
            let maps = self.read_maps();
            if maps.len() >= max_maps {
                return Err(Errno::ENOSPC);
            }
            if overlaps(&maps, request.address, end) {
                return Err(Errno::EEXIST);
            }
        }
        let region = match fd {
            None => None,
            Some(fd) => Some(map_file(fd, request, readable, writable)?),
        };
        let mut maps = self.write_maps();
        // Re-checked under the write lock; the server is single-threaded, so this is only
        // a guard against future callers.
        if overlaps(&maps, request.address, end) {
            return Err(Errno::EEXIST);
        }
        maps.insert(
            request.address,
            Mapping {
                size: request.size,
                readable,
                writable,
                region,
                warned: Default::default(),
            },
        );
        Ok(())
    }

    /// Removes the map that exactly matches `address` and `size` (DMA_UNMAP); ENOENT when
    /// there is none.
    pub fn unmap(&self, address: u64, size: u64) -> Result<(), Errno> {
        let mut maps = self.write_maps();
        match maps.get(&address) {
            Some(m) if m.size == size => {
                maps.remove(&address);
                Ok(())
            }
            _ => Err(Errno::ENOENT),
        }
    }

    /// Removes every map (DMA_UNMAP with the ALL flag, or client disconnect). Returns how
    /// many there were.
    pub fn clear(&self) -> usize {
        let mut maps = self.write_maps();
        let count = maps.len();
        maps.clear();
        count
    }

    /// Runs `each(map, offset in map, range in the access)` over the maps covering
    /// `address .. address + length`, after checking the whole range is covered by maps
    /// that allow `kind` (so a failing access changes nothing).
    fn access(
        &self,
        kind: AccessKind,
        address: u64,
        length: usize,
        mut each: impl FnMut(&MappedRegion, usize, std::ops::Range<usize>),
    ) -> Result<(), MemoryError> {
        let end = address
            .checked_add(length as u64)
            .ok_or(MemoryError::Overflow { kind, address, length })?;
        if length == 0 {
            // As PagedMemory: an empty access touches nothing and always succeeds.
            return Ok(());
        }
        let maps = self.read_maps();
        let mut pieces: Vec<(&MappedRegion, usize, std::ops::Range<usize>)> = Vec::with_capacity(1);
        let mut current = address;
        while current < end {
            let unmapped = MemoryError::Unmapped {
                kind,
                address,
                length,
                unmapped: current,
            };
            let (&start, mapping) = maps.range(..=current).next_back().ok_or(unmapped)?;
            if current >= start + mapping.size {
                return Err(unmapped);
            }
            let Some(region) = &mapping.region else {
                if !mapping.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        target: "rnic_emu::dma",
                        address = format_args!("{current:#x}"),
                        map = format_args!("{start:#x}+{:#x}", mapping.size),
                        "device DMA into a map the client gave no fd for: refused (share guest RAM \
                         with memory-backend-memfd,share=on)"
                    );
                }
                return Err(MemoryError::Permission { kind, address: current });
            };
            let allowed = match kind {
                AccessKind::Read => mapping.readable,
                AccessKind::Write => mapping.writable,
            };
            if !allowed {
                return Err(MemoryError::Permission { kind, address: current });
            }
            let chunk_end = end.min(start + mapping.size);
            let done = (current - address) as usize;
            let chunk = (chunk_end - current) as usize;
            pieces.push((region, (current - start) as usize, done..done + chunk));
            current = chunk_end;
        }
        for (region, offset, range) in pieces {
            each(region, offset, range);
        }
        Ok(())
    }
}

fn overlaps(maps: &BTreeMap<u64, Mapping>, start: u64, end: u64) -> bool {
    if let Some((&before, m)) = maps.range(..end).next_back() {
        if before + m.size > start {
            return true;
        }
    }
    false
}

fn map_file(fd: OwnedFd, request: &DmaMap, readable: bool, writable: bool) -> Result<MappedRegion, Errno> {
    let file = File::from(fd);
    let metadata = file.metadata().map_err(|e| Errno::from_io(&e))?;
    // Mapping a range past the end of the file would turn device accesses into SIGBUS,
    // which kills the whole emulator; refuse it up front.
    let end = request.offset.checked_add(request.size).ok_or(Errno::EINVAL)?;
    if !metadata.file_type().is_file() || metadata.len() < end {
        // A client can send these at will: bounded like any diagnostic.
        rnic_diag::warn!(
            rnic_diag::global(),
            rnic_diag::Kind::new("vfio-user", "DMA_MAP fd"),
            regular = metadata.file_type().is_file(),
            file_size = metadata.len(),
            range_end = end,
            "DMA_MAP fd is not a regular file covering the range"
        );
        return Err(Errno::EBADF);
    }
    let seals = os::file_seals(file.as_fd());
    if seals & libc::F_SEAL_SHRINK as u32 == 0 {
        // Not refused (QEMU's memory-backend-file is unsealed too), but a client that
        // truncates the file later can crash the emulator with SIGBUS.
        tracing::debug!(target: "rnic_emu::dma", "DMA_MAP fd is not sealed against shrinking");
    }
    let length = usize::try_from(request.size).map_err(|_| Errno::EINVAL)?;
    MappedRegion::map(
        file.as_fd(),
        request.offset,
        length,
        Protection {
            read: readable,
            write: writable,
        },
    )
    .map_err(|e| Errno::from_io(&e))
}

impl HostMemory for DmaSpace {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let length = buffer.len();
        self.access(AccessKind::Read, address, length, |region, offset, range| {
            // Bounds were checked against the map size, which is the region length.
            let ok = region.read_at(offset, &mut buffer[range]);
            debug_assert!(ok);
        })
    }

    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.access(AccessKind::Write, address, data.len(), |region, offset, range| {
            let ok = region.write_at(offset, &data[range]);
            debug_assert!(ok);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(address: u64, size: u64, flags: u32) -> DmaMap {
        DmaMap {
            argsz: 32,
            flags,
            offset: 0,
            address,
            size,
        }
    }

    const RW: u32 = dma_map_flags::READ | dma_map_flags::WRITE;

    #[test]
    fn accesses_span_adjacent_maps_and_fail_atomically() {
        let space = DmaSpace::new();
        let a = os::memfd_create("dma-a", 4096, true).unwrap();
        let b = os::memfd_create("dma-b", 4096, true).unwrap();
        space.map(&request(0x10000, 4096, RW), Some(a), 16).unwrap();
        space.map(&request(0x11000, 4096, RW), Some(b), 16).unwrap();
        space.write(0x10FFE, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        space.read(0x10FFE, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        let error = space.write(0x11FFE, &[9; 4]).unwrap_err();
        assert!(matches!(error, MemoryError::Unmapped { unmapped: 0x12000, .. }));
        space.read(0x11FFE, &mut out[..2]).unwrap();
        assert_eq!(out[..2], [0, 0], "a failed write writes nothing");
    }

    #[test]
    fn fdless_maps_are_accepted_but_never_touched() {
        let space = DmaSpace::new();
        space.map(&request(0x20000, 8192, RW), None, 16).unwrap();
        assert!(matches!(
            space.read(0x20010, &mut [0u8; 8]),
            Err(MemoryError::Permission {
                kind: AccessKind::Read,
                ..
            })
        ));
    }

    #[test]
    fn protection_follows_the_map_flags() {
        let space = DmaSpace::new();
        let fd = os::memfd_create("dma-ro", 4096, true).unwrap();
        space
            .map(&request(0x30000, 4096, dma_map_flags::READ), Some(fd), 16)
            .unwrap();
        assert!(space.read(0x30000, &mut [0u8; 8]).is_ok());
        assert!(matches!(
            space.write(0x30000, &[1]),
            Err(MemoryError::Permission { .. })
        ));
    }

    #[test]
    fn map_validation_and_exact_unmap() {
        let space = DmaSpace::new();
        assert_eq!(space.map(&request(0x1000, 4096, 0), None, 16), Err(Errno::EINVAL));
        assert_eq!(space.map(&request(0x1001, 4096, RW), None, 16), Err(Errno::EINVAL));
        assert_eq!(
            space.map(&request(u64::MAX - 4095, 8192, RW), None, 16),
            Err(Errno::EINVAL)
        );
        space.map(&request(0x4000, 8192, RW), None, 16).unwrap();
        assert_eq!(space.map(&request(0x5000, 4096, RW), None, 16), Err(Errno::EEXIST));
        assert_eq!(space.map(&request(0x3000, 8192, RW), None, 16), Err(Errno::EEXIST));
        assert_eq!(space.map(&request(0x8000, 4096, RW), None, 1), Err(Errno::ENOSPC));
        assert_eq!(space.unmap(0x4000, 4096), Err(Errno::ENOENT));
        assert_eq!(space.unmap(0x5000, 4096), Err(Errno::ENOENT));
        space.unmap(0x4000, 8192).unwrap();
        assert!(space.is_empty());
        let small = os::memfd_create("dma-small", 4096, true).unwrap();
        assert_eq!(space.map(&request(0, 8192, RW), Some(small), 16), Err(Errno::EBADF));
    }
}
