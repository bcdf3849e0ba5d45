//! Posting work requests (rdma-core `hns_roce_u_v2_post_send` / `_post_recv` /
//! `_post_srq_recv`): checks as ibverbs does, WQEs written into the rings exactly as hns
//! §7 lays them out, one doorbell per call.
//!
//! * SQ WQE `n` is the 64-byte slot `n & (depth − 1)`; its owner bit is
//!   [`sq_owner_bit`]. RC/UC WQEs hold up to two SGEs (or ≤ 32 inline bytes, or SGE 0
//!   plus the atomic segment); the other SGEs, and larger inline payloads, go to the
//!   extended SGE ring from the QP's running `next_sge` (masked into
//!   `MSG_START_SGE_IDX`), wrapping at its end. UD WQEs carry the destination and put
//!   every SGE in the extended ring; ≤ 8 inline bytes are packed into spare fields.
//! * Receive WQEs are SGE arrays (zero-length SGEs skipped, unused slots zeroed: this
//!   device reserves no terminator SGE). An SRQ WQE goes into a free slot from a bitmap
//!   and the slot number into the index queue at its head.
//! * The WQE's first word (opcode, owner) is part of the single 64-byte store of the WQE,
//!   made after its extended SGEs, so the device never sees a WQE whose SGEs are missing.
//!
//! Nothing here allocates: WQEs are built on the stack, inline payloads stream through a
//! stack buffer, and errors are plain values.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::caps::CapFlags;
use rnic_firmware_if::wqe::{
    sq_owner_bit, RcSqWqe, Sge as WqeSge, SqOpcode, UdSqWqe, MAX_INLINE_IN_WQE, SGES_IN_RC_WQE, SGE_SIZE,
    SQ_WQE_HEADER_SIZE, SQ_WQE_SIZE,
};

use super::context::MAX_MESSAGE_SIZE;
use super::qp::{udp_source_port, QpInner, QpState, QpType, QueuePair, SendQueue};
use super::srq::{SharedReceiveQueue, SrqInner};
use super::wr::{PostError, PostErrorKind, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, WrOpcode};
use crate::device_access::DeviceAccess;

/// Inline payload packed into a UD WQE's spare fields (`HNS_ROCE_MAX_UD_INL_INN_SZ`).
const MAX_UD_INLINE_IN_WQE: u64 = 8;
/// Stack buffer for streaming inline payloads and receive WQEs.
const CHUNK: usize = 256;

impl WrOpcode {
    /// The hns WQE opcode (§7.2).
    pub fn hardware_opcode(self) -> SqOpcode {
        match self {
            Self::RdmaWrite => SqOpcode::RdmaWrite,
            Self::RdmaWriteWithImm => SqOpcode::RdmaWriteWithImm,
            Self::Send => SqOpcode::Send,
            Self::SendWithImm => SqOpcode::SendWithImm,
            Self::RdmaRead => SqOpcode::RdmaRead,
            Self::AtomicCmpSwp => SqOpcode::AtomCmpAndSwap,
            Self::AtomicFetchAdd => SqOpcode::AtomFetchAndAdd,
            Self::SendWithInv => SqOpcode::SendWithInv,
        }
    }
}

/// What one send WQE needs besides the work request (read once per post call).
#[derive(Clone, Copy)]
struct SendContext {
    qkey: u32,
    path_mtu: u32,
    service_level: u8,
    mac: [u8; 6],
}

/// A CPU view of the extended SGE ring: bytes written from a slot on wrap at the end.
struct SgeRing<'a> {
    access: &'a dyn DeviceAccess,
    base: u64,
    bytes: u64,
    position: u64,
}

impl<'a> SgeRing<'a> {
    fn at(qp: &'a QpInner, slot: u32) -> Self {
        let slots = u64::from(qp.info.sge_count);
        Self {
            access: &*qp.pd.context.access,
            base: qp.buffer_base + qp.info.region_offsets[1],
            bytes: slots * SGE_SIZE as u64,
            position: (u64::from(slot) & slots.saturating_sub(1)) * SGE_SIZE as u64,
        }
    }

