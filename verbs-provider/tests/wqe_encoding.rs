//! What `post_send` / `post_recv` / `post_srq_recv` write into the rings, byte for byte,
//! read back from the model's host memory and decoded with the firmware-if layouts
//! (hns §7): RC SEND with SGEs in the WQE and in the extended SGE ring (with its wrap),
//! inline data in the WQE and in the extended ring, RDMA READ, atomics, immediate data,
//! SEND_WITH_INV, UD SEND with an address handle, the owner bit over laps, receive and
//! SRQ WQEs, and one doorbell per post call.

mod common;

use common::{assert_no_diagnostics, create_qp_with, open, poll_n, read_memory, to_rts_nowhere, to_state, NOWHERE_MAC};
use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::wqe::{RcSqWqe, Sge as WqeSge, SqOpcode, UdSqWqe};
use rnic_verbs::backend::EmbeddedDevice;
use rnic_verbs::{
    AccessFlags, AhAttributes, AtomicFields, CompletionQueue, Context, Gid, MemoryRegion, ProtectionDomain,
    QpCapabilities, QpState, QpType, QueuePair, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, UdFields,
    WcStatus, WrOpcode,
};

/// A device, a PD, a 64 KiB MR of application memory filled with a byte pattern, a CQ.
struct Setup {
    device: EmbeddedDevice,
    context: Context,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
}

fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

fn setup() -> Setup {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let bytes: Vec<u8> = (0..64 * 1024).map(pattern).collect();
    let mr = pd
        .register_user_memory(bytes, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let cq = context.create_cq(256, None, 0).unwrap();
    Setup {
        device,
        context,
        pd,
        mr,
        cq,
    }
}

impl Setup {
    fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge::new(self.mr.addr() + offset, length, self.mr.lkey())
    }

    fn rc_qp(&self, cap: QpCapabilities) -> QueuePair {
        let qp = create_qp_with(&self.pd, &self.cq, QpType::Rc, cap);
        to_rts_nowhere(&qp);
        qp
    }

    fn sq_wqe(&self, qp: &QueuePair, index: u32) -> RcSqWqe {
        RcSqWqe::parse(&read_memory(&self.device, qp.sq_wqe_address(index).unwrap(), 64)).unwrap()
    }

    fn ext_sge(&self, qp: &QueuePair, slot: u32) -> WqeSge {
        WqeSge::parse(&read_memory(&self.device, qp.sge_address(slot).unwrap(), 16)).unwrap()
    }

    fn ext_bytes(&self, qp: &QueuePair, slot: u32, length: usize) -> Vec<u8> {
        // Slot by slot: the ring wraps.
        let mut bytes = Vec::new();
        let mut slot = slot;
        while bytes.len() < length {
            bytes.extend(read_memory(&self.device, qp.sge_address(slot).unwrap(), 16));
            slot += 1;
        }
        bytes.truncate(length);
        bytes
    }

    fn mr_bytes(&self, offset: usize, length: usize) -> Vec<u8> {
        (offset..offset + length).map(pattern).collect()
    }
}

fn caps(max_send_sge: u32, max_inline_data: u32) -> QpCapabilities {
    QpCapabilities {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge,
        max_recv_sge: 4,
        max_inline_data,
    }
}

fn wqe_sge(sge: Sge) -> WqeSge {
    WqeSge::new(sge.length, sge.lkey, sge.addr)
}

