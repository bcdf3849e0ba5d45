//! Completion queue behaviour, as the driver sees it: contexts and CQEs in host memory,
//! CEQEs and AEQEs, doorbells through BAR2 and mailbox results.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{CqArmState, CqState, Cqc, CqeSize};
use rnic_firmware_if::cqe::{cqe_is_valid, Cqe, CqeStatus};
use rnic_firmware_if::doorbell::CqDoorbell;
use rnic_firmware_if::mailbox::MailboxCompletion;
use rnic_firmware_if::pci::COMMAND_MEMORY_SPACE;
use rnic_firmware_if::regs;

use super::CqError;
use crate::command::Rejection;
use crate::diagnostics::Source;
use crate::eq::harness::{cqc, cqe_buffer, Bench, CQC_TABLE, RECORDS};

/// A bench with CEQ 0 (16 entries) and the AEQ (16 entries) created.
fn bench() -> Bench {
    let mut bench = Bench::new();
    bench.create_ceq(0, 4);
    bench.create_aeq(4);
    bench
}

/// A bench as [`bench`] plus CQ `cqn` of `1 << shift` 64-byte CQEs on CEQ 0.
fn bench_with_cq(cqn: u32, shift: u8) -> Bench {
    let mut bench = bench();
    bench
        .device
        .create_cq(cqn, cqc(cqn, shift, CqeSize::Bytes64, 0))
        .expect("CQ created");
    bench
}

/// A successful receive CQE of QP `qpn`, WQE `index`.
fn cqe(qpn: u32, index: u16) -> Cqe {
    let mut c = Cqe::zeroed();
    c.set_receive_side(true);
    c.set_local_qp_number(qpn);
    c.set_wqe_index(index);
    c.set_byte_count(64);
    c
}

/// The 64-byte CQE at ring slot `slot` of CQ `cqn`.
fn read_cqe(bench: &Bench, cqn: u32, slot: u64) -> Cqe {
    Cqe::parse(&bench.read(cqe_buffer(cqn) + 64 * slot, 64)).unwrap()
}

/// CEQEs written to CEQ 0 so far.
fn ceq_entries(bench: &mut Bench) -> u32 {
    bench
        .device
        .query_eq(0, crate::eq::EqKind::Completion)
        .unwrap()
        .producer_index()
}

/// AEQEs written so far.
fn aeq_entries(bench: &mut Bench) -> u32 {
    let aeqn = bench.aeqn();
    bench
        .device
        .query_eq(aeqn, crate::eq::EqKind::Async)
        .unwrap()
        .producer_index()
}

#[test]
fn create_cq_refuses_a_context_for_another_cqn_and_starts_with_zero_indices() {
    let mut bench = bench();
    let mut context = cqc(0, 6, CqeSize::Bytes64, 0);
    context.set_cq_number(0x777);
    context.set_producer_index(5);
    context.set_consumer_index(9);
    let refused = bench.device.create_cq(3, context).unwrap_err();
    assert_eq!((refused.field, refused.value), ("CQN", 0x777));
    context.set_cq_number(3);
    bench.device.create_cq(3, context).unwrap();
    let stored = bench.cqc(3);
    assert_eq!(stored.cq_state(), Ok(CqState::Valid));
    assert_eq!(
        (
            stored.cq_number(),
            stored.producer_index(),
            stored.consumer_index(),
            stored.shift()
        ),
        (3, 0, 0, 6)
    );
    assert!(bench.device.cq_is_valid(3));
    assert!(!bench.device.cq_is_valid(4));
    assert_eq!(bench.device.query_cq(3), Ok(stored));
}

