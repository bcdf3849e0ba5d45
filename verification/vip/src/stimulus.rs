//! Seeded constrained-random stimulus and a per-QP scoreboard.
//!
//! A [`Stimulus`] is a list of work requests drawn from a seed under constraints (the
//! opcodes, size classes and QPs allowed; message sizes bounded by the path MTU times a
//! packet count): the same seed and constraints give the same requests on every
//! platform. Each request names its buffers (offsets in the requester's and responder's
//! regions, one slot per request, so requests never overlap) and the bytes its source
//! must hold ([`WorkRequest::payload`]).
//!
//! A [`Scoreboard`] predicts, per QP and in posting order, what must come back — the
//! requester's completion of each request, the responder's completion for the opcodes
//! that consume a receive, and the bytes that must land at the destination — and
//! compares what the testbench observed. Every failure names the seed, the QP and the
//! request (`seed 7: QP 0x10, WR 3 (RDMA_WRITE, 1500 B): …`), so a failing run is
//! reproduced from its message alone.
//!
//! The model is not involved here: a Rust or Python testbench posts the requests on the
//! model, on RTL, or on both, and hands the scoreboard what it saw.

use std::collections::{BTreeMap, VecDeque};

use rnic_hw_model::fabric::FaultRng;
use serde::Serialize;

/// A work request's operation (RC verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum WrOpcode {
    /// SEND (consumes a receive at the responder).
    Send,
    /// SEND with immediate (consumes a receive; the immediate is delivered).
    SendWithImm,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate (consumes a receive; the immediate is delivered).
    RdmaWriteWithImm,
    /// RDMA READ (the responder's bytes land in the requester's buffer).
    RdmaRead,
}

impl WrOpcode {
    /// Every opcode, in a fixed order.
    pub const ALL: [WrOpcode; 5] = [
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
    ];

    /// The verbs name (`SEND`, `SEND_WITH_IMM`, `RDMA_WRITE`, `RDMA_WRITE_WITH_IMM`,
    /// `RDMA_READ`).
    pub fn name(self) -> &'static str {
        match self {
            WrOpcode::Send => "SEND",
            WrOpcode::SendWithImm => "SEND_WITH_IMM",
            WrOpcode::RdmaWrite => "RDMA_WRITE",
            WrOpcode::RdmaWriteWithImm => "RDMA_WRITE_WITH_IMM",
            WrOpcode::RdmaRead => "RDMA_READ",
        }
    }

    /// The opcode named `name` (as [`WrOpcode::name`] spells it, any case).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.name().eq_ignore_ascii_case(name))
    }

    /// Whether the responder completes a receive for it.
    pub fn consumes_receive(self) -> bool {
        matches!(
            self,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
        )
    }

    /// Whether it carries an immediate.
    pub fn has_immediate(self) -> bool {
        matches!(self, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm)
    }
}

/// A class of message sizes, relative to the path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum SizeClass {
    /// 0 bytes.
    Zero,
    /// 1 to 256 bytes (at most the MTU).
    Small,
    /// 257 bytes to one MTU: one full-size packet at most.
    OnePacket,
    /// More than one MTU, up to `max_packets` MTUs.
    MultiPacket,
}

impl SizeClass {
    /// Every class, in a fixed order.
    pub const ALL: [SizeClass; 4] = [
        SizeClass::Zero,
        SizeClass::Small,
        SizeClass::OnePacket,
        SizeClass::MultiPacket,
    ];

    /// The class's name (`zero`, `small`, `one_packet`, `multi_packet`).
    pub fn name(self) -> &'static str {
        match self {
            SizeClass::Zero => "zero",
            SizeClass::Small => "small",
            SizeClass::OnePacket => "one_packet",
            SizeClass::MultiPacket => "multi_packet",
        }
    }

    /// The class named `name` (any case).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// Inclusive size bounds, bytes, under `mtu` and `max_packets`; None when the class
    /// is empty under them (e.g. `OnePacket` with a 256-byte MTU).
    pub fn bounds(self, mtu: u32, max_packets: u32) -> Option<(u32, u32)> {
        let (low, high) = match self {
            SizeClass::Zero => (0, 0),
            SizeClass::Small => (1, 256.min(mtu)),
            SizeClass::OnePacket => (257, mtu),
            SizeClass::MultiPacket => (mtu + 1, mtu.saturating_mul(max_packets)),
        };
        (low <= high).then_some((low, high))
    }
}

