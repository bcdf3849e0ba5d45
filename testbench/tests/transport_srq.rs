//! An SRQ shared by two RC QPs: receives come from its index queue in order, the CQEs
//! name the WQE slots and the QPs, the limit event fires once when fewer than LIMIT_WL
//! WQEs remain and disarms the limit, and an empty SRQ answers with RNR NAKs.

mod transport_common;

use rnic_firmware_if::context::{Mtu, Srqc};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::MailboxOpcode;
use rnic_firmware_if::wqe::SqOpcode;
use rnic_testbench::harness::{Access, MrMode, QpSpec, SendRequest};
use transport_common::*;

#[test]
fn two_qps_share_an_srq_and_the_limit_event_fires_once() {
    let mut pair = Pair::new(false);
    let (a, b) = (pair.a, pair.b);
    // Node 1: two QPs, each on its own CQ.
    let ha = pair.h(a);
    let mut cqa = ha.create_polled_cq(1, 64);
    let bus_a = ha.allocate_filled(0x10000, pattern(1));
    let ma = ha.register_mr(1, bus_a, 0x10000, 1, Access::ALL, MrMode::Physical);
    let mut spec = QpSpec::rc(0x10, 1, 0x20);
    spec.mtu = Mtu::Mtu512;
    spec.dmac = mac(2);
    spec.dgid = gid(2, false);
    let mut qa1 = ha.create_qp(&spec);
    spec.qpn = 0x11;
    spec.dest_qpn = 0x21;
    let mut qa2 = ha.create_qp(&spec);
    // Node 2: an SRQ with limit 3 shared by two QPs.
    let hb = pair.h(b);
    let mut cqb = hb.create_polled_cq(1, 64);
    let bus_b = hb.allocate_filled(0x10000, pattern(2));
    let mb = hb.register_mr(1, bus_b, 0x10000, 1, Access::ALL, MrMode::Physical);
    let mut srq = hb.create_srq(5, 1, 16, 1, 3);
    let mut spec = QpSpec::rc(0x20, 1, 0x10);
    spec.mtu = Mtu::Mtu512;
    spec.dmac = mac(1);
    spec.dgid = gid(1, false);
    spec.srq = Some(5);
    spec.rnr_retry = 7;
    hb.create_qp(&spec);
    spec.qpn = 0x21;
    spec.dest_qpn = 0x11;
    hb.create_qp(&spec);
    for i in 0..4u64 {
        hb.post_srq(
            &mut srq,
            &[mb.sge(i * 0x1000, 0x800), mb.sge(i * 0x1000 + 0x800, 0x800)],
        );
    }
    hb.take_async_events();
    pair.sync();

    // Two messages from each QP, alternating.
    for round in 0..2u64 {
        for (qp, offset) in [(&mut qa1, 0x100u64), (&mut qa2, 0x200)] {
            let ha = pair.h(a);
            ha.post_send(
                qp,
                &SendRequest::new(SqOpcode::Send, vec![ma.sge(offset + round * 0x1000, 1500)]),
            );
            ha.ring_send(qp);
        }
        pair.run();
    }
    let sent = pair.h(a).poll_cq(&mut cqa);
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|e| e.status() == 0), "{sent:?}");
    let received = pair.h(b).poll_cq(&mut cqb);
    let seen: Vec<(u32, u16, u32)> = received
        .iter()
        .map(|e| (e.local_qp_number(), e.wqe_index(), e.byte_count()))
        .collect();
    assert_eq!(
        seen,
        [(0x20, 0, 1500), (0x21, 1, 1500), (0x20, 2, 1500), (0x21, 3, 1500)],
        "slots in index-queue order, each QP named"
    );
    for (slot, source) in [(0u64, 0x100u64), (1, 0x200), (2, 0x1100), (3, 0x1200)] {
        let landed = pair.h(b).read_bytes(bus_b + slot * 0x1000, 1500);
        let sent = pair.h(a).read_bytes(bus_a + source, 1500);
        assert_eq!(landed, sent, "slot {slot}");
    }
    let events: Vec<(u8, u32)> = pair
        .h(b)
        .take_async_events()
        .iter()
        .map(|e| (e.event_type(), e.queue_number()))
        .collect();
    assert_eq!(
        events,
        [(AsyncEventType::SrqLimitReach as u8, 5)],
        "one limit event (2 < 3 after the second receive), then disarmed"
    );
    let (_, srqc) = pair.h(b).query::<Srqc>(MailboxOpcode::QuerySrqc, 5);
    assert_eq!(srqc.limit_watermark(), 0, "disarmed");
    assert_eq!(srqc.consumer_index(), 4);

    // The SRQ is empty: the next SEND is RNR-NAKed until a WQE is posted.
    let ha = pair.h(a);
    ha.post_send(&mut qa1, &SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]));
    ha.ring_send(&qa1);
    pair.run_for(rnic_hw_model::Picoseconds::from_micros(200));
    assert!(pair.h(b).device.transport_counters().rnr_naks_sent >= 1);
    let hb = pair.h(b);
    let slot = hb.post_srq(&mut srq, &[mb.sge(0x8000, 0x100)]);
    pair.run();
    single(&pair.h(a).poll_cq(&mut cqa), CqeStatus::Success);
    let cqe = single(&pair.h(b).poll_cq(&mut cqb), CqeStatus::Success);
    assert_eq!(u32::from(cqe.wqe_index()), slot);
}
