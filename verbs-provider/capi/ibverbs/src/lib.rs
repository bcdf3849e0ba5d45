//! # rnic-ibverbs — a drop-in `libibverbs.so.1` over the rnic-emu NIC
//!
//! Unmodified RDMA programs (perftest, ibverbs-utils, …) linked against rdma-core's
//! `libibverbs.so.1` run over the rnic-emu NIC when `LD_LIBRARY_PATH` points at this
//! library (`scripts/build-rdma-libs` builds it with its companions). The device is chosen
//! by `RNIC_DEVICE` ([`device`]); by default it is the NIC model in the calling process,
//! on UDP at 127.0.0.1, reaching the application's registered memory in place.
//!
//! * [`abi`]: the C structures, layouts asserted;
//! * [`verbs`]: the exported control path and the extended ops;
//! * [`datapath`]: `post_send`/`post_recv`/`poll_cq`/… behind `ibv_context.ops`;
//! * [`unsupported`]: XRC, memory windows, device memory, flow steering, … fail with
//!   `EOPNOTSUPP` and a `rnic::diag` diagnostic.
//!
//! Every exported symbol carries rdma-core's version node (`symbols.txt`, the build
//! script). Every entry point catches panics: a bug becomes `EIO` and a diagnostic, never
//! an unwind into C. Diagnostics go to stderr, filtered by `RNIC_LOG` (default `warn`).
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

pub mod abi;
pub mod datapath;
pub mod device;
pub mod misc;
pub mod rdmacm;
pub mod unsupported;
pub mod verbs;

include!(concat!(env!("OUT_DIR"), "/symver.rs"));

/// A diagnostic of the application's misuse (target `rnic::diag`).
#[macro_export]
macro_rules! diag {
    ($($arg:tt)*) => { tracing::warn!(target: "rnic::diag", $($arg)*) };
}

/// Sets the calling thread's `errno`.
pub fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
}

/// Runs an entry point's body; a panic becomes `on_panic` with `errno = EIO` and a
/// diagnostic, so nothing unwinds into C.
pub fn guard<R>(verb: &str, on_panic: R, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(target: "rnic::diag", "{verb}: internal error ({what}); failing the call with EIO");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Sends `tracing` output to stderr once, filtered by `RNIC_LOG` (default `warn`).
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("RNIC_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .try_init();
    });
}
