//! The SRP initiator: logs in to a target by address and port identifiers (the compact
//! login of RDMA-CM), then carries SCSI commands over the channel.
//!
//! Two ways to use it:
//!
//! * asynchronous, for benchmarks: [`Initiator::submit`] an SRP_CMD on a data buffer
//!   from the initiator's registered pool ([`Initiator::allocate_buffer`]), then
//!   [`Initiator::poll`] for [`ScsiCompletion`]s;
//! * blocking helpers: [`Initiator::inquiry`], [`Initiator::read_capacity`],
//!   [`Initiator::report_luns`], [`Initiator::read`], [`Initiator::write`],
//!   [`Initiator::command`] for any CDB, [`Initiator::abort_task`],
//!   [`Initiator::lun_reset`], [`Initiator::logout`]. They poll and let the reactor
//!   run the rest of the world while they wait.
//!
//! Like Linux's `ib_srp` it keeps one credit for task management, describes a buffer
//! with one direct descriptor (or, with [`InitiatorConfig::descriptor_chunk`], an
//! indirect table carried whole in the IU), and sends data-out up to the negotiated
//! size as immediate data at offset 68 when the target supports it.

use std::collections::HashMap;

use rnic_verbs::{
    AccessFlags, CompletionQueue, Context, ProtectionDomain, QueuePair, RecvWorkRequest, SendFlags, SendWorkRequest,
    WcStatus, WorkCompletion, WrOpcode,
};

use super::channel::{create_rc_qp, decode_wr_id, wr_id, WorkKind};
use super::wire::descriptor::{DataDescriptor, DirectDescriptor, INDIRECT_HEADER_LEN};
use super::wire::iu::{CmdRepr, IuRepr, ResidualCount, RspRepr, TskMgmtRepr, CMD_HEADER_LEN};
use super::wire::login::{
    LoginRejReason, LoginRejRepr, LoginReqRepr, LoginRspRepr, PortId, IMMEDIATE_REQUESTED, MULTICHANNEL_MULTI,
};
use super::wire::{buffer_format, TaskManagementFunction};
use crate::rdma::connection::DISCONNECT_WAIT_NS;
use crate::rdma::{
    BufferPool, ConnectParams, Connection, ConnectionError, Connector, DataBuffer, Reactor, ServiceAddress, SlotRegion,
};
use crate::scsi::cdb::{Cdb, ReadWrite};
use crate::scsi::data::{self, Capacity16, InquiryRepr};
use crate::scsi::{encode_lun, status, SenseData};

/// Where immediate data starts in an SRP_CMD (Linux: 48 + 16 + 4).
pub const IMMEDIATE_DATA_OFFSET: u16 = 68;

/// How the initiator logs in and works.
#[derive(Debug, Clone)]
pub struct InitiatorConfig {
    /// The target's address (RDMA-CM: IP and port).
    pub target: ServiceAddress,
    /// This initiator's port identifier.
    pub initiator_port_id: PortId,
    /// The target port identifier to log in to.
    pub target_port_id: PortId,
    /// Largest initiator-to-target IU asked for, bytes (68 + immediate data).
    pub max_it_iu_len: u32,
    /// Ask for immediate data.
    pub immediate_data: bool,
    /// Keep the nexus's other channels (multi-channel action "multiple").
    pub multichannel: bool,
    /// Bytes of registered data buffers.
    pub data_pool_bytes: usize,
    /// Describe buffers with an indirect table of entries this long (None: one direct
    /// descriptor).
    pub descriptor_chunk: Option<u32>,
    /// How long a login may take, ns on the reactor's clock.
    pub login_timeout_ns: u64,
    /// How long a blocking command may take, ns.
    pub command_timeout_ns: u64,
}

