//! Memory protection (MPT): memory regions. CREATE_MPT / DESTROY_MPT / QUERY_MPT, the
//! key, PD, access and bounds checks the transport applies to every access, and the
//! invalidation of a key by a SEND with invalidate.
//!
//! Keys follow hns: `key = rotl32(index, 8)`, so the MPT index is `rotr32(key, 8)`
//! masked to the table size, and the key's low byte is the variant the driver chose.
//!
//! The block ([`MemoryProtection`]) owns the MPT cache (the hns MPT cache: MPTs decoded
//! for the access check). It accepts the mailbox commands and the access checks, produces
//! no events, and reaches host memory only through its [`Io`]: the MPT table of the
//! context block, the MTT and the bus-master state.

use rnic_firmware_if::context::mpt::key_to_index;
use rnic_firmware_if::context::{Mpt, MptState};
use rnic_firmware_if::mtr::page_shift_from_field;

use crate::command::Rejection;
use crate::fast_hash::FastHashMap;
use crate::mtt::{Mtr, MttError};

/// What the MPT block needs from the rest of the device.
pub(crate) trait Io {
    /// MPT `index` and its bus address, from the MPT table of the context block.
    fn read_mpt(&mut self, index: u32) -> Result<(Mpt, u64), Rejection>;
    /// Writes the MPT at `address` back.
    fn write_mpt(&mut self, address: u64, mpt: &Mpt) -> Result<(), Rejection>;
    /// Translates byte `offset` of `mtr` through the MTT; None while bus mastering is off.
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>>;
    /// Whether bus mastering is on (cached MPTs answer only then).
    fn bus_master(&self) -> bool;
}

/// Most MPTs the MPT cache holds before it starts over.
const MPT_CACHE_CAPACITY: usize = crate::hem::LOCATION_CACHE_CAPACITY;

bitflags::bitflags! {
    /// Access rights an operation needs from a memory region.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MrAccess: u8 {
        /// Local write (the device writes into the region on behalf of the local QP).
        const LOCAL_WRITE = 1 << 0;
        /// Remote read.
        const REMOTE_READ = 1 << 1;
        /// Remote write.
        const REMOTE_WRITE = 1 << 2;
        /// Remote atomic.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// Why a memory-region access was refused; the variants map onto the hns local access
/// violation sub-types (§9.2) and onto NAK / CQE error codes in the transport.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MrAccessError {
    /// No valid MPT entry for the key (hns sub-type 1, R_Key violation).
    #[error("key {key:#x}: no valid memory region")]
    InvalidKey {
        /// The key.
        key: u32,
    },
    /// The key's variant byte does not match the registered key (sub-type 6, key state).
    #[error("key {key:#x}: registered key is {registered:#x}")]
    KeyMismatch {
        /// The key used.
        key: u32,
        /// The key the region was registered with.
        registered: u32,
    },
    /// PD of the region differs from the QP's (sub-type 4).
    #[error("key {key:#x}: region PD {region_pd} differs from QP PD {qp_pd}")]
    ProtectionDomain {
        /// The key.
        key: u32,
        /// The region's PD.
        region_pd: u32,
        /// The QP's PD.
        qp_pd: u32,
    },
    /// The region does not grant the access (sub-type 5).
    #[error("key {key:#x}: access {needed:?} not granted")]
    Access {
        /// The key.
        key: u32,
        /// What the operation needed.
        needed: MrAccess,
    },
    /// The range is outside the region (sub-type 2/3).
    #[error("key {key:#x}: range {address:#x}+{length} outside region {start:#x}+{region_length}")]
    Bounds {
        /// The key.
        key: u32,
        /// First byte accessed (IOVA).
        address: u64,
        /// Bytes accessed.
        length: u64,
        /// Region start (IOVA).
        start: u64,
        /// Region length.
        region_length: u64,
    },
    /// The region's page table could not be walked (sub-type 7).
    #[error("key {key:#x}: page table: {reason}")]
    Translation {
        /// The key.
        key: u32,
        /// What failed.
        reason: String,
    },
}

/// A checked memory-region access: how to turn IOVAs of the range into bus addresses.
#[derive(Debug, Clone, Copy)]
pub struct MrTranslation {
    /// The region's page table (None for physical-address regions).
    pub mtr: Option<Mtr>,
    /// Byte offset of the access start inside the region's buffer (or the bus address
    /// itself for physical-address regions).
    pub offset: u64,
    /// Bus address of the access start, when the check translated it (the check walks
    /// the first page's BT entries; the transfer starts from here instead of walking
    /// them again).
    pub first_bus: Option<u64>,
}

/// No page in [`CheckedMpt::last_page`]: not page aligned, so no page offset equals it.
const NO_PAGE: u64 = u64::MAX;

