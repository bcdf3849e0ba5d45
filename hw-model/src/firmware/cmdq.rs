//! Command-queue ring processing and the command handlers.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{
    BaseAddressTableAttributes, Descriptor, DescriptorFlags, FirmwareVersion, FunctionClear, FunctionInfo,
    FunctionResourcesA, FunctionResourcesB, GidEntry, GidType, GlobalParam, HardwareVersion, Opcode, ReturnCode,
    SmacEntry, DESCRIPTOR_SIZE, MAX_RING_DEPTH, RING_DEPTH_UNIT,
};
use rnic_firmware_if::mailbox::{ContextTable, MailboxStatus, PostMailbox};
use rnic_firmware_if::regs;

use super::{Firmware, GidTableEntry, Io, Timer, MAILBOX_QUEUE_DEPTH};
use crate::diagnostics::Source;
use crate::hem::ContextTableAttributes;
use crate::time::Picoseconds;

/// Longest chain of NEXT descriptors the firmware follows.
const MAX_CHAIN: usize = 8;

impl Firmware {
    /// A write to one of the CSQ registers.
    pub(crate) fn command_queue_register_write(&mut self, io: &mut impl Io, offset: u64, value: u32) {
        let busy = self.cmdq.producer_index != self.cmdq.consumer_index;
        match offset {
            regs::CSQ_BASE_LOW | regs::CSQ_BASE_HIGH | regs::CSQ_DEPTH if busy => {
                io.diagnose(
                    Source::CommandQueue,
                    "command queue",
                    "CSQ_BASE/CSQ_DEPTH",
                    value as u64,
                    "no ring reconfiguration while commands are outstanding (PI != CI)",
                );
            }
            regs::CSQ_BASE_LOW => {
                if value & (DESCRIPTOR_SIZE as u32 - 1) != 0 {
                    io.diagnose(
                        Source::CommandQueue,
                        "command queue",
                        "CSQ_BASE_LOW",
                        value as u64,
                        "a 32-byte aligned ring address",
                    );
                }
                self.cmdq.base = (self.cmdq.base & !0xFFFF_FFFF) | value as u64;
            }
            regs::CSQ_BASE_HIGH => self.cmdq.base = (self.cmdq.base & 0xFFFF_FFFF) | (value as u64) << 32,
            regs::CSQ_DEPTH => {
                let depth = value as u64 * RING_DEPTH_UNIT as u64;
                if depth == 0 || depth > MAX_RING_DEPTH as u64 {
                    io.diagnose(
                        Source::CommandQueue,
                        "command queue",
                        "CSQ_DEPTH",
                        value as u64,
                        format!("1..={} (descriptors / 8)", MAX_RING_DEPTH / RING_DEPTH_UNIT),
                    );
                    self.cmdq.depth_register = 0;
                } else {
                    self.cmdq.depth_register = value;
                }
                // A ring of a new size starts over at slot 0, as hns's driver writes both
                // indices 0 after the depth: indices kept from a deeper ring would point
                // past the end of this one.
                self.cmdq.producer_index = 0;
                self.cmdq.consumer_index = 0;
            }
            regs::CSQ_CONSUMER_INDEX => {
                if busy {
                    io.diagnose(
                        Source::CommandQueue,
                        "command queue",
                        "CSQ_CONSUMER_INDEX",
                        value as u64,
                        "CI written only while the ring is idle",
                    );
                } else if value >= self.cmdq.depth().max(1) {
                    io.diagnose(
                        Source::CommandQueue,
                        "command queue",
                        "CSQ_CONSUMER_INDEX",
                        value as u64,
                        format!("an index below the ring depth {}", self.cmdq.depth()),
                    );
                } else {
                    self.cmdq.consumer_index = value;
                    self.cmdq.producer_index = value;
                }
            }
            regs::CSQ_PRODUCER_INDEX => self.command_queue_producer_write(io, value),
            _ => unreachable!("caller dispatches CSQ offsets only"),
        }
    }

