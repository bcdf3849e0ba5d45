//! Driver side of memory translate regions (hns "MTR"): builds the base-address-table
//! (BT) pages that the device's MTT walker reads, and mirrors the device's context-table
//! (HEM) arithmetic so the driver can lay out context tables itself.
//!
//! The arithmetic shared with the device lives in [`rnic_firmware_if::mtr`]; this module
//! only decides *where* things go:
//!
//! * Direct mode (every region hop 0): no BT pages; the root is the first page and the
//!   pages must be physically contiguous.
//! * Otherwise one root BT page holds the root entries of all regions, packed back to back
//!   in region order; a hop-`h` region adds `h − 1` levels of lower BT pages under its root
//!   entries. Entry `q` of a region is reached through root entry
//!   `root_base(r) + q / unit^(h−1)`, then `(q / unit^(h−2)) % unit`, …, `q % unit`.
//!
//! The builder does not touch memory: it returns the BT pages with their entries and the
//! caller writes each page's entries as little-endian u64s at the page's address (the
//! rest of each page is never read by the device and may hold anything, zero preferred).
//!
//! This file depends only on `rnic-firmware-if`, `thiserror` and `std`, so device-side
//! tests can compile it directly and check the walker against the real builder.

use rnic_firmware_if::mtr::{MtrRegion, BT_ENTRY_SIZE, MAX_HOP, MIN_PAGE_SHIFT};
pub use rnic_firmware_if::mtr::{MAX_BT_PAGE_SHIFT, MAX_BUFFER_PAGE_SHIFT, MAX_REGIONS};
/// Alignment the device requires of the root address in direct (hop 0) mode.
pub const DIRECT_ROOT_ALIGNMENT: u64 = 1 << MIN_PAGE_SHIFT;

/// Why an MTR could not be built. Every variant names the offending value and what was
/// expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MtrBuildError {
    /// The BT page shift is outside 12..=21.
    #[error("BT page shift {shift} is out of range: expected 12..=21 (4 KiB..2 MiB BT pages)")]
    BtPageShift {
        /// The rejected shift.
        shift: u32,
    },
    /// The buffer page shift is outside 12..=30.
    #[error("buffer page shift {shift} is out of range: expected 12..=30 (4 KiB..1 GiB pages)")]
    BufferPageShift {
        /// The rejected shift.
        shift: u32,
    },
    /// No regions, or more than three.
    #[error("{count} regions given: an MTR has 1..=3 regions")]
    RegionCount {
        /// Number of regions given.
        count: usize,
    },
    /// A region's hop number is above 3.
    #[error("region {region} has hop number {hop}: expected 0..=3")]
    Hop {
        /// Region index.
        region: usize,
        /// The rejected hop number.
        hop: u8,
    },
    /// Some regions are hop 0 and others are not.
    #[error(
        "region {direct_region} is hop 0 but region {region} is hop {hop}: hop 0 (direct \
         mode) is allowed only when every region is hop 0"
    )]
    MixedDirect {
        /// A hop-0 region.
        direct_region: usize,
        /// A region with hops.
        region: usize,
        /// Its hop number.
        hop: u8,
    },
    /// The region page counts do not add up to the number of pages given.
    #[error("the regions describe {regions_total} pages but {pages} page addresses were given")]
    PageCountMismatch {
        /// Sum of the regions' page counts (saturating).
        regions_total: u64,
        /// Length of the page list.
        pages: usize,
    },
    /// The buffer has no pages at all.
    #[error("the buffer has no pages")]
    EmptyBuffer,
    /// The root entries of all regions do not fit in one BT page.
    #[error(
        "the root BT needs {entries} entries but one {bt_page_size}-byte BT page holds only \
         {unit}: use more hops or larger BT pages"
    )]
    RootOverflow {
        /// Root entries needed (saturating).
        entries: u64,
        /// Entries per BT page.
        unit: u64,
        /// BT page size in bytes.
        bt_page_size: u64,
    },
    /// Direct mode: the pages are not physically contiguous.
    #[error(
        "direct (hop 0) mode needs a contiguous buffer: page {page} is at {found:#x}, \
         expected {expected:#x}"
    )]
    NotContiguous {
        /// Index of the first out-of-place page.
        page: usize,
        /// Where it would have to be.
        expected: u64,
        /// Where it is.
        found: u64,
    },
    /// Direct mode: the first page is not 4 KiB aligned.
    #[error("direct (hop 0) mode: first page {address:#x} is not aligned to 4096 bytes")]
    MisalignedRoot {
        /// The first page's address.
        address: u64,
    },
    /// A page is not aligned to the buffer page size.
    #[error("page {page} at {address:#x} is not aligned to the {page_size}-byte buffer page size")]
    MisalignedPage {
        /// Page index in the buffer.
        page: usize,
        /// Its bus address.
        address: u64,
        /// The buffer page size.
        page_size: u64,
    },
    /// A page has bus address 0, which the device reads as an empty BT entry.
    #[error("page {page} has bus address 0, which the device would read as an empty BT entry")]
    NullPage {
        /// Page index in the buffer.
        page: usize,
    },
    /// The BT page allocator returned an address the device cannot use.
    #[error(
        "BT page allocator returned {address:#x}: a BT page address must be non-zero and \
         8-byte aligned"
    )]
    BadBtPage {
        /// The returned address.
        address: u64,
    },
    /// The BT page allocator failed.
    #[error("cannot allocate a BT page: {reason}")]
    BtAllocation {
        /// The allocator's explanation.
        reason: String,
    },
}

