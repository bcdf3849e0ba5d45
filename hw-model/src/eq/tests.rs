//! Event queue behaviour, as the driver sees it through host memory, MSI-X messages,
//! BAR writes and mailbox results.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{EqArmState, EqState, Eqc, EqeSize};
use rnic_firmware_if::doorbell::EqDoorbellCommand;
use rnic_firmware_if::eqe::{eqe_is_valid, AeqeMailbox, Ceqe};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::MailboxCompletion;
use rnic_firmware_if::regs;

use super::harness::{ceq_buffer, eqc, Bench, AEQ_BUFFER};
use super::EqKind;
use crate::command::Rejection;
use crate::diagnostics::Source;

/// CEQ 0's vector with the default capabilities: abnormal 0, AEQ 1, CEQ *i* at 2 + *i*.
const CEQ0_VECTOR: u16 = 2;
const AEQ_VECTOR: u16 = 1;

fn query(bench: &mut Bench, eqn: u32, kind: EqKind) -> Eqc {
    bench.device.query_eq(eqn, kind).expect("EQ exists")
}

#[test]
fn vectors_follow_the_hns_order_abnormal_then_aeq_then_ceqs() {
    let bench = Bench::new();
    let num_ceqs = u32::from(bench.device.config.caps.num_ceqs);
    assert_eq!(bench.aeqn(), num_ceqs, "the AEQ follows the CEQs");
    assert_eq!(bench.device.eq_vector(num_ceqs), AEQ_VECTOR);
    for i in 0..num_ceqs {
        assert_eq!(bench.device.eq_vector(i), CEQ0_VECTOR + i as u16);
    }
    assert_eq!(bench.device.active_eq_count(), 0);
}

#[test]
fn ceqe_owner_bit_is_1_on_the_first_lap_and_0_on_the_second() {
    let mut bench = Bench::new();
    bench.create_ceq(0, 2); // 4 entries
    for cqn in 0..4 {
        bench.device.post_completion_event(0, 0x100 + cqn);
    }
    for slot in 0..4 {
        let e = bench.ceqe(0, slot);
        assert_eq!(e.cq_number(), 0x100 + slot as u32);
        assert!(e.owner(), "lap 0 entries carry owner 1");
        assert!(eqe_is_valid(e.owner(), slot as u32, 4));
    }
    // The driver consumed all four and says so with a CEQ doorbell.
    bench.eq_doorbell(EqDoorbellCommand::CeqCi, 0, 4);
    bench.device.post_completion_event(0, 0x200);
    bench.device.post_completion_event(0, 0x201);
    let lap1 = [bench.ceqe(0, 0), bench.ceqe(0, 1), bench.ceqe(0, 2)];
    assert_eq!((lap1[0].cq_number(), lap1[0].owner()), (0x200, false));
    assert_eq!((lap1[1].cq_number(), lap1[1].owner()), (0x201, false));
    assert!(eqe_is_valid(lap1[0].owner(), 4, 4), "valid for the driver's CI 4");
    assert!(
        !eqe_is_valid(lap1[2].owner(), 6, 4),
        "slot 2 still holds a lap-0 entry: not new"
    );
    assert_eq!(query(&mut bench, 0, EqKind::Completion).producer_index(), 6);
    assert_eq!(query(&mut bench, 0, EqKind::Completion).consumer_index(), 4);
    assert_eq!(bench.device.counters().eqes, 6);
}

#[test]
fn a_64_byte_ceqe_is_the_4_byte_layout_followed_by_zeroes() {
    let mut bench = Bench::new();
    bench.write(ceq_buffer(1), &[0xAA; 128]);
    let eqc = eqc(3, ceq_buffer(1), EqeSize::Bytes64);
    bench.device.create_eq(1, EqKind::Completion, eqc).unwrap();
    bench.device.post_completion_event(1, 0xABCDE);
    bench.device.post_completion_event(1, 7);
    let mut first = vec![0u8; 64];
    first[..4].copy_from_slice(&[0xDE, 0xBC, 0x0A, 0x80]);
    assert_eq!(bench.read(ceq_buffer(1), 64), first);
    assert_eq!(Ceqe::parse(&bench.read(ceq_buffer(1) + 64, 64)).unwrap().cq_number(), 7);
}

