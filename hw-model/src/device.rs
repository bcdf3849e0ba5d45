//! The device: BAR decode, control registers, DMA gate, event loop.
//!
//! A backend (the in-process embedded backend, the vfio-user server) owns a [`Device`]
//! and drives it with configuration-space and BAR accesses and with
//! [`Device::advance_to`], which runs every event due by a virtual instant. Nothing inside
//! runs by itself: no threads, no wall clock.

use std::sync::Arc;

use rnic_firmware_if::regs;

use crate::bus::Bus;
use crate::command::Rejection;
use crate::config::DeviceConfig;
use crate::cq::{CompletionQueues, CqError};
use crate::diagnostics::{Diagnostic, DiagnosticLog, Source};
use crate::doorbell::{DoorbellRequest, Doorbells};
use crate::eq::{EqKind, EventQueues};
use crate::firmware::{Firmware, GidTableEntry, ObjectCommand, Timer as FirmwareTimer};
use crate::hem::{ContextTableAttributes, Contexts, HemError, QpcProgress};
use crate::interrupt::InterruptSink;
use crate::memory::{HostMemory, MemoryError};
use crate::mpt::{MemoryProtection, MrAccess, MrAccessError, MrTranslation};
use crate::mtt::{DmaFault, Mtr, MttError, TranslationCache};
use crate::pci::{BarDescriptor, ConfigSpace};
use crate::port::{Port as NetworkPort, PortAddresses};
use crate::probe::{DoorbellTarget, Observer, Port, Probes, Transaction};
use crate::qp::{DoorbellOutcome, QueuePairs, WorkQueue};
use crate::srq::{SharedReceiveQueues, SrqWqe};
use crate::time::{Picoseconds, Scheduler};
use crate::timing::TimingModel;
use crate::transport::{Engine, Timer as TransportTimer, Transport, TransportCounters};
use crate::wire::{self, Icrc};
use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{Cqc, Eqc, Mpt, QpState, Qpc, Srqc};
use rnic_firmware_if::cqe::Cqe;
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::{BtCommand, ContextTable as ContextTableId, MailboxCompletion};

/// The services of the device `$device` (a place: borrow it as a block's `Io`).
macro_rules! services {
    ($device:ident) => {
        $device.transport.io.qp.objects.services
    };
}

/// What the object blocks of the device `$device` are bound to (a place).
macro_rules! objects {
    ($device:ident) => {
        $device.transport.io.qp.objects
    };
}

/// What the QP block of the device `$device` is bound to (a place).
macro_rules! qp_wiring {
    ($device:ident) => {
        $device.transport.io.qp
    };
}

/// What the firmware of the device `$device` is bound to, borrowed field by field (the
/// firmware's wiring also reaches the top's registers, so it is not one place).
macro_rules! firmware_wiring {
    ($device:ident) => {
        FirmwareWiring {
            services: &mut $device.transport.io.qp.objects.services,
            contexts: &mut $device.transport.io.qp.objects.contexts,
            eqs: &mut $device.transport.io.qp.objects.eqs,
            cqs: &mut $device.transport.io.qp.cqs,
            mpt: &mut $device.transport.io.mpt,
            port: &mut $device.transport.io.port,
            registers: &mut $device.registers,
        }
    };
}

/// Something the device will do at a virtual instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A firmware timer: the next command, the next mailbox.
    Firmware(crate::firmware::Timer),
    /// A function reset finishes.
    ResetDone,
    /// An EQ's coalescing period expired: raise its interrupt if entries are pending.
    Eq(crate::eq::Timer),
    /// A transport timer: the port's transmit and receive pipelines, a QP's ACK or RNR
    /// timer.
    Transport(TransportTimer),
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

/// Control registers of BAR0 that are not part of a block.
#[derive(Debug, Clone, Default)]
pub(crate) struct ControlRegisters {
    /// A function reset is in progress.
    pub resetting: bool,
    /// The firmware hit a fatal error (FUNCTION_STATUS.FATAL).
    pub fatal: bool,
}

