//! The TOML configuration file (`rnic-emu serve --config FILE.toml`) and how it combines
//! with the command line: a command-line option wins over the same key in the file;
//! everything without an option (device identity and sizes, protocol limits, doorbell
//! polling) is set in the file. Unknown keys are an error, so a typo does not silently
//! leave a default in place.
//!
//! ```toml
//! socket = "/tmp/rnic0.sock"      # --socket
//! mac = "02:52:4e:49:43:01"       # --mac
//! timing = "realtime"             # --timing: realtime | fast
//! net = "none"                    # --net: none | udp:IP | eth:IFACE (or a [net] table)
//! pcap = "/tmp/rnic0.pcap"        # --pcap
//! log = "info"                    # --log
//!
//! [device]
//! doorbell_pages = 64             # BAR2 pages (1..=4096); page 0 is the driver's
//! vendor_id = 0x1234
//! device_id = 0x5244
//! subsystem_vendor_id = 0x1234
//! subsystem_id = 0x0001
//! revision_id = 0x30
//! firmware_version = 0x00010000   # QUERY_FW_VER: major << 16 | minor << 8 | sub
//!
//! [vfio_user]
//! max_msg_fds = 16                # 1..=253 (QEMU refuses > 16)
//! max_data_xfer_size = 1048576    # 4096..=64 MiB
//! max_dma_maps = 65535            # 1..=65535
//! reply_timeout_ms = 2000         # a client that does not read its replies is dropped
//!
//! [doorbell_polling]
//! spin_us = 100                   # busy-poll this long after activity
//! max_sleep_us = 1000             # longest idle sleep = worst-case extra doorbell latency
//! ```
//!
//! Instead of the `net = "..."` key, the backend may be given as a table:
//!
//! ```text
//! [net]
//! backend = "udp:127.0.0.2"       # --net
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use rnic_hw_model::DeviceConfig;
use serde::Deserialize;

use crate::net::NetSpec;
use crate::timing::TimingMode;
use crate::vfio_user::{Limits, Polling, ServerOptions};

/// A configuration problem, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigFile {
    /// Socket path.
    pub socket: Option<PathBuf>,
    /// Port MAC address, `aa:bb:cc:dd:ee:ff`.
    pub mac: Option<String>,
    /// Virtual-time mapping.
    pub timing: Option<TimingMode>,
    /// Network backend: `net = "udp:IP"` or a `[net]` table.
    pub net: Option<NetValue>,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// Log filter.
    pub log: Option<String>,
    /// Device identity and sizes.
    pub device: DeviceSection,
    /// Protocol limits.
    pub vfio_user: VfioUserSection,
    /// Doorbell polling.
    pub doorbell_polling: PollingSection,
}

/// `[device]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceSection {
    /// Number of 4 KiB doorbell pages in BAR2.
    pub doorbell_pages: u32,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// PCI device id.
    pub device_id: u16,
    /// PCI subsystem vendor id.
    pub subsystem_vendor_id: u16,
    /// PCI subsystem id.
    pub subsystem_id: u16,
    /// PCI revision id.
    pub revision_id: u8,
    /// Firmware version reported by QUERY_FW_VER.
    pub firmware_version: u32,
}

impl Default for DeviceSection {
    fn default() -> Self {
        let device = DeviceConfig::default();
        Self {
            doorbell_pages: device.doorbell_pages,
            vendor_id: device.identity.vendor_id,
            device_id: device.identity.device_id,
            subsystem_vendor_id: device.identity.subsystem_vendor_id,
            subsystem_id: device.identity.subsystem_id,
            revision_id: device.identity.revision_id,
            firmware_version: device.firmware_version,
        }
    }
}

/// `[vfio_user]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VfioUserSection {
    /// `max_msg_fds` capability.
    pub max_msg_fds: u32,
    /// `max_data_xfer_size` capability.
    pub max_data_xfer_size: u32,
    /// `max_dma_maps` capability.
    pub max_dma_maps: u32,
    /// Reply write timeout in milliseconds.
    pub reply_timeout_ms: u64,
}

impl Default for VfioUserSection {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            max_msg_fds: limits.max_msg_fds,
            max_data_xfer_size: limits.max_data_xfer_size,
            max_dma_maps: limits.max_dma_maps,
            reply_timeout_ms: limits.reply_timeout.as_millis() as u64,
        }
    }
}

/// `[doorbell_polling]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PollingSection {
    /// Busy-poll time after activity, µs.
    pub spin_us: u64,
    /// Longest idle sleep, µs.
    pub max_sleep_us: u64,
}

