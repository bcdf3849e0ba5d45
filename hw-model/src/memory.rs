//! Host memory as the device sees it: DMA reads and writes at bus addresses, behind one
//! trait in the rust-vmm `GuestMemory` manner. Every access is bounds-checked here; the
//! rest of the model never touches host memory any other way.
//!
//! [`PagedMemory`] is the in-process implementation: an address space of 4 KiB frames,
//! each mapped to a page of some backing buffer, so tests and the embedded backend can
//! lay buffers out contiguously or scattered, as an IOMMU would.

use std::sync::{Arc, RwLock};

use rnic_firmware_if::bits::Layout;

use crate::fast_hash::FastHashMap;

/// Why a DMA access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// Some byte of the access is not mapped.
    #[error("DMA {kind} of {length} bytes at {address:#x}: address {unmapped:#x} is not mapped")]
    Unmapped {
        /// Read or write.
        kind: AccessKind,
        /// First byte of the access.
        address: u64,
        /// Length of the access in bytes.
        length: usize,
        /// First unmapped byte.
        unmapped: u64,
    },
    /// The access wraps past the end of the 64-bit address space.
    #[error("DMA {kind} of {length} bytes at {address:#x} wraps the address space")]
    Overflow {
        /// Read or write.
        kind: AccessKind,
        /// First byte of the access.
        address: u64,
        /// Length of the access in bytes.
        length: usize,
    },
    /// The mapping does not allow this kind of access.
    #[error("DMA {kind} at {address:#x}: mapping is not {kind}able")]
    Permission {
        /// Read or write.
        kind: AccessKind,
        /// Faulting address.
        address: u64,
    },
}

/// Direction of a DMA access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// Device reads host memory.
    Read,
    /// Device writes host memory.
    Write,
}

impl std::fmt::Display for AccessKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AccessKind::Read => "read",
            AccessKind::Write => "write",
        })
    }
}

/// Host memory reachable by DMA. Implementations use interior mutability: the driver and
/// the device share the same memory, as they share RAM on a real machine.
pub trait HostMemory: Send + Sync {
    /// Reads `buffer.len()` bytes at bus address `address`.
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;
    /// Writes `data` at bus address `address`.
    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError>;
}

