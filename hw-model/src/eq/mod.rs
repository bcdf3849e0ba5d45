//! Event queues (hns §9): completion EQs (CEQs) that tell the driver which CQ has a new
//! event, and the asynchronous EQ (AEQ) that carries QP/CQ/SRQ errors, port events and
//! mailbox completions.
//!
//! * Numbering: CEQs are EQN `0..num_ceqs`, the one AEQ is EQN `num_ceqs`.
//! * MSI-X vectors (hns §9.4): the "other" (abnormal) vectors come first, then the AEQ
//!   vector, then one vector per CEQ — with the default capabilities vector 0 is abnormal,
//!   1 the AEQ and `2 + i` CEQ *i* (`Device::eq_vector`).
//! * The EQC is not a host-memory table: it travels in the mailbox and the device keeps
//!   its own copy in an [`EqSlot`]. Only the EQE buffer lives in host memory, reached
//!   through the EQC's MTR (`EQE_BA << 3`, `EQE_HOP_NUM`, page sizes).
//! * Entries: CEQE `{CQN, OWNER}` (4 B, or 64 B with `EQE_SIZE = 1`), AEQE
//!   `{EVENT_TYPE, SUB_TYPE, OWNER, EVENT_QUEUE_NUM}` (16 B or 64 B) and the mailbox view
//!   of an AEQE (event 0x13). Bytes past the small layout of a 64-byte entry are zero.
//!   The owner bit follows [`eqe_owner_bit_for_producer`]: 1 on lap 0, 0 on lap 1, …
//! * Indices: the producer index counts freely in 24 bits, the consumer index is what the
//!   EQ doorbell last wrote (24 bits); occupancy is `(pi − ci) mod 2^24`.
//! * Full EQ: the entry is dropped and `EQ_ST` becomes overflow (2); the first loss of an
//!   overflow episode is reported (AEQ: abnormal status bit `AEQ_OVERFLOW`; CEQ: async
//!   event `CEQ_OVERFLOW` with the EQN). The EQ keeps working once the driver frees room.
//! * Interrupts: after an entry is written, an enabled (`EVENT_INT_EN`) and armed EQ
//!   raises its vector subject to coalescing (`EQ_MAX_CNT` entries or `EQ_PERIOD` µs);
//!   raising it moves `ARM_ST` from armed (1) to fired (0); always-armed (3) stays.
//!
//! The block ([`EventQueues`]) owns the EQs, their interrupt enables (`EVENT_INT_EN`), the
//! abnormal interrupt registers and the MSI-X table with the interrupt sink behind it.
//! It accepts the EQ mailbox commands, the event requests of the other blocks (a CEQE
//! for a CQ, an AEQE, a mailbox completion), the EQ doorbell, its BAR0 and BAR4
//! registers and its coalescing timers; it produces MSI-X messages. What it needs from
//! the rest of the device is its [`Io`]: the MTT and the bus to write EQEs, the timing
//! model, the scheduler for its timers, and diagnostics.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::caps::DeviceCaps;
use rnic_firmware_if::context::{EqArmState, EqState, Eqc};
use rnic_firmware_if::doorbell::{EqDoorbell, EqDoorbellCommand};
use rnic_firmware_if::eqe::{eqe_owner_bit_for_producer, Aeqe, AeqeMailbox, Ceqe, EQE_SIZE_64};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::MailboxCompletion;
use rnic_firmware_if::mtr::{page_shift_from_field, MAX_HOP};
use rnic_firmware_if::regs;

use crate::command::Rejection;
use crate::diagnostics::Source;
use crate::interrupt::InterruptSink;
use crate::memory::MemoryError;
use crate::mtt::{Mtr, MttError, MAX_BT_PAGE_SHIFT, MAX_BUFFER_PAGE_SHIFT};
use crate::pci::MsixTable;
use crate::time::Picoseconds;
use crate::timing::{Stage, TimingModel};

/// What the event block needs from the rest of the device.
pub(crate) trait Io {
    /// Translates byte `offset` of `mtr` through the MTT; None while bus mastering is off.
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>>;
    /// DMA write.
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// A BT entry of a translation walk could not be read: a failed DMA access.
    fn count_dma_error(&mut self);
    /// The timing model (EQE writes and MSI-X are recorded in the breakdown).
    fn timing(&mut self) -> &mut TimingModel;
    /// Runs `timer` after `delay`.
    fn schedule_in(&mut self, delay: Picoseconds, timer: Timer);
    /// Records a diagnostic.
    fn diagnose(&mut self, source: Source, object: String, field: &'static str, value: u64, expected: String);
}

/// An EQ's coalescing timer, as the block schedules it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timer {
    /// EQ number.
    pub eqn: u32,
    /// Generation of the timer, to ignore timers superseded by an earlier interrupt.
    pub generation: u64,
}

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;

/// Number of AEQs the device has (hns `num_aeq_vectors` = 1).
pub(crate) const NUM_AEQS: u32 = 1;
/// Mask of the 24-bit producer and consumer indices.
pub(crate) const INDEX_MASK: u32 = 0x00FF_FFFF;
/// Largest log2 depth accepted whatever the capabilities say: the owner bit of a
/// 24-bit index must still flip between laps.
const MAX_SHIFT: u32 = 23;

