//! # rnic-efa — a stub `libefa.so.1`
//!
//! perftest links `libefa.so.1` for the SRD transport of AWS EFA devices. rnic-emu is not
//! one: the calls fail with `EOPNOTSUPP` and a line on stderr, never a crash.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

fn refuse(function: &str) {
    eprintln!("rnic: {function}: EFA direct verbs are not supported (the device is rnic-emu, not EFA)");
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
}

/// `efadv_create_qp_ex`: NULL, errno `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn efadv_create_qp_ex() -> *mut c_void {
    refuse("efadv_create_qp_ex");
    std::ptr::null_mut()
}

/// `efadv_query_device`: returns `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn efadv_query_device() -> c_int {
    refuse("efadv_query_device");
    libc::EOPNOTSUPP
}

include!(concat!(env!("OUT_DIR"), "/symver.rs"));
