//! What `post_send`, `post_recv` and `post_srq_recv` refuse, with the errno ibverbs
//! returns and the index of the first work request not posted (`bad_wr`).

mod common;

use common::{assert_no_diagnostics, create_qp_with, open, to_init, to_rts_nowhere, to_state};
use rnic_verbs::verbs::error::{EINVAL, ENOMEM};
use rnic_verbs::{
    AccessFlags, AhAttributes, AtomicFields, PostError, PostErrorKind, QpCapabilities, QpInitAttributes, QpState,
    QpType, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, SrqAttributes, UdFields, WrOpcode,
};

fn caps(max_inline_data: u32) -> QpCapabilities {
    QpCapabilities {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 2,
        max_inline_data,
    }
}

/// A refused request never reaches the device, so its SGE may name nothing.
const SGE: [Sge; 1] = [Sge::new(0x1000, 8, 0x100)];

/// 8 bytes in a real memory region, for requests that are posted (the transport runs
/// them, and would diagnose a bad key).
fn local(pd: &rnic_verbs::ProtectionDomain) -> (rnic_verbs::MemoryRegion, [Sge; 1]) {
    let mr = pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [Sge::new(mr.addr(), 8, mr.lkey())];
    (mr, sge)
}

fn send(sg_list: &[Sge], wr_id: u64) -> SendWorkRequest<'_> {
    SendWorkRequest {
        wr_id,
        sg_list,
        ..Default::default()
    }
}

#[test]
fn sends_need_rts_and_receives_anything_but_reset() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(0));
    let recv = [RecvWorkRequest {
        wr_id: 1,
        sg_list: &SGE,
    }];
    let refused = qp.post_send(&[send(&sge, 1)]).unwrap_err();
    assert_eq!(
        refused,
        PostError {
            index_of_bad_wr: 0,
            error: PostErrorKind::InvalidState(QpState::Reset)
        }
    );
    assert_eq!(refused.errno(), EINVAL);
    assert_eq!(
        qp.post_recv(&recv).unwrap_err().error,
        PostErrorKind::InvalidState(QpState::Reset)
    );
    to_init(&qp);
    assert_eq!(
        qp.post_send(&[send(&sge, 1)]).unwrap_err().error,
        PostErrorKind::InvalidState(QpState::Init)
    );
    qp.post_recv(&recv).expect("receives may be posted in INIT");
    let gid = rnic_verbs::Gid(rnic_verbs::driver::bringup::link_local_gid(common::NOWHERE_MAC));
    common::to_rtr(&qp, 5, gid, common::NOWHERE_MAC);
    assert_eq!(
        qp.post_send(&[send(&sge, 1)]).unwrap_err().error,
        PostErrorKind::InvalidState(QpState::Rtr)
    );
    common::to_rts(&qp);
    qp.post_send(&[send(&sge, 1)]).unwrap();
    assert_no_diagnostics(&device);
}

#[test]
fn a_full_send_queue_refuses_with_enomem_and_posts_what_fits() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(256, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(0));
    to_rts_nowhere(&qp);
    let depth = qp.cap().max_send_wr as usize;
    assert_eq!(depth, 64);
    let wrs: Vec<_> = (0..depth as u64 + 6).map(|i| send(&sge, i)).collect();
    let refused = qp.post_send(&wrs).unwrap_err();
    assert_eq!(refused.index_of_bad_wr, depth);
    assert_eq!(refused.error, PostErrorKind::QueueFull);
    assert_eq!(refused.errno(), ENOMEM);
    assert_eq!(qp.heads().0, depth as u32);
    assert_eq!(qp.query_context().unwrap().sq_producer_index(), depth as u16);
    // Still full on the next call.
    assert_eq!(
        qp.post_send(&[send(&sge, 99)]).unwrap_err().error,
        PostErrorKind::QueueFull
    );
    assert_no_diagnostics(&device);
}

#[test]
fn a_full_receive_queue_and_a_full_srq_refuse_with_enomem() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(256, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(0));
    to_init(&qp);
    let wrs: Vec<_> = (0..70)
        .map(|i| RecvWorkRequest {
            wr_id: i,
            sg_list: &sge,
        })
        .collect();
    let refused = qp.post_recv(&wrs).unwrap_err();
    assert_eq!((refused.index_of_bad_wr, refused.error), (64, PostErrorKind::QueueFull));
    assert_eq!(qp.heads().1, 64);

    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let refused = srq.post_srq_recv(&wrs).unwrap_err();
    assert_eq!((refused.index_of_bad_wr, refused.error), (64, PostErrorKind::QueueFull));
    assert_eq!(refused.errno(), ENOMEM);
    assert_eq!(srq.free_slots(), 0);
    assert_eq!(srq.query_context().unwrap().producer_index(), 64);
    assert_no_diagnostics(&device);
}