/// Which kind of EQ a number or a command is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EqKind {
    /// A completion EQ (CEQ): CEQEs naming CQs.
    Completion,
    /// The asynchronous EQ (AEQ): error, port and mailbox events.
    Async,
}

impl EqKind {
    /// "CEQ" or "AEQ", for diagnostics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            EqKind::Completion => "CEQ",
            EqKind::Async => "AEQ",
        }
    }
}

/// One EQ number's state: free, or an EQ owning its context copy and buffer translation.
#[derive(Debug, Clone)]
pub(crate) enum EqSlot {
    /// No EQ (power-on, or after DESTROY).
    Free,
    /// A created EQ.
    Active(EventQueue),
}

/// A created EQ: the EQC as the driver gave it plus the device's running state.
#[derive(Debug, Clone)]
pub(crate) struct EventQueue {
    /// The EQC from CREATE (static fields; running fields are kept below).
    eqc: Eqc,
    /// CEQ or AEQ.
    kind: EqKind,
    /// Translation of the EQE buffer.
    mtr: Mtr,
    /// Entries in the ring (a power of two).
    depth: u32,
    /// Bytes per entry (4, 16 or 64).
    entry_size: usize,
    /// Entries written, 24-bit free-running.
    producer_index: u32,
    /// Consumer index last written by the EQ doorbell, 24 bits.
    consumer_index: u32,
    /// `ARM_ST`.
    arm: EqArmState,
    /// `EQ_ST`: valid, overflow (sticky) or failure (sticky).
    state: EqState,
    /// `EQ_MAX_CNT`: entries per interrupt.
    max_count: u16,
    /// `EQ_PERIOD`: coalescing period in µs (0 = no timer).
    period: u16,
    /// Entries written since the last interrupt.
    pending: u32,
    /// Generation of the coalescing timer; a timer event of another generation is stale.
    generation: u64,
    /// A coalescing timer of the current generation is scheduled.
    timer_scheduled: bool,
    /// The last entry offered was dropped because the EQ was full (one report per
    /// overflow episode).
    overflowing: bool,
}

impl EventQueue {
    /// Entries written and not yet consumed: `(pi − ci) mod 2^24`.
    fn occupancy(&self) -> u32 {
        self.producer_index.wrapping_sub(self.consumer_index) & INDEX_MASK
    }

    /// Whether a new entry may raise the interrupt (armed or always armed).
    fn armed(&self) -> bool {
        matches!(self.arm, EqArmState::Armed | EqArmState::AlwaysArmed)
    }

    /// The EQC as QUERY reports it: the created context with the running fields filled.
    fn context(&self) -> Eqc {
        let mut eqc = self.eqc;
        eqc.set_eq_state(self.state);
        eqc.set_arm_state(self.arm);
        eqc.set_producer_index(self.producer_index);
        eqc.set_consumer_index(self.consumer_index);
        eqc.set_max_count(self.max_count);
        eqc.set_period(self.period);
        eqc.set_eqe_count(self.pending.min(u32::from(u16::MAX)) as u16);
        eqc
    }
}

/// Every EQ of the function, indexed by EQN.
#[derive(Debug, Clone)]
pub(crate) struct Queues {
    /// Slot per EQN: CEQs first, then the AEQ.
    slots: Vec<EqSlot>,
    /// Number of CEQs (the AEQ's EQN).
    num_ceqs: u32,
    /// log2 of the largest CEQ depth.
    max_ceq_shift: u32,
    /// log2 of the largest AEQ depth.
    max_aeq_shift: u32,
    /// First AEQ vector (after the "other" vectors).
    aeq_vector_base: u16,
    /// First CEQ vector (after the AEQ vectors).
    ceq_vector_base: u16,
    /// Source of coalescing-timer generations; never reused, so a timer of a destroyed
    /// EQ cannot fire into a new EQ of the same number.
    next_generation: u64,
}

impl Queues {
    /// All EQ slots free, sized from the capabilities.
    pub(crate) fn new(caps: &DeviceCaps) -> Self {
        let num_ceqs = u32::from(caps.num_ceqs);
        let other = u16::from(caps.num_other_vectors.max(1));
        let aeq_vectors = u16::from(caps.num_aeq_vectors.max(1));
        Self {
            slots: vec![EqSlot::Free; (num_ceqs + NUM_AEQS) as usize],
            num_ceqs,
            max_ceq_shift: depth_shift(caps.ceq_depth),
            max_aeq_shift: depth_shift(caps.aeq_depth),
            aeq_vector_base: other,
            ceq_vector_base: other + aeq_vectors,
            next_generation: 0,
        }
    }

    /// Number of CEQs the device has vectors for.
    pub(crate) fn num_ceqs(&self) -> u32 {
        self.num_ceqs
    }

    /// EQN of the created AEQ; before one exists, the number hns drivers use when they
    /// create every CEQ the device offers.
    pub(crate) fn aeq_number(&self) -> u32 {
        (0..self.slots.len() as u32)
            .find(|eqn| self.active(*eqn).is_some_and(|q| q.kind == EqKind::Async))
            .unwrap_or(self.num_ceqs)
    }

    /// The kind of the created EQ `eqn`, if any.
    pub(crate) fn kind_of(&self, eqn: u32) -> Option<EqKind> {
        self.active(eqn).map(|queue| queue.kind)
    }

