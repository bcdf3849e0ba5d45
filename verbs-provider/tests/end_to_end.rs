//! Two embedded NICs on one fabric, talking RoCEv2 through the model's transport: every
//! operation the verbs API posts, the payload bytes that arrive, and every field of every
//! work completion on both sides.

mod common;

use common::assert_no_diagnostics;
use rnic_hw_model::time::Picoseconds;
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric};
use rnic_verbs::{
    AccessFlags, AhAttributes, AsyncEventElement, AsyncEventKind, AtomicFields, CompletionChannel, CompletionQueue,
    Context, DeviceAccess, Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttributeMask, QpAttributes, QpCapabilities,
    QpInitAttributes, QpState, QpType, QueuePair, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge,
    SharedReceiveQueue, SrqAttributes, UdFields, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

const MAC_A: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x0A];
const MAC_B: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x0B];
const MR_SIZE: usize = 256 * 1024;
const QKEY: u32 = 0x1234_5678;

/// One NIC: device, context, PD, an MR of application memory (scattered pages), CQs, and
/// optionally an SRQ and a completion channel on the receive CQ.
struct Side {
    device: EmbeddedDevice,
    context: Context,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    channel: CompletionChannel,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
}

#[derive(Clone, Copy, Default)]
struct Options {
    srq: bool,
}

impl Side {
    fn new(fabric: &EmbeddedFabric, mac: [u8; 6], options: Options) -> Self {
        let device = fabric.add_nic(mac);
        let context = Context::open(Box::new(device.clone())).unwrap();
        let pd = context.alloc_pd().unwrap();
        let mr = pd
            .register_user_memory(
                vec![0u8; MR_SIZE],
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .unwrap();
        let channel = context.create_comp_channel();
        let send_cq = context.create_cq(256, None, 0).unwrap();
        let recv_cq = context.create_cq(256, Some(&channel), 1).unwrap();
        let srq = options.srq.then(|| {
            pd.create_srq(&SrqAttributes {
                max_wr: 64,
                max_sge: 2,
                srq_limit: 0,
            })
            .unwrap()
        });
        Self {
            device,
            context,
            pd,
            mr,
            channel,
            send_cq,
            recv_cq,
            srq,
        }
    }

    fn qp(&self, qp_type: QpType) -> QueuePair {
        self.pd
            .create_qp(&QpInitAttributes {
                send_cq: &self.send_cq,
                recv_cq: &self.recv_cq,
                srq: self.srq.as_ref(),
                cap: QpCapabilities {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 128,
                },
                qp_type,
                sq_sig_all: false,
            })
            .unwrap()
    }

    fn gid(&self) -> Gid {
        self.context.query_gid(1, 0).unwrap()
    }

    fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge::new(self.mr.addr() + offset, length, self.mr.lkey())
    }

    fn fill(&self, offset: u64, length: usize, seed: u8) -> Vec<u8> {
        let bytes: Vec<u8> = (0..length)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
            .collect();
        self.mr.write(offset, &bytes).unwrap();
        bytes
    }

    fn bytes(&self, offset: u64, length: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; length];
        self.mr.read(offset, &mut bytes).unwrap();
        bytes
    }

    /// Polls `cq` until `count` completions arrived, letting the fabric run in between.
    fn wait(&self, cq: &CompletionQueue, count: usize) -> Vec<WorkCompletion> {
        common::poll_n(&self.device, cq, count)
    }

    /// Lets the fabric run for `ns` and checks `cq` stayed empty.
    fn nothing_on(&self, cq: &CompletionQueue, ns: u64) {
        self.device.delay(ns);
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out).unwrap(), 0, "unexpected completion {:?}", out[0]);
    }
}

/// RESET→INIT→RTR→RTS of an RC/UC QP towards `remote` on `remote_side`.
fn connect(qp: &QueuePair, remote_side: &Side, remote: &QueuePair) {
    connect_with_timeout(qp, remote_side, remote, 14);
}

/// As [`connect`] with the local ACK timeout exponent `timeout` (4.096 µs × 2^timeout).
fn connect_with_timeout(qp: &QueuePair, remote_side: &Side, remote: &QueuePair, timeout: u8) {
    let rc = qp.qp_type() == QpType::Rc;
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::ACCESS_FLAGS,
    )
    .unwrap();
    let mut mask = QpAttributeMask::STATE
        | QpAttributeMask::AV
        | QpAttributeMask::PATH_MTU
        | QpAttributeMask::DEST_QPN
        | QpAttributeMask::RQ_PSN;
    if rc {
        mask |= QpAttributeMask::MAX_DEST_RD_ATOMIC | QpAttributeMask::MIN_RNR_TIMER;
    }
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: remote.qp_num(),
            rq_psn: 0x100,
            max_dest_rd_atomic: 8,
            min_rnr_timer: 1,
            ah_attr: AhAttributes {
                dgid: remote_side.gid(),
                dmac: remote_side.context.mac_address(),
                hop_limit: 64,
                ..AhAttributes::default()
            },
            ..QpAttributes::default()
        },
        mask,
    )
    .unwrap();
    let mut mask = QpAttributeMask::STATE | QpAttributeMask::SQ_PSN;
    if rc {
        mask |= QpAttributeMask::TIMEOUT
            | QpAttributeMask::RETRY_CNT
            | QpAttributeMask::RNR_RETRY
            | QpAttributeMask::MAX_QP_RD_ATOMIC;
    }
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rts,
            sq_psn: 0x100,
            timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 8,
            ..QpAttributes::default()
        },
        mask,
    )
    .unwrap();
}

/// Two NICs on one fabric with connected QPs of `qp_type`.
struct Pair {
    fabric: EmbeddedFabric,
    a: Side,
    b: Side,
    qa: QueuePair,
    qb: QueuePair,
}

