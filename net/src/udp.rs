//! `--net udp:IP`: RoCEv2 over a kernel UDP socket bound to `IP:4791`, unprivileged.
//!
//! Several emulators on one host use different loopback addresses (127.0.0.1, 127.0.0.2,
//! ...); the device's GIDs must be those addresses (IPv4-mapped, or IPv6).
//!
//! **Transmit.** The device's frame is parsed ([`wire::parse_frame`]; frames that are not
//! valid RoCEv2 are dropped and counted) and its UDP payload (BTH ... ICRC) is sent to
//! `destination IP:4791`, from a socket bound to `IP:source port of the frame` (one socket
//! per flow, opened on first use), so the receiver sees the frame's UDP source port. A
//! frame the device left its ICRC to the link for ([`NetBackend::send_owned`], as the
//! server sends without `--pcap`) is not checked: its ICRC is computed once, here, for the
//! headers it travels with.
//!
//! **Receive.** A datagram from `peer:port` becomes a whole Ethernet/IP/UDP frame for the
//! device: destination MAC = ours, source MAC = the MAC our own device last sent to that
//! peer IP (or a stand-in, `02:00` + the last four address bytes), IP source = peer,
//! destination = `IP`, UDP ports `port → 4791`, UDP checksum 0. The ICRC covers the IP
//! and UDP headers except the fields it masks (roce-wire §1.6), so the rebuilt headers must
//! equal the sender's in every covered field:
//!
//! * IPv6: exact. Traffic class, flow label and hop limit are masked; addresses, payload
//!   length, next header and ports are what the kernel carried.
//! * IPv4: the kernel picks the **identification** and the receiver cannot see it, nor
//!   the DF flag. Rule: *the ICRC of a frame sent over this backend is computed with
//!   identification 0 and DF set*, and the receiver rebuilds identification 0 with DF. The
//!   sender re-computes the ICRC when the device's frame differs (the device numbers its
//!   IPv4 packets, as rxe does). So rnic ↔ rnic over `udp:` works, but a third party
//!   capturing the kernel's IPv4 packets (tshark, rxe) sees another identification and a
//!   "bad" ICRC; IPv4 frames are ICRC-exact to others only on an Ethernet backend.
//!
//! The same re-computation covers a flow whose source port could not be bound (another
//! program holds it): the datagram then leaves from port 4791 and its ICRC is computed
//! for that port.
//!
//! Lost: ECN (masked by the ICRC; the kernel's TOS is not read back), the Ethernet source
//! MAC a peer really used, VLAN tags.
//!
//! **Batches, buffers, no loss of our own making.** Datagrams are received with
//! `recvmmsg`, up to [`RECEIVE_BATCH`] per call, and handed to the device one by one.
//! With [`NetBackend::set_send_batching`] on (the vfio-user server turns it on) sends are
//! held until [`NetBackend::flush`] and go out with `sendmmsg`, one call per flow and
//! burst; a run of datagrams of one length for one destination (a multi-packet message)
//! is one message of that call, which the kernel cuts into the datagrams (UDP generic
//! segmentation offload), so its stack is traversed once per run, not once per packet.
//! The bound socket receives such runs whole where the kernel can (`UDP_GRO`), and the
//! backend hands their datagrams to the device one by one. Both sockets' buffers are sized
//! for a whole window of 4 KiB packets ([`RECEIVE_BUFFER_BYTES`], [`SEND_BUFFER_BYTES`]).
//! When the kernel still refuses a datagram for want of send-buffer room, the backend
//! waits until the socket drains ([`NetStats::tx_stalls`], at most [`SEND_STALL_LIMIT`] per
//! datagram) instead of dropping it: RoCE expects a lossless link, and a loss the host
//! made up would cost the transport a retransmission timeout. A datagram longer than
//! [`MAX_DATAGRAM_BYTES`] cannot be RoCEv2 at any path MTU and is dropped as malformed.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use rnic_hw_model::wire::{
    self, bth, icrc, ipv6, udp, EthernetRepr, Icrc, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCE_V2_UDP_PORT,
};

use super::{NetBackend, NetStats};

/// Most per-flow source-port sockets kept open; later flows send from port 4791 (with
/// their ICRC re-computed for it), so descriptors stay bounded.
pub const MAX_FLOW_SOCKETS: usize = 256;

