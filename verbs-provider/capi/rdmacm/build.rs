//! Links librdmacm.so with its version nodes (symbols.txt) and SONAME librdmacm.so.1.
include!("../symbol_versions.rs");

fn main() {
    generate_symbol_versions("symbols.txt", "librdmacm.so.1");
}
