//! Record and replay: every external input of a session (configuration and BAR accesses,
//! backdoor memory writes and context write-backs, frames received, virtual time) and
//! every output (read data, frames sent, MSI-X messages) in order, as JSON lines; a replay
//! applies the inputs to a fresh session from the recorded configuration and compares the
//! whole sequence, reporting the first event that differs.
//!
//! A session whose host memory is the testbench's (callbacks) records the device's DMA
//! reads with their answers as inputs (the BT and MTT walks included) and its DMA writes
//! as outputs; its replay serves the reads from the recording, in order, so it needs no
//! callbacks and no testbench: the device alone is replayed. A read the replayed device
//! makes at another address or length than the recorded one is refused and shows as the
//! first divergence.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{HostBus, Session, VipError};

/// The first line's schema name of a recording.
pub const SCHEMA: &str = "rnic-vip-recording/1";

/// One input or output of a session, in the order it happened. Byte strings are hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Input: configuration space read.
    ConfigRead {
        /// Byte offset.
        offset: usize,
        /// Bytes read.
        length: usize,
    },
    /// Input: configuration space write.
    ConfigWrite {
        /// Byte offset.
        offset: usize,
        /// The bytes written, hex.
        data: String,
    },
    /// Input: BAR read.
    BarRead {
        /// BAR number.
        bar: u8,
        /// Byte offset in the BAR.
        offset: u64,
        /// Bytes read.
        length: usize,
    },
    /// Input: BAR write.
    BarWrite {
        /// BAR number.
        bar: u8,
        /// Byte offset in the BAR.
        offset: u64,
        /// The bytes written, hex.
        data: String,
    },
    /// Input: a backdoor write of host memory.
    MemoryWrite {
        /// Bus address.
        address: u64,
        /// The bytes written, hex.
        data: String,
    },
    /// Input: the device wrote its cached contexts back (a backdoor context read).
    ContextWriteBack,
    /// Input: virtual time moved on.
    AdvanceTo {
        /// The time reached, ps.
        time_ps: u64,
    },
    /// Input: run until idle.
    RunUntilIdle {
        /// The limit, ps.
        limit_ps: u64,
    },
    /// Input: a frame arrived at the port.
    ReceiveFrame {
        /// The Ethernet frame (no FCS), hex.
        frame: String,
    },
    /// Input (testbench memory only): a DMA read of the device and the testbench's answer.
    DmaRead {
        /// When, ps.
        time_ps: u64,
        /// Bus address.
        address: u64,
        /// Bytes read.
        length: usize,
        /// The bytes, hex; absent when the testbench refused the read.
        data: Option<String>,
    },
    /// Output (testbench memory only): a DMA write of the device.
    DmaWrite {
        /// When, ps.
        time_ps: u64,
        /// Bus address.
        address: u64,
        /// The bytes, hex.
        data: String,
    },
    /// Output: what a configuration or BAR read returned.
    ReadData {
        /// The bytes, hex.
        data: String,
    },
    /// Output: a frame the port sent.
    FrameOut {
        /// When, ps.
        time_ps: u64,
        /// The Ethernet frame (no FCS), hex.
        frame: String,
    },
    /// Output: an MSI-X message.
    Msix {
        /// When, ps.
        time_ps: u64,
        /// Vector.
        vector: u16,
        /// Message address.
        address: u64,
        /// Message data.
        data: u32,
    },
}

