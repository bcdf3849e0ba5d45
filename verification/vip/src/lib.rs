//! # rnic-vip — verification IP over the rnic-emu model
//!
//! What a verification engineer needs to check NIC RTL against the model, in one Rust
//! library that the C ABI (`verification/capi`: SystemVerilog through DPI-C, C/C++, and
//! Python through ctypes, as the cocotb example does) wraps:
//!
//! * [`session`]: one model instance driven by transactions — configuration and BAR
//!   accesses, host memory (backdoor regions or the testbench's, through a [`HostBus`]),
//!   MSI-X messages, Ethernet frames in and out — on virtual time.
//! * [`layout`]: the driver↔device layouts of `firmware-if` by name, so a testbench in
//!   any language builds contexts and WQEs from the register map's own table.
//! * [`codec`]: the RoCEv2 header codec for stimulus and checking.
//! * [`checker`]: the DUT's frames, DMA writes, CQEs, EQEs and MSI-X messages checked
//!   against the model's, each stream in order per queue, with mismatches accumulated
//!   (ibex-cosim shaped).
//! * [`coverage`]: functional coverage collected by a session, exported as JSON, merged
//!   and reported (the `rnic-vip coverage` command).
//! * [`replay`]: record a session's inputs and outputs, replay them, report the first
//!   divergence.
//! * [`trace`]: pipeline stages, frames, MMIO and MSI-X on virtual time, in the
//!   Chrome/Perfetto JSON trace format; [`vcd`]: the same as VCD, for waveform viewers.
//!
//! Everything is deterministic: the same inputs give the same outputs, bit for bit. See
//! `docs/guides/verification.md`.
#![deny(unsafe_code)]

pub mod checker;
pub mod codec;
pub mod config;
pub mod coverage;
pub mod layout;
pub mod replay;
pub mod session;
pub mod sv_package;
pub mod trace;
pub mod vcd;

pub use config::SessionConfig;
pub use session::{FrameEvent, HostBus, MsixEvent, Session};

use rnic_hw_model::MemoryError;

/// Why a verification call failed.
#[derive(Debug, thiserror::Error)]
pub enum VipError {
    /// The configuration text is not valid.
    #[error("configuration: {0}")]
    Config(String),
    /// An argument is out of range or names nothing.
    #[error("{0}")]
    Invalid(String),
    /// Host memory refused an access.
    #[error("host memory: {0}")]
    Memory(MemoryError),
    /// A frame did not parse or a header could not be emitted.
    #[error("codec: {0}")]
    Codec(String),
    /// Reading or writing a file failed.
    #[error("{0}")]
    Io(String),
    /// A replay or a check found a difference.
    #[error("mismatch: {0}")]
    Mismatch(String),
}
