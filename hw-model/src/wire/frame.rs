//! Whole RoCEv2 frames: [`RoceRepr`], [`parse_frame`], [`emit_frame`], and the flow and GID
//! helpers of roce-wire §1.1 and §1.10.

use super::ethernet::{self, EthernetRepr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use super::icrc::{self, ICRC_LEN};
use super::opcode::{ExtHeaders, Operation};
use super::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, ipv4, ipv6, reth, udp, AethRepr, AtomicAckEthRepr,
    AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, Ipv4Repr, Ipv6Repr, RethRepr, UdpRepr, WireError,
    ROCE_V2_UDP_PORT,
};

/// The IP header of a RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4 (IPv4-mapped GIDs).
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Header length: 20 or 40.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }

    /// The EtherType that carries this header.
    pub const fn ethertype(&self) -> u16 {
        match self {
            IpRepr::V4(_) => ETHERTYPE_IPV4,
            IpRepr::V6(_) => ETHERTYPE_IPV6,
        }
    }

    /// Source address as a GID (IPv4 addresses IPv4-mapped).
    pub const fn source_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(r) => ipv4_to_gid(r.source),
            IpRepr::V6(r) => r.source,
        }
    }

    /// Destination address as a GID (IPv4 addresses IPv4-mapped).
    pub const fn destination_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(r) => ipv4_to_gid(r.destination),
            IpRepr::V6(r) => r.destination,
        }
    }

    /// Writes the header into the first [`IpRepr::header_len`] bytes of `buffer`, for a
    /// payload (UDP datagram) of `payload_len` bytes.
    ///
    /// # Panics
    /// If `buffer` is shorter than the header.
    pub fn emit(&self, buffer: &mut [u8], payload_len: usize) {
        match self {
            IpRepr::V4(r) => r.emit(
                &mut ipv4::Packet::new_unchecked(&mut buffer[..ipv4::HEADER_LEN]),
                payload_len,
            ),
            IpRepr::V6(r) => r.emit(
                &mut ipv6::Packet::new_unchecked(&mut buffer[..ipv6::HEADER_LEN]),
                payload_len,
            ),
        }
    }
}

/// Every header of a RoCEv2 frame, as semantic fields.
///
/// The extension-header options must be `Some` exactly when the BTH opcode requires that
/// header ([`BthOpcode::headers`](super::BthOpcode::headers)); [`RoceRepr::check`] verifies
/// it. Derived on emit, and so ignored in the repr: `ethernet.ethertype` (from `ip`), the
/// IP and UDP lengths, the IPv4 checksum, the UDP checksum (0) and `bth.pad_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceRepr {
    /// Ethernet header.
    pub ethernet: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP source port (flow entropy, see [`udp_source_port`]); the destination is 4791.
    pub udp_source_port: u16,
    /// Base transport header.
    pub bth: BthRepr,
    /// RETH: RDMA WRITE First/Only, READ Request, ATOMIC WRITE.
    pub reth: Option<RethRepr>,
    /// AETH: Acknowledge, ATOMIC Acknowledge, READ Response First/Last/Only.
    pub aeth: Option<AethRepr>,
    /// AtomicETH: CompareSwap, FetchAdd.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH (original remote value): ATOMIC Acknowledge.
    pub atomic_ack: Option<u64>,
    /// ImmDt (big-endian reading of the 4 bytes): the "with Immediate" opcodes.
    pub immediate: Option<u32>,
    /// IETH (R_Key to invalidate): SEND Last/Only with Invalidate.
    pub invalidate_rkey: Option<u32>,
    /// DETH: UD SENDs.
    pub deth: Option<DethRepr>,
}

/// A parsed, validated frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// Every header.
    pub repr: RoceRepr,
    /// The payload, borrowed from the frame, without the pad bytes.
    pub payload: &'a [u8],
}

/// Pad bytes after a payload of `payload_length` bytes: `(-len) mod 4`.
#[inline]
pub const fn pad_len(payload_length: usize) -> usize {
    payload_length.wrapping_neg() & 3
}