/// A requester/responder pair of QPs the stimulus may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QpPair {
    /// The QP the requests are posted on.
    pub requester: u32,
    /// Its peer (whose receives SENDs and WRITEs with immediate consume).
    pub responder: u32,
}

/// The constraints of a stimulus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StimulusConfig {
    /// The seed: the same seed and constraints give the same requests.
    pub seed: u64,
    /// Number of work requests.
    pub count: usize,
    /// The QP pairs the requests are spread over (uniformly).
    pub qps: Vec<QpPair>,
    /// The opcodes allowed (uniformly).
    pub opcodes: Vec<WrOpcode>,
    /// The size classes allowed (uniformly among those not empty under the MTU).
    pub size_classes: Vec<SizeClass>,
    /// Path MTU, bytes (256, 512, 1024, 2048 or 4096).
    pub mtu: u32,
    /// The largest message, in packets of `mtu` bytes (≥ 1).
    pub max_packets: u32,
}

impl Default for StimulusConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            count: 32,
            qps: vec![QpPair {
                requester: 0x10,
                responder: 0x20,
            }],
            opcodes: WrOpcode::ALL.to_vec(),
            size_classes: SizeClass::ALL.to_vec(),
            mtu: 1024,
            max_packets: 4,
        }
    }
}

/// Why a stimulus could not be drawn or a comparison failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StimulusError {
    /// The constraints leave nothing to draw from.
    #[error("stimulus constraints (seed {seed}): {reason}")]
    Constraints {
        /// The seed of the refused configuration.
        seed: u64,
        /// What is wrong.
        reason: String,
    },
    /// What came back differs from the prediction.
    #[error("{0}")]
    Mismatch(ScoreboardMismatch),
}

/// One work request of a stimulus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkRequest {
    /// Its number in the stimulus (0 first); also its `wr_id`.
    pub index: u64,
    /// The requester QP it is posted on.
    pub qpn: u32,
    /// The responder QP.
    pub remote_qpn: u32,
    /// Its number among the requests of its QP (0 first).
    pub sequence: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// The size class it was drawn from.
    pub size_class: SizeClass,
    /// Message length, bytes.
    pub length: u32,
    /// The immediate, for the opcodes that carry one.
    pub immediate: Option<u32>,
    /// Offset of its buffer in the requester's region, bytes (the source; for READ the
    /// destination).
    pub local_offset: u64,
    /// Offset of its buffer in the responder's region, bytes (WRITE and READ: the remote
    /// address's offset; SEND: where its receive buffer is posted).
    pub remote_offset: u64,
    /// Seed of its payload bytes.
    pub data_seed: u64,
}

impl WorkRequest {
    /// The bytes the source buffer holds before the request is posted (the requester's
    /// for SEND and WRITE, the responder's for READ), and so the bytes that must land at
    /// the destination.
    pub fn payload(&self) -> Vec<u8> {
        let mut rng = FaultRng::new(self.data_seed);
        let mut bytes = Vec::with_capacity(self.length as usize + 8);
        while bytes.len() < self.length as usize {
            bytes.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        bytes.truncate(self.length as usize);
        bytes
    }

    /// Whether the destination is the requester's buffer (RDMA READ).
    pub fn lands_at_requester(&self) -> bool {
        self.opcode == WrOpcode::RdmaRead
    }

    fn describe(&self) -> String {
        format!("WR {} ({}, {} B)", self.index, self.opcode.name(), self.length)
    }
}

/// A drawn stimulus: its constraints and its requests in posting order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stimulus {
    config: StimulusConfig,
    requests: Vec<WorkRequest>,
}

