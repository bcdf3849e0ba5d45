//! The kernel-driver half of the provider: what the hns kernel driver does for rdma-core,
//! done here in user space over a [`DeviceAccess`](crate::device_access::DeviceAccess).
//!
//! * [`cmdq`]: the firmware command queue.
//! * [`mailbox`]: mailbox commands over the command queue (poll mode).
//! * [`hem`]: context tables in host memory (lazy chunks, BT pages, BT0 mailboxes).
//! * [`eq`]: event queues (completion and asynchronous).
//! * [`bringup`]: the initialisation order (hns §2.6) and teardown.
//! * [`dma`]: DMA accounting, queue buffers and MTRs; [`bitmap`]: object numbers.
//! * [`record`]: record-doorbell slots.
//!
//! [`Driver`] ties them together; the verbs layer holds it behind one lock.

pub mod bitmap;
pub mod bringup;
pub mod cmdq;
pub mod dma;
pub mod eq;
pub mod hem;
pub mod mailbox;
pub mod record;

use std::sync::Arc;

use rnic_firmware_if::caps::{CapsError, DeviceCaps};
use rnic_firmware_if::cmdq::GidType;
use rnic_firmware_if::mailbox::{ContextTable, MailboxOpcode};

use self::cmdq::{CommandError, CommandQueue};
use self::dma::{CountingAccess, DmaUsage, MtrError};
use self::eq::{EqEntry, EqError, EventQueue};
use self::hem::{ContextTables, HemError};
use self::mailbox::{Mailbox, MailboxError};
use self::record::RecordPages;
use crate::device_access::AccessError;

pub use self::bringup::DriverConfig;

/// Why a driver operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// BAR0 does not identify an rnic function.
    #[error("BAR0 ID register reads {found:#010x}, expected {expected:#010x} (\"RNIC\"): not an rnic function, or memory decoding is off")]
    NotAnRnic {
        /// What was read.
        found: u32,
        /// What an rnic function reads.
        expected: u32,
    },
    /// The function reset did not finish.
    #[error("function reset still in progress after {polls} polls")]
    ResetTimeout {
        /// Polls made.
        polls: u32,
    },
    /// The function is not ready after reset.
    #[error("function status {status:#x} after reset: not ready (bit 0) or fatal (bit 1)")]
    NotReady {
        /// FUNCTION_STATUS value.
        status: u32,
    },
    /// The function has no usable MSI-X capability.
    #[error("MSI-X: {reason}")]
    Msix {
        /// What is missing.
        reason: String,
    },
    /// The capabilities could not be decoded.
    #[error("capabilities: {0}")]
    Caps(#[from] CapsError),
    /// The capabilities or resources make no sense to this driver.
    #[error("unusable device: {reason}")]
    Unusable {
        /// Why.
        reason: String,
    },
    /// A command-queue command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A mailbox command failed.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    /// A context-table operation failed.
    #[error(transparent)]
    Hem(#[from] HemError),
    /// An event queue could not be set up.
    #[error(transparent)]
    Eq(#[from] EqError),
    /// A translation table could not be built.
    #[error(transparent)]
    Mtr(#[from] MtrError),
    /// DMA memory.
    #[error("DMA memory: {0}")]
    Memory(#[from] AccessError),
}

/// Context-table slot counts of this function (QUERY_PF_RES).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionResources {
    /// QPC L0 slots.
    pub qpc_bt_count: u32,
    /// SRQC L0 slots.
    pub srqc_bt_count: u32,
    /// CQC L0 slots.
    pub cqc_bt_count: u32,
    /// MPT L0 slots.
    pub mpt_bt_count: u32,
    /// EQC L0 slots.
    pub eqc_bt_count: u32,
    /// Source-MAC table entries.
    pub smac_count: u32,
    /// GID table entries.
    pub sgid_count: u32,
    /// Service levels.
    pub sl_count: u32,
}

/// One configured GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidTableEntry {
    /// GID bytes, network order.
    pub gid: [u8; 16],
    /// GID type.
    pub gid_type: GidType,
}

/// What bring-up learned about the device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// PCI vendor id (configuration space).
    pub pci_vendor_id: u16,
    /// PCI device id.
    pub pci_device_id: u16,
    /// PCI revision id.
    pub pci_revision: u8,
    /// BAR0 register-interface version.
    pub interface_version: u32,
    /// Engine vendor id (QUERY_HW_VER).
    pub vendor_id: u16,
    /// Hardware version (QUERY_HW_VER).
    pub hardware_version: u16,
    /// Firmware version: major 31:16, minor 15:8, sub 7:0.
    pub firmware_version: u32,
    /// Functions of the device (QUERY_FUNC_INFO).
    pub function_count: u32,
    /// This function's id (QUERY_PF_RES `VF_ID`).
    pub function_id: u32,
    /// MAC id of this function.
    pub mac_id: u32,
    /// Capabilities (QUERY_PF_CAPS_NUM).
    pub caps: DeviceCaps,
    /// Resources (QUERY_PF_RES).
    pub resources: FunctionResources,
    /// Port MAC address.
    pub mac: [u8; 6],
    /// GID table as programmed; `None` entries are empty.
    pub gids: Vec<Option<GidTableEntry>>,
    /// MSI-X table size.
    pub msix_vectors: u16,
}

impl DeviceInfo {
    /// Firmware version as `major.minor.sub`.
    pub fn firmware_version_string(&self) -> String {
        let v = self.firmware_version;
        format!("{}.{}.{}", v >> 16, (v >> 8) & 0xFF, v & 0xFF)
    }
}

/// Counters a test or a tool reads to check for leaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverUsage {
    /// Context-table chunks allocated, all tables.
    pub context_chunks: usize,
    /// Context-table BT pages allocated, all tables.
    pub context_bt_pages: usize,
    /// L0 slots handed to the device per table (QPC, MPT, CQC, SRQC).
    pub context_l0_slots: [usize; 4],
    /// DMA held by the driver.
    pub dma: DmaUsage,
    /// Command-queue commands submitted.
    pub commands: u64,
    /// Mailbox commands executed.
    pub mailbox_commands: u64,
}

