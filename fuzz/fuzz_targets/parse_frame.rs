//! `wire::parse_frame` on any bytes, as they are and with their checksums made right.
//! See `rnic_testbench::fuzzing::parse_frame` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::parse_frame::run(data));