/// One rnic device (one PCI function).
pub struct Device {
    pub(crate) config: DeviceConfig,
    pub(crate) config_space: ConfigSpace,
    pub(crate) registers: ControlRegisters,
    pub(crate) firmware: Firmware,
    /// The doorbell decoder (BAR2).
    pub(crate) doorbells: Doorbells,
    /// The RoCEv2 transport engines, bound to their wiring: every block below the
    /// transport and the services, grouped by what each block is wired to (see
    /// [`TransportWiring`]), so that a block's `Io` is one reference and the transport's
    /// state and ports are reached through one.
    pub(crate) transport: Engine<TransportWiring>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("now", &services!(self).scheduler.now())
            .field("counters", &self.counters())
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
        let mut bus = Bus::new(memory);
        bus.set_master(config_space.bus_master_enabled());
        let mut eqs = EventQueues::new(&config.caps, vectors, interrupts);
        eqs.set_msix_control(config_space.msix_enabled(), config_space.msix_function_masked());
        let pages = config.doorbell_pages.max(1) as usize;
        let services = Services {
            translation: TranslationCache::default(),
            bus,
            timing: TimingModel::new(config.timing),
            scheduler: Scheduler::new(),
            diagnostics: DiagnosticLog::default(),
            probes: Probes::default(),
        };
        let objects = Objects {
            services,
            contexts: Contexts::new(&config),
            eqs,
        };
        let qp = QpWiring {
            objects,
            cqs: CompletionQueues::new(&config.caps),
            srqs: SharedReceiveQueues::new(&config.caps),
        };
        Self {
            config_space,
            registers: ControlRegisters::default(),
            firmware: Firmware::new(&config),
            doorbells: Doorbells::new(pages)
                .with_direct_wqe(config.caps.flags.contains(rnic_firmware_if::caps::CapFlags::DIRECT_WQE)),
            transport: Engine::new(
                Transport::new(&config.caps),
                TransportWiring {
                    qp,
                    mpt: MemoryProtection::new(config.caps.num_mtpts, config.caps.num_pds),
                    qps: QueuePairs::new(&config.caps),
                    port: NetworkPort::new(config.caps.max_gids as usize, config.mac_address),
                },
            ),
            config,
        }
    }

    /// A copy of this device in its current state — registers, firmware, caches, engines,
    /// pending events, virtual time — that DMAs into the same host memory and signals
    /// `interrupts`. Host memory is not the device's, so it is not copied: a caller that
    /// wants to return to this moment restores it. Fuzzers bring a device up once and
    /// fork it for each input instead of bringing it up again. Observers stay with the
    /// original.
    pub fn fork(&self, interrupts: Box<dyn InterruptSink>) -> Device {
        let services = &objects!(self).services;
        let services = Services {
            translation: services.translation.clone(),
            bus: services.bus.fork(),
            timing: services.timing.clone(),
            scheduler: services.scheduler.clone(),
            diagnostics: services.diagnostics.clone(),
            probes: Probes::default(),
        };
        let objects = Objects {
            services,
            contexts: objects!(self).contexts.clone(),
            eqs: objects!(self).eqs.fork(interrupts),
        };
        let qp = QpWiring {
            objects,
            cqs: qp_wiring!(self).cqs.clone(),
            srqs: qp_wiring!(self).srqs.clone(),
        };
        Device {
            config: self.config.clone(),
            config_space: self.config_space.clone(),
            registers: self.registers.clone(),
            firmware: self.firmware.clone(),
            doorbells: self.doorbells.clone(),
            transport: Engine::new(
                self.transport.transport.clone(),
                TransportWiring {
                    qp,
                    mpt: self.transport.io.mpt.clone(),
                    qps: self.transport.io.qps.clone(),
                    port: self.transport.io.port.clone(),
                },
            ),
        }
    }

    /// The configuration this device was built with.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Current virtual time.
    #[inline]
    pub fn now(&self) -> Picoseconds {
        services!(self).scheduler.now()
    }

    /// Time of the next pending event, if any.
    #[inline]
    pub fn next_event_time(&self) -> Option<Picoseconds> {
        services!(self).scheduler.next_event_time()
    }

    /// Runs every event due at or before `t`, then moves virtual time to `t`.
    #[inline]
    pub fn advance_to(&mut self, t: Picoseconds) {
        // Most calls (the fabric steps every device) find nothing due: only the clock
        // moves, without the call into the event loop.
        if services!(self)
            .scheduler
            .next_event_time()
            .is_some_and(|next| next <= t)
        {
            self.run_due_events(t);
        }
        services!(self).scheduler.advance_to(t);
        services!(self).bus.set_now(services!(self).scheduler.now());
    }

    fn run_due_events(&mut self, t: Picoseconds) {
        while let Some(event) = services!(self).scheduler.pop_due(t) {
            services!(self).bus.set_now(services!(self).scheduler.now());
            self.run_event(event);
        }
    }

    /// Runs events until none is pending or virtual time would pass `limit`; returns the
    /// time reached.
    pub fn run_until_idle(&mut self, limit: Picoseconds) -> Picoseconds {
        while let Some(next) = services!(self).scheduler.next_event_time() {
            if next > limit {
                break;
            }
            self.advance_to(next);
        }
        self.now()
    }

    fn run_event(&mut self, event: Event) {
        match event {
            Event::Firmware(FirmwareTimer::CommandQueue) => {
                self.firmware.process_command_queue(&mut firmware_wiring!(self));
            }
            Event::Firmware(FirmwareTimer::MailboxComplete) => self.complete_mailbox(),
            Event::ResetDone => {
                self.registers.resetting = false;
            }
            Event::Eq(timer) => {
                objects!(self).eqs.coalesce_timer(&mut services!(self), timer);
            }
            Event::Transport(timer) => self.transport.timer(timer),
        }
    }

    /// The timing model: parameters, per-stage totals, cache statistics.
    pub fn timing(&self) -> &TimingModel {
        &services!(self).timing
    }

    /// The timing model, to reset its totals.
    pub fn timing_mut(&mut self) -> &mut TimingModel {
        &mut services!(self).timing
    }

    /// Counters since power-on: the sum of what each block counted.
    pub fn counters(&self) -> Counters {
        let eq = objects!(self).eqs.counters();
        let cq = qp_wiring!(self).cqs.counters();
        let srq = qp_wiring!(self).srqs.counters();
        let qp = self.transport.io.qps.counters();
        Counters {
            doorbells: eq.doorbells + cq.doorbells + srq.doorbells + qp.doorbells,
            doorbells_dropped: self.doorbells.dropped()
                + eq.doorbells_dropped
                + cq.doorbells_dropped
                + srq.doorbells_dropped
                + qp.doorbells_dropped,
            commands: self.firmware.counters().commands,
            mailbox_commands: self.firmware.counters().mailbox_commands,
            cqes: cq.cqes,
            eqes: eq.eqes,
            interrupts: eq.interrupts,
            dma_errors: services!(self).bus.errors(),
        }
    }

    /// CQEs written since power-on: [`Device::counters`]'s `cqes` alone, cheap enough to
    /// ask after every step of the fabric.
    #[inline]
    pub fn cqes_written(&self) -> u64 {
        qp_wiring!(self).cqs.counters().cqes
    }

    /// Puts `observer` on `port` (None takes it off) and returns the observer it replaces:
    /// from then on it sees every transaction crossing that port (see [`crate::probe`]).
    pub fn attach_observer(&mut self, port: Port, observer: Option<Box<dyn Observer>>) -> Option<Box<dyn Observer>> {
        match port {
            Port::Bus => services!(self).bus.probe_mut().attach(observer),
            port => services!(self).probes.slot(port).attach(observer),
        }
    }

    /// The diagnostic log.
    pub fn diagnostics(&self) -> &DiagnosticLog {
        &services!(self).diagnostics
    }

    /// The diagnostic log, to set its policy or pass it the owner's time.
    pub fn diagnostics_mut(&mut self) -> &mut DiagnosticLog {
        &mut services!(self).diagnostics
    }

    /// Takes the kept diagnostics out of the log.
    pub fn take_diagnostics(&mut self) -> Vec<Diagnostic> {
        services!(self).diagnostics.drain()
    }

    /// Number of valid objects per context table (QP, MPT, CQ, SRQ), read from host
    /// memory; used by leak tests and `query` tools.
    pub fn context_table_slots_in_use(&self) -> [usize; 4] {
        objects!(self).contexts.slots_in_use()
    }

    pub(crate) fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        services!(self).diagnostics.record(Diagnostic {
            time_ps: services!(self).scheduler.now().0,
            source,
            object: object.into(),
            field,
            value,
            expected: expected.into(),
        });
    }

    // ---- DMA gate -------------------------------------------------------------------

    // ---- configuration space --------------------------------------------------------

    /// Reads configuration space.
    pub fn config_read(&mut self, offset: usize, data: &mut [u8]) {
        self.config_space.read(offset, data);
    }

    /// Writes configuration space.
    pub fn config_write(&mut self, offset: usize, data: &[u8]) {
        // The write may turn bus mastering off: the cached contexts go back first.
        self.drop_context_cache();
        self.config_space.write(offset, data);
        services!(self).bus.set_master(self.config_space.bus_master_enabled());
        objects!(self).eqs.set_msix_control(
            self.config_space.msix_enabled(),
            self.config_space.msix_function_masked(),
        );
    }

    // ---- BARs -----------------------------------------------------------------------

    /// Reads `data.len()` bytes from `bar` at `offset`. Unmapped or disabled regions read
    /// as all ones, as an unsupported PCI request would.
    pub fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) {
        // What PCI gives for a read nothing claims: all ones (and a diagnostic).
        data.fill(0xFF);
        if !self.config_space.memory_enabled() {
            self.diagnose(
                Source::Pci,
                format!("BAR{bar}"),
                "COMMAND.MEMORY_SPACE",
                0,
                "memory decoding enabled before BAR reads (reads all ones)",
            );
            return;
        }
        match bar {
            regs::CONTROL_BAR => self.control_read(offset, data),
            // Doorbells are write-only; their pages read as zero, like hns's.
            regs::DOORBELL_BAR => data.fill(0),
            regs::MSIX_BAR => objects!(self).eqs.read_msix(offset, data),
            _ => self.diagnose(
                Source::Pci,
                format!("BAR{bar}"),
                "BAR index",
                bar as u64,
                "BAR 0, 2 or 4 (reads all ones)",
            ),
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
            regs::MSIX_BAR => objects!(self).eqs.write_msix(offset, data),
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
            regs::CSQ_BASE_LOW => self.firmware.command_queue().base as u32,
            regs::CSQ_BASE_HIGH => (self.firmware.command_queue().base >> 32) as u32,
            regs::CSQ_DEPTH => self.firmware.command_queue().depth_register,
            regs::CSQ_PRODUCER_INDEX => self.firmware.command_queue().producer_index,
            regs::CSQ_CONSUMER_INDEX => self.firmware.command_queue().consumer_index,
            regs::ABNORMAL_INT_CONFIG | regs::ABNORMAL_INT_STATUS | regs::ABNORMAL_INT_ENABLE => {
                objects!(self).eqs.read_abnormal(offset)
            }
            o if (regs::EVENT_INT_ENABLE_BASE..regs::event_int_enable(regs::MAX_EVENT_INT_ENABLES as u32))
                .contains(&o)
                && o % 4 == 0 =>
            {
                let eqn = ((o - regs::EVENT_INT_ENABLE_BASE) / 4) as u32;
                objects!(self).eqs.read_interrupt_enable(eqn)
            }
            _ => {
                self.diagnose(
                    Source::Register,
                    format!("BAR0+{offset:#x}"),
                    "register offset",
                    offset,
                    "a register of docs/register-map.md (others read all ones)",
                );
                u32::MAX
            }
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
            | regs::CSQ_CONSUMER_INDEX => {
                self.firmware
                    .command_queue_register_write(&mut firmware_wiring!(self), offset, value)
            }
            regs::ABNORMAL_INT_CONFIG | regs::ABNORMAL_INT_STATUS | regs::ABNORMAL_INT_ENABLE => {
                objects!(self).eqs.write_abnormal(offset, value)
            }
            o if (regs::EVENT_INT_ENABLE_BASE..regs::event_int_enable(regs::MAX_EVENT_INT_ENABLES as u32))
                .contains(&o)
                && o % 4 == 0 =>
            {
                let eqn = ((o - regs::EVENT_INT_ENABLE_BASE) / 4) as u32;
                objects!(self)
                    .eqs
                    .write_interrupt_enable(&mut services!(self), eqn, value);
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
        services!(self).scheduler.clear();
        self.firmware.reset();
        objects!(self).contexts.clear_tables();
        self.transport.io.mpt.forget();
        services!(self).translation.clear();
        objects!(self).eqs.reset();
        self.transport.transport = Transport::new(&self.config.caps);
        self.transport.io.port = NetworkPort::new(self.config.caps.max_gids as usize, self.config.mac_address);
        services!(self).timing = TimingModel::new(self.config.timing);
        self.registers = ControlRegisters {
            resetting: true,
            ..Default::default()
        };
        self.doorbells.reset();
        let delay = Picoseconds(self.config.timing.reset_ps);
        services!(self).scheduler.schedule_in(delay, Event::ResetDone);
    }

    /// Doorbell BAR write: the doorbell block decodes it into a request for the block
    /// that owns the named queue.
    fn doorbell_page_write(&mut self, offset: u64, data: &[u8]) {
        let Some(request) = self.doorbells.write(&mut services!(self), offset, data) else {
            return;
        };
        services!(self)
            .probes
            .observe(Port::Doorbell, services!(self).scheduler.now(), || {
                let (target, number, value) = match request {
                    DoorbellRequest::QueuePair {
                        qpn,
                        queue: WorkQueue::Send,
                        producer_index,
                        ..
                    } => (DoorbellTarget::SendQueue, qpn, u64::from(producer_index)),
                    DoorbellRequest::QueuePair {
                        qpn,
                        queue: WorkQueue::Receive,
                        producer_index,
                        ..
                    } => (DoorbellTarget::ReceiveQueue, qpn, u64::from(producer_index)),
                    DoorbellRequest::SharedReceiveQueue { srqn, producer_index } => {
                        (DoorbellTarget::SharedReceiveQueue, srqn, u64::from(producer_index))
                    }
                    DoorbellRequest::CompletionQueue { cqn, word } => (DoorbellTarget::CompletionQueue, cqn, word),
                    DoorbellRequest::EventQueue { word } => (DoorbellTarget::EventQueue, 0, word),
                };
                Transaction::Doorbell { target, number, value }
            });
        match request {
            DoorbellRequest::QueuePair {
                qpn,
                queue,
                producer_index,
                direct_wqe,
            } => self.qp_doorbell(qpn, queue, producer_index, direct_wqe),
            DoorbellRequest::SharedReceiveQueue { srqn, producer_index } => self.srq_doorbell(srqn, producer_index),
            DoorbellRequest::CompletionQueue { cqn, word } => self.cq_doorbell(cqn, word),
            DoorbellRequest::EventQueue { word } => self.eq_doorbell(word),
        }
    }
}

// ---- context access (host memory is the truth) ---------------------------------------

impl Device {
    /// Applies the QPs' recorded progress to their QPCs and writes the cached contexts
    /// that are newer than host memory back to it (see [`Contexts::write_back`]).
    ///
    /// Public so that tests and fuzzers can read every QPC and CQC from host memory as the
    /// device sees it without issuing a command (which does this first).
    pub fn write_back_contexts(&mut self) {
        objects!(self).contexts.write_back(&mut services!(self).bus);
    }

    /// Bus address of object `index` of context table `table`, found as the device finds
    /// it (through the table's BT pages, or the address it remembers): for a testbench's
    /// backdoor reads of contexts. None when the object has no slot or the walk fails.
    pub fn context_address(&mut self, table: ContextTableId, index: u32) -> Option<u64> {
        objects!(self).contexts.address(&services!(self).bus, table, index).ok()
    }

    /// Writes the cached contexts back and forgets them with the CQ buffer records that
    /// lean on them.
    fn drop_context_cache(&mut self) {
        objects!(self).contexts.drop_cache(&mut services!(self).bus);
        qp_wiring!(self).cqs.forget_buffers();
    }
}

// ---- requests routed to the blocks ----------------------------------------------------------

impl Device {
    /// CREATE_MPT.
    pub(crate) fn create_mpt(&mut self, index: u32, mpt: Mpt) -> Result<(), Rejection> {
        self.transport.io.mpt.create(&mut objects!(self), index, mpt)
    }

    /// DESTROY_MPT.
    pub(crate) fn destroy_mpt(&mut self, index: u32) -> Result<(), Rejection> {
        self.transport.io.mpt.destroy(&mut objects!(self), index)
    }

    /// QUERY_MPT.
    pub(crate) fn query_mpt(&mut self, index: u32) -> Result<Mpt, Rejection> {
        self.transport.io.mpt.query(&mut objects!(self), index)
    }

    /// Checks an access of `length` bytes at IOVA `address` through `key` for a QP in
    /// `pd` needing `needed`, and returns how to translate it (the memory-protection
    /// block's access check).
    #[inline]
    pub fn check_memory_access(
        &mut self,
        key: u32,
        pd: u32,
        address: u64,
        length: u64,
        needed: MrAccess,
    ) -> Result<MrTranslation, MrAccessError> {
        self.transport
            .io
            .mpt
            .check_access(&mut objects!(self), key, pd, address, length, needed)
    }
}

impl Device {
    /// CREATE_CEQC / CREATE_AEQC.
    pub(crate) fn create_eq(&mut self, eqn: u32, kind: EqKind, eqc: Eqc) -> Result<(), Rejection> {
        objects!(self).eqs.create(eqn, kind, eqc)
    }

    /// MODIFY_CEQC / MODIFY_AEQC.
    pub(crate) fn modify_eq(&mut self, eqn: u32, kind: EqKind, eqc: Eqc, mask: Eqc) -> Result<(), Rejection> {
        objects!(self).eqs.modify(&mut services!(self), eqn, kind, eqc, mask)
    }

    /// QUERY_CEQC / QUERY_AEQC.
    pub(crate) fn query_eq(&mut self, eqn: u32, kind: EqKind) -> Result<Eqc, Rejection> {
        objects!(self).eqs.query(eqn, kind)
    }

    /// DESTROY_CEQC / DESTROY_AEQC.
    pub(crate) fn destroy_eq(&mut self, eqn: u32, kind: EqKind) -> Result<(), Rejection> {
        objects!(self).eqs.destroy(eqn, kind)
    }

    /// A CEQE for CQ `cqn` on CEQ `ceqn`.
    #[cfg(test)]
    pub(crate) fn post_completion_event(&mut self, ceqn: u32, cqn: u32) {
        objects!(self)
            .eqs
            .post_completion_event(&mut services!(self), ceqn, cqn);
    }

    /// An AEQE.
    #[cfg(test)]
    pub(crate) fn post_async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        objects!(self)
            .eqs
            .post_async_event(&mut services!(self), event, sub_type, queue_number);
    }

    /// A mailbox-completion AEQE.
    #[cfg(test)]
    pub(crate) fn post_mailbox_event(&mut self, token: u16, status: u8, out_param: u64) {
        objects!(self)
            .eqs
            .post_mailbox_event(&mut services!(self), token, status, out_param);
    }

    /// The EQ doorbell.
    pub(crate) fn eq_doorbell(&mut self, word: u64) {
        objects!(self).eqs.doorbell(&mut services!(self), word);
    }

    /// MSI-X vector of EQ `eqn`.
    #[cfg(test)]
    pub(crate) fn eq_vector(&self, eqn: u32) -> u16 {
        objects!(self).eqs.vector(eqn)
    }

    /// Number of created EQs (for the device's resource accounting and leak checks).
    pub fn active_eq_count(&self) -> usize {
        objects!(self).eqs.active_count()
    }
}

