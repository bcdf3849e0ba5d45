//! The MTT walker: translates a byte offset inside a buffer described by a memory
//! translate region ("MTR", hns §5) into a bus address, by walking the buffer's
//! multi-hop base-address tables (BTs) in host memory.
//!
//! * An [`Mtr`] is what a context (QPC, CQC, SRQC, EQC, MPT) says about one buffer: the
//!   root address, the BT and buffer page sizes and up to three regions (SQ, extended
//!   SGEs, RQ for a QP; one region otherwise), each with its own hop number.
//! * A BT entry is the 8-byte little-endian full byte address of the next-level BT page,
//!   or of the data page at the bottom level; a zero entry is empty. Regions share one
//!   root BT page, packed back to back in region order.
//! * Direct mode (every region hop 0): the root is the first byte of a contiguous buffer
//!   and no BT is read. Mixing hop 0 with other hops is refused.
//!
//! Every BT read is a DMA read through [`HostMemory`]; data pages are never read here.
//! The walker is stateless: each translation reads `hop` BT entries. The device keeps a
//! [`TranslationCache`] in front of it, forgotten on every command and mailbox. Errors say
//! which level, entry and address failed and what was expected, so a driver developer can
//! find the bad BT page.
//!
//! Alignment rules: the root must be 8-byte aligned (contexts carry it `>> 3`), or 4 KiB
//! aligned in direct mode; lower-level BT page addresses must be 8-byte aligned; data
//! page addresses must be aligned to the buffer page size.

use rnic_firmware_if::mtr::{MtrRegion, BT_ENTRY_SIZE, MAX_HOP, MIN_PAGE_SHIFT};

use crate::bus::Bus;
use crate::fast_hash::{FastHashMap, FastHashSet, FIBONACCI_MULTIPLIER};
use crate::memory::{HostMemory, HostMemoryExt, MemoryError};

mod buffer;

pub use buffer::DmaFault;
pub(crate) use buffer::{read_buffer, write_buffer};

#[cfg(test)]
#[path = "../../../verbs-provider/src/mtr.rs"]
#[allow(dead_code)]
pub(crate) mod driver_builder;

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

pub use rnic_firmware_if::mtr::{MAX_BT_PAGE_SHIFT, MAX_BUFFER_PAGE_SHIFT, MAX_REGIONS};
/// Alignment of the root (first page) in direct mode.
pub const DIRECT_ROOT_ALIGNMENT: u64 = 1 << MIN_PAGE_SHIFT;

/// What a BT entry should have pointed to (for diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryTarget {
    /// A BT page of the given level (1 = the level below the root).
    BtPage {
        /// Level of the BT page.
        level: u8,
    },
    /// A data page of the buffer.
    BufferPage {
        /// Page index in the buffer.
        page: u64,
    },
}

impl std::fmt::Display for EntryTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryTarget::BtPage { level } => write!(f, "the level-{level} BT page"),
            EntryTarget::BufferPage { page } => write!(f, "buffer page {page}"),
        }
    }
}

