//! `rnic-srp-tgt`: an SRP target on one of our NICs (`--device vfio-user:PATH` behind
//! `rnic-emu serve`, or a PCI function), logical units on RAM or files, logins through
//! the RDMA CM on an admin-chosen port (Linux `ib_srp` over RoCE: `add_target` with
//! `dest=IP:PORT`), or the TCP exchange between processes of ours.
//!
//! ```text
//! rnic-srp-tgt --device vfio-user:/tmp/a.sock,mac=02:52:4e:49:43:01 --ip 10.0.0.1 \
//!     --lun 0,file:/var/tmp/disk0.img,size=256MiB --lun 1,ram:64MiB,bs=4096
//! ```
//!
//! The target port identifier initiators log in to is `--id-ext` ‖ `--ioc-guid`
//! (Linux: `id_ext=…,ioc_guid=…` in the `add_target` string).
// The field docs are the command's --help text, in which `[...]` marks what may be left
// out, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rnic_storage::block::{BlockDevice, FileBackend, FileMode, RamBackend};
use rnic_storage::nvmeof::config::parse_size;
use rnic_storage::rdma::setup::{open_context, CmChoice};
use rnic_storage::rdma::{Listener, RcPathConfig, ServiceAddress};
use rnic_storage::scsi::lu::{LogicalUnit, LuConfig, LunMap};
use rnic_storage::srp::target::{Target, TargetConfig};
use rnic_storage::srp::wire::PortId;
use rnic_verbs::Mtu;

/// SRP target.
#[derive(Debug, Parser)]
#[command(name = "rnic-srp-tgt", version)]
struct Arguments {
    /// The NIC: vfio-user:PATH[,mac=MAC] or pci[:BDF][,mac=MAC].
    #[arg(long)]
    device: String,
    /// The NIC's IPv4 address (GID 0) and the default listen address.
    #[arg(long)]
    ip: Ipv4Addr,
    /// Listen address IP:PORT [default: IP:5555, the port blktests uses].
    #[arg(long)]
    listen: Option<ServiceAddress>,
    /// A logical unit: LUN,ram:SIZE[,bs=N] or LUN,file:PATH[,size=SIZE][,bs=N][,direct]
    /// (repeat for more).
    #[arg(long = "lun", required = true)]
    luns: Vec<String>,
    /// Identifier extension of the target port ID (16 hex digits).
    #[arg(long, default_value = "0002524e49430001")]
    id_ext: String,
    /// GUID of the target port ID (16 hex digits).
    #[arg(long, default_value = "0002524e49430001")]
    ioc_guid: String,
    /// Credits (request limit) a channel gets.
    #[arg(long, default_value_t = 128)]
    credits: u32,
    /// Largest transfer, bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    max_transfer: u32,
    /// Serve no immediate data.
    #[arg(long)]
    no_immediate: bool,
    /// Path MTU of the QPs (256..4096).
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Connection management: `rdma` (the RDMA CM on QP1, as Linux initiators use) or
    /// `exchange` (a TCP exchange between processes of ours).
    #[arg(long, default_value = "rdma")]
    cm: String,
    /// How the RDMA CM finds peers' MACs: kernel, udp or IP=MAC[,IP=MAC...].
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
    eprintln!("rnic-srp-tgt: {message}");
    ExitCode::from(2)
}

fn hex64(name: &str, text: &str) -> Result<u64, String> {
    u64::from_str_radix(text.trim_start_matches("0x"), 16).map_err(|e| format!("--{name} {text:?}: {e}"))
}

