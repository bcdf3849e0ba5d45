//! Shared setup of the transport tests: two register-level NICs on a fabric, with a tap
//! on each port that can drop, duplicate or hold back chosen frames.
#![allow(dead_code)]

use std::collections::VecDeque;

use rnic_firmware_if::context::Mtu;
use rnic_firmware_if::cqe::{Cqe, CqeStatus};
use rnic_firmware_if::wqe::Sge;
use rnic_hw_model::fabric::{DeviceId, Fabric, FabricConfig, Port};
use rnic_hw_model::wire::{self, RoceRepr};
use rnic_hw_model::{DeviceConfig, Picoseconds};
use rnic_testbench::harness::{
    Access, CompletionQueue, MemoryRegion, MrMode, QpSpec, QueuePair, RegisterHarness, SendRequest,
};

/// What the tap does with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Let it through.
    Pass,
    /// Lose it.
    Drop,
    /// Send it twice.
    Duplicate,
    /// Hold it back until the next frame of this port has gone (reorder by one; the
    /// port must send another frame).
    Hold,
    /// Send this frame in its place (what another implementation would have sent).
    Replace(Vec<u8>),
}

/// A rule deciding each transmitted frame's fate from its parsed headers and its index
/// among the frames this port sent.
pub type Rule = Box<dyn FnMut(usize, &RoceRepr) -> Fate>;

/// A NIC on the fabric with a tap on its transmit side.
pub struct Node {
    /// The NIC and its register-level driver.
    pub h: RegisterHarness,
    /// The tap's rule (None: everything passes).
    pub rule: Option<Rule>,
    sent: usize,
    extra: VecDeque<Vec<u8>>,
    held: Option<Vec<u8>>,
    /// Frames the tap dropped.
    pub dropped: usize,
}

impl Port for Node {
    fn mac_address(&self) -> [u8; 6] {
        self.h.mac()
    }

    fn now(&self) -> Picoseconds {
        self.h.device.now()
    }

    fn next_event_time(&self) -> Option<Picoseconds> {
        self.h.device.next_event_time()
    }

    fn advance_to(&mut self, t: Picoseconds) {
        self.h.device.advance_to(t);
    }

    fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        if let Some(frame) = self.extra.pop_front() {
            return Some(frame);
        }
        loop {
            // A held frame waits for the next frame of this port (it must come).
            let frame = self.h.device.poll_transmit()?;
            let index = self.sent;
            self.sent += 1;
            let fate = match (&mut self.rule, wire::parse_frame(&frame)) {
                (Some(rule), Ok(parsed)) => rule(index, &parsed.repr),
                _ => Fate::Pass,
            };
            match fate {
                Fate::Pass => {
                    if let Some(held) = self.held.take() {
                        self.extra.push_back(held);
                    }
                    return Some(frame);
                }
                Fate::Drop => {
                    self.dropped += 1;
                    self.h.device.recycle_frame(frame);
                }
                Fate::Duplicate => {
                    self.extra.push_back(frame.clone());
                    return Some(frame);
                }
                Fate::Hold => {
                    if let Some(previous) = self.held.replace(frame) {
                        return Some(previous);
                    }
                }
                Fate::Replace(replacement) => {
                    self.h.device.recycle_frame(frame);
                    return Some(replacement);
                }
            }
        }
    }

    fn receive_frame(&mut self, frame: &[u8]) {
        self.h.device.receive_frame(frame);
    }

    fn recycle_frame(&mut self, buffer: Vec<u8>) {
        self.h.device.recycle_frame(buffer);
    }
}

/// MAC address of node `n`.
pub fn mac(n: u8) -> [u8; 6] {
    [0x02, 0x52, 0x4e, 0x49, 0x43, n]
}

/// GID of node `n`: `::ffff:10.0.0.n` or `fd00::n`.
pub fn gid(n: u8, ipv6: bool) -> [u8; 16] {
    if ipv6 {
        let mut g = [0u8; 16];
        g[0] = 0xfd;
        g[15] = n;
        g
    } else {
        wire::ipv4_to_gid([10, 0, 0, n])
    }
}

/// A NIC with tables, an AEQ and GID 0 configured.
pub fn nic(n: u8, ipv6: bool) -> RegisterHarness {
    let mut config = DeviceConfig::with_mac(mac(n));
    // Offered so that tests can push WQEs with the doorbell (no test does unless it means to).
    config.caps.flags |= rnic_firmware_if::caps::CapFlags::DIRECT_WQE;
    let mut h = RegisterHarness::with_config(config);
    h.configure_tables();
    h.create_aeq();
    h.set_gid(0, gid(n, ipv6));
    h
}