    fn write(&mut self, mut data: &[u8]) -> Result<(), PostErrorKind> {
        if self.bytes == 0 && !data.is_empty() {
            // The geometry gives every QP whose SGE or inline limits need the ring a ring,
            // and the checks keep requests within those limits: this is a driver bug.
            debug_assert!(false, "extended SGEs for a QP without an extended SGE ring");
            return Err(PostErrorKind::TooManySges { given: 0, max: 0 });
        }
        while !data.is_empty() {
            let room = (self.bytes - self.position) as usize;
            let (now, rest) = data.split_at(room.min(data.len()));
            self.access
                .dma_write(self.base + self.position, now)
                .map_err(|_| PostErrorKind::Destroyed)?;
            self.position = (self.position + now.len() as u64) % self.bytes;
            data = rest;
        }
        Ok(())
    }
}

fn wqe_sge(sge: &Sge) -> WqeSge {
    WqeSge::new(sge.length, sge.lkey, sge.addr)
}

impl QpInner {
    /// The CPU copy of inline data: the bytes of `sges` in order, handed to `sink` in
    /// chunks. An SGE's address is an iova of the region of its lkey when that region
    /// holds the range (the application's registered memory, possibly scattered), else a
    /// bus address of driver DMA memory — the embedded stand-in for "process memory".
    fn gather_inline(
        &self,
        sges: &[Sge],
        mut sink: impl FnMut(&[u8]) -> Result<(), PostErrorKind>,
    ) -> Result<(), PostErrorKind> {
        let context = &self.pd.context;
        let mut chunk = [0u8; CHUNK];
        for sge in sges.iter().filter(|s| s.length > 0) {
            let region = context.find_mr(sge.lkey);
            let mut done = 0u32;
            while done < sge.length {
                let n = (sge.length - done).min(CHUNK as u32) as usize;
                let address = sge.addr + u64::from(done);
                let out = &mut chunk[..n];
                let read = match &region {
                    Some(mr) if mr.cpu_read(address, out) => true,
                    _ => context.access.dma_read(address, out).is_ok(),
                };
                if !read {
                    return Err(PostErrorKind::BadAddress { addr: address });
                }
                sink(out)?;
                done += n as u32;
            }
        }
        Ok(())
    }

