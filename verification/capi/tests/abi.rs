//! ABI stability: the checked-in header `include/rnicvip.h` declares exactly the
//! functions `librnicvip.so` exports, and a C program compiled against the header and
//! linked with the library calls every one of them and gets what the header promises.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo built `librnicvip.so` for this test: `target/<profile>/deps/`, next to the
/// test itself (a test build refreshes that copy, not the one `cargo build` puts in
/// `target/<profile>/`).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    if deps.join("librnicvip.so").exists() {
        deps.to_path_buf()
    } else {
        deps.parent().map(Path::to_path_buf).unwrap()
    }
}

fn header_functions() -> Vec<String> {
    let header = std::fs::read_to_string(crate_dir().join("include/rnicvip.h")).unwrap();
    let mut names: Vec<String> = header
        .lines()
        .filter(|line| !line.trim_start().starts_with("//") && !line.starts_with("typedef"))
        .filter_map(|line| {
            let start = line.find("rnic_vip_")?;
            let rest = &line[start..];
            let end = rest.find('(')?;
            let name = &rest[..end];
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

fn exported_functions() -> Vec<String> {
    let library = library_dir().join("librnicvip.so");
    let output = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&library)
        .output()
        .expect("nm (binutils) runs");
    assert!(output.status.success(), "nm {}", library.display());
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (kind, name) = (parts.nth(1)?, parts.next()?);
            (kind == "T" && name.starts_with("rnic_vip_")).then(|| name.to_string())
        })
        .collect();
    names.sort();
    names
}

#[test]
fn the_header_declares_exactly_the_exported_functions() {
    let declared = header_functions();
    let exported = exported_functions();
    assert!(declared.len() >= 30, "{declared:?}");
    assert_eq!(
        declared, exported,
        "include/rnicvip.h and librnicvip.so differ: regenerate the header (cbindgen, see cbindgen.toml)"
    );
}

#[test]
fn a_c_program_compiled_against_the_header_calls_every_function() {
    let source = crate_dir().join("tests/abi_check.c");
    let program_text = std::fs::read_to_string(&source).unwrap();
    for name in header_functions() {
        assert!(
            program_text.contains(&format!("{name}(")),
            "tests/abi_check.c does not call {name}"
        );
    }
    let out = std::env::temp_dir().join(format!("rnicvip-abi-check-{}", std::process::id()));
    let lib = library_dir();
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(&source)
        .arg(format!("-I{}", crate_dir().join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg("-lrnicvip")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status()
        .expect("a C compiler (cc) runs");
    assert!(status.success(), "abi_check.c does not compile against the header");
    // cargo's LD_LIBRARY_PATH may name `target/<profile>/` first, whose copy can be stale.
    let run = Command::new(&out).env("LD_LIBRARY_PATH", &lib).output().unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(
        run.status.success(),
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stdout).contains("abi_check: ok"));
}
