//! Ours ↔ ours across processes: two `rnic-emu serve` processes on loopback UDP, the
//! target (`rnic-nvmf-tgt`) on one with a file namespace, the host tools (`rnic-nvme`,
//! `rnic-nvme-perf`) on the other, connected through the RDMA CM on QP1 (and once
//! through the TCP exchange).
//!
//! The emulators are this test executable run again (`emulator_child`, ignored unless
//! asked for by name) calling the emulator library's server, because Cargo builds another
//! package's binary only for that package's tests. Loopback addresses 127.0.0.61/62.

mod processes_common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use processes_common::{free_port, scratch, serve_if_asked, Emulator, Killed, Names};

const NAMES: Names = Names {
    child_env: "RNIC_NVMF_EMULATOR",
    scratch_prefix: "rnic-nvmf",
    mac_prefix: "02:52:4e:56:4d",
};
const SUBNQN: &str = "nqn.2024-01.io.rnic-emu:processes";

/// Runs `rnic-emu serve` when asked for by name with `RNIC_NVMF_EMULATOR=SOCKET,NET,MAC`.
#[test]
#[ignore]
fn emulator_child() {
    serve_if_asked(&NAMES);
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
    let target_emulator = Emulator::start(&NAMES, 61);
    let host_emulator = Emulator::start(&NAMES, 62);
    let port = free_port();
    let image = scratch(&NAMES, "namespace.img");
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
    let input = scratch(&NAMES, "pattern.bin");
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
    let output = scratch(&NAMES, "readback.bin");
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
