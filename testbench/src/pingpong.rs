//! `rnic-bench send --peer pingpong`: the exchange and traffic of `ibv_rc_pingpong`
//! (rdma-core 44, libibverbs/examples/rc_pingpong.c and pingpong.c), so that an
//! unmodified `ibv_rc_pingpong` on another host pairs with rnic-bench on our NIC. Facts
//! from the source; see docs/guides/interop.md.
//!
//! # The exchange
//!
//! The server listens on TCP port 18515 (`-p`) on every address. Each side sends one
//! 52-byte message: `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the GID as 32 hex digits
//! (the 16 bytes in order), and a NUL. The client writes its message, reads the server's,
//! writes `"done\0"` and closes. The server reads the client's message, takes its QP to
//! RTS *before* answering, writes its message and reads the 5 bytes of "done". Nothing
//! else crosses the socket: size (`-s`, default 4096), iterations (`-n`, 1000) and path
//! MTU (`-m`, 1024) are not exchanged and must be given alike on both sides.
//!
//! # The traffic
//!
//! Both sides post receives for `size` bytes into their one buffer before the exchange.
//! The client SENDs the buffer; each side sends its next message once both its previous
//! SEND and a receive completed, so the server echoes what it received (it sends from the
//! buffer it received into). Both end after `iterations` SENDs and receives. RTR/RTS as
//! rc_pingpong: `max_dest_rd_atomic` 1, `min_rnr_timer` 12, `timeout` 14, retries 7/7,
//! `max_rd_atomic` 1, GRH hop limit 1, a random 24-bit PSN. Nothing marks the end, so
//! rnic-bench keeps its QP for 2 s after its last message: the peer may need the ACK of
//! its last SEND again (ours was lost) and would otherwise retry into the void.
//!
//! # Validation
//!
//! rc_pingpong's buffer starts as 0x7b bytes; with `-c` the client writes 0 at every page
//! start (`i / page_size % sizeof(char)` is always 0) and, at the end, prints "invalid
//! data in page N" for a page whose first byte is not 0 — it does not fail. rnic-bench
//! does the same with `--verify` and checks more: every message it receives must be
//! exactly that buffer (0x7b, 0 at each 4 KiB page start) and `byte_len` = size; a wrong
//! message is a failure. Against an ibv_rc_pingpong *client*, give it `-c`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rnic_verbs::{
    AccessFlags, Context, Gid, Mtu, QpCapabilities, QpInitAttributes, QpType, RecvWorkRequest, SendFlags,
    SendWorkRequest, Sge, WcStatus, WorkCompletion, WrOpcode,
};

use crate::bench::{BenchConfig, BenchReport, Operation};
use crate::remote::{self, RcPath, RemoteError};

/// Bytes of the address message (`sizeof "0000:000000:000000:" + 32 hex digits`).
pub const MESSAGE_LEN: usize = 52;
/// rc_pingpong's initial buffer byte.
pub const FILL: u8 = 0x7b;
/// rc_pingpong's page size for `-c` (the guest's `sysconf(_SC_PAGESIZE)`).
pub const PAGE: usize = 4096;
/// Work request IDs rc_pingpong uses (`PINGPONG_RECV_WRID`, `PINGPONG_SEND_WRID`).
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// Receives kept posted (rc_pingpong's `-r` default is 500).
const RX_DEPTH: u32 = 64;
/// How long the QP stays after the last message, on both sides. rc_pingpong has no final
/// handshake: if our ACK of the peer's last SEND is lost, the peer resends it after its ACK
/// timeout (67 ms), and an rdma_rxe peer, retrying for ever, would wait for an answer from
/// a QP that is gone (seen on the lossy link of scripts/rxe-interop).
const LINGER: Duration = Duration::from_secs(2);
/// How long the traffic may go without a completion.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a run with an ibv_rc_pingpong peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PingpongError {
    /// Bytes from the peer that do not parse.
    #[error("pingpong message: {0}")]
    Message(String),
    /// A setting rc_pingpong has no counterpart for.
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
    /// The ping-pong stalled.
    #[error("{0}")]
    Timeout(String),
}

type Result<T> = std::result::Result<T, PingpongError>;

/// One side's address (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial send PSN.
    pub psn: u32,
    /// GID (all zero when rc_pingpong runs without `-g`, which RoCE cannot use).
    pub gid: [u8; 16],
}

