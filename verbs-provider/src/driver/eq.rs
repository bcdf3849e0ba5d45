//! Event queues (hns §9): completion EQs (one per completion vector) and the
//! asynchronous EQ.
//!
//! Each EQ is a ring of entries in DMA memory described by an EQC (`CREATE_CEQC` /
//! `CREATE_AEQC`, tag = EQN) with an MTR over its pages. The device writes entries with an
//! owner bit that flips every lap; the driver consumes entries while
//! [`eqe_is_valid`] holds, then publishes its consumer index with an EQ doorbell. EQs are
//! created "always armed", so the doorbell only updates the consumer index.
//!
//! Numbering: CEQs are EQN `0..n`, the AEQ is EQN `n`. MSI-X: vector 0 abnormal, vector 1
//! the AEQ, vector `2 + i` CEQ `i`.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{EqArmState, EqState, Eqc, EqeSize};
use rnic_firmware_if::doorbell::{EqDoorbell, EqDoorbellCommand, EQ_DB_OFFSET};
use rnic_firmware_if::eqe::{eqe_is_valid, Aeqe, AeqeMailbox, Ceqe};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::MailboxOpcode;
use rnic_firmware_if::mtr::{MtrRegion, MIN_PAGE_SHIFT};
use rnic_firmware_if::regs;

use super::cmdq::CommandQueue;
use super::dma::{Mtr, MtrError, QueueBuffer};
use super::mailbox::{Mailbox, MailboxError};
use crate::device_access::{AccessError, DeviceAccess};
use crate::mtr::choose_hop;

/// MSI-X vector of the AEQ.
pub const AEQ_VECTOR: u16 = 1;
/// MSI-X vector of CEQ 0; CEQ `i` uses `FIRST_CEQ_VECTOR + i`.
pub const FIRST_CEQ_VECTOR: u16 = 2;

/// Why an EQ could not be created or destroyed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EqError {
    /// Buffer memory.
    #[error("EQ {eqn} memory: {source}")]
    Memory {
        /// EQ number.
        eqn: u32,
        /// Backend failure.
        #[source]
        source: AccessError,
    },
    /// The EQ's translation.
    #[error("EQ {eqn} translation: {source}")]
    Mtr {
        /// EQ number.
        eqn: u32,
        /// MTR failure.
        #[source]
        source: MtrError,
    },
    /// The create/destroy mailbox.
    #[error("EQ {eqn}: {source}")]
    Mailbox {
        /// EQ number.
        eqn: u32,
        /// Mailbox failure.
        #[source]
        source: MailboxError,
    },
}

/// Which kind of EQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EqKind {
    /// Completion EQ: entries name CQs.
    Completion,
    /// Asynchronous EQ: entries are events.
    Async,
}

/// One consumed EQ entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EqEntry {
    /// A CQ has a completion to notify (CEQE).
    Completion {
        /// The CQ.
        cqn: u32,
    },
    /// An asynchronous event (AEQE).
    Async {
        /// Raw event type (see [`AsyncEventType`]).
        event_type: u8,
        /// Raw sub-type.
        sub_type: u8,
        /// QPN, CQN or SRQN the event is about.
        queue_number: u32,
    },
    /// A mailbox command posted in event mode completed (AEQE type MB).
    MailboxCompletion {
        /// The token given at post time.
        token: u16,
        /// Completion status byte.
        status: u8,
        /// The command's output parameter.
        out_param: u64,
    },
}

/// Parameters of one EQ.
#[derive(Debug, Clone, Copy)]
pub struct EqParameters {
    /// Entries (a power of two).
    pub depth: u32,
    /// Interrupt coalescing: entries per interrupt (EQ_MAX_CNT).
    pub max_count: u16,
    /// Interrupt coalescing: period (EQ_PERIOD).
    pub period: u16,
}

/// One event queue.
#[derive(Debug)]
pub struct EventQueue {
    eqn: u32,
    kind: EqKind,
    vector: u16,
    depth: u32,
    entry_size: usize,
    buffer: QueueBuffer,
    mtr: Mtr,
    consumer_index: u32,
    consumed: u64,
}

