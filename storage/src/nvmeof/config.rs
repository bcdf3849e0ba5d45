//! A target's configuration as users write it: a TOML file, or the same pieces as
//! command-line flags (`rnic-nvmf-tgt --subsystem NQN --namespace NQN,1,ram:64MiB`).
//!
//! ```toml
//! [target]
//! device = "vfio-user:/tmp/a.sock,mac=02:52:4e:49:43:01"
//! ip = "10.0.0.1"                 # GID 0 of the NIC, and the default listen address
//! listen = "10.0.0.1:4420"        # optional
//! max_io_queues = 16
//! queue_depth = 128
//! in_capsule_data = 4096
//! mdts = 8
//!
//! [[subsystem]]
//! nqn = "nqn.2024-01.io.rnic-emu:disk1"
//! allowed_hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."]   # or allow_any_host = true
//!
//! [[subsystem.namespace]]
//! nsid = 1
//! backend = "file"                # or "ram"
//! path = "/var/tmp/disk1.img"
//! size = "1GiB"                   # creates or extends the file; without it, the file's size
//! block_size = 512
//! direct = true                   # O_DIRECT
//! ```

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use crate::block::{BlockDevice, FileBackend, FileMode, RamBackend};

use super::target::{AllowedHosts, Subsystem, TargetConfig};
use crate::rdma::ServiceAddress;

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML did not parse.
    #[error("configuration file: {0}")]
    Toml(String),
    /// A value is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// A backend could not be opened.
    #[error("namespace {nsid} of {nqn}: {source}")]
    Backend {
        /// Subsystem.
        nqn: String,
        /// Namespace.
        nsid: u32,
        /// What the backend said.
        #[source]
        source: crate::block::Error,
    },
}

/// The `[target]` section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetSection {
    /// Device string (`vfio-user:PATH[,mac=MAC]`, `pci[:BDF]`).
    pub device: Option<String>,
    /// The NIC's IPv4 address.
    pub ip: Option<Ipv4Addr>,
    /// Listen address `IP:PORT` (default: `ip`:4420).
    pub listen: Option<String>,
    /// I/O queues per controller.
    pub max_io_queues: Option<u16>,
    /// Entries per I/O queue.
    pub queue_depth: Option<u16>,
    /// In-capsule data bytes (0: none).
    pub in_capsule_data: Option<u32>,
    /// Maximum data transfer size, 2^n pages of 4 KiB.
    pub mdts: Option<u8>,
    /// Data buffer bytes per I/O queue.
    pub data_pool: Option<String>,
}

/// A `[[subsystem.namespace]]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSection {
    /// Namespace ID.
    pub nsid: u32,
    /// `ram` or `file`.
    pub backend: String,
    /// Size (`64MiB`, `1G`, bytes): required for `ram`; for `file` creates or extends.
    pub size: Option<String>,
    /// Block size (512 or 4096; default 512).
    pub block_size: Option<u32>,
    /// The backing file (`file`).
    pub path: Option<PathBuf>,
    /// Open with `O_DIRECT` (`file`).
    pub direct: Option<bool>,
}

/// A `[[subsystem]]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SubsystemSection {
    /// The subsystem's NQN.
    pub nqn: String,
    /// Any host may connect (the default when no `allowed_hosts` are given).
    pub allow_any_host: Option<bool>,
    /// Only these host NQNs may connect.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Serial number for Identify Controller (default: derived from the NQN).
    pub serial: Option<String>,
    /// Model number for Identify Controller.
    pub model: Option<String>,
    /// Namespaces.
    #[serde(default)]
    pub namespace: Vec<NamespaceSection>,
}

/// A whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    /// How the target serves.
    #[serde(default)]
    pub target: TargetSection,
    /// What it serves.
    #[serde(default)]
    pub subsystem: Vec<SubsystemSection>,
}

impl TargetFile {
    /// Parses TOML.
    ///
    /// # Errors
    /// [`ConfigError::Toml`] with the parser's message.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))
    }

    /// The target configuration (defaults for what is not given).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a malformed listen address or size.
    pub fn target_config(&self) -> Result<TargetConfig, ConfigError> {
        let defaults = TargetConfig::default();
        let section = &self.target;
        let listen = match (&section.listen, section.ip) {
            (Some(listen), _) => listen.parse().map_err(ConfigError::Invalid)?,
            (None, Some(ip)) => ServiceAddress::new(ip, 4420),
            (None, None) => defaults.listen,
        };
        Ok(TargetConfig {
            listen,
            max_io_queues: section.max_io_queues.unwrap_or(defaults.max_io_queues),
            max_queue_entries: section.queue_depth.unwrap_or(defaults.max_queue_entries),
            in_capsule_data_size: section.in_capsule_data.unwrap_or(defaults.in_capsule_data_size),
            mdts: section.mdts.unwrap_or(defaults.mdts),
            data_pool_bytes: match &section.data_pool {
                Some(size) => parse_size(size)? as usize,
                None => defaults.data_pool_bytes,
            },
            ..defaults
        })
    }

    /// Opens every namespace's backend and builds the subsystems.
    ///
    /// # Errors
    /// [`ConfigError`] for missing or inconsistent fields and backends that do not open.
    pub fn subsystems(&self) -> Result<Vec<Subsystem>, ConfigError> {
        self.subsystem.iter().map(build_subsystem).collect()
    }
}

