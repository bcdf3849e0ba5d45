//! `rnic-bench` across processes, perftest's split: one process runs with `--server`, the
//! other with `--client HOST`, each on its own NIC (typically `--device
//! vfio-user:/tmp/a.sock` behind `rnic-emu serve --net udp:IP`). They meet on a TCP
//! connection (loopback; default port [`DEFAULT_PORT`], perftest's 18515), exchange what
//! connecting RC queue pairs needs, and the client drives the traffic.
//!
//! # Control protocol
//!
//! Text lines over TCP, `\n`-terminated, fields separated by single spaces. Numbers are
//! decimal; GIDs are 32 hex digits; MACs are `aa:bb:cc:dd:ee:ff`.
//!
//! ```text
//! client → server  HELLO rnic-bench/1 rc|ud OP SIZE ITERS QPS MTU VERIFY(0|1)
//! server → client  OK | ERR reason                  (both sides must use the same flags)
//! client → server  QP INDEX QPN PSN GID MAC RKEY ADDR LEN      (one line per QP)
//! server → client  QP INDEX QPN PSN GID MAC RKEY ADDR LEN      (one line per QP)
//!                  both sides take their QPs RESET → INIT → RTR → RTS
//! server → client  READY
//! per batch (up to `slots` messages on every QP, messages FIRST..FIRST+COUNT):
//! client → server  PREP FIRST COUNT    server fills its slots (READ) / posts receives (SEND)
//! server → client  READY
//!                  the client posts the batch and polls until every WR completed
//! client → server  DONE FIRST COUNT
//! server → client  RESULT BYTES [PAIR:MESSAGE ...]   bytes it verified, messages that failed
//! at the end:
//! client → server  END MESSAGES_OK MESSAGES_FAILED BYTES_VERIFIED
//! server → client  BYE
//! ```
//!
//! `PSN` is the sender's initial send PSN (the peer's RTR `rq_psn`); `RKEY`, `ADDR` and
//! `LEN` describe the side's registered buffer (slots, then an 8-byte atomic word).
//!
//! # Verification
//!
//! Each message's payload is the same (pair, message) pattern as in the in-process bench.
//! A buffer slot is reused only in a later batch, after both sides scored it.
//! * WRITE: the server checks its slots after the client reported the batch done. A
//!   requester completion of an RC WRITE means the responder acknowledged it, and it
//!   acknowledges only after placing the data, so the bytes are in the server's memory.
//! * SEND: the server posts the batch's receives before the client sends, polls their
//!   completions (in order, `byte_len` checked) and checks the data.
//! * READ: the server writes the pattern into its slots before the client posts; the
//!   client checks what it fetched.
//! * SEND over UD (`--ud`): the same, with a 40-byte GRH in front of each receive; the
//!   server also checks `byte_len` = 40 + size. A datagram lost on the way is a failed
//!   message (after 10 s without progress); loopback does not lose them at this pace.
//! * Atomics (fetch-and-add 1): the client checks that the k-th returns k; the server
//!   checks its word equals the number of atomics done after every batch.
//!
//! A message is ok when its requester completion succeeded and neither side found it
//! wrong. Both sides print the client's totals.
//!
//! # What is not known across processes
//!
//! `retransmissions`, `frames` and the fabric's fault counts are 0 in the report: they are
//! counters of the emulator processes (ask them: `rnic-emu` logs, `--pcap`), not of the
//! verbs client. `sim_time_ps` is 0 too: each emulator has its own virtual clock.
//! `wall_time_s` is the client's time from the first batch to the last (and the server's
//! from READY to END), including one TCP round trip per batch for the lockstep above. The
//! bandwidth and message rate come from it (lower bounds, for that round trip); latencies
//! are not measured across processes and read 0.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rnic_verbs::backend::open_device;
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{
    AccessFlags, AddressHandle, AhAttributes, AtomicFields, CompletionQueue, Context, Gid, MemoryRegion, Mtu,
    ProtectionDomain, QpAttributeMask, QpAttributes, QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair,
    RcConnection, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, UdFields, WcStatus, WorkCompletion,
    WrOpcode,
};

use crate::bench::{fill_pattern, BenchConfig, BenchError, BenchReport, Operation, WINDOW};
use crate::cm_session::RemoteCm;

