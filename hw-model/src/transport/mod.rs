//! The RoCEv2 transport: the engines between a doorbell and the wire, and between the
//! wire and a CQE (hns pipeline: doorbell → WQE fetch → MTT → requester → wire →
//! responder → completer → CQE → EQ). See `docs/transport.md`.
//!
//! * [`wqe_fetch`]: reads and validates send WQEs; claims receive WQEs (RQ or SRQ).
//! * [`requester`]: segments messages into packets by path MTU, assigns PSNs, keeps the
//!   window of outstanding WQEs (fence, SR_MAX), completes UC/UD sends.
//! * [`responder`]: PSN checks, duplicates, RNR, key checks, placement of SEND/WRITE
//!   data, READ responses, atomics, ACK coalescing, invalidation, UD Q_Key checks.
//! * [`completer`]: ACK/NAK/response processing at the requester, the ACK timer and the
//!   RNR timer, retries and retry exhaustion.
//! * [`path`]: Ethernet/IP/UDP headers from the QPC or the UD WQE and the GID/SMAC tables.
//! * [`dma`]: gather and scatter through memory regions.
//! * [`qp_runtime`]: the per-QP state these engines keep.
//!
//! The frames go through the port block ([`crate::port`]), which owns the transmit and
//! receive pipelines, the transmitted frames waiting for the device's `poll_transmit`,
//! the frame-buffer pool and the address tables; [`Engine::receive_frame`] delivers a
//! frame from the network at the current virtual time.
//!
//! The engines time the port with the timing model ([`crate::timing`]). An SQ doorbell
//! takes effect when it arrives, `doorbell_ps` after the host wrote it
//! ([`DoorbellInFlight`]); a `TransportTx` event picks the next QP with work from a
//! round-robin ring and builds its next packet (responses before requests) into the
//! port's transmit pipeline, which holds at most `tx_pipeline_depth` frames. A frame is
//! ready after the costs charged while building it (WQE fetch, context miss, MTT, payload
//! DMA read, transmit pipeline), starts on the wire when it is ready and the port is
//! free, and leaves the port after its serialisation.
//! Received frames wait in the port's receive pipeline (receive pipeline cycles, payload
//! DMA write, CQE write) before the engines process them.
//!
//! The block ([`Transport`]) owns every QP's engine state, the round-robin ring of QPs
//! with work, the PCIe read channel's clock, timer generations and its counters. It
//! accepts the QP block's transitions and doorbells, frames from the network and its
//! timers; it produces, through its [`Io`], frames for the port, CQEs for the CQ block,
//! AEQEs for the event block, access checks for the memory-protection block, WQE
//! requests for the SRQ block, QP errors and flushes for the QP block, and the QP
//! progress the context block keeps for the QPC. The top owns it as an [`Engine`]: the
//! block's state bound to its `Io`.

pub(crate) mod completer;
pub(crate) mod dma;
pub(crate) mod op;
pub(crate) mod path;
pub(crate) mod qp_runtime;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod wqe_fetch;

#[cfg(test)]
mod tests;

pub use qp_runtime::{ack_timeout, ACK_REQUEST_INTERVAL};

use std::collections::VecDeque;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{QpState, Qpc, ServiceType};
use rnic_firmware_if::cqe::{Cqe, CqeStatus, RecvOpcode};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::wqe::{RcSqWqe, SQ_WQE_SIZE};

use crate::cq::CqError;
use crate::diagnostics::Source;
use crate::hem::{QpcProgress, SqProgress};
use crate::memory::MemoryError;
use crate::mpt::{MrAccess, MrAccessError, MrTranslation};
use crate::mtt::{DmaFault, Mtr};
use crate::port::Port;
use crate::qp::Transition;
use crate::srq::SrqWqe;
use crate::time::Picoseconds;
use crate::timing::{FrameCharges, Stage, TimingModel};
use crate::wire::{self, Icrc};

/// What the transport needs from the rest of the device.
pub(crate) trait Io {
    /// Current virtual time.
    fn now(&self) -> Picoseconds;
    /// The timing model (every stage's cost, the per-frame charges).
    fn timing(&mut self) -> &mut TimingModel;
    /// Runs `timer` at `at`.
    fn schedule_at(&mut self, at: Picoseconds, timer: Timer);
    /// Runs `timer` after `delay`.
    fn schedule_in(&mut self, delay: Picoseconds, timer: Timer);
    /// The port block: its pipelines, buffers and address tables.
    fn port(&mut self) -> &mut Port;
    /// Records a diagnostic.
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    );
    /// DMA read (physical-address regions, record doorbells).
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;
    /// DMA write (physical-address regions).
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// Reads bytes at `offset` of the buffer `mtr` describes (from `first_bus` when its
    /// address is known).
    fn read_buffer(
        &mut self,
        mtr: &Mtr,
        offset: u64,
        first_bus: Option<u64>,
        buffer: &mut [u8],
    ) -> Result<(), DmaFault>;
    /// Writes bytes at `offset` of the buffer `mtr` describes.
    fn write_buffer(&mut self, mtr: &Mtr, offset: u64, first_bus: Option<u64>, data: &[u8]) -> Result<(), DmaFault>;
    /// To the context block: QP `qpn`'s progress for its QPC.
    fn record_progress(&mut self, qpn: u32, progress: QpcProgress);
    /// Request to the memory-protection block: the access check of a key.
    fn check_memory_access(
        &mut self,
        key: u32,
        pd: u32,
        address: u64,
        length: u64,
        needed: MrAccess,
    ) -> Result<MrTranslation, MrAccessError>;
    /// Request to the memory-protection block: SEND with invalidate.
    fn invalidate_rkey(&mut self, rkey: u32, pd: u32) -> Result<(), String>;
    /// Request to the SRQ block: the next posted WQE of SRQ `srqn`.
    fn srq_take_wqe(&mut self, srqn: u32) -> Option<SrqWqe>;
    /// Out to the CQ block: a CQE.
    fn post_cqe(&mut self, cqn: u32, cqe: Cqe, solicited: bool) -> Result<(), CqError>;
    /// Event out: an AEQE.
    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32);
    /// Request to the QP block: QP `qpn` goes to ERR on the transport's account.
    fn qp_enter_error(&mut self, qpn: u32) -> Option<Transition>;
    /// Request to the QP block: flush QP `qpn`'s outstanding WQEs.
    fn qp_flush(&mut self, qpn: u32, address: u64, qpc: Qpc);
}

