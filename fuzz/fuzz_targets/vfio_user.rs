//! vfio-user messages (any bytes, descriptors, hang-ups) against the server.
//! See `rnic_emu::vfio_user::fuzzing` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_emu::vfio_user::fuzzing::run(data));
