//! `rnic-nvme`: nvme-cli's fabrics commands from user space, on one of our NICs.
//!
//! ```text
//! rnic-nvme discover --device vfio-user:/tmp/b.sock --ip 127.0.0.2 -a 127.0.0.1 -s 4420
//! rnic-nvme connect  --device ... -a 127.0.0.1 -n nqn.2024-01.io.rnic-emu:disk1
//! rnic-nvme id-ctrl | id-ns | smart-log | error-log  --device ... -a ... -n ...
//! rnic-nvme read  --device ... -a ... -n ... --namespace-id 1 -s 0 -c 7 --data out.bin
//! rnic-nvme write --device ... -a ... -n ... --namespace-id 1 -s 0 -c 7 --data in.bin
//! ```
//!
//! A user-space host leaves no block device behind: `connect` connects, shows the
//! controller and its namespaces (as `nvme list` would) and disconnects.
// The field docs are the command's --help text, in which `[...]` marks what may be left
// out, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use rnic_storage::nvmeof::host::{Host, HostConfig};
use rnic_storage::nvmeof::wire::command::log_page;
use rnic_storage::nvmeof::wire::log::{ErrorLogEntry, ErrorLogEntryRepr, SmartLog, SmartLogRepr};
use rnic_storage::rdma::setup::{open_context, CmChoice};
use rnic_storage::rdma::{Connector, RcPathConfig, ServiceAddress, WallReactor};
use rnic_verbs::Context;

/// nvme-cli's fabrics commands over rnic-emu.
#[derive(Debug, Parser)]
#[command(name = "rnic-nvme", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args, Clone)]
struct Connection {
    /// The NIC: vfio-user:PATH[,mac=MAC] or pci[:BDF][,mac=MAC].
    #[arg(long)]
    device: String,
    /// The NIC's IPv4 address (GID 0).
    #[arg(long)]
    ip: Option<Ipv4Addr>,
    /// Target address.
    #[arg(short = 'a', long = "traddr")]
    traddr: Ipv4Addr,
    /// Target port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    trsvcid: u16,
    /// This host's NQN.
    #[arg(short = 'q', long = "hostnqn")]
    hostnqn: Option<String>,
    /// Print JSON.
    #[arg(short = 'o', long = "output-format", default_value = "normal")]
    output: String,
    /// Connection management: rdma (the RDMA CM on QP1, as Linux targets use) or exchange
    /// (our TCP exchange).
    #[arg(long, default_value = "rdma")]
    cm: String,
    /// How the RDMA CM finds the target's MAC: kernel (`rnic-emu --net eth:`), udp
    /// (`--net udp:`) or IP=MAC[,IP=MAC...].
    #[arg(long, default_value = "kernel")]
    neighbours: String,
}

#[derive(Debug, Args, Clone)]
struct Subsystem {
    #[command(flatten)]
    connection: Connection,
    /// Subsystem NQN.
    #[arg(short = 'n', long = "nqn")]
    nqn: String,
    /// I/O queues.
    #[arg(short = 'i', long = "nr-io-queues", default_value_t = 1)]
    io_queues: u16,
    /// I/O queue entries.
    #[arg(short = 'Q', long = "queue-size", default_value_t = 128)]
    queue_size: u16,
    /// Keep-alive timeout, seconds.
    #[arg(short = 'k', long = "keep-alive-tmo", default_value_t = 5)]
    keep_alive: u32,
}

#[derive(Debug, Args, Clone)]
struct Io {
    #[command(flatten)]
    subsystem: Subsystem,
    /// Namespace.
    #[arg(long = "namespace-id", default_value_t = 1)]
    nsid: u32,
    /// First block (`-s` is the target's port here).
    #[arg(long = "start-block", default_value_t = 0)]
    start: u64,
    /// Blocks minus one (nvme-cli's 0-based count).
    #[arg(short = 'c', long = "block-count", default_value_t = 0)]
    count: u32,
    /// Data file (read: written; write: read). Without it, read prints hex.
    #[arg(short = 'd', long = "data")]
    data: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read the Discovery log page.
    Discover(Connection),
    /// Connect, show the controller and its namespaces, disconnect.
    Connect(Subsystem),
    /// Identify Controller.
    IdCtrl(Subsystem),
    /// Identify Namespace.
    IdNs {
        #[command(flatten)]
        subsystem: Subsystem,
        /// Namespace.
        #[arg(long = "namespace-id", default_value_t = 1)]
        nsid: u32,
    },
    /// The SMART / Health log page.
    SmartLog(Subsystem),
    /// The Error Information log page.
    ErrorLog(Subsystem),
    /// Read blocks.
    Read(Io),
    /// Write blocks.
    Write(Io),
}

