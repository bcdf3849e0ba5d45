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
use crate::rdma::{Clock, DirectCm, EmbeddedReactor, RcPathConfig, ServiceAddress};

/// The target's address on the embedded fabric.
pub const TARGET_ADDRESS: ServiceAddress = ServiceAddress::new(Ipv4Addr::new(192, 168, 1, 2), 4420);

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
        }
    }
}

/// A target on an embedded NIC, ready for hosts.
pub struct EmbeddedSession {
    fabric: EmbeddedFabric,
    cm: DirectCm,
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
        let cm = DirectCm::new(setup.path);
        let listener = cm
            .listen(setup.target.listen)
            .map_err(|e| TargetError::Config(e.to_string()))?;
        let target = Target::new(
            Context::open(Box::new(nic))?,
            Box::new(listener),
            Clock::Virtual(fabric.clone()),
            setup.target.clone(),
            subsystems,
        )?;
        Ok(Self {
            fabric,
            cm,
            target: Arc::new(Mutex::new(target)),
            setup,
            nics: 1,
        })
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
        Host::connect(
            Context::open(Box::new(nic))?,
            Box::new(self.cm.connector()),
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
