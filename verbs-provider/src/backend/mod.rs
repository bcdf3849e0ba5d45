//! Implementations of [`DeviceAccess`](crate::device_access::DeviceAccess).
//!
//! * [`embedded`]: the device model in the same process, on virtual time.
//!
//! A vfio-user client and a Linux VFIO backend will live next to it.

pub mod embedded;

pub use embedded::{EmbeddedConfig, EmbeddedDevice, UserMemoryLayout};
