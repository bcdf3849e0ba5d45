//! Context tables in host memory (hns "HEM", §4), driver side.
//!
//! Each of the four tables (QPC, MPT, CQC, SRQC) is an array of fixed-size objects kept in
//! buffer chunks of `1 << buffer_page_shift` bytes, reached from one of the table's L0
//! slots through `hop` levels of BT pages (see [`crate::mtr::context_table_location`]).
//! The driver chooses the geometry ([`TableGeometry::choose`]), tells the device with
//! `CFG_BT_ATTR`, and then allocates lazily:
//!
//! * [`HemTable::get`] before an object's first use: if its chunk does not exist yet, a
//!   zeroed chunk and any missing BT pages are allocated, the new addresses written into
//!   the parent BT pages in host memory, and — when the L0 slot was unused — the device is
//!   told with `WRITE_<T>_BT0` (tag = the object index, in_param = the level-0 BT page, or
//!   the chunk itself for hop 0). The device walks the host BT pages from there.
//! * [`HemTable::put`] after the object is gone: chunks are reference counted; the last
//!   reference frees the chunk, clears its BT entry, frees BT pages that became empty and
//!   issues `DESTROY_<T>_BT0` when the L0 slot is no longer needed.

use std::collections::HashMap;

use rnic_firmware_if::mailbox::{BtCommand, ContextTable, MailboxOpcode};
use rnic_firmware_if::mtr::{BT_ENTRY_SIZE, MAX_HOP, MIN_PAGE_SHIFT};

use super::cmdq::CommandQueue;
use super::mailbox::{Mailbox, MailboxError};
use crate::device_access::{AccessError, DeviceAccess, DmaBuffer};
use crate::mtr::context_table_location;

/// Largest buffer chunk shift the device accepts.
pub const MAX_CHUNK_SHIFT: u32 = 30;

/// Why a context-table operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HemError {
    /// No geometry addresses `count` objects with the given slots and hops.
    #[error(
        "{table:?}: {count} objects of {object_size} bytes do not fit {l0_slots} L0 slots \
         at hop {hop} with chunks of at most 1 GiB"
    )]
    TableTooLarge {
        /// The table.
        table: ContextTable,
        /// Objects to address.
        count: u32,
        /// Object size in bytes.
        object_size: u64,
        /// L0 slots available.
        l0_slots: u32,
        /// Hop number.
        hop: u8,
    },
    /// The object index is beyond the table.
    #[error("{table:?}: object index {index} is outside the table of {count}")]
    IndexOutOfRange {
        /// The table.
        table: ContextTable,
        /// The index.
        index: u32,
        /// Objects in the table.
        count: u32,
    },
    /// `put` without a matching `get`.
    #[error("{table:?}: object {index} released but its chunk is not in use")]
    NotInUse {
        /// The table.
        table: ContextTable,
        /// The index.
        index: u32,
    },
    /// A base-address mailbox failed.
    #[error("{table:?}: {source}")]
    Mailbox {
        /// The table.
        table: ContextTable,
        /// The mailbox failure.
        #[source]
        source: MailboxError,
    },
    /// Chunk or BT page memory.
    #[error("{table:?}: context table memory: {source}")]
    Memory {
        /// The table.
        table: ContextTable,
        /// The backend failure.
        #[source]
        source: AccessError,
    },
}

/// Addressing attributes and sizes of one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableGeometry {
    /// Object size in bytes.
    pub object_size: u64,
    /// Objects in the table.
    pub object_count: u32,
    /// L0 slots the function owns.
    pub l0_slots: u32,
    /// BT page shift.
    pub ba_page_shift: u32,
    /// Buffer chunk shift.
    pub buffer_page_shift: u32,
    /// BT levels below the L0 slot (0..=3).
    pub hop: u8,
}

