//! The NVMe-oF/RDMA host (initiator): discovery, a controller with an admin queue and N
//! I/O queues, Identify, Read/Write/Flush/Write Zeroes/Dataset Management, keep-alive,
//! asynchronous events, and reconnection after a lost connection.
//!
//! The bring-up follows Linux's `nvme-rdma` and SPDK's host (storage-and-cm.md B.1,
//! B.7, B.8): CM connect of the admin queue, Fabrics Connect, Property Get CAP / VS,
//! Property Set CC.EN, wait for CSTS.RDY, Identify Controller, Set Features Number of
//! Queues, CM connect and Fabrics Connect of every I/O queue, Asynchronous Event
//! Configuration and one AER, Identify of the active namespaces.
//!
//! Two interfaces: blocking calls (`identify_*`, [`Host::read`], [`Host::write`], …)
//! that let the [`Reactor`] pass time while they wait, and a non-blocking one for
//! benchmarks ([`Host::submit`], [`Host::poll`]) with data buffers from each queue's
//! registered pool.

mod queue;

use std::collections::VecDeque;
use std::sync::Arc;

use rnic_verbs::{AccessFlags, Context, ProtectionDomain, WcFlags, WcStatus};

use crate::nvmeof::wire::cm::{CmReject, CmReply};
use crate::nvmeof::wire::cm::{CmRejectRepr, CmRejectStatus, CmReplyRepr, CmRequestRepr};
use crate::nvmeof::wire::command::{cns, feature, log_page, BlockRange, Command, DsmRange, PropertySize};
use crate::nvmeof::wire::connect_data::{ConnectDataRepr, CNTLID_DYNAMIC};
use crate::nvmeof::wire::cqe::{Cqe, CqeRepr};
use crate::nvmeof::wire::identify::{
    parse_active_namespaces, parse_identify_controller, parse_identify_namespace, parse_namespace_descriptors, sgls,
    IdentifyControllerRepr, IdentifyNamespaceRepr, NamespaceDescriptor, IDENTIFY_LEN,
};
use crate::nvmeof::wire::log::{DiscoveryLogEntryRepr, DiscoveryLogHeaderRepr, DISCOVERY_RECORD_LEN};
use crate::nvmeof::wire::properties::{offset, Cap, Cc, Csts, Shutdown, ShutdownStatus};
use crate::nvmeof::wire::sgl::SglRepr;
use crate::nvmeof::wire::sqe::SQE_LEN;
use crate::nvmeof::wire::status::Status;
use crate::rdma::connection::DISCONNECT_WAIT_NS;
use crate::rdma::{BufferPool, ConnectParams, ConnectionError, Connector, DataBuffer, Reactor, ServiceAddress};

use queue::{HostBuffer, HostQueue, Outstanding, Owner};

pub use crate::nvmeof::target::DISCOVERY_NQN;

/// New attempts at a queue refused as a stale connection, or whose connection got no
/// answer within `connect_timeout_ns` (a lost REQ or REP: the CM would repeat it only
/// after its response timeout, about 4 s, past Linux's 3 s budget that we keep).
const CONNECT_RETRIES: u32 = 3;
/// Pause before such an attempt, ns.
const CONNECT_RETRY_DELAY_NS: u64 = 200_000_000;

const DIAG_STRAY_RESPONSE: rnic_diag::Kind = rnic_diag::Kind::new("nvmf-host", "stray response");
const DIAG_INVALIDATION: rnic_diag::Kind = rnic_diag::Kind::new("nvmf-host", "key not invalidated");
const DIAG_KEEP_ALIVE: rnic_diag::Kind = rnic_diag::Kind::new("nvmf-host", "keep alive failed");
const DIAG_CONNECTION_LOST: rnic_diag::Kind = rnic_diag::Kind::new("nvmf-host", "connection lost");

/// How a host connects.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The host's NQN.
    pub host_nqn: String,
    /// The host identifier (a UUID).
    pub host_id: [u8; 16],
    /// The subsystem to connect to.
    pub subsystem_nqn: String,
    /// Where the target listens.
    pub target: ServiceAddress,
    /// I/O queues to ask for.
    pub io_queues: u16,
    /// Entries per I/O queue (clamped to the controller's CAP.MQES + 1 and MAXCMD).
    pub queue_entries: u16,
    /// Entries of the admin queue.
    pub admin_queue_entries: u16,
    /// Keep-alive timeout asked for in the admin Connect, ms (0: none). A Keep Alive
    /// goes out every half of it.
    pub kato_ms: u32,
    /// Put write data in the capsule when the controller takes it and it fits.
    pub in_capsule_data: bool,
    /// Register every command's data in a region of its own and ask the target to
    /// invalidate its key with the response (keyed SGL 0x4F), as Linux's host does.
    pub invalidate: bool,
    /// Bytes of registered data buffers per I/O queue.
    pub data_pool_bytes: usize,
    /// How long a connection attempt may take, ns.
    pub connect_timeout_ns: u64,
    /// How long a blocking command may take, ns.
    pub command_timeout_ns: u64,
    /// Reconnection attempts after a lost connection (0: give up at once).
    pub reconnect_attempts: u32,
    /// Pause before each reconnection attempt, ns.
    pub reconnect_delay_ns: u64,
    /// Enable namespace attribute notices and keep an Asynchronous Event Request out.
    pub async_events: bool,
    /// Misbehave on purpose (tests of a target): tell the target queues of this many
    /// entries (CM HSQSIZE, Connect SQSIZE) while keeping `queue_entries` /
    /// `admin_queue_entries` commands outstanding.
    pub advertised_queue_entries: Option<u16>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:7e0c5f5a-1b6e-4c55-9d1c-72d1b7a0f001".into(),
            host_id: [
                0x7e, 0x0c, 0x5f, 0x5a, 0x1b, 0x6e, 0x4c, 0x55, 0x9d, 0x1c, 0x72, 0xd1, 0xb7, 0xa0, 0xf0, 0x01,
            ],
            subsystem_nqn: String::new(),
            target: ServiceAddress::new(std::net::Ipv4Addr::LOCALHOST, 4420),
            io_queues: 1,
            queue_entries: 128,
            admin_queue_entries: 32,
            kato_ms: 5000,
            in_capsule_data: true,
            invalidate: false,
            data_pool_bytes: 8 << 20,
            connect_timeout_ns: 3_000_000_000,
            command_timeout_ns: 30_000_000_000,
            reconnect_attempts: 10,
            reconnect_delay_ns: 100_000_000,
            async_events: true,
            advertised_queue_entries: None,
        }
    }
}

/// What can go wrong on the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The verbs layer refused something.
    #[error("verbs: {0}")]
    Verbs(#[from] rnic_verbs::VerbsError),
    /// A connection could not be made.
    #[error("connection: {0}")]
    Connection(#[from] ConnectionError),
    /// The target refused the queue's connection with an NVMe-oF reject.
    #[error("queue {qid} rejected: {status}")]
    Rejected {
        /// The queue.
        qid: u16,
        /// The reject's status.
        status: CmRejectStatus,
    },
    /// A command completed with an error status.
    #[error("{command} failed: {status} (DW0 {dw0:#x})")]
    Command {
        /// Command name.
        command: &'static str,
        /// Its status.
        status: Status,
        /// Its DW0 (Connect: the invalid parameter).
        dw0: u32,
    },
    /// No answer in time.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// The target said something that makes no sense.
    #[error("protocol: {0}")]
    Protocol(String),
    /// Every entry of the queue is in use.
    #[error("queue {0} is full")]
    QueueFull(usize),
    /// The connection was lost and could not be restored.
    #[error("disconnected: {0}")]
    Disconnected(String),
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
}

type Result<T, E = HostError> = std::result::Result<T, E>;

/// What an I/O command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read blocks into the buffer.
    Read,
    /// Write the buffer's bytes.
    Write,
    /// Compare the buffer with the blocks.
    Compare,
    /// Flush the namespace's volatile cache.
    Flush,
    /// Write zeroes (deallocating them when `deallocate`).
    WriteZeroes {
        /// Deallocate as well.
        deallocate: bool,
    },
}

