//! A seeded soak through the faulty wire: RC messages of mixed operations (WRITE, READ,
//! SEND, fetch-and-add) over 5 % loss, 1 % duplication, 1 % reordering and 0.1 %
//! corruption. Zero lost, zero corrupted, every message completed exactly once and in
//! order, every payload checked, and the per-QP payload digests equal (the scoreboard in
//! `rnic_testbench::bench`).
//!
//! CI runs 10 000 messages; the 100 000-message soak is one command (README, "Testing"):
//! `cargo run --release -p rnic-testbench --bin rnic-bench -- mixed --size 3000 --mtu 1024
//! --qps 4 --iters 25000 --faults loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,seed=1 --verify`

use rnic_hw_model::fabric::FaultPlan;
use rnic_testbench::bench::{run, BenchConfig, Operation};
use rnic_testbench::recording::{recording_text, replay};

fn soak(seed: u64, iterations: u64) -> rnic_testbench::bench::BenchReport {
    run(&soak_config(seed, iterations)).expect("the run completes").0
}

fn soak_config(seed: u64, iterations: u64) -> BenchConfig {
    let faults: FaultPlan = format!("loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,seed={seed}")
        .parse()
        .unwrap();
    BenchConfig {
        operation: Operation::Mixed,
        size: 3000,
        iterations,
        queue_pairs: 4,
        mtu: 1024,
        faults,
        verify: true,
        ..BenchConfig::default()
    }
}

#[test]
fn ten_thousand_mixed_messages_survive_a_faulty_wire_exactly_once_and_in_order() {
    let report = soak(1, 2_500);
    assert_eq!(report.messages_failed, 0, "{}", report.to_text());
    assert_eq!(report.messages_ok, 10_000, "{}", report.to_text());
    assert!(report.bytes_verified > 10_000_000, "{}", report.to_text());
    // The wire really was broken, and the transport really recovered.
    let fabric = report.fabric;
    assert!(
        fabric.dropped > 100 && fabric.duplicated > 10 && fabric.reordered > 10 && fabric.corrupted > 0,
        "{fabric:?}"
    );
    assert!(report.retransmissions > 0);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let first = soak(9, 200);
    let second = soak(9, 200);
    assert_eq!(first.messages_failed, 0, "{}", first.to_text());
    assert_eq!(
        (first.frames, first.retransmissions, first.sim_time_ps, first.fabric),
        (second.frames, second.retransmissions, second.sim_time_ps, second.fabric)
    );
    let other = soak(10, 200);
    assert_ne!(
        (first.frames, first.sim_time_ps),
        (other.frames, other.sim_time_ps),
        "another seed, another run"
    );
}

#[test]
fn a_recorded_faulty_wire_soak_replays_to_the_same_frames_cqes_and_json_byte_for_byte() {
    let config = BenchConfig {
        record: true,
        ..soak_config(5, 60)
    };
    let (report, _) = run(&config).expect("the run completes");
    assert_eq!(report.messages_failed, 0, "{}", report.to_text());
    let fabric = report.fabric;
    assert!(
        fabric.dropped > 0 && fabric.duplicated + fabric.reordered > 0,
        "a faulty wire: {fabric:?}"
    );
    let recorded = recording_text(&config, &report);
    let count = |event: &str| recorded.matches(&format!("{{\"event\":\"{event}\"")).count();
    assert_eq!(count("frame_out") as u64, report.frames, "every frame the NICs sent");
    assert!(count("frame_in") > 0 && count("cqe") as u64 >= report.messages_ok);
    assert!(recorded.lines().last().unwrap().contains("\"messages_ok\":240"));

    let lines = replay(&config, &recorded).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lines, recorded.lines().count());

    // A replay that differs names the first line that does, with both sides.
    let tampered = recorded.replacen(
        "\"event\":\"cqe\",\"nic\":\"requester\",\"time_ps\":",
        "\"event\":\"cqe\",\"nic\":\"requester\",\"time_ps\":1",
        1,
    );
    let first_cqe = recorded
        .lines()
        .position(|l| l.starts_with("{\"event\":\"cqe\",\"nic\":\"requester\""))
        .unwrap()
        + 1;
    let error = replay(&config, &tampered).unwrap_err();
    assert!(
        error.starts_with(&format!(
            "first divergence at line {first_cqe}: recorded {{\"event\":\"cqe\""
        )),
        "{error}"
    );
    // Another seed is another run: the recording does not replay.
    let error = replay(
        &BenchConfig {
            record: true,
            ..soak_config(6, 60)
        },
        &recorded,
    )
    .unwrap_err();
    assert!(error.starts_with("first divergence at line 1:"), "{error}");
}
