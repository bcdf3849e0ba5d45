//! The cycle-approximate timing model: what every stage of the pipeline costs in virtual
//! time, from documented parameters (see `docs/timing.md`).
//!
//! [`TimingParams`] holds the parameters (units in their names and docs), loaded from a
//! named preset ([`TimingParams::preset`]: `hns-25g`, `hns-100g`, `hns-100g-b2b`, `ideal`) and overridden
//! from TOML ([`TimingParams::from_toml`], [`TimingParams::set`]). [`TimingModel`] turns
//! them into costs (PCIe transfer times with TLP overheads, serialisation with every
//! per-frame overhead) and keeps the model's state: the MTT translation cache and the
//! context cache (real LRU caches, so a thrashing access pattern really costs more), and
//! per-stage totals ([`StageTotals`], also emitted as `tracing` events with target
//! `rnic::timing`).
//!
//! Everything is integer picoseconds: the same inputs give the same times, bit for bit.

mod lru;

use serde::{Deserialize, Serialize};

pub use lru::LruCache;

use crate::time::Picoseconds;

/// The timing parameters. Every field carries its unit in its name; `docs/timing.md`
/// gives each a one-line justification or public source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingParams {
    /// Device core clock, MHz (pipeline stage cycles and cache hits are counted in it).
    pub clock_mhz: u64,
    /// PCIe generation 1..=5 (2.5, 5, 8, 16, 32 GT/s per lane; 8b/10b up to Gen2,
    /// 128b/130b from Gen3).
    pub pcie_gen: u8,
    /// PCIe link width, lanes.
    pub pcie_lanes: u32,
    /// PCIe max payload size, bytes (largest TLP payload: write requests and read
    /// completions are split into TLPs of at most this).
    pub pcie_max_payload_bytes: u64,
    /// PCIe max read request size, bytes (one read request per this many bytes).
    pub pcie_max_read_request_bytes: u64,
    /// PCIe per-TLP overhead, bytes (framing, sequence number, 3–4 DW header, LCRC).
    pub pcie_tlp_overhead_bytes: u64,
    /// PCIe read round trip, ps: from a device read request to the first completion byte
    /// (root complex and host memory).
    pub pcie_read_latency_ps: u64,
    /// PCIe posted write to host-memory visibility, ps (CQE, EQE, MSI-X).
    pub pcie_write_latency_ps: u64,
    /// Doorbell MMIO write, ps: from the CPU's store to the device acting on it.
    pub doorbell_ps: u64,
    /// Send WQE size read by a WQE fetch, bytes.
    pub wqe_bytes: u64,
    /// MTT translation cache entries (one per buffer page); 0 disables the cache.
    pub mtt_cache_entries: usize,
    /// MTT translation cache hit, device cycles.
    pub mtt_hit_cycles: u64,
    /// Context (QPC) cache entries; 0 disables the cache.
    pub context_cache_entries: usize,
    /// Context cache miss, ps (a QPC read from host memory).
    pub context_miss_ps: u64,
    /// Transmit pipeline, device cycles (from payload in the device to the MAC).
    pub tx_pipeline_cycles: u64,
    /// Receive pipeline, device cycles (from the MAC to the DMA engine: parse, PSN and
    /// key checks).
    pub rx_pipeline_cycles: u64,
    /// Frames the transmit engine may have in flight (outstanding payload reads).
    pub tx_pipeline_depth: usize,
    /// Ethernet link rate, Gb/s.
    pub link_gbps: u64,
    /// Preamble and start-of-frame delimiter, bytes.
    pub preamble_bytes: u64,
    /// Inter-frame gap, bytes.
    pub ifg_bytes: u64,
    /// Frame check sequence, bytes (frames in the model carry no FCS).
    pub fcs_bytes: u64,
    /// Propagation and switch latency between two ports, ps. The device does not use it:
    /// whoever builds the fabric does (`FabricConfig::link_latency`; `rnic-bench`).
    pub propagation_ps: u64,
    /// Command-queue command handled by the firmware, ps.
    pub firmware_command_ps: u64,
    /// Mailbox command, ps.
    pub mailbox_ps: u64,
    /// Function reset, ps.
    pub reset_ps: u64,
}

