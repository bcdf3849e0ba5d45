//! Virtual → physical address translation through `/proc/self/pagemap`.
//!
//! A user-space driver on a PCI function with no IOMMU between the device and memory
//! (a guest without a virtual IOMMU, or bare metal with the IOMMU off or in passthrough)
//! must tell the device physical addresses. Linux publishes them per virtual page in
//! `/proc/PID/pagemap`: one little-endian 64-bit entry per base page, bit 63 "present",
//! bits 0–54 the page frame number (PFN). Since Linux 4.0 the PFN reads as 0 unless the
//! reader has `CAP_SYS_ADMIN`, which [`PageMap::physical_address`] reports as an error
//! rather than handing out address 0.
//!
//! Plain file reads: no `unsafe` here. The translation only stays valid while the page
//! cannot move, i.e. for locked memory ([`crate::MappedRegion::anonymous_locked`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::host_page_size;

/// Bit 63 of a pagemap entry: the page is present in RAM.
pub const PAGEMAP_PRESENT: u64 = 1 << 63;
/// Bit 62 of a pagemap entry: the page is swapped out (the low bits then name the swap
/// slot, not a frame).
pub const PAGEMAP_SWAPPED: u64 = 1 << 62;
/// Bits 0–54 of a pagemap entry: the page frame number of a present page.
pub const PAGEMAP_PFN_MASK: u64 = (1 << 55) - 1;

/// What one pagemap entry says about its page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagemapEntry {
    /// Not in RAM (never touched, or swapped out).
    NotPresent,
    /// In RAM, but the PFN is hidden (read without `CAP_SYS_ADMIN`).
    PfnHidden,
    /// In RAM at this page frame number.
    Frame(u64),
}

impl PagemapEntry {
    /// Decodes a raw entry.
    pub fn decode(raw: u64) -> Self {
        if raw & PAGEMAP_PRESENT == 0 || raw & PAGEMAP_SWAPPED != 0 {
            return PagemapEntry::NotPresent;
        }
        match raw & PAGEMAP_PFN_MASK {
            0 => PagemapEntry::PfnHidden,
            pfn => PagemapEntry::Frame(pfn),
        }
    }
}

/// An open pagemap file.
#[derive(Debug)]
pub struct PageMap {
    file: File,
    page_size: u64,
}

impl PageMap {
    /// Opens this process's `/proc/self/pagemap`.
    ///
    /// # Errors
    /// The OS error of the open.
    pub fn open_self() -> io::Result<Self> {
        Self::open(Path::new("/proc/self/pagemap"))
    }