/// Typed helpers over [`HostMemory`].
pub trait HostMemoryExt: HostMemory {
    /// Reads a little-endian u32.
    fn read_u32(&self, address: u64) -> Result<u32, MemoryError> {
        let mut b = [0u8; 4];
        self.read(address, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    /// Reads a little-endian u64.
    fn read_u64(&self, address: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(address, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// Writes a little-endian u32.
    fn write_u32(&self, address: u64, value: u32) -> Result<(), MemoryError> {
        self.write(address, &value.to_le_bytes())
    }
    /// Writes a little-endian u64.
    fn write_u64(&self, address: u64, value: u64) -> Result<(), MemoryError> {
        self.write(address, &value.to_le_bytes())
    }
    /// Reads a firmware-interface layout.
    fn read_layout<L: Layout>(&self, address: u64) -> Result<L, MemoryError> {
        let mut value = L::zeroed();
        self.read(address, value.bytes_mut())?;
        Ok(value)
    }
    /// Writes a firmware-interface layout.
    fn write_layout<L: Layout>(&self, address: u64, value: &L) -> Result<(), MemoryError> {
        self.write(address, value.bytes())
    }
}

impl<T: HostMemory + ?Sized> HostMemoryExt for T {}

/// Size of a frame of [`PagedMemory`].
pub const FRAME_SIZE: u64 = 4096;

// A backing's read-ahead is its next frame.
const _: () = assert!(FRAME_SIZE as usize == rnic_os::READ_AHEAD_BYTES);

/// A buffer that backs mapped frames; shared between the mapper and the memory.
///
/// A copy that ends at a frame boundary asks the CPU for the backing's next frame
/// ([`rnic_os::read_ahead`], into its second-level cache): the transport moves a message
/// a packet, and so a frame, at a time, with the rest of a packet's work between two
/// frames of the same buffer, and the CPU's own prefetchers stop at the page boundary
/// (docs/benchmarks.md, "Cold buffers"). Only a hint: what an access reads or writes
/// does not depend on it.
#[derive(Debug)]
pub struct Backing {
    bytes: RwLock<Box<[u8]>>,
}

impl Backing {
    /// A zero-filled backing of `len` bytes (rounded up to whole frames).
    pub fn zeroed(len: usize) -> Arc<Self> {
        let len = (len as u64).div_ceil(FRAME_SIZE) * FRAME_SIZE;
        Self::from_vec(vec![0u8; len as usize])
    }

    /// A backing that takes ownership of `bytes` (padded with zeroes to whole frames).
    pub fn from_vec(mut bytes: Vec<u8>) -> Arc<Self> {
        let len = (bytes.len() as u64).div_ceil(FRAME_SIZE).max(1) * FRAME_SIZE;
        bytes.resize(len as usize, 0);
        Arc::new(Self {
            bytes: RwLock::new(bytes.into_boxed_slice()),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when the backing has no bytes (never, for frames made by this module).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies bytes out at `offset`; false if out of range.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        let bytes = self.bytes.read().unwrap_or_else(|e| e.into_inner());
        match offset.checked_add(out.len()).and_then(|end| bytes.get(offset..end)) {
            Some(src) => {
                out.copy_from_slice(src);
                rnic_os::read_ahead(&bytes, offset + out.len());
                true
            }
            None => false,
        }
    }

    /// Copies bytes in at `offset`; false if out of range.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        let mut bytes = self.bytes.write().unwrap_or_else(|e| e.into_inner());
        match offset
            .checked_add(data.len())
            .and_then(|end| bytes.get_mut(offset..end))
        {
            Some(dst) => {
                dst.copy_from_slice(data);
                rnic_os::read_ahead(&bytes, offset + data.len());
                true
            }
            None => false,
        }
    }

    /// Takes the bytes back out (e.g. when an application buffer is unregistered).
    pub fn into_vec(self: Arc<Self>) -> Result<Vec<u8>, Arc<Self>> {
        Arc::try_unwrap(self).map(|b| b.bytes.into_inner().unwrap_or_else(|e| e.into_inner()).into_vec())
    }
}

#[derive(Debug, Clone)]
struct Frame {
    backing: Arc<Backing>,
    /// Byte offset of this frame inside the backing.
    offset: usize,
    writable: bool,
}

/// Frame number → frame; looked up on every DMA access, hence the one-multiply hasher.
type FrameMap = FastHashMap<u64, Frame>;

/// An address space of 4 KiB frames, each mapped to one frame-sized piece of a
/// [`Backing`]. Unmapped addresses fail with [`MemoryError::Unmapped`].
#[derive(Debug, Default)]
pub struct PagedMemory {
    frames: RwLock<FrameMap>,
}

impl PagedMemory {
    /// An empty address space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `frame_count` frames of `backing` starting at its frame `first_frame` to the
    /// frame-aligned bus address `address`, contiguously.
    pub fn map_contiguous(
        &self,
        address: u64,
        backing: &Arc<Backing>,
        first_frame: usize,
        frame_count: usize,
        writable: bool,
    ) {
        for i in 0..frame_count {
            self.map_frame(address + i as u64 * FRAME_SIZE, backing, first_frame + i, writable);
        }
    }

    /// Maps frame `frame` of `backing` at the frame-aligned bus address `address`.
    pub fn map_frame(&self, address: u64, backing: &Arc<Backing>, frame: usize, writable: bool) {
        debug_assert_eq!(address % FRAME_SIZE, 0);
        let mut frames = self.frames.write().unwrap_or_else(|e| e.into_inner());
        frames.insert(
            address / FRAME_SIZE,
            Frame {
                backing: backing.clone(),
                offset: frame * FRAME_SIZE as usize,
                writable,
            },
        );
    }

    /// Removes the mapping of the frame at `address`; returns whether one existed.
    pub fn unmap_frame(&self, address: u64) -> bool {
        let mut frames = self.frames.write().unwrap_or_else(|e| e.into_inner());
        frames.remove(&(address / FRAME_SIZE)).is_some()
    }

    /// Number of mapped frames.
    pub fn mapped_frames(&self) -> usize {
        self.frames.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether the frame holding `address` is mapped.
    pub fn is_mapped(&self, address: u64) -> bool {
        self.frames
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(address / FRAME_SIZE))
    }

    /// Checks every frame of the access (mapped, and writable for a write), then calls
    /// `each` once per run of frames that are contiguous in one backing, with the backing,
    /// the byte offset in it and the range of the access. A failing access changes nothing
    /// unless a frame lies outside its backing, in which case the frames before it have
    /// been accessed, as before.
    fn access(
        &self,
        kind: AccessKind,
        address: u64,
        length: usize,
        mut each: impl FnMut(&Backing, usize, std::ops::Range<usize>) -> bool,
    ) -> Result<(), MemoryError> {
        if address.checked_add(length as u64).is_none() {
            return Err(MemoryError::Overflow { kind, address, length });
        }
        if length == 0 {
            return Ok(());
        }
        let frames = self.frames.read().unwrap_or_else(|e| e.into_inner());
        let unmapped = |current: u64| MemoryError::Unmapped {
            kind,
            address,
            length,
            unmapped: current,
        };
        let lookup = |current: u64| -> Result<&Frame, MemoryError> {
            let frame = frames.get(&(current / FRAME_SIZE)).ok_or(unmapped(current))?;
            if kind == AccessKind::Write && !frame.writable {
                return Err(MemoryError::Permission { kind, address: current });
            }
            Ok(frame)
        };
        let in_frame = (address % FRAME_SIZE) as usize;
        if in_frame + length <= FRAME_SIZE as usize {
            // Within one frame (the common small access): one lookup, one call.
            let frame = lookup(address)?;
            if !each(&frame.backing, frame.offset + in_frame, 0..length) {
                return Err(unmapped(address));
            }
            return Ok(());
        }
        // First pass: check every frame, so a failing access changes nothing.
        let mut done = 0usize;
        while done < length {
            let current = address + done as u64;
            let chunk = (FRAME_SIZE as usize - (current % FRAME_SIZE) as usize).min(length - done);
            lookup(current)?;
            done += chunk;
        }
        // Second pass: access runs of frames contiguous in the same backing at once.
        // `run` is (frame, backing offset, start of the run in the access, end).
        let mut run: Option<(&Frame, usize, usize, usize)> = None;
        let mut flush = |run: (&Frame, usize, usize, usize)| -> Result<(), MemoryError> {
            let (frame, offset, start, end) = run;
            if each(&frame.backing, offset, start..end) {
                return Ok(());
            }
            // Some frame of the run lies outside its backing: redo it frame by frame so
            // the error names the first such frame and the ones before it are accessed.
            let mut done = start;
            while done < end {
                let current = address + done as u64;
                let in_frame = (current % FRAME_SIZE) as usize;
                let chunk = (FRAME_SIZE as usize - in_frame).min(end - done);
                let frame = lookup(current)?;
                if !each(&frame.backing, frame.offset + in_frame, done..done + chunk) {
                    return Err(unmapped(current));
                }
                done += chunk;
            }
            Ok(())
        };
        let mut done = 0usize;
        while done < length {
            let current = address + done as u64;
            let in_frame = (current % FRAME_SIZE) as usize;
            let chunk = (FRAME_SIZE as usize - in_frame).min(length - done);
            let frame = lookup(current)?;
            let offset = frame.offset + in_frame;
            match run {
                Some((first, run_offset, start, end))
                    if Arc::ptr_eq(&first.backing, &frame.backing) && run_offset + (end - start) == offset =>
                {
                    run = Some((first, run_offset, start, end + chunk));
                }
                _ => {
                    if let Some(previous) = run.take() {
                        flush(previous)?;
                    }
                    run = Some((frame, offset, done, done + chunk));
                }
            }
            done += chunk;
        }
        if let Some(last) = run {
            flush(last)?;
        }
        Ok(())
    }
}

/// Where `length` bytes at `address` lie when they are some bytes inside one frame that
/// do not wrap the address space: (frame number, offset in the frame).
#[inline]
fn within_one_frame(address: u64, length: usize) -> Option<(u64, usize)> {
    let in_frame = (address % FRAME_SIZE) as usize;
    let fits = length != 0 && in_frame + length <= FRAME_SIZE as usize;
    (fits && address.checked_add(length as u64).is_some()).then_some((address / FRAME_SIZE, in_frame))
}

impl HostMemory for PagedMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        // Most DMA reads (contexts, WQEs, SGEs, CQEs, one frame of payload) lie in one
        // frame: one lookup and one copy, without the general path's closures. Anything
        // else, and every failure, takes the general path, which gives the error.
        if let Some((number, in_frame)) = within_one_frame(address, buffer.len()) {
            let frames = self.frames.read().unwrap_or_else(|e| e.into_inner());
            if let Some(frame) = frames.get(&number) {
                if frame.backing.read_at(frame.offset + in_frame, buffer) {
                    return Ok(());
                }
            }
        }
        let length = buffer.len();
        self.access(AccessKind::Read, address, length, |backing, offset, range| {
            backing.read_at(offset, &mut buffer[range])
        })
    }

    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        // As for reads; a refused or failed write has written nothing.
        if let Some((number, in_frame)) = within_one_frame(address, data.len()) {
            let frames = self.frames.read().unwrap_or_else(|e| e.into_inner());
            if let Some(frame) = frames.get(&number) {
                if frame.writable && frame.backing.write_at(frame.offset + in_frame, data) {
                    return Ok(());
                }
            }
        }
        self.access(AccessKind::Write, address, data.len(), |backing, offset, range| {
            backing.write_at(offset, &data[range])
        })
    }
}

impl<T: HostMemory + ?Sized> HostMemory for Arc<T> {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        (**self).read(address, buffer)
    }
    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        (**self).write(address, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_spanning_scattered_frames_lands_in_the_right_backing_bytes() {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(2 * FRAME_SIZE as usize);
        // Frame 1 of the backing at 0x10000, frame 0 at 0x11000: a swapped layout.
        memory.map_frame(0x10000, &backing, 1, true);
        memory.map_frame(0x11000, &backing, 0, true);
        memory.write(0x10FFE, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 2];
        assert!(backing.read_at(0x1FFE, &mut out));
        assert_eq!(out, [1, 2]);
        assert!(backing.read_at(0, &mut out));
        assert_eq!(out, [3, 4]);
        let mut back = [0u8; 4];
        memory.read(0x10FFE, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4]);
    }

    #[test]
    fn unmapped_and_wrapping_accesses_fail_without_touching_memory() {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(FRAME_SIZE as usize);
        memory.map_frame(0, &backing, 0, true);
        let err = memory.write(0xFFE, &[9; 4]).unwrap_err();
        assert_eq!(
            err,
            MemoryError::Unmapped {
                kind: AccessKind::Write,
                address: 0xFFE,
                length: 4,
                unmapped: 0x1000
            }
        );
        let mut first = [0u8; 2];
        assert!(backing.read_at(0xFFE, &mut first));
        assert_eq!(first, [0, 0], "a failed write must not write its mapped part");
        assert!(matches!(
            memory.read(u64::MAX - 1, &mut [0; 4]),
            Err(MemoryError::Overflow { .. })
        ));
    }

    #[test]
    fn read_only_frames_refuse_writes() {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(FRAME_SIZE as usize);
        memory.map_frame(0x2000, &backing, 0, false);
        assert!(memory.read_u64(0x2000).is_ok());
        assert!(matches!(
            memory.write_u64(0x2000, 1),
            Err(MemoryError::Permission { .. })
        ));
    }

    #[test]
    fn unmapping_makes_the_frame_unreachable() {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(FRAME_SIZE as usize);
        memory.map_contiguous(0x4000, &backing, 0, 1, true);
        assert_eq!(memory.mapped_frames(), 1);
        assert!(memory.unmap_frame(0x4000));
        assert!(memory.read_u32(0x4000).is_err());
    }

    #[test]
    fn multi_frame_accesses_coalesce_runs_and_keep_per_frame_semantics() {
        let memory = PagedMemory::new();
        let a = Backing::zeroed(4 * FRAME_SIZE as usize);
        let b = Backing::zeroed(FRAME_SIZE as usize);
        // a[0], a[1] contiguous, then b[0], then a[3] (a gap in a), then a[2] read-only.
        memory.map_contiguous(0x10000, &a, 0, 2, true);
        memory.map_frame(0x12000, &b, 0, true);
        memory.map_frame(0x13000, &a, 3, true);
        memory.map_frame(0x14000, &a, 2, false);
        let data: Vec<u8> = (0..4 * FRAME_SIZE as usize - 0x10).map(|i| (i % 251) as u8).collect();
        memory.write(0x10010, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        memory.read(0x10010, &mut back).unwrap();
        assert_eq!(back, data);
        let mut piece = [0u8; 16];
        assert!(b.read_at(0, &mut piece));
        assert_eq!(piece[..], data[2 * FRAME_SIZE as usize - 0x10..][..16]);
        // The read-only frame refuses a write and nothing else changes.
        let err = memory.write(0x13FF0, &[7; 32]).unwrap_err();
        assert_eq!(
            err,
            MemoryError::Permission {
                kind: AccessKind::Write,
                address: 0x14000
            }
        );
        memory.read(0x10010, &mut back).unwrap();
        assert_eq!(back, data);
        // Empty accesses succeed anywhere, as before.
        assert!(memory.read(0x9000_0000, &mut []).is_ok());
        assert!(memory.write(0x9000_0000, &[]).is_ok());
    }

    #[test]
    fn accesses_inside_one_frame_keep_every_check() {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(FRAME_SIZE as usize);
        memory.map_frame(0x1000, &backing, 0, true);
        memory.map_frame(0x2000, &backing, 0, false);
        memory.map_frame(0x3000, &backing, 1, true); // outside the backing
        let last = u64::MAX - (FRAME_SIZE - 1);
        memory.map_frame(last, &backing, 0, true);
        // The whole frame and its last byte.
        memory.write(0x1000, &[7; FRAME_SIZE as usize]).unwrap();
        memory.write(0x1FFF, &[9]).unwrap();
        let mut out = [0u8; 2];
        memory.read(0x1FFE, &mut out).unwrap();
        assert_eq!(out, [7, 9]);
        // The read-only alias reads the same bytes and refuses a write, changing nothing.
        memory.read(0x2FFE, &mut out).unwrap();
        assert_eq!(out, [7, 9]);
        assert_eq!(
            memory.write(0x2FFF, &[1]),
            Err(MemoryError::Permission {
                kind: AccessKind::Write,
                address: 0x2FFF
            })
        );
        memory.read(0x1FFE, &mut out).unwrap();
        assert_eq!(out, [7, 9]);
        // Unmapped, and mapped past the end of the backing: both name the address.
        for address in [0x4010, 0x3010] {
            assert_eq!(
                memory.read(address, &mut out),
                Err(MemoryError::Unmapped {
                    kind: AccessKind::Read,
                    address,
                    length: 2,
                    unmapped: address
                })
            );
        }
        // The last frame of the address space: an access to its last byte wraps.
        memory.read(last, &mut out).unwrap();
        assert!(matches!(
            memory.read(u64::MAX, &mut [0u8; 1]),
            Err(MemoryError::Overflow { .. })
        ));
    }

    #[test]
    fn a_frame_past_its_backing_fails_after_the_frames_before_it() {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(FRAME_SIZE as usize);
        memory.map_frame(0, &backing, 0, true);
        memory.map_frame(FRAME_SIZE, &backing, 1, true); // outside the backing
        let err = memory.write(FRAME_SIZE - 2, &[5; 4]).unwrap_err();
        assert_eq!(
            err,
            MemoryError::Unmapped {
                kind: AccessKind::Write,
                address: FRAME_SIZE - 2,
                length: 4,
                unmapped: FRAME_SIZE
            }
        );
        let mut first = [0u8; 2];
        assert!(backing.read_at(FRAME_SIZE as usize - 2, &mut first));
        assert_eq!(first, [5, 5], "as before: the frames before the bad one were written");
    }

    #[test]
    fn a_message_streamed_a_frame_at_a_time_arrives_whole_up_to_the_backings_last_frame() {
        // Each frame-sized copy reads ahead the backing's next frame; the last one has none.
        // The frames are mapped out of order, as the embedded backend scatters them.
        let frames = 4u64;
        let length = (frames * FRAME_SIZE) as usize;
        let source = Backing::from_vec((0..length).map(|i| (i * 7 % 251) as u8).collect());
        let destination = Backing::zeroed(length);
        let source_at = |page: u64| 0x10_0000 + (frames - 1 - page) * FRAME_SIZE;
        let destination_at = |page: u64| 0x20_0000 + page * 2 * FRAME_SIZE;
        let memory = PagedMemory::new();
        for page in 0..frames {
            memory.map_frame(source_at(page), &source, page as usize, false);
            memory.map_frame(destination_at(page), &destination, page as usize, true);
        }
        let mut frame = vec![0u8; FRAME_SIZE as usize];
        for page in 0..frames {
            memory.read(source_at(page), &mut frame).unwrap();
            memory.write(destination_at(page), &frame).unwrap();
        }
        let (mut sent, mut received) = (vec![0u8; length], vec![0u8; length]);
        assert!(source.read_at(0, &mut sent));
        assert!(destination.read_at(0, &mut received));
        assert_eq!(received, sent);
    }
}
