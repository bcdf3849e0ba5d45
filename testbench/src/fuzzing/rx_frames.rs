//! Received frames against a device with live QPs: the responder (SEND, WRITE, READ and
//! atomic requests, RNR, duplicates, PSN errors), the completer (ACKs, NAKs, READ
//! responses, atomic ACKs for QP 0x19's outstanding requests, timeouts and retries) and
//! the UD and UC receive paths.
//!
//! An input is a sequence of operations: structured frames (headers built from the QP's
//! path, every field chosen by the input, the ICRC correct; optionally patched bytes and
//! resealed), raw frames, passing virtual time, receive WQEs and new requests posted by
//! the driver, CQ polls. Frames never address the victim QP 0x18.
//!
//! Invariants (besides no panic): every DMA inside the windows of [`super::live`] — so no
//! write into region B (local write only, named by no WQE) or C (remote read only), no
//! access at all to the victim's region D, rings or CQ, no write to any WQE ring; the
//! victim's contexts unchanged; every transmitted frame well-formed and from this port;
//! every QP in RTS or ERR at the end; every CQE with a defined status on its QP's CQ.

use std::cell::RefCell;

use arbitrary::{Arbitrary, Unstructured};
use rnic_firmware_if::context::QpState;
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::wire::{
    self, AethRepr, AtomicEthRepr, BthOpcode, BthRepr, DethRepr, EthernetRepr, ExtHeaders, IpRepr, Ipv4Repr, Ipv6Repr,
    RethRepr, RoceRepr, Service, VlanTag,
};
use rnic_hw_model::Picoseconds;

use super::live::{
    LiveBed, Role, Victim, LOCAL_GID_V6, LOCAL_IPV4, LOCAL_MAC, PEER_GID_V6, PEER_IPV4, PEER_MAC, PEER_QPN, QKEY,
    REMOTE_QPN, VICTIM_QPN,
};
use super::{AddressChoice, KeyChoice, LocalSge, REMOTE_KEYS};
use crate::harness::SendRequest;

/// Where a frame goes.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Target {
    /// QP `index` of the bed (modulo their number).
    Qp(u8),
    /// Any QPN but the victim's.
    Other(u32),
}

/// A PSN as an input names it.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum PsnChoice {
    /// The next PSN of this input's stream to that QP, moved by a small delta.
    Next(i8),
    /// Any 24-bit PSN.
    Raw(u32),
}

/// An opcode as an input names it.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum OpcodeChoice {
    /// One of the known opcodes of the QP's own service.
    OwnService(u8),
    /// Any known opcode.
    Known(u8),
}

/// The Q_Key in a DETH.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum QkeyChoice {
    /// The UD QPs' Q_Key.
    Right,
    /// Any value.
    Raw(u32),
}

