//! Hostile initiators against our SRP target: malformed IUs, credit overruns,
//! descriptors outside registered memory, aborts of commands in flight. Each is answered
//! as SRP and SCSI say (or ignored, as Linux's target does, when it cannot be), counted,
//! logged under `rnic::diag`, and nothing reaches a block device that the protocol did
//! not complete.

mod srp_common;

use rnic_storage::scsi::cdb::{Cdb, ReadWrite};
use rnic_storage::scsi::{encode_lun, status, SenseData};
use rnic_storage::srp::initiator::{Initiator, InitiatorError};
use rnic_storage::srp::target::TargetConfig;
use rnic_storage::srp::wire::descriptor::{DataDescriptor, DirectDescriptor};
use rnic_storage::srp::wire::iu::{CmdRepr, IuRepr, TskMgmtRepr};
use rnic_storage::srp::wire::TaskManagementFunction;
use srp_common::{Rig, RigConfig};

fn write_cmd(tag: u64, lba: u64, blocks: u32, data: DataDescriptor) -> Vec<u8> {
    IuRepr::Cmd(CmdRepr {
        tag,
        lun: encode_lun(0),
        cdb: Cdb::Write(ReadWrite {
            lba,
            blocks,
            ..ReadWrite::default()
        })
        .to_bytes(),
        data_out: data,
        ..CmdRepr::default()
    })
    .to_bytes()
}

fn zeroes_at(rig: &Rig, lba: u64, blocks: usize) -> bool {
    let mut raw = vec![0xFFu8; blocks * 512];
    rig.devices[0].read(lba, &mut raw).unwrap();
    raw.iter().all(|b| *b == 0)
}

#[test]
fn malformed_ius_are_answered_or_ignored_and_counted() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    // An SRP_CMD whose indirect table runs past the IU: CHECK CONDITION for its tag.
    let mut cmd = write_cmd(0x77, 0, 1, DataDescriptor::None);
    cmd[5] = 0x20;
    cmd[6] = 3;
    initiator.send_raw_iu(&cmd, true).unwrap();
    initiator.expect_response(0x77, 1);
    let done = initiator.wait_completions(1).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].status, done[0].sense),
        (status::CHECK_CONDITION, Some(SenseData::INVALID_FIELD_IN_CDB))
    );
    // Shorter than an IU header, an unknown opcode, a target IU from the initiator:
    // nothing to answer; ignored.
    initiator.send_raw_iu(&[0x02; 9], false).unwrap();
    initiator.send_raw_iu(&[0x55; 64], false).unwrap();
    initiator
        .send_raw_iu(&IuRepr::CredRsp { tag: 1 }.to_bytes()[..], false)
        .unwrap();
    let mut login_rsp = vec![0u8; 52];
    login_rsp[0] = 0xC0;
    initiator.send_raw_iu(&login_rsp, false).unwrap();
    // Immediate data longer than the IU: CHECK CONDITION, nothing written.
    let mut imm = write_cmd(0x78, 0, 1, DataDescriptor::Immediate { len: 512 });
    imm.resize(68 + 100, 0xAB);
    initiator.send_raw_iu(&imm, true).unwrap();
    initiator.expect_response(0x78, 2);
    let done = initiator.wait_completions(1).unwrap();
    assert_eq!(done[0].status, status::CHECK_CONDITION);
    // An indirect table whose total length is not the sum of its entries.
    let d = DirectDescriptor {
        va: 0,
        key: 0,
        len: 256,
    };
    let lie = write_cmd(
        0x79,
        0,
        1,
        DataDescriptor::Indirect {
            table: DirectDescriptor { va: 0, key: 0, len: 32 },
            total_len: 9999,
            list: vec![d, d],
        },
    );
    initiator.send_raw_iu(&lie, true).unwrap();
    initiator.expect_response(0x79, 3);
    let done = initiator.wait_completions(1).unwrap();
    assert_eq!(done[0].sense, Some(SenseData::INVALID_FIELD_IN_CDB));
    let counters = rig.target().counters().clone();
    assert_eq!(counters.malformed_ius, 4, "{counters:?}");
    assert_eq!(counters.unexpected_ius, 2, "{counters:?}");
    assert!(rig.target().diagnostics().total() >= 6);
    assert!(zeroes_at(&rig, 0, 1));
    // The channel still works.
    initiator.test_unit_ready(0).unwrap();
    assert_eq!(rig.target().channel_count(), 1);
}

