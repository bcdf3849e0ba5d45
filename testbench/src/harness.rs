//! A register-level harness: the device model, its host memory and a minimal driver
//! written from `docs/register-map.md` alone, independent of `verbs-provider`.
//!
//! Verification tests use it to do what a well-behaved driver never does — unknown
//! opcodes, broken descriptor chains, rings past their end, contexts in the wrong state,
//! tables and page tables pointing at unmapped memory, doorbells for objects that do not
//! exist — and to check what the device answers, byte for byte.
//!
//! Everything it builds is direct (hop 0): each context-table chunk, queue and buffer is
//! one physically contiguous run of frames from a bump allocator.

use std::sync::Arc;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{
    BaseAddressTableAttributes, Descriptor, DescriptorFlags, GidEntry, GidType, Opcode, ReturnCode, SmacEntry,
    DESCRIPTOR_SIZE,
};
use rnic_firmware_if::context::{
    CqArmState, CqState, Cqc, EqArmState, EqState, Eqc, Mpt, MptState, Mtu, QpState, Qpc, ServiceType, Srqc, CQC_SIZE,
    QPC_SIZE,
};
use rnic_firmware_if::cqe::Cqe;
use rnic_firmware_if::doorbell::{CqDoorbell, Doorbell, DB_OFFSET};
use rnic_firmware_if::eqe::Aeqe;
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode, MailboxStatus, PostMailbox, POLL_TOKEN};
use rnic_firmware_if::mtr::QpBufferLayout;
use rnic_firmware_if::wqe::{RcSqWqe, Sge, SqOpcode, UdSqWqe, MAX_INLINE_IN_WQE};
use rnic_firmware_if::{pci, regs};
use rnic_hw_model::fabric::Port;
use rnic_hw_model::interrupt::RecordingSink;
use rnic_hw_model::memory::{Backing, FRAME_SIZE};
use rnic_hw_model::{Device, DeviceConfig, HostMemory, HostMemoryExt, PagedMemory, Picoseconds};

/// Bus address where the harness's DMA memory starts.
pub const DMA_BASE: u64 = 0x1000_0000;
/// Size of the harness's DMA memory.
pub const DMA_SIZE: usize = 32 << 20;
/// Command-queue depth the harness uses.
pub const RING_DEPTH: u32 = 64;
/// Depth of the AEQ and of each CQ the harness creates.
pub const QUEUE_DEPTH: u32 = 64;

/// Why a driver step did not get what a well-behaved device gives a well-behaved driver
/// (after hostile steps broke the setup, say). The `try_` steps return it; the others
/// panic with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The firmware refused a command.
    #[error("{opcode:?}: return code {code:?}")]
    Command {
        /// The command.
        opcode: Opcode,
        /// What the firmware returned.
        code: ReturnCode,
    },
    /// QUERY_MB_ST still said busy after the device settled.
    #[error("the mailbox was still busy after settling")]
    MailboxBusy,
    /// QUERY_MB_ST returned a status no completion has.
    #[error("undefined mailbox completion status {0}")]
    UndefinedStatus(u8),
    /// A mailbox command completed with an error.
    #[error("{what}: {status:?}")]
    Mailbox {
        /// The step.
        what: String,
        /// Its completion.
        status: MailboxCompletion,
    },
    /// The harness's DMA memory is used up.
    #[error("harness DMA memory exhausted")]
    OutOfMemory,
}

/// The device plus a minimal register-level driver.
pub struct RegisterHarness {
    /// The device under test.
    pub device: Device,
    /// Its host memory, as the driver reaches it.
    pub memory: Arc<dyn HostMemory>,
    /// MSI-X messages the device sent.
    pub interrupts: RecordingSink,
    /// End of the DMA memory the allocator hands out.
    dma_end: u64,
    next_free: u64,
    ring: u64,
    producer_index: u32,
    mailbox_in: u64,
    mailbox_out: u64,
    aeq: Option<(u64, u32)>,
    aeq_consumer: u32,
    chunks: [Vec<Option<u64>>; 4],
}

/// A [`RegisterHarness`] at one moment (see [`RegisterHarness::checkpoint`]).
pub struct HarnessCheckpoint {
    device: Device,
    next_free: u64,
    producer_index: u32,
    aeq: Option<(u64, u32)>,
    aeq_consumer: u32,
    chunks: [Vec<Option<u64>>; 4],
}

impl std::fmt::Debug for HarnessCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessCheckpoint")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// The four context tables, in the order of [`RegisterHarness::ensure_context`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// QP contexts.
    Qpc = 0,
    /// Memory regions.
    Mpt = 1,
    /// CQ contexts.
    Cqc = 2,
    /// SRQ contexts.
    Srqc = 3,
}

impl Table {
    fn object_size(self) -> u64 {
        match self {
            Table::Qpc => QPC_SIZE as u64,
            _ => CQC_SIZE as u64,
        }
    }

    fn write_bt0(self) -> MailboxOpcode {
        match self {
            Table::Qpc => MailboxOpcode::WriteQpcBt0,
            Table::Mpt => MailboxOpcode::WriteMptBt0,
            Table::Cqc => MailboxOpcode::WriteCqcBt0,
            Table::Srqc => MailboxOpcode::WriteSrqcBt0,
        }
    }
}

impl Default for RegisterHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl RegisterHarness {
    /// A powered-on device with memory decoding, bus mastering and MSI-X enabled (all
    /// vectors unmasked, vector v writes data v to address 0xFEE0_0000), and an
    /// initialised command queue.
    pub fn new() -> Self {
        Self::with_config(DeviceConfig::default())
    }

    /// [`RegisterHarness::new`] for a device built with `config` (a second NIC on a
    /// fabric needs its own MAC address).
    pub fn with_config(config: DeviceConfig) -> Self {
        Self::with_device_memory(config, |memory| memory)
    }

    /// [`RegisterHarness::with_config`], the device reaching host memory through what
    /// `wrap` makes of the harness's memory (the harness itself uses it directly): for
    /// tests of what happens when DMA misbehaves.
    pub fn with_device_memory(
        config: DeviceConfig,
        wrap: impl FnOnce(Arc<PagedMemory>) -> Arc<dyn HostMemory>,
    ) -> Self {
        let memory = Arc::new(PagedMemory::new());
        let backing = Backing::zeroed(DMA_SIZE);
        memory.map_contiguous(DMA_BASE, &backing, 0, DMA_SIZE / FRAME_SIZE as usize, true);
        Self::with_memory(config, memory.clone(), wrap(memory), DMA_SIZE)
    }

