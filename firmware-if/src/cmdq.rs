//! The firmware command queue (hns "CMQ"/CSQ): ring registers are in [`crate::regs`];
//! this module has the 32-byte descriptor, its flags, the opcodes, the return codes and
//! the payload layouts of the commands the firmware implements.
//!
//! Protocol (hns §2.2): the driver copies N descriptors into ring slots `pi .. pi+N-1`
//! (wrapping at the ring depth), sets [`DescriptorFlags::NEXT`] on all but the last
//! descriptor of one command, writes the new producer index, and polls the consumer
//! index until it equals the producer index. Firmware writes each descriptor's
//! `retval` and response `data` back into the same slots.

use crate::layout;

/// Size of one descriptor in bytes.
pub const DESCRIPTOR_SIZE: usize = 32;
/// Size of a descriptor's data payload in bytes (6 dwords).
pub const DESCRIPTOR_DATA_SIZE: usize = 24;
/// Ring depth the hns driver uses (`CMD_CSQ_DESC_NUM`).
pub const DEFAULT_RING_DEPTH: u32 = 1024;
/// Largest ring depth the device accepts (the depth register is in units of 8).
pub const MAX_RING_DEPTH: u32 = 0x8000;
/// Ring depth granularity: [`crate::regs::CSQ_DEPTH`] counts groups of this many.
pub const RING_DEPTH_UNIT: u32 = 8;

layout! {
    /// One command-queue descriptor (`struct hns_roce_cmq_desc`).
    pub struct Descriptor[32] {
        /// Command opcode ([`Opcode`]).
        OPCODE / opcode / set_opcode: u16 = 15:0,
        /// [`DescriptorFlags`] bits.
        FLAG / flags_raw / set_flags_raw: u16 = 31:16,
        /// Return code written by firmware ([`ReturnCode`]).
        RETVAL / return_value / set_return_value: u16 = 47:32,
    }
}

impl Descriptor {
    /// A descriptor for `opcode` with the given flags and an all-zero payload.
    pub fn new(opcode: Opcode, flags: DescriptorFlags) -> Self {
        let mut d = Self([0; DESCRIPTOR_SIZE]);
        d.set_opcode(opcode as u16);
        d.set_flags_raw(flags.bits());
        d
    }

    /// The flags, unknown bits dropped.
    pub fn flags(&self) -> DescriptorFlags {
        DescriptorFlags::from_bits_truncate(self.flags_raw())
    }

    /// The 24-byte payload.
    pub fn data(&self) -> &[u8; DESCRIPTOR_DATA_SIZE] {
        self.0[8..32].try_into().expect("fixed range")
    }

    /// The 24-byte payload, mutable.
    pub fn data_mut(&mut self) -> &mut [u8; DESCRIPTOR_DATA_SIZE] {
        (&mut self.0[8..32]).try_into().expect("fixed range")
    }
}

bitflags::bitflags! {
    /// Descriptor flag bits (hns `HNS_ROCE_CMD_FLAG_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DescriptorFlags: u16 {
        /// Driver → firmware; always set by the driver.
        const IN = 1 << 0;
        /// Firmware → driver.
        const OUT = 1 << 1;
        /// More descriptors of the same command follow.
        const NEXT = 1 << 2;
        /// Set for read/query commands, clear for writes (the hns name is inverted).
        const WR = 1 << 3;
        /// Old drivers: no completion interrupt.
        const NO_INTR = 1 << 4;
        /// Interrupt on error.
        const ERR_INTR = 1 << 5;
    }
}

/// Firmware return codes written into [`Descriptor::RETVAL`] (hns `hns_roce_cmd_return_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ReturnCode {
    /// Success.
    Success = 0,
    /// The function may not issue this command.
    NoAuth = 1,
    /// Unknown opcode or non-existent object.
    NotExist = 2,
    /// Receive queue full.
    CrqFull = 3,
    /// The chain of NEXT descriptors is malformed.
    NextError = 4,
    /// The command could not be executed in the current state.
    NotExecuted = 5,
    /// A parameter is out of range.
    ParameterError = 6,
    /// The command ran and its result is an error.
    ResultError = 7,
    /// Timed out.
    Timeout = 8,
    /// Link (HiLink) error.
    HilinkError = 9,
    /// Illegal information.
    InfoIllegal = 10,
    /// Invalid.
    Invalid = 11,
    /// RoH check failure.
    RohCheckFail = 12,
    /// Other error.
    Other = 0xFF,
}

