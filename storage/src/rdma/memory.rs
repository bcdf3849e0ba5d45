//! Registered memory a storage protocol needs: fixed-size slots (receive buffers,
//! command capsules, responses — one per queue entry) and a pool of variable-size data
//! buffers the peer reaches with RDMA READ and WRITE.

use std::collections::BTreeMap;

use rnic_verbs::{AccessFlags, MemoryRegion, ProtectionDomain, Result as VerbsResult, Sge};

/// One memory region cut into equal slots.
pub struct SlotRegion {
    mr: MemoryRegion,
    slots: usize,
    slot_size: usize,
}

impl std::fmt::Debug for SlotRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRegion")
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .finish()
    }
}

impl SlotRegion {
    /// Registers `slots` slots of `slot_size` bytes on `pd` with `access`.
    ///
    /// # Errors
    /// Registration failures.
    pub fn new(pd: &ProtectionDomain, slots: usize, slot_size: usize, access: AccessFlags) -> VerbsResult<Self> {
        let mr = pd.register_user_memory(vec![0u8; slots.max(1) * slot_size.max(1)], access)?;
        Ok(Self { mr, slots, slot_size })
    }

    /// The memory region.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// An SGE of the first `length` bytes of `slot`.
    pub fn sge(&self, slot: usize, length: usize) -> Sge {
        debug_assert!(slot < self.slots && length <= self.slot_size);
        Sge::new(
            self.mr.addr() + (slot * self.slot_size) as u64,
            length as u32,
            self.mr.lkey(),
        )
    }

    /// Copies the first `out.len()` bytes of `slot` out.
    ///
    /// # Errors
    /// Outside the slot or the region.
    pub fn read(&self, slot: usize, out: &mut [u8]) -> VerbsResult<()> {
        self.check(slot, out.len())?;
        self.mr.read((slot * self.slot_size) as u64, out)
    }

    /// Copies `out.len()` bytes of `slot`, from `offset` in it, out.
    ///
    /// # Errors
    /// Outside the slot or the region.
    pub fn read_at(&self, slot: usize, offset: usize, out: &mut [u8]) -> VerbsResult<()> {
        self.check(slot, offset.saturating_add(out.len()))?;
        self.mr.read((slot * self.slot_size + offset) as u64, out)
    }

    /// Copies `data` to the start of `slot`.
    ///
    /// # Errors
    /// Outside the slot or the region.
    pub fn write(&self, slot: usize, data: &[u8]) -> VerbsResult<()> {
        self.check(slot, data.len())?;
        self.mr.write((slot * self.slot_size) as u64, data)
    }

    fn check(&self, slot: usize, length: usize) -> VerbsResult<()> {
        if slot >= self.slots || length > self.slot_size {
            return Err(rnic_verbs::VerbsError::InvalidArgument(format!(
                "{length} bytes of slot {slot}: {} slots of {} bytes",
                self.slots, self.slot_size
            )));
        }
        Ok(())
    }
}

/// A buffer allocated from a [`BufferPool`]: `length` bytes at `offset` of its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataBuffer {
    /// Offset in the pool's region.
    pub offset: u64,
    /// Bytes.
    pub length: u32,
}

/// A registered region handing out contiguous buffers in multiples of a granule
/// (first fit, freed neighbours merged). Allocation fails when no run of free granules is
/// long enough; callers queue and retry after a free, as SPDK does with its buffer pools.
pub struct BufferPool {
    mr: MemoryRegion,
    granule: u64,
    /// Free runs: first granule → number of granules.
    free: BTreeMap<u64, u64>,
    granules: u64,
    granules_free: u64,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("granule", &self.granule)
            .field("granules", &self.granules)
            .field("granules_free", &self.granules_free)
            .finish()
    }
}

impl BufferPool {
    /// Registers `bytes` (rounded up to whole granules) on `pd` with `access`, handed out
    /// in multiples of `granule` bytes (a power of two).
    ///
    /// # Errors
    /// Registration failures; a granule that is not a power of two.
    pub fn new(pd: &ProtectionDomain, bytes: usize, granule: usize, access: AccessFlags) -> VerbsResult<Self> {
        if !granule.is_power_of_two() {
            return Err(rnic_verbs::VerbsError::InvalidArgument(format!(
                "granule {granule} is not a power of two"
            )));
        }
        let granules = bytes.div_ceil(granule).max(1) as u64;
        let mr = pd.register_user_memory(vec![0u8; granules as usize * granule], access)?;
        let mut free = BTreeMap::new();
        free.insert(0, granules);
        Ok(Self {
            mr,
            granule: granule as u64,
            free,
            granules,
            granules_free: granules,
        })
    }

    /// The memory region.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// Bytes in the pool.
    pub fn capacity(&self) -> u64 {
        self.granules * self.granule
    }

    /// Bytes not allocated.
    pub fn available(&self) -> u64 {
        self.granules_free * self.granule
    }

    /// A buffer of `length` bytes (at least one granule), or `None` if no free run is long
    /// enough now.
    pub fn allocate(&mut self, length: u32) -> Option<DataBuffer> {
        let need = u64::from(length).div_ceil(self.granule).max(1);
        let (&start, &count) = self.free.iter().find(|(_, count)| **count >= need)?;
        self.free.remove(&start);
        if count > need {
            self.free.insert(start + need, count - need);
        }
        self.granules_free -= need;
        Some(DataBuffer {
            offset: start * self.granule,
            length,
        })
    }

