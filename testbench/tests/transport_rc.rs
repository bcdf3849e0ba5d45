//! RC end to end between two register-level NICs: every opcode, sizes and MTUs, SGEs
//! and inline data, signaled and unsignaled WQEs, fence and SR_MAX ordering, PSN
//! wrap-around, loopback and completion interrupts.

mod transport_common;

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::cqe::{CqeStatus, RecvOpcode};
use rnic_firmware_if::wqe::{Sge, SqOpcode};
use rnic_hw_model::wire;
use rnic_hw_model::HostMemory;
use rnic_testbench::harness::{Access, MrMode, QpSpec, SendRequest};
use transport_common::*;

const MTUS: [Mtu; 5] = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096];

/// `count` SGEs over `length` bytes of `region` from `offset`, split unevenly and with
/// 64-byte gaps between the pieces (so a wrong piece boundary shows).
fn split(region: &rnic_testbench::harness::MemoryRegion, offset: u64, length: u32, count: u32) -> Vec<Sge> {
    if count == 1 || length < count {
        return vec![region.sge(offset, length)];
    }
    let mut sges = Vec::new();
    let mut at = offset;
    let mut left = length;
    for i in 0..count {
        let piece = if i + 1 == count {
            left
        } else {
            (left / (count - i)).max(1) - (i % 2)
        };
        sges.push(region.sge(at, piece));
        at += u64::from(piece) + 64;
        left -= piece;
    }
    sges
}

/// The bytes the SGEs cover, gathered from a node's memory.
fn gather(c: &mut Connection, node_a: bool, region_bus: u64, region_iova: u64, sges: &[Sge]) -> Vec<u8> {
    let mut out = Vec::new();
    for sge in sges {
        let bus = region_bus + (sge.address() - region_iova);
        let h = if node_a { c.pair.a() } else { c.pair.b() };
        out.extend(h.read_bytes(bus, sge.length() as usize));
    }
    out
}

/// Rewrites `length` bytes of a node's region at `offset` with pattern `seed`.
fn refill(c: &mut Connection, node_a: bool, offset: u64, length: usize, seed: u8) {
    let bus = if node_a { c.ma.bus } else { c.mb.bus };
    let bytes: Vec<u8> = (0..length).map(pattern(seed)).collect();
    let h = if node_a { c.pair.a() } else { c.pair.b() };
    h.memory.write(bus + offset, &bytes).unwrap();
}

#[test]
fn a_send_arrives_and_both_sides_complete() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    c.recv_b(&[mb.sge(0, 4096)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(100, 3000)]));
    c.run();
    let sent = single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(sent.opcode(), SqOpcode::Send as u8);
    assert_eq!(sent.wqe_index(), 0);
    let received = single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(received.opcode(), RecvOpcode::Send as u8);
    assert!(received.receive_side());
    assert_eq!(received.byte_count(), 3000);
    assert_eq!(received.local_qp_number(), 0x20);
    assert_eq!(c.bytes_a(100, 3000), c.bytes_b(0, 3000));
    assert_eq!(
        c.bytes_b(3000, 1096),
        Connection::initial(2, 3000, 1096),
        "past the message untouched"
    );
    assert!(c.diagnostics().is_empty(), "{:?}", c.diagnostics());
}

