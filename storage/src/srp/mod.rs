//! SRP, the SCSI RDMA Protocol: wire formats, a target and an initiator over the
//! storage crate's RDMA plumbing (`crate::rdma`), carrying the SCSI block target of
//! `crate::scsi`.
//!
//! * [`wire`] — the information units and memory descriptors (big-endian).
//! * [`target`] — the target: logins, channels, commands, task management, logout.
//! * [`initiator`] — the initiator: login, SCSI commands, task management, logout.
//! * [`perf`] — the benchmark workload (queue depth, block size, mix, verify).

mod channel;
pub mod initiator;
pub mod perf;
pub mod target;
pub mod wire;
