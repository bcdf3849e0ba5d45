//! Child processes for the tests: a guard that kills and reaps on drop, waiting for a
//! server's socket, and the bench processes (this test executable run again as
//! `bench_child`) with their reports.
#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rnic_testbench::bench::{BenchConfig, Operation};
use rnic_testbench::remote::{self, RemoteConfig, Role};

/// The MAC address `02:52:4e:49:43:NN`, as `--mac` takes it.
pub fn mac(n: u8) -> String {
    format!("02:52:4e:49:43:{n:02x}")
}

/// A process killed (SIGKILL) and reaped on drop, so nothing outlives a failed test.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    pub fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the exit; returns its success and stdout.
    pub fn finish(mut self, limit: Duration) -> (bool, String) {
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

    /// Waits up to 10 s for `socket` to accept connections; `what` names the server in
    /// the failures (it exited, or it is not listening).
    pub fn wait_listening(&mut self, socket: &Path, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(self.running(), "{what} exited");
            assert!(Instant::now() < deadline, "{what} not listening");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A loopback TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What a bench process does, passed to it in an environment variable.
pub struct BenchArguments<'a> {
    /// `server` or `client`.
    pub role: &'a str,
    pub port: u16,
    /// `vfio-user:SOCKET,mac=MAC`.
    pub device: String,
    pub ipv4: String,
    pub operation: &'a str,
    pub size: usize,
    pub iterations: u64,
    /// `rc`, `rc-cm` (RC connected through the connection manager), `ud`, or
    /// `perftest-cm,PEER_IP,PEER_MAC` / `perftest-cm-ud,…` (perftest -R's protocol,
    /// `rnic-bench --peer perftest --cm [--ud]`; the client connects to PEER_IP).
    pub transport: &'a str,
}

/// Starts this test executable again as `bench_child`, with `arguments` in `env`.
pub fn spawn_bench(env: &str, arguments: &BenchArguments<'_>) -> Process {
    let arguments = [
        arguments.role.to_string(),
        arguments.port.to_string(),
        arguments.device.clone(),
        arguments.ipv4.clone(),
        arguments.operation.to_string(),
        arguments.size.to_string(),
        arguments.iterations.to_string(),
        arguments.transport.to_string(),
    ];
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "bench_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(env, arguments.join("\n"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn bench process");
    Process(child)
}

/// The JSON object a bench process printed.
pub fn report(out: &str) -> serde_json::Value {
    // libtest prints `test bench_child ... ` on the same line, before the report.
    let line = out
        .lines()
        .find_map(|line| line.split_once("BENCH-JSON ").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("no report in {out:?}"));
    serde_json::from_str(line).unwrap()
}

/// Checks the reports of a finished server/client pair: every message and byte verified.
pub fn check_reports(outs: [&str; 2], operation: &str, size: usize, messages: u64, queue_pairs: usize) {
    let bytes = messages * if operation == "atomic" { 8 } else { size as u64 };
    for out in outs {
        let json = report(out);
        assert_eq!(json["op"], operation);
        assert_eq!(json["messages_ok"], messages, "{json}");
        assert_eq!(json["messages_failed"], 0, "{json}");
        assert_eq!(json["bytes_verified"], bytes, "{json}");
        assert_eq!(json["qps"], queue_pairs);
    }
}

/// The body of `bench_child`: unless `env` is set, returns; otherwise runs the bench it
/// describes (see [`spawn_bench`]) on `queue_pairs` QPs, prints its report and exits.
pub fn run_bench_child(env: &str, queue_pairs: usize) {
    let Ok(arguments) = std::env::var(env) else {
        return;
    };
    let arguments: Vec<&str> = arguments.split('\n').collect();
    if arguments[7].starts_with("perftest-cm") {
        return run_perftest_cm_child(&arguments, queue_pairs);
    }
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
            queue_pairs,
            mtu: 1024,
            verify: true,
            connection_manager: arguments[7] == "rc-cm",
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

/// [`run_bench_child`] for `perftest-cm…`: one side of perftest -R's protocol.
fn run_perftest_cm_child(arguments: &[&str], queue_pairs: usize) {
    let port: u16 = arguments[1].parse().unwrap();
    let mut transport = arguments[7].split(',');
    let ud = transport.next() == Some("perftest-cm-ud");
    let peer_ip = transport.next().unwrap().to_string();
    let peer_mac = transport.next().unwrap();
    let mut mac = [0u8; 6];
    for (byte, text) in mac.iter_mut().zip(peer_mac.split(':')) {
        *byte = u8::from_str_radix(text, 16).unwrap();
    }
    let role = match arguments[0] {
        "server" => Role::Server { port },
        _ => Role::Client { host: peer_ip, port },
    };
    let operation = arguments[4].parse::<Operation>().unwrap();
    let config = rnic_testbench::perftest::PerftestConfig {
        bench: BenchConfig {
            operation,
            size: arguments[5].parse().unwrap(),
            iterations: arguments[6].parse().unwrap(),
            queue_pairs,
            mtu: 1024,
            verify: true,
            connection_manager: true,
            ..BenchConfig::default()
        },
        test: rnic_testbench::perftest::Test::new(operation, ud, false).unwrap(),
        gid_index: 0,
        peer_mac: Some(mac),
    };
    let code = match rnic_testbench::perftest::run(&config, arguments[2], Some(arguments[3].parse().unwrap()), &role) {
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
