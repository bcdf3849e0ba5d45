//! RC reliability: lost, duplicated and reordered packets. Go-back-N, READs served
//! again, atomics answered from the replay cache (not executed twice), duplicates
//! acknowledged without re-execution, and a seeded random fault plan.

mod transport_common;

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::fabric::FaultPlan;
use rnic_hw_model::HostMemory;
use rnic_testbench::harness::SendRequest;
use transport_common::*;

const READ_RESPONSE_MIDDLE: u8 = 0x0E;
const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
const ACKNOWLEDGE: u8 = 0x11;

/// A rule dropping the first frame that `matches`.
fn drop_once(mut matches: impl FnMut(&rnic_hw_model::wire::RoceRepr) -> bool + 'static) -> Rule {
    let mut done = false;
    Box::new(move |_, repr| {
        if !done && matches(repr) {
            done = true;
            Fate::Drop
        } else {
            Fate::Pass
        }
    })
}

#[test]
fn a_lost_read_response_is_served_again_from_that_psn() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair.tap(
        b,
        drop_once(|r| r.bth.opcode.0 == READ_RESPONSE_MIDDLE && r.bth.psn == 4),
    );
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0, 2560)],
        mb.at(0x1000),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_a(0, 2560), c.bytes_b(0x1000, 2560));
    let (ca, cb) = (
        c.pair.a().device.transport_counters(),
        c.pair.b().device.transport_counters(),
    );
    assert_eq!(ca.retries, 1, "one go-back-N for the gap: {ca:?}");
    assert_eq!(cb.duplicate_requests, 1, "the READ came again from PSN 4: {cb:?}");
    assert_eq!(ca.ack_timeouts, 0);
    assert!(c.diagnostics().is_empty(), "{:?}", c.diagnostics());
}

#[test]
fn a_lost_atomic_ack_is_answered_from_the_replay_cache() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.ack_timeout = 4);
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair.b().memory.write(mb.bus + 0x100, &100u64.to_le_bytes()).unwrap();
    c.pair.tap(b, drop_once(|r| r.bth.opcode.0 == ATOMIC_ACKNOWLEDGE));
    c.send_a(&SendRequest {
        swap_add: 5,
        ..SendRequest::rdma(SqOpcode::AtomFetchAndAdd, vec![ma.sge(0, 8)], mb.at(0x100), mb.key)
    });
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_a(0, 8), 100u64.to_le_bytes(), "the original value");
    assert_eq!(c.bytes_b(0x100, 8), 105u64.to_le_bytes(), "added once, not twice");
    let (ca, cb) = (
        c.pair.a().device.transport_counters(),
        c.pair.b().device.transport_counters(),
    );
    assert_eq!(ca.ack_timeouts, 1, "{ca:?}");
    assert_eq!(cb.duplicate_requests, 1, "{cb:?}");
}

#[test]
fn a_lost_ack_is_recovered_by_the_timer_without_executing_twice() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.ack_timeout = 4);
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair.tap(b, drop_once(|r| r.bth.opcode.0 == ACKNOWLEDGE));
    c.recv_b(&[mb.sge(0, 4096)]);
    c.recv_b(&[mb.sge(0x1000, 4096)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 3000)]));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    let received = single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(received.wqe_index(), 0, "the duplicate consumed no second receive");
    let cb = c.pair.b().device.transport_counters();
    assert!(cb.duplicate_requests >= 1, "{cb:?}");
    // The second receive is still there for the next SEND.
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 10)]));
    c.run();
    assert_eq!(single(&c.cqes_b(), CqeStatus::Success).wqe_index(), 1);
}

