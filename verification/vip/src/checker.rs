//! The checker layer, ibex-cosim shaped: the model runs beside the DUT on the same
//! stimulus; the testbench notifies what the DUT did — frames it transmitted, DMA writes,
//! CQEs and EQEs it wrote, MSI-X messages it raised, each with its time — and the checker
//! compares each with what the model did at that point, field by field, keeping every
//! mismatch with both sides' values; the first kept is the first divergence.
//!
//! Each [`Stream`] is ordered per queue, and queues may interleave in any order, where
//! the specification (or PCIe) allows reordering:
//!
//! | Stream | Ordered within | May interleave across |
//! |---|---|---|
//! | frames | a destination QP | QPs |
//! | DMA writes | one bus address | addresses |
//! | CQEs | a CQ and a local QP | QPs sharing the CQ, CQs |
//! | EQEs | a CEQ and a CQ; the AEQ | CQs sharing the CEQ, CEQs |
//! | MSI-X | a vector | vectors |
//!
//! A time window bounds how far the DUT's time may be from the model's.

use std::collections::{BTreeMap, VecDeque};

use rnic_firmware_if::bits::{Field, Layout};
use rnic_firmware_if::cqe::Cqe;
use rnic_firmware_if::eqe::{Aeqe, Ceqe};
use rnic_hw_model::Picoseconds;

use crate::codec;
use crate::session::{FrameEvent, MsixEvent};

/// What the DUT does that the checker can compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stream {
    /// Frames transmitted at the port.
    Frame,
    /// DMA writes to host memory (every one: payload, contexts, CQEs, EQEs…).
    DmaWrite,
    /// CQEs written (as the bytes in the CQ buffer, owner bit included).
    Cqe,
    /// EQEs written (CEQEs and AEQEs, owner bit included).
    Eqe,
    /// MSI-X messages raised.
    Msix,
}

impl Stream {
    /// Every stream.
    pub const ALL: [Stream; 5] = [Stream::Frame, Stream::DmaWrite, Stream::Cqe, Stream::Eqe, Stream::Msix];

    /// The stream's bit in a [`Streams`] set (and in the C ABI's `RNIC_VIP_CHECK_*`).
    pub const fn bit(self) -> u32 {
        1 << self as u32
    }

    /// The stream's name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Stream::Frame => "frame",
            Stream::DmaWrite => "DMA write",
            Stream::Cqe => "CQE",
            Stream::Eqe => "EQE",
            Stream::Msix => "MSI-X",
        }
    }
}

/// A set of streams (bit [`Stream::bit`] per stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Streams(pub u32);

impl Streams {
    /// Frames only (what [`Checker::new`] checks).
    pub const FRAMES: Streams = Streams(1);
    /// Every stream.
    pub const ALL: Streams = Streams(0x1f);

    /// Whether `stream` is in the set.
    pub const fn contains(self, stream: Stream) -> bool {
        self.0 & stream.bit() != 0
    }
}

/// The event queue an EQE is written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventQueue {
    /// Completion EQ `n`.
    Completion(u32),
    /// The asynchronous EQ.
    Async,
}

/// One difference between the DUT and the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// What was compared.
    pub stream: Stream,
    /// The DUT notification's number in its stream (0: the first the testbench notified);
    /// for an output the DUT never produced, the number notified when the check finished.
    pub index: u64,
    /// The destination QP (frames and CQEs, when known).
    pub qpn: Option<u32>,
    /// The queue the stream is ordered in (`QP 8`, `CQ 3 QP 8`, `CEQ 0 CQ 3`, `AEQ`,
    /// `vector 2`, `address 0x10000000`); None for a frame that does not parse.
    pub queue: Option<String>,
    /// The field that differs (`bth.psn`, `payload`, `Cqe.STATUS`, `data[5]`, `length`,
    /// `address`, `time`; `frame`/`entry` for a whole frame or entry).
    pub field: String,
    /// The model's value.
    pub expected: String,
    /// The DUT's value.
    pub actual: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = self.queue.as_ref().map(|q| format!(" ({q})")).unwrap_or_default();
        write!(
            f,
            "{} {}{queue}, field {}: model {}, DUT {}",
            self.stream.name(),
            self.index,
            self.field,
            self.expected,
            self.actual
        )
    }
}

