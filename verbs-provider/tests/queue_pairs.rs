//! Queue pairs: the state machine through MODIFY_QPC, what QUERY_QPC returns, and what
//! the device refuses.

mod common;

use common::{assert_no_diagnostics, create_qp, open, to_init, to_rtr, to_rts, to_state};
use rnic_firmware_if::context::ServiceType;
use rnic_firmware_if::mailbox::MailboxCompletion;
use rnic_verbs::{
    AccessFlags, AhAttributes, Gid, Mtu, QpAttributeMask, QpAttributes, QpCapabilities, QpInitAttributes, QpState,
    QpType, RcConnection, SrqAttributes,
};

const REMOTE_MAC: [u8; 6] = [0x02, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE];

fn remote_gid() -> Gid {
    Gid(rnic_verbs::driver::bringup::link_local_gid(REMOTE_MAC))
}

#[test]
fn every_transport_walks_reset_init_rtr_rts_err_reset() {
    for qp_type in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let (device, context) = open();
        let pd = context.alloc_pd().unwrap();
        let cq = context.create_cq(256, None, 0).unwrap();
        let qp = create_qp(&pd, &cq, qp_type);
        assert_eq!(qp.state(), QpState::Reset);
        assert_eq!(qp.query().unwrap().qp_state, QpState::Reset);

        to_init(&qp);
        assert_eq!(qp.query().unwrap().qp_state, QpState::Init, "{qp_type:?}");
        to_rtr(&qp, 0x77, remote_gid(), REMOTE_MAC);
        assert_eq!(qp.query().unwrap().qp_state, QpState::Rtr, "{qp_type:?}");
        to_rts(&qp);
        assert_eq!(qp.query().unwrap().qp_state, QpState::Rts, "{qp_type:?}");
        to_state(&qp, QpState::Err).unwrap();
        assert_eq!(qp.query().unwrap().qp_state, QpState::Err, "{qp_type:?}");
        to_state(&qp, QpState::Reset).unwrap();
        assert_eq!(qp.state(), QpState::Reset);

        let qpc = qp.query_context().unwrap();
        let expected = match qp_type {
            QpType::Rc => ServiceType::Rc,
            QpType::Uc => ServiceType::Uc,
            QpType::Ud => ServiceType::Ud,
        };
        assert_eq!(qpc.service_type(), Ok(expected));

        // And round again from RESET, as a QP may be reused.
        to_init(&qp);
        qp.destroy().unwrap();
        cq.destroy().unwrap();
        assert_eq!(context.chunks_in_use(), 0, "{qp_type:?}");
        assert_no_diagnostics(&device);
    }
}