impl Event {
    fn is_output(&self) -> bool {
        matches!(
            self,
            Event::ReadData { .. } | Event::FrameOut { .. } | Event::Msix { .. } | Event::DmaWrite { .. }
        )
    }
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<Vec<u8>, VipError> {
    let bad = || VipError::Invalid(format!("recording: {text:?} is not hex bytes"));
    if !text.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
struct Header {
    schema: String,
    /// The session's configuration (JSON text).
    config: String,
    /// Whether host memory was the testbench's: DMA reads are inputs of the recording.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    testbench_memory: bool,
}

/// A recording's text: the header line, then one event per line. `testbench_memory`:
/// the session's host memory was the testbench's (its DMA reads are recorded inputs).
pub fn to_text(config_json: &str, testbench_memory: bool, events: &[Event]) -> String {
    let header = Header {
        schema: SCHEMA.into(),
        config: config_json.into(),
        testbench_memory,
    };
    let mut text = serde_json::to_string(&header).unwrap_or_default();
    text.push('\n');
    for event in events {
        text.push_str(&serde_json::to_string(event).unwrap_or_default());
        text.push('\n');
    }
    text
}

/// Replays a recording: a fresh session from its configuration gets its inputs; the
/// events it produces must be the recorded ones, one for one. Returns how many events
/// matched; `VipError::Mismatch` names the first that differs, with both sides.
pub fn replay(text: &str) -> Result<usize, VipError> {
    let mut lines = text.lines().filter(|line| !line.trim().is_empty());
    let header: Header = serde_json::from_str(lines.next().unwrap_or_default())
        .map_err(|e| VipError::Invalid(format!("recording header: {e}")))?;
    if header.schema != SCHEMA {
        return Err(VipError::Invalid(format!(
            "recording schema {:?}: {SCHEMA:?} expected",
            header.schema
        )));
    }
    let recorded: Vec<Event> = lines
        .enumerate()
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| VipError::Invalid(format!("recording event {i}: {e}"))))
        .collect::<Result<_, _>>()?;
    let bus = header
        .testbench_memory
        .then(|| Box::new(RecordedMemory::new(&recorded)) as Box<dyn HostBus>);
    let mut session = Session::new(&header.config, bus)?;
    session.start_recording()?;
    for event in &recorded {
        apply(&mut session, event)?;
    }
    let replayed = session.recording().unwrap_or_default();
    for (index, (a, b)) in recorded.iter().zip(replayed).enumerate() {
        if a != b {
            return Err(VipError::Mismatch(format!(
                "first divergence at event {index}: recorded {}, replayed {}",
                serde_json::to_string(a).unwrap_or_default(),
                serde_json::to_string(b).unwrap_or_default()
            )));
        }
    }
    if recorded.len() != replayed.len() {
        let index = recorded.len().min(replayed.len());
        let show = |events: &[Event]| {
            events
                .get(index)
                .map_or("nothing".to_string(), |e| serde_json::to_string(e).unwrap_or_default())
        };
        return Err(VipError::Mismatch(format!(
            "first divergence at event {index}: recorded {}, replayed {}",
            show(&recorded),
            show(replayed)
        )));
    }
    Ok(recorded.len())
}

/// The testbench's memory as recorded: the DMA reads are answered from the recording in
/// order; writes are taken (they are outputs, compared as events).
struct RecordedMemory {
    reads: VecDeque<(u64, usize, Option<Vec<u8>>)>,
}

impl RecordedMemory {
    fn new(events: &[Event]) -> Self {
        let reads = events
            .iter()
            .filter_map(|event| match event {
                Event::DmaRead {
                    address, length, data, ..
                } => Some((*address, *length, data.as_deref().and_then(|d| unhex(d).ok()))),
                _ => None,
            })
            .collect();
        Self { reads }
    }
}

impl HostBus for RecordedMemory {
    fn read(&mut self, address: u64, buffer: &mut [u8]) -> bool {
        match self.reads.pop_front() {
            Some((recorded, length, Some(data)))
                if recorded == address && length == buffer.len() && data.len() == length =>
            {
                buffer.copy_from_slice(&data);
                true
            }
            // Refused then, or another access than the recorded one: refused (the
            // event comparison reports where the replay left the recording).
            _ => false,
        }
    }

    fn write(&mut self, _address: u64, _data: &[u8]) -> bool {
        true
    }
}

