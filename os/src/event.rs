//! eventfds and waiting for readable descriptors (`ppoll`).

#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::check;

/// A new non-blocking eventfd with counter 0 (the client side of an MSI-X vector, or a
/// wake-up descriptor).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no pointer arguments.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: eventfd just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads (and so resets) a non-blocking eventfd's counter; 0 when it was not signalled.
pub fn take_eventfd(fd: &File) -> u64 {
    let mut counter = [0u8; 8];
    match (&*fd).read(&mut counter) {
        Ok(8) => u64::from_ne_bytes(counter),
        _ => 0,
    }
}

/// Waits until one of `fds` is readable (or hung up), at most `timeout` (a `Duration`,
/// or an `Option<Duration>` where `None` waits forever). Returns a bit mask of the ready
/// descriptors (bit i for `fds[i]`; only the first 64 are watched); 0 on timeout or when
/// a signal interrupted the wait.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: impl Into<Option<Duration>>) -> io::Result<u64> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .take(64)
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let spec = timeout.into().map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let spec_pointer = spec.as_ref().map_or(std::ptr::null(), |s| s as *const libc::timespec);
    // SAFETY: `polls` is a live array of `polls.len()` pollfds; `spec_pointer` is null or
    // points at a live timespec; a null signal mask keeps the current one.
    let ready = unsafe {
        libc::ppoll(
            polls.as_mut_ptr(),
            polls.len() as libc::nfds_t,
            spec_pointer,
            std::ptr::null(),
        )
    };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(error)
        };
    }
    Ok(polls
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |mask, (i, _)| mask | 1 << i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn wait_readable_times_out_and_reports_ready_sockets() {
        let (left, right) = UnixStream::pair().unwrap();
        assert_eq!(
            wait_readable(&[right.as_fd()], Some(Duration::from_millis(1))).unwrap(),
            0
        );
        (&left).write_all(b"!").unwrap();
        assert_eq!(wait_readable(&[left.as_fd(), right.as_fd()], None).unwrap(), 0b10);
    }

    #[test]
    fn eventfds_wake_the_wait_and_are_reset_by_take() {
        let (_left, right) = UnixStream::pair().unwrap();
        let local = File::from(eventfd().unwrap());
        assert_eq!(wait_readable(&[local.as_fd()], Duration::from_millis(1)).unwrap(), 0);
        (&local).write_all(&2u64.to_ne_bytes()).unwrap();
        assert_eq!(
            wait_readable(&[right.as_fd(), local.as_fd()], Duration::from_secs(1)).unwrap(),
            0b10
        );
        assert_eq!(take_eventfd(&local), 2);
        assert_eq!(take_eventfd(&local), 0);
    }
}
