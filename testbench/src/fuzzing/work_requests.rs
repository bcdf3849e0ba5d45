//! WQEs and SGE lists from a hostile application: send WQEs of every opcode with SGEs,
//! inline data, remote addresses and keys chosen by the input (or 64 raw bytes and raw
//! extended SGEs), receive and SRQ WQEs, SQ/RQ/SRQ/CQ doorbells with any index, on the
//! bed's loopback pairs, so the requester, the responder and the completer of the same
//! device all see them.
//!
//! The application owns PD 1's QPs and CQs; it does not own the victim (QP 0x18, CQ 2,
//! region D in PD 2) and must not reach it. Its WQEs may name D's keys (locally and
//! remotely) and UD sends may address the victim QP: the device must refuse them.
//!
//! Invariants: those of [`super::live::LiveBed`] with the victim untouchable — DMA only in
//! the granted windows (no write to WQE rings or to read-only regions, nothing of B or
//! the victim), the victim's contexts unchanged, every QP in RTS or ERR, every CQE
//! defined and on its QP's CQ, every transmitted frame well-formed.

use std::cell::RefCell;

use arbitrary::{Arbitrary, Unstructured};
use rnic_firmware_if::context::{QpState, ServiceType};
use rnic_firmware_if::doorbell::{CqDoorbell, Doorbell};
use rnic_firmware_if::wqe::{sq_owner_bit, SqOpcode};
use rnic_hw_model::{HostMemory, Picoseconds};

use super::live::{LiveBed, Victim, LOCAL_GID_V6, LOCAL_IPV4, LOCAL_MAC, QKEY, VICTIM_QPN};
use super::{AddressChoice, KeyChoice, LocalSge, REMOTE_KEYS};
use crate::harness::{SendRequest, UdDestination};

/// A ring index as an input names it.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum IndexChoice {
    /// The host's head moved by a small delta.
    Head(i8),
    /// Any value.
    Raw(u16),
}

/// The destination of a UD send.
#[derive(Debug, Clone, Copy, Arbitrary)]
struct UdSpec {
    /// 0x13, 0x17, the victim (an RC QP of PD 2), or `raw_qpn`.
    which: u8,
    raw_qpn: u32,
    right_qkey: bool,
    qkey: u32,
    ipv6: bool,
    sgid_index: u8,
}

/// A send WQE built by the harness.
#[derive(Debug, Clone, Arbitrary)]
struct SendSpec {
    qp: u8,
    opcode: u8,
    sges: Vec<LocalSge>,
    inline: Option<Vec<u8>>,
    signaled: bool,
    fence: bool,
    solicited: bool,
    immediate: KeyChoice,
    remote_address: AddressChoice,
    rkey: KeyChoice,
    swap_add: u64,
    compare: u64,
    ud: UdSpec,
    ring: bool,
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
enum Op {
    /// A send WQE the harness encodes.
    Send(Box<SendSpec>),
    /// 64 raw bytes as the next send WQE (owner bit made right if asked), and raw
    /// extended SGEs after the QP's SGE head.
    RawSend {
        qp: u8,
        wqe: [u8; 64],
        right_owner: bool,
        extended: Vec<[u8; 16]>,
        ring: bool,
    },
    /// A receive WQE.
    Recv { qp: u8, sges: Vec<LocalSge> },
    /// A raw receive WQE.
    RawRecv { qp: u8, wqe: Vec<u8> },
    /// A WQE to SRQ 1.
    Srq { sges: Vec<LocalSge> },
    /// An SQ (`send`) or RQ doorbell of QP `qp` with any producer index.
    Doorbell { qp: u8, send: bool, index: IndexChoice },
    /// An SRQ doorbell with any producer index.
    SrqDoorbell(IndexChoice),
    /// A CQ doorbell of CQ 1 or 3 (set-CI or arm) with any index.
    CqDoorbell {
        cq: bool,
        arm: bool,
        solicited: bool,
        index: u32,
    },
    /// Let 2^(n mod 34) ns of virtual time pass.
    Advance(u8),
    /// Poll CQ `cq`.
    PollCq(u8),
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
        for op in ops {
            apply(bed, op);
        }
        bed.finish(&[QpState::Rts, QpState::Err]);
    });
}

/// Sends of this service may use these opcodes as the harness encodes them.
const OPCODES: [SqOpcode; 8] = [
    SqOpcode::Send,
    SqOpcode::SendWithInv,
    SqOpcode::SendWithImm,
    SqOpcode::RdmaWrite,
    SqOpcode::RdmaWriteWithImm,
    SqOpcode::RdmaRead,
    SqOpcode::AtomCmpAndSwap,
    SqOpcode::AtomFetchAndAdd,
];

