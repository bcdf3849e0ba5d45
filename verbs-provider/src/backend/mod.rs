//! Implementations of [`DeviceAccess`](crate::device_access::DeviceAccess).
//!
//! * [`embedded`]: device models in the same process, on one virtual clock, wired
//!   together by an in-process fabric.
//!
//! A vfio-user client and a Linux VFIO backend will live next to it.

pub mod embedded;

pub use embedded::{EmbeddedConfig, EmbeddedDevice, EmbeddedFabric, UserMemoryLayout};
pub use rnic_hw_model::fabric::{CapturedFrame, DeviceId, FabricConfig, FabricStatistics, FaultPlan};