/// An output of the model the DUT must produce too.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    time: Picoseconds,
    /// The frame, the bytes written, the entry, or the MSI-X address and data (12 bytes LE).
    bytes: Vec<u8>,
}

/// Expected outputs per stream and queue, and the mismatches found so far.
#[derive(Debug, Clone, Default)]
pub struct Checker {
    streams: Streams,
    /// Per stream and queue, the model's outputs not yet matched, oldest first.
    expected: BTreeMap<(Stream, String), VecDeque<Expected>>,
    tolerance: Option<Picoseconds>,
    notified: [u64; 5],
    matched: u64,
    mismatches: Vec<Mismatch>,
}

/// The queue of a frame: its destination QP; a frame that does not parse has none.
fn frame_queue(frame: &[u8]) -> Option<u32> {
    codec::decode(frame).ok()?.get("bth.dqpn").map(|q| q as u32)
}

const RAW_FRAMES: &str = "unparsed frames";

fn show(value: Option<u64>) -> String {
    value.map_or("absent".into(), |v| format!("{v:#x}"))
}

/// The first difference of two entries of `layout`: a field (those inside both), the
/// length, then a byte outside every field.
fn first_layout_difference(
    layout: &str,
    fields: &[Field],
    expected: &[u8],
    actual: &[u8],
) -> Option<(String, String, String)> {
    let common = expected.len().min(actual.len());
    for field in fields.iter().filter(|f| (f.hi / 8) < common as u32) {
        let (e, a) = (field.get(expected), field.get(actual));
        if e != a {
            return Some((format!("{layout}.{}", field.name), show(Some(e)), show(Some(a))));
        }
    }
    first_byte_difference(expected, actual)
}

/// The first difference of two byte strings: the length, then the first byte.
fn first_byte_difference(expected: &[u8], actual: &[u8]) -> Option<(String, String, String)> {
    if expected.len() != actual.len() {
        return Some(("length".into(), expected.len().to_string(), actual.len().to_string()));
    }
    let at = expected.iter().zip(actual).position(|(e, a)| e != a)?;
    Some((
        format!("data[{at}]"),
        format!("{:#04x}", expected[at]),
        format!("{:#04x}", actual[at]),
    ))
}

fn cqe_queue(cqn: u32, entry: &[u8]) -> String {
    format!("CQ {cqn} QP {}", Cqe::LCL_QPN.get(entry))
}

fn eqe_queue(queue: EventQueue, entry: &[u8]) -> String {
    match queue {
        EventQueue::Completion(ceqn) => format!("CEQ {ceqn} CQ {}", Ceqe::CQN.get(entry)),
        EventQueue::Async => "AEQ".into(),
    }
}

fn msix_bytes(address: u64, data: u32) -> Vec<u8> {
    let mut bytes = address.to_le_bytes().to_vec();
    bytes.extend_from_slice(&data.to_le_bytes());
    bytes
}

/// The first difference of a DUT output from the model's, by stream.
fn first_difference(stream: Stream, queue: &str, expected: &[u8], actual: &[u8]) -> Option<(String, String, String)> {
    match stream {
        Stream::Frame => {
            let (Ok(model), Ok(dut)) = (codec::decode(expected), codec::decode(actual)) else {
                return (expected != actual)
                    .then(|| ("frame".into(), "the model's bytes".into(), "other bytes".into()));
            };
            codec::first_difference(&model, &dut).map(|(field, e, a)| (field, show(e), show(a)))
        }
        Stream::DmaWrite => first_byte_difference(expected, actual),
        Stream::Cqe => first_layout_difference("Cqe", Cqe::FIELDS, expected, actual),
        Stream::Eqe if queue == "AEQ" => first_layout_difference("Aeqe", Aeqe::FIELDS, expected, actual),
        Stream::Eqe => first_layout_difference("Ceqe", Ceqe::FIELDS, expected, actual),
        Stream::Msix => {
            let word = |bytes: &[u8], range: std::ops::Range<usize>| {
                bytes
                    .get(range)
                    .map(|b| b.iter().rev().fold(0u64, |acc, x| acc << 8 | u64::from(*x)))
            };
            for (field, range) in [("address", 0..8), ("data", 8..12)] {
                let (e, a) = (word(expected, range.clone()), word(actual, range));
                if e != a {
                    return Some((field.into(), show(e), show(a)));
                }
            }
            None
        }
    }
}

