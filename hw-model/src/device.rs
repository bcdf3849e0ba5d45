//! The device: BAR decode, control registers, DMA gate, event loop.
//!
//! A backend (the in-process embedded backend, the vfio-user server) owns a [`Device`]
//! and drives it with configuration-space and BAR accesses and with
//! [`Device::advance_to`], which runs every event due by a virtual instant. Nothing inside
//! runs by itself: no threads, no wall clock.

use std::sync::Arc;

use rnic_firmware_if::doorbell::{DB_OFFSET, EQ_DB_OFFSET};
use rnic_firmware_if::regs;

use crate::config::DeviceConfig;
use crate::diagnostics::{Diagnostic, DiagnosticLog, Source};
use crate::eq::EventQueues;
use crate::fast_hash::FastHashMap;
use crate::firmware::Rejection;
use crate::firmware::{CommandQueue, Firmware};
use crate::hem::{ContextCache, ContextTable};
use crate::interrupt::InterruptSink;
use crate::memory::{AccessKind, HostMemory, MemoryError};
use crate::mtt::{Mtr, MttError, TranslationCache};
use crate::pci::{BarDescriptor, ConfigSpace, MsixTable};
use crate::time::{Picoseconds, Scheduler};
use crate::timing::TimingModel;
use crate::transport::Transport;
use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::Mpt;
use rnic_firmware_if::mailbox::ContextTable as ContextTableId;

/// Something the device will do at a virtual instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Event {
    /// Process the command queue up to the producer index.
    CommandQueue,
    /// Complete the mailbox command at the head of the mailbox queue.
    MailboxComplete,
    /// A function reset finishes.
    ResetDone,
    /// An EQ's coalescing period expired: raise its interrupt if entries are pending.
    EqCoalesceTimer {
        /// EQ number.
        eqn: u32,
        /// Generation of the timer, to ignore timers superseded by an earlier interrupt.
        generation: u64,
    },
    /// The port finished serialising a frame and may start the next (transport).
    TransportTx,
    /// Received frames leave the receive pipeline for the engines (transport).
    TransportRx,
    /// A QP's local ACK timer is due.
    AckTimer {
        /// QP number.
        qpn: u32,
        /// Generation of the requester that armed it (stale timers are ignored).
        generation: u64,
    },
    /// A QP's RNR wait is over.
    RnrTimer {
        /// QP number.
        qpn: u32,
        /// Generation of the RNR wait (stale timers are ignored).
        generation: u64,
    },
}

/// Counters a test or a user can read to see what the device did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Commands executed from the command queue.
    pub commands: u64,
    /// Mailbox commands completed (any status).
    pub mailbox_commands: u64,
    /// Doorbells accepted.
    pub doorbells: u64,
    /// Doorbells dropped (bad page, unknown object, wrong state).
    pub doorbells_dropped: u64,
    /// CQEs written.
    pub cqes: u64,
    /// EQEs written.
    pub eqes: u64,
    /// MSI-X messages delivered or left pending.
    pub interrupts: u64,
    /// DMA accesses that failed.
    pub dma_errors: u64,
}

/// Control registers of BAR0 that are not part of a sub-engine.
#[derive(Debug, Clone, Default)]
pub(crate) struct ControlRegisters {
    pub abnormal_config: u32,
    pub abnormal_status: u32,
    pub abnormal_enable: u32,
    pub event_enable: Vec<bool>,
    pub resetting: bool,
    pub fatal: bool,
}

/// The context tables kept in host memory (HEM).
#[derive(Debug, Clone)]
pub(crate) struct ContextTables {
    pub qpc: ContextTable,
    pub mpt: ContextTable,
    pub cqc: ContextTable,
    pub srqc: ContextTable,
}

