//! # rnic-verbs — user-space driver and verbs API of rnic-emu
//!
//! What the hns kernel driver and the rdma-core `hns` provider do for a HiSilicon RoCE
//! NIC, in one Rust crate, over a pluggable [`DeviceAccess`]:
//!
//! ```text
//!   application
//!       │  verbs: Context, ProtectionDomain, MemoryRegion, CompletionQueue,
//!       │         SharedReceiveQueue, QueuePair, AddressHandle, events
//!   ┌───▼──────────────────────────────────────────────────────────────┐
//!   │ verbs/   object numbers, contexts (QPC/CQC/SRQC/MPT), QP states   │
//!   │ driver/  cmdq → mailbox → HEM context tables, EQs, bring-up       │
//!   │ mtr      BT pages for queues and memory regions                   │
//!   └───┬──────────────────────────────────────────────────────────────┘
//!       │  DeviceAccess: config space, MMIO, DMA memory, interrupts, delay
//!   ┌───▼───────────────┐
//!   │ backend/embedded  │  the rnic-hw-model device in this process (virtual time)
//!   └───────────────────┘  (vfio-user client and Linux VFIO backends later)
//! ```
//!
//! Start with [`verbs::Context::open`] on a [`backend::EmbeddedDevice`]; [`demo`] shows
//! two NICs brought up and connected.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod demo;
pub mod device_access;
pub mod driver;
pub mod mtr;
pub mod verbs;

pub use device_access::DeviceAccess;
pub use verbs::{
    AccessFlags, AddressHandle, AhAttributes, AsyncEvent, AsyncEventElement, AsyncEventKind, AtomicCapability,
    CompletionChannel, CompletionQueue, Context, CqAttributes, CqEvent, DestroyError, DeviceAttributes,
    DeviceCapabilityFlags, Gid, LinkLayer, MemoryRegion, Mtu, ObjectCounts, PortAttributes, PortState,
    ProtectionDomain, QpAttributeMask, QpAttributes, QpBufferInfo, QpCapabilities, QpInitAttributes, QpState, QpType,
    QueuePair, Result, SharedReceiveQueue, SrqAttributeMask, SrqAttributes, VerbsError,
};