/// perftest's default port.
pub const DEFAULT_PORT: u16 = 18515;
/// The HELLO line's protocol name.
const PROTOCOL: &str = "rnic-bench/1";
/// Most bytes of buffer slots per QP.
const MAX_SLOT_BYTES: usize = 64 << 20;
/// How long a batch may go without a completion.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);
/// The Q_Key of the UD queue pairs.
pub(crate) const QKEY: u32 = 0x1111_1111;
/// Bytes of GRH in front of every UD receive.
pub(crate) const GRH_BYTES: usize = 40;
/// Most UD payload bytes in flight per batch, over all QPs: a kernel UDP socket buffer
/// (about 208 KiB by default) holds them with room to spare, so loopback rarely drops one.
const UD_BATCH_BYTES: usize = 64 << 10;
/// How long the client keeps trying to reach the server, and how long a control read may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// Which end of the control connection this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Listens on 127.0.0.1:PORT, serves and verifies.
    Server {
        /// TCP port.
        port: u16,
    },
    /// Connects to HOST:PORT and drives the traffic.
    Client {
        /// Host name or address of the server.
        host: String,
        /// TCP port.
        port: u16,
    },
}

/// What a cross-process run needs.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// The traffic (faults and capture do not apply: the wire is the emulators').
    pub bench: BenchConfig,
    /// Device string for [`open_device`], e.g. `vfio-user:/tmp/a.sock,mac=02:...`.
    pub device: String,
    /// The port's IPv4 address (GID 0 becomes `::ffff:IP`); required by `udp:` backends.
    pub ipv4: Option<Ipv4Addr>,
    /// Server or client.
    pub role: Role,
    /// SEND over UD queue pairs instead of RC (`send` only; size at most the MTU).
    pub ud: bool,
}

/// Why a cross-process run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A setting is out of range or unsupported across processes.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The device could not be opened.
    #[error("device {device}: {reason}")]
    Device {
        /// The device string.
        device: String,
        /// What failed.
        reason: String,
    },
    /// The verbs layer refused a step.
    #[error("verbs: {0}")]
    Verbs(#[from] rnic_verbs::VerbsError),
    /// The control connection failed.
    #[error("control connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer said something unexpected.
    #[error("control protocol: {0}")]
    Protocol(String),
    /// Work requests did not complete.
    #[error("{0}")]
    Timeout(String),
    /// The connection manager could not connect or disconnect (`--cm`).
    #[error("{0}")]
    ConnectionManager(#[from] BenchError),
}

type Result<T> = std::result::Result<T, RemoteError>;

/// What one side tells the other about one QP.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
    mac: [u8; 6],
    rkey: u32,
    addr: u64,
    len: u64,
}

impl Endpoint {
    fn line(&self, index: usize) -> String {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let mac: Vec<String> = self.mac.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "QP {index} {} {} {gid} {} {} {} {}",
            self.qpn,
            self.psn,
            mac.join(":"),
            self.rkey,
            self.addr,
            self.len
        )
    }

    fn parse(line: &str, index: usize) -> Result<Self> {
        let bad = || RemoteError::Protocol(format!("bad QP line {line:?}"));
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() != 9 || fields[0] != "QP" || fields[1].parse::<usize>().ok() != Some(index) {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        if fields[4].len() != 32 {
            return Err(bad());
        }
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&fields[4][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        let mac = rnic_verbs::backend::vfio_user::parse_mac(fields[5]).ok_or_else(bad)?;
        Ok(Self {
            qpn: fields[2].parse().map_err(|_| bad())?,
            psn: fields[3].parse().map_err(|_| bad())?,
            gid,
            mac,
            rkey: fields[6].parse().map_err(|_| bad())?,
            addr: fields[7].parse().map_err(|_| bad())?,
            len: fields[8].parse().map_err(|_| bad())?,
        })
    }
}

/// The control connection.
struct Control {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Control {
    fn new(stream: TcpStream) -> Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: BufWriter::new(stream),
        })
    }

    fn send(&mut self, line: &str) -> Result<()> {
        self.writer.write_all(line.as_bytes())?;
        self.writer.write_all(b"\n")?;
        self.writer.flush()?;
        Ok(())
    }

    fn receive(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(RemoteError::Protocol("the peer closed the connection".into()));
        }
        Ok(line.trim_end_matches(['\n', '\r']).to_string())
    }

    /// Receives a line whose first word is `word`; returns the other words.
    fn expect(&mut self, word: &str) -> Result<Vec<String>> {
        let line = self.receive()?;
        let mut words = line.split(' ').map(str::to_string);
        match words.next() {
            Some(first) if first == word => Ok(words.collect()),
            Some(first) if first == "ERR" => {
                Err(RemoteError::Protocol(format!("peer: {}", &line[4.min(line.len())..])))
            }
            _ => Err(RemoteError::Protocol(format!("expected {word}, got {line:?}"))),
        }
    }
}

/// One QP with its CQ and buffer.
struct Pair {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    remote: Option<Endpoint>,
    /// The address handle towards the peer (UD only).
    ah: Option<AddressHandle>,
    /// Fetch-and-adds this pair completed (client) or expects done (server).
    atomics: u64,
}

