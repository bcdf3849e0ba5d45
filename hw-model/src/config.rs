//! Device configuration: identity, sizes, capabilities and the timing model's parameters
//! ([`TimingParams`], default the `hns-100g` preset; see `docs/timing.md`).

use rnic_firmware_if::caps::{CapFlags, DeviceCaps};

use crate::pci::PciIdentity;
use crate::timing::TimingParams;

/// Everything that distinguishes one device instance from another.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// PCI identity.
    pub identity: PciIdentity,
    /// Number of 4 KiB doorbell pages in BAR2 (page 0 belongs to the driver).
    pub doorbell_pages: u32,
    /// Capabilities reported by QUERY_PF_CAPS_NUM.
    pub caps: DeviceCaps,
    /// Context-table L0 slots reported by QUERY_PF_RES.
    pub bt_slots: BtSlots,
    /// Port MAC address (used for the default GID and as the SMAC table's entry 0).
    pub mac_address: [u8; 6],
    /// Firmware version reported by QUERY_FW_VER (major << 16 | minor << 8 | sub).
    pub firmware_version: u32,
    /// Hardware version reported by QUERY_HW_VER (hns hip09 user-visible value 0x130).
    pub hardware_version: u16,
    /// Timing-model parameters: every stage's cost, the control path's included.
    pub timing: TimingParams,
}

impl DeviceConfig {
    /// A configuration with the given MAC address and default everything else.
    pub fn with_mac(mac_address: [u8; 6]) -> Self {
        Self {
            mac_address,
            ..Self::default()
        }
    }
}

/// The capabilities of the default device: an hns-hip09-like function sized for a model.
/// Counts the hns encoding stores as log2 are powers of two.
pub fn default_caps() -> DeviceCaps {
    DeviceCaps {
        num_ports: 1,
        local_ca_ack_delay: 15,
        max_sq_sges: 64,
        max_sq_inline: 1024,
        max_rq_sges: 64,
        max_extend_sges: 0x20_0000,
        num_qpc_timers: 0,
        num_cqc_timers: 0,
        max_srq_sges: 64,
        num_aeq_vectors: 1,
        num_other_vectors: 1,
        max_sq_desc_size: 64,
        max_rq_desc_size: 16,
        max_srq_desc_size: 16,
        cqe_size: 64,
        mtpt_entry_size: 64,
        irrl_entry_size: 64,
        trrl_entry_size: 48,
        cqc_entry_size: 64,
        srqc_entry_size: 64,
        idx_entry_size: 4,
        sccc_size: 0,
        max_mtu: 5,
        qpc_size: rnic_firmware_if::context::QPC_SIZE as u16,
        qpc_timer_entry_size: 0,
        cqc_timer_entry_size: 0,
        min_cqes: 64,
        min_wqes: 64,
        page_size_cap: 0xFFFF_F000,
        pkey_table_length: 1,
        physical_uars: 1,
        context_hops: 1,
        pbl_hops: 2,
        num_pds: 1 << 20,
        flags: CapFlags::ROCE_V1_V2
            | CapFlags::SRQ
            | CapFlags::ATOMIC
            | CapFlags::CQ_RECORD_DB
            | CapFlags::QP_RECORD_DB,
        num_cqs: 1 << 16,
        max_gids: 16,
        max_cqes: 1 << 22,
        num_mtpts: 1 << 16,
        num_qps: 1 << 16,
        max_outstanding_reads: 128,
        max_sq_wqes: 1 << 15,
        max_rq_wqes: 1 << 15,
        num_srqs: 1 << 16,
        rq_wqe_hops: 2,
        ext_sge_hops: 1,
        sq_wqe_hops: 2,
        congestion_types: 1,
        max_srq_wqes: 1 << 15,
        ceq_depth: 1 << 12,
        num_ceqs: 4,
        aeq_depth: 1 << 12,
        aeq_arm_state: 3,
        ceq_arm_state: 3,
        reserved_pds: 1,
        num_uars: 64,
        reserved_qps: 8,
        reserved_uars: 1,
        reserved_mrws: 1,
        chunk_size: 1 << 16,
        reserved_cqs: 1,
        reserved_srqs: 1,
        reserved_lkey: 0x100,
        ceq_max_count: 1,
        ceq_period: 0,
        aeq_max_count: 1,
        aeq_period: 0,
    }
}

/// Number of base-address-table L0 slots per context table (the `*_BT_NUM` values of
/// QUERY_PF_RES). With 4 KiB BT pages at hop 1, one slot covers 512 chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtSlots {
    /// QPC L0 slots.
    pub qpc: u16,
    /// MPT L0 slots.
    pub mpt: u16,
    /// CQC L0 slots.
    pub cqc: u16,
    /// SRQC L0 slots.
    pub srqc: u16,
    /// EQC L0 slots (reported only; EQ contexts live in the device).
    pub eqc: u16,
}

impl Default for BtSlots {
    fn default() -> Self {
        Self {
            qpc: 256,
            mpt: 256,
            cqc: 256,
            srqc: 256,
            eqc: 16,
        }
    }
}

/// Number of MSI-X vectors a device with `caps` needs: the abnormal vector(s), one per
/// AEQ and one per CEQ (hns §9.4 order).
pub fn msix_vector_count(caps: &DeviceCaps) -> u16 {
    caps.num_other_vectors as u16 + caps.num_aeq_vectors as u16 + caps.num_ceqs
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            identity: PciIdentity::default(),
            doorbell_pages: 64,
            caps: default_caps(),
            bt_slots: BtSlots::default(),
            mac_address: [0x02, 0x52, 0x4e, 0x49, 0x43, 0x01],
            firmware_version: 0x0001_0000,
            hardware_version: 0x130,
            timing: TimingParams::default(),
        }
    }
}
