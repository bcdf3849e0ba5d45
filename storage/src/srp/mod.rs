//! SRP, the SCSI RDMA Protocol: wire formats, a target and an initiator over the
//! storage crate's RDMA plumbing (`crate::rdma`), carrying the SCSI block target of
//! `crate::scsi`.
//!
//! * [`wire`] — the information units and memory descriptors (big-endian).

pub mod wire;
