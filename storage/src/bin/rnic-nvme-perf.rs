//! `rnic-nvme-perf`: an NVMe-oF/RDMA benchmark in the manner of SPDK's `spdk_nvme_perf`.
//!
//! Without `--device` (or `-r`), it runs a target with a RAM namespace and the host on two
//! embedded NICs in this process: modelled figures in virtual time (`--mode virtual`, the
//! default, deterministic) or how fast this machine runs the stack and the emulator
//! (`--mode wall`), optionally beside the NIC alone (`--compare-nic`: rnic-bench's
//! engine moving the same messages). With `--device` and `-r`, it connects to a target
//! across processes.
// The field docs are the command's --help text, in which `[...]` marks what may be left
// out, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::io::IsTerminal;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rnic_hw_model::fabric::FaultPlan;
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::timing::TimingParams;
use rnic_storage::block::{BlockDevice, RamBackend};
use rnic_storage::nvmeof::config::parse_size;
use rnic_storage::nvmeof::embedded::{CmKind, EmbeddedSession, EmbeddedSetup};
use rnic_storage::nvmeof::host::{Host, HostConfig};
use rnic_storage::nvmeof::perf::{self, Pattern, TimeMode, Workload};
use rnic_storage::nvmeof::target::{AllowedHosts, Subsystem, TargetConfig};
use rnic_storage::perf::{PerfReport, ProgressLine};
use rnic_storage::rdma::reactor::Pace;
use rnic_storage::rdma::setup::{open_context, CmChoice};
use rnic_storage::rdma::{RcPathConfig, ServiceAddress, WallReactor};
use rnic_testbench::bench::{self, BenchConfig, Mode, Operation};
use rnic_verbs::Mtu;

const SUBNQN: &str = "nqn.2024-01.io.rnic-emu:perf";

/// NVMe-oF/RDMA benchmark (spdk_nvme_perf-style).
#[derive(Debug, Parser)]
#[command(name = "rnic-nvme-perf", version)]
struct Arguments {
    /// Outstanding I/Os per queue.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 32)]
    queue_depth: usize,
    /// Bytes per I/O (4096, 4k, 128KiB, 1M).
    #[arg(short = 'o', long = "io-size", default_value = "4096")]
    io_size: String,
    /// randread, randwrite, randrw, read, write or rw.
    #[arg(short = 'w', long = "workload", default_value = "randread")]
    workload: String,
    /// Percentage of reads of an rw/randrw workload.
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50)]
    read_percent: u8,
    /// Seconds to run (on the report's clock).
    #[arg(short = 't', long = "time")]
    time: Option<f64>,
    /// I/Os to run (all queues) [default: 100000 without --time].
    #[arg(short = 'n', long = "ios")]
    ios: Option<u64>,
    /// I/O queues.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Check every read against what was written (a read-only run writes its region first).
    #[arg(long)]
    verify: bool,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// virtual (modelled NIC, virtual time) or wall (this machine's speed).
    #[arg(long, default_value = "virtual")]
    mode: String,
    /// Timing preset of the embedded NICs: hns-100g, hns-25g or ideal.
    #[arg(long, default_value = "hns-100g")]
    preset: String,
    /// Faults on the embedded wire, e.g. loss=0.01,dup=0.001,reorder=0.01,corrupt=0.001,seed=7.
    #[arg(long, default_value = "none")]
    faults: FaultPlan,
    /// Write every frame of the embedded wire to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Size of the embedded RAM namespace.
    #[arg(long, default_value = "256MiB")]
    size: String,
    /// Block size of the embedded namespace (512 or 4096).
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Blocks of the namespace the I/Os go to (default: all).
    #[arg(long)]
    region: Option<String>,
    /// Path MTU of the embedded QPs (256..4096).
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// In-capsule data the embedded target takes (0: none).
    #[arg(long, default_value_t = 4096)]
    in_capsule: u32,
    /// Connection manager: rdma (the RDMA CM on QP1, REQ/REP/RTU on the wire), direct
    /// (embedded only: QPs connected in process) or exchange (remote only: our TCP exchange).
    #[arg(long, default_value = "rdma")]
    cm: String,
    /// How the RDMA CM of a remote run finds the target's MAC: kernel (`rnic-emu --net
    /// eth:`), udp (`--net udp:`) or IP=MAC[,IP=MAC...].
    #[arg(long, default_value = "kernel")]
    neighbours: String,
    /// Ask the target to invalidate every command's key (keyed SGL 0x4F).
    #[arg(long)]
    invalidate: bool,
    /// Also run rnic-bench's engine moving the same messages (the NIC alone) and report
    /// the storage layer's cost beside it (embedded only).
    #[arg(long)]
    compare_nic: bool,
    /// Runs of the workload (each followed by its NIC-only half with --compare-nic),
    /// in one process on one connection; the table is the last run's, with every
    /// round's ratios and their medians.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Seed of offsets, mix and data.
    #[arg(long, default_value_t = 0x5EED)]
    seed: u64,
    /// The target, SPDK's way: 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:NQN'.
    #[arg(short = 'r', long = "transport-id")]
    transport_id: Option<String>,
    /// The NIC of a remote run: vfio-user:PATH[,mac=MAC] or pci[:BDF].
    #[arg(long)]
    device: Option<String>,
    /// The NIC's IPv4 address (GID 0) for a remote run.
    #[arg(long)]
    ip: Option<Ipv4Addr>,
    /// This host's NQN.
    #[arg(long)]
    hostnqn: Option<String>,
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("rnic-nvme-perf: {message}");
    ExitCode::FAILURE
}

