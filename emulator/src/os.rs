//! The OS layer: every `unsafe` block of the crate lives here, behind small safe
//! functions and types (the rest of the crate is `#![deny(unsafe_code)]`).
//!
//! What needs the raw system calls and why:
//!
//! * shared memory: `memfd_create`, file seals and `mmap`/`munmap` — the doorbell pages
//!   the client maps, and the client's DMA-mapped memory the device reads and writes;
//! * `recvmsg`/`sendmsg` with `SCM_RIGHTS` — vfio-user passes file descriptors (DMA
//!   memory, eventfds, the doorbell memfd) as ancillary data, which `std` cannot do yet;
//! * `ppoll` — a sub-millisecond wait on the listener and the client socket;
//! * `socket`/`bind`/`listen` — to restrict the socket's mode to 0600 *before* anyone can
//!   connect (std's `UnixListener::bind` listens at once);
//! * `prctl(PR_SET_TIMERSLACK)` and `sigaction` for the polling thread and SIGTERM.
//!
//! Memory shared with another process is only ever touched through raw pointers
//! (`copy_nonoverlapping`) or atomics, never through Rust references: the other process
//! writes it concurrently, which a `&[u8]` would promise cannot happen.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The page size the server works in (DMA map granularity, doorbell pages): 4 KiB, the
/// only size it advertises in `pgsizes`.
pub const PAGE_SIZE: u64 = 4096;

/// The most file descriptors one `SCM_RIGHTS` message may carry on Linux (`SCM_MAX_FD`).
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
    u64::try_from(size).unwrap_or(PAGE_SIZE)
}

// ---- shared memory ----------------------------------------------------------------------

/// Creates an anonymous shared-memory file (memfd) of `size` bytes, zero-filled. With
/// `seal`, its size is sealed (no shrink, no grow, no further seals), so a process it is
/// passed to cannot truncate it under our mappings (which would turn our accesses into
/// SIGBUS).
pub fn memfd_create(name: &str, size: u64, seal: bool) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) })?;
    // SAFETY: memfd_create just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = File::from(fd);
    file.set_len(size)?;
    let fd = OwnedFd::from(file);
    if seal {
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own; no pointers involved.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    }
    Ok(fd)
}

/// The seals of a memfd (`F_SEAL_*` bits), or 0 for a file that cannot be sealed.
pub fn file_seals(fd: BorrowedFd<'_>) -> u32 {
    // SAFETY: fcntl(F_GET_SEALS) on a valid borrowed descriptor; no pointers involved.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    u32::try_from(seals).unwrap_or(0)
}

/// Whether a mapping may be read and/or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protection {
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
}

impl Protection {
    /// Read and write.
    pub const READ_WRITE: Self = Self {
        read: true,
        write: true,
    };

    fn bits(self) -> libc::c_int {
        let mut prot = libc::PROT_NONE;
        if self.read {
            prot |= libc::PROT_READ;
        }
        if self.write {
            prot |= libc::PROT_WRITE;
        }
        prot
    }
}

/// A `MAP_SHARED` mapping of a file: the bytes another process sees through its own
/// mapping of the same file. Accesses are bounds-checked and go through raw pointers or
/// atomics only. Unmapped on drop.
#[derive(Debug)]
pub struct MappedRegion {
    /// Start of the mmap (page aligned) and its length, for munmap.
    base: NonNull<u8>,
    map_len: usize,
    /// First byte the caller asked for (inside the first page) and the length asked for.
    data: NonNull<u8>,
    len: usize,
    protection: Protection,
}

