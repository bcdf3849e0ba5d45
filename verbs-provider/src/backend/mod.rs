//! Implementations of [`DeviceAccess`], and
//! [`open_device`] to pick one from a device string.
//!
//! * [`embedded`]: device models in the same process, on one virtual clock, wired
//!   together by an in-process fabric.
//! * [`vfio_user`]: a NIC in another process (`rnic-emu serve`), driven over its
//!   vfio-user socket as a VMM would.
//! * [`pci`]: a PCI function seen by Linux (in a QEMU guest, or on bare metal), driven
//!   from user space through sysfs, with pinned huge-page DMA memory and polling.
//!
//! A Linux VFIO backend will live next to them.

mod dma_pool;
pub mod embedded;
pub mod host;
pub mod pci;
pub mod vfio_user;

pub use embedded::{EmbeddedConfig, EmbeddedDevice, EmbeddedFabric, UserMemoryLayout};
pub use host::{HostNic, HostNicConfig};
pub use pci::{PciDevice, PciOptions, PciSelector};
pub use rnic_hw_model::fabric::{CapturedFrame, DeviceId, FabricConfig, FabricStatistics, FaultPlan};
pub use vfio_user::{VfioUserDevice, VfioUserOptions};

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::device_access::{AccessError, DeviceAccess};

/// Locks `mutex`, poisoned or not: the backends' state (sockets, DMA bookkeeping) is not
/// left half-updated by a panic in a way that matters more than the panic itself.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`DeviceAccess::delay`] on the wall clock, for the backends whose device runs in real
/// time: sleeps, except that waits shorter than the timer slack (~50 µs), which a sleep
/// would overshoot by far, are spun (yielding the CPU).
fn wall_clock_delay(nanoseconds: u64) {
    let wait = Duration::from_nanos(nanoseconds);
    if wait >= Duration::from_micros(100) {
        std::thread::sleep(wait);
        return;
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        std::thread::yield_now();
    }
}

/// Opens a device from a device string:
///
/// | String | Device |
/// |---|---|
/// | `embedded` | a new [`EmbeddedDevice`] (default configuration, alone on its fabric) |
/// | `vfio-user:PATH` | [`VfioUserDevice::connect`] to the vfio-user socket at `PATH` |
/// | `vfio-user:PATH,mac=MAC` | the same, with the port MAC the emulator was given (`--mac`; default [`vfio_user::DEFAULT_MAC`]) |
/// | `pci` | [`PciDevice`]: the first PCI function with the rnic's IDs under `/sys/bus/pci/devices` (root, huge pages, polling) |
/// | `pci:DDDD:BB:DD.F` | [`PciDevice`] on that function |
/// | `pci,mac=MAC`, `pci:DDDD:BB:DD.F,mac=MAC` | the same, with the port MAC (the emulator's `--mac`; default [`vfio_user::DEFAULT_MAC`]) |
/// | `udp:IP[,mac=MAC]` | a [`HostNic`]: the model in this process on the wall clock, RoCEv2 over a UDP socket bound to `IP:4791` (give the driver `IP` as its IPv4 GID) |
///
/// ```
/// let device = rnic_verbs::backend::open_device("embedded").unwrap();
/// let context = rnic_verbs::Context::open(device).unwrap();
/// assert!(rnic_verbs::backend::open_device("pci:0000:01:00.0,mac=02:52:4e:49:43:09").is_err()); // no such function here
/// assert!(rnic_verbs::backend::open_device("pci:01:00").is_err()); // not an address
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
    let (base, mac) = match spec.rsplit_once(",mac=") {
        Some((base, mac)) => (
            base,
            Some(vfio_user::parse_mac(mac).ok_or_else(|| invalid(format!("bad MAC address {mac:?} in {spec:?}")))?),
        ),
        None => (spec, None),
    };
    if let Some(address) = base.strip_prefix("udp:") {
        let net: rnic_net::NetSpec = format!("udp:{address}").parse().map_err(invalid)?;
        let mut device = rnic_hw_model::config::DeviceConfig::default();
        if let Some(mac) = mac {
            device.mac_address = mac;
        }
        return Ok(Box::new(HostNic::open(HostNicConfig { device, net })?));
    }
    if base == "pci" || base.starts_with("pci:") {
        let selector = match base.strip_prefix("pci:") {
            Some(address) => PciSelector::address(address)?,
            None => PciSelector::First,
        };
        let mut options = PciOptions::default();
        if let Some(mac) = mac {
            options.mac_address = mac;
        }
        return Ok(Box::new(PciDevice::open_with(&selector, options)?));
    }
    let Some(path) = base.strip_prefix("vfio-user:") else {
        return Err(invalid(format!(
            "unknown device string {spec:?}: expected `embedded`, `vfio-user:PATH[,mac=MAC]`, \
             `pci[:DDDD:BB:DD.F][,mac=MAC]` or `udp:IP[,mac=MAC]`"
        )));
    };
    let mut options = VfioUserOptions::default();
    if let Some(mac) = mac {
        options.mac_address = mac;
    }
    if path.is_empty() {
        return Err(invalid(format!("no socket path in {spec:?}")));
    }
    Ok(Box::new(VfioUserDevice::connect_with(path, options)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(spec: &str) -> String {
        match open_device(spec) {
            Err(AccessError::InvalidRequest { reason }) => reason,
            Err(other) => panic!("{spec:?}: {other}"),
            Ok(_) => panic!("{spec:?} opened"),
        }
    }

    #[test]
    fn malformed_pci_strings_are_refused_before_touching_sysfs() {
        assert!(reason("pci,mac=02:52:4e").contains("bad MAC address"));
        assert!(reason("pci:0000:00:03.0,mac=zz:52:4e:49:43:01").contains("bad MAC address"));
        assert!(reason("pci:0000:00:03.9").contains("bad PCI address"));
        assert!(reason("pci:").contains("bad PCI address"));
        assert!(reason("pcie").contains("unknown device string"));
        assert!(reason("pci;0000:00:03.0").contains("unknown device string"));
    }
}
