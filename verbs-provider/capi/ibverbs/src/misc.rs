//! Small exported helpers: names of enum values, rate conversions, fork support.

use std::ffi::{c_char, c_int, c_void};

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    match node_type {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    }
    .as_ptr()
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    match state {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    }
    .as_ptr()
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"unknown".as_ptr(), |n| n.as_ptr())
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"unknown".as_ptr(), |n| n.as_ptr())
}

/// (enum ibv_rate, multiple of 2.5 Gb/s, Mb/s).
const RATES: [(c_int, c_int, c_int); 21] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (7, 12, 30000),
    (4, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 20, 50000),
    (20, 160, 400000),
    (21, 240, 600000),
    (22, 320, 800000),
];

/// `ibv_rate_to_mult`.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// `ibv_fork_init`: nothing to do (no kernel page pinning here).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (2).
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range`.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_query_qp_data_in_order`: no guarantee is given (0).
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut c_void, _op: c_int, _flags: u32) -> c_int {
    0
}
