//! Mailbox commands (hns §3), carried by the command queue.
//!
//! A mailbox command names an operation, an object (`tag`) and two parameters: the
//! address of a 4 KiB DMA buffer holding a context (create/modify: input; query: output)
//! or, for base-address-table writes, the table address itself. The driver posts it with
//! `POST_MB` and waits for completion in one of two modes:
//!
//! * poll mode (until the EQs exist, and whenever event mode is off): token `0xFFFF`,
//!   events off; poll `QUERY_MB_ST` every [`POLL_INTERVAL_NS`] until the busy bit clears,
//!   at most [`MAX_POLLS`] times (10 s), then check the completion status;
//! * event mode (hns `cmd_mod = 1`): a fresh token and `EVENT_EN`; the device reports the
//!   completion as an AEQE of type MB carrying the token and the status. In event mode the
//!   mailbox holds the AEQ ([`Mailbox::enable_event_mode`]) and keeps every other AEQ
//!   entry it sees for [`Mailbox::poll_async_queue`].

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{Opcode, DESCRIPTOR_DATA_SIZE};
use rnic_firmware_if::mailbox::{
    MailboxCompletion, MailboxOpcode, MailboxStatus, PostMailbox, MAILBOX_BUFFER_SIZE, POLL_TOKEN,
};

use super::cmdq::{CommandError, CommandQueue};
use super::eq::{EqEntry, EventQueue};
use crate::device_access::{AccessError, DeviceAccess, DmaBuffer};

/// Delay between two `QUERY_MB_ST` polls, in nanoseconds.
pub const POLL_INTERVAL_NS: u64 = 10_000;
/// Polls before a mailbox command is declared lost: 10 s of polling (hns
/// `HNS_ROCE_CMD_TIMEOUT_MSECS`).
pub const MAX_POLLS: u32 = 1_000_000;
/// Event mode: how long to wait for the completion event (10 s, as hns).
pub const EVENT_TIMEOUT_NS: u64 = 10_000_000_000;
/// Event mode: the longest single interrupt wait, so the timeout is honoured even when
/// unrelated interrupts keep arriving.
const EVENT_WAIT_SLICE_NS: u64 = 100_000;

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
    /// The device stayed busy for 10 s (poll mode: `polls` polls; event mode: the
    /// number of interrupt waits).
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
    events: Option<EventMode>,
}

