//! # rnic-net — network backends of the NIC's port
//!
//! Where the frames the device transmits go, and where the frames it receives come from:
//! `rnic-emu serve --net none|udp:IP|eth:IFACE`, and the in-process NIC of the drop-in
//! `libibverbs.so.1` (`rnic_verbs::backend::HostNic`). A crate of its own so that both
//! use it without the emulator's command line and configuration.
//!
//! The server loop owns the device and one [`NetBackend`]; each pass it hands every frame
//! from `Device::poll_transmit_offloaded` to [`NetBackend::send_owned`] and every frame from
//! [`NetBackend::receive`] to `Device::receive_frame`. Backends never block: the loop
//! waits on [`NetBackend::pollable_fd`] together with the vfio-user sockets, so the device
//! stays single-threaded and realtime pacing is untouched.
//!
//! * [`none`]: frames are dropped (and captured with `--pcap`);
//! * [`udp`]: RoCEv2 over a kernel UDP socket bound to `IP:4791`, unprivileged;
//! * [`eth`]: whole Ethernet frames on an interface (AF_PACKET), with ARP/ND answered
//!   for the device's GIDs; needs CAP_NET_RAW.
//!
//! See `docs/guides/emulator.md`, "Network backends".

#![deny(unsafe_code)]
#![warn(missing_docs)]

use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

use rnic_hw_model::wire::{self, Icrc};

pub mod eth;
pub mod none;
pub mod udp;

/// What a backend has done since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames handed to the network.
    pub frames_sent: u64,
    /// Frames handed to the device.
    pub frames_received: u64,
    /// Transmitted frames dropped: not RoCEv2, unparsable, or nowhere to send them
    /// (always counts every frame for `none`).
    pub tx_dropped: u64,
    /// Send calls the kernel refused (buffer full, unreachable, ...); the frame is lost,
    /// as on a congested wire, and the transport retransmits.
    pub tx_errors: u64,
    /// Received datagrams or frames dropped as malformed (never given to the device).
    pub rx_malformed: u64,
    /// Receive calls that failed with an error other than "would block".
    pub rx_errors: u64,
    /// Frames on the wire that were not for the device (another MAC, not IP, our own
    /// echo); `eth:` only.
    pub rx_ignored: u64,
    /// Frames lost because the server loop fell behind the receive queue; `eth:` only.
    pub rx_overflow: u64,
    /// Times a send waited for the kernel's send buffer to drain instead of dropping the
    /// frame (`udp:` only; loopback is a lossless link, as RoCE expects).
    pub tx_stalls: u64,
    /// ARP replies and neighbour advertisements sent for the device; `eth:` only.
    pub neighbour_replies: u64,
}

/// A network attachment of the device's single port.
///
/// Every method is non-blocking; errors of individual frames are counted in
/// [`NetStats`], not returned, because a lost frame is normal network behaviour.
pub trait NetBackend: Send + std::fmt::Debug {
    /// A short description for logs (`udp:127.0.0.1:4791`).
    fn describe(&self) -> String;

    /// Sends one Ethernet frame (no FCS) as the device transmitted it.
    fn send(&mut self, frame: &[u8]);

    /// Sends one frame as [`NetBackend::send`], in a buffer the backend may keep until the
    /// frame is sent (no copy), its ICRC possibly left to the backend: [`Icrc::Offloaded`]
    /// says the frame comes unaltered from a device in this process and its ICRC field is
    /// zero. A backend that rewrites the headers the ICRC covers (`udp:`) then computes it
    /// once, for what it sends, instead of the device computing it, the backend checking it
    /// and computing it again. Returns a buffer for the caller to reuse: this one, or a
    /// spare of the backend's. The default fills the ICRC in, sends the frame as it is and
    /// returns it.
    fn send_owned(&mut self, mut frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        if icrc == Icrc::Offloaded {
            wire::fill_icrc(&mut frame);
        }
        self.send(&frame);
        frame
    }

    /// Moves the next received frame, if any, into `frame` (cleared first) and returns
    /// `true`; returns `false` at once when nothing is waiting.
    fn receive(&mut self, frame: &mut Vec<u8>) -> bool;

    /// A descriptor that becomes readable when [`NetBackend::receive`] may have a frame,
    /// for the server loop's wait; `None` if frames never arrive.
    fn pollable_fd(&self) -> Option<BorrowedFd<'_>>;

    /// The statistics so far.
    fn stats(&self) -> NetStats;

    /// Lets [`NetBackend::send`] hold frames back until [`NetBackend::flush`] (or until a
    /// batch is full), so that a backend can hand the kernel many frames per system call.
    /// Off when a backend is opened; a caller that turns it on must flush after each burst
    /// of sends. Backends that cannot batch ignore it.
    fn set_send_batching(&mut self, _on: bool) {}