#[test]
fn create_cq_refuses_each_bad_input_with_the_exact_rejection() {
    let mut bench = bench();
    let num_cqs = bench.device.config.caps.num_cqs;
    let good = cqc(5, 4, CqeSize::Bytes64, 0);
    assert_eq!(
        bench.device.create_cq(num_cqs, good),
        Err(Rejection::index(num_cqs.into(), num_cqs.into()))
    );

    let with = |f: &dyn Fn(&mut Cqc)| {
        let mut c = good;
        f(&mut c);
        c
    };
    let cases = [
        (
            with(&|c| c.set_cq_state(CqState::Invalid)),
            Rejection::parameter("CQ_ST", 0, "1 (valid)"),
        ),
        (
            with(&|c| c.set_shift(23)),
            Rejection::parameter(
                "SHIFT",
                23,
                "at most 22 (the CQ depth limit 4194304 from the capabilities)",
            ),
        ),
        (
            with(&|c| c.set_ceq_number(1)),
            Rejection::parameter("CEQN", 1, "a created CEQ below 4 (CREATE_CEQC first)"),
        ),
        (
            with(&|c| c.set_cqe_size_raw(2)),
            Rejection::parameter("CQE_SIZE", 2, "0 (32-byte CQEs) or 1 (64-byte CQEs)"),
        ),
        (
            with(&|c| c.set_cqe_ba_page_size(10)),
            Rejection::parameter("CQE_BAR_PG_SZ", 10, "0..=9 (BT pages of 4 KiB..2 MiB)"),
        ),
        (
            with(&|c| c.set_cqe_base_address(0)),
            Rejection::parameter(
                "CQE_BA",
                0,
                "a usable CQE buffer: MTR root address is 0: the context carries no buffer address",
            ),
        ),
        (
            with(&|c| c.set_cqe_base_address(0x40_0040 >> 3)),
            Rejection::parameter(
                "CQE_BA",
                0x40_0040,
                "a usable CQE buffer: MTR root 0x400040 is not aligned to 4096 bytes (direct mode)",
            ),
        ),
        (
            with(&|c| c.set_arm_state_raw(1)),
            Rejection::parameter("ARM_ST", 1, "0 (not armed; 2 and 3 are set by the arm doorbell)"),
        ),
        (
            with(&|c| {
                c.set_record_enable(true);
                c.set_record_address(RECORDS + 2);
            }),
            Rejection::parameter(
                "CQE_DB_RECORD_ADDR",
                RECORDS + 2,
                "a non-zero, 4-byte aligned record address",
            ),
        ),
    ];
    for (context, rejection) in cases {
        assert_eq!(bench.device.create_cq(5, context), Err(rejection));
    }
    assert_eq!(bench.cqc(5), Cqc::zeroed(), "a refused create writes nothing");

    bench.device.create_cq(5, good).unwrap();
    assert_eq!(
        bench.device.create_cq(5, good),
        Err(Rejection::state("CQ_ST", 1, "CQ 0x5 not in use (destroy it first)"))
    );
}

#[test]
fn create_cq_without_a_cqc_table_entry_is_refused() {
    let mut bench = bench();
    // CQ 1024 is in L0 slot 1, which the bench never wrote.
    let rejection = bench
        .device
        .create_cq(1024, cqc(1024, 4, CqeSize::Bytes64, 0))
        .unwrap_err();
    assert_eq!(rejection.status, MailboxCompletion::NoContextTable);
}

#[test]
fn cqes_wrap_the_ring_with_the_owner_bit_flipping_each_lap() {
    let mut bench = bench_with_cq(2, 2); // 4 CQEs
    for index in 0..4 {
        bench.device.post_cqe(2, cqe(0x11, index), false).unwrap();
    }
    for slot in 0..4 {
        let c = read_cqe(&bench, 2, slot);
        assert_eq!(
            (c.wqe_index(), c.local_qp_number(), c.byte_count()),
            (slot as u16, 0x11, 64)
        );
        assert!(c.owner(), "lap 0");
        assert!(cqe_is_valid(c.owner(), slot as u32, 4));
    }
    assert_eq!(bench.cqc(2).producer_index(), 4);

    // The driver polled all four and publishes CI 4 with the set-CI doorbell.
    bench.cq_doorbell(CqDoorbell::update(2, 4));
    assert_eq!(bench.cqc(2).consumer_index(), 4);
    bench.device.post_cqe(2, cqe(0x11, 4), false).unwrap();
    bench.device.post_cqe(2, cqe(0x11, 5), false).unwrap();
    let lap1 = read_cqe(&bench, 2, 0);
    assert_eq!((lap1.wqe_index(), lap1.owner()), (4, false));
    assert!(cqe_is_valid(lap1.owner(), 4, 4));
    assert!(cqe_is_valid(read_cqe(&bench, 2, 1).owner(), 5, 4));
    assert!(
        !cqe_is_valid(read_cqe(&bench, 2, 2).owner(), 6, 4),
        "slot 2 still holds lap 0"
    );
    assert_eq!(bench.cqc(2).producer_index(), 6);
    assert_eq!(bench.device.counters().cqes, 6);
    assert_eq!(bench.device.counters().doorbells, 1);
}

