//! The NVMe-oF/RDMA target: a discovery subsystem and NVM subsystems by NQN, served on
//! RC QPs (one per NVMe queue) that hosts connect through a [`Listener`].
//!
//! It is a poller ([`Target::poll`]): it accepts or rejects connection requests by their
//! CM private data, takes command capsules off its queues' completion queues, moves data
//! with RDMA READ (host → controller) and RDMA WRITE (controller → host) through keyed
//! SGLs or takes it from the capsule, executes the command against its controller and
//! block devices, and answers with a response capsule (SEND, or SEND WITH INVALIDATE
//! when the host asked for it). Between polls it enforces keep-alive timeouts and cleans
//! up after hosts that disconnected or vanished.
//!
//! Every capsule is hostile until checked: a malformed one is answered with the status
//! the specification gives (or, with no command identifier to answer, the queue is torn
//! down, as Linux's target does), counted in [`TargetCounters`] and logged under the
//! `rnic::diag` tracing target. Nothing is written to a block device unless its data
//! arrived whole and every check passed.

mod admin;
mod controller;
mod queue;
pub mod subsystem;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use rnic_verbs::{Context, ProtectionDomain, WcOpcode, WcStatus, WorkCompletion};

use crate::block::BlockDevice;
use crate::nvmeof::wire::cm::{parse_cm_request, CmRejectRepr, CmRejectStatus, CmReplyRepr, RECFMT};
use crate::nvmeof::wire::command::{
    log_page, parse_command_capsule, BlockRange, CapsuleError, Command, DataDirection, DataPointer, DsmRange, QueueKind,
};
use crate::nvmeof::wire::connect_data::{self, parse_connect_data, ConnectDataRepr, CNTLID_DYNAMIC, CONNECT_DATA_LEN};
use crate::nvmeof::wire::cqe::CqeRepr;
use crate::nvmeof::wire::identify::IDENTIFY_LEN;
use crate::nvmeof::wire::log::{trtype, ErrorLogEntryRepr};
use crate::nvmeof::wire::properties::{Cap, CSS_NVM};
use crate::nvmeof::wire::status::{InvalidParameter, Status};
use crate::nvmeof::wire::WireError;
use crate::rdma::{AcceptParams, Clock, IncomingRequest, Listener, Poller, ServiceAddress};

pub use subsystem::{AllowedHosts, Namespace, Subsystem, SubsystemCounters, SubsystemKind, DISCOVERY_NQN};

use controller::{Controller, ParkedAer, PropertyEffect, AER_LIMIT};
use queue::{decode_wr_id, QueueGeometry, QueueState, Request, Slot, Stage, TargetQueue, WorkKind};

/// How the target serves, beyond its subsystems.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Where it listens (reported in the Discovery log page).
    pub listen: ServiceAddress,
    /// Port ID reported in the Discovery log page.
    pub port_id: u16,
    /// Largest I/O queue, entries (CAP.MQES + 1, MAXCMD).
    pub max_queue_entries: u16,
    /// Largest admin queue, entries.
    pub max_admin_queue_entries: u16,
    /// I/O queues a controller may have.
    pub max_io_queues: u16,
    /// In-capsule data bytes an I/O command capsule may carry (0: none; IOCCSZ follows).
    pub in_capsule_data_size: u32,
    /// Maximum data transfer size, 2^MDTS pages of 4 KiB.
    pub mdts: u8,
    /// Bytes of data buffers per I/O queue (at least one maximum transfer).
    pub data_pool_bytes: usize,
    /// Keep-alive granularity, ms (Identify Controller KAS × 100).
    pub keep_alive_granularity_ms: u32,
    /// KATO a discovery controller gets when the host asks for none, ms: a host that
    /// vanishes from a discovery session is still cleaned up.
    pub discovery_default_kato_ms: u32,
}

impl Default for TargetConfig {
    fn default() -> Self {
        Self {
            listen: ServiceAddress::new(std::net::Ipv4Addr::UNSPECIFIED, 4420),
            port_id: 1,
            max_queue_entries: 128,
            max_admin_queue_entries: 32,
            max_io_queues: 16,
            in_capsule_data_size: 4096,
            mdts: 8,
            data_pool_bytes: 8 << 20,
            keep_alive_granularity_ms: 1000,
            discovery_default_kato_ms: 120_000,
        }
    }
}

impl TargetConfig {
    /// Largest transfer, bytes.
    pub fn max_transfer(&self) -> u32 {
        4096u32 << self.mdts.min(12)
    }
}

/// What can go wrong setting the target up.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The verbs layer refused a setup step.
    #[error("verbs: {0}")]
    Verbs(#[from] rnic_verbs::VerbsError),
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
}

/// What the target saw and did, for tests and reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetCounters {
    /// RDMA connections accepted (queues created).
    pub connections_accepted: u64,
    /// Connection requests rejected with an NVMe-oF REJ.
    pub connections_rejected: u64,
    /// Controllers created by admin Connects.
    pub controllers_created: u64,
    /// Command capsules received.
    pub capsules_received: u64,
    /// Commands answered with success.
    pub commands_succeeded: u64,
    /// Commands answered with an error status.
    pub commands_failed: u64,
    /// Error statuses by (SCT, SC).
    pub statuses: BTreeMap<(u8, u8), u64>,
    /// Capsules too short to answer (queue torn down).
    pub malformed_capsules: u64,
    /// Commands beyond the queue's size.
    pub queue_overruns: u64,
    /// Work completions in error (a wrong R_Key, memory the host did not register, a
    /// link that gave up).
    pub rdma_errors: u64,
    /// Controllers torn down because their keep-alive timer expired.
    pub keep_alive_expirations: u64,
    /// Queues torn down (for any reason).
    pub queues_torn_down: u64,
    /// Controllers torn down (for any reason).
    pub controllers_torn_down: u64,
    /// Bytes read from block devices for hosts.
    pub bytes_read: u64,
    /// Bytes written to block devices for hosts.
    pub bytes_written: u64,
}

impl TargetCounters {
    /// How many commands were answered with `status`.
    pub fn status_count(&self, status: Status) -> u64 {
        self.statuses.get(&(status.sct, status.sc)).copied().unwrap_or(0)
    }
}

/// What executing a command produced.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    status: Status,
    dw0: u32,
    dw1: u32,
    /// Bytes of the request's buffer to RDMA WRITE to the host before the response.
    to_host: Option<u32>,
    /// An AER with no event yet: no response now.
    park: bool,
}

impl Outcome {
    fn success(dw0: u32) -> Self {
        Self {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
            to_host: None,
            park: false,
        }
    }

    fn error(status: Status) -> Self {
        Self {
            status,
            ..Self::success(0)
        }
    }

    fn with_dw0(status: Status, dw0: u32) -> Self {
        Self {
            status,
            ..Self::success(dw0)
        }
    }
}

/// Polls between two looks at the clock for timers.
const HOUSEKEEPING_POLLS: u32 = 128;
/// Polls between two looks at the listener.
const LISTENER_POLLS: u32 = 16;
/// Work completions taken per CQ poll.
const POLL_BATCH: usize = 32;

/// The target.
pub struct Target {
    context: Context,
    pd: ProtectionDomain,
    listener: Box<dyn Listener>,
    clock: Clock,
    config: TargetConfig,
    subsystems: Vec<Subsystem>,
    controllers: BTreeMap<u16, Controller>,
    next_cntlid: u16,
    queues: Vec<Option<TargetQueue>>,
    counters: TargetCounters,
    /// Discovery log generation counter.
    genctr: u64,
    started_ns: u64,
    polls: u32,
    /// The capsule being parsed (its own buffer, so `scratch` keeps its data-sized
    /// allocation and is not cleared on every command).
    capsule: Vec<u8>,
    /// Data of the command being executed: a bounce buffer for the host's data and for
    /// devices that cannot lend their blocks.
    scratch: Vec<u8>,
    compare: Vec<u8>,
    diagnostics: rnic_diag::Limiter,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("listen", &self.listener.address())
            .field("subsystems", &self.subsystems.len())
            .field("controllers", &self.controllers.len())
            .field("queues", &self.queue_count())
            .finish()
    }
}