/// One I/O command for [`Host::submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRequest {
    /// What it does.
    pub op: IoOp,
    /// Namespace.
    pub nsid: u32,
    /// First block.
    pub slba: u64,
    /// Blocks (1..=65536).
    pub blocks: u32,
    /// Force unit access.
    pub fua: bool,
    /// The data (Read, Write, Compare): a buffer of the queue's pool of exactly
    /// `blocks × block size` bytes.
    pub buffer: Option<DataBuffer>,
}

/// A finished I/O command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoCompletion {
    /// The I/O queue index it ran on (0-based; QID − 1).
    pub queue: usize,
    /// The caller's tag.
    pub tag: u64,
    /// Its status.
    pub status: Status,
    /// Submission to completion, ns on the reactor's clock.
    pub latency_ns: u64,
}

/// A namespace as Identify described it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// NSID.
    pub nsid: u32,
    /// Block size, bytes.
    pub block_size: u32,
    /// Blocks.
    pub blocks: u64,
}

/// What the host did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Commands sent (all queues).
    pub commands: u64,
    /// Commands that completed with an error status.
    pub command_errors: u64,
    /// Keep Alives sent.
    pub keep_alives: u64,
    /// Asynchronous events received.
    pub async_events: u64,
    /// Reconnections that succeeded.
    pub reconnects: u64,
    /// I/O commands sent again after a reconnection.
    pub resubmitted: u64,
    /// Responses that named no outstanding command.
    pub stray_responses: u64,
    /// Responses that did not invalidate the key the command asked to be invalidated.
    pub invalidation_mismatches: u64,
    /// Responses that did invalidate it.
    pub invalidations: u64,
}

/// The data of a command the host builds.
#[derive(Debug, Clone, Copy)]
enum Data {
    None,
    ToController(DataBuffer, u32),
    FromController(DataBuffer, u32),
}

/// A finished command.
#[derive(Debug)]
struct Finished {
    queue: usize,
    cid: u16,
    owner: Owner,
    cqe: CqeRepr,
}

/// The host.
pub struct Host {
    context: Context,
    pd: ProtectionDomain,
    connector: Box<dyn Connector>,
    reactor: Box<dyn Reactor>,
    config: HostConfig,
    /// Index 0: the admin queue; index q: I/O queue q.
    queues: Vec<Option<HostQueue>>,
    pools: Vec<BufferPool>,
    cntlid: u16,
    cap: Cap,
    controller: IdentifyControllerRepr,
    namespaces: Vec<NamespaceInfo>,
    io_queue_count: usize,
    io_entries: u16,
    in_capsule_limit: usize,
    next_keep_alive_ns: Option<u64>,
    keep_alive_outstanding: bool,
    counters: HostCounters,
    finished_blocking: Vec<Finished>,
    finished_io: VecDeque<IoCompletion>,
    events: Vec<u32>,
    /// The connection generation: bumped by every reconnection.
    epoch: u64,
    failed: Option<String>,
    recovering: bool,
    polls: u32,
    io_polls: u32,
    /// The capsule being built (SQE and in-capsule data), kept between commands so a
    /// submission allocates nothing.
    capsule: Vec<u8>,
    /// Slots a poll of one queue touched and the commands it finished, kept between
    /// polls for the same reason.
    touched: Vec<usize>,
    finished: Vec<Outstanding>,
    /// Response slots whose receives a poll of one queue posts again, together.
    reposts: Vec<usize>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("subsystem", &self.config.subsystem_nqn)
            .field("cntlid", &self.cntlid)
            .field("io_queues", &self.io_queue_count)
            .finish()
    }
}

impl Host {
    /// Connects to `config.subsystem_nqn` at `config.target`: admin queue, enable,
    /// Identify, I/O queues, namespaces.
    ///
    /// # Errors
    /// Whatever step failed: a reject, a Connect refused (e.g. an unknown host NQN:
    /// [`Status::CONNECT_INVALID_HOST`]), a timeout, verbs failures.
    pub fn connect(
        context: Context,
        connector: Box<dyn Connector>,
        reactor: Box<dyn Reactor>,
        config: HostConfig,
    ) -> Result<Self> {
        if config.queue_entries < 2 || config.queue_entries > 1024 || !(2..=32).contains(&config.admin_queue_entries) {
            return Err(HostError::Config(format!(
                "queue entries: I/O {} (2..=1024), admin {} (2..=32)",
                config.queue_entries, config.admin_queue_entries
            )));
        }
        let pd = context.alloc_pd()?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let mut pools = vec![BufferPool::new(&pd, 1 << 20, 4096, access)?];
        for _ in 0..config.io_queues {
            pools.push(BufferPool::new(&pd, config.data_pool_bytes.max(4096), 512, access)?);
        }
        let mut host = Self {
            context,
            pd,
            connector,
            reactor,
            config,
            queues: Vec::new(),
            pools,
            cntlid: 0,
            cap: Cap::default(),
            controller: IdentifyControllerRepr::default(),
            namespaces: Vec::new(),
            io_queue_count: 0,
            io_entries: 0,
            in_capsule_limit: 0,
            next_keep_alive_ns: None,
            keep_alive_outstanding: false,
            counters: HostCounters::default(),
            finished_blocking: Vec::new(),
            finished_io: VecDeque::new(),
            events: Vec::new(),
            epoch: 0,
            failed: None,
            recovering: false,
            polls: 0,
            io_polls: 0,
            capsule: Vec::new(),
            touched: Vec::new(),
            finished: Vec::new(),
            reposts: Vec::new(),
        };
        host.recovering = true;
        let result = host.establish();
        host.recovering = false;
        result.map(|()| host)
    }

    /// Reads the Discovery log page of the target at `config.target` (the subsystem NQN
    /// of `config` is ignored) and disconnects.
    ///
    /// # Errors
    /// As [`Host::connect`]; [`HostError::Protocol`] if the log page keeps changing.
    pub fn discover(
        context: Context,
        connector: Box<dyn Connector>,
        reactor: Box<dyn Reactor>,
        config: HostConfig,
    ) -> Result<Vec<DiscoveryLogEntryRepr>> {
        let config = HostConfig {
            subsystem_nqn: DISCOVERY_NQN.into(),
            io_queues: 0,
            kato_ms: 0,
            async_events: false,
            reconnect_attempts: 0,
            ..config
        };
        let mut host = Self::connect(context, connector, reactor, config)?;
        let entries = host.discovery_log();
        let _ = host.disconnect();
        entries
    }

    /// The Discovery log page's records: the header, the records, then the header again
    /// until the generation counter held still (as hosts must).
    ///
    /// # Errors
    /// Command failures; [`HostError::Protocol`] if it never held still.
    pub fn discovery_log(&mut self) -> Result<Vec<DiscoveryLogEntryRepr>> {
        for _ in 0..8 {
            let header = self.get_log_page(log_page::DISCOVERY, 0, 0, DISCOVERY_RECORD_LEN)?;
            let header = DiscoveryLogHeaderRepr::parse(&header).map_err(|e| HostError::Protocol(e.to_string()))?;
            let records = header.numrec.min(1024) as usize;
            let page = self.get_log_page(log_page::DISCOVERY, 0, 0, DISCOVERY_RECORD_LEN * (records + 1))?;
            let again = self.get_log_page(log_page::DISCOVERY, 0, 0, DISCOVERY_RECORD_LEN)?;
            let again = DiscoveryLogHeaderRepr::parse(&again).map_err(|e| HostError::Protocol(e.to_string()))?;
            if again.genctr != header.genctr {
                continue;
            }
            return (0..records)
                .map(|i| {
                    DiscoveryLogEntryRepr::parse(&page[DISCOVERY_RECORD_LEN * (i + 1)..])
                        .map_err(|e| HostError::Protocol(e.to_string()))
                })
                .collect();
        }
        Err(HostError::Protocol("the discovery log kept changing".into()))
    }

