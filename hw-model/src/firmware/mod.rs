//! Firmware: the command queue (cmdq) and the mailbox engine it carries.
//!
//! The driver writes descriptors into a ring in host memory and moves the producer
//! index; the firmware reads them by DMA one command at a time (each command costs
//! [`TimingParams::firmware_command_ps`](crate::timing::TimingParams) of virtual time), executes them,
//! writes each descriptor's return code and response back, and advances the consumer
//! index. Mailbox commands (object contexts) are queued by POST_MB and complete after
//! [`TimingParams::mailbox_ps`](crate::timing::TimingParams).
//!
//! The block ([`Firmware`]) owns the ring registers, the global parameters, the mailbox
//! queue and status, and its counters. It accepts the CSQ register writes and its two
//! timers; it produces requests for the blocks below it: the object command of a mailbox
//! ([`ObjectCommand`], handed to the top, which routes it to the QP, CQ, SRQ, MPT or event
//! block and returns the answer), and through its [`Io`] base-address-table commands and
//! attributes for the context block, entries of the port's address tables,
//! mailbox-completion AEQEs and the abnormal interrupt.

mod cmdq;
mod mailbox;

pub use crate::command::Rejection;
pub use crate::port::GidTableEntry;

use std::collections::VecDeque;

use rnic_firmware_if::context::{Cqc, Eqc, Mpt, Qpc, Srqc};
use rnic_firmware_if::mailbox::{BtCommand, ContextTable, MailboxCompletion, PostMailbox};

use crate::config::{BtSlots, DeviceConfig};
use crate::diagnostics::Source;
use crate::eq::EqKind;
use crate::hem::{ContextTableAttributes, HemError};
use crate::memory::MemoryError;
use crate::time::Picoseconds;

/// What the firmware needs from the rest of the device.
pub(crate) trait Io {
    /// DMA read (descriptors, mailbox contexts).
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;
    /// DMA write (descriptors, query results).
    fn dma_write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError>;
    /// Records a diagnostic.
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    );
    /// Runs `timer` after `delay`.
    fn schedule_in(&mut self, delay: Picoseconds, timer: Timer);
    /// To the event block: sets abnormal status bits (and raises the abnormal vector).
    fn raise_abnormal(&mut self, bits: u32);
    /// To the top: the firmware hit a fatal error (FUNCTION_STATUS.FATAL).
    fn set_fatal(&mut self);
    /// Before a command or mailbox runs: the caches in front of host memory (contexts,
    /// MPTs, translations) are written back and forgotten, since the driver may have
    /// changed BT pages or contexts.
    fn forget_caches(&mut self);
    /// After a command or mailbox: the context block writes its cache back.
    fn write_back_contexts(&mut self);
    /// To the context block: base addresses installed, over all tables.
    fn context_slots_in_use(&self) -> usize;
    /// To the context block: CFG_BT_ATTR for the four tables (QPC, MPT, CQC, SRQC), all
    /// or none; the table refusing and why.
    fn configure_context_tables(
        &mut self,
        attributes: [ContextTableAttributes; 4],
    ) -> Result<(), (ContextTable, HemError)>;
    /// To the context block: a `WRITE/READ/DESTROY_<T>_BT<level>` mailbox.
    fn base_address_table(
        &mut self,
        table: ContextTable,
        command: BtCommand,
        level: u8,
        index: u32,
        address: u64,
    ) -> Result<Option<u64>, Rejection>;
    /// FUNC_CLEAR: the context tables and the EQs forget everything.
    fn clear_function(&mut self);
    /// To the event block: a mailbox-completion AEQE.
    fn mailbox_event(&mut self, token: u16, status: u8, out_param: u64);
    /// The port's address tables (CFG_SGID_TB, CFG_SMAC_TB).
    fn addresses(&mut self) -> &mut crate::port::PortAddresses;
}

/// The firmware's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Process the command queue up to the producer index.
    CommandQueue,
    /// Complete the mailbox command at the head of the mailbox queue.
    MailboxComplete,
}

