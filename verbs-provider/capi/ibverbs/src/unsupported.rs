//! What this device does not offer, failing as rdma-core documents (NULL + errno
//! `EOPNOTSUPP`, or the errno as the return value) with a `rnic::diag` diagnostic naming
//! the feature, never an abort and never a silent success. The extended ops are filled
//! (instead of left NULL, which the inline wrappers would also turn into `EOPNOTSUPP`)
//! so that the application's misuse is diagnosed.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use crate::abi::vops;
use crate::{diag, set_errno};

fn null(feature: &str) -> *mut c_void {
    diag!("{feature} is not supported by rnic-emu");
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

fn value(feature: &str) -> c_int {
    diag!("{feature} is not supported by rnic-emu");
    libc::EOPNOTSUPP
}

macro_rules! unsupported_null {
    ($($name:ident => $feature:expr;)*) => {$(
        #[doc = concat!("Fails: ", $feature, ".")]
        pub extern "C" fn $name() -> *mut c_void {
            null($feature)
        }
    )*};
}

macro_rules! unsupported_value {
    ($($name:ident => $feature:expr;)*) => {$(
        #[doc = concat!("Fails: ", $feature, ".")]
        pub extern "C" fn $name() -> c_int {
            value($feature)
        }
    )*};
}

unsupported_null! {
    alloc_mw => "ibv_alloc_mw (memory windows)";
    open_xrcd => "ibv_open_xrcd (XRC domains)";
    open_qp => "ibv_open_qp (XRC target QPs)";
    create_wq => "ibv_create_wq (work queues)";
    create_rwq_ind_table => "ibv_create_rwq_ind_table (RSS)";
    create_flow => "ibv_create_flow (flow steering)";
    create_flow_action_esp => "ibv_create_flow_action_esp (IPsec offload)";
    alloc_dm => "ibv_alloc_dm (device memory)";
    reg_dm_mr => "ibv_reg_dm_mr (device memory)";
    alloc_null_mr => "ibv_alloc_null_mr";
    alloc_td => "ibv_alloc_td (thread domains)";
    alloc_parent_domain => "ibv_alloc_parent_domain";
    create_counters => "ibv_create_counters";
    create_cq_ex => "ibv_create_cq_ex (extended CQs; use ibv_create_cq)";
}

unsupported_value! {
    bind_mw => "ibv_bind_mw (memory windows)";
    dealloc_mw => "ibv_dealloc_mw (memory windows)";
    modify_cq => "ibv_modify_cq (CQ moderation)";
}

/// Points the extended ops of unsupported features at the functions above.
pub fn fill_extended_ops(ops: &mut [*const c_void; 38]) {
    let table: [(usize, *const c_void); 15] = [
        (vops::OPEN_XRCD, open_xrcd as *const c_void),
        (vops::OPEN_QP, open_qp as *const c_void),
        (vops::CREATE_WQ, create_wq as *const c_void),
        (vops::CREATE_RWQ_IND_TABLE, create_rwq_ind_table as *const c_void),
        (vops::CREATE_FLOW, create_flow as *const c_void),
        (vops::CREATE_FLOW_ACTION_ESP, create_flow_action_esp as *const c_void),
        (vops::ALLOC_DM, alloc_dm as *const c_void),
        (vops::REG_DM_MR, reg_dm_mr as *const c_void),
        (vops::ALLOC_NULL_MR, alloc_null_mr as *const c_void),
        (vops::ALLOC_TD, alloc_td as *const c_void),
        (vops::ALLOC_PARENT_DOMAIN, alloc_parent_domain as *const c_void),
        (vops::CREATE_COUNTERS, create_counters as *const c_void),
        (vops::CREATE_CQ_EX, create_cq_ex as *const c_void),
        (vops::MODIFY_CQ, modify_cq as *const c_void),
        (vops::CREATE_WQ, create_wq as *const c_void),
    ];
    for (slot, function) in table {
        ops[slot] = function;
    }
}

// Exported entry points of features we lack.

/// `ibv_attach_mcast`: multicast is not supported.
#[no_mangle]
pub extern "C" fn ibv_attach_mcast(_qp: *mut c_void, _gid: *const c_void, _lid: u16) -> c_int {
    value("ibv_attach_mcast (multicast)")
}

/// `ibv_detach_mcast`: multicast is not supported.
#[no_mangle]
pub extern "C" fn ibv_detach_mcast(_qp: *mut c_void, _gid: *const c_void, _lid: u16) -> c_int {
    value("ibv_detach_mcast (multicast)")
}

/// `ibv_query_ece`.
#[no_mangle]
pub extern "C" fn ibv_query_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    value("ibv_query_ece (enhanced connection establishment)")
}

/// `ibv_set_ece`.
#[no_mangle]
pub extern "C" fn ibv_set_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    value("ibv_set_ece (enhanced connection establishment)")
}

/// `ibv_import_device`.
#[no_mangle]
pub extern "C" fn ibv_import_device(_fd: c_int) -> *mut c_void {
    null("ibv_import_device (shared contexts)")
}

/// `ibv_import_pd`.
#[no_mangle]
pub extern "C" fn ibv_import_pd(_context: *mut c_void, _handle: u32) -> *mut c_void {
    null("ibv_import_pd (shared objects)")
}

/// `ibv_import_mr`.
#[no_mangle]
pub extern "C" fn ibv_import_mr(_pd: *mut c_void, _handle: u32) -> *mut c_void {
    null("ibv_import_mr (shared objects)")
}

/// `ibv_import_dm`.
#[no_mangle]
pub extern "C" fn ibv_import_dm(_context: *mut c_void, _handle: u32) -> *mut c_void {
    null("ibv_import_dm (device memory)")
}

/// `ibv_unimport_pd`: nothing can have been imported.
#[no_mangle]
pub extern "C" fn ibv_unimport_pd(_pd: *mut c_void) {}

/// `ibv_unimport_mr`: nothing can have been imported.
#[no_mangle]
pub extern "C" fn ibv_unimport_mr(_mr: *mut c_void) {}

/// `ibv_unimport_dm`: nothing can have been imported.
#[no_mangle]
pub extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}

/// `ibv_reg_dmabuf_mr`.
#[no_mangle]
pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut c_void,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut c_void {
    null("ibv_reg_dmabuf_mr (dma-buf memory)")
}