fn build_subsystem(section: &SubsystemSection) -> Result<Subsystem, ConfigError> {
    if section.nqn.is_empty() {
        return Err(ConfigError::Invalid("a subsystem without an NQN".into()));
    }
    let allowed = match (section.allow_any_host, section.allowed_hosts.is_empty()) {
        (Some(true), false) => {
            return Err(ConfigError::Invalid(format!(
                "{}: allow_any_host and allowed_hosts together",
                section.nqn
            )))
        }
        (Some(false), true) => AllowedHosts::Only(Vec::new()),
        (_, true) => AllowedHosts::Any,
        (_, false) => AllowedHosts::Only(section.allowed_hosts.clone()),
    };
    let mut subsystem = Subsystem::nvm(&section.nqn, allowed);
    if let Some(serial) = &section.serial {
        subsystem.serial_number = serial.clone();
    }
    if let Some(model) = &section.model {
        subsystem.model_number = model.clone();
    }
    for namespace in &section.namespace {
        if subsystem.namespaces.contains_key(&namespace.nsid) || namespace.nsid == 0 || namespace.nsid == u32::MAX {
            return Err(ConfigError::Invalid(format!(
                "{}: NSID {} is invalid or given twice",
                section.nqn, namespace.nsid
            )));
        }
        let device = open_backend(namespace).map_err(|e| match e {
            OpenError::Backend(source) => ConfigError::Backend {
                nqn: section.nqn.clone(),
                nsid: namespace.nsid,
                source,
            },
            OpenError::Invalid(message) => {
                ConfigError::Invalid(format!("namespace {} of {}: {message}", namespace.nsid, section.nqn))
            }
        })?;
        subsystem.add_namespace(namespace.nsid, device);
    }
    Ok(subsystem)
}

enum OpenError {
    Backend(crate::block::Error),
    Invalid(String),
}

fn open_backend(section: &NamespaceSection) -> Result<Arc<dyn BlockDevice>, OpenError> {
    let block_size = section.block_size.unwrap_or(512);
    let size = section
        .size
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| OpenError::Invalid(e.to_string()))?;
    let blocks = |size: u64| -> Result<u64, OpenError> {
        if size == 0 || !size.is_multiple_of(u64::from(block_size)) {
            return Err(OpenError::Invalid(format!(
                "size {size} is not a positive multiple of the {block_size}-byte block"
            )));
        }
        Ok(size / u64::from(block_size))
    };
    match section.backend.as_str() {
        "ram" => {
            let size = size.ok_or_else(|| OpenError::Invalid("a RAM namespace needs a size".into()))?;
            Ok(Arc::new(
                RamBackend::new(block_size, blocks(size)?).map_err(OpenError::Backend)?,
            ))
        }
        "file" => {
            let path = section
                .path
                .as_ref()
                .ok_or_else(|| OpenError::Invalid("a file namespace needs a path".into()))?;
            let mode = if section.direct.unwrap_or(false) {
                FileMode::Direct
            } else {
                FileMode::Buffered
            };
            let backend = match size {
                Some(size) => FileBackend::create(path, block_size, blocks(size)?, mode),
                None => FileBackend::open(path, block_size, mode),
            };
            Ok(Arc::new(backend.map_err(OpenError::Backend)?))
        }
        other => Err(OpenError::Invalid(format!("backend {other:?}: ram or file"))),
    }
}

/// Parses a size: bytes, or a number with K/M/G/T (powers of 1024, with or without "iB"
/// or "B").
///
/// # Errors
/// [`ConfigError::Invalid`] for anything else or an overflow.
pub fn parse_size(text: &str) -> Result<u64, ConfigError> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| ConfigError::Invalid(format!("size {text:?}: a number and an optional K/M/G/T")))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(ConfigError::Invalid(format!("size {text:?}: unknown unit {unit:?}"))),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| ConfigError::Invalid(format!("size {text:?} overflows")))
}

