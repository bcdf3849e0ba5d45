//! The storage fuzz targets' committed inputs — the minimised corpora in
//! `fuzz/corpus/{nvme_capsules,srp_ius}/` and the inputs of past findings in
//! `fuzz/regressions/…/` — through the functions libFuzzer drives
//! (`rnic_storage::fuzzing`, docs/fuzzing.md), on the stable toolchain.

use std::path::{Path, PathBuf};

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.map(|e| e.expect("directory entry").path()).collect())
        .unwrap_or_default();
    paths.sort();
    paths
}

fn replay(target: &str, run: fn(&[u8])) {
    let mut count = 0;
    for path in inputs("corpus", target)
        .into_iter()
        .chain(inputs("regressions", target))
    {
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
    assert!(count > 0, "fuzz target {target} has no committed corpus");
}

#[test]
fn nvme_capsule_corpus_parses_and_round_trips() {
    replay("nvme_capsules", rnic_storage::fuzzing::nvme_capsules);
}

#[test]
fn srp_iu_corpus_parses_and_round_trips() {
    replay("srp_ius", rnic_storage::fuzzing::srp_ius);
}