#[test]
fn too_many_sges_are_refused_with_einval() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(0));
    to_rts_nowhere(&qp);
    let five = [Sge::new(0x1000, 8, 0x100); 5];
    let wrs = [
        send(&sge, 1),
        send(&sge, 2),
        SendWorkRequest {
            wr_id: 3,
            sg_list: &five,
            ..Default::default()
        },
        send(&sge, 4),
    ];
    let refused = qp.post_send(&wrs).unwrap_err();
    assert_eq!(refused.index_of_bad_wr, 2, "the two before it are posted");
    assert_eq!(refused.error, PostErrorKind::TooManySges { given: 5, max: 4 });
    assert_eq!(refused.errno(), EINVAL);
    assert_eq!(qp.heads().0, 2);
    assert_eq!(qp.query_context().unwrap().sq_producer_index(), 2);

    let three = [Sge::new(0x1000, 8, 0x100); 3];
    let refused = qp
        .post_recv(&[RecvWorkRequest {
            wr_id: 1,
            sg_list: &three,
        }])
        .unwrap_err();
    assert_eq!(refused.error, PostErrorKind::TooManySges { given: 3, max: 2 });
    assert_no_diagnostics(&device);
}

#[test]
fn inline_data_is_limited_by_max_inline_data_and_the_path_mtu() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let mr = pd.register_provider_memory(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(64));
    to_rts_nowhere(&qp);
    fn inline(sges: &[Sge]) -> SendWorkRequest<'_> {
        SendWorkRequest {
            sg_list: sges,
            send_flags: SendFlags::INLINE,
            ..Default::default()
        }
    }
    let refused = qp
        .post_send(&[inline(&[Sge::new(mr.addr(), 65, mr.lkey())])])
        .unwrap_err();
    assert_eq!(refused.error, PostErrorKind::InlineTooLong { length: 65, max: 64 });
    assert_eq!(refused.errno(), EINVAL);
    qp.post_send(&[inline(&[Sge::new(mr.addr(), 64, mr.lkey())])]).unwrap();

    // A path MTU of 256 bytes caps inline data below max_inline_data.
    let big = create_qp_with(&pd, &cq, QpType::Rc, caps(1024));
    to_init(&big);
    let gid = rnic_verbs::Gid(rnic_verbs::driver::bringup::link_local_gid(common::NOWHERE_MAC));
    big.modify(
        &rnic_verbs::QpAttributes {
            qp_state: QpState::Rtr,
            path_mtu: rnic_verbs::Mtu::Mtu256,
            dest_qp_num: 3,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ah_attr: AhAttributes {
                dgid: gid,
                dmac: common::NOWHERE_MAC,
                ..AhAttributes::default()
            },
            ..Default::default()
        },
        rnic_verbs::QpAttributeMask::STATE
            | rnic_verbs::QpAttributeMask::AV
            | rnic_verbs::QpAttributeMask::PATH_MTU
            | rnic_verbs::QpAttributeMask::DEST_QPN
            | rnic_verbs::QpAttributeMask::RQ_PSN
            | rnic_verbs::QpAttributeMask::MAX_DEST_RD_ATOMIC
            | rnic_verbs::QpAttributeMask::MIN_RNR_TIMER,
    )
    .unwrap();
    common::to_rts(&big);
    let sges = [Sge::new(mr.addr(), 300, mr.lkey())];
    let refused = big
        .post_send(&[SendWorkRequest {
            sg_list: &sges,
            send_flags: SendFlags::INLINE,
            ..Default::default()
        }])
        .unwrap_err();
    assert_eq!(refused.error, PostErrorKind::InlineTooLong { length: 300, max: 256 });
    assert_no_diagnostics(&device);
}