/// Event-mode state: the AEQ the completions arrive on, the AEQ entries that were not
/// ours, and the next token.
#[derive(Debug)]
struct EventMode {
    aeq: EventQueue,
    others: Vec<EqEntry>,
    next_token: u16,
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
            events: None,
        })
    }

    /// Mailbox commands executed so far.
    pub fn commands_executed(&self) -> u64 {
        self.executed
    }

    /// Switches to event mode: completions are awaited on `aeq`, which the mailbox holds
    /// until [`Mailbox::disable_event_mode`].
    pub fn enable_event_mode(&mut self, aeq: EventQueue) {
        self.events = Some(EventMode {
            aeq,
            others: Vec::new(),
            next_token: 0,
        });
    }

    /// Back to poll mode; returns the AEQ and leaves unconsumed AEQ entries in `others`.
    pub fn disable_event_mode(&mut self, others: &mut Vec<EqEntry>) -> Option<EventQueue> {
        self.events.take().map(|mut events| {
            others.append(&mut events.others);
            events.aeq
        })
    }

    /// Whether completions are awaited as events.
    pub fn event_mode(&self) -> bool {
        self.events.is_some()
    }

    /// The AEQ held in event mode.
    pub fn event_queue(&self) -> Option<&EventQueue> {
        self.events.as_ref().map(|e| &e.aeq)
    }

    /// In event mode: every AEQ entry that is not a mailbox completion, oldest first —
    /// those seen while waiting for completions and those pending now. Empty in poll
    /// mode (the driver polls the AEQ itself).
    pub fn poll_async_queue(&mut self, access: &dyn DeviceAccess) -> Result<Vec<EqEntry>, AccessError> {
        let Some(events) = self.events.as_mut() else {
            return Ok(Vec::new());
        };
        let mut entries = std::mem::take(&mut events.others);
        for entry in events.aeq.poll(access)? {
            match entry {
                EqEntry::MailboxCompletion { token, status, .. } => {
                    rnic_diag::warn!(
                        rnic_diag::global(),
                        crate::diag::STRAY_MAILBOX_COMPLETION,
                        token,
                        status,
                        "mailbox completion nobody waits for"
                    );
                }
                other => entries.push(other),
            }
        }
        Ok(entries)
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

    /// Posts one command and waits for its completion (poll or event mode).
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
        let command_error = |source| MailboxError::Command { opcode, tag, source };
        self.addresses(opcode, tag)?;
        let token = match self.events.as_mut() {
            Some(events) => {
                let token = events.next_token;
                // 0xFFFF is the poll-mode token; skip it.
                events.next_token = events.next_token.wrapping_add(1) % POLL_TOKEN;
                Some(token)
            }
            None => None,
        };
        let mut post = PostMailbox::zeroed();
        post.set_in_param(in_param);
        post.set_out_param(out_param);
        post.set_command(opcode as u8);
        post.set_tag(tag);
        post.set_token(token.unwrap_or(POLL_TOKEN));
        post.set_event_enable(token.is_some());
        cmdq.write(access, Opcode::PostMailbox, &post.0)
            .map_err(command_error)?;
        self.executed += 1;
        let raw = match token {
            Some(token) => self.wait_for_event(access, opcode, tag, token)?,
            None => Self::poll_status(access, cmdq, opcode, tag)?,
        };
        match MailboxCompletion::from_raw(raw) {
            Some(MailboxCompletion::Success) => {
                tracing::trace!(?opcode, tag, "mailbox done");
                Ok(())
            }
            Some(status) => {
                tracing::debug!(?opcode, tag, ?status, "mailbox failed");
                Err(MailboxError::Failed { opcode, tag, status })
            }
            None => Err(MailboxError::UnknownStatus { opcode, tag, raw }),
        }
    }

    /// Poll mode: QUERY_MB_ST until not busy; returns the status byte.
    fn poll_status(
        access: &dyn DeviceAccess,
        cmdq: &mut CommandQueue,
        opcode: MailboxOpcode,
        tag: u32,
    ) -> Result<u8, MailboxError> {
        let mut polls = 0;
        loop {
            let payload: [u8; DESCRIPTOR_DATA_SIZE] = cmdq
                .query(access, Opcode::QueryMailboxStatus)
                .map_err(|source| MailboxError::Command { opcode, tag, source })?;
            let status = MailboxStatus(payload);
            if !status.busy() {
                return Ok(status.status());
            }
            if polls >= MAX_POLLS {
                return Err(MailboxError::Timeout { opcode, tag, polls });
            }
            access.delay(POLL_INTERVAL_NS);
            polls += 1;
        }
    }

    /// Event mode: drains the AEQ until the MB event with `token` arrives, keeping every
    /// other entry; returns the status byte.
    fn wait_for_event(
        &mut self,
        access: &dyn DeviceAccess,
        opcode: MailboxOpcode,
        tag: u32,
        token: u16,
    ) -> Result<u8, MailboxError> {
        let events = self.events.as_mut().expect("event mode checked by the caller");
        let mut waited = 0u64;
        let mut waits = 0u32;
        loop {
            let mut status = None;
            for entry in events.aeq.poll(access)? {
                match entry {
                    EqEntry::MailboxCompletion {
                        token: t, status: s, ..
                    } if t == token => status = Some(s),
                    EqEntry::MailboxCompletion { token: t, .. } => {
                        rnic_diag::warn!(
                            rnic_diag::global(),
                            crate::diag::STALE_MAILBOX_COMPLETION,
                            token = t,
                            expected = token,
                            "stale mailbox completion ignored"
                        );
                    }
                    other => events.others.push(other),
                }
            }
            if let Some(status) = status {
                return Ok(status);
            }
            if waited >= EVENT_TIMEOUT_NS {
                return Err(MailboxError::Timeout {
                    opcode,
                    tag,
                    polls: waits,
                });
            }
            let slice = EVENT_WAIT_SLICE_NS.min(EVENT_TIMEOUT_NS - waited);
            access.wait_interrupt(slice);
            waited += slice;
            waits += 1;
        }
    }
}
