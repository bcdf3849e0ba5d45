//! # rnic-pcap-check — the project's own RoCEv2 capture checker
//!
//! A capture passes when every RoCEv2 frame in it (UDP destination port 4791, over IPv4 or
//! IPv6, VLAN-tagged or not):
//!
//! * has consistent lengths (Ethernet, IP, UDP, at least a BTH and an ICRC) and is not
//!   fragmented;
//! * carries the ICRC this crate recomputes ([`roce`]: the masking rules of the RoCEv2
//!   annex, CRC-32 by `crc32fast`, written independently of the device model, which this
//!   crate does not depend on);
//! * is decoded by tshark's own InfiniBand dissector ([`tshark`]) with the same BTH opcode,
//!   destination QP and PSN, and no frame of the capture is malformed or carries an expert
//!   item of severity error (IP and UDP checksums are checked);
//!
//! and, between frames, no plain ACK names the PSN of an RDMA READ request
//! ([`conversation`]: a requester may take it as the READ's completion without data);
//!
//! and the capture holds at least one RoCEv2 frame (unless allowed empty): a check of
//! nothing proves nothing. Zero UDP checksums over IPv6, which Linux rdma_rxe and this
//! project send, are accepted only when asked for ([`CheckOptions::allow_zero_udp_checksum`]),
//! and then only that one expert item in such frames.
//!
//! Where a second, independent checker exists — `$ROCE_ORACLES_DIR/check-roce-pcap`, or
//! `shared/oracles/check-roce-pcap` beside the repository, as on CI — it runs too and must
//! agree ([`SharedOracle`]). Without it nothing is skipped: the checks above are complete
//! on their own.
//!
//! tshark loads every Lua script in the project's `testbench/wireshark/` folder (dissectors
//! for protocols tshark lacks) and any given in [`tshark::TsharkOptions`], with extra
//! decode-as rules and preferences. The `rnic-pcap-check` binary is the command-line face
//! (scripts/qemu-e2e and scripts/rxe-interop use it).
#![deny(unsafe_code)]

pub mod capture;
pub mod conversation;
pub mod roce;
pub mod tshark;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use capture::CaptureError;
use roce::Classified;
use tshark::{TsharkError, TsharkOptions};

/// The project's folder of Wireshark Lua scripts, loaded on every check.
pub const PROJECT_WIRESHARK_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../wireshark");

/// The second opinion's file name.
pub const SHARED_ORACLE_NAME: &str = "check-roce-pcap";

/// Whether to run the shared oracle too.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SharedOracle {
    /// `$ROCE_ORACLES_DIR/check-roce-pcap` (which must then exist), else
    /// `shared/oracles/check-roce-pcap` beside the repository when it exists.
    #[default]
    Auto,
    /// Only this crate's checks.
    Off,
    /// This script.
    At(PathBuf),
}

/// What a check accepts and what it loads into tshark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    /// Accept UDP checksum 0 over IPv6 (rdma_rxe and this project send it; the ICRC
    /// protects the frame).
    pub allow_zero_udp_checksum: bool,
    /// Accept a capture with no RoCEv2 frame.
    pub allow_empty: bool,
    /// Extra tshark settings; the project's Lua scripts are in it already.
    pub tshark: TsharkOptions,
    /// The second opinion.
    pub shared_oracle: SharedOracle,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            allow_zero_udp_checksum: false,
            allow_empty: false,
            tshark: TsharkOptions {
                lua_scripts: project_lua_scripts(),
                ..TsharkOptions::default()
            },
            shared_oracle: SharedOracle::Auto,
        }
    }
}

/// The `*.lua` files of [`PROJECT_WIRESHARK_DIR`], sorted.
pub fn project_lua_scripts() -> Vec<PathBuf> {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(PROJECT_WIRESHARK_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "lua"))
        .collect();
    scripts.sort();
    scripts
}

/// Where [`SharedOracle::Auto`] finds the shared oracle, if anywhere.
///
/// # Errors
/// `$ROCE_ORACLES_DIR` is set but holds no `check-roce-pcap`.
pub fn find_shared_oracle() -> Result<Option<PathBuf>, CheckError> {
    if let Some(dir) = std::env::var_os("ROCE_ORACLES_DIR") {
        let script = PathBuf::from(dir).join(SHARED_ORACLE_NAME);
        return if script.is_file() {
            Ok(Some(script))
        } else {
            Err(CheckError::SharedOracleMissing(script))
        };
    }
    let beside = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/oracles")
        .join(SHARED_ORACLE_NAME);
    Ok(beside.is_file().then_some(beside))
}

