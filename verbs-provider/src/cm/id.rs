//! `struct rdma_cm_id`: one endpoint, listening or connecting.

use std::net::SocketAddr;
use std::sync::Arc;

use super::address::Route;
use super::channel::EventChannel;
use super::core::{IdKey, IdQp, QpRequest};
use super::error::{CmError, Result};
use super::event::ConnParam;
use super::mad::PortSpace;
use super::manager::Shared;
use crate::verbs::{
    AsyncEvent, AsyncEventKind, CompletionQueue, Context, ProtectionDomain, QpAttributeMask, QpAttributes,
    QpCapabilities, QpState, QueuePair, SharedReceiveQueue,
};

/// An id of the connection manager (librdmacm's `struct rdma_cm_id *`): a cheap handle,
/// cloned freely; the id itself lives until [`CmId::destroy`].
#[derive(Clone)]
pub struct CmId {
    shared: Arc<Shared>,
    key: IdKey,
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared) && self.key == other.key
    }
}

impl Eq for CmId {}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmId({})", self.key)
    }
}

/// What [`CmId::create_qp`] needs (`struct ibv_qp_init_attr` for `rdma_create_qp`): the
/// CQs the QP completes to, or `None` to have the id make them (librdmacm does the same).
#[derive(Debug, Clone, Copy, Default)]
pub struct CmQpInit<'a> {
    /// The protection domain; `None`: the connection manager's own on that device.
    pub pd: Option<&'a ProtectionDomain>,
    /// Send CQ; `None`: a new one of `max_send_wr` entries, owned by the id.
    pub send_cq: Option<&'a CompletionQueue>,
    /// Receive CQ; `None`: a new one of `max_recv_wr` entries, owned by the id.
    pub recv_cq: Option<&'a CompletionQueue>,
    /// A shared receive queue.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// Queue sizes.
    pub cap: QpCapabilities,
    /// Every send completes with a work completion.
    pub sq_sig_all: bool,
}

impl CmId {
    pub(crate) fn new(shared: Arc<Shared>, key: IdKey) -> Self {
        Self { shared, key }
    }

    fn run<R>(&self, f: impl FnOnce(&mut super::core::Core, IdKey, u64) -> Result<R>) -> Result<R> {
        let key = self.key;
        self.shared.with(|core, now| f(core, key, now))
    }

    fn read<R>(&self, f: impl FnOnce(&super::core::IdEntry) -> R) -> Result<R> {
        let core = self.shared.lock();
        core.ids.get(&self.key).map(f).ok_or(CmError::NoSuchId)
    }

    /// A number identifying the id within its connection manager.
    pub fn handle(&self) -> u64 {
        self.key
    }

    /// The caller's value given at creation (`id->context`).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`] after destroy.
    pub fn context(&self) -> Result<u64> {
        self.read(|e| e.context)
    }