/// An MPT as the access check reads it, decoded once when the MPT enters the device's
/// MPT cache: the check runs for every SGE and every remote access, and would otherwise
/// extract a dozen bit fields and rebuild the page table's MTR each time. It holds what
/// the MPT says and nothing more, so it is valid exactly as long as the cached MPT was.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckedMpt {
    /// MPT_ST is valid.
    valid: bool,
    /// The registered key.
    lkey: u32,
    /// The region's PD.
    pd: u32,
    /// The rights the region grants.
    granted: MrAccess,
    /// First IOVA (0 for a zero-based region).
    start: u64,
    /// Length in bytes.
    length: u64,
    /// The page table and the byte offset of `start` in its buffer; None for a
    /// physical-address region.
    table: Option<(Mtr, u64)>,
    /// A page of `table` an access check translated (byte offset of the page in the
    /// buffer, its bus address): a check of the same page again (small messages to one
    /// buffer) needs no MTT-cache lookup. It goes with the entry, so it is forgotten
    /// whenever the MTT cache is (and more often). [`NO_PAGE`] when there is none.
    last_page: (u64, u64),
}

impl CheckedMpt {
    /// Decodes `mpt` (any bytes: nothing is assumed valid).
    pub(crate) fn decode(mpt: &Mpt) -> Self {
        let mut granted = MrAccess::empty();
        granted.set(MrAccess::LOCAL_WRITE, mpt.local_write_enable());
        granted.set(MrAccess::REMOTE_READ, mpt.remote_read_enable());
        granted.set(MrAccess::REMOTE_WRITE, mpt.remote_write_enable());
        granted.set(MrAccess::REMOTE_ATOMIC, mpt.atomic_enable());
        let table = (!mpt.physical_address()).then(|| {
            let mtr = mpt_mtr(mpt);
            let first_page_offset = if mpt.zero_based() {
                0
            } else {
                mpt.virtual_address() & (mtr.page_size() - 1)
            };
            (mtr, first_page_offset)
        });
        Self {
            valid: mpt.mpt_state() == Ok(MptState::Valid),
            lkey: mpt.lkey(),
            pd: mpt.protection_domain(),
            granted,
            start: if mpt.zero_based() { 0 } else { mpt.virtual_address() },
            length: mpt.length(),
            table,
            last_page: (NO_PAGE, 0),
        }
    }
}

/// The page table of a (non-physical) region.
fn mpt_mtr(mpt: &Mpt) -> Mtr {
    Mtr::single(
        mpt.pbl_base_address() << 3,
        page_shift_from_field(mpt.pbl_ba_page_size()),
        page_shift_from_field(mpt.pbl_buffer_page_size()),
        mpt.pbl_size() as u64,
        mpt.pbl_hop_number(),
    )
}

/// The memory-protection block: the MPT cache and the limits from the capabilities.
#[derive(Debug, Clone)]
pub(crate) struct MemoryProtection {
    /// MPT index → the MPT as last read from host memory, decoded: forgotten with the
    /// context tables' remembered addresses (on every command, mailbox, configuration
    /// write and reset) and when the device itself changes an MPT.
    cache: FastHashMap<u32, CheckedMpt>,
    /// MPTs in the table (`num_mtpts`).
    count: u32,
    /// Protection domains (`num_pds`).
    pds: u32,
}

impl MemoryProtection {
    /// The block of a device with `count` MPTs and `pds` protection domains.
    pub fn new(count: u32, pds: u32) -> Self {
        Self {
            cache: FastHashMap::default(),
            count,
            pds,
        }
    }

    /// Forgets every cached MPT.
    pub fn forget(&mut self) {
        self.cache.clear();
    }

    fn mpt_index(&self, index: u32) -> Result<(), Rejection> {
        if index >= self.count {
            return Err(Rejection::index(index as u64, self.count as u64));
        }
        Ok(())
    }

    /// The MPT index a key names.
    fn index_of(&self, key: u32) -> u32 {
        key_to_index(key) & (self.count.next_power_of_two() - 1)
    }

    /// MPT `index`, from the MPT cache or else read from host memory (and then cached).
    /// With bus mastering off it fails as the read would, cached or not.
    fn cached_mpt(&mut self, io: &mut impl Io, index: u32) -> Result<CheckedMpt, Rejection> {
        if io.bus_master() {
            if let Some(mpt) = self.cache.get(&index) {
                return Ok(*mpt);
            }
        }
        let mpt = CheckedMpt::decode(&io.read_mpt(index)?.0);
        if self.cache.len() >= MPT_CACHE_CAPACITY {
            self.cache.clear();
        }
        self.cache.insert(index, mpt);
        Ok(mpt)
    }

