//! `rnic-bench`: moves RDMA traffic between two embedded rnic NICs and reports what moved,
//! perftest-style. See `rnic-bench --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rnic_hw_model::fabric::FaultPlan;
use rnic_testbench::bench::{self, BenchConfig, Operation};

/// Runs RDMA operations between two embedded NICs connected by an in-process wire, and
/// reports messages, bytes verified, retransmissions and frames. The last line of output
/// with --json is one JSON object.
#[derive(Debug, Parser)]
#[command(name = "rnic-bench", version)]
struct Arguments {
    /// Operation: write, read, send or atomic (fetch-and-add).
    operation: Operation,
    /// Message size in bytes (atomics always move 8).
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Messages per queue pair.
    #[arg(long, default_value_t = 1000)]
    iters: u64,
    /// Queue-pair pairs running at once.
    #[arg(long, default_value_t = 1)]
    qps: usize,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Faults on the wire, e.g. loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,seed=7
    /// (also delay=P, max_delay=10us, window=N).
    #[arg(long, default_value = "none")]
    faults: FaultPlan,
    /// Check every payload byte at the receiver.
    #[arg(long)]
    verify: bool,
    /// Write every frame that crossed the wire to this pcap file (Ethernet link type).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let config = BenchConfig {
        operation: arguments.operation,
        size: arguments.size,
        iterations: arguments.iters,
        queue_pairs: arguments.qps,
        mtu: arguments.mtu,
        faults: arguments.faults,
        verify: arguments.verify,
        capture: arguments.pcap.is_some(),
    };
    let (report, capture) = match bench::run(&config) {
        Ok(outcome) => outcome,
        Err(error) => {
            eprintln!("rnic-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &arguments.pcap {
        if let Err(error) = rnic_testbench::pcap::write_pcap(path, &capture) {
            eprintln!("rnic-bench: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    print!("{}", report.to_text());
    if arguments.json {
        println!("{}", report.to_json());
    }
    if report.messages_failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
