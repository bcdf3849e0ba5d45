//! Our host against our target, two embedded NICs on one fabric, connected by the
//! in-process connection manager.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use rnic_hw_model::fabric::FabricConfig;
use rnic_storage::block::{BlockDevice, RamBackend};
use rnic_storage::nvmeof::host::{Host, HostConfig};
use rnic_storage::nvmeof::target::{AllowedHosts, Subsystem, Target, TargetConfig};
use rnic_storage::rdma::{Clock, DirectCm, EmbeddedReactor, ServiceAddress};
use rnic_verbs::backend::EmbeddedFabric;
use rnic_verbs::Context;

const SUBNQN: &str = "nqn.2024-01.io.rnic-emu:test";
const ADDRESS: ServiceAddress = ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 4420);

fn setup() -> (Arc<Mutex<Target>>, Host) {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let target_nic = fabric.add_nic([2, 0, 0, 0, 0, 1]);
    let host_nic = fabric.add_nic([2, 0, 0, 0, 0, 2]);
    let cm = DirectCm::default();
    let listener = cm.listen(ADDRESS).unwrap();
    let mut subsystem = Subsystem::nvm(SUBNQN, AllowedHosts::Any);
    let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(512, 16384).unwrap());
    subsystem.add_namespace(1, device);
    let target = Target::new(
        Context::open(Box::new(target_nic)).unwrap(),
        Box::new(listener),
        Clock::Virtual(fabric.clone()),
        TargetConfig {
            listen: ADDRESS,
            ..TargetConfig::default()
        },
        vec![subsystem],
    )
    .unwrap();
    let target = Arc::new(Mutex::new(target));
    let mut reactor = EmbeddedReactor::new(fabric);
    reactor.add(target.clone());
    let host = Host::connect(
        Context::open(Box::new(host_nic)).unwrap(),
        Box::new(cm.connector()),
        Box::new(reactor),
        HostConfig {
            subsystem_nqn: SUBNQN.into(),
            target: ADDRESS,
            io_queues: 2,
            ..HostConfig::default()
        },
    )
    .unwrap();
    (target, host)
}

#[test]
fn connects_identifies_writes_and_reads_back() {
    let (target, mut host) = setup();
    assert_eq!(host.io_queues(), 2);
    assert_eq!(host.controller().subnqn, SUBNQN);
    let ns = host.namespace(1).unwrap();
    assert_eq!((ns.block_size, ns.blocks), (512, 16384));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    host.write(1, 100, &data).unwrap();
    let mut back = vec![0u8; 8192];
    host.read(1, 100, &mut back).unwrap();
    assert_eq!(back, data);
    // In-capsule (512 B) and keyed (64 KiB) writes.
    host.write(1, 0, &[0xAB; 512]).unwrap();
    let big: Vec<u8> = (0..65536u32).map(|i| (i >> 3) as u8).collect();
    host.write(1, 1000, &big).unwrap();
    let mut back = vec![0u8; 65536];
    host.read(1, 1000, &mut back).unwrap();
    assert_eq!(back, big);
    assert_eq!(target.lock().unwrap().controller_count(), 1);
    host.disconnect().unwrap();
}

#[test]
fn the_tcp_exchange_connects_queues_too() {
    use rnic_storage::rdma::{ExchangeCm, Listener};
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let target_nic = fabric.add_nic([2, 0, 0, 0, 0, 1]);
    let host_nic = fabric.add_nic([2, 0, 0, 0, 0, 2]);
    let cm = ExchangeCm::default();
    let listener = cm.listen(ServiceAddress::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let address = listener.address();
    assert_ne!(address.port, 0);
    let mut subsystem = Subsystem::nvm(SUBNQN, AllowedHosts::Any);
    subsystem.add_namespace(1, Arc::new(RamBackend::new(512, 1024).unwrap()));
    let target = Target::new(
        Context::open(Box::new(target_nic)).unwrap(),
        Box::new(listener),
        Clock::Virtual(fabric.clone()),
        TargetConfig {
            listen: address,
            ..TargetConfig::default()
        },
        vec![subsystem],
    )
    .unwrap();
    let target = Arc::new(Mutex::new(target));
    let mut reactor = EmbeddedReactor::new(fabric);
    reactor.add(target.clone());
    let mut host = Host::connect(
        Context::open(Box::new(host_nic)).unwrap(),
        Box::new(cm.connector()),
        Box::new(reactor),
        HostConfig {
            subsystem_nqn: SUBNQN.into(),
            target: address,
            ..HostConfig::default()
        },
    )
    .unwrap();
    host.write(1, 3, &[7; 1024]).unwrap();
    let mut back = [0u8; 1024];
    host.read(1, 3, &mut back).unwrap();
    assert_eq!(back, [7; 1024]);
    host.disconnect().unwrap();
}
