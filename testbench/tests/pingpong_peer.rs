//! `rnic-bench send --peer pingpong` without rxe: ibv_rc_pingpong's exchange over loopback
//! TCP, byte for byte as rdma-core 44's rc_pingpong.c, and a full ping-pong between
//! rnic-bench's client and server roles on embedded NICs sharing one in-process wire.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use rnic_testbench::bench::{BenchConfig, Operation};
use rnic_testbench::pingpong::{self, Address, PingpongConfig, PingpongError, MESSAGE_LEN};
use rnic_verbs::backend::{EmbeddedFabric, FabricConfig};

fn config(size: usize, iterations: u64, verify: bool) -> PingpongConfig {
    PingpongConfig {
        bench: BenchConfig {
            operation: Operation::Send,
            size,
            iterations,
            queue_pairs: 1,
            mtu: 1024,
            verify,
            ..BenchConfig::default()
        },
        gid_index: 0,
        peer_mac: None,
    }
}

fn loopback() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    (listener.accept().unwrap().0, client)
}

#[test]
fn client_and_server_ping_pong_with_validation() {
    for (size, iterations) in [(4096, 50), (10_000, 20), (1, 5)] {
        let fabric = EmbeddedFabric::new(FabricConfig::default());
        let nic_a = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
        let nic_b = fabric.add_nic([2, 0, 0, 0, 0, 0xb]);
        let (server_end, client_end) = loopback();
        let server = std::thread::spawn(move || {
            pingpong::run_with_device(&config(size, iterations, true), Box::new(nic_a), server_end, false)
        });
        let client =
            pingpong::run_with_device(&config(size, iterations, true), Box::new(nic_b), client_end, true).unwrap();
        let server = server.join().unwrap().unwrap();
        for (side, report) in [("client", &client), ("server", &server)] {
            assert_eq!(report.failures, Vec::<String>::new(), "{side} {size}");
            assert_eq!(report.messages_ok, iterations, "{side} {size}");
            assert_eq!(report.bytes_verified, iterations * size as u64, "{side} {size}");
        }
    }
}

#[test]
fn a_verifying_server_fails_messages_sent_without_validation() {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let nic_a = fabric.add_nic([2, 0, 0, 0, 0, 0xa]);
    let nic_b = fabric.add_nic([2, 0, 0, 0, 0, 0xb]);
    let (server_end, client_end) = loopback();
    let server = std::thread::spawn(move || {
        pingpong::run_with_device(&config(4096, 3, true), Box::new(nic_a), server_end, false)
    });
    // Like ibv_rc_pingpong without -c: the page starts stay 0x7b.
    let client = pingpong::run_with_device(&config(4096, 3, false), Box::new(nic_b), client_end, true).unwrap();
    let server = server.join().unwrap().unwrap();
    assert_eq!(server.messages_failed, 3);
    assert_eq!(client.messages_failed, 0, "the client did not ask to verify");
}

#[test]
fn the_server_answers_rc_pingpongs_bytes_after_connecting() {
    let (server_end, mut client_end) = loopback();
    let mine = Address {
        lid: 0,
        qpn: 0x123,
        psn: 0x456,
        gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0xff, 0xfe, 0, 0, 0xa],
    };
    let server = std::thread::spawn(move || {
        let mut connected_to = None;
        let theirs = pingpong::exchange_as_server(server_end, &mine, |theirs| {
            connected_to = Some(*theirs);
            Ok(())
        });
        (theirs, connected_to)
    });
    // rc_pingpong's client: sprintf("%04x:%06x:%06x:%s") into 52 bytes, write, read, "done".
    client_end
        .write_all(b"0000:000011:abcdef:fe80000000000000505400fffe123456\0")
        .unwrap();
    let mut answer = [0u8; MESSAGE_LEN];
    client_end.read_exact(&mut answer).unwrap();
    client_end.write_all(b"done\0").unwrap();
    assert_eq!(&answer, b"0000:000123:000456:fe80000000000000020000fffe00000a\0");
    let (theirs, connected_to) = server.join().unwrap();
    let theirs = theirs.unwrap();
    assert_eq!(connected_to, Some(theirs), "connected before answering");
    assert_eq!(theirs.qpn, 0x11);
}

#[test]
fn a_client_sending_garbage_gets_no_answer_and_an_error() {
    let (server_end, mut client_end) = loopback();
    let mine = Address {
        lid: 0,
        qpn: 1,
        psn: 2,
        gid: [0; 16],
    };
    let server = std::thread::spawn(move || {
        pingpong::exchange_as_server(server_end, &mine, |_| panic!("must not connect on garbage"))
    });
    client_end.write_all(&[0xff; MESSAGE_LEN]).unwrap();
    let result = server.join().unwrap();
    assert!(matches!(result, Err(PingpongError::Message(_))), "{result:?}");
    let mut rest = Vec::new();
    client_end.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn the_command_line_refuses_what_rc_pingpong_does_not_do() {
    for args in [&["write"][..], &["send", "--qps", "2"], &["send", "--ud"]] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_rnic-bench"))
            .args(args)
            .args(["--peer", "pingpong", "--server", "--device", "embedded", "--port", "1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("pingpong"), "{args:?}: {stderr}");
    }
}
