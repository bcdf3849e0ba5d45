//! A misbehaving driver gets what hardware would give — a cmdq return code, a mailbox
//! status, an async event — plus a diagnostic naming what it did wrong, and the device
//! keeps working. One test per misuse; each ends by proving the device still works.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{Descriptor, DescriptorFlags, FirmwareVersion, Opcode, ReturnCode};
use rnic_firmware_if::context::{CqState, Cqc, QpState, Qpc, ServiceType, Srqc};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::doorbell::{CqDoorbell, Doorbell};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode};
use rnic_firmware_if::regs;
use rnic_testbench::harness::{RegisterHarness, Table, DMA_BASE, DMA_SIZE, RING_DEPTH};

/// A firmware-version query succeeds: the command queue is alive.
fn assert_command_queue_works(h: &mut RegisterHarness) {
    let (code, data) = h.command(Opcode::QueryFirmwareVersion, true, &[0; 24]);
    assert_eq!(code, ReturnCode::Success);
    assert_eq!(
        FirmwareVersion::parse(&data).unwrap().version(),
        h.device.config().firmware_version
    );
}

const UNMAPPED: u64 = DMA_BASE + DMA_SIZE as u64 + 0x10_0000;

#[test]
fn an_unknown_register_reads_all_ones_and_is_diagnosed() {
    let mut h = RegisterHarness::new();
    // Past the last register, and a hole between registers (not 4-aligned).
    for offset in [regs::BAR0_SIZE - 4, regs::CSQ_BASE_LOW + 2] {
        let before = h.device.diagnostics().total();
        assert_eq!(h.read_register(offset), 0xFFFF_FFFF, "BAR0+{offset:#x}");
        assert_eq!(h.device.diagnostics().total(), before + 1);
        let diagnostic = h.last_diagnostic();
        assert!(diagnostic.contains(&format!("BAR0+{offset:#x}")), "{diagnostic}");
        assert!(diagnostic.contains("register offset"), "{diagnostic}");
    }
    // A BAR the function does not have.
    let mut data = [0u8; 4];
    h.device.bar_read(1, 0, &mut data);
    assert_eq!(data, [0xFF; 4]);
    assert!(h.last_diagnostic().contains("BAR index"), "{}", h.last_diagnostic());
    // The registers that exist still read as they should.
    assert_eq!(h.read_register(regs::ID), regs::ID_MAGIC);
    assert_command_queue_works(&mut h);
}

#[test]
fn an_unknown_cmdq_opcode_returns_not_exist_and_names_the_opcode() {
    let mut h = RegisterHarness::new();
    let mut descriptor = Descriptor::zeroed();
    descriptor.set_opcode(0x7777);
    descriptor.set_flags_raw(DescriptorFlags::IN.bits());
    let response = h.submit_raw(&[descriptor], 1)[0];
    assert_eq!(ReturnCode::from_raw(response.return_value()), ReturnCode::NotExist);
    let diagnostic = h.last_diagnostic();
    assert!(diagnostic.contains("OPCODE = 0x7777"), "{diagnostic}");
    assert_command_queue_works(&mut h);
}

#[test]
fn a_descriptor_without_the_in_flag_is_a_parameter_error() {
    let mut h = RegisterHarness::new();
    let descriptor = Descriptor::new(Opcode::QueryFirmwareVersion, DescriptorFlags::WR);
    let response = h.submit_raw(&[descriptor], 1)[0];
    assert_eq!(
        ReturnCode::from_raw(response.return_value()),
        ReturnCode::ParameterError
    );
    assert!(h.last_diagnostic().contains("FLAG.IN"), "{}", h.last_diagnostic());
    assert_command_queue_works(&mut h);
}

#[test]
fn a_chain_whose_last_posted_descriptor_says_next_is_a_next_error() {
    let mut h = RegisterHarness::new();
    let descriptor = Descriptor::new(
        Opcode::QueryFirmwareVersion,
        DescriptorFlags::IN | DescriptorFlags::NEXT,
    );
    let response = h.submit_raw(&[descriptor], 1)[0];
    assert_eq!(ReturnCode::from_raw(response.return_value()), ReturnCode::NextError);
    assert!(h.last_diagnostic().contains("FLAG.NEXT"), "{}", h.last_diagnostic());
    assert_command_queue_works(&mut h);
}