/// The preset names [`TimingParams::preset`] knows.
pub const PRESETS: [&str; 4] = ["hns-25g", "hns-100g", "hns-100g-b2b", "ideal"];

/// Why a timing configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TimingError {
    /// No preset of that name.
    #[error("unknown timing preset {0:?}: hns-25g, hns-100g, hns-100g-b2b or ideal")]
    UnknownPreset(String),
    /// The TOML did not parse or named an unknown parameter.
    #[error("timing parameters: {0}")]
    Toml(String),
    /// A parameter is out of range.
    #[error("timing parameter {0}")]
    Range(String),
}

impl Default for TimingParams {
    fn default() -> Self {
        Self::hns_100g()
    }
}

impl TimingParams {
    /// An hns-like 100 Gb/s NIC on PCIe Gen3 x16.
    pub const fn hns_100g() -> Self {
        Self {
            clock_mhz: 500,
            pcie_gen: 3,
            pcie_lanes: 16,
            pcie_max_payload_bytes: 256,
            pcie_max_read_request_bytes: 512,
            pcie_tlp_overhead_bytes: 24,
            pcie_read_latency_ps: 700_000,
            pcie_write_latency_ps: 300_000,
            doorbell_ps: 150_000,
            wqe_bytes: 64,
            mtt_cache_entries: 4096,
            mtt_hit_cycles: 2,
            context_cache_entries: 1024,
            context_miss_ps: 800_000,
            tx_pipeline_cycles: 100,
            rx_pipeline_cycles: 100,
            tx_pipeline_depth: 16,
            link_gbps: 100,
            preamble_bytes: 8,
            ifg_bytes: 12,
            fcs_bytes: 4,
            propagation_ps: 1_000_000,
            firmware_command_ps: 2_000_000,
            mailbox_ps: 5_000_000,
            reset_ps: 10_000_000,
        }
    }

    /// An hns-like 25 Gb/s NIC on PCIe Gen3 x16.
    pub const fn hns_25g() -> Self {
        let mut p = Self::hns_100g();
        p.link_gbps = 25;
        p
    }

    /// Two 100 Gb/s NICs cabled back to back, fitted to a public `ib_send_lat`
    /// measurement of such a pair (docs/timing.md, "The back-to-back preset"): a cable and
    /// two PHYs instead of a switch, a faster host read round trip and shorter pipelines
    /// than `hns-100g`'s deliberately padded ones. Used with inline data and direct WQE
    /// (`rnic-bench --inline-size 188 --direct-wqe`), as that measurement was.
    pub const fn hns_100g_b2b() -> Self {
        let mut p = Self::hns_100g();
        p.propagation_ps = 150_000;
        p.pcie_read_latency_ps = 550_000;
        p.tx_pipeline_cycles = 50;
        p.rx_pipeline_cycles = 50;
        p
    }

    /// Zero device latency: infinitely fast PCIe and pipeline, caches that always hit for
    /// free; only the wire (serialisation at 100 Gb/s with its overheads) and the control
    /// path's firmware times remain.
    pub const fn ideal() -> Self {
        let mut p = Self::hns_100g();
        p.pcie_lanes = 0; // 0 lanes: PCIe transfers take no time
        p.pcie_read_latency_ps = 0;
        p.pcie_write_latency_ps = 0;
        p.doorbell_ps = 0;
        p.mtt_hit_cycles = 0;
        p.context_miss_ps = 0;
        p.tx_pipeline_cycles = 0;
        p.rx_pipeline_cycles = 0;
        p
    }

    /// The preset called `name`.
    pub fn preset(name: &str) -> Result<Self, TimingError> {
        match name {
            "hns-100g" => Ok(Self::hns_100g()),
            "hns-25g" => Ok(Self::hns_25g()),
            "hns-100g-b2b" => Ok(Self::hns_100g_b2b()),
            "ideal" => Ok(Self::ideal()),
            other => Err(TimingError::UnknownPreset(other.into())),
        }
    }