    /// Whether `eqn` is a created EQ of `kind`.
    pub(crate) fn is_active(&self, eqn: u32, kind: EqKind) -> bool {
        self.kind_of(eqn) == Some(kind)
    }

    fn active(&self, eqn: u32) -> Option<&EventQueue> {
        match self.slots.get(eqn as usize) {
            Some(EqSlot::Active(queue)) => Some(queue),
            _ => None,
        }
    }

    fn active_mut(&mut self, eqn: u32) -> Option<&mut EventQueue> {
        match self.slots.get_mut(eqn as usize) {
            Some(EqSlot::Active(queue)) => Some(queue),
            _ => None,
        }
    }

    fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Refuses an EQN that cannot hold an EQ of `kind` with
    /// [`MailboxCompletion::InvalidIndex`]: a CEQ needs its own vector, so its number is
    /// below the device's CEQ count; the AEQ may take any EQ number (hns gives it the
    /// number after the CEQs the driver created).
    fn check_number(&self, eqn: u32, kind: EqKind) -> Result<(), Rejection> {
        let limit = match kind {
            EqKind::Completion => self.num_ceqs,
            EqKind::Async => self.slots.len() as u32,
        };
        if eqn < limit {
            return Ok(());
        }
        let expected = match kind {
            EqKind::Completion => format!("a CEQ number below {}", self.num_ceqs),
            EqKind::Async => format!("an EQ number below {}", self.slots.len()),
        };
        Err(Rejection {
            status: MailboxCompletion::InvalidIndex,
            field: "tag",
            value: u64::from(eqn),
            expected,
        })
    }

    /// Checks an EQC from CREATE and builds the EQ it describes.
    fn build(&mut self, kind: EqKind, eqc: &Eqc) -> Result<EventQueue, Rejection> {
        if eqc.eq_state_raw() != u8::from(EqState::Valid) {
            return Err(Rejection::parameter(
                Eqc::EQ_ST.name,
                eqc.eq_state_raw().into(),
                "1 (valid)",
            ));
        }
        let max_shift = match kind {
            EqKind::Completion => self.max_ceq_shift,
            EqKind::Async => self.max_aeq_shift,
        };
        let shift = u32::from(eqc.shift());
        if shift > max_shift {
            return Err(Rejection::parameter(
                Eqc::SHIFT.name,
                shift.into(),
                format!(
                    "at most {max_shift} (the {} depth limit {} from the capabilities)",
                    kind.name(),
                    1u64 << max_shift
                ),
            ));
        }
        let hop = eqc.eqe_hop_number();
        if hop > MAX_HOP {
            return Err(Rejection::parameter(Eqc::EQE_HOP_NUM.name, hop.into(), "0..=3"));
        }
        let ba_page_shift = page_shift_from_field(eqc.eqe_ba_page_size());
        if ba_page_shift > MAX_BT_PAGE_SHIFT {
            return Err(Rejection::parameter(
                Eqc::EQE_BA_PG_SZ.name,
                eqc.eqe_ba_page_size().into(),
                format!("0..={} (BT pages of 4 KiB..2 MiB)", MAX_BT_PAGE_SHIFT - 12),
            ));
        }
        let buffer_page_shift = page_shift_from_field(eqc.eqe_buffer_page_size());
        if buffer_page_shift > MAX_BUFFER_PAGE_SHIFT {
            return Err(Rejection::parameter(
                Eqc::EQE_BUF_PG_SZ.name,
                eqc.eqe_buffer_page_size().into(),
                format!("0..={} (buffer pages of 4 KiB..1 GiB)", MAX_BUFFER_PAGE_SHIFT - 12),
            ));
        }
        let size = eqc.eqe_size().map_err(|_| {
            Rejection::parameter(
                Eqc::EQE_SIZE.name,
                eqc.eqe_size_raw().into(),
                "0 (CEQE 4 B / AEQE 16 B) or 1 (64 B)",
            )
        })?;
        let arm = eqc.arm_state().map_err(|_| {
            Rejection::parameter(
                Eqc::ARM_ST.name,
                eqc.arm_state_raw().into(),
                "0 (fired), 1 (armed) or 3 (always armed)",
            )
        })?;
        let entry_size = match kind {
            EqKind::Completion => size.ceqe_bytes(),
            EqKind::Async => size.aeqe_bytes(),
        };
        let depth = 1u32 << shift;
        let mtr = buffer_mtr(
            eqc.eqe_base_address() << 3,
            ba_page_shift,
            buffer_page_shift,
            u64::from(depth) * entry_size as u64,
            hop,
        );
        mtr.validate()
            .map_err(|e| Rejection::parameter(Eqc::EQE_BA.name, mtr.root, format!("a usable EQE buffer: {e}")))?;
        let producer_index = eqc.producer_index() & INDEX_MASK;
        let consumer_index = eqc.consumer_index() & INDEX_MASK;
        if producer_index.wrapping_sub(consumer_index) & INDEX_MASK > depth {
            return Err(Rejection::parameter(
                Eqc::EQ_CONS_INDX.name,
                consumer_index.into(),
                format!("at most {depth} entries behind EQ_PROD_INDX {producer_index:#x} (0 for a new EQ)"),
            ));
        }
        Ok(EventQueue {
            eqc: *eqc,
            kind,
            mtr,
            depth,
            entry_size,
            producer_index,
            consumer_index,
            arm,
            state: EqState::Valid,
            max_count: eqc.max_count(),
            period: eqc.period(),
            pending: 0,
            generation: self.generation(),
            timer_scheduled: false,
            overflowing: false,
        })
    }