/// The NIC and a connector as the flags say.
fn endpoint(connection: &Connection) -> Result<(Context, Box<dyn Connector>), String> {
    let context = open_context(&connection.device, connection.ip)?;
    let cm = CmChoice::parse(&connection.cm, &connection.neighbours)?;
    let connector = cm.connector(
        &context,
        RcPathConfig {
            ack_timeout: 14,
            ..RcPathConfig::default()
        },
    )?;
    Ok((context, connector))
}

fn open(connection: &Connection, nqn: &str, io_queues: u16, queue_size: u16, kato_s: u32) -> Result<Host, String> {
    let (context, connector) = endpoint(connection)?;
    let defaults = HostConfig::default();
    let config = HostConfig {
        host_nqn: connection.hostnqn.clone().unwrap_or(defaults.host_nqn.clone()),
        subsystem_nqn: nqn.into(),
        target: ServiceAddress::new(connection.traddr, connection.trsvcid),
        io_queues,
        queue_entries: queue_size,
        kato_ms: kato_s.saturating_mul(1000),
        reconnect_attempts: 0,
        ..defaults
    };
    if nqn == rnic_storage::nvmeof::host::DISCOVERY_NQN {
        return Err("use discover for the discovery subsystem".into());
    }
    Host::connect(context, connector, Box::new(WallReactor::default()), config).map_err(|e| e.to_string())
}

fn subsystem_host(s: &Subsystem) -> Result<Host, String> {
    open(&s.connection, &s.nqn, s.io_queues, s.queue_size, s.keep_alive)
}

