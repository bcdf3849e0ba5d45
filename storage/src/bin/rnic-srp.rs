//! `rnic-srp`: our SRP initiator on one of our NICs. Logs in to a target by address and
//! port identifiers (Linux LIO `ib_srpt`: `--id-ext` and `--ioc-guid` both its
//! `srpt_service_guid`, the node GUID of its first RDMA device), then:
//!
//! * `info` — REPORT LUNS, and per LUN INQUIRY, the serial number and READ CAPACITY;
//! * `verify` — writes a known pattern, reads it back and compares;
//! * `perf` — the benchmark workload (queue depth, size, mix, verify) on wall time.
//!
//! ```text
//! rnic-srp --device vfio-user:/tmp/b.sock,mac=02:52:4e:49:43:02 --ip 10.0.0.2 \
//!     --target 10.0.0.1:5555 --id-ext 5254:00ff:fe12:3456 … info
//! ```
// The field docs are the command's --help text, in which `[...]` marks what may be left
// out, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::net::Ipv4Addr;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rnic_storage::nvmeof::perf::{Pattern, TimeMode};
use rnic_storage::rdma::setup::{open_context, CmChoice};
use rnic_storage::rdma::{RcPathConfig, ServiceAddress, WallReactor};
use rnic_storage::scsi::data::vpd;
use rnic_storage::srp::initiator::{Initiator, InitiatorConfig};
use rnic_storage::srp::perf::{run, Workload};
use rnic_storage::srp::wire::PortId;
use rnic_verbs::Mtu;

/// SRP initiator.
#[derive(Debug, Parser)]
#[command(name = "rnic-srp", version)]
struct Arguments {
    /// The NIC: vfio-user:PATH[,mac=MAC] or pci[:BDF][,mac=MAC].
    #[arg(long)]
    device: String,
    /// The NIC's IPv4 address (GID 0).
    #[arg(long)]
    ip: Ipv4Addr,
    /// The target's address, IP:PORT.
    #[arg(long)]
    target: ServiceAddress,
    /// Identifier extension of the target port ID: 16 hex digits, colons allowed.
    #[arg(long, default_value = "0002524e49430001")]
    id_ext: String,
    /// GUID of the target port ID: 16 hex digits, colons allowed.
    #[arg(long, default_value = "0002524e49430001")]
    ioc_guid: String,
    /// Identifier extension of this initiator's port ID (the GUID half is the NIC's
    /// EUI-64 interface ID, as Linux builds it from the port GID).
    #[arg(long, default_value = "0")]
    initiator_ext: String,
    /// Ask for no immediate data.
    #[arg(long)]
    no_immediate: bool,
    /// Path MTU of the QP (256..4096).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Connection management: rdma (Linux targets) or exchange (ours, across processes).
    #[arg(long, default_value = "rdma")]
    cm: String,
    /// How the RDMA CM finds the target's MAC: kernel, udp or IP=MAC[,IP=MAC...].
    #[arg(long, default_value = "kernel")]
    neighbours: String,
    /// Log filter (RUST_LOG syntax) [default: warn].
    #[arg(long)]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// REPORT LUNS, INQUIRY, serial number and capacity of every LUN.
    Info,
    /// Write a pattern, read it back, compare.
    Verify {
        /// LUN.
        #[arg(long, default_value_t = 0)]
        lun: u16,
        /// First block.
        #[arg(long, default_value_t = 0)]
        lba: u64,
        /// Bytes per command (whole blocks).
        #[arg(long, default_value_t = 65536)]
        size: u32,
        /// Commands.
        #[arg(long, default_value_t = 16)]
        count: u32,
    },
    /// The benchmark workload.
    Perf {
        /// LUN.
        #[arg(long, default_value_t = 0)]
        lun: u16,
        /// Commands kept outstanding.
        #[arg(long, default_value_t = 16)]
        qd: usize,
        /// Bytes per I/O.
        #[arg(long, default_value_t = 4096)]
        bs: u32,
        /// Percentage of reads.
        #[arg(long, default_value_t = 100)]
        read_percent: u8,
        /// I/Os.
        #[arg(long, default_value_t = 10_000)]
        ios: u64,
        /// Check every read.
        #[arg(long)]
        verify: bool,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn hex64(name: &str, text: &str) -> Result<u64, String> {
    let digits: String = text.trim_start_matches("0x").chars().filter(|c| *c != ':').collect();
    u64::from_str_radix(&digits, 16).map_err(|e| format!("--{name} {text:?}: {e}"))
}

fn login(arguments: &Arguments) -> Result<Initiator, String> {
    let target_port_id = PortId::new(
        hex64("id-ext", &arguments.id_ext)?,
        hex64("ioc-guid", &arguments.ioc_guid)?,
    );
    let mtu = Mtu::from_bytes(arguments.mtu).ok_or_else(|| format!("MTU {}", arguments.mtu))?;
    let cm = CmChoice::parse(&arguments.cm, &arguments.neighbours)?;
    let context = open_context(&arguments.device, Some(arguments.ip))?;
    let mac = context.mac_address();
    let eui64 = u64::from_be_bytes([mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]]);
    let initiator_port_id = PortId::new(hex64("initiator-ext", &arguments.initiator_ext)?, eui64);
    let connector = cm.connector(
        &context,
        RcPathConfig {
            path_mtu: mtu,
            ack_timeout: 14,
            ..RcPathConfig::default()
        },
    )?;
    Initiator::login(
        context,
        connector,
        Box::new(WallReactor::default()),
        InitiatorConfig {
            target: arguments.target,
            initiator_port_id,
            target_port_id,
            immediate_data: !arguments.no_immediate,
            ..InitiatorConfig::default()
        },
    )
    .map_err(|e| format!("login to {}: {e}", arguments.target))
}

fn pattern(length: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; length];
    rnic_storage::nvmeof::perf::fill_pattern(&mut out, 0, 1, seed);
    out
}

