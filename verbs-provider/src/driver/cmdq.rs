//! The firmware command queue (hns §2.2): a ring of 32-byte descriptors in DMA memory.
//!
//! Submit: copy the command's descriptors into the ring at the head (wrapping), write the
//! new head to the producer-index register, poll the consumer index until it reaches the
//! head (1 µs apart, at most [`MAX_POLLS`] times), then read the descriptors back: the
//! firmware wrote each one's return code and response payload in place.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{
    Descriptor, DescriptorFlags, Opcode, ReturnCode, DEFAULT_RING_DEPTH, DESCRIPTOR_DATA_SIZE, DESCRIPTOR_SIZE,
    RING_DEPTH_UNIT,
};
use rnic_firmware_if::regs;

use crate::device_access::{AccessError, DeviceAccess, DmaBuffer};

/// Consumer-index polls before a command is declared lost (hns `HNS_ROCE_CMQ_TX_TIMEOUT`).
pub const MAX_POLLS: u32 = 30_000;
/// Delay between two consumer-index polls, in nanoseconds.
pub const POLL_INTERVAL_NS: u64 = 1_000;

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The firmware did not consume the command in time.
    #[error(
        "command {opcode:?} timed out: consumer index {consumer_index} did not reach \
         {producer_index} after {polls} polls"
    )]
    Timeout {
        /// The command.
        opcode: Opcode,
        /// The producer index written.
        producer_index: u32,
        /// The consumer index last read.
        consumer_index: u32,
        /// Polls made.
        polls: u32,
    },
    /// The firmware executed the command and returned an error code.
    #[error("command {opcode:?} failed: firmware returned {code:?} ({raw}) in descriptor {descriptor}")]
    Failed {
        /// The command.
        opcode: Opcode,
        /// The decoded return code.
        code: ReturnCode,
        /// The raw return value.
        raw: u16,
        /// Which descriptor of the command carried it.
        descriptor: usize,
    },
    /// More descriptors than the ring can hold at once.
    #[error("a command of {count} descriptors does not fit a ring of {depth}")]
    TooLong {
        /// Descriptors in the command.
        count: usize,
        /// Ring depth.
        depth: u32,
    },
    /// The ring memory could not be allocated or accessed.
    #[error("command ring memory: {0}")]
    Memory(#[from] AccessError),
    /// The queue was released (the driver shut down).
    #[error("the command queue was shut down")]
    ShutDown,
}

