//! The OS calls of the vfio-user client backend: the only module of the crate with
//! `unsafe` code, each block behind a small safe function or type.
//!
//! What needs raw system calls and why:
//!
//! * `memfd_create` and `mmap`/`munmap` — DMA memory must be a file the server can map
//!   (it receives the descriptor with DMA_MAP), and the doorbell pages are the server's
//!   memfd mapped here;
//! * `eventfd` — one per MSI-X vector, handed to the server with SET_IRQS;
//! * `sendmsg`/`recvmsg` with `SCM_RIGHTS` — vfio-user passes descriptors as ancillary
//!   data, which `std` cannot do yet;
//! * `ppoll` — waiting on the eventfds with a sub-millisecond timeout.
//!
//! Memory shared with the server process is only touched through raw-pointer copies or
//! atomics, never through Rust references: the device writes it concurrently, which a
//! `&[u8]` would promise cannot happen.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The most descriptors one `SCM_RIGHTS` message may carry on Linux (`SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The host's page size.
pub fn host_page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// Creates a memfd of `size` zeroed bytes whose size is sealed: the server maps it, and
/// must not be able to truncate it under our own mapping (our accesses would SIGBUS).
pub fn memfd_create(name: &str, size: u64) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: memfd_create just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = File::from(fd);
    file.set_len(size)?;
    let fd = OwnedFd::from(file);
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own; no pointers involved.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(fd)
}

