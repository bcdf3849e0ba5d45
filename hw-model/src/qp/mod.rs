//! Queue pairs: MODIFY_QPC / QUERY_QPC, the state machine, SQ/RQ doorbells and the
//! flush of outstanding WQEs when a QP enters the error state.
//!
//! The QPC lives in host memory (the QPC table) and is the truth: every modify reads it,
//! merges the new context under the mask (mask bit 1 = keep the current bit), checks the
//! transition and the fields the target state needs, and writes it back.
//!
//! The block ([`QueuePairs`]) owns its counters and the limits from the capabilities. It
//! accepts MODIFY_QPC / QUERY_QPC, SQ and RQ doorbells, the transport's request to move
//! a QP to ERR on its own account, and the flush of a QP in ERR. What it decides that
//! the transport must know — a state change ([`Transition`]), a doorbell that moved a
//! producer index ([`DoorbellOutcome`]) — it returns, and the top hands it on: the QP
//! block sits below the transport and never calls it. Flush CQEs go to the CQ block and
//! errors to the event block through its [`Io`].

pub mod state;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{Mtu, QpState, Qpc, ServiceType, GSI_QPN, SMI_QPN};
use rnic_firmware_if::cqe::{Cqe, CqeStatus, RecvOpcode};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mtr::{page_shift_from_field, MtrRegion, QpBufferLayout};
use rnic_firmware_if::wqe::SQ_WQE_SIZE;

use crate::command::Rejection;
use crate::diagnostics::Source;
use crate::memory::MemoryError;
use crate::mtt::{Mtr, MttError};

/// What the QP block needs from the rest of the device.
pub(crate) trait Io {
    /// QP `qpn`'s context and its bus address, from the QPC table of the context block
    /// (with the transport's recorded progress applied).
    fn read_qpc(&mut self, qpn: u32) -> Result<(Qpc, u64), Rejection>;
    /// Writes the QPC at `address` back (through the context cache).
    fn write_qpc(&mut self, address: u64, qpc: &Qpc) -> Result<(), Rejection>;
    /// Translates byte `offset` of `mtr` through the MTT; None while bus mastering is off.
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>>;
    /// DMA read (a WQE header during a flush).
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;
    /// Records a diagnostic.
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    );
    /// Request to the CQ block: whether CQ `cqn` exists and is valid.
    fn cq_is_valid(&mut self, cqn: u32) -> bool;
    /// Request to the SRQ block: whether SRQ `srqn` exists.
    fn srq_is_valid(&mut self, srqn: u32) -> bool;
    /// Out to the CQ block: a (flush) CQE.
    fn post_cqe(&mut self, cqn: u32, cqe: Cqe, solicited: bool);
    /// Event out: an AEQE.
    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32);
}

/// A QP changed state: what the transport is told (before a move to ERR is flushed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transition {
    /// The state it was in.
    pub from: QpState,
    /// The state it is in now.
    pub to: QpState,
    /// The QPC as written.
    pub qpc: Qpc,
    /// The QPC's bus address.
    pub address: u64,
}

/// What an accepted SQ or RQ doorbell asks of the rest of the device.
// The QPC is held inline: the outcome only passes from the QP block to the top on the
// stack, and a box would allocate on every doorbell of a QP in ERR (posting to a QP in
// ERR is a data path too: every request comes back flushed, see the no-allocation test).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum DoorbellOutcome {
    /// Nothing more: the doorbell was dropped, or it needs nothing beyond the QPC.
    Done,
    /// The QP is in ERR: flush what was posted ([`QueuePairs::flush`]).
    Flush {
        /// The QPC's bus address.
        address: u64,
        /// The QPC as written.
        qpc: Qpc,
    },
    /// The SQ producer index of a QP in RTS moved (to the requester).
    SendQueue(u16),
    /// The RQ producer index moved (to the responder).
    ReceiveQueue(u16),
}

/// What the QP block counted since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QpCounters {
    /// SQ/RQ doorbells accepted.
    pub doorbells: u64,
    /// SQ/RQ doorbells dropped.
    pub doorbells_dropped: u64,
}

/// The queue-pair block.
#[derive(Debug, Clone)]
pub(crate) struct QueuePairs {
    counters: QpCounters,
    /// Capabilities: QPs in the table, PDs, queue depth and SGE limits, the MTU limit.
    caps: rnic_firmware_if::caps::DeviceCaps,
}