#[test]
fn query_returns_the_attributes_set_by_modify() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let send_cq = context.create_cq(64, None, 0).unwrap();
    let recv_cq = context.create_cq(64, None, 1).unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            srq: None,
            cap: common::small_caps(),
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap();
    to_init(&qp);

    let path = AhAttributes {
        dgid: remote_gid(),
        flow_label: 0x12345,
        sgid_index: 0,
        hop_limit: 33,
        traffic_class: 0x68,
        dmac: REMOTE_MAC,
        sl: 5,
        ..AhAttributes::default()
    };
    let rtr = QpAttributes {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu2048,
        dest_qp_num: 0xABCDE,
        rq_psn: 0x10_0000,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 18,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ah_attr: path,
        ..QpAttributes::default()
    };
    qp.modify(
        &rtr,
        QpAttributeMask::STATE
            | QpAttributeMask::AV
            | QpAttributeMask::PATH_MTU
            | QpAttributeMask::DEST_QPN
            | QpAttributeMask::RQ_PSN
            | QpAttributeMask::MAX_DEST_RD_ATOMIC
            | QpAttributeMask::MIN_RNR_TIMER
            | QpAttributeMask::ACCESS_FLAGS,
    )
    .unwrap();
    let rts = QpAttributes {
        qp_state: QpState::Rts,
        sq_psn: 0xFF_FFFE,
        timeout: 17,
        retry_cnt: 6,
        rnr_retry: 3,
        max_rd_atomic: 8,
        ..QpAttributes::default()
    };
    qp.modify(
        &rts,
        QpAttributeMask::STATE
            | QpAttributeMask::SQ_PSN
            | QpAttributeMask::TIMEOUT
            | QpAttributeMask::RETRY_CNT
            | QpAttributeMask::RNR_RETRY
            | QpAttributeMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();

    let got = qp.query().unwrap();
    assert_eq!(got.qp_state, QpState::Rts);
    assert_eq!(got.path_mtu, Mtu::Mtu2048);
    assert_eq!(got.dest_qp_num, 0xABCDE);
    assert_eq!(got.rq_psn, 0x10_0000);
    assert_eq!(got.sq_psn, 0xFF_FFFE);
    assert_eq!(got.max_dest_rd_atomic, 16);
    assert_eq!(got.max_rd_atomic, 8);
    assert_eq!(got.min_rnr_timer, 18);
    assert_eq!(got.timeout, 17);
    assert_eq!(got.retry_cnt, 6);
    assert_eq!(got.rnr_retry, 3);
    assert_eq!(
        got.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        "QPCs hold remote access only"
    );
    assert_eq!(got.ah_attr.dgid, remote_gid());
    assert_eq!(got.ah_attr.flow_label, 0x12345);
    assert_eq!(got.ah_attr.hop_limit, 33);
    assert_eq!(got.ah_attr.traffic_class, 0x68);
    assert_eq!(got.ah_attr.dmac, REMOTE_MAC);
    assert_eq!(got.ah_attr.sl, 5);
    assert_eq!(got.cap.max_send_wr, 64);
    assert_eq!(got.port_num, 1);

    // What the device holds beyond ibverbs' view.
    let qpc = qp.query_context().unwrap();
    assert_eq!(qpc.send_cq_number(), send_cq.cq_number());
    assert_eq!(qpc.receive_cq_number(), recv_cq.cq_number());
    assert_eq!(qpc.protection_domain(), pd.pd_number());
    assert!(!qpc.signal_requested_only(), "sq_sig_all");
    assert_eq!(qpc.raq_psn(), 0x0F_FFFF, "rq_psn − 1");
    assert_eq!(qpc.retry_message_psn(), 0xFF_FFFE);
    assert!(!qpc.loopback());
    assert!(qpc.udp_source_port() >= 0xC000);
    assert_eq!(qpc.sq_shift(), 6);
    assert_ne!(qpc.wqe_sge_base_address(), 0);
    assert_ne!(qpc.sq_current_block_address(), 0);

    // An RTS→RTS modify changes only what it names.
    qp.modify(
        &QpAttributes {
            timeout: 20,
            ..QpAttributes::default()
        },
        QpAttributeMask::TIMEOUT,
    )
    .unwrap();
    let again = qp.query().unwrap();
    assert_eq!(again.timeout, 20);
    assert_eq!(again.dest_qp_num, 0xABCDE);
    assert_eq!(again.qp_state, QpState::Rts);

    qp.destroy().unwrap();
    assert_no_diagnostics(&device);
}

