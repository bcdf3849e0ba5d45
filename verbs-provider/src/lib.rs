//! # rnic-verbs — user-space driver and verbs API of rnic-emu
//!
//! What the hns kernel driver and the rdma-core `hns` provider do for a HiSilicon RoCE
//! NIC, in one Rust crate, over a pluggable [`DeviceAccess`]:
//!
//! ```text
//!   application
//!       │  verbs: Context, ProtectionDomain, MemoryRegion, CompletionQueue,
//!       │         SharedReceiveQueue, QueuePair, AddressHandle, events
//!       │  data path: post_send / post_recv / post_srq_recv, poll, req_notify
//!   ┌───▼──────────────────────────────────────────────────────────────┐
//!   │ verbs/   object numbers, contexts (QPC/CQC/SRQC/MPT), QP states,  │
//!   │          WQEs into the rings + doorbells, CQEs → work completions │
//!   │ driver/  cmdq → mailbox → HEM context tables, EQs, bring-up       │
//!   │ mtr      BT pages for queues and memory regions                   │
//!   └───┬──────────────────────────────────────────────────────────────┘
//!       │  DeviceAccess: config space, MMIO, DMA memory, interrupts, delay
//!   ┌───▼───────────────┐ ┌──────────────────┐
//!   │ backend/embedded  │ │ backend/vfio_user │  (a Linux VFIO backend later)
//!   └───────────────────┘ └──────────────────┘
//!    rnic-hw-model devices  a NIC in another process (`rnic-emu serve`) over its
//!    in this process, one   vfio-user socket: memfd DMA memory, mmapped doorbell
//!    fabric, virtual time   pages, MSI-X on eventfds, wall-clock time
//! ```
//!
//! Start with [`verbs::Context::open`] on a [`backend::EmbeddedDevice`] (several of them
//! from one [`backend::EmbeddedFabric`] talk to each other); [`demo`] shows two NICs
//! brought up, connected, and moving RDMA traffic.
//!
//! ## Device strings
//!
//! Tools take the device as a string and open it with [`backend::open_device`]:
//!
//! * `embedded` — a new embedded NIC, alone on its fabric;
//! * `vfio-user:PATH` — the NIC served by `rnic-emu serve --socket PATH`
//!   ([`backend::VfioUserDevice`]); `vfio-user:PATH,mac=02:52:4e:49:43:07` when the
//!   emulator was started with another `--mac` (a vfio-user device does not report its
//!   MAC address);
//! * `udp:IP` (optionally `,mac=MAC`) — the model in this process on the wall clock, its
//!   port on a UDP socket at `IP:4791` ([`backend::HostNic`], the device of the drop-in
//!   `libibverbs.so.1`);
//! * `pci`, `pci:DDDD:BB:DD.F` (optionally `,mac=MAC`) — an rnic PCI function seen by
//!   Linux, in a QEMU guest or on bare metal, driven from user space through sysfs
//!   ([`backend::PciDevice`]: root, 2 MiB huge pages, completions by polling).
//!
//! With the vfio-user backend, memory the device reaches must be shared with the
//! emulator process, so [`ProtectionDomain::register_user_memory`] copies the
//! application's `Vec<u8>` into memfd-backed pages and gives the same `Vec` back, with
//! what the device wrote, on [`MemoryRegion::deregister`].
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod cm;
pub mod demo;
pub mod device_access;
pub mod diag;
pub mod driver;
pub mod mtr;
pub mod verbs;

pub use device_access::DeviceAccess;
pub use verbs::{
    AccessFlags, AddressHandle, AhAttributes, AsyncEvent, AsyncEventElement, AsyncEventKind, AtomicCapability,
    CompletionChannel, CompletionQueue, Context, CqAttributes, CqEvent, DestroyError, DeviceAttributes,
    DeviceCapabilityFlags, Gid, LinkLayer, MemoryRegion, Mtu, ObjectCounts, PortAttributes, PortState,
    ProtectionDomain, QpAttributeMask, QpAttributes, QpBufferInfo, QpCapabilities, QpInitAttributes, QpState, QpType,
    QueuePair, RcConnection, Result, SharedReceiveQueue, SrqAttributeMask, SrqAttributes, VerbsError,
};
pub use verbs::{
    AtomicFields, PostError, PostErrorKind, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, UdFields,
    WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
