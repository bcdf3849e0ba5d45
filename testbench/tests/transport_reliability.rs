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

const READ_REQUEST: u8 = 0x0C;

/// Whether `repr` is an RC READ response (FIRST, MIDDLE, LAST or ONLY).
fn is_read_response(repr: &rnic_hw_model::wire::RoceRepr) -> bool {
    (0x0D..=0x10).contains(&repr.bth.opcode.0)
}

/// One READ response (by PSN) or one READ request (by PSN) overtaken by the next frame
/// of its port: the requester sees the gap (an out-of-sequence response is an implied
/// NAK, a request overtaken draws a sequence NAK), asks again from the first missing
/// PSN with the RETH advanced, drops the late and repeated responses, and every READ
/// completes with the right bytes — without waiting for the ACK timer.
#[test]
fn a_reordered_read_response_or_request_is_recovered() {
    // Three READs of 4 responses each (MTU 256): PSNs 0..=3, 4..=7 and 8..=11. A held
    // frame needs a later one of its port to pass it, so the last of each kind is not held.
    const LENGTH: u32 = 1000;
    const READS: u64 = 3;
    let cases = (0..11u32).map(|psn| (true, psn)).chain([(false, 0), (false, 4)]);
    for (response, psn) in cases {
        let what = if response { "response" } else { "request" };
        let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
        let (ma, mb) = (c.ma, c.mb);
        let (a, b) = (c.pair.a, c.pair.b);
        let mut held = false;
        c.pair.tap(
            if response { b } else { a },
            Box::new(move |_, repr| {
                let kind = if response {
                    is_read_response(repr)
                } else {
                    repr.bth.opcode.0 == READ_REQUEST
                };
                if kind && repr.bth.psn == psn && !held {
                    held = true;
                    Fate::Hold
                } else {
                    Fate::Pass
                }
            }),
        );
        for i in 0..READS {
            c.send_a(&SendRequest::rdma(
                SqOpcode::RdmaRead,
                vec![ma.sge(i * 0x1000, LENGTH)],
                mb.at(0x8000 + i * 0x1000),
                mb.key,
            ));
        }
        c.run();
        let cqes = c.cqes_a();
        assert_eq!(cqes.len(), READS as usize, "{what} {psn}: {cqes:?}");
        for (i, cqe) in cqes.iter().enumerate() {
            assert_eq!(cqe.status(), 0, "{what} {psn}: READ {i}: {cqe:?}");
            assert_eq!(cqe.wqe_index(), i as u16, "{what} {psn}: in order");
        }
        for i in 0..READS {
            assert_eq!(
                c.bytes_a(i * 0x1000, LENGTH as usize),
                c.bytes_b(0x8000 + i * 0x1000, LENGTH as usize),
                "{what} {psn}: READ {i}"
            );
        }
        let (ca, cb) = (
            c.pair.a().device.transport_counters(),
            c.pair.b().device.transport_counters(),
        );
        assert!(ca.retries >= 1, "{what} {psn}: the gap was seen: {ca:?}");
        assert_eq!(ca.ack_timeouts, 0, "{what} {psn}: recovered without the timer: {ca:?}");
        assert!(cb.duplicate_requests >= 1, "{what} {psn}: the READ came again: {cb:?}");
        assert!(c.diagnostics().is_empty(), "{what} {psn}: {:?}", c.diagnostics());
    }
}