#[test]
fn an_always_armed_ceq_with_interrupt_enabled_signals_its_vector_per_entry() {
    let mut bench = Bench::new();
    bench.create_ceq(0, 4);
    bench.device.post_completion_event(0, 1);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 0, "EVENT_INT_EN is still 0");
    bench.enable_interrupt(0);
    assert_eq!(
        bench.interrupts_on(CEQ0_VECTOR),
        1,
        "enabling with an unconsumed entry raises it at once"
    );
    bench.device.post_completion_event(0, 2);
    bench.device.post_completion_event(0, 3);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 3);
    let message = bench.interrupts.messages()[0];
    assert_eq!(
        (message.address, message.data),
        (0xFEE0_0000 + 4 * u64::from(CEQ0_VECTOR), 0x40 + u32::from(CEQ0_VECTOR))
    );
    assert_eq!(
        query(&mut bench, 0, EqKind::Completion).arm_state(),
        Ok(EqArmState::AlwaysArmed)
    );
}

#[test]
fn coalescing_by_count_raises_one_interrupt_per_eq_max_cnt_entries() {
    let mut bench = Bench::new();
    let mut e = eqc(4, ceq_buffer(0), EqeSize::Compact);
    e.set_max_count(3);
    bench.device.create_eq(0, EqKind::Completion, e).unwrap();
    bench.enable_interrupt(0);
    for cqn in 0..2 {
        bench.device.post_completion_event(0, cqn);
    }
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 0);
    bench.device.post_completion_event(0, 2);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 1);
    for cqn in 3..8 {
        bench.device.post_completion_event(0, cqn);
    }
    assert_eq!(
        bench.interrupts_on(CEQ0_VECTOR),
        2,
        "entries 3..6 fire once; 6 and 7 wait"
    );
    bench.advance_micros(1_000);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 2, "EQ_PERIOD 0: no timer");
}

#[test]
fn coalescing_by_period_raises_the_interrupt_when_the_timer_expires() {
    let mut bench = Bench::new();
    let mut e = eqc(4, ceq_buffer(0), EqeSize::Compact);
    e.set_max_count(8);
    e.set_period(10);
    bench.device.create_eq(0, EqKind::Completion, e).unwrap();
    bench.enable_interrupt(0);
    bench.device.post_completion_event(0, 1);
    bench.advance_micros(5);
    bench.device.post_completion_event(0, 2);
    bench.advance_micros(4);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 0, "9 µs after the first entry");
    bench.advance_micros(1);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 1, "10 µs after the first entry");
    bench.advance_micros(100);
    assert_eq!(
        bench.interrupts_on(CEQ0_VECTOR),
        1,
        "nothing pending: no more interrupts"
    );

    // The count fires first: the timer started by the first of the 8 entries is stale.
    for cqn in 0..8 {
        bench.device.post_completion_event(0, cqn);
    }
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 2);
    bench.advance_micros(20);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 2, "a superseded timer does not fire");
}