/// Two NICs on a fabric with a 1 µs link.
pub struct Pair {
    /// The fabric.
    pub fabric: Fabric<Node>,
    /// Node 1.
    pub a: DeviceId,
    /// Node 2.
    pub b: DeviceId,
}

impl Pair {
    /// Two NICs (node 1 and node 2).
    pub fn new(ipv6: bool) -> Self {
        let mut fabric = Fabric::new_generic(FabricConfig {
            link_latency: Picoseconds::from_micros(1),
            ..Default::default()
        });
        let a = fabric.add_device(Node {
            h: nic(1, ipv6),
            rule: None,
            sent: 0,
            extra: VecDeque::new(),
            held: None,
            dropped: 0,
        });
        let b = fabric.add_device(Node {
            h: nic(2, ipv6),
            rule: None,
            sent: 0,
            extra: VecDeque::new(),
            held: None,
            dropped: 0,
        });
        Self { fabric, a, b }
    }

    /// Node 1's harness.
    pub fn a(&mut self) -> &mut RegisterHarness {
        &mut self.fabric.device_mut(self.a).h
    }

    /// Node 2's harness.
    pub fn b(&mut self) -> &mut RegisterHarness {
        &mut self.fabric.device_mut(self.b).h
    }

    /// Node `id`'s harness.
    pub fn h(&mut self, id: DeviceId) -> &mut RegisterHarness {
        &mut self.fabric.device_mut(id).h
    }

    /// Sets the tap rule of node `id`.
    pub fn tap(&mut self, id: DeviceId, rule: Rule) {
        self.fabric.device_mut(id).rule = Some(rule);
    }

    /// Brings the fabric to the time of the device furthest ahead (setup through the
    /// mailbox lets the devices run on their own).
    pub fn sync(&mut self) {
        let ahead = [self.a, self.b]
            .into_iter()
            .map(|id| self.fabric.device(id).now())
            .max()
            .unwrap_or_default();
        self.fabric.advance_to(ahead);
    }

    /// Runs until nothing is pending (at most 100 s of virtual time).
    pub fn run(&mut self) {
        let limit = self.fabric.now() + Picoseconds::from_millis(100_000);
        self.fabric.run_until_idle(limit);
    }

    /// Runs for `span` of virtual time.
    pub fn run_for(&mut self, span: Picoseconds) {
        self.sync();
        let t = self.fabric.now() + span;
        self.fabric.advance_to(t);
    }
}

/// One connected RC/UC pair of QPs with a CQ and a memory region on each side.
pub struct Connection {
    /// The two NICs.
    pub pair: Pair,
    /// QP on node 1.
    pub qa: QueuePair,
    /// QP on node 2.
    pub qb: QueuePair,
    /// CQ on node 1.
    pub ca: CompletionQueue,
    /// CQ on node 2.
    pub cb: CompletionQueue,
    /// Region on node 1 (source buffer).
    pub ma: MemoryRegion,
    /// Region on node 2 (destination buffer).
    pub mb: MemoryRegion,
}

/// Bytes of each side's region.
pub const REGION: usize = 4 << 20;

/// A byte pattern that differs per side and per offset.
pub fn pattern(seed: u8) -> impl Fn(usize) -> u8 {
    move |i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8
}

/// QP 0x10 on node 1 connected to QP 0x20 on node 2 (`service`, `mtu`), each with a
/// 256-entry CQ 1 and a 4 MiB region with every right (`mode` decides physical or PBL).
pub fn connect(
    service: rnic_firmware_if::context::ServiceType,
    mtu: Mtu,
    ipv6: bool,
    tweak: impl Fn(&mut QpSpec),
) -> Connection {
    let mut pair = Pair::new(ipv6);
    let (qa, ca, ma) = side(pair.a(), 1, 0x10, 0x20, service, mtu, ipv6, &tweak);
    let (qb, cb, mb) = side(pair.b(), 2, 0x20, 0x10, service, mtu, ipv6, &tweak);
    // Setup is done: from here on every diagnostic is the transport's.
    pair.a().device.take_diagnostics();
    pair.b().device.take_diagnostics();
    pair.sync();
    Connection {
        pair,
        qa,
        qb,
        ca,
        cb,
        ma,
        mb,
    }
}

