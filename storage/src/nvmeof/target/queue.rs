//! One NVMe queue on the target: an RC QP with its CQ, a receive buffer, a response
//! buffer and a request per slot, and a pool of data buffers for RDMA READ and WRITE.
//!
//! Slot `i` owns receive buffer `i` and response buffer `i`: the receive is posted again
//! only when the command it carried has been answered and the answer's SEND completed
//! (the Linux and SPDK model), so a host that sends more than the queue holds meets
//! receive-not-ready at the transport, never an overwritten buffer.

use std::collections::VecDeque;

use rnic_verbs::{
    AccessFlags, CompletionQueue, Context, ProtectionDomain, QpCapabilities, QpInitAttributes, QpType, QueuePair,
    RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, WorkCompletion, WrOpcode,
};

use crate::nvmeof::wire::command::{Command, DataPointer};
use crate::nvmeof::wire::cqe::{CqeRepr, CQE_LEN};
use crate::nvmeof::wire::sqe::SQE_LEN;
use crate::rdma::{BufferPool, Connection, DataBuffer, SlotRegion};

/// Receives posted with one doorbell at most.
pub(crate) const RECEIVE_BATCH: usize = 32;

/// Responses (a data WRITE and a SEND each) posted with one doorbell at most.
pub(crate) const RESPONSE_BATCH: usize = 32;

/// A response written to its slot and waiting for [`TargetQueue::flush_responses`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingResponse {
    pub slot: usize,
    /// The command's data to the host first, if any.
    pub write: Option<PendingWrite>,
    /// The rkey the SEND invalidates, if the host asked for it.
    pub invalidate: Option<u32>,
}

/// The RDMA WRITE of a response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingWrite {
    pub local: rnic_verbs::Sge,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// What a work request was for: the top byte of its `wr_id`, the slot below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkKind {
    /// A receive of a command capsule.
    Receive = 1,
    /// An RDMA READ of the command's data from the host.
    ReadData = 2,
    /// An RDMA WRITE of the command's data to the host.
    WriteData = 3,
    /// The SEND of the response capsule.
    Response = 4,
}

pub(crate) fn wr_id(kind: WorkKind, slot: usize) -> u64 {
    (kind as u64) << 56 | slot as u64
}

pub(crate) fn decode_wr_id(wr_id: u64) -> Option<(WorkKind, usize)> {
    let slot = (wr_id & 0x00FF_FFFF_FFFF_FFFF) as usize;
    let kind = match wr_id >> 56 {
        1 => WorkKind::Receive,
        2 => WorkKind::ReadData,
        3 => WorkKind::WriteData,
        4 => WorkKind::Response,
        _ => return None,
    };
    Some((kind, slot))
}

/// Where a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Needs a data buffer from the pool.
    WaitingForBuffer,
    /// Has its buffer; waits for an RDMA READ credit.
    WaitingForRead,
    /// Its RDMA READ is in flight.
    Reading,
    /// Its data (if any) is here: it can execute.
    Ready,
    /// An Asynchronous Event Request parked until an event.
    ParkedAer,
}

/// A command the target is working on.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub cid: u16,
    pub command: Command,
    pub data: DataPointer,
    /// Bytes of data the command moves (checked against the SGL).
    pub length: u32,
    pub stage: Stage,
    pub buffer: Option<DataBuffer>,
    /// The command holds its CID in the queue's set (not a conflicting duplicate).
    pub owns_cid: bool,
}

/// A slot's state.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// Its receive is posted.
    Posted,
    /// Its receive carried a command being worked on.
    Busy(Request),
    /// Its response is posted; the receive is posted again when the SEND completes.
    Responding { buffer: Option<DataBuffer> },
    /// Not posted (the queue is closing).
    Idle,
}

/// Where the queue is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueState {
    /// Connected at the RDMA level; waiting for the Fabrics Connect.
    AwaitingConnect,
    /// Bound to controller `cntlid`.
    Connected { cntlid: u16 },
}

