//! # rnic-hw-model — the device
//!
//! A cycle-approximate model of an hns-style RoCEv2 RDMA NIC. It is deterministic and
//! self-contained: it reaches the outside world only through traits (host memory for DMA,
//! an interrupt sink for MSI-X, and later a network port), runs on virtual time
//! (integer picoseconds, [`time::Scheduler`]) and makes no OS calls.
//!
//! The modules follow the path of a command or a doorbell through the device:
//! [`pci`] (config space, BARs, MSI-X) → [`device`] (BAR decode) → [`firmware`] (command
//! queue and mailbox) → [`hem`] (context tables in host memory) → [`mtt`] (address
//! translation) → the object engines [`mpt`], [`qp`], [`srq`], [`cq`], [`eq`], and
//! [`doorbell`]. What every stage costs in virtual time is the [`timing`] model's
//! (`docs/timing.md`). See `docs/architecture.md`.
#![deny(unsafe_code)]
#![warn(missing_docs)]
// Each block's module docs describe its state and interface, which are crate-private:
// they are for readers of the model's internals (`cargo doc --document-private-items`,
// which `.ci/run` checks and where these links resolve), not for users of the crate's API.
#![allow(rustdoc::private_intra_doc_links)]

mod bus;
pub mod command;
pub mod config;
pub mod cq;
pub mod device;
pub mod diagnostics;
pub mod doorbell;
pub mod eq;
pub mod fabric;
mod fast_hash;
pub mod firmware;
pub mod hem;
pub mod interrupt;
pub mod memory;
pub mod mpt;
pub mod mtt;
pub mod pci;
pub mod port;
pub mod probe;
pub mod qp;
pub mod srq;
pub mod time;
pub mod timing;
pub mod transport;
pub mod wire;

pub use config::DeviceConfig;
pub use device::{Counters, Device};
pub use memory::{HostMemory, HostMemoryExt, MemoryError, PagedMemory};
pub use time::Picoseconds;