fn workload(arguments: &Arguments) -> Result<Workload, String> {
    let (pattern, read_percent) = match arguments.workload.as_str() {
        "randread" => (Pattern::Random, 100),
        "randwrite" => (Pattern::Random, 0),
        "randrw" => (Pattern::Random, arguments.read_percent),
        "read" => (Pattern::Sequential, 100),
        "write" => (Pattern::Sequential, 0),
        "rw" => (Pattern::Sequential, arguments.read_percent),
        other => {
            return Err(format!(
                "workload {other:?}: randread, randwrite, randrw, read, write or rw"
            ))
        }
    };
    let mode = match arguments.mode.as_str() {
        "virtual" => TimeMode::Virtual,
        "wall" => TimeMode::Wall,
        other => return Err(format!("mode {other:?}: virtual or wall")),
    };
    let io_size = parse_size(&arguments.io_size).map_err(|e| e.to_string())?;
    Ok(Workload {
        nsid: 1,
        io_size: u32::try_from(io_size).map_err(|_| format!("I/O size {io_size}"))?,
        queue_depth: arguments.queue_depth,
        queues: usize::from(arguments.queues),
        read_percent,
        pattern,
        ios: arguments
            .ios
            .or(if arguments.time.is_none() { Some(100_000) } else { None }),
        duration_ns: arguments.time.map(|s| (s * 1e9) as u64),
        verify: arguments.verify,
        seed: arguments.seed,
        region_blocks: match &arguments.region {
            Some(region) => Some(parse_size(region).map_err(|e| e.to_string())? / u64::from(arguments.block_size)),
            None => None,
        },
        mode,
    })
}

/// A progress line on stderr when it is a terminal, at most five times a second.
fn progress() -> impl FnMut(ProgressLine) {
    let terminal = std::io::stderr().is_terminal();
    let mut last = std::time::Instant::now();
    move |line: ProgressLine| {
        if terminal && last.elapsed().as_secs_f64() >= 0.2 {
            last = std::time::Instant::now();
            eprint!("{}", line.render());
        }
    }
}