/// The transport's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The port finished serialising a frame and may start the next.
    Tx,
    /// Received frames leave the receive pipeline for the engines.
    Rx,
    /// A QP's local ACK timer is due.
    Ack {
        /// QP number.
        qpn: u32,
        /// Generation of the requester that armed it (stale timers are ignored).
        generation: u64,
    },
    /// A QP's RNR wait is over.
    Rnr {
        /// QP number.
        qpn: u32,
        /// Generation of the RNR wait (stale timers are ignored).
        generation: u64,
    },
}

/// The transport bound to its ports: its state and what its [`Io`] reaches. The top owns
/// one, its `Io` being the blocks below the transport (owned there too), so that the
/// engines reach their own state and every port through one reference, as they did when
/// the transport was part of one device struct (the 8-byte WRITE's cost per message).
pub(crate) struct Engine<I: Io> {
    /// The transport's own state.
    pub(crate) transport: Transport,
    /// What the transport may reach.
    pub(crate) io: I,
}

impl<I: Io> Engine<I> {
    /// The transport `transport` with its ports bound to `io`.
    pub fn new(transport: Transport, io: I) -> Self {
        Self { transport, io }
    }

    #[inline]
    fn now(&self) -> Picoseconds {
        self.io.now()
    }

    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.io.diagnose(source, object, field, value, expected);
    }

    #[inline]
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.io.dma_read(address, buffer)
    }

    #[inline]
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.io.dma_write(address, data)
    }

    #[inline]
    fn check_memory_access(
        &mut self,
        key: u32,
        pd: u32,
        address: u64,
        length: u64,
        needed: MrAccess,
    ) -> Result<MrTranslation, MrAccessError> {
        self.io.check_memory_access(key, pd, address, length, needed)
    }

    fn invalidate_rkey(&mut self, rkey: u32, pd: u32) -> Result<(), String> {
        self.io.invalidate_rkey(rkey, pd)
    }

    fn srq_take_wqe(&mut self, srqn: u32) -> Option<SrqWqe> {
        self.io.srq_take_wqe(srqn)
    }

    #[inline]
    fn post_cqe(&mut self, cqn: u32, cqe: Cqe, solicited: bool) -> Result<(), CqError> {
        self.io.post_cqe(cqn, cqe, solicited)
    }

    fn post_async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        self.io.async_event(event, sub_type, queue_number);
    }

    /// Moves QP `qpn` to ERR on the transport's own account: the QP block writes the
    /// state, the engines drop the QP's WQEs, the QP block flushes what was outstanding.
    fn qp_enter_error(&mut self, qpn: u32) {
        let Some(transition) = self.io.qp_enter_error(qpn) else {
            return;
        };
        self.qp_modified(qpn, transition.from, QpState::Err, &transition.qpc);
        self.io.qp_flush(qpn, transition.address, transition.qpc);
    }

    /// A timer of the transport is due.
    // Inlined into the top's event loop: one call less per transport event, and none for
    // a transmit event an earlier one superseded (about a third of them in the 8-byte
    // WRITE run: the call's register saves cost more than the check).
    #[inline]
    pub fn timer(&mut self, timer: Timer) {
        match timer {
            Timer::Tx => {
                if self.transport.next_tx_at == Some(self.now()) {
                    self.transport_tx_event();
                }
            }
            Timer::Rx => self.transport_rx_event(),
            Timer::Ack { qpn, generation } => self.ack_timer_event(qpn, generation),
            Timer::Rnr { qpn, generation } => self.rnr_timer_event(qpn, generation),
        }
    }
}

use qp_runtime::{QpRuntime, QpTable, Response};
use wqe_fetch::SendWqe;

/// A send WQE's completion: what its CQE says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailedWqe {
    pub index: u16,
    /// Raw SQ opcode (also for opcodes the device does not know).
    pub opcode: u8,
    pub length: u32,
    pub signaled: bool,
    pub status: CqeStatus,
}

impl FailedWqe {
    /// The completion of `wqe` with `status`.
    pub fn of(wqe: &SendWqe, status: CqeStatus) -> Self {
        Self {
            index: wqe.index,
            opcode: u8::from(wqe.opcode),
            length: wqe.length,
            signaled: wqe.signaled,
            status,
        }
    }
}

