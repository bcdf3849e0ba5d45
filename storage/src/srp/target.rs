//! The SRP target: logical units (a [`LunMap`]) served on RDMA channels that
//! initiators open through a [`Listener`] with an SRP login in the connection request.
//!
//! It is a poller ([`Target::poll`]): it accepts a login (SRP_LOGIN_RSP in the reply)
//! or refuses it (SRP_LOGIN_REJ in the reject, with the reason a Linux initiator
//! prints), takes IUs off its channels' completion queues, moves data-out with RDMA
//! READ (or takes it from the IU as immediate data), executes the SCSI command, moves
//! data-in with RDMA WRITE and answers with SRP_RSP, returning the command's credit.
//!
//! Every IU is hostile until checked. A malformed SRP_CMD is answered with CHECK
//! CONDITION, a command beyond the initiator's credits with BUSY, a command on an
//! unknown LUN with LOGICAL UNIT NOT SUPPORTED; IUs that cannot be answered (shorter
//! than a tag, unknown opcodes) are ignored, as Linux's `ib_srpt` does. Each is counted
//! in [`TargetCounters`] and logged under `rnic::diag`. Data-out reaches a block device
//! only when all of it arrived and every check passed; a descriptor the initiator's NIC
//! refuses (outside its registered memory) fails the RDMA READ or WRITE, which breaks
//! the channel (the RC QP goes to the error state), and nothing is written.
//!
//! Credits: the login grants `credits`; every SRP_CMD and SRP_TSK_MGMT takes one, every
//! SRP_RSP returns what has been freed since the last (1 for its own command, plus the
//! credits of commands a task management function aborted, which get no response of
//! their own).

use std::collections::VecDeque;

use rnic_verbs::{
    AccessFlags, CompletionQueue, Context, ProtectionDomain, QueuePair, RdmaFields, RecvWorkRequest, SendFlags,
    SendWorkRequest, Sge, WcStatus, WorkCompletion, WrOpcode,
};

use super::channel::{create_rc_qp, decode_wr_id, wr_id, WorkKind};
use super::wire::descriptor::{DataDescriptor, DirectDescriptor};
use super::wire::iu::{task_management_response, CmdRepr, IuRepr, ResidualCount, RspRepr, TLogoutRepr, TskMgmtRepr};
use super::wire::login::{
    LoginRejReason, LoginRejRepr, LoginReqRepr, LoginRspRepr, PortId, COMPACT_LOGIN_REQ_LEN, IMMEDIATE_SUPPORTED,
    LOGIN_REQ_LEN,
};
use super::wire::{buffer_format, opcode, Iu, TaskManagementFunction};
use crate::rdma::{AcceptParams, BufferPool, Connection, DataBuffer, IncomingRequest, Listener, Poller, SlotRegion};
use crate::scsi::cdb::Cdb;
use crate::scsi::lu::{DataDirection, LunMap, ScsiOutcome};
use crate::scsi::{decode_lun, status, SenseData};

/// How the target serves.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// The target port identifier initiators must log in to (id_ext ‖ GUID; LIO uses
    /// its service GUID for both halves).
    pub target_port_id: PortId,
    /// Credits a channel gets (request limit); also its receive queue depth.
    pub credits: u32,
    /// Largest initiator-to-target IU accepted, bytes (SRP_CMD with its descriptors and
    /// immediate data).
    pub max_it_iu_len: u32,
    /// Largest target-to-initiator IU sent, bytes (SRP_RSP with sense).
    pub max_ti_iu_len: u32,
    /// Serve immediate data (SRP-2).
    pub immediate_data: bool,
    /// Most direct descriptors one command may use.
    pub max_descriptors: usize,
    /// Bytes of data buffers per channel (at least one maximum transfer).
    pub data_pool_bytes: usize,
    /// Channels one I_T nexus may have.
    pub max_channels_per_nexus: usize,
    /// Channels in all.
    pub max_channels: usize,
}

impl Default for TargetConfig {
    fn default() -> Self {
        Self {
            target_port_id: PortId::new(0x0002_524E_4943_0001, 0x0002_524E_4943_0001),
            credits: 128,
            max_it_iu_len: 68 + 8192 + 64,
            max_ti_iu_len: 256,
            immediate_data: true,
            max_descriptors: 128,
            data_pool_bytes: 8 << 20,
            max_channels_per_nexus: 8,
            max_channels: 64,
        }
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
    /// Logins accepted (channels opened).
    pub logins_accepted: u64,
    /// Logins refused with SRP_LOGIN_REJ.
    pub logins_rejected: u64,
    /// Of those, for a wrong target port identifier.
    pub logins_wrong_port: u64,
    /// Channels terminated because a single-channel login replaced them.
    pub channels_replaced: u64,
    /// IUs received.
    pub ius_received: u64,
    /// SRP_CMDs executed with GOOD status.
    pub commands_good: u64,
    /// SRP_CMDs answered with another status.
    pub commands_failed: u64,
    /// IUs that did not parse (or were too short to answer), and commands with
    /// malformed descriptors.
    pub malformed_ius: u64,
    /// IUs of a type a target does not take (ignored).
    pub unexpected_ius: u64,
    /// Commands or task management requests sent without a credit (answered BUSY).
    pub credit_overruns: u64,
    /// Commands naming a LUN that does not exist.
    pub unknown_lun_commands: u64,
    /// Task management requests.
    pub task_management: u64,
    /// Commands aborted by task management.
    pub commands_aborted: u64,
    /// Work requests that failed (remote access errors, transport errors).
    pub rdma_errors: u64,
    /// Data-in bytes sent.
    pub bytes_to_initiators: u64,
    /// Data-out bytes received.
    pub bytes_from_initiators: u64,
    /// Channels closed (by either side, or broken).
    pub channels_closed: u64,
    /// SRP_I_LOGOUTs received.
    pub initiator_logouts: u64,
    /// SRP_T_LOGOUTs sent.
    pub target_logouts: u64,
}

/// Polls between two looks at the connections' state.
const HOUSEKEEPING_POLLS: u32 = 64;
/// Work completions taken per CQ poll.
const POLL_BATCH: usize = 32;
/// Receive buffers beyond the credits: room to see, and answer, an initiator that
/// overruns its credits instead of stalling it in receiver-not-ready.
const OVERRUN_SLACK: u32 = 8;

/// Where a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Needs a data buffer from the pool.
    WaitingForBuffer,
    /// Has its buffer; waits for RDMA READ credits.
    WaitingForRead,
    /// RDMA READs outstanding.
    Reading { remaining: u32 },
    /// Data (if any) here: can execute.
    Ready,
    /// Its SRP_RSP is posted.
    Responding,
}

