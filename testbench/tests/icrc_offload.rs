//! The checksum offload of the in-process link (docs/architecture.md, "The wire between
//! NICs") as a user of rnic-bench sees it: a captured run's frames carry exact ICRCs, a
//! run under a corrupting fault plan still has every damaged frame caught by its receiver
//! (and its data arrives intact), and the offload changes no virtual result.

use rnic_hw_model::fabric::FaultPlan;
use rnic_hw_model::wire;
use rnic_pcap_check::roce;
use rnic_testbench::bench::{run, BenchConfig, Operation};

/// The ICRC the project's capture checker (`rnic-pcap-check`, written from the RoCEv2
/// annex and sharing no code with the model) recomputes, and the one on the wire.
fn icrc_recomputed_and_on_the_wire(frame: &[u8]) -> (u32, u32) {
    match roce::classify(frame) {
        roce::Classified::Roce(roce) => (roce.icrc_computed, roce.icrc_wire),
        other => panic!("not a checkable RoCEv2 frame: {other:?}"),
    }
}

fn config(operation: Operation, size: usize, iterations: u64) -> BenchConfig {
    BenchConfig {
        operation,
        size,
        iterations,
        mtu: 1024,
        ..BenchConfig::default()
    }
}

#[test]
fn every_captured_frame_carries_the_icrc_the_specification_gives() {
    for operation in [Operation::Write, Operation::Read, Operation::Send] {
        let (report, capture) = run(&BenchConfig {
            capture: true,
            ..config(operation, 3000, 40)
        })
        .expect("run");
        assert_eq!(report.messages_ok, 40, "{operation:?}");
        assert!(capture.len() >= 40 * 3, "{operation:?}: requests, responses and ACKs");
        for frame in &capture {
            let bytes = &frame.bytes;
            let at = bytes.len() - wire::icrc::ICRC_LEN;
            assert_ne!(
                bytes[at..],
                [0; 4],
                "{operation:?}: no frame leaves with the offload's zeros"
            );
            let (recomputed, on_the_wire) = icrc_recomputed_and_on_the_wire(bytes);
            assert_eq!(on_the_wire, recomputed, "{operation:?}");
            assert!(wire::parse_frame(bytes).is_ok(), "{operation:?}: the model's own check");
        }
    }
}

#[test]
fn frames_the_fault_plan_corrupts_are_caught_by_the_receiver() {
    let faults = FaultPlan::parse("corrupt=0.05,seed=19").unwrap();
    let (report, _) = run(&BenchConfig {
        faults,
        verify: true,
        ..config(Operation::Write, 16 * 1024, 40)
    })
    .expect("run");
    assert!(report.fabric.corrupted > 10, "{:?}", report.fabric);
    // Every damaged frame was dropped at the receiver (a damaged payload that got through
    // would fail the verification) and went again.
    assert_eq!(
        (report.messages_ok, report.messages_failed),
        (40, 0),
        "{:?}",
        report.failures
    );
    assert_eq!(report.bytes_verified, 40 * 16 * 1024);
    assert!(report.retransmissions > 0);
}

#[test]
fn a_capture_changes_no_virtual_result() {
    // With the capture on, the fabric computes every ICRC; without it, none: the model's
    // figures are the same either way.
    let plain = run(&config(Operation::Write, 65536, 6)).expect("run").0;
    let captured = run(&BenchConfig {
        capture: true,
        ..config(Operation::Write, 65536, 6)
    })
    .expect("run")
    .0;
    assert_eq!(plain.sim_time_ps, captured.sim_time_ps);
    assert_eq!(plain.frames, captured.frames);
    assert_eq!(plain.lat_us, captured.lat_us);
    assert_eq!(plain.requester_stages, captured.requester_stages);
}
