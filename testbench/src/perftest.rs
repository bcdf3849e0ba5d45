//! `rnic-bench --peer perftest`: the out-of-band TCP exchange of an unmodified perftest
//! (Debian bookworm `perftest 4.5+0.17-1`, upstream tag v4.5-0.17, internal version
//! "6.06"), so that `ib_write_bw`, `ib_read_bw`, `ib_send_bw` (also `-c UD`),
//! `ib_atomic_bw` and `ib_write_lat` on another host (Linux rdma_rxe, a RoCE NIC) pair
//! with rnic-bench on our NIC. Facts taken from perftest's source (src/perftest_
//! communication.c, perftest_resources.c, the tests' `main`); see docs/guides/interop.md.
//!
//! # The exchange (non-rdma_cm; `servername` given = client)
//!
//! The server listens on TCP port 18515 (`-p`) on every address and accepts one client.
//! Every step below is `ctx_xchg_data`/`ctx_hand_shake`: the client writes its bytes and
//! then reads the server's; the server reads first, then writes. Each message is read with
//! one `read()` of its exact size, so each is written with one `write()` here.
//!
//! 1. Version: 16 bytes, a NUL-padded decimal string ("6.06"); both refuse < 5.70.
//! 2. System data: cycle buffer (page size) and cache-line size, 4-byte big-endian ints
//!    each; both take the larger.
//! 3. MTU: 2 bytes, `"%d"` of the `ibv_mtu` enum value and its NUL ("3" = 1024); both
//!    take the smaller.
//! 4. QP keys, 108 bytes (GID given, always on Ethernet): the text
//!    `LID:OUT_READS:QPN:PSN:RKEY:VADDR:G0:…:G15:SRQN:` in fixed-width lower-case hex
//!    (`%04x:%04x:%06x:%06x:%08x:%016llx:` then 16 × `%02x:` then `%08x:`) and a NUL;
//!    59 bytes without a GID (InfiniBand only). `OUT_READS` is the sender's responder
//!    resources for READ/atomic (its `max_dest_rd_atomic`; the peer uses it as
//!    `max_rd_atomic`), 1 otherwise. `VADDR` is the sender's target buffer.
//! 5. Per test, a fixed sequence of key exchanges ("rounds" of one message per QP, and
//!    "syncs" of QP 0's message), see [`Test::before_traffic`]; the QPs are connected after
//!    the first round. After the traffic: write/read/atomic BW: a sync (the server waits
//!    in it until the client finished), the BW report (five 8-byte big-endian exchanges:
//!    size, iterations of all QPs together, peak MB/s, average MB/s, Mpps as IEEE
//!    doubles), a sync, and
//!    `"done\0"` written by both (never read by perftest). SEND BW: a sync and "done".
//!    Write latency: nothing, the processes just exit; rnic-bench keeps its QP until the
//!    peer closes the socket, in case its last WRITE must be acknowledged again.
//!
//! # How the tests use the remote buffer
//!
//! Message k of a QP goes to `VADDR + (k mod (cycle / inc)) × inc` with
//! `inc = size > cache_line ? round_up(size, cache_line) : cache_line` when
//! `size ≤ cycle / 2`, else always to `VADDR`; atomics (fetch-and-add 1, 8 bytes) step the
//! same way. perftest fills its buffers with `rand()` bytes (zeros for `ib_write_lat`) and
//! checks no payload; the server side of a BW test does nothing but wait.
//! `ib_write_lat` is a ping-pong of RDMA WRITEs of `size` bytes whose last byte is the
//! sender's message counter (mod 256); each side polls that byte in its own buffer; the
//! *server* writes first.
//!
//! # What `--verify` checks here (perftest checks nothing)
//!
//! * WRITE, we serve: every slot perftest must have written was written over its whole
//!   length — it differs from the sentinel we filled in, and nowhere in it do
//!   [`SENTINEL_RUN`] or more consecutive bytes still match the sentinel (perftest's random
//!   bytes match one sentinel byte in 256, eight in a row one time in 2^64; a packet that
//!   never landed or a WRITE cut short leaves a run that long) — and every byte it must not
//!   have written (gaps, tail) still holds the sentinel: the writes landed at the right
//!   addresses with the right lengths. The data itself is random and cannot be checked, so
//!   `bytes_verified` counts the written bytes whose placement was checked, once each.
//!   (A slot shorter than [`SENTINEL_RUN`] can only be checked for differing at all.)
//! * WRITE, we drive: nothing can be checked (perftest's buffer is not readable remotely).
//! * READ, we drive: every read of a remote slot returns the same bytes as the first.
//!   READ, we serve: our buffer is unchanged afterwards.
//! * Atomics, we serve: every 8-byte word ends at its start value plus the number of
//!   fetch-and-adds aimed at it, the bytes around the words unchanged. We drive: the
//!   values fetched from a word run consecutively (v, v+1, …).
//! * SEND (RC and UD): every receive completes successfully with `byte_len` = size (+ 40
//!   bytes of GRH on UD); the data is random.
//! * Write latency, both sides: every message is zeros with the counter in its last byte.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rnic_verbs::{
    AccessFlags, AddressHandle, AhAttributes, AtomicFields, CompletionQueue, Context, Gid, MemoryRegion, Mtu,
    ProtectionDomain, QpCapabilities, QpInitAttributes, QpType, QueuePair, RdmaFields, RecvWorkRequest, SendFlags,
    SendWorkRequest, Sge, UdFields, WcStatus, WorkCompletion, WrOpcode,
};

use crate::bench::{fill_pattern, BenchConfig, BenchReport, Operation};
use crate::perftest_cm::CmLink;
use crate::remote::{self, RcPath, RemoteError, GRH_BYTES, QKEY};

/// A run of this many bytes still equal to the sentinel inside a slot perftest wrote means
/// part of the slot was not written (see the module documentation).
pub const SENTINEL_RUN: usize = 8;

/// Whether `found`, a slot perftest wrote over the `sentinel` bytes, was written over its
/// whole length: it differs, and has no run of [`SENTINEL_RUN`] bytes still equal.
pub fn slot_written(found: &[u8], sentinel: &[u8]) -> bool {
    let mut run = 0;
    for (f, s) in found.iter().zip(sentinel) {
        run = if f == s { run + 1 } else { 0 };
        if run >= SENTINEL_RUN {
            return false;
        }
    }
    found != sentinel
}