/// The receive buffer asked of the kernel for the bound socket, in bytes (granted in full as
/// root; otherwise capped at `net.core.rmem_max`).
pub const RECEIVE_BUFFER_BYTES: usize = 32 << 20;

/// The send buffer asked of the kernel for every socket, in bytes (granted in full as root;
/// otherwise capped at `net.core.wmem_max`): a batch of [`SEND_BATCH`] datagrams of 4 KiB
/// fits many times over.
pub const SEND_BUFFER_BYTES: usize = 4 << 20;

/// Datagrams received per system call at most.
pub const RECEIVE_BATCH: usize = 32;

/// The longest datagram accepted, in bytes: more than the longest RoCEv2 datagram at path
/// MTU 4096 (BTH, RETH or AtomicETH, ImmDt, payload, ICRC: under 4 200 bytes).
pub const MAX_DATAGRAM_BYTES: usize = 9216;

/// Bytes of room per received entry: a run of datagrams the kernel joined (`UDP_GRO`)
/// fits one IP packet.
pub const RECEIVE_SLOT: usize = 65_536;

/// Datagrams held back for one `sendmmsg` at most (with send batching on).
pub const SEND_BATCH: usize = 64;

/// How long a datagram the kernel refused for want of send-buffer room waits for room
/// before it is given up as lost (counted in [`NetStats::tx_errors`]).
pub const SEND_STALL_LIMIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Most peers whose MAC address is remembered.
const MAX_PEERS: usize = 4096;

/// Most malformed datagrams skipped in one [`NetBackend::receive`] call, so a flood of
/// garbage cannot hold the server loop.
const MALFORMED_PER_CALL: usize = 64;

/// BTH + ICRC: the shortest RoCEv2 UDP payload.
const MIN_DATAGRAM: usize = bth::HEADER_LEN + icrc::ICRC_LEN;

/// TTL / hop limit written into rebuilt headers (masked by the ICRC; any value works).
const REBUILT_HOP_LIMIT: u8 = 64;

/// A datagram held back for [`NetBackend::flush`]: bytes `start..end` of the frame the
/// device sent (BTH ... ICRC, the ICRC already right for the headers it travels with).
#[derive(Debug)]
struct PendingDatagram {
    frame: Vec<u8>,
    start: usize,
    end: usize,
    /// The UDP source port the frame asked for (its flow's socket).
    port: u16,
    to: SocketAddr,
}