/// What an output the DUT never produced was, for the report.
fn describe(stream: Stream, expected: &Expected) -> String {
    let at = expected.time.0;
    match stream {
        Stream::Frame => {
            let name = codec::decode(&expected.bytes).map_or("malformed".into(), |d| d.opcode_name);
            format!("a {name} frame sent at {at} ps")
        }
        Stream::DmaWrite => format!("{} bytes written at {at} ps", expected.bytes.len()),
        Stream::Cqe => format!(
            "a CQE (status {:#x}) written at {at} ps",
            Cqe::STATUS.get(&expected.bytes)
        ),
        Stream::Eqe => format!("an EQE written at {at} ps"),
        Stream::Msix => format!("a message raised at {at} ps"),
    }
}

impl Checker {
    /// A checker of transmitted frames; `tolerance` bounds |DUT time − model time| (None:
    /// times not compared).
    pub fn new(tolerance: Option<Picoseconds>) -> Self {
        Self::with_streams(Streams::FRAMES, tolerance)
    }

    /// A checker of `streams`; `tolerance` as for [`Checker::new`].
    pub fn with_streams(streams: Streams, tolerance: Option<Picoseconds>) -> Self {
        Self {
            streams,
            tolerance,
            ..Self::default()
        }
    }

    /// Whether `stream` is checked.
    pub fn checks(&self, stream: Stream) -> bool {
        self.streams.contains(stream)
    }

    fn push(&mut self, stream: Stream, queue: String, time: Picoseconds, bytes: Vec<u8>) {
        if self.checks(stream) {
            self.expected
                .entry((stream, queue))
                .or_default()
                .push_back(Expected { time, bytes });
        }
    }

    /// The model transmitted `event`: the DUT must transmit it too.
    pub fn expect(&mut self, event: FrameEvent) {
        let queue = frame_queue(&event.frame).map_or(RAW_FRAMES.into(), |q| format!("QP {q}"));
        self.push(Stream::Frame, queue, event.time, event.frame);
    }

    /// The model wrote `data` at bus address `address` at `time`.
    pub fn expect_dma_write(&mut self, time: Picoseconds, address: u64, data: &[u8]) {
        self.push(Stream::DmaWrite, format!("address {address:#x}"), time, data.to_vec());
    }

    /// The model wrote the CQE `entry` (as in the CQ buffer, 32 or 64 bytes) to CQ `cqn`.
    pub fn expect_cqe(&mut self, time: Picoseconds, cqn: u32, entry: &[u8]) {
        self.push(Stream::Cqe, cqe_queue(cqn, entry), time, entry.to_vec());
    }

    /// The model wrote the EQE `entry` (as in the EQ buffer) to `queue`.
    pub fn expect_eqe(&mut self, time: Picoseconds, queue: EventQueue, entry: &[u8]) {
        self.push(Stream::Eqe, eqe_queue(queue, entry), time, entry.to_vec());
    }

    /// The model raised `event`.
    pub fn expect_msix(&mut self, event: MsixEvent) {
        let bytes = msix_bytes(event.message.address, event.message.data);
        self.push(
            Stream::Msix,
            format!("vector {}", event.message.vector),
            event.time,
            bytes,
        );
    }