#[test]
fn a_capability_query_with_one_descriptor_instead_of_five_is_a_next_error() {
    let mut h = RegisterHarness::new();
    let (code, _) = h.command(Opcode::QueryCapabilities, true, &[0; 24]);
    assert_eq!(code, ReturnCode::NextError);
    assert!(
        h.last_diagnostic().contains("5 chained descriptor(s)"),
        "{}",
        h.last_diagnostic()
    );
    assert_command_queue_works(&mut h);
}

#[test]
fn a_producer_index_beyond_the_ring_is_ignored_and_flagged_as_abnormal() {
    let mut h = RegisterHarness::new();
    h.write_register(regs::ABNORMAL_INT_ENABLE, regs::ABNORMAL_CMDQ_FATAL);
    h.write_register(regs::ABNORMAL_INT_CONFIG, 1);
    let consumer_before = h.read_register(regs::CSQ_CONSUMER_INDEX);
    h.write_register(regs::CSQ_PRODUCER_INDEX, RING_DEPTH + 3);
    h.settle();
    assert_eq!(
        h.read_register(regs::CSQ_PRODUCER_INDEX),
        consumer_before,
        "PI unchanged"
    );
    assert_eq!(
        h.read_register(regs::CSQ_CONSUMER_INDEX),
        consumer_before,
        "nothing executed"
    );
    assert_eq!(
        h.read_register(regs::ABNORMAL_INT_STATUS) & regs::ABNORMAL_CMDQ_FATAL,
        regs::ABNORMAL_CMDQ_FATAL
    );
    assert_eq!(h.interrupts.count(regs::ABNORMAL_VECTOR), 1, "abnormal vector raised");
    assert!(
        h.last_diagnostic().contains("CSQ_PRODUCER_INDEX = 0x43"),
        "{}",
        h.last_diagnostic()
    );
    h.write_register(regs::ABNORMAL_INT_STATUS, regs::ABNORMAL_CMDQ_FATAL);
    assert_eq!(h.read_register(regs::ABNORMAL_INT_STATUS), 0, "write 1 to clear");
    assert_command_queue_works(&mut h);
}

#[test]
fn a_ring_given_a_new_depth_starts_over_at_slot_zero() {
    let mut h = RegisterHarness::new();
    // The indices of a 64-descriptor ring, near its end.
    let deep = RING_DEPTH - 14;
    h.write_register(regs::CSQ_CONSUMER_INDEX, deep);
    assert_eq!(h.read_register(regs::CSQ_PRODUCER_INDEX), deep);
    // The driver shrinks the ring to 8 descriptors: 50 is no slot of it.
    h.write_register(regs::CSQ_DEPTH, 1);
    assert_eq!(h.read_register(regs::CSQ_PRODUCER_INDEX), 0, "PI starts over");
    assert_eq!(h.read_register(regs::CSQ_CONSUMER_INDEX), 0, "CI starts over");
    // Three descriptors posted on the small ring are consumed (whatever they hold).
    h.write_register(regs::CSQ_PRODUCER_INDEX, 3);
    h.settle();
    assert_eq!(h.read_register(regs::CSQ_CONSUMER_INDEX), 3);
    // Back to the harness's ring, at the harness's own producer index.
    h.write_register(regs::CSQ_DEPTH, RING_DEPTH / 8);
    let producer = h.producer_index();
    h.write_register(regs::CSQ_CONSUMER_INDEX, producer);
    assert_command_queue_works(&mut h);
}

