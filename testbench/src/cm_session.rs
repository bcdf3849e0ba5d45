//! `rnic-bench --cm` in one process: the bench's queue pairs connected through the
//! connection managers of its two embedded NICs, the way two applications that use
//! rdma_cm with queue pairs of their own do it (`rdma_connect` with the QP number,
//! `rdma_init_qp_attr` for each transition, `rdma_accept`, `rdma_establish`), and
//! disconnected the same way at the end.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rnic_verbs::backend::EmbeddedFabric;
use rnic_verbs::cm::embedded::run_until;
use rnic_verbs::cm::{
    CmConfig, CmEvent, CmEventKind, CmId, ConnParam, ConnectionManager, EventChannel, FabricNeighbours, PortSpace,
};
use rnic_verbs::{Context, Mtu, QpState, QueuePair};

use crate::bench::BenchError;

/// The RDMA-CM port the responder listens on (perftest's default).
pub const PORT: u16 = 18515;
/// READ/atomic depth both sides ask for (as `rnic-bench` announces to perftest).
const RESOURCES: u8 = 16;
/// Virtual time any one exchange may take: far beyond Linux's 16 REQs 6 s apart.
const EXCHANGE_LIMIT_NS: u64 = 300_000_000_000;

fn failed(what: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("connection manager: {what}"))
}

/// One NIC's connection manager and event channel.
struct Endpoint {
    cm: ConnectionManager,
    channel: EventChannel,
    ip: IpAddr,
}

impl Endpoint {
    fn new(context: &Context, fabric: &EmbeddedFabric, seed: u64, mtu: Mtu) -> Result<Self, BenchError> {
        // The in-process wire has microsecond round trips: a packet lifetime of 2^8 × 4 µs
        // makes the local ACK timeout the device's own ACK delay (15, 134 ms) instead of
        // Linux's 19 (2.1 s), which a lossy run would spend waiting.
        let config = CmConfig {
            max_path_mtu: mtu,
            packet_lifetime: 8,
            ..CmConfig::seeded(seed)
        };
        let cm = ConnectionManager::new(config);
        cm.add_device(context, Arc::new(FabricNeighbours(fabric.clone())))
            .map_err(failed)?;
        let channel = cm.create_event_channel().map_err(failed)?;
        let ip = IpAddr::from(context.query_gid(1, 0)?.raw());
        Ok(Self { cm, channel, ip })
    }
}

/// The connected session: ids to disconnect at the end.
pub(crate) struct CmSession {
    fabric: EmbeddedFabric,
    requester: Endpoint,
    responder: Endpoint,
    listener: CmId,
    pairs: Vec<(CmId, CmId)>,
}

impl CmSession {
    fn managers(&self) -> [&ConnectionManager; 2] {
        [&self.requester.cm, &self.responder.cm]
    }

    /// Runs both managers until `channel` has an event of `kind` for `id` (any id when
    /// `None`); other events are not expected here and fail the run.
    fn wait(&self, requester_side: bool, kind: CmEventKind) -> Result<CmEvent, BenchError> {
        let endpoint = if requester_side {
            &self.requester
        } else {
            &self.responder
        };
        let mut found = None;
        let managers = self.managers();
        let done = run_until(&self.fabric, &managers, EXCHANGE_LIMIT_NS, || {
            if found.is_none() {
                found = endpoint.channel.get_event();
            }
            found.is_some()
        });
        let event = found
            .filter(|_| done)
            .ok_or_else(|| failed(format!("no {kind} in time")))?;
        if event.kind != kind {
            return Err(failed(format!(
                "{} (status {}) instead of {kind}",
                event.kind, event.status
            )));
        }
        Ok(event)
    }

    /// Connects `qps` (requester QP, responder QP) pairwise, in order.
    pub(crate) fn connect(
        fabric: &EmbeddedFabric,
        requester: &Context,
        responder: &Context,
        qps: &[(&QueuePair, &QueuePair)],
        mtu: Mtu,
    ) -> Result<Self, BenchError> {
        let requester = Endpoint::new(requester, fabric, 0x0005_EEDA, mtu)?;
        let responder = Endpoint::new(responder, fabric, 0x0005_EEDB, mtu)?;
        let listener = responder.channel.create_id(0, PortSpace::Tcp).map_err(failed)?;
        listener
            .bind_addr(SocketAddr::new(responder.ip, PORT))
            .map_err(failed)?;
        listener.listen(0).map_err(failed)?;
        let mut session = Self {
            fabric: fabric.clone(),
            requester,
            responder,
            listener,
            pairs: Vec::with_capacity(qps.len()),
        };
        for (index, (requester_qp, responder_qp)) in qps.iter().enumerate() {
            let pair = session.connect_one(index, requester_qp, responder_qp)?;
            session.pairs.push(pair);
        }
        Ok(session)
    }

