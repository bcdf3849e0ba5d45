//! RC error paths: every NAK kind, retry and RNR exhaustion, remote access errors (wrong
//! key, wrong PD, out of bounds, missing rights), local length and protection errors,
//! invalidated keys, and the flush that follows. Each checks the CQE statuses, the QP
//! states, the async events and that memory outside the granted windows is untouched.

mod transport_common;

use rnic_firmware_if::context::{Mtu, QpState, Qpc, ServiceType};
use rnic_firmware_if::cqe::{CqeStatus, RecvOpcode};
use rnic_firmware_if::eqe::Aeqe;
use rnic_firmware_if::event::{AsyncEventType, LocalAccessSubtype};
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode};
use rnic_firmware_if::wqe::{Sge, SqOpcode};
use rnic_hw_model::fabric::DeviceId;
use rnic_hw_model::{HostMemoryExt, Picoseconds};
use rnic_testbench::harness::{Access, MrMode, SendRequest, Table};
use transport_common::*;

fn qp_state(c: &mut Connection, node: DeviceId, qpn: u32) -> QpState {
    let (_, qpc) = c.pair.h(node).query::<Qpc>(MailboxOpcode::QueryQpc, qpn);
    qpc.qp_state().unwrap()
}

fn events(c: &mut Connection, node: DeviceId) -> Vec<(u8, u8, u32)> {
    c.pair
        .h(node)
        .take_async_events()
        .iter()
        .map(|e: &Aeqe| (e.event_type(), e.sub_type(), e.queue_number()))
        .collect()
}

fn statuses(cqes: &[rnic_firmware_if::cqe::Cqe]) -> Vec<(u16, CqeStatus)> {
    cqes.iter()
        .map(|e| (e.wqe_index(), CqeStatus::try_from(e.status()).unwrap()))
        .collect()
}

/// Region B entirely as it was set up (nothing written outside a granted window).
fn assert_b_untouched(c: &mut Connection) {
    let now = c.bytes_b(0, REGION);
    let initial = Connection::initial(2, 0, REGION);
    let first_difference = now.iter().zip(&initial).position(|(x, y)| x != y);
    assert_eq!(first_difference, None, "node 2's region was modified");
}

/// A WRITE that node 2 must refuse with a remote access error: checks the NAK's effect
/// on both sides and that node 2's memory is untouched.
fn expect_remote_access_error(c: &mut Connection, request: SendRequest, subtype: LocalAccessSubtype) {
    c.send_a(&request);
    // A second WQE behind it is flushed.
    let ma = c.ma;
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 10)]));
    c.run();
    assert_eq!(
        statuses(&c.cqes_a()),
        [(0, CqeStatus::RemoteAccessErr), (1, CqeStatus::WrFlushErr)]
    );
    let (a, b) = (c.pair.a, c.pair.b);
    assert_eq!(qp_state(c, a, 0x10), QpState::Err);
    assert_eq!(qp_state(c, b, 0x20), QpState::Err);
    let events = events(c, b);
    assert!(
        events.contains(&(AsyncEventType::LocalWqAccessError as u8, subtype as u8, 0x20)),
        "{events:?}"
    );
    assert_b_untouched(c);
}

#[test]
fn a_wrong_rkey_is_a_remote_access_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    // No region at MPT index 9.
    let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 100)], mb.at(0), 9u32.rotate_left(8));
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::RkeyViolation);
}

#[test]
fn a_key_of_another_variant_is_a_remote_access_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 100)], mb.at(0), mb.key | 0x5);
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::KeyStateError);
}

#[test]
fn a_region_of_another_pd_is_a_remote_access_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let ma = c.ma;
    let bus = c.mb.bus;
    let other = c.pair.b().register_mr(3, bus, 4096, 2, Access::ALL, MrMode::Physical);
    let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 100)], other.at(0), other.key);
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::PdError);
}

#[test]
fn an_access_past_the_region_is_a_remote_access_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    // 1000 bytes of which the last 100 lie past the end: nothing may be written.
    let request = SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 1000)],
        mb.at(REGION as u64 - 900),
        mb.key,
    );
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::LengthError);
}

#[test]
fn an_access_before_the_region_is_a_va_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 100)], mb.at(0) - 64, mb.key);
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::VaError);
}

#[test]
fn a_region_without_the_right_is_a_remote_access_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let ma = c.ma;
    let bus = c.mb.bus;
    let read_only = Access {
        local_write: true,
        remote_read: true,
        remote_write: false,
        remote_atomic: false,
    };
    let region = c.pair.b().register_mr(3, bus, 4096, 1, read_only, MrMode::Physical);
    let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 100)], region.at(0), region.key);
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::RwAccessError);
}