/// Which work queue of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkQueue {
    Send,
    Receive,
}

pub(crate) use crate::command::merge_under_mask;

fn log2_floor(value: u32) -> u32 {
    31 - value.max(1).leading_zeros()
}

/// The translation of a QP's WQE buffer (`[SQ][extended SGEs][RQ]`) and where each region starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpBuffer {
    pub mtr: Mtr,
    pub region_offsets: [u64; 3],
    pub sq_depth: u32,
    pub rq_depth: u32,
}

impl QpBuffer {
    pub fn from_context(qpc: &Qpc) -> Result<Self, MttError> {
        let layout = QpBufferLayout::from_shifts(
            qpc.sq_shift() as u32,
            qpc.sge_shift() as u32,
            qpc.rq_shift() as u32,
            qpc.rq_max_sge_shift() as u32,
            qpc.srq_enable(),
        );
        let page_shift = page_shift_from_field(qpc.wqe_sge_buffer_page_size());
        let counts = layout.page_counts(page_shift);
        let regions = [
            MtrRegion {
                page_count: counts[0],
                hop: qpc.sq_hop_number(),
            },
            MtrRegion {
                page_count: counts[1],
                hop: qpc.sge_hop_number(),
            },
            MtrRegion {
                page_count: counts[2],
                hop: qpc.rq_hop_number(),
            },
        ];
        let mtr = Mtr::new(
            qpc.wqe_sge_base_address() << 3,
            page_shift_from_field(qpc.wqe_sge_ba_page_size()),
            page_shift,
            &regions,
        )?;
        mtr.validate()?;
        Ok(Self {
            mtr,
            region_offsets: layout.region_offsets(page_shift),
            sq_depth: 1 << qpc.sq_shift().min(31),
            rq_depth: 1 << qpc.rq_shift().min(31),
        })
    }

    /// Byte offset of SQ WQE `index` in the buffer.
    pub fn sq_wqe_offset(&self, index: u32) -> u64 {
        self.region_offsets[0] + (index & (self.sq_depth - 1)) as u64 * SQ_WQE_SIZE as u64
    }
}

impl QueuePairs {
    /// The block of a device with `caps`.
    pub fn new(caps: &rnic_firmware_if::caps::DeviceCaps) -> Self {
        Self {
            counters: QpCounters::default(),
            caps: *caps,
        }
    }

    /// What the block counted.
    pub fn counters(&self) -> QpCounters {
        self.counters
    }

    fn qp_limit_checks(&mut self, qpn: u32) -> Result<(), Rejection> {
        let count = self.caps.num_qps;
        if qpn >= count {
            return Err(Rejection::index(qpn as u64, count as u64));
        }
        Ok(())
    }

    /// MODIFY_QPC (mailbox 0x41): the only way a QP is created, moved and torn down.
    /// The transition goes to the transport, and a move to ERR is then flushed
    /// ([`QueuePairs::flush`]).
    pub fn modify(&mut self, io: &mut impl Io, qpn: u32, context: Qpc, mask: Qpc) -> Result<Transition, Rejection> {
        self.qp_limit_checks(qpn)?;
        if qpn == SMI_QPN {
            // RoCE has no subnet manager and so no QP0 (rdma_rxe drops packets for it).
            return Err(Rejection {
                status: rnic_firmware_if::mailbox::MailboxCompletion::InvalidIndex,
                field: "tag",
                value: u64::from(qpn),
                expected: "a QPN other than 0: RoCE has no SMI QP".into(),
            });
        }
        let (current, address) = io.read_qpc(qpn)?;
        let from = current.qp_state().map_err(|_| {
            Rejection::state(
                "QP_ST",
                current.qp_state_raw() as u64,
                "a defined QP state in the stored context",
            )
        })?;
        let mut merged = merge_under_mask(&current, &context, &mask);
        let to = merged
            .qp_state()
            .map_err(|_| Rejection::parameter("QP_ST", merged.qp_state_raw() as u64, "a defined QP state"))?;
        if !state::is_legal_transition(from, to) {
            return Err(Rejection::state(
                "QP_ST",
                u8::from(to) as u64,
                format!(
                    "a state reachable from {from:?}: one of {:?}",
                    state::allowed_targets(from)
                ),
            ));
        }
        if from != QpState::Reset && to != QpState::Reset && merged.service_type_raw() != current.service_type_raw() {
            // A QP's type is set at RESET→INIT (hns, IBA): WQEs already fetched were
            // decoded as the old type.
            return Err(Rejection::parameter(
                "TST",
                merged.service_type_raw() as u64,
                format!(
                    "the service type set at RESET→INIT ({}); it changes only through RESET",
                    current.service_type_raw()
                ),
            ));
        }
        match to {
            QpState::Init | QpState::Rtr | QpState::Rts => self.validate_qp_init(io, qpn, &merged)?,
            _ => {}
        }
        if matches!(to, QpState::Rtr | QpState::Rts) {
            self.validate_qp_path(&merged)?;
        }
        if to == QpState::Reset {
            merged.set_sq_producer_index(0);
            merged.set_sq_consumer_index(0);
            merged.set_rq_producer_index(0);
            merged.set_rq_consumer_index(0);
        }
        tracing::debug!(target: "rnic::qp", qpn, ?from, ?to, "modify");
        io.write_qpc(address, &merged)?;
        Ok(Transition {
            from,
            to,
            qpc: merged,
            address,
        })
    }

