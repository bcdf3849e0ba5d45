//! The `eth:` backend across two network namespaces joined by a veth pair: two
//! register-level NICs do RC WRITE, READ and SEND over real AF_PACKET sockets, and the
//! kernel of one namespace resolves the other NIC's IPv4 address through the backend's
//! ARP answer.
//!
//! Needs root (network namespaces, CAP_NET_RAW) and `ip` (iproute2). Without them the
//! test fails, saying so, unless RNIC_SKIP_NETNS=1. Addresses are from 192.0.2.0/24
//! (documentation space) and exist only inside the two namespaces, which a guard removes
//! at the end, also on failure.

mod common;
mod net_common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::netns::{check_capture, environment_ready, ip, Namespaces};
use net_common::{exchange, mac, Side};
use rnic_emu::net::eth::EthBackend;
use rnic_emu::net::{NetBackend, NetStats};
use rnic_hw_model::wire;
use rnic_hw_model::Picoseconds;

/// Opens an `eth:` backend on `link` inside namespace `namespace` (from a thread that
/// enters it: the packet socket stays in that namespace).
fn open_in(namespace: &str, link: &str, mac: [u8; 6]) -> EthBackend {
    let (namespace, link) = (namespace.to_string(), link.to_string());
    std::thread::spawn(move || {
        rnic_emu::os::enter_network_namespace(&namespace).expect("setns");
        EthBackend::open(&link, mac)
    })
    .join()
    .expect("thread")
    .expect("eth backend opens")
}

/// A backend that also writes every frame it sends or receives to a pcap file (flushed
/// on drop), as `--pcap` does in the server.
struct Capturing {
    inner: Box<dyn NetBackend>,
    pcap: rnic_emu::pcap::PcapWriter,
    start: Instant,
}

impl std::fmt::Debug for Capturing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capturing").field("inner", &self.inner).finish()
    }
}

impl Capturing {
    fn record(&mut self, frame: &[u8]) {
        let at = Picoseconds(self.start.elapsed().as_nanos() as u64 * 1000);
        self.pcap.write_frame(at, frame).expect("pcap write");
    }
}

impl Drop for Capturing {
    fn drop(&mut self) {
        let _ = self.pcap.flush();
    }
}

impl NetBackend for Capturing {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn send(&mut self, frame: &[u8]) {
        self.record(frame);
        self.inner.send(frame);
    }
    fn receive(&mut self, frame: &mut Vec<u8>) -> bool {
        let received = self.inner.receive(frame);
        if received {
            self.record(frame);
        }
        received
    }
    fn pollable_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.pollable_fd()
    }
    fn stats(&self) -> NetStats {
        self.inner.stats()
    }
    fn wants_local_addresses(&self) -> bool {
        self.inner.wants_local_addresses()
    }
    fn set_local_addresses(&mut self, addresses: &[std::net::IpAddr]) {
        self.inner.set_local_addresses(addresses);
    }
}

const GID_A: [u8; 4] = [192, 0, 2, 11];
const GID_B: [u8; 4] = [192, 0, 2, 12];

#[test]
fn rc_traffic_crosses_a_veth_pair_and_arp_is_answered() {
    if !environment_ready("eth: backend") {
        return;
    }
    let namespaces = Namespaces::create("rnic", "rv");
    // The kernel of namespace A gets an address, so it has a reason to ARP.
    namespaces.add_address(0, "192.0.2.1/24");
    let capture = std::env::temp_dir().join(format!("rnic-net-eth-{}.pcap", std::process::id()));
    let backend_a = Capturing {
        inner: Box::new(open_in(&namespaces.names[0], &namespaces.links[0], mac(11))),
        pcap: rnic_emu::pcap::create(&capture).expect("pcap"),
        start: Instant::now(),
    };
    let backend_b = open_in(&namespaces.names[1], &namespaces.links[1], mac(12));
    let gid = |a: [u8; 4]| wire::ipv4_to_gid(a);
    let mut a = Side::new(11, gid(GID_A), 0x10, 12, gid(GID_B), 0x20, Box::new(backend_a));
    let mut b = Side::new(12, gid(GID_B), 0x20, 11, gid(GID_A), 0x10, Box::new(backend_b));

    // The kernel in namespace A sends a datagram to B's address: it must ARP first, and
    // B's backend answers with B's MAC.
    let namespace_a = namespaces.names[0].clone();
    std::thread::spawn(move || {
        rnic_emu::os::enter_network_namespace(&namespace_a).expect("setns");
        let socket = UdpSocket::bind("192.0.2.1:0").expect("bind in namespace A");
        socket.send_to(b"who has 192.0.2.12?", "192.0.2.12:9").expect("send");
    })
    .join()
    .expect("thread");
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut frame = Vec::new();
    let mut resolved = String::new();
    while Instant::now() < deadline {
        a.pump(&mut frame);
        b.pump(&mut frame);
        resolved = ip(&["-n", &namespaces.names[0], "neigh", "show", "192.0.2.12"]);
        if resolved.contains("02:52:4e:49:43:0c") {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        resolved.contains("02:52:4e:49:43:0c"),
        "namespace A did not resolve 192.0.2.12 to B's MAC: {resolved:?}; B: {:?}",
        b.backend.stats()
    );
    assert!(b.backend.stats().neighbour_replies >= 1);

    exchange(&mut a, &mut b);
    let (sa, sb) = (a.backend.stats(), b.backend.stats());
    eprintln!("a: {sa:?}\nb: {sb:?}");
    assert!(sa.frames_sent >= 68 && sb.frames_received >= 68, "{sa:?} {sb:?}");
    for side in [&a, &b] {
        let counters = side.h.device.transport_counters();
        assert_eq!(counters.icrc_errors, 0, "{counters:?}");
    }
    // The backends' sockets go before the namespaces they live in (and the capture is
    // flushed).
    drop((a, b));
    drop(namespaces);

    // Every RoCEv2 frame A sent or received verifies (ICRC recomputed, tshark's decode;
    // IPv4 ICRC included: the eth: backend carries the device's frames unchanged).
    // No skip: scripts/test installs tshark, and an unverified capture proves nothing.
    let frames = check_capture(&capture);
    assert!(frames >= 68, "{frames} RoCEv2 frames in the capture");
    let _ = std::fs::remove_file(&capture);
}
