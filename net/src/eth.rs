//! `--net eth:IFACE`: whole Ethernet frames on a network interface through an AF_PACKET
//! socket (pnet's datalink channel), for veth pairs between network namespaces or a real
//! port. Needs CAP_NET_RAW (root).
//!
//! Frames go out exactly as the device built them, so every frame on the wire is
//! ICRC-exact to a third party (tshark, rxe), IPv4 included. Neighbour addresses work the
//! way RoCE does it: the driver puts the destination MAC into each QP/AH, the backend only
//! carries frames. It does answer, on the device's behalf,
//!
//! * ARP requests for an IPv4 address of the device's GID table (IPv4-mapped GIDs), and
//! * IPv6 neighbour solicitations for an IPv6 GID,
//!
//! so that a kernel peer on the wire (a Linux host with rxe, say) can resolve the
//! device's MAC; it learns nothing from the wire.
//!
//! The device only sees IPv4/IPv6 frames addressed to its MAC; the interface's other
//! traffic (the kernel's own, broadcasts, our own transmissions echoed by the packet
//! socket) is counted in [`NetStats::rx_ignored`] and dropped.
//!
//! pnet's receive call blocks (with a timeout), so a thread reads the socket and hands
//! frames to the server loop through a bounded channel plus an eventfd the loop waits on;
//! the device itself stays on the loop's thread.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use pnet_datalink::{Channel, Config, DataLinkReceiver, DataLinkSender};

use super::{NetBackend, NetStats};
use rnic_os as os;

/// Frames waiting between the reader thread and the server loop; more are dropped (as a
/// NIC drops on a full receive ring) and counted in [`NetStats::rx_overflow`].
pub const RX_QUEUE: usize = 4096;

/// How often the reader thread looks at its stop flag.
const READ_TIMEOUT: Duration = Duration::from_millis(50);

/// Socket buffers: room for a 9000-byte jumbo frame with headers.
const BUFFER: usize = 16 * 1024;

const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;

/// The Ethernet backend.
pub struct EthBackend {
    interface: String,
    mac: [u8; 6],
    tx: Box<dyn DataLinkSender>,
    frames: Receiver<Vec<u8>>,
    /// Written by the reader thread after each frame it queues: the loop's wake-up.
    wake: Arc<File>,
    stop: Arc<AtomicBool>,
    overflow: Arc<AtomicU64>,
    reader: Option<JoinHandle<()>>,
    addresses: Vec<IpAddr>,
    stats: NetStats,
}