impl CommandError {
    /// The firmware return code, when the firmware answered with one.
    pub fn return_code(&self) -> Option<ReturnCode> {
        match self {
            Self::Failed { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The command queue: ring memory and the software head.
#[derive(Debug)]
pub struct CommandQueue {
    /// `None` once released.
    ring: Option<DmaBuffer>,
    depth: u32,
    head: u32,
    commands: u64,
}

impl CommandQueue {
    /// Allocates the ring and programs the ring registers (base, depth, then CI = 0 and
    /// PI = 0, in that order as hns does).
    ///
    /// # Errors
    /// [`CommandError::Memory`] when the ring cannot be allocated.
    pub fn new(access: &dyn DeviceAccess) -> Result<Self, CommandError> {
        Self::with_depth(access, DEFAULT_RING_DEPTH)
    }

    /// As [`CommandQueue::new`] with a ring of `depth` descriptors (a multiple of 8).
    ///
    /// # Errors
    /// [`CommandError::Memory`] when the ring cannot be allocated.
    pub fn with_depth(access: &dyn DeviceAccess, depth: u32) -> Result<Self, CommandError> {
        let depth = depth.max(RING_DEPTH_UNIT) / RING_DEPTH_UNIT * RING_DEPTH_UNIT;
        let ring = access.allocate_dma(depth as usize * DESCRIPTOR_SIZE, 4096)?;
        let base = ring.address();
        access.mmio_write32(regs::CONTROL_BAR, regs::CSQ_BASE_LOW, base as u32);
        access.mmio_write32(regs::CONTROL_BAR, regs::CSQ_BASE_HIGH, (base >> 32) as u32);
        access.mmio_write32(regs::CONTROL_BAR, regs::CSQ_DEPTH, depth / RING_DEPTH_UNIT);
        access.mmio_write32(regs::CONTROL_BAR, regs::CSQ_CONSUMER_INDEX, 0);
        access.mmio_write32(regs::CONTROL_BAR, regs::CSQ_PRODUCER_INDEX, 0);
        tracing::debug!(base = format_args!("{base:#x}"), depth, "command queue ready");
        Ok(Self {
            ring: Some(ring),
            depth,
            head: 0,
            commands: 0,
        })
    }

    /// Commands submitted so far.
    pub fn commands_submitted(&self) -> u64 {
        self.commands
    }

    /// Gives the ring memory back. The device must not use the ring any more (reset it
    /// first). Later submissions fail with [`CommandError::ShutDown`].
    pub fn release(&mut self, access: &dyn DeviceAccess) {
        if let Some(ring) = self.ring.take() {
            access.free_dma(ring);
        }
    }

    /// Submits one command made of `descriptors` (flags as given: callers use
    /// [`CommandQueue::execute`] unless they need unusual flags) and replaces each with
    /// the firmware's answer.
    ///
    /// # Errors
    /// [`CommandError::Timeout`], [`CommandError::Failed`] (the first descriptor with a
    /// non-zero return code), [`CommandError::Memory`].
    pub fn submit(&mut self, access: &dyn DeviceAccess, descriptors: &mut [Descriptor]) -> Result<(), CommandError> {
        let count = descriptors.len();
        let opcode = descriptors
            .first()
            .and_then(|d| Opcode::from_raw(d.opcode()))
            .unwrap_or(Opcode::QueryFirmwareVersion);
        let Some(ring_address) = self.ring.as_ref().map(DmaBuffer::address) else {
            return Err(CommandError::ShutDown);
        };
        if count == 0 {
            return Ok(());
        }
        if count as u32 > self.depth {
            return Err(CommandError::TooLong {
                count,
                depth: self.depth,
            });
        }
        let start = self.head;
        for (i, descriptor) in descriptors.iter().enumerate() {
            let slot = (start + i as u32) % self.depth;
            access.dma_write(slot_address(ring_address, slot), descriptor.bytes())?;
        }
        self.head = (start + count as u32) % self.depth;
        self.commands += 1;
        access.mmio_write32(regs::CONTROL_BAR, regs::CSQ_PRODUCER_INDEX, self.head);

        let mut polls = 0;
        let mut consumer_index = access.mmio_read32(regs::CONTROL_BAR, regs::CSQ_CONSUMER_INDEX);
        while consumer_index != self.head {
            if polls >= MAX_POLLS {
                tracing::error!(?opcode, consumer_index, head = self.head, "command timed out");
                let producer_index = self.head;
                // hns: resynchronise the software head with the firmware.
                self.head = consumer_index % self.depth;
                return Err(CommandError::Timeout {
                    opcode,
                    producer_index,
                    consumer_index,
                    polls,
                });
            }
            access.delay(POLL_INTERVAL_NS);
            polls += 1;
            consumer_index = access.mmio_read32(regs::CONTROL_BAR, regs::CSQ_CONSUMER_INDEX);
        }

        for (i, descriptor) in descriptors.iter_mut().enumerate() {
            let slot = (start + i as u32) % self.depth;
            access.dma_read(slot_address(ring_address, slot), &mut descriptor.0)?;
        }
        for (i, descriptor) in descriptors.iter().enumerate() {
            let raw = descriptor.return_value();
            if raw != ReturnCode::Success as u16 {
                return Err(CommandError::Failed {
                    opcode,
                    code: ReturnCode::from_raw(raw),
                    raw,
                    descriptor: i,
                });
            }
        }
        Ok(())
    }

    /// Runs a command of `payloads.len()` descriptors (`NEXT` chained), `read` selecting
    /// the `WR` ("query") flag, and returns the response payloads.
    ///
    /// # Errors
    /// As [`CommandQueue::submit`].
    pub fn execute(
        &mut self,
        access: &dyn DeviceAccess,
        opcode: Opcode,
        read: bool,
        payloads: &[[u8; DESCRIPTOR_DATA_SIZE]],
    ) -> Result<Vec<[u8; DESCRIPTOR_DATA_SIZE]>, CommandError> {
        let mut descriptors: Vec<Descriptor> = payloads
            .iter()
            .enumerate()
            .map(|(i, payload)| {
                let mut flags = DescriptorFlags::IN;
                if read {
                    flags |= DescriptorFlags::WR;
                }
                if i + 1 < payloads.len() {
                    flags |= DescriptorFlags::NEXT;
                }
                let mut d = Descriptor::new(opcode, flags);
                d.data_mut().copy_from_slice(payload);
                d
            })
            .collect();
        self.submit(access, &mut descriptors)?;
        Ok(descriptors.iter().map(|d| *d.data()).collect())
    }

    /// A one-descriptor query: returns the response payload.
    ///
    /// # Errors
    /// As [`CommandQueue::submit`].
    pub fn query(
        &mut self,
        access: &dyn DeviceAccess,
        opcode: Opcode,
    ) -> Result<[u8; DESCRIPTOR_DATA_SIZE], CommandError> {
        Ok(self.execute(access, opcode, true, &[[0; DESCRIPTOR_DATA_SIZE]])?[0])
    }

    /// A one-descriptor write of `payload`.
    ///
    /// # Errors
    /// As [`CommandQueue::submit`].
    pub fn write(
        &mut self,
        access: &dyn DeviceAccess,
        opcode: Opcode,
        payload: &[u8; DESCRIPTOR_DATA_SIZE],
    ) -> Result<[u8; DESCRIPTOR_DATA_SIZE], CommandError> {
        Ok(self.execute(access, opcode, false, std::slice::from_ref(payload))?[0])
    }
}

fn slot_address(ring: u64, slot: u32) -> u64 {
    ring + u64::from(slot) * DESCRIPTOR_SIZE as u64
}
