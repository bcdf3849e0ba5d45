//! MTT walker tests. The BT pages are built by the real driver-side builder
//! (`verbs-provider/src/mtr.rs`, compiled here as `driver_builder`), so these tests also
//! check that the driver and the device agree.

use rnic_firmware_if::mtr::{MtrRegion, QpBufferLayout};

use super::driver_builder::{build_mtr, BuiltMtr, MtrBuildError, MtrBuildRequest};
use super::test_support::{seeds, CountingMemory, SeedGuard, TestSpace, XorShift64, BT_WINDOW, DATA_WINDOW};
use super::*;
use crate::memory::{HostMemoryExt, PagedMemory, FRAME_SIZE};

const MIB: u64 = 1 << 20;

fn region(page_count: u64, hop: u8) -> MtrRegion {
    MtrRegion { page_count, hop }
}

/// Builds with the driver builder (BT pages at random addresses) and writes the pages.
fn build_into(
    space: &mut TestSpace,
    rng: &mut XorShift64,
    ba_page_shift: u32,
    buffer_page_shift: u32,
    regions: &[MtrRegion],
    pages: &[u64],
) -> Result<BuiltMtr, MtrBuildError> {
    let request = MtrBuildRequest {
        ba_page_shift,
        buffer_page_shift,
        regions,
        pages,
    };
    let bt_size = 1u64 << ba_page_shift;
    let built = build_mtr(&request, &mut || Ok(space.alloc_bt_page(rng, bt_size)))?;
    for page in &built.bt_pages {
        space
            .memory
            .write(page.address, &page.to_bytes())
            .expect("BT pages are mapped");
    }
    Ok(built)
}

/// Random bus addresses for `count` pages: runs of contiguous pages and single scattered
/// pages, each page aligned to its size; the ends of every page are mapped.
fn place_pages(space: &mut TestSpace, rng: &mut XorShift64, count: u64, page_size: u64) -> Vec<u64> {
    let mut pages = Vec::with_capacity(count as usize);
    while (pages.len() as u64) < count {
        let left = count - pages.len() as u64;
        let run = if rng.chance(1, 3) { 1 } else { rng.range(1, 16) }.min(left);
        let base = space.random_free(rng, DATA_WINDOW, run * page_size, page_size);
        for i in 0..run {
            let page = base + i * page_size;
            space.map_alias_ends(page, page_size);
            pages.push(page);
        }
    }
    pages
}