/// The version string this side announces (perftest 4.5-0.17's `VERSION`).
pub const VERSION: &str = "6.06";
/// The oldest peer version perftest accepts (`check_version_compatibility`).
const MIN_VERSION: f64 = 5.70;
/// Bytes of the version exchange (`MAX_VERSION`).
pub const VERSION_LEN: usize = 16;
/// Bytes of a QP key message with a GID (`KEY_MSG_SIZE_GID`).
pub const KEY_LEN_GID: usize = 108;
/// Bytes of a QP key message without a GID (`KEY_MSG_SIZE`).
pub const KEY_LEN: usize = 59;
/// Bytes of a QP key message over rdma_cm (`-R`): `struct pingpong_dest` in binary.
pub const KEY_LEN_BINARY: usize = 56;
/// The closing word both sides write (with its NUL).
pub const DONE: &[u8; 5] = b"done\0";
/// Our cycle buffer (page size) and cache-line size announced in the system data.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
/// Responder resources we announce for READ and atomics (`out_reads`).
const OUT_READS: u32 = 16;
/// perftest's QP timeout (`DEF_QP_TIME`, 4.096 µs × 2^14 ≈ 67 ms) and RNR timer (`MIN_RNR_TIMER`).
const QP_TIMEOUT: u8 = 14;
const MIN_RNR_TIMER: u8 = 12;
/// Work requests in flight per QP (perftest's default `tx_depth` is 128).
const TX_DEPTH: usize = 64;
/// UD sends in flight per QP: a UD receiver that falls behind drops, and perftest's server
/// then waits forever.
const UD_TX_DEPTH: usize = 8;
/// Receives kept posted per QP: perftest's `rx_depth`, 512. A UD client sends without
/// flow control, so fewer left an rdma_rxe client's 200 back-to-back datagrams without a
/// receive once the first 128 had landed (scripts/rxe-interop, ud_send with rxe as client).
const RX_DEPTH: usize = 512;
/// How long a traffic phase may go without progress, and a control read may take.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a run with a perftest peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PerftestError {
    /// Bytes from the peer that do not parse.
    #[error("perftest message: {0}")]
    Message(String),
    /// The peer's settings do not fit ours.
    #[error("perftest peer: {0}")]
    Mismatch(String),
    /// A setting is unsupported with a perftest peer.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The control connection failed.
    #[error("control connection: {0}")]
    Io(#[from] std::io::Error),
    /// Device or verbs set-up failed.
    #[error("{0}")]
    Remote(#[from] RemoteError),
    /// The verbs layer refused a step.
    #[error("verbs: {0}")]
    Verbs(#[from] rnic_verbs::VerbsError),
    /// Work requests or the peer's writes did not arrive in time.
    #[error("{0}")]
    Timeout(String),
}

type Result<T> = std::result::Result<T, PerftestError>;

/// One QP's key message (`struct pingpong_dest` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMessage {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// The sender's responder resources for READ/atomics.
    pub out_reads: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// The sender's initial send PSN (24 bits).
    pub psn: u32,
    /// R_Key of the sender's buffer.
    pub rkey: u32,
    /// Address of the sender's target buffer.
    pub vaddr: u64,
    /// The sender's GID, absent in the InfiniBand form.
    pub gid: Option<[u8; 16]>,
    /// SRQ number (XRC/DC; 0 here).
    pub srqn: u32,
}

impl KeyMessage {
    /// The message's bytes: [`KEY_LEN_GID`] with a GID, [`KEY_LEN`] without.
    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        let len = match self.gid {
            Some(gid) => {
                for byte in gid {
                    text.push_str(&format!(":{byte:02x}"));
                }
                text.push_str(&format!(":{:08x}:", self.srqn));
                KEY_LEN_GID
            }
            None => {
                text.push_str(&format!(":{:08x}", self.srqn));
                KEY_LEN
            }
        };
        let mut bytes = text.into_bytes();
        bytes.resize(len, 0);
        bytes
    }

    /// The message as perftest's `rdma_write_keys` sends it over rdma_cm (`-R`): `struct
    /// pingpong_dest` (x86-64 layout, [`KEY_LEN_BINARY`] bytes) with its integers
    /// big-endian: LID, OUT_READS, QPN, PSN, RKEY (4 bytes each), 4 bytes of padding,
    /// VADDR (8), the GID (16), SRQN, GID index (4 each).
    pub fn encode_binary(&self, gid_index: u32) -> [u8; KEY_LEN_BINARY] {
        let mut bytes = [0u8; KEY_LEN_BINARY];
        bytes[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        bytes[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        bytes[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        bytes[12..16].copy_from_slice(&self.psn.to_be_bytes());
        bytes[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        bytes[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        bytes[32..48].copy_from_slice(&self.gid.unwrap_or_default());
        bytes[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        bytes[52..56].copy_from_slice(&gid_index.to_be_bytes());
        bytes
    }

    /// The fields perftest's `rdma_read_keys` takes from a binary message (it leaves the
    /// SRQ number and GID index alone, so they read as 0 here).
    pub fn decode_binary(bytes: &[u8; KEY_LEN_BINARY]) -> Self {
        let word = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[32..48]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&bytes[24..32]);
        Self {
            lid: word(0) as u16,
            out_reads: word(4),
            qpn: word(8),
            psn: word(12),
            rkey: word(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid: Some(gid),
            srqn: 0,
        }
    }

    /// Parses a message of exactly [`KEY_LEN_GID`] (with GID) or [`KEY_LEN`] bytes.
    ///
    /// # Errors
    /// [`PerftestError::Message`] for a wrong length, a missing NUL, a wrong number of
    /// fields or a field that is not hex of its width.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad =
            |why: &str| PerftestError::Message(format!("key message {why}: {:?}", String::from_utf8_lossy(bytes)));
        let with_gid = match bytes.len() {
            KEY_LEN_GID => true,
            KEY_LEN => false,
            n => return Err(bad(&format!("of {n} bytes"))),
        };
        let end = bytes.iter().position(|&b| b == 0).ok_or_else(|| bad("without NUL"))?;
        let text = std::str::from_utf8(&bytes[..end]).map_err(|_| bad("not text"))?;
        let mut fields: Vec<&str> = text.split(':').collect();
        if with_gid {
            // The GID form ends in ':' (an empty last field).
            if fields.pop() != Some("") {
                return Err(bad("without the final ':'"));
            }
        }
        let expected = if with_gid { 23 } else { 7 };
        if fields.len() != expected {
            return Err(bad(&format!("with {} fields", fields.len())));
        }
        let hex = |field: &str, most: usize| -> Result<u64> {
            if field.is_empty() || field.len() > most || !field.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(&format!("field {field:?}")));
            }
            u64::from_str_radix(field, 16).map_err(|_| bad(&format!("field {field:?}")))
        };
        let gid = if with_gid {
            let mut gid = [0u8; 16];
            for (i, byte) in gid.iter_mut().enumerate() {
                *byte = hex(fields[6 + i], 2)? as u8;
            }
            Some(gid)
        } else {
            None
        };
        Ok(Self {
            lid: hex(fields[0], 4)? as u16,
            out_reads: hex(fields[1], 8)? as u32,
            qpn: hex(fields[2], 6)? as u32,
            psn: hex(fields[3], 6)? as u32,
            rkey: hex(fields[4], 8)? as u32,
            vaddr: hex(fields[5], 16)?,
            gid,
            srqn: hex(fields[expected - 1], 8)? as u32,
        })
    }
}

/// The version exchange's 16 bytes for `version`.
pub fn encode_version(version: &str) -> [u8; VERSION_LEN] {
    let mut bytes = [0u8; VERSION_LEN];
    let n = version.len().min(VERSION_LEN - 1);
    bytes[..n].copy_from_slice(&version.as_bytes()[..n]);
    bytes
}

/// The peer's version as perftest reads it (`atof` of the text before the NUL).
///
/// # Errors
/// [`PerftestError::Message`] when it is not a number.
pub fn decode_version(bytes: &[u8; VERSION_LEN]) -> Result<f64> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
    std::str::from_utf8(&bytes[..end])
        .ok()
        .and_then(|text| text.trim().parse::<f64>().ok())
        .ok_or_else(|| PerftestError::Message(format!("version {:?}", String::from_utf8_lossy(&bytes[..end]))))
}

/// The MTU exchange's 2 bytes: the `ibv_mtu` enum value (1 = 256 … 5 = 4096) and a NUL.
pub fn encode_mtu(mtu: Mtu) -> [u8; 2] {
    [b'0' + mtu_enum(mtu), 0]
}

/// The MTU in the peer's 2 bytes (`strtol` of them).
///
/// # Errors
/// [`PerftestError::Message`] unless it is "1".."5".
pub fn decode_mtu(bytes: [u8; 2]) -> Result<Mtu> {
    match bytes {
        [digit @ b'1'..=b'5', 0] => Mtu::from_bytes(128 << (digit - b'0')).ok_or_else(|| unreachable_mtu(bytes)),
        _ => Err(unreachable_mtu(bytes)),
    }
}

fn unreachable_mtu(bytes: [u8; 2]) -> PerftestError {
    PerftestError::Message(format!("MTU {bytes:?}"))
}

fn mtu_enum(mtu: Mtu) -> u8 {
    (mtu.bytes().trailing_zeros() - 7) as u8
}

/// The BW report the client sends after the traffic (`struct bw_report_data`'s exchanged part).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations of all QPs together (`-n` × `-q`).
    pub iters: u64,
    /// Peak bandwidth, MB/s (2^20 bytes).
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five 8-byte big-endian fields, in exchange order.
    pub fn encode(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// The report from its five fields.
    pub fn decode(fields: &[[u8; 8]; 5]) -> Self {
        let float = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        Self {
            size: u64::from_be_bytes(fields[0]),
            iters: u64::from_be_bytes(fields[1]),
            bw_peak: float(fields[2]),
            bw_avg: float(fields[3]),
            msg_rate: float(fields[4]),
        }
    }
}

/// Which perftest program the peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_atomic_bw` (fetch-and-add).
    AtomicBw,
    /// `ib_send_bw` (RC).
    SendBw,
    /// `ib_send_bw -c UD`.
    SendUdBw,
    /// `ib_write_lat`.
    WriteLat,
}

/// One step of the exchange before the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every QP's key message, in QP order.
    Round,
    /// QP 0's key message.
    Sync,
    /// Take the QPs to RTR/RTS (local; nothing on the wire).
    Connect,
    /// The receiving side posts its receives (local).
    PostReceives,
}