#[test]
fn commands_beyond_the_credits_get_busy() {
    let mut rig = Rig::new(RigConfig {
        target: TargetConfig {
            credits: 4,
            ..TargetConfig::default()
        },
        ..RigConfig::default()
    });
    let mut initiator = rig.login(srp_common::Rig::initiator_config(&rig)).unwrap();
    assert_eq!(initiator.credits(), 4);
    // Eight 64 KiB writes fetched by RDMA READ, sent back to back: the first four hold
    // their credits while their data is read; the rest overrun.
    let buffer = initiator.allocate_buffer(65536).unwrap();
    initiator.write_buffer(&buffer, 0, &[0x5A; 65536]).unwrap();
    let descriptor = initiator.buffer_descriptor(&buffer, 65536);
    for tag in 0..8u64 {
        let iu = write_cmd(100 + tag, 1000 + 128 * tag, 128, DataDescriptor::Direct(descriptor));
        initiator.send_raw_iu(&iu, true).unwrap();
        initiator.expect_response(100 + tag, tag);
    }
    let done = initiator.wait_completions(8).unwrap();
    assert_eq!(done.len(), 8);
    let busy = done.iter().filter(|c| c.status == status::BUSY).count();
    let good = done.iter().filter(|c| c.status == status::GOOD).count();
    assert_eq!((good, busy), (4, 4), "{done:?}");
    assert_eq!(rig.target().counters().credit_overruns, 4);
    // Exactly the GOOD writes reached the device.
    for c in &done {
        let lba = 1000 + 128 * (c.tag - 100);
        let mut raw = vec![0u8; 512];
        rig.devices[0].read(lba, &mut raw).unwrap();
        let written = raw.iter().all(|b| *b == 0x5A);
        assert_eq!(written, c.status == status::GOOD, "tag {}", c.tag);
    }
}

#[test]
fn descriptors_outside_registered_memory_break_the_channel_and_write_nothing() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    let bogus = DirectDescriptor {
        va: 0xdead_0000,
        key: 0x1234_5678,
        len: 65536,
    };
    initiator
        .send_raw_iu(&write_cmd(5, 2000, 128, DataDescriptor::Direct(bogus)), true)
        .unwrap();
    initiator.expect_response(5, 0);
    let outcome = initiator.wait_completions(1);
    assert!(matches!(outcome, Err(InitiatorError::Disconnected(_))), "{outcome:?}");
    rig.run_for(5_000_000);
    let counters = rig.target().counters().clone();
    assert_eq!(counters.rdma_errors, 1);
    assert_eq!(counters.commands_good, 0);
    assert_eq!(rig.target().channel_count(), 0);
    assert!(zeroes_at(&rig, 2000, 128));
    // A READ into memory the initiator never registered: the same.
    let mut initiator: Initiator = rig.login(rig.initiator_config()).unwrap();
    let read = IuRepr::Cmd(CmdRepr {
        tag: 6,
        lun: 0,
        cdb: Cdb::Read(ReadWrite {
            lba: 0,
            blocks: 8,
            ..ReadWrite::default()
        })
        .to_bytes(),
        data_in: DataDescriptor::Direct(DirectDescriptor { len: 4096, ..bogus }),
        ..CmdRepr::default()
    })
    .to_bytes();
    initiator.send_raw_iu(&read, true).unwrap();
    initiator.expect_response(6, 0);
    // The response SEND follows the failed WRITE and is flushed: the channel is gone.
    assert!(initiator.wait_completions(1).is_err());
    rig.run_for(5_000_000);
    assert_eq!(rig.target().counters().rdma_errors, 2);
    // And a fresh login works.
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    initiator.test_unit_ready(0).unwrap();
}

#[test]
fn an_abort_of_a_write_in_flight_writes_nothing_and_returns_its_credit() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    let buffer = initiator.allocate_buffer(65536).unwrap();
    initiator.write_buffer(&buffer, 0, &[0xC3; 65536]).unwrap();
    let descriptor = initiator.buffer_descriptor(&buffer, 65536);
    let credits = initiator.credits();
    initiator
        .send_raw_iu(&write_cmd(50, 3000, 128, DataDescriptor::Direct(descriptor)), true)
        .unwrap();
    let abort = IuRepr::TskMgmt(TskMgmtRepr {
        sol_not: 0,
        tag: 51,
        lun: 0,
        function: TaskManagementFunction::AbortTask,
        task_tag: 50,
    })
    .to_bytes();
    initiator.send_raw_iu(&abort, true).unwrap();
    initiator.expect_response(51, 1);
    let done = initiator.wait_completions(1).unwrap();
    assert_eq!(done[0].response_code, Some(0));
    rig.run_for(5_000_000);
    // No response for the aborted write; both credits came back with the abort's.
    let mut late = Vec::new();
    initiator.poll(&mut late).unwrap();
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(initiator.credits(), credits);
    assert_eq!(rig.target().counters().commands_aborted, 1);
    assert!(zeroes_at(&rig, 3000, 128));
    initiator.test_unit_ready(0).unwrap();
}
