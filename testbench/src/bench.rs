//! The traffic engine behind `rnic-bench`: two embedded NICs on one fabric, `qps`
//! connected RC queue-pair pairs, and `iters` messages of one operation per pair, with
//! every payload byte optionally checked at the receiver.
//!
//! Each pair keeps up to [`WINDOW`] messages outstanding in a ring of buffer slots; a slot
//! is reused only after its message completed (and was verified), so a check can never see
//! a later message's bytes. Payloads are a pattern of (pair, message index), so a byte from
//! the wrong message or a corrupted frame that got through would be caught.
//!
//! A scoreboard per pair checks that completions arrive exactly once and in posting order
//! (requester side, and receiver side for SENDs), and folds a hash of every payload as
//! expected and as found into two running digests that must agree at the end.

use std::fmt::Write as _;
use std::time::Instant;

use rnic_firmware_if::caps::CapFlags;
use rnic_hw_model::fabric::{CapturedFrame, DeviceId, FabricConfig, FabricStatistics, FaultPlan};
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::timing::{Stage, StageTotals, TimingParams};
use rnic_hw_model::transport::{self, ACK_REQUEST_INTERVAL};
use rnic_hw_model::DeviceConfig;
use rnic_verbs::backend::{EmbeddedConfig, EmbeddedDevice, EmbeddedFabric};
use rnic_verbs::{
    AccessFlags, AhAttributes, AtomicFields, CompletionQueue, Context, MemoryRegion, Mtu, ProtectionDomain,
    QpCapabilities, QpInitAttributes, QpType, QueuePair, RcConnection, RdmaFields, RecvWorkRequest, SendFlags,
    SendWorkRequest, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use rnic_vip::trace::Trace;

use crate::frame_floor::{frame_floor_rate, FloorMessage, FloorOperation, FLOOR_ROUND};

/// Messages a pair keeps outstanding.
pub const WINDOW: usize = 16;
/// Most messages a pair may keep outstanding (`--tx-depth`): the CQ and QP depths follow.
pub const MAX_TX_DEPTH: usize = 1024;
/// Most bytes of buffer slots per side and pair.
const MAX_SLOT_BYTES: usize = 64 << 20;
/// Most virtual time the drivers let pass when nothing completed: the loop wakes at the
/// fabric's next event, so a completion is seen at the instant its CQE is written.
const IDLE_STEP: Picoseconds = Picoseconds::from_micros(2);
/// Virtual time after which a run with no progress is declared stuck.
const STALL_LIMIT: Picoseconds = Picoseconds::from_millis(2_000);

const MAC_REQUESTER: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0xA0];
const MAC_RESPONDER: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0xB0];

/// The operation a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND to posted receives.
    Send,
    /// Atomic fetch-and-add of 1 on one 8-byte word per pair.
    Atomic,
    /// A seeded mix of the four, message by message (the soak test's traffic).
    Mixed,
}

impl Operation {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Write => "write",
            Operation::Read => "read",
            Operation::Send => "send",
            Operation::Atomic => "atomic",
            Operation::Mixed => "mixed",
        }
    }

    /// The message the frame floor moves for this operation: none for atomics and the
    /// mix, whose messages are not one operation's frames.
    pub fn floor_operation(self) -> Option<FloorOperation> {
        match self {
            Operation::Write => Some(FloorOperation::Write),
            Operation::Read => Some(FloorOperation::Read),
            Operation::Send => Some(FloorOperation::Send),
            Operation::Atomic | Operation::Mixed => None,
        }
    }
}

impl std::str::FromStr for Operation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(Operation::Write),
            "read" => Ok(Operation::Read),
            "send" => Ok(Operation::Send),
            "atomic" => Ok(Operation::Atomic),
            "mixed" => Ok(Operation::Mixed),
            other => Err(format!(
                "unknown operation {other:?}: write, read, send, atomic or mixed"
            )),
        }
    }
}

/// Which clock the figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Modelled figures from virtual time (deterministic).
    Virtual,
    /// How fast the emulator itself moves data on this machine (wall clock).
    Wall,
}

impl Mode {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Virtual => "virtual",
            Mode::Wall => "wall",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "virtual" => Ok(Mode::Virtual),
            "wall" => Ok(Mode::Wall),
            other => Err(format!("unknown mode {other:?}: virtual or wall")),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Operation.
    pub operation: Operation,
    /// Message size in bytes (atomics are always 8).
    pub size: usize,
    /// Messages per queue pair.
    pub iterations: u64,
    /// Queue-pair pairs.
    pub queue_pairs: usize,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096).
    pub mtu: u32,
    /// Faults on the wire.
    pub faults: FaultPlan,
    /// Check every payload byte at the receiver.
    pub verify: bool,
    /// Keep every frame that crossed the wire (for `--pcap`).
    pub capture: bool,
    /// Timing-model parameters of both NICs.
    pub timing: TimingParams,
    /// Name of the preset the parameters came from (for reports).
    pub preset: String,
    /// Propagation and switch latency of the wire.
    pub link_latency: Picoseconds,
    /// Which clock the figures come from.
    pub mode: Mode,
    /// Latency test: one message outstanding per pair (perftest `_lat`), else a window
    /// of `tx_depth` messages (perftest `_bw`).
    pub latency_test: bool,
    /// Messages a pair keeps outstanding in a bandwidth test (perftest `--tx-depth`);
    /// [`WINDOW`] by default.
    pub tx_depth: usize,
    /// One send work request in this many asks for a completion (perftest `--cq-mod`);
    /// the last one of a run always does. 1: every one (the default).
    pub cq_moderation: u64,
    /// Every message of a pair reads and writes the same buffer bytes, as perftest's
    /// `ib_*_bw` tests do (they cycle within one buffer); otherwise each outstanding
    /// message has a slot of its own. Neither a check nor a capture can tell such messages
    /// apart, so it cannot be combined with `verify` or `capture`.
    pub single_buffer: bool,
    /// Connect the queue pairs through the connection manager (IB CM on QP1 with RDMA-CM
    /// addressing: REQ/REP/RTU, then DREQ/DREP at the end) instead of programming both
    /// ends directly.
    pub connection_manager: bool,
    /// Keep a trace of every timing-model charge of both NICs over the measured span
    /// ([`BenchReport::traces`]; `rnic-bench --trace FILE`).
    pub trace: bool,
    /// Record the frames and CQEs of both NICs ([`BenchReport::recording`];
    /// crate::recording, `rnic-bench --record FILE`). Virtual mode only.
    pub record: bool,
    /// WRITEs and SENDs of at most this many bytes are posted inline (the QPs' max inline
    /// data; perftest's `--inline_size`); 0: none (the default).
    pub inline_size: u32,
    /// Both NICs offer direct WQE (cap `DIRECT_WQE`), so a post of one WQE hands it over
    /// with the doorbell instead of letting the NIC fetch it (hns HIP09 user QPs).
    pub direct_wqe: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            operation: Operation::Write,
            size: 4096,
            iterations: 1000,
            queue_pairs: 1,
            mtu: 4096,
            faults: FaultPlan::none(),
            verify: true,
            capture: false,
            timing: TimingParams::default(),
            preset: "hns-100g".into(),
            link_latency: FabricConfig::DEFAULT_LINK_LATENCY,
            mode: Mode::Virtual,
            latency_test: false,
            tx_depth: WINDOW,
            cq_moderation: 1,
            single_buffer: false,
            connection_manager: false,
            trace: false,
            record: false,
            inline_size: 0,
            direct_wqe: false,
        }
    }
}

