//! Doorbell and BAR access sequences from a hostile driver.
//! See `rnic_testbench::fuzzing::bar_access` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::bar_access::run(data));
