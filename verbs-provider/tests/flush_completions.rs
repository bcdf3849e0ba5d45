//! Polling completions the device makes without a peer: moving a QP with outstanding work
//! requests to ERR flushes every one of them (unsignaled ones included) with
//! `WrFlushErr`, and `poll` must give each back with the right `wr_id` and fields. Also:
//! the owner bit over CQ laps, CQ cleaning at destroy and reset, completion channels with
//! acknowledgement, and the status mapping.

mod common;

use common::{assert_no_diagnostics, create_qp_with, open, poll_n, to_init, to_rts_nowhere, to_state};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_verbs::{
    AtomicFields, DeviceAccess, QpCapabilities, QpInitAttributes, QpState, QpType, RdmaFields, RecvWorkRequest,
    SendFlags, SendWorkRequest, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

fn caps() -> QpCapabilities {
    QpCapabilities {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    }
}

/// 8 bytes in a real memory region, so the transport (which runs the WQEs of a QP in
/// RTS before it is moved to ERR) finds nothing wrong with them.
fn local(pd: &rnic_verbs::ProtectionDomain) -> (rnic_verbs::MemoryRegion, [Sge; 1]) {
    let mr = pd
        .register_provider_memory(4096, rnic_verbs::AccessFlags::LOCAL_WRITE)
        .unwrap();
    let sge = [Sge::new(mr.addr(), 8, mr.lkey())];
    (mr, sge)
}

fn wr(sg_list: &[Sge], wr_id: u64, opcode: WrOpcode, signaled: bool) -> SendWorkRequest<'_> {
    SendWorkRequest {
        wr_id,
        opcode,
        sg_list,
        send_flags: if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        },
        imm_data: 5,
        rdma: RdmaFields {
            remote_addr: 0x1000,
            rkey: 0x200,
        },
        atomic: AtomicFields {
            remote_addr: 0x1000,
            compare_add: 1,
            swap: 2,
            rkey: 0x200,
        },
        ..Default::default()
    }
}

fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        qp_num,
        ..WorkCompletion::default()
    }
}

#[test]
fn every_outstanding_send_comes_back_flushed_with_its_wr_id_unsignaled_ones_included() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps());
    to_rts_nowhere(&qp);
    let wrs = [
        wr(&sge, 10, WrOpcode::Send, true),
        wr(&sge, 11, WrOpcode::RdmaWrite, false),
        wr(&sge, 12, WrOpcode::RdmaRead, true),
        wr(&sge, 13, WrOpcode::AtomicCmpSwp, false),
        wr(&sge, 14, WrOpcode::SendWithImm, false),
        wr(&sge, 15, WrOpcode::AtomicFetchAdd, true),
        wr(&sge, 16, WrOpcode::RdmaWriteWithImm, false),
        wr(&sge, 17, WrOpcode::SendWithInv, false),
    ];
    qp.post_send(&wrs).unwrap();
    let mut none = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut none).unwrap(), 0, "nothing completes without a peer");

    to_state(&qp, QpState::Err).unwrap();
    let n = qp.qp_num();
    let with_imm = |wc: WorkCompletion| WorkCompletion {
        wc_flags: WcFlags::WITH_IMM,
        ..wc
    };
    let expected = [
        flushed(10, WcOpcode::Send, n),
        flushed(11, WcOpcode::RdmaWrite, n),
        flushed(12, WcOpcode::RdmaRead, n),
        flushed(13, WcOpcode::CompSwap, n),
        with_imm(flushed(14, WcOpcode::Send, n)),
        flushed(15, WcOpcode::FetchAdd, n),
        with_imm(flushed(16, WcOpcode::RdmaWrite, n)),
        flushed(17, WcOpcode::Send, n),
    ];
    // Two at a time: the poller keeps its place between calls.
    let mut got = Vec::new();
    let mut out = [WorkCompletion::default(); 2];
    loop {
        let polled = cq.poll(&mut out).unwrap();
        got.extend_from_slice(&out[..polled]);
        if polled < out.len() {
            break;
        }
    }
    assert_eq!(got, expected);
    assert_eq!(cq.consumer_index(), 8);
    let record = cq.record_doorbell().expect("the model has CQ_RECORD_DB");
    let mut published = [0u8; 4];
    device.dma_read(record, &mut published).unwrap();
    assert_eq!(u32::from_le_bytes(published), 8, "published in the record doorbell");

    // The queue is empty again: a full queue's worth can be posted (and is flushed at
    // once, the QP being in ERR).
    let again: Vec<_> = (0..64).map(|i| wr(&sge, 100 + i, WrOpcode::Send, false)).collect();
    qp.post_send(&again).unwrap();
    let wcs = poll_n(&device, &cq, 64);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(*wc, flushed(100 + i as u64, WcOpcode::Send, n));
    }
    assert_no_diagnostics(&device);
}

