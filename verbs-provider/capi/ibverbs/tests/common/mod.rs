//! Running unmodified Debian RDMA programs on our libraries: the library directory, the
//! server/client pair with bounded time, and what a test checks of their output.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory with libibverbs.so.1 and its companions (debug build), built once per
/// test process by `scripts/build-rdma-libs --debug`.
pub fn library_directory() -> PathBuf {
    static DIRECTORY: OnceLock<PathBuf> = OnceLock::new();
    DIRECTORY
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
            let output = Command::new(root.join("scripts/build-rdma-libs"))
                .arg("--debug")
                .env("CARGO", env!("CARGO"))
                .output()
                .expect("run scripts/build-rdma-libs");
            assert!(
                output.status.success(),
                "scripts/build-rdma-libs failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let text = String::from_utf8_lossy(&output.stdout);
            PathBuf::from(text.lines().last().expect("the script prints the directory").trim())
        })
        .clone()
}

/// Fails the test (with how to install it) when a Debian program is missing; CI installs
/// them (scripts/test). `RNIC_SKIP_RDMA_APPS=1` skips instead, for hosts without them.
pub fn require(program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var_os("RNIC_SKIP_RDMA_APPS").is_some() {
        eprintln!("{program} missing: skipped (RNIC_SKIP_RDMA_APPS)");
        return false;
    }
    panic!(
        "{program} is not installed: install the Debian packages ibverbs-utils perftest rdmacm-utils \
         (scripts/test does, as root), or set RNIC_SKIP_RDMA_APPS=1"
    );
}

/// A program on our libraries with `RNIC_DEVICE=device`.
pub fn command(program: &str, args: &[&str], device: &str) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LD_LIBRARY_PATH", library_directory())
        .env("RNIC_DEVICE", device)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits for `child` at most `limit`; kills it past that (the test then fails on its
/// status).
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                break;
            }
        }
    }
    child.wait_with_output().expect("collect the program's output")
}

/// Both sides' output.
pub struct Pair {
    pub server: Output,
    pub client: Output,
}

impl Pair {
    /// Panics with both sides' output unless both exited 0.
    pub fn assert_success(&self, what: &str) {
        for (side, output) in [("server", &self.server), ("client", &self.client)] {
            assert!(
                output.status.success(),
                "{what}: {side} failed ({})\n--- server stdout\n{}\n--- server stderr\n{}\n--- client stdout\n{}\n--- client stderr\n{}",
                output.status,
                String::from_utf8_lossy(&self.server.stdout),
                String::from_utf8_lossy(&self.server.stderr),
                String::from_utf8_lossy(&self.client.stdout),
                String::from_utf8_lossy(&self.client.stderr),
            );
        }
    }

    /// The client's standard output.
    pub fn client_stdout(&self) -> String {
        String::from_utf8_lossy(&self.client.stdout).into_owned()
    }

    /// The server's standard output.
    pub fn server_stdout(&self) -> String {
        String::from_utf8_lossy(&self.server.stdout).into_owned()
    }
}

/// Runs `program` as server on `udp:server_ip` and as client on `udp:client_ip`, the
/// client given `server_args` + `client_args` + the server's host; 60 s at most each.
pub fn run_pair(program: &str, args: &[&str], server_ip: &str, client_ip: &str) -> Pair {
    let server = command(program, args, &format!("udp:{server_ip}"))
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    // Both perftest and the pingpongs retry the TCP connection for a while, but give the
    // server a moment to listen.
    std::thread::sleep(Duration::from_millis(300));
    let mut client_args: Vec<&str> = args.to_vec();
    client_args.push("127.0.0.1");
    let client = command(program, &client_args, &format!("udp:{client_ip}"))
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let client = wait_bounded(client, Duration::from_secs(60));
    let server = wait_bounded(server, Duration::from_secs(10));
    Pair { server, client }
}

/// The numbers of perftest's result line (the line after the `#bytes` header).
pub fn perftest_result(stdout: &str) -> Vec<f64> {
    let mut lines = stdout.lines().skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next();
    lines
        .next()
        .map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default()
}
