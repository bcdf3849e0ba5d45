//! `rnic-bench --peer perftest` without rxe: the exchange over loopback TCP, each NIC an
//! embedded one on a shared in-process wire.
//!
//! * rnic-bench as client against rnic-bench as server, both speaking perftest's exchange:
//!   every program's handshake sequence from both ends, with traffic and `--verify`.
//! * A fake perftest client that is only bytes on a socket, written from perftest
//!   4.5-0.17's source (ethernet_write_keys, exchange_versions, check_sys_data,
//!   check_mtu, xchg_bw_reports, ctx_close_connection), against rnic-bench as server.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use rnic_testbench::bench::{BenchConfig, BenchReport, Operation};
use rnic_testbench::perftest::{self, Exchange, KeyMessage, PerftestConfig, PerftestError, Test, KEY_LEN_GID};
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric, FabricConfig};

fn config(test: Test, size: usize, iterations: u64, queue_pairs: usize, verify: bool) -> PerftestConfig {
    let operation = match test {
        Test::WriteBw | Test::WriteLat => Operation::Write,
        Test::ReadBw => Operation::Read,
        Test::AtomicBw => Operation::Atomic,
        Test::SendBw | Test::SendUdBw => Operation::Send,
    };
    PerftestConfig {
        bench: BenchConfig {
            operation,
            size,
            iterations,
            queue_pairs,
            mtu: 1024,
            verify,
            ..BenchConfig::default()
        },
        test,
        gid_index: 0,
        peer_mac: None,
    }
}

/// Runs rnic-bench's server and client sides of `test` against each other.
fn pair_up(server: PerftestConfig, client: PerftestConfig) -> (BenchReport, BenchReport) {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let nic_a = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
    let nic_b = fabric.add_nic([2, 0, 0, 0, 0, 0xb]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut exchange = Exchange::new(stream, false).unwrap();
        perftest::run_with_device(&server, Box::new(nic_a), None, &mut exchange)
    });
    let mut exchange = Exchange::new(TcpStream::connect(("127.0.0.1", port)).unwrap(), true).unwrap();
    let driven = perftest::run_with_device(&client, Box::new(nic_b), None, &mut exchange).unwrap();
    (served.join().unwrap().unwrap(), driven)
}

fn assert_clean(report: &BenchReport, messages: u64, what: &str) {
    assert_eq!(report.failures, Vec::<String>::new(), "{what}");
    assert_eq!(report.messages_failed, 0, "{what}");
    assert_eq!(report.messages_ok, messages, "{what}");
}

#[test]
fn every_program_pairs_with_itself_and_verifies() {
    for (test, size, iterations, queue_pairs) in [
        (Test::WriteBw, 100, 150, 2),
        (Test::WriteBw, 5000, 20, 1),
        (Test::ReadBw, 64, 100, 2),
        (Test::AtomicBw, 8, 200, 2),
        (Test::SendBw, 3000, 50, 2),
        (Test::SendUdBw, 512, 40, 1),
        (Test::WriteLat, 2, 30, 1),
    ] {
        let what = format!("{} -s {size} -n {iterations} -q {queue_pairs}", test.program());
        let (server, client) = pair_up(
            config(test, size, iterations, queue_pairs, true),
            config(test, size, iterations, queue_pairs, true),
        );
        let messages = iterations * queue_pairs as u64;
        assert_clean(&client, messages, &format!("client of {what}"));
        assert_clean(&server, messages, &format!("server of {what}"));
        match test {
            Test::WriteBw | Test::ReadBw | Test::AtomicBw | Test::WriteLat => {
                assert!(server.bytes_verified > 0, "{what}: the server checked its memory")
            }
            Test::SendBw | Test::SendUdBw => {}
        }
        if matches!(test, Test::ReadBw | Test::AtomicBw | Test::WriteLat) {
            assert!(client.bytes_verified > 0, "{what}: the client checked what it fetched");
        }
    }
}