impl std::fmt::Debug for EthBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EthBackend")
            .field("interface", &self.interface)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl EthBackend {
    /// Opens an AF_PACKET channel on `interface` (in the calling thread's network
    /// namespace) for a device whose MAC address is `mac`.
    ///
    /// # Errors
    /// No such interface (the message lists the ones there are), or no permission (the
    /// message says CAP_NET_RAW is needed).
    pub fn open(interface: &str, mac: [u8; 6]) -> io::Result<Self> {
        let interfaces = pnet_datalink::interfaces();
        let Some(found) = interfaces.iter().find(|i| i.name == interface) else {
            let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface {interface:?} (there are: {})", names.join(", ")),
            ));
        };
        let config = Config {
            read_buffer_size: BUFFER,
            write_buffer_size: BUFFER,
            read_timeout: Some(READ_TIMEOUT),
            promiscuous: true,
            ..Config::default()
        };
        let (tx, rx) = match pnet_datalink::channel(found, config) {
            Ok(Channel::Ethernet(tx, rx)) => (tx, rx),
            Ok(_) => return Err(io::Error::other(format!("{interface}: not an Ethernet channel"))),
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                return Err(io::Error::new(
                    error.kind(),
                    format!(
                        "eth:{interface} needs CAP_NET_RAW for its AF_PACKET socket: run as root (or \
                         `setcap cap_net_raw+ep rnic-emu`), or use --net udp:IP, which needs no \
                         privileges ({error})"
                    ),
                ))
            }
            Err(error) => return Err(io::Error::new(error.kind(), format!("eth:{interface}: {error}"))),
        };
        let wake = Arc::new(File::from(os::eventfd()?));
        let stop = Arc::new(AtomicBool::new(false));
        let overflow = Arc::new(AtomicU64::new(0));
        let (sender, frames) = mpsc::sync_channel(RX_QUEUE);
        let reader = {
            let (wake, stop, overflow) = (wake.clone(), stop.clone(), overflow.clone());
            // Signals blocked: inside the drop-in libraries this thread lives in an
            // application, whose process-directed signals are its own.
            rnic_os::spawn_with_signals_blocked(
                std::thread::Builder::new().name(format!("rnic-emu-eth-{interface}")),
                move || read_frames(rx, sender, &wake, &stop, &overflow),
            )?
        };
        tracing::info!(target: "rnic_emu::net", interface, "eth backend open");
        Ok(Self {
            interface: interface.to_string(),
            mac,
            tx,
            frames,
            wake,
            stop,
            overflow,
            reader: Some(reader),
            addresses: Vec::new(),
            stats: NetStats::default(),
        })
    }

    fn transmit(&mut self, frame: &[u8]) -> bool {
        match self.tx.send_to(frame, None) {
            Some(Ok(())) => true,
            Some(Err(error)) => {
                self.stats.tx_errors += 1;
                tracing::debug!(target: "rnic_emu::net", %error, "AF_PACKET send failed; frame lost");
                false
            }
            None => {
                self.stats.tx_errors += 1;
                false
            }
        }
    }

    /// Answers `frame` if it is an ARP request or a neighbour solicitation for one of our
    /// addresses; returns whether it was one of those (for us or not).
    fn answer_neighbour(&mut self, frame: &[u8]) -> bool {
        let reply = match ethertype(frame) {
            ETHERTYPE_ARP => arp_reply(frame, self.mac, &self.addresses).flatten(),
            ETHERTYPE_IPV6 => match neighbour_advertisement(frame, self.mac, &self.addresses) {
                Some(reply) => reply,
                None => return false,
            },
            _ => return false,
        };
        if let Some(reply) = reply {
            if self.transmit(&reply) {
                self.stats.neighbour_replies += 1;
                tracing::debug!(target: "rnic_emu::net", "answered a neighbour request");
            }
        }
        true
    }
}

impl Drop for EthBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            // Returns within one read timeout.
            let _ = reader.join();
        }
    }
}

