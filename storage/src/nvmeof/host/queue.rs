//! One NVMe queue on the host: an RC QP and its CQ, a command capsule slot and a
//! response receive per queue entry. The data buffers a command points at live in a
//! [`BufferPool`](crate::rdma::memory::BufferPool) the host keeps across reconnects.
//!
//! A command identifier is its slot in the low bits and a generation in the high bits,
//! so a response naming a slot's previous command (a duplicate, a target bug, a hostile
//! target) is recognised and ignored.

use rnic_verbs::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpCapabilities, QpInitAttributes, QpType,
    QueuePair, RecvWorkRequest, SendFlags, SendWorkRequest, WorkCompletion,
};

use crate::nvmeof::wire::command::Command;
use crate::nvmeof::wire::cqe::{CqeRepr, CQE_LEN};
use crate::nvmeof::wire::sqe::SQE_LEN;
use crate::rdma::{Connection, DataBuffer, SlotRegion};

/// Receives posted with one doorbell at most.
const RECEIVE_BATCH: usize = 32;

/// Command SENDs posted with one doorbell at most.
const SEND_BATCH: usize = 32;

/// Slot bits of a command identifier (queues of up to 1024 entries).
pub(crate) const CID_SLOT_BITS: u32 = 10;

/// What a work request was for: bit 63 set for receives, the slot below.
pub(crate) fn send_wr_id(slot: usize) -> u64 {
    slot as u64
}

pub(crate) fn receive_wr_id(slot: usize) -> u64 {
    1 << 63 | slot as u64
}

/// Where a command's data is on the host.
#[derive(Debug)]
pub(crate) enum HostBuffer {
    /// No data.
    None,
    /// In the queue's pool.
    Pool(DataBuffer),
    /// In a region registered for this command alone, invalidated by the target's
    /// response; the pool buffer receives or supplies the bytes.
    Invalidating { pool: DataBuffer, mr: MemoryRegion },
}

/// A command waiting for its response and its send completion.
#[derive(Debug)]
pub(crate) struct Outstanding {
    pub cid: u16,
    pub command: Command,
    pub buffer: HostBuffer,
    /// Who asked: the caller's tag, or an internal purpose.
    pub owner: Owner,
    pub submitted_ns: u64,
    pub response: Option<CqeRepr>,
    pub send_done: bool,
    /// The rkey the response must invalidate, if the command asked for it.
    pub expect_invalidate: Option<u32>,
    pub invalidated: Option<u32>,
}

/// Who waits for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A caller of the I/O interface, with its tag.
    Io(u64),
    /// A blocking admin call.
    Blocking,
    /// The host's own Keep Alive.
    KeepAlive,
    /// The host's own Asynchronous Event Request.
    AsyncEvent,
    /// A raw capsule of a test.
    Raw,
}

/// The RDMA part of a host queue (rebuilt on reconnect).
pub(crate) struct HostQueue {
    // Drop order: QP, CQ, then memory.
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub connection: Box<dyn Connection>,
    pub capsules: Capsules,
    pub responses: SlotRegion,
    pub entries: u16,
    pub slots: Vec<Option<Outstanding>>,
    pub generations: Vec<u16>,
    pub free: Vec<usize>,
    pub completions: Vec<WorkCompletion>,
    /// Capsules written and waiting for [`HostQueue::flush_sends`]: (slot, bytes).
    pub pending_sends: Vec<(usize, usize)>,
}

/// The command capsules of a queue, laid out as Linux's and SPDK's hosts keep them:
/// the SQEs in a dense array of 64-byte commands, in-capsule data in a buffer per slot
/// of its own, sent as a second SGE. A read's SEND then reads its 64 bytes from a
/// few shared cache lines and pages instead of one page per command.
pub(crate) struct Capsules {
    pub commands: SlotRegion,
    pub data: Option<SlotRegion>,
}

impl Capsules {
    /// Bytes a capsule can have: an SQE and the in-capsule data.
    pub fn capacity(&self) -> usize {
        SQE_LEN + self.data.as_ref().map_or(0, SlotRegion::slot_size)
    }

    /// Writes `capsule` (SQE, then in-capsule data) into `slot`; returns its SGEs and
    /// how many of the two it uses. A capsule shorter than an SQE (a test's malformed
    /// one) is sent as it is.
    fn write(&self, slot: usize, capsule: &[u8]) -> Result<([rnic_verbs::Sge; 2], usize), String> {
        if capsule.len() > self.capacity() {
            return Err(format!(
                "a {}-byte capsule: an SQE and at most {} bytes of data",
                capsule.len(),
                self.capacity() - SQE_LEN
            ));
        }
        let (sqe, data) = capsule.split_at(capsule.len().min(SQE_LEN));
        self.commands.write(slot, sqe).map_err(|e| e.to_string())?;
        let command = self.commands.sge(slot, sqe.len());
        match (&self.data, data.len()) {
            (_, 0) => Ok(([command, rnic_verbs::Sge::default()], 1)),
            (Some(region), length) => {
                region.write(slot, data).map_err(|e| e.to_string())?;
                Ok(([command, region.sge(slot, length)], 2))
            }
            (None, _) => Err("in-capsule data on a queue that sends none".into()),
        }
    }
}