    fn command_queue_producer_write(&mut self, io: &mut impl Io, value: u32) {
        let depth = self.cmdq.depth();
        if depth == 0 || self.cmdq.base == 0 {
            io.diagnose(
                Source::CommandQueue,
                "command queue",
                "CSQ_PRODUCER_INDEX",
                value as u64,
                "CSQ_BASE and CSQ_DEPTH programmed before the producer index",
            );
            io.raise_abnormal(regs::ABNORMAL_CMDQ_FATAL);
            return;
        }
        if value >= depth {
            io.diagnose(
                Source::CommandQueue,
                "command queue",
                "CSQ_PRODUCER_INDEX",
                value as u64,
                format!("an index below the ring depth {depth}"),
            );
            io.raise_abnormal(regs::ABNORMAL_CMDQ_FATAL);
            return;
        }
        self.cmdq.producer_index = value;
        if !self.cmdq.scheduled && value != self.cmdq.consumer_index {
            self.cmdq.scheduled = true;
            let delay = Picoseconds(self.identity.command_ps);
            io.schedule_in(delay, Timer::CommandQueue);
        }
    }

    /// Executes the command at the consumer index, then schedules the next one.
    pub(crate) fn process_command_queue(&mut self, io: &mut impl Io) {
        self.cmdq.scheduled = false;
        io.forget_caches();
        let depth = self.cmdq.depth();
        if depth == 0 || self.cmdq.producer_index == self.cmdq.consumer_index {
            return;
        }
        let available = ((self.cmdq.producer_index + depth - self.cmdq.consumer_index) % depth) as usize;
        let mut chain: Vec<Descriptor> = Vec::with_capacity(2);
        let mut slots = Vec::with_capacity(2);
        loop {
            let slot = (self.cmdq.consumer_index + chain.len() as u32) % depth;
            let address = self.cmdq.base.wrapping_add(slot as u64 * DESCRIPTOR_SIZE as u64);
            let mut descriptor = Descriptor::zeroed();
            if let Err(error) = io.dma_read(address, descriptor.bytes_mut()) {
                io.diagnose(
                    Source::CommandQueue,
                    format!("cmdq descriptor {slot}"),
                    "CSQ_BASE",
                    self.cmdq.base,
                    format!("a ring in mapped host memory ({error})"),
                );
                io.set_fatal();
                io.raise_abnormal(regs::ABNORMAL_CMDQ_FATAL);
                return;
            }
            let more = descriptor.flags().contains(DescriptorFlags::NEXT);
            chain.push(descriptor);
            slots.push(address);
            if !more || chain.len() == available || chain.len() == MAX_CHAIN {
                break;
            }
        }
        let chain_broken = chain.last().is_some_and(|d| d.flags().contains(DescriptorFlags::NEXT));
        let code = if chain_broken {
            io.diagnose(
                Source::CommandQueue,
                format!("cmdq descriptor {}", self.cmdq.consumer_index),
                "FLAG.NEXT",
                chain.len() as u64,
                format!("a chain ending (NEXT clear) within the {available} posted descriptors and at most {MAX_CHAIN} long"),
            );
            ReturnCode::NextError
        } else {
            self.execute_command(io, &mut chain)
        };
        // The command's context changes reach host memory before it completes.
        io.write_back_contexts();
        for (descriptor, address) in chain.iter_mut().zip(&slots) {
            descriptor.set_return_value(code as u16);
            descriptor.set_flags_raw(descriptor.flags_raw() | DescriptorFlags::OUT.bits());
            if let Err(error) = io.dma_write(*address, descriptor.bytes()) {
                io.diagnose(
                    Source::CommandQueue,
                    "command queue",
                    "CSQ_BASE",
                    self.cmdq.base,
                    format!("a writable ring ({error})"),
                );
                io.set_fatal();
                io.raise_abnormal(regs::ABNORMAL_CMDQ_FATAL);
                return;
            }
        }
        self.counters.commands += 1;
        self.cmdq.consumer_index = (self.cmdq.consumer_index + chain.len() as u32) % depth;
        if self.cmdq.consumer_index != self.cmdq.producer_index {
            self.cmdq.scheduled = true;
            let delay = Picoseconds(self.identity.command_ps);
            io.schedule_in(delay, Timer::CommandQueue);
        }
    }