/// A command the target is working on.
#[derive(Debug, Clone)]
struct Request {
    tag: u64,
    lun: Option<u16>,
    cdb: Cdb,
    direction: DataDirection,
    /// Where data goes to / comes from in the initiator's memory.
    descriptors: Vec<DirectDescriptor>,
    /// Bytes the descriptors describe.
    descriptor_len: u64,
    /// Data-out that came as immediate data.
    immediate: Option<Vec<u8>>,
    /// Bytes moved through the pool buffer (data-out fetched, or data-in at most).
    transfer_len: u32,
    buffer: Option<DataBuffer>,
    stage: Stage,
    /// Aborted while its RDMA READs were in flight: dropped when they complete.
    aborted: bool,
    /// Send-queue entries its posted work requests hold.
    send_entries: u32,
}

/// A request slot.
#[derive(Debug, Clone)]
enum Slot {
    Free,
    Busy(Box<Request>),
    /// An answer without data (task management, refused commands) is being sent.
    Answering,
}

/// Where a channel is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChannelState {
    Live,
    /// SRP_T_LOGOUT posted; disconnect when it completed.
    LoggingOut,
}

/// One RDMA channel.
struct Channel {
    // Field order is drop order: the QP goes before its CQ and the memory it used.
    qp: QueuePair,
    cq: CompletionQueue,
    connection: Box<dyn Connection>,
    receives: SlotRegion,
    /// One send buffer per request slot, plus one for SRP_T_LOGOUT.
    sends: SlotRegion,
    pool: BufferPool,
    initiator_port_id: PortId,
    target_port_id: PortId,
    /// Where immediate data starts in an SRP_CMD, if negotiated.
    immediate_offset: Option<usize>,
    /// Credits the initiator holds.
    credits: u32,
    /// Credits freed and not yet returned.
    credits_to_return: u32,
    initiator_depth: u32,
    reads_outstanding: u32,
    send_depth: u32,
    send_used: u32,
    slots: Vec<Slot>,
    waiting: VecDeque<usize>,
    ready: VecDeque<usize>,
    state: ChannelState,
    peer: String,
    completions: Vec<WorkCompletion>,
}

impl Channel {
    fn post_receive(&self, slot: usize) -> Result<(), rnic_verbs::PostError> {
        let sge = [self.receives.sge(slot, self.receives.slot_size())];
        self.qp.post_recv(&[RecvWorkRequest {
            wr_id: wr_id(WorkKind::Receive, slot),
            sg_list: &sge,
        }])
    }

    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| matches!(s, Slot::Free))
    }

    /// Takes back the credits to return.
    fn take_delta(&mut self) -> u32 {
        let delta = self.credits_to_return;
        self.credits_to_return = 0;
        self.credits += delta;
        delta
    }
}

/// The SRP target.
pub struct Target {
    context: Context,
    pd: ProtectionDomain,
    listener: Box<dyn Listener>,
    config: TargetConfig,
    luns: LunMap,
    channels: Vec<Option<Channel>>,
    counters: TargetCounters,
    polls: u32,
    scratch: Vec<u8>,
    data_in: Vec<u8>,
    diagnostics: rnic_diag::Limiter,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("listen", &self.listener.address())
            .field("luns", &self.luns.luns())
            .field("channels", &self.channel_count())
            .finish()
    }
}

/// The outcome of a command, before it is sent.
struct Answer {
    status: u8,
    sense: Option<SenseData>,
    data_out_residual: ResidualCount,
    data_in_residual: ResidualCount,
    /// Data-in bytes to RDMA WRITE from the request's buffer.
    data_in_len: u32,
}

impl Answer {
    fn check_condition(sense: SenseData) -> Self {
        Self {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
            data_out_residual: ResidualCount::None,
            data_in_residual: ResidualCount::None,
            data_in_len: 0,
        }
    }
}

impl Target {
    /// A target on `context` taking logins from `listener` and serving `luns`.
    ///
    /// # Errors
    /// [`TargetError::Config`] for no LUNs, credits outside 2..=4096, IU lengths below
    /// what SRP needs, a pool smaller than one maximum transfer; verbs failures.
    pub fn new(
        context: Context,
        listener: Box<dyn Listener>,
        config: TargetConfig,
        luns: LunMap,
    ) -> Result<Self, TargetError> {
        if luns.is_empty() {
            return Err(TargetError::Config("no logical units".into()));
        }
        if !(2..=4096).contains(&config.credits) {
            return Err(TargetError::Config(format!("{} credits: 2..=4096", config.credits)));
        }
        if config.max_it_iu_len < 64 || config.max_ti_iu_len < 64 {
            return Err(TargetError::Config(format!(
                "IU lengths {}/{}: at least 64 bytes",
                config.max_it_iu_len, config.max_ti_iu_len
            )));
        }
        if config.data_pool_bytes < luns.max_transfer_bytes() as usize || config.max_descriptors == 0 {
            return Err(TargetError::Config(format!(
                "a data pool of {} bytes holds less than one {}-byte transfer",
                config.data_pool_bytes,
                luns.max_transfer_bytes()
            )));
        }
        let pd = context.alloc_pd()?;
        Ok(Self {
            context,
            pd,
            listener,
            config,
            luns,
            channels: Vec::new(),
            counters: TargetCounters::default(),
            polls: 0,
            scratch: Vec::new(),
            data_in: Vec::new(),
            diagnostics: rnic_diag::Limiter::new(rnic_diag::Policy::DEFAULT),
        })
    }

    /// What the target saw and did so far.
    pub fn counters(&self) -> &TargetCounters {
        &self.counters
    }

    /// The logical units.
    pub fn luns(&self) -> &LunMap {
        &self.luns
    }

    /// Open channels.
    pub fn channel_count(&self) -> usize {
        self.channels.iter().flatten().count()
    }

    /// The diagnostics counted so far, by kind (`srp-target/…`).
    pub fn diagnostics(&self) -> &rnic_diag::Limiter {
        &self.diagnostics
    }

    /// Logs every channel out: SRP_T_LOGOUT (reason 8, shutdown), then a disconnect
    /// once it was sent.
    pub fn logout_all(&mut self) {
        for c in 0..self.channels.len() {
            self.logout(c, 8);
        }
    }

    /// Closes every channel at once.
    pub fn shutdown(&mut self) {
        for c in 0..self.channels.len() {
            self.close(c, "target shutting down");
        }
    }