    /// Checks one send work request and writes its WQE at free-running index `index`;
    /// returns the service level it goes out with. `sq.next_sge` moves only on success.
    fn write_send_wqe(
        &self,
        sq: &mut SendQueue,
        index: u32,
        wr: &SendWorkRequest<'_>,
        context: SendContext,
    ) -> Result<(u8, [u8; SQ_WQE_SIZE]), PostErrorKind> {
        let qp_type = self.qp_type;
        let opcode = wr.opcode;
        let cap = self.cap();
        if !opcode.allowed_on(qp_type) {
            return Err(PostErrorKind::OpcodeNotSupported { opcode, qp_type });
        }
        if wr.sg_list.len() > cap.max_send_sge as usize {
            return Err(PostErrorKind::TooManySges {
                given: wr.sg_list.len(),
                max: cap.max_send_sge,
            });
        }
        // rdma-core gathers only SGE 0 for an atomic and ignores INLINE there.
        let sges = if opcode.is_atomic() {
            wr.sg_list.get(..1).ok_or(PostErrorKind::MissingAtomicBuffer)?
        } else {
            wr.sg_list
        };
        let inline = wr.send_flags.contains(SendFlags::INLINE) && !opcode.is_atomic();
        if inline && opcode == WrOpcode::RdmaRead {
            return Err(PostErrorKind::OpcodeNotSupported { opcode, qp_type });
        }
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(MAX_MESSAGE_SIZE) {
            return Err(PostErrorKind::MessageTooLong { length: total });
        }
        let in_wqe_inline = if qp_type == QpType::Ud {
            MAX_UD_INLINE_IN_WQE
        } else {
            MAX_INLINE_IN_WQE as u64
        };
        let inline_slots = total.div_ceil(SGE_SIZE as u64) as u32;
        if inline {
            let max = cap.max_inline_data.min(context.path_mtu);
            if total > u64::from(max) {
                return Err(PostErrorKind::InlineTooLong { length: total, max });
            }
            if total > in_wqe_inline && inline_slots > self.ext_sge_per_wqe() {
                return Err(PostErrorKind::InlineTooLong {
                    length: total,
                    max: self.ext_sge_per_wqe() * SGE_SIZE as u32,
                });
            }
        }
        let ud = if qp_type == QpType::Ud {
            let ud = wr.ud.ok_or(PostErrorKind::BadAddressHandle)?;
            if !Arc::ptr_eq(&ud.ah.pd.context, &self.pd.context) {
                return Err(PostErrorKind::BadAddressHandle);
            }
            Some(ud)
        } else {
            None
        };

        let depth = self.info.sq_depth;
        let owner = sq_owner_bit(index, depth);
        let signaled = wr.send_flags.contains(SendFlags::SIGNALED) || self.sq_sig_all;
        let start = sq.next_sge;
        let start_field = start & self.info.sge_count.saturating_sub(1);
        let valid = sges.iter().filter(|s| s.length > 0).count() as u32;
        let immediate = if opcode.has_immediate() { wr.imm_data } else { 0 };
        let mut next_sge = start;
        let mut ring = SgeRing::at(self, start);
        let mut service_level = context.service_level;

        let bytes: [u8; SQ_WQE_SIZE] = if let Some(ud) = ud {
            let ah = ud.ah.attributes();
            let mut wqe = UdSqWqe::zeroed();
            wqe.set_opcode(opcode.hardware_opcode().into());
            wqe.set_owner(owner);
            wqe.set_signaled(signaled);
            wqe.set_solicited_event(wr.send_flags.contains(SendFlags::SOLICITED));
            wqe.set_inline(inline);
            wqe.set_immediate_data(immediate);
            wqe.set_protection_domain(ud.ah.pd_number());
            wqe.set_message_start_sge_index(start_field);
            wqe.set_udp_source_port(udp_source_port(ah.flow_label, self.qpn, ud.remote_qpn));
            wqe.set_qkey(if ud.remote_qkey & 0x8000_0000 != 0 {
                context.qkey
            } else {
                ud.remote_qkey
            });
            wqe.set_destination_qpn(ud.remote_qpn);
            wqe.set_hop_limit(ah.hop_limit);
            wqe.set_traffic_class(ah.traffic_class);
            wqe.set_flow_label(ah.flow_label);
            wqe.set_service_level(ah.sl);
            wqe.set_loopback(ah.dmac == context.mac);
            wqe.set_dmac(ah.dmac);
            wqe.set_sgid_index(ah.sgid_index);
            wqe.set_dgid(ah.dgid.raw());
            wqe.set_message_length(total as u32);
            wqe.set_sge_count(valid as u8);
            service_level = ah.sl;
            if inline && total <= MAX_UD_INLINE_IN_WQE {
                // The packed payload overlays SGE_NUM and MSG_START_SGE_IDX (§7.4).
                let mut packed = [0u8; 8];
                let mut at = 0;
                self.gather_inline(sges, |piece| {
                    packed[at..at + piece.len()].copy_from_slice(piece);
                    at += piece.len();
                    Ok(())
                })?;
                wqe.set_packed_inline_data(u64::from_le_bytes(packed));
            } else if inline {
                wqe.set_inline_type(true);
                self.gather_inline(sges, |piece| ring.write(piece))?;
                wqe.set_sge_count(inline_slots as u8);
                next_sge += inline_slots;
            } else {
                for sge in sges.iter().filter(|s| s.length > 0) {
                    ring.write(&wqe_sge(sge).0)?;
                    next_sge += 1;
                }
            }
            wqe.0
        } else {
            let mut wqe = RcSqWqe::zeroed();
            wqe.set_opcode(opcode.hardware_opcode().into());
            wqe.set_owner(owner);
            wqe.set_signaled(signaled);
            wqe.set_fence(wr.send_flags.contains(SendFlags::FENCE));
            wqe.set_solicited_event(wr.send_flags.contains(SendFlags::SOLICITED));
            wqe.set_inline(inline);
            match opcode {
                WrOpcode::SendWithInv => wqe.set_inv_key(wr.invalidate_rkey),
                _ => wqe.set_immediate_data(immediate),
            }
            match opcode {
                WrOpcode::RdmaRead | WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => {
                    wqe.set_remote_address(wr.rdma.remote_addr);
                    wqe.set_rkey(wr.rdma.rkey);
                }
                WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => {
                    wqe.set_remote_address(wr.atomic.remote_addr);
                    wqe.set_rkey(wr.atomic.rkey);
                }
                WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => {}
            }
            wqe.set_message_start_sge_index(start_field);
            wqe.set_message_length(total as u32);
            wqe.set_sge_count(valid as u8);
            if opcode.is_atomic() {
                if let Some(sge) = sges.iter().find(|s| s.length > 0) {
                    wqe.set_sge(0, wqe_sge(sge));
                }
                let (swap_add, compare) = match opcode {
                    WrOpcode::AtomicCmpSwp => (wr.atomic.swap, wr.atomic.compare_add),
                    _ => (wr.atomic.compare_add, 0),
                };
                wqe.set_atomic_swap_add(swap_add);
                wqe.set_atomic_compare(compare);
            } else if inline && total <= MAX_INLINE_IN_WQE as u64 {
                let mut at = SQ_WQE_HEADER_SIZE;
                self.gather_inline(sges, |piece| {
                    wqe.0[at..at + piece.len()].copy_from_slice(piece);
                    at += piece.len();
                    Ok(())
                })?;
            } else if inline {
                wqe.set_inline_type(true);
                self.gather_inline(sges, |piece| ring.write(piece))?;
                wqe.set_sge_count(inline_slots as u8);
                next_sge += inline_slots;
            } else {
                for (n, sge) in sges.iter().filter(|s| s.length > 0).enumerate() {
                    if n < SGES_IN_RC_WQE {
                        wqe.set_sge(n, wqe_sge(sge));
                    } else {
                        ring.write(&wqe_sge(sge).0)?;
                        next_sge += 1;
                    }
                }
            }
            wqe.0
        };

        let slot = u64::from(index & (depth - 1));
        let address = self.buffer_base + self.info.region_offsets[0] + slot * SQ_WQE_SIZE as u64;
        self.pd
            .context
            .access
            .dma_write(address, &bytes)
            .map_err(|_| PostErrorKind::Destroyed)?;
        sq.wrid[slot as usize] = wr.wr_id;
        sq.next_sge = next_sge;
        Ok((service_level, bytes))
    }
}

