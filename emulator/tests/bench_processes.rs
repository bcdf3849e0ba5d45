//! rnic-bench across processes: two `rnic-emu serve` processes with `udp:` backends, and
//! two bench processes (one `--server`, one `--client`) each attached to one emulator over
//! vfio-user, meeting on loopback TCP. RC WRITE, READ, SEND and fetch-and-add, and UD
//! SEND, every byte checked; a bench client killed with SIGKILL mid-traffic leaves both emulators serving
//! the next pair of bench processes.
//!
//! The emulators are the real binary (`CARGO_BIN_EXE_rnic-emu`). The bench processes are
//! this test executable run again (`bench_child`, ignored unless asked for by name) calling
//! `rnic_testbench::remote::run`, the function `rnic-bench --server/--client` runs. Cargo
//! builds a workspace binary only for the integration tests of its own package, so the
//! `rnic-bench` binary may be missing or stale when only this package is tested; the test
//! executable itself is always present and current.
//!
//! Loopback addresses 127.0.0.41–48: net_udp.rs binds 127.0.0.1/.2, and test binaries
//! run in parallel under nextest.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::process::{check_reports, free_port, mac, run_bench_child, spawn_bench, BenchArguments, Process};
use common::socket_path;

/// The environment variable that turns `bench_child` into a bench process.
const CHILD_ENV: &str = "RNIC_BENCH_CHILD";

/// An emulator on `udp:127.0.0.n`.
struct Emulator {
    process: Process,
    socket: PathBuf,
    n: u8,
}

