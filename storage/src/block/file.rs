//! A block device backed by a file (or a block device node) on the host.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{check_block_size, check_blocks, check_range, BlockDevice, Error};

/// How the backing file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileMode {
    /// Through the page cache; `flush` calls `fdatasync`.
    Buffered,
    /// With `O_DIRECT`: every transfer bypasses the page cache, through a bounce buffer
    /// aligned to the block size, because callers' buffers (network receive buffers) have
    /// no alignment the kernel would accept.
    Direct,
}

/// Alignment of `O_DIRECT` transfers; 4096 covers every logical block size of today's
/// disks and page-cache-less file systems.
const DIRECT_ALIGNMENT: usize = 4096;

/// A block device whose blocks are the bytes of a file.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    path: PathBuf,
    mode: FileMode,
    block_size: u32,
    blocks: u64,
}

impl FileBackend {
    /// Opens (creating it if needed) `path` as a device of `blocks` blocks of `block_size`
    /// bytes; a file shorter than that is extended with zeroes, a longer one keeps its
    /// tail untouched and unused.
    pub fn create(path: &Path, block_size: u32, blocks: u64, mode: FileMode) -> Result<Self, Error> {
        check_block_size(block_size)?;
        let length = blocks
            .checked_mul(u64::from(block_size))
            .ok_or_else(|| Error::Config(format!("{blocks} blocks of {block_size} bytes overflow")))?;
        let file = open(path, mode, true)?;
        let current = file.metadata().map_err(|source| io_error("stat", path, source))?.len();
        if current < length {
            file.set_len(length)
                .map_err(|source| io_error("extend", path, source))?;
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            mode,
            block_size,
            blocks,
        })
    }

    /// Opens an existing file as a device of as many whole blocks as it holds.
    pub fn open(path: &Path, block_size: u32, mode: FileMode) -> Result<Self, Error> {
        check_block_size(block_size)?;
        let file = open(path, mode, false)?;
        let length = file.metadata().map_err(|source| io_error("stat", path, source))?.len();
        let blocks = length / u64::from(block_size);
        if blocks == 0 {
            return Err(Error::Config(format!(
                "{} holds less than one {block_size}-byte block",
                path.display()
            )));
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            mode,
            block_size,
            blocks,
        })
    }

    /// The backing file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, operation: &'static str, source: std::io::Error) -> Error {
        io_error(operation, &self.path, source)
    }

    fn read_bytes(&self, offset: u64, buffer: &mut [u8]) -> Result<(), Error> {
        match self.mode {
            FileMode::Buffered => self
                .file
                .read_exact_at(buffer, offset)
                .map_err(|source| self.io("read", source)),
            FileMode::Direct => {
                let mut bounce = AlignedBuffer::new(buffer.len());
                self.file
                    .read_exact_at(bounce.as_mut(), offset)
                    .map_err(|source| self.io("read", source))?;
                buffer.copy_from_slice(bounce.as_mut());
                Ok(())
            }
        }
    }

    fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        match self.mode {
            FileMode::Buffered => self
                .file
                .write_all_at(data, offset)
                .map_err(|source| self.io("write", source)),
            FileMode::Direct => {
                let mut bounce = AlignedBuffer::new(data.len());
                bounce.as_mut().copy_from_slice(data);
                self.file
                    .write_all_at(bounce.as_mut(), offset)
                    .map_err(|source| self.io("write", source))
            }
        }
    }
}

impl BlockDevice for FileBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, lba: u64, buffer: &mut [u8]) -> Result<(), Error> {
        let (offset, _) = check_range(lba, buffer.len(), self.block_size, self.blocks)?;
        self.read_bytes(offset, buffer)
    }

    fn write(&self, lba: u64, data: &[u8]) -> Result<(), Error> {
        let (offset, _) = check_range(lba, data.len(), self.block_size, self.blocks)?;
        self.write_bytes(offset, data)
    }

    fn flush(&self) -> Result<(), Error> {
        self.file.sync_data().map_err(|source| self.io("fdatasync", source))
    }

    fn write_zeroes(&self, lba: u64, count: u64) -> Result<(), Error> {
        check_blocks(lba, count, self.blocks)?;
        // In chunks, so zeroing a whole disk does not allocate a disk-sized buffer.
        const CHUNK_BYTES: u64 = 1 << 20;
        let chunk_blocks = (CHUNK_BYTES / u64::from(self.block_size)).max(1);
        let zeroes = vec![0u8; (chunk_blocks * u64::from(self.block_size)) as usize];
        let mut done = 0;
        while done < count {
            let blocks = chunk_blocks.min(count - done);
            let length = (blocks * u64::from(self.block_size)) as usize;
            self.write_bytes((lba + done) * u64::from(self.block_size), &zeroes[..length])?;
            done += blocks;
        }
        Ok(())
    }
}

fn open(path: &Path, mode: FileMode, create: bool) -> Result<File, Error> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(create);
    if mode == FileMode::Direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).map_err(|source| io_error("open", path, source))
}

fn io_error(operation: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        operation,
        path: path.display().to_string(),
        source,
    }
}

/// A heap buffer whose usable part starts at a `DIRECT_ALIGNMENT` boundary, found by
/// offsetting into an over-allocated `Vec` (no `unsafe` allocation calls needed).
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    length: usize,
}

impl AlignedBuffer {
    fn new(length: usize) -> Self {
        let storage = vec![0u8; length + DIRECT_ALIGNMENT];
        let misalignment = storage.as_ptr() as usize % DIRECT_ALIGNMENT;
        let start = (DIRECT_ALIGNMENT - misalignment) % DIRECT_ALIGNMENT;
        Self { storage, start, length }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.length]
    }
}
