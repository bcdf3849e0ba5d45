//! The `eth:` backend across two network namespaces joined by a veth pair: two
//! register-level NICs do RC WRITE, READ and SEND over real AF_PACKET sockets, and the
//! kernel of one namespace resolves the other NIC's IPv4 address through the backend's
//! ARP answer.
//!
//! Needs root (network namespaces, CAP_NET_RAW) and `ip` (iproute2). Without them the
//! test fails, saying so, unless RNIC_SKIP_NETNS=1. Addresses are from 192.0.2.0/24
//! (documentation space) and exist only inside the two namespaces, which a guard removes
//! at the end, also on failure.

mod net_common;

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};

use net_common::{exchange, mac, Side};
use rnic_emu::net::eth::EthBackend;
use rnic_emu::net::{NetBackend, NetStats};
use rnic_hw_model::wire;
use rnic_hw_model::Picoseconds;

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) -> String {
    let output = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run ip {args:?}: {error}"));
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Two namespaces joined by a veth pair; deleted on drop (which removes the veth too).
struct Namespaces {
    names: [String; 2],
    links: [String; 2],
}

impl Namespaces {
    fn create() -> Self {
        let id = std::process::id();
        let guard = Self {
            names: [format!("rnic-a-{id}"), format!("rnic-b-{id}")],
            // IFNAMSIZ: at most 15 characters.
            links: [format!("rva{}", id % 1_000_000), format!("rvb{}", id % 1_000_000)],
        };
        let [na, nb] = &guard.names;
        let [la, lb] = &guard.links;
        ip(&["netns", "add", na]);
        ip(&["netns", "add", nb]);
        ip(&[
            "link", "add", la, "netns", na, "type", "veth", "peer", "name", lb, "netns", nb,
        ]);
        ip(&["-n", na, "link", "set", la, "up"]);
        ip(&["-n", nb, "link", "set", lb, "up"]);
        // The kernel of namespace A gets an address, so it has a reason to ARP.
        ip(&["-n", na, "addr", "add", "192.0.2.1/24", "dev", la]);
        guard
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Root and `ip`, or a clear failure (or a skip with RNIC_SKIP_NETNS=1).
fn environment_ready() -> bool {
    let root = is_root();
    let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    if root && has_ip {
        return true;
    }
    let why = match (root, has_ip) {
        (false, _) => "needs root (network namespaces and CAP_NET_RAW)",
        _ => "needs the `ip` command (iproute2)",
    };
    if std::env::var("RNIC_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("skipped: the eth: backend test {why} (RNIC_SKIP_NETNS=1)");
        return false;
    }
    panic!("the eth: backend test {why}; run as root, or set RNIC_SKIP_NETNS=1 to skip it");
}

/// Whether we run as root, from /proc (no libc call needed in a test).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

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
    if !environment_ready() {
        return;
    }
    let namespaces = Namespaces::create();
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

    // Every RoCEv2 frame A sent or received verifies with tshark (IPv4 ICRC included:
    // the eth: backend carries the device's frames unchanged).
    let oracle = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/oracles/check-roce-pcap");
    if oracle.exists() && Command::new("tshark").arg("-v").output().is_ok() {
        let output = Command::new(&oracle)
            .arg(&capture)
            .output()
            .expect("run check-roce-pcap");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "check-roce-pcap: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        eprintln!("check-roce-pcap: {}", stdout.trim());
    } else {
        eprintln!("check-roce-pcap or tshark not found: capture not verified");
    }
    let _ = std::fs::remove_file(&capture);
}
