//! # rnic-testbench — verification harness and benchmarks
//!
//! [`harness::RegisterHarness`] drives the device model through its registers with a
//! minimal driver written from `docs/register-map.md`, independent of `verbs-provider`,
//! so verification tests can misbehave on purpose and check the device's answers. The
//! random-stimulus scoreboard, fault plans and `rnic-bench` come with the transport and
//! timing issues. [`pcap`] writes what went over the fabric as pcap files; [`coverage`]
//! writes functional coverage of a run when `RNIC_COVERAGE` asks for it.
#![warn(missing_docs)]

pub mod bench;
mod cm_session;
pub mod coverage;
pub mod frame_floor;
pub mod fuzzing;
pub mod harness;
pub mod pcap;
pub mod perftest;
mod perftest_cm;
pub mod pingpong;
pub mod recording;
pub mod remote;
pub mod udp_baseline;
