//! Connection events (`struct rdma_cm_event`) and the connection parameters
//! (`struct rdma_conn_param`).

use std::fmt;

use super::config::MAX_RESOURCES;
use super::id::CmId;
use crate::verbs::AhAttributes;

/// `enum rdma_cm_event_type`, numbered as librdmacm numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: [`CmId::resolve_addr`] found a device, a source
    /// address and the peer's MAC.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: it did not (status: `-EHOSTUNREACH`, `-ETIMEDOUT`).
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: [`CmId::resolve_route`] synthesised the path.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a REQ (or SIDR_REQ) for a listener; the event's
    /// id is a new id to accept or reject.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: a REP for an id without a QP; the application
    /// moves its QP itself ([`CmId::init_qp_attr`]) and calls [`CmId::establish`].
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the connection could not be completed locally.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`: no answer after every retry (status `-ETIMEDOUT`), or
    /// a SIDR_REP with a failure status (status = that status).
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED`: a REJ; status = its reason (8: nobody listens, 28: the
    /// consumer rejected, with private data).
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`: REP (active) or RTU (passive) done; for UD, the SIDR_REP
    /// with the peer's QPN and Q_Key.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`: a DREQ or DREP arrived, or our DREQ went unanswered.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the id's device left the connection manager.
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the connection's QP may be reused.
    TimewaitExit = 15,
}

impl CmEventKind {
    /// librdmacm's `rdma_event_str` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            Self::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            Self::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            Self::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            Self::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            Self::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            Self::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Self::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Self::Rejected => "RDMA_CM_EVENT_REJECTED",
            Self::Established => "RDMA_CM_EVENT_ESTABLISHED",
            Self::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            Self::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            Self::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `struct rdma_conn_param`: what [`CmId::connect`] and [`CmId::accept`] ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the REQ (at most 56 bytes after the RDMA-CM header), REP (196),
    /// SIDR_REQ (180) or SIDR_REP (136).
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics this side accepts at once; [`MAX_RESOURCES`] = the device's
    /// maximum.
    pub responder_resources: u8,
    /// RDMA READs and atomics this side keeps outstanding; [`MAX_RESOURCES`] = the
    /// device's maximum (an acceptor never gets more than the requester accepts).
    pub initiator_depth: u8,
    /// End-to-end flow control (informational on this device).
    pub flow_control: bool,
    /// Transport retries (REQ only; at most 7).
    pub retry_count: u8,
    /// RNR retries the peer uses against us (at most 7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// The QP receives from an SRQ (informational; set from the id's QP when it has one).
    pub srq: bool,
    /// The QP number, when the id has no QP of its own ([`CmId::create_qp`]).
    pub qp_num: u32,
}

impl Default for ConnParam {
    /// librdmacm's values for a NULL `conn_param`: the device's maximum READ depths,
    /// retry 7, RNR retry 7.
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            responder_resources: MAX_RESOURCES,
            initiator_depth: MAX_RESOURCES,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// The connection parameters an event reports (`event->param.conn`), already from this
/// side's point of view: a CONNECT_REQUEST's `responder_resources` is the requester's
/// initiator depth.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnEventParam {
    /// READs/atomics the peer may have outstanding here.
    pub responder_resources: u8,
    /// READs/atomics this side may have outstanding at the peer.
    pub initiator_depth: u8,
    /// The peer's end-to-end flow control bit.
    pub flow_control: bool,
    /// Transport retries (from the REQ).
    pub retry_count: u8,
    /// RNR retries this side uses against the peer.
    pub rnr_retry_count: u8,
    /// The peer's QP receives from an SRQ.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// The UD parameters an event reports (`event->param.ud`): where to send datagrams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdEventParam {
    /// The address of the peer (for [`ProtectionDomain::create_ah`](crate::ProtectionDomain::create_ah)).
    pub ah_attr: AhAttributes,
    /// The peer's QP number (0 in a CONNECT_REQUEST: SIDR_REQ does not carry it).
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

/// A connection event (`struct rdma_cm_event`). Dropping it acknowledges it
/// (`rdma_ack_cm_event`); [`super::EventChannel::ack_event`] says so explicitly.
pub struct CmEvent {
    /// The id the event is about (for CONNECT_REQUEST: the new id).
    pub id: CmId,
    /// For CONNECT_REQUEST: the listening id.
    pub listen_id: Option<CmId>,
    /// What happened.
    pub kind: CmEventKind,
    /// 0, a negative errno, a REJ reason (REJECTED) or a SIDR status (UNREACHABLE).
    pub status: i32,
    /// Private data of the message behind the event: the whole field (56 bytes of a REQ
    /// after the RDMA-CM header, 196 of a REP, 148 of a REJ, …), as Linux reports it.
    pub private_data: Vec<u8>,
    /// Connection parameters (CONNECT_REQUEST, CONNECT_RESPONSE, ESTABLISHED of RC).
    pub conn: ConnEventParam,
    /// UD parameters (CONNECT_REQUEST and ESTABLISHED of UD ids).
    pub ud: Option<UdEventParam>,
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("listen_id", &self.listen_id)
            .field("status", &self.status)
            .field("private_data_len", &self.private_data.len())
            .field("conn", &self.conn)
            .field("ud", &self.ud)
            .finish()
    }
}

impl CmEvent {
    /// `rdma_ack_cm_event`.
    pub fn ack(self) {}
}
