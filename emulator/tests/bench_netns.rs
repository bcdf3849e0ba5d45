//! rnic-bench across processes and network namespaces: two `rnic-emu serve` processes,
//! each started with `ip netns exec` in its own network namespace on one end of a veth
//! pair (`--net eth:IFACE`, `--pcap`), and two bench processes in the root namespace, each
//! attached to one emulator over its vfio-user socket (a file, reachable from every
//! namespace) and meeting on 127.0.0.1 TCP. RC WRITE, READ, SEND and fetch-and-add, and
//! UD SEND, every byte checked. The emulators are then stopped with SIGTERM (which flushes
//! their captures), and each capture must pass the capture check (`rnic-pcap-check`, and
//! `../shared/oracles/check-roce-pcap` where it exists): on the
//! `eth:` backend every frame, IPv4 included, leaves exactly as the device built it.
//!
//! Needs root (network namespaces, CAP_NET_RAW) and `ip` (iproute2). Without them the
//! test fails, saying so, unless RNIC_SKIP_NETNS=1. The namespaces and links are named
//! after this process's id; the addresses (192.0.2.0/24, documentation space) exist only
//! inside the namespaces, which a guard removes at the end, also on failure.
//!
//! The bench processes are this test executable run again (`bench_child`, ignored unless
//! asked for by name), as in bench_processes.rs.

mod common;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{check_capture, environment_ready, Namespaces};
use common::process::{check_reports, free_port, mac, run_bench_child, spawn_bench, BenchArguments, Process};

/// The environment variable that turns `bench_child` into a bench process.
const CHILD_ENV: &str = "RNIC_BENCH_NETNS_CHILD";

/// Queue pairs per bench run.
const QPS: usize = 2;

/// Messages per QP per bench run.
const ITERS: u64 = 32;

/// An emulator in a namespace on `eth:LINK`, capturing to a pcap file.
struct Emulator {
    process: Process,
    socket: PathBuf,
    pcap: PathBuf,
    mac: String,
    ipv4: Ipv4Addr,
}

impl Emulator {
    fn start(namespace: &str, link: &str, n: u8) -> Self {
        let id = std::process::id();
        let temp = std::env::temp_dir();
        let socket = temp.join(format!("rnic-bn{id}-{n}.sock"));
        let pcap = temp.join(format!("rnic-bench-netns-{id}-{n}.pcap"));
        let _ = std::fs::remove_file(&pcap);
        let mac = mac(n);
        // `ip netns exec` enters the namespace and execs the emulator (no fork), so the
        // child's pid is the emulator's and SIGTERM reaches it.
        let child = Command::new("ip")
            .args(["netns", "exec", namespace])
            .arg(env!("CARGO_BIN_EXE_rnic-emu"))
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(["--net", &format!("eth:{link}"), "--mac", &mac, "--log", "error"])
            .arg("--pcap")
            .arg(&pcap)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ip netns exec rnic-emu");
        let mut process = Process(child);
        process.wait_listening(&socket, &format!("rnic-emu in {namespace} on eth:{link}"));
        Self {
            process,
            socket,
            pcap,
            mac,
            ipv4: Ipv4Addr::new(192, 0, 2, n),
        }
    }

    fn device(&self) -> String {
        format!("vfio-user:{},mac={}", self.socket.display(), self.mac)
    }

    /// Sends SIGTERM and waits (bounded) for a clean exit, which flushes the capture.
    fn stop(&mut self) {
        let pid = libc::pid_t::try_from(self.process.0.id()).unwrap();
        // SAFETY: kill(2) with a valid signal number has no memory-safety preconditions;
        // `pid` is our own unreaped child, so it cannot have been recycled.
        let result = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(result, 0, "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(status) = self.process.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "rnic-emu {pid} ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "rnic-emu {pid} exited with {status} on SIGTERM");
    }
}

impl Drop for Emulator {
    /// SIGKILL (after a failure) leaves the socket file behind: remove it.
    fn drop(&mut self) {
        let _ = self.process.0.kill();
        let _ = self.process.0.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts a bench process: `role` is `server` or `client`, `transport` `rc` or `ud`.
fn bench(role: &str, port: u16, emulator: &Emulator, operation: &str, size: usize, transport: &str) -> Process {
    spawn_bench(
        CHILD_ENV,
        &BenchArguments {
            role,
            port,
            device: emulator.device(),
            ipv4: emulator.ipv4.to_string(),
            operation,
            size,
            iterations: ITERS,
            transport,
        },
    )
}

/// Runs one server (on `server`) / client (on `client`) pair to the end and checks both
/// reports. Returns the number of messages.
fn run_pair(server: &Emulator, client: &Emulator, operation: &str, size: usize, transport: &str) -> u64 {
    let port = free_port();
    let server_process = bench("server", port, server, operation, size, transport);
    let client_process = bench("client", port, client, operation, size, transport);
    let (client_ok, client_out) = client_process.finish(Duration::from_secs(20));
    let (server_ok, server_out) = server_process.finish(Duration::from_secs(10));
    assert!(
        client_ok && server_ok,
        "{transport} {operation}: client {client_out}\nserver {server_out}"
    );
    let messages = ITERS * QPS as u64;
    check_reports([&client_out, &server_out], operation, size, messages, QPS);
    eprintln!("{transport} {operation} {size} B: {messages} messages verified");
    messages
}

#[test]
fn bench_processes_across_two_namespaces_on_the_eth_backend_pass_the_pcap_oracle() {
    if !environment_ready("bench-across-namespaces") {
        return;
    }
    let namespaces = Namespaces::create("rnic-bench", "rb");
    // The kernels get addresses of their own, next to (not equal to) the NICs' GIDs.
    namespaces.add_address(0, "192.0.2.101/24");
    namespaces.add_address(1, "192.0.2.102/24");
    let mut a = Emulator::start(&namespaces.names[0], &namespaces.links[0], 1);
    let mut b = Emulator::start(&namespaces.names[1], &namespaces.links[1], 2);

    let mut messages = 0;
    for operation in ["write", "read", "send", "atomic"] {
        messages += run_pair(&a, &b, operation, 5000, "rc");
    }
    // UD SEND: one MTU (1024) at most, a GRH in front of each receive.
    messages += run_pair(&a, &b, "send", 1000, "ud");

    a.stop();
    b.stop();
    // Every message put at least one request frame on the wire, which both captures hold
    // (sent by one NIC, received by the other).
    for emulator in [&a, &b] {
        let frames = check_capture(&emulator.pcap);
        assert!(
            frames >= messages,
            "{}: {frames} RoCEv2 frames for {messages} messages",
            emulator.pcap.display()
        );
    }
    for emulator in [&a, &b] {
        std::fs::remove_file(&emulator.pcap).unwrap();
    }
    drop((a, b, namespaces));
}

/// The bench process of the test above: does nothing unless started by it.
#[test]
#[ignore = "a child process of the test in this file"]
fn bench_child() {
    run_bench_child(CHILD_ENV, QPS);
}
