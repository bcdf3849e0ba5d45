//! The device's translation caches (MPT cache, MTT cache and the page an access check
//! remembers per region) see a page-table change made before a mailbox: after the
//! mailbox, a WRITE to a page already used lands where the new BT entry points.

mod transport_common;

use rnic_firmware_if::context::mpt::key_to_index;
use rnic_firmware_if::context::{Mpt, Mtu, ServiceType};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode};
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::memory::FRAME_SIZE;
use rnic_hw_model::HostMemoryExt;
use rnic_testbench::harness::SendRequest;
use transport_common::*;

#[test]
fn a_write_after_a_mailbox_follows_a_changed_bt_entry() {
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |_| {});
    let (ma, mb) = (c.ma, c.mb);
    // Node 2's region is translated through a one-level PBL: find its first entry.
    let (status, mpt) = c.pair.b().query::<Mpt>(MailboxOpcode::QueryMpt, key_to_index(mb.key));
    assert_eq!(status, MailboxCompletion::Success);
    let entry = mpt.pbl_base_address() << 3;
    assert_eq!(c.pair.b().memory.read_u64(entry).unwrap(), mb.bus & !(FRAME_SIZE - 1));
    let write = |c: &mut Connection, source: u64| {
        c.send_a(&SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(source, 8)],
            mb.at(0x10),
            mb.key,
        ));
        c.run();
        single(&c.cqes_a(), CqeStatus::Success);
    };
    // Twice to the same page: the second check is answered from the caches.
    write(&mut c, 0);
    write(&mut c, 0);
    assert_eq!(c.pair.b().read_bytes(mb.bus + 0x10, 8), c.bytes_a(0, 8));

    // The driver points the page elsewhere, then issues a mailbox (any: a query).
    let moved = c.pair.b().allocate(FRAME_SIZE as usize);
    c.pair.b().memory.write_u64(entry, moved).unwrap();
    let (status, _) = c.pair.b().query::<Mpt>(MailboxOpcode::QueryMpt, key_to_index(mb.key));
    assert_eq!(status, MailboxCompletion::Success);
    let before = c.pair.b().read_bytes(mb.bus + 0x10, 8);
    write(&mut c, 0x100);
    assert_eq!(c.pair.b().read_bytes(moved + 0x10, 8), c.bytes_a(0x100, 8));
    assert_eq!(
        c.pair.b().read_bytes(mb.bus + 0x10, 8),
        before,
        "the old page is untouched"
    );
}
