//! Block backends: where a namespace's or a logical unit's blocks live.
//!
//! A [`BlockDevice`] is a fixed array of equal-sized blocks addressed by logical block
//! address (LBA). Every call is bounds-checked here, once, so protocol code can map its
//! out-of-range errors (NVMe "LBA Out of Range", SCSI "LOGICAL BLOCK ADDRESS OUT OF RANGE")
//! from [`Error::OutOfRange`] without checking twice. Backends take `&self` and lock
//! internally, so queues served by several threads share one device.

mod file;
mod ram;

pub use file::{FileBackend, FileMode};
pub use ram::RamBackend;

/// What a block backend can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request reaches past the last block.
    #[error("blocks {lba}..{lba}+{count} are outside the device's {capacity} blocks")]
    OutOfRange {
        /// First block asked for.
        lba: u64,
        /// Number of blocks asked for.
        count: u64,
        /// Blocks the device has.
        capacity: u64,
    },
    /// The buffer is not a whole number of blocks.
    #[error("a buffer of {length} bytes is not a whole number of {block_size}-byte blocks")]
    PartialBlock {
        /// Buffer length in bytes.
        length: usize,
        /// Block size in bytes.
        block_size: u32,
    },
    /// The configuration cannot describe a device.
    #[error("invalid block device configuration: {0}")]
    Config(String),
    /// The destination of a [`BlockDevice::read_to`] refused the bytes (the device itself
    /// read them).
    #[error("the destination of the read refused its bytes: {0}")]
    Destination(String),
    /// The operating system refused an operation on the backing file.
    #[error("{operation} on {path}: {source}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The backing file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Where [`BlockDevice::read_to`] hands the blocks it read: called with the byte offset of
/// each piece in the read and the piece; an `Err` (why) refuses it.
pub type ReadSink<'a> = dyn FnMut(usize, &[u8]) -> Result<(), String> + 'a;

/// A fixed array of equal-sized blocks.
pub trait BlockDevice: Send + Sync {
    /// Bytes per block (512 or 4096).
    fn block_size(&self) -> u32;

    /// Number of blocks.
    fn block_count(&self) -> u64;

    /// Reads `buffer.len() / block_size` blocks starting at `lba` into `buffer`.
    fn read(&self, lba: u64, buffer: &mut [u8]) -> Result<(), Error>;

    /// Reads `length` bytes (whole blocks) starting at `lba` and hands them to `sink`,
    /// in order, as one or more consecutive pieces (the byte offset of each piece in the
    /// read, and the piece). A device that holds its blocks in memory lends them in place,
    /// so a target copies them once, straight into the registered buffer its RDMA WRITE
    /// sends from; other devices read into `bounce` first (grown to `length` once and
    /// kept by the caller, so a steady stream of reads allocates nothing).
    ///
    /// # Errors
    /// As [`BlockDevice::read`]; [`Error::Destination`] with what `sink` returned when it
    /// refused a piece (nothing more is handed over after that).
    fn read_to(&self, lba: u64, length: usize, bounce: &mut Vec<u8>, sink: &mut ReadSink<'_>) -> Result<(), Error> {
        if bounce.len() < length {
            bounce.resize(length, 0);
        }
        let buffer = &mut bounce[..length];
        self.read(lba, buffer)?;
        sink(0, buffer).map_err(Error::Destination)
    }

    /// Writes `data.len() / block_size` blocks starting at `lba`.
    fn write(&self, lba: u64, data: &[u8]) -> Result<(), Error>;

    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), Error>;

    /// Sets `count` blocks starting at `lba` to zeroes.
    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), Error>;

    /// Tells the device that `count` blocks starting at `lba` are no longer needed; they
    /// read back as zeroes afterwards (NVMe DEALLOCATE, SCSI UNMAP with LBPRZ).
    fn deallocate(&self, lba: u64, count: u64) -> Result<(), Error> {
        self.write_zeroes(lba, count)
    }

    /// Capacity in bytes.
    fn capacity_bytes(&self) -> u64 {
        self.block_count() * u64::from(self.block_size())
    }
}

/// Checks that `length` bytes starting at block `lba` are whole blocks inside a device of
/// `capacity` blocks, and returns the byte offset and the number of blocks.
pub fn check_range(lba: u64, length: usize, block_size: u32, capacity: u64) -> Result<(u64, u64), Error> {
    if !length.is_multiple_of(block_size as usize) {
        return Err(Error::PartialBlock { length, block_size });
    }
    let count = (length / block_size as usize) as u64;
    check_blocks(lba, count, capacity)?;
    Ok((lba * u64::from(block_size), count))
}

/// Checks that `count` blocks starting at `lba` lie inside a device of `capacity` blocks.
pub fn check_blocks(lba: u64, count: u64, capacity: u64) -> Result<(), Error> {
    match lba.checked_add(count) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(Error::OutOfRange { lba, count, capacity }),
    }
}

fn check_block_size(block_size: u32) -> Result<(), Error> {
    if block_size.is_power_of_two() && (512..=4096).contains(&block_size) {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "block size {block_size} is not a power of two from 512 to 4096"
        )))
    }
}

#[cfg(test)]
mod tests;
