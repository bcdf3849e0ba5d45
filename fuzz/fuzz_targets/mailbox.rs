//! Mailbox contexts (QPC/CQC/SRQC/MPT/EQC) with masks from a hostile driver.
//! See `rnic_testbench::fuzzing::mailbox` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_testbench::fuzzing::mailbox::run(data));
