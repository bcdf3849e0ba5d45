//! UDP datagrams in batches: `recvmmsg` and `sendmmsg` (one system call for many
//! datagrams, which `std` cannot do), and waiting until a socket can take more. The send
//! buffer's size is set with [`crate::set_send_buffer`].
//!
//! A RoCEv2 message of 64 KiB is sixteen datagrams at MTU 4096; one call per datagram is
//! most of what a `udp:` backend costs on loopback, so the backend moves them in batches.

#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// Most datagrams one [`receive_datagrams`] or [`send_segmented`] call moves (the kernel's
/// `UIO_MAXIOV` is far above it; more buys nothing on loopback).
pub const MAX_BATCH: usize = 64;

/// Waits until `socket` can take more data (or has an error pending), at most `timeout`.
/// Returns whether it can; `false` on timeout or when a signal interrupted the wait.
pub fn wait_writable(socket: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let spec = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `poll` is one live pollfd, `spec` a live timespec; a null signal mask keeps
    // the current one.
    let ready = unsafe { libc::ppoll(&mut poll, 1, &spec, std::ptr::null()) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(error)
        };
    }
    Ok(ready > 0)
}

/// `UDP_GRO` of `<linux/udp.h>` (the `libc` crate does not name it): the socket option
/// that lets a socket receive coalesced datagrams, and the control message that says
/// their length.
const UDP_GRO: libc::c_int = 104;

