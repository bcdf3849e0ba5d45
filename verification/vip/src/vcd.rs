//! Traces as VCD (Value Change Dump, IEEE 1364 §18), for waveform viewers (GTKWave,
//! Surfer) beside RTL waves: the same [`Trace`] as the Chrome/Perfetto export, one scope
//! per device, in it one scope per pipeline stage and one per QP, with
//!
//! * `active` (integer): the slices of that stage (or QP) in progress — an integer, not
//!   a bit, because the slices of pipelined frames overlap on a stage;
//! * `slices` (integer): the slices started so far (a zero-length charge counts too);
//!
//! and, for the port, MMIO and MSI-X tracks, `count`: the instants so far. Time is in
//! picoseconds (`$timescale 1ps`), exact: per stage, the integral of `active` over time
//! is the picoseconds the timing model charged, which the file carries in a `$comment`
//! (`rnicStageTotals stage=count:ps …`) so that [`check_vcd`] can compare.
//!
//! Written by hand rather than with a VCD crate: the subset written here is a header, a
//! few integer variables and their changes; the reader below exists for the checks.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rnic_hw_model::timing::Stage;

use crate::trace::{Trace, Track};

/// The scope and name of a track's variables.
fn track_scope(track: Track) -> String {
    match track {
        Track::Stage(stage) => format!("stage_{}", stage.name()),
        Track::Qp(qpn) => format!("qp_{qpn}"),
        Track::Mmio => "mmio_writes".into(),
        Track::Port => "port_frames".into(),
        Track::Msix => "msix".into(),
    }
}

/// A VCD identifier: printable ASCII `!`..`~`, base 94.
fn identifier(mut index: usize) -> String {
    let mut id = String::new();
    loop {
        id.push(char::from(b'!' + (index % 94) as u8));
        index /= 94;
        if index == 0 {
            return id;
        }
        index -= 1;
    }
}

/// Several devices' traces as one VCD file: scope `device_<pid>` (its name in a
/// `$comment`) per device.
pub fn to_vcd(devices: &[(u32, &str, &Trace)]) -> String {
    // Identifier, scope path, name.
    let mut vars: Vec<(String, String, String)> = Vec::new();
    // Per time, the changes: (variable, +1 or -1).
    let mut deltas: BTreeMap<u64, Vec<(usize, i64)>> = BTreeMap::new();
    let mut header = String::new();
    let _ = writeln!(header, "$date virtual time $end");
    let _ = writeln!(header, "$version rnic-vip (docs/guides/verification.md) $end");
    let _ = writeln!(header, "$timescale 1ps $end");
    for (pid, name, trace) in devices {
        let totals: Vec<String> = trace
            .model_totals()
            .iter()
            .map(|(stage, (count, ps))| format!("{stage}={count}:{ps}"))
            .collect();
        let _ = writeln!(header, "$comment device_{pid}: {name} $end");
        let _ = writeln!(
            header,
            "$comment rnicStageTotals device_{pid} {} $end",
            totals.join(" ")
        );
        let mut tracks: Vec<Track> = trace.events().iter().map(|e| e.track).collect();
        // Every stage is declared, charged or not, so a viewer's layout stays the same.
        tracks.extend(Stage::ALL.iter().map(|s| Track::Stage(*s)));
        tracks.sort();
        tracks.dedup();
        let _ = writeln!(header, "$scope module device_{pid} $end");
        let mut index_of: BTreeMap<(Track, &str), usize> = BTreeMap::new();
        for track in &tracks {
            let scope = track_scope(*track);
            let _ = writeln!(header, "$scope module {scope} $end");
            let names: &[&str] = match track {
                Track::Stage(_) | Track::Qp(_) => &["active", "slices"],
                _ => &["count"],
            };
            for name in names {
                let id = identifier(vars.len());
                let _ = writeln!(header, "$var integer 32 {id} {name} $end");
                index_of.insert((*track, name), vars.len());
                vars.push((id, format!("device_{pid}.{scope}"), name.to_string()));
            }
            let _ = writeln!(header, "$upscope $end");
        }
        let _ = writeln!(header, "$upscope $end");
        for event in trace.events() {
            let start = event.time.0;
            match event.duration {
                Some(duration) => {
                    let active = index_of[&(event.track, "active")];
                    let slices = index_of[&(event.track, "slices")];
                    deltas.entry(start).or_default().push((slices, 1));
                    if duration.0 > 0 {
                        deltas.entry(start).or_default().push((active, 1));
                        deltas.entry(start + duration.0).or_default().push((active, -1));
                    }
                }
                None => {
                    if let Some(count) = index_of.get(&(event.track, "count")) {
                        deltas.entry(start).or_default().push((*count, 1));
                    }
                }
            }
        }
    }
    let _ = writeln!(header, "$enddefinitions $end");
    let mut out = header;
    let mut values = vec![0i64; vars.len()];
    let _ = writeln!(out, "#0");
    let _ = writeln!(out, "$dumpvars");
    for (id, _, _) in &vars {
        let _ = writeln!(out, "b0 {id}");
    }
    let _ = writeln!(out, "$end");
    for (time, changes) in deltas {
        let before = values.clone();
        for (index, delta) in changes {
            values[index] += delta;
        }
        let changed: Vec<usize> = (0..vars.len()).filter(|i| values[*i] != before[*i]).collect();
        if changed.is_empty() {
            continue;
        }
        let _ = writeln!(out, "#{time}");
        for index in changed {
            let _ = writeln!(out, "b{:b} {}", values[index].max(0), vars[index].0);
        }
    }
    out
}

