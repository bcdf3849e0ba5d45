//! The NIC as a vfio-user PCI device: a project-owned server written from the protocol
//! specification.
//!
//! The `vfio_user` crate (rust-vmm, 0.1.7) is **not used**, not even for types: its
//! server loop has the defects listed in the project's vfio-user reference (§2.4) —
//! the mmap fd sent only together with sparse areas, unread payload desynchronising the
//! stream after an error, errno lost in error replies, a panic on VERSION without JSON,
//! unchecked REGION_READ/WRITE sizes, wrong DMA_UNMAP flag bits, fixed capabilities,
//! error replies to No_reply commands — and its structures would bring `vm-memory`,
//! `vmm-sys-util` and `vfio-bindings` for a few dozen constants. The wire format is
//! small and lives in [`protocol`]; each of those defects has a test in
//! `emulator/tests/vfio_user_abuse.rs` showing it absent.
//!
//! Layout:
//!
//! * [`protocol`] — header, commands, structures, flags, errno values;
//! * `connection` — reading whole messages without blocking, writing replies;
//! * [`regions`] — the region table (config space, BAR0, BAR2 doorbells, BAR4 MSI-X);
//! * [`dma`] — the client's DMA maps as the model's `HostMemory`;
//! * [`irq`] — MSI-X eventfds as the model's `InterruptSink`;
//! * [`doorbell`] — the shared doorbell pages and the adaptive poller;
//! * [`server`] — the loop and the command handlers;
//! * [`wire_totals`] — the transport's counters summed over device resets;
//! * [`fuzzing`] — a client session from raw bytes for the `vfio_user` fuzz target.

mod connection;
pub mod dma;
pub mod doorbell;
pub mod fuzzing;
pub mod irq;
pub mod protocol;
pub mod regions;
pub mod server;
pub mod wire_totals;

pub use server::{
    Limits, Polling, Server, ServerHandle, ServerOptions, ServerStats, ServerThread, DIAGNOSTICS_PERIOD,
    DIAGNOSTICS_POLICY,
};