    /// [`RegisterHarness::with_config`] over memory the caller provides: `driver` is how
    /// the harness reaches it, `device` how the device does (the two may differ, e.g. a
    /// device view that checks every DMA access), and `size` bytes from [`DMA_BASE`] are
    /// the harness's to allocate.
    pub fn with_memory(
        config: DeviceConfig,
        driver: Arc<dyn HostMemory>,
        device: Arc<dyn HostMemory>,
        size: usize,
    ) -> Self {
        let interrupts = RecordingSink::new();
        let mut device = Device::new(config, device, Box::new(interrupts.clone()));
        crate::coverage::attach_from_environment(&mut device);
        let mut harness = Self {
            device,
            memory: driver,
            interrupts,
            dma_end: DMA_BASE + size as u64,
            next_free: DMA_BASE,
            ring: 0,
            producer_index: 0,
            mailbox_in: 0,
            mailbox_out: 0,
            aeq: None,
            aeq_consumer: 0,
            chunks: Default::default(),
        };
        let command = pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER;
        harness
            .device
            .config_write(pci::offset::COMMAND, &command.to_le_bytes());
        let control_offset = pci::MSIX_CAPABILITY_OFFSET as usize + 2;
        harness
            .device
            .config_write(control_offset, &pci::MSIX_CONTROL_ENABLE.to_le_bytes());
        for vector in 0..8u64 {
            let entry = vector * regs::MSIX_ENTRY_SIZE;
            harness
                .device
                .bar_write(regs::MSIX_BAR, entry, &0xFEE0_0000u32.to_le_bytes());
            harness
                .device
                .bar_write(regs::MSIX_BAR, entry + 8, &(vector as u32).to_le_bytes());
            harness
                .device
                .bar_write(regs::MSIX_BAR, entry + 12, &0u32.to_le_bytes());
        }
        harness.ring = harness.allocate(RING_DEPTH as usize * DESCRIPTOR_SIZE);
        harness.reinitialize_command_queue();
        harness.mailbox_in = harness.allocate(4096);
        harness.mailbox_out = harness.allocate(4096);
        harness
    }

    /// Programs the command-queue registers as a driver does at initialisation (and as a
    /// driver recovering from a broken queue would), re-enabling memory decoding and bus
    /// mastering first.
    pub fn reinitialize_command_queue(&mut self) {
        let command = pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER;
        self.device.config_write(pci::offset::COMMAND, &command.to_le_bytes());
        self.write_register(regs::CSQ_BASE_LOW, self.ring as u32);
        self.write_register(regs::CSQ_BASE_HIGH, (self.ring >> 32) as u32);
        self.write_register(regs::CSQ_DEPTH, RING_DEPTH / 8);
        self.write_register(regs::CSQ_CONSUMER_INDEX, 0);
        self.write_register(regs::CSQ_PRODUCER_INDEX, 0);
        self.producer_index = self.read_register(regs::CSQ_PRODUCER_INDEX);
    }

    /// Allocates zeroed, 4 KiB-aligned DMA memory.
    pub fn allocate(&mut self, size: usize) -> u64 {
        self.try_allocate(size).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`RegisterHarness::allocate`], or an error when the memory is used up.
    pub fn try_allocate(&mut self, size: usize) -> Result<u64, StepError> {
        let address = self.next_free;
        let size = (size as u64).div_ceil(FRAME_SIZE).max(1) * FRAME_SIZE;
        if address + size > self.dma_end {
            return Err(StepError::OutOfMemory);
        }
        self.next_free += size;
        Ok(address)
    }

    /// Where the next [`RegisterHarness::allocate`] starts.
    pub fn next_free(&self) -> u64 {
        self.next_free
    }

    /// Bus addresses of the command ring and of the mailbox input and output buffers
    /// (one 4 KiB page each).
    pub fn command_buffers(&self) -> (u64, u64, u64) {
        (self.ring, self.mailbox_in, self.mailbox_out)
    }

    /// The device and the driver's bookkeeping as they are now, to return to with
    /// [`RegisterHarness::restore`]. Host memory is not part of it: whoever restores
    /// puts back what changed (see [`Device::fork`]).
    pub fn checkpoint(&self) -> HarnessCheckpoint {
        HarnessCheckpoint {
            device: self.device.fork(Box::new(RecordingSink::new())),
            next_free: self.next_free,
            producer_index: self.producer_index,
            aeq: self.aeq,
            aeq_consumer: self.aeq_consumer,
            chunks: self.chunks.clone(),
        }
    }

    /// Returns the device and the driver's bookkeeping to `checkpoint` (taken from this
    /// harness) and forgets the interrupts recorded since.
    pub fn restore(&mut self, checkpoint: &HarnessCheckpoint) {
        // A fork carries no observers: a restored harness (the fuzzers restore one per
        // input) is not covered.
        self.device = checkpoint.device.fork(Box::new(self.interrupts.clone()));
        self.interrupts.take();
        self.next_free = checkpoint.next_free;
        self.producer_index = checkpoint.producer_index;
        self.aeq = checkpoint.aeq;
        self.aeq_consumer = checkpoint.aeq_consumer;
        self.chunks.clone_from(&checkpoint.chunks);
    }

    /// Writes a BAR0 register.
    pub fn write_register(&mut self, offset: u64, value: u32) {
        self.device.bar_write(regs::CONTROL_BAR, offset, &value.to_le_bytes());
    }

    /// Reads a BAR0 register.
    pub fn read_register(&mut self, offset: u64) -> u32 {
        let mut bytes = [0u8; 4];
        self.device.bar_read(regs::CONTROL_BAR, offset, &mut bytes);
        u32::from_le_bytes(bytes)
    }

    /// Lets the device run until nothing is pending (bounded to one virtual second).
    pub fn settle(&mut self) {
        let limit = self.device.now() + Picoseconds::from_millis(1000);
        self.device.run_until_idle(limit);
    }

    /// The slot the next submitted descriptor goes to (the driver's producer index).
    pub fn producer_index(&self) -> u32 {
        self.producer_index
    }

    /// Writes `descriptors` into the ring, moves the producer index by `producer_step`
    /// (normally the descriptor count), lets the firmware run, and reads the slots back.
    pub fn submit_raw(&mut self, descriptors: &[Descriptor], producer_step: u32) -> Vec<Descriptor> {
        let first = self.producer_index;
        for (i, descriptor) in descriptors.iter().enumerate() {
            let slot = (first + i as u32) % RING_DEPTH;
            self.memory
                .write(self.ring + slot as u64 * DESCRIPTOR_SIZE as u64, descriptor.bytes())
                .unwrap();
        }
        self.producer_index = (first + producer_step) % RING_DEPTH;
        self.write_register(regs::CSQ_PRODUCER_INDEX, self.producer_index);
        self.settle();
        (0..descriptors.len() as u32)
            .map(|i| {
                let slot = (first + i) % RING_DEPTH;
                self.memory
                    .read_layout(self.ring + slot as u64 * DESCRIPTOR_SIZE as u64)
                    .unwrap()
            })
            .collect()
    }

    /// Runs one single-descriptor command; returns its return code and response payload.
    pub fn command(&mut self, opcode: Opcode, read: bool, payload: &[u8; 24]) -> (ReturnCode, [u8; 24]) {
        let mut flags = DescriptorFlags::IN;
        if read {
            flags |= DescriptorFlags::WR;
        }
        let mut descriptor = Descriptor::new(opcode, flags);
        descriptor.data_mut().copy_from_slice(payload);
        let response = self.submit_raw(&[descriptor], 1)[0];
        (ReturnCode::from_raw(response.return_value()), *response.data())
    }

