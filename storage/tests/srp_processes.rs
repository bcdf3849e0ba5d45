//! SRP ours ↔ ours across processes: two `rnic-emu serve` processes on loopback UDP,
//! `rnic-srp-tgt` on one with a file LUN and a RAM LUN, `rnic-srp` on the other, logging
//! in through the RDMA CM on QP1 (REQ with the compact login, REP with SRP_LOGIN_RSP).
//!
//! The emulators are this test executable run again (`emulator_child`, ignored unless
//! asked for by name), because Cargo builds another package's binary only for that
//! package's tests. Loopback addresses 127.0.0.71/72.

mod processes_common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use processes_common::{free_port, scratch, serve_if_asked, Emulator, Killed, Names};

const NAMES: Names = Names {
    child_env: "RNIC_SRP_EMULATOR",
    scratch_prefix: "rnic-srp",
    mac_prefix: "02:52:4e:53:52",
};

/// Runs `rnic-emu serve` when asked for by name with `RNIC_SRP_EMULATOR=SOCKET,NET,MAC`.
#[test]
#[ignore]
fn emulator_child() {
    serve_if_asked(&NAMES);
}

fn run(args: &[String]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_rnic-srp"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), format!("{stdout}{stderr}"))
}

#[test]
fn initiator_and_target_in_separate_processes() {
    let target_emulator = Emulator::start(&NAMES, 71);
    let initiator_emulator = Emulator::start(&NAMES, 72);
    let port = free_port();
    let image = scratch(&NAMES, "lun0.img");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rnic-srp-tgt"))
        .args(["--device", &target_emulator.device(), "--ip", &target_emulator.ip()])
        .args(["--listen", &format!("{}:{port}", target_emulator.ip())])
        .args(["--lun", &format!("0,file:{},size=32MiB", image.display())])
        .args(["--lun", "3,ram:16MiB,bs=4096"])
        .args(["--id-ext", "00112233445566aa", "--ioc-guid", "00112233445566aa"])
        .args(["--log", "warn", "--cm", "rdma", "--neighbours", "udp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _target = Killed(child);
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines.next().expect("the target exited").unwrap();
        if line.starts_with("listening on") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let device = initiator_emulator.device();
    let ip = initiator_emulator.ip();
    let target = format!("{}:{port}", target_emulator.ip());
    let common = |port_id: &'static str| {
        vec![
            "--device".to_string(),
            device.clone(),
            "--ip".into(),
            ip.clone(),
            "--target".into(),
            target.clone(),
            "--id-ext".into(),
            port_id.into(),
            "--ioc-guid".into(),
            port_id.into(),
            "--cm".into(),
            "rdma".into(),
            "--neighbours".into(),
            "udp".into(),
        ]
    };
    let with = |port_id: &'static str, rest: &[&str]| {
        let mut args = common(port_id);
        args.extend(rest.iter().map(|s| s.to_string()));
        args
    };

    let args = with("00112233445566aa", &["info"]);
    let (ok, out) = run(&args);
    assert!(ok, "{out}");
    assert!(out.contains("LUN 0: RNIC-EMU FILEIO"), "{out}");
    assert!(out.contains("65536 blocks of 512 bytes"), "{out}");
    assert!(out.contains("LUN 3: RNIC-EMU RAMDISK"), "{out}");

    // A known pattern, written and read back; it is in the file on the target's side.
    let args = with(
        "00112233445566aa",
        &[
            "verify", "--lun", "0", "--lba", "2048", "--size", "65536", "--count", "4",
        ],
    );
    let (ok, out) = run(&args);
    assert!(ok, "{out}");
    assert!(out.contains("0 differed"), "{out}");
    let file = std::fs::read(&image).unwrap();
    let mut expected = vec![0u8; 65536];
    rnic_storage::nvmeof::perf::fill_pattern(&mut expected, 0, 1, 2048);
    assert_eq!(&file[2048 * 512..2048 * 512 + 65536], &expected[..]);

    // The benchmark with verification.
    let args = with(
        "00112233445566aa",
        &[
            "perf",
            "--lun",
            "3",
            "--qd",
            "16",
            "--bs",
            "8192",
            "--read-percent",
            "50",
            "--ios",
            "2000",
            "--verify",
            "--json",
        ],
    );
    let (ok, out) = run(&args);
    assert!(ok, "{out}");
    assert!(
        out.contains("\"verify_failures\":0") && out.contains("\"ios\":2000"),
        "{out}"
    );

    // The wrong target port ID: refused with the reason Linux prints.
    let args = with("0000000000000001", &["info"]);
    let (ok, out) = run(&args);
    assert!(!ok);
    assert!(out.contains("unable to associate"), "{out}");
    let _ = std::fs::remove_file(&image);
}