/// Why an MTR is invalid or a translation failed. Levels count from 0 = the root BT page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MttError {
    /// The buffer page shift is outside 12..=30.
    #[error("MTR buffer page shift {shift} is out of range: expected 12..=30 (4 KiB..1 GiB)")]
    BufferPageShift {
        /// The rejected shift.
        shift: u32,
    },
    /// The BT page shift is outside 12..=21.
    #[error("MTR BT page shift {shift} is out of range: expected 12..=21 (4 KiB..2 MiB)")]
    BtPageShift {
        /// The rejected shift.
        shift: u32,
    },
    /// No regions, or more than three.
    #[error("MTR has {count} regions: expected 1..=3")]
    RegionCount {
        /// The rejected count.
        count: usize,
    },
    /// A region's hop number is above 3.
    #[error("MTR region {region} has hop number {hop}: expected 0..=3")]
    HopOutOfRange {
        /// Region index.
        region: usize,
        /// The rejected hop number.
        hop: u8,
    },
    /// Hop 0 mixed with other hop numbers.
    #[error(
        "MTR region {direct_region} is hop 0 but region {region} is hop {hop}: hop 0 (direct \
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
    /// The root entries of all regions do not fit in one BT page.
    #[error(
        "MTR root BT needs {entries} entries but one {bt_page_size}-byte BT page holds only \
         {unit}"
    )]
    RootOverflow {
        /// Root entries needed (saturating).
        entries: u64,
        /// Entries per BT page.
        unit: u64,
        /// BT page size in bytes.
        bt_page_size: u64,
    },
    /// The root address is zero.
    #[error("MTR root address is 0: the context carries no buffer address")]
    NullRoot,
    /// The root address is misaligned.
    #[error("MTR root {root:#x} is not aligned to {alignment} bytes ({mode})")]
    MisalignedRoot {
        /// The root address.
        root: u64,
        /// Required alignment.
        alignment: u64,
        /// "direct mode" or "root BT page".
        mode: &'static str,
    },
    /// The buffer size overflows 64 bits, or a direct-mode buffer wraps the address space.
    #[error("MTR buffer of {pages} pages of 2^{page_shift} bytes at {root:#x} does not fit the 64-bit address space")]
    BufferTooLarge {
        /// Total page count (saturating).
        pages: u64,
        /// Buffer page shift.
        page_shift: u32,
        /// The root address.
        root: u64,
    },
    /// The offset is beyond the regions.
    #[error("offset {offset:#x} is outside the {size:#x}-byte buffer")]
    OutOfRange {
        /// The requested offset.
        offset: u64,
        /// Buffer size in bytes (all regions).
        size: u64,
    },
    /// A range runs past the end of the regions.
    #[error("range of {length:#x} bytes at offset {offset:#x} runs past the end of the {size:#x}-byte buffer")]
    RangeOutOfRange {
        /// First byte of the range.
        offset: u64,
        /// Length of the range.
        length: u64,
        /// Buffer size in bytes.
        size: u64,
    },
    /// A BT entry could not be read by DMA.
    #[error("cannot read level-{level} BT entry {index} at {address:#x}: {source}")]
    BtUnreachable {
        /// BT level (0 = root).
        level: u8,
        /// Entry index in that BT page.
        index: u64,
        /// Bus address of the entry.
        address: u64,
        /// The DMA failure.
        #[source]
        source: MemoryError,
    },
    /// A BT entry on the walk is zero.
    #[error("level-{level} BT entry {index} at {address:#x} is zero: expected the address of {expected}")]
    EmptyEntry {
        /// BT level (0 = root).
        level: u8,
        /// Entry index in that BT page.
        index: u64,
        /// Bus address of the entry.
        address: u64,
        /// What it should point to.
        expected: EntryTarget,
    },
    /// A BT entry points to a BT page at a misaligned address.
    #[error(
        "level-{level} BT entry {index} at {address:#x} holds {value:#x} for {expected}, which \
         is not 8-byte aligned"
    )]
    MisalignedBtPage {
        /// BT level of the entry (0 = root).
        level: u8,
        /// Entry index in that BT page.
        index: u64,
        /// Bus address of the entry.
        address: u64,
        /// The entry's value.
        value: u64,
        /// What it should point to.
        expected: EntryTarget,
    },
    /// A bottom-level entry holds a data page address not aligned to the page size.
    #[error(
        "level-{level} BT entry {index} at {address:#x} maps buffer page {page} to {value:#x}, \
         which is not aligned to the {page_size}-byte buffer page size"
    )]
    MisalignedPage {
        /// BT level of the entry (0 = root).
        level: u8,
        /// Entry index in that BT page.
        index: u64,
        /// Bus address of the entry.
        address: u64,
        /// Buffer page being translated.
        page: u64,
        /// The entry's value.
        value: u64,
        /// Buffer page size in bytes.
        page_size: u64,
    },
}

/// One buffer as a context describes it: where its translation starts and how it is cut
/// into regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mtr {
    /// Root BT page address, or the first byte of the buffer in direct (hop 0) mode.
    pub root: u64,
    /// BT page shift (BT page = `1 << ba_page_shift` bytes).
    pub ba_page_shift: u32,
    /// Buffer page shift (page = `1 << buffer_page_shift` bytes).
    pub buffer_page_shift: u32,
    /// The regions in buffer order; only the first `region_count` are used.
    pub regions: [MtrRegion; MAX_REGIONS],
    /// Number of regions in use (1..=3).
    pub region_count: usize,
}

const NO_REGION: MtrRegion = MtrRegion { page_count: 0, hop: 0 };

impl Mtr {
    /// An MTR with the given regions (1..=3; not otherwise validated: see
    /// [`Mtr::validate`]).
    pub fn new(root: u64, ba_page_shift: u32, buffer_page_shift: u32, regions: &[MtrRegion]) -> Result<Self, MttError> {
        if regions.is_empty() || regions.len() > MAX_REGIONS {
            return Err(MttError::RegionCount { count: regions.len() });
        }
        let mut all = [NO_REGION; MAX_REGIONS];
        all[..regions.len()].copy_from_slice(regions);
        Ok(Self {
            root,
            ba_page_shift,
            buffer_page_shift,
            regions: all,
            region_count: regions.len(),
        })
    }

