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

fn soak(seed: u64, iterations: u64) -> rnic_testbench::bench::BenchReport {
    let faults: FaultPlan = format!("loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,seed={seed}")
        .parse()
        .unwrap();
    let config = BenchConfig {
        operation: Operation::Mixed,
        size: 3000,
        iterations,
        queue_pairs: 4,
        mtu: 1024,
        faults,
        verify: true,
        ..BenchConfig::default()
    };
    run(&config).expect("the run completes").0
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