#[test]
fn every_opcode_works_end_to_end() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    // A second region on node 2 for SEND with invalidate.
    let extra_bus = c.pair.b().allocate(8192);
    let victim = c
        .pair
        .b()
        .register_mr(2, extra_bus, 8192, 1, Access::ALL, MrMode::Physical);

    // SEND, SEND with immediate, SEND with invalidate: three receives.
    for i in 0..3 {
        c.recv_b(&[mb.sge(i * 0x1000, 0x1000)]);
    }
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]));
    c.send_a(&SendRequest {
        immediate: 0x1234_5678,
        solicited: true,
        ..SendRequest::new(SqOpcode::SendWithImm, vec![ma.sge(0x1000, 200)])
    });
    c.send_a(&SendRequest {
        immediate: victim.key,
        ..SendRequest::new(SqOpcode::SendWithInv, vec![ma.sge(0x2000, 300)])
    });
    // WRITE, WRITE with immediate (consumes a receive), READ, CAS, FAA.
    c.recv_b(&[mb.sge(0x3000, 16)]);
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0x4000, 5000)],
        mb.at(0x10000),
        mb.key,
    ));
    c.send_a(&SendRequest {
        immediate: 0xCAFE_F00D,
        ..SendRequest::rdma(
            SqOpcode::RdmaWriteWithImm,
            vec![ma.sge(0x6000, 1500)],
            mb.at(0x20000),
            mb.key,
        )
    });
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0x30000, 7000)],
        mb.at(0x40000),
        mb.key,
    ));
    // The atomic target: a known value at an 8-byte aligned address.
    let target = mb.bus + 0x50000;
    c.pair.b().memory.write(target, &100u64.to_le_bytes()).unwrap();
    c.send_a(&SendRequest {
        compare: 100,
        swap_add: 500,
        ..SendRequest::rdma(
            SqOpcode::AtomCmpAndSwap,
            vec![ma.sge(0x60000, 8)],
            mb.at(0x50000),
            mb.key,
        )
    });
    c.send_a(&SendRequest {
        swap_add: 7,
        ..SendRequest::rdma(
            SqOpcode::AtomFetchAndAdd,
            vec![ma.sge(0x60008, 8)],
            mb.at(0x50000),
            mb.key,
        )
    });
    c.run();

    let sent = c.cqes_a();
    let expected = [
        (SqOpcode::Send, 100),
        (SqOpcode::SendWithImm, 200),
        (SqOpcode::SendWithInv, 300),
        (SqOpcode::RdmaWrite, 5000),
        (SqOpcode::RdmaWriteWithImm, 1500),
        (SqOpcode::RdmaRead, 7000),
        (SqOpcode::AtomCmpAndSwap, 8),
        (SqOpcode::AtomFetchAndAdd, 8),
    ];
    assert_eq!(sent.len(), expected.len(), "{sent:?}");
    for (i, (cqe, (opcode, bytes))) in sent.iter().zip(expected).enumerate() {
        assert_eq!(cqe.status(), CqeStatus::Success as u8, "WQE {i}: {cqe:?}");
        assert_eq!(cqe.opcode(), opcode as u8, "WQE {i}");
        assert_eq!(cqe.wqe_index(), i as u16);
        assert_eq!(cqe.byte_count(), bytes, "WQE {i}");
    }
    let received = c.cqes_b();
    assert_eq!(received.len(), 4, "{received:?}");
    assert_eq!(received[0].opcode(), RecvOpcode::Send as u8);
    assert_eq!(received[0].byte_count(), 100);
    assert_eq!(received[1].opcode(), RecvOpcode::SendWithImm as u8);
    assert_eq!(received[1].immediate_data(), 0x1234_5678);
    assert_eq!(received[2].opcode(), RecvOpcode::SendWithInv as u8);
    assert_eq!(received[2].invalidated_rkey(), victim.key);
    assert_eq!(received[3].opcode(), RecvOpcode::RdmaWriteWithImm as u8);
    assert_eq!(received[3].immediate_data(), 0xCAFE_F00D);
    assert_eq!(received[3].byte_count(), 1500);
    for (i, cqe) in received.iter().enumerate() {
        assert_eq!(cqe.status(), CqeStatus::Success as u8);
        assert_eq!(cqe.wqe_index(), i as u16);
    }
    // Data.
    assert_eq!(c.bytes_b(0, 100), c.bytes_a(0, 100));
    assert_eq!(c.bytes_b(0x1000, 200), c.bytes_a(0x1000, 200));
    assert_eq!(c.bytes_b(0x2000, 300), c.bytes_a(0x2000, 300));
    assert_eq!(c.bytes_b(0x10000, 5000), c.bytes_a(0x4000, 5000));
    assert_eq!(c.bytes_b(0x20000, 1500), c.bytes_a(0x6000, 1500));
    assert_eq!(c.bytes_a(0x30000, 7000), c.bytes_b(0x40000, 7000));
    assert_eq!(
        c.bytes_a(0x60000, 8),
        100u64.to_le_bytes(),
        "CAS returns the original value"
    );
    assert_eq!(
        c.bytes_a(0x60008, 8),
        500u64.to_le_bytes(),
        "FAA returns the swapped value"
    );
    assert_eq!(c.bytes_b(0x50000, 8), 507u64.to_le_bytes(), "CAS swapped, FAA added");
    // The invalidated region is FREE now.
    let (_, mpt) = c
        .pair
        .b()
        .query::<rnic_firmware_if::context::Mpt>(rnic_firmware_if::mailbox::MailboxOpcode::QueryMpt, 2);
    assert_eq!(mpt.mpt_state_raw(), rnic_firmware_if::context::MptState::Free as u8);
    assert!(c.diagnostics().is_empty(), "{:?}", c.diagnostics());
}

