//! DMA through a buffer's translation: reads and writes of a byte range of the buffer an
//! MTR describes, split at page boundaries, each page translated through the MTT cache and
//! moved on the bus. Every block that moves data through an MTR (WQE fetch, SGE lists,
//! payload, index queues) uses these.

use std::ops::Range;

use crate::bus::Bus;
use crate::memory::MemoryError;

use super::{try_translate_range_cached, Mtr, MttError, TranslationCache};

/// Why a DMA through a translation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaFault {
    /// Bus mastering is off: no DMA at all.
    #[error("bus mastering is disabled")]
    BusMasterOff,
    /// The buffer's translation failed (an invalid MTR, a range past its end, a BT walk).
    #[error(transparent)]
    Translation(#[from] MttError),
    /// Host memory refused a piece.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// Translates `length` bytes at `offset` of the buffer `mtr` describes (through `cache`;
/// the first piece at `first_bus` when the caller already translated it) and calls
/// `access` with the bus, each piece's bus address and its range within the transfer.
fn for_each_piece<E: From<DmaFault> + From<MttError>>(
    cache: &mut TranslationCache,
    bus: &mut Bus,
    mtr: &Mtr,
    offset: u64,
    first_bus: Option<u64>,
    length: usize,
    mut access: impl FnMut(&mut Bus, u64, Range<usize>) -> Result<(), E>,
) -> Result<(), E> {
    // A handle, so the walk can read BT entries while `access` uses the bus.
    let memory = bus.memory_handle().ok_or(DmaFault::BusMasterOff)?;
    let mut position = 0usize;
    try_translate_range_cached(
        &*memory,
        cache,
        mtr,
        offset,
        first_bus,
        length as u64,
        |address, chunk| {
            let end = position + chunk as usize;
            access(bus, address, position..end)?;
            position = end;
            Ok::<(), E>(())
        },
    )
}

/// Reads `buffer.len()` bytes at byte `offset` of the buffer `mtr` describes.
pub(crate) fn read_buffer(
    cache: &mut TranslationCache,
    bus: &mut Bus,
    mtr: &Mtr,
    offset: u64,
    first_bus: Option<u64>,
    buffer: &mut [u8],
) -> Result<(), DmaFault> {
    for_each_piece(
        cache,
        bus,
        mtr,
        offset,
        first_bus,
        buffer.len(),
        |bus, address, range| Ok::<(), DmaFault>(bus.read(address, &mut buffer[range])?),
    )
}

/// Writes `data` at byte `offset` of the buffer `mtr` describes.
pub(crate) fn write_buffer(
    cache: &mut TranslationCache,
    bus: &mut Bus,
    mtr: &Mtr,
    offset: u64,
    first_bus: Option<u64>,
    data: &[u8],
) -> Result<(), DmaFault> {
    for_each_piece(cache, bus, mtr, offset, first_bus, data.len(), |bus, address, range| {
        Ok::<(), DmaFault>(bus.write(address, &data[range])?)
    })
}