impl RoceRepr {
    /// A repr with no extension header (fill in the ones the opcode needs).
    pub const fn new(ethernet: EthernetRepr, ip: IpRepr, udp_source_port: u16, bth: BthRepr) -> RoceRepr {
        RoceRepr {
            ethernet,
            ip,
            udp_source_port,
            bth,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack: None,
            immediate: None,
            invalidate_rkey: None,
            deth: None,
        }
    }

    /// Bytes before the payload: Ethernet, IP, UDP, BTH and extension headers.
    pub fn header_len(&self) -> usize {
        self.ethernet.header_len()
            + self.ip.header_len()
            + udp::HEADER_LEN
            + bth::HEADER_LEN
            + self.bth.opcode.extension_headers_len()
    }

    /// Checks that [`emit_frame`] can emit this repr with `payload_length` bytes of payload
    /// and that [`parse_frame`] will accept the result: a known opcode other than FLUSH,
    /// extension headers present exactly as the opcode requires, a payload only where the
    /// opcode carries one (exactly 8 bytes for ATOMIC WRITE), TVer 0, 24-bit DestQP, PSN,
    /// MSN and source QP, and a frame that fits the 16-bit IP/UDP lengths.
    ///
    /// # Errors
    /// [`WireError::UnknownOpcode`], [`WireError::UnsupportedOpcode`], or
    /// [`WireError::Malformed`] with layer `"RoceRepr"` and the offending field.
    pub fn check(&self, payload_length: usize) -> Result<(), WireError> {
        let op = self.bth.opcode;
        if !op.is_known() {
            return Err(WireError::UnknownOpcode(op.0));
        }
        let headers = op.headers();
        if headers.contains(ExtHeaders::FETH) {
            return Err(WireError::UnsupportedOpcode(op.0));
        }
        let bad = |field: &'static str, value: u64| {
            Err(WireError::Malformed {
                layer: "RoceRepr",
                field,
                value,
            })
        };
        let presence = [
            (ExtHeaders::RETH, self.reth.is_some(), "reth"),
            (ExtHeaders::AETH, self.aeth.is_some(), "aeth"),
            (ExtHeaders::ATOMIC_ETH, self.atomic_eth.is_some(), "atomic_eth"),
            (ExtHeaders::ATOMIC_ACK_ETH, self.atomic_ack.is_some(), "atomic_ack"),
            (ExtHeaders::IMMDT, self.immediate.is_some(), "immediate"),
            (ExtHeaders::IETH, self.invalidate_rkey.is_some(), "invalidate_rkey"),
            (ExtHeaders::DETH, self.deth.is_some(), "deth"),
        ];
        for (flag, present, field) in presence {
            if headers.contains(flag) != present {
                return bad(field, u64::from(present));
            }
        }
        if !op.has_payload() && payload_length != 0 {
            return bad("payload length", payload_length as u64);
        }
        if op.operation() == Some(Operation::AtomicWrite) && payload_length != 8 {
            return bad("payload length", payload_length as u64);
        }
        if self.bth.transport_version != 0 {
            return bad("bth.transport_version", self.bth.transport_version.into());
        }
        if self.bth.destination_qp > bth::PSN_MASK {
            return bad("bth.destination_qp", self.bth.destination_qp.into());
        }
        if self.bth.psn > bth::PSN_MASK {
            return bad("bth.psn", self.bth.psn.into());
        }
        if let Some(aeth) = self.aeth {
            if aeth.msn > aeth::MSN_MASK {
                return bad("aeth.msn", aeth.msn.into());
            }
        }
        if let Some(deth) = self.deth {
            if deth.source_qp > bth::PSN_MASK {
                return bad("deth.source_qp", deth.source_qp.into());
            }
        }
        let ip_payload = udp_length(self, payload_length);
        let limit = match self.ip {
            IpRepr::V4(_) => usize::from(u16::MAX) - ipv4::HEADER_LEN,
            IpRepr::V6(_) => usize::from(u16::MAX),
        };
        if ip_payload > limit {
            return bad("payload length", payload_length as u64);
        }
        Ok(())
    }
}

