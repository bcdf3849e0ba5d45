//! Hostile input to the transport: well-formed frames (correct ICRC) with random opcodes,
//! PSNs, QPNs, keys, addresses, lengths and syndromes; corrupted and truncated frames;
//! and SQ WQEs full of random bytes. Nothing may panic or wedge the device: afterwards a
//! fresh pair of QPs still works.

mod transport_common;

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::wire::{self, opcode::BthOpcode, AethRepr, AtomicEthRepr, DethRepr, ExtHeaders, RethRepr};
use rnic_hw_model::{HostMemory, Picoseconds};
use rnic_testbench::harness::{QpSpec, SendRequest};
use transport_common::*;

/// Tiny xorshift64 so runs are reproducible (seed printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Traffic of every kind, captured, to mutate.
fn captured_traffic(c: &mut Connection) -> Vec<Vec<u8>> {
    let (ma, mb) = (c.ma, c.mb);
    c.pair.fabric.set_capture(true);
    for i in 0..3u64 {
        c.recv_b(&[mb.sge(i * 0x1000, 0x1000)]);
    }
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 3000)]));
    c.send_a(&SendRequest {
        immediate: 1,
        ..SendRequest::new(SqOpcode::SendWithImm, vec![ma.sge(0, 10)])
    });
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 3000)],
        mb.at(0x10000),
        mb.key,
    ));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0x8000, 3000)],
        mb.at(0x20000),
        mb.key,
    ));
    c.send_a(&SendRequest {
        swap_add: 3,
        ..SendRequest::rdma(
            SqOpcode::AtomFetchAndAdd,
            vec![ma.sge(0x9000, 8)],
            mb.at(0x30000),
            mb.key,
        )
    });
    c.run();
    c.pair.fabric.set_capture(false);
    c.pair.fabric.take_capture().into_iter().map(|f| f.bytes).collect()
}

/// A well-formed frame derived from `base` with random header changes.
fn mutate(rng: &mut Rng, base: &[u8], keys: [u32; 2]) -> Option<Vec<u8>> {
    let parsed = wire::parse_frame(base).ok()?;
    let mut repr = parsed.repr;
    let mut payload = parsed.payload.to_vec();
    if rng.chance(50) {
        // Mostly RC opcodes: the QPs are RC, other services are dropped at the door.
        let rc_only = rng.chance(85);
        let known: Vec<BthOpcode> = BthOpcode::all_known().filter(|o| !rc_only || o.0 < 0x20).collect();
        repr.bth.opcode = known[rng.below(known.len() as u64) as usize];
    }
    if rng.chance(60) {
        repr.bth.psn = match rng.below(3) {
            0 => rng.below(0x100) as u32,
            1 => (repr.bth.psn + rng.below(8) as u32).wrapping_sub(4) & 0xFF_FFFF,
            _ => rng.next() as u32 & 0xFF_FFFF,
        };
    }
    if rng.chance(20) {
        repr.bth.destination_qp = [0x10, 0x20, 1, 0, rng.next() as u32 & 0xFF_FFFF][rng.below(5) as usize];
    }
    if rng.chance(3) {
        repr.bth.partition_key = rng.next() as u16;
    }
    repr.bth.ack_request = rng.chance(50);
    let key = |rng: &mut Rng| match rng.below(4) {
        0 => keys[0],
        1 => keys[1],
        2 => keys[1] ^ 1,
        _ => rng.next() as u32,
    };
    let address = |rng: &mut Rng| match rng.below(4) {
        0 => 0x7f00_0000_0000 + rng.below(REGION as u64 + 0x1000),
        1 => rng.next(),
        2 => 0x7f00_0000_0000 - rng.below(64),
        _ => rng.below(1 << 40),
    };
    let headers = repr.bth.opcode.headers();
    if headers.contains(ExtHeaders::FETH) {
        return None;
    }
    repr.reth = headers.contains(ExtHeaders::RETH).then(|| RethRepr {
        virtual_address: address(rng),
        rkey: key(rng),
        dma_length: [0, 1, 4096, 1 << 20, rng.next() as u32][rng.below(5) as usize],
    });
    repr.aeth = headers.contains(ExtHeaders::AETH).then(|| AethRepr {
        syndrome: [0x1F, 0x21, 0x60, 0x61, 0x62, 0x63, 0x64, rng.next() as u8][rng.below(8) as usize],
        msn: rng.next() as u32 & 0xFF_FFFF,
    });
    repr.atomic_eth = headers.contains(ExtHeaders::ATOMIC_ETH).then(|| AtomicEthRepr {
        virtual_address: address(rng) & !(rng.below(2) * 7),
        rkey: key(rng),
        swap_or_add: rng.next(),
        compare: rng.next(),
    });
    repr.atomic_ack = headers.contains(ExtHeaders::ATOMIC_ACK_ETH).then(|| rng.next());
    repr.immediate = headers.contains(ExtHeaders::IMMDT).then(|| rng.next() as u32);
    repr.invalidate_rkey = headers.contains(ExtHeaders::IETH).then(|| key(rng));
    repr.deth = headers.contains(ExtHeaders::DETH).then(|| DethRepr {
        qkey: rng.next() as u32,
        source_qp: rng.next() as u32 & 0xFF_FFFF,
    });
    if !repr.bth.opcode.has_payload() {
        payload.clear();
    } else if rng.chance(40) {
        let length = [0, 1, 255, 256, 1024, 1025, 4096][rng.below(7) as usize];
        payload = (0..length).map(|_| rng.next() as u8).collect();
    }
    repr.check(payload.len()).ok()?;
    let mut frame = Vec::new();
    wire::emit_frame(&repr, &payload, &mut frame);
    Some(frame)
}

