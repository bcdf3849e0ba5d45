//! The connection-management seam (librdmacm's shape): what a storage protocol's queue
//! logic needs from whoever connects its RC QPs.
//!
//! Active side: create an RC QP (RESET), call [`Connector::connect`] with the private
//! data of the request, poll the [`PendingConnect`] until it yields the peer's accept
//! ([`Established`], with its private data) or a reject. Passive side: poll a
//! [`Listener`] for [`IncomingRequest`]s, read their private data, then
//! [`IncomingRequest::accept`] with an RC QP of your own (and your private data) or
//! [`IncomingRequest::reject`] with reject private data. Both ends then hold a
//! [`Connection`] that reports the peer's disconnect and sends their own.

use std::fmt;
use std::net::Ipv4Addr;

use rnic_verbs::{AhAttributes, Context, Gid, Mtu, QueuePair, RcConnection};

/// Where a listener listens: an IPv4 address and a port (RDMA-CM's TCP port space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServiceAddress {
    /// IPv4 address.
    pub ip: Ipv4Addr,
    /// Port (4420 for NVMe-oF).
    pub port: u16,
}

impl ServiceAddress {
    /// `ip:port`.
    pub const fn new(ip: Ipv4Addr, port: u16) -> Self {
        Self { ip, port }
    }
}

impl fmt::Display for ServiceAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

impl std::str::FromStr for ServiceAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, port) = s.rsplit_once(':').ok_or_else(|| format!("{s:?}: expected IPv4:PORT"))?;
        Ok(Self {
            ip: ip.parse().map_err(|e| format!("{ip:?}: {e}"))?,
            port: port.parse().map_err(|e| format!("{port:?}: {e}"))?,
        })
    }
}

/// What the active side asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The service to reach.
    pub destination: ServiceAddress,
    /// Private data of the request (NVMe-oF: 32 bytes, SRP: the login).
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics the peer may have outstanding at this QP (responder
    /// resources, the peer's initiator depth limit).
    pub responder_resources: u8,
    /// RDMA READs this QP keeps outstanding (initiator depth).
    pub initiator_depth: u8,
    /// Transport retries, 0..=7.
    pub retry_count: u8,
    /// RNR retries, 0..=7 (7: forever).
    pub rnr_retry_count: u8,
}

/// What the passive side answers with when it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Private data of the reply (NVMe-oF: 32 bytes).
    pub private_data: Vec<u8>,
    /// RDMA READs the peer may have outstanding at this QP.
    pub responder_resources: u8,
    /// RDMA READs this QP keeps outstanding.
    pub initiator_depth: u8,
    /// RNR retries of this QP, 0..=7.
    pub rnr_retry_count: u8,
}

/// An established connection, from the active side's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Established {
    /// The peer's reply private data.
    pub private_data: Vec<u8>,
    /// The peer's responder resources.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
}

/// Why a connection could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    /// The peer refused, with its reject private data.
    #[error("rejected by the peer ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The reject's private data (NVMe-oF: RECFMT, STS).
        private_data: Vec<u8>,
    },
    /// Nobody listens at the destination.
    #[error("nobody listens at {0}")]
    Unreachable(ServiceAddress),
    /// The peer still holds a connection from this QP number (a previous one it did not
    /// see end): the CM's "stale connection". It cleans up after answering; a new
    /// attempt usually succeeds.
    #[error("{0} holds a stale connection from this QP number")]
    Stale(ServiceAddress),
    /// The address is taken by another listener.
    #[error("{0} is already in use")]
    AddressInUse(ServiceAddress),
    /// No answer came in time.
    #[error("no answer from {0}")]
    TimedOut(ServiceAddress),
    /// Moving the QP through its states failed.
    #[error("QP setup: {0}")]
    Verbs(String),
    /// The request was malformed (too much private data, ...).
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// What a finished connection attempt gives: the peer's answer and the connection.
pub type ConnectResult = Result<(Established, Box<dyn Connection>), ConnectionError>;

/// A connection in progress on the active side.
pub trait PendingConnect: Send {
    /// Polls the exchange; `None` while the peer has not answered. Once it yields, `qp`
    /// (the QP given to [`Connector::connect`]) is in RTS (accepted) or unusable
    /// (rejected). After it yielded, it yields `None` forever.
    fn poll(&mut self, qp: &QueuePair) -> Option<ConnectResult>;
}

