//! Context tables in host memory (hns "HEM", §4): where the device finds the QPC, MPT,
//! CQC, SRQC, SCCC … entry of an object.
//!
//! Each table is an array of fixed-size objects stored in buffer chunks of
//! `1 << buffer_page_shift` bytes, reached through `hop` levels of base-address-table
//! (BT) pages of `1 << ba_page_shift` bytes (addressing attributes set by `CFG_BT_ATTR`).
//! The device keeps one register per L0 slot (the table's `bt_num` slots); everything
//! below lives in host memory. For object `i`, with `chunk_objects = chunk / object_size`,
//! chunk `t = i / chunk_objects` and `n = BT page / 8` entries per BT page:
//!
//! * hop 0: L0 slot `t` holds the buffer chunk address;
//! * hop 1: slot `t / n` holds an L0 BT page whose entry `t % n` is the chunk;
//! * hop 2: slot `t / n²` → L0 BT page entry `(t / n) % n` → L1 BT page entry `t % n`;
//! * hop 3 (an rnic extension): slot `t / n³`, entries `(t / n²) % n`, `(t / n) % n`,
//!   `t % n`.
//!
//! The object's context is at `chunk + (i % chunk_objects) × object_size`.
//!
//! **Host memory is the truth**: the device walks the host BT pages from the L0 slot to
//! find an object. Like hns hardware, which caches BT entries, it remembers the address a
//! walk found ([`ContextTable::locate_cached`]) until the driver next says something may
//! have changed: any `WRITE`/`DESTROY` of a base address, `CFG_BT_ATTR`, a function reset,
//! and — kept by the device — any firmware command or mailbox (the driver writes new BT
//! entries into host memory before the CREATE mailbox of the object that needs them; see
//! docs/architecture.md). Failed walks are never remembered. `WRITE_<T>_BT0` (level 0) stores the L0 slot of the object named by the
//! tag; `WRITE_<T>_BT1/BT2` (levels ≥ 1) are validated (index in range, level ≤ hop,
//! address non-zero and aligned) but not needed, because the driver also writes the same
//! addresses into the host BT pages. Unlike hns, an L0 index beyond the slot count is
//! rejected rather than reduced modulo the slot count, so a mis-sized table shows up as an
//! error instead of silently aliasing another object.
//!
//! Alignment: BT page and buffer chunk addresses must be 4 KiB aligned (the hardware
//! page); BT entries are 8-byte little-endian full byte addresses, zero meaning empty.

use rnic_firmware_if::mtr::{BT_ENTRY_SIZE, MAX_HOP, MIN_PAGE_SHIFT};

use crate::fast_hash::FastHashMap;
use crate::memory::{HostMemory, HostMemoryExt, MemoryError};

mod cache;
mod contexts;
#[cfg(test)]
mod tests;

pub use cache::{ContextCache, CONTEXT_CACHE_CAPACITY};
pub(crate) use contexts::{Contexts, QpcProgress, SqProgress};

pub use rnic_firmware_if::mtr::{MAX_BT_PAGE_SHIFT, MAX_BUFFER_PAGE_SHIFT};
/// Required alignment of BT page and buffer chunk addresses.
pub const HEM_ADDRESS_ALIGNMENT: u64 = 1 << MIN_PAGE_SHIFT;
/// Most object addresses a table remembers; a hostile driver touching more objects only
/// makes the table start over, so its memory stays bounded.
pub const LOCATION_CACHE_CAPACITY: usize = 4096;

/// Addressing attributes of a context table, set by `CFG_BT_ATTR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextTableAttributes {
    /// BT page shift (BT page = `1 << ba_page_shift` bytes), 12..=21.
    pub ba_page_shift: u32,
    /// Buffer chunk shift (chunk = `1 << buffer_page_shift` bytes), 12..=30.
    pub buffer_page_shift: u32,
    /// Levels of BT pages below the L0 slot, 0..=3 (3 is an rnic extension).
    pub hop: u8,
}

impl ContextTableAttributes {
    /// BT entries per BT page.
    pub fn entries_per_bt_page(&self) -> u64 {
        (1u64 << self.ba_page_shift.min(63)) / BT_ENTRY_SIZE
    }

    /// Buffer chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        1u64 << self.buffer_page_shift.min(63)
    }
}

/// What a BT entry or slot should have held (for diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HemTarget {
    /// A BT page of this level (0 = the page the L0 slot points to).
    BtPage {
        /// Its level.
        level: u8,
    },
    /// The buffer chunk holding the object.
    Chunk {
        /// Chunk index `t` in the table.
        chunk: u64,
    },
}