/// The driver state of one function.
#[derive(Debug)]
pub struct Driver {
    access: Arc<CountingAccess>,
    cmdq: CommandQueue,
    mailbox: Mailbox,
    info: DeviceInfo,
    tables: ContextTables,
    ceqs: Vec<EventQueue>,
    aeq: Option<EventQueue>,
    records: RecordPages,
    shut_down: bool,
}

impl Driver {
    /// The device access (for doorbells and DMA).
    pub fn access(&self) -> &Arc<CountingAccess> {
        &self.access
    }

    /// What bring-up learned.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The capabilities.
    pub fn caps(&self) -> &DeviceCaps {
        &self.info.caps
    }

    /// A zeroed record-doorbell slot in DMA memory (see [`record`]).
    ///
    /// # Errors
    /// The backend's, when no DMA memory is left for a new page.
    pub fn allocate_record(&mut self) -> Result<u64, AccessError> {
        self.records.allocate(&*self.access)
    }

    /// Gives back a record slot the device no longer reads.
    pub fn free_record(&mut self, address: u64) {
        self.records.free(&*self.access, address);
    }

    /// Record-doorbell slots in use.
    pub fn records_in_use(&self) -> usize {
        self.records.in_use()
    }

    /// Number of completion vectors (CEQs).
    pub fn completion_vectors(&self) -> u32 {
        self.ceqs.len() as u32
    }

    /// EQN of the asynchronous EQ.
    pub fn aeq_number(&self) -> Option<u32> {
        self.aeq.as_ref().or(self.mailbox.event_queue()).map(EventQueue::eqn)
    }

    /// Whether mailbox completions are awaited as AEQ events.
    pub fn mailbox_event_mode(&self) -> bool {
        self.mailbox.event_mode()
    }

    /// Leak counters.
    pub fn usage(&self) -> DriverUsage {
        DriverUsage {
            context_chunks: self.tables.chunks_in_use(),
            context_bt_pages: self.tables.bt_pages_in_use(),
            context_l0_slots: self.tables.l0_slots_in_use(),
            dma: self.access.usage(),
            commands: self.cmdq.commands_submitted(),
            mailbox_commands: self.mailbox.commands_executed(),
        }
    }

    /// Context-table chunks allocated over all tables.
    pub fn chunks_in_use(&self) -> usize {
        self.tables.chunks_in_use()
    }

    /// Runs a mailbox command with a context as input.
    ///
    /// # Errors
    /// [`MailboxError`].
    pub fn mailbox_with_input(&mut self, opcode: MailboxOpcode, tag: u32, input: &[u8]) -> Result<(), MailboxError> {
        self.mailbox
            .execute_with_input(&*self.access, &mut self.cmdq, opcode, tag, input)
    }

    /// Runs a mailbox query and returns `length` bytes of output.
    ///
    /// # Errors
    /// [`MailboxError`].
    pub fn mailbox_query(&mut self, opcode: MailboxOpcode, tag: u32, length: usize) -> Result<Vec<u8>, MailboxError> {
        self.mailbox
            .execute_query(&*self.access, &mut self.cmdq, opcode, tag, length)
    }

    /// Runs a mailbox command without buffers.
    ///
    /// # Errors
    /// [`MailboxError`].
    pub fn mailbox_plain(&mut self, opcode: MailboxOpcode, tag: u32) -> Result<(), MailboxError> {
        self.mailbox.execute_plain(&*self.access, &mut self.cmdq, opcode, tag)
    }

    /// Takes a context-table reference for object `index` of `table`.
    ///
    /// # Errors
    /// [`HemError`].
    pub fn context_get(&mut self, table: ContextTable, index: u32) -> Result<(), HemError> {
        self.tables
            .table_mut(table)
            .get(&*self.access, &mut self.cmdq, &mut self.mailbox, index)
    }

    /// Drops a context-table reference for object `index` of `table`.
    ///
    /// # Errors
    /// [`HemError`].
    pub fn context_put(&mut self, table: ContextTable, index: u32) -> Result<(), HemError> {
        self.tables
            .table_mut(table)
            .put(&*self.access, &mut self.cmdq, &mut self.mailbox, index)
    }

    /// Consumes every pending entry of every EQ (AEQ first, so an error event about an
    /// object is seen before completions that follow it). In mailbox event mode the AEQ
    /// entries come through the mailbox, which holds the AEQ.
    pub fn poll_event_queues(&mut self) -> Vec<EqEntry> {
        let access = &*self.access;
        let mut entries = match self.mailbox.poll_async_queue(access) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::error!(%e, "cannot read the AEQ");
                Vec::new()
            }
        };
        for eq in self.aeq.iter_mut().chain(self.ceqs.iter_mut()) {
            match eq.poll(access) {
                Ok(mut new) => entries.append(&mut new),
                Err(e) => tracing::error!(eqn = eq.eqn(), %e, "cannot read EQ"),
            }
        }
        entries
    }
}