    /// MSI-X vector of EQ `eqn`.
    fn vector(&self, eqn: u32) -> u16 {
        match self.kind_of(eqn) {
            Some(EqKind::Async) => self.aeq_vector_base,
            Some(EqKind::Completion) => self.ceq_vector_base + eqn as u16,
            None if eqn < self.num_ceqs => self.ceq_vector_base + eqn as u16,
            None => self.aeq_vector_base,
        }
    }
}

/// log2 of a depth capability (a power of two), capped at [`MAX_SHIFT`].
fn depth_shift(depth: u32) -> u32 {
    depth.checked_ilog2().unwrap_or(0).min(MAX_SHIFT)
}

/// A one-region MTR for a ring of `bytes` bytes.
pub(crate) fn buffer_mtr(root: u64, ba_page_shift: u32, buffer_page_shift: u32, bytes: u64, hop: u8) -> Mtr {
    let pages = bytes.div_ceil(1u64 << buffer_page_shift.min(63)).max(1);
    Mtr::single(root, ba_page_shift, buffer_page_shift, pages, hop)
}

/// An event on its way into an EQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EqEntry {
    /// CEQE: CQ `cqn` has an event.
    Completion { cqn: u32 },
    /// AEQE.
    Async {
        event: AsyncEventType,
        sub_type: u8,
        queue_number: u32,
    },
    /// AEQE, mailbox-completion view (event 0x13).
    Mailbox { token: u16, status: u8, out_param: u64 },
}

impl EqEntry {
    /// The entry's bytes with `owner`, in a 64-byte buffer (the rest zero).
    fn encode(&self, owner: bool) -> [u8; EQE_SIZE_64] {
        let mut out = [0u8; EQE_SIZE_64];
        match *self {
            EqEntry::Completion { cqn } => {
                let mut e = Ceqe::zeroed();
                e.set_cq_number(cqn);
                e.set_owner(owner);
                out[..Ceqe::SIZE].copy_from_slice(e.bytes());
            }
            EqEntry::Async {
                event,
                sub_type,
                queue_number,
            } => {
                let mut e = Aeqe::zeroed();
                e.set_event_type(event.into());
                e.set_sub_type(sub_type);
                e.set_owner(owner);
                e.set_queue_number(queue_number);
                out[..Aeqe::SIZE].copy_from_slice(e.bytes());
            }
            EqEntry::Mailbox {
                token,
                status,
                out_param,
            } => {
                let mut e = AeqeMailbox::zeroed();
                e.set_event_type(AsyncEventType::Mb.into());
                e.set_owner(owner);
                e.set_out_param(out_param);
                e.set_token(token);
                e.set_mailbox_status(status);
                out[..AeqeMailbox::SIZE].copy_from_slice(e.bytes());
            }
        }
        out
    }

    /// The entry in words, for diagnostics.
    fn describe(&self) -> String {
        match *self {
            EqEntry::Completion { cqn } => format!("the CEQE for CQ {cqn:#x}"),
            EqEntry::Async {
                event,
                sub_type,
                queue_number,
            } => {
                format!(
                    "the AEQE {event:?} ({:#x}) sub-type {sub_type} for queue {queue_number:#x}",
                    u8::from(event)
                )
            }
            EqEntry::Mailbox { token, status, .. } => {
                format!("the mailbox AEQE for token {token:#x} (status {status})")
            }
        }
    }

    /// The field naming the entry's subject, and its value.
    fn subject(&self) -> (&'static str, u64) {
        match *self {
            EqEntry::Completion { cqn } => (Ceqe::CQN.name, u64::from(cqn)),
            EqEntry::Async { event, .. } => (Aeqe::EVENT_TYPE.name, u64::from(u8::from(event))),
            EqEntry::Mailbox { token, .. } => (AeqeMailbox::TOKEN.name, u64::from(token)),
        }
    }
}

/// What the event block counted since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EqCounters {
    /// EQEs written.
    pub eqes: u64,
    /// EQ doorbells accepted.
    pub doorbells: u64,
    /// EQ doorbells dropped.
    pub doorbells_dropped: u64,
    /// MSI-X messages delivered or left pending.
    pub interrupts: u64,
}

/// The abnormal interrupt's BAR0 registers.
#[derive(Debug, Clone, Copy, Default)]
struct Abnormal {
    config: u32,
    status: u32,
    enable: u32,
}

/// The events-and-interrupts block: EQs, interrupt enables, the abnormal interrupt and
/// MSI-X.
pub(crate) struct EventQueues {
    queues: Queues,
    /// `EVENT_INT_EN` per EQN.
    enables: Vec<bool>,
    abnormal: Abnormal,
    msix: MsixTable,
    sink: Box<dyn InterruptSink>,
    /// MSI-X enable and function mask, as configuration space holds them.
    msix_enabled: bool,
    function_masked: bool,
    counters: EqCounters,
    /// The capabilities the EQs are sized from (for FUNC_CLEAR and resets).
    caps: DeviceCaps,
}

