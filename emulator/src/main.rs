//! `rnic-emu`: runs the rnic device model.
//!
//! Today the binary has one job: bring up two embedded NICs in this process through
//! their registers (no VM, no root, no network), create the objects an RDMA application
//! needs on each, connect a QP pair, and report what the devices say about themselves.
//! The vfio-user server and the network backends arrive with later issues.

use std::process::ExitCode;

const USAGE: &str = "\
usage: rnic-emu [--verbose] [--help]

Brings up two embedded rnic NICs through their registers, creates a protection
domain, a memory region, a completion queue, a shared receive queue and an RC queue
pair on each, connects the two queue pairs, and prints the capabilities and objects.

  --verbose   log device diagnostics and driver steps (RUST_LOG=... also works)
  --help      print this text
";

fn main() -> ExitCode {
    let mut verbose = false;
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--verbose" | "-v" => verbose = true,
            "--help" | "-h" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("rnic-emu: unknown argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let default_filter = if verbose { "debug" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

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