#[test]
fn every_packet_twice_changes_nothing() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu512, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let (a, b) = (c.pair.a, c.pair.b);
    c.pair.tap(a, Box::new(|_, _| Fate::Duplicate));
    c.pair.tap(b, Box::new(|_, _| Fate::Duplicate));
    c.pair.b().memory.write(mb.bus + 0x8000, &1u64.to_le_bytes()).unwrap();
    for i in 0..4u64 {
        c.recv_b(&[mb.sge(i * 0x1000, 0x1000)]);
    }
    for i in 0..4u64 {
        c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(i * 0x1000, 1500)]));
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(0x10000 + i * 0x1000, 2000)],
            mb.at(0x20000 + i * 0x1000),
            mb.key,
        ));
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaRead,
            vec![ma.sge(0x40000 + i * 0x1000, 1200)],
            mb.at(0x50000 + i * 0x1000),
            mb.key,
        ));
        c.send_a(&SendRequest {
            swap_add: 10,
            ..SendRequest::rdma(
                SqOpcode::AtomFetchAndAdd,
                vec![ma.sge(0x60000 + i * 8, 8)],
                mb.at(0x8000),
                mb.key,
            )
        });
    }
    c.run();
    let sent = c.cqes_a();
    assert_eq!(sent.len(), 16);
    assert!(sent.iter().all(|e| e.status() == 0), "{sent:?}");
    let received = c.cqes_b();
    assert_eq!(received.len(), 4, "one receive per SEND: {received:?}");
    for i in 0..4u64 {
        assert_eq!(c.bytes_b(i * 0x1000, 1500), c.bytes_a(i * 0x1000, 1500));
        assert_eq!(
            c.bytes_b(0x20000 + i * 0x1000, 2000),
            c.bytes_a(0x10000 + i * 0x1000, 2000)
        );
        assert_eq!(
            c.bytes_a(0x40000 + i * 0x1000, 1200),
            c.bytes_b(0x50000 + i * 0x1000, 1200)
        );
        assert_eq!(c.bytes_a(0x60000 + i * 8, 8), (1 + 10 * i).to_le_bytes(), "FAA {i}");
    }
    assert_eq!(c.bytes_b(0x8000, 8), 41u64.to_le_bytes(), "four additions, each once");
    assert!(c.pair.b().device.transport_counters().duplicate_requests > 0);
    assert!(c.pair.a().device.transport_counters().duplicate_responses > 0);
}

#[test]
fn a_reordered_packet_is_recovered() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let a = c.pair.a;
    let mut held = false;
    c.pair.tap(
        a,
        Box::new(move |_, repr| {
            if repr.bth.psn == 3 && !held {
                held = true;
                Fate::Hold
            } else {
                Fate::Pass
            }
        }),
    );
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 2048)],
        mb.at(0),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_b(0, 2048), c.bytes_a(0, 2048));
    assert!(c.pair.b().device.transport_counters().out_of_sequence >= 1);
}

/// Many messages of every kind over a wire that loses, duplicates, reorders, delays and
/// corrupts frames: everything completes, in order, with the right data.
#[test]
fn a_faulty_wire_delivers_everything_exactly_once() {
    for seed in [1u64, 2, 3] {
        let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, seed == 2, |spec| {
            spec.ack_timeout = 6; // 262 µs
            spec.retry_cnt = 7;
        });
        let (ma, mb) = (c.ma, c.mb);
        c.pair.fabric.set_faults(FaultPlan {
            loss: 0.03,
            duplicate: 0.03,
            reorder: 0.03,
            corrupt: 0.02,
            delay: 0.03,
            seed,
            ..FaultPlan::none()
        });
        c.pair
            .b()
            .memory
            .write(mb.bus + 0x3F_0000, &0u64.to_le_bytes())
            .unwrap();
        const ROUNDS: u64 = 12;
        for i in 0..ROUNDS {
            c.recv_b(&[mb.sge(i * 0x2000, 0x2000)]);
        }
        for i in 0..ROUNDS {
            let size = 1 + (i * 2777 % 7000) as u32;
            c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(i * 0x2000, size)]));
            c.send_a(&SendRequest::rdma(
                SqOpcode::RdmaWrite,
                vec![ma.sge(0x10_0000 + i * 0x2000, size)],
                mb.at(0x10_0000 + i * 0x2000),
                mb.key,
            ));
            c.send_a(&SendRequest::rdma(
                SqOpcode::RdmaRead,
                vec![ma.sge(0x20_0000 + i * 0x2000, size)],
                mb.at(0x20_0000 + i * 0x2000),
                mb.key,
            ));
            c.send_a(&SendRequest {
                swap_add: 1,
                ..SendRequest::rdma(
                    SqOpcode::AtomFetchAndAdd,
                    vec![ma.sge(0x30_0000 + i * 8, 8)],
                    mb.at(0x3F_0000),
                    mb.key,
                )
            });
        }
        c.run();
        let sent = c.cqes_a();
        assert_eq!(
            sent.len(),
            4 * ROUNDS as usize,
            "seed {seed}: {:?}",
            c.pair.a().device.transport_counters()
        );
        for (i, cqe) in sent.iter().enumerate() {
            assert_eq!(cqe.status(), 0, "seed {seed} WQE {i}: {cqe:?}");
            assert_eq!(cqe.wqe_index(), i as u16, "in order");
        }
        let received = c.cqes_b();
        assert_eq!(received.len(), ROUNDS as usize, "seed {seed}");
        let mut fetched = Vec::new();
        for i in 0..ROUNDS {
            let size = 1 + (i * 2777 % 7000) as usize;
            assert_eq!(received[i as usize].byte_count() as usize, size);
            assert_eq!(
                c.bytes_b(i * 0x2000, size),
                c.bytes_a(i * 0x2000, size),
                "seed {seed} SEND {i}"
            );
            assert_eq!(
                c.bytes_b(0x10_0000 + i * 0x2000, size),
                c.bytes_a(0x10_0000 + i * 0x2000, size),
                "seed {seed} WRITE {i}"
            );
            assert_eq!(
                c.bytes_a(0x20_0000 + i * 0x2000, size),
                c.bytes_b(0x20_0000 + i * 0x2000, size),
                "seed {seed} READ {i}"
            );
            fetched.push(u64::from_le_bytes(c.bytes_a(0x30_0000 + i * 8, 8).try_into().unwrap()));
        }
        assert_eq!(
            fetched,
            (0..ROUNDS).collect::<Vec<_>>(),
            "seed {seed}: each addition once, in order"
        );
        assert_eq!(c.bytes_b(0x3F_0000, 8), ROUNDS.to_le_bytes());
        let stats = c.pair.fabric.statistics();
        assert!(stats.dropped > 0 && stats.duplicated > 0, "seed {seed}: {stats:?}");
    }
}