/// As many READs in flight as the responder has resources, over a wire that reorders
/// READ responses and READ requests (every few frames one is overtaken by the next):
/// the go-back-N rounds make the responder serve duplicates again while new READs keep
/// arriving, and the re-served duplicates must not count as outstanding READs (they did,
/// and the next new READ was NAKed as one too many: the QP failed with
/// TRANSPORT_RETRY_EXC_ERR). Every READ completes, in order, with the right bytes.
#[test]
fn many_reads_in_flight_survive_reordered_responses_and_requests() {
    for (mtu, length, every) in [
        (Mtu::Mtu1024, 3000u32, 7usize),
        (Mtu::Mtu256, 1000, 5),
        (Mtu::Mtu512, 512, 3),
    ] {
        let mut c = connect(ServiceType::Rc, mtu, false, |spec| {
            // 4 READs outstanding, 4 responder resources.
            spec.sr_max = 2;
            spec.rr_max = 2;
            spec.ack_timeout = 8;
        });
        let (ma, mb) = (c.ma, c.mb);
        let (a, b) = (c.pair.a, c.pair.b);
        // Every `every`-th READ response and every other READ request is overtaken by
        // the next frame of its port (a held frame goes right after that one).
        c.pair.tap(
            b,
            Box::new(move |index, repr| {
                if is_read_response(repr) && index % every == 1 {
                    Fate::Hold
                } else {
                    Fate::Pass
                }
            }),
        );
        c.pair.tap(
            a,
            Box::new(move |index, repr| {
                if repr.bth.opcode.0 == READ_REQUEST && index % 2 == 0 {
                    Fate::Hold
                } else {
                    Fate::Pass
                }
            }),
        );
        const READS: u64 = 48;
        for i in 0..READS {
            c.send_a(&SendRequest::rdma(
                SqOpcode::RdmaRead,
                vec![ma.sge(i * 0x1000, length)],
                mb.at(0x10_0000 + i * 0x1000),
                mb.key,
            ));
        }
        c.run();
        let cqes = c.cqes_a();
        let (ca, cb) = (
            c.pair.a().device.transport_counters(),
            c.pair.b().device.transport_counters(),
        );
        assert_eq!(cqes.len(), READS as usize, "MTU {mtu:?}: {ca:?} {cb:?}");
        for (i, cqe) in cqes.iter().enumerate() {
            assert_eq!(cqe.status(), 0, "MTU {mtu:?} READ {i}: {cqe:?} {:?}", c.diagnostics());
            assert_eq!(cqe.wqe_index(), i as u16, "MTU {mtu:?}: in order");
        }
        for i in 0..READS {
            assert_eq!(
                c.bytes_a(i * 0x1000, length as usize),
                c.bytes_b(0x10_0000 + i * 0x1000, length as usize),
                "MTU {mtu:?} READ {i}"
            );
        }
        assert!(
            ca.retries > 0 && cb.duplicate_requests > 0,
            "MTU {mtu:?}: {ca:?} {cb:?}"
        );
        assert!(c.diagnostics().is_empty(), "MTU {mtu:?}: {:?}", c.diagnostics());
    }
}

/// NAK syndrome bits 7:5 (IBA 9.7.5.2.1): 0b011 = NAK.
fn is_nak(r: &rnic_hw_model::wire::RoceRepr) -> bool {
    r.aeth.is_some_and(|aeth| aeth.syndrome >> 5 == 0b011)
}

#[test]
fn a_go_back_n_resends_a_burst_of_16_psns_not_the_whole_window() {
    // A slow peer overrun by a resent window drops most of it and the retry never ends
    // (rdma_rxe under TCG did): after a retry only 16 PSNs beyond the oldest
    // unacknowledged one may be in flight until an acknowledgement makes progress.
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |spec| {
        spec.ack_timeout = 4;
        spec.retry_cnt = 2;
    });
    let (ma, mb) = (c.ma, c.mb);
    let (a, b) = (c.pair.a, c.pair.b);
    let sent = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = sent.clone();
    let mut lost = false;
    c.pair.tap(
        a,
        Box::new(move |_, r| {
            log.borrow_mut().push(r.bth.psn);
            if r.bth.psn == 2 && !lost {
                lost = true;
                return Fate::Drop;
            }
            Fate::Pass
        }),
    );
    // The responder's sequence NAK gets through, nothing after it: no progress ever.
    let mut nak_sent = false;
    c.pair.tap(
        b,
        Box::new(move |_, r| {
            if nak_sent {
                return Fate::Drop;
            }
            nak_sent = is_nak(r);
            Fate::Pass
        }),
    );
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 64 << 10)],
        mb.at(0),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::TransportRetryExcErr);
    let sent = sent.borrow();
    // The first round runs until the NAK is back; the go-back-N starts at PSN 2 again.
    let first_round = 3 + sent[3..].iter().position(|&psn| psn == 2).unwrap();
    let resent = &sent[first_round..];
    assert!(first_round > 16, "the first round was not held back: {sent:?}");
    // RETRY_CNT 2: the NAK's retry and one timeout's, then the next timeout gives up.
    assert_eq!(resent.len(), 2 * 16, "two bursts of 16: {resent:?}");
    assert!(
        resent.chunks(16).all(|burst| burst.iter().copied().eq(2..18)),
        "{resent:?}"
    );
}