#[test]
fn hostile_frames_and_wqes_never_panic_or_wedge_the_device() {
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, seed % 2 == 0, |spec| {
            spec.ack_timeout = 6
        });
        let frames = captured_traffic(&mut c);
        assert!(frames.len() > 10);
        let keys = [c.ma.key, c.mb.key];
        let (a, b) = (c.pair.a, c.pair.b);
        let mut revived = 0;
        let verbose = std::env::var_os("RNIC_TEST_VERBOSE").is_some();
        let mut fields = std::collections::BTreeMap::new();
        for step in 0..20_000 {
            let base = &frames[rng.below(frames.len() as u64) as usize];
            // Mostly to the device the frame is addressed to.
            let addressed = if base[..6] == mac(1) { a } else { b };
            let to = if rng.chance(90) {
                addressed
            } else if addressed == a {
                b
            } else {
                a
            };
            let frame = match rng.below(10) {
                0 => {
                    // Corrupted or truncated: dropped by the parser.
                    let mut f = base.clone();
                    let at = rng.below(f.len() as u64) as usize;
                    f[at] ^= 1 + rng.below(255) as u8;
                    f.truncate(rng.below(f.len() as u64 + 1) as usize);
                    f
                }
                _ => match mutate(&mut rng, base, keys) {
                    Some(f) => f,
                    None => continue,
                },
            };
            c.pair.h(to).device.receive_frame(&frame);
            if verbose {
                for d in c.pair.h(to).device.take_diagnostics() {
                    *fields
                        .entry((d.field, d.expected.chars().take(40).collect::<String>()))
                        .or_insert(0) += 1;
                }
            }
            if step % 50 == 0 {
                c.pair.run_for(Picoseconds::from_micros(20));
            }
            if step % 30 == 29 {
                // Bring QPs that errored out back, so hostile frames keep reaching the
                // engines rather than the state check.
                for (node, qp) in [(a, c.qa.clone()), (b, c.qb.clone())] {
                    let (_, qpc) = c.pair.h(node).query::<rnic_firmware_if::context::Qpc>(
                        rnic_firmware_if::mailbox::MailboxOpcode::QueryQpc,
                        qp.qpn,
                    );
                    if qpc.qp_state() == Ok(rnic_firmware_if::context::QpState::Err) {
                        c.pair
                            .h(node)
                            .move_qp(qp.qpn, rnic_firmware_if::context::QpState::Reset);
                        let fresh = c.pair.h(node).create_qp(&qp.spec);
                        if node == a {
                            c.qa = fresh;
                        } else {
                            c.qb = fresh;
                        }
                        revived += 1;
                    }
                }
                c.pair.sync();
            }
            if step % 500 == 0 {
                // Random WQEs on node 1, and receives for node 2.
                let a_index = c.qa.sq_head;
                let address = c.qa.sq_wqe_address(a_index);
                let junk: Vec<u8> = (0..64).map(|_| rng.next() as u8).collect();
                c.pair.a().memory.write(address, &junk).unwrap();
                c.qa.sq_head += 1;
                let qa = c.qa.clone();
                c.pair.a().ring_send(&qa);
                let mb = c.mb;
                c.recv_b(&[mb.sge(rng.below(0x10000), rng.below(0x2000) as u32)]);
            }
        }
        c.run();
        let counters = (
            c.pair.a().device.transport_counters(),
            c.pair.b().device.transport_counters(),
        );
        assert!(
            counters.0.frames_dropped + counters.1.frames_dropped > 0,
            "seed {seed}: {counters:?}"
        );
        if std::env::var_os("RNIC_TEST_VERBOSE").is_some() {
            eprintln!("seed {seed}: {revived} QPs revived, {counters:?}");
            eprintln!("{fields:?}");
        }

        // The devices still work: a fresh pair of QPs on a fresh CQ.
        let mut cq_a = c.pair.a().create_polled_cq(2, 64);
        let mut cq_b = c.pair.b().create_polled_cq(2, 64);
        let ipv6 = seed % 2 == 0;
        let mut spec = QpSpec::rc(0x30, 2, 0x40);
        spec.dmac = mac(2);
        spec.dgid = gid(2, ipv6);
        let mut qa = c.pair.a().create_qp(&spec);
        let mut spec = QpSpec::rc(0x40, 2, 0x30);
        spec.dmac = mac(1);
        spec.dgid = gid(1, ipv6);
        let mut qb = c.pair.b().create_qp(&spec);
        c.pair.sync();
        // Fresh regions: hostile SENDs with invalidate may have freed the old ones.
        let (bus_a, bus_b) = (c.ma.bus, c.mb.bus);
        let ma = c.pair.a().register_mr(
            9,
            bus_a,
            REGION as u64,
            1,
            rnic_testbench::harness::Access::ALL,
            rnic_testbench::harness::MrMode::Physical,
        );
        let mb = c.pair.b().register_mr(
            9,
            bus_b,
            REGION as u64,
            1,
            rnic_testbench::harness::Access::ALL,
            rnic_testbench::harness::MrMode::Physical,
        );
        c.pair.sync();
        c.pair.b().post_recv(&mut qb, &[mb.sge(0x40000, 0x1000)]);
        c.pair
            .a()
            .post_send(&mut qa, &SendRequest::new(SqOpcode::Send, vec![ma.sge(0x40000, 2000)]));
        c.pair.a().ring_send(&qa);
        c.run();
        single(&c.pair.a().poll_cq(&mut cq_a), CqeStatus::Success);
        single(&c.pair.b().poll_cq(&mut cq_b), CqeStatus::Success);
        assert_eq!(c.bytes_b(0x40000, 2000), c.bytes_a(0x40000, 2000), "seed {seed}");
    }
}