#[test]
fn connect_rc_takes_a_fresh_rc_qp_to_rts_with_every_value_it_is_given() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let connection = RcConnection {
        path_mtu: Mtu::Mtu2048,
        dest_qp_num: 0x1234,
        rq_psn: 0x10_0000,
        sq_psn: 0xFF_FFFE,
        ah_attr: AhAttributes {
            dgid: remote_gid(),
            dmac: REMOTE_MAC,
            hop_limit: 33,
            traffic_class: 0x68,
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: 16,
        min_rnr_timer: 18,
        max_rd_atomic: 8,
        timeout: 17,
        retry_cnt: 6,
        rnr_retry: 3,
    };

    qp.connect_rc(&connection).unwrap();

    let got = qp.query().unwrap();
    assert_eq!(got.qp_state, QpState::Rts);
    assert_eq!(
        got.qp_access_flags,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    );
    assert_eq!(got.port_num, 1);
    assert_eq!(got.pkey_index, 0);
    assert_eq!(got.path_mtu, connection.path_mtu);
    assert_eq!(got.dest_qp_num, connection.dest_qp_num);
    assert_eq!(got.rq_psn, connection.rq_psn);
    assert_eq!(got.sq_psn, connection.sq_psn);
    assert_eq!(got.ah_attr.dgid, connection.ah_attr.dgid);
    assert_eq!(got.ah_attr.dmac, connection.ah_attr.dmac);
    assert_eq!(got.ah_attr.hop_limit, connection.ah_attr.hop_limit);
    assert_eq!(got.ah_attr.traffic_class, connection.ah_attr.traffic_class);
    assert_eq!(got.max_dest_rd_atomic, connection.max_dest_rd_atomic);
    assert_eq!(got.min_rnr_timer, connection.min_rnr_timer);
    assert_eq!(got.max_rd_atomic, connection.max_rd_atomic);
    assert_eq!(got.timeout, connection.timeout);
    assert_eq!(got.retry_cnt, connection.retry_cnt);
    assert_eq!(got.rnr_retry, connection.rnr_retry);

    assert_no_diagnostics(&device);

    // A second connect starts with →INIT, which the device refuses from RTS: the QP stays.
    let refused = qp.connect_rc(&connection).unwrap_err();
    assert_eq!(
        refused.mailbox_completion(),
        Some(MailboxCompletion::InvalidState),
        "RTS→INIT"
    );
    assert_eq!(qp.query().unwrap().qp_state, QpState::Rts);
    qp.destroy().unwrap();
    drop(device);
}

#[test]
fn illegal_transitions_are_refused_by_the_device_and_it_keeps_working() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);

    let refused = to_state(&qp, QpState::Rts).unwrap_err();
    assert_eq!(
        refused.mailbox_completion(),
        Some(MailboxCompletion::InvalidState),
        "RESET→RTS: {refused}"
    );
    assert_eq!(refused.errno(), 22, "EINVAL");
    assert_eq!(qp.state(), QpState::Reset);

    let refused = to_state(&qp, QpState::Rtr).unwrap_err();
    assert_eq!(refused.mailbox_completion(), Some(MailboxCompletion::InvalidState));

    to_init(&qp);
    let refused = to_state(&qp, QpState::Rts).unwrap_err();
    assert_eq!(
        refused.mailbox_completion(),
        Some(MailboxCompletion::InvalidState),
        "INIT→RTS: {refused}"
    );
    assert_eq!(qp.state(), QpState::Init);
    assert_eq!(qp.query().unwrap().qp_state, QpState::Init);

    // The device still works: the legal path continues and new objects come up.
    to_rtr(&qp, 9, remote_gid(), REMOTE_MAC);
    to_rts(&qp);
    let refused = to_state(&qp, QpState::Rtr).unwrap_err();
    assert_eq!(
        refused.mailbox_completion(),
        Some(MailboxCompletion::InvalidState),
        "RTS→RTR"
    );
    assert_eq!(qp.query().unwrap().qp_state, QpState::Rts);
    let other = create_qp(&pd, &cq, QpType::Ud);
    to_init(&other);
    other.destroy().unwrap();
    qp.destroy().unwrap();
    drop(device);
}

#[test]
fn unsupported_and_out_of_range_attributes_are_refused_by_the_driver() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let attr = QpAttributes {
        qp_state: QpState::Init,
        ..QpAttributes::default()
    };
    let error = qp
        .modify(&attr, QpAttributeMask::STATE | QpAttributeMask::ALT_PATH)
        .unwrap_err();
    assert_eq!(error.errno(), 95, "EOPNOTSUPP");
    let error = qp
        .modify(
            &QpAttributes { port_num: 2, ..attr },
            QpAttributeMask::STATE | QpAttributeMask::PORT,
        )
        .unwrap_err();
    assert_eq!(error.errno(), 22);
    let error = qp
        .modify(
            &QpAttributes { timeout: 32, ..attr },
            QpAttributeMask::STATE | QpAttributeMask::TIMEOUT,
        )
        .unwrap_err();
    assert_eq!(error.errno(), 22);
    assert_eq!(qp.state(), QpState::Reset);
}

