//! The connection seam over the RDMA connection manager of `rnic-verbs` (IB CM on QP1
//! with RDMA-CM addressing, librdmacm-shaped): what talks to Linux's `rdma_cm`, and what
//! puts REQ/REP/RTU on the wire so Wireshark can follow a session.
//!
//! The protocol's QPs are its own (created in RESET by the queue logic), so this uses
//! librdmacm's "QP of the application's own" path: the active side connects with the QP
//! number, moves its QP through INIT → RTR → RTS with [`CmId::init_qp_attr`] on
//! CONNECT_RESPONSE and calls [`CmId::establish`] (the RTU); the passive side moves its QP
//! to RTR before `accept` (the REP) and to RTS after it.
//!
//! One [`RdmaCm`] per NIC: a connection manager with that device and one event channel,
//! whose events are routed to the listener, pending connections and connections they
//! belong to whenever any of them is polled (which also runs the connection manager).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_verbs::cm::{
    CmConfig, CmEvent, CmEventKind, CmId, ConnParam, ConnectionManager, EventChannel, NeighbourResolver, PortSpace,
};
use rnic_verbs::{Context, QpAttributeMask, QpAttributes, QpState, QueuePair};

use super::connection::{
    AcceptParams, ConnectParams, ConnectResult, Connection, ConnectionError, Connector, Established, IncomingRequest,
    Listener, PendingConnect, ServiceAddress,
};

/// Address and route resolution timeouts, ms.
const RESOLVE_TIMEOUT_MS: u64 = 2000;
/// REJ reason "invalid service ID": nobody listens.
const REJECT_NO_LISTENER: i32 = 8;
/// REJ reason "stale connection".
const REJECT_STALE_CONNECTION: i32 = 10;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct Routes {
    /// Events by the id they are about.
    by_id: HashMap<u64, VecDeque<CmEvent>>,
    /// CONNECT_REQUESTs by the listening id.
    requests: HashMap<u64, VecDeque<CmEvent>>,
}

struct Shared {
    manager: ConnectionManager,
    channel: EventChannel,
    routes: Mutex<Routes>,
}

impl Shared {
    /// Runs the connection manager and routes every event waiting.
    fn pump(&self) {
        while let Some(event) = self.channel.get_event() {
            let mut routes = lock(&self.routes);
            if event.kind == CmEventKind::ConnectRequest {
                if let Some(listener) = event.listen_id.as_ref().map(CmId::handle) {
                    if let Some(queue) = routes.requests.get_mut(&listener) {
                        queue.push_back(event);
                        continue;
                    }
                }
                // No listener of ours wants it: refuse.
                let id = event.id.clone();
                drop(routes);
                let _ = id.reject(&[]);
                let _ = id.destroy();
                continue;
            }
            if let Some(queue) = routes.by_id.get_mut(&event.id.handle()) {
                queue.push_back(event);
            }
            // Events of ids nobody follows any more (TIMEWAIT_EXIT after a drop) go.
        }
    }

    fn next_event(&self, id: &CmId) -> Option<CmEvent> {
        self.pump();
        lock(&self.routes).by_id.get_mut(&id.handle())?.pop_front()
    }

    fn follow(&self, id: &CmId) {
        lock(&self.routes).by_id.entry(id.handle()).or_default();
    }

    fn forget(&self, id: &CmId) {
        lock(&self.routes).by_id.remove(&id.handle());
    }
}

/// The RDMA connection manager of one NIC.
#[derive(Clone)]
pub struct RdmaCm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RdmaCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaCm").finish_non_exhaustive()
    }
}