/// The local NIC and its queue pairs.
struct Local {
    context: Context,
    pd: ProtectionDomain,
    /// UD: receives start with a GRH, so payloads sit [`GRH_BYTES`] into their slot.
    ud: bool,
    pairs: Vec<Pair>,
    slots: usize,
    slot_size: usize,
    size: usize,
}

impl Local {
    fn open(config: &RemoteConfig) -> Result<Self> {
        let context = open_context(&config.device, config.ipv4)?;
        let pd = context.alloc_pd()?;
        let size = message_size(&config.bench);
        let grh = if config.ud { GRH_BYTES } else { 0 };
        let slot_size = (size + grh).max(8).next_multiple_of(64);
        let mut slots = (MAX_SLOT_BYTES / slot_size).clamp(1, WINDOW);
        if config.ud {
            slots = slots
                .min(UD_BATCH_BYTES / (config.bench.queue_pairs * slot_size))
                .max(1);
        }
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let depth = (2 * WINDOW) as u32;
        let mut pairs = Vec::with_capacity(config.bench.queue_pairs);
        for _ in 0..config.bench.queue_pairs {
            let mr = pd.register_provider_memory(slots * slot_size + 64, access)?;
            let cq = context.create_cq(depth, None, 0)?;
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
                qp_type: if config.ud { QpType::Ud } else { QpType::Rc },
                sq_sig_all: true,
            })?;
            pairs.push(Pair {
                qp,
                cq,
                mr,
                remote: None,
                ah: None,
                atomics: 0,
            });
        }
        Ok(Self {
            context,
            pd,
            ud: config.ud,
            pairs,
            slots,
            slot_size,
            size,
        })
    }

    fn endpoints(&self) -> Result<Vec<Endpoint>> {
        let gid = self.context.query_gid(1, 0)?.raw();
        let mac = self.context.mac_address();
        // Initial PSNs differ per process and QP, as perftest's random ones do.
        let seed = std::process::id().wrapping_mul(0x9E37_79B9);
        Ok(self
            .pairs
            .iter()
            .enumerate()
            .map(|(index, pair)| Endpoint {
                qpn: pair.qp.qp_num(),
                psn: seed.wrapping_add(index as u32 * 0x1_0001) & 0x00FF_FFFF,
                gid,
                mac,
                rkey: pair.mr.rkey(),
                addr: pair.mr.addr(),
                len: pair.mr.length(),
            })
            .collect())
    }

    fn connect_all(&mut self, mtu: Mtu, local: &[Endpoint], remote: Vec<Endpoint>, program: bool) -> Result<()> {
        for ((pair, mine), theirs) in self.pairs.iter_mut().zip(local).zip(remote) {
            if !program {
                // The connection manager moves the QPs; only the buffers are taken.
            } else if self.ud {
                connect_ud(&pair.qp, mine.psn)?;
                pair.ah = Some(self.pd.create_ah(&AhAttributes {
                    dgid: Gid(theirs.gid),
                    dmac: theirs.mac,
                    hop_limit: 64,
                    ..AhAttributes::default()
                })?);
            } else {
                connect(&pair.qp, mine.psn, &theirs, mtu)?;
            }
            pair.remote = Some(theirs);
        }
        Ok(())
    }

    fn slot_offset(&self, message: u64) -> u64 {
        ((message % self.slots as u64) as usize * self.slot_size) as u64
    }

    /// Where message `message`'s payload sits (after the GRH on UD).
    fn payload_offset(&self, message: u64) -> u64 {
        self.slot_offset(message) + if self.ud { GRH_BYTES as u64 } else { 0 }
    }

    /// `byte_len` of a receive completion.
    fn received_length(&self) -> u32 {
        (self.size + if self.ud { GRH_BYTES } else { 0 }) as u32
    }

    fn atomic_offset(&self) -> u64 {
        (self.slots * self.slot_size) as u64
    }
}

/// Opens the device named by `device` (see [`open_device`]) with `ipv4` as GID 0's address.
pub(crate) fn open_context(device: &str, ipv4: Option<Ipv4Addr>) -> Result<Context> {
    let access = open_device(device).map_err(|error| RemoteError::Device {
        device: device.to_string(),
        reason: error.to_string(),
    })?;
    open_context_on(access, ipv4)
}

/// Opens a context on an already opened device (tests hand in embedded NICs on one fabric).
pub(crate) fn open_context_on(
    access: Box<dyn rnic_verbs::device_access::DeviceAccess>,
    ipv4: Option<Ipv4Addr>,
) -> Result<Context> {
    let driver = DriverConfig {
        ipv4_address: ipv4.map(|ip| ip.octets()),
        ..DriverConfig::default()
    };
    Ok(Context::open_with_config(access, &driver)?)
}