    /// CREATE_MPT (mailbox 0x0D).
    pub fn create(&mut self, io: &mut impl Io, index: u32, mpt: Mpt) -> Result<(), Rejection> {
        self.mpt_index(index)?;
        let (current, address) = io.read_mpt(index)?;
        if matches!(current.mpt_state(), Ok(MptState::Valid | MptState::Free)) {
            return Err(Rejection::state(
                "MPT_ST",
                current.mpt_state_raw() as u64,
                format!("MPT {index:#x} not already in use"),
            ));
        }
        match mpt.mpt_state() {
            Ok(MptState::Valid | MptState::Free) => {}
            _ => {
                return Err(Rejection::parameter(
                    "MPT_ST",
                    mpt.mpt_state_raw() as u64,
                    "1 (valid) or 2 (free)",
                ))
            }
        }
        if self.index_of(mpt.lkey()) != index {
            return Err(Rejection::parameter(
                "LKEY",
                mpt.lkey() as u64,
                format!("a key whose rotr32(key, 8) is the MPT index {index:#x}"),
            ));
        }
        if mpt.protection_domain() >= self.pds {
            return Err(Rejection::parameter(
                "PD",
                mpt.protection_domain() as u64,
                format!("a PD number below {}", self.pds),
            ));
        }
        if (mpt.remote_write_enable() || mpt.atomic_enable()) && !mpt.local_write_enable() {
            return Err(Rejection::parameter(
                "LW_EN",
                0,
                "local write enabled whenever remote write or remote atomic is (IB rule)",
            ));
        }
        if mpt.memory_window() {
            return Err(Rejection::parameter(
                "MR_MW",
                1,
                "0 (memory region); memory windows are not supported",
            ));
        }
        if !mpt.physical_address() {
            let mtr = mpt_mtr(&mpt);
            mtr.validate()
                .map_err(|e| Rejection::parameter("PBL_BA", mpt.pbl_base_address() << 3, e.to_string()))?;
            let first_page_offset = if mpt.zero_based() {
                0
            } else {
                mpt.virtual_address() & (mtr.page_size() - 1)
            };
            let covered = mtr.size();
            if first_page_offset.saturating_add(mpt.length()) > covered {
                return Err(Rejection::parameter(
                    "LEN",
                    mpt.length(),
                    format!("a length that fits the {} page(s) of the PBL ({covered} bytes from offset {first_page_offset})", mpt.pbl_size()),
                ));
            }
        }
        io.write_mpt(address, &mpt)
    }

    /// DESTROY_MPT (mailbox 0x0F).
    pub fn destroy(&mut self, io: &mut impl Io, index: u32) -> Result<(), Rejection> {
        self.mpt_index(index)?;
        let (mut current, address) = io.read_mpt(index)?;
        if !matches!(current.mpt_state(), Ok(MptState::Valid | MptState::Free)) {
            return Err(Rejection::state(
                "MPT_ST",
                current.mpt_state_raw() as u64,
                format!("MPT {index:#x} in use"),
            ));
        }
        current.set_mpt_state_raw(0);
        io.write_mpt(address, &current)
    }

    /// QUERY_MPT (mailbox 0x62).
    pub fn query(&mut self, io: &mut impl Io, index: u32) -> Result<Mpt, Rejection> {
        self.mpt_index(index)?;
        let mpt = io.read_mpt(index)?.0;
        if !matches!(mpt.mpt_state(), Ok(MptState::Valid | MptState::Free)) {
            return Err(Rejection::state(
                "MPT_ST",
                mpt.mpt_state_raw() as u64,
                format!("MPT {index:#x} in use"),
            ));
        }
        Ok(mpt)
    }

