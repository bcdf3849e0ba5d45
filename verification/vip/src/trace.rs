//! Traces of a session on virtual time, exported in the Chrome/Perfetto JSON trace format
//! (`ui.perfetto.dev` and `chrome://tracing` open it): one track per pipeline stage of
//! docs/timing.md and one per QP, with the port's frames, MMIO writes and MSI-X messages
//! as instants.
//!
//! Stage slices come from the timing model's charges (`TimingModel::set_stage_log`): each
//! charge made while the device processed an event at time t is laid from t, end to end
//! with the other charges of that event, so the placement inside an event is approximate
//! while every duration is exact: per stage, the slices add up to the model's
//! `StageTotals` (the `rnic-bench --breakdown` figures), and the file carries those totals
//! (`rnicStageTotals`) so a reader can check.

use std::collections::BTreeMap;

use rnic_hw_model::timing::{Stage, StageCharge, StageTotals};
use rnic_hw_model::Picoseconds;
use serde_json::{json, Value};

use crate::codec;

/// Where an event is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Track {
    /// A pipeline stage (docs/timing.md).
    Stage(Stage),
    /// MMIO writes to the BARs (doorbells included).
    Mmio,
    /// Frames in and out of the port.
    Port,
    /// MSI-X messages.
    Msix,
    /// Everything about one QP.
    Qp(u32),
}

impl Track {
    /// Thread id in the trace: stages 1..=16, then MMIO, port, MSI-X; QPs from 1000.
    fn id(self) -> u64 {
        match self {
            Track::Stage(stage) => 1 + Stage::ALL.iter().position(|s| *s == stage).unwrap_or(0) as u64,
            Track::Mmio => 100,
            Track::Port => 101,
            Track::Msix => 102,
            Track::Qp(qpn) => 1000 + u64::from(qpn),
        }
    }

    fn name(self) -> String {
        match self {
            Track::Stage(stage) => format!("stage {}", stage.name()),
            Track::Mmio => "MMIO writes".into(),
            Track::Port => "port frames".into(),
            Track::Msix => "MSI-X".into(),
            Track::Qp(qpn) => format!("QP {qpn}"),
        }
    }
}

/// One event of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// Start, ps of virtual time.
    pub time: Picoseconds,
    /// Length, ps; `None` for an instant.
    pub duration: Option<Picoseconds>,
    /// Where it is drawn.
    pub track: Track,
    /// What happened.
    pub name: String,
    /// Details (`key`, `value`).
    pub args: Vec<(String, String)>,
}

/// A session's trace since it was started.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    events: Vec<TraceEvent>,
    /// The timing model's totals when the trace started.
    totals_at_start: StageTotals,
    /// And now (updated by the session).
    totals_now: StageTotals,
}

impl Trace {
    /// A trace starting with the device's totals at `totals`.
    pub fn new(totals: StageTotals) -> Self {
        Self {
            events: Vec::new(),
            totals_at_start: totals,
            totals_now: totals,
        }
    }

    /// The events so far, in the order they were recorded.
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// Adds the charges made while the device processed an event at `now`, laid end to end
    /// from `now`, on their stage's track and their QP's; `totals` are the model's now.
    pub fn add_charges(&mut self, now: Picoseconds, charges: &[StageCharge], totals: StageTotals) {
        let mut cursor = now;
        for charge in charges {
            for track in [Track::Stage(charge.stage), Track::Qp(charge.qpn)] {
                self.events.push(TraceEvent {
                    time: cursor,
                    duration: Some(charge.cost),
                    track,
                    name: charge.stage.name().into(),
                    args: vec![("qpn".into(), charge.qpn.to_string())],
                });
            }
            cursor = Picoseconds(cursor.0 + charge.cost.0);
        }
        self.totals_now = totals;
    }

    /// Records a frame the port sent (`"frame out"`) or received (`"frame in"`) at `time`.
    pub fn add_frame(&mut self, time: Picoseconds, what: &str, frame: &[u8]) {
        let mut args = vec![("bytes".to_string(), frame.len().to_string())];
        let name = match codec::decode(frame) {
            Ok(decoded) => {
                for field in ["bth.dqpn", "bth.psn", "aeth.syndrome"] {
                    if let Some(value) = decoded.get(field) {
                        args.push((field.into(), format!("{value:#x}")));
                    }
                }
                format!("{what} {}", decoded.opcode_name)
            }
            Err(error) => {
                args.push(("malformed".into(), error.to_string()));
                format!("{what} (malformed)")
            }
        };
        self.events.push(TraceEvent {
            time,
            duration: None,
            track: Track::Port,
            name,
            args,
        });
    }