#[test]
fn an_rc_send_with_four_sges_keeps_two_in_the_wqe_and_two_in_the_extended_ring() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 0));
    assert_eq!(
        qp.buffer_info().sge_count,
        256,
        "64 WQEs × 2 extended SGEs, at least 256"
    );
    let sges = [s.sge(0, 100), s.sge(4096, 200), s.sge(8192, 300), s.sge(20_000, 400)];
    qp.post_send(&[SendWorkRequest {
        wr_id: 1,
        opcode: WrOpcode::Send,
        sg_list: &sges,
        send_flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
        ..Default::default()
    }])
    .unwrap();

    let raw = read_memory(&s.device, qp.sq_wqe_address(0).unwrap(), 64);
    let wqe = RcSqWqe::parse(&raw).unwrap();
    assert_eq!(wqe.opcode(), SqOpcode::Send as u8);
    assert!(wqe.owner(), "lap 0 has owner 1");
    assert!(wqe.signaled());
    assert!(wqe.solicited_event());
    assert!(!wqe.fence() && !wqe.inline() && !wqe.strong_order());
    assert!(!wqe.direct_flag() && wqe.direct_wqe_index() == 0);
    assert_eq!(wqe.message_length(), 1000);
    assert_eq!(wqe.sge_count(), 4);
    assert_eq!(wqe.message_start_sge_index(), 0);
    assert_eq!(wqe.sge(0), wqe_sge(sges[0]));
    assert_eq!(wqe.sge(1), wqe_sge(sges[1]));
    // The same, as raw bytes: byte 0 = opcode 0 | owner (bit 7); byte 1 = CQE | SE.
    assert_eq!(raw[0], 0x80);
    assert_eq!(raw[1], 0x01 | 0x08);
    assert_eq!(&raw[4..8], &1000u32.to_le_bytes());
    assert_eq!(raw[15], 4, "SGE_NUM");
    assert_eq!(&raw[32..36], &100u32.to_le_bytes(), "SGE 0 length");
    assert_eq!(&raw[36..40], &s.mr.lkey().to_le_bytes(), "SGE 0 lkey");
    assert_eq!(&raw[40..48], &s.mr.addr().to_le_bytes(), "SGE 0 address");
    assert_eq!(s.ext_sge(&qp, 0), wqe_sge(sges[2]));
    assert_eq!(s.ext_sge(&qp, 1), wqe_sge(sges[3]));

    // The next WQE's extended SGEs start after these.
    qp.post_send(&[SendWorkRequest {
        wr_id: 2,
        sg_list: &sges[..3],
        ..Default::default()
    }])
    .unwrap();
    let second = s.sq_wqe(&qp, 1);
    assert_eq!(second.message_start_sge_index(), 2);
    assert_eq!(second.sge_count(), 3);
    assert!(
        !second.signaled(),
        "unsignaled without SIGNALED on a selective-signaling QP"
    );
    assert_eq!(s.ext_sge(&qp, 2), wqe_sge(sges[2]));
    assert_no_diagnostics(&s.device);
}

#[test]
fn zero_length_sges_are_skipped_and_not_counted() {
    let s = setup();
    let qp = s.rc_qp(caps(5, 0));
    let sges = [
        s.sge(0, 10),
        s.sge(64, 0),
        s.sge(128, 20),
        s.sge(256, 0),
        s.sge(512, 30),
    ];
    qp.post_send(&[SendWorkRequest {
        sg_list: &sges,
        ..Default::default()
    }])
    .unwrap();
    let wqe = s.sq_wqe(&qp, 0);
    assert_eq!(wqe.sge_count(), 3);
    assert_eq!(wqe.message_length(), 60);
    assert_eq!(wqe.sge(0), wqe_sge(sges[0]));
    assert_eq!(wqe.sge(1), wqe_sge(sges[2]));
    assert_eq!(s.ext_sge(&qp, 0), wqe_sge(sges[4]));
    assert_eq!(s.ext_sge(&qp, 1), WqeSge::zeroed(), "only one extended slot used");
}

/// Drains the SQ of a QP in ERR: every post there is flushed at its doorbell, so polling
/// the flush completions frees the queue while the extended SGE ring keeps going round.
fn post_and_flush(s: &Setup, qp: &QueuePair, wr: &SendWorkRequest<'_>, times: usize) {
    for _ in 0..times {
        qp.post_send(std::slice::from_ref(wr)).unwrap();
        let wc = poll_n(&s.device, &s.cq, 1);
        assert_eq!(wc[0].status, WcStatus::WrFlushErr);
        assert_eq!(wc[0].wr_id, wr.wr_id);
    }
}

