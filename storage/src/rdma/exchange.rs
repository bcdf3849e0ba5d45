//! A connection manager across processes that carries what the CM would over TCP
//! instead of CM MADs on QP1, the way perftest and `rnic-bench --server/--client`
//! exchange QP numbers without rdma_cm: the passive side listens on TCP at the service's
//! own address and port, each NVMe queue is one TCP connection carrying one request and
//! one answer, and closing the TCP connection is the disconnect.
//!
//! # Protocol
//!
//! One line each, ASCII, fields separated by single spaces, GIDs as 32 hex digits, MACs as
//! `aa:bb:cc:dd:ee:ff`, private data as hex (`-` when empty):
//!
//! ```text
//! active → passive   REQ QPN PSN GID MAC RESPONDER_RESOURCES INITIATOR_DEPTH RETRY RNR_RETRY PRIVATE
//! passive → active   REP QPN PSN GID MAC RESPONDER_RESOURCES INITIATOR_DEPTH PRIVATE
//!                  | REJ PRIVATE
//! ```
//!
//! Until the RDMA CM is in the provider, this is how two processes of ours (each on its
//! own `rnic-emu serve`) connect; Linux peers need the real CM.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use rnic_verbs::{Context, Gid, QpAttributeMask, QpAttributes, QpState, QueuePair};

use super::connection::{
    rc_connection, AcceptParams, ConnectParams, ConnectResult, Connection, ConnectionError, Connector, End,
    Established, IncomingRequest, Listener, PendingConnect, RcPathConfig, ServiceAddress,
};

/// How long one side waits for the other's line.
const LINE_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest line accepted (private data of a REP is at most 196 bytes: 392 hex digits).
const MAX_LINE: usize = 1024;

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "-".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text == "-" {
        return Some(Vec::new());
    }
    if !text.len().is_multiple_of(2) || text.len() > 2 * MAX_LINE {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

fn format_end(end: &End) -> String {
    let mac: Vec<String> = end.mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("{} {} {} {}", end.qpn, end.psn, hex(&end.gid.raw()), mac.join(":"))
}

fn parse_end(fields: &[&str]) -> Option<End> {
    let gid: [u8; 16] = unhex(fields.get(2)?)?.try_into().ok()?;
    let mac: Vec<u8> = fields
        .get(3)?
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect::<Option<_>>()?;
    Some(End {
        qpn: fields.first()?.parse().ok()?,
        psn: fields.get(1)?.parse::<u32>().ok()? & 0xFF_FFFF,
        gid: Gid(gid),
        mac: mac.try_into().ok()?,
    })
}

/// A request line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestLine {
    end: End,
    responder_resources: u8,
    initiator_depth: u8,
    retry: u8,
    rnr_retry: u8,
    private_data: Vec<u8>,
}

impl RequestLine {
    fn format(&self) -> String {
        format!(
            "REQ {} {} {} {} {} {}\n",
            format_end(&self.end),
            self.responder_resources,
            self.initiator_depth,
            self.retry,
            self.rnr_retry,
            hex(&self.private_data)
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 10 || fields[0] != "REQ" {
            return None;
        }
        Some(Self {
            end: parse_end(&fields[1..5])?,
            responder_resources: fields[5].parse().ok()?,
            initiator_depth: fields[6].parse().ok()?,
            retry: fields[7].parse::<u8>().ok()?.min(7),
            rnr_retry: fields[8].parse::<u8>().ok()?.min(7),
            private_data: unhex(fields[9])?,
        })
    }
}

/// An answer line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AnswerLine {
    Accept {
        end: End,
        responder_resources: u8,
        initiator_depth: u8,
        private_data: Vec<u8>,
    },
    Reject(Vec<u8>),
}

