//! Our SRP initiator against our SRP target, on two embedded NICs of one fabric,
//! connected by the in-process connection manager.

mod srp_common;

use rnic_storage::scsi::data::{vpd, BlockLimits};
use rnic_storage::scsi::{status, SenseData};
use rnic_storage::srp::initiator::{InitiatorConfig, InitiatorError};
use rnic_storage::srp::wire::{LoginRejReason, PortId};
use srp_common::{pattern, Rig, RigConfig};

#[test]
fn logs_in_describes_the_units_and_moves_data_both_ways() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    let login = initiator.login_info();
    assert_eq!(login.response.req_lim_delta, 128);
    assert!(login.immediate);
    assert_eq!(initiator.report_luns().unwrap(), vec![0, 5 << 48]);
    let inquiry = initiator.inquiry(5).unwrap();
    assert_eq!((inquiry.peripheral, inquiry.vendor.as_str()), (0, "RNIC-EMU"));
    assert_eq!(initiator.read_capacity(0).unwrap(), (16384, 512));
    assert_eq!(initiator.read_capacity(5).unwrap(), (2048, 4096));
    initiator.test_unit_ready(0).unwrap();
    let limits = BlockLimits::parse(&initiator.vpd(0, vpd::BLOCK_LIMITS).unwrap()).unwrap();
    assert_eq!(limits.max_transfer_blocks, 512);
    assert_eq!(initiator.vpd(5, vpd::UNIT_SERIAL_NUMBER).unwrap(), b"test-lun-5");

    // Immediate data (4 KiB ≤ 8 KiB), then RDMA READ (64 KiB), both read back with
    // RDMA WRITE.
    let small = pattern(4096, 1);
    initiator.write(0, 8, 512, &small).unwrap();
    let big = pattern(65536, 2);
    initiator.write(5, 3, 4096, &big).unwrap();
    let mut back = vec![0u8; 4096];
    initiator.read(0, 8, 512, &mut back).unwrap();
    assert_eq!(back, small);
    let mut back = vec![0u8; 65536];
    initiator.read(5, 3, 4096, &mut back).unwrap();
    assert_eq!(back, big);
    // What reached the backend is what was written.
    let mut raw = vec![0u8; 65536];
    rig.devices[1].read(3, &mut raw).unwrap();
    assert_eq!(raw, big);
    initiator.synchronize_cache(5).unwrap();
    let counters = initiator.counters().clone();
    assert!(counters.immediate_commands >= 1);
    let target = rig.target().counters().clone();
    assert_eq!(target.logins_accepted, 1);
    assert_eq!(target.bytes_from_initiators, 4096 + 65536);
    assert_eq!(target.malformed_ius + target.credit_overruns + target.rdma_errors, 0);
    initiator.logout();
    rig.run_for(2_000_000);
    assert_eq!(rig.target().channel_count(), 0);
}

#[test]
fn indirect_descriptor_tables_and_no_immediate_data() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig
        .login(InitiatorConfig {
            immediate_data: false,
            descriptor_chunk: Some(4096),
            ..rig.initiator_config()
        })
        .unwrap();
    assert!(!initiator.login_info().immediate);
    // 40 KiB in ten table entries, both ways.
    let data = pattern(40960, 3);
    initiator.write(0, 100, 512, &data).unwrap();
    let mut back = vec![0u8; 40960];
    initiator.read(0, 100, 512, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(initiator.counters().immediate_commands, 0);
}

