//! The ibverbs-shaped API.
//!
//! | ibverbs | here |
//! |---|---|
//! | `ibv_open_device` | [`Context::open`] |
//! | `ibv_query_device` / `_port` / `_gid` | [`Context::query_device`], [`Context::query_port`], [`Context::query_gid`] |
//! | `ibv_alloc_pd` / `ibv_dealloc_pd` | [`Context::alloc_pd`], [`ProtectionDomain::dealloc`] |
//! | `ibv_reg_mr` / `ibv_dereg_mr` | [`ProtectionDomain::register_provider_memory`], [`ProtectionDomain::register_user_memory`], [`MemoryRegion::deregister`] |
//! | `ibv_create_comp_channel` | [`Context::create_comp_channel`] |
//! | `ibv_create_cq` / `ibv_destroy_cq` / `ibv_req_notify_cq` | [`Context::create_cq`], [`CompletionQueue::destroy`], [`CompletionQueue::req_notify`] |
//! | `ibv_create_srq` / `ibv_modify_srq` / `ibv_query_srq` / `ibv_destroy_srq` | [`ProtectionDomain::create_srq`], [`SharedReceiveQueue::modify`], [`SharedReceiveQueue::query`], [`SharedReceiveQueue::destroy`] |
//! | `ibv_create_qp` / `ibv_modify_qp` / `ibv_query_qp` / `ibv_destroy_qp` | [`ProtectionDomain::create_qp`], [`QueuePair::modify`], [`QueuePair::query`], [`QueuePair::destroy`] |
//! | `ibv_create_ah` / `ibv_destroy_ah` | [`ProtectionDomain::create_ah`], [`AddressHandle::destroy`] |
//! | `ibv_get_async_event` | [`Context::get_async_event`] |
//! | `ibv_get_cq_event` / `ibv_ack_cq_events` | [`CompletionChannel::get_cq_event`], [`CompletionQueue::ack_events`] |
//! | `ibv_post_send` / `ibv_post_recv` / `ibv_post_srq_recv` | [`QueuePair::post_send`], [`QueuePair::post_recv`], [`SharedReceiveQueue::post_srq_recv`] |
//! | `ibv_poll_cq` | [`CompletionQueue::poll`] |
//!
//! Lifetimes follow Rust ownership: every object keeps what it depends on alive (a QP
//! its PD, CQs and SRQ; everything its context). Explicit destroys report errors and
//! refuse (handing the object back) while something still uses the object; dropping an
//! object destroys it best-effort.

pub mod ah;
pub mod context;
pub mod cq;
pub mod error;
pub mod event;
pub mod mr;
pub mod pd;
mod poll;
mod post;
pub mod qp;
pub mod srq;
pub mod wr;

pub use ah::{AddressHandle, AhAttributes};
pub use context::{
    AtomicCapability, Context, DeviceAttributes, DeviceCapabilityFlags, Gid, LinkLayer, ObjectCounts, PortAttributes,
    PortState,
};
pub use cq::{CompletionQueue, CqAttributes};
pub use error::{DestroyError, Result, VerbsError};
pub use event::{AsyncEvent, AsyncEventElement, AsyncEventKind, CompletionChannel, CqEvent};
pub use mr::{AccessFlags, MemoryRegion};
pub use pd::ProtectionDomain;
pub use qp::{
    QpAttributeMask, QpAttributes, QpBufferInfo, QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair,
    RcConnection,
};
pub use rnic_firmware_if::context::Mtu;
pub use srq::{SharedReceiveQueue, SrqAttributeMask, SrqAttributes};
pub use wr::{
    AtomicFields, PostError, PostErrorKind, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, UdFields,
    WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