impl Test {
    /// The test for an operation, `--ud` and `--lat`.
    ///
    /// # Errors
    /// [`PerftestError::Config`] for combinations perftest has no program for.
    pub fn new(operation: Operation, ud: bool, latency: bool) -> Result<Self> {
        match (operation, ud, latency) {
            (Operation::Write, false, false) => Ok(Self::WriteBw),
            (Operation::Read, false, false) => Ok(Self::ReadBw),
            (Operation::Atomic, false, false) => Ok(Self::AtomicBw),
            (Operation::Send, false, false) => Ok(Self::SendBw),
            (Operation::Send, true, false) => Ok(Self::SendUdBw),
            (Operation::Write, false, true) => Ok(Self::WriteLat),
            _ => Err(PerftestError::Config(format!(
                "no perftest program for {}{}{}: write, read, atomic, send, send --ud, write --lat",
                operation.name(),
                if ud { " --ud" } else { "" },
                if latency { " --lat" } else { "" }
            ))),
        }
    }

    /// perftest's program name.
    pub fn program(self) -> &'static str {
        match self {
            Self::WriteBw => "ib_write_bw",
            Self::ReadBw => "ib_read_bw",
            Self::AtomicBw => "ib_atomic_bw",
            Self::SendBw => "ib_send_bw",
            Self::SendUdBw => "ib_send_bw -c UD",
            Self::WriteLat => "ib_write_lat",
        }
    }

    /// The steps between the MTU exchange and the traffic (the tests' `main`).
    pub fn before_traffic(self) -> &'static [Step] {
        use Step::{Connect, PostReceives, Round, Sync};
        match self {
            Self::WriteBw | Self::ReadBw | Self::AtomicBw => &[Round, Connect, Round, Sync],
            Self::SendBw | Self::SendUdBw => &[Round, Connect, Sync, Round, PostReceives, Sync],
            Self::WriteLat => &[Sync, Round, Connect, Round, Sync],
        }
    }

    fn ud(self) -> bool {
        self == Self::SendUdBw
    }

    fn out_reads(self) -> u32 {
        if matches!(self, Self::ReadBw | Self::AtomicBw) {
            OUT_READS
        } else {
            1
        }
    }
}

/// Where message `k` lands in the peer's buffer (perftest's `increase_rem_addr`).
pub fn remote_offset(k: u64, size: u64, cycle: u64, cache_line: u64) -> u64 {
    if size > cycle / 2 {
        return 0;
    }
    let inc = step(size, cache_line);
    (k % (cycle / inc)) * inc
}

fn step(size: u64, cache_line: u64) -> u64 {
    if size > cache_line {
        size.next_multiple_of(cache_line)
    } else {
        cache_line
    }
}

/// A run against a perftest peer.
#[derive(Debug, Clone)]
pub struct PerftestConfig {
    /// Operation, size, iterations, QPs, MTU (our offer) and `--verify`.
    pub bench: BenchConfig,
    /// Which perftest program the peer runs.
    pub test: Test,
    /// Our GID table entry (`-x` on the perftest side picks theirs).
    pub gid_index: u8,
    /// The peer's MAC when its GID is not link-local (perftest does not exchange MACs).
    pub peer_mac: Option<[u8; 6]>,
}

/// The out-of-band exchange: perftest's TCP connection, or with `--cm` (perftest `-R`) an
/// RC connection of its own made by the connection manager.
pub struct Exchange {
    link: Link,
    client: bool,
}

enum Link {
    Tcp(TcpStream),
    Cm(Box<CmLink>),
    /// The rdma_cm connection after its disconnection.
    Closed,
}