/// What to build: one buffer of `pages.len()` pages split into regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtrBuildRequest<'a> {
    /// BT page shift (BT page = `1 << ba_page_shift` bytes).
    pub ba_page_shift: u32,
    /// Buffer page shift (page = `1 << buffer_page_shift` bytes).
    pub buffer_page_shift: u32,
    /// The regions in buffer order (1..=3).
    pub regions: &'a [MtrRegion],
    /// The bus address of every buffer page, regions concatenated in order.
    pub pages: &'a [u64],
}

/// One BT page to write into host memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BtPage {
    /// Bus address of the page.
    pub address: u64,
    /// Entries from the start of the page (at most one page's worth); the device never
    /// reads past them.
    pub entries: Vec<u64>,
}

impl BtPage {
    /// The entries as the little-endian bytes to write at [`BtPage::address`].
    pub fn to_bytes(&self) -> Vec<u8> {
        self.entries.iter().flat_map(|e| e.to_le_bytes()).collect()
    }
}

/// The result of [`build_mtr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltMtr {
    /// The address the context carries as the MTR root: the root BT page, or the first
    /// page in direct mode.
    pub root: u64,
    /// Every BT page to write, the root first (empty in direct mode).
    pub bt_pages: Vec<BtPage>,
}

/// Builds the BT pages of one MTR, calling `allocate_bt_page` once per BT page needed
/// (root first). Nothing is written: the caller writes [`BuiltMtr::bt_pages`].
///
/// Validates what the device's walker validates: page shifts, 1..=3 regions with hop
/// 0..=3, hop 0 only for all regions, root entries within one BT page, page alignment
/// (direct mode: contiguity and a 4 KiB-aligned start).
pub fn build_mtr(
    request: &MtrBuildRequest<'_>,
    allocate_bt_page: &mut dyn FnMut() -> Result<u64, MtrBuildError>,
) -> Result<BuiltMtr, MtrBuildError> {
    let direct = validate_request(request)?;
    let page_size = 1u64 << request.buffer_page_shift;
    let pages = request.pages;

    if direct {
        let root = pages[0];
        if !is_aligned(root, DIRECT_ROOT_ALIGNMENT) {
            return Err(MtrBuildError::MisalignedRoot { address: root });
        }
        for (page, &found) in pages.iter().enumerate() {
            let expected = (page as u64).checked_mul(page_size).and_then(|o| root.checked_add(o));
            if expected != Some(found) {
                return Err(MtrBuildError::NotContiguous {
                    page,
                    expected: expected.unwrap_or(u64::MAX),
                    found,
                });
            }
        }
        return Ok(BuiltMtr {
            root,
            bt_pages: Vec::new(),
        });
    }

    for (page, &address) in pages.iter().enumerate() {
        if address == 0 {
            return Err(MtrBuildError::NullPage { page });
        }
        if !is_aligned(address, page_size) {
            return Err(MtrBuildError::MisalignedPage {
                page,
                address,
                page_size,
            });
        }
    }

    let unit = 1usize << (request.ba_page_shift - 3);
    let mut allocate = || -> Result<u64, MtrBuildError> {
        let address = allocate_bt_page()?;
        if address == 0 || !is_aligned(address, BT_ENTRY_SIZE) {
            return Err(MtrBuildError::BadBtPage { address });
        }
        Ok(address)
    };

    let root = allocate()?;
    let mut bt_pages = vec![BtPage {
        address: root,
        entries: Vec::new(),
    }];
    let mut root_entries = Vec::new();
    let mut start = 0usize;
    for region in request.regions {
        // validate_request checked that the counts add up to pages.len().
        let count = region.page_count as usize;
        let mut level: Vec<u64> = pages[start..start + count].to_vec();
        start += count;
        // Group bottom-up: each BT page holds `unit` addresses of the level below.
        for _ in 1..region.hop {
            let mut upper = Vec::with_capacity(level.len().div_ceil(unit));
            for chunk in level.chunks(unit) {
                let address = allocate()?;
                bt_pages.push(BtPage {
                    address,
                    entries: chunk.to_vec(),
                });
                upper.push(address);
            }
            level = upper;
        }
        root_entries.extend(level);
    }
    debug_assert!(root_entries.len() <= unit);
    bt_pages[0].entries = root_entries;
    Ok(BuiltMtr { root, bt_pages })
}

