//! MTT and BT tables: the device's two walkers over page tables in host memory, against
//! reference walks written here from the documented formulas (hns §4 and §5.2, as
//! `hw-model/src/hem` and `hw-model/src/mtt` state them).
//!
//! * MTT: an MTR (root, BT and buffer page shifts, up to three regions with hop counts,
//!   all chosen by the input, valid or not) over host memory whose BT entries the input
//!   writes (addresses of arena pages, misaligned, zero or anything); then translations
//!   of offsets and ranges, uncached and through the device's translation cache.
//! * BT (context tables): a table with any attributes, L0 slots written and destroyed as
//!   the `WRITE/DESTROY_<T>_BT` commands do, then object lookups, uncached and cached.
//!
//! Invariants: for every MTR that validates, each translation equals the reference walk's
//! result (or both fail), the walker reads exactly the BT entries the reference walk
//! reads and nothing else, a cached translation equals an uncached one, and a range
//! translation covers the range in order with pieces that never cross a buffer page,
//! each at the address its offset translates to. For context tables: an accepted L0
//! address is non-zero and 4 KiB aligned, each lookup equals the reference (including
//! failing where the object's address would not fit the address space), reads exactly
//! the reference's BT entries, and a cached lookup equals an uncached one.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use arbitrary::{Arbitrary, Unstructured};
use rnic_firmware_if::mtr::MtrRegion;
use rnic_hw_model::hem::{ContextTable, ContextTableAttributes};
use rnic_hw_model::mtt::{self, Mtr, TranslationCache};
use rnic_hw_model::{HostMemory, HostMemoryExt, MemoryError};

use super::memory::FuzzMemory;
use crate::harness::DMA_BASE;

/// Size of the memory the tables live in.
const ARENA: usize = 4 << 20;
const PAGES: u64 = (ARENA / 4096) as u64;

/// An address as an input names it.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum AddressChoice {
    /// The start of arena page `n` (modulo the pages).
    Page(u16),
    /// `offset` bytes into arena page `n`.
    Within(u16, u16),
    /// Zero.
    Zero,
    /// Near the top of the address space: `u64::MAX - n * 4096 + 1` (4 KiB aligned).
    Top(u16),
    /// Anything.
    Raw(u64),
}

impl AddressChoice {
    fn address(self) -> u64 {
        match self {
            AddressChoice::Page(n) => DMA_BASE + (u64::from(n) % PAGES) * 4096,
            AddressChoice::Within(n, offset) => DMA_BASE + (u64::from(n) % PAGES) * 4096 + u64::from(offset),
            AddressChoice::Zero => 0,
            AddressChoice::Top(n) => (u64::MAX - u64::from(n).max(1) * 4096) + 1,
            AddressChoice::Raw(value) => value,
        }
    }
}

/// A page shift: in the valid range mostly.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum ShiftChoice {
    Valid(u8),
    Raw(u32),
}

impl ShiftChoice {
    fn shift(self, low: u32, high: u32) -> u32 {
        match self {
            ShiftChoice::Valid(n) => low + u32::from(n) % (high - low + 1),
            ShiftChoice::Raw(raw) => raw,
        }
    }
}

/// A count: small mostly.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum CountChoice {
    Small(u16),
    Raw(u64),
}

/// One region of an MTR.
#[derive(Debug, Clone, Copy, Arbitrary)]
struct RegionSpec {
    pages: CountChoice,
    hop: u8,
}

/// An offset into the buffer.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum OffsetChoice {
    /// Byte `in_page` of buffer page `page` (page counted in buffer pages).
    Page {
        page: u32,
        in_page: u32,
    },
    Raw(u64),
}

/// The MTT half of an input.
#[derive(Debug, Clone, Arbitrary)]
struct MttInput {
    root: AddressChoice,
    ba_shift: ShiftChoice,
    buffer_shift: ShiftChoice,
    regions: Vec<RegionSpec>,
    offsets: Vec<OffsetChoice>,
    ranges: Vec<(OffsetChoice, u32)>,
}