/// SEND, WRITE and READ of sizes 0, 1, MTU−1, MTU, MTU+1 and 1 MiB, with 1 and 4 SGEs on
/// both sides, at every MTU; the data and the untouched bytes around it are checked.
#[test]
fn every_size_at_every_mtu_with_one_and_four_sges() {
    for mtu in MTUS {
        let mut c = connect(ServiceType::Rc, mtu, false, |_| {});
        let (ma, mb) = (c.ma, c.mb);
        let m = mtu.bytes();
        let mut seed = 10u8;
        for size in [0, 1, m - 1, m, m + 1, 1 << 20] {
            for sges in [1, 4] {
                for opcode in [SqOpcode::Send, SqOpcode::RdmaWrite, SqOpcode::RdmaRead] {
                    seed = seed.wrapping_add(1);
                    let what = format!("{opcode:?} of {size} bytes, {sges} SGEs, MTU {m}");
                    // Fresh data on the data's source side, known bytes on the target side.
                    refill(&mut c, true, 0, (1 << 20) + 1024, seed);
                    refill(&mut c, false, 0, 3 << 20, seed.wrapping_add(100));
                    let (local, remote_offset) = (split(&ma, 0, size, sges), 0x10_0000u64);
                    match opcode {
                        SqOpcode::Send => {
                            let receive = split(&mb, remote_offset, size.max(1) + 4096, sges);
                            c.recv_b(&receive);
                            c.send_a(&SendRequest::new(opcode, local.clone()));
                        }
                        _ => {
                            c.send_a(&SendRequest::rdma(opcode, local.clone(), mb.at(remote_offset), mb.key));
                        }
                    }
                    c.run();
                    let sent = single(&c.cqes_a(), CqeStatus::Success);
                    assert_eq!(sent.byte_count(), size, "{what}");
                    let local_bytes = gather(&mut c, true, ma.bus, ma.iova, &local);
                    match opcode {
                        SqOpcode::Send => {
                            let received = single(&c.cqes_b(), CqeStatus::Success);
                            assert_eq!(received.byte_count(), size, "{what}");
                            let receive = split(&mb, remote_offset, size.max(1) + 4096, sges);
                            let landed = gather(&mut c, false, mb.bus, mb.iova, &receive);
                            assert_eq!(&landed[..size as usize], &local_bytes[..], "{what}");
                            let expected_tail: Vec<u8> = {
                                let full: Vec<u8> = (0..3 << 20).map(pattern(seed.wrapping_add(100))).collect();
                                receive
                                    .iter()
                                    .flat_map(|s| {
                                        let o = (s.address() - mb.iova) as usize;
                                        full[o..o + s.length() as usize].to_vec()
                                    })
                                    .collect()
                            };
                            assert_eq!(
                                &landed[size as usize..],
                                &expected_tail[size as usize..],
                                "{what}: tail"
                            );
                        }
                        SqOpcode::RdmaWrite => {
                            assert!(c.cqes_b().is_empty(), "{what}: a WRITE consumes no receive");
                            let remote = c.bytes_b(remote_offset, size as usize + 64);
                            assert_eq!(&remote[..size as usize], &local_bytes[..], "{what}");
                            let after: Vec<u8> = (remote_offset as usize + size as usize
                                ..remote_offset as usize + size as usize + 64)
                                .map(pattern(seed.wrapping_add(100)))
                                .collect();
                            assert_eq!(&remote[size as usize..], &after[..], "{what}: after the window");
                        }
                        _ => {
                            let remote = c.bytes_b(remote_offset, size as usize);
                            assert_eq!(local_bytes, remote, "{what}");
                        }
                    }
                }
            }
        }
        assert!(c.diagnostics().is_empty(), "MTU {m}: {:?}", c.diagnostics());
    }
}