    /// Compares the DUT's output `actual` at `time` in `queue` of `stream` with the model's
    /// next output there; keeps and returns the mismatch.
    fn notify(
        &mut self,
        stream: Stream,
        queue: Option<String>,
        qpn: Option<u32>,
        time: Picoseconds,
        actual: &[u8],
        what: impl FnOnce() -> String,
    ) -> Option<Mismatch> {
        let counter = &mut self.notified[stream as usize];
        let index = *counter;
        *counter += 1;
        let mismatch = |field: &str, expected: String, actual: String| Mismatch {
            stream,
            index,
            qpn,
            queue: queue.clone(),
            field: field.into(),
            expected,
            actual,
        };
        let model = queue
            .clone()
            .and_then(|q| self.expected.get_mut(&(stream, q)))
            .and_then(VecDeque::pop_front);
        let found = match model {
            None => Some(mismatch(
                if stream == Stream::Frame { "frame" } else { "entry" },
                "nothing".into(),
                what(),
            )),
            Some(model) => {
                let queue_name = queue.as_deref().unwrap_or_default();
                if let Some((field, e, a)) = first_difference(stream, queue_name, &model.bytes, actual) {
                    Some(mismatch(&field, e, a))
                } else if self
                    .tolerance
                    .is_some_and(|window| time.0.abs_diff(model.time.0) > window.0)
                {
                    Some(mismatch(
                        "time",
                        format!("{} ps", model.time.0),
                        format!("{} ps", time.0),
                    ))
                } else {
                    None
                }
            }
        };
        match &found {
            Some(found) => self.mismatches.push(found.clone()),
            None => self.matched += 1,
        }
        found
    }

    /// The DUT transmitted `frame` at `time`: compares it with the model's next frame for
    /// its QP. Returns the mismatch found, also kept for [`Checker::mismatches`].
    pub fn notify_frame(&mut self, time: Picoseconds, frame: &[u8]) -> Option<Mismatch> {
        match codec::decode(frame) {
            Err(error) => {
                // A frame that does not parse names no QP: it can only be one of the model's
                // own unparsed frames, byte for byte.
                let raw = self.expected.get_mut(&(Stream::Frame, RAW_FRAMES.into()));
                if raw
                    .and_then(VecDeque::pop_front)
                    .is_some_and(|model| model.bytes == frame)
                {
                    self.notified[Stream::Frame as usize] += 1;
                    self.matched += 1;
                    return None;
                }
                let index = self.notified[Stream::Frame as usize];
                self.notified[Stream::Frame as usize] += 1;
                let found = Mismatch {
                    stream: Stream::Frame,
                    index,
                    qpn: None,
                    queue: None,
                    field: "frame".into(),
                    expected: "a frame that parses".into(),
                    actual: format!("malformed: {error}"),
                };
                self.mismatches.push(found.clone());
                Some(found)
            }
            Ok(decoded) => {
                let qpn = decoded.get("bth.dqpn").map(|q| q as u32);
                let queue = qpn.map(|q| format!("QP {q}"));
                self.notify(Stream::Frame, queue, qpn, time, frame, || {
                    format!("a {} frame", decoded.opcode_name)
                })
            }
        }
    }

    /// The DUT wrote `data` at bus address `address` at `time`.
    pub fn notify_dma_write(&mut self, time: Picoseconds, address: u64, data: &[u8]) -> Option<Mismatch> {
        let queue = Some(format!("address {address:#x}"));
        self.notify(Stream::DmaWrite, queue, None, time, data, || {
            format!("{} bytes written", data.len())
        })
    }

    /// The DUT wrote the CQE `entry` (32 or 64 bytes, as in the CQ buffer) to CQ `cqn`.
    pub fn notify_cqe(&mut self, time: Picoseconds, cqn: u32, entry: &[u8]) -> Option<Mismatch> {
        let qpn = Some(Cqe::LCL_QPN.get(entry) as u32);
        let queue = Some(cqe_queue(cqn, entry));
        self.notify(Stream::Cqe, queue, qpn, time, entry, || {
            format!("a CQE (status {:#x})", Cqe::STATUS.get(entry))
        })
    }

