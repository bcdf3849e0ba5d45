//! UC and UD end to end: UC messages and a message lost to a PSN gap; UD over IPv4 and
//! IPv6 with the GRH in the receive buffer, Q_Key checks, QP1, immediate and inline data,
//! and the limits of one-packet messages.

mod transport_common;

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::cqe::{CqeStatus, RecvOpcode};
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::wire;
use rnic_testbench::harness::{
    Access, CompletionQueue, MemoryRegion, MrMode, QpSpec, QueuePair, SendRequest, UdDestination,
};
use transport_common::*;

// ---- UC ---------------------------------------------------------------------------------

#[test]
fn uc_sends_and_writes_arrive() {
    let mut c = connect(ServiceType::Uc, Mtu::Mtu512, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    c.recv_b(&[mb.sge(0, 0x2000)]);
    c.recv_b(&[mb.sge(0x2000, 0x10)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 3000)]));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0x4000, 5000)],
        mb.at(0x10000),
        mb.key,
    ));
    c.send_a(&SendRequest {
        immediate: 77,
        ..SendRequest::rdma(
            SqOpcode::RdmaWriteWithImm,
            vec![ma.sge(0x8000, 100)],
            mb.at(0x20000),
            mb.key,
        )
    });
    c.run();
    let sent = c.cqes_a();
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|e| e.status() == 0));
    let received = c.cqes_b();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].byte_count(), 3000);
    assert_eq!(received[1].opcode(), RecvOpcode::RdmaWriteWithImm as u8);
    assert_eq!(received[1].immediate_data(), 77);
    assert_eq!(c.bytes_b(0, 3000), c.bytes_a(0, 3000));
    assert_eq!(c.bytes_b(0x10000, 5000), c.bytes_a(0x4000, 5000));
    assert_eq!(c.bytes_b(0x20000, 100), c.bytes_a(0x8000, 100));
    let frames = c.pair.fabric.statistics().sent;
    assert_eq!(frames, 6 + 10 + 1, "UC sends no acknowledgements");
}

#[test]
fn uc_drops_a_message_with_a_lost_packet_and_reuses_its_receive() {
    let mut c = connect(ServiceType::Uc, Mtu::Mtu256, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let a = c.pair.a;
    // The middle packet of the first SEND (PSN 1) is lost.
    c.pair.tap(
        a,
        Box::new(|_, repr| if repr.bth.psn == 1 { Fate::Drop } else { Fate::Pass }),
    );
    c.recv_b(&[mb.sge(0, 0x1000)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 700)]));
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0x1000, 300)]));
    c.run();
    let sent = c.cqes_a();
    assert_eq!(
        sent.len(),
        2,
        "the requester completes both: UC has no acknowledgements"
    );
    assert!(sent.iter().all(|e| e.status() == 0));
    let received = single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(
        received.wqe_index(),
        0,
        "the second message landed in the first receive"
    );
    assert_eq!(received.byte_count(), 300);
    assert_eq!(c.bytes_b(0, 300), c.bytes_a(0x1000, 300));
    assert_eq!(c.pair.b().device.transport_counters().messages_dropped, 1);
}

#[test]
fn uc_refuses_reads_and_atomics() {
    let mut c = connect(ServiceType::Uc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0, 8)],
        mb.at(0),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::LocalQpOpErr);
}