pub(crate) fn message_size(config: &BenchConfig) -> usize {
    if config.operation == Operation::Atomic {
        8
    } else {
        config.size
    }
}

fn connect(qp: &QueuePair, local_psn: u32, remote: &Endpoint, mtu: Mtu) -> Result<()> {
    let path = RcPath {
        mtu,
        sgid_index: 0,
        hop_limit: 64,
        max_dest_rd_atomic: 16,
        max_rd_atomic: 16,
        min_rnr_timer: 1,
        // 4.096 µs × 2^10 ≈ 4 ms: long against a loopback round trip through two emulators,
        // short enough that a datagram the kernel dropped costs little.
        timeout: 10,
    };
    connect_rc(
        qp,
        local_psn,
        remote.qpn,
        remote.psn,
        Gid(remote.gid),
        remote.mac,
        &path,
    )
}

/// The settings of an RC connection that differ between peers' conventions (ours, perftest's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RcPath {
    /// Path MTU.
    pub(crate) mtu: Mtu,
    /// Our GID table entry the frames go out from.
    pub(crate) sgid_index: u8,
    /// GRH hop limit (IP TTL).
    pub(crate) hop_limit: u8,
    /// READs and atomics the peer may have outstanding at us (our responder resources).
    pub(crate) max_dest_rd_atomic: u8,
    /// READs and atomics we keep outstanding (at most the peer's responder resources).
    pub(crate) max_rd_atomic: u8,
    /// RNR NAK timer code we ask the peer to wait.
    pub(crate) min_rnr_timer: u8,
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub(crate) timeout: u8,
}

/// RESET → INIT → RTR → RTS for an RC QP towards `dest_qpn` at `dgid`/`dmac` (a zero
/// `dmac` is derived from a link-local `dgid` by the verbs layer); retries 7/7 as perftest.
pub(crate) fn connect_rc(
    qp: &QueuePair,
    local_psn: u32,
    dest_qpn: u32,
    dest_psn: u32,
    dgid: Gid,
    dmac: [u8; 6],
    path: &RcPath,
) -> Result<()> {
    qp.init_rc()?;
    rtr_rts_rc(qp, local_psn, dest_qpn, dest_psn, dgid, dmac, path)
}

/// INIT → RTR → RTS for an RC QP (the second half of [`connect_rc`]).
pub(crate) fn rtr_rts_rc(
    qp: &QueuePair,
    local_psn: u32,
    dest_qpn: u32,
    dest_psn: u32,
    dgid: Gid,
    dmac: [u8; 6],
    path: &RcPath,
) -> Result<()> {
    qp.rtr_rts_rc(&RcConnection {
        path_mtu: path.mtu,
        dest_qp_num: dest_qpn,
        rq_psn: dest_psn,
        sq_psn: local_psn,
        ah_attr: AhAttributes {
            dgid,
            dmac,
            sgid_index: path.sgid_index,
            hop_limit: path.hop_limit,
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: path.max_dest_rd_atomic,
        min_rnr_timer: path.min_rnr_timer,
        max_rd_atomic: path.max_rd_atomic,
        timeout: path.timeout,
        retry_cnt: 7,
        rnr_retry: 7,
    })?;
    Ok(())
}

/// RESET → INIT (Q_Key [`QKEY`], perftest's too) → RTR → RTS for a UD QP.
pub(crate) fn connect_ud(qp: &QueuePair, local_psn: u32) -> Result<()> {
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::QKEY,
    )?;
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rtr,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE,
    )?;
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rts,
            sq_psn: local_psn,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
    )?;
    Ok(())
}