/// Checks everything about a request except page placement; returns whether it is
/// direct mode.
fn validate_request(request: &MtrBuildRequest<'_>) -> Result<bool, MtrBuildError> {
    let (ba_shift, buf_shift) = (request.ba_page_shift, request.buffer_page_shift);
    if !(MIN_PAGE_SHIFT..=MAX_BT_PAGE_SHIFT).contains(&ba_shift) {
        return Err(MtrBuildError::BtPageShift { shift: ba_shift });
    }
    if !(MIN_PAGE_SHIFT..=MAX_BUFFER_PAGE_SHIFT).contains(&buf_shift) {
        return Err(MtrBuildError::BufferPageShift { shift: buf_shift });
    }
    let regions = request.regions;
    if regions.is_empty() || regions.len() > MAX_REGIONS {
        return Err(MtrBuildError::RegionCount { count: regions.len() });
    }
    for (region, r) in regions.iter().enumerate() {
        if r.hop > MAX_HOP {
            return Err(MtrBuildError::Hop { region, hop: r.hop });
        }
    }
    let direct_region = regions.iter().position(|r| r.hop == 0);
    let hop_region = regions.iter().position(|r| r.hop != 0);
    if let (Some(direct_region), Some(region)) = (direct_region, hop_region) {
        return Err(MtrBuildError::MixedDirect {
            direct_region,
            region,
            hop: regions[region].hop,
        });
    }
    let regions_total = regions.iter().fold(0u64, |sum, r| sum.saturating_add(r.page_count));
    if regions_total != request.pages.len() as u64 {
        return Err(MtrBuildError::PageCountMismatch {
            regions_total,
            pages: request.pages.len(),
        });
    }
    if request.pages.is_empty() {
        return Err(MtrBuildError::EmptyBuffer);
    }
    let direct = direct_region.is_some();
    if !direct {
        let bt_page_size = 1u64 << ba_shift;
        let unit = bt_page_size / BT_ENTRY_SIZE;
        let entries = regions
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.root_entries(unit)));
        if entries > unit {
            return Err(MtrBuildError::RootOverflow {
                entries,
                unit,
                bt_page_size,
            });
        }
    }
    Ok(direct)
}

