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

#[test]
fn through_the_rdma_cm_on_a_lossy_wire() {
    use rnic_storage::block::{BlockDevice, RamBackend};
    use rnic_storage::nvmeof::embedded::{CmKind, EmbeddedSession, EmbeddedSetup};
    use rnic_storage::nvmeof::target::{AllowedHosts, Subsystem};
    use std::sync::Arc;

    let mut subsystem = Subsystem::nvm(common::SUBNQN, AllowedHosts::Any);
    let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(512, 8192).unwrap());
    subsystem.add_namespace(1, device);
    let mut session = EmbeddedSession::new(
        EmbeddedSetup {
            faults: FaultPlan::parse("loss=0.01,dup=0.005,reorder=0.01,corrupt=0.002,seed=21").unwrap(),
            cm: CmKind::Rdma { seed: 21 },
            ..EmbeddedSetup::default()
        },
        vec![subsystem],
    )
    .unwrap();
    let mut host = session
        .connect(HostConfig {
            subsystem_nqn: common::SUBNQN.into(),
            io_queues: 2,
            // A lost CM message is sent again after the CM's response timeout (about 4.6 s).
            connect_timeout_ns: 60_000_000_000,
            command_timeout_ns: 60_000_000_000,
            ..HostConfig::default()
        })
        .unwrap();
    let report = perf::run(
        &mut host,
        &Workload {
            io_size: 4096,
            queue_depth: 16,
            queues: 2,
            read_percent: 50,
            ios: Some(2000),
            verify: true,
            region_blocks: Some(2048),
            ..Workload::default()
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        (report.errors, report.verify_failures, report.ios),
        (0, 0, 2000),
        "{}",
        report.to_table()
    );
    assert!(report.verified_reads > 100);
    host.disconnect().unwrap();
}