/// Why a capture could not be checked at all (as opposed to checked and found bad).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The file cannot be read.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The file is not an Ethernet pcap or pcapng.
    #[error("{0}: {1}")]
    Capture(PathBuf, CaptureError),
    /// tshark could not give its verdict.
    #[error("{0}: {1}")]
    Tshark(PathBuf, TsharkError),
    /// `$ROCE_ORACLES_DIR` names a folder without the oracle.
    #[error("ROCE_ORACLES_DIR is set but {0} does not exist")]
    SharedOracleMissing(PathBuf),
    /// The shared oracle could not be started.
    #[error("cannot run {0}: {1}")]
    SharedOracle(PathBuf, std::io::Error),
}

/// One thing wrong with a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The frame (`frame.number`), or none for the capture as a whole.
    pub frame: Option<u64>,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.frame {
            Some(frame) => write!(f, "frame {frame}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

/// The shared oracle's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedVerdict {
    /// The script that ran.
    pub script: PathBuf,
    /// Whether it accepted the capture.
    pub passed: bool,
    /// What it printed.
    pub output: String,
}

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The capture.
    pub path: PathBuf,
    /// Frames in it.
    pub frames: u64,
    /// RoCEv2 frames in it.
    pub roce_frames: u64,
    /// Of those, over IPv6.
    pub ipv6_frames: u64,
    /// Everything wrong; empty when this crate's checks passed.
    pub problems: Vec<Problem>,
    /// The tshark that decoded it.
    pub tshark_version: String,
    /// The Lua scripts tshark loaded.
    pub lua_scripts: Vec<PathBuf>,
    /// The second opinion, when one ran.
    pub shared: Option<SharedVerdict>,
}

impl Report {
    /// Whether every check passed, the second opinion's included.
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.shared.as_ref().map_or(true, |s| s.passed)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.problems.is_empty() {
            writeln!(
                f,
                "{}: {} frames; ICRC recomputed by rnic-pcap-check on every RoCEv2 frame; {} decoded them all \
                 with no malformed frame or error ({} Lua script(s) loaded)",
                self.path.display(),
                self.frames,
                self.tshark_version,
                self.lua_scripts.len()
            )?;
        } else {
            writeln!(
                f,
                "{}: {} problem(s) in {} frames ({} RoCEv2):",
                self.path.display(),
                self.problems.len(),
                self.frames,
                self.roce_frames
            )?;
            for problem in &self.problems {
                writeln!(f, "  {problem}")?;
            }
        }
        match &self.shared {
            Some(shared) => writeln!(
                f,
                "second opinion {}: {} ({})",
                shared.script.display(),
                if shared.passed { "passed" } else { "FAILED" },
                shared.output.trim().lines().last().unwrap_or("")
            )?,
            None => writeln!(f, "second opinion: none here (no shared/oracles beside the repository)")?,
        }
        if self.passed() {
            write!(f, "{} RoCEv2 frames, all ICRC good", self.roce_frames)
        } else {
            write!(f, "rnic-pcap-check: FAILED")
        }
    }
}

