//! Addresses: IP ↔ GID, the peer's MAC (neighbour resolution), and the path a RoCE
//! connection uses, synthesised locally as Linux's `cma_resolve_iboe_route` does (RoCE has
//! no subnet administrator to ask).
//!
//! Neighbour resolution depends on where the NIC's frames go, so it is a
//! [`NeighbourResolver`] given with each device:
//!
//! * [`FabricNeighbours`]: embedded NICs on an in-process wire (the fabric knows every NIC's
//!   GIDs and MAC: the ARP of that wire);
//! * [`StandInNeighbours`]: `rnic-emu --net udp:` (the UDP backend addresses by IP and
//!   rewrites MACs, so any MAC works; it uses the one that backend stands in);
//! * [`KernelNeighbours`]: `--net eth:` and real Ethernet: the host kernel's neighbour
//!   table for the interface towards the peer (ARP for IPv4, a UDP probe triggers it), and
//!   the MAC inside a link-local IPv6 address;
//! * [`StaticNeighbours`]: a table given by hand;
//! * [`Neighbours`]: several of them in order, the first that knows wins.
//!
//! A passive side needs none of them: it answers the MAC its peer's REQ came from.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};

use crate::backend::EmbeddedFabric;
use crate::verbs::{Gid, Mtu};

/// The GID of an IP address: IPv4 as `::ffff:a.b.c.d`, IPv6 as itself.
pub fn ip_to_gid(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => Gid(v6.octets()),
    }
}

/// The IP address of a GID (an IPv4-mapped GID as IPv4).
pub fn gid_to_ip(gid: Gid) -> IpAddr {
    let v6 = Ipv6Addr::from(gid.raw());
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// What a resolver knows about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Neighbour {
    /// The MAC.
    Known([u8; 6]),
    /// Not yet (a request is on its way); ask again.
    Pending,
    /// Not reachable through this resolver.
    Unknown,
}

/// Finds the MAC of a peer on the port's network (ARP / neighbour discovery).
pub trait NeighbourResolver: Send + Sync + fmt::Debug {
    /// The MAC of `peer`, reached from our address `local`. Never blocks: a resolver that
    /// must ask the network answers [`Neighbour::Pending`] and knows more on a later call.
    fn resolve(&self, local: IpAddr, peer: IpAddr) -> Neighbour;
}

/// A fixed table.
#[derive(Debug, Default)]
pub struct StaticNeighbours {
    table: Mutex<HashMap<IpAddr, [u8; 6]>>,
}

impl StaticNeighbours {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) `ip` → `mac`.
    pub fn insert(&self, ip: IpAddr, mac: [u8; 6]) {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).insert(ip, mac);
    }
}

impl NeighbourResolver for StaticNeighbours {
    fn resolve(&self, _local: IpAddr, peer: IpAddr) -> Neighbour {
        match self.table.lock().unwrap_or_else(|e| e.into_inner()).get(&peer) {
            Some(mac) => Neighbour::Known(*mac),
            None => Neighbour::Unknown,
        }
    }
}

/// The NICs of an embedded fabric: the one whose GID table holds the peer's address.
#[derive(Clone)]
pub struct FabricNeighbours(pub EmbeddedFabric);

impl fmt::Debug for FabricNeighbours {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FabricNeighbours")
    }
}

impl NeighbourResolver for FabricNeighbours {
    fn resolve(&self, _local: IpAddr, peer: IpAddr) -> Neighbour {
        match self.0.neighbour_mac(&ip_to_gid(peer).raw()) {
            Some(mac) => Neighbour::Known(mac),
            None => Neighbour::Unknown,
        }
    }
}

/// `rnic-emu --net udp:`: the backend sends by IP and gives received frames our MAC, so
/// the MAC is only a label; this is the one the backend itself stands in for a peer it
/// has not heard from (`02:00` and the last four bytes of the address).
#[derive(Debug, Clone, Copy, Default)]
pub struct StandInNeighbours;

impl NeighbourResolver for StandInNeighbours {
    fn resolve(&self, _local: IpAddr, peer: IpAddr) -> Neighbour {
        let bytes = ip_to_gid(peer).raw();
        Neighbour::Known([0x02, 0x00, bytes[12], bytes[13], bytes[14], bytes[15]])
    }
}

/// The MAC inside a link-local IPv6 address (modified EUI-64), for any network.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkLocalNeighbours;

impl NeighbourResolver for LinkLocalNeighbours {
    fn resolve(&self, _local: IpAddr, peer: IpAddr) -> Neighbour {
        match ip_to_gid(peer).link_local_mac() {
            Some(mac) => Neighbour::Known(mac),
            None => Neighbour::Unknown,
        }
    }
}

/// The host kernel's neighbour table: what ARP found for the peer on the interface the
/// host routes it through (`/proc/net/arp`). An address without an entry gets a UDP
/// datagram to its discard port, which makes the kernel ask; a later call finds the
/// answer. For a NIC on `rnic-emu --net eth:IFACE` this is ARP on that link when the host
/// has an address there (as `scripts/rxe-interop` sets up). IPv4 only; link-local IPv6
/// peers are [`LinkLocalNeighbours`].
#[derive(Debug, Default)]
pub struct KernelNeighbours {
    probed: Mutex<HashMap<IpAddr, u32>>,
}

/// Probes of one address before giving up.
const KERNEL_PROBES: u32 = 20;

impl KernelNeighbours {
    /// A resolver over `/proc/net/arp`.
    pub fn new() -> Self {
        Self::default()
    }

