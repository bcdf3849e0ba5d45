//! The report of a storage benchmark run: what ran, what it did, how fast, how long
//! each I/O took. `to_table` for people (fio/spdk_nvme_perf-shaped), `to_json` for
//! scripts (one object on one line), and a progress line for long runs.

use std::fmt::Write as _;

use serde::Serialize;

use super::histogram::LatencyHistogram;

/// Latency figures, µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl LatencySummary {
    /// The figures of `histogram` (recorded in ns).
    pub fn of(histogram: &LatencyHistogram) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        Self {
            min: us(histogram.min()),
            mean: histogram.mean() / 1000.0,
            p50: us(histogram.quantile(0.5)),
            p99: us(histogram.quantile(0.99)),
            p999: us(histogram.quantile(0.999)),
            max: us(histogram.max()),
        }
    }
}

/// One benchmark run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PerfReport {
    /// Protocol ("nvmf", "srp").
    pub protocol: String,
    /// Workload: "randread", "randwrite", "randrw", "read", "write", "rw".
    pub workload: String,
    /// I/O size, bytes.
    pub io_size: u32,
    /// Outstanding I/Os per queue.
    pub queue_depth: usize,
    /// Queues driven.
    pub queues: usize,
    /// Percentage of reads.
    pub read_percent: u8,
    /// Which clock the figures come from: "virtual" or "wall".
    pub mode: String,
    /// Timing preset of the modelled NICs (virtual mode), or "".
    pub preset: String,
    /// I/Os completed successfully.
    pub ios: u64,
    /// Reads among them.
    pub reads: u64,
    /// Writes among them.
    pub writes: u64,
    /// I/Os that completed with an error status.
    pub errors: u64,
    /// Reads whose data was checked against what was written.
    pub verified_reads: u64,
    /// Reads whose data was wrong.
    pub verify_failures: u64,
    /// Bytes moved by the successful I/Os.
    pub bytes: u64,
    /// Seconds on the report's clock.
    pub elapsed_s: f64,
    /// Wall-clock seconds of the run, whatever the mode.
    pub wall_s: f64,
    /// CPU seconds the running thread used during the run (in an embedded run the host,
    /// the target and the modelled NICs all run on it): the run's cost, whatever share
    /// of the CPUs a loaded machine gave it. 0 where the platform does not say.
    pub cpu_s: f64,
    /// I/Os per second.
    pub iops: f64,
    /// Megabytes (10^6) per second.
    pub bandwidth_mb_s: f64,
    /// Gigabits per second.
    pub bandwidth_gbps: f64,
    /// Per-I/O latency, µs.
    pub latency_us: LatencySummary,
    /// Reconnections during the run.
    pub reconnects: u64,
    /// RDMA messages per I/O (command, data, response).
    pub messages_per_io: f64,
    /// Extra figures a front end adds (name, value).
    pub extra: Vec<(String, f64)>,
    /// Failures worth reading (the first few).
    pub failures: Vec<String>,
}

impl PerfReport {
    /// Fills the rates from `ios`, `bytes` and `elapsed_s`, and the latency figures.
    pub fn finish(&mut self, histogram: &LatencyHistogram) {
        if self.elapsed_s > 0.0 {
            self.iops = self.ios as f64 / self.elapsed_s;
            self.bandwidth_mb_s = self.bytes as f64 / self.elapsed_s / 1e6;
            self.bandwidth_gbps = self.bytes as f64 * 8.0 / self.elapsed_s / 1e9;
        }
        self.latency_us = LatencySummary::of(histogram);
    }

    /// One JSON object on one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The table: a title line, column names and one row, then extra figures and failures.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# {} {} {} B, QD {} x {} queue(s), {}% reads, {} mode{}",
            self.protocol,
            self.workload,
            self.io_size,
            self.queue_depth,
            self.queues,
            self.read_percent,
            self.mode,
            if self.preset.is_empty() {
                String::new()
            } else {
                format!(", preset {}", self.preset)
            }
        );
        let _ = writeln!(
            out,
            " {:>10} {:>12} {:>11} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>7} {:>8}",
            "IOPS",
            "MB/s",
            "Gb/s",
            "avg[us]",
            "p50[us]",
            "p99[us]",
            "p99.9[us]",
            "max[us]",
            "ios",
            "errors",
            "verified"
        );
        let l = &self.latency_us;
        let _ = writeln!(
            out,
            " {:>10.0} {:>12.2} {:>11.3} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>11.2} {:>10} {:>7} {:>8}",
            self.iops,
            self.bandwidth_mb_s,
            self.bandwidth_gbps,
            l.mean,
            l.p50,
            l.p99,
            l.p999,
            l.max,
            self.ios,
            self.errors + self.verify_failures,
            self.verified_reads
        );
        for (name, value) in &self.extra {
            let _ = writeln!(out, "# {name}: {value:.4}");
        }
        for failure in &self.failures {
            let _ = writeln!(out, "failure: {failure}");
        }
        out
    }
}

/// A progress line for a terminal: rewritten in place with `\r`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgressLine {
    /// I/Os so far.
    pub ios: u64,
    /// Fraction done (0..=1), when known.
    pub fraction: Option<f64>,
    /// Seconds on the report's clock so far.
    pub elapsed_s: f64,
    /// I/Os per second so far.
    pub iops: f64,
    /// Errors so far.
    pub errors: u64,
}

impl ProgressLine {
    /// The line, without a newline.
    pub fn render(&self) -> String {
        let done = self
            .fraction
            .map_or(String::new(), |f| format!("{:5.1}% ", f.clamp(0.0, 1.0) * 100.0));
        format!(
            "\r{done}{} I/Os, {:.3} s, {:.0} IOPS, {} errors   ",
            self.ios, self.elapsed_s, self.iops, self.errors
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_formats() {
        let mut h = LatencyHistogram::new();
        for i in 1..=100 {
            h.record(i * 1000);
        }
        let mut report = PerfReport {
            protocol: "nvmf".into(),
            workload: "randread".into(),
            io_size: 4096,
            queue_depth: 32,
            queues: 1,
            read_percent: 100,
            mode: "virtual".into(),
            ios: 1000,
            reads: 1000,
            bytes: 4_096_000,
            elapsed_s: 0.5,
            ..PerfReport::default()
        };
        report.finish(&h);
        assert_eq!(report.iops, 2000.0);
        assert!((report.bandwidth_mb_s - 8.192).abs() < 1e-9);
        assert!((report.latency_us.p50 - 50.0).abs() < 1.0);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["iops"], 2000.0);
        assert_eq!(json["latency_us"]["p50"].as_f64().map(|v| v.round()), Some(50.0));
        let table = report.to_table();
        assert!(table.contains("randread 4096 B, QD 32"));
        assert!(table.lines().count() >= 3);
        assert!(ProgressLine {
            ios: 5,
            fraction: Some(0.5),
            ..ProgressLine::default()
        }
        .render()
        .contains(" 50.0% 5 I/Os"));
    }
}