    // ----- bring-up ------------------------------------------------------------------

    fn establish(&mut self) -> Result<()> {
        self.queues.clear();
        self.queues.push(None);
        let admin_entries = self.config.admin_queue_entries;
        let admin = self.connect_queue(0, admin_entries, 0, 0)?;
        self.queues[0] = Some(admin);
        // Fabrics Connect on the admin queue: a dynamic controller.
        let dw0 = self.fabrics_connect(0, admin_entries, CNTLID_DYNAMIC)?;
        self.cntlid = dw0 as u16;
        // The controller's keep-alive timer runs from its Connect: keep it fed through
        // the rest of the bring-up (a lost CM message costs seconds).
        self.keep_alive_outstanding = false;
        self.next_keep_alive_ns =
            (self.config.kato_ms > 0).then(|| self.now() + u64::from(self.config.kato_ms) * 500_000);
        self.cap = Cap::from_u64(self.property_get(offset::CAP, PropertySize::Eight)?);
        let _version = self.property_get(offset::VS, PropertySize::Four)?;
        let cc = Cc::from_u32(self.property_get(offset::CC, PropertySize::Four)? as u32);
        if cc.enable {
            self.property_set(offset::CC, 0)?;
            self.wait_csts(|csts| !csts.ready)?;
        }
        self.property_set(offset::CC, u64::from(Cc::enabled().to_u32()))?;
        self.wait_csts(|csts| csts.ready)?;
        self.controller = self.identify_controller()?;
        if self.controller.sgls & sgls::KEYED == 0 {
            return Err(HostError::Protocol("the controller does not take keyed SGLs".into()));
        }
        if self.controller.icdoff != 0 {
            return Err(HostError::Protocol(format!(
                "ICDOFF {} (only 0 is supported)",
                self.controller.icdoff
            )));
        }
        self.in_capsule_limit = if self.config.in_capsule_data && self.controller.sgls & sgls::OFFSET != 0 {
            (self.controller.ioccsz as usize * 16)
                .saturating_sub(SQE_LEN)
                .min(64 << 10)
        } else {
            0
        };
        self.io_entries =
            self.config
                .queue_entries
                .min(self.cap.mqes.saturating_add(1))
                .min(if self.controller.maxcmd > 0 {
                    self.controller.maxcmd
                } else {
                    u16::MAX
                });
        let discovery = self.config.subsystem_nqn == DISCOVERY_NQN;
        self.io_queue_count = 0;
        if !discovery && self.config.io_queues > 0 {
            let wanted = u32::from(self.config.io_queues - 1);
            let granted = self.set_features(feature::NUMBER_OF_QUEUES, wanted << 16 | wanted)?;
            let count = ((granted & 0xFFFF).min(granted >> 16) + 1).min(u32::from(self.config.io_queues));
            for qid in 1..=count as u16 {
                let queue = self.connect_queue(qid, self.io_entries, self.cntlid, self.in_capsule_limit)?;
                self.queues.push(Some(queue));
                self.fabrics_connect(qid, self.io_entries, self.cntlid)?;
                self.io_queue_count += 1;
            }
        }
        if !discovery {
            if self.config.async_events {
                // Namespace attribute notices.
                self.set_features(feature::ASYNC_EVENT_CONFIGURATION, 1 << 8)?;
                self.submit_internal(0, Command::AsyncEventRequest, Owner::AsyncEvent)?;
            }
            self.refresh_namespaces()?;
        }
        self.failed = None;
        Ok(())
    }

    /// Identify of the active namespaces, kept for [`Host::namespaces`].
    ///
    /// # Errors
    /// Command failures.
    pub fn refresh_namespaces(&mut self) -> Result<()> {
        let mut namespaces = Vec::new();
        for nsid in self.active_namespaces()? {
            let id = self.identify_namespace(nsid)?;
            if let Some(block_size) = id.block_size() {
                namespaces.push(NamespaceInfo {
                    nsid,
                    block_size,
                    blocks: id.nsze,
                });
            }
        }
        self.namespaces = namespaces;
        Ok(())
    }

    fn connect_queue(&mut self, qid: u16, entries: u16, cntlid: u16, in_capsule: usize) -> Result<HostQueue> {
        // A peer holding a stale connection from our QP number (a previous process of ours
        // on the same NIC, whose disconnect it did not see) cleans it up when it refuses
        // us, but under loss that can take its CM several response timeouts: try again
        // with a new QP, which comes with another number (the driver hands QP numbers
        // out round robin, as hns does).
        let mut attempt = 0;
        loop {
            match self.connect_queue_once(qid, entries, cntlid, in_capsule) {
                Err(HostError::Connection(ConnectionError::Stale(_) | ConnectionError::TimedOut(_)))
                    if attempt < CONNECT_RETRIES =>
                {
                    attempt += 1;
                    let until = self.now() + CONNECT_RETRY_DELAY_NS;
                    while self.now() < until {
                        let work = self.poll_queues();
                        self.reactor.idle(work > 0);
                    }
                }
                other => return other,
            }
        }
    }

