//! The device's structure, checked from its source: the model is built from blocks with
//! ports, and only the top (`device.rs`) wires them together (docs/architecture.md).
//!
//! This test reads every `.rs` file under `hw-model/src`, finds which top-level module
//! each one names through `crate::…` paths (in `use` lines and in code alike; comments,
//! string literals and `#[cfg(test)]` code are left out), and checks:
//!
//! * no file but `device.rs` (the top) names `Device`, except the fabric, which is the
//!   system around several devices (it instantiates them, as a testbench would), and
//!   `lib.rs`, which re-exports it;
//! * no module imports a module on a higher floor of the pipeline ([`FLOORS`]): blocks call
//!   down, and anything going up is an event the top routes;
//! * the import graph between modules has no cycle.
//!
//! `cargo test -p rnic-hw-model --test structure` prints the graph it read on failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors of the device, from the top down. A module may import modules on its own
/// floor (if that makes no cycle) or below it, never above.
const FLOORS: &[(&str, &[&str])] = &[
    ("the system around devices", &["fabric"]),
    ("the top: wires the blocks together", &["device"]),
    ("requests from the driver", &["firmware", "doorbell"]),
    ("the RoCEv2 engines and the port", &["transport"]),
    ("queue pairs", &["qp"]),
    ("objects and the port", &["srq", "cq", "mpt", "port"]),
    ("events and interrupts", &["eq"]),
    ("context tables and translation", &["hem", "mtt"]),
    (
        "services and formats",
        &[
            "bus",
            "command",
            "config",
            "diagnostics",
            "fast_hash",
            "interrupt",
            "memory",
            "pci",
            "probe",
            "time",
            "timing",
            "wire",
        ],
    ),
];

/// Files that still name `Device` while their block is being moved out of it. Each entry
/// is a debt: the list only shrinks (an entry whose file no longer names `Device` fails
/// the test too, so it is removed when its block lands).
const NOT_YET_BLOCKS: &[&str] = &[];

/// Files allowed to name `Device` for good.
const DEVICE_NAMERS: &[&str] = &["device.rs", "lib.rs", "fabric/mod.rs"];

