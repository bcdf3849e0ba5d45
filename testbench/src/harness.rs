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
    BaseAddressTableAttributes, Descriptor, DescriptorFlags, Opcode, ReturnCode, DESCRIPTOR_SIZE,
};
use rnic_firmware_if::context::{
    CqArmState, CqState, Cqc, EqArmState, EqState, Eqc, Mtu, QpState, Qpc, ServiceType, CQC_SIZE, QPC_SIZE,
};
use rnic_firmware_if::cqe::Cqe;
use rnic_firmware_if::doorbell::{CqDoorbell, Doorbell, DB_OFFSET};
use rnic_firmware_if::eqe::Aeqe;
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode, MailboxStatus, PostMailbox, POLL_TOKEN};
use rnic_firmware_if::{pci, regs};
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

/// The device plus a minimal register-level driver.
pub struct RegisterHarness {
    /// The device under test.
    pub device: Device,
    /// Its host memory.
    pub memory: Arc<PagedMemory>,
    /// MSI-X messages the device sent.
    pub interrupts: RecordingSink,
    next_free: u64,
    ring: u64,
    producer_index: u32,
    mailbox_in: u64,
    mailbox_out: u64,
    aeq: Option<(u64, u32)>,
    aeq_consumer: u32,
    chunks: [Vec<Option<u64>>; 4],
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
        let memory = Arc::new(PagedMemory::new());
        let backing = Backing::zeroed(DMA_SIZE);
        memory.map_contiguous(DMA_BASE, &backing, 0, DMA_SIZE / FRAME_SIZE as usize, true);
        let interrupts = RecordingSink::new();
        let device = Device::new(DeviceConfig::default(), memory.clone(), Box::new(interrupts.clone()));
        let mut harness = Self {
            device,
            memory,
            interrupts,
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
        let address = self.next_free;
        let size = (size as u64).div_ceil(FRAME_SIZE).max(1) * FRAME_SIZE;
        self.next_free += size;
        assert!(
            self.next_free <= DMA_BASE + DMA_SIZE as u64,
            "harness DMA memory exhausted"
        );
        address
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
        let mut post = PostMailbox::zeroed();
        post.set_command(opcode);
        post.set_tag(tag);
        post.set_in_param(in_param);
        post.set_out_param(out_param);
        post.set_token(POLL_TOKEN);
        let (code, _) = self.command(Opcode::PostMailbox, false, &post.0);
        assert_eq!(code, ReturnCode::Success, "POST_MB accepted");
        let (code, response) = self.command(Opcode::QueryMailboxStatus, true, &[0; 24]);
        assert_eq!(code, ReturnCode::Success);
        let status = MailboxStatus::parse(&response).unwrap();
        assert!(!status.busy(), "mailbox finished after settling");
        MailboxCompletion::from_raw(status.status()).expect("a defined completion status")
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
        let mut attributes = BaseAddressTableAttributes::zeroed();
        attributes.set_qpc_buffer_page_size(4);
        attributes.set_mpt_buffer_page_size(4);
        attributes.set_cqc_buffer_page_size(4);
        attributes.set_srqc_buffer_page_size(4);
        let (code, _) = self.command(Opcode::ConfigBaseAddressTableAttributes, false, &attributes.0);
        assert_eq!(code, ReturnCode::Success);
    }

    /// Makes sure the chunk holding object `index` of `table` exists and its L0 slot is
    /// written (hop 0: the slot holds the chunk address).
    pub fn ensure_context(&mut self, table: Table, index: u32) {
        const CHUNK: u64 = 64 << 10;
        let chunk_index = (index as u64 * table.object_size() / CHUNK) as usize;
        let chunks = &mut self.chunks[table as usize];
        if chunks.len() <= chunk_index {
            chunks.resize(chunk_index + 1, None);
        }
        if chunks[chunk_index].is_none() {
            let address = self.allocate(CHUNK as usize);
            self.chunks[table as usize][chunk_index] = Some(address);
            let status = self.mailbox_raw(table.write_bt0() as u8, index, address, 0);
            assert_eq!(status, MailboxCompletion::Success, "WRITE_BT0 for {table:?} {index}");
        }
    }

    /// Whether [`RegisterHarness::create_aeq`] has run.
    pub fn has_aeq(&self) -> bool {
        self.aeq.is_some()
    }

    /// Creates the AEQ (EQN = number of CEQs) with interrupts enabled; returns its EQN.
    pub fn create_aeq(&mut self) -> u32 {
        let eqn = self.device.config().caps.num_ceqs as u32;
        let buffer = self.allocate(QUEUE_DEPTH as usize * 16);
        let mut eqc = Eqc::zeroed();
        eqc.set_eq_state(EqState::Valid);
        eqc.set_arm_state(EqArmState::AlwaysArmed);
        eqc.set_shift(QUEUE_DEPTH.trailing_zeros() as u8);
        eqc.set_eqe_base_address(buffer >> 3);
        let status = self.mailbox_with(MailboxOpcode::CreateAeqc, eqn, &eqc, None);
        assert_eq!(status, MailboxCompletion::Success);
        self.write_register(regs::event_int_enable(eqn), 1);
        self.aeq = Some((buffer, eqn));
        eqn
    }

    /// Creates CEQ 0 and CQ `cqn` (hop 0, 64-byte CQEs, depth [`QUEUE_DEPTH`]); returns
    /// the CQE buffer address.
    pub fn create_cq(&mut self, cqn: u32) -> u64 {
        self.ensure_context(Table::Cqc, cqn);
        if self.device.counters().eqes == 0 && !self.ceq_created() {
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
        let buffer = self.allocate(QUEUE_DEPTH as usize * 64);
        let status = self.mailbox_with(MailboxOpcode::CreateCqc, cqn, &Self::cq_context(cqn, buffer), None);
        assert_eq!(status, MailboxCompletion::Success, "CREATE_CQC {cqn}");
        buffer
    }

    fn ceq_created(&mut self) -> bool {
        self.query::<Eqc>(MailboxOpcode::QueryCeqc, 0).0 == MailboxCompletion::Success
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
        self.ensure_context(Table::Qpc, qpn);
        let buffer = self.allocate(2 * 4096);
        let mut init = Qpc::zeroed();
        init.set_qp_state(QpState::Init);
        init.set_service_type(ServiceType::Rc);
        init.set_protection_domain(1);
        init.set_sq_shift(6);
        init.set_rq_shift(6);
        init.set_send_cq_number(cqn);
        init.set_receive_cq_number(cqn);
        assert_eq!(
            self.modify_qp(qpn, &init, &Qpc::zeroed()),
            MailboxCompletion::Success,
            "RESET->INIT"
        );
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
        assert_eq!(
            self.modify_qp(qpn, &rtr, &mask),
            MailboxCompletion::Success,
            "INIT->RTR"
        );
        assert_eq!(self.move_qp(qpn, QpState::Rts), MailboxCompletion::Success, "RTR->RTS");
        buffer
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
