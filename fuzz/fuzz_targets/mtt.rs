//! MTT and BT (context-table) walks against reference walks.
//! See `rnic_testbench::fuzzing::mtt` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::mtt::run(data));
