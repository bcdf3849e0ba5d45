//! Command-queue descriptor chains from a hostile driver.
//! See `rnic_testbench::fuzzing::cmdq` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::cmdq::run(data));