/// Longest wait for the peer to acknowledge a disconnect, ns: long enough for the CM to
/// send a lost DREQ again. An initiator that leaves (or whose process exits) before the
/// target heard of it leaves a connection there that refuses the next one from the same
/// QP number as stale.
pub const DISCONNECT_WAIT_NS: u64 = 5_000_000_000;

/// An established connection (either end).
pub trait Connection: Send {
    /// Whether the peer disconnected (a DREQ arrived) or the connection broke.
    fn is_disconnected(&mut self) -> bool;
    /// Disconnects: moves `qp` to ERR (flushing its work requests) and tells the peer.
    fn disconnect(&mut self, qp: &QueuePair);
    /// After [`Connection::disconnect`]: whether the peer acknowledged it (the CM's DREP),
    /// so the QP number may be reused. Connection managers without an acknowledgement
    /// say yes at once.
    fn disconnect_acknowledged(&mut self) -> bool {
        true
    }
}

/// The active side's connection manager.
pub trait Connector: Send {
    /// Starts connecting `qp` (an RC QP in RESET, created on `context`) to
    /// `params.destination`.
    ///
    /// # Errors
    /// [`ConnectionError::Unreachable`], [`ConnectionError::Invalid`] or
    /// [`ConnectionError::Verbs`] when the request cannot even be sent.
    fn connect(
        &mut self,
        context: &Context,
        qp: &QueuePair,
        params: &ConnectParams,
    ) -> Result<Box<dyn PendingConnect>, ConnectionError>;
}

/// A connection request that reached a listener.
pub trait IncomingRequest: Send {
    /// The request's private data.
    fn private_data(&self) -> &[u8];
    /// The requester's responder resources.
    fn responder_resources(&self) -> u8;
    /// The requester's initiator depth.
    fn initiator_depth(&self) -> u8;
    /// A description of the requester for logs (address, QP).
    fn peer(&self) -> String;
    /// Accepts with `qp` (an RC QP in RESET, created on `context`): moves it to RTS
    /// towards the requester and sends the reply.
    ///
    /// # Errors
    /// [`ConnectionError::Verbs`] if the QP could not be connected (the request is
    /// rejected then).
    fn accept(
        self: Box<Self>,
        context: &Context,
        qp: &QueuePair,
        params: &AcceptParams,
    ) -> Result<Box<dyn Connection>, ConnectionError>;
    /// Rejects with `private_data` (consumer-defined reject).
    fn reject(self: Box<Self>, private_data: &[u8]);
}

/// The passive side's connection manager, listening on one address.
pub trait Listener: Send {
    /// The address listened on.
    fn address(&self) -> ServiceAddress;
    /// The next connection request, if one arrived.
    fn poll_request(&mut self) -> Option<Box<dyn IncomingRequest>>;
}

/// Transport settings a connection manager gives every RC QP it connects.
#[derive(Debug, Clone, Copy)]
pub struct RcPathConfig {
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent (4.096 µs × 2^n).
    pub ack_timeout: u8,
    /// RNR NAK timer code the peer is asked to wait.
    pub min_rnr_timer: u8,
}

impl Default for RcPathConfig {
    fn default() -> Self {
        Self {
            path_mtu: Mtu::Mtu4096,
            // 4.096 µs × 2^12 ≈ 17 ms: long against a fabric round trip, short enough
            // that a lost tail packet costs little time on a faulty wire.
            ack_timeout: 12,
            min_rnr_timer: 1,
        }
    }
}

/// One end's addressing: what the peer needs to connect its QP to this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct End {
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
    pub mac: [u8; 6],
}

impl End {
    pub fn of(context: &Context, qp: &QueuePair, psn: u32) -> Result<Self, ConnectionError> {
        Ok(Self {
            qpn: qp.qp_num(),
            psn,
            gid: context
                .query_gid(1, 0)
                .map_err(|e| ConnectionError::Verbs(e.to_string()))?,
            mac: context.mac_address(),
        })
    }
}

/// The RESET→RTS values of an RC QP towards `peer`, sending from `own_psn`.
pub(crate) fn rc_connection(
    config: &RcPathConfig,
    peer: &End,
    own_psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    rnr_retry: u8,
) -> RcConnection {
    RcConnection {
        path_mtu: config.path_mtu,
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        sq_psn: own_psn,
        ah_attr: AhAttributes {
            dgid: peer.gid,
            dmac: peer.mac,
            hop_limit: 64,
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: responder_resources,
        min_rnr_timer: config.min_rnr_timer,
        max_rd_atomic: initiator_depth,
        timeout: config.ack_timeout,
        retry_cnt: 7,
        rnr_retry,
    }
}