/// The smallest hop number (1..=3) whose root fits `page_count` pages in one BT page of
/// `unit` entries: 1 if `page_count ≤ unit`, 2 if `≤ unit²`, else 3.
pub fn choose_hop(page_count: u64, unit: u64) -> u8 {
    if page_count <= unit {
        1
    } else if page_count <= unit.saturating_mul(unit) {
        2
    } else {
        3
    }
}

/// Where object `index` of a context table lives, computed as the device does (hns
/// §4.2): returns `(l0, entries, offset_in_chunk)`.
///
/// With `chunk_objects = (1 << buffer_page_shift) / object_size`, chunk
/// `t = index / chunk_objects` and `n = (1 << ba_page_shift) / 8` BT entries per page:
/// `l0 = t / n^hop` is the L0 slot; `entries[k]` (for `k < hop`) is the entry index in the
/// level-`k` BT page (level 0 = the page the L0 slot points to), i.e.
/// `(t / n^(hop−1−k)) % n`; unused entries are 0. `offset_in_chunk` is
/// `(index % chunk_objects) × object_size`. With hop 0 the L0 slot holds the chunk itself.
///
/// `object_size` must be non-zero and at most one buffer chunk; `hop` is clamped to 3.
pub fn context_table_location(
    index: u64,
    object_size: u64,
    buffer_page_shift: u32,
    ba_page_shift: u32,
    hop: u8,
) -> (u64, [u64; 3], u64) {
    let chunk_objects = ((1u64 << buffer_page_shift) / object_size.max(1)).max(1);
    let t = index / chunk_objects;
    let offset_in_chunk = (index % chunk_objects) * object_size;
    let n = (1u64 << ba_page_shift) / BT_ENTRY_SIZE;
    let hop = u32::from(hop.min(MAX_HOP));
    let mut entries = [0u64; 3];
    for (k, entry) in entries.iter_mut().enumerate().take(hop as usize) {
        let covered = n.saturating_pow(hop - 1 - k as u32);
        *entry = (t / covered) % n;
    }
    let l0 = t / n.saturating_pow(hop);
    (l0, entries, offset_in_chunk)
}

