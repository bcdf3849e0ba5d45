//! Context-table tests. Tables are laid out the way a driver does it, with the real
//! driver-side helpers from `verbs-provider/src/mtr.rs`.

use std::collections::HashMap;

use rnic_firmware_if::mtr::MtrRegion;

use super::*;
use crate::memory::PagedMemory;
use crate::mtt::driver_builder::{build_mtr, context_table_location, MtrBuildRequest};
use crate::mtt::test_support::{seeds, SeedGuard, TestSpace, XorShift64, DATA_WINDOW};

const MIB: usize = 1 << 20;

fn attrs(ba_page_shift: u32, buffer_page_shift: u32, hop: u8) -> ContextTableAttributes {
    ContextTableAttributes {
        ba_page_shift,
        buffer_page_shift,
        hop,
    }
}

/// A driver that allocates chunks and BT pages lazily, per object, as
/// `hns_roce_table_get` does, and issues `WRITE_BTn` for every newly allocated level.
struct LazyDriver {
    slots: HashMap<u64, u64>,
    children: HashMap<(u64, u64), u64>,
    chunks: HashMap<u64, u64>,
}

impl LazyDriver {
    fn new() -> Self {
        Self {
            slots: HashMap::new(),
            children: HashMap::new(),
            chunks: HashMap::new(),
        }
    }

    /// Makes object `index` present; returns its chunk's address.
    fn get(
        &mut self,
        table: &mut ContextTable,
        space: &mut TestSpace,
        rng: &mut XorShift64,
        index: u32,
    ) -> Result<u64, String> {
        let a = table.attributes().expect("attributes set");
        let chunk_size = 1u64 << a.buffer_page_shift;
        let bt_size = 1u64 << a.ba_page_shift;
        let (l0, entries, _) = context_table_location(
            u64::from(index),
            table.object_size(),
            a.buffer_page_shift,
            a.ba_page_shift,
            a.hop,
        );
        let t = u64::from(index) / (chunk_size / table.object_size());
        let mut new_chunk = || space.random_free(rng, DATA_WINDOW, chunk_size, chunk_size);
        let mut page = match self.slots.get(&l0) {
            Some(&page) => page,
            None => {
                let page = if a.hop == 0 {
                    new_chunk()
                } else {
                    space.alloc_bt_page(rng, bt_size)
                };
                self.slots.insert(l0, page);
                table
                    .write_base_address(index, 0, page)
                    .map_err(|e| format!("WRITE_BT0 of object {index}: {e}"))?;
                page
            }
        };
        for level in 0..a.hop {
            let entry = entries[usize::from(level)];
            page = match self.children.get(&(page, entry)) {
                Some(&child) => child,
                None => {
                    let child = if level + 1 == a.hop {
                        space.random_free(rng, DATA_WINDOW, chunk_size, chunk_size)
                    } else {
                        space.alloc_bt_page(rng, bt_size)
                    };
                    space
                        .memory
                        .write_u64(page + entry * 8, child)
                        .map_err(|e| format!("writing a BT entry: {e}"))?;
                    self.children.insert((page, entry), child);
                    table
                        .write_base_address(index, level + 1, child)
                        .map_err(|e| format!("WRITE_BT{} of object {index}: {e}", level + 1))?;
                    child
                }
            };
        }
        match self.chunks.insert(t, page) {
            Some(previous) if previous != page => Err(format!(
                "chunk {t} reached at {page:#x} but was first placed at {previous:#x}"
            )),
            _ => Ok(page),
        }
    }
}