    /// The DUT wrote the EQE `entry` to `queue`.
    pub fn notify_eqe(&mut self, time: Picoseconds, queue: EventQueue, entry: &[u8]) -> Option<Mismatch> {
        let name = Some(eqe_queue(queue, entry));
        self.notify(Stream::Eqe, name, None, time, entry, || "an EQE".into())
    }

    /// The DUT raised MSI-X `vector` with `address` and `data` at `time`.
    pub fn notify_msix(&mut self, time: Picoseconds, vector: u16, address: u64, data: u32) -> Option<Mismatch> {
        let queue = Some(format!("vector {vector}"));
        let bytes = msix_bytes(address, data);
        self.notify(Stream::Msix, queue, None, time, &bytes, || format!("data {data:#x}"))
    }

    /// Ends the check: every output the model produced and the DUT did not is a
    /// mismatch. Returns all mismatches.
    pub fn finish(&mut self) -> &[Mismatch] {
        for ((stream, queue), missing) in std::mem::take(&mut self.expected) {
            for model in missing {
                let qpn = match stream {
                    Stream::Frame => frame_queue(&model.bytes),
                    Stream::Cqe => Some(Cqe::LCL_QPN.get(&model.bytes) as u32),
                    _ => None,
                };
                self.mismatches.push(Mismatch {
                    stream,
                    index: self.notified[stream as usize],
                    qpn,
                    queue: (queue != RAW_FRAMES).then(|| queue.clone()),
                    field: if stream == Stream::Frame { "frame" } else { "entry" }.into(),
                    expected: describe(stream, &model),
                    actual: "nothing".into(),
                });
            }
        }
        &self.mismatches
    }

    /// Mismatches so far, the first divergence first.
    pub fn mismatches(&self) -> &[Mismatch] {
        &self.mismatches
    }

    /// The first divergence, if any.
    pub fn first_divergence(&self) -> Option<&Mismatch> {
        self.mismatches.first()
    }

