//! `rnic-bench --udp-baseline SIZE`: the raw UDP limit of this host's loopback, measured in
//! the same run as the emulators' figures (a user's clone has no shared baseline programs).
//!
//! The shape of the usual C baseline (`udp_pps SIZE COUNT`): one receiver with a 64 MiB
//! receive buffer on `127.0.0.2`, one sender that calls `send_to` `count` times as fast as
//! it can. Here the receiver is a thread, not a forked process (no `unsafe` outside
//! `os/`); on loopback the kernel work is the same. The receiver's figure is the one to
//! compare with: what arrived, over the time from the first datagram to the last (or to
//! the end of the sender's tail of one-byte end markers). A sender faster than the receiver
//! loses datagrams in the receive buffer; the report counts them.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// The loopback address and port the receiver binds (the C baseline's).
pub const RECEIVER: (Ipv4Addr, u16) = (Ipv4Addr::new(127, 0, 0, 2), 24791);

/// What one baseline run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdpBaseline {
    /// Datagram size in bytes.
    pub size: usize,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams that arrived.
    pub received: u64,
    /// The sender's rate, in Gb/s of datagram payload.
    pub send_gbps: f64,
    /// The receiver's rate (what arrived, first to last), in Gb/s: the goodput limit.
    pub receive_gbps: f64,
    /// The receiver's datagrams per second.
    pub receive_pps: f64,
}

/// Sends `count` datagrams of `size` bytes (2..=65507) to a receiver thread bound to
/// `receiver` ([`RECEIVER`] for the command; port 0 picks a free one) and measures both
/// ends.
///
/// # Errors
/// The sockets cannot be bound (another baseline running?) or a send fails for another
/// reason than a full buffer.
pub fn run(size: usize, count: u64, receiver: SocketAddr) -> io::Result<UdpBaseline> {
    let size = size.clamp(2, 65507);
    let receiver = UdpSocket::bind(receiver)?;
    let to = receiver.local_addr()?;
    rnic_os::set_receive_buffer(receiver.as_fd(), 64 << 20)?;
    receiver.set_read_timeout(Some(Duration::from_millis(200)))?;
    let thread = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 65536];
        let mut got = 0u64;
        let mut first = None;
        let mut last = Instant::now();
        while let Ok(length) = receiver.recv(&mut buffer) {
            if length == 1 {
                break; // the sender's end marker
            }
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            got += 1;
        }
        (got, first.map_or(0.0, |first| (last - first).as_secs_f64()))
    });
    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let payload = vec![0u8; size];
    let start = Instant::now();
    let mut sent = 0;
    while sent < count {
        match sender.send_to(&payload, to) {
            Ok(_) => sent += 1,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    let send_secs = start.elapsed().as_secs_f64();
    for _ in 0..100 {
        sender.send_to(&[0], to)?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let (received, receive_secs) = thread.join().map_err(|_| io::Error::other("receiver panicked"))?;
    let gbps = |datagrams: u64, secs: f64| datagrams as f64 * size as f64 * 8.0 / secs.max(1e-9) / 1e9;
    Ok(UdpBaseline {
        size,
        sent,
        received,
        send_gbps: gbps(sent, send_secs),
        receive_gbps: gbps(received, receive_secs),
        receive_pps: received as f64 / receive_secs.max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_datagram_is_counted_at_one_end_or_the_other() {
        let baseline = super::run(1000, 2000, "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(baseline.sent, 2000);
        assert!(baseline.received > 0 && baseline.received <= 2000, "{baseline:?}");
        assert!(baseline.receive_gbps > 0.0 && baseline.send_gbps > 0.0);
    }
}