#[test]
fn a_ring_in_unmapped_memory_marks_the_function_fatal_until_reset() {
    let mut h = RegisterHarness::new();
    h.write_register(regs::CSQ_BASE_LOW, UNMAPPED as u32);
    h.write_register(regs::CSQ_BASE_HIGH, (UNMAPPED >> 32) as u32);
    h.write_register(regs::CSQ_PRODUCER_INDEX, 1);
    h.settle();
    assert_ne!(h.read_register(regs::FUNCTION_STATUS) & regs::STATUS_FATAL, 0);
    assert!(h.last_diagnostic().contains("CSQ_BASE"), "{}", h.last_diagnostic());
    // A function reset clears the fatal state; a fresh harness-style init works again.
    h.write_register(regs::FUNCTION_RESET, 1);
    assert_eq!(h.read_register(regs::FUNCTION_RESET), 1, "reset in progress");
    h.settle();
    assert_eq!(h.read_register(regs::FUNCTION_RESET), 0);
    assert_eq!(h.read_register(regs::FUNCTION_STATUS), regs::STATUS_READY);
}

#[test]
fn mailbox_commands_on_an_index_outside_the_table_fail_with_invalid_index() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    let num_qps = h.device.config().caps.num_qps;
    let (status, _) = h.query::<Qpc>(MailboxOpcode::QueryQpc, num_qps);
    assert_eq!(status, MailboxCompletion::InvalidIndex);
    assert!(
        h.last_diagnostic().contains(&format!("tag = {num_qps:#x}")),
        "{}",
        h.last_diagnostic()
    );
    let num_cqs = h.device.config().caps.num_cqs;
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::DestroyCqc as u8, num_cqs + 5, 0, 0),
        MailboxCompletion::InvalidIndex
    );
    assert_command_queue_works(&mut h);
}

#[test]
fn mailbox_commands_before_the_context_table_exists_fail_with_no_context_table() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    let (status, _) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 9);
    assert_eq!(status, MailboxCompletion::NoContextTable);
    assert!(h.last_diagnostic().contains("L0 slot"), "{}", h.last_diagnostic());
    h.ensure_context(Table::Qpc, 9);
    let (status, qpc) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 9);
    assert_eq!(status, MailboxCompletion::Success);
    assert_eq!(qpc.qp_state(), Ok(QpState::Reset));
}

#[test]
fn an_unknown_mailbox_opcode_fails_with_unknown_command() {
    let mut h = RegisterHarness::new();
    assert_eq!(h.mailbox_raw(0x03, 0, 0, 0), MailboxCompletion::UnknownCommand);
    assert!(h.last_diagnostic().contains("CMD = 0x3"), "{}", h.last_diagnostic());
    assert_command_queue_works(&mut h);
}

#[test]
fn illegal_qp_transitions_fail_with_invalid_state_and_leave_the_qp_as_it_was() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.create_cq(3);
    h.ensure_context(Table::Qpc, 12);
    assert_eq!(
        h.move_qp(12, QpState::Rts),
        MailboxCompletion::InvalidState,
        "RESET->RTS skips states"
    );
    let diagnostic = h.last_diagnostic();
    assert!(
        diagnostic.contains("QP_ST = 0x3") && diagnostic.contains("from Reset"),
        "{diagnostic}"
    );
    assert_eq!(
        h.move_qp(12, QpState::Sqd),
        MailboxCompletion::InvalidState,
        "SQD is not supported"
    );
    let (_, qpc) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 12);
    assert_eq!(qpc.qp_state(), Ok(QpState::Reset), "a refused modify changes nothing");
    // The same QP then goes through the legal path.
    h.create_connected_qp(12, 3);
    assert_eq!(
        h.move_qp(12, QpState::Init),
        MailboxCompletion::InvalidState,
        "RTS->INIT"
    );
    assert_eq!(h.move_qp(12, QpState::Err), MailboxCompletion::Success);
    assert_eq!(h.move_qp(12, QpState::Reset), MailboxCompletion::Success);
}

