//! Mailbox commands (hns §3), carried by the command queue, in poll mode.
//!
//! A mailbox command names an operation, an object (`tag`) and two parameters: the
//! address of a 4 KiB DMA buffer holding a context (create/modify: input; query: output)
//! or, for base-address-table writes, the table address itself. The driver posts it with
//! `POST_MB` (token `0xFFFF`, events off) and polls `QUERY_MB_ST` every
//! [`POLL_INTERVAL_NS`] until the busy bit clears, at most [`MAX_POLLS`] times (10 s), then
//! checks the completion status.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{Opcode, DESCRIPTOR_DATA_SIZE};
use rnic_firmware_if::mailbox::{
    MailboxCompletion, MailboxOpcode, MailboxStatus, PostMailbox, MAILBOX_BUFFER_SIZE, POLL_TOKEN,
};

use super::cmdq::{CommandError, CommandQueue};
use crate::device_access::{AccessError, DeviceAccess, DmaBuffer};

/// Delay between two `QUERY_MB_ST` polls, in nanoseconds.
pub const POLL_INTERVAL_NS: u64 = 10_000;
/// Polls before a mailbox command is declared lost: 10 s of polling (hns
/// `HNS_ROCE_CMD_TIMEOUT_MSECS`).
pub const MAX_POLLS: u32 = 1_000_000;

/// Why a mailbox command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MailboxError {
    /// Posting or polling through the command queue failed.
    #[error("mailbox {opcode:?} (tag {tag}): {source}")]
    Command {
        /// The mailbox command.
        opcode: MailboxOpcode,
        /// Its object index.
        tag: u32,
        /// The command-queue failure.
        #[source]
        source: CommandError,
    },
    /// The device completed the command with a failure status.
    #[error("mailbox {opcode:?} (tag {tag}) failed with status {status:?}")]
    Failed {
        /// The mailbox command.
        opcode: MailboxOpcode,
        /// Its object index.
        tag: u32,
        /// The completion status.
        status: MailboxCompletion,
    },
    /// The device reported a status byte this driver does not know.
    #[error("mailbox {opcode:?} (tag {tag}) completed with unknown status {raw:#x}")]
    UnknownStatus {
        /// The mailbox command.
        opcode: MailboxOpcode,
        /// Its object index.
        tag: u32,
        /// The raw status byte.
        raw: u8,
    },
    /// The device stayed busy for 10 s.
    #[error("mailbox {opcode:?} (tag {tag}) still busy after {polls} polls")]
    Timeout {
        /// The mailbox command.
        opcode: MailboxOpcode,
        /// Its object index.
        tag: u32,
        /// Polls made.
        polls: u32,
    },
    /// The mailbox buffers could not be allocated or accessed.
    #[error("mailbox buffer memory: {0}")]
    Memory(#[from] AccessError),
}