impl Target {
    /// A target on `context` that takes connections from `listener`, with the discovery
    /// subsystem and `subsystems`.
    ///
    /// # Errors
    /// [`TargetError::Config`] for duplicate NQNs, an NSID of 0 or 0xFFFFFFFF, block
    /// sizes other than 512..=4096, limits out of range; verbs failures.
    pub fn new(
        context: Context,
        listener: Box<dyn Listener>,
        clock: Clock,
        config: TargetConfig,
        subsystems: Vec<Subsystem>,
    ) -> Result<Self, TargetError> {
        if !(2..=1024).contains(&config.max_queue_entries) || !(2..=32).contains(&config.max_admin_queue_entries) {
            return Err(TargetError::Config(format!(
                "queue entries: I/O {} (2..=1024), admin {} (2..=32)",
                config.max_queue_entries, config.max_admin_queue_entries
            )));
        }
        if !config.in_capsule_data_size.is_multiple_of(16) || config.in_capsule_data_size > 65536 {
            return Err(TargetError::Config(format!(
                "in-capsule data {}: a multiple of 16 up to 64 KiB",
                config.in_capsule_data_size
            )));
        }
        if config.mdts == 0 || config.mdts > 12 || config.data_pool_bytes < config.max_transfer() as usize {
            return Err(TargetError::Config(format!(
                "MDTS {} (1..=12) needs a data pool of at least {} bytes, have {}",
                config.mdts,
                config.max_transfer(),
                config.data_pool_bytes
            )));
        }
        let mut all = vec![Subsystem::discovery()];
        for subsystem in subsystems {
            if all.iter().any(|s| s.nqn == subsystem.nqn) {
                return Err(TargetError::Config(format!(
                    "subsystem {} appears twice",
                    subsystem.nqn
                )));
            }
            if subsystem.nqn.is_empty() || subsystem.nqn.len() > connect_data::MAX_NQN_LEN {
                return Err(TargetError::Config(format!("NQN {:?}: 1..=223 bytes", subsystem.nqn)));
            }
            for namespace in subsystem.namespaces.values() {
                if namespace.nsid == 0 || namespace.nsid == u32::MAX {
                    return Err(TargetError::Config(format!(
                        "NSID {} in {}",
                        namespace.nsid, subsystem.nqn
                    )));
                }
                let block_size = namespace.device.block_size();
                if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
                    return Err(TargetError::Config(format!(
                        "namespace {} of {}: block size {block_size}",
                        namespace.nsid, subsystem.nqn
                    )));
                }
            }
            all.push(subsystem);
        }
        let pd = context.alloc_pd()?;
        let started_ns = clock.now_ns();
        Ok(Self {
            context,
            pd,
            listener,
            clock,
            config,
            subsystems: all,
            controllers: BTreeMap::new(),
            next_cntlid: 1,
            queues: Vec::new(),
            counters: TargetCounters::default(),
            genctr: 1,
            started_ns,
            polls: 0,
            capsule: Vec::new(),
            scratch: Vec::new(),
            compare: Vec::new(),
            diagnostics: rnic_diag::Limiter::new(rnic_diag::Policy::DEFAULT),
        })
    }

    /// What the target saw and did so far.
    pub fn counters(&self) -> &TargetCounters {
        &self.counters
    }

    /// The configuration.
    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    /// The subsystems, the discovery subsystem first.
    pub fn subsystems(&self) -> &[Subsystem] {
        &self.subsystems
    }

    /// Live controllers.
    pub fn controller_count(&self) -> usize {
        self.controllers.len()
    }

    /// The live controllers' IDs.
    pub fn controller_ids(&self) -> Vec<u16> {
        self.controllers.keys().copied().collect()
    }

    /// Connected queues (admin and I/O, with or without a controller yet).
    pub fn queue_count(&self) -> usize {
        self.queues.iter().flatten().count()
    }

    /// The address listened on.
    pub fn address(&self) -> ServiceAddress {
        self.listener.address()
    }

    /// Adds `device` as namespace `nsid` of subsystem `nqn` and tells its controllers
    /// (a Namespace Attribute Changed event to hosts that enabled it).
    ///
    /// # Errors
    /// [`TargetError::Config`] for an unknown subsystem, a taken or invalid NSID, or an
    /// unsupported block size.
    pub fn add_namespace(&mut self, nqn: &str, nsid: u32, device: Arc<dyn BlockDevice>) -> Result<(), TargetError> {
        let block_size = device.block_size();
        if !block_size.is_power_of_two() || !(512..=4096).contains(&block_size) {
            return Err(TargetError::Config(format!("block size {block_size}")));
        }
        let index = self
            .subsystems
            .iter()
            .position(|s| s.nqn == nqn && s.kind == SubsystemKind::Nvm)
            .ok_or_else(|| TargetError::Config(format!("no NVM subsystem {nqn}")))?;
        if nsid == 0 || nsid == u32::MAX || self.subsystems[index].namespaces.contains_key(&nsid) {
            return Err(TargetError::Config(format!("NSID {nsid} is invalid or taken in {nqn}")));
        }
        self.subsystems[index].add_namespace(nsid, device);
        self.genctr += 1;
        self.namespace_changed(index, nsid);
        Ok(())
    }

    /// Removes namespace `nsid` of subsystem `nqn` (its controllers are told).
    ///
    /// # Errors
    /// [`TargetError::Config`] if there is no such namespace.
    pub fn remove_namespace(&mut self, nqn: &str, nsid: u32) -> Result<(), TargetError> {
        let index = self
            .subsystems
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or_else(|| TargetError::Config(format!("no subsystem {nqn}")))?;
        self.subsystems[index]
            .namespaces
            .remove(&nsid)
            .ok_or_else(|| TargetError::Config(format!("no namespace {nsid} in {nqn}")))?;
        self.genctr += 1;
        self.namespace_changed(index, nsid);
        Ok(())
    }

    /// Tears controller `cntlid` down (all its queues disconnected), as a lost
    /// association would.
    pub fn disconnect_controller(&mut self, cntlid: u16) {
        self.teardown_controller(cntlid, "disconnected by the target");
    }

    /// Disconnects every queue and forgets every controller.
    pub fn shutdown(&mut self) {
        let ids: Vec<u16> = self.controllers.keys().copied().collect();
        for cntlid in ids {
            self.teardown_controller(cntlid, "target shutting down");
        }
        for q in 0..self.queues.len() {
            if self.queues[q].is_some() {
                self.teardown_queue(q);
            }
        }
    }

    /// Does what can be done now; returns how much.
    pub fn poll(&mut self) -> usize {
        let mut work = 0;
        for q in 0..self.queues.len() {
            work += self.poll_queue(q);
        }
        // The listener (the connection manager's MADs on QP1) is looked at every few
        // polls, as SPDK's acceptor poller runs at its own, lower rate: looking on every
        // pass cost as much as the I/O queues' own polls (a CQ poll and a doorbell on QP1
        // each time), and a connection request waits a few polls at most.
        if self.polls.is_multiple_of(LISTENER_POLLS) {
            while let Some(request) = self.listener.poll_request() {
                self.handle_connection_request(request);
                work += 1;
            }
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(HOUSEKEEPING_POLLS) {
            work += self.housekeeping();
        }
        work
    }

    // ----- diagnostics -------------------------------------------------------------

    /// Counts a diagnostic of kind `nvmf-target/name` and logs it under `rnic::diag`
    /// while its kind is not quiet (the bounded log of `rnic-diag`), so a hostile host
    /// cannot flood the log.
    fn diag(&mut self, name: &'static str, message: impl FnOnce() -> String) {
        let kind = rnic_diag::Kind::new("nvmf-target", name);
        if self.diagnostics.admit(kind) {
            tracing::warn!(target: rnic_diag::TARGET, kind = %kind, "nvmf target: {}", message());
        }
    }

    /// The diagnostics counted so far, by kind (`nvmf-target/…`).
    pub fn diagnostics(&self) -> &rnic_diag::Limiter {
        &self.diagnostics
    }

    // ----- connections -------------------------------------------------------------

    fn handle_connection_request(&mut self, request: Box<dyn IncomingRequest>) {
        let peer = request.peer();
        let reject = |target: &mut Self, request: Box<dyn IncomingRequest>, status: CmRejectStatus, why: String| {
            target.counters.connections_rejected += 1;
            target.diag("cm-reject", || format!("rejected a queue from {peer}: {status}: {why}"));
            request.reject(&CmRejectRepr::new(status).to_bytes());
        };
        let Ok(req) = parse_cm_request(request.private_data()) else {
            let length = request.private_data().len();
            return reject(
                self,
                request,
                CmRejectStatus::InvalidPrivateDataLength,
                format!("{length} bytes of private data"),
            );
        };
        if req.recfmt != RECFMT {
            return reject(
                self,
                request,
                CmRejectStatus::InvalidRecordFormat,
                format!("RECFMT {}", req.recfmt),
            );
        }
        if req.qid > self.config.max_io_queues {
            return reject(self, request, CmRejectStatus::InvalidQid, format!("QID {}", req.qid));
        }
        let limit = if req.qid == 0 {
            self.config.max_admin_queue_entries
        } else {
            self.config.max_queue_entries
        };
        if req.hsqsize == 0 || u32::from(req.hsqsize) + 1 > u32::from(limit) {
            return reject(
                self,
                request,
                CmRejectStatus::InvalidHsqsize,
                format!("HSQSIZE {} for at most {limit} entries", req.hsqsize),
            );
        }
        if req.hrqsize == 0 {
            return reject(self, request, CmRejectStatus::InvalidHrqsize, "HRQSIZE 0".into());
        }
        if request.responder_resources() == 0 {
            return reject(
                self,
                request,
                CmRejectStatus::InvalidIrd,
                "no responder resources: the target could not read the host's data".into(),
            );
        }
        let entries = req.hsqsize + 1;
        let device = self.context.query_device();
        let initiator_depth = u32::from(request.responder_resources())
            .min(device.max_qp_init_rd_atom)
            .clamp(1, 16);
        let max_transfer = self.config.max_transfer() as usize;
        let geometry = QueueGeometry {
            // Twice the queue: room to answer a host that overruns it.
            slots: 2 * usize::from(entries),
            in_capsule_size: self.config.in_capsule_data_size as usize,
            pool_bytes: if req.qid == 0 {
                max_transfer.max(1 << 20)
            } else {
                self.config.data_pool_bytes
            },
        };
        let created = TargetQueue::create(&self.context, &self.pd, geometry);
        let (qp, cq, receives, responses, pool) = match created {
            Ok(parts) => parts,
            Err(e) => return reject(self, request, CmRejectStatus::NoResources, e.to_string()),
        };
        let reply = CmReplyRepr {
            recfmt: RECFMT,
            crqsize: entries,
        };
        let accept = AcceptParams {
            private_data: reply.to_bytes().to_vec(),
            responder_resources: 0,
            initiator_depth: initiator_depth as u8,
            rnr_retry_count: 7,
        };
        let connection = match request.accept(&self.context, &qp, &accept) {
            Ok(connection) => connection,
            Err(e) => {
                self.counters.connections_rejected += 1;
                self.diag("cm-accept", || format!("accepting a queue from {peer} failed: {e}"));
                return;
            }
        };
        let mut queue = TargetQueue {
            qp,
            cq,
            connection,
            receives,
            responses,
            pool,
            qid: req.qid,
            entries,
            initiator_depth,
            reads_outstanding: 0,
            slots: vec![Slot::Idle; geometry.slots],
            waiting: VecDeque::new(),
            ready: VecDeque::new(),
            unanswered: 0,
            cids_in_use: vec![0; 1024],
            sq_head: 0,
            state: QueueState::AwaitingConnect,
            close_when_drained: false,
            peer: peer.clone(),
            completions: vec![WorkCompletion::default(); POLL_BATCH],
            reposts: Vec::with_capacity(geometry.slots),
            pending_responses: Vec::with_capacity(geometry.slots),
        };
        for slot in 0..geometry.slots {
            if let Err(e) = queue.post_receive(slot) {
                self.diag("queue-setup", || format!("posting receives for {peer}: {e}"));
                queue.connection.disconnect(&queue.qp);
                return;
            }
        }
        self.counters.connections_accepted += 1;
        tracing::debug!(qid = req.qid, entries, %peer, "nvmf target: queue connected");
        let q = match self.queues.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.queues.push(None);
                self.queues.len() - 1
            }
        };
        self.queues[q] = Some(queue);
    }

    // ----- the data path -----------------------------------------------------------

    fn poll_queue(&mut self, q: usize) -> usize {
        let Some(queue) = self.queues[q].as_mut() else {
            return 0;
        };
        let mut completions = std::mem::take(&mut queue.completions);
        let count = match queue.cq.poll(&mut completions) {
            Ok(n) => n,
            Err(e) => {
                let peer = queue.peer.clone();
                self.queues[q].as_mut().expect("present").completions = completions;
                self.diag("cq", || format!("polling the CQ of {peer}: {e}"));
                self.fail_queue(q, "CQ poll failed");
                return 1;
            }
        };
        let mut work = count;
        for wc in &completions[..count] {
            if self.queues[q].is_none() {
                break;
            }
            self.handle_completion(q, wc);
        }
        let Some(queue) = self.queues[q].as_mut() else {
            return work;
        };
        queue.completions = completions;
        work += self.start_waiting(q);
        work += self.execute_ready(q);
        // The responses of this poll go out together, and so do the receives of the
        // commands answered before it.
        self.flush_responses(q);
        if let Some(queue) = self.queues[q].as_mut() {
            if let Err(e) = queue.flush_receives() {
                let peer = queue.peer.clone();
                self.diag("post", || format!("reposting receives for {peer}: {e}"));
                self.fail_queue(q, "receive post failed");
                return work + 1;
            }
        }
        work
    }

    fn handle_completion(&mut self, q: usize, wc: &WorkCompletion) {
        let Some((kind, slot)) = decode_wr_id(wc.wr_id) else {
            return;
        };
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                self.counters.rdma_errors += 1;
                let queue = self.queues[q].as_ref().expect("present");
                let what = match &queue.slots.get(slot) {
                    Some(Slot::Busy(request)) => format!("command {} ({})", request.cid, request.command.name()),
                    _ => format!("slot {slot}"),
                };
                let (peer, qid) = (queue.peer.clone(), queue.qid);
                self.diag("rdma-error", || {
                    format!(
                        "{kind:?} for {what} on queue {qid} of {peer} failed: {:?} (vendor {:#x}); tearing the queue down",
                        wc.status, wc.vendor_err
                    )
                });
            }
            self.fail_queue(q, "a work request failed");
            return;
        }
        match (kind, wc.opcode) {
            (WorkKind::Receive, WcOpcode::Recv) => self.handle_capsule(q, slot, wc.byte_len as usize),
            (WorkKind::ReadData, _) => {
                let queue = self.queues[q].as_mut().expect("present");
                queue.reads_outstanding = queue.reads_outstanding.saturating_sub(1);
                if let Some(Slot::Busy(request)) = queue.slots.get_mut(slot) {
                    if request.stage == Stage::Reading {
                        request.stage = Stage::Ready;
                        queue.ready.push_back(slot);
                    }
                }
            }
            (WorkKind::Response, _) => self.response_sent(q, slot),
            _ => {}
        }
    }

    /// A command capsule arrived in receive `slot`.
    fn handle_capsule(&mut self, q: usize, slot: usize, length: usize) {
        self.counters.capsules_received += 1;
        let queue = self.queues[q].as_mut().expect("present");
        if let Err(e) = queue.receives.read_capsule(slot, length, &mut self.capsule) {
            let peer = queue.peer.clone();
            self.diag("receive-buffer", || format!("reading a capsule of {peer}: {e}"));
            return self.fail_queue(q, "receive buffer unreadable");
        }
        let kind = if queue.qid == 0 {
            QueueKind::Admin
        } else {
            QueueKind::Io
        };
        let capsule = match parse_command_capsule(&self.capsule, kind) {
            Ok(capsule) => capsule,
            Err(CapsuleError::Truncated(bytes)) => {
                self.counters.malformed_capsules += 1;
                let (peer, qid) = (queue.peer.clone(), queue.qid);
                self.diag("malformed-capsule", || {
                    format!(
                        "a {bytes}-byte capsule on queue {qid} of {peer}, shorter than an SQE: tearing the queue down"
                    )
                });
                return self.fail_queue(q, "capsule shorter than an SQE");
            }
            Err(CapsuleError::Refused { cid, status, reason }) => {
                queue.unanswered += 1;
                queue.sq_head = (queue.sq_head + 1) % queue.entries;
                let (peer, qid) = (queue.peer.clone(), queue.qid);
                let opcode = self.capsule[0];
                self.diag("refused-command", || {
                    format!("command {cid} (opcode {opcode:#04x}) on queue {qid} of {peer}: {reason}: {status}")
                });
                return self.answer_unparsed(q, slot, cid, status);
            }
        };
        let (cid, command, data) = (capsule.sqe.cid, capsule.command, capsule.data.clone());
        if let QueueState::Connected { cntlid } = queue.state {
            if let Some(controller) = self.controllers.get_mut(&cntlid) {
                controller.traffic_seen = true;
            }
        }
        let queue = self.queues[q].as_mut().expect("present");
        queue.unanswered += 1;
        queue.sq_head = (queue.sq_head + 1) % queue.entries;
        // A CID of an unanswered command: a conflict (the first keeps it).
        let conflict = queue.claim_cid(cid);
        queue.slots[slot] = Slot::Busy(Request {
            cid,
            command,
            data: data.clone(),
            length: 0,
            stage: Stage::Ready,
            buffer: None,
            owns_cid: !conflict,
        });
        if queue.unanswered > u32::from(queue.entries) {
            self.counters.queue_overruns += 1;
            let (peer, qid, entries) = (queue.peer.clone(), queue.qid, queue.entries);
            self.diag("queue-overrun", || {
                format!("command {cid} on queue {qid} of {peer} overruns its {entries} entries")
            });
            return self.respond(q, slot, Outcome::error(Status::TRANSIENT_TRANSPORT_ERROR));
        }
        if conflict {
            self.counters_note_cid_conflict(q, cid);
            return self.respond(q, slot, Outcome::error(Status::COMMAND_ID_CONFLICT));
        }
        match self.plan(q, &command, &data) {
            Err(status) => {
                let qid = self.queues[q].as_ref().map_or(0, |queue| queue.qid);
                self.diag("refused-command", || {
                    format!("{} {cid} on queue {qid}: {status}", command.name())
                });
                self.respond(q, slot, Outcome::error(status))
            }
            Ok(length) => {
                let queue = self.queues[q].as_mut().expect("present");
                let Slot::Busy(request) = &mut queue.slots[slot] else {
                    unreachable!("just set")
                };
                request.length = length;
                let needs_buffer = match (&request.data, command.data_direction()) {
                    (DataPointer::Keyed { .. }, DataDirection::HostToController | DataDirection::ControllerToHost) => {
                        length > 0
                    }
                    _ => false,
                };
                if needs_buffer {
                    request.stage = Stage::WaitingForBuffer;
                    queue.waiting.push_back(slot);
                } else {
                    queue.ready.push_back(slot);
                }
            }
        }
    }

    fn counters_note_cid_conflict(&mut self, q: usize, cid: u16) {
        let queue = self.queues[q].as_ref().expect("present");
        let (peer, qid) = (queue.peer.clone(), queue.qid);
        self.diag("cid-conflict", || {
            format!("command {cid} on queue {qid} of {peer} reuses an outstanding command identifier")
        });
    }

    /// Checks a command before any data moves; returns the bytes its data moves (0: none).
    fn plan(&self, q: usize, command: &Command, data: &DataPointer) -> Result<u32, Status> {
        let queue = self.queues[q].as_ref().expect("present");
        // Sequence: only Connect before Connect, and no Connect after it.
        let controller = match queue.state {
            QueueState::AwaitingConnect => {
                return match command {
                    Command::Connect { .. } => Ok(CONNECT_DATA_LEN as u32),
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
            }
            QueueState::Connected { cntlid } => self.controllers.get(&cntlid).ok_or(Status::COMMAND_SEQUENCE_ERROR)?,
        };
        match command {
            Command::Connect { .. } => return Err(Status::COMMAND_SEQUENCE_ERROR),
            Command::PropertyGet { .. } | Command::PropertySet { .. } => return Ok(0),
            _ => {}
        }
        if !controller.ready() {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        let subsystem = &self.subsystems[controller.subsystem];
        let max_transfer = self.config.max_transfer();
        match *command {
            Command::Identify { .. } => Ok(IDENTIFY_LEN as u32),
            Command::GetLogPage { dwords, .. } => {
                let bytes = dwords * 4;
                if bytes > u64::from(max_transfer) {
                    return Err(Status::INVALID_FIELD);
                }
                Ok(bytes as u32)
            }
            Command::Read(range) | Command::Write(range) | Command::Compare(range) => {
                let namespace = subsystem
                    .namespaces
                    .get(&range.nsid)
                    .ok_or(Status::INVALID_NAMESPACE_OR_FORMAT)?;
                let bytes = u64::from(range.blocks) * u64::from(namespace.device.block_size());
                if bytes > u64::from(max_transfer) {
                    return Err(Status::INVALID_FIELD);
                }
                check_range(&range, namespace.device.block_count())?;
                Ok(bytes as u32)
            }
            Command::WriteZeroes { range, .. } => {
                let namespace = subsystem
                    .namespaces
                    .get(&range.nsid)
                    .ok_or(Status::INVALID_NAMESPACE_OR_FORMAT)?;
                check_range(&range, namespace.device.block_count())?;
                Ok(0)
            }
            Command::Flush { nsid } => {
                if nsid != u32::MAX && !subsystem.namespaces.contains_key(&nsid) {
                    return Err(Status::INVALID_NAMESPACE_OR_FORMAT);
                }
                Ok(0)
            }
            Command::DatasetManagement { nsid, ranges, .. } => {
                if !subsystem.namespaces.contains_key(&nsid) {
                    return Err(Status::INVALID_NAMESPACE_OR_FORMAT);
                }
                Ok(u32::from(ranges) * DsmRange::LEN as u32)
            }
            _ => Ok(0),
        }
        .and_then(|length| check_data_pointer(command, data, length))
    }

    /// Allocates buffers and starts RDMA READs for waiting commands, oldest first.
    fn start_waiting(&mut self, q: usize) -> usize {
        let mut work = 0;
        while let Some(queue) = self.queues[q].as_mut() {
            let Some(&slot) = queue.waiting.front() else {
                break;
            };
            let Slot::Busy(request) = &mut queue.slots[slot] else {
                queue.waiting.pop_front();
                continue;
            };
            let DataPointer::Keyed { address, key, .. } = request.data else {
                queue.waiting.pop_front();
                continue;
            };
            if request.stage == Stage::WaitingForBuffer {
                let Some(buffer) = queue.pool.allocate(request.length) else {
                    break;
                };
                request.buffer = Some(buffer);
                request.stage = if request.command.data_direction() == DataDirection::HostToController {
                    Stage::WaitingForRead
                } else {
                    Stage::Ready
                };
            }
            if request.stage == Stage::Ready {
                queue.waiting.pop_front();
                queue.ready.push_back(slot);
                work += 1;
                continue;
            }
            if queue.reads_outstanding >= queue.initiator_depth {
                break;
            }
            let buffer = request.buffer.expect("allocated above");
            request.stage = Stage::Reading;
            queue.waiting.pop_front();
            work += 1;
            if let Err(e) = queue.post_read(slot, address, key, &buffer) {
                let peer = queue.peer.clone();
                self.diag("post", || format!("posting an RDMA READ for {peer}: {e}"));
                self.fail_queue(q, "RDMA READ post failed");
                return work;
            }
        }
        work
    }

    /// Executes the commands whose data is here.
    fn execute_ready(&mut self, q: usize) -> usize {
        let mut work = 0;
        while let Some(queue) = self.queues[q].as_mut() {
            let Some(slot) = queue.ready.pop_front() else {
                break;
            };
            let Slot::Busy(request) = &queue.slots[slot] else {
                continue;
            };
            let request = request.clone();
            let outcome = self.execute(q, slot, &request);
            if self.queues[q].is_some() {
                self.respond(q, slot, outcome);
            }
            work += 1;
        }
        work
    }

    /// Fetches the data a host sent with the command into `self.scratch`.
    fn fetch_host_data(&mut self, q: usize, slot: usize, request: &Request, length: usize) -> Result<(), Status> {
        let queue = self.queues[q].as_ref().expect("present");
        let result = match (&request.data, &request.buffer) {
            (DataPointer::InCapsule(range), _) => {
                let range = range.start..range.start + length.min(range.len());
                queue.read_in_capsule(slot, range, &mut self.scratch)
            }
            (DataPointer::Keyed { .. }, Some(buffer)) => {
                self.scratch.resize(length.min(buffer.length as usize), 0);
                queue.pool.read(buffer, 0, &mut self.scratch)
            }
            _ => {
                self.scratch.clear();
                Ok(())
            }
        };
        result.map_err(|_| Status::DATA_TRANSFER_ERROR)
    }

    /// Puts `bytes` in the request's buffer for the RDMA WRITE to the host.
    fn stage_to_host(&mut self, q: usize, request: &Request, bytes: &[u8]) -> Result<Option<u32>, Status> {
        let queue = self.queues[q].as_ref().expect("present");
        let Some(buffer) = &request.buffer else {
            return Ok(None);
        };
        let length = bytes.len().min(buffer.length as usize);
        queue
            .pool
            .write(buffer, 0, &bytes[..length])
            .map_err(|_| Status::DATA_TRANSFER_ERROR)?;
        Ok(Some(length as u32))
    }

    fn execute(&mut self, q: usize, slot: usize, request: &Request) -> Outcome {
        let command = request.command;
        if let Command::Connect {
            recfmt,
            qid,
            sqsize,
            kato,
            ..
        } = command
        {
            if let Err(status) = self.fetch_host_data(q, slot, request, CONNECT_DATA_LEN) {
                return Outcome::error(status);
            }
            return self.execute_connect(q, recfmt, qid, sqsize, kato);
        }
        let queue = self.queues[q].as_ref().expect("present");
        let QueueState::Connected { cntlid } = queue.state else {
            return Outcome::error(Status::COMMAND_SEQUENCE_ERROR);
        };
        if !self.controllers.contains_key(&cntlid) {
            return Outcome::error(Status::COMMAND_SEQUENCE_ERROR);
        }
        if queue.qid == 0 {
            self.execute_admin(q, slot, cntlid, request)
        } else {
            self.execute_io(q, slot, cntlid, request)
        }
    }

    fn execute_connect(&mut self, q: usize, recfmt: u16, qid: u16, sqsize: u16, kato: u32) -> Outcome {
        let invalid =
            |parameter: InvalidParameter| Outcome::with_dw0(Status::CONNECT_INVALID_PARAMETERS, parameter.to_dw0());
        if recfmt != RECFMT {
            return Outcome::error(Status::CONNECT_INCOMPATIBLE_FORMAT);
        }
        let queue = self.queues[q].as_ref().expect("present");
        let (queue_qid, entries, peer) = (queue.qid, queue.entries, queue.peer.clone());
        if qid != queue_qid {
            self.diag("connect", || {
                format!("Connect for QID {qid} on the queue {peer} opened as QID {queue_qid}")
            });
            return invalid(InvalidParameter::sqe(42));
        }
        if sqsize == 0 || sqsize >= entries {
            self.diag("connect", || {
                format!("Connect with SQSIZE {sqsize} on a queue of {entries} entries")
            });
            return invalid(InvalidParameter::sqe(44));
        }
        let data: ConnectDataRepr = match parse_connect_data(&self.scratch) {
            Ok(data) => data,
            Err(e) => {
                let offset = match e {
                    WireError::Malformed { field: "HOSTNQN", .. } => connect_data::offset::HOSTNQN,
                    WireError::Malformed { .. } => connect_data::offset::SUBNQN,
                    WireError::Truncated { .. } => return Outcome::error(Status::DATA_SGL_LENGTH_INVALID),
                };
                self.diag("connect", || format!("Connect data from {peer}: {e}"));
                return invalid(InvalidParameter::data(offset));
            }
        };
        let Some(subsystem) = self.subsystems.iter().position(|s| s.nqn == data.subsystem_nqn) else {
            self.counters_connect_refused(&peer, &data, "no such subsystem");
            return invalid(InvalidParameter::data(connect_data::offset::SUBNQN));
        };
        if !self.subsystems[subsystem].allowed_hosts.allows(&data.host_nqn) {
            self.counters_connect_refused(&peer, &data, "host not allowed");
            return Outcome::with_dw0(
                Status::CONNECT_INVALID_HOST,
                InvalidParameter::data(connect_data::offset::HOSTNQN).to_dw0(),
            );
        }
        let discovery = self.subsystems[subsystem].kind == SubsystemKind::Discovery;
        if qid == 0 {
            if data.cntlid != CNTLID_DYNAMIC {
                self.counters_connect_refused(&peer, &data, "admin Connect for a static controller ID");
                return invalid(InvalidParameter::data(connect_data::offset::CNTLID));
            }
            let Some(cntlid) = self.allocate_cntlid() else {
                return Outcome::error(Status::CONNECT_CONTROLLER_BUSY);
            };
            let mut controller = Controller::new(
                cntlid,
                subsystem,
                data.host_nqn.clone(),
                data.host_id,
                q,
                self.config.max_io_queues,
            );
            let kato = if discovery && kato == 0 {
                self.config.discovery_default_kato_ms
            } else {
                kato
            };
            controller.kato_ms = controller::round_kato(kato, self.config.keep_alive_granularity_ms);
            controller.keep_alive(self.clock.now_ns());
            self.controllers.insert(cntlid, controller);
            self.counters.controllers_created += 1;
            self.queues[q].as_mut().expect("present").state = QueueState::Connected { cntlid };
            tracing::info!(
                cntlid,
                subsystem = %data.subsystem_nqn,
                host = %data.host_nqn,
                "nvmf target: controller created"
            );
            return Outcome::success(u32::from(cntlid));
        }
        if discovery {
            self.counters_connect_refused(&peer, &data, "an I/O queue for the discovery subsystem");
            return invalid(InvalidParameter::sqe(42));
        }
        let Some(controller) = self.controllers.get_mut(&data.cntlid) else {
            self.counters_connect_refused(&peer, &data, "an I/O queue for an unknown controller");
            return invalid(InvalidParameter::data(connect_data::offset::CNTLID));
        };
        if controller.subsystem != subsystem
            || controller.host_nqn != data.host_nqn
            || controller.host_id != data.host_id
        {
            self.counters_connect_refused(&peer, &data, "an I/O queue for another host's controller");
            return invalid(InvalidParameter::data(connect_data::offset::CNTLID));
        }
        if !controller.ready() {
            return Outcome::error(Status::COMMAND_SEQUENCE_ERROR);
        }
        if qid > controller.io_queues_granted {
            self.counters_connect_refused(&peer, &data, "a QID beyond the queues granted");
            return invalid(InvalidParameter::sqe(42));
        }
        if controller.io_queues.contains_key(&qid) {
            return Outcome::error(Status::COMMAND_SEQUENCE_ERROR);
        }
        controller.io_queues.insert(qid, q);
        let cntlid = controller.cntlid;
        self.queues[q].as_mut().expect("present").state = QueueState::Connected { cntlid };
        Outcome::success(u32::from(cntlid))
    }

    fn counters_connect_refused(&mut self, peer: &str, data: &ConnectDataRepr, why: &'static str) {
        let (host, subsystem) = (data.host_nqn.clone(), data.subsystem_nqn.clone());
        self.diag("connect-refused", || {
            format!("Connect from {host} ({peer}) to {subsystem} refused: {why}")
        });
    }

    fn allocate_cntlid(&mut self) -> Option<u16> {
        for _ in 0..0xFFEF {
            let candidate = self.next_cntlid;
            self.next_cntlid = if candidate >= 0xFFEF { 1 } else { candidate + 1 };
            if !self.controllers.contains_key(&candidate) {
                return Some(candidate);
            }
        }
        None
    }

    fn cap(&self) -> Cap {
        Cap {
            mqes: self.config.max_queue_entries - 1,
            cqr: true,
            ams: 0,
            // 15 s in 500 ms units.
            timeout: 30,
            dstrd: 0,
            nssrs: false,
            css: CSS_NVM,
            bps: false,
            mpsmin: 0,
            mpsmax: 0,
        }
    }

    fn execute_admin(&mut self, q: usize, slot: usize, cntlid: u16, request: &Request) -> Outcome {
        let cap = self.cap();
        let now = self.clock.now_ns();
        let discovery = {
            let controller = &self.controllers[&cntlid];
            self.subsystems[controller.subsystem].kind == SubsystemKind::Discovery
        };
        match request.command {
            Command::PropertyGet { size, offset } => match self.controllers[&cntlid].property_get(cap, size, offset) {
                Ok(value) => Outcome {
                    dw1: (value >> 32) as u32,
                    ..Outcome::success(value as u32)
                },
                Err(status) => Outcome::error(status),
            },
            Command::PropertySet { size, offset, value } => {
                let controller = self.controllers.get_mut(&cntlid).expect("checked");
                match controller.property_set(size, offset, value) {
                    Ok(PropertyEffect::Disabled) => {
                        let io: Vec<usize> = std::mem::take(&mut controller.io_queues).into_values().collect();
                        for queue in io {
                            self.teardown_queue(queue);
                        }
                        Outcome::success(0)
                    }
                    Ok(PropertyEffect::Shutdown) => {
                        let subsystem = controller.subsystem;
                        for namespace in self.subsystems[subsystem].namespaces.values() {
                            let _ = namespace.device.flush();
                        }
                        Outcome::success(0)
                    }
                    Ok(PropertyEffect::None) => Outcome::success(0),
                    Err(status) => Outcome::error(status),
                }
            }
            Command::Identify { cns, nsid, csi, .. } => {
                let controller = &self.controllers[&cntlid];
                let subsystem = &self.subsystems[controller.subsystem];
                match admin::identify(&self.config, subsystem, controller, cns, nsid, csi) {
                    Ok(bytes) => self.outcome_to_host(q, request, &bytes),
                    Err(status) => Outcome::error(status),
                }
            }
            Command::GetLogPage {
                lid, dwords, offset, ..
            } => {
                let genctr = self.genctr;
                let hours = now.saturating_sub(self.started_ns) / 3_600_000_000_000;
                let controller = self.controllers.get_mut(&cntlid).expect("checked");
                let subsystem = controller.subsystem;
                let page = admin::log_page(
                    &self.config,
                    &self.subsystems,
                    subsystem,
                    controller,
                    lid,
                    genctr,
                    hours,
                );
                match page.and_then(|page| admin::log_slice(&page, offset, dwords as usize * 4)) {
                    Ok(bytes) => self.outcome_to_host(q, request, &bytes),
                    Err(status) => Outcome::error(status),
                }
            }
            Command::SetFeatures { fid, save, value, .. } => {
                let (max_io, kas) = (self.config.max_io_queues, self.config.keep_alive_granularity_ms);
                let controller = self.controllers.get_mut(&cntlid).expect("checked");
                let result = controller.set_feature(fid, save, value, max_io, kas, discovery);
                if fid == crate::nvmeof::wire::command::feature::KEEP_ALIVE_TIMER && result.is_ok() {
                    controller.keep_alive(now);
                }
                match result {
                    Ok(dw0) => Outcome::success(dw0),
                    Err(status) => Outcome::error(status),
                }
            }
            Command::GetFeatures { fid, select, .. } => {
                match self.controllers[&cntlid].get_feature(fid, select, discovery) {
                    Ok(dw0) => Outcome::success(dw0),
                    Err(status) => Outcome::error(status),
                }
            }
            Command::KeepAlive => {
                self.controllers.get_mut(&cntlid).expect("checked").keep_alive(now);
                Outcome::success(0)
            }
            Command::AsyncEventRequest => {
                let controller = self.controllers.get_mut(&cntlid).expect("checked");
                if let Some(event) = controller.pending_events.pop_front() {
                    return Outcome::success(event);
                }
                if controller.aers.len() >= AER_LIMIT {
                    return Outcome::error(Status::AER_LIMIT_EXCEEDED);
                }
                controller.aers.push(ParkedAer {
                    queue: q,
                    slot,
                    cid: request.cid,
                });
                Outcome {
                    park: true,
                    ..Outcome::success(0)
                }
            }
            // Nothing is ever aborted: DW0 bit 0 says so.
            Command::Abort { .. } => Outcome::success(1),
            _ => Outcome::error(Status::INVALID_OPCODE),
        }
    }

    fn outcome_to_host(&mut self, q: usize, request: &Request, bytes: &[u8]) -> Outcome {
        match self.stage_to_host(q, request, bytes) {
            Ok(to_host) => Outcome {
                to_host,
                ..Outcome::success(0)
            },
            Err(status) => Outcome::error(status),
        }
    }

    fn execute_io(&mut self, q: usize, slot: usize, cntlid: u16, request: &Request) -> Outcome {
        let subsystem = self.controllers[&cntlid].subsystem;
        let write_cache = self.controllers[&cntlid].volatile_write_cache;
        let namespace = |target: &Self, nsid: u32| target.subsystems[subsystem].namespaces.get(&nsid).cloned();
        match request.command {
            Command::Read(range) => {
                let Some(ns) = namespace(self, range.nsid) else {
                    return Outcome::error(Status::INVALID_NAMESPACE_OR_FORMAT);
                };
                let length = range.blocks as usize * ns.device.block_size() as usize;
                // Zero-copy: the device hands its blocks straight to the registered
                // buffer the RDMA WRITE sends from (a RAM device lends them in place;
                // others read into the bounce buffer, which is kept across commands).
                let queue = self.queues[q].as_ref().expect("present");
                let staged = match request.buffer {
                    Some(buffer) => {
                        let room = buffer.length as usize;
                        let pool = &queue.pool;
                        let result = ns
                            .device
                            .read_to(range.slba, length, &mut self.scratch, &mut |at, piece| {
                                let end = (at + piece.len()).min(room);
                                match piece.get(..end.saturating_sub(at)) {
                                    Some(part) if !part.is_empty() => {
                                        pool.write(&buffer, at, part).map_err(|e| e.to_string())
                                    }
                                    _ => Ok(()),
                                }
                            });
                        result.map(|()| Some(length.min(room) as u32))
                    }
                    // No buffer (nothing to send: the plan allowed no data): the blocks
                    // are still read, so a failing device still fails the command.
                    None => ns
                        .device
                        .read_to(range.slba, length, &mut self.scratch, &mut |_, _| Ok(()))
                        .map(|()| None),
                };
                match staged {
                    Ok(to_host) => {
                        let counters = &mut self.subsystems[subsystem].counters;
                        counters.bytes_read += length as u64;
                        counters.read_commands += 1;
                        self.counters.bytes_read += length as u64;
                        Outcome {
                            to_host,
                            ..Outcome::success(0)
                        }
                    }
                    Err(crate::block::Error::Destination(reason)) => {
                        self.diag("data-buffer", || format!("staging read data for the host: {reason}"));
                        Outcome::error(Status::DATA_TRANSFER_ERROR)
                    }
                    Err(e) => self.backend_error(subsystem, "read", &e, Status::UNRECOVERED_READ_ERROR),
                }
            }
            Command::Write(range) | Command::Compare(range) => {
                let Some(ns) = namespace(self, range.nsid) else {
                    return Outcome::error(Status::INVALID_NAMESPACE_OR_FORMAT);
                };
                let length = range.blocks as usize * ns.device.block_size() as usize;
                if let Err(status) = self.fetch_host_data(q, slot, request, length) {
                    return Outcome::error(status);
                }
                if self.scratch.len() != length {
                    return Outcome::error(Status::DATA_SGL_LENGTH_INVALID);
                }
                if matches!(request.command, Command::Compare(_)) {
                    let mut stored = std::mem::take(&mut self.compare);
                    stored.resize(length, 0);
                    let outcome = match ns.device.read(range.slba, &mut stored) {
                        Ok(()) if stored == self.scratch => Outcome::success(0),
                        Ok(()) => Outcome::error(Status::COMPARE_FAILURE),
                        Err(e) => self.backend_error(subsystem, "compare", &e, Status::UNRECOVERED_READ_ERROR),
                    };
                    self.compare = stored;
                    return outcome;
                }
                let result = ns.device.write(range.slba, &self.scratch).and_then(|()| {
                    if range.fua || !write_cache {
                        ns.device.flush()
                    } else {
                        Ok(())
                    }
                });
                match result {
                    Ok(()) => {
                        let counters = &mut self.subsystems[subsystem].counters;
                        counters.bytes_written += length as u64;
                        counters.write_commands += 1;
                        self.counters.bytes_written += length as u64;
                        Outcome::success(0)
                    }
                    Err(e) => self.backend_error(subsystem, "write", &e, Status::WRITE_FAULT),
                }
            }
            Command::Flush { nsid } => {
                let devices: Vec<Arc<dyn BlockDevice>> = self.subsystems[subsystem]
                    .namespaces
                    .values()
                    .filter(|ns| nsid == u32::MAX || ns.nsid == nsid)
                    .map(|ns| ns.device.clone())
                    .collect();
                for device in devices {
                    if let Err(e) = device.flush() {
                        return self.backend_error(subsystem, "flush", &e, Status::WRITE_FAULT);
                    }
                }
                Outcome::success(0)
            }
            Command::WriteZeroes { range, deallocate } => {
                let Some(ns) = namespace(self, range.nsid) else {
                    return Outcome::error(Status::INVALID_NAMESPACE_OR_FORMAT);
                };
                let count = u64::from(range.blocks);
                let result = if deallocate {
                    ns.device.deallocate(range.slba, count)
                } else {
                    ns.device.write_zeroes(range.slba, count)
                };
                match result.and_then(|()| if range.fua { ns.device.flush() } else { Ok(()) }) {
                    Ok(()) => Outcome::success(0),
                    Err(e) => self.backend_error(subsystem, "write zeroes", &e, Status::WRITE_FAULT),
                }
            }
            Command::DatasetManagement {
                nsid,
                ranges,
                deallocate,
            } => {
                let Some(ns) = namespace(self, nsid) else {
                    return Outcome::error(Status::INVALID_NAMESPACE_OR_FORMAT);
                };
                if let Err(status) = self.fetch_host_data(q, slot, request, usize::from(ranges) * DsmRange::LEN) {
                    return Outcome::error(status);
                }
                let list = DsmRange::parse_all(&self.scratch);
                if list.len() != usize::from(ranges) {
                    return Outcome::error(Status::DATA_SGL_LENGTH_INVALID);
                }
                if !deallocate {
                    // Only hints otherwise: nothing to do.
                    return Outcome::success(0);
                }
                let capacity = ns.device.block_count();
                if list
                    .iter()
                    .any(|r| r.slba.checked_add(u64::from(r.blocks)).is_none_or(|end| end > capacity))
                {
                    return Outcome::error(Status::LBA_OUT_OF_RANGE);
                }
                for r in list.iter().filter(|r| r.blocks > 0) {
                    if let Err(e) = ns.device.deallocate(r.slba, u64::from(r.blocks)) {
                        return self.backend_error(subsystem, "deallocate", &e, Status::WRITE_FAULT);
                    }
                }
                Outcome::success(0)
            }
            _ => Outcome::error(Status::INVALID_OPCODE),
        }
    }

    fn backend_error(
        &mut self,
        subsystem: usize,
        what: &'static str,
        error: &crate::block::Error,
        status: Status,
    ) -> Outcome {
        self.subsystems[subsystem].counters.media_errors += 1;
        let message = error.to_string();
        self.diag("backend", || format!("{what} failed: {message}"));
        Outcome::error(status)
    }

    /// Answers a command that did not parse (no data pointer to honour).
    fn answer_unparsed(&mut self, q: usize, slot: usize, cid: u16, status: Status) {
        let queue = self.queues[q].as_mut().expect("present");
        queue.slots[slot] = Slot::Busy(Request {
            cid,
            command: Command::KeepAlive,
            data: DataPointer::None,
            length: 0,
            stage: Stage::Ready,
            buffer: None,
            owns_cid: false,
        });
        self.respond(q, slot, Outcome::error(status));
    }

    /// Sends the response of the command in `slot` (after its data, if any).
    fn respond(&mut self, q: usize, slot: usize, outcome: Outcome) {
        let queue = self.queues[q].as_mut().expect("present");
        let Slot::Busy(request) = &mut queue.slots[slot] else {
            return;
        };
        if outcome.park {
            request.stage = Stage::ParkedAer;
            return;
        }
        let request = request.clone();
        let cqe = CqeRepr {
            dw0: outcome.dw0,
            dw1: outcome.dw1,
            sqhd: queue.sq_head,
            sqid: queue.qid,
            cid: request.cid,
            status: outcome.status,
            phase: false,
        };
        let (write, invalidate) = match request.data {
            DataPointer::Keyed {
                address,
                key,
                invalidate,
                ..
            } => (
                match (outcome.to_host, &request.buffer) {
                    (Some(length), Some(buffer)) if outcome.status.is_success() && length > 0 => {
                        Some((buffer, length, address, key))
                    }
                    _ => None,
                },
                invalidate.then_some(key),
            ),
            _ => (None, None),
        };
        let result = queue.post_response(slot, &cqe, write, invalidate);
        queue.unanswered = queue.unanswered.saturating_sub(1);
        if request.owns_cid {
            queue.release_cid(request.cid);
        }
        queue.slots[slot] = Slot::Responding { buffer: request.buffer };
        let qid = queue.qid;
        let cntlid = match queue.state {
            QueueState::Connected { cntlid } => Some(cntlid),
            QueueState::AwaitingConnect => None,
        };
        if let Err(e) = result {
            let peer = queue.peer.clone();
            self.diag("post", || format!("writing a response for {peer}: {e}"));
            return self.fail_queue(q, "response post failed");
        }
        if outcome.status.is_success() {
            self.counters.commands_succeeded += 1;
        } else {
            self.counters.commands_failed += 1;
            *self
                .counters
                .statuses
                .entry((outcome.status.sct, outcome.status.sc))
                .or_insert(0) += 1;
            // A Connect that made a controller answers on it; failures before there is
            // one have no error log to go to.
            if let Some(controller) = cntlid.and_then(|c| self.controllers.get_mut(&c)) {
                let (lba, nsid) = match request.command {
                    Command::Read(r) | Command::Write(r) | Command::Compare(r) => (r.slba, r.nsid),
                    Command::WriteZeroes { range, .. } => (range.slba, range.nsid),
                    _ => (0, 0),
                };
                controller.log_error(ErrorLogEntryRepr {
                    error_count: 0,
                    sqid: qid,
                    cid: request.cid,
                    status: outcome.status,
                    parameter_error_location: 0xFFFF,
                    lba,
                    nsid,
                    trtype: trtype::RDMA,
                });
            }
        }
        if let Command::Disconnect { .. } = request.command {
            if outcome.status.is_success() {
                self.queues[q].as_mut().expect("present").close_when_drained = true;
            }
        }
    }

    /// Posts the responses [`Target::respond`] queued on queue `q`; a failed post fails
    /// the queue.
    fn flush_responses(&mut self, q: usize) {
        let Some(queue) = self.queues.get_mut(q).and_then(Option::as_mut) else {
            return;
        };
        if let Err(e) = queue.flush_responses() {
            let peer = queue.peer.clone();
            self.diag("post", || format!("posting responses for {peer}: {e}"));
            self.fail_queue(q, "response post failed");
        }
    }

    /// The SEND of a response completed: the slot's receive goes back.
    fn response_sent(&mut self, q: usize, slot: usize) {
        let queue = self.queues[q].as_mut().expect("present");
        if let Some(Slot::Responding { buffer }) = queue.slots.get(slot).cloned() {
            if let Some(buffer) = buffer {
                queue.pool.free(buffer);
            }
            if queue.close_when_drained {
                queue.slots[slot] = Slot::Idle;
                let busy = queue
                    .slots
                    .iter()
                    .any(|s| matches!(s, Slot::Responding { .. } | Slot::Busy(_)));
                if !busy {
                    self.teardown_queue(q);
                }
                return;
            }
            queue.repost_receive(slot);
        }
    }

    // ----- events, timers, teardown ------------------------------------------------

    fn namespace_changed(&mut self, subsystem: usize, nsid: u32) {
        // Notice, Namespace Attribute Changed, log page 0x04.
        let event = 0x2 | (log_page::CHANGED_NAMESPACES as u32) << 16;
        let cntlids: Vec<u16> = self
            .controllers
            .values()
            .filter(|c| c.subsystem == subsystem)
            .map(|c| c.cntlid)
            .collect();
        for cntlid in cntlids {
            let controller = self.controllers.get_mut(&cntlid).expect("listed");
            if !controller.changed_namespaces.contains(&nsid) {
                controller.changed_namespaces.push(nsid);
            }
            if controller.async_event_config & (1 << 8) == 0 {
                continue;
            }
            match controller.aers.pop() {
                Some(aer) => {
                    self.respond(aer.queue, aer.slot, Outcome::success(event));
                    // Outside a poll: nothing else will post it.
                    self.flush_responses(aer.queue);
                }
                None => controller.pending_events.push_back(event),
            }
        }
    }

    fn housekeeping(&mut self) -> usize {
        let now = self.clock.now_ns();
        let mut work = 0;
        let expired: Vec<u16> = self
            .controllers
            .values_mut()
            .filter_map(|c| c.keep_alive_expired(now).then_some(c.cntlid))
            .collect();
        for cntlid in expired {
            self.counters.keep_alive_expirations += 1;
            let (host, kato) = {
                let c = &self.controllers[&cntlid];
                (c.host_nqn.clone(), c.kato_ms)
            };
            self.diag("keep-alive", || {
                format!("controller {cntlid} of {host}: no Keep Alive within {kato} ms; tearing it down")
            });
            self.teardown_controller(cntlid, "keep-alive timeout");
            work += 1;
        }
        for q in 0..self.queues.len() {
            let gone = match self.queues[q].as_mut() {
                Some(queue) => queue.connection.is_disconnected(),
                None => false,
            };
            if gone {
                self.fail_queue(q, "the host disconnected");
                work += 1;
            }
        }
        work
    }

    /// A queue failed or its host left: an admin queue takes its controller with it.
    fn fail_queue(&mut self, q: usize, why: &'static str) {
        let Some(queue) = self.queues[q].as_ref() else {
            return;
        };
        match queue.state {
            QueueState::Connected { cntlid } if queue.qid == 0 => self.teardown_controller(cntlid, why),
            QueueState::Connected { cntlid } => {
                let qid = queue.qid;
                if let Some(controller) = self.controllers.get_mut(&cntlid) {
                    controller.io_queues.remove(&qid);
                }
                tracing::debug!(cntlid, qid, why, "nvmf target: I/O queue closed");
                self.teardown_queue(q);
            }
            QueueState::AwaitingConnect => self.teardown_queue(q),
        }
    }

    fn teardown_controller(&mut self, cntlid: u16, why: &'static str) {
        let Some(controller) = self.controllers.remove(&cntlid) else {
            return;
        };
        tracing::info!(cntlid, host = %controller.host_nqn, why, "nvmf target: controller torn down");
        self.counters.controllers_torn_down += 1;
        for q in controller.io_queues.into_values() {
            self.teardown_queue(q);
        }
        self.teardown_queue(controller.admin_queue);
    }

    fn teardown_queue(&mut self, q: usize) {
        let Some(mut queue) = self.queues.get_mut(q).and_then(Option::take) else {
            return;
        };
        self.counters.queues_torn_down += 1;
        queue.connection.disconnect(&queue.qp);
        // Dropping the queue destroys the QP (flushing what was outstanding), then the
        // CQ and the memory.
        drop(queue);
    }
}

impl Poller for Target {
    fn poll(&mut self) -> usize {
        Target::poll(self)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `range` must lie inside `capacity` blocks.
fn check_range(range: &BlockRange, capacity: u64) -> Result<(), Status> {
    match range.slba.checked_add(u64::from(range.blocks)) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

/// Whether `data` can carry `length` bytes of `command`'s data the way it must move.
fn check_data_pointer(command: &Command, data: &DataPointer, length: u32) -> Result<u32, Status> {
    let direction = command.data_direction();
    if length == 0 || direction == DataDirection::None {
        return Ok(0);
    }
    let exact = matches!(command, Command::Read(_) | Command::Write(_) | Command::Compare(_));
    match (data, direction) {
        (DataPointer::None, _) => Err(Status::DATA_SGL_LENGTH_INVALID),
        (DataPointer::InCapsule(_), DataDirection::ControllerToHost) => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID),
        (pointer, _) => {
            let available = pointer.length();
            if (exact && available != u64::from(length)) || available < u64::from(length) {
                Err(Status::DATA_SGL_LENGTH_INVALID)
            } else {
                Ok(length)
            }
        }
    }
}
