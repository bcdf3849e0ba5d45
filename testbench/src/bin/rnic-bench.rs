//! `rnic-bench`: moves RDMA traffic between two embedded rnic NICs and reports what moved,
//! perftest-style. See `rnic-bench --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rnic_hw_model::fabric::FaultPlan;
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::timing::TimingParams;
use rnic_testbench::bench::{self, BenchConfig, Mode, Operation};
use rnic_testbench::remote;

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
    /// Bandwidth test: a window of messages outstanding per QP (the default).
    #[arg(long, conflicts_with = "lat")]
    bw: bool,
    /// Latency test: one message outstanding per QP.
    #[arg(long)]
    lat: bool,
    /// Timing preset: hns-100g, hns-25g or ideal (see docs/timing.md).
    #[arg(long, default_value = "hns-100g")]
    preset: String,
    /// TOML file of timing parameters (`preset = "..."` and overrides); replaces --preset.
    #[arg(long)]
    timing_file: Option<PathBuf>,
    /// Override one timing parameter, e.g. --set pcie_lanes=4 (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    overrides: Vec<String>,
    /// Propagation and switch latency of the wire, ns (default: the timing parameters'
    /// `propagation_ps`).
    #[arg(long)]
    link_latency_ns: Option<u64>,
    /// virtual: modelled figures from virtual time; wall: how fast the emulator runs here.
    #[arg(long, default_value = "virtual")]
    mode: Mode,
    /// Print the per-message latency breakdown by pipeline stage.
    #[arg(long)]
    breakdown: bool,
    /// Across processes (perftest's split): the NIC to use, e.g. `vfio-user:/tmp/a.sock` or
    /// `vfio-user:/tmp/a.sock,mac=02:52:4e:49:43:02` (see docs/guides/emulator.md).
    /// Needs --server or --client.
    #[arg(long, requires = "side")]
    device: Option<String>,
    /// Across processes: wait on 127.0.0.1:PORT for the client, serve and verify.
    #[arg(long, group = "side", requires = "device")]
    server: bool,
    /// Across processes: connect to the server on HOST:PORT and drive the traffic.
    #[arg(long, value_name = "HOST", group = "side", requires = "device")]
    client: Option<String>,
    /// Across processes: TCP port of the control connection.
    #[arg(long, default_value_t = rnic_testbench::remote::DEFAULT_PORT)]
    port: u16,
    /// Across processes: the port's IPv4 address; GID 0 becomes ::ffff:IP (needed with
    /// `rnic-emu serve --net udp:IP`: give the same IP).
    #[arg(long, value_name = "IP")]
    ip: Option<std::net::Ipv4Addr>,
    /// Across processes: SEND over UD queue pairs instead of RC (`send` only, --size at
    /// most --mtu).
    #[arg(long, requires = "device")]
    ud: bool,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let (mut timing, mut preset) = match TimingParams::preset(&arguments.preset) {
        Ok(params) => (params, arguments.preset.clone()),
        Err(error) => {
            eprintln!("rnic-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &arguments.timing_file {
        let loaded = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| TimingParams::from_toml(&text).map_err(|e| e.to_string()));
        match loaded {
            Ok(params) => {
                timing = params;
                preset = path.display().to_string();
            }
            Err(error) => {
                eprintln!("rnic-bench: {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    for assignment in &arguments.overrides {
        if let Err(error) = timing.set(assignment) {
            eprintln!("rnic-bench: --set {assignment}: {error}");
            return ExitCode::FAILURE;
        }
    }
    if !arguments.overrides.is_empty() {
        preset.push('+');
    }
    let config = BenchConfig {
        operation: arguments.operation,
        size: arguments.size,
        iterations: arguments.iters,
        queue_pairs: arguments.qps,
        mtu: arguments.mtu,
        faults: arguments.faults,
        verify: arguments.verify,
        capture: arguments.pcap.is_some(),
        timing,
        preset,
        link_latency: arguments
            .link_latency_ns
            .map_or(Picoseconds(timing.propagation_ps), Picoseconds::from_nanos),
        mode: arguments.mode,
        latency_test: arguments.lat && !arguments.bw,
    };
    if let Some(device) = arguments.device.clone() {
        return remote_main(&arguments, config, device);
    }
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
    print!("{}", report.to_table());
    if arguments.breakdown {
        print!("{}", report.breakdown_table());
    }
    if arguments.json {
        println!("{}", report.to_json());
    }
    if report.messages_failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--server` / `--client`: one side of a cross-process run (testbench/src/remote.rs).
fn remote_main(arguments: &Arguments, bench: BenchConfig, device: String) -> ExitCode {
    let role = match &arguments.client {
        Some(host) => remote::Role::Client {
            host: host.clone(),
            port: arguments.port,
        },
        None => remote::Role::Server { port: arguments.port },
    };
    let config = remote::RemoteConfig {
        bench,
        device,
        ipv4: arguments.ip,
        role,
        ud: arguments.ud,
    };
    let report = match remote::run(&config) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("rnic-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.to_text());
    print!("{}", report.to_table());
    if arguments.breakdown {
        print!("{}", report.breakdown_table());
    }
    if arguments.json {
        println!("{}", report.to_json());
    }
    if report.messages_failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