    /// Moves QP `qpn` to ERR on the device's own account (a transport error; the
    /// transport has recorded its progress first). None when it was in ERR already or its
    /// QPC is unreachable; else the transition, which the caller flushes after updating
    /// its own state.
    pub fn enter_error(&mut self, io: &mut impl Io, qpn: u32) -> Option<Transition> {
        let Ok((mut qpc, address)) = io.read_qpc(qpn) else {
            return None;
        };
        let from = qpc.qp_state().unwrap_or(QpState::Reset);
        if from == QpState::Err {
            return None;
        }
        qpc.set_qp_state(QpState::Err);
        if io.write_qpc(address, &qpc).is_err() {
            return None;
        }
        tracing::debug!(target: "rnic::qp", qpn, ?from, "transport error: to ERR");
        Some(Transition {
            from,
            to: QpState::Err,
            qpc,
            address,
        })
    }

    fn validate_qp_init(&mut self, io: &mut impl Io, qpn: u32, qpc: &Qpc) -> Result<(), Rejection> {
        let caps = self.caps;
        let service = qpc
            .service_type()
            .map_err(|_| Rejection::parameter("TST", qpc.service_type_raw() as u64, "0 (RC), 1 (UC) or 3 (UD)"))?;
        if !matches!(service, ServiceType::Rc | ServiceType::Uc | ServiceType::Ud) {
            return Err(Rejection::parameter(
                "TST",
                u8::from(service) as u64,
                "0 (RC), 1 (UC) or 3 (UD); RD and XRC are not supported",
            ));
        }
        if qpc.protection_domain() >= caps.num_pds {
            return Err(Rejection::parameter(
                "PD",
                qpc.protection_domain() as u64,
                format!("a PD number below {}", caps.num_pds),
            ));
        }
        let max_sq_shift = log2_floor(caps.max_sq_wqes);
        if qpc.sq_shift() as u32 > max_sq_shift {
            return Err(Rejection::parameter(
                "SQ_SHIFT",
                qpc.sq_shift() as u64,
                format!("log2(SQ depth) <= {max_sq_shift}"),
            ));
        }
        let max_rq_shift = log2_floor(caps.max_rq_wqes);
        if qpc.rq_shift() as u32 > max_rq_shift {
            return Err(Rejection::parameter(
                "RQ_SHIFT",
                qpc.rq_shift() as u64,
                format!("log2(RQ depth) <= {max_rq_shift}"),
            ));
        }
        let max_rqws = log2_floor(caps.max_rq_sges as u32);
        if qpc.rq_max_sge_shift() as u32 > max_rqws {
            return Err(Rejection::parameter(
                "RQWS",
                qpc.rq_max_sge_shift() as u64,
                format!("log2(RQ SGEs) <= {max_rqws}"),
            ));
        }
        for (field, cqn) in [("TX_CQN", qpc.send_cq_number()), ("RX_CQN", qpc.receive_cq_number())] {
            if !io.cq_is_valid(cqn) {
                return Err(Rejection::parameter(
                    field,
                    cqn as u64,
                    "the number of a valid (created) CQ",
                ));
            }
        }
        if qpc.srq_enable() && !io.srq_is_valid(qpc.srq_number()) {
            return Err(Rejection::parameter(
                "SRQN",
                qpc.srq_number() as u64,
                "the number of a valid (created) SRQ",
            ));
        }
        if qpn == GSI_QPN && service != ServiceType::Ud {
            return Err(Rejection::parameter(
                "TST",
                u8::from(service) as u64,
                format!("UD (3) for the GSI QP {GSI_QPN}"),
            ));
        }
        Ok(())
    }