/// Found by the `work_requests` fuzz target (docs/fuzzing.md): UC has no SEND with
/// Invalidate (IETH exists for RC and XRC only); the requester built a frame with the
/// undefined opcode 0x37 instead of refusing the WQE.
#[test]
fn uc_refuses_send_with_invalidate() {
    let mut c = connect(ServiceType::Uc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    c.recv_b(&[mb.sge(0, 0x1000)]);
    c.send_a(&SendRequest {
        immediate: mb.key,
        ..SendRequest::new(SqOpcode::SendWithInv, vec![ma.sge(0, 100)])
    });
    c.run();
    single(&c.cqes_a(), CqeStatus::LocalQpOpErr);
    assert!(c.cqes_b().is_empty(), "nothing reached the responder");
    assert_eq!(c.pair.fabric.statistics().sent, 0, "no frame went out");
}

// ---- UD ---------------------------------------------------------------------------------

struct UdSetup {
    pair: Pair,
    qa: QueuePair,
    qb: QueuePair,
    ca: CompletionQueue,
    cb: CompletionQueue,
    ma: MemoryRegion,
    mb: MemoryRegion,
    ipv6: bool,
}

const QKEY: u32 = 0x1234_5678;

fn ud(ipv6: bool, qpn_b: u32, qkey_b: u32) -> UdSetup {
    let mut pair = Pair::new(ipv6);
    let make = |h: &mut rnic_testbench::harness::RegisterHarness, qpn: u32, qkey: u32, n: u8| {
        let cq = h.create_polled_cq(1, 64);
        let bus = h.allocate_filled(0x10000, pattern(n));
        let mr = h.register_mr(1, bus, 0x10000, 1, Access::ALL, MrMode::Physical);
        let mut spec = QpSpec::rc(qpn, 1, 0);
        spec.service = ServiceType::Ud;
        spec.qkey = qkey;
        (h.create_qp(&spec), cq, mr)
    };
    let (qa, ca, ma) = make(pair.a(), 0x10, QKEY, 1);
    let (qb, cb, mb) = make(pair.b(), qpn_b, qkey_b, 2);
    pair.sync();
    UdSetup {
        pair,
        qa,
        qb,
        ca,
        cb,
        ma,
        mb,
        ipv6,
    }
}

impl UdSetup {
    fn destination(&self, qkey: u32) -> UdDestination {
        UdDestination {
            dmac: mac(2),
            dgid: gid(2, self.ipv6),
            dest_qpn: self.qb.qpn,
            qkey,
            sgid_index: 0,
            hop_limit: 17,
            traffic_class: 0x28,
            flow_label: 0x12345,
        }
    }

    fn send(&mut self, request: SendRequest) {
        let a = self.pair.a;
        let h = self.pair.h(a);
        h.post_send(&mut self.qa, &request);
        h.ring_send(&self.qa);
    }

    fn recv(&mut self, offset: u64, length: u32) {
        let b = self.pair.b;
        let mb = self.mb;
        self.pair.h(b).post_recv(&mut self.qb, &[mb.sge(offset, length)]);
    }

    fn cqes(&mut self) -> (Vec<rnic_firmware_if::cqe::Cqe>, Vec<rnic_firmware_if::cqe::Cqe>) {
        let (a, b) = (self.pair.a, self.pair.b);
        let (mut ca, mut cb) = (self.ca.clone(), self.cb.clone());
        let sent = self.pair.h(a).poll_cq(&mut ca);
        let received = self.pair.h(b).poll_cq(&mut cb);
        self.ca = ca;
        self.cb = cb;
        (sent, received)
    }
}

fn ud_send_with_grh(ipv6: bool) {
    let mut u = ud(ipv6, 0x20, QKEY);
    u.pair.fabric.set_capture(true);
    u.recv(0, 4096);
    let ma = u.ma;
    let mut request = SendRequest::new(SqOpcode::SendWithImm, vec![ma.sge(0x100, 1000)]);
    request.immediate = 0xABCD;
    request.ud = Some(u.destination(QKEY));
    u.send(request);
    u.pair.run();
    let (sent, received) = u.cqes();
    single(&sent, CqeStatus::Success);
    let cqe = single(&received, CqeStatus::Success);
    assert_eq!(cqe.opcode(), RecvOpcode::SendWithImm as u8);
    assert_eq!(cqe.immediate_data(), 0xABCD);
    assert_eq!(cqe.byte_count(), 40 + 1000, "the GRH counts");
    assert!(cqe.grh_present());
    assert_eq!(cqe.remote_qp_number(), 0x10);
    assert_eq!(cqe.source_mac_bytes(), mac(1));
    // The frame as it went out: the header of the GRH slot is its IP header.
    let capture = u.pair.fabric.take_capture();
    assert_eq!(capture.len(), 1);
    let frame = &capture[0].bytes;
    let parsed = wire::parse_frame(frame).unwrap();
    assert_eq!(parsed.repr.deth.unwrap().qkey, QKEY);
    assert_eq!(parsed.repr.deth.unwrap().source_qp, 0x10);
    let mb = u.mb;
    let b = u.pair.b;
    let landed = u.pair.h(b).read_bytes(mb.bus, 1040);
    match parsed.repr.ip {
        wire::IpRepr::V4(v4) => {
            assert!(!ipv6);
            assert_eq!(v4.ttl, 17);
            assert_eq!(v4.dscp, 0x28 >> 2);
            assert!(v4.dont_fragment);
            assert_eq!(&landed[..20], &[0u8; 20]);
            assert_eq!(&landed[20..40], &frame[14..34]);
        }
        wire::IpRepr::V6(v6) => {
            assert!(ipv6);
            assert_eq!(v6.hop_limit, 17);
            assert_eq!(v6.traffic_class, 0x28);
            assert_eq!(v6.flow_label, 0x12345);
            assert_eq!(&landed[..40], &frame[14..54]);
        }
    }
    let a = u.pair.a;
    let source = u.pair.h(a).read_bytes(ma.bus + 0x100, 1000);
    assert_eq!(&landed[40..], &source[..]);
}

#[test]
fn ud_over_ipv4_delivers_the_ip_header_as_grh() {
    ud_send_with_grh(false);
}

#[test]
fn ud_over_ipv6_delivers_the_ip_header_as_grh() {
    ud_send_with_grh(true);
}

#[test]
fn ud_with_the_wrong_qkey_is_dropped() {
    let mut u = ud(false, 0x20, QKEY);
    u.recv(0, 4096);
    let ma = u.ma;
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]);
    request.ud = Some(u.destination(QKEY ^ 1));
    u.send(request);
    u.pair.run();
    let (sent, received) = u.cqes();
    single(&sent, CqeStatus::Success);
    assert!(received.is_empty());
    let b = u.pair.b;
    assert_eq!(u.pair.h(b).device.transport_counters().qkey_violations, 1);
    // A Q_Key with bit 31 set means "the QP's own": QKEY, accepted.
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]);
    request.ud = Some(u.destination(0x8000_0000));
    u.send(request);
    u.pair.run();
    let (sent, received) = u.cqes();
    single(&sent, CqeStatus::Success);
    single(&received, CqeStatus::Success);
}