impl RdmaCm {
    /// A connection manager for `context`'s NIC, finding peers' MACs with `neighbours`.
    ///
    /// # Errors
    /// What the connection manager refuses (QP1 of the device).
    pub fn new(
        context: &Context,
        neighbours: Arc<dyn NeighbourResolver>,
        config: CmConfig,
    ) -> Result<Self, ConnectionError> {
        let manager = ConnectionManager::new(config);
        manager
            .add_device(context, neighbours)
            .map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        let channel = manager
            .create_event_channel()
            .map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        Ok(Self {
            shared: Arc::new(Shared {
                manager,
                channel,
                routes: Mutex::new(Routes::default()),
            }),
        })
    }

    /// The connection manager (its counters, its progress thread).
    pub fn manager(&self) -> &ConnectionManager {
        &self.shared.manager
    }

    /// Listens on `address` (TCP port space).
    ///
    /// # Errors
    /// [`ConnectionError::AddressInUse`] or what the connection manager refuses.
    pub fn listen(&self, address: ServiceAddress) -> Result<RdmaCmListener, ConnectionError> {
        let id = self
            .shared
            .channel
            .create_id(0, PortSpace::Tcp)
            .map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        id.bind_addr(SocketAddr::new(IpAddr::V4(address.ip), address.port))
            .map_err(|e| match e.to_string() {
                text if text.contains("in use") => ConnectionError::AddressInUse(address),
                text => ConnectionError::Invalid(format!("binding {address}: {text}")),
            })?;
        id.listen(128).map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        lock(&self.shared.routes).requests.insert(id.handle(), VecDeque::new());
        Ok(RdmaCmListener {
            shared: self.shared.clone(),
            id,
            address,
        })
    }

    /// A connector for the active side.
    pub fn connector(&self) -> RdmaCmConnector {
        RdmaCmConnector {
            shared: self.shared.clone(),
        }
    }
}

fn modify_to(id: &CmId, qp: &QueuePair, state: QpState) -> Result<(), ConnectionError> {
    let (attributes, mask) = id
        .init_qp_attr(state)
        .map_err(|e| ConnectionError::Verbs(format!("init_qp_attr({state}): {e}")))?;
    qp.modify(&attributes, mask)
        .map_err(|e| ConnectionError::Verbs(format!("QP to {state}: {e}")))
}

fn conn_param(
    private_data: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
    retry: u8,
    rnr: u8,
    qp: &QueuePair,
) -> ConnParam {
    ConnParam {
        private_data: private_data.to_vec(),
        responder_resources,
        initiator_depth,
        flow_control: true,
        retry_count: retry,
        rnr_retry_count: rnr,
        srq: false,
        qp_num: qp.qp_num(),
    }
}

/// The passive side on one address.
pub struct RdmaCmListener {
    shared: Arc<Shared>,
    id: CmId,
    address: ServiceAddress,
}

impl Drop for RdmaCmListener {
    fn drop(&mut self) {
        lock(&self.shared.routes).requests.remove(&self.id.handle());
        let _ = self.id.destroy();
    }
}

impl Listener for RdmaCmListener {
    fn address(&self) -> ServiceAddress {
        self.address
    }

    fn poll_request(&mut self) -> Option<Box<dyn IncomingRequest>> {
        self.shared.pump();
        let event = lock(&self.shared.routes)
            .requests
            .get_mut(&self.id.handle())?
            .pop_front()?;
        let peer = match event.id.peer_addr() {
            Ok(Some(address)) => format!("{address} QP {}", event.conn.qp_num),
            _ => format!("QP {}", event.conn.qp_num),
        };
        self.shared.follow(&event.id);
        Some(Box::new(RdmaCmRequest {
            shared: self.shared.clone(),
            peer,
            event,
        }))
    }
}

struct RdmaCmRequest {
    shared: Arc<Shared>,
    peer: String,
    event: CmEvent,
}

impl IncomingRequest for RdmaCmRequest {
    fn private_data(&self) -> &[u8] {
        &self.event.private_data
    }

    // The event gives the values from this side's point of view (as Linux does): what the
    // requester offered as responder resources is this side's initiator depth.
    #[allow(clippy::misnamed_getters)]
    fn responder_resources(&self) -> u8 {
        self.event.conn.initiator_depth
    }