impl TableGeometry {
    /// hns `calc_pg_sz` for context tables: keep BT pages at `1 << ba_page_shift` and grow
    /// the chunk until `l0_slots × entries^hop × objects-per-chunk ≥ count`.
    ///
    /// # Errors
    /// [`HemError::TableTooLarge`] when even 1 GiB chunks are not enough.
    pub fn choose(
        table: ContextTable,
        object_size: u64,
        object_count: u32,
        l0_slots: u32,
        hop: u8,
        ba_page_shift: u32,
    ) -> Result<Self, HemError> {
        let hop = hop.min(MAX_HOP);
        let entries = (1u64 << ba_page_shift) / BT_ENTRY_SIZE;
        let reach = u64::from(l0_slots).saturating_mul(entries.saturating_pow(u32::from(hop)));
        let minimum = MIN_PAGE_SHIFT.max(object_size.next_power_of_two().trailing_zeros());
        for buffer_page_shift in minimum..=MAX_CHUNK_SHIFT {
            let per_chunk = (1u64 << buffer_page_shift) / object_size;
            if reach.saturating_mul(per_chunk) >= u64::from(object_count) {
                return Ok(Self {
                    object_size,
                    object_count,
                    l0_slots,
                    ba_page_shift,
                    buffer_page_shift,
                    hop,
                });
            }
        }
        Err(HemError::TableTooLarge {
            table,
            count: object_count,
            object_size,
            l0_slots,
            hop,
        })
    }

    /// Objects per buffer chunk.
    pub fn objects_per_chunk(&self) -> u64 {
        (1u64 << self.buffer_page_shift) / self.object_size
    }

    /// BT entries per BT page.
    pub fn entries_per_bt_page(&self) -> u64 {
        (1u64 << self.ba_page_shift) / BT_ENTRY_SIZE
    }
}

#[derive(Debug)]
struct BtPage {
    buffer: DmaBuffer,
    /// Non-zero entries.
    used: u64,
}

#[derive(Debug)]
struct Chunk {
    buffer: DmaBuffer,
    references: u32,
}

/// One context table's driver state.
#[derive(Debug)]
pub struct HemTable {
    table: ContextTable,
    geometry: TableGeometry,
    /// `levels[k]`: BT pages of level `k` (0 = the page an L0 slot points to), keyed by
    /// their global page number `t / n^(hop − k)`.
    levels: Vec<HashMap<u64, BtPage>>,
    chunks: HashMap<u64, Chunk>,
    base_address_writes: u64,
}

/// Where an object's chunk hangs in the tree.
struct Path {
    chunk: u64,
    l0: u64,
    /// Global page number of the BT page at each level.
    keys: [u64; 3],
    /// Entry index in the BT page at each level.
    entries: [u64; 3],
}

impl HemTable {
    /// An empty table with `geometry`.
    pub fn new(table: ContextTable, geometry: TableGeometry) -> Self {
        Self {
            table,
            geometry,
            levels: (0..geometry.hop).map(|_| HashMap::new()).collect(),
            chunks: HashMap::new(),
            base_address_writes: 0,
        }
    }

    /// The table.
    pub fn table(&self) -> ContextTable {
        self.table
    }

    /// Its geometry.
    pub fn geometry(&self) -> TableGeometry {
        self.geometry
    }

    /// Buffer chunks allocated.
    pub fn chunks_in_use(&self) -> usize {
        self.chunks.len()
    }

    /// BT pages allocated.
    pub fn bt_pages_in_use(&self) -> usize {
        self.levels.iter().map(HashMap::len).sum()
    }

    /// L0 slots the device has been given (level-0 BT pages, or chunks for hop 0).
    pub fn l0_slots_in_use(&self) -> usize {
        match self.levels.first() {
            Some(level0) => level0.len(),
            None => self.chunks.len(),
        }
    }

    /// `WRITE_<T>_BT0` commands issued so far.
    pub fn base_address_writes(&self) -> u64 {
        self.base_address_writes
    }

