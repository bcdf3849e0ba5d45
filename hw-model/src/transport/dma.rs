//! Data movement for the engines: SGE lists (in a send WQE, in the extended SGE ring, in
//! a receive WQE), gather and scatter through memory regions with the local key checks,
//! and remote-key accesses through a checked [`MrTranslation`].
//!
//! Every byte goes through the memory-protection block's access check (key, PD, rights,
//! bounds, through the transport's [`Io`]) and
//! then through the region's MTT with [`crate::mtt::try_translate_range`], so a transfer touches
//! exactly the granted window or nothing of the failing piece.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::wqe::{Sge, SGE_SIZE};

use crate::memory::MemoryError;
use crate::mpt::{MrAccess, MrAccessError, MrTranslation};
use crate::mtt::{DmaFault, Mtr, MttError};

use super::{Engine, Io};

/// Why data could not be moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TransferError {
    /// A key, PD, access right or bound check failed.
    #[error("memory region check: {0}")]
    Protection(MrAccessError),
    /// The SGE list holds fewer bytes than the message.
    #[error("the scatter/gather list is shorter than the message")]
    Length,
    /// The SGE list or the inline data could not be read (WQE buffer translation or DMA).
    #[error("scatter/gather list unreadable: {0}")]
    List(String),
    /// A DMA access to the data failed.
    #[error("DMA: {0}")]
    Dma(DmaFault),
}

impl From<DmaFault> for TransferError {
    fn from(fault: DmaFault) -> Self {
        TransferError::Dma(fault)
    }
}

impl From<MttError> for TransferError {
    fn from(error: MttError) -> Self {
        TransferError::Dma(DmaFault::Translation(error))
    }
}

impl From<MemoryError> for TransferError {
    fn from(error: MemoryError) -> Self {
        TransferError::Dma(DmaFault::Memory(error))
    }
}

/// The extended SGE ring of a QP: region 2 of its WQE buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtRing {
    /// The QP buffer's translation.
    pub mtr: Mtr,
    /// Byte offset of the ring inside the buffer.
    pub offset: u64,
    /// Number of 16-byte slots (a power of two).
    pub slots: u32,
}

impl ExtRing {
    /// Buffer offset of slot `slot` (taken modulo the ring).
    fn slot_offset(&self, slot: u32) -> u64 {
        self.offset + u64::from(slot & (self.slots - 1)) * SGE_SIZE as u64
    }
}

/// Where the SGEs of a work request are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SgeList {
    /// A send WQE: the first `in_wqe` SGEs inside the WQE, the rest from `ext_start` of
    /// the extended ring; `count` SGEs in all (SGE_NUM).
    Send {
        in_wqe_sges: [Sge; 2],
        in_wqe: u8,
        count: u8,
        ext_start: u32,
        ring: Option<ExtRing>,
    },
    /// A receive WQE: `slots` SGE slots at byte `offset` of the buffer `mtr`, ended by
    /// the terminator SGE or an all-zero slot.
    Receive { mtr: Mtr, offset: u64, slots: u32 },
}

/// A position in an SGE list: SGE `sge`, byte `within` it, which is byte `offset` of
/// the message. Lets consecutive packets continue without re-walking the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SgeCursor {
    pub sge: u32,
    pub within: u64,
    pub offset: u64,
}

impl SgeCursor {
    /// The start of the list.
    pub const START: Self = Self {
        sge: 0,
        within: 0,
        offset: 0,
    };
}

/// Where inline data of a send WQE is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InlineData {
    /// Inside the WQE (RC: bytes 32..64; UD: the packed ≤ 8 bytes), copied at fetch.
    InWqe([u8; 32]),
    /// In the extended SGE ring from slot `start`, wrapping at the end of the ring.
    Ring { ring: ExtRing, start: u32 },
}

impl<I: Io> Engine<I> {
    /// Reads `buffer.len()` bytes at byte `offset` of the buffer `mtr` describes.
    pub(crate) fn read_buffer(&mut self, mtr: &Mtr, offset: u64, buffer: &mut [u8]) -> Result<(), TransferError> {
        self.read_buffer_from(mtr, offset, None, buffer)
    }

    /// [`read_buffer`](Self::read_buffer), with the bus address of `offset` already
    /// known when `first_bus` is given (from the access check's translation).
    fn read_buffer_from(
        &mut self,
        mtr: &Mtr,
        offset: u64,
        first_bus: Option<u64>,
        buffer: &mut [u8],
    ) -> Result<(), TransferError> {
        Ok(self.io.read_buffer(mtr, offset, first_bus, buffer)?)
    }