#[test]
fn a_32_byte_cq_writes_the_first_half_of_each_cqe_at_a_32_byte_stride() {
    let mut bench = bench();
    bench.write(cqe_buffer(1), &[0xAA; 96]);
    bench.device.create_cq(1, cqc(1, 3, CqeSize::Bytes32, 0)).unwrap();
    let mut c = cqe(7, 1);
    c.set_inline_payload(&[0x55; 32]);
    bench.device.post_cqe(1, c, false).unwrap();
    bench.device.post_cqe(1, cqe(7, 2), false).unwrap();
    let first = bench.read(cqe_buffer(1), 32);
    assert_eq!(Cqe::parse_32(&first).unwrap().wqe_index(), 1);
    assert_eq!(first[3..], c.bytes()[3..32], "bytes after OWNER/STATUS are the CQE's");
    assert_eq!(
        Cqe::parse_32(&bench.read(cqe_buffer(1) + 32, 32)).unwrap().wqe_index(),
        2
    );
    assert_eq!(bench.read(cqe_buffer(1) + 64, 32), [0xAA; 32], "slot 2 untouched");
}

#[test]
fn a_full_cq_drops_the_cqe_goes_to_overflow_and_posts_cq_overflow() {
    let mut bench = bench_with_cq(6, 1); // 2 CQEs
    bench.device.post_cqe(6, cqe(1, 0), false).unwrap();
    bench.device.post_cqe(6, cqe(1, 1), false).unwrap();
    assert_eq!(
        bench.device.post_cqe(6, cqe(1, 2), false),
        Err(CqError::Overflow { cqn: 6, depth: 2 })
    );
    assert_eq!(bench.cqc(6).cq_state(), Ok(CqState::Overflow));
    assert_eq!(bench.cqc(6).producer_index(), 2);
    let e = bench.aeqe(0);
    assert_eq!((e.event_type(), e.queue_number(), e.owner()), (0x0C, 6, true));
    assert_eq!(
        read_cqe(&bench, 6, 0).wqe_index(),
        0,
        "the dropped CQE overwrote nothing"
    );

    assert_eq!(
        bench.device.post_cqe(6, cqe(1, 3), false),
        Err(CqError::Broken { cqn: 6, state: 2 })
    );
    assert_eq!(aeq_entries(&mut bench), 1, "reported once");
    assert!(!bench.device.cq_is_valid(6));
    // Destroy and re-create brings it back.
    bench.device.destroy_cq(6).unwrap();
    bench.device.create_cq(6, cqc(6, 1, CqeSize::Bytes64, 0)).unwrap();
    bench.device.post_cqe(6, cqe(1, 4), false).unwrap();
}

#[test]
fn over_ignore_drops_without_an_event_or_a_state_change() {
    let mut bench = bench();
    let mut context = cqc(6, 1, CqeSize::Bytes64, 0);
    context.set_overflow_ignore(true);
    bench.device.create_cq(6, context).unwrap();
    for index in 0..2 {
        bench.device.post_cqe(6, cqe(1, index), false).unwrap();
    }
    assert_eq!(
        bench.device.post_cqe(6, cqe(1, 2), false),
        Err(CqError::Overflow { cqn: 6, depth: 2 })
    );
    assert_eq!(bench.cqc(6).cq_state(), Ok(CqState::Valid));
    assert_eq!(aeq_entries(&mut bench), 0);
}

