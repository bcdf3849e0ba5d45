//! # rnic-rdmacm — `librdmacm.so.1` for rnic-emu
//!
//! The real librdmacm talks to the kernel's `/dev/infiniband/rdma_cm`, which knows
//! nothing of our device. This library exports rdma-core's `RDMACM_1.x` symbols so that
//! unmodified programs linked against it (perftest, rdmacm-utils, qperf, fio) load next to
//! our `libibverbs.so.1`.
//!
//! The connection manager itself is not in this build yet: every `rdma_*` call that
//! needs it fails with `ENOSYS` (-1/NULL with errno, as rdma-core documents) and says so
//! once on stderr; rsockets (`r*`) fail with `ENOSYS` too. `rdma_event_str` answers, and
//! the release functions accept NULL. perftest's default mode (TCP exchange) never calls
//! into this library.
//!
//! When the CM lands, these entry points forward to the devices of our libibverbs (the
//! one device instance of the process) through its private `RNIC_PRIVATE_1` symbols,
//! never through a second copy of the driver.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::Once;

fn refuse(function: &str) {
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!(
            "rnic: {function}: the RDMA connection manager is not available in this build of rnic-emu's librdmacm \
             (ENOSYS); use the program's TCP exchange instead (perftest without -R)"
        )
    });
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

macro_rules! minus_one {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: −1, errno `ENOSYS`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            refuse(stringify!($name));
            -1
        }
    )*};
}

macro_rules! null {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: NULL, errno `ENOSYS`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            refuse(stringify!($name));
            std::ptr::null_mut()
        }
    )*};
}

macro_rules! nothing {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: nothing to release.")]
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

null!(rdma_create_event_channel, rdma_get_devices, rdma_create_srq);
minus_one!(
    rdma_create_id,
    rdma_destroy_id,
    rdma_bind_addr,
    rdma_resolve_addr,
    rdma_resolve_route,
    rdma_create_qp,
    rdma_create_qp_ex,
    rdma_connect,
    rdma_listen,
    rdma_accept,
    rdma_reject,
    rdma_notify,
    rdma_disconnect,
    rdma_join_multicast,
    rdma_leave_multicast,
    rdma_get_cm_event,
    rdma_ack_cm_event,
    rdma_set_option,
    rdma_migrate_id,
    rdma_getaddrinfo,
    rdma_create_ep,
    rdma_get_request,
    rdma_join_multicast_ex,
    rdma_establish,
    rdma_init_qp_attr,
    rdma_set_local_ece,
    rdma_get_remote_ece,
    rdma_destroy_srq,
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rpoll,
    rselect,
    rgetpeername,
    rgetsockname,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    riounmap
);
nothing!(
    rdma_destroy_event_channel,
    rdma_destroy_qp,
    rdma_free_devices,
    rdma_freeaddrinfo,
    rdma_destroy_ep
);

macro_rules! minus_one_isize {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: −1, errno `ENOSYS`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            refuse(stringify!($name));
            -1
        }
    )*};
}

minus_one_isize!(
    rrecv, rrecvfrom, rrecvmsg, rsend, rsendto, rsendmsg, rread, rreadv, rwrite, rwritev, riomap, riowrite
);

/// `rdma_get_src_port`: 0 (no CM identifiers exist).
#[no_mangle]
pub extern "C" fn rdma_get_src_port(_id: *mut c_void) -> u16 {
    0
}

/// `rdma_get_dst_port`: 0 (no CM identifiers exist).
#[no_mangle]
pub extern "C" fn rdma_get_dst_port(_id: *mut c_void) -> u16 {
    0
}

/// `rdma_event_str`: the names of `enum rdma_cm_event_type`.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"UNKNOWN EVENT".as_ptr(), |n| n.as_ptr())
}

include!(concat!(env!("OUT_DIR"), "/symver.rs"));
