//! tshark's view of a capture: its InfiniBand dissector decodes every RoCEv2 frame, with
//! IP and UDP checksums checked; the checker then demands no malformed frame and no
//! expert item of severity error, and compares tshark's BTH fields with its own reading.
//!
//! The InfiniBand payload heuristics that claim short SEND payloads as other protocols
//! (RPC-over-RDMA, SMB Direct, iSER, SDP, SMC-R, LNet, FCoIB, Ethernet over IB, Mellanox
//! EoIB) are disabled, as roce-wire §3.5 recommends: their "malformed" verdicts are about
//! a payload they guessed wrong, not about RoCEv2. Names this tshark does not know are
//! left out (it refuses to start on an unknown one).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Heuristic dissectors disabled by default (short names).
pub const DISABLED_HEURISTICS: &[&str] = &[
    "rpcrdma_infiniband",
    "smb_direct_infiniband",
    "iser_infiniband",
    "sdp_infiniband",
    "smcr_infiniband",
    "lnet_ib",
    "fc_infiniband",
    "eth_over_ib",
    "mellanox_eoib",
];

/// Expert severity "error" as tshark prints `_ws.expert.severity`.
const SEVERITY_ERROR: u64 = 0x0080_0000;

/// The aggregator between several values of one field: a byte no field prints.
const AGGREGATOR: &str = "\u{1f}";

/// What tshark was told beyond the checker's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TsharkOptions {
    /// Lua scripts to load (`-X lua_script:FILE`), e.g. a dissector for a protocol tshark
    /// lacks.
    pub lua_scripts: Vec<PathBuf>,
    /// Decode-as rules (`-d layer==value,protocol`).
    pub decode_as: Vec<String>,
    /// Preferences (`-o name:value`).
    pub preferences: Vec<String>,
    /// Heuristics of [`DISABLED_HEURISTICS`] to leave enabled.
    pub enabled_heuristics: Vec<String>,
}

/// tshark's reading of one frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TsharkFrame {
    /// `frame.number`.
    pub number: u64,
    /// BTH opcode, destination QP and PSN, when tshark decoded a BTH.
    pub bth: Option<(u8, u32, u32)>,
    /// Whether a dissector threw (`_ws.malformed`).
    pub malformed: bool,
    /// Expert items of severity error: their messages.
    pub errors: Vec<String>,
    /// `udp.checksum.status` (4: illegal, i.e. zero over IPv6).
    pub udp_checksum_status: Option<u8>,
}

/// Why tshark gave no verdict.
#[derive(Debug, thiserror::Error)]
pub enum TsharkError {
    /// tshark is not installed or cannot be started.
    #[error("cannot run tshark (install the Debian package tshark; scripts/test does): {0}")]
    Missing(std::io::Error),
    /// tshark ran but failed.
    #[error("tshark failed ({status}): {stderr}")]
    Failed {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// A line of its output the checker cannot read.
    #[error("unreadable tshark output line {0:?}")]
    Output(String),
}

/// `tshark -v`'s first line.
///
/// # Errors
/// tshark missing or failing.
pub fn version() -> Result<String, TsharkError> {
    let output = Command::new("tshark")
        .arg("-v")
        .output()
        .map_err(TsharkError::Missing)?;
    if !output.status.success() {
        return Err(TsharkError::Failed {
            status: output.status,
            stderr: stderr_text(&output.stderr),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .next()
        .unwrap_or("tshark")
        .trim_end_matches('.')
        .to_string())
}

/// tshark's stderr without its "Running as user root" banner.
fn stderr_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.starts_with("Running as user "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The heuristics of [`DISABLED_HEURISTICS`] this tshark knows, less the enabled ones.
fn heuristics_to_disable(options: &TsharkOptions) -> Result<Vec<&'static str>, TsharkError> {
    static KNOWN: OnceLock<Vec<&'static str>> = OnceLock::new();
    let known = match KNOWN.get() {
        Some(known) => known,
        None => {
            let probed = known_heuristics()?;
            KNOWN.get_or_init(|| probed)
        }
    };
    Ok(known
        .iter()
        .copied()
        .filter(|h| !options.enabled_heuristics.iter().any(|e| e == h))
        .collect())
}

/// Asks tshark, over an empty Ethernet capture, which of [`DISABLED_HEURISTICS`] it knows:
/// it names each one it does not.
fn known_heuristics() -> Result<Vec<&'static str>, TsharkError> {
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let probe = PROBES.fetch_add(1, Ordering::Relaxed);
    let empty = std::env::temp_dir().join(format!("rnic-pcap-check-probe-{}-{probe}.pcap", std::process::id()));
    let mut header = 0xa1b2_c3d4u32.to_le_bytes().to_vec();
    header.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0]);
    std::fs::write(&empty, header).map_err(TsharkError::Missing)?;
    let mut command = Command::new("tshark");
    command.arg("-r").arg(&empty);
    for heuristic in DISABLED_HEURISTICS {
        command.args(["--disable-heuristic", heuristic]);
    }
    let output = command.output();
    let _ = std::fs::remove_file(&empty);
    let output = output.map_err(TsharkError::Missing)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    Ok(DISABLED_HEURISTICS
        .iter()
        .copied()
        .filter(|h| !stderr.contains(&format!("No such protocol {h},")))
        .collect())
}

