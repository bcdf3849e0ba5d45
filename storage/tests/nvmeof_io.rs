//! Ours ↔ ours on two embedded NICs: reads and writes of 4 KiB to 1 MiB at queue depths
//! 1 to 128 over several I/O queues, every read checked against what was written.

mod common;

use common::{Rig, RigConfig};
use rnic_storage::nvmeof::perf::{self, Pattern, TimeMode, Workload};

fn run(io_size: u32, queue_depth: usize, queues: u16, ios: u64, read_percent: u8) {
    let mut rig = Rig::new(RigConfig {
        blocks: 1 << 17, // 64 MiB of 512-byte blocks
        ..RigConfig::default()
    });
    let mut host = rig
        .connect(rnic_storage::nvmeof::host::HostConfig {
            io_queues: queues,
            queue_entries: 128,
            data_pool_bytes: (queue_depth * io_size as usize).max(1 << 20),
            ..rig.host_config()
        })
        .unwrap();
    let report = perf::run(
        &mut host,
        &Workload {
            // Four units per I/O outstanding: reads often find units written earlier.
            region_blocks: Some(
                ((queue_depth * usize::from(queues) * 4) as u64 * u64::from(io_size) / 512).min(64 << 11),
            ),
            io_size,
            queue_depth,
            queues: usize::from(queues),
            read_percent,
            pattern: Pattern::Random,
            ios: Some(ios),
            verify: true,
            mode: TimeMode::Virtual,
            ..Workload::default()
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.errors, 0, "{}", report.to_table());
    assert_eq!(report.verify_failures, 0, "{}", report.to_table());
    assert_eq!(report.ios, ios);
    assert!(report.verified_reads >= ios / 8, "{}", report.to_table());
    let target = rig.target();
    let counters = target.counters();
    assert_eq!(counters.rdma_errors, 0);
    assert_eq!(counters.commands_failed, 0);
    drop(target);
    host.disconnect().unwrap();
}

#[test]
fn four_kib_at_queue_depth_one() {
    run(4096, 1, 1, 400, 50);
}

#[test]
fn four_kib_at_queue_depth_128_on_four_queues() {
    run(4096, 128, 4, 4000, 50);
}

#[test]
fn sixty_four_kib_at_queue_depth_32_on_two_queues() {
    run(65536, 32, 2, 800, 50);
}

#[test]
fn one_mib_at_queue_depth_one() {
    run(1 << 20, 1, 1, 24, 50);
}

#[test]
fn one_mib_at_queue_depth_32_on_two_queues() {
    run(1 << 20, 32, 2, 256, 50);
}

#[test]
fn one_hundred_twenty_eight_kib_at_queue_depth_128() {
    run(128 << 10, 128, 1, 1000, 50);
}

#[test]
fn verified_read_only_run_writes_the_region_first() {
    let mut rig = Rig::new(RigConfig {
        blocks: 2048,
        ..RigConfig::default()
    });
    let mut host = rig.connect(rig.host_config()).unwrap();
    let report = perf::run(
        &mut host,
        &Workload {
            io_size: 4096,
            queue_depth: 16,
            read_percent: 100,
            ios: Some(500),
            verify: true,
            ..Workload::default()
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!((report.errors, report.verify_failures), (0, 0));
    assert_eq!(report.verified_reads, 500);
}
