//! Direct WQE (hns §6.4, rnic's form in docs/hw-interface.md): a WQE written to the
//! doorbell page's window and handed over by an SQ doorbell with `FLAG` set is executed
//! as written there — the device does not read the ring for it — and one that names
//! another index than the doorbell's is ignored, with a diagnostic, for the ring's.

mod transport_common;

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::doorbell::{Doorbell, DB_OFFSET, DWQE_OFFSET};
use rnic_firmware_if::regs;
use rnic_firmware_if::wqe::{RcSqWqe, SqOpcode};
use rnic_hw_model::HostMemory;
use rnic_testbench::harness::SendRequest;
use transport_common::*;

/// Writes `wqe` to node 1's direct-WQE window and rings the flagged SQ doorbell.
fn push(c: &mut Connection, wqe: RcSqWqe, producer_index: u16) {
    let qpn = c.qa.qpn;
    let h = c.pair.a();
    for (n, word) in wqe.0.chunks_exact(8).enumerate() {
        h.device.bar_write(regs::DOORBELL_BAR, DWQE_OFFSET + 8 * n as u64, word);
    }
    let mut doorbell = Doorbell::sq(qpn, producer_index, 0);
    doorbell.set_flag(true);
    h.device
        .bar_write(regs::DOORBELL_BAR, DB_OFFSET, &doorbell.as_u64().to_le_bytes());
}

/// Posts a 3000-byte WRITE from node 1's offset 0 to node 2's `target` into the ring
/// (no doorbell); returns the ring's WQE bytes.
fn post_write(c: &mut Connection, target: u64) -> RcSqWqe {
    let (ma, mb) = (c.ma, c.mb);
    let request = SendRequest::rdma(SqOpcode::RdmaWrite, vec![ma.sge(0, 3000)], mb.at(target), mb.key);
    let h = &mut c.pair.fabric.device_mut(c.pair.a).h;
    let index = h.post_send(&mut c.qa, &request);
    let address = c.qa.sq_wqe_address(index);
    let bytes = c.pair.a().read_bytes(address, 64);
    RcSqWqe(bytes.try_into().unwrap())
}

/// Posts a 3000-byte WRITE to node 2's `target` as WQE 0, spoils its copy in the ring
/// (fetched, it would fail with a local QP operation error) and hands it over as a direct
/// WQE.
fn push_with_the_rings_copy_spoiled(c: &mut Connection, target: u64) {
    let mut wqe = post_write(c, target);
    let address = c.qa.sq_wqe_address(0);
    let memory = c.pair.a().memory.clone();
    memory.write(address, &[0xFF; 64]).unwrap();
    wqe.set_direct_flag(true);
    wqe.set_direct_wqe_index(1);
    push(c, wqe, 1);
}

#[test]
fn a_direct_wqe_runs_as_written_to_the_window_and_the_ring_is_not_read() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    push_with_the_rings_copy_spoiled(&mut c, 0x4000);
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_b(0x4000, 3000), Connection::initial(1, 0, 3000));
    assert!(c.diagnostics().is_empty(), "{:?}", c.diagnostics());
}

#[test]
fn a_direct_wqe_naming_another_index_is_ignored_for_the_rings() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let mut wqe = post_write(&mut c, 0x4000);
    // The window's copy would write elsewhere, and says it is WQE 5 of the ring.
    wqe.set_remote_address(c.mb.at(0x9000));
    wqe.set_direct_flag(true);
    wqe.set_direct_wqe_index(5);
    push(&mut c, wqe, 1);
    c.run();
    single(&c.cqes_a(), CqeStatus::Success);
    assert_eq!(c.bytes_b(0x4000, 3000), Connection::initial(1, 0, 3000));
    assert_eq!(c.bytes_b(0x9000, 3000), Connection::initial(2, 0x9000, 3000));
    let diagnostics = c.diagnostics();
    assert!(diagnostics.iter().any(|d| d.contains("WQE_IDX")), "{diagnostics:?}");
}

#[test]
fn a_plain_doorbell_written_after_a_direct_wqe_does_not_overtake_it() {
    // Doorbells are posted writes, which arrive in the order they were written: the
    // direct-WQE doorbell, longer by its 64-byte WQE, still takes effect first, so the
    // ring is not read for its WQE (spoiled there) and the producer index never goes back.
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    push_with_the_rings_copy_spoiled(&mut c, 0x4000);
    post_write(&mut c, 0x8000);
    let h = &mut c.pair.fabric.device_mut(c.pair.a).h;
    h.ring_send(&c.qa);
    c.run();
    let cqes = c.cqes_a();
    assert_eq!(cqes.len(), 2, "{cqes:?}");
    for (index, cqe) in cqes.iter().enumerate() {
        assert_eq!(cqe.wqe_index(), index as u16);
        assert_eq!(CqeStatus::try_from(cqe.status()), Ok(CqeStatus::Success));
    }
    assert_eq!(c.bytes_b(0x4000, 3000), Connection::initial(1, 0, 3000));
    assert_eq!(c.bytes_b(0x8000, 3000), Connection::initial(1, 0, 3000));
    assert!(c.diagnostics().is_empty(), "{:?}", c.diagnostics());
}