impl Default for PollingSection {
    fn default() -> Self {
        let polling = Polling::default();
        Self {
            spin_us: polling.spin.as_micros() as u64,
            max_sleep_us: polling.max_sleep.as_micros() as u64,
        }
    }
}

impl ConfigFile {
    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(e.to_string()))
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
    }
}

/// The `net` key: a backend string, or a `[net]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum NetValue {
    /// `net = "udp:127.0.0.1"`.
    Spec(String),
    /// `[net]` with `backend = "udp:127.0.0.1"`.
    Table(NetSection),
}

/// `[net]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetSection {
    /// `none`, `udp:IP` or `eth:IFACE`, as for `--net`.
    pub backend: Option<String>,
}

impl NetValue {
    fn spec(&self) -> Option<&str> {
        match self {
            NetValue::Spec(spec) => Some(spec),
            NetValue::Table(table) => table.backend.as_deref(),
        }
    }
}

/// Parses a MAC address written as six colon-separated hex bytes.
pub fn parse_mac(text: &str) -> Result<[u8; 6], ConfigError> {
    let bad = || {
        ConfigError(format!(
            "bad MAC address {text:?}: expected six hex bytes like 02:52:4e:49:43:01"
        ))
    };
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().ok_or_else(bad)?;
        if part.is_empty() || part.len() > 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    if mac[0] & 1 != 0 {
        return Err(ConfigError(format!("MAC address {text} is a multicast address")));
    }
    Ok(mac)
}

/// Values from the command line that override the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--mac`.
    pub mac: Option<String>,
    /// `--timing`.
    pub timing: Option<TimingMode>,
    /// `--net`.
    pub net: Option<String>,
    /// `--pcap`.
    pub pcap: Option<PathBuf>,
}