    fn lookup(peer: Ipv4Addr) -> Option<[u8; 6]> {
        let table = std::fs::read_to_string("/proc/net/arp").ok()?;
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let ip: Ipv4Addr = fields.first()?.parse().ok()?;
            let flags = u32::from_str_radix(fields.get(2)?.trim_start_matches("0x"), 16).ok()?;
            // ATF_COM (0x2): the entry is complete.
            if ip != peer || flags & 0x2 == 0 {
                return None;
            }
            let mac = crate::backend::vfio_user::parse_mac(fields.get(3)?)?;
            (mac != [0; 6]).then_some(mac)
        })
    }
}

impl NeighbourResolver for KernelNeighbours {
    fn resolve(&self, _local: IpAddr, peer: IpAddr) -> Neighbour {
        let IpAddr::V4(v4) = peer else {
            return Neighbour::Unknown;
        };
        if v4.is_loopback() || v4.is_unspecified() {
            // Loopback has no neighbours (`rnic-emu --net udp:127.0.0.N`).
            return Neighbour::Unknown;
        }
        if let Some(mac) = Self::lookup(v4) {
            return Neighbour::Known(mac);
        }
        let mut probed = self.probed.lock().unwrap_or_else(|e| e.into_inner());
        let count = probed.entry(peer).or_insert(0);
        if *count >= KERNEL_PROBES {
            return Neighbour::Unknown;
        }
        *count += 1;
        // Any datagram makes the kernel resolve the next hop; the discard port ignores it.
        if let Ok(socket) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
            let _ = socket.send_to(&[], SocketAddr::new(peer, 9));
        }
        Neighbour::Pending
    }
}

/// Several resolvers asked in order: the first [`Neighbour::Known`] wins; pending if any
/// is still asking.
#[derive(Debug, Clone, Default)]
pub struct Neighbours(pub Vec<Arc<dyn NeighbourResolver>>);

impl Neighbours {
    /// What a tool uses when it does not know the network: a static table, link-local
    /// addresses, the kernel's neighbours, and finally the UDP backend's stand-in MAC.
    pub fn host(table: Arc<StaticNeighbours>) -> Self {
        Self(vec![
            table,
            Arc::new(LinkLocalNeighbours),
            Arc::new(KernelNeighbours::new()),
            Arc::new(StandInNeighbours),
        ])
    }
}

impl NeighbourResolver for Neighbours {
    fn resolve(&self, local: IpAddr, peer: IpAddr) -> Neighbour {
        let mut pending = false;
        for resolver in &self.0 {
            match resolver.resolve(local, peer) {
                Neighbour::Known(mac) => return Neighbour::Known(mac),
                Neighbour::Pending => pending = true,
                Neighbour::Unknown => {}
            }
        }
        if pending {
            Neighbour::Pending
        } else {
            Neighbour::Unknown
        }
    }
}

/// A resolved route (`struct rdma_route` with its one path record), what [`CmId::resolve_route`](super::CmId::resolve_route) builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Our GID (source address).
    pub sgid: Gid,
    /// Index of `sgid` in the device's GID table.
    pub sgid_index: u8,
    /// The peer's GID.
    pub dgid: Gid,
    /// The peer's MAC.
    pub dmac: [u8; 6],
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class (the id's type of service).
    pub traffic_class: u8,
    /// Flow label: `(source port × 31 + destination port) & 0xFFFFF` for IPv4 (Linux's
    /// `cma_get_roce_udp_flow_label`), 0 for IPv6.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Path MTU.
    pub mtu: Mtu,
    /// Packet lifetime (exponent).
    pub packet_lifetime: u8,
}

/// Linux's RoCE flow label of an IPv4 RDMA-CM connection.
pub fn flow_label(source: SocketAddr, destination: SocketAddr) -> u32 {
    if source.is_ipv4() {
        (u32::from(source.port())
            .wrapping_mul(31)
            .wrapping_add(u32::from(destination.port())))
            & 0xF_FFFF
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_and_gid_convert_both_ways() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 99, 0, 2));
        assert_eq!(ip_to_gid(v4).raw()[10..], [0xff, 0xff, 10, 99, 0, 2]);
        assert_eq!(gid_to_ip(ip_to_gid(v4)), v4);
        let v6: IpAddr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        assert_eq!(gid_to_ip(ip_to_gid(v6)), v6);
    }

    #[test]
    fn the_flow_label_is_linuxs_port_hash() {
        // The Linux REQ of the reference capture: 32972 → 18515 gives 0xFE107.
        let source: SocketAddr = "10.99.0.2:32972".parse().unwrap();
        let destination: SocketAddr = "10.99.0.1:18515".parse().unwrap();
        assert_eq!(flow_label(source, destination), 0xFE107);
        let six: SocketAddr = "[fe80::1]:1".parse().unwrap();
        assert_eq!(flow_label(six, six), 0);
    }

    #[test]
    fn resolvers_chain_in_order() {
        let table = Arc::new(StaticNeighbours::new());
        let peer = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        let chain = Neighbours(vec![table.clone(), Arc::new(StandInNeighbours)]);
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(chain.resolve(local, peer), Neighbour::Known([2, 0, 127, 0, 0, 2]));
        table.insert(peer, [2, 0x52, 0x4e, 0x49, 0x43, 2]);
        assert_eq!(
            chain.resolve(local, peer),
            Neighbour::Known([2, 0x52, 0x4e, 0x49, 0x43, 2])
        );
        let link_local: IpAddr = "fe80::52:4eff:fe49:4303".parse().unwrap();
        assert_eq!(
            LinkLocalNeighbours.resolve(local, link_local),
            Neighbour::Known([0x02, 0x52, 0x4e, 0x49, 0x43, 0x03])
        );
        assert_eq!(Neighbours::default().resolve(local, peer), Neighbour::Unknown);
    }
}