    /// Posts a mailbox command with the given parameters, waits for it, and returns its
    /// completion status.
    pub fn mailbox_raw(&mut self, opcode: u8, tag: u32, in_param: u64, out_param: u64) -> MailboxCompletion {
        self.try_mailbox_raw(opcode, tag, in_param, out_param)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`RegisterHarness::mailbox_raw`], or why the device did not complete it.
    pub fn try_mailbox_raw(
        &mut self,
        opcode: u8,
        tag: u32,
        in_param: u64,
        out_param: u64,
    ) -> Result<MailboxCompletion, StepError> {
        let mut post = PostMailbox::zeroed();
        post.set_command(opcode);
        post.set_tag(tag);
        post.set_in_param(in_param);
        post.set_out_param(out_param);
        post.set_token(POLL_TOKEN);
        self.checked_command(Opcode::PostMailbox, false, &post.0)?;
        let response = self.checked_command(Opcode::QueryMailboxStatus, true, &[0; 24])?;
        let status = MailboxStatus::parse(&response).map_err(|_| StepError::UndefinedStatus(0))?;
        if status.busy() {
            return Err(StepError::MailboxBusy);
        }
        MailboxCompletion::from_raw(status.status()).ok_or(StepError::UndefinedStatus(status.status()))
    }

    /// [`RegisterHarness::command`], its response when it succeeded.
    fn checked_command(&mut self, opcode: Opcode, read: bool, payload: &[u8; 24]) -> Result<[u8; 24], StepError> {
        match self.command(opcode, read, payload) {
            (ReturnCode::Success, response) => Ok(response),
            (code, _) => Err(StepError::Command { opcode, code }),
        }
    }

    /// A mailbox command that must succeed.
    fn expect_success(&mut self, what: impl FnOnce() -> String, status: MailboxCompletion) -> Result<(), StepError> {
        match status {
            MailboxCompletion::Success => Ok(()),
            status => Err(StepError::Mailbox { what: what(), status }),
        }
    }

    /// [`RegisterHarness::mailbox_with`], or why the device did not complete it.
    pub fn try_mailbox_with<L: Layout>(
        &mut self,
        opcode: MailboxOpcode,
        tag: u32,
        context: &L,
        mask: Option<&L>,
    ) -> Result<MailboxCompletion, StepError> {
        self.memory.write_layout(self.mailbox_in, context).unwrap();
        if let Some(mask) = mask {
            self.memory
                .write_layout(self.mailbox_in + L::SIZE as u64, mask)
                .unwrap();
        }
        self.try_mailbox_raw(opcode as u8, tag, self.mailbox_in, 0)
    }

    /// Posts a mailbox command whose input is `context` (‖ `mask` for modifies).
    pub fn mailbox_with<L: Layout>(
        &mut self,
        opcode: MailboxOpcode,
        tag: u32,
        context: &L,
        mask: Option<&L>,
    ) -> MailboxCompletion {
        self.memory.write_layout(self.mailbox_in, context).unwrap();
        if let Some(mask) = mask {
            self.memory
                .write_layout(self.mailbox_in + L::SIZE as u64, mask)
                .unwrap();
        }
        self.mailbox_raw(opcode as u8, tag, self.mailbox_in, 0)
    }

    /// Queries a context into the out mailbox and returns it.
    pub fn query<L: Layout>(&mut self, opcode: MailboxOpcode, tag: u32) -> (MailboxCompletion, L) {
        let status = self.mailbox_raw(opcode as u8, tag, 0, self.mailbox_out);
        (status, self.memory.read_layout(self.mailbox_out).unwrap())
    }

    /// Configures every context table as hop 0 with 4 KiB BT pages and 64 KiB chunks.
    pub fn configure_tables(&mut self) {
        self.try_configure_tables().unwrap_or_else(|error| panic!("{error}"));
    }

    /// [`RegisterHarness::configure_tables`], or why the device refused.
    pub fn try_configure_tables(&mut self) -> Result<(), StepError> {
        let mut attributes = BaseAddressTableAttributes::zeroed();
        attributes.set_qpc_buffer_page_size(4);
        attributes.set_mpt_buffer_page_size(4);
        attributes.set_cqc_buffer_page_size(4);
        attributes.set_srqc_buffer_page_size(4);
        self.checked_command(Opcode::ConfigBaseAddressTableAttributes, false, &attributes.0)
            .map(drop)
    }