/// A variable of a parsed VCD file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcdVariable {
    /// The scopes, joined by `.` (`device_0.stage_doorbell`).
    pub scope: String,
    /// The name (`active`).
    pub name: String,
    /// Width, bits.
    pub width: u32,
    /// Its changes: (time in timescale units, value), in order.
    pub changes: Vec<(u64, u64)>,
}

impl VcdVariable {
    /// The integral of the value over time, from 0 to the last change.
    pub fn integral(&self) -> u64 {
        self.changes
            .windows(2)
            .map(|pair| pair[0].1 * (pair[1].0 - pair[0].0))
            .sum()
    }

    /// The value after the last change.
    pub fn last(&self) -> u64 {
        self.changes.last().map_or(0, |c| c.1)
    }
}

/// A parsed VCD file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vcd {
    /// `$timescale`, in ps.
    pub timescale_ps: u64,
    /// `$comment` texts.
    pub comments: Vec<String>,
    /// Variables in declaration order.
    pub variables: Vec<VcdVariable>,
}

impl Vcd {
    /// The variable `name` of scope `scope`.
    pub fn variable(&self, scope: &str, name: &str) -> Option<&VcdVariable> {
        self.variables.iter().find(|v| v.scope == scope && v.name == name)
    }
}

/// Reads a VCD file (the four-state scalar and vector changes of IEEE 1364 §18; `x`/`z`
/// bits read as 0), refusing what is malformed: an unknown identifier, time running
/// backwards, a change before `$enddefinitions`, an unclosed section.
pub fn parse_vcd(text: &str) -> Result<Vcd, String> {
    let mut vcd = Vcd::default();
    let mut ids: BTreeMap<String, usize> = BTreeMap::new();
    let mut scopes: Vec<String> = Vec::new();
    let mut tokens = text.split_whitespace().peekable();
    let mut definitions = true;
    let mut time: Option<u64> = None;
    // A `$keyword … $end` section's words.
    let section = |tokens: &mut std::iter::Peekable<std::str::SplitWhitespace<'_>>, keyword: &str| {
        let mut words = Vec::new();
        for token in tokens.by_ref() {
            if token == "$end" {
                return Ok(words);
            }
            words.push(token.to_string());
        }
        Err(format!("{keyword} without $end"))
    };
    while let Some(token) = tokens.next() {
        match token {
            "$date" | "$version" => {
                section(&mut tokens, token)?;
            }
            "$comment" => vcd.comments.push(section(&mut tokens, token)?.join(" ")),
            "$timescale" => {
                let words = section(&mut tokens, token)?.concat();
                let digits: String = words.chars().take_while(char::is_ascii_digit).collect();
                let factor: u64 = match &words[digits.len()..] {
                    "ps" => 1,
                    "ns" => 1_000,
                    "us" => 1_000_000,
                    "fs" => return Err("a timescale below 1 ps".into()),
                    unit => return Err(format!("timescale unit {unit:?}")),
                };
                vcd.timescale_ps = digits.parse::<u64>().map_err(|_| format!("timescale {words:?}"))? * factor;
            }
            "$scope" => {
                let words = section(&mut tokens, token)?;
                scopes.push(words.get(1).cloned().ok_or("$scope without a name")?);
            }
            "$upscope" => {
                section(&mut tokens, token)?;
                scopes.pop().ok_or("$upscope outside a scope")?;
            }
            "$var" => {
                let words = section(&mut tokens, token)?;
                let [_kind, width, id, name, ..] = words.as_slice() else {
                    return Err(format!("$var {words:?}: type, width, identifier, name"));
                };
                let width = width.parse().map_err(|_| format!("$var width {width:?}"))?;
                ids.insert(id.clone(), vcd.variables.len());
                vcd.variables.push(VcdVariable {
                    scope: scopes.join("."),
                    name: name.clone(),
                    width,
                    changes: Vec::new(),
                });
            }
            "$enddefinitions" => {
                section(&mut tokens, token)?;
                if !scopes.is_empty() {
                    return Err("$enddefinitions inside a scope".into());
                }
                definitions = false;
            }
            "$dumpvars" | "$dumpall" | "$dumpon" | "$dumpoff" | "$end" => {}
            _ if definitions => return Err(format!("{token:?} before $enddefinitions")),
            _ if token.starts_with('#') => {
                let t: u64 = token[1..].parse().map_err(|_| format!("time {token:?}"))?;
                if time.is_some_and(|now| t < now) {
                    return Err(format!("time {t} after {}", time.unwrap_or_default()));
                }
                time = Some(t);
            }
            _ => {
                let (value, id) = match token.as_bytes()[0] {
                    b'b' | b'B' => {
                        let id = tokens.next().ok_or("a vector change without identifier")?;
                        (&token[1..], id)
                    }
                    b'0' | b'1' | b'x' | b'X' | b'z' | b'Z' => (&token[..1], &token[1..]),
                    _ => return Err(format!("unexpected {token:?}")),
                };
                let bits: String = value.chars().map(|c| if c == '1' { '1' } else { '0' }).collect();
                let value = u64::from_str_radix(&bits, 2).map_err(|_| format!("value {value:?}"))?;
                let index = *ids.get(id).ok_or_else(|| format!("unknown identifier {id:?}"))?;
                let now = time.ok_or("a change before the first time")?;
                vcd.variables[index].changes.push((now, value));
            }
        }
    }
    if definitions {
        return Err("no $enddefinitions".into());
    }
    Ok(vcd)
}

