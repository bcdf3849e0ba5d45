//! The C structures of `infiniband/verbs.h` (rdma-core v44, x86-64/AArch64 LP64) that
//! cross the ABI, with their layouts asserted at compile time (offsets checked with
//! `pahole` against the installed header; `tests/layout.rs` re-checks them with the C
//! compiler when the header is installed).
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

pub type Pthread40 = [u64; 5];
pub type Cond48 = [u64; 6];

#[repr(C)]
pub struct ibv_device {
    pub _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops`: 32 pointers; the slots we fill are named.
pub mod ops {
    pub const COMPAT_QUERY_DEVICE: usize = 0;
    pub const COMPAT_QUERY_PORT: usize = 1;
    pub const ALLOC_MW: usize = 7;
    pub const BIND_MW: usize = 8;
    pub const DEALLOC_MW: usize = 9;
    pub const POLL_CQ: usize = 11;
    pub const REQ_NOTIFY_CQ: usize = 12;
    pub const POST_SRQ_RECV: usize = 20;
    pub const POST_SEND: usize = 25;
    pub const POST_RECV: usize = 26;
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: [*const c_void; 32],
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub _pad: u32,
    pub mutex: Pthread40,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended ops in front of the context; slot = offset / 8.
pub mod vops {
    pub const QUERY_PORT: usize = 0;
    pub const ALLOC_NULL_MR: usize = 0x010 / 8;
    pub const CREATE_COUNTERS: usize = 0x028 / 8;
    pub const REG_DM_MR: usize = 0x038 / 8;
    pub const ALLOC_DM: usize = 0x040 / 8;
    pub const CREATE_FLOW_ACTION_ESP: usize = 0x060 / 8;
    pub const ALLOC_PARENT_DOMAIN: usize = 0x070 / 8;
    pub const ALLOC_TD: usize = 0x080 / 8;
    pub const MODIFY_CQ: usize = 0x088 / 8;
    pub const CREATE_RWQ_IND_TABLE: usize = 0x0a0 / 8;
    pub const CREATE_WQ: usize = 0x0b8 / 8;
    pub const CREATE_CQ_EX: usize = 0x0c8 / 8;
    pub const QUERY_DEVICE_EX: usize = 0x0d8 / 8;
    pub const CREATE_FLOW: usize = 0x0f0 / 8;
    pub const OPEN_QP: usize = 0x100 / 8;
    pub const CREATE_QP_EX: usize = 0x108 / 8;
    pub const CREATE_SRQ_EX: usize = 0x118 / 8;
    pub const OPEN_XRCD: usize = 0x120 / 8;
}

#[repr(C)]
pub struct verbs_context {
    pub ops: [*const c_void; 38],
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `sizeof(struct verbs_context)` in rdma-core v44: every v44 extended op is eligible.
pub const VERBS_CONTEXT_SIZE: usize = 648;

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: Pthread40,
    pub cond: Cond48,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: Pthread40,
    pub cond: Cond48,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: Pthread40,
    pub cond: Cond48,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    pub imm_data: u32,
    /// The `wr` union (rdma / atomic / ud), 32 bytes.
    pub wr: [u64; 4],
    pub xrc_remote_srqn: u32,
    pub _pad: u32,
    /// The bind_mw / tso union, 48 bytes.
    pub tail: [u64; 6],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `dgid` is `union ibv_gid`, whose `global` view holds two `__be64`: 8-byte aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    /// rdma-core v56+ (`active_speed_ex`); copied only when the caller's size covers it.
    pub active_speed_ex: u32,
}

/// The 48 bytes the exported `ibv_query_port` writes (the old layout).
pub const PORT_ATTR_OLD_SIZE: usize = 48;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_device_attr_ex` (400 bytes): `orig_attr`, then the extended part, which
/// we report as all zero except `phys_port_cnt_ex` and `completion_timestamp_mask`.
pub const DEVICE_ATTR_EX_SIZE: usize = 400;
pub const DEVICE_ATTR_EX_PHYS_PORT_CNT_EX: usize = 396;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

const _: () = {
    assert!(size_of::<ibv_device>() == 664);
    assert!(size_of::<ibv_context>() == 328);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, mutex) == 0x118);
    assert!(offset_of!(ibv_context, abi_compat) == 0x140);
    assert!(size_of::<verbs_context>() == VERBS_CONTEXT_SIZE);
    assert!(offset_of!(verbs_context, sz) == 0x138);
    assert!(offset_of!(verbs_context, context) == 0x140);
    assert!(size_of::<ibv_pd>() == 16);
    assert!(size_of::<ibv_mr>() == 48 && offset_of!(ibv_mr, lkey) == 36);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(size_of::<ibv_cq>() == 128 && offset_of!(ibv_cq, comp_events_completed) == 120);
    assert!(size_of::<ibv_srq>() == 128 && offset_of!(ibv_srq, events_completed) == 120);
    assert!(size_of::<ibv_qp>() == 160 && offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_qp, events_completed) == 152);
    assert!(size_of::<ibv_ah>() == 24);
    assert!(size_of::<ibv_wc>() == 48 && offset_of!(ibv_wc, wc_flags) == 36);
    assert!(size_of::<ibv_send_wr>() == 128 && offset_of!(ibv_send_wr, wr) == 40);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136 && offset_of!(ibv_qp_init_attr_ex, send_ops_flags) == 128);
    assert!(offset_of!(ibv_qp_init_attr_ex, pd) == 64 && offset_of!(ibv_qp_init_attr_ex, source_qpn) == 120);
    assert!(size_of::<ibv_ah_attr>() == 32 && offset_of!(ibv_ah_attr, dlid) == 24);
    assert!(std::mem::align_of::<ibv_ah_attr>() == 8);
    assert!(size_of::<ibv_qp_attr>() == 144 && offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120 && offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(offset_of!(ibv_port_attr, port_cap_flags2) == 48 && size_of::<ibv_port_attr>() == 56);
    assert!(size_of::<ibv_device_attr>() == 232 && offset_of!(ibv_device_attr, max_pkeys) == 224);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_async_event>() == 16);
};

// Enum values (verbs.h).
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 3;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
pub const IBV_ACCESS_ZERO_BASED: u32 = 0x20;
pub const IBV_ACCESS_ON_DEMAND: u32 = 0x40;
pub const IBV_ACCESS_HUGETLB: u32 = 0x80;
pub const IBV_ACCESS_MW_BIND: u32 = 0x10;
pub const IBV_SEND_INLINE: u32 = 8;
pub const IBV_WC_WITH_IMM: u32 = 2;
pub const IBV_WC_WITH_INV: u32 = 8;
