//! Test bench shared by the EQ and CQ tests: a device with memory decoding, bus
//! mastering and MSI-X on and every vector unmasked, zeroed host memory at fixed bus
//! addresses, and helpers that build contexts and ring doorbells the way a driver does.

use std::sync::Arc;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{CqState, Cqc, CqeSize, EqArmState, EqState, Eqc, EqeSize};
use rnic_firmware_if::doorbell::{CqDoorbell, EqDoorbell, EqDoorbellCommand, DB_OFFSET, EQ_DB_OFFSET};
use rnic_firmware_if::eqe::{Aeqe, Ceqe};
use rnic_firmware_if::mailbox::ContextTable;
use rnic_firmware_if::pci::{COMMAND_BUS_MASTER, COMMAND_MEMORY_SPACE, MSIX_CAPABILITY_OFFSET, MSIX_CONTROL_ENABLE};
use rnic_firmware_if::regs;

use super::EqKind;
use crate::config::DeviceConfig;
use crate::device::Device;
use crate::hem::ContextTableAttributes;
use crate::interrupt::RecordingSink;
use crate::memory::{Backing, HostMemory, PagedMemory, FRAME_SIZE};
use crate::time::Picoseconds;

/// Bus address of CEQ *n*'s buffer: `CEQ_BUFFERS + n × EQ_BUFFER_STRIDE`.
pub(crate) const CEQ_BUFFERS: u64 = 0x10_0000;
/// Distance between CEQ buffers.
pub(crate) const EQ_BUFFER_STRIDE: u64 = 0x1_0000;
/// Bus address of the AEQ buffer.
pub(crate) const AEQ_BUFFER: u64 = 0x20_0000;
/// Bus address of the CQC table chunk (64 KiB: CQs 0..1024, hop 0).
pub(crate) const CQC_TABLE: u64 = 0x30_0000;
/// Bus address of CQ *n*'s CQE buffer: `CQE_BUFFERS + n × CQE_BUFFER_STRIDE`.
pub(crate) const CQE_BUFFERS: u64 = 0x40_0000;
/// Distance between CQE buffers.
pub(crate) const CQE_BUFFER_STRIDE: u64 = 0x1_0000;
/// Bus address of a page of CQ record doorbells.
pub(crate) const RECORDS: u64 = 0x80_0000;
/// Bytes mapped for each EQ and CQ buffer.
const BUFFER_BYTES: usize = EQ_BUFFER_STRIDE as usize;

/// A device under test and the host around it.
pub(crate) struct Bench {
    /// The device.
    pub device: Device,
    /// Host memory shared with the device.
    pub memory: Arc<PagedMemory>,
    /// Every MSI-X message the device sent.
    pub interrupts: RecordingSink,
}

impl Bench {
    /// A default device, enabled as a driver would enable it, with CEQ/AEQ/CQ buffers and
    /// the CQC table mapped (zeroed) and the CQC table's addressing configured.
    pub(crate) fn new() -> Self {
        Self::with_config(DeviceConfig::default())
    }

    /// [`Bench::new`] with `config`.
    pub(crate) fn with_config(config: DeviceConfig) -> Self {
        let memory = Arc::new(PagedMemory::new());
        let interrupts = RecordingSink::new();
        let vectors = crate::config::msix_vector_count(&config.caps);
        let mut device = Device::new(config, memory.clone(), Box::new(interrupts.clone()));
        let command = COMMAND_MEMORY_SPACE | COMMAND_BUS_MASTER;
        device.config_write(rnic_firmware_if::pci::offset::COMMAND, &command.to_le_bytes());
        device.config_write(
            usize::from(MSIX_CAPABILITY_OFFSET) + 2,
            &MSIX_CONTROL_ENABLE.to_le_bytes(),
        );
        for vector in 0..u64::from(vectors) {
            let entry = vector * regs::MSIX_ENTRY_SIZE;
            device.bar_write(
                regs::MSIX_BAR,
                entry,
                &(0xFEE0_0000u32 + 4 * vector as u32).to_le_bytes(),
            );
            device.bar_write(regs::MSIX_BAR, entry + 8, &(0x40 + vector as u32).to_le_bytes());
            device.bar_write(regs::MSIX_BAR, entry + 12, &0u32.to_le_bytes());
        }
        let bench = Self {
            device,
            memory,
            interrupts,
        };
        let num_ceqs = u64::from(bench.device.config.caps.num_ceqs);
        bench.map(CEQ_BUFFERS, (num_ceqs as usize) * BUFFER_BYTES);
        bench.map(AEQ_BUFFER, BUFFER_BYTES);
        bench.map(CQC_TABLE, BUFFER_BYTES);
        bench.map(CQE_BUFFERS, 16 * BUFFER_BYTES);
        bench.map(RECORDS, FRAME_SIZE as usize);
        let mut bench = bench;
        let attributes = ContextTableAttributes {
            ba_page_shift: 12,
            buffer_page_shift: 16,
            hop: 0,
        };
        let cqc = bench
            .device
            .transport
            .io
            .qp
            .objects
            .contexts
            .table_mut(ContextTable::Cqc);
        cqc.set_attributes(attributes).expect("CQC attributes");
        cqc.write_base_address(0, 0, CQC_TABLE).expect("CQC L0 slot");
        bench
    }

    /// Maps `bytes` of fresh zeroed memory at `address` (frame aligned).
    pub(crate) fn map(&self, address: u64, bytes: usize) -> Arc<Backing> {
        let backing = Backing::zeroed(bytes);
        self.memory
            .map_contiguous(address, &backing, 0, backing.len() / FRAME_SIZE as usize, true);
        backing
    }