impl Device {
    /// CREATE_CQC.
    pub(crate) fn create_cq(&mut self, cqn: u32, cqc: Cqc) -> Result<(), Rejection> {
        qp_wiring!(self).cqs.create(&mut objects!(self), cqn, cqc)
    }

    /// MODIFY_CQC.
    pub(crate) fn modify_cq(&mut self, cqn: u32, cqc: Cqc, mask: Cqc) -> Result<(), Rejection> {
        qp_wiring!(self).cqs.modify(&mut objects!(self), cqn, cqc, mask)
    }

    /// QUERY_CQC.
    pub(crate) fn query_cq(&mut self, cqn: u32) -> Result<Cqc, Rejection> {
        qp_wiring!(self).cqs.query(&mut objects!(self), cqn)
    }

    /// DESTROY_CQC.
    pub(crate) fn destroy_cq(&mut self, cqn: u32) -> Result<(), Rejection> {
        qp_wiring!(self).cqs.destroy(&mut objects!(self), cqn)
    }

    /// Whether CQ `cqn` exists and is valid.
    #[cfg(test)]
    pub(crate) fn cq_is_valid(&mut self, cqn: u32) -> bool {
        qp_wiring!(self).cqs.is_valid(&mut objects!(self), cqn)
    }

    /// A CQ doorbell (set CI, arm).
    pub(crate) fn cq_doorbell(&mut self, cqn: u32, word: u64) {
        qp_wiring!(self).cqs.doorbell(&mut objects!(self), cqn, word);
    }