impl ReturnCode {
    /// Decodes a return value; unknown values map to [`ReturnCode::Other`].
    pub fn from_raw(raw: u16) -> Self {
        use ReturnCode::*;
        match raw {
            0 => Success,
            1 => NoAuth,
            2 => NotExist,
            3 => CrqFull,
            4 => NextError,
            5 => NotExecuted,
            6 => ParameterError,
            7 => ResultError,
            8 => Timeout,
            9 => HilinkError,
            10 => InfoIllegal,
            11 => Invalid,
            12 => RohCheckFail,
            _ => Other,
        }
    }
}

/// Command opcodes (hns `hns_roce_opcode_type`). The firmware implements the ones listed
/// here; any other opcode is answered with [`ReturnCode::NotExist`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    /// Firmware version: response dword 0 = version (major << 16 | minor << 8 | sub).
    QueryFirmwareVersion = 0x0001,
    /// Hardware version: [`HardwareVersion`].
    QueryHardwareVersion = 0x8000,
    /// Global parameters: [`GlobalParam`].
    ConfigGlobalParam = 0x8001,
    /// Resource ranges of this function, 2 descriptors: [`FunctionResourcesA`], [`FunctionResourcesB`].
    QueryFunctionResources = 0x8400,
    /// Function information: [`FunctionInfo`].
    QueryFunctionInfo = 0x8407,
    /// Capabilities, 5 chained descriptors ([`crate::caps`]).
    QueryCapabilities = 0x8408,
    /// GID table entry: [`GidEntry`].
    ConfigGidTable = 0x8500,
    /// Source MAC table entry: [`SmacEntry`].
    ConfigSmacTable = 0x8501,
    /// Post a mailbox command ([`crate::mailbox::PostMailbox`]).
    PostMailbox = 0x8504,
    /// Mailbox status ([`crate::mailbox::MailboxStatus`]).
    QueryMailboxStatus = 0x8505,
    /// Per-table addressing attributes: [`BaseAddressTableAttributes`].
    ConfigBaseAddressTableAttributes = 0x8506,
    /// Clear a function's resources: [`FunctionClear`].
    FunctionClear = 0x8508,
    /// Clear the extended-doorbell list (accepted; the model has no extended doorbells).
    ClearExtendedDoorbellList = 0x850D,
}

impl Opcode {
    /// Every implemented opcode.
    pub const ALL: [Opcode; 13] = [
        Opcode::QueryFirmwareVersion,
        Opcode::QueryHardwareVersion,
        Opcode::ConfigGlobalParam,
        Opcode::QueryFunctionResources,
        Opcode::QueryFunctionInfo,
        Opcode::QueryCapabilities,
        Opcode::ConfigGidTable,
        Opcode::ConfigSmacTable,
        Opcode::PostMailbox,
        Opcode::QueryMailboxStatus,
        Opcode::ConfigBaseAddressTableAttributes,
        Opcode::FunctionClear,
        Opcode::ClearExtendedDoorbellList,
    ];

    /// Decodes an opcode; `None` for opcodes the firmware does not implement.
    pub fn from_raw(raw: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|op| *op as u16 == raw)
    }

    /// Number of chained descriptors the command uses.
    pub const fn descriptor_count(self) -> usize {
        match self {
            Opcode::QueryCapabilities => 5,
            Opcode::QueryFunctionResources => 2,
            _ => 1,
        }
    }
}

layout! {
    /// QUERY_HW_VER response payload.
    pub struct HardwareVersion[24] {
        /// PCI vendor id of the engine.
        VENDOR_ID / vendor_id / set_vendor_id: u16 = 15:0,
        /// Hardware version (hns: 0x100 hip08, 0x130 hip09).
        HW_VERSION / hardware_version / set_hardware_version: u16 = 31:16,
    }
}