#[test]
fn with_a_record_doorbell_the_consumer_index_is_read_from_host_memory() {
    let mut bench = bench();
    let mut context = cqc(4, 1, CqeSize::Bytes64, 0);
    context.set_record_enable(true);
    context.set_record_address(RECORDS + 8);
    bench.device.create_cq(4, context).unwrap();
    bench.device.post_cqe(4, cqe(1, 0), false).unwrap();
    bench.device.post_cqe(4, cqe(1, 1), false).unwrap();
    // Software polled one CQE and wrote its CI (24 bits; high bits are ignored).
    bench.write(RECORDS + 8, &0xFF00_0001u32.to_le_bytes());
    bench.device.post_cqe(4, cqe(1, 2), false).unwrap();
    assert_eq!(
        (read_cqe(&bench, 4, 0).wqe_index(), read_cqe(&bench, 4, 0).owner()),
        (2, false)
    );
    assert_eq!(
        bench.device.post_cqe(4, cqe(1, 3), false),
        Err(CqError::Overflow { cqn: 4, depth: 2 })
    );
}

#[test]
fn arm_next_posts_one_ceqe_for_the_next_completion_then_disarms() {
    let mut bench = bench_with_cq(9, 4);
    bench.enable_interrupt(0);
    bench.cq_doorbell(CqDoorbell::arm(9, 0, 1, false));
    assert_eq!(bench.cqc(9).arm_state(), Ok(CqArmState::NextCompletion));
    assert_eq!(bench.cqc(9).command_sequence_number(), 1);
    assert_eq!(ceq_entries(&mut bench), 0);

    bench.device.post_cqe(9, cqe(1, 0), false).unwrap();
    let e = bench.ceqe(0, 0);
    assert_eq!((e.cq_number(), e.owner()), (9, true));
    assert_eq!(bench.cqc(9).arm_state(), Ok(CqArmState::NoArmed));
    assert_eq!(bench.interrupts_on(bench.device.eq_vector(0)), 1);

    bench.device.post_cqe(9, cqe(1, 1), false).unwrap();
    assert_eq!(ceq_entries(&mut bench), 1, "disarmed: no second CEQE");
}

#[test]
fn arm_solicited_waits_for_a_solicited_or_failed_completion() {
    let mut bench = bench_with_cq(9, 4);
    bench.cq_doorbell(CqDoorbell::arm(9, 0, 1, true));
    assert_eq!(bench.cqc(9).arm_state(), Ok(CqArmState::NextSolicited));
    bench.device.post_cqe(9, cqe(1, 0), false).unwrap();
    assert_eq!(ceq_entries(&mut bench), 0, "an unsolicited success does not notify");
    bench.device.post_cqe(9, cqe(1, 1), true).unwrap();
    assert_eq!(ceq_entries(&mut bench), 1);
    assert_eq!(bench.cqc(9).arm_state(), Ok(CqArmState::NoArmed));

    bench.cq_doorbell(CqDoorbell::arm(9, 2, 2, true));
    let mut failed = cqe(1, 2);
    failed.set_status(CqeStatus::RemoteAccessErr.into());
    bench.device.post_cqe(9, failed, false).unwrap();
    assert_eq!(
        ceq_entries(&mut bench),
        2,
        "an error completion notifies a solicited arm"
    );
    assert_eq!(bench.ceqe(0, 1).cq_number(), 9);
}

#[test]
fn arming_next_behind_the_producer_notifies_at_once() {
    let mut bench = bench_with_cq(9, 4);
    bench.device.post_cqe(9, cqe(1, 0), false).unwrap();
    // Arm-solicited with that CQE outstanding: nothing yet.
    bench.cq_doorbell(CqDoorbell::arm(9, 0, 1, true));
    assert_eq!(ceq_entries(&mut bench), 0);
    // Arm-next with CI 0 while PI is 1: the CQE is already there, so the CEQE comes now.
    bench.cq_doorbell(CqDoorbell::arm(9, 0, 2, false));
    assert_eq!(ceq_entries(&mut bench), 1);
    assert_eq!(bench.cqc(9).arm_state(), Ok(CqArmState::NoArmed));
    // Arm-next with the CI caught up: armed, quiet. User space masks the arm CI with
    // 2 × depth − 1; 33 ≡ 1 modulo 32.
    bench.cq_doorbell(CqDoorbell::arm(9, 33, 3, false));
    assert_eq!(ceq_entries(&mut bench), 1);
    assert_eq!(bench.cqc(9).arm_state(), Ok(CqArmState::NextCompletion));
    assert_eq!(bench.device.counters().doorbells, 3);
}