    /// A CQE for CQ `cqn`.
    #[cfg(test)]
    pub(crate) fn post_cqe(&mut self, cqn: u32, cqe: Cqe, solicited: bool) -> Result<(), CqError> {
        qp_wiring!(self).cqs.post_cqe(&mut objects!(self), cqn, cqe, solicited)
    }
}

impl Device {
    /// CREATE_SRQ.
    pub(crate) fn create_srq(&mut self, srqn: u32, srqc: Srqc) -> Result<(), Rejection> {
        qp_wiring!(self).srqs.create(&mut objects!(self), srqn, srqc)
    }

    /// MODIFY_SRQC.
    pub(crate) fn modify_srq(&mut self, srqn: u32, srqc: Srqc, mask: Srqc) -> Result<(), Rejection> {
        qp_wiring!(self).srqs.modify(&mut objects!(self), srqn, srqc, mask)
    }

    /// QUERY_SRQC.
    pub(crate) fn query_srq(&mut self, srqn: u32) -> Result<Srqc, Rejection> {
        qp_wiring!(self).srqs.query(&mut objects!(self), srqn)
    }

    /// DESTROY_SRQ.
    pub(crate) fn destroy_srq(&mut self, srqn: u32) -> Result<(), Rejection> {
        qp_wiring!(self).srqs.destroy(&mut objects!(self), srqn)
    }

    /// The SRQ doorbell.
    pub(crate) fn srq_doorbell(&mut self, srqn: u32, producer_index: u16) {
        qp_wiring!(self)
            .srqs
            .doorbell(&mut objects!(self), srqn, producer_index);
    }
}