#[test]
fn extended_sges_wrap_at_the_end_of_the_ring_and_the_owner_bit_flips_every_lap() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 0));
    to_state(&qp, QpState::Err).unwrap();
    let sges = [s.sge(0, 1), s.sge(16, 2), s.sge(32, 3), s.sge(48, 4)];
    // One three-SGE WQE (1 extended slot), then 127 four-SGE WQEs (2 slots each): the
    // extended ring of 256 slots is at slot 255.
    post_and_flush(
        &s,
        &qp,
        &SendWorkRequest {
            wr_id: 3,
            sg_list: &sges[..3],
            ..Default::default()
        },
        1,
    );
    post_and_flush(
        &s,
        &qp,
        &SendWorkRequest {
            wr_id: 4,
            sg_list: &sges,
            ..Default::default()
        },
        127,
    );
    let marker = [s.sge(1000, 5), s.sge(2000, 6), s.sge(3000, 7), s.sge(4000, 8)];
    qp.post_send(&[SendWorkRequest {
        wr_id: 5,
        sg_list: &marker,
        ..Default::default()
    }])
    .unwrap();
    // WQE 128 is slot 0 on lap 2 (owner 1 again); WQE 64..127 were lap 1 (owner 0).
    let wqe = s.sq_wqe(&qp, 128);
    assert_eq!(wqe.message_start_sge_index(), 255);
    assert!(wqe.owner());
    assert!(!s.sq_wqe(&qp, 127).owner(), "lap 1 has owner 0");
    assert_eq!(wqe.sge(0), wqe_sge(marker[0]));
    assert_eq!(wqe.sge(1), wqe_sge(marker[1]));
    assert_eq!(s.ext_sge(&qp, 255), wqe_sge(marker[2]));
    assert_eq!(s.ext_sge(&qp, 0), wqe_sge(marker[3]), "wrapped to slot 0");
    let wc = poll_n(&s.device, &s.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::WrFlushErr));
    assert_no_diagnostics(&s.device);
}