/// One rnic device (one PCI function).
pub struct Device {
    pub(crate) config: DeviceConfig,
    pub(crate) scheduler: Scheduler<Event>,
    pub(crate) memory: Arc<dyn HostMemory>,
    pub(crate) interrupts: Box<dyn InterruptSink>,
    pub(crate) config_space: ConfigSpace,
    pub(crate) msix: MsixTable,
    pub(crate) registers: ControlRegisters,
    pub(crate) cmdq: CommandQueue,
    pub(crate) firmware: Firmware,
    pub(crate) tables: ContextTables,
    pub(crate) eqs: EventQueues,
    /// The RoCEv2 transport engines and the port.
    pub(crate) transport: Transport,
    /// The timing model: parameters, caches, per-stage totals.
    pub(crate) timing: TimingModel,
    /// Low halves of 64-bit doorbells written as two 32-bit stores, per page and register.
    pub(crate) doorbell_latch: Vec<[Option<u32>; 2]>,
    pub(crate) diagnostics: DiagnosticLog,
    pub(crate) counters: Counters,
    /// MPT index → the context as last read from host memory, forgotten with the context
    /// tables' remembered addresses (see [`Device::forget_context_caches`]) and when the
    /// device itself changes an MPT: the hns MPT cache.
    pub(crate) mpt_cache: FastHashMap<u32, crate::mpt::CheckedMpt>,
    /// The MTT cache: page translations, forgotten with the MPT cache.
    pub(crate) translations: TranslationCache,
    /// The QPC and CQC cache (hns keeps both on chip): contexts the device read, written
    /// back to host memory lazily, before anything can look at host memory's copy (see
    /// [`Device::write_back_contexts`]).
    pub(crate) context_cache: ContextCache,
    /// CQN → the CQ's context address and CQE buffer translation, forgotten with the
    /// context cache and at CREATE/DESTROY_CQC (see `cq`).
    pub(crate) cq_buffers: FastHashMap<u32, crate::cq::CqBuffer>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("now", &self.scheduler.now())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// A device in its power-on state, DMA-ing into `memory` and signalling `interrupts`.
    pub fn new(config: DeviceConfig, memory: Arc<dyn HostMemory>, interrupts: Box<dyn InterruptSink>) -> Self {
        let vectors = crate::config::msix_vector_count(&config.caps);
        let bars = [
            BarDescriptor {
                index: regs::CONTROL_BAR,
                size: regs::BAR0_SIZE,
            },
            BarDescriptor {
                index: regs::DOORBELL_BAR,
                size: (config.doorbell_pages.max(1) as u64 * regs::DOORBELL_PAGE_SIZE).next_power_of_two(),
            },
            BarDescriptor {
                index: regs::MSIX_BAR,
                size: regs::MSIX_BAR_SIZE,
            },
        ];
        let config_space = ConfigSpace::new(config.identity, &bars, vectors);
        let tables = Self::context_tables_for(&config);
        let eqs = EventQueues::new(&config.caps);
        let pages = config.doorbell_pages.max(1) as usize;
        Self {
            scheduler: Scheduler::new(),
            memory,
            interrupts,
            config_space,
            msix: MsixTable::new(vectors),
            registers: ControlRegisters {
                event_enable: vec![false; regs::MAX_EVENT_INT_ENABLES as usize],
                ..Default::default()
            },
            cmdq: CommandQueue::default(),
            firmware: Firmware::new(&config),
            tables,
            eqs,
            transport: Transport::new(),
            timing: TimingModel::new(config.timing),
            doorbell_latch: vec![[None; 2]; pages],
            diagnostics: DiagnosticLog::default(),
            counters: Counters::default(),
            mpt_cache: FastHashMap::default(),
            translations: TranslationCache::default(),
            context_cache: ContextCache::default(),
            cq_buffers: FastHashMap::default(),
            config,
        }
    }

    pub(crate) fn context_tables_for(config: &DeviceConfig) -> ContextTables {
        use rnic_firmware_if::context::{CQC_SIZE, MPT_SIZE, QPC_SIZE, SRQC_SIZE};
        let caps = &config.caps;
        let slots = &config.bt_slots;
        ContextTables {
            qpc: ContextTable::new("QPC", QPC_SIZE as u64, caps.num_qps, slots.qpc as usize),
            mpt: ContextTable::new("MPT", MPT_SIZE as u64, caps.num_mtpts, slots.mpt as usize),
            cqc: ContextTable::new("CQC", CQC_SIZE as u64, caps.num_cqs, slots.cqc as usize),
            srqc: ContextTable::new("SRQC", SRQC_SIZE as u64, caps.num_srqs, slots.srqc as usize),
        }
    }