    /// Makes sure the chunk holding object `index` of `table` exists and its L0 slot is
    /// written (hop 0: the slot holds the chunk address).
    pub fn ensure_context(&mut self, table: Table, index: u32) {
        self.try_ensure_context(table, index)
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// [`RegisterHarness::ensure_context`], or why the device refused.
    pub fn try_ensure_context(&mut self, table: Table, index: u32) -> Result<(), StepError> {
        const CHUNK: u64 = 64 << 10;
        let chunk_index = (index as u64 * table.object_size() / CHUNK) as usize;
        let chunks = &mut self.chunks[table as usize];
        if chunks.len() <= chunk_index {
            chunks.resize(chunk_index + 1, None);
        }
        if chunks[chunk_index].is_none() {
            let address = self.try_allocate(CHUNK as usize)?;
            self.chunks[table as usize][chunk_index] = Some(address);
            let status = self.try_mailbox_raw(table.write_bt0() as u8, index, address, 0)?;
            self.expect_success(|| format!("WRITE_BT0 for {table:?} {index}"), status)?;
        }
        Ok(())
    }

    /// Host address of object `index` of `table`, once [`RegisterHarness::ensure_context`]
    /// made its chunk (a driver that writes a context behind the device's back uses it).
    pub fn context_address(&self, table: Table, index: u32) -> Option<u64> {
        const CHUNK: u64 = 64 << 10;
        let offset = u64::from(index) * table.object_size();
        let chunk = self.chunks[table as usize]
            .get((offset / CHUNK) as usize)
            .copied()
            .flatten()?;
        Some(chunk + offset % CHUNK)
    }

    /// Whether [`RegisterHarness::create_aeq`] has run.
    pub fn has_aeq(&self) -> bool {
        self.aeq.is_some()
    }

    /// Creates the AEQ (EQN = number of CEQs) with interrupts enabled; returns its EQN.
    pub fn create_aeq(&mut self) -> u32 {
        self.try_create_aeq().unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`RegisterHarness::create_aeq`], or why the device refused.
    pub fn try_create_aeq(&mut self) -> Result<u32, StepError> {
        let eqn = self.device.config().caps.num_ceqs as u32;
        let buffer = self.try_allocate(QUEUE_DEPTH as usize * 16)?;
        let mut eqc = Eqc::zeroed();
        eqc.set_eq_state(EqState::Valid);
        eqc.set_arm_state(EqArmState::AlwaysArmed);
        eqc.set_shift(QUEUE_DEPTH.trailing_zeros() as u8);
        eqc.set_eqe_base_address(buffer >> 3);
        let status = self.try_mailbox_with(MailboxOpcode::CreateAeqc, eqn, &eqc, None)?;
        self.expect_success(|| format!("CREATE_AEQC {eqn}"), status)?;
        self.write_register(regs::event_int_enable(eqn), 1);
        self.aeq = Some((buffer, eqn));
        Ok(eqn)
    }

    /// Creates CEQ 0 and CQ `cqn` (hop 0, 64-byte CQEs, depth [`QUEUE_DEPTH`]); returns
    /// the CQE buffer address.
    pub fn create_cq(&mut self, cqn: u32) -> u64 {
        self.try_create_cq(cqn).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`RegisterHarness::create_cq`], or why the device refused.
    pub fn try_create_cq(&mut self, cqn: u32) -> Result<u64, StepError> {
        self.try_ensure_context(Table::Cqc, cqn)?;
        if self.device.counters().eqes == 0 && !self.ceq_created()? {
            let ceq = self.try_allocate(QUEUE_DEPTH as usize * 4)?;
            let mut eqc = Eqc::zeroed();
            eqc.set_eq_state(EqState::Valid);
            eqc.set_arm_state(EqArmState::AlwaysArmed);
            eqc.set_shift(QUEUE_DEPTH.trailing_zeros() as u8);
            eqc.set_eqe_base_address(ceq >> 3);
            let status = self.try_mailbox_with(MailboxOpcode::CreateCeqc, 0, &eqc, None)?;
            self.expect_success(|| "CREATE_CEQC 0".into(), status)?;
            self.write_register(regs::event_int_enable(0), 1);
        }
        let buffer = self.try_allocate(QUEUE_DEPTH as usize * 64)?;
        let status = self.try_mailbox_with(MailboxOpcode::CreateCqc, cqn, &Self::cq_context(cqn, buffer), None)?;
        self.expect_success(|| format!("CREATE_CQC {cqn}"), status)?;
        Ok(buffer)
    }

    fn ceq_created(&mut self) -> Result<bool, StepError> {
        let status = self.try_mailbox_raw(MailboxOpcode::QueryCeqc as u8, 0, 0, self.mailbox_out)?;
        Ok(status == MailboxCompletion::Success)
    }

    /// A valid CQC for CQ `cqn` with a direct CQE buffer at `buffer`.
    pub fn cq_context(cqn: u32, buffer: u64) -> Cqc {
        let mut cqc = Cqc::zeroed();
        cqc.set_cq_number(cqn);
        cqc.set_cq_state_raw(CqState::Valid as u8);
        cqc.set_arm_state_raw(CqArmState::NoArmed as u8);
        cqc.set_shift(QUEUE_DEPTH.trailing_zeros() as u8);
        cqc.set_cqe_size_raw(1);
        cqc.set_cqe_base_address(buffer >> 3);
        cqc
    }

    /// Creates RC QP `qpn` on CQ `cqn` and moves it RESET→INIT→RTR→RTS. The WQE buffer
    /// (64 SQ WQEs, 64 RQ WQEs of one SGE) is returned.
    pub fn create_connected_qp(&mut self, qpn: u32, cqn: u32) -> u64 {
        self.try_create_connected_qp(qpn, cqn)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`RegisterHarness::create_connected_qp`], or why the device refused.
    pub fn try_create_connected_qp(&mut self, qpn: u32, cqn: u32) -> Result<u64, StepError> {
        self.try_ensure_context(Table::Qpc, qpn)?;
        let buffer = self.try_allocate(2 * 4096)?;
        let mut init = Qpc::zeroed();
        init.set_qp_state(QpState::Init);
        init.set_service_type(ServiceType::Rc);
        init.set_protection_domain(1);
        init.set_sq_shift(6);
        init.set_rq_shift(6);
        init.set_send_cq_number(cqn);
        init.set_receive_cq_number(cqn);
        let status = self.try_mailbox_with(MailboxOpcode::ModifyQpc, qpn, &init, Some(&Qpc::zeroed()))?;
        self.expect_success(|| format!("QP {qpn} RESET->INIT"), status)?;
        let mut rtr = Qpc::zeroed();
        let mut mask = Qpc::all_ones();
        rtr.set_qp_state(QpState::Rtr);
        mask.open_field(Qpc::QP_ST);
        rtr.set_mtu(Mtu::Mtu1024);
        mask.open_field(Qpc::MTU);
        rtr.set_wqe_sge_base_address(buffer >> 3);
        mask.open_field(Qpc::WQE_SGE_BA);
        rtr.set_destination_qpn(qpn);
        mask.open_field(Qpc::DQPN);
        let status = self.try_mailbox_with(MailboxOpcode::ModifyQpc, qpn, &rtr, Some(&mask))?;
        self.expect_success(|| format!("QP {qpn} INIT->RTR"), status)?;
        let mut rts = Qpc::zeroed();
        let mut mask = Qpc::all_ones();
        rts.set_qp_state(QpState::Rts);
        mask.open_field(Qpc::QP_ST);
        let status = self.try_mailbox_with(MailboxOpcode::ModifyQpc, qpn, &rts, Some(&mask))?;
        self.expect_success(|| format!("QP {qpn} RTR->RTS"), status)?;
        Ok(buffer)
    }

    /// MODIFY_QPC with a context and mask.
    pub fn modify_qp(&mut self, qpn: u32, context: &Qpc, mask: &Qpc) -> MailboxCompletion {
        self.mailbox_with(MailboxOpcode::ModifyQpc, qpn, context, Some(mask))
    }

    /// MODIFY_QPC changing only the state.
    pub fn move_qp(&mut self, qpn: u32, state: QpState) -> MailboxCompletion {
        let mut context = Qpc::zeroed();
        let mut mask = Qpc::all_ones();
        context.set_qp_state(state);
        mask.open_field(Qpc::QP_ST);
        self.modify_qp(qpn, &context, &mask)
    }

    /// Writes a 64-bit doorbell to page 0.
    pub fn ring_doorbell(&mut self, word: u64) {
        self.device
            .bar_write(regs::DOORBELL_BAR, DB_OFFSET, &word.to_le_bytes());
        self.settle();
    }

    /// Rings the SQ doorbell of `qpn`.
    pub fn ring_sq(&mut self, qpn: u32, producer_index: u16) {
        self.ring_doorbell(Doorbell::sq(qpn, producer_index, 0).as_u64());
    }

    /// Arms CQ `cqn` for the next completion.
    pub fn arm_cq(&mut self, cqn: u32, consumer_index: u32) {
        self.ring_doorbell(CqDoorbell::arm(cqn, consumer_index, 1, false).as_u64());
    }

    /// Reads CQE `index` of a 64-byte-CQE ring at `buffer`.
    pub fn read_cqe(&self, buffer: u64, index: u32) -> Cqe {
        self.memory
            .read_layout(buffer + (index % QUEUE_DEPTH) as u64 * 64)
            .unwrap()
    }

    /// Takes the AEQEs the device wrote since the last call (owner-bit rule).
    pub fn take_async_events(&mut self) -> Vec<Aeqe> {
        let Some((buffer, _)) = self.aeq else { return Vec::new() };
        let mut events = Vec::new();
        loop {
            let index = self.aeq_consumer;
            let entry: Aeqe = self
                .memory
                .read_layout(buffer + (index % QUEUE_DEPTH) as u64 * 16)
                .unwrap();
            let valid = entry.owner() ^ (index & QUEUE_DEPTH != 0);
            if !valid {
                break;
            }
            events.push(entry);
            self.aeq_consumer += 1;
        }
        events
    }

    /// The newest diagnostic as text.
    pub fn last_diagnostic(&self) -> String {
        self.device
            .diagnostics()
            .last()
            .map(|d| d.to_string())
            .unwrap_or_default()
    }

    /// Writes a raw 64-bit value into DMA memory (to build SQ WQEs and the like).
    pub fn write_u64(&self, address: u64, value: u64) {
        self.memory.write_u64(address, value).unwrap();
    }
}

// ---- transport helpers ---------------------------------------------------------------------
//
// Enough of a driver to run RDMA traffic through the register interface: GID and SMAC
// tables, memory regions (physical or through a one-level PBL), fully configured QPs
// (every attribute written at RESET→INIT, then RTR and RTS), SRQs, send WQEs of every
// kind (SGEs in the WQE and in the extended SGE ring, inline data in the WQE or in the
// ring), receive WQEs and CQ polling. Doorbells here do not settle the device: during
// traffic the fabric owns virtual time.

/// Remote and local rights of a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Local write (the device writes received data).
    pub local_write: bool,
    /// Remote read.
    pub remote_read: bool,
    /// Remote write.
    pub remote_write: bool,
    /// Remote atomic.
    pub remote_atomic: bool,
}