/// RESET (dropping the posted receives), drain the CQ, and up to RTS again.
fn restart_ud(pair: &Pair) -> Result<()> {
    pair.qp.modify(
        &QpAttributes {
            qp_state: QpState::Reset,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE,
    )?;
    let mut completions = [WorkCompletion::default(); WINDOW];
    while pair.cq.poll(&mut completions)? > 0 {}
    connect_ud(&pair.qp, 0)
}

fn hello(config: &BenchConfig, ud: bool) -> String {
    format!(
        "HELLO {PROTOCOL} {}{} {} {} {} {} {} {}",
        if ud { "ud" } else { "rc" },
        if config.connection_manager { "+cm" } else { "" },
        config.operation.name(),
        message_size(config),
        config.iterations,
        config.queue_pairs,
        config.mtu,
        u8::from(config.verify)
    )
}

fn check_config(config: &BenchConfig, ud: bool) -> Result<Mtu> {
    if ud && (config.operation != Operation::Send || config.size as u64 > u64::from(config.mtu)) {
        return Err(RemoteError::Config(format!(
            "UD moves `send` only, of at most one MTU ({} bytes)",
            config.mtu
        )));
    }
    if ud && config.connection_manager {
        return Err(RemoteError::Config(
            "--cm across processes connects RC queue pairs; UD (SIDR) is in-process only so far".into(),
        ));
    }
    if config.operation == Operation::Mixed {
        return Err(RemoteError::Config(
            "mixed is not supported across processes: write, read, send or atomic".into(),
        ));
    }
    if config.queue_pairs == 0 || config.queue_pairs > 256 {
        return Err(RemoteError::Config(format!("{} QPs: 1..=256", config.queue_pairs)));
    }
    if message_size(config) == 0 || message_size(config) > 1 << 30 {
        return Err(RemoteError::Config(format!("message size {}: 1..=1 GiB", config.size)));
    }
    if config.faults != rnic_hw_model::fabric::FaultPlan::none() || config.capture {
        return Err(RemoteError::Config(
            "--faults and --pcap apply to the in-process wire only (use rnic-emu --pcap)".into(),
        ));
    }
    Mtu::from_bytes(config.mtu)
        .ok_or_else(|| RemoteError::Config(format!("MTU {}: one of 256, 512, 1024, 2048, 4096", config.mtu)))
}

pub(crate) fn new_report(config: &BenchConfig) -> BenchReport {
    BenchReport {
        operation: config.operation.name(),
        size: message_size(config),
        iterations: config.iterations,
        queue_pairs: config.queue_pairs,
        mtu: config.mtu,
        // Across processes the emulators run on the wall clock; no preset applies here
        // (each `rnic-emu` has its own `--timing`).
        mode: "wall",
        preset: "-".to_string(),
        test: if config.latency_test { "lat" } else { "bw" },
        messages_expected: config.iterations * config.queue_pairs as u64,
        ..BenchReport::default()
    }
}

/// Average goodput and message rate of the messages that succeeded over `wall_time_s`.
/// The lockstep's control round trips are inside that time, so these are lower bounds;
/// latencies are not measured across processes and stay 0.
fn wall_figures(report: &mut BenchReport) {
    if report.wall_time_s > 0.0 {
        let bytes = report.messages_ok as f64 * report.size as f64;
        report.bw_gbps = bytes * 8.0 / report.wall_time_s / 1e9;
        report.bw_peak_gbps = report.bw_gbps;
        report.msg_rate_mpps = report.messages_ok as f64 / report.wall_time_s / 1e6;
    }
}

/// Runs one side of a cross-process benchmark; both sides return the client's totals.
///
/// # Errors
/// Bad settings, a device that cannot be opened, a verbs failure during setup, a broken
/// control connection or work requests that never complete.
pub fn run(config: &RemoteConfig) -> Result<BenchReport> {
    let mtu = check_config(&config.bench, config.ud)?;
    match &config.role {
        Role::Server { port } => {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, *port))?;
            let mut local = Local::open(config)?;
            let (stream, _) = listener.accept()?;
            drop(listener);
            let mut control = Control::new(stream)?;
            let words = control.expect("HELLO")?;
            let theirs = format!("HELLO {}", words.join(" "));
            if theirs != hello(&config.bench, config.ud) {
                let reason = format!(
                    "settings differ: client {theirs:?}, server {:?}",
                    hello(&config.bench, config.ud)
                );
                control.send(&format!("ERR {reason}"))?;
                return Err(RemoteError::Protocol(reason));
            }
            control.send("OK")?;
            let remote = receive_endpoints(&mut control, config.bench.queue_pairs)?;
            let endpoints = local.endpoints()?;
            let cm = if config.bench.connection_manager {
                let ip = IpAddr::from(Ipv6Addr::from(endpoints[0].gid));
                let ip = match ip {
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                    v4 => v4,
                };
                let mut cm = RemoteCm::new(&local.context, None, mtu)?;
                cm.listen(SocketAddr::new(ip, *port))?;
                Some(cm)
            } else {
                None
            };
            for (index, endpoint) in endpoints.iter().enumerate() {
                control.send(&endpoint.line(index))?;
            }
            local.connect_all(mtu, &endpoints, remote, cm.is_none())?;
            let cm = match cm {
                Some(mut cm) => {
                    let qps: Vec<&QueuePair> = local.pairs.iter().map(|p| &p.qp).collect();
                    cm.accept_all(&qps)?;
                    Some(cm)
                }
                None => None,
            };
            control.send("READY")?;
            let mut report = serve(&config.bench, &mut local, &mut control)?;
            if let Some(cm) = cm {
                report.connection_manager = true;
                report.cm_mads = cm.disconnect_all(false)?;
            }
            Ok(report)
        }
        Role::Client { host, port } => {
            let mut local = Local::open(config)?;
            let stream = connect_retrying(host, *port)?;
            let mut control = Control::new(stream)?;
            control.send(&hello(&config.bench, config.ud))?;
            control.expect("OK")?;
            let endpoints = local.endpoints()?;
            for (index, endpoint) in endpoints.iter().enumerate() {
                control.send(&endpoint.line(index))?;
            }
            let remote = receive_endpoints(&mut control, config.bench.queue_pairs)?;
            let server = remote.first().map(|e| {
                let ip = Ipv6Addr::from(e.gid);
                (ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4), e.mac)
            });
            let cm = config.bench.connection_manager;
            local.connect_all(mtu, &endpoints, remote, !cm)?;
            let cm = match (cm, server) {
                (true, Some(server)) => {
                    let mut cm = RemoteCm::new(&local.context, Some(server), mtu)?;
                    let qps: Vec<&QueuePair> = local.pairs.iter().map(|p| &p.qp).collect();
                    cm.connect_all(SocketAddr::new(server.0, *port), &qps)?;
                    Some(cm)
                }
                _ => None,
            };
            control.expect("READY")?;
            let mut report = drive(&config.bench, &mut local, &mut control)?;
            if let Some(cm) = cm {
                report.connection_manager = true;
                report.cm_mads = cm.disconnect_all(true)?;
            }
            Ok(report)
        }
    }
}

