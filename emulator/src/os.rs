//! The emulator's view of the OS layer: the `rnic-os` crate (the project's one home for
//! `unsafe` system calls: memfd, seals, mmap, eventfd, `SCM_RIGHTS`, ppoll, the socket
//! listener, network namespaces, timer slack, termination signals), re-exported here so
//! the server and the tests say `os::…`, plus the page size the server works in. No
//! `unsafe` code lives in this crate.

pub use rnic_os::*;

/// The page size the server works in (DMA map granularity, doorbell pages): 4 KiB, the
/// only size it advertises in `pgsizes`.
pub const PAGE_SIZE: u64 = 4096;
