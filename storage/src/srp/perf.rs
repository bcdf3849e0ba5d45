//! A benchmark workload on a logged-in [`Initiator`], the same shape as the NVMe-oF one
//! (`crate::nvmeof::perf`): a queue depth of READ/WRITE commands kept outstanding, a
//! read/write mix, random or sequential offsets, an I/O count or duration, optional
//! verification, and a [`PerfReport`] on virtual or wall time.
//!
//! Verification works as the NVMe-oF workload's: every I/O unit has a version; a write
//! fills its buffer with the pattern of (byte offset, version, seed) and, once GOOD,
//! makes that the unit's version; a read of a unit with a known version must find
//! exactly that pattern. Two I/Os never touch the same unit at once. A read-only run
//! with verification first writes the whole region.

use std::time::Instant;

use crate::nvmeof::perf::{fill_pattern, Pattern, TimeMode};
use crate::perf::{LatencyHistogram, PerfReport, ProgressLine};
use crate::rdma::DataBuffer;
use crate::scsi::cdb::{Cdb, ReadWrite};

use super::initiator::{Initiator, InitiatorError, IoData};

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Logical unit.
    pub lun: u16,
    /// Bytes per I/O (whole blocks).
    pub io_size: u32,
    /// Commands kept outstanding.
    pub queue_depth: usize,
    /// Percentage of reads (0..=100).
    pub read_percent: u8,
    /// Offsets.
    pub pattern: Pattern,
    /// Stop after this many I/Os.
    pub ios: Option<u64>,
    /// Stop after this long on the report's clock, ns.
    pub duration_ns: Option<u64>,
    /// Check every read against what was written.
    pub verify: bool,
    /// Seed of the offsets, the mix and the data.
    pub seed: u64,
    /// Blocks of the unit used, from LBA 0 (`None`: all).
    pub region_blocks: Option<u64>,
    /// Which clock the figures come from.
    pub mode: TimeMode,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            lun: 0,
            io_size: 4096,
            queue_depth: 32,
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
    /// fio's name for the workload.
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

const UNKNOWN: u32 = 0;
const POISONED: u32 = u32::MAX;