#[allow(clippy::too_many_arguments)]
fn side(
    h: &mut RegisterHarness,
    node: u8,
    qpn: u32,
    dest: u32,
    service: rnic_firmware_if::context::ServiceType,
    mtu: Mtu,
    ipv6: bool,
    tweak: &dyn Fn(&mut QpSpec),
) -> (QueuePair, CompletionQueue, MemoryRegion) {
    let cq = h.create_polled_cq(1, 256);
    let bus = h.allocate_filled(REGION, pattern(node));
    let mode = if node == 1 {
        MrMode::Physical
    } else {
        MrMode::Pbl { iova: 0x7f00_0000_0000 }
    };
    let mr = h.register_mr(1, bus, REGION as u64, 1, Access::ALL, mode);
    let peer = 3 - node;
    let mut spec = QpSpec::rc(qpn, 1, dest);
    spec.service = service;
    spec.mtu = mtu;
    spec.dmac = mac(peer);
    spec.dgid = gid(peer, ipv6);
    tweak(&mut spec);
    let qp = h.create_qp(&spec);
    (qp, cq, mr)
}

impl Connection {
    /// Runs the fabric until idle.
    pub fn run(&mut self) {
        self.pair.run();
    }

    /// New CQEs on node 1.
    pub fn cqes_a(&mut self) -> Vec<Cqe> {
        let a = self.pair.a;
        let mut cq = self.ca.clone();
        let cqes = self.pair.h(a).poll_cq(&mut cq);
        self.ca = cq;
        cqes
    }

    /// New CQEs on node 2.
    pub fn cqes_b(&mut self) -> Vec<Cqe> {
        let b = self.pair.b;
        let mut cq = self.cb.clone();
        let cqes = self.pair.h(b).poll_cq(&mut cq);
        self.cb = cq;
        cqes
    }
}

impl Connection {
    /// Posts `request` on node 1's QP and rings its doorbell; returns the WQE index.
    pub fn send_a(&mut self, request: &SendRequest) -> u32 {
        let h = &mut self.pair.fabric.device_mut(self.pair.a).h;
        let index = h.post_send(&mut self.qa, request);
        h.ring_send(&self.qa);
        index
    }

    /// Posts `request` on node 2's QP and rings its doorbell.
    pub fn send_b(&mut self, request: &SendRequest) -> u32 {
        let h = &mut self.pair.fabric.device_mut(self.pair.b).h;
        let index = h.post_send(&mut self.qb, request);
        h.ring_send(&self.qb);
        index
    }

    /// Posts a receive WQE on node 2's QP.
    pub fn recv_b(&mut self, sges: &[Sge]) -> u32 {
        let h = &mut self.pair.fabric.device_mut(self.pair.b).h;
        h.post_recv(&mut self.qb, sges)
    }

    /// Posts a receive WQE on node 1's QP.
    pub fn recv_a(&mut self, sges: &[Sge]) -> u32 {
        let h = &mut self.pair.fabric.device_mut(self.pair.a).h;
        h.post_recv(&mut self.qa, sges)
    }

    /// Bytes of node 1's region.
    pub fn bytes_a(&mut self, offset: u64, length: usize) -> Vec<u8> {
        let bus = self.ma.bus;
        self.pair.a().read_bytes(bus + offset, length)
    }

    /// Bytes of node 2's region.
    pub fn bytes_b(&mut self, offset: u64, length: usize) -> Vec<u8> {
        let bus = self.mb.bus;
        self.pair.b().read_bytes(bus + offset, length)
    }

    /// The expected initial content of node `n`'s region at `offset`.
    pub fn initial(n: u8, offset: u64, length: usize) -> Vec<u8> {
        let p = pattern(n);
        (offset as usize..offset as usize + length).map(p).collect()
    }

    /// Diagnostics of both nodes, as text.
    pub fn diagnostics(&mut self) -> Vec<String> {
        let mut all: Vec<String> = self
            .pair
            .a()
            .device
            .diagnostics()
            .recent()
            .map(|d| format!("A {d}"))
            .collect();
        all.extend(self.pair.b().device.diagnostics().recent().map(|d| format!("B {d}")));
        all
    }
}

/// Asserts one CQE with `status` (and returns it).
pub fn single(cqes: &[Cqe], status: CqeStatus) -> Cqe {
    assert_eq!(cqes.len(), 1, "one CQE expected: {cqes:?}");
    assert_eq!(
        CqeStatus::try_from(cqes[0].status()),
        Ok(status),
        "CQE status: {:?}",
        cqes[0]
    );
    cqes[0]
}
