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

use rnic_hw_model::fabric::{CapturedFrame, FabricConfig, FabricStatistics, FaultPlan};
use rnic_hw_model::time::Picoseconds;
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric};
use rnic_verbs::{
    AccessFlags, AhAttributes, AtomicFields, CompletionQueue, Context, DeviceAccess, MemoryRegion, Mtu,
    ProtectionDomain, QpAttributeMask, QpAttributes, QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair,
    RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, WcStatus, WorkCompletion, WrOpcode,
};

/// Messages a pair keeps outstanding.
pub const WINDOW: usize = 16;
/// Most bytes of buffer slots per side and pair.
const MAX_SLOT_BYTES: usize = 64 << 20;
/// Virtual time the drivers let pass when nothing completed (a poll-loop back-off).
const IDLE_STEP_NS: u64 = 2_000;
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
    /// Messages that completed successfully (and verified, when verifying).
    pub messages_ok: u64,
    /// Messages that completed with an error or failed verification.
    pub messages_failed: u64,
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
    /// The first failures, for the human-readable report.
    pub failures: Vec<String>,
}

impl BenchReport {
    /// One JSON object on one line.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"op\":\"{}\",\"size\":{},\"iters\":{},\"qps\":{},\"mtu\":{},\"messages_ok\":{},\"messages_failed\":{},\
             \"bytes_verified\":{},\"retransmissions\":{},\"frames\":{},\"frames_dropped\":{},\"frames_duplicated\":{},\
             \"frames_reordered\":{},\"frames_corrupted\":{},\"sim_time_ps\":{},\"wall_time_s\":{:.6}}}",
            self.operation,
            self.size,
            self.iterations,
            self.queue_pairs,
            self.mtu,
            self.messages_ok,
            self.messages_failed,
            self.bytes_verified,
            self.retransmissions,
            self.frames,
            self.fabric.dropped,
            self.fabric.duplicated,
            self.fabric.reordered,
            self.fabric.corrupted,
            self.sim_time_ps,
            self.wall_time_s
        )
    }

    /// A short human-readable summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} {} B x {} on {} QP(s), MTU {}: {} ok, {} failed, {} bytes verified",
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
        out
    }
}

/// The byte at offset `i` of message `message` of pair `pair`.
fn pattern_byte(pair: usize, message: u64, i: usize) -> u8 {
    let x = (message.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (pair as u64) << 56).wrapping_add(i as u64 / 8);
    (x >> ((i % 8) * 8)) as u8 ^ (i as u8)
}

fn fill_pattern(buffer: &mut [u8], pair: usize, message: u64) {
    for (i, b) in buffer.iter_mut().enumerate() {
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
    fn new(fabric: &EmbeddedFabric, mac: [u8; 6]) -> Result<Self, BenchError> {
        let device = fabric.add_nic(mac);
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
    /// Message numbers of posted SENDs whose receive has not completed, in order.
    pending_receives: std::collections::VecDeque<u64>,
    /// Fetch-and-adds completed: the old value the next one must return.
    atomics_done: u64,
    /// Running digest of the payloads as the sender meant them.
    expected_digest: u64,
    /// Running digest of the payloads as the receiver found them.
    observed_digest: u64,
}

fn mtu_from_bytes(bytes: u32) -> Result<Mtu, BenchError> {
    Mtu::from_bytes(bytes).ok_or_else(|| BenchError::Config(format!("MTU {bytes}: one of 256, 512, 1024, 2048, 4096")))
}

fn connect(qp: &QueuePair, remote: &QueuePair, remote_side: &Side, mtu: Mtu) -> Result<(), BenchError> {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::ACCESS_FLAGS,
    )?;
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rtr,
            path_mtu: mtu,
            dest_qp_num: remote.qp_num(),
            rq_psn: 0,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
            ah_attr: AhAttributes {
                dgid: remote_side.context.query_gid(1, 0)?,
                dmac: remote_side.context.mac_address(),
                hop_limit: 64,
                ..AhAttributes::default()
            },
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE
            | QpAttributeMask::AV
            | QpAttributeMask::PATH_MTU
            | QpAttributeMask::DEST_QPN
            | QpAttributeMask::RQ_PSN
            | QpAttributeMask::MAX_DEST_RD_ATOMIC
            | QpAttributeMask::MIN_RNR_TIMER,
    )?;
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rts,
            sq_psn: 0,
            // 4.096 µs × 2^8 ≈ 1 ms: long against the fabric's microsecond round trip,
            // short enough that a lost tail packet costs little virtual time.
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE
            | QpAttributeMask::SQ_PSN
            | QpAttributeMask::TIMEOUT
            | QpAttributeMask::RETRY_CNT
            | QpAttributeMask::RNR_RETRY
            | QpAttributeMask::MAX_QP_RD_ATOMIC,
    )?;
    Ok(())
}