impl AnswerLine {
    fn format(&self) -> String {
        match self {
            AnswerLine::Accept {
                end,
                responder_resources,
                initiator_depth,
                private_data,
            } => format!(
                "REP {} {responder_resources} {initiator_depth} {}\n",
                format_end(end),
                hex(private_data)
            ),
            AnswerLine::Reject(private_data) => format!("REJ {}\n", hex(private_data)),
        }
    }

    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match *fields.first()? {
            "REP" if fields.len() == 8 => Some(AnswerLine::Accept {
                end: parse_end(&fields[1..5])?,
                responder_resources: fields[5].parse().ok()?,
                initiator_depth: fields[6].parse().ok()?,
                private_data: unhex(fields[7])?,
            }),
            "REJ" if fields.len() == 2 => Some(AnswerLine::Reject(unhex(fields[1])?)),
            _ => None,
        }
    }
}

/// The TCP-exchange connection manager of one process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExchangeCm {
    config: RcPathConfig,
}

impl ExchangeCm {
    /// A connection manager giving every QP `config`.
    pub fn new(config: RcPathConfig) -> Self {
        Self { config }
    }

    /// Listens on TCP at `address`.
    ///
    /// # Errors
    /// [`ConnectionError::AddressInUse`] when the TCP port is taken; other bind errors
    /// as [`ConnectionError::Invalid`].
    pub fn listen(&self, address: ServiceAddress) -> Result<ExchangeListener, ConnectionError> {
        let listener = TcpListener::bind(SocketAddr::from((address.ip, address.port))).map_err(|e| {
            if e.kind() == ErrorKind::AddrInUse {
                ConnectionError::AddressInUse(address)
            } else {
                ConnectionError::Invalid(format!("listening on {address}: {e}"))
            }
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ConnectionError::Invalid(e.to_string()))?;
        // Port 0 asks the system for one: report the one it gave.
        let port = listener.local_addr().map_or(address.port, |a| a.port());
        let address = ServiceAddress::new(address.ip, port);
        Ok(ExchangeListener {
            config: self.config,
            address,
            listener,
            psn: psn_seed(address),
        })
    }

    /// A connector for the active side.
    pub fn connector(&self) -> ExchangeConnector {
        ExchangeConnector {
            config: self.config,
            psn: psn_seed(ServiceAddress::new(
                std::net::Ipv4Addr::UNSPECIFIED,
                std::process::id() as u16,
            )),
        }
    }
}

fn psn_seed(address: ServiceAddress) -> u32 {
    (u32::from(address.ip) ^ u32::from(address.port) << 8 ^ std::process::id().rotate_left(13)) & 0xFF_FFFF
}

fn next_psn(psn: &mut u32) -> u32 {
    *psn = psn.wrapping_mul(1_103_515_245).wrapping_add(12_345) & 0xFF_FFFF;
    *psn
}

/// The passive side: a TCP listener at the service's address.
pub struct ExchangeListener {
    config: RcPathConfig,
    address: ServiceAddress,
    listener: TcpListener,
    psn: u32,
}

impl Listener for ExchangeListener {
    fn address(&self) -> ServiceAddress {
        self.address
    }

    fn poll_request(&mut self) -> Option<Box<dyn IncomingRequest>> {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(_) => return None,
            };
            // A peer that cannot produce a well-formed request in time is dropped.
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(LINE_TIMEOUT));
            let _ = stream.set_nodelay(true);
            let mut line = String::new();
            let read = BufReader::new((&stream).take(MAX_LINE as u64)).read_line(&mut line);
            let Some(request) = read.ok().and_then(|_| RequestLine::parse(&line)) else {
                tracing::warn!(target: rnic_diag::TARGET, %peer, "exchange: a malformed connection request");
                continue;
            };
            return Some(Box::new(ExchangeRequest {
                config: self.config,
                stream,
                peer,
                psn: next_psn(&mut self.psn),
                request,
            }));
        }
    }
}

struct ExchangeRequest {
    config: RcPathConfig,
    stream: TcpStream,
    peer: SocketAddr,
    psn: u32,
    request: RequestLine,
}

