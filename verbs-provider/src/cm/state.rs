//! The states of an id. One enum covers the RDMA-CM part (address, route, listen) and,
//! inside [`IdState::Connection`], the IB CM states of IBA chapter 12 as Linux's `cm.c`
//! names them. Each state owns what it needs: a state that waits for an answer owns the
//! MAD it retransmits and its deadline, so leaving the state cancels the retransmission.

use std::net::SocketAddr;

use super::agent::MadPeer;
use super::mad::MAD_LEN;
use crate::verbs::{AhAttributes, Mtu};

/// A MAD being retransmitted until its answer arrives.
#[derive(Debug, Clone)]
pub(crate) struct Retransmit {
    /// The MAD, sent again unchanged (same transaction ID).
    pub mad: Box<[u8; MAD_LEN]>,
    /// When to send it again (ns, the device's clock).
    pub deadline: u64,
    /// Sends left after the first.
    pub retries_left: u8,
}

/// IB CM connection states (IBA 12.9.6, Linux `enum ib_cm_state`).
#[derive(Debug, Clone)]
pub(crate) enum CmState {
    /// Active: REQ sent, waiting for REP/REJ/MRA.
    ReqSent(Retransmit),
    /// Active: the passive side sent an MRA for our REQ; waiting longer.
    MraReqRcvd(Retransmit),
    /// Passive: REQ received, CONNECT_REQUEST delivered, the consumer decides.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent(Retransmit),
    /// Passive: the active side sent an MRA for our REP.
    MraRepRcvd(Retransmit),
    /// Active without a QP of its own: REP received, CONNECT_RESPONSE delivered, waiting
    /// for [`CmId::establish`](super::CmId::establish).
    RepRcvd,
    /// Connected.
    Established,
    /// We sent DREQ.
    DreqSent(Retransmit),
    /// The peer sent DREQ; DISCONNECTED delivered, waiting for our disconnect.
    DreqRcvd,
    /// The connection is over; its QP must not be reused until the deadline.
    TimeWait {
        /// When TIMEWAIT_EXIT is due.
        until: u64,
    },
    /// Rejected, unreachable or out of timewait.
    Done,
}

impl CmState {
    pub fn name(&self) -> &'static str {
        match self {
            Self::ReqSent(_) => "REQ_SENT",
            Self::MraReqRcvd(_) => "MRA_REQ_RCVD",
            Self::ReqRcvd => "REQ_RCVD",
            Self::RepSent(_) => "REP_SENT",
            Self::MraRepRcvd(_) => "MRA_REP_RCVD",
            Self::RepRcvd => "REP_RCVD",
            Self::Established => "ESTABLISHED",
            Self::DreqSent(_) => "DREQ_SENT",
            Self::DreqRcvd => "DREQ_RCVD",
            Self::TimeWait { .. } => "TIMEWAIT",
            Self::Done => "IDLE",
        }
    }

    pub fn retransmit_mut(&mut self) -> Option<&mut Retransmit> {
        match self {
            Self::ReqSent(r) | Self::MraReqRcvd(r) | Self::RepSent(r) | Self::MraRepRcvd(r) | Self::DreqSent(r) => {
                Some(r)
            }
            _ => None,
        }
    }

    pub fn deadline(&self) -> Option<u64> {
        match self {
            Self::ReqSent(r) | Self::MraReqRcvd(r) | Self::RepSent(r) | Self::MraRepRcvd(r) | Self::DreqSent(r) => {
                Some(r.deadline)
            }
            Self::TimeWait { until } => Some(*until),
            _ => None,
        }
    }
}

