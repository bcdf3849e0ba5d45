//! A benchmark workload on a connected [`Host`], in the manner of `spdk_nvme_perf` and
//! fio: a queue depth of I/Os kept outstanding on each I/O queue, a read/write mix,
//! random or sequential offsets, a duration or I/O count, and optional verification.
//!
//! Verification works like fio's: every I/O unit (an `io_size`-aligned piece of the
//! region) has a version; a write fills its buffer with a pattern of (byte offset in
//! the namespace, version, seed) and, once it completed, makes that the unit's version;
//! a read of a unit with a known version must find exactly that pattern — data from the
//! wrong place, a stale write or a corrupted byte all fail. Two I/Os never touch the same
//! unit at once. A read-only run with verification first writes the whole region.

use std::time::Instant;

use crate::perf::{LatencyHistogram, PerfReport, ProgressLine};
use crate::rdma::DataBuffer;

use super::host::{Host, HostError, IoOp, IoRequest};
use super::wire::status::Status;

/// Where I/Os go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Uniformly random units.
    Random,
    /// One unit after the other, wrapping around.
    Sequential,
}

/// Which clock the figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeMode {
    /// The host's reactor clock: virtual time on an embedded fabric (the modelled NIC).
    Virtual,
    /// The wall clock: how fast this machine runs the stack and the emulator.
    Wall,
}

impl TimeMode {
    /// "virtual" or "wall".
    pub fn name(self) -> &'static str {
        match self {
            TimeMode::Virtual => "virtual",
            TimeMode::Wall => "wall",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Namespace.
    pub nsid: u32,
    /// Bytes per I/O (whole blocks, at most the controller's maximum transfer).
    pub io_size: u32,
    /// I/Os kept outstanding per queue.
    pub queue_depth: usize,
    /// I/O queues driven (at most the host's).
    pub queues: usize,
    /// Percentage of reads (0..=100).
    pub read_percent: u8,
    /// Offsets.
    pub pattern: Pattern,
    /// Stop after this many I/Os (all queues).
    pub ios: Option<u64>,
    /// Stop after this long on the report's clock, ns.
    pub duration_ns: Option<u64>,
    /// Check every read against what was written.
    pub verify: bool,
    /// Seed of the offsets, the mix and the data.
    pub seed: u64,
    /// Blocks of the namespace used, from LBA 0 (`None`: all).
    pub region_blocks: Option<u64>,
    /// Which clock the figures come from.
    pub mode: TimeMode,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            nsid: 1,
            io_size: 4096,
            queue_depth: 32,
            queues: 1,
            read_percent: 100,
            pattern: Pattern::Random,
            ios: Some(10_000),
            duration_ns: None,
            verify: false,
            seed: 0x5EED,
            region_blocks: None,
            mode: TimeMode::Virtual,
        }
    }
}

impl Workload {
    /// fio's name for the workload: randread, randwrite, randrw, read, write, rw.
    pub fn name(&self) -> &'static str {
        match (self.pattern, self.read_percent) {
            (Pattern::Random, 100) => "randread",
            (Pattern::Random, 0) => "randwrite",
            (Pattern::Random, _) => "randrw",
            (Pattern::Sequential, 100) => "read",
            (Pattern::Sequential, 0) => "write",
            (Pattern::Sequential, _) => "rw",
        }
    }
}

/// Unit version: never written in this run (content unknown).
const UNKNOWN: u32 = 0;
/// Unit version: a write failed (content unknown for good).
const POISONED: u32 = u32::MAX;

