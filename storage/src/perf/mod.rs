//! What storage benchmarks share, whatever the protocol (NVMe-oF now, SRP later): a
//! latency histogram and the report format (a table for people, one JSON object for
//! scripts, a progress line for long runs).

pub mod histogram;
pub mod report;

pub use histogram::LatencyHistogram;
pub use report::{PerfReport, ProgressLine};

/// CPU seconds the calling thread has used so far (0 where the platform does not say):
/// differences of two readings are what a stretch of work cost on a shared machine.
pub fn thread_cpu_seconds() -> f64 {
    rnic_os::thread_cpu_time().map_or(0.0, |time| time.as_secs_f64())
}