impl std::fmt::Display for HemTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HemTarget::BtPage { level } => write!(f, "the level-{level} BT page"),
            HemTarget::Chunk { chunk } => write!(f, "buffer chunk {chunk}"),
        }
    }
}

/// Why a context-table operation failed. Every variant names the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HemError {
    /// No `CFG_BT_ATTR` yet.
    #[error("{table}: no addressing attributes yet (CFG_BT_ATTR was not issued for this table)")]
    NoAttributes {
        /// Table name.
        table: &'static str,
    },
    /// BT page shift outside 12..=21.
    #[error("{table}: BT page shift {shift} is out of range: expected 12..=21")]
    BtPageShift {
        /// Table name.
        table: &'static str,
        /// The rejected shift.
        shift: u32,
    },
    /// Buffer chunk shift outside 12..=30.
    #[error("{table}: buffer page shift {shift} is out of range: expected 12..=30")]
    BufferPageShift {
        /// Table name.
        table: &'static str,
        /// The rejected shift.
        shift: u32,
    },
    /// Hop number above 3.
    #[error("{table}: hop number {hop} is out of range: expected 0..=3")]
    Hop {
        /// Table name.
        table: &'static str,
        /// The rejected hop number.
        hop: u8,
    },
    /// One object does not fit in a buffer chunk.
    #[error("{table}: a {object_size}-byte object does not fit in a {chunk_size}-byte buffer chunk")]
    ObjectLargerThanChunk {
        /// Table name.
        table: &'static str,
        /// Object size in bytes.
        object_size: u64,
        /// Chunk size in bytes.
        chunk_size: u64,
    },
    /// New attributes while base addresses are installed.
    #[error(
        "{table}: cannot change addressing attributes while {valid_slots} L0 slots hold base \
         addresses (destroy them or reset the function first)"
    )]
    AttributesInUse {
        /// Table name.
        table: &'static str,
        /// Number of valid L0 slots.
        valid_slots: usize,
    },
    /// Object index beyond the table.
    #[error("{table}: object index {index} is out of range: the table has {count} objects")]
    IndexOutOfRange {
        /// Table name.
        table: &'static str,
        /// The rejected index.
        index: u32,
        /// Objects in the table.
        count: u32,
    },
    /// The object's L0 index is beyond the slot count.
    #[error(
        "{table}: object {index} needs L0 slot {slot} but the table has only {slots} L0 slots \
         (the table is larger than its hop/page-size attributes can address)"
    )]
    L0OutOfRange {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// Computed L0 index.
        slot: u64,
        /// Number of L0 slots.
        slots: usize,
    },
    /// The object's context would run past the end of the 64-bit address space: its chunk
    /// lies so close to the top that the object's offset wraps.
    #[error(
        "{table}: object {index} lies {offset:#x} bytes into the chunk at {chunk:#x}, past the end of \
         the address space (expected a chunk whose whole size fits below 2^64)"
    )]
    ContextBeyondAddressSpace {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// The chunk's bus address.
        chunk: u64,
        /// The object's offset in the chunk.
        offset: u64,
    },
    /// A base-address level beyond the table's hop number.
    #[error("{table}: base-address level {level} does not exist with hop number {hop} (levels 0..={hop})")]
    LevelOutOfRange {
        /// Table name.
        table: &'static str,
        /// The rejected level.
        level: u8,
        /// The table's hop number.
        hop: u8,
    },
    /// The object's L0 slot is empty.
    #[error("{table}: no base address for object {index}: L0 slot {slot} is empty")]
    SlotEmpty {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// The empty slot.
        slot: u64,
    },
    /// A base address of 0 was written.
    #[error(
        "{table}: object {index}: level-{level} base address 0 is not a valid address (use \
         DESTROY_BT to clear a slot)"
    )]
    NullAddress {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// Level written.
        level: u8,
    },
    /// A base address written by mailbox is misaligned.
    #[error("{table}: object {index}: level-{level} base address {address:#x} is not aligned to {alignment} bytes")]
    MisalignedAddress {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// Level written.
        level: u8,
        /// The rejected address.
        address: u64,
        /// Required alignment.
        alignment: u64,
    },
    /// A BT entry on the walk is zero.
    #[error(
        "{table}: object {index}: entry {entry} of the level-{level} BT page at {bt_page:#x} \
         (address {address:#x}) is zero: expected the address of {expected}"
    )]
    ZeroEntry {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// Level of the BT page read.
        level: u8,
        /// Address of that BT page.
        bt_page: u64,
        /// Entry index in it.
        entry: u64,
        /// Bus address of the entry.
        address: u64,
        /// What the entry should point to.
        expected: HemTarget,
    },
    /// A BT entry holds a misaligned address.
    #[error(
        "{table}: object {index}: entry {entry} of the level-{level} BT page at {bt_page:#x} \
         holds {value:#x} for {expected}, which is not aligned to {alignment} bytes"
    )]
    MisalignedEntry {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// Level of the BT page read.
        level: u8,
        /// Address of that BT page.
        bt_page: u64,
        /// Entry index in it.
        entry: u64,
        /// The entry's value.
        value: u64,
        /// Required alignment.
        alignment: u64,
        /// What the entry should point to.
        expected: HemTarget,
    },
    /// A BT page could not be read by DMA.
    #[error(
        "{table}: object {index}: cannot read entry {entry} of the level-{level} BT page at \
         {bt_page:#x}: {source}"
    )]
    BtUnreachable {
        /// Table name.
        table: &'static str,
        /// Object index.
        index: u32,
        /// Level of the BT page.
        level: u8,
        /// Address of that BT page.
        bt_page: u64,
        /// Entry index in it.
        entry: u64,
        /// The DMA failure.
        #[source]
        source: MemoryError,
    },
}