/// What the transport counted since power-on or the last function reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounters {
    /// Frames put on the wire (loopback included).
    pub frames_transmitted: u64,
    /// Frames delivered to the port.
    pub frames_received: u64,
    /// Received frames dropped (malformed, bad ICRC, not for us, no such QP, wrong state).
    pub frames_dropped: u64,
    /// Frames looped back to the device itself.
    pub loopback_frames: u64,
    /// Transmitted frames dropped because nobody polled the port.
    pub transmit_overflows: u64,
    /// Request packets retransmitted (go-back-N).
    pub retransmitted_packets: u64,
    /// Go-back-N rounds started (timeouts, sequence NAKs, lost responses).
    pub retries: u64,
    /// Local ACK timeouts.
    pub ack_timeouts: u64,
    /// RNR NAKs sent by the responder.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received by the requester.
    pub rnr_naks_received: u64,
    /// NAKs other than RNR sent.
    pub naks_sent: u64,
    /// NAKs other than RNR received.
    pub naks_received: u64,
    /// PSN sequence errors seen by the responder.
    pub out_of_sequence: u64,
    /// Duplicate requests seen by the responder.
    pub duplicate_requests: u64,
    /// Duplicate or stale responses ignored by the requester.
    pub duplicate_responses: u64,
    /// UD packets dropped for a Q_Key mismatch.
    pub qkey_violations: u64,
    /// UC/UD messages dropped (no receive WQE, PSN gap).
    pub messages_dropped: u64,
    /// Received frames whose ICRC did not verify (also counted in `frames_dropped`).
    pub icrc_errors: u64,
    /// Responses not queued because the responder's queue was full (duplicate floods).
    pub responses_dropped: u64,
    /// SQ doorbells merged into an earlier one of their QP still in flight, because
    /// [`DOORBELLS_IN_FLIGHT_LIMIT`] were in flight (a driver ringing faster than
    /// virtual time passes).
    pub doorbells_merged: u64,
}

/// The transport's device-wide state.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    /// Per-QP state of every QP in RTR, RTS or ERR, by QPN (the round robin is `active`).
    pub qps: QpTable,
    /// QPs that may have something to transmit, served round robin.
    pub active: VecDeque<u32>,
    /// The earliest pending `TransportTx` event that is not stale.
    pub next_tx_at: Option<Picoseconds>,
    /// SQ doorbells written by the host and not yet arrived, in arrival order.
    pub doorbells: VecDeque<DoorbellInFlight>,
    /// The PCIe read channel (completions to the device) is busy until then.
    pub pcie_read_free: Picoseconds,
    /// Source of timer generations (never reused, so a stale timer is always ignored).
    pub generation: u64,
    pub counters: TransportCounters,
    /// The capabilities the WQE checks use (SGE and inline limits).
    pub caps: rnic_firmware_if::caps::DeviceCaps,
}

/// SQ doorbells in flight at most before a new one is merged into its QP's newest one in
/// flight (which then brings the newer producer index, at its own arrival): memory stays
/// bounded by the number of QPs however fast a driver rings. A driver writing doorbells
/// 1 ns apart (`doorbell_ps` 150 ns) has 150 in flight.
pub const DOORBELLS_IN_FLIGHT_LIMIT: usize = 4096;

/// An SQ doorbell on its way: a posted write the device acts on when it arrives,
/// `doorbell_ps` after the host wrote it (and after the doorbells written before it:
/// posted writes do not pass each other). Until then the requester does not know the new
/// producer index, however often the port wakes in between.
#[derive(Debug, Clone)]
pub(crate) struct DoorbellInFlight {
    /// When it reaches the device.
    pub arrives: Picoseconds,
    pub qpn: u32,
    /// The requester incarnation it was rung for: a QP that left RTS and came back in
    /// between has read its producer index from the QPC and ignores it.
    pub generation: u64,
    pub producer: u16,
    pub direct: DirectWqe,
}

/// What a doorbell does to the WQE a direct-WQE doorbell left with the requester.
#[derive(Debug, Clone)]
pub(crate) enum DirectWqe {
    /// A plain doorbell: the held WQE (if any) stays.
    Keep,
    /// The doorbell carried this WQE (its SQ index, its bytes).
    Carried(Box<(u16, [u8; SQ_WQE_SIZE])>),
    /// The doorbell carried a WQE with the wrong index: it is fetched from the ring.
    Discard,
}

impl Transport {
    /// The transport of a device with `caps` after power-on or function reset: no QP.
    pub fn new(caps: &rnic_firmware_if::caps::DeviceCaps) -> Self {
        Self {
            qps: QpTable::default(),
            active: VecDeque::with_capacity(64),
            next_tx_at: None,
            doorbells: VecDeque::new(),
            pcie_read_free: Picoseconds::ZERO,
            generation: 0,
            counters: TransportCounters::default(),
            caps: *caps,
        }
    }

    /// What the transport counted.
    pub fn counters(&self) -> TransportCounters {
        self.counters
    }

    /// Bytes the per-QP transport state holds: each QP's boxed runtime with the capacity
    /// of its queues, and the table's slots (one pointer per QPN up to the highest in
    /// use). For the memory-per-QP figures (docs/benchmarks.md).
    pub fn qp_state_bytes(&self) -> usize {
        use std::mem::size_of;
        self.qps.slot_bytes()
            + self
                .qps
                .values()
                .map(|runtime| {
                    size_of::<QpRuntime>()
                        + runtime.requester.window.capacity() * size_of::<SendWqe>()
                        + runtime.requester.direct.as_ref().map_or(0, |d| size_of_val(&**d))
                        + runtime.responder.pending.capacity() * size_of::<Response>()
                        + runtime.responder.replay.capacity() * size_of::<qp_runtime::ReplayEntry>()
                })
                .sum::<usize>()
    }

