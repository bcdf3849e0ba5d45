//! An SRP target and initiators on embedded NICs of one fabric, connected by the
//! in-process connection manager, with the target stepped by the initiators' reactor.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_hw_model::fabric::{FabricConfig, FaultPlan};
use rnic_storage::block::{BlockDevice, RamBackend};
use rnic_storage::rdma::{Connector, DirectCm, EmbeddedReactor, Listener, RdmaCm, Reactor, ServiceAddress};
use rnic_storage::scsi::lu::{LogicalUnit, LuConfig, LunMap};
use rnic_storage::srp::initiator::{Initiator, InitiatorConfig, InitiatorError};
use rnic_storage::srp::target::{Target, TargetConfig};
use rnic_verbs::backend::EmbeddedFabric;
use rnic_verbs::Context;

pub const ADDRESS: ServiceAddress = ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 5555);

pub struct Rig {
    pub fabric: EmbeddedFabric,
    pub cm: DirectCm,
    pub target: Arc<Mutex<Target>>,
    /// LUN 0 and LUN 5.
    pub devices: Vec<Arc<dyn BlockDevice>>,
    macs: u16,
    rdma_cm: bool,
}

fn open(nic: rnic_verbs::backend::EmbeddedDevice, ip: Ipv4Addr) -> Context {
    let driver = rnic_verbs::driver::DriverConfig {
        ipv4_address: Some(ip.octets()),
        ..rnic_verbs::driver::DriverConfig::default()
    };
    Context::open_with_config(Box::new(nic), &driver).unwrap()
}

fn rdma_cm(fabric: &EmbeddedFabric, context: &Context, seed: u64) -> RdmaCm {
    RdmaCm::new(
        context,
        Arc::new(rnic_verbs::cm::FabricNeighbours(fabric.clone())),
        rnic_verbs::cm::CmConfig::seeded(seed),
    )
    .unwrap()
}

pub struct RigConfig {
    /// Connect through the RDMA CM on QP1 (REQ/REP/RTU on the wire) instead of the
    /// in-process connection manager.
    pub rdma_cm: bool,
    pub faults: FaultPlan,
    pub target: TargetConfig,
    pub blocks: u64,
}

impl Default for RigConfig {
    fn default() -> Self {
        Self {
            rdma_cm: false,
            faults: FaultPlan::none(),
            target: TargetConfig::default(),
            blocks: 16384,
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
        let context = open(target_nic, ADDRESS.ip);
        let listener: Box<dyn Listener> = if config.rdma_cm {
            Box::new(rdma_cm(&fabric, &context, 0x5555).listen(ADDRESS).unwrap())
        } else {
            Box::new(cm.listen(ADDRESS).unwrap())
        };
        let mut luns = LunMap::new();
        let mut devices = Vec::new();
        for (lun, block_size) in [(0u16, 512u32), (5, 4096)] {
            let device: Arc<dyn BlockDevice> =
                Arc::new(RamBackend::new(block_size, config.blocks * 512 / u64::from(block_size)).unwrap());
            luns.insert(
                lun,
                LogicalUnit::new(
                    device.clone(),
                    LuConfig {
                        serial: format!("test-lun-{lun}"),
                        ..LuConfig::default()
                    },
                ),
            );
            devices.push(device);
        }
        let target = Target::new(context, listener, config.target, luns).unwrap();
        Self {
            fabric,
            cm,
            target: Arc::new(Mutex::new(target)),
            devices,
            macs: 0x10,
            rdma_cm: config.rdma_cm,
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

    pub fn initiator_config(&self) -> InitiatorConfig {
        InitiatorConfig {
            target: ADDRESS,
            ..InitiatorConfig::default()
        }
    }

    /// A new NIC on the fabric and an initiator logged in from it.
    pub fn login(&mut self, config: InitiatorConfig) -> Result<Initiator, InitiatorError> {
        self.macs += 1;
        let [hi, lo] = self.macs.to_be_bytes();
        let nic = self.fabric.add_nic([2, 0, 0, 0, hi, lo]);
        let context = open(nic, Ipv4Addr::new(10, 0, 0, lo));
        let connector: Box<dyn Connector> = if self.rdma_cm {
            Box::new(rdma_cm(&self.fabric, &context, u64::from(self.macs)).connector())
        } else {
            Box::new(self.cm.connector())
        };
        Initiator::login(context, connector, Box::new(self.reactor()), config)
    }

    /// Steps the target and lets virtual time pass for `nanoseconds`.
    pub fn run_for(&self, nanoseconds: u64) {
        let mut reactor = self.reactor();
        let until = self.fabric.now().as_nanos() + nanoseconds;
        while self.fabric.now().as_nanos() < until {
            reactor.idle(false);
        }
    }
}

/// A recognisable pattern for `length` bytes at `seed`.
pub fn pattern(length: usize, seed: u32) -> Vec<u8> {
    (0..length as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed as u8)
        .collect()
}