/// Runs tshark over `capture` and returns its reading of every frame.
///
/// # Errors
/// tshark missing or failing, or output the checker cannot read.
pub fn read(capture: &Path, options: &TsharkOptions) -> Result<Vec<TsharkFrame>, TsharkError> {
    let mut command = Command::new("tshark");
    command.arg("-r").arg(capture);
    for heuristic in heuristics_to_disable(options)? {
        command.args(["--disable-heuristic", heuristic]);
    }
    command.args(["-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE"]);
    for script in &options.lua_scripts {
        command.arg("-X").arg(format!("lua_script:{}", script.display()));
    }
    for rule in &options.decode_as {
        command.args(["-d", rule]);
    }
    for preference in &options.preferences {
        command.args(["-o", preference]);
    }
    command.args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"]);
    command.arg("-E").arg(format!("aggregator={AGGREGATOR}"));
    for field in [
        "frame.number",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.bth.psn",
        "_ws.malformed",
        "_ws.expert.severity",
        "_ws.expert.message",
        "udp.checksum.status",
    ] {
        command.args(["-e", field]);
    }
    let output = command.output().map_err(TsharkError::Missing)?;
    let stderr = stderr_text(&output.stderr);
    // tshark reports a capture it cannot read fully on stderr, sometimes with status 0.
    if !output.status.success() || stderr.contains("appears to have been cut short") {
        return Err(TsharkError::Failed {
            status: output.status,
            stderr,
        });
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(parse_line)
        .collect()
}

fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// One `-T fields` line: the fields of [`read`] in order.
fn parse_line(line: &str) -> Result<TsharkFrame, TsharkError> {
    let bad = || TsharkError::Output(line.to_string());
    let fields: Vec<&str> = line.split('\t').collect();
    if fields.len() != 8 {
        return Err(bad());
    }
    let first = |text: &str| text.split(AGGREGATOR).next().and_then(parse_number);
    let number = first(fields[0]).ok_or_else(bad)?;
    let bth = match (first(fields[1]), first(fields[2]), first(fields[3])) {
        (Some(opcode), Some(qp), Some(psn)) => Some((opcode as u8, qp as u32, psn as u32)),
        _ => None,
    };
    let severities: Vec<&str> = fields[5].split(AGGREGATOR).filter(|s| !s.is_empty()).collect();
    let messages: Vec<&str> = fields[6].split(AGGREGATOR).collect();
    let mut errors = Vec::new();
    for (index, severity) in severities.iter().enumerate() {
        if parse_number(severity).ok_or_else(bad)? >= SEVERITY_ERROR {
            errors.push(messages.get(index).copied().unwrap_or("(no message)").to_string());
        }
    }
    Ok(TsharkFrame {
        number,
        bth,
        malformed: !fields[4].is_empty(),
        errors,
        udp_checksum_status: first(fields[7]).map(|s| s as u8),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fields_line_reads_into_a_frame() {
        let line = format!("3\t4\t0x000011\t16777215\t[Malformed Packet: RPCoRDMA]{AGGREGATOR}_ws.malformed\t4194304{AGGREGATOR}8388608\t\"Time To Live\" only 3{AGGREGATOR}Malformed Packet (Exception occurred)\t3");
        let frame = parse_line(&line).unwrap();
        assert_eq!(frame.number, 3);
        assert_eq!(frame.bth, Some((4, 0x11, 0xFF_FFFF)));
        assert!(frame.malformed);
        assert_eq!(frame.errors, ["Malformed Packet (Exception occurred)"]);
        assert_eq!(frame.udp_checksum_status, Some(3));
        let plain = parse_line("1\t\t\t\t\t\t\t").unwrap();
        assert_eq!(plain.bth, None);
        assert!(!plain.malformed && plain.errors.is_empty());
        assert!(parse_line("1\t2").is_err());
    }
}