/// One randomized layout, checked against the reference translation `pages[p] + in_page`.
fn run_seed(seed: u64, space: &mut TestSpace) -> Result<(), String> {
    let mut rng = XorShift64::new(seed);
    space.reset();

    let hop = rng.below(4) as u8;
    let buffer_page_shift = if rng.chance(1, 12) {
        rng.pick(&[25, 30])
    } else {
        rng.pick(&[12, 13, 16, 21])
    };
    let ba_page_shift = rng.pick(&[12u32, 13, 14]);
    let unit = 1u64 << (ba_page_shift - 3);
    let page_size = 1u64 << buffer_page_shift;

    // Regions: the first has the chosen hop, the others any hop (all 0 in direct mode),
    // sized so hop 2/3 regions span several lower BT pages and the root still fits.
    let region_count = rng.range(1, 3) as usize;
    let mut regions = Vec::new();
    let mut root_left = unit;
    for r in 0..region_count {
        let hop = match (hop, r) {
            (0, _) => 0,
            (h, 0) => h,
            _ => rng.range(1, 3) as u8,
        };
        let mut page_count = match hop {
            0 => rng.range(1, 8),
            1 => rng.range(0, root_left.min(300)),
            2 => rng.range(0, (root_left * unit).min(unit * 2 + unit / 2)),
            _ => rng.range(0, unit + unit / 2),
        };
        if r > 0 && rng.chance(1, 8) {
            page_count = 0; // e.g. a QP on an SRQ has no RQ region
        }
        let candidate = region(page_count, hop);
        root_left -= candidate.root_entries(unit).min(root_left);
        regions.push(candidate);
    }
    if regions.iter().all(|r| r.page_count == 0) {
        regions[0].page_count = 1;
    }
    let total: u64 = regions.iter().map(|r| r.page_count).sum();

    let pages = if hop == 0 {
        // Direct mode: one contiguous run, only 4 KiB aligned.
        let base = space.random_free(&mut rng, DATA_WINDOW, total * page_size, FRAME_SIZE);
        let pages: Vec<u64> = (0..total).map(|i| base + i * page_size).collect();
        for &page in &pages {
            space.map_alias_ends(page, page_size);
        }
        pages
    } else {
        place_pages(space, &mut rng, total, page_size)
    };

    let describe =
        format!("hop {hop}, BT page 2^{ba_page_shift}, buffer page 2^{buffer_page_shift}, regions {regions:?}");
    let built = build_into(space, &mut rng, ba_page_shift, buffer_page_shift, &regions, &pages)
        .map_err(|e| format!("{describe}: build_mtr failed: {e}"))?;
    let mtr =
        Mtr::new(built.root, ba_page_shift, buffer_page_shift, &regions).map_err(|e| format!("{describe}: {e}"))?;
    mtr.validate().map_err(|e| format!("{describe}: {e}"))?;
    if mtr.size() != total * page_size {
        return Err(format!("{describe}: size {} != {}", mtr.size(), total * page_size));
    }

    // Page index → hop of its region, to check the number of BT reads per walk.
    let mut hop_of_page = Vec::with_capacity(total as usize);
    for r in &regions {
        hop_of_page.extend((0..r.page_count).map(|_| r.hop));
    }

    let counting = CountingMemory::new(&space.memory);
    let check = |offset: u64, must_be_mapped: bool| -> Result<(), String> {
        let page = (offset / page_size) as usize;
        let expected = pages[page] + offset % page_size;
        let got = translate(&counting, &mtr, offset)
            .map_err(|e| format!("{describe}: offset {offset:#x} (page {page}): {e}"))?;
        if got != expected {
            return Err(format!(
                "{describe}: offset {offset:#x} (page {page}) translated to {got:#x}, expected {expected:#x}"
            ));
        }
        let reads = counting.take();
        if reads != usize::from(hop_of_page[page]) {
            return Err(format!(
                "{describe}: offset {offset:#x}: {reads} BT reads for a hop-{} region",
                hop_of_page[page]
            ));
        }
        if must_be_mapped && !space.memory.is_mapped(got) {
            return Err(format!(
                "{describe}: offset {offset:#x} → {got:#x} is not a mapped page byte"
            ));
        }
        Ok(())
    };
    for p in 0..total {
        check(p * page_size, true)?;
        check(p * page_size + page_size - 1, true)?;
    }
    for _ in 0..64 {
        check(rng.below(total * page_size), false)?;
    }

    let size = total * page_size;
    match translate(&space.memory, &mtr, size) {
        Err(MttError::OutOfRange { offset, size: s }) if offset == size && s == size => {}
        other => return Err(format!("{describe}: offset == size gave {other:?}")),
    }

    // Ranges: pieces are contiguous in the buffer, split exactly at page boundaries.
    for _ in 0..8 {
        let offset = rng.below(size);
        let length = rng.range(1, (size - offset).min(3 * page_size));
        let mut at = offset;
        let mut failure = None;
        translate_range(&space.memory, &mtr, offset, length, |bus, chunk| {
            let expected = pages[(at / page_size) as usize] + at % page_size;
            let ends_on_boundary = (at + chunk) & (page_size - 1) == 0 || at + chunk == offset + length;
            if failure.is_none() && (bus != expected || !ends_on_boundary || chunk == 0) {
                failure = Some(format!("piece at {at:#x}: {bus:#x}+{chunk:#x}, expected {expected:#x}"));
            }
            at += chunk;
        })
        .map_err(|e| format!("{describe}: range {offset:#x}+{length:#x}: {e}"))?;
        if let Some(f) = failure {
            return Err(format!("{describe}: range {offset:#x}+{length:#x}: {f}"));
        }
        if at != offset + length {
            return Err(format!(
                "{describe}: range {offset:#x}+{length:#x} covered up to {at:#x}"
            ));
        }
    }
    Ok(())
}

#[test]
fn translation_matches_the_reference_on_randomized_layouts() {
    let mut space = TestSpace::new((2 * MIB) as usize);
    for seed in seeds(200, 0x3717) {
        let _guard = SeedGuard(seed);
        if let Err(message) = run_seed(seed, &mut space) {
            panic!("seed {seed:#x}: {message}");
        }
    }
}

#[test]
fn hop_3_walks_several_root_l1_and_l2_entries() {
    // 4 KiB BT pages (unit 512): a hop-3 region of 512² + 700 pages needs two root
    // entries, two L1 pages and 514 L2 pages; a hop-1 region follows it in the root.
    let mut space = TestSpace::new((3 * MIB) as usize);
    let mut rng = XorShift64::new(3);
    let big = 512 * 512 + 700;
    let regions = [region(big, 3), region(5, 1)];
    let total = big + 5;
    // Scattered 4 KiB pages (a bijective shuffle); the walk never reads them.
    let pages: Vec<u64> = (0..total)
        .map(|i| DATA_WINDOW.0 + ((i * 7919) % total) * 4096)
        .collect();
    let built = build_into(&mut space, &mut rng, 12, 12, &regions, &pages).unwrap();
    assert_eq!(built.bt_pages.len(), 1 + 2 + 514);
    assert_eq!(built.bt_pages[0].entries.len(), 2 + 5);
    let mtr = Mtr::new(built.root, 12, 12, &regions).unwrap();
    let mut offsets: Vec<u64> = vec![0, 511, 512, 512 * 512 - 1, 512 * 512, big - 1, big, total - 1];
    offsets.extend((0..2000).map(|_| rng.below(total)));
    for page in offsets {
        let in_page = rng.below(4096);
        let got = translate(&space.memory, &mtr, page * 4096 + in_page).unwrap();
        assert_eq!(got, pages[page as usize] + in_page, "page {page}");
    }
}

