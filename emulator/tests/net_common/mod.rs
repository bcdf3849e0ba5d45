//! Shared by the network tests: a register-level NIC (testbench's `RegisterHarness`)
//! attached to a network backend, and an RC WRITE/READ/SEND exchange between two of them.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rnic_emu::net::{self, NetBackend};
use rnic_firmware_if::context::Mtu;
use rnic_firmware_if::cqe::{Cqe, CqeStatus};
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::{DeviceConfig, Picoseconds};
use rnic_testbench::harness::{
    Access, CompletionQueue, MemoryRegion, MrMode, QpSpec, QueuePair, RegisterHarness, SendRequest,
};

const REGION: usize = 1 << 20;

pub fn mac(n: u8) -> [u8; 6] {
    [0x02, 0x52, 0x4e, 0x49, 0x43, n]
}

fn pattern(seed: u8) -> impl Fn(usize) -> u8 {
    move |i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8
}

/// NIC `n` (MAC `mac(n)`, GID 0 `gid`) with QP `qpn` connected to QP `dest` of the NIC
/// with `peer_mac`/`peer_gid`, a CQ and a 1 MiB region with every right, and its backend.
pub struct Side {
    pub h: RegisterHarness,
    pub backend: Box<dyn NetBackend>,
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub mr: MemoryRegion,
    pub n: u8,
}

impl Side {
    pub fn new(
        n: u8,
        gid: [u8; 16],
        qpn: u32,
        peer: u8,
        peer_gid: [u8; 16],
        dest: u32,
        backend: Box<dyn NetBackend>,
    ) -> Self {
        let mut h = RegisterHarness::with_config(DeviceConfig::with_mac(mac(n)));
        h.configure_tables();
        h.create_aeq();
        h.set_gid(0, gid);
        let cq = h.create_polled_cq(1, 256);
        let bus = h.allocate_filled(REGION, pattern(n));
        let mr = h.register_mr(1, bus, REGION as u64, 1, Access::ALL, MrMode::Physical);
        let mut spec = QpSpec::rc(qpn, 1, dest);
        spec.mtu = Mtu::Mtu1024;
        spec.dmac = mac(peer);
        spec.dgid = peer_gid;
        let qp = h.create_qp(&spec);
        h.device.take_diagnostics();
        let mut backend = backend;
        // What the server loop does each pass: the backend learns the device's addresses.
        let mut addresses = Vec::new();
        net::gid_addresses(&h.device, &mut addresses);
        backend.set_local_addresses(&addresses);
        Self {
            h,
            backend,
            qp,
            cq,
            mr,
            n,
        }
    }

    /// Moves frames between the device and the network; returns whether any moved.
    pub fn pump(&mut self, frame: &mut Vec<u8>) -> bool {
        let mut moved = false;
        while let Some(out) = self.h.device.poll_transmit() {
            self.backend.send(&out);
            self.h.device.recycle_frame(out);
            moved = true;
        }
        while self.backend.receive(frame) {
            self.h.device.receive_frame(frame);
            moved = true;
        }
        moved
    }

    pub fn cqes(&mut self) -> Vec<Cqe> {
        let mut cq = self.cq.clone();
        let cqes = self.h.poll_cq(&mut cq);
        self.cq = cq;
        cqes
    }
}

/// Runs both NICs (virtual time = a common base + wall-clock time elapsed) until `a` has
/// `want` new CQEs, at most five seconds; returns them.
pub fn run_until(a: &mut Side, b: &mut Side, want: usize, b_cqes: &mut Vec<Cqe>) -> Vec<Cqe> {
    let base = a.h.device.now().max(b.h.device.now());
    let start = Instant::now();
    let mut frame = Vec::new();
    let mut cqes = Vec::new();
    while start.elapsed() < Duration::from_secs(5) {
        let now = base + Picoseconds::from_nanos(start.elapsed().as_nanos() as u64);
        for side in [&mut *a, &mut *b] {
            if side.h.device.now() < now {
                side.h.device.advance_to(now);
            }
        }
        let moved = a.pump(&mut frame) | b.pump(&mut frame);
        cqes.extend(a.cqes());
        b_cqes.extend(b.cqes());
        if cqes.len() >= want {
            return cqes;
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    panic!(
        "timed out with {} of {want} completions; a: {:?} {:?}, b: {:?} {:?}",
        cqes.len(),
        a.backend.stats(),
        a.h.device
            .diagnostics()
            .recent()
            .map(|d| d.to_string())
            .collect::<Vec<_>>(),
        b.backend.stats(),
        b.h.device
            .diagnostics()
            .recent()
            .map(|d| d.to_string())
            .collect::<Vec<_>>(),
    );
}

pub fn assert_success(cqes: &[Cqe]) {
    for cqe in cqes {
        assert_eq!(CqeStatus::try_from(cqe.status()), Ok(CqeStatus::Success), "{cqe:?}");
    }
}

/// RC WRITE 64 KiB A→B, READ 20000 bytes B→A, SEND 3000 bytes A→B, each verified.
pub fn exchange(a: &mut Side, b: &mut Side) {
    let (ma, mb) = (a.mr, b.mr);
    let mut b_cqes = Vec::new();

    // WRITE 64 KiB: 64 packets at MTU 1024, then the ACKs.
    let write = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 65536)], mb.at(0x1000), mb.key);
    a.h.post_send(&mut a.qp, &write);
    a.h.ring_send(&a.qp);
    assert_success(&run_until(a, b, 1, &mut b_cqes));
    let expected: Vec<u8> = (0..65536).map(pattern(a.n)).collect();
    assert_eq!(b.h.read_bytes(mb.bus + 0x1000, 65536), expected, "WRITE data at B");

    // READ 20000 bytes of B's region back into A.
    let read = SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0x8_0000, 20000)],
        mb.at(0x4_0000),
        mb.key,
    );
    a.h.post_send(&mut a.qp, &read);
    a.h.ring_send(&a.qp);
    assert_success(&run_until(a, b, 1, &mut b_cqes));
    let expected: Vec<u8> = (0x4_0000..0x4_0000 + 20000).map(pattern(b.n)).collect();
    assert_eq!(a.h.read_bytes(ma.bus + 0x8_0000, 20000), expected, "READ data at A");

    // SEND 3000 bytes into a posted receive.
    b.h.post_recv(&mut b.qp, &[mb.sge(0x9_0000, 4096)]);
    let send = SendRequest::new(SqOpcode::Send, vec![ma.sge(0x2_0000, 3000)]);
    a.h.post_send(&mut a.qp, &send);
    a.h.ring_send(&a.qp);
    assert_success(&run_until(a, b, 1, &mut b_cqes));
    // The receive completion may trail the sender's by a pass.
    let deadline = Instant::now() + Duration::from_secs(2);
    while b_cqes.is_empty() && Instant::now() < deadline {
        let mut frame = Vec::new();
        b.pump(&mut frame);
        b_cqes.extend(b.cqes());
    }
    assert_eq!(b_cqes.len(), 1, "one receive completion at B: {b_cqes:?}");
    assert_success(&b_cqes);
    let expected: Vec<u8> = (0x2_0000..0x2_0000 + 3000).map(pattern(a.n)).collect();
    assert_eq!(b.h.read_bytes(mb.bus + 0x9_0000, 3000), expected, "SEND data at B");
}