    /// A copy of this device in its current state — registers, firmware, caches, engines,
    /// pending events, virtual time — that DMAs into the same host memory and signals
    /// `interrupts`. Host memory is not the device's, so it is not copied: a caller that
    /// wants to return to this moment restores it. Fuzzers bring a device up once and
    /// fork it for each input instead of bringing it up again.
    pub fn fork(&self, interrupts: Box<dyn InterruptSink>) -> Device {
        Device {
            config: self.config.clone(),
            scheduler: self.scheduler.clone(),
            memory: self.memory.clone(),
            interrupts,
            config_space: self.config_space.clone(),
            msix: self.msix.clone(),
            registers: self.registers.clone(),
            cmdq: self.cmdq.clone(),
            firmware: self.firmware.clone(),
            tables: self.tables.clone(),
            eqs: self.eqs.clone(),
            transport: self.transport.clone(),
            timing: self.timing.clone(),
            doorbell_latch: self.doorbell_latch.clone(),
            diagnostics: self.diagnostics.clone(),
            counters: self.counters,
            mpt_cache: self.mpt_cache.clone(),
            translations: self.translations.clone(),
            context_cache: self.context_cache.clone(),
            cq_buffers: self.cq_buffers.clone(),
        }
    }

    /// The configuration this device was built with.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Current virtual time.
    pub fn now(&self) -> Picoseconds {
        self.scheduler.now()
    }

    /// Time of the next pending event, if any.
    pub fn next_event_time(&self) -> Option<Picoseconds> {
        self.scheduler.next_event_time()
    }

    /// Runs every event due at or before `t`, then moves virtual time to `t`.
    #[inline]
    pub fn advance_to(&mut self, t: Picoseconds) {
        // Most calls (the fabric steps every device) find nothing due: only the clock
        // moves, without the call into the event loop.
        if self.scheduler.next_event_time().is_some_and(|next| next <= t) {
            self.run_due_events(t);
        }
        self.scheduler.advance_to(t);
    }

    fn run_due_events(&mut self, t: Picoseconds) {
        while let Some(event) = self.scheduler.pop_due(t) {
            self.run_event(event);
        }
    }

    /// Runs events until none is pending or virtual time would pass `limit`; returns the
    /// time reached.
    pub fn run_until_idle(&mut self, limit: Picoseconds) -> Picoseconds {
        while let Some(next) = self.scheduler.next_event_time() {
            if next > limit {
                break;
            }
            self.advance_to(next);
        }
        self.now()
    }

    fn run_event(&mut self, event: Event) {
        match event {
            Event::CommandQueue => self.process_command_queue(),
            Event::MailboxComplete => self.complete_mailbox(),
            Event::ResetDone => {
                self.registers.resetting = false;
            }
            Event::EqCoalesceTimer { eqn, generation } => self.eq_coalesce_timer(eqn, generation),
            Event::TransportTx => self.transport_tx_event(),
            Event::TransportRx => self.transport_rx_event(),
            Event::AckTimer { qpn, generation } => self.ack_timer_event(qpn, generation),
            Event::RnrTimer { qpn, generation } => self.rnr_timer_event(qpn, generation),
        }
    }

    /// The timing model: parameters, per-stage totals, cache statistics.
    pub fn timing(&self) -> &TimingModel {
        &self.timing
    }

    /// The timing model, to reset its totals.
    pub fn timing_mut(&mut self) -> &mut TimingModel {
        &mut self.timing
    }

    /// Counters since power-on.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The diagnostic log.
    pub fn diagnostics(&self) -> &DiagnosticLog {
        &self.diagnostics
    }

    /// Takes the kept diagnostics out of the log.
    pub fn take_diagnostics(&mut self) -> Vec<Diagnostic> {
        self.diagnostics.drain()
    }

    /// Number of valid objects per context table (QP, MPT, CQ, SRQ), read from host
    /// memory; used by leak tests and `query` tools.
    pub fn context_table_slots_in_use(&self) -> [usize; 4] {
        [
            self.tables.qpc.valid_l0_slots(),
            self.tables.mpt.valid_l0_slots(),
            self.tables.cqc.valid_l0_slots(),
            self.tables.srqc.valid_l0_slots(),
        ]
    }