impl Device {
    /// MODIFY_QPC: the QP block checks and writes the context; the transport learns of
    /// the transition; a move to ERR is then flushed (after the transport dropped its
    /// WQEs, so the flush covers them too).
    pub(crate) fn modify_qp(&mut self, qpn: u32, context: Qpc, mask: Qpc) -> Result<(), Rejection> {
        let transition = self
            .transport
            .io
            .qps
            .modify(&mut qp_wiring!(self), qpn, context, mask)?;
        services!(self)
            .probes
            .observe(Port::QpState, services!(self).scheduler.now(), || {
                Transaction::QpState {
                    qpn,
                    from: transition.from,
                    to: transition.to,
                }
            });
        self.transport
            .qp_modified(qpn, transition.from, transition.to, &transition.qpc);
        if transition.to == QpState::Err {
            self.transport
                .io
                .qps
                .flush(&mut qp_wiring!(self), qpn, transition.address, transition.qpc);
        }
        Ok(())
    }

    /// QUERY_QPC.
    pub(crate) fn query_qp(&mut self, qpn: u32) -> Result<Qpc, Rejection> {
        self.transport.io.qps.query(&mut qp_wiring!(self), qpn)
    }

    /// An SQ or RQ doorbell: the QP block checks it; what it moved goes to the transport
    /// (or, for a QP in ERR, is flushed). `direct_wqe`: the WQE an SQ doorbell carried.
    pub(crate) fn qp_doorbell(
        &mut self,
        qpn: u32,
        queue: WorkQueue,
        producer_index: u16,
        direct_wqe: Option<[u8; rnic_firmware_if::wqe::SQ_WQE_SIZE]>,
    ) {
        match self
            .transport
            .io
            .qps
            .doorbell(&mut qp_wiring!(self), qpn, queue, producer_index)
        {
            DoorbellOutcome::Done => {}
            DoorbellOutcome::Flush { address, qpc } => {
                self.transport.io.qps.flush(&mut qp_wiring!(self), qpn, address, qpc)
            }
            DoorbellOutcome::SendQueue(producer_index) => self.transport.sq_doorbell(qpn, producer_index, direct_wqe),
            DoorbellOutcome::ReceiveQueue(producer_index) => self.transport.rq_doorbell(qpn, producer_index),
        }
    }
}

impl Device {
    /// The mailbox at the head of the firmware's queue is due: the firmware reads it, the
    /// top executes its object command on the block that owns the object, the firmware
    /// completes it.
    pub(crate) fn complete_mailbox(&mut self) {
        let Some((post, opcode, command)) = self.firmware.start_mailbox(&mut firmware_wiring!(self)) else {
            return;
        };
        let result = self.object_command(command);
        services!(self)
            .probes
            .observe(Port::Mailbox, services!(self).scheduler.now(), || {
                Transaction::Mailbox {
                    opcode,
                    tag: post.tag(),
                    status: match &result {
                        Ok(_) => MailboxCompletion::Success,
                        Err(rejection) => rejection.status,
                    },
                }
            });
        self.firmware
            .finish_mailbox(&mut firmware_wiring!(self), post, opcode, result);
    }

    /// Routes a mailbox's object command to its block; a query's answer as bytes.
    fn object_command(&mut self, command: ObjectCommand) -> Result<Option<Vec<u8>>, Rejection> {
        fn answer<L: Layout>(context: L) -> Option<Vec<u8>> {
            Some(context.bytes().to_vec())
        }
        match command {
            ObjectCommand::ModifyQp { qpn, context, mask } => self.modify_qp(qpn, *context, *mask).map(|()| None),
            ObjectCommand::QueryQp { qpn } => self.query_qp(qpn).map(answer),
            ObjectCommand::CreateMpt { index, mpt } => self.create_mpt(index, mpt).map(|()| None),
            ObjectCommand::DestroyMpt { index } => self.destroy_mpt(index).map(|()| None),
            ObjectCommand::QueryMpt { index } => self.query_mpt(index).map(answer),
            ObjectCommand::CreateCq { cqn, cqc } => self.create_cq(cqn, cqc).map(|()| None),
            ObjectCommand::ModifyCq { cqn, context, mask } => self.modify_cq(cqn, context, mask).map(|()| None),
            ObjectCommand::QueryCq { cqn } => self.query_cq(cqn).map(answer),
            ObjectCommand::DestroyCq { cqn } => self.destroy_cq(cqn).map(|()| None),
            ObjectCommand::CreateSrq { srqn, srqc } => self.create_srq(srqn, srqc).map(|()| None),
            ObjectCommand::ModifySrq { srqn, context, mask } => self.modify_srq(srqn, context, mask).map(|()| None),
            ObjectCommand::QuerySrq { srqn } => self.query_srq(srqn).map(answer),
            ObjectCommand::DestroySrq { srqn } => self.destroy_srq(srqn).map(|()| None),
            ObjectCommand::CreateEq { eqn, kind, eqc } => self.create_eq(eqn, kind, eqc).map(|()| None),
            ObjectCommand::ModifyEq {
                eqn,
                kind,
                context,
                mask,
            } => self.modify_eq(eqn, kind, context, mask).map(|()| None),
            ObjectCommand::QueryEq { eqn, kind } => self.query_eq(eqn, kind).map(answer),
            ObjectCommand::DestroyEq { eqn, kind } => self.destroy_eq(eqn, kind).map(|()| None),
        }
    }

