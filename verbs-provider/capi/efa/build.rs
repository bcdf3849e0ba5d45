//! Links libefa.so with its version nodes (symbols.txt) and SONAME libefa.so.1.
include!("../symbol_versions.rs");

fn main() {
    generate_symbol_versions("symbols.txt", "libefa.so.1");
}