impl IncomingRequest for ExchangeRequest {
    fn private_data(&self) -> &[u8] {
        &self.request.private_data
    }

    fn responder_resources(&self) -> u8 {
        self.request.responder_resources
    }

    fn initiator_depth(&self) -> u8 {
        self.request.initiator_depth
    }

    fn peer(&self) -> String {
        format!("{} QP {}", self.peer, self.request.end.qpn)
    }

    fn accept(
        mut self: Box<Self>,
        context: &Context,
        qp: &QueuePair,
        params: &AcceptParams,
    ) -> Result<Box<dyn Connection>, ConnectionError> {
        let own = End::of(context, qp, self.psn)?;
        let connection = rc_connection(
            &self.config,
            &self.request.end,
            own.psn,
            params.responder_resources,
            params.initiator_depth,
            params.rnr_retry_count,
        );
        if let Err(e) = qp.connect_rc(&connection) {
            let _ = self
                .stream
                .write_all(AnswerLine::Reject(Vec::new()).format().as_bytes());
            return Err(ConnectionError::Verbs(e.to_string()));
        }
        let answer = AnswerLine::Accept {
            end: own,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            private_data: params.private_data.clone(),
        };
        self.stream
            .write_all(answer.format().as_bytes())
            .map_err(|e| ConnectionError::Invalid(format!("answering {}: {e}", self.peer)))?;
        let _ = self.stream.set_nonblocking(true);
        Ok(Box::new(ExchangeConnection { stream: self.stream }))
    }

    fn reject(mut self: Box<Self>, private_data: &[u8]) {
        let _ = self
            .stream
            .write_all(AnswerLine::Reject(private_data.to_vec()).format().as_bytes());
    }
}

/// The active side.
pub struct ExchangeConnector {
    config: RcPathConfig,
    psn: u32,
}

impl Connector for ExchangeConnector {
    fn connect(
        &mut self,
        context: &Context,
        qp: &QueuePair,
        params: &ConnectParams,
    ) -> Result<Box<dyn PendingConnect>, ConnectionError> {
        let address = SocketAddr::from((params.destination.ip, params.destination.port));
        let mut stream = TcpStream::connect_timeout(&address, LINE_TIMEOUT).map_err(|e| match e.kind() {
            ErrorKind::ConnectionRefused => ConnectionError::Unreachable(params.destination),
            ErrorKind::TimedOut | ErrorKind::WouldBlock => ConnectionError::TimedOut(params.destination),
            _ => ConnectionError::Invalid(format!("connecting to {address}: {e}")),
        })?;
        let _ = stream.set_nodelay(true);
        qp.init_rc().map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        let end = End::of(context, qp, next_psn(&mut self.psn))?;
        let request = RequestLine {
            end,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            retry: params.retry_count,
            rnr_retry: params.rnr_retry_count,
            private_data: params.private_data.clone(),
        };
        stream
            .write_all(request.format().as_bytes())
            .map_err(|e| ConnectionError::Invalid(format!("requesting {address}: {e}")))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| ConnectionError::Invalid(e.to_string()))?;
        Ok(Box::new(ExchangePending {
            config: self.config,
            stream: Some(stream),
            line: Vec::new(),
            request,
            destination: params.destination,
        }))
    }
}

struct ExchangePending {
    config: RcPathConfig,
    stream: Option<TcpStream>,
    line: Vec<u8>,
    request: RequestLine,
    destination: ServiceAddress,
}

