//! `rnic-bench`: moves RDMA traffic between two embedded rnic NICs and reports what moved,
//! perftest-style. See `rnic-bench --help`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rnic_hw_model::fabric::FaultPlan;
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::timing::TimingParams;
use rnic_testbench::bench::{self, BenchConfig, BenchReport, Mode, Operation};
use rnic_testbench::{perftest, pingpong, remote};

/// Runs RDMA operations between two embedded NICs connected by an in-process wire, and
/// reports messages, bytes verified, retransmissions and frames. The last line of output
/// with --json is one JSON object. Without an operation: a short sweep of message sizes
/// 2 B..8 MiB for write, read and send in virtual and wall mode, one table per operation
/// and mode. Exit status: 0 when every message moved and none failed; 3 when nothing failed
/// but some messages only the peer can confirm (--peer perftest --lat as client: the last
/// WRITE's ACK lost after ib_write_lat had left); 1 otherwise.
#[derive(Debug, Parser)]
#[command(name = "rnic-bench", version)]
struct Arguments {
    /// Operation: write, read, send, atomic (fetch-and-add) or mixed. Absent: the sweep.
    operation: Option<Operation>,
    /// Message size in bytes (atomics always move 8) [default: 4096].
    #[arg(long)]
    size: Option<usize>,
    /// Messages per queue pair [default: 1000].
    #[arg(long)]
    iters: Option<u64>,
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
    /// Write a trace of both NICs' pipeline stages over the measured span to this file: a
    /// FILE ending in .vcd gets VCD (waveform viewers; scopes device_1 = requester,
    /// device_2 = responder), any other the Chrome/Perfetto JSON format (ui.perfetto.dev;
    /// requester = process 1, responder = process 2). Per stage its slices add up to the
    /// --breakdown figures. Repeat it for both formats of the same run.
    #[arg(long, value_name = "FILE")]
    trace: Vec<PathBuf>,
    /// Record the run (its configuration, every frame and CQE of both NICs with virtual
    /// times, the report's JSON) to this file, as JSON lines; virtual mode.
    #[arg(long, conflicts_with = "replay")]
    record: Option<PathBuf>,
    /// Replay a recording made with --record and the same other options: run again and
    /// fail at the first line that differs.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// Bandwidth test: a window of messages outstanding per QP (the default).
    #[arg(long, conflicts_with = "lat")]
    bw: bool,
    /// Latency test: one message outstanding per QP.
    #[arg(long)]
    lat: bool,
    /// Messages kept outstanding per QP in a bandwidth test (perftest --tx-depth; perftest's
    /// own default is 128).
    #[arg(long, default_value_t = bench::WINDOW)]
    tx_depth: usize,
    /// Ask for a completion on one send in N, and on the last (perftest --cq-mod; perftest's
    /// own default is 100). 1: every send completes on its own.
    #[arg(long, default_value_t = 1)]
    cq_mod: u64,
    /// Every message of a QP uses the same buffer bytes, as perftest's bandwidth tests do;
    /// by default each outstanding message has a buffer of its own. Not with --verify or
    /// --pcap.
    #[arg(long)]
    single_buffer: bool,
    /// WRITEs and SENDs of at most N bytes are posted inline, in the WQE (perftest
    /// --inline_size; ib_send_lat's default is 188 on hns-class NICs) [default: 0, none].
    #[arg(long, default_value_t = 0)]
    inline_size: u32,
    /// Both NICs offer direct WQE: a post of one WQE hands it to the NIC with the doorbell,
    /// so there is no WQE fetch (hns HIP09).
    #[arg(long)]
    direct_wqe: bool,
    /// Timing preset: hns-100g, hns-25g, hns-100g-b2b or ideal (see docs/timing.md)
    /// [default: hns-100g].
    #[arg(long)]
    preset: Option<String>,
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
    /// virtual: modelled figures from virtual time; wall: how fast the emulator runs here
    /// [default: virtual; the sweep runs both unless given].
    #[arg(long)]
    mode: Option<Mode>,
    /// Print the per-message latency breakdown by pipeline stage.
    #[arg(long)]
    breakdown: bool,
    /// Across processes (perftest's split): the NIC to use, e.g. `vfio-user:/tmp/a.sock` or
    /// `vfio-user:/tmp/a.sock,mac=02:52:4e:49:43:02` (an `rnic-emu serve` socket), or `pci`,
    /// `pci:0000:00:04.0`, `pci,mac=02:52:4e:49:43:02` (an rnic PCI function under Linux, e.g.
    /// in a QEMU guest: needs root and 2 MiB huge pages, polls for completions; see
    /// docs/guides/emulator.md). Needs --server or --client.
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
    /// Across processes: who the other side is. `rnic-bench` (the default): rnic-bench's own
    /// control protocol. `perftest`: an unmodified perftest (ib_write_bw, ib_read_bw,
    /// ib_send_bw [-c UD], ib_atomic_bw, ib_write_lat with `--lat`) on another host; the
    /// server then listens on every address (docs/guides/interop.md). `pingpong`:
    /// `ibv_rc_pingpong` (operation `send`; same --size/-s, --iters/-n, --mtu/-m on both).
    #[arg(long, value_enum, default_value_t = Peer::RnicBench, requires = "device")]
    peer: Peer,
    /// With --peer perftest: our GID table entry (0 = ::ffff:IP with --ip, else the
    /// link-local GID; the link-local one is 1 with --ip).
    #[arg(long, default_value_t = 0)]
    gid_index: u8,
    /// Connect the queue pairs through the connection manager (IB CM on QP1 with RDMA-CM
    /// addressing, as rdma_cm does) instead of programming both ends directly.
    #[arg(long)]
    cm: bool,
    /// With --peer perftest: the peer's MAC, needed when its GID is not link-local
    /// (perftest does not exchange MACs), e.g. 52:54:00:12:34:56.
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    peer_mac: Option<[u8; 6]>,
    /// Measure the host's raw UDP loopback limit at this datagram size instead (200 000
    /// datagrams to a receiver thread on 127.0.0.2, as the shared `udp_pps` baseline), for
    /// ratios against the cross-process figures of the same run; prints one line (with
    /// --json one object).
    #[arg(long, value_name = "SIZE", conflicts_with_all = ["device", "operation"])]
    udp_baseline: Option<usize>,
}

