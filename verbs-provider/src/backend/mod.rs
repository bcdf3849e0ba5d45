//! Implementations of [`DeviceAccess`], and
//! [`open_device`] to pick one from a device string.
//!
//! * [`embedded`]: device models in the same process, on one virtual clock, wired
//!   together by an in-process fabric.
//! * [`vfio_user`]: a NIC in another process (`rnic-emu serve`), driven over its
//!   vfio-user socket as a VMM would.
//!
//! A Linux VFIO backend will live next to them.

pub mod embedded;
pub mod vfio_user;

pub use embedded::{EmbeddedConfig, EmbeddedDevice, EmbeddedFabric, UserMemoryLayout};
pub use rnic_hw_model::fabric::{CapturedFrame, DeviceId, FabricConfig, FabricStatistics, FaultPlan};
pub use vfio_user::{VfioUserDevice, VfioUserOptions};

use crate::device_access::{AccessError, DeviceAccess};

/// Opens a device from a device string:
///
/// | String | Device |
/// |---|---|
/// | `embedded` | a new [`EmbeddedDevice`] (default configuration, alone on its fabric) |
/// | `vfio-user:PATH` | [`VfioUserDevice::connect`] to the vfio-user socket at `PATH` |
/// | `vfio-user:PATH,mac=MAC` | the same, with the port MAC the emulator was given (`--mac`; default [`vfio_user::DEFAULT_MAC`]) |
///
/// ```
/// let device = rnic_verbs::backend::open_device("embedded").unwrap();
/// let context = rnic_verbs::Context::open(device).unwrap();
/// assert!(rnic_verbs::backend::open_device("pci:0000:01:00.0").is_err());
/// ```
///
/// # Errors
/// [`AccessError::InvalidRequest`] for an unknown or malformed string, or whatever
/// connecting to the device failed with.
pub fn open_device(spec: &str) -> Result<Box<dyn DeviceAccess>, AccessError> {
    let invalid = |reason: String| AccessError::InvalidRequest { reason };
    if spec == "embedded" {
        return Ok(Box::new(EmbeddedDevice::new()));
    }
    let Some(rest) = spec.strip_prefix("vfio-user:") else {
        return Err(invalid(format!(
            "unknown device string {spec:?}: expected `embedded` or `vfio-user:PATH`"
        )));
    };
    let mut options = VfioUserOptions::default();
    let path = match rest.rsplit_once(",mac=") {
        Some((path, mac)) => {
            options.mac_address =
                vfio_user::parse_mac(mac).ok_or_else(|| invalid(format!("bad MAC address {mac:?} in {spec:?}")))?;
            path
        }
        None => rest,
    };
    if path.is_empty() {
        return Err(invalid(format!("no socket path in {spec:?}")));
    }
    Ok(Box::new(VfioUserDevice::connect_with(path, options)?))
}