impl PendingConnect for ExchangePending {
    fn poll(&mut self, qp: &QueuePair) -> Option<ConnectResult> {
        let stream = self.stream.as_mut()?;
        let mut byte = [0u8; 256];
        loop {
            match stream.read(&mut byte) {
                Ok(0) => {
                    self.stream = None;
                    return Some(Err(ConnectionError::Unreachable(self.destination)));
                }
                Ok(n) => {
                    self.line.extend_from_slice(&byte[..n]);
                    if self.line.len() > MAX_LINE {
                        self.stream = None;
                        return Some(Err(ConnectionError::Invalid("an answer line too long".into())));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.stream = None;
                    return Some(Err(ConnectionError::Invalid(e.to_string())));
                }
            }
        }
        let end = self.line.iter().position(|b| *b == b'\n')?;
        let line = String::from_utf8_lossy(&self.line[..end]).into_owned();
        let stream = self.stream.take().expect("checked above");
        Some(match AnswerLine::parse(&line) {
            Some(AnswerLine::Reject(private_data)) => Err(ConnectionError::Rejected { private_data }),
            Some(AnswerLine::Accept {
                end,
                responder_resources,
                initiator_depth,
                private_data,
            }) => {
                let connection = rc_connection(
                    &self.config,
                    &end,
                    self.request.end.psn,
                    self.request.responder_resources,
                    self.request.initiator_depth,
                    self.request.rnr_retry,
                );
                let connection = rnic_verbs::RcConnection {
                    retry_cnt: self.request.retry,
                    ..connection
                };
                match qp.rtr_rts_rc(&connection) {
                    Ok(()) => Ok((
                        Established {
                            private_data,
                            responder_resources,
                            initiator_depth,
                        },
                        Box::new(ExchangeConnection { stream }) as Box<dyn Connection>,
                    )),
                    Err(e) => Err(ConnectionError::Verbs(e.to_string())),
                }
            }
            None => Err(ConnectionError::Invalid(format!("a malformed answer {line:?}"))),
        })
    }
}

struct ExchangeConnection {
    stream: TcpStream,
}

impl Connection for ExchangeConnection {
    fn is_disconnected(&mut self) -> bool {
        let mut byte = [0u8; 64];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }

    fn disconnect(&mut self, qp: &QueuePair) {
        let _ = qp.modify(
            &QpAttributes {
                qp_state: QpState::Err,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE,
        );
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end() -> End {
        End {
            qpn: 0x1234,
            psn: 0xABCDE,
            gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 2]),
            mac: [2, 0x52, 0x4e, 0x49, 0x43, 1],
        }
    }

    #[test]
    fn lines_round_trip() {
        let request = RequestLine {
            end: end(),
            responder_resources: 16,
            initiator_depth: 0,
            retry: 7,
            rnr_retry: 7,
            private_data: vec![0, 0, 1, 0, 128, 0, 127, 0],
        };
        let line = request.format();
        assert_eq!(
            line,
            "REQ 4660 703710 00000000000000000000ffff7f000002 02:52:4e:49:43:01 16 0 7 7 0000010080007f00\n"
        );
        assert_eq!(RequestLine::parse(&line), Some(request));
        let accept = AnswerLine::Accept {
            end: end(),
            responder_resources: 0,
            initiator_depth: 16,
            private_data: Vec::new(),
        };
        assert_eq!(AnswerLine::parse(&accept.format()), Some(accept));
        let reject = AnswerLine::Reject(vec![0, 0, 6, 0]);
        assert_eq!(reject.format(), "REJ 00000600\n");
        assert_eq!(AnswerLine::parse(&reject.format()), Some(reject));
    }

    #[test]
    fn malformed_lines_are_refused() {
        for line in [
            "",
            "REQ",
            "REQ 1 2 00 02:00:00:00:00:00 1 1 7 7 -",
            "REQ x 2 00000000000000000000ffff7f000002 02:00:00:00:00:00 1 1 7 7 -",
            "REQ 1 2 00000000000000000000ffff7f000002 02:00:00:00:00 1 1 7 7 -",
            "REQ 1 2 00000000000000000000ffff7f000002 02:00:00:00:00:00 1 1 7 7 0g",
            "REP 1 2 3",
            "REJ 1 2",
            "HELLO",
        ] {
            assert_eq!(RequestLine::parse(line), None, "{line}");
            assert!(AnswerLine::parse(line).is_none(), "{line}");
        }
    }
}
