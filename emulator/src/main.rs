//! `rnic-emu`: runs the rnic device model.
//!
//! * No arguments, or `demo`: bring up two embedded NICs in this process through their
//!   registers (no VM, no root, no network), create the objects an RDMA application
//!   needs on each, connect a QP pair, and report what the devices say about themselves.
//! * `serve --socket PATH`: run one NIC as a vfio-user PCI device for QEMU 10.1+ or a
//!   user-space driver (see `docs/guides/emulator.md`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use rnic_emu::config::{self, ConfigFile, Overrides};
use rnic_emu::timing::TimingMode;
use rnic_emu::vfio_user::Server;

/// Runs the rnic RDMA NIC model: the embedded two-NIC demo (default), or one NIC as a
/// vfio-user PCI device.
#[derive(Debug, Parser)]
#[command(
    name = "rnic-emu",
    version,
    after_help = "Without a command, runs `demo`. Logs go to stderr; see --log."
)]
struct Cli {
    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives such as
    /// `info,rnic_emu::vfio_user=debug`. Overrides RUST_LOG. Default: warn for `demo`,
    /// info for `serve` (or the config file's `log`).
    #[arg(long, value_name = "LEVEL", global = true)]
    log: Option<String>,

    /// Same as --log debug: device diagnostics and driver steps.
    #[arg(short, long, global = true)]
    verbose: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring up two embedded NICs in this process and print what they report (default).
    ///
    /// No VM, no root, no network: creates a PD, an MR, a CQ, an SRQ and an RC QP on
    /// each NIC, connects the QPs and prints the capabilities and objects.
    Demo,
    /// Run one NIC as a vfio-user PCI device on a Unix socket.
    ///
    /// For QEMU 10.1+ (`-device '{"driver":"vfio-user-pci","socket":{"type":"unix",
    /// "path":"PATH"}}'` with guest RAM from `memory-backend-memfd,share=on`) or a
    /// user-space driver acting as the vfio-user client. One client at a time; clients
    /// may come and go, the device keeps its state. Runs until SIGINT or SIGTERM, then
    /// removes the socket. See docs/guides/emulator.md.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Path of the Unix socket to listen on. Created with mode 0600; a stale socket left
    /// by a dead server is replaced, a live one is an error. Required here or as
    /// `socket` in the config file.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// MAC address of the NIC's port (six hex bytes, e.g. 02:52:4e:49:43:01); also the
    /// source of its default GID. Default 02:52:4e:49:43:01.
    #[arg(long, value_name = "MAC")]
    mac: Option<String>,

    /// How the model's virtual time maps to the wall clock: `realtime` paces virtual
    /// time to the wall clock (a 2 µs command takes about 2 µs); `fast` runs every event
    /// as soon as it is due, as fast as the CPU allows. Default realtime.
    #[arg(long, value_name = "MODE")]
    timing: Option<TimingMode>,

    /// TOML file with everything else: device identity and sizes, vfio-user limits,
    /// doorbell polling (see docs/guides/emulator.md). Command-line options win over the
    /// same keys in the file.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,

    /// Write every Ethernet frame the NIC sends or receives to this pcap file
    /// (nanosecond timestamps).
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,

    /// Network backend: `none` (default) drops the frames the NIC sends (still captured
    /// with --pcap); `udp:IP` carries RoCEv2 over a UDP socket bound to IP:4791, no root
    /// needed (several emulators on one host use 127.0.0.1, 127.0.0.2, ...; the NIC's GIDs
    /// must be those addresses). `eth:IFACE` sends and receives whole Ethernet frames on a
    /// network interface (a veth in a network namespace, or a real port) and answers ARP
    /// and IPv6 neighbour solicitations for the NIC's GIDs; needs CAP_NET_RAW (root).
    #[arg(long, value_name = "BACKEND")]
    net: Option<String>,
}

fn init_logging(cli: &Cli, file_level: Option<&str>, default: &str) {
    let directives = if let Some(level) = &cli.log {
        level.clone()
    } else if cli.verbose {
        "debug".to_string()
    } else if let Ok(from_env) = std::env::var("RUST_LOG") {
        from_env
    } else {
        file_level.unwrap_or(default).to_string()
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|error| {
        eprintln!("rnic-emu: bad log filter {directives:?} ({error}); using {default}");
        tracing_subscriber::EnvFilter::new(default)
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn demo(cli: &Cli) -> ExitCode {
    init_logging(cli, None, "warn");
    match rnic_verbs::demo::bring_up_two_nics_report() {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rnic-emu: bring-up failed: {error}");
            ExitCode::FAILURE
        }
    }
}

fn serve(cli: &Cli, args: &ServeArgs) -> ExitCode {
    let file = match args.config.as_deref().map(ConfigFile::load).transpose() {
        Ok(file) => file.unwrap_or_default(),
        Err(error) => {
            eprintln!("rnic-emu: {error}");
            return ExitCode::from(2);
        }
    };
    init_logging(cli, file.log.as_deref(), "info");
    let overrides = Overrides {
        socket: args.socket.clone(),
        mac: args.mac.clone(),
        timing: args.timing,
        net: args.net.clone(),
        pcap: args.pcap.clone(),
    };
    let options = match config::resolve(&file, &overrides) {
        Ok(resolved) => resolved,
        Err(error) => {
            eprintln!("rnic-emu: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = rnic_emu::os::install_termination_handlers() {
        eprintln!("rnic-emu: cannot install signal handlers: {error}");
        return ExitCode::FAILURE;
    }
    let socket = options.socket.clone();
    let server = match Server::bind(options) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("rnic-emu: cannot serve on {}: {error}", socket.display());
            return ExitCode::FAILURE;
        }
    };
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rnic-emu: server failed: {error}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        None | Some(Command::Demo) => demo(&cli),
        Some(Command::Serve(args)) => serve(&cli, args),
    }
}