    fn execute_command(&mut self, io: &mut impl Io, chain: &mut [Descriptor]) -> ReturnCode {
        let first = chain[0];
        let slot = self.cmdq.consumer_index;
        let Some(opcode) = Opcode::from_raw(first.opcode()) else {
            io.diagnose(
                Source::CommandQueue,
                format!("cmdq descriptor {slot}"),
                "OPCODE",
                first.opcode() as u64,
                "an opcode listed in docs/register-map.md",
            );
            return ReturnCode::NotExist;
        };
        if chain.len() != opcode.descriptor_count() {
            io.diagnose(
                Source::CommandQueue,
                format!("cmdq descriptor {slot} ({opcode:?})"),
                "descriptor count",
                chain.len() as u64,
                format!("{} chained descriptor(s)", opcode.descriptor_count()),
            );
            return ReturnCode::NextError;
        }
        if let Some(other) = chain.iter().find(|d| d.opcode() != first.opcode()) {
            io.diagnose(
                Source::CommandQueue,
                format!("cmdq descriptor {slot} ({opcode:?})"),
                "OPCODE",
                other.opcode() as u64,
                "the same opcode in every chained descriptor",
            );
            return ReturnCode::NextError;
        }
        if !first.flags().contains(DescriptorFlags::IN) {
            io.diagnose(
                Source::CommandQueue,
                format!("cmdq descriptor {slot} ({opcode:?})"),
                "FLAG.IN",
                first.flags_raw() as u64,
                "the IN flag set by the driver",
            );
            return ReturnCode::ParameterError;
        }
        let read = first.flags().contains(DescriptorFlags::WR);
        tracing::debug!(target: "rnic::firmware", ?opcode, read, "command");
        match opcode {
            Opcode::QueryFirmwareVersion => {
                let mut response = FirmwareVersion::zeroed();
                response.set_version(self.identity.firmware_version);
                chain[0].data_mut().copy_from_slice(response.bytes());
                ReturnCode::Success
            }
            Opcode::QueryHardwareVersion => {
                let mut response = HardwareVersion::zeroed();
                response.set_vendor_id(self.identity.vendor_id);
                response.set_hardware_version(self.identity.hardware_version);
                chain[0].data_mut().copy_from_slice(response.bytes());
                ReturnCode::Success
            }
            Opcode::ConfigGlobalParam => self.command_global_param(io, &mut chain[0], read),
            Opcode::QueryFunctionResources => {
                let slots = self.identity.bt_slots;
                let mut a = FunctionResourcesA::zeroed();
                a.set_qpc_bt_count(slots.qpc);
                a.set_srqc_bt_count(slots.srqc);
                a.set_cqc_bt_count(slots.cqc);
                a.set_mpt_bt_count(slots.mpt);
                a.set_eqc_bt_count(slots.eqc);
                let mut b = FunctionResourcesB::zeroed();
                b.set_smac_count(io.addresses().smacs().len() as u16);
                b.set_sgid_count(io.addresses().gids().len() as u16);
                b.set_qid_count(8);
                chain[0].data_mut().copy_from_slice(a.bytes());
                chain[1].data_mut().copy_from_slice(b.bytes());
                ReturnCode::Success
            }
            Opcode::QueryFunctionInfo => {
                let mut info = FunctionInfo::zeroed();
                info.set_function_count(1);
                chain[0].data_mut().copy_from_slice(info.bytes());
                ReturnCode::Success
            }
            Opcode::QueryCapabilities => {
                let descriptors = self.identity.caps.try_to_descriptors().unwrap_or_default();
                for (descriptor, data) in chain.iter_mut().zip(descriptors.iter()) {
                    descriptor.data_mut().copy_from_slice(data);
                }
                ReturnCode::Success
            }
            Opcode::ConfigGidTable => self.command_gid(io, &mut chain[0], read),
            Opcode::ConfigSmacTable => self.command_smac(io, &mut chain[0], read),
            Opcode::PostMailbox => self.command_post_mailbox(io, &chain[0]),
            Opcode::QueryMailboxStatus => {
                let mut status = MailboxStatus::zeroed();
                status.set_busy(!self.mailbox_queue.is_empty());
                status.set_status(self.last_mailbox_status as u8);
                chain[0].data_mut().copy_from_slice(status.bytes());
                ReturnCode::Success
            }
            Opcode::ConfigBaseAddressTableAttributes => self.command_bt_attributes(io, &chain[0]),
            Opcode::FunctionClear => {
                let request = FunctionClear::parse(chain[0].data()).expect("fixed size");
                if request.function_id() != 0 {
                    io.diagnose(
                        Source::CommandQueue,
                        "FUNC_CLEAR",
                        "FUNC_ID",
                        request.function_id() as u64,
                        "function 0 (the device has one function)",
                    );
                    return ReturnCode::ParameterError;
                }
                if !read {
                    self.clear_function_resources(io);
                }
                let mut response = request;
                response.set_done(true);
                chain[0].data_mut().copy_from_slice(response.bytes());
                ReturnCode::Success
            }
            Opcode::ClearExtendedDoorbellList => ReturnCode::Success,
        }
    }

