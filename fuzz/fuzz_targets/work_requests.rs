//! WQEs and SGE lists from a hostile application, on loopback QPs.
//! See `rnic_testbench::fuzzing::work_requests` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::work_requests::run(data));