fn apply(bed: &mut LiveBed, op: Op) {
    match op {
        Op::Send(spec) => send(bed, &spec),
        Op::RawSend {
            qp,
            mut wqe,
            right_owner,
            extended,
            ring,
        } => {
            let index = bed.qp_index(qp);
            let b_key = bed.region(2).key;
            let mut qp = bed.qps[index].qp.clone();
            // Nobody names region B: an lkey of B where an SGE may sit becomes another.
            for at in [36, 52] {
                never_b(&mut wqe[at..at + 4], b_key);
            }
            if right_owner {
                let owner = sq_owner_bit(qp.sq_head, qp.sq_depth());
                // OWNER is bit 7 of the first dword in both send WQE layouts.
                wqe[0] = (wqe[0] & !0x80) | (u8::from(owner) << 7);
            }
            let _ = bed.h.memory.write(qp.sq_wqe_address(qp.sq_head), &wqe);
            for (i, slot) in extended.iter().take(64).enumerate() {
                let mut slot = *slot;
                never_b(&mut slot[4..8], b_key);
                let _ = bed.h.memory.write(qp.sge_address(qp.sge_head + i as u32), &slot);
            }
            qp.sq_head = qp.sq_head.wrapping_add(1);
            if ring {
                bed.h.ring_send(&qp);
            }
            bed.qps[index].qp = qp;
        }
        Op::Recv { qp, sges } => {
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
        Op::RawRecv { qp, mut wqe } => {
            let index = bed.qp_index(qp);
            let mut qp = bed.qps[index].qp.clone();
            if qp.spec.srq.is_some() {
                return;
            }
            let stride = 16usize << qp.spec.rq_sge_shift;
            wqe.resize(stride, 0);
            let b_key = bed.region(2).key;
            for slot in wqe.chunks_mut(16) {
                never_b(&mut slot[4..8], b_key);
            }
            let _ = bed.h.memory.write(qp.rq_wqe_address(qp.rq_head), &wqe);
            qp.rq_head = qp.rq_head.wrapping_add(1);
            bed.h.doorbell(Doorbell::rq(qp.qpn, qp.rq_head as u16).as_u64());
            bed.qps[index].qp = qp;
        }
        Op::Srq { sges } => {
            let slots = 1usize << bed.srq.sge_shift;
            let sges: Vec<_> = sges.iter().take(slots).map(|s| s.sge(bed)).collect();
            let mut srq = bed.srq.clone();
            bed.h.post_srq(&mut srq, &sges);
            bed.srq = srq;
        }
        Op::Doorbell { qp, send, index } => {
            let qp = &bed.qps[bed.qp_index(qp)].qp;
            let head = if send { qp.sq_head } else { qp.rq_head };
            let producer = choose_index(index, head);
            let word = if send {
                Doorbell::sq(qp.qpn, producer, 0)
            } else {
                Doorbell::rq(qp.qpn, producer)
            };
            bed.h.doorbell(word.as_u64());
        }
        Op::SrqDoorbell(index) => {
            let producer = choose_index(index, bed.srq.head);
            bed.h.doorbell(Doorbell::srq(bed.srq.srqn, producer).as_u64());
        }
        Op::CqDoorbell {
            cq,
            arm,
            solicited,
            index,
        } => {
            let cqn = if cq { 1 } else { 3 };
            let word = if arm {
                CqDoorbell::arm(cqn, index & 0xFF_FFFF, (index >> 24) as u8 & 3, solicited)
            } else {
                CqDoorbell::update(cqn, index & 0xFF_FFFF)
            };
            bed.h.doorbell(word.as_u64());
        }
        Op::Advance(n) => bed.advance(Picoseconds(1_000u64 << (n % 34))),
        Op::PollCq(cq) => {
            // CQ 1 or 3: the application's.
            let index = if cq & 1 == 0 { 0 } else { 2 };
            bed.poll_cq(index);
        }
    }
    bed.drain_transmit();
}

fn choose_index(index: IndexChoice, head: u32) -> u16 {
    match index {
        IndexChoice::Head(delta) => head.wrapping_add(delta as i32 as u32) as u16,
        IndexChoice::Raw(value) => value,
    }
}

/// Changes a little-endian key field equal to region B's key.
fn never_b(field: &mut [u8], b_key: u32) {
    if u32::from_le_bytes([field[0], field[1], field[2], field[3]]) == b_key {
        field[0] ^= 1;
    }
}

fn send(bed: &mut LiveBed, spec: &SendSpec) {
    let index = bed.qp_index(spec.qp);
    let mut qp = bed.qps[index].qp.clone();
    let opcode = OPCODES[usize::from(spec.opcode) % OPCODES.len()];
    let mut request = SendRequest::new(opcode, spec.sges.iter().take(16).map(|s| s.sge(bed)).collect());
    request.inline = spec.inline.as_ref().map(|data| data[..data.len().min(1024)].to_vec());
    request.signaled = spec.signaled;
    request.fence = spec.fence;
    request.solicited = spec.solicited;
    // Immediate data, or for SEND_WITH_INV the rkey to invalidate.
    request.immediate = spec.immediate.key(bed, REMOTE_KEYS);
    request.remote_va = spec.remote_address.address(bed);
    request.rkey = spec.rkey.key(bed, REMOTE_KEYS);
    request.swap_add = spec.swap_add;
    request.compare = spec.compare;
    if qp.spec.service == ServiceType::Ud {
        let ud = spec.ud;
        let dest_qpn = match ud.which % 4 {
            0 => 0x13,
            1 => 0x17,
            2 => VICTIM_QPN,
            _ => ud.raw_qpn & 0xFF_FFFF,
        };
        let (dgid, sgid_index) = if ud.ipv6 {
            (LOCAL_GID_V6, 1)
        } else {
            (rnic_hw_model::wire::ipv4_to_gid(LOCAL_IPV4), 0)
        };
        request.ud = Some(UdDestination {
            dmac: LOCAL_MAC,
            dgid,
            dest_qpn,
            qkey: if ud.right_qkey { QKEY } else { ud.qkey },
            sgid_index: if ud.sgid_index < 200 { sgid_index } else { ud.sgid_index },
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        });
    }
    // The SGE list and inline area as the harness lays them out must fit the ring.
    if request.inline.is_none() && request.sges.len() > usize::from(u8::MAX) {
        return;
    }
    bed.h.post_send(&mut qp, &request);
    if spec.ring {
        bed.h.ring_send(&qp);
    }
    bed.qps[index].qp = qp;
}