    /// Puts QP `qpn` at the back of the port's round robin unless it is in it already;
    /// false if the transport has no such QP.
    fn join_ring(&mut self, qpn: u32) -> bool {
        let Some(runtime) = self.qps.get_mut(qpn) else {
            return false;
        };
        if !runtime.in_ring {
            runtime.in_ring = true;
            self.active.push_back(qpn);
        }
        true
    }

    /// A fresh timer generation.
    pub fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }
}

// ---- the port -------------------------------------------------------------------------

impl<I: Io> Engine<I> {
    /// Delivers an Ethernet frame (without FCS) to the device's port now. The engines
    /// process it when it has been through the receive pipeline (at once with zero
    /// receive-side costs, e.g. the `ideal` preset).
    pub fn receive_frame(&mut self, frame: &[u8]) {
        self.receive_frame_with(frame, Icrc::Computed);
    }

    /// [`receive_frame`](Self::receive_frame) with the frame's ICRC state: an
    /// [`Icrc::Offloaded`] frame is not checked.
    fn receive_frame_with(&mut self, frame: &[u8], icrc: Icrc) {
        if let Some((due, qpn)) = self.admit_frame(frame, icrc) {
            let mut buffer = self.io.port().take_buffer(frame.len());
            buffer.extend_from_slice(frame);
            self.queue_frame(due, qpn, icrc, buffer);
        }
    }

    /// [`receive_frame`](Self::receive_frame) of a frame in a buffer the device may keep:
    /// a frame that waits for the receive pipeline stays in it (no copy). Returns a buffer
    /// for the caller to reuse: this one, or a spare from the device's pool. `icrc` says
    /// whether the frame's ICRC is checked ([`Icrc::Computed`]) or trusted.
    pub fn receive_frame_owned(&mut self, frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        match self.admit_frame(&frame, icrc) {
            None => frame,
            Some((due, qpn)) => {
                // Not cleared: the buffer ends up under a transmitted frame, and
                // `emit_frame_offloaded` reaches the frame's length without a memset
                // only if the old bytes are still there.
                let spare = self.io.port().take_frame_buffer(frame.len());
                self.queue_frame(due, qpn, icrc, frame);
                spare
            }
        }
    }

    /// Charges a received frame's receive-side costs; processes it at once when it is
    /// due now and nothing is queued (then None), or returns when it is due and its QPN.
    fn admit_frame(&mut self, frame: &[u8], icrc: Icrc) -> Option<(Picoseconds, u32)> {
        let now = self.now();
        let start = self.io.port().receive_start(now);
        let params = *self.io.timing().params();
        let info = classify(frame);
        self.io.timing().frame = FrameCharges {
            qpn: info.qpn,
            ..FrameCharges::default()
        };
        if start > now {
            self.io.timing().record(Stage::RxQueue, Picoseconds(start.0 - now.0));
        }
        let pipeline = params.cycles(params.rx_pipeline_cycles);
        self.io.timing().record(Stage::RxPipeline, pipeline);
        let write = params.pcie_write_transfer(info.payload);
        if info.payload > 0 {
            self.io.timing().record(Stage::PayloadWrite, write);
        }
        let mut link = write;
        let mut cqe = Picoseconds::ZERO;
        if info.may_complete {
            cqe = params.cqe_write();
            link = link + params.pcie_write_transfer(64);
            self.io.timing().record(Stage::CqeWrite, cqe);
        }
        let due = self.io.port().receive_book(start, link, pipeline + write + cqe);
        if due == now && self.io.port().receive_pipeline_is_empty() {
            self.process_frame(info.qpn, frame, icrc);
            return None;
        }
        Some((due, info.qpn))
    }

    /// Queues an admitted frame for the receive pipeline event at `due`.
    fn queue_frame(&mut self, due: Picoseconds, qpn: u32, icrc: Icrc, frame: Vec<u8>) {
        self.io.port().queue_received(due, qpn, icrc, frame);
        self.io.schedule_at(due, Timer::Rx);
    }

    /// The receive pipeline delivers every frame due by now to the engines.
    pub(crate) fn transport_rx_event(&mut self) {
        while let Some((qpn, icrc, frame)) = {
            let now = self.now();
            self.io.port().received(now)
        } {
            self.process_frame(qpn, &frame, icrc);
            self.io.port().give_buffer(frame);
        }
    }

    /// Runs a received frame through the engines; receive-side costs found on the way
    /// (translation, atomics' reads) delay the QP's next response.
    fn process_frame(&mut self, qpn: u32, frame: &[u8], icrc: Icrc) {
        self.io.timing().frame = FrameCharges {
            qpn,
            ..FrameCharges::default()
        };
        self.parse_and_dispatch(frame, icrc);
        let charges = std::mem::take(&mut self.io.timing().frame);
        let mut delay = charges.latency;
        if charges.read_bytes > 0 {
            let read = self.io.timing().params().pcie_read(charges.read_bytes);
            self.io.timing().record(Stage::PayloadRead, read);
            delay = delay + read;
        }
        if delay > Picoseconds::ZERO {
            let ready = self.now() + delay;
            if let Some(runtime) = self.transport.qps.get_mut(charges.qpn) {
                runtime.response_ready = runtime.response_ready.max(ready);
            }
        }
    }