#[test]
fn twenty_inline_bytes_go_inside_the_wqe() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 128));
    let sges = [s.sge(100, 12), s.sge(5000, 8)];
    qp.post_send(&[SendWorkRequest {
        wr_id: 9,
        opcode: WrOpcode::SendWithImm,
        sg_list: &sges,
        send_flags: SendFlags::INLINE | SendFlags::SIGNALED,
        imm_data: 0x1122_3344,
        ..Default::default()
    }])
    .unwrap();
    let raw = read_memory(&s.device, qp.sq_wqe_address(0).unwrap(), 64);
    let wqe = RcSqWqe::parse(&raw).unwrap();
    assert_eq!(wqe.opcode(), SqOpcode::SendWithImm as u8);
    assert!(wqe.inline());
    assert!(!wqe.inline_type(), "≤ 32 bytes: inside the WQE");
    assert_eq!(wqe.message_length(), 20);
    assert_eq!(wqe.immediate_data(), 0x1122_3344);
    assert_eq!(
        &raw[8..12],
        &[0x44, 0x33, 0x22, 0x11],
        "immediate in host order, little-endian"
    );
    let mut expected = s.mr_bytes(100, 12);
    expected.extend(s.mr_bytes(5000, 8));
    assert_eq!(&raw[32..52], &expected[..]);
    assert_eq!(&raw[52..64], &[0u8; 12]);
    // In-WQE inline data takes no extended slot.
    qp.post_send(&[SendWorkRequest {
        sg_list: &[s.sge(0, 100), s.sge(0, 1), s.sge(0, 1)],
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(s.sq_wqe(&qp, 1).message_start_sge_index(), 0);
}

#[test]
fn a_hundred_inline_bytes_go_to_the_extended_ring_and_wrap_there() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 128));
    let sge_count = qp.buffer_info().sge_count;
    assert_eq!(sge_count, 512, "64 WQEs × 8 slots (128 inline bytes)");
    let sges = [s.sge(300, 60), s.sge(9000, 40)];
    let wr = SendWorkRequest {
        wr_id: 10,
        sg_list: &sges,
        send_flags: SendFlags::INLINE,
        ..Default::default()
    };
    qp.post_send(&[wr]).unwrap();
    let wqe = s.sq_wqe(&qp, 0);
    assert!(wqe.inline() && wqe.inline_type());
    assert_eq!(wqe.message_length(), 100);
    assert_eq!(wqe.sge_count(), 7, "ceil(100 / 16) slots");
    assert_eq!(wqe.message_start_sge_index(), 0);
    let mut expected = s.mr_bytes(300, 60);
    expected.extend(s.mr_bytes(9000, 40));
    assert_eq!(s.ext_bytes(&qp, 0, 100), expected);
    assert_eq!(&wqe.0[32..], &[0u8; 32], "nothing inside the WQE");

    // Bring the ring to slot 506: 71 more of these (7 slots each, to 504), then one
    // four-SGE WQE (2 slots); the next 100 inline bytes take slots 506..511 and 0.
    to_state(&qp, QpState::Err).unwrap();
    poll_n(&s.device, &s.cq, 1);
    post_and_flush(&s, &qp, &wr, 71); // slots 7..504
    let two = [s.sge(0, 1), s.sge(0, 1), s.sge(0, 1), s.sge(0, 1)];
    post_and_flush(
        &s,
        &qp,
        &SendWorkRequest {
            sg_list: &two,
            ..Default::default()
        },
        1,
    ); // slots 504, 505
    qp.post_send(&[SendWorkRequest { wr_id: 11, ..wr }]).unwrap();
    let wqe = s.sq_wqe(&qp, 73);
    assert_eq!(wqe.message_start_sge_index(), 506);
    assert_eq!(s.ext_bytes(&qp, 506, 100), expected, "slots 506..512 then 0");
    poll_n(&s.device, &s.cq, 1);
}

#[test]
fn rdma_read_and_write_carry_the_remote_address_and_key() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 0));
    let local = [s.sge(4096, 8192)];
    qp.post_send(&[
        SendWorkRequest {
            wr_id: 20,
            opcode: WrOpcode::RdmaRead,
            sg_list: &local,
            send_flags: SendFlags::SIGNALED | SendFlags::FENCE,
            rdma: RdmaFields {
                remote_addr: 0x7F00_1234_5000,
                rkey: 0xABCD_0102,
            },
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 21,
            opcode: WrOpcode::RdmaWriteWithImm,
            sg_list: &local,
            imm_data: 0xDEAD_BEEF,
            rdma: RdmaFields {
                remote_addr: 0x10,
                rkey: 0x77,
            },
            ..Default::default()
        },
    ])
    .unwrap();
    let read = s.sq_wqe(&qp, 0);
    assert_eq!(read.opcode(), SqOpcode::RdmaRead as u8);
    assert!(read.fence());
    assert_eq!(read.rkey(), 0xABCD_0102);
    assert_eq!(read.remote_address(), 0x7F00_1234_5000);
    assert_eq!(read.message_length(), 8192);
    assert_eq!(read.sge_count(), 1);
    assert_eq!(read.sge(0), wqe_sge(local[0]));
    assert_eq!(read.sge(1), WqeSge::zeroed());
    let write = s.sq_wqe(&qp, 1);
    assert_eq!(write.opcode(), SqOpcode::RdmaWriteWithImm as u8);
    assert_eq!(write.immediate_data(), 0xDEAD_BEEF);
    assert_eq!((write.remote_address(), write.rkey()), (0x10, 0x77));
}