#[test]
fn an_armed_eq_fires_once_then_waits_for_a_rearm_doorbell() {
    let mut bench = Bench::new();
    let mut e = eqc(4, ceq_buffer(0), EqeSize::Compact);
    e.set_arm_state(EqArmState::Armed);
    bench.device.create_eq(0, EqKind::Completion, e).unwrap();
    bench.enable_interrupt(0);

    bench.device.post_completion_event(0, 1);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 1);
    assert_eq!(
        query(&mut bench, 0, EqKind::Completion).arm_state(),
        Ok(EqArmState::Fired)
    );
    bench.device.post_completion_event(0, 2);
    assert_eq!(
        bench.interrupts_on(CEQ0_VECTOR),
        1,
        "fired: no interrupt until re-armed"
    );

    // The driver consumed one entry and re-arms: the second is still outstanding, so
    // the interrupt comes at once.
    bench.eq_doorbell(EqDoorbellCommand::CeqCiArm, 0, 1);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 2);
    assert_eq!(
        query(&mut bench, 0, EqKind::Completion).arm_state(),
        Ok(EqArmState::Fired)
    );

    // Consumed everything and re-armed: quiet until the next entry.
    bench.eq_doorbell(EqDoorbellCommand::CeqCiArm, 0, 2);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 2);
    assert_eq!(
        query(&mut bench, 0, EqKind::Completion).arm_state(),
        Ok(EqArmState::Armed)
    );
    bench.device.post_completion_event(0, 3);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 3);
    assert_eq!(bench.device.counters().doorbells, 2);
}

#[test]
fn the_aeq_uses_its_own_vector_and_the_ci_only_doorbell_ignores_the_tag() {
    let mut bench = Bench::new();
    bench.create_aeq(3);
    let aeqn = bench.aeqn();
    bench.enable_interrupt(aeqn);
    bench.device.post_async_event(AsyncEventType::CommEst, 0, 0x42);
    assert_eq!(bench.interrupts_on(AEQ_VECTOR), 1);
    let e = bench.aeqe(0);
    assert_eq!(
        (e.event_type(), e.sub_type(), e.owner(), e.queue_number()),
        (0x03, 0, true, 0x42)
    );
    bench.eq_doorbell(EqDoorbellCommand::AeqCi, 0, 1);
    assert_eq!(query(&mut bench, aeqn, EqKind::Async).consumer_index(), 1);
}

#[test]
fn a_destroyed_eqs_timer_does_not_fire_into_a_new_eq_of_the_same_number() {
    let mut bench = Bench::new();
    let mut e = eqc(4, ceq_buffer(0), EqeSize::Compact);
    e.set_max_count(4);
    e.set_period(10);
    bench.device.create_eq(0, EqKind::Completion, e).unwrap();
    bench.enable_interrupt(0);
    bench.device.post_completion_event(0, 1);
    bench.device.destroy_eq(0, EqKind::Completion).unwrap();
    bench.device.create_eq(0, EqKind::Completion, e).unwrap();
    bench.advance_micros(50);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 0);
}

#[test]
fn a_full_ceq_drops_the_entry_goes_to_overflow_and_reports_ceq_overflow_once() {
    let mut bench = Bench::new();
    bench.create_aeq(3);
    bench.create_ceq(1, 1); // 2 entries
    for cqn in 0..4 {
        bench.device.post_completion_event(1, 0x10 + cqn);
    }
    assert_eq!(bench.device.counters().eqes, 3, "two CEQEs and one AEQE");
    let state = query(&mut bench, 1, EqKind::Completion);
    assert_eq!(state.eq_state(), Ok(EqState::Overflow));
    assert_eq!(state.producer_index(), 2);
    let e = bench.aeqe(0);
    assert_eq!((e.event_type(), e.queue_number(), e.owner()), (0x14, 1, true));
    assert!(
        !bench.aeqe(1).owner(),
        "the second lost entry of the episode is not reported again"
    );
    let diagnostic = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!(
        (diagnostic.source, diagnostic.object.as_str(), diagnostic.field),
        (Source::EventQueue, "CEQ 1", "EQ_CONS_INDX")
    );

    // Room again: the CEQ keeps working; EQ_ST stays overflow for the driver to see.
    bench.eq_doorbell(EqDoorbellCommand::CeqCi, 1, 2);
    bench.device.post_completion_event(1, 0x20);
    assert_eq!((bench.ceqe(1, 0).cq_number(), bench.ceqe(1, 0).owner()), (0x20, false));
    assert_eq!(
        query(&mut bench, 1, EqKind::Completion).eq_state(),
        Ok(EqState::Overflow)
    );
}