/// Inline SEND and WRITE: in the WQE (≤ 32 bytes) and in the extended SGE ring.
#[test]
fn inline_data_in_the_wqe_and_in_the_sge_ring() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
    let mb = c.mb;
    for (i, size) in [1usize, 31, 32, 33, 100, 257, 1000].into_iter().enumerate() {
        let data: Vec<u8> = (0..size).map(|b| (b * 7 + i) as u8).collect();
        c.recv_b(&[mb.sge(0x1000 * i as u64, 0x1000)]);
        c.send_a(&SendRequest {
            inline: Some(data.clone()),
            ..SendRequest::new(SqOpcode::Send, vec![])
        });
        c.send_a(&SendRequest {
            inline: Some(data.clone()),
            ..SendRequest::rdma(
                SqOpcode::RdmaWrite,
                vec![],
                mb.at(0x10_0000 + 0x1000 * i as u64),
                mb.key,
            )
        });
        c.run();
        let sent = c.cqes_a();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert!(sent.iter().all(|e| e.status() == 0), "{sent:?}");
        single(&c.cqes_b(), CqeStatus::Success);
        assert_eq!(c.bytes_b(0x1000 * i as u64, size), data, "SEND inline {size}");
        assert_eq!(
            c.bytes_b(0x10_0000 + 0x1000 * i as u64, size),
            data,
            "WRITE inline {size}"
        );
    }
}

/// SIG_TYPE = 1: only WQEs with the CQE flag complete; the CQE's index lets software
/// retire the unsignaled WQEs before it.
#[test]
fn unsignaled_wqes_complete_silently() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.signal_all = false);
    let (ma, mb) = (c.ma, c.mb);
    for i in 0..5u64 {
        c.send_a(&SendRequest {
            signaled: i == 2 || i == 4,
            ..SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(i * 100, 100)], mb.at(i * 100), mb.key)
        });
    }
    c.run();
    let sent = c.cqes_a();
    let indices: Vec<u16> = sent.iter().map(|e| e.wqe_index()).collect();
    assert_eq!(indices, [2, 4]);
    assert_eq!(c.bytes_b(0, 500), c.bytes_a(0, 500));
    let (_, qpc) = c
        .pair
        .a()
        .query::<rnic_firmware_if::context::Qpc>(rnic_firmware_if::mailbox::MailboxOpcode::QueryQpc, 0x10);
    assert_eq!(qpc.sq_consumer_index(), 5, "QUERY_QPC shows the progress");
    assert_eq!(qpc.sq_current_psn(), 5);
}

/// The requester's packets in the order they left node 1.
fn requests(c: &mut Connection) -> Vec<(u8, u32)> {
    c.pair
        .fabric
        .take_capture()
        .iter()
        .filter(|f| f.from == c.pair.a)
        .filter_map(|f| wire::parse_frame(&f.bytes).ok())
        .map(|p| (p.repr.bth.opcode.0, p.repr.bth.psn))
        .collect()
}

