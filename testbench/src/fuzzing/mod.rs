//! Fuzz targets for every input that crosses a trust boundary of the device, as plain
//! functions `run(data: &[u8])` so that the cargo-fuzz crate (`fuzz/`) and the normal
//! test suite (`tests/fuzz_corpora.rs`, which replays every committed corpus and
//! regression input) run exactly the same code.
//!
//! Each target turns its bytes into a structured input with [`arbitrary`] (a sequence of
//! operations where the real input is a sequence), drives the device through the register
//! harness, and asserts invariants, not only the absence of panics: DMA only inside the
//! windows the driver granted ([`memory`]), objects of another PD or QP untouched, QPs
//! only in legal states ([`live`]), and what each target adds (see its module). A failed
//! invariant panics, which libFuzzer reports as a crash with the input that caused it.
//!
//! Stateful targets bring a device up once per process ([`live::LiveBed`]) and return to
//! that moment before each input: host memory frame by frame ([`memory::FuzzMemory`]),
//! the device with [`rnic_hw_model::Device::fork`].
//!
//! `docs/fuzzing.md` lists the targets, how to run them, and the recorded campaign.

pub mod bar_access;
pub mod cm_mads;
pub mod cmdq;
pub mod live;
pub mod mailbox;
pub mod memory;
pub mod mtt;
pub mod parse_frame;
pub mod rx_frames;
pub mod work_requests;

use arbitrary::Arbitrary;
use rnic_hw_model::wire::{icrc, ipv4};

use live::LiveBed;

/// A memory key as an input names it: one of the bed's regions, or any value.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum KeyChoice {
    /// The key of region `index` (modulo the regions the caller allows).
    Region(u8),
    /// Any 32-bit key.
    Raw(u32),
}

/// A virtual address as an input names it: an offset into one of the bed's regions
/// (possibly past its end), or any value.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum AddressChoice {
    /// `offset` bytes into region `index` (modulo 5).
    Region {
        /// Region index.
        index: u8,
        /// Byte offset.
        offset: u16,
    },
    /// Any 64-bit address.
    Raw(u64),
}

/// Regions a WQE of PD 1 may name as its own buffers: A, A2, C and the victim's D (which
/// the device must refuse), never B, whose point is that nobody names it.
pub const LOCAL_KEYS: &[u8] = &[0, 1, 3, 4];
/// Regions a remote key may name: every one.
pub const REMOTE_KEYS: &[u8] = &[0, 1, 2, 3, 4];

/// A local SGE as an input names it: `length` bytes at `offset` into the region of `key`
/// (or at `offset` itself for a raw key).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct LocalSge {
    /// The L_Key.
    pub key: KeyChoice,
    /// Byte offset into the region.
    pub offset: u16,
    /// Length in bytes.
    pub length: u16,
}

impl LocalSge {
    /// The SGE, choosing among [`LOCAL_KEYS`]; a raw key equal to region B's becomes
    /// another (B is the region no WQE names, so any DMA to it is a violation).
    pub fn sge(self, bed: &LiveBed) -> rnic_firmware_if::wqe::Sge {
        let mut key = self.key.key(bed, LOCAL_KEYS);
        if key == bed.region(2).key {
            key ^= 1;
        }
        let base = bed
            .regions
            .iter()
            .find(|r| r.region.key == key)
            .map_or(0, |r| r.region.iova);
        rnic_firmware_if::wqe::Sge::new(u32::from(self.length), key, base.wrapping_add(u64::from(self.offset)))
    }
}

impl KeyChoice {
    /// The key, choosing among the bed's regions `allowed` (indices into
    /// [`LiveBed::regions`]).
    pub fn key(self, bed: &LiveBed, allowed: &[u8]) -> u32 {
        match self {
            KeyChoice::Region(i) => bed.region(allowed[usize::from(i) % allowed.len()]).key,
            KeyChoice::Raw(key) => key,
        }
    }
}

impl AddressChoice {
    /// The address.
    pub fn address(self, bed: &LiveBed) -> u64 {
        match self {
            AddressChoice::Region { index, offset } => bed.region(index).iova.wrapping_add(u64::from(offset)),
            AddressChoice::Raw(address) => address,
        }
    }
}

/// Recomputes a frame's IPv4 header checksum and ICRC in place, trusting its length fields
/// as far as they fit (and leaving it alone where they do not), so that a mutated frame
/// still gets past the ICRC check to the transport.
pub fn seal(frame: &mut [u8]) {
    let mut ip = 14;
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        ip += 4;
    }
    let Some(&first) = frame.get(ip) else { return };
    let ip_len = if first >> 4 == 6 {
        40
    } else {
        let ihl = usize::from(first & 0x0F) * 4;
        if ihl < 20 || frame.len() < ip + ihl {
            return;
        }
        frame[ip + 10] = 0;
        frame[ip + 11] = 0;
        let sum = ipv4::checksum(&frame[ip..ip + ihl]);
        frame[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        ihl
    };
    let udp = ip + ip_len;
    let Some(length) = frame.get(udp + 4..udp + 6) else {
        return;
    };
    let end = udp + usize::from(u16::from_be_bytes([length[0], length[1]]));
    if end < udp + 12 || end > frame.len() {
        return;
    }
    let value = icrc::icrc(&frame[ip..end - 4]);
    frame[end - 4..end].copy_from_slice(&icrc::to_wire(value));
}

/// Runs `f` on this thread's bed for a target, bringing it up on first use and returning
/// it to its checkpoint first.
pub(crate) fn with_bed<R>(
    bed: &'static std::thread::LocalKey<std::cell::RefCell<Option<LiveBed>>>,
    victim: live::Victim,
    f: impl FnOnce(&mut LiveBed) -> R,
) -> R {
    bed.with(|cell| {
        let mut slot = cell.borrow_mut();
        let bed = slot.get_or_insert_with(|| LiveBed::new(victim));
        bed.begin();
        f(bed)
    })
}