    fn command_global_param(&mut self, io: &mut impl Io, descriptor: &mut Descriptor, read: bool) -> ReturnCode {
        if read {
            let mut response = GlobalParam::zeroed();
            response.set_cycles_per_microsecond(self.cycles_per_microsecond.unwrap_or(0));
            response.set_udp_port(self.udp_port);
            descriptor.data_mut().copy_from_slice(response.bytes());
            return ReturnCode::Success;
        }
        let request = GlobalParam::parse(descriptor.data()).expect("fixed size");
        if request.udp_port() == 0 {
            io.diagnose(
                Source::CommandQueue,
                "CFG_GLOBAL_PARAM",
                "UDP_PORT",
                0,
                "a non-zero UDP port (RoCEv2 uses 4791)",
            );
            return ReturnCode::ParameterError;
        }
        self.cycles_per_microsecond = Some(request.cycles_per_microsecond());
        self.udp_port = request.udp_port();
        ReturnCode::Success
    }

    fn command_gid(&mut self, io: &mut impl Io, descriptor: &mut Descriptor, read: bool) -> ReturnCode {
        let request = GidEntry::parse(descriptor.data()).expect("fixed size");
        let index = request.index() as usize;
        let len = io.addresses().gids().len();
        if index >= len {
            io.diagnose(
                Source::CommandQueue,
                "CFG_SGID_TB",
                "SGID_IDX",
                index as u64,
                format!("an index below the GID table length {len}"),
            );
            return ReturnCode::ParameterError;
        }
        if read {
            let mut response = request;
            if let Some(entry) = io.addresses().gids()[index] {
                response.set_gid(entry.gid);
                response.set_gid_type(entry.gid_type as u8);
            }
            descriptor.data_mut().copy_from_slice(response.bytes());
            return ReturnCode::Success;
        }
        let gid_type = match request.gid_type() {
            0 => GidType::RoceV1,
            1 => GidType::RoceV2Ipv4,
            2 => GidType::RoceV2Ipv6,
            other => {
                io.diagnose(
                    Source::CommandQueue,
                    "CFG_SGID_TB",
                    "SGID_TYPE",
                    other as u64,
                    "0 (RoCEv1), 1 (RoCEv2/IPv4) or 2 (RoCEv2/IPv6)",
                );
                return ReturnCode::ParameterError;
            }
        };
        let gid = request.gid();
        let entry = (gid != [0; 16]).then_some(GidTableEntry { gid, gid_type });
        let written = io.addresses().set_gid(index, entry);
        debug_assert!(written, "the index was checked against the table length");
        ReturnCode::Success
    }

