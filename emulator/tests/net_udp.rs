//! The `udp:` network backend: real datagrams on loopback addresses between backends,
//! frames rebuilt so the device's ICRC check passes, garbage counted and dropped, and two
//! register-level NICs doing RC WRITE, READ and SEND through two backends.
//!
//! Each test uses its own loopback addresses (port 4791 is bound per address), so the
//! tests of this file run in parallel.

use std::net::{IpAddr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

use rnic_emu::net::udp::UdpBackend;
use rnic_emu::net::NetBackend;
use rnic_hw_model::wire::{
    self, BthOpcode, BthRepr, EthernetRepr, Icrc, IpRepr, Ipv4Repr, Ipv6Repr, RethRepr, RoceRepr,
};

const MAC_A: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x0b];

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Waits (at most two seconds) for the next frame of `backend`.
fn receive(backend: &mut UdpBackend) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut frame = Vec::new();
    while Instant::now() < deadline {
        if backend.receive(&mut frame) {
            return Some(frame);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

fn v4_frame(source: [u8; 4], destination: [u8; 4], identification: u16, payload: &[u8]) -> (RoceRepr, Vec<u8>) {
    let mut repr = RoceRepr::new(
        EthernetRepr {
            destination: MAC_B,
            source: MAC_A,
            vlan: None,
            ethertype: 0x0800,
        },
        IpRepr::V4(Ipv4Repr {
            source,
            destination,
            dscp: 26,
            ecn: 1,
            ttl: 17,
            identification,
            dont_fragment: true,
        }),
        wire::udp_source_port(0, 0x11, 0x22),
        BthRepr::new(BthOpcode::RC_RDMA_WRITE_ONLY, 0x22, 1000),
    );
    repr.reth = Some(RethRepr {
        virtual_address: 0x1000,
        rkey: 0x1234,
        dma_length: payload.len() as u32,
    });
    let mut frame = Vec::new();
    wire::emit_frame(&repr, payload, &mut frame);
    (repr, frame)
}

/// The fields the backend is documented to change: source MAC, the IP fields the ICRC
/// masks, and for IPv4 the identification (0) and DF (set).
fn normalized(mut repr: RoceRepr) -> RoceRepr {
    repr.ethernet.source = [0; 6];
    match &mut repr.ip {
        IpRepr::V4(v4) => {
            v4.dscp = 0;
            v4.ecn = 0;
            v4.ttl = 0;
            v4.identification = 0;
            v4.dont_fragment = true;
        }
        IpRepr::V6(v6) => {
            v6.traffic_class = 0;
            v6.flow_label = 0;
            v6.hop_limit = 0;
        }
    }
    repr
}

#[test]
fn ipv4_frames_cross_between_two_loopback_addresses_with_a_good_icrc() {
    let mut a = UdpBackend::bind(ip("127.0.0.1"), MAC_A).expect("bind 127.0.0.1:4791");
    let mut b = UdpBackend::bind(ip("127.0.0.2"), MAC_B).expect("bind 127.0.0.2:4791");
    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    // A non-zero identification, as the device numbers its IPv4 packets: the sender must
    // re-compute the ICRC for identification 0.
    let (sent, frame) = v4_frame([127, 0, 0, 1], [127, 0, 0, 2], 0x4321, &payload);
    a.send(&frame);
    let rebuilt = receive(&mut b).expect("frame at 127.0.0.2");
    let parsed = wire::parse_frame(&rebuilt).expect("the rebuilt frame parses, ICRC included");
    assert_eq!(parsed.payload, &payload[..]);
    assert_eq!(normalized(parsed.repr), normalized(sent));
    assert_eq!(parsed.repr.ethernet.destination, MAC_B);
    assert_eq!(
        parsed.repr.udp_source_port, sent.udp_source_port,
        "the flow's source port"
    );
    match parsed.repr.ip {
        IpRepr::V4(v4) => assert_eq!((v4.identification, v4.dont_fragment), (0, true)),
        IpRepr::V6(_) => panic!("IPv4 expected"),
    }
    // B has never sent to A: a stand-in source MAC.
    assert_eq!(parsed.repr.ethernet.source, UdpBackend::stand_in_mac(ip("127.0.0.1")));

    // The answer: A learned B's MAC from its own frame's destination.
    let (_, reply) = v4_frame([127, 0, 0, 2], [127, 0, 0, 1], 7, b"pong");
    let mut reply = reply;
    reply[0..6].copy_from_slice(&MAC_A);
    reply[6..12].copy_from_slice(&MAC_B);
    b.send(&reply);
    let rebuilt = receive(&mut a).expect("frame at 127.0.0.1");
    let parsed = wire::parse_frame(&rebuilt).expect("reply parses");
    assert_eq!(parsed.payload, b"pong");
    assert_eq!(parsed.repr.ethernet.source, MAC_B, "learned from A's transmission");
    assert_eq!(a.stats().frames_sent, 1);
    assert_eq!(a.stats().frames_received, 1);
    assert_eq!(b.stats().frames_received, 1);

    // An identification-0 frame is sent as the device made it (no re-computation).
    let (_, exact) = v4_frame([127, 0, 0, 1], [127, 0, 0, 2], 0, b"same");
    a.send(&exact);
    let rebuilt = receive(&mut b).expect("third frame");
    let mut expected = exact.clone();
    // Only the masked IPv4 fields (TOS, TTL, checksum) and the source MAC differ.
    for i in [6, 7, 8, 9, 10, 11, 15, 22, 24, 25] {
        expected[i] = rebuilt[i];
    }
    assert_eq!(rebuilt, expected);
}

/// `v4_frame` as a device on the in-process link emits it: the four ICRC bytes zero.
fn offloaded(frame: &[u8]) -> Vec<u8> {
    let mut frame = frame.to_vec();
    let at = frame.len() - 4;
    frame[at..].fill(0);
    frame
}

#[test]
fn a_frame_whose_icrc_the_device_left_to_the_link_leaves_with_the_icrc_its_headers_need() {
    let mut a = UdpBackend::bind(ip("127.0.0.61"), MAC_A).expect("bind 127.0.0.61:4791");
    let mut b = UdpBackend::bind(ip("127.0.0.62"), MAC_B).expect("bind 127.0.0.62:4791");
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    // Identification 0x4321 (the datagram travels with 0) and 0 (as the device made it):
    // either way the receiver's check passes, and the datagram is the one the same frame
    // with its ICRC computed by the device would have made.
    for identification in [0x4321, 0] {
        let (_, computed) = v4_frame([127, 0, 0, 61], [127, 0, 0, 62], identification, &payload);
        a.send(&computed);
        let by_the_device = receive(&mut b).expect("the frame with its ICRC");
        a.send_owned(offloaded(&computed), Icrc::Offloaded);
        let by_the_backend = receive(&mut b).expect("the frame with its ICRC left to the link");
        let parsed = wire::parse_frame(&by_the_backend).expect("the receiver's ICRC check passes");
        assert_eq!(parsed.payload, &payload[..]);
        assert_eq!(by_the_backend, by_the_device, "identification {identification:#x}");
    }
    // A frame that says its ICRC is computed is still checked: a zero ICRC is dropped.
    let (_, computed) = v4_frame([127, 0, 0, 61], [127, 0, 0, 62], 0, b"checked");
    a.send_owned(offloaded(&computed), Icrc::Computed);
    assert_eq!(a.stats().tx_dropped, 1);
    assert_eq!(a.stats().frames_sent, 4);
    assert_eq!(b.stats().frames_received, 4);
}

#[test]
fn held_back_datagrams_arrive_whole_and_in_order_however_the_kernel_is_asked_to_cut_them() {
    let mut a = UdpBackend::bind(ip("127.0.0.63"), MAC_A).expect("bind 127.0.0.63:4791");
    let mut b = UdpBackend::bind(ip("127.0.0.64"), MAC_B).expect("bind 127.0.0.64:4791");
    a.set_send_batching(true);
    // Payload lengths: more equal ones than one cut message may carry, a shorter one that
    // ends a run, a run that starts short and cannot take the longer ones after it, and
    // many small ones.
    let mut lengths = vec![4096; 17];
    lengths.extend([100, 512, 4096, 4096, 2000, 4096, 8]);
    lengths.extend([1024; 70]);
    let payloads: Vec<Vec<u8>> = lengths
        .iter()
        .enumerate()
        .map(|(n, &length)| (0..length).map(|i| (i * 31 + n * 7) as u8).collect())
        .collect();
    for (n, payload) in payloads.iter().enumerate() {
        let (_, frame) = v4_frame([127, 0, 0, 63], [127, 0, 0, 64], 0, payload);
        a.send_owned(offloaded(&frame), Icrc::Offloaded);
        if n == 40 {
            a.flush();
        }
    }
    a.flush();
    for (n, payload) in payloads.iter().enumerate() {
        let frame = receive(&mut b).unwrap_or_else(|| panic!("datagram {n} of {}", payloads.len()));
        let parsed = wire::parse_frame(&frame).unwrap_or_else(|error| panic!("datagram {n}: {error}"));
        assert_eq!(parsed.payload, &payload[..], "datagram {n}");
    }
    assert_eq!(a.stats().frames_sent, payloads.len() as u64);
    assert_eq!(a.stats().tx_errors, 0);
}

#[test]
fn ipv6_frames_are_rebuilt_exactly() {
    let local = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let mut backend = match UdpBackend::bind(local, MAC_A) {
        Ok(backend) => backend,
        Err(error) if std::env::var_os("RNIC_SKIP_IPV6").is_some() => {
            eprintln!("skipped: no IPv6 loopback ({error})");
            return;
        }
        Err(error) => panic!("cannot bind [::1]:4791 ({error}); set RNIC_SKIP_IPV6=1 without IPv6"),
    };
    let mut repr = RoceRepr::new(
        EthernetRepr {
            destination: MAC_A,
            source: MAC_B,
            vlan: None,
            ethertype: 0x86DD,
        },
        IpRepr::V6(Ipv6Repr {
            source: Ipv6Addr::LOCALHOST.octets(),
            destination: Ipv6Addr::LOCALHOST.octets(),
            traffic_class: 0x68,
            flow_label: 0xabcde,
            hop_limit: 3,
        }),
        wire::udp_source_port(0xabcde, 0, 0),
        BthRepr::new(BthOpcode::RC_SEND_ONLY, 0x33, 5),
    );
    repr.bth.solicited = true;
    let mut frame = Vec::new();
    wire::emit_frame(&repr, b"hello, ipv6", &mut frame);
    // Loopback to itself: the backend receives its own datagram.
    backend.send(&frame);
    let rebuilt = receive(&mut backend).expect("frame back on [::1]");
    let parsed = wire::parse_frame(&rebuilt).expect("ICRC good");
    assert_eq!(parsed.payload, b"hello, ipv6");
    // (PadCnt is derived on emit: compare with the sent frame as parsed.)
    assert_eq!(
        normalized(parsed.repr),
        normalized(wire::parse_frame(&frame).unwrap().repr)
    );
    assert_eq!(repr.bth.destination_qp, parsed.repr.bth.destination_qp);
    // Byte for byte but the source MAC and the masked fields (traffic class, flow label,
    // hop limit):
    // the ICRC went through unchanged.
    let mut expected = frame.clone();
    for i in [6, 7, 8, 9, 10, 11, 14, 15, 16, 17, 21] {
        expected[i] = rebuilt[i];
    }
    assert_eq!(rebuilt, expected);
}

#[test]
fn garbage_is_counted_and_dropped() {
    let mut backend = UdpBackend::bind(ip("127.0.0.3"), MAC_A).expect("bind 127.0.0.3:4791");
    let sender = UdpSocket::bind("127.0.0.3:0").unwrap();
    let mut tver = [0u8; 16];
    tver[1] = 0x01;
    let garbage: [&[u8]; 4] = [b"", b"short", &[0xff; 17], &tver];
    for datagram in garbage {
        sender.send_to(datagram, "127.0.0.3:4791").unwrap();
    }
    // A good datagram behind them still arrives.
    sender.send_to(&[0u8; 16], "127.0.0.3:4791").unwrap();
    let frame = receive(&mut backend).expect("the well-formed datagram");
    assert_eq!(frame.len(), 14 + 20 + 8 + 16);
    assert_eq!(backend.stats().rx_malformed, 4);
    assert_eq!(backend.stats().frames_received, 1);
    // Frames the device should never send: dropped, counted.
    backend.send(&[0u8; 60]);
    backend.send(&[]);
    let (_, v6_to_v4) = {
        let (repr, mut frame) = v4_frame([127, 0, 0, 3], [127, 0, 0, 4], 0, b"x");
        frame.truncate(frame.len() - 1);
        (repr, frame)
    };
    backend.send(&v6_to_v4);
    assert_eq!(backend.stats().tx_dropped, 3);
    assert_eq!(backend.stats().frames_sent, 0);
}

/// The server loop wakes up for the backend's socket (no client attached, so without the
/// wake-up it would sleep a second), gives the frame to the device and captures it.
#[test]
fn the_server_loop_receives_from_its_backend_and_captures() {
    use rnic_emu::net::NetSpec;
    use rnic_emu::vfio_user::{Server, ServerOptions};

    let dir = std::env::temp_dir();
    let socket = dir.join(format!("rnic-net-{}.sock", std::process::id()));
    let pcap = dir.join(format!("rnic-net-{}.pcap", std::process::id()));
    let mut options = ServerOptions::new(&socket);
    options.net = NetSpec::Udp(ip("127.0.0.6"));
    options.pcap = Some(pcap.clone());
    let server = Server::spawn(options).expect("server with udp:127.0.0.6");
    // Let the loop reach its idle wait.
    std::thread::sleep(Duration::from_millis(50));
    let (_, frame) = v4_frame([127, 0, 0, 7], [127, 0, 0, 6], 0, b"to the device");
    let datagram = &frame[14 + 20 + 8..];
    let sender = UdpSocket::bind("127.0.0.7:0").unwrap();
    let sent = Instant::now();
    sender.send_to(datagram, "127.0.0.6:4791").unwrap();
    let (stats, arrived) = server
        .handle()
        .wait_for(Duration::from_secs(2), |s| s.frames_received == 1);
    assert!(arrived, "{stats:?}");
    assert!(
        sent.elapsed() < Duration::from_millis(500),
        "the backend's fd must wake the loop"
    );
    assert_eq!(stats.net.frames_received, 1);
    server.stop().unwrap();
    let capture = std::fs::read(&pcap).unwrap();
    let _ = std::fs::remove_file(&pcap);
    // Header (24) + record header (16) + the rebuilt frame.
    assert_eq!(capture.len(), 24 + 16 + 14 + 20 + 8 + datagram.len());
}