/// Checks the capture at `path`.
///
/// # Errors
/// The capture cannot be read, tshark cannot run, or the second opinion cannot be found or
/// started; a capture that was read and found bad is an `Ok` report that did not pass.
pub fn check_file(path: &Path, options: &CheckOptions) -> Result<Report, CheckError> {
    let bytes = std::fs::read(path).map_err(|e| CheckError::Io(path.to_path_buf(), e))?;
    let packets = capture::read_capture(&bytes).map_err(|e| CheckError::Capture(path.to_path_buf(), e))?;
    let tshark_version = tshark::version().map_err(|e| CheckError::Tshark(path.to_path_buf(), e))?;
    let decoded = tshark::read(path, &options.tshark).map_err(|e| CheckError::Tshark(path.to_path_buf(), e))?;

    let mut problems = Vec::new();
    let mut problem = |frame: Option<u64>, what: String| problems.push(Problem { frame, what });
    if decoded.len() != packets.len() {
        problem(
            None,
            format!("tshark read {} frames, the checker {}", decoded.len(), packets.len()),
        );
    }
    let (mut roce_frames, mut ipv6_frames) = (0, 0);
    let mut checked = Vec::new();
    for (packet, seen) in packets
        .iter()
        .zip(decoded.iter().map(Some).chain(std::iter::repeat(None)))
    {
        let number = Some(packet.number);
        let mut zero_checksum_v6 = false;
        match roce::classify(&packet.bytes) {
            Classified::NotRoce => {}
            Classified::Malformed(why) => {
                roce_frames += 1;
                problem(number, format!("RoCEv2 frame cannot be checked: {why}"));
            }
            Classified::Roce(frame) => {
                roce_frames += 1;
                ipv6_frames += u64::from(frame.ipv6);
                checked.push((packet.number, frame));
                zero_checksum_v6 = frame.ipv6 && frame.udp_checksum == 0;
                if packet.bytes.len() < packet.original_length as usize {
                    problem(
                        number,
                        format!(
                            "cut to {} of {} bytes by the capture",
                            packet.bytes.len(),
                            packet.original_length
                        ),
                    );
                }
                if !frame.icrc_good() {
                    problem(
                        number,
                        format!(
                            "bad ICRC: {:#010x} on the wire, {:#010x} recomputed (opcode {:#04x}, QP {:#x}, PSN {})",
                            frame.icrc_wire, frame.icrc_computed, frame.opcode, frame.destination_qp, frame.psn
                        ),
                    );
                }
                let ours = (frame.opcode, frame.destination_qp, frame.psn);
                match seen.map(|s| s.bth) {
                    Some(Some(theirs)) if theirs == ours => {}
                    Some(Some(theirs)) => problem(
                        number,
                        format!("tshark reads BTH (opcode, QP, PSN) {theirs:?}, the checker {ours:?}"),
                    ),
                    Some(None) => problem(number, "tshark decoded no BTH in this RoCEv2 frame".into()),
                    None => {}
                }
            }
        }
        let Some(seen) = seen else { continue };
        if seen.malformed {
            problem(number, "tshark: malformed packet".into());
        }
        for error in &seen.errors {
            let allowed = options.allow_zero_udp_checksum
                && zero_checksum_v6
                && seen.udp_checksum_status == Some(4)
                && error.to_ascii_lowercase().contains("checksum");
            if !allowed {
                problem(number, format!("tshark: {error}"));
            }
        }
    }
    for found in conversation::acks_naming_reads(checked.iter().map(|(number, frame)| (*number, frame))) {
        problem(
            Some(found.ack_frame),
            format!(
                "a plain ACK to QP {:#x} names PSN {}, the PSN of the RDMA READ request in frame {} (to QP {:#x}): \
                 a requester may complete the READ without its data",
                found.requester_qp, found.psn, found.read_frame, found.responder_qp
            ),
        );
    }
    if roce_frames == 0 && !options.allow_empty {
        problems.push(Problem {
            frame: None,
            what: "no RoCEv2 frame (UDP port 4791) in the capture: nothing was checked".into(),
        });
    }

    let script = match &options.shared_oracle {
        SharedOracle::Off => None,
        SharedOracle::At(script) => Some(script.clone()),
        SharedOracle::Auto => find_shared_oracle()?,
    };
    let shared = match script {
        Some(script) => Some(run_shared(&script, path, options)?),
        None => None,
    };
    Ok(Report {
        path: path.to_path_buf(),
        frames: packets.len() as u64,
        roce_frames,
        ipv6_frames,
        problems,
        tshark_version,
        lua_scripts: options.tshark.lua_scripts.clone(),
        shared,
    })
}

fn run_shared(script: &Path, capture: &Path, options: &CheckOptions) -> Result<SharedVerdict, CheckError> {
    let mut command = Command::new(script);
    if options.allow_zero_udp_checksum {
        command.arg("--allow-zero-udp-csum");
    }
    if options.allow_empty {
        command.arg("--allow-empty");
    }
    let output = command
        .arg(capture)
        .output()
        .map_err(|e| CheckError::SharedOracle(script.to_path_buf(), e))?;
    Ok(SharedVerdict {
        script: script.to_path_buf(),
        passed: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
