//! `rnic-bench --peer perftest --cm`: perftest's `-R` ("Data ex. method: rdma_cm",
//! `use_rdma_cm` and `work_rdma_cm` on), where both the exchange and the test's queue
//! pairs go through the RDMA connection manager instead of TCP. Facts from perftest
//! 4.5-0.17 (src/perftest_communication.c: `rdma_client_connect`, `rdma_server_connect`,
//! `rdma_write_keys`, `rdma_read_keys`, `ctx_xchg_data_rdma`, `create_rdma_cm_connection`
//! and the `rdma_cm_*` handlers; src/perftest_resources.c: `destroy_ctx`,
//! `rdma_cm_disconnect_nodes`):
//!
//! 1. **The exchange** is an RC connection of its own, made by rdma_cm on the test's port
//!    (port space TCP, `-p`, default 18515): the server listens, accepts the first
//!    CONNECT_REQUEST and closes its listener. Both sides keep one receive of 56 bytes
//!    posted (`sizeof(struct pingpong_dest)`); every message of the TCP exchange (version,
//!    system data, MTU, key messages, BW report) becomes one SEND of the same bytes,
//!    except the key message: `struct pingpong_dest` in binary, its fields big-endian
//!    ([`KeyMessage::encode_binary`](crate::perftest::KeyMessage::encode_binary)). Conn params: responder resources and initiator
//!    depth 0, retry count 7, RNR retry count 7.
//! 2. After the version, system data and MTU: a sync (a key message of zeros), then the
//!    test's connections on the same port (port space TCP for RC, UDP with SIDR for
//!    `-c UD`), one per QP, in order: READ/atomic ask for `out_reads` of both depths, the
//!    others for 0; retry and RNR retry counts 7. The server takes the requests in arrival
//!    order, accepts each at once (it does not wait for ESTABLISHED) and closes its
//!    listener; then another sync of zeros.
//! 3. The test's own key exchanges follow as over TCP, without the step that connects the
//!    QPs (the connection manager did); UD sends go to the QP number and Q_Key of the
//!    SIDR reply (0x01234567), not to the key message's.
//! 4. At the end the client disconnects each test connection and waits for their
//!    DISCONNECTED events (RC only); the server disconnects the last one and destroys the
//!    others (Linux then sends the DREQ or DREP); the exchange's connection ends when the
//!    processes destroy it.
//!
//! A message of ours on the exchange counts as delivered when its SEND completes or when
//! the peer sends its next one (the sides alternate strictly, so an answer means ours was
//! read; [`Outbox`]). perftest itself waits for each SEND's completion before it reads.
//! We do not: on a lossy link the peer may read our last message, answer and exit while
//! the ACK of it is lost, and our resend to its destroyed QP then completes only when the
//! retries run out, about a minute later with the ACK timeout's backoff (seen as rxe-interop
//! `read_cm`/`write_cm` with rxe as server failing on the lossy link).
//!
//! perftest's server may not listen yet when its client's REQ arrives (it opens the test's
//! listener only after the sync, and the client connects once it has the server's half of
//! the sync, maybe before the server has read the client's); Linux then answers REJ 8
//! (SIDR_REP status 1 for UD) and perftest's client, which means to retry ten times 100 ms
//! apart, frees its ids and uses them again (a crash). rnic-bench's server therefore opens
//! the test's listener before that sync ([`CmLink::listen_for_data`]), and its client
//! retries with a new id until [`CONNECT_TIMEOUT`], for the exchange too: a perftest server
//! that is still starting answers the same way.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_verbs::cm::{
    CmConfig, CmEvent, CmEventKind, CmId, ConnParam, ConnectionManager, EventChannel, Neighbours, PortSpace,
    ProgressThread, StaticNeighbours,
};
use rnic_verbs::{
    AccessFlags, AddressHandle, CompletionQueue, Context, MemoryRegion, Mtu, ProtectionDomain, QpCapabilities,
    QpInitAttributes, QpState, QpType, QueuePair, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};

