//! rnic-bench across processes and network namespaces: two `rnic-emu serve` processes,
//! each started with `ip netns exec` in its own network namespace on one end of a veth
//! pair (`--net eth:IFACE`, `--pcap`), and two bench processes in the root namespace, each
//! attached to one emulator over its vfio-user socket (a file, reachable from every
//! namespace) and meeting on 127.0.0.1 TCP. RC WRITE, READ, SEND and fetch-and-add, and
//! UD SEND, every byte checked. The emulators are then stopped with SIGTERM (which flushes
//! their captures), and each capture must pass `../shared/oracles/check-roce-pcap`: on the
//! `eth:` backend every frame, IPv4 included, leaves exactly as the device built it.
//!
//! Needs root (network namespaces, CAP_NET_RAW) and `ip` (iproute2). Without them the
//! test fails, saying so, unless RNIC_SKIP_NETNS=1. The namespaces and links are named
//! after this process's id; the addresses (192.0.2.0/24, documentation space) exist only
//! inside the namespaces, which a guard removes at the end, also on failure.
//!
//! The bench processes are this test executable run again (`bench_child`, ignored unless
//! asked for by name), as in bench_processes.rs.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rnic_testbench::bench::{BenchConfig, Operation};
use rnic_testbench::remote::{self, RemoteConfig, Role};

/// The environment variable that turns `bench_child` into a bench process.
const CHILD_ENV: &str = "RNIC_BENCH_NETNS_CHILD";

/// Queue pairs per bench run.
const QPS: usize = 2;

/// Messages per QP per bench run.
const ITERS: u64 = 32;

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) {
    let output = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run ip {args:?}: {error}"));
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
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
            names: [format!("rnic-bench-a-{id}"), format!("rnic-bench-b-{id}")],
            // IFNAMSIZ: at most 15 characters.
            links: [format!("rba{}", id % 1_000_000), format!("rbb{}", id % 1_000_000)],
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
        // The kernels get addresses of their own, next to (not equal to) the NICs' GIDs.
        ip(&["-n", na, "addr", "add", "192.0.2.101/24", "dev", la]);
        ip(&["-n", nb, "addr", "add", "192.0.2.102/24", "dev", lb]);
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
        eprintln!("skipped: the bench-across-namespaces test {why} (RNIC_SKIP_NETNS=1)");
        return false;
    }
    panic!("the bench-across-namespaces test {why}; run as root, or set RNIC_SKIP_NETNS=1 to skip it");
}

/// Whether we run as root, from /proc.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// `../shared/oracles/check-roce-pcap` (or `$ROCE_ORACLES_DIR/check-roce-pcap`).
fn oracle() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("ROCE_ORACLES_DIR").map(PathBuf::from),
        Some(workspace.join("../shared/oracles")),
    ];
    candidates
        .into_iter()
        .flatten()
        .map(|dir| dir.join("check-roce-pcap"))
        .find(|path| path.exists())
        .expect("../shared/oracles/check-roce-pcap (or $ROCE_ORACLES_DIR)")
}

fn mac(n: u8) -> String {
    format!("02:52:4e:49:43:{n:02x}")
}

/// A process killed (SIGKILL) and reaped on drop, so nothing outlives a failed test.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the exit; returns its success and stdout.
    fn finish(mut self, limit: Duration) -> (bool, String) {
        let deadline = Instant::now() + limit;
        while self.running() {
            assert!(Instant::now() < deadline, "process {} still running", self.0.id());
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = self.0.wait().unwrap();
        let mut out = String::new();
        if let Some(mut stdout) = self.0.stdout.take() {
            use std::io::Read;
            stdout.read_to_string(&mut out).unwrap();
        }
        (status.success(), out)
    }
}

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
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(process.running(), "rnic-emu in {namespace} on eth:{link} exited");
            assert!(Instant::now() < deadline, "rnic-emu in {namespace} not listening");
            std::thread::sleep(Duration::from_millis(10));
        }
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

/// A loopback TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a bench process: `role` is `server` or `client`, `transport` `rc` or `ud`.
fn bench(role: &str, port: u16, emulator: &Emulator, operation: &str, size: usize, transport: &str) -> Process {
    let arguments = [
        role.to_string(),
        port.to_string(),
        emulator.device(),
        emulator.ipv4.to_string(),
        operation.to_string(),
        size.to_string(),
        ITERS.to_string(),
        transport.to_string(),
    ];
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "bench_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, arguments.join("\n"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn bench process");
    Process(child)
}

/// The JSON object a bench process printed.
fn report(out: &str) -> serde_json::Value {
    // libtest prints `test bench_child ... ` on the same line, before the report.
    let line = out
        .lines()
        .find_map(|line| line.split_once("BENCH-JSON ").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("no report in {out:?}"));
    serde_json::from_str(line).unwrap()
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
    let bytes = messages * if operation == "atomic" { 8 } else { size as u64 };
    for out in [&client_out, &server_out] {
        let json = report(out);
        assert_eq!(json["op"], operation);
        assert_eq!(json["messages_ok"], messages, "{json}");
        assert_eq!(json["messages_failed"], 0, "{json}");
        assert_eq!(json["bytes_verified"], bytes, "{json}");
        assert_eq!(json["qps"], QPS);
    }
    eprintln!("{transport} {operation} {size} B: {messages} messages verified");
    messages
}

/// Runs the oracle on `pcap`; returns the number of RoCEv2 frames it found, all good.
fn check_capture(pcap: &Path) -> u64 {
    let output = Command::new(oracle()).arg(pcap).output().expect("run check-roce-pcap");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "check-roce-pcap rejected {} ({}):\n{stdout}\n{stderr}\n(capture kept)",
        pcap.display(),
        output.status
    );
    let frames = stdout
        .lines()
        .find_map(|line| line.trim().strip_suffix(" RoCEv2 frames, all ICRC good"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no frame count from check-roce-pcap:\n{stdout}"));
    eprintln!("{}: {}", pcap.display(), stdout.trim());
    frames
}

#[test]
fn bench_processes_across_two_namespaces_on_the_eth_backend_pass_the_pcap_oracle() {
    if !environment_ready() {
        return;
    }
    let oracle = oracle();
    assert!(oracle.exists());
    let namespaces = Namespaces::create();
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
    let Ok(arguments) = std::env::var(CHILD_ENV) else {
        return;
    };
    let arguments: Vec<&str> = arguments.split('\n').collect();
    let port: u16 = arguments[1].parse().unwrap();
    let role = match arguments[0] {
        "server" => Role::Server { port },
        _ => Role::Client {
            host: "127.0.0.1".into(),
            port,
        },
    };
    let config = RemoteConfig {
        bench: BenchConfig {
            operation: arguments[4].parse::<Operation>().unwrap(),
            size: arguments[5].parse().unwrap(),
            iterations: arguments[6].parse().unwrap(),
            queue_pairs: QPS,
            mtu: 1024,
            verify: true,
            ..BenchConfig::default()
        },
        device: arguments[2].to_string(),
        ipv4: Some(arguments[3].parse().unwrap()),
        role,
        ud: arguments[7] == "ud",
    };
    let code = match remote::run(&config) {
        Ok(report) => {
            println!("\nBENCH-JSON {}", report.to_json());
            i32::from(report.messages_failed != 0)
        }
        Err(error) => {
            eprintln!("bench {}: {error}", arguments[0]);
            1
        }
    };
    std::process::exit(code);
}