impl Address {
    /// The 52 bytes on the wire.
    pub fn encode(&self) -> [u8; MESSAGE_LEN] {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{gid}",
            self.lid,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF
        );
        let mut bytes = [0u8; MESSAGE_LEN];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        bytes
    }

    /// Parses the peer's 52 bytes as rc_pingpong's `sscanf("%x:%x:%x:%s")` and
    /// `wire_gid_to_gid`, but strictly: three hex numbers and 32 hex digits.
    ///
    /// # Errors
    /// [`PingpongError::Message`] for anything else.
    pub fn decode(bytes: &[u8; MESSAGE_LEN]) -> Result<Self> {
        let bad = || PingpongError::Message(format!("{:?}", String::from_utf8_lossy(bytes)));
        let end = bytes.iter().position(|&b| b == 0).ok_or_else(bad)?;
        let text = std::str::from_utf8(&bytes[..end]).map_err(|_| bad())?;
        let fields: Vec<&str> = text.split(':').collect();
        let hex = |field: &str, most: usize| {
            if field.is_empty() || field.len() > most || !field.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(field, 16).map_err(|_| bad())
        };
        if fields.len() != 4 || fields[3].len() != 32 {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = hex(&fields[3][2 * i..2 * i + 2], 2)? as u8;
        }
        Ok(Self {
            lid: hex(fields[0], 4)? as u16,
            qpn: hex(fields[1], 6)?,
            psn: hex(fields[2], 6)?,
            gid,
        })
    }
}

/// The client's exchange: write ours, read theirs, write "done", close.
///
/// # Errors
/// I/O or a message that does not parse.
pub fn exchange_as_client(mut stream: TcpStream, mine: &Address) -> Result<Address> {
    stream.set_read_timeout(Some(PROGRESS_TIMEOUT))?;
    stream.write_all(&mine.encode())?;
    let mut theirs = [0u8; MESSAGE_LEN];
    stream.read_exact(&mut theirs)?;
    stream.write_all(b"done\0")?;
    Address::decode(&theirs)
}

/// The server's exchange: read theirs, `connect` (the QP must be ready before the client
/// hears from us), write ours, read "done".
///
/// # Errors
/// I/O, a message that does not parse, a missing "done", or whatever `connect` returned.
pub fn exchange_as_server(
    mut stream: TcpStream,
    mine: &Address,
    connect: impl FnOnce(&Address) -> Result<()>,
) -> Result<Address> {
    stream.set_read_timeout(Some(PROGRESS_TIMEOUT))?;
    let mut theirs = [0u8; MESSAGE_LEN];
    stream.read_exact(&mut theirs)?;
    let theirs = Address::decode(&theirs)?;
    connect(&theirs)?;
    stream.write_all(&mine.encode())?;
    let mut done = [0u8; 5];
    stream.read_exact(&mut done)?;
    if &done != b"done\0" {
        return Err(PingpongError::Message(format!("expected done, got {done:?}")));
    }
    Ok(theirs)
}

/// A run against ibv_rc_pingpong.
#[derive(Debug, Clone)]
pub struct PingpongConfig {
    /// Size, iterations, MTU and `--verify` (operation `send`, one QP).
    pub bench: BenchConfig,
    /// Our GID table entry (rc_pingpong's `-g` picks theirs).
    pub gid_index: u8,
    /// The peer's MAC when its GID is not link-local.
    pub peer_mac: Option<[u8; 6]>,
}

/// Runs one side on the device named `device`: as server on `port`, or as client of `host`.
///
/// # Errors
/// Bad settings, the device, the exchange, or a ping-pong that stalls.
pub fn run(config: &PingpongConfig, device: &str, ipv4: Option<Ipv4Addr>, role: &remote::Role) -> Result<BenchReport> {
    check(config)?;
    let (stream, client) = match role {
        remote::Role::Server { port } => (TcpListener::bind((Ipv4Addr::UNSPECIFIED, *port))?.accept()?.0, false),
        remote::Role::Client { host, port } => (remote::connect_retrying(host, *port)?, true),
    };
    run_on(config, remote::open_context(device, ipv4)?, stream, client)
}

/// Runs one side on an opened device over a connected stream (tests use embedded NICs).
///
/// # Errors
/// As [`run`].
pub fn run_with_device(
    config: &PingpongConfig,
    device: Box<dyn rnic_verbs::DeviceAccess>,
    stream: TcpStream,
    client: bool,
) -> Result<BenchReport> {
    check(config)?;
    run_on(config, remote::open_context_on(device, None)?, stream, client)
}