    /// Parameters from TOML: an optional `preset = "NAME"` (default `hns-100g`) and any
    /// parameters, which override the preset's.
    pub fn from_toml(text: &str) -> Result<Self, TimingError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| TimingError::Toml(e.to_string()))?;
        let base = match table.remove("preset") {
            Some(toml::Value::String(name)) => Self::preset(&name)?,
            Some(other) => return Err(TimingError::Toml(format!("preset {other:?}: a string"))),
            None => Self::default(),
        };
        base.merged(table)
    }

    /// These parameters with `table`'s values in place of theirs.
    fn merged(&self, overrides: toml::Table) -> Result<Self, TimingError> {
        let mut table = toml::Table::try_from(self).map_err(|e| TimingError::Toml(e.to_string()))?;
        for (key, value) in overrides {
            if !table.contains_key(&key) {
                return Err(TimingError::Toml(format!("unknown parameter {key:?}")));
            }
            table.insert(key, value);
        }
        let params: Self = table
            .try_into()
            .map_err(|e: toml::de::Error| TimingError::Toml(e.to_string()))?;
        params.validate()?;
        Ok(params)
    }

    /// Overrides one parameter from `name=value` (value in TOML syntax).
    pub fn set(&mut self, assignment: &str) -> Result<(), TimingError> {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| TimingError::Toml(format!("{assignment:?}: expected NAME=VALUE")))?;
        let line = format!("{} = {}", name.trim(), value.trim());
        let table: toml::Table = line
            .parse()
            .map_err(|e: toml::de::Error| TimingError::Toml(e.to_string()))?;
        *self = self.merged(table)?;
        Ok(())
    }

    /// Checks the ranges the cost functions rely on.
    pub fn validate(&self) -> Result<(), TimingError> {
        if self.clock_mhz == 0 {
            return Err(TimingError::Range("clock_mhz: at least 1".into()));
        }
        if !(1..=5).contains(&self.pcie_gen) {
            return Err(TimingError::Range("pcie_gen: 1..=5".into()));
        }
        if self.pcie_max_payload_bytes == 0 || self.pcie_max_read_request_bytes == 0 {
            return Err(TimingError::Range(
                "pcie_max_payload_bytes/pcie_max_read_request_bytes: at least 1".into(),
            ));
        }
        if self.link_gbps == 0 {
            return Err(TimingError::Range("link_gbps: at least 1".into()));
        }
        if self.tx_pipeline_depth == 0 {
            return Err(TimingError::Range("tx_pipeline_depth: at least 1".into()));
        }
        Ok(())
    }

    /// `cycles` device cycles, in ps.
    pub fn cycles(&self, cycles: u64) -> Picoseconds {
        Picoseconds(cycles * 1_000_000 / self.clock_mhz)
    }

    /// Picoseconds one byte of one lane takes on the PCIe link, as a fraction
    /// (numerator, denominator) per lane count: 8 bits × encoding / GT/s.
    fn pcie_byte_time(&self) -> (u128, u128) {
        // (GT/s × 10, encoding payload bits, encoding line bits)
        let (gts_x10, payload, line): (u128, u128, u128) = match self.pcie_gen {
            1 => (25, 8, 10),
            2 => (50, 8, 10),
            3 => (80, 128, 130),
            4 => (160, 128, 130),
            _ => (320, 128, 130),
        };
        // ps per byte per lane = 8 × line/payload × 1000 / (GT/s) = 8 × line × 10_000 / (payload × gts_x10)
        (8 * line * 10_000, payload * gts_x10 * self.pcie_lanes as u128)
    }

    /// Time `bytes` on the PCIe link take (rounded up), 0 with 0 lanes.
    pub fn pcie_bytes_time(&self, bytes: u64) -> Picoseconds {
        if self.pcie_lanes == 0 || bytes == 0 {
            return Picoseconds::ZERO;
        }
        let (numerator, denominator) = self.pcie_byte_time();
        Picoseconds((bytes as u128 * numerator).div_ceil(denominator) as u64)
    }

    /// Link bytes of a transfer of `bytes` payload in TLPs of at most `max` bytes each.
    pub fn pcie_tlp_bytes(&self, bytes: u64, max: u64) -> u64 {
        bytes + bytes.div_ceil(max) * self.pcie_tlp_overhead_bytes
    }

    /// Link time of a DMA read of `bytes`: completions of at most the max payload size,
    /// each with its TLP overhead (the read requests go the other way).
    pub fn pcie_read_transfer(&self, bytes: u64) -> Picoseconds {
        self.pcie_bytes_time(self.pcie_tlp_bytes(bytes, self.pcie_max_payload_bytes))
    }

    /// Read requests a DMA read of `bytes` needs.
    pub fn pcie_read_requests(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.pcie_max_read_request_bytes)
    }

    /// Link time of a DMA write of `bytes`: posted writes of at most the max payload size.
    pub fn pcie_write_transfer(&self, bytes: u64) -> Picoseconds {
        self.pcie_bytes_time(self.pcie_tlp_bytes(bytes, self.pcie_max_payload_bytes))
    }

    /// A DMA read of `bytes` from request to the last byte in the device.
    pub fn pcie_read(&self, bytes: u64) -> Picoseconds {
        Picoseconds(self.pcie_read_latency_ps) + self.pcie_read_transfer(bytes)
    }

    /// WQE fetch: one read round trip plus the WQE at link bandwidth.
    pub fn wqe_fetch(&self) -> Picoseconds {
        self.pcie_read(self.wqe_bytes)
    }

    /// MTT translation cache hit.
    pub fn mtt_hit(&self) -> Picoseconds {
        self.cycles(self.mtt_hit_cycles)
    }

    /// MTT walk on a miss through `levels` levels: one DMA read (8 bytes) per level, on
    /// top of the hit cost.
    pub fn mtt_miss(&self, levels: u32) -> Picoseconds {
        let per_level = self.pcie_read(8).0;
        Picoseconds(per_level * u64::from(levels)) + self.mtt_hit()
    }

    /// A 64-byte posted write made visible (CQE, EQE).
    pub fn posted_write(&self, bytes: u64) -> Picoseconds {
        Picoseconds(self.pcie_write_latency_ps) + self.pcie_write_transfer(bytes)
    }

    /// CQE write: a 64-byte posted write.
    pub fn cqe_write(&self) -> Picoseconds {
        self.posted_write(64)
    }

    /// EQE write: a 64-byte posted write (hns EQEs are at most 64 bytes).
    pub fn eqe_write(&self) -> Picoseconds {
        self.posted_write(64)
    }

    /// MSI-X: a 4-byte posted write to the message address.
    pub fn msix(&self) -> Picoseconds {
        self.posted_write(4)
    }

    /// Bytes on the wire for a frame of `frame_bytes` (Ethernet header to ICRC, no FCS).
    pub fn wire_bytes(&self, frame_bytes: u64) -> u64 {
        frame_bytes + self.preamble_bytes + self.ifg_bytes + self.fcs_bytes
    }

    /// Serialisation of a frame of `frame_bytes` (no FCS) with every per-frame overhead.
    pub fn serialisation(&self, frame_bytes: u64) -> Picoseconds {
        let bits = self.wire_bytes(frame_bytes) * 8;
        Picoseconds((bits * 1000).div_ceil(self.link_gbps))
    }
}