fn host_config(arguments: &Arguments, workload: &Workload, target: ServiceAddress, subnqn: &str) -> HostConfig {
    let defaults = HostConfig::default();
    HostConfig {
        host_nqn: arguments.hostnqn.clone().unwrap_or(defaults.host_nqn.clone()),
        subsystem_nqn: subnqn.into(),
        target,
        io_queues: arguments.queues,
        queue_entries: (workload.queue_depth as u16).clamp(2, 1024).max(32),
        data_pool_bytes: (workload.queue_depth * workload.io_size as usize).max(1 << 20),
        invalidate: arguments.invalidate,
        ..defaults
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let arguments = Arguments::parse();
    let workload = match workload(&arguments) {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let result = if arguments.device.is_some() || arguments.transport_id.is_some() {
        remote(&arguments, &workload)
    } else {
        embedded(&arguments, &workload)
    };
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K");
    }
    match result {
        Ok(report) => {
            print!("{}", report.to_table());
            if arguments.json {
                println!("{}", report.to_json());
            }
            if report.errors > 0 || report.verify_failures > 0 {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn embedded(arguments: &Arguments, workload: &Workload) -> Result<PerfReport, String> {
    let timing = TimingParams::preset(&arguments.preset).map_err(|e| e.to_string())?;
    let size = parse_size(&arguments.size).map_err(|e| e.to_string())?;
    let device: Arc<dyn BlockDevice> = Arc::new(
        RamBackend::new(arguments.block_size, size / u64::from(arguments.block_size)).map_err(|e| e.to_string())?,
    );
    let mut subsystem = Subsystem::nvm(SUBNQN, AllowedHosts::Any);
    subsystem.add_namespace(1, device);
    let mtu = Mtu::from_bytes(arguments.mtu).ok_or_else(|| format!("MTU {}", arguments.mtu))?;
    let setup = EmbeddedSetup {
        timing,
        link_latency: Picoseconds(timing.propagation_ps),
        faults: arguments.faults,
        capture: arguments.pcap.is_some(),
        pace: match workload.mode {
            TimeMode::Virtual => Pace::NextEvent,
            TimeMode::Wall => Pace::FixedStep,
        },
        path: RcPathConfig {
            path_mtu: mtu,
            ..RcPathConfig::default()
        },
        target: TargetConfig {
            listen: rnic_storage::nvmeof::embedded::TARGET_ADDRESS,
            in_capsule_data_size: arguments.in_capsule,
            max_io_queues: arguments.queues.max(1),
            data_pool_bytes: (8 << 20).max(workload.queue_depth * workload.io_size as usize / 2),
            ..TargetConfig::default()
        },
        cm: match arguments.cm.as_str() {
            "rdma" => CmKind::Rdma { seed: arguments.seed },
            "direct" => CmKind::Direct,
            other => return Err(format!("--cm {other}: rdma or direct")),
        },
    };
    let mut session = EmbeddedSession::new(setup, vec![subsystem]).map_err(|e| e.to_string())?;
    let config = host_config(arguments, workload, session.target().address(), SUBNQN);
    let mut host = session.connect(config).map_err(|e| e.to_string())?;
    // Each round runs the NVMe-oF half and then, with --compare-nic, the NIC-only half
    // straight after it, so the two halves of a ratio share the machine's state of that
    // moment; the medians over the rounds are what a loaded machine allows to report.
    let rounds = arguments.rounds.max(1);
    let mut wall_costs = Vec::new();
    let mut cpu_costs = Vec::new();
    let mut round_lines = Vec::new();
    let mut report = PerfReport::default();
    for round in 1..=rounds {
        report = perf::run(&mut host, workload, &mut progress()).map_err(|e| e.to_string())?;
        report.preset = arguments.preset.clone();
        if arguments.compare_nic {
            let comparison = compare_with_nic(arguments, workload, &mut report, timing)?;
            if rounds > 1 {
                let line = |what: &str| format!("round {round}: {what}");
                round_lines.push((line("IOPS"), report.iops));
                round_lines.push((line("storage cost / NIC cost"), comparison.wall_cost));
                if let Some(cpu_cost) = comparison.cpu_cost {
                    round_lines.push((line("storage cost / NIC cost, CPU time"), cpu_cost));
                    cpu_costs.push(cpu_cost);
                }
            }
            wall_costs.push(comparison.wall_cost);
        }
    }
    if rounds > 1 && arguments.compare_nic {
        // The last round's lines are above; every round's ratios follow.
        report.extra.extend(round_lines);
        report.extra.push((
            format!("median storage cost / NIC cost over {rounds} rounds"),
            median(&mut wall_costs),
        ));
        if !cpu_costs.is_empty() {
            report.extra.push((
                format!("median storage cost / NIC cost, CPU time, over {rounds} rounds"),
                median(&mut cpu_costs),
            ));
        }
    }
    host.disconnect().map_err(|e| e.to_string())?;
    if let Some(path) = &arguments.pcap {
        rnic_testbench::pcap::write_pcap(path, &session.take_capture())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(report)
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// The storage layer's cost against the NIC's in one round.
struct NicComparison {
    /// By the wall-clock rates: NIC-only IOPS / IOPS − 1.
    wall_cost: f64,
    /// By CPU time per I/O (when both halves measured it).
    cpu_cost: Option<f64>,
}

/// The messages one I/O of the workload puts on the wire, by opcode and size:
/// a command SEND, the data (RDMA WRITE to the host for reads, RDMA READ from it for
/// keyed writes, nothing more for in-capsule writes) and a 16-byte response SEND.
fn nic_messages(workload: &Workload, in_capsule: u32) -> Vec<(f64, Operation, usize)> {
    let reads = f64::from(workload.read_percent) / 100.0;
    let size = workload.io_size as usize;
    let mut messages = vec![(1.0, Operation::Send, 64), (1.0, Operation::Send, 16)];
    if reads > 0.0 {
        messages.push((reads, Operation::Write, size));
    }
    if reads < 1.0 {
        if workload.io_size <= in_capsule {
            // The data rides in the command SEND: 64 + data bytes instead of 64.
            messages[0].0 -= 1.0 - reads;
            messages.push((1.0 - reads, Operation::Send, 64 + size));
        } else {
            messages.push((1.0 - reads, Operation::Read, size));
        }
    }
    messages
}

/// Runs rnic-bench's engine for every message of an I/O at the workload's depth and
/// clock, and adds to `report` the I/O rate the NIC alone would reach and the storage
/// layer's cost against it.
fn compare_with_nic(
    arguments: &Arguments,
    workload: &Workload,
    report: &mut PerfReport,
    timing: TimingParams,
) -> Result<NicComparison, String> {
    let mut seconds_per_io = 0.0;
    let mut cpu_seconds_per_io = 0.0;
    for (weight, operation, size) in nic_messages(workload, arguments.in_capsule) {
        if weight <= 0.0 {
            continue;
        }
        let config = BenchConfig {
            operation,
            size,
            iterations: NIC_ITERATIONS,
            queue_pairs: usize::from(arguments.queues),
            mtu: arguments.mtu,
            faults: FaultPlan::none(),
            verify: false,
            capture: false,
            timing,
            preset: arguments.preset.clone(),
            link_latency: Picoseconds(timing.propagation_ps),
            mode: match workload.mode {
                TimeMode::Virtual => Mode::Virtual,
                TimeMode::Wall => Mode::Wall,
            },
            latency_test: false,
            tx_depth: workload.queue_depth.clamp(1, bench::MAX_TX_DEPTH),
            cq_moderation: 1,
            single_buffer: false,
            // QPs programmed directly, as the NIC-only figure always was.
            connection_manager: false,
            ..BenchConfig::default()
        };
        // The CPU time of the messages alone: rnic-bench measures it over the same span
        // as its message rate (set-up and its memcpy yardstick not included), as the
        // NVMe-oF figure is the CPU time of its measured loop only.
        let (nic, _) = bench::run(&config).map_err(|e| e.to_string())?;
        let rate = nic.msg_rate_mpps * 1e6;
        if rate <= 0.0 {
            return Err(format!("rnic-bench {} {size}: no message rate", operation.name()));
        }
        report
            .extra
            .push((format!("rnic-bench {} {size} B msg/s", operation.name()), rate));
        seconds_per_io += weight / rate;
        let messages = (nic.messages_ok + nic.messages_failed).max(1);
        let cpu_per_message = nic.cpu_time_s / messages as f64;
        report.extra.push((
            format!("rnic-bench {} {size} B CPU us/msg", operation.name()),
            cpu_per_message * 1e6,
        ));
        cpu_seconds_per_io += weight * cpu_per_message;
    }
    let nic_iops = 1.0 / seconds_per_io;
    report.extra.push(("NIC-only IOPS (same messages)".into(), nic_iops));
    report
        .extra
        .push(("IOPS / NIC-only IOPS".into(), report.iops / nic_iops));
    let wall_cost = nic_iops / report.iops - 1.0;
    report
        .extra
        .push(("storage cost / NIC cost (goal <= 0.30)".into(), wall_cost));
    let mut cpu_cost = None;
    // The same ratio on CPU time (both halves run on this one thread): what each I/O
    // cost, whatever share of the CPUs other work on the machine left this run.
    if report.cpu_s > 0.0 && cpu_seconds_per_io > 0.0 && report.ios > 0 {
        let cpu_per_io = report.cpu_s / report.ios as f64;
        report.extra.push(("CPU us per I/O".into(), cpu_per_io * 1e6));
        report.extra.push((
            "NIC-only CPU us per I/O (same messages)".into(),
            cpu_seconds_per_io * 1e6,
        ));
        let cost = cpu_per_io / cpu_seconds_per_io - 1.0;
        report.extra.push(("storage cost / NIC cost, CPU time".into(), cost));
        cpu_cost = Some(cost);
    }
    Ok(NicComparison { wall_cost, cpu_cost })
}

/// Messages of each NIC-only run.
const NIC_ITERATIONS: u64 = 20_000;

/// `trtype:RDMA adrfam:IPv4 traddr:A trsvcid:P subnqn:N` → address and NQN.
fn parse_transport_id(text: &str) -> Result<(ServiceAddress, String), String> {
    let mut traddr = None;
    let mut trsvcid = 4420u16;
    let mut subnqn = None;
    for field in text.split_whitespace() {
        let (key, value) = field
            .split_once(':')
            .ok_or_else(|| format!("{field:?} in the transport ID is not KEY:VALUE"))?;
        match key.to_ascii_lowercase().as_str() {
            "trtype" if value.eq_ignore_ascii_case("rdma") => {}
            "trtype" => return Err(format!("transport {value}: only RDMA")),
            "adrfam" if value.eq_ignore_ascii_case("ipv4") => {}
            "adrfam" => return Err(format!("address family {value}: only IPv4")),
            "traddr" => traddr = Some(value.parse::<Ipv4Addr>().map_err(|e| format!("traddr {value}: {e}"))?),
            "trsvcid" => trsvcid = value.parse().map_err(|e| format!("trsvcid {value}: {e}"))?,
            "subnqn" => subnqn = Some(value.to_string()),
            other => return Err(format!("unknown transport ID key {other:?}")),
        }
    }
    Ok((
        ServiceAddress::new(traddr.ok_or("the transport ID has no traddr")?, trsvcid),
        subnqn.ok_or("the transport ID has no subnqn")?,
    ))
}

fn remote(arguments: &Arguments, workload: &Workload) -> Result<PerfReport, String> {
    let device = arguments.device.as_ref().ok_or("a remote run needs --device")?;
    let transport_id = arguments
        .transport_id
        .as_ref()
        .ok_or("a remote run needs -r TRANSPORT_ID")?;
    let (target, subnqn) = parse_transport_id(transport_id)?;
    if workload.mode == TimeMode::Virtual {
        return Err("across processes the figures are wall-clock: add --mode wall".into());
    }
    let context = open_context(device, arguments.ip)?;
    let path = RcPathConfig {
        path_mtu: Mtu::from_bytes(arguments.mtu).ok_or_else(|| format!("MTU {}", arguments.mtu))?,
        ack_timeout: 14,
        ..RcPathConfig::default()
    };
    let connector = CmChoice::parse(&arguments.cm, &arguments.neighbours)?.connector(&context, path)?;
    let config = host_config(arguments, workload, target, &subnqn);
    let mut host =
        Host::connect(context, connector, Box::new(WallReactor::default()), config).map_err(|e| e.to_string())?;
    let report = perf::run(&mut host, workload, &mut progress()).map_err(|e| e.to_string())?;
    host.disconnect().map_err(|e| e.to_string())?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Arguments::command().debug_assert();
    }

    #[test]
    fn transport_ids() {
        let (address, nqn) =
            parse_transport_id("trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4421 subnqn:nqn.a").unwrap();
        assert_eq!(address, ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 4421));
        assert_eq!(nqn, "nqn.a");
        assert!(parse_transport_id("trtype:TCP traddr:1.2.3.4 subnqn:x").is_err());
        assert!(parse_transport_id("traddr:1.2.3.4").is_err());
    }

    #[test]
    fn medians_of_rounds() {
        assert_eq!(median(&mut [0.4, 0.1, 0.3]), 0.3);
        assert_eq!(median(&mut [0.4, 0.1, 0.3, 0.2]), 0.25);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn messages_of_an_io() {
        let reads = Workload::default();
        let m = nic_messages(&reads, 4096);
        assert_eq!(m.len(), 3);
        assert!(m.contains(&(1.0, Operation::Write, 4096)));
        let writes = Workload {
            read_percent: 0,
            ..Workload::default()
        };
        let m = nic_messages(&writes, 4096);
        assert!(m.contains(&(1.0, Operation::Send, 4160)));
        assert!(m.contains(&(0.0, Operation::Send, 64)));
        let m = nic_messages(&writes, 0);
        assert!(m.contains(&(1.0, Operation::Read, 4096)));
    }
}