impl Default for InitiatorConfig {
    fn default() -> Self {
        Self {
            target: ServiceAddress::new(std::net::Ipv4Addr::LOCALHOST, 5555),
            initiator_port_id: PortId::new(0, 0x0002_524E_4943_0002),
            target_port_id: super::target::TargetConfig::default().target_port_id,
            max_it_iu_len: u32::from(IMMEDIATE_DATA_OFFSET) + 8192,
            immediate_data: true,
            multichannel: false,
            data_pool_bytes: 16 << 20,
            descriptor_chunk: None,
            // A lost CM REQ is resent after about 4.6 s (storage-and-cm.md A.6): room for a few.
            login_timeout_ns: 30_000_000_000,
            command_timeout_ns: 30_000_000_000,
        }
    }
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum InitiatorError {
    /// The verbs layer refused a step.
    #[error("verbs: {0}")]
    Verbs(#[from] rnic_verbs::VerbsError),
    /// A post failed.
    #[error("post: {0}")]
    Post(#[from] rnic_verbs::PostError),
    /// The connection manager failed.
    #[error("connection: {0}")]
    Connection(#[from] ConnectionError),
    /// The target refused the login.
    #[error("login rejected: {0}")]
    Rejected(LoginRejReason),
    /// The target broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The channel is gone (disconnect, SRP_T_LOGOUT with this reason, a failed work
    /// request).
    #[error("channel lost: {0}")]
    Disconnected(String),
    /// Nothing came in time.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// No credit or send buffer now: poll, then submit again.
    #[error("no credit to send a command now")]
    Busy,
    /// A request the initiator cannot make (sizes, buffers).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A command ended in a status other than GOOD.
    #[error("SCSI status {status:#04x}{}", sense.map(|s| format!(", sense {s}")).unwrap_or_default())]
    Scsi {
        /// Status.
        status: u8,
        /// Sense, with CHECK CONDITION.
        sense: Option<SenseData>,
    },
}

type Result<T> = std::result::Result<T, InitiatorError>;

/// Data of a submitted command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoData {
    /// None.
    None,
    /// Data-in into the first `length` bytes of a buffer.
    In(DataBuffer, u32),
    /// Data-out from the first `length` bytes of a buffer.
    Out(DataBuffer, u32),
}

/// A finished command or task management request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiCompletion {
    /// The caller's tag given to [`Initiator::submit`].
    pub user_tag: u64,
    /// The SRP tag.
    pub tag: u64,
    /// SCSI status.
    pub status: u8,
    /// Sense data (CHECK CONDITION), parsed.
    pub sense: Option<SenseData>,
    /// Data-in residual.
    pub data_in_residual: ResidualCount,
    /// Data-out residual.
    pub data_out_residual: ResidualCount,
    /// Task management response code.
    pub response_code: Option<u8>,
}

impl ScsiCompletion {
    /// GOOD status.
    pub fn is_good(&self) -> bool {
        self.status == status::GOOD && self.response_code.is_none_or(|c| c == 0)
    }
}

/// What the initiator did, for tests and reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitiatorCounters {
    /// SRP_CMDs sent.
    pub commands: u64,
    /// Of those, with immediate data.
    pub immediate_commands: u64,
    /// Task management requests sent.
    pub task_management: u64,
    /// SRP_RSPs received.
    pub responses: u64,
    /// Responses with a status other than GOOD.
    pub failed: u64,
    /// Credits granted by the target (login and deltas).
    pub credits_granted: u64,
    /// SRP_CRED_REQs answered.
    pub credit_requests: u64,
    /// SRP_AER_REQs answered.
    pub async_events: u64,
    /// IUs that did not parse or were unexpected.
    pub bad_ius: u64,
}

/// What the target answered at login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginInfo {
    /// The login response.
    pub response: LoginRspRepr,
    /// Whether immediate data is used.
    pub immediate: bool,
}

struct Pending {
    user_tag: u64,
}

/// Receive buffers beyond the credits (unsolicited target IUs).
const RECEIVE_SLACK: u32 = 4;
/// Work completions taken per CQ poll.
const POLL_BATCH: usize = 32;

/// The SRP initiator, one channel.
pub struct Initiator {
    // Field order is drop order: the QP before its CQ and memory.
    qp: QueuePair,
    cq: CompletionQueue,
    connection: Box<dyn Connection>,
    receives: SlotRegion,
    sends: SlotRegion,
    pool: BufferPool,
    _pd: ProtectionDomain,
    _context: Context,
    reactor: Box<dyn Reactor>,
    config: InitiatorConfig,
    login: LoginInfo,
    it_iu_len: usize,
    credits: u32,
    next_tag: u64,
    pending: HashMap<u64, Pending>,
    free_sends: Vec<usize>,
    ready: Vec<ScsiCompletion>,
    lost: Option<String>,
    counters: InitiatorCounters,
    completions: Vec<WorkCompletion>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Initiator")
            .field("target", &self.config.target)
            .field("credits", &self.credits)
            .field("outstanding", &self.pending.len())
            .finish()
    }
}