/// Whether `value` is a multiple of the power of two `alignment`.
const fn is_aligned(value: u64, alignment: u64) -> bool {
    value & (alignment - 1) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bump(next: &mut u64, step: u64) -> impl FnMut() -> Result<u64, MtrBuildError> + '_ {
        move || {
            let a = *next;
            *next += step;
            Ok(a)
        }
    }

    #[test]
    fn hop_choice_grows_with_the_page_count() {
        assert_eq!(choose_hop(0, 512), 1);
        assert_eq!(choose_hop(512, 512), 1);
        assert_eq!(choose_hop(513, 512), 2);
        assert_eq!(choose_hop(512 * 512, 512), 2);
        assert_eq!(choose_hop(512 * 512 + 1, 512), 3);
    }

    #[test]
    fn direct_mode_needs_contiguous_pages_and_allocates_nothing() {
        let regions = [MtrRegion { page_count: 3, hop: 0 }];
        let pages = [0x10_0000, 0x10_1000, 0x10_2000];
        let request = MtrBuildRequest {
            ba_page_shift: 12,
            buffer_page_shift: 12,
            regions: &regions,
            pages: &pages,
        };
        let mut never = || -> Result<u64, MtrBuildError> { panic!("no BT page in hop 0") };
        let built = build_mtr(&request, &mut never).unwrap();
        assert_eq!(built.root, 0x10_0000);
        assert!(built.bt_pages.is_empty());

        let gap = [0x10_0000, 0x10_1000, 0x10_3000];
        let err = build_mtr(&MtrBuildRequest { pages: &gap, ..request }, &mut never).unwrap_err();
        assert_eq!(
            err,
            MtrBuildError::NotContiguous {
                page: 2,
                expected: 0x10_2000,
                found: 0x10_3000
            }
        );
    }

    #[test]
    fn regions_share_one_root_packed_in_order() {
        // unit = 512: a hop-2 region of 600 pages takes 2 root entries, then a hop-1
        // region of 3 pages takes 3 entries.
        let regions = [
            MtrRegion {
                page_count: 600,
                hop: 2,
            },
            MtrRegion { page_count: 3, hop: 1 },
        ];
        let pages: Vec<u64> = (1..=603).map(|i| i << 12).collect();
        let mut next = 0x8000_0000;
        let built = build_mtr(
            &MtrBuildRequest {
                ba_page_shift: 12,
                buffer_page_shift: 12,
                regions: &regions,
                pages: &pages,
            },
            &mut bump(&mut next, 0x1000),
        )
        .unwrap();
        assert_eq!(built.bt_pages.len(), 3);
        let root = &built.bt_pages[0];
        assert_eq!(root.address, built.root);
        assert_eq!(root.entries.len(), 5);
        assert_eq!(root.entries[2..], pages[600..]);
        let l1 = &built.bt_pages[2];
        assert_eq!(root.entries[1], l1.address);
        assert_eq!(l1.entries, pages[512..600]);
    }

    #[test]
    fn requests_the_device_would_reject_are_refused() {
        let pages: Vec<u64> = (1..=600).map(|i| i << 12).collect();
        let mut next = 0x8000_0000;
        let mut alloc = bump(&mut next, 0x1000);
        let build = |regions: &[MtrRegion], pages: &[u64], alloc: &mut dyn FnMut() -> Result<u64, MtrBuildError>| {
            build_mtr(
                &MtrBuildRequest {
                    ba_page_shift: 12,
                    buffer_page_shift: 12,
                    regions,
                    pages,
                },
                alloc,
            )
        };
        let one = |page_count, hop| MtrRegion { page_count, hop };
        assert!(matches!(
            build(&[one(600, 1)], &pages, &mut alloc),
            Err(MtrBuildError::RootOverflow { entries: 600, .. })
        ));
        assert!(matches!(
            build(&[one(1, 0), one(599, 1)], &pages, &mut alloc),
            Err(MtrBuildError::MixedDirect { .. })
        ));
        assert!(matches!(
            build(&[one(5, 1)], &pages, &mut alloc),
            Err(MtrBuildError::PageCountMismatch { .. })
        ));
        assert!(matches!(
            build(&[one(1, 1)], &[0x1800], &mut alloc),
            Err(MtrBuildError::MisalignedPage { page: 0, .. })
        ));
        assert!(matches!(
            build(&[one(1, 1)], &[0], &mut alloc),
            Err(MtrBuildError::NullPage { page: 0 })
        ));
        assert!(matches!(
            build(&[one(1, 4)], &[0x1000], &mut alloc),
            Err(MtrBuildError::Hop { region: 0, hop: 4 })
        ));
        assert!(matches!(
            build(&[], &[], &mut alloc),
            Err(MtrBuildError::RegionCount { count: 0 })
        ));
        let mut failing = || -> Result<u64, MtrBuildError> {
            Err(MtrBuildError::BtAllocation {
                reason: "pool empty".into(),
            })
        };
        assert!(matches!(
            build(&[one(1, 1)], &[0x1000], &mut failing),
            Err(MtrBuildError::BtAllocation { .. })
        ));
    }

    #[test]
    fn context_table_location_follows_the_hns_formulas() {
        // 512-byte QPC, 4 KiB chunks (8 per chunk), 4 KiB BT pages (n = 512).
        let (l0, e, off) = context_table_location(8 * 1000 + 3, 512, 12, 12, 1);
        assert_eq!((l0, e, off), (1, [1000 - 512, 0, 0], 3 * 512));
        let t = 3 * 512 * 512 + 7 * 512 + 9;
        let (l0, e, off) = context_table_location(t * 8, 512, 12, 12, 2);
        assert_eq!((l0, e, off), (3, [7, 9, 0], 0));
        let (l0, e, _) = context_table_location(t * 8, 512, 12, 12, 3);
        assert_eq!((l0, e), (0, [3, 7, 9]));
        let (l0, e, off) = context_table_location(21, 64, 12, 12, 0);
        assert_eq!((l0, e, off), (0, [0; 3], 21 * 64));
    }
}