/// A stage of the pipeline that costs time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Doorbell MMIO write.
    Doorbell,
    /// Context (QPC) cache miss.
    ContextMiss,
    /// WQE fetch.
    WqeFetch,
    /// MTT translation cache hit.
    MttHit,
    /// MTT translation cache miss (the walk).
    MttMiss,
    /// Payload DMA read (round trip and transfer).
    PayloadRead,
    /// Waiting for the PCIe read channel (another frame's payload is on it).
    PcieQueue,
    /// Transmit pipeline.
    TxPipeline,
    /// Waiting for the port (another frame is on the wire).
    PortQueue,
    /// Serialisation onto the wire.
    Serialisation,
    /// Waiting for the receive pipeline (another frame is in it).
    RxQueue,
    /// Receive pipeline.
    RxPipeline,
    /// Payload DMA write.
    PayloadWrite,
    /// CQE write.
    CqeWrite,
    /// EQE write.
    EqeWrite,
    /// MSI-X message.
    Msix,
}

impl Stage {
    /// Every stage, in pipeline order.
    pub const ALL: [Stage; 16] = [
        Stage::Doorbell,
        Stage::ContextMiss,
        Stage::WqeFetch,
        Stage::MttHit,
        Stage::MttMiss,
        Stage::PayloadRead,
        Stage::PcieQueue,
        Stage::TxPipeline,
        Stage::PortQueue,
        Stage::Serialisation,
        Stage::RxQueue,
        Stage::RxPipeline,
        Stage::PayloadWrite,
        Stage::CqeWrite,
        Stage::EqeWrite,
        Stage::Msix,
    ];

