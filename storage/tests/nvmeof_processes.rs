//! Ours ↔ ours across processes: two `rnic-emu serve` processes on loopback UDP, the
//! target (`rnic-nvmf-tgt`) on one with a file namespace, the host tools (`rnic-nvme`,
//! `rnic-nvme-perf`) on the other, connected through the RDMA CM on QP1 (and once
//! through the TCP exchange).
//!
//! The emulators are this test executable run again (`emulator_child`, ignored unless
//! asked for by name) calling the emulator library's server, because Cargo builds another
//! package's binary only for that package's tests. Loopback addresses 127.0.0.61/62.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "RNIC_NVMF_EMULATOR";
const SUBNQN: &str = "nqn.2024-01.io.rnic-emu:processes";

/// Runs `rnic-emu serve` when asked for by name with `RNIC_NVMF_EMULATOR=SOCKET,NET,MAC`.
#[test]
#[ignore]
fn emulator_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let overrides = rnic_emu::config::Overrides {
        socket: Some(parts[0].into()),
        net: Some(parts[1].into()),
        mac: Some(parts[2].into()),
        timing: None,
        pcap: None,
    };
    let options = rnic_emu::config::resolve(&rnic_emu::config::ConfigFile::default(), &overrides).unwrap();
    rnic_emu::os::install_termination_handlers().unwrap();
    rnic_emu::vfio_user::Server::bind(options).unwrap().run().unwrap();
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rnic-nvmf-{}-{name}", std::process::id()))
}

fn mac(n: u8) -> String {
    format!("02:52:4e:56:4d:{n:02x}")
}

struct Emulator {
    _child: Killed,
    socket: PathBuf,
    n: u8,
}

impl Emulator {
    fn start(n: u8) -> Self {
        let socket = scratch(&format!("emu{n}.sock"));
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "emulator_child", "--ignored", "--nocapture"])
            .env(CHILD_ENV, format!("{},udp:127.0.0.{n},{}", socket.display(), mac(n)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = Killed(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "emulator {n} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            _child: child,
            socket,
            n,
        }
    }

    fn device(&self) -> String {
        format!("vfio-user:{},mac={}", self.socket.display(), mac(self.n))
    }

    fn ip(&self) -> String {
        format!("127.0.0.{}", self.n)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn start_target(emulator: &Emulator, port: u16, image: &Path) -> Killed {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rnic-nvmf-tgt"))
        .args(["--device", &emulator.device(), "--ip", &emulator.ip()])
        .args(["--listen", &format!("{}:{port}", emulator.ip())])
        .args(["--subsystem", SUBNQN])
        .args([
            "--namespace",
            &format!("{SUBNQN},1,file:{},size=64MiB", image.display()),
        ])
        .args(["--log", "warn", "--cm", "rdma", "--neighbours", "udp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines.next().expect("the target exited").unwrap();
        if line.starts_with("listening on") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Killed(child)
}

#[test]
fn host_tools_and_target_in_separate_processes() {
    let target_emulator = Emulator::start(61);
    let host_emulator = Emulator::start(62);
    let port = free_port();
    let image = scratch("namespace.img");
    let _target = start_target(&target_emulator, port, &image);
    let device = host_emulator.device();
    let ip = host_emulator.ip();
    let traddr = target_emulator.ip();
    let port_text = port.to_string();
    let common = [
        "--device",
        &device,
        "--ip",
        &ip,
        "-a",
        &traddr,
        "-s",
        &port_text,
        "--cm",
        "rdma",
        "--neighbours",
        "udp",
    ];

    // Discovery lists the subsystem.
    let mut args = vec!["discover"];
    args.extend(common);
    let discovered = run(env!("CARGO_BIN_EXE_rnic-nvme"), &args);
    assert!(discovered.contains(&format!("subnqn:  {SUBNQN}")), "{discovered}");
    assert!(discovered.contains(&format!("trsvcid: {port}")), "{discovered}");

    // A known pattern written with the tool lands in the file on this side.
    let pattern: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let input = scratch("pattern.bin");
    std::fs::write(&input, &pattern).unwrap();
    let mut args = vec!["write"];
    args.extend(common);
    let input_text = input.display().to_string();
    args.extend([
        "-n",
        SUBNQN,
        "--namespace-id",
        "1",
        "--start-block",
        "100",
        "-c",
        "15",
        "-d",
        &input_text,
    ]);
    run(env!("CARGO_BIN_EXE_rnic-nvme"), &args);
    let file = std::fs::read(&image).unwrap();
    assert_eq!(
        &file[100 * 512..100 * 512 + 8192],
        &pattern[..],
        "the file backend holds the pattern"
    );
    // And reads back.
    let output = scratch("readback.bin");
    let output_text = output.display().to_string();
    let mut args = vec!["read"];
    args.extend(common);
    args.extend([
        "-n",
        SUBNQN,
        "--namespace-id",
        "1",
        "--start-block",
        "100",
        "-c",
        "15",
        "-d",
        &output_text,
    ]);
    run(env!("CARGO_BIN_EXE_rnic-nvme"), &args);
    assert_eq!(std::fs::read(&output).unwrap(), pattern);

    // Verified I/O of 4 KiB to 1 MiB at queue depths 1 to 128 over two I/O queues.
    let transport_id = format!("trtype:RDMA adrfam:IPv4 traddr:{traddr} trsvcid:{port} subnqn:{SUBNQN}");
    // Regions of two to four I/O units per I/O outstanding, so reads find units written earlier.
    for (size, depth, ios, region) in [
        ("4096", "1", "200", "16KiB"),
        ("4096", "128", "4000", "2MiB"),
        ("128KiB", "16", "400", "8MiB"),
        ("1MiB", "4", "64", "16MiB"),
    ] {
        let out = run(
            env!("CARGO_BIN_EXE_rnic-nvme-perf"),
            &[
                "--device",
                &device,
                "--ip",
                &ip,
                "-r",
                &transport_id,
                "--mode",
                "wall",
                "-w",
                "randrw",
                "-o",
                size,
                "-q",
                depth,
                "-n",
                ios,
                "--queues",
                "2",
                "--verify",
                "--region",
                region,
                "--json",
                "--cm",
                "rdma",
                "--neighbours",
                "udp",
            ],
        );
        let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(json["errors"], 0, "{out}");
        assert_eq!(json["verify_failures"], 0, "{out}");
        assert_eq!(json["ios"].as_u64().unwrap().to_string(), ios, "{out}");
        assert!(json["verified_reads"].as_u64().unwrap() > 0, "{out}");
    }
    for path in [&image, &input, &output] {
        let _ = std::fs::remove_file(path);
    }
}