use crate::perftest::{PerftestError, KEY_LEN_BINARY};
use crate::remote::Role;

type Result<T> = std::result::Result<T, PerftestError>;

/// How long a client keeps connecting while the server answers REJ 8 (not listening).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server waits for perftest's client to connect the exchange.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(120);
/// Any other connection event, and each message of the exchange.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Disconnection at the end: the peer answers when it destroys its ids.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Between a REJ 8 and the next REQ (perftest's `rdma_cm_client_connection`).
const RETRY_DELAY: Duration = Duration::from_millis(100);
/// REJ reason 8: invalid service ID (nobody listens on the port).
const REJ_INVALID_SERVICE_ID: i32 = 8;
/// SIDR_REP status 1 (`IB_SIDR_UNSUPPORTED`): the same for UD (an UNREACHABLE event).
const SIDR_UNSUPPORTED: i32 = 1;
/// Bytes of one message slot in the exchange's buffer (a message is at most 56 bytes).
const SLOT: u64 = 64;
/// SENDs the exchange's QP holds; each has a slot of its own, from offset 0, so a resend
/// reads the bytes it first sent.
const SEND_SLOTS: usize = 2;
/// Where the one receive lands, after the send slots.
const RECV_OFFSET: u64 = SEND_SLOTS as u64 * SLOT;
const SEND_WR: u64 = 1;
const RECV_WR: u64 = 2;
/// Between two polls of the exchange's completion queues.
const POLL_INTERVAL: Duration = Duration::from_micros(50);

fn cm_error(what: impl std::fmt::Display) -> PerftestError {
    PerftestError::Message(format!("connection manager: {what}"))
}

/// Where a UD test sends: the SIDR reply's QP number and Q_Key, and an address handle.
pub(crate) struct UdPeer {
    pub qpn: u32,
    pub qkey: u32,
    pub ah: AddressHandle,
}

/// What we know of the delivery of our messages on the exchange. A message is delivered
/// once its SEND completes (the peer's ACK) or once the peer sends its next message: the
/// client writes then reads, the server reads then writes, so an answer means the peer
/// has read ours. The second is what the last message has when the peer exits with the
/// ACK of it lost.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Outbox {
    /// SENDs posted whose completion has not been taken (at most [`SEND_SLOTS`]).
    in_flight: usize,
    /// SENDs posted so far: the next one's slot.
    posted: u64,
    /// The newest SEND has neither completed nor been answered.
    unanswered: bool,
}

impl Outbox {
    /// A SEND was posted.
    fn post(&mut self) {
        self.in_flight += 1;
        self.posted += 1;
        self.unanswered = true;
    }

    /// The oldest SEND in flight completed successfully (completions come in order).
    fn complete(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.unanswered = false;
        }
    }

    /// A message from the peer arrived: it has read everything we sent before it.
    fn answer(&mut self) {
        self.unanswered = false;
    }

    /// Where the next SEND's bytes go.
    fn next_slot(&self) -> u64 {
        self.posted % SEND_SLOTS as u64 * SLOT
    }
}

/// The exchange's connection and the connection manager behind it.
pub(crate) struct CmLink {
    // Declared first: dropped first, so the thread stops before the ids go.
    progress: Option<ProgressThread>,
    cm: ConnectionManager,
    channel: EventChannel,
    /// The server's listener for the test's connections (RC: the exchange's own).
    listener: Option<CmId>,
    /// The exchange's connection.
    id: CmId,
    /// The test's connections, in QP order.
    data: Vec<CmId>,
    /// Data ids whose DISCONNECTED was seen.
    disconnected: Vec<u64>,
    /// The server address (client) or the address we listen on (server).
    address: SocketAddr,
    client: bool,
    qp: QueuePair,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
    outbox: Outbox,
}

