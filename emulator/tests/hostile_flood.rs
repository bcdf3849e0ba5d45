//! Acceptance of bounded diagnostics (docs/guides/emulator.md, "Diagnostics"): two
//! in-process emulators on `udp:127.0.0.10` and `udp:127.0.0.11` with a live RC
//! connection, and 20 000 hostile datagrams at the first while the connection carries
//! traffic: garbage, bad ICRCs, and well-formed RoCEv2 that no correct device may accept
//! (unknown QPs, PSNs far outside the window, the wrong service, a P_Key not the port's,
//! ACKs for nothing), half from a stranger (`127.0.0.12`) and half spoofing the peer's
//! address (`127.0.0.11`, another port), which gets past the source check to the
//! transport's deeper ones.
//!
//! The log must stay within the documented bound — at most 11 lines per diagnostics kind,
//! one totals line per 10 s and a summary per server — while every hostile datagram is
//! counted, and the connection must still move and verify its traffic afterwards.
//! (Before the limiter, each refused frame was one warning line: about 10 000 here.)

mod common;

use std::io::Write;
use std::net::{IpAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::socket_path;
use common::verbs::{connect, pattern, rc_qp, ALL_ACCESS};
use rnic_emu::net::NetSpec;
use rnic_emu::vfio_user::{Server, ServerOptions, ServerThread, DIAGNOSTICS_PERIOD};
use rnic_hw_model::wire::{
    self, AethRepr, BthOpcode, BthRepr, DethRepr, EthernetRepr, IpRepr, Ipv4Repr, RethRepr, RoceRepr,
};
use rnic_verbs::backend::VfioUserDevice;
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{
    CompletionQueue, Context, MemoryRegion, QueuePair, RdmaFields, SendFlags, SendWorkRequest, Sge, WcStatus,
    WorkCompletion, WrOpcode,
};

/// Hostile datagrams sent.
const HOSTILE: u32 = 20_000;

/// Every log line of this process (the servers run on threads of it).
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn mac(n: u8) -> [u8; 6] {
    [0x02, 0x52, 0x4e, 0x49, 0x43, n]
}

fn node(n: u8) -> (ServerThread, Context) {
    let mut options = ServerOptions::new(socket_path(&format!("flood{n}")));
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

fn poll_one(cq: &CompletionQueue) -> WorkCompletion {
    let mut out = [WorkCompletion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(20);
    while cq.poll(&mut out).expect("poll") == 0 {
        assert!(Instant::now() < deadline, "no completion within 20 s");
        std::thread::sleep(Duration::from_micros(50));
    }
    out[0]
}

/// One RDMA WRITE from `mr_a` into `mr_b` and a READ back, both verified; `round` varies
/// the data.
#[allow(clippy::too_many_arguments)]
fn write_and_read_back(qp: &QueuePair, cq: &CompletionQueue, mr_a: &MemoryRegion, mr_b: &MemoryRegion, round: u8) {
    let data = pattern(round, 8192);
    mr_a.write(0, &data).unwrap();
    let sge = [Sge::new(mr_a.addr(), data.len() as u32, mr_a.lkey())];
    qp.post_send(&[SendWorkRequest {
        wr_id: u64::from(round) * 2,
        opcode: WrOpcode::RdmaWrite,
        sg_list: &sge,
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields {
            remote_addr: mr_b.addr() + 0x4000,
            rkey: mr_b.rkey(),
        },
        ..SendWorkRequest::default()
    }])
    .unwrap();
    let wc = poll_one(cq);
    assert_eq!(
        (wc.wr_id, wc.status),
        (u64::from(round) * 2, WcStatus::Success),
        "WRITE {round}"
    );
    let mut landed = vec![0u8; data.len()];
    mr_b.read(0x4000, &mut landed).unwrap();
    assert!(landed == data, "WRITE {round}: data at B");
    let sge = [Sge::new(mr_a.addr() + 0x8000, data.len() as u32, mr_a.lkey())];
    qp.post_send(&[SendWorkRequest {
        wr_id: u64::from(round) * 2 + 1,
        opcode: WrOpcode::RdmaRead,
        sg_list: &sge,
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields {
            remote_addr: mr_b.addr() + 0x4000,
            rkey: mr_b.rkey(),
        },
        ..SendWorkRequest::default()
    }])
    .unwrap();
    let wc = poll_one(cq);
    assert_eq!(
        (wc.wr_id, wc.status),
        (u64::from(round) * 2 + 1, WcStatus::Success),
        "READ {round}"
    );
    let mut fetched = vec![0u8; data.len()];
    mr_a.read(0x8000, &mut fetched).unwrap();
    assert!(fetched == data, "READ {round}: data back at A");
}

/// Hostile datagram `i` for the emulator on 127.0.0.10, whose live QP is `qpn`, from the
/// socket on 127.0.0.`source` port `port`. The ICRC is computed the way the `udp:` backend
/// rebuilds the headers (identification 0, DF), so the well-formed ones reach the
/// transport, which must refuse them.
fn hostile(i: u32, qpn: u32, source: u8, port: u16, rng: &mut u64) -> Vec<u8> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let kind = i % 8;
    if kind == 0 {
        // Garbage of any length.
        let length = (next() % 120) as usize;
        return (0..length).map(|_| next() as u8).collect();
    }
    // PSNs 2^22 ahead of anything the live connection uses: out of sequence, never in
    // the window.
    let far_psn = 0x40_0000 + (i & 0xFFFF);
    let (opcode, destination_qp) = match kind {
        2 => (BthOpcode::RC_RDMA_WRITE_ONLY, 0x3F_FF00 + (i & 0xF)),
        4 => (BthOpcode::RC_ACKNOWLEDGE, qpn),
        5 => (BthOpcode::UD_SEND_ONLY, qpn),
        6 => (BthOpcode::RC_RDMA_READ_REQUEST, qpn),
        _ => (BthOpcode::RC_RDMA_WRITE_ONLY, qpn),
    };
    let mut repr = RoceRepr::new(
        EthernetRepr {
            destination: mac(10),
            source: mac(source),
            vlan: None,
            ethertype: 0x0800,
        },
        IpRepr::V4(Ipv4Repr {
            source: [127, 0, 0, source],
            destination: [127, 0, 0, 10],
            dscp: 0,
            ecn: 0,
            ttl: 64,
            identification: 0,
            dont_fragment: true,
        }),
        port,
        BthRepr::new(opcode, destination_qp, far_psn),
    );
    let mut payload = vec![0xEE; 64];
    match kind {
        4 => {
            repr.aeth = Some(AethRepr { syndrome: 0, msn: i });
            payload.clear();
        }
        5 => {
            repr.deth = Some(DethRepr {
                qkey: 0x1111_1111,
                source_qp: 7,
            });
        }
        6 => {
            repr.reth = Some(RethRepr {
                virtual_address: next(),
                rkey: next() as u32,
                dma_length: 1 << 30,
            });
            payload.clear();
        }
        _ => {
            repr.reth = Some(RethRepr {
                virtual_address: next(),
                rkey: next() as u32,
                dma_length: payload.len() as u32,
            });
        }
    }
    if kind == 7 {
        repr.bth.partition_key = 0x7FFF; // not the port's P_Key
    }
    let mut frame = Vec::new();
    wire::emit_frame(&repr, &payload, &mut frame);
    if kind == 1 {
        let last = frame.len() - 1;
        frame[last] ^= 0x5A; // a bad ICRC
    }
    // The UDP payload: BTH onwards.
    frame.split_off(14 + 20 + 8)
}

#[test]
fn twenty_thousand_hostile_datagrams_leave_a_bounded_log_and_a_working_connection() {
    let log = LogBuffer::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let started = Instant::now();

    let (server_a, a) = node(10);
    let (server_b, b) = node(11);
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mr_a = pd_a.register_provider_memory(64 << 10, ALL_ACCESS).unwrap();
    let mr_b = pd_b.register_provider_memory(64 << 10, ALL_ACCESS).unwrap();
    let (cq_a, cq_b) = (a.create_cq(64, None, 0).unwrap(), b.create_cq(64, None, 0).unwrap());
    let (qp_a, qp_b) = (rc_qp(&pd_a, &cq_a), rc_qp(&pd_b, &cq_b));
    connect(&qp_a, &b, qp_b.qp_num());
    connect(&qp_b, &a, qp_a.qp_num());
    write_and_read_back(&qp_a, &cq_a, &mr_a, &mr_b, 1);
    let before = server_a.handle().stats();

    // The flood, from another thread while the connection keeps working.
    let qpn = qp_a.qp_num();
    let flooder = std::thread::spawn(move || {
        let sockets: Vec<(u8, UdpSocket)> = [12, 11]
            .into_iter()
            .map(|n| {
                (
                    n,
                    UdpSocket::bind(format!("127.0.0.{n}:0")).expect("bind a flood socket"),
                )
            })
            .collect();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..HOSTILE {
            let (source, socket) = &sockets[(i / 8 % 2) as usize];
            let port = socket.local_addr().unwrap().port();
            let datagram = hostile(i, qpn, *source, port, &mut rng);
            socket
                .send_to(&datagram, "127.0.0.10:4791")
                .expect("send a hostile datagram");
            // Bursts of 500: a flood, without overrunning the kernel's socket buffer.
            if i % 500 == 499 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    let mut round = 2;
    while !flooder.is_finished() {
        write_and_read_back(&qp_a, &cq_a, &mr_a, &mr_b, round);
        round = round.wrapping_add(1).max(2);
    }
    flooder.join().unwrap();
    // Let A take in what is still queued, then prove the connection both ways.
    let drained = server_a.handle().wait_for(Duration::from_secs(20), |s| {
        let taken =
            (s.net.frames_received + s.net.rx_malformed) - (before.net.frames_received + before.net.rx_malformed);
        taken >= u64::from(HOSTILE) * 99 / 100
    });
    for extra in 0..20 {
        write_and_read_back(&qp_a, &cq_a, &mr_a, &mr_b, 200u8.wrapping_add(extra));
        write_and_read_back(&qp_b, &cq_b, &mr_b, &mr_a, 100u8.wrapping_add(extra));
    }
    let stats = server_a.handle().stats();
    let kinds_b = server_b.handle().stats().diagnostic_counts.len();
    drop((qp_a, qp_b, cq_a, cq_b, mr_a, mr_b, pd_a, pd_b, a, b));
    server_a.stop().unwrap();
    server_b.stop().unwrap();
    let elapsed = started.elapsed();

    // Every hostile datagram was counted, though few were logged: the garbage by the
    // backend, the frames the transport refused as drops (each a diagnostic), and the
    // out-of-sequence ones as sequence errors (answered with one NAK to the peer, as a
    // responder does on a lossy link; not a diagnostic).
    assert!(drained.1, "A took in too few datagrams: {:?}", drained.0.net);
    let malformed = stats.net.rx_malformed - before.net.rx_malformed;
    let diagnosed = stats.diagnostics - before.diagnostics;
    let dropped = stats.transport.frames_dropped - before.transport.frames_dropped;
    let out_of_sequence = stats.transport.out_of_sequence - before.transport.out_of_sequence;
    eprintln!(
        "A: {malformed} malformed datagrams, {dropped} frames dropped ({diagnosed} diagnostics), \
         {out_of_sequence} out of sequence; by kind {:?}",
        stats.diagnostic_counts
    );
    assert!(
        diagnosed >= dropped,
        "every drop is a diagnostic: {diagnosed} < {dropped}"
    );
    let accounted = malformed + dropped + out_of_sequence;
    assert!(
        accounted >= u64::from(HOSTILE) * 99 / 100,
        "{accounted} of {HOSTILE} counted"
    );
    assert!(
        dropped >= u64::from(HOSTILE) / 2,
        "the flood reached the transport: {dropped}"
    );

    // The log: within the documented bound.
    let text = log.text();
    let lines: Vec<&str> = text.lines().collect();
    let diag_lines = lines.iter().filter(|l| l.contains("rnic::diag")).count();
    let kinds = stats.diagnostic_counts.len() + kinds_b;
    let periods = (elapsed.as_secs() / DIAGNOSTICS_PERIOD.as_secs() + 1) as usize;
    let bound = 11 * kinds + 2 * periods + 2;
    eprintln!(
        "{} log lines, {diag_lines} under rnic::diag (bound {bound}: {kinds} kinds, {periods} periods) in {elapsed:?}",
        lines.len()
    );
    assert!(kinds <= 30, "{kinds} diagnostics kinds: {:?}", stats.diagnostic_counts);
    assert!(
        diag_lines <= bound,
        "{diag_lines} rnic::diag lines, bound {bound}:\n{text}"
    );
    // Everything else is a fixed number of start, attach and stop lines.
    assert!(lines.len() <= bound + 40, "{} log lines:\n{text}", lines.len());
    assert!(
        text.contains("further ones are counted"),
        "the flood made kinds quiet:\n{text}"
    );
    assert!(text.contains("summary: "), "a summary line at stop:\n{text}");
}