fn execute(arguments: &Arguments) -> Result<bool, String> {
    let mut initiator = login(arguments)?;
    let info = initiator.login_info();
    println!(
        "logged in to {}: {} credits, IT IU {} B, TI IU {} B, immediate data {}",
        arguments.target,
        info.response.req_lim_delta,
        info.response.max_it_iu_len,
        info.response.max_ti_iu_len,
        if info.immediate { "yes" } else { "no" }
    );
    let ok = match &arguments.command {
        Command::Info => {
            let luns = initiator.report_luns().map_err(|e| format!("REPORT LUNS: {e}"))?;
            for raw in luns {
                let Some(lun) = rnic_storage::scsi::decode_lun(raw) else {
                    println!("LUN {raw:#018x}: an addressing this tool does not decode");
                    continue;
                };
                let inquiry = initiator.inquiry(lun).map_err(|e| format!("INQUIRY LUN {lun}: {e}"))?;
                let serial = initiator
                    .vpd(lun, vpd::UNIT_SERIAL_NUMBER)
                    .map(|s| {
                        String::from_utf8_lossy(&s)
                            .trim_end_matches(['\0', ' '])
                            .trim()
                            .to_string()
                    })
                    .unwrap_or_default();
                let (blocks, block_size) = initiator
                    .read_capacity(lun)
                    .map_err(|e| format!("READ CAPACITY LUN {lun}: {e}"))?;
                println!(
                    "LUN {lun}: {} {} {} (type {:#04x}), serial {serial:?}, {blocks} blocks of {block_size} bytes",
                    inquiry.vendor, inquiry.product, inquiry.revision, inquiry.peripheral
                );
            }
            true
        }
        Command::Verify { lun, lba, size, count } => {
            let (blocks, block_size) = initiator.read_capacity(*lun).map_err(|e| e.to_string())?;
            let per = u64::from(*size / block_size.max(1));
            if *size == 0 || size % block_size != 0 || lba + per * u64::from(*count) > blocks {
                return Err(format!(
                    "{count} × {size} bytes from LBA {lba} do not fit {blocks} blocks of {block_size}"
                ));
            }
            let mut failures = 0;
            for i in 0..u64::from(*count) {
                let data = pattern(*size as usize, lba + i);
                let at = lba + i * per;
                initiator
                    .write(*lun, at, block_size, &data)
                    .map_err(|e| format!("WRITE at {at}: {e}"))?;
                let mut back = vec![0u8; *size as usize];
                initiator
                    .read(*lun, at, block_size, &mut back)
                    .map_err(|e| format!("READ at {at}: {e}"))?;
                if back != data {
                    failures += 1;
                    eprintln!("LBA {at}: read back differs");
                }
            }
            println!("verify: {count} writes of {size} bytes read back, {failures} differed");
            failures == 0
        }
        Command::Perf {
            lun,
            qd,
            bs,
            read_percent,
            ios,
            verify,
            json,
        } => {
            let report = run(
                &mut initiator,
                &Workload {
                    lun: *lun,
                    io_size: *bs,
                    queue_depth: *qd,
                    read_percent: *read_percent,
                    pattern: Pattern::Random,
                    ios: Some(*ios),
                    verify: *verify,
                    mode: TimeMode::Wall,
                    ..Workload::default()
                },
                &mut |_| {},
            )
            .map_err(|e| e.to_string())?;
            if *json {
                println!("{}", report.to_json());
            } else {
                println!("{}", report.to_table());
            }
            report.errors == 0 && report.verify_failures == 0 && report.ios == *ios
        }
    };
    initiator.logout();
    Ok(ok)
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let filter = arguments.log.clone().unwrap_or_else(|| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    match execute(&arguments) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rnic-srp: {e}");
            ExitCode::from(2)
        }
    }
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
    fn port_identifier_halves_take_colons() {
        assert_eq!(hex64("x", "5254:00ff:fe12:3456").unwrap(), 0x5254_00ff_fe12_3456);
        assert_eq!(hex64("x", "0x10").unwrap(), 16);
        assert!(hex64("x", "zz").is_err());
    }
}