fn pair(qp_type: QpType, b_options: Options) -> Pair {
    let fabric = EmbeddedFabric::default();
    let a = Side::new(&fabric, MAC_A, Options::default());
    let b = Side::new(&fabric, MAC_B, b_options);
    let qa = a.qp(qp_type);
    let qb = b.qp(qp_type);
    connect(&qa, &b, &qb);
    connect(&qb, &a, &qa);
    Pair { fabric, a, b, qa, qb }
}

impl Pair {
    fn no_diagnostics(&self) {
        assert_no_diagnostics(&self.a.device);
        assert_no_diagnostics(&self.b.device);
    }
}

/// A successful send-side completion of `opcode` on `qp`.
fn sent(wr_id: u64, opcode: WcOpcode, qp: &QueuePair) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::Success,
        opcode,
        qp_num: qp.qp_num(),
        ..WorkCompletion::default()
    }
}

/// A successful receive completion of `byte_len` bytes on `qp`.
fn received(wr_id: u64, opcode: WcOpcode, byte_len: u32, qp: &QueuePair) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len,
        qp_num: qp.qp_num(),
        ..WorkCompletion::default()
    }
}

#[test]
fn rc_send_gathers_three_sges_into_a_receive_that_scatters_into_two() {
    let p = pair(QpType::Rc, Options::default());
    let payload = [p.a.fill(0, 1000, 1), p.a.fill(8192, 2000, 2), p.a.fill(70_000, 2000, 3)].concat();
    p.qb.post_recv(&[RecvWorkRequest {
        wr_id: 0xB0,
        sg_list: &[p.b.sge(4096, 3000), p.b.sge(100_000, 3000)],
    }])
    .unwrap();
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 0xA0,
        sg_list: &[p.a.sge(0, 1000), p.a.sge(8192, 2000), p.a.sge(70_000, 2000)],
        send_flags: SendFlags::SIGNALED,
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(p.a.wait(&p.a.send_cq, 1)[0], sent(0xA0, WcOpcode::Send, &p.qa));
    assert_eq!(
        p.b.wait(&p.b.recv_cq, 1)[0],
        received(0xB0, WcOpcode::Recv, 5000, &p.qb)
    );
    assert_eq!([p.b.bytes(4096, 3000), p.b.bytes(100_000, 2000)].concat(), payload);
    assert_eq!(p.b.bytes(102_000, 16), [0u8; 16], "nothing past the message");
    assert!(p.fabric.statistics().delivered >= 5, "five 1 KiB packets and an ACK");
    p.no_diagnostics();
}

#[test]
fn send_with_immediate_and_inline_data_deliver_both() {
    let p = pair(QpType::Rc, Options::default());
    let inline = p.a.fill(500, 100, 7);
    p.qb.post_recv(&[
        RecvWorkRequest {
            wr_id: 1,
            sg_list: &[p.b.sge(0, 256)],
        },
        RecvWorkRequest {
            wr_id: 2,
            sg_list: &[p.b.sge(1024, 256)],
        },
    ])
    .unwrap();
    p.qa.post_send(&[
        SendWorkRequest {
            wr_id: 10,
            opcode: WrOpcode::SendWithImm,
            sg_list: &[p.a.sge(500, 20)],
            send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
            imm_data: 0xCAFE_F00D,
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 11,
            sg_list: &[p.a.sge(500, 100)],
            send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
            ..Default::default()
        },
    ])
    .unwrap();
    // Inline data is copied at post time: changing the buffer now changes nothing.
    p.a.fill(500, 100, 99);
    let sends = p.a.wait(&p.a.send_cq, 2);
    assert_eq!(
        sends[0],
        WorkCompletion {
            wc_flags: WcFlags::WITH_IMM,
            ..sent(10, WcOpcode::Send, &p.qa)
        }
    );
    assert_eq!(sends[1], sent(11, WcOpcode::Send, &p.qa));
    let recvs = p.b.wait(&p.b.recv_cq, 2);
    assert_eq!(
        recvs[0],
        WorkCompletion {
            imm_data: 0xCAFE_F00D,
            wc_flags: WcFlags::WITH_IMM,
            ..received(1, WcOpcode::Recv, 20, &p.qb)
        }
    );
    assert_eq!(recvs[1], received(2, WcOpcode::Recv, 100, &p.qb));
    assert_eq!(p.b.bytes(0, 20), inline[..20]);
    assert_eq!(p.b.bytes(1024, 100), inline);
    p.no_diagnostics();
}

#[test]
fn rdma_write_lands_in_the_remote_region_without_a_receive() {
    let p = pair(QpType::Rc, Options::default());
    let data = p.a.fill(0, 65536, 3);
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 0x77,
        opcode: WrOpcode::RdmaWrite,
        sg_list: &[p.a.sge(0, 40_000), p.a.sge(40_000, 25_536)],
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields {
            remote_addr: p.b.mr.addr() + 4096 + 17,
            rkey: p.b.mr.rkey(),
        },
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(p.a.wait(&p.a.send_cq, 1)[0], sent(0x77, WcOpcode::RdmaWrite, &p.qa));
    assert_eq!(p.b.bytes(4096 + 17, 65536), data);
    assert_eq!(p.b.bytes(4096, 17), [0u8; 17]);
    p.b.nothing_on(&p.b.recv_cq, 10_000);
    p.no_diagnostics();
}

#[test]
fn rdma_write_with_immediate_consumes_a_receive_and_reports_the_immediate() {
    let p = pair(QpType::Rc, Options::default());
    let data = p.a.fill(0, 3000, 4);
    p.qb.post_recv(&[RecvWorkRequest {
        wr_id: 0xBB,
        sg_list: &[],
    }])
    .unwrap();
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 0xAA,
        opcode: WrOpcode::RdmaWriteWithImm,
        sg_list: &[p.a.sge(0, 3000)],
        send_flags: SendFlags::SIGNALED,
        imm_data: 0x0102_0304,
        rdma: RdmaFields {
            remote_addr: p.b.mr.addr() + 50_000,
            rkey: p.b.mr.rkey(),
        },
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(
        p.a.wait(&p.a.send_cq, 1)[0],
        WorkCompletion {
            wc_flags: WcFlags::WITH_IMM,
            ..sent(0xAA, WcOpcode::RdmaWrite, &p.qa)
        }
    );
    assert_eq!(
        p.b.wait(&p.b.recv_cq, 1)[0],
        WorkCompletion {
            imm_data: 0x0102_0304,
            wc_flags: WcFlags::WITH_IMM,
            ..received(0xBB, WcOpcode::RecvRdmaWithImm, 3000, &p.qb)
        }
    );
    assert_eq!(p.b.bytes(50_000, 3000), data);
    p.no_diagnostics();
}