    /// Does what can be done now; returns how much.
    pub fn poll(&mut self) -> usize {
        let mut work = 0;
        while let Some(request) = self.listener.poll_request() {
            self.handle_login(request);
            work += 1;
        }
        for c in 0..self.channels.len() {
            work += self.poll_channel(c);
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(HOUSEKEEPING_POLLS) {
            for c in 0..self.channels.len() {
                let gone = self.channels[c]
                    .as_mut()
                    .is_some_and(|ch| ch.connection.is_disconnected());
                if gone {
                    self.close(c, "the initiator disconnected");
                    work += 1;
                }
            }
        }
        work
    }

    /// Counts a diagnostic of kind `srp-target/name` and logs it while its kind is not
    /// quiet, so a hostile initiator cannot flood the log.
    fn diag(&mut self, name: &'static str, message: impl FnOnce() -> String) {
        let kind = rnic_diag::Kind::new("srp-target", name);
        if self.diagnostics.admit(kind) {
            tracing::warn!(target: rnic_diag::TARGET, kind = %kind, "srp target: {}", message());
        }
    }

    // ----- login ---------------------------------------------------------------------

    fn handle_login(&mut self, request: Box<dyn IncomingRequest>) {
        let peer = request.peer();
        let private = request.private_data();
        // Over RDMA-CM the login is the 56-byte compact form; a 64-byte SRP_LOGIN_REQ
        // (InfiniBand CM) is taken too. They differ where the compact form has the IT IU
        // length (bytes 12..16), which are reserved zeroes in the full form.
        let full = private.len() >= LOGIN_REQ_LEN && private[0] == opcode::LOGIN_REQ && private[12..16] == [0; 4];
        let parsed = if full || private.len() < COMPACT_LOGIN_REQ_LEN {
            LoginReqRepr::parse(private)
        } else {
            LoginReqRepr::parse_compact(private)
        };
        let login = match parsed {
            Ok(login) => login,
            Err(e) => {
                let tag = private
                    .get(..8)
                    .map_or(0, |t| u64::from_be_bytes(t.try_into().unwrap_or([0; 8])));
                return self.reject(request, tag, LoginRejReason::UnableToEstablish, format!("login: {e}"));
            }
        };
        let tag = login.tag;
        if login.target_port_id != self.config.target_port_id {
            self.counters.logins_wrong_port += 1;
            let wanted = self.config.target_port_id;
            return self.reject(
                request,
                tag,
                LoginRejReason::UnableToAssociate,
                format!("target port ID {} is not this target's {wanted}", login.target_port_id),
            );
        }
        if login.req_it_iu_len < 64 || login.req_it_iu_len > self.config.max_it_iu_len {
            let most = self.config.max_it_iu_len;
            return self.reject(
                request,
                tag,
                LoginRejReason::ItIuLengthTooLarge,
                format!("IT IU length {} (64..={most})", login.req_it_iu_len),
            );
        }
        let supported = buffer_format::DIRECT | buffer_format::INDIRECT;
        if login.req_buf_fmt & !supported != 0 {
            return self.reject(
                request,
                tag,
                LoginRejReason::UnsupportedDescriptorFormat,
                format!("buffer formats {:#06x}", login.req_buf_fmt),
            );
        }
        let nexus: Vec<usize> = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(c, ch)| {
                ch.as_ref()
                    .filter(|ch| {
                        ch.initiator_port_id == login.initiator_port_id && ch.target_port_id == login.target_port_id
                    })
                    .map(|_| c)
            })
            .collect();
        let nexus_full = login.multichannel() && nexus.len() >= self.config.max_channels_per_nexus;
        let target_full =
            self.channel_count() >= self.config.max_channels && (login.multichannel() || nexus.is_empty());
        if nexus_full || target_full {
            return self.reject(
                request,
                tag,
                LoginRejReason::ChannelLimitReached,
                format!(
                    "{} channels of this nexus, {} in all",
                    nexus.len(),
                    self.channel_count()
                ),
            );
        }
        if request.responder_resources() == 0 {
            return self.reject(
                request,
                tag,
                LoginRejReason::InsufficientResources,
                "no responder resources: the target could not read data-out".into(),
            );
        }
        let immediate_offset = (self.config.immediate_data
            && login.immediate_requested()
            && usize::from(login.imm_data_offset) >= 48 + 4
            && u32::from(login.imm_data_offset) < login.req_it_iu_len)
            .then_some(usize::from(login.imm_data_offset));
        let device = self.context.query_device();
        let initiator_depth = u32::from(request.responder_resources())
            .min(device.max_qp_init_rd_atom)
            .clamp(1, 16);
        let receive_count = self.config.credits + OVERRUN_SLACK;
        let slot_count = receive_count as usize;
        let send_depth = (slot_count as u32 * 4 + 8).min(device.max_qp_wr.max(64));
        let created = create_rc_qp(&self.context, &self.pd, send_depth, receive_count).and_then(|(qp, cq)| {
            let receives = SlotRegion::new(
                &self.pd,
                slot_count,
                login.req_it_iu_len as usize,
                AccessFlags::LOCAL_WRITE,
            )?;
            let sends = SlotRegion::new(
                &self.pd,
                slot_count + 1,
                self.config.max_ti_iu_len as usize,
                AccessFlags::LOCAL_WRITE,
            )?;
            let pool = BufferPool::new(&self.pd, self.config.data_pool_bytes, 4096, AccessFlags::LOCAL_WRITE)?;
            Ok((qp, cq, receives, sends, pool))
        });
        let (qp, cq, receives, sends, pool) = match created {
            Ok(parts) => parts,
            Err(e) => {
                return self.reject(request, tag, LoginRejReason::InsufficientResources, e.to_string());
            }
        };
        // Single-channel logins replace the nexus's channels (SRP: "terminate").
        let rsp_flags = match (nexus.is_empty(), login.multichannel()) {
            (true, _) => 0,
            (false, false) => {
                for &c in &nexus {
                    self.counters.channels_replaced += 1;
                    self.logout(c, 4);
                }
                1
            }
            (false, true) => 2,
        } | if immediate_offset.is_some() {
            IMMEDIATE_SUPPORTED
        } else {
            0
        };
        let reply = LoginRspRepr {
            req_lim_delta: self.config.credits,
            tag,
            max_it_iu_len: login.req_it_iu_len,
            max_ti_iu_len: self.config.max_ti_iu_len,
            buf_fmt: supported,
            rsp_flags,
        };
        let mut channel = Channel {
            qp,
            cq,
            connection: Box::new(NotConnected),
            receives,
            sends,
            pool,
            initiator_port_id: login.initiator_port_id,
            target_port_id: login.target_port_id,
            immediate_offset,
            credits: self.config.credits,
            credits_to_return: 0,
            initiator_depth,
            reads_outstanding: 0,
            send_depth,
            send_used: 0,
            slots: vec![Slot::Free; slot_count],
            waiting: VecDeque::new(),
            ready: VecDeque::new(),
            state: ChannelState::Live,
            peer: format!("{peer} ({})", login.initiator_port_id),
            completions: vec![WorkCompletion::default(); POLL_BATCH],
        };
        let accept = AcceptParams {
            private_data: reply.to_bytes().to_vec(),
            // ib_srpt answers with 4 and 4.
            responder_resources: 4,
            initiator_depth: initiator_depth as u8,
            rnr_retry_count: 7,
        };
        channel.connection = match request.accept(&self.context, &channel.qp, &accept) {
            Ok(connection) => connection,
            Err(e) => {
                self.counters.logins_rejected += 1;
                self.diag("accept", || format!("accepting the login of {peer} failed: {e}"));
                return;
            }
        };
        // Receives go up as soon as the QP left RESET (the accept moved it to RTS),
        // before this poll returns and before the initiator can have sent anything.
        for slot in 0..slot_count {
            if let Err(e) = channel.post_receive(slot) {
                self.counters.logins_rejected += 1;
                let peer = channel.peer.clone();
                self.diag("accept", || format!("posting receives for {peer}: {e}"));
                channel.connection.disconnect(&channel.qp);
                return;
            }
        }
        self.counters.logins_accepted += 1;
        tracing::info!(peer = %channel.peer, credits = self.config.credits, immediate = ?immediate_offset,
            "srp target: login accepted");
        match self.channels.iter().position(Option::is_none) {
            Some(free) => self.channels[free] = Some(channel),
            None => self.channels.push(Some(channel)),
        }
    }

