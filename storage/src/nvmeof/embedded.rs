//! A target and its hosts in one process, on embedded NICs of one fabric (virtual time,
//! the timing model, optional faults and capture), connected by the in-process
//! connection manager: what `rnic-nvme-perf` runs without `--device`, and a rig for
//! tests.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_hw_model::fabric::{CapturedFrame, FabricConfig, FaultPlan};
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::timing::TimingParams;
use rnic_hw_model::DeviceConfig;
use rnic_verbs::backend::{EmbeddedConfig, EmbeddedFabric};
use rnic_verbs::Context;

use super::host::{Host, HostConfig, HostError};
use super::target::{Subsystem, Target, TargetConfig, TargetError};
use crate::rdma::reactor::Pace;
use crate::rdma::{Clock, Connector, DirectCm, EmbeddedReactor, Listener, RcPathConfig, RdmaCm, ServiceAddress};

/// The target's address on the embedded fabric.
pub const TARGET_ADDRESS: ServiceAddress = ServiceAddress::new(Ipv4Addr::new(192, 168, 1, 2), 4420);

/// Which connection manager connects the session's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmKind {
    /// The in-process one: QPs connected directly, nothing on the wire.
    Direct,
    /// The RDMA CM on QP1 of every NIC: REQ/REP/RTU on the wire, as with Linux.
    Rdma {
        /// Seed of the connection managers (communication IDs, PSNs, ports).
        seed: u64,
    },
}

/// How to build an embedded session.
#[derive(Debug, Clone)]
pub struct EmbeddedSetup {
    /// Timing-model parameters of every NIC.
    pub timing: TimingParams,
    /// Propagation and switch latency of the wire.
    pub link_latency: Picoseconds,
    /// Faults on the wire.
    pub faults: FaultPlan,
    /// Record every frame (for a pcap file).
    pub capture: bool,
    /// How the reactor lets time pass when nothing happened.
    pub pace: Pace,
    /// Transport settings of every QP.
    pub path: RcPathConfig,
    /// The target.
    pub target: TargetConfig,
    /// The connection manager.
    pub cm: CmKind,
}

impl Default for EmbeddedSetup {
    fn default() -> Self {
        let timing = TimingParams::default();
        Self {
            link_latency: Picoseconds(timing.propagation_ps),
            timing,
            faults: FaultPlan::none(),
            capture: false,
            pace: Pace::NextEvent,
            path: RcPathConfig::default(),
            target: TargetConfig {
                listen: TARGET_ADDRESS,
                ..TargetConfig::default()
            },
            cm: CmKind::Direct,
        }
    }
}

/// A target on an embedded NIC, ready for hosts.
pub struct EmbeddedSession {
    fabric: EmbeddedFabric,
    direct: DirectCm,
    target: Arc<Mutex<Target>>,
    setup: EmbeddedSetup,
    nics: u8,
}

impl EmbeddedSession {
    /// A fabric, a NIC with the target serving `subsystems`.
    ///
    /// # Errors
    /// Target configuration or verbs failures.
    pub fn new(setup: EmbeddedSetup, subsystems: Vec<Subsystem>) -> Result<Self, TargetError> {
        let fabric = EmbeddedFabric::new(FabricConfig {
            faults: setup.faults,
            link_latency: setup.link_latency,
        });
        fabric.set_capture(setup.capture);
        let nic = fabric.add_nic_with_config(Self::nic_config(&setup, 1));
        let direct = DirectCm::new(setup.path);
        let context = Self::open(nic, 1, setup.target.listen.ip)?;
        let listener: Box<dyn Listener> = match setup.cm {
            CmKind::Direct => Box::new(
                direct
                    .listen(setup.target.listen)
                    .map_err(|e| TargetError::Config(e.to_string()))?,
            ),
            CmKind::Rdma { seed } => Box::new(
                Self::rdma_cm(&fabric, &context, seed)?
                    .listen(setup.target.listen)
                    .map_err(|e| TargetError::Config(e.to_string()))?,
            ),
        };
        let target = Target::new(
            context,
            listener,
            Clock::Virtual(fabric.clone()),
            setup.target.clone(),
            subsystems,
        )?;
        Ok(Self {
            fabric,
            direct,
            target: Arc::new(Mutex::new(target)),
            setup,
            nics: 1,
        })
    }

    /// Opens NIC `index` with IPv4 address `ip` (GID 0).
    fn open(nic: rnic_verbs::backend::EmbeddedDevice, index: u8, ip: Ipv4Addr) -> Result<Context, TargetError> {
        let _ = index;
        let driver = rnic_verbs::driver::DriverConfig {
            ipv4_address: Some(ip.octets()),
            ..rnic_verbs::driver::DriverConfig::default()
        };
        Ok(Context::open_with_config(Box::new(nic), &driver)?)
    }

    fn rdma_cm(fabric: &EmbeddedFabric, context: &Context, seed: u64) -> Result<RdmaCm, TargetError> {
        RdmaCm::new(
            context,
            Arc::new(rnic_verbs::cm::FabricNeighbours(fabric.clone())),
            rnic_verbs::cm::CmConfig::seeded(seed),
        )
        .map_err(|e| TargetError::Config(e.to_string()))
    }

    fn nic_config(setup: &EmbeddedSetup, index: u8) -> EmbeddedConfig {
        EmbeddedConfig {
            device: DeviceConfig {
                timing: setup.timing,
                ..DeviceConfig::with_mac([0x02, 0x52, 0x4e, 0x56, 0x4d, index])
            },
            // Host-side accesses cost no virtual time: the timing model charges the
            // doorbells (as rnic-bench does).
            mmio_cost: Picoseconds::ZERO,
            ..EmbeddedConfig::default()
        }
    }

    /// The fabric.
    pub fn fabric(&self) -> &EmbeddedFabric {
        &self.fabric
    }

    /// The target.
    pub fn target(&self) -> MutexGuard<'_, Target> {
        self.target.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reactor that steps the target and runs the fabric.
    pub fn reactor(&self) -> EmbeddedReactor {
        let mut reactor =
            EmbeddedReactor::new(self.fabric.clone()).with_pace(self.setup.pace, Picoseconds::from_micros(2));
        reactor.add(self.target.clone());
        reactor
    }

    /// A host on a NIC of its own, connected with `config` (its target address is the
    /// session's).
    ///
    /// # Errors
    /// As [`Host::connect`].
    pub fn connect(&mut self, config: HostConfig) -> Result<Host, HostError> {
        self.nics = self.nics.wrapping_add(1).max(2);
        let nic = self
            .fabric
            .add_nic_with_config(Self::nic_config(&self.setup, self.nics));
        let ip = Ipv4Addr::new(192, 168, 1, 100u8.wrapping_add(self.nics));
        let context = Self::open(nic, self.nics, ip).map_err(|e| HostError::Config(e.to_string()))?;
        let connector: Box<dyn Connector> = match self.setup.cm {
            CmKind::Direct => Box::new(self.direct.connector()),
            CmKind::Rdma { seed } => Box::new(
                Self::rdma_cm(&self.fabric, &context, seed ^ u64::from(self.nics) << 8)
                    .map_err(|e| HostError::Config(e.to_string()))?
                    .connector(),
            ),
        };
        Host::connect(
            context,
            connector,
            Box::new(self.reactor()),
            HostConfig {
                target: self.setup.target.listen,
                ..config
            },
        )
    }

    /// Every frame recorded so far.
    pub fn take_capture(&self) -> Vec<CapturedFrame> {
        self.fabric.take_capture()
    }
}
