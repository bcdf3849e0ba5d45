//! The SRP benchmark workload with verification, ours to ours on embedded NICs: queue
//! depths 1 to 64, reads, writes and mixes, descriptor forms, and a faulty wire.

mod srp_common;

use rnic_hw_model::fabric::FaultPlan;
use rnic_storage::nvmeof::perf::{Pattern, TimeMode};
use rnic_storage::srp::initiator::InitiatorConfig;
use rnic_storage::srp::perf::{run, Workload};
use srp_common::{Rig, RigConfig};

fn verified(lun: u16, io_size: u32, queue_depth: usize, read_percent: u8, ios: u64) -> Workload {
    Workload {
        lun,
        io_size,
        queue_depth,
        read_percent,
        pattern: Pattern::Random,
        ios: Some(ios),
        verify: true,
        region_blocks: Some(4096),
        mode: TimeMode::Virtual,
        ..Workload::default()
    }
}

#[test]
fn verified_mixes_at_queue_depths_1_to_64() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    for (qd, io_size, reads) in [
        (1, 512, 50),
        (2, 4096, 0),
        (4, 8192, 70),
        (8, 16384, 50),
        (16, 4096, 100),
        (32, 4096, 50),
        (64, 16384, 30),
    ] {
        let report = run(&mut initiator, &verified(0, io_size, qd, reads, 400), &mut |_| {}).unwrap();
        assert_eq!(report.ios, 400, "QD {qd}: {:?}", report.failures);
        assert_eq!(
            (report.errors, report.verify_failures),
            (0, 0),
            "QD {qd}: {:?}",
            report.failures
        );
        assert!(report.verified_reads > 0 || reads == 0, "QD {qd}");
        assert!(report.iops > 0.0);
    }
    let target = rig.target().counters().clone();
    assert_eq!(target.credit_overruns + target.malformed_ius + target.rdma_errors, 0);
}

#[test]
fn verified_reads_through_indirect_tables_on_a_4k_unit() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig
        .login(InitiatorConfig {
            descriptor_chunk: Some(4096),
            immediate_data: false,
            ..rig.initiator_config()
        })
        .unwrap();
    let report = run(&mut initiator, &verified(5, 32768, 16, 100, 300), &mut |_| {}).unwrap();
    assert_eq!(
        (report.ios, report.errors, report.verify_failures),
        (300, 0, 0),
        "{:?}",
        report.failures
    );
}

#[test]
fn nothing_is_lost_or_corrupted_through_a_faulty_wire() {
    let faults = FaultPlan::parse("loss=0.02,dup=0.01,reorder=0.01,corrupt=0.002,seed=16").unwrap();
    let mut rig = Rig::new(RigConfig {
        faults,
        ..RigConfig::default()
    });
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    for qd in [1usize, 8, 64] {
        let report = run(&mut initiator, &verified(0, 8192, qd, 50, 300), &mut |_| {}).unwrap();
        assert_eq!(
            (report.ios, report.errors, report.verify_failures),
            (300, 0, 0),
            "QD {qd}: {:?}",
            report.failures
        );
    }
    let statistics = rig.fabric.statistics();
    assert!(
        statistics.dropped + statistics.corrupted + statistics.duplicated + statistics.reordered > 0,
        "the wire did something: {statistics:?}"
    );
    let target = rig.target().counters().clone();
    assert_eq!(target.rdma_errors, 0);
}