    /// Sends every frame [`NetBackend::send`] held back.
    fn flush(&mut self) {}

    /// Whether the backend needs the device's IP addresses ([`NetBackend::set_local_addresses`]);
    /// the server loop only reads the GID table for backends that do.
    fn wants_local_addresses(&self) -> bool {
        false
    }

    /// The device's IP addresses, from its GID table (IPv4-mapped GIDs as IPv4), for
    /// answering ARP and neighbour solicitations. Called by the server loop each pass.
    fn set_local_addresses(&mut self, _addresses: &[IpAddr]) {}
}

/// Which backend to open, as written on the command line or in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetSpec {
    /// `none`: frames the device sends are dropped (and captured with `--pcap`).
    #[default]
    None,
    /// `udp:IP`: RoCEv2 datagrams on a UDP socket bound to `IP:4791`.
    Udp(IpAddr),
    /// `eth:IFACE`: Ethernet frames on a network interface.
    Eth(String),
}

impl std::fmt::Display for NetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetSpec::None => f.write_str("none"),
            NetSpec::Udp(ip) => write!(f, "udp:{ip}"),
            NetSpec::Eth(interface) => write!(f, "eth:{interface}"),
        }
    }
}

impl std::str::FromStr for NetSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "none" {
            return Ok(Self::None);
        }
        if let Some(address) = text.strip_prefix("udp:") {
            // Accept `[::1]` as well as `::1`, as people write IPv6 next to a port.
            let address = address.trim_start_matches('[').trim_end_matches(']');
            return address
                .parse()
                .map(Self::Udp)
                .map_err(|_| format!("bad address in network backend {text:?}: expected udp:IP, e.g. udp:127.0.0.1"));
        }
        if let Some(interface) = text.strip_prefix("eth:") {
            // IFNAMSIZ - 1, and no separators the kernel refuses.
            if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ', ':']) {
                return Err(format!("bad interface name in network backend {text:?}"));
            }
            return Ok(Self::Eth(interface.to_string()));
        }
        Err(format!(
            "unknown network backend {text:?}: expected none, udp:IP or eth:IFACE"
        ))
    }
}

/// The device's IP addresses: every non-zero GID of its GID table, IPv4-mapped GIDs as
/// IPv4 (into `out`, cleared first).
pub fn gid_addresses(device: &rnic_hw_model::Device, out: &mut Vec<IpAddr>) {
    out.clear();
    for entry in device.gid_table().iter().flatten() {
        if entry.gid == [0; 16] {
            continue;
        }
        out.push(match rnic_hw_model::wire::gid_to_ipv4(&entry.gid) {
            Some(v4) => IpAddr::from(v4),
            None => IpAddr::from(entry.gid),
        });
    }
}

/// Opens the backend `spec` for a device whose port has MAC address `mac`.
pub fn open(spec: &NetSpec, mac: [u8; 6]) -> io::Result<Box<dyn NetBackend>> {
    Ok(match spec {
        NetSpec::None => Box::new(none::NoNetwork::default()),
        NetSpec::Udp(ip) => Box::new(udp::UdpBackend::bind(*ip, mac)?),
        NetSpec::Eth(interface) => Box::new(eth::EthBackend::open(interface, mac)?),
    })
}

/// The first IPv4 address of network interface `name`, if it has one (for `eth:IFACE`
/// users that take the interface's address as the NIC's).
pub fn interface_ipv4(name: &str) -> Option<std::net::Ipv4Addr> {
    pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == name)?
        .ips
        .into_iter()
        .find_map(|network| match network.ip() {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print() {
        assert_eq!("none".parse::<NetSpec>().unwrap(), NetSpec::None);
        let udp: NetSpec = "udp:127.0.0.2".parse().unwrap();
        assert_eq!(udp, NetSpec::Udp([127, 0, 0, 2].into()));
        assert_eq!(udp.to_string(), "udp:127.0.0.2");
        assert_eq!(
            "udp:[::1]".parse::<NetSpec>().unwrap(),
            NetSpec::Udp(std::net::Ipv6Addr::LOCALHOST.into())
        );
        assert!("udp:localhost".parse::<NetSpec>().is_err());
        assert_eq!("eth:veth0".parse::<NetSpec>().unwrap(), NetSpec::Eth("veth0".into()));
        assert!("eth:".parse::<NetSpec>().is_err());
        assert!("eth:a/b".parse::<NetSpec>().is_err());
        assert!("tap0".parse::<NetSpec>().is_err());
    }
}