fn json(output: &str) -> bool {
    output == "json"
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rnic-nvme: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Discover(connection) => discover(&connection),
        Command::Connect(s) => {
            let host = subsystem_host(&s)?;
            let id = host.controller().clone();
            if json(&s.connection.output) {
                let namespaces: Vec<_> = host
                    .namespaces()
                    .iter()
                    .map(|n| serde_json::json!({"nsid": n.nsid, "block_size": n.block_size, "blocks": n.blocks}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({
                        "subnqn": id.subnqn, "cntlid": host.cntlid(), "serial": id.serial_number,
                        "model": id.model_number, "firmware": id.firmware_revision,
                        "io_queues": host.io_queues(), "queue_size": host.io_queue_entries(),
                        "namespaces": namespaces,
                    })
                );
            } else {
                println!(
                    "connected to {} (controller {}, {} I/O queue(s) of {})",
                    id.subnqn,
                    host.cntlid(),
                    host.io_queues(),
                    host.io_queue_entries()
                );
                println!(
                    "{:<22} {:<40} {:>5} {:>16} {:>8}",
                    "Serial", "Model", "NSID", "Size", "Format"
                );
                for n in host.namespaces() {
                    println!(
                        "{:<22} {:<40} {:>5} {:>16} {:>8}",
                        id.serial_number,
                        id.model_number,
                        n.nsid,
                        format!("{} B", n.blocks * u64::from(n.block_size)),
                        format!("{} B", n.block_size)
                    );
                }
            }
            host.disconnect().map_err(|e| e.to_string())
        }
        Command::IdCtrl(s) => {
            let mut host = subsystem_host(&s)?;
            let id = host.identify_controller().map_err(|e| e.to_string())?;
            if json(&s.connection.output) {
                println!(
                    "{}",
                    serde_json::json!({
                        "vid": id.vid, "sn": id.serial_number, "mn": id.model_number, "fr": id.firmware_revision,
                        "mdts": id.mdts, "cntlid": id.cntlid, "ver": id.version, "cntrltype": id.cntrltype,
                        "aerl": id.aerl, "kas": id.kas, "sqes": id.sqes, "cqes": id.cqes, "maxcmd": id.maxcmd,
                        "nn": id.nn, "oncs": id.oncs, "vwc": id.vwc, "sgls": id.sgls, "subnqn": id.subnqn,
                        "ioccsz": id.ioccsz, "iorcsz": id.iorcsz, "icdoff": id.icdoff, "msdbd": id.msdbd,
                    })
                );
            } else {
                println!("NVME Identify Controller:");
                for (name, value) in [
                    ("vid", format!("{:#06x}", id.vid)),
                    ("sn", id.serial_number.clone()),
                    ("mn", id.model_number.clone()),
                    ("fr", id.firmware_revision.clone()),
                    ("mdts", id.mdts.to_string()),
                    ("cntlid", format!("{:#x}", id.cntlid)),
                    ("ver", format!("{:#010x}", id.version)),
                    ("cntrltype", id.cntrltype.to_string()),
                    ("kas", id.kas.to_string()),
                    ("sqes", format!("{:#x}", id.sqes)),
                    ("cqes", format!("{:#x}", id.cqes)),
                    ("maxcmd", id.maxcmd.to_string()),
                    ("nn", id.nn.to_string()),
                    ("oncs", format!("{:#x}", id.oncs)),
                    ("vwc", format!("{:#x}", id.vwc)),
                    ("sgls", format!("{:#x}", id.sgls)),
                    ("subnqn", id.subnqn.clone()),
                    ("ioccsz", id.ioccsz.to_string()),
                    ("iorcsz", id.iorcsz.to_string()),
                    ("icdoff", id.icdoff.to_string()),
                    ("msdbd", id.msdbd.to_string()),
                ] {
                    println!("{name:<10}: {value}");
                }
            }
            host.disconnect().map_err(|e| e.to_string())
        }
        Command::IdNs { subsystem, nsid } => {
            let mut host = subsystem_host(&subsystem)?;
            let ns = host.identify_namespace(nsid).map_err(|e| e.to_string())?;
            println!("NVME Identify Namespace {nsid}:");
            println!("nsze    : {:#x}", ns.nsze);
            println!("ncap    : {:#x}", ns.ncap);
            println!("nuse    : {:#x}", ns.nuse);
            println!("nlbaf   : {}", ns.lba_formats.len().saturating_sub(1));
            println!("flbas   : {:#x}", ns.flbas);
            println!("nmic    : {:#x}", ns.nmic);
            println!("dlfeat  : {}", ns.dlfeat);
            println!(
                "nguid   : {}",
                ns.nguid.iter().map(|b| format!("{b:02x}")).collect::<String>()
            );
            for (i, f) in ns.lba_formats.iter().enumerate() {
                println!("lbaf {i:>2} : ms:{} lbads:{} rp:{:#x}", f.ms, f.lbads, f.rp);
            }
            host.disconnect().map_err(|e| e.to_string())
        }
        Command::SmartLog(s) => {
            let mut host = subsystem_host(&s)?;
            let page = host
                .get_log_page(log_page::SMART, u32::MAX, 0, 512)
                .map_err(|e| e.to_string())?;
            let view = SmartLog::new_checked(&page[..]).map_err(|e| e.to_string())?;
            let smart = SmartLogRepr::parse(&view).map_err(|e| e.to_string())?;
            println!("Smart Log for NVME device");
            println!("critical_warning          : {}", smart.critical_warning);
            println!(
                "temperature               : {} C",
                i32::from(smart.temperature_kelvin) - 273
            );
            println!("available_spare           : {}%", smart.available_spare);
            println!("percentage_used           : {}%", smart.percentage_used);
            println!("data_units_read           : {}", smart.data_units_read);
            println!("data_units_written        : {}", smart.data_units_written);
            println!("host_read_commands        : {}", smart.host_read_commands);
            println!("host_write_commands       : {}", smart.host_write_commands);
            println!("power_on_hours            : {}", smart.power_on_hours);
            println!("media_errors              : {}", smart.media_errors);
            println!("num_err_log_entries       : {}", smart.error_log_entries);
            host.disconnect().map_err(|e| e.to_string())
        }
        Command::ErrorLog(s) => {
            let mut host = subsystem_host(&s)?;
            let page = host
                .get_log_page(log_page::ERROR, 0, 0, 16 * 64)
                .map_err(|e| e.to_string())?;
            for (i, chunk) in page.chunks_exact(64).enumerate() {
                let view = ErrorLogEntry::new_checked(chunk).map_err(|e| e.to_string())?;
                let entry = ErrorLogEntryRepr::parse(&view).map_err(|e| e.to_string())?;
                if entry.error_count == 0 {
                    continue;
                }
                println!(
                    "entry {i}: error_count {} sqid {} cmdid {:#x} status {} lba {:#x} nsid {}",
                    entry.error_count, entry.sqid, entry.cid, entry.status, entry.lba, entry.nsid
                );
            }
            host.disconnect().map_err(|e| e.to_string())
        }
        Command::Read(io) => {
            let mut host = subsystem_host(&io.subsystem)?;
            let block_size = host
                .namespace(io.nsid)
                .ok_or_else(|| format!("namespace {} is not active", io.nsid))?
                .block_size as usize;
            let mut data = vec![0u8; block_size * (io.count as usize + 1)];
            host.read(io.nsid, io.start, &mut data).map_err(|e| e.to_string())?;
            match &io.data {
                Some(path) => std::fs::write(path, &data).map_err(|e| format!("{}: {e}", path.display()))?,
                None => {
                    let mut out = std::io::stdout().lock();
                    for (i, line) in data.chunks(16).enumerate() {
                        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
                        let _ = writeln!(out, "{:08x}: {}", i * 16, hex.join(" "));
                    }
                }
            }
            println!("read: Success");
            host.disconnect().map_err(|e| e.to_string())
        }
        Command::Write(io) => {
            let mut host = subsystem_host(&io.subsystem)?;
            let block_size = host
                .namespace(io.nsid)
                .ok_or_else(|| format!("namespace {} is not active", io.nsid))?
                .block_size as usize;
            let length = block_size * (io.count as usize + 1);
            let path = io.data.as_ref().ok_or("write needs --data FILE")?;
            let mut data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            data.resize(length, 0);
            host.write(io.nsid, io.start, &data).map_err(|e| e.to_string())?;
            host.flush(io.nsid).map_err(|e| e.to_string())?;
            println!("write: Success");
            host.disconnect().map_err(|e| e.to_string())
        }
    }
}

