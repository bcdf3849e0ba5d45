//! The connection manager: IB CM on QP1 with RDMA-CM addressing, shaped like librdmacm,
//! behaving like Linux's `drivers/infiniband/core/cm.c` and `cma.c` over RoCE.
//!
//! ```text
//! application                         librdmacm shape
//!   EventChannel ── CmId ── ConnParam ── CmEvent (ADDR_RESOLVED … TIMEWAIT_EXIT)
//!        │
//! ConnectionManager (one lock)
//!   core      ids and their states (IdState, CmState), matching tables, timers;
//!             deterministic: time and randomness come from outside
//!   address   IP ↔ GID, neighbour resolvers, the synthesised RoCE path
//!   agent     per device: QP1, receive ring, send pool (the MAD layer)
//!   mad       the wire formats (MAD header, REQ … SIDR_REP, RDMA-CM IP header)
//!        │
//! QP1 of each device: UD SEND ONLY to QPN 1, Q_Key 0x80010000, one 256-byte MAD each
//! ```
//!
//! # Driving it
//!
//! Nothing runs by itself. Either
//!
//! * call [`EventChannel::get_event`] / [`EventChannel::wait_event`] (they run the
//!   connection manager) or [`ConnectionManager::progress`] from your own loop. On
//!   embedded NICs time is the fabric's virtual time, so a single-threaded loop with a
//!   fixed [`CmConfig::seed`] and a seeded fault plan gives the same events every run; or
//! * start [`ConnectionManager::spawn_progress_thread`] (wall-time backends: vfio-user,
//!   PCI), and wait on [`EventChannel::wait_event`] or poll [`EventChannel::fd`].
//!
//! # A connection
//!
//! Active: `create_id`, `resolve_addr` → ADDR_RESOLVED, `resolve_route` →
//! ROUTE_RESOLVED, `create_qp`, `connect` → ESTABLISHED (or REJECTED / UNREACHABLE),
//! `disconnect` → DISCONNECTED → TIMEWAIT_EXIT, `destroy`. Passive: `bind_addr`, `listen`
//! → CONNECT_REQUEST with a new id, on which `create_qp` and `accept` (→ ESTABLISHED) or
//! `reject`. With a QP made by [`CmId::create_qp`] the connection manager moves it
//! INIT → RTR → RTS with the values negotiated in REQ and REP (PSNs, path MTU, responder
//! resources and initiator depth, retry and RNR retry counts, local ACK timeout); an
//! application with its own QP gets CONNECT_RESPONSE, uses [`CmId::init_qp_attr`] and
//! calls [`CmId::establish`]. UD ids (port space UDP) resolve the peer's QPN and Q_Key
//! with SIDR.

pub mod address;
mod agent;
mod channel;
pub mod config;
mod core;
pub mod embedded;
pub mod error;
pub mod event;
mod id;
pub mod mad;
mod manager;
mod state;

pub use address::{
    FabricNeighbours, KernelNeighbours, LinkLocalNeighbours, Neighbour, NeighbourResolver, Neighbours, Route,
    StandInNeighbours, StaticNeighbours,
};
pub use agent::AgentCounters;
pub use channel::EventChannel;
pub use config::CmConfig;
pub use core::CmCounters;
pub use error::{CmError, Result};
pub use event::{CmEvent, CmEventKind, ConnEventParam, ConnParam, UdEventParam};
pub use id::{CmId, CmQpInit};
pub use mad::PortSpace;
pub use manager::{ConnectionManager, ProgressThread};
