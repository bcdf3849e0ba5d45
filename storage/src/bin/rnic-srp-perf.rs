//! `rnic-srp-perf`: the SRP benchmark front end. Two embedded NICs on one fabric (no
//! VM, no root, no network): our SRP target with a RAM or file logical unit, our SRP
//! initiator driving a queue depth of READ/WRITE commands, optionally verified, figures
//! on virtual time (the modelled NIC, deterministic) or wall time (this machine).
//! `--compare-nvmf` runs the same workload over NVMe-oF in the same process and prints
//! the SRP/NVMe-oF ratio (docs/benchmarks.md).
//!
//! ```text
//! rnic-srp-perf --qd 32 --bs 4096 --rw randread --ios 20000 --compare-nvmf
//! rnic-srp-perf --qd 8 --bs 65536 --rw randrw --rwmixread 70 --verify --json
//! ```

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Parser;
use rnic_hw_model::fabric::{FabricConfig, FaultPlan};
use rnic_storage::block::{BlockDevice, FileBackend, FileMode, RamBackend};
use rnic_storage::nvmeof::host::{Host, HostConfig};
use rnic_storage::nvmeof::perf::{self as nvmf_perf, Pattern, TimeMode};
use rnic_storage::nvmeof::target::{AllowedHosts, Subsystem, Target as NvmfTarget, TargetConfig as NvmfConfig};
use rnic_storage::perf::PerfReport;
use rnic_storage::rdma::{Clock, DirectCm, EmbeddedReactor, Pace, ServiceAddress};
use rnic_storage::scsi::lu::{LogicalUnit, LuConfig, LunMap};
use rnic_storage::srp::initiator::{Initiator, InitiatorConfig};
use rnic_storage::srp::perf::{self as srp_perf, Workload};
use rnic_storage::srp::target::{Target, TargetConfig};
use rnic_verbs::backend::EmbeddedFabric;
use rnic_verbs::Context;

#[derive(Parser, Debug)]
#[command(name = "rnic-srp-perf", about = "SRP benchmark over two embedded rnic-emu NICs")]
struct Args {
    /// Commands kept outstanding.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Bytes per I/O.
    #[arg(long, default_value_t = 4096)]
    bs: u32,
    /// randread, randwrite, randrw, read, write or rw.
    #[arg(long, default_value = "randread")]
    rw: String,
    /// Percentage of reads for randrw/rw.
    #[arg(long, default_value_t = 50)]
    rwmixread: u8,
    /// I/Os to run.
    #[arg(long, default_value_t = 20_000)]
    ios: u64,
    /// Check every read against what was written.
    #[arg(long)]
    verify: bool,
    /// virtual (modelled NIC) or wall (this machine).
    #[arg(long, default_value = "virtual")]
    mode: String,
    /// Logical unit size, MiB.
    #[arg(long, default_value_t = 64)]
    size_mib: u64,
    /// Block size of the unit.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Serve a file instead of RAM (created or resized to --size-mib).
    #[arg(long)]
    file: Option<String>,
    /// Faults on the wire, e.g. loss=0.01,seed=3.
    #[arg(long)]
    faults: Option<String>,
    /// Also run the workload over NVMe-oF and print the ratio.
    #[arg(long)]
    compare_nvmf: bool,
    /// One JSON object per run on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

fn workload(args: &Args) -> Result<(Pattern, u8), String> {
    Ok(match args.rw.as_str() {
        "randread" => (Pattern::Random, 100),
        "randwrite" => (Pattern::Random, 0),
        "randrw" => (Pattern::Random, args.rwmixread.min(100)),
        "read" => (Pattern::Sequential, 100),
        "write" => (Pattern::Sequential, 0),
        "rw" => (Pattern::Sequential, args.rwmixread.min(100)),
        other => return Err(format!("--rw {other}: randread, randwrite, randrw, read, write or rw")),
    })
}

fn fabric(args: &Args) -> Result<EmbeddedFabric, String> {
    let faults = match &args.faults {
        Some(spec) => FaultPlan::parse(spec).map_err(|e| format!("--faults: {e}"))?,
        None => FaultPlan::none(),
    };
    Ok(EmbeddedFabric::new(FabricConfig {
        faults,
        ..FabricConfig::default()
    }))
}

fn device(args: &Args) -> Result<Arc<dyn BlockDevice>, String> {
    let blocks = (args.size_mib << 20) / u64::from(args.block_size);
    Ok(match &args.file {
        Some(path) => Arc::new(
            FileBackend::create(std::path::Path::new(path), args.block_size, blocks, FileMode::Buffered)
                .map_err(|e| e.to_string())?,
        ),
        None => Arc::new(RamBackend::new(args.block_size, blocks).map_err(|e| e.to_string())?),
    })
}

fn reactor(fabric: &EmbeddedFabric, mode: TimeMode) -> EmbeddedReactor {
    let reactor = EmbeddedReactor::new(fabric.clone());
    match mode {
        TimeMode::Virtual => reactor,
        // Flat out: fewer, longer runs of the model.
        TimeMode::Wall => reactor.with_pace(Pace::FixedStep, rnic_hw_model::time::Picoseconds::from_micros(1)),
    }
}

fn run_srp(args: &Args, mode: TimeMode, pattern: Pattern, read_percent: u8) -> Result<PerfReport, String> {
    let fabric = fabric(args)?;
    let address = ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 5555);
    let cm = DirectCm::default();
    let mut luns = LunMap::new();
    luns.insert(0, LogicalUnit::new(device(args)?, LuConfig::default()));
    let target = Target::new(
        Context::open(Box::new(fabric.add_nic([2, 0, 0, 0, 0, 1]))).map_err(|e| e.to_string())?,
        Box::new(cm.listen(address).map_err(|e| e.to_string())?),
        TargetConfig {
            data_pool_bytes: (args.qd * args.bs as usize).max(8 << 20),
            ..TargetConfig::default()
        },
        luns,
    )
    .map_err(|e| e.to_string())?;
    let target = Arc::new(Mutex::new(target));
    let mut reactor = reactor(&fabric, mode);
    reactor.add(target.clone());
    let mut initiator = Initiator::login(
        Context::open(Box::new(fabric.add_nic([2, 0, 0, 0, 0, 2]))).map_err(|e| e.to_string())?,
        Box::new(cm.connector()),
        Box::new(reactor),
        InitiatorConfig {
            target: address,
            data_pool_bytes: (args.qd * args.bs as usize).max(16 << 20),
            ..InitiatorConfig::default()
        },
    )
    .map_err(|e| format!("login: {e}"))?;
    let report = srp_perf::run(
        &mut initiator,
        &Workload {
            io_size: args.bs,
            queue_depth: args.qd,
            read_percent,
            pattern,
            ios: Some(args.ios),
            verify: args.verify,
            mode,
            ..Workload::default()
        },
        &mut |_| {},
    )
    .map_err(|e| e.to_string())?;
    initiator.logout();
    Ok(report)
}