    /// Opens a pagemap file at `path` (another process's, or a test's stand-in with the
    /// same layout), for pages of the host's size.
    ///
    /// # Errors
    /// The OS error of the open.
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(Self {
            file: File::open(path)?,
            page_size: host_page_size(),
        })
    }

    /// The entry of the page holding virtual address `virtual_address`.
    ///
    /// # Errors
    /// The OS error of the read; `UnexpectedEof` when the file has no such entry.
    pub fn entry(&self, virtual_address: usize) -> io::Result<PagemapEntry> {
        let index = virtual_address as u64 / self.page_size;
        let mut raw = [0u8; 8];
        self.file.read_exact_at(&mut raw, index * 8)?;
        Ok(PagemapEntry::decode(u64::from_le_bytes(raw)))
    }

    /// The physical address of the byte at virtual address `virtual_address`.
    ///
    /// # Errors
    /// `NotFound` for a page that is not in RAM; `PermissionDenied` when the kernel
    /// hides PFNs from this process (it needs `CAP_SYS_ADMIN`); the OS error of the read.
    pub fn physical_address(&self, virtual_address: usize) -> io::Result<u64> {
        match self.entry(virtual_address)? {
            PagemapEntry::Frame(pfn) => Ok(pfn * self.page_size + virtual_address as u64 % self.page_size),
            PagemapEntry::NotPresent => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("virtual address {virtual_address:#x} is not backed by a page in RAM"),
            )),
            PagemapEntry::PfnHidden => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "/proc/self/pagemap hides page frame numbers: reading them needs CAP_SYS_ADMIN (run as root)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MappedRegion, PageSize};

    /// Whether this process has CAP_SYS_ADMIN (bit 21 of the effective set).
    fn has_cap_sys_admin() -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        let mask = u64::from_str_radix(line["CapEff:".len()..].trim(), 16).unwrap();
        mask & (1 << 21) != 0
    }

    #[test]
    fn entries_decode_present_swapped_hidden_and_frames() {
        assert_eq!(PagemapEntry::decode(0), PagemapEntry::NotPresent);
        assert_eq!(
            PagemapEntry::decode(0x1234),
            PagemapEntry::NotPresent,
            "present bit clear"
        );
        assert_eq!(
            PagemapEntry::decode(PAGEMAP_PRESENT | PAGEMAP_SWAPPED | 0x1234),
            PagemapEntry::NotPresent,
            "a swap slot is not a frame"
        );
        assert_eq!(PagemapEntry::decode(PAGEMAP_PRESENT), PagemapEntry::PfnHidden);
        // Bits 55–61 (soft-dirty, exclusive, file/shared flags) are not part of the PFN.
        let flags = (1 << 55) | (1 << 56) | (1 << 61);
        assert_eq!(
            PagemapEntry::decode(PAGEMAP_PRESENT | flags | PAGEMAP_PFN_MASK),
            PagemapEntry::Frame(PAGEMAP_PFN_MASK)
        );
        assert_eq!(PagemapEntry::decode(PAGEMAP_PRESENT | 0x42), PagemapEntry::Frame(0x42));
    }

    #[test]
    fn a_stand_in_pagemap_file_translates_by_page_index() {
        let page = host_page_size();
        let path = std::env::temp_dir().join(format!("rnic-os-pagemap-{}", std::process::id()));
        let mut bytes = Vec::new();
        for raw in [0, PAGEMAP_PRESENT | 0x500, PAGEMAP_PRESENT] {
            bytes.extend_from_slice(&u64::to_le_bytes(raw));
        }
        std::fs::write(&path, bytes).unwrap();
        let map = PageMap::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let at = |page_index: u64, offset: u64| (page_index * page + offset) as usize;
        assert_eq!(map.physical_address(at(1, 0x123)).unwrap(), 0x500 * page + 0x123);
        assert_eq!(
            map.physical_address(at(0, 0)).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            map.physical_address(at(2, 8)).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert_eq!(
            map.physical_address(at(3, 0)).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof,
            "past the end of the file"
        );
    }

    /// On this host, with base pages: a locked page has a frame, distinct pages have
    /// distinct frames, and the offset inside the page is kept. Without CAP_SYS_ADMIN
    /// the kernel hides frames and the translation must say so instead of returning 0.
    #[test]
    fn locked_pages_of_this_process_have_frames_when_root() {
        let page = host_page_size() as usize;
        let region = MappedRegion::anonymous_locked(3 * page, PageSize::Base).unwrap();
        assert!(region.write_at(0, &[1]));
        let map = PageMap::open_self().unwrap();
        let base = region.virtual_address();
        let result = map.physical_address(base + 0x10);
        if !has_cap_sys_admin() {
            assert_eq!(result.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
            return;
        }
        let first = result.unwrap();
        assert_ne!(first, 0x10, "a real frame, not frame 0");
        assert_eq!(first % page as u64, 0x10);
        let frames: Vec<u64> = (0..3).map(|i| map.physical_address(base + i * page).unwrap()).collect();
        assert!(frames.iter().all(|f| f % page as u64 == 0));
        assert!(frames[0] != frames[1] && frames[1] != frames[2] && frames[0] != frames[2]);
        // Populated and locked: a page never written to is present too.
        assert!(matches!(map.entry(base + 2 * page).unwrap(), PagemapEntry::Frame(_)));
    }
}
