//! Received frames against a device with live QPs (responder, completer, atomics, READ responses).
//! See `rnic_testbench::fuzzing::rx_frames` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::rx_frames::run(data));