#[test]
fn a_full_aeq_sets_the_aeq_overflow_abnormal_bit_and_signals_vector_0() {
    let mut bench = Bench::new();
    bench.create_aeq(1); // 2 entries
    bench
        .device
        .bar_write(regs::CONTROL_BAR, regs::ABNORMAL_INT_CONFIG, &1u32.to_le_bytes());
    bench.device.bar_write(
        regs::CONTROL_BAR,
        regs::ABNORMAL_INT_ENABLE,
        &regs::ABNORMAL_AEQ_OVERFLOW.to_le_bytes(),
    );
    for qpn in 0..3 {
        bench.device.post_async_event(AsyncEventType::WqCatasError, 1, qpn);
    }
    let mut status = [0u8; 4];
    bench
        .device
        .bar_read(regs::CONTROL_BAR, regs::ABNORMAL_INT_STATUS, &mut status);
    assert_eq!(u32::from_le_bytes(status), regs::ABNORMAL_AEQ_OVERFLOW);
    assert_eq!(bench.interrupts_on(regs::ABNORMAL_VECTOR), 1);
    let aeqn = bench.aeqn();
    assert_eq!(query(&mut bench, aeqn, EqKind::Async).eq_state(), Ok(EqState::Overflow));
    assert_eq!(bench.device.counters().eqes, 2);
}

#[test]
fn over_ignore_drops_silently_apart_from_the_diagnostic() {
    let mut bench = Bench::new();
    let mut e = eqc(1, AEQ_BUFFER, EqeSize::Compact);
    e.set_overflow_ignore(true);
    let aeqn = bench.aeqn();
    bench.device.create_eq(aeqn, EqKind::Async, e).unwrap();
    for qpn in 0..3 {
        bench.device.post_async_event(AsyncEventType::CommEst, 0, qpn);
    }
    let mut status = [0u8; 4];
    bench
        .device
        .bar_read(regs::CONTROL_BAR, regs::ABNORMAL_INT_STATUS, &mut status);
    assert_eq!(u32::from_le_bytes(status), 0);
    assert_eq!(query(&mut bench, aeqn, EqKind::Async).eq_state(), Ok(EqState::Valid));
    assert_eq!(bench.device.diagnostics().total(), 1);
}

#[test]
fn a_mailbox_completion_event_has_the_aeqe_mailbox_bytes() {
    let mut bench = Bench::new();
    bench.create_aeq(3);
    bench.device.post_mailbox_event(0x0021, 1, 0x0102_0304_0506_0708);
    assert_eq!(
        bench.read(AEQ_BUFFER, 16),
        [
            0x13, 0x00, 0x00, 0x80, // EVENT_TYPE MB, SUB_TYPE 0, OWNER
            0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // OUT_PARAM
            0x21, 0x00, // TOKEN
            0x01, // MB_STATUS
            0x00,
        ]
    );
    let e = AeqeMailbox::parse(&bench.read(AEQ_BUFFER, 16)).unwrap();
    assert_eq!(
        (e.token(), e.mailbox_status(), e.out_param()),
        (0x21, 1, 0x0102_0304_0506_0708)
    );
}

#[test]
fn a_64_byte_aeqe_is_the_16_byte_layout_followed_by_zeroes() {
    let mut bench = Bench::new();
    bench.write(AEQ_BUFFER, &[0xEE; 64]);
    let aeqn = bench.aeqn();
    bench
        .device
        .create_eq(aeqn, EqKind::Async, eqc(2, AEQ_BUFFER, EqeSize::Bytes64))
        .unwrap();
    bench.device.post_async_event(AsyncEventType::CqOverflow, 0, 0x1234);
    let bytes = bench.read(AEQ_BUFFER, 64);
    assert_eq!(bytes[..8], [0x0C, 0x00, 0x00, 0x80, 0x34, 0x12, 0x00, 0x00]);
    assert!(bytes[8..].iter().all(|b| *b == 0));
}