    #[allow(clippy::misnamed_getters)]
    fn initiator_depth(&self) -> u8 {
        self.event.conn.responder_resources
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn accept(
        self: Box<Self>,
        _context: &Context,
        qp: &QueuePair,
        params: &AcceptParams,
    ) -> Result<Box<dyn Connection>, ConnectionError> {
        let id = self.event.id.clone();
        let result = modify_to(&id, qp, QpState::Init)
            .and_then(|()| modify_to(&id, qp, QpState::Rtr))
            .and_then(|()| {
                id.accept(&conn_param(
                    &params.private_data,
                    params.responder_resources,
                    params.initiator_depth,
                    7,
                    params.rnr_retry_count,
                    qp,
                ))
                .map_err(|e| ConnectionError::Verbs(format!("accept: {e}")))
            })
            .and_then(|()| modify_to(&id, qp, QpState::Rts));
        if let Err(e) = result {
            let _ = id.reject(&[]);
            self.shared.forget(&id);
            let _ = id.destroy();
            return Err(e);
        }
        Ok(Box::new(RdmaCmConnection {
            shared: self.shared.clone(),
            id,
            disconnected: false,
            acknowledged: false,
        }))
    }

    fn reject(self: Box<Self>, private_data: &[u8]) {
        let id = self.event.id.clone();
        let _ = id.reject(private_data);
        self.shared.forget(&id);
        let _ = id.destroy();
    }
}

/// The active side.
pub struct RdmaCmConnector {
    shared: Arc<Shared>,
}

impl Connector for RdmaCmConnector {
    fn connect(
        &mut self,
        _context: &Context,
        _qp: &QueuePair,
        params: &ConnectParams,
    ) -> Result<Box<dyn PendingConnect>, ConnectionError> {
        let id = self
            .shared
            .channel
            .create_id(0, PortSpace::Tcp)
            .map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        self.shared.follow(&id);
        let destination = SocketAddr::new(IpAddr::V4(params.destination.ip), params.destination.port);
        if let Err(e) = id.resolve_addr(None, destination, RESOLVE_TIMEOUT_MS) {
            self.shared.forget(&id);
            let _ = id.destroy();
            return Err(ConnectionError::Invalid(format!("resolving {destination}: {e}")));
        }
        Ok(Box::new(RdmaCmPending {
            shared: self.shared.clone(),
            id: Some(id),
            params: params.clone(),
            stage: Stage::Address,
        }))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Address,
    Route,
    Response,
    Established,
}

struct RdmaCmPending {
    shared: Arc<Shared>,
    id: Option<CmId>,
    params: ConnectParams,
    stage: Stage,
}

impl RdmaCmPending {
    fn fail(&mut self, error: ConnectionError) -> Option<ConnectResult> {
        if let Some(id) = self.id.take() {
            self.shared.forget(&id);
            let _ = id.destroy();
        }
        Some(Err(error))
    }
}

impl PendingConnect for RdmaCmPending {
    fn poll(&mut self, qp: &QueuePair) -> Option<ConnectResult> {
        let id = self.id.clone()?;
        while let Some(event) = self.shared.next_event(&id) {
            let destination = self.params.destination;
            match (self.stage, event.kind) {
                (Stage::Address, CmEventKind::AddrResolved) => {
                    if let Err(e) = id.resolve_route(RESOLVE_TIMEOUT_MS) {
                        return self.fail(ConnectionError::Invalid(format!("route to {destination}: {e}")));
                    }
                    self.stage = Stage::Route;
                }
                (Stage::Route, CmEventKind::RouteResolved) => {
                    let param = conn_param(
                        &self.params.private_data,
                        self.params.responder_resources,
                        self.params.initiator_depth,
                        self.params.retry_count,
                        self.params.rnr_retry_count,
                        qp,
                    );
                    if let Err(e) = id.connect(&param) {
                        return self.fail(ConnectionError::Invalid(format!("connect to {destination}: {e}")));
                    }
                    self.stage = Stage::Response;
                }
                (Stage::Response, CmEventKind::ConnectResponse) => {
                    let moved = modify_to(&id, qp, QpState::Init)
                        .and_then(|()| modify_to(&id, qp, QpState::Rtr))
                        .and_then(|()| modify_to(&id, qp, QpState::Rts));
                    if let Err(e) = moved {
                        return self.fail(e);
                    }
                    if let Err(e) = id.establish() {
                        return self.fail(ConnectionError::Verbs(format!("establish: {e}")));
                    }
                    self.stage = Stage::Established;
                    // This side's view, swapped back to the peer's.
                    let established = Established {
                        private_data: event.private_data.clone(),
                        responder_resources: event.conn.initiator_depth,
                        initiator_depth: event.conn.responder_resources,
                    };
                    self.id = None;
                    return Some(Ok((
                        established,
                        Box::new(RdmaCmConnection {
                            shared: self.shared.clone(),
                            id,
                            disconnected: false,
                            acknowledged: false,
                        }) as Box<dyn Connection>,
                    )));
                }
                (_, CmEventKind::Rejected) if event.status == REJECT_NO_LISTENER => {
                    return self.fail(ConnectionError::Unreachable(destination));
                }
                (_, CmEventKind::Rejected) if event.status == REJECT_STALE_CONNECTION => {
                    return self.fail(ConnectionError::Stale(destination));
                }
                (_, CmEventKind::Rejected) => {
                    return self.fail(ConnectionError::Rejected {
                        private_data: event.private_data.clone(),
                    });
                }
                (_, CmEventKind::Unreachable) => {
                    return self.fail(ConnectionError::TimedOut(destination));
                }
                (_, CmEventKind::AddrError | CmEventKind::RouteError) => {
                    return self.fail(ConnectionError::Invalid(format!(
                        "{} for {destination} (status {})",
                        event.kind.name(),
                        event.status
                    )));
                }
                (_, kind) => {
                    return self.fail(ConnectionError::Invalid(format!(
                        "{} while connecting to {destination} (status {})",
                        kind.name(),
                        event.status
                    )));
                }
            }
        }
        None
    }
}

impl Drop for RdmaCmPending {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.shared.forget(&id);
            let _ = id.destroy();
        }
    }
}