/// UDP length (header + BTH + extension headers + payload + pad + ICRC).
fn udp_length(repr: &RoceRepr, payload_length: usize) -> usize {
    udp::HEADER_LEN
        + bth::HEADER_LEN
        + repr.bth.opcode.extension_headers_len()
        + payload_length
        + pad_len(payload_length)
        + ICRC_LEN
}

/// Total frame length for a repr and payload length (with pad and ICRC, no FCS).
pub fn frame_length(repr: &RoceRepr, payload_length: usize) -> usize {
    repr.ethernet.header_len() + repr.ip.header_len() + udp_length(repr, payload_length)
}

/// Writes the complete frame for `repr` and `payload` into `out` (see [`emit_frame_with`]).
///
/// # Panics
/// In debug builds, if [`RoceRepr::check`] rejects `repr` with this payload length.
pub fn emit_frame(repr: &RoceRepr, payload: &[u8], out: &mut Vec<u8>) {
    emit_frame_with(repr, payload.len(), out, |buffer| buffer.copy_from_slice(payload));
}

/// Writes the complete frame into `out`, with the payload written in place by `fill` (for
/// DMA straight into the frame). `fill` gets exactly `payload_length` bytes (zeroed).
///
/// `out` is cleared first and its capacity reused: no allocation when the capacity holds
/// [`frame_length`] bytes. Derived here: the Ethernet EtherType (from `repr.ip`), the BTH
/// PadCnt (`repr.bth.pad_count` is ignored), the IPv4 total length and header checksum or
/// the IPv6 payload length, the UDP length with checksum 0, the zero pad bytes, and the
/// ICRC (little-endian on the wire).
///
/// # Panics
/// In debug builds, if [`RoceRepr::check`] rejects `repr` with this payload length (an
/// extension header missing or extra for the opcode, an unknown opcode, an oversized
/// frame, ...). In release builds such a repr is emitted as the opcode dictates: a missing
/// header is written as zeros and an extra one is ignored.
pub fn emit_frame_with(repr: &RoceRepr, payload_length: usize, out: &mut Vec<u8>, fill: impl FnOnce(&mut [u8])) {
    emit_frame_inner(repr, payload_length, out, true, Icrc::Computed, fill);
}

/// Like [`emit_frame_with`], but the payload bytes `fill` gets are not zeroed first: they
/// hold whatever `out` held there before, and `fill` must overwrite every one of them (or
/// the caller must discard the frame). Every other byte of the frame (headers, reserved
/// fields, pad, ICRC) is written as [`emit_frame_with`] writes it. This saves zero-filling
/// the payload of every frame when `out` is a recycled buffer.
pub fn emit_frame_overwriting(repr: &RoceRepr, payload_length: usize, out: &mut Vec<u8>, fill: impl FnOnce(&mut [u8])) {
    emit_frame_inner(repr, payload_length, out, false, Icrc::Computed, fill);
}

/// [`emit_frame_overwriting`] with the ICRC left to whoever the frame goes to
/// ([`Icrc::Offloaded`]): the four ICRC bytes are written as zeros and no CRC is computed.
/// The frame must get its ICRC ([`fill_icrc`]) before anyone outside the in-process link
/// sees it (a capture, a socket, an observer, a fault that alters it).
pub fn emit_frame_offloaded(repr: &RoceRepr, payload_length: usize, out: &mut Vec<u8>, fill: impl FnOnce(&mut [u8])) {
    emit_frame_inner(repr, payload_length, out, false, Icrc::Offloaded, fill);
}

/// Whether a frame's ICRC field holds the frame's ICRC: the checksum offload of the
/// in-process link, as virtio-net's `NEEDS_CSUM` / `DATA_VALID` flags between local guests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icrc {
    /// The ICRC field holds the ICRC the frame had when it was sent, or whatever the
    /// network delivered: a receiver checks it.
    Computed,
    /// The frame comes unaltered from a device in this process, which did not compute its
    /// ICRC (the field is zero): a receiver trusts it without a check, and whoever shows
    /// the frame to anyone else fills it in first ([`fill_icrc`]).
    Offloaded,
}