    fn path(&self, index: u32) -> Result<Path, HemError> {
        let g = &self.geometry;
        if index >= g.object_count {
            return Err(HemError::IndexOutOfRange {
                table: self.table,
                index,
                count: g.object_count,
            });
        }
        let (l0, entries, _) = context_table_location(
            u64::from(index),
            g.object_size,
            g.buffer_page_shift,
            g.ba_page_shift,
            g.hop,
        );
        let chunk = u64::from(index) / g.objects_per_chunk();
        let n = g.entries_per_bt_page();
        let mut keys = [0u64; 3];
        for (k, key) in keys.iter_mut().enumerate().take(usize::from(g.hop)) {
            *key = chunk / n.pow(u32::from(g.hop) - k as u32);
        }
        debug_assert!(g.hop == 0 || keys[0] == l0);
        Ok(Path {
            chunk,
            l0,
            keys,
            entries,
        })
    }

    fn memory_error(&self, source: AccessError) -> HemError {
        HemError::Memory {
            table: self.table,
            source,
        }
    }

    fn opcode(&self, command: BtCommand) -> MailboxOpcode {
        MailboxOpcode::for_base_address_table(self.table, command, 0)
            .expect("every context table has level-0 base-address commands")
    }

    /// Takes a reference on the chunk holding object `index`, creating it (and telling the
    /// device) if needed. The chunk is zero-filled when created.
    ///
    /// # Errors
    /// [`HemError`]; on failure nothing new stays allocated.
    pub fn get(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        mailbox: &mut Mailbox,
        index: u32,
    ) -> Result<(), HemError> {
        let path = self.path(index)?;
        if let Some(chunk) = self.chunks.get_mut(&path.chunk) {
            chunk.references += 1;
            return Ok(());
        }
        let g = self.geometry;
        let chunk_size = 1usize << g.buffer_page_shift;
        let chunk = access
            .allocate_dma(chunk_size, chunk_size.min(1 << 21))
            .map_err(|e| self.memory_error(e))?;
        let chunk_address = chunk.address();

        if g.hop == 0 {
            if let Err(source) =
                mailbox.write_base_address(access, cmdq, self.opcode(BtCommand::Write), index, chunk_address)
            {
                access.free_dma(chunk);
                return Err(HemError::Mailbox {
                    table: self.table,
                    source,
                });
            }
            self.base_address_writes += 1;
            self.chunks.insert(
                path.chunk,
                Chunk {
                    buffer: chunk,
                    references: 1,
                },
            );
            return Ok(());
        }

        // Allocate the missing BT pages, top level first.
        let hop = usize::from(g.hop);
        let bt_size = 1usize << g.ba_page_shift;
        let mut created = [false; 3];
        for level in 0..hop {
            if self.levels[level].contains_key(&path.keys[level]) {
                continue;
            }
            match access.allocate_dma(bt_size, bt_size) {
                Ok(buffer) => {
                    self.levels[level].insert(path.keys[level], BtPage { buffer, used: 0 });
                    created[level] = true;
                }
                Err(e) => {
                    self.undo_created(access, &path, &created);
                    access.free_dma(chunk);
                    return Err(self.memory_error(e));
                }
            }
        }

        // Link bottom-up in host memory: chunk into the last level, each new page into
        // its parent. The device only looks once the L0 slot is written.
        let mut writes = vec![(hop - 1, path.entries[hop - 1], chunk_address)];
        for (level, _) in created.iter().enumerate().take(hop).skip(1).filter(|(_, c)| **c) {
            let child = self.levels[level][&path.keys[level]].buffer.address();
            writes.push((level - 1, path.entries[level - 1], child));
        }
        for &(level, entry, value) in &writes {
            let page = self.levels[level]
                .get_mut(&path.keys[level])
                .expect("page exists: allocated above or earlier");
            let address = page.buffer.address() + entry * BT_ENTRY_SIZE;
            if let Err(e) = access.dma_write(address, &value.to_le_bytes()) {
                self.undo_created(access, &path, &created);
                access.free_dma(chunk);
                return Err(self.memory_error(e));
            }
            page.used += 1;
        }

        if created[0] {
            let level0 = self.levels[0][&path.keys[0]].buffer.address();
            if let Err(source) = mailbox.write_base_address(access, cmdq, self.opcode(BtCommand::Write), index, level0)
            {
                self.undo_created(access, &path, &created);
                access.free_dma(chunk);
                return Err(HemError::Mailbox {
                    table: self.table,
                    source,
                });
            }
            self.base_address_writes += 1;
            tracing::debug!(table = ?self.table, index, l0 = path.l0, "L0 slot in use");
        }
        self.chunks.insert(
            path.chunk,
            Chunk {
                buffer: chunk,
                references: 1,
            },
        );
        Ok(())
    }