/// Runs one benchmark; returns its report and, when `config.capture` is set, every frame
/// that left a device.
pub fn run(config: &BenchConfig) -> Result<(BenchReport, Vec<CapturedFrame>), BenchError> {
    let mtu = mtu_from_bytes(config.mtu)?;
    if config.queue_pairs == 0 || config.queue_pairs > 256 {
        return Err(BenchError::Config(format!("{} QPs: 1..=256", config.queue_pairs)));
    }
    let size = if config.operation == Operation::Atomic {
        8
    } else {
        config.size
    };
    if size > 1 << 30 {
        return Err(BenchError::Config(format!("message size {size}: at most 1 GiB")));
    }
    let wall_start = Instant::now();
    let fabric = EmbeddedFabric::new(FabricConfig {
        faults: config.faults,
        ..FabricConfig::default()
    });
    fabric.set_capture(config.capture);
    let requester = Side::new(&fabric, MAC_REQUESTER)?;
    let responder = Side::new(&fabric, MAC_RESPONDER)?;
    let slot_size = size.max(8).next_multiple_of(64);
    let slots = (MAX_SLOT_BYTES / slot_size).clamp(1, WINDOW);
    let window = slots as u64;
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
        let depth = (2 * WINDOW) as u32;
        let requester_cq = requester.context.create_cq(depth, None, 0)?;
        let responder_cq = responder.context.create_cq(depth, None, 0)?;
        let caps = QpCapabilities {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let requester_qp = requester.pd.create_qp(&QpInitAttributes {
            send_cq: &requester_cq,
            recv_cq: &requester_cq,
            srq: None,
            cap: caps,
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })?;
        let responder_qp = responder.pd.create_qp(&QpInitAttributes {
            send_cq: &responder_cq,
            recv_cq: &responder_cq,
            srq: None,
            cap: caps,
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })?;
        connect(&requester_qp, &responder_qp, &responder, mtu)?;
        connect(&responder_qp, &requester_qp, &requester, mtu)?;
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
            pending_receives: std::collections::VecDeque::with_capacity(WINDOW),
            atomics_done: 0,
            expected_digest: DIGEST_SEED,
            observed_digest: DIGEST_SEED,
        });
    }

    let before = transport_retransmissions(&requester.device) + transport_retransmissions(&responder.device);
    let start = fabric.now();
    let mut report = BenchReport {
        operation: config.operation.name(),
        size,
        iterations: config.iterations,
        queue_pairs: config.queue_pairs,
        mtu: config.mtu,
        ..BenchReport::default()
    };
    let expected = config.iterations * config.queue_pairs as u64;
    let mut completions = [WorkCompletion::default(); WINDOW * 2];
    let mut buffer = vec![0u8; size];
    let mut check = vec![0u8; size];
    let mut last_progress = fabric.now();
    while report.messages_ok + report.messages_failed < expected {
        let mut progress = false;
        for pair in &mut pairs {
            progress |= step(
                config,
                pair,
                window,
                &mut completions,
                &mut buffer,
                &mut check,
                &mut report,
            )?;
        }
        if progress {
            last_progress = fabric.now();
        } else {
            requester.device.delay(IDLE_STEP_NS);
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
    report.retransmissions =
        transport_retransmissions(&requester.device) + transport_retransmissions(&responder.device) - before;
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
/// anything happened.
fn step(
    config: &BenchConfig,
    pair: &mut Pair,
    window: u64,
    completions: &mut [WorkCompletion],
    buffer: &mut [u8],
    check: &mut [u8],
    report: &mut BenchReport,
) -> Result<bool, BenchError> {
    let mut progress = false;
    let size = report.size;
    while pair.posted < config.iterations && pair.posted - pair.completed < window {
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
            pair.pending_receives.push_back(message);
        }
        post_one(config, pair, &mut buffer[..length])?;
        pair.posted += 1;
        progress = true;
    }
    let got = pair.requester_cq.poll(completions)?;
    for wc in &completions[..got] {
        progress = true;
        let message = wc.wr_id;
        if message != pair.completed {
            failure(
                report,
                format!(
                    "pair {}: completion of message {message}, expected {}",
                    pair.index, pair.completed
                ),
            );
        }
        pair.completed += 1;
        if wc.status != WcStatus::Success {
            failure(
                report,
                format!(
                    "pair {} message {message}: {:?} (vendor {})",
                    pair.index, wc.status, wc.vendor_err
                ),
            );
            continue;
        }
        let operation = operation_of(config, pair.index, message);
        if operation == Operation::Send {
            continue; // counted when the receive completes
        }
        let length = message_size(config, size, pair.index, message);
        let offset = ((message % pair.slots as u64) as usize * pair.slot_size) as u64;
        let (expected, found) = (&mut buffer[..length], &mut check[..length]);
        match operation {
            Operation::Write => {
                fill_pattern(expected, pair.index, message);
                if config.verify {
                    pair.responder_mr.read(offset, found)?;
                }
            }
            Operation::Read => {
                fill_pattern(expected, pair.index, message);
                if config.verify {
                    pair.requester_mr.read(offset, found)?;
                }
            }
            _ => {
                expected.copy_from_slice(&pair.atomics_done.to_le_bytes());
                pair.atomics_done += 1;
                if config.verify {
                    pair.requester_mr.read(offset, found)?;
                }
            }
        }
        settle_message(config, pair, report, message, expected, found);
    }
    let got = pair.responder_cq.poll(completions)?;
    for wc in &completions[..got] {
        progress = true;
        let message = wc.wr_id;
        if pair.pending_receives.pop_front() != Some(message) {
            failure(report, format!("pair {}: receive {message} out of order", pair.index));
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
        let offset = ((message % pair.slots as u64) as usize * pair.slot_size) as u64;
        let (expected, found) = (&mut buffer[..size], &mut check[..size]);
        fill_pattern(expected, pair.index, message);
        if config.verify {
            pair.responder_mr.read(offset, found)?;
        }
        settle_message(config, pair, report, message, expected, found);
    }
    Ok(progress)
}

/// Scores one completed message: compares and folds the digests when verifying.
fn settle_message(
    config: &BenchConfig,
    pair: &mut Pair,
    report: &mut BenchReport,
    message: u64,
    expected: &[u8],
    found: &[u8],
) {
    if !config.verify {
        report.messages_ok += 1;
        return;
    }
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

fn post_one(config: &BenchConfig, pair: &mut Pair, buffer: &mut [u8]) -> Result<(), BenchError> {
    let message = pair.posted;
    let slot = (message % pair.slots as u64) as usize;
    let offset = (slot * pair.slot_size) as u64;
    let size = buffer.len();
    let local = Sge::new(pair.requester_mr.addr() + offset, size as u32, pair.requester_mr.lkey());
    let remote = RdmaFields {
        remote_addr: pair.responder_mr.addr() + offset,
        rkey: pair.responder_mr.rkey(),
    };
    let mut request = SendWorkRequest {
        wr_id: message,
        opcode: WrOpcode::RdmaWrite,
        sg_list: std::slice::from_ref(&local),
        send_flags: SendFlags::SIGNALED,
        ..SendWorkRequest::default()
    };
    match operation_of(config, pair.index, message) {
        Operation::Write => {
            fill_pattern(buffer, pair.index, message);
            pair.requester_mr.write(offset, buffer)?;
            request.rdma = remote;
        }
        Operation::Send => {
            fill_pattern(buffer, pair.index, message);
            pair.requester_mr.write(offset, buffer)?;
            request.opcode = WrOpcode::Send;
        }
        Operation::Read => {
            fill_pattern(buffer, pair.index, message);
            // The pattern names the message, so bytes left from the slot's previous read
            // can never pass the check.
            pair.responder_mr.write(offset, buffer)?;
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