#[test]
fn an_event_without_an_eq_is_lost_and_diagnosed() {
    let mut bench = Bench::new();
    bench.device.post_async_event(AsyncEventType::CqIdInvalid, 0, 9);
    bench.device.post_completion_event(2, 5);
    assert_eq!(bench.device.counters().eqes, 0);
    let diagnostics = bench.device.take_diagnostics();
    assert_eq!(diagnostics.len(), 2);
    assert_eq!(
        (diagnostics[0].source, diagnostics[0].field, diagnostics[0].value),
        (Source::EventQueue, "EVENT_TYPE", 0x0D)
    );
    assert!(
        diagnostics[0].expected.contains("CqIdInvalid"),
        "{}",
        diagnostics[0].expected
    );
    assert_eq!(
        (
            diagnostics[1].object.as_str(),
            diagnostics[1].field,
            diagnostics[1].value
        ),
        ("CEQ 2", "CQN", 5)
    );
}

#[test]
fn without_bus_mastering_the_entry_is_lost_and_diagnosed() {
    let mut bench = Bench::new();
    bench.create_ceq(0, 2);
    let command = rnic_firmware_if::pci::COMMAND_MEMORY_SPACE;
    bench
        .device
        .config_write(rnic_firmware_if::pci::offset::COMMAND, &command.to_le_bytes());
    bench.device.post_completion_event(0, 1);
    assert_eq!(bench.device.counters().eqes, 0);
    assert_eq!(bench.device.diagnostics().last().unwrap().field, "COMMAND.BUS_MASTER");
    assert_eq!(query(&mut bench, 0, EqKind::Completion).producer_index(), 0);
}

#[test]
fn an_unmapped_eqe_buffer_puts_the_eq_in_failure() {
    let mut bench = Bench::new();
    let unmapped = 0x7000_0000;
    bench
        .device
        .create_eq(0, EqKind::Completion, eqc(2, unmapped, EqeSize::Compact))
        .unwrap();
    bench.device.post_completion_event(0, 1);
    assert_eq!(
        query(&mut bench, 0, EqKind::Completion).eq_state(),
        Ok(EqState::Failure)
    );
    let diagnostic = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!(
        (diagnostic.object.as_str(), diagnostic.field, diagnostic.value),
        ("CEQ 0", "EQE_BA", unmapped)
    );
    assert_eq!(bench.device.counters().dma_errors, 1);
}

