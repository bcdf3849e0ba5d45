//! Bring-up and teardown of one function, in the hns order (§2.6):
//!
//! 1. PCI: memory decoding and bus mastering on; BAR0 identifies an rnic.
//! 2. Function reset (write 1, poll until it reads 0), then the ready bit.
//! 3. MSI-X: program and unmask the vectors used, enable the capability.
//! 4. Command queue: ring base, depth, CI = 0, PI = 0.
//! 5. QUERY_HW_VER, QUERY_FW_VER, QUERY_FUNC_INFO, CFG_GLOBAL_PARAM (999 cycles/µs,
//!    UDP port 4791), QUERY_PF_CAPS_NUM (5 descriptors), QUERY_PF_RES (2 descriptors).
//! 6. Context-table geometry, CFG_BT_ATTR, CLEAR_EXTDB_LIST_INFO.
//! 7. Source MAC 0 and GID entries.
//! 8. Event queues (CEQs, then the AEQ) and their interrupt enables, abnormal interrupts.
//!
//! Teardown destroys the EQs, resets the function (so the device stops touching host
//! memory) and only then frees the driver's DMA memory.

use std::sync::Arc;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::caps::{DeviceCaps, CAPS_DESCRIPTOR_COUNT};
use rnic_firmware_if::cmdq::{
    BaseAddressTableAttributes, FirmwareVersion, FunctionClear, FunctionInfo, FunctionResourcesA, FunctionResourcesB,
    GidEntry, GidType, GlobalParam, HardwareVersion, Opcode, SmacEntry, DESCRIPTOR_DATA_SIZE,
};
use rnic_firmware_if::context::{CQC_SIZE, MPT_SIZE, QPC_SIZE, SRQC_SIZE};
use rnic_firmware_if::mailbox::ContextTable;
use rnic_firmware_if::mtr::MIN_PAGE_SHIFT;
use rnic_firmware_if::pci;
use rnic_firmware_if::regs;

use super::cmdq::CommandQueue;
use super::dma::CountingAccess;
use super::eq::{EqKind, EqParameters, EventQueue, FIRST_CEQ_VECTOR};
use super::hem::{ContextTables, HemTable, TableGeometry};
use super::mailbox::Mailbox;
use super::{DeviceInfo, Driver, DriverError, FunctionResources, GidTableEntry};
use crate::device_access::DeviceAccess;

/// Clock cycles per microsecond written by CFG_GLOBAL_PARAM (hip09 value).
pub const CYCLES_PER_MICROSECOND: u16 = 999;
/// RoCEv2 UDP destination port.
pub const ROCE_V2_UDP_PORT: u16 = 4791;
/// Polls of FUNCTION_RESET (1 µs apart) before giving up: 100 ms.
pub const RESET_POLLS: u32 = 100_000;
/// FUNC_CLEAR completion polls (20 µs apart) before giving up.
pub const FUNCTION_CLEAR_POLLS: u32 = 1_000;
/// MSI-X message address programmed into every vector (the x86 local-APIC window; the
/// model delivers the message to the backend whatever the address).
pub const MSIX_MESSAGE_ADDRESS: u64 = 0xFEE0_0000;

/// Choices the driver makes at bring-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverConfig {
    /// BT levels of the context tables (0..=3; hns default 1).
    pub context_hop: u8,
    /// BT page shift of the context tables (12 = 4 KiB, as hns).
    pub context_ba_page_shift: u32,
    /// Most completion vectors (CEQs) to create.
    pub max_completion_vectors: u32,
    /// Largest EQ depth to use (the device's caps may allow more).
    pub max_eq_depth: u32,
    /// The port MAC; `None` asks the backend ([`DeviceAccess::mac_address`]).
    pub mac_address: Option<[u8; 6]>,
    /// An IPv4 address for the port: GID 0 becomes the IPv4-mapped RoCEv2 GID and the
    /// MAC-derived link-local GID moves to index 1. `None`: GID 0 is the link-local GID.
    pub ipv4_address: Option<[u8; 4]>,
    /// With an `ipv4_address`: put the link-local GID at index 0 and the IPv4-mapped one
    /// at index 1, as Linux does (rxe, mlx5), for applications that search the table
    /// from index 1 (perftest) or are told `-g 1`.
    pub link_local_gid_first: bool,
    /// Once the EQs exist, await mailbox completions as AEQ events (hns `cmd_mod = 1`)
    /// instead of polling `QUERY_MB_ST`.
    pub mailbox_event_mode: bool,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            context_hop: 1,
            context_ba_page_shift: 12,
            max_completion_vectors: 4,
            max_eq_depth: 1024,
            mac_address: None,
            ipv4_address: None,
            link_local_gid_first: false,
            mailbox_event_mode: true,
        }
    }
}

