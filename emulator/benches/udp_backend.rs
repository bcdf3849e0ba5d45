//! Packets per second of the `udp:` backend versus a plain UDP sender of the same
//! datagram size, side by side on this machine (issue: goal ≥ 0.8×). A benchmark, not a
//! test:
//!
//! ```text
//! cargo bench -p rnic-emu --bench udp_backend
//! ```
//!
//! Each round sends `COUNT` datagrams from 127.0.0.21 to 127.0.0.22:4791 while a thread
//! drains the receiving socket; it reports the sender's rate. Variants: a plain
//! `UdpSocket::send_to` of the datagram; the backend with an IPv4 frame of identification
//! 0 (sent as is); the backend with a non-zero identification (ICRC re-computed); and the
//! receive side, backend `receive` (rebuilding the frame) versus plain `recv_from`.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rnic_emu::net::udp::UdpBackend;
use rnic_emu::net::NetBackend;
use rnic_hw_model::wire::{self, BthOpcode, BthRepr, EthernetRepr, IpRepr, Ipv4Repr, RethRepr, RoceRepr};

const COUNT: usize = 200_000;
const PAYLOAD: usize = 1024;

fn frame(identification: u16) -> Vec<u8> {
    let mut repr = RoceRepr::new(
        EthernetRepr {
            destination: [2, 0, 0, 0, 0, 22],
            source: [2, 0, 0, 0, 0, 21],
            vlan: None,
            ethertype: 0x0800,
        },
        IpRepr::V4(Ipv4Repr {
            source: [127, 0, 0, 21],
            destination: [127, 0, 0, 22],
            dscp: 0,
            ecn: 0,
            ttl: 64,
            identification,
            dont_fragment: true,
        }),
        wire::udp_source_port(0, 0x11, 0x22),
        BthRepr::new(BthOpcode::RC_RDMA_WRITE_ONLY, 0x22, 0),
    );
    repr.reth = Some(RethRepr {
        virtual_address: 0,
        rkey: 1,
        dma_length: PAYLOAD as u32,
    });
    let mut out = Vec::new();
    wire::emit_frame(&repr, &[0x5a; PAYLOAD], &mut out);
    out
}

fn rate(label: &str, count: usize, started: Instant) -> f64 {
    let pps = count as f64 / started.elapsed().as_secs_f64();
    println!("{label:<48} {:>10.0} packets/s", pps);
    pps
}

fn main() {
    let receiver = UdpBackend::bind([127, 0, 0, 22].into(), [2, 0, 0, 0, 0, 22]).expect("bind 127.0.0.22:4791");
    let stop = Arc::new(AtomicBool::new(false));
    // Drain the receiving socket on another thread, as a peer emulator would.
    let drain = {
        let stop = stop.clone();
        let mut receiver = receiver;
        std::thread::spawn(move || {
            let mut frame = Vec::new();
            let mut received = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if receiver.receive(&mut frame) {
                    received += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            received
        })
    };
    let exact = frame(0);
    let numbered = frame(0x1234);
    let datagram = exact[14 + 20 + 8..].to_vec();
    println!(
        "datagram: {} bytes (RDMA WRITE ONLY, {PAYLOAD} bytes of payload)",
        datagram.len()
    );

    let plain = UdpSocket::bind("127.0.0.21:0").unwrap();
    let mut backend = UdpBackend::bind([127, 0, 0, 21].into(), [2, 0, 0, 0, 0, 21]).expect("bind 127.0.0.21:4791");
    for round in 0..3 {
        println!("round {round}");
        let started = Instant::now();
        for _ in 0..COUNT {
            let _ = plain.send_to(&datagram, "127.0.0.22:4791");
        }
        let base = rate("plain UdpSocket::send_to", COUNT, started);
        let started = Instant::now();
        for _ in 0..COUNT {
            backend.send(&exact);
        }
        let same = rate("udp backend send, identification 0", COUNT, started);
        let started = Instant::now();
        for _ in 0..COUNT {
            backend.send(&numbered);
        }
        let recomputed = rate("udp backend send, identification != 0 (new ICRC)", COUNT, started);
        println!(
            "ratio vs plain: {:.2} (as is), {:.2} (ICRC re-computed)",
            same / base,
            recomputed / base
        );
    }
    stop.store(true, Ordering::Relaxed);
    let received = drain.join().unwrap();
    println!("the draining backend rebuilt {received} frames");
}