#[test]
fn a_doorbell_for_an_unknown_cq_is_dropped_and_reported_as_cq_id_invalid() {
    let mut bench = bench();
    bench.cq_doorbell(CqDoorbell::arm(0x21, 0, 1, false));
    let e = bench.aeqe(0);
    assert_eq!(
        (e.event_type(), e.sub_type(), e.queue_number(), e.owner()),
        (0x0D, 0, 0x21, true)
    );
    let counters = bench.device.counters();
    assert_eq!((counters.doorbells, counters.doorbells_dropped), (0, 1));
    let d = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!(
        (d.source, d.object.as_str(), d.field, d.value),
        (Source::Doorbell, "CQ 0x21", "TAG", 0x21)
    );

    // Beyond the table too (the tag is 24 bits).
    bench.cq_doorbell(CqDoorbell::update(0xFF_FFFF, 0));
    assert_eq!(bench.aeqe(1).queue_number(), 0xFF_FFFF);
    assert_eq!(bench.device.counters().doorbells_dropped, 2);
}

#[test]
fn a_set_ci_doorbell_beyond_the_producer_index_is_dropped() {
    let mut bench = bench_with_cq(3, 2);
    bench.device.post_cqe(3, cqe(1, 0), false).unwrap();
    bench.cq_doorbell(CqDoorbell::update(3, 2));
    let d = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!((d.field, d.value), ("CQ_CI", 2));
    assert_eq!(
        d.expected,
        "a consumer index from the current 0x0 up to the producer index 0x1"
    );
    assert_eq!(bench.cqc(3).consumer_index(), 0);
    assert_eq!(bench.device.counters().doorbells_dropped, 1);
    assert_eq!(aeq_entries(&mut bench), 0, "the CQ exists: no CQ_ID_INVALID");
}

#[test]
fn a_completion_for_a_cq_that_does_not_exist_posts_cq_id_invalid() {
    let mut bench = bench();
    assert_eq!(
        bench.device.post_cqe(8, cqe(0x30, 0), false),
        Err(CqError::Invalid { cqn: 8 })
    );
    let e = bench.aeqe(0);
    assert_eq!((e.event_type(), e.queue_number()), (0x0D, 8));
    assert_eq!(bench.device.counters().cqes, 0);
    let d = bench.device.diagnostics().last().unwrap().clone();
    assert_eq!(
        (d.source, d.object.as_str(), d.field),
        (Source::CompletionQueue, "CQ 0x8", "CQ_ST")
    );
}

#[test]
fn an_unreachable_cqe_buffer_is_a_cq_access_error() {
    let mut bench = bench();
    let mut context = cqc(2, 2, CqeSize::Bytes64, 0);
    context.set_cqe_base_address(0x7000_0000 >> 3);
    bench.device.create_cq(2, context).unwrap();
    let error = bench.device.post_cqe(2, cqe(1, 0), false).unwrap_err();
    assert!(matches!(error, CqError::Access { cqn: 2, .. }), "{error:?}");
    assert_eq!(bench.cqc(2).cq_state(), Ok(CqState::Failure));
    assert_eq!(bench.cqc(2).producer_index(), 0);
    let e = bench.aeqe(0);
    assert_eq!((e.event_type(), e.queue_number()), (0x0B, 2));
}