fn discover(connection: &Connection) -> Result<(), String> {
    let (context, connector) = endpoint(connection)?;
    let defaults = HostConfig::default();
    let config = HostConfig {
        host_nqn: connection.hostnqn.clone().unwrap_or(defaults.host_nqn.clone()),
        target: ServiceAddress::new(connection.traddr, connection.trsvcid),
        ..defaults
    };
    let entries =
        Host::discover(context, connector, Box::new(WallReactor::default()), config).map_err(|e| e.to_string())?;
    if json(&connection.output) {
        let records: Vec<_> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "trtype": "rdma", "adrfam": "ipv4", "subtype": if e.subtype == 2 { "nvme subsystem" } else { "discovery subsystem" },
                    "portid": e.portid, "trsvcid": e.trsvcid, "subnqn": e.subnqn, "traddr": e.traddr,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "records": records }));
        return Ok(());
    }
    println!("\nDiscovery Log Number of Records {}", entries.len());
    for (i, e) in entries.iter().enumerate() {
        println!("=====Discovery Log Entry {i}======");
        println!("trtype:  {}", if e.trtype == 1 { "rdma" } else { "unrecognized" });
        println!("adrfam:  {}", if e.adrfam == 1 { "ipv4" } else { "unrecognized" });
        println!(
            "subtype: {}",
            match e.subtype {
                2 => "nvme subsystem",
                3 => "current discovery subsystem",
                _ => "discovery subsystem referral",
            }
        );
        println!("treq:    not specified");
        println!("portid:  {}", e.portid);
        println!("trsvcid: {}", e.trsvcid);
        println!("subnqn:  {}", e.subnqn);
        println!("traddr:  {}", e.traddr);
        println!("rdma_prtype: not specified");
        println!("rdma_qptype: connected");
        println!("rdma_cms:    rdma-cm");
        println!("rdma_pkey: {:#06x}", e.rdma_pkey);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
