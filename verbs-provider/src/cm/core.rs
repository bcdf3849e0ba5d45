//! The deterministic heart of the connection manager: every id, the tables that match
//! incoming MADs to them, the timers, and what each command and each MAD does. It reads
//! no clock (the caller passes `now`, the device's time in nanoseconds) and draws every
//! identifier from its seeded generator, so the same inputs give the same MADs and events.
//!
//! The rules are Linux's (`drivers/infiniband/core/cm.c` for the IB CM, `cma.c` for the
//! RDMA-CM layer), summarised in docs/architecture.md, "The connection manager".

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Weak};

use super::address::{flow_label, gid_to_ip, ip_to_gid, Neighbour, Route};
use super::agent::{GsiAgent, MadPeer, ReceivedMad};
use super::channel::ChannelInner;
use super::config::{ack_timeout, iba_time_ns, CmConfig, Rng, MAX_RESOURCES, RDMA_UDP_QKEY};
use super::error::{CmError, Result, EHOSTUNREACH, ETIMEDOUT};
use super::event::{CmEventKind, ConnEventParam, ConnParam, UdEventParam};
use super::mad::{
    cma, drep, dreq, mra, rej, rep, req, rtu, sidr, CmMad, CmMessage, CmPath, CmaHeaderRepr, DrepRepr, DreqRepr,
    MadError, MraRepr, PortSpace, RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus,
    TransportType, CMA_HEADER_LEN, MAD_LEN,
};
use super::state::{AddrQuery, CmState, Connection, IdState, Retransmit, SidrQuery, SidrRequest};
use crate::verbs::{
    AccessFlags, AhAttributes, CompletionQueue, Mtu, ProtectionDomain, QpAttributeMask, QpAttributes, QpState, QpType,
    QueuePair, VerbsError,
};

/// An id's key: never reused within one connection manager.
pub(crate) type IdKey = u64;

/// Linux's `IB_CM_REJ_TIMEOUT` ARI: our node GUID.
const ARI_GUID_LEN: u8 = 8;
/// How often a pending neighbour resolution is asked again (ns).
const NEIGHBOUR_RETRY: u64 = 10_000_000;
/// The ephemeral port range (Linux's default `ip_local_port_range`).
const EPHEMERAL_PORTS: std::ops::Range<u16> = 32768..61000;

/// Counters of the connection manager, for tests and `rnic::diag` readers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// CM MADs received and parsed.
    pub received: u64,
    /// CM MADs sent, retransmissions included.
    pub sent: u64,
    /// Retransmissions of REQ, REP, DREQ and SIDR_REQ.
    pub retransmissions: u64,
    /// MADs refused as malformed (truncated, bad lengths, bad fields).
    pub malformed: u64,
    /// MADs of another class, version or method.
    pub not_cm: u64,
    /// CM MADs of attributes not handled (ClassPortInfo, LAP, APR, unknown).
    pub unknown_attribute: u64,
    /// Duplicates (REQ, REP, RTU, DREQ, MRA, SIDR_REQ) absorbed or answered again.
    pub duplicates: u64,
    /// MADs for no connection of ours (REP, RTU, REJ, MRA, DREP, SIDR_REP).
    pub unmatched: u64,
    /// REJs sent.
    pub rejects_sent: u64,
    /// REQs rejected with reason 8: no listener.
    pub no_listener: u64,
    /// REQs rejected with reason 10: stale connection.
    pub stale_connections: u64,
    /// DREQs ignored because they named another QPN than the connection's.
    pub dreq_wrong_qpn: u64,
    /// DREPs sent for DREQs of connections we do not know.
    pub unknown_dreq_answered: u64,
    /// REQs dropped because the listener's backlog was full.
    pub backlog_full: u64,
    /// Connections that gave up after every retry (REQ, REP, DREQ, SIDR_REQ).
    pub timeouts: u64,
}

/// Counts `counter` and logs under `rnic::diag` the first time and then at every power of
/// two, so a flood of hostile MADs leaves a bounded log.
macro_rules! diag {
    ($counter:expr, $($arg:tt)+) => {{
        $counter += 1;
        if $counter.is_power_of_two() {
            tracing::warn!(target: "rnic::diag", count = $counter, $($arg)+);
        }
    }};
}

/// The QP an id created for itself ([`CmId::create_qp`](super::CmId::create_qp)), with the
/// CQs it created if the caller gave none.
pub(crate) struct IdQp {
    pub qp: Arc<QueuePair>,
    pub send_cq: Option<Arc<CompletionQueue>>,
    pub recv_cq: Option<Arc<CompletionQueue>>,
    pub srq: bool,
}

/// One id.
pub(crate) struct IdEntry {
    pub channel: Weak<ChannelInner>,
    pub context: u64,
    pub port_space: PortSpace,
    pub qp_type: QpType,
    /// Index of the device, once bound or resolved.
    pub device: Option<usize>,
    /// Our address and port.
    pub source: Option<SocketAddr>,
    /// The peer's address and port.
    pub destination: Option<SocketAddr>,
    /// The peer's MAC once the address is resolved.
    pub dmac: Option<[u8; 6]>,
    pub route: Option<Route>,
    pub qp: Option<IdQp>,
    /// The PSN this id expects to receive (its REQ's or REP's Starting PSN).
    pub sequence: u32,
    /// UD Q_Key.
    pub qkey: u32,
    /// Type of service of the id's path.
    pub tos: u8,
    pub state: IdState,
    /// For an id made by a CONNECT_REQUEST: its listener.
    pub listener: Option<IdKey>,
    /// The port this id occupies in its port space.
    pub bound: Option<(PortSpace, u16)>,
    /// `RDMA_OPTION_ID_AFONLY` as the application set it (`None`: not set).
    pub afonly_option: Option<bool>,
    /// Family-only (`IPV6_V6ONLY`-like), decided at bind as Linux's `rdma_bind_addr`
    /// does: the option if set, else IPv4 yes and IPv6 no (`net.ipv6.bindv6only`'s
    /// default). A family-only wildcard shares its port with the other family's ids and
    /// takes only its own family's requests.
    pub afonly: bool,
}

/// An event on its way to a channel.
pub(crate) struct PendingEvent {
    pub channel: Weak<ChannelInner>,
    pub id: IdKey,
    pub listen_id: Option<IdKey>,
    pub kind: CmEventKind,
    pub status: i32,
    pub private_data: Vec<u8>,
    pub conn: ConnEventParam,
    pub ud: Option<UdEventParam>,
}

/// A device slot.
pub(crate) struct DeviceSlot {
    pub agent: GsiAgent,
}

/// Where QP creation takes its CQs from.
pub(crate) struct QpRequest<'a> {
    pub pd: Option<&'a ProtectionDomain>,
    pub send_cq: Option<&'a CompletionQueue>,
    pub recv_cq: Option<&'a CompletionQueue>,
    pub srq: Option<&'a crate::verbs::SharedReceiveQueue>,
    pub cap: crate::verbs::QpCapabilities,
    pub sq_sig_all: bool,
}

pub(crate) struct Core {
    pub config: CmConfig,
    rng: Rng,
    pub devices: Vec<Option<DeviceSlot>>,
    pub ids: BTreeMap<IdKey, IdEntry>,
    next_key: IdKey,
    /// Local communication ID → id.
    local_comm: BTreeMap<u32, IdKey>,
    /// (remote communication ID, remote CA GUID) → id: duplicate REQs and REPs.
    remote_ids: BTreeMap<(u32, u64), IdKey>,
    /// (remote QPN, remote CA GUID) → id: stale connections.
    remote_qpns: BTreeMap<(u32, u64), IdKey>,
    /// (request ID, requester GID) → id: duplicate SIDR_REQs.
    sidr_requests: BTreeMap<(u32, [u8; 16]), IdKey>,
    /// (port space, port) → ids bound there.
    ports: BTreeMap<(PortSpace, u16), Vec<IdKey>>,
    comm_counter: u32,
    comm_operand: u32,
    pub counters: CmCounters,
    pub events: Vec<PendingEvent>,
}

fn lock_out<T>(value: Option<T>) -> Result<T> {
    value.ok_or(CmError::NoSuchId)
}

impl Core {
    pub fn new(config: CmConfig) -> Self {
        let mut rng = Rng::new(config.seed.unwrap_or_else(Rng::entropy));
        let comm_operand = rng.u32();
        let comm_counter = rng.u32() >> 8;
        Self {
            config,
            rng,
            devices: Vec::new(),
            ids: BTreeMap::new(),
            next_key: 1,
            local_comm: BTreeMap::new(),
            remote_ids: BTreeMap::new(),
            remote_qpns: BTreeMap::new(),
            sidr_requests: BTreeMap::new(),
            ports: BTreeMap::new(),
            comm_counter,
            comm_operand,
            counters: CmCounters::default(),
            events: Vec::new(),
        }
    }

    // ---- helpers ------------------------------------------------------------------------

    fn agent(&self, device: usize) -> Result<&GsiAgent> {
        self.devices
            .get(device)
            .and_then(Option::as_ref)
            .map(|slot| &slot.agent)
            .ok_or_else(|| CmError::NoDevice(format!("device {device} is gone")))
    }

    fn entry(&self, key: IdKey) -> Result<&IdEntry> {
        lock_out(self.ids.get(&key))
    }

    fn entry_mut(&mut self, key: IdKey) -> Result<&mut IdEntry> {
        lock_out(self.ids.get_mut(&key))
    }

    fn invalid(&self, key: IdKey, operation: &'static str) -> CmError {
        CmError::InvalidState {
            operation,
            state: self
                .ids
                .get(&key)
                .map_or_else(|| "destroyed".into(), |e| e.state.name()),
        }
    }

    fn psn(&mut self) -> u32 {
        self.rng.u32() & 0xFF_FFFF
    }

    fn new_comm_id(&mut self) -> u32 {
        loop {
            self.comm_counter = self.comm_counter.wrapping_add(1);
            let id = self.comm_counter ^ self.comm_operand;
            if id != 0 && !self.local_comm.contains_key(&id) {
                return id;
            }
        }
    }

    /// Linux's transaction IDs: its agent number in the high half, the communication ID
    /// as the CPU reads its network-order bytes in the low half.
    fn new_transaction_id(&self, comm_id: u32) -> u64 {
        (u64::from(self.config.transaction_id_high) << 32) | u64::from(comm_id.swap_bytes())
    }

    fn send(&mut self, device: usize, mad: &[u8; MAD_LEN], peer: MadPeer) {
        if let Some(Some(slot)) = self.devices.get_mut(device) {
            slot.agent.send(mad, peer);
            self.counters.sent += 1;
        }
    }

    fn send_message(&mut self, device: usize, transaction_id: u64, message: CmMessage, peer: MadPeer) {
        let mad = CmMad::new(transaction_id, message).to_bytes();
        self.send(device, &mad, peer);
    }

    fn event(&mut self, key: IdKey, kind: CmEventKind, status: i32) -> Option<&mut PendingEvent> {
        let channel = self.ids.get(&key)?.channel.clone();
        self.events.push(PendingEvent {
            channel,
            id: key,
            listen_id: None,
            kind,
            status,
            private_data: Vec::new(),
            conn: ConnEventParam::default(),
            ud: None,
        });
        self.events.last_mut()
    }