    pub(crate) fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.diagnostics.record(Diagnostic {
            time_ps: self.scheduler.now().0,
            source,
            object: object.into(),
            field,
            value,
            expected: expected.into(),
        });
    }

    // ---- DMA gate -------------------------------------------------------------------

    /// DMA read, refused unless bus mastering is enabled.
    pub(crate) fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let result = if self.config_space.bus_master_enabled() {
            self.memory.read(address, buffer)
        } else {
            Err(MemoryError::Permission {
                kind: AccessKind::Read,
                address,
            })
        };
        if result.is_err() {
            self.counters.dma_errors += 1;
        }
        result
    }

    /// DMA write, refused unless bus mastering is enabled.
    pub(crate) fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        let result = if self.config_space.bus_master_enabled() {
            self.memory.write(address, data)
        } else {
            Err(MemoryError::Permission {
                kind: AccessKind::Write,
                address,
            })
        };
        if result.is_err() {
            self.counters.dma_errors += 1;
        }
        result
    }

    /// Host memory as seen by DMA, when bus mastering is on.
    pub(crate) fn dma_memory(&self) -> Option<&dyn HostMemory> {
        self.config_space
            .bus_master_enabled()
            .then_some(&*self.memory as &dyn HostMemory)
    }

    // ---- interrupts -----------------------------------------------------------------

    /// Signals MSI-X `vector` (pending if masked).
    pub(crate) fn signal_vector(&mut self, vector: u16) {
        self.counters.interrupts += 1;
        let enabled = self.config_space.msix_enabled();
        let masked = self.config_space.msix_function_masked();
        self.msix.signal(vector, enabled, masked, &mut *self.interrupts);
    }

    /// Sets abnormal status bits and raises the abnormal vector if enabled.
    pub(crate) fn raise_abnormal(&mut self, bits: u32) {
        self.registers.abnormal_status |= bits;
        if self.registers.abnormal_config & 1 != 0 && self.registers.abnormal_enable & bits != 0 {
            self.signal_vector(regs::ABNORMAL_VECTOR);
        }
    }

    // ---- configuration space --------------------------------------------------------

    /// Reads configuration space.
    pub fn config_read(&mut self, offset: usize, data: &mut [u8]) {
        self.config_space.read(offset, data);
    }

    /// Writes configuration space.
    pub fn config_write(&mut self, offset: usize, data: &[u8]) {
        // The write may turn bus mastering off: the cached contexts go back first.
        self.drop_context_cache();
        let was_masked = self.config_space.msix_function_masked() || !self.config_space.msix_enabled();
        self.config_space.write(offset, data);
        let now_masked = self.config_space.msix_function_masked() || !self.config_space.msix_enabled();
        if was_masked && !now_masked {
            self.msix.function_unmasked(&mut *self.interrupts);
        }
    }

    // ---- BARs -----------------------------------------------------------------------

    /// Reads `data.len()` bytes from `bar` at `offset`. Unmapped or disabled regions read
    /// as all ones, as an unsupported PCI request would.
    pub fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) {
        data.fill(0xFF);
        if !self.config_space.memory_enabled() {
            return;
        }
        match bar {
            regs::CONTROL_BAR => self.control_read(offset, data),
            regs::DOORBELL_BAR => data.fill(0),
            regs::MSIX_BAR => self.msix.read(offset, data),
            _ => {}
        }
    }

    /// Writes `data` to `bar` at `offset`.
    pub fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) {
        if !self.config_space.memory_enabled() {
            self.diagnose(
                Source::Pci,
                format!("BAR{bar}"),
                "COMMAND.MEMORY_SPACE",
                0,
                "memory decoding enabled before BAR writes",
            );
            return;
        }
        match bar {
            regs::CONTROL_BAR => self.control_write(offset, data),
            regs::DOORBELL_BAR => self.doorbell_page_write(offset, data),
            regs::MSIX_BAR => {
                let enabled = self.config_space.msix_enabled();
                let masked = self.config_space.msix_function_masked();
                self.msix.write(offset, data, enabled, masked, &mut *self.interrupts);
            }
            _ => self.diagnose(
                Source::Pci,
                format!("BAR{bar}"),
                "BAR index",
                bar as u64,
                "BAR 0, 2 or 4",
            ),
        }
    }

    fn control_read(&mut self, offset: u64, data: &mut [u8]) {
        match data.len() {
            4 => {
                let v = self.control_read32(offset);
                data.copy_from_slice(&v.to_le_bytes());
            }
            8 => {
                let low = self.control_read32(offset);
                let high = self.control_read32(offset + 4);
                data.copy_from_slice(&((high as u64) << 32 | low as u64).to_le_bytes());
            }
            n => self.diagnose(
                Source::Register,
                format!("BAR0+{offset:#x}"),
                "access size",
                n as u64,
                "4- or 8-byte register reads",
            ),
        }
    }

    fn control_write(&mut self, offset: u64, data: &[u8]) {
        match data.len() {
            4 => {
                let v = u32::from_le_bytes(data.try_into().expect("length checked"));
                self.control_write32(offset, v);
            }
            8 => {
                let v = u64::from_le_bytes(data.try_into().expect("length checked"));
                self.control_write32(offset, v as u32);
                self.control_write32(offset + 4, (v >> 32) as u32);
            }
            n => self.diagnose(
                Source::Register,
                format!("BAR0+{offset:#x}"),
                "access size",
                n as u64,
                "4- or 8-byte register writes",
            ),
        }
    }

    fn control_read32(&mut self, offset: u64) -> u32 {
        match offset {
            regs::ID => regs::ID_MAGIC,
            regs::VERSION => regs::INTERFACE_VERSION,
            regs::FUNCTION_RESET => self.registers.resetting as u32,
            regs::FUNCTION_STATUS => {
                let mut status = 0;
                if !self.registers.resetting {
                    status |= regs::STATUS_READY;
                }
                if self.registers.fatal {
                    status |= regs::STATUS_FATAL;
                }
                status
            }
            regs::CSQ_BASE_LOW => self.cmdq.base as u32,
            regs::CSQ_BASE_HIGH => (self.cmdq.base >> 32) as u32,
            regs::CSQ_DEPTH => self.cmdq.depth_register,
            regs::CSQ_PRODUCER_INDEX => self.cmdq.producer_index,
            regs::CSQ_CONSUMER_INDEX => self.cmdq.consumer_index,
            regs::ABNORMAL_INT_CONFIG => self.registers.abnormal_config,
            regs::ABNORMAL_INT_STATUS => self.registers.abnormal_status,
            regs::ABNORMAL_INT_ENABLE => self.registers.abnormal_enable,
            o if (regs::EVENT_INT_ENABLE_BASE..regs::event_int_enable(regs::MAX_EVENT_INT_ENABLES as u32))
                .contains(&o)
                && o % 4 == 0 =>
            {
                let eqn = ((o - regs::EVENT_INT_ENABLE_BASE) / 4) as usize;
                self.registers.event_enable[eqn] as u32
            }
            _ => 0,
        }
    }

    fn control_write32(&mut self, offset: u64, value: u32) {
        if self.registers.resetting && offset != regs::FUNCTION_RESET {
            self.diagnose(
                Source::Register,
                format!("BAR0+{offset:#x}"),
                "FUNCTION_RESET",
                1,
                "no register writes while a reset is in progress",
            );
            return;
        }
        match offset {
            regs::FUNCTION_RESET => {
                if value & 1 != 0 {
                    self.function_reset();
                }
            }
            regs::CSQ_BASE_LOW
            | regs::CSQ_BASE_HIGH
            | regs::CSQ_DEPTH
            | regs::CSQ_PRODUCER_INDEX
            | regs::CSQ_CONSUMER_INDEX => self.command_queue_register_write(offset, value),
            regs::ABNORMAL_INT_CONFIG => self.registers.abnormal_config = value,
            regs::ABNORMAL_INT_STATUS => self.registers.abnormal_status &= !value,
            regs::ABNORMAL_INT_ENABLE => self.registers.abnormal_enable = value,
            o if (regs::EVENT_INT_ENABLE_BASE..regs::event_int_enable(regs::MAX_EVENT_INT_ENABLES as u32))
                .contains(&o)
                && o % 4 == 0 =>
            {
                let eqn = ((o - regs::EVENT_INT_ENABLE_BASE) / 4) as u32;
                self.registers.event_enable[eqn as usize] = value & 1 != 0;
                if value & 1 != 0 {
                    self.eq_interrupt_enabled(eqn);
                }
            }
            o => {
                let known = regs::REGISTERS.iter().find(|r| r.offset == o);
                match known {
                    Some(r) => self.diagnose(
                        Source::Register,
                        r.name,
                        "write",
                        value as u64,
                        "no writes: the register is read-only",
                    ),
                    None => self.diagnose(
                        Source::Register,
                        format!("BAR0+{o:#x}"),
                        "offset",
                        o,
                        "a register listed in docs/register-map.md",
                    ),
                }
            }
        }
    }

    /// Resets the function: forgets every queue, table address, context cache and
    /// pending event; keeps configuration space and the MSI-X table.
    fn function_reset(&mut self) {
        tracing::info!(target: "rnic::device", "function reset");
        // Host memory keeps the progress the device made before the reset.
        self.drop_context_cache();
        self.scheduler.clear();
        self.cmdq = CommandQueue::default();
        self.firmware = Firmware::new(&self.config);
        self.tables = Self::context_tables_for(&self.config);
        self.mpt_cache.clear();
        self.translations.clear();
        self.eqs = EventQueues::new(&self.config.caps);
        self.transport = Transport::new();
        self.timing = TimingModel::new(self.config.timing);
        let event_enables = self.registers.event_enable.len();
        self.registers = ControlRegisters {
            event_enable: vec![false; event_enables],
            resetting: true,
            ..Default::default()
        };
        for latch in &mut self.doorbell_latch {
            *latch = [None; 2];
        }
        let delay = Picoseconds(self.config.timing.reset_ps);
        self.scheduler.schedule_in(delay, Event::ResetDone);
    }

    /// Doorbell BAR write: 64-bit doorbells at [`DB_OFFSET`] of any page and EQ doorbells
    /// at [`EQ_DB_OFFSET`] of page 0, as one 8-byte store or two 4-byte stores (low half
    /// first; the high half commits).
    fn doorbell_page_write(&mut self, offset: u64, data: &[u8]) {
        let page = (offset / regs::DOORBELL_PAGE_SIZE) as usize;
        let in_page = offset % regs::DOORBELL_PAGE_SIZE;
        if page >= self.doorbell_latch.len() {
            self.counters.doorbells_dropped += 1;
            self.diagnose(
                Source::Doorbell,
                format!("doorbell page {page}"),
                "page",
                page as u64,
                format!("a page below {}", self.doorbell_latch.len()),
            );
            return;
        }
        let (register, base) = match in_page {
            o if (DB_OFFSET..DB_OFFSET + 8).contains(&o) => (0usize, DB_OFFSET),
            o if (EQ_DB_OFFSET..EQ_DB_OFFSET + 8).contains(&o) => (1usize, EQ_DB_OFFSET),
            o => {
                self.counters.doorbells_dropped += 1;
                self.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "offset",
                    o,
                    format!("{DB_OFFSET:#x} (queue doorbell) or {EQ_DB_OFFSET:#x} (EQ doorbell)"),
                );
                return;
            }
        };
        let word = match (in_page - base, data.len()) {
            (0, 8) => Some(u64::from_le_bytes(data.try_into().expect("length checked"))),
            (0, 4) => {
                self.doorbell_latch[page][register] =
                    Some(u32::from_le_bytes(data.try_into().expect("length checked")));
                None
            }
            (4, 4) => match self.doorbell_latch[page][register].take() {
                Some(low) => {
                    Some((u32::from_le_bytes(data.try_into().expect("length checked")) as u64) << 32 | low as u64)
                }
                None => {
                    self.counters.doorbells_dropped += 1;
                    self.diagnose(
                        Source::Doorbell,
                        format!("doorbell page {page}"),
                        "high half",
                        0,
                        "the low 32 bits written first",
                    );
                    None
                }
            },
            (o, n) => {
                self.counters.doorbells_dropped += 1;
                self.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "access",
                    o << 8 | n as u64,
                    "one 8-byte store, or 4-byte stores to the low then high half",
                );
                None
            }
        };
        let Some(word) = word else { return };
        if register == 1 {
            if page != 0 {
                self.counters.doorbells_dropped += 1;
                self.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "EQ doorbell",
                    word,
                    "EQ doorbells on the driver's page 0 only",
                );
                return;
            }
            self.eq_doorbell(word);
        } else {
            self.queue_doorbell(page as u32, word);
        }
    }
}