#[test]
fn qp_buffer_regions_translate_at_their_qpc_offsets() {
    // SQ 256 × 64 B (4 pages) hop 2, SGE 512 × 16 B (2 pages) hop 1, RQ 128 × 32 B
    // (1 page) hop 2: the hns default hop numbers.
    let layout = QpBufferLayout::from_shifts(8, 9, 7, 1, false);
    let counts = layout.page_counts(12);
    let regions = [region(counts[0], 2), region(counts[1], 1), region(counts[2], 2)];
    let mut space = TestSpace::new((MIB) as usize);
    let mut rng = XorShift64::new(11);
    let total: u64 = counts.iter().sum();
    let pages = place_pages(&mut space, &mut rng, total, 4096);
    let built = build_into(&mut space, &mut rng, 12, 12, &regions, &pages).unwrap();
    let mtr = Mtr::new(built.root, 12, 12, &regions).unwrap();
    let offsets = layout.region_offsets(12);
    for (r, &offset) in offsets.iter().enumerate() {
        let first_page = (offset / 4096) as usize;
        assert_eq!(
            translate(&space.memory, &mtr, offset + 40).unwrap(),
            pages[first_page] + 40,
            "region {r}"
        );
    }
}

/// A two-page hop-2 buffer at known addresses: root at 0x1_0000, L1 at 0x2_0000,
/// pages at 0x10_0000 and 0x20_0000.
fn small_hop2() -> (PagedMemory, Mtr) {
    let memory = PagedMemory::new();
    let backing = crate::memory::Backing::zeroed(2 * FRAME_SIZE as usize);
    memory.map_frame(0x1_0000, &backing, 0, true);
    memory.map_frame(0x2_0000, &backing, 1, true);
    memory.write_u64(0x1_0000, 0x2_0000).unwrap();
    memory.write_u64(0x2_0000, 0x10_0000).unwrap();
    memory.write_u64(0x2_0008, 0x20_0000).unwrap();
    (memory, Mtr::single(0x1_0000, 12, 12, 2, 2))
}

#[test]
fn a_well_formed_small_mtr_translates() {
    let (memory, mtr) = small_hop2();
    assert_eq!(translate(&memory, &mtr, 0x1234).unwrap(), 0x20_0234);
    let mut pieces = Vec::new();
    translate_range(&memory, &mtr, 0xFF0, 0x20, |a, l| pieces.push((a, l))).unwrap();
    assert_eq!(pieces, [(0x10_0FF0, 0x10), (0x20_0000, 0x10)]);
}

#[test]
fn a_range_from_a_known_first_address_skips_only_the_first_walk() {
    let (memory, mtr) = small_hop2();
    let counting = CountingMemory::new(&memory);
    let first = translate(&counting, &mtr, 0xFF0).unwrap();
    assert_eq!(counting.take(), 2, "hop 2: two BT reads");
    let collect = |first_bus: Option<u64>| {
        let mut pieces = Vec::new();
        try_translate_range_from(&counting, &mtr, 0xFF0, first_bus, 0x20, |a, l| {
            pieces.push((a, l));
            Ok::<(), MttError>(())
        })
        .unwrap();
        (pieces, counting.take())
    };
    let (walked, walked_reads) = collect(None);
    let (reused, reused_reads) = collect(Some(first));
    assert_eq!(walked, [(0x10_0FF0, 0x10), (0x20_0000, 0x10)]);
    assert_eq!(reused, walked, "same pieces either way");
    assert_eq!((walked_reads, reused_reads), (4, 2), "the second page is still walked");
    // The range is checked before the known address is used.
    assert!(matches!(
        try_translate_range_from(&memory, &mtr, 0x1FF0, Some(first), 0x20, |_, _| Ok::<(), MttError>(())),
        Err(MttError::RangeOutOfRange { .. })
    ));
}

