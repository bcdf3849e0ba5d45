//! Event queues (hns §9): completion EQs (CEQs) that tell the driver which CQ has a new
//! event, and the asynchronous EQ (AEQ) that carries QP/CQ/SRQ errors, port events and
//! mailbox completions.
//!
//! * Numbering: CEQs are EQN `0..num_ceqs`, the one AEQ is EQN `num_ceqs`.
//! * MSI-X vectors (hns §9.4): the "other" (abnormal) vectors come first, then the AEQ
//!   vector, then one vector per CEQ — with the default capabilities vector 0 is abnormal,
//!   1 the AEQ and `2 + i` CEQ *i* ([`Device::eq_vector`]).
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
use crate::device::{Device, Event};
use crate::diagnostics::Source;
use crate::mtt::{Mtr, MttError, MAX_BT_PAGE_SHIFT, MAX_BUFFER_PAGE_SHIFT};
use crate::time::Picoseconds;

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
#[derive(Debug)]
pub(crate) struct EventQueues {
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

impl EventQueues {
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

impl Device {
    // ---- mailbox commands ----------------------------------------------------------

    /// CREATE_CEQC / CREATE_AEQC: checks the EQC and makes EQ `eqn` active.
    pub(crate) fn create_eq(&mut self, eqn: u32, kind: EqKind, eqc: Eqc) -> Result<(), Rejection> {
        self.eqs.check_number(eqn, kind)?;
        if kind == EqKind::Async {
            let existing = self.eqs.aeq_number();
            if existing != eqn && self.eqs.is_active(existing, EqKind::Async) {
                return Err(Rejection::state(
                    "tag",
                    u64::from(eqn),
                    format!("one AEQ per function (AEQ {existing} exists)"),
                ));
            }
        }
        if self.eqs.active(eqn).is_some() {
            return Err(Rejection::state(
                Eqc::EQ_ST.name,
                u64::from(u8::from(EqState::Valid)),
                format!("{} {eqn} not in use (destroy it first)", kind.name()),
            ));
        }
        let queue = self.eqs.build(kind, &eqc)?;
        tracing::debug!(target: "rnic::eq", eqn, kind = kind.name(), depth = queue.depth, entry_size = queue.entry_size, "EQ created");
        self.eqs.slots[eqn as usize] = EqSlot::Active(queue);
        Ok(())
    }

    /// MODIFY_CEQC / MODIFY_AEQC with the hns mask rule (mask bit 1 keeps the current
    /// bit). Only `EQ_MAX_CNT`, `EQ_PERIOD` and `ARM_ST` may change.
    pub(crate) fn modify_eq(&mut self, eqn: u32, kind: EqKind, eqc: Eqc, mask: Eqc) -> Result<(), Rejection> {
        let current = self.query_eq(eqn, kind)?;
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
        if let Some(queue) = self.eqs.active_mut(eqn) {
            queue.max_count = merged.max_count();
            queue.period = merged.period();
            queue.arm = arm;
        }
        self.eq_check_interrupt(eqn);
        Ok(())
    }

