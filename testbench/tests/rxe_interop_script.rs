//! `scripts/rxe-interop` judges rxe's side by more than its exit status, and never passes
//! having tested nothing. The parts that need no guest run here: the case list is checked
//! before anything is built or booted, and the verdict on perftest's and rc_pingpong's
//! output (`scripts/lib/rxe-verdict.sh`) is held to sample outputs in their formats.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

#[test]
fn an_unknown_case_name_is_refused_before_anything_runs() {
    for cases in ["write no_such_case", "wirte", " "] {
        let mut child = Command::new(scripts().join("rxe-interop"))
            .arg("--lossless")
            .env("RXE_CASES", cases)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The refusal comes before any build, image or guest: seconds, not minutes.
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                child.kill().unwrap();
                let output = child.wait_with_output().unwrap();
                panic!(
                    "RXE_CASES={cases:?}: still running after 30 s instead of refusing: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "RXE_CASES={cases:?}: {stdout}{stderr}");
        assert!(!stdout.contains("all passed"), "{stdout}");
        assert!(stderr.contains("cases: write read send"), "{stderr}");
    }
}

/// `rxe_output_ok CASE ROLE SIZE ITERS OUTPUT` from the script's library.
fn verdict(case: &str, role: &str, size: u64, iters: u64, output: &str) -> bool {
    let library = scripts().join("lib/rxe-verdict.sh");
    let status = Command::new("bash")
        .arg("-c")
        .arg(r#". "$0" && rxe_output_ok "$1" "$2" "$3" "$4" "$5""#)
        .arg(&library)
        .args([case, role, &size.to_string(), &iters.to_string(), output])
        .status()
        .unwrap();
    status.success()
}

/// A perftest BW report in perftest's layout: banner, settings, the result table.
fn perftest_bw(title: &str, size: u64, iters: u64) -> String {
    let rule = "-".repeat(87);
    format!(
        "{rule}\n                    {title}\n Dual-port       : OFF\t\tDevice         : rxe0\n \
         Number of qps   : 1\t\tTransport type : IB\n Mtu             : 1024[B]\n{rule}\n \
         local address: LID 0000 QPN 0x0011 PSN 0x5d2a1c RKey 0x0001e4 VAddr 0x007f3c5e8c4000\n \
         remote address: LID 0000 QPN 0x0042 PSN 0x01a2b3 RKey 0x000301 VAddr 0x007f0012345000\n{rule}\n \
         #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n \
         {size:<10} {iters:<10}       29.61              29.34\t\t   0.007511\n{rule}\n"
    )
}

#[test]
fn a_perftest_side_must_report_the_size_and_count_asked_for() {
    let good = perftest_bw("RDMA_Write BW Test", 4096, 200);
    assert!(verdict("write", "client", 4096, 200, &good));
    assert!(verdict("write", "server", 4096, 200, &good));
    // A run of other messages, or fewer of them, is not the case that was asked for.
    assert!(!verdict(
        "write",
        "client",
        4096,
        200,
        &perftest_bw("RDMA_Write BW Test", 4096, 100)
    ));
    assert!(!verdict(
        "read",
        "client",
        4096,
        200,
        &perftest_bw("RDMA_Read BW Test", 1024, 200)
    ));
    assert!(!verdict("send", "server", 4096, 50, &good));
}

#[test]
fn a_perftest_side_that_printed_an_error_or_nothing_fails() {
    let mut broken = perftest_bw("RDMA_Write BW Test", 4096, 200);
    broken.push_str(" Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\n");
    assert!(!verdict("write", "client", 4096, 200, &broken));
    // A BW server reports the client's figures; silence means it saw no test.
    assert!(!verdict("write", "server", 4096, 200, ""));
    assert!(!verdict(
        "send",
        "server",
        4096,
        200,
        " Couldn't connect to 10.77.0.3:18601\n"
    ));
    // ib_write_lat prints its latency table on both sides.
    let latency = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n 2       200          40.12          310.5        55.20\n";
    assert!(verdict("write_lat", "client", 2, 200, latency));
    assert!(verdict("write_lat", "server", 2, 200, latency));
    assert!(!verdict(
        "write_lat",
        "server",
        2,
        200,
        &format!("{}\n", "-".repeat(87))
    ));
    assert!(!verdict(
        "write_lat",
        "server",
        2,
        200,
        &format!("{latency}Unable to create QP.\n")
    ));
}

#[test]
fn rc_pingpong_must_report_every_iteration_and_no_bad_data() {
    let good = "  local address:  LID 0x0000, QPN 0x000011, PSN 0x0a1b2c, GID ::ffff:10.77.0.2\n  \
                remote address: LID 0x0000, QPN 0x000042, PSN 0x3d4e5f, GID ::ffff:10.77.0.3\n\
                819200 bytes in 0.41 seconds = 15.98 Mbit/sec\n100 iters in 0.41 seconds = 4100.00 usec/iter\n";
    assert!(verdict("pingpong", "client", 4096, 100, good));
    assert!(!verdict(
        "pingpong",
        "client",
        4096,
        100,
        &format!("{good}Page 3 invalid data\n")
    ));
    let short = good.replace("100 iters", "60 iters").replace("819200", "491520");
    assert!(!verdict("pingpong", "client", 4096, 100, &short));
}