/// The server options from the file and the command line (which wins).
pub fn resolve(file: &ConfigFile, cli: &Overrides) -> Result<ServerOptions, ConfigError> {
    let socket = cli
        .socket
        .clone()
        .or_else(|| file.socket.clone())
        .ok_or_else(|| ConfigError("no socket path: give --socket PATH (or `socket` in the config file)".into()))?;
    let net: NetSpec = cli
        .net
        .as_deref()
        .or(file.net.as_ref().and_then(NetValue::spec))
        .unwrap_or("none")
        .parse()
        .map_err(ConfigError)?;
    let mut device = DeviceConfig::default();
    if let Some(mac) = cli.mac.as_deref().or(file.mac.as_deref()) {
        device.mac_address = parse_mac(mac)?;
    }
    let d = &file.device;
    if !(1..=4096).contains(&d.doorbell_pages) {
        return Err(ConfigError(format!(
            "device.doorbell_pages = {} is outside 1..=4096",
            d.doorbell_pages
        )));
    }
    device.doorbell_pages = d.doorbell_pages;
    device.identity.vendor_id = d.vendor_id;
    device.identity.device_id = d.device_id;
    device.identity.subsystem_vendor_id = d.subsystem_vendor_id;
    device.identity.subsystem_id = d.subsystem_id;
    device.identity.revision_id = d.revision_id;
    device.firmware_version = d.firmware_version;
    let v = &file.vfio_user;
    let limits = Limits {
        max_msg_fds: v.max_msg_fds,
        max_data_xfer_size: v.max_data_xfer_size,
        max_dma_maps: v.max_dma_maps,
        reply_timeout: Duration::from_millis(v.reply_timeout_ms.max(1)),
    };
    if !(1..=253).contains(&limits.max_msg_fds) {
        return Err(ConfigError(format!(
            "vfio_user.max_msg_fds = {} is outside 1..=253",
            limits.max_msg_fds
        )));
    }
    if !(4096..=64 << 20).contains(&limits.max_data_xfer_size) {
        return Err(ConfigError(format!(
            "vfio_user.max_data_xfer_size = {} is outside 4096..=67108864",
            limits.max_data_xfer_size
        )));
    }
    if !(1..=65535).contains(&limits.max_dma_maps) {
        return Err(ConfigError(format!(
            "vfio_user.max_dma_maps = {} is outside 1..=65535",
            limits.max_dma_maps
        )));
    }
    let p = &file.doorbell_polling;
    if p.max_sleep_us == 0 || p.max_sleep_us > 1_000_000 {
        return Err(ConfigError(format!(
            "doorbell_polling.max_sleep_us = {} is outside 1..=1000000",
            p.max_sleep_us
        )));
    }
    let options = ServerOptions {
        socket,
        device,
        timing: cli.timing.or(file.timing).unwrap_or_default(),
        limits,
        polling: Polling {
            spin: Duration::from_micros(p.spin_us),
            max_sleep: Duration::from_micros(p.max_sleep_us),
        },
        pcap: cli.pcap.clone().or_else(|| file.pcap.clone()),
        net,
        handle_signals: true,
    };
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_and_the_command_line_wins() {
        let text = r#"
            socket = "/tmp/file.sock"
            mac = "02:00:00:00:00:07"
            timing = "fast"
            [device]
            doorbell_pages = 8
            device_id = 0x5245
            [vfio_user]
            max_msg_fds = 8
            [doorbell_polling]
            spin_us = 0
            max_sleep_us = 250
        "#;
        let file = ConfigFile::parse(text).unwrap();
        let cli = Overrides {
            socket: Some("/tmp/cli.sock".into()),
            timing: Some(TimingMode::Realtime),
            ..Overrides::default()
        };
        let options = resolve(&file, &cli).unwrap();
        assert_eq!(options.socket, PathBuf::from("/tmp/cli.sock"));
        assert_eq!(options.timing, TimingMode::Realtime);
        assert_eq!(options.device.mac_address, [2, 0, 0, 0, 0, 7]);
        assert_eq!(options.device.doorbell_pages, 8);
        assert_eq!(options.device.identity.device_id, 0x5245);
        assert_eq!(options.limits.max_msg_fds, 8);
        assert_eq!(options.polling.max_sleep, Duration::from_micros(250));
        assert_eq!(options.net, NetSpec::None);
    }

    #[test]
    fn the_module_documentation_example_is_valid() {
        let doc = include_str!("config.rs");
        let start = doc.find("//! ```toml\n").unwrap() + "//! ```toml\n".len();
        let end = start + doc[start..].find("//! ```\n").unwrap();
        let example: String = doc[start..end]
            .lines()
            .map(|l| l.strip_prefix("//!").unwrap_or(l).trim_start())
            .collect::<Vec<_>>()
            .join("\n");
        let file = ConfigFile::parse(&example).unwrap();
        assert!(resolve(&file, &Overrides::default()).is_ok());
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        assert!(ConfigFile::parse("[device]\ndoorbel_pages = 3").is_err());
        assert!(ConfigFile::parse("timing = \"slow\"").is_err());
        let no_socket = resolve(&ConfigFile::default(), &Overrides::default()).unwrap_err();
        assert!(no_socket.0.contains("--socket"));
        let with_socket = Overrides {
            socket: Some("/tmp/x".into()),
            ..Overrides::default()
        };
        let mut file = ConfigFile::default();
        file.vfio_user.max_msg_fds = 0;
        assert!(resolve(&file, &with_socket).is_err());
        let udp = Overrides {
            net: Some("udp:127.0.0.1".into()),
            ..with_socket.clone()
        };
        assert_eq!(
            resolve(&ConfigFile::default(), &udp).unwrap().net,
            NetSpec::Udp([127, 0, 0, 1].into())
        );
        let eth = Overrides {
            net: Some("eth:veth0".into()),
            ..with_socket.clone()
        };
        assert_eq!(
            resolve(&ConfigFile::default(), &eth).unwrap().net,
            NetSpec::Eth("veth0".into())
        );
        assert!(resolve(
            &ConfigFile::default(),
            &Overrides {
                net: Some("udp:x".into()),
                ..with_socket.clone()
            }
        )
        .is_err());
    }

    #[test]
    fn the_net_table_and_the_net_key() {
        let table = ConfigFile::parse("socket = \"/tmp/s\"\n[net]\nbackend = \"udp:127.0.0.2\"").unwrap();
        assert_eq!(
            resolve(&table, &Overrides::default()).unwrap().net,
            NetSpec::Udp([127, 0, 0, 2].into())
        );
        let key = ConfigFile::parse("socket = \"/tmp/s\"\nnet = \"udp:::1\"").unwrap();
        assert_eq!(
            resolve(&key, &Overrides::default()).unwrap().net,
            NetSpec::Udp(std::net::Ipv6Addr::LOCALHOST.into())
        );
        let cli = Overrides {
            net: Some("none".into()),
            ..Overrides::default()
        };
        assert_eq!(resolve(&table, &cli).unwrap().net, NetSpec::None);
        assert!(ConfigFile::parse("[net]\nbackend = \"none\"\nspeed = 1").is_err());
    }

    #[test]
    fn mac_addresses() {
        assert_eq!(parse_mac("02:52:4e:49:43:01").unwrap(), [2, 0x52, 0x4e, 0x49, 0x43, 1]);
        assert!(parse_mac("02:52:4e:49:43").is_err());
        assert!(parse_mac("02:52:4e:49:43:01:00").is_err());
        assert!(parse_mac("02:52:4e:49:43:zz").is_err());
        assert!(parse_mac("01:00:5e:00:00:01").is_err(), "multicast");
    }
}