#[test]
fn a_multi_hop_cqe_buffer_is_translated_through_its_bt_page() {
    let mut bench = bench();
    // 128 × 64 B = two 4 KiB pages, listed in reverse order by a root BT page.
    bench.map(0x60_0000, 4096);
    bench.map(0x61_0000, 8192);
    bench.write(0x60_0000, &0x61_1000u64.to_le_bytes());
    bench.write(0x60_0008, &0x61_0000u64.to_le_bytes());
    let mut context = cqc(7, 7, CqeSize::Bytes64, 0);
    context.set_cqe_base_address(0x60_0000 >> 3);
    context.set_cqe_hop_number(1);
    bench.device.create_cq(7, context).unwrap();
    for index in 0..65 {
        bench.device.post_cqe(7, cqe(1, index), false).unwrap();
    }
    let at = |address: u64| Cqe::parse(&bench.read(address, 64)).unwrap().wqe_index();
    assert_eq!(at(0x61_1000), 0);
    assert_eq!(at(0x61_1FC0), 63);
    assert_eq!(at(0x61_0000), 64);
}

#[test]
fn modify_cq_changes_only_the_moderation_fields() {
    let mut bench = bench_with_cq(1, 4);
    let mut mask = Cqc::all_ones();
    mask.open_field(Cqc::CQ_MAX_CNT);
    mask.open_field(Cqc::CQ_PERIOD);
    let mut new = Cqc::zeroed();
    new.set_moderation_count(16);
    new.set_moderation_period(10);
    bench.device.modify_cq(1, new, mask).unwrap();
    let stored = bench.cqc(1);
    assert_eq!(
        (stored.moderation_count(), stored.moderation_period(), stored.shift()),
        (16, 10, 4)
    );

    let mut mask = Cqc::all_ones();
    mask.open_field(Cqc::CEQN);
    let mut new = Cqc::zeroed();
    new.set_ceq_number(2);
    assert_eq!(
        bench.device.modify_cq(1, new, mask),
        Err(Rejection::parameter(
            "CEQN",
            2,
            "the current value 0x0: MODIFY_CQC changes only CQ_MAX_CNT, CQ_PERIOD"
        ))
    );
}

#[test]
fn destroy_cq_invalidates_the_context_in_host_memory() {
    let mut bench = bench_with_cq(1, 4);
    bench.device.destroy_cq(1).unwrap();
    assert_eq!(bench.cqc(1).cq_state(), Ok(CqState::Invalid));
    assert!(!bench.device.cq_is_valid(1));
    let not_created = |what: &str| Rejection::state("CQ_ST", 0, format!("a created CQ 0x1 ({what})"));
    assert_eq!(bench.device.destroy_cq(1), Err(not_created("nothing to destroy")));
    assert_eq!(bench.device.query_cq(1), Err(not_created("CREATE_CQC first")));
    assert_eq!(
        bench.device.modify_cq(1, Cqc::zeroed(), Cqc::all_ones()),
        Err(not_created("CREATE_CQC first"))
    );
    // The number can be reused.
    bench.device.create_cq(1, cqc(1, 4, CqeSize::Bytes64, 0)).unwrap();
}

// ---- the CQC cache: host memory's copy is current whenever the driver can look ---------

/// The CQC of `cqn` exactly as host memory holds it now (no write-back first).
fn cqc_in_host_memory(bench: &Bench, cqn: u32) -> Cqc {
    Cqc::parse(&bench.read(CQC_TABLE + 64 * u64::from(cqn), 64)).expect("64 bytes")
}

#[test]
fn completions_reach_the_cqc_in_host_memory_before_a_mailbox_runs() {
    let mut bench = bench_with_cq(2, 3);
    for index in 0..5 {
        bench.device.post_cqe(2, cqe(0x11, index), false).unwrap();
    }
    // The firmware's mailbox step (nothing queued): the device writes back first.
    bench.device.complete_mailbox();
    assert_eq!(cqc_in_host_memory(&bench, 2).producer_index(), 5);
}

