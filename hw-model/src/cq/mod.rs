//! Completion queues (hns §8, §13.1, §6.1): CQ contexts, CQE writing, arming and the CQ
//! doorbells.
//!
//! CQ contexts live in the CQC table in host memory: every operation reads the CQC, acts,
//! and writes it back, through the device's context cache (the hns CQC cache, see
//! [`crate::hem::ContextCache`]), which is written back before any command or mailbox.
//! For completions the device also remembers each CQ's context address and CQE buffer
//! translation root ([`CqBuffer`]) until the next command, mailbox, create or destroy.
//!
//! * A CQE goes to `(pi & (depth − 1)) × size` of the CQE buffer (translated through the
//!   CQC's MTR) with the owner bit of [`owner_bit_for_producer`]; `CQ_PRODUCER_IDX` then
//!   advances (24 bits). A 32-byte CQE is the first half of [`Cqe`].
//! * The consumer index is the record doorbell (a u32 at `CQE_DB_RECORD_ADDR`, masked to
//!   24 bits) when `DB_RECORD_EN`, else `CQ_CONSUMER_IDX` as the set-CI doorbell wrote it.
//!   A CQ holding `depth` unconsumed CQEs is full: the CQE is dropped, the CQ goes to
//!   overflow (`CQ_ST` = 2) and the driver gets `CQ_OVERFLOW`.
//! * Arming (`CMD` 4): `ARM_ST` becomes 2 (next completion) or 3 (next solicited); the
//!   next qualifying CQE posts a CEQE with the CQN on the CQ's CEQ and disarms. An
//!   arm-next doorbell whose CI is behind the producer index notifies at once.
//!
//! The block ([`CompletionQueues`]) owns the CQ buffer records and its counters. It
//! accepts the CQ mailbox commands, the CQ doorbells and the CQEs of the QP and transport
//! blocks; it produces events for the event block (a CEQE when an armed CQ completes, an
//! AEQE on errors). Everything else it reaches is in its [`Io`]: CQCs through the context
//! block, the MTT, the bus, diagnostics.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::caps::CapFlags;
use rnic_firmware_if::context::{CqArmState, CqState, Cqc, CqeSize};
use rnic_firmware_if::cqe::{owner_bit_for_producer, Cqe, CqeStatus};
use rnic_firmware_if::doorbell::{CqDoorbell, DoorbellCommand};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mtr::{page_shift_from_field, MAX_HOP};

use crate::command::Rejection;
use crate::diagnostics::Source;
use crate::eq::{buffer_mtr, INDEX_MASK};
use crate::fast_hash::FastHashMap;
use crate::memory::MemoryError;
use crate::mtt::{Mtr, MttError, MAX_BT_PAGE_SHIFT, MAX_BUFFER_PAGE_SHIFT};

/// What the CQ block needs from the rest of the device.
pub(crate) trait Io {
    /// CQ `cqn`'s context and its bus address, from the CQC table of the context block.
    fn read_cqc(&mut self, cqn: u32) -> Result<(Cqc, u64), Rejection>;
    /// The CQC at `address`, if the context cache holds it.
    fn cached_cqc(&self, address: u64) -> Option<Cqc>;
    /// Writes the CQC at `address` back (through the context cache).
    fn write_cqc(&mut self, address: u64, cqc: &Cqc) -> Result<(), Rejection>;
    /// Translates byte `offset` of `mtr` through the MTT; None while bus mastering is off.
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>>;
    /// DMA read (the record doorbell).
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;
    /// DMA write (the CQE).
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// A BT entry of a translation walk could not be read: a failed DMA access.
    fn count_dma_error(&mut self);
    /// Records a diagnostic.
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    );
    /// Whether CEQ `ceqn` exists (a CQ must name one).
    fn ceq_exists(&self, ceqn: u32) -> bool;
    /// Number of CEQs the device has.
    fn num_ceqs(&self) -> u32;
    /// Event out: a CEQE naming CQ `cqn` on CEQ `ceqn`.
    fn completion_event(&mut self, ceqn: u32, cqn: u32);
    /// Event out: an AEQE.
    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32);
}

/// What the CQ block counted since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CqCounters {
    /// CQEs written.
    pub cqes: u64,
    /// CQ doorbells accepted.
    pub doorbells: u64,
    /// CQ doorbells dropped.
    pub doorbells_dropped: u64,
}

