//! The checker against a DUT: the model and a "DUT" (here a second model instance on the
//! testbench's memory, observed only as an RTL DUT would be — the frames at its port, the
//! writes on its bus, its MSI-X messages) run the same stimulus — bring-up, an armed CQ,
//! an RDMA WRITE of 4 KiB to a peer device — and every DUT output is notified to the
//! model's checker. A faithful DUT matches on every stream; a DUT that writes a wrong
//! CQE status is caught, with the stream, the CQ, the field and both values.

mod common;

use common::{bring_up_pair, run_linked, Driver, TestbenchMemory, CONFIG_B, CQN};
use rnic_hw_model::Picoseconds;
use rnic_vip::checker::{EventQueue, Mismatch, Stream, Streams};
use rnic_vip::Session;

const LENGTH: u32 = 4096;

/// What a DUT did, as its testbench saw it.
#[derive(Debug, Default)]
struct Observed {
    frames: Vec<(Picoseconds, Vec<u8>)>,
    writes: Vec<(Picoseconds, u64, Vec<u8>)>,
    msix: Vec<rnic_vip::MsixEvent>,
    driver: Driver,
}

/// Runs the stimulus on a DUT whose memory is `memory`.
fn run_dut(memory: TestbenchMemory) -> Observed {
    let mut dut = Session::new("", Some(Box::new(memory.clone()))).unwrap();
    let mut peer = Session::new(CONFIG_B, None).unwrap();
    let (mut driver, _) = bring_up_pair(&mut dut, &mut peer);
    driver.write_wqe(&mut dut, 0, LENGTH);
    while dut.poll_msix().is_some() {}
    memory.state().monitor = true;
    memory.state().clock = dut.now();
    driver.arm_cq(&mut dut, 0);
    driver.ring_sq(&mut dut, 0);
    let mut frames = Vec::new();
    run_linked(
        &mut dut,
        &mut peer,
        |time| memory.state().clock = time,
        |time, frame| frames.push((time, frame.to_vec())),
    );
    let msix = std::iter::from_fn(|| dut.poll_msix()).collect();
    let writes = std::mem::take(&mut memory.state().writes);
    Observed {
        frames,
        writes,
        msix,
        driver,
    }
}

/// The model on the same stimulus, checking `streams` of the DUT's outputs within
/// `tolerance`; returns every mismatch, the first divergence first.
fn check(dut: &Observed, streams: Streams, tolerance: Option<Picoseconds>) -> Vec<Mismatch> {
    check_counting(dut, streams, tolerance).0
}

/// [`check`], with the number of DUT outputs that matched.
fn check_counting(dut: &Observed, streams: Streams, tolerance: Option<Picoseconds>) -> (Vec<Mismatch>, u64) {
    let mut model = Session::new("", None).unwrap();
    let mut peer = Session::new(CONFIG_B, None).unwrap();
    let (mut driver, _) = bring_up_pair(&mut model, &mut peer);
    driver.write_wqe(&mut model, 0, LENGTH);
    while model.poll_msix().is_some() {}
    model.start_check_streams(streams, tolerance);
    driver.arm_cq(&mut model, 0);
    driver.ring_sq(&mut model, 0);
    run_linked(&mut model, &mut peer, |_| {}, |_, _| {});
    // The testbench's monitors: the CQE and the CEQE are the writes into their rings.
    let cq = dut.driver.cq..dut.driver.cq + 64 * 64;
    let ceq = dut.driver.ceq..dut.driver.ceq + 4096;
    if streams.contains(Stream::Cqe) {
        for (time, _, data) in dut.writes.iter().filter(|(_, a, _)| cq.contains(a)) {
            model.check_cqe(*time, CQN, data).unwrap();
        }
    }
    if streams.contains(Stream::Eqe) {
        for (time, _, data) in dut.writes.iter().filter(|(_, a, _)| ceq.contains(a)) {
            model.check_eqe(*time, EventQueue::Completion(0), data).unwrap();
        }
    }
    if streams.contains(Stream::DmaWrite) {
        for (time, address, data) in &dut.writes {
            model.check_dma_write(*time, *address, data).unwrap();
        }
    }
    if streams.contains(Stream::Frame) {
        for (time, frame) in &dut.frames {
            model.check_frame(*time, frame).unwrap();
        }
    }
    if streams.contains(Stream::Msix) {
        for event in &dut.msix {
            let message = event.message;
            model
                .check_msix(event.time, message.vector, message.address, message.data)
                .unwrap();
        }
    }
    let mismatches = model.finish_check().unwrap();
    (mismatches, model.checker().unwrap().matched())
}

