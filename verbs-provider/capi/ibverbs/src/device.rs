//! Which device the library offers, chosen by one environment variable, and the one
//! open instance of it per process that every `ibv_context` shares.
//!
//! `RNIC_DEVICE`:
//!
//! | Value | Device |
//! |---|---|
//! | unset, or `udp:IP` | the model in this process ([`HostNic`]), RoCEv2 over a UDP socket bound to `IP:4791` (default `udp:127.0.0.1`); GID 1 is `::ffff:IP` |
//! | `eth:IFACE[,ip=A.B.C.D]` | the model in this process, Ethernet frames on IFACE (CAP_NET_RAW); GID 1 is the interface's (or the given) IPv4 address |
//! | `pci[:DDDD:BB:DD.F]` | an rnic PCI function under Linux (a QEMU guest), from user space |
//! | `vfio-user:PATH` | an `rnic-emu serve` process; it cannot reach this process's memory, so `ibv_reg_mr` fails with `EOPNOTSUPP` |
//!
//! Each may end in `,mac=MAC`. The model's MAC defaults to `02:52:4e` followed by the last
//! three bytes of its IP address, so processes on different addresses differ.

use std::ffi::c_char;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rnic_hw_model::config::DeviceConfig;
use rnic_net::NetSpec;
use rnic_verbs::backend::{HostNic, HostNicConfig};
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{Context, Mtu};

use crate::abi::*;

/// The environment variable that chooses the device.
pub const DEVICE_VARIABLE: &str = "RNIC_DEVICE";
/// Its default.
pub const DEFAULT_DEVICE: &str = "udp:127.0.0.1";
/// The device's name (`ibv_devices`, `-d rnic0`).
pub const DEVICE_NAME: &str = "rnic0";

/// What `RNIC_DEVICE` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The model in this process on a network.
    Host {
        /// The network.
        net: NetSpec,
        /// The IPv4 address of GID 1.
        ipv4: Option<[u8; 4]>,
    },
    /// Another backend of `rnic_verbs::backend::open_device` (`pci…`, `vfio-user:…`).
    Other {
        /// The backend's device string (with its `,mac=`).
        device: String,
        /// The IPv4 address of GID 1 (`,ip=`); without it the device has only its
        /// link-local GID, which the connection manager cannot address.
        ipv4: Option<[u8; 4]>,
    },
}

/// The parsed variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The text it came from.
    pub text: String,
    /// The backend.
    pub backend: Backend,
    /// The port MAC.
    pub mac: [u8; 6],
    /// The largest MTU the network carries.
    pub active_mtu: Mtu,
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn mac_from_ip(ip: IpAddr) -> [u8; 6] {
    let tail = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            [o[1], o[2], o[3]]
        }
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[13], o[14], o[15]]
        }
    };
    [0x02, 0x52, 0x4e, tail[0], tail[1], tail[2]]
}

/// The largest IB MTU whose RoCEv2 frame (payload + 14 Ethernet + 20 IP + 8 UDP + 12 BTH
/// + up to 28 more headers + 4 ICRC) fits a link MTU of `link` bytes.
fn mtu_for_link(link: u32) -> Mtu {
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() + 72 <= link)
        .unwrap_or(Mtu::Mtu256)
}