/// One target queue.
pub(crate) struct TargetQueue {
    // Field order is drop order: the QP goes before its CQ and the memory it used.
    pub qp: QueuePair,
    pub cq: CompletionQueue,
    pub connection: Box<dyn Connection>,
    pub receives: Receives,
    pub responses: SlotRegion,
    pub pool: BufferPool,
    /// QID from the CM request.
    pub qid: u16,
    /// Submission queue entries (HSQSIZE + 1).
    pub entries: u16,
    /// RDMA READs this QP may keep outstanding.
    pub initiator_depth: u32,
    pub reads_outstanding: u32,
    pub slots: Vec<Slot>,
    /// Slots in `WaitingForBuffer`/`WaitingForRead`, oldest first.
    pub waiting: VecDeque<usize>,
    /// Slots in `Ready`, oldest first.
    pub ready: VecDeque<usize>,
    /// Commands received and not yet answered.
    pub unanswered: u32,
    /// Command identifiers of the unanswered commands (a bit per CID).
    pub cids_in_use: Vec<u64>,
    /// Submission queue head: commands fetched, modulo `entries`.
    pub sq_head: u16,
    pub state: QueueState,
    /// Disconnect once every response in flight completed (Fabrics Disconnect).
    pub close_when_drained: bool,
    /// A peer description for logs.
    pub peer: String,
    pub completions: Vec<WorkCompletion>,
    /// Slots whose receive goes back at the end of this poll, all with one doorbell.
    pub reposts: Vec<usize>,
    /// Responses to post at the end of this poll, all with one doorbell.
    pub pending_responses: Vec<PendingResponse>,
}

/// Sizes of a queue being created.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueGeometry {
    pub slots: usize,
    pub in_capsule_size: usize,
    pub pool_bytes: usize,
}

impl TargetQueue {
    /// Marks `cid` in use; returns whether it already was.
    pub fn claim_cid(&mut self, cid: u16) -> bool {
        let (word, bit) = (usize::from(cid) / 64, 1u64 << (cid % 64));
        let was = self.cids_in_use[word] & bit != 0;
        self.cids_in_use[word] |= bit;
        was
    }

    /// Marks `cid` free.
    pub fn release_cid(&mut self, cid: u16) {
        self.cids_in_use[usize::from(cid) / 64] &= !(1u64 << (cid % 64));
    }

