//! What storage benchmarks share, whatever the protocol (NVMe-oF now, SRP later): a
//! latency histogram and the report format (a table for people, one JSON object for
//! scripts, a progress line for long runs).

pub mod histogram;
pub mod report;

pub use histogram::LatencyHistogram;
pub use report::{PerfReport, ProgressLine};
