//! The `rnic-emu` binary: help text, argument errors, and `serve` as a real process
//! (socket mode, config file, a client, SIGTERM).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const BINARY: &str = env!("CARGO_BIN_EXE_rnic-emu");

fn run(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BINARY).args(args).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn help_explains_every_option() {
    let (code, top, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for word in [
        "demo",
        "serve",
        "--log",
        "--verbose",
        "RUST_LOG",
        "Without a command, runs `demo`",
    ] {
        assert!(top.contains(word), "--help lacks {word:?}:\n{top}");
    }
    let (code, serve, _) = run(&["serve", "--help"]);
    assert_eq!(code, 0);
    for word in [
        "--socket",
        "0600",
        "--mac",
        "--timing",
        "realtime",
        "fast",
        "--config",
        "--pcap",
        "--net",
        "none",
        "SIGTERM",
        "memory-backend-memfd",
    ] {
        assert!(serve.contains(word), "serve --help lacks {word:?}:\n{serve}");
    }
}

/// The README's first command: no arguments runs the demo, the same as `demo`.
#[test]
fn no_arguments_prints_the_demo_report() {
    let (code, default_run, stderr) = run(&[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(default_run.contains("NIC A"), "{default_run}");
    let (code, demo, _) = run(&["demo"]);
    assert_eq!(code, 0);
    assert_eq!(default_run, demo);
}

#[test]
fn bad_arguments_are_usage_errors() {
    assert_eq!(run(&["--no-such-option"]).0, 2);
    let (code, _, stderr) = run(&["serve"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--socket"), "{stderr}");
    let socket = socket_path("cli-net");
    let (code, _, stderr) = run(&["serve", "--socket", socket.to_str().unwrap(), "--net", "eth:"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("interface name"), "{stderr}");
    let (code, _, stderr) = run(&["serve", "--socket", socket.to_str().unwrap(), "--net", "udp:nowhere"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("udp:IP"), "{stderr}");
    let (code, _, stderr) = run(&["serve", "--socket", socket.to_str().unwrap(), "--mac", "zz"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("MAC"), "{stderr}");
    assert!(!socket.exists());
}

/// A `rnic-emu serve` process, killed on drop if still running.
struct ServeProcess(Child);

impl ServeProcess {
    fn start(args: &[&str], socket: &Path) -> Self {
        let child = Command::new(BINARY)
            .arg("serve")
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let process = Self(child);
        assert!(
            eventually(Duration::from_secs(10), || std::os::unix::net::UnixStream::connect(
                socket
            )
            .is_ok()),
            "server listening on {}",
            socket.display()
        );
        process
    }

    fn terminate(mut self) -> i32 {
        Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status()
            .unwrap();
        let status = self.0.wait().unwrap();
        status.code().unwrap_or(-1)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_runs_as_a_process_with_a_private_socket_and_exits_cleanly_on_sigterm() {
    let socket = socket_path("cli-serve");
    // A stale socket from a dead server is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let server = ServeProcess::start(
        &[
            "--socket",
            socket.to_str().unwrap(),
            "--mac",
            "02:00:00:00:00:42",
            "--net",
            "none",
        ],
        &socket,
    );
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    // The probe connection above came and went; a real client attaches after it.
    let mut client = TestClient::attach(&socket);
    client.assert_in_sync();
    drop(client);
    // A second server on the same live socket is refused.
    let (code, _, stderr) = run(&["serve", "--socket", socket.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("another server"), "{stderr}");
    assert_eq!(server.terminate(), 0);
    assert!(!socket.exists(), "socket removed on exit");
}

#[test]
fn serve_reads_its_config_file() {
    let socket = socket_path("cli-config");
    let config = std::env::temp_dir().join(format!("rnic-emu-cli-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\ntiming = \"fast\"\n[device]\ndoorbell_pages = 8\ndevice_id = 0x5245\n\
             [vfio_user]\nmax_msg_fds = 4\n[doorbell_polling]\nmax_sleep_us = 200\n",
            socket.to_str().unwrap()
        ),
    )
    .unwrap();
    let capture = config.with_extension("pcap");
    let server = ServeProcess::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--pcap",
            capture.to_str().unwrap(),
        ],
        &socket,
    );
    let mut client = TestClient::connect(&socket);
    let json = client.negotiate();
    assert_eq!(json["capabilities"]["max_msg_fds"], 4);
    assert_eq!(client.config_read16(2), 0x5245);
    let (info, fds) = client.region_info(2, 256).unwrap();
    assert_eq!(le64(&info, 16), 8 * 4096);
    assert_eq!(fds.len(), 1);
    drop(client);
    assert_eq!(server.terminate(), 0);
    std::fs::remove_file(&config).unwrap();
    // No traffic with --net none and an idle device: a capture with just its header.
    let pcap = std::fs::read(&capture).unwrap();
    assert_eq!(pcap.len(), 24);
    assert_eq!(pcap[..4], 0xA1B2_3C4Du32.to_le_bytes());
    std::fs::remove_file(&capture).unwrap();

    std::fs::write(&config, "[device]\ndoorbel_pages = 8\n").unwrap();
    let (code, _, stderr) = run(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("doorbel_pages"), "{stderr}");
    std::fs::remove_file(&config).unwrap();
}
