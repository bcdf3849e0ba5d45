//! `rnic-bench --server/--client` on the command line: the split's flags are checked before
//! anything is opened. The traffic itself runs in emulator/tests/bench_processes.rs (two
//! `rnic-emu` processes, two bench processes).

use std::process::Command;

fn bench(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_rnic-bench"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_split_needs_a_device_and_one_side() {
    let (code, stderr) = bench(&["write", "--server"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stderr) = bench(&["write", "--device", "vfio-user:/nonexistent.sock"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stderr) = bench(&["write", "--device", "embedded", "--server", "--client", "127.0.0.1"]);
    assert_eq!(code, Some(2), "{stderr}");
}

#[test]
fn unsupported_settings_and_missing_devices_are_errors() {
    let (code, stderr) = bench(&["mixed", "--device", "embedded", "--server", "--port", "1"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("mixed is not supported"), "{stderr}");
    let (code, stderr) = bench(&[
        "write",
        "--device",
        "embedded",
        "--faults",
        "loss=0.1",
        "--client",
        "localhost",
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--faults"), "{stderr}");
    let (code, stderr) = bench(&[
        "write",
        "--device",
        "vfio-user:/nonexistent/rnic.sock",
        "--client",
        "localhost",
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("/nonexistent/rnic.sock"), "{stderr}");
}

#[test]
fn timing_only_flags_are_rejected_across_processes() {
    for flags in [
        &["--preset", "hns-25g"][..],
        &["--mode", "wall"],
        &["--lat"],
        &["--bw"],
        &["--breakdown"],
    ] {
        let mut args = vec!["write", "--device", "embedded", "--server", "--port", "1"];
        args.extend_from_slice(flags);
        let (code, stderr) = bench(&args);
        assert_eq!(code, Some(1), "{flags:?}: {stderr}");
        assert!(stderr.contains(flags[0]), "{flags:?}: {stderr}");
        assert!(stderr.contains("only apply to the in-process bench"), "{stderr}");
    }
    let (code, stderr) = bench(&["--device", "embedded", "--server"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("needs an operation"), "{stderr}");
}