    /// Records an instant on `track`.
    pub fn add_instant(&mut self, time: Picoseconds, track: Track, name: String, args: Vec<(String, String)>) {
        self.events.push(TraceEvent {
            time,
            duration: None,
            track,
            name,
            args,
        });
    }

    /// Per stage: (times charged, total ps) of the slices on the stage tracks.
    pub fn stage_sums(&self) -> BTreeMap<&'static str, (u64, u64)> {
        let mut sums = BTreeMap::new();
        for event in &self.events {
            if let (Track::Stage(stage), Some(duration)) = (event.track, event.duration) {
                let entry = sums.entry(stage.name()).or_insert((0, 0));
                entry.0 += 1;
                entry.1 += duration.0;
            }
        }
        sums
    }

    /// The trace in the Chrome/Perfetto JSON format: `traceEvents` (complete events
    /// `ph: "X"` with `ts`/`dur` in µs of virtual time, instants `ph: "i"`, track names
    /// as `thread_name` metadata), `pid` = `device`, and `rnicStageTotals`: per stage, the
    /// timing model's count and ps over the trace's span.
    pub fn to_perfetto_json(&self, device: u32, device_name: &str) -> String {
        perfetto_json(&[(device, device_name, self)])
    }

    /// This trace's events in the Chrome/Perfetto format, as process `device`.
    fn perfetto_events(&self, device: u32, device_name: &str) -> Vec<Value> {
        let us = |t: Picoseconds| t.0 as f64 / 1_000_000.0;
        let mut events = vec![json!({
            "ph": "M", "name": "process_name", "pid": device, "tid": 0,
            "args": { "name": device_name },
        })];
        let mut tracks: Vec<Track> = self.events.iter().map(|e| e.track).collect();
        tracks.sort();
        tracks.dedup();
        for track in tracks {
            events.push(json!({
                "ph": "M", "name": "thread_name", "pid": device, "tid": track.id(),
                "args": { "name": track.name() },
            }));
            events.push(json!({
                "ph": "M", "name": "thread_sort_index", "pid": device, "tid": track.id(),
                "args": { "sort_index": track.id() },
            }));
        }
        for event in &self.events {
            let args: serde_json::Map<String, Value> = event
                .args
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            let mut value = json!({
                "name": event.name,
                "cat": match event.track { Track::Stage(_) | Track::Qp(_) => "stage", _ => "io" },
                "ts": us(event.time),
                "pid": device,
                "tid": event.track.id(),
                "args": args,
            });
            match event.duration {
                Some(duration) => {
                    value["ph"] = json!("X");
                    value["dur"] = json!(us(duration));
                }
                None => {
                    value["ph"] = json!("i");
                    value["s"] = json!("t");
                }
            }
            events.push(value);
        }
        events
    }

    /// Per stage: (times charged, ps) by the timing model over the trace's span.
    pub fn model_totals(&self) -> BTreeMap<&'static str, (u64, u64)> {
        Stage::ALL
            .iter()
            .map(|stage| {
                let count = self.totals_now.count(*stage) - self.totals_at_start.count(*stage);
                let ps = self.totals_now.total(*stage).0 - self.totals_at_start.total(*stage).0;
                (stage.name(), (count, ps))
            })
            .collect()
    }
}

