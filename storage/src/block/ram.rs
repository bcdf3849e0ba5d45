//! A block device in process memory.

use std::sync::RwLock;

use super::{check_block_size, check_blocks, check_range, BlockDevice, Error, ReadSink};

/// The page size the operating system maps memory in (the smallest; larger pages are
/// touched more than once, which costs nothing more).
const PAGE_SIZE: usize = 4096;

/// A block device held in memory; its contents vanish with it.
///
/// Its memory is resident from the start, as SPDK's malloc bdev's (pre-allocated
/// hugepage memory): creating it touches every page (transparent huge pages where the
/// kernel offers them), so a device larger than the memory the system will give fails
/// (or is refused by the OOM killer) when it is made, not in the middle of serving I/O,
/// and no I/O pays for the operating system's first-touch page faults.
#[derive(Debug)]
pub struct RamBackend {
    block_size: u32,
    blocks: u64,
    bytes: RwLock<Vec<u8>>,
}

impl RamBackend {
    /// A zero-filled device of `blocks` blocks of `block_size` bytes.
    pub fn new(block_size: u32, blocks: u64) -> Result<Self, Error> {
        check_block_size(block_size)?;
        let length = blocks
            .checked_mul(u64::from(block_size))
            .and_then(|length| usize::try_from(length).ok())
            .ok_or_else(|| Error::Config(format!("{blocks} blocks of {block_size} bytes do not fit in memory")))?;
        let mut bytes = vec![0u8; length];
        // Random 4 KiB reads over a large device would miss the TLB on every I/O with
        // 4 KiB pages; huge pages where the kernel has them (SPDK's memory is hugepages
        // too). Without them the device works the same, only slower.
        if let Err(e) = rnic_os::advise_huge_pages(bytes.as_ptr() as usize, bytes.len()) {
            tracing::debug!("RAM device of {length} bytes without huge pages: {e}");
        }
        // `vec!` of zeroes is the allocator's zeroed memory, mapped lazily: write one byte
        // of every page (through `black_box`, so the store of a zero the allocator already
        // guaranteed is not optimised away) to make the pages resident now.
        for page in bytes.chunks_mut(PAGE_SIZE) {
            page[0] = std::hint::black_box(0);
        }
        Ok(Self {
            block_size,
            blocks,
            bytes: RwLock::new(bytes),
        })
    }

    fn bytes(&self) -> std::sync::RwLockReadGuard<'_, Vec<u8>> {
        // A panic while holding the lock cannot leave the bytes half-typed: every writer
        // copies into a checked range, so the poisoned contents are still a valid device.
        self.bytes.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn bytes_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<u8>> {
        self.bytes.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl BlockDevice for RamBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, lba: u64, buffer: &mut [u8]) -> Result<(), Error> {
        let (offset, _) = check_range(lba, buffer.len(), self.block_size, self.blocks)?;
        let offset = offset as usize;
        buffer.copy_from_slice(&self.bytes()[offset..offset + buffer.len()]);
        Ok(())
    }

    fn read_to(&self, lba: u64, length: usize, _bounce: &mut Vec<u8>, sink: &mut ReadSink<'_>) -> Result<(), Error> {
        // The blocks are lent in place: the caller's copy is the only one.
        let (offset, _) = check_range(lba, length, self.block_size, self.blocks)?;
        let offset = offset as usize;
        sink(0, &self.bytes()[offset..offset + length]).map_err(Error::Destination)
    }

    fn write(&self, lba: u64, data: &[u8]) -> Result<(), Error> {
        let (offset, _) = check_range(lba, data.len(), self.block_size, self.blocks)?;
        let offset = offset as usize;
        self.bytes_mut()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn flush(&self) -> Result<(), Error> {
        Ok(())
    }

    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), Error> {
        check_blocks(lba, count, self.blocks)?;
        let start = (lba * u64::from(self.block_size)) as usize;
        let end = ((lba + count) * u64::from(self.block_size)) as usize;
        self.bytes_mut()[start..end].fill(0);
        Ok(())
    }
}