#[test]
fn a_qp_keeps_the_service_type_it_was_given_at_reset_to_init() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.create_cq(3);
    h.create_connected_qp(12, 3);
    // RTS->RTS that would make the RC QP a UD QP: the WQEs the requester holds were
    // decoded as RC WQEs.
    let mut context = Qpc::zeroed();
    let mut mask = Qpc::all_ones();
    context.set_qp_state(QpState::Rts);
    mask.open_field(Qpc::QP_ST);
    context.set_service_type(ServiceType::Ud);
    mask.open_field(Qpc::TST);
    assert_eq!(h.modify_qp(12, &context, &mask), MailboxCompletion::InvalidParameter);
    let diagnostic = h.last_diagnostic();
    assert!(
        diagnostic.contains("TST") && diagnostic.contains("RESET"),
        "{diagnostic}"
    );
    let (_, qpc) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 12);
    assert_eq!(
        qpc.service_type(),
        Ok(ServiceType::Rc),
        "a refused modify changes nothing"
    );
    assert_eq!(qpc.qp_state(), Ok(QpState::Rts));
    // Through RESET the type may change.
    assert_eq!(h.move_qp(12, QpState::Reset), MailboxCompletion::Success);
    context.set_qp_state(QpState::Init);
    assert_eq!(h.modify_qp(12, &context, &mask), MailboxCompletion::Success);
}

#[test]
fn a_qp_naming_a_cq_that_does_not_exist_is_refused_with_the_field_named() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.ensure_context(Table::Qpc, 20);
    h.ensure_context(Table::Cqc, 77);
    let mut init = Qpc::zeroed();
    init.set_qp_state(QpState::Init);
    init.set_protection_domain(1);
    init.set_send_cq_number(77);
    init.set_receive_cq_number(77);
    assert_eq!(
        h.modify_qp(20, &init, &Qpc::zeroed()),
        MailboxCompletion::InvalidParameter
    );
    assert!(h.last_diagnostic().contains("TX_CQN = 0x4d"), "{}", h.last_diagnostic());
}

#[test]
fn creating_an_object_twice_or_destroying_a_missing_one_is_invalid_state() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    let buffer = h.create_cq(4);
    let again = h.mailbox_with(
        MailboxOpcode::CreateCqc,
        4,
        &RegisterHarness::cq_context(4, buffer),
        None,
    );
    assert_eq!(again, MailboxCompletion::InvalidState);
    h.ensure_context(Table::Srqc, 2);
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::DestroySrq as u8, 2, 0, 0),
        MailboxCompletion::InvalidState
    );
    let (status, srqc) = h.query::<Srqc>(MailboxOpcode::QuerySrqc, 2);
    assert_eq!((status, srqc.srq_state_raw()), (MailboxCompletion::Success, 0));
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::DestroyCqc as u8, 4, 0, 0),
        MailboxCompletion::Success
    );
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::DestroyCqc as u8, 4, 0, 0),
        MailboxCompletion::InvalidState
    );
}

#[test]
fn a_context_table_base_address_in_unmapped_memory_gives_a_dma_error() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::WriteCqcBt0 as u8, 0, UNMAPPED, 0),
        MailboxCompletion::Success
    );
    let (status, _) = h.query::<Cqc>(MailboxOpcode::QueryCqc, 1);
    assert_eq!(status, MailboxCompletion::DmaError);
    let cq1_context = UNMAPPED + Cqc::SIZE as u64;
    assert!(
        h.last_diagnostic().contains(&format!("context = {cq1_context:#x}")),
        "{}",
        h.last_diagnostic()
    );
    assert!(h.last_diagnostic().contains("is not mapped"), "{}", h.last_diagnostic());
    // The rest of the device is unaffected.
    h.ensure_context(Table::Qpc, 1);
    assert_eq!(h.query::<Qpc>(MailboxOpcode::QueryQpc, 1).0, MailboxCompletion::Success);
}

#[test]
fn a_misaligned_or_null_base_address_is_refused() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::WriteQpcBt0 as u8, 0, DMA_BASE + 8, 0),
        MailboxCompletion::InvalidParameter
    );
    assert_eq!(
        h.mailbox_raw(MailboxOpcode::WriteQpcBt0 as u8, 0, 0, 0),
        MailboxCompletion::InvalidParameter
    );
    assert_command_queue_works(&mut h);
}