impl Exchange {
    /// Waits on every address at `port` for one perftest client (`ethernet_server_connect`).
    ///
    /// # Errors
    /// Binding or accepting failed.
    pub fn accept(port: u16) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))?;
        let (stream, peer) = listener.accept()?;
        tracing::info!(%peer, "perftest client connected");
        Self::new(stream, false)
    }

    /// Connects to a perftest server, retrying while it is not listening yet.
    ///
    /// # Errors
    /// The server could not be reached within the control timeout.
    pub fn connect(host: &str, port: u16) -> Result<Self> {
        Self::new(remote::connect_retrying(host, port)?, true)
    }

    /// Wraps a connected stream; `client` is the side that writes first.
    ///
    /// # Errors
    /// Socket options could not be set.
    pub fn new(stream: TcpStream, client: bool) -> Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(PROGRESS_TIMEOUT))?;
        Ok(Self {
            link: Link::Tcp(stream),
            client,
        })
    }

    /// perftest `-R`: the exchange's connection through the connection manager on
    /// `context` (the server listens on `ip`, or every address, at the role's port).
    ///
    /// # Errors
    /// The connection manager could not connect or accept it.
    pub fn over_cm(
        context: &Context,
        role: &remote::Role,
        ip: Option<Ipv4Addr>,
        peer_mac: Option<[u8; 6]>,
    ) -> Result<Self> {
        let client = matches!(role, remote::Role::Client { .. });
        let link = CmLink::open(context, role, ip.map(std::net::IpAddr::V4), peer_mac)?;
        Ok(Self {
            link: Link::Cm(Box::new(link)),
            client,
        })
    }

    fn over_cm_link(&self) -> bool {
        !matches!(self.link, Link::Tcp(_))
    }

    /// One `ctx_xchg_data`: the client writes then reads, the server reads then writes.
    fn swap<const N: usize>(&mut self, mine: &[u8]) -> Result<[u8; N]> {
        let mut theirs = [0u8; N];
        match &mut self.link {
            Link::Tcp(stream) => {
                if self.client {
                    stream.write_all(mine)?;
                    stream.read_exact(&mut theirs)?;
                } else {
                    stream.read_exact(&mut theirs)?;
                    stream.write_all(mine)?;
                }
            }
            Link::Closed => return Err(PerftestError::Message("the exchange is closed".into())),
            Link::Cm(link) => {
                if self.client {
                    link.send(mine)?;
                    theirs.copy_from_slice(&link.recv(N)?);
                } else {
                    theirs.copy_from_slice(&link.recv(N)?);
                    link.send(mine)?;
                }
            }
        }
        Ok(theirs)
    }

    fn swap_keys(&mut self, mine: &KeyMessage) -> Result<KeyMessage> {
        if self.over_cm_link() {
            let theirs: [u8; KEY_LEN_BINARY] = self.swap(&mine.encode_binary(0))?;
            return Ok(KeyMessage::decode_binary(&theirs));
        }
        let theirs: [u8; KEY_LEN_GID] = self.swap(&mine.encode())?;
        KeyMessage::decode(&theirs)
    }

    /// Versions, system data and MTU; returns (cycle buffer, cache line, MTU) both use.
    ///
    /// # Errors
    /// I/O, unparsable bytes or a peer older than perftest accepts.
    pub fn negotiate(&mut self, mtu: Mtu) -> Result<(u64, u64, Mtu)> {
        let theirs = decode_version(&self.swap(&encode_version(VERSION))?)?;
        if theirs < MIN_VERSION {
            return Err(PerftestError::Mismatch(format!(
                "version {theirs} is older than {MIN_VERSION}"
            )));
        }
        let cycle = u32::from_be_bytes(self.swap(&CYCLE_BUFFER.to_be_bytes())?);
        let line = u32::from_be_bytes(self.swap(&CACHE_LINE.to_be_bytes())?);
        let their_mtu = decode_mtu(self.swap(&encode_mtu(mtu))?)?;
        let cycle = cycle.max(CYCLE_BUFFER);
        let line = line.max(CACHE_LINE);
        if !cycle.is_power_of_two() || cycle > 1 << 30 || !line.is_power_of_two() || line > cycle {
            return Err(PerftestError::Mismatch(format!(
                "cycle buffer {cycle}, cache line {line}"
            )));
        }
        let mtu = if their_mtu.bytes() < mtu.bytes() {
            their_mtu
        } else {
            mtu
        };
        tracing::info!(
            version = theirs,
            cycle,
            line,
            mtu = mtu.bytes(),
            "perftest peer negotiated"
        );
        Ok((u64::from(cycle), u64::from(line), mtu))
    }

    /// The BW report exchange; returns the peer's report.
    fn swap_report(&mut self, mine: &BwReport) -> Result<BwReport> {
        let mut theirs = [[0u8; 8]; 5];
        for (slot, field) in theirs.iter_mut().zip(mine.encode()) {
            *slot = self.swap(&field)?;
        }
        Ok(BwReport::decode(&theirs))
    }

    /// Closes our direction and waits until the peer closes its own (or `timeout`); what
    /// it sends is ignored. Two rnic-bench sides thus part at once; perftest closes when
    /// it exits.
    fn wait_for_close(&mut self, timeout: Duration) {
        let Link::Tcp(stream) = &mut self.link else {
            return;
        };
        if let Err(error) = stream.shutdown(std::net::Shutdown::Write) {
            tracing::debug!(%error, "closing our direction");
        }
        let deadline = Instant::now() + timeout;
        let mut sink = [0u8; 64];
        while Instant::now() < deadline {
            match stream.read(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(error) => {
                    tracing::debug!(%error, "waiting for the peer to close");
                    return;
                }
            }
        }
        tracing::warn!("the peer kept the connection open for {timeout:?} after the test");
    }

    /// `ctx_close_connection`'s "done": perftest writes it and closes without reading
    /// ours, so a reset or an early end after our own write is not an error.
    fn done(&mut self) -> Result<()> {
        let client = self.client;
        // Over rdma_cm, `ctx_close_connection` is the sync alone.
        let Link::Tcp(stream) = &mut self.link else {
            return Ok(());
        };
        let mut theirs = [0u8; 5];
        let read = |stream: &mut TcpStream, theirs: &mut [u8; 5]| -> Result<()> {
            match stream.read_exact(theirs) {
                Ok(()) if theirs == DONE => Ok(()),
                Ok(()) => Err(PerftestError::Message(format!("expected done, got {theirs:?}"))),
                Err(error) => {
                    tracing::debug!(%error, "the peer closed around \"done\"");
                    Ok(())
                }
            }
        };
        if client {
            if let Err(error) = stream.write_all(DONE) {
                tracing::debug!(%error, "writing \"done\"");
            }
            read(stream, &mut theirs)
        } else {
            read(stream, &mut theirs)?;
            if let Err(error) = stream.write_all(DONE) {
                tracing::debug!(%error, "writing \"done\"");
            }
            Ok(())
        }
    }
}

/// One QP with its CQ, buffer and the peer's keys.
struct Pair {
    qp: QueuePair,
    cq: CompletionQueue,
    /// Local slots (`slots × slot_size`), then the target region the peer uses.
    mr: MemoryRegion,
    mine: KeyMessage,
    theirs: Option<KeyMessage>,
    ah: Option<AddressHandle>,
    /// UD over rdma_cm: the QP number and Q_Key of the peer's SIDR reply.
    ud_peer: Option<(u32, u32)>,
}

struct Session {
    _context: Context,
    pd: ProtectionDomain,
    pairs: Vec<Pair>,
    config: PerftestConfig,
    size: u64,
    slots: u64,
    slot_size: u64,
    /// Bytes of the target region (perftest's `BUFF_SIZE`).
    region: u64,
    cycle: u64,
    line: u64,
    mtu: Mtu,
    /// Receives posted so far per QP (SEND server).
    receives: Vec<u64>,
}

/// Runs one side against a perftest peer on the device named in `device`.
///
/// # Errors
/// Bad settings, the device, the exchange, or traffic that does not complete.
pub fn run(config: &PerftestConfig, device: &str, ipv4: Option<Ipv4Addr>, role: &remote::Role) -> Result<BenchReport> {
    check(config)?;
    if config.bench.connection_manager {
        let context = remote::open_context(device, ipv4)?;
        let mut exchange = Exchange::over_cm(&context, role, ipv4, config.peer_mac)?;
        return run_on(config, context, &mut exchange);
    }
    let mut exchange = match role {
        remote::Role::Server { port } => Exchange::accept(*port)?,
        remote::Role::Client { host, port } => Exchange::connect(host, *port)?,
    };
    let context = remote::open_context(device, ipv4)?;
    run_on(config, context, &mut exchange)
}

/// Runs one side on an opened device over a connected exchange (tests use embedded NICs).
///
/// # Errors
/// As [`run`].
pub fn run_with_device(
    config: &PerftestConfig,
    device: Box<dyn rnic_verbs::DeviceAccess>,
    ipv4: Option<Ipv4Addr>,
    exchange: &mut Exchange,
) -> Result<BenchReport> {
    check(config)?;
    run_on(config, remote::open_context_on(device, ipv4)?, exchange)
}

fn check(config: &PerftestConfig) -> Result<()> {
    let bench = &config.bench;
    if bench.queue_pairs == 0 || bench.queue_pairs > 64 || (config.test == Test::WriteLat && bench.queue_pairs != 1) {
        return Err(PerftestError::Config(format!(
            "{} QPs: 1..=64 (1 for latency)",
            bench.queue_pairs
        )));
    }
    if bench.size == 0 || bench.size > 1 << 26 {
        return Err(PerftestError::Config(format!("size {}: 1..=64 MiB", bench.size)));
    }
    if config.test == Test::SendUdBw && bench.size as u64 > u64::from(bench.mtu) {
        return Err(PerftestError::Config("UD moves at most one MTU".into()));
    }
    if bench.iterations == 0 {
        return Err(PerftestError::Config("--iters must be at least 1".into()));
    }
    if bench.connection_manager && config.test == Test::WriteLat {
        return Err(PerftestError::Config(
            "--cm (perftest -R) is here for the bandwidth tests, not ib_write_lat".into(),
        ));
    }
    Ok(())
}