    /// An MTR of one region (CQ, EQ, SRQ, MR).
    pub fn single(root: u64, ba_page_shift: u32, buffer_page_shift: u32, page_count: u64, hop: u8) -> Self {
        let mut regions = [NO_REGION; MAX_REGIONS];
        regions[0] = MtrRegion { page_count, hop };
        Self {
            root,
            ba_page_shift,
            buffer_page_shift,
            regions,
            region_count: 1,
        }
    }

    /// The regions in use (at most three, even if `region_count` is larger).
    pub fn regions(&self) -> &[MtrRegion] {
        &self.regions[..self.region_count.min(MAX_REGIONS)]
    }

    /// BT entries per BT page.
    pub fn unit(&self) -> u64 {
        (1u64 << self.ba_page_shift.min(63)) / BT_ENTRY_SIZE
    }

    /// Buffer page size in bytes.
    pub fn page_size(&self) -> u64 {
        1u64 << self.buffer_page_shift.min(63)
    }

    /// Total pages of all regions (saturating).
    pub fn page_count(&self) -> u64 {
        self.regions()
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.page_count))
    }

    /// Buffer size in bytes (saturating; exact for a valid MTR).
    pub fn size(&self) -> u64 {
        self.page_count().saturating_mul(self.page_size())
    }

    /// Whether this is direct mode (every region hop 0).
    pub fn is_direct(&self) -> bool {
        self.regions().iter().all(|r| r.hop == 0)
    }

    /// Checks the MTR is one the walker can use: page shifts (buffer 12..=30, BT
    /// 12..=21), 1..=3 regions of hop 0..=3, hop 0 only for every region, root entries
    /// within one BT page, a non-zero root aligned to 8 (or to 4 KiB in direct mode), and
    /// a size that fits 64 bits.
    pub fn validate(&self) -> Result<(), MttError> {
        if !(MIN_PAGE_SHIFT..=MAX_BUFFER_PAGE_SHIFT).contains(&self.buffer_page_shift) {
            return Err(MttError::BufferPageShift {
                shift: self.buffer_page_shift,
            });
        }
        if !(MIN_PAGE_SHIFT..=MAX_BT_PAGE_SHIFT).contains(&self.ba_page_shift) {
            return Err(MttError::BtPageShift {
                shift: self.ba_page_shift,
            });
        }
        if self.region_count == 0 || self.region_count > MAX_REGIONS {
            return Err(MttError::RegionCount {
                count: self.region_count,
            });
        }
        let regions = self.regions();
        for (region, r) in regions.iter().enumerate() {
            if r.hop > MAX_HOP {
                return Err(MttError::HopOutOfRange { region, hop: r.hop });
            }
        }
        let direct_region = regions.iter().position(|r| r.hop == 0);
        let hop_region = regions.iter().position(|r| r.hop != 0);
        if let (Some(direct_region), Some(region)) = (direct_region, hop_region) {
            return Err(MttError::MixedDirect {
                direct_region,
                region,
                hop: regions[region].hop,
            });
        }
        let direct = direct_region.is_some();
        if !direct {
            let unit = self.unit();
            let entries = regions
                .iter()
                .fold(0u64, |sum, r| sum.saturating_add(r.root_entries(unit)));
            if entries > unit {
                return Err(MttError::RootOverflow {
                    entries,
                    unit,
                    bt_page_size: 1 << self.ba_page_shift,
                });
            }
        }
        if self.root == 0 {
            return Err(MttError::NullRoot);
        }
        let (alignment, mode) = if direct {
            (DIRECT_ROOT_ALIGNMENT, "direct mode")
        } else {
            (BT_ENTRY_SIZE, "root BT page")
        };
        if !is_aligned(self.root, alignment) {
            return Err(MttError::MisalignedRoot {
                root: self.root,
                alignment,
                mode,
            });
        }
        let pages = self.page_count();
        let fits = match pages.checked_mul(self.page_size()) {
            Some(size) => !direct || self.root.checked_add(size).is_some(),
            None => false,
        };
        if !fits {
            return Err(MttError::BufferTooLarge {
                pages,
                page_shift: self.buffer_page_shift,
                root: self.root,
            });
        }
        Ok(())
    }
}

