//! Two register-level NICs (testbench's `RegisterHarness`) joined by two real `udp:`
//! backends on 127.0.0.4 and 127.0.0.5: RC WRITE, READ and SEND cross the kernel's UDP
//! sockets, the devices' ICRC checks pass on every rebuilt frame (IPv4 identification
//! rule), and the data lands. The checksum offload of the in-process link stops at
//! `Device::poll_transmit`: every frame a backend gets carries its ICRC, which the `udp:`
//! backend's parse checks (`tx_dropped` stays 0).
//!
//! The devices run in virtual time paced by the wall clock, as the server loop does with
//! `--timing realtime`, so retransmission timers mean what they say.

mod net_common;

use std::net::IpAddr;
use std::time::Instant;

use net_common::{exchange, mac, Side};
use rnic_emu::net::udp::UdpBackend;
use rnic_hw_model::wire;

fn side(n: u8, qpn: u32, peer: u8, dest: u32) -> Side {
    let backend = UdpBackend::bind(IpAddr::from([127, 0, 0, n]), mac(n))
        .unwrap_or_else(|error| panic!("bind 127.0.0.{n}:4791: {error}"));
    let gid = |n: u8| wire::ipv4_to_gid([127, 0, 0, n]);
    Side::new(n, gid(n), qpn, peer, gid(peer), dest, Box::new(backend))
}

#[test]
fn rc_write_read_and_send_cross_two_udp_backends() {
    let mut a = side(4, 0x10, 5, 0x20);
    let mut b = side(5, 0x20, 4, 0x10);
    let started = Instant::now();
    exchange(&mut a, &mut b);
    let (sa, sb) = (a.backend.stats(), b.backend.stats());
    eprintln!("a: {sa:?}\nb: {sb:?}\nelapsed {:?}", started.elapsed());
    assert!(sa.frames_sent >= 64 + 1 + 3, "{sa:?}");
    assert_eq!(
        (sa.rx_malformed, sb.rx_malformed, sa.tx_dropped, sb.tx_dropped),
        (0, 0, 0, 0)
    );
    // Every rebuilt frame passed the devices' ICRC checks, and nothing was dropped.
    for side in [&a, &b] {
        let counters = side.h.device.transport_counters();
        assert_eq!((counters.icrc_errors, counters.frames_dropped), (0, 0), "{counters:?}");
    }
    assert_eq!(sa.frames_received, sb.frames_sent);
    assert_eq!(sb.frames_received, sa.frames_sent);
}