struct Slot {
    queue: usize,
    buffer: DataBuffer,
    unit: u64,
    op: IoOp,
    version: u32,
    started: u64,
    busy: bool,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Fills `out` with the pattern of the bytes starting at namespace byte `offset`
/// (a multiple of 8) at `version`: each 8-byte word is a hash of its own offset, the
/// version and the seed.
pub fn fill_pattern(out: &mut [u8], offset: u64, version: u32, seed: u64) {
    let base = seed ^ u64::from(version).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let word = (offset / 8 + i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ base;
        let word = word ^ (word >> 32);
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
}

/// The clock of a run.
struct RunClock {
    mode: TimeMode,
    wall: Instant,
}

impl RunClock {
    fn now(&self, host: &Host) -> u64 {
        match self.mode {
            TimeMode::Virtual => host.now(),
            TimeMode::Wall => self.wall.elapsed().as_nanos() as u64,
        }
    }
}

/// Runs `workload` on `host`; `progress` is called every 1024 I/Os.
///
/// # Errors
/// [`HostError::Config`] for a workload the host or namespace cannot carry (sizes,
/// queues, a data pool too small for the queue depth); [`HostError::Disconnected`] if
/// the connection was lost for good.
pub fn run(
    host: &mut Host,
    workload: &Workload,
    progress: &mut dyn FnMut(ProgressLine),
) -> Result<PerfReport, HostError> {
    let namespace = host
        .namespace(workload.nsid)
        .ok_or_else(|| HostError::Config(format!("namespace {} is not active", workload.nsid)))?;
    let block_size = namespace.block_size;
    if workload.io_size == 0 || !workload.io_size.is_multiple_of(block_size) || workload.io_size > host.max_transfer() {
        return Err(HostError::Config(format!(
            "I/O size {}: whole {block_size}-byte blocks up to {} bytes",
            workload.io_size,
            host.max_transfer()
        )));
    }
    if workload.queues == 0 || workload.queues > host.io_queues() {
        return Err(HostError::Config(format!(
            "{} queues: the host has {}",
            workload.queues,
            host.io_queues()
        )));
    }
    if workload.queue_depth == 0 || workload.queue_depth > usize::from(host.io_queue_entries()) {
        return Err(HostError::Config(format!(
            "queue depth {}: 1..={}",
            workload.queue_depth,
            host.io_queue_entries()
        )));
    }
    if workload.read_percent > 100 {
        return Err(HostError::Config(format!("{}% reads", workload.read_percent)));
    }
    if workload.ios.is_none() && workload.duration_ns.is_none() {
        return Err(HostError::Config("neither an I/O count nor a duration".into()));
    }
    let blocks_per_io = u64::from(workload.io_size / block_size);
    let region = workload.region_blocks.unwrap_or(namespace.blocks).min(namespace.blocks);
    let units = region / blocks_per_io;
    let outstanding = (workload.queue_depth * workload.queues) as u64;
    if units < outstanding {
        return Err(HostError::Config(format!(
            "{units} I/O units in the region, fewer than the {outstanding} I/Os outstanding"
        )));
    }
    let mut slots = Vec::with_capacity(outstanding as usize);
    for queue in 0..workload.queues {
        for _ in 0..workload.queue_depth {
            let buffer = host.allocate_buffer(queue, workload.io_size).ok_or_else(|| {
                HostError::Config(format!(
                    "queue {queue}'s data pool holds fewer than {} buffers of {} bytes",
                    workload.queue_depth, workload.io_size
                ))
            })?;
            slots.push(Slot {
                queue,
                buffer,
                unit: 0,
                op: IoOp::Read,
                version: 0,
                started: 0,
                busy: false,
            });
        }
    }
    let result = drive(host, workload, &mut slots, units, blocks_per_io, progress);
    for slot in &slots {
        host.free_buffer(slot.queue, slot.buffer);
    }
    result
}

fn drive(
    host: &mut Host,
    workload: &Workload,
    slots: &mut [Slot],
    units: u64,
    blocks_per_io: u64,
    progress: &mut dyn FnMut(ProgressLine),
) -> Result<PerfReport, HostError> {
    let io_size = workload.io_size as usize;
    let mut versions = vec![UNKNOWN; units as usize];
    let mut in_use = vec![false; units as usize];
    let mut rng = Rng(workload.seed | 1);
    let mut cursor = 0u64;
    let mut data = vec![0u8; io_size];
    let mut expected = vec![0u8; io_size];
    if !workload.verify {
        // Writes carry a fixed pattern; nothing checks it.
        for slot in slots.iter() {
            fill_pattern(&mut data, 0, 1, workload.seed);
            host.write_buffer(slot.queue, &slot.buffer, 0, &data)?;
        }
    }
    if workload.verify && workload.read_percent == 100 {
        prefill(host, workload, slots, &mut versions, blocks_per_io)?;
    }
    let clock = RunClock {
        mode: workload.mode,
        wall: Instant::now(),
    };
    let wall_start = Instant::now();
    let cpu_start = crate::perf::thread_cpu_seconds();
    let start = clock.now(host);
    let deadline = workload.duration_ns.map(|d| start + d);
    let reconnects_before = host.counters().reconnects;
    let mut report = PerfReport {
        protocol: "nvmf".into(),
        workload: workload.name().into(),
        io_size: workload.io_size,
        queue_depth: workload.queue_depth,
        queues: workload.queues,
        read_percent: workload.read_percent,
        mode: workload.mode.name().into(),
        ..PerfReport::default()
    };
    let in_capsule = workload.io_size as usize <= host.in_capsule_limit();
    let write_messages = if in_capsule { 2.0 } else { 3.0 };
    let reads = f64::from(workload.read_percent) / 100.0;
    report.messages_per_io = reads * 3.0 + (1.0 - reads) * write_messages;
    let mut histogram = LatencyHistogram::new();
    let mut submitted = 0u64;
    let mut done = 0u64;
    let mut completions = Vec::with_capacity(slots.len());
    let mut since_progress = 0u64;
    let mut stopping = false;
    loop {
        // Keep every idle slot busy until the run stops.
        if !stopping {
            for (index, slot) in slots.iter_mut().enumerate() {
                if slot.busy {
                    continue;
                }
                if workload.ios.is_some_and(|limit| submitted >= limit)
                    || deadline.is_some_and(|d| clock.now(host) >= d)
                {
                    stopping = true;
                    break;
                }
                let unit = pick_unit(workload.pattern, &mut rng, &mut cursor, &in_use, units);
                let read = (rng.next() % 100) < u64::from(workload.read_percent);
                slot.unit = unit;
                slot.op = if read { IoOp::Read } else { IoOp::Write };
                if !read {
                    let current = versions[unit as usize];
                    slot.version = if current == POISONED || current == POISONED - 1 {
                        1
                    } else {
                        current + 1
                    };
                    if workload.verify {
                        fill_pattern(
                            &mut data,
                            unit * u64::from(workload.io_size),
                            slot.version,
                            workload.seed,
                        );
                        host.write_buffer(slot.queue, &slot.buffer, 0, &data)?;
                    }
                }
                in_use[unit as usize] = true;
                slot.busy = true;
                slot.started = clock.now(host);
                let request = IoRequest {
                    op: slot.op,
                    nsid: workload.nsid,
                    slba: unit * blocks_per_io,
                    blocks: blocks_per_io as u32,
                    fua: false,
                    buffer: Some(slot.buffer),
                };
                host.submit(slot.queue, request, index as u64)?;
                submitted += 1;
            }
        }
        completions.clear();
        let n = host.poll(&mut completions)?;
        for completion in &completions {
            let index = completion.tag as usize;
            let Some(slot) = slots.get_mut(index) else { continue };
            if !slot.busy {
                continue;
            }
            slot.busy = false;
            in_use[slot.unit as usize] = false;
            done += 1;
            since_progress += 1;
            histogram.record(clock.now(host).saturating_sub(slot.started));
            if completion.status != Status::SUCCESS {
                report.errors += 1;
                if slot.op == IoOp::Write {
                    versions[slot.unit as usize] = POISONED;
                }
                if report.failures.len() < 8 {
                    report.failures.push(format!(
                        "{:?} of unit {} on queue {}: {}",
                        slot.op, slot.unit, slot.queue, completion.status
                    ));
                }
                continue;
            }
            report.ios += 1;
            report.bytes += io_size as u64;
            match slot.op {
                IoOp::Write => {
                    report.writes += 1;
                    versions[slot.unit as usize] = slot.version;
                }
                _ => {
                    report.reads += 1;
                    let version = versions[slot.unit as usize];
                    if workload.verify && version != UNKNOWN && version != POISONED {
                        host.read_buffer(slot.queue, &slot.buffer, 0, &mut data)?;
                        fill_pattern(
                            &mut expected,
                            slot.unit * u64::from(workload.io_size),
                            version,
                            workload.seed,
                        );
                        report.verified_reads += 1;
                        if data != expected {
                            report.verify_failures += 1;
                            if report.failures.len() < 8 {
                                let at = data.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(0);
                                report.failures.push(format!(
                                    "read of unit {} (version {version}) differs at byte {at}: {:#04x}, expected {:#04x}",
                                    slot.unit, data[at], expected[at]
                                ));
                            }
                        }
                    }
                }
            }
        }
        if since_progress >= 1024 {
            since_progress = 0;
            let elapsed = clock.now(host).saturating_sub(start) as f64 / 1e9;
            progress(ProgressLine {
                ios: done,
                fraction: workload
                    .ios
                    .map(|limit| done as f64 / limit.max(1) as f64)
                    .or(workload.duration_ns.map(|d| elapsed * 1e9 / d.max(1) as f64)),
                elapsed_s: elapsed,
                iops: if elapsed > 0.0 { done as f64 / elapsed } else { 0.0 },
                errors: report.errors + report.verify_failures,
            });
        }
        if stopping && slots.iter().all(|s| !s.busy) {
            break;
        }
        if n == 0 {
            host.reactor().idle(false);
        }
    }
    report.elapsed_s = clock.now(host).saturating_sub(start) as f64 / 1e9;
    report.wall_s = wall_start.elapsed().as_secs_f64();
    report.cpu_s = (crate::perf::thread_cpu_seconds() - cpu_start).max(0.0);
    report.reconnects = host.counters().reconnects - reconnects_before;
    report.finish(&histogram);
    Ok(report)
}

fn pick_unit(pattern: Pattern, rng: &mut Rng, cursor: &mut u64, in_use: &[bool], units: u64) -> u64 {
    let mut unit = match pattern {
        Pattern::Random => rng.next() % units,
        Pattern::Sequential => {
            let unit = *cursor;
            *cursor = (*cursor + 1) % units;
            unit
        }
    };
    // There are more units than I/Os outstanding: a free one is near.
    while in_use[unit as usize] {
        unit = (unit + 1) % units;
        if pattern == Pattern::Sequential {
            *cursor = (unit + 1) % units;
        }
    }
    unit
}

/// Writes every unit of the region once (version 1), for a verified read-only run.
fn prefill(
    host: &mut Host,
    workload: &Workload,
    slots: &mut [Slot],
    versions: &mut [u32],
    blocks_per_io: u64,
) -> Result<(), HostError> {
    let mut data = vec![0u8; workload.io_size as usize];
    let units = versions.len() as u64;
    let mut next = 0u64;
    let mut completions = Vec::new();
    loop {
        for (index, slot) in slots.iter_mut().enumerate() {
            if slot.busy || next >= units {
                continue;
            }
            slot.unit = next;
            next += 1;
            fill_pattern(&mut data, slot.unit * u64::from(workload.io_size), 1, workload.seed);
            host.write_buffer(slot.queue, &slot.buffer, 0, &data)?;
            slot.busy = true;
            host.submit(
                slot.queue,
                IoRequest {
                    op: IoOp::Write,
                    nsid: workload.nsid,
                    slba: slot.unit * blocks_per_io,
                    blocks: blocks_per_io as u32,
                    fua: false,
                    buffer: Some(slot.buffer),
                },
                index as u64,
            )?;
        }
        completions.clear();
        let n = host.poll(&mut completions)?;
        for completion in &completions {
            let slot = &mut slots[completion.tag as usize];
            slot.busy = false;
            versions[slot.unit as usize] = if completion.status.is_success() { 1 } else { POISONED };
        }
        if next >= units && slots.iter().all(|s| !s.busy) {
            return Ok(());
        }
        if n == 0 {
            host.reactor().idle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_depend_on_offset_version_and_seed() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        fill_pattern(&mut a, 4096, 1, 7);
        fill_pattern(&mut b, 4096, 1, 7);
        assert_eq!(a, b);
        fill_pattern(&mut b, 8192, 1, 7);
        assert_ne!(a, b);
        fill_pattern(&mut b, 4096, 2, 7);
        assert_ne!(a, b);
        fill_pattern(&mut b, 4096, 1, 8);
        assert_ne!(a, b);
        // A shifted window of the same data is the same bytes.
        let mut whole = [0u8; 128];
        fill_pattern(&mut whole, 4096, 3, 7);
        let mut tail = [0u8; 64];
        fill_pattern(&mut tail, 4096 + 64, 3, 7);
        assert_eq!(&whole[64..], &tail);
    }

    #[test]
    fn workload_names() {
        let mut w = Workload::default();
        assert_eq!(w.name(), "randread");
        w.read_percent = 50;
        assert_eq!(w.name(), "randrw");
        w.pattern = Pattern::Sequential;
        w.read_percent = 0;
        assert_eq!(w.name(), "write");
    }

    #[test]
    fn units_are_never_shared() {
        let mut rng = Rng(3);
        let mut cursor = 0;
        let mut in_use = vec![false; 8];
        for _ in 0..8 {
            let unit = pick_unit(Pattern::Random, &mut rng, &mut cursor, &in_use, 8);
            assert!(!in_use[unit as usize]);
            in_use[unit as usize] = true;
        }
    }
}