#[test]
fn a_qp_without_remote_read_refuses_reads() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.remote_read = false);
    let (ma, mb) = (c.ma, c.mb);
    let before = c.bytes_a(0, 4096);
    let request = SendRequest::rdma(SqOpcode::RdmaRead, vec![ma.sge(0, 4096)], mb.at(0), mb.key);
    expect_remote_access_error(&mut c, request, LocalAccessSubtype::RwAccessError);
    assert_eq!(c.bytes_a(0, 4096), before, "nothing was read into node 1");
}

#[test]
fn an_invalidated_rkey_stops_working() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let extra = c.pair.b().allocate(4096);
    let victim = c.pair.b().register_mr(4, extra, 4096, 1, Access::ALL, MrMode::Physical);
    c.recv_b(&[mb.sge(0x1000, 64)]);
    c.send_a(&SendRequest {
        immediate: victim.key,
        ..SendRequest::new(SqOpcode::SendWithInv, vec![ma.sge(0, 64)])
    });
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    let received = single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(received.opcode(), RecvOpcode::SendWithInv as u8);
    assert_eq!(received.invalidated_rkey(), victim.key);
    let before = c.pair.b().read_bytes(extra, 4096);
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 100)],
        victim.at(0),
        victim.key,
    ));
    c.run();
    assert_eq!(statuses(&c.cqes_a()), [(1, CqeStatus::RemoteAccessErr)]);
    assert_eq!(c.pair.b().read_bytes(extra, 4096), before);
}

#[test]
fn an_rkey_used_just_before_its_invalidation_stops_working() {
    // The WRITE puts the victim's MPT in the device's MPT cache; the invalidation must
    // not leave the cached copy usable.
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let extra = c.pair.b().allocate(4096);
    let victim = c.pair.b().register_mr(4, extra, 4096, 1, Access::ALL, MrMode::Physical);
    let write = |c: &mut Connection| {
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(0, 100)],
            victim.at(0),
            victim.key,
        ));
        c.run();
    };
    write(&mut c);
    assert_eq!(statuses(&c.cqes_a()), [(0, CqeStatus::Success)]);
    c.recv_b(&[mb.sge(0x1000, 64)]);
    c.send_a(&SendRequest {
        immediate: victim.key,
        ..SendRequest::new(SqOpcode::SendWithInv, vec![ma.sge(0, 64)])
    });
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    single(&c.cqes_b(), CqeStatus::Success);
    let before = c.pair.b().read_bytes(extra, 4096);
    write(&mut c);
    assert_eq!(statuses(&c.cqes_a()), [(2, CqeStatus::RemoteAccessErr)]);
    assert_eq!(c.pair.b().read_bytes(extra, 4096), before);
}

#[test]
fn with_bus_mastering_off_a_cached_key_fails_like_an_unused_one() {
    // A warm responder has the key's MPT in its MPT cache; the cache must not let an
    // access past a DMA gate that is shut.
    let outcome = |warm: bool| {
        let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
        let (ma, mb) = (c.ma, c.mb);
        let write = |c: &mut Connection| {
            c.send_a(&SendRequest::rdma(
                SqOpcode::RdmaWrite,
                vec![ma.sge(0, 100)],
                mb.at(0),
                mb.key,
            ));
            c.run();
        };
        if warm {
            write(&mut c);
            assert_eq!(statuses(&c.cqes_a()), [(0, CqeStatus::Success)]);
        }
        c.pair.b().device.config_write(
            rnic_firmware_if::pci::offset::COMMAND,
            &rnic_firmware_if::pci::COMMAND_MEMORY_SPACE.to_le_bytes(),
        );
        write(&mut c);
        let found: Vec<CqeStatus> = statuses(&c.cqes_a()).into_iter().map(|(_, s)| s).collect();
        (found, c.pair.b().last_diagnostic())
    };
    let (cold, warm) = (outcome(false), outcome(true));
    assert_ne!(cold.0, [CqeStatus::Success], "the shut gate is noticed");
    assert_eq!(warm, cold);
}

#[test]
fn invalidating_a_key_of_another_pd_fails_the_receive() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let extra = c.pair.b().allocate(4096);
    let foreign = c.pair.b().register_mr(4, extra, 4096, 7, Access::ALL, MrMode::Physical);
    c.recv_b(&[mb.sge(0x1000, 64)]);
    c.send_a(&SendRequest {
        immediate: foreign.key,
        ..SendRequest::new(SqOpcode::SendWithInv, vec![ma.sge(0, 64)])
    });
    c.run();
    single(&c.cqes_a(), CqeStatus::RemoteInvalReqErr);
    single(&c.cqes_b(), CqeStatus::LocalAccessErr);
    let (_, mpt) = c
        .pair
        .b()
        .query::<rnic_firmware_if::context::Mpt>(MailboxOpcode::QueryMpt, 4);
    assert_eq!(mpt.mpt_state_raw(), 1, "still valid");
}