/// Where an object lives, in table coordinates (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HemLocation {
    /// Buffer chunk index `t`.
    pub chunk: u64,
    /// L0 slot.
    pub l0: u64,
    /// `entries[k]`: entry index in the level-`k` BT page, for `k < hop` (0 otherwise).
    pub entries: [u64; 3],
    /// Byte offset of the object inside its chunk.
    pub offset_in_chunk: u64,
}

/// One context table: its geometry, its `CFG_BT_ATTR` attributes and its L0 slots.
#[derive(Debug, Clone)]
pub struct ContextTable {
    name: &'static str,
    object_size: u64,
    object_count: u32,
    l0_slots: Vec<Option<u64>>,
    attributes: Option<ContextTableAttributes>,
    /// Object index → context address found by a successful walk (see the module
    /// documentation for when it is forgotten).
    located: FastHashMap<u32, u64>,
}

impl ContextTable {
    /// A table of `object_count` objects of `object_size` bytes with `l0_slot_count` L0
    /// slots (the table's `bt_num`), all empty, without attributes.
    ///
    /// # Panics
    /// If `object_size` is 0 (a device constant, never driver input).
    pub fn new(name: &'static str, object_size: u64, object_count: u32, l0_slot_count: usize) -> Self {
        assert!(object_size > 0, "{name}: object size must be non-zero");
        Self {
            name,
            object_size,
            object_count,
            l0_slots: vec![None; l0_slot_count],
            attributes: None,
            located: FastHashMap::default(),
        }
    }

    /// Table name used in diagnostics ("QPC", "MPT", …).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// Number of objects.
    pub fn object_count(&self) -> u32 {
        self.object_count
    }

    /// Number of L0 slots.
    pub fn l0_slot_count(&self) -> usize {
        self.l0_slots.len()
    }

    /// The current attributes, if `CFG_BT_ATTR` was issued.
    pub fn attributes(&self) -> Option<ContextTableAttributes> {
        self.attributes
    }

    /// The content of L0 slot `slot` (`None` when empty or out of range).
    pub fn l0_slot(&self, slot: usize) -> Option<u64> {
        self.l0_slots.get(slot).copied().flatten()
    }

    /// Number of L0 slots holding a base address (for leak checks).
    pub fn valid_l0_slots(&self) -> usize {
        self.l0_slots.iter().filter(|s| s.is_some()).count()
    }

    /// Forgets every base address and the attributes (function reset).
    pub fn reset(&mut self) {
        self.l0_slots.fill(None);
        self.attributes = None;
        self.forget_locations();
    }

    /// Forgets every remembered object address, so the next lookups walk the host BT
    /// pages again.
    pub fn forget_locations(&mut self) {
        self.located.clear();
    }

    /// Number of object addresses remembered (for tests).
    pub fn remembered_locations(&self) -> usize {
        self.located.len()
    }

