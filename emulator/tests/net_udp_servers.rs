//! Two in-process vfio-user servers, each with a `udp:` backend (127.0.0.8 and
//! 127.0.0.9), each driven by rnic-verbs over vfio-user (`VfioUserDevice` +
//! `Context::open_with_config`, IPv4 GID 0 = the backend's address): RC WRITE, READ and
//! SEND between the two emulators through the kernel's UDP sockets, every byte checked;
//! and (127.0.0.21 and .22) a burst of 64 KiB WRITEs that must lose and retransmit
//! nothing.

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::socket_path;
use common::verbs::{connect, pattern, rc_qp, ALL_ACCESS};
use rnic_emu::net::NetSpec;
use rnic_emu::vfio_user::{Server, ServerOptions, ServerThread};
use rnic_verbs::backend::VfioUserDevice;
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{
    CompletionQueue, Context, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

fn mac(n: u8) -> [u8; 6] {
    [0x02, 0x52, 0x4e, 0x49, 0x43, n]
}

/// A server for NIC `n` with `udp:127.0.0.n`, and a context on it whose GID 0 is
/// `::ffff:127.0.0.n`.
fn node(n: u8) -> (ServerThread, Context) {
    let mut options = ServerOptions::new(socket_path(&format!("udp{n}")));
    options.device.mac_address = mac(n);
    options.net = NetSpec::Udp(IpAddr::from([127, 0, 0, n]));
    let server = Server::spawn(options).unwrap_or_else(|error| panic!("server on 127.0.0.{n}: {error}"));
    let device = VfioUserDevice::connect(server.handle().socket()).expect("connect");
    let config = DriverConfig {
        mac_address: Some(mac(n)),
        ipv4_address: Some([127, 0, 0, n]),
        ..DriverConfig::default()
    };
    let context = Context::open_with_config(Box::new(device), &config).expect("bring-up over vfio-user");
    (server, context)
}

/// Polls `cq` for one completion (at most ten seconds).
fn poll_one(cq: &CompletionQueue) -> WorkCompletion {
    let mut out = [WorkCompletion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(10);
    while cq.poll(&mut out).expect("poll") == 0 {
        assert!(Instant::now() < deadline, "no completion within 10 s");
        std::thread::sleep(Duration::from_micros(50));
    }
    out[0]
}

fn send_wr(wr_id: u64, opcode: WrOpcode, sges: &[Sge]) -> SendWorkRequest<'_> {
    SendWorkRequest {
        wr_id,
        opcode,
        sg_list: sges,
        send_flags: SendFlags::SIGNALED,
        ..SendWorkRequest::default()
    }
}

#[test]
fn rc_write_read_and_send_between_two_emulators_over_udp() {
    let (server_a, a) = node(8);
    let (server_b, b) = node(9);
    assert!(a.query_gid(1, 0).unwrap().is_ipv4_mapped());
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mr_a = pd_a.register_provider_memory(256 << 10, ALL_ACCESS).unwrap();
    let mr_b = pd_b.register_provider_memory(256 << 10, ALL_ACCESS).unwrap();
    let (cq_a, cq_b) = (a.create_cq(64, None, 0).unwrap(), b.create_cq(64, None, 0).unwrap());
    let (qp_a, qp_b) = (rc_qp(&pd_a, &cq_a), rc_qp(&pd_b, &cq_b));
    connect(&qp_a, &b, qp_b.qp_num());
    connect(&qp_b, &a, qp_a.qp_num());

    // WRITE 64 KiB from A into B.
    let data = pattern(3, 65536);
    mr_a.write(0, &data).unwrap();
    let sge = [Sge::new(mr_a.addr(), data.len() as u32, mr_a.lkey())];
    let mut write = send_wr(1, WrOpcode::RdmaWrite, &sge);
    write.rdma = RdmaFields {
        remote_addr: mr_b.addr() + 0x1000,
        rkey: mr_b.rkey(),
    };
    qp_a.post_send(&[write]).unwrap();
    let wc = poll_one(&cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut landed = vec![0u8; data.len()];
    mr_b.read(0x1000, &mut landed).unwrap();
    assert!(landed == data, "WRITE data at B");

    // READ 20000 bytes of B back into A.
    let remote = pattern(9, 20000);
    mr_b.write(0x20000, &remote).unwrap();
    let sge = [Sge::new(mr_a.addr() + 0x20000, 20000, mr_a.lkey())];
    let mut read = send_wr(2, WrOpcode::RdmaRead, &sge);
    read.rdma = RdmaFields {
        remote_addr: mr_b.addr() + 0x20000,
        rkey: mr_b.rkey(),
    };
    qp_a.post_send(&[read]).unwrap();
    let wc = poll_one(&cq_a);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut fetched = vec![0u8; 20000];
    mr_a.read(0x20000, &mut fetched).unwrap();
    assert!(fetched == remote, "READ data at A");

    // SEND 3000 bytes from A into a receive at B.
    let message = pattern(77, 3000);
    mr_a.write(0x30000, &message).unwrap();
    let recv_sge = [Sge::new(mr_b.addr() + 0x30000, 4096, mr_b.lkey())];
    qp_b.post_recv(&[RecvWorkRequest {
        wr_id: 10,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let sge = [Sge::new(mr_a.addr() + 0x30000, 3000, mr_a.lkey())];
    qp_a.post_send(&[send_wr(3, WrOpcode::Send, &sge)]).unwrap();
    let wc = poll_one(&cq_a);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
    let wc = poll_one(&cq_b);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (10, WcStatus::Success, 3000));
    let mut received = vec![0u8; 3000];
    mr_b.read(0x30000, &mut received).unwrap();
    assert!(received == message, "SEND data at B");

    let (stats_a, stats_b) = (server_a.handle().stats(), server_b.handle().stats());
    eprintln!("A net: {:?}\nB net: {:?}", stats_a.net, stats_b.net);
    assert!(stats_a.net.frames_sent >= 68, "{:?}", stats_a.net);
    assert_eq!(stats_a.net.rx_malformed + stats_b.net.rx_malformed, 0);
    drop((qp_a, qp_b, cq_a, cq_b, mr_a, mr_b, pd_a, pd_b, a, b));
    server_a.stop().unwrap();
    server_b.stop().unwrap();
}

/// RoCE expects a lossless link, and loopback is one: a clean run between two emulators
/// must lose nothing to the host's own socket buffers. 128 RC WRITEs of 64 KiB at MTU 1024
/// (8192 packets), posted 16 at a time with one doorbell, so the sender emits each window
/// of 1 MiB as one burst: the backend's sized buffers and batches must carry every burst
/// whole. Counters, not timings: no packet the responder found missing (sequence errors,
/// NAKs), none the requester sent twice, no datagram the backend gave up or saw malformed.
/// The ACK timeout is ≈ 4 s (`timeout` 20), so a slow machine cannot fake a loss.
#[test]
fn a_clean_loopback_run_retransmits_nothing() {
    let (server_a, a) = node(21);
    let (server_b, b) = node(22);
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    const SIZE: usize = 64 << 10;
    const WINDOW: usize = 16;
    let mr_a = pd_a.register_provider_memory(WINDOW * SIZE, ALL_ACCESS).unwrap();
    let mr_b = pd_b.register_provider_memory(WINDOW * SIZE, ALL_ACCESS).unwrap();
    let (cq_a, cq_b) = (a.create_cq(64, None, 0).unwrap(), b.create_cq(64, None, 0).unwrap());
    let (qp_a, qp_b) = (rc_qp(&pd_a, &cq_a), rc_qp(&pd_b, &cq_b));
    let long_timeout = |qp: &rnic_verbs::QueuePair, remote: &Context, remote_qpn: u32| {
        qp.connect_rc(&rnic_verbs::RcConnection {
            path_mtu: rnic_verbs::Mtu::Mtu1024,
            dest_qp_num: remote_qpn,
            rq_psn: 0,
            sq_psn: 0,
            ah_attr: rnic_verbs::AhAttributes {
                dgid: remote.query_gid(1, 0).unwrap(),
                sgid_index: 0,
                hop_limit: 64,
                dmac: remote.mac_address(),
                ..rnic_verbs::AhAttributes::default()
            },
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
        })
        .expect("RESET → INIT → RTR → RTS");
    };
    long_timeout(&qp_a, &b, qp_b.qp_num());
    long_timeout(&qp_b, &a, qp_a.qp_num());
    for slot in 0..WINDOW {
        mr_a.write((slot * SIZE) as u64, &pattern(slot as u8, SIZE)).unwrap();
    }
    let sges: Vec<[Sge; 1]> = (0..WINDOW)
        .map(|slot| [Sge::new(mr_a.addr() + (slot * SIZE) as u64, SIZE as u32, mr_a.lkey())])
        .collect();
    for round in 0..8u64 {
        let writes: Vec<SendWorkRequest<'_>> = (0..WINDOW)
            .map(|slot| {
                let mut write = send_wr(round * WINDOW as u64 + slot as u64, WrOpcode::RdmaWrite, &sges[slot]);
                write.rdma = RdmaFields {
                    remote_addr: mr_b.addr() + (slot * SIZE) as u64,
                    rkey: mr_b.rkey(),
                };
                write
            })
            .collect();
        qp_a.post_send(&writes).unwrap();
        for slot in 0..WINDOW {
            let wc = poll_one(&cq_a);
            assert_eq!(
                (wc.wr_id, wc.status),
                (round * WINDOW as u64 + slot as u64, WcStatus::Success)
            );
        }
    }
    let mut landed = vec![0u8; SIZE];
    for slot in 0..WINDOW {
        mr_b.read((slot * SIZE) as u64, &mut landed).unwrap();
        assert!(landed == pattern(slot as u8, SIZE), "slot {slot} at B");
    }

    let (a_stats, b_stats) = (server_a.handle().stats(), server_b.handle().stats());
    eprintln!(
        "A: {:?}\n   {:?}\nB: {:?}\n   {:?}",
        a_stats.net, a_stats.transport, b_stats.net, b_stats.transport
    );
    assert!(a_stats.net.frames_sent >= 8192, "{:?}", a_stats.net);
    for (side, stats) in [("A", &a_stats), ("B", &b_stats)] {
        let (net, transport) = (&stats.net, &stats.transport);
        assert_eq!(
            (net.tx_errors, net.rx_errors, net.rx_malformed),
            (0, 0, 0),
            "{side}: {net:?}"
        );
        assert_eq!(
            (transport.out_of_sequence, transport.naks_sent, transport.naks_received),
            (0, 0, 0),
            "{side}: a packet went missing: {transport:?}"
        );
        assert_eq!(
            (
                transport.retransmitted_packets,
                transport.ack_timeouts,
                transport.duplicate_requests
            ),
            (0, 0, 0),
            "{side}: {transport:?}"
        );
    }
    drop((qp_a, qp_b, cq_a, cq_b, mr_a, mr_b, pd_a, pd_b, a, b));
    server_a.stop().unwrap();
    server_b.stop().unwrap();
}
