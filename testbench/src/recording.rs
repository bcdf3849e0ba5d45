//! Record and replay of an `rnic-bench` run, faulty wire included: the recording is the
//! run's configuration (the seeded fault plan with it) followed by every frame each NIC
//! sent and received, every CQE each NIC's completion port handed to its CQ block, with
//! their virtual times, and the report's JSON. A replay runs the same configuration again
//! and compares line by line: the first line that differs is reported with both sides.
//!
//! The outputs are taken at the devices' ports (observers: they watch, the run is the
//! same with or without them). What this replays is the whole system — both NICs, the
//! verbs driver and the seeded wire — from its one input, the configuration; it is not a
//! recording of one device's inputs to replay that device alone (`rnic-vip replay` does
//! that for a verification session).

use std::sync::{Arc, Mutex};

use rnic_firmware_if::bits::Layout;
use rnic_hw_model::probe::{Observer, Port, Transaction};
use rnic_hw_model::{Device, Picoseconds};

use crate::bench::{BenchConfig, BenchReport};

/// The first line of a recording: its schema.
pub const SCHEMA: &str = "rnic-bench-recording/1";

/// Output lines of both NICs, in the order they happened.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recorder(Arc<Mutex<Vec<String>>>);

/// One NIC's observer, writing into the shared [`Recorder`].
struct NicRecorder {
    lines: Recorder,
    nic: &'static str,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Observer for NicRecorder {
    fn observe(&mut self, at: Picoseconds, transaction: &Transaction<'_>) {
        let nic = self.nic;
        let time = at.0;
        let line = match *transaction {
            Transaction::FrameOut(frame) => {
                format!(
                    r#"{{"event":"frame_out","nic":"{nic}","time_ps":{time},"frame":"{}"}}"#,
                    hex(frame)
                )
            }
            Transaction::FrameIn(frame) => {
                format!(
                    r#"{{"event":"frame_in","nic":"{nic}","time_ps":{time},"frame":"{}"}}"#,
                    hex(frame)
                )
            }
            Transaction::Cqe { cqn, cqe, written, .. } => format!(
                r#"{{"event":"cqe","nic":"{nic}","time_ps":{time},"cqn":{cqn},"written":{written},"cqe":"{}"}}"#,
                hex(cqe.bytes())
            ),
            _ => return,
        };
        self.lines.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
}

/// Two observers on one port, in turn (a port carries one: the coverage collector may
/// already be there).
struct Both(Box<dyn Observer>, Box<dyn Observer>);

impl Observer for Both {
    fn observe(&mut self, at: Picoseconds, transaction: &Transaction<'_>) {
        self.0.observe(at, transaction);
        self.1.observe(at, transaction);
    }
}

impl Recorder {
    /// Puts a recorder for `nic` on `device`'s network and completion ports, beside the
    /// observer already there.
    pub(crate) fn attach(&self, device: &mut Device, nic: &'static str) {
        for port in [Port::Network, Port::Completion] {
            let recorder: Box<dyn Observer> = Box::new(NicRecorder {
                lines: self.clone(),
                nic,
            });
            let observer = match device.attach_observer(port, None) {
                Some(previous) => Box::new(Both(previous, recorder)),
                None => recorder,
            };
            device.attach_observer(port, Some(observer));
        }
    }

    /// The lines recorded so far.
    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The recording of a run made with [`BenchConfig::record`] (JSON lines): the schema and
/// the configuration, the outputs, then the report's JSON with the wall-clock time (the one
/// figure that is not the model's) set to 0.
pub fn recording_text(config: &BenchConfig, report: &BenchReport) -> String {
    let mut report = report.clone();
    report.wall_time_s = 0.0;
    let config = format!("{config:?}").replace('\\', "\\\\").replace('"', "\\\"");
    let mut text = format!("{{\"schema\":\"{SCHEMA}\",\"config\":\"{config}\"}}\n");
    for line in &report.recording {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(&format!("{{\"event\":\"report\",\"json\":{}}}\n", report.to_json()));
    text
}

/// Runs `config` again (it must be the recorded run's, [`BenchConfig::record`] set) and
/// compares its recording with `recorded` line by line. Returns the lines compared.
///
/// # Errors
/// The run failed to run, or the first line that differs, with both sides.
pub fn replay(config: &BenchConfig, recorded: &str) -> Result<usize, String> {
    if !config.record {
        return Err("a replay records: BenchConfig::record must be set".into());
    }
    let (report, _) = crate::bench::run(config).map_err(|e| format!("the replayed run: {e}"))?;
    let replayed = recording_text(config, &report);
    let mut recorded_lines = recorded.lines();
    let mut replayed_lines = replayed.lines();
    let mut line = 0;
    loop {
        line += 1;
        match (recorded_lines.next(), replayed_lines.next()) {
            (None, None) => return Ok(line - 1),
            (a, b) if a == b => {}
            (a, b) => {
                return Err(format!(
                    "first divergence at line {line}: recorded {}, replayed {}",
                    a.unwrap_or("(end)"),
                    b.unwrap_or("(end)")
                ))
            }
        }
    }
}
