//! Ours ↔ ours through a faulty wire (loss, duplication, reordering, corruption): the RC
//! transport recovers underneath, and NVMe-oF sees nothing lost or corrupted.

mod common;

use common::{Rig, RigConfig};
use rnic_hw_model::fabric::FaultPlan;
use rnic_storage::nvmeof::host::HostConfig;
use rnic_storage::nvmeof::perf::{self, Pattern, Workload};

fn run(faults: &str, io_size: u32, queue_depth: usize, ios: u64) {
    let faults = FaultPlan::parse(faults).unwrap();
    let mut rig = Rig::new(RigConfig {
        faults,
        blocks: 1 << 16,
        ..RigConfig::default()
    });
    let mut host = rig
        .connect(HostConfig {
            io_queues: 2,
            data_pool_bytes: (queue_depth * io_size as usize).max(1 << 20),
            // A lossy link may hold a command for a few retransmission timeouts.
            command_timeout_ns: 60_000_000_000,
            ..rig.host_config()
        })
        .unwrap();
    let report = perf::run(
        &mut host,
        &Workload {
            io_size,
            queue_depth,
            queues: 2,
            read_percent: 50,
            pattern: Pattern::Random,
            ios: Some(ios),
            verify: true,
            region_blocks: Some((queue_depth as u64 * 2 * 4 * u64::from(io_size) / 512).min(1 << 16)),
            ..Workload::default()
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.errors, 0, "{}", report.to_table());
    assert_eq!(report.verify_failures, 0, "{}", report.to_table());
    assert_eq!(report.ios, ios);
    assert!(report.verified_reads >= ios / 8, "{}", report.to_table());
    let statistics = rig.fabric.statistics();
    assert!(
        statistics.dropped + statistics.corrupted + statistics.duplicated + statistics.reordered > 0,
        "the wire did something: {statistics:?}"
    );
    let target = rig.target();
    assert_eq!(target.counters().commands_failed, 0);
    assert_eq!(target.counters().rdma_errors, 0);
    drop(target);
    host.disconnect().unwrap();
}

#[test]
fn small_ios_through_loss_duplication_reordering_and_corruption() {
    run("loss=0.02,dup=0.01,reorder=0.02,corrupt=0.005,seed=11", 4096, 32, 3000);
}

#[test]
fn large_ios_through_loss_and_reordering() {
    run("loss=0.01,reorder=0.02,dup=0.005,seed=12", 256 << 10, 8, 200);
}