    fn connect_one(
        &self,
        index: usize,
        requester_qp: &QueuePair,
        responder_qp: &QueuePair,
    ) -> Result<(CmId, CmId), BenchError> {
        let active = self
            .requester
            .channel
            .create_id(index as u64, PortSpace::Tcp)
            .map_err(failed)?;
        active
            .resolve_addr(None, SocketAddr::new(self.responder.ip, PORT), 2000)
            .map_err(failed)?;
        self.wait(true, CmEventKind::AddrResolved)?;
        active.resolve_route(2000).map_err(failed)?;
        self.wait(true, CmEventKind::RouteResolved)?;
        let param = |qp: &QueuePair| conn_param(index, qp);
        active.connect(&param(requester_qp)).map_err(failed)?;
        let request = self.wait(false, CmEventKind::ConnectRequest)?;
        if request.private_data[..4] != (index as u32).to_be_bytes() {
            return Err(failed("the REQ's private data is not the pair's index"));
        }
        let passive = request.id;
        move_qp(&passive, responder_qp)?;
        passive.accept(&param(responder_qp)).map_err(failed)?;
        self.wait(true, CmEventKind::ConnectResponse)?;
        move_qp(&active, requester_qp)?;
        active.establish().map_err(failed)?;
        self.wait(false, CmEventKind::Established)?;
        Ok((active, passive))
    }

    /// Disconnects every pair (the requester first, the responder answering), then
    /// destroys the ids. Returns the MADs both managers sent.
    pub(crate) fn disconnect(self) -> Result<u64, BenchError> {
        for (active, passive) in &self.pairs {
            active.disconnect().map_err(failed)?;
            let event = self.wait(false, CmEventKind::Disconnected)?;
            if event.id != *passive {
                return Err(failed("DISCONNECTED for another pair"));
            }
            passive.disconnect().map_err(failed)?;
            self.wait(true, CmEventKind::Disconnected)?;
        }
        for (active, passive) in &self.pairs {
            active.destroy().map_err(failed)?;
            passive.destroy().map_err(failed)?;
        }
        self.listener.destroy().map_err(failed)?;
        Ok(self.requester.cm.counters().sent + self.responder.cm.counters().sent)
    }
}

/// Moves an application's QP to RTS with the connection's attributes.
fn move_qp(id: &CmId, qp: &QueuePair) -> Result<(), BenchError> {
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (attributes, mask) = id.init_qp_attr(state).map_err(failed)?;
        qp.modify(&attributes, mask)?;
    }
    Ok(())
}

/// `rnic-bench --cm` across processes: one side's connection manager, run on the wall
/// clock by [`EventChannel::wait_event`] (the NIC is another process's, reached over
/// vfio-user or PCI). The server listens before it tells the client its buffers, so no
/// REQ meets an empty port; the client connects each QP, in order, with its index as the
/// REQ's private data.
pub(crate) struct RemoteCm {
    cm: ConnectionManager,
    channel: EventChannel,
    listener: Option<CmId>,
    ids: Vec<CmId>,
}

/// Wall time any one exchange may take (a REQ repeats every 6 s).
const REMOTE_EXCHANGE: std::time::Duration = std::time::Duration::from_secs(30);

impl RemoteCm {
    /// A connection manager on `context`; `peer` names the peer's MAC if known.
    pub(crate) fn new(context: &Context, peer: Option<(IpAddr, [u8; 6])>, mtu: Mtu) -> Result<Self, BenchError> {
        let table = Arc::new(rnic_verbs::cm::StaticNeighbours::new());
        if let Some((ip, mac)) = peer {
            table.insert(ip, mac);
        }
        let cm = ConnectionManager::new(CmConfig {
            max_path_mtu: mtu,
            ..CmConfig::default()
        });
        cm.add_device(context, Arc::new(rnic_verbs::cm::Neighbours::host(table)))
            .map_err(failed)?;
        let channel = cm.create_event_channel().map_err(failed)?;
        Ok(Self {
            cm,
            channel,
            listener: None,
            ids: Vec::new(),
        })
    }