/// Several devices' traces in one Chrome/Perfetto JSON file, one process each (`pid`,
/// name): the format of [`Trace::to_perfetto_json`], with `rnicStageTotals` summed over
/// the devices and, per device, `rnicDeviceStageTotals` (keyed by pid).
pub fn perfetto_json(devices: &[(u32, &str, &Trace)]) -> String {
    let mut events = Vec::new();
    let mut sums: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let mut per_device = serde_json::Map::new();
    for (pid, name, trace) in devices {
        events.extend(trace.perfetto_events(*pid, name));
        let totals = trace.model_totals();
        for (stage, (count, ps)) in &totals {
            let sum = sums.entry(stage).or_default();
            sum.0 += count;
            sum.1 += ps;
        }
        per_device.insert(pid.to_string(), totals_json(&totals));
    }
    let trace = json!({
        "displayTimeUnit": "ns",
        "traceEvents": events,
        "rnicStageTotals": totals_json(&sums),
        "rnicDeviceStageTotals": per_device,
    });
    serde_json::to_string(&trace).unwrap_or_default()
}

fn totals_json(totals: &BTreeMap<&'static str, (u64, u64)>) -> Value {
    Value::Object(
        totals
            .iter()
            .map(|(stage, (count, ps))| (stage.to_string(), json!({ "count": count, "ps": ps })))
            .collect(),
    )
}

/// Checks `text` is a Chrome/Perfetto JSON trace as [`Trace::to_perfetto_json`] promises
/// (the schema a viewer needs: every event has `ph`, `name`, `pid`, `tid`; complete
/// events numeric `ts` ≥ 0 and `dur` ≥ 0; instants `ts` and scope `s`; metadata `args`)
/// and that per stage the slices add up to `rnicStageTotals`. Returns the number of
/// events, or what is wrong.
pub fn check_perfetto_json(text: &str) -> Result<usize, String> {
    let trace: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let events = trace["traceEvents"].as_array().ok_or("no traceEvents array")?;
    let mut sums: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    let mut device_sums: BTreeMap<(String, String), (u64, f64)> = BTreeMap::new();
    for (index, event) in events.iter().enumerate() {
        let fail = |what: &str| format!("event {index}: {what}: {event}");
        let ph = event["ph"].as_str().ok_or_else(|| fail("no ph"))?;
        event["name"].as_str().ok_or_else(|| fail("no name"))?;
        event["pid"].as_u64().ok_or_else(|| fail("no pid"))?;
        let tid = event["tid"].as_u64().ok_or_else(|| fail("no tid"))?;
        match ph {
            "M" => {
                event["args"].as_object().ok_or_else(|| fail("metadata without args"))?;
            }
            "X" => {
                let ts = event["ts"].as_f64().ok_or_else(|| fail("no ts"))?;
                let dur = event["dur"].as_f64().ok_or_else(|| fail("no dur"))?;
                if ts < 0.0 || dur < 0.0 {
                    return Err(fail("negative ts or dur"));
                }
                if (1..=16).contains(&tid) {
                    let stage = event["name"].as_str().unwrap_or_default().to_string();
                    let pid = event["pid"].to_string();
                    for entry in [
                        sums.entry(stage.clone()).or_insert((0, 0.0)),
                        device_sums.entry((pid, stage)).or_insert((0, 0.0)),
                    ] {
                        entry.0 += 1;
                        entry.1 += dur;
                    }
                }
            }
            "i" => {
                event["ts"].as_f64().ok_or_else(|| fail("no ts"))?;
                event["s"].as_str().ok_or_else(|| fail("no scope"))?;
            }
            other => return Err(fail(&format!("phase {other:?} is not one this format writes"))),
        }
    }
    let totals = trace["rnicStageTotals"].as_object().ok_or("no rnicStageTotals")?;
    compare_totals("", totals, &sums)?;
    if let Some(devices) = trace.get("rnicDeviceStageTotals") {
        let devices = devices.as_object().ok_or("rnicDeviceStageTotals is not an object")?;
        for (pid, totals) in devices {
            let totals = totals.as_object().ok_or("a device's totals are not an object")?;
            let sums: BTreeMap<String, (u64, f64)> = device_sums
                .iter()
                .filter(|((p, _), _)| p == pid)
                .map(|((_, stage), sum)| (stage.clone(), *sum))
                .collect();
            compare_totals(&format!("pid {pid}, "), totals, &sums)?;
        }
    }
    Ok(events.len())
}