/// Translates byte `offset` of the buffer described by `mtr` into a bus address (hns
/// §5.2): finds the region holding page `p = offset >> buffer_page_shift`, walks from
/// root entry `root_base(r) + q / unit^(h−1)` down the region's `h` levels (one 8-byte
/// DMA read each) and adds the offset inside the page. Validates `mtr` first.
pub fn translate(memory: &dyn HostMemory, mtr: &Mtr, offset: u64) -> Result<u64, MttError> {
    mtr.validate()?;
    translate_valid(memory, mtr, offset)
}

/// Translates `length` bytes starting at byte `offset`, calling `f(bus_address,
/// chunk_length)` for each piece, split at buffer page boundaries, in order.
///
/// The whole range is checked against the buffer size before `f` is first called; a
/// BT walk failure part-way stops the walk after the pieces already delivered (as a DMA
/// engine would stop mid-transfer).
pub fn translate_range(
    memory: &dyn HostMemory,
    mtr: &Mtr,
    offset: u64,
    length: u64,
    mut f: impl FnMut(u64, u64),
) -> Result<(), MttError> {
    try_translate_range(memory, mtr, offset, length, |address, chunk| {
        f(address, chunk);
        Ok::<(), MttError>(())
    })
}

/// [`translate_range`] with a fallible callback: an error from `f` stops the walk and is
/// returned (for DMA engines whose per-piece access can fail).
pub fn try_translate_range<E: From<MttError>>(
    memory: &dyn HostMemory,
    mtr: &Mtr,
    offset: u64,
    length: u64,
    f: impl FnMut(u64, u64) -> Result<(), E>,
) -> Result<(), E> {
    try_translate_range_from(memory, mtr, offset, None, length, f)
}

/// [`try_translate_range`] when the bus address of `offset` is already known (`first_bus`,
/// from an earlier [`translate`] of the same `mtr` and `offset`): the first piece uses it
/// instead of walking the BT entries again. With `None` it is `try_translate_range`.
pub fn try_translate_range_from<E: From<MttError>>(
    memory: &dyn HostMemory,
    mtr: &Mtr,
    offset: u64,
    first_bus: Option<u64>,
    length: u64,
    f: impl FnMut(u64, u64) -> Result<(), E>,
) -> Result<(), E> {
    mtr.validate()?;
    translate_pieces(mtr, offset, first_bus, length, |o| translate_valid(memory, mtr, o), f)
}

/// Most pages a [`TranslationCache`] remembers: every buffer page of 1 024 QPs with a
/// 64 KiB buffer each and their queues (≈ 20 000 per NIC), at ≈ 80 bytes a page; with
/// only walked pages remembered, a stream needs one per 16 pages. The memo is the
/// emulator's, not the modelled MTT cache (`timing::lru` charges that one's misses on its
/// own, `TimingParams::mtt_cache_entries`), so its size changes no virtual result; at 512
/// pages, 64 QPs' ≈ 1 100 pages were walked again on every access.
pub const TRANSLATION_CACHE_CAPACITY: usize = 32 << 10;

/// Everything a walk depends on: the whole MTR and the page, packed into as few words
/// as hashing needs (shifts ≤ 63, hops ≤ 3 and region count ≤ 3 for a valid MTR; an
/// invalid one never gets here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PageKey {
    root: u64,
    shape: u64,
    page_counts: [u64; MAX_REGIONS],
    page: u64,
}

/// Hashes two words of the key (root and page, shape and the first region's pages):
/// every lookup pays for the hash, equal keys still hash equally, and the equality check
/// compares the whole key.
impl std::hash::Hash for PageKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.root ^ self.page.rotate_left(32));
        state.write_u64(self.shape ^ self.page_counts[0].rotate_left(32));
    }
}

impl PageKey {
    /// The [`TranslationCache`] run slot of this key's MTR: a multiplicative hash of the
    /// words that tell MTRs apart (the page left out: one run per MTR), its top bits.
    /// Not the hash maps' `WordHasher` finish: its low bits, which a direct-mapped table
    /// would take, put the roots of 64 regions 4 KiB apart on a few slots (the test of
    /// regions taking turns read the BT 389 times instead of at most 144).
    #[inline]
    fn run_slot(&self) -> usize {
        let word = self.root ^ self.shape.rotate_left(32) ^ self.page_counts[0].rotate_left(48);
        (word.wrapping_mul(FIBONACCI_MULTIPLIER) >> (64 - RUN_SLOTS.trailing_zeros())) as usize
    }

    /// Whether `other` is a page of the same MTR.
    #[inline]
    fn same_mtr(&self, other: &PageKey) -> bool {
        self.root == other.root && self.shape == other.shape && self.page_counts == other.page_counts
    }