    /// Writes `data` at byte `offset` of the buffer `mtr` describes, starting from bus
    /// address `first_bus` when it is known (from the access check's translation).
    fn write_buffer_from(
        &mut self,
        mtr: &Mtr,
        offset: u64,
        first_bus: Option<u64>,
        data: &[u8],
    ) -> Result<(), TransferError> {
        Ok(self.io.write_buffer(mtr, offset, first_bus, data)?)
    }

    /// Timing of a payload access through `region`: one MTT translation-cache lookup per
    /// buffer page touched (a miss walks the region's BT levels).
    fn charge_translation(&mut self, region: &MrTranslation, length: usize) {
        let Some(mtr) = &region.mtr else {
            return;
        };
        if length == 0 {
            return;
        }
        let shift = mtr.buffer_page_shift;
        let levels = u32::from(mtr.regions().first().map_or(0, |r| r.hop));
        let first = region.offset >> shift;
        let last = (region.offset + length as u64 - 1) >> shift;
        for page in first..=last {
            let cost = self.io.timing().mtt_lookup(mtr.root, page, levels);
            self.io.timing().frame.latency = self.io.timing().frame.latency + cost;
        }
    }

    /// Reads through a checked region access (`buffer.len()` bytes from its start).
    pub(crate) fn read_region(&mut self, region: &MrTranslation, buffer: &mut [u8]) -> Result<(), TransferError> {
        self.charge_translation(region, buffer.len());
        self.io.timing().frame.read_bytes += buffer.len() as u64;
        match &region.mtr {
            Some(mtr) => self.read_buffer_from(mtr, region.offset, region.first_bus, buffer),
            None => Ok(self.dma_read(region.offset, buffer)?),
        }
    }

    /// Writes through a checked region access.
    pub(crate) fn write_region(&mut self, region: &MrTranslation, data: &[u8]) -> Result<(), TransferError> {
        self.charge_translation(region, data.len());
        match &region.mtr {
            Some(mtr) => self.write_buffer_from(mtr, region.offset, region.first_bus, data),
            None => Ok(self.dma_write(region.offset, data)?),
        }
    }

    /// SGE `index` of `list`, or None past its end.
    pub(crate) fn sge_at(&mut self, list: &SgeList, index: u32) -> Result<Option<Sge>, TransferError> {
        match list {
            SgeList::Send {
                in_wqe_sges,
                in_wqe,
                count,
                ext_start,
                ring,
            } => {
                if index >= u32::from(*count) {
                    return Ok(None);
                }
                if index < u32::from(*in_wqe) {
                    return Ok(Some(in_wqe_sges[index as usize]));
                }
                let Some(ring) = ring else {
                    return Err(TransferError::List(format!(
                        "SGE {index} is in the extended SGE ring, but the QP has none (SGE_SHIFT = 0)"
                    )));
                };
                let slot = ext_start.wrapping_add(index - u32::from(*in_wqe));
                let mut sge = Sge::zeroed();
                self.read_buffer(&ring.mtr, ring.slot_offset(slot), sge.bytes_mut())
                    .map_err(|e| TransferError::List(e.to_string()))?;
                Ok(Some(sge))
            }
            SgeList::Receive { mtr, offset, slots } => {
                if index >= *slots {
                    return Ok(None);
                }
                let mut sge = Sge::zeroed();
                self.read_buffer(mtr, offset + u64::from(index) * SGE_SIZE as u64, sge.bytes_mut())
                    .map_err(|e| TransferError::List(e.to_string()))?;
                if sge.is_terminator() || sge == Sge::zeroed() {
                    return Ok(None);
                }
                Ok(Some(sge))
            }
        }
    }

    /// Total bytes an SGE list holds (reads every SGE).
    pub(crate) fn sge_list_length(&mut self, list: &SgeList) -> Result<u64, TransferError> {
        let mut total = 0u64;
        let mut index = 0;
        while let Some(sge) = self.sge_at(list, index)? {
            total += u64::from(sge.length());
            index += 1;
        }
        Ok(total)
    }