    /// The next Ethernet frame (without FCS) the device has transmitted, if any, with its
    /// ICRC: for a network backend, a capture, anyone outside the in-process link.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        let (mut frame, icrc) = self.poll_transmit_offloaded()?;
        if icrc == Icrc::Offloaded {
            wire::fill_icrc(&mut frame);
        }
        Some(frame)
    }

    /// The next frame the device has transmitted, for the in-process link: its ICRC may be
    /// offloaded ([`Icrc::Offloaded`], the field zero), and must then be filled in
    /// ([`wire::fill_icrc`]) before anyone sees the frame or alters it; a receiver on the
    /// link may trust it ([`Device::receive_frame_offloaded`]). Frames an observer on the
    /// network port saw have their ICRC.
    #[inline]
    pub fn poll_transmit_offloaded(&mut self) -> Option<(Vec<u8>, Icrc)> {
        let mut frame = self.transport.io.port.poll_transmit()?;
        let mut icrc = Icrc::Offloaded;
        let probe = services!(self).probes.slot(Port::Network);
        if probe.is_attached() {
            wire::fill_icrc(&mut frame);
            icrc = Icrc::Computed;
            let now = services!(self).scheduler.now();
            services!(self)
                .probes
                .observe(Port::Network, now, || Transaction::FrameOut(&frame));
        }
        Some((frame, icrc))
    }

    /// Delivers an Ethernet frame (without FCS) to the device's port now. The engines
    /// process it when it has been through the receive pipeline (at once with zero
    /// receive-side costs, e.g. the `ideal` preset).
    pub fn receive_frame(&mut self, frame: &[u8]) {
        services!(self)
            .probes
            .observe(Port::Network, services!(self).scheduler.now(), || {
                Transaction::FrameIn(frame)
            });
        self.transport.receive_frame(frame);
    }

    /// [`receive_frame`](Self::receive_frame) of a frame in a buffer the device may keep:
    /// a frame that waits for the receive pipeline stays in it (no copy). Returns a buffer
    /// for the caller to reuse: this one, or a spare from the device's pool.
    pub fn receive_frame_owned(&mut self, frame: Vec<u8>) -> Vec<u8> {
        self.receive_frame_offloaded(frame, Icrc::Computed)
    }

    /// [`receive_frame_owned`](Self::receive_frame_owned) of a frame from the in-process
    /// link: an [`Icrc::Offloaded`] frame (unaltered from a device's
    /// [`poll_transmit_offloaded`](Self::poll_transmit_offloaded)) is not checked. An
    /// observer on the network port sees it with its ICRC filled in.
    pub fn receive_frame_offloaded(&mut self, mut frame: Vec<u8>, mut icrc: Icrc) -> Vec<u8> {
        let probe = services!(self).probes.slot(Port::Network);
        if probe.is_attached() {
            if icrc == Icrc::Offloaded {
                wire::fill_icrc(&mut frame);
                icrc = Icrc::Computed;
            }
            let now = services!(self).scheduler.now();
            services!(self)
                .probes
                .observe(Port::Network, now, || Transaction::FrameIn(&frame));
        }
        self.transport.receive_frame_owned(frame, icrc)
    }

    /// Returns a buffer obtained from [`Device::poll_transmit`] for reuse, so the data
    /// path does not allocate per packet.
    pub fn recycle_frame(&mut self, buffer: Vec<u8>) {
        self.transport.io.port.recycle_frame(buffer);
    }

    /// Bytes of per-QP transport state the model holds (every QP in RTR, RTS or ERR: its
    /// runtime and the queues reserved for it), for the memory-per-QP figures.
    pub fn qp_state_bytes(&self) -> usize {
        self.transport.transport.qp_state_bytes()
    }

    /// What the transport counted.
    pub fn transport_counters(&self) -> TransportCounters {
        let port = self.transport.io.port.counters();
        TransportCounters {
            frames_transmitted: port.frames_transmitted,
            frames_received: port.frames_received,
            loopback_frames: port.loopback_frames,
            transmit_overflows: port.transmit_overflows,
            ..self.transport.transport.counters()
        }
    }

    /// The GID table as configured by the driver.
    pub fn gid_table(&self) -> &[Option<GidTableEntry>] {
        self.transport.io.port.addresses().gids()
    }

    /// The source-MAC table.
    pub fn smac_table(&self) -> &[Option<[u8; 6]>] {
        self.transport.io.port.addresses().smacs()
    }
}

// ---- wiring: each block's Io bound to the blocks and services that serve it -------------------
//
// A block's `Io` trait (in its own folder) is everything it may reach; the structs here
// bind those traits to the blocks below it and to the services. They own those blocks,
// nested by floor (`TransportWiring` holds the QP block's `QpWiring`, which holds the
// object blocks' `Objects`, which holds the `Services`), so the top hands a block its
// wiring as one reference: no wiring is built per request, and a block reaches each
// service through that one reference (the 8-byte WRITE's fixed cost per message,
// docs/benchmarks.md).

/// The services every block is handed: the MTT, the bus, the timing model, the scheduler
/// (for the blocks' timers) and diagnostics. The event block needs nothing else.
pub(crate) struct Services {
    /// The MTT cache: page translations, forgotten with the MPT cache.
    pub(crate) translation: TranslationCache,
    /// Host memory behind the bus-master gate: every DMA access.
    pub(crate) bus: Bus,
    /// The timing model: parameters, caches, per-stage totals.
    pub(crate) timing: TimingModel,
    pub(crate) scheduler: Scheduler<Event>,
    pub(crate) diagnostics: DiagnosticLog,
    /// The observers of the ports the top routes (the bus has its own).
    pub(crate) probes: Probes,
}

impl Services {
    /// Shows `port`'s transaction to its observer, if it has one.
    #[inline]
    fn observe<'t>(&mut self, port: Port, describe: impl FnOnce() -> Transaction<'t>) {
        self.probes.observe(port, self.scheduler.now(), describe);
    }

    #[inline]
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        self.translation.translate_on(&self.bus, mtr, offset)
    }

    fn diagnose(&mut self, source: Source, object: String, field: &'static str, value: u64, expected: String) {
        self.diagnostics.record(Diagnostic {
            time_ps: self.scheduler.now().0,
            source,
            object,
            field,
            value,
            expected,
        });
    }
}

impl crate::doorbell::Io for Services {
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        Services::diagnose(self, source, object.into(), field, value, expected.into());
    }
}

impl crate::eq::Io for Services {
    #[inline]
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        Services::translate(self, mtr, offset)
    }

    #[inline]
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.bus.write(address, data)
    }

    fn count_dma_error(&mut self) {
        self.bus.count_error();
    }

    #[inline]
    fn timing(&mut self) -> &mut TimingModel {
        &mut self.timing
    }

    fn schedule_in(&mut self, delay: Picoseconds, timer: crate::eq::Timer) {
        self.scheduler.schedule_in(delay, Event::Eq(timer));
    }

    fn diagnose(&mut self, source: Source, object: String, field: &'static str, value: u64, expected: String) {
        Services::diagnose(self, source, object, field, value, expected);
    }
}

/// What the object blocks (memory protection, CQs, SRQs) are bound to: the services, the
/// context block and the event block their events go to.
pub(crate) struct Objects {
    pub(crate) services: Services,
    /// The context tables, their write-back QPC/CQC cache and the recorded QP progress.
    pub(crate) contexts: Contexts,
    pub(crate) eqs: EventQueues,
}

impl Objects {
    /// An AEQE request to the event block, shown to the event port's observer.
    fn post_async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        self.services.observe(Port::Event, || Transaction::AsyncEvent {
            event,
            sub_type,
            queue_number,
        });
        self.eqs
            .post_async_event(&mut self.services, event, sub_type, queue_number);
    }
}

/// What the QP block is bound to: the object blocks' wiring, and the CQ and SRQ blocks
/// it asks and feeds.
pub(crate) struct QpWiring {
    pub(crate) objects: Objects,
    /// Completion queues: CQEs, CQ doorbells, the CQ mailbox commands.
    pub(crate) cqs: CompletionQueues,
    /// Shared receive queues.
    pub(crate) srqs: SharedReceiveQueues,
}

impl crate::qp::Io for QpWiring {
    #[inline]
    fn read_qpc(&mut self, qpn: u32) -> Result<(Qpc, u64), Rejection> {
        self.objects
            .contexts
            .read(&mut self.objects.services.bus, ContextTableId::Qpc, qpn)
    }

    #[inline]
    fn write_qpc(&mut self, address: u64, qpc: &Qpc) -> Result<(), Rejection> {
        self.objects
            .contexts
            .write(&mut self.objects.services.bus, address, qpc)
    }