#[test]
fn rdma_read_scatters_the_remote_bytes_into_local_sges() {
    let p = pair(QpType::Rc, Options::default());
    let data = p.b.fill(10_000, 10_000, 5);
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 0x5EAD,
        opcode: WrOpcode::RdmaRead,
        sg_list: &[p.a.sge(0, 6000), p.a.sge(20_000, 4000)],
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields {
            remote_addr: p.b.mr.addr() + 10_000,
            rkey: p.b.mr.rkey(),
        },
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(
        p.a.wait(&p.a.send_cq, 1)[0],
        WorkCompletion {
            byte_len: 10_000,
            ..sent(0x5EAD, WcOpcode::RdmaRead, &p.qa)
        }
    );
    assert_eq!([p.a.bytes(0, 6000), p.a.bytes(20_000, 4000)].concat(), data);
    p.b.nothing_on(&p.b.recv_cq, 10_000);
    p.no_diagnostics();
}

#[test]
fn atomics_return_the_old_value_and_update_the_remote_word() {
    let p = pair(QpType::Rc, Options::default());
    let word = 128 * 1024;
    p.b.mr.write(word, &41u64.to_le_bytes()).unwrap();
    let target = |compare_add, swap| AtomicFields {
        remote_addr: p.b.mr.addr() + word,
        compare_add,
        swap,
        rkey: p.b.mr.rkey(),
    };
    let results: Vec<[Sge; 1]> = (0..4).map(|i| [p.a.sge(8 * i, 8)]).collect();
    p.qa.post_send(&[
        SendWorkRequest {
            wr_id: 1,
            opcode: WrOpcode::AtomicFetchAdd,
            sg_list: &results[0],
            send_flags: SendFlags::SIGNALED,
            atomic: target(1, 0),
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 2,
            opcode: WrOpcode::AtomicCmpSwp,
            sg_list: &results[1],
            send_flags: SendFlags::SIGNALED,
            atomic: target(42, 0xFFFF_0000_FFFF_0000),
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 3,
            opcode: WrOpcode::AtomicCmpSwp,
            sg_list: &results[2],
            send_flags: SendFlags::SIGNALED,
            // Compare fails: nothing swapped, the current value comes back.
            atomic: target(42, 7),
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 4,
            opcode: WrOpcode::AtomicFetchAdd,
            sg_list: &results[3],
            send_flags: SendFlags::SIGNALED,
            atomic: target(0x1_0000, 0),
            ..Default::default()
        },
    ])
    .unwrap();
    let wcs = p.a.wait(&p.a.send_cq, 4);
    let atomic = |wr_id, opcode| WorkCompletion {
        byte_len: 8,
        ..sent(wr_id, opcode, &p.qa)
    };
    assert_eq!(
        wcs,
        [
            atomic(1, WcOpcode::FetchAdd),
            atomic(2, WcOpcode::CompSwap),
            atomic(3, WcOpcode::CompSwap),
            atomic(4, WcOpcode::FetchAdd),
        ]
    );
    let old = |i: u64| u64::from_le_bytes(p.a.bytes(8 * i, 8).try_into().unwrap());
    assert_eq!(
        [old(0), old(1), old(2), old(3)],
        [41, 42, 0xFFFF_0000_FFFF_0000, 0xFFFF_0000_FFFF_0000]
    );
    let remote = u64::from_le_bytes(p.b.bytes(word, 8).try_into().unwrap());
    assert_eq!(remote, 0xFFFF_0000_FFFF_0000 + 0x1_0000);
    p.no_diagnostics();
}