/// A fenced WQE waits for the READ before it; SR_MAX = 0 allows one READ at a time.
#[test]
fn fence_and_sr_max_hold_requests_back() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.sr_max = 0);
    let (ma, mb) = (c.ma, c.mb);
    c.pair.fabric.set_capture(true);
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0, 3000)],
        mb.at(0),
        mb.key,
    ));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0x1000, 100)],
        mb.at(0x1000),
        mb.key,
    ));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0x2000, 10)],
        mb.at(0x2000),
        mb.key,
    ));
    c.send_a(&SendRequest {
        fence: true,
        ..SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0x3000, 10)], mb.at(0x3000), mb.key)
    });
    c.run();
    assert_eq!(c.cqes_a().len(), 4);
    let capture = c.pair.fabric.take_capture();
    let order: Vec<(bool, u8, u32)> = capture
        .iter()
        .filter_map(|f| wire::parse_frame(&f.bytes).ok().map(|p| (f.from == c.pair.a, p)))
        .map(|(from_a, p)| (from_a, p.repr.bth.opcode.0, p.repr.bth.psn))
        .collect();
    // READ 1 (PSN 0..2), its three responses, READ 2 (PSN 3), its response, WRITE (PSN 4);
    // the fenced WRITE (PSN 5) only after READ 2's response.
    let position = |from_a: bool, opcode: u8, psn: u32| {
        order
            .iter()
            .position(|e| *e == (from_a, opcode, psn))
            .unwrap_or_else(|| panic!("{opcode:#x} {psn} in {order:?}"))
    };
    let read2 = position(true, 0x0C, 3);
    assert!(
        read2 > position(false, 0x0F, 2),
        "the second READ waits for the first: {order:?}"
    );
    let write = position(true, 0x0A, 4);
    assert!(write > read2, "{order:?}");
    let fenced = position(true, 0x0A, 5);
    assert!(
        fenced > position(false, 0x10, 3),
        "the fenced WRITE waits for READ 2: {order:?}"
    );
    let _ = requests;
}

/// PSNs wrap at 2^24 on both sides.
#[test]
fn psns_wrap_around() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |spec| {
        spec.sq_psn = 0xFF_FFFC;
        spec.rq_psn = 0xFF_FFFC;
    });
    let (ma, mb) = (c.ma, c.mb);
    c.recv_b(&[mb.sge(0, 0x2000)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 2000)]));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0x4000, 1000)],
        mb.at(0x8000),
        mb.key,
    ));
    c.run();
    let sent = c.cqes_a();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|e| e.status() == 0), "{sent:?}");
    single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(c.bytes_b(0, 2000), c.bytes_a(0, 2000));
    assert_eq!(c.bytes_a(0x4000, 1000), c.bytes_b(0x8000, 1000));
    let (_, qpc) = c
        .pair
        .a()
        .query::<rnic_firmware_if::context::Qpc>(rnic_firmware_if::mailbox::MailboxOpcode::QueryQpc, 0x10);
    assert_eq!(qpc.sq_current_psn(), (0xFF_FFFC + 8 + 4) & 0xFF_FFFF);
}

/// Two QPs of one NIC talk through the loopback path (destination MAC = own MAC).
#[test]
fn loopback_between_two_qps_of_one_nic() {
    let mut pair = Pair::new(false);
    let a = pair.a;
    let h = pair.h(a);
    let mut cq = h.create_polled_cq(1, 64);
    let bus = h.allocate_filled(0x10000, pattern(5));
    let mr = h.register_mr(1, bus, 0x10000, 1, Access::ALL, MrMode::Physical);
    let mut spec = QpSpec::rc(0x30, 1, 0x31);
    spec.dmac = mac(1);
    spec.dgid = gid(1, false);
    let mut q1 = h.create_qp(&spec);
    spec.qpn = 0x31;
    spec.dest_qpn = 0x30;
    let mut q2 = h.create_qp(&spec);
    h.post_recv(&mut q2, &[mr.sge(0x8000, 0x1000)]);
    h.post_send(&mut q1, &SendRequest::new(SqOpcode::Send, vec![mr.sge(0, 3000)]));
    h.ring_send(&q1);
    pair.run();
    let h = pair.h(a);
    let cqes = h.poll_cq(&mut cq);
    assert_eq!(cqes.len(), 2, "{cqes:?}");
    assert!(cqes.iter().all(|e| e.status() == 0));
    assert_eq!(h.read_bytes(bus + 0x8000, 3000), h.read_bytes(bus, 3000));
    assert!(h.device.transport_counters().loopback_frames >= 2);
    assert_eq!(pair.fabric.statistics().sent, 0, "nothing went on the wire");
}