#[test]
fn create_eq_refuses_bad_numbers_states_and_fields() {
    let mut bench = Bench::new();
    let aeqn = bench.aeqn();
    let good = eqc(4, ceq_buffer(0), EqeSize::Compact);
    let index = |value: u64, expected: &str| Rejection {
        status: MailboxCompletion::InvalidIndex,
        field: "tag",
        value,
        expected: expected.to_string(),
    };
    assert_eq!(
        bench.device.create_eq(aeqn, EqKind::Completion, good),
        Err(index(aeqn.into(), &format!("a CEQ number below {aeqn}")))
    );
    assert_eq!(
        bench.device.create_eq(aeqn + 1, EqKind::Async, good),
        Err(index((aeqn + 1).into(), &format!("an EQ number below {}", aeqn + 1)))
    );
    // The AEQ may take a low number (a driver that uses fewer completion vectors), but
    // there is only one per function.
    assert_eq!(bench.device.create_eq(0, EqKind::Async, good), Ok(()));
    assert_eq!(
        bench.device.eq_vector(0),
        1,
        "the AEQ keeps the AEQ vector whatever its number"
    );
    assert!(matches!(
        bench.device.create_eq(1, EqKind::Async, good),
        Err(Rejection {
            status: MailboxCompletion::InvalidState,
            ..
        })
    ));
    assert_eq!(bench.device.destroy_eq(0, EqKind::Async), Ok(()));

    let with = |f: &dyn Fn(&mut Eqc)| {
        let mut e = good;
        f(&mut e);
        e
    };
    let cases: Vec<(Eqc, &str, u64)> = vec![
        (with(&|e| e.set_eq_state_raw(0)), "EQ_ST", 0),
        (with(&|e| e.set_shift(13)), "SHIFT", 13),
        (with(&|e| e.set_eqe_ba_page_size(10)), "EQE_BA_PG_SZ", 10),
        (with(&|e| e.set_eqe_size_raw(2)), "EQE_SIZE", 2),
        (with(&|e| e.set_arm_state_raw(2)), "ARM_ST", 2),
        (with(&|e| e.set_eqe_base_address(0)), "EQE_BA", 0),
        (with(&|e| e.set_eqe_base_address(0x10_0800 >> 3)), "EQE_BA", 0x10_0800),
        (with(&|e| e.set_consumer_index(0x20)), "EQ_CONS_INDX", 0x20),
    ];
    for (e, field, value) in cases {
        let rejection = bench.device.create_eq(0, EqKind::Completion, e).unwrap_err();
        assert_eq!(
            (rejection.status, rejection.field, rejection.value),
            (MailboxCompletion::InvalidParameter, field, value),
            "{rejection:?}"
        );
    }
    let rejection = bench
        .device
        .create_eq(0, EqKind::Completion, with(&|e| e.set_shift(13)))
        .unwrap_err();
    assert_eq!(
        rejection.expected,
        "at most 12 (the CEQ depth limit 4096 from the capabilities)"
    );
    assert_eq!(bench.device.active_eq_count(), 0, "nothing was created");

    bench.device.create_eq(0, EqKind::Completion, good).unwrap();
    let rejection = bench.device.create_eq(0, EqKind::Completion, good).unwrap_err();
    assert_eq!(
        (rejection.status, rejection.field),
        (MailboxCompletion::InvalidState, "EQ_ST")
    );
    assert_eq!(bench.device.active_eq_count(), 1);
}

#[test]
fn create_eq_builds_a_multi_hop_translation_from_the_eqc() {
    let mut bench = Bench::new();
    // A one-hop EQ: root BT page at 0x60_0000 lists two scattered 4 KiB pages.
    bench.map(0x60_0000, 4096);
    bench.map(0x61_0000, 4096);
    bench.map(0x62_0000, 4096);
    bench.write(0x60_0000, &0x62_0000u64.to_le_bytes());
    bench.write(0x60_0008, &0x61_0000u64.to_le_bytes());
    let mut e = eqc(11, 0x60_0000, EqeSize::Compact); // 2048 × 4 B = 2 pages
    e.set_eqe_hop_number(1);
    bench.device.create_eq(0, EqKind::Completion, e).unwrap();
    for cqn in 0..1025 {
        bench.device.post_completion_event(0, cqn);
    }
    assert_eq!(Ceqe::parse(&bench.read(0x62_0000, 4)).unwrap().cq_number(), 0);
    assert_eq!(Ceqe::parse(&bench.read(0x62_0FFC, 4)).unwrap().cq_number(), 1023);
    assert_eq!(Ceqe::parse(&bench.read(0x61_0000, 4)).unwrap().cq_number(), 1024);
}