/// Why a run could not be carried out (failed messages are counted in the report).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The verbs layer refused a setup step.
    #[error("setup failed: {0}")]
    Verbs(#[from] rnic_verbs::VerbsError),
    /// Posting a work request failed.
    #[error("posting failed: {0}")]
    Post(String),
    /// No completion arrived for too long.
    #[error("no progress for {limit} of virtual time: {done} of {expected} messages done")]
    Stalled {
        /// The stall limit.
        limit: Picoseconds,
        /// Messages completed.
        done: u64,
        /// Messages expected.
        expected: u64,
    },
    /// The frame floor could not move its own message (a defect of the wire code).
    #[error("frame floor: {0}")]
    FrameFloor(#[from] crate::frame_floor::FrameFloorError),
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct BenchReport {
    /// Operation name.
    pub operation: &'static str,
    /// Message size in bytes.
    pub size: usize,
    /// Messages per queue pair.
    pub iterations: u64,
    /// Queue-pair pairs.
    pub queue_pairs: usize,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Messages the run was asked to move: iterations × queue pairs.
    pub messages_expected: u64,
    /// Messages that completed successfully (and verified, when verifying).
    pub messages_ok: u64,
    /// Messages that completed with an error or failed verification.
    pub messages_failed: u64,
    /// Messages that may have arrived but that only the peer can confirm: `ib_write_lat`'s
    /// last WRITE whose ACK was lost after the peer, which has no closing handshake, had
    /// already left (our resends meet no QP and end in RETRY_EXC_ERR). Neither ok nor
    /// failed; the peer's own report decides.
    pub messages_unconfirmed: u64,
    /// Payload bytes checked at the receiver.
    pub bytes_verified: u64,
    /// Packets the requesters retransmitted.
    pub retransmissions: u64,
    /// Frames that left a device.
    pub frames: u64,
    /// What the fabric did to them.
    pub fabric: FabricStatistics,
    /// Virtual time the run took, in picoseconds.
    pub sim_time_ps: u64,
    /// Wall-clock time the run took, in seconds.
    pub wall_time_s: f64,
    /// CPU time this thread spent moving the messages, seconds: the span the wall-mode
    /// rate is measured over (the memcpy yardstick and set-up not included); 0 where
    /// not measured (across processes).
    pub cpu_time_s: f64,
    /// The first failures, for the human-readable report.
    pub failures: Vec<String>,
    /// What the run met that did not fail it but a reader should know (a completion error
    /// the peer's answer proved harmless), for the human-readable report.
    pub notes: Vec<String>,
    /// Which clock the figures below come from.
    pub mode: &'static str,
    /// Timing preset name.
    pub preset: String,
    /// `lat` (one message outstanding) or `bw` (a window).
    pub test: &'static str,
    /// Average goodput, Gb/s: payload bytes of the messages over the run's time.
    pub bw_gbps: f64,
    /// Peak goodput, Gb/s: the best stretch of a tenth of the messages (at least four
    /// windows).
    pub bw_peak_gbps: f64,
    /// Messages per second, millions.
    pub msg_rate_mpps: f64,
    /// Message latency (post to the requester's completion), µs: min, p50, p99, max.
    pub lat_us: [f64; 4],
    /// SEND latency tests only: post to the receive completion at the responder, µs (min,
    /// p50, p99, max) — one way, what `ib_send_lat`'s half round trip measures.
    pub one_way_us: Option<[f64; 4]>,
    /// Per-stage timing totals of the requester NIC over the run.
    pub requester_stages: StageTotals,
    /// Per-stage timing totals of the responder NIC over the run.
    pub responder_stages: StageTotals,
    /// MTT translation-cache misses (both NICs).
    pub mtt_misses: u64,
    /// MTT translation-cache hits (both NICs).
    pub mtt_hits: u64,
    /// CQEs the two NICs wrote during the run (with `cq_moderation` > 1, fewer than the
    /// messages).
    pub cqes_written: u64,
    /// Fairness across QPs: the highest per-QP throughput over the lowest (each QP's
    /// bytes over the time to its last completion); 1.0 with one QP.
    pub qp_fairness: f64,
    /// The QPs were connected through the connection manager.
    pub connection_manager: bool,
    /// CM MADs both connection managers sent (retransmissions included); 0 without one.
    pub cm_mads: u64,
    /// Wall mode: this machine's memcpy, Gb/s, measured in the same run before and after
    /// the traffic (the faster of the two), moving messages of the run's size between
    /// buffers laid out as every pair's slots, the pairs taken in turn
    /// ([`MemcpyYardstick`]); `None` in virtual mode.
    pub memcpy_gbps: Option<f64>,
    /// Wall mode, WRITE, READ and SEND: the frame floor, millions of messages per second —
    /// this machine moving one message of the run's size through the operation's frames
    /// with the model's wire code and nothing else ([`crate::frame_floor`]), measured in
    /// the same run before and after the traffic (the faster of the two); `None`
    /// otherwise.
    pub frame_floor_mpps: Option<f64>,
    /// With [`BenchConfig::trace`]: the requester's and the responder's trace over the span
    /// the stage totals cover (so per stage its slices add up to `requester_stages` and
    /// `responder_stages`, the `--breakdown` figures); empty otherwise.
    pub traces: Vec<Trace>,
    /// With [`BenchConfig::record`]: every frame each NIC sent and received and every CQE,
    /// with virtual times, as JSON lines (crate::recording); empty otherwise.
    pub recording: Vec<String>,
}

impl BenchReport {
    /// The run's verdict: every message asked for moved and none failed or is unconfirmed.
    /// A run that moved fewer messages than asked without counting a failure has still not
    /// done its job.
    ///
    /// # Errors
    /// What fell short, in words.
    pub fn verdict(&self) -> Result<(), String> {
        if self.messages_failed != 0 {
            return Err(format!(
                "{} of {} messages failed",
                self.messages_failed, self.messages_expected
            ));
        }
        if self.messages_ok + self.messages_unconfirmed != self.messages_expected {
            return Err(format!(
                "{} messages ok of {} asked for ({} B x {} on {} QP(s))",
                self.messages_ok, self.messages_expected, self.size, self.iterations, self.queue_pairs
            ));
        }
        if self.messages_unconfirmed != 0 {
            return Err(format!(
                "{} of {} messages unconfirmed: only the peer's report can tell whether they arrived",
                self.messages_unconfirmed, self.messages_expected
            ));
        }
        Ok(())
    }

    /// Whether the run fell short of [`BenchReport::verdict`] only by messages the peer
    /// must confirm ([`BenchReport::messages_unconfirmed`]): nothing failed, every other
    /// message was ok.
    pub fn awaits_peer_confirmation(&self) -> bool {
        self.messages_failed == 0
            && self.messages_unconfirmed != 0
            && self.messages_ok + self.messages_unconfirmed == self.messages_expected
    }

    /// Goodput over the same run's memcpy (wall mode): how far the emulator is from the
    /// machine's floor.
    pub fn memcpy_ratio(&self) -> Option<f64> {
        self.memcpy_gbps.filter(|m| *m > 0.0).map(|m| self.bw_gbps / m)
    }

    /// Message rate over the same run's frame floor (wall mode; WRITE, READ, SEND): how far
    /// the emulator is from the frame work alone, the yardstick of small messages.
    pub fn floor_ratio(&self) -> Option<f64> {
        self.frame_floor_mpps
            .filter(|floor| *floor > 0.0)
            .map(|floor| self.msg_rate_mpps / floor)
    }

    /// One JSON object on one line. Wall-mode runs end it with `memcpy_gbps` and
    /// `memcpy_ratio`, and for WRITE, READ and SEND `frame_floor_mpps` and `floor_ratio`.
    pub fn to_json(&self) -> String {
        let mut yardsticks = match (self.memcpy_gbps, self.memcpy_ratio()) {
            (Some(gbps), Some(ratio)) => format!(",\"memcpy_gbps\":{gbps:.6},\"memcpy_ratio\":{ratio:.6}"),
            _ => String::new(),
        };
        if let (Some(floor), Some(ratio)) = (self.frame_floor_mpps, self.floor_ratio()) {
            let _ = write!(
                yardsticks,
                ",\"frame_floor_mpps\":{floor:.6},\"floor_ratio\":{ratio:.6}"
            );
        }
        let one_way = match self.one_way_us {
            Some([min, p50, p99, max]) => {
                format!(",\"one_way_us\":{{\"min\":{min:.6},\"p50\":{p50:.6},\"p99\":{p99:.6},\"max\":{max:.6}}}")
            }
            None => String::new(),
        };
        format!(
            "{{\"op\":\"{}\",\"size\":{},\"iters\":{},\"qps\":{},\"mtu\":{},\"messages_ok\":{},\"messages_failed\":{},\
             \"messages_unconfirmed\":{},\"bytes_verified\":{},\"retransmissions\":{},\"frames\":{},\"frames_dropped\":{},\"frames_duplicated\":{},\
             \"frames_reordered\":{},\"frames_corrupted\":{},\"mode\":\"{}\",\"preset\":\"{}\",\"test\":\"{}\",\
             \"bw_gbps\":{:.6},\"bw_peak_gbps\":{:.6},\"msg_rate_mpps\":{:.6},\"lat_us\":{{\"min\":{:.6},\"p50\":{:.6},\
             \"p99\":{:.6},\"max\":{:.6}}},\"mtt_misses\":{},\"sim_time_ps\":{},\"wall_time_s\":{:.6},\"cm\":{},\
             \"cm_mads\":{},\"messages_expected\":{}{}{}}}",
            self.operation,
            self.size,
            self.iterations,
            self.queue_pairs,
            self.mtu,
            self.messages_ok,
            self.messages_failed,
            self.messages_unconfirmed,
            self.bytes_verified,
            self.retransmissions,
            self.frames,
            self.fabric.dropped,
            self.fabric.duplicated,
            self.fabric.reordered,
            self.fabric.corrupted,
            self.mode,
            self.preset,
            self.test,
            self.bw_gbps,
            self.bw_peak_gbps,
            self.msg_rate_mpps,
            self.lat_us[0],
            self.lat_us[1],
            self.lat_us[2],
            self.lat_us[3],
            self.mtt_misses,
            self.sim_time_ps,
            self.wall_time_s,
            self.connection_manager,
            self.cm_mads,
            self.messages_expected,
            one_way,
            yardsticks
        )
    }

    /// The perftest-shaped table: one header line and one row.
    pub fn to_table(&self) -> String {
        let mut out = self.table_header();
        out.push_str(&self.table_row());
        if let Some([min, p50, p99, max]) = self.one_way_us {
            let _ = writeln!(
                out,
                "# one way, post to receive completion (ib_send_lat's half round trip): \
                 t_min {min:.3}, t_typical {p50:.3}, 99% {p99:.3}, t_max {max:.3} usec"
            );
        }
        out
    }

    /// The table's title line (operation, test, mode, preset, QPs, MTU) and column names.
    pub fn table_header(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# {} {} test, {} mode, preset {}, {} QP(s), MTU {}",
            self.operation, self.test, self.mode, self.preset, self.queue_pairs, self.mtu
        );
        let _ = writeln!(
            out,
            " {:>10} {:>12} {:>16} {:>19} {:>17} {:>20} {:>15} {:>12} {:>16} {:>15} {:>12}",
            "#bytes",
            "#iterations",
            "BW peak[Gb/sec]",
            "BW average[Gb/sec]",
            "BW peak[GB/sec]",
            "BW average[GB/sec]",
            "MsgRate[Mpps]",
            "t_min[usec]",
            "t_typical[usec]",
            "99% pct[usec]",
            "t_max[usec]"
        );
        if self.memcpy_gbps.is_some() {
            // Beside perftest's columns, not among them, so their positions stay.
            out.pop();
            let _ = writeln!(out, " {:>15} {:>10}", "memcpy[Gb/sec]", "BW/memcpy");
        }
        if self.frame_floor_mpps.is_some() {
            out.pop();
            let _ = writeln!(out, " {:>14} {:>11}", "floor[Mmsg/s]", "Rate/floor");
        }
        out
    }

    /// One row of the table: this run's figures under [`BenchReport::table_header`].
    pub fn table_row(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            " {:>10} {:>12} {:>16.2} {:>19.2} {:>17.3} {:>20.3} {:>15.6} {:>12.3} {:>16.3} {:>15.3} {:>12.3}",
            self.size,
            self.iterations,
            self.bw_peak_gbps,
            self.bw_gbps,
            self.bw_peak_gbps / 8.0,
            self.bw_gbps / 8.0,
            self.msg_rate_mpps,
            self.lat_us[0],
            self.lat_us[1],
            self.lat_us[2],
            self.lat_us[3]
        );
        if let (Some(gbps), Some(ratio)) = (self.memcpy_gbps, self.memcpy_ratio()) {
            out.pop();
            let _ = writeln!(out, " {gbps:>15.2} {ratio:>10.4}");
        }
        if let (Some(floor), Some(ratio)) = (self.frame_floor_mpps, self.floor_ratio()) {
            out.pop();
            let _ = writeln!(out, " {floor:>14.3} {ratio:>11.4}");
        }
        out
    }

    /// Per-stage breakdown per message: count and time of each stage on each NIC.
    pub fn breakdown_table(&self) -> String {
        let mut out = String::new();
        let messages = (self.messages_ok + self.messages_failed).max(1);
        let _ = writeln!(
            out,
            "# per-message stage breakdown ({} messages; time per message in ns; MTT {} hits, {} misses)",
            messages, self.mtt_hits, self.mtt_misses
        );
        let _ = writeln!(
            out,
            " {:<14} {:>14} {:>16} {:>14} {:>16}",
            "stage", "requester n", "requester [ns]", "responder n", "responder [ns]"
        );
        for stage in Stage::ALL {
            let (a, b) = (&self.requester_stages, &self.responder_stages);
            if a.count(stage) == 0 && b.count(stage) == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                " {:<14} {:>14.3} {:>16.3} {:>14.3} {:>16.3}",
                stage.name(),
                a.count(stage) as f64 / messages as f64,
                a.total(stage).0 as f64 / 1000.0 / messages as f64,
                b.count(stage) as f64 / messages as f64,
                b.total(stage).0 as f64 / 1000.0 / messages as f64
            );
        }
        out
    }

    /// The traces in the Chrome/Perfetto JSON format (`ui.perfetto.dev`): the requester
    /// as process 1, the responder as process 2 (rnic_vip::trace). None without a trace.
    pub fn trace_json(&self) -> Option<String> {
        let [requester, responder] = self.traces.as_slice() else {
            return None;
        };
        Some(rnic_vip::trace::perfetto_json(&[
            (1, "requester NIC", requester),
            (2, "responder NIC", responder),
        ]))
    }

    /// The same traces as VCD (rnic_vip::vcd; `$timescale 1ps`): the requester as scope
    /// `device_1`, the responder as `device_2`, each with its stage totals in a
    /// `rnicStageTotals` comment. None without a trace.
    pub fn trace_vcd(&self) -> Option<String> {
        let [requester, responder] = self.traces.as_slice() else {
            return None;
        };
        Some(rnic_vip::vcd::to_vcd(&[
            (1, "requester NIC", requester),
            (2, "responder NIC", responder),
        ]))
    }

    /// A short human-readable summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        // The unconfirmed count only where there is one: it is rare, and scripts read this line.
        let unconfirmed = match self.messages_unconfirmed {
            0 => String::new(),
            n => format!(", {n} unconfirmed"),
        };
        let _ = writeln!(
            out,
            "{} {} B x {} on {} QP(s), MTU {}: {} ok, {} failed{unconfirmed}, {} bytes verified",
            self.operation,
            self.size,
            self.iterations,
            self.queue_pairs,
            self.mtu,
            self.messages_ok,
            self.messages_failed,
            self.bytes_verified
        );
        let _ = writeln!(
            out,
            "wire: {} frames ({} dropped, {} duplicated, {} reordered, {} corrupted), {} retransmitted packets",
            self.frames,
            self.fabric.dropped,
            self.fabric.duplicated,
            self.fabric.reordered,
            self.fabric.corrupted,
            self.retransmissions
        );
        let _ = writeln!(
            out,
            "time: {} virtual, {:.3} s wall",
            Picoseconds(self.sim_time_ps),
            self.wall_time_s
        );
        for failure in &self.failures {
            let _ = writeln!(out, "failure: {failure}");
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        out
    }
}