/// An armed CQ raises its CEQ's interrupt when the completion arrives.
#[test]
fn completions_interrupt_through_the_ceq() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair
        .h(b)
        .doorbell(rnic_firmware_if::doorbell::CqDoorbell::arm(1, 0, 1, false).as_u64());
    let before = c.pair.b().interrupts.count(2);
    c.recv_b(&[mb.sge(0, 64)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 64)]));
    c.run();
    single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(c.pair.b().interrupts.count(2), before + 1, "CEQ 0 raised its vector");
}

/// A QP with a VLAN ID sends tagged frames (PCP = SL) and the peer accepts them.
#[test]
fn vlan_tagged_traffic() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, true, |spec| {
        spec.vlan_id = 100;
        spec.traffic_class = 0x20;
    });
    let (ma, mb) = (c.ma, c.mb);
    c.pair.fabric.set_capture(true);
    c.recv_b(&[mb.sge(0, 4096)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 2000)]));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    single(&c.cqes_b(), CqeStatus::Success);
    for frame in c.pair.fabric.take_capture() {
        let parsed = wire::parse_frame(&frame.bytes).unwrap();
        assert_eq!(parsed.repr.ethernet.vlan.map(|v| v.vid), Some(100));
        match parsed.repr.ip {
            wire::IpRepr::V6(v6) => assert_eq!(v6.traffic_class, 0x20),
            other => panic!("IPv6 expected: {other:?}"),
        }
    }
}

/// With RQ_RECORD_EN the responder reads the RQ producer index from the record doorbell.
#[test]
fn receives_published_through_the_rq_record_doorbell() {
    // The top of the harness's DMA window: never handed out by the bump allocator here.
    let record = rnic_testbench::harness::DMA_BASE + rnic_testbench::harness::DMA_SIZE as u64 - 64;
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, move |spec| {
        if spec.qpn == 0x20 {
            spec.rq_record = Some(record);
        }
    });
    let (ma, mb) = (c.ma, c.mb);
    c.recv_b(&[mb.sge(0, 4096)]);
    c.recv_b(&[mb.sge(4096, 4096)]);
    let doorbells = c.pair.b().device.counters().doorbells;
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]));
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(100, 200)]));
    c.run();
    let received = c.cqes_b();
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(c.bytes_b(4096, 200), c.bytes_a(100, 200));
    assert_eq!(
        c.pair.b().device.counters().doorbells,
        doorbells + 1,
        "only the CQ set-CI doorbell of the poll: no RQ doorbell was rung"
    );
}

/// A CQ armed for solicited completions notifies only for a SEND with the SE bit.
#[test]
fn solicited_events_reach_a_solicited_only_arm() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair
        .h(b)
        .doorbell(rnic_firmware_if::doorbell::CqDoorbell::arm(1, 0, 1, true).as_u64());
    let before = c.pair.b().interrupts.count(2);
    c.recv_b(&[mb.sge(0, 64)]);
    c.recv_b(&[mb.sge(64, 64)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 8)]));
    c.run();
    assert_eq!(c.pair.b().interrupts.count(2), before, "not solicited: no event");
    c.send_a(&SendRequest {
        solicited: true,
        ..SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 8)])
    });
    c.run();
    assert_eq!(c.pair.b().interrupts.count(2), before + 1, "solicited: one event");
    assert_eq!(c.cqes_b().len(), 2);
}

/// The engines keep their per-message progress in the device's QPC cache: every mailbox
/// sees it on both sides, and a QP taken to RESET starts over from the context the
/// mailbox wrote, not from a cached copy.
#[test]
fn mailboxes_see_the_engines_progress_and_a_reset_qp_starts_over() {
    use rnic_firmware_if::context::{QpState, Qpc};
    use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode};
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    for i in 0..4u64 {
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(i * 100, 100)],
            mb.at(i * 100),
            mb.key,
        ));
    }
    c.run();
    assert_eq!(c.cqes_a().len(), 4);
    let (_, requester) = c.pair.a().query::<Qpc>(MailboxOpcode::QueryQpc, 0x10);
    assert_eq!(
        (requester.sq_consumer_index(), requester.rx_ack_expected_psn()),
        (4, 4),
        "all four WRITEs acknowledged"
    );
    let (_, responder) = c.pair.b().query::<Qpc>(MailboxOpcode::QueryQpc, 0x20);
    assert_eq!(
        (responder.rx_request_expected_psn(), responder.rx_request_msn()),
        (4, 4),
        "all four WRITEs executed"
    );

    assert_eq!(c.pair.a().move_qp(0x10, QpState::Err), MailboxCompletion::Success);
    assert_eq!(c.pair.a().move_qp(0x10, QpState::Reset), MailboxCompletion::Success);
    let (_, reset) = c.pair.a().query::<Qpc>(MailboxOpcode::QueryQpc, 0x10);
    assert_eq!(reset.qp_state(), Ok(QpState::Reset));
    assert_eq!(
        (reset.sq_producer_index(), reset.sq_consumer_index()),
        (0, 0),
        "RESET clears the indices the engines advanced"
    );
}