/// A read-write `MAP_SHARED` mapping of a file: the bytes the server sees through its own
/// mapping of the same file. Accesses are bounds-checked and go through raw pointers or
/// atomics only. Unmapped on drop.
#[derive(Debug)]
pub struct SharedMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory without thread affinity; every access goes
// through raw-pointer copies or atomics, sound from any thread (concurrent writers can
// only tear data, as DMA on hardware does, never create UB: no reference to the bytes
// is ever handed out).
unsafe impl Send for SharedMapping {}
// SAFETY: see `Send`: `&SharedMapping` only offers raw copies and atomics.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// Maps `len` bytes (at least 1) of `fd` from the page-aligned file offset `offset`.
    pub fn map(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Self> {
        let page = host_page_size();
        if len == 0 || offset & (page - 1) != 0 || len as u64 > isize::MAX as u64 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED), so it
        // cannot alias any Rust object; the descriptor is valid for the call.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Self { base, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    fn span(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        // SAFETY: `offset <= end <= self.len`, so the pointer stays inside the mapping.
        (end <= self.len).then(|| unsafe { self.base.as_ptr().add(offset) })
    }

    /// Copies bytes at `offset` into `out`; false when out of bounds.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        let Some(source) = self.span(offset, out.len()) else {
            return false;
        };
        // SAFETY: `source..source+len` is inside our live mapping (checked by `span`);
        // `out` is a distinct Rust buffer, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(source, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` into the mapping at `offset`; false when out of bounds.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        let Some(target) = self.span(offset, data.len()) else {
            return false;
        };
        // SAFETY: `target..target+len` is inside our live mapping (checked by `span`);
        // `data` is a distinct Rust buffer, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), target, data.len()) };
        true
    }

    /// Zeroes `len` bytes at `offset`; false when out of bounds.
    pub fn zero(&self, offset: usize, len: usize) -> bool {
        let Some(target) = self.span(offset, len) else {
            return false;
        };
        // SAFETY: `target..target+len` is inside our live writable mapping.
        unsafe { std::ptr::write_bytes(target, 0, len) };
        true
    }

    fn atomic(&self, offset: usize) -> Option<&AtomicU64> {
        let pointer = self.span(offset, 8)?;
        if pointer as usize & 7 != 0 {
            return None;
        }
        // SAFETY: the pointer is 8-byte aligned and inside the live mapping, which
        // outlives the reference (it borrows `self`). The server process accesses the
        // word concurrently; AtomicU64 is exactly the type for such memory.
        Some(unsafe { AtomicU64::from_ptr(pointer.cast::<u64>()) })
    }

    /// Atomically loads the aligned 64-bit word at `offset`.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        self.atomic(offset).map(|word| word.load(Ordering::Acquire))
    }

    /// Stores `value` at the aligned word at `offset` if it holds `current`; returns
    /// `Some(Ok(()))` when stored, `Some(Err(found))` when it held something else, `None`
    /// when the offset is unaligned or out of bounds.
    pub fn compare_exchange_u64(&self, offset: usize, current: u64, value: u64) -> Option<Result<(), u64>> {
        self.atomic(offset).map(|word| {
            word.compare_exchange(current, value, Ordering::AcqRel, Ordering::Acquire)
                .map(|_| ())
        })
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; no reference into the
        // mapping can outlive `self` (accessors hand out copies or borrow `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A new non-blocking eventfd with counter 0.
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

/// Sends the concatenation of `parts` on a stream socket with `fds` attached to the first
/// byte; returns the bytes sent (maybe fewer). Never raises SIGPIPE.
pub fn send_with_fds(socket: BorrowedFd<'_>, parts: &[&[u8]], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut iovs: Vec<libc::iovec> = parts
        .iter()
        .map(|part| libc::iovec {
            iov_base: part.as_ptr() as *mut libc::c_void,
            iov_len: part.len(),
        })
        .collect();
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iovs.as_mut_ptr();
    message.msg_iovlen = iovs.len() as _;
    let payload_len = (fds.len() * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let control_len = unsafe { libc::CMSG_SPACE(payload_len) } as usize;
    // u64 elements give the cmsghdr alignment the kernel and the CMSG macros expect.
    let mut control = vec![0u64; control_len.div_ceil(8)];
    if !fds.is_empty() {
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = control_len as _;
        // SAFETY: the control buffer has room for one cmsghdr with `fds.len()` descriptors
        // (CMSG_SPACE above), so CMSG_FIRSTHDR is non-null and CMSG_DATA has room.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(payload_len) as _;
            let data = libc::CMSG_DATA(header).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `message` points at `iovs` (over the caller's live `parts`) and at
        // `control`; all outlive the call.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Reads up to `buffer.len()` bytes from a stream socket (blocking, subject to its
/// receive timeout), appending received descriptors (close-on-exec) to `fds`. Returns
/// the bytes read; 0 means the peer closed the connection.
pub fn recv_with_fds(socket: BorrowedFd<'_>, buffer: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    const MAX_FDS: usize = 16;
    // SAFETY: CMSG_SPACE only computes a size.
    let control_len = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; control_len.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = control_len as _;
    let received = loop {
        // SAFETY: `message` points at `iov` (our live `buffer`) and `control` (our live
        // buffer of `control_len` bytes); both outlive the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    // SAFETY: the CMSG_* walk stays inside `control` as filled in by the kernel
    // (msg_controllen was updated by recvmsg); each SCM_RIGHTS payload holds descriptors
    // the kernel installed for us and that nothing else owns, so wrapping each in an
    // OwnedFd is sound.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Ok(received)
}

/// Waits until one of `fds` is readable, at most `timeout`. Returns a mask of the ready
/// descriptors (bit i for `fds[i]`, at most 64); 0 on timeout or on a signal.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<u64> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .take(64)
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let spec = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `polls` is a live array of `polls.len()` pollfds; `spec` is a live
    // timespec; a null signal mask keeps the current one.
    let ready = unsafe { libc::ppoll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, &spec, std::ptr::null()) };
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
    fn two_mappings_of_one_memfd_share_bytes_and_atomics() {
        let fd = memfd_create("rnic-verbs-test", 8192).unwrap();
        let a = SharedMapping::map(fd.as_fd(), 0, 8192).unwrap();
        let b = SharedMapping::map(fd.as_fd(), 4096, 4096).unwrap();
        assert!(a.write_at(4096 + 8, &[1, 2, 3]));
        let mut out = [0u8; 3];
        assert!(b.read_at(8, &mut out));
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(b.compare_exchange_u64(0x230, 0, 7), Some(Ok(())));
        assert_eq!(a.compare_exchange_u64(4096 + 0x230, 0, 9), Some(Err(7)));
        assert_eq!(a.load_u64(4096 + 0x230), Some(7));
        assert!(a.zero(4096, 4096));
        assert_eq!(b.load_u64(0x230), Some(0));
        assert!(!a.write_at(8190, &[0; 3]), "out of bounds");
        assert_eq!(a.load_u64(3), None, "unaligned");
        assert!(SharedMapping::map(fd.as_fd(), 100, 10).is_err(), "unaligned offset");
        assert!(File::from(fd).set_len(0).is_err(), "sealed");
    }

    #[test]
    fn descriptors_travel_and_eventfds_wake_the_wait() {
        let (left, right) = UnixStream::pair().unwrap();
        let event = eventfd().unwrap();
        assert_eq!(
            send_with_fds(left.as_fd(), &[b"ab", b"cd"], &[event.as_fd()]).unwrap(),
            4
        );
        let mut fds = Vec::new();
        let mut buffer = [0u8; 4];
        assert_eq!(recv_with_fds(right.as_fd(), &mut buffer, &mut fds).unwrap(), 4);
        assert_eq!((&buffer, fds.len()), (b"abcd", 1));
        let local = File::from(event);
        assert_eq!(wait_readable(&[local.as_fd()], Duration::from_millis(1)).unwrap(), 0);
        File::from(fds.pop().unwrap()).write_all(&2u64.to_ne_bytes()).unwrap();
        assert_eq!(
            wait_readable(&[right.as_fd(), local.as_fd()], Duration::from_secs(1)).unwrap(),
            0b10
        );
        assert_eq!(take_eventfd(&local), 2);
        assert_eq!(take_eventfd(&local), 0);
    }
}