    /// Rolls back the pages `get` created (and the entry counts of surviving parents).
    fn undo_created(&mut self, access: &dyn DeviceAccess, path: &Path, created: &[bool; 3]) {
        for level in (0..self.levels.len()).rev() {
            if !created[level] {
                continue;
            }
            if let Some(page) = self.levels[level].remove(&path.keys[level]) {
                access.free_dma(page.buffer);
            }
            if level > 0 && !created[level - 1] {
                // The surviving parent may already count (and hold) the link to this
                // page; clear it.
                if let Some(parent) = self.levels[level - 1].get_mut(&path.keys[level - 1]) {
                    let address = parent.buffer.address() + path.entries[level - 1] * BT_ENTRY_SIZE;
                    let mut old = [0u8; 8];
                    if access.dma_read(address, &mut old).is_ok() && old != [0; 8] {
                        let _ = access.dma_write(address, &[0; 8]);
                        parent.used = parent.used.saturating_sub(1);
                    }
                }
            }
        }
        if !created[self.levels.len().saturating_sub(1)] {
            // The bottom page survived: clear the chunk entry if it was written.
            let bottom = self.levels.len() - 1;
            if let Some(page) = self.levels[bottom].get_mut(&path.keys[bottom]) {
                let address = page.buffer.address() + path.entries[bottom] * BT_ENTRY_SIZE;
                let mut old = [0u8; 8];
                if access.dma_read(address, &mut old).is_ok() && old != [0; 8] {
                    let _ = access.dma_write(address, &[0; 8]);
                    page.used = page.used.saturating_sub(1);
                }
            }
        }
    }

    /// Drops a reference on the chunk holding object `index`; the last one frees it and
    /// everything above it that became empty.
    ///
    /// # Errors
    /// [`HemError::NotInUse`] for an unbalanced `put`; [`HemError::Mailbox`] when
    /// `DESTROY_<T>_BT0` fails (the memory is freed anyway: the device was told the slot
    /// is gone, or it refused, in which case nothing we can do makes the memory safer).
    pub fn put(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        mailbox: &mut Mailbox,
        index: u32,
    ) -> Result<(), HemError> {
        let path = self.path(index)?;
        let Some(chunk) = self.chunks.get_mut(&path.chunk) else {
            return Err(HemError::NotInUse {
                table: self.table,
                index,
            });
        };
        chunk.references -= 1;
        if chunk.references > 0 {
            return Ok(());
        }
        let chunk = self.chunks.remove(&path.chunk).expect("looked up just above");
        let hop = self.levels.len();
        let mut result = Ok(());
        let mut destroy_slot = hop == 0;

        // Unlink bottom-up; stop at the first page that still has other entries.
        let mut level = hop;
        while level > 0 {
            level -= 1;
            let page = self.levels[level]
                .get_mut(&path.keys[level])
                .expect("a chunk in use has all its BT pages");
            let address = page.buffer.address() + path.entries[level] * BT_ENTRY_SIZE;
            if let Err(source) = access.dma_write(address, &[0; 8]) {
                result = Err(HemError::Memory {
                    table: self.table,
                    source,
                });
            }
            page.used -= 1;
            if page.used > 0 {
                break;
            }
            if level == 0 {
                destroy_slot = true;
                break;
            }
            let page = self.levels[level]
                .remove(&path.keys[level])
                .expect("present: just used");
            access.free_dma(page.buffer);
        }

        if destroy_slot {
            if let Err(source) = mailbox.execute_plain(access, cmdq, self.opcode(BtCommand::Destroy), index) {
                tracing::error!(table = ?self.table, index, %source, "DESTROY_BT0 failed");
                result = Err(HemError::Mailbox {
                    table: self.table,
                    source,
                });
            }
            if hop > 0 {
                let page = self.levels[0]
                    .remove(&path.keys[0])
                    .expect("level-0 page present until its slot is destroyed");
                access.free_dma(page.buffer);
            }
            tracing::debug!(table = ?self.table, index, l0 = path.l0, "L0 slot released");
        }
        access.free_dma(chunk.buffer);
        result
    }