#[test]
fn a_faithful_dut_matches_the_model_on_every_stream_to_the_picosecond() {
    let dut = run_dut(TestbenchMemory::new());
    assert_eq!(dut.frames.len(), 4, "4 WRITE packets of 1024 bytes");
    assert!(!dut.msix.is_empty(), "the armed CQ raised an interrupt");
    let cqes = dut.writes.iter().filter(|(_, a, _)| *a == dut.driver.cq).count();
    assert_eq!(cqes, 1, "one CQE");
    let (mismatches, matched) = check_counting(&dut, Streams::ALL, Some(Picoseconds(0)));
    assert!(mismatches.is_empty(), "{:#?}", &mismatches[..mismatches.len().min(5)]);
    // Every frame, DMA write (the CQE's and the CEQE's among them), CQE, CEQE and message.
    let ceqes = dut.writes.iter().filter(|(_, a, _)| *a == dut.driver.ceq).count();
    assert_eq!(ceqes, 1, "the armed CQ's CEQE");
    let outputs = dut.frames.len() + dut.writes.len() + 1 + ceqes + dut.msix.len();
    assert_eq!(matched, outputs as u64);
}

#[test]
fn a_dut_writing_a_wrong_cqe_status_is_caught_as_the_first_divergence() {
    let faithful = run_dut(TestbenchMemory::new());
    let cq = faithful.driver.cq;
    let memory = TestbenchMemory::new();
    // The broken DUT sets a bit of STATUS (byte 1) in the CQE it writes at slot 0.
    memory.state().corrupt = Some((cq, 1, 0x05));
    let broken = run_dut(memory);
    let mismatches = check(&broken, Streams(Stream::Cqe.bit() | Stream::Frame.bit()), None);
    assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
    assert_eq!(
        mismatches[0].to_string(),
        "CQE 0 (CQ 1 QP 8), field Cqe.STATUS: model 0x0, DUT 0x5"
    );
    // The same DUT checked on its bus: the CQE's write is where the bytes differ.
    let mismatches = check(&broken, Streams(Stream::DmaWrite.bit()), None);
    assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
    let first = &mismatches[0];
    assert_eq!(first.stream, Stream::DmaWrite);
    assert_eq!(first.queue.as_deref(), Some(format!("address {cq:#x}").as_str()));
    assert_eq!(
        (first.field.as_str(), first.expected.as_str(), first.actual.as_str()),
        ("data[1]", "0x00", "0x05")
    );
}

#[test]
fn a_dut_late_by_a_picosecond_fails_a_zero_window_and_passes_a_wider_one() {
    let mut dut = run_dut(TestbenchMemory::new());
    let last = dut.msix.last_mut().unwrap();
    last.time = Picoseconds(last.time.0 + 1);
    let mismatches = check(&dut, Streams(Stream::Msix.bit()), Some(Picoseconds(0)));
    assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
    assert_eq!(mismatches[0].field, "time");
    let mismatches = check(&dut, Streams(Stream::Msix.bit()), Some(Picoseconds(1)));
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

#[test]
fn outputs_the_dut_never_produced_are_reported_when_the_check_finishes() {
    let mut dut = run_dut(TestbenchMemory::new());
    let dropped = dut.frames.pop().unwrap();
    let mismatches = check(&dut, Streams::FRAMES, None);
    assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
    assert_eq!(mismatches[0].actual, "nothing");
    assert!(
        mismatches[0]
            .expected
            .ends_with(&format!("frame sent at {} ps", dropped.0 .0)),
        "{}",
        mismatches[0]
    );
}

#[test]
fn a_stream_the_check_was_not_started_with_is_refused() {
    let mut model = Session::new("", None).unwrap();
    assert!(
        model.check_cqe(Picoseconds(0), CQN, &[0; 64]).is_err(),
        "no check started"
    );
    model.start_check(None);
    let error = model.check_cqe(Picoseconds(0), CQN, &[0; 64]).unwrap_err();
    assert!(error.to_string().contains("without the CQE stream"), "{error}");
}
