//! NVM subsystems and their namespaces, as the target serves them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::block::BlockDevice;

/// The well-known NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// One namespace: a block device under an NSID.
#[derive(Clone)]
pub struct Namespace {
    /// Namespace ID (1-based).
    pub nsid: u32,
    /// Where its blocks live.
    pub device: Arc<dyn BlockDevice>,
    /// NGUID (stable: derived from the subsystem NQN and NSID unless configured).
    pub nguid: [u8; 16],
    /// UUID (likewise).
    pub uuid: [u8; 16],
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("nsid", &self.nsid)
            .field("block_size", &self.device.block_size())
            .field("blocks", &self.device.block_count())
            .finish()
    }
}

/// What kind of subsystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    /// The discovery subsystem: admin queue only, serves the Discovery log page.
    Discovery,
    /// An NVM subsystem with namespaces.
    Nvm,
}

/// Which hosts may connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Every host (Linux's `attr_allow_any_host`).
    Any,
    /// Only these host NQNs.
    Only(Vec<String>),
}

impl AllowedHosts {
    /// Whether `host_nqn` may connect.
    pub fn allows(&self, host_nqn: &str) -> bool {
        match self {
            AllowedHosts::Any => true,
            AllowedHosts::Only(hosts) => hosts.iter().any(|h| h == host_nqn),
        }
    }
}

/// Per-subsystem counters behind the SMART / Health log page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubsystemCounters {
    /// Bytes read by hosts.
    pub bytes_read: u64,
    /// Bytes written by hosts.
    pub bytes_written: u64,
    /// Read commands completed.
    pub read_commands: u64,
    /// Write commands completed.
    pub write_commands: u64,
    /// Backend errors.
    pub media_errors: u64,
}

/// A subsystem the target serves.
#[derive(Debug, Clone)]
pub struct Subsystem {
    /// Its NQN.
    pub nqn: String,
    /// Discovery or NVM.
    pub kind: SubsystemKind,
    /// Serial number reported in Identify Controller.
    pub serial_number: String,
    /// Model number reported in Identify Controller.
    pub model_number: String,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Namespace>,
    /// Who may connect.
    pub allowed_hosts: AllowedHosts,
    /// SMART counters.
    pub counters: SubsystemCounters,
}

impl Subsystem {
    /// The discovery subsystem.
    pub fn discovery() -> Self {
        Self {
            nqn: DISCOVERY_NQN.into(),
            kind: SubsystemKind::Discovery,
            serial_number: serial_from(DISCOVERY_NQN),
            model_number: "rnic-emu NVMe-oF discovery".into(),
            namespaces: BTreeMap::new(),
            allowed_hosts: AllowedHosts::Any,
            counters: SubsystemCounters::default(),
        }
    }

    /// An NVM subsystem without namespaces yet.
    pub fn nvm(nqn: &str, allowed_hosts: AllowedHosts) -> Self {
        Self {
            nqn: nqn.into(),
            kind: SubsystemKind::Nvm,
            serial_number: serial_from(nqn),
            model_number: "rnic-emu NVMe-oF target".into(),
            namespaces: BTreeMap::new(),
            allowed_hosts,
            counters: SubsystemCounters::default(),
        }
    }

    /// Adds `device` as namespace `nsid` (identifiers derived from the NQN and NSID).
    pub fn add_namespace(&mut self, nsid: u32, device: Arc<dyn BlockDevice>) {
        let nguid = identifier_from(&self.nqn, nsid, 0x4E);
        let uuid = identifier_from(&self.nqn, nsid, 0x55);
        self.namespaces.insert(
            nsid,
            Namespace {
                nsid,
                device,
                nguid,
                uuid,
            },
        );
    }

    /// The highest NSID (Identify Controller NN).
    pub fn max_nsid(&self) -> u32 {
        self.namespaces.keys().next_back().copied().unwrap_or(0)
    }
}

/// FNV-1a, 64 bits.
fn fnv(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325 ^ seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01B3)
    })
}

/// A serial number of 20 hex digits derived from the NQN (stable across restarts).
pub fn serial_from(nqn: &str) -> String {
    format!("{:016x}{:04x}", fnv(nqn.as_bytes(), 1), fnv(nqn.as_bytes(), 2) as u16)
}

/// A 16-byte identifier derived from the NQN, the NSID and a tag (version-4-shaped for
/// UUIDs, so hosts print it as one).
fn identifier_from(nqn: &str, nsid: u32, tag: u8) -> [u8; 16] {
    let mut seed = nqn.as_bytes().to_vec();
    seed.extend_from_slice(&nsid.to_le_bytes());
    seed.push(tag);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&fnv(&seed, 3).to_be_bytes());
    out[8..].copy_from_slice(&fnv(&seed, 4).to_be_bytes());
    if tag == 0x55 {
        out[6] = (out[6] & 0x0F) | 0x40;
        out[8] = (out[8] & 0x3F) | 0x80;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::RamBackend;

    #[test]
    fn identifiers_are_stable_and_distinct() {
        let mut a = Subsystem::nvm("nqn.2024-01.io.example:a", AllowedHosts::Any);
        let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(512, 8).unwrap());
        a.add_namespace(1, device.clone());
        a.add_namespace(2, device);
        let (one, two) = (&a.namespaces[&1], &a.namespaces[&2]);
        assert_ne!(one.nguid, two.nguid);
        assert_ne!(one.uuid, one.nguid);
        assert_eq!(one.uuid[6] >> 4, 4, "a version-4 UUID");
        assert_eq!(serial_from("x"), serial_from("x"));
        assert_eq!(serial_from("x").len(), 20);
        assert_eq!(a.max_nsid(), 2);
    }

    #[test]
    fn allowed_hosts() {
        assert!(AllowedHosts::Any.allows("anyone"));
        let only = AllowedHosts::Only(vec!["nqn.host:a".into()]);
        assert!(only.allows("nqn.host:a"));
        assert!(!only.allows("nqn.host:b"));
    }
}