/// Writes an SGE array of `slots` entries at `address` (receive WQE format, §7.5) through
/// a stack buffer.
fn write_sge_array(access: &dyn DeviceAccess, address: u64, sges: &[Sge], slots: u32) -> Result<(), PostErrorKind> {
    let mut chunk = [0u8; CHUNK];
    let per_chunk = CHUNK / SGE_SIZE;
    let mut valid = sges.iter().filter(|s| s.length > 0);
    let mut written = 0usize;
    let total = slots as usize;
    while written < total {
        let count = per_chunk.min(total - written);
        for entry in chunk.chunks_exact_mut(SGE_SIZE).take(count) {
            match valid.next() {
                Some(sge) => entry.copy_from_slice(&wqe_sge(sge).0),
                None => entry.fill(0),
            }
        }
        access
            .dma_write(address + (written * SGE_SIZE) as u64, &chunk[..count * SGE_SIZE])
            .map_err(|_| PostErrorKind::Destroyed)?;
        written += count;
    }
    Ok(())
}

impl QueuePair {
    /// `ibv_post_send`: writes one WQE per work request into the SQ and rings the SQ
    /// doorbell once with the new producer index.
    ///
    /// Checked as rdma-core's hns provider does: the QP must be in RTS, SQD or ERR
    /// (posting to ERR completes the requests with `WrFlushErr`); the queue must have
    /// room ([`PostErrorKind::QueueFull`], `ENOMEM`); SGE count, inline length (at most
    /// `max_inline_data` and the path MTU), the opcode for the QP type, and a UD
    /// destination (all `EINVAL`).
    ///
    /// # Errors
    /// [`PostError`]: the requests before [`PostError::index_of_bad_wr`] are posted.
    pub fn post_send(&self, wrs: &[SendWorkRequest<'_>]) -> Result<(), PostError> {
        let inner = &*self.inner;
        let bad = |index_of_bad_wr, error| PostError { index_of_bad_wr, error };
        let context = {
            let soft = inner.soft();
            if matches!(soft.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                return Err(bad(0, PostErrorKind::InvalidState(soft.state)));
            }
            SendContext {
                qkey: soft.qkey,
                path_mtu: soft.path_mtu,
                service_level: soft.service_level,
                mac: inner.pd.context.info.mac,
            }
        };
        if inner.released.load(Ordering::Acquire) {
            return Err(bad(0, PostErrorKind::Destroyed));
        }
        let depth = inner.info.sq_depth;
        let mut sq = inner.sq();
        let mut result = Ok(());
        let mut posted = 0u32;
        let mut service_level = None;
        let mut last_wqe = [0u8; SQ_WQE_SIZE];
        for wr in wrs {
            if sq.head.wrapping_sub(sq.tail).wrapping_add(posted) >= depth {
                result = Err(bad(posted as usize, PostErrorKind::QueueFull));
                break;
            }
            let index = sq.head.wrapping_add(posted);
            match inner.write_send_wqe(&mut sq, index, wr, context) {
                Ok((sl, wqe)) => {
                    service_level = Some(sl);
                    last_wqe = wqe;
                }
                Err(error) => {
                    result = Err(bad(posted as usize, error));
                    break;
                }
            }
            posted += 1;
        }
        if let Some(service_level) = service_level {
            sq.head = sq.head.wrapping_add(posted);
            // The device masks the 16-bit PI with the depth; a QP in ERR flushes on it.
            // One WQE on a device with direct WQE: it goes with the doorbell (§6.4), so
            // the device need not fetch it.
            if posted == 1 && inner.pd.context.info.caps.flags.contains(CapFlags::DIRECT_WQE) {
                inner.ring_sq_direct_wqe(last_wqe, sq.head as u16, service_level);
            } else {
                inner.ring_sq_doorbell(sq.head as u16, service_level);
            }
        }
        result
    }

    /// `ibv_post_recv`: writes one receive WQE per work request into the RQ and rings
    /// the RQ doorbell once.
    ///
    /// # Errors
    /// [`PostError`]: in RESET, with an SRQ, with too many SGEs (`EINVAL`), or with a full
    /// queue (`ENOMEM`); the requests before [`PostError::index_of_bad_wr`] are posted.
    pub fn post_recv(&self, wrs: &[RecvWorkRequest<'_>]) -> Result<(), PostError> {
        let inner = &*self.inner;
        let bad = |index_of_bad_wr, error| PostError { index_of_bad_wr, error };
        let state = inner.soft().state;
        if state == QpState::Reset {
            return Err(bad(0, PostErrorKind::InvalidState(state)));
        }
        if inner.srq.is_some() {
            return Err(bad(0, PostErrorKind::UsesSrq));
        }
        if inner.released.load(Ordering::Acquire) {
            return Err(bad(0, PostErrorKind::Destroyed));
        }
        let info = inner.info;
        let slots = info.rq_stride / SGE_SIZE as u32;
        let mut rq = inner.rq();
        let mut result = Ok(());
        let mut posted = 0u32;
        for wr in wrs {
            if wr.sg_list.len() > slots as usize {
                result = Err(bad(
                    posted as usize,
                    PostErrorKind::TooManySges {
                        given: wr.sg_list.len(),
                        max: slots,
                    },
                ));
                break;
            }
            if rq.head.wrapping_sub(rq.tail).wrapping_add(posted) >= info.rq_depth {
                result = Err(bad(posted as usize, PostErrorKind::QueueFull));
                break;
            }
            let slot = rq.head.wrapping_add(posted) & (info.rq_depth - 1);
            let address = inner.buffer_base + info.region_offsets[2] + u64::from(slot) * u64::from(info.rq_stride);
            if let Err(error) = write_sge_array(&*inner.pd.context.access, address, wr.sg_list, slots) {
                result = Err(bad(posted as usize, error));
                break;
            }
            rq.wrid[slot as usize] = wr.wr_id;
            posted += 1;
        }
        if posted > 0 {
            rq.head = rq.head.wrapping_add(posted);
            inner.ring_rq_doorbell(rq.head as u16);
        }
        result
    }
}

impl SrqInner {
    fn post(&self, wrs: &[RecvWorkRequest<'_>]) -> Result<(), PostError> {
        let bad = |index_of_bad_wr, error| PostError { index_of_bad_wr, error };
        if self.released.load(Ordering::Acquire) {
            return Err(bad(0, PostErrorKind::Destroyed));
        }
        let access = &*self.pd.context.access;
        let stride = u64::from(self.max_sge) * SGE_SIZE as u64;
        let mut state = self.state();
        let mut result = Ok(());
        let mut posted = 0u32;
        for wr in wrs {
            if wr.sg_list.len() > self.max_sge as usize {
                result = Err(bad(
                    posted as usize,
                    PostErrorKind::TooManySges {
                        given: wr.sg_list.len(),
                        max: self.max_sge,
                    },
                ));
                break;
            }
            let Some(slot) = state.take_slot() else {
                result = Err(bad(posted as usize, PostErrorKind::QueueFull));
                break;
            };
            let written = write_sge_array(
                access,
                self.wqe_base + u64::from(slot) * stride,
                wr.sg_list,
                self.max_sge,
            )
            .and_then(|()| {
                let entry = u64::from(state.head.wrapping_add(posted) & (self.depth - 1)) * 4;
                access
                    .dma_write(self.index_base + entry, &slot.to_le_bytes())
                    .map_err(|_| PostErrorKind::Destroyed)
            });
            if let Err(error) = written {
                state.free_slot(slot);
                result = Err(bad(posted as usize, error));
                break;
            }
            state.wrid[slot as usize] = wr.wr_id;
            posted += 1;
        }
        if posted > 0 {
            state.head = state.head.wrapping_add(posted);
            self.ring_doorbell(state.head as u16);
        }
        result
    }
}

impl SharedReceiveQueue {
    /// `ibv_post_srq_recv`: each work request takes a free WQE slot, whose number goes
    /// into the index queue at its head; one SRQ doorbell with the new head. Slots come
    /// back when their completions are polled.
    ///
    /// # Errors
    /// [`PostError`]: too many SGEs (`EINVAL`) or no free slot (`ENOMEM`); the requests
    /// before [`PostError::index_of_bad_wr`] are posted.
    pub fn post_srq_recv(&self, wrs: &[RecvWorkRequest<'_>]) -> Result<(), PostError> {
        self.inner.post(wrs)
    }
}