impl Access {
    /// Every right.
    pub const ALL: Access = Access {
        local_write: true,
        remote_read: true,
        remote_write: true,
        remote_atomic: true,
    };
    /// Local read only.
    pub const LOCAL_READ: Access = Access {
        local_write: false,
        remote_read: false,
        remote_write: false,
        remote_atomic: false,
    };
    /// Local write only.
    pub const LOCAL_WRITE: Access = Access {
        local_write: true,
        remote_read: false,
        remote_write: false,
        remote_atomic: false,
    };
}

/// How a region's IOVAs map to bus addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrMode {
    /// Physical addressing: the IOVA is the bus address.
    Physical,
    /// A one-level PBL of 4 KiB pages; the region starts at this IOVA (any offset in the
    /// first page).
    Pbl {
        /// First IOVA of the region.
        iova: u64,
    },
}

/// A registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    /// L_Key = R_Key.
    pub key: u32,
    /// First IOVA.
    pub iova: u64,
    /// Bus address of the first byte.
    pub bus: u64,
    /// Length in bytes.
    pub length: u64,
    /// Protection domain.
    pub pd: u32,
}

impl MemoryRegion {
    /// The IOVA of byte `offset`.
    pub fn at(&self, offset: u64) -> u64 {
        self.iova + offset
    }

    /// An SGE for `length` bytes from byte `offset`.
    pub fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge::new(length, self.key, self.at(offset))
    }
}

/// What a QP is created with. [`QpSpec::rc`] gives working defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpSpec {
    /// QP number.
    pub qpn: u32,
    /// RC, UC or UD.
    pub service: ServiceType,
    /// Protection domain.
    pub pd: u32,
    /// CQ of send completions.
    pub send_cq: u32,
    /// CQ of receive completions.
    pub recv_cq: u32,
    /// log2 SQ depth.
    pub sq_shift: u8,
    /// log2 RQ depth.
    pub rq_shift: u8,
    /// log2 SGE slots per RQ WQE.
    pub rq_sge_shift: u8,
    /// log2 extended SGE slots (0: none).
    pub sge_shift: u8,
    /// The SRQ receives come from.
    pub srq: Option<u32>,
    /// Path MTU.
    pub mtu: Mtu,
    /// Remote QPN.
    pub dest_qpn: u32,
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID index.
    pub sgid_index: u16,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// VLAN ID (0xFFF: untagged).
    pub vlan_id: u16,
    /// Initial send PSN.
    pub sq_psn: u32,
    /// Initial expected receive PSN.
    pub rq_psn: u32,
    /// Local ACK timeout (4.096 µs × 2^n, 0 = none).
    pub ack_timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code the responder sends.
    pub min_rnr_timer: u8,
    /// log2 outstanding READ/atomic as requester (SR_MAX).
    pub sr_max: u8,
    /// log2 responder resources (RR_MAX).
    pub rr_max: u8,
    /// QP access: remote read.
    pub remote_read: bool,
    /// QP access: remote write.
    pub remote_write: bool,
    /// QP access: remote atomic.
    pub remote_atomic: bool,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Every WQE completes (SIG_TYPE 0).
    pub signal_all: bool,
    /// RQ record doorbell address (RQ_RECORD_EN): receives publish their head there
    /// instead of ringing the RQ doorbell.
    pub rq_record: Option<u64>,
}

impl QpSpec {
    /// An RC QP `qpn` on CQ `cq` talking to `dest_qpn`, everything allowed, MTU 1024,
    /// PSNs 0, ACK timeout 14 (67 ms), 7 retries, RNR retry 7 (infinite).
    pub fn rc(qpn: u32, cq: u32, dest_qpn: u32) -> Self {
        Self {
            qpn,
            service: ServiceType::Rc,
            pd: 1,
            send_cq: cq,
            recv_cq: cq,
            sq_shift: 6,
            rq_shift: 6,
            rq_sge_shift: 2,
            sge_shift: 8,
            srq: None,
            mtu: Mtu::Mtu1024,
            dest_qpn,
            dmac: [0; 6],
            dgid: [0; 16],
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            vlan_id: 0xFFF,
            sq_psn: 0,
            rq_psn: 0,
            ack_timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            sr_max: 4,
            rr_max: 4,
            remote_read: true,
            remote_write: true,
            remote_atomic: true,
            qkey: 0,
            signal_all: true,
            rq_record: None,
        }
    }
}

/// A QP the harness created, with the host-side ring state of its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePair {
    /// QP number.
    pub qpn: u32,
    /// The spec it was created with.
    pub spec: QpSpec,
    /// Bus address of the WQE buffer.
    pub buffer: u64,
    /// Byte offsets of the SQ, extended SGE and RQ regions.
    pub region_offsets: [u64; 3],
    /// Next SQ index to post (free-running).
    pub sq_head: u32,
    /// Next RQ index to post (free-running).
    pub rq_head: u32,
    /// Next extended SGE slot (free-running).
    pub sge_head: u32,
}

impl QueuePair {
    /// SQ depth.
    pub fn sq_depth(&self) -> u32 {
        1 << self.spec.sq_shift
    }

    /// RQ depth.
    pub fn rq_depth(&self) -> u32 {
        1 << self.spec.rq_shift
    }

    /// Extended SGE slots.
    pub fn sge_slots(&self) -> u32 {
        if self.spec.sge_shift == 0 {
            0
        } else {
            1 << self.spec.sge_shift
        }
    }

    /// Bus address of SQ WQE `index`.
    pub fn sq_wqe_address(&self, index: u32) -> u64 {
        self.buffer + self.region_offsets[0] + u64::from(index & (self.sq_depth() - 1)) * 64
    }

    /// Bus address of extended SGE slot `slot`.
    pub fn sge_address(&self, slot: u32) -> u64 {
        self.buffer + self.region_offsets[1] + u64::from(slot & (self.sge_slots() - 1)) * 16
    }