    /// Checks an access of `length` bytes at IOVA `address` through `key` for a QP in
    /// `pd` needing `needed`, and returns how to translate it.
    pub fn check_access(
        &mut self,
        io: &mut impl Io,
        key: u32,
        pd: u32,
        address: u64,
        length: u64,
        needed: MrAccess,
    ) -> Result<MrTranslation, MrAccessError> {
        let index = self.index_of(key);
        let mpt = match self.cached_mpt(io, index) {
            Ok(mpt) if mpt.valid => mpt,
            _ => return Err(MrAccessError::InvalidKey { key }),
        };
        if mpt.lkey != key {
            return Err(MrAccessError::KeyMismatch {
                key,
                registered: mpt.lkey,
            });
        }
        if mpt.pd != pd {
            return Err(MrAccessError::ProtectionDomain {
                key,
                region_pd: mpt.pd,
                qp_pd: pd,
            });
        }
        if !mpt.granted.contains(needed) {
            return Err(MrAccessError::Access { key, needed });
        }
        let start = mpt.start;
        let end = start.checked_add(mpt.length);
        let access_end = address.checked_add(length);
        let inside =
            matches!((end, access_end), (Some(end), Some(access_end)) if address >= start && access_end <= end);
        if !inside {
            return Err(MrAccessError::Bounds {
                key,
                address,
                length,
                start,
                region_length: mpt.length,
            });
        }
        let Some((mtr, first_page_offset)) = mpt.table else {
            return Ok(MrTranslation {
                mtr: None,
                offset: address,
                first_bus: None,
            });
        };
        let offset = first_page_offset + (address - start);
        let page_mask = mtr.page_size() - 1;
        let (page, in_page) = (offset & !page_mask, offset & page_mask);
        let first_bus = match mpt.last_page {
            // The entry came from the MPT cache or a DMA read, so bus mastering is on,
            // and the MTT cache would give this address.
            (last, base) if last == page => Some(base + in_page),
            _ => match io.translate(&mtr, offset) {
                Some(result) => {
                    let bus = result.map_err(|e| MrAccessError::Translation {
                        key,
                        reason: e.to_string(),
                    })?;
                    // Only an access that stops inside its page is remembered: one that
                    // runs to the page's end is most likely followed by the next page
                    // (a stream), and remembering costs a second MPT-cache lookup.
                    if in_page.saturating_add(length) <= page_mask {
                        if let Some(entry) = self.cache.get_mut(&index) {
                            entry.last_page = (page, bus - in_page);
                        }
                    }
                    Some(bus)
                }
                None => None,
            },
        };
        Ok(MrTranslation {
            mtr: Some(mtr),
            offset,
            first_bus,
        })
    }

    /// SEND with invalidate: the region of `rkey` (in PD `pd`, no windows bound) becomes
    /// FREE, so the key stops working; the reason in words when it cannot.
    pub fn invalidate(&mut self, io: &mut impl Io, rkey: u32, pd: u32) -> Result<(), String> {
        let index = self.index_of(rkey);
        let (mut mpt, address) = io.read_mpt(index).map_err(|r| r.expected)?;
        if mpt.mpt_state() != Ok(MptState::Valid) {
            return Err(format!("MPT {index:#x} is not valid"));
        }
        if mpt.lkey() != rkey {
            return Err(format!("MPT {index:#x} has key {:#x}", mpt.lkey()));
        }
        if mpt.protection_domain() != pd {
            return Err(format!(
                "MPT {index:#x} is in PD {}, the QP in PD {pd}",
                mpt.protection_domain()
            ));
        }
        if mpt.mw_count() != 0 {
            return Err(format!("MPT {index:#x} has memory windows bound"));
        }
        mpt.set_mpt_state_raw(u8::from(MptState::Free));
        // The MPT cache must not keep the key working.
        self.cache.remove(&index);
        io.write_mpt(address, &mpt).map_err(|r| r.expected)
    }
}

#[cfg(test)]
mod tests {
    use rnic_firmware_if::bits::Layout;

    use super::*;

    /// SplitMix64: reproducible hostile MPT bytes.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn a_decoded_mpt_says_what_its_fields_say_for_any_bytes() {
        let mut state = 7;
        for round in 0..2_000u32 {
            let mut mpt = Mpt::zeroed();
            for byte in mpt.bytes_mut() {
                *byte = next(&mut state) as u8;
            }
            // Every other round a valid state, so both values of `valid` are covered.
            if round.is_multiple_of(2) {
                mpt.set_mpt_state(MptState::Valid);
            }
            let decoded = CheckedMpt::decode(&mpt);
            assert_eq!(decoded.valid, mpt.mpt_state() == Ok(MptState::Valid));
            assert_eq!(decoded.lkey, mpt.lkey());
            assert_eq!(decoded.pd, mpt.protection_domain());
            let rights = [
                (MrAccess::LOCAL_WRITE, mpt.local_write_enable()),
                (MrAccess::REMOTE_READ, mpt.remote_read_enable()),
                (MrAccess::REMOTE_WRITE, mpt.remote_write_enable()),
                (MrAccess::REMOTE_ATOMIC, mpt.atomic_enable()),
            ];
            for (right, enabled) in rights {
                assert_eq!(decoded.granted.contains(right), enabled, "{right:?}");
            }
            let start = if mpt.zero_based() { 0 } else { mpt.virtual_address() };
            assert_eq!((decoded.start, decoded.length), (start, mpt.length()));
            assert_eq!(decoded.last_page.0, NO_PAGE, "no page translated yet");
            match decoded.table {
                None => assert!(mpt.physical_address()),
                Some((mtr, first_page_offset)) => {
                    assert!(!mpt.physical_address());
                    assert_eq!(mtr, mpt_mtr(&mpt));
                    let expected = if mpt.zero_based() {
                        0
                    } else {
                        mpt.virtual_address() % mtr.page_size()
                    };
                    assert_eq!(first_page_offset, expected);
                }
            }
        }
    }
}