#[test]
fn the_translation_cache_walks_once_per_page_until_cleared() {
    let (memory, mtr) = small_hop2();
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    assert_eq!(cache.translate(&counting, &mtr, 0x1234), Ok(0x20_0234));
    assert_eq!(counting.take(), 2, "a miss walks both levels");
    assert_eq!(cache.translate(&counting, &mtr, 0x1FFF), Ok(0x20_0FFF));
    assert_eq!(counting.take(), 0, "a hit on the same page reads nothing");
    assert_eq!(cache.len(), 1);

    // The BT entry changes behind the cache: it answers from memory until cleared.
    memory.write_u64(0x2_0008, 0x30_0000).unwrap();
    assert_eq!(cache.translate(&counting, &mtr, 0x1000), Ok(0x20_0000));
    cache.clear();
    assert!(cache.is_empty());
    assert_eq!(cache.translate(&counting, &mtr, 0x1000), Ok(0x30_0000));

    // Another MTR over the same root is a different key; failures are not remembered.
    let other = Mtr::single(0x1_0000, 12, 12, 4, 2);
    assert!(cache.translate(&counting, &other, 0x3000).is_err());
    assert_eq!(cache.len(), 1);
    memory.write_u64(0x2_0018, 0x40_0000).unwrap();
    assert_eq!(cache.translate(&counting, &other, 0x3000), Ok(0x40_0000));
    // Out of range is still an error on a cached MTR.
    assert_eq!(
        cache.translate(&counting, &mtr, 0x2000),
        translate(&memory, &mtr, 0x2000)
    );
    let mut pieces = Vec::new();
    try_translate_range_cached(&counting, &mut cache, &mtr, 0xFF0, None, 0x20, |a, l| {
        pieces.push((a, l));
        Ok::<(), MttError>(())
    })
    .unwrap();
    assert_eq!(pieces, [(0x10_0FF0, 0x10), (0x30_0000, 0x10)]);
}

#[test]
fn the_translation_cache_answers_for_every_mtr_as_the_uncached_walk_does() {
    // Validity is remembered per MTR: an invalid MTR is refused every time, also next to
    // valid ones, and more MTRs than are remembered as valid all still translate.
    let (memory, mtr) = small_hop2();
    let mut cache = TranslationCache::default();
    let bad_shift = Mtr::single(0x1000, 12, 11, 1, 1);
    let bad_hop = Mtr::single(0x1000, 12, 12, 1, 4);
    let directs: Vec<Mtr> = (0..2 * VALID_MTRS as u64)
        .map(|i| Mtr::single(0x200_0000 + i * 0x1_0000, 12, 12, 4, 0))
        .collect();
    for _ in 0..3 {
        for candidate in [&mtr, &bad_shift, &bad_hop].into_iter().chain(&directs) {
            for offset in [0, 0x1234, 0x4000] {
                assert_eq!(
                    cache.translate(&memory, candidate, offset),
                    translate(&memory, candidate, offset),
                    "{candidate:?} at {offset:#x}"
                );
                let mut cached = Vec::new();
                let cached_result =
                    try_translate_range_cached(&memory, &mut cache, candidate, offset, None, 0x20, |a, l| {
                        cached.push((a, l));
                        Ok::<(), MttError>(())
                    });
                let mut walked = Vec::new();
                let walked_result = try_translate_range(&memory, candidate, offset, 0x20, |a, l| {
                    walked.push((a, l));
                    Ok::<(), MttError>(())
                });
                assert_eq!(
                    (cached_result, cached),
                    (walked_result, walked),
                    "{candidate:?} at {offset:#x}"
                );
            }
        }
    }
}

#[test]
fn the_translation_cache_stays_bounded() {
    // Direct mode is never cached; a hop-1 MTR of many pages fills the cache, which then
    // stops remembering new pages but still translates them.
    let memory = PagedMemory::new();
    // Twice the capacity in pages: one root BT page of 8-byte entries.
    let pages = 2 * TRANSLATION_CACHE_CAPACITY as u64;
    let root_bytes = pages * 8;
    let frames = root_bytes / FRAME_SIZE;
    let backing = crate::memory::Backing::zeroed(root_bytes as usize);
    memory.map_contiguous(0x10_0000, &backing, 0, frames as usize, true);
    for page in 0..pages {
        memory
            .write_u64(0x10_0000 + page * 8, 0x1000_0000 + page * 4096)
            .unwrap();
    }
    let mtr = Mtr::single(0x10_0000, root_bytes.trailing_zeros(), 12, pages, 1);
    let mut cache = TranslationCache::default();
    for page in 0..pages {
        assert_eq!(
            cache.translate(&memory, &mtr, page * 4096 + 5),
            Ok(0x1000_0005 + page * 4096)
        );
        assert!(cache.len() <= TRANSLATION_CACHE_CAPACITY);
    }
    let direct = Mtr::single(0x200_0000, 12, 12, 4, 0);
    assert_eq!(cache.translate(&memory, &direct, 0x1234), Ok(0x200_1234));
}