    /// Sets the addressing attributes (`CFG_BT_ATTR`). Refused while L0 slots hold base
    /// addresses, unless the attributes are unchanged.
    pub fn set_attributes(&mut self, attributes: ContextTableAttributes) -> Result<(), HemError> {
        let table = self.name;
        if !(MIN_PAGE_SHIFT..=MAX_BT_PAGE_SHIFT).contains(&attributes.ba_page_shift) {
            return Err(HemError::BtPageShift {
                table,
                shift: attributes.ba_page_shift,
            });
        }
        if !(MIN_PAGE_SHIFT..=MAX_BUFFER_PAGE_SHIFT).contains(&attributes.buffer_page_shift) {
            return Err(HemError::BufferPageShift {
                table,
                shift: attributes.buffer_page_shift,
            });
        }
        if attributes.hop > MAX_HOP {
            return Err(HemError::Hop {
                table,
                hop: attributes.hop,
            });
        }
        if self.object_size > attributes.chunk_size() {
            return Err(HemError::ObjectLargerThanChunk {
                table,
                object_size: self.object_size,
                chunk_size: attributes.chunk_size(),
            });
        }
        let valid_slots = self.valid_l0_slots();
        if valid_slots > 0 && self.attributes != Some(attributes) {
            return Err(HemError::AttributesInUse { table, valid_slots });
        }
        self.forget_locations();
        self.attributes = Some(attributes);
        Ok(())
    }

    /// Where object `index` lives (pure arithmetic, no memory access). Fails when the
    /// index is out of range, attributes are missing, or the L0 index exceeds the slots.
    pub fn location(&self, index: u32) -> Result<HemLocation, HemError> {
        let attributes = self.require_attributes()?;
        self.check_index(index)?;
        let chunk_objects = attributes.chunk_size() / self.object_size;
        let t = u64::from(index) / chunk_objects;
        let offset_in_chunk = (u64::from(index) % chunk_objects) * self.object_size;
        let n = attributes.entries_per_bt_page();
        let n2 = n * n;
        let (l0, entries) = match attributes.hop {
            0 => (t, [0, 0, 0]),
            1 => (t / n, [t % n, 0, 0]),
            2 => (t / n2, [(t / n) % n, t % n, 0]),
            // n ≤ 2^18, so n³ ≤ 2^54 fits.
            _ => (t / (n2 * n), [(t / n2) % n, (t / n) % n, t % n]),
        };
        if l0 >= self.l0_slots.len() as u64 {
            return Err(HemError::L0OutOfRange {
                table: self.name,
                index,
                slot: l0,
                slots: self.l0_slots.len(),
            });
        }
        Ok(HemLocation {
            chunk: t,
            l0,
            entries,
            offset_in_chunk,
        })
    }

    /// `WRITE_<T>_BT<level>` with tag = `index`: level 0 stores `address` in the object's
    /// L0 slot; levels 1..=hop are only validated (the device reads them from the host BT
    /// pages). The address must be non-zero and 4 KiB aligned.
    pub fn write_base_address(&mut self, index: u32, level: u8, address: u64) -> Result<(), HemError> {
        let location = self.check_level(index, level)?;
        self.forget_locations();
        let table = self.name;
        if address == 0 {
            return Err(HemError::NullAddress { table, index, level });
        }
        if !is_aligned(address, HEM_ADDRESS_ALIGNMENT) {
            return Err(HemError::MisalignedAddress {
                table,
                index,
                level,
                address,
                alignment: HEM_ADDRESS_ALIGNMENT,
            });
        }
        if level == 0 {
            let slot = &mut self.l0_slots[location.l0 as usize];
            if let Some(old) = *slot {
                if old != address {
                    // A driver can repeat this at will: bounded like any diagnostic.
                    rnic_diag::warn!(
                        rnic_diag::global(),
                        rnic_diag::Kind::new("hem", "L0 slot overwritten"),
                        table,
                        index,
                        slot = location.l0,
                        old = format_args!("{old:#x}"),
                        new = format_args!("{address:#x}"),
                        "L0 slot overwritten without DESTROY_BT0"
                    );
                }
            }
            *slot = Some(address);
            tracing::trace!(table, index, slot = location.l0, address, "L0 slot set");
        } else {
            tracing::trace!(table, index, level, address, "BT base address validated");
        }
        Ok(())
    }

    /// `READ_<T>_BT<level>` with tag = `index`: level 0 returns the L0 slot; level `k ≥ 1`
    /// walks the host BT pages and returns the level-`k` address found (a BT page, or the
    /// buffer chunk when `k = hop`).
    pub fn read_base_address(&self, memory: &dyn HostMemory, index: u32, level: u8) -> Result<u64, HemError> {
        let location = self.check_level(index, level)?;
        self.walk(memory, index, &location, level)
    }