// ---- context access (host memory is the truth) ---------------------------------------

impl Device {
    fn table(&self, table: ContextTableId) -> &ContextTable {
        match table {
            ContextTableId::Qpc => &self.tables.qpc,
            ContextTableId::Mpt => &self.tables.mpt,
            ContextTableId::Cqc => &self.tables.cqc,
            ContextTableId::Srqc => &self.tables.srqc,
        }
    }

    /// Bus address of object `index` in `table`.
    pub(crate) fn context_address(&mut self, table: ContextTableId, index: u32) -> Result<u64, Rejection> {
        let context_table = self.table(table);
        if index >= context_table.object_count() {
            return Err(Rejection::index(index as u64, context_table.object_count() as u64));
        }
        if !self.config_space.bus_master_enabled() {
            return Err(Rejection::dma("context", 0, "bus mastering is disabled"));
        }
        let memory = &*self.memory;
        let context_table = match table {
            ContextTableId::Qpc => &mut self.tables.qpc,
            ContextTableId::Mpt => &mut self.tables.mpt,
            ContextTableId::Cqc => &mut self.tables.cqc,
            ContextTableId::Srqc => &mut self.tables.srqc,
        };
        let result = context_table.locate_cached(memory, index);
        result.map_err(|e| Rejection::no_table("context table", index as u64, e))
    }