#[test]
fn outstanding_receives_are_flushed_in_order_on_their_own_cq() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let send_cq = context.create_cq(64, None, 0).unwrap();
    let recv_cq = context.create_cq(64, None, 1).unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            srq: None,
            cap: caps(),
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap();
    to_init(&qp);
    let recvs: Vec<_> = (0..5)
        .map(|i| RecvWorkRequest {
            wr_id: 0xF00 + i,
            sg_list: &sge,
        })
        .collect();
    qp.post_recv(&recvs).unwrap();
    to_state(&qp, QpState::Err).unwrap();
    let wcs = poll_n(&device, &recv_cq, 5);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(*wc, flushed(0xF00 + i as u64, WcOpcode::Recv, qp.qp_num()));
    }
    let mut out = [WorkCompletion::default(); 1];
    assert_eq!(send_cq.poll(&mut out).unwrap(), 0);

    // With sq_sig_all every WQE asks for a completion.
    qp.post_send(&[wr(&sge, 1, WrOpcode::Send, false)]).unwrap();
    let raw = common::read_memory(&device, qp.sq_wqe_address(0).unwrap(), 2);
    assert_eq!(raw[1] & 1, 1, "CQE bit");
    assert_eq!(poll_n(&device, &send_cq, 1)[0].wr_id, 1);
    assert_no_diagnostics(&device);
}

#[test]
fn the_owner_bit_is_followed_over_many_laps_of_the_cq() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    assert_eq!(cq.cqe(), 64);
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps());
    to_rts_nowhere(&qp);
    to_state(&qp, QpState::Err).unwrap();
    let mut next = 0u64;
    let mut out = [WorkCompletion::default(); 7];
    for _ in 0..10 {
        let wrs: Vec<_> = (0..40)
            .map(|i| wr(&sge, next + i, WrOpcode::RdmaWrite, false))
            .collect();
        qp.post_send(&wrs).unwrap();
        let mut seen = 0;
        while seen < 40 {
            let polled = cq.poll(&mut out).unwrap();
            assert!(polled > 0, "missing completions after {seen}");
            for wc in &out[..polled] {
                assert_eq!(wc.wr_id, next + seen);
                assert_eq!(wc.status, WcStatus::WrFlushErr);
                seen += 1;
            }
        }
        assert_eq!(cq.poll(&mut out).unwrap(), 0);
        next += 40;
    }
    assert_eq!(cq.consumer_index(), 400, "six laps and a bit");
    assert_no_diagnostics(&device);
}

#[test]
fn destroying_a_qp_removes_its_unpolled_completions_from_a_shared_cq() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    let a = create_qp_with(&pd, &cq, QpType::Rc, caps());
    let b = create_qp_with(&pd, &cq, QpType::Rc, caps());
    for qp in [&a, &b] {
        to_rts_nowhere(qp);
        to_state(qp, QpState::Err).unwrap();
    }
    // In ERR every post is flushed at its doorbell: the CQ holds A1 B1 A2 B2 A3.
    for (qp, wr_id) in [(&a, 1), (&b, 101), (&a, 2), (&b, 102), (&a, 3)] {
        qp.post_send(&[wr(&sge, wr_id, WrOpcode::Send, true)]).unwrap();
    }
    let b_num = b.qp_num();
    a.destroy().unwrap();
    assert_eq!(cq.consumer_index(), 3, "A's three CQEs consumed by the clean");
    let mut out = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut out).unwrap(), 2);
    assert_eq!(out[0], flushed(101, WcOpcode::Send, b_num));
    assert_eq!(out[1], flushed(102, WcOpcode::Send, b_num));
    assert_eq!(cq.poll(&mut out).unwrap(), 0);
    // The slots the clean moved keep working over the next lap.
    for wr_id in 200..300 {
        b.post_send(&[wr(&sge, wr_id, WrOpcode::Send, true)]).unwrap();
        assert_eq!(poll_n(&device, &cq, 1)[0].wr_id, wr_id);
    }
    assert_no_diagnostics(&device);
}

#[test]
fn reset_forgets_the_outstanding_work_and_the_qp_starts_over() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps());
    to_rts_nowhere(&qp);
    qp.post_send(&[wr(&sge, 1, WrOpcode::Send, true), wr(&sge, 2, WrOpcode::Send, false)])
        .unwrap();
    to_state(&qp, QpState::Err).unwrap();
    to_state(&qp, QpState::Reset).unwrap();
    let mut out = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut out).unwrap(), 0, "the flush CQEs were cleaned");
    assert_eq!(qp.heads(), (0, 0));
    to_rts_nowhere(&qp);
    qp.post_send(&[wr(&sge, 3, WrOpcode::Send, true)]).unwrap();
    let raw = common::read_memory(&device, qp.sq_wqe_address(0).unwrap(), 1);
    assert_eq!(raw[0] & 0x80, 0x80, "WQE 0 of lap 0 again");
    to_state(&qp, QpState::Err).unwrap();
    assert_eq!(poll_n(&device, &cq, 1)[0].wr_id, 3);
    assert_no_diagnostics(&device);
}

