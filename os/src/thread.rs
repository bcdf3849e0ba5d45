//! Helper threads of a library that runs inside someone else's process.
//!
//! A process-directed signal (`kill(getpid(), …)`) goes to any one thread that does not
//! block it. Applications that take their signals synchronously block them in their own
//! threads and read them from a `signalfd` or `sigwait` — Debian's `tgtd` does this with
//! `SIGUSR2` for every finished backing-store I/O. A thread of ours that left the signal
//! unblocked would receive it instead, with its default action (for `SIGUSR2`: the
//! process ends). So the drop-in libraries start their threads with every asynchronous
//! signal blocked, as library threads should.

#![allow(unsafe_code)]

use std::io;
use std::thread::{Builder, JoinHandle};

/// Signals a fault raises in the faulting thread: blocking them would not stop the kernel
/// from delivering them, only make the outcome undefined, so they stay unblocked.
const SYNCHRONOUS_SIGNALS: [libc::c_int; 5] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP];

/// Spawns a thread that starts with every asynchronous signal blocked, so signals sent to
/// the process reach the application's threads only. The calling thread's mask is
/// blocked for the instant of the spawn (the new thread inherits it) and then restored.
pub fn spawn_with_signals_blocked<F, T>(builder: Builder, body: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let mut all = empty_set();
    // SAFETY: `all` is a live sigset_t; sigfillset/sigdelset only write it.
    unsafe {
        libc::sigfillset(&mut all);
        for signal in SYNCHRONOUS_SIGNALS {
            libc::sigdelset(&mut all, signal);
        }
    }
    let mut previous = empty_set();
    // SAFETY: both pointers are live sigset_t values of this frame.
    let status = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous) };
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status));
    }
    let spawned = builder.spawn(body);
    // SAFETY: `previous` is the mask pthread_sigmask just reported; a null old-set pointer
    // is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
    spawned
}

/// Whether `signal` is blocked in the calling thread.
pub fn signal_blocked_in_this_thread(signal: libc::c_int) -> io::Result<bool> {
    let mut current = empty_set();
    // SAFETY: a null new-set pointer only queries; `current` is a live sigset_t.
    let status = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut current) };
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status));
    }
    // SAFETY: `current` was filled in by pthread_sigmask.
    Ok(unsafe { libc::sigismember(&current, signal) } == 1)
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it fully.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        set
    }
}

/// CPU time the calling thread has used (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`): what
/// a benchmark's work cost, whatever share of the CPUs a loaded machine gave it.
///
/// # Errors
/// What `clock_gettime` returns (never, on Linux).
pub fn thread_cpu_time() -> io::Result<std::time::Duration> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawned_thread_blocks_asynchronous_signals_and_the_caller_keeps_its_mask() {
        let before = signal_blocked_in_this_thread(libc::SIGUSR2).unwrap();
        let inside = spawn_with_signals_blocked(Builder::new().name("blocked".into()), || {
            [
                libc::SIGUSR2,
                libc::SIGUSR1,
                libc::SIGTERM,
                libc::SIGINT,
                libc::SIGALRM,
                libc::SIGSEGV,
            ]
            .map(|signal| signal_blocked_in_this_thread(signal).unwrap())
        })
        .unwrap()
        .join()
        .unwrap();
        assert_eq!(inside, [true, true, true, true, true, false]);
        assert_eq!(signal_blocked_in_this_thread(libc::SIGUSR2).unwrap(), before);
    }

    #[test]
    fn thread_cpu_time_grows_with_work_done() {
        let before = thread_cpu_time().unwrap();
        let mut x = 1u64;
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        assert!(thread_cpu_time().unwrap() > before);
    }

    #[test]
    fn a_plain_thread_inherits_an_unblocked_sigusr2_which_is_the_hazard() {
        let inside = std::thread::spawn(|| signal_blocked_in_this_thread(libc::SIGUSR2).unwrap())
            .join()
            .unwrap();
        assert!(!inside, "the test harness's threads leave SIGUSR2 unblocked");
    }
}
