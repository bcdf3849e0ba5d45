//! Host memory for fuzzing: one flat arena that the driver and the device share, seen
//! through two views.
//!
//! * [`DriverView`] is how the harness writes rings, WQEs and contexts: anywhere in the
//!   arena, unchecked.
//! * [`DeviceView`] is what the device gets as its [`HostMemory`]. With checking on, every
//!   DMA access must lie inside one [`Window`] the driver granted, with the right kind
//!   (a read of a read window, a write of a write window); anything else — a byte between
//!   windows, a write to a WQE ring, any touch of another PD's region — panics with the
//!   access and the window, which libFuzzer reports as a crash and a test as a failure.
//!   Addresses outside the arena are unmapped, as on a real bus.
//!
//! Both views record which 4 KiB frames they wrote, so [`FuzzMemory::restore`] puts back
//! only what an input changed: the cheap half of returning to a checkpoint (the device
//! half is [`rnic_hw_model::Device::fork`]).

use std::sync::{Arc, Mutex, MutexGuard};

use rnic_hw_model::memory::{AccessKind, FRAME_SIZE};
use rnic_hw_model::{HostMemory, MemoryError};

/// What the device may do in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Nothing: the memory of an object the device must not touch (another PD's region, a
    /// QP no input addresses). Any access is a violation.
    None,
    /// DMA reads only (WQE rings, page tables, the mailbox input, read-only regions).
    Read,
    /// DMA writes only (the mailbox output).
    Write,
    /// Reads and writes (context tables, CQ and EQ rings, writable regions).
    ReadWrite,
}

impl Grant {
    fn allows(self, kind: AccessKind) -> bool {
        matches!(
            (self, kind),
            (Grant::Read | Grant::ReadWrite, AccessKind::Read) | (Grant::Write | Grant::ReadWrite, AccessKind::Write)
        )
    }
}

/// A range of bus addresses the driver granted the device, named for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// What the device may do there.
    pub grant: Grant,
    /// What the window holds, e.g. "MR 4 (PD 2)".
    pub name: String,
}

#[derive(Debug)]
struct Arena {
    bytes: Vec<u8>,
    /// One bit per frame written since the last restore, and the frames in write order.
    dirty: Vec<u64>,
    dirty_frames: Vec<u32>,
    /// Sorted by start, not overlapping.
    windows: Vec<Window>,
    checking: bool,
    /// The range whose device writes are recorded ([`FuzzMemory::watch`]).
    watched: Option<(u64, u64)>,
    /// Device writes that overlapped `watched`, in order: address and bytes.
    watched_writes: Vec<(u64, Vec<u8>)>,
}

impl Arena {
    fn offset(&self, address: u64, length: usize, kind: AccessKind) -> Result<usize, MemoryError> {
        let overflow = MemoryError::Overflow { kind, address, length };
        let end = address.checked_add(length as u64).ok_or(overflow)?;
        let size = self.bytes.len() as u64;
        let base = ARENA_BASE;
        if address < base || end > base + size {
            let unmapped = if address < base {
                address
            } else {
                (base + size).max(address)
            };
            return Err(MemoryError::Unmapped {
                kind,
                address,
                length,
                unmapped,
            });
        }
        Ok((address - base) as usize)
    }

    fn mark_dirty(&mut self, offset: usize, length: usize) {
        if length == 0 {
            return;
        }
        let first = offset / FRAME_SIZE as usize;
        let last = (offset + length - 1) / FRAME_SIZE as usize;
        for frame in first..=last {
            let (word, bit) = (frame / 64, 1u64 << (frame % 64));
            if self.dirty[word] & bit == 0 {
                self.dirty[word] |= bit;
                self.dirty_frames.push(frame as u32);
            }
        }
    }

    /// Whether the device may make this access; the violation in words if not.
    fn check(&self, kind: AccessKind, address: u64, length: usize) -> Result<(), String> {
        if !self.checking || length == 0 {
            return Ok(());
        }
        let end = address + length as u64;
        let index = self.windows.partition_point(|w| w.start <= address);
        match index.checked_sub(1).map(|i| &self.windows[i]) {
            Some(w) if end <= w.end && w.grant.allows(kind) => Ok(()),
            Some(w) if address < w.end => Err(format!(
                "DMA {kind} of {length} bytes at {address:#x} violates the window {:?} \
                 [{:#x}, {:#x}) granted {:?}",
                w.name, w.start, w.end, w.grant
            )),
            _ => Err(format!(
                "DMA {kind} of {length} bytes at {address:#x} touches memory outside every \
                 window the driver granted"
            )),
        }
    }
}