    /// QUERY_CEQC / QUERY_AEQC: the EQC with the current state, arm state, producer and
    /// consumer indices and coalescing fields.
    pub(crate) fn query_eq(&mut self, eqn: u32, kind: EqKind) -> Result<Eqc, Rejection> {
        self.eqs.check_number(eqn, kind)?;
        match self.eqs.active(eqn) {
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
    pub(crate) fn destroy_eq(&mut self, eqn: u32, kind: EqKind) -> Result<(), Rejection> {
        self.eqs.check_number(eqn, kind)?;
        if self.eqs.active(eqn).is_none() {
            return Err(Rejection::state(
                Eqc::EQ_ST.name,
                0,
                format!("a created {} (nothing to destroy)", kind.name()),
            ));
        }
        self.eqs.slots[eqn as usize] = EqSlot::Free;
        tracing::debug!(target: "rnic::eq", eqn, kind = kind.name(), "EQ destroyed");
        Ok(())
    }

    // ---- posting events ------------------------------------------------------------

    /// Writes a CEQE `{CQN = cqn}` to CEQ `ceqn`.
    pub(crate) fn post_completion_event(&mut self, ceqn: u32, cqn: u32) {
        let entry = EqEntry::Completion { cqn };
        if !self.eqs.is_active(ceqn, EqKind::Completion) {
            self.eq_missing(format!("CEQ {ceqn}"), entry);
            return;
        }
        self.post_eqe(ceqn, entry);
    }

    /// Writes an AEQE `{event, sub_type, queue_number}` to the AEQ.
    pub(crate) fn post_async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        self.post_to_aeq(EqEntry::Async {
            event,
            sub_type,
            queue_number,
        });
    }

    /// Writes a mailbox-completion AEQE (event 0x13, [`AeqeMailbox`] view) to the AEQ.
    pub(crate) fn post_mailbox_event(&mut self, token: u16, status: u8, out_param: u64) {
        self.post_to_aeq(EqEntry::Mailbox {
            token,
            status,
            out_param,
        });
    }

    fn post_to_aeq(&mut self, entry: EqEntry) {
        let aeqn = self.eqs.aeq_number();
        if !self.eqs.is_active(aeqn, EqKind::Async) {
            self.eq_missing(format!("AEQ {aeqn}"), entry);
            return;
        }
        self.post_eqe(aeqn, entry);
    }

    /// No EQ to receive `entry`: the event is lost.
    fn eq_missing(&mut self, object: String, entry: EqEntry) {
        let (field, value) = entry.subject();
        let expected = format!("a created EQ to receive {} (the event is lost)", entry.describe());
        self.diagnose(Source::EventQueue, object, field, value, expected);
    }

    /// Writes `entry` at the producer index of active EQ `eqn`, then raises the
    /// interrupt if due.
    fn post_eqe(&mut self, eqn: u32, entry: EqEntry) {
        let Some(queue) = self.eqs.active(eqn) else { return };
        let kind = queue.kind;
        let depth = queue.depth;
        let producer_index = queue.producer_index;
        if queue.occupancy() >= depth {
            self.eq_overflow(eqn, entry);
            return;
        }
        let mtr = queue.mtr;
        let entry_size = queue.entry_size;
        let offset = u64::from(producer_index & (depth - 1)) * entry_size as u64;
        let bytes = entry.encode(eqe_owner_bit_for_producer(producer_index, depth));
        let object = format!("{} {eqn}", kind.name());
        let address = match self.translate(&mtr, offset) {
            None => {
                self.diagnose(
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
                    self.bus.count_error();
                }
                self.eq_failed(
                    eqn,
                    offset,
                    format!("a translatable EQE buffer for {}: {error}", entry.describe()),
                );
                return;
            }
        };
        if let Err(error) = self.dma_write(address, &bytes[..entry_size]) {
            self.eq_failed(
                eqn,
                address,
                format!("a writable EQE at {address:#x} for {}: {error}", entry.describe()),
            );
            return;
        }
        self.counters.eqes += 1;
        // Timing: recorded for the breakdown; the EQE is written now (see docs/timing.md).
        let cost = self.timing.params().eqe_write();
        self.timing.record(crate::timing::Stage::EqeWrite, cost);
        tracing::trace!(target: "rnic::eq", eqn, producer_index, address, entry = ?entry, "EQE written");
        if let Some(queue) = self.eqs.active_mut(eqn) {
            queue.producer_index = (producer_index + 1) & INDEX_MASK;
            queue.overflowing = false;
            queue.pending = queue.pending.saturating_add(1);
        }
        self.eq_check_interrupt(eqn);
    }

    /// EQ `eqn` is full: drop `entry`, mark the overflow and report the episode's first
    /// loss (unless `OVER_IGNORE`).
    fn eq_overflow(&mut self, eqn: u32, entry: EqEntry) {
        let Some(queue) = self.eqs.active_mut(eqn) else { return };
        let kind = queue.kind;
        let depth = queue.depth;
        let consumer_index = queue.consumer_index;
        let ignore = queue.eqc.overflow_ignore();
        let first = !queue.overflowing;
        if !ignore {
            queue.overflowing = true;
            queue.state = EqState::Overflow;
        }
        self.diagnose(
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
            EqKind::Completion => self.post_async_event(AsyncEventType::CeqOverflow, 0, eqn),
        }
    }

    /// Writing an entry of EQ `eqn` failed: `EQ_ST` becomes failure (3).
    fn eq_failed(&mut self, eqn: u32, value: u64, expected: String) {
        let Some(queue) = self.eqs.active_mut(eqn) else { return };
        queue.state = EqState::Failure;
        let object = format!("{} {eqn}", queue.kind.name());
        self.diagnose(Source::EventQueue, object, Eqc::EQE_BA.name, value, expected);
    }

    // ---- interrupts ----------------------------------------------------------------

    /// Whether the driver enabled EQ `eqn`'s interrupt (`EVENT_INT_EN`).
    fn eq_interrupt_enable(&self, eqn: u32) -> bool {
        self.registers.event_enable.get(eqn as usize).copied().unwrap_or(false)
    }

    /// Raises EQ `eqn`'s interrupt if its pending entries reach the coalescing count, or
    /// starts the coalescing timer.
    fn eq_check_interrupt(&mut self, eqn: u32) {
        let enabled = self.eq_interrupt_enable(eqn);
        let Some(queue) = self.eqs.active_mut(eqn) else { return };
        if !enabled || !queue.armed() || queue.pending == 0 {
            return;
        }
        if queue.pending >= u32::from(queue.max_count.max(1)) {
            self.eq_fire(eqn);
        } else if queue.period > 0 && !queue.timer_scheduled {
            queue.timer_scheduled = true;
            let event = Event::EqCoalesceTimer {
                eqn,
                generation: queue.generation,
            };
            let delay = Picoseconds::from_micros(u64::from(queue.period));
            self.scheduler.schedule_in(delay, event);
        }
    }

    /// Signals EQ `eqn`'s vector: pending count cleared, timer made stale, armed → fired.
    fn eq_fire(&mut self, eqn: u32) {
        let generation = self.eqs.generation();
        let vector = self.eq_vector(eqn);
        let Some(queue) = self.eqs.active_mut(eqn) else { return };
        queue.pending = 0;
        queue.generation = generation;
        queue.timer_scheduled = false;
        if queue.arm == EqArmState::Armed {
            queue.arm = EqArmState::Fired;
        }
        tracing::trace!(target: "rnic::eq", eqn, vector, "EQ interrupt");
        let cost = self.timing.params().msix();
        self.timing.record(crate::timing::Stage::Msix, cost);
        self.signal_vector(vector);
    }

    /// The coalescing timer of EQ `eqn` expired (event loop): raise the interrupt if it is
    /// still current and entries are pending.
    pub(crate) fn eq_coalesce_timer(&mut self, eqn: u32, generation: u64) {
        let enabled = self.eq_interrupt_enable(eqn);
        let Some(queue) = self.eqs.active_mut(eqn) else { return };
        if queue.generation != generation || !queue.timer_scheduled {
            return;
        }
        queue.timer_scheduled = false;
        if enabled && queue.armed() && queue.pending > 0 {
            self.eq_fire(eqn);
        }
    }

    /// The driver set EQ `eqn`'s `EVENT_INT_EN`: raise the interrupt at once if the EQ is
    /// armed and holds unconsumed entries.
    pub(crate) fn eq_interrupt_enabled(&mut self, eqn: u32) {
        let Some(queue) = self.eqs.active(eqn) else { return };
        if queue.armed() && queue.occupancy() > 0 {
            self.eq_fire(eqn);
        }
    }

    /// MSI-X vector of EQ `eqn` (see the module documentation).
    pub(crate) fn eq_vector(&self, eqn: u32) -> u16 {
        self.eqs.vector(eqn)
    }

    /// Number of created EQs (for the device's resource accounting and leak checks).
    pub fn active_eq_count(&self) -> usize {
        self.eqs
            .slots
            .iter()
            .filter(|slot| matches!(slot, EqSlot::Active(_)))
            .count()
    }

    // ---- doorbell ------------------------------------------------------------------

    /// EQ doorbell (BAR2 page 0 + 0x238): updates the consumer index and, for the
    /// re-arm commands, arms a fired EQ (raising the interrupt at once when entries are
    /// outstanding past the new CI, so no event is lost).
    pub(crate) fn eq_doorbell(&mut self, word: u64) {
        let doorbell = EqDoorbell::from_u64(word);
        let command = match EqDoorbellCommand::try_from(doorbell.command()) {
            Ok(command) => command,
            Err(_) => {
                // CMD is two bits wide, so every value decodes; kept for robustness.
                self.eq_doorbell_dropped(
                    "EQ doorbell".into(),
                    EqDoorbell::CMD.name,
                    doorbell.command().into(),
                    "0..=3".into(),
                );
                return;
            }
        };
        let (eqn, kind, rearm) = match command {
            EqDoorbellCommand::AeqCi => (self.eqs.aeq_number(), EqKind::Async, false),
            EqDoorbellCommand::AeqCiArm => (self.eqs.aeq_number(), EqKind::Async, true),
            EqDoorbellCommand::CeqCi => (u32::from(doorbell.tag()), EqKind::Completion, false),
            EqDoorbellCommand::CeqCiArm => (u32::from(doorbell.tag()), EqKind::Completion, true),
        };
        let enabled = self.eq_interrupt_enable(eqn);
        let Some(queue) = self.eqs.active_mut(eqn).filter(|q| q.kind == kind) else {
            let expected = match kind {
                EqKind::Completion => format!("a created CEQ below {}", self.eqs.num_ceqs()),
                EqKind::Async => "a created AEQ".to_string(),
            };
            self.eq_doorbell_dropped(format!("EQ {eqn}"), EqDoorbell::TAG.name, eqn.into(), expected);
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
            self.eq_doorbell_dropped(
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
            self.eq_fire(eqn);
        }
    }

    fn eq_doorbell_dropped(&mut self, object: String, field: &'static str, value: u64, expected: String) {
        self.counters.doorbells_dropped += 1;
        self.diagnose(Source::Doorbell, object, field, value, expected);
    }
}