#[test]
fn a_server_that_expected_other_iterations_says_so() {
    let (served, client) = std::thread::scope(|scope| {
        let fabric = EmbeddedFabric::new(FabricConfig::default());
        let nic_a = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
        let nic_b = fabric.add_nic([2, 0, 0, 0, 0, 0xb]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = scope.spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut exchange = Exchange::new(stream, false).unwrap();
            perftest::run_with_device(
                &config(Test::WriteBw, 64, 20, 1, false),
                Box::new(nic_a),
                None,
                &mut exchange,
            )
        });
        let mut exchange = Exchange::new(TcpStream::connect(("127.0.0.1", port)).unwrap(), true).unwrap();
        let client = perftest::run_with_device(
            &config(Test::WriteBw, 64, 10, 1, false),
            Box::new(nic_b),
            None,
            &mut exchange,
        );
        (server.join().unwrap(), client)
    });
    match served {
        Err(PerftestError::Mismatch(why)) => assert!(why.contains("10 iterations over all QPs"), "{why}"),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // The client's traffic itself went through; only the closing exchange broke.
    assert!(client.is_err());
}

/// The MAC behind the link-local GID of [`perftest_keys`].
const FAKE_CLIENT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

/// The PSN [`perftest_keys`] announces.
const FAKE_CLIENT_PSN: u32 = 0xabcd;

/// What perftest's `ethernet_write_keys` sends for a QP on a link-local GID.
fn perftest_keys(qpn: u32) -> Vec<u8> {
    let text = format!(
        "0000:0001:{qpn:06x}:{FAKE_CLIENT_PSN:06x}:00001000:00005555aaaa0000:fe:80:00:00:00:00:00:00:50:54:00:ff:fe:12:34:56:00000000:"
    );
    let mut bytes = text.into_bytes();
    assert_eq!(bytes.len(), KEY_LEN_GID - 1);
    bytes.push(0);
    bytes
}

/// A fake `ib_write_bw` client: bytes only, no RDMA; it reports `report_iters` iterations
/// (perftest reports `-n` × `-q`). Returns what the server sent.
fn fake_write_bw_client(port: u16, report_iters: u64, qps: usize) -> std::io::Result<Vec<Vec<u8>>> {
    let keys = (0..qps).map(|qp| perftest_keys(0x100 + qp as u32)).collect();
    fake_write_bw_client_with(port, 64, report_iters, keys, |_| {})
}

/// [`fake_write_bw_client`] of `size`-byte messages announcing `keys` (one message per
/// QP), which runs `traffic` with the server's keys once the QPs are connected, where
/// perftest runs its WRITEs.
fn fake_write_bw_client_with(
    port: u16,
    size: u64,
    report_iters: u64,
    keys: Vec<Vec<u8>>,
    traffic: impl FnOnce(&[KeyMessage]),
) -> std::io::Result<Vec<Vec<u8>>> {
    let qps = keys.len();
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    let mut heard = Vec::new();
    fn swap(stream: &mut TcpStream, heard: &mut Vec<Vec<u8>>, mine: &[u8], theirs: usize) -> std::io::Result<()> {
        stream.write_all(mine)?;
        let mut buffer = vec![0u8; theirs];
        stream.read_exact(&mut buffer)?;
        heard.push(buffer);
        Ok(())
    }
    swap(&mut stream, &mut heard, b"6.06\0\0\0\0\0\0\0\0\0\0\0\0", 16)?;
    swap(&mut stream, &mut heard, &4096u32.to_be_bytes(), 4)?;
    swap(&mut stream, &mut heard, &64u32.to_be_bytes(), 4)?;
    swap(&mut stream, &mut heard, b"3\0", 2)?; // IBV_MTU_1024
    for _round in 0..2 {
        for key in &keys {
            swap(&mut stream, &mut heard, key, KEY_LEN_GID)?;
        }
    }
    swap(&mut stream, &mut heard, &keys[0], KEY_LEN_GID)?; // after RTR
    let theirs: Vec<KeyMessage> = heard[4..4 + qps]
        .iter()
        .map(|k| KeyMessage::decode(k).unwrap())
        .collect();
    traffic(&theirs);
    swap(&mut stream, &mut heard, &keys[0], KEY_LEN_GID)?; // the test is over
    for field in [
        size.to_be_bytes(),
        report_iters.to_be_bytes(),
        100.0f64.to_bits().to_be_bytes(),
        100.0f64.to_bits().to_be_bytes(),
        1.5f64.to_bits().to_be_bytes(),
    ] {
        swap(&mut stream, &mut heard, &field, 8)?;
    }
    swap(&mut stream, &mut heard, &keys[0], KEY_LEN_GID)?; // ctx_close_connection
    stream.write_all(b"done\0")?;
    let mut done = [0u8; 5];
    stream.read_exact(&mut done)?;
    heard.push(done.to_vec());
    Ok(heard)
}