    /// Bus address of RQ WQE `index`.
    pub fn rq_wqe_address(&self, index: u32) -> u64 {
        let stride = 16u64 << self.spec.rq_sge_shift;
        self.buffer + self.region_offsets[2] + u64::from(index & (self.rq_depth() - 1)) * stride
    }
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDestination {
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Destination QPN.
    pub dest_qpn: u32,
    /// Q_Key (bit 31 set: the QP's own).
    pub qkey: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendRequest {
    /// Operation.
    pub opcode: SqOpcode,
    /// Local buffers (or, with `inline`, ignored).
    pub sges: Vec<Sge>,
    /// Inline payload.
    pub inline: Option<Vec<u8>>,
    /// Generate a CQE (IB_SEND_SIGNALED).
    pub signaled: bool,
    /// FENCE.
    pub fence: bool,
    /// Solicited event.
    pub solicited: bool,
    /// Immediate data, or the rkey for SEND_WITH_INV.
    pub immediate: u32,
    /// Remote address (RDMA, atomics).
    pub remote_va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap / add operand.
    pub swap_add: u64,
    /// Compare operand.
    pub compare: u64,
    /// UD destination.
    pub ud: Option<UdDestination>,
}

impl SendRequest {
    /// A signaled request of `opcode` over `sges`.
    pub fn new(opcode: SqOpcode, sges: Vec<Sge>) -> Self {
        Self {
            opcode,
            sges,
            inline: None,
            signaled: true,
            fence: false,
            solicited: false,
            immediate: 0,
            remote_va: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
            ud: None,
        }
    }

    /// An RDMA request to `remote_va` with `rkey`.
    pub fn rdma(opcode: SqOpcode, sges: Vec<Sge>, remote_va: u64, rkey: u32) -> Self {
        Self {
            remote_va,
            rkey,
            ..Self::new(opcode, sges)
        }
    }

    /// Sum of the SGE lengths (or the inline length).
    pub fn length(&self) -> u32 {
        match &self.inline {
            Some(data) => data.len() as u32,
            None => self.sges.iter().map(|s| s.length()).sum(),
        }
    }
}

/// A CQ the harness polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionQueue {
    /// CQ number.
    pub cqn: u32,
    /// Bus address of the CQE buffer (64-byte CQEs).
    pub buffer: u64,
    /// Depth.
    pub depth: u32,
    /// Consumer index (free-running).
    pub consumer: u32,
}

/// An SRQ the harness posts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedReceiveQueue {
    /// SRQ number.
    pub srqn: u32,
    /// WQE buffer.
    pub wqe_buffer: u64,
    /// Index queue.
    pub index_buffer: u64,
    /// Depth.
    pub depth: u32,
    /// log2 SGE slots per WQE.
    pub sge_shift: u8,
    /// Index-queue head (free-running).
    pub head: u32,
    /// Next WQE slot to fill.
    pub next_slot: u32,
}

impl RegisterHarness {
    /// Writes GID table entry `index` (type from the GID: IPv4-mapped or IPv6).
    pub fn set_gid(&mut self, index: u8, gid: [u8; 16]) {
        let mut entry = GidEntry::zeroed();
        entry.set_index(index);
        entry.set_gid(gid);
        let v4 = gid[..10] == [0; 10] && gid[10..12] == [0xFF, 0xFF];
        entry.set_gid_type(if v4 { GidType::RoceV2Ipv4 } else { GidType::RoceV2Ipv6 } as u8);
        let (code, _) = self.command(Opcode::ConfigGidTable, false, &entry.0);
        assert_eq!(code, ReturnCode::Success, "CFG_SGID_TB {index}");
    }

    /// Writes SMAC table entry `index`.
    pub fn set_smac(&mut self, index: u8, mac: [u8; 6]) {
        let mut entry = SmacEntry::zeroed();
        entry.set_index(index);
        entry.set_mac(mac);
        let (code, _) = self.command(Opcode::ConfigSmacTable, false, &entry.0);
        assert_eq!(code, ReturnCode::Success, "CFG_SMAC_TB {index}");
    }

