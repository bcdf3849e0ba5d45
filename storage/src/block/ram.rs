//! A block device in process memory.

use std::sync::RwLock;

use super::{check_block_size, check_blocks, check_range, BlockDevice, Error};

/// A block device held in memory; its contents vanish with it.
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
        Ok(Self {
            block_size,
            blocks,
            bytes: RwLock::new(vec![0; length]),
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