fn serve_one(
    config: PerftestConfig,
    client: impl FnOnce(u16) -> std::io::Result<Vec<Vec<u8>>> + Send,
) -> (Result<BenchReport, PerftestError>, std::io::Result<Vec<Vec<u8>>>) {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let nic = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|scope| {
        let fake = scope.spawn(move || client(port));
        let (stream, _) = listener.accept().unwrap();
        let mut exchange = Exchange::new(stream, false).unwrap();
        let served = perftest::run_with_device(&config, Box::new(nic), None, &mut exchange);
        drop(exchange);
        (served, fake.join().unwrap())
    })
}

#[test]
fn a_perftest_client_hears_perftests_bytes() {
    let (served, heard) = serve_one(config(Test::WriteBw, 64, 1000, 2, false), |port| {
        fake_write_bw_client(port, 2000, 2)
    });
    let report = served.unwrap();
    assert_eq!(
        report.messages_ok, 2000,
        "the client's word, unchecked without --verify"
    );
    let heard = heard.unwrap();
    assert_eq!(heard[0], b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
    assert_eq!(heard[1], [0, 0, 0x10, 0], "page size, big-endian");
    assert_eq!(heard[2], [0, 0, 0, 64], "cache line, big-endian");
    assert_eq!(heard[3], b"3\0", "our 1024 as IBV_MTU_1024");
    let keys: Vec<KeyMessage> = heard[4..10].iter().map(|k| KeyMessage::decode(k).unwrap()).collect();
    assert_eq!(keys[0], keys[2], "both rounds carry the same keys");
    assert_eq!(keys[1], keys[3]);
    assert_ne!(keys[0].qpn, keys[1].qpn);
    assert!(keys.iter().all(|k| k.out_reads == 1 && k.lid == 0 && k.psn < 1 << 24));
    let gid = keys[0].gid.unwrap();
    assert_eq!(
        &gid[..8],
        &[0xfe, 0x80, 0, 0, 0, 0, 0, 0],
        "link-local GID 0 without --ip"
    );
    assert!(heard[4].ends_with(b":\0"), "{:?}", String::from_utf8_lossy(&heard[4]));
    let report_fields = &heard[10..15];
    assert_eq!(
        report_fields[0],
        64u64.to_be_bytes(),
        "the server's report echoes the size"
    );
    assert_eq!(
        report_fields[1],
        2000u64.to_be_bytes(),
        "and -n × -q iterations, as perftest"
    );
    assert_eq!(heard.last().unwrap(), b"done\0");
}

#[test]
fn a_server_verifying_writes_that_never_came_fails_them() {
    let (served, heard) = serve_one(config(Test::WriteBw, 64, 10, 1, true), |port| {
        fake_write_bw_client(port, 10, 1)
    });
    heard.unwrap();
    let report = served.unwrap();
    assert_eq!(report.messages_ok, 0);
    assert_eq!(report.messages_failed, 10);
}

#[test]
fn garbage_from_the_peer_is_an_error_not_a_panic() {
    for garbage in [
        &b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..],
        b"4.0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        b"6.0",
    ] {
        let sent = garbage.to_vec();
        let (served, _) = serve_one(config(Test::WriteBw, 64, 10, 1, false), move |port| {
            let mut stream = TcpStream::connect(("127.0.0.1", port))?;
            stream.write_all(&sent)?;
            stream.shutdown(std::net::Shutdown::Write)?;
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
            Ok(vec![rest])
        });
        assert!(served.is_err(), "{garbage:?}");
    }
    // A good start, then keys that are not perftest's text.
    let (served, _) = serve_one(config(Test::WriteBw, 64, 10, 1, false), |port| {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        let mut sink = [0u8; 16];
        for (mine, theirs) in [
            (&b"6.06\0\0\0\0\0\0\0\0\0\0\0\0"[..], 16),
            (&4096u32.to_be_bytes()[..], 4),
            (&64u32.to_be_bytes()[..], 4),
            (&b"3\0"[..], 2),
        ] {
            stream.write_all(mine)?;
            stream.read_exact(&mut sink[..theirs])?;
        }
        stream.write_all(&[b'x'; KEY_LEN_GID])?;
        Ok(Vec::new())
    });
    assert!(matches!(served, Err(PerftestError::Message(_))), "{served:?}");
}