#[test]
fn a_doorbell_flood_at_one_instant_keeps_a_bounded_number_in_flight_and_runs_each_wqe_once() {
    use rnic_firmware_if::doorbell::Doorbell;
    use rnic_hw_model::transport::DOORBELLS_IN_FLIGHT_LIMIT;
    // A driver that rings faster than virtual time passes: every doorbell is still in
    // flight when the next is written. Beyond the limit they merge into the QP's newest.
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let rings = DOORBELLS_IN_FLIGHT_LIMIT + 1000;
    let h = &mut c.pair.fabric.device_mut(c.pair.a).h;
    for n in 0..8u64 {
        let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(n * 512, 512)], mb.at(n * 512), mb.key);
        h.post_send(&mut c.qa, &request);
    }
    for _ in 0..rings {
        h.doorbell(Doorbell::sq(c.qa.qpn, c.qa.sq_head as u16, 0).as_u64());
    }
    let merged = h.device.transport_counters().doorbells_merged;
    assert_eq!(merged, (rings - DOORBELLS_IN_FLIGHT_LIMIT) as u64);
    c.run();
    let cqes = c.cqes_a();
    assert_eq!(cqes.len(), 8, "{cqes:?}");
    assert!(cqes
        .iter()
        .all(|cqe| CqeStatus::try_from(cqe.status()) == Ok(CqeStatus::Success)));
    assert_eq!(c.bytes_b(0, 4096), Connection::initial(1, 0, 4096));
}