impl Initiator {
    /// Logs in to `config.target` through `connector`, with `reactor` letting time pass
    /// while it waits.
    ///
    /// # Errors
    /// [`InitiatorError::Rejected`] with the target's reason; connection, verbs and
    /// timeout failures; [`InitiatorError::Protocol`] for a reply that is not an
    /// SRP_LOGIN_RSP.
    pub fn login(
        context: Context,
        mut connector: Box<dyn Connector>,
        mut reactor: Box<dyn Reactor>,
        config: InitiatorConfig,
    ) -> Result<Self> {
        if config.max_it_iu_len < 64 {
            return Err(InitiatorError::Invalid(format!(
                "IT IU length {}",
                config.max_it_iu_len
            )));
        }
        let pd = context.alloc_pd()?;
        let device = context.query_device();
        // The queue's shape is known only after the login response; size for the most
        // an SRP target grants here, and use what it grants.
        let max_credits = 4096u32.min(device.max_qp_wr / 2).max(8);
        let (qp, cq) = create_rc_qp(
            &context,
            &pd,
            max_credits + RECEIVE_SLACK + 8,
            max_credits + RECEIVE_SLACK,
        )?;
        let request = LoginReqRepr {
            tag: 0,
            req_it_iu_len: config.max_it_iu_len,
            req_buf_fmt: buffer_format::DIRECT | buffer_format::INDIRECT,
            req_flags: if config.immediate_data { IMMEDIATE_REQUESTED } else { 0 }
                | if config.multichannel { MULTICHANNEL_MULTI } else { 0 },
            imm_data_offset: if config.immediate_data {
                IMMEDIATE_DATA_OFFSET
            } else {
                0
            },
            initiator_port_id: config.initiator_port_id,
            target_port_id: config.target_port_id,
        };
        let params = ConnectParams {
            destination: config.target,
            private_data: request.to_compact_bytes().to_vec(),
            // ib_srp: responder resources 4, initiator depth 0.
            responder_resources: 4,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let mut pending = connector.connect(&context, &qp, &params)?;
        let deadline = reactor.clock().now_ns() + config.login_timeout_ns;
        let (established, connection) = loop {
            if let Some(result) = pending.poll(&qp) {
                match result {
                    Ok(done) => break done,
                    Err(ConnectionError::Rejected { private_data }) => {
                        let reason =
                            LoginRejRepr::parse(&private_data).map_or(LoginRejReason::Other(0), |rej| rej.reason);
                        return Err(InitiatorError::Rejected(reason));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if reactor.clock().now_ns() > deadline {
                return Err(InitiatorError::TimedOut(format!("login to {}", config.target)));
            }
            reactor.idle(false);
        };
        let response = LoginRspRepr::parse(&established.private_data)
            .map_err(|e| InitiatorError::Protocol(format!("login response: {e}")))?;
        if response.req_lim_delta < 2 || response.max_ti_iu_len < 36 || response.max_it_iu_len < 64 {
            return Err(InitiatorError::Protocol(format!(
                "login response grants {} credits, TI IU {} and IT IU {} bytes",
                response.req_lim_delta, response.max_ti_iu_len, response.max_it_iu_len
            )));
        }
        let credits = response.req_lim_delta.min(max_credits);
        let it_iu_len = response.max_it_iu_len.min(config.max_it_iu_len) as usize;
        let ti_iu_len = (response.max_ti_iu_len as usize).min(64 * 1024);
        let receive_count = (credits + RECEIVE_SLACK) as usize;
        // Room for task management and unsolicited answers beyond the credits.
        let send_count = (credits as usize + 2).max(16);
        let receives = SlotRegion::new(&pd, receive_count, ti_iu_len, AccessFlags::LOCAL_WRITE)?;
        // The IUs carry indirect tables the target may read.
        let sends = SlotRegion::new(
            &pd,
            send_count,
            it_iu_len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )?;
        let pool = BufferPool::new(
            &pd,
            config.data_pool_bytes,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )?;
        let immediate = config.immediate_data && response.immediate_supported();
        let initiator = Self {
            qp,
            cq,
            connection,
            receives,
            sends,
            pool,
            _pd: pd,
            _context: context,
            reactor,
            login: LoginInfo { response, immediate },
            it_iu_len,
            credits,
            next_tag: 1,
            pending: HashMap::new(),
            free_sends: (0..send_count).rev().collect(),
            ready: Vec::new(),
            lost: None,
            counters: InitiatorCounters {
                credits_granted: u64::from(response.req_lim_delta),
                ..InitiatorCounters::default()
            },
            completions: vec![WorkCompletion::default(); POLL_BATCH],
            scratch: Vec::new(),
            config,
        };
        for slot in 0..receive_count {
            initiator.post_receive(slot)?;
        }
        tracing::info!(target_address = %initiator.config.target, credits, immediate, "srp initiator: logged in");
        Ok(initiator)
    }

    fn post_receive(&self, slot: usize) -> Result<()> {
        let sge = [self.receives.sge(slot, self.receives.slot_size())];
        self.qp.post_recv(&[RecvWorkRequest {
            wr_id: wr_id(WorkKind::Receive, slot),
            sg_list: &sge,
        }])?;
        Ok(())
    }

    /// What the login negotiated.
    pub fn login_info(&self) -> LoginInfo {
        self.login
    }

    /// Counters.
    pub fn counters(&self) -> &InitiatorCounters {
        &self.counters
    }

    /// Credits held now.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Most immediate data one command can carry, bytes (0: none).
    pub fn immediate_limit(&self) -> usize {
        if self.login.immediate {
            self.it_iu_len.saturating_sub(usize::from(IMMEDIATE_DATA_OFFSET))
        } else {
            0
        }
    }

    /// The reactor.
    pub fn reactor(&mut self) -> &mut dyn Reactor {
        &mut *self.reactor
    }

    /// Now on the reactor's clock, ns.
    pub fn now(&self) -> u64 {
        self.reactor.clock().now_ns()
    }

    /// A registered data buffer of `length` bytes, if the pool has room.
    pub fn allocate_buffer(&mut self, length: u32) -> Option<DataBuffer> {
        self.pool.allocate(length)
    }

    /// Gives a buffer back.
    pub fn free_buffer(&mut self, buffer: DataBuffer) {
        self.pool.free(buffer);
    }

    /// Copies `data` into `buffer` at `offset`.
    ///
    /// # Errors
    /// Outside the buffer.
    pub fn write_buffer(&self, buffer: &DataBuffer, offset: usize, data: &[u8]) -> Result<()> {
        Ok(self.pool.write(buffer, offset, data)?)
    }

    /// Copies bytes of `buffer` from `offset` into `out`.
    ///
    /// # Errors
    /// Outside the buffer.
    pub fn read_buffer(&self, buffer: &DataBuffer, offset: usize, out: &mut [u8]) -> Result<()> {
        Ok(self.pool.read(buffer, offset, out)?)
    }

    /// A direct descriptor of the first `length` bytes of `buffer` (for IUs built by
    /// hand).
    pub fn buffer_descriptor(&self, buffer: &DataBuffer, length: u32) -> DirectDescriptor {
        DirectDescriptor {
            va: self.pool.address(buffer),
            key: self.pool.rkey(),
            len: length,
        }
    }

    /// Waits for completions until `count` arrived or the command timeout passed.
    ///
    /// # Errors
    /// Transport failures.
    pub fn wait_completions(&mut self, count: usize) -> Result<Vec<ScsiCompletion>> {
        let deadline = self.now() + self.config.command_timeout_ns;
        let mut done = Vec::new();
        while done.len() < count && self.now() <= deadline {
            let n = self.poll(&mut done)?;
            self.reactor.idle(n > 0);
        }
        Ok(done)
    }

    /// The descriptor of the first `length` bytes of `buffer`.
    fn describe(&self, buffer: &DataBuffer, length: u32, send_slot: usize) -> DataDescriptor {
        let va = self.pool.address(buffer);
        let key = self.pool.rkey();
        match self.config.descriptor_chunk {
            Some(chunk) if chunk > 0 && length > chunk => {
                let list: Vec<DirectDescriptor> = (0..length.div_ceil(chunk))
                    .map(|i| DirectDescriptor {
                        va: va + u64::from(i * chunk),
                        key,
                        len: chunk.min(length - i * chunk),
                    })
                    .collect();
                // The table's own address: where it sits in this IU's send buffer.
                let table_va = self.sends.sge(send_slot, 0).addr + (CMD_HEADER_LEN + INDIRECT_HEADER_LEN) as u64;
                DataDescriptor::Indirect {
                    table: DirectDescriptor {
                        va: table_va,
                        key: self.sends.mr().rkey(),
                        len: 16 * list.len() as u32,
                    },
                    total_len: length,
                    list,
                }
            }
            _ => DataDescriptor::Direct(DirectDescriptor { va, key, len: length }),
        }
    }

    /// Sends an SRP_CMD for `cdb` on LUN `lun` with `data`; returns its SRP tag. The
    /// completion carries `user_tag`.
    ///
    /// # Errors
    /// [`InitiatorError::Busy`] without a credit (one is kept for task management) or
    /// send buffer; [`InitiatorError::Invalid`] for a descriptor table that does not fit
    /// the IU; [`InitiatorError::Disconnected`]; post failures.
    pub fn submit(&mut self, lun: u16, cdb: &Cdb, data: IoData, user_tag: u64) -> Result<u64> {
        self.submit_raw(lun, cdb.to_bytes(), data, user_tag)
    }

    /// [`Self::submit`] with raw CDB bytes.
    ///
    /// # Errors
    /// As [`Self::submit`].
    pub fn submit_raw(&mut self, lun: u16, cdb: [u8; 16], data: IoData, user_tag: u64) -> Result<u64> {
        if let Some(why) = &self.lost {
            return Err(InitiatorError::Disconnected(why.clone()));
        }
        if self.credits <= 1 || self.free_sends.is_empty() {
            return Err(InitiatorError::Busy);
        }
        let send_slot = *self.free_sends.last().expect("checked");
        let tag = self.next_tag;
        let mut cmd = CmdRepr {
            tag,
            lun: encode_lun(lun),
            cdb,
            ..CmdRepr::default()
        };
        let mut immediate: Option<(DataBuffer, u32)> = None;
        match data {
            IoData::None => {}
            IoData::In(buffer, length) => cmd.data_in = self.describe(&buffer, length, send_slot),
            IoData::Out(buffer, length) => {
                if length as usize <= self.immediate_limit() {
                    cmd.data_out = DataDescriptor::Immediate { len: length };
                    immediate = Some((buffer, length));
                } else {
                    cmd.data_out = self.describe(&buffer, length, send_slot);
                }
            }
        }
        let mut length = cmd.buffer_len();
        if length > self.it_iu_len {
            return Err(InitiatorError::Invalid(format!(
                "an SRP_CMD of {length} bytes exceeds the {}-byte IU",
                self.it_iu_len
            )));
        }
        let mut iu = std::mem::take(&mut self.scratch);
        iu.clear();
        iu.resize(length, 0);
        cmd.emit(&mut iu);
        if let Some((buffer, data_len)) = immediate {
            let offset = usize::from(IMMEDIATE_DATA_OFFSET);
            length = offset + data_len as usize;
            iu.resize(length, 0);
            self.pool.read(&buffer, 0, &mut iu[offset..])?;
            self.counters.immediate_commands += 1;
        }
        let written = self.sends.write(send_slot, &iu);
        self.scratch = iu;
        written?;
        self.post_send(send_slot, length)?;
        self.free_sends.pop();
        self.credits -= 1;
        self.next_tag += 1;
        self.pending.insert(tag, Pending { user_tag });
        self.counters.commands += 1;
        Ok(tag)
    }

    fn post_send(&mut self, slot: usize, length: usize) -> Result<()> {
        let sge = [self.sends.sge(slot, length)];
        self.qp.post_send(&[SendWorkRequest {
            wr_id: wr_id(WorkKind::Send, slot),
            opcode: WrOpcode::Send,
            sg_list: &sge,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        }])?;
        Ok(())
    }

    /// Sends a task management request; returns its SRP tag (the completion carries
    /// `user_tag` and the response code). Uses the credit kept for it.
    ///
    /// # Errors
    /// [`InitiatorError::Busy`] with no credit at all; post failures.
    pub fn submit_task_management(
        &mut self,
        lun: u16,
        function: TaskManagementFunction,
        task_tag: u64,
        user_tag: u64,
    ) -> Result<u64> {
        if let Some(why) = &self.lost {
            return Err(InitiatorError::Disconnected(why.clone()));
        }
        let Some(&slot) = self.free_sends.last() else {
            return Err(InitiatorError::Busy);
        };
        if self.credits == 0 {
            return Err(InitiatorError::Busy);
        }
        let tag = self.next_tag;
        let iu = IuRepr::TskMgmt(TskMgmtRepr {
            sol_not: 0,
            tag,
            lun: encode_lun(lun),
            function,
            task_tag,
        })
        .to_bytes();
        self.sends.write(slot, &iu)?;
        self.post_send(slot, iu.len())?;
        self.free_sends.pop();
        self.credits -= 1;
        self.next_tag += 1;
        self.pending.insert(tag, Pending { user_tag });
        self.counters.task_management += 1;
        Ok(tag)
    }

    /// Sends raw bytes as an IU, outside the protocol's rules (for robustness tests);
    /// `takes_credit`: count it against the credits as a command.
    ///
    /// # Errors
    /// No send buffer; bytes longer than the IU; post failures.
    pub fn send_raw_iu(&mut self, bytes: &[u8], takes_credit: bool) -> Result<()> {
        if takes_credit {
            self.credits = self.credits.saturating_sub(1);
        }
        let Some(slot) = self.free_sends.pop() else {
            return Err(InitiatorError::Busy);
        };
        if bytes.len() > self.it_iu_len {
            self.free_sends.push(slot);
            return Err(InitiatorError::Invalid(format!("{} bytes", bytes.len())));
        }
        self.sends.write(slot, bytes)?;
        self.post_send(slot, bytes.len())
    }

    /// Expects a response with SRP tag `tag` (sent with [`Self::send_raw_iu`]).
    pub fn expect_response(&mut self, tag: u64, user_tag: u64) {
        self.pending.insert(tag, Pending { user_tag });
    }

    /// Takes completions into `out`; returns how many.
    ///
    /// # Errors
    /// [`InitiatorError::Disconnected`] once the channel is lost (after the
    /// completions that arrived before).
    pub fn poll(&mut self, out: &mut Vec<ScsiCompletion>) -> Result<usize> {
        let mut completions = std::mem::take(&mut self.completions);
        let count = self.cq.poll(&mut completions);
        let count = match count {
            Ok(n) => n,
            Err(e) => {
                self.completions = completions;
                return Err(e.into());
            }
        };
        for wc in &completions[..count] {
            self.handle_completion(wc);
        }
        self.completions = completions;
        let n = self.ready.len();
        out.append(&mut self.ready);
        if n == 0 && self.lost.is_none() && self.connection.is_disconnected() {
            self.lost = Some("the target disconnected".into());
        }
        if n == 0 {
            if let Some(why) = &self.lost {
                return Err(InitiatorError::Disconnected(why.clone()));
            }
        }
        Ok(n + count.min(1))
    }

    /// Takes work completions off the CQ without handing out command completions (they
    /// wait for the next [`Self::poll`]); frees send buffers and takes credits.
    ///
    /// # Errors
    /// CQ failures.
    pub fn progress(&mut self) -> Result<usize> {
        let mut completions = std::mem::take(&mut self.completions);
        let count = self.cq.poll(&mut completions);
        if let Ok(n) = count {
            for wc in &completions[..n] {
                self.handle_completion(wc);
            }
        }
        self.completions = completions;
        Ok(count?)
    }

    fn handle_completion(&mut self, wc: &WorkCompletion) {
        let Some((kind, index)) = decode_wr_id(wc.wr_id) else {
            return;
        };
        if wc.status != WcStatus::Success {
            if self.lost.is_none() {
                self.lost = Some(format!("{kind:?} failed: {:?}", wc.status));
            }
            return;
        }
        match kind {
            WorkKind::Send => self.free_sends.push(index),
            WorkKind::Receive => {
                let length = (wc.byte_len as usize).min(self.receives.slot_size());
                let mut iu = std::mem::take(&mut self.scratch);
                iu.resize(length, 0);
                let read = self.receives.read(index, &mut iu);
                let reposted = self.post_receive(index);
                if read.is_err() || reposted.is_err() {
                    self.lost = Some("receive buffer failed".into());
                } else {
                    self.handle_iu(&iu);
                }
                self.scratch = iu;
            }
            WorkKind::ReadData | WorkKind::WriteData => {}
        }
    }

    fn handle_iu(&mut self, iu: &[u8]) {
        let parsed = IuRepr::parse(iu);
        match parsed {
            Ok(IuRepr::Rsp(rsp)) => self.handle_response(rsp),
            Ok(IuRepr::TLogout(logout)) => {
                self.lost = Some(format!("the target logged out (reason {})", logout.reason));
            }
            Ok(IuRepr::CredReq(req)) => {
                self.counters.credit_requests += 1;
                self.grant(req.req_lim_delta);
                let _ = self.send_raw_iu(&IuRepr::CredRsp { tag: req.tag }.to_bytes(), false);
            }
            Ok(IuRepr::AerReq(req)) => {
                self.counters.async_events += 1;
                self.grant(req.req_lim_delta);
                let _ = self.send_raw_iu(&IuRepr::AerRsp { tag: req.tag }.to_bytes(), false);
            }
            Ok(other) => {
                self.counters.bad_ius += 1;
                tracing::warn!(target: "rnic::diag", "srp initiator: unexpected {other:?} from the target");
            }
            Err(e) => {
                self.counters.bad_ius += 1;
                tracing::warn!(target: "rnic::diag", "srp initiator: an IU from the target: {e}");
            }
        }
    }

    fn grant(&mut self, delta: u32) {
        self.credits = self.credits.saturating_add(delta);
        self.counters.credits_granted += u64::from(delta);
    }

    fn handle_response(&mut self, rsp: RspRepr) {
        self.counters.responses += 1;
        self.grant(rsp.req_lim_delta);
        let Some(pending) = self.pending.remove(&rsp.tag) else {
            self.counters.bad_ius += 1;
            tracing::warn!(target: "rnic::diag", tag = rsp.tag, "srp initiator: a response for no outstanding command");
            return;
        };
        let completion = ScsiCompletion {
            user_tag: pending.user_tag,
            tag: rsp.tag,
            status: rsp.status,
            sense: rsp.sense.as_deref().and_then(|s| SenseData::parse(s).ok()),
            data_in_residual: rsp.data_in_residual,
            data_out_residual: rsp.data_out_residual,
            response_code: rsp.task_management_code(),
        };
        if !completion.is_good() {
            self.counters.failed += 1;
        }
        self.ready.push(completion);
    }

    /// Polls until the completion of SRP tag `tag` arrives; other completions are
    /// dropped (blocking helpers only run one command at a time).
    fn wait_for(&mut self, tag: u64) -> Result<ScsiCompletion> {
        let deadline = self.now() + self.config.command_timeout_ns;
        let mut done = Vec::new();
        loop {
            done.clear();
            let n = self.poll(&mut done)?;
            if let Some(c) = done.iter().find(|c| c.tag == tag) {
                return Ok(c.clone());
            }
            if self.now() > deadline {
                return Err(InitiatorError::TimedOut(format!("command tag {tag}")));
            }
            self.reactor.idle(n > 0);
        }
    }

    fn submit_waiting(&mut self, lun: u16, cdb: [u8; 16], data: IoData) -> Result<u64> {
        let deadline = self.now() + self.config.command_timeout_ns;
        loop {
            match self.submit_raw(lun, cdb, data, 0) {
                Err(InitiatorError::Busy) => {
                    let mut done = Vec::new();
                    let n = self.poll(&mut done)?;
                    if self.now() > deadline {
                        return Err(InitiatorError::TimedOut("no credit".into()));
                    }
                    self.reactor.idle(n > 0);
                }
                other => return other,
            }
        }
    }

    /// Runs `cdb` on LUN `lun` with `data_out` (if any) or reading up to `data_in_len`
    /// bytes; returns the completion and the data-in that arrived (whatever the
    /// status).
    ///
    /// # Errors
    /// Transport failures (a status other than GOOD is in the completion, not an
    /// error); a data buffer the pool cannot give.
    pub fn command(
        &mut self,
        lun: u16,
        cdb: [u8; 16],
        data_out: Option<&[u8]>,
        data_in_len: u32,
    ) -> Result<(ScsiCompletion, Vec<u8>)> {
        let length = data_out.map_or(data_in_len, |d| d.len() as u32);
        let buffer = if length > 0 {
            Some(
                self.pool
                    .allocate(length)
                    .ok_or_else(|| InitiatorError::Invalid(format!("no {length}-byte buffer free")))?,
            )
        } else {
            None
        };
        let result = (|| {
            let data = match (data_out, buffer) {
                (Some(out), Some(b)) => {
                    self.pool.write(&b, 0, out)?;
                    IoData::Out(b, length)
                }
                (None, Some(b)) => IoData::In(b, length),
                _ => IoData::None,
            };
            let tag = self.submit_waiting(lun, cdb, data)?;
            let completion = self.wait_for(tag)?;
            let mut data_in = Vec::new();
            if let (IoData::In(b, len), true) = (data, completion.status == status::GOOD) {
                let got = match completion.data_in_residual {
                    ResidualCount::Underflow(n) => len.saturating_sub(n),
                    _ => len,
                };
                data_in.resize(got as usize, 0);
                self.pool.read(&b, 0, &mut data_in)?;
            }
            Ok((completion, data_in))
        })();
        if let Some(b) = buffer {
            self.pool.free(b);
        }
        result
    }

    fn good(completion: &ScsiCompletion) -> Result<()> {
        if completion.is_good() {
            Ok(())
        } else {
            Err(InitiatorError::Scsi {
                status: completion.status,
                sense: completion.sense,
            })
        }
    }

    /// TEST UNIT READY.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD.
    pub fn test_unit_ready(&mut self, lun: u16) -> Result<()> {
        let (c, _) = self.command(lun, Cdb::TestUnitReady.to_bytes(), None, 0)?;
        Self::good(&c)
    }

    /// Standard INQUIRY.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD; data that does not parse.
    pub fn inquiry(&mut self, lun: u16) -> Result<InquiryRepr> {
        let cdb = Cdb::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 96,
        };
        let (c, data) = self.command(lun, cdb.to_bytes(), None, 96)?;
        Self::good(&c)?;
        InquiryRepr::parse(&data).map_err(|e| InitiatorError::Protocol(e.to_string()))
    }

    /// A VPD page's payload.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD; a page that does not parse.
    pub fn vpd(&mut self, lun: u16, page: u8) -> Result<Vec<u8>> {
        let cdb = Cdb::Inquiry {
            evpd: true,
            page_code: page,
            allocation_length: 1024,
        };
        let (c, data) = self.command(lun, cdb.to_bytes(), None, 1024)?;
        Self::good(&c)?;
        let (code, payload) = data::parse_vpd_page(&data).map_err(|e| InitiatorError::Protocol(e.to_string()))?;
        if code != page {
            return Err(InitiatorError::Protocol(format!(
                "asked for VPD {page:#x}, got {code:#x}"
            )));
        }
        Ok(payload.to_vec())
    }

    /// READ CAPACITY(16) (READ CAPACITY(10) if refused): (blocks, block size).
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD.
    pub fn read_capacity(&mut self, lun: u16) -> Result<(u64, u32)> {
        let cdb = Cdb::ReadCapacity16 { allocation_length: 32 };
        let (c, data) = self.command(lun, cdb.to_bytes(), None, 32)?;
        if c.is_good() {
            let cap = Capacity16::parse(&data).map_err(|e| InitiatorError::Protocol(e.to_string()))?;
            return Ok((cap.last_lba + 1, cap.block_size));
        }
        let (c, data) = self.command(lun, Cdb::ReadCapacity10.to_bytes(), None, 8)?;
        Self::good(&c)?;
        let (last, size) = data::parse_read_capacity_10(&data).map_err(|e| InitiatorError::Protocol(e.to_string()))?;
        Ok((u64::from(last) + 1, size))
    }

    /// REPORT LUNS (on LUN 0): the LUN numbers.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD.
    pub fn report_luns(&mut self) -> Result<Vec<u64>> {
        let cdb = Cdb::ReportLuns {
            select_report: 0,
            allocation_length: 4096,
        };
        let (c, data) = self.command(0, cdb.to_bytes(), None, 4096)?;
        Self::good(&c)?;
        data::parse_report_luns(&data).map_err(|e| InitiatorError::Protocol(e.to_string()))
    }

    fn rw(lba: u64, blocks: u32) -> ReadWrite {
        ReadWrite {
            lba,
            blocks,
            fua: false,
            protect: 0,
            sixteen: lba > u64::from(u32::MAX) || blocks > 0xFFFF,
        }
    }

    /// READ of `out.len() / block_size` blocks at `lba`.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD; a length that is not whole blocks.
    pub fn read(&mut self, lun: u16, lba: u64, block_size: u32, out: &mut [u8]) -> Result<()> {
        if block_size == 0 || !out.len().is_multiple_of(block_size as usize) {
            return Err(InitiatorError::Invalid(format!(
                "{} bytes of {block_size}-byte blocks",
                out.len()
            )));
        }
        let blocks = (out.len() / block_size as usize) as u32;
        let cdb = Cdb::Read(Self::rw(lba, blocks));
        let (c, data) = self.command(lun, cdb.to_bytes(), None, out.len() as u32)?;
        Self::good(&c)?;
        if data.len() != out.len() {
            return Err(InitiatorError::Protocol(format!(
                "{} of {} bytes arrived",
                data.len(),
                out.len()
            )));
        }
        out.copy_from_slice(&data);
        Ok(())
    }

    /// WRITE of `data` (whole blocks) at `lba`.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD; a length that is not whole blocks.
    pub fn write(&mut self, lun: u16, lba: u64, block_size: u32, data: &[u8]) -> Result<()> {
        if block_size == 0 || !data.len().is_multiple_of(block_size as usize) {
            return Err(InitiatorError::Invalid(format!(
                "{} bytes of {block_size}-byte blocks",
                data.len()
            )));
        }
        let blocks = (data.len() / block_size as usize) as u32;
        let cdb = Cdb::Write(Self::rw(lba, blocks));
        let (c, _) = self.command(lun, cdb.to_bytes(), Some(data), 0)?;
        Self::good(&c)
    }

    /// SYNCHRONIZE CACHE of the whole unit.
    ///
    /// # Errors
    /// Transport failures; a status other than GOOD.
    pub fn synchronize_cache(&mut self, lun: u16) -> Result<()> {
        let (c, _) = self.command(lun, Cdb::SynchronizeCache { lba: 0, blocks: 0 }.to_bytes(), None, 0)?;
        Self::good(&c)
    }

    fn task_management(&mut self, lun: u16, function: TaskManagementFunction, task_tag: u64) -> Result<u8> {
        let tag = self.submit_task_management(lun, function, task_tag, 0)?;
        let c = self.wait_for(tag)?;
        c.response_code
            .ok_or_else(|| InitiatorError::Protocol("task management response without a code".into()))
    }

    /// ABORT TASK of the command with SRP tag `task_tag`; returns the response code.
    ///
    /// # Errors
    /// Transport failures.
    pub fn abort_task(&mut self, lun: u16, task_tag: u64) -> Result<u8> {
        self.task_management(lun, TaskManagementFunction::AbortTask, task_tag)
    }

    /// LOGICAL UNIT RESET; returns the response code.
    ///
    /// # Errors
    /// Transport failures.
    pub fn lun_reset(&mut self, lun: u16) -> Result<u8> {
        self.task_management(lun, TaskManagementFunction::LogicalUnitReset, 0)
    }

    /// Whether the channel is lost, and why.
    pub fn lost(&mut self) -> Option<&str> {
        // What arrived first (an SRP_T_LOGOUT) says more than the disconnect after it.
        let mut arrived = Vec::new();
        let _ = self.poll(&mut arrived);
        self.ready.append(&mut arrived);
        if self.lost.is_none() && self.connection.is_disconnected() {
            self.lost = Some("the target disconnected".into());
        }
        self.lost.as_deref()
    }

    /// Logs out the way Linux does: a disconnect (no SRP_I_LOGOUT).
    pub fn logout(mut self) {
        self.disconnect_and_wait();
        self.lost = Some("logged out".into());
    }

    /// Disconnects and lets the target acknowledge it (the CM's DREP) before the QP, and
    /// perhaps the process, goes: a target that never heard of the disconnect refuses
    /// the next login from the same QP number as a stale connection.
    fn disconnect_and_wait(&mut self) {
        self.connection.disconnect(&self.qp);
        let deadline = self.now() + DISCONNECT_WAIT_NS;
        while self.now() < deadline && !self.connection.disconnect_acknowledged() {
            self.reactor.idle(false);
        }
    }

    /// Logs out with SRP_I_LOGOUT first, then disconnects.
    ///
    /// # Errors
    /// Post failures.
    pub fn logout_with_iu(mut self) -> Result<()> {
        let tag = self.next_tag;
        self.send_raw_iu(&IuRepr::ILogout { tag }.to_bytes(), false)?;
        // Let the SEND go before the disconnect flushes it.
        let deadline = self.now() + 1_000_000_000;
        let sends = self.free_sends.len();
        while self.free_sends.len() == sends && self.now() < deadline && self.lost.is_none() {
            let mut done = Vec::new();
            let n = self.poll(&mut done).unwrap_or(0);
            self.reactor.idle(n > 0);
        }
        self.disconnect_and_wait();
        self.lost = Some("logged out".into());
        Ok(())
    }
}

impl Drop for Initiator {
    fn drop(&mut self) {
        if self.lost.is_none() && !self.connection.is_disconnected() {
            self.disconnect_and_wait();
        }
    }
}