    fn new(mtr: &Mtr, page: u64) -> Self {
        let hops = mtr
            .regions
            .iter()
            .enumerate()
            .fold(0u64, |h, (i, r)| h | u64::from(r.hop) << (8 * i));
        Self {
            root: mtr.root,
            shape: u64::from(mtr.ba_page_shift)
                | u64::from(mtr.buffer_page_shift) << 8
                | (mtr.region_count as u64) << 16
                | hops << 24,
            page_counts: mtr.regions.map(|r| r.page_count),
            page,
        }
    }
}

/// The bus addresses of pages that walks found, by MTR and page: the device's MTT cache.
/// Only successful walks of validated MTRs are remembered, so a hit skips the validation
/// and the BT reads and gives what the walk gave. The leaf run each MTR's last walk read
/// is asked before the pages: a stream through a buffer is answered from it, and only the
/// pages walks found are remembered, so the page table stays small for large buffers.
/// The owner forgets everything whenever the driver may have changed BT pages (the device
/// does so on every command and mailbox, as it does for context addresses; see `hem`).
#[derive(Debug, Default)]
pub struct TranslationCache {
    /// Walked pages: each one's base, and where its walk's bottom-level entry was.
    pages: FastHashMap<PageKey, RememberedPage>,
    /// MTRs that passed [`Mtr::validate`] (at most [`VALID_MTRS`]; forgotten all at once
    /// when full). Validity depends on nothing but the MTR itself, so a buffer used again
    /// (the SQ, the CQ, a payload MR: a few per message) is not validated again; this is
    /// why these are kept when the pages are cleared. On the heap: the DMA path moves the
    /// cache out of the device and back for every access.
    valid: FastHashSet<ValidMtr>,
    /// The bottom-level BT entries that followed each MTR's last walk, read with it: one
    /// slot per MTR hash ([`RUN_SLOTS`]), so streams through many buffers taking turns
    /// (a packet of each QP in turn) each keep their run. On the heap for the same
    /// reason as `valid`; allocated at the first walk.
    runs: Vec<LeafRun>,
    /// Bumped whenever the pages are forgotten: a run read in another generation is
    /// forgotten with them.
    generation: u64,
}

/// Bottom-level BT entries a walk read past the one it needed: the next pages of the
/// same MTR region in the same BT page, whose walks would pass the same upper levels.
/// A stream through a buffer (a multi-packet message, page after page) then walks once
/// per [`LEAF_RUN`] pages, not once per page, even once the page memo is full. An entry
/// is used only if the walk would accept it (non-zero, page aligned); any other falls
/// back to the walk, which gives the error.
// Aligned to a cache line, and the key, count and generation (64 bytes) first: the check
// of a slot reads one line, and the entry it then uses one more.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct LeafRun {
    /// The MTR and the run's first page.
    key: PageKey,
    /// Entries held, from `key.page` on (none unless `generation` is the cache's).
    count: u64,
    /// [`TranslationCache::generation`] when the run was read.
    generation: u64,
    entries: [u64; LEAF_RUN],
}

/// Most bottom-level entries a walk reads ahead (one 128-byte read).
const LEAF_RUN: usize = 16;

/// Leaf runs a [`TranslationCache`] keeps, one per MTR hash (192 bytes each). Each
/// QP's payload streams through a buffer of its own, and the model sends a packet of each
/// QP in turn: with one run for all, 64 QPs found another QP's run on every packet and
/// asked the page table, whose entry for that page had been evicted by the payload of the
/// whole round (docs/benchmarks.md, many QPs). A run is touched once per round instead.
const RUN_SLOTS: usize = 1024;
const _: () = assert!(RUN_SLOTS.is_power_of_two(), "run_slot takes the hash's top bits");
const _: () = assert!(std::mem::size_of::<LeafRun>() == 192 && std::mem::offset_of!(LeafRun, entries) == 64);

/// A walked page as [`TranslationCache`] remembers it.
#[derive(Debug, Clone, Copy)]
struct RememberedPage {
    /// The page's bus address.
    base: u64,
    /// Its bottom-level entry, from which a stream that comes back to the page reads the
    /// run again (none for a direct MTR's walk).
    leaf: Option<Leaf>,
}

/// Where the bottom-level entry of a walk was, and how many entries of the same region
/// follow it in the same BT page (itself included).
#[derive(Debug, Clone, Copy)]
struct Leaf {
    address: u64,
    following: u64,
}

