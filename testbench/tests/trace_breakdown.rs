//! Issue 18's trace acceptance: `rnic-bench --trace` of one 64 KiB RDMA WRITE writes a
//! Chrome/Perfetto JSON trace that passes the format check, shows every stage
//! `--breakdown` lists for the run (docs/timing.md), and whose slices add up, per NIC and
//! per stage, to exactly the figures `--breakdown` prints for the same run; `--trace
//! FILE.vcd` writes the same run as VCD, whose waves add up to the same figures.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use rnic_hw_model::timing::Stage;
use rnic_vip::trace::check_perfetto_json;
use rnic_vip::vcd::{check_vcd, parse_vcd};
use serde_json::Value;

/// Per stage: (count, ns) of the requester and of the responder, from the table.
type Breakdown = BTreeMap<String, [(String, String); 2]>;

/// The rows of `--breakdown`'s table: ` stage  requester-n  requester-ns  responder-n  responder-ns`.
fn breakdown_rows(stdout: &str) -> Breakdown {
    let mut lines = stdout
        .lines()
        .skip_while(|l| !l.starts_with("# per-message stage breakdown"));
    let title = lines.next().expect("a breakdown table");
    assert!(title.contains("(1 messages;"), "one message: {title}");
    lines.next().expect("the column names");
    lines
        .map(str::split_whitespace)
        .map_while(|mut columns| {
            let stage = columns.next()?.to_string();
            let figures: Vec<String> = columns.map(String::from).collect();
            (figures.len() == 4 && figures.iter().all(|f| f.parse::<f64>().is_ok())).then(|| {
                (
                    stage,
                    [
                        (figures[0].clone(), figures[1].clone()),
                        (figures[2].clone(), figures[3].clone()),
                    ],
                )
            })
        })
        .collect()
}

/// Per process and stage: the slices on the stage tracks (count, ps).
fn slice_sums(trace: &Value) -> BTreeMap<(u64, String), (u64, u64)> {
    let mut sums = BTreeMap::new();
    for event in trace["traceEvents"].as_array().unwrap() {
        let tid = event["tid"].as_u64().unwrap();
        if event["ph"] == "X" && (1..=16).contains(&tid) {
            let entry = sums
                .entry((
                    event["pid"].as_u64().unwrap(),
                    event["name"].as_str().unwrap().to_string(),
                ))
                .or_insert((0, 0));
            entry.0 += 1;
            // µs with the ps exact in a double (durations are far below 2^53 ps).
            entry.1 += (event["dur"].as_f64().unwrap() * 1e6).round() as u64;
        }
    }
    sums
}

/// What one run of `rnic-bench write --size 65536 --iters 1 --lat --verify --breakdown`
/// printed, with its trace written both as JSON and as VCD (`--trace` given twice).
struct TracedRun {
    stdout: String,
    json: String,
    vcd: String,
}

