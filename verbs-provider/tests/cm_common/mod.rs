//! Hosts with embedded NICs on one fabric, each with its own connection manager, driven
//! by one single-threaded loop on the fabric's virtual time.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use rnic_hw_model::fabric::FabricConfig;
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric};
use rnic_verbs::cm::{
    CmConfig, CmEvent, CmEventKind, CmId, CmQpInit, ConnectionManager, EventChannel, FabricNeighbours, PortSpace,
};
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{AccessFlags, Context, MemoryRegion, ProtectionDomain, QpCapabilities};

pub struct Host {
    pub name: &'static str,
    pub device: EmbeddedDevice,
    pub context: Context,
    pub cm: ConnectionManager,
    pub channel: EventChannel,
    pub pd: ProtectionDomain,
    pub ip: IpAddr,
}

pub struct World {
    pub fabric: EmbeddedFabric,
    pub hosts: Vec<Host>,
    /// Every event seen, in order: (host, kind, status, id handle).
    pub log: Vec<(usize, CmEventKind, i32, u64)>,
    /// Events not yet taken by [`World::expect`].
    pub pending: std::collections::VecDeque<(usize, CmEvent)>,
}

/// `10.0.0.N`.
pub fn ipv4(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}

pub fn mac(n: u8) -> [u8; 6] {
    [0x02, 0x52, 0x4e, 0x49, 0x43, n]
}

impl World {
    /// `count` hosts 10.0.0.1.. on one fabric; every CM seeded from `seed`.
    pub fn new(count: u8, seed: u64) -> Self {
        Self::with_fabric(count, seed, FabricConfig::default())
    }

    pub fn with_fabric(count: u8, seed: u64, fabric: FabricConfig) -> Self {
        let fabric = EmbeddedFabric::new(fabric);
        let hosts = (1..=count)
            .map(|n| {
                let device = fabric.add_nic(mac(n));
                let config = DriverConfig {
                    ipv4_address: Some([10, 0, 0, n]),
                    ..DriverConfig::default()
                };
                let context = Context::open_with_config(Box::new(device.clone()), &config).unwrap();
                let cm = ConnectionManager::new(CmConfig::seeded(seed ^ u64::from(n) << 8));
                cm.add_device(&context, Arc::new(FabricNeighbours(fabric.clone())))
                    .unwrap();
                let channel = cm.create_event_channel().unwrap();
                let pd = context.alloc_pd().unwrap();
                Host {
                    name: ["a", "b", "c", "d"][usize::from(n - 1) % 4],
                    device,
                    context,
                    cm,
                    channel,
                    pd,
                    ip: ipv4(n),
                }
            })
            .collect();
        Self {
            fabric,
            hosts,
            log: Vec::new(),
            pending: std::collections::VecDeque::new(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.fabric.now().0 / 1000
    }

    /// One round: every connection manager runs, every event is collected.
    pub fn poll(&mut self) -> Vec<(usize, CmEvent)> {
        let mut out = Vec::new();
        for (index, host) in self.hosts.iter().enumerate() {
            host.cm.progress();
            while let Some(event) = host.channel.get_event() {
                self.log.push((index, event.kind, event.status, event.id.handle()));
                out.push((index, event));
            }
        }
        out
    }

    /// Lets virtual time pass to the next thing that can happen (a frame, a device
    /// event, a CM timer), at most `limit_ns`.
    pub fn advance(&self, limit_ns: u64) {
        let managers: Vec<&ConnectionManager> = self.hosts.iter().map(|h| &h.cm).collect();
        rnic_verbs::cm::embedded::step(&self.fabric, &managers, limit_ns);
    }

    /// Runs until an event satisfies `wanted`, at most `limit_ns` of virtual time; returns
    /// it and every event seen on the way (including it, last).
    pub fn run_until(
        &mut self,
        limit_ns: u64,
        mut wanted: impl FnMut(usize, &CmEvent) -> bool,
    ) -> Vec<(usize, CmEvent)> {
        let end = self.now_ns() + limit_ns;
        let mut seen = Vec::new();
        loop {
            for (host, event) in self.poll() {
                let done = wanted(host, &event);
                seen.push((host, event));
                if done {
                    return seen;
                }
            }
            assert!(
                self.now_ns() < end,
                "nothing wanted within {limit_ns} ns; saw {:?}",
                seen.iter().map(|(h, e)| (*h, e.kind, e.status)).collect::<Vec<_>>()
            );
            self.advance(1_000_000);
        }
    }

    /// Waits for `kind` on host `host` and returns it; other events stay pending.
    pub fn expect(&mut self, host: usize, kind: CmEventKind) -> CmEvent {
        let end = self.now_ns() + 200_000_000_000;
        loop {
            if let Some(position) = self.pending.iter().position(|(h, e)| *h == host && e.kind == kind) {
                return self.pending.remove(position).unwrap().1;
            }
            let polled = self.poll();
            self.pending.extend(polled);
            if self.pending.iter().any(|(h, e)| *h == host && e.kind == kind) {
                continue;
            }
            assert!(
                self.now_ns() < end,
                "no {kind} on host {host}; pending {:?}",
                self.pending
                    .iter()
                    .map(|(h, e)| (*h, e.kind, e.status))
                    .collect::<Vec<_>>()
            );
            self.advance(1_000_000);
        }
    }

    /// Runs `span_ns` of virtual time, returning every event.
    pub fn run_for(&mut self, span_ns: u64) -> Vec<(usize, CmEvent)> {
        let end = self.now_ns() + span_ns;
        let mut seen = Vec::new();
        while self.now_ns() < end {
            seen.extend(self.poll());
            self.advance((end - self.now_ns()).max(1));
        }
        seen.extend(self.poll());
        seen
    }
}

pub fn caps() -> QpCapabilities {
    QpCapabilities {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

pub fn qp_init(pd: &ProtectionDomain) -> CmQpInit<'_> {
    CmQpInit {
        pd: Some(pd),
        cap: caps(),
        ..CmQpInit::default()
    }
}

/// A listener on host `server` at `port`, bound to its address.
pub fn listen(world: &World, server: usize, port: u16, space: PortSpace) -> CmId {
    let host = &world.hosts[server];
    let id = host.channel.create_id(0x1157, space).unwrap();
    id.bind_addr(SocketAddr::new(host.ip, port)).unwrap();
    id.listen(8).unwrap();
    id
}

pub fn buffer(pd: &ProtectionDomain, size: usize) -> MemoryRegion {
    pd.register_provider_memory(
        size,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )
    .unwrap()
}