/// MTRs a [`TranslationCache`] remembers as valid: a few per QP (its SQ, CQ and payload
/// buffers) for 1 024 QPs. At 16 (replaced in turn) 64 QPs' buffers were validated again
/// on every access.
const VALID_MTRS: usize = 4096;

/// An MTR in the set of validated ones: hashed by two words of it (root and shifts, the
/// first region and the region count), compared whole, so equal MTRs hash equally and an
/// invalid one never passes for a valid one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ValidMtr(Mtr);

impl std::hash::Hash for ValidMtr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mtr = &self.0;
        let shifts = u64::from(mtr.ba_page_shift) << 32 | u64::from(mtr.buffer_page_shift);
        state.write_u64(mtr.root ^ shifts.rotate_left(17));
        state.write_u64(mtr.regions[0].page_count ^ (mtr.region_count as u64).rotate_left(56));
    }
}

/// A copy remembers the same pages and valid MTRs but starts without leaf runs: they
/// only spare walks (what they answer, a walk answers the same), and a device forked
/// for every fuzz input would otherwise copy all 1 024 slots each time.
impl Clone for TranslationCache {
    fn clone(&self) -> Self {
        Self {
            pages: self.pages.clone(),
            valid: self.valid.clone(),
            runs: Vec::new(),
            generation: self.generation,
        }
    }
}

impl TranslationCache {
    /// Forgets every page.
    pub fn clear(&mut self) {
        // Clearing costs the table's size, not its contents: the device clears on every
        // command, most of them while nothing is remembered.
        if !self.pages.is_empty() {
            self.pages.clear();
        }
        self.generation = self.generation.wrapping_add(1);
    }

    /// The run of `key`'s MTR, if it was read since the pages were last forgotten.
    #[inline]
    fn run_of(&self, key: &PageKey) -> Option<&LeafRun> {
        self.run_in_slot_of(key).filter(|run| run.key.same_mtr(key))
    }

    /// The run in `key`'s slot, of whichever MTR, if it was read since the pages were last
    /// forgotten.
    #[inline]
    fn run_in_slot_of(&self, key: &PageKey) -> Option<&LeafRun> {
        let run = self.runs.get(key.run_slot())?;
        (run.generation == self.generation && run.count > 0).then_some(run)
    }

    /// Whether `key`'s run slot holds a current run of another MTR.
    #[inline]
    fn run_slot_held_by_another(&self, key: &PageKey) -> bool {
        self.run_in_slot_of(key).is_some_and(|run| !run.key.same_mtr(key))
    }

    /// The page base `key` has in its MTR's leaf run, if the run holds it and the walk
    /// would accept its entry.
    #[inline]
    fn run_base(&self, key: &PageKey, page_size: u64) -> Option<u64> {
        let run = self.run_of(key)?;
        let at = key.page.wrapping_sub(run.key.page);
        if at >= run.count {
            return None;
        }
        let value = run.entries[at as usize];
        (value != 0 && value & (page_size - 1) == 0).then_some(value)
    }

    /// Whether `key` is the page right after the last of its MTR's leaf run.
    #[inline]
    fn run_continues_to(&self, key: &PageKey) -> bool {
        self.run_of(key)
            .is_some_and(|run| run.key.page.checked_add(run.count) == Some(key.page))
    }

    /// Reads the run of bottom-level entries from the one a walk of `key` used, into the
    /// slot of `key`'s MTR.
    fn fill_run(&mut self, memory: &dyn HostMemory, key: PageKey, leaf: Leaf) {
        let count = leaf.following.min(LEAF_RUN as u64);
        if self.runs.is_empty() {
            let empty = LeafRun {
                key,
                count: 0,
                generation: self.generation,
                entries: [0; LEAF_RUN],
            };
            self.runs = vec![empty; RUN_SLOTS];
        }
        let generation = self.generation;
        let run = &mut self.runs[key.run_slot()];
        run.count = 0;
        let mut bytes = [0u8; LEAF_RUN * BT_ENTRY_SIZE as usize];
        let bytes = &mut bytes[..count as usize * BT_ENTRY_SIZE as usize];
        if count < 2 || memory.read(leaf.address, bytes).is_err() {
            return;
        }
        for (entry, value) in run.entries.iter_mut().zip(bytes.chunks_exact(BT_ENTRY_SIZE as usize)) {
            *entry = u64::from_le_bytes(value.try_into().unwrap_or_default());
        }
        run.key = key;
        run.count = count;
        run.generation = generation;
    }