/// Writes the ICRC of a RoCEv2 frame (Ethernet, optionally one 802.1Q tag, IPv4 or IPv6,
/// UDP) into its last four bytes covered by the UDP length, as [`emit_frame`] computes
/// it. Returns false, and changes nothing, if the frame is too short for its IP and UDP
/// headers or its UDP length, or is not IP; it checks nothing else (the frame is one this
/// device emitted).
pub fn fill_icrc(frame: &mut [u8]) -> bool {
    let Some(ethertype) = frame.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
        return false;
    };
    let (ethertype, ip_start) = if ethertype == ethernet::ETHERTYPE_VLAN {
        match frame.get(16..18) {
            Some(b) => (u16::from_be_bytes([b[0], b[1]]), ethernet::VLAN_HEADER_LEN),
            None => return false,
        }
    } else {
        (ethertype, ethernet::HEADER_LEN)
    };
    let ip_len = match ethertype {
        ETHERTYPE_IPV4 => match frame.get(ip_start) {
            Some(first) => usize::from(first & 0x0F) * 4,
            None => return false,
        },
        ETHERTYPE_IPV6 => ipv6::HEADER_LEN,
        _ => return false,
    };
    let udp_start = ip_start + ip_len;
    let Some(udp_length) = frame
        .get(udp_start + 4..udp_start + 6)
        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    else {
        return false;
    };
    let udp_end = udp_start + udp_length;
    if ip_len < ipv4::HEADER_LEN || udp_length < udp::HEADER_LEN + bth::HEADER_LEN + ICRC_LEN || udp_end > frame.len() {
        return false;
    }
    let icrc_start = udp_end - ICRC_LEN;
    let value = icrc::icrc_masking_in_place(&mut frame[ip_start..icrc_start]);
    frame[icrc_start..udp_end].copy_from_slice(&icrc::to_wire(value));
    true
}