/// What a connection (RC) knows once a REQ went out or came in.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub cm: CmState,
    /// This side sent the REQ.
    pub active: bool,
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// The transaction ID of the exchange in progress (REQ's, then DREQ's).
    pub transaction_id: u64,
    pub remote_guid: u64,
    pub local_qpn: u32,
    pub remote_qpn: u32,
    /// The peer's QP1.
    pub peer: MadPeer,
    /// Retransmission interval of our REQ/REP/DREQ (ns).
    pub interval: u64,
    /// Retransmissions of each.
    pub max_retries: u8,
    /// The QP's local ACK timeout exponent; timewait lasts as long.
    pub av_timeout: u8,
    pub mtu: Mtu,
    /// PSN this side sends with.
    pub sq_psn: u32,
    /// PSN this side expects.
    pub rq_psn: u32,
    /// READs/atomics accepted here (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs/atomics outstanding from here (`max_rd_atomic`).
    pub initiator_depth: u8,
    pub retry_count: u8,
    /// RNR retries this side's QP uses.
    pub rnr_retry_count: u8,
    /// The QP's path.
    pub av: AhAttributes,
    pub flow_control: bool,
    pub srq: bool,
    /// An MRA answers a duplicate REQ/REP while the consumer decides (Linux's delayed MRA).
    pub mra_armed: bool,
    /// DISCONNECTED was delivered already.
    pub disconnect_reported: bool,
    /// In the remote-ID and remote-QPN tables (duplicate and stale detection).
    pub in_remote_tables: bool,
}

/// An active UD id waiting for its SIDR_REP.
#[derive(Debug, Clone)]
pub(crate) struct SidrQuery {
    pub request_id: u32,
    pub retransmit: Retransmit,
    pub peer: MadPeer,
}

/// A passive UD id: SIDR_REQ received, CONNECT_REQUEST delivered.
#[derive(Debug, Clone)]
pub(crate) struct SidrRequest {
    pub request_id: u32,
    pub transaction_id: u64,
    pub service_id: u64,
    pub peer: MadPeer,
}

/// An address resolution waiting for the neighbour's MAC.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AddrQuery {
    pub destination: SocketAddr,
    pub retry_at: u64,
    pub deadline: u64,
}

/// The state of an id.
#[derive(Debug, Clone)]
pub(crate) enum IdState {
    /// Created.
    Idle,
    /// `bind_addr` done.
    Bound,
    /// `resolve_addr` waiting for the neighbour.
    AddrQuery(AddrQuery),
    /// ADDR_RESOLVED delivered.
    AddrResolved,
    /// ROUTE_RESOLVED delivered.
    RouteResolved,
    /// Listening.
    Listen { backlog: u32 },
    /// An RC connection in one of its IB CM states.
    Connection(Box<Connection>),
    /// UD active side waiting for SIDR_REP.
    SidrQuery(Box<SidrQuery>),
    /// UD passive side deciding.
    SidrRequest(Box<SidrRequest>),
    /// UD resolved: datagrams may flow.
    UdReady,
    /// Rejected, unreachable, device removed: only destroy is left.
    Closed,
}

impl IdState {
    pub fn name(&self) -> String {
        match self {
            Self::Idle => "IDLE".into(),
            Self::Bound => "ADDR_BOUND".into(),
            Self::AddrQuery(_) => "ADDR_QUERY".into(),
            Self::AddrResolved => "ADDR_RESOLVED".into(),
            Self::RouteResolved => "ROUTE_RESOLVED".into(),
            Self::Listen { .. } => "LISTEN".into(),
            Self::Connection(c) => format!("CONNECT ({})", c.cm.name()),
            Self::SidrQuery(_) => "SIDR_REQ_SENT".into(),
            Self::SidrRequest(_) => "SIDR_REQ_RCVD".into(),
            Self::UdReady => "UD_READY".into(),
            Self::Closed => "CLOSED".into(),
        }
    }

    pub fn deadline(&self) -> Option<u64> {
        match self {
            Self::AddrQuery(query) => Some(query.retry_at.min(query.deadline)),
            Self::Connection(c) => c.cm.deadline(),
            Self::SidrQuery(query) => Some(query.retransmit.deadline),
            _ => None,
        }
    }
}