    fn parse_and_dispatch(&mut self, frame: &[u8], icrc: Icrc) {
        // Borrowed, not moved out of the Result: a parsed frame is large.
        let result = wire::parse_frame_with(frame, icrc);
        let parsed = match &result {
            Ok(parsed) => parsed,
            Err(error) => {
                let (field, value) = match error {
                    wire::WireError::BadIcrc { found, .. } => {
                        self.transport.counters.icrc_errors += 1;
                        ("ICRC", u64::from(*found))
                    }
                    _ => ("RoCEv2 frame", 0),
                };
                self.drop_frame("frame", field, value, format!("a well-formed RoCEv2 frame: {error}"));
                return;
            }
        };
        self.dispatch_packet(frame, parsed);
    }

    /// Drops a received frame: counted and diagnosed.
    pub(crate) fn drop_frame(&mut self, object: impl Into<String>, field: &'static str, value: u64, expected: String) {
        self.transport.counters.frames_dropped += 1;
        self.diagnose(Source::Transport, object, field, value, expected);
    }

    /// Puts QP `qpn` on the port's ring and makes sure the port runs now.
    pub(crate) fn kick_qp(&mut self, qpn: u32) {
        if self.transport.join_ring(qpn) {
            self.schedule_tx(self.now());
        }
    }

    /// Makes sure a `TransportTx` event runs at `at` or earlier.
    fn schedule_tx(&mut self, at: Picoseconds) {
        if self.transport.next_tx_at.is_some_and(|t| t <= at) {
            return;
        }
        self.transport.next_tx_at = Some(at);
        self.io.schedule_at(at, Timer::Tx);
    }

    /// The port: frames whose last bit left go out (or loop back); the next frame is
    /// built if the pipeline has room and the PCIe read channel is free. Runs for the
    /// pending transmit event only ([`Engine::timer`] drops the ones an earlier event
    /// superseded).
    pub(crate) fn transport_tx_event(&mut self) {
        let now = self.now();
        debug_assert_eq!(self.transport.next_tx_at, Some(now), "a superseded transmit event");
        self.transport.next_tx_at = None;
        while let Some(frame) = self.io.port().departed(now) {
            self.frame_left_port(frame);
        }
        self.deliver_doorbells(now);
        let depth = self.io.timing().params().tx_pipeline_depth;
        let room = self.io.port().transmit_pipeline_len() < depth;
        let pcie_free = self.transport.pcie_read_free <= now;
        let tried = room && pcie_free;
        let built = tried && self.build_next_frame();
        let mut next = self.io.port().next_departure();
        let room = self.io.port().transmit_pipeline_len() < depth;
        if room && !self.transport.active.is_empty() && (built || !tried) {
            let at = now.max(self.transport.pcie_read_free);
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(at) = next {
            self.schedule_tx(at);
        }
        if let Some(doorbell) = self.transport.doorbells.front() {
            self.schedule_tx(doorbell.arrives);
        }
    }

    /// Builds the next frame of the next QP in the ring with something to send, into the
    /// transmit pipeline; returns whether one was built.
    fn build_next_frame(&mut self) -> bool {
        let mut budget = self.transport.active.len();
        while budget > 0 {
            budget -= 1;
            let Some(qpn) = self.transport.active.pop_front() else {
                break;
            };
            match self.transport.qps.get_mut(qpn) {
                Some(runtime) => runtime.in_ring = false,
                None => continue,
            }
            self.io.timing().frame = FrameCharges {
                qpn,
                ..FrameCharges::default()
            };
            let (frame, response) = match self.responder_next_packet(qpn) {
                Some(frame) => (Some(frame), true),
                None => (self.requester_next_packet(qpn), false),
            };
            if self.qp_has_work(qpn) {
                self.transport.join_ring(qpn);
            }
            if let Some(frame) = frame {
                self.launch_frame(qpn, frame, response);
                return true;
            }
        }
        false
    }

    /// Times a frame just built: payload read, transmit pipeline, waiting for the port,
    /// serialisation; puts it in the pipeline.
    fn launch_frame(&mut self, qpn: u32, frame: Vec<u8>, response: bool) {
        let now = self.now();
        let charges = std::mem::take(&mut self.io.timing().frame);
        self.io.timing().frame.qpn = qpn;
        // The costs this frame is charged, worked out before any is recorded (no copy of
        // the whole parameter set per frame).
        let params = self.io.timing().params();
        let read_transfer = (charges.read_bytes > 0).then(|| params.pcie_read_transfer(charges.read_bytes));
        let read_latency = Picoseconds(params.pcie_read_latency_ps);
        let pipeline = params.cycles(params.tx_pipeline_cycles);
        let serialisation = params.serialisation(frame.len() as u64);
        let mut latency = charges.latency;
        if response {
            if let Some(runtime) = self.transport.qps.get(qpn) {
                latency = latency + Picoseconds(runtime.response_ready.0.saturating_sub(now.0));
            }
        }
        let mut link = charges.read_link;
        if let Some(transfer) = read_transfer {
            let read = read_latency + transfer;
            self.io.timing().record(Stage::PayloadRead, read);
            latency = latency + read;
            link = link + transfer;
        }
        self.transport.pcie_read_free = now + link;
        self.io.timing().record(Stage::TxPipeline, pipeline);
        let ready = now + latency + pipeline;
        let start = self.io.port().transmit(ready, serialisation, frame);
        if start > ready {
            self.io
                .timing()
                .record(Stage::PortQueue, Picoseconds(start.0 - ready.0));
        }
        self.io.timing().record(Stage::Serialisation, serialisation);
    }

    /// Whether QP `qpn` may have a packet to send.
    fn qp_has_work(&self, qpn: u32) -> bool {
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return false;
        };
        if !runtime.responder.pending.is_empty() {
            return true;
        }
        let requester = &runtime.requester;
        runtime.state == QpState::Rts
            && !requester.rnr_wait
            && !requester.stalled
            && (requester.cursor_slot < requester.window.len() || requester.fetched != requester.producer)
    }