fn run_on(config: &PerftestConfig, context: Context, exchange: &mut Exchange) -> Result<BenchReport> {
    let mtu = Mtu::from_bytes(config.bench.mtu)
        .ok_or_else(|| PerftestError::Config(format!("MTU {}: 256..4096", config.bench.mtu)))?;
    let (cycle, line, mtu) = exchange.negotiate(mtu)?;
    let mut session = Session::open(config, context, cycle, line, mtu)?;
    if exchange.over_cm_link() {
        // `create_rdma_cm_connection`: a sync of zeros, the test's connections, another.
        // The server listens for the test's connections before the sync (CmLink::listen_for_data).
        session.listen_over_cm(exchange)?;
        exchange.swap::<KEY_LEN_BINARY>(&[0; KEY_LEN_BINARY])?;
        session.connect_over_cm(exchange)?;
        exchange.swap::<KEY_LEN_BINARY>(&[0; KEY_LEN_BINARY])?;
    }
    for step in config.test.before_traffic() {
        match step {
            Step::Round => {
                for index in 0..session.pairs.len() {
                    let theirs = exchange.swap_keys(&session.pairs[index].mine)?;
                    session.learn(index, theirs)?;
                }
            }
            Step::Sync => {
                let theirs = exchange.swap_keys(&session.pairs[0].mine)?;
                session.learn(0, theirs)?;
            }
            Step::Connect if exchange.over_cm_link() => {}
            Step::Connect => session.connect()?,
            Step::PostReceives => {
                if !exchange.client {
                    session.post_receives()?;
                }
            }
        }
    }
    let start = Instant::now();
    let mut report = remote::new_report(&config.bench);
    report.operation = config.test.program();
    report.size = session.size as usize;
    // The negotiated path MTU, not our offer.
    report.mtu = session.mtu.bytes();
    let client = exchange.client;
    match (config.test, client) {
        (Test::WriteLat, _) => session.write_latency(client, &mut report)?,
        (Test::SendBw | Test::SendUdBw, false) => session.receive_all(&mut report)?,
        (_, true) => session.drive(&mut report)?,
        (_, false) => {}
    }
    let elapsed = start.elapsed().as_secs_f64();
    report.wall_time_s = elapsed;
    match config.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => {
            // The server sits in this sync until the client finished.
            let theirs = exchange.swap_keys(&session.pairs[0].mine)?;
            session.learn(0, theirs)?;
            let total = config.bench.iterations * session.pairs.len() as u64;
            let mb_s = (session.size * total) as f64 / elapsed.max(1e-9) / f64::from(1 << 20);
            let mine = BwReport {
                size: session.size,
                // perftest reports the iterations of all QPs together (`print_report_bw`).
                iters: total,
                bw_peak: mb_s,
                bw_avg: mb_s,
                msg_rate: total as f64 / elapsed.max(1e-9) / 1e6,
            };
            let theirs = exchange.swap_report(&mine)?;
            if !client {
                if theirs.size != session.size || theirs.iters != total {
                    return Err(PerftestError::Mismatch(format!(
                        "the client ran -s {} and {} iterations over all QPs (-n × -q), we expected --size {} \
                         --iters {} --qps {}",
                        theirs.size,
                        theirs.iters,
                        session.size,
                        config.bench.iterations,
                        session.pairs.len()
                    )));
                }
                report.bw_gbps = theirs.bw_avg * f64::from(1 << 20) * 8.0 / 1e9;
                report.msg_rate_mpps = theirs.msg_rate;
                session.check_served(&mut report)?;
            }
            let theirs = exchange.swap_keys(&session.pairs[0].mine)?;
            session.learn(0, theirs)?;
            exchange.done()?;
        }
        Test::SendBw | Test::SendUdBw => {
            let theirs = exchange.swap_keys(&session.pairs[0].mine)?;
            session.learn(0, theirs)?;
            exchange.done()?;
        }
        Test::WriteLat => {
            // No exchange follows ib_write_lat's traffic, but the peer may still need our
            // QP: when our ACK of its last WRITE was lost, it re-sends that WRITE and waits
            // for the duplicate's ACK. Keep the QP until perftest exits (closes the socket).
            exchange.wait_for_close(PROGRESS_TIMEOUT);
        }
    }
    if matches!(exchange.link, Link::Cm(_)) {
        if let Link::Cm(link) = std::mem::replace(&mut exchange.link, Link::Closed) {
            // The connection manager chose the path MTU; perftest's exchanged one is unused.
            if let Some(mtu) = session.pairs.first().and_then(|pair| CmLink::data_mtu(&pair.qp)) {
                report.mtu = mtu.bytes();
            }
            report.connection_manager = true;
            report.cm_mads = link.close(config.test.ud())?;
        }
    }
    if report.bw_gbps == 0.0 && elapsed > 0.0 {
        let total = report.messages_ok as f64;
        report.bw_gbps = total * session.size as f64 * 8.0 / elapsed / 1e9;
        report.msg_rate_mpps = total / elapsed / 1e6;
    }
    Ok(report)
}