#[test]
fn a_misaligned_atomic_is_an_invalid_request() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    c.send_a(&SendRequest {
        swap_add: 1,
        ..SendRequest::rdma(SqOpcode::AtomFetchAndAdd, vec![ma.sge(0, 8)], mb.at(4), mb.key)
    });
    c.run();
    single(&c.cqes_a(), CqeStatus::RemoteInvalReqErr);
    let (a, b) = (c.pair.a, c.pair.b);
    assert_eq!(qp_state(&mut c, a, 0x10), QpState::Err);
    assert_eq!(qp_state(&mut c, b, 0x20), QpState::Err);
    let events = events(&mut c, b);
    assert!(
        events.contains(&(AsyncEventType::InvReqLocalWqError as u8, 0, 0x20)),
        "{events:?}"
    );
    assert_b_untouched(&mut c);
    assert_eq!(
        c.bytes_a(0, 8),
        Connection::initial(1, 0, 8),
        "no result was written back"
    );
}

#[test]
fn a_message_longer_than_the_receive_is_a_local_length_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    // The receive has room for 100 bytes, the SEND carries 200 in one packet.
    c.recv_b(&[mb.sge(0x1000, 100)]);
    c.recv_b(&[mb.sge(0x2000, 100)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 200)]));
    c.run();
    single(&c.cqes_a(), CqeStatus::RemoteInvalReqErr);
    let received = c.cqes_b();
    assert_eq!(
        statuses(&received),
        [(0, CqeStatus::LocalLengthErr), (1, CqeStatus::WrFlushErr)]
    );
    assert!(received.iter().all(|e| e.receive_side()));
    assert_b_untouched(&mut c);
}

#[test]
fn a_bad_receive_key_is_a_remote_operational_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let ma = c.ma;
    // The receive names a key that does not exist on node 2.
    c.recv_b(&[Sge::new(256, 0x0000_5500, 0x1000)]);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 64)]));
    c.run();
    single(&c.cqes_a(), CqeStatus::RemoteOpErr);
    single(&c.cqes_b(), CqeStatus::LocalProtErr);
    assert_b_untouched(&mut c);
}

#[test]
fn a_bad_local_key_is_a_local_protection_error_and_flushes_the_rest() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 10)],
        mb.at(0),
        mb.key,
    ));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![Sge::new(100, ma.key ^ 0x1_0000, ma.at(0))],
        mb.at(0x100),
        mb.key,
    ));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 10)],
        mb.at(0x200),
        mb.key,
    ));
    c.run();
    let sent = statuses(&c.cqes_a());
    // The first WRITE went out but was not acknowledged before the error: flushed.
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[1], (1, CqeStatus::LocalProtErr));
    assert_eq!(sent[2], (2, CqeStatus::WrFlushErr));
    assert!(
        matches!(sent[0].1, CqeStatus::Success | CqeStatus::WrFlushErr),
        "{sent:?}"
    );
    let a = c.pair.a;
    assert_eq!(qp_state(&mut c, a, 0x10), QpState::Err);
    assert_eq!(c.bytes_b(0x100, 100), Connection::initial(2, 0x100, 100));
}

#[test]
fn an_unsupported_wqe_opcode_is_a_local_qp_operation_error() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let ma = c.ma;
    c.send_a(&SendRequest::new(SqOpcode::AtomMskCmpAndSwap, vec![ma.sge(0, 8)]));
    c.run();
    single(&c.cqes_a(), CqeStatus::LocalQpOpErr);
}

#[test]
fn rnr_naks_are_retried_until_a_receive_is_posted() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| {
        spec.rnr_retry = 7;
        spec.min_rnr_timer = 1; // 10 µs
    });
    let (ma, mb) = (c.ma, c.mb);
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 1000)]));
    c.pair.run_for(rnic_hw_model::Picoseconds::from_micros(100));
    assert!(c.cqes_a().is_empty(), "still waiting for a receive");
    c.recv_b(&[mb.sge(0, 4096)]);
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    single(&c.cqes_b(), CqeStatus::Success);
    assert_eq!(c.bytes_b(0, 1000), c.bytes_a(0, 1000));
    let (ca, cb) = (
        c.pair.a().device.transport_counters(),
        c.pair.b().device.transport_counters(),
    );
    assert!(cb.rnr_naks_sent >= 2, "{cb:?}");
    assert_eq!(ca.rnr_naks_received, cb.rnr_naks_sent);
}