#[test]
fn opcodes_the_transport_does_not_have_are_refused_with_einval() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let ah = pd
        .create_ah(&AhAttributes {
            dgid: rnic_verbs::Gid(rnic_verbs::driver::bringup::link_local_gid(common::NOWHERE_MAC)),
            ..AhAttributes::default()
        })
        .unwrap();
    let ud = Some(UdFields {
        ah: &ah,
        remote_qpn: 2,
        remote_qkey: 3,
    });
    for (qp_type, refused) in [
        (
            QpType::Uc,
            &[
                WrOpcode::RdmaRead,
                WrOpcode::AtomicCmpSwp,
                WrOpcode::AtomicFetchAdd,
                WrOpcode::SendWithInv,
            ][..],
        ),
        (
            QpType::Ud,
            &[
                WrOpcode::RdmaRead,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
                WrOpcode::AtomicCmpSwp,
                WrOpcode::AtomicFetchAdd,
                WrOpcode::SendWithInv,
            ][..],
        ),
    ] {
        let qp = create_qp_with(&pd, &cq, qp_type, caps(0));
        to_rts_nowhere(&qp);
        for &opcode in refused {
            let error = qp
                .post_send(&[SendWorkRequest {
                    opcode,
                    sg_list: &SGE,
                    ud,
                    ..Default::default()
                }])
                .unwrap_err();
            assert_eq!(
                error.error,
                PostErrorKind::OpcodeNotSupported { opcode, qp_type },
                "{opcode:?} on {qp_type:?}"
            );
            assert_eq!(error.errno(), EINVAL);
        }
        assert_eq!(qp.heads().0, 0);
    }
    assert_no_diagnostics(&device);
}

#[test]
fn rdma_read_cannot_be_inline_and_atomics_need_their_buffer() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(64));
    to_rts_nowhere(&qp);
    let error = qp
        .post_send(&[SendWorkRequest {
            opcode: WrOpcode::RdmaRead,
            sg_list: &SGE,
            send_flags: SendFlags::INLINE,
            ..Default::default()
        }])
        .unwrap_err();
    assert_eq!(
        error.error,
        PostErrorKind::OpcodeNotSupported {
            opcode: WrOpcode::RdmaRead,
            qp_type: QpType::Rc
        }
    );
    let error = qp
        .post_send(&[SendWorkRequest {
            opcode: WrOpcode::AtomicFetchAdd,
            atomic: AtomicFields {
                remote_addr: 8,
                compare_add: 1,
                swap: 0,
                rkey: 1,
            },
            ..Default::default()
        }])
        .unwrap_err();
    assert_eq!(error.error, PostErrorKind::MissingAtomicBuffer);
    assert_eq!(error.errno(), EINVAL);
    assert_no_diagnostics(&device);
}

#[test]
fn ud_sends_need_an_address_handle_of_the_same_device() {
    let (device, context) = open();
    let (_other_device, other) = open();
    let pd = context.alloc_pd().unwrap();
    let (_mr, sge) = local(&pd);
    let other_pd = other.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Ud, caps(0));
    to_rts_nowhere(&qp);
    assert_eq!(
        qp.post_send(&[send(&sge, 1)]).unwrap_err().error,
        PostErrorKind::BadAddressHandle
    );
    let foreign = other_pd.create_ah(&AhAttributes::default()).unwrap();
    let error = qp
        .post_send(&[SendWorkRequest {
            sg_list: &SGE,
            ud: Some(UdFields {
                ah: &foreign,
                remote_qpn: 1,
                remote_qkey: 1,
            }),
            ..Default::default()
        }])
        .unwrap_err();
    assert_eq!(error.error, PostErrorKind::BadAddressHandle);
    assert_eq!(error.errno(), EINVAL);
    assert_no_diagnostics(&device);
}

#[test]
fn a_qp_with_an_srq_takes_no_receives_of_its_own() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(&srq),
            cap: caps(0),
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    to_init(&qp);
    let error = qp
        .post_recv(&[RecvWorkRequest {
            wr_id: 1,
            sg_list: &SGE,
        }])
        .unwrap_err();
    assert_eq!(error.error, PostErrorKind::UsesSrq);
    assert_eq!(error.errno(), EINVAL);
    to_state(&qp, QpState::Err).unwrap();
    assert_no_diagnostics(&device);
}

#[test]
fn inline_data_outside_any_memory_is_a_fault() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp_with(&pd, &cq, QpType::Rc, caps(64));
    to_rts_nowhere(&qp);
    let sges = [Sge::new(0xDEAD_0000_0000, 16, 0)];
    let error = qp
        .post_send(&[SendWorkRequest {
            sg_list: &sges,
            send_flags: SendFlags::INLINE,
            ..Default::default()
        }])
        .unwrap_err();
    assert_eq!(error.error, PostErrorKind::BadAddress { addr: 0xDEAD_0000_0000 });
    assert_eq!(error.errno(), rnic_verbs::verbs::error::EFAULT);
    assert_eq!(qp.heads().0, 0);
    assert_no_diagnostics(&device);
}