#[test]
fn an_unmapped_root_is_reported_with_level_index_and_address() {
    let memory = PagedMemory::new();
    let mtr = Mtr::single(0x5000_0000, 12, 12, 4, 1);
    let err = translate(&memory, &mtr, 3 * 4096).unwrap_err();
    assert!(
        matches!(
            err,
            MttError::BtUnreachable {
                level: 0,
                index: 3,
                address: 0x5000_0018,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("level-0") && text.contains("entry 3") && text.contains("0x50000018"),
        "{text}"
    );
}

#[test]
fn a_zero_entry_names_its_level_and_what_it_should_point_to() {
    let (memory, mtr) = small_hop2();
    memory.write_u64(0x2_0008, 0).unwrap();
    let err = translate(&memory, &mtr, 4096).unwrap_err();
    assert_eq!(
        err,
        MttError::EmptyEntry {
            level: 1,
            index: 1,
            address: 0x2_0008,
            expected: EntryTarget::BufferPage { page: 1 },
        }
    );
    assert!(err.to_string().contains("buffer page 1"), "{err}");

    memory.write_u64(0x1_0000, 0).unwrap();
    let err = translate(&memory, &mtr, 0).unwrap_err();
    assert_eq!(
        err,
        MttError::EmptyEntry {
            level: 0,
            index: 0,
            address: 0x1_0000,
            expected: EntryTarget::BtPage { level: 1 },
        }
    );
}

#[test]
fn offsets_beyond_the_regions_are_out_of_range() {
    let (memory, mtr) = small_hop2();
    assert_eq!(
        translate(&memory, &mtr, 0x2000),
        Err(MttError::OutOfRange {
            offset: 0x2000,
            size: 0x2000
        })
    );
    let mut called = false;
    let err = translate_range(&memory, &mtr, 0x1000, 0x1001, |_, _| called = true).unwrap_err();
    assert!(matches!(err, MttError::RangeOutOfRange { .. }), "{err:?}");
    assert!(!called, "no piece may be delivered for a range that does not fit");
    translate_range(&memory, &mtr, 0x2000, 0, |_, _| called = true).unwrap();
    assert!(!called);
}

#[test]
fn hop_0_mixed_with_a_hop_1_region_is_rejected() {
    let memory = PagedMemory::new();
    let mtr = Mtr::new(0x10_0000, 12, 12, &[region(1, 0), region(1, 1)]).unwrap();
    let expected = MttError::MixedDirect {
        direct_region: 0,
        region: 1,
        hop: 1,
    };
    assert_eq!(mtr.validate(), Err(expected.clone()));
    assert_eq!(translate(&memory, &mtr, 0), Err(expected));
}

#[test]
fn misaligned_roots_and_pages_are_rejected() {
    let memory = PagedMemory::new();
    let hop1 = Mtr::single(0x1004, 12, 12, 1, 1);
    assert_eq!(
        translate(&memory, &hop1, 0),
        Err(MttError::MisalignedRoot {
            root: 0x1004,
            alignment: 8,
            mode: "root BT page"
        })
    );
    let direct = Mtr::single(0x1008, 12, 12, 1, 0);
    assert_eq!(
        direct.validate(),
        Err(MttError::MisalignedRoot {
            root: 0x1008,
            alignment: 4096,
            mode: "direct mode"
        })
    );
    assert_eq!(
        translate(&memory, &Mtr::single(0x2000, 12, 16, 1, 0), 0x1_0000 - 1),
        Ok(0x1_1FFF)
    );

    let (memory, mtr) = small_hop2();
    memory.write_u64(0x2_0008, 0x20_0800).unwrap();
    let err = translate(&memory, &mtr, 4096).unwrap_err();
    assert!(
        matches!(
            err,
            MttError::MisalignedPage {
                level: 1,
                index: 1,
                page: 1,
                value: 0x20_0800,
                ..
            }
        ),
        "{err:?}"
    );
    memory.write_u64(0x1_0000, 0x2_0004).unwrap();
    let err = translate(&memory, &mtr, 0).unwrap_err();
    assert!(
        matches!(
            err,
            MttError::MisalignedBtPage {
                level: 0,
                value: 0x2_0004,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn malformed_mtrs_fail_validation() {
    assert_eq!(
        Mtr::single(0x1000, 12, 11, 1, 1).validate(),
        Err(MttError::BufferPageShift { shift: 11 })
    );
    assert_eq!(
        Mtr::single(0x1000, 12, 31, 1, 1).validate(),
        Err(MttError::BufferPageShift { shift: 31 })
    );
    assert_eq!(
        Mtr::single(0x1000, 22, 12, 1, 1).validate(),
        Err(MttError::BtPageShift { shift: 22 })
    );
    assert_eq!(
        Mtr::single(0x1000, 12, 12, 1, 4).validate(),
        Err(MttError::HopOutOfRange { region: 0, hop: 4 })
    );
    assert_eq!(
        Mtr::single(0x1000, 12, 12, 513, 1).validate(),
        Err(MttError::RootOverflow {
            entries: 513,
            unit: 512,
            bt_page_size: 4096
        })
    );
    assert!(Mtr::single(0x1000, 12, 12, 512 * 512, 2).validate().is_ok());
    assert_eq!(Mtr::single(0, 12, 12, 1, 1).validate(), Err(MttError::NullRoot));
    assert!(matches!(
        Mtr::single(u64::MAX - 0xFFF, 12, 12, 2, 0).validate(),
        Err(MttError::BufferTooLarge { .. })
    ));
    assert!(matches!(
        Mtr::new(0x1000, 12, 12, &[]),
        Err(MttError::RegionCount { count: 0 })
    ));
    let mut four = Mtr::single(0x1000, 12, 12, 1, 1);
    four.region_count = 4;
    assert_eq!(four.validate(), Err(MttError::RegionCount { count: 4 }));
}

#[test]
fn large_pages_up_to_1_gib_translate() {
    let mut space = TestSpace::new((MIB) as usize);
    let mut rng = XorShift64::new(5);
    for shift in [21u32, 25, 30] {
        space.reset();
        let page_size = 1u64 << shift;
        let pages = place_pages(&mut space, &mut rng, 3, page_size);
        let regions = [region(3, 1)];
        let built = build_into(&mut space, &mut rng, 12, shift, &regions, &pages).unwrap();
        let mtr = Mtr::new(built.root, 12, shift, &regions).unwrap();
        let offset = 2 * page_size + page_size / 3;
        assert_eq!(
            translate(&space.memory, &mtr, offset).unwrap(),
            pages[2] + page_size / 3,
            "page shift {shift}"
        );
    }
    assert!(BT_WINDOW.1 <= DATA_WINDOW.0, "test windows must not overlap");
}

#[test]
fn a_cached_range_from_a_known_first_address_gives_the_walked_pieces() {
    // The first address comes from a translation, which validated the MTR; the range
    // then gives the same pieces as an uncached walk and still checks its bounds.
    let (memory, mtr) = small_hop2();
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    let first = cache.translate(&counting, &mtr, 0xFF0).unwrap();
    assert_eq!(
        counting.take(),
        3,
        "the first page is walked once, and the second page's entry read with it"
    );
    let mut cached = Vec::new();
    try_translate_range_cached(&counting, &mut cache, &mtr, 0xFF0, Some(first), 0x20, |a, l| {
        cached.push((a, l));
        Ok::<(), MttError>(())
    })
    .unwrap();
    let mut walked = Vec::new();
    translate_range(&memory, &mtr, 0xFF0, 0x20, |a, l| walked.push((a, l))).unwrap();
    assert_eq!(cached, walked);
    assert_eq!(counting.take(), 0, "the second page comes from the run the walk read");
    assert!(matches!(
        try_translate_range_cached(&counting, &mut cache, &mtr, 0x1FF0, Some(first), 0x20, |_, _| Ok::<
            (),
            MttError,
        >(
            ()
        )),
        Err(MttError::RangeOutOfRange { .. })
    ));
}

/// A hop-1 region of `pages` 4 KiB pages: one BT page at 0x1_0000 whose entry `n` maps
/// page `n` to 0x100_0000 + n × 4 KiB.
fn hop1_region(pages: u64) -> (PagedMemory, Mtr) {
    let memory = PagedMemory::new();
    let backing = crate::memory::Backing::zeroed(FRAME_SIZE as usize);
    memory.map_frame(0x1_0000, &backing, 0, true);
    for page in 0..pages {
        memory.write_u64(0x1_0000 + page * 8, 0x100_0000 + page * 4096).unwrap();
    }
    (memory, Mtr::single(0x1_0000, 12, 12, pages, 1))
}

#[test]
fn a_stream_leaving_the_run_reads_the_next_run_even_past_a_remembered_page() {
    // Hop 1, 64 pages. Page 16 is remembered (walked), then a walk of page 0 reads the
    // run 0..16; the stream's next page, 16, is walked again, so that its followers come
    // from a fresh run rather than from the page table one by one.
    let (memory, mtr) = hop1_region(64);
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    let page = |n: u64| Ok(0x100_0000 + n * 4096);
    assert_eq!(cache.translate(&counting, &mtr, 16 * 4096), page(16));
    assert_eq!(cache.translate(&counting, &mtr, 0), page(0));
    assert_eq!(counting.take(), 4, "two walks, each with its run");
    assert_eq!(cache.translate(&counting, &mtr, 15 * 4096), page(15));
    assert_eq!(counting.take(), 0, "page 15 is in page 0's run");
    assert_eq!(cache.translate(&counting, &mtr, 16 * 4096), page(16));
    assert_eq!(counting.take(), 2, "the stream walks on past the remembered page 16");
    assert_eq!(cache.translate(&counting, &mtr, 17 * 4096), page(17));
    assert_eq!(counting.take(), 0, "and page 17 comes from the run that walk read");
    // Away from the run, a remembered page is answered from the table, and the run is
    // read again from its entry: the stream that came back goes on from the run.
    assert_eq!(cache.translate(&counting, &mtr, 0), page(0));
    assert_eq!(counting.take(), 1);
    assert_eq!(cache.translate(&counting, &mtr, 1 << 12), page(1));
    assert_eq!(counting.take(), 0);
}

#[test]
fn a_stream_through_a_region_walks_once_per_run_of_bottom_entries() {
    // Hop 1, 64 pages: a walk reads its entry and the next LEAF_RUN - 1 of the region in
    // one read, and the pages they map need no walk.
    let pages = 64u64;
    let (memory, mtr) = hop1_region(pages);
    // A hole the walk refuses: the run does not paper over it.
    memory.write_u64(0x1_0000 + 40 * 8, 0).unwrap();
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    for page in 0..pages {
        let offset = page * 4096 + 7;
        assert_eq!(
            cache.translate(&counting, &mtr, offset),
            translate(&memory, &mtr, offset)
        );
    }
    // Walks, each with its run read, at pages 0, 16, 32 and 48; the hole at page 40 is
    // walked (and refused) on its own, and page 41 still comes from page 32's run.
    assert_eq!(counting.take(), 2 + 2 + 2 + 1 + 2);
    assert_eq!(cache.len(), 4, "only walked pages are remembered, not the run's");
    // A remembered page comes back from the memo after the run moved on, and the run is
    // read again from its entry (one read, no walk): the pages after it come from the run.
    assert_eq!(cache.translate(&counting, &mtr, 16 * 4096), Ok(0x100_0000 + 16 * 4096));
    assert_eq!(
        counting.take(),
        1,
        "page 16 was walked: the memo answers, the run is read"
    );
    assert_eq!(cache.translate(&counting, &mtr, 17 * 4096), Ok(0x100_0000 + 17 * 4096));
    assert_eq!(counting.take(), 0, "page 17 from the run read at page 16");
    // A page in neither the run nor the memo is walked again, with its run.
    assert_eq!(cache.translate(&counting, &mtr, 2 * 4096), Ok(0x100_0000 + 2 * 4096));
    assert_eq!(counting.take(), 2, "page 2 came from a run only: walked again");
    assert_eq!(cache.translate(&counting, &mtr, 3 * 4096), Ok(0x100_0000 + 3 * 4096));
    assert_eq!(counting.take(), 0, "and page 3 from the new run");
    assert!(cache.translate(&counting, &mtr, 40 * 4096).is_err());

    // The run answers with what it read until the owner clears it (page 17 is in the
    // run page 2's walk read), and is forgotten with the pages: a changed entry is seen
    // after a clear.
    memory.write_u64(0x1_0000 + 17 * 8, 0x700_0000).unwrap();
    assert_eq!(cache.translate(&memory, &mtr, 17 * 4096), Ok(0x100_0000 + 17 * 4096));
    cache.clear();
    assert!(cache.is_empty());
    assert_eq!(cache.translate(&memory, &mtr, 16 * 4096), Ok(0x100_0000 + 16 * 4096));
    assert_eq!(cache.translate(&memory, &mtr, 17 * 4096), Ok(0x700_0000));
}

#[test]
fn a_buffer_streamed_again_and_again_is_answered_from_its_runs_not_page_by_page_from_the_table() {
    // Hop 1, 64 pages, streamed from the first page to the last twenty times, as a buffer
    // sent again and again is. Each pass starts away from the run the last one left (at
    // page 48), at page 0, which the memo knows: the run is read from there, and each run
    // after it from the walk where the last one ends. So every pass reads four runs, and
    // the memo keeps the four pages those start at, not every page of the buffer.
    let (memory, mtr) = hop1_region(64);
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    for pass in 0..20 {
        for page in 0..64u64 {
            assert_eq!(
                cache.translate(&counting, &mtr, page * 4096),
                Ok(0x100_0000 + page * 4096)
            );
        }
        let reads = counting.take();
        let expected = if pass == 0 { 4 * 2 } else { 1 + 3 * 2 };
        assert_eq!(
            reads, expected,
            "pass {pass}: the run read at page 0, walks at pages 16, 32, 48"
        );
        assert_eq!(
            cache.len(),
            4,
            "pass {pass}: only the pages runs start at are remembered"
        );
    }
}

#[test]
fn a_remembered_page_does_not_take_the_run_slot_from_another_buffer_it_shares_it_with() {
    // Two hop-1 regions whose MTRs hash to the same run slot, taking turns (two QPs'
    // buffers among many): a page the memo knows is answered from the table alone while
    // the other region holds the slot, so the two do not read their runs in turn on every
    // access; a page the memo does not know is walked and takes the slot, as before.
    let (memory, first) = hop1_region(32);
    let slot = PageKey::new(&first, 0).run_slot();
    let second = (1..1u64 << 20)
        .map(|i| Mtr::single(0x1_0000 + i * FRAME_SIZE, 12, 12, 32, 1))
        .find(|mtr| PageKey::new(mtr, 0).run_slot() == slot)
        .expect("some root in a million shares the slot");
    let backing = crate::memory::Backing::zeroed(FRAME_SIZE as usize);
    memory.map_frame(second.root, &backing, 0, true);
    for page in 0..32 {
        memory
            .write_u64(second.root + page * 8, 0x200_0000 + page * 4096)
            .unwrap();
    }
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    assert_eq!(cache.translate(&counting, &first, 0), Ok(0x100_0000));
    assert_eq!(cache.translate(&counting, &second, 0), Ok(0x200_0000));
    assert_eq!(
        counting.take(),
        4,
        "two walks, each with its run; the second took the slot"
    );
    for _ in 0..3 {
        assert_eq!(cache.translate(&counting, &first, 0), Ok(0x100_0000));
        assert_eq!(cache.translate(&counting, &second, 4096), Ok(0x200_0000 + 4096));
    }
    assert_eq!(counting.take(), 0, "the table answers the first, the run the second");
    assert_eq!(cache.translate(&counting, &first, 4096), Ok(0x100_0000 + 4096));
    assert_eq!(
        counting.take(),
        2,
        "a page the memo does not know is walked, with its run"
    );
    assert_eq!(cache.translate(&counting, &first, 2 * 4096), Ok(0x100_0000 + 2 * 4096));
    assert_eq!(counting.take(), 0, "and the first holds the slot now");
}

#[test]
fn streams_through_many_regions_taking_turns_each_keep_their_own_run() {
    // 64 regions of 16 pages each (a QP's buffer each), translated page after page with
    // the regions in turn, as the model sends a packet of each QP in turn: each region is
    // walked once, for its first page, and the rest of its pages come from its own run.
    let memory = PagedMemory::new();
    let backing = crate::memory::Backing::zeroed(64 * FRAME_SIZE as usize);
    let (regions, pages) = (64u64, 16u64);
    let bus = |region: u64, page: u64| 0x1000_0000 + (region * pages + page) * 4096;
    let mut mtrs = Vec::new();
    for region in 0..regions {
        let table = 0x1_0000 + region * FRAME_SIZE;
        memory.map_frame(table, &backing, region as usize, true);
        for page in 0..pages {
            memory.write_u64(table + page * 8, bus(region, page)).unwrap();
        }
        mtrs.push(Mtr::single(table, 12, 12, pages, 1));
    }
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    for page in 0..pages {
        for (region, mtr) in mtrs.iter().enumerate() {
            let offset = page * 4096 + 5;
            assert_eq!(
                cache.translate(&counting, mtr, offset),
                Ok(bus(region as u64, page) + 5)
            );
        }
    }
    // A walk reads its entry, then the run: two reads per region, however slots are
    // shared (regions whose MTRs hash alike take the slot in turn and walk again).
    let reads = counting.take() as u64;
    assert!(reads >= 2 * regions && reads <= 2 * regions + 16, "{reads} BT reads");
    assert_eq!(cache.len(), reads as usize / 2, "one page remembered per walk");

    // Every run is forgotten with the pages.
    cache.clear();
    assert_eq!(cache.translate(&counting, &mtrs[3], 4096), Ok(bus(3, 1)));
    assert_eq!(counting.take(), 2, "walked again after a clear, with a fresh run");
}

#[test]
fn a_copied_cache_answers_the_same_and_walks_again_only_where_a_run_answered() {
    // Hop 1, 32 pages: a walk of page 0 reads the run 0..16 and remembers page 0 only.
    let (memory, mtr) = hop1_region(32);
    let counting = CountingMemory::new(&memory);
    let mut cache = TranslationCache::default();
    assert_eq!(cache.translate(&counting, &mtr, 0), Ok(0x100_0000));
    assert_eq!(counting.take(), 2);
    let mut copy = cache.clone();
    assert_eq!(copy.len(), 1);
    assert_eq!(copy.translate(&counting, &mtr, 5 * 4096), Ok(0x100_0000 + 5 * 4096));
    assert_eq!(
        counting.take(),
        2,
        "the run is not copied: the copy walks page 5, with a run"
    );
    assert_eq!(copy.translate(&counting, &mtr, 0), Ok(0x100_0000));
    assert_eq!(
        counting.take(),
        1,
        "the remembered page is: no walk, its run read again"
    );
    assert_eq!(cache.translate(&counting, &mtr, 5 * 4096), Ok(0x100_0000 + 5 * 4096));
    assert_eq!(counting.take(), 0, "the original still has its run");
}
