//! # rnic-rdmacm — `librdmacm.so.1` for rnic-emu
//!
//! The real librdmacm talks to the kernel's `/dev/infiniband/rdma_cm`, which knows
//! nothing of our device. This library exports rdma-core's `RDMACM_1.x` symbols so that
//! unmodified programs linked against it (perftest, rdmacm-utils, qperf, fio) load next to
//! our `libibverbs.so.1`.
//!
//! Every `rdma_*` function forwards to the function of the same name with the prefix
//! `rnic_` in our `libibverbs.so.1` (version node `RNIC_PRIVATE_1`), found with `dlopen`/
//! `dlsym` on first use: the connection manager runs there, on the process's one device
//! instance, never on a second copy of the driver. Without our libibverbs (the system's
//! was loaded instead) every call fails with `ENOSYS` and one line on stderr.
//!
//! Not supported: rsockets (`rsocket`, `rsend`, … fail with `ENOSYS`), SRQs made by
//! `rdma_create_srq`, ECE, multicast (`EOPNOTSUPP` from libibverbs).
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
// The forwarding table spells every return type, `()` included.
#![allow(clippy::unused_unit)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Once, OnceLock};

fn refuse(function: &str, why: &str) {
    static SAID: Once = Once::new();
    SAID.call_once(|| eprintln!("rnic: {function}: {why}"));
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

/// Our libibverbs, opened once (it is already loaded: this returns the same instance).
fn library() -> *mut c_void {
    static HANDLE: OnceLock<usize> = OnceLock::new();
    *HANDLE.get_or_init(|| {
        // SAFETY: dlopen of a library by soname; RTLD_NOLOAD first so an application that
        // loaded it keeps its one instance, then a normal load.
        unsafe {
            let name = c"libibverbs.so.1";
            let mut handle = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if handle.is_null() {
                handle = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            }
            handle as usize
        }
    }) as *mut c_void
}

/// The address of `name` in our libibverbs, or None (with the reason said once).
fn resolve(function: &str, name: &CStr) -> Option<usize> {
    let handle = library();
    if handle.is_null() {
        refuse(function, "libibverbs.so.1 cannot be loaded (ENOSYS)");
        return None;
    }
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
    if address == 0 {
        refuse(
            function,
            "the loaded libibverbs.so.1 is not rnic-emu's (its connection manager is missing; put rnic-emu's \
             libraries first in LD_LIBRARY_PATH) (ENOSYS)",
        );
        return None;
    }
    Some(address)
}

macro_rules! forward {
    ($($name:ident => $private:literal ($($arg:ident: $ty:ty),*) -> $ret:ty = $fail:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: forwarded to our libibverbs.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            static ADDRESS: OnceLock<Option<usize>> = OnceLock::new();
            let Some(address) = *ADDRESS.get_or_init(|| resolve(stringify!($name), $private)) else {
                return $fail;
            };
            // SAFETY: the function of this signature in our libibverbs (same source tree).
            let function: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(address) };
            // SAFETY: the application's arguments, passed on unchanged.
            unsafe { function($($arg),*) }
        }
    )*};
}

type P = *mut c_void;