#[test]
fn a_cq_whose_buffer_is_unmapped_reports_cq_access_error_when_a_cqe_is_due() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.create_cq(1); // creates CEQ 0 as well
    h.ensure_context(Table::Cqc, 2);
    let created = h.mailbox_with(
        MailboxOpcode::CreateCqc,
        2,
        &RegisterHarness::cq_context(2, UNMAPPED),
        None,
    );
    assert_eq!(
        created,
        MailboxCompletion::Success,
        "the page table is well formed; memory is checked on use"
    );
    let buffer = h.create_connected_qp(30, 2);
    // Post one WQE (opcode RDMA WRITE) and flush it by moving the QP to ERR.
    h.write_u64(buffer, 0x3);
    h.ring_sq(30, 1);
    assert_eq!(h.move_qp(30, QpState::Err), MailboxCompletion::Success);
    let events = h.take_async_events();
    assert!(
        events
            .iter()
            .any(|e| e.event_type() == AsyncEventType::CqAccessError as u8 && e.queue_number() == 2),
        "{events:?}"
    );
    let (_, cqc) = h.query::<Cqc>(MailboxOpcode::QueryCqc, 2);
    assert_eq!(cqc.cq_state_raw(), CqState::Failure as u8);
    assert_command_queue_works(&mut h);
}

#[test]
fn doorbells_for_objects_that_do_not_exist_raise_async_events_naming_them() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.ensure_context(Table::Qpc, 40);
    h.ensure_context(Table::Cqc, 41);
    h.ensure_context(Table::Srqc, 42);
    h.ring_doorbell(Doorbell::sq(40, 1, 0).as_u64());
    h.ring_doorbell(CqDoorbell::update(41, 1).as_u64());
    h.ring_doorbell(Doorbell::srq(42, 1).as_u64());
    let events: Vec<(u8, u32)> = h
        .take_async_events()
        .iter()
        .map(|e| (e.event_type(), e.queue_number()))
        .collect();
    assert!(events.contains(&(AsyncEventType::CqIdInvalid as u8, 41)), "{events:?}");
    assert!(
        events.contains(&(AsyncEventType::SrqCatasError as u8, 42)),
        "{events:?}"
    );
    // QP 40 exists as a context slot but is in RESET: the SQ doorbell is dropped and named.
    let dropped = h
        .device
        .diagnostics()
        .recent()
        .any(|d| d.object == "QP 0x28" && d.field == "QP_ST");
    assert!(dropped);
    // A QPN beyond the table gets a WQ catastrophic error event.
    let beyond = h.device.config().caps.num_qps + 1;
    h.ring_doorbell(Doorbell::sq(beyond & 0xFF_FFFF, 1, 0).as_u64());
    let events: Vec<(u8, u32)> = h
        .take_async_events()
        .iter()
        .map(|e| (e.event_type(), e.queue_number()))
        .collect();
    assert!(
        events.contains(&(AsyncEventType::WqCatasError as u8, beyond)),
        "{events:?}"
    );
    assert!(h.device.counters().doorbells_dropped >= 4);
    assert_command_queue_works(&mut h);
}

#[test]
fn a_doorbell_producer_index_past_the_ring_is_dropped_with_a_wqe_address_error() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.create_cq(1);
    h.create_connected_qp(50, 1);
    h.ring_sq(50, 65); // SQ depth is 64
    let events = h.take_async_events();
    assert!(
        events
            .iter()
            .any(|e| e.event_type() == AsyncEventType::WqCatasError as u8 && e.sub_type() == 4),
        "{events:?}"
    );
    let (_, qpc) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 50);
    assert_eq!(
        qpc.sq_producer_index(),
        0,
        "the bad doorbell did not move the producer index"
    );
    h.ring_sq(50, 2);
    let (_, qpc) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 50);
    assert_eq!(qpc.sq_producer_index(), 2);
}