#[test]
fn an_acknowledgement_after_a_retry_reopens_the_window_and_the_write_lands() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |spec| spec.ack_timeout = 4);
    let (ma, mb) = (c.ma, c.mb);
    let a = c.pair.a;
    c.pair.tap(a, drop_once(|r| r.bth.psn == 2));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 256 << 10)],
        mb.at(0),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_a(0, 256 << 10), c.bytes_b(0, 256 << 10));
    let ca = c.pair.a().device.transport_counters();
    assert_eq!(ca.retries, 1, "{ca:?}");
    assert_eq!(ca.ack_timeouts, 0, "{ca:?}");
}

#[test]
fn ack_timeouts_in_a_row_back_off_to_four_times_the_timeout() {
    // AT 4: 65.536 µs. Without an answer the timer runs 1, 2, 4 and 4 times that before
    // RETRY_CNT 3 is used up: the error comes after 11 × 65.536 = 721 µs, not 262 µs.
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| {
        spec.ack_timeout = 4;
        spec.retry_cnt = 3;
    });
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair.tap(b, Box::new(|_, _| Fate::Drop));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 100)],
        mb.at(0),
        mb.key,
    ));
    c.pair.run_for(rnic_hw_model::Picoseconds::from_micros(690));
    assert!(c.cqes_a().is_empty(), "still retrying after 10.5 timeouts");
    assert_eq!(c.pair.a().device.transport_counters().ack_timeouts, 3);
    c.pair.run_for(rnic_hw_model::Picoseconds::from_micros(60));
    single(&c.cqes_a(), CqeStatus::TransportRetryExcErr);
    assert_eq!(c.pair.a().device.transport_counters().ack_timeouts, 4);
}

#[test]
fn after_progress_the_next_message_is_timed_with_the_plain_timeout_again() {
    // AT 4: 65.536 µs. The first WRITE loses two ACKs: its timer runs 1 and 2 times the
    // timeout and is re-armed for 4 times when the third ACK arrives. That ACK is progress:
    // the backoff ends, and the second WRITE, whose first ACK is lost too, must be resent
    // one plain timeout after it went out. Before the fix the timer's one pending event
    // stayed at the backed-off deadline and the resend came ≈ 250 µs late (seen against
    // rxe: 8.6 s instead of 2.1 s at AT 19).
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.ack_timeout = 4);
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    let mut acks = 0;
    c.pair.tap(
        b,
        Box::new(move |_, repr| {
            if !is_plain_ack(repr) {
                return Fate::Pass;
            }
            acks += 1;
            // ACKs 1 and 2 of the first WRITE, and the first of the second.
            if matches!(acks, 1 | 2 | 4) {
                Fate::Drop
            } else {
                Fate::Pass
            }
        }),
    );
    let write = |at: u64| SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(at, 100)], mb.at(at), mb.key);
    c.send_a(&write(0));
    let step = rnic_hw_model::Picoseconds::from_micros(1);
    let mut waited = 0;
    while c.cqes_a().is_empty() {
        assert!(waited < 400, "the first WRITE did not complete within 400 µs");
        c.pair.run_for(step);
        waited += 1;
    }
    assert_eq!(c.pair.a().device.transport_counters().ack_timeouts, 2);
    c.send_a(&write(0x100));
    // One timeout (65.5 µs) and a round trip; the stale deadline was ≈ 250 µs away.
    c.pair.run_for(rnic_hw_model::Picoseconds::from_micros(100));
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.pair.a().device.transport_counters().ack_timeouts, 3);
    for at in [0, 0x100] {
        assert_eq!(c.bytes_a(at, 100), c.bytes_b(at, 100), "the WRITE at {at:#x}");
    }
}

/// A plain ACK (an Acknowledge with an ACK syndrome, not a NAK or RNR NAK).
fn is_plain_ack(repr: &rnic_hw_model::wire::RoceRepr) -> bool {
    repr.bth.opcode.0 == ACKNOWLEDGE && repr.aeth.is_some_and(|aeth| aeth.syndrome >> 5 == 0)
}