    fn connect_queue_once(&mut self, qid: u16, entries: u16, cntlid: u16, in_capsule: usize) -> Result<HostQueue> {
        let (qp, cq, capsules, responses) = HostQueue::create(&self.context, &self.pd, entries, in_capsule)?;
        let advertised = self.config.advertised_queue_entries.unwrap_or(entries).max(1);
        let request = CmRequestRepr {
            recfmt: 0,
            qid,
            hrqsize: entries,
            hsqsize: advertised - 1,
            cntlid,
        };
        let device = self.context.query_device();
        let params = ConnectParams {
            destination: self.config.target,
            private_data: request.to_bytes().to_vec(),
            responder_resources: device.max_qp_rd_atom.clamp(1, 16) as u8,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let mut pending = self.connector.connect(&self.context, &qp, &params)?;
        let deadline = self.now() + self.config.connect_timeout_ns;
        let (established, connection) = loop {
            if let Some(result) = pending.poll(&qp) {
                match result {
                    Ok(done) => break done,
                    Err(ConnectionError::Rejected { private_data }) => {
                        let status = CmReject::new_checked(&private_data[..])
                            .ok()
                            .and_then(|view| CmRejectRepr::parse(&view).ok())
                            .map_or(CmRejectStatus::Other(0), |r| r.status);
                        return Err(HostError::Rejected { qid, status });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if self.now() > deadline {
                return Err(ConnectionError::TimedOut(self.config.target).into());
            }
            self.reactor.idle(false);
        };
        let reply = CmReply::new_checked(&established.private_data[..])
            .ok()
            .and_then(|view| CmReplyRepr::parse(&view).ok())
            .ok_or_else(|| HostError::Protocol(format!("queue {qid}: REP private data is not an NVMe-oF reply")))?;
        if reply.crqsize < entries {
            tracing::debug!(
                qid,
                crqsize = reply.crqsize,
                entries,
                "nvmf host: the controller's receive queue is smaller"
            );
        }
        let queue = HostQueue {
            qp,
            cq,
            connection,
            capsules,
            responses,
            entries,
            slots: (0..entries).map(|_| None).collect(),
            generations: vec![0; usize::from(entries)],
            free: (0..usize::from(entries)).rev().collect(),
            completions: vec![Default::default(); 32],
            pending_sends: Vec::with_capacity(usize::from(entries)),
        };
        for slot in 0..usize::from(entries) {
            queue
                .post_receive(slot)
                .map_err(|e| HostError::Protocol(format!("posting receives: {e}")))?;
        }
        Ok(queue)
    }

    fn fabrics_connect(&mut self, qid: u16, entries: u16, cntlid: u16) -> Result<u32> {
        let data = ConnectDataRepr {
            host_id: self.config.host_id,
            cntlid,
            subsystem_nqn: self.config.subsystem_nqn.clone(),
            host_nqn: self.config.host_nqn.clone(),
        }
        .to_bytes();
        let entries = self.config.advertised_queue_entries.unwrap_or(entries).max(2);
        let command = Command::Connect {
            recfmt: 0,
            qid,
            sqsize: entries - 1,
            cattr: 0,
            kato: if qid == 0 { self.config.kato_ms } else { 0 },
        };
        let (cqe, _) = self.command_with_data(usize::from(qid), command, Some(&data), 0)?;
        Ok(cqe.dw0)
    }

    fn wait_csts(&mut self, done: impl Fn(Csts) -> bool) -> Result<()> {
        // CAP.TO in 500 ms units.
        let deadline = self.now() + u64::from(self.cap.timeout.max(1)) * 500_000_000;
        loop {
            let csts = Csts::from_u32(self.property_get(offset::CSTS, PropertySize::Four)? as u32);
            if csts.fatal {
                return Err(HostError::Protocol(
                    "the controller reports a fatal status (CSTS.CFS)".into(),
                ));
            }
            if done(csts) {
                return Ok(());
            }
            if self.now() > deadline {
                return Err(HostError::TimedOut("waiting for CSTS".into()));
            }
            for _ in 0..100 {
                self.reactor.idle(false);
            }
        }
    }

    // ----- accessors -----------------------------------------------------------------

    /// The controller ID.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// Identify Controller as read at connect time.
    pub fn controller(&self) -> &IdentifyControllerRepr {
        &self.controller
    }

    /// The active namespaces as identified.
    pub fn namespaces(&self) -> &[NamespaceInfo] {
        &self.namespaces
    }

    /// The namespace `nsid`, if active.
    pub fn namespace(&self, nsid: u32) -> Option<NamespaceInfo> {
        self.namespaces.iter().copied().find(|n| n.nsid == nsid)
    }

    /// I/O queues connected.
    pub fn io_queues(&self) -> usize {
        self.io_queue_count
    }

    /// Entries per I/O queue.
    pub fn io_queue_entries(&self) -> u16 {
        self.io_entries
    }

    /// In-capsule data bytes the host uses for writes (0: none).
    pub fn in_capsule_limit(&self) -> usize {
        self.in_capsule_limit
    }

    /// Largest transfer the controller takes, bytes (MDTS; 0 = no limit → 1 MiB).
    pub fn max_transfer(&self) -> u32 {
        let mdts = self.controller.mdts;
        if mdts == 0 {
            1 << 20
        } else {
            4096u32 << mdts.min(12)
        }
    }

    /// What the host did.
    pub fn counters(&self) -> &HostCounters {
        &self.counters
    }

    /// Asynchronous events received since the last call (CQE DW0 values).
    pub fn take_events(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.events)
    }

    /// The reactor (to let time pass between non-blocking calls).
    pub fn reactor(&mut self) -> &mut dyn Reactor {
        &mut *self.reactor
    }

    /// Now on the reactor's clock, ns.
    pub fn now(&self) -> u64 {
        self.reactor.clock().now_ns()
    }

    /// How many times the host reconnected.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    // ----- admin commands --------------------------------------------------------------

    /// Property Get.
    ///
    /// # Errors
    /// Command failures.
    pub fn property_get(&mut self, at: u32, size: PropertySize) -> Result<u64> {
        let (cqe, _) = self.command_with_data(0, Command::PropertyGet { size, offset: at }, None, 0)?;
        Ok(u64::from(cqe.dw0) | u64::from(cqe.dw1) << 32)
    }

    /// Property Set (4 bytes).
    ///
    /// # Errors
    /// Command failures.
    pub fn property_set(&mut self, at: u32, value: u64) -> Result<()> {
        let command = Command::PropertySet {
            size: PropertySize::Four,
            offset: at,
            value,
        };
        self.command_with_data(0, command, None, 0).map(|_| ())
    }

    /// Identify Controller.
    ///
    /// # Errors
    /// Command failures; a structure that does not parse.
    pub fn identify_controller(&mut self) -> Result<IdentifyControllerRepr> {
        let bytes = self.identify(cns::CONTROLLER, 0)?;
        parse_identify_controller(&bytes).map_err(|e| HostError::Protocol(e.to_string()))
    }

    /// Identify Namespace.
    ///
    /// # Errors
    /// Command failures; a structure that does not parse.
    pub fn identify_namespace(&mut self, nsid: u32) -> Result<IdentifyNamespaceRepr> {
        let bytes = self.identify(cns::NAMESPACE, nsid)?;
        parse_identify_namespace(&bytes).map_err(|e| HostError::Protocol(e.to_string()))
    }

    /// The active namespace IDs.
    ///
    /// # Errors
    /// Command failures; a list that does not parse.
    pub fn active_namespaces(&mut self) -> Result<Vec<u32>> {
        let bytes = self.identify(cns::ACTIVE_NAMESPACES, 0)?;
        parse_active_namespaces(&bytes).map_err(|e| HostError::Protocol(e.to_string()))
    }

    /// The namespace identification descriptors of `nsid`.
    ///
    /// # Errors
    /// Command failures; a list that does not parse.
    pub fn namespace_descriptors(&mut self, nsid: u32) -> Result<Vec<NamespaceDescriptor>> {
        let bytes = self.identify(cns::NAMESPACE_DESCRIPTORS, nsid)?;
        parse_namespace_descriptors(&bytes).map_err(|e| HostError::Protocol(e.to_string()))
    }

    /// Identify with any CNS: the 4096 bytes.
    ///
    /// # Errors
    /// Command failures.
    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> Result<Vec<u8>> {
        let command = Command::Identify {
            cns: cns_value,
            cntid: 0,
            nsid,
            csi: 0,
        };
        self.command_with_data(0, command, None, IDENTIFY_LEN as u32)
            .map(|(_, data)| data)
    }

    /// `length` bytes of log page `lid` from `offset`.
    ///
    /// # Errors
    /// Command failures.
    pub fn get_log_page(&mut self, lid: u8, nsid: u32, at: u64, length: usize) -> Result<Vec<u8>> {
        let dwords = length.div_ceil(4) as u32;
        let command = Command::GetLogPage {
            lid,
            lsp: 0,
            rae: false,
            dwords: u64::from(dwords),
            offset: at,
            nsid,
        };
        self.command_with_data(0, command, None, dwords * 4)
            .map(|(_, mut data)| {
                data.truncate(length);
                data
            })
    }

    /// Set Features; returns DW0.
    ///
    /// # Errors
    /// Command failures.
    pub fn set_features(&mut self, fid: u8, value: u32) -> Result<u32> {
        let command = Command::SetFeatures {
            fid,
            save: false,
            nsid: 0,
            value,
        };
        self.command_with_data(0, command, None, 0).map(|(cqe, _)| cqe.dw0)
    }

    /// Get Features (current value); returns DW0.
    ///
    /// # Errors
    /// Command failures.
    pub fn get_features(&mut self, fid: u8) -> Result<u32> {
        let command = Command::GetFeatures {
            fid,
            select: 0,
            nsid: 0,
            cdw11: 0,
        };
        self.command_with_data(0, command, None, 0).map(|(cqe, _)| cqe.dw0)
    }

    /// Keep Alive, now.
    ///
    /// # Errors
    /// Command failures.
    pub fn keep_alive(&mut self) -> Result<()> {
        self.counters.keep_alives += 1;
        self.command_with_data(0, Command::KeepAlive, None, 0).map(|_| ())
    }

    // ----- blocking I/O ----------------------------------------------------------------

    fn block_size(&self, nsid: u32) -> Result<u32> {
        self.namespace(nsid)
            .map(|n| n.block_size)
            .ok_or_else(|| HostError::Config(format!("namespace {nsid} is not active")))
    }

    fn io_command(&mut self, op: IoOp, nsid: u32, slba: u64, blocks: u32, fua: bool) -> Command {
        let range = BlockRange {
            nsid,
            slba,
            blocks,
            fua,
        };
        match op {
            IoOp::Read => Command::Read(range),
            IoOp::Write => Command::Write(range),
            IoOp::Compare => Command::Compare(range),
            IoOp::Flush => Command::Flush { nsid },
            IoOp::WriteZeroes { deallocate } => Command::WriteZeroes { range, deallocate },
        }
    }

    /// Reads `out.len()` bytes (whole blocks) from block `slba` of `nsid`, on the first
    /// I/O queue, split at the controller's maximum transfer.
    ///
    /// # Errors
    /// Command failures; a length that is not whole blocks.
    pub fn read(&mut self, nsid: u32, slba: u64, out: &mut [u8]) -> Result<()> {
        let block_size = self.block_size(nsid)? as usize;
        if !out.len().is_multiple_of(block_size) {
            return Err(HostError::Config(format!(
                "{} bytes is not whole {block_size}-byte blocks",
                out.len()
            )));
        }
        let chunk = (self.max_transfer() as usize / block_size).max(1) * block_size;
        for (i, part) in out.chunks_mut(chunk).enumerate() {
            let lba = slba + (i * chunk / block_size) as u64;
            let command = self.io_command(IoOp::Read, nsid, lba, (part.len() / block_size) as u32, false);
            let (_, data) = self.command_with_data(1, command, None, part.len() as u32)?;
            part.copy_from_slice(&data);
        }
        Ok(())
    }

    /// Writes `data` (whole blocks) at block `slba` of `nsid`, on the first I/O queue.
    ///
    /// # Errors
    /// Command failures; a length that is not whole blocks.
    pub fn write(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Result<()> {
        let block_size = self.block_size(nsid)? as usize;
        if !data.len().is_multiple_of(block_size) {
            return Err(HostError::Config(format!(
                "{} bytes is not whole {block_size}-byte blocks",
                data.len()
            )));
        }
        let chunk = (self.max_transfer() as usize / block_size).max(1) * block_size;
        for (i, part) in data.chunks(chunk).enumerate() {
            let lba = slba + (i * chunk / block_size) as u64;
            let command = self.io_command(IoOp::Write, nsid, lba, (part.len() / block_size) as u32, false);
            self.command_with_data(1, command, Some(part), 0)?;
        }
        Ok(())
    }

    /// Flushes `nsid` (0xFFFFFFFF: every namespace).
    ///
    /// # Errors
    /// Command failures.
    pub fn flush(&mut self, nsid: u32) -> Result<()> {
        self.command_with_data(1, Command::Flush { nsid }, None, 0).map(|_| ())
    }

    /// Writes zeroes to `blocks` blocks from `slba` (and deallocates them).
    ///
    /// # Errors
    /// Command failures.
    pub fn write_zeroes(&mut self, nsid: u32, slba: u64, blocks: u32, deallocate: bool) -> Result<()> {
        let command = self.io_command(IoOp::WriteZeroes { deallocate }, nsid, slba, blocks, false);
        self.command_with_data(1, command, None, 0).map(|_| ())
    }

    /// Deallocates block ranges `(slba, blocks)` with Dataset Management.
    ///
    /// # Errors
    /// Command failures; more than 256 ranges.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<()> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(HostError::Config(format!("{} ranges: 1..=256", ranges.len())));
        }
        let data: Vec<u8> = ranges
            .iter()
            .flat_map(|&(slba, blocks)| {
                DsmRange {
                    attributes: 0,
                    blocks,
                    slba,
                }
                .to_bytes()
            })
            .collect();
        let command = Command::DatasetManagement {
            nsid,
            ranges: ranges.len() as u16,
            deallocate: true,
        };
        self.command_with_data(1, command, Some(&data), 0).map(|_| ())
    }

    /// Sends `command` on queue `queue` (0 admin, n I/O queue n) with `to_controller`
    /// data or room for `from_controller` bytes, and waits for it.
    fn command_with_data(
        &mut self,
        queue: usize,
        command: Command,
        to_controller: Option<&[u8]>,
        from_controller: u32,
    ) -> Result<(CqeRepr, Vec<u8>)> {
        if queue >= self.queues.len() || self.queues[queue].is_none() {
            return Err(HostError::Config(format!("no queue {queue}")));
        }
        let length = to_controller.map_or(from_controller, |d| d.len() as u32);
        let buffer = if length > 0 {
            let buffer = self.allocate_pool(queue, length)?;
            if let Some(data) = to_controller {
                self.pools[queue].write(&buffer, 0, data)?;
            }
            Some(buffer)
        } else {
            None
        };
        let data = match (buffer, to_controller) {
            (None, _) => Data::None,
            (Some(buffer), Some(_)) => Data::ToController(buffer, length),
            (Some(buffer), None) => Data::FromController(buffer, length),
        };
        let epoch = self.epoch;
        let cid = match self.submit_command(queue, command, data, Owner::Blocking) {
            Ok(cid) => cid,
            Err(e) => {
                if let Some(buffer) = buffer {
                    self.pools[queue].free(buffer);
                }
                return Err(e);
            }
        };
        let deadline = self.now() + self.config.command_timeout_ns;
        loop {
            if let Some(i) = self
                .finished_blocking
                .iter()
                .position(|f| f.queue == queue && f.cid == cid)
            {
                let finished = self.finished_blocking.swap_remove(i);
                let mut out = Vec::new();
                if let Some(buffer) = buffer {
                    if to_controller.is_none() && finished.cqe.status.is_success() {
                        out.resize(length as usize, 0);
                        self.pools[queue].read(&buffer, 0, &mut out)?;
                    }
                    self.pools[queue].free(buffer);
                }
                if !finished.cqe.status.is_success() {
                    return Err(HostError::Command {
                        command: command.name(),
                        status: finished.cqe.status,
                        dw0: finished.cqe.dw0,
                    });
                }
                return Ok((finished.cqe, out));
            }
            if self.epoch != epoch {
                return Err(HostError::Disconnected(format!(
                    "{} lost in a reconnection",
                    command.name()
                )));
            }
            if let Some(reason) = &self.failed {
                return Err(HostError::Disconnected(reason.clone()));
            }
            if self.now() > deadline {
                return Err(HostError::TimedOut(format!("{} on queue {queue}", command.name())));
            }
            let work = self.poll_queues();
            self.reactor.idle(work > 0);
        }
    }

    fn allocate_pool(&mut self, queue: usize, length: u32) -> Result<DataBuffer> {
        let deadline = self.now() + self.config.command_timeout_ns;
        loop {
            if let Some(buffer) = self.pools[queue].allocate(length) {
                return Ok(buffer);
            }
            if u64::from(length) > self.pools[queue].capacity() {
                return Err(HostError::Config(format!(
                    "{length} bytes do not fit queue {queue}'s {}-byte pool",
                    self.pools[queue].capacity()
                )));
            }
            if self.now() > deadline {
                return Err(HostError::TimedOut("waiting for a data buffer".into()));
            }
            let work = self.poll_queues();
            self.reactor.idle(work > 0);
        }
    }

    // ----- non-blocking I/O ------------------------------------------------------------

    /// A data buffer of `length` bytes in I/O queue `queue`'s pool (0-based), if free.
    pub fn allocate_buffer(&mut self, queue: usize, length: u32) -> Option<DataBuffer> {
        self.pools.get_mut(queue + 1)?.allocate(length)
    }

    /// Gives a buffer back to I/O queue `queue`'s pool.
    pub fn free_buffer(&mut self, queue: usize, buffer: DataBuffer) {
        if let Some(pool) = self.pools.get_mut(queue + 1) {
            pool.free(buffer);
        }
    }

    /// Copies `data` into a buffer of I/O queue `queue`'s pool at `offset`.
    ///
    /// # Errors
    /// Outside the buffer.
    pub fn write_buffer(&self, queue: usize, buffer: &DataBuffer, at: usize, data: &[u8]) -> Result<()> {
        let pool = self
            .pools
            .get(queue + 1)
            .ok_or_else(|| HostError::Config(format!("no I/O queue {queue}")))?;
        Ok(pool.write(buffer, at, data)?)
    }

    /// Copies bytes of a buffer of I/O queue `queue`'s pool from `offset` out.
    ///
    /// # Errors
    /// Outside the buffer.
    pub fn read_buffer(&self, queue: usize, buffer: &DataBuffer, at: usize, out: &mut [u8]) -> Result<()> {
        let pool = self
            .pools
            .get(queue + 1)
            .ok_or_else(|| HostError::Config(format!("no I/O queue {queue}")))?;
        Ok(pool.read(buffer, at, out)?)
    }

    /// The keyed SGL descriptor that names `buffer` of I/O queue `queue`'s pool (for raw
    /// capsules).
    pub fn buffer_sgl(&self, queue: usize, buffer: &DataBuffer) -> Option<SglRepr> {
        let pool = self.pools.get(queue + 1)?;
        Some(SglRepr::Keyed {
            address: pool.address(buffer),
            length: buffer.length,
            key: pool.rkey(),
            invalidate: false,
        })
    }

    /// Commands outstanding on I/O queue `queue`.
    pub fn outstanding(&self, queue: usize) -> usize {
        self.queues
            .get(queue + 1)
            .and_then(Option::as_ref)
            .map_or(0, |q| usize::from(q.entries) - q.free.len())
    }

    /// Sends `request` on I/O queue `queue` (0-based); its completion comes out of
    /// [`Host::poll`] with `tag`. The command's SEND is posted by the next
    /// [`Host::poll`], with the others submitted since the last one (one doorbell for a
    /// burst, as SPDK's delayed submission does).
    ///
    /// # Errors
    /// [`HostError::QueueFull`] when every entry is in use; [`HostError::Config`] for a
    /// missing buffer or queue; [`HostError::Disconnected`] after a failed reconnection.
    pub fn submit(&mut self, queue: usize, request: IoRequest, tag: u64) -> Result<()> {
        if queue >= self.io_queue_count {
            return Err(HostError::Config(format!("no I/O queue {queue}")));
        }
        if let Some(reason) = &self.failed {
            return Err(HostError::Disconnected(reason.clone()));
        }
        let command = self.io_command(request.op, request.nsid, request.slba, request.blocks, request.fua);
        let data = match (request.op, request.buffer) {
            (IoOp::Read, Some(buffer)) => Data::FromController(buffer, buffer.length),
            (IoOp::Write | IoOp::Compare, Some(buffer)) => Data::ToController(buffer, buffer.length),
            (IoOp::Read | IoOp::Write | IoOp::Compare, None) => {
                return Err(HostError::Config(format!("{} without a buffer", command.name())))
            }
            _ => Data::None,
        };
        self.submit_command(queue + 1, command, data, Owner::Io(tag))
            .map(|_| ())
    }

    /// Polls every queue, sends Keep Alives when due, handles lost connections
    /// (reconnecting and sending outstanding I/O again), and appends finished I/O
    /// commands to `completions`; returns how many it appended.
    ///
    /// # Errors
    /// [`HostError::Disconnected`] when the connection was lost and could not be
    /// restored.
    pub fn poll(&mut self, completions: &mut Vec<IoCompletion>) -> Result<usize> {
        self.io_polls = self.io_polls.wrapping_add(1);
        // The admin queue carries only Keep Alives and events on the I/O path: a look
        // every few polls is enough.
        self.poll_queues_with(self.io_polls.is_multiple_of(16));
        if let Some(reason) = &self.failed {
            return Err(HostError::Disconnected(reason.clone()));
        }
        let n = self.finished_io.len();
        completions.extend(self.finished_io.drain(..));
        Ok(n)
    }

    /// Sends a capsule as given (SQE and in-capsule data, the CID untouched) on queue
    /// `queue` (0 admin, n I/O queue n), for tests of a target's checks; with `wait`,
    /// waits for the response naming its CID.
    ///
    /// # Errors
    /// Queue full, post failures, a timeout.
    pub fn raw_capsule(&mut self, queue: usize, capsule: &[u8], wait: bool) -> Result<Option<CqeRepr>> {
        let cid = capsule.get(2..4).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
        let now = self.now();
        let q = self
            .queues
            .get_mut(queue)
            .and_then(Option::as_mut)
            .ok_or_else(|| HostError::Config(format!("no queue {queue}")))?;
        let Some((slot, _)) = q.take_slot() else {
            return Err(HostError::QueueFull(queue));
        };
        if capsule.len() > q.capsules.capacity() {
            q.free.push(slot);
            return Err(HostError::Config(format!(
                "a {}-byte capsule does not fit",
                capsule.len()
            )));
        }
        q.slots[slot] = Some(Outstanding {
            cid,
            command: Command::KeepAlive,
            buffer: HostBuffer::None,
            owner: Owner::Raw,
            submitted_ns: now,
            response: None,
            send_done: false,
            expect_invalidate: None,
            invalidated: None,
        });
        if let Err(e) = q.send_capsule(slot, capsule) {
            q.slots[slot] = None;
            q.free.push(slot);
            return Err(HostError::Protocol(e));
        }
        self.counters.commands += 1;
        if !wait {
            return Ok(None);
        }
        let deadline = self.now() + self.config.command_timeout_ns;
        loop {
            if let Some(i) = self
                .finished_blocking
                .iter()
                .position(|f| f.queue == queue && f.cid == cid && f.owner == Owner::Raw)
            {
                return Ok(Some(self.finished_blocking.swap_remove(i).cqe));
            }
            if let Some(reason) = &self.failed {
                return Err(HostError::Disconnected(reason.clone()));
            }
            if self.now() > deadline {
                return Err(HostError::TimedOut(format!("raw capsule {cid} on queue {queue}")));
            }
            let work = self.poll_queues();
            self.reactor.idle(work > 0);
        }
    }

    /// Responses to raw capsules that arrived (CQEs), taken.
    pub fn take_raw_responses(&mut self) -> Vec<CqeRepr> {
        let (raw, rest): (Vec<_>, Vec<_>) = self.finished_blocking.drain(..).partition(|f| f.owner == Owner::Raw);
        self.finished_blocking = rest;
        raw.into_iter().map(|f| f.cqe).collect()
    }

    // ----- submission and completion ---------------------------------------------------

    fn submit_internal(&mut self, queue: usize, command: Command, owner: Owner) -> Result<u16> {
        self.submit_command(queue, command, Data::None, owner)
    }

    fn submit_command(&mut self, queue: usize, command: Command, data: Data, owner: Owner) -> Result<u16> {
        let invalidate = self.config.invalidate;
        let in_capsule_limit = if queue > 0 { self.in_capsule_limit } else { 0 };
        let now = self.now();
        let pd = &self.pd;
        let pool = &self.pools[queue];
        let q = self
            .queues
            .get_mut(queue)
            .and_then(Option::as_mut)
            .ok_or_else(|| HostError::Disconnected(format!("queue {queue} is not connected")))?;
        let Some((slot, cid)) = q.take_slot() else {
            return Err(HostError::QueueFull(queue));
        };
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        // The capsule: the SQE, then any in-capsule data (read from the pool buffer
        // straight behind it).
        let capsule = &mut self.capsule;
        capsule.clear();
        capsule.resize(SQE_LEN, 0);
        let (sgl, buffer) = match data {
            Data::None => (SglRepr::NO_DATA, HostBuffer::None),
            Data::ToController(buffer, length) if (length as usize) <= in_capsule_limit => {
                capsule.resize(SQE_LEN + length as usize, 0);
                if let Err(e) = pool.read(&buffer, 0, &mut capsule[SQE_LEN..]) {
                    q.free.push(slot);
                    return Err(e.into());
                }
                (SglRepr::InCapsule { offset: 0, length }, HostBuffer::Pool(buffer))
            }
            Data::ToController(buffer, length) | Data::FromController(buffer, length) => {
                if invalidate {
                    let mut bytes = vec![0u8; length as usize];
                    if matches!(data, Data::ToController(..)) {
                        pool.read(&buffer, 0, &mut bytes)?;
                    }
                    let mr = pd.register_user_memory(bytes, access)?;
                    let sgl = SglRepr::Keyed {
                        address: mr.addr(),
                        length,
                        key: mr.rkey(),
                        invalidate: true,
                    };
                    (sgl, HostBuffer::Invalidating { pool: buffer, mr })
                } else {
                    let sgl = SglRepr::Keyed {
                        address: pool.address(&buffer),
                        length,
                        key: pool.rkey(),
                        invalidate: false,
                    };
                    (sgl, HostBuffer::Pool(buffer))
                }
            }
        };
        let expect_invalidate = match (&sgl, &buffer) {
            (SglRepr::Keyed { key, .. }, HostBuffer::Invalidating { .. }) => Some(*key),
            _ => None,
        };
        capsule[..SQE_LEN].copy_from_slice(&command.to_sqe(cid, &sgl).to_bytes());
        // The callers' I/O goes out with the next poll, a submission burst behind one
        // doorbell; the host's own and blocking commands go at once.
        let sent = if matches!(owner, Owner::Io(_)) {
            q.queue_capsule(slot, capsule)
        } else {
            q.send_capsule(slot, capsule)
        };
        if let Err(e) = sent {
            q.free.push(slot);
            return Err(HostError::Protocol(format!("sending {}: {e}", command.name())));
        }
        q.slots[slot] = Some(Outstanding {
            cid,
            command,
            buffer,
            owner,
            submitted_ns: now,
            response: None,
            send_done: false,
            expect_invalidate,
            invalidated: None,
        });
        self.counters.commands += 1;
        Ok(cid)
    }

    /// Polls every queue's CQ, finishes commands, and runs the timers; returns the work done.
    fn poll_queues(&mut self) -> usize {
        self.poll_queues_with(true)
    }

    fn poll_queues_with(&mut self, admin: bool) -> usize {
        let mut work = 0;
        let first = usize::from(!admin);
        for queue in first..self.queues.len() {
            match self.poll_queue(queue) {
                Ok(n) => work += n,
                Err(reason) => {
                    self.connection_lost(reason);
                    return work + 1;
                }
            }
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(64) {
            work += self.timers();
        }
        work
    }

    fn poll_queue(&mut self, queue: usize) -> std::result::Result<usize, String> {
        let Some(q) = self.queues[queue].as_mut() else {
            return Ok(0);
        };
        // The commands submitted since the last poll go out first, together.
        let submitted = q.pending_sends.len();
        if submitted > 0 {
            q.flush_sends().map_err(|e| format!("queue {queue}: {e}"))?;
        }
        let mut completions = std::mem::take(&mut q.completions);
        let count = q.cq.poll(&mut completions).map_err(|e| e.to_string());
        let count = match count {
            Ok(count) => count,
            Err(e) => {
                q.completions = completions;
                return Err(e);
            }
        };
        if count == 0 {
            q.completions = completions;
            return Ok(submitted);
        }
        let mut result = Ok(count + submitted);
        let touched = &mut self.touched;
        touched.clear();
        let reposts = &mut self.reposts;
        reposts.clear();
        for wc in &completions[..count] {
            if wc.status != WcStatus::Success {
                result = Err(format!(
                    "queue {queue}: a work request failed: {:?} (vendor {:#x})",
                    wc.status, wc.vendor_err
                ));
                break;
            }
            let slot = (wc.wr_id & 0xFFFF_FFFF) as usize;
            if wc.wr_id >> 63 == 0 {
                if let Some(Some(outstanding)) = q.slots.get_mut(slot) {
                    outstanding.send_done = true;
                    touched.push(slot);
                }
            } else {
                let mut bytes = [0u8; 16];
                if wc.byte_len as usize != bytes.len() || q.responses.read(slot, &mut bytes).is_err() {
                    result = Err(format!("queue {queue}: a response of {} bytes", wc.byte_len));
                    break;
                }
                let cqe = CqeRepr::parse(&Cqe::new_unchecked(&bytes[..])).expect("16 bytes");
                let invalidated = wc.wc_flags.contains(WcFlags::WITH_INV).then_some(wc.invalidated_rkey);
                // Its receive goes back (with the others of this poll) below.
                reposts.push(slot);
                let target_slot = q.slot_of(cqe.cid).or_else(|| {
                    q.slots.iter().position(|s| {
                        s.as_ref()
                            .is_some_and(|o| o.owner == Owner::Raw && o.cid == cqe.cid && o.response.is_none())
                    })
                });
                match target_slot.and_then(|s| q.slots[s].as_mut().map(|o| (s, o))) {
                    Some((s, outstanding)) if outstanding.response.is_none() => {
                        outstanding.response = Some(cqe);
                        outstanding.invalidated = invalidated;
                        touched.push(s);
                    }
                    _ => {
                        self.counters.stray_responses += 1;
                        rnic_diag::warn!(
                            rnic_diag::global(),
                            DIAG_STRAY_RESPONSE,
                            queue,
                            cid = cqe.cid,
                            "nvmf host: a response names no outstanding command"
                        );
                    }
                }
            }
        }
        q.completions = completions;
        if let Err(e) = q.post_receives(reposts) {
            if result.is_ok() {
                result = Err(format!("queue {queue}: reposting receives: {e}"));
            }
        }
        // Finish the commands touched now whose response and send completion are both in.
        let mut finished = std::mem::take(&mut self.finished);
        for &slot in touched.iter() {
            let done = q.slots[slot]
                .as_ref()
                .is_some_and(|o| o.send_done && o.response.is_some());
            if done {
                let outstanding = q.slots[slot].take().expect("checked");
                q.free.push(slot);
                finished.push(outstanding);
            }
        }
        for outstanding in finished.drain(..) {
            self.finish(queue, outstanding);
        }
        self.finished = finished;
        result
    }

    fn finish(&mut self, queue: usize, outstanding: Outstanding) {
        let mut cqe = outstanding.response.expect("finished commands have a response");
        if let Some(key) = outstanding.expect_invalidate {
            if outstanding.invalidated == Some(key) {
                self.counters.invalidations += 1;
            } else {
                self.counters.invalidation_mismatches += 1;
                rnic_diag::warn!(
                    rnic_diag::global(),
                    DIAG_INVALIDATION,
                    queue,
                    cid = cqe.cid,
                    expected = key,
                    got = ?outstanding.invalidated,
                    "nvmf host: the response did not invalidate the command's key"
                );
                if cqe.status.is_success() {
                    cqe.status = Status::DATA_TRANSFER_ERROR;
                }
            }
        }
        // Data of an invalidating region goes back to the pool buffer.
        match outstanding.buffer {
            HostBuffer::Invalidating { pool, mr } => {
                if matches!(
                    outstanding.command,
                    Command::Read(_) | Command::Identify { .. } | Command::GetLogPage { .. }
                ) && cqe.status.is_success()
                {
                    let mut bytes = vec![0u8; pool.length as usize];
                    if mr.read(0, &mut bytes).is_ok() {
                        let _ = self.pools[queue].write(&pool, 0, &bytes);
                    }
                }
                let _ = mr.deregister();
            }
            HostBuffer::Pool(_) | HostBuffer::None => {}
        }
        if !cqe.status.is_success() {
            self.counters.command_errors += 1;
        }
        match outstanding.owner {
            Owner::Io(tag) => self.finished_io.push_back(IoCompletion {
                queue: queue - 1,
                tag,
                status: cqe.status,
                latency_ns: self.now().saturating_sub(outstanding.submitted_ns),
            }),
            Owner::KeepAlive => {
                self.keep_alive_outstanding = false;
                if !cqe.status.is_success() {
                    rnic_diag::warn!(
                        rnic_diag::global(),
                        DIAG_KEEP_ALIVE,
                        status = %cqe.status,
                        "nvmf host: Keep Alive failed"
                    );
                }
            }
            Owner::AsyncEvent => {
                if cqe.status.is_success() {
                    self.counters.async_events += 1;
                    self.events.push(cqe.dw0);
                    let _ = self.submit_internal(0, Command::AsyncEventRequest, Owner::AsyncEvent);
                }
            }
            Owner::Blocking | Owner::Raw => self.finished_blocking.push(Finished {
                queue,
                cid: outstanding.cid,
                owner: outstanding.owner,
                cqe,
            }),
        }
    }

    fn timers(&mut self) -> usize {
        let now = self.now();
        let mut work = 0;
        if let Some(due) = self.next_keep_alive_ns {
            let admin_up = self.queues.first().is_some_and(Option::is_some);
            if now >= due && !self.keep_alive_outstanding && admin_up && self.failed.is_none() {
                if self.submit_internal(0, Command::KeepAlive, Owner::KeepAlive).is_ok() {
                    self.keep_alive_outstanding = true;
                    self.counters.keep_alives += 1;
                }
                self.next_keep_alive_ns = Some(now + u64::from(self.config.kato_ms) * 500_000);
                work += 1;
            }
        }
        let lost = self.queues.iter_mut().flatten().any(|q| q.connection.is_disconnected());
        if lost {
            self.connection_lost("the target disconnected".into());
            work += 1;
        }
        work
    }

    // ----- losing and restoring the connection -----------------------------------------

    fn connection_lost(&mut self, reason: String) {
        if self.recovering {
            // A failure during bring-up: the bring-up reports it.
            self.failed = Some(reason);
            return;
        }
        rnic_diag::warn!(
            rnic_diag::global(),
            DIAG_CONNECTION_LOST,
            %reason,
            "nvmf host: connection lost; reconnecting"
        );
        // Keep what the I/O callers wait for; the rest is dropped.
        let mut resend: Vec<(usize, Command, Data, u64)> = Vec::new();
        for (queue, q) in self.queues.iter_mut().enumerate() {
            let Some(q) = q.as_mut() else { continue };
            for outstanding in q.slots.iter_mut().filter_map(Option::take) {
                let buffer = match outstanding.buffer {
                    HostBuffer::Pool(b) => Some(b),
                    HostBuffer::Invalidating { pool, mr } => {
                        let _ = mr.deregister();
                        Some(pool)
                    }
                    HostBuffer::None => None,
                };
                if let Owner::Io(tag) = outstanding.owner {
                    let data = match (outstanding.command, buffer) {
                        (Command::Read(_), Some(b)) => Data::FromController(b, b.length),
                        (Command::Write(_) | Command::Compare(_), Some(b)) => Data::ToController(b, b.length),
                        _ => Data::None,
                    };
                    resend.push((queue, outstanding.command, data, tag));
                } else if let Some(b) = buffer {
                    if queue < self.pools.len() && !matches!(outstanding.owner, Owner::Blocking) {
                        self.pools[queue].free(b);
                    }
                }
            }
        }
        for q in self.queues.iter_mut().flatten() {
            q.connection.disconnect(&q.qp);
        }
        self.queues.clear();
        self.keep_alive_outstanding = false;
        self.epoch += 1;
        self.recovering = true;
        let mut last = reason;
        let mut restored = false;
        for attempt in 1..=self.config.reconnect_attempts {
            let until = self.now() + self.config.reconnect_delay_ns;
            while self.now() < until {
                self.reactor.idle(false);
            }
            self.failed = None;
            match self.establish() {
                Ok(()) => {
                    restored = true;
                    tracing::info!(attempt, "nvmf host: reconnected");
                    break;
                }
                Err(e) => {
                    last = e.to_string();
                    for q in self.queues.iter_mut().flatten() {
                        q.connection.disconnect(&q.qp);
                    }
                    self.queues.clear();
                }
            }
        }
        self.recovering = false;
        if !restored {
            self.failed = Some(format!("reconnection failed: {last}"));
            for (queue, command, _, tag) in resend {
                let _ = command;
                self.finished_io.push_back(IoCompletion {
                    queue: queue.saturating_sub(1),
                    tag,
                    status: Status::INTERNAL_PATH_ERROR,
                    latency_ns: 0,
                });
            }
            return;
        }
        self.counters.reconnects += 1;
        for (queue, command, data, tag) in resend {
            let target = if queue <= self.io_queue_count { queue } else { 1 };
            if self.submit_command(target, command, data, Owner::Io(tag)).is_ok() {
                self.counters.resubmitted += 1;
            } else {
                self.finished_io.push_back(IoCompletion {
                    queue: queue.saturating_sub(1),
                    tag,
                    status: Status::INTERNAL_PATH_ERROR,
                    latency_ns: 0,
                });
            }
        }
    }

    /// Shuts the controller down (CC.SHN, waiting briefly for CSTS.SHST) and
    /// disconnects every queue.
    ///
    /// # Errors
    /// Never for the disconnect itself; the shutdown is best effort.
    pub fn disconnect(mut self) -> Result<()> {
        self.shutdown_and_disconnect();
        Ok(())
    }

    fn shutdown_and_disconnect(&mut self) {
        if self.failed.is_none() && self.queues.first().is_some_and(Option::is_some) {
            let cc = Cc {
                shn: Shutdown::Normal,
                ..Cc::enabled()
            };
            let saved = self.config.command_timeout_ns;
            self.config.command_timeout_ns = saved.min(1_000_000_000);
            if self.property_set(offset::CC, u64::from(cc.to_u32())).is_ok() {
                let _ = self.wait_csts(|csts| csts.shst == ShutdownStatus::Complete);
            }
            self.config.command_timeout_ns = saved;
        }
        for q in self.queues.iter_mut().rev().flatten() {
            q.connection.disconnect(&q.qp);
        }
        // Let the disconnects reach the target before the QPs (and perhaps the process)
        // go: a target that never heard of them would take a new connection from a QP
        // number reused soon after for a stale one.
        let deadline = self.now() + DISCONNECT_WAIT_NS;
        while self.now() < deadline
            && !self
                .queues
                .iter_mut()
                .flatten()
                .all(|q| q.connection.disconnect_acknowledged())
        {
            self.reactor.idle(false);
        }
        self.queues.clear();
        self.failed = Some("disconnected".into());
    }

    /// Breaks every queue's connection without a shutdown, as a host that crashed or
    /// lost its link would (for tests of a target's keep-alive enforcement).
    pub fn vanish(mut self) {
        self.failed = Some("vanished".into());
        // Forget the queues without a disconnect: the QPs are destroyed, no DREQ goes out.
        for q in self.queues.drain(..).flatten() {
            std::mem::forget(q.connection);
            drop(q.qp);
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if self.failed.is_none() {
            self.shutdown_and_disconnect();
        }
    }
}

/// The data a [`Host`] keeps for one namespace, shareable with tests.
pub type SharedHost = Arc<std::sync::Mutex<Host>>;

#[cfg(test)]
mod tests {
    use super::queue::CID_SLOT_BITS;

    #[test]
    fn cids_carry_slot_and_generation() {
        assert_eq!(CID_SLOT_BITS, 10);
        let cid: u16 = 5 << CID_SLOT_BITS | 17;
        assert_eq!(usize::from(cid) & ((1 << CID_SLOT_BITS) - 1), 17);
    }
}