    fn reject(&mut self, request: Box<dyn IncomingRequest>, tag: u64, reason: LoginRejReason, why: String) {
        self.counters.logins_rejected += 1;
        let peer = request.peer();
        self.diag("login-reject", || {
            format!("refused the login of {peer}: {reason}: {why}")
        });
        let rej = LoginRejRepr {
            reason,
            tag,
            buf_fmt: buffer_format::DIRECT | buffer_format::INDIRECT,
        };
        request.reject(&rej.to_bytes());
    }

    // ----- the data path -----------------------------------------------------------

    fn poll_channel(&mut self, c: usize) -> usize {
        let Some(channel) = self.channels[c].as_mut() else {
            return 0;
        };
        let mut completions = std::mem::take(&mut channel.completions);
        let count = match channel.cq.poll(&mut completions) {
            Ok(n) => n,
            Err(e) => {
                let peer = channel.peer.clone();
                channel.completions = completions;
                self.diag("cq", || format!("polling the CQ of {peer}: {e}"));
                self.close(c, "CQ poll failed");
                return 1;
            }
        };
        for wc in &completions[..count] {
            if self.channels[c].is_none() {
                break;
            }
            self.handle_completion(c, wc);
        }
        let Some(channel) = self.channels[c].as_mut() else {
            return count;
        };
        channel.completions = completions;
        count + self.start_waiting(c) + self.execute_ready(c)
    }

