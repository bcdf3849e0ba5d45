//! Sockets: a Unix stream listener with its mode set before `listen`, sending and
//! receiving file descriptors (`SCM_RIGHTS`), and socket-buffer sizing.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

use crate::check;

/// The most file descriptors one `SCM_RIGHTS` message may carry on Linux (`SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// Asks for a receive buffer of `bytes` on `socket` (any socket) and returns the size the
/// kernel granted (it reports twice the usable bytes, for its bookkeeping). As root
/// (`CAP_NET_ADMIN`) `SO_RCVBUFFORCE` goes past `net.core.rmem_max`; otherwise the request
/// is capped there.
pub fn set_receive_buffer(socket: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    set_buffer(socket, bytes, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)
}

/// Asks for a send buffer of `bytes` on `socket` and returns the size the kernel granted
/// (twice the usable bytes, as for the receive buffer). As root (`CAP_NET_ADMIN`)
/// `SO_SNDBUFFORCE` goes past `net.core.wmem_max`; otherwise the request is capped there.
pub fn set_send_buffer(socket: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    set_buffer(socket, bytes, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)
}

/// Sets a socket buffer through `force` (privileged) or else `plain`, and reads back what
/// `plain` reports.
fn set_buffer(socket: BorrowedFd<'_>, bytes: usize, force: libc::c_int, plain: libc::c_int) -> io::Result<usize> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let set = |option: libc::c_int| {
        // SAFETY: `value` is a live c_int and its size is passed; the kernel only reads it.
        check(unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
    };
    if set(force).is_err() {
        set(plain)?;
    }
    let mut granted: libc::c_int = 0;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `granted` and `length` are live locals the kernel writes, `length` holding
    // `granted`'s size.
    check(unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            plain,
            std::ptr::from_mut(&mut granted).cast(),
            &mut length,
        )
    })?;
    Ok(usize::try_from(granted).unwrap_or(0))
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn a_receive_buffer_grows_to_at_least_what_was_asked_within_the_limit() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let default = super::set_receive_buffer(socket.as_fd(), 0).unwrap();
        let granted = super::set_receive_buffer(socket.as_fd(), 1 << 20).unwrap();
        // The kernel doubles the request; without CAP_NET_ADMIN it caps at rmem_max.
        let limit: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .map(|text| text.trim().parse().unwrap())
            .unwrap_or(usize::MAX);
        assert!(granted > default, "{granted} <= {default}");
        assert!(
            granted >= 2 * limit.min(1 << 20),
            "{granted} < twice min(1 MiB, rmem_max {limit})"
        );
    }

    use super::*;
    use crate::eventfd;
    use std::fs::File;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

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
    fn blocking_receive_gathers_parts_and_descriptors() {
        let (left, right) = UnixStream::pair().unwrap();
        let event = eventfd().unwrap();
        assert_eq!(
            send_with_fds(left.as_fd(), &[b"ab", b"cd"], &[event.as_fd()]).unwrap(),
            4
        );
        let mut fds = Vec::new();
        let mut buffer = [0u8; 4];
        let got = recv_with_fds(right.as_fd(), &mut buffer, &mut fds, 16, false).unwrap();
        assert_eq!((got.bytes, &buffer, fds.len()), (4, b"abcd", 1));
        drop(left);
        let got = recv_with_fds(right.as_fd(), &mut buffer, &mut fds, 16, false).unwrap();
        assert_eq!(got.bytes, 0, "peer closed");
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
}
