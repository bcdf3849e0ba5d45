//! Record and replay of one device on the testbench's memory: the device's DMA reads
//! (the BT and MTT walks included) are recorded with the testbench's answers as inputs,
//! so the device alone replays from the recording, without callbacks or testbench, to the
//! same frames, DMA writes, MSI-X messages and read data; a replay that leaves the
//! recording reports the first differing event with both sides.

mod common;

use common::{bring_up_pair, run_linked, Driver, TestbenchMemory, CONFIG_B};
use rnic_vip::replay::{self, Event};
use rnic_vip::Session;

/// A recording of a device on testbench memory (its peer is not recorded): bring-up, an
/// armed CQ, an RDMA WRITE of 3000 bytes to the peer. Returns the recording's text and
/// the driver.
fn recorded_write() -> (String, Driver) {
    let memory = TestbenchMemory::new();
    let mut session = Session::new("", Some(Box::new(memory.clone()))).unwrap();
    session.start_recording().unwrap();
    let mut peer = Session::new(CONFIG_B, None).unwrap();
    let (mut driver, _) = bring_up_pair(&mut session, &mut peer);
    driver.write_wqe(&mut session, 0, 3000);
    driver.arm_cq(&mut session, 0);
    driver.ring_sq(&mut session, 0);
    run_linked(&mut session, &mut peer, |_| {}, |_, _| {});
    let events = session.recording().unwrap();
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
    assert!(
        count(|e| matches!(e, Event::DmaRead { .. })) > 30,
        "DMA reads recorded (44 today)"
    );
    assert!(
        count(|e| matches!(e, Event::DmaWrite { .. })) > 10,
        "DMA writes recorded (29 today)"
    );
    assert_eq!(count(|e| matches!(e, Event::FrameOut { .. })), 3, "the WRITE's frames");
    assert!(
        count(|e| matches!(e, Event::ReceiveFrame { .. })) >= 1,
        "the peer's ACK"
    );
    assert!(count(|e| matches!(e, Event::Msix { .. })) >= 1, "the CQ's interrupt");
    // The testbench saw every read the recording holds (and the backdoor accesses).
    assert!(memory.state().reads >= count(|e| matches!(e, Event::DmaRead { .. })));
    (session.recording_text().unwrap(), driver)
}

/// The index (among events) of the first line of `text` for which `pick` holds.
fn event_index(text: &str, pick: impl Fn(&str) -> bool) -> usize {
    text.lines().skip(1).position(pick).unwrap()
}

#[test]
fn a_device_on_the_testbenchs_memory_replays_alone_event_for_event() {
    let (text, _) = recorded_write();
    assert!(text.lines().next().unwrap().contains("\"testbench_memory\":true"));
    let events = text.lines().count() - 1;
    assert_eq!(replay::replay(&text).unwrap(), events);
}

#[test]
fn a_changed_dma_answer_shows_where_its_effect_first_differs() {
    let (text, driver) = recorded_write();
    // The payload as the testbench answered it: its first byte changed.
    let payload = format!("\"address\":{},", driver.data);
    let index = event_index(&text, |line| line.contains("\"dma_read\"") && line.contains(&payload));
    let line = text.lines().nth(index + 1).unwrap();
    let data_at = line.find("\"data\":\"").unwrap() + "\"data\":\"".len();
    let mut changed = line.to_string();
    changed.replace_range(data_at..data_at + 2, "ff");
    assert_ne!(changed, line);
    let tampered = text.replacen(line, &changed, 1);
    let error = replay::replay(&tampered).unwrap_err().to_string();
    // The first output the changed byte reaches: the first packet of the WRITE.
    assert!(error.contains("first divergence at event "), "{error}");
    assert!(error.contains("recorded {\"event\":\"frame_out\""), "{error}");
    let at: usize = error["mismatch: first divergence at event ".len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(at > index, "the divergence follows the changed input ({at} > {index})");
}

#[test]
fn a_replayed_device_that_reads_elsewhere_diverges_at_that_read() {
    let (text, driver) = recorded_write();
    // The recording claims the WQE was read 64 bytes further on.
    let wqe = format!("\"address\":{},", driver.qp);
    let index = event_index(&text, |line| line.contains("\"dma_read\"") && line.contains(&wqe));
    let line = text.lines().nth(index + 1).unwrap();
    let moved = line.replace(&wqe, &format!("\"address\":{},", driver.qp + 64));
    let tampered = text.replacen(line, &moved, 1);
    let error = replay::replay(&tampered).unwrap_err().to_string();
    let expected =
        format!("mismatch: first divergence at event {index}: recorded {moved}, replayed {{\"event\":\"dma_read\"");
    assert!(error.starts_with(&expected), "{error}\nexpected {expected}");
    assert!(
        error.contains(&format!("{wqe}\"length\":")),
        "the replay read the true address: {error}"
    );
    assert!(error.ends_with("\"data\":null}"), "and was refused: {error}");
}

#[test]
fn an_output_missing_from_the_recording_is_the_first_divergence() {
    let (text, _) = recorded_write();
    let lines: Vec<&str> = text.lines().collect();
    let last_msix = lines
        .iter()
        .rposition(|line| line.contains("\"event\":\"msix\""))
        .unwrap();
    let mut kept = lines.clone();
    kept.remove(last_msix);
    let error = replay::replay(&kept.join("\n")).unwrap_err().to_string();
    let expected = format!("mismatch: first divergence at event {}: recorded ", last_msix - 1);
    assert!(error.starts_with(&expected), "{error}");
    assert!(error.ends_with(&format!("replayed {}", lines[last_msix])), "{error}");
}