    fn handle_completion(&mut self, c: usize, wc: &WorkCompletion) {
        let Some((kind, index)) = decode_wr_id(wc.wr_id) else {
            return;
        };
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                self.counters.rdma_errors += 1;
                let peer = self.channels[c].as_ref().map(|ch| ch.peer.clone()).unwrap_or_default();
                self.diag("rdma-error", || {
                    format!(
                        "{kind:?} #{index} on the channel of {peer} failed: {:?} (vendor {:#x}); closing the channel",
                        wc.status, wc.vendor_err
                    )
                });
            }
            return self.close(c, "a work request failed");
        }
        match kind {
            WorkKind::Receive => self.handle_iu(c, index, wc.byte_len as usize),
            WorkKind::ReadData => self.read_done(c, index),
            WorkKind::Send => self.send_done(c, index),
            WorkKind::WriteData => {}
        }
    }

    fn read_done(&mut self, c: usize, index: usize) {
        let channel = self.channels[c].as_mut().expect("present");
        channel.reads_outstanding = channel.reads_outstanding.saturating_sub(1);
        channel.send_used = channel.send_used.saturating_sub(1);
        let Some(Slot::Busy(request)) = channel.slots.get_mut(index) else {
            return;
        };
        request.send_entries = request.send_entries.saturating_sub(1);
        if let Stage::Reading { remaining } = request.stage {
            if remaining > 1 {
                request.stage = Stage::Reading {
                    remaining: remaining - 1,
                };
            } else if request.aborted {
                if let Some(buffer) = request.buffer.take() {
                    channel.pool.free(buffer);
                }
                channel.slots[index] = Slot::Free;
            } else {
                request.stage = Stage::Ready;
                channel.ready.push_back(index);
            }
        }
    }

    fn send_done(&mut self, c: usize, index: usize) {
        let channel = self.channels[c].as_mut().expect("present");
        if index >= channel.slots.len() {
            // The SRP_T_LOGOUT went out.
            channel.send_used = channel.send_used.saturating_sub(1);
            if channel.state == ChannelState::LoggingOut {
                self.close(c, "logged out by the target");
            }
            return;
        }
        match std::mem::replace(&mut channel.slots[index], Slot::Free) {
            Slot::Busy(request) => {
                channel.send_used = channel.send_used.saturating_sub(request.send_entries);
                if let Some(buffer) = request.buffer {
                    channel.pool.free(buffer);
                }
            }
            Slot::Answering => channel.send_used = channel.send_used.saturating_sub(1),
            Slot::Free => {}
        }
    }

    /// An IU arrived in receive `slot`.
    fn handle_iu(&mut self, c: usize, slot: usize, length: usize) {
        self.counters.ius_received += 1;
        let channel = self.channels[c].as_mut().expect("present");
        let length = length.min(channel.receives.slot_size());
        let mut iu = std::mem::take(&mut self.scratch);
        iu.resize(length, 0);
        let read = channel.receives.read(slot, &mut iu);
        // The IU is copied out: the buffer goes back at once.
        let reposted = channel.post_receive(slot);
        if let Err(e) = read.map_err(|e| e.to_string()).and(reposted.map_err(|e| e.to_string())) {
            let peer = channel.peer.clone();
            self.scratch = iu;
            self.diag("receive", || format!("receive buffer of {peer}: {e}"));
            return self.close(c, "receive buffer failed");
        }
        if channel.state != ChannelState::Live {
            self.scratch = iu;
            return;
        }
        let Ok(view) = Iu::new_checked(&iu[..]) else {
            self.counters.malformed_ius += 1;
            let peer = channel.peer.clone();
            self.scratch = iu;
            return self.diag("malformed-iu", || {
                format!("{length}-byte IU from {peer}: shorter than an IU header; ignored")
            });
        };
        let (op, tag) = (view.opcode(), view.tag());
        match op {
            opcode::CMD => self.handle_cmd(c, &iu, tag),
            opcode::TSK_MGMT => match TskMgmtRepr::parse(&iu) {
                Ok(tsk) => self.handle_task_management(c, &tsk),
                Err(e) => {
                    self.counters.malformed_ius += 1;
                    let peer = channel.peer.clone();
                    self.diag("malformed-iu", || format!("SRP_TSK_MGMT from {peer}: {e}; ignored"));
                }
            },
            opcode::I_LOGOUT => {
                self.counters.initiator_logouts += 1;
                self.close(c, "the initiator logged out");
            }
            opcode::CRED_RSP | opcode::AER_RSP => {}
            other => {
                self.counters.unexpected_ius += 1;
                let peer = channel.peer.clone();
                self.diag("unexpected-iu", || {
                    format!(
                        "{} ({other:#04x}) from {peer} is not an initiator IU; ignored",
                        opcode::name(other)
                    )
                });
            }
        }
        self.scratch = iu;
    }

    /// Takes a credit for a command or task management request; `false` on an overrun.
    fn take_credit(&mut self, c: usize, what: &str, tag: u64) -> bool {
        let channel = self.channels[c].as_mut().expect("present");
        if channel.credits > 0 {
            channel.credits -= 1;
            return true;
        }
        self.counters.credit_overruns += 1;
        let peer = channel.peer.clone();
        self.diag("credit-overrun", || {
            format!("{what} (tag {tag:#x}) from {peer} without a credit; answered BUSY")
        });
        false
    }

    fn handle_cmd(&mut self, c: usize, iu: &[u8], tag: u64) {
        let credited = self.take_credit(c, "SRP_CMD", tag);
        let channel = self.channels[c].as_mut().expect("present");
        let Some(index) = channel.free_slot() else {
            let peer = channel.peer.clone();
            self.diag("no-request-slot", || {
                format!("{peer} has more commands outstanding than the target holds")
            });
            return self.close(c, "request slots exhausted");
        };
        if !credited {
            self.channels[c].as_mut().expect("present").slots[index] = Slot::Answering;
            let busy = Answer {
                status: status::BUSY,
                sense: None,
                ..Answer::check_condition(SenseData::NONE)
            };
            return self.answer(c, index, tag, busy, false);
        }
        let cmd = match CmdRepr::parse(iu) {
            Ok(cmd) => cmd,
            Err(e) => {
                self.counters.malformed_ius += 1;
                let peer = self.channels[c].as_ref().expect("present").peer.clone();
                self.diag("malformed-iu", || format!("SRP_CMD (tag {tag:#x}) from {peer}: {e}"));
                self.channels[c].as_mut().expect("present").slots[index] = Slot::Answering;
                return self.answer(
                    c,
                    index,
                    tag,
                    Answer::check_condition(SenseData::INVALID_FIELD_IN_CDB),
                    true,
                );
            }
        };
        let lun = decode_lun(cmd.lun);
        if lun.is_none_or(|l| self.luns.get(l).is_none()) {
            self.counters.unknown_lun_commands += 1;
        }
        let cdb = Cdb::parse(&cmd.cdb).unwrap_or(Cdb::Unsupported {
            opcode: cmd.cdb[0],
            service_action: 0,
        });
        let direction = match self.luns.plan(lun, &cdb) {
            Ok(direction) => direction,
            Err(sense) => {
                let channel = self.channels[c].as_mut().expect("present");
                channel.slots[index] = Slot::Answering;
                return self.answer(c, index, tag, Answer::check_condition(sense), true);
            }
        };
        match self.prepare(c, &cmd, iu, direction) {
            Ok((descriptors, descriptor_len, immediate, transfer_len)) => {
                let channel = self.channels[c].as_mut().expect("present");
                let needs_buffer = transfer_len > 0 && immediate.is_none();
                let stage = if needs_buffer {
                    Stage::WaitingForBuffer
                } else {
                    Stage::Ready
                };
                channel.slots[index] = Slot::Busy(Box::new(Request {
                    tag,
                    lun,
                    cdb,
                    direction,
                    descriptors,
                    descriptor_len,
                    immediate,
                    transfer_len,
                    buffer: None,
                    stage,
                    aborted: false,
                    send_entries: 0,
                }));
                if needs_buffer {
                    channel.waiting.push_back(index);
                } else {
                    channel.ready.push_back(index);
                }
            }
            Err(answer) => {
                let channel = self.channels[c].as_mut().expect("present");
                channel.slots[index] = Slot::Answering;
                self.answer(c, index, tag, answer, true);
            }
        }
    }

    /// Checks a command's descriptors against its data direction; returns the direct
    /// descriptors, the bytes they describe, immediate data, and the bytes to move
    /// through a pool buffer.
    #[allow(clippy::type_complexity)]
    fn prepare(
        &mut self,
        c: usize,
        cmd: &CmdRepr,
        iu: &[u8],
        direction: DataDirection,
    ) -> Result<(Vec<DirectDescriptor>, u64, Option<Vec<u8>>, u32), Answer> {
        let channel = self.channels[c].as_ref().expect("present");
        let peer = channel.peer.clone();
        let immediate_offset = channel.immediate_offset;
        let max_descriptors = self.config.max_descriptors;
        let malformed = |target: &mut Self, why: String| {
            target.counters.malformed_ius += 1;
            target.diag("malformed-iu", || {
                format!("SRP_CMD (tag {:#x}) from {peer}: {why}", cmd.tag)
            });
            Answer::check_condition(SenseData::INVALID_FIELD_IN_CDB)
        };
        if cmd.data_out != DataDescriptor::None && cmd.data_in != DataDescriptor::None {
            return Err(malformed(self, "bidirectional commands are not served".into()));
        }
        let (descriptor, is_out) = match direction {
            DataDirection::Out(_) => (&cmd.data_out, true),
            _ => (&cmd.data_in, false),
        };
        let other = if is_out { &cmd.data_in } else { &cmd.data_out };
        if *other != DataDescriptor::None {
            return Err(malformed(
                self,
                format!(
                    "a {:?} descriptor for the direction the CDB does not move",
                    other.format()
                ),
            ));
        }
        let (descriptors, immediate): (Vec<DirectDescriptor>, Option<Vec<u8>>) = match descriptor {
            DataDescriptor::None => (Vec::new(), None),
            DataDescriptor::Direct(d) => (vec![*d], None),
            DataDescriptor::Indirect { list, total_len, .. } => {
                if descriptor.is_external() {
                    // The rest of the table would have to be fetched from initiator
                    // memory; ib_srp never needs it with its defaults.
                    return Err(malformed(self, "an external descriptor table is not served".into()));
                }
                if list.len() > max_descriptors {
                    return Err(malformed(
                        self,
                        format!("{} descriptors (at most {max_descriptors})", list.len()),
                    ));
                }
                let sum: u64 = list.iter().map(|d| u64::from(d.len)).sum();
                if sum != u64::from(*total_len) {
                    return Err(malformed(
                        self,
                        format!("indirect table: total length {total_len} but entries sum to {sum}"),
                    ));
                }
                (list.clone(), None)
            }
            DataDescriptor::Immediate { .. } => {
                let Some(offset) = immediate_offset else {
                    return Err(malformed(self, "immediate data was not negotiated".into()));
                };
                match cmd.immediate_data(iu, offset) {
                    Ok(data) => (Vec::new(), Some(data.to_vec())),
                    Err(e) => return Err(malformed(self, e.to_string())),
                }
            }
        };
        let descriptor_len = match &immediate {
            Some(data) => data.len() as u64,
            None => descriptors.iter().map(|d| u64::from(d.len)).sum(),
        };
        let transfer_len = match direction {
            DataDirection::None => 0,
            DataDirection::In(wanted) => u64::from(wanted).min(descriptor_len),
            DataDirection::Out(needed) => {
                if descriptor_len < u64::from(needed) {
                    // The command needs more data than the initiator described: it
                    // cannot complete, and nothing is written.
                    let mut answer = Answer::check_condition(SenseData::INVALID_FIELD_IN_CDB);
                    answer.data_out_residual = ResidualCount::Overflow(needed - descriptor_len as u32);
                    return Err(answer);
                }
                u64::from(needed)
            }
        };
        if transfer_len > self.channels[c].as_ref().expect("present").pool.capacity() {
            return Err(malformed(
                self,
                format!("{transfer_len} bytes exceed the channel's data buffers"),
            ));
        }
        let immediate = immediate.map(|mut data| {
            data.truncate(transfer_len as usize);
            data
        });
        Ok((descriptors, descriptor_len, immediate, transfer_len as u32))
    }

    /// Gives buffers and RDMA READs to waiting commands, oldest first.
    fn start_waiting(&mut self, c: usize) -> usize {
        let mut work = 0;
        loop {
            let channel = self.channels[c].as_mut().expect("present");
            let Some(&index) = channel.waiting.front() else {
                return work;
            };
            let Some(Slot::Busy(request)) = channel.slots.get_mut(index) else {
                channel.waiting.pop_front();
                continue;
            };
            if request.stage == Stage::WaitingForBuffer {
                let Some(buffer) = channel.pool.allocate(request.transfer_len) else {
                    return work;
                };
                request.buffer = Some(buffer);
                if matches!(request.direction, DataDirection::Out(_)) {
                    request.stage = Stage::WaitingForRead;
                } else {
                    request.stage = Stage::Ready;
                    channel.waiting.pop_front();
                    channel.ready.push_back(index);
                    work += 1;
                    continue;
                }
            }
            // Post the command's RDMA READs when the initiator depth and the send queue
            // have room for all of them.
            let reads = read_plan(&request.descriptors, request.transfer_len);
            let n = reads.len() as u32;
            if channel.reads_outstanding > 0 && channel.reads_outstanding + n > channel.initiator_depth
                || channel.send_used + n > channel.send_depth
            {
                return work;
            }
            let buffer = request.buffer.expect("allocated");
            let base = channel.pool.address(&buffer);
            let lkey = channel.pool.mr().lkey();
            let sges: Vec<[Sge; 1]> = reads
                .iter()
                .map(|(offset, _, len)| [Sge::new(base + u64::from(*offset), *len, lkey)])
                .collect();
            let wrs: Vec<SendWorkRequest<'_>> = reads
                .iter()
                .zip(&sges)
                .map(|((_, d, _), sge)| SendWorkRequest {
                    wr_id: wr_id(WorkKind::ReadData, index),
                    opcode: WrOpcode::RdmaRead,
                    sg_list: sge,
                    send_flags: SendFlags::SIGNALED,
                    rdma: RdmaFields {
                        remote_addr: d.va,
                        rkey: d.key,
                    },
                    ..Default::default()
                })
                .collect();
            if let Err(e) = channel.qp.post_send(&wrs) {
                let peer = channel.peer.clone();
                self.diag("post", || format!("posting RDMA READs for {peer}: {e}"));
                self.close(c, "RDMA READ post failed");
                return work;
            }
            channel.reads_outstanding += n;
            channel.send_used += n;
            request.send_entries += n;
            request.stage = Stage::Reading { remaining: n };
            channel.waiting.pop_front();
            work += 1;
        }
    }

    fn execute_ready(&mut self, c: usize) -> usize {
        let mut work = 0;
        loop {
            let Some(channel) = self.channels[c].as_mut() else {
                return work;
            };
            let Some(&index) = channel.ready.front() else {
                return work;
            };
            // Room for the data-in WRITEs and the SEND.
            let writes = match channel.slots.get(index) {
                Some(Slot::Busy(r)) if r.stage == Stage::Ready => r.descriptors.len() as u32,
                _ => {
                    channel.ready.pop_front();
                    continue;
                }
            };
            if channel.send_used + writes + 1 > channel.send_depth {
                return work;
            }
            channel.ready.pop_front();
            self.execute(c, index);
            work += 1;
        }
    }

    fn execute(&mut self, c: usize, index: usize) {
        let channel = self.channels[c].as_mut().expect("present");
        let Slot::Busy(request) = &channel.slots[index] else {
            return;
        };
        let request = request.clone();
        let mut data_out = Vec::new();
        if let DataDirection::Out(_) = request.direction {
            if let Some(data) = &request.immediate {
                data_out.clone_from(data);
            } else if let Some(buffer) = &request.buffer {
                data_out.resize(request.transfer_len as usize, 0);
                if let Err(e) = channel.pool.read(buffer, 0, &mut data_out) {
                    let peer = channel.peer.clone();
                    self.diag("buffer", || format!("data-out buffer of {peer}: {e}"));
                    return self.close(c, "data buffer unreadable");
                }
            }
            self.counters.bytes_from_initiators += data_out.len() as u64;
        }
        let mut data_in = std::mem::take(&mut self.data_in);
        let outcome: ScsiOutcome = self.luns.execute(request.lun, &request.cdb, &data_out, &mut data_in);
        let mut answer = Answer {
            status: outcome.status,
            sense: outcome.sense,
            data_out_residual: ResidualCount::None,
            data_in_residual: ResidualCount::None,
            data_in_len: 0,
        };
        match request.direction {
            DataDirection::In(allocation) => {
                // What the command produced, clipped to its allocation length, then to
                // what the initiator described.
                let produced = (data_in.len() as u64).min(u64::from(allocation));
                let sent = produced.min(u64::from(request.transfer_len));
                answer.data_in_len = sent as u32;
                answer.data_in_residual = residual(request.descriptor_len, produced);
                if sent > 0 {
                    let channel = self.channels[c].as_ref().expect("present");
                    let buffer = request.buffer.expect("data-in has a buffer");
                    if let Err(e) = channel.pool.write(&buffer, 0, &data_in[..sent as usize]) {
                        let peer = channel.peer.clone();
                        self.data_in = data_in;
                        self.diag("buffer", || format!("data-in buffer of {peer}: {e}"));
                        return self.close(c, "data buffer unwritable");
                    }
                }
                self.counters.bytes_to_initiators += sent;
            }
            DataDirection::Out(needed) => {
                answer.data_out_residual = residual(request.descriptor_len, u64::from(needed));
            }
            DataDirection::None => {
                answer.data_out_residual = residual(request.descriptor_len, 0);
            }
        }
        self.data_in = data_in;
        self.answer(c, index, request.tag, answer, true);
    }

    /// Sends the SRP_RSP of request slot `index` (after the RDMA WRITEs of its data-in),
    /// returning the freed credits (`credited`: it took one).
    fn answer(&mut self, c: usize, index: usize, tag: u64, answer: Answer, credited: bool) {
        if answer.status == status::GOOD {
            self.counters.commands_good += 1;
        } else {
            self.counters.commands_failed += 1;
        }
        let max_ti = self.config.max_ti_iu_len as usize;
        let channel = self.channels[c].as_mut().expect("present");
        if credited {
            channel.credits_to_return += 1;
        }
        let sense_room = max_ti.saturating_sub(super::wire::iu::RSP_HEADER_LEN);
        let rsp = RspRepr {
            sol_not: 0,
            req_lim_delta: channel.take_delta(),
            tag,
            status: answer.status,
            data_out_residual: answer.data_out_residual,
            data_in_residual: answer.data_in_residual,
            response_data: None,
            sense: answer.sense.map(|s| {
                let mut bytes = s.to_bytes().to_vec();
                bytes.truncate(sense_room);
                bytes
            }),
        };
        let mut writes: Vec<(u32, DirectDescriptor, u32)> = Vec::new();
        let mut data_base = (0u64, 0u32);
        if let Slot::Busy(request) = &channel.slots[index] {
            if answer.data_in_len > 0 {
                writes = read_plan(&request.descriptors, answer.data_in_len);
                if let Some(buffer) = &request.buffer {
                    data_base = (channel.pool.address(buffer), channel.pool.mr().lkey());
                }
            }
        }
        let length = rsp.buffer_len();
        let mut bytes = vec![0u8; length];
        rsp.emit(&mut bytes);
        if let Err(e) = channel.sends.write(index, &bytes) {
            let peer = channel.peer.clone();
            self.diag("send-buffer", || format!("response buffer of {peer}: {e}"));
            return self.close(c, "response buffer failed");
        }
        let data_sges: Vec<[Sge; 1]> = writes
            .iter()
            .map(|(offset, _, len)| [Sge::new(data_base.0 + u64::from(*offset), *len, data_base.1)])
            .collect();
        let rsp_sge = [channel.sends.sge(index, length)];
        let mut wrs: Vec<SendWorkRequest<'_>> = writes
            .iter()
            .zip(&data_sges)
            .map(|((_, d, _), sge)| SendWorkRequest {
                wr_id: wr_id(WorkKind::WriteData, index),
                opcode: WrOpcode::RdmaWrite,
                sg_list: sge,
                // Unsignaled: RC order puts the data before the response, and the
                // response's completion retires the WRITEs too.
                send_flags: SendFlags::empty(),
                rdma: RdmaFields {
                    remote_addr: d.va,
                    rkey: d.key,
                },
                ..Default::default()
            })
            .collect();
        wrs.push(SendWorkRequest {
            wr_id: wr_id(WorkKind::Send, index),
            opcode: WrOpcode::Send,
            sg_list: &rsp_sge,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        });
        let entries = wrs.len() as u32;
        if let Err(e) = channel.qp.post_send(&wrs) {
            let peer = channel.peer.clone();
            self.diag("post", || format!("posting a response for {peer}: {e}"));
            return self.close(c, "response post failed");
        }
        channel.send_used += entries;
        match &mut channel.slots[index] {
            Slot::Busy(request) => {
                request.stage = Stage::Responding;
                request.send_entries += entries;
            }
            slot => *slot = Slot::Answering,
        }
    }

    // ----- task management -----------------------------------------------------------

    fn handle_task_management(&mut self, c: usize, tsk: &TskMgmtRepr) {
        self.counters.task_management += 1;
        let credited = self.take_credit(c, "SRP_TSK_MGMT", tsk.tag);
        let channel = self.channels[c].as_mut().expect("present");
        let Some(index) = channel.free_slot() else {
            return self.close(c, "request slots exhausted");
        };
        channel.slots[index] = Slot::Answering;
        if !credited {
            let busy = Answer {
                status: status::BUSY,
                sense: None,
                ..Answer::check_condition(SenseData::NONE)
            };
            return self.answer(c, index, tsk.tag, busy, false);
        }
        let lun = decode_lun(tsk.lun);
        let code = match tsk.function {
            TaskManagementFunction::AbortTask => {
                // A task that already finished (or never existed) is not there to
                // abort: FUNCTION COMPLETE, as SAM has it.
                self.abort_where(c, |r| r.tag == tsk.task_tag && r.lun == lun);
                task_management_response::COMPLETE
            }
            TaskManagementFunction::AbortTaskSet
            | TaskManagementFunction::ClearTaskSet
            | TaskManagementFunction::LogicalUnitReset => {
                if lun.is_none_or(|l| self.luns.get(l).is_none()) {
                    self.counters.unknown_lun_commands += 1;
                    // INCORRECT LOGICAL UNIT NUMBER.
                    0x09
                } else {
                    self.abort_where(c, |r| r.lun == lun);
                    task_management_response::COMPLETE
                }
            }
            TaskManagementFunction::ClearAca | TaskManagementFunction::Other(_) => {
                task_management_response::NOT_SUPPORTED
            }
        };
        let channel = self.channels[c].as_mut().expect("present");
        channel.credits_to_return += 1;
        let rsp = RspRepr {
            req_lim_delta: channel.take_delta(),
            tag: tsk.tag,
            response_data: Some(vec![0, 0, 0, code]),
            ..RspRepr::default()
        };
        let bytes = IuRepr::Rsp(rsp).to_bytes();
        if channel.sends.write(index, &bytes).is_err() {
            return self.close(c, "response buffer failed");
        }
        let sge = [channel.sends.sge(index, bytes.len())];
        let posted = channel.qp.post_send(&[SendWorkRequest {
            wr_id: wr_id(WorkKind::Send, index),
            opcode: WrOpcode::Send,
            sg_list: &sge,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        }]);
        if posted.is_err() {
            return self.close(c, "response post failed");
        }
        channel.send_used += 1;
    }

    /// Aborts the commands of channel `c` matching `which` that have not started
    /// responding: they get no SRP_RSP; their credits go back with the next one.
    fn abort_where(&mut self, c: usize, which: impl Fn(&Request) -> bool) {
        let channel = self.channels[c].as_mut().expect("present");
        let mut aborted = 0;
        for index in 0..channel.slots.len() {
            let Slot::Busy(request) = &mut channel.slots[index] else {
                continue;
            };
            if request.stage == Stage::Responding || request.aborted || !which(request) {
                continue;
            }
            aborted += 1;
            if let Stage::Reading { .. } = request.stage {
                // The READs still land in its buffer; it is freed when they did.
                request.aborted = true;
                continue;
            }
            if let Some(buffer) = request.buffer.take() {
                channel.pool.free(buffer);
            }
            channel.slots[index] = Slot::Free;
            channel.waiting.retain(|i| *i != index);
            channel.ready.retain(|i| *i != index);
        }
        channel.credits_to_return += aborted;
        self.counters.commands_aborted += u64::from(aborted);
    }

    // ----- logout and teardown -------------------------------------------------------

    /// Sends SRP_T_LOGOUT with `reason` on channel `c`, and disconnects once it went
    /// out.
    fn logout(&mut self, c: usize, reason: u32) {
        let Some(channel) = self.channels.get_mut(c).and_then(Option::as_mut) else {
            return;
        };
        if channel.state != ChannelState::Live {
            return;
        }
        // The send slot past the request slots.
        let index = channel.slots.len();
        let bytes = IuRepr::TLogout(TLogoutRepr {
            sol_not: 0,
            reason,
            tag: 0,
        })
        .to_bytes();
        let sge = [channel.sends.sge(index, bytes.len())];
        let posted = channel.sends.write(index, &bytes).is_ok()
            && channel
                .qp
                .post_send(&[SendWorkRequest {
                    wr_id: wr_id(WorkKind::Send, index),
                    opcode: WrOpcode::Send,
                    sg_list: &sge,
                    send_flags: SendFlags::SIGNALED,
                    ..Default::default()
                }])
                .is_ok();
        if posted {
            channel.state = ChannelState::LoggingOut;
            channel.send_used += 1;
            self.counters.target_logouts += 1;
        } else {
            self.close(c, "logout could not be sent");
        }
    }

    fn close(&mut self, c: usize, why: &'static str) {
        let Some(mut channel) = self.channels.get_mut(c).and_then(Option::take) else {
            return;
        };
        self.counters.channels_closed += 1;
        tracing::info!(peer = %channel.peer, why, "srp target: channel closed");
        channel.connection.disconnect(&channel.qp);
        // Dropping the channel destroys the QP (flushing what was outstanding), then the
        // CQ and the memory.
        drop(channel);
    }
}

