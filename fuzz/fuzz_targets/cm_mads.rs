//! CM MADs (and the RDMA-CM IP header of their private data) as the connection manager
//! receives them. See `rnic_testbench::fuzzing::cm_mads` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::cm_mads::run(data));
