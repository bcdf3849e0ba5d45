//! # rnic-mlx5 — a stub `libmlx5.so.1`
//!
//! perftest links `libmlx5.so.1` for ConnectX-only features (DC transport, AES-XTS,
//! DEVX). rnic-emu is not a ConnectX, so perftest never calls these for our device in its
//! default modes; if something does, the call fails with `EOPNOTSUPP` (NULL or the errno
//! as value) and a line on stderr, never a crash. Keeping rdma-core's real provider library
//! instead would need 61 private libibverbs internals.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

fn refuse(function: &str) {
    eprintln!("rnic: {function}: mlx5 direct verbs are not supported (the device is rnic-emu, not a ConnectX)");
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
}

macro_rules! null_functions {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: NULL, errno `EOPNOTSUPP`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            refuse(stringify!($name));
            std::ptr::null_mut()
        }
    )*};
}

macro_rules! errno_functions {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "`: returns `EOPNOTSUPP`.")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            refuse(stringify!($name));
            libc::EOPNOTSUPP
        }
    )*};
}

null_functions!(
    mlx5dv_create_qp,
    mlx5dv_open_device,
    mlx5dv_create_mkey,
    mlx5dv_qp_ex_from_ibv_qp_ex,
    mlx5dv_dek_create
);
errno_functions!(
    mlx5dv_devx_general_cmd,
    mlx5dv_destroy_mkey,
    mlx5dv_crypto_login,
    mlx5dv_dek_destroy
);

include!(concat!(env!("OUT_DIR"), "/symver.rs"));