impl Stimulus {
    /// Draws `config.count` requests from `config.seed`.
    pub fn generate(config: StimulusConfig) -> Result<Self, StimulusError> {
        let refuse = |reason: String| StimulusError::Constraints {
            seed: config.seed,
            reason,
        };
        if ![256, 512, 1024, 2048, 4096].contains(&config.mtu) {
            return Err(refuse(format!("MTU {}: 256, 512, 1024, 2048 or 4096", config.mtu)));
        }
        if !(1..=1024).contains(&config.max_packets) {
            return Err(refuse(format!("max_packets {}: 1 to 1024", config.max_packets)));
        }
        if config.qps.is_empty() || config.opcodes.is_empty() {
            return Err(refuse("no QP or no opcode allowed".into()));
        }
        let classes: Vec<(SizeClass, (u32, u32))> = config
            .size_classes
            .iter()
            .filter_map(|c| c.bounds(config.mtu, config.max_packets).map(|b| (*c, b)))
            .collect();
        if classes.is_empty() {
            return Err(refuse(format!(
                "no size class {:?} has sizes under MTU {} and {} packet(s)",
                config.size_classes, config.mtu, config.max_packets
            )));
        }
        let slot = Self::slot_size(&config);
        let mut rng = FaultRng::new(config.seed);
        let mut sequences = vec![0u64; config.qps.len()];
        let mut requests = Vec::with_capacity(config.count);
        for index in 0..config.count as u64 {
            let pair_index = pick(&mut rng, config.qps.len());
            let pair = config.qps[pair_index];
            let opcode = config.opcodes[pick(&mut rng, config.opcodes.len())];
            let (size_class, (low, high)) = classes[pick(&mut rng, classes.len())];
            let length = low + (rng.next_u64() % u64::from(high - low + 1)) as u32;
            let immediate = opcode.has_immediate().then(|| rng.next_u64() as u32);
            let data_seed = rng.next_u64();
            requests.push(WorkRequest {
                index,
                qpn: pair.requester,
                remote_qpn: pair.responder,
                sequence: sequences[pair_index],
                opcode,
                size_class,
                length,
                immediate,
                local_offset: index * slot,
                remote_offset: index * slot,
                data_seed,
            });
            sequences[pair_index] += 1;
        }
        Ok(Self { config, requests })
    }

    fn slot_size(config: &StimulusConfig) -> u64 {
        // Page-aligned slots, so no request's buffer shares a page with another's.
        (u64::from(config.mtu) * u64::from(config.max_packets)).next_multiple_of(4096)
    }

    /// The constraints it was drawn under.
    pub fn config(&self) -> &StimulusConfig {
        &self.config
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.config.seed
    }

    /// The requests, in posting order.
    pub fn requests(&self) -> &[WorkRequest] {
        &self.requests
    }

    /// Bytes each side's region must have for every request's buffer.
    pub fn region_size(&self) -> u64 {
        Self::slot_size(&self.config) * self.requests.len() as u64
    }

    /// The requests as JSON (for logs and for other languages).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.requests).unwrap_or_default()
    }
}

/// A uniform index below `n` (n ≥ 1).
fn pick(rng: &mut FaultRng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// Which side of the connection completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Side {
    /// The requester's send completion.
    Requester,
    /// The responder's receive completion.
    Responder,
}

/// A completion the testbench observed (from a CQE, a DUT's CQE write, or a verbs poll).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The QP the completion names (the requester's for a send completion, the
    /// responder's for a receive completion).
    pub qpn: u32,
    /// Which side completed.
    pub side: Side,
    /// The request it completes, as the testbench knows it (the requester's `wr_id`;
    /// for a receive, None when the testbench cannot tell — the scoreboard then takes the
    /// QP's next receive-consuming request).
    pub wr_id: Option<u64>,
    /// 0 for success; any other value is the CQE's status.
    pub status: u32,
    /// Bytes received (receive completions); None when not compared.
    pub byte_len: Option<u32>,
    /// The immediate delivered (receive completions).
    pub immediate: Option<u32>,
}

/// What a scoreboard found different, with everything needed to reproduce it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreboardMismatch {
    /// The stimulus's seed.
    pub seed: u64,
    /// The QP.
    pub qpn: u32,
    /// The request concerned, when one is.
    pub wr: Option<u64>,
    /// The request's opcode and length, when one is concerned.
    pub request: Option<String>,
    /// What differs: `expected …, got …`.
    pub detail: String,
}