fn apply(session: &mut Session, event: &Event) -> Result<(), VipError> {
    use rnic_hw_model::Picoseconds;
    match event {
        Event::ConfigRead { offset, length } => session.config_read(*offset, &mut vec![0; *length]),
        Event::ConfigWrite { offset, data } => session.config_write(*offset, &unhex(data)?),
        Event::BarRead { bar, offset, length } => session.bar_read(*bar, *offset, &mut vec![0; *length]),
        Event::BarWrite { bar, offset, data } => session.bar_write(*bar, *offset, &unhex(data)?),
        Event::MemoryWrite { address, data } => session.memory_write(*address, &unhex(data)?),
        Event::ContextWriteBack => {
            session.write_back_contexts();
            Ok(())
        }
        Event::AdvanceTo { time_ps } => session.advance_to(Picoseconds(*time_ps)),
        Event::RunUntilIdle { limit_ps } => {
            session.run_until_idle(Picoseconds(*limit_ps));
            Ok(())
        }
        Event::ReceiveFrame { frame } => session.receive_frame(&unhex(frame)?),
        // Served by the recorded memory when the device asks.
        Event::DmaRead { .. } => Ok(()),
        // Outputs are produced by the inputs, not applied.
        output => {
            debug_assert!(output.is_output());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rnic_hw_model::Picoseconds;

    use super::*;
    use crate::codec;

    const CONFIG: &str = "mac = \"02:00:00:00:00:01\"\nmemory = [{ base = 0x10000000, size = 0x100000 }]";
    const RING: u64 = 0x1000_0000;

    /// Enables the function, runs QUERY_FW_VER through the command queue, reads the
    /// consumer index back, and gives the port two frames for QPs that do not exist.
    fn recorded_session() -> Session {
        let mut session = Session::new(CONFIG, None).unwrap();
        session.start_recording().unwrap();
        session.config_write(0x04, &[0x06, 0x00]).unwrap();
        let mut descriptor = [0u8; 32];
        descriptor[0] = 0x01; // OPCODE QUERY_FW_VER
        descriptor[4] = 0x09; // FLAG: IN | WR
        session.memory_write(RING, &descriptor).unwrap();
        for (offset, value) in [
            (0x7000u64, RING as u32),
            (0x7004, 0),
            (0x7008, 1),
            (0x7014, 0),
            (0x7010, 1),
        ] {
            session.bar_write(0, offset, &value.to_le_bytes()).unwrap();
        }
        session.run_until_idle(Picoseconds(1_000_000_000));
        session.bar_read(0, 0x7014, &mut [0; 4]).unwrap();
        for psn in [1u64, 2] {
            let fields = BTreeMap::from([("bth.opcode".to_string(), 0x04), ("bth.psn".to_string(), psn)]);
            session
                .receive_frame(&codec::encode(&fields, b"data").unwrap())
                .unwrap();
        }
        let later = Picoseconds(session.now().0 + 10_000_000);
        session.advance_to(later).unwrap();
        session
    }

    #[test]
    fn a_replay_of_a_recording_produces_the_same_events() {
        let session = recorded_session();
        let events = session.recording().unwrap();
        assert!(
            events.contains(&Event::ReadData {
                data: "01000000".into()
            }),
            "the command ran: {events:?}"
        );
        let text = session.recording_text().unwrap();
        assert_eq!(replay(&text).unwrap(), events.len());
    }

    #[test]
    fn a_changed_output_is_the_first_divergence_with_both_sides() {
        let text = recorded_session().recording_text().unwrap();
        let index = text.lines().skip(1).position(|l| l.contains("\"read_data\"")).unwrap();
        let tampered = text.replacen(
            "{\"event\":\"read_data\",\"data\":\"01000000\"}",
            "{\"event\":\"read_data\",\"data\":\"00000000\"}",
            1,
        );
        let error = replay(&tampered).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("mismatch: first divergence at event {index}: recorded {{\"event\":\"read_data\",\"data\":\"00000000\"}}, replayed {{\"event\":\"read_data\",\"data\":\"01000000\"}}")),
            "{error}"
        );
    }

    #[test]
    fn a_changed_input_shows_where_its_effect_first_differs() {
        let text = recorded_session().recording_text().unwrap();
        // The producer index write of 1 becomes 0: the command never runs.
        let tampered = text.replacen(
            "\"offset\":28688,\"data\":\"01000000\"",
            "\"offset\":28688,\"data\":\"00000000\"",
            1,
        );
        assert_ne!(tampered, text);
        let error = replay(&tampered).unwrap_err().to_string();
        assert!(
            error.contains("recorded {\"event\":\"read_data\",\"data\":\"01000000\"}"),
            "{error}"
        );
    }

    #[test]
    fn the_configuration_flags_start_a_recording_and_a_trace_at_creation() {
        let mut session = Session::new(&format!("{CONFIG}\nrecord = true\ntrace = true"), None).unwrap();
        session.config_write(0x04, &[0x06, 0x00]).unwrap();
        assert_eq!(session.recording().unwrap().len(), 1);
        assert!(session.trace().is_some());
        let text = session.recording_text().unwrap();
        assert_eq!(replay(&text).unwrap(), 1);
    }

    #[test]
    fn recording_starts_before_any_input() {
        let mut session = Session::new(CONFIG, None).unwrap();
        session.config_write(0x04, &[0x06, 0x00]).unwrap();
        assert!(session.start_recording().is_err());
        assert!(replay("{\"schema\":\"other\",\"config\":\"\"}").is_err());
    }
}