/// A mailbox's object command, for the block that owns the object.
#[derive(Debug, Clone)]
pub(crate) enum ObjectCommand {
    /// MODIFY_QPC (boxed: the contexts are the largest).
    ModifyQp {
        qpn: u32,
        context: Box<Qpc>,
        mask: Box<Qpc>,
    },
    /// QUERY_QPC.
    QueryQp { qpn: u32 },
    /// CREATE_MPT.
    CreateMpt { index: u32, mpt: Mpt },
    /// DESTROY_MPT.
    DestroyMpt { index: u32 },
    /// QUERY_MPT.
    QueryMpt { index: u32 },
    /// CREATE_CQC.
    CreateCq { cqn: u32, cqc: Cqc },
    /// MODIFY_CQC.
    ModifyCq { cqn: u32, context: Cqc, mask: Cqc },
    /// QUERY_CQC.
    QueryCq { cqn: u32 },
    /// DESTROY_CQC.
    DestroyCq { cqn: u32 },
    /// CREATE_SRQ.
    CreateSrq { srqn: u32, srqc: Srqc },
    /// MODIFY_SRQC.
    ModifySrq { srqn: u32, context: Srqc, mask: Srqc },
    /// QUERY_SRQC.
    QuerySrq { srqn: u32 },
    /// DESTROY_SRQ.
    DestroySrq { srqn: u32 },
    /// CREATE_CEQC / CREATE_AEQC.
    CreateEq { eqn: u32, kind: EqKind, eqc: Eqc },
    /// MODIFY_CEQC / MODIFY_AEQC.
    ModifyEq {
        eqn: u32,
        kind: EqKind,
        context: Eqc,
        mask: Eqc,
    },
    /// QUERY_CEQC / QUERY_AEQC.
    QueryEq { eqn: u32, kind: EqKind },
    /// DESTROY_CEQC / DESTROY_AEQC.
    DestroyEq { eqn: u32, kind: EqKind },
}

/// Command-queue ring registers and progress.
#[derive(Debug, Default, Clone)]
pub(crate) struct CommandQueue {
    /// Ring base bus address.
    pub base: u64,
    /// Raw depth register (units of 8 descriptors).
    pub depth_register: u32,
    /// Producer index written by the driver.
    pub producer_index: u32,
    /// Consumer index advanced by the firmware.
    pub consumer_index: u32,
    /// A processing event is pending.
    pub scheduled: bool,
}

impl CommandQueue {
    /// Ring depth in descriptors (0 when not configured).
    pub fn depth(&self) -> u32 {
        self.depth_register.saturating_mul(8)
    }
}

/// What the firmware counted since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FirmwareCounters {
    /// Commands executed from the command queue.
    pub commands: u64,
    /// Mailbox commands completed (any status).
    pub mailbox_commands: u64,
}

/// What the firmware reports about the device and how long it takes.
#[derive(Debug, Clone)]
struct Identity {
    firmware_version: u32,
    hardware_version: u16,
    vendor_id: u16,
    bt_slots: BtSlots,
    caps: rnic_firmware_if::caps::DeviceCaps,
    /// Virtual time per command.
    command_ps: u64,
    /// Virtual time per mailbox.
    mailbox_ps: u64,
}

/// The firmware block.
#[derive(Debug, Clone)]
pub(crate) struct Firmware {
    /// The command ring.
    cmdq: CommandQueue,
    /// Clock cycles per µs configured by CFG_GLOBAL_PARAM (None until configured).
    cycles_per_microsecond: Option<u16>,
    /// RoCEv2 UDP destination port.
    udp_port: u16,
    /// Mailbox commands posted and not yet complete.
    mailbox_queue: VecDeque<PostMailbox>,
    /// Status of the last completed mailbox command.
    last_mailbox_status: MailboxCompletion,
    /// Context-table attributes have been configured.
    attributes_configured: bool,
    identity: Identity,
    counters: FirmwareCounters,
}

/// Most mailbox commands the firmware queues (hns event mode allows 32 outstanding).
pub(crate) const MAILBOX_QUEUE_DEPTH: usize = 32;

impl Firmware {
    /// The firmware of a device with `config` after power-on.
    pub fn new(config: &DeviceConfig) -> Self {
        Self {
            cmdq: CommandQueue::default(),
            cycles_per_microsecond: None,
            udp_port: 4791,
            mailbox_queue: VecDeque::new(),
            last_mailbox_status: MailboxCompletion::None,
            attributes_configured: false,
            identity: Identity {
                firmware_version: config.firmware_version,
                hardware_version: config.hardware_version,
                vendor_id: config.identity.vendor_id,
                bt_slots: config.bt_slots,
                caps: config.caps,
                command_ps: config.timing.firmware_command_ps,
                mailbox_ps: config.timing.mailbox_ps,
            },
            counters: FirmwareCounters::default(),
        }
    }

    /// Function reset: the firmware as after power-on, keeping its counters.
    pub fn reset(&mut self) {
        let counters = self.counters;
        let identity = self.identity.clone();
        *self = Self {
            cmdq: CommandQueue::default(),
            cycles_per_microsecond: None,
            udp_port: 4791,
            mailbox_queue: VecDeque::new(),
            last_mailbox_status: MailboxCompletion::None,
            attributes_configured: false,
            identity,
            counters,
        };
    }

    /// What the firmware counted.
    pub fn counters(&self) -> FirmwareCounters {
        self.counters
    }

    /// The command-ring registers, as BAR0 reads them.
    pub fn command_queue(&self) -> &CommandQueue {
        &self.cmdq
    }
}
