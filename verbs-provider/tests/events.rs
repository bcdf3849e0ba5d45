//! Asynchronous events: the device reports through the AEQ, the driver consumes the
//! entries, and `get_async_event` hands them out.

mod common;

use common::open;
use rnic_firmware_if::doorbell::{CqDoorbell, DB_OFFSET};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::regs;
use rnic_verbs::{AsyncEventElement, AsyncEventKind, DeviceAccess};

#[test]
fn a_doorbell_for_a_destroyed_cq_raises_cq_id_invalid() {
    let (device, context) = open();
    assert_eq!(context.get_async_event(), None, "nothing happened yet");

    let cq = context.create_cq(64, None, 0).unwrap();
    let cqn = cq.cq_number();
    cq.destroy().unwrap();

    // A stale doorbell, written straight to the doorbell page as a buggy user would.
    let stale = CqDoorbell::arm(cqn, 0, 1, false);
    device.mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, stale.as_u64());

    let event = context
        .wait_async_event(1_000_000)
        .expect("an asynchronous event within 1 ms");
    assert_eq!(event.hardware_type, Some(AsyncEventType::CqIdInvalid));
    assert_eq!(event.event_type, AsyncEventKind::CqError);
    assert_eq!(event.element, AsyncEventElement::Cq(cqn));
    assert_eq!(context.get_async_event(), None, "exactly one event");

    // The device keeps working after the event.
    let cq = context.create_cq(64, None, 0).unwrap();
    assert_eq!(cq.query().unwrap().cq_number, cq.cq_number());
}

#[test]
fn the_async_event_interrupt_fires_on_the_aeq_vector() {
    let (device, context) = open();
    let cq = context.create_cq(64, None, 0).unwrap();
    let cqn = cq.cq_number();
    drop(cq);
    device.poll_interrupts();
    device.mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, CqDoorbell::update(cqn, 1).as_u64());
    let vectors = device.wait_interrupt(1_000_000);
    assert_eq!(vectors, vec![1], "MSI-X vector 1 is the AEQ");
    let event = context.get_async_event().expect("the event behind the interrupt");
    assert_eq!(event.element, AsyncEventElement::Cq(cqn));
}

#[test]
fn waiting_without_events_times_out_in_device_time() {
    let (device, context) = open();
    let before = device.now();
    assert_eq!(context.wait_async_event(50_000_000), None);
    let waited = device.now().0 - before.0;
    assert!(
        (50_000_000_000..=51_000_000_000).contains(&waited),
        "waited {waited} ps"
    );
}

#[test]
fn an_armed_cq_reports_a_flush_completion_through_its_completion_channel() {
    use rnic_firmware_if::bits::Layout;
    use rnic_firmware_if::cqe::{cqe_is_valid, Cqe, CqeStatus};
    use rnic_verbs::QpState;

    let (device, context) = open();
    let channel = context.create_comp_channel();
    let cq = context.create_cq(64, Some(&channel), 2).unwrap();
    let pd = context.alloc_pd().unwrap();
    let qp = common::create_qp(&pd, &cq, rnic_verbs::QpType::Rc);
    common::to_init(&qp);
    // One receive WQE outstanding (its contents do not matter for a flush).
    qp.ring_rq_doorbell(1);
    cq.req_notify(false);
    assert_eq!(channel.get_cq_event(), None);

    // Moving to ERR flushes the WQE: a WR_FLUSH_ERR CQE, then a CEQE for the armed CQ.
    common::to_state(&qp, QpState::Err).unwrap();
    let event = channel
        .wait_cq_event(1_000_000)
        .expect("a completion event within 1 ms");
    assert_eq!(event.cq_number, cq.cq_number());
    assert_eq!(cq.notifications(), 1);

    let mut raw = [0u8; 64];
    device.dma_read(cq.cqe_address(0).unwrap(), &mut raw).unwrap();
    let cqe = Cqe::parse(&raw).unwrap();
    assert!(cqe_is_valid(cqe.owner(), 0, cq.cqe()));
    assert_eq!(cqe.status(), CqeStatus::WrFlushErr as u8);
    assert!(cqe.receive_side());
    assert_eq!(cqe.local_qp_number(), qp.qp_num());
    common::assert_no_diagnostics(&device);
}

#[test]
fn an_event_that_arrives_while_a_mailbox_waits_is_kept_for_get_async_event() {
    let (device, context) = open();
    let cq = context.create_cq(64, None, 0).unwrap();
    let cqn = cq.cq_number();
    cq.destroy().unwrap();
    device.mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, CqDoorbell::arm(cqn, 0, 1, true).as_u64());
    // The next mailbox command's completion arrives on the AEQ after the CQ event.
    let pd = context.alloc_pd().unwrap();
    let mr = pd
        .register_provider_memory(4096, rnic_verbs::AccessFlags::LOCAL_WRITE)
        .unwrap();
    let event = context.get_async_event().expect("kept while the mailbox waited");
    assert_eq!(event.element, AsyncEventElement::Cq(cqn));
    assert_eq!(context.get_async_event(), None);
    mr.deregister().unwrap();
}