#[test]
fn send_with_invalidate_reports_the_rkey_and_the_key_stops_working() {
    let p = pair(QpType::Rc, Options::default());
    let target =
        p.b.pd
            .register_provider_memory(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    p.qb.post_recv(&[RecvWorkRequest {
        wr_id: 0xB1,
        sg_list: &[p.b.sge(0, 64)],
    }])
    .unwrap();
    p.a.fill(0, 64, 9);
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 0xA1,
        opcode: WrOpcode::SendWithInv,
        sg_list: &[p.a.sge(0, 64)],
        send_flags: SendFlags::SIGNALED,
        invalidate_rkey: target.rkey(),
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(p.a.wait(&p.a.send_cq, 1)[0], sent(0xA1, WcOpcode::Send, &p.qa));
    assert_eq!(
        p.b.wait(&p.b.recv_cq, 1)[0],
        WorkCompletion {
            invalidated_rkey: target.rkey(),
            wc_flags: WcFlags::WITH_INV,
            ..received(0xB1, WcOpcode::Recv, 64, &p.qb)
        }
    );
    // A write to the invalidated key is refused by B: a remote access error at A, which
    // moves A's QP to ERR (the driver does it after the error completion).
    p.qa.post_send(&[
        SendWorkRequest {
            wr_id: 0xA2,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &[p.a.sge(0, 64)],
            rdma: RdmaFields {
                remote_addr: target.addr(),
                rkey: target.rkey(),
            },
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 0xA3,
            sg_list: &[p.a.sge(0, 64)],
            ..Default::default()
        },
    ])
    .unwrap();
    let wcs = p.a.wait(&p.a.send_cq, 2);
    assert_eq!(
        wcs[0],
        WorkCompletion {
            status: WcStatus::RemAccessErr,
            ..sent(0xA2, WcOpcode::RdmaWrite, &p.qa)
        },
        "an unsignaled request that fails completes anyway"
    );
    assert_eq!(
        wcs[1],
        WorkCompletion {
            status: WcStatus::WrFlushErr,
            ..sent(0xA3, WcOpcode::Send, &p.qa)
        }
    );
    assert_eq!(p.qa.state(), QpState::Err);
    assert_eq!(p.qa.query().unwrap().qp_state, QpState::Err);
    // B refused the request: its QP went to ERR as well, and B's driver hears why.
    assert_eq!(p.qb.query().unwrap().qp_state, QpState::Err);
    let event = p.b.context.get_async_event().expect("an asynchronous event at B");
    assert_eq!(event.event_type, AsyncEventKind::QpAccessError);
    assert_eq!(event.element, AsyncEventElement::Qp(p.qb.qp_num()));
    let refused = p.b.device.with_device(|d| d.take_diagnostics());
    assert!(refused.iter().any(|d| d.field == "R_Key"), "{refused:#?}");
    let naked = p.a.device.with_device(|d| d.take_diagnostics());
    assert!(naked.iter().all(|d| d.field == "AETH NAK code"), "{naked:#?}");
    // A region invalidated remotely is still the application's to deregister.
    target.deregister().expect("deregister an invalidated region");
    p.no_diagnostics();
}

#[test]
fn ud_send_reaches_the_destination_of_the_address_handle_with_a_grh() {
    let fabric = EmbeddedFabric::default();
    let a = Side::new(&fabric, MAC_A, Options::default());
    let b = Side::new(&fabric, MAC_B, Options::default());
    let qa = a.qp(QpType::Ud);
    let qb = b.qp(QpType::Ud);
    for qp in [&qa, &qb] {
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Init,
                port_num: 1,
                qkey: QKEY,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::QKEY,
        )
        .unwrap();
        common::to_state(qp, QpState::Rtr).unwrap();
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Rts,
                sq_psn: 7,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
        )
        .unwrap();
    }
    let ah =
        a.pd.create_ah(&AhAttributes {
            dgid: b.gid(),
            sgid_index: 0,
            hop_limit: 64,
            ..AhAttributes::default()
        })
        .unwrap();
    assert_eq!(ah.attributes().dmac, MAC_B, "resolved from B's link-local GID");
    qb.post_recv(&[RecvWorkRequest {
        wr_id: 0x600,
        sg_list: &[b.sge(0, 40 + 512)],
    }])
    .unwrap();
    let payload = a.fill(1000, 300, 11);
    qa.post_send(&[SendWorkRequest {
        wr_id: 0x500,
        opcode: WrOpcode::SendWithImm,
        sg_list: &[a.sge(1000, 100), a.sge(1100, 200)],
        send_flags: SendFlags::SIGNALED,
        imm_data: 0xFEED,
        ud: Some(UdFields {
            ah: &ah,
            remote_qpn: qb.qp_num(),
            remote_qkey: QKEY,
        }),
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(
        a.wait(&a.send_cq, 1)[0],
        WorkCompletion {
            wc_flags: WcFlags::WITH_IMM,
            ..sent(0x500, WcOpcode::Send, &qa)
        }
    );
    assert_eq!(
        b.wait(&b.recv_cq, 1)[0],
        WorkCompletion {
            imm_data: 0xFEED,
            src_qp: qa.qp_num(),
            wc_flags: WcFlags::WITH_IMM | WcFlags::GRH,
            smac: MAC_A,
            ..received(0x600, WcOpcode::Recv, 40 + 300, &qb)
        }
    );
    assert_eq!(b.bytes(40, 300), payload);
    // The GRH is the IPv6 header (link-local GIDs): version 6, UDP, A's GID → B's GID.
    let grh = b.bytes(0, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(grh[6], 17, "next header: UDP");
    assert_eq!(grh[8..24], a.gid().raw());
    assert_eq!(grh[24..40], b.gid().raw());

    // Inline payloads: 5 bytes packed into the WQE, 100 bytes in the extended SGE ring.
    let inline = a.fill(2000, 100, 12);
    qb.post_recv(&[
        RecvWorkRequest {
            wr_id: 0x602,
            sg_list: &[b.sge(4096, 40 + 512)],
        },
        RecvWorkRequest {
            wr_id: 0x603,
            sg_list: &[b.sge(8192, 40 + 512)],
        },
    ])
    .unwrap();
    let to_b = Some(UdFields {
        ah: &ah,
        remote_qpn: qb.qp_num(),
        remote_qkey: 0x8000_0000, // the QP's own Q_Key
    });
    qa.post_send(&[
        SendWorkRequest {
            wr_id: 0x502,
            sg_list: &[a.sge(2000, 5)],
            send_flags: SendFlags::INLINE,
            ud: to_b,
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 0x503,
            sg_list: &[a.sge(2000, 60), a.sge(2060, 40)],
            send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
            ud: to_b,
            ..Default::default()
        },
    ])
    .unwrap();
    assert_eq!(a.wait(&a.send_cq, 1)[0], sent(0x503, WcOpcode::Send, &qa));
    let recvs = b.wait(&b.recv_cq, 2);
    let ud_received = |wr_id, length: u32| WorkCompletion {
        src_qp: qa.qp_num(),
        wc_flags: WcFlags::GRH,
        smac: MAC_A,
        ..received(wr_id, WcOpcode::Recv, 40 + length, &qb)
    };
    assert_eq!(recvs, [ud_received(0x602, 5), ud_received(0x603, 100)]);
    assert_eq!(b.bytes(4096 + 40, 5), inline[..5]);
    assert_eq!(b.bytes(8192 + 40, 100), inline);

    // A Q_Key that does not match is dropped at B: no completion there.
    qb.post_recv(&[RecvWorkRequest {
        wr_id: 0x601,
        sg_list: &[b.sge(0, 40 + 512)],
    }])
    .unwrap();
    qa.post_send(&[SendWorkRequest {
        wr_id: 0x501,
        sg_list: &[a.sge(1000, 8)],
        send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ud: Some(UdFields {
            ah: &ah,
            remote_qpn: qb.qp_num(),
            remote_qkey: QKEY + 1,
        }),
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(a.wait(&a.send_cq, 1)[0], sent(0x501, WcOpcode::Send, &qa));
    b.nothing_on(&b.recv_cq, 50_000);
    assert_no_diagnostics(&a.device);
}

#[test]
fn srq_receives_take_the_posted_wqes_in_order_and_free_their_slots() {
    let p = pair(QpType::Rc, Options { srq: true });
    let srq = p.b.srq.as_ref().unwrap();
    let sges: Vec<[Sge; 1]> = (0..8).map(|i| [p.b.sge(i * 1024, 1024)]).collect();
    let recvs: Vec<RecvWorkRequest<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| RecvWorkRequest {
            wr_id: 0x5000 + i as u64,
            sg_list,
        })
        .collect();
    srq.post_srq_recv(&recvs).unwrap();
    assert_eq!(srq.free_slots(), 56);
    let sends: Vec<SendWorkRequest<'_>> = (0..8)
        .map(|i| SendWorkRequest {
            wr_id: i,
            sg_list: &[],
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        })
        .collect();
    let payloads: Vec<Vec<u8>> = (0..8)
        .map(|i| p.a.fill(65536 + i * 1024, 100 + i as usize, i as u8))
        .collect();
    let send_sges: Vec<[Sge; 1]> = (0..8).map(|i| [p.a.sge(65536 + i * 1024, 100 + i as u32)]).collect();
    let sends: Vec<SendWorkRequest<'_>> = sends
        .into_iter()
        .zip(&send_sges)
        .map(|(wr, sg_list)| SendWorkRequest { sg_list, ..wr })
        .collect();
    p.qa.post_send(&sends).unwrap();
    let sent_wcs = p.a.wait(&p.a.send_cq, 8);
    for (i, wc) in sent_wcs.iter().enumerate() {
        assert_eq!(*wc, sent(i as u64, WcOpcode::Send, &p.qa));
    }
    let recv_wcs = p.b.wait(&p.b.recv_cq, 8);
    for (i, wc) in recv_wcs.iter().enumerate() {
        assert_eq!(*wc, received(0x5000 + i as u64, WcOpcode::Recv, 100 + i as u32, &p.qb));
        assert_eq!(p.b.bytes(i as u64 * 1024, 100 + i), payloads[i]);
    }
    assert_eq!(srq.free_slots(), 64, "every slot back once polled");

    // The limit: armed at 4, it fires once fewer than 4 WQEs are left, then disarms.
    srq.modify(
        &SrqAttributes {
            srq_limit: 4,
            ..srq.attributes()
        },
        rnic_verbs::SrqAttributeMask::LIMIT,
    )
    .unwrap();
    srq.post_srq_recv(&recvs[..5]).unwrap();
    p.qa.post_send(&sends[..1]).unwrap();
    p.b.wait(&p.b.recv_cq, 1);
    assert_eq!(p.b.context.get_async_event(), None, "4 left: not below the limit");
    p.qa.post_send(&sends[1..2]).unwrap();
    p.b.wait(&p.b.recv_cq, 1);
    let event = p.b.context.wait_async_event(1_000_000).expect("SRQ limit event");
    assert_eq!(event.event_type, AsyncEventKind::SrqLimitReached);
    assert_eq!(event.element, AsyncEventElement::Srq(srq.srq_number()));
    assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed");
    p.a.wait(&p.a.send_cq, 2);
    p.no_diagnostics();
}

#[test]
fn armed_cqs_raise_completion_events_next_and_solicited() {
    let p = pair(QpType::Rc, Options::default());
    let recvs: Vec<RecvWorkRequest<'static>> = (0..4)
        .map(|i| RecvWorkRequest {
            wr_id: 100 + i,
            sg_list: &[],
        })
        .collect();
    p.qb.post_recv(&recvs).unwrap();
    let send = |wr_id, flags| {
        p.qa.post_send(&[SendWorkRequest {
            wr_id,
            sg_list: &[],
            send_flags: flags,
            ..Default::default()
        }])
        .unwrap()
    };

    // Armed for the next completion: the first receive raises an event.
    p.b.recv_cq.req_notify(false);
    send(1, SendFlags::empty());
    let event = p.b.channel.wait_cq_event(10_000_000).expect("event");
    assert_eq!(event.cq_number, p.b.recv_cq.cq_number());
    assert_eq!(p.b.wait(&p.b.recv_cq, 1)[0], received(100, WcOpcode::Recv, 0, &p.qb));
    p.b.recv_cq.ack_events(1);

    // Armed for solicited completions: an unsolicited receive raises nothing...
    p.b.recv_cq.req_notify(true);
    send(2, SendFlags::empty());
    assert_eq!(p.b.wait(&p.b.recv_cq, 1)[0].wr_id, 101);
    assert_eq!(p.b.channel.wait_cq_event(1_000_000), None);
    // ...a solicited one does.
    send(3, SendFlags::SOLICITED);
    assert!(p.b.channel.wait_cq_event(10_000_000).is_some());
    assert_eq!(p.b.wait(&p.b.recv_cq, 1)[0].wr_id, 102);
    p.b.recv_cq.ack_events(1);

    // Not re-armed: nothing more.
    send(4, SendFlags::SOLICITED);
    assert_eq!(p.b.wait(&p.b.recv_cq, 1)[0].wr_id, 103);
    assert_eq!(p.b.channel.wait_cq_event(1_000_000), None);
    assert_eq!(p.b.recv_cq.events_delivered(), 2);
    p.no_diagnostics();
}

#[test]
fn one_signaled_completion_retires_the_unsignaled_requests_before_it() {
    let p = pair(QpType::Rc, Options::default());
    let sge = [p.a.sge(0, 4096)];
    let wr = |wr_id, send_flags| SendWorkRequest {
        wr_id,
        opcode: WrOpcode::RdmaWrite,
        sg_list: &sge,
        send_flags,
        rdma: RdmaFields {
            remote_addr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        ..Default::default()
    };
    for round in 0..4u64 {
        // 63 unsignaled and one signaled: the whole queue, every round.
        let wrs: Vec<_> = (0..64)
            .map(|i| {
                wr(
                    round * 100 + i,
                    if i == 63 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    },
                )
            })
            .collect();
        p.qa.post_send(&wrs).unwrap();
        assert_eq!(
            p.a.wait(&p.a.send_cq, 1)[0],
            sent(round * 100 + 63, WcOpcode::RdmaWrite, &p.qa)
        );
        p.a.nothing_on(&p.a.send_cq, 1_000);
    }
    assert_eq!(p.qa.heads().0, 256);
    p.no_diagnostics();
}

#[test]
fn a_send_waits_for_a_receive_through_rnr_naks() {
    let p = pair(QpType::Rc, Options::default());
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 9,
        sg_list: &[p.a.sge(0, 100)],
        send_flags: SendFlags::SIGNALED,
        ..Default::default()
    }])
    .unwrap();
    p.a.nothing_on(&p.a.send_cq, 200_000);
    p.qb.post_recv(&[RecvWorkRequest {
        wr_id: 19,
        sg_list: &[p.b.sge(0, 100)],
    }])
    .unwrap();
    assert_eq!(p.a.wait(&p.a.send_cq, 1)[0], sent(9, WcOpcode::Send, &p.qa));
    assert_eq!(p.b.wait(&p.b.recv_cq, 1)[0], received(19, WcOpcode::Recv, 100, &p.qb));
    let counters = p.b.device.with_device(|d| d.transport_counters());
    assert!(counters.rnr_naks_sent > 0);
    p.no_diagnostics();
}

#[test]
fn uc_writes_and_sends_complete_without_acknowledgements() {
    let p = pair(QpType::Uc, Options::default());
    let data = p.a.fill(0, 5000, 21);
    p.qb.post_recv(&[RecvWorkRequest {
        wr_id: 2,
        sg_list: &[p.b.sge(100_000, 8192)],
    }])
    .unwrap();
    p.qa.post_send(&[
        SendWorkRequest {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &[p.a.sge(0, 5000)],
            send_flags: SendFlags::SIGNALED,
            rdma: RdmaFields {
                remote_addr: p.b.mr.addr(),
                rkey: p.b.mr.rkey(),
            },
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 3,
            sg_list: &[p.a.sge(0, 5000)],
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        },
    ])
    .unwrap();
    let wcs = p.a.wait(&p.a.send_cq, 2);
    assert_eq!(
        wcs,
        [sent(1, WcOpcode::RdmaWrite, &p.qa), sent(3, WcOpcode::Send, &p.qa)]
    );
    assert_eq!(p.b.wait(&p.b.recv_cq, 1)[0], received(2, WcOpcode::Recv, 5000, &p.qb));
    assert_eq!(p.b.bytes(0, 5000), data);
    assert_eq!(p.b.bytes(100_000, 5000), data);
    p.no_diagnostics();
}

#[test]
fn the_fabric_shows_the_frames_and_the_clock_both_nics_share() {
    let p = pair(QpType::Rc, Options::default());
    p.fabric.set_capture(true);
    let start = p.fabric.now();
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 1,
        opcode: WrOpcode::RdmaWrite,
        sg_list: &[p.a.sge(0, 4096)],
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields {
            remote_addr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        ..Default::default()
    }])
    .unwrap();
    p.a.wait(&p.a.send_cq, 1);
    let frames = p.fabric.take_capture();
    let from_a = frames.iter().filter(|f| f.from == p.a.device.device_id()).count();
    let from_b = frames.iter().filter(|f| f.from == p.b.device.device_id()).count();
    assert_eq!(from_a, 4, "four 1 KiB WRITE packets");
    assert!(from_b >= 1, "at least one ACK");
    // RoCEv2: UDP destination port 4791 after the Ethernet and IPv6 headers.
    let udp = 14 + 40;
    assert_eq!(&frames[0].bytes[udp + 2..udp + 4], &4791u16.to_be_bytes());
    assert!(
        p.fabric.now() > start + Picoseconds::from_nanos(1_000),
        "a link latency at least"
    );
    assert_eq!(p.a.device.now(), p.b.device.now());
    p.no_diagnostics();
}