#[test]
fn the_command_line_serves_a_perftest_client() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = std::process::Command::new(env!("CARGO_BIN_EXE_rnic-bench"))
        .args([
            "write", "--peer", "perftest", "--server", "--device", "embedded", "--size", "64",
        ])
        .args([
            "--iters",
            "1000",
            "--qps",
            "2",
            "--mtu",
            "1024",
            "--port",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let heard = loop {
        match fake_write_bw_client(port, 2000, 2) {
            Ok(heard) => break heard,
            Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(error) => panic!("{error}"),
        }
    };
    assert_eq!(heard.last().unwrap(), b"done\0");
    let output = server.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("ib_write_bw"), "{stdout}");
}

#[test]
fn the_command_line_refuses_what_perftest_has_no_program_for() {
    for args in [&["read", "--ud"][..], &["send", "--lat"], &["mixed"]] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_rnic-bench"))
            .args(args)
            .args(["--peer", "perftest", "--server", "--device", "embedded", "--port", "1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("no perftest program"), "{args:?}: {stderr}");
    }
}

/// The fake perftest's RC QP: one SGE, every WR signalled, `max_send_wr` deep.
fn fake_rc_qp(
    pd: &rnic_verbs::ProtectionDomain,
    cq: &rnic_verbs::CompletionQueue,
    max_send_wr: u32,
) -> rnic_verbs::QueuePair {
    use rnic_verbs::{QpCapabilities, QpInitAttributes, QpType};
    pd.create_qp(&QpInitAttributes {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCapabilities {
            max_send_wr,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: true,
    })
    .unwrap()
}

/// Takes the fake's QP to RTS towards `peer`, with perftest's attributes (MTU 1024, the
/// PSN [`perftest_keys`] announces, timeout 14, 7 retries).
fn connect_fake(qp: &rnic_verbs::QueuePair, peer: &KeyMessage) {
    use rnic_verbs::{AhAttributes, Gid, Mtu, RcConnection};
    let dgid = Gid(peer.gid.unwrap());
    qp.connect_rc(&RcConnection {
        path_mtu: Mtu::from_bytes(1024).unwrap(),
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        sq_psn: FAKE_CLIENT_PSN,
        ah_attr: AhAttributes {
            dgid,
            dmac: dgid.link_local_mac().unwrap(),
            hop_limit: 64,
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        max_rd_atomic: 1,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
    })
    .unwrap();
}

/// The fake posts one signalled RDMA WRITE of `sge` to `remote_addr` under `rkey` and
/// lets virtual time pass on `nic` until it completes; returns the completion's status.
fn write_and_wait(
    qp: &rnic_verbs::QueuePair,
    cq: &rnic_verbs::CompletionQueue,
    nic: &EmbeddedDevice,
    sge: rnic_verbs::Sge,
    remote_addr: u64,
    rkey: u32,
) -> rnic_verbs::WcStatus {
    use rnic_verbs::{DeviceAccess, RdmaFields, SendFlags, SendWorkRequest, WorkCompletion, WrOpcode};
    qp.post_send(&[SendWorkRequest {
        opcode: WrOpcode::RdmaWrite,
        sg_list: std::slice::from_ref(&sge),
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields { remote_addr, rkey },
        ..SendWorkRequest::default()
    }])
    .unwrap();
    let mut completion = [WorkCompletion::default()];
    while cq.poll(&mut completion).unwrap() == 0 {
        nic.delay(1_000);
    }
    completion[0].status
}

/// Serves an `ib_write_bw` of `iters` `size`-byte messages with `--verify` to a fake
/// perftest client whose RDMA WRITEs are real but carry `written` bytes each (perftest
/// writes `size`); returns the server's report.
fn serve_writes(size: usize, iters: u64, written: u32) -> BenchReport {
    use rnic_verbs::{AccessFlags, Context, Sge, WcStatus};
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let nic = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
    let writer_nic = fabric.add_nic(FAKE_CLIENT_MAC);
    let context = Context::open(Box::new(writer_nic.clone())).unwrap();
    let pd = context.alloc_pd().unwrap();
    // perftest's buffer holds rand() bytes; these are as unlike the sentinel.
    let data: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mr = pd.register_user_memory(data, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = context.create_cq(256, None, 0).unwrap();
    let qp = fake_rc_qp(&pd, &cq, 64);
    let keys = vec![perftest_keys(qp.qp_num())];
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            fake_write_bw_client_with(port, size as u64, iters, keys, |theirs| {
                let server = theirs[0];
                connect_fake(&qp, &server);
                for k in 0..iters {
                    let offset = perftest::remote_offset(k, size as u64, 4096, 64);
                    let sge = Sge::new(mr.addr() + offset, written, mr.lkey());
                    let status = write_and_wait(&qp, &cq, &writer_nic, sge, server.vaddr + offset, server.rkey);
                    assert_eq!(status, WcStatus::Success);
                }
            })
        });
        let (stream, _) = listener.accept().unwrap();
        let mut exchange = Exchange::new(stream, false).unwrap();
        let served = perftest::run_with_device(
            &config(Test::WriteBw, size, iters, 1, true),
            Box::new(nic),
            None,
            &mut exchange,
        );
        drop(exchange);
        writer.join().unwrap().unwrap();
        served.unwrap()
    })
}

