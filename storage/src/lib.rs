//! # rnic-storage — block storage over RDMA on rnic-emu
//!
//! The storage stacks the NIC exists to carry, in user space over the verbs provider
//! (`rnic-verbs`), in the manner of SPDK:
//!
//! ```text
//!   front ends (targets, initiators, benchmarks)
//!       │
//!   ┌───▼──────────────────────────────────────────────┐
//!   │ protocol stacks: NVMe-oF/RDMA, SRP (SCSI)        │
//!   └───┬──────────────────────────────────────────────┘
//!       │  BlockDevice: read / write / flush / zeroes / deallocate
//!   ┌───▼──────────────────────────────────────────────┐
//!   │ block/  RAM, file (buffered or O_DIRECT)         │
//!   └──────────────────────────────────────────────────┘
//! ```
//!
//! Every byte that arrives from the network is hostile until checked: malformed input is
//! answered with the status the protocol's specification gives and a diagnostic under the
//! `rnic::diag` tracing target, never a panic.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod block;
pub mod fuzzing;
pub mod nvmeof;
pub mod perf;
pub mod rdma;
pub mod scsi;
pub mod srp;