/// The poll reads CQEs ahead in batches: completions that are all waiting come out in
/// order, whatever the caller's array size, across batch boundaries and the end of the
/// 256-entry ring, and none is returned twice or skipped.
#[test]
fn completions_waiting_together_are_polled_in_order_across_batches_and_the_ring_end() {
    let p = pair(QpType::Rc, Options::default());
    let sge = [p.a.sge(0, 8)];
    let mut next_expected = 0u64;
    for (round, array) in [64usize, 3, 7, 13, 1, 50, 9].into_iter().cycle().take(14).enumerate() {
        let first = round as u64 * 50;
        let wrs: Vec<SendWorkRequest<'_>> = (first..first + 50)
            .map(|i| SendWorkRequest {
                wr_id: i,
                opcode: WrOpcode::RdmaWrite,
                sg_list: &sge,
                send_flags: SendFlags::SIGNALED,
                rdma: RdmaFields {
                    remote_addr: p.b.mr.addr() + 8 * (i % 64),
                    rkey: p.b.mr.rkey(),
                },
                ..Default::default()
            })
            .collect();
        p.qa.post_send(&wrs).unwrap();
        // All 50 completions are written before the first poll.
        p.a.device.delay(1_000_000);
        let mut out = vec![WorkCompletion::default(); array];
        let mut got = 0;
        while got < 50 {
            let n = p.a.send_cq.poll(&mut out).unwrap();
            assert!(n > 0, "round {round}: {got} of 50 completions");
            for wc in &out[..n] {
                assert_eq!(*wc, sent(next_expected, WcOpcode::RdmaWrite, &p.qa), "round {round}");
                next_expected += 1;
            }
            got += n;
        }
        assert_eq!(got, 50, "round {round}");
        p.a.nothing_on(&p.a.send_cq, 1_000);
    }
    assert_eq!(next_expected, 700, "the CQ's 256 entries wrapped twice");
    p.no_diagnostics();
}

