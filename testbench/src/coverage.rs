//! Functional coverage of testbench runs, without a verification session: with
//! `RNIC_COVERAGE=DIR` in the environment, every device the register harness builds and
//! both NICs of an `rnic-bench` run carry the verification IP's coverage collector
//! ([`rnic_vip::coverage::Collector`], an observer on the device's network, QP-state,
//! completion and event ports), and each test writes one coverage file,
//! `DIR/<test binary>.<test name>.json` (a program outside a test: `<program>.<pid>.json`).
//! `rnic-vip coverage merge` and `report` read them (docs/guides/verification.md).
//!
//! Without the variable nothing is attached. Observers only watch: a run with coverage
//! does the same thing, at the same virtual times, as a run without.
//!
//! The devices of one test share one collector (their hits add up; the file counts one
//! run), keyed by the test thread's name, which the Rust test harness sets to the test's
//! name. The file is (re)written whenever one of the test's devices is dropped, so it holds
//! every device that has finished by then; it is written to a temporary name and renamed,
//! so a reader never sees half a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use rnic_hw_model::probe::{Observer, Transaction};
use rnic_hw_model::{Device, Picoseconds};
use rnic_vip::coverage::Collector;

/// The environment variable naming the folder coverage files go to.
pub const ENVIRONMENT: &str = "RNIC_COVERAGE";

/// Writes the shared collector's coverage to its file when the last port observer of one
/// device lets go of it (the device was dropped or its observers were replaced).
#[derive(Debug)]
struct WriteOnDrop {
    collector: Collector,
    path: PathBuf,
}

impl Drop for WriteOnDrop {
    fn drop(&mut self) {
        if let Err(error) = write_atomically(&self.path, &self.collector.coverage().to_json()) {
            eprintln!("{ENVIRONMENT}: {}: {error}", self.path.display());
        }
    }
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let temporary = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)
}

/// One port's observer: the collector, and a share of the device's file writer.
struct PortObserver {
    collector: Collector,
    _writer: Arc<WriteOnDrop>,
}

impl Observer for PortObserver {
    fn observe(&mut self, at: Picoseconds, transaction: &Transaction<'_>) {
        self.collector.observe(at, transaction);
    }
}

/// The coverage file of the calling thread's test (or program) in `folder`.
pub fn file_for_this_test(folder: &Path) -> PathBuf {
    let program = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "program".into());
    // Cargo names test binaries `<target>-<16 hex digits>`: the hash says nothing to a reader.
    let program = match program.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => name.to_string(),
        _ => program,
    };
    let test = match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => std::process::id().to_string(),
    };
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    folder.join(format!("{}.{}.json", clean(&program), clean(&test)))
}

/// Puts the coverage collector of the calling thread's test on `device` when
/// [`ENVIRONMENT`] names a folder (creating it if need be); does nothing otherwise.
pub fn attach_from_environment(device: &mut Device) {
    let Some(folder) = std::env::var_os(ENVIRONMENT).filter(|v| !v.is_empty()) else {
        return;
    };
    let folder = PathBuf::from(folder);
    if let Err(error) = std::fs::create_dir_all(&folder) {
        eprintln!("{ENVIRONMENT}: {}: {error}", folder.display());
        return;
    }
    let path = file_for_this_test(&folder);
    static COLLECTORS: OnceLock<Mutex<BTreeMap<PathBuf, Collector>>> = OnceLock::new();
    let collector = COLLECTORS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path.clone())
        .or_default()
        .clone();
    let writer = Arc::new(WriteOnDrop {
        collector: collector.clone(),
        path,
    });
    collector.attach_with(device, |collector| {
        Box::new(PortObserver {
            collector,
            _writer: writer.clone(),
        })
    });
}