    fn validate_qp_path(&mut self, qpc: &Qpc) -> Result<(), Rejection> {
        let max_mtu = self.caps.max_mtu;
        let service = qpc.service_type().ok();
        if service != Some(ServiceType::Ud) {
            let mtu = qpc
                .mtu()
                .map_err(|_| Rejection::parameter("MTU", qpc.mtu_raw() as u64, "1 (256) ..= 5 (4096)"))?;
            if u8::from(mtu) > max_mtu {
                return Err(Rejection::parameter(
                    "MTU",
                    u8::from(mtu) as u64,
                    format!(
                        "at most {max_mtu} ({} bytes)",
                        Mtu::try_from(max_mtu).map(|m| m.bytes()).unwrap_or(0)
                    ),
                ));
            }
        }
        QpBuffer::from_context(qpc)
            .map_err(|e| Rejection::parameter("WQE_SGE_BA", qpc.wqe_sge_base_address() << 3, e.to_string()))?;
        Ok(())
    }

    /// QUERY_QPC (mailbox 0x42).
    pub fn query(&mut self, io: &mut impl Io, qpn: u32) -> Result<Qpc, Rejection> {
        self.qp_limit_checks(qpn)?;
        Ok(io.read_qpc(qpn)?.0)
    }

    /// An SQ (cmd 0) or RQ (cmd 1) doorbell: the new producer index.
    pub fn doorbell(&mut self, io: &mut impl Io, qpn: u32, queue: WorkQueue, producer_index: u16) -> DoorbellOutcome {
        let found = self.qp_limit_checks(qpn).and_then(|()| io.read_qpc(qpn));
        let (mut qpc, address) = match found {
            Ok(found) => found,
            Err(rejection) => {
                self.counters.doorbells_dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("QP {qpn:#x}"),
                    "TAG",
                    qpn as u64,
                    format!("an existing QP ({})", rejection.expected),
                );
                io.async_event(AsyncEventType::WqCatasError, 1, qpn);
                return DoorbellOutcome::Done;
            }
        };
        let state = qpc.qp_state().unwrap_or(QpState::Reset);
        let allowed = match queue {
            WorkQueue::Send => matches!(state, QpState::Rts | QpState::Err),
            WorkQueue::Receive => matches!(state, QpState::Init | QpState::Rtr | QpState::Rts | QpState::Err),
        };
        if !allowed {
            self.counters.doorbells_dropped += 1;
            io.diagnose(
                Source::Doorbell,
                format!("QP {qpn:#x}"),
                "QP_ST",
                u8::from(state) as u64,
                match queue {
                    WorkQueue::Send => "an SQ doorbell only in RTS (or ERR, to flush)",
                    WorkQueue::Receive => "an RQ doorbell only in INIT, RTR, RTS (or ERR, to flush)",
                },
            );
            return DoorbellOutcome::Done;
        }
        if queue == WorkQueue::Receive && qpc.srq_enable() {
            self.counters.doorbells_dropped += 1;
            io.diagnose(
                Source::Doorbell,
                format!("QP {qpn:#x}"),
                "SRQ_EN",
                1,
                "receive WQEs posted to the QP's SRQ, not its RQ",
            );
            return DoorbellOutcome::Done;
        }
        let (depth, consumer) = match queue {
            WorkQueue::Send => (1u32 << qpc.sq_shift().min(16), qpc.sq_consumer_index()),
            WorkQueue::Receive => (1u32 << qpc.rq_shift().min(16), qpc.rq_consumer_index()),
        };
        let outstanding = producer_index.wrapping_sub(consumer) as u32;
        if outstanding > depth {
            self.counters.doorbells_dropped += 1;
            io.diagnose(
                Source::Doorbell,
                format!("QP {qpn:#x}"),
                "PI",
                producer_index as u64,
                format!("at most {depth} WQEs past the consumer index {consumer}"),
            );
            io.async_event(AsyncEventType::WqCatasError, 4, qpn);
            return DoorbellOutcome::Done;
        }
        match queue {
            WorkQueue::Send => qpc.set_sq_producer_index(producer_index),
            WorkQueue::Receive => qpc.set_rq_producer_index(producer_index),
        }
        self.counters.doorbells += 1;
        // Through the context cache: a write of the producer index's bytes alone would
        // bypass it, and the cached copy would later write the old index back.
        if io.write_qpc(address, &qpc).is_err() {
            return DoorbellOutcome::Done;
        }
        match (state, queue) {
            (QpState::Err, _) => DoorbellOutcome::Flush { address, qpc },
            (QpState::Rts, WorkQueue::Send) => DoorbellOutcome::SendQueue(producer_index),
            (_, WorkQueue::Receive) => DoorbellOutcome::ReceiveQueue(producer_index),
            _ => DoorbellOutcome::Done,
        }
    }

    /// Completes every outstanding WQE of a QP in ERR with WR_FLUSH_ERR.
    pub fn flush(&mut self, io: &mut impl Io, qpn: u32, address: u64, mut qpc: Qpc) {
        let Ok(buffer) = QpBuffer::from_context(&qpc) else {
            // A QP moved to ERR before RTR has no WQE buffer; nothing can be outstanding.
            qpc.set_sq_consumer_index(qpc.sq_producer_index());
            qpc.set_rq_consumer_index(qpc.rq_producer_index());
            let _ = io.write_qpc(address, &qpc);
            return;
        };
        let sq_pending = qpc.sq_producer_index().wrapping_sub(qpc.sq_consumer_index()) as u32;
        for step in 0..sq_pending.min(buffer.sq_depth) {
            let index = qpc.sq_consumer_index().wrapping_add(step as u16);
            let opcode = Self::read_sq_wqe_opcode(io, &buffer, index as u32).unwrap_or(0);
            let mut cqe = Cqe::zeroed();
            cqe.set_opcode(opcode);
            cqe.set_receive_side(false);
            cqe.set_status(CqeStatus::WrFlushErr as u8);
            cqe.set_wqe_index(index);
            cqe.set_local_qp_number(qpn);
            io.post_cqe(qpc.send_cq_number(), cqe, false);
        }
        qpc.set_sq_consumer_index(qpc.sq_producer_index());
        if qpc.srq_enable() {
            io.async_event(AsyncEventType::SrqLastWqeReach, 0, qpn);
        } else {
            let rq_pending = qpc.rq_producer_index().wrapping_sub(qpc.rq_consumer_index()) as u32;
            for step in 0..rq_pending.min(buffer.rq_depth) {
                let index = qpc.rq_consumer_index().wrapping_add(step as u16);
                let mut cqe = Cqe::zeroed();
                cqe.set_opcode(RecvOpcode::Send as u8);
                cqe.set_receive_side(true);
                cqe.set_status(CqeStatus::WrFlushErr as u8);
                cqe.set_wqe_index(index);
                cqe.set_local_qp_number(qpn);
                io.post_cqe(qpc.receive_cq_number(), cqe, false);
            }
            qpc.set_rq_consumer_index(qpc.rq_producer_index());
        }
        let _ = io.write_qpc(address, &qpc);
    }

    fn read_sq_wqe_opcode(io: &mut impl Io, buffer: &QpBuffer, index: u32) -> Option<u8> {
        let bus = io.translate(&buffer.mtr, buffer.sq_wqe_offset(index))?.ok()?;
        let mut header = [0u8; 4];
        io.dma_read(bus, &mut header).ok()?;
        Some(header[0] & 0x1F)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_of_one_keep_the_current_value() {
        let mut current = Qpc::zeroed();
        current.set_protection_domain(7);
        current.set_sq_shift(4);
        let mut new = Qpc::zeroed();
        new.set_protection_domain(9);
        new.set_sq_shift(6);
        let mut mask = Qpc::all_ones();
        mask.open_field(Qpc::PD);
        let merged = merge_under_mask(&current, &new, &mask);
        assert_eq!(merged.protection_domain(), 9, "opened field takes the new value");
        assert_eq!(merged.sq_shift(), 4, "masked field keeps the current value");
    }
}
