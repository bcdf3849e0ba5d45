//! What a host does with the target: discovery, admin commands, the NVM commands,
//! keep-alive on both ends, reconnection, SEND WITH INVALIDATE, asynchronous events.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use common::{Rig, RigConfig, ADDRESS, SUBNQN};
use rnic_storage::block::{BlockDevice, RamBackend};
use rnic_storage::nvmeof::host::{Host, HostConfig, HostError};
use rnic_storage::nvmeof::perf::{self, Workload};
use rnic_storage::nvmeof::wire::cm::parse_cm_request;
use rnic_storage::nvmeof::wire::command::{feature, log_page};
use rnic_storage::nvmeof::wire::identify::NamespaceDescriptor;
use rnic_storage::nvmeof::wire::log::{ErrorLogEntry, ErrorLogEntryRepr, SmartLog, SmartLogRepr};
use rnic_storage::nvmeof::wire::status::Status;
use rnic_storage::rdma::direct::DirectConnector;
use rnic_storage::rdma::{ConnectParams, ConnectResult, ConnectionError, Connector, PendingConnect};
use rnic_verbs::{Context, QueuePair};

#[test]
fn discovery_lists_the_subsystem() {
    let mut rig = Rig::new(RigConfig::default());
    let nic = rig.fabric.add_nic([2, 0, 0, 0, 0, 0x42]);
    let entries = Host::discover(
        Context::open(Box::new(nic)).unwrap(),
        Box::new(rig.cm.connector()),
        Box::new(rig.reactor()),
        rig.host_config(),
    )
    .unwrap();
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(entry.subnqn, SUBNQN);
    assert_eq!(entry.trsvcid, "4420");
    assert_eq!(entry.traddr, ADDRESS.ip.to_string());
    assert_eq!((entry.trtype, entry.adrfam, entry.subtype), (1, 1, 2));
    rig.run_for(1_000_000);
    let target = rig.target();
    assert_eq!(
        target.controller_count(),
        0,
        "the discovery controller went with its host"
    );
    assert_eq!(target.queue_count(), 0);
    drop(target);
    let _ = rig.connect(rig.host_config()).unwrap();
}

#[test]
fn admin_commands_describe_the_controller_and_namespace() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(rig.host_config()).unwrap();
    let id = host.identify_controller().unwrap();
    assert_eq!(id.cntlid, host.cntlid());
    assert_eq!(id.nn, 1);
    assert_eq!(host.active_namespaces().unwrap(), vec![1]);
    let descriptors = host.namespace_descriptors(1).unwrap();
    assert!(descriptors.iter().any(|d| matches!(d, NamespaceDescriptor::Uuid(_))));
    assert!(descriptors.iter().any(|d| matches!(d, NamespaceDescriptor::Nguid(_))));
    assert_eq!(host.get_features(feature::KEEP_ALIVE_TIMER).unwrap(), 5000);
    assert_eq!(host.get_features(feature::NUMBER_OF_QUEUES).unwrap(), 1 << 16 | 1);
    // An error goes to the error log; SMART counts what moved.
    host.write(1, 0, &[1; 4096]).unwrap();
    assert!(matches!(
        host.identify_namespace(77),
        Ok(ns) if ns.nsze == 0
    ));
    let error = host.write(1, u64::MAX - 1, &[0; 512]);
    assert!(matches!(
        error,
        Err(HostError::Command {
            status: Status::LBA_OUT_OF_RANGE,
            ..
        })
    ));
    let page = host.get_log_page(log_page::ERROR, 0, 0, 64).unwrap();
    let entry = ErrorLogEntryRepr::parse(&ErrorLogEntry::new_checked(&page[..]).unwrap()).unwrap();
    assert_eq!(
        (entry.status, entry.sqid, entry.error_count),
        (Status::LBA_OUT_OF_RANGE, 1, 1)
    );
    let page = host.get_log_page(log_page::SMART, u32::MAX, 0, 512).unwrap();
    let smart = SmartLogRepr::parse(&SmartLog::new_checked(&page[..]).unwrap()).unwrap();
    assert_eq!(smart.host_write_commands, 1);
    assert_eq!(smart.data_units_written, 1);
    assert!(matches!(
        host.get_log_page(0x7E, 0, 0, 512),
        Err(HostError::Command {
            status: Status::INVALID_LOG_PAGE,
            ..
        })
    ));
    assert!(matches!(
        host.set_features(0x42, 0),
        Err(HostError::Command {
            status: Status::INVALID_FIELD,
            ..
        })
    ));
}