#[test]
fn refuses_commands_it_does_not_serve_with_illegal_request() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    // START STOP UNIT, REPORT SUPPORTED OPERATION CODES, WRITE SAME(16).
    for cdb in [
        [0x1B, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
        [0x93, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
    ] {
        let (completion, _) = initiator.command(0, cdb, None, 512).unwrap();
        assert_eq!(completion.status, status::CHECK_CONDITION);
        assert_eq!(completion.sense, Some(SenseData::INVALID_OPCODE));
    }
    // An unknown LUN: LOGICAL UNIT NOT SUPPORTED; INQUIRY there says "no unit".
    match initiator.read_capacity(7) {
        Err(InitiatorError::Scsi { status, sense }) => {
            assert_eq!(
                (status, sense),
                (status::CHECK_CONDITION, Some(SenseData::LUN_NOT_SUPPORTED))
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(initiator.inquiry(7).unwrap().peripheral, 0x7F);
    // Out of range.
    let mut buffer = vec![0u8; 1024];
    match initiator.read(0, 16383, 512, &mut buffer) {
        Err(InitiatorError::Scsi { sense, .. }) => assert_eq!(sense, Some(SenseData::LBA_OUT_OF_RANGE)),
        other => panic!("{other:?}"),
    }
    // READ CAPACITY(16), then (10), then INQUIRY.
    assert_eq!(rig.target().counters().unknown_lun_commands, 3);
}

#[test]
fn refuses_logins_with_the_reason_linux_understands() {
    let mut rig = Rig::new(RigConfig::default());
    let wrong = InitiatorConfig {
        target_port_id: PortId::new(1, 2),
        ..rig.initiator_config()
    };
    match rig.login(wrong) {
        Err(InitiatorError::Rejected(reason)) => assert_eq!(reason, LoginRejReason::UnableToAssociate),
        other => panic!("{other:?}"),
    }
    let too_large = InitiatorConfig {
        max_it_iu_len: 1 << 20,
        ..rig.initiator_config()
    };
    match rig.login(too_large) {
        Err(InitiatorError::Rejected(reason)) => assert_eq!(reason, LoginRejReason::ItIuLengthTooLarge),
        other => panic!("{other:?}"),
    }
    let counters = rig.target().counters().clone();
    assert_eq!((counters.logins_rejected, counters.logins_wrong_port), (2, 1));
    assert_eq!(rig.target().diagnostics().total(), 2);
    // And the target still takes a good login.
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    initiator.test_unit_ready(0).unwrap();
}

#[test]
fn a_second_single_channel_login_replaces_the_first_and_multichannel_keeps_it() {
    let mut rig = Rig::new(RigConfig::default());
    let config = rig.initiator_config();
    let mut first = rig.login(config.clone()).unwrap();
    let mut second = rig.login(config.clone()).unwrap();
    assert_eq!(
        second.login_info().response.rsp_flags & 3,
        1,
        "existing channel terminated"
    );
    rig.run_for(2_000_000);
    assert!(
        first.lost().is_some_and(|why| why.contains("logged out")),
        "{:?}",
        first.lost()
    );
    second.test_unit_ready(0).unwrap();
    let third = rig
        .login(InitiatorConfig {
            multichannel: true,
            ..config
        })
        .unwrap();
    assert_eq!(
        third.login_info().response.rsp_flags & 3,
        2,
        "existing channel maintained"
    );
    assert_eq!(rig.target().channel_count(), 2);
    assert_eq!(rig.target().counters().channels_replaced, 1);
}

#[test]
fn initiator_logout_iu_and_target_logout_close_the_channel() {
    let mut rig = Rig::new(RigConfig::default());
    let initiator = rig.login(rig.initiator_config()).unwrap();
    initiator.logout_with_iu().unwrap();
    rig.run_for(2_000_000);
    assert_eq!(rig.target().counters().initiator_logouts, 1);
    assert_eq!(rig.target().channel_count(), 0);
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    rig.target().logout_all();
    rig.run_for(2_000_000);
    assert!(initiator.lost().is_some());
    assert!(matches!(
        initiator.test_unit_ready(0),
        Err(InitiatorError::Disconnected(_))
    ));
    assert_eq!(rig.target().channel_count(), 0);
}

#[test]
fn task_management_answers_abort_and_lun_reset() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    // Nothing outstanding: ABORT TASK completes (the task is not there), LUN RESET
    // completes, a reset of a LUN that does not exist is INCORRECT LUN.
    assert_eq!(initiator.abort_task(0, 999).unwrap(), 0);
    assert_eq!(initiator.lun_reset(5).unwrap(), 0);
    assert_eq!(initiator.lun_reset(9).unwrap(), 0x09);
    assert_eq!(rig.target().counters().task_management, 3);
    // Credits all came back.
    assert_eq!(initiator.credits(), 128);
    initiator.test_unit_ready(0).unwrap();
}