#[test]
fn queue_pair_capabilities_are_rounded_and_bounded() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: 100,
                max_recv_wr: 3,
                max_send_sge: 5,
                max_recv_sge: 3,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    let cap = qp.cap();
    assert_eq!(cap.max_send_wr, 128);
    assert_eq!(cap.max_recv_wr, 64, "at least min_wqes");
    assert_eq!(cap.max_recv_sge, 4);
    let info = qp.buffer_info();
    assert_eq!(info.sq_depth, 128);
    assert_eq!(info.sge_count, 512, "128 WQEs × 3 extended SGEs, rounded up");
    assert_eq!(info.rq_stride, 64);
    assert_eq!(info.region_offsets, [0, 8192, 16384]);
    assert_eq!(qp.sge_address(0).unwrap(), qp.sq_wqe_address(0).unwrap() + 8192);

    let too_deep = pd.create_qp(&QpInitAttributes {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCapabilities {
            max_send_wr: 1 << 20,
            ..QpCapabilities::default()
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    });
    assert_eq!(too_deep.unwrap_err().errno(), 22);
}

#[test]
fn a_queue_pair_on_a_shared_receive_queue_has_no_rq_and_keeps_the_srq_alive() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 64,
            max_sge: 2,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(&srq),
            cap: common::small_caps(),
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    assert_eq!(qp.buffer_info().rq_depth, 0);
    assert_eq!(qp.rq_wqe_address(0), None);
    to_init(&qp);
    let qpc = qp.query_context().unwrap();
    assert!(qpc.srq_enable());
    assert_eq!(qpc.srq_number(), srq.srq_number());

    let srq = srq.destroy().unwrap_err().object.expect("busy: handed back");
    // Destroying a QP that is not in RESET moves it there first.
    qp.destroy().unwrap();
    srq.destroy().unwrap();
    cq.destroy().unwrap();
    assert_eq!(context.chunks_in_use(), 0);
    assert_no_diagnostics(&device);
}

#[test]
fn doorbells_reach_the_device_without_complaint() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    to_init(&qp);
    qp.ring_rq_doorbell(0);
    to_rtr(&qp, 5, remote_gid(), REMOTE_MAC);
    to_rts(&qp);
    qp.ring_sq_doorbell(0);
    let before = device.with_device(|d| d.counters());
    cq.req_notify(true);
    let after = device.with_device(|d| d.counters());
    assert_eq!(after.doorbells, before.doorbells + 1);
    assert_eq!(after.doorbells_dropped, before.doorbells_dropped);
    to_state(&qp, QpState::Err).unwrap();
    qp.destroy().unwrap();
    assert_no_diagnostics(&device);
}

#[test]
fn illegal_transitions_report_the_same_status_in_mailbox_poll_mode() {
    let device = rnic_verbs::backend::EmbeddedDevice::new();
    let config = rnic_verbs::driver::DriverConfig {
        mailbox_event_mode: false,
        ..Default::default()
    };
    let context = rnic_verbs::Context::open_with_config(Box::new(device), &config).unwrap();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Uc);
    let refused = to_state(&qp, QpState::Rts).unwrap_err();
    assert_eq!(refused.mailbox_completion(), Some(MailboxCompletion::InvalidState));
    to_init(&qp);
    assert_eq!(
        to_state(&qp, QpState::Rts).unwrap_err().mailbox_completion(),
        Some(MailboxCompletion::InvalidState)
    );
    to_rtr(&qp, 3, remote_gid(), REMOTE_MAC);
    to_rts(&qp);
}