#[test]
fn atomics_put_the_local_buffer_in_sge_0_and_the_operands_at_bytes_48_to_64() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 0));
    let result = [s.sge(64, 8)];
    let target = AtomicFields {
        remote_addr: 0x5000_0008,
        compare_add: 0x1111_2222_3333_4444,
        swap: 0x5555_6666_7777_8888,
        rkey: 0x4242,
    };
    qp.post_send(&[
        SendWorkRequest {
            wr_id: 30,
            opcode: WrOpcode::AtomicCmpSwp,
            sg_list: &result,
            send_flags: SendFlags::SIGNALED,
            atomic: target,
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 31,
            opcode: WrOpcode::AtomicFetchAdd,
            sg_list: &result,
            // INLINE means nothing for an atomic (rdma-core ignores it there).
            send_flags: SendFlags::SIGNALED | SendFlags::INLINE,
            atomic: target,
            ..Default::default()
        },
    ])
    .unwrap();
    let raw = read_memory(&s.device, qp.sq_wqe_address(0).unwrap(), 64);
    let cas = RcSqWqe::parse(&raw).unwrap();
    assert_eq!(cas.opcode(), SqOpcode::AtomCmpAndSwap as u8);
    assert_eq!((cas.remote_address(), cas.rkey()), (0x5000_0008, 0x4242));
    assert_eq!(cas.message_length(), 8);
    assert_eq!(cas.sge_count(), 1);
    assert_eq!(cas.sge(0), wqe_sge(result[0]));
    assert_eq!(cas.atomic_swap_add(), 0x5555_6666_7777_8888, "swap first");
    assert_eq!(cas.atomic_compare(), 0x1111_2222_3333_4444, "then compare");
    assert_eq!(&raw[48..56], &0x5555_6666_7777_8888u64.to_le_bytes());
    let faa = s.sq_wqe(&qp, 1);
    assert_eq!(faa.opcode(), SqOpcode::AtomFetchAndAdd as u8);
    assert!(!faa.inline());
    assert_eq!(faa.atomic_swap_add(), 0x1111_2222_3333_4444, "the addend");
    assert_eq!(faa.atomic_compare(), 0);
}

#[test]
fn send_with_invalidate_carries_the_rkey_to_invalidate() {
    let s = setup();
    let qp = s.rc_qp(caps(4, 0));
    qp.post_send(&[SendWorkRequest {
        opcode: WrOpcode::SendWithInv,
        sg_list: &[s.sge(0, 64)],
        invalidate_rkey: 0x0012_3456,
        imm_data: 0xFFFF_FFFF,
        ..Default::default()
    }])
    .unwrap();
    let wqe = s.sq_wqe(&qp, 0);
    assert_eq!(wqe.opcode(), SqOpcode::SendWithInv as u8);
    assert_eq!(wqe.inv_key(), 0x0012_3456);
}