impl Session {
    fn open(config: &PerftestConfig, context: Context, cycle: u64, line: u64, mtu: Mtu) -> Result<Self> {
        let test = config.test;
        let size = if test == Test::AtomicBw {
            8
        } else {
            config.bench.size as u64
        };
        if test == Test::SendUdBw && size > u64::from(mtu.bytes()) {
            return Err(PerftestError::Mismatch(format!(
                "UD size {size} exceeds the negotiated MTU {}",
                mtu.bytes()
            )));
        }
        let grh = if test.ud() { GRH_BYTES as u64 } else { 0 };
        let slot_size = (size + grh).max(8).next_multiple_of(64);
        let slots = ((64u64 << 20) / slot_size).clamp(1, TX_DEPTH as u64);
        let region = size.max(cycle).next_multiple_of(64);
        let pd = context.alloc_pd()?;
        let gid = context.query_gid(1, u32::from(config.gid_index))?.raw();
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let depth = (2 * RX_DEPTH) as u32;
        let seed = std::process::id().wrapping_mul(0x9E37_79B9);
        let mut pairs = Vec::new();
        for index in 0..config.bench.queue_pairs {
            let mr = pd.register_provider_memory((slots * slot_size + region) as usize, access)?;
            let cq = context.create_cq(2 * depth, None, 0)?;
            let qp = pd.create_qp(&QpInitAttributes {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCapabilities {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: if test.ud() { QpType::Ud } else { QpType::Rc },
                sq_sig_all: true,
            })?;
            let mine = KeyMessage {
                lid: 0,
                out_reads: test.out_reads(),
                qpn: qp.qp_num(),
                psn: seed.wrapping_add(index as u32 * 0x1_0001) & 0x00FF_FFFF,
                rkey: mr.rkey(),
                vaddr: mr.addr() + slots * slot_size,
                gid: Some(gid),
                srqn: 0,
            };
            pairs.push(Pair {
                qp,
                cq,
                mr,
                mine,
                theirs: None,
                ah: None,
                ud_peer: None,
            });
        }
        let session = Self {
            _context: context,
            pd,
            pairs,
            config: config.clone(),
            size,
            slots,
            slot_size,
            region,
            cycle,
            line,
            mtu,
            receives: vec![0; config.bench.queue_pairs],
        };
        session.fill_regions()?;
        Ok(session)
    }

    /// The target regions' start contents: zeros for write latency (as perftest), word
    /// `j`'s start value for atomics, the sentinel otherwise.
    fn fill_regions(&self) -> Result<()> {
        let mut bytes = vec![0u8; self.region as usize];
        for (index, pair) in self.pairs.iter().enumerate() {
            self.expected_region(index, &mut bytes, None);
            pair.mr.write(self.region_offset(), &bytes)?;
        }
        Ok(())
    }

    /// The target region of QP `index`: at the start, or (with `hits`, atomics) after them.
    fn expected_region(&self, index: usize, bytes: &mut [u8], hits: Option<&[u64]>) {
        match self.config.test {
            Test::WriteLat => bytes.fill(0),
            Test::AtomicBw => {
                fill_pattern(bytes, 1000 + index, u64::MAX);
                for (slot, word) in bytes.chunks_exact_mut(self.line as usize).enumerate() {
                    let start = (slot as u64) << 32;
                    let value = start + hits.and_then(|h| h.get(slot)).copied().unwrap_or(0);
                    word[..8].copy_from_slice(&value.to_le_bytes());
                }
            }
            _ => fill_pattern(bytes, 1000 + index, u64::MAX),
        }
    }

    fn region_offset(&self) -> u64 {
        self.slots * self.slot_size
    }

    /// Records the peer's keys; later rounds must repeat the first.
    fn learn(&mut self, index: usize, theirs: KeyMessage) -> Result<()> {
        if theirs.gid.is_none() {
            return Err(PerftestError::Message("key message without GID".into()));
        }
        match &self.pairs[index].theirs {
            Some(known) if *known != theirs => Err(PerftestError::Mismatch(format!(
                "QP {index}'s keys changed between exchanges: {known:?} then {theirs:?} (different -q or test?)"
            ))),
            _ => {
                self.pairs[index].theirs = Some(theirs);
                Ok(())
            }
        }
    }

    /// perftest `-R`, the server: the listener for the test's connections, opened early.
    fn listen_over_cm(&self, exchange: &mut Exchange) -> Result<()> {
        match &mut exchange.link {
            Link::Cm(link) => link.listen_for_data(self.config.test.ud(), self.pairs.len()),
            _ => Ok(()),
        }
    }

    /// perftest `-R`: the test's QPs connected by the connection manager.
    fn connect_over_cm(&mut self, exchange: &mut Exchange) -> Result<()> {
        let Link::Cm(link) = &mut exchange.link else {
            return Ok(());
        };
        let resources = if self.config.test.out_reads() > 1 {
            OUT_READS as u8
        } else {
            0
        };
        let qps: Vec<&QueuePair> = self.pairs.iter().map(|pair| &pair.qp).collect();
        let peers = link.connect_data(&self.pd, &qps, self.config.test.ud(), resources)?;
        for (pair, peer) in self.pairs.iter_mut().zip(peers) {
            if let Some(peer) = peer {
                pair.ud_peer = Some((peer.qpn, peer.qkey));
                pair.ah = Some(peer.ah);
            }
        }
        Ok(())
    }

    fn connect(&mut self) -> Result<()> {
        let gid_index = self.config.gid_index;
        for pair in &mut self.pairs {
            let theirs = pair.theirs.expect("keys learnt in the first round");
            let dgid = Gid(theirs.gid.unwrap_or_default());
            let dmac = self.config.peer_mac.unwrap_or_default();
            if dmac == [0; 6] && dgid.link_local_mac().is_none() {
                return Err(PerftestError::Config(format!(
                    "the peer's GID {:02x?} is not link-local: give --peer-mac",
                    dgid.raw()
                )));
            }
            if self.config.test.ud() {
                remote::connect_ud(&pair.qp, pair.mine.psn)?;
                pair.ah = Some(self.pd.create_ah(&AhAttributes {
                    dgid,
                    dmac,
                    sgid_index: gid_index,
                    hop_limit: 0xFF,
                    ..AhAttributes::default()
                })?);
            } else {
                let path = RcPath {
                    mtu: self.mtu,
                    sgid_index: gid_index,
                    hop_limit: 0xFF,
                    max_dest_rd_atomic: pair.mine.out_reads as u8,
                    max_rd_atomic: theirs.out_reads.clamp(1, OUT_READS) as u8,
                    min_rnr_timer: MIN_RNR_TIMER,
                    timeout: QP_TIMEOUT,
                };
                remote::connect_rc(&pair.qp, pair.mine.psn, theirs.qpn, theirs.psn, dgid, dmac, &path)?;
            }
        }
        Ok(())
    }

    fn remote_offset(&self, k: u64) -> u64 {
        remote_offset(k, self.size, self.cycle, self.line)
    }

    /// The requester of a BW test: `iterations` messages per QP, perftest's addresses.
    fn drive(&self, report: &mut BenchReport) -> Result<()> {
        let iters = self.config.bench.iterations;
        let window = if self.config.test.ud() {
            UD_TX_DEPTH as u64
        } else {
            self.slots
        }
        .min(self.slots);
        let mut posted = vec![0u64; self.pairs.len()];
        let mut done = vec![0u64; self.pairs.len()];
        // READ: the first bytes fetched per remote slot; atomics: the last value fetched.
        let mut seen: Vec<std::collections::HashMap<u64, Vec<u8>>> = vec![Default::default(); self.pairs.len()];
        let mut buffer = vec![0u8; self.size as usize];
        let mut completions = [WorkCompletion::default(); 32];
        let mut last_progress = Instant::now();
        while done.iter().any(|&d| d < iters) {
            let mut progress = false;
            for (index, pair) in self.pairs.iter().enumerate() {
                // Every free place of the window in one post (one doorbell), as perftest's
                // `--post_list`: a doorbell per message would cost a round trip to the
                // device per message where the device sits in another process.
                let free = (iters - posted[index]).min(window - (posted[index] - done[index]));
                if free > 0 {
                    self.post(index, pair, posted[index], free, &mut buffer)?;
                    posted[index] += free;
                }
                let got = pair.cq.poll(&mut completions)?;
                for wc in &completions[..got] {
                    progress = true;
                    let k = done[index];
                    done[index] += 1;
                    if wc.wr_id != k || wc.status != WcStatus::Success {
                        remote::fail(report, format!("QP {index} message {}: {:?}", wc.wr_id, wc.status));
                        continue;
                    }
                    if self.config.bench.verify && !self.check_fetched(index, pair, k, &mut seen[index], &mut buffer)? {
                        remote::fail(report, format!("QP {index} message {k}: fetched data inconsistent"));
                        continue;
                    }
                    report.messages_ok += 1;
                    if self.config.bench.verify && matches!(self.config.test, Test::ReadBw | Test::AtomicBw) {
                        report.bytes_verified += self.size;
                    }
                }
            }
            if progress {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > PROGRESS_TIMEOUT {
                return Err(PerftestError::Timeout(format!(
                    "no completion for {PROGRESS_TIMEOUT:?}: done {done:?}"
                )));
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(())
    }

    /// READ: the bytes of a remote slot never change; atomics: values fetched from one
    /// word run consecutively.
    fn check_fetched(
        &self,
        _index: usize,
        pair: &Pair,
        k: u64,
        seen: &mut std::collections::HashMap<u64, Vec<u8>>,
        buffer: &mut [u8],
    ) -> Result<bool> {
        let local = (k % self.slots) * self.slot_size;
        let slot = self.remote_offset(k);
        match self.config.test {
            Test::ReadBw => {
                pair.mr.read(local, buffer)?;
                Ok(match seen.get(&slot) {
                    Some(first) => first.as_slice() == &*buffer,
                    None => {
                        seen.insert(slot, buffer.to_vec());
                        true
                    }
                })
            }
            Test::AtomicBw => {
                let mut word = [0u8; 8];
                pair.mr.read(local, &mut word)?;
                let value = u64::from_le_bytes(word);
                let good = match seen.get(&slot) {
                    Some(last) => u64::from_le_bytes(last[..8].try_into().unwrap_or_default()).wrapping_add(1) == value,
                    None => true,
                };
                seen.insert(slot, word.to_vec());
                Ok(good)
            }
            _ => Ok(true),
        }
    }

    /// Posts messages `first..first + count` of QP `index` with one `post_send`.
    fn post(&self, index: usize, pair: &Pair, first: u64, count: u64, buffer: &mut [u8]) -> Result<()> {
        let theirs = pair.theirs.expect("connected");
        let mut sges = Vec::with_capacity(count as usize);
        for k in first..first + count {
            let local = (k % self.slots) * self.slot_size;
            if matches!(self.config.test, Test::WriteBw | Test::SendBw | Test::SendUdBw) {
                fill_pattern(buffer, index, k);
                pair.mr.write(local, buffer)?;
            }
            sges.push(Sge::new(pair.mr.addr() + local, self.size as u32, pair.mr.lkey()));
        }
        let requests: Vec<SendWorkRequest<'_>> = (first..first + count)
            .zip(&sges)
            .map(|(k, sge)| {
                let remote_addr = theirs.vaddr + self.remote_offset(k);
                let mut request = SendWorkRequest {
                    wr_id: k,
                    opcode: WrOpcode::RdmaWrite,
                    sg_list: std::slice::from_ref(sge),
                    send_flags: SendFlags::SIGNALED,
                    ..SendWorkRequest::default()
                };
                match self.config.test {
                    Test::WriteBw => {
                        request.rdma = RdmaFields {
                            remote_addr,
                            rkey: theirs.rkey,
                        };
                    }
                    Test::SendBw | Test::SendUdBw => {
                        request.opcode = WrOpcode::Send;
                        let (remote_qpn, remote_qkey) = pair.ud_peer.unwrap_or((theirs.qpn, QKEY));
                        request.ud = pair.ah.as_ref().map(|ah| UdFields {
                            ah,
                            remote_qpn,
                            remote_qkey,
                        });
                    }
                    Test::ReadBw => {
                        request.opcode = WrOpcode::RdmaRead;
                        request.rdma = RdmaFields {
                            remote_addr,
                            rkey: theirs.rkey,
                        };
                    }
                    Test::AtomicBw => {
                        request.opcode = WrOpcode::AtomicFetchAdd;
                        request.atomic = AtomicFields {
                            remote_addr,
                            compare_add: 1,
                            swap: 0,
                            rkey: theirs.rkey,
                        };
                    }
                    Test::WriteLat => unreachable!("write latency has its own loop"),
                }
                request
            })
            .collect();
        pair.qp
            .post_send(&requests)
            .map_err(|error| PerftestError::Message(format!("post_send: {error}")))
    }

    fn receive_length(&self) -> u32 {
        let grh = if self.config.test.ud() { GRH_BYTES as u64 } else { 0 };
        (self.size + grh) as u32
    }

    /// Posts receives on QP `index` until `RX_DEPTH` are outstanding (of `iterations`),
    /// `done` of them completed.
    fn replenish(&mut self, index: usize, done: u64) -> Result<()> {
        let iters = self.config.bench.iterations;
        let length = self.receive_length();
        let pair = &self.pairs[index];
        let posted = &mut self.receives[index];
        while *posted < iters && *posted - done < RX_DEPTH as u64 {
            let k = *posted;
            let sge = Sge::new(
                pair.mr.addr() + (k % self.slots) * self.slot_size,
                length,
                pair.mr.lkey(),
            );
            pair.qp
                .post_recv(&[RecvWorkRequest {
                    wr_id: k,
                    sg_list: &[sge],
                }])
                .map_err(|error| PerftestError::Message(format!("post_recv: {error}")))?;
            *posted += 1;
        }
        Ok(())
    }

    /// Before the last sync, as perftest's `ctx_set_recv_wqes`: the client sends right
    /// after it, and a UD datagram without a receive is lost.
    fn post_receives(&mut self) -> Result<()> {
        for index in 0..self.pairs.len() {
            self.replenish(index, 0)?;
        }
        Ok(())
    }

    /// The receiver of a SEND BW test: keeps receives posted until `iterations` arrived
    /// on every QP (perftest's `run_iter_bw_server`).
    fn receive_all(&mut self, report: &mut BenchReport) -> Result<()> {
        let iters = self.config.bench.iterations;
        let length = self.receive_length();
        let mut done = vec![0u64; self.pairs.len()];
        let mut completions = [WorkCompletion::default(); 32];
        let mut last_progress = Instant::now();
        while done.iter().any(|&d| d < iters) {
            let mut progress = false;
            for (index, done) in done.iter_mut().enumerate() {
                self.replenish(index, *done)?;
                let got = self.pairs[index].cq.poll(&mut completions)?;
                for wc in &completions[..got] {
                    progress = true;
                    let k = *done;
                    *done += 1;
                    if wc.wr_id != k || wc.status != WcStatus::Success || wc.byte_len != length {
                        remote::fail(
                            report,
                            format!("QP {index} receive {k}: {:?}, {} bytes", wc.status, wc.byte_len),
                        );
                    } else {
                        report.messages_ok += 1;
                    }
                }
            }
            if progress {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > PROGRESS_TIMEOUT {
                return Err(PerftestError::Timeout(format!(
                    "no message for {PROGRESS_TIMEOUT:?}: received {done:?} of {iters} per QP"
                )));
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(())
    }

    /// `ib_write_lat`'s ping-pong: WRITEs of zeros whose last byte counts; the server
    /// writes first, each side then waits for the peer's counter in its own region.
    ///
    /// `ib_write_lat` ends without a handshake: each side destroys its QP once its own loop
    /// is done. So when the ACK of our last WRITE is lost, the peer may already have left,
    /// our resends meet no QP, and the WRITE completes with RETRY_EXC_ERR although it
    /// arrived (perftest against itself fails the same way). As server we can tell: the
    /// client sends its last WRITE only once it has read ours, so its arrival proves ours
    /// did. As client ours is the last message of the test, and only the peer's report
    /// (its loop ends only once it has read it) can say; the WRITE is counted unconfirmed.
    fn write_latency(&self, client: bool, report: &mut BenchReport) -> Result<()> {
        let pair = &self.pairs[0];
        let theirs = pair.theirs.expect("connected");
        let iters = self.config.bench.iterations;
        let size = self.size as usize;
        let poll_at = self.region_offset() + self.size - 1;
        let mut message = vec![0u8; size];
        let mut arrived = vec![0u8; size];
        let mut completions = [WorkCompletion::default(); 4];
        let (mut sent, mut received) = (0u64, 0u64);
        // Our last WRITE completed with RETRY_EXC_ERR: its fate is settled after the loop.
        let mut last_unacknowledged = false;
        while sent < iters || received < iters {
            if received < iters && (client || sent > 0) {
                received += 1;
                let deadline = Instant::now() + PROGRESS_TIMEOUT;
                let mut last = [0u8; 1];
                loop {
                    pair.mr.read(poll_at, &mut last)?;
                    if last[0] == received as u8 {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(PerftestError::Timeout(format!("write {received} never arrived")));
                    }
                    std::thread::yield_now();
                }
                if self.config.bench.verify {
                    pair.mr.read(self.region_offset(), &mut arrived)?;
                    if arrived[..size - 1].iter().any(|&b| b != 0) {
                        remote::fail(report, format!("write {received}: not zeros before the counter"));
                    } else {
                        report.bytes_verified += self.size;
                    }
                }
            }
            if sent < iters {
                sent += 1;
                message[size - 1] = sent as u8;
                pair.mr.write(0, &message)?;
                let sge = Sge::new(pair.mr.addr(), size as u32, pair.mr.lkey());
                pair.qp
                    .post_send(&[SendWorkRequest {
                        wr_id: sent,
                        opcode: WrOpcode::RdmaWrite,
                        sg_list: std::slice::from_ref(&sge),
                        send_flags: SendFlags::SIGNALED,
                        rdma: RdmaFields {
                            remote_addr: theirs.vaddr,
                            rkey: theirs.rkey,
                        },
                        ..SendWorkRequest::default()
                    }])
                    .map_err(|error| PerftestError::Message(format!("post_send: {error}")))?;
                let deadline = Instant::now() + PROGRESS_TIMEOUT;
                loop {
                    let got = pair.cq.poll(&mut completions)?;
                    if got > 0 {
                        match completions[0].status {
                            WcStatus::Success => report.messages_ok += 1,
                            WcStatus::RetryExcErr if sent == iters => last_unacknowledged = true,
                            status => remote::fail(report, format!("write {sent}: {status:?}")),
                        }
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(PerftestError::Timeout(format!("write {sent} never completed")));
                    }
                    std::thread::yield_now();
                }
            }
        }
        if last_unacknowledged {
            if client {
                report.messages_unconfirmed += 1;
                report.failures.push(format!(
                    "write {iters}: RetryExcErr, the peer gone (ib_write_lat has no closing handshake): \
                     only its report can tell whether the WRITE arrived"
                ));
            } else {
                // The loop above has read the client's last WRITE, its answer to ours.
                report.notes.push(format!(
                    "write {iters}: RetryExcErr, but the client had answered it before leaving \
                     (its ACK was lost): counted ok"
                ));
                report.messages_ok += 1;
            }
        }
        Ok(())
    }

    /// The server's `--verify` of a WRITE, READ or atomic BW test after the client's report.
    fn check_served(&self, report: &mut BenchReport) -> Result<()> {
        let iters = self.config.bench.iterations;
        let total = iters * self.pairs.len() as u64;
        if !self.config.bench.verify {
            report.messages_ok = total;
            return Ok(());
        }
        let mut expected = vec![0u8; self.region as usize];
        let mut found = vec![0u8; self.region as usize];
        for (index, pair) in self.pairs.iter().enumerate() {
            pair.mr.read(self.region_offset(), &mut found)?;
            let mut hits = vec![0u64; (self.region / self.line) as usize];
            let mut written = std::collections::BTreeSet::new();
            for k in 0..iters {
                let offset = self.remote_offset(k);
                written.insert(offset);
                if let Some(hit) = hits.get_mut((offset / self.line) as usize) {
                    *hit += 1;
                }
            }
            self.expected_region(index, &mut expected, Some(&hits));
            let mut placed = 0;
            let good = match self.config.test {
                Test::WriteBw => {
                    let mut good = true;
                    let mut covered = vec![false; expected.len()];
                    for &offset in &written {
                        let span = offset as usize..(offset + self.size) as usize;
                        good &= slot_written(&found[span.clone()], &expected[span.clone()]);
                        covered[span].fill(true);
                    }
                    placed = covered.iter().filter(|&&c| c).count() as u64;
                    good && covered
                        .iter()
                        .zip(found.iter().zip(&expected))
                        .all(|(&c, (f, e))| c || f == e)
                }
                _ => found == expected,
            };
            if good {
                report.messages_ok += iters;
                report.bytes_verified += match self.config.test {
                    Test::AtomicBw => iters * 8,
                    Test::WriteBw => placed,
                    _ => self.region,
                };
            } else {
                report.messages_failed += iters;
                report.failures.push(format!(
                    "QP {index}: the target buffer is not what {} iterations of {} leave",
                    iters,
                    self.config.test.program()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key message as perftest's `KEY_PRINT_FMT_GID` prints it (RoCEv2, IPv4 GID).
    const PERFTEST_KEYS: &[u8] =
        b"0000:0010:000011:abcdef:00001234:00007f0012345000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02:00000000:";

    #[test]
    fn a_slot_counts_as_written_only_without_a_run_of_sentinel_bytes() {
        let sentinel: Vec<u8> = (0..64u8).collect();
        let mut written: Vec<u8> = sentinel.iter().map(|b| b ^ 0x5A).collect();
        assert!(slot_written(&written, &sentinel));
        // Random data matches the sentinel here and there: runs shorter than SENTINEL_RUN.
        written[10..10 + SENTINEL_RUN - 1].copy_from_slice(&sentinel[10..10 + SENTINEL_RUN - 1]);
        assert!(slot_written(&written, &sentinel));
        // A tail never written, or a hole where a packet went missing.
        let mut short = written.clone();
        short[40..].copy_from_slice(&sentinel[40..]);
        assert!(!slot_written(&short, &sentinel));
        let mut hole = written.clone();
        hole[20..20 + SENTINEL_RUN].copy_from_slice(&sentinel[20..20 + SENTINEL_RUN]);
        assert!(!slot_written(&hole, &sentinel));
        assert!(!slot_written(&sentinel, &sentinel));
        // Shorter than a run: only "written at all" can be told.
        assert!(slot_written(&[1, 2], &[1, 3]));
        assert!(!slot_written(&[1, 2], &[1, 2]));
    }

    #[test]
    fn key_messages_are_perftests_108_byte_text() {
        let mut bytes = PERFTEST_KEYS.to_vec();
        bytes.resize(KEY_LEN_GID, 0);
        let keys = KeyMessage::decode(&bytes).unwrap();
        assert_eq!(
            keys,
            KeyMessage {
                lid: 0,
                out_reads: 16,
                qpn: 0x11,
                psn: 0xabcdef,
                rkey: 0x1234,
                vaddr: 0x7f00_1234_5000,
                gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]),
                srqn: 0,
            }
        );
        assert_eq!(PERFTEST_KEYS.len(), KEY_LEN_GID - 1, "107 characters and the NUL");
        assert_eq!(keys.encode(), bytes);
    }

    #[test]
    fn key_messages_without_gid_are_59_bytes() {
        let keys = KeyMessage {
            lid: 0x1a,
            out_reads: 1,
            qpn: 0xffffff,
            psn: 1,
            rkey: 0xffff_ffff,
            vaddr: u64::MAX,
            gid: None,
            srqn: 7,
        };
        let bytes = keys.encode();
        assert_eq!(bytes.len(), KEY_LEN);
        assert_eq!(
            &bytes[..KEY_LEN - 1],
            b"001a:0001:ffffff:000001:ffffffff:ffffffffffffffff:00000007"
        );
        assert_eq!(KeyMessage::decode(&bytes).unwrap(), keys);
    }

    #[test]
    fn broken_key_messages_are_errors() {
        let mut good = PERFTEST_KEYS.to_vec();
        good.resize(KEY_LEN_GID, 0);
        assert!(KeyMessage::decode(&good[..KEY_LEN_GID - 1]).is_err(), "truncated");
        assert!(KeyMessage::decode(&[0xff; KEY_LEN_GID]).is_err(), "garbage");
        assert!(KeyMessage::decode(&[b'0'; KEY_LEN_GID]).is_err(), "no NUL");
        assert!(KeyMessage::decode(&[0; KEY_LEN_GID]).is_err(), "empty");
        let mut wide = good.clone();
        wide[0..4].copy_from_slice(b"zz00");
        assert!(KeyMessage::decode(&wide).is_err(), "not hex");
        let mut short = b"0000:0010:000011".to_vec();
        short.resize(KEY_LEN_GID, 0);
        assert!(KeyMessage::decode(&short).is_err(), "too few fields");
        // Every prefix and every single-byte corruption parses or fails, never panics.
        for cut in 0..good.len() {
            let _ = KeyMessage::decode(&good[..cut]);
            let mut bad = good.clone();
            bad[cut] = b':';
            let _ = KeyMessage::decode(&bad);
        }
    }

    #[test]
    fn versions_mtus_and_reports_use_perftests_bytes() {
        assert_eq!(&encode_version(VERSION), b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(decode_version(&encode_version("5.70")).unwrap(), 5.70);
        assert!(decode_version(&[0xff; VERSION_LEN]).is_err());
        assert_eq!(encode_mtu(Mtu::Mtu1024), *b"3\0");
        assert_eq!(decode_mtu(*b"5\0").unwrap(), Mtu::Mtu4096);
        assert_eq!(decode_mtu(*b"1\0").unwrap(), Mtu::Mtu256);
        assert!(decode_mtu(*b"6\0").is_err());
        assert!(decode_mtu(*b"33").is_err());
        let report = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: 1.0,
            msg_rate: 0.25,
        };
        let fields = report.encode();
        assert_eq!(fields[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(fields[3], [0x3f, 0xf0, 0, 0, 0, 0, 0, 0], "1.0 as a big-endian double");
        assert_eq!(BwReport::decode(&fields), report);
    }

    #[test]
    fn messages_walk_the_remote_buffer_as_perftest() {
        // 2-byte writes step by a cache line through a 4 KiB cycle buffer and wrap.
        assert_eq!(remote_offset(0, 2, 4096, 64), 0);
        assert_eq!(remote_offset(1, 2, 4096, 64), 64);
        assert_eq!(remote_offset(64, 2, 4096, 64), 0);
        // 100 bytes round up to 128.
        assert_eq!(remote_offset(3, 100, 4096, 64), 384);
        // More than half the cycle buffer: always the start.
        assert_eq!(remote_offset(7, 4096, 4096, 64), 0);
        assert_eq!(remote_offset(7, 2049, 4096, 64), 0);
    }

    #[test]
    fn each_test_follows_its_programs_handshakes() {
        use Step::*;
        assert_eq!(Test::WriteBw.before_traffic(), &[Round, Connect, Round, Sync]);
        assert_eq!(
            Test::SendUdBw.before_traffic(),
            &[Round, Connect, Sync, Round, PostReceives, Sync]
        );
        assert_eq!(Test::WriteLat.before_traffic(), &[Sync, Round, Connect, Round, Sync]);
        assert!(Test::new(Operation::Read, true, false).is_err());
        assert_eq!(Test::new(Operation::Send, true, false).unwrap(), Test::SendUdBw);
    }
}
