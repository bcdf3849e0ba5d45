//! Per-QP transport state kept inside the device: the configuration snapshot taken from
//! the QPC at RTR/RTS, the requester's window of fetched WQEs, the responder's inbound
//! message and its ordered response queue, and the replay ring for duplicate READs and
//! atomics.
//!
//! The QPC in host memory stays the truth for configuration. Everything here is the
//! engine's working state (hns keeps it in on-chip QP caches); the fields hns names are
//! written back to the QPC at message boundaries (see `sync_*` in the engines).

use std::collections::VecDeque;

use rnic_firmware_if::context::{QpState, Qpc, ServiceType, GSI_QKEY, GSI_QPN};

use crate::qp::QpBuffer;
use crate::time::Picoseconds;

use super::path::Path;
use super::wqe_fetch::SendWqe;

// ---- PSN arithmetic (IBA 9.7.1, roce-wire §1.7) ------------------------------------------

/// PSNs are 24-bit.
pub(crate) const PSN_MASK: u32 = 0x00FF_FFFF;

/// `psn + n` modulo 2^24.
pub(crate) fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a − b` in the 24-bit PSN space (half-space rule: ±2^23).
pub(crate) fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

/// MSNs are 24-bit too.
pub(crate) const MSN_MASK: u32 = 0x00FF_FFFF;

// ---- timers -----------------------------------------------------------------------------

/// Local ACK timeout for the QPC `AT` field: 4.096 µs × 2^AT; 0 = no timeout (IBA
/// 11.2.4.2, hns §10.2 on HIP09 where AT is not offset).
pub fn ack_timeout(at: u8) -> Option<Picoseconds> {
    if at == 0 {
        return None;
    }
    Some(Picoseconds(4_096_000u64 << u32::from(at.min(31))))
}

/// The IB RNR NAK timer table (IBA table 45, roce-wire §1.5), in microseconds × 100
/// (code 1 = 0.01 ms = 10 µs).
const RNR_TIMER_TABLE_10NS: [u64; 32] = [
    65_536_000, 1_000, 2_000, 3_000, 4_000, 6_000, 8_000, 12_000, 16_000, 24_000, 32_000, 48_000, 64_000, 96_000,
    128_000, 192_000, 256_000, 384_000, 512_000, 768_000, 1_024_000, 1_536_000, 2_048_000, 3_072_000, 4_096_000,
    6_144_000, 8_192_000, 12_288_000, 16_384_000, 24_576_000, 32_768_000, 49_152_000,
];

/// How long a requester waits after an RNR NAK carrying timer `code` (5 bits).
pub(crate) fn rnr_delay(code: u8) -> Picoseconds {
    Picoseconds(RNR_TIMER_TABLE_10NS[usize::from(code & 0x1F)] * 10_000)
}

/// retry_cnt / rnr_retry value that means "retry for ever" (IBA: only rnr_retry; see
/// docs/transport.md for retry_cnt).
pub(crate) const INFINITE_RETRY: u8 = 7;

// ---- limits ---------------------------------------------------------------------------

/// Most PSNs the requester keeps unacknowledged (rxe uses 128; a larger window keeps a
/// 4 KiB-MTU link busy across the modelled round trip).
pub(crate) const MAX_UNACKED_PSNS: i32 = 512;
/// PSNs the requester may have outstanding right after a retry (a timeout or a NAK):
/// go-back-N resends from the oldest unacknowledged PSN in a burst of this many, and the
/// window doubles with every acknowledgement that makes progress until it is
/// [`MAX_UNACKED_PSNS`] again. Resending the whole window at once overruns a slow peer
/// (rdma_rxe in a TCG guest drops most of a 512-packet burst, which starts the next
/// retry); hns and mlx5 NICs pace their retransmissions too (docs/transport.md).
pub(crate) const RETRY_WINDOW_START: i32 = 16;
/// The local ACK timer doubles with every timeout in a row without progress, up to this
/// factor (IBA lets the actual timeout exceed 4.096 µs × 2^AT, roce-wire §1.9): a peer
/// that stalls for a while (a software RNIC under load) is given time before RETRY_CNT
/// runs out. Progress brings the factor back to 1.
pub(crate) const ACK_TIMEOUT_MAX_BACKOFF: u32 = 4;
/// Most WQEs the requester holds fetched (its on-chip WQE cache).
pub(crate) const MAX_WINDOW_WQES: usize = 128;
/// The requester sets AckReq on the last packet of every message and on every
/// `ACK_REQUEST_INTERVAL`-th packet of a long one. Public for those who size a local ACK
/// timeout: a requester waits at most this many of its packets for an acknowledgement.
pub const ACK_REQUEST_INTERVAL: u32 = 64;
/// The responder acknowledges at the latest every `ACK_COALESCE` packets even without
/// AckReq.
pub(crate) const ACK_COALESCE: u32 = 16;
/// Room in the responder's response queue beyond two entries per responder resource.
const PENDING_SLACK: usize = 16;

// ---- configuration snapshot ---------------------------------------------------------------

/// What the engines need from the QPC, read at RTR/RTS (and on every later modify).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpConfig {
    pub qpn: u32,
    pub service: ServiceType,
    pub pd: u32,
    /// Path MTU in bytes (UD: 4096).
    pub mtu: u32,
    pub dest_qpn: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srqn: Option<u32>,
    /// SIG_TYPE = 0: every WQE completes.
    pub signal_all: bool,
    /// QPC AT.
    pub ack_timeout: u8,
    pub retry_init: u8,
    pub rnr_init: u8,
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic WQEs the requester may have (1 << SR_MAX).
    pub max_rd_atomic: u32,
    /// Responder resources (1 << RR_MAX).
    pub responder_resources: u32,
    pub remote_read: bool,
    pub remote_write: bool,
    pub remote_atomic: bool,
    pub qkey: u32,
    /// The WQE buffer (None before the QPC names one).
    pub buffer: Option<QpBuffer>,
    /// Extended SGE slots (0 = none).
    pub sge_slots: u32,
    /// log2 of the RQ WQE's SGE slots (RQWS).
    pub rq_wqe_shift: u32,
    /// RQ record doorbell address (RQ_RECORD_EN).
    pub rq_record: Option<u64>,
    /// The address vector of an RC/UC QP as the QPC gives it.
    pub path: Option<Path>,
}

impl QpConfig {
    /// The snapshot of `qpc` for QP `qpn`.
    pub fn from_qpc(qpn: u32, qpc: &Qpc) -> Self {
        let service = qpc.service_type().unwrap_or(ServiceType::Rc);
        let mtu = if service == ServiceType::Ud {
            4096
        } else {
            qpc.mtu().map(|m| m.bytes()).unwrap_or(256)
        };
        Self {
            qpn,
            service,
            pd: qpc.protection_domain(),
            mtu,
            dest_qpn: qpc.destination_qpn(),
            send_cq: qpc.send_cq_number(),
            recv_cq: qpc.receive_cq_number(),
            srqn: qpc.srq_enable().then_some(qpc.srq_number()),
            signal_all: !qpc.signal_requested_only(),
            ack_timeout: qpc.ack_timeout(),
            retry_init: qpc.retry_count_init(),
            rnr_init: qpc.rnr_retry_init(),
            min_rnr_timer: qpc.min_rnr_timer(),
            max_rd_atomic: 1 << qpc.initiator_depth_log2(),
            responder_resources: 1 << qpc.responder_resources_log2(),
            remote_read: qpc.remote_read_enable(),
            remote_write: qpc.remote_write_enable(),
            remote_atomic: qpc.remote_atomic_enable(),
            // QP1 always uses the GSI Q_Key (IBA; rdma_rxe does the same), so a GSI QP
            // whose driver left QKEY_XRCD empty still talks to every CM on the wire.
            qkey: if qpn == GSI_QPN { GSI_QKEY } else { qpc.qkey_xrcd() },
            buffer: QpBuffer::from_context(qpc).ok(),
            sge_slots: if qpc.sge_shift() == 0 {
                0
            } else {
                1 << qpc.sge_shift().min(24)
            },
            rq_wqe_shift: u32::from(qpc.rq_max_sge_shift()),
            rq_record: qpc.rq_record_enable().then(|| qpc.rq_record_address()),
            path: Path::from_qpc(qpc),
        }
    }
}

// ---- requester --------------------------------------------------------------------------

/// Requester and completer state of one QP (the send side).
#[derive(Debug, Clone)]
pub(crate) struct Requester {
    /// PSN of the next new packet (QPC SQ_CUR_PSN).
    pub next_psn: u32,
    /// Oldest PSN not yet acknowledged or answered (QPC RX_ACK_EPSN).
    pub una_psn: u32,
    /// SQ producer index from the last doorbell.
    pub producer: u16,
    /// Free-running index of the next WQE to fetch.
    pub fetched: u16,
    /// Fetched WQEs, oldest (the SQ consumer index) first.
    pub window: VecDeque<SendWqe>,
    /// Transmit position: window slot and packet within that WQE.
    pub cursor_slot: usize,
    pub cursor_packet: u32,
    /// READ/atomic WQEs transmitted and not yet completed.
    pub reads_outstanding: u32,
    /// Retries left (QPC RETRY_CNT) and RNR retries left (RNR_CNT).
    pub retry_left: u8,
    pub rnr_left: u8,
    /// Packets sent since the last AckReq.
    pub since_ack_request: u32,
    /// PSN one past the highest PSN transmitted (a READ counts its responses).
    pub transmitted_psn: u32,
    /// Waiting for the RNR timer: nothing is transmitted.
    pub rnr_wait: bool,
    /// When the local ACK timer expires (None: not armed). One scheduler event is live
    /// per QP; it re-schedules itself when the deadline moved later, and a deadline moved
    /// earlier (the backoff ended) schedules an earlier one, which supersedes it.
    pub ack_deadline: Option<Picoseconds>,
    /// When the live `Timer::Ack` event is due (None: none pending); an event due at
    /// another time is a superseded one and is ignored.
    pub ack_event_at: Option<Picoseconds>,
    /// Generation of this requester's timer events (unique per requester incarnation).
    pub generation: u64,
    /// Generation of the armed RNR timer (0 = none armed).
    pub rnr_timer: u64,
    /// A WQE could not be addressed (no source GID): retry on the next doorbell.
    pub stalled: bool,
    /// A go-back-N is under way: further gaps (late responses of the old round) do not
    /// start another one until something is acknowledged or the timer expires.
    pub retry_pending: bool,
    /// PSNs that may be outstanding beyond `una_psn` now: [`MAX_UNACKED_PSNS`], or less
    /// while recovering from a retry ([`RETRY_WINDOW_START`]).
    pub send_window: i32,
    /// Local ACK timeouts in a row without progress (the timer's backoff).
    pub timeouts_in_row: u32,
    /// The WQE the last direct-WQE doorbell carried and its SQ index: fetched from here,
    /// not from the ring (boxed: most QPs never hold one).
    pub direct: Option<Box<(u16, [u8; rnic_firmware_if::wqe::SQ_WQE_SIZE])>>,
}

impl Requester {
    pub fn new(qpc: &Qpc, generation: u64) -> Self {
        Self {
            next_psn: qpc.sq_current_psn() & PSN_MASK,
            una_psn: qpc.sq_current_psn() & PSN_MASK,
            producer: qpc.sq_producer_index(),
            fetched: qpc.sq_consumer_index(),
            // Grown on demand (to MAX_WINDOW_WQES at most) rather than reserved: a
            // reserved window was ≈ 32 KiB per QP, most of the model's memory per QP
            // with thousands of QPs (docs/benchmarks.md, "Memory per QP"). Growth
            // happens while a QP warms up; a warm data path still allocates nothing.
            window: VecDeque::new(),
            cursor_slot: 0,
            cursor_packet: 0,
            reads_outstanding: 0,
            retry_left: qpc.retry_count_init(),
            rnr_left: qpc.rnr_retry_init(),
            since_ack_request: 0,
            transmitted_psn: qpc.sq_current_psn() & PSN_MASK,
            rnr_wait: false,
            ack_deadline: None,
            ack_event_at: None,
            generation,
            rnr_timer: 0,
            stalled: false,
            retry_pending: false,
            send_window: MAX_UNACKED_PSNS,
            timeouts_in_row: 0,
            direct: None,
        }
    }

    /// Removes the oldest WQE (completed), keeping the transmit cursor on the same packet.
    pub fn pop_front(&mut self) -> Option<SendWqe> {
        let wqe = self.window.pop_front()?;
        if self.cursor_slot == 0 {
            self.cursor_packet = 0;
        } else {
            self.cursor_slot -= 1;
        }
        if wqe.is_read_or_atomic() && wqe.assigned {
            self.reads_outstanding = self.reads_outstanding.saturating_sub(1);
        }
        Some(wqe)
    }

    /// The SQ consumer index: the oldest WQE not completed.
    pub fn consumer(&self) -> u16 {
        self.window.front().map(|w| w.index).unwrap_or(self.fetched)
    }

    /// Whether any PSN awaits an acknowledgement or response.
    pub fn outstanding(&self) -> bool {
        self.una_psn != self.next_psn
    }

    /// Forgets every WQE and stops the timers (QP to ERR or RESET).
    pub fn clear(&mut self) {
        self.window.clear();
        self.cursor_slot = 0;
        self.cursor_packet = 0;
        self.reads_outstanding = 0;
        self.rnr_wait = false;
        self.ack_deadline = None;
        self.rnr_timer = 0;
        self.stalled = false;
        self.retry_pending = false;
        self.send_window = MAX_UNACKED_PSNS;
        self.timeouts_in_row = 0;
        self.direct = None;
    }

    /// The local ACK timeout with the backoff of `timeouts_in_row` applied.
    pub fn backed_off(&self, timeout: Picoseconds) -> Picoseconds {
        let factor = (1u32 << self.timeouts_in_row.min(31)).min(ACK_TIMEOUT_MAX_BACKOFF);
        Picoseconds(timeout.0.saturating_mul(u64::from(factor)))
    }
}

// ---- responder --------------------------------------------------------------------------

/// A receive WQE the responder has claimed for the message in progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimedRecv {
    /// RQ index (free-running) or SRQ WQE slot: the CQE's WQE_IDX.
    pub wqe_index: u16,
    /// From the QP's SRQ (already consumed from its index queue).
    pub srq: Option<u32>,
    /// Where the WQE's SGE slots live.
    pub list: super::dma::SgeList,
    /// PD for the local-key checks (the QP's, or the SRQ's).
    pub pd: u32,
}

/// What the inbound message in progress is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InboundKind {
    /// No multi-packet message in progress.
    Idle,
    /// SEND FIRST/MIDDLE received; `offset` bytes placed.
    Send,
    /// RDMA WRITE FIRST/MIDDLE received.
    Write,
}

/// The inbound (responder) message in progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inbound {
    pub kind: InboundKind,
    /// Bytes of the message placed so far.
    pub offset: u64,
    /// WRITE: the RETH of the FIRST packet.
    pub va: u64,
    pub rkey: u32,
    pub dma_length: u32,
    /// SEND: the claimed receive WQE.
    pub recv: Option<ClaimedRecv>,
    /// Scatter position inside the receive WQE.
    pub cursor: super::dma::SgeCursor,
    /// UC: drop packets until the next FIRST/ONLY.
    pub discard: bool,
}

impl Inbound {
    pub const IDLE: Self = Self {
        kind: InboundKind::Idle,
        offset: 0,
        va: 0,
        rkey: 0,
        dma_length: 0,
        recv: None,
        cursor: super::dma::SgeCursor::START,
        discard: false,
    };

    /// Between messages, but keeping `recv`: a receive WQE claimed for a message that
    /// did not consume it (lost UC message, WRITE without immediate) serves the next one.
    pub const fn idle_keeping(recv: Option<ClaimedRecv>) -> Self {
        Self { recv, ..Self::IDLE }
    }
}

/// An entry of the responder's ordered response queue: what goes back to the requester,
/// in PSN order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Response {
    /// ACK / NAK / RNR NAK: AETH syndrome for `psn`.
    Ack { psn: u32, syndrome: u8 },
    /// READ responses still to send: `next_psn` is the next response PSN, `va` the next
    /// byte, `remaining` the bytes left, `first` whether no packet of it was sent yet.
    /// `replay`: re-served for a duplicate request (see [`Responder::responses_in_progress`]).
    Read {
        next_psn: u32,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        replay: bool,
    },
    /// ATOMIC ACKNOWLEDGE with the original value (`replay`: answering a duplicate).
    Atomic { psn: u32, original: u64, replay: bool },
}

/// A READ or atomic kept for duplicate detection (the responder resources of IBA 9.7.5.1.4).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplayEntry {
    /// First and last PSN the request occupies.
    pub first_psn: u32,
    pub last_psn: u32,
    /// READ: original range; atomic: the address.
    pub va: u64,
    pub rkey: u32,
    pub length: u32,
    /// Atomic: the value returned the first time (answered again, never re-executed).
    pub atomic: Option<u64>,
}

/// Responder state of one QP (the receive side).
#[derive(Debug, Clone)]
pub(crate) struct Responder {
    /// Expected PSN (QPC RX_REQ_EPSN).
    pub epsn: u32,
    /// Messages completed (QPC RX_REQ_MSN), carried in AETHs.
    pub msn: u32,
    /// A PSN sequence error NAK went out for `epsn` (QPC RX_REQ_PSN_ERR).
    pub psn_error_sent: bool,
    /// RQ producer index as the last RQ doorbell gave it.
    pub rq_producer: u16,
    /// RQ consumer index (QPC RQ_CONSUMER_IDX).
    pub rq_consumer: u16,
    pub inbound: Inbound,
    /// Ordered responses not yet transmitted.
    pub pending: VecDeque<Response>,
    /// READ/atomic requests kept for duplicates, oldest first.
    pub replay: VecDeque<ReplayEntry>,
    /// Packets accepted since the last acknowledgement was queued.
    pub since_ack: u32,
    /// The newest PSN a plain ACK may name: the last SEND or WRITE packet executed. A
    /// READ or atomic is answered by its own response, and an ACK naming its PSN tells
    /// a requester it completed — rxe then completes the READ without its data.
    pub ackable_psn: Option<u32>,
    /// Most entries `pending` may hold (see [`Responder::has_room`]).
    pub pending_limit: usize,
}

impl Responder {
    pub fn new(qpc: &Qpc, config: &QpConfig) -> Self {
        let resources = config.responder_resources as usize;
        Self {
            epsn: qpc.rx_request_expected_psn() & PSN_MASK,
            msn: qpc.rx_request_msn() & MSN_MASK,
            psn_error_sent: false,
            rq_producer: qpc.rq_producer_index(),
            rq_consumer: qpc.rq_consumer_index(),
            inbound: Inbound::IDLE,
            // Grown on demand, as the requester's window.
            pending: VecDeque::new(),
            replay: VecDeque::new(),
            since_ack: 0,
            ackable_psn: None,
            pending_limit: 2 * resources + PENDING_SLACK,
        }
    }

    /// Whether another ACK/NAK or a re-served response may be queued: READ/atomic
    /// entries are bounded by RR_MAX, everything else by a little slack, so a flood of
    /// duplicates or RNR-bound requests cannot grow the queue without bound.
    pub fn has_room(&self) -> bool {
        self.pending.len() < self.pending_limit
    }

    /// READ/atomic requests whose first answer is queued and not fully sent: the responder
    /// resources in use. Answers re-served for duplicate requests hold no resource of their
    /// own (the request already has its replay entry): a requester that retries its READs
    /// (go-back-N after a lost or reordered response) re-sends requests whose first answer
    /// may be long gone, and those re-serves must not make its next new READ look like one
    /// too many (it would be NAKed as an invalid request and the QP would fail).
    pub fn responses_in_progress(&self) -> usize {
        self.pending
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    Response::Read { replay: false, .. } | Response::Atomic { replay: false, .. }
                )
            })
            .count()
    }
}

// ---- the QP -----------------------------------------------------------------------------

/// The transport state of one QP in RTR, RTS or (draining responses) ERR.
#[derive(Debug, Clone)]
pub(crate) struct QpRuntime {
    pub state: QpState,
    pub config: QpConfig,
    pub requester: Requester,
    pub responder: Responder,
    /// In the port's round-robin ring.
    pub in_ring: bool,
    /// The next response this QP builds is not ready before then: receive-side costs
    /// (translation, atomics' reads) of the requests it answers (timing model).
    pub response_ready: Picoseconds,
}

impl QpRuntime {
    pub fn new(qpn: u32, qpc: &Qpc, state: QpState, generation: u64) -> Self {
        let config = QpConfig::from_qpc(qpn, qpc);
        Self {
            state,
            requester: Requester::new(qpc, generation),
            responder: Responder::new(qpc, &config),
            config,
            in_ring: false,
            response_ready: Picoseconds::ZERO,
        }
    }
}

// ---- the table of QPs --------------------------------------------------------------------

/// The runtime of every QP in RTR, RTS or ERR, by QPN: a slot per QPN up to the highest
/// one seen, looked up by index. A frame looks its QP up several times on each side
/// (≈ 20 lookups per 8-byte WRITE), and with a hash map its hashes and probes were ≈ 6 %
/// of the message's instructions. The slots grow only when a QP enters RTR, which the QP
/// engine allows only for a QPN inside the QPC table (`DeviceCaps::num_qps`), so a QPN
/// from the wire never allocates; one past the slots is simply absent.
#[derive(Debug, Clone, Default)]
pub(crate) struct QpTable {
    slots: Vec<Option<Box<QpRuntime>>>,
}

impl QpTable {
    /// The runtime of QP `qpn`, if it has one.
    #[inline]
    pub fn get(&self, qpn: u32) -> Option<&QpRuntime> {
        self.slots.get(qpn as usize)?.as_deref()
    }

    /// The runtime of QP `qpn` to change, if it has one.
    #[inline]
    pub fn get_mut(&mut self, qpn: u32) -> Option<&mut QpRuntime> {
        self.slots.get_mut(qpn as usize)?.as_deref_mut()
    }

    /// Whether QP `qpn` has a runtime.
    #[inline]
    pub fn contains(&self, qpn: u32) -> bool {
        self.get(qpn).is_some()
    }

    /// Gives QP `qpn` `runtime`, replacing any it had.
    pub fn insert(&mut self, qpn: u32, runtime: Box<QpRuntime>) {
        let index = qpn as usize;
        if index >= self.slots.len() {
            self.slots.resize_with(index + 1, || None);
        }
        self.slots[index] = Some(runtime);
    }

    /// Drops QP `qpn`'s runtime.
    pub fn remove(&mut self, qpn: u32) {
        if let Some(slot) = self.slots.get_mut(qpn as usize) {
            *slot = None;
        }
    }

    /// Every runtime, in QPN order.
    pub fn values(&self) -> impl Iterator<Item = &QpRuntime> {
        self.slots.iter().filter_map(|slot| slot.as_deref())
    }

    /// Bytes of the slots themselves (one pointer per QPN up to the highest one seen).
    pub fn slot_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Option<Box<QpRuntime>>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_firmware_if::bits::Layout;

    fn runtime(qpn: u32) -> Box<QpRuntime> {
        Box::new(QpRuntime::new(qpn, &Qpc::zeroed(), QpState::Rtr, 1))
    }

    #[test]
    fn a_qp_table_finds_a_runtime_by_its_qpn_until_it_is_removed() {
        let mut table = QpTable::default();
        table.insert(0x11, runtime(0x11));
        table.insert(3, runtime(3));
        assert!(table.contains(0x11) && table.contains(3));
        assert!(!table.contains(4) && !table.contains(0));
        assert_eq!(table.get(0x11).map(|r| r.config.qpn), Some(0x11));
        if let Some(runtime) = table.get_mut(3) {
            runtime.in_ring = true;
        }
        assert_eq!(table.get(3).map(|r| r.in_ring), Some(true));
        table.remove(0x11);
        assert!(table.get(0x11).is_none());
        assert_eq!(table.values().count(), 1);
    }

    #[test]
    fn a_qpn_past_the_table_is_absent_and_allocates_nothing() {
        let mut table = QpTable::default();
        table.insert(2, runtime(2));
        let bytes = table.slot_bytes();
        // Any 24-bit QPN a frame can name: looked up, removed, never grown into.
        for qpn in [3, 0xFF_FFFF, u32::MAX] {
            assert!(table.get(qpn).is_none() && table.get_mut(qpn).is_none());
            table.remove(qpn);
        }
        assert_eq!(table.slot_bytes(), bytes);
    }

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(0xFF_FFFF, 1), 0);
        assert_eq!(psn_diff(0, 0xFF_FFFF), 1);
        assert_eq!(psn_diff(0xFF_FFFF, 0), -1);
        assert_eq!(psn_diff(0x40_0000, 0), 0x40_0000);
        assert!(psn_diff(0x80_0001, 0) < 0, "beyond half the space is behind");
    }

    #[test]
    fn ack_timeout_follows_4_096_us_times_two_to_the_at() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Picoseconds::from_nanos(8_192)));
        assert_eq!(ack_timeout(14).unwrap().as_nanos(), 67_108_864);
    }

    #[test]
    fn rnr_timer_codes_match_the_ib_table() {
        assert_eq!(rnr_delay(0), Picoseconds::from_micros(655_360));
        assert_eq!(rnr_delay(1), Picoseconds::from_micros(10));
        assert_eq!(rnr_delay(14), Picoseconds::from_micros(1_280));
        assert_eq!(rnr_delay(31), Picoseconds::from_micros(491_520));
    }
}