struct Slot {
    buffer: DataBuffer,
    unit: u64,
    read: bool,
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

struct RunClock {
    mode: TimeMode,
    wall: Instant,
}

impl RunClock {
    fn now(&self, initiator: &Initiator) -> u64 {
        match self.mode {
            TimeMode::Virtual => initiator.now(),
            TimeMode::Wall => self.wall.elapsed().as_nanos() as u64,
        }
    }
}

/// Runs `workload` on `initiator`; `progress` is called every 1024 I/Os.
///
/// # Errors
/// [`InitiatorError::Invalid`] for a workload the unit or the initiator cannot carry
/// (sizes, a queue depth above the credits, a data pool too small);
/// [`InitiatorError::Disconnected`] if the channel was lost.
pub fn run(
    initiator: &mut Initiator,
    workload: &Workload,
    progress: &mut dyn FnMut(ProgressLine),
) -> Result<PerfReport, InitiatorError> {
    let (blocks, block_size) = initiator.read_capacity(workload.lun)?;
    if workload.io_size == 0 || !workload.io_size.is_multiple_of(block_size) {
        return Err(InitiatorError::Invalid(format!(
            "I/O size {}: whole {block_size}-byte blocks",
            workload.io_size
        )));
    }
    // One credit stays for task management.
    let most = initiator.credits().saturating_sub(1) as usize;
    if workload.queue_depth == 0 || workload.queue_depth > most {
        return Err(InitiatorError::Invalid(format!(
            "queue depth {}: 1..={most} (the target's credits less one)",
            workload.queue_depth
        )));
    }
    if workload.read_percent > 100 || workload.ios.is_none() && workload.duration_ns.is_none() {
        return Err(InitiatorError::Invalid(
            "a read percentage above 100, or no I/O count nor duration".into(),
        ));
    }
    let blocks_per_io = u64::from(workload.io_size / block_size);
    let region = workload.region_blocks.unwrap_or(blocks).min(blocks);
    let units = region / blocks_per_io;
    if units < workload.queue_depth as u64 {
        return Err(InitiatorError::Invalid(format!(
            "{units} I/O units in the region, fewer than the {} I/Os outstanding",
            workload.queue_depth
        )));
    }
    let mut slots = Vec::with_capacity(workload.queue_depth);
    for _ in 0..workload.queue_depth {
        let Some(buffer) = initiator.allocate_buffer(workload.io_size) else {
            for slot in &slots {
                let slot: &Slot = slot;
                initiator.free_buffer(slot.buffer);
            }
            return Err(InitiatorError::Invalid(format!(
                "the data pool holds fewer than {} buffers of {} bytes",
                workload.queue_depth, workload.io_size
            )));
        };
        slots.push(Slot {
            buffer,
            unit: 0,
            read: true,
            version: 0,
            started: 0,
            busy: false,
        });
    }
    let result = drive(initiator, workload, &mut slots, units, blocks_per_io);
    let result = result.map(|mut report| {
        report.extra.push(("block_size".into(), f64::from(block_size)));
        report
    });
    if let Ok(report) = &result {
        progress(ProgressLine {
            ios: report.ios,
            fraction: Some(1.0),
            elapsed_s: report.elapsed_s,
            iops: report.iops,
            errors: report.errors + report.verify_failures,
        });
    }
    for slot in &slots {
        initiator.free_buffer(slot.buffer);
    }
    result
}

fn command(slot: &Slot, blocks_per_io: u64, read: bool) -> Cdb {
    let lba = slot.unit * blocks_per_io;
    let rw = ReadWrite {
        lba,
        blocks: blocks_per_io as u32,
        fua: false,
        protect: 0,
        sixteen: lba > u64::from(u32::MAX) || blocks_per_io > 0xFFFF,
    };
    if read {
        Cdb::Read(rw)
    } else {
        Cdb::Write(rw)
    }
}

fn submit(
    initiator: &mut Initiator,
    workload: &Workload,
    slot: &Slot,
    index: usize,
    blocks_per_io: u64,
) -> Result<(), InitiatorError> {
    let data = if slot.read {
        IoData::In(slot.buffer, workload.io_size)
    } else {
        IoData::Out(slot.buffer, workload.io_size)
    };
    // Credits come back with the responses: with one command per free slot the
    // initiator never runs out, but wait for one rather than fail if it does.
    loop {
        match initiator.submit(
            workload.lun,
            &command(slot, blocks_per_io, slot.read),
            data,
            index as u64,
        ) {
            Err(InitiatorError::Busy) => {
                if let Some(why) = initiator.lost() {
                    return Err(InitiatorError::Disconnected(why.to_string()));
                }
                let n = initiator.progress()?;
                initiator.reactor().idle(n > 0);
            }
            other => return other.map(|_| ()),
        }
    }
}

fn drive(
    initiator: &mut Initiator,
    workload: &Workload,
    slots: &mut [Slot],
    units: u64,
    blocks_per_io: u64,
) -> Result<PerfReport, InitiatorError> {
    let io_size = workload.io_size as usize;
    let mut versions = vec![UNKNOWN; units as usize];
    let mut in_use = vec![false; units as usize];
    let mut rng = Rng(workload.seed | 1);
    let mut cursor = 0u64;
    let mut data = vec![0u8; io_size];
    let mut expected = vec![0u8; io_size];
    if !workload.verify {
        fill_pattern(&mut data, 0, 1, workload.seed);
        for slot in slots.iter() {
            initiator.write_buffer(&slot.buffer, 0, &data)?;
        }
    } else if workload.read_percent == 100 {
        prefill(initiator, workload, slots, &mut versions, blocks_per_io)?;
    }
    let clock = RunClock {
        mode: workload.mode,
        wall: Instant::now(),
    };
    let wall_start = Instant::now();
    let start = clock.now(initiator);
    let deadline = workload.duration_ns.map(|d| start + d);
    let mut report = PerfReport {
        protocol: "srp".into(),
        workload: workload.name().into(),
        io_size: workload.io_size,
        queue_depth: workload.queue_depth,
        queues: 1,
        read_percent: workload.read_percent,
        mode: workload.mode.name().into(),
        ..PerfReport::default()
    };
    let immediate = io_size <= initiator.immediate_limit();
    let reads = f64::from(workload.read_percent) / 100.0;
    // Read: SRP_CMD, RDMA WRITE, SRP_RSP. Write: SRP_CMD (+ RDMA READ request and
    // response without immediate data), SRP_RSP.
    report.messages_per_io = reads * 3.0 + (1.0 - reads) * if immediate { 2.0 } else { 4.0 };
    let mut histogram = LatencyHistogram::new();
    let mut submitted = 0u64;
    let mut completions = Vec::with_capacity(slots.len());
    let mut stopping = false;
    loop {
        if !stopping {
            for (index, slot) in slots.iter_mut().enumerate() {
                if slot.busy {
                    continue;
                }
                if workload.ios.is_some_and(|limit| submitted >= limit)
                    || deadline.is_some_and(|d| clock.now(initiator) >= d)
                {
                    stopping = true;
                    break;
                }
                let unit = pick_unit(workload.pattern, &mut rng, &mut cursor, &in_use, units);
                let read = (rng.next() % 100) < u64::from(workload.read_percent);
                slot.unit = unit;
                slot.read = read;
                if !read {
                    let current = versions[unit as usize];
                    slot.version = if current >= POISONED - 1 { 1 } else { current + 1 };
                    if workload.verify {
                        fill_pattern(&mut data, unit * io_size as u64, slot.version, workload.seed);
                        initiator.write_buffer(&slot.buffer, 0, &data)?;
                    }
                }
                in_use[unit as usize] = true;
                slot.busy = true;
                slot.started = clock.now(initiator);
                submit(initiator, workload, slot, index, blocks_per_io)?;
                submitted += 1;
            }
        }
        completions.clear();
        let n = initiator.poll(&mut completions)?;
        for completion in &completions {
            let Some(slot) = slots.get_mut(completion.user_tag as usize) else {
                continue;
            };
            if !slot.busy {
                continue;
            }
            slot.busy = false;
            in_use[slot.unit as usize] = false;
            histogram.record(clock.now(initiator).saturating_sub(slot.started));
            if !completion.is_good() {
                report.errors += 1;
                if !slot.read {
                    versions[slot.unit as usize] = POISONED;
                }
                if report.failures.len() < 8 {
                    report.failures.push(format!(
                        "{} of unit {}: status {:#04x} {:?}",
                        if slot.read { "read" } else { "write" },
                        slot.unit,
                        completion.status,
                        completion.sense
                    ));
                }
                continue;
            }
            report.ios += 1;
            report.bytes += io_size as u64;
            if !slot.read {
                report.writes += 1;
                versions[slot.unit as usize] = slot.version;
                continue;
            }
            report.reads += 1;
            let version = versions[slot.unit as usize];
            if workload.verify && version != UNKNOWN && version != POISONED {
                initiator.read_buffer(&slot.buffer, 0, &mut data)?;
                fill_pattern(&mut expected, slot.unit * io_size as u64, version, workload.seed);
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
        if stopping && slots.iter().all(|s| !s.busy) {
            break;
        }
        if n == 0 {
            initiator.reactor().idle(false);
        }
    }
    report.elapsed_s = clock.now(initiator).saturating_sub(start) as f64 / 1e9;
    report.wall_s = wall_start.elapsed().as_secs_f64();
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
    initiator: &mut Initiator,
    workload: &Workload,
    slots: &mut [Slot],
    versions: &mut [u32],
    blocks_per_io: u64,
) -> Result<(), InitiatorError> {
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
            slot.read = false;
            next += 1;
            fill_pattern(&mut data, slot.unit * u64::from(workload.io_size), 1, workload.seed);
            initiator.write_buffer(&slot.buffer, 0, &data)?;
            slot.busy = true;
            submit(initiator, workload, slot, index, blocks_per_io)?;
        }
        completions.clear();
        let n = initiator.poll(&mut completions)?;
        for completion in &completions {
            let slot = &mut slots[completion.user_tag as usize];
            slot.busy = false;
            versions[slot.unit as usize] = if completion.is_good() { 1 } else { POISONED };
        }
        if next >= units && slots.iter().all(|s| !s.busy) {
            return Ok(());
        }
        if n == 0 {
            initiator.reactor().idle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_follow_fio() {
        let mut w = Workload::default();
        assert_eq!(w.name(), "randread");
        w.read_percent = 70;
        assert_eq!(w.name(), "randrw");
        w.pattern = Pattern::Sequential;
        w.read_percent = 0;
        assert_eq!(w.name(), "write");
    }

    #[test]
    fn units_are_never_shared() {
        let mut rng = Rng(9);
        let mut cursor = 0;
        let mut in_use = vec![false; 16];
        for _ in 0..16 {
            let unit = pick_unit(Pattern::Random, &mut rng, &mut cursor, &in_use, 16);
            assert!(!in_use[unit as usize]);
            in_use[unit as usize] = true;
        }
    }
}