#[test]
fn a_ud_send_carries_the_address_handle_and_puts_every_sge_in_the_extended_ring() {
    let s = setup();
    let qp = create_qp_with(&s.pd, &s.cq, QpType::Ud, caps(2, 64));
    to_rts_nowhere(&qp);
    let dgid = Gid(rnic_verbs::driver::bringup::link_local_gid(NOWHERE_MAC));
    let ah =
        s.pd.create_ah(&AhAttributes {
            dgid,
            flow_label: 0x12345,
            sgid_index: 0,
            hop_limit: 17,
            traffic_class: 0x68,
            sl: 5,
            ..AhAttributes::default()
        })
        .unwrap();
    let sges = [s.sge(40, 100), s.sge(4000, 60)];
    qp.post_send(&[
        SendWorkRequest {
            wr_id: 40,
            opcode: WrOpcode::SendWithImm,
            sg_list: &sges,
            send_flags: SendFlags::SIGNALED,
            imm_data: 0xA1B2_C3D4,
            ud: Some(UdFields {
                ah: &ah,
                remote_qpn: 0x1234,
                remote_qkey: 0x0BAD_CAFE,
            }),
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 41,
            sg_list: &sges[..1],
            ud: Some(UdFields {
                ah: &ah,
                remote_qpn: 0x99,
                // Bit 31: take the QP's Q_Key (0x1111_1111 from `to_init`).
                remote_qkey: 0x8000_0000,
            }),
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 42,
            sg_list: &[s.sge(7, 6)],
            send_flags: SendFlags::INLINE,
            ud: Some(UdFields {
                ah: &ah,
                remote_qpn: 0x99,
                remote_qkey: 1,
            }),
            ..Default::default()
        },
    ])
    .unwrap();
    let raw = read_memory(&s.device, qp.sq_wqe_address(0).unwrap(), 64);
    let wqe = UdSqWqe::parse(&raw).unwrap();
    assert_eq!(wqe.opcode(), SqOpcode::SendWithImm as u8);
    assert!(wqe.owner() && wqe.signaled() && !wqe.inline());
    assert_eq!(wqe.message_length(), 160);
    assert_eq!(wqe.immediate_data(), 0xA1B2_C3D4);
    assert_eq!(wqe.protection_domain(), s.pd.pd_number());
    assert_eq!(wqe.sge_count(), 2);
    assert_eq!(wqe.message_start_sge_index(), 0);
    assert_eq!(wqe.qkey(), 0x0BAD_CAFE);
    assert_eq!(wqe.destination_qpn(), 0x1234);
    assert_eq!(wqe.hop_limit(), 17);
    assert_eq!(wqe.traffic_class(), 0x68);
    assert_eq!(wqe.flow_label(), 0x12345);
    assert_eq!(wqe.service_level(), 5);
    assert_eq!(wqe.dmac(), NOWHERE_MAC, "resolved from the link-local GID");
    assert_eq!(&raw[40..46], &NOWHERE_MAC);
    assert_eq!(wqe.dgid(), dgid.raw());
    assert_eq!(&raw[48..64], &dgid.raw());
    assert_eq!(wqe.sgid_index(), 0);
    assert!(!wqe.loopback());
    assert_eq!(
        wqe.udp_source_port(),
        rnic_verbs::verbs::qp::udp_source_port(0x12345, qp.qp_num(), 0x1234)
    );
    assert_eq!(s.ext_sge(&qp, 0), wqe_sge(sges[0]));
    assert_eq!(s.ext_sge(&qp, 1), wqe_sge(sges[1]));

    let second = UdSqWqe::parse(&read_memory(&s.device, qp.sq_wqe_address(1).unwrap(), 64)).unwrap();
    assert_eq!(second.qkey(), 0x1111_1111);
    assert_eq!(second.message_start_sge_index(), 2);
    assert_eq!(s.ext_sge(&qp, 2), wqe_sge(sges[0]));

    // Six inline bytes are packed into the WQE's spare fields.
    let third = UdSqWqe::parse(&read_memory(&s.device, qp.sq_wqe_address(2).unwrap(), 64)).unwrap();
    assert!(third.inline() && !third.inline_type());
    let mut packed = [0u8; 8];
    packed[..6].copy_from_slice(&s.mr_bytes(7, 6));
    assert_eq!(third.packed_inline_data(), u64::from_le_bytes(packed));
    assert_eq!(third.message_length() & 0xFFFF, 6);
    assert_no_diagnostics(&s.device);
}

#[test]
fn one_doorbell_per_post_call_carries_the_new_producer_index() {
    let s = setup();
    let qp = s.rc_qp(caps(1, 0));
    let sge = [s.sge(0, 4)];
    let wrs: Vec<SendWorkRequest<'_>> = (0..5)
        .map(|i| SendWorkRequest {
            wr_id: i,
            sg_list: &sge,
            ..Default::default()
        })
        .collect();
    let before = s.device.with_device(|d| d.counters());
    qp.post_send(&wrs).unwrap();
    let after = s.device.with_device(|d| d.counters());
    assert_eq!(after.doorbells, before.doorbells + 1);
    assert_eq!(qp.heads().0, 5);
    assert_eq!(qp.query_context().unwrap().sq_producer_index(), 5);
    assert_no_diagnostics(&s.device);
}