/// The message sizes of `rnic-bench` without an operation (the sweep): every power of two
/// from 2 B to 8 MiB.
pub fn sweep_sizes() -> Vec<usize> {
    (1..=23).map(|shift| 1usize << shift).collect()
}

/// Messages per QP at one point of the sweep: about 32 MiB of payload, between 8 and 1000
/// messages, so each point takes well under a second in either mode.
pub fn sweep_iterations(size: usize) -> u64 {
    ((32usize << 20) / size.max(1)).clamp(8, 1000) as u64
}

/// The byte at offset `i` of message `message` of pair `pair`.
fn pattern_byte(pair: usize, message: u64, i: usize) -> u8 {
    let x = (message.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (pair as u64) << 56).wrapping_add(i as u64 / 8);
    (x >> ((i % 8) * 8)) as u8 ^ (i as u8)
}

/// Fills `buffer` with [`pattern_byte`]s, eight at a time: bytes `8k..8k + 8` are the
/// little-endian bytes of `x + k` XOR their own offsets (low byte `8k mod 256`, then + 1 ..
/// + 7, which never carries). This was the top self cost of wall-mode runs byte by byte.
pub(crate) fn fill_pattern(buffer: &mut [u8], pair: usize, message: u64) {
    let base = message.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (pair as u64) << 56;
    let whole = buffer.len() / 8 * 8;
    let chunks = buffer.chunks_exact_mut(8);
    for (k, chunk) in chunks.enumerate() {
        let offsets = 0x0706_0504_0302_0100u64 | u64::from((k * 8) as u8).wrapping_mul(0x0101_0101_0101_0101);
        chunk.copy_from_slice(&(base.wrapping_add(k as u64) ^ offsets).to_le_bytes());
    }
    for (i, b) in buffer.iter_mut().enumerate().skip(whole) {
        *b = pattern_byte(pair, message, i);
    }
}

/// One NIC with its verbs objects.
struct Side {
    device: EmbeddedDevice,
    context: Context,
    pd: ProtectionDomain,
}

impl Side {
    fn new(fabric: &EmbeddedFabric, mac: [u8; 6], timing: TimingParams, direct_wqe: bool) -> Result<Self, BenchError> {
        let mut device = DeviceConfig {
            timing,
            ..DeviceConfig::with_mac(mac)
        };
        device.caps.flags.set(CapFlags::DIRECT_WQE, direct_wqe);
        // Host-side accesses cost no virtual time: the timing model charges the doorbell.
        let device = fabric.add_nic_with_config(EmbeddedConfig {
            device,
            mmio_cost: Picoseconds::ZERO,
            ..EmbeddedConfig::default()
        });
        device.with_device(crate::coverage::attach_from_environment);
        let context = Context::open(Box::new(device.clone()))?;
        let pd = context.alloc_pd()?;
        Ok(Self { device, context, pd })
    }
}

/// One connected queue-pair pair and its buffers.
struct Pair {
    index: usize,
    requester_qp: QueuePair,
    responder_qp: QueuePair,
    requester_cq: CompletionQueue,
    responder_cq: CompletionQueue,
    requester_mr: MemoryRegion,
    responder_mr: MemoryRegion,
    slots: usize,
    slot_size: usize,
    posted: u64,
    completed: u64,
    /// Message numbers of posted SENDs whose receive has not completed, in order, with
    /// the instant the SEND was posted (on the run's clock).
    pending_receives: std::collections::VecDeque<(u64, u64)>,
    /// Fetch-and-adds completed: the old value the next one must return.
    atomics_done: u64,
    /// Running digest of the payloads as the sender meant them.
    expected_digest: u64,
    /// Running digest of the payloads as the receiver found them.
    observed_digest: u64,
    /// Messages kept outstanding (1 in a latency test).
    window: u64,
    /// Virtual time of the pair's last requester completion.
    last_completion: Picoseconds,
    /// When each outstanding message was posted, on the run's clock ([`Clock::now`]), in
    /// posting order. Only the clock the figures come from is read: a wall-clock read per
    /// post and per completion was a few per cent of a small-message run.
    posted_at: std::collections::VecDeque<u64>,
}

/// Times measured for every message.
#[derive(Debug, Default)]
struct Timings {
    /// Latency of each message, ps (virtual) or ns (wall).
    latencies: Vec<u64>,
    /// Completion instant of each message, ps (virtual) or ns since the start (wall): the
    /// requester's completion, or for a SEND its receive completion (delivery).
    completions: Vec<u64>,
    /// SENDs: post to receive completion, ps (virtual) or ns (wall).
    one_way: Vec<u64>,
}

fn mtu_from_bytes(bytes: u32) -> Result<Mtu, BenchError> {
    Mtu::from_bytes(bytes).ok_or_else(|| BenchError::Config(format!("MTU {bytes}: one of 256, 512, 1024, 2048, 4096")))
}

/// The shortest local ACK timeout exponent the QPs get: 4.096 µs × 2⁸ ≈ 1 ms, long
/// against the fabric's microsecond round trip and short enough that a lost tail packet
/// costs little virtual time.
const ACK_TIMEOUT_MIN_EXPONENT: u8 = 8;

/// The most header bytes a request packet carries around its payload: Ethernet with a
/// VLAN tag (18), IPv6 (40), UDP (8), BTH (12), RETH (16), ImmDt (4) and ICRC (4).
const REQUEST_HEADER_BYTES_MAX: u64 = 18 + 40 + 8 + 12 + 16 + 4 + 4;

