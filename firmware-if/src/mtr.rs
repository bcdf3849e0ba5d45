//! Memory translate regions (hns "MTR"): how a buffer's pages are found through
//! multi-hop base-address tables (BTs). The walk itself is device behaviour (in
//! `hw-model`); this module fixes the arithmetic both sides must agree on.
//!
//! * A BT entry is an 8-byte little-endian full byte address of the next-level page (or
//!   of the data page at the bottom level). A BT page of `bt_page_size` bytes holds
//!   `unit = bt_page_size / 8` entries.
//! * A region of `hop` levels: hop 1 = root → data pages; hop 2 = root → L1 → pages;
//!   hop 3 = root → L1 → L2 → pages. One root entry covers `unit^(hop−1)` pages.
//! * Regions share one root BT page and are packed back to back in region order.
//! * Hop 0 ("direct"): no BT; the root address is the first data page and the buffer is
//!   contiguous. rnic allows hop 0 only when every region of the buffer is hop 0.

/// Smallest page (BT or buffer) in bytes.
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest hop number.
pub const MAX_HOP: u8 = 3;
/// Size of a BT entry in bytes.
pub const BT_ENTRY_SIZE: u64 = 8;
/// Largest buffer page (and context-table chunk) shift the device accepts: 1 GiB pages.
pub const MAX_BUFFER_PAGE_SHIFT: u32 = 30;
/// Largest BT page shift the device accepts: 2 MiB BT pages.
pub const MAX_BT_PAGE_SHIFT: u32 = 21;
/// Most regions one MTR may have (SQ, extended SGEs, RQ).
pub const MAX_REGIONS: usize = 3;

/// Page shift encoded in a 4-bit `*_PG_SZ` field (`page_shift − 12`).
pub const fn page_shift_from_field(field: u8) -> u32 {
    MIN_PAGE_SHIFT + field as u32
}

/// One region of a buffer: a run of pages translated with the same hop number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtrRegion {
    /// Number of buffer pages in the region.
    pub page_count: u64,
    /// Hop number (0..=3).
    pub hop: u8,
}

impl MtrRegion {
    /// Root-BT entries the region occupies, with `unit` entries per BT page.
    pub fn root_entries(&self, unit: u64) -> u64 {
        match self.hop {
            0 => 0,
            1 => self.page_count,
            hop => {
                let per_entry = unit.saturating_pow(hop as u32 - 1);
                self.page_count.div_ceil(per_entry)
            }
        }
    }
}

/// Byte sizes of the three regions of a QP buffer (`[SQ][extended SGEs][RQ]`), each
/// starting on a buffer-page boundary, as programmed in the QPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpBufferLayout {
    /// SQ bytes: `64 << SQ_SHIFT` (0 when the QP has no SQ WQEs).
    pub sq_bytes: u64,
    /// Extended SGE bytes: `16 << SGE_SHIFT`, or 0 when SGE_SHIFT is 0.
    pub sge_bytes: u64,
    /// RQ bytes: `(16 << RQWS) << RQ_SHIFT`, or 0 when the QP uses an SRQ.
    pub rq_bytes: u64,
}

impl QpBufferLayout {
    /// The layout a QPC describes.
    pub fn from_shifts(sq_shift: u32, sge_shift: u32, rq_shift: u32, rq_wqe_shift: u32, uses_srq: bool) -> Self {
        Self {
            sq_bytes: 64u64 << sq_shift.min(31),
            sge_bytes: if sge_shift == 0 { 0 } else { 16u64 << sge_shift.min(31) },
            rq_bytes: if uses_srq {
                0
            } else {
                (16u64 << rq_wqe_shift.min(31)) << rq_shift.min(31)
            },
        }
    }

    /// Page counts of the SQ, SGE and RQ regions for buffer pages of `1 << page_shift`.
    pub fn page_counts(&self, page_shift: u32) -> [u64; 3] {
        let page = 1u64 << page_shift;
        [self.sq_bytes, self.sge_bytes, self.rq_bytes].map(|bytes| bytes.div_ceil(page))
    }

    /// Byte offsets of the SQ, SGE and RQ regions inside the buffer.
    pub fn region_offsets(&self, page_shift: u32) -> [u64; 3] {
        let [sq, sge, _] = self.page_counts(page_shift);
        [0, sq << page_shift, (sq + sge) << page_shift]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_entry_covers_unit_to_the_hop_minus_one_pages() {
        let unit = 512;
        assert_eq!(MtrRegion { page_count: 5, hop: 1 }.root_entries(unit), 5);
        assert_eq!(
            MtrRegion {
                page_count: 513,
                hop: 2
            }
            .root_entries(unit),
            2
        );
        assert_eq!(
            MtrRegion {
                page_count: 512 * 512 + 1,
                hop: 3
            }
            .root_entries(unit),
            2
        );
        assert_eq!(MtrRegion { page_count: 9, hop: 0 }.root_entries(unit), 0);
    }

    #[test]
    fn qp_buffer_regions_start_on_page_boundaries() {
        // 64 SQ WQEs (4 KiB), 256 SGE slots (4 KiB), 32 RQ WQEs of 32 B (1 KiB).
        let layout = QpBufferLayout::from_shifts(6, 8, 5, 1, false);
        assert_eq!(layout.page_counts(12), [1, 1, 1]);
        assert_eq!(layout.region_offsets(12), [0, 4096, 8192]);
        let srq = QpBufferLayout::from_shifts(6, 0, 5, 1, true);
        assert_eq!(srq.page_counts(12), [1, 0, 0]);
    }

    #[test]
    fn page_size_fields_encode_shift_minus_twelve() {
        assert_eq!(page_shift_from_field(0), 12);
        assert_eq!(page_shift_from_field(9), 21);
    }
}