    fn command_smac(&mut self, io: &mut impl Io, descriptor: &mut Descriptor, read: bool) -> ReturnCode {
        let request = SmacEntry::parse(descriptor.data()).expect("fixed size");
        let index = request.index() as usize;
        let len = io.addresses().smacs().len();
        if index >= len {
            io.diagnose(
                Source::CommandQueue,
                "CFG_SMAC_TB",
                "SMAC_IDX",
                index as u64,
                format!("an index below the SMAC table length {len}"),
            );
            return ReturnCode::ParameterError;
        }
        if read {
            let mut response = request;
            response.set_mac(io.addresses().smacs()[index].unwrap_or_default());
            descriptor.data_mut().copy_from_slice(response.bytes());
            return ReturnCode::Success;
        }
        let mac = request.mac();
        if mac[0] & 1 != 0 {
            io.diagnose(
                Source::CommandQueue,
                "CFG_SMAC_TB",
                "SMAC",
                u64::from_be_bytes([0, 0, mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]]),
                "a unicast MAC address",
            );
            return ReturnCode::ParameterError;
        }
        let written = io.addresses().set_smac(index, mac);
        debug_assert!(written, "the index was checked against the table length");
        ReturnCode::Success
    }

    fn command_post_mailbox(&mut self, io: &mut impl Io, descriptor: &Descriptor) -> ReturnCode {
        let post = PostMailbox::parse(descriptor.data()).expect("fixed size");
        if self.mailbox_queue.len() >= MAILBOX_QUEUE_DEPTH {
            io.diagnose(
                Source::Mailbox,
                "mailbox",
                "POST_MB",
                post.command() as u64,
                format!("at most {MAILBOX_QUEUE_DEPTH} outstanding mailbox commands"),
            );
            return ReturnCode::NotExecuted;
        }
        if self.mailbox_queue.is_empty() {
            let delay = Picoseconds(self.identity.mailbox_ps);
            io.schedule_in(delay, Timer::MailboxComplete);
        }
        self.mailbox_queue.push_back(post);
        ReturnCode::Success
    }

    fn command_bt_attributes(&mut self, io: &mut impl Io, descriptor: &Descriptor) -> ReturnCode {
        let request = BaseAddressTableAttributes::parse(descriptor.data()).expect("fixed size");
        let in_use = io.context_slots_in_use();
        if in_use != 0 {
            io.diagnose(
                Source::CommandQueue,
                "CFG_BT_ATTR",
                "context tables in use",
                in_use as u64,
                "attributes changed only before any base address is written",
            );
            return ReturnCode::NotExecuted;
        }
        let requested = [
            (
                "QPC",
                request.qpc_ba_page_size(),
                request.qpc_buffer_page_size(),
                request.qpc_hop_number(),
            ),
            (
                "MPT",
                request.mpt_ba_page_size(),
                request.mpt_buffer_page_size(),
                request.mpt_hop_number(),
            ),
            (
                "CQC",
                request.cqc_ba_page_size(),
                request.cqc_buffer_page_size(),
                request.cqc_hop_number(),
            ),
            (
                "SRQC",
                request.srqc_ba_page_size(),
                request.srqc_buffer_page_size(),
                request.srqc_hop_number(),
            ),
        ];
        let attributes = requested.map(|(_, ba, buffer, hop)| ContextTableAttributes {
            ba_page_shift: 12 + ba as u32,
            buffer_page_shift: 12 + buffer as u32,
            hop,
        });
        if let Err((table, error)) = io.configure_context_tables(attributes) {
            let (name, hop) = match table {
                ContextTable::Qpc => (requested[0].0, requested[0].3),
                ContextTable::Mpt => (requested[1].0, requested[1].3),
                ContextTable::Cqc => (requested[2].0, requested[2].3),
                ContextTable::Srqc => (requested[3].0, requested[3].3),
            };
            io.diagnose(
                Source::CommandQueue,
                format!("CFG_BT_ATTR {name}"),
                "attributes",
                hop as u64,
                error.to_string(),
            );
            return ReturnCode::ParameterError;
        }
        self.attributes_configured = true;
        ReturnCode::Success
    }
}