    /// Replaces the caller's value.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn set_context(&self, context: u64) -> Result<()> {
        self.run(|core, key, _| core.set_context(key, context))
    }

    /// The port space.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn port_space(&self) -> Result<PortSpace> {
        self.read(|e| e.port_space)
    }

    /// The id's state, in the IB CM's words (for logs and tests).
    pub fn state(&self) -> String {
        self.shared.lock().state_name(self.key)
    }

    /// Our address and port (`rdma_get_local_addr`, `rdma_get_src_port`).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn local_addr(&self) -> Result<Option<SocketAddr>> {
        self.read(|e| e.source)
    }

    /// The peer's address and port (`rdma_get_peer_addr`, `rdma_get_dst_port`).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn peer_addr(&self) -> Result<Option<SocketAddr>> {
        self.read(|e| e.destination)
    }

    /// The IB CM communication IDs of the id's connection, (local, remote), once a REQ
    /// went out or came in (for logs and captures: they are the CM messages' first
    /// fields).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn communication_ids(&self) -> Result<Option<(u32, u32)>> {
        self.read(|e| match &e.state {
            super::state::IdState::Connection(c) => Some((c.local_comm_id, c.remote_comm_id)),
            _ => None,
        })
    }

    /// The resolved route (`id->route`).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn route(&self) -> Result<Option<Route>> {
        self.read(|e| e.route)
    }

    /// The device the id is bound to (`id->verbs`).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn device(&self) -> Result<Option<Context>> {
        let core = self.shared.lock();
        let entry = core.ids.get(&self.key).ok_or(CmError::NoSuchId)?;
        Ok(entry
            .device
            .and_then(|d| core.devices.get(d).and_then(Option::as_ref))
            .map(|slot| slot.agent.context.clone()))
    }

    /// Sets the type of service of the id's path (`rdma_set_option(RDMA_OPTION_ID_TOS)`);
    /// before [`CmId::resolve_route`].
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn set_tos(&self, tos: u8) -> Result<()> {
        self.run(|core, key, _| core.set_tos(key, tos))
    }

    /// Makes the id family-only (`rdma_set_option(RDMA_OPTION_ID_AFONLY)`, like
    /// `IPV6_V6ONLY`): bound to a wildcard, it shares its port with the other family's
    /// family-only ids and takes only its own family's requests. Without it an IPv4 id is
    /// family-only and an IPv6 id is not, as on Linux with `net.ipv6.bindv6only = 0`.
    /// Before [`CmId::listen`] or a connect.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`]; a wrong state.
    pub fn set_afonly(&self, afonly: bool) -> Result<()> {
        self.run(|core, key, _| core.set_afonly(key, afonly))
    }

    /// `rdma_bind_addr`: a local address (unspecified: any device) and port (0: a free
    /// one).
    ///
    /// # Errors
    /// [`CmError::AddressNotAvailable`], [`CmError::AddressInUse`] (the same address and
    /// port), [`CmError::AddressOverlaps`] (a wildcard on the same port; see
    /// [`CmId::set_afonly`]), or a wrong state.
    pub fn bind_addr(&self, address: SocketAddr) -> Result<()> {
        self.run(|core, key, _| core.bind(key, address))
    }

    /// `rdma_resolve_addr`: the device, our address and the peer's MAC; ADDR_RESOLVED or
    /// ADDR_ERROR follows.
    ///
    /// # Errors
    /// No device for the source, a wrong state.
    pub fn resolve_addr(&self, source: Option<SocketAddr>, destination: SocketAddr, timeout_ms: u64) -> Result<()> {
        self.run(|core, key, now| core.resolve_addr(key, source, destination, timeout_ms, now))
    }

    /// `rdma_resolve_route`: RoCE has no subnet administrator; the path is built from the
    /// addresses (Linux's `cma_resolve_iboe_route`). ROUTE_RESOLVED follows.
    ///
    /// # Errors
    /// A wrong state.
    pub fn resolve_route(&self, _timeout_ms: u64) -> Result<()> {
        self.run(|core, key, _| core.resolve_route(key))
    }

    /// `rdma_listen`. An unbound id listens on every address and a free port;
    /// `backlog` bounds the CONNECT_REQUESTs not yet accepted or rejected (0: no bound).
    ///
    /// # Errors
    /// A wrong state, [`CmError::AddressInUse`].
    pub fn listen(&self, backlog: u32) -> Result<()> {
        self.run(|core, key, _| core.listen(key, backlog))
    }

    /// `rdma_create_qp`: a QP for the connection (RC for the TCP port space, UD for UDP)
    /// on the id's device, left in INIT (UD: in RTS with Q_Key 0x01234567), which the
    /// connection manager then moves with the negotiated values.
    ///
    /// # Errors
    /// No device yet, a QP already, or what the verbs layer refuses.
    pub fn create_qp(&self, init: &CmQpInit<'_>) -> Result<()> {
        self.run(|core, key, _| {
            core.create_qp(
                key,
                QpRequest {
                    pd: init.pd,
                    send_cq: init.send_cq,
                    recv_cq: init.recv_cq,
                    srq: init.srq,
                    cap: init.cap,
                    sq_sig_all: init.sq_sig_all,
                },
            )
        })
    }

    /// `rdma_destroy_qp`.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn destroy_qp(&self) -> Result<()> {
        self.run(|core, key, _| core.destroy_qp(key))
    }

    fn with_qp<R>(&self, f: impl FnOnce(&IdQp) -> R) -> Result<Option<R>> {
        self.read(|e| e.qp.as_ref().map(f))
    }

    /// The id's QP (`id->qp`).
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn qp(&self) -> Result<Option<Arc<QueuePair>>> {
        self.with_qp(|qp| qp.qp.clone())
    }

    /// The send CQ the id made for its QP (`id->send_cq`), if it made one.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn send_cq(&self) -> Result<Option<Arc<CompletionQueue>>> {
        Ok(self.with_qp(|qp| qp.send_cq.clone())?.flatten())
    }

    /// The receive CQ the id made for its QP (`id->recv_cq`), if it made one.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn recv_cq(&self) -> Result<Option<Arc<CompletionQueue>>> {
        Ok(self.with_qp(|qp| qp.recv_cq.clone())?.flatten())
    }

    /// `rdma_connect`: REQ (RC) or SIDR_REQ (UD) to the resolved peer.
    ///
    /// # Errors
    /// A wrong state, too much private data.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        self.run(|core, key, now| core.connect(key, param, now))
    }

    /// `rdma_accept` on the id of a CONNECT_REQUEST: with a QP, moves it to RTS and sends
    /// REP (ESTABLISHED follows the RTU); UD: SIDR_REP with the QP's number and Q_Key.
    ///
    /// # Errors
    /// A wrong state, too much private data, a QP that refuses the values.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        self.run(|core, key, now| core.accept(key, param, now))
    }

    /// `rdma_reject`: REJ with reason 28 (consumer defined) and `private_data` (UD: a
    /// SIDR_REP with status reject).
    ///
    /// # Errors
    /// A wrong state, more than 148 bytes of private data.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.run(|core, key, now| core.reject(key, private_data, now))
    }

    /// `rdma_disconnect`: the QP to ERR and DREQ (DREP if the peer's DREQ came first).
    ///
    /// # Errors
    /// A wrong state.
    pub fn disconnect(&self) -> Result<()> {
        self.run(|core, key, now| core.disconnect(key, now))
    }

    /// `rdma_establish`: after CONNECT_RESPONSE, once the application moved its own QP
    /// to RTS ([`CmId::init_qp_attr`]), sends the RTU.
    ///
    /// # Errors
    /// A wrong state.
    pub fn establish(&self) -> Result<()> {
        self.run(|core, key, _| core.establish(key))
    }

    /// `rdma_init_qp_attr`: the attributes and mask that move a QP of the application's
    /// own to `state` for this connection.
    ///
    /// # Errors
    /// A wrong state.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttributes, QpAttributeMask)> {
        let core = self.shared.lock();
        core.init_qp_attr(self.key, state)
    }

    /// `rdma_notify`: tells the connection manager of an asynchronous event of the id's
    /// QP; communication established (the first packet arrived) completes a connection
    /// whose RTU was lost.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] for other events.
    pub fn notify(&self, event: &AsyncEvent) -> Result<()> {
        match event.event_type {
            AsyncEventKind::CommunicationEstablished => self.run(|core, key, _| core.communication_established(key)),
            other => Err(CmError::InvalidArgument(format!("rdma_notify of {other:?}"))),
        }
    }

    /// `rdma_migrate_id`: future events of the id go to `channel`.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`].
    pub fn migrate(&self, channel: &EventChannel) -> Result<()> {
        let weak = Arc::downgrade(&channel.inner);
        self.run(|core, key, _| core.migrate(key, weak))
    }

    /// `rdma_destroy_id`: sends what the state asks for (REJ, DREQ, DREP, SIDR_REP), then
    /// destroys the id with its QP and the CQs it made. Handles still held fail with
    /// [`CmError::NoSuchId`] afterwards.
    ///
    /// # Errors
    /// [`CmError::NoSuchId`] when it is gone already.
    pub fn destroy(&self) -> Result<()> {
        self.run(|core, key, now| core.destroy_id(key, now))
    }
}
