//! The checker layer, ibex-cosim shaped, for the port: the model runs beside the DUT on
//! the same stimulus; the testbench notifies each frame the DUT transmitted; the checker
//! compares it with the frame the model transmitted for the same destination QP,
//! field by field, and accumulates mismatches with both sides' values. Frames of one QP
//! must come in the model's order; frames of different QPs may interleave in any order
//! (the specification orders packets per QP only). A time window bounds how far the DUT's
//! transmit time may be from the model's.
//!
//! DMA writes, CQEs/EQEs and MSI-X are not checked by this layer yet
//! (docs/guides/verification.md).

use std::collections::{BTreeMap, VecDeque};

use rnic_hw_model::Picoseconds;

use crate::codec;
use crate::session::FrameEvent;

/// One difference between the DUT and the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The DUT frame's number (0: the first the testbench notified); for a frame the DUT
    /// never sent, the number of frames notified when the check finished.
    pub frame: u64,
    /// The destination QP.
    pub qpn: Option<u32>,
    /// The field that differs (`bth.psn`, `payload`, `time`, `frame` for a whole frame).
    pub field: String,
    /// The model's value.
    pub expected: String,
    /// The DUT's value.
    pub actual: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let qp = self.qpn.map(|q| format!(" (QP {q})")).unwrap_or_default();
        write!(
            f,
            "frame {}{qp}, field {}: model {}, DUT {}",
            self.frame, self.field, self.expected, self.actual
        )
    }
}

/// Expected frames per QP and the mismatches found so far.
#[derive(Debug, Clone, Default)]
pub struct Checker {
    expected: BTreeMap<u32, VecDeque<FrameEvent>>,
    /// Frames the model sent that do not parse (the DUT must send the same bytes).
    expected_raw: VecDeque<FrameEvent>,
    tolerance: Option<Picoseconds>,
    notified: u64,
    matched: u64,
    mismatches: Vec<Mismatch>,
}

fn qpn_of(frame: &[u8]) -> Option<u32> {
    codec::decode(frame).ok()?.get("bth.dqpn").map(|q| q as u32)
}

impl Checker {
    /// A checker; `tolerance` bounds |DUT time − model time| (None: times not compared).
    pub fn new(tolerance: Option<Picoseconds>) -> Self {
        Self {
            tolerance,
            ..Self::default()
        }
    }

    /// The model transmitted `event`: the DUT must transmit it too.
    pub fn expect(&mut self, event: FrameEvent) {
        match qpn_of(&event.frame) {
            Some(qpn) => self.expected.entry(qpn).or_default().push_back(event),
            None => self.expected_raw.push_back(event),
        }
    }

    /// The DUT transmitted `frame` at `time`: compares it with the model's next frame for
    /// its QP. Returns the mismatch found, also kept for [`Checker::mismatches`].
    pub fn notify_frame(&mut self, time: Picoseconds, frame: &[u8]) -> Option<Mismatch> {
        let number = self.notified;
        self.notified += 1;
        let mismatch = |qpn, field: &str, expected: String, actual: String| Mismatch {
            frame: number,
            qpn,
            field: field.into(),
            expected,
            actual,
        };
        let found = match codec::decode(frame) {
            Err(error) => match self.expected_raw.pop_front() {
                Some(model) if model.frame == frame => None,
                _ => Some(mismatch(
                    None,
                    "frame",
                    "a frame that parses".into(),
                    format!("malformed: {error}"),
                )),
            },
            Ok(actual) => {
                let qpn = actual.get("bth.dqpn").map(|q| q as u32);
                match qpn
                    .and_then(|q| self.expected.get_mut(&q))
                    .and_then(VecDeque::pop_front)
                {
                    None => Some(mismatch(
                        qpn,
                        "frame",
                        "nothing".into(),
                        format!("a {} frame", actual.opcode_name),
                    )),
                    Some(model) => {
                        let expected = codec::decode(&model.frame).ok();
                        let difference = expected.as_ref().and_then(|e| codec::first_difference(e, &actual));
                        let late = self.tolerance.filter(|window| time.0.abs_diff(model.time.0) > window.0);
                        let show = |v: Option<u64>| v.map_or("absent".into(), |v| format!("{v:#x}"));
                        if let Some((field, model_value, dut_value)) = difference {
                            Some(mismatch(qpn, &field, show(model_value), show(dut_value)))
                        } else if late.is_some() {
                            Some(mismatch(
                                qpn,
                                "time",
                                format!("{} ps", model.time.0),
                                format!("{} ps", time.0),
                            ))
                        } else {
                            None
                        }
                    }
                }
            }
        };
        match &found {
            Some(found) => self.mismatches.push(found.clone()),
            None => self.matched += 1,
        }
        found
    }

    /// Ends the check: every frame the model sent and the DUT did not is a mismatch.
    /// Returns all mismatches.
    pub fn finish(&mut self) -> &[Mismatch] {
        let number = self.notified;
        let missing: Vec<FrameEvent> = std::mem::take(&mut self.expected)
            .into_values()
            .flatten()
            .chain(std::mem::take(&mut self.expected_raw))
            .collect();
        for model in missing {
            let name = codec::decode(&model.frame).map_or("malformed".into(), |d| d.opcode_name);
            self.mismatches.push(Mismatch {
                frame: number,
                qpn: qpn_of(&model.frame),
                field: "frame".into(),
                expected: format!("a {name} frame sent at {} ps", model.time.0),
                actual: "nothing".into(),
            });
        }
        &self.mismatches
    }

    /// Mismatches so far, the first divergence first.
    pub fn mismatches(&self) -> &[Mismatch] {
        &self.mismatches
    }

    /// DUT frames that matched the model's.
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
}