    fn connection_mut(&mut self, key: IdKey) -> Option<&mut Connection> {
        match &mut self.ids.get_mut(&key)?.state {
            IdState::Connection(connection) => Some(connection),
            _ => None,
        }
    }

    fn connection(&self, key: IdKey) -> Option<&Connection> {
        match &self.ids.get(&key)?.state {
            IdState::Connection(connection) => Some(connection),
            _ => None,
        }
    }

    fn remove_remote(&mut self, key: IdKey) {
        let Some(connection) = self.connection_mut(key) else {
            return;
        };
        if !connection.in_remote_tables {
            return;
        }
        connection.in_remote_tables = false;
        let (remote_id, remote_qpn, guid) = (connection.remote_comm_id, connection.remote_qpn, connection.remote_guid);
        if self.remote_ids.get(&(remote_id, guid)) == Some(&key) {
            self.remote_ids.remove(&(remote_id, guid));
        }
        if self.remote_qpns.get(&(remote_qpn, guid)) == Some(&key) {
            self.remote_qpns.remove(&(remote_qpn, guid));
        }
    }

    fn enter_timewait(&mut self, key: IdKey, now: u64) {
        self.remove_remote(key);
        if let Some(connection) = self.connection_mut(key) {
            let until = now + iba_time_ns(connection.av_timeout);
            connection.cm = CmState::TimeWait { until };
        }
    }

    fn finish(&mut self, key: IdKey) {
        self.remove_remote(key);
        if let Some(connection) = self.connection_mut(key) {
            connection.cm = CmState::Done;
        }
    }

    fn qp_to_error(&self, key: IdKey) {
        if let Some(qp) = self.ids.get(&key).and_then(|e| e.qp.as_ref()) {
            if let Err(error) = qp.qp.modify(
                &QpAttributes {
                    qp_state: QpState::Err,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE,
            ) {
                tracing::debug!(%error, "QP to ERR refused");
            }
        }
    }

    // ---- devices ------------------------------------------------------------------------

    pub fn add_device(&mut self, agent: GsiAgent) -> usize {
        self.devices.push(Some(DeviceSlot { agent }));
        self.devices.len() - 1
    }

    /// Takes the device away: DEVICE_REMOVAL for every id on it.
    pub fn remove_device(&mut self, device: usize) -> Option<DeviceSlot> {
        let slot = self.devices.get_mut(device)?.take()?;
        let keys: Vec<IdKey> = self
            .ids
            .iter()
            .filter(|(_, e)| e.device == Some(device))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            self.remove_remote(key);
            if let Some(entry) = self.ids.get_mut(&key) {
                entry.state = IdState::Closed;
            }
            self.event(key, CmEventKind::DeviceRemoval, 0);
        }
        Some(slot)
    }

    // ---- ids ----------------------------------------------------------------------------

    pub fn create_id(&mut self, channel: Weak<ChannelInner>, context: u64, port_space: PortSpace) -> Result<IdKey> {
        let qp_type = match port_space {
            PortSpace::Tcp | PortSpace::Ib => QpType::Rc,
            PortSpace::Udp => QpType::Ud,
            PortSpace::Ipoib => {
                return Err(CmError::InvalidArgument(
                    "the IPoIB port space needs InfiniBand multicast: not on RoCE".into(),
                ))
            }
        };
        let key = self.next_key;
        self.next_key += 1;
        let sequence = self.psn();
        self.ids.insert(
            key,
            IdEntry {
                channel,
                context,
                port_space,
                qp_type,
                device: None,
                source: None,
                destination: None,
                dmac: None,
                route: None,
                qp: None,
                sequence,
                qkey: RDMA_UDP_QKEY,
                tos: 0,
                state: IdState::Idle,
                listener: None,
                bound: None,
                afonly_option: None,
                afonly: false,
            },
        );
        Ok(key)
    }

    fn unbind(&mut self, key: IdKey) {
        let Some(bound) = self.ids.get_mut(&key).and_then(|e| e.bound.take()) else {
            return;
        };
        if let Some(list) = self.ports.get_mut(&bound) {
            list.retain(|k| *k != key);
            if list.is_empty() {
                self.ports.remove(&bound);
            }
        }
    }

    /// `rdma_destroy_id`: what Linux's `cm_destroy_id` sends in each state, then the id
    /// and its QP are gone.
    pub fn destroy_id(&mut self, key: IdKey, now: u64) -> Result<()> {
        let entry = self.entry(key)?;
        let device = entry.device;
        match &entry.state {
            IdState::Connection(connection) => {
                let (device, peer, tid) = (device.unwrap_or(0), connection.peer, connection.transaction_id);
                let (local, remote) = (connection.local_comm_id, connection.remote_comm_id);
                match &connection.cm {
                    CmState::ReqSent(_) | CmState::MraReqRcvd(_) => {
                        let guid = self.agent(device).map(|a| a.node_guid).unwrap_or(0);
                        let mut ari = [0u8; rej::ARI_LEN];
                        ari[..8].copy_from_slice(&guid.to_be_bytes());
                        self.send_rej(
                            device,
                            tid,
                            local,
                            remote,
                            rej::rejected::OTHER,
                            RejReason::Timeout,
                            &ari,
                            ARI_GUID_LEN,
                            &[],
                            peer,
                        );
                    }
                    CmState::ReqRcvd => {
                        self.send_rej(
                            device,
                            tid,
                            0,
                            remote,
                            rej::rejected::REQ,
                            RejReason::ConsumerDefined,
                            &[0; rej::ARI_LEN],
                            0,
                            &[],
                            peer,
                        );
                    }
                    CmState::RepSent(_) | CmState::MraRepRcvd(_) => {
                        self.send_rej(
                            device,
                            tid,
                            local,
                            remote,
                            rej::rejected::OTHER,
                            RejReason::ConsumerDefined,
                            &[0; rej::ARI_LEN],
                            0,
                            &[],
                            peer,
                        );
                    }
                    CmState::RepRcvd => {
                        self.send_rej(
                            device,
                            tid,
                            local,
                            remote,
                            rej::rejected::REP,
                            RejReason::ConsumerDefined,
                            &[0; rej::ARI_LEN],
                            0,
                            &[],
                            peer,
                        );
                    }
                    CmState::Established => {
                        self.qp_to_error(key);
                        let remote_qpn = connection.remote_qpn;
                        let tid = self.new_transaction_id(local);
                        self.send_message(
                            device,
                            tid,
                            CmMessage::Dreq(DreqRepr {
                                local_comm_id: local,
                                remote_comm_id: remote,
                                remote_qpn,
                                private_data: [0; dreq::PRIVATE_DATA_LEN],
                            }),
                            peer,
                        );
                    }
                    CmState::DreqRcvd => self.send_drep(device, tid, local, remote, &[], peer),
                    CmState::DreqSent(_) | CmState::TimeWait { .. } | CmState::Done => {}
                }
            }
            IdState::SidrRequest(request) => {
                let request = (**request).clone();
                self.send_sidr_rep(device.unwrap_or(0), &request, SidrStatus::Reject, 0, 0, &[]);
            }
            _ => {}
        }
        let _ = now;
        self.remove_remote(key);
        if let Some(IdState::SidrRequest(request)) = self.ids.get(&key).map(|e| &e.state) {
            let k = (request.request_id, request.peer.dgid.raw());
            self.sidr_requests.remove(&k);
        }
        self.unbind(key);
        let entry = self.ids.remove(&key);
        if let Some(comm) = entry.as_ref().and_then(|e| match &e.state {
            IdState::Connection(c) => Some(c.local_comm_id),
            IdState::SidrQuery(q) => Some(q.request_id),
            _ => None,
        }) {
            if self.local_comm.get(&comm) == Some(&key) {
                self.local_comm.remove(&comm);
            }
        }
        // Children of a listener keep living; they only forget it.
        for other in self.ids.values_mut() {
            if other.listener == Some(key) {
                other.listener = None;
            }
        }
        // The QP (and the CQs the id made) go with the id; `IdQp` drops the QP first,
        // which holds the CQs.
        drop(entry);
        Ok(())
    }

    pub fn set_context(&mut self, key: IdKey, context: u64) -> Result<()> {
        self.entry_mut(key)?.context = context;
        Ok(())
    }

    /// `rdma_set_afonly` (`RDMA_OPTION_ID_AFONLY`): before the id is bound or while it is
    /// bound but not yet listening or connecting, as Linux allows.
    pub fn set_afonly(&mut self, key: IdKey, afonly: bool) -> Result<()> {
        let entry = self.entry_mut(key)?;
        if !matches!(entry.state, IdState::Idle | IdState::Bound) {
            return Err(self.invalid(key, "set_option(AFONLY)"));
        }
        let entry = self.entry_mut(key)?;
        entry.afonly_option = Some(afonly);
        entry.afonly = afonly;
        Ok(())
    }

    pub fn set_tos(&mut self, key: IdKey, tos: u8) -> Result<()> {
        self.entry_mut(key)?.tos = tos;
        Ok(())
    }

    pub fn migrate(&mut self, key: IdKey, channel: Weak<ChannelInner>) -> Result<()> {
        self.entry_mut(key)?.channel = channel;
        Ok(())
    }

    // ---- addresses ----------------------------------------------------------------------

    /// The device and GID index owning `ip`.
    fn device_of(&self, ip: IpAddr) -> Option<(usize, u8)> {
        self.devices.iter().enumerate().find_map(|(index, slot)| {
            let agent = &slot.as_ref()?.agent;
            agent.gid_index(ip).map(|gid| (index, gid))
        })
    }

    /// A local address to reach `destination` from: the first GID of its family (for IPv6,
    /// link-local to link-local first).
    fn source_for(&self, destination: IpAddr) -> Option<(usize, u8, IpAddr)> {
        let link_local = |ip: &IpAddr| matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
        let mut fallback = None;
        for (index, slot) in self.devices.iter().enumerate() {
            let Some(slot) = slot else { continue };
            for (gid_index, ip) in slot.agent.addresses() {
                if ip.is_ipv4() != destination.is_ipv4() {
                    continue;
                }
                if link_local(&ip) == link_local(&destination) {
                    return Some((index, gid_index, ip));
                }
                fallback.get_or_insert((index, gid_index, ip));
            }
        }
        fallback
    }

    fn port_in_use(&self, space: PortSpace, port: u16, ip: IpAddr) -> bool {
        self.ports.get(&(space, port)).is_some_and(|keys| {
            keys.iter().any(|k| {
                let other = self.ids.get(k).and_then(|e| e.source).map(|s| s.ip());
                match other {
                    Some(other) => other.is_unspecified() || ip.is_unspecified() || other == ip,
                    None => true,
                }
            })
        })
    }

    /// Whether `address` (family-only or not) may take its port beside the ids bound
    /// there already, by Linux's rules (`cma_check_port`): ids of different families that
    /// are both family-only never collide; otherwise a wildcard on either side collides
    /// with anything (`EADDRNOTAVAIL`), and the same address does (`EADDRINUSE`).
    fn check_port(&self, space: PortSpace, address: SocketAddr, afonly: bool) -> Result<()> {
        let Some(keys) = self.ports.get(&(space, address.port())) else {
            return Ok(());
        };
        for entry in keys.iter().filter_map(|k| self.ids.get(k)) {
            let Some(other) = entry.source else {
                return Err(CmError::AddressInUse(address.to_string()));
            };
            if afonly && entry.afonly && address.is_ipv4() != other.is_ipv4() {
                continue;
            }
            if address.ip().is_unspecified() || other.ip().is_unspecified() {
                return Err(CmError::AddressOverlaps {
                    address: address.to_string(),
                    other: other.to_string(),
                });
            }
            if address.ip() == other.ip() {
                return Err(CmError::AddressInUse(address.to_string()));
            }
        }
        Ok(())
    }