/// One structured frame.
#[derive(Debug, Clone, Arbitrary)]
struct FrameSpec {
    target: Target,
    opcode: OpcodeChoice,
    psn: PsnChoice,
    solicited: bool,
    ack_request: bool,
    migration: bool,
    fecn: bool,
    becn: bool,
    /// None: the default P_Key.
    partition_key: Option<u16>,
    /// Use the other IP family than the QP's path.
    other_family: bool,
    /// Claim to come from somewhere else than the QP's partner.
    spoofed_source: bool,
    vlan: Option<u16>,
    address: AddressChoice,
    key: KeyChoice,
    dma_length: u32,
    syndrome: u8,
    msn: u32,
    swap_or_add: u64,
    compare: u64,
    atomic_ack: u64,
    immediate: u32,
    qkey: QkeyChoice,
    source_qp: u32,
    /// Payload length, modulo 4 KiB + 1.
    payload_length: u16,
    payload_fill: u8,
    /// Bytes to overwrite after emission (offset modulo the frame length, value), then
    /// the frame is resealed.
    patches: Vec<(u16, u8)>,
    /// Virtual time after the frame, in units of 256 ns.
    gap: u8,
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
enum Op {
    /// A structured frame.
    Frame(Box<FrameSpec>),
    /// Raw bytes as a frame, optionally with their checksums made right.
    Raw { bytes: Vec<u8>, seal: bool },
    /// Let 2^(n mod 34) ns of virtual time pass (ACK and RNR timers, retries).
    Advance(u8),
    /// Post a receive WQE on QP `qp`.
    PostRecv { qp: u8, sges: Vec<LocalSge> },
    /// Post a WQE to SRQ 1.
    PostSrq { sges: Vec<LocalSge> },
    /// Post another request on QP 0x19 (towards the peer): opcode index, length, offset in A.
    Request { opcode: u8, length: u16, offset: u16 },
    /// Poll CQ `cq`.
    PollCq(u8),
}

/// The per-input state of the PSN streams.
struct Streams {
    next: Vec<u32>,
    other: u32,
}

thread_local! {
    static BED: RefCell<Option<LiveBed>> = const { RefCell::new(None) };
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(ops) = Vec::<Op>::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    super::with_bed(&BED, Victim::Untouchable, |bed| {
        let mut streams = Streams {
            next: vec![0; bed.qps.len()],
            other: 0,
        };
        for op in ops {
            apply(bed, &mut streams, op);
        }
        bed.finish(&[QpState::Rts, QpState::Err]);
    });
}

fn apply(bed: &mut LiveBed, streams: &mut Streams, op: Op) {
    match op {
        Op::Frame(spec) => {
            if let Some(frame) = build(bed, streams, &spec) {
                bed.h.device.receive_frame(&frame);
            }
            bed.advance(Picoseconds(u64::from(spec.gap) * 256_000));
        }
        Op::Raw { mut bytes, seal } => {
            redirect_from_victim(&mut bytes);
            if seal {
                super::seal(&mut bytes);
            }
            bed.h.device.receive_frame(&bytes);
            bed.drain_transmit();
        }
        Op::Advance(n) => bed.advance(Picoseconds(1_000u64 << (n % 34))),
        Op::PostRecv { qp, sges } => {
            let index = bed.qp_index(qp);
            if bed.qps[index].qp.spec.srq.is_some() {
                return;
            }
            let slots = 1usize << bed.qps[index].qp.spec.rq_sge_shift;
            let sges: Vec<_> = sges.iter().take(slots).map(|s| s.sge(bed)).collect();
            let mut qp = bed.qps[index].qp.clone();
            bed.h.post_recv(&mut qp, &sges);
            bed.qps[index].qp = qp;
        }
        Op::PostSrq { sges } => {
            let slots = 1usize << bed.srq.sge_shift;
            let sges: Vec<_> = sges.iter().take(slots).map(|s| s.sge(bed)).collect();
            let mut srq = bed.srq.clone();
            bed.h.post_srq(&mut srq, &sges);
            bed.srq = srq;
        }
        Op::Request { opcode, length, offset } => {
            let a = bed.region(0);
            let opcode = [
                SqOpcode::Send,
                SqOpcode::RdmaWrite,
                SqOpcode::RdmaRead,
                SqOpcode::AtomCmpAndSwap,
                SqOpcode::AtomFetchAndAdd,
            ][usize::from(opcode) % 5];
            let atomic = matches!(opcode, SqOpcode::AtomCmpAndSwap | SqOpcode::AtomFetchAndAdd);
            let length = if atomic { 8 } else { u32::from(length) % 4096 };
            let offset = (u64::from(offset) % (a.length - 4096)) & !7;
            let request = SendRequest {
                swap_add: 1,
                compare: 0,
                ..SendRequest::rdma(opcode, vec![a.sge(offset, length)], 0x5000_0000, 0x0029_0001)
            };
            let index = bed.qps.iter().position(|q| q.qp.qpn == REMOTE_QPN).expect("QP 0x19");
            let mut qp = bed.qps[index].qp.clone();
            bed.h.post_send(&mut qp, &request);
            bed.h.ring_send(&qp);
            bed.qps[index].qp = qp;
        }
        Op::PollCq(cq) => {
            bed.poll_cq(usize::from(cq));
        }
    }
}

/// A raw frame must not name the victim: where the BTH of the frame lies (after one
/// optional VLAN tag, an IPv4 header of its IHL or an IPv6 header, and UDP), a DestQP of
/// the victim's is changed to another QPN. Call before sealing.
fn redirect_from_victim(frame: &mut [u8]) {
    let mut l3 = 14;
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        l3 = 18;
    }
    let ip = match frame.get(l3 - 2..l3) {
        Some([0x08, 0x00]) => frame.get(l3).map_or(20, |b| usize::from(b & 0x0F) * 4),
        Some([0x86, 0xDD]) => 40,
        _ => return,
    };
    let bth = l3 + ip + 8;
    if let Some(qpn) = frame.get_mut(bth + 5..bth + 8) {
        if u32::from_be_bytes([0, qpn[0], qpn[1], qpn[2]]) == VICTIM_QPN {
            qpn[2] ^= 0x80;
        }
    }
}

