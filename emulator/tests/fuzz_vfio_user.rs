//! The `vfio_user` fuzz target's committed inputs — its minimised corpus in
//! `fuzz/corpus/vfio_user/` and the inputs of past findings in
//! `fuzz/regressions/vfio_user/` — through the same session libFuzzer drives
//! (`rnic_emu::vfio_user::fuzzing`, docs/fuzzing.md), on the stable toolchain.

use std::path::{Path, PathBuf};

fn inputs(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join("vfio_user");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.map(|e| e.expect("directory entry").path()).collect())
        .unwrap_or_default();
    paths.sort();
    paths
}

#[test]
fn every_committed_vfio_user_input_keeps_the_server_in_step() {
    let mut count = 0;
    for path in inputs("corpus").into_iter().chain(inputs("regressions")) {
        let data = std::fs::read(&path).expect("readable input");
        if let Err(panic) = std::panic::catch_unwind(|| rnic_emu::vfio_user::fuzzing::run(&data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{}: {message}", path.display());
        }
        count += 1;
    }
    assert!(count > 0, "the vfio_user target has no committed corpus");
}