    #[inline]
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        self.objects.services.translate(mtr, offset)
    }

    #[inline]
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.objects.services.bus.read(address, buffer)
    }

    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.objects
            .services
            .diagnose(source, object.into(), field, value, expected.into());
    }

    fn cq_is_valid(&mut self, cqn: u32) -> bool {
        self.cqs.is_valid(&mut self.objects, cqn)
    }

    fn srq_is_valid(&mut self, srqn: u32) -> bool {
        self.srqs.is_valid(&mut self.objects, srqn)
    }

    fn post_cqe(&mut self, cqn: u32, cqe: Cqe, solicited: bool) {
        let _ = self.post_cqe_observed(cqn, cqe, solicited);
    }

    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        crate::cq::Io::async_event(&mut self.objects, event, sub_type, queue_number);
    }
}

/// What the firmware is bound to: the services, the context block (caches, tables), the
/// event block (abnormal interrupt, mailbox events, FUNC_CLEAR), the caches of the CQ and
/// MPT blocks it forgets, the port's address tables, and the top's FATAL register.
struct FirmwareWiring<'a> {
    services: &'a mut Services,
    contexts: &'a mut Contexts,
    eqs: &'a mut EventQueues,
    cqs: &'a mut CompletionQueues,
    mpt: &'a mut MemoryProtection,
    port: &'a mut NetworkPort,
    registers: &'a mut ControlRegisters,
}

impl crate::firmware::Io for FirmwareWiring<'_> {
    #[inline]
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.services.bus.read(address, buffer)
    }

    #[inline]
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.services.bus.write(address, data)
    }

    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.services
            .diagnose(source, object.into(), field, value, expected.into());
    }

    fn schedule_in(&mut self, delay: Picoseconds, timer: FirmwareTimer) {
        self.services.scheduler.schedule_in(delay, Event::Firmware(timer));
    }

    fn raise_abnormal(&mut self, bits: u32) {
        self.eqs.raise_abnormal(bits);
    }

    fn set_fatal(&mut self) {
        self.registers.fatal = true;
    }

    fn forget_caches(&mut self) {
        self.contexts.forget(&mut self.services.bus);
        self.cqs.forget_buffers();
        self.mpt.forget();
        self.services.translation.clear();
    }

    fn write_back_contexts(&mut self) {
        self.contexts.write_back(&mut self.services.bus);
    }

    fn context_slots_in_use(&self) -> usize {
        self.contexts.slots_in_use().iter().sum()
    }

    fn configure_context_tables(
        &mut self,
        attributes: [ContextTableAttributes; 4],
    ) -> Result<(), (ContextTableId, HemError)> {
        self.contexts.configure(attributes)
    }

    fn base_address_table(
        &mut self,
        table: ContextTableId,
        command: BtCommand,
        level: u8,
        index: u32,
        address: u64,
    ) -> Result<Option<u64>, Rejection> {
        self.contexts
            .base_address_table(&self.services.bus, table, command, level, index, address)
    }

    fn clear_function(&mut self) {
        self.contexts.clear_tables();
        self.eqs.clear();
    }

    fn mailbox_event(&mut self, token: u16, status: u8, out_param: u64) {
        self.services
            .observe(Port::Event, || Transaction::MailboxEvent { token, status });
        self.eqs.post_mailbox_event(self.services, token, status, out_param);
    }

    fn addresses(&mut self) -> &mut PortAddresses {
        self.port.addresses_mut()
    }
}

impl QpWiring {
    /// A CQE to the CQ block, shown to the completion port's observer.
    #[inline]
    fn post_cqe_observed(&mut self, cqn: u32, cqe: Cqe, solicited: bool) -> Result<(), CqError> {
        let result = self.cqs.post_cqe(&mut self.objects, cqn, cqe, solicited);
        self.objects.services.observe(Port::Completion, || Transaction::Cqe {
            cqn,
            cqe: &cqe,
            solicited,
            written: result.is_ok(),
        });
        result
    }
}

/// What the transport is bound to: everything below it (the QP block and what the QP
/// block is bound to, the memory-protection block).
pub(crate) struct TransportWiring {
    pub(crate) qp: QpWiring,
    /// Memory protection: the MPT cache and the access checks.
    pub(crate) mpt: MemoryProtection,
    /// Queue pairs: the state machine, SQ/RQ doorbells, the flush.
    pub(crate) qps: QueuePairs,
    /// The port: address tables, transmit and receive pipelines, frame buffers.
    pub(crate) port: NetworkPort,
}

impl crate::transport::Io for TransportWiring {
    #[inline]
    fn now(&self) -> Picoseconds {
        self.qp.objects.services.scheduler.now()
    }

    #[inline]
    fn port(&mut self) -> &mut NetworkPort {
        &mut self.port
    }

    #[inline]
    fn timing(&mut self) -> &mut TimingModel {
        &mut self.qp.objects.services.timing
    }

    #[inline]
    fn schedule_at(&mut self, at: Picoseconds, timer: TransportTimer) {
        self.qp
            .objects
            .services
            .scheduler
            .schedule_at(at, Event::Transport(timer));
    }

    fn schedule_in(&mut self, delay: Picoseconds, timer: TransportTimer) {
        self.qp
            .objects
            .services
            .scheduler
            .schedule_in(delay, Event::Transport(timer));
    }

    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.qp
            .objects
            .services
            .diagnose(source, object.into(), field, value, expected.into());
    }

    #[inline]
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.qp.objects.services.bus.read(address, buffer)
    }

    #[inline]
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.qp.objects.services.bus.write(address, data)
    }

    #[inline]
    fn read_buffer(
        &mut self,
        mtr: &Mtr,
        offset: u64,
        first_bus: Option<u64>,
        buffer: &mut [u8],
    ) -> Result<(), DmaFault> {
        let services = &mut self.qp.objects.services;
        crate::mtt::read_buffer(
            &mut services.translation,
            &mut services.bus,
            mtr,
            offset,
            first_bus,
            buffer,
        )
    }

    #[inline]
    fn write_buffer(&mut self, mtr: &Mtr, offset: u64, first_bus: Option<u64>, data: &[u8]) -> Result<(), DmaFault> {
        let services = &mut self.qp.objects.services;
        crate::mtt::write_buffer(
            &mut services.translation,
            &mut services.bus,
            mtr,
            offset,
            first_bus,
            data,
        )
    }

    #[inline]
    fn record_progress(&mut self, qpn: u32, progress: QpcProgress) {
        self.qp.objects.contexts.record_progress(qpn, progress);
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
        let result = self
            .mpt
            .check_access(&mut self.qp.objects, key, pd, address, length, needed);
        self.qp
            .objects
            .services
            .observe(Port::AccessCheck, || Transaction::AccessCheck {
                key,
                pd,
                address,
                length,
                needed: needed.bits(),
                granted: result.is_ok(),
            });
        result
    }

    fn invalidate_rkey(&mut self, rkey: u32, pd: u32) -> Result<(), String> {
        let result = self.mpt.invalidate(&mut self.qp.objects, rkey, pd);
        self.qp
            .objects
            .services
            .observe(Port::AccessCheck, || Transaction::Invalidate {
                rkey,
                done: result.is_ok(),
            });
        result
    }

    fn srq_take_wqe(&mut self, srqn: u32) -> Option<SrqWqe> {
        let taken = self.qp.srqs.take_wqe(&mut self.qp.objects, srqn);
        self.qp
            .objects
            .services
            .observe(Port::ReceiveWqe, || Transaction::ReceiveWqe {
                srqn,
                slot: taken.map(|wqe| wqe.slot),
            });
        taken
    }

    #[inline]
    fn post_cqe(&mut self, cqn: u32, cqe: Cqe, solicited: bool) -> Result<(), CqError> {
        self.qp.post_cqe_observed(cqn, cqe, solicited)
    }

    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        crate::cq::Io::async_event(&mut self.qp.objects, event, sub_type, queue_number);
    }

    fn qp_enter_error(&mut self, qpn: u32) -> Option<crate::qp::Transition> {
        let transition = self.qps.enter_error(&mut self.qp, qpn)?;
        self.qp
            .objects
            .services
            .observe(Port::QpState, || Transaction::QpState {
                qpn,
                from: transition.from,
                to: transition.to,
            });
        Some(transition)
    }

    fn qp_flush(&mut self, qpn: u32, address: u64, qpc: Qpc) {
        self.qps.flush(&mut self.qp, qpn, address, qpc);
    }
}