/// Checks a VCD trace as [`to_vcd`] writes it: it parses; per device and stage, the
/// `slices` counted and the integral of `active` equal the timing model's count and ps
/// (`rnicStageTotals`), and every `active` ends at 0. Returns the number of variables.
pub fn check_vcd(text: &str) -> Result<usize, String> {
    let vcd = parse_vcd(text)?;
    if vcd.timescale_ps != 1 {
        return Err(format!("timescale {} ps: 1 ps expected", vcd.timescale_ps));
    }
    let mut devices = 0;
    for comment in &vcd.comments {
        let mut words = comment.split_whitespace();
        if words.next() != Some("rnicStageTotals") {
            continue;
        }
        devices += 1;
        let device = words.next().ok_or("rnicStageTotals without a device")?;
        for total in words {
            let parse = || -> Option<(&str, u64, u64)> {
                let (stage, figures) = total.split_once('=')?;
                let (count, ps) = figures.split_once(':')?;
                Some((stage, count.parse().ok()?, ps.parse().ok()?))
            };
            let (stage, count, ps) = parse().ok_or_else(|| format!("total {total:?}"))?;
            let scope = format!("{device}.stage_{stage}");
            let find = |name| {
                vcd.variable(&scope, name)
                    .ok_or_else(|| format!("no variable {scope}.{name}"))
            };
            let (active, slices) = (find("active")?, find("slices")?);
            if slices.last() != count || active.integral() != ps || active.last() != 0 {
                return Err(format!(
                    "{scope}: {} slices, {} ps (ending at {}); the model charged {count} times, {ps} ps",
                    slices.last(),
                    active.integral(),
                    active.last()
                ));
            }
        }
    }
    if devices == 0 {
        return Err("no rnicStageTotals comment".into());
    }
    Ok(vcd.variables.len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rnic_hw_model::timing::{StageCharge, StageTotals};
    use rnic_hw_model::Picoseconds;

    use super::*;
    use crate::codec;

    fn charge(stage: Stage, cost: u64, qpn: u32) -> StageCharge {
        StageCharge {
            stage,
            cost: Picoseconds(cost),
            qpn,
        }
    }

    fn totals(charges: &[StageCharge]) -> StageTotals {
        let mut totals = StageTotals::default();
        for charge in charges {
            totals.count[charge.stage as usize] += 1;
            totals.total_ps[charge.stage as usize] += charge.cost.0;
        }
        totals
    }

    /// Two events' charges that overlap on the serialisation stage (pipelined frames of
    /// QPs 8 and 9), a zero-length charge, a frame and an MSI-X message.
    fn trace() -> Trace {
        let charges = [
            charge(Stage::Doorbell, 1_000, 8),
            charge(Stage::Serialisation, 80_000, 8),
            charge(Stage::Serialisation, 80_000, 9),
            charge(Stage::CqeWrite, 0, 9),
        ];
        let mut trace = Trace::new(StageTotals::default());
        trace.add_charges(Picoseconds(0), &charges[..2], totals(&charges[..2]));
        trace.add_charges(Picoseconds(50_000), &charges[2..], totals(&charges));
        let frame = codec::encode(&BTreeMap::from([("bth.opcode".to_string(), 0x04)]), b"hi").unwrap();
        trace.add_frame(Picoseconds(81_000), "frame out", &frame);
        trace.add_instant(Picoseconds(130_000), Track::Msix, "MSI-X vector 0".into(), vec![]);
        trace
    }

    #[test]
    fn every_stage_and_qp_has_its_variables_and_overlapping_slices_count_up() {
        let text = to_vcd(&[(0, "device 0", &trace())]);
        let vcd = parse_vcd(&text).unwrap();
        assert_eq!(vcd.timescale_ps, 1);
        for stage in Stage::ALL {
            let scope = format!("device_0.stage_{}", stage.name());
            assert!(vcd.variable(&scope, "active").is_some(), "{scope}");
        }
        let serialisation = vcd.variable("device_0.stage_serialisation", "active").unwrap();
        // QP 8's frame from 1 000 ps, QP 9's from 50 000 ps: two at once in between.
        assert_eq!(
            serialisation.changes,
            vec![(0, 0), (1_000, 1), (50_000, 2), (81_000, 1), (130_000, 0)]
        );
        assert_eq!(serialisation.integral(), 160_000);
        let qp9 = vcd.variable("device_0.qp_9", "slices").unwrap();
        assert_eq!(qp9.last(), 2, "the zero-length CQE write counts as a slice");
        assert_eq!(vcd.variable("device_0.qp_9", "active").unwrap().integral(), 80_000);
        assert_eq!(
            vcd.variable("device_0.port_frames", "count").unwrap().changes,
            vec![(0, 0), (81_000, 1)]
        );
        assert_eq!(vcd.variable("device_0.msix", "count").unwrap().last(), 1);
    }

    #[test]
    fn the_stage_integrals_are_the_model_totals_and_a_missing_charge_is_found() {
        let trace = trace();
        let text = to_vcd(&[(0, "a", &trace), (1, "b", &trace)]);
        assert!(check_vcd(&text).is_ok(), "{:?}", check_vcd(&text));
        // A file claiming more serialisation than its waves show is refused.
        let claimed = text.replacen("serialisation=2:160000", "serialisation=2:160001", 1);
        assert_ne!(claimed, text);
        let error = check_vcd(&claimed).unwrap_err();
        assert!(
            error.starts_with("device_0.stage_serialisation: 2 slices, 160000 ps"),
            "{error}"
        );
    }

    #[test]
    fn malformed_files_are_refused_with_the_reason() {
        let good = to_vcd(&[(0, "a", &trace())]);
        let backwards = good.replacen("#130000", "#10", 1);
        assert!(parse_vcd(&backwards).unwrap_err().starts_with("time 10 after"));
        let unknown = good.replacen("#1000\n", "#1000\nb1 ~~~\n", 1);
        assert_ne!(unknown, good);
        assert!(
            parse_vcd(&unknown).unwrap_err().contains("unknown identifier"),
            "{unknown}"
        );
        assert!(parse_vcd("$timescale 1ps $end\n#0\n")
            .unwrap_err()
            .contains("before $enddefinitions"));
        assert!(parse_vcd("$scope module a").is_err());
        assert_eq!(identifier(0), "!");
        assert_eq!(identifier(93), "~");
        assert_eq!(identifier(94), "!!");
    }
}
