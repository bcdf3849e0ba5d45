//! `rnic-nvmf-tgt`: an NVMe-oF/RDMA target in the manner of SPDK's `nvmf_tgt`, on one of
//! our NICs (`--device vfio-user:PATH` behind `rnic-emu serve`, or a PCI function), from
//! flags or a TOML file (`rnic_storage::nvmeof::config`).
//!
//! ```text
//! rnic-nvmf-tgt --device vfio-user:/tmp/a.sock,mac=02:52:4e:49:43:01 --ip 127.0.0.1 \
//!     --subsystem nqn.2024-01.io.rnic-emu:disk1 \
//!     --namespace nqn.2024-01.io.rnic-emu:disk1,1,file:/var/tmp/disk1.img,size=1G \
//!     --allow-host nqn.2024-01.io.rnic-emu:disk1,nqn.2014-08.org.nvmexpress:uuid:...
//! rnic-nvmf-tgt --config target.toml
//! ```
// The field docs are the command's --help text, in which `[...]` marks what may be left
// out, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rnic_storage::nvmeof::config::{parse_namespace_flag, SubsystemSection, TargetFile};
use rnic_storage::nvmeof::target::Target;
use rnic_storage::rdma::setup::{open_context, CmChoice};
use rnic_storage::rdma::{Clock, Listener, RcPathConfig};
use rnic_verbs::Mtu;

/// NVMe-oF/RDMA target (nvmf_tgt-style).
#[derive(Debug, Parser)]
#[command(name = "rnic-nvmf-tgt", version)]
struct Arguments {
    /// TOML configuration (flags below add to it and override its [target] values).
    #[arg(short = 'c', long)]
    config: Option<PathBuf>,
    /// The NIC: vfio-user:PATH[,mac=MAC] or pci[:BDF][,mac=MAC].
    #[arg(long)]
    device: Option<String>,
    /// The NIC's IPv4 address (GID 0) and the default listen address.
    #[arg(long)]
    ip: Option<Ipv4Addr>,
    /// Listen address IP:PORT [default: IP:4420].
    #[arg(long)]
    listen: Option<String>,
    /// A subsystem NQN to serve (repeat for more).
    #[arg(long = "subsystem")]
    subsystems: Vec<String>,
    /// A namespace: NQN,NSID,ram:SIZE[,bs=N] or NQN,NSID,file:PATH[,size=SIZE][,bs=N][,direct].
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// NQN,HOSTNQN: only listed hosts may connect to NQN (default: any host).
    #[arg(long = "allow-host")]
    allowed_hosts: Vec<String>,
    /// I/O queues per controller.
    #[arg(long)]
    max_io_queues: Option<u16>,
    /// Entries per I/O queue.
    #[arg(long)]
    queue_depth: Option<u16>,
    /// In-capsule data bytes (0: none).
    #[arg(long)]
    in_capsule: Option<u32>,
    /// Path MTU of the QPs (256..4096).
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Connection management: `rdma` (the RDMA CM on QP1, as Linux hosts use) or
    /// `exchange` (a TCP exchange between processes of ours).
    #[arg(long, default_value = "rdma")]
    cm: String,
    /// How the RDMA CM finds peers' MACs: kernel (`rnic-emu --net eth:`), udp
    /// (`--net udp:`) or IP=MAC[,IP=MAC...]. A target only answers, so rarely needs it.
    #[arg(long, default_value = "kernel")]
    neighbours: String,
    /// Print counters to stderr every this many seconds.
    #[arg(long)]
    stats: Option<f64>,
    /// Log filter (RUST_LOG syntax) [default: info].
    #[arg(long)]
    log: Option<String>,
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("rnic-nvmf-tgt: {message}");
    ExitCode::from(2)
}