fn run_lazy_seed(seed: u64, space: &mut TestSpace) -> Result<(), String> {
    let mut rng = XorShift64::new(seed);
    space.reset();
    let hop = (seed % 4) as u8;
    let object_size = rng.pick(&[32u64, 64, 256, 512]);
    let buffer_page_shift = rng.pick(&[12u32, 13, 16]);
    let ba_page_shift = rng.pick(&[12u32, 13]);
    let chunk_objects = (1u64 << buffer_page_shift) / object_size;
    let n = 1u64 << (ba_page_shift - 3);
    let per_slot = n.pow(u32::from(hop)) * chunk_objects;
    let spread = if hop == 0 { 64 } else { 4 };
    let object_count = rng.range(1, spread * per_slot).min(u64::from(u32::MAX)) as u32;
    let slots = u64::from(object_count).div_ceil(per_slot) as usize;
    let describe = format!(
        "hop {hop}, {object_size}-byte objects, chunk 2^{buffer_page_shift}, BT page \
         2^{ba_page_shift}, {object_count} objects in {slots} slots"
    );

    let mut table = ContextTable::new("QPC", object_size, object_count, slots);
    table
        .set_attributes(attrs(ba_page_shift, buffer_page_shift, hop))
        .map_err(|e| format!("{describe}: {e}"))?;
    let mut driver = LazyDriver::new();
    let mut indices = vec![0, object_count - 1];
    indices.extend((0..150).map(|_| rng.below(u64::from(object_count)) as u32));
    for &index in &indices {
        driver
            .get(&mut table, space, &mut rng, index)
            .map_err(|e| format!("{describe}: {e}"))?;
    }
    // Objects sharing a chunk with a sampled one are present too.
    let mut probes = indices.clone();
    probes.extend(indices.iter().map(|&i| (i ^ 1).min(object_count - 1)));
    for index in probes {
        let t = u64::from(index) / chunk_objects;
        let Some(&chunk) = driver.chunks.get(&t) else {
            continue;
        };
        let expected = chunk + (u64::from(index) % chunk_objects) * object_size;
        let got = table
            .locate(&space.memory, index)
            .map_err(|e| format!("{describe}: locate({index}): {e}"))?;
        if got != expected {
            return Err(format!(
                "{describe}: locate({index}) = {got:#x}, expected {expected:#x} (chunk {t})"
            ));
        }
        let location = table.location(index).map_err(|e| format!("{describe}: {e}"))?;
        let driver_view = context_table_location(u64::from(index), object_size, buffer_page_shift, ba_page_shift, hop);
        if (location.l0, location.entries, location.offset_in_chunk) != driver_view {
            return Err(format!(
                "{describe}: object {index}: device location {location:?} != driver {driver_view:?}"
            ));
        }
        let last_level = table
            .read_base_address(&space.memory, index, hop)
            .map_err(|e| format!("{describe}: READ_BT{hop}({index}): {e}"))?;
        if last_level != chunk {
            return Err(format!(
                "{describe}: READ_BT{hop}({index}) = {last_level:#x}, expected chunk {chunk:#x}"
            ));
        }
    }
    if table.valid_l0_slots() != driver.slots.len() {
        return Err(format!(
            "{describe}: {} valid slots, driver wrote {}",
            table.valid_l0_slots(),
            driver.slots.len()
        ));
    }
    Ok(())
}

#[test]
fn locate_finds_lazily_allocated_chunks_for_every_hop() {
    let mut space = TestSpace::new(8 * MIB);
    for seed in seeds(48, 0x4E4D) {
        let _guard = SeedGuard(seed);
        if let Err(message) = run_lazy_seed(seed, &mut space) {
            panic!("seed {seed:#x}: {message}");
        }
    }
}

/// A dense table built per L0 slot with the MTR builder (an L0 slot of a hop-h table is
/// the root of a hop-h MTR over the slot's chunks): an independent check of the entry
/// arithmetic.
#[test]
fn a_table_is_an_mtr_per_l0_slot() {
    let mut space = TestSpace::new(4 * MIB);
    for (hop, ba_page_shift, buffer_page_shift, object_size, chunks) in [
        (0u8, 12u32, 12u32, 512u64, 40u64),
        (1, 12, 12, 512, 700),
        (1, 13, 13, 64, 1500),
        (2, 12, 12, 256, 700),
        (2, 12, 16, 512, 600),
        (3, 12, 12, 64, 600),
    ] {
        let mut rng = XorShift64::new(u64::from(hop) * 100 + u64::from(buffer_page_shift));
        space.reset();
        let chunk_size = 1u64 << buffer_page_shift;
        let chunk_objects = chunk_size / object_size;
        let n = 1u64 << (ba_page_shift - 3);
        let per_slot = n.pow(u32::from(hop));
        let object_count = (chunks * chunk_objects) as u32;
        let slots = chunks.div_ceil(per_slot);
        let mut table = ContextTable::new("MPT", object_size, object_count, slots as usize);
        table
            .set_attributes(attrs(ba_page_shift, buffer_page_shift, hop))
            .unwrap();
        let chunk_addresses: Vec<u64> = (0..chunks)
            .map(|_| space.random_free(&mut rng, DATA_WINDOW, chunk_size, chunk_size))
            .collect();
        for slot in 0..slots {
            let first = slot * per_slot;
            let in_slot = &chunk_addresses[first as usize..(first + per_slot).min(chunks) as usize];
            let root = if hop == 0 {
                in_slot[0]
            } else {
                let regions = [MtrRegion {
                    page_count: in_slot.len() as u64,
                    hop,
                }];
                let request = MtrBuildRequest {
                    ba_page_shift,
                    buffer_page_shift,
                    regions: &regions,
                    pages: in_slot,
                };
                let bt_size = 1u64 << ba_page_shift;
                let built = build_mtr(&request, &mut || Ok(space.alloc_bt_page(&mut rng, bt_size))).unwrap();
                for page in &built.bt_pages {
                    space.memory.write(page.address, &page.to_bytes()).unwrap();
                }
                built.root
            };
            // Tag = any object in the slot: the last one, to exercise the tag → slot map.
            let tag = ((first + per_slot).min(chunks) * chunk_objects - 1) as u32;
            table.write_base_address(tag, 0, root).unwrap();
        }
        assert_eq!(table.valid_l0_slots(), slots as usize);
        let mut indices: Vec<u32> = (0..chunks)
            .flat_map(|t| [t * chunk_objects, (t + 1) * chunk_objects - 1])
            .map(|i| i as u32)
            .collect();
        indices.extend((0..200).map(|_| rng.below(u64::from(object_count)) as u32));
        for index in indices {
            let t = u64::from(index) / chunk_objects;
            let expected = chunk_addresses[t as usize] + (u64::from(index) % chunk_objects) * object_size;
            assert_eq!(
                table.locate(&space.memory, index),
                Ok(expected),
                "hop {hop}, chunk 2^{buffer_page_shift}, BT 2^{ba_page_shift}, object {index}"
            );
        }
    }
}