#[test]
fn qp1_receives_ud_with_the_gsi_qkey() {
    const GSI_QKEY: u32 = 0x8001_0000;
    let mut u = ud(false, 1, GSI_QKEY);
    u.recv(0, 512);
    let ma = u.ma;
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 256)]);
    // The sender's own Q_Key is not the GSI one: name it explicitly... which has bit 31
    // set and so means "the QP's own". A GSI sender's QP carries 0x80010000 itself.
    request.ud = Some(u.destination(GSI_QKEY));
    u.send(request);
    u.pair.run();
    let (sent, received) = u.cqes();
    single(&sent, CqeStatus::Success);
    assert!(received.is_empty(), "QKEY of QP 0x10 is not the GSI Q_Key");
    // From a sender whose QP holds the GSI Q_Key.
    let mut g = ud(false, 1, GSI_QKEY);
    let a = g.pair.a;
    let mut spec = g.qa.spec;
    spec.qpn = 0x11;
    spec.qkey = GSI_QKEY;
    g.qa = g.pair.h(a).create_qp(&spec);
    g.pair.sync();
    g.recv(0, 512);
    let ma = g.ma;
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 256)]);
    request.ud = Some(g.destination(GSI_QKEY));
    g.send(request);
    g.pair.run();
    let (sent, received) = g.cqes();
    single(&sent, CqeStatus::Success);
    let cqe = single(&received, CqeStatus::Success);
    assert_eq!(cqe.local_qp_number(), 1);
    assert_eq!(cqe.remote_qp_number(), 0x11);
}