/// The local ACK timeout exponent t (4.096 µs × 2ᵗ) the QPs get: the smallest t ≥ 8 whose
/// timeout is at least twice the longest a healthy QP waits for its next acknowledgement.
///
/// What a QP with packets outstanding waits for is the answer to its next AckReq: the
/// requester sets AckReq on a message's last packet and on every
/// [`ACK_REQUEST_INTERVAL`]-th packet of a long one, and the responder answers it as it
/// arrives. The port serves the QPs that have work round robin, one packet each, so while a
/// QP sends the packets from one AckReq to the next every other backlogged QP sends as many:
/// the wait is at most `queue_pairs` × that many packets at the port's packet rate (the
/// slower of the link with its per-frame overheads and the payload's PCIe read), plus the
/// round trip. Twice that leaves room for the pipelines.
///
/// An earlier rule covered twice the time to drain every pair's whole window (t = 17 at
/// 1 024 QPs × 64 KiB): enough, but a lossy multi-QP run with long messages then waited
/// out each tail loss far longer than it needed to (docs/timing.md). With one QP at the
/// presets' rates this is t = 8 at every size.
fn ack_timeout(config: &BenchConfig, size: u64) -> u8 {
    let mtu = u64::from(config.mtu.max(1));
    let packets_per_message = size.div_ceil(mtu).max(1);
    let packets_between_ack_requests = packets_per_message.min(u64::from(ACK_REQUEST_INTERVAL));
    let payload = size.clamp(1, mtu);
    let timing = &config.timing;
    let packet = timing
        .serialisation(payload + REQUEST_HEADER_BYTES_MAX)
        .max(timing.pcie_read_transfer(payload));
    let wait = u128::from(packet.0) * u128::from(packets_between_ack_requests) * config.queue_pairs.max(1) as u128
        + 2 * u128::from(config.link_latency.0);
    let mut exponent = ACK_TIMEOUT_MIN_EXPONENT;
    // The QPC field has five bits.
    while exponent < 31 && ack_timeout_ps(exponent) < 2 * wait {
        exponent += 1;
    }
    exponent
}

/// The local ACK timeout `exponent` stands for, ps: the model's own rule (4.096 µs ×
/// 2^`exponent`), so the bench and the device never disagree on it. Exponent 0 is no
/// timeout at all, so it outlasts any wait.
fn ack_timeout_ps(exponent: u8) -> u128 {
    transport::ack_timeout(exponent).map_or(u128::MAX, |timeout| u128::from(timeout.0))
}

fn connect(qp: &QueuePair, remote: &QueuePair, remote_side: &Side, mtu: Mtu, timeout: u8) -> Result<(), BenchError> {
    qp.connect_rc(&RcConnection {
        path_mtu: mtu,
        dest_qp_num: remote.qp_num(),
        rq_psn: 0,
        sq_psn: 0,
        ah_attr: AhAttributes {
            dgid: remote_side.context.query_gid(1, 0)?,
            dmac: remote_side.context.mac_address(),
            hop_limit: 64,
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        max_rd_atomic: 16,
        // 4.096 µs × 2^timeout: see `ack_timeout`.
        timeout,
        retry_cnt: 7,
        rnr_retry: 7,
    })?;
    Ok(())
}

/// How far a run is, for a progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Messages done (ok or failed), all pairs.
    pub done: u64,
    /// Messages the run will do.
    pub expected: u64,
    /// Virtual time since the measurement started.
    pub sim_time: Picoseconds,
}

/// Driver-loop passes between two [`Progress`] reports: rare enough to cost nothing,
/// often enough for a line that moves (a pass takes well under a microsecond).
const PROGRESS_PASSES: u32 = 4096;

/// Runs one benchmark; returns its report and, when `config.capture` is set, every frame
/// that left a device.
pub fn run(config: &BenchConfig) -> Result<(BenchReport, Vec<CapturedFrame>), BenchError> {
    run_with_progress(config, &mut |_| {})
}