#[test]
fn only_the_top_names_the_device() {
    let sources = read_sources();
    let namers: BTreeSet<String> = sources
        .iter()
        .filter(|(_, source)| names_device(&source.code))
        .map(|(path, _)| path.clone())
        .collect();
    let mut problems = Vec::new();
    for path in &namers {
        if !DEVICE_NAMERS.contains(&path.as_str()) && !NOT_YET_BLOCKS.contains(&path.as_str()) {
            problems.push(format!(
                "{path} names `Device`: a block takes what it needs through its own interface, and \
                 only device.rs wires blocks together"
            ));
        }
    }
    for path in NOT_YET_BLOCKS {
        if !namers.contains(*path) {
            problems.push(format!(
                "{path} no longer names `Device`: remove it from NOT_YET_BLOCKS in {}",
                file!()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn blocks_import_only_their_own_floor_and_below() {
    let sources = read_sources();
    let floor_of: BTreeMap<&str, usize> = FLOORS
        .iter()
        .enumerate()
        .flat_map(|(floor, (_, modules))| modules.iter().map(move |m| (*m, floor)))
        .collect();
    let mut problems = BTreeSet::new();
    for (path, source) in &sources {
        let from = module_of(path);
        if from == "lib" {
            continue;
        }
        let Some(&from_floor) = floor_of.get(from.as_str()) else {
            problems.insert(format!("{path}: module `{from}` has no floor in FLOORS"));
            continue;
        };
        for to in imported_modules(&source.code) {
            if to == from || (to == "device" && NOT_YET_BLOCKS.contains(&path.as_str())) {
                continue;
            }
            match floor_of.get(to.as_str()) {
                None => {
                    problems.insert(format!("{path} imports `crate::{to}`, which has no floor in FLOORS"));
                }
                Some(&to_floor) if to_floor < from_floor => {
                    problems.insert(format!(
                        "{path} ({}) imports crate::{to} ({}), a floor above it: what goes up is an \
                         event the top routes",
                        FLOORS[from_floor].0, FLOORS[to_floor].0
                    ));
                }
                Some(_) => {}
            }
        }
    }
    let problems: Vec<String> = problems.into_iter().collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_module_graph_has_no_cycle() {
    let sources = read_sources();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut witness: BTreeMap<(String, String), String> = BTreeMap::new();
    for (path, source) in &sources {
        let from = module_of(path);
        if from == "lib" {
            continue;
        }
        let edges = graph.entry(from.clone()).or_default();
        for to in imported_modules(&source.code) {
            if to == from || (to == "device" && NOT_YET_BLOCKS.contains(&path.as_str())) {
                continue;
            }
            edges.insert(to.clone());
            witness.entry((from.clone(), to)).or_insert_with(|| path.clone());
        }
    }
    let cycles = strongly_connected(&graph);
    let described: Vec<String> = cycles
        .iter()
        .map(|members| {
            let arrows: Vec<String> = members
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| members.contains(*to))
                        .map(|to| format!("{} -> {to}", witness[&(from.clone(), to.clone())]))
                        .collect::<Vec<_>>()
                })
                .collect();
            format!("cycle {members:?}: {}", arrows.join(", "))
        })
        .collect();
    assert!(described.is_empty(), "{}\ngraph: {graph:#?}", described.join("\n"));
}

#[test]
fn the_reader_finds_imports_and_ignores_comments_strings_and_tests() {
    let code = strip(concat!(
        "use crate::cq::{Cq, CqError};\n",
        "use crate::{eq::{self, Eq}, hem};\n",
        "// use crate::qp::Qp;\n",
        "/// [`crate::srq`]\n",
        "let s = \"crate::mpt Device\";\n",
        "fn f() { crate::mtt::translate(); let c = 'x'; }\n",
        "impl Device {}\n",
        "#[cfg(test)]\n",
        "mod tests {\n",
        "    use crate::transport::Transport;\n",
        "    fn g() { if true { } }\n",
        "}\n",
        "use crate::timing;\n",
    ));
    let modules: BTreeSet<String> = imported_modules(&code).into_iter().collect();
    let expected: BTreeSet<String> = ["cq", "eq", "hem", "mtt", "timing"].map(String::from).into();
    assert_eq!(modules, expected);
    assert!(names_device(&code));
    assert!(!names_device(&strip(
        "use crate::config::DeviceConfig; struct DeviceId;"
    )));
}

// ---- reading the sources ------------------------------------------------------------------

struct Source {
    /// The file's code without comments, string and character literals and test code.
    code: String,
}

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every non-test source file, by path relative to `src/`.
fn read_sources() -> BTreeMap<String, Source> {
    let root = source_root();
    let mut files = Vec::new();
    collect(&root, &mut files);
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        texts.insert(relative, std::fs::read_to_string(&file).unwrap());
    }
    let test_files = test_only_files(&texts);
    texts
        .into_iter()
        .filter(|(path, _)| !test_files.contains(path))
        .map(|(path, text)| (path, Source { code: strip(&text) }))
        .collect()
}

fn collect(directory: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(directory)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files that are modules declared under `#[cfg(test)]` (and everything below them).
fn test_only_files(texts: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut test_modules = BTreeSet::new();
    for (path, text) in texts {
        let directory = match path.rsplit_once('/') {
            Some((dir, "mod.rs")) => format!("{dir}/"),
            Some((dir, file)) => format!("{dir}/{}/", file.trim_end_matches(".rs")),
            None if path == "lib.rs" => String::new(),
            None => format!("{}/", path.trim_end_matches(".rs")),
        };
        let mut in_test_attributes = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with("#[cfg(test)]") {
                in_test_attributes = true;
                continue;
            }
            if in_test_attributes && line.starts_with("#[") {
                continue;
            }
            if in_test_attributes {
                if let Some(name) = declared_module(line) {
                    test_modules.insert(format!("{directory}{name}"));
                }
            }
            in_test_attributes = false;
        }
    }
    texts
        .keys()
        .filter(|path| {
            test_modules.iter().any(|module| {
                path.as_str() == format!("{module}.rs")
                    || path.as_str() == format!("{module}/mod.rs")
                    || path.starts_with(&format!("{module}/"))
            })
        })
        .cloned()
        .collect()
}

/// `mod NAME;` (any visibility) → NAME.
fn declared_module(line: &str) -> Option<&str> {
    let rest = line.split_once("mod ")?.1;
    let prefix = line.split_once("mod ")?.0.trim();
    if !(prefix.is_empty() || prefix.starts_with("pub")) {
        return None;
    }
    rest.strip_suffix(';').map(str::trim)
}

/// The code of a file without comments, string and character literals, and without the
/// items under `#[cfg(test)]` (test modules inside the file).
fn strip(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < bytes.len() && bytes[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == '*' && bytes[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '"' || (c == 'r' && (next == Some('"') || next == Some('#'))) {
            // A (raw) string literal.
            let raw = c == 'r';
            let mut hashes = 0;
            i += 1;
            if raw {
                while bytes.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if bytes.get(i) != Some(&'"') {
                    code.push('r');
                    continue;
                }
                i += 1;
            }
            while i < bytes.len() {
                if !raw && bytes[i] == '\\' {
                    i += 2;
                    continue;
                }
                if bytes[i] == '"' && (0..hashes).all(|k| bytes.get(i + 1 + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            code.push_str("\"\"");
        } else if c == '\''
            && (bytes.get(i + 2) == Some(&'\'') || (next == Some('\\') && bytes.get(i + 3) == Some(&'\'')))
        {
            // A character literal (lifetimes have no closing quote two or three on).
            i += if next == Some('\\') { 4 } else { 3 };
            code.push_str("' '");
        } else {
            code.push(c);
            i += 1;
        }
    }
    remove_test_items(&code)
}

/// Drops each `#[cfg(test)]` item with its braces.
fn remove_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // The item ends at its `;` (a declaration) or at the brace closing its body.
        let mut depth = 0usize;
        let mut end = after.len();
        for (k, ch) in after.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The top-level module of a file (`cq/mod.rs` → `cq`, `device.rs` → `device`).
fn module_of(path: &str) -> String {
    path.split('/').next().unwrap().trim_end_matches(".rs").to_string()
}

/// Every top-level module named by a `crate::` path, including `use crate::{a, b::c}`.
fn imported_modules(code: &str) -> Vec<String> {
    let mut modules = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group, each led by its module's name.
            let mut depth = 0usize;
            let mut item = String::new();
            let mut items = Vec::new();
            for ch in group.chars() {
                match ch {
                    '}' if depth == 0 => break,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    '{' => {
                        depth += 1;
                        item.push(ch);
                    }
                    '}' => {
                        depth -= 1;
                        item.push(ch);
                    }
                    _ => item.push(ch),
                }
            }
            items.push(item);
            for item in items {
                let word: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !word.is_empty() {
                    modules.push(word);
                }
            }
        } else {
            let word: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !word.is_empty() {
                modules.push(word);
            }
        }
    }
    // `crate::Device` and the other re-exports at the root are the modules they come from.
    modules
        .into_iter()
        .map(|m| match m.as_str() {
            "Device" | "Counters" => "device".to_string(),
            "DeviceConfig" => "config".to_string(),
            "HostMemory" | "HostMemoryExt" | "MemoryError" | "PagedMemory" => "memory".to_string(),
            "Picoseconds" => "time".to_string(),
            _ => m,
        })
        .collect()
}

/// Whether the code names the type `Device` (not `DeviceConfig`, `DeviceId`, …).
fn names_device(code: &str) -> bool {
    let mut rest = code;
    while let Some(at) = rest.find("Device") {
        let before = rest[..at].chars().next_back();
        let after = rest[at + "Device".len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !ident(before) && !ident(after) {
            return true;
        }
        rest = &rest[at + "Device".len()..];
    }
    false
}

/// The strongly connected components of more than one module (Tarjan).
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        components: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a str) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        if let Some(edges) = state.graph.get(node) {
            for to in edges {
                let to = to.as_str();
                if !state.index.contains_key(to) {
                    visit(state, to);
                    let low = state.low[node].min(state.low[to]);
                    state.low.insert(node, low);
                } else if state.on_stack.contains(to) {
                    let low = state.low[node].min(state.index[to]);
                    state.low.insert(node, low);
                }
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.insert(member.to_string());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                state.components.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        components: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.components
}
