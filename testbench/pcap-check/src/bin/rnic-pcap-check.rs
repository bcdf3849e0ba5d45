//! `rnic-pcap-check`: checks RoCEv2 captures (see the crate documentation). Exit status 0
//! when every capture passed, 1 when one did not, 2 when one could not be checked.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rnic_pcap_check::{check_file, CheckOptions, SharedOracle};

/// Checks every RoCEv2 frame of pcap/pcapng captures: the ICRC recomputed by the project's
/// own code, tshark's InfiniBand dissector with no malformed frame and no error, and (where
/// `$ROCE_ORACLES_DIR` or `shared/oracles` beside the repository has it) check-roce-pcap as
/// a second opinion. The last line of a passing capture is "N RoCEv2 frames, all ICRC good".
#[derive(Debug, Parser)]
#[command(name = "rnic-pcap-check", version)]
struct Arguments {
    /// Accept UDP checksum 0 over IPv6 (as rdma_rxe sends).
    #[arg(long = "allow-zero-udp-csum")]
    allow_zero_udp_checksum: bool,
    /// Accept a capture with no RoCEv2 frame (by default that fails: nothing was checked).
    #[arg(long)]
    allow_empty: bool,
    /// Load this Lua script into tshark too (repeatable); testbench/wireshark/*.lua always are.
    #[arg(long = "lua", value_name = "FILE")]
    lua_scripts: Vec<PathBuf>,
    /// A tshark decode-as rule, e.g. `udp.port==4792,infiniband` (repeatable).
    #[arg(long = "decode-as", value_name = "RULE")]
    decode_as: Vec<String>,
    /// A tshark preference, e.g. `infiniband.rroce.port:4791` (repeatable).
    #[arg(long = "pref", value_name = "NAME:VALUE")]
    preferences: Vec<String>,
    /// Leave one of the InfiniBand payload heuristics enabled that the checker disables.
    #[arg(long = "enable-heuristic", value_name = "NAME")]
    enabled_heuristics: Vec<String>,
    /// The second opinion: `auto` (the default), `off`, or the path of a check-roce-pcap.
    #[arg(long, value_name = "auto|off|PATH", default_value = "auto")]
    shared: String,
    /// The captures.
    #[arg(required = true)]
    captures: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let mut options = CheckOptions {
        allow_zero_udp_checksum: arguments.allow_zero_udp_checksum,
        allow_empty: arguments.allow_empty,
        shared_oracle: match arguments.shared.as_str() {
            "auto" => SharedOracle::Auto,
            "off" => SharedOracle::Off,
            path => SharedOracle::At(PathBuf::from(path)),
        },
        ..CheckOptions::default()
    };
    options.tshark.lua_scripts.extend(arguments.lua_scripts);
    options.tshark.decode_as = arguments.decode_as;
    options.tshark.preferences = arguments.preferences;
    options.tshark.enabled_heuristics = arguments.enabled_heuristics;
    let mut status = ExitCode::SUCCESS;
    for capture in &arguments.captures {
        match check_file(capture, &options) {
            Ok(report) => {
                println!("{report}");
                if !report.passed() {
                    if let Some(shared) = report.shared.as_ref().filter(|s| !s.passed) {
                        println!("{}", shared.output.trim_end());
                    }
                    status = ExitCode::from(1);
                }
            }
            Err(error) => {
                eprintln!("rnic-pcap-check: {error}");
                return ExitCode::from(2);
            }
        }
    }
    status
}
