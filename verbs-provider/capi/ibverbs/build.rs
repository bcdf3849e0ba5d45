//! Links `libibverbs.so` with rdma-core's version nodes (symbols.txt) and SONAME
//! `libibverbs.so.1`.
include!("../symbol_versions.rs");

fn main() {
    generate_symbol_versions("symbols.txt", "libibverbs.so.1");
}