    /// Pages remembered.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// [`Mtr::validate`], answered from the MTRs remembered as valid.
    fn validate(&mut self, mtr: &Mtr) -> Result<(), MttError> {
        if self.valid.contains(&ValidMtr(*mtr)) {
            return Ok(());
        }
        mtr.validate()?;
        if self.valid.len() >= VALID_MTRS {
            self.valid.clear();
        }
        self.valid.insert(ValidMtr(*mtr));
        Ok(())
    }

    /// [`TranslationCache::translate`] of host memory behind `bus`; None when bus
    /// mastering is off.
    #[inline]
    pub(crate) fn translate_on(&mut self, bus: &Bus, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        Some(self.translate(bus.memory()?, mtr, offset))
    }

    /// [`translate`], answering from the pages remembered and remembering the page a
    /// successful walk finds.
    pub fn translate(&mut self, memory: &dyn HostMemory, mtr: &Mtr, offset: u64) -> Result<u64, MttError> {
        if mtr.is_direct() {
            self.validate(mtr)?;
            return translate_valid(memory, mtr, offset);
        }
        let page = offset >> mtr.buffer_page_shift.min(63);
        let in_page = offset & (mtr.page_size() - 1);
        let key = PageKey::new(mtr, page);
        // The run first: it is one small block that stays in the CPU's cache, while the
        // page table of a large region is spread over hundreds of KiB that a stream of
        // payload through the same cache evicts (the memo's time per byte was ≈ 4 × at
        // 1 MiB what it was at 64 KiB, docs/benchmarks.md). The run was read by a walk of this MTR, which
        // validated it.
        if let Some(base) = self.run_base(&key, mtr.page_size()) {
            return Ok(base + in_page);
        }
        // A stream that has just left the run walks on and reads the next run, without
        // asking the page table: in a stream through a large buffer a page comes back
        // only after the whole buffer has passed through the caches, and with it the
        // table's lines (a buffer sent again and again would otherwise end up answered
        // from the table page by page, as before).
        if !self.run_continues_to(&key) {
            if let Some(&page) = self.pages.get(&key) {
                // A stream that comes back to a remembered page (a buffer sent again, a
                // slot of a ring of buffers used again) reads the run from there, so the
                // pages after it come from the run too. Without it the run stayed where the
                // last walk left it: once every page a stream starts a run at had been
                // walked, the buffer was answered from the table page by page for good,
                // a cold line per page for a buffer past the caches (docs/benchmarks.md,
                // "Cold buffers").
                //
                // Not over another MTR's run: two MTRs that share a slot and take turns
                // (a packet of each of 1 024 QPs) would each read their run on every
                // access, where the table alone answers.
                if let Some(leaf) = page.leaf.filter(|_| !self.run_slot_held_by_another(&key)) {
                    self.fill_run(memory, key, leaf);
                }
                return Ok(page.base + in_page);
            }
        }
        self.validate(mtr)?;
        let (address, leaf) = walk_valid(memory, mtr, offset)?;
        if let Some(leaf) = leaf {
            self.fill_run(memory, key, leaf);
        }
        // The walk returned a page-aligned address plus `in_page`.
        let page = RememberedPage {
            base: address - in_page,
            leaf,
        };
        // Only walked pages are remembered (a page the run answers costs a walk per run
        // when it comes back, not one each). When full, new pages are simply not
        // remembered (a stream over a large region would only churn the table) until the
        // owner next clears it.
        if self.pages.len() < TRANSLATION_CACHE_CAPACITY {
            self.pages.insert(key, page);
        }
        Ok(address)
    }
}

/// [`try_translate_range_from`] through `cache`: each page is looked up there first.
///
/// A `first_bus` must come from a successful translation of `mtr` (as the access check's
/// does): one exists only for an MTR that passed [`Mtr::validate`], and validity depends
/// on nothing but the MTR, so the range is not validated again.
pub fn try_translate_range_cached<E: From<MttError>>(
    memory: &dyn HostMemory,
    cache: &mut TranslationCache,
    mtr: &Mtr,
    offset: u64,
    first_bus: Option<u64>,
    length: u64,
    f: impl FnMut(u64, u64) -> Result<(), E>,
) -> Result<(), E> {
    if first_bus.is_none() {
        cache.validate(mtr)?;
    }
    translate_pieces(mtr, offset, first_bus, length, |o| cache.translate(memory, mtr, o), f)
}