    /// Creates the QP (in RESET), CQ and memory of a queue.
    pub fn create(
        context: &Context,
        pd: &ProtectionDomain,
        geometry: QueueGeometry,
    ) -> rnic_verbs::Result<(QueuePair, CompletionQueue, Receives, SlotRegion, BufferPool)> {
        let send_depth = 2 * geometry.slots as u32 + 4;
        let recv_depth = geometry.slots as u32;
        let cq = context.create_cq(send_depth + recv_depth, None, 0)?;
        let qp = pd.create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: send_depth,
                max_recv_wr: recv_depth,
                max_send_sge: 1,
                // The SQE and the in-capsule data land in two buffers.
                max_recv_sge: 2,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })?;
        let receives = Receives {
            commands: SlotRegion::new(pd, geometry.slots, SQE_LEN, AccessFlags::LOCAL_WRITE)?,
            in_capsule: match geometry.in_capsule_size {
                0 => None,
                size => Some(SlotRegion::new(pd, geometry.slots, size, AccessFlags::LOCAL_WRITE)?),
            },
        };
        let responses = SlotRegion::new(pd, geometry.slots, CQE_LEN, AccessFlags::LOCAL_WRITE)?;
        let pool = BufferPool::new(pd, geometry.pool_bytes, 4096, AccessFlags::LOCAL_WRITE)?;
        Ok((qp, cq, receives, responses, pool))
    }

    /// Posts receive `slot`.
    pub fn post_receive(&mut self, slot: usize) -> Result<(), rnic_verbs::PostError> {
        let (sges, count) = self.receives.sges(slot);
        self.qp.post_recv(&[RecvWorkRequest {
            wr_id: wr_id(WorkKind::Receive, slot),
            sg_list: &sges[..count],
        }])?;
        self.slots[slot] = Slot::Posted;
        Ok(())
    }

    /// Marks `slot`'s receive to be posted again by the next [`TargetQueue::flush_receives`].
    pub fn repost_receive(&mut self, slot: usize) {
        self.slots[slot] = Slot::Posted;
        self.reposts.push(slot);
    }

    /// Posts the receives marked since the last flush, up to [`RECEIVE_BATCH`] per
    /// doorbell (SPDK batches its receive WRs the same way): one MMIO write for a
    /// poll's worth of answered commands instead of one each.
    pub fn flush_receives(&mut self) -> Result<(), rnic_verbs::PostError> {
        while !self.reposts.is_empty() {
            let count = self.reposts.len().min(RECEIVE_BATCH);
            let mut sges = [([rnic_verbs::Sge::default(); 2], 0); RECEIVE_BATCH];
            for (sge, &slot) in sges.iter_mut().zip(&self.reposts[..count]) {
                *sge = self.receives.sges(slot);
            }
            let mut requests = [RecvWorkRequest::default(); RECEIVE_BATCH];
            for ((request, (sge, used)), &slot) in requests.iter_mut().zip(&sges).zip(&self.reposts[..count]) {
                *request = RecvWorkRequest {
                    wr_id: wr_id(WorkKind::Receive, slot),
                    sg_list: &sge[..*used],
                };
            }
            self.qp.post_recv(&requests[..count])?;
            self.reposts.drain(..count);
        }
        Ok(())
    }

    /// Posts an RDMA READ of the request's keyed data into its buffer.
    pub fn post_read(
        &mut self,
        slot: usize,
        address: u64,
        key: u32,
        buffer: &DataBuffer,
    ) -> Result<(), rnic_verbs::PostError> {
        let sge = [self.pool.sge(buffer)];
        self.qp.post_send(&[SendWorkRequest {
            wr_id: wr_id(WorkKind::ReadData, slot),
            opcode: WrOpcode::RdmaRead,
            sg_list: &sge,
            send_flags: SendFlags::SIGNALED,
            rdma: RdmaFields {
                remote_addr: address,
                rkey: key,
            },
            ..Default::default()
        }])?;
        self.reads_outstanding += 1;
        Ok(())
    }

    /// Writes the CQE of `slot` and queues its SEND (with invalidate of `invalidate`),
    /// after an RDMA WRITE of `write_length` bytes of its buffer to `write_to` when
    /// given; [`TargetQueue::flush_responses`] posts what was queued.
    pub fn post_response(
        &mut self,
        slot: usize,
        cqe: &CqeRepr,
        write: Option<(&DataBuffer, u32, u64, u32)>,
        invalidate: Option<u32>,
    ) -> rnic_verbs::Result<()> {
        self.responses.write(slot, &cqe.to_bytes())?;
        let write = write.map(|(buffer, length, address, key)| PendingWrite {
            local: rnic_verbs::Sge::new(self.pool.address(buffer), length, self.pool.mr().lkey()),
            remote_addr: address,
            rkey: key,
        });
        self.pending_responses.push(PendingResponse {
            slot,
            write,
            invalidate,
        });
        Ok(())
    }

    /// Posts the responses queued since the last flush (each its data WRITE, if any,
    /// then its SEND), up to [`RESPONSE_BATCH`] of them per doorbell: the answers of a
    /// poll cost one MMIO write, not one each (SPDK posts a poll's WRs the same way).
    /// RC keeps the order of a QP's requests, so every WRITE still reaches the host
    /// before the response that completes its command.
    pub fn flush_responses(&mut self) -> Result<(), rnic_verbs::PostError> {
        while !self.pending_responses.is_empty() {
            let count = self.pending_responses.len().min(RESPONSE_BATCH);
            let mut sges = [[rnic_verbs::Sge::default(); 2]; RESPONSE_BATCH];
            for (sge, pending) in sges.iter_mut().zip(&self.pending_responses[..count]) {
                sge[0] = pending.write.map_or_else(rnic_verbs::Sge::default, |w| w.local);
                sge[1] = self.responses.sge(pending.slot, CQE_LEN);
            }
            let mut requests: [SendWorkRequest<'_>; 2 * RESPONSE_BATCH] =
                [SendWorkRequest::default(); 2 * RESPONSE_BATCH];
            let mut used = 0;
            for (sge, pending) in sges.iter().zip(&self.pending_responses[..count]) {
                if let Some(write) = pending.write {
                    requests[used] = SendWorkRequest {
                        wr_id: wr_id(WorkKind::WriteData, pending.slot),
                        opcode: WrOpcode::RdmaWrite,
                        sg_list: &sge[..1],
                        // Unsignaled: RC order puts the data before the response, and
                        // the response's completion retires the WRITE too.
                        send_flags: SendFlags::empty(),
                        rdma: RdmaFields {
                            remote_addr: write.remote_addr,
                            rkey: write.rkey,
                        },
                        ..Default::default()
                    };
                    used += 1;
                }
                requests[used] = SendWorkRequest {
                    wr_id: wr_id(WorkKind::Response, pending.slot),
                    opcode: if pending.invalidate.is_some() {
                        WrOpcode::SendWithInv
                    } else {
                        WrOpcode::Send
                    },
                    sg_list: &sge[1..],
                    send_flags: SendFlags::SIGNALED,
                    invalidate_rkey: pending.invalidate.unwrap_or(0),
                    ..Default::default()
                };
                used += 1;
            }
            let result = self.qp.post_send(&requests[..used]);
            self.pending_responses.drain(..count);
            result?;
        }
        Ok(())
    }

    /// Copies the in-capsule data `range` of `slot` into `out`.
    pub fn read_in_capsule(
        &self,
        slot: usize,
        range: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> rnic_verbs::Result<()> {
        out.resize(range.len(), 0);
        match &self.receives.in_capsule {
            Some(data) => data.read_at(slot, range.start, out),
            None => Err(rnic_verbs::VerbsError::InvalidArgument(
                "in-capsule data on a queue that takes none".into(),
            )),
        }
    }
}

/// The receive buffers of a queue, two per slot as Linux's and SPDK's targets post them:
/// the SQE in a dense array of 64-byte commands, the in-capsule data (if the target takes
/// any) in a page-sized buffer of its own. A capsule scatters across both exactly as it
/// would into one buffer of their total size; what the split buys is that the commands
/// of a busy queue share a few cache lines and pages instead of one page each.
pub(crate) struct Receives {
    pub commands: SlotRegion,
    pub in_capsule: Option<SlotRegion>,
}

impl Receives {
    /// Bytes a receive takes: an SQE and the in-capsule data.
    pub fn capacity(&self) -> usize {
        SQE_LEN + self.in_capsule.as_ref().map_or(0, SlotRegion::slot_size)
    }

    /// The SGEs of receive `slot` and how many of the two are used.
    pub fn sges(&self, slot: usize) -> ([rnic_verbs::Sge; 2], usize) {
        let command = self.commands.sge(slot, SQE_LEN);
        match &self.in_capsule {
            Some(data) => ([command, data.sge(slot, data.slot_size())], 2),
            None => ([command, rnic_verbs::Sge::default()], 1),
        }
    }

    /// Copies the `length` bytes a capsule of receive `slot` brought into `out` (SQE,
    /// then in-capsule data), as if they had landed in one buffer.
    pub fn read_capsule(&self, slot: usize, length: usize, out: &mut Vec<u8>) -> rnic_verbs::Result<()> {
        let length = length.min(self.capacity());
        out.resize(length, 0);
        let command = length.min(SQE_LEN);
        self.commands.read(slot, &mut out[..command])?;
        if length > SQE_LEN {
            if let Some(data) = &self.in_capsule {
                data.read(slot, &mut out[SQE_LEN..])?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_round_trip() {
        for kind in [
            WorkKind::Receive,
            WorkKind::ReadData,
            WorkKind::WriteData,
            WorkKind::Response,
        ] {
            for slot in [0usize, 1, 255, 1 << 20] {
                assert_eq!(decode_wr_id(wr_id(kind, slot)), Some((kind, slot)));
            }
        }
        assert_eq!(decode_wr_id(0), None);
        assert_eq!(decode_wr_id(9 << 56), None);
    }
}