fn run_nvmf(args: &Args, mode: TimeMode, pattern: Pattern, read_percent: u8) -> Result<PerfReport, String> {
    let fabric = fabric(args)?;
    let address = ServiceAddress::new(Ipv4Addr::new(10, 0, 0, 1), 4420);
    let nqn = "nqn.2024-01.io.rnic-emu:bench";
    let cm = DirectCm::default();
    let mut subsystem = Subsystem::nvm(nqn, AllowedHosts::Any);
    subsystem.add_namespace(1, device(args)?);
    let target = NvmfTarget::new(
        Context::open(Box::new(fabric.add_nic([2, 0, 0, 0, 0, 1]))).map_err(|e| e.to_string())?,
        Box::new(cm.listen(address).map_err(|e| e.to_string())?),
        Clock::Virtual(fabric.clone()),
        NvmfConfig {
            listen: address,
            data_pool_bytes: (args.qd * args.bs as usize).max(8 << 20),
            ..NvmfConfig::default()
        },
        vec![subsystem],
    )
    .map_err(|e| e.to_string())?;
    let target = Arc::new(Mutex::new(target));
    let mut reactor = reactor(&fabric, mode);
    reactor.add(target.clone());
    let mut host = Host::connect(
        Context::open(Box::new(fabric.add_nic([2, 0, 0, 0, 0, 2]))).map_err(|e| e.to_string())?,
        Box::new(cm.connector()),
        Box::new(reactor),
        HostConfig {
            subsystem_nqn: nqn.into(),
            target: address,
            io_queues: 1,
            data_pool_bytes: (args.qd * args.bs as usize).max(16 << 20),
            ..HostConfig::default()
        },
    )
    .map_err(|e| format!("connect: {e}"))?;
    let report = nvmf_perf::run(
        &mut host,
        &nvmf_perf::Workload {
            io_size: args.bs,
            queue_depth: args.qd,
            queues: 1,
            read_percent,
            pattern,
            ios: Some(args.ios),
            verify: args.verify,
            mode,
            ..nvmf_perf::Workload::default()
        },
        &mut |_| {},
    )
    .map_err(|e| e.to_string())?;
    let _ = host.disconnect();
    Ok(report)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = (|| -> Result<bool, String> {
        let (pattern, read_percent) = workload(&args)?;
        let mode = match args.mode.as_str() {
            "virtual" => TimeMode::Virtual,
            "wall" => TimeMode::Wall,
            other => return Err(format!("--mode {other}: virtual or wall")),
        };
        let srp = run_srp(&args, mode, pattern, read_percent)?;
        let mut reports = vec![srp];
        if args.compare_nvmf {
            reports.push(run_nvmf(&args, mode, pattern, read_percent)?);
        }
        let ok = reports
            .iter()
            .all(|r| r.errors == 0 && r.verify_failures == 0 && r.ios == args.ios);
        if args.compare_nvmf {
            let ratio = reports[0].iops / reports[1].iops.max(f64::MIN_POSITIVE);
            reports[0].extra.push(("iops_ratio_to_nvmf".into(), ratio));
        }
        for report in &reports {
            if args.json {
                println!("{}", report.to_json());
            } else {
                println!("{}", report.to_table());
            }
        }
        if args.compare_nvmf && !args.json {
            println!(
                "SRP / NVMe-oF IOPS ratio: {:.3} ({:.0} / {:.0} IOPS, {} mode)",
                reports[0].iops / reports[1].iops.max(f64::MIN_POSITIVE),
                reports[0].iops,
                reports[1].iops,
                mode.name()
            );
        }
        Ok(ok)
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("rnic-srp-perf: some I/Os failed or did not verify");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("rnic-srp-perf: {e}");
            ExitCode::from(2)
        }
    }
}