#[test]
fn the_16_bit_producer_index_wraps_without_losing_a_completion() {
    let p = pair(QpType::Rc, Options::default());
    let sge = [p.a.sge(0, 8)];
    let wrs: Vec<SendWorkRequest<'_>> = (0..64)
        .map(|i| SendWorkRequest {
            wr_id: i,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sge,
            send_flags: if i == 63 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            },
            rdma: RdmaFields {
                remote_addr: p.b.mr.addr() + 8 * i,
                rkey: p.b.mr.rkey(),
            },
            ..Default::default()
        })
        .collect();
    // 1040 × 64 = 66560 WQEs: the doorbell's PI and the CQE's WQE_IDX wrap past 65535.
    for round in 0..1040u32 {
        p.a.mr.write(0, &u64::from(round).to_le_bytes()).unwrap();
        p.qa.post_send(&wrs).unwrap();
        let wc = p.a.wait(&p.a.send_cq, 1)[0];
        assert_eq!(wc, sent(63, WcOpcode::RdmaWrite, &p.qa), "round {round}");
    }
    assert_eq!(p.qa.heads().0, 66_560);
    assert_eq!(p.b.bytes(8 * 63, 8), 1039u64.to_le_bytes());
    p.no_diagnostics();
}

#[test]
fn one_thread_posts_while_another_polls() {
    let p = pair(QpType::Rc, Options::default());
    let total = 2000u64;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let sge = [p.a.sge(0, 256)];
            let mut next = 0;
            while next < total {
                let wr = SendWorkRequest {
                    wr_id: next,
                    opcode: WrOpcode::RdmaWrite,
                    sg_list: &sge,
                    send_flags: SendFlags::SIGNALED,
                    rdma: RdmaFields {
                        remote_addr: p.b.mr.addr(),
                        rkey: p.b.mr.rkey(),
                    },
                    ..Default::default()
                };
                match p.qa.post_send(&[wr]) {
                    Ok(()) => next += 1,
                    // Full: the poller frees room as completions come in.
                    Err(e) if e.error == rnic_verbs::PostErrorKind::QueueFull => p.a.device.delay(100),
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let mut out = [WorkCompletion::default(); 16];
        let mut expected = 0;
        while expected < total {
            let n = p.a.send_cq.poll(&mut out).unwrap();
            for wc in &out[..n] {
                assert_eq!(*wc, sent(expected, WcOpcode::RdmaWrite, &p.qa));
                expected += 1;
            }
            if n == 0 {
                p.a.device.delay(500);
            }
        }
    });
    p.no_diagnostics();
}