/// The device writes back only the producer index of the QPC on an RQ doorbell: QUERY_QPC
/// reads the new index and every other byte of the context as it was.
#[test]
fn an_rq_doorbell_moves_the_producer_index_and_nothing_else_in_the_qpc() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.create_cq(1);
    h.create_connected_qp(50, 1);
    let (_, before) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 50);
    h.ring_doorbell(Doorbell::rq(50, 5).as_u64());
    let (_, after) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 50);
    assert_eq!(after.rq_producer_index(), 5);
    let mut expected = before;
    expected.set_rq_producer_index(5);
    assert_eq!(after.bytes(), expected.bytes());
}

#[test]
fn bad_doorbell_offsets_and_half_writes_are_dropped_and_named() {
    let mut h = RegisterHarness::new();
    h.device.bar_write(regs::DOORBELL_BAR, 0x100, &0u64.to_le_bytes());
    assert!(
        h.last_diagnostic().contains("offset = 0x100"),
        "{}",
        h.last_diagnostic()
    );
    h.device.bar_write(regs::DOORBELL_BAR, 0x234, &0u32.to_le_bytes());
    assert!(h.last_diagnostic().contains("high half"), "{}", h.last_diagnostic());
    let pages = h.device.config().doorbell_pages as u64;
    h.device
        .bar_write(regs::DOORBELL_BAR, pages * 0x1000 + 0x230, &0u64.to_le_bytes());
    assert!(h.last_diagnostic().contains("page"), "{}", h.last_diagnostic());
    assert_eq!(h.device.counters().doorbells_dropped, 3);
}

#[test]
fn flushing_an_errored_qp_writes_owner_bit_cqes_and_an_armed_cq_interrupts() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    let cqes = h.create_cq(5);
    let wqes = h.create_connected_qp(60, 5);
    // Three SQ WQEs: SEND (0), RDMA WRITE (3), RDMA READ (5).
    for (i, opcode) in [0u64, 3, 5].iter().enumerate() {
        h.write_u64(wqes + i as u64 * 64, *opcode);
    }
    h.ring_sq(60, 3);
    h.arm_cq(5, 0);
    let before = h.interrupts.count(2);
    assert_eq!(h.move_qp(60, QpState::Err), MailboxCompletion::Success);
    for (i, opcode) in [0u8, 3, 5].iter().enumerate() {
        let cqe = h.read_cqe(cqes, i as u32);
        assert!(cqe.owner(), "lap 0 CQEs carry owner 1");
        assert_eq!(cqe.status(), CqeStatus::WrFlushErr as u8);
        assert_eq!(cqe.opcode(), *opcode);
        assert_eq!(cqe.wqe_index(), i as u16);
        assert_eq!(cqe.local_qp_number(), 60);
        assert!(!cqe.receive_side());
    }
    assert!(!h.read_cqe(cqes, 3).owner(), "no fourth CQE");
    assert_eq!(h.interrupts.count(2), before + 1, "CEQ 0 raised MSI-X vector 2 once");
    let (_, qpc) = h.query::<Qpc>(MailboxOpcode::QueryQpc, 60);
    assert_eq!(qpc.sq_consumer_index(), 3);
}

#[test]
fn a_full_cq_reports_overflow_as_an_async_event() {
    let mut h = RegisterHarness::new();
    h.configure_tables();
    h.create_aeq();
    h.create_cq(6);
    let wqes = h.create_connected_qp(61, 6);
    for round in 0..2u16 {
        h.write_u64(wqes, 0);
        h.ring_sq(61, 40 * (round + 1));
        if round == 0 {
            // 40 outstanding WQEs flushed into a 64-entry CQ fit; the next 40 do not.
            assert_eq!(h.move_qp(61, QpState::Err), MailboxCompletion::Success);
        }
    }
    let events = h.take_async_events();
    assert!(
        events
            .iter()
            .any(|e| e.event_type() == AsyncEventType::CqOverflow as u8 && e.queue_number() == 6),
        "{events:?}"
    );
    assert_command_queue_works(&mut h);
}