/// Per stage, the slices' count and µs against the model's count and ps (rounding of the
/// µs figures allowed: half a ps per slice).
fn compare_totals(
    what: &str,
    totals: &serde_json::Map<String, Value>,
    sums: &BTreeMap<String, (u64, f64)>,
) -> Result<(), String> {
    for (stage, total) in totals {
        let count = total["count"].as_u64().ok_or("a total without count")?;
        let ps = total["ps"].as_u64().ok_or("a total without ps")?;
        let (n, us) = sums.get(stage).copied().unwrap_or((0, 0.0));
        if n != count || (us * 1_000_000.0 - ps as f64).abs() > 0.5 * (n as f64 + 1.0) {
            return Err(format!(
                "{what}stage {stage}: the trace has {n} slices, {:.0} ps; the model charged {count} times, {ps} ps",
                us * 1_000_000.0
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(charges: &[StageCharge]) -> StageTotals {
        let mut totals = StageTotals::default();
        for charge in charges {
            totals.count[charge.stage as usize] += 1;
            totals.total_ps[charge.stage as usize] += charge.cost.0;
        }
        totals
    }

    fn charge(stage: Stage, cost: u64, qpn: u32) -> StageCharge {
        StageCharge {
            stage,
            cost: Picoseconds(cost),
            qpn,
        }
    }

    #[test]
    fn charges_of_one_event_are_laid_end_to_end_on_their_stage_and_qp_tracks() {
        let charges = [charge(Stage::Doorbell, 1_000, 8), charge(Stage::WqeFetch, 250_000, 8)];
        let mut trace = Trace::new(StageTotals::default());
        trace.add_charges(Picoseconds(5_000_000), &charges, totals(&charges));
        let events = trace.events();
        assert_eq!(events.len(), 4);
        assert_eq!(
            (events[0].track, events[0].time),
            (Track::Stage(Stage::Doorbell), Picoseconds(5_000_000))
        );
        assert_eq!(
            (events[1].track, events[1].time),
            (Track::Qp(8), Picoseconds(5_000_000))
        );
        assert_eq!(
            (events[2].track, events[2].time),
            (Track::Stage(Stage::WqeFetch), Picoseconds(5_001_000))
        );
        assert_eq!(trace.stage_sums()["wqe_fetch"], (1, 250_000));
    }

    #[test]
    fn the_json_passes_the_format_check_and_its_slices_add_up_to_the_model_totals() {
        let charges = [
            charge(Stage::Doorbell, 1_000, 8),
            charge(Stage::WqeFetch, 250_001, 8),
            charge(Stage::Serialisation, 84_321, 8),
        ];
        let mut trace = Trace::new(StageTotals::default());
        trace.add_charges(Picoseconds(7), &charges[..2], totals(&charges[..2]));
        trace.add_charges(Picoseconds(900_000), &charges[2..], totals(&charges));
        let frame = codec::encode(&BTreeMap::from([("bth.opcode".to_string(), 0x04)]), b"hi").unwrap();
        trace.add_frame(Picoseconds(1_000_000), "frame out", &frame);
        trace.add_instant(Picoseconds(2_000_000), Track::Msix, "vector 0".into(), vec![]);
        let text = trace.to_perfetto_json(0, "device 0");
        // 1 process name, 2 metadata per track (5 stage/QP/port/MSI-X tracks), 6 slices, 2 instants.
        assert_eq!(check_perfetto_json(&text), Ok(1 + 2 * 6 + 6 + 2));
        assert!(text.contains("\"frame out RC_SEND_ONLY\""), "{text}");
    }

    #[test]
    fn a_trace_missing_a_charge_or_a_field_is_refused() {
        let charges = [charge(Stage::Doorbell, 1_000, 8), charge(Stage::CqeWrite, 5_000, 8)];
        let mut trace = Trace::new(StageTotals::default());
        // The model charged both; the trace holds only the first.
        trace.add_charges(Picoseconds(0), &charges[..1], totals(&charges));
        let error = check_perfetto_json(&trace.to_perfetto_json(0, "d")).unwrap_err();
        assert!(error.starts_with("stage cqe_write: the trace has 0 slices"), "{error}");
        let broken = r#"{"traceEvents":[{"ph":"X","name":"a","pid":0,"tid":1,"ts":1}],"rnicStageTotals":{}}"#;
        assert!(check_perfetto_json(broken).unwrap_err().contains("no dur"));
        assert!(check_perfetto_json("[").is_err());
    }
}