// SAFETY: the region is plain shared memory with no thread affinity; every access goes
// through raw-pointer copies or atomics, which are sound from any thread (concurrent
// writers can only produce torn data, as with DMA on real hardware, never UB in Rust code,
// since no reference to the bytes is ever created).
unsafe impl Send for MappedRegion {}
// SAFETY: see `Send`: `&MappedRegion` only offers raw copies and atomics.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// Maps `len` bytes of `fd` starting at file offset `offset` (any offset: the mapping
    /// starts at the page below it). `len` must be at least 1.
    pub fn map(fd: BorrowedFd<'_>, offset: u64, len: usize, protection: Protection) -> io::Result<Self> {
        let page = host_page_size();
        let delta = offset % page;
        let map_offset = offset - delta;
        let map_len = (len as u64)
            .checked_add(delta)
            .and_then(|l| l.checked_next_multiple_of(page))
            .filter(|&l| len > 0 && l <= isize::MAX as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))? as usize;
        let map_offset = libc::off_t::try_from(map_offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED), so it
        // cannot alias any existing Rust object; the descriptor is valid for the call.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                protection.bits(),
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                map_offset,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        // SAFETY: `delta < page <= map_len`, so the result stays inside the mapping.
        let data = unsafe { base.add(delta as usize) };
        Ok(Self {
            base,
            map_len,
            data,
            len,
            protection,
        })
    }

    /// Length in bytes (as asked for, not rounded to pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The protection the region was mapped with.
    pub fn protection(&self) -> Protection {
        self.protection
    }

    fn span(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        // SAFETY: `offset <= end <= self.len`, so the pointer stays inside the mapping.
        (end <= self.len).then(|| unsafe { self.data.as_ptr().add(offset) })
    }

    /// Copies `out.len()` bytes at `offset` out of the region; false when out of bounds
    /// or the region is not readable.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> bool {
        match self.span(offset, out.len()) {
            Some(source) if self.protection.read => {
                // SAFETY: `source..source+len` is inside our live readable mapping (checked
                // by `span`); `out` is a distinct Rust buffer, so they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(source, out.as_mut_ptr(), out.len()) };
                true
            }
            _ => false,
        }
    }

    /// Copies `data` into the region at `offset`; false when out of bounds or the region
    /// is not writable.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> bool {
        match self.span(offset, data.len()) {
            Some(target) if self.protection.write => {
                // SAFETY: `target..target+len` is inside our live writable mapping (checked
                // by `span`); `data` is a distinct Rust buffer, so they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), target, data.len()) };
                true
            }
            _ => false,
        }
    }

    /// Fills the whole region with zeroes (if writable).
    pub fn zero(&self) {
        if self.protection.write {
            // SAFETY: the whole requested span is inside our live writable mapping.
            unsafe { std::ptr::write_bytes(self.data.as_ptr(), 0, self.len) };
        }
    }

    fn atomic(&self, offset: usize) -> Option<&AtomicU64> {
        if offset % 8 != 0 || !self.protection.read {
            return None;
        }
        let pointer = self.span(offset, 8)?;
        if pointer as usize % 8 != 0 {
            return None;
        }
        // SAFETY: the pointer is 8-byte aligned, inside the live mapping (checked above),
        // and the mapping outlives the returned reference (it borrows `self`). Other
        // processes access the word too; AtomicU64 is exactly the type for memory that is
        // modified concurrently.
        Some(unsafe { AtomicU64::from_ptr(pointer.cast::<u64>()) })
    }

    /// Atomically loads the aligned 64-bit word at `offset` (acquire), or `None` when
    /// `offset` is unaligned or out of bounds.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        self.atomic(offset).map(|word| word.load(Ordering::Acquire))
    }

    /// Atomically stores `value` into the aligned 64-bit word at `offset` (release);
    /// false when `offset` is unaligned, out of bounds or the region is read-only.
    pub fn store_u64(&self, offset: usize, value: u64) -> bool {
        match self.atomic(offset) {
            Some(word) if self.protection.write => {
                word.store(value, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    /// Atomically replaces the aligned 64-bit word at `offset` by `value` and returns the
    /// old value (acquire-release), or `None` as for [`load_u64`](Self::load_u64) or when
    /// the region is read-only.
    pub fn swap_u64(&self, offset: usize, value: u64) -> Option<u64> {
        match self.atomic(offset) {
            Some(word) if self.protection.write => Some(word.swap(value, Ordering::AcqRel)),
            _ => None,
        }
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` are exactly what mmap returned; no reference into the
        // mapping can outlive `self` (accessors hand out copies or borrow `self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

// ---- eventfd ----------------------------------------------------------------------------

/// A new non-blocking eventfd with counter 0 (the client side of an MSI-X vector).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no pointer arguments.
    let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: eventfd just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

// ---- network namespaces -----------------------------------------------------------------

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

// ---- Unix sockets -----------------------------------------------------------------------

/// Binds a listening Unix stream socket at `path` whose file has mode `mode`, set before
/// `listen`: a connection attempt before the chmod gets ECONNREFUSED, so there is no
/// window in which the socket is reachable with looser permissions.
pub fn bind_unix_listener(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path must be 1..{} bytes without NUL", address.sun_path.len()),
        ));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (slot, &byte) in address.sun_path.iter_mut().zip(bytes) {
        *slot = byte as libc::c_char;
    }
    // SAFETY: socket has no pointer arguments.
    let fd = check(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: socket just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let length = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `address` is a valid sockaddr_un of `length` bytes for the whole call.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&address as *const libc::sockaddr_un).cast(), length) })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    // SAFETY: listen on a descriptor we own; no pointers involved.
    check(unsafe { libc::listen(fd.as_raw_fd(), 8) })?;
    Ok(UnixListener::from(fd))
}