/// A WRITE (PSN 0) and then a READ or an atomic (PSN 1); the WRITE's ACK and the READ's
/// or atomic's answer are lost. The requester's timer sends both again: the WRITE is a
/// duplicate and is acknowledged again, but with the WRITE's PSN, never with PSN 1 — a
/// plain ACK naming a READ's PSN is taken by rxe as the READ's completion without its
/// data (nvmet-rdma then stored a buffer it never filled: zeros read back). Before the
/// fix the responder acknowledged the duplicate with `expected PSN − 1`, here 1.
#[test]
fn a_duplicate_write_is_acknowledged_with_a_write_psn_never_a_read_or_atomic_psn() {
    for second in [SqOpcode::RdmaRead, SqOpcode::AtomFetchAndAdd] {
        let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.ack_timeout = 4);
        let (ma, mb) = (c.ma, c.mb);
        let b = c.pair.b;
        let acknowledged = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = acknowledged.clone();
        let (mut ack_lost, mut answer_lost) = (false, false);
        c.pair.tap(
            b,
            Box::new(move |_, repr| {
                if is_plain_ack(repr) {
                    seen.borrow_mut().push(repr.bth.psn);
                    if !ack_lost {
                        ack_lost = true;
                        return Fate::Drop;
                    }
                }
                let answer = matches!(repr.bth.opcode.0, 0x10 | ATOMIC_ACKNOWLEDGE);
                if answer && !answer_lost {
                    answer_lost = true;
                    return Fate::Drop;
                }
                Fate::Pass
            }),
        );
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(0, 100)],
            mb.at(0),
            mb.key,
        ));
        c.send_a(&SendRequest::rdma(
            second,
            vec![ma.sge(0x1000, 8)],
            mb.at(0x2000),
            mb.key,
        ));
        c.run();
        let cqes = c.cqes_a();
        assert_eq!(cqes.len(), 2, "{second:?}: {cqes:?}");
        assert!(cqes.iter().all(|cqe| cqe.status() == 0), "{second:?}: {cqes:?}");
        let cb = c.pair.b().device.transport_counters();
        assert!(cb.duplicate_requests >= 2, "{second:?}: both came again: {cb:?}");
        let acknowledged = acknowledged.borrow();
        assert!(
            acknowledged.len() >= 2,
            "{second:?}: the duplicate WRITE was acknowledged again: {acknowledged:?}"
        );
        assert!(
            acknowledged.iter().all(|&psn| psn == 0),
            "{second:?}: plain ACKs name only the WRITE's PSN 0: {acknowledged:?}"
        );
    }
}

/// The requester's side of the same rule, against a responder that does send such an
/// ACK: the READ's response is lost and a plain ACK with the READ's PSN arrives in its
/// place. The ACK does not complete the READ (it would, without data); it means the
/// response was lost (implied NAK), the READ is asked again and completes with the
/// responder's bytes.
#[test]
fn a_plain_ack_naming_an_unanswered_read_is_an_implied_nak_not_its_completion() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    let mut replaced = false;
    c.pair.tap(
        b,
        Box::new(move |_, repr| {
            if repr.bth.opcode.0 != 0x10 || replaced {
                return Fate::Pass;
            }
            replaced = true;
            let mut ack = *repr;
            ack.bth.opcode = rnic_hw_model::wire::BthOpcode::RC_ACKNOWLEDGE;
            let mut frame = Vec::new();
            rnic_hw_model::wire::emit_frame(&ack, &[], &mut frame);
            Fate::Replace(frame)
        }),
    );
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0, 500)],
        mb.at(0x1000),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(
        c.bytes_a(0, 500),
        c.bytes_b(0x1000, 500),
        "the READ's data, not what was there"
    );
    assert_ne!(
        c.bytes_a(0, 500),
        Connection::initial(1, 0, 500),
        "the requester's buffer was written"
    );
    let (ca, cb) = (
        c.pair.a().device.transport_counters(),
        c.pair.b().device.transport_counters(),
    );
    assert_eq!(ca.retries, 1, "the ACK was an implied NAK: {ca:?}");
    assert_eq!(cb.duplicate_requests, 1, "the READ came again: {cb:?}");
}