fn configuration(arguments: &Arguments) -> Result<TargetFile, String> {
    let mut file = match &arguments.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            TargetFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => TargetFile::default(),
    };
    let target = &mut file.target;
    if arguments.device.is_some() {
        target.device = arguments.device.clone();
    }
    if arguments.ip.is_some() {
        target.ip = arguments.ip;
    }
    if arguments.listen.is_some() {
        target.listen = arguments.listen.clone();
    }
    if arguments.max_io_queues.is_some() {
        target.max_io_queues = arguments.max_io_queues;
    }
    if arguments.queue_depth.is_some() {
        target.queue_depth = arguments.queue_depth;
    }
    if arguments.in_capsule.is_some() {
        target.in_capsule_data = arguments.in_capsule;
    }
    fn section(subsystems: &mut Vec<SubsystemSection>, nqn: &str) -> usize {
        match subsystems.iter().position(|s| s.nqn == nqn) {
            Some(i) => i,
            None => {
                subsystems.push(SubsystemSection {
                    nqn: nqn.into(),
                    ..SubsystemSection::default()
                });
                subsystems.len() - 1
            }
        }
    }
    for nqn in &arguments.subsystems {
        section(&mut file.subsystem, nqn);
    }
    let mut namespaces = Vec::new();
    for flag in &arguments.namespaces {
        namespaces.push(parse_namespace_flag(flag).map_err(|e| e.to_string())?);
    }
    for (nqn, namespace) in namespaces {
        let index = section(&mut file.subsystem, &nqn);
        file.subsystem[index].namespace.push(namespace);
    }
    let mut hosts = Vec::new();
    for flag in &arguments.allowed_hosts {
        let (nqn, host) = flag
            .split_once(',')
            .ok_or_else(|| format!("--allow-host {flag:?}: NQN,HOSTNQN"))?;
        hosts.push((nqn.to_string(), host.to_string()));
    }
    for (nqn, host) in hosts {
        let index = section(&mut file.subsystem, &nqn);
        file.subsystem[index].allowed_hosts.push(host);
    }
    Ok(file)
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let filter = arguments.log.clone().unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let file = match configuration(&arguments) {
        Ok(file) => file,
        Err(e) => return fail(e),
    };
    let config = match file.target_config() {
        Ok(config) => config,
        Err(e) => return fail(e),
    };
    let subsystems = match file.subsystems() {
        Ok(subsystems) => subsystems,
        Err(e) => return fail(e),
    };
    if subsystems.is_empty() {
        return fail("nothing to serve: give --subsystem/--namespace or a [[subsystem]] in --config");
    }
    let Some(device) = file.target.device.clone() else {
        return fail("no --device (vfio-user:PATH or pci)");
    };
    let Some(mtu) = Mtu::from_bytes(arguments.mtu) else {
        return fail(format!("MTU {}: 256, 512, 1024, 2048 or 4096", arguments.mtu));
    };
    let cm = match CmChoice::parse(&arguments.cm, &arguments.neighbours) {
        Ok(cm) => cm,
        Err(e) => return fail(e),
    };
    let context = match open_context(&device, file.target.ip) {
        Ok(context) => context,
        Err(e) => return fail(e),
    };
    let path = RcPathConfig {
        path_mtu: mtu,
        ack_timeout: 14,
        ..RcPathConfig::default()
    };
    let listener: Box<dyn Listener> = match cm.listen(&context, path, config.listen) {
        Ok(listener) => listener,
        Err(e) => return fail(e),
    };
    let address = config.listen;
    let mut target = match Target::new(context, listener, Clock::wall(), config, subsystems) {
        Ok(target) => target,
        Err(e) => return fail(e),
    };
    if let Err(e) = rnic_os::install_termination_handlers() {
        return fail(format!("signal handlers: {e}"));
    }
    for subsystem in target.subsystems().iter().skip(1) {
        for namespace in subsystem.namespaces.values() {
            println!(
                "subsystem {} namespace {}: {} blocks of {} bytes",
                subsystem.nqn,
                namespace.nsid,
                namespace.device.block_count(),
                namespace.device.block_size()
            );
        }
    }
    println!("listening on {address} ({})", arguments.cm);
    let stats = arguments.stats.map(Duration::from_secs_f64);
    let mut last_stats = Instant::now();
    let mut idle = 0u32;
    while !rnic_os::termination_requested() {
        if target.poll() > 0 {
            idle = 0;
        } else {
            // Spin briefly, then give the CPU to the emulator that produces completions.
            idle = idle.saturating_add(1);
            if idle > 64 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        }
        if let Some(period) = stats {
            if last_stats.elapsed() >= period {
                last_stats = Instant::now();
                let c = target.counters();
                eprintln!(
                    "controllers {} queues {} | commands {} ok {} failed | read {} B written {} B | rdma errors {} \
                     keep-alive expirations {}",
                    target.controller_count(),
                    target.queue_count(),
                    c.commands_succeeded,
                    c.commands_failed,
                    c.bytes_read,
                    c.bytes_written,
                    c.rdma_errors,
                    c.keep_alive_expirations
                );
            }
        }
    }
    target.shutdown();
    let c = target.counters();
    eprintln!(
        "rnic-nvmf-tgt: {} commands ({} failed), {} controllers served",
        c.commands_succeeded + c.commands_failed,
        c.commands_failed,
        c.controllers_created
    );
    ExitCode::SUCCESS
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
    fn flags_build_subsystems() {
        let arguments = Arguments::parse_from([
            "rnic-nvmf-tgt",
            "--device",
            "vfio-user:/tmp/x",
            "--ip",
            "10.0.0.1",
            "--namespace",
            "nqn.a,1,ram:1MiB",
            "--allow-host",
            "nqn.a,nqn.host:1",
            "--subsystem",
            "nqn.b",
        ]);
        let file = configuration(&arguments).unwrap();
        assert_eq!(file.subsystem.len(), 2);
        let a = file.subsystem.iter().find(|s| s.nqn == "nqn.a").unwrap();
        assert_eq!(a.namespace.len(), 1);
        assert_eq!(a.allowed_hosts, vec!["nqn.host:1".to_string()]);
        assert_eq!(file.target_config().unwrap().listen.to_string(), "10.0.0.1:4420");
    }
}
