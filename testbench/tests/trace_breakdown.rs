//! Issue 18's trace acceptance: `rnic-bench --trace` of one 64 KiB RDMA WRITE writes a
//! Chrome/Perfetto JSON trace that passes the format check, shows every stage
//! `--breakdown` lists for the run (docs/timing.md), and whose slices add up, per NIC and
//! per stage, to exactly the figures `--breakdown` prints for the same run.

use std::collections::BTreeMap;
use std::process::Command;

use rnic_vip::trace::check_perfetto_json;
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

#[test]
fn the_trace_of_a_64_kib_write_shows_every_stage_and_adds_up_to_the_breakdown() {
    let folder = std::env::temp_dir().join(format!("rnic-trace-breakdown-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join("write-64k.json");
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
        .arg(&path)
        .output()
        .expect("rnic-bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_dir_all(&folder).unwrap();

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
    for stage in [
        "doorbell",
        "wqe_fetch",
        "payload_read",
        "tx_pipeline",
        "serialisation",
        "rx_pipeline",
        "payload_write",
        "cqe_write",
    ] {
        assert!(breakdown.contains_key(stage), "a WRITE passes {stage}:\n{stdout}");
    }
    let sums = slice_sums(&trace);
    // Every stage of the breakdown is on the trace, on its own named track, and nothing else is.
    let traced: std::collections::BTreeSet<&str> = sums.keys().map(|(_, stage)| stage.as_str()).collect();
    let listed: std::collections::BTreeSet<&str> = breakdown.keys().map(String::as_str).collect();
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