    /// A frame left the port: to ourselves (loopback) or out to `poll_transmit`.
    fn frame_left_port(&mut self, frame: Vec<u8>) {
        if let Some(frame) = self.io.port().frame_left(frame) {
            // Looped back inside the device: nobody else sees it, nothing alters it.
            self.receive_frame_with(&frame, Icrc::Offloaded);
            self.io.port().give_buffer(frame);
        }
    }

    /// Routes a parsed packet to the responder (requests) or the completer (responses).
    fn dispatch_packet(&mut self, frame: &[u8], parsed: &wire::ParsedFrame<'_>) {
        let repr = &parsed.repr;
        if !self.is_local_mac(&repr.ethernet.destination) {
            self.drop_frame(
                "frame",
                "destination MAC",
                mac_value(&repr.ethernet.destination),
                "one of the port's MAC addresses (SMAC table)".into(),
            );
            return;
        }
        let (_, destination_gid) = path::packet_gids(&repr.ip);
        if !self.is_local_gid(&destination_gid) {
            self.drop_frame(
                "frame",
                "destination IP",
                u64::from_be_bytes(destination_gid[8..].try_into().unwrap_or_default()),
                "one of the port's GIDs".into(),
            );
            return;
        }
        let bth = &repr.bth;
        if bth.transport_version != 0 || bth.partition_key & 0x7FFF != 0x7FFF {
            self.drop_frame(
                format!("QP {:#x}", bth.destination_qp),
                "BTH P_Key/TVer",
                u64::from(bth.partition_key),
                "TVer 0 and the default P_Key 0xFFFF".into(),
            );
            return;
        }
        let qpn = bth.destination_qp;
        let opcode = bth.opcode.0;
        let Some(runtime) = self.transport.qps.get(qpn) else {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "BTH DestQP",
                u64::from(qpn),
                "a QP in RTR or RTS".into(),
            );
            return;
        };
        let (state, service) = (runtime.state, runtime.config.service);
        if !matches!(state, QpState::Rtr | QpState::Rts) {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "QP_ST",
                u64::from(u8::from(state)),
                "a QP in RTR or RTS to receive".into(),
            );
            return;
        }
        let expected_service = match opcode >> 5 {
            0 => Some(ServiceType::Rc),
            1 => Some(ServiceType::Uc),
            3 => Some(ServiceType::Ud),
            _ => None,
        };
        if expected_service != Some(service) {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "BTH OpCode",
                u64::from(opcode),
                format!("an opcode of the QP's service type {service:?}"),
            );
            return;
        }
        match service {
            ServiceType::Rc if op::is_response(opcode) => {
                if state != QpState::Rts {
                    self.drop_frame(
                        format!("QP {qpn:#x}"),
                        "QP_ST",
                        u64::from(u8::from(state)),
                        "responses only for a QP in RTS".into(),
                    );
                    return;
                }
                self.completer_receive(qpn, parsed);
            }
            ServiceType::Ud => self.ud_receive(qpn, frame, parsed),
            ServiceType::Uc => self.uc_receive(qpn, parsed),
            _ => self.rc_receive(qpn, parsed),
        }
    }
}

/// What the receive pipeline needs to know of a frame before the engines see it.
#[derive(Debug, Clone, Copy, Default)]
struct RxInfo {
    qpn: u32,
    /// Payload bytes the frame's data DMA writes (SEND, WRITE, READ response).
    payload: u64,
    /// Whether processing it may write a CQE (message end at the responder; ACK, last
    /// READ response or atomic ACK at the requester).
    may_complete: bool,
}

/// A light look at a frame's headers (no checks: the engines do them).
fn classify(frame: &[u8]) -> RxInfo {
    let get = |at: usize| frame.get(at).copied().unwrap_or(0);
    let be16 = |at: usize| u16::from_be_bytes([get(at), get(at + 1)]);
    let (mut l3, mut ethertype) = (14usize, be16(12));
    if ethertype == 0x8100 {
        l3 = 18;
        ethertype = be16(16);
    }
    let ip = match ethertype {
        0x0800 => usize::from(get(l3) & 0xF) * 4,
        0x86DD => 40,
        _ => return RxInfo::default(),
    };
    let bth = l3 + ip + 8;
    if frame.len() < bth + 12 {
        return RxInfo::default();
    }
    let opcode = wire::opcode::BthOpcode(get(bth));
    let qpn = u32::from_be_bytes([0, get(bth + 5), get(bth + 6), get(bth + 7)]);
    let pad = u64::from((get(bth + 1) >> 4) & 3);
    let headers = (bth + opcode.transport_header_len() + 4) as u64;
    let payload = if opcode.has_payload() && !opcode.is_read_request() && !opcode.is_atomic() {
        (frame.len() as u64).saturating_sub(headers + pad)
    } else {
        0
    };
    let may_complete = opcode.is_ack()
        || opcode.is_atomic_ack()
        || (opcode.is_read_response() && opcode.ends_message())
        || (opcode.is_send() && opcode.ends_message())
        || (opcode.is_write() && opcode.has_immediate() && opcode.ends_message());
    RxInfo {
        qpn,
        payload,
        may_complete,
    }
}