    fn ephemeral_port(&mut self, space: PortSpace, ip: IpAddr) -> Result<u16> {
        let span = u32::from(EPHEMERAL_PORTS.end - EPHEMERAL_PORTS.start);
        let start = self.rng.u32() % span;
        for offset in 0..span {
            let port = EPHEMERAL_PORTS.start + ((start + offset) % span) as u16;
            if !self.port_in_use(space, port, ip) {
                return Ok(port);
            }
        }
        Err(CmError::OutOfResources(format!("no free port in {space:?}")))
    }

    fn occupy(&mut self, key: IdKey, space: PortSpace, port: u16) {
        self.ports.entry((space, port)).or_default().push(key);
        if let Some(entry) = self.ids.get_mut(&key) {
            entry.bound = Some((space, port));
        }
    }

    /// `rdma_bind_addr`.
    pub fn bind(&mut self, key: IdKey, address: SocketAddr) -> Result<()> {
        let entry = self.entry(key)?;
        if !matches!(entry.state, IdState::Idle) {
            return Err(self.invalid(key, "bind_addr"));
        }
        let space = entry.port_space;
        let device = if address.ip().is_unspecified() {
            None
        } else {
            Some(
                self.device_of(address.ip())
                    .ok_or_else(|| CmError::AddressNotAvailable(address.ip().to_string()))?
                    .0,
            )
        };
        let afonly = entry.afonly_option.unwrap_or(address.is_ipv4());
        let port = if address.port() == 0 {
            self.ephemeral_port(space, address.ip())?
        } else {
            self.check_port(space, address, afonly)?;
            address.port()
        };
        let entry = self.entry_mut(key)?;
        entry.afonly = afonly;
        entry.device = device;
        entry.source = Some(SocketAddr::new(address.ip(), port));
        entry.state = IdState::Bound;
        self.occupy(key, space, port);
        Ok(())
    }

    /// `rdma_resolve_addr`: picks the device and source address, then the peer's MAC.
    pub fn resolve_addr(
        &mut self,
        key: IdKey,
        source: Option<SocketAddr>,
        destination: SocketAddr,
        timeout_ms: u64,
        now: u64,
    ) -> Result<()> {
        if destination.ip().is_unspecified() {
            return Err(CmError::InvalidArgument("destination address unspecified".into()));
        }
        if let Some(source) = source {
            if source.is_ipv4() != destination.is_ipv4() {
                return Err(CmError::InvalidArgument(
                    "source and destination of different families".into(),
                ));
            }
            if matches!(self.entry(key)?.state, IdState::Idle) {
                self.bind(key, source)?;
            }
        }
        let entry = self.entry(key)?;
        if !matches!(entry.state, IdState::Idle | IdState::Bound) {
            return Err(self.invalid(key, "resolve_addr"));
        }
        let bound = entry.source;
        let space = entry.port_space;
        let (device, _, ip) = match bound.filter(|s| !s.ip().is_unspecified()) {
            Some(source) => {
                let (device, gid) = self
                    .device_of(source.ip())
                    .ok_or_else(|| CmError::AddressNotAvailable(source.ip().to_string()))?;
                (device, gid, source.ip())
            }
            None => self
                .source_for(destination.ip())
                .ok_or_else(|| CmError::AddressNotAvailable(format!("no local address to reach {destination}")))?,
        };
        let port = match bound {
            Some(bound) => bound.port(),
            None => {
                let port = self.ephemeral_port(space, ip)?;
                self.occupy(key, space, port);
                port
            }
        };
        let entry = self.entry_mut(key)?;
        if bound.is_none() {
            // Bound here as Linux's implicit bind does: to the destination's family.
            entry.afonly = entry.afonly_option.unwrap_or(ip.is_ipv4());
        }
        entry.device = Some(device);
        entry.source = Some(SocketAddr::new(ip, port));
        entry.destination = Some(destination);
        entry.state = IdState::AddrQuery(AddrQuery {
            destination,
            retry_at: now,
            deadline: now + timeout_ms.max(1) * 1_000_000,
        });
        self.try_neighbour(key, now);
        Ok(())
    }

    /// Asks the device's resolver for the MAC of an id in ADDR_QUERY.
    fn try_neighbour(&mut self, key: IdKey, now: u64) {
        let Some(entry) = self.ids.get(&key) else { return };
        let IdState::AddrQuery(query) = entry.state else { return };
        let (Some(device), Some(source)) = (entry.device, entry.source) else {
            return;
        };
        let Ok(agent) = self.agent(device) else { return };
        let answer = if agent.gid_index(query.destination.ip()).is_some() {
            // One of our own addresses: the device loops it back.
            Neighbour::Known(agent.mac)
        } else {
            agent.resolver.resolve(source.ip(), query.destination.ip())
        };
        match answer {
            Neighbour::Known(mac) => {
                if let Some(entry) = self.ids.get_mut(&key) {
                    entry.dmac = Some(mac);
                    entry.state = IdState::AddrResolved;
                }
                self.event(key, CmEventKind::AddrResolved, 0);
            }
            Neighbour::Pending if now < query.deadline => {
                if let Some(IdState::AddrQuery(query)) = self.ids.get_mut(&key).map(|e| &mut e.state) {
                    query.retry_at = now + NEIGHBOUR_RETRY;
                }
            }
            Neighbour::Pending | Neighbour::Unknown => {
                let status = if answer == Neighbour::Unknown {
                    -EHOSTUNREACH
                } else {
                    -ETIMEDOUT
                };
                if let Some(entry) = self.ids.get_mut(&key) {
                    entry.state = if entry.bound.is_some() {
                        IdState::Bound
                    } else {
                        IdState::Idle
                    };
                }
                self.event(key, CmEventKind::AddrError, status);
            }
        }
    }

    /// `rdma_resolve_route`: the path record RoCE synthesises from the addresses.
    pub fn resolve_route(&mut self, key: IdKey) -> Result<()> {
        let entry = self.entry(key)?;
        if !matches!(entry.state, IdState::AddrResolved) {
            return Err(self.invalid(key, "resolve_route"));
        }
        let (Some(device), Some(source), Some(destination), Some(dmac)) =
            (entry.device, entry.source, entry.destination, entry.dmac)
        else {
            return Err(self.invalid(key, "resolve_route"));
        };
        let tos = entry.tos;
        let agent = self.agent(device)?;
        let sgid_index = agent
            .gid_index(source.ip())
            .ok_or_else(|| CmError::AddressNotAvailable(source.ip().to_string()))?;
        let mtu = if agent.active_mtu.bytes() < self.config.max_path_mtu.bytes() {
            agent.active_mtu
        } else {
            self.config.max_path_mtu
        };
        let route = Route {
            sgid: ip_to_gid(source.ip()),
            sgid_index,
            dgid: ip_to_gid(destination.ip()),
            dmac,
            hop_limit: self.config.hop_limit,
            traffic_class: tos,
            flow_label: flow_label(source, destination),
            sl: 0,
            mtu,
            packet_lifetime: self.config.packet_lifetime,
        };
        let entry = self.entry_mut(key)?;
        entry.route = Some(route);
        entry.state = IdState::RouteResolved;
        self.event(key, CmEventKind::RouteResolved, 0);
        Ok(())
    }