/// A hop-1 table of 64-byte objects in 4 KiB chunks (64 per chunk, 512 chunks per slot)
/// with two slots.
fn hop1_table() -> ContextTable {
    let mut table = ContextTable::new("CQC", 64, 2 * 512 * 64, 2);
    table.set_attributes(attrs(12, 12, 1)).unwrap();
    table
}

#[test]
fn missing_attributes_are_reported() {
    let memory = PagedMemory::new();
    let mut table = ContextTable::new("SRQC", 64, 16, 1);
    let expected = HemError::NoAttributes { table: "SRQC" };
    assert_eq!(table.locate(&memory, 0), Err(expected.clone()));
    assert_eq!(table.write_base_address(0, 0, 0x1000), Err(expected.clone()));
    assert_eq!(table.read_base_address(&memory, 0, 0), Err(expected));
    assert!(table
        .locate(&memory, 0)
        .unwrap_err()
        .to_string()
        .contains("CFG_BT_ATTR"));
}

#[test]
fn an_empty_slot_names_the_object_and_the_slot() {
    let memory = PagedMemory::new();
    let table = hop1_table();
    let index = 512 * 64 + 5; // chunk 512 → slot 1
    let err = table.locate(&memory, index).unwrap_err();
    assert_eq!(
        err,
        HemError::SlotEmpty {
            table: "CQC",
            index,
            slot: 1
        }
    );
    assert_eq!(
        err.to_string(),
        format!("CQC: no base address for object {index}: L0 slot 1 is empty")
    );
}

/// Found by the `mtt` fuzz target (docs/fuzzing.md): a chunk near the top of the address
/// space used to wrap an object's context to a low address the driver never named.
#[test]
fn a_context_past_the_end_of_the_address_space_is_refused_not_wrapped() {
    let memory = PagedMemory::new();
    // 64 MiB chunks of 256-byte objects, the one chunk on the last 4 KiB page.
    let mut table = ContextTable::new("QPC", 256, 1 << 18, 1);
    table.set_attributes(attrs(12, 26, 0)).unwrap();
    let top_page = u64::MAX - 4095;
    table.write_base_address(0, 0, top_page).unwrap();
    assert_eq!(table.locate(&memory, 0), Ok(top_page));
    assert_eq!(table.locate(&memory, 14), Ok(top_page + 14 * 256));
    // Object 15 would end exactly at 2^64, object 16 would start there.
    for index in [15, 16, 100_000] {
        assert_eq!(
            table.locate(&memory, index),
            Err(HemError::ContextBeyondAddressSpace {
                table: "QPC",
                index,
                chunk: top_page,
                offset: u64::from(index) * 256,
            }),
            "object {index}"
        );
    }
    assert!(table.locate_cached(&memory, 16).is_err(), "and is not remembered");
}