layout! {
    /// QUERY_FW_VER response payload.
    pub struct FirmwareVersion[24] {
        /// Firmware version: major 31:16, minor 15:8, sub 7:0.
        FW_VER / version / set_version: u32 = 31:0,
    }
}

layout! {
    /// CFG_GLOBAL_PARAM payload.
    pub struct GlobalParam[24] {
        /// Device clock cycles per microsecond minus one (hip09 writes 999 for 1 GHz;
        /// 0 means "not configured"). Unit: cycles.
        CYCLES_PER_US / cycles_per_microsecond / set_cycles_per_microsecond: u16 = 9:0,
        /// RoCEv2 UDP destination port (4791).
        UDP_PORT / udp_port / set_udp_port: u16 = 31:16,
    }
}

layout! {
    /// QUERY_FUNC_INFO response payload.
    pub struct FunctionInfo[24] {
        /// Number of functions this device has.
        OWN_FUNC_NUM / function_count / set_function_count: u32 = 31:0,
        /// MAC id of the function (congestion template base in hns).
        OWN_MAC_ID / mac_id / set_mac_id: u32 = 63:32,
    }
}

layout! {
    /// QUERY_PF_RES response, descriptor A: base-address-table slots per context table.
    pub struct FunctionResourcesA[24] {
        /// Function id.
        VF_ID / function_id / set_function_id: u8 = 7:0,
        /// First QPC L0 slot.
        QPC_BT_IDX / qpc_bt_index / set_qpc_bt_index: u16 = 42:32,
        /// Number of QPC L0 slots.
        QPC_BT_NUM / qpc_bt_count / set_qpc_bt_count: u16 = 59:48,
        /// First SRQC L0 slot.
        SRQC_BT_IDX / srqc_bt_index / set_srqc_bt_index: u16 = 72:64,
        /// Number of SRQC L0 slots.
        SRQC_BT_NUM / srqc_bt_count / set_srqc_bt_count: u16 = 89:80,
        /// First CQC L0 slot.
        CQC_BT_IDX / cqc_bt_index / set_cqc_bt_index: u16 = 104:96,
        /// Number of CQC L0 slots.
        CQC_BT_NUM / cqc_bt_count / set_cqc_bt_count: u16 = 121:112,
        /// First MPT L0 slot.
        MPT_BT_IDX / mpt_bt_index / set_mpt_bt_index: u16 = 136:128,
        /// Number of MPT L0 slots.
        MPT_BT_NUM / mpt_bt_count / set_mpt_bt_count: u16 = 153:144,
        /// First EQC L0 slot.
        EQC_BT_IDX / eqc_bt_index / set_eqc_bt_index: u16 = 168:160,
        /// Number of EQC L0 slots.
        EQC_BT_NUM / eqc_bt_count / set_eqc_bt_count: u16 = 185:176,
    }
}

layout! {
    /// QUERY_PF_RES response, descriptor B: table sizes of the other resources.
    pub struct FunctionResourcesB[24] {
        /// First source-MAC table entry.
        SMAC_IDX / smac_index / set_smac_index: u8 = 39:32,
        /// Number of source-MAC entries.
        SMAC_NUM / smac_count / set_smac_count: u16 = 48:40,
        /// First GID table entry.
        SGID_IDX / sgid_index / set_sgid_index: u8 = 71:64,
        /// Number of GID entries.
        SGID_NUM / sgid_count / set_sgid_count: u16 = 80:72,
        /// First service-level queue.
        QID_IDX / qid_index / set_qid_index: u16 = 105:96,
        /// Number of service levels.
        QID_NUM / qid_count / set_qid_count: u16 = 122:112,
    }
}

