//! The regions the device reports, in vfio-pci numbering.
//!
//! | Index | Region | Size | Access |
//! |---|---|---|---|
//! | 0 | BAR0 control registers | 128 KiB | trapped (REGION_READ/WRITE) |
//! | 1 | upper half of 64-bit BAR0 | 0 | — |
//! | 2 | BAR2 doorbell pages | pages × 4 KiB, rounded up to a power of two | pages mmappable (sparse area + memfd), the rest trapped |
//! | 3 | upper half of BAR2 | 0 | — |
//! | 4 | BAR4 MSI-X table and PBA | 8 KiB | trapped (QEMU emulates the table, forwards the PBA) |
//! | 5 | upper half of BAR4 | 0 | — |
//! | 6 | expansion ROM | 0 | — |
//! | 7 | configuration space | 4 KiB | trapped |
//! | 8 | VGA | 0 | — |
//!
//! The MSI-X table and PBA sit in their own BAR, so the mmapped doorbell pages never
//! overlap them (QEMU uses sparse areas as given and would otherwise map over its own
//! MSI-X emulation).

use rnic_firmware_if::pci::CONFIG_SPACE_SIZE;
use rnic_firmware_if::regs;
use rnic_hw_model::pci::BarDescriptor;

use super::protocol::{region_flags, region_index, SparseArea};

/// What a region index is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// Size 0: not implemented.
    Absent,
    /// PCI configuration space.
    Config,
    /// A BAR of the model.
    Bar(u8),
}

/// One region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// What backs it.
    pub kind: RegionKind,
    /// Size in bytes.
    pub size: u64,
    /// [`region_flags`] (READ/WRITE/MMAP; CAPS is added when sparse areas exist).
    pub flags: u32,
    /// The mmappable areas (only for the doorbell BAR).
    pub sparse: Vec<SparseArea>,
}

impl Region {
    fn absent() -> Self {
        Self {
            kind: RegionKind::Absent,
            size: 0,
            flags: 0,
            sparse: Vec::new(),
        }
    }

    /// Whether the region is backed by the doorbell memfd.
    pub fn mappable(&self) -> bool {
        self.flags & region_flags::MMAP != 0
    }
}

/// The region table of the device.
#[derive(Debug, Clone)]
pub struct RegionTable {
    regions: Vec<Region>,
}

impl RegionTable {
    /// The table for a device with `doorbell_pages` doorbell pages; when `mmap` is false
    /// (the client cannot receive fds) the doorbell BAR is trapped like the others.
    pub fn new(doorbell_pages: u32, mmap: bool) -> Self {
        let mut regions: Vec<Region> = (0..region_index::COUNT).map(|_| Region::absent()).collect();
        let read_write = region_flags::READ | region_flags::WRITE;
        for bar in BarDescriptor::standard(doorbell_pages) {
            let mut region = Region {
                kind: RegionKind::Bar(bar.index),
                size: bar.size,
                flags: read_write,
                sparse: Vec::new(),
            };
            if bar.index == regs::DOORBELL_BAR && mmap {
                region.flags |= region_flags::MMAP;
                region.sparse.push(SparseArea {
                    offset: 0,
                    size: u64::from(doorbell_pages.max(1)) * regs::DOORBELL_PAGE_SIZE,
                });
            }
            regions[usize::from(bar.index)] = region;
        }
        regions[region_index::CONFIG as usize] = Region {
            kind: RegionKind::Config,
            size: CONFIG_SPACE_SIZE as u64,
            flags: read_write,
            sparse: Vec::new(),
        };
        Self { regions }
    }

    /// The region at `index`, if the index exists.
    pub fn get(&self, index: u32) -> Option<&Region> {
        self.regions.get(index as usize)
    }

    /// Number of regions (always [`region_index::COUNT`]).
    pub fn len(&self) -> u32 {
        self.regions.len() as u32
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_model() {
        let table = RegionTable::new(64, true);
        assert_eq!(table.len(), 9);
        assert_eq!(table.get(0).unwrap().size, regs::BAR0_SIZE);
        assert_eq!(table.get(1).unwrap().size, 0);
        let doorbells = table.get(2).unwrap();
        assert!(doorbells.mappable());
        assert_eq!(doorbells.size, 64 * 4096);
        assert_eq!(
            doorbells.sparse,
            vec![SparseArea {
                offset: 0,
                size: 64 * 4096
            }]
        );
        assert_eq!(table.get(4).unwrap().size, regs::MSIX_BAR_SIZE);
        assert!(!table.get(4).unwrap().mappable());
        assert_eq!(table.get(7).unwrap().kind, RegionKind::Config);
        assert_eq!(table.get(9), None);
        // Three pages round BAR2 up to four, but only the three real pages are mappable.
        let odd = RegionTable::new(3, true);
        assert_eq!(odd.get(2).unwrap().size, 4 * 4096);
        assert_eq!(odd.get(2).unwrap().sparse[0].size, 3 * 4096);
        assert!(!RegionTable::new(3, false).get(2).unwrap().mappable());
    }
}