#[test]
fn qp1_uses_the_gsi_qkey_whatever_its_context_holds() {
    const GSI_QKEY: u32 = rnic_firmware_if::context::GSI_QKEY;
    // QP1's context holds Q_Key 0 (a driver that never set it): the device still
    // receives with the GSI Q_Key and drops anything else.
    let mut u = ud(false, 1, 0);
    u.recv(0, 512);
    u.recv(0x1000, 512);
    let ma = u.ma;
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 256)]);
    request.ud = Some(u.destination(0));
    u.send(request);
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 256)]);
    request.ud = Some(u.destination(0x0001_0000));
    u.send(request);
    u.pair.run();
    let (sent, received) = u.cqes();
    assert_eq!(sent.len(), 2);
    assert!(received.is_empty(), "Q_Keys 0 and 0x10000 are not the GSI Q_Key");
    let b = u.pair.b;
    assert_eq!(u.pair.h(b).device.transport_counters().qkey_violations, 2);
    // A sender naming the GSI Q_Key itself is accepted; so is one whose own QP is QP1
    // (bit 31 set: "the QP's own", which for QP1 is always the GSI Q_Key).
    let mut g = ud(false, 1, 0);
    let a = g.pair.a;
    let mut spec = g.qa.spec;
    spec.qpn = 1;
    spec.qkey = 0;
    g.qa = g.pair.h(a).create_qp(&spec);
    g.pair.sync();
    g.pair.fabric.set_capture(true);
    g.recv(0, 512);
    let ma = g.ma;
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 256)]);
    request.ud = Some(g.destination(GSI_QKEY));
    g.send(request);
    g.pair.run();
    let (sent, received) = g.cqes();
    single(&sent, CqeStatus::Success);
    let cqe = single(&received, CqeStatus::Success);
    assert_eq!(cqe.local_qp_number(), 1);
    assert_eq!(cqe.remote_qp_number(), 1);
    assert_eq!(cqe.byte_count(), 40 + 256);
    let capture = g.pair.fabric.take_capture();
    let deth = wire::parse_frame(&capture[0].bytes).unwrap().repr.deth.unwrap();
    assert_eq!((deth.qkey, deth.source_qp), (GSI_QKEY, 1));
}

#[test]
fn qp0_does_not_exist_on_roce() {
    let mut pair = Pair::new(false);
    let a = pair.a;
    let h = pair.h(a);
    // The QPC table has an entry for QPN 0; the device refuses it all the same.
    h.ensure_context(rnic_testbench::harness::Table::Qpc, 0);
    h.device.take_diagnostics();
    assert_eq!(
        h.move_qp(0, rnic_firmware_if::context::QpState::Init),
        rnic_firmware_if::mailbox::MailboxCompletion::InvalidIndex
    );
    let diagnostics = h.device.take_diagnostics();
    assert!(
        diagnostics.iter().any(|d| d.to_string().contains("no SMI QP")),
        "{diagnostics:?}"
    );
}

#[test]
fn ud_inline_data_small_and_large() {
    let mut u = ud(false, 0x20, QKEY);
    for (i, size) in [5usize, 8, 100].into_iter().enumerate() {
        u.recv(i as u64 * 0x1000, 0x1000);
        let data: Vec<u8> = (0..size).map(|b| (b as u8) ^ 0x5A).collect();
        let mut request = SendRequest::new(SqOpcode::Send, vec![]);
        request.inline = Some(data.clone());
        request.ud = Some(u.destination(QKEY));
        u.send(request);
        u.pair.run();
        let (sent, received) = u.cqes();
        single(&sent, CqeStatus::Success);
        let cqe = single(&received, CqeStatus::Success);
        assert_eq!(cqe.byte_count() as usize, 40 + size);
        let b = u.pair.b;
        let bus = u.mb.bus + i as u64 * 0x1000 + 40;
        assert_eq!(u.pair.h(b).read_bytes(bus, size), data, "inline {size}");
    }
}

#[test]
fn ud_messages_are_one_packet_and_need_a_receive() {
    let mut u = ud(false, 0x20, QKEY);
    let ma = u.ma;
    // No receive posted: dropped, the sender completes anyway.
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]);
    request.ud = Some(u.destination(QKEY));
    u.send(request);
    u.pair.run();
    let (sent, received) = u.cqes();
    single(&sent, CqeStatus::Success);
    assert!(received.is_empty());
    // A receive too small for GRH + payload completes with a local length error.
    u.recv(0, 100);
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]);
    request.ud = Some(u.destination(QKEY));
    u.send(request);
    u.pair.run();
    let (_, received) = u.cqes();
    single(&received, CqeStatus::LocalLengthErr);
    // More than one MTU (4096) cannot be sent.
    let mut request = SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 5000)]);
    request.ud = Some(u.destination(QKEY));
    u.send(request);
    u.pair.run();
    let (sent, _) = u.cqes();
    single(&sent, CqeStatus::LocalLengthErr);
}