#[test]
fn receive_wqes_are_sge_arrays_with_the_unused_slots_zeroed() {
    let s = setup();
    let qp = create_qp_with(&s.pd, &s.cq, QpType::Rc, caps(4, 0));
    common::to_init(&qp);
    assert_eq!(qp.buffer_info().rq_stride, 64, "4 SGE slots");
    let full = [s.sge(0, 1), s.sge(16, 2), s.sge(32, 3), s.sge(48, 4)];
    let wrs: Vec<RecvWorkRequest<'_>> = (0..64)
        .map(|i| RecvWorkRequest {
            wr_id: 100 + i,
            sg_list: &full,
        })
        .collect();
    qp.post_recv(&wrs).unwrap();
    assert_eq!(qp.query_context().unwrap().rq_producer_index(), 64);
    // Flush them all, then post a two-SGE WQE into slot 0, which held four.
    to_state(&qp, QpState::Err).unwrap();
    let flushed = poll_n(&s.device, &s.cq, 64);
    for (i, wc) in flushed.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (100 + i as u64, WcStatus::WrFlushErr));
    }
    let two = [s.sge(1000, 10), s.sge(2000, 0), s.sge(3000, 30)];
    qp.post_recv(&[RecvWorkRequest {
        wr_id: 7,
        sg_list: &two,
    }])
    .unwrap();
    let raw = read_memory(&s.device, qp.rq_wqe_address(64).unwrap(), 64);
    assert_eq!(WqeSge::parse(&raw[..16]).unwrap(), wqe_sge(two[0]));
    assert_eq!(
        WqeSge::parse(&raw[16..32]).unwrap(),
        wqe_sge(two[2]),
        "zero-length skipped"
    );
    assert_eq!(&raw[32..], &[0u8; 32]);
    assert_eq!(poll_n(&s.device, &s.cq, 1)[0].wr_id, 7, "flushed at its doorbell");
}

#[test]
fn an_srq_wqe_goes_into_a_free_slot_named_by_the_index_queue() {
    let s = setup();
    let srq =
        s.pd.create_srq(&rnic_verbs::SrqAttributes {
            max_wr: 64,
            max_sge: 2,
            srq_limit: 0,
        })
        .unwrap();
    assert_eq!(srq.free_slots(), 64);
    let sges = [s.sge(0, 128), s.sge(256, 0), s.sge(512, 64)];
    srq.post_srq_recv(&[
        RecvWorkRequest {
            wr_id: 1,
            sg_list: &sges[..1],
        },
        RecvWorkRequest {
            wr_id: 2,
            sg_list: &sges,
        },
    ])
    .unwrap_err(); // three entries, two slots per WQE
    assert_eq!(srq.free_slots(), 63, "the first one was posted");
    srq.post_srq_recv(&[RecvWorkRequest {
        wr_id: 2,
        sg_list: &[sges[0], sges[2]],
    }])
    .unwrap();
    let first = read_memory(&s.device, srq.wqe_address(0).unwrap(), 32);
    assert_eq!(WqeSge::parse(&first[..16]).unwrap(), wqe_sge(sges[0]));
    assert_eq!(&first[16..], &[0u8; 16]);
    let second = read_memory(&s.device, srq.wqe_address(1).unwrap(), 32);
    assert_eq!(WqeSge::parse(&second[16..]).unwrap(), wqe_sge(sges[2]));
    let index = read_memory(&s.device, srq.index_entry_address(0).unwrap(), 8);
    assert_eq!(index, [0, 0, 0, 0, 1, 0, 0, 0], "slots 0 and 1 at heads 0 and 1");
    assert_eq!(srq.query_context().unwrap().producer_index(), 2);
    assert_no_diagnostics(&s.device);
    let _ = &s.context;
}