#[cfg(test)]
mod tests;

/// Largest log2 CQ depth accepted whatever the capabilities say (24-bit indices).
const MAX_SHIFT: u32 = 23;

/// Why a CQE was not delivered. Every case has already been diagnosed and, where hns
/// defines one, reported to the driver by an async event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CqError {
    /// The CQ's context could not be read (no table entry, index out of range, DMA).
    #[error("CQ {cqn:#x}: context unreachable: {} = {:#x}; expected {}", .rejection.field, .rejection.value, .rejection.expected)]
    Context {
        /// CQ number.
        cqn: u32,
        /// Why the context access failed.
        rejection: Rejection,
    },
    /// The CQ is not created (`CQ_ST` = 0); CQ_ID_INVALID was posted.
    #[error("CQ {cqn:#x} is not valid (CQ_ST = 0)")]
    Invalid {
        /// CQ number.
        cqn: u32,
    },
    /// The CQ is in overflow or failure state and takes no more CQEs until destroyed.
    #[error("CQ {cqn:#x} is in error (CQ_ST = {state}) and must be destroyed")]
    Broken {
        /// CQ number.
        cqn: u32,
        /// Raw `CQ_ST`.
        state: u8,
    },
    /// The CQ held `depth` unconsumed CQEs; the CQE was dropped (CQ_OVERFLOW posted
    /// unless `OVER_IGNORE`).
    #[error("CQ {cqn:#x} is full ({depth} unconsumed CQEs); the CQE was dropped")]
    Overflow {
        /// CQ number.
        cqn: u32,
        /// CQ depth.
        depth: u32,
    },
    /// A DMA access for the CQE (record doorbell, buffer translation, CQE write) failed;
    /// CQ_ACCESS_ERROR was posted and the CQ is in failure state.
    #[error("CQ {cqn:#x}: access error: {reason}")]
    Access {
        /// CQ number.
        cqn: u32,
        /// What failed.
        reason: String,
    },
}

/// Bytes per CQE for a CQC (an undefined `CQE_SIZE` reads as 32: create refuses it).
fn cqe_bytes(cqc: &Cqc) -> usize {
    cqc.cqe_size().unwrap_or(CqeSize::Bytes32).bytes()
}

/// Depth of a CQ (`1 << SHIFT`, capped so the arithmetic cannot overflow).
fn cq_depth(cqc: &Cqc) -> u32 {
    1u32 << u32::from(cqc.shift()).min(MAX_SHIFT)
}

/// The translation of a CQ's CQE buffer.
fn cq_mtr(cqc: &Cqc) -> Mtr {
    buffer_mtr(
        cqc.cqe_base_address() << 3,
        page_shift_from_field(cqc.cqe_ba_page_size()),
        page_shift_from_field(cqc.cqe_buffer_page_size()),
        u64::from(cq_depth(cqc)) * cqe_bytes(cqc) as u64,
        cqc.cqe_hop_number(),
    )
}

/// What a completion needs of a CQ besides its (cached) context: where the context is
/// and how its CQE buffer is translated. Both change only with a BT change or a new
/// context (CREATE/DESTROY_CQC), so the device keeps them until the next command, mailbox,
/// configuration write or reset, like the context cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CqBuffer {
    context_address: u64,
    mtr: Mtr,
}

/// Whether a CQ in this state exists (valid, overflowed or failed) and so must be
/// destroyed before the number is reused.
fn in_use(cqc: &Cqc) -> bool {
    cqc.cq_state_raw() != u8::from(CqState::Invalid)
}

/// The completion-queue block.
#[derive(Debug, Clone)]
pub(crate) struct CompletionQueues {
    /// CQN → the CQ's context address and CQE buffer translation, forgotten with the
    /// context cache and at CREATE/DESTROY_CQC.
    buffers: FastHashMap<u32, CqBuffer>,
    counters: CqCounters,
    /// Capabilities: CQs in the table, the depth limit, the record-doorbell flag.
    caps: rnic_firmware_if::caps::DeviceCaps,
}