impl HostQueue {
    /// Creates the QP (RESET), CQ and capsule memory of a queue of `entries` commands
    /// with `in_capsule` bytes of data per capsule.
    pub fn create(
        context: &Context,
        pd: &ProtectionDomain,
        entries: u16,
        in_capsule: usize,
    ) -> rnic_verbs::Result<(QueuePair, CompletionQueue, Capsules, SlotRegion)> {
        let depth = u32::from(entries);
        let cq = context.create_cq(2 * depth + 4, None, 0)?;
        let qp = pd.create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: depth + 2,
                max_recv_wr: depth,
                // The SQE and the in-capsule data come from two buffers.
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })?;
        let capsules = Capsules {
            commands: SlotRegion::new(pd, usize::from(entries), SQE_LEN, AccessFlags::LOCAL_WRITE)?,
            data: match in_capsule {
                0 => None,
                size => Some(SlotRegion::new(
                    pd,
                    usize::from(entries),
                    size,
                    AccessFlags::LOCAL_WRITE,
                )?),
            },
        };
        let responses = SlotRegion::new(pd, usize::from(entries), CQE_LEN, AccessFlags::LOCAL_WRITE)?;
        Ok((qp, cq, capsules, responses))
    }

    /// Posts the receive for response slot `slot`.
    pub fn post_receive(&self, slot: usize) -> Result<(), rnic_verbs::PostError> {
        let sge = [self.responses.sge(slot, CQE_LEN)];
        self.qp.post_recv(&[RecvWorkRequest {
            wr_id: receive_wr_id(slot),
            sg_list: &sge,
        }])
    }

    /// Posts the receives of response slots `slots`, up to [`RECEIVE_BATCH`] per
    /// doorbell: a poll's worth of responses costs one MMIO write, not one each.
    pub fn post_receives(&self, slots: &[usize]) -> Result<(), rnic_verbs::PostError> {
        for chunk in slots.chunks(RECEIVE_BATCH) {
            let mut sges = [rnic_verbs::Sge::default(); RECEIVE_BATCH];
            for (sge, &slot) in sges.iter_mut().zip(chunk) {
                *sge = self.responses.sge(slot, CQE_LEN);
            }
            let mut requests = [RecvWorkRequest::default(); RECEIVE_BATCH];
            for ((request, sge), &slot) in requests.iter_mut().zip(&sges).zip(chunk) {
                *request = RecvWorkRequest {
                    wr_id: receive_wr_id(slot),
                    sg_list: std::slice::from_ref(sge),
                };
            }
            self.qp.post_recv(&requests[..chunk.len()])?;
        }
        Ok(())
    }

    /// A free slot and the CID it gives the next command.
    pub fn take_slot(&mut self) -> Option<(usize, u16)> {
        let slot = self.free.pop()?;
        let generation = self.generations[slot].wrapping_add(1) & ((1 << (16 - CID_SLOT_BITS)) - 1);
        self.generations[slot] = generation;
        Some((slot, generation << CID_SLOT_BITS | slot as u16))
    }

    /// Writes `capsule` into command slot `slot` and SENDs it (after any SENDs still
    /// queued, so the queue's commands leave in the order they were given).
    pub fn send_capsule(&mut self, slot: usize, capsule: &[u8]) -> Result<(), String> {
        self.flush_sends()?;
        let (sges, used) = self.capsules.write(slot, capsule)?;
        self.qp
            .post_send(&[SendWorkRequest {
                wr_id: send_wr_id(slot),
                sg_list: &sges[..used],
                send_flags: SendFlags::SIGNALED,
                ..Default::default()
            }])
            .map_err(|e| e.to_string())
    }

    /// Writes `capsule` into command slot `slot` and queues its SEND for the next
    /// [`HostQueue::flush_sends`] (SPDK's delayed submission: the commands of one
    /// submission burst share a doorbell).
    pub fn queue_capsule(&mut self, slot: usize, capsule: &[u8]) -> Result<(), String> {
        self.capsules.write(slot, capsule)?;
        self.pending_sends.push((slot, capsule.len()));
        Ok(())
    }

    /// Posts the SENDs [`HostQueue::queue_capsule`] queued, in order, up to
    /// [`SEND_BATCH`] per doorbell.
    pub fn flush_sends(&mut self) -> Result<(), String> {
        while !self.pending_sends.is_empty() {
            let count = self.pending_sends.len().min(SEND_BATCH);
            let mut sges = [([rnic_verbs::Sge::default(); 2], 0usize); SEND_BATCH];
            for (sge, &(slot, length)) in sges.iter_mut().zip(&self.pending_sends[..count]) {
                let command = self.capsules.commands.sge(slot, SQE_LEN);
                *sge = match (&self.capsules.data, length.saturating_sub(SQE_LEN)) {
                    (Some(data), extra) if extra > 0 => ([command, data.sge(slot, extra)], 2),
                    _ => ([command, rnic_verbs::Sge::default()], 1),
                };
            }
            let mut requests = [SendWorkRequest::default(); SEND_BATCH];
            for ((request, (sge, used)), &(slot, _)) in requests.iter_mut().zip(&sges).zip(&self.pending_sends[..count])
            {
                *request = SendWorkRequest {
                    wr_id: send_wr_id(slot),
                    sg_list: &sge[..*used],
                    send_flags: SendFlags::SIGNALED,
                    ..Default::default()
                };
            }
            let result = self.qp.post_send(&requests[..count]);
            self.pending_sends.drain(..count);
            result.map_err(|e| format!("posting command SENDs: {e}"))?;
        }
        Ok(())
    }

    /// The slot a CID names, if the CID is that slot's current command.
    pub fn slot_of(&self, cid: u16) -> Option<usize> {
        let slot = usize::from(cid) & ((1 << CID_SLOT_BITS) - 1);
        let generation = cid >> CID_SLOT_BITS;
        let outstanding = self.slots.get(slot)?.as_ref()?;
        (self.generations[slot] == generation && outstanding.cid == cid).then_some(slot)
    }
}