/// What node 1 did, by virtual time: its frames leaving, and reads of its SQ WQE 1.
struct PortAndWqeLog {
    departures: Vec<rnic_hw_model::Picoseconds>,
    wqe_reads: Vec<rnic_hw_model::Picoseconds>,
}

/// A 64 KiB WRITE from node 1 (16 frames at MTU 4096), and if `ring_at` is given a
/// second, 8-byte WRITE whose doorbell the host writes then; what node 1 did.
fn write_then_ring(ring_at: Option<rnic_hw_model::Picoseconds>) -> PortAndWqeLog {
    use rnic_hw_model::probe::{Port, Recorder};
    let mut c = connect(ServiceType::Rc, Mtu::Mtu4096, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let (frames, bus) = (Recorder::new(), Recorder::new());
    let device = &mut c.pair.h(c.pair.a).device;
    device.attach_observer(Port::Network, Some(Box::new(frames.clone())));
    device.attach_observer(Port::Bus, Some(Box::new(bus.clone())));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 65536)],
        mb.at(0),
        mb.key,
    ));
    if let Some(at) = ring_at {
        c.pair.fabric.advance_to(at);
        assert_eq!(c.pair.a().device.now(), at);
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(0, 8)],
            mb.at(65536),
            mb.key,
        ));
    }
    c.run();
    let completed = c.cqes_a().len();
    assert_eq!(completed, 1 + usize::from(ring_at.is_some()), "{:?}", c.diagnostics());
    // A recorder keeps each transaction's `Debug` form with its time.
    let times = |recorder: &Recorder, start: &str| {
        let seen = recorder.seen().into_iter();
        seen.filter(|(_, transaction)| transaction.starts_with(start))
            .map(|(at, _)| at)
            .collect()
    };
    PortAndWqeLog {
        departures: times(&frames, "FrameOut("),
        wqe_reads: times(&bus, &format!("DmaRead {{ address: {},", c.qa.sq_wqe_address(1))),
    }
}

/// A doorbell is a posted write that reaches the NIC `doorbell_ps` after the host wrote
/// it. The WQE it announces is not read before then, even when the port wakes in between
/// to let a frame of an earlier message leave (the run is deterministic, so the first run
/// shows when the port wakes and the second rings just before that).
#[test]
fn a_wqe_is_not_read_before_its_doorbell_has_arrived_though_the_port_wakes_in_between() {
    use rnic_hw_model::Picoseconds;
    let doorbell = Picoseconds(rnic_hw_model::DeviceConfig::default().timing.doorbell_ps);
    let alone = write_then_ring(None);
    assert_eq!(alone.departures.len(), 16);
    assert!(alone.wqe_reads.is_empty());
    // The last frame is built by then (it is serialised before it leaves), so the second
    // WQE is next; the port wakes at that departure, inside the doorbell's flight.
    let last = alone.departures[15];
    let ring_at = Picoseconds(last.0 - doorbell.0 / 3);
    assert!(ring_at.0 > alone.departures[14].0);
    let both = write_then_ring(Some(ring_at));
    assert_eq!(
        both.departures[..16],
        alone.departures[..],
        "the same run until the doorbell"
    );
    assert_eq!(both.wqe_reads.len(), 1, "the second WQE is read once");
    assert_eq!(
        both.wqe_reads[0],
        Picoseconds(ring_at.0 + doorbell.0),
        "when the doorbell arrives"
    );
}