/// Parses `RNIC_DEVICE`'s value.
///
/// # Errors
/// A one-line explanation of what is wrong and what is accepted.
pub fn parse_spec(text: &str) -> Result<DeviceSpec, String> {
    let accepted =
        "expected udp:IP, eth:IFACE[,ip=A.B.C.D], pci[:DDDD:BB:DD.F][,ip=A.B.C.D] or vfio-user:PATH[,ip=A.B.C.D], each optionally ,mac=MAC";
    let mut mac = None;
    let mut ip_option = None;
    let mut base = text.to_string();
    // Options come last, comma-separated (a vfio-user path may contain commas only before them).
    while let Some((head, option)) = base.rsplit_once(',') {
        if let Some(value) = option.strip_prefix("mac=") {
            mac = Some(parse_mac(value).ok_or_else(|| format!("bad MAC address {value:?} in {text:?}"))?);
        } else if let Some(value) = option.strip_prefix("ip=") {
            ip_option = Some(
                value
                    .parse::<std::net::Ipv4Addr>()
                    .map_err(|_| format!("bad IPv4 address {value:?} in {text:?}"))?,
            );
        } else {
            break;
        }
        base = head.to_string();
    }
    if base.starts_with("udp:") || base.starts_with("eth:") || base == "none" {
        let net: NetSpec = base.parse().map_err(|e: String| format!("{e}; {accepted}"))?;
        let (ip, link_mtu): (Option<IpAddr>, u32) = match &net {
            NetSpec::Udp(ip) => (Some(*ip), 65536),
            NetSpec::Eth(interface) => {
                let ip = ip_option
                    .map(IpAddr::V4)
                    .or_else(|| rnic_net::interface_ipv4(interface).map(IpAddr::V4));
                let mtu = std::fs::read_to_string(format!("/sys/class/net/{interface}/mtu"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(1500);
                (ip, mtu)
            }
            NetSpec::None => (ip_option.map(IpAddr::V4), 65536),
        };
        if ip_option.is_some() && matches!(net, NetSpec::Udp(_)) {
            return Err(format!("{text:?}: ip= is for eth:; udp:IP already names the address"));
        }
        let ipv4 = match ip {
            Some(IpAddr::V4(v4)) => Some(v4.octets()),
            Some(IpAddr::V6(v6)) => v6.to_ipv4_mapped().map(|v4| v4.octets()),
            None => None,
        };
        if ipv4.is_none() {
            return Err(format!(
                "{text:?}: the NIC needs an IPv4 address for its RoCEv2 GID (udp:A.B.C.D, or eth:IFACE with an IPv4 address or ,ip=)"
            ));
        }
        let mac = mac.unwrap_or_else(|| ip.map(mac_from_ip).unwrap_or([0x02, 0x52, 0x4e, 0x49, 0x43, 0x01]));
        return Ok(DeviceSpec {
            text: text.to_string(),
            backend: Backend::Host { net, ipv4 },
            mac,
            active_mtu: mtu_for_link(link_mtu),
        });
    }
    if base == "pci" || base.starts_with("pci:") || base.starts_with("vfio-user:") {
        let mac = mac.unwrap_or(rnic_verbs::backend::vfio_user::DEFAULT_MAC);
        let mut spec = base.clone();
        spec.push_str(&format!(
            ",mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
        ));
        return Ok(DeviceSpec {
            text: text.to_string(),
            backend: Backend::Other {
                device: spec,
                ipv4: ip_option.map(|ip| ip.octets()),
            },
            mac,
            active_mtu: Mtu::Mtu1024,
        });
    }
    Err(format!("unknown device {text:?}: {accepted}"))
}

/// The device list's one entry: the C `ibv_device` first, then what we know of it.
#[repr(C)]
pub struct DeviceEntry {
    /// What applications see.
    pub device: ibv_device,
    /// The parsed `RNIC_DEVICE`.
    pub spec: DeviceSpec,
    /// Node GUID, as a big-endian number (EUI-64 of the MAC).
    pub guid: u64,
}

// SAFETY: the entry is immutable after creation; its raw pointers are all null.
unsafe impl Send for DeviceEntry {}
// SAFETY: as for Send.
unsafe impl Sync for DeviceEntry {}

fn copy_name(out: &mut [c_char], text: &str) {
    let room = out.len() - 1;
    for (slot, byte) in out.iter_mut().zip(text.bytes().take(room)) {
        *slot = byte as c_char;
    }
}

/// The process's device, or why there is none (reported once).
pub fn device() -> Result<&'static DeviceEntry, &'static str> {
    static DEVICE: OnceLock<Result<Box<DeviceEntry>, String>> = OnceLock::new();
    let entry = DEVICE.get_or_init(|| {
        let text = std::env::var(DEVICE_VARIABLE).unwrap_or_default();
        let text = if text.is_empty() {
            DEFAULT_DEVICE.to_string()
        } else {
            text
        };
        match parse_spec(&text) {
            Ok(spec) => {
                let mac = spec.mac;
                let guid = u64::from_be_bytes([mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]);
                let mut device = ibv_device {
                    _ops: [std::ptr::null_mut(); 2],
                    node_type: IBV_NODE_CA,
                    transport_type: IBV_TRANSPORT_IB,
                    name: [0; 64],
                    dev_name: [0; 64],
                    dev_path: [0; 256],
                    ibdev_path: [0; 256],
                };
                copy_name(&mut device.name, DEVICE_NAME);
                copy_name(&mut device.dev_name, "uverbs0");
                copy_name(&mut device.dev_path, "/sys/class/infiniband_verbs/uverbs0");
                copy_name(&mut device.ibdev_path, "/sys/class/infiniband/rnic0");
                Ok(Box::new(DeviceEntry { device, spec, guid }))
            }
            Err(message) => {
                let line = format!("rnic: {DEVICE_VARIABLE}: {message}");
                eprintln!("{line}");
                Err(line)
            }
        }
    });
    entry.as_deref().map_err(|e| e.as_str())
}

/// The open device, shared by every `ibv_context` of the process: one driver, one NIC.
pub struct OpenDevice {
    /// The verbs context.
    pub context: Context,
    /// The in-process NIC, when that is the backend.
    pub host: Option<HostNic>,
    /// The device entry.
    pub entry: &'static DeviceEntry,
    /// C objects by number, for events: CQs, QPs, SRQs (addresses of our wrappers).
    pub objects: Mutex<crate::verbs::ObjectTable>,
    /// Open C contexts (addresses), which receive asynchronous events.
    pub contexts: Mutex<Vec<usize>>,
}

impl Drop for OpenDevice {
    fn drop(&mut self) {
        if let Some(host) = &self.host {
            let (transport, counters) = host.with_device(|d| (d.transport_counters(), d.counters()));
            tracing::info!(
                net = ?host.net_stats(),
                ?transport,
                doorbells = counters.doorbells,
                cqes = counters.cqes,
                "rnic0 closing"
            );
        }
    }
}

static OPEN: Mutex<Weak<OpenDevice>> = Mutex::new(Weak::new());

/// The open device, opening it first if no context has it open.
///
/// # Errors
/// An errno and a one-line message.
pub fn open(entry: &'static DeviceEntry) -> Result<Arc<OpenDevice>, (i32, String)> {
    let mut slot = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(open) = slot.upgrade() {
        return Ok(open);
    }
    let spec = &entry.spec;
    let (access, host, driver): (Box<dyn rnic_verbs::DeviceAccess>, Option<HostNic>, DriverConfig) = match &spec.backend
    {
        Backend::Host { net, ipv4 } => {
            let nic = HostNic::open(HostNicConfig {
                device: DeviceConfig::with_mac(spec.mac),
                net: net.clone(),
            })
            .map_err(|e| {
                (
                    libc::ENODEV,
                    format!(
                        "rnic: {DEVICE_VARIABLE}={}: {e} (choose another address with {DEVICE_VARIABLE}=udp:127.0.0.N)",
                        spec.text
                    ),
                )
            })?;
            let driver = DriverConfig {
                mac_address: Some(spec.mac),
                ipv4_address: *ipv4,
                link_local_gid_first: true,
                ..DriverConfig::default()
            };
            (Box::new(nic.clone()), Some(nic), driver)
        }
        Backend::Other { device, ipv4 } => {
            let access = rnic_verbs::backend::open_device(device)
                .map_err(|e| (libc::ENODEV, format!("rnic: {DEVICE_VARIABLE}={}: {e}", spec.text)))?;
            // With an address, the host NIC's GID layout: link-local at 0, IPv4 at 1.
            let driver = DriverConfig {
                ipv4_address: *ipv4,
                link_local_gid_first: ipv4.is_some(),
                ..DriverConfig::default()
            };
            (access, None, driver)
        }
    };
    let context = Context::open_with_config(access, &driver).map_err(|e| {
        (
            libc::EIO,
            format!("rnic: {DEVICE_VARIABLE}={}: bring-up failed: {e}", spec.text),
        )
    })?;
    let open = Arc::new(OpenDevice {
        context,
        host: host.clone(),
        entry,
        objects: Mutex::new(crate::verbs::ObjectTable::default()),
        contexts: Mutex::new(Vec::new()),
    });
    match &host {
        Some(nic) => {
            let weak = Arc::downgrade(&open);
            nic.set_interrupt_handler(move || {
                if let Some(open) = weak.upgrade() {
                    crate::verbs::process_events(&open);
                }
            });
        }
        None => crate::verbs::start_event_poller(Arc::downgrade(&open)),
    }
    *slot = Arc::downgrade(&open);
    Ok(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings_parse_with_their_options() {
        let spec = parse_spec("udp:127.0.0.2").unwrap();
        assert_eq!(spec.mac, [0x02, 0x52, 0x4e, 0, 0, 2]);
        assert_eq!(
            spec.backend,
            Backend::Host {
                net: NetSpec::Udp([127, 0, 0, 2].into()),
                ipv4: Some([127, 0, 0, 2])
            }
        );
        assert_eq!(spec.active_mtu, Mtu::Mtu4096);
        let spec = parse_spec("udp:127.0.0.3,mac=02:00:00:00:00:09").unwrap();
        assert_eq!(spec.mac, [2, 0, 0, 0, 0, 9]);
        let spec = parse_spec("pci").unwrap();
        assert_eq!(
            spec.backend,
            Backend::Other {
                device: "pci,mac=02:52:4e:49:43:01".into(),
                ipv4: None
            }
        );
        let spec = parse_spec("pci,mac=02:52:4e:4d:00:05,ip=10.77.0.5").unwrap();
        assert_eq!(
            spec.backend,
            Backend::Other {
                device: "pci,mac=02:52:4e:4d:00:05".into(),
                ipv4: Some([10, 77, 0, 5])
            }
        );
        assert!(matches!(
            parse_spec("vfio-user:/tmp/a.sock").unwrap().backend,
            Backend::Other { .. }
        ));
    }

    #[test]
    fn wrong_device_strings_say_what_is_accepted() {
        for bad in [
            "udp:nowhere",
            "tcp:1.2.3.4",
            "udp:127.0.0.1,mac=zz",
            "udp:127.0.0.1,ip=1.2.3.4",
            "",
        ] {
            let error = parse_spec(bad).unwrap_err();
            assert!(!error.contains('\n'), "{error}");
            assert!(error.contains(bad) || error.contains("expected"), "{bad}: {error}");
        }
        assert_eq!(mtu_for_link(1500), Mtu::Mtu1024);
        assert_eq!(mtu_for_link(9000), Mtu::Mtu4096);
    }
}