    /// Gives `buffer` back.
    pub fn free(&mut self, buffer: DataBuffer) {
        let mut start = buffer.offset / self.granule;
        let mut count = u64::from(buffer.length).div_ceil(self.granule).max(1);
        debug_assert!(start + count <= self.granules, "a buffer of another pool");
        self.granules_free += count;
        // Merge with the run after, then the run before.
        if let Some(next) = self.free.remove(&(start + count)) {
            count += next;
        }
        if let Some((&before, &before_count)) = self.free.range(..start).next_back() {
            if before + before_count == start {
                self.free.remove(&before);
                start = before;
                count += before_count;
            }
        }
        self.free.insert(start, count);
    }

    /// The buffer's address as the peer names it (iova of the region plus offset).
    pub fn address(&self, buffer: &DataBuffer) -> u64 {
        self.mr.addr() + buffer.offset
    }

    /// The region's remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// An SGE of the whole buffer.
    pub fn sge(&self, buffer: &DataBuffer) -> Sge {
        Sge::new(self.address(buffer), buffer.length, self.mr.lkey())
    }

    /// Copies `out.len()` bytes of `buffer`, from `offset` in it, out.
    ///
    /// # Errors
    /// Outside the buffer.
    pub fn read(&self, buffer: &DataBuffer, offset: usize, out: &mut [u8]) -> VerbsResult<()> {
        Self::check(buffer, offset, out.len())?;
        self.mr.read(buffer.offset + offset as u64, out)
    }

    /// Copies `data` into `buffer` at `offset`.
    ///
    /// # Errors
    /// Outside the buffer.
    pub fn write(&self, buffer: &DataBuffer, offset: usize, data: &[u8]) -> VerbsResult<()> {
        Self::check(buffer, offset, data.len())?;
        self.mr.write(buffer.offset + offset as u64, data)
    }

    fn check(buffer: &DataBuffer, offset: usize, length: usize) -> VerbsResult<()> {
        match offset.checked_add(length) {
            Some(end) if end <= buffer.length as usize => Ok(()),
            _ => Err(rnic_verbs::VerbsError::InvalidArgument(format!(
                "{length} bytes at {offset} of a {}-byte buffer",
                buffer.length
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_verbs::backend::EmbeddedDevice;
    use rnic_verbs::Context;

    fn pd() -> ProtectionDomain {
        Context::open(Box::new(EmbeddedDevice::new()))
            .unwrap()
            .alloc_pd()
            .unwrap()
    }

    #[test]
    fn allocates_first_fit_and_merges_on_free() {
        let pd = pd();
        let mut pool = BufferPool::new(&pd, 16 * 4096, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let a = pool.allocate(4096).unwrap();
        let b = pool.allocate(8192).unwrap();
        let c = pool.allocate(1).unwrap();
        assert_eq!((a.offset, b.offset, c.offset), (0, 4096, 12288));
        assert_eq!(pool.available(), 12 * 4096);
        assert!(pool.allocate(13 * 4096).is_none());
        pool.free(b);
        // The hole of two granules takes a two-granule buffer, not a three.
        assert_eq!(pool.allocate(3 * 4096).unwrap().offset, 16384);
        assert_eq!(pool.allocate(2 * 4096).unwrap().offset, 4096);
        pool.free(a);
        pool.free(c);
        assert_eq!(pool.available(), (16 - 5) * 4096);
    }

    #[test]
    fn frees_merge_back_to_one_run() {
        let pd = pd();
        let mut pool = BufferPool::new(&pd, 64 * 512, 512, AccessFlags::LOCAL_WRITE).unwrap();
        let buffers: Vec<_> = (0..64).map(|_| pool.allocate(512).unwrap()).collect();
        assert!(pool.allocate(1).is_none());
        for (i, buffer) in buffers.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            assert_eq!(buffer.offset, i as u64 * 512);
            pool.free(*buffer);
        }
        for buffer in buffers.iter().skip(1).step_by(2) {
            pool.free(*buffer);
        }
        assert_eq!(pool.available(), pool.capacity());
        assert_eq!(pool.allocate(64 * 512).unwrap().offset, 0);
    }

    #[test]
    fn reads_and_writes_inside_buffers_only() {
        let pd = pd();
        let mut pool = BufferPool::new(&pd, 8192, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let buffer = pool.allocate(100).unwrap();
        pool.write(&buffer, 10, &[7; 90]).unwrap();
        let mut out = [0u8; 100];
        pool.read(&buffer, 0, &mut out).unwrap();
        assert_eq!(&out[..10], &[0; 10]);
        assert_eq!(&out[10..], &[7; 90]);
        assert!(pool.write(&buffer, 11, &[0; 90]).is_err());
        let slots = SlotRegion::new(&pd, 4, 64, AccessFlags::LOCAL_WRITE).unwrap();
        slots.write(3, &[1; 64]).unwrap();
        assert!(slots.write(4, &[1]).is_err());
        assert!(slots.read(0, &mut [0; 65]).is_err());
        assert_eq!(slots.sge(3, 16).addr, slots.mr().addr() + 192);
    }
}