forward! {
    rdma_create_event_channel => c"rnic_rdma_create_event_channel" () -> P = std::ptr::null_mut();
    rdma_destroy_event_channel => c"rnic_rdma_destroy_event_channel" (channel: P) -> () = ();
    rdma_create_id => c"rnic_rdma_create_id" (channel: P, id: P, context: P, ps: c_int) -> c_int = -1;
    rdma_destroy_id => c"rnic_rdma_destroy_id" (id: P) -> c_int = -1;
    rdma_bind_addr => c"rnic_rdma_bind_addr" (id: P, address: P) -> c_int = -1;
    rdma_resolve_addr => c"rnic_rdma_resolve_addr" (id: P, source: P, destination: P, timeout: c_int) -> c_int = -1;
    rdma_resolve_route => c"rnic_rdma_resolve_route" (id: P, timeout: c_int) -> c_int = -1;
    rdma_create_qp => c"rnic_rdma_create_qp" (id: P, pd: P, attr: P) -> c_int = -1;
    rdma_create_qp_ex => c"rnic_rdma_create_qp_ex" (id: P, attr: P) -> c_int = -1;
    rdma_destroy_qp => c"rnic_rdma_destroy_qp" (id: P) -> () = ();
    rdma_connect => c"rnic_rdma_connect" (id: P, param: P) -> c_int = -1;
    rdma_listen => c"rnic_rdma_listen" (id: P, backlog: c_int) -> c_int = -1;
    rdma_get_request => c"rnic_rdma_get_request" (listen: P, id: P) -> c_int = -1;
    rdma_accept => c"rnic_rdma_accept" (id: P, param: P) -> c_int = -1;
    rdma_reject => c"rnic_rdma_reject" (id: P, data: P, length: u8) -> c_int = -1;
    rdma_disconnect => c"rnic_rdma_disconnect" (id: P) -> c_int = -1;
    rdma_establish => c"rnic_rdma_establish" (id: P) -> c_int = -1;
    rdma_get_cm_event => c"rnic_rdma_get_cm_event" (channel: P, event: P) -> c_int = -1;
    rdma_ack_cm_event => c"rnic_rdma_ack_cm_event" (event: P) -> c_int = -1;
    rdma_set_option => c"rnic_rdma_set_option" (id: P, level: c_int, name: c_int, value: P, length: usize) -> c_int = -1;
    rdma_migrate_id => c"rnic_rdma_migrate_id" (id: P, channel: P) -> c_int = -1;
    rdma_init_qp_attr => c"rnic_rdma_init_qp_attr" (id: P, attr: P, mask: P) -> c_int = -1;
    rdma_notify => c"rnic_rdma_notify" (id: P, event: c_int) -> c_int = -1;
    rdma_join_multicast => c"rnic_rdma_join_multicast" (id: P, address: P, context: P) -> c_int = -1;
    rdma_join_multicast_ex => c"rnic_rdma_join_multicast" (id: P, attr: P, context: P) -> c_int = -1;
    rdma_leave_multicast => c"rnic_rdma_leave_multicast" (id: P, address: P) -> c_int = -1;
    rdma_get_src_port => c"rnic_rdma_get_src_port" (id: P) -> u16 = 0;
    rdma_get_dst_port => c"rnic_rdma_get_dst_port" (id: P) -> u16 = 0;
    rdma_get_devices => c"rnic_rdma_get_devices" (num: P) -> P = std::ptr::null_mut();
    rdma_free_devices => c"rnic_rdma_free_devices" (list: P) -> () = ();
    rdma_getaddrinfo => c"rnic_rdma_getaddrinfo" (node: P, service: P, hints: P, result: P) -> c_int = -1;
    rdma_freeaddrinfo => c"rnic_rdma_freeaddrinfo" (info: P) -> () = ();
    rdma_create_ep => c"rnic_rdma_create_ep" (id: P, info: P, pd: P, attr: P) -> c_int = -1;
    rdma_destroy_ep => c"rnic_rdma_destroy_ep" (id: P) -> () = ();
}

fn unsupported(function: &str) {
    refuse(function, "not supported by rnic-emu's librdmacm (ENOSYS)");
}

macro_rules! minus_one {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: −1, errno `ENOSYS`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            unsupported(stringify!($name));
            -1
        }
    )*};
}

macro_rules! minus_one_isize {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: −1, errno `ENOSYS`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            unsupported(stringify!($name));
            -1
        }
    )*};
}

minus_one!(
    rdma_destroy_srq,
    rdma_set_local_ece,
    rdma_get_remote_ece,
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
minus_one_isize!(
    rrecv, rrecvfrom, rrecvmsg, rsend, rsendto, rsendmsg, rread, rreadv, rwrite, rwritev, riomap, riowrite
);

/// `rdma_create_srq`: NULL, errno `ENOSYS` (create the SRQ with `ibv_create_srq`).
#[no_mangle]
pub extern "C" fn rdma_create_srq() -> *mut c_void {
    unsupported("rdma_create_srq");
    std::ptr::null_mut()
}

/// `rdma_event_str`: the names of `enum rdma_cm_event_type`.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    const NAMES: [&CStr; 16] = [
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