    /// `DESTROY_<T>_BT<level>` with tag = `index`: level 0 empties the object's L0 slot
    /// (already empty is fine); levels 1..=hop are only validated.
    pub fn destroy_base_address(&mut self, index: u32, level: u8) -> Result<(), HemError> {
        let location = self.check_level(index, level)?;
        self.forget_locations();
        if level == 0 {
            self.l0_slots[location.l0 as usize] = None;
            tracing::trace!(table = self.name, index, slot = location.l0, "L0 slot cleared");
        }
        Ok(())
    }

    /// The bus address of object `index`'s context: walks from the L0 slot through `hop`
    /// host BT pages to the buffer chunk and adds the object's offset in the chunk.
    pub fn locate(&self, memory: &dyn HostMemory, index: u32) -> Result<u64, HemError> {
        let location = self.location(index)?;
        let hop = self.require_attributes()?.hop;
        let chunk = self.walk(memory, index, &location, hop)?;
        // A chunk near the top of the address space must not wrap the object to a low
        // address the driver never named: the whole context must lie below 2^64.
        chunk
            .checked_add(location.offset_in_chunk)
            .filter(|context| context.checked_add(self.object_size).is_some())
            .ok_or(HemError::ContextBeyondAddressSpace {
                table: self.name,
                index,
                chunk,
                offset: location.offset_in_chunk,
            })
    }

    /// [`locate`](Self::locate), remembering the address a successful walk finds, and
    /// answering from memory while it is remembered (a hit reads no host memory).
    pub fn locate_cached(&mut self, memory: &dyn HostMemory, index: u32) -> Result<u64, HemError> {
        if let Some(&address) = self.located.get(&index) {
            return Ok(address);
        }
        let address = self.locate(memory, index)?;
        if self.located.len() >= LOCATION_CACHE_CAPACITY {
            self.located.clear();
        }
        self.located.insert(index, address);
        Ok(address)
    }

    fn require_attributes(&self) -> Result<ContextTableAttributes, HemError> {
        self.attributes.ok_or(HemError::NoAttributes { table: self.name })
    }

    fn check_index(&self, index: u32) -> Result<(), HemError> {
        if index >= self.object_count {
            return Err(HemError::IndexOutOfRange {
                table: self.name,
                index,
                count: self.object_count,
            });
        }
        Ok(())
    }

    /// Index, attributes, L0 range and `level ≤ hop` checks shared by the BT commands.
    fn check_level(&self, index: u32, level: u8) -> Result<HemLocation, HemError> {
        let location = self.location(index)?;
        let hop = self.require_attributes()?.hop;
        if level > hop {
            return Err(HemError::LevelOutOfRange {
                table: self.name,
                level,
                hop,
            });
        }
        Ok(location)
    }

    /// The level-`to_level` address of object `index`: the L0 slot, then one host BT
    /// entry per level.
    fn walk(&self, memory: &dyn HostMemory, index: u32, location: &HemLocation, to_level: u8) -> Result<u64, HemError> {
        let table = self.name;
        let hop = self.require_attributes()?.hop;
        let mut address = self.l0_slots[location.l0 as usize].ok_or(HemError::SlotEmpty {
            table,
            index,
            slot: location.l0,
        })?;
        for level in 0..to_level {
            let bt_page = address;
            let entry = location.entries[usize::from(level)];
            let unreachable = |source| HemError::BtUnreachable {
                table,
                index,
                level,
                bt_page,
                entry,
                source,
            };
            let entry_address =
                bt_page
                    .checked_add(entry * BT_ENTRY_SIZE)
                    .ok_or(unreachable(MemoryError::Overflow {
                        kind: crate::memory::AccessKind::Read,
                        address: bt_page,
                        length: BT_ENTRY_SIZE as usize,
                    }))?;
            let value = memory.read_u64(entry_address).map_err(unreachable)?;
            let expected = if level + 1 == hop {
                HemTarget::Chunk { chunk: location.chunk }
            } else {
                HemTarget::BtPage { level: level + 1 }
            };
            if value == 0 {
                return Err(HemError::ZeroEntry {
                    table,
                    index,
                    level,
                    bt_page,
                    entry,
                    address: entry_address,
                    expected,
                });
            }
            if !is_aligned(value, HEM_ADDRESS_ALIGNMENT) {
                return Err(HemError::MisalignedEntry {
                    table,
                    index,
                    level,
                    bt_page,
                    entry,
                    value,
                    alignment: HEM_ADDRESS_ALIGNMENT,
                    expected,
                });
            }
            address = value;
        }
        Ok(address)
    }
}

/// Whether `value` is a multiple of the power of two `alignment`.
const fn is_aligned(value: u64, alignment: u64) -> bool {
    value & (alignment - 1) == 0
}