#[test]
fn indices_beyond_the_table_or_its_slots_are_rejected() {
    let memory = PagedMemory::new();
    let mut table = hop1_table();
    assert_eq!(
        table.locate(&memory, 2 * 512 * 64),
        Err(HemError::IndexOutOfRange {
            table: "CQC",
            index: 2 * 512 * 64,
            count: 2 * 512 * 64
        })
    );
    // One slot of hop 0 covers a single chunk: object 64 would need slot 1.
    let mut small = ContextTable::new("GMV", 64, 128, 1);
    small.set_attributes(attrs(12, 12, 0)).unwrap();
    assert_eq!(
        small.write_base_address(64, 0, 0x1000),
        Err(HemError::L0OutOfRange {
            table: "GMV",
            index: 64,
            slot: 1,
            slots: 1
        })
    );
    assert_eq!(
        table.write_base_address(0, 2, 0x1000),
        Err(HemError::LevelOutOfRange {
            table: "CQC",
            level: 2,
            hop: 1
        })
    );
    assert!(matches!(
        table.write_base_address(0, 0, 0x1800),
        Err(HemError::MisalignedAddress {
            address: 0x1800,
            alignment: 4096,
            ..
        })
    ));
    assert_eq!(
        table.write_base_address(0, 1, 0),
        Err(HemError::NullAddress {
            table: "CQC",
            index: 0,
            level: 1
        })
    );
    assert_eq!(table.valid_l0_slots(), 0, "failed writes change nothing");
}