struct RdmaCmConnection {
    shared: Arc<Shared>,
    id: CmId,
    disconnected: bool,
    acknowledged: bool,
}

impl Connection for RdmaCmConnection {
    fn is_disconnected(&mut self) -> bool {
        while let Some(event) = self.shared.next_event(&self.id) {
            if matches!(event.kind, CmEventKind::Disconnected | CmEventKind::DeviceRemoval) {
                self.disconnected = true;
            }
        }
        self.disconnected
    }

    fn disconnect_acknowledged(&mut self) -> bool {
        while let Some(event) = self.shared.next_event(&self.id) {
            if matches!(
                event.kind,
                CmEventKind::Disconnected | CmEventKind::TimewaitExit | CmEventKind::DeviceRemoval
            ) {
                self.acknowledged = true;
            }
        }
        self.acknowledged
    }

    fn disconnect(&mut self, qp: &QueuePair) {
        if self.disconnected {
            // The peer went first: our DREP is the answer, nothing to wait for.
            self.acknowledged = true;
        }
        let _ = self.id.disconnect();
        let _ = qp.modify(
            &QpAttributes {
                qp_state: QpState::Err,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE,
        );
        self.disconnected = true;
    }
}

impl Drop for RdmaCmConnection {
    fn drop(&mut self) {
        self.shared.forget(&self.id);
        // Sends what the state asks for (DREQ, DREP) and lets the id go.
        let _ = self.id.destroy();
    }
}