impl CompletionQueues {
    /// The block of a device with `caps`.
    pub fn new(caps: &rnic_firmware_if::caps::DeviceCaps) -> Self {
        Self {
            buffers: FastHashMap::default(),
            counters: CqCounters::default(),
            caps: *caps,
        }
    }

    /// What the block counted.
    pub fn counters(&self) -> CqCounters {
        self.counters
    }

    /// Forgets the CQ buffer records (with the context cache they lean on).
    pub fn forget_buffers(&mut self) {
        self.buffers.clear();
    }

    /// The context of CQ `cqn` and its bus address; [`Rejection::index`] beyond the table.
    fn cq_context(&mut self, io: &mut impl Io, cqn: u32) -> Result<(Cqc, u64), Rejection> {
        let num_cqs = self.caps.num_cqs;
        if cqn >= num_cqs {
            return Err(Rejection::index(cqn.into(), num_cqs.into()));
        }
        io.read_cqc(cqn)
    }

    /// [`cq_context`](Self::cq_context) for a completion: with the CQE buffer's
    /// translation when the device remembers the CQ and still caches its context.
    fn completion_cq_context(&mut self, io: &mut impl Io, cqn: u32) -> Result<(Cqc, u64, Option<Mtr>), Rejection> {
        if let Some(buffer) = self.buffers.get(&cqn) {
            // The buffers are forgotten whenever bus mastering may have gone off.
            if let Some(cqc) = io.cached_cqc(buffer.context_address) {
                return Ok((cqc, buffer.context_address, Some(buffer.mtr)));
            }
        }
        let (cqc, address) = self.cq_context(io, cqn)?;
        Ok((cqc, address, None))
    }

    /// Checks a CQC from CREATE_CQC against the capabilities and the EQs.
    fn check_new_cqc(&self, io: &impl Io, cqc: &Cqc) -> Result<(), Rejection> {
        let caps = &self.caps;
        if cqc.cq_state_raw() != u8::from(CqState::Valid) {
            return Err(Rejection::parameter(
                Cqc::CQ_ST.name,
                cqc.cq_state_raw().into(),
                "1 (valid)",
            ));
        }
        let max_shift = caps.max_cqes.checked_ilog2().unwrap_or(0).min(MAX_SHIFT);
        if u32::from(cqc.shift()) > max_shift {
            return Err(Rejection::parameter(
                Cqc::SHIFT.name,
                cqc.shift().into(),
                format!(
                    "at most {max_shift} (the CQ depth limit {} from the capabilities)",
                    1u64 << max_shift
                ),
            ));
        }
        let ceqn = u32::from(cqc.ceq_number());
        if !io.ceq_exists(ceqn) {
            return Err(Rejection::parameter(
                Cqc::CEQN.name,
                ceqn.into(),
                format!("a created CEQ below {} (CREATE_CEQC first)", io.num_ceqs()),
            ));
        }
        if cqc.cqe_size().is_err() {
            return Err(Rejection::parameter(
                Cqc::CQE_SIZE.name,
                cqc.cqe_size_raw().into(),
                "0 (32-byte CQEs) or 1 (64-byte CQEs)",
            ));
        }
        if cqc.cqe_hop_number() > MAX_HOP {
            return Err(Rejection::parameter(
                Cqc::CQE_HOP_NUM.name,
                cqc.cqe_hop_number().into(),
                "0..=3",
            ));
        }
        if page_shift_from_field(cqc.cqe_ba_page_size()) > MAX_BT_PAGE_SHIFT {
            return Err(Rejection::parameter(
                Cqc::CQE_BAR_PG_SZ.name,
                cqc.cqe_ba_page_size().into(),
                format!("0..={} (BT pages of 4 KiB..2 MiB)", MAX_BT_PAGE_SHIFT - 12),
            ));
        }
        if page_shift_from_field(cqc.cqe_buffer_page_size()) > MAX_BUFFER_PAGE_SHIFT {
            return Err(Rejection::parameter(
                Cqc::CQE_BUF_PG_SZ.name,
                cqc.cqe_buffer_page_size().into(),
                format!("0..={} (buffer pages of 4 KiB..1 GiB)", MAX_BUFFER_PAGE_SHIFT - 12),
            ));
        }
        let mtr = cq_mtr(cqc);
        mtr.validate()
            .map_err(|e| Rejection::parameter(Cqc::CQE_BA.name, mtr.root, format!("a usable CQE buffer: {e}")))?;
        if cqc.arm_state().is_err() {
            return Err(Rejection::parameter(
                Cqc::ARM_ST.name,
                cqc.arm_state_raw().into(),
                "0 (not armed; 2 and 3 are set by the arm doorbell)",
            ));
        }
        if cqc.record_enable() {
            if !caps.flags.contains(CapFlags::CQ_RECORD_DB) {
                return Err(Rejection::parameter(
                    Cqc::DB_RECORD_EN.name,
                    1,
                    "0: the device has no CQ_RECORD_DB capability",
                ));
            }
            let address = cqc.record_address();
            if address == 0 || address & 3 != 0 {
                return Err(Rejection::parameter(
                    Cqc::CQE_DB_RECORD_ADDR.name,
                    address,
                    "a non-zero, 4-byte aligned record address",
                ));
            }
        }
        Ok(())
    }