#[test]
fn retries_run_out_towards_a_peer_that_is_not_there_and_every_qp_goes_to_err() {
    let fabric = EmbeddedFabric::default();
    let a = Side::new(&fabric, MAC_A, Options::default());
    let qps: Vec<QueuePair> = (0..5).map(|_| a.qp(QpType::Rc)).collect();
    let nowhere = Gid(rnic_verbs::driver::bringup::link_local_gid(common::NOWHERE_MAC));
    for qp in &qps {
        common::to_init(qp);
        common::to_rtr(qp, 0x99, nowhere, common::NOWHERE_MAC);
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Rts,
                timeout: 1, // 8 µs
                retry_cnt: 1,
                rnr_retry: 1,
                max_rd_atomic: 1,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::SQ_PSN
                | QpAttributeMask::TIMEOUT
                | QpAttributeMask::RETRY_CNT
                | QpAttributeMask::RNR_RETRY
                | QpAttributeMask::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
    }
    for (i, qp) in qps.iter().enumerate() {
        qp.post_send(&[
            SendWorkRequest {
                wr_id: i as u64,
                sg_list: &[a.sge(0, 64)],
                ..Default::default()
            },
            SendWorkRequest {
                wr_id: 100 + i as u64,
                sg_list: &[a.sge(0, 64)],
                ..Default::default()
            },
        ])
        .unwrap();
    }
    a.device.delay(1_000_000);
    assert!(fabric.statistics().undeliverable > 0);
    // Ten completions wait: five retry errors and five flushes. One poll call moves at most
    // four QPs to ERR, so the fifth QP's error is left for the next call.
    let mut out = [WorkCompletion::default(); 16];
    let first = a.send_cq.poll(&mut out).unwrap();
    let mut all = out[..first].to_vec();
    loop {
        let n = a.send_cq.poll(&mut out).unwrap();
        if n == 0 {
            break;
        }
        all.extend_from_slice(&out[..n]);
    }
    assert!(first < 10, "the first call stopped early: {first}");
    assert_eq!(all.len(), 10);
    for (i, qp) in qps.iter().enumerate() {
        let mine: Vec<_> = all.iter().filter(|wc| wc.qp_num == qp.qp_num()).collect();
        assert_eq!(
            *mine[0],
            WorkCompletion {
                status: WcStatus::RetryExcErr,
                ..sent(i as u64, WcOpcode::Send, qp)
            }
        );
        assert_eq!(
            *mine[1],
            WorkCompletion {
                status: WcStatus::WrFlushErr,
                ..sent(100 + i as u64, WcOpcode::Send, qp)
            }
        );
        assert_eq!(qp.state(), QpState::Err, "moved to ERR by the driver after the error");
    }
    let diagnosed = a.device.with_device(|d| d.take_diagnostics());
    assert_eq!(diagnosed.len(), 5, "{diagnosed:#?}");
    assert!(diagnosed.iter().all(|d| d.field == "RETRY_CNT"), "{diagnosed:#?}");
}

