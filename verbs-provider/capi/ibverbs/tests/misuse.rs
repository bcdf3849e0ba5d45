//! Misuse through the C ABI: a C program compiled against the installed rdma-core
//! headers (libibverbs-dev) calls what rnic-emu does not support and checks each errno;
//! every refusal also leaves a `rnic::diag` line. And an application that exits without
//! destroying anything leaves nothing behind that hurts the next one.

mod common;

use common::{command, require, run_pair, wait_bounded};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Compiles tests/c/misuse.c (linked against the system's libibverbs for its symbol
/// versions; run on ours through LD_LIBRARY_PATH).
fn misuse_program() -> Option<PathBuf> {
    if !require("gcc") {
        return None;
    }
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        if std::env::var_os("RNIC_SKIP_RDMA_APPS").is_some() {
            return None;
        }
        panic!("libibverbs-dev is not installed (scripts/test installs it, as root)");
    }
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/misuse.c");
    let binary = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rnic-misuse");
    let output = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&binary)
        .arg(&source)
        .arg("-libverbs")
        .output()
        .expect("run gcc");
    assert!(
        output.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(binary)
}

#[test]
fn unsupported_features_fail_with_their_errno_and_a_diagnostic() {
    let Some(program) = misuse_program() else { return };
    let output = wait_bounded(
        command(program.to_str().unwrap(), &[], "udp:127.0.1.230")
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("0 failures"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    for feature in [
        "memory windows",
        "XRC",
        "on-demand paging",
        "device memory",
        "flow steering",
        "ibv_wr_*",
        "multicast",
        "is_global = 0",
    ] {
        assert!(
            stderr.contains("rnic::diag") && stderr.contains(feature),
            "no diagnostic about {feature}:\n{stderr}"
        );
    }
}

#[test]
fn an_application_that_leaks_everything_leaves_the_next_one_working() {
    let Some(program) = misuse_program() else { return };
    if !require("ibv_rc_pingpong") {
        return;
    }
    for _ in 0..2 {
        let output = wait_bounded(
            command(program.to_str().unwrap(), &["leak"], "udp:127.0.1.231")
                .spawn()
                .unwrap(),
            Duration::from_secs(30),
        );
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    }
    // The same address again, at once: the socket and the device are free.
    let result = run_pair(
        "ibv_rc_pingpong",
        &["-d", "rnic0", "-g", "1", "-c", "-n", "20", "-p", "19260"],
        "127.0.1.231",
        "127.0.1.232",
    );
    result.assert_success("ibv_rc_pingpong after leaking applications");
}