/// A MAC address as a number for diagnostics.
pub(crate) fn mac_value(mac: &[u8; 6]) -> u64 {
    mac.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b))
}

// ---- hooks from the QP engine ------------------------------------------------------------

impl<I: Io> Engine<I> {
    /// MODIFY_QPC wrote `qpc` (state `to`) for QP `qpn`: create, refresh or drop the
    /// transport state. Called before the flush of a move to ERR.
    pub(crate) fn qp_modified(&mut self, qpn: u32, from: QpState, to: QpState, qpc: &Qpc) {
        match to {
            QpState::Rtr => {
                let generation = self.transport.next_generation();
                let runtime = Box::new(QpRuntime::new(qpn, qpc, QpState::Rtr, generation));
                self.transport.qps.insert(qpn, runtime);
            }
            QpState::Rts => {
                let fresh = from != QpState::Rts || !self.transport.qps.contains(qpn);
                let generation = self.transport.next_generation();
                match self.transport.qps.get_mut(qpn) {
                    Some(runtime) if !fresh => {
                        runtime.config = qp_runtime::QpConfig::from_qpc(qpn, qpc);
                    }
                    Some(runtime) => {
                        runtime.config = qp_runtime::QpConfig::from_qpc(qpn, qpc);
                        runtime.requester = qp_runtime::Requester::new(qpc, generation);
                        runtime.state = QpState::Rts;
                    }
                    None => {
                        let runtime = Box::new(QpRuntime::new(qpn, qpc, QpState::Rts, generation));
                        self.transport.qps.insert(qpn, runtime);
                    }
                }
                self.kick_qp(qpn);
            }
            QpState::Err => self.transport_enter_error(qpn),
            _ => {
                self.transport.qps.remove(qpn);
            }
        }
    }

    /// The QP goes to ERR: forget the requester's WQEs (the flush that follows covers them
    /// from SQ_CONSUMER_IDX), complete a claimed SRQ WQE with a flush error, keep only
    /// queued ACK/NAKs so a final NAK still goes out.
    fn transport_enter_error(&mut self, qpn: u32) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        runtime.state = QpState::Err;
        runtime.requester.clear();
        let claimed = runtime.responder.inbound.recv.take();
        runtime.responder.inbound = qp_runtime::Inbound::IDLE;
        runtime.responder.pending.retain(|r| matches!(r, Response::Ack { .. }));
        let recv_cq = runtime.config.recv_cq;
        if let Some(claimed) = claimed.filter(|c| c.srq.is_some()) {
            let mut cqe = Cqe::zeroed();
            cqe.set_opcode(RecvOpcode::Send as u8);
            cqe.set_receive_side(true);
            cqe.set_status(CqeStatus::WrFlushErr as u8);
            cqe.set_wqe_index(claimed.wqe_index);
            cqe.set_local_qp_number(qpn);
            let _ = self.post_cqe(recv_cq, cqe, false);
        }
    }

    /// The host wrote an SQ doorbell moving QP `qpn`'s producer index (QP in RTS); it
    /// takes effect when it arrives ([`DoorbellInFlight`]). A direct-WQE doorbell carries
    /// the WQE before the producer index: the requester takes it from there instead of
    /// fetching it, and the doorbell costs the 64-byte write on the link as well.
    pub(crate) fn sq_doorbell(&mut self, qpn: u32, producer_index: u16, direct_wqe: Option<[u8; SQ_WQE_SIZE]>) {
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        let generation = runtime.requester.generation;
        let params = self.io.timing().params();
        let mut delay = Picoseconds(params.doorbell_ps);
        let mut direct = DirectWqe::Keep;
        if let Some(bytes) = direct_wqe {
            delay = delay + params.pcie_write_transfer(SQ_WQE_SIZE as u64);
            let index = producer_index.wrapping_sub(1);
            let stated = RcSqWqe(bytes).direct_wqe_index();
            if stated == producer_index {
                direct = DirectWqe::Carried(Box::new((index, bytes)));
            } else {
                direct = DirectWqe::Discard;
                self.diagnose(
                    Source::Transport,
                    format!("QP {qpn:#x} direct WQE"),
                    "WQE_IDX",
                    u64::from(stated),
                    format!("the doorbell's producer index {producer_index} (the WQE is fetched from the ring)"),
                );
            }
        }
        self.io.timing().frame.qpn = qpn;
        self.io.timing().record(Stage::Doorbell, delay);
        if self.transport.doorbells.len() >= DOORBELLS_IN_FLIGHT_LIMIT {
            let newest = self.transport.doorbells.iter_mut().rev().find(|d| d.qpn == qpn);
            if let Some(newest) = newest.filter(|d| d.generation == generation) {
                newest.producer = producer_index;
                if !matches!(direct, DirectWqe::Keep) {
                    newest.direct = direct;
                }
                self.transport.counters.doorbells_merged += 1;
                return;
            }
        }
        let earliest = self.now() + delay;
        let arrives = self
            .transport
            .doorbells
            .back()
            .map_or(earliest, |last| earliest.max(last.arrives));
        self.transport.doorbells.push_back(DoorbellInFlight {
            arrives,
            qpn,
            generation,
            producer: producer_index,
            direct,
        });
        self.schedule_tx(arrives);
    }

    /// The SQ doorbells that have reached the device by `now` take effect: each QP's
    /// requester learns its producer index and the QP joins the ring. One for a QP that
    /// left RTS since, or was destroyed, is dropped (the QPC holds the index, and a flush
    /// or a fresh requester reads it from there).
    fn deliver_doorbells(&mut self, now: Picoseconds) {
        while self
            .transport
            .doorbells
            .front()
            .is_some_and(|doorbell| doorbell.arrives <= now)
        {
            let Some(doorbell) = self.transport.doorbells.pop_front() else {
                break;
            };
            let Some(runtime) = self.transport.qps.get_mut(doorbell.qpn) else {
                continue;
            };
            if runtime.state != QpState::Rts || runtime.requester.generation != doorbell.generation {
                continue;
            }
            runtime.requester.producer = doorbell.producer;
            runtime.requester.stalled = false;
            match doorbell.direct {
                DirectWqe::Keep => {}
                DirectWqe::Carried(wqe) => runtime.requester.direct = Some(wqe),
                DirectWqe::Discard => runtime.requester.direct = None,
            }
            self.transport.join_ring(doorbell.qpn);
        }
    }

    /// An RQ doorbell moved QP `qpn`'s producer index.
    pub(crate) fn rq_doorbell(&mut self, qpn: u32, producer_index: u16) {
        if let Some(runtime) = self.transport.qps.get_mut(qpn) {
            runtime.responder.rq_producer = producer_index;
        }
    }
}