    /// `rdma_listen`.
    pub fn listen(&mut self, key: IdKey, backlog: u32) -> Result<()> {
        let entry = self.entry(key)?;
        match entry.state {
            IdState::Bound => {}
            IdState::Idle => {
                // Linux binds an unbound listener to the wildcard address and a free port.
                let any = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);
                self.bind(key, any)?;
            }
            _ => return Err(self.invalid(key, "listen")),
        }
        let entry = self.entry_mut(key)?;
        entry.state = IdState::Listen {
            backlog: if backlog == 0 { u32::MAX } else { backlog },
        };
        // Nothing outside the process shows that an id listens (no socket of its own);
        // this line does, for whoever starts a client only once its server listens.
        tracing::info!(target: "rnic::cm::listen", source = ?entry.source, "listening");
        Ok(())
    }

    // ---- QPs ----------------------------------------------------------------------------

    /// `rdma_create_qp`: a QP of the id's type on its device, taken to INIT (UD: to RTS
    /// with the port space's Q_Key), as librdmacm does.
    pub fn create_qp(&mut self, key: IdKey, request: QpRequest<'_>) -> Result<()> {
        let entry = self.entry(key)?;
        if entry.qp.is_some() {
            return Err(CmError::QpExists);
        }
        let device = entry
            .device
            .ok_or_else(|| self.invalid(key, "create_qp (no device yet)"))?;
        let (qp_type, qkey) = (entry.qp_type, entry.qkey);
        let agent = self.agent(device)?;
        let pd = match request.pd {
            Some(pd) => {
                if !pd.context().is_same(&agent.context) {
                    return Err(CmError::InvalidArgument(
                        "the PD belongs to another device than the id".into(),
                    ));
                }
                pd
            }
            None => &agent.pd,
        };
        let context = &agent.context;
        let cqe = |wr: u32| wr.max(1).next_power_of_two().max(64);
        let send_cq = match request.send_cq {
            Some(_) => None,
            None => Some(Arc::new(context.create_cq(cqe(request.cap.max_send_wr), None, 0)?)),
        };
        let recv_cq = match request.recv_cq {
            Some(_) => None,
            None => Some(Arc::new(context.create_cq(cqe(request.cap.max_recv_wr), None, 0)?)),
        };
        let qp = pd.create_qp(&crate::verbs::QpInitAttributes {
            send_cq: request.send_cq.or(send_cq.as_deref()).expect("one of the two"),
            recv_cq: request.recv_cq.or(recv_cq.as_deref()).expect("one of the two"),
            srq: request.srq,
            cap: request.cap,
            qp_type,
            sq_sig_all: request.sq_sig_all,
        })?;
        let mut init = QpAttributes {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttributes::default()
        };
        let mut mask = QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT;
        match qp_type {
            QpType::Ud => mask |= QpAttributeMask::QKEY,
            _ => {
                init.qp_access_flags = AccessFlags::empty();
                mask |= QpAttributeMask::ACCESS_FLAGS;
            }
        }
        qp.modify(&init, mask)?;
        if qp_type == QpType::Ud {
            qp.modify(
                &QpAttributes {
                    qp_state: QpState::Rtr,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE,
            )?;
            qp.modify(
                &QpAttributes {
                    qp_state: QpState::Rts,
                    sq_psn: 0,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
            )?;
        }
        let srq = request.srq.is_some();
        self.entry_mut(key)?.qp = Some(IdQp {
            qp: Arc::new(qp),
            send_cq,
            recv_cq,
            srq,
        });
        Ok(())
    }

    /// `rdma_destroy_qp`.
    pub fn destroy_qp(&mut self, key: IdKey) -> Result<()> {
        self.entry_mut(key)?.qp = None;
        Ok(())
    }

    /// The QP attributes and mask for moving the id's QP to `state` (`rdma_init_qp_attr`).
    pub fn init_qp_attr(&self, key: IdKey, state: QpState) -> Result<(QpAttributes, QpAttributeMask)> {
        let entry = self.entry(key)?;
        if entry.qp_type == QpType::Ud {
            return Ok(match state {
                QpState::Init => (
                    QpAttributes {
                        qp_state: QpState::Init,
                        pkey_index: 0,
                        port_num: 1,
                        qkey: entry.qkey,
                        ..QpAttributes::default()
                    },
                    QpAttributeMask::STATE
                        | QpAttributeMask::PKEY_INDEX
                        | QpAttributeMask::PORT
                        | QpAttributeMask::QKEY,
                ),
                QpState::Rtr => (
                    QpAttributes {
                        qp_state: QpState::Rtr,
                        ..QpAttributes::default()
                    },
                    QpAttributeMask::STATE,
                ),
                QpState::Rts => (
                    QpAttributes {
                        qp_state: QpState::Rts,
                        sq_psn: 0,
                        ..QpAttributes::default()
                    },
                    QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
                ),
                _ => return Err(CmError::InvalidArgument(format!("no attributes for {state}"))),
            });
        }
        let Some(connection) = self.connection(key) else {
            if state == QpState::Init {
                return Ok((
                    QpAttributes {
                        qp_state: QpState::Init,
                        pkey_index: 0,
                        port_num: 1,
                        ..QpAttributes::default()
                    },
                    QpAttributeMask::STATE
                        | QpAttributeMask::PKEY_INDEX
                        | QpAttributeMask::PORT
                        | QpAttributeMask::ACCESS_FLAGS,
                ));
            }
            return Err(self.invalid(key, "init_qp_attr"));
        };
        Ok(connection_qp_attributes(connection, state))
    }

    /// Takes the id's QP through INIT → RTR → RTS with the negotiated values.
    fn program_qp(&self, key: IdKey) -> std::result::Result<(), VerbsError> {
        let (Some(entry), Some(connection)) = (self.ids.get(&key), self.connection(key)) else {
            return Ok(());
        };
        let Some(qp) = entry.qp.as_ref() else {
            return Ok(());
        };
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let (attributes, mask) = connection_qp_attributes(connection, state);
            qp.qp.modify(&attributes, mask)?;
        }
        Ok(())
    }

    // ---- connecting ---------------------------------------------------------------------

    fn clamp_resources(requested: u8, device_max: u8) -> u8 {
        if requested == MAX_RESOURCES {
            device_max
        } else {
            requested.min(device_max)
        }
    }

    /// `rdma_connect`: REQ (RC) or SIDR_REQ (UD).
    pub fn connect(&mut self, key: IdKey, param: &ConnParam, now: u64) -> Result<()> {
        let entry = self.entry(key)?;
        if !matches!(entry.state, IdState::RouteResolved) {
            return Err(self.invalid(key, "connect"));
        }
        let (Some(device), Some(route), Some(source), Some(destination)) =
            (entry.device, entry.route, entry.source, entry.destination)
        else {
            return Err(self.invalid(key, "connect"));
        };
        let header = CmaHeaderRepr {
            source,
            destination: destination.ip(),
        };
        let space = entry.port_space;
        let service_id = space.service_id(destination.port());
        let peer = MadPeer {
            dgid: route.dgid,
            sgid_index: route.sgid_index,
            dmac: route.dmac,
            hop_limit: route.hop_limit,
            traffic_class: route.traffic_class,
            flow_label: route.flow_label,
        };
        if entry.qp_type == QpType::Ud {
            return self.connect_ud(key, device, service_id, header, param, peer, now);
        }
        if param.private_data.len() > req::PRIVATE_DATA_LEN - CMA_HEADER_LEN {
            return Err(CmError::InvalidArgument(format!(
                "{} bytes of private data: a REQ carries at most {}",
                param.private_data.len(),
                req::PRIVATE_DATA_LEN - CMA_HEADER_LEN
            )));
        }
        let (local_qpn, srq) = match &entry.qp {
            Some(qp) => (qp.qp.qp_num(), qp.srq),
            None => (param.qp_num & 0xFF_FFFF, param.srq),
        };
        let sequence = entry.sequence;
        let agent = self.agent(device)?;
        let (guid, ca_ack_delay, max_rd) = (agent.node_guid, agent.ca_ack_delay, agent.max_rd_atomic);
        let responder_resources = Self::clamp_resources(param.responder_resources, max_rd);
        let initiator_depth = Self::clamp_resources(param.initiator_depth, max_rd);
        let retry_count = param.retry_count.min(7);
        let rnr_retry_count = param.rnr_retry_count.min(7);
        let local_comm_id = self.new_comm_id();
        let transaction_id = self.new_transaction_id(local_comm_id);
        let mut private_data = [0u8; req::PRIVATE_DATA_LEN];
        header.emit(&mut cma::Packet::new_unchecked(&mut private_data[..CMA_HEADER_LEN]));
        private_data[CMA_HEADER_LEN..][..param.private_data.len()].copy_from_slice(&param.private_data);
        let routed = route.hop_limit > 1;
        let request = ReqRepr {
            local_comm_id,
            service_id,
            local_ca_guid: guid,
            local_qkey: 0,
            local_qpn,
            responder_resources,
            local_eecn: 0,
            initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.config.cm_response_timeout,
            transport: TransportType::Rc,
            end_to_end_flow_control: param.flow_control,
            starting_psn: sequence,
            local_cm_response_timeout: self.config.cm_response_timeout,
            retry_count,
            partition_key: 0xFFFF,
            path_mtu: route.mtu as u8,
            rdc_exists: false,
            rnr_retry_count,
            max_cm_retries: self.config.max_cm_retries,
            srq,
            extended_transport_type: 0,
            primary_path: CmPath {
                local_lid: if routed { 0xFFFF } else { 0 },
                remote_lid: if routed { 0xFFFF } else { 0 },
                local_gid: route.sgid.raw(),
                remote_gid: route.dgid.raw(),
                flow_label: route.flow_label,
                packet_rate: 0,
                traffic_class: route.traffic_class,
                hop_limit: route.hop_limit,
                sl: route.sl,
                subnet_local: !routed,
                local_ack_timeout: ack_timeout(ca_ack_delay, route.packet_lifetime),
            },
            alternate_path: CmPath::default(),
            private_data,
        };
        let mad = Box::new(CmMad::new(transaction_id, CmMessage::Req(request)).to_bytes());
        let interval = 2 * iba_time_ns(route.packet_lifetime) + iba_time_ns(self.config.cm_response_timeout);
        let connection = Connection {
            cm: CmState::ReqSent(Retransmit {
                mad: mad.clone(),
                deadline: now + interval,
                retries_left: self.config.max_cm_retries,
            }),
            active: true,
            local_comm_id,
            remote_comm_id: 0,
            transaction_id,
            remote_guid: 0,
            local_qpn,
            remote_qpn: 0,
            peer,
            interval,
            max_retries: self.config.max_cm_retries,
            av_timeout: route.packet_lifetime + 1,
            mtu: route.mtu,
            sq_psn: 0,
            rq_psn: sequence,
            responder_resources,
            initiator_depth,
            retry_count,
            rnr_retry_count: 0,
            av: route_av(&route),
            flow_control: param.flow_control,
            srq,
            mra_armed: false,
            disconnect_reported: false,
            in_remote_tables: false,
        };
        self.local_comm.insert(local_comm_id, key);
        self.entry_mut(key)?.state = IdState::Connection(Box::new(connection));
        self.send(device, &mad, peer);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn connect_ud(
        &mut self,
        key: IdKey,
        device: usize,
        service_id: u64,
        header: CmaHeaderRepr,
        param: &ConnParam,
        peer: MadPeer,
        now: u64,
    ) -> Result<()> {
        let room = sidr::request::PRIVATE_DATA_LEN - CMA_HEADER_LEN;
        if param.private_data.len() > room {
            return Err(CmError::InvalidArgument(format!(
                "{} bytes of private data: a SIDR_REQ carries at most {room}",
                param.private_data.len()
            )));
        }
        let request_id = self.new_comm_id();
        let transaction_id = self.new_transaction_id(request_id);
        let mut private_data = [0u8; sidr::request::PRIVATE_DATA_LEN];
        header.emit(&mut cma::Packet::new_unchecked(&mut private_data[..CMA_HEADER_LEN]));
        private_data[CMA_HEADER_LEN..][..param.private_data.len()].copy_from_slice(&param.private_data);
        let mad = Box::new(
            CmMad::new(
                transaction_id,
                CmMessage::SidrReq(SidrReqRepr {
                    request_id,
                    partition_key: 0xFFFF,
                    service_id,
                    private_data,
                }),
            )
            .to_bytes(),
        );
        self.local_comm.insert(request_id, key);
        self.entry_mut(key)?.state = IdState::SidrQuery(Box::new(SidrQuery {
            request_id,
            retransmit: Retransmit {
                mad: mad.clone(),
                deadline: now + iba_time_ns(self.config.cm_response_timeout),
                retries_left: self.config.max_cm_retries,
            },
            peer,
        }));
        self.send(device, &mad, peer);
        Ok(())
    }

    /// `rdma_accept`.
    pub fn accept(&mut self, key: IdKey, param: &ConnParam, now: u64) -> Result<()> {
        let entry = self.entry(key)?;
        let device = entry.device.ok_or_else(|| self.invalid(key, "accept"))?;
        if let IdState::SidrRequest(request) = &entry.state {
            if param.private_data.len() > sidr::reply::PRIVATE_DATA_LEN {
                return Err(CmError::InvalidArgument(
                    "private data longer than a SIDR_REP's 136 bytes".into(),
                ));
            }
            let request = (**request).clone();
            let qpn = entry.qp.as_ref().map_or(param.qp_num, |qp| qp.qp.qp_num());
            let qkey = entry.qkey;
            self.sidr_requests
                .remove(&(request.request_id, request.peer.dgid.raw()));
            self.send_sidr_rep(device, &request, SidrStatus::Success, qpn, qkey, &param.private_data);
            self.entry_mut(key)?.state = IdState::UdReady;
            return Ok(());
        }
        let Some(connection) = self.connection(key) else {
            return Err(self.invalid(key, "accept"));
        };
        if !matches!(connection.cm, CmState::ReqRcvd) || connection.active {
            return Err(self.invalid(key, "accept"));
        }
        if param.private_data.len() > rep::PRIVATE_DATA_LEN {
            return Err(CmError::InvalidArgument(
                "private data longer than a REP's 196 bytes".into(),
            ));
        }
        let (local_qpn, srq) = match &entry.qp {
            Some(qp) => (qp.qp.qp_num(), qp.srq),
            None => (param.qp_num & 0xFF_FFFF, param.srq),
        };
        let agent = self.agent(device)?;
        let (guid, ca_ack_delay, max_rd) = (agent.node_guid, agent.ca_ack_delay, agent.max_rd_atomic);
        let connection = self.connection_mut(key).expect("checked above");
        // The requester's initiator depth is our default responder resources and its
        // responder resources bound our initiator depth (librdmacm's `rdma_accept`).
        let responder_resources = if param.responder_resources == MAX_RESOURCES {
            connection.responder_resources.min(max_rd)
        } else {
            param.responder_resources.min(max_rd)
        };
        let initiator_depth = if param.initiator_depth == MAX_RESOURCES {
            connection.initiator_depth.min(max_rd)
        } else {
            param.initiator_depth.min(connection.initiator_depth).min(max_rd)
        };
        connection.responder_resources = responder_resources;
        connection.initiator_depth = initiator_depth;
        connection.local_qpn = local_qpn;
        connection.srq = srq;
        connection.flow_control = param.flow_control;
        if let Err(error) = self.program_qp(key) {
            let connection = self.connection(key).expect("checked above");
            let (tid, remote, peer) = (connection.transaction_id, connection.remote_comm_id, connection.peer);
            self.send_rej(
                device,
                tid,
                0,
                remote,
                rej::rejected::REQ,
                RejReason::NoQp,
                &[0; rej::ARI_LEN],
                0,
                &[],
                peer,
            );
            self.finish(key);
            return Err(error.into());
        }
        let connection = self.connection_mut(key).expect("checked above");
        let mut private_data = [0u8; rep::PRIVATE_DATA_LEN];
        private_data[..param.private_data.len()].copy_from_slice(&param.private_data);
        let reply = RepRepr {
            local_comm_id: connection.local_comm_id,
            remote_comm_id: connection.remote_comm_id,
            local_qkey: 0,
            local_qpn,
            local_eecn: 0,
            starting_psn: connection.rq_psn,
            responder_resources,
            initiator_depth,
            target_ack_delay: ca_ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: param.flow_control,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq,
            local_ca_guid: guid,
            private_data,
        };
        let mad = Box::new(CmMad::new(connection.transaction_id, CmMessage::Rep(reply)).to_bytes());
        connection.cm = CmState::RepSent(Retransmit {
            mad: mad.clone(),
            deadline: now + connection.interval,
            retries_left: connection.max_retries,
        });
        let peer = connection.peer;
        self.send(device, &mad, peer);
        Ok(())
    }

    /// `rdma_reject`.
    pub fn reject(&mut self, key: IdKey, private_data: &[u8], now: u64) -> Result<()> {
        let entry = self.entry(key)?;
        let device = entry.device.ok_or_else(|| self.invalid(key, "reject"))?;
        if let IdState::SidrRequest(request) = &entry.state {
            let request = (**request).clone();
            self.sidr_requests
                .remove(&(request.request_id, request.peer.dgid.raw()));
            let private_data = &private_data[..private_data.len().min(sidr::reply::PRIVATE_DATA_LEN)];
            self.send_sidr_rep(device, &request, SidrStatus::Reject, 0, 0, private_data);
            self.entry_mut(key)?.state = IdState::Closed;
            return Ok(());
        }
        if private_data.len() > rej::PRIVATE_DATA_LEN {
            return Err(CmError::InvalidArgument(
                "private data longer than a REJ's 148 bytes".into(),
            ));
        }
        let Some(connection) = self.connection(key) else {
            return Err(self.invalid(key, "reject"));
        };
        let (tid, local, remote, peer) = (
            connection.transaction_id,
            connection.local_comm_id,
            connection.remote_comm_id,
            connection.peer,
        );
        match connection.cm {
            CmState::ReqRcvd => {
                self.send_rej(
                    device,
                    tid,
                    0,
                    remote,
                    rej::rejected::REQ,
                    RejReason::ConsumerDefined,
                    &[0; rej::ARI_LEN],
                    0,
                    private_data,
                    peer,
                );
                self.finish(key);
            }
            CmState::RepRcvd => {
                self.send_rej(
                    device,
                    tid,
                    local,
                    remote,
                    rej::rejected::REP,
                    RejReason::ConsumerDefined,
                    &[0; rej::ARI_LEN],
                    0,
                    private_data,
                    peer,
                );
                self.enter_timewait(key, now);
            }
            _ => return Err(self.invalid(key, "reject")),
        }
        Ok(())
    }

    /// `rdma_disconnect`: QP to ERR, then DREQ (or DREP when the peer asked first).
    pub fn disconnect(&mut self, key: IdKey, now: u64) -> Result<()> {
        let device = self.entry(key)?.device.ok_or_else(|| self.invalid(key, "disconnect"))?;
        let Some(connection) = self.connection(key) else {
            // Linux (cma.c rdma_disconnect): an id that has had an IB CM id (a UD id after
            // SIDR, one rejected or unreachable) has its QP moved to ERR and gets 0; one
            // that never tried to connect gets EINVAL.
            return match self.entry(key)?.state {
                IdState::SidrQuery(_) | IdState::SidrRequest(_) | IdState::UdReady | IdState::Closed => {
                    self.qp_to_error(key);
                    Ok(())
                }
                _ => Err(self.invalid(key, "disconnect")),
            };
        };
        let (tid, local, remote, peer, remote_qpn) = (
            connection.transaction_id,
            connection.local_comm_id,
            connection.remote_comm_id,
            connection.peer,
            connection.remote_qpn,
        );
        match connection.cm {
            CmState::Established => {
                self.qp_to_error(key);
                let tid = self.new_transaction_id(local);
                let mad = Box::new(
                    CmMad::new(
                        tid,
                        CmMessage::Dreq(DreqRepr {
                            local_comm_id: local,
                            remote_comm_id: remote,
                            remote_qpn,
                            private_data: [0; dreq::PRIVATE_DATA_LEN],
                        }),
                    )
                    .to_bytes(),
                );
                let connection = self.connection_mut(key).expect("checked above");
                connection.transaction_id = tid;
                connection.cm = CmState::DreqSent(Retransmit {
                    mad: mad.clone(),
                    deadline: now + connection.interval,
                    retries_left: connection.max_retries,
                });
                self.send(device, &mad, peer);
            }
            CmState::DreqRcvd => {
                self.qp_to_error(key);
                self.send_drep(device, tid, local, remote, &[], peer);
                self.enter_timewait(key, now);
            }
            // Already disconnecting, in TimeWait, or not yet established — REP_SENT and
            // MRA_REP_RCVD included, where a lost RTU leaves a passive side whose QP
            // already carries traffic: Linux (cm.c cm_send_dreq_locked, ib_send_cm_drep)
            // moves the QP to ERR, sends neither DREQ nor DREP nor REJ, and returns 0. The
            // REP keeps being retransmitted, and the peer's DREQ is taken in REP_SENT
            // (`on_dreq`); a REJ here would reach a peer that is established and
            // disconnecting as a rejection (perftest: "RDMA_CM_EVENT_REJECTED; error: 28").
            _ => self.qp_to_error(key),
        }
        Ok(())
    }

    /// `rdma_establish`: RTU for an active id whose application moved its own QP.
    pub fn establish(&mut self, key: IdKey) -> Result<()> {
        let device = self.entry(key)?.device.ok_or_else(|| self.invalid(key, "establish"))?;
        let Some(connection) = self.connection_mut(key) else {
            return Err(self.invalid(key, "establish"));
        };
        if !matches!(connection.cm, CmState::RepRcvd) {
            return Err(self.invalid(key, "establish"));
        }
        connection.cm = CmState::Established;
        let (tid, local, remote, peer) = (
            connection.transaction_id,
            connection.local_comm_id,
            connection.remote_comm_id,
            connection.peer,
        );
        self.send_rtu(device, tid, local, remote, peer);
        Ok(())
    }

    /// `rdma_notify` with `IBV_EVENT_COMM_EST`: the QP received its first packet, so the
    /// connection is established even if the RTU is lost.
    pub fn communication_established(&mut self, key: IdKey) -> Result<()> {
        let Some(connection) = self.connection_mut(key) else {
            return Err(self.invalid(key, "notify"));
        };
        if matches!(connection.cm, CmState::RepSent(_) | CmState::MraRepRcvd(_)) {
            connection.cm = CmState::Established;
            self.event(key, CmEventKind::Established, 0);
        }
        Ok(())
    }

    // ---- sending helpers ----------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn send_rej(
        &mut self,
        device: usize,
        transaction_id: u64,
        local_comm_id: u32,
        remote_comm_id: u32,
        message_rejected: u8,
        reason: RejReason,
        ari: &[u8; rej::ARI_LEN],
        ari_length: u8,
        private: &[u8],
        peer: MadPeer,
    ) {
        let mut private_data = [0u8; rej::PRIVATE_DATA_LEN];
        let n = private.len().min(rej::PRIVATE_DATA_LEN);
        private_data[..n].copy_from_slice(&private[..n]);
        self.counters.rejects_sent += 1;
        self.send_message(
            device,
            transaction_id,
            CmMessage::Rej(RejRepr {
                local_comm_id,
                remote_comm_id,
                message_rejected,
                reject_info_length: ari_length,
                reason,
                ari: *ari,
                private_data,
            }),
            peer,
        );
    }

    fn send_drep(&mut self, device: usize, tid: u64, local: u32, remote: u32, private: &[u8], peer: MadPeer) {
        let mut private_data = [0u8; drep::PRIVATE_DATA_LEN];
        let n = private.len().min(drep::PRIVATE_DATA_LEN);
        private_data[..n].copy_from_slice(&private[..n]);
        self.send_message(
            device,
            tid,
            CmMessage::Drep(DrepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data,
            }),
            peer,
        );
    }

    fn send_rtu(&mut self, device: usize, tid: u64, local: u32, remote: u32, peer: MadPeer) {
        self.send_message(
            device,
            tid,
            CmMessage::Rtu(RtuRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: [0; rtu::PRIVATE_DATA_LEN],
            }),
            peer,
        );
    }

    fn send_mra(&mut self, device: usize, tid: u64, local: u32, remote: u32, mraed: u8, peer: MadPeer) {
        let service_timeout = self.config.mra_service_timeout;
        self.send_message(
            device,
            tid,
            CmMessage::Mra(MraRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                message_mraed: mraed,
                service_timeout,
                private_data: [0; mra::PRIVATE_DATA_LEN],
            }),
            peer,
        );
    }

    fn send_sidr_rep(
        &mut self,
        device: usize,
        request: &SidrRequest,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private: &[u8],
    ) {
        let mut private_data = [0u8; sidr::reply::PRIVATE_DATA_LEN];
        let n = private.len().min(private_data.len());
        private_data[..n].copy_from_slice(&private[..n]);
        self.send_message(
            device,
            request.transaction_id,
            CmMessage::SidrRep(SidrRepRepr {
                request_id: request.request_id,
                status,
                info_length: 0,
                qpn,
                service_id: request.service_id,
                qkey,
                info: [0; sidr::reply::INFO_LEN],
                private_data,
            }),
            request.peer,
        );
    }

    // ---- receiving ----------------------------------------------------------------------

    /// One MAD from device `device`'s QP1.
    pub fn handle_mad(&mut self, device: usize, received: ReceivedMad, now: u64) {
        // Any source QP is accepted, as Linux's MAD layer does; answers go to QP1.
        if received.bytes.len() > MAD_LEN {
            diag!(self.counters.malformed, length = received.bytes.len(), from = %received.source, "datagram on QP1 longer than a MAD: dropped");
            return;
        }
        let mad = match CmMad::parse(&received.bytes) {
            Ok(mad) => mad,
            Err(MadError::NotCm { field, value }) => {
                diag!(self.counters.not_cm, field, value, from = %received.source, "not a CM MAD: dropped");
                return;
            }
            Err(MadError::UnknownAttribute(attribute)) => {
                diag!(self.counters.unknown_attribute, attribute, from = %received.source, "CM attribute not handled: dropped");
                return;
            }
            Err(error) => {
                diag!(self.counters.malformed, %error, length = received.bytes.len(), from = %received.source, "malformed CM MAD: dropped");
                return;
            }
        };
        self.counters.received += 1;
        tracing::debug!(target: "rnic::cm", message = mad.message.name(), tid = mad.transaction_id, from = %received.source, "received");
        let tid = mad.transaction_id;
        match mad.message {
            CmMessage::Req(m) => self.on_req(device, tid, m, &received, now),
            CmMessage::Mra(m) => self.on_mra(m, now),
            CmMessage::Rej(m) => self.on_rej(m, now),
            CmMessage::Rep(m) => self.on_rep(device, m, &received, now),
            CmMessage::Rtu(m) => self.on_rtu(m),
            CmMessage::Dreq(m) => self.on_dreq(device, tid, m, &received, now),
            CmMessage::Drep(m) => self.on_drep(m, now),
            CmMessage::SidrReq(m) => self.on_sidr_req(device, tid, m, &received),
            CmMessage::SidrRep(m) => self.on_sidr_rep(m),
        }
    }

    /// The listener for a REQ's Service ID and IP header (cma's listener matching).
    fn find_listener(&self, device: usize, space: PortSpace, port: u16, header: &CmaHeaderRepr) -> Option<IdKey> {
        let keys = self.ports.get(&(space, port))?;
        keys.iter().copied().find(|key| {
            let Some(entry) = self.ids.get(key) else { return false };
            if !matches!(entry.state, IdState::Listen { .. }) {
                return false;
            }
            if entry.device.is_some_and(|d| d != device) {
                return false;
            }
            // As Linux's cma_match_private_data: a wildcard that is not family-only takes
            // both families; otherwise the family must match, and the address unless it
            // is the wildcard.
            match entry.source.map(|s| s.ip()) {
                Some(ip) if ip.is_unspecified() && !entry.afonly => true,
                Some(ip) if ip.is_ipv4() != header.destination.is_ipv4() => false,
                Some(ip) => ip.is_unspecified() || ip == header.destination,
                None => false,
            }
        })
    }

    fn any_listener(&self, space: PortSpace, port: u16) -> bool {
        self.ports.get(&(space, port)).is_some_and(|keys| {
            keys.iter().any(|k| {
                self.ids
                    .get(k)
                    .is_some_and(|e| matches!(e.state, IdState::Listen { .. }))
            })
        })
    }

    fn on_req(&mut self, device: usize, tid: u64, m: ReqRepr, received: &ReceivedMad, now: u64) {
        let peer = MadPeer {
            traffic_class: m.primary_path.traffic_class,
            flow_label: m.primary_path.flow_label,
            hop_limit: self.config.hop_limit,
            ..received.peer
        };
        let no_ari = [0u8; rej::ARI_LEN];
        // Duplicate: the same REQ again (our REP or REJ may be lost, or we are slow).
        if let Some(&existing) = self.remote_ids.get(&(m.local_comm_id, m.local_ca_guid)) {
            self.counters.duplicates += 1;
            let answer = self.connection(existing).and_then(|c| {
                (matches!(c.cm, CmState::ReqRcvd) && c.mra_armed).then_some((
                    c.transaction_id,
                    c.local_comm_id,
                    c.remote_comm_id,
                ))
            });
            if let Some((tid, local, remote)) = answer {
                self.send_mra(device, tid, local, remote, mra::mraed::REQ, peer);
            }
            return;
        }
        // Stale: a live connection already uses the requester's QP.
        if let Some(&old) = self.remote_qpns.get(&(m.local_qpn, m.local_ca_guid)) {
            diag!(self.counters.stale_connections, qpn = m.local_qpn, from = %received.source, "REQ for a QP still connected here: REJ stale connection");
            self.send_rej(
                device,
                tid,
                0,
                m.local_comm_id,
                rej::rejected::REQ,
                RejReason::StaleConnection,
                &no_ari,
                0,
                &[],
                peer,
            );
            self.remove_remote(old);
            self.dreq_stale(old, now);
            return;
        }
        let service = PortSpace::split_service_id(m.service_id);
        let Some((space, port)) = service else {
            diag!(self.counters.no_listener, service_id = m.service_id, from = %received.source, "REQ for a Service ID that is not RDMA-CM: REJ invalid Service ID");
            self.send_rej(
                device,
                tid,
                0,
                m.local_comm_id,
                rej::rejected::REQ,
                RejReason::InvalidServiceId,
                &no_ari,
                0,
                &[],
                peer,
            );
            return;
        };
        if !self.any_listener(space, port) {
            diag!(self.counters.no_listener, port, from = %received.source, "REQ for a port nobody listens on: REJ invalid Service ID");
            self.send_rej(
                device,
                tid,
                0,
                m.local_comm_id,
                rej::rejected::REQ,
                RejReason::InvalidServiceId,
                &no_ari,
                0,
                &[],
                peer,
            );
            return;
        }
        let header = match CmaHeaderRepr::parse(&cma::Packet::new_unchecked(&m.private_data[..CMA_HEADER_LEN])) {
            Ok(header) => header,
            Err(error) => {
                diag!(self.counters.malformed, %error, from = %received.source, "REQ with a bad RDMA-CM IP header: REJ consumer defined");
                self.send_rej(
                    device,
                    tid,
                    0,
                    m.local_comm_id,
                    rej::rejected::REQ,
                    RejReason::ConsumerDefined,
                    &no_ari,
                    0,
                    &[],
                    peer,
                );
                return;
            }
        };
        if m.transport != TransportType::Rc || !matches!(space, PortSpace::Tcp | PortSpace::Ib) {
            diag!(self.counters.malformed, transport = ?m.transport, "REQ for another transport than RC: REJ invalid transport type");
            self.send_rej(
                device,
                tid,
                0,
                m.local_comm_id,
                rej::rejected::REQ,
                RejReason::InvalidTransportType,
                &no_ari,
                0,
                &[],
                peer,
            );
            return;
        }
        let Some(sgid_index) = self
            .agent(device)
            .ok()
            .and_then(|a| a.gid_index(gid_to_ip(crate::verbs::Gid(m.primary_path.remote_gid))))
        else {
            let mut ari = [0u8; rej::ARI_LEN];
            if let Ok(agent) = self.agent(device) {
                if let Some((gid, _)) = agent.gids.first().copied().flatten() {
                    ari[..16].copy_from_slice(&gid.raw());
                }
            }
            diag!(self.counters.malformed, from = %received.source, "REQ for a GID not ours: REJ invalid GID");
            self.send_rej(
                device,
                tid,
                0,
                m.local_comm_id,
                rej::rejected::REQ,
                RejReason::InvalidGid,
                &ari,
                16,
                &[],
                peer,
            );
            return;
        };
        let Some(listener) = self.find_listener(device, space, port, &header) else {
            diag!(self.counters.no_listener, port, destination = %header.destination, "REQ for an address no listener is bound to: REJ consumer defined");
            self.send_rej(
                device,
                tid,
                0,
                m.local_comm_id,
                rej::rejected::REQ,
                RejReason::ConsumerDefined,
                &no_ari,
                0,
                &[],
                peer,
            );
            return;
        };
        let pending = self
            .ids
            .values()
            .filter(|e| {
                e.listener == Some(listener)
                    && matches!(&e.state, IdState::Connection(c) if matches!(c.cm, CmState::ReqRcvd))
            })
            .count() as u32;
        let (channel, context, backlog) = match self.ids.get(&listener) {
            Some(IdEntry {
                channel,
                context,
                state: IdState::Listen { backlog },
                ..
            }) => (channel.clone(), *context, *backlog),
            _ => return,
        };
        if pending >= backlog {
            diag!(
                self.counters.backlog_full,
                port,
                "listener backlog full: REQ dropped (the requester retries)"
            );
            return;
        }
        let mtu = match Mtu::try_from(m.path_mtu) {
            Ok(mtu) => mtu,
            Err(_) => {
                diag!(
                    self.counters.malformed,
                    mtu = m.path_mtu,
                    "REQ with an invalid path MTU: REJ invalid MTU"
                );
                self.send_rej(
                    device,
                    tid,
                    0,
                    m.local_comm_id,
                    rej::rejected::REQ,
                    RejReason::InvalidMtu,
                    &no_ari,
                    0,
                    &[],
                    peer,
                );
                return;
            }
        };
        let max_rd = self.agent(device).map(|a| a.max_rd_atomic).unwrap_or(1);
        let mtu = if mtu.bytes() > self.agent(device).map(|a| a.active_mtu.bytes()).unwrap_or(4096) {
            self.agent(device).map(|a| a.active_mtu).unwrap_or(mtu)
        } else {
            mtu
        };
        let key = match self.create_id(channel, context, space) {
            Ok(key) => key,
            Err(_) => return,
        };
        let local_comm_id = self.new_comm_id();
        let sequence = self.entry(key).map(|e| e.sequence).unwrap_or(0);
        let av = AhAttributes {
            dgid: crate::verbs::Gid(m.primary_path.local_gid),
            flow_label: m.primary_path.flow_label,
            sgid_index,
            hop_limit: self.config.hop_limit,
            traffic_class: m.primary_path.traffic_class,
            dmac: received.peer.dmac,
            sl: m.primary_path.sl.min(7),
            ..AhAttributes::default()
        };
        let connection = Connection {
            cm: CmState::ReqRcvd,
            active: false,
            local_comm_id,
            remote_comm_id: m.local_comm_id,
            transaction_id: tid,
            remote_guid: m.local_ca_guid,
            local_qpn: 0,
            remote_qpn: m.local_qpn,
            peer,
            interval: iba_time_ns(m.local_cm_response_timeout),
            max_retries: m.max_cm_retries,
            av_timeout: m.primary_path.local_ack_timeout,
            mtu,
            sq_psn: m.starting_psn,
            rq_psn: sequence,
            // From our side: what the requester keeps outstanding is what we accept.
            responder_resources: m.initiator_depth.min(max_rd),
            initiator_depth: m.responder_resources,
            retry_count: m.retry_count,
            rnr_retry_count: m.rnr_retry_count,
            av,
            flow_control: m.end_to_end_flow_control,
            srq: false,
            mra_armed: true,
            disconnect_reported: false,
            in_remote_tables: true,
        };
        self.local_comm.insert(local_comm_id, key);
        self.remote_ids.insert((m.local_comm_id, m.local_ca_guid), key);
        self.remote_qpns.insert((m.local_qpn, m.local_ca_guid), key);
        if let Some(entry) = self.ids.get_mut(&key) {
            entry.device = Some(device);
            entry.source = Some(SocketAddr::new(header.destination, port));
            entry.destination = Some(header.source);
            entry.dmac = Some(received.peer.dmac);
            entry.listener = Some(listener);
            entry.state = IdState::Connection(Box::new(connection));
        }
        let conn = ConnEventParam {
            responder_resources: m.initiator_depth,
            initiator_depth: m.responder_resources,
            flow_control: m.end_to_end_flow_control,
            retry_count: m.retry_count,
            rnr_retry_count: m.rnr_retry_count,
            srq: m.srq,
            qp_num: m.local_qpn,
        };
        if let Some(event) = self.event(key, CmEventKind::ConnectRequest, 0) {
            event.listen_id = Some(listener);
            event.private_data = m.private_data[CMA_HEADER_LEN..].to_vec();
            event.conn = conn;
        }
    }

    /// A REQ found the requester's QP in a live connection of ours: that connection is
    /// stale; ask its peer to disconnect (Linux sends a DREQ).
    fn dreq_stale(&mut self, key: IdKey, now: u64) {
        let Some(connection) = self.connection(key) else { return };
        if matches!(connection.cm, CmState::Established) {
            let _ = self.disconnect(key, now);
        }
    }

    fn on_rep(&mut self, device: usize, m: RepRepr, received: &ReceivedMad, now: u64) {
        let key = self.local_comm.get(&m.remote_comm_id).copied();
        let waiting = key
            .and_then(|k| self.connection(k))
            .is_some_and(|c| c.active && matches!(c.cm, CmState::ReqSent(_) | CmState::MraReqRcvd(_)));
        if !waiting {
            // A duplicate REP: answer it again, or drop it (Linux's cm_dup_rep_handler).
            let matched = key.filter(|k| {
                self.connection(*k)
                    .is_some_and(|c| c.remote_comm_id == m.local_comm_id && c.remote_guid == m.local_ca_guid)
            });
            let Some(key) = matched else {
                diag!(self.counters.unmatched, remote_comm_id = m.remote_comm_id, from = %received.source, "REP for no connection of ours: dropped");
                return;
            };
            self.counters.duplicates += 1;
            let connection = self.connection(key).expect("matched");
            let (tid, local, remote, peer) = (
                connection.transaction_id,
                connection.local_comm_id,
                connection.remote_comm_id,
                connection.peer,
            );
            let established = matches!(connection.cm, CmState::Established);
            let mra = matches!(connection.cm, CmState::RepRcvd) && connection.mra_armed;
            if established {
                self.send_rtu(device, tid, local, remote, peer);
            } else if mra {
                self.send_mra(device, tid, local, remote, mra::mraed::REP, peer);
            }
            return;
        }
        let key = key.expect("waiting implies a key");
        if let Some(&other) = self.remote_ids.get(&(m.local_comm_id, m.local_ca_guid)) {
            if other != key {
                self.counters.duplicates += 1;
                return;
            }
        }
        if let Some(&old) = self.remote_qpns.get(&(m.local_qpn, m.local_ca_guid)) {
            if old != key {
                let connection = self.connection(key).expect("waiting");
                let (tid, local, peer) = (connection.transaction_id, connection.local_comm_id, connection.peer);
                diag!(
                    self.counters.stale_connections,
                    qpn = m.local_qpn,
                    "REP from a QP still connected here: REJ stale connection"
                );
                self.send_rej(
                    device,
                    tid,
                    local,
                    m.local_comm_id,
                    rej::rejected::REP,
                    RejReason::StaleConnection,
                    &[0; rej::ARI_LEN],
                    0,
                    &[],
                    peer,
                );
                self.remove_remote(old);
                self.dreq_stale(old, now);
                return;
            }
        }
        let has_qp = self.ids.get(&key).is_some_and(|e| e.qp.is_some());
        let connection = self.connection_mut(key).expect("waiting");
        connection.remote_comm_id = m.local_comm_id;
        connection.remote_guid = m.local_ca_guid;
        connection.remote_qpn = m.local_qpn;
        connection.sq_psn = m.starting_psn;
        connection.rnr_retry_count = m.rnr_retry_count;
        // The acceptor's answer bounds ours: it reads from us at most its initiator depth.
        connection.initiator_depth = connection.initiator_depth.min(m.responder_resources);
        connection.av_timeout = ack_timeout(m.target_ack_delay, connection.av_timeout.saturating_sub(1));
        connection.in_remote_tables = true;
        let (local, tid, peer) = (connection.local_comm_id, connection.transaction_id, connection.peer);
        self.remote_ids.insert((m.local_comm_id, m.local_ca_guid), key);
        self.remote_qpns.insert((m.local_qpn, m.local_ca_guid), key);
        let conn = ConnEventParam {
            responder_resources: m.initiator_depth,
            initiator_depth: m.responder_resources,
            flow_control: m.end_to_end_flow_control,
            retry_count: self.connection(key).map_or(7, |c| c.retry_count),
            rnr_retry_count: m.rnr_retry_count,
            srq: m.srq,
            qp_num: m.local_qpn,
        };
        if !has_qp {
            let connection = self.connection_mut(key).expect("waiting");
            connection.cm = CmState::RepRcvd;
            connection.mra_armed = true;
            if let Some(event) = self.event(key, CmEventKind::ConnectResponse, 0) {
                event.private_data = m.private_data.to_vec();
                event.conn = conn;
            }
            return;
        }
        if let Err(error) = self.program_qp(key) {
            tracing::warn!(target: "rnic::diag", %error, "QP refused the negotiated attributes: REJ");
            self.send_rej(
                device,
                tid,
                local,
                m.local_comm_id,
                rej::rejected::REP,
                RejReason::ConsumerDefined,
                &[0; rej::ARI_LEN],
                0,
                &[],
                peer,
            );
            self.enter_timewait(key, now);
            self.qp_to_error(key);
            self.event(key, CmEventKind::ConnectError, -super::error::EINVAL);
            return;
        }
        self.connection_mut(key).expect("waiting").cm = CmState::Established;
        self.send_rtu(device, tid, local, m.local_comm_id, peer);
        if let Some(event) = self.event(key, CmEventKind::Established, 0) {
            event.private_data = m.private_data.to_vec();
            event.conn = conn;
        }
    }

    fn on_rtu(&mut self, m: RtuRepr) {
        let key = self
            .local_comm
            .get(&m.remote_comm_id)
            .copied()
            .filter(|k| self.connection(*k).is_some_and(|c| c.remote_comm_id == m.local_comm_id));
        let Some(key) = key else {
            diag!(
                self.counters.unmatched,
                remote_comm_id = m.remote_comm_id,
                "RTU for no connection of ours: dropped"
            );
            return;
        };
        if !self
            .connection(key)
            .is_some_and(|c| matches!(c.cm, CmState::RepSent(_) | CmState::MraRepRcvd(_)))
        {
            self.counters.duplicates += 1;
            return;
        }
        self.connection_mut(key).expect("matched").cm = CmState::Established;
        if let Some(event) = self.event(key, CmEventKind::Established, 0) {
            event.private_data = m.private_data.to_vec();
        }
    }

    fn on_rej(&mut self, m: RejRepr, now: u64) {
        // Linux's cm_acquire_rejected_id.
        let key = if m.reason == RejReason::Timeout {
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&m.ari[..8]);
            self.remote_ids
                .get(&(m.local_comm_id, u64::from_be_bytes(guid)))
                .copied()
        } else if m.message_rejected == rej::rejected::REQ {
            self.local_comm.get(&m.remote_comm_id).copied()
        } else {
            self.local_comm
                .get(&m.remote_comm_id)
                .copied()
                .filter(|k| self.connection(*k).is_some_and(|c| c.remote_comm_id == m.local_comm_id))
        };
        let Some(key) = key.filter(|k| self.connection(*k).is_some()) else {
            diag!(
                self.counters.unmatched,
                remote_comm_id = m.remote_comm_id,
                reason = m.reason.code(),
                "REJ for no connection of ours: dropped"
            );
            return;
        };
        let state = self.connection(key).expect("filtered").cm.clone();
        match state {
            CmState::ReqSent(_)
            | CmState::MraReqRcvd(_)
            | CmState::RepSent(_)
            | CmState::MraRepRcvd(_)
            | CmState::ReqRcvd => {
                if m.reason == RejReason::StaleConnection {
                    self.enter_timewait(key, now);
                } else {
                    self.finish(key);
                }
            }
            CmState::DreqSent(_) | CmState::RepRcvd | CmState::Established => self.enter_timewait(key, now),
            _ => {
                self.counters.duplicates += 1;
                return;
            }
        }
        self.qp_to_error(key);
        if let Some(event) = self.event(key, CmEventKind::Rejected, i32::from(m.reason.code())) {
            event.private_data = m.private_data.to_vec();
        }
    }

    fn on_mra(&mut self, m: MraRepr, now: u64) {
        let key = match m.message_mraed {
            mra::mraed::REQ => self.local_comm.get(&m.remote_comm_id).copied(),
            _ => self
                .local_comm
                .get(&m.remote_comm_id)
                .copied()
                .filter(|k| self.connection(*k).is_some_and(|c| c.remote_comm_id == m.local_comm_id)),
        };
        let Some(key) = key.filter(|k| self.connection(*k).is_some()) else {
            diag!(
                self.counters.unmatched,
                remote_comm_id = m.remote_comm_id,
                "MRA for no connection of ours: dropped"
            );
            return;
        };
        let connection = self.connection_mut(key).expect("filtered");
        let extension = iba_time_ns(m.service_timeout) + iba_time_ns(connection.av_timeout);
        let state = std::mem::replace(&mut connection.cm, CmState::Done);
        let (state, duplicate) = match (state, m.message_mraed) {
            (CmState::ReqSent(mut r), mra::mraed::REQ) => {
                r.deadline = now + extension;
                (CmState::MraReqRcvd(r), false)
            }
            (CmState::RepSent(mut r), mra::mraed::REP) => {
                r.deadline = now + extension;
                (CmState::MraRepRcvd(r), false)
            }
            (other, _) => (other, true),
        };
        connection.cm = state;
        if duplicate {
            self.counters.duplicates += 1;
        }
    }

    fn on_dreq(&mut self, device: usize, tid: u64, m: DreqRepr, received: &ReceivedMad, now: u64) {
        let key = self
            .local_comm
            .get(&m.remote_comm_id)
            .copied()
            .filter(|k| self.connection(*k).is_some_and(|c| c.remote_comm_id == m.local_comm_id));
        let Some(key) = key else {
            // Linux answers a DREQ it cannot match with a DREP anyway, so the peer stops.
            diag!(self.counters.unknown_dreq_answered, remote_comm_id = m.remote_comm_id, from = %received.source, "DREQ for no connection of ours: DREP");
            self.send_drep(device, tid, m.remote_comm_id, m.local_comm_id, &[], received.peer);
            return;
        };
        let connection = self.connection(key).expect("matched");
        let (expected, local, remote, peer) = (
            connection.local_qpn,
            connection.local_comm_id,
            connection.remote_comm_id,
            connection.peer,
        );
        let state = connection.cm.clone();
        if expected != m.remote_qpn {
            diag!(
                self.counters.dreq_wrong_qpn,
                qpn = m.remote_qpn,
                expected,
                "DREQ naming another QP: ignored"
            );
            return;
        }
        match state {
            CmState::RepSent(_) | CmState::DreqSent(_) | CmState::Established | CmState::MraRepRcvd(_) => {}
            CmState::TimeWait { .. } => {
                self.counters.duplicates += 1;
                self.send_drep(device, tid, local, remote, &[], peer);
                return;
            }
            _ => {
                self.counters.duplicates += 1;
                return;
            }
        }
        let connection = self.connection_mut(key).expect("matched");
        connection.cm = CmState::DreqRcvd;
        connection.transaction_id = tid;
        let report = !connection.disconnect_reported;
        connection.disconnect_reported = true;
        let _ = now;
        if report {
            if let Some(event) = self.event(key, CmEventKind::Disconnected, 0) {
                event.private_data = m.private_data.to_vec();
            }
        }
    }

    fn on_drep(&mut self, m: DrepRepr, now: u64) {
        let key = self
            .local_comm
            .get(&m.remote_comm_id)
            .copied()
            .filter(|k| self.connection(*k).is_some_and(|c| c.remote_comm_id == m.local_comm_id));
        let Some(key) = key else {
            diag!(
                self.counters.unmatched,
                remote_comm_id = m.remote_comm_id,
                "DREP for no connection of ours: dropped"
            );
            return;
        };
        let connection = self.connection_mut(key).expect("matched");
        if !matches!(connection.cm, CmState::DreqSent(_) | CmState::DreqRcvd) {
            self.counters.duplicates += 1;
            return;
        }
        let connection = self.connection_mut(key).expect("matched");
        let report = !connection.disconnect_reported;
        connection.disconnect_reported = true;
        self.enter_timewait(key, now);
        if report {
            if let Some(event) = self.event(key, CmEventKind::Disconnected, 0) {
                event.private_data = m.private_data.to_vec();
            }
        }
    }

    fn on_sidr_req(&mut self, device: usize, tid: u64, m: SidrReqRepr, received: &ReceivedMad) {
        let peer = MadPeer {
            hop_limit: self.config.hop_limit,
            ..received.peer
        };
        let duplicate_key = (m.request_id, peer.dgid.raw());
        if self.sidr_requests.contains_key(&duplicate_key) {
            self.counters.duplicates += 1;
            return;
        }
        let request = SidrRequest {
            request_id: m.request_id,
            transaction_id: tid,
            service_id: m.service_id,
            peer,
        };
        let header = CmaHeaderRepr::parse(&cma::Packet::new_unchecked(&m.private_data[..CMA_HEADER_LEN]));
        let listener = match (PortSpace::split_service_id(m.service_id), &header) {
            (Some((space, port)), Ok(header)) => self.find_listener(device, space, port, header).map(|l| (l, port)),
            _ => None,
        };
        let (Some((listener, port)), Ok(header)) = (listener, header) else {
            diag!(self.counters.no_listener, service_id = m.service_id, from = %received.source, "SIDR_REQ for a service nobody listens on: SIDR_REP unsupported");
            self.send_sidr_rep(device, &request, SidrStatus::Unsupported, 0, 0, &[]);
            return;
        };
        let (channel, context, space) = match self.ids.get(&listener) {
            Some(e) => (e.channel.clone(), e.context, e.port_space),
            None => return,
        };
        let Ok(key) = self.create_id(channel, context, space) else {
            return;
        };
        if let Some(entry) = self.ids.get_mut(&key) {
            entry.device = Some(device);
            entry.source = Some(SocketAddr::new(header.destination, port));
            entry.destination = Some(header.source);
            entry.dmac = Some(peer.dmac);
            entry.listener = Some(listener);
            entry.state = IdState::SidrRequest(Box::new(request));
        }
        self.sidr_requests.insert(duplicate_key, key);
        let ah_attr = AhAttributes {
            dgid: peer.dgid,
            sgid_index: peer.sgid_index,
            hop_limit: peer.hop_limit,
            traffic_class: peer.traffic_class,
            flow_label: peer.flow_label,
            dmac: peer.dmac,
            ..AhAttributes::default()
        };
        if let Some(event) = self.event(key, CmEventKind::ConnectRequest, 0) {
            event.listen_id = Some(listener);
            event.private_data = m.private_data[CMA_HEADER_LEN..].to_vec();
            event.ud = Some(UdEventParam {
                ah_attr,
                qp_num: 0,
                qkey: RDMA_UDP_QKEY,
            });
        }
    }

    fn on_sidr_rep(&mut self, m: SidrRepRepr) {
        let key = self.local_comm.get(&m.request_id).copied();
        let Some((key, route)) = key.and_then(|k| {
            let entry = self.ids.get(&k)?;
            matches!(&entry.state, IdState::SidrQuery(q) if q.request_id == m.request_id).then_some((k, entry.route))
        }) else {
            diag!(
                self.counters.unmatched,
                request_id = m.request_id,
                "SIDR_REP for no request of ours: dropped"
            );
            return;
        };
        self.local_comm.remove(&m.request_id);
        let success = m.status == SidrStatus::Success;
        if let Some(entry) = self.ids.get_mut(&key) {
            entry.state = if success { IdState::UdReady } else { IdState::Closed };
        }
        let (kind, status) = if success {
            (CmEventKind::Established, 0)
        } else {
            (CmEventKind::Unreachable, i32::from(m.status.code()))
        };
        if let Some(event) = self.event(key, kind, status) {
            event.private_data = m.private_data.to_vec();
            if success {
                event.ud = route.map(|route| UdEventParam {
                    ah_attr: route_av(&route),
                    qp_num: m.qpn,
                    qkey: m.qkey,
                });
            }
        }
    }

    // ---- timers -------------------------------------------------------------------------

    /// The earliest time a timer is due.
    pub fn next_deadline(&self) -> Option<u64> {
        self.ids.values().filter_map(|e| e.state.deadline()).min()
    }

    /// Runs every timer due by `now`: retransmissions, give-ups, timewait exits,
    /// neighbour retries.
    pub fn run_timers(&mut self, now: u64) {
        let due: Vec<IdKey> = self
            .ids
            .iter()
            .filter(|(_, e)| e.state.deadline().is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            self.expire(key, now);
        }
    }

    fn expire(&mut self, key: IdKey, now: u64) {
        let Some(entry) = self.ids.get_mut(&key) else { return };
        let device = entry.device.unwrap_or(0);
        let response_timeout = iba_time_ns(self.config.cm_response_timeout);
        /// What a due timer asks for, decided while the id is borrowed.
        enum Due {
            Neighbour,
            Resend(Box<[u8; MAD_LEN]>, MadPeer),
            SidrGiveUp(u32),
            TimewaitExit,
            ConnectGiveUp,
            DreqGiveUp,
            Nothing,
        }
        let due = match &mut entry.state {
            IdState::AddrQuery(_) => Due::Neighbour,
            IdState::SidrQuery(query) => {
                if query.retransmit.retries_left > 0 {
                    query.retransmit.retries_left -= 1;
                    query.retransmit.deadline = now + response_timeout;
                    Due::Resend(query.retransmit.mad.clone(), query.peer)
                } else {
                    Due::SidrGiveUp(query.request_id)
                }
            }
            IdState::Connection(connection) => {
                let (interval, peer) = (connection.interval, connection.peer);
                let disconnecting = matches!(connection.cm, CmState::DreqSent(_));
                match &mut connection.cm {
                    CmState::TimeWait { .. } => Due::TimewaitExit,
                    cm => match cm.retransmit_mut() {
                        Some(retransmit) if retransmit.retries_left > 0 => {
                            retransmit.retries_left -= 1;
                            retransmit.deadline = now + interval;
                            Due::Resend(retransmit.mad.clone(), peer)
                        }
                        Some(_) if disconnecting => Due::DreqGiveUp,
                        Some(_) => Due::ConnectGiveUp,
                        None => Due::Nothing,
                    },
                }
            }
            _ => Due::Nothing,
        };
        match due {
            Due::Nothing => {}
            Due::Neighbour => self.try_neighbour(key, now),
            Due::Resend(mad, peer) => {
                self.counters.retransmissions += 1;
                self.send(device, &mad, peer);
            }
            Due::SidrGiveUp(request_id) => {
                if let Some(entry) = self.ids.get_mut(&key) {
                    entry.state = IdState::Closed;
                }
                self.local_comm.remove(&request_id);
                self.counters.timeouts += 1;
                self.event(key, CmEventKind::Unreachable, -ETIMEDOUT);
            }
            Due::TimewaitExit => {
                if let Some(connection) = self.connection_mut(key) {
                    connection.cm = CmState::Done;
                }
                self.event(key, CmEventKind::TimewaitExit, 0);
            }
            Due::ConnectGiveUp => {
                self.counters.timeouts += 1;
                self.finish(key);
                self.qp_to_error(key);
                self.event(key, CmEventKind::Unreachable, -ETIMEDOUT);
            }
            Due::DreqGiveUp => {
                self.counters.timeouts += 1;
                let report = self
                    .connection_mut(key)
                    .is_some_and(|c| !std::mem::replace(&mut c.disconnect_reported, true));
                self.enter_timewait(key, now);
                if report {
                    self.event(key, CmEventKind::Disconnected, -ETIMEDOUT);
                }
            }
        }
    }

    // ---- inspection ---------------------------------------------------------------------

    pub fn state_name(&self, key: IdKey) -> String {
        self.ids
            .get(&key)
            .map_or_else(|| "destroyed".into(), |e| e.state.name())
    }
}