    /// Short name for tables and traces.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Doorbell => "doorbell",
            Stage::ContextMiss => "context_miss",
            Stage::WqeFetch => "wqe_fetch",
            Stage::MttHit => "mtt_hit",
            Stage::MttMiss => "mtt_miss",
            Stage::PayloadRead => "payload_read",
            Stage::PcieQueue => "pcie_queue",
            Stage::TxPipeline => "tx_pipeline",
            Stage::PortQueue => "port_queue",
            Stage::Serialisation => "serialisation",
            Stage::RxQueue => "rx_queue",
            Stage::RxPipeline => "rx_pipeline",
            Stage::PayloadWrite => "payload_write",
            Stage::CqeWrite => "cqe_write",
            Stage::EqeWrite => "eqe_write",
            Stage::Msix => "msix",
        }
    }
}

/// How often each stage was charged and how much time it cost in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTotals {
    /// Per stage (index: position in [`Stage::ALL`]): times charged.
    pub count: [u64; 16],
    /// Per stage: total ps.
    pub total_ps: [u64; 16],
}

impl StageTotals {
    /// Times `stage` was charged.
    pub fn count(&self, stage: Stage) -> u64 {
        self.count[stage as usize]
    }

    /// Total time charged to `stage`.
    pub fn total(&self, stage: Stage) -> Picoseconds {
        Picoseconds(self.total_ps[stage as usize])
    }

    /// Adds `other`'s counts and totals.
    pub fn add(&mut self, other: &StageTotals) {
        for i in 0..16 {
            self.count[i] += other.count[i];
            self.total_ps[i] += other.total_ps[i];
        }
    }
}

/// Costs charged while one frame is built or received (reset per frame).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FrameCharges {
    /// The QP the frame belongs to (for traces).
    pub qpn: u32,
    /// Latency on the frame's critical path (WQE fetch, context miss, MTT).
    pub latency: Picoseconds,
    /// PCIe link time of the reads made (WQE).
    pub read_link: Picoseconds,
    /// Payload bytes read by DMA.
    pub read_bytes: u64,
}

/// The model's state on one device: parameters, caches, totals.
#[derive(Debug, Clone)]
pub struct TimingModel {
    params: TimingParams,
    /// Translations cached: (MTR root, page index).
    mtt_cache: LruCache<(u64, u64)>,
    /// Contexts cached: QPN.
    context_cache: LruCache<u32>,
    totals: StageTotals,
    /// MTT lookups that missed.
    pub mtt_misses: u64,
    /// MTT lookups that hit.
    pub mtt_hits: u64,
    pub(crate) frame: FrameCharges,
    /// `params.mtt_hit()` and the per-level part of `params.mtt_miss()` (a PCIe read of
    /// 8 bytes, with a 128-bit division), worked out at the first MTT lookup (always a
    /// miss, which needs both): the parameters never change, and every page of every
    /// payload access asks.
    mtt_costs: Option<(Picoseconds, u64)>,
    /// Every charge since the last [`TimingModel::take_stage_log`], when a trace asked for
    /// them (verification traces); None (the default) records nothing.
    stage_log: Option<Vec<StageCharge>>,
}