#[test]
fn a_server_verifying_writes_that_landed_short_fails_them() {
    // Every WRITE lands, at the right address, but with half its bytes: each slot differs
    // from the sentinel, yet its second half was never written.
    let report = serve_writes(64, 10, 32);
    assert_eq!(report.messages_ok, 0, "{:?}", report.failures);
    assert_eq!(report.messages_failed, 10);
    assert_eq!(report.bytes_verified, 0);
}

#[test]
fn a_server_verifying_whole_writes_counts_the_bytes_it_checked() {
    // 100-byte WRITEs go 128 bytes apart (perftest's cache-line step): 5 of them place 500
    // bytes, and that is what was checked, not the 4 KiB region around them.
    let report = serve_writes(100, 5, 100);
    assert_eq!(report.failures, Vec::<String>::new());
    assert_eq!(report.messages_ok, 5);
    assert_eq!(report.bytes_verified, 500);
    assert_eq!(report.verdict(), Ok(()));
}

/// Where rnic-bench stands in [`write_lat_with_a_peer_that_leaves`].
#[derive(Clone, Copy, PartialEq)]
enum Ours {
    Server,
    Client,
}

/// `ib_write_lat -s 2 -n ITERS` between rnic-bench and a fake perftest on its own NIC
/// whose WRITEs are real and which leaves as perftest does: its QP destroyed as soon as its
/// own loop is done, no closing handshake. The wire loses every ACK of rnic-bench's last
/// WRITE (its PSN), so rnic-bench's resends stay unanswered and that WRITE completes with
/// RETRY_EXC_ERR although it arrived. Returns rnic-bench's report.
fn write_lat_with_a_peer_that_leaves(ours: Ours, iters: u64) -> BenchReport {
    use rnic_hw_model::wire::{bth, ethernet, ipv6, udp};
    use rnic_verbs::{AccessFlags, Context, DeviceAccess, Sge, WcStatus};
    const SIZE: u64 = 2;
    // The fake's buffer: it WRITEs from offset 0; rnic-bench WRITEs to `INBOX`.
    const INBOX: u64 = 4096;
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let nic = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
    let peer_nic = fabric.add_nic(FAKE_CLIENT_MAC);
    let peer = peer_nic.device_id();
    let context = Context::open(Box::new(peer_nic.clone())).unwrap();
    let pd = context.alloc_pd().unwrap();
    let mr = pd
        .register_user_memory(vec![0u8; 8192], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let cq = context.create_cq(16, None, 0).unwrap();
    let qp = fake_rc_qp(&pd, &cq, 4);
    let mine = KeyMessage {
        lid: 0,
        out_reads: 1,
        qpn: qp.qp_num(),
        psn: FAKE_CLIENT_PSN,
        rkey: mr.rkey(),
        vaddr: mr.addr() + INBOX,
        gid: Some(KeyMessage::decode(&perftest_keys(0)).unwrap().gid.unwrap()),
        srqn: 0,
    }
    .encode();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    // perftest's side: the exchange (versions, page size, cache line, MTU, then Sync,
    // Round, connect, Round, Sync), the ping-pong, and away.
    let fake = |mut stream: TcpStream| {
        let mut swap = |mine: &[u8], theirs: usize| {
            stream.write_all(mine).unwrap();
            let mut buffer = vec![0u8; theirs];
            stream.read_exact(&mut buffer).unwrap();
            buffer
        };
        swap(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0", 16);
        swap(&4096u32.to_be_bytes(), 4);
        swap(&64u32.to_be_bytes(), 4);
        swap(b"3\0", 2); // IBV_MTU_1024
        swap(&mine, KEY_LEN_GID);
        let theirs = KeyMessage::decode(&swap(&mine, KEY_LEN_GID)).unwrap();
        connect_fake(&qp, &theirs);
        swap(&mine, KEY_LEN_GID);
        swap(&mine, KEY_LEN_GID);
        // Every ACK of rnic-bench's last WRITE, first and resent, is lost on the wire.
        let last_psn = (theirs.psn + iters as u32 - 1) & 0xff_ffff;
        fabric.with_fabric(|wire| {
            wire.set_drop_rule(Some(Box::new(move |from, frame| {
                let Ok(ethernet) = ethernet::Packet::new_checked(frame) else {
                    return false;
                };
                let Ok(ip) = ipv6::Packet::new_checked(ethernet.payload()) else {
                    return false;
                };
                let Ok(udp) = udp::Packet::new_checked(ip.payload()) else {
                    return false;
                };
                let Ok(bth) = bth::Packet::new_checked(udp.payload()) else {
                    return false;
                };
                from == peer && bth.opcode().is_ack() && bth.psn() == last_psn
            })));
        });
        let arrived = |n: u64| {
            let mut last = [0u8; 1];
            loop {
                mr.read(INBOX + SIZE - 1, &mut last).unwrap();
                if last[0] == n as u8 {
                    return;
                }
                peer_nic.delay(1_000);
            }
        };
        for n in 1..=iters {
            // perftest's server WRITEs first; each side then waits for the other's.
            if ours == Ours::Server {
                arrived(n);
            }
            mr.write(SIZE - 1, &[n as u8]).unwrap();
            let sge = Sge::new(mr.addr(), SIZE as u32, mr.lkey());
            let status = write_and_wait(&qp, &cq, &peer_nic, sge, theirs.vaddr, theirs.rkey);
            assert_eq!(status, WcStatus::Success, "the fake's WRITE {n}");
            if ours == Ours::Client {
                arrived(n);
            }
        }
        // Done: perftest destroys its QP and exits, closing the socket.
        drop(qp);
        drop(stream);
    };

    let config = config(Test::WriteLat, SIZE as usize, iters, 1, true);
    std::thread::scope(|scope| match ours {
        Ours::Server => {
            scope.spawn(move || fake(TcpStream::connect(("127.0.0.1", port)).unwrap()));
            let (stream, _) = listener.accept().unwrap();
            let mut exchange = Exchange::new(stream, false).unwrap();
            perftest::run_with_device(&config, Box::new(nic), None, &mut exchange).unwrap()
        }
        Ours::Client => {
            scope.spawn(move || fake(listener.accept().unwrap().0));
            let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let mut exchange = Exchange::new(stream, true).unwrap();
            perftest::run_with_device(&config, Box::new(nic), None, &mut exchange).unwrap()
        }
    })
}

#[test]
fn a_server_whose_last_write_lost_its_ack_counts_it_ok_when_the_client_answered_it() {
    let report = write_lat_with_a_peer_that_leaves(Ours::Server, 20);
    assert_eq!(report.failures, Vec::<String>::new());
    assert_eq!(
        (report.messages_ok, report.messages_failed, report.messages_unconfirmed),
        (20, 0, 0)
    );
    assert_eq!(report.verdict(), Ok(()));
    assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
    assert!(
        report.notes[0].starts_with("write 20: RetryExcErr, but the client had answered it"),
        "{:?}",
        report.notes
    );
}

#[test]
fn a_client_whose_last_write_lost_its_ack_leaves_it_to_the_peer_to_confirm() {
    let report = write_lat_with_a_peer_that_leaves(Ours::Client, 20);
    assert_eq!(
        (report.messages_ok, report.messages_failed, report.messages_unconfirmed),
        (19, 0, 1)
    );
    assert!(report.awaits_peer_confirmation());
    assert!(report.verdict().is_err());
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert!(
        report.failures[0].starts_with("write 20: RetryExcErr, the peer gone"),
        "{:?}",
        report.failures
    );
}