#[test]
fn nvm_commands_reach_the_block_device() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(rig.host_config()).unwrap();
    host.write(1, 10, &[0xAB; 4096]).unwrap();
    host.flush(1).unwrap();
    host.flush(u32::MAX).unwrap();
    host.write_zeroes(1, 11, 2, false).unwrap();
    host.deallocate(1, &[(14, 1), (17, 1)]).unwrap();
    let mut back = vec![0u8; 4096];
    host.read(1, 10, &mut back).unwrap();
    let expect: Vec<u8> = (0..8)
        .flat_map(|i| {
            if matches!(i, 1 | 2 | 4 | 7) {
                [0u8; 512]
            } else {
                [0xAB; 512]
            }
        })
        .collect();
    assert_eq!(back, expect);
    let mut direct = vec![0u8; 4096];
    rig.device.read(10, &mut direct).unwrap();
    assert_eq!(direct, expect, "the device holds what the host read");
    // Deallocation beyond the namespace deallocates nothing.
    assert!(matches!(
        host.deallocate(1, &[(10, 1), (1 << 40, 1)]),
        Err(HostError::Command {
            status: Status::LBA_OUT_OF_RANGE,
            ..
        })
    ));
    host.read(1, 10, &mut back).unwrap();
    assert_eq!(back, expect);
}

#[test]
fn send_with_invalidate_when_the_host_asks() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig
        .connect(HostConfig {
            invalidate: true,
            in_capsule_data: false,
            ..rig.host_config()
        })
        .unwrap();
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 3) as u8).collect();
    host.write(1, 64, &data).unwrap();
    let mut back = vec![0u8; 16384];
    host.read(1, 64, &mut back).unwrap();
    assert_eq!(back, data);
    let counters = *host.counters();
    // Connect data of the I/O queues, Identify, the write and the read.
    assert!(counters.invalidations >= 4, "{counters:?}");
    assert_eq!(counters.invalidation_mismatches, 0);
}

#[test]
fn a_vanished_host_is_cleaned_up_when_its_keep_alive_expires() {
    let mut rig = Rig::new(RigConfig::default());
    let host = rig
        .connect(HostConfig {
            kato_ms: 2000,
            ..rig.host_config()
        })
        .unwrap();
    assert_eq!(rig.target().queue_count(), 3);
    host.vanish();
    rig.run_for(1_500_000_000);
    assert_eq!(rig.target().controller_count(), 1, "still within KATO");
    rig.run_for(1_000_000_000);
    let target = rig.target();
    assert_eq!(target.controller_count(), 0);
    assert_eq!(target.queue_count(), 0);
    assert_eq!(target.counters().keep_alive_expirations, 1);
}

#[test]
fn a_live_host_keeps_its_controller_with_keep_alives() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig
        .connect(HostConfig {
            kato_ms: 2000,
            ..rig.host_config()
        })
        .unwrap();
    let until = host.now() + 10_000_000_000;
    while host.now() < until {
        host.poll(&mut Vec::new()).unwrap();
        host.reactor().idle(false);
    }
    assert!(host.counters().keep_alives >= 8, "{:?}", host.counters());
    assert_eq!(rig.target().counters().keep_alive_expirations, 0);
    assert_eq!(rig.target().controller_count(), 1);
}

#[test]
fn a_disconnect_frees_everything_on_the_target() {
    let mut rig = Rig::new(RigConfig::default());
    for _ in 0..3 {
        let host = rig.connect(rig.host_config()).unwrap();
        host.disconnect().unwrap();
        rig.run_for(1_000_000);
        let target = rig.target();
        assert_eq!((target.controller_count(), target.queue_count()), (0, 0));
    }
}

/// A connector whose first request for queue 1 is lost on the way: no answer ever comes.
struct LoseFirstRequestOfQueue1 {
    inner: DirectConnector,
    lost: Arc<AtomicU32>,
}

struct NoAnswer;

impl PendingConnect for NoAnswer {
    fn poll(&mut self, _qp: &QueuePair) -> Option<ConnectResult> {
        None
    }
}