#[inline(always)]
fn emit_frame_inner(
    repr: &RoceRepr,
    payload_length: usize,
    out: &mut Vec<u8>,
    zero_payload: bool,
    icrc_mode: Icrc,
    fill: impl FnOnce(&mut [u8]),
) {
    #[cfg(debug_assertions)]
    if let Err(error) = repr.check(payload_length) {
        panic!("emit_frame: inconsistent RoceRepr: {error}");
    }
    let headers = repr.bth.opcode.headers();
    let pad = pad_len(payload_length);
    let eth_len = repr.ethernet.header_len();
    let ip_len = repr.ip.header_len();
    let udp_len = udp_length(repr, payload_length);
    let total = eth_len + ip_len + udp_len;
    // The payload sits right before the pad and the ICRC.
    let payload_start = total - ICRC_LEN - pad - payload_length;
    if zero_payload {
        out.clear();
        out.resize(total, 0);
    } else {
        // Keep what the buffer held (no memset): every header emitter writes each byte of
        // its header, reserved bits included, and the bytes no emitter writes (pad, FETH
        // and CNP reserved bytes, a header missing from an inconsistent repr) are zeroed
        // below, so the frame is exactly that of a zero-filled buffer.
        out.truncate(total);
        out.resize(total, 0);
    }
    let frame = out.as_mut_slice();

    let ethernet = EthernetRepr {
        ethertype: repr.ip.ethertype(),
        ..repr.ethernet
    };
    ethernet.emit(&mut ethernet::Packet::new_unchecked(&mut frame[..eth_len]));
    let ip_start = eth_len;
    repr.ip.emit(&mut frame[ip_start..], udp_len);
    let udp_start = ip_start + ip_len;
    UdpRepr {
        source_port: repr.udp_source_port,
        destination_port: ROCE_V2_UDP_PORT,
    }
    .emit(
        &mut udp::Packet::new_unchecked(&mut frame[udp_start..]),
        udp_len - udp::HEADER_LEN,
    );

    let mut at = udp_start + udp::HEADER_LEN;
    let mut next = |len: usize| {
        let range = at..at + len;
        at += len;
        range
    };
    BthRepr {
        pad_count: pad as u8,
        ..repr.bth
    }
    .emit(&mut bth::Packet::new_unchecked(&mut frame[next(bth::HEADER_LEN)]));
    // Wire order: DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, CNP bytes.
    if headers.contains(ExtHeaders::DETH) {
        let range = next(deth::HEADER_LEN);
        match repr.deth {
            Some(r) => r.emit(&mut deth::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::FETH) {
        frame[next(super::opcode::header_len::FETH)].fill(0);
    }
    if headers.contains(ExtHeaders::RETH) {
        let range = next(reth::HEADER_LEN);
        match repr.reth {
            Some(r) => r.emit(&mut reth::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::ATOMIC_ETH) {
        let range = next(atomic_eth::HEADER_LEN);
        match repr.atomic_eth {
            Some(r) => r.emit(&mut atomic_eth::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::AETH) {
        let range = next(aeth::HEADER_LEN);
        match repr.aeth {
            Some(r) => r.emit(&mut aeth::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::ATOMIC_ACK_ETH) {
        let range = next(atomic_ack_eth::HEADER_LEN);
        match repr.atomic_ack {
            Some(value) => AtomicAckEthRepr {
                original_remote_data: value,
            }
            .emit(&mut atomic_ack_eth::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::IMMDT) {
        let range = next(immdt::HEADER_LEN);
        match repr.immediate {
            Some(data) => ImmDtRepr { data }.emit(&mut immdt::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::IETH) {
        let range = next(ieth::HEADER_LEN);
        match repr.invalidate_rkey {
            Some(rkey) => IethRepr { rkey }.emit(&mut ieth::Packet::new_unchecked(&mut frame[range])),
            None => frame[range].fill(0),
        }
    }
    if headers.contains(ExtHeaders::CNP_RESERVED) {
        frame[next(super::opcode::header_len::CNP_RESERVED)].fill(0);
    }
    let payload = next(payload_length);
    debug_assert_eq!(payload.start, payload_start);
    fill(&mut frame[payload]);
    frame[next(pad)].fill(0);
    let icrc_range = next(ICRC_LEN);
    match icrc_mode {
        Icrc::Computed => {
            // The frame is ours to write: mask it in place rather than copy its headers.
            let value = icrc::icrc_masking_in_place(&mut frame[ip_start..icrc_range.start]);
            frame[icrc_range].copy_from_slice(&icrc::to_wire(value));
        }
        Icrc::Offloaded => frame[icrc_range].fill(0),
    }
}

/// Parses and validates a whole Ethernet frame (no FCS).
///
/// Checks, in order: Ethernet length and EtherType (IPv4 or IPv6, after at most one 802.1Q
/// tag); the IP header (IPv4: version, IHL = 5, total length, header checksum, not a
/// fragment, protocol UDP; IPv6: version, payload length, next header UDP); the UDP length
/// and destination port 4791; room for a BTH and the ICRC; the ICRC, over the extent given
/// by the UDP length (trailing bytes such as Ethernet padding are ignored); BTH TVer 0; a
/// known opcode (FLUSH is unsupported); each extension header the opcode requires; the pad
/// (PadCnt ≤ the bytes left, payload + pad a multiple of 4) and a payload only where the
/// opcode carries one (exactly 8 bytes for ATOMIC WRITE).
///
/// Not checked: the UDP checksum (masked out of the ICRC; rxe sends 0), the contents of
/// reserved fields and pad bytes, P_Key, Q_Key and QPN values (transport business).
///
/// Never panics, on any input; allocates nothing.
///
/// # Errors
/// The first failed check, as a [`WireError`].
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame<'_>, WireError> {
    parse_frame_inner(frame, Icrc::Computed)
}

/// [`parse_frame`] of a frame whose ICRC is trusted ([`Icrc::Offloaded`]: it comes
/// unaltered from a device in this process): every check but the ICRC's.
///
/// # Errors
/// As [`parse_frame`], never [`WireError::BadIcrc`].
pub fn parse_frame_offloaded(frame: &[u8]) -> Result<ParsedFrame<'_>, WireError> {
    parse_frame_inner(frame, Icrc::Offloaded)
}

/// [`parse_frame`] or [`parse_frame_offloaded`], as `icrc` says.
///
/// # Errors
/// As [`parse_frame`].
#[inline]
pub fn parse_frame_with(frame: &[u8], icrc: Icrc) -> Result<ParsedFrame<'_>, WireError> {
    match icrc {
        Icrc::Computed => parse_frame(frame),
        Icrc::Offloaded => parse_frame_offloaded(frame),
    }
}

#[inline(always)]
fn parse_frame_inner(frame: &[u8], icrc_mode: Icrc) -> Result<ParsedFrame<'_>, WireError> {
    let eth_packet = ethernet::Packet::new_checked(frame)?;
    let ethernet = EthernetRepr::parse(&eth_packet)?;
    let ip_start = eth_packet.header_len();
    let ip_bytes = &frame[ip_start..];

    let (ip, ip_len, ip_payload_len) = match ethernet.ethertype {
        ETHERTYPE_IPV4 => {
            let packet = ipv4::Packet::new_checked(ip_bytes)?;
            let repr = Ipv4Repr::parse(&packet)?;
            (
                IpRepr::V4(repr),
                ipv4::HEADER_LEN,
                usize::from(packet.total_len()) - ipv4::HEADER_LEN,
            )
        }
        ETHERTYPE_IPV6 => {
            let packet = ipv6::Packet::new_checked(ip_bytes)?;
            let repr = Ipv6Repr::parse(&packet)?;
            (IpRepr::V6(repr), ipv6::HEADER_LEN, usize::from(packet.payload_len()))
        }
        other => {
            return Err(WireError::NotRoce {
                layer: "Ethernet",
                field: "EtherType",
                value: other.into(),
            })
        }
    };

    let udp_start = ip_start + ip_len;
    let udp_packet = udp::Packet::new_checked(&frame[udp_start..udp_start + ip_payload_len])?;
    let udp_repr = UdpRepr::parse(&udp_packet)?;
    if udp_repr.destination_port != ROCE_V2_UDP_PORT {
        return Err(WireError::NotRoce {
            layer: "UDP",
            field: "destination port",
            value: udp_repr.destination_port.into(),
        });
    }
    let udp_end = udp_start + usize::from(udp_packet.len());
    let bth_start = udp_start + udp::HEADER_LEN;
    super::check_len("BTH", bth::HEADER_LEN, udp_end - bth_start)?;
    super::check_len("ICRC", ICRC_LEN, udp_end - bth_start - bth::HEADER_LEN)?;

    let icrc_start = udp_end - ICRC_LEN;
    if icrc_mode == Icrc::Computed {
        let found = icrc::from_wire([
            frame[icrc_start],
            frame[icrc_start + 1],
            frame[icrc_start + 2],
            frame[icrc_start + 3],
        ]);
        let computed = icrc::icrc(&frame[ip_start..icrc_start]);
        if computed != found {
            return Err(WireError::BadIcrc { computed, found });
        }
    }

    // Everything from here on lies before the ICRC.
    let body = &frame[..icrc_start];
    let bth = BthRepr::parse(&bth::Packet::new_unchecked(&body[bth_start..]))?;
    if bth.transport_version != 0 {
        return Err(WireError::Malformed {
            layer: "BTH",
            field: "TVer",
            value: bth.transport_version.into(),
        });
    }
    let op = bth.opcode;
    if !op.is_known() {
        return Err(WireError::UnknownOpcode(op.0));
    }
    let headers = op.headers();
    if headers.contains(ExtHeaders::FETH) {
        return Err(WireError::UnsupportedOpcode(op.0));
    }

    // Each header into a local, the repr built once at the end: built field by field in
    // place, the large repr was copied whole into the result.
    let (mut deth, mut reth, mut atomic_eth, mut aeth) = (None, None, None, None);
    let (mut atomic_ack, mut immediate, mut invalidate_rkey) = (None, None, None);
    let mut at = bth_start + bth::HEADER_LEN;
    if headers.contains(ExtHeaders::DETH) {
        deth = Some(DethRepr::parse(&deth::Packet::new_checked(&body[at..])?)?);
        at += deth::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::RETH) {
        reth = Some(RethRepr::parse(&reth::Packet::new_checked(&body[at..])?)?);
        at += reth::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::ATOMIC_ETH) {
        atomic_eth = Some(AtomicEthRepr::parse(&atomic_eth::Packet::new_checked(&body[at..])?)?);
        at += atomic_eth::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::AETH) {
        aeth = Some(AethRepr::parse(&aeth::Packet::new_checked(&body[at..])?)?);
        at += aeth::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::ATOMIC_ACK_ETH) {
        let packet = atomic_ack_eth::Packet::new_checked(&body[at..])?;
        atomic_ack = Some(AtomicAckEthRepr::parse(&packet)?.original_remote_data);
        at += atomic_ack_eth::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::IMMDT) {
        immediate = Some(ImmDtRepr::parse(&immdt::Packet::new_checked(&body[at..])?)?.data);
        at += immdt::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::IETH) {
        invalidate_rkey = Some(IethRepr::parse(&ieth::Packet::new_checked(&body[at..])?)?.rkey);
        at += ieth::HEADER_LEN;
    }
    if headers.contains(ExtHeaders::CNP_RESERVED) {
        let reserved = super::opcode::header_len::CNP_RESERVED;
        super::check_len("CNP", reserved, body.len() - at)?;
        at += reserved;
    }

    let payload_and_pad = &body[at..];
    let pad = usize::from(bth.pad_count);
    if payload_and_pad.len() & 3 != 0 {
        return Err(WireError::Malformed {
            layer: "RoCE",
            field: "payload+pad length",
            value: payload_and_pad.len() as u64,
        });
    }
    if pad > payload_and_pad.len() {
        return Err(WireError::Malformed {
            layer: "BTH",
            field: "PadCnt",
            value: pad as u64,
        });
    }
    let payload = &payload_and_pad[..payload_and_pad.len() - pad];
    let payload_ok = match op.operation() {
        Some(Operation::AtomicWrite) => payload.len() == 8,
        _ => op.has_payload() || payload.is_empty(),
    };
    if !payload_ok {
        return Err(WireError::Malformed {
            layer: op.name(),
            field: "payload length",
            value: payload.len() as u64,
        });
    }
    Ok(ParsedFrame {
        repr: RoceRepr {
            ethernet,
            ip,
            udp_source_port: udp_repr.source_port,
            bth,
            reth,
            aeth,
            atomic_eth,
            atomic_ack,
            immediate,
            invalidate_rkey,
            deth,
        },
        payload,
    })
}

/// UDP source port for a flow (roce-wire §1.1, Linux `rdma_flow_label_to_udp_sport` and
/// `rdma_calc_flow_label`): a non-zero 20-bit flow label is folded into 14 bits and offset
/// into 0xC000-0xFFFF; flow label 0 is first replaced by a label derived symmetrically
/// from the two QPNs, so both ends of a connection pick the same port.
pub fn udp_source_port(flow_label: u32, local_qpn: u32, remote_qpn: u32) -> u16 {
    let flow_label = match flow_label & 0xF_FFFF {
        0 => {
            let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
            v ^= v >> 20;
            v ^= v >> 40;
            (v & 0xF_FFFF) as u32
        }
        label => label,
    };
    let low = (flow_label & 0x3FFF) ^ ((flow_label & 0xF_C000) >> 14);
    (0xC000 | low) as u16
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), or `None` for any other GID.
pub fn gid_to_ipv4(gid: &[u8; 16]) -> Option<[u8; 4]> {
    match gid {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d] => Some([*a, *b, *c, *d]),
        _ => None,
    }
}

/// The IPv4-mapped GID (`::ffff:a.b.c.d`) of an IPv4 address.
pub const fn ipv4_to_gid(address: [u8; 4]) -> [u8; 16] {
    let [a, b, c, d] = address;
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d]
}
