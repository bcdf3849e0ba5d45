//! NVMe-oF command capsules, SQEs, SGL descriptors, Connect data and CM private data as a
//! target receives them. See `rnic_storage::fuzzing::nvme_capsules` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rnic_storage::fuzzing::nvme_capsules(data));