layout! {
    /// CFG_BT_ATTR payload: addressing attributes of the four context tables. Page sizes
    /// are encoded `page_shift - 12`; hop numbers are 0..=3 (hns: 0..=2; 3 is an rnic
    /// extension).
    pub struct BaseAddressTableAttributes[24] {
        /// QPC base-address-table page size.
        QPC_BA_PGSZ / qpc_ba_page_size / set_qpc_ba_page_size: u8 = 3:0,
        /// QPC buffer (chunk) page size.
        QPC_BUF_PGSZ / qpc_buffer_page_size / set_qpc_buffer_page_size: u8 = 7:4,
        /// QPC hop number.
        QPC_HOPNUM / qpc_hop_number / set_qpc_hop_number: u8 = 9:8,
        /// SRQC base-address-table page size.
        SRQC_BA_PGSZ / srqc_ba_page_size / set_srqc_ba_page_size: u8 = 35:32,
        /// SRQC buffer page size.
        SRQC_BUF_PGSZ / srqc_buffer_page_size / set_srqc_buffer_page_size: u8 = 39:36,
        /// SRQC hop number.
        SRQC_HOPNUM / srqc_hop_number / set_srqc_hop_number: u8 = 41:40,
        /// CQC base-address-table page size.
        CQC_BA_PGSZ / cqc_ba_page_size / set_cqc_ba_page_size: u8 = 67:64,
        /// CQC buffer page size.
        CQC_BUF_PGSZ / cqc_buffer_page_size / set_cqc_buffer_page_size: u8 = 71:68,
        /// CQC hop number.
        CQC_HOPNUM / cqc_hop_number / set_cqc_hop_number: u8 = 73:72,
        /// MPT base-address-table page size.
        MPT_BA_PGSZ / mpt_ba_page_size / set_mpt_ba_page_size: u8 = 99:96,
        /// MPT buffer page size.
        MPT_BUF_PGSZ / mpt_buffer_page_size / set_mpt_buffer_page_size: u8 = 103:100,
        /// MPT hop number.
        MPT_HOPNUM / mpt_hop_number / set_mpt_hop_number: u8 = 105:104,
    }
}

layout! {
    /// CFG_SGID_TB payload: one GID table entry.
    pub struct GidEntry[24] {
        /// GID table index.
        SGID_IDX / index / set_index: u8 = 7:0,
        /// GID bytes 0..8 in network order (dwords 1..2).
        GID_L / gid_low / set_gid_low: u64 = 95:32,
        /// GID bytes 8..16 in network order (dwords 3..4).
        GID_H / gid_high / set_gid_high: u64 = 159:96,
        /// GID type: 0 RoCEv1, 1 RoCEv2 over IPv4, 2 RoCEv2 over IPv6.
        SGID_TYPE / gid_type / set_gid_type: u8 = 161:160,
    }
}

impl GidEntry {
    /// The 16 GID bytes in network order.
    pub fn gid(&self) -> [u8; 16] {
        self.0[4..20].try_into().expect("fixed range")
    }
    /// Sets the 16 GID bytes (network order).
    pub fn set_gid(&mut self, gid: [u8; 16]) {
        self.0[4..20].copy_from_slice(&gid);
    }
}

/// GID types of [`GidEntry::SGID_TYPE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GidType {
    /// RoCEv1 (not carried by this device; accepted in the table).
    RoceV1 = 0,
    /// RoCEv2 over IPv4 (GID is an IPv4-mapped IPv6 address).
    RoceV2Ipv4 = 1,
    /// RoCEv2 over IPv6.
    RoceV2Ipv6 = 2,
}

layout! {
    /// CFG_SMAC_TB payload: one source-MAC table entry.
    pub struct SmacEntry[24] {
        /// Source-MAC table index.
        SMAC_IDX / index / set_index: u8 = 7:0,
        /// MAC bytes 2..6 as a little-endian u32 (hns: SMAC low 32 bits).
        SMAC_L / mac_low / set_mac_low: u32 = 63:32,
        /// MAC bytes 0..2 as a little-endian u16 (hns: SMAC high 16 bits).
        SMAC_H / mac_high / set_mac_high: u16 = 79:64,
    }
}