fn build(bed: &LiveBed, streams: &mut Streams, spec: &FrameSpec) -> Option<Vec<u8>> {
    let (qpn, role, ipv6, stream) = match spec.target {
        Target::Qp(i) => {
            let index = bed.qp_index(i);
            let qp = &bed.qps[index];
            (
                qp.qp.qpn,
                Some(qp.role),
                qp.qp.spec.sgid_index == 1,
                &mut streams.next[index],
            )
        }
        Target::Other(qpn) => {
            let mut qpn = qpn & 0xFF_FFFF;
            if qpn == VICTIM_QPN {
                qpn += 1;
            }
            (qpn, None, false, &mut streams.other)
        }
    };
    let service = match role {
        Some(Role::Datagram) => Service::Ud,
        Some(_)
            if bed
                .qps
                .iter()
                .any(|q| q.qp.qpn == qpn && q.qp.spec.service == rnic_firmware_if::context::ServiceType::Uc) =>
        {
            Service::Uc
        }
        _ => Service::Rc,
    };
    let known: Vec<BthOpcode> = BthOpcode::all_known()
        .filter(|o| !o.headers().contains(ExtHeaders::FETH))
        .collect();
    let opcode = match spec.opcode {
        OpcodeChoice::OwnService(i) => {
            let own: Vec<BthOpcode> = known.iter().copied().filter(|o| o.service() == service).collect();
            own[usize::from(i) % own.len()]
        }
        OpcodeChoice::Known(i) => known[usize::from(i) % known.len()],
    };
    let psn = match spec.psn {
        PsnChoice::Next(delta) => {
            let psn = stream.wrapping_add(delta as i32 as u32) & 0xFF_FFFF;
            *stream = stream.wrapping_add(1);
            psn
        }
        PsnChoice::Raw(psn) => psn & 0xFF_FFFF,
    };
    // The partner's address: ourselves for loopback QPs, the peer otherwise.
    let from_self = matches!(role, Some(Role::Loopback { .. })) != spec.spoofed_source;
    let (source_mac, source_v4, source_v6) = if from_self {
        (LOCAL_MAC, LOCAL_IPV4, LOCAL_GID_V6)
    } else {
        (PEER_MAC, PEER_IPV4, PEER_GID_V6)
    };
    let ip = if ipv6 != spec.other_family {
        IpRepr::V6(Ipv6Repr {
            source: source_v6,
            destination: LOCAL_GID_V6,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            source: source_v4,
            destination: LOCAL_IPV4,
            dscp: 0,
            ecn: 0,
            ttl: 64,
            identification: 0,
            dont_fragment: true,
        })
    };
    let ethernet = EthernetRepr {
        destination: LOCAL_MAC,
        source: source_mac,
        vlan: spec.vlan.map(|vid| VlanTag {
            pcp: 0,
            dei: false,
            vid: vid & 0xFFF,
        }),
        ethertype: 0,
    };
    let bth = BthRepr {
        opcode,
        solicited: spec.solicited,
        migration: spec.migration,
        pad_count: 0,
        transport_version: 0,
        partition_key: spec.partition_key.unwrap_or(0xFFFF),
        fecn: spec.fecn,
        becn: spec.becn,
        destination_qp: qpn,
        ack_request: spec.ack_request,
        psn,
    };
    let mut repr = RoceRepr::new(ethernet, ip, 0xC000 | (qpn as u16 & 0x3FFF), bth);
    let headers = opcode.headers();
    let key = spec.key.key(bed, REMOTE_KEYS);
    let address = spec.address.address(bed);
    if headers.contains(ExtHeaders::RETH) {
        repr.reth = Some(RethRepr {
            virtual_address: address,
            rkey: key,
            dma_length: spec.dma_length,
        });
    }
    if headers.contains(ExtHeaders::AETH) {
        repr.aeth = Some(AethRepr {
            syndrome: spec.syndrome,
            msn: spec.msn & 0xFF_FFFF,
        });
    }
    if headers.contains(ExtHeaders::ATOMIC_ETH) {
        repr.atomic_eth = Some(AtomicEthRepr {
            virtual_address: address,
            rkey: key,
            swap_or_add: spec.swap_or_add,
            compare: spec.compare,
        });
    }
    if headers.contains(ExtHeaders::ATOMIC_ACK_ETH) {
        repr.atomic_ack = Some(spec.atomic_ack);
    }
    if headers.contains(ExtHeaders::IMMDT) {
        repr.immediate = Some(spec.immediate);
    }
    if headers.contains(ExtHeaders::IETH) {
        repr.invalidate_rkey = Some(key);
    }
    if headers.contains(ExtHeaders::DETH) {
        repr.deth = Some(DethRepr {
            qkey: match spec.qkey {
                QkeyChoice::Right => QKEY,
                QkeyChoice::Raw(qkey) => qkey,
            },
            source_qp: if spec.source_qp == 0 {
                PEER_QPN
            } else {
                spec.source_qp & 0xFF_FFFF
            },
        });
    }
    let mut length = usize::from(spec.payload_length) % 4097;
    if !opcode.has_payload() {
        length = 0;
    } else if opcode.operation() == Some(wire::opcode::Operation::AtomicWrite) {
        length = 8;
    }
    repr.check(length).ok()?;
    let payload = vec![spec.payload_fill; length];
    let mut frame = Vec::with_capacity(wire::frame_length(&repr, length));
    wire::emit_frame(&repr, &payload, &mut frame);
    if !spec.patches.is_empty() {
        for &(offset, value) in &spec.patches {
            let at = usize::from(offset) % frame.len();
            frame[at] = value;
        }
        redirect_from_victim(&mut frame);
        super::seal(&mut frame);
    }
    Some(frame)
}