#[test]
fn spinning_on_poll_alone_lets_the_fabric_run() {
    let p = pair(QpType::Rc, Options::default());
    p.qa.post_send(&[SendWorkRequest {
        wr_id: 5,
        opcode: WrOpcode::RdmaRead,
        sg_list: &[p.a.sge(0, 8192)],
        send_flags: SendFlags::SIGNALED,
        rdma: RdmaFields {
            remote_addr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        ..Default::default()
    }])
    .unwrap();
    // As perftest does: nothing but poll, no sleeping, no other call into the driver.
    let mut out = [WorkCompletion::default(); 1];
    let mut spins = 0u32;
    while p.a.send_cq.poll(&mut out).unwrap() == 0 {
        spins += 1;
        assert!(spins < 1_000_000, "the READ never completed");
    }
    assert_eq!(
        out[0],
        WorkCompletion {
            byte_len: 8192,
            ..sent(5, WcOpcode::RdmaRead, &p.qa)
        }
    );
    assert!(spins > 0);
    p.no_diagnostics();
}

#[test]
fn a_lossy_reordering_duplicating_wire_still_delivers_everything_exactly_once() {
    let faults =
        rnic_verbs::backend::FaultPlan::parse("loss=0.03,dup=0.03,reorder=0.03,corrupt=0.01,delay=0.03,seed=11")
            .unwrap();
    let fabric = EmbeddedFabric::new(rnic_verbs::backend::FabricConfig {
        faults,
        ..Default::default()
    });
    let a = Side::new(&fabric, MAC_A, Options::default());
    let b = Side::new(&fabric, MAC_B, Options::default());
    let (qa, qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    // A short ACK timeout (4.096 µs × 2^6 ≈ 262 µs) so lost packets are resent soon.
    connect_with_timeout(&qa, &b, &qb, 6);
    connect_with_timeout(&qb, &a, &qa, 6);
    let wait = |side: &Side, cq: &CompletionQueue, count: usize| {
        let mut out = vec![WorkCompletion::default(); count];
        let mut got = 0;
        for _ in 0..200_000 {
            got += cq.poll(&mut out[got..]).unwrap();
            if got == count {
                return out;
            }
            side.device.delay(10_000);
        }
        panic!("{got} of {count} completions: {:#?}", &out[..got]);
    };

    let data = a.fill(0, 128 * 1024, 42);
    let sges: Vec<[Sge; 1]> = (0..32).map(|i| [a.sge(i * 4096, 4096)]).collect();
    let writes: Vec<SendWorkRequest<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| SendWorkRequest {
            wr_id: i as u64,
            opcode: WrOpcode::RdmaWrite,
            sg_list,
            send_flags: SendFlags::SIGNALED,
            rdma: RdmaFields {
                remote_addr: b.mr.addr() + i as u64 * 4096,
                rkey: b.mr.rkey(),
            },
            ..Default::default()
        })
        .collect();
    qa.post_send(&writes).unwrap();
    for (i, wc) in wait(&a, &a.send_cq, 32).iter().enumerate() {
        assert_eq!(*wc, sent(i as u64, WcOpcode::RdmaWrite, &qa));
    }
    assert_eq!(b.bytes(0, 128 * 1024), data);

    // Fetch-and-adds must not be applied twice when a request or its response is lost
    // or duplicated: the responder answers a repeated atomic from its replay memory.
    let word = 200 * 1024;
    b.mr.write(word, &0u64.to_le_bytes()).unwrap();
    let results: Vec<[Sge; 1]> = (0..32).map(|i| [a.sge(150 * 1024 + i * 8, 8)]).collect();
    let adds: Vec<SendWorkRequest<'_>> = results
        .iter()
        .enumerate()
        .map(|(i, sg_list)| SendWorkRequest {
            wr_id: 100 + i as u64,
            opcode: WrOpcode::AtomicFetchAdd,
            sg_list,
            send_flags: SendFlags::SIGNALED,
            atomic: AtomicFields {
                remote_addr: b.mr.addr() + word,
                compare_add: 1,
                swap: 0,
                rkey: b.mr.rkey(),
            },
            ..Default::default()
        })
        .collect();
    qa.post_send(&adds).unwrap();
    for (i, wc) in wait(&a, &a.send_cq, 32).iter().enumerate() {
        assert_eq!(
            *wc,
            WorkCompletion {
                byte_len: 8,
                ..sent(100 + i as u64, WcOpcode::FetchAdd, &qa)
            }
        );
        let old = u64::from_le_bytes(a.bytes(150 * 1024 + i as u64 * 8, 8).try_into().unwrap());
        assert_eq!(old, i as u64, "fetch-and-add {i} saw every earlier one exactly once");
    }
    assert_eq!(b.bytes(word, 8), 32u64.to_le_bytes());

    // SENDs: each message lands in its own receive, once.
    let recv_sges: Vec<[Sge; 1]> = (0..16).map(|i| [b.sge(160 * 1024 + i * 2048, 2048)]).collect();
    let recvs: Vec<RecvWorkRequest<'_>> = recv_sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| RecvWorkRequest {
            wr_id: 200 + i as u64,
            sg_list,
        })
        .collect();
    qb.post_recv(&recvs).unwrap();
    let send_sges: Vec<[Sge; 1]> = (0..16).map(|i| [a.sge(i * 4096, 2048)]).collect();
    let sends: Vec<SendWorkRequest<'_>> = send_sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| SendWorkRequest {
            wr_id: 300 + i as u64,
            sg_list,
            ..Default::default()
        })
        .collect();
    qa.post_send(&sends).unwrap();
    for (i, wc) in wait(&b, &b.recv_cq, 16).iter().enumerate() {
        assert_eq!(*wc, received(200 + i as u64, WcOpcode::Recv, 2048, &qb));
        assert_eq!(
            b.bytes(160 * 1024 + i as u64 * 2048, 2048),
            data[i * 4096..i * 4096 + 2048]
        );
    }
    let stats = fabric.statistics();
    assert!(
        stats.dropped > 0 && stats.duplicated > 0 && stats.reordered > 0,
        "{stats:?}"
    );
    let counters = a.device.with_device(|d| d.transport_counters());
    assert!(counters.retries > 0, "{counters:?}");
}