/// Four QP pairs share a lossy wire; each pair's data and order survive.
#[test]
fn many_qps_share_a_faulty_wire() {
    let mut pair = Pair::new(false);
    let (a, b) = (pair.a, pair.b);
    let mut cq_a = pair.h(a).create_polled_cq(1, 256);
    let mut cq_b = pair.h(b).create_polled_cq(1, 256);
    let bus_a = pair.h(a).allocate_filled(0x40000, pattern(1));
    let bus_b = pair.h(b).allocate_filled(0x40000, pattern(2));
    let access = rnic_testbench::harness::Access::ALL;
    let physical = rnic_testbench::harness::MrMode::Physical;
    let ma = pair.h(a).register_mr(1, bus_a, 0x40000, 1, access, physical);
    let mb = pair.h(b).register_mr(1, bus_b, 0x40000, 1, access, physical);
    let mut qps = Vec::new();
    for i in 0..4u32 {
        let mut spec = rnic_testbench::harness::QpSpec::rc(0x100 + i, 1, 0x200 + i);
        spec.dmac = mac(2);
        spec.dgid = gid(2, false);
        spec.ack_timeout = 6;
        spec.mtu = Mtu::Mtu512;
        let qa = pair.h(a).create_qp(&spec);
        spec.qpn = 0x200 + i;
        spec.dest_qpn = 0x100 + i;
        spec.dmac = mac(1);
        spec.dgid = gid(1, false);
        let qb = pair.h(b).create_qp(&spec);
        qps.push((qa, qb));
    }
    pair.sync();
    pair.fabric.set_faults(FaultPlan {
        loss: 0.05,
        reorder: 0.05,
        seed: 99,
        ..FaultPlan::none()
    });
    for (i, (qa, qb)) in qps.iter_mut().enumerate() {
        let base = i as u64 * 0x10000;
        for k in 0..4u64 {
            pair.h(b).post_recv(qb, &[mb.sge(base + k * 0x2000, 0x2000)]);
            let h = pair.h(a);
            h.post_send(
                qa,
                &SendRequest::new(SqOpcode::Send, vec![ma.sge(base + k * 0x2000, 5000)]),
            );
            h.post_send(
                qa,
                &SendRequest::rdma(
                    SqOpcode::RdmaRead,
                    vec![ma.sge(base + 0x8000 + k * 0x2000, 3000)],
                    mb.at(base + 0x8000 + k * 0x2000),
                    mb.key,
                ),
            );
        }
    }
    for (qa, _) in &qps {
        pair.h(a).ring_send(qa);
    }
    pair.run();
    let sent = pair.h(a).poll_cq(&mut cq_a);
    assert_eq!(sent.len(), 32);
    assert!(sent.iter().all(|e| e.status() == 0), "{sent:?}");
    let received = pair.h(b).poll_cq(&mut cq_b);
    assert_eq!(received.len(), 16);
    for qpn in 0x100..0x104u32 {
        let indices: Vec<u16> = sent
            .iter()
            .filter(|e| e.local_qp_number() == qpn)
            .map(|e| e.wqe_index())
            .collect();
        assert_eq!(indices, (0..8).collect::<Vec<u16>>(), "QP {qpn:#x} completes in order");
    }
    for i in 0..4u64 {
        let base = i * 0x10000;
        for k in 0..4u64 {
            let at = base + k * 0x2000;
            assert_eq!(
                pair.h(b).read_bytes(bus_b + at, 5000),
                pair.h(a).read_bytes(bus_a + at, 5000)
            );
            let at = base + 0x8000 + k * 0x2000;
            assert_eq!(
                pair.h(a).read_bytes(bus_a + at, 3000),
                pair.h(b).read_bytes(bus_b + at, 3000)
            );
        }
    }
}
