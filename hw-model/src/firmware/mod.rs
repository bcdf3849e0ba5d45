//! Firmware: the command queue (cmdq) and the mailbox engine it carries.
//!
//! The driver writes descriptors into a ring in host memory and moves the producer
//! index; the firmware reads them by DMA one command at a time (each command costs
//! [`TimingParams::firmware_command_ps`](crate::timing::TimingParams) of virtual time), executes them,
//! writes each descriptor's return code and response back, and advances the consumer
//! index. Mailbox commands (object contexts) are queued by POST_MB and complete after
//! [`TimingParams::mailbox_ps`](crate::timing::TimingParams).

mod cmdq;
mod mailbox;
pub use crate::command::Rejection;

use std::collections::VecDeque;

use rnic_firmware_if::cmdq::GidType;
use rnic_firmware_if::mailbox::{MailboxCompletion, PostMailbox};

use crate::config::DeviceConfig;

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

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidTableEntry {
    /// GID bytes in network order.
    pub gid: [u8; 16],
    /// GID type.
    pub gid_type: GidType,
}

/// Firmware state besides the ring.
#[derive(Debug, Clone)]
pub(crate) struct Firmware {
    /// Clock cycles per µs configured by CFG_GLOBAL_PARAM (None until configured).
    pub cycles_per_microsecond: Option<u16>,
    /// RoCEv2 UDP destination port.
    pub udp_port: u16,
    /// GID table.
    pub gids: Vec<Option<GidTableEntry>>,
    /// Source MAC table.
    pub smacs: Vec<Option<[u8; 6]>>,
    /// Mailbox commands posted and not yet complete.
    pub mailbox_queue: VecDeque<PostMailbox>,
    /// Status of the last completed mailbox command.
    pub last_mailbox_status: MailboxCompletion,
    /// Context-table attributes have been configured.
    pub attributes_configured: bool,
}

/// Most mailbox commands the firmware queues (hns event mode allows 32 outstanding).
pub(crate) const MAILBOX_QUEUE_DEPTH: usize = 32;

impl Firmware {
    pub fn new(config: &DeviceConfig) -> Self {
        let gid_count = config.caps.max_gids as usize;
        let mut smacs = vec![None; gid_count.max(1)];
        smacs[0] = Some(config.mac_address);
        Self {
            cycles_per_microsecond: None,
            udp_port: 4791,
            gids: vec![None; gid_count.max(1)],
            smacs,
            mailbox_queue: VecDeque::new(),
            last_mailbox_status: MailboxCompletion::None,
            attributes_configured: false,
        }
    }
}

impl crate::device::Device {
    /// The GID table as configured by the driver.
    pub fn gid_table(&self) -> &[Option<GidTableEntry>] {
        &self.firmware.gids
    }

    /// The source-MAC table.
    pub fn smac_table(&self) -> &[Option<[u8; 6]>] {
        &self.firmware.smacs
    }
}