    fn next(&self, kind: CmEventKind) -> Result<CmEvent, BenchError> {
        let event = self
            .channel
            .wait_event(REMOTE_EXCHANGE)
            .ok_or_else(|| failed(format!("no {kind} within {REMOTE_EXCHANGE:?}")))?;
        if event.kind != kind {
            return Err(failed(format!(
                "{} (status {}) instead of {kind}",
                event.kind, event.status
            )));
        }
        Ok(event)
    }

    /// The server: listens on `address`.
    pub(crate) fn listen(&mut self, address: SocketAddr) -> Result<(), BenchError> {
        let listener = self.channel.create_id(0, PortSpace::Tcp).map_err(failed)?;
        listener.bind_addr(address).map_err(failed)?;
        listener.listen(0).map_err(failed)?;
        self.listener = Some(listener);
        Ok(())
    }

    /// The server: accepts one REQ per QP, each naming its QP's index.
    pub(crate) fn accept_all(&mut self, qps: &[&QueuePair]) -> Result<(), BenchError> {
        let mut passive: Vec<Option<CmId>> = vec![None; qps.len()];
        let mut established = 0;
        // The client connects one QP after the other: a QP's ESTABLISHED (its RTU) comes
        // before the next one's CONNECT_REQUEST.
        while established < qps.len() {
            let event = self
                .channel
                .wait_event(REMOTE_EXCHANGE)
                .ok_or_else(|| failed(format!("no connection event within {REMOTE_EXCHANGE:?}")))?;
            match event.kind {
                CmEventKind::ConnectRequest => {
                    let index = event
                        .private_data
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                        .filter(|i| *i < qps.len() && passive[*i].is_none())
                        .ok_or_else(|| failed("a REQ without a new QP index"))?;
                    move_qp(&event.id, qps[index])?;
                    event.id.accept(&conn_param(index, qps[index])).map_err(failed)?;
                    passive[index] = Some(event.id);
                }
                CmEventKind::Established => established += 1,
                other => return Err(failed(format!("{other} (status {}) while accepting", event.status))),
            }
        }
        self.ids = passive.into_iter().flatten().collect();
        Ok(())
    }

    /// The client: connects each QP to the server at `server`.
    pub(crate) fn connect_all(&mut self, server: SocketAddr, qps: &[&QueuePair]) -> Result<(), BenchError> {
        for (index, qp) in qps.iter().enumerate() {
            let id = self.channel.create_id(index as u64, PortSpace::Tcp).map_err(failed)?;
            id.resolve_addr(None, server, 2000).map_err(failed)?;
            self.next(CmEventKind::AddrResolved)?;
            id.resolve_route(2000).map_err(failed)?;
            self.next(CmEventKind::RouteResolved)?;
            id.connect(&conn_param(index, qp)).map_err(failed)?;
            self.next(CmEventKind::ConnectResponse)?;
            move_qp(&id, qp)?;
            id.establish().map_err(failed)?;
            self.ids.push(id);
        }
        Ok(())
    }

    /// Ends every connection: the client disconnects and waits for the DREPs, the server
    /// answers the DREQs. Returns the MADs this side sent.
    pub(crate) fn disconnect_all(self, initiator: bool) -> Result<u64, BenchError> {
        if initiator {
            for id in &self.ids {
                id.disconnect().map_err(failed)?;
            }
            for _ in &self.ids {
                self.next(CmEventKind::Disconnected)?;
            }
        } else {
            for _ in &self.ids {
                let event = self.next(CmEventKind::Disconnected)?;
                event.id.disconnect().map_err(failed)?;
            }
        }
        for id in self.ids.iter().chain(&self.listener) {
            id.destroy().map_err(failed)?;
        }
        // A last pass sends what the destroys queued.
        self.cm.progress();
        Ok(self.cm.counters().sent)
    }
}

fn conn_param(index: usize, qp: &QueuePair) -> ConnParam {
    ConnParam {
        private_data: (index as u32).to_be_bytes().to_vec(),
        responder_resources: RESOURCES,
        initiator_depth: RESOURCES,
        qp_num: qp.qp_num(),
        ..ConnParam::default()
    }
}
