//! Per-thread and per-process settings of the emulator: network namespaces, timer
//! slack, termination signals.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::check;

/// Moves the calling thread into the network namespace `/run/netns/NAME` (as made by
/// `ip netns add NAME`). Sockets the thread creates afterwards, such as an `eth:`
/// backend's packet socket, belong to that namespace and keep it when used from other
/// threads; other threads are not affected. Needs CAP_SYS_ADMIN. For tests and tools
/// that run several emulated NICs in namespaces of one process.
pub fn enter_network_namespace(name: &str) -> io::Result<()> {
    let file = File::open(Path::new("/run/netns").join(name))?;
    // SAFETY: setns on a valid descriptor we own for the duration of the call; it changes
    // only this thread's namespace and takes no pointers.
    check(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })?;
    Ok(())
}

/// Sets the calling thread's timer slack (how late the kernel may wake a sleeping thread
/// to batch wake-ups; 50 µs by default), so that the doorbell poller's short back-off
/// sleeps are as short as asked. Best effort.
pub fn set_thread_timer_slack(slack: Duration) {
    let nanoseconds = slack.as_nanos().clamp(1, u64::MAX as u128) as libc::c_ulong;
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes integers only and affects this thread only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0) };
}

// ---- termination signals ----------------------------------------------------------------

static TERMINATION_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_termination_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    TERMINATION_REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs SIGINT and SIGTERM handlers that set a flag (see [`termination_requested`])
/// instead of killing the process, so the server can remove its socket and exit cleanly.
/// Without `SA_RESTART`, a `ppoll` in progress returns at once.
pub fn install_termination_handlers() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain old data; all-zero is a valid value (empty mask).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_termination_signal as *const () as usize;
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe;
        // `action` is valid for the call and the old action is not requested.
        check(unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) })?;
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM arrived since [`install_termination_handlers`].
pub fn termination_requested() -> bool {
    TERMINATION_REQUESTED.load(Ordering::SeqCst)
}