/// What one [`recv_with_fds`] call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes read; 0 means the peer closed the connection.
    pub bytes: usize,
    /// The peer sent more descriptors than there was room for; the kernel closed the
    /// excess ones.
    pub fds_truncated: bool,
}

/// Reads up to `buffer.len()` bytes from the stream socket `socket`, appending received
/// file descriptors (close-on-exec) to `fds`; room is made for `max_fds` descriptors. With
/// `nonblocking`, returns `WouldBlock` instead of waiting.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    max_fds: usize,
    nonblocking: bool,
) -> io::Result<Received> {
    let max_fds = max_fds.clamp(1, MAX_FDS_PER_MESSAGE);
    // SAFETY: CMSG_SPACE only computes a size.
    let control_len = unsafe { libc::CMSG_SPACE((max_fds * std::mem::size_of::<RawFd>()) as u32) } as usize;
    // u64 elements give the cmsghdr alignment the kernel and the CMSG macros expect.
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
    let mut flags = libc::MSG_CMSG_CLOEXEC;
    if nonblocking {
        flags |= libc::MSG_DONTWAIT;
    }
    let received = loop {
        // SAFETY: `message` points at `iov` (our live `buffer`) and `control` (our live
        // buffer of `control_len` bytes); both outlive the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, flags) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    // SAFETY: the CMSG_* walk stays inside `control` as filled in by the kernel
    // (msg_controllen was updated by recvmsg); each SCM_RIGHTS payload holds
    // `(cmsg_len - CMSG_LEN(0)) / 4` descriptors that the kernel installed for us and that
    // nothing else owns, so wrapping each in an OwnedFd is sound.
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
    Ok(Received {
        bytes: received,
        fds_truncated: message.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// Sends the concatenation of `parts` on the stream socket `socket`, with `fds` attached
/// as `SCM_RIGHTS` to the first byte. Returns the bytes sent (maybe fewer than asked,
/// as for `send`). Never raises SIGPIPE.
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

// ---- waiting ----------------------------------------------------------------------------

/// Waits until one of `fds` is readable (or hung up), at most `timeout` (`None`: forever).
/// Returns a bit mask of the ready descriptors (bit i for `fds[i]`, at most 32); 0 on
/// timeout or when a signal interrupted the wait.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<u32> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .take(32)
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let spec = timeout.map(|t| libc::timespec {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn two_mappings_of_one_memfd_share_bytes_and_atomics() {
        let fd = memfd_create("rnic-os-test", 8192, true).unwrap();
        let a = MappedRegion::map(fd.as_fd(), 0, 8192, Protection::READ_WRITE).unwrap();
        let b = MappedRegion::map(fd.as_fd(), 4096, 4096, Protection::READ_WRITE).unwrap();
        assert!(a.write_at(4096 + 8, &[1, 2, 3]));
        let mut out = [0u8; 3];
        assert!(b.read_at(8, &mut out));
        assert_eq!(out, [1, 2, 3]);
        assert!(b.store_u64(0x230, 0xABCD));
        assert_eq!(a.swap_u64(4096 + 0x230, 0), Some(0xABCD));
        assert_eq!(b.load_u64(0x230), Some(0));
        assert!(!a.write_at(8190, &[0; 3]), "out of bounds");
        assert_eq!(a.load_u64(3), None, "unaligned");
        assert_ne!(file_seals(fd.as_fd()) & libc::F_SEAL_SHRINK as u32, 0);
        assert!(File::from(fd).set_len(0).is_err(), "sealed against shrinking");
    }

    #[test]
    fn unaligned_file_offsets_map_from_the_page_below() {
        let fd = memfd_create("rnic-os-test", 8192, false).unwrap();
        let whole = MappedRegion::map(fd.as_fd(), 0, 8192, Protection::READ_WRITE).unwrap();
        assert!(whole.write_at(5000, b"xy"));
        let part = MappedRegion::map(
            fd.as_fd(),
            5000,
            2,
            Protection {
                read: true,
                write: false,
            },
        )
        .unwrap();
        let mut out = [0u8; 2];
        assert!(part.read_at(0, &mut out));
        assert_eq!(&out, b"xy");
        assert!(!part.write_at(0, b"z"), "read-only");
    }

    #[test]
    fn descriptors_travel_with_the_first_byte() {
        let (left, right) = UnixStream::pair().unwrap();
        let event = eventfd().unwrap();
        let sent = send_with_fds(left.as_fd(), &[b"head", b"tail"], &[event.as_fd()]).unwrap();
        assert_eq!(sent, 8);
        let mut fds = Vec::new();
        let mut buffer = [0u8; 4];
        let got = recv_with_fds(right.as_fd(), &mut buffer, &mut fds, 4, true).unwrap();
        assert_eq!((got.bytes, fds.len(), got.fds_truncated), (4, 1, false));
        let mut file = File::from(fds.pop().unwrap());
        file.write_all(&1u64.to_ne_bytes()).unwrap();
        let mut counter = [0u8; 8];
        File::from(event).read_exact(&mut counter).unwrap();
        assert_eq!(u64::from_ne_bytes(counter), 1);
        let got = recv_with_fds(right.as_fd(), &mut buffer, &mut fds, 4, true).unwrap();
        assert_eq!((got.bytes, fds.len()), (4, 0));
        assert_eq!(&buffer, b"tail");
        let error = recv_with_fds(right.as_fd(), &mut buffer, &mut fds, 4, true).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn excess_descriptors_are_reported_truncated() {
        let (left, right) = UnixStream::pair().unwrap();
        let events: Vec<OwnedFd> = (0..3).map(|_| eventfd().unwrap()).collect();
        let borrowed: Vec<BorrowedFd<'_>> = events.iter().map(|e| e.as_fd()).collect();
        send_with_fds(left.as_fd(), &[b"x"], &borrowed).unwrap();
        let mut fds = Vec::new();
        let got = recv_with_fds(right.as_fd(), &mut [0u8; 1], &mut fds, 1, true).unwrap();
        assert!(got.fds_truncated);
        // CMSG_SPACE rounds up to 8 bytes, so room for one descriptor holds two.
        assert!(fds.len() <= 2);
    }

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
}