impl PendingDatagram {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// The UDP backend.
#[derive(Debug)]
pub struct UdpBackend {
    local: IpAddr,
    mac: [u8; 6],
    /// Bound to `local:4791`: every datagram for the device arrives here.
    socket: UdpSocket,
    /// Per UDP source port: the socket bound to `local:port`, or `None` if it could not
    /// be bound (then the main socket sends).
    flows: HashMap<u16, Option<UdpSocket>>,
    /// Destination MAC of our last frame to each peer IP: the source MAC of its frames.
    peer_macs: HashMap<IpAddr, [u8; 6]>,
    /// Datagrams waiting for [`NetBackend::flush`], each in the frame it came in.
    pending: Vec<PendingDatagram>,
    /// Frame buffers already sent, for [`NetBackend::send_owned`] to hand back.
    spares: Vec<Vec<u8>>,
    batching: bool,
    /// Whether runs of datagrams go as one message the kernel cuts (`UDP_SEGMENT`); off
    /// for good once the kernel refuses it.
    segmentation: bool,
    /// The last `recvmmsg` batch and the next datagram of it to hand out.
    rx_batch: rnic_os::DatagramBatch,
    rx_next: usize,
    /// Where the next datagram starts inside entry `rx_next` (a run the kernel joined).
    rx_offset: usize,
    stats: NetStats,
}

impl UdpBackend {
    /// Binds `local:4791` (non-blocking) for a device whose MAC address is `mac`.
    pub fn bind(local: IpAddr, mac: [u8; 6]) -> io::Result<Self> {
        let socket = UdpSocket::bind((local, ROCE_V2_UDP_PORT)).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("cannot bind UDP {}: {error}", SocketAddr::new(local, ROCE_V2_UDP_PORT)),
            )
        })?;
        socket.set_nonblocking(true)?;
        // The kernel's default (~208 KiB) holds fewer datagrams than one QP may have in
        // flight (512 PSNs of up to 4 KiB); a burst that overflows it is lost whole and
        // costs a go-back-N. Hardware has the link's buffering; this is ours.
        let receive_buffer = rnic_os::set_receive_buffer(socket.as_fd(), RECEIVE_BUFFER_BYTES)?;
        let send_buffer = rnic_os::set_send_buffer(socket.as_fd(), SEND_BUFFER_BYTES)?;
        // Runs a peer had the kernel cut arrive whole: one queued entry, not one per
        // datagram. Without it (an old kernel) they arrive cut, which works as well.
        if let Err(error) = rnic_os::enable_receive_coalescing(socket.as_fd()) {
            tracing::debug!(target: "rnic_emu::net", %error, "UDP_GRO refused; datagrams arrive one by one");
        }
        tracing::info!(target: "rnic_emu::net", local = %socket.local_addr()?, receive_buffer, send_buffer, "udp backend bound");
        Ok(Self {
            local,
            mac,
            socket,
            flows: HashMap::new(),
            peer_macs: HashMap::new(),
            pending: Vec::with_capacity(SEND_BATCH),
            spares: Vec::with_capacity(SEND_BATCH),
            batching: false,
            segmentation: true,
            rx_batch: rnic_os::DatagramBatch::new(RECEIVE_BATCH, RECEIVE_SLOT),
            rx_next: 0,
            rx_offset: 0,
            stats: NetStats::default(),
        })
    }

    /// The address the backend is bound to.
    pub fn local_address(&self) -> IpAddr {
        self.local
    }

    /// The stand-in MAC address of a peer we never sent to: `02:00` and the address's last
    /// four bytes (locally administered, unicast, deterministic).
    pub fn stand_in_mac(peer: IpAddr) -> [u8; 6] {
        let last = match peer {
            IpAddr::V4(v4) => v4.octets(),
            IpAddr::V6(v6) => {
                let o = v6.octets();
                [o[12], o[13], o[14], o[15]]
            }
        };
        [0x02, 0x00, last[0], last[1], last[2], last[3]]
    }

    /// The socket for UDP source port `port` and the port it really sends from.
    fn flow_socket(&mut self, port: u16) -> (&UdpSocket, u16) {
        if !self.flows.contains_key(&port) && self.flows.len() < MAX_FLOW_SOCKETS {
            let socket = UdpSocket::bind((self.local, port)).and_then(|s| {
                s.set_nonblocking(true)?;
                rnic_os::set_send_buffer(s.as_fd(), SEND_BUFFER_BYTES)?;
                Ok(s)
            });
            let socket = match socket {
                Ok(socket) => Some(socket),
                Err(error) => {
                    tracing::debug!(target: "rnic_emu::net", port, %error,
                        "cannot bind the flow's source port; sending from 4791 with the ICRC re-computed");
                    None
                }
            };
            self.flows.insert(port, socket);
        }
        match self.flows.get(&port) {
            Some(Some(socket)) => (socket, port),
            _ => (&self.socket, ROCE_V2_UDP_PORT),
        }
    }

    /// Parses the device's frame and queues its UDP payload (BTH ... ICRC) for
    /// [`NetBackend::flush`], in the frame's own buffer. The ICRC is computed here, once,
    /// when the device left it to the link ([`Icrc::Offloaded`]) or when the headers the
    /// datagram really travels with differ from the frame's (see the module documentation);
    /// otherwise the frame's own, checked by the parse, goes out. Returns a buffer for the
    /// caller to reuse (a spare of the same capacity once a batch has been sent).
    fn queue_datagram(&mut self, mut frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        let parsed = match wire::parse_frame_with(&frame, icrc) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.stats.tx_dropped += 1;
                tracing::debug!(target: "rnic_emu::net", %error, "transmitted frame is not valid RoCEv2; dropped");
                return frame;
            }
        };
        let repr = parsed.repr;
        let (_, destination) = ip_addresses(&repr.ip);
        if destination.is_ipv4() != self.local.is_ipv4() {
            self.stats.tx_dropped += 1;
            tracing::debug!(target: "rnic_emu::net", %destination, local = %self.local,
                "destination of another IP version than the backend; dropped");
            return frame;
        }
        // The frame's extent is the UDP length, not the buffer (Ethernet padding).
        let start = repr.ethernet.header_len() + repr.ip.header_len() + udp::HEADER_LEN;
        let end = wire::frame_length(&repr, parsed.payload.len());
        if self.peer_macs.len() < MAX_PEERS || self.peer_macs.contains_key(&destination) {
            self.peer_macs.insert(destination, repr.ethernet.destination);
        }
        let wanted_port = repr.udp_source_port;
        let (_, port) = self.flow_socket(wanted_port);
        // The headers the receiver rebuilds and checks the ICRC against.
        let (sent_ip, exact) = match repr.ip {
            IpRepr::V4(mut v4) => {
                let exact = v4.identification == 0 && v4.dont_fragment && port == wanted_port;
                v4.identification = 0;
                v4.dont_fragment = true;
                (IpRepr::V4(v4), exact)
            }
            IpRepr::V6(v6) => (IpRepr::V6(v6), port == wanted_port),
        };
        let capacity = frame.capacity();
        if icrc == Icrc::Offloaded || !exact {
            let datagram = &mut frame[start..end];
            let value = datagram_icrc(&sent_ip, port, datagram);
            let at = datagram.len() - icrc::ICRC_LEN;
            datagram[at..].copy_from_slice(&icrc::to_wire(value));
        }
        self.pending.push(PendingDatagram {
            frame,
            start,
            end,
            port: wanted_port,
            to: SocketAddr::new(destination, ROCE_V2_UDP_PORT),
        });
        if !self.batching || self.pending.len() >= SEND_BATCH {
            self.send_pending();
        }
        // Until the first batch is sent, a new buffer like the one kept.
        self.spares.pop().unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// Keeps `buffer` for reuse, up to a batch's worth.
    fn keep_spare(&mut self, buffer: Vec<u8>) {
        if self.spares.len() < 2 * SEND_BATCH && buffer.capacity() > 0 {
            self.spares.push(buffer);
        }
    }

    /// Hands the held-back datagrams to the kernel, one `sendmmsg` per run of datagrams of
    /// the same flow. Consecutive datagrams for the same destination of one length (the
    /// last may be shorter: the sixteen packets of a 64 KiB message but the first) go as
    /// one message the kernel cuts ([`rnic_os::send_segmented`]), so its stack is
    /// traversed once per run instead of once per datagram; a kernel or route that
    /// refuses that turns it off for good. A datagram the kernel refuses for want of room
    /// waits for the socket to drain (at most [`SEND_STALL_LIMIT`]); other errors lose that
    /// message alone.
    fn send_pending(&mut self) {
        let Self {
            pending,
            flows,
            socket: main_socket,
            stats,
            segmentation,
            ..
        } = self;
        // The pieces of every datagram, in order; a message is a run of them.
        let parts: Vec<IoSlice<'_>> = pending
            .iter()
            .map(|datagram| IoSlice::new(&datagram.frame[datagram.start..datagram.end]))
            .collect();
        let mut messages: Vec<rnic_os::SegmentedDatagrams<'_>> = Vec::with_capacity(rnic_os::MAX_DATAGRAM_BATCH);
        // The datagrams in each message, and the index of the first.
        let mut runs: Vec<(usize, usize)> = Vec::with_capacity(rnic_os::MAX_DATAGRAM_BATCH);
        let mut next = 0;
        while next < pending.len() {
            let port = pending[next].port;
            // The socket flow_socket chose for the flow when the datagram was queued.
            let socket = match flows.get(&port) {
                Some(Some(socket)) => socket,
                _ => &*main_socket,
            };
            messages.clear();
            runs.clear();
            let mut index = next;
            while index < pending.len() && pending[index].port == port && messages.len() < rnic_os::MAX_DATAGRAM_BATCH {
                let to = pending[index].to;
                let segment = pending[index].len();
                let (mut total, mut count) = (segment, 1);
                if *segmentation && segment <= usize::from(u16::MAX) {
                    while index + count < pending.len() && count < rnic_os::MAX_SEGMENTS {
                        let following = &pending[index + count];
                        let length = following.len();
                        if following.port != port
                            || following.to != to
                            || length > segment
                            || total + length > rnic_os::MAX_SEGMENTED_BYTES
                        {
                            break;
                        }
                        total += length;
                        count += 1;
                        if length < segment {
                            break;
                        }
                    }
                }
                messages.push(rnic_os::SegmentedDatagrams {
                    parts: &parts[index..index + count],
                    to,
                    segment: (count > 1).then_some(segment as u16),
                });
                runs.push((index, count));
                index += count;
            }
            let mut sent = 0;
            while sent < messages.len() {
                match rnic_os::send_segmented(socket.as_fd(), &messages[sent..]) {
                    Ok(0) => break,
                    Ok(taken) => {
                        let datagrams: usize = runs[sent..sent + taken].iter().map(|&(_, count)| count).sum();
                        stats.frames_sent += datagrams as u64;
                        sent += taken;
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        stats.tx_stalls += 1;
                        if !matches!(rnic_os::wait_writable(socket.as_fd(), SEND_STALL_LIMIT), Ok(true)) {
                            stats.tx_errors += runs[sent].1 as u64;
                            tracing::debug!(target: "rnic_emu::net", "UDP send buffer stayed full; frame lost");
                            sent += 1;
                        }
                    }
                    Err(error) if messages[sent].segment.is_some() => {
                        // Not for want of room: this kernel or route does not cut datagrams
                        // (an old kernel, a device without checksum offload). Its datagrams,
                        // and all later ones, go one per message.
                        *segmentation = false;
                        tracing::info!(target: "rnic_emu::net", %error,
                            "the kernel refused UDP segmentation; one datagram per message from now on");
                        index = runs[sent].0;
                        break;
                    }
                    Err(error) => {
                        // The datagram at `sent` is refused (unreachable, ...): it is lost,
                        // as on a wire; the rest still go.
                        stats.tx_errors += runs[sent].1 as u64;
                        tracing::debug!(target: "rnic_emu::net", destination = %messages[sent].to, %error, "UDP send failed; frame lost");
                        sent += 1;
                    }
                }
            }
            next = index;
        }
        drop(parts);
        while let Some(datagram) = self.pending.pop() {
            self.keep_spare(datagram.frame);
        }
    }
}