impl Connector for LoseFirstRequestOfQueue1 {
    fn connect(
        &mut self,
        context: &Context,
        qp: &QueuePair,
        params: &ConnectParams,
    ) -> Result<Box<dyn PendingConnect>, ConnectionError> {
        let qid = parse_cm_request(&params.private_data).unwrap().qid;
        if qid == 1 && self.lost.fetch_add(1, Ordering::Relaxed) == 0 {
            return Ok(Box::new(NoAnswer));
        }
        self.inner.connect(context, qp, params)
    }
}

#[test]
fn a_queue_whose_connection_request_is_lost_is_asked_for_again() {
    let rig = Rig::new(RigConfig::default());
    let nic = rig.fabric.add_nic([2, 0, 0, 0, 0, 0x43]);
    let lost = Arc::new(AtomicU32::new(0));
    let start = rig.fabric.now().as_nanos();
    let mut host = Host::connect(
        Context::open(Box::new(nic)).unwrap(),
        Box::new(LoseFirstRequestOfQueue1 {
            inner: rig.cm.connector(),
            lost: lost.clone(),
        }),
        Box::new(rig.reactor()),
        rig.host_config(),
    )
    .unwrap();
    assert_eq!(lost.load(Ordering::Relaxed), 2, "queue 1 was asked for twice");
    assert!(
        rig.fabric.now().as_nanos() - start >= HostConfig::default().connect_timeout_ns,
        "the second request went out after the connect budget of the first"
    );
    host.write(1, 0, &[7; 4096]).unwrap();
    let mut back = vec![0; 4096];
    host.read(1, 0, &mut back).unwrap();
    assert_eq!(back, vec![7; 4096]);
    assert_eq!(rig.target().queue_count(), 3, "admin and two I/O queues, no orphan");
}

#[test]
fn the_host_reconnects_and_finishes_its_io_after_losing_the_controller() {
    let mut rig = Rig::new(RigConfig {
        blocks: 8192,
        ..RigConfig::default()
    });
    let mut host = rig
        .connect(HostConfig {
            reconnect_delay_ns: 10_000_000,
            ..rig.host_config()
        })
        .unwrap();
    let target = rig.target.clone();
    let cntlid = host.cntlid();
    // Drop the controller in the middle of a verified run.
    let mut dropped = false;
    let report = perf::run(
        &mut host,
        &Workload {
            io_size: 4096,
            queue_depth: 16,
            queues: 2,
            read_percent: 50,
            ios: Some(4000),
            verify: true,
            region_blocks: Some(1024),
            ..Workload::default()
        },
        &mut |progress| {
            if !dropped && progress.ios >= 1000 {
                dropped = true;
                target.lock().unwrap().disconnect_controller(cntlid);
            }
        },
    )
    .unwrap();
    assert!(dropped);
    assert_eq!(report.reconnects, 1, "{}", report.to_table());
    assert_eq!(report.errors, 0, "{}", report.to_table());
    assert_eq!(report.verify_failures, 0, "{}", report.to_table());
    assert_eq!(report.ios, 4000);
    assert_eq!(host.counters().reconnects, 1);
    assert_ne!(host.cntlid(), cntlid, "a new controller");
}

#[test]
fn a_host_learns_of_a_new_namespace() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(rig.host_config()).unwrap();
    let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(4096, 64).unwrap());
    rig.target().add_namespace(SUBNQN, 2, device).unwrap();
    let mut events = Vec::new();
    for _ in 0..1000 {
        host.poll(&mut Vec::new()).unwrap();
        events.extend(host.take_events());
        if !events.is_empty() {
            break;
        }
        host.reactor().idle(false);
    }
    assert_eq!(
        events,
        vec![0x0004_0002],
        "a notice: namespace attribute changed, log page 4"
    );
    let changed = host.get_log_page(log_page::CHANGED_NAMESPACES, 0, 0, 8).unwrap();
    assert_eq!(&changed[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    host.refresh_namespaces().unwrap();
    assert_eq!(host.namespaces().len(), 2);
    host.write(2, 5, &[9; 4096]).unwrap();
    let mut back = vec![0; 4096];
    host.read(2, 5, &mut back).unwrap();
    assert_eq!(back, vec![9; 4096]);
}