/// Bus address of the arena's first byte: the harness's DMA base.
const ARENA_BASE: u64 = crate::harness::DMA_BASE;

/// The shared arena (see the module documentation).
#[derive(Debug)]
pub struct FuzzMemory {
    arena: Mutex<Arena>,
}

impl FuzzMemory {
    /// A zeroed arena of `size` bytes (whole frames) at [`crate::harness::DMA_BASE`],
    /// with checking off and no windows.
    pub fn new(size: usize) -> Arc<Self> {
        let frames = size.div_ceil(FRAME_SIZE as usize);
        Arc::new(Self {
            arena: Mutex::new(Arena {
                bytes: vec![0; frames * FRAME_SIZE as usize],
                dirty: vec![0; frames.div_ceil(64)],
                dirty_frames: Vec::new(),
                windows: Vec::new(),
                checking: false,
                watched: None,
                watched_writes: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Arena> {
        // A violation panics while no lock is held; a poisoned lock still holds bytes.
        self.arena.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The arena's size in bytes.
    pub fn size(&self) -> usize {
        self.lock().bytes.len()
    }

    /// The driver's view.
    pub fn driver_view(self: &Arc<Self>) -> Arc<dyn HostMemory> {
        Arc::new(DriverView(self.clone()))
    }

    /// The device's view.
    pub fn device_view(self: &Arc<Self>) -> Arc<dyn HostMemory> {
        Arc::new(DeviceView(self.clone()))
    }

    /// Replaces the windows (they must not overlap) and turns checking on.
    ///
    /// # Panics
    /// If two windows overlap.
    pub fn grant(&self, mut windows: Vec<Window>) {
        windows.sort_by_key(|w| w.start);
        for pair in windows.windows(2) {
            assert!(pair[0].end <= pair[1].start, "overlapping windows {pair:?}");
        }
        let mut arena = self.lock();
        arena.windows = windows;
        arena.checking = true;
    }

    /// The windows granted.
    pub fn windows(&self) -> Vec<Window> {
        self.lock().windows.clone()
    }

    /// Turns window checking on or off (off: every access inside the arena is allowed).
    pub fn set_checking(&self, on: bool) {
        self.lock().checking = on;
    }

    /// Records, from now on, every device write that overlaps `[start, end)` (replacing an
    /// earlier watch and its record): a harness sees what the device wrote there even
    /// when a later write covers it.
    pub fn watch(&self, start: u64, end: u64) {
        let mut arena = self.lock();
        arena.watched = Some((start, end));
        arena.watched_writes.clear();
    }

    /// Ends the watch and forgets its record.
    pub fn stop_watching(&self) {
        let mut arena = self.lock();
        arena.watched = None;
        arena.watched_writes.clear();
    }

    /// The device writes recorded since [`FuzzMemory::watch`] or the last call.
    pub fn take_watched_writes(&self) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut self.lock().watched_writes)
    }

    /// A copy of the whole arena; forgets which frames were written.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut arena = self.lock();
        arena.dirty.fill(0);
        arena.dirty_frames.clear();
        arena.bytes.clone()
    }

    /// Puts every frame written since the last snapshot or restore back to its bytes in
    /// `snapshot`; returns how many frames that was.
    pub fn restore(&self, snapshot: &[u8]) -> usize {
        let mut arena = self.lock();
        let arena = &mut *arena;
        let frames = arena.dirty_frames.len();
        for frame in arena.dirty_frames.drain(..) {
            let start = frame as usize * FRAME_SIZE as usize;
            let end = start + FRAME_SIZE as usize;
            arena.bytes[start..end].copy_from_slice(&snapshot[start..end]);
            arena.dirty[frame as usize / 64] = 0;
        }
        // Clearing whole words above may have cleared bits of frames still listed: none
        // are, the list was drained in full.
        frames
    }

    /// Reads bytes (driver side; panics outside the arena).
    pub fn read_bytes(&self, address: u64, length: usize) -> Vec<u8> {
        let arena = self.lock();
        let offset = arena
            .offset(address, length, AccessKind::Read)
            .expect("inside the arena");
        arena.bytes[offset..offset + length].to_vec()
    }

    /// A 64-bit FNV-1a digest of `length` bytes at `address`, to see whether an object
    /// changed without keeping a copy.
    pub fn digest(&self, address: u64, length: usize) -> u64 {
        let arena = self.lock();
        let offset = arena
            .offset(address, length, AccessKind::Read)
            .expect("inside the arena");
        arena.bytes[offset..offset + length]
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
    }

    fn read(&self, address: u64, buffer: &mut [u8], device: bool) -> Result<(), MemoryError> {
        let arena = self.lock();
        let offset = arena.offset(address, buffer.len(), AccessKind::Read)?;
        if device {
            if let Err(violation) = arena.check(AccessKind::Read, address, buffer.len()) {
                // Without the lock held, so the arena stays usable after the panic.
                drop(arena);
                panic!("{violation}");
            }
        }
        buffer.copy_from_slice(&arena.bytes[offset..offset + buffer.len()]);
        Ok(())
    }

    fn write(&self, address: u64, data: &[u8], device: bool) -> Result<(), MemoryError> {
        let mut arena = self.lock();
        let offset = arena.offset(address, data.len(), AccessKind::Write)?;
        if device {
            if let Err(violation) = arena.check(AccessKind::Write, address, data.len()) {
                drop(arena);
                panic!("{violation}");
            }
        }
        arena.bytes[offset..offset + data.len()].copy_from_slice(data);
        arena.mark_dirty(offset, data.len());
        if let (true, Some((start, end))) = (device, arena.watched) {
            if address < end && address + data.len() as u64 > start {
                arena.watched_writes.push((address, data.to_vec()));
            }
        }
        Ok(())
    }
}

/// The driver's view of a [`FuzzMemory`]: unchecked.
#[derive(Debug)]
pub struct DriverView(Arc<FuzzMemory>);

impl HostMemory for DriverView {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.0.read(address, buffer, false)
    }
    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.0.write(address, data, false)
    }
}

/// The device's view of a [`FuzzMemory`]: every access checked against the windows.
#[derive(Debug)]
pub struct DeviceView(Arc<FuzzMemory>);

impl HostMemory for DeviceView {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.0.read(address, buffer, true)
    }
    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.0.write(address, data, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: u64, end: u64, grant: Grant) -> Window {
        Window {
            start: ARENA_BASE + start,
            end: ARENA_BASE + end,
            grant,
            name: "test".into(),
        }
    }