    /// Frees every chunk and BT page without telling the device (after a function reset,
    /// when the device has forgotten the table).
    pub fn release_all(&mut self, access: &dyn DeviceAccess) {
        for (_, chunk) in self.chunks.drain() {
            access.free_dma(chunk.buffer);
        }
        for level in &mut self.levels {
            for (_, page) in level.drain() {
                access.free_dma(page.buffer);
            }
        }
    }
}

/// The four context tables.
#[derive(Debug)]
pub struct ContextTables {
    /// QP contexts.
    pub qpc: HemTable,
    /// MPT entries.
    pub mpt: HemTable,
    /// CQ contexts.
    pub cqc: HemTable,
    /// SRQ contexts.
    pub srqc: HemTable,
}

impl ContextTables {
    /// Chunks allocated over all tables.
    pub fn chunks_in_use(&self) -> usize {
        self.all().iter().map(|t| t.chunks_in_use()).sum()
    }

    /// BT pages allocated over all tables.
    pub fn bt_pages_in_use(&self) -> usize {
        self.all().iter().map(|t| t.bt_pages_in_use()).sum()
    }

    /// L0 slots in use per table, in the order QPC, MPT, CQC, SRQC (the device's
    /// `context_table_slots_in_use` order).
    pub fn l0_slots_in_use(&self) -> [usize; 4] {
        [
            self.qpc.l0_slots_in_use(),
            self.mpt.l0_slots_in_use(),
            self.cqc.l0_slots_in_use(),
            self.srqc.l0_slots_in_use(),
        ]
    }

    /// The table for `table`.
    pub fn table_mut(&mut self, table: ContextTable) -> &mut HemTable {
        match table {
            ContextTable::Qpc => &mut self.qpc,
            ContextTable::Mpt => &mut self.mpt,
            ContextTable::Cqc => &mut self.cqc,
            ContextTable::Srqc => &mut self.srqc,
        }
    }

    fn all(&self) -> [&HemTable; 4] {
        [&self.qpc, &self.mpt, &self.cqc, &self.srqc]
    }

    /// Frees everything without telling the device.
    pub fn release_all(&mut self, access: &dyn DeviceAccess) {
        for table in [&mut self.qpc, &mut self.mpt, &mut self.cqc, &mut self.srqc] {
            table.release_all(access);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_grows_the_chunk_until_the_table_fits() {
        // 512-entry BT pages, hop 1, 8 slots: 4 KiB chunks of 256-byte QPCs reach
        // 8 × 512 × 16 = 65536 objects.
        let g = TableGeometry::choose(ContextTable::Qpc, 256, 65536, 8, 1, 12).unwrap();
        assert_eq!(g.buffer_page_shift, 12);
        let g = TableGeometry::choose(ContextTable::Qpc, 256, 65537, 8, 1, 12).unwrap();
        assert_eq!(g.buffer_page_shift, 13);
        let g = TableGeometry::choose(ContextTable::Mpt, 64, 100, 1, 0, 12).unwrap();
        assert_eq!(g.buffer_page_shift, 13);
        assert!(TableGeometry::choose(ContextTable::Cqc, 64, u32::MAX, 1, 0, 12).is_err());
    }
}