/// One command on a context table.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum TableOp {
    /// `WRITE_<T>_BT<level>` for object `index`.
    Write {
        index: u32,
        level: u8,
        address: AddressChoice,
    },
    /// `DESTROY_<T>_BT<level>` for object `index`.
    Destroy { index: u32, level: u8 },
    /// Look object `index` up (uncached, then cached).
    Locate(u32),
}

/// The context-table half of an input.
#[derive(Debug, Clone, Arbitrary)]
struct TableInput {
    /// 64, 256 or 512 bytes.
    object_size: u8,
    slots: u8,
    ba_shift: ShiftChoice,
    buffer_shift: ShiftChoice,
    hop: u8,
    ops: Vec<TableOp>,
}

/// An input: BT entries in memory, then an MTT part and a context-table part.
#[derive(Debug, Clone, Arbitrary)]
struct Input {
    /// (arena offset / 8, value): 8-byte entries written before anything walks.
    entries: Vec<(u32, AddressChoice)>,
    mtt: Option<MttInput>,
    table: Option<TableInput>,
}

/// Host memory that records every read.
struct Recording {
    inner: Arc<dyn HostMemory>,
    reads: Mutex<Vec<(u64, usize)>>,
}

impl Recording {
    fn take(&self) -> Vec<(u64, usize)> {
        std::mem::take(&mut *self.reads.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl HostMemory for Recording {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((address, buffer.len()));
        self.inner.read(address, buffer)
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), MemoryError> {
        panic!("a walker wrote host memory");
    }
}

struct Arena {
    memory: Arc<FuzzMemory>,
    snapshot: Vec<u8>,
}

thread_local! {
    static ARENA_MEMORY: RefCell<Option<Arena>> = const { RefCell::new(None) };
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    ARENA_MEMORY.with(|cell| {
        let mut cell = cell.borrow_mut();
        let arena = cell.get_or_insert_with(|| {
            let memory = FuzzMemory::new(ARENA);
            let snapshot = memory.snapshot();
            Arena { memory, snapshot }
        });
        arena.memory.restore(&arena.snapshot);
        let driver = arena.memory.driver_view();
        for &(slot, value) in input.entries.iter().take(256) {
            let offset = (u64::from(slot) * 8) % ARENA as u64;
            driver
                .write_u64(DMA_BASE + offset, value.address())
                .expect("in the arena");
        }
        let memory = Recording {
            inner: driver,
            reads: Mutex::new(Vec::new()),
        };
        if let Some(mtt_input) = &input.mtt {
            check_mtt(&memory, mtt_input);
        }
        if let Some(table_input) = &input.table {
            check_table(&memory, table_input);
        }
    });
}

// ---- MTT ------------------------------------------------------------------------------

fn region_root_entries(region: &MtrRegion, unit: u64) -> u64 {
    match region.hop {
        0 => 0,
        1 => region.page_count,
        2 => region.page_count.div_ceil(unit),
        _ => region.page_count.div_ceil(unit * unit),
    }
}

/// The reference walk for a validated MTR: the result and the BT entries read.
fn reference_translate(memory: &dyn HostMemory, mtr: &Mtr, offset: u64) -> (Option<u64>, Vec<u64>) {
    let regions = &mtr.regions[..mtr.region_count];
    let page_size = 1u64 << mtr.buffer_page_shift;
    let pages: u64 = regions.iter().map(|r| r.page_count).sum();
    let size = pages * page_size;
    let mut reads = Vec::new();
    if offset >= size {
        return (None, reads);
    }
    if regions.iter().all(|r| r.hop == 0) {
        return (Some(mtr.root + offset), reads);
    }
    let unit = (1u64 << mtr.ba_page_shift) / 8;
    let page = offset / page_size;
    let in_page = offset % page_size;
    let (mut first, mut base) = (0u64, 0u64);
    let mut found = None;
    for region in regions {
        if page < first + region.page_count {
            found = Some(*region);
            break;
        }
        first += region.page_count;
        base += region_root_entries(region, unit);
    }
    let region = found.expect("offset below the size lies in a region");
    let q = page - first;
    let hop = u32::from(region.hop);
    let mut table = mtr.root;
    for level in 0..hop {
        let per_entry = unit.pow(hop - 1 - level);
        let index = if level == 0 {
            base + q / per_entry
        } else {
            (q / per_entry) % unit
        };
        let Some(address) = index.checked_mul(8).and_then(|o| table.checked_add(o)) else {
            return (None, reads);
        };
        reads.push(address);
        let Ok(value) = memory.read_u64(address) else {
            return (None, reads);
        };
        if value == 0 {
            return (None, reads);
        }
        if level + 1 == hop {
            if value % page_size != 0 {
                return (None, reads);
            }
            return (Some(value + in_page), reads);
        }
        if value % 8 != 0 {
            return (None, reads);
        }
        table = value;
    }
    unreachable!("a region with hops ends at its bottom level")
}

fn check_mtt(memory: &Recording, input: &MttInput) {
    let regions: Vec<MtrRegion> = input
        .regions
        .iter()
        .take(4)
        .map(|r| MtrRegion {
            page_count: match r.pages {
                CountChoice::Small(n) => u64::from(n),
                CountChoice::Raw(n) => n,
            },
            hop: if r.hop < 0xF0 { r.hop % 4 } else { r.hop },
        })
        .collect();
    let Ok(mtr) = Mtr::new(
        input.root.address(),
        input.ba_shift.shift(12, 21),
        input.buffer_shift.shift(12, 30),
        &regions,
    ) else {
        return;
    };
    memory.take();
    if mtr.validate().is_err() {
        assert!(
            mtt::translate(memory, &mtr, 0).is_err(),
            "an invalid MTR translated: {mtr:?}"
        );
        assert!(memory.take().is_empty(), "an invalid MTR was walked: {mtr:?}");
        return;
    }
    let page_size = mtr.page_size();
    let offset = |choice: OffsetChoice| match choice {
        OffsetChoice::Page { page, in_page } => {
            let pages = mtr.page_count().max(1);
            (u64::from(page) % (pages + 1))
                .wrapping_mul(page_size)
                .wrapping_add(u64::from(in_page) % page_size)
        }
        OffsetChoice::Raw(raw) => raw,
    };
    let mut cache = TranslationCache::default();
    for &choice in input.offsets.iter().take(16) {
        let offset = offset(choice);
        let (expected, expected_reads) = reference_translate(memory, &mtr, offset);
        memory.take();
        let got = mtt::translate(memory, &mtr, offset);
        let reads = memory.take();
        assert_eq!(
            got.as_ref().ok().copied(),
            expected,
            "translate({offset:#x}) of {mtr:?}: {got:?}"
        );
        let read_addresses: Vec<u64> = reads
            .iter()
            .map(|&(a, len)| {
                assert_eq!(len, 8, "the walker reads whole BT entries");
                a
            })
            .collect();
        assert_eq!(
            read_addresses, expected_reads,
            "BT entries read for {offset:#x} of {mtr:?}"
        );
        let cached = cache.translate(memory, &mtr, offset);
        assert_eq!(cached.ok(), expected, "cached translate({offset:#x}) of {mtr:?}");
        let again = cache.translate(memory, &mtr, offset);
        assert_eq!(again.ok(), expected, "translate({offset:#x}) from the cache");
        memory.take();
    }
    for &(choice, length) in input.ranges.iter().take(4) {
        let start = offset(choice);
        let length = u64::from(length) % (4 * page_size + 1);
        let mut pieces = Vec::new();
        let result = mtt::translate_range(memory, &mtr, start, length, |address, chunk| {
            pieces.push((address, chunk))
        });
        memory.take();
        let fits = start.checked_add(length).is_some_and(|end| end <= mtr.size());
        if length == 0 {
            assert!(result.is_ok() && pieces.is_empty());
            continue;
        }
        if !fits {
            assert!(
                result.is_err() && pieces.is_empty(),
                "a range past the end was translated"
            );
            continue;
        }
        let mut at = start;
        for &(address, chunk) in &pieces {
            assert!(chunk > 0, "an empty piece");
            assert!(
                at / page_size == (at + chunk - 1) / page_size,
                "a piece crosses a buffer page: {at:#x}+{chunk:#x}"
            );
            let (expected, _) = reference_translate(memory, &mtr, at);
            assert_eq!(Some(address), expected, "piece at {at:#x}");
            at += chunk;
        }
        if result.is_ok() {
            assert_eq!(at, start + length, "the pieces cover the range");
        } else {
            // The walk stopped where a page did not translate.
            assert!(reference_translate(memory, &mtr, at).0.is_none());
        }
        memory.take();
    }
}

// ---- context tables -------------------------------------------------------------------

/// The reference lookup: the context address and the BT entries read.
fn reference_locate(
    memory: &dyn HostMemory,
    attributes: ContextTableAttributes,
    object_size: u64,
    slots: &[Option<u64>],
    index: u32,
) -> (Option<u64>, Vec<u64>) {
    let mut reads = Vec::new();
    let chunk_size = 1u64 << attributes.buffer_page_shift;
    let chunk_objects = chunk_size / object_size;
    let t = u64::from(index) / chunk_objects;
    let n = (1u64 << attributes.ba_page_shift) / 8;
    let hop = u32::from(attributes.hop);
    let slot = t / n.pow(hop);
    let Some(Some(mut address)) = slots.get(slot as usize).copied() else {
        return (None, reads);
    };
    for level in 0..hop {
        let entry = (t / n.pow(hop - 1 - level)) % n;
        let Some(entry_address) = address.checked_add(entry * 8) else {
            return (None, reads);
        };
        reads.push(entry_address);
        let Ok(value) = memory.read_u64(entry_address) else {
            return (None, reads);
        };
        if value == 0 || value % 4096 != 0 {
            return (None, reads);
        }
        address = value;
    }
    // The context must lie where DMA can reach it: past the top of the address space
    // it cannot be.
    let context = address
        .checked_add((u64::from(index) % chunk_objects) * object_size)
        .filter(|a| a.checked_add(object_size).is_some());
    (context, reads)
}

fn check_table(memory: &Recording, input: &TableInput) {
    let object_size = [64u64, 256, 512][usize::from(input.object_size) % 3];
    let slot_count = 1 + usize::from(input.slots) % 16;
    let object_count = 1 << 20;
    let mut table = ContextTable::new("fuzz", object_size, object_count, slot_count);
    let attributes = ContextTableAttributes {
        ba_page_shift: input.ba_shift.shift(12, 21),
        buffer_page_shift: input.buffer_shift.shift(12, 30),
        hop: if input.hop < 0xF0 { input.hop % 4 } else { input.hop },
    };
    if table.set_attributes(attributes).is_err() {
        return;
    }
    let mut slots: Vec<Option<u64>> = vec![None; slot_count];
    for &op in input.ops.iter().take(32) {
        match op {
            TableOp::Write { index, level, address } => {
                let index = index % object_count;
                let address = address.address();
                let location = table.location(index);
                if table.write_base_address(index, level % 5, address).is_ok() {
                    assert!(address != 0 && address % 4096 == 0, "accepted L0 address {address:#x}");
                    let location = location.expect("an accepted write has a location");
                    if level % 5 == 0 {
                        slots[location.l0 as usize] = Some(address);
                    }
                }
            }
            TableOp::Destroy { index, level } => {
                let index = index % object_count;
                let location = table.location(index);
                if table.destroy_base_address(index, level % 5).is_ok() && level % 5 == 0 {
                    slots[location.expect("an accepted destroy has a location").l0 as usize] = None;
                }
            }
            TableOp::Locate(index) => {
                let index = index % object_count;
                let (expected, expected_reads) = reference_locate(memory, attributes, object_size, &slots, index);
                memory.take();
                let got = table.locate(memory, index);
                let reads: Vec<u64> = memory.take().into_iter().map(|(a, _)| a).collect();
                assert_eq!(
                    got.as_ref().ok().copied(),
                    expected,
                    "locate({index}) with {attributes:?}: {got:?}"
                );
                assert_eq!(reads, expected_reads, "BT entries read for object {index}");
                let cached = table.locate_cached(memory, index);
                assert_eq!(cached.ok(), expected, "cached locate({index})");
                memory.take();
            }
        }
    }
}