/// The QP's path from a route.
fn route_av(route: &Route) -> AhAttributes {
    AhAttributes {
        dgid: route.dgid,
        flow_label: route.flow_label,
        sgid_index: route.sgid_index,
        hop_limit: route.hop_limit,
        traffic_class: route.traffic_class,
        dmac: route.dmac,
        sl: route.sl,
        ..AhAttributes::default()
    }
}

/// Linux's `cm_init_qp_{init,rtr,rts}_attr` with rdma_cm's overrides: what the
/// connection's QP is given at each step.
fn connection_qp_attributes(connection: &Connection, state: QpState) -> (QpAttributes, QpAttributeMask) {
    match state {
        QpState::Init => {
            let mut access = AccessFlags::REMOTE_WRITE;
            if connection.responder_resources > 0 {
                access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
            }
            (
                QpAttributes {
                    qp_state: QpState::Init,
                    qp_access_flags: access,
                    pkey_index: 0,
                    port_num: 1,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE
                    | QpAttributeMask::ACCESS_FLAGS
                    | QpAttributeMask::PKEY_INDEX
                    | QpAttributeMask::PORT,
            )
        }
        QpState::Rtr => (
            QpAttributes {
                qp_state: QpState::Rtr,
                ah_attr: connection.av,
                path_mtu: connection.mtu,
                dest_qp_num: connection.remote_qpn,
                rq_psn: connection.rq_psn,
                max_dest_rd_atomic: connection.responder_resources,
                min_rnr_timer: 0,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::AV
                | QpAttributeMask::PATH_MTU
                | QpAttributeMask::DEST_QPN
                | QpAttributeMask::RQ_PSN
                | QpAttributeMask::MAX_DEST_RD_ATOMIC
                | QpAttributeMask::MIN_RNR_TIMER,
        ),
        _ => (
            QpAttributes {
                qp_state: QpState::Rts,
                sq_psn: connection.sq_psn,
                timeout: connection.av_timeout,
                retry_cnt: connection.retry_count,
                rnr_retry: connection.rnr_retry_count,
                max_rd_atomic: connection.initiator_depth,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::SQ_PSN
                | QpAttributeMask::TIMEOUT
                | QpAttributeMask::RETRY_CNT
                | QpAttributeMask::RNR_RETRY
                | QpAttributeMask::MAX_QP_RD_ATOMIC,
        ),
    }
}