impl std::fmt::Debug for EventQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueues")
            .field("queues", &self.queues)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl EventQueues {
    /// The block after power-on: no EQ, interrupts disabled, `vectors` MSI-X vectors
    /// delivered to `sink`.
    pub fn new(caps: &DeviceCaps, vectors: u16, sink: Box<dyn InterruptSink>) -> Self {
        Self {
            queues: Queues::new(caps),
            enables: vec![false; regs::MAX_EVENT_INT_ENABLES as usize],
            abnormal: Abnormal::default(),
            msix: MsixTable::new(vectors),
            sink,
            msix_enabled: false,
            function_masked: false,
            counters: EqCounters::default(),
            caps: *caps,
        }
    }

    /// A copy in the current state that signals `sink`.
    pub fn fork(&self, sink: Box<dyn InterruptSink>) -> Self {
        Self {
            queues: self.queues.clone(),
            enables: self.enables.clone(),
            abnormal: self.abnormal,
            msix: self.msix.clone(),
            sink,
            msix_enabled: self.msix_enabled,
            function_masked: self.function_masked,
            counters: self.counters,
            caps: self.caps,
        }
    }

    /// FUNC_CLEAR: every EQ destroyed (interrupt enables and MSI-X are kept).
    pub fn clear(&mut self) {
        self.queues = Queues::new(&self.caps);
    }

    /// Function reset: every EQ destroyed, interrupt enables and abnormal registers
    /// cleared; the MSI-X table and the counters are kept.
    pub fn reset(&mut self) {
        self.clear();
        self.enables.fill(false);
        self.abnormal = Abnormal::default();
    }

    /// What the block counted.
    pub fn counters(&self) -> EqCounters {
        self.counters
    }

    /// Number of CEQs the device has vectors for.
    pub fn num_ceqs(&self) -> u32 {
        self.queues.num_ceqs()
    }

    /// Whether `eqn` is a created EQ of `kind`.
    pub fn is_active(&self, eqn: u32, kind: EqKind) -> bool {
        self.queues.is_active(eqn, kind)
    }

    /// EQN of the AEQ (see [`Queues::aeq_number`]).
    #[cfg(test)]
    pub fn aeq_number(&self) -> u32 {
        self.queues.aeq_number()
    }

    // ---- mailbox commands ----------------------------------------------------------

    /// CREATE_CEQC / CREATE_AEQC: checks the EQC and makes EQ `eqn` active.
    pub fn create(&mut self, eqn: u32, kind: EqKind, eqc: Eqc) -> Result<(), Rejection> {
        self.queues.check_number(eqn, kind)?;
        if kind == EqKind::Async {
            let existing = self.queues.aeq_number();
            if existing != eqn && self.queues.is_active(existing, EqKind::Async) {
                return Err(Rejection::state(
                    "tag",
                    u64::from(eqn),
                    format!("one AEQ per function (AEQ {existing} exists)"),
                ));
            }
        }
        if self.queues.active(eqn).is_some() {
            return Err(Rejection::state(
                Eqc::EQ_ST.name,
                u64::from(u8::from(EqState::Valid)),
                format!("{} {eqn} not in use (destroy it first)", kind.name()),
            ));
        }
        let queue = self.queues.build(kind, &eqc)?;
        tracing::debug!(target: "rnic::eq", eqn, kind = kind.name(), depth = queue.depth, entry_size = queue.entry_size, "EQ created");
        self.queues.slots[eqn as usize] = EqSlot::Active(queue);
        Ok(())
    }

    /// MODIFY_CEQC / MODIFY_AEQC with the hns mask rule (mask bit 1 keeps the current
    /// bit). Only `EQ_MAX_CNT`, `EQ_PERIOD` and `ARM_ST` may change.
    pub fn modify(&mut self, io: &mut impl Io, eqn: u32, kind: EqKind, eqc: Eqc, mask: Eqc) -> Result<(), Rejection> {
        let current = self.query(eqn, kind)?;
        let command = format!("MODIFY_{}C", kind.name());
        let modifiable = [Eqc::EQ_MAX_CNT, Eqc::EQ_PERIOD, Eqc::ARM_ST];
        let merged = crate::command::merge_modifiable(&current, &eqc, &mask, &modifiable, &command)?;
        let arm = merged.arm_state().map_err(|_| {
            Rejection::parameter(
                Eqc::ARM_ST.name,
                merged.arm_state_raw().into(),
                "0 (fired), 1 (armed) or 3 (always armed)",
            )
        })?;
        if let Some(queue) = self.queues.active_mut(eqn) {
            queue.max_count = merged.max_count();
            queue.period = merged.period();
            queue.arm = arm;
        }
        self.check_interrupt(io, eqn);
        Ok(())
    }

    /// QUERY_CEQC / QUERY_AEQC: the EQC with the current state, arm state, producer and
    /// consumer indices and coalescing fields.
    pub fn query(&self, eqn: u32, kind: EqKind) -> Result<Eqc, Rejection> {
        self.queues.check_number(eqn, kind)?;
        match self.queues.active(eqn) {
            Some(queue) => Ok(queue.context()),
            None => Err(Rejection::state(
                Eqc::EQ_ST.name,
                0,
                format!("a created {} (CREATE_{}C first)", kind.name(), kind.name()),
            )),
        }
    }

    /// DESTROY_CEQC / DESTROY_AEQC: frees the slot. A pending coalescing timer becomes
    /// stale.
    pub fn destroy(&mut self, eqn: u32, kind: EqKind) -> Result<(), Rejection> {
        self.queues.check_number(eqn, kind)?;
        if self.queues.active(eqn).is_none() {
            return Err(Rejection::state(
                Eqc::EQ_ST.name,
                0,
                format!("a created {} (nothing to destroy)", kind.name()),
            ));
        }
        self.queues.slots[eqn as usize] = EqSlot::Free;
        tracing::debug!(target: "rnic::eq", eqn, kind = kind.name(), "EQ destroyed");
        Ok(())
    }

    // ---- posting events ------------------------------------------------------------

    /// Writes a CEQE `{CQN = cqn}` to CEQ `ceqn`.
    pub fn post_completion_event(&mut self, io: &mut impl Io, ceqn: u32, cqn: u32) {
        let entry = EqEntry::Completion { cqn };
        if !self.queues.is_active(ceqn, EqKind::Completion) {
            self.eq_missing(io, format!("CEQ {ceqn}"), entry);
            return;
        }
        self.post_eqe(io, ceqn, entry);
    }

    /// Writes an AEQE `{event, sub_type, queue_number}` to the AEQ.
    pub fn post_async_event(&mut self, io: &mut impl Io, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        self.post_to_aeq(
            io,
            EqEntry::Async {
                event,
                sub_type,
                queue_number,
            },
        );
    }

    /// Writes a mailbox-completion AEQE (event 0x13, [`AeqeMailbox`] view) to the AEQ.
    pub fn post_mailbox_event(&mut self, io: &mut impl Io, token: u16, status: u8, out_param: u64) {
        self.post_to_aeq(
            io,
            EqEntry::Mailbox {
                token,
                status,
                out_param,
            },
        );
    }

    fn post_to_aeq(&mut self, io: &mut impl Io, entry: EqEntry) {
        let aeqn = self.queues.aeq_number();
        if !self.queues.is_active(aeqn, EqKind::Async) {
            self.eq_missing(io, format!("AEQ {aeqn}"), entry);
            return;
        }
        self.post_eqe(io, aeqn, entry);
    }

    /// No EQ to receive `entry`: the event is lost.
    fn eq_missing(&mut self, io: &mut impl Io, object: String, entry: EqEntry) {
        let (field, value) = entry.subject();
        let expected = format!("a created EQ to receive {} (the event is lost)", entry.describe());
        io.diagnose(Source::EventQueue, object, field, value, expected);
    }

    /// Writes `entry` at the producer index of active EQ `eqn`, then raises the
    /// interrupt if due.
    fn post_eqe(&mut self, io: &mut impl Io, eqn: u32, entry: EqEntry) {
        let Some(queue) = self.queues.active(eqn) else { return };
        let kind = queue.kind;
        let depth = queue.depth;
        let producer_index = queue.producer_index;
        if queue.occupancy() >= depth {
            self.eq_overflow(io, eqn, entry);
            return;
        }
        let mtr = queue.mtr;
        let entry_size = queue.entry_size;
        let offset = u64::from(producer_index & (depth - 1)) * entry_size as u64;
        let bytes = entry.encode(eqe_owner_bit_for_producer(producer_index, depth));
        let object = format!("{} {eqn}", kind.name());
        let address = match io.translate(&mtr, offset) {
            None => {
                io.diagnose(
                    Source::EventQueue,
                    object,
                    "COMMAND.BUS_MASTER",
                    0,
                    format!(
                        "bus mastering enabled to write {} (the event is lost)",
                        entry.describe()
                    ),
                );
                return;
            }
            Some(Ok(address)) => address,
            Some(Err(error)) => {
                if matches!(error, MttError::BtUnreachable { .. }) {
                    io.count_dma_error();
                }
                self.eq_failed(
                    io,
                    eqn,
                    offset,
                    format!("a translatable EQE buffer for {}: {error}", entry.describe()),
                );
                return;
            }
        };
        if let Err(error) = io.dma_write(address, &bytes[..entry_size]) {
            self.eq_failed(
                io,
                eqn,
                address,
                format!("a writable EQE at {address:#x} for {}: {error}", entry.describe()),
            );
            return;
        }
        self.counters.eqes += 1;
        // Timing: recorded for the breakdown; the EQE is written now (see docs/timing.md).
        let timing = io.timing();
        let cost = timing.params().eqe_write();
        timing.record(Stage::EqeWrite, cost);
        tracing::trace!(target: "rnic::eq", eqn, producer_index, address, entry = ?entry, "EQE written");
        if let Some(queue) = self.queues.active_mut(eqn) {
            queue.producer_index = (producer_index + 1) & INDEX_MASK;
            queue.overflowing = false;
            queue.pending = queue.pending.saturating_add(1);
        }
        self.check_interrupt(io, eqn);
    }

    /// EQ `eqn` is full: drop `entry`, mark the overflow and report the episode's first
    /// loss (unless `OVER_IGNORE`).
    fn eq_overflow(&mut self, io: &mut impl Io, eqn: u32, entry: EqEntry) {
        let Some(queue) = self.queues.active_mut(eqn) else {
            return;
        };
        let kind = queue.kind;
        let depth = queue.depth;
        let consumer_index = queue.consumer_index;
        let ignore = queue.eqc.overflow_ignore();
        let first = !queue.overflowing;
        if !ignore {
            queue.overflowing = true;
            queue.state = EqState::Overflow;
        }
        io.diagnose(
            Source::EventQueue,
            format!("{} {eqn}", kind.name()),
            Eqc::EQ_CONS_INDX.name,
            u64::from(consumer_index),
            format!(
                "room for {}: all {depth} entries are unconsumed, the entry is dropped",
                entry.describe()
            ),
        );
        if ignore || !first {
            return;
        }
        match kind {
            EqKind::Async => self.raise_abnormal(regs::ABNORMAL_AEQ_OVERFLOW),
            EqKind::Completion => self.post_async_event(io, AsyncEventType::CeqOverflow, 0, eqn),
        }
    }

    /// Writing an entry of EQ `eqn` failed: `EQ_ST` becomes failure (3).
    fn eq_failed(&mut self, io: &mut impl Io, eqn: u32, value: u64, expected: String) {
        let Some(queue) = self.queues.active_mut(eqn) else {
            return;
        };
        queue.state = EqState::Failure;
        let object = format!("{} {eqn}", queue.kind.name());
        io.diagnose(Source::EventQueue, object, Eqc::EQE_BA.name, value, expected);
    }

    // ---- interrupts ----------------------------------------------------------------

    /// Whether the driver enabled EQ `eqn`'s interrupt (`EVENT_INT_EN`).
    fn interrupt_enabled(&self, eqn: u32) -> bool {
        self.enables.get(eqn as usize).copied().unwrap_or(false)
    }

    /// Raises EQ `eqn`'s interrupt if its pending entries reach the coalescing count, or
    /// starts the coalescing timer.
    fn check_interrupt(&mut self, io: &mut impl Io, eqn: u32) {
        let enabled = self.interrupt_enabled(eqn);
        let Some(queue) = self.queues.active_mut(eqn) else {
            return;
        };
        if !enabled || !queue.armed() || queue.pending == 0 {
            return;
        }
        if queue.pending >= u32::from(queue.max_count.max(1)) {
            self.fire(io, eqn);
        } else if queue.period > 0 && !queue.timer_scheduled {
            queue.timer_scheduled = true;
            let timer = Timer {
                eqn,
                generation: queue.generation,
            };
            let delay = Picoseconds::from_micros(u64::from(queue.period));
            io.schedule_in(delay, timer);
        }
    }

    /// Signals EQ `eqn`'s vector: pending count cleared, timer made stale, armed → fired.
    fn fire(&mut self, io: &mut impl Io, eqn: u32) {
        let generation = self.queues.generation();
        let vector = self.vector(eqn);
        let Some(queue) = self.queues.active_mut(eqn) else {
            return;
        };
        queue.pending = 0;
        queue.generation = generation;
        queue.timer_scheduled = false;
        if queue.arm == EqArmState::Armed {
            queue.arm = EqArmState::Fired;
        }
        tracing::trace!(target: "rnic::eq", eqn, vector, "EQ interrupt");
        let timing = io.timing();
        let cost = timing.params().msix();
        timing.record(Stage::Msix, cost);
        self.signal_vector(vector);
    }

    /// The coalescing timer of EQ `eqn` expired (event loop): raise the interrupt if it is
    /// still current and entries are pending.
    pub fn coalesce_timer(&mut self, io: &mut impl Io, Timer { eqn, generation }: Timer) {
        let enabled = self.interrupt_enabled(eqn);
        let Some(queue) = self.queues.active_mut(eqn) else {
            return;
        };
        if queue.generation != generation || !queue.timer_scheduled {
            return;
        }
        queue.timer_scheduled = false;
        if enabled && queue.armed() && queue.pending > 0 {
            self.fire(io, eqn);
        }
    }

    /// The driver wrote EQ `eqn`'s `EVENT_INT_EN` (BAR0): when it enables it, raise the
    /// interrupt at once if the EQ is armed and holds unconsumed entries.
    pub fn write_interrupt_enable(&mut self, io: &mut impl Io, eqn: u32, value: u32) {
        self.enables[eqn as usize] = value & 1 != 0;
        if value & 1 == 0 {
            return;
        }
        let Some(queue) = self.queues.active(eqn) else { return };
        if queue.armed() && queue.occupancy() > 0 {
            self.fire(io, eqn);
        }
    }

    /// EQ `eqn`'s `EVENT_INT_EN` as BAR0 reads it.
    pub fn read_interrupt_enable(&self, eqn: u32) -> u32 {
        self.enables[eqn as usize] as u32
    }

    /// MSI-X vector of EQ `eqn` (see the module documentation).
    pub fn vector(&self, eqn: u32) -> u16 {
        self.queues.vector(eqn)
    }

    /// Number of created EQs (for the device's resource accounting and leak checks).
    pub fn active_count(&self) -> usize {
        self.queues
            .slots
            .iter()
            .filter(|slot| matches!(slot, EqSlot::Active(_)))
            .count()
    }

    // ---- doorbell ------------------------------------------------------------------

    /// EQ doorbell (BAR2 page 0 + 0x238): updates the consumer index and, for the
    /// re-arm commands, arms a fired EQ (raising the interrupt at once when entries are
    /// outstanding past the new CI, so no event is lost).
    pub fn doorbell(&mut self, io: &mut impl Io, word: u64) {
        let doorbell = EqDoorbell::from_u64(word);
        let command = match EqDoorbellCommand::try_from(doorbell.command()) {
            Ok(command) => command,
            Err(_) => {
                // CMD is two bits wide, so every value decodes; kept for robustness.
                self.doorbell_dropped(
                    io,
                    "EQ doorbell".into(),
                    EqDoorbell::CMD.name,
                    doorbell.command().into(),
                    "0..=3".into(),
                );
                return;
            }
        };
        let (eqn, kind, rearm) = match command {
            EqDoorbellCommand::AeqCi => (self.queues.aeq_number(), EqKind::Async, false),
            EqDoorbellCommand::AeqCiArm => (self.queues.aeq_number(), EqKind::Async, true),
            EqDoorbellCommand::CeqCi => (u32::from(doorbell.tag()), EqKind::Completion, false),
            EqDoorbellCommand::CeqCiArm => (u32::from(doorbell.tag()), EqKind::Completion, true),
        };
        let enabled = self.interrupt_enabled(eqn);
        let Some(queue) = self.queues.active_mut(eqn).filter(|q| q.kind == kind) else {
            let expected = match kind {
                EqKind::Completion => format!("a created CEQ below {}", self.queues.num_ceqs()),
                EqKind::Async => "a created AEQ".to_string(),
            };
            self.doorbell_dropped(io, format!("EQ {eqn}"), EqDoorbell::TAG.name, eqn.into(), expected);
            return;
        };
        let consumer_index = doorbell.consumer_index() & INDEX_MASK;
        let old_occupancy = queue.occupancy();
        let new_occupancy = queue.producer_index.wrapping_sub(consumer_index) & INDEX_MASK;
        if new_occupancy > old_occupancy {
            let expected = format!(
                "a consumer index from the current {:#x} up to the producer index {:#x}",
                queue.consumer_index, queue.producer_index
            );
            self.doorbell_dropped(
                io,
                format!("EQ {eqn}"),
                EqDoorbell::CI.name,
                consumer_index.into(),
                expected,
            );
            return;
        }
        queue.consumer_index = consumer_index;
        queue.pending = queue.pending.min(new_occupancy);
        let mut fire = false;
        if rearm && queue.arm == EqArmState::Fired {
            queue.arm = EqArmState::Armed;
            fire = enabled && new_occupancy > 0;
        }
        self.counters.doorbells += 1;
        tracing::trace!(target: "rnic::eq", eqn, consumer_index, rearm, "EQ doorbell");
        if fire {
            self.fire(io, eqn);
        }
    }

    fn doorbell_dropped(
        &mut self,
        io: &mut impl Io,
        object: String,
        field: &'static str,
        value: u64,
        expected: String,
    ) {
        self.counters.doorbells_dropped += 1;
        io.diagnose(Source::Doorbell, object, field, value, expected);
    }

    // ---- interrupts ----------------------------------------------------------------

    /// Signals MSI-X `vector` (pending if masked).
    fn signal_vector(&mut self, vector: u16) {
        self.counters.interrupts += 1;
        self.msix
            .signal(vector, self.msix_enabled, self.function_masked, &mut *self.sink);
    }

    /// Sets abnormal status bits and raises the abnormal vector if enabled.
    pub fn raise_abnormal(&mut self, bits: u32) {
        self.abnormal.status |= bits;
        if self.abnormal.config & 1 != 0 && self.abnormal.enable & bits != 0 {
            self.signal_vector(regs::ABNORMAL_VECTOR);
        }
    }

    /// Reads an abnormal-interrupt register (`ABNORMAL_INT_CONFIG`, `_STATUS`, `_ENABLE`).
    pub fn read_abnormal(&self, offset: u64) -> u32 {
        match offset {
            regs::ABNORMAL_INT_CONFIG => self.abnormal.config,
            regs::ABNORMAL_INT_STATUS => self.abnormal.status,
            _ => self.abnormal.enable,
        }
    }

    /// Writes an abnormal-interrupt register (status bits are cleared by writing ones).
    pub fn write_abnormal(&mut self, offset: u64, value: u32) {
        match offset {
            regs::ABNORMAL_INT_CONFIG => self.abnormal.config = value,
            regs::ABNORMAL_INT_STATUS => self.abnormal.status &= !value,
            _ => self.abnormal.enable = value,
        }
    }

    /// Follows configuration space's MSI-X control (enable, function mask); pending
    /// vectors go out when the function becomes unmasked.
    pub fn set_msix_control(&mut self, enabled: bool, function_masked: bool) {
        let was_masked = self.function_masked || !self.msix_enabled;
        self.msix_enabled = enabled;
        self.function_masked = function_masked;
        let now_masked = function_masked || !enabled;
        if was_masked && !now_masked {
            self.msix.function_unmasked(&mut *self.sink);
        }
    }

    /// Reads the MSI-X table or PBA (BAR4).
    pub fn read_msix(&self, offset: u64, data: &mut [u8]) {
        self.msix.read(offset, data);
    }

    /// Writes the MSI-X table (BAR4); an entry unmasked with its bit pending goes out.
    pub fn write_msix(&mut self, offset: u64, data: &[u8]) {
        self.msix
            .write(offset, data, self.msix_enabled, self.function_masked, &mut *self.sink);
    }
}