    // ---- mailbox commands ----------------------------------------------------------

    /// CREATE_CQC: checks the context and writes it (CQN set, indices 0) to the CQC
    /// table.
    pub fn create(&mut self, io: &mut impl Io, cqn: u32, cqc: Cqc) -> Result<(), Rejection> {
        let (current, address) = self.cq_context(io, cqn)?;
        if in_use(&current) {
            return Err(Rejection::state(
                Cqc::CQ_ST.name,
                current.cq_state_raw().into(),
                format!("CQ {cqn:#x} not in use (destroy it first)"),
            ));
        }
        if cqc.cq_number() != cqn {
            return Err(Rejection::parameter(
                Cqc::CQN.name,
                cqc.cq_number().into(),
                format!("the CQ number of the mailbox tag, {cqn:#x}"),
            ));
        }
        self.check_new_cqc(io, &cqc)?;
        let mut context = cqc;
        context.set_producer_index(0);
        context.set_consumer_index(0);
        self.buffers.remove(&cqn);
        io.write_cqc(address, &context)?;
        tracing::debug!(target: "rnic::cq", cqn, depth = cq_depth(&context), ceqn = context.ceq_number(), "CQ created");
        Ok(())
    }

    /// MODIFY_CQC with the hns mask rule (mask bit 1 keeps the current bit): only the
    /// moderation fields `CQ_MAX_CNT` and `CQ_PERIOD` may change.
    pub fn modify(&mut self, io: &mut impl Io, cqn: u32, cqc: Cqc, mask: Cqc) -> Result<(), Rejection> {
        let (current, address) = self.cq_context(io, cqn)?;
        if !in_use(&current) {
            return Err(Rejection::state(
                Cqc::CQ_ST.name,
                0,
                format!("a created CQ {cqn:#x} (CREATE_CQC first)"),
            ));
        }
        let merged =
            crate::command::merge_modifiable(&current, &cqc, &mask, &[Cqc::CQ_MAX_CNT, Cqc::CQ_PERIOD], "MODIFY_CQC")?;
        let mut context = current;
        context.set_moderation_count(merged.moderation_count());
        context.set_moderation_period(merged.moderation_period());
        io.write_cqc(address, &context)
    }

    /// QUERY_CQC: the context as it is in host memory.
    pub fn query(&mut self, io: &mut impl Io, cqn: u32) -> Result<Cqc, Rejection> {
        let (current, _) = self.cq_context(io, cqn)?;
        if !in_use(&current) {
            return Err(Rejection::state(
                Cqc::CQ_ST.name,
                0,
                format!("a created CQ {cqn:#x} (CREATE_CQC first)"),
            ));
        }
        Ok(current)
    }

    /// DESTROY_CQC: `CQ_ST` = 0 written back. A QP still naming the CQ is the driver's
    /// business.
    pub fn destroy(&mut self, io: &mut impl Io, cqn: u32) -> Result<(), Rejection> {
        let (mut context, address) = self.cq_context(io, cqn)?;
        if !in_use(&context) {
            return Err(Rejection::state(
                Cqc::CQ_ST.name,
                0,
                format!("a created CQ {cqn:#x} (nothing to destroy)"),
            ));
        }
        context.set_cq_state(CqState::Invalid);
        context.set_arm_state(CqArmState::NoArmed);
        self.buffers.remove(&cqn);
        io.write_cqc(address, &context)?;
        tracing::debug!(target: "rnic::cq", cqn, "CQ destroyed");
        Ok(())
    }