#[test]
fn modify_eq_changes_only_coalescing_and_arm_state() {
    let mut bench = Bench::new();
    bench.create_ceq(0, 4);
    bench.enable_interrupt(0);
    let mut mask = Eqc::all_ones();
    mask.open_field(Eqc::EQ_MAX_CNT);
    mask.open_field(Eqc::EQ_PERIOD);
    let mut new = Eqc::zeroed();
    new.set_max_count(2);
    new.set_period(3);
    bench.device.modify_eq(0, EqKind::Completion, new, mask).unwrap();
    let state = query(&mut bench, 0, EqKind::Completion);
    assert_eq!((state.max_count(), state.period(), state.shift()), (2, 3, 4));
    bench.device.post_completion_event(0, 1);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 0);
    bench.advance_micros(3);
    assert_eq!(bench.interrupts_on(CEQ0_VECTOR), 1);

    let mut mask = Eqc::all_ones();
    mask.open_field(Eqc::SHIFT);
    let rejection = bench
        .device
        .modify_eq(0, EqKind::Completion, Eqc::zeroed(), mask)
        .unwrap_err();
    assert_eq!(
        (rejection.status, rejection.field, rejection.value),
        (MailboxCompletion::InvalidParameter, "SHIFT", 0)
    );
    let rejection = bench
        .device
        .modify_eq(1, EqKind::Completion, Eqc::zeroed(), Eqc::all_ones())
        .unwrap_err();
    assert_eq!(rejection.status, MailboxCompletion::InvalidState);
}

#[test]
fn query_and_destroy_need_a_created_eq() {
    let mut bench = Bench::new();
    assert_eq!(
        bench.device.query_eq(0, EqKind::Completion).unwrap_err().status,
        MailboxCompletion::InvalidState
    );
    assert_eq!(
        bench.device.destroy_eq(0, EqKind::Completion).unwrap_err().status,
        MailboxCompletion::InvalidState
    );
    bench.create_ceq(0, 4);
    let state = query(&mut bench, 0, EqKind::Completion);
    assert_eq!(
        (state.eq_state(), state.shift(), state.eqe_base_address() << 3),
        (Ok(EqState::Valid), 4, ceq_buffer(0))
    );
    bench.device.destroy_eq(0, EqKind::Completion).unwrap();
    assert_eq!(bench.device.active_eq_count(), 0);
    bench.device.post_completion_event(0, 1);
    assert_eq!(bench.device.counters().eqes, 0, "a destroyed CEQ takes no entries");
}

#[test]
fn eq_doorbells_for_unknown_eqs_or_a_ci_beyond_the_producer_are_dropped() {
    let mut bench = Bench::new();
    bench.eq_doorbell(EqDoorbellCommand::CeqCi, 3, 0);
    let d = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!(
        (d.source, d.object.as_str(), d.field, d.value),
        (Source::Doorbell, "EQ 3", "TAG", 3)
    );

    bench.create_ceq(0, 2);
    bench.device.post_completion_event(0, 1);
    bench.eq_doorbell(EqDoorbellCommand::CeqCi, 0, 2);
    let d = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!((d.object.as_str(), d.field, d.value), ("EQ 0", "CI", 2));
    assert_eq!(
        d.expected,
        "a consumer index from the current 0x0 up to the producer index 0x1"
    );
    assert_eq!(bench.device.counters().doorbells_dropped, 2);
    assert_eq!(bench.device.counters().doorbells, 0);
    assert_eq!(query(&mut bench, 0, EqKind::Completion).consumer_index(), 0);

    bench.eq_doorbell(EqDoorbellCommand::AeqCi, 0, 0);
    assert_eq!(bench.device.diagnostics().last().unwrap().field, "TAG", "no AEQ yet");
    assert_eq!(bench.device.counters().doorbells_dropped, 3);
}

#[test]
fn the_eq_doorbell_also_works_as_two_32_bit_stores() {
    let mut bench = Bench::new();
    bench.create_ceq(1, 2);
    bench.device.post_completion_event(1, 1);
    let word = rnic_firmware_if::doorbell::EqDoorbell::new(EqDoorbellCommand::CeqCi, 1, 1).as_u64();
    bench
        .device
        .bar_write(regs::DOORBELL_BAR, 0x238, &(word as u32).to_le_bytes());
    bench
        .device
        .bar_write(regs::DOORBELL_BAR, 0x23C, &((word >> 32) as u32).to_le_bytes());
    assert_eq!(query(&mut bench, 1, EqKind::Completion).consumer_index(), 1);
}