/// The ICRC of `datagram` (BTH ... ICRC) as carried in `ip` with UDP source port `port`.
fn datagram_icrc(ip: &IpRepr, port: u16, datagram: &[u8]) -> u32 {
    let mut prefix = [0u8; ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN];
    let ip_len = ip.header_len();
    ip.emit(&mut prefix, udp::HEADER_LEN + datagram.len());
    UdpRepr {
        source_port: port,
        destination_port: ROCE_V2_UDP_PORT,
    }
    .emit(
        &mut udp::Packet::new_unchecked(&mut prefix[ip_len..ip_len + udp::HEADER_LEN]),
        datagram.len(),
    );
    let headers = ip_len + udp::HEADER_LEN;
    prefix[headers..headers + bth::HEADER_LEN].copy_from_slice(&datagram[..bth::HEADER_LEN]);
    let mut hasher = icrc::IcrcHasher::new(&prefix[..headers + bth::HEADER_LEN]);
    hasher.update(&datagram[bth::HEADER_LEN..datagram.len() - icrc::ICRC_LEN]);
    hasher.finalize()
}

/// The IP header a receiver rebuilds for a datagram from `source` to `destination`
/// (the IPv4 rule of the module documentation: identification 0, DF).
pub fn rebuilt_ip(source: IpAddr, destination: IpAddr) -> Option<IpRepr> {
    match (source, destination) {
        (IpAddr::V4(source), IpAddr::V4(destination)) => Some(IpRepr::V4(Ipv4Repr {
            source: source.octets(),
            destination: destination.octets(),
            dscp: 0,
            ecn: 0,
            ttl: REBUILT_HOP_LIMIT,
            identification: 0,
            dont_fragment: true,
        })),
        (IpAddr::V6(source), IpAddr::V6(destination)) => Some(IpRepr::V6(Ipv6Repr {
            source: source.octets(),
            destination: destination.octets(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: REBUILT_HOP_LIMIT,
        })),
        _ => None,
    }
}

fn ip_addresses(ip: &IpRepr) -> (IpAddr, IpAddr) {
    match ip {
        IpRepr::V4(r) => (Ipv4Addr::from(r.source).into(), Ipv4Addr::from(r.destination).into()),
        IpRepr::V6(r) => (Ipv6Addr::from(r.source).into(), Ipv6Addr::from(r.destination).into()),
    }
}

impl NetBackend for UdpBackend {
    fn describe(&self) -> String {
        format!("udp:{}", SocketAddr::new(self.local, ROCE_V2_UDP_PORT))
    }

    /// The frame is copied into a spare buffer and queued as [`NetBackend::send_owned`].
    fn send(&mut self, frame: &[u8]) {
        let mut copy = self.spares.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(frame);
        let spare = self.queue_datagram(copy, Icrc::Computed);
        self.keep_spare(spare);
    }

    fn send_owned(&mut self, frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        self.queue_datagram(frame, icrc)
    }

    fn set_send_batching(&mut self, on: bool) {
        self.batching = on;
        if !on {
            self.send_pending();
        }
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.send_pending();
        }
    }

    fn receive(&mut self, frame: &mut Vec<u8>) -> bool {
        let mut malformed = 0;
        while malformed < MALFORMED_PER_CALL {
            if self.rx_next >= self.rx_batch.len() {
                self.rx_next = 0;
                self.rx_offset = 0;
                match rnic_os::receive_datagrams(self.socket.as_fd(), &mut self.rx_batch) {
                    Ok(_) => {}
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => return false,
                    Err(error) => {
                        self.stats.rx_errors += 1;
                        tracing::debug!(target: "rnic_emu::net", %error, "UDP receive failed");
                        return false;
                    }
                }
                if self.rx_batch.is_empty() {
                    return false;
                }
            }
            let index = self.rx_next;
            let entry = self.rx_batch.datagram(index);
            // One datagram of the entry: all of it, or the next of a run the kernel joined.
            let (datagram, truncated) = match self.rx_batch.segment(index) {
                Some(segment) if !self.rx_batch.truncated(index) => {
                    let start = self.rx_offset.min(entry.len());
                    let end = start.saturating_add(segment).min(entry.len());
                    self.rx_offset = end;
                    if end >= entry.len() {
                        self.rx_next += 1;
                        self.rx_offset = 0;
                    }
                    (&entry[start..end], false)
                }
                _ => {
                    self.rx_next += 1;
                    self.rx_offset = 0;
                    (entry, self.rx_batch.truncated(index))
                }
            };
            let length = datagram.len();
            let Some(from) = self.rx_batch.source(index) else {
                self.stats.rx_malformed += 1;
                malformed += 1;
                continue;
            };
            let ip = rebuilt_ip(from.ip(), self.local);
            // Cheap structure checks only: the device verifies the ICRC (and counts
            // failures) itself, and a second CRC here would halve the packet rate.
            let max = usize::from(u16::MAX) - udp::HEADER_LEN - ip.as_ref().map_or(0, |ip| ip.header_len());
            let well_formed = length >= MIN_DATAGRAM
                && length % 4 == 0
                && length <= max.min(MAX_DATAGRAM_BYTES)
                && !truncated
                && from.port() != 0
                && datagram[1] & 0x0F == 0;
            let Some(ip) = ip.filter(|_| well_formed) else {
                self.stats.rx_malformed += 1;
                malformed += 1;
                tracing::debug!(target: "rnic_emu::net", %from, length, "malformed datagram dropped");
                continue;
            };
            let ethernet = EthernetRepr {
                destination: self.mac,
                source: self
                    .peer_macs
                    .get(&from.ip())
                    .copied()
                    .unwrap_or_else(|| Self::stand_in_mac(from.ip())),
                vlan: None,
                ethertype: ip.ethertype(),
            };
            let ip_start = wire::ethernet::HEADER_LEN;
            let udp_start = ip_start + ip.header_len();
            let data_start = udp_start + udp::HEADER_LEN;
            frame.clear();
            frame.resize(data_start, 0);
            ethernet.emit(&mut wire::ethernet::Packet::new_unchecked(&mut frame[..ip_start]));
            ip.emit(&mut frame[ip_start..udp_start], udp::HEADER_LEN + length);
            UdpRepr {
                source_port: from.port(),
                destination_port: ROCE_V2_UDP_PORT,
            }
            .emit(
                &mut udp::Packet::new_unchecked(&mut frame[udp_start..data_start]),
                length,
            );
            frame.extend_from_slice(datagram);
            self.stats.frames_received += 1;
            return true;
        }
        false
    }

    fn pollable_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.socket.as_fd())
    }

    fn stats(&self) -> NetStats {
        self.stats
    }
}