/// The reader thread: frames from the socket into the channel, one eventfd write each.
fn read_frames(
    mut rx: Box<dyn DataLinkReceiver>,
    frames: SyncSender<Vec<u8>>,
    wake: &File,
    stop: &AtomicBool,
    overflow: &AtomicU64,
) {
    while !stop.load(Ordering::SeqCst) {
        match rx.next() {
            Ok(frame) => match frames.try_send(frame.to_vec()) {
                Ok(()) => {
                    // Fails only if the counter would overflow; the loop is awake then.
                    let _ = (&*wake).write(&1u64.to_ne_bytes());
                }
                Err(TrySendError::Full(_)) => {
                    overflow.fetch_add(1, Ordering::Relaxed);
                }
                Err(TrySendError::Disconnected(_)) => return,
            },
            Err(error) if matches!(error.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {}
            Err(error) => {
                tracing::debug!(target: "rnic_emu::net", %error, "AF_PACKET receive failed");
                // Not a tight loop on a persistent error.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn ethertype(frame: &[u8]) -> u16 {
    frame.get(12..14).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
}

/// The ARP reply to `frame` if it is an Ethernet/IPv4 ARP request for one of
/// `addresses`. `Some(None)`: an ARP frame, not for us.
fn arp_reply(frame: &[u8], mac: [u8; 6], addresses: &[IpAddr]) -> Option<Option<Vec<u8>>> {
    let arp = frame.get(14..42)?;
    let request = arp[0..8] == [0, 1, 8, 0, 6, 4, 0, 1];
    let target = IpAddr::from([arp[24], arp[25], arp[26], arp[27]]);
    if !request || !addresses.contains(&target) {
        return Some(None);
    }
    let (requester_mac, requester_ip) = (&arp[8..14], &arp[14..18]);
    let mut reply = Vec::with_capacity(60);
    reply.extend_from_slice(requester_mac);
    reply.extend_from_slice(&mac);
    reply.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    reply.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    reply.extend_from_slice(&mac);
    reply.extend_from_slice(&arp[24..28]);
    reply.extend_from_slice(requester_mac);
    reply.extend_from_slice(requester_ip);
    // The Ethernet minimum (without FCS).
    reply.resize(60, 0);
    Some(Some(reply))
}

/// For an ICMPv6 neighbour solicitation: `Some(Some(advertisement))` if it asks for one
/// of `addresses`, `Some(None)` if it does not; `None` for any other IPv6 frame.
fn neighbour_advertisement(frame: &[u8], mac: [u8; 6], addresses: &[IpAddr]) -> Option<Option<Vec<u8>>> {
    let ip = frame.get(14..54)?;
    let icmp = frame.get(54..)?;
    // Next header ICMPv6, hop limit 255 (RFC 4861 §7.1.1), type 135 code 0.
    if ip[6] != 58 || ip[7] != 255 || icmp.len() < 24 || icmp[0] != 135 || icmp[1] != 0 {
        return None;
    }
    let mut target = [0u8; 16];
    target.copy_from_slice(&icmp[8..24]);
    if !addresses.contains(&IpAddr::from(target)) {
        return Some(None);
    }
    let solicitor: [u8; 16] = ip[8..24].try_into().ok()?;
    // A solicitation from the unspecified address (duplicate address detection) is
    // answered to all nodes, unsolicited (RFC 4861 §7.2.4).
    let (destination, solicited, destination_mac) = if solicitor == [0; 16] {
        let mut all_nodes = [0u8; 16];
        all_nodes[0] = 0xff;
        all_nodes[1] = 0x02;
        all_nodes[15] = 1;
        (all_nodes, false, [0x33, 0x33, 0, 0, 0, 1])
    } else {
        let mut source_mac = [0u8; 6];
        source_mac.copy_from_slice(&frame[6..12]);
        (solicitor, true, source_mac)
    };
    // ICMPv6: type 136, code 0, checksum, flags (S, O), reserved, target, TLLA option.
    let mut message = vec![136, 0, 0, 0, if solicited { 0x60 } else { 0x20 }, 0, 0, 0];
    message.extend_from_slice(&target);
    message.extend_from_slice(&[2, 1]);
    message.extend_from_slice(&mac);
    let checksum = icmpv6_checksum(&target, &destination, &message);
    message[2..4].copy_from_slice(&checksum.to_be_bytes());
    let mut reply = Vec::with_capacity(14 + 40 + message.len());
    reply.extend_from_slice(&destination_mac);
    reply.extend_from_slice(&mac);
    reply.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    reply.extend_from_slice(&[0x60, 0, 0, 0]);
    reply.extend_from_slice(&(message.len() as u16).to_be_bytes());
    reply.extend_from_slice(&[58, 255]);
    reply.extend_from_slice(&target);
    reply.extend_from_slice(&destination);
    reply.extend_from_slice(&message);
    Some(Some(reply))
}

/// The ICMPv6 checksum of `message` (checksum field zero) with its pseudo-header.
fn icmpv6_checksum(source: &[u8; 16], destination: &[u8; 16], message: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(word);
        }
    };
    add(source);
    add(destination);
    add(&(message.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(message);
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

impl NetBackend for EthBackend {
    fn describe(&self) -> String {
        format!("eth:{}", self.interface)
    }

    fn send(&mut self, frame: &[u8]) {
        if self.transmit(frame) {
            self.stats.frames_sent += 1;
        }
    }

    fn receive(&mut self, frame: &mut Vec<u8>) -> bool {
        // Reset the wake-up before looking at the queue, so a frame queued after the
        // look wakes the loop again.
        let mut counter = [0u8; 8];
        let _ = (&*self.wake).read(&mut counter);
        self.stats.rx_overflow = self.overflow.load(Ordering::Relaxed);
        while let Ok(received) = self.frames.try_recv() {
            if received.get(6..12) == Some(&self.mac[..]) {
                // Our own transmission, echoed by the packet socket.
                continue;
            }
            if self.answer_neighbour(&received) {
                continue;
            }
            let for_us = received.get(0..6) == Some(&self.mac[..])
                && matches!(ethertype(&received), ETHERTYPE_IPV4 | ETHERTYPE_IPV6 | ETHERTYPE_VLAN);
            if !for_us {
                self.stats.rx_ignored += 1;
                continue;
            }
            *frame = received;
            self.stats.frames_received += 1;
            return true;
        }
        false
    }

    fn pollable_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.wake.as_fd())
    }

    fn stats(&self) -> NetStats {
        self.stats
    }

    fn wants_local_addresses(&self) -> bool {
        true
    }

    fn set_local_addresses(&mut self, addresses: &[IpAddr]) {
        if self.addresses != addresses {
            tracing::info!(target: "rnic_emu::net", ?addresses, "answering ARP/ND for the device's GIDs");
            self.addresses = addresses.to_vec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [2, 0x52, 0x4e, 0x49, 0x43, 1];

    #[test]
    fn arp_requests_for_our_address_are_answered() {
        let mut request = vec![0xff; 6];
        request.extend_from_slice(&[2, 0, 0, 0, 0, 9]);
        request.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        request.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 192, 0, 2, 9]);
        request.extend_from_slice(&[0; 6]);
        request.extend_from_slice(&[192, 0, 2, 1]);
        let ours = [IpAddr::from([192, 0, 2, 1])];
        let reply = arp_reply(&request, MAC, &ours).unwrap().unwrap();
        assert_eq!(reply.len(), 60);
        assert_eq!(&reply[0..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(&reply[6..12], &MAC);
        assert_eq!(&reply[20..22], &[0, 2], "op reply");
        assert_eq!(&reply[22..28], &MAC, "sender MAC");
        assert_eq!(&reply[28..32], &[192, 0, 2, 1]);
        assert_eq!(&reply[38..42], &[192, 0, 2, 9]);
        assert_eq!(arp_reply(&request, MAC, &[IpAddr::from([192, 0, 2, 2])]), Some(None));
        assert_eq!(arp_reply(&request[..30], MAC, &ours), None);
    }

    #[test]
    fn neighbour_solicitations_for_our_address_are_answered_with_a_valid_checksum() {
        let target: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let solicitor: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        let mut frame = vec![0x33, 0x33, 0xff, 0, 0, 1, 2, 0, 0, 0, 0, 9, 0x86, 0xdd];
        frame.extend_from_slice(&[0x60, 0, 0, 0, 0, 32, 58, 255]);
        frame.extend_from_slice(&solicitor);
        frame.extend_from_slice(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 1]);
        frame.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]);
        frame.extend_from_slice(&target);
        frame.extend_from_slice(&[1, 1, 2, 0, 0, 0, 0, 9]);
        let reply = neighbour_advertisement(&frame, MAC, &[IpAddr::from(target)])
            .unwrap()
            .unwrap();
        assert_eq!(&reply[0..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(&reply[22..38], &target);
        assert_eq!(&reply[38..54], &solicitor);
        let icmp = &reply[54..];
        assert_eq!((icmp[0], icmp[4]), (136, 0x60));
        assert_eq!(&icmp[26..32], &MAC);
        // A checksum over the message with its checksum in place sums to zero.
        assert_eq!(icmpv6_checksum(&target, &solicitor, icmp), 0);
        assert_eq!(neighbour_advertisement(&frame, MAC, &[]), Some(None));
        frame[20] = 6;
        assert_eq!(neighbour_advertisement(&frame, MAC, &[IpAddr::from(target)]), None);
    }

    #[test]
    fn a_missing_interface_is_named() {
        let error = EthBackend::open("rnic-no-such-if", MAC).unwrap_err();
        assert!(error.to_string().contains("rnic-no-such-if"), "{error}");
    }
}