    /// Forgets the object addresses the context tables remember, the cached MPTs and the
    /// cached page translations: the driver may have changed host BT pages or contexts
    /// before any command or mailbox (see `hem`).
    pub(crate) fn forget_context_caches(&mut self) {
        self.drop_context_cache();
        self.tables.qpc.forget_locations();
        self.tables.mpt.forget_locations();
        self.tables.cqc.forget_locations();
        self.tables.srqc.forget_locations();
        self.mpt_cache.clear();
        self.translations.clear();
    }

    /// Translates byte `offset` of the buffer `mtr` describes through the MTT cache;
    /// None when bus mastering is off.
    pub(crate) fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        if !self.config_space.bus_master_enabled() {
            return None;
        }
        Some(self.translations.translate(&*self.memory, mtr, offset))
    }

    /// MPT `index`, from the MPT cache or else read from host memory (and then cached).
    /// With bus mastering off it fails as the read would, cached or not.
    pub(crate) fn cached_mpt(&mut self, index: u32) -> Result<crate::mpt::CheckedMpt, Rejection> {
        if self.config_space.bus_master_enabled() {
            if let Some(mpt) = self.mpt_cache.get(&index) {
                return Ok(*mpt);
            }
        }
        let mpt = crate::mpt::CheckedMpt::decode(&self.read_context::<Mpt>(ContextTableId::Mpt, index)?.0);
        if self.mpt_cache.len() >= crate::hem::LOCATION_CACHE_CAPACITY {
            self.mpt_cache.clear();
        }
        self.mpt_cache.insert(index, mpt);
        Ok(mpt)
    }

    /// Reads object `index`'s context (a QPC or CQC from the context cache, else from
    /// host memory); returns it and its bus address.
    pub(crate) fn read_context<L: Layout>(&mut self, table: ContextTableId, index: u32) -> Result<(L, u64), Rejection> {
        if table == ContextTableId::Qpc && !self.transport.qpc_progress.is_empty() {
            // Whoever reads a QPC sees the engines' recorded progress in it.
            self.apply_qpc_progress(index);
        }
        let address = self.context_address(table, index)?;
        let mut context = L::zeroed();
        let cached = matches!(table, ContextTableId::Qpc | ContextTableId::Cqc);
        if cached {
            if let Some(bytes) = self.context_cache.lookup(address, L::SIZE) {
                context.bytes_mut().copy_from_slice(bytes);
                return Ok((context, address));
            }
        }
        self.dma_read(address, context.bytes_mut())
            .map_err(|e| Rejection::dma("context", address, e))?;
        if cached {
            if self.context_cache.is_full() {
                // Recorded QP progress stays recorded: it is applied through this cache.
                self.write_back_dirty_contexts();
                self.context_cache.clear();
            }
            self.context_cache.fill(address, context.bytes());
        }
        Ok((context, address))
    }

    /// Writes a context: into the context cache when it holds the context and host
    /// memory has taken a write there before, else to host memory.
    pub(crate) fn write_context<L: Layout>(&mut self, address: u64, context: &L) -> Result<(), Rejection> {
        // The cache is empty while bus mastering is off (see `config_write`).
        if self.context_cache.absorb(address, context.bytes()) {
            return Ok(());
        }
        self.dma_write(address, context.bytes())
            .map_err(|e| Rejection::dma("context", address, e))?;
        self.context_cache.written_through(address, context.bytes());
        Ok(())
    }

    /// Applies the QPs' recorded progress to their QPCs, then writes the cached contexts
    /// that are newer than host memory back to it: before a
    /// firmware command or mailbox runs and before it completes, before a configuration
    /// write (which may end bus mastering), before a function reset, and when the cache
    /// is full. A write-back that fails is counted as a DMA error.
    ///
    /// Public so that tests and fuzzers can read every QPC and CQC from host memory as the
    /// device sees it without issuing a command (which does this first).
    pub fn write_back_contexts(&mut self) {
        self.apply_all_qpc_progress();
        self.write_back_dirty_contexts();
    }

    /// Writes the cached contexts back ([`Self::write_back_contexts`]) and forgets them
    /// with the CQ buffer records that lean on them.
    fn drop_context_cache(&mut self) {
        self.write_back_contexts();
        self.context_cache.clear();
        self.cq_buffers.clear();
    }

    /// Writes the dirty cached contexts back to host memory.
    fn write_back_dirty_contexts(&mut self) {
        if !self.context_cache.has_dirty() {
            return;
        }
        for (address, bytes) in self.context_cache.take_dirty() {
            let _ = self.dma_write(address, &bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::RecordingSink;
    use crate::memory::PagedMemory;

    fn read(device: &mut Device, offset: u64) -> u32 {
        let mut bytes = [0u8; 4];
        device.bar_read(regs::CONTROL_BAR, offset, &mut bytes);
        u32::from_le_bytes(bytes)
    }

    #[test]
    fn a_fork_starts_where_the_device_is_and_then_goes_its_own_way() {
        let memory: Arc<dyn HostMemory> = Arc::new(PagedMemory::new());
        let mut device = Device::new(DeviceConfig::default(), memory, Box::new(RecordingSink::new()));
        let command = rnic_firmware_if::pci::COMMAND_MEMORY_SPACE;
        device.config_write(rnic_firmware_if::pci::offset::COMMAND, &command.to_le_bytes());
        device.bar_write(regs::CONTROL_BAR, regs::CSQ_BASE_LOW, &0x1000u32.to_le_bytes());
        // A reset in progress: the fork has the pending event and the register state.
        device.bar_write(regs::CONTROL_BAR, regs::FUNCTION_RESET, &1u32.to_le_bytes());
        device.advance_to(Picoseconds(1));
        let mut fork = device.fork(Box::new(RecordingSink::new()));
        assert_eq!(fork.now(), device.now());
        assert_eq!(fork.next_event_time(), device.next_event_time());
        assert_eq!(
            read(&mut fork, regs::FUNCTION_STATUS),
            read(&mut device, regs::FUNCTION_STATUS)
        );
        let ready = fork.next_event_time().expect("the reset completes later");
        fork.advance_to(ready);
        fork.bar_write(regs::CONTROL_BAR, regs::CSQ_BASE_LOW, &0x2000u32.to_le_bytes());
        assert_eq!(read(&mut fork, regs::FUNCTION_STATUS), regs::STATUS_READY);
        assert_eq!(read(&mut fork, regs::CSQ_BASE_LOW), 0x2000);
        // The original is still mid-reset, at its own time, with its own registers.
        assert_eq!(read(&mut device, regs::FUNCTION_STATUS), 0);
        assert_eq!(device.now(), Picoseconds(1));
        device.advance_to(ready);
        assert_eq!(read(&mut device, regs::FUNCTION_STATUS), regs::STATUS_READY);
        assert_eq!(
            read(&mut device, regs::CSQ_BASE_LOW),
            0,
            "the reset cleared it; the fork's write stayed there"
        );
    }
}