#[test]
fn rnr_retries_run_out() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| {
        spec.rnr_retry = 2;
        spec.min_rnr_timer = 1;
    });
    let ma = c.ma;
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]));
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 100)]));
    c.run();
    assert_eq!(
        statuses(&c.cqes_a()),
        [(0, CqeStatus::RnrRetryExcErr), (1, CqeStatus::WrFlushErr)]
    );
    assert_eq!(
        c.pair.b().device.transport_counters().rnr_naks_sent,
        3,
        "1 try + 2 retries"
    );
    let a = c.pair.a;
    assert_eq!(qp_state(&mut c, a, 0x10), QpState::Err);
    assert!(c.cqes_b().is_empty());
}

#[test]
fn transport_retries_run_out_when_nothing_comes_back() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| {
        spec.ack_timeout = 1; // 8.192 µs
        spec.retry_cnt = 3;
    });
    let (ma, mb) = (c.ma, c.mb);
    let b = c.pair.b;
    c.pair.tap(b, Box::new(|_, _| Fate::Drop));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 3000)],
        mb.at(0),
        mb.key,
    ));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaRead,
        vec![ma.sge(0x1000, 100)],
        mb.at(0),
        mb.key,
    ));
    c.send_a(&SendRequest::new(SqOpcode::Send, vec![ma.sge(0, 10)]));
    c.run();
    assert_eq!(
        statuses(&c.cqes_a()),
        [
            (0, CqeStatus::TransportRetryExcErr),
            (1, CqeStatus::WrFlushErr),
            (2, CqeStatus::WrFlushErr)
        ]
    );
    let counters = c.pair.a().device.transport_counters();
    assert_eq!(counters.ack_timeouts, 4, "{counters:?}");
    assert_eq!(counters.retries, 3, "{counters:?}");
    let a = c.pair.a;
    assert_eq!(qp_state(&mut c, a, 0x10), QpState::Err);
    let (_, qpc) = c.pair.a().query::<Qpc>(MailboxOpcode::QueryQpc, 0x10);
    assert_eq!(qpc.sq_consumer_index(), 3);
}

#[test]
fn a_lost_packet_is_recovered_by_a_sequence_error_nak() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu256, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    let a = c.pair.a;
    // Drop the third packet of the WRITE (PSN 2), once.
    let mut dropped = false;
    c.pair.tap(
        a,
        Box::new(move |_, repr| {
            if repr.bth.psn == 2 && !dropped {
                dropped = true;
                Fate::Drop
            } else {
                Fate::Pass
            }
        }),
    );
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 2560)],
        mb.at(0),
        mb.key,
    ));
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_b(0, 2560), c.bytes_a(0, 2560));
    let (ca, cb) = (
        c.pair.a().device.transport_counters(),
        c.pair.b().device.transport_counters(),
    );
    assert_eq!(cb.naks_sent, 1, "one NAK per sequence error: {cb:?}");
    assert!(cb.out_of_sequence >= 1, "{cb:?}");
    assert_eq!(ca.naks_received, 1, "{ca:?}");
    assert_eq!(ca.retransmitted_packets, 8, "PSN 2..9 again: {ca:?}");
    assert_eq!(ca.ack_timeouts, 0, "{ca:?}");
}

#[test]
fn a_service_type_rewritten_in_host_memory_under_fetched_wqes_fails_them_with_a_local_qp_operation_error() {
    // MODIFY_QPC refuses a TST change outside RESET->INIT, but the QPC lives in host memory:
    // a driver can rewrite it and then modify RTS->RTS, which takes the new type from the
    // stored context. The WQE the requester holds was decoded as RC and cannot be sent as
    // anything else.
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (a, (ma, mb)) = (c.pair.a, (c.ma, c.mb));
    // Nothing reaches B, so no ACK comes back and the requester keeps the WQE.
    c.pair.tap(a, Box::new(|_, _| Fate::Drop));
    c.send_a(&SendRequest::rdma(
        SqOpcode::RdmaWrite,
        vec![ma.sge(0, 4096)],
        mb.at(0),
        mb.key,
    ));
    c.pair.run_for(Picoseconds::from_micros(20));
    let h = c.pair.h(a);
    let address = h.context_address(Table::Qpc, 0x10).expect("QP 0x10's context");
    let mut qpc: Qpc = h.memory.read_layout(address).unwrap();
    qpc.set_service_type(ServiceType::Uc);
    h.memory.write_layout(address, &qpc).unwrap();
    assert_eq!(h.move_qp(0x10, QpState::Rts), MailboxCompletion::Success);
    c.run();
    single(&c.cqes_a(), CqeStatus::LocalQpOpErr);
    assert_eq!(qp_state(&mut c, a, 0x10), QpState::Err);
    let diagnostics = c.diagnostics();
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("TST") && d.contains("fetched as (Rc)")),
        "{diagnostics:?}"
    );
}
