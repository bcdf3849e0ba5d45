//! SRP information units and login requests as a target receives them.
//! See `rnic_storage::fuzzing::srp_ius` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_storage::fuzzing::srp_ius(data));