/// The link-local IPv6 address (fe80::/64 + modified EUI-64) derived from a MAC.
pub fn link_local_gid(mac: [u8; 6]) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8] = mac[0] ^ 0x02;
    gid[9] = mac[1];
    gid[10] = mac[2];
    gid[11] = 0xff;
    gid[12] = 0xfe;
    gid[13] = mac[3];
    gid[14] = mac[4];
    gid[15] = mac[5];
    gid
}

/// The IPv4-mapped IPv6 address `::ffff:a.b.c.d`.
pub fn ipv4_mapped_gid(ipv4: [u8; 4]) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&ipv4);
    gid
}

fn payload_of<L: Layout>(layout: &L) -> [u8; DESCRIPTOR_DATA_SIZE] {
    let mut payload = [0u8; DESCRIPTOR_DATA_SIZE];
    payload.copy_from_slice(&layout.bytes()[..DESCRIPTOR_DATA_SIZE]);
    payload
}

/// Everything bring-up allocated so far, for cleanup on failure.
struct Partial {
    /// BAR0 identified an rnic: only then may a reset be written.
    identified: bool,
    cmdq: Option<CommandQueue>,
    mailbox: Option<Mailbox>,
    eqs: Vec<EventQueue>,
    tables: Option<ContextTables>,
}

impl Partial {
    fn release(self, access: &dyn DeviceAccess) {
        // Stop the device before freeing anything it may read.
        if self.identified {
            access.mmio_write32(regs::CONTROL_BAR, regs::FUNCTION_RESET, 1);
            wait_for_reset(access).ok();
        }
        for eq in self.eqs {
            eq.release(access);
        }
        if let Some(mut tables) = self.tables {
            tables.release_all(access);
        }
        if let Some(mut mailbox) = self.mailbox {
            mailbox.release(access);
        }
        if let Some(mut cmdq) = self.cmdq {
            cmdq.release(access);
        }
    }
}

fn wait_for_reset(access: &dyn DeviceAccess) -> Result<(), DriverError> {
    for polls in 0..=RESET_POLLS {
        if access.mmio_read32(regs::CONTROL_BAR, regs::FUNCTION_RESET) & 1 == 0 {
            return Ok(());
        }
        if polls == RESET_POLLS {
            break;
        }
        access.delay(1_000);
    }
    Err(DriverError::ResetTimeout { polls: RESET_POLLS })
}

/// The MSI-X capability's table: (vectors, BAR, offset).
fn msix_table(access: &dyn DeviceAccess) -> Result<(u16, u8, u64), DriverError> {
    let cap = u16::from(pci::MSIX_CAPABILITY_OFFSET);
    let header = access.config_read16(cap);
    if header & 0xFF != u16::from(pci::CAPABILITY_ID_MSIX) {
        return Err(DriverError::Msix {
            reason: format!("no MSI-X capability at {cap:#x} (header {header:#06x})"),
        });
    }
    let control = access.config_read16(cap + 2);
    let table = access.config_read32(cap + 4);
    Ok(((control & 0x7FF) + 1, (table & 0x7) as u8, u64::from(table & !0x7)))
}