impl crate::mpt::Io for Objects {
    #[inline]
    fn read_mpt(&mut self, index: u32) -> Result<(Mpt, u64), Rejection> {
        self.contexts.read(&mut self.services.bus, ContextTableId::Mpt, index)
    }

    #[inline]
    fn write_mpt(&mut self, address: u64, mpt: &Mpt) -> Result<(), Rejection> {
        self.contexts.write(&mut self.services.bus, address, mpt)
    }

    #[inline]
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        self.services.translate(mtr, offset)
    }

    #[inline]
    fn bus_master(&self) -> bool {
        self.services.bus.master()
    }
}

impl crate::cq::Io for Objects {
    #[inline]
    fn read_cqc(&mut self, cqn: u32) -> Result<(Cqc, u64), Rejection> {
        self.contexts.read(&mut self.services.bus, ContextTableId::Cqc, cqn)
    }

    #[inline]
    fn cached_cqc(&self, address: u64) -> Option<Cqc> {
        let bytes = self.contexts.cached(address, Cqc::SIZE)?;
        let mut cqc = Cqc::zeroed();
        cqc.bytes_mut().copy_from_slice(bytes);
        Some(cqc)
    }

    #[inline]
    fn write_cqc(&mut self, address: u64, cqc: &Cqc) -> Result<(), Rejection> {
        self.contexts.write(&mut self.services.bus, address, cqc)
    }

    #[inline]
    fn translate(&mut self, mtr: &Mtr, offset: u64) -> Option<Result<u64, MttError>> {
        self.services.translate(mtr, offset)
    }

    #[inline]
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.services.bus.read(address, buffer)
    }

    #[inline]
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.services.bus.write(address, data)
    }

    fn count_dma_error(&mut self) {
        self.services.bus.count_error();
    }

    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.services
            .diagnose(source, object.into(), field, value, expected.into());
    }

    fn ceq_exists(&self, ceqn: u32) -> bool {
        self.eqs.is_active(ceqn, EqKind::Completion)
    }

    fn num_ceqs(&self) -> u32 {
        self.eqs.num_ceqs()
    }

    #[inline]
    fn completion_event(&mut self, ceqn: u32, cqn: u32) {
        self.services
            .observe(Port::Event, || Transaction::CompletionEvent { ceqn, cqn });
        self.eqs.post_completion_event(&mut self.services, ceqn, cqn);
    }

    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        self.post_async_event(event, sub_type, queue_number);
    }
}

impl crate::srq::Io for Objects {
    #[inline]
    fn read_srqc(&mut self, srqn: u32) -> Result<(Srqc, u64), Rejection> {
        self.contexts.read(&mut self.services.bus, ContextTableId::Srqc, srqn)
    }

    #[inline]
    fn write_srqc(&mut self, address: u64, srqc: &Srqc) -> Result<(), Rejection> {
        self.contexts.write(&mut self.services.bus, address, srqc)
    }

    #[inline]
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        self.services.bus.read(address, buffer)
    }

    #[inline]
    fn read_buffer(&mut self, mtr: &Mtr, offset: u64, buffer: &mut [u8]) -> Result<(), DmaFault> {
        crate::mtt::read_buffer(
            &mut self.services.translation,
            &mut self.services.bus,
            mtr,
            offset,
            None,
            buffer,
        )
    }

    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    ) {
        self.services
            .diagnose(source, object.into(), field, value, expected.into());
    }

    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32) {
        self.post_async_event(event, sub_type, queue_number);
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

    #[test]
    fn an_observer_on_a_port_sees_what_crosses_it_and_nothing_else() {
        use crate::probe::Recorder;
        let memory: Arc<dyn HostMemory> = Arc::new(PagedMemory::new());
        let mut device = Device::new(DeviceConfig::default(), memory, Box::new(RecordingSink::new()));
        let command = rnic_firmware_if::pci::COMMAND_MEMORY_SPACE;
        device.config_write(rnic_firmware_if::pci::offset::COMMAND, &command.to_le_bytes());
        let doorbells = Recorder::new();
        let frames = Recorder::new();
        assert!(device
            .attach_observer(Port::Doorbell, Some(Box::new(doorbells.clone())))
            .is_none());
        device.attach_observer(Port::Network, Some(Box::new(frames.clone())));
        device.advance_to(Picoseconds(5));
        // An SQ doorbell for QP 7, producer index 3, as one 64-bit store to page 1.
        let word = rnic_firmware_if::doorbell::Doorbell::sq(7, 3, 0);
        let page = regs::DOORBELL_PAGE_SIZE;
        let offset = page + rnic_firmware_if::doorbell::DB_OFFSET;
        device.bar_write(regs::DOORBELL_BAR, offset, &word.as_u64().to_le_bytes());
        // A half doorbell is no transaction: only the high half completes one.
        device.bar_write(regs::DOORBELL_BAR, offset, &[0; 4]);
        device.receive_frame(&[0xAB; 20]);
        assert_eq!(
            doorbells.seen(),
            vec![(
                Picoseconds(5),
                "Doorbell { target: SendQueue, number: 7, value: 3 }".to_string()
            )]
        );
        assert_eq!(frames.seen().len(), 1, "the received frame");
        assert!(frames.seen()[0].1.starts_with("FrameIn([171, 171"));
        // Taken off, the observer sees no more.
        assert!(device.attach_observer(Port::Doorbell, None).is_some());
        device.bar_write(regs::DOORBELL_BAR, offset, &word.as_u64().to_le_bytes());
        assert_eq!(doorbells.seen().len(), 1);
    }
}