/// Lets the UDP socket `socket` receive runs of datagrams from one sender as one
/// (`UDP_GRO`): a message the sender had the kernel cut ([`send_segmented`]) then arrives
/// whole, with the length of its datagrams ([`DatagramBatch::segment`]), instead of being
/// cut on the way and queued datagram by datagram. The batch's slots must then hold at
/// least [`MAX_SEGMENTED_BYTES`] (a longer entry is cut and reported truncated).
pub fn enable_receive_coalescing(socket: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a live c_int and its size is passed; the kernel only reads it.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reusable room for up to [`MAX_BATCH`] received datagrams of at most `slot` bytes each.
#[derive(Debug)]
pub struct DatagramBatch {
    slot: usize,
    buffer: Vec<u8>,
    lengths: Vec<usize>,
    sources: Vec<Option<SocketAddr>>,
    truncated: Vec<bool>,
    segments: Vec<Option<usize>>,
    count: usize,
}

impl DatagramBatch {
    /// Room for `count` (1..=[`MAX_BATCH`]) datagrams of up to `slot` bytes; longer ones are
    /// cut and reported [`DatagramBatch::truncated`].
    pub fn new(count: usize, slot: usize) -> Self {
        let count = count.clamp(1, MAX_BATCH);
        let slot = slot.max(1);
        Self {
            slot,
            buffer: vec![0; count * slot],
            lengths: vec![0; count],
            sources: vec![None; count],
            truncated: vec![false; count],
            segments: vec![None; count],
            count: 0,
        }
    }

    /// Datagrams the last [`receive_datagrams`] call delivered.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the last call delivered none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes of datagram `index` (as far as they fit its slot).
    pub fn datagram(&self, index: usize) -> &[u8] {
        let start = index * self.slot;
        &self.buffer[start..start + self.lengths[index].min(self.slot)]
    }

    /// Where datagram `index` came from (`None` for an address family other than IP).
    pub fn source(&self, index: usize) -> Option<SocketAddr> {
        self.sources[index]
    }

    /// Whether datagram `index` was longer than its slot (and so was cut).
    pub fn truncated(&self, index: usize) -> bool {
        self.truncated[index]
    }

    /// For a socket that receives coalesced datagrams ([`enable_receive_coalescing`]):
    /// `Some(length)` when entry `index` is several datagrams of `length` bytes each (the
    /// last possibly shorter), one after another; `None` when it is one datagram.
    pub fn segment(&self, index: usize) -> Option<usize> {
        self.segments[index]
    }
}

/// Room for the control message of a coalesced receive (a `cmsghdr` and an `int`; 24
/// bytes on Linux), aligned for the header.
type CoalescingControl = [u64; 4];

fn socket_address(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET; sockaddr_storage is
            // larger and aligned for every sockaddr type.
            let v4 = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)),
                u16::from_be(v4.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let v6 = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(v6.sin6_addr.s6_addr),
                u16::from_be(v6.sin6_port),
                u32::from_be(v6.sin6_flowinfo),
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn socket_storage(address: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let length = match address {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *std::ptr::from_mut(&mut storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6 = unsafe { &mut *std::ptr::from_mut(&mut storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_flowinfo = v6.flowinfo().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, length as libc::socklen_t)
}

/// Receives as many datagrams as are waiting on the UDP socket `socket`, up to the batch's
/// room, without blocking (`recvmmsg` with `MSG_DONTWAIT`). Returns how many; `WouldBlock`
/// when none was waiting.
pub fn receive_datagrams(socket: BorrowedFd<'_>, batch: &mut DatagramBatch) -> io::Result<usize> {
    batch.count = 0;
    let room = batch.lengths.len();
    let slot = batch.slot;
    let base = batch.buffer.as_mut_ptr();
    let mut names: Vec<MaybeUninit<libc::sockaddr_storage>> = vec![MaybeUninit::zeroed(); room];
    let mut iovs: Vec<libc::iovec> = (0..room)
        .map(|i| libc::iovec {
            // SAFETY: `i * slot` is inside `buffer`, which holds `room * slot` bytes.
            iov_base: unsafe { base.add(i * slot) }.cast(),
            iov_len: slot,
        })
        .collect();
    let mut controls: Vec<CoalescingControl> = vec![[0; 4]; room];
    let mut messages: Vec<libc::mmsghdr> = (0..room)
        .map(|i| {
            // SAFETY: msghdr is plain old data; all-zero is a valid value.
            let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
            header.msg_name = names[i].as_mut_ptr().cast();
            header.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            header.msg_iov = &mut iovs[i];
            header.msg_iovlen = 1;
            header.msg_control = controls[i].as_mut_ptr().cast();
            header.msg_controllen = std::mem::size_of::<CoalescingControl>() as _;
            libc::mmsghdr {
                msg_hdr: header,
                msg_len: 0,
            }
        })
        .collect();
    let received = loop {
        // SAFETY: every mmsghdr points at its own live iovec (into `buffer`, `slot` bytes
        // each, disjoint), its own live sockaddr_storage and its own live control room, each
        // with its size; all outlive the call. A null timeout means none.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                messages.as_mut_ptr(),
                room as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    for (i, message) in messages.iter().take(received).enumerate() {
        batch.lengths[i] = message.msg_len as usize;
        batch.truncated[i] = message.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        batch.segments[i] = coalesced_length(&message.msg_hdr);
        // SAFETY: zero-initialised and possibly overwritten by the kernel: initialised.
        batch.sources[i] = socket_address(unsafe { names[i].assume_init_ref() });
    }
    batch.count = received;
    Ok(received)
}

/// The datagram length of a coalesced receive, from its `UDP_GRO` control message.
fn coalesced_length(header: &libc::msghdr) -> Option<usize> {
    // SAFETY: `header` is a msghdr the kernel filled, its control room (`msg_control`,
    // `msg_controllen` as the kernel left it) still live; CMSG_FIRSTHDR and CMSG_NXTHDR
    // stay inside it and return null at its end, and a header whose length covers an int
    // has that int at CMSG_DATA, read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP
                && (*cmsg).cmsg_type == UDP_GRO
                && (*cmsg).cmsg_len as usize >= libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize
            {
                let length = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return usize::try_from(length).ok().filter(|&length| length > 0);
            }
            cmsg = libc::CMSG_NXTHDR(header, cmsg);
        }
    }
    None
}

/// Most datagrams the kernel cuts one message of [`send_segmented`] into (its
/// `UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;

/// Most bytes of one message of [`send_segmented`]: a message travels the stack as one
/// IP packet before it is cut, so it must fit one (65 535 bytes with IP and UDP headers).
pub const MAX_SEGMENTED_BYTES: usize = 65_000;

/// One message of [`send_segmented`]: the bytes of `parts`, one after another, for `to`,
/// sent as one datagram (`segment` `None`), or cut by the kernel into datagrams of
/// `segment` bytes each, the last one possibly shorter (UDP generic segmentation offload,
/// `UDP_SEGMENT`): the stack is traversed once for all of them. At most [`MAX_SEGMENTS`]
/// datagrams and [`MAX_SEGMENTED_BYTES`] bytes.
#[derive(Debug, Clone, Copy)]
pub struct SegmentedDatagrams<'a> {
    /// The datagrams' payloads, one after another, gathered from these pieces (which need
    /// not be cut where the datagrams are).
    pub parts: &'a [IoSlice<'a>],
    /// Where every datagram of the message goes.
    pub to: SocketAddr,
    /// Length of each datagram but the last, in bytes; `None` for one datagram.
    pub segment: Option<u16>,
}

/// Room for one `cmsghdr` carrying a `u16` (`CMSG_SPACE(2)` is 24 bytes on Linux), aligned
/// for the header.
type SegmentControl = [u64; 4];

/// Sends `messages` on the UDP socket `socket` with one `sendmmsg` call (at most
/// [`MAX_BATCH`] of them), without blocking. Returns how many messages the kernel took, in
/// order (fewer when its send buffer filled); `WouldBlock` when it took none. A kernel or
/// route without UDP segmentation refuses a segmented message (`EINVAL`, `EIO`, ...): the
/// caller then sends its datagrams one by one.
pub fn send_segmented(socket: BorrowedFd<'_>, messages: &[SegmentedDatagrams<'_>]) -> io::Result<usize> {
    let messages = &messages[..messages.len().min(MAX_BATCH)];
    if messages.is_empty() {
        return Ok(0);
    }
    let mut names: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
        messages.iter().map(|message| socket_storage(&message.to)).collect();
    let mut controls: Vec<SegmentControl> = vec![[0; 4]; messages.len()];
    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
    let (space, length) = unsafe { (libc::CMSG_SPACE(2) as usize, libc::CMSG_LEN(2) as usize) };
    debug_assert!(space <= std::mem::size_of::<SegmentControl>());
    let mut headers: Vec<libc::mmsghdr> = Vec::with_capacity(messages.len());
    for ((name, name_length), (control, message)) in names.iter_mut().zip(controls.iter_mut().zip(messages)) {
        // SAFETY: msghdr is plain old data; all-zero is a valid value.
        let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
        header.msg_name = std::ptr::from_mut(name).cast();
        header.msg_namelen = *name_length;
        // IoSlice is ABI-compatible with iovec on Unix (std's guarantee); the kernel only
        // reads the pieces and the payload.
        header.msg_iov = message.parts.as_ptr().cast_mut().cast();
        header.msg_iovlen = message.parts.len() as _;
        if let Some(segment) = message.segment {
            header.msg_control = control.as_mut_ptr().cast();
            header.msg_controllen = space as _;
            // SAFETY: `header` points at `control`, `space` bytes of room aligned for a
            // cmsghdr, so CMSG_FIRSTHDR is that room and the u16 after the header (at
            // CMSG_DATA, inside the room since CMSG_LEN(2) <= space) is ours to write.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&header);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = length as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
            }
        }
        headers.push(libc::mmsghdr {
            msg_hdr: header,
            msg_len: 0,
        });
    }
    loop {
        // SAFETY: every mmsghdr points at the caller's live pieces (iovecs over live
        // payload, both only read by the kernel), its own live destination address and, for
        // a segmented message, its own live control room; all outlive the call.
        let n = unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                headers.as_mut_ptr(),
                headers.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
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
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn a_batch_sent_in_one_call_arrives_whole_in_order_with_its_source() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = receiver.local_addr().unwrap();
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let datagrams: Vec<(&[u8], SocketAddr)> = payloads.iter().map(|p| (p.as_slice(), to)).collect();
        assert_eq!(send_whole(sender.as_fd(), &datagrams).unwrap(), 10);
        let mut batch = DatagramBatch::new(16, 256);
        assert_eq!(receive_datagrams(receiver.as_fd(), &mut batch).unwrap(), 10);
        for (i, payload) in payloads.iter().enumerate() {
            assert_eq!(batch.datagram(i), payload.as_slice());
            assert_eq!(batch.source(i), Some(sender.local_addr().unwrap()));
            assert!(!batch.truncated(i));
        }
        let error = receive_datagrams(receiver.as_fd(), &mut batch).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        assert!(batch.is_empty());
    }

    #[test]
    fn a_segmented_message_arrives_as_its_datagrams_in_order() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = receiver.local_addr().unwrap();
        // Five datagrams of 1000 bytes and a last one of 300, in one message; then one
        // unsegmented datagram in the same call.
        let bytes: Vec<u8> = (0..5300u32).map(|i| (i / 1000) as u8 + 1).collect();
        let messages = [
            SegmentedDatagrams {
                // Gathered from two pieces cut elsewhere than the datagrams are.
                parts: &[IoSlice::new(&bytes[..1500]), IoSlice::new(&bytes[1500..])],
                to,
                segment: Some(1000),
            },
            SegmentedDatagrams {
                parts: &[IoSlice::new(b"whole")],
                to,
                segment: None,
            },
        ];
        assert_eq!(send_segmented(sender.as_fd(), &messages).unwrap(), 2);
        let mut batch = DatagramBatch::new(16, 2048);
        let mut received = Vec::new();
        while received.len() < 7 {
            assert!(wait_readable_once(&receiver), "datagram {} never came", received.len());
            receive_datagrams(receiver.as_fd(), &mut batch).unwrap();
            received.extend((0..batch.len()).map(|i| batch.datagram(i).to_vec()));
        }
        let mut expected: Vec<Vec<u8>> = bytes.chunks(1000).map(<[u8]>::to_vec).collect();
        expected.push(b"whole".to_vec());
        assert_eq!(received, expected);
    }

    #[test]
    fn a_coalescing_receiver_gets_a_segmented_message_whole_with_its_datagram_length() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable_receive_coalescing(receiver.as_fd()).unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = receiver.local_addr().unwrap();
        let bytes: Vec<u8> = (0..5300u32).map(|i| (i % 251) as u8).collect();
        let messages = [
            SegmentedDatagrams {
                parts: &[IoSlice::new(&bytes)],
                to,
                segment: Some(1000),
            },
            SegmentedDatagrams {
                parts: &[IoSlice::new(b"alone")],
                to,
                segment: None,
            },
        ];
        assert_eq!(send_segmented(sender.as_fd(), &messages).unwrap(), 2);
        let mut batch = DatagramBatch::new(4, MAX_SEGMENTED_BYTES);
        let mut received = Vec::new();
        while received.len() < 2 {
            assert!(wait_readable_once(&receiver), "message {} never came", received.len());
            receive_datagrams(receiver.as_fd(), &mut batch).unwrap();
            received.extend((0..batch.len()).map(|i| (batch.datagram(i).to_vec(), batch.segment(i))));
        }
        assert_eq!(received[0], (bytes, Some(1000)));
        assert_eq!(received[1], (b"alone".to_vec(), None));
    }

    #[test]
    fn a_datagram_longer_than_its_slot_is_cut_and_reported() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(&[7u8; 300], receiver.local_addr().unwrap()).unwrap();
        let mut batch = DatagramBatch::new(4, 64);
        assert_eq!(receive_datagrams(receiver.as_fd(), &mut batch).unwrap(), 1);
        assert_eq!(batch.datagram(0), &[7u8; 64][..]);
        assert!(batch.truncated(0));
    }

    #[test]
    fn ipv6_sources_and_destinations_round_trip() {
        let Ok(receiver) = UdpSocket::bind("[::1]:0") else {
            eprintln!("no IPv6 loopback on this host: the IPv6 round trip is not checked");
            return;
        };
        let sender = UdpSocket::bind("[::1]:0").unwrap();
        let to = receiver.local_addr().unwrap();
        assert_eq!(send_whole(sender.as_fd(), &[(b"six", to)]).unwrap(), 1);
        let mut batch = DatagramBatch::new(2, 16);
        assert!(wait_readable_once(&receiver));
        assert_eq!(receive_datagrams(receiver.as_fd(), &mut batch).unwrap(), 1);
        assert_eq!(batch.datagram(0), b"six");
        assert_eq!(batch.source(0), Some(sender.local_addr().unwrap()));
    }

    /// [`send_segmented`] of one datagram per message.
    fn send_whole(socket: BorrowedFd<'_>, datagrams: &[(&[u8], SocketAddr)]) -> io::Result<usize> {
        let parts: Vec<IoSlice<'_>> = datagrams.iter().map(|&(bytes, _)| IoSlice::new(bytes)).collect();
        let messages: Vec<SegmentedDatagrams<'_>> = datagrams
            .iter()
            .zip(&parts)
            .map(|(&(_, to), part)| SegmentedDatagrams {
                parts: std::slice::from_ref(part),
                to,
                segment: None,
            })
            .collect();
        send_segmented(socket, &messages)
    }

    fn wait_readable_once(socket: &UdpSocket) -> bool {
        crate::wait_readable(&[socket.as_fd()], Duration::from_secs(1)).unwrap() != 0
    }

    #[test]
    fn send_buffers_grow_and_an_idle_socket_is_writable() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let small = crate::set_send_buffer(socket.as_fd(), 4096).unwrap();
        let large = crate::set_send_buffer(socket.as_fd(), 1 << 20).unwrap();
        assert!(large > small, "{large} <= {small}");
        assert!(wait_writable(socket.as_fd(), Duration::from_millis(100)).unwrap());
    }
}