fn traced_write_of_64_kib(label: &str) -> TracedRun {
    let folder = std::env::temp_dir().join(format!("rnic-trace-{label}-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let (json_path, vcd_path) = (folder.join("write-64k.json"), folder.join("write-64k.vcd"));
    let output = Command::new(env!("CARGO_BIN_EXE_rnic-bench"))
        .args([
            "write",
            "--size",
            "65536",
            "--iters",
            "1",
            "--lat",
            "--verify",
            "--breakdown",
            "--trace",
        ])
        .arg(&json_path)
        .arg("--trace")
        .arg(&vcd_path)
        .output()
        .expect("rnic-bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let run = TracedRun {
        stdout,
        json: std::fs::read_to_string(&json_path).unwrap(),
        vcd: std::fs::read_to_string(&vcd_path).unwrap(),
    };
    std::fs::remove_dir_all(&folder).unwrap();
    run
}

/// The stages a 64 KiB WRITE passes on its way (docs/timing.md).
const WRITE_STAGES: [&str; 8] = [
    "doorbell",
    "wqe_fetch",
    "payload_read",
    "tx_pipeline",
    "serialisation",
    "rx_pipeline",
    "payload_write",
    "cqe_write",
];

#[test]
fn the_trace_of_a_64_kib_write_shows_every_stage_and_adds_up_to_the_breakdown() {
    let TracedRun { stdout, json: text, .. } = traced_write_of_64_kib("json");

    // The format: what Perfetto and chrome://tracing need, and the model's own totals.
    let events = check_perfetto_json(&text).unwrap_or_else(|e| panic!("{e}"));
    let trace: Value = serde_json::from_str(&text).unwrap();
    let names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["requester NIC", "responder NIC"]);

    let breakdown = breakdown_rows(&stdout);
    for stage in WRITE_STAGES {
        assert!(breakdown.contains_key(stage), "a WRITE passes {stage}:\n{stdout}");
    }
    let sums = slice_sums(&trace);
    // Every stage of the breakdown is on the trace, on its own named track, and nothing else is.
    let traced: BTreeSet<&str> = sums.keys().map(|(_, stage)| stage.as_str()).collect();
    let listed: BTreeSet<&str> = breakdown.keys().map(String::as_str).collect();
    assert_eq!(traced, listed, "stages traced vs stages in the breakdown");
    for stage in &listed {
        assert!(
            text.contains(&format!("\"name\":\"stage {stage}\"")),
            "a track named after {stage}"
        );
    }
    // Per NIC and stage: as many slices as the breakdown's count, and their durations add up
    // to its time (one message: the per-message figure is the total, ns with 3 decimals = ps).
    for (stage, nics) in &breakdown {
        for (pid, (count, ns)) in [1u64, 2].into_iter().zip(nics) {
            let (n, ps) = sums.get(&(pid, stage.clone())).copied().unwrap_or((0, 0));
            assert_eq!(
                (format!("{n}.000"), format!("{:.3}", ps as f64 / 1000.0)),
                (count.clone(), ns.clone()),
                "stage {stage} on NIC {pid}: the trace's slices vs --breakdown"
            );
        }
    }
    println!(
        "{events} trace events; {} stages, every one adding up to --breakdown:\n{stdout}",
        listed.len()
    );
}

#[test]
fn the_vcd_of_the_same_run_adds_up_to_the_breakdown_too() {
    let TracedRun { stdout, vcd: text, .. } = traced_write_of_64_kib("vcd");

    // The format and the model's own totals (rnicStageTotals), by the project's reader.
    let variables = check_vcd(&text).unwrap_or_else(|e| panic!("{e}"));
    let vcd = parse_vcd(&text).unwrap();
    assert_eq!(vcd.timescale_ps, 1);
    for (device, name) in [(1, "requester NIC"), (2, "responder NIC")] {
        let comment = format!("device_{device}: {name}");
        assert!(vcd.comments.contains(&comment), "{comment:?} in {:?}", vcd.comments);
    }

    let breakdown = breakdown_rows(&stdout);
    for stage in WRITE_STAGES {
        assert!(breakdown.contains_key(stage), "a WRITE passes {stage}:\n{stdout}");
    }
    // Every stage has its waves (charged or not); per NIC and stage, the slices counted and
    // the integral of `active` (ps) are the breakdown's row, and a stage the breakdown
    // does not list has none.
    let mut charged = BTreeSet::new();
    for stage in Stage::ALL.map(Stage::name) {
        for (index, device) in [1, 2].into_iter().enumerate() {
            let scope = format!("device_{device}.stage_{stage}");
            let wave = |name| {
                vcd.variable(&scope, name)
                    .unwrap_or_else(|| panic!("no {scope}.{name}"))
            };
            let (slices, ps) = (wave("slices").last(), wave("active").integral());
            assert_eq!(wave("active").last(), 0, "{scope}: every slice ends");
            if slices > 0 {
                charged.insert(stage);
            }
            let expected = breakdown
                .get(stage)
                .map_or(("0.000".to_string(), "0.000".to_string()), |nics| nics[index].clone());
            assert_eq!(
                (format!("{slices}.000"), format!("{:.3}", ps as f64 / 1000.0)),
                expected,
                "stage {stage} on NIC {device}: the VCD's waves vs --breakdown"
            );
        }
    }
    let listed: BTreeSet<&str> = breakdown.keys().map(String::as_str).collect();
    assert_eq!(
        charged, listed,
        "stages with slices in the VCD vs stages in the breakdown"
    );
    println!(
        "{variables} VCD variables; {} stages charged, every one adding up to --breakdown",
        listed.len()
    );
}