/// The residual of a transfer: `described` bytes in the descriptors, `wanted` by the
/// command.
fn residual(described: u64, wanted: u64) -> ResidualCount {
    match described.cmp(&wanted) {
        std::cmp::Ordering::Equal => ResidualCount::None,
        std::cmp::Ordering::Greater => ResidualCount::Underflow((described - wanted).min(u64::from(u32::MAX)) as u32),
        std::cmp::Ordering::Less => ResidualCount::Overflow((wanted - described).min(u64::from(u32::MAX)) as u32),
    }
}

/// How `length` bytes of a contiguous buffer map onto `descriptors` in order:
/// (offset in the buffer, descriptor, bytes), clipped at `length`.
fn read_plan(descriptors: &[DirectDescriptor], length: u32) -> Vec<(u32, DirectDescriptor, u32)> {
    let mut plan = Vec::with_capacity(descriptors.len());
    let mut offset = 0u32;
    for d in descriptors {
        if offset >= length {
            break;
        }
        let len = d.len.min(length - offset);
        if len > 0 {
            plan.push((offset, *d, len));
        }
        offset += len;
    }
    plan
}

/// Stands in for the connection until the accept returns it.
struct NotConnected;

impl Connection for NotConnected {
    fn is_disconnected(&mut self) -> bool {
        true
    }
    fn disconnect(&mut self, _qp: &QueuePair) {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_maps_onto_descriptors_in_order() {
        let d = |va, len| DirectDescriptor { va, key: 1, len };
        let list = [d(0x1000, 512), d(0x8000, 1024), d(0x2000, 512)];
        let plan = read_plan(&list, 2048);
        assert_eq!(
            plan.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(),
            [(0, 512), (512, 1024), (1536, 512)]
        );
        let short = read_plan(&list, 1000);
        assert_eq!(
            short.iter().map(|p| (p.0, p.2)).collect::<Vec<_>>(),
            [(0, 512), (512, 488)]
        );
        assert!(read_plan(&list, 0).is_empty());
    }

    #[test]
    fn residuals_say_which_way() {
        assert_eq!(residual(4096, 4096), ResidualCount::None);
        assert_eq!(residual(4096, 36), ResidualCount::Underflow(4060));
        assert_eq!(residual(512, 1024), ResidualCount::Overflow(512));
    }
}