    /// The device's port MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.device.config().mac_address
    }

    /// Fills `length` bytes of zeroed DMA memory and returns its bus address.
    pub fn allocate_filled(&mut self, length: usize, fill: impl Fn(usize) -> u8) -> u64 {
        let address = self.allocate(length);
        let bytes: Vec<u8> = (0..length).map(fill).collect();
        self.memory.write(address, &bytes).unwrap();
        address
    }

    /// Reads `length` bytes of DMA memory.
    pub fn read_bytes(&self, address: u64, length: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; length];
        self.memory.read(address, &mut bytes).unwrap();
        bytes
    }

    /// Registers MPT `index` over `length` bytes at bus address `bus` in `pd` with
    /// `access`, physically addressed or through a one-level PBL.
    pub fn register_mr(
        &mut self,
        index: u32,
        bus: u64,
        length: u64,
        pd: u32,
        access: Access,
        mode: MrMode,
    ) -> MemoryRegion {
        self.ensure_context(Table::Mpt, index);
        let key = index.rotate_left(8);
        let mut mpt = Mpt::zeroed();
        mpt.set_mpt_state_raw(MptState::Valid as u8);
        mpt.set_protection_domain(pd);
        mpt.set_local_write_enable(access.local_write);
        mpt.set_remote_read_enable(access.remote_read);
        mpt.set_remote_write_enable(access.remote_write);
        mpt.set_atomic_enable(access.remote_atomic);
        mpt.set_length(length);
        mpt.set_lkey(key);
        let iova = match mode {
            MrMode::Physical => {
                mpt.set_physical_address(true);
                mpt.set_virtual_address(bus);
                bus
            }
            MrMode::Pbl { iova } => {
                let in_page = iova & (FRAME_SIZE - 1);
                assert_eq!(
                    bus & (FRAME_SIZE - 1),
                    in_page,
                    "bus address and IOVA share the page offset"
                );
                let first_page = bus - in_page;
                let pages = (in_page + length).div_ceil(FRAME_SIZE).max(1);
                let pbl = self.allocate((pages as usize * 8).next_power_of_two());
                for page in 0..pages {
                    self.memory
                        .write_u64(pbl + page * 8, first_page + page * FRAME_SIZE)
                        .unwrap();
                }
                mpt.set_pbl_hop_number(1);
                // One root BT page must hold every page address: grow it past 4 KiB.
                let bt_shift = (pages * 8).next_power_of_two().trailing_zeros().max(12);
                mpt.set_pbl_ba_page_size((bt_shift - 12) as u8);
                mpt.set_pbl_base_address(pbl >> 3);
                mpt.set_pbl_size(pages as u32);
                mpt.set_virtual_address(iova);
                iova
            }
        };
        let status = self.mailbox_with(MailboxOpcode::CreateMpt, index, &mpt, None);
        assert_eq!(
            status,
            MailboxCompletion::Success,
            "CREATE_MPT {index}: {}",
            self.last_diagnostic()
        );
        MemoryRegion {
            key,
            iova,
            bus,
            length,
            pd,
        }
    }

    /// Creates CQ `cqn` of `depth` 64-byte CQEs (and CEQ 0 with it if needed).
    pub fn create_polled_cq(&mut self, cqn: u32, depth: u32) -> CompletionQueue {
        self.ensure_context(Table::Cqc, cqn);
        if !self.ceq_created().unwrap_or_else(|error| panic!("{error}")) {
            let ceq = self.allocate(QUEUE_DEPTH as usize * 4);
            let mut eqc = Eqc::zeroed();
            eqc.set_eq_state(EqState::Valid);
            eqc.set_arm_state(EqArmState::AlwaysArmed);
            eqc.set_shift(QUEUE_DEPTH.trailing_zeros() as u8);
            eqc.set_eqe_base_address(ceq >> 3);
            assert_eq!(
                self.mailbox_with(MailboxOpcode::CreateCeqc, 0, &eqc, None),
                MailboxCompletion::Success
            );
            self.write_register(regs::event_int_enable(0), 1);
        }
        let buffer = self.allocate(depth as usize * 64);
        let mut cqc = Self::cq_context(cqn, buffer);
        cqc.set_shift(depth.trailing_zeros() as u8);
        let status = self.mailbox_with(MailboxOpcode::CreateCqc, cqn, &cqc, None);
        assert_eq!(status, MailboxCompletion::Success, "CREATE_CQC {cqn}");
        CompletionQueue {
            cqn,
            buffer,
            depth,
            consumer: 0,
        }
    }

    /// Takes the new CQEs of `cq` and publishes the consumer index (set-CI doorbell,
    /// without settling).
    pub fn poll_cq(&mut self, cq: &mut CompletionQueue) -> Vec<Cqe> {
        let mut cqes = Vec::new();
        loop {
            let address = cq.buffer + u64::from(cq.consumer & (cq.depth - 1)) * 64;
            let cqe: Cqe = self.memory.read_layout(address).unwrap();
            if !(cqe.owner() ^ (cq.consumer & cq.depth != 0)) {
                break;
            }
            cqes.push(cqe);
            cq.consumer = cq.consumer.wrapping_add(1);
        }
        if !cqes.is_empty() {
            self.doorbell(CqDoorbell::update(cq.cqn, cq.consumer & 0xFF_FFFF).as_u64());
        }
        cqes
    }

    /// Writes a 64-bit doorbell to page 0 without letting the device run.
    pub fn doorbell(&mut self, word: u64) {
        self.device
            .bar_write(regs::DOORBELL_BAR, DB_OFFSET, &word.to_le_bytes());
    }

    /// Creates QP `spec.qpn` and moves it RESET→INIT→RTR→RTS (UD/UC/RC alike). Every
    /// attribute is written at RESET→INIT; the later steps change only the state.
    pub fn create_qp(&mut self, spec: &QpSpec) -> QueuePair {
        self.create_qp_in(spec, QpState::Rts)
    }

    /// [`RegisterHarness::create_qp`], stopping at `target` (INIT, RTR or RTS).
    pub fn create_qp_in(&mut self, spec: &QpSpec, target: QpState) -> QueuePair {
        self.ensure_context(Table::Qpc, spec.qpn);
        let layout = QpBufferLayout::from_shifts(
            u32::from(spec.sq_shift),
            u32::from(spec.sge_shift),
            u32::from(spec.rq_shift),
            u32::from(spec.rq_sge_shift),
            spec.srq.is_some(),
        );
        let pages = layout.page_counts(12).iter().sum::<u64>().max(1);
        let buffer = self.allocate(pages as usize * 4096);
        let mut qpc = Qpc::zeroed();
        qpc.set_qp_state(QpState::Init);
        qpc.set_service_type(spec.service);
        qpc.set_protection_domain(spec.pd);
        qpc.set_sq_shift(spec.sq_shift);
        qpc.set_rq_shift(spec.rq_shift);
        qpc.set_rq_max_sge_shift(spec.rq_sge_shift);
        qpc.set_sge_shift(spec.sge_shift);
        qpc.set_send_cq_number(spec.send_cq);
        qpc.set_receive_cq_number(spec.recv_cq);
        if let Some(srqn) = spec.srq {
            qpc.set_srq_enable(true);
            qpc.set_srq_number(srqn);
        }
        qpc.set_wqe_sge_base_address(buffer >> 3);
        qpc.set_mtu(spec.mtu);
        qpc.set_destination_qpn(spec.dest_qpn);
        qpc.set_dmac(spec.dmac);
        qpc.set_dgid(spec.dgid);
        qpc.set_sgid_index(spec.sgid_index);
        qpc.set_hop_limit(spec.hop_limit);
        qpc.set_traffic_class(spec.traffic_class);
        qpc.set_flow_label(spec.flow_label);
        qpc.set_vlan_id(spec.vlan_id);
        qpc.set_sq_current_psn(spec.sq_psn);
        qpc.set_sq_max_psn(spec.sq_psn);
        qpc.set_rx_ack_expected_psn(spec.sq_psn);
        qpc.set_rx_request_expected_psn(spec.rq_psn);
        qpc.set_raq_psn(spec.rq_psn.wrapping_sub(1) & 0xFF_FFFF);
        qpc.set_ack_timeout(spec.ack_timeout);
        qpc.set_retry_count_init(spec.retry_cnt);
        qpc.set_retry_count(spec.retry_cnt);
        qpc.set_rnr_retry_init(spec.rnr_retry);
        qpc.set_rnr_retry_count(spec.rnr_retry);
        qpc.set_min_rnr_timer(spec.min_rnr_timer);
        qpc.set_initiator_depth_log2(spec.sr_max);
        qpc.set_responder_resources_log2(spec.rr_max);
        qpc.set_remote_read_enable(spec.remote_read);
        qpc.set_remote_write_enable(spec.remote_write);
        qpc.set_remote_atomic_enable(spec.remote_atomic);
        qpc.set_qkey_xrcd(spec.qkey);
        qpc.set_signal_requested_only(!spec.signal_all);
        qpc.set_fast_register_enable(true);
        if let Some(record) = spec.rq_record {
            qpc.set_rq_record_enable(true);
            qpc.set_rq_record_address(record);
        }
        assert_eq!(
            self.modify_qp(spec.qpn, &qpc, &Qpc::zeroed()),
            MailboxCompletion::Success,
            "RESET->INIT of QP {}",
            spec.qpn
        );
        for state in [QpState::Rtr, QpState::Rts] {
            if u8::from(state) > u8::from(target) {
                break;
            }
            assert_eq!(
                self.move_qp(spec.qpn, state),
                MailboxCompletion::Success,
                "QP {} to {state:?}",
                spec.qpn
            );
        }
        QueuePair {
            qpn: spec.qpn,
            spec: *spec,
            buffer,
            region_offsets: layout.region_offsets(12),
            sq_head: 0,
            rq_head: 0,
            sge_head: 0,
        }
    }

    /// Writes `request` as the next SQ WQE of `qp` (RC/UC or UD layout) and returns its
    /// index; ring the doorbell with [`RegisterHarness::ring_send`].
    pub fn post_send(&mut self, qp: &mut QueuePair, request: &SendRequest) -> u32 {
        let index = qp.sq_head;
        let owner = rnic_firmware_if::wqe::sq_owner_bit(index, qp.sq_depth());
        let ud = qp.spec.service == ServiceType::Ud;
        let mut raw = [0u8; 64];
        // Common header bits (the RC and UD layouts agree on bytes 0..20).
        let mut wqe = RcSqWqe::zeroed();
        wqe.set_opcode(request.opcode.into());
        wqe.set_owner(owner);
        wqe.set_signaled(request.signaled);
        wqe.set_fence(request.fence);
        wqe.set_solicited_event(request.solicited);
        wqe.set_message_length(request.length());
        wqe.set_immediate_data(request.immediate);
        let start = qp.sge_head & qp.sge_slots().wrapping_sub(1);
        match &request.inline {
            Some(data) => {
                wqe.set_inline(true);
                let in_wqe_limit = if ud { 8 } else { MAX_INLINE_IN_WQE };
                if data.len() <= in_wqe_limit && !ud {
                    wqe.set_inline_bytes(data).unwrap();
                } else if data.len() > in_wqe_limit {
                    wqe.set_inline_type(true);
                    let slots = data.len().div_ceil(16) as u32;
                    wqe.set_sge_count(slots as u8);
                    wqe.set_message_start_sge_index(start);
                    for (i, chunk) in data.chunks(16).enumerate() {
                        let mut slot = [0u8; 16];
                        slot[..chunk.len()].copy_from_slice(chunk);
                        self.memory
                            .write(qp.sge_address(qp.sge_head + i as u32), &slot)
                            .unwrap();
                    }
                    qp.sge_head += slots;
                }
            }
            None => {
                let in_wqe = if ud { 0 } else { request.sges.len().min(2) };
                wqe.set_sge_count(request.sges.len() as u8);
                wqe.set_message_start_sge_index(start);
                for (i, sge) in request.sges.iter().enumerate() {
                    if i < in_wqe {
                        wqe.set_sge(i, *sge);
                    } else {
                        let slot = qp.sge_head + (i - in_wqe) as u32;
                        self.memory.write_layout(qp.sge_address(slot), sge).unwrap();
                    }
                }
                qp.sge_head += (request.sges.len() - in_wqe) as u32;
            }
        }
        if ud {
            let dest = request.ud.expect("a UD send names its destination");
            let mut ud_wqe = UdSqWqe(wqe.0);
            // Bytes 20..64 of the UD layout differ from RC: rebuild them.
            ud_wqe.0[20..].fill(0);
            ud_wqe.set_protection_domain(qp.spec.pd);
            if let Some(data) = request.inline.as_ref().filter(|d| d.len() <= 8) {
                // Packed into spare fields; payload bits 15:0 overlay MSG_LEN bits 31:16.
                let mut bytes = [0u8; 8];
                bytes[..data.len()].copy_from_slice(data);
                ud_wqe.set_packed_inline_data(u64::from_le_bytes(bytes));
            }
            ud_wqe.set_qkey(dest.qkey);
            ud_wqe.set_destination_qpn(dest.dest_qpn);
            ud_wqe.set_vlan(0xFFF);
            ud_wqe.set_hop_limit(dest.hop_limit);
            ud_wqe.set_traffic_class(dest.traffic_class);
            ud_wqe.set_flow_label(dest.flow_label);
            ud_wqe.set_dmac(dest.dmac);
            ud_wqe.set_sgid_index(dest.sgid_index);
            ud_wqe.set_dgid(dest.dgid);
            raw.copy_from_slice(&ud_wqe.0);
        } else {
            wqe.set_rkey(request.rkey);
            wqe.set_remote_address(request.remote_va);
            if matches!(request.opcode, SqOpcode::AtomCmpAndSwap | SqOpcode::AtomFetchAndAdd) {
                wqe.set_atomic_swap_add(request.swap_add);
                wqe.set_atomic_compare(request.compare);
            }
            raw.copy_from_slice(&wqe.0);
        }
        self.memory.write(qp.sq_wqe_address(index), &raw).unwrap();
        qp.sq_head = index.wrapping_add(1);
        index
    }

    /// Rings `qp`'s SQ doorbell with its current head (no settling).
    pub fn ring_send(&mut self, qp: &QueuePair) {
        self.doorbell(Doorbell::sq(qp.qpn, qp.sq_head as u16, 0).as_u64());
    }

    /// Posts a receive WQE with `sges` to `qp`'s RQ and rings the RQ doorbell (or writes
    /// the record doorbell); returns its index.
    pub fn post_recv(&mut self, qp: &mut QueuePair, sges: &[Sge]) -> u32 {
        let index = qp.rq_head;
        let slots = 1usize << qp.spec.rq_sge_shift;
        assert!(sges.len() <= slots, "at most {slots} SGEs per receive WQE");
        let mut wqe = vec![0u8; slots * 16];
        for (i, sge) in sges.iter().enumerate() {
            wqe[i * 16..(i + 1) * 16].copy_from_slice(sge.bytes());
        }
        self.memory.write(qp.rq_wqe_address(index), &wqe).unwrap();
        qp.rq_head = index.wrapping_add(1);
        match qp.spec.rq_record {
            Some(record) => self.memory.write_u32(record, qp.rq_head & 0xFFFF).unwrap(),
            None => self.doorbell(Doorbell::rq(qp.qpn, qp.rq_head as u16).as_u64()),
        }
        index
    }

    /// Creates SRQ `srqn` of `depth` WQEs with `2^sge_shift` SGE slots in `pd` and limit
    /// `limit` (0 = disarmed).
    pub fn create_srq(&mut self, srqn: u32, pd: u32, depth: u32, sge_shift: u8, limit: u16) -> SharedReceiveQueue {
        self.ensure_context(Table::Srqc, srqn);
        let wqe_buffer = self.allocate(depth as usize * (16 << sge_shift));
        let index_buffer = self.allocate(depth as usize * 4);
        let mut srqc = Srqc::zeroed();
        srqc.set_srq_state_raw(1);
        srqc.set_shift(depth.trailing_zeros() as u8);
        srqc.set_srq_number(srqn);
        srqc.set_limit_watermark(limit);
        srqc.set_wqe_base_address(wqe_buffer >> 3);
        srqc.set_index_base_address(index_buffer >> 3);
        srqc.set_protection_domain(pd);
        srqc.set_max_sge_shift(sge_shift);
        let status = self.mailbox_with(MailboxOpcode::CreateSrq, srqn, &srqc, None);
        assert_eq!(status, MailboxCompletion::Success, "CREATE_SRQ {srqn}");
        SharedReceiveQueue {
            srqn,
            wqe_buffer,
            index_buffer,
            depth,
            sge_shift,
            head: 0,
            next_slot: 0,
        }
    }

    /// Posts a WQE with `sges` to `srq` (next free slot, round robin) and rings the SRQ
    /// doorbell; returns the slot.
    pub fn post_srq(&mut self, srq: &mut SharedReceiveQueue, sges: &[Sge]) -> u32 {
        let slot = srq.next_slot % srq.depth;
        srq.next_slot += 1;
        let stride = 16usize << srq.sge_shift;
        let mut wqe = vec![0u8; stride];
        for (i, sge) in sges.iter().enumerate() {
            wqe[i * 16..(i + 1) * 16].copy_from_slice(sge.bytes());
        }
        self.memory
            .write(srq.wqe_buffer + u64::from(slot) * stride as u64, &wqe)
            .unwrap();
        self.memory
            .write_u32(srq.index_buffer + u64::from(srq.head & (srq.depth - 1)) * 4, slot)
            .unwrap();
        srq.head = srq.head.wrapping_add(1);
        self.doorbell(Doorbell::srq(srq.srqn, srq.head as u16).as_u64());
        slot
    }
}

/// The harness on a [`Fabric`](rnic_hw_model::fabric::Fabric): its device is the port.
impl Port for RegisterHarness {
    fn mac_address(&self) -> [u8; 6] {
        self.device.config().mac_address
    }

    fn now(&self) -> Picoseconds {
        self.device.now()
    }

    fn next_event_time(&self) -> Option<Picoseconds> {
        self.device.next_event_time()
    }

    fn advance_to(&mut self, t: Picoseconds) {
        self.device.advance_to(t);
    }

    fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.device.poll_transmit()
    }

    fn receive_frame(&mut self, frame: &[u8]) {
        self.device.receive_frame(frame);
    }

    fn recycle_frame(&mut self, buffer: Vec<u8>) {
        self.device.recycle_frame(buffer);
    }
}
