//! Links libmlx5.so with its version nodes (symbols.txt) and SONAME libmlx5.so.1.
include!("../symbol_versions.rs");

fn main() {
    generate_symbol_versions("symbols.txt", "libmlx5.so.1");
}