    /// Calls `f(engine, lkey, address, length, position)` for each SGE piece covering
    /// message bytes `offset..offset + length`, in order; `position` counts from 0.
    fn walk_sges(
        &mut self,
        list: &SgeList,
        cursor: &mut SgeCursor,
        offset: u64,
        length: usize,
        mut f: impl FnMut(&mut Self, u32, u64, usize, usize) -> Result<(), TransferError>,
    ) -> Result<(), TransferError> {
        if cursor.offset > offset {
            *cursor = SgeCursor::START;
        }
        let end = offset + length as u64;
        let mut current: Option<Sge> = None;
        while cursor.offset < end {
            let sge = match current {
                Some(sge) => sge,
                None => {
                    let Some(sge) = self.sge_at(list, cursor.sge)? else {
                        return Err(TransferError::Length);
                    };
                    current = Some(sge);
                    sge
                }
            };
            let available = u64::from(sge.length()).saturating_sub(cursor.within);
            if available == 0 {
                cursor.sge += 1;
                cursor.within = 0;
                current = None;
                continue;
            }
            let step = if cursor.offset < offset {
                available.min(offset - cursor.offset)
            } else {
                let piece = available.min(end - cursor.offset);
                let position = (cursor.offset - offset) as usize;
                f(
                    self,
                    sge.lkey(),
                    sge.address().wrapping_add(cursor.within),
                    piece as usize,
                    position,
                )?;
                piece
            };
            cursor.offset += step;
            cursor.within += step;
        }
        Ok(())
    }

    /// Reads message bytes `offset..offset + out.len()` from the SGEs (local keys of PD
    /// `pd`, no access right needed to read).
    ///
    /// Here and in the scatter, a `match` on the check's own `Result`, not
    /// `map_err(..)?`: the region is used where the check left it instead of being copied
    /// into a second `Result` and out again (docs/benchmarks.md, "Stores read back in wider
    /// pieces").
    pub(crate) fn gather(
        &mut self,
        list: &SgeList,
        pd: u32,
        cursor: &mut SgeCursor,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), TransferError> {
        let length = out.len();
        self.walk_sges(
            list,
            cursor,
            offset,
            length,
            |engine, lkey, address, piece, position| match engine.check_memory_access(
                lkey,
                pd,
                address,
                piece as u64,
                MrAccess::empty(),
            ) {
                Ok(region) => engine.read_region(&region, &mut out[position..position + piece]),
                Err(error) => Err(TransferError::Protection(error)),
            },
        )
    }

    /// Writes `data` as message bytes `offset..` into the SGEs (local write access).
    pub(crate) fn scatter(
        &mut self,
        list: &SgeList,
        pd: u32,
        cursor: &mut SgeCursor,
        offset: u64,
        data: &[u8],
    ) -> Result<(), TransferError> {
        self.walk_sges(
            list,
            cursor,
            offset,
            data.len(),
            |engine, lkey, address, piece, position| match engine.check_memory_access(
                lkey,
                pd,
                address,
                piece as u64,
                MrAccess::LOCAL_WRITE,
            ) {
                Ok(region) => engine.write_region(&region, &data[position..position + piece]),
                Err(error) => Err(TransferError::Protection(error)),
            },
        )
    }

    /// Checks that message bytes `offset..offset + length` fit the SGEs and that every
    /// piece is locally writable, without writing (so a failing scatter leaves memory
    /// untouched).
    pub(crate) fn check_scatter(
        &mut self,
        list: &SgeList,
        pd: u32,
        cursor: &mut SgeCursor,
        offset: u64,
        length: usize,
    ) -> Result<(), TransferError> {
        self.walk_sges(list, cursor, offset, length, |engine, lkey, address, piece, _| {
            engine
                .check_memory_access(lkey, pd, address, piece as u64, MrAccess::LOCAL_WRITE)
                .map(|_| ())
                .map_err(TransferError::Protection)
        })
    }

    /// Reads inline bytes `offset..offset + out.len()` of a send WQE.
    pub(crate) fn gather_inline(
        &mut self,
        data: &InlineData,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), TransferError> {
        match data {
            InlineData::InWqe(bytes) => {
                let start = offset as usize;
                let source = bytes.get(start..start + out.len()).ok_or(TransferError::Length)?;
                out.copy_from_slice(source);
                Ok(())
            }
            InlineData::Ring { ring, start } => {
                // Contiguous runs up to the end of the ring, which the data wraps around.
                let ring_bytes = u64::from(ring.slots) * SGE_SIZE as u64;
                let mut position = 0usize;
                while position < out.len() {
                    let logical = offset + position as u64;
                    let in_ring = (u64::from(*start) * SGE_SIZE as u64 + logical) % ring_bytes;
                    let run = ((ring_bytes - in_ring) as usize).min(out.len() - position);
                    self.read_buffer(&ring.mtr, ring.offset + in_ring, &mut out[position..position + run])
                        .map_err(|e| TransferError::List(e.to_string()))?;
                    position += run;
                }
                // Inline bytes beyond the WQE are host memory: a payload read, like a
                // gather (only the 32 bytes in the WQE come with the WQE).
                self.io.timing().frame.read_bytes += out.len() as u64;
                Ok(())
            }
        }
    }
}