impl std::fmt::Display for ScoreboardMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {}: QP {:#x}", self.seed, self.qpn)?;
        if let Some(request) = &self.request {
            write!(f, ", {request}")?;
        } else if let Some(wr) = self.wr {
            write!(f, ", WR {wr}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// Per QP, the completions still expected and the data checks still owed.
#[derive(Debug, Clone)]
pub struct Scoreboard {
    seed: u64,
    requests: Vec<WorkRequest>,
    /// Per requester QP: request indices awaiting their send completion, in order.
    send_pending: BTreeMap<u32, VecDeque<u64>>,
    /// Per responder QP: request indices awaiting their receive completion, in order.
    receive_pending: BTreeMap<u32, VecDeque<u64>>,
    /// Requests whose destination bytes were not checked yet.
    data_pending: BTreeMap<u64, ()>,
    mismatches: Vec<ScoreboardMismatch>,
    matched: u64,
}

impl Scoreboard {
    /// The predictions for `stimulus`: every request completes successfully at the
    /// requester, in posting order per QP; SEND, SEND with immediate and WRITE with
    /// immediate complete a receive at the responder with the message's length (and
    /// immediate), in posting order per QP; and every request's payload lands at its
    /// destination.
    pub fn new(stimulus: &Stimulus) -> Self {
        let mut send_pending: BTreeMap<u32, VecDeque<u64>> = BTreeMap::new();
        let mut receive_pending: BTreeMap<u32, VecDeque<u64>> = BTreeMap::new();
        for request in stimulus.requests() {
            send_pending.entry(request.qpn).or_default().push_back(request.index);
            if request.opcode.consumes_receive() {
                receive_pending
                    .entry(request.remote_qpn)
                    .or_default()
                    .push_back(request.index);
            }
        }
        Self {
            seed: stimulus.seed(),
            requests: stimulus.requests().to_vec(),
            send_pending,
            receive_pending,
            data_pending: stimulus.requests().iter().map(|r| (r.index, ())).collect(),
            mismatches: Vec::new(),
            matched: 0,
        }
    }

    /// The seed of the stimulus it scores.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn mismatch(&mut self, qpn: u32, wr: Option<u64>, detail: String) -> StimulusError {
        let mismatch = ScoreboardMismatch {
            seed: self.seed,
            qpn,
            wr,
            request: wr
                .and_then(|i| self.requests.get(i as usize))
                .map(WorkRequest::describe),
            detail,
        };
        self.mismatches.push(mismatch.clone());
        StimulusError::Mismatch(mismatch)
    }

    /// Compares one observed completion with the next one predicted for its QP and side.
    pub fn complete(&mut self, completion: &Completion) -> Result<(), StimulusError> {
        let queue = match completion.side {
            Side::Requester => self.send_pending.get_mut(&completion.qpn),
            Side::Responder => self.receive_pending.get_mut(&completion.qpn),
        };
        let side = match completion.side {
            Side::Requester => "send completion",
            Side::Responder => "receive completion",
        };
        let Some(expected) = queue.and_then(VecDeque::pop_front) else {
            let detail = format!("unexpected {side}: none (more) predicted for this QP");
            return Err(self.mismatch(completion.qpn, completion.wr_id, detail));
        };
        let request = self.requests[expected as usize].clone();
        if completion.side == Side::Requester {
            if let Some(wr_id) = completion.wr_id.filter(|id| *id != expected) {
                let detail = format!("{side} out of order: expected WR {expected} next, got WR {wr_id}");
                return Err(self.mismatch(completion.qpn, Some(expected), detail));
            }
        }
        if completion.status != 0 {
            let detail = format!("{side} status: expected 0 (success), got {:#x}", completion.status);
            return Err(self.mismatch(completion.qpn, Some(expected), detail));
        }
        if completion.side == Side::Responder {
            // WRITE with immediate too: the receive reports the bytes written (as rxe and
            // the model do).
            let want_length = request.length;
            if let Some(got) = completion.byte_len.filter(|got| *got != want_length) {
                let detail = format!("{side} byte_len: expected {want_length}, got {got}");
                return Err(self.mismatch(completion.qpn, Some(expected), detail));
            }
            if completion.immediate != request.immediate && request.immediate.is_some() {
                let detail = format!(
                    "{side} immediate: expected {:#x}, got {}",
                    request.immediate.unwrap_or_default(),
                    completion.immediate.map_or("none".into(), |i| format!("{i:#x}"))
                );
                return Err(self.mismatch(completion.qpn, Some(expected), detail));
            }
        }
        self.matched += 1;
        Ok(())
    }

    /// Compares the bytes found at request `wr`'s destination with its payload; the first
    /// differing byte is named.
    pub fn check_data(&mut self, wr: u64, bytes: &[u8]) -> Result<(), StimulusError> {
        let Some(request) = self.requests.get(wr as usize).cloned() else {
            let detail = format!("data for WR {wr}: the stimulus has {} requests", self.requests.len());
            return Err(self.mismatch(0, None, detail));
        };
        self.data_pending.remove(&wr);
        let expected = request.payload();
        let place = if request.lands_at_requester() {
            format!("requester buffer +{:#x}", request.local_offset)
        } else {
            format!("responder buffer +{:#x}", request.remote_offset)
        };
        if bytes.len() != expected.len() {
            let detail = format!(
                "data at {place}: expected {} bytes, got {}",
                expected.len(),
                bytes.len()
            );
            return Err(self.mismatch(request.qpn, Some(wr), detail));
        }
        if let Some(at) = expected.iter().zip(bytes).position(|(e, g)| e != g) {
            let detail = format!(
                "data at {place}, byte {at}: expected {:#04x}, got {:#04x}",
                expected[at], bytes[at]
            );
            return Err(self.mismatch(request.qpn, Some(wr), detail));
        }
        self.matched += 1;
        Ok(())
    }

    /// Ends the comparison: every predicted completion and data check that never came is
    /// a mismatch; returns all mismatches (those already returned included).
    pub fn finish(&mut self) -> &[ScoreboardMismatch] {
        let mut missing = Vec::new();
        for (qpn, queue) in std::mem::take(&mut self.send_pending) {
            missing.extend(queue.into_iter().map(|wr| (qpn, wr, "send completion never came")));
        }
        for (qpn, queue) in std::mem::take(&mut self.receive_pending) {
            missing.extend(queue.into_iter().map(|wr| (qpn, wr, "receive completion never came")));
        }
        for wr in std::mem::take(&mut self.data_pending).into_keys() {
            let qpn = self.requests[wr as usize].qpn;
            missing.push((qpn, wr, "data never checked"));
        }
        for (qpn, wr, what) in missing {
            let _ = self.mismatch(qpn, Some(wr), what.to_string());
        }
        &self.mismatches
    }

    /// The mismatches found so far.
    pub fn mismatches(&self) -> &[ScoreboardMismatch] {
        &self.mismatches
    }

    /// Completions and data checks that agreed.
    pub fn matched(&self) -> u64 {
        self.matched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_qps(seed: u64, count: usize) -> Stimulus {
        Stimulus::generate(StimulusConfig {
            seed,
            count,
            qps: vec![
                QpPair {
                    requester: 0x10,
                    responder: 0x20,
                },
                QpPair {
                    requester: 0x11,
                    responder: 0x21,
                },
            ],
            ..StimulusConfig::default()
        })
        .expect("valid constraints")
    }

    /// What a perfect DUT reports for `stimulus`, in posting order.
    fn perfect(stimulus: &Stimulus) -> (Vec<Completion>, Vec<(u64, Vec<u8>)>) {
        let mut completions = Vec::new();
        let mut data = Vec::new();
        for r in stimulus.requests() {
            completions.push(Completion {
                qpn: r.qpn,
                side: Side::Requester,
                wr_id: Some(r.index),
                status: 0,
                byte_len: None,
                immediate: None,
            });
            if r.opcode.consumes_receive() {
                completions.push(Completion {
                    qpn: r.remote_qpn,
                    side: Side::Responder,
                    wr_id: None,
                    status: 0,
                    byte_len: Some(r.length),
                    immediate: r.immediate,
                });
            }
            data.push((r.index, r.payload()));
        }
        (completions, data)
    }

    #[test]
    fn the_same_seed_draws_the_same_requests_and_another_seed_others() {
        assert_eq!(two_qps(7, 50), two_qps(7, 50));
        assert_ne!(two_qps(7, 50).requests(), two_qps(8, 50).requests());
    }

    #[test]
    fn requests_keep_to_their_constraints() {
        let stimulus = two_qps(3, 400);
        let config = stimulus.config();
        for r in stimulus.requests() {
            let (low, high) = r.size_class.bounds(config.mtu, config.max_packets).unwrap();
            assert!((low..=high).contains(&r.length), "{r:?}");
            assert!(r.length <= config.mtu * config.max_packets);
            assert_eq!(r.immediate.is_some(), r.opcode.has_immediate());
            assert!(r.local_offset + u64::from(r.length) <= stimulus.region_size());
            assert_eq!(r.payload().len(), r.length as usize);
        }
        // Every opcode, class and QP is drawn in 400 requests.
        for op in WrOpcode::ALL {
            assert!(stimulus.requests().iter().any(|r| r.opcode == op), "{op:?}");
        }
        for class in SizeClass::ALL {
            assert!(stimulus.requests().iter().any(|r| r.size_class == class), "{class:?}");
        }
        // Per QP, sequence numbers count up from 0.
        for qpn in [0x10, 0x11] {
            let sequences: Vec<u64> = stimulus
                .requests()
                .iter()
                .filter(|r| r.qpn == qpn)
                .map(|r| r.sequence)
                .collect();
            assert_eq!(sequences, (0..sequences.len() as u64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn constraints_that_leave_nothing_are_refused_with_the_seed() {
        let error = Stimulus::generate(StimulusConfig {
            seed: 99,
            mtu: 256,
            size_classes: vec![SizeClass::OnePacket],
            ..StimulusConfig::default()
        })
        .unwrap_err();
        assert!(error.to_string().contains("seed 99"), "{error}");
        assert!(Stimulus::generate(StimulusConfig {
            mtu: 1000,
            ..StimulusConfig::default()
        })
        .is_err());
    }

    #[test]
    fn a_perfect_run_matches_every_prediction() {
        let stimulus = two_qps(11, 60);
        let mut scoreboard = Scoreboard::new(&stimulus);
        let (completions, data) = perfect(&stimulus);
        for c in &completions {
            scoreboard.complete(c).unwrap();
        }
        for (wr, bytes) in &data {
            scoreboard.check_data(*wr, bytes).unwrap();
        }
        assert!(scoreboard.finish().is_empty());
        assert_eq!(scoreboard.matched(), (completions.len() + data.len()) as u64);
    }

    #[test]
    fn a_corrupted_result_is_caught_naming_the_qp_the_request_and_the_seed() {
        let stimulus = two_qps(0x5eed, 40);
        let victim = stimulus
            .requests()
            .iter()
            .find(|r| r.qpn == 0x11 && r.length > 16)
            .expect("a request on QP 0x11 with data")
            .clone();
        let mut scoreboard = Scoreboard::new(&stimulus);
        let (completions, data) = perfect(&stimulus);
        for c in &completions {
            scoreboard.complete(c).unwrap();
        }
        let mut caught = Vec::new();
        for (wr, mut bytes) in data {
            if wr == victim.index {
                bytes[9] ^= 0x40;
            }
            if let Err(error) = scoreboard.check_data(wr, &bytes) {
                caught.push(error.to_string());
            }
        }
        assert_eq!(caught.len(), 1, "{caught:?}");
        let message = &caught[0];
        assert!(message.starts_with("seed 24301: QP 0x11, "), "{message}");
        assert!(
            message.contains(&format!("WR {} ({}", victim.index, victim.opcode.name())),
            "{message}"
        );
        assert!(message.contains("byte 9"), "{message}");
        assert_eq!(scoreboard.finish().len(), 1);
    }

    #[test]
    fn wrong_status_order_length_and_missing_completions_are_caught() {
        let stimulus = two_qps(5, 30);
        let (completions, _) = perfect(&stimulus);
        // A failed status.
        let mut scoreboard = Scoreboard::new(&stimulus);
        let mut bad = completions[0];
        bad.status = 5;
        let error = scoreboard.complete(&bad).unwrap_err().to_string();
        assert!(
            error.contains("seed 5") && error.contains("WR 0") && error.contains("got 0x5"),
            "{error}"
        );
        // Two send completions of one QP swapped.
        let mut scoreboard = Scoreboard::new(&stimulus);
        let first = stimulus.requests()[0].clone();
        let second = stimulus.requests().iter().skip(1).find(|r| r.qpn == first.qpn).unwrap();
        let swapped = Completion {
            wr_id: Some(second.index),
            ..completions[0]
        };
        let error = scoreboard.complete(&swapped).unwrap_err().to_string();
        assert!(error.contains("out of order"), "{error}");
        // A receive of the wrong length.
        let mut scoreboard = Scoreboard::new(&stimulus);
        let receive = completions
            .iter()
            .find(|c| c.side == Side::Responder && c.byte_len.unwrap_or(0) > 0)
            .unwrap();
        let short = Completion {
            byte_len: receive.byte_len.map(|l| l - 1),
            ..*receive
        };
        let error = scoreboard.complete(&short).unwrap_err().to_string();
        assert!(error.contains("byte_len"), "{error}");
        // Nothing observed: every prediction is missing, each naming its seed.
        let mut scoreboard = Scoreboard::new(&stimulus);
        let missing = scoreboard.finish();
        assert_eq!(missing.len(), completions.len() + stimulus.requests().len());
        assert!(missing.iter().all(|m| m.seed == 5 && m.wr.is_some()));
    }
}