/// One charge of a stage, as a trace records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageCharge {
    /// The stage charged.
    pub stage: Stage,
    /// Its cost, ps.
    pub cost: Picoseconds,
    /// The QP of the frame being built or received.
    pub qpn: u32,
}

impl TimingModel {
    /// The model with `params`, caches empty.
    pub fn new(params: TimingParams) -> Self {
        Self {
            mtt_cache: LruCache::new(params.mtt_cache_entries),
            context_cache: LruCache::new(params.context_cache_entries),
            mtt_costs: None,
            params,
            totals: StageTotals::default(),
            mtt_misses: 0,
            mtt_hits: 0,
            frame: FrameCharges::default(),
            stage_log: None,
        }
    }

    /// Starts (`true`) or stops keeping every charge for [`TimingModel::take_stage_log`].
    pub fn set_stage_log(&mut self, on: bool) {
        self.stage_log = on.then(Vec::new);
    }

    /// The charges kept since the last call (empty when the log is off).
    pub fn take_stage_log(&mut self) -> Vec<StageCharge> {
        self.stage_log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The parameters.
    pub fn params(&self) -> &TimingParams {
        &self.params
    }

    /// Per-stage totals since power-on or [`TimingModel::reset_totals`].
    pub fn totals(&self) -> StageTotals {
        self.totals
    }

    /// Clears the totals and the hit/miss counters (the caches keep their contents).
    pub fn reset_totals(&mut self) {
        self.totals = StageTotals::default();
        self.mtt_misses = 0;
        self.mtt_hits = 0;
    }

    /// Records `cost` for `stage` (totals and a `tracing` event, target `rnic::timing`,
    /// with the QP the current frame belongs to).
    pub fn record(&mut self, stage: Stage, cost: Picoseconds) {
        self.totals.count[stage as usize] += 1;
        self.totals.total_ps[stage as usize] += cost.0;
        if self.stage_log.is_some() {
            self.log_stage(stage, cost);
        }
        tracing::trace!(target: "rnic::timing", stage = stage.name(), ps = cost.0, qpn = self.frame.qpn);
    }

    // Out of line and cold: a trace is rare, and `record` runs several times per frame,
    // so the log's push is kept out of the inlined path (callgrind, docs/benchmarks.md).
    #[cold]
    #[inline(never)]
    fn log_stage(&mut self, stage: Stage, cost: Picoseconds) {
        let qpn = self.frame.qpn;
        if let Some(log) = self.stage_log.as_mut() {
            log.push(StageCharge { stage, cost, qpn });
        }
    }

    /// Looks up a translation of page `page` of the buffer rooted at `root` with `levels`
    /// BT levels; returns its cost (hit, or walk and fill) and records it.
    #[inline]
    pub fn mtt_lookup(&mut self, root: u64, page: u64, levels: u32) -> Picoseconds {
        let params = &self.params;
        let (hit, per_level) = *self
            .mtt_costs
            .get_or_insert_with(|| (params.mtt_hit(), params.pcie_read(8).0));
        if self.params.mtt_cache_entries > 0 && self.mtt_cache.touch((root, page)) {
            self.mtt_hits += 1;
            let cost = hit;
            self.record(Stage::MttHit, cost);
            cost
        } else {
            self.mtt_misses += 1;
            // As `TimingParams::mtt_miss`, from the costs worked out once.
            let cost = Picoseconds(per_level * u64::from(levels)) + hit;
            self.record(Stage::MttMiss, cost);
            cost
        }
    }

    /// Looks up QP `qpn`'s context; returns the miss cost (zero on a hit) and records it.
    pub fn context_lookup(&mut self, qpn: u32) -> Picoseconds {
        if self.params.context_cache_entries > 0 && self.context_cache.touch(qpn) {
            return Picoseconds::ZERO;
        }
        let cost = Picoseconds(self.params.context_miss_ps);
        self.record(Stage::ContextMiss, cost);
        cost
    }
}

#[cfg(test)]
mod tests;
