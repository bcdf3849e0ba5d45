//! Addressing: the Ethernet, IP and UDP headers of a packet from the QPC address vector
//! (RC/UC) or the UD WQE, the GID and SMAC tables and a per-device IPv4 identification
//! counter; and the receive-side address checks.
//!
//! * Source MAC: SMAC table entry at the source GID index if configured, else entry 0
//!   (the port MAC). UD WQEs name their SMAC index explicitly.
//! * Source GID: GID table entry at QPC `GMV_IDX` (UD: the WQE's sgid index). An
//!   IPv4-mapped source GID (`::ffff:a.b.c.d`) gives an IPv4 header (DSCP = TC >> 2,
//!   ECN = TC & 3, TTL = hop limit, DF, identification from the device counter);
//!   anything else an IPv6 header (traffic class, flow label, hop limit).
//! * UDP source port: QPC/WQE `UDPSPN` when non-zero, else
//!   [`wire::udp_source_port`] of the flow label and the QPNs.

use rnic_firmware_if::context::Qpc;

use crate::wire::{self, EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr, RoceRepr, VlanTag};

use super::wqe_fetch::UdAddress;
use super::{Engine, Io};

/// EtherType of IPv4.
const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
const ETHERTYPE_IPV6: u16 = 0x86DD;
/// VLAN ID meaning "untagged" in the QPC.
const NO_VLAN: u16 = 0xFFF;

/// The address vector of an RC/UC QP as its QPC holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Path {
    pub dmac: [u8; 6],
    pub dgid: [u8; 16],
    pub sgid_index: u16,
    pub vlan_id: u16,
    pub service_level: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub udp_source_port: u16,
}

impl Path {
    /// The QPC's address vector.
    pub fn from_qpc(qpc: &Qpc) -> Option<Self> {
        Some(Self {
            dmac: qpc.dmac(),
            dgid: qpc.dgid(),
            sgid_index: qpc.sgid_index(),
            vlan_id: qpc.vlan_id(),
            service_level: qpc.service_level(),
            traffic_class: qpc.traffic_class(),
            flow_label: qpc.flow_label(),
            hop_limit: qpc.hop_limit(),
            udp_source_port: qpc.udp_source_port(),
        })
    }

    /// The address vector of a UD WQE.
    pub fn from_ud(ud: &UdAddress) -> Self {
        Self {
            dmac: ud.dmac,
            dgid: ud.dgid,
            sgid_index: u16::from(ud.sgid_index),
            vlan_id: ud.vlan.unwrap_or(NO_VLAN),
            service_level: ud.service_level,
            traffic_class: ud.traffic_class,
            flow_label: ud.flow_label,
            hop_limit: ud.hop_limit,
            udp_source_port: ud.udp_source_port,
        }
    }
}

/// Why a packet could not be addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathError {
    /// The source GID index names no configured GID.
    NoSourceGid(u16),
    /// Source and destination GIDs are of different IP families.
    FamilyMismatch,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::NoSourceGid(index) => write!(f, "a configured GID at source GID index {index}"),
            PathError::FamilyMismatch => f.write_str("source and destination GIDs of one IP family"),
        }
    }
}

/// Whether `gid` is an IPv4-mapped IPv6 address.
pub(crate) fn ipv4_of(gid: &[u8; 16]) -> Option<[u8; 4]> {
    wire::gid_to_ipv4(gid)
}

/// The IPv4-mapped GID of an IPv4 address.
pub(crate) fn gid_of_ipv4(ip: [u8; 4]) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[10] = 0xFF;
    gid[11] = 0xFF;
    gid[12..].copy_from_slice(&ip);
    gid
}

impl<I: Io> Engine<I> {
    /// The Ethernet/IP/UDP part of a packet on `path` from QP `local_qpn` to
    /// `remote_qpn`; the caller fills BTH and extension headers.
    // Inlined into its two callers (one per packet built): the large repr is then built
    // where the caller keeps it instead of being copied out of the returned Result.
    #[inline(always)]
    pub(crate) fn packet_headers(
        &mut self,
        path: &Path,
        smac_index: Option<u8>,
        local_qpn: u32,
        remote_qpn: u32,
        bth: wire::BthRepr,
    ) -> Result<RoceRepr, PathError> {
        let port = self.io.port().addresses();
        let sgid = port
            .source_gid(path.sgid_index)
            .ok_or(PathError::NoSourceGid(path.sgid_index))?;
        let smac = port.source_mac(smac_index, path.sgid_index);
        let vlan = (path.vlan_id < NO_VLAN).then_some(VlanTag {
            pcp: path.service_level & 7,
            dei: false,
            vid: path.vlan_id,
        });
        let (ip, ethertype) = match (ipv4_of(&sgid), ipv4_of(&path.dgid)) {
            (Some(source), Some(destination)) => {
                let identification = self.io.port().next_ipv4_identification();
                (
                    IpRepr::V4(Ipv4Repr {
                        source,
                        destination,
                        dscp: path.traffic_class >> 2,
                        ecn: path.traffic_class & 3,
                        ttl: path.hop_limit,
                        identification,
                        dont_fragment: true,
                    }),
                    ETHERTYPE_IPV4,
                )
            }
            (None, None) => (
                IpRepr::V6(Ipv6Repr {
                    source: sgid,
                    destination: path.dgid,
                    traffic_class: path.traffic_class,
                    flow_label: path.flow_label & 0xF_FFFF,
                    hop_limit: path.hop_limit,
                }),
                ETHERTYPE_IPV6,
            ),
            _ => return Err(PathError::FamilyMismatch),
        };
        let udp_source_port = if path.udp_source_port != 0 {
            path.udp_source_port
        } else {
            wire::udp_source_port(path.flow_label, local_qpn, remote_qpn)
        };
        let ethernet = EthernetRepr {
            destination: path.dmac,
            source: smac,
            vlan,
            ethertype,
        };
        Ok(RoceRepr::new(ethernet, ip, udp_source_port, bth))
    }

    /// Whether `mac` is one of this port's MAC addresses (SMAC table).
    pub(crate) fn is_local_mac(&mut self, mac: &[u8; 6]) -> bool {
        self.io.port().addresses().is_local_mac(mac)
    }

    /// Whether `gid` is one of this port's GIDs.
    pub(crate) fn is_local_gid(&mut self, gid: &[u8; 16]) -> bool {
        self.io.port().addresses().is_local_gid(gid)
    }
}

/// The source and destination GIDs of a received packet.
pub(crate) fn packet_gids(ip: &IpRepr) -> ([u8; 16], [u8; 16]) {
    match ip {
        IpRepr::V4(v4) => (gid_of_ipv4(v4.source), gid_of_ipv4(v4.destination)),
        IpRepr::V6(v6) => (v6.source, v6.destination),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gids_round_trip() {
        let gid = gid_of_ipv4([192, 168, 1, 2]);
        assert_eq!(ipv4_of(&gid), Some([192, 168, 1, 2]));
        let mut v6 = gid;
        v6[0] = 0xfe;
        assert_eq!(ipv4_of(&v6), None);
    }
}
