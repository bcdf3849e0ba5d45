//! RC end to end between two register-level NICs: every opcode, sizes and MTUs, SGEs
//! and inline data.

mod transport_common;

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::cqe::{CqeStatus, RecvOpcode};
use rnic_firmware_if::wqe::SqOpcode;
use rnic_testbench::harness::SendRequest;
use transport_common::*;

#[test]
fn a_send_arrives_and_both_sides_complete() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let mut qb = c.qb.clone();
    c.pair.b().post_recv(&mut qb, &[mb.sge(0, 4096)]);
    c.qb = qb;
    let mut qa = c.qa.clone();
    c.pair.a().post_send(&mut qa, &SendRequest::new(SqOpcode::Send, vec![ma.sge(100, 3000)]));
    c.pair.a().ring_send(&qa);
    c.qa = qa;
    c.run();
    let sent = c.cqes_a();
    let received = c.cqes_b();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].status(), CqeStatus::Success as u8);
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].status(), CqeStatus::Success as u8);
    assert_eq!(received[0].opcode(), RecvOpcode::Send as u8);
    assert_eq!(received[0].byte_count(), 3000);
    let source = c.pair.a().read_bytes(ma.bus + 100, 3000);
    let target = c.pair.b().read_bytes(mb.bus, 3000);
    assert_eq!(source, target);
}
