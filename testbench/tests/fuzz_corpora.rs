//! Every committed fuzz input — the minimised corpora in `fuzz/corpus/<target>/` and the
//! inputs of past findings in `fuzz/regressions/<target>/` — through the same `run`
//! functions libFuzzer drives (docs/fuzzing.md). So a finding stays fixed, and every
//! target builds and holds its invariants on the stable toolchain, without cargo-fuzz.

use std::path::{Path, PathBuf};

use rnic_testbench::fuzzing;

/// The target of each file in `fuzz/fuzz_targets/`.
fn target(name: &str) -> Option<fn(&[u8])> {
    Some(match name {
        "parse_frame" => fuzzing::parse_frame::run,
        "rx_frames" => fuzzing::rx_frames::run,
        "work_requests" => fuzzing::work_requests::run,
        "bar_access" => fuzzing::bar_access::run,
        "cmdq" => fuzzing::cmdq::run,
        "mailbox" => fuzzing::mailbox::run,
        "mtt" => fuzzing::mtt::run,
        "cm_mads" => fuzzing::cm_mads::run,
        _ => return None,
    })
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.map(|e| e.expect("directory entry").path()).collect())
        .unwrap_or_default();
    paths.sort();
    paths
}

fn replay(name: &str) -> usize {
    let run = target(name).unwrap_or_else(|| panic!("fuzz target {name} has no entry in this test's list"));
    let mut count = 0;
    for kind in ["corpus", "regressions"] {
        for path in files(&fuzz_dir().join(kind).join(name)) {
            let data = std::fs::read(&path).expect("readable input");
            if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{}: {message}", path.display());
            }
            count += 1;
        }
    }
    count
}

#[test]
fn every_target_has_a_corpus_and_holds_its_invariants_on_it() {
    let targets: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|p| p.file_stem()?.to_str().map(str::to_string))
        .collect();
    assert!(targets.len() >= 7, "the fuzz targets: {targets:?}");
    // Replayed where their code lives: the vfio-user server (emulator/tests/fuzz_vfio_user.rs)
    // and the storage parsers (storage/tests/fuzz_corpora.rs), which depend on this crate.
    let elsewhere = ["vfio_user", "nvme_capsules", "srp_ius"];
    for name in targets.iter().filter(|name| !elsewhere.contains(&name.as_str())) {
        let inputs = replay(name);
        assert!(inputs > 0, "fuzz target {name} has no committed corpus");
    }
}