impl Driver {
    /// Brings the function up (see the module documentation).
    ///
    /// # Errors
    /// [`DriverError`]; everything allocated is released and the function reset on
    /// failure.
    pub fn bring_up(access: Box<dyn DeviceAccess>, config: &DriverConfig) -> Result<Self, DriverError> {
        let access = Arc::new(CountingAccess::new(access));
        let mut partial = Partial {
            identified: false,
            cmdq: None,
            mailbox: None,
            eqs: Vec::new(),
            tables: None,
        };
        match Self::bring_up_steps(&access, config, &mut partial) {
            Ok((info, tables, ceqs, aeq)) => {
                let mut mailbox = partial.mailbox.take().expect("set by the steps");
                let aeq = if config.mailbox_event_mode {
                    mailbox.enable_event_mode(aeq);
                    None
                } else {
                    Some(aeq)
                };
                Ok(Self {
                    cmdq: partial.cmdq.take().expect("set by the steps"),
                    mailbox,
                    access,
                    info,
                    tables,
                    ceqs,
                    aeq,
                    records: Default::default(),
                    shut_down: false,
                })
            }
            Err(e) => {
                tracing::error!(%e, "bring-up failed");
                partial.release(&*access);
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn bring_up_steps(
        access: &Arc<CountingAccess>,
        config: &DriverConfig,
        partial: &mut Partial,
    ) -> Result<(DeviceInfo, ContextTables, Vec<EventQueue>, EventQueue), DriverError> {
        let access: &dyn DeviceAccess = &**access;

        // 1. PCI.
        let command = access.config_read16(pci::offset::COMMAND as u16);
        access.config_write16(
            pci::offset::COMMAND as u16,
            command | pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER | pci::COMMAND_INTX_DISABLE,
        );
        let pci_vendor_id = access.config_read16(pci::offset::VENDOR_ID as u16);
        let pci_device_id = access.config_read16(pci::offset::DEVICE_ID as u16);
        let mut revision = [0u8];
        access.config_read(pci::offset::REVISION_ID as u16, &mut revision);
        let id = access.mmio_read32(regs::CONTROL_BAR, regs::ID);
        if id != regs::ID_MAGIC {
            return Err(DriverError::NotAnRnic {
                found: id,
                expected: regs::ID_MAGIC,
            });
        }
        let interface_version = access.mmio_read32(regs::CONTROL_BAR, regs::VERSION);
        partial.identified = true;

        // 2. Reset.
        access.mmio_write32(regs::CONTROL_BAR, regs::FUNCTION_RESET, 1);
        wait_for_reset(access)?;
        let status = access.mmio_read32(regs::CONTROL_BAR, regs::FUNCTION_STATUS);
        if status & regs::STATUS_READY == 0 || status & regs::STATUS_FATAL != 0 {
            return Err(DriverError::NotReady { status });
        }

        // 3. MSI-X.
        let (msix_vectors, table_bar, table_offset) = msix_table(access)?;
        if msix_vectors < FIRST_CEQ_VECTOR + 1 {
            return Err(DriverError::Msix {
                reason: format!("{msix_vectors} vectors: need one abnormal, one AEQ and at least one CEQ vector"),
            });
        }
        for vector in 0..msix_vectors {
            let entry = table_offset + u64::from(vector) * regs::MSIX_ENTRY_SIZE;
            access.mmio_write32(table_bar, entry, MSIX_MESSAGE_ADDRESS as u32);
            access.mmio_write32(table_bar, entry + 4, (MSIX_MESSAGE_ADDRESS >> 32) as u32);
            access.mmio_write32(table_bar, entry + 8, u32::from(vector));
            access.mmio_write32(table_bar, entry + 12, 0);
        }
        let cap = u16::from(pci::MSIX_CAPABILITY_OFFSET);
        let control = access.config_read16(cap + 2);
        access.config_write16(
            cap + 2,
            (control | pci::MSIX_CONTROL_ENABLE) & !pci::MSIX_CONTROL_FUNCTION_MASK,
        );

        // 4. Command queue and mailbox buffers.
        let cmdq = partial.cmdq.insert(CommandQueue::new(access)?);
        let mailbox = partial.mailbox.insert(Mailbox::new(access)?);

        // 5. Identification, global parameters, capabilities, resources.
        let hw = HardwareVersion(cmdq.query(access, Opcode::QueryHardwareVersion)?);
        let fw = FirmwareVersion(cmdq.query(access, Opcode::QueryFirmwareVersion)?);
        let function = FunctionInfo(cmdq.query(access, Opcode::QueryFunctionInfo)?);
        let mut global = GlobalParam::zeroed();
        global.set_cycles_per_microsecond(CYCLES_PER_MICROSECOND);
        global.set_udp_port(ROCE_V2_UDP_PORT);
        cmdq.write(access, Opcode::ConfigGlobalParam, &payload_of(&global))?;
        let caps_payloads = cmdq.execute(
            access,
            Opcode::QueryCapabilities,
            true,
            &[[0; DESCRIPTOR_DATA_SIZE]; CAPS_DESCRIPTOR_COUNT],
        )?;
        let caps_descriptors: [[u8; DESCRIPTOR_DATA_SIZE]; CAPS_DESCRIPTOR_COUNT] = caps_payloads
            .try_into()
            .expect("execute returns one payload per descriptor");
        let caps = DeviceCaps::from_descriptors(&caps_descriptors)?;
        let resource_payloads = cmdq.execute(
            access,
            Opcode::QueryFunctionResources,
            true,
            &[[0; DESCRIPTOR_DATA_SIZE]; 2],
        )?;
        let a = FunctionResourcesA(resource_payloads[0]);
        let b = FunctionResourcesB(resource_payloads[1]);
        let functions = function.function_count().max(1);
        let per_function = |n: u16| u32::from(n) / functions;
        let resources = FunctionResources {
            qpc_bt_count: per_function(a.qpc_bt_count()),
            srqc_bt_count: per_function(a.srqc_bt_count()),
            cqc_bt_count: per_function(a.cqc_bt_count()),
            mpt_bt_count: per_function(a.mpt_bt_count()),
            eqc_bt_count: per_function(a.eqc_bt_count()),
            smac_count: per_function(b.smac_count()),
            sgid_count: per_function(b.sgid_count()),
            sl_count: per_function(b.qid_count()),
        };
        tracing::info!(
            firmware = format_args!("{:#x}", fw.version()),
            hardware = format_args!("{:#x}", hw.hardware_version()),
            qps = caps.num_qps,
            cqs = caps.num_cqs,
            mrs = caps.num_mtpts,
            srqs = caps.num_srqs,
            "device identified"
        );

        // 6. Context tables.
        let hop = config.context_hop.min(rnic_firmware_if::mtr::MAX_HOP);
        let object_size = |from_caps: u64, layout: usize| {
            if from_caps != 0 && from_caps != layout as u64 {
                tracing::warn!(
                    from_caps,
                    layout,
                    "caps entry size differs from the layout size; using caps"
                );
            }
            if from_caps == 0 {
                layout as u64
            } else {
                from_caps
            }
        };
        let geometry = |table, size, count, slots| {
            TableGeometry::choose(table, size, count, slots, hop, config.context_ba_page_shift)
        };
        let qpc = geometry(
            ContextTable::Qpc,
            object_size(u64::from(caps.qpc_size), QPC_SIZE),
            caps.num_qps,
            resources.qpc_bt_count,
        )?;
        let mpt = geometry(
            ContextTable::Mpt,
            object_size(u64::from(caps.mtpt_entry_size), MPT_SIZE),
            caps.num_mtpts,
            resources.mpt_bt_count,
        )?;
        let cqc = geometry(
            ContextTable::Cqc,
            object_size(u64::from(caps.cqc_entry_size), CQC_SIZE),
            caps.num_cqs,
            resources.cqc_bt_count,
        )?;
        let srqc = geometry(
            ContextTable::Srqc,
            object_size(u64::from(caps.srqc_entry_size), SRQC_SIZE),
            caps.num_srqs,
            resources.srqc_bt_count,
        )?;
        let field = |shift: u32| (shift - MIN_PAGE_SHIFT) as u8;
        let mut attributes = BaseAddressTableAttributes::zeroed();
        attributes.set_qpc_ba_page_size(field(qpc.ba_page_shift));
        attributes.set_qpc_buffer_page_size(field(qpc.buffer_page_shift));
        attributes.set_qpc_hop_number(qpc.hop);
        attributes.set_srqc_ba_page_size(field(srqc.ba_page_shift));
        attributes.set_srqc_buffer_page_size(field(srqc.buffer_page_shift));
        attributes.set_srqc_hop_number(srqc.hop);
        attributes.set_cqc_ba_page_size(field(cqc.ba_page_shift));
        attributes.set_cqc_buffer_page_size(field(cqc.buffer_page_shift));
        attributes.set_cqc_hop_number(cqc.hop);
        attributes.set_mpt_ba_page_size(field(mpt.ba_page_shift));
        attributes.set_mpt_buffer_page_size(field(mpt.buffer_page_shift));
        attributes.set_mpt_hop_number(mpt.hop);
        cmdq.write(
            access,
            Opcode::ConfigBaseAddressTableAttributes,
            &payload_of(&attributes),
        )?;
        partial.tables = Some(ContextTables {
            qpc: HemTable::new(ContextTable::Qpc, qpc),
            mpt: HemTable::new(ContextTable::Mpt, mpt),
            cqc: HemTable::new(ContextTable::Cqc, cqc),
            srqc: HemTable::new(ContextTable::Srqc, srqc),
        });
        cmdq.write(access, Opcode::ClearExtendedDoorbellList, &[0; DESCRIPTOR_DATA_SIZE])?;

        // 7. Source MAC and GIDs.
        let mac = config
            .mac_address
            .or_else(|| access.mac_address())
            .ok_or_else(|| DriverError::Unusable {
                reason: "no MAC address: the backend does not know one and none was configured".into(),
            })?;
        let mut smac = SmacEntry::zeroed();
        smac.set_index(0);
        smac.set_mac(mac);
        cmdq.write(access, Opcode::ConfigSmacTable, &payload_of(&smac))?;
        let gid_table_length = match (u32::from(caps.max_gids), resources.sgid_count) {
            (0, 0) => 1,
            (0, n) | (n, 0) => n,
            (c, r) => c.min(r),
        }
        .clamp(1, 256) as usize;
        let mut gids = vec![None; gid_table_length];
        let mut wanted = Vec::new();
        if let Some(ipv4) = config.ipv4_address {
            wanted.push(GidTableEntry {
                gid: ipv4_mapped_gid(ipv4),
                gid_type: GidType::RoceV2Ipv4,
            });
        }
        let link_local = GidTableEntry {
            gid: link_local_gid(mac),
            gid_type: GidType::RoceV2Ipv6,
        };
        if config.link_local_gid_first {
            wanted.insert(0, link_local);
        } else {
            wanted.push(link_local);
        }
        for (index, entry) in wanted.into_iter().enumerate().take(gid_table_length) {
            let mut payload = GidEntry::zeroed();
            payload.set_index(index as u8);
            payload.set_gid(entry.gid);
            payload.set_gid_type(entry.gid_type as u8);
            cmdq.write(access, Opcode::ConfigGidTable, &payload_of(&payload))?;
            gids[index] = Some(entry);
        }

        // 8. Event queues and interrupts.
        let available = u32::from(msix_vectors - FIRST_CEQ_VECTOR);
        let ceq_count = u32::from(caps.num_ceqs)
            .max(1)
            .min(config.max_completion_vectors.max(1))
            .min(available);
        let ceq_parameters = EqParameters {
            depth: caps.ceq_depth.clamp(64, config.max_eq_depth.max(64)),
            max_count: caps.ceq_max_count.max(1),
            period: caps.ceq_period,
        };
        for eqn in 0..ceq_count {
            let eq = EventQueue::create(access, cmdq, mailbox, EqKind::Completion, eqn, ceq_parameters)?;
            partial.eqs.push(eq);
        }
        let aeq_parameters = EqParameters {
            depth: caps.aeq_depth.clamp(64, config.max_eq_depth.max(64)),
            max_count: caps.aeq_max_count.max(1),
            period: caps.aeq_period,
        };
        let aeq = EventQueue::create(access, cmdq, mailbox, EqKind::Async, ceq_count, aeq_parameters)?;
        access.mmio_write32(regs::CONTROL_BAR, regs::ABNORMAL_INT_ENABLE, u32::MAX);
        access.mmio_write32(regs::CONTROL_BAR, regs::ABNORMAL_INT_CONFIG, 1);

        let info = DeviceInfo {
            pci_vendor_id,
            pci_device_id,
            pci_revision: revision[0],
            interface_version,
            vendor_id: hw.vendor_id(),
            hardware_version: hw.hardware_version(),
            firmware_version: fw.version(),
            function_count: functions,
            function_id: u32::from(a.function_id()),
            mac_id: function.mac_id(),
            caps,
            resources,
            mac,
            gids,
            msix_vectors,
        };
        let tables = partial.tables.take().expect("set above");
        let ceqs = std::mem::take(&mut partial.eqs);
        Ok((info, tables, ceqs, aeq))
    }

    /// Shuts the function down: destroys the EQs, resets the function, frees every DMA
    /// buffer the driver holds. Idempotent; also run when the driver is dropped.
    pub fn shut_down(&mut self) {
        if self.shut_down {
            return;
        }
        self.shut_down = true;
        let access_handle = self.access.clone();
        let access: &dyn DeviceAccess = &*access_handle;
        access.mmio_write32(regs::CONTROL_BAR, regs::ABNORMAL_INT_CONFIG, 0);
        // Back to poll mode: the AEQ itself is about to be destroyed.
        let mut leftover = Vec::new();
        if let Some(aeq) = self.mailbox.disable_event_mode(&mut leftover) {
            self.aeq = Some(aeq);
        }
        if !leftover.is_empty() {
            tracing::debug!(?leftover, "asynchronous events nobody collected before shutdown");
        }
        let eqs: Vec<EventQueue> = self.aeq.take().into_iter().chain(self.ceqs.drain(..)).collect();
        for eq in &eqs {
            if let Err(e) = eq.destroy_on_device(access, &mut self.cmdq, &mut self.mailbox) {
                tracing::warn!(eqn = eq.eqn(), %e, "EQ destroy failed during shutdown");
            }
        }
        // hns at exit: FUNC_CLEAR (write, then poll with the read flag until done).
        if let Err(e) = self.clear_function() {
            tracing::warn!(%e, "FUNC_CLEAR failed during shutdown");
        }
        // Reset before freeing anything: afterwards the device touches no host memory.
        access.mmio_write32(regs::CONTROL_BAR, regs::FUNCTION_RESET, 1);
        if let Err(e) = wait_for_reset(access) {
            tracing::error!(%e, "function reset at shutdown did not finish");
        }
        for eq in eqs {
            eq.release(access);
        }
        self.tables.release_all(access);
        self.records.release_all(access);
        self.mailbox.release(access);
        self.cmdq.release(access);
        tracing::info!(usage = ?self.access.usage(), "function shut down");
    }
}

impl Driver {
    /// FUNC_CLEAR for this function: the firmware forgets its contexts and tables.
    fn clear_function(&mut self) -> Result<(), DriverError> {
        let access: &dyn DeviceAccess = &*self.access;
        let mut request = FunctionClear::zeroed();
        request.set_function_id(self.info.function_id);
        self.cmdq.write(access, Opcode::FunctionClear, &payload_of(&request))?;
        for _ in 0..FUNCTION_CLEAR_POLLS {
            let answer = self
                .cmdq
                .execute(access, Opcode::FunctionClear, true, &[payload_of(&request)])?;
            if FunctionClear(answer[0]).done() {
                return Ok(());
            }
            access.delay(20_000);
        }
        Err(DriverError::Unusable {
            reason: format!("FUNC_CLEAR not done after {FUNCTION_CLEAR_POLLS} polls"),
        })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shut_down();
    }
}