impl CmLink {
    /// Connects the exchange: the client to the server at `role`'s host and port (retrying
    /// while it answers REJ 8), the server by accepting the first request on the port.
    /// `peer_mac` names the peer's MAC when the kernel's neighbour table may not know it.
    pub(crate) fn open(context: &Context, role: &Role, ip: Option<IpAddr>, peer_mac: Option<[u8; 6]>) -> Result<Self> {
        let (client, address) = match role {
            Role::Server { port } => (false, SocketAddr::new(ip.unwrap_or(IpAddr::from([0u8; 4])), *port)),
            Role::Client { host, port } => {
                let address = (host.as_str(), *port)
                    .to_socket_addrs()?
                    .next()
                    .ok_or_else(|| PerftestError::Config(format!("no address for {host}")))?;
                (true, address)
            }
        };
        let table = Arc::new(StaticNeighbours::new());
        if let (true, Some(mac)) = (client, peer_mac) {
            table.insert(address.ip(), mac);
        }
        let cm = ConnectionManager::new(CmConfig::default());
        cm.add_device(context, Arc::new(Neighbours::host(table)))
            .map_err(cm_error)?;
        let channel = cm.create_event_channel().map_err(cm_error)?;
        let progress = Some(cm.spawn_progress_thread().map_err(cm_error)?);
        let pd = context.alloc_pd()?;
        let send_cq = context.create_cq(4, None, 0)?;
        let recv_cq = context.create_cq(4, None, 0)?;
        let qp = pd.create_qp(&QpInitAttributes {
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: SEND_SLOTS as u32,
                max_recv_wr: 2,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })?;
        let mr = pd.register_provider_memory((RECV_OFFSET + SLOT) as usize, AccessFlags::LOCAL_WRITE)?;
        let param = ConnParam {
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: qp.qp_num(),
            ..ConnParam::default()
        };
        let (id, listener) = if client {
            let (id, _) = connect_retrying(&channel, address, PortSpace::Tcp, 0, &param, &pd, |_| Ok(()))?;
            (id, None)
        } else {
            let listener = channel.create_id(0, PortSpace::Tcp).map_err(cm_error)?;
            listener.bind_addr(address).map_err(cm_error)?;
            listener.listen(1).map_err(cm_error)?;
            // The line that tells a script its perftest client may start now.
            eprintln!("rnic-bench: perftest -R: listening on {address} (rdma_cm)");
            let event = wait_for(&channel, ACCEPT_TIMEOUT, "the exchange's CONNECT_REQUEST", |e| {
                e.kind == CmEventKind::ConnectRequest
            })?;
            (event.id.clone(), Some(listener))
        };
        // perftest posts its receive before rdma_connect/rdma_accept; a QP takes receives
        // from INIT on.
        move_qp(&id, &qp)?;
        let link = Self {
            progress,
            cm,
            channel,
            listener,
            id,
            data: Vec::new(),
            disconnected: Vec::new(),
            address,
            client,
            qp,
            send_cq,
            recv_cq,
            mr,
            _pd: pd,
            outbox: Outbox::default(),
        };
        link.post_recv()?;
        if client {
            link.id.establish().map_err(cm_error)?;
        } else {
            link.id.accept(&param).map_err(cm_error)?;
        }
        tracing::info!(client, %address, "perftest -R: exchange connected");
        Ok(link)
    }

    fn post_recv(&self) -> Result<()> {
        let sge = Sge::new(self.mr.addr() + RECV_OFFSET, KEY_LEN_BINARY as u32, self.mr.lkey());
        self.qp
            .post_recv(&[RecvWorkRequest {
                wr_id: RECV_WR,
                sg_list: &[sge],
            }])
            .map_err(|error| PerftestError::Message(format!("exchange post_recv: {error}")))
    }

