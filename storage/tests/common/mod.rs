//! A target and a host on two embedded NICs of one fabric, connected by the in-process
//! connection manager, with the target stepped by the host's reactor.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_hw_model::fabric::{FabricConfig, FaultPlan};
use rnic_storage::block::{BlockDevice, RamBackend};
use rnic_storage::nvmeof::host::{Host, HostConfig, HostError};
use rnic_storage::nvmeof::target::{AllowedHosts, Subsystem, Target, TargetConfig};
use rnic_storage::rdma::{Clock, DirectCm, EmbeddedReactor, ServiceAddress};
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric};
use rnic_verbs::Context;

pub const SUBNQN: &str = "nqn.2024-01.io.rnic-emu:test";
pub const ADDRESS: ServiceAddress = ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 4420);
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";

pub struct Rig {
    pub fabric: EmbeddedFabric,
    pub cm: DirectCm,
    pub target: Arc<Mutex<Target>>,
    pub device: Arc<dyn BlockDevice>,
    pub target_nic: EmbeddedDevice,
    host_macs: u16,
}

pub struct RigConfig {
    pub faults: FaultPlan,
    pub block_size: u32,
    pub blocks: u64,
    pub allowed_hosts: AllowedHosts,
    pub target: TargetConfig,
}

impl Default for RigConfig {
    fn default() -> Self {
        Self {
            faults: FaultPlan::none(),
            block_size: 512,
            blocks: 65536,
            allowed_hosts: AllowedHosts::Any,
            target: TargetConfig {
                listen: ADDRESS,
                ..TargetConfig::default()
            },
        }
    }
}

impl Rig {
    pub fn new(config: RigConfig) -> Self {
        let fabric = EmbeddedFabric::new(FabricConfig {
            faults: config.faults,
            ..FabricConfig::default()
        });
        let target_nic = fabric.add_nic([2, 0, 0, 0, 0, 1]);
        let cm = DirectCm::default();
        let listener = cm.listen(ADDRESS).unwrap();
        let mut subsystem = Subsystem::nvm(SUBNQN, config.allowed_hosts);
        let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(config.block_size, config.blocks).unwrap());
        subsystem.add_namespace(1, device.clone());
        let target = Target::new(
            Context::open(Box::new(target_nic.clone())).unwrap(),
            Box::new(listener),
            Clock::Virtual(fabric.clone()),
            config.target,
            vec![subsystem],
        )
        .unwrap();
        Self {
            fabric,
            cm,
            target: Arc::new(Mutex::new(target)),
            device,
            target_nic,
            host_macs: 0x10,
        }
    }

    pub fn target(&self) -> MutexGuard<'_, Target> {
        self.target.lock().unwrap()
    }

    pub fn reactor(&self) -> EmbeddedReactor {
        let mut reactor = EmbeddedReactor::new(self.fabric.clone());
        reactor.add(self.target.clone());
        reactor
    }

    pub fn host_config(&self) -> HostConfig {
        HostConfig {
            host_nqn: HOSTNQN.into(),
            subsystem_nqn: SUBNQN.into(),
            target: ADDRESS,
            io_queues: 2,
            ..HostConfig::default()
        }
    }

    /// A new NIC on the fabric and a host on it.
    pub fn connect(&mut self, config: HostConfig) -> Result<Host, HostError> {
        self.host_macs += 1;
        let [hi, lo] = self.host_macs.to_be_bytes();
        let nic = self.fabric.add_nic([2, 0, 0, 0, hi, lo]);
        Host::connect(
            Context::open(Box::new(nic)).unwrap(),
            Box::new(self.cm.connector()),
            Box::new(self.reactor()),
            config,
        )
    }

    /// Steps the target and lets virtual time pass for `nanoseconds`.
    pub fn run_for(&self, nanoseconds: u64) {
        let mut reactor = self.reactor();
        let until = self.fabric.now().as_nanos() + nanoseconds;
        while self.fabric.now().as_nanos() < until {
            use rnic_storage::rdma::Reactor;
            reactor.idle(false);
        }
    }
}