    #[test]
    fn the_device_may_only_do_what_a_window_grants() {
        let memory = FuzzMemory::new(0x4000);
        let device = memory.device_view();
        memory.grant(vec![
            window(0, 0x1000, Grant::Read),
            window(0x1000, 0x2000, Grant::ReadWrite),
            window(0x3000, 0x4000, Grant::None),
        ]);
        let mut buffer = [0u8; 8];
        assert!(device.read(ARENA_BASE + 8, &mut buffer).is_ok());
        assert!(device.write(ARENA_BASE + 0x1008, &buffer).is_ok());
        let denied = |f: &dyn Fn()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err();
        assert!(
            denied(&|| {
                let _ = device.write(ARENA_BASE + 8, &[1]);
            }),
            "write to a read window"
        );
        assert!(
            denied(&|| {
                let _ = device.read(ARENA_BASE + 0x2008, &mut [0]);
            }),
            "between windows"
        );
        assert!(
            denied(&|| {
                let _ = device.read(ARENA_BASE + 0x3000, &mut [0]);
            }),
            "a None window"
        );
        assert!(
            denied(&|| {
                let _ = device.read(ARENA_BASE + 0xFFC, &mut [0; 8]);
            }),
            "across two windows"
        );
        // Outside the arena the bus answers as for unmapped memory.
        assert!(matches!(
            device.read(ARENA_BASE + 0x4000, &mut buffer),
            Err(MemoryError::Unmapped { .. })
        ));
        assert!(matches!(
            device.read(u64::MAX - 2, &mut buffer),
            Err(MemoryError::Overflow { .. })
        ));
        // The driver writes anywhere.
        assert!(memory.driver_view().write(ARENA_BASE + 0x3000, &[7]).is_ok());
    }

    #[test]
    fn restore_puts_back_exactly_the_frames_written() {
        let memory = FuzzMemory::new(0x3000);
        let driver = memory.driver_view();
        driver.write(ARENA_BASE + 0x1000, &[1; 16]).unwrap();
        let snapshot = memory.snapshot();
        driver.write(ARENA_BASE + 0xFFF, &[2, 2]).unwrap();
        memory.device_view().write(ARENA_BASE + 0x2000, &[3]).unwrap();
        assert_eq!(memory.restore(&snapshot), 3);
        assert_eq!(memory.read_bytes(ARENA_BASE + 0xFFF, 3), [0, 1, 1]);
        assert_eq!(memory.read_bytes(ARENA_BASE + 0x2000, 1), [0]);
        assert_eq!(memory.restore(&snapshot), 0, "nothing written since");
    }
}