pub(crate) fn connect_retrying(host: &str, port: u16) -> Result<TcpStream> {
    let deadline = Instant::now() + CONTROL_TIMEOUT;
    loop {
        let addresses: Vec<_> = (host, port).to_socket_addrs()?.collect();
        let mut last = None;
        for address in addresses {
            match TcpStream::connect_timeout(&address, Duration::from_secs(1)) {
                Ok(stream) => return Ok(stream),
                Err(error) => last = Some(error),
            }
        }
        if Instant::now() > deadline {
            return Err(last.map_or_else(|| RemoteError::Protocol(format!("{host}: no address")), RemoteError::Io));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn receive_endpoints(control: &mut Control, count: usize) -> Result<Vec<Endpoint>> {
    (0..count)
        .map(|index| Endpoint::parse(&control.receive()?, index))
        .collect()
}

fn parse_numbers(words: &[String], count: usize, line: &str) -> Result<Vec<u64>> {
    let numbers: Vec<u64> = words.iter().take(count).filter_map(|w| w.parse().ok()).collect();
    if numbers.len() != count {
        return Err(RemoteError::Protocol(format!("bad {line} line: {words:?}")));
    }
    Ok(numbers)
}

/// The server: answers PREP, DONE and END until the client is done.
fn serve(config: &BenchConfig, local: &mut Local, control: &mut Control) -> Result<BenchReport> {
    let start = Instant::now();
    let mut report = new_report(config);
    let size = local.size;
    let mut expected = vec![0u8; size];
    let mut found = vec![0u8; size];
    loop {
        let line = control.receive()?;
        let words: Vec<String> = line.split(' ').map(str::to_string).collect();
        match words[0].as_str() {
            "PREP" => {
                let n = parse_numbers(&words[1..], 2, "PREP")?;
                let (first, count) = (n[0], n[1]);
                for (index, pair) in local.pairs.iter().enumerate() {
                    for message in first..first + count {
                        let offset = local.slot_offset(message);
                        match config.operation {
                            Operation::Read => {
                                fill_pattern(&mut expected, index, message);
                                pair.mr.write(offset, &expected)?;
                            }
                            Operation::Send => {
                                let sge = Sge::new(pair.mr.addr() + offset, local.received_length(), pair.mr.lkey());
                                pair.qp
                                    .post_recv(&[RecvWorkRequest {
                                        wr_id: message,
                                        sg_list: &[sge],
                                    }])
                                    .map_err(|error| RemoteError::Protocol(format!("post_recv: {error}")))?;
                            }
                            _ => {}
                        }
                    }
                }
                control.send("READY")?;
            }
            "DONE" => {
                let n = parse_numbers(&words[1..], 2, "DONE")?;
                let (first, count) = (n[0], n[1]);
                let mut bytes = 0u64;
                let mut failed = Vec::new();
                for index in 0..local.pairs.len() {
                    let received = if config.operation == Operation::Send {
                        receive_completions(&local.pairs[index].cq, first, count, local.received_length())
                    } else {
                        Vec::new()
                    };
                    if local.ud && (received.len() as u64) < count {
                        // A datagram was lost: the batch's unused receives would catch the
                        // next batch's messages. Start the QP over (same QPN, so the client
                        // needs to know nothing); the missing messages are failures.
                        restart_ud(&local.pairs[index])?;
                    }
                    for message in first..first + count {
                        let ok = match config.operation {
                            Operation::Write | Operation::Send => {
                                if config.operation == Operation::Send
                                    && received.get((message - first) as usize) != Some(&true)
                                {
                                    false
                                } else if config.verify {
                                    fill_pattern(&mut expected, index, message);
                                    local.pairs[index].mr.read(local.payload_offset(message), &mut found)?;
                                    bytes += size as u64 * u64::from(expected == found);
                                    expected == found
                                } else {
                                    true
                                }
                            }
                            _ => true,
                        };
                        if !ok {
                            failed.push(format!("{index}:{message}"));
                        }
                    }
                    if config.operation == Operation::Atomic && config.verify {
                        let mut word = [0u8; 8];
                        local.pairs[index].mr.read(local.atomic_offset(), &mut word)?;
                        local.pairs[index].atomics = first + count;
                        if u64::from_le_bytes(word) != first + count {
                            failed.extend((first..first + count).map(|m| format!("{index}:{m}")));
                        }
                    }
                }
                let mut reply = format!("RESULT {bytes}");
                for entry in failed {
                    reply.push(' ');
                    reply.push_str(&entry);
                }
                control.send(&reply)?;
            }
            "END" => {
                let n = parse_numbers(&words[1..], 3, "END")?;
                report.messages_ok = n[0];
                report.messages_failed = n[1];
                report.bytes_verified = n[2];
                report.wall_time_s = start.elapsed().as_secs_f64();
                wall_figures(&mut report);
                control.send("BYE")?;
                return Ok(report);
            }
            _ => return Err(RemoteError::Protocol(format!("unexpected {line:?}"))),
        }
    }
}

/// Polls the receive completions of messages `first..first + count`; returns, per
/// message, whether it arrived in order, successfully and whole (`length` bytes, with the
/// GRH on UD). Messages that do not arrive within [`COMPLETION_TIMEOUT`] are failures.
fn receive_completions(cq: &CompletionQueue, first: u64, count: u64, length: u32) -> Vec<bool> {
    let mut results = Vec::with_capacity(count as usize);
    let mut completions = [WorkCompletion::default(); WINDOW];
    let mut last_progress = Instant::now();
    while (results.len() as u64) < count && last_progress.elapsed() < COMPLETION_TIMEOUT {
        let got = cq.poll(&mut completions).unwrap_or(0);
        if got == 0 {
            std::thread::sleep(Duration::from_micros(20));
            continue;
        }
        last_progress = Instant::now();
        for wc in &completions[..got] {
            let expected = first + results.len() as u64;
            results.push(wc.wr_id == expected && wc.status == WcStatus::Success && wc.byte_len == length);
        }
    }
    results
}

/// The client: posts every batch, scores it with the server, and ends the run.
fn drive(config: &BenchConfig, local: &mut Local, control: &mut Control) -> Result<BenchReport> {
    let start = Instant::now();
    let mut report = new_report(config);
    let size = local.size;
    let slots = local.slots as u64;
    let mut expected = vec![0u8; size];
    let mut found = vec![0u8; size];
    let mut completions = [WorkCompletion::default(); WINDOW * 2];
    let mut first = 0;
    while first < config.iterations {
        let count = slots.min(config.iterations - first);
        control.send(&format!("PREP {first} {count}"))?;
        control.expect("READY")?;
        // Per pair and message of the batch: requester success and local check.
        let mut ok = vec![vec![false; count as usize]; local.pairs.len()];
        let mut done = vec![0u64; local.pairs.len()];
        for (index, pair) in local.pairs.iter().enumerate() {
            // The whole batch of a QP in one post: one doorbell, not one per message.
            post(config, local, pair, index, first..first + count, &mut expected)?;
        }
        let mut last_progress = Instant::now();
        while done.iter().any(|&d| d < count) {
            let mut progress = false;
            for (index, pair) in local.pairs.iter_mut().enumerate() {
                let got = pair.cq.poll(&mut completions)?;
                for wc in &completions[..got] {
                    progress = true;
                    let message = first + done[index];
                    done[index] += 1;
                    if wc.wr_id != message || wc.status != WcStatus::Success {
                        fail(&mut report, format!("QP {index} message {}: {:?}", wc.wr_id, wc.status));
                        continue;
                    }
                    let offset = ((message % slots) as usize * local.slot_size) as u64;
                    let good = match config.operation {
                        Operation::Read if config.verify => {
                            fill_pattern(&mut expected, index, message);
                            pair.mr.read(offset, &mut found)?;
                            expected == found
                        }
                        Operation::Atomic if config.verify => {
                            let mut old = [0u8; 8];
                            pair.mr.read(offset, &mut old)?;
                            let good = u64::from_le_bytes(old) == pair.atomics;
                            pair.atomics += 1;
                            good
                        }
                        _ => true,
                    };
                    if good {
                        ok[index][(message - first) as usize] = true;
                    } else {
                        fail(&mut report, format!("QP {index} message {message}: payload differs"));
                    }
                }
            }
            if progress {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > COMPLETION_TIMEOUT {
                return Err(RemoteError::Timeout(format!(
                    "no completion for {COMPLETION_TIMEOUT:?}: batch {first}..{}, done {done:?}",
                    first + count
                )));
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        control.send(&format!("DONE {first} {count}"))?;
        let words = control.expect("RESULT")?;
        let bytes = parse_numbers(&words, 1, "RESULT")?[0];
        report.bytes_verified += bytes;
        for entry in &words[1..] {
            let parsed = entry
                .split_once(':')
                .and_then(|(p, m)| Some((p.parse::<usize>().ok()?, m.parse::<u64>().ok()?)));
            match parsed {
                Some((p, m)) if p < ok.len() && (first..first + count).contains(&m) => {
                    let slot = &mut ok[p][(m - first) as usize];
                    if *slot {
                        *slot = false;
                        fail(&mut report, format!("QP {p} message {m}: the server found it wrong"));
                    }
                }
                _ => return Err(RemoteError::Protocol(format!("bad RESULT entry {entry:?}"))),
            }
        }
        let good: u64 = ok.iter().flatten().map(|&g| u64::from(g)).sum();
        report.messages_ok += good;
        if config.verify && matches!(config.operation, Operation::Read | Operation::Atomic) {
            report.bytes_verified += good * size as u64;
        }
        first += count;
    }
    report.wall_time_s = start.elapsed().as_secs_f64();
    wall_figures(&mut report);
    control.send(&format!(
        "END {} {} {}",
        report.messages_ok, report.messages_failed, report.bytes_verified
    ))?;
    control.expect("BYE")?;
    Ok(report)
}

pub(crate) fn fail(report: &mut BenchReport, what: String) {
    report.messages_failed += 1;
    if report.failures.len() < 10 {
        report.failures.push(what);
    }
}

/// Posts messages `messages` of QP `index` with one `post_send`.
fn post(
    config: &BenchConfig,
    local: &Local,
    pair: &Pair,
    index: usize,
    messages: std::ops::Range<u64>,
    buffer: &mut [u8],
) -> Result<()> {
    let remote = pair.remote.as_ref().expect("connected");
    let mut sges = Vec::with_capacity(messages.clone().count());
    for message in messages.clone() {
        let offset = local.payload_offset(message);
        if matches!(config.operation, Operation::Write | Operation::Send) {
            fill_pattern(buffer, index, message);
            pair.mr.write(offset, buffer)?;
        }
        sges.push(Sge::new(pair.mr.addr() + offset, local.size as u32, pair.mr.lkey()));
    }
    let requests: Vec<SendWorkRequest<'_>> = messages
        .zip(&sges)
        .map(|(message, local_sge)| {
            let offset = local.payload_offset(message);
            let mut request = SendWorkRequest {
                wr_id: message,
                opcode: WrOpcode::RdmaWrite,
                sg_list: std::slice::from_ref(local_sge),
                send_flags: SendFlags::SIGNALED,
                ..SendWorkRequest::default()
            };
            let remote_fields = RdmaFields {
                remote_addr: remote.addr + offset,
                rkey: remote.rkey,
            };
            match config.operation {
                Operation::Write => request.rdma = remote_fields,
                Operation::Send => {
                    request.opcode = WrOpcode::Send;
                    request.ud = pair.ah.as_ref().map(|ah| UdFields {
                        ah,
                        remote_qpn: remote.qpn,
                        remote_qkey: QKEY,
                    });
                }
                Operation::Read => {
                    request.opcode = WrOpcode::RdmaRead;
                    request.rdma = remote_fields;
                }
                Operation::Atomic | Operation::Mixed => {
                    request.opcode = WrOpcode::AtomicFetchAdd;
                    request.atomic = AtomicFields {
                        remote_addr: remote.addr + local.atomic_offset(),
                        compare_add: 1,
                        swap: 0,
                        rkey: remote.rkey,
                    };
                }
            }
            request
        })
        .collect();
    pair.qp
        .post_send(&requests)
        .map_err(|error| RemoteError::Protocol(format!("post_send: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_lines_round_trip() {
        let endpoint = Endpoint {
            qpn: 0x123,
            psn: 0xABCDEF,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2],
            mac: [2, 0x52, 0x4e, 0x49, 0x43, 2],
            rkey: 0x8000_0101,
            addr: 0x1_0000_0000,
            len: 65600,
        };
        let line = endpoint.line(3);
        assert_eq!(Endpoint::parse(&line, 3).unwrap(), endpoint);
        assert!(Endpoint::parse(&line, 2).is_err());
        assert!(Endpoint::parse("QP 0 1 2", 0).is_err());
    }
}
