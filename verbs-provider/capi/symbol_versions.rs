// Shared by the build scripts of the C ABI libraries (`include!`d): turns one table of
// version nodes and symbols into the linker's version script and the `.symver` lines
// that give every exported function its version (recipe: a cdylib whose public names are
// renamed to `NAME@@@NODE`; plain names plus a version script come out unversioned with
// rust-lld). One table, so the two can never disagree.
//
// Table format: one node per line, `NODE [< PARENT]: name name …` (names may be
// empty); `#` starts a comment.

/// Reads `table`, writes `version.map` and `symver.rs` into OUT_DIR and tells rustc to
/// link the cdylib with them under `soname`.
fn generate_symbol_versions(table: &str, soname: &str) {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    let path = format!("{manifest}/{table}");
    println!("cargo:rerun-if-changed={path}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut map = String::new();
    let mut symver = String::from("core::arch::global_asm!(\n");
    let mut first = true;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (head, names) = line.split_once(':').unwrap_or_else(|| panic!("{path}: bad line {line:?}"));
        let (node, parent) = match head.split_once('<') {
            Some((node, parent)) => (node.trim(), Some(parent.trim())),
            None => (head.trim(), None),
        };
        map.push_str(&format!("{node} {{\n"));
        let names: Vec<&str> = names.split_whitespace().collect();
        if !names.is_empty() {
            map.push_str("  global:\n");
            for name in &names {
                map.push_str(&format!("    {name};\n"));
                symver.push_str(&format!("    \".symver {name}, {name}@@@{node}\",\n"));
            }
        }
        if first {
            map.push_str("  local: *;\n");
            first = false;
        }
        match parent {
            Some(parent) => map.push_str(&format!("}} {parent};\n")),
            None => map.push_str("};\n"),
        }
    }
    symver.push_str(");\n");
    std::fs::write(format!("{out}/version.map"), map).expect("write version.map");
    std::fs::write(format!("{out}/symver.rs"), symver).expect("write symver.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={out}/version.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // rustc's own export list still names the symbols `.symver @@@` renamed away.
    println!("cargo:rustc-cdylib-link-arg=-Wl,--undefined-version");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
}