    /// DUT outputs that matched the model's.
    pub fn matched(&self) -> u64 {
        self.matched
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn frame(qpn: u64, psn: u64) -> Vec<u8> {
        let fields = BTreeMap::from([
            ("bth.opcode".to_string(), 0x04),
            ("bth.dqpn".to_string(), qpn),
            ("bth.psn".to_string(), psn),
        ]);
        codec::encode(&fields, b"payload").unwrap()
    }

    fn event(time: u64, frame: Vec<u8>) -> FrameEvent {
        FrameEvent {
            time: Picoseconds(time),
            frame,
        }
    }

    #[test]
    fn frames_of_different_qps_may_interleave_but_one_qps_frames_keep_their_order() {
        let mut checker = Checker::new(None);
        for (qpn, psn) in [(8, 1), (8, 2), (9, 1)] {
            checker.expect(event(0, frame(qpn, psn)));
        }
        assert_eq!(checker.notify_frame(Picoseconds(0), &frame(9, 1)), None);
        let swapped = checker.notify_frame(Picoseconds(0), &frame(8, 2)).unwrap();
        assert_eq!(swapped.to_string(), "frame 1 (QP 8), field bth.psn: model 0x1, DUT 0x2");
        assert_eq!(checker.matched(), 1);
    }

    #[test]
    fn a_changed_payload_byte_and_a_late_frame_are_mismatches() {
        let mut checker = Checker::new(Some(Picoseconds(1_000)));
        checker.expect(event(10_000, frame(8, 1)));
        checker.expect(event(20_000, frame(8, 2)));
        let mut corrupted = frame(8, 1);
        let at = corrupted.len() - 6; // inside the payload (before the ICRC)
        corrupted[at] ^= 1;
        // The ICRC no longer matches: the DUT's frame is malformed.
        let bad = checker.notify_frame(Picoseconds(10_000), &corrupted).unwrap();
        assert_eq!(bad.field, "frame");
        assert!(bad.actual.starts_with("malformed"), "{bad}");
        // A frame that does not parse names no QP: the model's frame is still expected.
        assert_eq!(checker.notify_frame(Picoseconds(10_500), &frame(8, 1)), None);
        let late = checker.notify_frame(Picoseconds(21_001), &frame(8, 2)).unwrap();
        assert_eq!(
            late.to_string(),
            "frame 2 (QP 8), field time: model 20000 ps, DUT 21001 ps"
        );
    }

    #[test]
    fn unexpected_and_missing_frames_are_reported_and_the_first_divergence_comes_first() {
        let mut checker = Checker::new(None);
        checker.expect(event(5, frame(8, 1)));
        checker.expect(event(6, frame(8, 2)));
        let unexpected = checker.notify_frame(Picoseconds(0), &frame(10, 1)).unwrap();
        assert_eq!(
            unexpected.to_string(),
            "frame 0 (QP 10), field frame: model nothing, DUT a RC_SEND_ONLY frame"
        );
        assert_eq!(checker.notify_frame(Picoseconds(5), &frame(8, 1)), None);
        let all = checker.finish();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], unexpected);
        assert_eq!(
            all[1].to_string(),
            "frame 2 (QP 8), field frame: model a RC_SEND_ONLY frame sent at 6 ps, DUT nothing"
        );
    }

    fn cqe(qpn: u32, status: u8, owner: bool) -> Vec<u8> {
        let mut entry = Cqe::zeroed();
        entry.set_local_qp_number(qpn);
        entry.set_status(status);
        entry.set_owner(owner);
        entry.bytes().to_vec()
    }

    #[test]
    fn a_cqe_with_a_wrong_status_is_caught_with_the_field_and_both_values() {
        let mut checker = Checker::with_streams(Streams(Stream::Cqe.bit()), None);
        checker.expect_cqe(Picoseconds(100), 3, &cqe(8, 0, true));
        let wrong = checker.notify_cqe(Picoseconds(100), 3, &cqe(8, 5, true)).unwrap();
        assert_eq!(
            wrong.to_string(),
            "CQE 0 (CQ 3 QP 8), field Cqe.STATUS: model 0x0, DUT 0x5"
        );
        assert_eq!(checker.first_divergence(), Some(&wrong));
        assert_eq!(wrong.qpn, Some(8));
    }

    #[test]
    fn cqes_of_different_qps_on_one_cq_may_interleave_but_one_qps_keep_their_order() {
        let mut checker = Checker::with_streams(Streams(Stream::Cqe.bit()), None);
        checker.expect_cqe(Picoseconds(0), 3, &cqe(8, 0, true));
        checker.expect_cqe(Picoseconds(0), 3, &cqe(8, 4, true));
        checker.expect_cqe(Picoseconds(0), 3, &cqe(9, 0, true));
        assert_eq!(checker.notify_cqe(Picoseconds(0), 3, &cqe(9, 0, true)), None);
        let swapped = checker.notify_cqe(Picoseconds(0), 3, &cqe(8, 4, true)).unwrap();
        assert_eq!(swapped.field, "Cqe.STATUS");
        // The owner bit is part of the entry: a DUT that gets the lap wrong is caught.
        let owner = checker.notify_cqe(Picoseconds(0), 3, &cqe(8, 0, false)).unwrap();
        assert_eq!(
            owner.to_string(),
            "CQE 2 (CQ 3 QP 8), field Cqe.OWNER: model 0x1, DUT 0x0"
        );
        // A CQE for a CQ the model wrote nothing to.
        let stray = checker.notify_cqe(Picoseconds(0), 4, &cqe(8, 0, true)).unwrap();
        assert_eq!(stray.field, "entry");
        assert_eq!(checker.matched(), 1);
    }

    #[test]
    fn dma_writes_are_matched_per_address_and_compared_byte_for_byte() {
        let mut checker = Checker::with_streams(Streams(Stream::DmaWrite.bit()), Some(Picoseconds(50)));
        checker.expect_dma_write(Picoseconds(1_000), 0x1000, &[1, 2, 3, 4]);
        checker.expect_dma_write(Picoseconds(1_000), 0x2000, &[5, 6]);
        checker.expect_dma_write(Picoseconds(1_200), 0x3000, &[7]);
        // Other addresses first: allowed.
        assert_eq!(checker.notify_dma_write(Picoseconds(1_010), 0x2000, &[5, 6]), None);
        let byte = checker
            .notify_dma_write(Picoseconds(1_000), 0x1000, &[1, 2, 9, 4])
            .unwrap();
        assert_eq!(
            byte.to_string(),
            "DMA write 1 (address 0x1000), field data[2]: model 0x03, DUT 0x09"
        );
        let late = checker.notify_dma_write(Picoseconds(1_300), 0x3000, &[7]).unwrap();
        assert_eq!(
            late.to_string(),
            "DMA write 2 (address 0x3000), field time: model 1200 ps, DUT 1300 ps"
        );
        checker.expect_dma_write(Picoseconds(2_000), 0x4000, &[0; 8]);
        let short = checker.notify_dma_write(Picoseconds(2_000), 0x4000, &[0; 4]).unwrap();
        assert_eq!(
            (short.field.as_str(), short.expected.as_str(), short.actual.as_str()),
            ("length", "8", "4")
        );
    }

    #[test]
    fn eqes_and_msix_messages_are_checked_per_queue_and_vector() {
        let mut checker = Checker::with_streams(Streams(Stream::Eqe.bit() | Stream::Msix.bit()), None);
        let ceqe = |cqn: u32| {
            let mut entry = Ceqe::zeroed();
            entry.set_cq_number(cqn);
            entry.set_owner(true);
            entry.bytes().to_vec()
        };
        let mut aeqe = Aeqe::zeroed();
        aeqe.set_event_type(0x0a);
        aeqe.set_queue_number(8);
        checker.expect_eqe(Picoseconds(0), EventQueue::Completion(0), &ceqe(3));
        checker.expect_eqe(Picoseconds(0), EventQueue::Completion(0), &ceqe(4));
        checker.expect_eqe(Picoseconds(0), EventQueue::Async, aeqe.bytes());
        checker.expect_msix(MsixEvent {
            time: Picoseconds(0),
            message: rnic_hw_model::interrupt::MsixMessage {
                vector: 1,
                address: 0xfee0_0000,
                data: 0x41,
            },
        });
        assert_eq!(
            checker.notify_eqe(Picoseconds(0), EventQueue::Completion(0), &ceqe(4)),
            None
        );
        assert_eq!(
            checker.notify_eqe(Picoseconds(0), EventQueue::Completion(0), &ceqe(3)),
            None
        );
        let mut wrong = aeqe;
        wrong.set_queue_number(9);
        let event = checker
            .notify_eqe(Picoseconds(0), EventQueue::Async, wrong.bytes())
            .unwrap();
        assert_eq!(
            event.to_string(),
            "EQE 2 (AEQ), field Aeqe.EVENT_QUEUE_NUM: model 0x8, DUT 0x9"
        );
        let message = checker.notify_msix(Picoseconds(0), 1, 0xfee0_0000, 0x42).unwrap();
        assert_eq!(
            message.to_string(),
            "MSI-X 0 (vector 1), field data: model 0x41, DUT 0x42"
        );
        assert_eq!(checker.finish().len(), 2, "nothing is missing");
    }

    #[test]
    fn outputs_of_streams_not_checked_are_not_expected() {
        let mut checker = Checker::new(None);
        assert!(checker.checks(Stream::Frame) && !checker.checks(Stream::Cqe));
        checker.expect_cqe(Picoseconds(0), 3, &cqe(8, 0, true));
        checker.expect_dma_write(Picoseconds(0), 0x1000, &[1]);
        assert!(checker.finish().is_empty());
    }
}