// ---- completions, write-back and errors shared by the engines ------------------------------

impl<I: Io> Engine<I> {
    /// Writes the send-side CQE for `wqe` if it completes visibly: always on error, else
    /// when signaled or the QP signals every WQE.
    pub(crate) fn complete_send(&mut self, qpn: u32, wqe: &FailedWqe) {
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        let (send_cq, signal_all) = (runtime.config.send_cq, runtime.config.signal_all);
        if wqe.status == CqeStatus::Success && !wqe.signaled && !signal_all {
            return;
        }
        let mut cqe = Cqe::zeroed();
        cqe.set_opcode(wqe.opcode);
        cqe.set_receive_side(false);
        cqe.set_status(u8::from(wqe.status));
        cqe.set_wqe_index(wqe.index);
        cqe.set_local_qp_number(qpn);
        cqe.set_byte_count(wqe.length);
        let _ = self.post_cqe(send_cq, cqe, false);
    }

    /// Records the engines' progress for the QPC fields hns names (consumer indices,
    /// PSNs, MSN, retry counters). Like the hns QPC cache, the device does not write the
    /// context at once: the progress goes into the QPC before anything reads it (QUERY_QPC,
    /// MODIFY, a doorbell, the flush) and before the context
    /// cache is written back, with exactly the values of this moment.
    pub(crate) fn sync_qpc(&mut self, qpn: u32) {
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        let requester = &runtime.requester;
        let responder = &runtime.responder;
        let sending = (runtime.state == QpState::Rts).then(|| SqProgress {
            consumer: requester.consumer(),
            next_psn: requester.next_psn,
            una_psn: requester.una_psn,
            retry_left: requester.retry_left,
            rnr_left: requester.rnr_left,
        });
        let progress = QpcProgress {
            sending,
            epsn: responder.epsn,
            msn: responder.msn,
            psn_error: responder.psn_error_sent,
            rq_consumer: responder.rq_consumer,
        };
        self.io.record_progress(qpn, progress);
    }

    /// The requester cannot go on: WQEs before `failed` in the window complete with
    /// WR_FLUSH_ERR, `failed` (if any) with its status, and the QP moves to ERR, which
    /// flushes the rest from the SQ consumer index on.
    pub(crate) fn requester_fatal(&mut self, qpn: u32, failed: Option<FailedWqe>) {
        if let Some(failed) = failed {
            while let Some(runtime) = self.transport.qps.get_mut(qpn) {
                let Some(front) = runtime.requester.window.pop_front() else {
                    break;
                };
                if front.index == failed.index {
                    break;
                }
                self.complete_send(qpn, &FailedWqe::of(&front, CqeStatus::WrFlushErr));
            }
            self.complete_send(qpn, &failed);
            if let Some(runtime) = self.transport.qps.get_mut(qpn) {
                runtime.requester.window.clear();
                runtime.requester.fetched = failed.index.wrapping_add(1);
            }
        }
        self.sync_qpc(qpn);
        self.qp_enter_error(qpn);
    }

    /// The responder hit a fatal error: queue `nak` (if any) for `psn`, report `event`
    /// (with `sub_type`) on the AEQ, and move the QP to ERR.
    pub(crate) fn responder_fatal(&mut self, qpn: u32, nak: Option<(u32, u8)>, event: Option<(AsyncEventType, u8)>) {
        if let Some((psn, syndrome)) = nak {
            if let Some(runtime) = self.transport.qps.get_mut(qpn) {
                runtime.responder.pending.push_back(Response::Ack { psn, syndrome });
                self.transport.counters.naks_sent += 1;
            }
        }
        if let Some((event, sub_type)) = event {
            self.post_async_event(event, sub_type, qpn);
        }
        self.sync_qpc(qpn);
        self.qp_enter_error(qpn);
        // The NAK still goes out from the ERR state.
        self.kick_qp(qpn);
    }
}