impl MailboxError {
    /// The device's completion status, when the device answered with a failure.
    pub fn completion(&self) -> Option<MailboxCompletion> {
        match self {
            Self::Failed { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The mailbox engine's driver side: two 4 KiB DMA buffers (input and output).
#[derive(Debug)]
pub struct Mailbox {
    /// Input and output buffers; `None` once released.
    buffers: Option<(DmaBuffer, DmaBuffer)>,
    executed: u64,
}

impl Mailbox {
    /// Allocates the mailbox buffers.
    ///
    /// # Errors
    /// [`MailboxError::Memory`].
    pub fn new(access: &dyn DeviceAccess) -> Result<Self, MailboxError> {
        let input = access.allocate_dma(MAILBOX_BUFFER_SIZE, MAILBOX_BUFFER_SIZE)?;
        let output = match access.allocate_dma(MAILBOX_BUFFER_SIZE, MAILBOX_BUFFER_SIZE) {
            Ok(output) => output,
            Err(e) => {
                access.free_dma(input);
                return Err(e.into());
            }
        };
        Ok(Self {
            buffers: Some((input, output)),
            executed: 0,
        })
    }

    /// Mailbox commands executed so far.
    pub fn commands_executed(&self) -> u64 {
        self.executed
    }

    /// Gives the buffers back (the device must be idle). Later commands fail.
    pub fn release(&mut self, access: &dyn DeviceAccess) {
        if let Some((input, output)) = self.buffers.take() {
            access.free_dma(input);
            access.free_dma(output);
        }
    }

    fn addresses(&self, opcode: MailboxOpcode, tag: u32) -> Result<(u64, u64), MailboxError> {
        self.buffers
            .as_ref()
            .map(|(input, output)| (input.address(), output.address()))
            .ok_or(MailboxError::Command {
                opcode,
                tag,
                source: CommandError::ShutDown,
            })
    }

    /// Runs a command whose input is `context` (create / modify): in_param = the input
    /// buffer holding `context`, out_param = 0.
    ///
    /// # Errors
    /// See [`MailboxError`].
    pub fn execute_with_input(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        opcode: MailboxOpcode,
        tag: u32,
        context: &[u8],
    ) -> Result<(), MailboxError> {
        debug_assert!(context.len() <= MAILBOX_BUFFER_SIZE);
        let (input, _) = self.addresses(opcode, tag)?;
        access.dma_write(input, context)?;
        self.execute(access, cmdq, opcode, tag, input, 0)
    }

    /// Runs a query: in_param = 0, out_param = the output buffer; returns its first
    /// `length` bytes.
    ///
    /// # Errors
    /// See [`MailboxError`].
    pub fn execute_query(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        opcode: MailboxOpcode,
        tag: u32,
        length: usize,
    ) -> Result<Vec<u8>, MailboxError> {
        debug_assert!(length <= MAILBOX_BUFFER_SIZE);
        // Clear first, so a device that answers "success" without writing is visible.
        let (_, output) = self.addresses(opcode, tag)?;
        access.dma_write(output, &vec![0u8; length])?;
        self.execute(access, cmdq, opcode, tag, 0, output)?;
        let mut out = vec![0u8; length];
        access.dma_read(output, &mut out)?;
        Ok(out)
    }

    /// Runs a command without buffers (destroy): both parameters 0.
    ///
    /// # Errors
    /// See [`MailboxError`].
    pub fn execute_plain(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        opcode: MailboxOpcode,
        tag: u32,
    ) -> Result<(), MailboxError> {
        self.execute(access, cmdq, opcode, tag, 0, 0)
    }

    /// Runs a base-address-table write: in_param = `address`, out_param = the (unused)
    /// output buffer, as hns does.
    ///
    /// # Errors
    /// See [`MailboxError`].
    pub fn write_base_address(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        opcode: MailboxOpcode,
        tag: u32,
        address: u64,
    ) -> Result<(), MailboxError> {
        let (_, output) = self.addresses(opcode, tag)?;
        self.execute(access, cmdq, opcode, tag, address, output)
    }

    /// Posts one command and polls until it completes.
    ///
    /// # Errors
    /// See [`MailboxError`].
    pub fn execute(
        &mut self,
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        opcode: MailboxOpcode,
        tag: u32,
        in_param: u64,
        out_param: u64,
    ) -> Result<(), MailboxError> {
        let command_error = |source| MailboxError::Command {
            opcode,
            tag,
            source,
        };
        self.addresses(opcode, tag)?;
        let mut post = PostMailbox::zeroed();
        post.set_in_param(in_param);
        post.set_out_param(out_param);
        post.set_command(opcode as u8);
        post.set_tag(tag);
        post.set_token(POLL_TOKEN);
        post.set_event_enable(false);
        cmdq.write(access, Opcode::PostMailbox, &post.0)
            .map_err(command_error)?;
        self.executed += 1;

        let mut polls = 0;
        loop {
            let payload: [u8; DESCRIPTOR_DATA_SIZE] = cmdq
                .query(access, Opcode::QueryMailboxStatus)
                .map_err(command_error)?;
            let status = MailboxStatus(payload);
            if !status.busy() {
                let raw = status.status();
                return match MailboxCompletion::from_raw(raw) {
                    Some(MailboxCompletion::Success) => {
                        tracing::trace!(?opcode, tag, "mailbox done");
                        Ok(())
                    }
                    Some(status) => {
                        tracing::debug!(?opcode, tag, ?status, "mailbox failed");
                        Err(MailboxError::Failed {
                            opcode,
                            tag,
                            status,
                        })
                    }
                    None => Err(MailboxError::UnknownStatus { opcode, tag, raw }),
                };
            }
            if polls >= MAX_POLLS {
                return Err(MailboxError::Timeout { opcode, tag, polls });
            }
            access.delay(POLL_INTERVAL_NS);
            polls += 1;
        }
    }
}