/// Parses a `--namespace` flag: `NQN,NSID,ram:SIZE[,bs=N]` or
/// `NQN,NSID,file:PATH[,size=SIZE][,bs=N][,direct]`; returns the subsystem's NQN and the
/// namespace.
///
/// # Errors
/// [`ConfigError::Invalid`] with what is wrong.
pub fn parse_namespace_flag(flag: &str) -> Result<(String, NamespaceSection), ConfigError> {
    let invalid = |why: &str| ConfigError::Invalid(format!("--namespace {flag:?}: {why}"));
    let mut parts = flag.split(',');
    let nqn = parts
        .next()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("no NQN"))?;
    let nsid = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("no NSID"))?;
    let backend = parts.next().ok_or_else(|| invalid("no backend"))?;
    let mut section = NamespaceSection {
        nsid,
        ..NamespaceSection::default()
    };
    match backend.split_once(':') {
        Some(("ram", size)) => {
            section.backend = "ram".into();
            section.size = Some(size.into());
        }
        Some(("file", path)) => {
            section.backend = "file".into();
            section.path = Some(path.into());
        }
        _ => return Err(invalid("the backend is ram:SIZE or file:PATH")),
    }
    for option in parts {
        match option.split_once('=') {
            Some(("bs", value)) => section.block_size = Some(value.parse().map_err(|_| invalid("bs= takes a number"))?),
            Some(("size", value)) => section.size = Some(value.into()),
            None if option == "direct" => section.direct = Some(true),
            _ => return Err(invalid(&format!("unknown option {option:?}"))),
        }
    }
    Ok((nqn.into(), section))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2 kb").unwrap(), 2048);
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn a_file_with_every_section() {
        let file = TargetFile::parse(
            r#"
            [target]
            ip = "10.0.0.1"
            max_io_queues = 4
            queue_depth = 64
            data_pool = "4MiB"

            [[subsystem]]
            nqn = "nqn.2024-01.io.rnic-emu:a"
            allowed_hosts = ["nqn.host:1"]
            serial = "SERIAL1"

            [[subsystem.namespace]]
            nsid = 1
            backend = "ram"
            size = "1MiB"
            block_size = 4096

            [[subsystem]]
            nqn = "nqn.2024-01.io.rnic-emu:b"
            "#,
        )
        .unwrap();
        let config = file.target_config().unwrap();
        assert_eq!(config.listen, ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 4420));
        assert_eq!((config.max_io_queues, config.max_queue_entries), (4, 64));
        assert_eq!(config.data_pool_bytes, 4 << 20);
        let subsystems = file.subsystems().unwrap();
        assert_eq!(subsystems.len(), 2);
        assert_eq!(subsystems[0].serial_number, "SERIAL1");
        assert_eq!(
            subsystems[0].allowed_hosts,
            AllowedHosts::Only(vec!["nqn.host:1".into()])
        );
        let ns = &subsystems[0].namespaces[&1];
        assert_eq!((ns.device.block_size(), ns.device.block_count()), (4096, 256));
        assert_eq!(subsystems[1].allowed_hosts, AllowedHosts::Any);
    }

    #[test]
    fn mistakes_are_refused() {
        assert!(TargetFile::parse("[target]\nbogus = 1\n").is_err());
        let file =
            TargetFile::parse("[[subsystem]]\nnqn = \"n\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\n")
                .unwrap();
        assert!(matches!(file.subsystems(), Err(ConfigError::Invalid(m)) if m.contains("needs a size")));
        let file =
            TargetFile::parse("[[subsystem]]\nnqn = \"n\"\nallow_any_host = true\nallowed_hosts = [\"h\"]\n").unwrap();
        assert!(file.subsystems().is_err());
        let file = TargetFile::parse(
            "[[subsystem]]\nnqn = \"n\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"1000\"\n",
        )
        .unwrap();
        assert!(matches!(file.subsystems(), Err(ConfigError::Invalid(m)) if m.contains("multiple")));
    }

    #[test]
    fn namespace_flags() {
        let (nqn, ns) = parse_namespace_flag("nqn.a,1,ram:64MiB,bs=4096").unwrap();
        assert_eq!(nqn, "nqn.a");
        assert_eq!(
            ns,
            NamespaceSection {
                nsid: 1,
                backend: "ram".into(),
                size: Some("64MiB".into()),
                block_size: Some(4096),
                ..NamespaceSection::default()
            }
        );
        let (_, ns) = parse_namespace_flag("nqn.a,2,file:/tmp/x.img,size=1G,direct").unwrap();
        assert_eq!(ns.path, Some(PathBuf::from("/tmp/x.img")));
        assert_eq!((ns.size.as_deref(), ns.direct), (Some("1G"), Some(true)));
        assert!(parse_namespace_flag("nqn.a,x,ram:1M").is_err());
        assert!(parse_namespace_flag("nqn.a,1,disk:1M").is_err());
        assert!(parse_namespace_flag("nqn.a,1,ram:1M,color=red").is_err());
    }

    #[test]
    fn file_namespaces_open_buffered_and_direct() {
        let dir = std::env::temp_dir().join(format!("rnic-nvmf-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, direct) in [("buffered.img", false), ("direct.img", true)] {
            let path = dir.join(name);
            let section = NamespaceSection {
                nsid: 1,
                backend: "file".into(),
                size: Some("1MiB".into()),
                path: Some(path.clone()),
                direct: Some(direct),
                ..NamespaceSection::default()
            };
            match open_backend(&section) {
                Ok(device) => assert_eq!(device.block_count(), 2048),
                // tmpfs refuses O_DIRECT; the buffered file must open everywhere.
                Err(OpenError::Backend(_)) if direct => {}
                Err(_) => panic!("{name}"),
            }
            let _ = std::fs::remove_file(&path);
        }
        let _ = std::fs::remove_dir(&dir);
    }
}