#[test]
fn zero_entries_and_unreachable_bt_pages_are_reported() {
    let mut space = TestSpace::new(MIB);
    let mut rng = XorShift64::new(1);
    let mut table = hop1_table();
    let bt = space.alloc_bt_page(&mut rng, 4096);
    table.write_base_address(0, 0, bt).unwrap();
    // Object 64 × 7 + 3 is in chunk 7: entry 7 of the (zeroed) L0 BT page.
    let index = 64 * 7 + 3;
    let err = table.locate(&space.memory, index).unwrap_err();
    assert_eq!(
        err,
        HemError::ZeroEntry {
            table: "CQC",
            index,
            level: 0,
            bt_page: bt,
            entry: 7,
            address: bt + 7 * 8,
            expected: HemTarget::Chunk { chunk: 7 },
        }
    );
    assert!(err.to_string().contains("buffer chunk 7"), "{err}");

    space.memory.write_u64(bt + 7 * 8, 0x1234_5000).unwrap();
    assert_eq!(table.locate(&space.memory, index), Ok(0x1234_5000 + 3 * 64));
    assert_eq!(table.read_base_address(&space.memory, index, 1), Ok(0x1234_5000));
    assert_eq!(table.read_base_address(&space.memory, index, 0), Ok(bt));

    space.memory.write_u64(bt + 7 * 8, 0x1234_5008).unwrap();
    assert!(matches!(
        table.locate(&space.memory, index),
        Err(HemError::MisalignedEntry { value: 0x1234_5008, .. })
    ));

    // Slot 1 points at an unmapped page.
    let far = 512 * 64;
    table.write_base_address(far, 0, 0x7000_0000).unwrap();
    let err = table.locate(&space.memory, far).unwrap_err();
    assert!(
        matches!(
            err,
            HemError::BtUnreachable {
                level: 0,
                bt_page: 0x7000_0000,
                entry: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not mapped"), "{err}");
}

#[test]
fn destroy_clears_slots_and_attributes_are_locked_while_slots_are_valid() {
    let mut table = hop1_table();
    table.write_base_address(3, 0, 0x10_0000).unwrap();
    table.write_base_address(512 * 64, 0, 0x20_0000).unwrap();
    assert_eq!(table.valid_l0_slots(), 2);
    assert_eq!(table.l0_slot(1), Some(0x20_0000));
    // Same attributes again are fine; different ones are not.
    table.set_attributes(attrs(12, 12, 1)).unwrap();
    assert_eq!(
        table.set_attributes(attrs(12, 13, 1)),
        Err(HemError::AttributesInUse {
            table: "CQC",
            valid_slots: 2
        })
    );
    table.destroy_base_address(3, 1).unwrap();
    assert_eq!(table.valid_l0_slots(), 2, "BT1 destroy leaves the slot");
    table.destroy_base_address(3, 0).unwrap();
    table.destroy_base_address(3, 0).unwrap();
    assert_eq!(table.valid_l0_slots(), 1);
    table.reset();
    assert_eq!(table.valid_l0_slots(), 0);
    assert_eq!(table.attributes(), None);
    table.set_attributes(attrs(12, 13, 1)).unwrap();
}

#[test]
fn bad_attributes_are_rejected() {
    let mut table = ContextTable::new("QPC", 8192, 4, 1);
    let reject = |table: &mut ContextTable, a| table.set_attributes(a).unwrap_err();
    assert_eq!(
        reject(&mut table, attrs(12, 12, 1)),
        HemError::ObjectLargerThanChunk {
            table: "QPC",
            object_size: 8192,
            chunk_size: 4096
        }
    );
    assert!(matches!(
        reject(&mut table, attrs(11, 13, 1)),
        HemError::BtPageShift { shift: 11, .. }
    ));
    assert!(matches!(
        reject(&mut table, attrs(22, 13, 1)),
        HemError::BtPageShift { shift: 22, .. }
    ));
    assert!(matches!(
        reject(&mut table, attrs(12, 31, 1)),
        HemError::BufferPageShift { shift: 31, .. }
    ));
    assert!(matches!(
        reject(&mut table, attrs(12, 13, 4)),
        HemError::Hop { hop: 4, .. }
    ));
    assert_eq!(table.attributes(), None);
    table.set_attributes(attrs(12, 13, 3)).unwrap();
}

#[test]
fn a_remembered_address_is_used_until_the_driver_may_have_changed_the_bt_pages() {
    let mut space = TestSpace::new(MIB);
    let mut rng = XorShift64::new(2);
    let mut table = hop1_table();
    let bt = space.alloc_bt_page(&mut rng, 4096);
    table.write_base_address(0, 0, bt).unwrap();
    let index = 64 * 7 + 3;
    // A failed walk is not remembered: the entry written afterwards is found.
    assert!(matches!(
        table.locate_cached(&space.memory, index),
        Err(HemError::ZeroEntry { .. })
    ));
    assert_eq!(table.remembered_locations(), 0);
    space.memory.write_u64(bt + 7 * 8, 0x1234_5000).unwrap();
    assert_eq!(table.locate_cached(&space.memory, index), Ok(0x1234_5000 + 3 * 64));
    assert_eq!(table.remembered_locations(), 1);

    // The host BT page changes behind the device's back: like hardware's BT cache, the
    // remembered address stands, while an uncached walk sees the new entry.
    space.memory.write_u64(bt + 7 * 8, 0x5678_9000).unwrap();
    assert_eq!(table.locate_cached(&space.memory, index), Ok(0x1234_5000 + 3 * 64));
    assert_eq!(table.locate(&space.memory, index), Ok(0x5678_9000 + 3 * 64));

    // Each way the driver announces a change makes the next lookup walk again.
    type Announcement = (&'static str, fn(&mut ContextTable));
    let announcements: [Announcement; 5] = [
        ("forget_locations", |t| t.forget_locations()),
        ("WRITE_BT1", |t| t.write_base_address(64 * 7, 1, 0x5678_9000).unwrap()),
        ("DESTROY_BT1", |t| t.destroy_base_address(64 * 7, 1).unwrap()),
        ("WRITE_BT0 of another slot", |t| {
            t.write_base_address(512 * 64, 0, 0x20_0000).unwrap()
        }),
        ("CFG_BT_ATTR, unchanged", |t| {
            t.set_attributes(attrs(12, 12, 1)).unwrap()
        }),
    ];
    for (what, announce) in announcements {
        space.memory.write_u64(bt + 7 * 8, 0x1234_5000).unwrap();
        assert_eq!(
            table.locate_cached(&space.memory, index),
            Ok(0x1234_5000 + 3 * 64),
            "{what}"
        );
        space.memory.write_u64(bt + 7 * 8, 0x5678_9000).unwrap();
        announce(&mut table);
        assert_eq!(table.remembered_locations(), 0, "{what}");
        assert_eq!(
            table.locate_cached(&space.memory, index),
            Ok(0x5678_9000 + 3 * 64),
            "{what}"
        );
        table.forget_locations();
    }

    // A reset forgets everything, so nothing can be located any more.
    assert!(table.locate_cached(&space.memory, index).is_ok());
    table.reset();
    assert_eq!(
        table.locate_cached(&space.memory, index),
        Err(HemError::NoAttributes { table: "CQC" })
    );
}

#[test]
fn the_remembered_addresses_stay_bounded() {
    let mut space = TestSpace::new(MIB);
    let mut rng = XorShift64::new(3);
    // Hop 0, one 1 MiB chunk of 64-byte objects in one slot: 16 384 objects.
    let mut table = ContextTable::new("QPC", 64, 16_384, 1);
    table.set_attributes(attrs(12, 20, 0)).unwrap();
    let chunk = space.random_free(&mut rng, DATA_WINDOW, MIB as u64, MIB as u64);
    table.write_base_address(0, 0, chunk).unwrap();
    for index in 0..16_384u32 {
        assert_eq!(
            table.locate_cached(&space.memory, index),
            Ok(chunk + u64::from(index) * 64)
        );
        assert!(table.remembered_locations() <= LOCATION_CACHE_CAPACITY);
    }
}