impl SmacEntry {
    /// The MAC address, first byte first on the wire.
    pub fn mac(&self) -> [u8; 6] {
        let low = self.mac_low().to_be_bytes();
        let high = self.mac_high().to_be_bytes();
        [high[0], high[1], low[0], low[1], low[2], low[3]]
    }
    /// Sets the MAC address.
    pub fn set_mac(&mut self, mac: [u8; 6]) {
        self.set_mac_high(u16::from_be_bytes([mac[0], mac[1]]));
        self.set_mac_low(u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]));
    }
}

layout! {
    /// FUNC_CLEAR payload: the driver writes the function id, then polls with the WR
    /// flag until FUNC_DONE is set.
    pub struct FunctionClear[24] {
        /// Function to clear.
        FUNC_ID / function_id / set_function_id: u32 = 31:0,
        /// Set by firmware when the clear is complete.
        FUNC_DONE / done / set_done: bool = 32:32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{check_fields, Layout};

    fn all_layouts_are_well_formed<L: Layout>() {
        check_fields(L::NAME, L::SIZE, L::FIELDS).unwrap();
    }

    #[test]
    fn payload_layouts_have_no_overlapping_fields() {
        all_layouts_are_well_formed::<Descriptor>();
        all_layouts_are_well_formed::<HardwareVersion>();
        all_layouts_are_well_formed::<FirmwareVersion>();
        all_layouts_are_well_formed::<GlobalParam>();
        all_layouts_are_well_formed::<FunctionInfo>();
        all_layouts_are_well_formed::<FunctionResourcesA>();
        all_layouts_are_well_formed::<FunctionResourcesB>();
        all_layouts_are_well_formed::<BaseAddressTableAttributes>();
        all_layouts_are_well_formed::<GidEntry>();
        all_layouts_are_well_formed::<SmacEntry>();
        all_layouts_are_well_formed::<FunctionClear>();
    }

    const KNOWN_DESCRIPTOR: [u8; 32] = [
        0x04, 0x85, // opcode 0x8504 POST_MB
        0x05, 0x00, // flags IN | NEXT
        0x06, 0x00, // retval PARA_ERR
        0x00, 0x00, // reserved
        0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn descriptor_parses_known_bytes() {
        let d = Descriptor::parse(&KNOWN_DESCRIPTOR).unwrap();
        assert_eq!(d.opcode(), 0x8504);
        assert_eq!(Opcode::from_raw(d.opcode()), Some(Opcode::PostMailbox));
        assert_eq!(d.flags(), DescriptorFlags::IN | DescriptorFlags::NEXT);
        assert_eq!(ReturnCode::from_raw(d.return_value()), ReturnCode::ParameterError);
        assert_eq!(&d.data()[..4], &[0x11, 0x22, 0x33, 0x44]);
    }

    #[test]
    fn descriptor_emits_known_bytes() {
        let mut d = Descriptor::new(Opcode::PostMailbox, DescriptorFlags::IN | DescriptorFlags::NEXT);
        d.set_return_value(ReturnCode::ParameterError as u16);
        d.data_mut()[..4].copy_from_slice(&[0x11, 0x22, 0x33, 0x44]);
        let mut out = [0u8; 32];
        d.emit(&mut out).unwrap();
        assert_eq!(out, KNOWN_DESCRIPTOR);
    }

    #[test]
    fn descriptor_round_trips_and_rejects_truncated_input() {
        let mut d = Descriptor::new(Opcode::QueryCapabilities, DescriptorFlags::IN);
        d.data_mut().copy_from_slice(&[7u8; 24]);
        let mut out = [0u8; 40];
        d.emit(&mut out).unwrap();
        assert_eq!(Descriptor::parse(&out).unwrap(), d);
        assert_eq!(
            Descriptor::parse(&out[..31]),
            Err(crate::LayoutError::Truncated {
                layout: "Descriptor",
                expected: 32,
                actual: 31
            })
        );
        assert!(d.emit(&mut [0u8; 31]).is_err());
    }

    #[test]
    fn every_opcode_decodes_to_itself_and_unknown_opcodes_do_not() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_raw(op as u16), Some(op));
        }
        assert_eq!(Opcode::from_raw(0x1234), None);
        assert_eq!(Opcode::QueryCapabilities.descriptor_count(), 5);
    }

    #[test]
    fn return_codes_follow_hns_numbering() {
        for raw in 0..=12u16 {
            assert_eq!(ReturnCode::from_raw(raw) as u16, raw);
        }
        assert_eq!(ReturnCode::from_raw(0x42), ReturnCode::Other);
    }

    #[test]
    fn bt_attributes_parse_known_bytes() {
        // QPC: BA pg 0, buf pg 1, hop 2 -> byte0 = 0x10, byte1 = 0x02; MPT hop 3 at bits 105:104.
        let mut bytes = [0u8; 24];
        bytes[0] = 0x10;
        bytes[1] = 0x02;
        bytes[13] = 0x03;
        let a = BaseAddressTableAttributes::parse(&bytes).unwrap();
        assert_eq!(a.qpc_ba_page_size(), 0);
        assert_eq!(a.qpc_buffer_page_size(), 1);
        assert_eq!(a.qpc_hop_number(), 2);
        assert_eq!(a.mpt_hop_number(), 3);
        let mut b = BaseAddressTableAttributes::zeroed();
        b.set_qpc_buffer_page_size(1);
        b.set_qpc_hop_number(2);
        b.set_mpt_hop_number(3);
        assert_eq!(b.0, bytes);
    }

    #[test]
    fn smac_and_gid_entries_keep_network_byte_order() {
        let mut s = SmacEntry::zeroed();
        s.set_mac([0x02, 0x00, 0x5e, 0x10, 0x20, 0x30]);
        assert_eq!(s.mac(), [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30]);
        let mut g = GidEntry::zeroed();
        let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        g.set_gid(gid);
        assert_eq!(g.gid(), gid);
        assert_eq!(g.0[4], 0xfe);
    }

    use crate::context::testutil::{assert_rejects_truncated, assert_round_trips_every_field};

    #[test]
    fn every_payload_layout_round_trips_and_rejects_truncated_input() {
        fn check<L: Layout>(seed: u64) {
            assert_round_trips_every_field::<L>(seed);
            assert_rejects_truncated::<L>();
        }
        check::<Descriptor>(1);
        check::<HardwareVersion>(2);
        check::<FirmwareVersion>(3);
        check::<GlobalParam>(4);
        check::<FunctionInfo>(5);
        check::<FunctionResourcesA>(6);
        check::<FunctionResourcesB>(7);
        check::<BaseAddressTableAttributes>(8);
        check::<GidEntry>(9);
        check::<SmacEntry>(10);
        check::<FunctionClear>(11);
    }

    /// Parses `bytes`, checks it with `expect`, and checks that `build` emits the same bytes.
    fn known<L: Layout + std::fmt::Debug>(bytes: [u8; 24], expect: impl Fn(&L), build: impl Fn(&mut L)) {
        let parsed = L::parse(&bytes).unwrap();
        expect(&parsed);
        let mut built = L::zeroed();
        build(&mut built);
        assert_eq!(built.bytes(), &bytes[..], "{} emits the known bytes", L::NAME);
    }

    fn bytes_with(pairs: &[(usize, u8)]) -> [u8; 24] {
        let mut b = [0u8; 24];
        for (i, v) in pairs {
            b[*i] = *v;
        }
        b
    }

    #[test]
    fn version_payloads_parse_and_emit_known_bytes() {
        known::<FirmwareVersion>(
            bytes_with(&[(0, 0x03), (1, 0x02), (2, 0x01)]),
            |v| assert_eq!(v.version(), 0x0001_0203),
            |v| v.set_version(0x0001_0203),
        );
        known::<HardwareVersion>(
            bytes_with(&[(0, 0x34), (1, 0x12), (2, 0x30), (3, 0x01)]),
            |v| {
                assert_eq!(v.vendor_id(), 0x1234);
                assert_eq!(v.hardware_version(), 0x130);
            },
            |v| {
                v.set_vendor_id(0x1234);
                v.set_hardware_version(0x130);
            },
        );
    }

    #[test]
    fn global_param_packs_cycles_and_udp_port() {
        // 999 cycles/us = 0x3E7 in bits 9:0; port 4791 = 0x12B7 in bits 31:16.
        known::<GlobalParam>(
            bytes_with(&[(0, 0xE7), (1, 0x03), (2, 0xB7), (3, 0x12)]),
            |g| {
                assert_eq!(g.cycles_per_microsecond(), 999);
                assert_eq!(g.udp_port(), 4791);
            },
            |g| {
                g.set_cycles_per_microsecond(999);
                g.set_udp_port(4791);
            },
        );
    }

    #[test]
    fn function_info_and_clear_parse_and_emit_known_bytes() {
        known::<FunctionInfo>(
            bytes_with(&[(0, 1), (4, 7)]),
            |f| {
                assert_eq!(f.function_count(), 1);
                assert_eq!(f.mac_id(), 7);
            },
            |f| {
                f.set_function_count(1);
                f.set_mac_id(7);
            },
        );
        known::<FunctionClear>(
            bytes_with(&[(0, 2), (4, 1)]),
            |f| {
                assert_eq!(f.function_id(), 2);
                assert!(f.done());
            },
            |f| {
                f.set_function_id(2);
                f.set_done(true);
            },
        );
    }

    #[test]
    fn function_resources_parse_and_emit_known_bytes() {
        // A: QPC_BT_NUM 59:48 = 256 -> byte 6 = 0x00, byte 7 = 0x01; EQC_BT_NUM 185:176 = 16 -> byte 22 = 0x10.
        known::<FunctionResourcesA>(
            bytes_with(&[(0, 3), (7, 0x01), (22, 0x10)]),
            |a| {
                assert_eq!(a.function_id(), 3);
                assert_eq!(a.qpc_bt_count(), 256);
                assert_eq!(a.eqc_bt_count(), 16);
            },
            |a| {
                a.set_function_id(3);
                a.set_qpc_bt_count(256);
                a.set_eqc_bt_count(16);
            },
        );
        // B: SMAC_NUM 48:40 = 0x101 -> byte 5 bits 7:0 = 0x01, byte 6 bit 0 = 1; SGID_NUM 80:72 = 16 -> byte 9 = 0x10.
        known::<FunctionResourcesB>(
            bytes_with(&[(5, 0x01), (6, 0x01), (9, 0x10)]),
            |b| {
                assert_eq!(b.smac_count(), 0x101);
                assert_eq!(b.sgid_count(), 16);
            },
            |b| {
                b.set_smac_count(0x101);
                b.set_sgid_count(16);
            },
        );
    }

    #[test]
    fn gid_and_smac_entries_parse_and_emit_known_bytes() {
        let mut gid_bytes = bytes_with(&[(0, 5), (20, 2)]);
        gid_bytes[4..20].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        known::<GidEntry>(
            gid_bytes,
            |g| {
                assert_eq!(g.index(), 5);
                assert_eq!(g.gid()[0], 0xfe);
                assert_eq!(g.gid_type(), GidType::RoceV2Ipv6 as u8);
            },
            |g| {
                g.set_index(5);
                g.set_gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
                g.set_gid_type(GidType::RoceV2Ipv6 as u8);
            },
        );
        // MAC 02:00:5e:10:20:30: low dword (bytes 4..8) holds 5e102030 little-endian, high 16 bits 0200.
        known::<SmacEntry>(
            bytes_with(&[(0, 1), (4, 0x30), (5, 0x20), (6, 0x10), (7, 0x5e), (8, 0x00), (9, 0x02)]),
            |s| {
                assert_eq!(s.index(), 1);
                assert_eq!(s.mac(), [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30]);
            },
            |s| {
                s.set_index(1);
                s.set_mac([0x02, 0x00, 0x5e, 0x10, 0x20, 0x30]);
            },
        );
    }
}