impl EventQueue {
    /// Creates the EQ in host memory and on the device, and enables its interrupt.
    ///
    /// # Errors
    /// [`EqError`]; nothing stays allocated on failure.
    pub fn create(
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        mailbox: &mut Mailbox,
        kind: EqKind,
        eqn: u32,
        parameters: EqParameters,
    ) -> Result<Self, EqError> {
        let entry_size = match kind {
            EqKind::Completion => EqeSize::Compact.ceqe_bytes(),
            EqKind::Async => EqeSize::Compact.aeqe_bytes(),
        };
        let depth = parameters.depth.max(2).next_power_of_two();
        let buffer = QueueBuffer::allocate(access, u64::from(depth) * entry_size as u64)
            .map_err(|source| EqError::Memory { eqn, source })?;
        let pages = buffer.pages();
        let hop = choose_hop(pages.len() as u64, 512);
        let regions = [MtrRegion {
            page_count: pages.len() as u64,
            hop,
        }];
        let mtr = match Mtr::create(access, &regions, &pages, MIN_PAGE_SHIFT, MIN_PAGE_SHIFT) {
            Ok(mtr) => mtr,
            Err(source) => {
                buffer.release(access);
                return Err(EqError::Mtr { eqn, source });
            }
        };

        let mut eqc = Eqc::zeroed();
        eqc.set_eq_state(EqState::Valid);
        eqc.set_eqe_hop_number(mtr.hop());
        eqc.set_arm_state(EqArmState::AlwaysArmed);
        eqc.set_eq_number(eqn as u8);
        eqc.set_eqe_ba_page_size(mtr.ba_page_size_field());
        eqc.set_eqe_buffer_page_size(mtr.buffer_page_size_field());
        eqc.set_max_count(parameters.max_count);
        eqc.set_period(parameters.period);
        eqc.set_eqe_base_address(mtr.root() >> 3);
        eqc.set_shift(depth.trailing_zeros() as u8);
        eqc.set_msi_index(0);
        let [first, second] = mtr.first_pages();
        eqc.set_current_eqe_address(first >> 12);
        eqc.set_next_eqe_address(second >> 12);
        eqc.set_eqe_size(EqeSize::Compact);
        let opcode = match kind {
            EqKind::Completion => MailboxOpcode::CreateCeqc,
            EqKind::Async => MailboxOpcode::CreateAeqc,
        };
        if let Err(source) = mailbox.execute_with_input(access, cmdq, opcode, eqn, eqc.bytes()) {
            mtr.release(access);
            buffer.release(access);
            return Err(EqError::Mailbox { eqn, source });
        }
        access.mmio_write32(regs::CONTROL_BAR, regs::event_int_enable(eqn), 1);
        let vector = match kind {
            EqKind::Completion => FIRST_CEQ_VECTOR + eqn as u16,
            EqKind::Async => AEQ_VECTOR,
        };
        tracing::debug!(eqn, ?kind, depth, vector, "EQ created");
        Ok(Self {
            eqn,
            kind,
            vector,
            depth,
            entry_size,
            buffer,
            mtr,
            consumer_index: 0,
            consumed: 0,
        })
    }

    /// EQ number.
    pub fn eqn(&self) -> u32 {
        self.eqn
    }

    /// Kind.
    pub fn kind(&self) -> EqKind {
        self.kind
    }

    /// MSI-X vector.
    pub fn vector(&self) -> u16 {
        self.vector
    }

    /// Depth in entries.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Entries consumed since creation.
    pub fn entries_consumed(&self) -> u64 {
        self.consumed
    }

    /// Consumes every valid entry and, if any, publishes the new consumer index.
    ///
    /// # Errors
    /// [`AccessError`] if the ring cannot be read.
    pub fn poll(&mut self, access: &dyn DeviceAccess) -> Result<Vec<EqEntry>, AccessError> {
        let mut entries = Vec::new();
        let mut raw = vec![0u8; self.entry_size];
        loop {
            let slot = self.consumer_index & (self.depth - 1);
            let address = self.buffer.address() + u64::from(slot) * self.entry_size as u64;
            access.dma_read(address, &mut raw)?;
            let entry = match self.kind {
                EqKind::Completion => {
                    let ceqe = Ceqe::parse(&raw).expect("entry size matches the layout");
                    if !eqe_is_valid(ceqe.owner(), self.consumer_index, self.depth) {
                        break;
                    }
                    EqEntry::Completion { cqn: ceqe.cq_number() }
                }
                EqKind::Async => {
                    let aeqe = Aeqe::parse(&raw).expect("entry size matches the layout");
                    if !eqe_is_valid(aeqe.owner(), self.consumer_index, self.depth) {
                        break;
                    }
                    if aeqe.event_type() == AsyncEventType::Mb as u8 {
                        let mb = AeqeMailbox::parse(&raw).expect("same size");
                        EqEntry::MailboxCompletion {
                            token: mb.token(),
                            status: mb.mailbox_status(),
                            out_param: mb.out_param(),
                        }
                    } else {
                        EqEntry::Async {
                            event_type: aeqe.event_type(),
                            sub_type: aeqe.sub_type(),
                            queue_number: aeqe.queue_number(),
                        }
                    }
                }
            };
            entries.push(entry);
            self.consumer_index = self.consumer_index.wrapping_add(1);
            self.consumed += 1;
            // Never let one poll spin on a device that keeps producing.
            if entries.len() as u32 >= self.depth {
                break;
            }
        }
        if !entries.is_empty() {
            // hns tags only CEQ doorbells with the EQN (there is one AEQ).
            let (command, tag) = match self.kind {
                EqKind::Completion => (EqDoorbellCommand::CeqCi, self.eqn as u8),
                EqKind::Async => (EqDoorbellCommand::AeqCi, 0),
            };
            // The device compares the 24-bit CI modulo 2 × depth; keeping the free-running
            // counter's low 24 bits preserves that.
            let doorbell = EqDoorbell::new(command, tag, self.consumer_index & 0xFF_FFFF);
            access.mmio_write64(regs::DOORBELL_BAR, EQ_DB_OFFSET, doorbell.as_u64());
        }
        Ok(entries)
    }

    /// Disables the interrupt and destroys the EQ on the device. The memory stays
    /// allocated: free it with [`EventQueue::release`] once the device has let go (after
    /// this succeeded, or after a function reset).
    ///
    /// # Errors
    /// [`EqError::Mailbox`].
    pub fn destroy_on_device(
        &self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        mailbox: &mut Mailbox,
    ) -> Result<(), EqError> {
        access.mmio_write32(regs::CONTROL_BAR, regs::event_int_enable(self.eqn), 0);
        let opcode = match self.kind {
            EqKind::Completion => MailboxOpcode::DestroyCeqc,
            EqKind::Async => MailboxOpcode::DestroyAeqc,
        };
        mailbox
            .execute_plain(access, cmdq, opcode, self.eqn)
            .map_err(|source| EqError::Mailbox { eqn: self.eqn, source })
    }

    /// Frees the memory without telling the device (after a function reset).
    pub fn release(self, access: &dyn DeviceAccess) {
        self.mtr.release(access);
        self.buffer.release(access);
    }
}