/// For an `mtr` that passed [`Mtr::validate`]: checks the range, then calls `f` for each
/// piece split at page boundaries, with the address `translate` gives (or `first_bus` for
/// the first piece).
fn translate_pieces<E: From<MttError>>(
    mtr: &Mtr,
    offset: u64,
    first_bus: Option<u64>,
    length: u64,
    mut translate: impl FnMut(u64) -> Result<u64, MttError>,
    mut f: impl FnMut(u64, u64) -> Result<(), E>,
) -> Result<(), E> {
    if length == 0 {
        return Ok(());
    }
    let size = mtr.size();
    let end = match offset.checked_add(length) {
        Some(end) if end <= size => end,
        _ => return Err(MttError::RangeOutOfRange { offset, length, size }.into()),
    };
    let page_mask = mtr.page_size() - 1;
    let mut current = offset;
    let mut known = first_bus;
    while current < end {
        let address = match known.take() {
            Some(address) => address,
            None => translate(current)?,
        };
        let page_end = (current | page_mask).saturating_add(1);
        let chunk = page_end.min(end) - current;
        f(address, chunk)?;
        current += chunk;
    }
    Ok(())
}

/// [`translate`] for an MTR that passed [`Mtr::validate`].
fn translate_valid(memory: &dyn HostMemory, mtr: &Mtr, offset: u64) -> Result<u64, MttError> {
    walk_valid(memory, mtr, offset).map(|(address, _)| address)
}

/// [`translate_valid`], with where the bottom-level entry was (None for a direct MTR).
#[inline]
fn walk_valid(memory: &dyn HostMemory, mtr: &Mtr, offset: u64) -> Result<(u64, Option<Leaf>), MttError> {
    let size = mtr.size();
    if offset >= size {
        return Err(MttError::OutOfRange { offset, size });
    }
    if mtr.is_direct() {
        // validate() checked root + size does not wrap.
        return Ok((mtr.root + offset, None));
    }
    let page_size = mtr.page_size();
    let page = offset >> mtr.buffer_page_shift;
    let in_page = offset & (page_size - 1);
    let unit = mtr.unit();

    // Find the region and where its entries start in the root.
    let mut first_page = 0u64;
    let mut root_base = 0u64;
    let mut found = None;
    for region in mtr.regions() {
        if page - first_page < region.page_count {
            found = Some(*region);
            break;
        }
        first_page += region.page_count;
        root_base += region.root_entries(unit);
    }
    let region = found.ok_or(MttError::OutOfRange { offset, size })?;
    let q = page - first_page;
    let hop = region.hop;

    let mut table = mtr.root;
    let mut index = root_base + q / unit.pow(u32::from(hop) - 1);
    for level in 0..hop {
        let address = index
            .checked_mul(BT_ENTRY_SIZE)
            .and_then(|o| table.checked_add(o))
            .ok_or(MttError::BtUnreachable {
                level,
                index,
                address: table,
                source: MemoryError::Overflow {
                    kind: crate::memory::AccessKind::Read,
                    address: table,
                    length: BT_ENTRY_SIZE as usize,
                },
            })?;
        let value = memory.read_u64(address).map_err(|source| MttError::BtUnreachable {
            level,
            index,
            address,
            source,
        })?;
        let bottom = level + 1 == hop;
        let expected = if bottom {
            EntryTarget::BufferPage { page }
        } else {
            EntryTarget::BtPage { level: level + 1 }
        };
        if value == 0 {
            return Err(MttError::EmptyEntry {
                level,
                index,
                address,
                expected,
            });
        }
        if bottom {
            if value & (page_size - 1) != 0 {
                return Err(MttError::MisalignedPage {
                    level,
                    index,
                    address,
                    page,
                    value,
                    page_size,
                });
            }
            // The region's entries after this one in this BT page (the root holds every
            // bottom entry of a one-hop region; a lower BT page holds `unit`).
            let in_table = if hop == 1 { u64::MAX } else { unit - index };
            let leaf = Leaf {
                address,
                following: (region.page_count - q).min(in_table),
            };
            // `value` is page aligned, so adding an in-page offset cannot overflow.
            return Ok((value + in_page, Some(leaf)));
        }
        if !is_aligned(value, BT_ENTRY_SIZE) {
            return Err(MttError::MisalignedBtPage {
                level,
                index,
                address,
                value,
                expected,
            });
        }
        table = value;
        index = (q / unit.pow(u32::from(hop - level) - 2)) % unit;
    }
    unreachable!("a validated region with hops returns from its bottom level")
}

/// Whether `value` is a multiple of the power of two `alignment`.
const fn is_aligned(value: u64, alignment: u64) -> bool {
    value & (alignment - 1) == 0
}
