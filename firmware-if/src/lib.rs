//! # rnic-firmware-if — the driver ↔ device contract, as data
//!
//! Everything the rnic-emu device model (`hw-model`) and a driver (`verbs-provider`, or
//! one written in any other language from `docs/register-map.md`) must agree on, and
//! nothing else: register offsets, the command queue, mailbox commands, context layouts,
//! WQE/CQE/EQE and doorbell formats, capabilities, event and status codes.
//!
//! Layouts and numbers follow the HiSilicon hns RoCE engine (hip08/hip09) wherever that is
//! practical; `docs/hw-interface.md` lists every deviation and its reason.
//!
//! Every structure is declared once with [`layout!`]: the declaration gives typed
//! accessors, a field table (the generated register map reads it) and `parse`/`emit`
//! through the [`bits::Layout`] trait.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[doc(hidden)]
pub use zerocopy;

pub mod bits;
pub mod caps;
pub mod cmdq;
pub mod context;
pub mod cqe;
pub mod doorbell;
pub mod eqe;
pub mod event;
pub mod mailbox;
pub mod mtr;
pub mod pci;
pub mod register_map;
pub mod regs;
pub mod wqe;

pub use bits::{Field, Layout, LayoutError};