#[test]
fn an_armed_cq_signals_its_channel_and_waits_for_the_acknowledgement() {
    let (device, context) = open();
    let channel = context.create_comp_channel();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, Some(&channel), 1).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps());
    to_rts_nowhere(&qp);
    cq.req_notify(false);
    qp.post_send(&[wr(&sge, 7, WrOpcode::Send, false)]).unwrap();
    assert_eq!(channel.get_cq_event(), None, "nothing completed yet");
    to_state(&qp, QpState::Err).unwrap();
    let event = channel.wait_cq_event(1_000_000).expect("event");
    assert_eq!(event.cq_number, cq.cq_number());
    assert_eq!(cq.events_delivered(), 1);
    assert_eq!(poll_n(&device, &cq, 1)[0].wr_id, 7);

    // Not re-armed: the next completion raises no event.
    qp.post_send(&[wr(&sge, 8, WrOpcode::Send, false)]).unwrap();
    assert_eq!(channel.wait_cq_event(100_000), None);
    assert_eq!(poll_n(&device, &cq, 1)[0].wr_id, 8);

    // Re-armed for solicited completions only: an error completion qualifies.
    cq.req_notify(true);
    qp.post_send(&[wr(&sge, 9, WrOpcode::Send, false)]).unwrap();
    assert!(channel.wait_cq_event(1_000_000).is_some());
    assert_eq!(poll_n(&device, &cq, 1)[0].wr_id, 9);
    assert_eq!(cq.events_delivered(), 2);

    // Arming with a completion already waiting raises the event at once.
    qp.post_send(&[wr(&sge, 10, WrOpcode::Send, false)]).unwrap();
    cq.req_notify(false);
    assert!(channel.wait_cq_event(1_000_000).is_some());
    assert_eq!(poll_n(&device, &cq, 1)[0].wr_id, 10);

    qp.destroy().unwrap();
    let cq = cq.destroy().unwrap_err().object.expect("three events not acknowledged");
    cq.ack_events(2);
    let cq = cq.destroy().unwrap_err().object.expect("one event not acknowledged");
    cq.ack_events(1);
    cq.destroy().unwrap();
    assert_no_diagnostics(&device);
}

#[test]
fn hardware_statuses_map_to_the_ibverbs_names() {
    let table = [
        (CqeStatus::Success, WcStatus::Success),
        (CqeStatus::LocalLengthErr, WcStatus::LocLenErr),
        (CqeStatus::LocalQpOpErr, WcStatus::LocQpOpErr),
        (CqeStatus::LocalProtErr, WcStatus::LocProtErr),
        (CqeStatus::WrFlushErr, WcStatus::WrFlushErr),
        (CqeStatus::MwBindErr, WcStatus::MwBindErr),
        (CqeStatus::BadRespErr, WcStatus::BadRespErr),
        (CqeStatus::LocalAccessErr, WcStatus::LocAccessErr),
        (CqeStatus::RemoteInvalReqErr, WcStatus::RemInvReqErr),
        (CqeStatus::RemoteAccessErr, WcStatus::RemAccessErr),
        (CqeStatus::RemoteOpErr, WcStatus::RemOpErr),
        (CqeStatus::TransportRetryExcErr, WcStatus::RetryExcErr),
        (CqeStatus::RnrRetryExcErr, WcStatus::RnrRetryExcErr),
        (CqeStatus::RemoteAbortErr, WcStatus::RemAbortErr),
        (CqeStatus::GeneralErr, WcStatus::GeneralErr),
        (CqeStatus::XrcViolation, WcStatus::RemInvRdReqErr),
    ];
    assert_eq!(table.len(), CqeStatus::ALL.len());
    for (hardware, ibverbs) in table {
        assert_eq!(WcStatus::from_hardware(hardware as u8), ibverbs, "{hardware:?}");
    }
    assert_eq!(WcStatus::from_hardware(0x03), WcStatus::GeneralErr, "unknown");
    // The ibverbs numbering (the C layer passes these through).
    assert_eq!(WcStatus::RemAccessErr as u32, 10);
    assert_eq!(WcStatus::RetryExcErr as u32, 12);
    assert_eq!(WcStatus::GeneralErr as u32, 21);
    assert_eq!(WcOpcode::Recv as u32, 128);
    assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
    assert_eq!(WrOpcode::SendWithInv as u32, 9);
    assert_eq!(SendFlags::INLINE.bits(), 8);
    assert_eq!(WcFlags::WITH_INV.bits(), 8);
}