impl Emulator {
    fn start(n: u8) -> Self {
        let socket = socket_path(&format!("bench{n}"));
        let child = Command::new(env!("CARGO_BIN_EXE_rnic-emu"))
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(["--net", &format!("udp:127.0.0.{n}"), "--mac", &mac(n), "--log", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rnic-emu");
        let mut process = Process(child);
        process.wait_listening(&socket, &format!("rnic-emu on 127.0.0.{n}"));
        Self { process, socket, n }
    }

    fn device(&self) -> String {
        format!("vfio-user:{},mac={}", self.socket.display(), mac(self.n))
    }
}

impl Drop for Emulator {
    /// SIGKILL leaves the socket file behind: remove it.
    fn drop(&mut self) {
        let _ = self.process.0.kill();
        let _ = self.process.0.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts a bench process: `role` is `server` or `client`.
fn bench(role: &str, port: u16, emulator: &Emulator, operation: &str, size: usize, iters: u64) -> Process {
    bench_on(role, port, emulator, operation, size, iters, "rc")
}

/// [`bench`] on `rc` or `ud` queue pairs.
fn bench_on(
    role: &str,
    port: u16,
    emulator: &Emulator,
    operation: &str,
    size: usize,
    iters: u64,
    transport: &str,
) -> Process {
    spawn_bench(
        CHILD_ENV,
        &BenchArguments {
            role,
            port,
            device: emulator.device(),
            ipv4: format!("127.0.0.{}", emulator.n),
            operation,
            size,
            iterations: iters,
            transport,
        },
    )
}

/// Runs one server/client pair to the end and checks both reports.
fn run_pair(a: &Emulator, b: &Emulator, operation: &str, size: usize, iters: u64) {
    run_pair_on(a, b, operation, size, iters, "rc");
}

/// [`run_pair`] on `rc` or `ud` queue pairs.
fn run_pair_on(a: &Emulator, b: &Emulator, operation: &str, size: usize, iters: u64, transport: &str) {
    let port = free_port();
    let server = bench_on("server", port, b, operation, size, iters, transport);
    let client = bench_on("client", port, a, operation, size, iters, transport);
    let (client_ok, client_out) = client.finish(Duration::from_secs(30));
    let (server_ok, server_out) = server.finish(Duration::from_secs(10));
    assert!(
        client_ok && server_ok,
        "{operation}: client {client_out}\nserver {server_out}"
    );
    let messages = iters * QPS as u64;
    check_reports([&client_out, &server_out], operation, size, messages, QPS);
}

const QPS: usize = 2;

#[test]
fn rc_write_read_send_atomics_and_ud_send_between_two_emulator_processes() {
    let a = Emulator::start(41);
    let b = Emulator::start(42);
    for operation in ["write", "read", "send", "atomic"] {
        run_pair(&a, &b, operation, 5000, 48);
    }
    // UD SEND: one MTU (1024) at most, a GRH in front of each receive.
    run_pair_on(&a, &b, "send", 1000, 48, "ud");
    drop((a, b));
}

#[test]
fn rc_queue_pairs_connected_through_the_cm_between_two_emulator_processes() {
    // The client resolves the server's address, sends REQs over the emulators' UDP
    // backends and moves its QPs with the negotiated values; the server accepts; the
    // traffic is checked byte for byte; DREQ/DREP at the end.
    let a = Emulator::start(45);
    let b = Emulator::start(46);
    for operation in ["write", "read", "send"] {
        let port = free_port();
        let server = bench_on("server", port, &b, operation, 5000, 32, "rc-cm");
        let client = bench_on("client", port, &a, operation, 5000, 32, "rc-cm");
        let (client_ok, client_out) = client.finish(Duration::from_secs(60));
        let (server_ok, server_out) = server.finish(Duration::from_secs(20));
        assert!(
            client_ok && server_ok,
            "{operation}: client {client_out}\nserver {server_out}"
        );
        check_reports([&client_out, &server_out], operation, 5000, 32 * QPS as u64, QPS);
        for out in [&client_out, &server_out] {
            let json = common::process::report(out);
            assert_eq!(json["cm"], true, "{json}");
            // REQ, RTU, DREQ per QP from the client; REP, DREP from the server.
            assert!(json["cm_mads"].as_u64().unwrap() >= 2 * QPS as u64, "{json}");
        }
    }
    drop((a, b));
}

#[test]
fn perftest_r_protocol_between_two_emulator_processes() {
    // rnic-bench --peer perftest --cm on both ends: the exchange over an rdma_cm RC
    // connection (binary key messages), the test's connections made after its first sync
    // (RC; UD by SIDR), disconnected at the end. The same code pairs with perftest -R on
    // Linux in scripts/rxe-interop (the *_cm cases).
    let a = Emulator::start(47);
    let b = Emulator::start(48);
    for (operation, size, transport) in [
        ("write", 5000, "perftest-cm"),
        ("read", 5000, "perftest-cm"),
        ("send", 5000, "perftest-cm"),
        ("send", 1000, "perftest-cm-ud"),
    ] {
        let port = free_port();
        let server_side = format!("{transport},127.0.0.47,{}", mac(47));
        let client_side = format!("{transport},127.0.0.48,{}", mac(48));
        let server = bench_on("server", port, &b, operation, size, 32, &server_side);
        let client = bench_on("client", port, &a, operation, size, 32, &client_side);
        let (client_ok, client_out) = client.finish(Duration::from_secs(60));
        let (server_ok, server_out) = server.finish(Duration::from_secs(20));
        assert!(
            client_ok && server_ok,
            "{transport} {operation}: client {client_out}\nserver {server_out}"
        );
        for out in [&client_out, &server_out] {
            let json = common::process::report(out);
            assert_eq!(json["messages_ok"], 32 * QPS as u64, "{json}");
            assert_eq!(json["messages_failed"], 0, "{json}");
            assert_eq!(json["cm"], true, "{json}");
            assert!(json["cm_mads"].as_u64().unwrap() >= 2, "{json}");
        }
    }
    drop((a, b));
}

#[test]
fn a_killed_bench_client_leaves_the_emulators_serving() {
    let mut a = Emulator::start(43);
    let mut b = Emulator::start(44);
    let port = free_port();
    let mut server = bench("server", port, &b, "write", 4096, 10_000_000);
    let mut client = bench("client", port, &a, "write", 4096, 10_000_000);
    // Let traffic run for a while, then SIGKILL the client mid-run.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(client.running() && server.running(), "both benches still running");
    client.0.kill().unwrap();
    client.0.wait().unwrap();
    // The server sees the control connection drop and gives up with an error.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.running() {
        assert!(
            Instant::now() < deadline,
            "bench server did not notice the client's death"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(a.process.running() && b.process.running(), "both emulators survive");
    // A new pair of bench processes attaches to the same emulators and works.
    run_pair(&a, &b, "write", 4096, 32);
    run_pair(&a, &b, "read", 4096, 32);
    assert!(a.process.running() && b.process.running());
}

/// The bench process of the tests above: does nothing unless started by them.
#[test]
#[ignore = "a child process of the tests in this file"]
fn bench_child() {
    run_bench_child(CHILD_ENV, QPS);
}