    /// Takes the SEND completions there are; one that did not succeed ends the exchange.
    fn take_send_completions(&mut self) -> Result<()> {
        let mut completions = [WorkCompletion::default(); SEND_SLOTS];
        loop {
            let count = self.send_cq.poll(&mut completions)?;
            for wc in &completions[..count] {
                if wc.status != WcStatus::Success || wc.wr_id != SEND_WR {
                    return Err(PerftestError::Message(format!("exchange SEND: {:?}", wc.status)));
                }
                self.outbox.complete();
            }
            if count < completions.len() {
                return Ok(());
            }
        }
    }

    /// `rdma_write_data`: one signalled SEND of `bytes`. Its completion is taken later
    /// ([`Outbox`]): perftest's peer answers it or acknowledges it, and may do the first
    /// and exit before our resend of a lost ACK's message reaches it.
    pub(crate) fn send(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 > SLOT {
            return Err(PerftestError::Message(format!(
                "exchange message of {} bytes, at most {SLOT}",
                bytes.len()
            )));
        }
        // Both slots busy: the peer, which has answered the older SEND, acknowledges it
        // too (an ACK covers every PSN before it).
        let deadline = Instant::now() + EVENT_TIMEOUT;
        self.take_send_completions()?;
        while self.outbox.in_flight >= SEND_SLOTS {
            if Instant::now() > deadline {
                return Err(PerftestError::Timeout(format!(
                    "exchange: no SEND completion in {EVENT_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(POLL_INTERVAL);
            self.take_send_completions()?;
        }
        let offset = self.outbox.next_slot();
        self.mr.write(offset, bytes)?;
        let sge = Sge::new(self.mr.addr() + offset, bytes.len() as u32, self.mr.lkey());
        self.qp
            .post_send(&[SendWorkRequest {
                wr_id: SEND_WR,
                opcode: WrOpcode::Send,
                sg_list: std::slice::from_ref(&sge),
                send_flags: SendFlags::SIGNALED,
                ..SendWorkRequest::default()
            }])
            .map_err(|error| PerftestError::Message(format!("exchange post_send: {error}")))?;
        self.outbox.post();
        Ok(())
    }

    /// `rdma_read_data`: the next message, which must be `n` bytes; the receive is posted
    /// again. A SEND of ours that failed meanwhile ends the exchange.
    pub(crate) fn recv(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut completions = [WorkCompletion::default(); 1];
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            self.take_send_completions()?;
            if self.recv_cq.poll(&mut completions)? == 1 {
                break;
            }
            if Instant::now() > deadline {
                return Err(PerftestError::Timeout(format!(
                    "exchange: no message from the peer in {EVENT_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        let wc = completions[0];
        if wc.status != WcStatus::Success || wc.wr_id != RECV_WR {
            return Err(PerftestError::Message(format!("exchange receive: {:?}", wc.status)));
        }
        if wc.byte_len as usize != n {
            return Err(PerftestError::Message(format!(
                "exchange message of {} bytes, expected {n}",
                wc.byte_len
            )));
        }
        self.outbox.answer();
        let mut bytes = vec![0u8; n];
        self.mr.read(RECV_OFFSET, &mut bytes)?;
        self.post_recv()?;
        Ok(bytes)
    }

    /// Server: opens the listener for the test's connections (UD: port space UDP; RC: the
    /// exchange's listener serves). Called once, before the sync that precedes them:
    /// perftest's client connects as soon as it has the server's half of that sync, which
    /// can be before the server has read the client's half, and meeting nobody listening
    /// it crashes in its retry (module doc). perftest's own server listens after the sync.
    pub(crate) fn listen_for_data(&mut self, ud: bool, qps: usize) -> Result<()> {
        if self.client || (!ud && self.listener.is_some()) {
            return Ok(());
        }
        let space = if ud { PortSpace::Udp } else { PortSpace::Tcp };
        let listener = self.channel.create_id(0, space).map_err(cm_error)?;
        listener.bind_addr(self.address).map_err(cm_error)?;
        listener.listen(qps as u32).map_err(cm_error)?;
        if let Some(old) = self.listener.replace(listener) {
            old.destroy().map_err(cm_error)?;
        }
        Ok(())
    }

    /// The test's connections, one per QP in `qps` (all UD or all RC), with `resources`
    /// READ/atomic depth both ways; a server accepts them on the listener
    /// [`CmLink::listen_for_data`] opened. Returns, for UD, where each QP sends.
    pub(crate) fn connect_data(
        &mut self,
        pd: &ProtectionDomain,
        qps: &[&QueuePair],
        ud: bool,
        resources: u8,
    ) -> Result<Vec<Option<UdPeer>>> {
        let space = if ud { PortSpace::Udp } else { PortSpace::Tcp };
        let param = |qp: &QueuePair| ConnParam {
            responder_resources: resources,
            initiator_depth: resources,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: qp.qp_num(),
            ..ConnParam::default()
        };
        let mut peers = Vec::new();
        if self.client {
            for (index, qp) in qps.iter().enumerate() {
                // A UD QP takes the id's Q_Key before the SIDR REQ (perftest's is made by
                // rdma_create_qp); once, whatever id a retry ends with.
                let moved = std::cell::Cell::new(false);
                let (id, peer) =
                    connect_retrying(&self.channel, self.address, space, index as u64, &param(qp), pd, |id| {
                        if ud && !moved.get() {
                            move_qp(id, qp)?;
                            moved.set(true);
                        }
                        Ok(())
                    })?;
                if !ud {
                    move_qp(&id, qp)?;
                    id.establish().map_err(cm_error)?;
                }
                self.data.push(id);
                peers.push(peer);
            }
        } else {
            for qp in qps {
                let event = wait_for(&self.channel, EVENT_TIMEOUT, "a test CONNECT_REQUEST", |e| {
                    e.kind == CmEventKind::ConnectRequest
                })?;
                let id = event.id.clone();
                drop(event);
                move_qp(&id, qp)?;
                id.accept(&param(qp)).map_err(cm_error)?;
                self.data.push(id);
                peers.push(None);
            }
        }
        tracing::info!(qps = qps.len(), ud, "perftest -R: test connections made");
        Ok(peers)
    }

    /// The end: waits until our last message is delivered, disconnects the test's RC
    /// connections and the exchange, each answered or timed out, then destroys every id.
    /// Returns the CM MADs this side sent.
    ///
    /// # Errors
    /// Our last message was neither acknowledged nor answered, and the peer did not
    /// disconnect (which it does only after reading it), within [`EVENT_TIMEOUT`]; or its
    /// SEND failed. The ids are destroyed all the same.
    pub(crate) fn close(mut self, ud: bool) -> Result<u64> {
        // Before our disconnect, which moves the QP to ERR and would flush that SEND.
        let delivered = self.await_last_delivery();
        let mut ids: Vec<CmId> = if ud { Vec::new() } else { self.data.clone() };
        ids.push(self.id.clone());
        for id in &ids {
            if let Err(error) = id.disconnect() {
                tracing::debug!(%error, "disconnect");
            }
        }
        let deadline = Instant::now() + DISCONNECT_TIMEOUT;
        while ids.iter().any(|id| !self.disconnected.contains(&id.handle())) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(event) = (!left.is_zero()).then(|| self.channel.wait_event(left)).flatten() else {
                tracing::warn!(
                    target: "rnic::diag",
                    "perftest -R: not every connection was disconnected within {DISCONNECT_TIMEOUT:?}"
                );
                break;
            };
            if event.kind == CmEventKind::Established {
                // A passive id whose RTU was lost disconnects in REP_SENT without a
                // word (as Linux); a late RTU then establishes it, and this disconnect
                // is the DREQ.
                if let Err(error) = event.id.disconnect() {
                    tracing::debug!(%error, "disconnecting after a late RTU");
                }
            } else {
                self.note_peer_leaving(&event);
            }
        }
        for id in self.data.iter().chain(std::iter::once(&self.id)).chain(&self.listener) {
            if let Err(error) = id.destroy() {
                tracing::debug!(%error, "destroy");
            }
        }
        self.cm.progress();
        let sent = self.cm.counters().sent;
        self.progress.take();
        delivered.map(|()| sent)
    }

    /// Waits until our last message is acknowledged or answered ([`Outbox`]), or until the
    /// peer disconnects one of our connections: perftest does that only after the last
    /// exchange, so it has read our message even if its ACK never reached us.
    fn await_last_delivery(&mut self) -> Result<()> {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            self.take_send_completions()?;
            if !self.outbox.unanswered {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(PerftestError::Timeout(format!(
                    "exchange: our last message was neither acknowledged nor answered in {EVENT_TIMEOUT:?}, \
                     and the peer did not disconnect"
                )));
            }
            if let Some(event) = self.channel.wait_event(Duration::from_millis(1)) {
                let disconnected = event.kind == CmEventKind::Disconnected;
                self.note_peer_leaving(&event);
                if disconnected {
                    tracing::debug!("perftest -R: the peer disconnected before the ACK of our last message came");
                    return Ok(());
                }
            }
        }
    }

    /// Takes a DISCONNECTED (answered by disconnecting: the DREP), UNREACHABLE or REJECTED
    /// event as the end of its connection; other events are not.
    fn note_peer_leaving(&mut self, event: &CmEvent) {
        match event.kind {
            CmEventKind::Disconnected => {
                if let Err(error) = event.id.disconnect() {
                    tracing::debug!(%error, "answering a DREQ");
                }
            }
            // The REP's retries ran out or the peer gave up: nothing left to wait for.
            CmEventKind::Unreachable | CmEventKind::Rejected => {}
            _ => return,
        }
        self.disconnected.push(event.id.handle());
    }

    /// The path MTU of the test's first connection, as the connection manager set it.
    pub(crate) fn data_mtu(qp: &QueuePair) -> Option<Mtu> {
        qp.query().ok().map(|attributes| attributes.path_mtu)
    }
}

/// The next event `accept` takes within `timeout`; ESTABLISHED of ids we accepted
/// (perftest's server does not wait for them) and DISCONNECTED are set aside.
fn wait_for(
    channel: &EventChannel,
    timeout: Duration,
    what: &str,
    accept: impl Fn(&CmEvent) -> bool,
) -> Result<CmEvent> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = (!left.is_zero())
            .then(|| channel.wait_event(left))
            .flatten()
            .ok_or_else(|| PerftestError::Timeout(format!("no {what} within {timeout:?}")))?;
        if accept(&event) {
            return Ok(event);
        }
        match event.kind {
            CmEventKind::Established => {}
            other => {
                return Err(cm_error(format!(
                    "{other} (status {}) while waiting for {what}",
                    event.status
                )))
            }
        }
    }
}

/// Resolves, routes and connects a new id to `server`; a REJ 8 (not listening yet) is
/// retried with a new id until [`CONNECT_TIMEOUT`]. Returns the id after CONNECT_RESPONSE
/// (RC: the caller moves its QP and sends the RTU) or ESTABLISHED (UD, with its peer).
fn connect_retrying(
    channel: &EventChannel,
    server: SocketAddr,
    space: PortSpace,
    context: u64,
    param: &ConnParam,
    pd: &ProtectionDomain,
    before_connect: impl Fn(&CmId) -> Result<()>,
) -> Result<(CmId, Option<UdPeer>)> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let id = channel.create_id(context, space).map_err(cm_error)?;
        let outcome = (|| -> Result<Option<(CmId, Option<UdPeer>)>> {
            id.resolve_addr(None, server, 2000).map_err(cm_error)?;
            wait_for(channel, EVENT_TIMEOUT, "ADDR_RESOLVED", |e| {
                e.kind == CmEventKind::AddrResolved
            })?;
            id.resolve_route(2000).map_err(cm_error)?;
            wait_for(channel, EVENT_TIMEOUT, "ROUTE_RESOLVED", |e| {
                e.kind == CmEventKind::RouteResolved
            })?;
            before_connect(&id)?;
            id.connect(param).map_err(cm_error)?;
            let wanted = if space == PortSpace::Udp {
                CmEventKind::Established
            } else {
                CmEventKind::ConnectResponse
            };
            let event = wait_for(channel, EVENT_TIMEOUT, wanted.name(), |e| {
                matches!(e.kind, CmEventKind::Rejected | CmEventKind::Unreachable) || e.kind == wanted
            })?;
            match (event.kind, event.status) {
                (CmEventKind::Rejected, REJ_INVALID_SERVICE_ID) | (CmEventKind::Unreachable, SIDR_UNSUPPORTED) => {
                    return Ok(None)
                }
                (CmEventKind::Rejected | CmEventKind::Unreachable, status) => {
                    return Err(cm_error(format!("{}, status {status}", event.kind)))
                }
                _ => {}
            }
            let peer = match &event.ud {
                Some(ud) if space == PortSpace::Udp => Some(UdPeer {
                    qpn: ud.qp_num,
                    qkey: ud.qkey,
                    ah: pd.create_ah(&ud.ah_attr)?,
                }),
                _ => None,
            };
            Ok(Some((id.clone(), peer)))
        })();
        match outcome {
            Ok(Some(found)) => {
                if attempts > 1 {
                    tracing::info!(attempts, %server, "perftest -R: connected after REJ 8 (not listening yet)");
                }
                return Ok(found);
            }
            Ok(None) => {
                let _ = id.destroy();
                if Instant::now() + RETRY_DELAY > deadline {
                    return Err(cm_error(format!(
                        "{server} answered that nobody listens (REJ 8 / SIDR status 1) for {CONNECT_TIMEOUT:?}, \
                         {attempts} requests"
                    )));
                }
                std::thread::sleep(RETRY_DELAY);
            }
            Err(error) => {
                let _ = id.destroy();
                return Err(error);
            }
        }
    }
}

/// INIT → RTR → RTS with the id's attributes (`rdma_init_qp_attr`), for a QP of our own.
fn move_qp(id: &CmId, qp: &QueuePair) -> Result<()> {
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (attributes, mask) = id.init_qp_attr(state).map_err(cm_error)?;
        qp.modify(&attributes, mask)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_undelivered_until_its_send_completes() {
        let mut outbox = Outbox::default();
        outbox.post();
        assert!(outbox.unanswered);
        outbox.complete();
        assert_eq!(
            outbox,
            Outbox {
                in_flight: 0,
                posted: 1,
                unanswered: false
            }
        );
    }

    #[test]
    fn the_peers_answer_delivers_our_message_without_its_ack() {
        // The client's last sync: the server read it, answered and exited; the ACK was lost.
        let mut outbox = Outbox::default();
        outbox.post();
        outbox.answer();
        assert!(!outbox.unanswered);
        assert_eq!(outbox.in_flight, 1, "the SEND still holds its slot until it completes");
    }

    #[test]
    fn a_completion_of_an_older_send_does_not_deliver_the_newest() {
        let mut outbox = Outbox::default();
        outbox.post();
        outbox.answer();
        outbox.post();
        outbox.complete();
        assert!(outbox.unanswered, "the newest SEND is neither completed nor answered");
        outbox.complete();
        assert!(!outbox.unanswered);
    }

    #[test]
    fn consecutive_sends_take_alternate_slots_before_the_receive() {
        let mut outbox = Outbox::default();
        let mut slots = Vec::new();
        for _ in 0..4 {
            slots.push(outbox.next_slot());
            outbox.post();
            outbox.complete();
        }
        assert_eq!(slots, [0, SLOT, 0, SLOT]);
        assert!(RECV_OFFSET >= SEND_SLOTS as u64 * SLOT);
        assert!(KEY_LEN_BINARY as u64 <= SLOT, "the largest message fits a slot");
    }
}