    /// Whether CQ `cqn` exists and is valid (`CQ_ST` = 1).
    pub fn is_valid(&mut self, io: &mut impl Io, cqn: u32) -> bool {
        matches!(self.cq_context(io, cqn), Ok((cqc, _)) if cqc.cq_state() == Ok(CqState::Valid))
    }

    // ---- doorbells -----------------------------------------------------------------

    /// CQ doorbell (`CMD` 3 set CI, 4 arm) for CQ `cqn`. A doorbell for a CQ that does not
    /// exist is dropped and reported with CQ_ID_INVALID.
    pub fn doorbell(&mut self, io: &mut impl Io, cqn: u32, word: u64) {
        let doorbell = CqDoorbell::from_u64(word);
        // Built only on error paths: set-CI doorbells are on the polling data path.
        let object = || format!("CQ {cqn:#x}");
        let (mut cqc, address) = match self.cq_context(io, cqn) {
            Ok((cqc, address)) if cqc.cq_state() == Ok(CqState::Valid) => (cqc, address),
            Ok((cqc, _)) if in_use(&cqc) => {
                let state = cqc.cq_state_raw();
                self.doorbell_dropped(
                    io,
                    object(),
                    Cqc::CQ_ST.name,
                    state.into(),
                    "a valid CQ: this one overflowed or failed and must be destroyed".into(),
                );
                return;
            }
            other => {
                let reason = match other {
                    Err(rejection) => format!("a created CQ (context unreachable: {})", rejection.expected),
                    Ok(_) => "a created CQ (CQ_ST = 0)".to_string(),
                };
                self.doorbell_dropped(io, object(), CqDoorbell::TAG.name, cqn.into(), reason);
                io.async_event(AsyncEventType::CqIdInvalid, 0, cqn);
                return;
            }
        };
        let depth = cq_depth(&cqc);
        let producer_index = cqc.producer_index() & INDEX_MASK;
        match DoorbellCommand::try_from(doorbell.command()) {
            Ok(DoorbellCommand::CqSetCi) => {
                let consumer_index = doorbell.consumer_index() & INDEX_MASK;
                let old = cqc.consumer_index() & INDEX_MASK;
                let old_occupancy = producer_index.wrapping_sub(old) & INDEX_MASK;
                let occupancy = producer_index.wrapping_sub(consumer_index) & INDEX_MASK;
                if occupancy > old_occupancy.min(depth) {
                    let expected = format!(
                        "a consumer index from the current {old:#x} up to the producer index {producer_index:#x}"
                    );
                    self.doorbell_dropped(io, object(), CqDoorbell::CQ_CI.name, consumer_index.into(), expected);
                    return;
                }
                cqc.set_consumer_index(consumer_index);
                if self.write_back(io, cqn, address, &cqc) {
                    self.counters.doorbells += 1;
                }
            }
            Ok(DoorbellCommand::CqArm) => {
                // User space masks the arm CI with 2 × depth − 1 (hns §6.1), the kernel
                // with 24 bits: compare modulo 2 × depth, which both agree on.
                let window = 2 * depth - 1;
                let consumer_index = doorbell.consumer_index();
                let outstanding = producer_index.wrapping_sub(consumer_index) & window;
                if outstanding > depth {
                    let expected =
                        format!("a consumer index at most {depth} behind the producer index {producer_index:#x}");
                    self.doorbell_dropped(io, object(), CqDoorbell::CQ_CI.name, consumer_index.into(), expected);
                    return;
                }
                let solicited = doorbell.solicited_only();
                cqc.set_command_sequence_number(doorbell.command_sequence());
                let notify_now = !solicited && outstanding > 0;
                cqc.set_arm_state(match (notify_now, solicited) {
                    (true, _) => CqArmState::NoArmed,
                    (false, true) => CqArmState::NextSolicited,
                    (false, false) => CqArmState::NextCompletion,
                });
                if !self.write_back(io, cqn, address, &cqc) {
                    return;
                }
                self.counters.doorbells += 1;
                tracing::trace!(target: "rnic::cq", cqn, solicited, outstanding, "CQ armed");
                if notify_now {
                    io.completion_event(cqc.ceq_number().into(), cqn);
                }
            }
            _ => {
                self.doorbell_dropped(
                    io,
                    object(),
                    CqDoorbell::CMD.name,
                    doorbell.command().into(),
                    "3 (CQ set-CI) or 4 (CQ arm)".into(),
                );
            }
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

    /// Writes CQ `cqn`'s context back; diagnoses a failure.
    fn write_back(&mut self, io: &mut impl Io, cqn: u32, address: u64, cqc: &Cqc) -> bool {
        match io.write_cqc(address, cqc) {
            Ok(()) => true,
            Err(rejection) => {
                io.diagnose(
                    Source::CompletionQueue,
                    format!("CQ {cqn:#x}"),
                    "CQC",
                    address,
                    rejection.expected,
                );
                false
            }
        }
    }

    // ---- completions ---------------------------------------------------------------

    /// Writes `cqe` to CQ `cqn` (its owner bit is set here), advances the producer index
    /// and, if the CQ is armed for it, posts a CEQE on the CQ's CEQ and disarms.
    /// `solicited` is the solicited-event bit of the completed request; an error status
    /// also satisfies a solicited-only arm.
    pub fn post_cqe(&mut self, io: &mut impl Io, cqn: u32, mut cqe: Cqe, solicited: bool) -> Result<(), CqError> {
        // The object name is built only on error paths: this function is on the data path.
        let object = || format!("CQ {cqn:#x}");
        let (mut cqc, context_address, remembered) = match self.completion_cq_context(io, cqn) {
            Ok(found) => found,
            Err(rejection) => {
                let expected = format!(
                    "a reachable CQ context for a completion of QP {:#x}: {}",
                    cqe.local_qp_number(),
                    rejection.expected
                );
                io.diagnose(Source::CompletionQueue, object(), "CQN", cqn.into(), expected);
                io.async_event(AsyncEventType::CqIdInvalid, 0, cqn);
                return Err(CqError::Context { cqn, rejection });
            }
        };
        match cqc.cq_state() {
            Ok(CqState::Valid) => {}
            Ok(CqState::Invalid) => {
                let expected = format!("a created CQ for a completion of QP {:#x}", cqe.local_qp_number());
                io.diagnose(Source::CompletionQueue, object(), Cqc::CQ_ST.name, 0, expected);
                io.async_event(AsyncEventType::CqIdInvalid, 0, cqn);
                return Err(CqError::Invalid { cqn });
            }
            _ => {
                let state = cqc.cq_state_raw();
                io.diagnose(
                    Source::CompletionQueue,
                    object(),
                    Cqc::CQ_ST.name,
                    state.into(),
                    "a valid CQ (the CQE is dropped)",
                );
                return Err(CqError::Broken { cqn, state });
            }
        }
        let depth = cq_depth(&cqc);
        let size = cqe_bytes(&cqc);
        let producer_index = cqc.producer_index() & INDEX_MASK;
        let consumer_index = if cqc.record_enable() {
            let record = cqc.record_address();
            let mut value = [0u8; 4];
            if let Err(error) = io.dma_read(record, &mut value) {
                return Err(self.access_error(
                    io,
                    cqn,
                    cqc,
                    context_address,
                    record,
                    format!("a readable CQ record doorbell: {error}"),
                ));
            }
            u32::from_le_bytes(value) & INDEX_MASK
        } else {
            cqc.consumer_index() & INDEX_MASK
        };
        let occupancy = producer_index.wrapping_sub(consumer_index) & INDEX_MASK;
        if occupancy == depth {
            return Err(self.overflow(io, cqn, cqc, context_address, consumer_index));
        }
        if occupancy > depth {
            let field = if cqc.record_enable() {
                "CQ record doorbell"
            } else {
                Cqc::CQ_CONSUMER_IDX.name
            };
            let expected = format!("a consumer index at most {depth} behind the producer index {producer_index:#x} (the CQE is written anyway)");
            io.diagnose(
                Source::CompletionQueue,
                object(),
                field,
                consumer_index.into(),
                expected,
            );
        }
        cqe.set_owner(owner_bit_for_producer(producer_index, depth));
        let offset = u64::from(producer_index & (depth - 1)) * size as u64;
        let mtr = match remembered {
            Some(mtr) => mtr,
            None => {
                let mtr = cq_mtr(&cqc);
                if self.buffers.len() >= crate::hem::CONTEXT_CACHE_CAPACITY {
                    self.buffers.clear();
                }
                self.buffers.insert(cqn, CqBuffer { context_address, mtr });
                mtr
            }
        };
        let address = match io.translate(&mtr, offset) {
            Some(Ok(address)) => address,
            Some(Err(error)) => {
                if matches!(error, MttError::BtUnreachable { .. }) {
                    io.count_dma_error();
                }
                return Err(self.access_error(
                    io,
                    cqn,
                    cqc,
                    context_address,
                    offset,
                    format!("a translatable CQE buffer: {error}"),
                ));
            }
            None => {
                let error = MemoryError::Permission {
                    kind: crate::memory::AccessKind::Write,
                    address: offset,
                };
                return Err(self.access_error(
                    io,
                    cqn,
                    cqc,
                    context_address,
                    offset,
                    format!("bus mastering enabled: {error}"),
                ));
            }
        };
        if let Err(error) = io.dma_write(address, &cqe.bytes()[..size]) {
            return Err(self.access_error(
                io,
                cqn,
                cqc,
                context_address,
                address,
                format!("a writable CQE at {address:#x}: {error}"),
            ));
        }
        cqc.set_producer_index((producer_index + 1) & INDEX_MASK);
        let failed = cqe.status() != u8::from(CqeStatus::Success);
        let notify = match cqc.arm_state() {
            Ok(CqArmState::NextCompletion) => true,
            Ok(CqArmState::NextSolicited) => solicited || failed,
            _ => false,
        };
        if notify {
            cqc.set_arm_state(CqArmState::NoArmed);
        }
        self.counters.cqes += 1;
        tracing::trace!(target: "rnic::cq", cqn, producer_index, address, notify, "CQE written");
        if let Err(rejection) = io.write_cqc(context_address, &cqc) {
            let reason = format!("a writable CQ context at {context_address:#x}: {}", rejection.expected);
            io.diagnose(
                Source::CompletionQueue,
                format!("CQ {cqn:#x}"),
                "CQC",
                context_address,
                reason.clone(),
            );
            io.async_event(AsyncEventType::CqAccessError, 0, cqn);
            return Err(CqError::Access { cqn, reason });
        }
        if notify {
            io.completion_event(cqc.ceq_number().into(), cqn);
        }
        Ok(())
    }

    /// CQ `cqn` is full: CQE dropped; unless `OVER_IGNORE`, `CQ_ST` = overflow and
    /// CQ_OVERFLOW posted.
    fn overflow(
        &mut self,
        io: &mut impl Io,
        cqn: u32,
        mut cqc: Cqc,
        context_address: u64,
        consumer_index: u32,
    ) -> CqError {
        let depth = cq_depth(&cqc);
        let ignore = cqc.overflow_ignore();
        io.diagnose(
            Source::CompletionQueue,
            format!("CQ {cqn:#x}"),
            Cqc::CQ_CONSUMER_IDX.name,
            u64::from(consumer_index),
            format!("room for a CQE: all {depth} CQEs are unconsumed, the CQE is dropped"),
        );
        if !ignore {
            cqc.set_cq_state(CqState::Overflow);
            self.write_back(io, cqn, context_address, &cqc);
            io.async_event(AsyncEventType::CqOverflow, 0, cqn);
        }
        CqError::Overflow { cqn, depth }
    }

    /// A DMA access for CQ `cqn` failed: `CQ_ST` = failure, CQ_ACCESS_ERROR posted.
    fn access_error(
        &mut self,
        io: &mut impl Io,
        cqn: u32,
        mut cqc: Cqc,
        context_address: u64,
        value: u64,
        reason: String,
    ) -> CqError {
        io.diagnose(
            Source::CompletionQueue,
            format!("CQ {cqn:#x}"),
            Cqc::CQE_BA.name,
            value,
            reason.clone(),
        );
        cqc.set_cq_state(CqState::Failure);
        self.write_back(io, cqn, context_address, &cqc);
        io.async_event(AsyncEventType::CqAccessError, 0, cqn);
        CqError::Access { cqn, reason }
    }
}