#[test]
fn a_function_reset_leaves_the_cached_progress_in_host_memory() {
    let mut bench = bench_with_cq(2, 3);
    for index in 0..3 {
        bench.device.post_cqe(2, cqe(0x11, index), false).unwrap();
    }
    bench
        .device
        .bar_write(regs::CONTROL_BAR, regs::FUNCTION_RESET, &1u32.to_le_bytes());
    assert_eq!(cqc_in_host_memory(&bench, 2).producer_index(), 3);
    assert!(
        bench.device.transport.io.qp.objects.contexts.cache_is_empty(),
        "a reset forgets every context"
    );
}

#[test]
fn turning_bus_mastering_off_writes_the_cached_cqc_back_first() {
    let mut bench = bench_with_cq(2, 3);
    for index in 0..3 {
        bench.device.post_cqe(2, cqe(0x11, index), false).unwrap();
    }
    bench.device.config_write(
        rnic_firmware_if::pci::offset::COMMAND,
        &COMMAND_MEMORY_SPACE.to_le_bytes(),
    );
    assert_eq!(cqc_in_host_memory(&bench, 2).producer_index(), 3);
    let error = bench.device.post_cqe(2, cqe(0x11, 3), false).unwrap_err();
    assert!(
        matches!(error, CqError::Context { cqn: 2, .. }),
        "no context without bus mastering, cached or not: {error:?}"
    );
}

#[test]
fn after_a_mailbox_the_device_reads_the_cqc_from_host_memory_again() {
    let mut bench = bench_with_cq(2, 3);
    bench.device.post_cqe(2, cqe(0x11, 0), false).unwrap();
    bench.device.complete_mailbox();
    // Cached again, and written through: host memory is as current as the cache.
    bench.device.post_cqe(2, cqe(0x11, 1), false).unwrap();
    assert_eq!(cqc_in_host_memory(&bench, 2).producer_index(), 2);
    // The driver tears the CQ down in host memory; the next mailbox makes the device look.
    let mut destroyed = cqc_in_host_memory(&bench, 2);
    destroyed.set_cq_state(CqState::Invalid);
    bench.write(CQC_TABLE + 64 * 2, destroyed.bytes());
    bench.device.complete_mailbox();
    let error = bench.device.post_cqe(2, cqe(0x11, 2), false).unwrap_err();
    assert!(matches!(error, CqError::Invalid { cqn: 2 }), "{error:?}");
}

#[test]
fn a_cqc_the_device_updated_since_the_last_mailbox_is_served_from_its_cache() {
    let mut bench = bench_with_cq(2, 3);
    for index in 0..3 {
        bench.device.post_cqe(2, cqe(0x11, index), false).unwrap();
    }
    // A set-CI doorbell sees the producer index of the completions just written.
    bench.cq_doorbell(CqDoorbell::update(2, 3));
    assert_eq!(
        bench.device.counters().doorbells,
        1,
        "CI 3 is not beyond the producer index"
    );
    assert_eq!(bench.cqc(2).consumer_index(), 3);
    assert_eq!(bench.cqc(2).producer_index(), 3);
}

#[test]
fn a_cq_created_again_with_another_cqe_buffer_gets_its_completions_there() {
    let mut bench = bench_with_cq(2, 3);
    bench.device.post_cqe(2, cqe(0x11, 0), false).unwrap();
    bench.device.post_cqe(2, cqe(0x11, 1), false).unwrap();
    bench.device.destroy_cq(2).unwrap();
    let mut context = cqc(2, 3, CqeSize::Bytes64, 0);
    context.set_cqe_base_address(cqe_buffer(5) >> 3);
    bench.device.create_cq(2, context).unwrap();
    bench.device.post_cqe(2, cqe(0x11, 7), false).unwrap();
    let moved = Cqe::parse(&bench.read(cqe_buffer(5), 64)).unwrap();
    assert_eq!(
        (moved.wqe_index(), moved.owner()),
        (7, true),
        "slot 0 of the new buffer"
    );
    assert_eq!(read_cqe(&bench, 2, 0).wqe_index(), 0, "the old buffer keeps its CQEs");
    assert_eq!(
        read_cqe(&bench, 2, 2),
        Cqe::zeroed(),
        "nothing more went to the old buffer"
    );
}