#[test]
fn the_device_reads_what_was_polled_from_the_cq_record_doorbell_so_only_an_unpolled_cq_overflows() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    let deep = QpCapabilities {
        max_send_wr: 128,
        ..caps()
    };
    let qp = create_qp_with(&pd, &cq, QpType::Rc, deep);
    to_rts_nowhere(&qp);
    to_state(&qp, QpState::Err).unwrap();
    let full: Vec<_> = (0..64).map(|i| wr(&sge, i, WrOpcode::Send, true)).collect();
    qp.post_send(&full).unwrap();
    assert_eq!(context.get_async_event(), None, "64 CQEs fill a 64-deep CQ exactly");

    let doorbells = device.with_device(|d| d.counters().doorbells);
    let mut one = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut one).unwrap(), 1);
    assert_eq!(
        device.with_device(|d| d.counters().doorbells),
        doorbells,
        "polling rings no set-CI doorbell"
    );
    let mut published = [0u8; 4];
    device.dma_read(cq.record_doorbell().unwrap(), &mut published).unwrap();
    assert_eq!(u32::from_le_bytes(published), 1);

    qp.post_send(&[wr(&sge, 64, WrOpcode::Send, true)]).unwrap();
    assert_eq!(context.get_async_event(), None, "the polled slot took the CQE");
    qp.post_send(&[wr(&sge, 65, WrOpcode::Send, true)]).unwrap();
    let event = context.wait_async_event(1_000_000).expect("CQ overflow reported");
    assert_eq!(
        event.hardware_type,
        Some(rnic_firmware_if::event::AsyncEventType::CqOverflow)
    );
    assert_eq!(event.element, rnic_verbs::AsyncEventElement::Cq(cq.cq_number()));
}

#[test]
fn a_destroyed_cqs_record_doorbell_is_reused_from_zero_and_its_page_freed() {
    let (device, context) = open();
    let buffers = device.dma_buffers_in_use();
    let first = context.create_cq(64, None, 0).unwrap();
    let slot = first.record_doorbell().expect("the model has CQ_RECORD_DB");
    assert_eq!(slot % 4, 0, "a 4-byte aligned slot");
    first.update_consumer_index(5);
    let mut value = [0u8; 4];
    device.dma_read(slot, &mut value).unwrap();
    assert_eq!(u32::from_le_bytes(value), 5);
    let second = context.create_cq(64, None, 0).unwrap();
    assert_ne!(second.record_doorbell(), Some(slot), "slots in use are distinct");
    first.destroy().unwrap();

    let third = context.create_cq(64, None, 0).unwrap();
    assert_eq!(
        third.record_doorbell(),
        Some(slot),
        "the freed slot is handed out again"
    );
    device.dma_read(slot, &mut value).unwrap();
    assert_eq!(u32::from_le_bytes(value), 0, "a new CQ starts from consumer index 0");
    second.destroy().unwrap();
    third.destroy().unwrap();
    assert_eq!(
        device.dma_buffers_in_use(),
        buffers,
        "the record page went back with its last slot"
    );
    assert_no_diagnostics(&device);
}

#[test]
fn without_the_cq_record_capability_the_poller_rings_the_set_ci_doorbell() {
    let mut config = rnic_verbs::backend::EmbeddedConfig::default();
    config
        .device
        .caps
        .flags
        .remove(rnic_firmware_if::caps::CapFlags::CQ_RECORD_DB);
    let (device, context) = common::open_with(config);
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    assert_eq!(cq.record_doorbell(), None);
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps());
    to_rts_nowhere(&qp);
    to_state(&qp, QpState::Err).unwrap();
    let mut out = [WorkCompletion::default(); 16];
    // Three laps: the device learns every consumer index from the set-CI doorbell.
    for lap in 0..12u64 {
        let wrs: Vec<_> = (0..16).map(|i| wr(&sge, lap * 16 + i, WrOpcode::Send, true)).collect();
        qp.post_send(&wrs).unwrap();
        let doorbells = device.with_device(|d| d.counters().doorbells);
        assert_eq!(cq.poll(&mut out).unwrap(), 16);
        assert_eq!(device.with_device(|d| d.counters().doorbells), doorbells + 1);
    }
    assert_eq!(
        cq.query().unwrap().consumer_index,
        192,
        "published with the set-CI doorbell"
    );
    assert_eq!(context.get_async_event(), None, "no overflow");
    assert_no_diagnostics(&device);
}