/// LUN,ram:SIZE[,bs=N] or LUN,file:PATH[,size=SIZE][,bs=N][,direct].
fn parse_lun(flag: &str, max_transfer: u32) -> Result<(u16, LogicalUnit), String> {
    let invalid = |why: &str| format!("--lun {flag:?}: {why}");
    let mut parts = flag.split(',');
    let lun: u16 = parts
        .next()
        .and_then(|l| l.parse().ok())
        .filter(|l| *l < 16384)
        .ok_or_else(|| invalid("a LUN number below 16384 first"))?;
    let backend = parts.next().ok_or_else(|| invalid("ram:SIZE or file:PATH"))?;
    let (mut size, mut block_size, mut direct) = (None, 512u32, false);
    for option in parts {
        match option.split_once('=') {
            Some(("size", v)) => size = Some(parse_size(v).map_err(|e| invalid(&e.to_string()))?),
            Some(("bs", v)) => block_size = v.parse().map_err(|_| invalid("bs=512 or bs=4096"))?,
            None if option == "direct" => direct = true,
            _ => return Err(invalid(&format!("unknown option {option:?}"))),
        }
    }
    let blocks = |bytes: u64| bytes / u64::from(block_size);
    let (device, product, serial): (Arc<dyn BlockDevice>, &str, String) = match backend.split_once(':') {
        Some(("ram", bytes)) => {
            let bytes = parse_size(bytes).map_err(|e| invalid(&e.to_string()))?;
            (
                Arc::new(RamBackend::new(block_size, blocks(bytes)).map_err(|e| invalid(&e.to_string()))?),
                "RAMDISK",
                format!("rnic-ram-{lun}"),
            )
        }
        Some(("file", path)) => {
            let mode = if direct { FileMode::Direct } else { FileMode::Buffered };
            let path = Path::new(path);
            let backend = match size {
                Some(bytes) => FileBackend::create(path, block_size, blocks(bytes), mode),
                None => FileBackend::open(path, block_size, mode),
            }
            .map_err(|e| invalid(&e.to_string()))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (Arc::new(backend), "FILEIO", format!("rnic-{name}"))
        }
        _ => return Err(invalid("ram:SIZE or file:PATH")),
    };
    let config = LuConfig {
        product: product.into(),
        serial,
        max_transfer_bytes: max_transfer,
        // A file has a page cache to flush: initiators then send SYNCHRONIZE CACHE.
        write_cache: product == "FILEIO" && !direct,
        ..LuConfig::default()
    };
    Ok((lun, LogicalUnit::new(device, config)))
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let filter = arguments.log.clone().unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let target_port_id = match (
        hex64("id-ext", &arguments.id_ext),
        hex64("ioc-guid", &arguments.ioc_guid),
    ) {
        (Ok(ext), Ok(guid)) => PortId::new(ext, guid),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let mut luns = LunMap::new();
    for flag in &arguments.luns {
        match parse_lun(flag, arguments.max_transfer) {
            Ok((lun, unit)) => {
                println!(
                    "LUN {lun}: {} blocks of {} bytes ({})",
                    unit.device().block_count(),
                    unit.device().block_size(),
                    unit.config().serial
                );
                luns.insert(lun, unit);
            }
            Err(e) => return fail(e),
        }
    }
    let Some(mtu) = Mtu::from_bytes(arguments.mtu) else {
        return fail(format!("MTU {}: 256, 512, 1024, 2048 or 4096", arguments.mtu));
    };
    let cm = match CmChoice::parse(&arguments.cm, &arguments.neighbours) {
        Ok(cm) => cm,
        Err(e) => return fail(e),
    };
    let context = match open_context(&arguments.device, Some(arguments.ip)) {
        Ok(context) => context,
        Err(e) => return fail(e),
    };
    let path = RcPathConfig {
        path_mtu: mtu,
        ack_timeout: 14,
        ..RcPathConfig::default()
    };
    let address = arguments.listen.unwrap_or(ServiceAddress::new(arguments.ip, 5555));
    let listener: Box<dyn Listener> = match cm.listen(&context, path, address) {
        Ok(listener) => listener,
        Err(e) => return fail(e),
    };
    let config = TargetConfig {
        target_port_id,
        credits: arguments.credits,
        immediate_data: !arguments.no_immediate,
        data_pool_bytes: (arguments.max_transfer as usize * 16).max(8 << 20),
        ..TargetConfig::default()
    };
    let mut target = match Target::new(context, listener, config, luns) {
        Ok(target) => target,
        Err(e) => return fail(e),
    };
    if let Err(e) = rnic_os::install_termination_handlers() {
        return fail(format!("signal handlers: {e}"));
    }
    println!(
        "listening on {address} ({}), target port ID {target_port_id} (id_ext={},ioc_guid={})",
        arguments.cm, arguments.id_ext, arguments.ioc_guid
    );
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
                    "channels {} | commands {} good {} failed | in {} B out {} B | malformed {} overruns {} rdma errors {}",
                    target.channel_count(),
                    c.commands_good,
                    c.commands_failed,
                    c.bytes_from_initiators,
                    c.bytes_to_initiators,
                    c.malformed_ius,
                    c.credit_overruns,
                    c.rdma_errors
                );
            }
        }
    }
    target.logout_all();
    let deadline = Instant::now() + Duration::from_millis(500);
    while target.channel_count() > 0 && Instant::now() < deadline {
        target.poll();
        std::thread::sleep(Duration::from_micros(100));
    }
    target.shutdown();
    let c = target.counters();
    eprintln!(
        "rnic-srp-tgt: {} logins ({} refused), {} commands ({} failed)",
        c.logins_accepted,
        c.logins_rejected,
        c.commands_good + c.commands_failed,
        c.commands_failed
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
    fn lun_flags() {
        let (lun, unit) = parse_lun("3,ram:1MiB,bs=4096", 65536).unwrap();
        assert_eq!(
            (lun, unit.device().block_count(), unit.device().block_size()),
            (3, 256, 4096)
        );
        assert!(parse_lun("3,ram:1MiB,colour=red", 65536).is_err());
        assert!(parse_lun("x,ram:1MiB", 65536).is_err());
        assert!(parse_lun("20000,ram:1MiB", 65536).is_err());
        assert!(parse_lun("1,tape:1", 65536).is_err());
        assert_eq!(hex64("id-ext", "0x0011223344556677").unwrap(), 0x0011_2233_4455_6677);
    }
}