/// The program on the other end of `--server`/`--client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Peer {
    /// Another rnic-bench.
    RnicBench,
    /// perftest 4.5-0.17's out-of-band exchange.
    Perftest,
    /// ibverbs-utils' `ibv_rc_pingpong` (operation `send`).
    Pingpong,
}

fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    rnic_verbs::backend::vfio_user::parse_mac(text).ok_or_else(|| format!("bad MAC address {text:?}"))
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    if let Some(size) = arguments.udp_baseline {
        let receiver = std::net::SocketAddr::from(rnic_testbench::udp_baseline::RECEIVER);
        return match rnic_testbench::udp_baseline::run(size, 200_000, receiver) {
            Ok(b) if arguments.json => {
                println!(
                    "{{\"udp_baseline\":{{\"size\":{},\"sent\":{},\"received\":{},\"send_gbps\":{:.3},\"receive_gbps\":{:.3},\"receive_pps\":{:.0}}}}}",
                    b.size, b.sent, b.received, b.send_gbps, b.receive_gbps, b.receive_pps
                );
                ExitCode::SUCCESS
            }
            Ok(b) => {
                println!(
                    "raw UDP loopback, {} B datagrams: sent {} at {:.2} Gb/s; received {} at {:.2} Gb/s ({:.0} datagrams/s)",
                    b.size, b.sent, b.send_gbps, b.received, b.receive_gbps, b.receive_pps
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("rnic-bench: UDP baseline: {error}");
                ExitCode::FAILURE
            }
        };
    }
    if arguments.device.is_some() {
        if let Some(flags) = timing_only_flags(&arguments) {
            eprintln!(
                "rnic-bench: {flags} only apply to the in-process bench: across processes the timing is the \
                 emulators' (rnic-emu serve --timing), and the client reports wall-clock figures"
            );
            return ExitCode::FAILURE;
        }
    }
    let preset_name = arguments.preset.clone().unwrap_or_else(|| "hns-100g".to_string());
    let (mut timing, mut preset) = match TimingParams::preset(&preset_name) {
        Ok(params) => (params, preset_name),
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
        operation: arguments.operation.unwrap_or(Operation::Write),
        size: arguments.size.unwrap_or(4096),
        iterations: arguments.iters.unwrap_or(1000),
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
        mode: arguments.mode.unwrap_or(Mode::Virtual),
        latency_test: arguments.lat && !arguments.bw,
        tx_depth: arguments.tx_depth,
        cq_moderation: arguments.cq_mod,
        single_buffer: arguments.single_buffer,
        connection_manager: arguments.cm,
        trace: !arguments.trace.is_empty(),
        record: arguments.record.is_some() || arguments.replay.is_some(),
        inline_size: arguments.inline_size,
        direct_wqe: arguments.direct_wqe,
    };
    if arguments.operation.is_none() {
        if arguments.device.is_some() {
            eprintln!("rnic-bench: --device needs an operation (write, read, send or atomic)");
            return ExitCode::FAILURE;
        }
        if !arguments.trace.is_empty() || config.record {
            eprintln!("rnic-bench: --trace, --record and --replay need an operation (the sweep makes many runs)");
            return ExitCode::FAILURE;
        }
        return sweep_main(&arguments, config);
    }
    if arguments.device.is_some() && (!arguments.trace.is_empty() || config.record) {
        eprintln!("rnic-bench: --trace, --record and --replay are of the in-process NICs: not with --device");
        return ExitCode::FAILURE;
    }
    if let Some(path) = &arguments.replay {
        let recorded = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("rnic-bench: {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        };
        return match rnic_testbench::recording::replay(&config, &recorded) {
            Ok(lines) => {
                println!("{}: {lines} lines replayed identically", path.display());
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("rnic-bench: {}: {error}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    if let Some(device) = arguments.device.clone() {
        match arguments.peer {
            Peer::Perftest => return perftest_main(&arguments, config, device),
            Peer::Pingpong => return pingpong_main(&arguments, config, device),
            Peer::RnicBench => {}
        }
        return remote_main(&arguments, config, device);
    }
    let outcome = bench::run_with_progress(&config, &mut progress_line(&config));
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K");
    }
    if let (Ok((_, capture)), Some(path)) = (&outcome, &arguments.pcap) {
        if let Err(error) = rnic_testbench::pcap::write_pcap(path, capture) {
            eprintln!("rnic-bench: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let (Ok((report, _)), Some(path)) = (&outcome, &arguments.record) {
        if let Err(error) = std::fs::write(path, rnic_testbench::recording::recording_text(&config, report)) {
            eprintln!("rnic-bench: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Ok((report, _)) = &outcome {
        for path in &arguments.trace {
            let vcd = path
                .extension()
                .is_some_and(|extension| extension.eq_ignore_ascii_case("vcd"));
            let text = if vcd { report.trace_vcd() } else { report.trace_json() };
            if let Err(error) = std::fs::write(path, text.unwrap_or_default()) {
                eprintln!("rnic-bench: writing {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    finish(&arguments, outcome.map(|(report, _)| report), true)
}

/// A progress reporter for one in-process run: on a terminal, a line on stderr rewritten
/// at most five times a second once the run has taken a second (short runs print nothing);
/// elsewhere nothing. The caller erases the line when the run is over.
fn progress_line(config: &BenchConfig) -> impl FnMut(bench::Progress) {
    let terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut last = started;
    let operation = config.operation.name();
    let size = config.size;
    move |progress: bench::Progress| {
        if !terminal {
            return;
        }
        let now = std::time::Instant::now();
        if now.duration_since(started).as_secs_f64() < 1.0 || now.duration_since(last).as_secs_f64() < 0.2 {
            return;
        }
        last = now;
        eprint!(
            "\r\x1b[Krnic-bench: {operation} {size} B: {}/{} messages, {:.3} ms virtual, {:.1} s",
            progress.done,
            progress.expected,
            progress.sim_time.0 as f64 * 1e-9,
            now.duration_since(started).as_secs_f64()
        );
    }
}

/// `--server` / `--client`: one side of a cross-process run (testbench/src/remote.rs).
fn remote_main(arguments: &Arguments, bench: BenchConfig, device: String) -> ExitCode {
    let role = role(arguments);
    let config = remote::RemoteConfig {
        bench,
        device,
        ipv4: arguments.ip,
        role,
        ud: arguments.ud,
    };
    finish(arguments, remote::run(&config), true)
}

/// `--peer perftest`: one side against an unmodified perftest (testbench/src/perftest.rs).
fn perftest_main(arguments: &Arguments, bench: BenchConfig, device: String) -> ExitCode {
    let role = role(arguments);
    let outcome = perftest::Test::new(bench.operation, arguments.ud, arguments.lat).and_then(|test| {
        let config = perftest::PerftestConfig {
            bench,
            test,
            gid_index: arguments.gid_index,
            peer_mac: arguments.peer_mac,
        };
        perftest::run(&config, &device, arguments.ip, &role)
    });
    finish(arguments, outcome, false)
}

/// `--peer pingpong`: one side against an unmodified ibv_rc_pingpong (testbench/src/pingpong.rs).
fn pingpong_main(arguments: &Arguments, bench: BenchConfig, device: String) -> ExitCode {
    if arguments.ud || arguments.lat {
        eprintln!("rnic-bench: ibv_rc_pingpong is RC SEND ping-pong: no --ud or --lat");
        return ExitCode::FAILURE;
    }
    let role = role(arguments);
    let config = pingpong::PingpongConfig {
        bench,
        gid_index: arguments.gid_index,
        peer_mac: arguments.peer_mac,
    };
    finish(arguments, pingpong::run(&config, &device, arguments.ip, &role), false)
}

/// The cross-process role: `--client HOST` or, without it, the server.
fn role(arguments: &Arguments) -> remote::Role {
    match &arguments.client {
        Some(host) => remote::Role::Client {
            host: host.clone(),
            port: arguments.port,
        },
        None => remote::Role::Server { port: arguments.port },
    }
}

/// Prints a run's outcome (its text, which lists the failures; with `table` the
/// perftest-shaped table and `--breakdown`; `--json`) and turns it into the exit code:
/// success only when every message asked for moved and was ok ([`BenchReport::verdict`]),
/// [`UNCONFIRMED`] when only the peer can settle the rest.
fn finish(arguments: &Arguments, outcome: Result<BenchReport, impl std::fmt::Display>, table: bool) -> ExitCode {
    let report = match outcome {
        Ok(report) => report,
        Err(error) => {
            eprintln!("rnic-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.to_text());
    if table {
        print!("{}", report.to_table());
        if arguments.breakdown {
            print!("{}", report.breakdown_table());
        }
    }
    if arguments.json {
        println!("{}", report.to_json());
    }
    match report.verdict() {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("rnic-bench: {why}");
            if report.awaits_peer_confirmation() {
                ExitCode::from(UNCONFIRMED)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Exit status of a run where nothing failed but some messages await the peer's
/// confirmation ([`BenchReport::awaits_peer_confirmation`]).
const UNCONFIRMED: u8 = 3;

/// The timing-only flags given on the command line, for the error across processes.
fn timing_only_flags(arguments: &Arguments) -> Option<String> {
    let flags: Vec<&str> = [
        ("--preset", arguments.preset.is_some()),
        ("--timing-file", arguments.timing_file.is_some()),
        ("--set", !arguments.overrides.is_empty()),
        ("--link-latency-ns", arguments.link_latency_ns.is_some()),
        ("--mode", arguments.mode.is_some()),
        // `ib_write_lat` is a perftest program of its own.
        ("--lat", arguments.lat && arguments.peer == Peer::RnicBench),
        ("--bw", arguments.bw),
        ("--breakdown", arguments.breakdown),
        // The split run keeps its own lockstep batches with one buffer per message.
        ("--tx-depth", arguments.tx_depth != bench::WINDOW),
        ("--cq-mod", arguments.cq_mod != 1),
        ("--single-buffer", arguments.single_buffer),
        ("--inline-size", arguments.inline_size != 0),
        ("--direct-wqe", arguments.direct_wqe),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    (!flags.is_empty()).then(|| flags.join(", "))
}

/// No operation: write, read and send over [`bench::sweep_sizes`] in each mode, one
/// perftest-shaped table per operation and mode. A progress line goes to stderr when it is a
/// terminal; with --json, one JSON object per point follows the tables.
fn sweep_main(arguments: &Arguments, base: BenchConfig) -> ExitCode {
    if arguments.size.is_some() || arguments.iters.is_some() || arguments.pcap.is_some() {
        eprintln!("rnic-bench: --size, --iters and --pcap need an operation (the sweep chooses its own sizes)");
        return ExitCode::FAILURE;
    }
    let modes: Vec<Mode> = match arguments.mode {
        Some(mode) => vec![mode],
        None => vec![Mode::Virtual, Mode::Wall],
    };
    let operations = [Operation::Write, Operation::Read, Operation::Send];
    let sizes = bench::sweep_sizes();
    let total = modes.len() * operations.len() * sizes.len();
    let progress = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut done = 0;
    let mut failed = false;
    let mut json = Vec::new();
    for &mode in &modes {
        for operation in operations {
            let mut header = true;
            for &size in &sizes {
                if progress {
                    eprint!(
                        "\r\x1b[Krnic-bench: sweep {}/{}: {} {} B, {} mode ({:.1} s)",
                        done + 1,
                        total,
                        operation.name(),
                        size,
                        mode.name(),
                        started.elapsed().as_secs_f64()
                    );
                }
                let config = BenchConfig {
                    operation,
                    size,
                    iterations: bench::sweep_iterations(size),
                    mode,
                    ..base.clone()
                };
                let report = match bench::run(&config) {
                    Ok((report, _)) => report,
                    Err(error) => {
                        if progress {
                            eprint!("\r\x1b[K");
                        }
                        eprintln!(
                            "rnic-bench: {} {size} B, {} mode: {error}",
                            operation.name(),
                            mode.name()
                        );
                        return ExitCode::FAILURE;
                    }
                };
                if header {
                    if progress {
                        eprint!("\r\x1b[K");
                    }
                    print!("{}", report.table_header());
                    header = false;
                }
                if progress {
                    eprint!("\r\x1b[K");
                }
                print!("{}", report.table_row());
                for failure in &report.failures {
                    println!("failure: {failure}");
                }
                if let Err(why) = report.verdict() {
                    println!("failure: {why}");
                    failed = true;
                }
                if arguments.json {
                    json.push(report.to_json());
                }
                done += 1;
            }
            println!();
        }
    }
    if progress {
        eprintln!(
            "rnic-bench: sweep of {total} points took {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    for line in json {
        println!("{line}");
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
