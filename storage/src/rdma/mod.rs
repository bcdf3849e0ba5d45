//! RDMA plumbing both storage protocols (NVMe-oF and SRP) stand on, over `rnic-verbs`.
//!
//! * [`connection`] — the seam between a protocol's queue logic and connection
//!   management: a protocol creates an RC QP, hands it to a [`connection::Connector`]
//!   (active side) or accepts an [`connection::IncomingRequest`] from a
//!   [`connection::Listener`] (passive side) with its private data, and gets back an
//!   established QP and the peer's private data. It has the shape of librdmacm
//!   (connect / accept / reject with private data, disconnect events), so the RDMA CM
//!   on QP1 slots in behind it.
//! * [`direct`] — an in-process connection manager: it connects QP pairs directly
//!   (RESET→INIT→RTR→RTS on both ends, as `rnic-bench` does) and carries the private
//!   data between them, so both ends of a protocol can be tested in one process before
//!   and besides the real CM.
//! * [`exchange`] — across processes before the RDMA CM: the same exchange over TCP at
//!   the service's address (the way perftest swaps QP numbers without rdma_cm).
//! * [`rdma_cm`] — over the RDMA connection manager (IB CM on QP1, RDMA-CM addressing):
//!   what Linux's `rdma_cm` talks to, and what puts REQ/REP/RTU on the wire.
//! * [`setup`] — opening a NIC and choosing a connection manager from tool flags.
//! * [`memory`] — registered memory a protocol needs: fixed slots (receive buffers,
//!   command capsules, responses) and a pool of variable-size data buffers.
//! * [`reactor`] — who lets time pass: the embedded fabric's virtual clock with every
//!   co-simulated poller (target, host) stepped in turn, or the wall clock.

pub mod connection;
pub mod direct;
pub mod exchange;
pub mod memory;
pub mod rdma_cm;
pub mod reactor;
pub mod setup;

pub use connection::RcPathConfig;
pub use connection::{
    AcceptParams, ConnectParams, ConnectResult, Connection, ConnectionError, Connector, Established, IncomingRequest,
    Listener, PendingConnect, ServiceAddress,
};
pub use direct::DirectCm;
pub use exchange::ExchangeCm;
pub use memory::{BufferPool, DataBuffer, SlotRegion};
pub use rdma_cm::RdmaCm;
pub use reactor::{Clock, EmbeddedReactor, Pace, Poller, Reactor, WallReactor};