/// [`run`], calling `progress` every few thousand passes of the driver loop. The callback
/// sees the run from outside: it cannot change what the NICs do or what the report says.
pub fn run_with_progress(
    config: &BenchConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<(BenchReport, Vec<CapturedFrame>), BenchError> {
    let mtu = mtu_from_bytes(config.mtu)?;
    if config.tx_depth == 0 || config.tx_depth > MAX_TX_DEPTH {
        return Err(BenchError::Config(format!(
            "tx-depth {}: 1..={MAX_TX_DEPTH}",
            config.tx_depth
        )));
    }
    if config.record && config.mode != Mode::Virtual {
        return Err(BenchError::Config(
            "a recording is of a virtual-time run (--mode virtual)".into(),
        ));
    }
    if config.cq_moderation == 0 {
        return Err(BenchError::Config("cq-mod 0: at least 1".into()));
    }
    if config.single_buffer && (config.verify || config.capture) {
        return Err(BenchError::Config(
            "a single buffer per pair cannot be verified or captured: every message lands on the same bytes".into(),
        ));
    }
    if config.queue_pairs == 0 || config.queue_pairs > 1024 {
        return Err(BenchError::Config(format!("{} QPs: 1..=1024", config.queue_pairs)));
    }
    let size = if config.operation == Operation::Atomic {
        8
    } else {
        config.size
    };
    if size > 1 << 30 {
        return Err(BenchError::Config(format!("message size {size}: at most 1 GiB")));
    }
    config
        .timing
        .validate()
        .map_err(|e| BenchError::Config(e.to_string()))?;
    let wall_start = Instant::now();
    let fabric = EmbeddedFabric::new(FabricConfig {
        faults: config.faults,
        link_latency: config.link_latency,
    });
    fabric.set_capture(config.capture);
    let requester = Side::new(&fabric, MAC_REQUESTER, config.timing, config.direct_wqe)?;
    let responder = Side::new(&fabric, MAC_RESPONDER, config.timing, config.direct_wqe)?;
    let recorder = crate::recording::Recorder::default();
    if config.record {
        requester.device.with_device(|d| recorder.attach(d, "requester"));
        responder.device.with_device(|d| recorder.attach(d, "responder"));
    }
    let slot_size = size.max(8).next_multiple_of(64);
    let depth = if config.latency_test { 1 } else { config.tx_depth };
    let (slots, window) = if config.single_buffer {
        (1, depth as u64)
    } else {
        // A slot is reused only after its message completed: the window is the slots.
        let slots = (MAX_SLOT_BYTES / slot_size).clamp(1, config.tx_depth);
        (slots, if config.latency_test { 1 } else { slots as u64 })
    };
    let timeout = ack_timeout(config, size as u64);
    if config.cq_moderation > window {
        return Err(BenchError::Config(format!(
            "cq-mod {}: at most the {window} messages a pair keeps outstanding, or the window fills before a \
             completion is asked for",
            config.cq_moderation
        )));
    }
    // Queues hold a window of sends and, for SENDs, of receives: twice a window of CQEs.
    let queue_depth = 2 * config.tx_depth.max(WINDOW);
    let mut pairs = Vec::with_capacity(config.queue_pairs);
    for index in 0..config.queue_pairs {
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        // The slots, then the pair's 8-byte atomic word (so no payload ever lands on it).
        let requester_mr = requester
            .pd
            .register_user_memory(vec![0u8; slots * slot_size + 64], access)?;
        let responder_mr = responder
            .pd
            .register_user_memory(vec![0u8; slots * slot_size + 64], access)?;
        let depth = queue_depth as u32;
        let requester_cq = requester.context.create_cq(depth, None, 0)?;
        let responder_cq = responder.context.create_cq(depth, None, 0)?;
        let caps = QpCapabilities {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: config.inline_size,
        };
        let requester_qp = requester.pd.create_qp(&QpInitAttributes {
            send_cq: &requester_cq,
            recv_cq: &requester_cq,
            srq: None,
            cap: caps,
            qp_type: QpType::Rc,
            sq_sig_all: config.cq_moderation == 1,
        })?;
        let responder_qp = responder.pd.create_qp(&QpInitAttributes {
            send_cq: &responder_cq,
            recv_cq: &responder_cq,
            srq: None,
            cap: caps,
            qp_type: QpType::Rc,
            sq_sig_all: config.cq_moderation == 1,
        })?;
        if !config.connection_manager {
            connect(&requester_qp, &responder_qp, &responder, mtu, timeout)?;
            connect(&responder_qp, &requester_qp, &requester, mtu, timeout)?;
        }
        pairs.push(Pair {
            index,
            requester_qp,
            responder_qp,
            requester_cq,
            responder_cq,
            requester_mr,
            responder_mr,
            slots,
            slot_size,
            posted: 0,
            completed: 0,
            pending_receives: std::collections::VecDeque::with_capacity(queue_depth),
            atomics_done: 0,
            expected_digest: DIGEST_SEED,
            observed_digest: DIGEST_SEED,
            window,
            last_completion: Picoseconds::ZERO,
            posted_at: std::collections::VecDeque::with_capacity(queue_depth),
        });
    }

    let session = if config.connection_manager {
        let qps: Vec<_> = pairs.iter().map(|p| (&p.requester_qp, &p.responder_qp)).collect();
        Some(crate::cm_session::CmSession::connect(
            &fabric,
            &requester.context,
            &responder.context,
            &qps,
            mtu,
        )?)
    } else {
        None
    };
    for pair in &pairs {
        prepare_buffers(config, pair, size)?;
    }
    let before = transport_retransmissions(&requester.device) + transport_retransmissions(&responder.device);
    let cqes_written =
        || requester.device.with_device(|d| d.counters().cqes) + responder.device.with_device(|d| d.counters().cqes);
    let cqes_before = cqes_written();
    for side in [&requester, &responder] {
        side.device.with_device(|d| d.timing_mut().reset_totals());
    }
    let mut yardsticks = Yardsticks::new(config, size, slots, slot_size);
    let (memcpy_gbps, frame_floor_mpps) = match &mut yardsticks {
        Some(yardsticks) => {
            let (memcpy, floor) = yardsticks.measure()?;
            (Some(memcpy), floor)
        }
        None => (None, None),
    };
    // The traces start where the totals do, so per stage they add up to the same figures.
    let mut traces: Vec<Trace> = if config.trace {
        [&requester, &responder]
            .iter()
            .map(|side| {
                side.device.with_device(|d| {
                    d.timing_mut().set_stage_log(true);
                    Trace::new(d.timing().totals())
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    // Charges are laid from the instant they are collected at: after every pass of the
    // driver loop (its posts and the events of its time step).
    let collect_charges = |traces: &mut Vec<Trace>| {
        let now = fabric.now();
        for (trace, side) in traces.iter_mut().zip([&requester, &responder]) {
            side.device.with_device(|d| {
                let charges = d.timing_mut().take_stage_log();
                trace.add_charges(now, &charges, d.timing().totals());
            });
        }
    };
    let start = fabric.now();
    let measure_start = Instant::now();
    let cpu_start = thread_cpu_seconds();
    let mut report = BenchReport {
        operation: config.operation.name(),
        size,
        iterations: config.iterations,
        queue_pairs: config.queue_pairs,
        mtu: config.mtu,
        mode: config.mode.name(),
        preset: config.preset.clone(),
        test: if config.latency_test { "lat" } else { "bw" },
        messages_expected: config.iterations * config.queue_pairs as u64,
        memcpy_gbps,
        frame_floor_mpps,
        ..BenchReport::default()
    };
    let expected_messages = config.iterations * config.queue_pairs as u64;
    let mut timings = Timings {
        latencies: Vec::with_capacity(expected_messages.min(1 << 24) as usize),
        completions: Vec::with_capacity(expected_messages.min(1 << 24) as usize),
        one_way: Vec::new(),
    };
    let clock = Clock {
        mode: config.mode,
        fabric: &fabric,
        wall_start: measure_start,
    };
    let expected = config.iterations * config.queue_pairs as u64;
    let mut completions = vec![WorkCompletion::default(); queue_depth];
    let mut buffer = vec![0u8; size];
    let mut check = vec![0u8; size];
    let mut last_progress = fabric.now();
    // Pairs are stepped only when they can have something to do: after a CQE was written
    // (found by scanning from where the last one was found, until as many completions as
    // new CQEs are consumed) or after their previous step did something (a freed window
    // slot to post into). This changes nothing but the wall time with many QPs.
    let mut seen_cqes = cqes_before;
    let mut dirty: Vec<usize> = (0..pairs.len()).collect();
    let mut next_dirty: Vec<usize> = Vec::with_capacity(pairs.len());
    // Membership of `dirty` and `next_dirty` by pair: searching the lists instead cost a
    // pass time proportional to their length for every pair the scan steps (1 024 QPs).
    let mut in_dirty = vec![true; pairs.len()];
    let mut in_next_dirty = vec![false; pairs.len()];
    let mut cursor = 0usize;
    let mut passes = 0u32;
    let ids = [requester.device.device_id(), responder.device.device_id()];
    while report.messages_ok + report.messages_failed < expected {
        passes += 1;
        if passes >= PROGRESS_PASSES {
            passes = 0;
            progress(Progress {
                done: report.messages_ok + report.messages_failed,
                expected,
                sim_time: Picoseconds(fabric.now().0 - start.0),
            });
        }
        let cqes = cqes_written();
        let mut unseen = cqes - seen_cqes;
        seen_cqes = cqes;
        let mut progress = false;
        let mut measure = (&clock, &mut timings);
        for &i in &dirty {
            let (active, consumed) = step(
                config,
                &mut pairs[i],
                &mut completions,
                &mut buffer,
                &mut check,
                &mut report,
                &mut measure,
            )?;
            unseen = unseen.saturating_sub(consumed);
            if active {
                progress = true;
                next_dirty.push(i);
                in_next_dirty[i] = true;
            }
        }
        let mut scanned = 0;
        while unseen > 0 && scanned < pairs.len() {
            let i = cursor;
            if !in_dirty[i] || pairs.len() <= 1 {
                let (active, consumed) = step(
                    config,
                    &mut pairs[i],
                    &mut completions,
                    &mut buffer,
                    &mut check,
                    &mut report,
                    &mut measure,
                )?;
                unseen = unseen.saturating_sub(consumed);
                if active {
                    progress = true;
                    if !in_next_dirty[i] {
                        next_dirty.push(i);
                        in_next_dirty[i] = true;
                    }
                }
            }
            scanned += 1;
            if unseen > 0 {
                cursor = (cursor + 1) % pairs.len();
            }
        }
        for &i in &dirty {
            in_dirty[i] = false;
        }
        std::mem::swap(&mut dirty, &mut next_dirty);
        std::mem::swap(&mut in_dirty, &mut in_next_dirty);
        next_dirty.clear();
        collect_charges(&mut traces);
        if progress {
            last_progress = fabric.now();
        } else {
            // A pass that stepped no pair leaves none dirty, so every pass until a CQE is
            // written would only step time again: the fabric takes those steps on its own
            // and wakes the loop when one is (or when the stall check is due).
            let steps = step_time(config, &fabric, &ids, seen_cqes, last_progress + STALL_LIMIT);
            passes = passes.saturating_add(u32::try_from(steps - 1).unwrap_or(u32::MAX));
            collect_charges(&mut traces);
            if fabric.now() > last_progress + STALL_LIMIT {
                return Err(BenchError::Stalled {
                    limit: STALL_LIMIT,
                    done: report.messages_ok + report.messages_failed,
                    expected,
                });
            }
        }
    }
    if std::env::var_os("RNIC_BENCH_DIAGNOSTICS").is_some() {
        for side in [&requester, &responder] {
            side.device.with_device(|d| {
                for diagnostic in d.diagnostics().recent() {
                    eprintln!("diagnostic: {diagnostic}");
                }
            });
        }
    }
    for pair in &pairs {
        if pair.expected_digest != pair.observed_digest {
            failure(&mut report, format!("pair {}: payload digests differ", pair.index));
        }
    }
    report.sim_time_ps = fabric.now().0 - start.0;
    let spans = pairs.iter().map(|p| p.last_completion.0.saturating_sub(start.0).max(1));
    let (shortest, longest) = spans.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
    // Every pair moves the same bytes: throughput ratio = span ratio.
    report.qp_fairness = longest as f64 / shortest as f64;
    let elapsed = match config.mode {
        Mode::Virtual => report.sim_time_ps as f64 * 1e-12,
        Mode::Wall => measure_start.elapsed().as_secs_f64(),
    };
    report.cpu_time_s = (thread_cpu_seconds() - cpu_start).max(0.0);
    summarise(&mut report, &timings, config, size, elapsed, window);
    // The yardsticks again, on a machine now busy: measured only before, a run that began
    // while the machine was still waking up (the first after a pause read the floor up to
    // a third low) got a slow yardstick and a flattering ratio. The faster of the two
    // counts, so a ratio is never better than the machine allows.
    if let Some(yardsticks) = &mut yardsticks {
        let (memcpy, floor) = yardsticks.measure()?;
        report.memcpy_gbps = faster(report.memcpy_gbps, Some(memcpy));
        report.frame_floor_mpps = faster(report.frame_floor_mpps, floor);
    }
    collect_charges(&mut traces);
    for side in [&requester, &responder] {
        side.device.with_device(|d| d.timing_mut().set_stage_log(false));
    }
    report.traces = traces;
    let (a, b) = (
        requester.device.with_device(|d| stage_state(d)),
        responder.device.with_device(|d| stage_state(d)),
    );
    report.requester_stages = a.0;
    report.responder_stages = b.0;
    report.mtt_hits = a.1 + b.1;
    report.mtt_misses = a.2 + b.2;
    report.cqes_written = cqes_written() - cqes_before;
    report.retransmissions =
        transport_retransmissions(&requester.device) + transport_retransmissions(&responder.device) - before;
    if let Some(session) = session {
        report.connection_manager = true;
        report.cm_mads = session.disconnect()?;
    }
    report.recording = recorder.take();
    report.fabric = fabric.statistics();
    report.frames = report.fabric.sent;
    report.wall_time_s = wall_start.elapsed().as_secs_f64();
    let capture = if config.capture {
        fabric.take_capture()
    } else {
        Vec::new()
    };
    Ok((report, capture))
}

/// Wall mode's yardsticks for one run, made once and measured before and after its
/// traffic: this machine's memcpy ([`MemcpyYardstick`]) and, for WRITE, READ and SEND,
/// the frame floor ([`crate::frame_floor`]).
struct Yardsticks {
    memcpy: MemcpyYardstick,
    floor: Option<FloorMessage>,
}

impl Yardsticks {
    /// The yardsticks of a run of `config` moving messages of `size` bytes through
    /// `slots` buffers `slot_size` apart per pair; `None` in virtual mode.
    fn new(config: &BenchConfig, size: usize, slots: usize, slot_size: usize) -> Option<Self> {
        (config.mode == Mode::Wall).then(|| Self {
            memcpy: MemcpyYardstick::new(size, config.queue_pairs, slots, slot_size),
            floor: config
                .operation
                .floor_operation()
                .map(|operation| FloorMessage::new(operation, size, config.mtu as usize)),
        })
    }

    /// Memcpy in Gb/s and the frame floor in millions of messages per second, each the
    /// median of [`YARDSTICK_ROUNDS`] rounds.
    ///
    /// # Errors
    /// [`BenchError::FrameFloor`].
    fn measure(&mut self) -> Result<(f64, Option<f64>), BenchError> {
        let memcpy_gbps = self.memcpy.measure(YARDSTICK_ROUNDS);
        let floor_mpps = match &self.floor {
            Some(message) => Some(frame_floor_rate(message, YARDSTICK_ROUNDS, FLOOR_ROUND)? / 1e6),
            None => None,
        };
        Ok((memcpy_gbps, floor_mpps))
    }
}

/// Rounds of each yardstick measurement; a run measures twice, before and after its
/// traffic, and the faster median counts.
const YARDSTICK_ROUNDS: usize = 3;

/// The larger of two measurements of one yardstick (either may be missing).
fn faster(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// This machine's memcpy, for the ratio wall mode prints beside its goodput: messages of
/// `size` bytes copied from `pairs` sets of `slots` buffers `slot_size` apart into as many
/// others, the pairs in turn and each pair slot after slot, as the pairs' messages move
/// (so a run whose buffers outgrow the CPU caches, with a buffer per message or with many
/// pairs, is compared with a memcpy whose buffers do too). The buffers are faulted in
/// once and measured as often as asked.
pub struct MemcpyYardstick {
    source: Vec<u8>,
    destination: Vec<u8>,
    size: usize,
    pairs: usize,
    slots: usize,
    slot_size: usize,
}

impl MemcpyYardstick {
    /// Buffers for messages of `size` bytes in `pairs` sets of `slots` slots `slot_size`
    /// apart, every page touched.
    pub fn new(size: usize, pairs: usize, slots: usize, slot_size: usize) -> Self {
        let pairs = pairs.max(1);
        let slots = slots.max(1);
        let size = size.min(slot_size);
        let length = pairs * slots * slot_size;
        // Backed as the embedded NIC backs a registered buffer (huge pages where the
        // kernel gives them), so the two are compared on the same kind of memory.
        let mut source = vec![0u8; length];
        let mut destination = vec![0u8; length];
        for buffer in [&mut source, &mut destination] {
            let _ = rnic_os::advise_huge_pages(buffer.as_ptr() as usize, buffer.len());
        }
        source.fill(0x5a);
        // One pass first: every page of both is faulted in before anything is timed.
        destination.copy_from_slice(&source);
        Self {
            source,
            destination,
            size,
            pairs,
            slots,
            slot_size,
        }
    }

    /// Gb/s: the median of `rounds` rounds (at least one), each of at least one pass
    /// over every slot and 4 ms (`MEMCPY_ROUND`) of wall time.
    pub fn measure(&mut self, rounds: usize) -> f64 {
        let (size, pairs, slots, slot_size) = (self.size, self.pairs, self.slots, self.slot_size);
        let mut rates = Vec::with_capacity(rounds.max(1));
        let mut copy = YardstickCopy::default();
        let pass = pairs * slots;
        for _ in 0..rounds.max(1) {
            let started = Instant::now();
            let mut copies = 0usize;
            // The clock is read once per batch of about 64 KiB, so small copies are not
            // measured as clock reads.
            let batch = (MEMCPY_BATCH_BYTES / size.max(1)).max(1);
            while copies < pass || started.elapsed() < MEMCPY_ROUND {
                for _ in 0..batch {
                    let at = copy.offset(slots, slot_size);
                    self.destination[at..at + size].copy_from_slice(std::hint::black_box(&self.source[at..at + size]));
                    std::hint::black_box(&mut self.destination);
                    copy.advance(pairs, slots);
                    copies += 1;
                }
            }
            let seconds = started.elapsed().as_secs_f64();
            rates.push((copies * size) as f64 * 8.0 / seconds / 1e9);
        }
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    }
}

/// Where [`MemcpyYardstick`] is in its pass: every pair moves its next slot's message,
/// then the next slot of every pair, as pairs that keep their windows full take turns.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct YardstickCopy {
    pair: usize,
    slot: usize,
}

impl YardstickCopy {
    /// The offset of this copy's buffer, the pairs' slots laid out pair after pair.
    fn offset(self, slots: usize, slot_size: usize) -> usize {
        (self.pair * slots + self.slot) * slot_size
    }

    fn advance(&mut self, pairs: usize, slots: usize) {
        self.pair += 1;
        if self.pair == pairs {
            self.pair = 0;
            self.slot = (self.slot + 1) % slots;
        }
    }
}

/// Bytes [`MemcpyYardstick`] copies between two reads of the clock.
const MEMCPY_BATCH_BYTES: usize = 64 << 10;
/// Least wall time of one round of [`MemcpyYardstick::measure`].
const MEMCPY_ROUND: std::time::Duration = std::time::Duration::from_millis(4);

/// This thread's CPU time, seconds (0 where the OS cannot say).
fn thread_cpu_seconds() -> f64 {
    rnic_os::thread_cpu_time().map_or(0.0, |time| time.as_secs_f64())
}

/// Lets virtual time pass when the drivers have nothing to do, until something they can
/// see may have changed; returns the steps taken.
///
/// In virtual mode that is the first step after which the devices `ids` have written more
/// than `seen_cqes` CQEs, or virtual time is past `stall_check` (every step when tracing,
/// whose charges are laid at the instant they are collected after each step).
fn step_time(
    config: &BenchConfig,
    fabric: &EmbeddedFabric,
    ids: &[DeviceId],
    seen_cqes: u64,
    stall_check: Picoseconds,
) -> u64 {
    match config.mode {
        // Wake exactly when something can have changed: completions are seen at the
        // instant their CQE is written.
        Mode::Virtual if config.trace => {
            fabric.advance_to_next_event(IDLE_STEP);
            1
        }
        Mode::Virtual => fabric.advance_to_next_event_until(IDLE_STEP, |fabric| {
            let cqes: u64 = ids.iter().map(|&id| fabric.device(id).cqes_written()).sum();
            cqes != seen_cqes || fabric.now() > stall_check
        }),
        // Flat out: fewer, longer steps.
        Mode::Wall => {
            fabric.advance(IDLE_STEP);
            1
        }
    }
}

/// The clock figures are taken from.
struct Clock<'a> {
    mode: Mode,
    fabric: &'a EmbeddedFabric,
    wall_start: Instant,
}

impl Clock<'_> {
    /// Now: virtual ps, or wall ns since the measurement started.
    fn now(&self, virtual_now: Picoseconds) -> u64 {
        match self.mode {
            Mode::Virtual => virtual_now.0,
            Mode::Wall => self.wall_start.elapsed().as_nanos() as u64,
        }
    }
}

/// Timing totals and MTT hits and misses of one NIC.
fn stage_state(device: &rnic_hw_model::Device) -> (StageTotals, u64, u64) {
    let timing = device.timing();
    (timing.totals(), timing.mtt_hits, timing.mtt_misses)
}

/// Element `q` (0..=1) of sorted `values`, nearest rank.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Bandwidth, message rate and latency figures from the measured times.
fn summarise(
    report: &mut BenchReport,
    timings: &Timings,
    config: &BenchConfig,
    size: usize,
    elapsed: f64,
    window: u64,
) {
    let messages = timings.completions.len() as u64;
    if messages == 0 || elapsed <= 0.0 {
        return;
    }
    let bytes = |n: u64| (n * size as u64) as f64;
    report.bw_gbps = bytes(messages) * 8.0 / elapsed / 1e9;
    report.msg_rate_mpps = messages as f64 / elapsed / 1e6;
    // Units of the recorded times: ps in virtual mode, ns in wall mode.
    let per_second = match config.mode {
        Mode::Virtual => 1e12,
        Mode::Wall => 1e9,
    };
    let mut completions = timings.completions.clone();
    completions.sort_unstable();
    // Completions arrive in bursts (ACK coalescing): stretches of several windows.
    let stretch = (messages / 10).max(4 * window * config.queue_pairs as u64).max(1) as usize;
    let mut peak = report.bw_gbps;
    if stretch < completions.len() {
        for i in stretch..completions.len() {
            let span = completions[i] - completions[i - stretch];
            if span > 0 {
                peak = peak.max(bytes(stretch as u64) * 8.0 / (span as f64 / per_second) / 1e9);
            }
        }
    }
    report.bw_peak_gbps = peak;
    let mut latencies = timings.latencies.clone();
    latencies.sort_unstable();
    let to_us = |v: u64| v as f64 / per_second * 1e6;
    // A run whose requester completions were all polled after the measured span (a short
    // SEND run) has message rates but no latency samples: its latencies stay 0.
    if let (Some(&first), Some(&last)) = (latencies.first(), latencies.last()) {
        report.lat_us = [
            to_us(first),
            to_us(quantile(&latencies, 0.5)),
            to_us(quantile(&latencies, 0.99)),
            to_us(last),
        ];
    }
    // Only a pure SEND latency test reports the one-way figure (what a ping-pong's half
    // round trip measures); every other report is unchanged.
    if config.latency_test && config.operation == Operation::Send && !timings.one_way.is_empty() {
        let mut one_way = timings.one_way.clone();
        one_way.sort_unstable();
        report.one_way_us = Some([
            to_us(one_way[0]),
            to_us(quantile(&one_way, 0.5)),
            to_us(quantile(&one_way, 0.99)),
            to_us(one_way[one_way.len() - 1]),
        ]);
    }
}

fn transport_retransmissions(device: &EmbeddedDevice) -> u64 {
    device.with_device(|d| d.transport_counters().retransmitted_packets)
}

const DIGEST_SEED: u64 = 0xCBF2_9CE4_8422_2325;

/// FNV-1a over `bytes`, continuing `digest`.
fn fold_digest(digest: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(digest, |d, b| (d ^ *b as u64).wrapping_mul(0x0000_0100_0000_01B3))
}

/// The operation of message `message` of pair `pair`.
fn operation_of(config: &BenchConfig, pair: usize, message: u64) -> Operation {
    match config.operation {
        Operation::Mixed => {
            let x = (message ^ (pair as u64) << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            [Operation::Write, Operation::Read, Operation::Send, Operation::Atomic][(x >> 62) as usize]
        }
        other => other,
    }
}

/// Bytes message `message` moves.
fn message_size(config: &BenchConfig, size: usize, pair: usize, message: u64) -> usize {
    match operation_of(config, pair, message) {
        Operation::Atomic => 8,
        _ => size,
    }
}

/// Posts what the window allows and consumes completions for one pair; returns whether
/// anything happened and how many completions it consumed.
fn step(
    config: &BenchConfig,
    pair: &mut Pair,
    completions: &mut [WorkCompletion],
    buffer: &mut [u8],
    check: &mut [u8],
    report: &mut BenchReport,
    (clock, timings): &mut (&Clock<'_>, &mut Timings),
) -> Result<(bool, u64), BenchError> {
    let mut progress = false;
    let mut consumed = 0u64;
    let size = report.size;
    while pair.posted < config.iterations && pair.posted - pair.completed < pair.window {
        let message = pair.posted;
        let length = message_size(config, size, pair.index, message);
        if operation_of(config, pair.index, message) == Operation::Send {
            // The receive goes first, so a SEND never meets an empty receive queue.
            let slot = (message % pair.slots as u64) as usize;
            let sge = Sge::new(
                pair.responder_mr.addr() + (slot * pair.slot_size) as u64,
                length as u32,
                pair.responder_mr.lkey(),
            );
            pair.responder_qp
                .post_recv(&[RecvWorkRequest {
                    wr_id: message,
                    sg_list: &[sge],
                }])
                .map_err(|e| BenchError::Post(e.to_string()))?;
        }
        let posted = clock.now(clock.fabric.now());
        if operation_of(config, pair.index, message) == Operation::Send {
            pair.pending_receives.push_back((message, posted));
        }
        pair.posted_at.push_back(posted);
        post_one(config, pair, &mut buffer[..length])?;
        pair.posted += 1;
        progress = true;
    }
    let got = pair.requester_cq.poll(completions)?;
    consumed += got as u64;
    for wc in &completions[..got] {
        progress = true;
        let message = wc.wr_id;
        // RC completes in posting order, so with --cq-mod one completion stands for its
        // own message and every unsignalled one posted before it.
        let expected_signal = next_signalled(config, pair.completed);
        let covered = if (pair.completed..=expected_signal).contains(&message) {
            message - pair.completed + 1
        } else {
            failure(
                report,
                format!(
                    "pair {}: completion of message {message}, expected {expected_signal}",
                    pair.index
                ),
            );
            1
        };
        let now = clock.fabric.now();
        let completed = clock.now(now);
        pair.last_completion = now;
        for k in 0..covered {
            let implied = k + 1 < covered;
            let message = pair.completed;
            pair.completed += 1;
            if let Some(posted) = pair.posted_at.pop_front() {
                // A SEND's bytes are delivered when its receive completes: that instant
                // is recorded below, with the responder's completions.
                if operation_of(config, pair.index, message) != Operation::Send {
                    timings.completions.push(completed);
                }
                if !implied {
                    // Only a signalled message has an instant of its own.
                    timings.latencies.push(completed.saturating_sub(posted));
                }
            }
            if !implied && wc.status != WcStatus::Success {
                failure(
                    report,
                    format!(
                        "pair {} message {message}: {:?} (vendor {})",
                        pair.index, wc.status, wc.vendor_err
                    ),
                );
                continue;
            }
            settle_requester(config, pair, report, message, buffer, check)?;
        }
    }
    let got = pair.responder_cq.poll(completions)?;
    consumed += got as u64;
    for wc in &completions[..got] {
        progress = true;
        let message = wc.wr_id;
        // Goodput counts a SEND when its bytes are delivered. Counting it at the
        // requester's completion instead left the last SEND of every run out: the run
        // ends at the last receive completion, before the ACK of the last SEND completes
        // it at the requester (docs/timing.md, "The SEND tail").
        let delivered = clock.now(clock.fabric.now());
        timings.completions.push(delivered);
        match pair.pending_receives.pop_front() {
            Some((expected, posted)) if expected == message => {
                timings.one_way.push(delivered.saturating_sub(posted));
            }
            _ => failure(report, format!("pair {}: receive {message} out of order", pair.index)),
        }
        if wc.status != WcStatus::Success || wc.byte_len as usize != size {
            failure(
                report,
                format!(
                    "pair {} receive {message}: {:?}, {} bytes",
                    pair.index, wc.status, wc.byte_len
                ),
            );
            continue;
        }
        if !config.verify {
            report.messages_ok += 1;
            continue;
        }
        let offset = ((message % pair.slots as u64) as usize * pair.slot_size) as u64;
        let (expected, found) = (&mut buffer[..size], &mut check[..size]);
        fill_pattern(expected, pair.index, message);
        pair.responder_mr.read(offset, found)?;
        settle_message(pair, report, message, expected, found);
    }
    Ok((progress, consumed))
}

/// The index of the first message at or after `message` that asks for a completion.
fn next_signalled(config: &BenchConfig, message: u64) -> u64 {
    let moderation = config.cq_moderation.max(1);
    let signal = message - message % moderation + moderation - 1;
    signal.min(config.iterations.saturating_sub(1)).max(message)
}

/// Accounts one requester-side message that completed successfully: counted, and with
/// `verify` its bytes checked (a SEND is counted when its receive completes).
fn settle_requester(
    config: &BenchConfig,
    pair: &mut Pair,
    report: &mut BenchReport,
    message: u64,
    buffer: &mut [u8],
    check: &mut [u8],
) -> Result<(), BenchError> {
    let operation = operation_of(config, pair.index, message);
    if operation == Operation::Send {
        return Ok(());
    }
    let length = message_size(config, report.size, pair.index, message);
    let offset = ((message % pair.slots as u64) as usize * pair.slot_size) as u64;
    if operation == Operation::Atomic {
        pair.atomics_done += 1;
    }
    if !config.verify {
        // Nothing is compared: the expected bytes would only be thrown away, and in
        // wall mode their fill would be timed as if it were the NIC's work.
        report.messages_ok += 1;
        return Ok(());
    }
    let (expected, found) = (&mut buffer[..length], &mut check[..length]);
    match operation {
        Operation::Write => {
            fill_pattern(expected, pair.index, message);
            pair.responder_mr.read(offset, found)?;
        }
        Operation::Read => {
            fill_pattern(expected, pair.index, message);
            pair.requester_mr.read(offset, found)?;
        }
        _ => {
            expected.copy_from_slice(&(pair.atomics_done - 1).to_le_bytes());
            pair.requester_mr.read(offset, found)?;
        }
    }
    settle_message(pair, report, message, expected, found);
    Ok(())
}

/// Scores one completed message of a verifying run: compares and folds the digests.
fn settle_message(pair: &mut Pair, report: &mut BenchReport, message: u64, expected: &[u8], found: &[u8]) {
    pair.expected_digest = fold_digest(pair.expected_digest, expected);
    pair.observed_digest = fold_digest(pair.observed_digest, found);
    if expected == found {
        report.messages_ok += 1;
        report.bytes_verified += expected.len() as u64;
    } else {
        failure(
            report,
            format!("pair {} message {message}: payload differs", pair.index),
        );
    }
}

fn failure(report: &mut BenchReport, what: String) {
    report.messages_failed += 1;
    if report.failures.len() < 10 {
        report.failures.push(what);
    }
}

/// Whether every message's source bytes are written when it is posted: only when someone
/// can see which message's bytes a slot holds (a check or a capture).
fn fills_every_message(config: &BenchConfig) -> bool {
    config.verify || config.capture
}

/// Readies a pair's buffers before the measurement, as perftest does before its clock
/// starts: in wall mode every byte of both regions is written once, so no page of them is
/// first touched (and faulted in and zeroed by the operating system) while the clock
/// runs, and, unless every message is filled when posted, each slot gets the bytes its
/// first message carries. Nothing here is the NIC's work, and no virtual time passes.
fn prepare_buffers(config: &BenchConfig, pair: &Pair, size: usize) -> Result<(), BenchError> {
    const CHUNK: usize = 1 << 20;
    // Page faults cost wall time only: virtual mode skips the pass.
    if config.mode == Mode::Wall {
        let slots_bytes = pair.slots * pair.slot_size;
        let zeros = vec![0u8; CHUNK.min(slots_bytes)];
        for region in [&pair.requester_mr, &pair.responder_mr] {
            // The slots only: the pair's atomic word after them keeps its value.
            let mut offset = 0usize;
            while offset < slots_bytes {
                let length = zeros.len().min(slots_bytes - offset);
                region.write(offset as u64, &zeros[..length])?;
                offset += length;
            }
        }
    }
    if fills_every_message(config) {
        return Ok(());
    }
    let mut buffer = vec![0u8; size];
    for message in 0..(pair.slots as u64).min(config.iterations) {
        let length = message_size(config, size, pair.index, message);
        let offset = message * pair.slot_size as u64;
        let bytes = &mut buffer[..length];
        match operation_of(config, pair.index, message) {
            Operation::Write | Operation::Send => {
                fill_pattern(bytes, pair.index, message);
                pair.requester_mr.write(offset, bytes)?;
            }
            Operation::Read => {
                fill_pattern(bytes, pair.index, message);
                pair.responder_mr.write(offset, bytes)?;
            }
            Operation::Atomic | Operation::Mixed => {}
        }
    }
    Ok(())
}

fn post_one(config: &BenchConfig, pair: &mut Pair, buffer: &mut [u8]) -> Result<(), BenchError> {
    let message = pair.posted;
    let slot = (message % pair.slots as u64) as usize;
    let offset = (slot * pair.slot_size) as u64;
    let size = buffer.len();
    let signalled = config.cq_moderation == 1 || next_signalled(config, message) == message;
    let local = Sge::new(pair.requester_mr.addr() + offset, size as u32, pair.requester_mr.lkey());
    let remote = RdmaFields {
        remote_addr: pair.responder_mr.addr() + offset,
        rkey: pair.responder_mr.rkey(),
    };
    let mut request = SendWorkRequest {
        wr_id: message,
        opcode: WrOpcode::RdmaWrite,
        sg_list: std::slice::from_ref(&local),
        send_flags: if signalled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        },
        ..SendWorkRequest::default()
    };
    let inline = size as u64 <= u64::from(config.inline_size);
    // The pattern names the message so that a check can tell messages apart. When
    // nothing is checked or captured, nobody can see which message's bytes a slot holds,
    // so, as perftest does, a slot is filled once, before the measurement
    // (`prepare_buffers`): the refill would be the harness's work, timed in wall mode as
    // if it were the NIC's.
    let fill = fills_every_message(config);
    match operation_of(config, pair.index, message) {
        Operation::Write => {
            if fill {
                fill_pattern(buffer, pair.index, message);
                pair.requester_mr.write(offset, buffer)?;
            }
            request.rdma = remote;
            if inline {
                request.send_flags |= SendFlags::INLINE;
            }
        }
        Operation::Send => {
            if fill {
                fill_pattern(buffer, pair.index, message);
                pair.requester_mr.write(offset, buffer)?;
            }
            request.opcode = WrOpcode::Send;
            if inline {
                request.send_flags |= SendFlags::INLINE;
            }
        }
        Operation::Read => {
            if fill {
                fill_pattern(buffer, pair.index, message);
                // The pattern names the message, so bytes left from the slot's previous
                // read can never pass the check.
                pair.responder_mr.write(offset, buffer)?;
            }
            request.opcode = WrOpcode::RdmaRead;
            request.rdma = remote;
        }
        Operation::Atomic | Operation::Mixed => {
            request.opcode = WrOpcode::AtomicFetchAdd;
            // Every atomic adds 1 to the pair's word, so the old value the k-th atomic
            // fetches is exactly k (RC executes in order).
            request.atomic = AtomicFields {
                remote_addr: pair.responder_mr.addr() + (pair.slots * pair.slot_size) as u64,
                compare_add: 1,
                swap: 0,
                rkey: pair.responder_mr.rkey(),
            };
        }
    }
    pair.requester_qp
        .post_send(&[request])
        .map_err(|e| BenchError::Post(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_hw_model::timing::PRESETS;

    #[test]
    fn a_yardstick_measured_twice_counts_its_faster_measurement() {
        // A slow measurement (a machine still waking up) must not flatter the ratio.
        assert_eq!(faster(Some(3.1), Some(4.6)), Some(4.6));
        assert_eq!(faster(Some(4.6), Some(3.1)), Some(4.6));
        assert_eq!(faster(Some(2.0), None), Some(2.0));
        assert_eq!(faster(None, Some(2.0)), Some(2.0));
        assert_eq!(faster(None, None), None, "virtual mode has no yardstick");
    }

    #[test]
    fn the_memcpy_yardstick_passes_over_every_slot_of_every_pair_once_the_pairs_in_turn() {
        let (pairs, slots, slot_size) = (3, 2, 64);
        let mut copy = YardstickCopy::default();
        let offsets: Vec<usize> = (0..pairs * slots)
            .map(|_| {
                let at = copy.offset(slots, slot_size);
                copy.advance(pairs, slots);
                at
            })
            .collect();
        // Pair 0 slot 0, pair 1 slot 0, pair 2 slot 0, then every pair's slot 1.
        assert_eq!(offsets, [0, 128, 256, 64, 192, 320]);
        assert_eq!(copy, YardstickCopy::default(), "a pass ends where it began");
        assert!(MemcpyYardstick::new(100, 4, 1, 128).measure(YARDSTICK_ROUNDS) > 0.0);
    }

    #[test]
    fn a_run_passes_only_when_every_message_asked_for_moved_and_none_failed() {
        let asked = BenchReport {
            operation: "write",
            size: 4096,
            iterations: 100,
            queue_pairs: 2,
            mtu: 1024,
            messages_expected: 200,
            messages_ok: 200,
            ..BenchReport::default()
        };
        assert_eq!(asked.verdict(), Ok(()));
        // Fewer messages with no failure counted: the run silently fell short.
        let short = BenchReport {
            messages_ok: 150,
            ..asked.clone()
        };
        assert_eq!(
            short.verdict(),
            Err("150 messages ok of 200 asked for (4096 B x 100 on 2 QP(s))".to_string())
        );
        let nothing = BenchReport {
            messages_ok: 0,
            ..asked.clone()
        };
        assert!(nothing.verdict().is_err());
        let failed = BenchReport {
            messages_ok: 199,
            messages_failed: 1,
            ..asked.clone()
        };
        assert_eq!(failed.verdict(), Err("1 of 200 messages failed".to_string()));
        assert!(!failed.awaits_peer_confirmation());
        // ib_write_lat's last WRITE, its ACK lost after the peer left: not ok, not failed.
        let unconfirmed = BenchReport {
            messages_ok: 199,
            messages_unconfirmed: 1,
            ..asked.clone()
        };
        assert_eq!(
            unconfirmed.verdict(),
            Err("1 of 200 messages unconfirmed: only the peer's report can tell whether they arrived".to_string())
        );
        assert!(unconfirmed.awaits_peer_confirmation());
        assert!(
            unconfirmed
                .to_text()
                .starts_with("write 4096 B x 100 on 2 QP(s), MTU 1024: 199 ok, 0 failed, 1 unconfirmed,"),
            "{}",
            unconfirmed.to_text()
        );
        let unconfirmed_and_failed = BenchReport {
            messages_ok: 198,
            messages_failed: 1,
            ..unconfirmed.clone()
        };
        assert!(unconfirmed_and_failed.verdict().is_err());
        assert!(!unconfirmed_and_failed.awaits_peer_confirmation());
        assert!(!asked.awaits_peer_confirmation());
        // A note tells the reader of a harmless error; it changes no verdict.
        let noted = BenchReport {
            notes: vec!["write 100: RetryExcErr, but answered".to_string()],
            ..asked.clone()
        };
        assert!(noted
            .to_text()
            .ends_with("note: write 100: RetryExcErr, but answered\n"));
        assert_eq!(noted.verdict(), Ok(()));
        assert!(
            asked.to_json().ends_with(",\"messages_expected\":200}"),
            "{}",
            asked.to_json()
        );
    }

    #[test]
    fn every_runner_says_how_many_messages_it_was_asked_for() {
        let config = BenchConfig {
            size: 64,
            iterations: 5,
            queue_pairs: 3,
            verify: true,
            ..BenchConfig::default()
        };
        let (report, _) = run(&config).unwrap();
        assert_eq!(report.messages_expected, 15);
        assert_eq!(report.verdict(), Ok(()));
        assert_eq!(crate::remote::new_report(&config).messages_expected, 15);
    }

    /// A configuration of `queue_pairs` pairs moving `size`-byte WRITEs at `mtu`.
    fn pairs_of(queue_pairs: usize, size: usize, mtu: u32) -> BenchConfig {
        BenchConfig {
            size,
            queue_pairs,
            mtu,
            ..BenchConfig::default()
        }
    }

    #[test]
    fn every_reference_run_keeps_the_one_millisecond_ack_timeout() {
        // 4.096 µs × 2⁸ ≈ 1 ms: against it a lost tail packet costs little virtual time.
        assert_eq!(ack_timeout_ps(ACK_TIMEOUT_MIN_EXPONENT), 1_048_576_000);
        // The matrix of scripts/reference-runs (up to 4 QPs, sizes up to the sweep's
        // 8 MiB, both MTUs, every preset, PCIe x4): with 4 QPs, 4 × 64 packets between
        // AckReqs take at most 0.4 ms even at 25 Gb/s, so the lossy 1 MiB runs wait out a
        // tail loss in 1 ms.
        for preset in PRESETS {
            for mtu in [256, 1024, 4096] {
                for size in [2, 8, 4096, 65536, 1 << 20, 8 << 20] {
                    for queue_pairs in [1, 3, 4] {
                        let mut config = pairs_of(queue_pairs, size, mtu);
                        config.timing = TimingParams::preset(preset).unwrap();
                        assert_eq!(
                            ack_timeout(&config, size as u64),
                            8,
                            "{preset}, {queue_pairs} QPs, {size} B, MTU {mtu}"
                        );
                        config.timing.pcie_lanes = 4;
                        assert_eq!(
                            ack_timeout(&config, size as u64),
                            8,
                            "{preset} PCIe x4, {queue_pairs} QPs, {size} B"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn with_many_backlogged_queue_pairs_the_ack_timeout_covers_twice_their_turn() {
        // 1 024 QPs × 64 KiB at MTU 4096: a QP asks for an ACK at the end of each message
        // (16 packets); meanwhile every other QP sends 16 packets of at most 4 096 + 102
        // header bytes, each 8 + 12 + 4 bytes longer on the wire: 337.76 ns at 100 Gb/s.
        // With the 1 µs link both ways, twice the wait is 2 × (1 024 × 16 × 337.76 ns +
        // 2 µs) = 11.07 ms: 4.096 µs × 2¹¹ = 8.39 ms is short of it, 2¹² = 16.78 ms covers it.
        let config = pairs_of(1024, 65536, 4096);
        let twice_the_wait = 2 * (1024 * 16 * 337_760 + 2 * 1_000_000);
        let exponent = ack_timeout(&config, 65536);
        assert_eq!(exponent, 12);
        assert!(ack_timeout_ps(exponent - 1) < twice_the_wait);
        assert!(ack_timeout_ps(exponent) >= twice_the_wait);
        // One packet per message: each QP asks after every packet and the turn is short.
        assert_eq!(ack_timeout(&pairs_of(1024, 8, 4096), 8), 8);
        // Long messages: AckReq every 64 packets however long the message, so 8 MiB
        // messages wait as long as 256 KiB ones.
        assert_eq!(
            ack_timeout(&pairs_of(1024, 8 << 20, 4096), 8 << 20),
            ack_timeout(&pairs_of(1024, 256 << 10, 4096), 256 << 10)
        );
    }

    #[test]
    fn a_slow_link_or_a_narrow_pcie_link_lengthens_the_ack_timeout_even_for_one_queue_pair() {
        // 1 Gb/s: 64 packets of 4 KiB take 2.16 ms, longer than the 1 ms timeout itself.
        let mut slow = pairs_of(1, 1 << 20, 4096);
        slow.timing.link_gbps = 1;
        let exponent = ack_timeout(&slow, 1 << 20);
        assert_eq!(exponent, 11);
        assert!(ack_timeout_ps(exponent) >= 2 * 64 * 33_776_000);
        // One PCIe Gen3 lane (≈ 7.9 Gb/s) reads the payload slower than 100 Gb/s sends it.
        let mut narrow = pairs_of(64, 65536, 4096);
        let wide = ack_timeout(&narrow, 65536);
        narrow.timing.pcie_lanes = 1;
        assert!(ack_timeout(&narrow, 65536) > wide);
    }

    #[test]
    fn hundreds_of_backlogged_queue_pairs_are_never_retransmitted_on_a_clean_wire() {
        // 256 QPs × 16 packets at 337.76 ns is 1.38 ms between a QP's ACKs, beyond the
        // 1 ms timeout a single QP gets: with it, every QP would time out and resend.
        let config = BenchConfig {
            size: 65536,
            iterations: 2,
            queue_pairs: 256,
            verify: false,
            single_buffer: true,
            ..BenchConfig::default()
        };
        let (report, _) = run(&config).unwrap();
        assert_eq!(report.verdict(), Ok(()));
        assert_eq!(report.retransmissions, 0);
    }

    #[test]
    fn fill_pattern_matches_pattern_byte() {
        for len in [0, 1, 7, 8, 9, 255, 256, 257, 1000, 4099] {
            for (pair, message) in [(0, 0), (3, 1), (1023, u64::MAX), (7, 123_456_789)] {
                let mut buffer = vec![0u8; len];
                fill_pattern(&mut buffer, pair, message);
                let expected: Vec<u8> = (0..len).map(|i| pattern_byte(pair, message, i)).collect();
                assert_eq!(buffer, expected, "len {len} pair {pair} message {message}");
            }
        }
    }
}