    /// Reads `len` bytes of host memory.
    pub(crate) fn read(&self, address: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.memory.read(address, &mut out).expect("mapped test memory");
        out
    }

    /// Writes host memory.
    pub(crate) fn write(&self, address: u64, data: &[u8]) {
        self.memory.write(address, data).expect("mapped test memory");
    }

    /// Sets EQ `eqn`'s interrupt enable register (BAR0 `EVENT_INT_EN`).
    pub(crate) fn enable_interrupt(&mut self, eqn: u32) {
        self.device
            .bar_write(regs::CONTROL_BAR, regs::event_int_enable(eqn), &1u32.to_le_bytes());
    }

    /// Writes the EQ doorbell (BAR2 page 0 + 0x238) as one 64-bit store.
    pub(crate) fn eq_doorbell(&mut self, command: EqDoorbellCommand, eqn: u32, consumer_index: u32) {
        let word = EqDoorbell::new(command, eqn as u8, consumer_index).as_u64();
        self.device
            .bar_write(regs::DOORBELL_BAR, EQ_DB_OFFSET, &word.to_le_bytes());
    }

    /// Writes a queue doorbell (BAR2 page 0 + 0x230) as one 64-bit store.
    pub(crate) fn cq_doorbell(&mut self, doorbell: CqDoorbell) {
        self.device
            .bar_write(regs::DOORBELL_BAR, DB_OFFSET, &doorbell.as_u64().to_le_bytes());
    }

    /// Moves virtual time forward by `us` microseconds, running due events.
    pub(crate) fn advance_micros(&mut self, us: u64) {
        let t = self.device.now() + Picoseconds::from_micros(us);
        self.device.advance_to(t);
    }

    /// Number of MSI-X messages on `vector` so far (not taken).
    pub(crate) fn interrupts_on(&self, vector: u16) -> usize {
        self.interrupts.count(vector)
    }

    /// EQN of the AEQ.
    pub(crate) fn aeqn(&self) -> u32 {
        self.device.transport.io.qp.objects.eqs.aeq_number()
    }

    /// Creates CEQ `eqn` of `1 << shift` compact entries in direct mode, always armed,
    /// interrupt per entry.
    pub(crate) fn create_ceq(&mut self, eqn: u32, shift: u8) {
        let eqc = eqc(shift, ceq_buffer(eqn), EqeSize::Compact);
        self.device
            .create_eq(eqn, EqKind::Completion, eqc)
            .expect("CEQ created");
    }

    /// Creates the AEQ with `1 << shift` compact (16-byte) entries, always armed.
    pub(crate) fn create_aeq(&mut self, shift: u8) {
        let aeqn = self.aeqn();
        let eqc = eqc(shift, AEQ_BUFFER, EqeSize::Compact);
        self.device.create_eq(aeqn, EqKind::Async, eqc).expect("AEQ created");
    }

    /// The 4-byte CEQE at ring slot `slot` of CEQ `eqn`.
    pub(crate) fn ceqe(&self, eqn: u32, slot: u64) -> Ceqe {
        Ceqe::parse(&self.read(ceq_buffer(eqn) + 4 * slot, 4)).expect("4 bytes")
    }

    /// The 16-byte AEQE at ring slot `slot`.
    pub(crate) fn aeqe(&self, slot: u64) -> Aeqe {
        Aeqe::parse(&self.read(AEQ_BUFFER + 16 * slot, 16)).expect("16 bytes")
    }

    /// The CQC of `cqn` as it is in host memory once the device has written its cached
    /// contexts back (as it does before any command or mailbox the driver could ask with).
    pub(crate) fn cqc(&mut self, cqn: u32) -> Cqc {
        self.device.write_back_contexts();
        Cqc::parse(&self.read(CQC_TABLE + 64 * u64::from(cqn), 64)).expect("64 bytes")
    }
}

/// Bus address of CEQ `eqn`'s buffer.
pub(crate) fn ceq_buffer(eqn: u32) -> u64 {
    CEQ_BUFFERS + u64::from(eqn) * EQ_BUFFER_STRIDE
}

/// Bus address of CQ `cqn`'s CQE buffer (CQs 0..16).
pub(crate) fn cqe_buffer(cqn: u32) -> u64 {
    CQE_BUFFERS + u64::from(cqn) * CQE_BUFFER_STRIDE
}

/// An EQC as the hns driver writes it at create: valid, always armed, `1 << shift`
/// entries of `size` in a contiguous (hop 0) buffer at `buffer`, one interrupt per EQE.
pub(crate) fn eqc(shift: u8, buffer: u64, size: EqeSize) -> Eqc {
    let mut e = Eqc::zeroed();
    e.set_eq_state(EqState::Valid);
    e.set_arm_state(EqArmState::AlwaysArmed);
    e.set_shift(shift);
    e.set_eqe_base_address(buffer >> 3);
    e.set_eqe_size(size);
    e.set_max_count(1);
    e
}

/// A CQC as the hns driver writes it at create: valid, not armed, `1 << shift` CQEs of
/// `size` in a contiguous buffer at [`cqe_buffer`]`(cqn)`, events on CEQ `ceqn`.
pub(crate) fn cqc(cqn: u32, shift: u8, size: CqeSize, ceqn: u16) -> Cqc {
    let mut c = Cqc::zeroed();
    c.set_cq_state(CqState::Valid);
    c.set_shift(shift);
    c.set_ceq_number(ceqn);
    c.set_cq_number(cqn);
    c.set_cqe_size(size);
    c.set_cqe_base_address(cqe_buffer(cqn) >> 3);
    c
}