fn check(config: &PingpongConfig) -> Result<()> {
    let bench = &config.bench;
    if bench.operation != Operation::Send || bench.queue_pairs != 1 {
        return Err(PingpongError::Config(
            "ibv_rc_pingpong moves SENDs on one QP: `send`, --qps 1".into(),
        ));
    }
    if bench.size == 0 || bench.size > 1 << 26 || bench.iterations == 0 {
        return Err(PingpongError::Config("size 1..=64 MiB, at least one iteration".into()));
    }
    Ok(())
}

/// The buffer rc_pingpong's client sends with `-c`.
pub fn validation_pattern(size: usize) -> Vec<u8> {
    let mut buffer = vec![FILL; size];
    for page in buffer.iter_mut().step_by(PAGE) {
        *page = 0;
    }
    buffer
}

fn run_on(config: &PingpongConfig, context: Context, stream: TcpStream, client: bool) -> Result<BenchReport> {
    let bench = &config.bench;
    let mtu = Mtu::from_bytes(bench.mtu).ok_or_else(|| PingpongError::Config(format!("MTU {}", bench.mtu)))?;
    let size = bench.size;
    let pd = context.alloc_pd()?;
    let mr = pd.register_provider_memory(size, AccessFlags::LOCAL_WRITE)?;
    mr.write(0, &vec![FILL; size])?;
    let cq = context.create_cq(2 * RX_DEPTH + 2, None, 0)?;
    let qp = pd.create_qp(&QpInitAttributes {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCapabilities {
            max_send_wr: 1,
            max_recv_wr: RX_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    })?;
    let sge = Sge::new(mr.addr(), size as u32, mr.lkey());
    let post_recv = || {
        qp.post_recv(&[RecvWorkRequest {
            wr_id: RECV_WRID,
            sg_list: std::slice::from_ref(&sge),
        }])
        .map_err(|error| PingpongError::Message(format!("post_recv: {error}")))
    };
    // rc_pingpong takes its QP to INIT before it posts receives.
    // RESET → INIT: receives may be posted from here on.
    qp.init_rc()?;
    let mut outstanding = 0u64;
    while outstanding < u64::from(RX_DEPTH).min(bench.iterations) {
        post_recv()?;
        outstanding += 1;
    }
    let mine = Address {
        lid: 0,
        qpn: qp.qp_num(),
        psn: std::process::id().wrapping_mul(0x9E37_79B9) & 0xFF_FFFF,
        gid: context.query_gid(1, u32::from(config.gid_index))?.raw(),
    };
    let connect = |theirs: &Address| -> Result<()> {
        let dgid = Gid(theirs.gid);
        let dmac = config.peer_mac.unwrap_or_default();
        if dmac == [0; 6] && dgid.link_local_mac().is_none() {
            return Err(PingpongError::Config(format!(
                "the peer's GID {:02x?} is not link-local: give --peer-mac (and -g on ibv_rc_pingpong)",
                theirs.gid
            )));
        }
        let path = RcPath {
            mtu,
            sgid_index: config.gid_index,
            hop_limit: 1,
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: 12,
            timeout: 14,
        };
        remote::rtr_rts_rc(&qp, mine.psn, theirs.qpn, theirs.psn, dgid, dmac, &path)?;
        Ok(())
    };
    if client {
        let theirs = exchange_as_client(stream, &mine)?;
        connect(&theirs)?;
    } else {
        exchange_as_server(stream, &mine, connect)?;
    }
    tracing::info!(client, qpn = mine.qpn, "ibv_rc_pingpong peer connected");

    let expected = validation_pattern(size);
    let mut report = remote::new_report(bench);
    report.operation = "ibv_rc_pingpong";
    let mut found = vec![0u8; size];
    let post_send = || {
        qp.post_send(&[SendWorkRequest {
            wr_id: SEND_WRID,
            opcode: WrOpcode::Send,
            sg_list: std::slice::from_ref(&sge),
            send_flags: SendFlags::SIGNALED,
            ..SendWorkRequest::default()
        }])
        .map_err(|error| PingpongError::Message(format!("post_send: {error}")))
    };
    let start = Instant::now();
    let (mut sent, mut received) = (0u64, 0u64);
    let mut pending_send = false;
    let mut pending_recv = true;
    if client {
        if bench.verify {
            mr.write(0, &expected)?;
        }
        post_send()?;
        pending_send = true;
    }
    let mut completions = [WorkCompletion::default(); 2];
    let mut last_progress = Instant::now();
    while sent < bench.iterations || received < bench.iterations {
        let got = cq.poll(&mut completions)?;
        if got == 0 {
            if last_progress.elapsed() > PROGRESS_TIMEOUT {
                return Err(PingpongError::Timeout(format!(
                    "no completion for {PROGRESS_TIMEOUT:?}: sent {sent}, received {received}"
                )));
            }
            std::thread::sleep(Duration::from_micros(10));
            continue;
        }
        last_progress = Instant::now();
        for wc in &completions[..got] {
            if wc.status != WcStatus::Success {
                return Err(PingpongError::Message(format!(
                    "completion {} failed: {:?}",
                    wc.wr_id, wc.status
                )));
            }
            match wc.wr_id {
                SEND_WRID => {
                    sent += 1;
                    pending_send = false;
                }
                RECV_WRID => {
                    received += 1;
                    outstanding -= 1;
                    pending_recv = false;
                    let mut good = wc.byte_len as usize == size;
                    if bench.verify {
                        mr.read(0, &mut found)?;
                        good &= found == expected;
                    }
                    if good {
                        report.messages_ok += 1;
                        report.bytes_verified += if bench.verify { size as u64 } else { 0 };
                    } else {
                        remote::fail(
                            &mut report,
                            format!("message {received}: {} bytes, not the -c pattern", wc.byte_len),
                        );
                    }
                    if outstanding <= 1 {
                        while outstanding < u64::from(RX_DEPTH) && received + outstanding < bench.iterations {
                            post_recv()?;
                            outstanding += 1;
                        }
                    }
                }
                other => return Err(PingpongError::Message(format!("unknown wr_id {other}"))),
            }
            if sent < bench.iterations && !pending_send && !pending_recv {
                post_send()?;
                pending_send = true;
                pending_recv = true;
            }
        }
    }
    report.wall_time_s = start.elapsed().as_secs_f64();
    // Nothing tells us when the peer is done: if our ACK of its last SEND was lost, it
    // re-sends that SEND and needs our QP to acknowledge the duplicate. Keep the QP a while.
    let linger = Instant::now();
    while linger.elapsed() < LINGER {
        let _ = cq.poll(&mut completions)?;
        std::thread::sleep(Duration::from_millis(10));
    }
    let bits = (size as u64 * bench.iterations * 2 * 8) as f64;
    report.bw_gbps = bits / report.wall_time_s.max(1e-9) / 1e9;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_rc_pingpongs_52_byte_text() {
        // What rc_pingpong prints for QPN 0x11, PSN 0xabcdef on fe80::5054:ff:fe12:3456.
        let wire = b"0000:000011:abcdef:fe80000000000000505400fffe123456\0";
        assert_eq!(wire.len(), MESSAGE_LEN);
        let address = Address::decode(wire).unwrap();
        assert_eq!(
            address,
            Address {
                lid: 0,
                qpn: 0x11,
                psn: 0xabcdef,
                gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56],
            }
        );
        assert_eq!(&address.encode(), wire);
    }

    #[test]
    fn broken_addresses_are_errors() {
        let good = *b"0000:000011:abcdef:fe80000000000000505400fffe123456\0";
        assert!(Address::decode(&[0; MESSAGE_LEN]).is_err());
        assert!(Address::decode(&[b'f'; MESSAGE_LEN]).is_err(), "no NUL");
        assert!(Address::decode(&[0xff; MESSAGE_LEN]).is_err());
        let mut short_gid = good;
        short_gid[50] = 0;
        assert!(Address::decode(&short_gid).is_err());
        let mut not_hex = good;
        not_hex[20] = b'g';
        assert!(Address::decode(&not_hex).is_err());
        for at in 0..MESSAGE_LEN {
            let mut bad = good;
            bad[at] = b':';
            let _ = Address::decode(&bad);
        }
    }

    #[test]
    fn the_validation_pattern_zeroes_page_starts() {
        let pattern = validation_pattern(10_000);
        assert_eq!(pattern.iter().filter(|&&b| b == 0).count(), 3);
        assert_eq!((pattern[0], pattern[4096], pattern[8192]), (0, 0, 0));
        assert!(pattern
            .iter()
            .enumerate()
            .all(|(i, &b)| b == if i % PAGE == 0 { 0 } else { FILL }));
    }
}
