//! The fabric's queueing and fault logic, driven through [`Port`] by scripted fake ports
//! (and, for the clock, by real devices).

use std::collections::VecDeque;
use std::sync::Arc;

use super::fault::{corrupt_frame, masked_positions};
use super::*;
use crate::config::DeviceConfig;
use crate::interrupt::RecordingSink;
use crate::memory::PagedMemory;

const NS: u64 = 1_000;
const US: u64 = 1_000_000;
/// An EtherType for local experiments: the fake traffic is not IP.
const ETHERTYPE_TEST: u16 = 0x88B5;

fn mac(i: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, i]
}

/// A test frame: Ethernet header, a 4-byte sequence number, then `len - 18` bytes of
/// pattern (shorter `len`s are cut off: runts).
fn frame(destination: [u8; 6], source: [u8; 6], sequence: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len.max(18));
    f.extend_from_slice(&destination);
    f.extend_from_slice(&source);
    f.extend_from_slice(&ETHERTYPE_TEST.to_be_bytes());
    f.extend_from_slice(&sequence.to_be_bytes());
    f.extend((0..len.saturating_sub(18)).map(|i| (i as u8) ^ (sequence as u8)));
    f.truncate(len);
    f
}

fn sequence_of(frame: &[u8]) -> u32 {
    u32::from_be_bytes(frame[14..18].try_into().unwrap())
}

/// A scripted port: sends its script's frames at their times, records what it receives,
/// optionally echoes each received frame back to its source after `echo` picoseconds,
/// and checks that its clock never goes back.
#[derive(Debug)]
struct FakePort {
    mac: [u8; 6],
    now: Picoseconds,
    /// Frames to send, by time (kept sorted).
    script: VecDeque<(Picoseconds, Vec<u8>)>,
    outbox: VecDeque<Vec<u8>>,
    received: Vec<(Picoseconds, Vec<u8>)>,
    received_count: u64,
    /// Whether to keep received frames (off for the long statistical runs).
    keep: bool,
    echo: Option<Picoseconds>,
    advances: Vec<Picoseconds>,
    polled: u64,
    recycled: u64,
    /// Where the buffers this port handed out live (to see that frames travel in them).
    sent_buffers: Vec<usize>,
    /// Where the buffers this port was given to keep live.
    kept_buffers: Vec<usize>,
    /// Whether it hands its frames out with their ICRC offloaded (as a device does).
    offload: bool,
    /// The ICRC state of each frame it was given to keep.
    received_icrc: Vec<Icrc>,
}

impl FakePort {
    fn new(mac: [u8; 6]) -> Self {
        Self {
            mac,
            now: Picoseconds::ZERO,
            script: VecDeque::new(),
            outbox: VecDeque::new(),
            received: Vec::new(),
            received_count: 0,
            keep: true,
            echo: None,
            advances: Vec::new(),
            polled: 0,
            recycled: 0,
            sent_buffers: Vec::new(),
            kept_buffers: Vec::new(),
            offload: false,
            received_icrc: Vec::new(),
        }
    }

    fn send_at(&mut self, at: Picoseconds, frame: Vec<u8>) {
        let index = self.script.partition_point(|(t, _)| *t <= at);
        self.script.insert(index, (at, frame));
    }

    fn received_sequences(&self) -> Vec<u32> {
        self.received.iter().map(|(_, f)| sequence_of(f)).collect()
    }
}

impl Port for FakePort {
    fn mac_address(&self) -> [u8; 6] {
        self.mac
    }

    fn now(&self) -> Picoseconds {
        self.now
    }

    fn next_event_time(&self) -> Option<Picoseconds> {
        self.script.front().map(|(t, _)| *t)
    }

    fn advance_to(&mut self, t: Picoseconds) {
        assert!(t >= self.now, "port clock went back from {} to {t}", self.now);
        self.advances.push(t);
        while self.script.front().is_some_and(|(at, _)| *at <= t) {
            let (_, frame) = self.script.pop_front().unwrap();
            self.outbox.push_back(frame);
        }
        self.now = t;
    }

    fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        let frame = self.outbox.pop_front()?;
        self.polled += 1;
        self.sent_buffers.push(frame.as_ptr() as usize);
        Some(frame)
    }

    fn poll_transmit_offloaded(&mut self) -> Option<(Vec<u8>, Icrc)> {
        let icrc = if self.offload { Icrc::Offloaded } else { Icrc::Computed };
        self.poll_transmit().map(|frame| (frame, icrc))
    }

    fn receive_frame_offloaded(&mut self, frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        self.received_icrc.push(icrc);
        self.receive_frame_owned(frame)
    }

    fn receive_frame_owned(&mut self, frame: Vec<u8>) -> Vec<u8> {
        self.kept_buffers.push(frame.as_ptr() as usize);
        self.receive_frame(&frame);
        frame
    }

    fn receive_frame(&mut self, frame: &[u8]) {
        self.received_count += 1;
        if self.keep {
            self.received.push((self.now, frame.to_vec()));
        }
        if let Some(delay) = self.echo {
            let mut reply = frame.to_vec();
            reply.copy_within(6..12, 0);
            reply[6..12].copy_from_slice(&self.mac);
            self.send_at(self.now + delay, reply);
        }
    }

    fn recycle_frame(&mut self, buffer: Vec<u8>) {
        assert!(buffer.capacity() > 0, "the fabric gives back a usable buffer");
        self.recycled += 1;
    }
}

fn fabric_with(config: FabricConfig, ports: usize) -> Fabric<FakePort> {
    let mut fabric = Fabric::new_generic(config);
    for i in 0..ports {
        let id = fabric.add_device(FakePort::new(mac(i as u8)));
        assert_eq!(id, DeviceId(i));
    }
    fabric
}

fn faulty(plan: FaultPlan, ports: usize) -> Fabric<FakePort> {
    fabric_with(
        FabricConfig {
            faults: plan,
            ..FabricConfig::default()
        },
        ports,
    )
}

fn plan(spec: &str) -> FaultPlan {
    FaultPlan::parse(spec).unwrap()
}

/// Port 0 sends `n` frames of `len` bytes to port 1, one every `gap`, from `gap` on.
fn stream(fabric: &mut Fabric<FakePort>, n: u32, gap: Picoseconds, len: usize) {
    for i in 0..n {
        let at = Picoseconds(gap.0 * (u64::from(i) + 1));
        fabric
            .device_mut(DeviceId(0))
            .send_at(at, frame(mac(1), mac(0), i, len));
    }
}

fn settle(fabric: &mut Fabric<FakePort>) {
    fabric.run_until_idle(Picoseconds(u64::MAX));
    assert_eq!(fabric.frames_in_flight(), 0);
    assert_eq!(fabric.next_event_time(), None);
}

fn assert_buffers_returned(fabric: &Fabric<FakePort>) {
    for i in 0..fabric.devices() {
        let port = fabric.device(DeviceId(i));
        assert_eq!(port.polled, port.recycled, "every buffer of port {i} went back to it");
    }
}

// ---- the wire -----------------------------------------------------------------------------

#[test]
fn a_frame_travels_in_its_senders_buffer_to_its_last_receiver() {
    // Unicast: the receiver is given the very buffer the sender handed out.
    let mut fabric = fabric_with(FabricConfig::default(), 2);
    for sequence in 0..3 {
        let at = Picoseconds(u64::from(sequence) * 10 * NS);
        let sent = frame(mac(1), mac(0), sequence, 256);
        fabric.device_mut(DeviceId(0)).send_at(at, sent);
    }
    settle(&mut fabric);
    let (sender, receiver) = (fabric.device(DeviceId(0)), fabric.device(DeviceId(1)));
    assert_eq!(receiver.kept_buffers, sender.sent_buffers);
    assert_eq!(receiver.received_sequences(), [0, 1, 2]);
    assert_buffers_returned(&fabric);

    // Broadcast to two receivers: the first gets a copy, the last the buffer.
    let mut fabric = fabric_with(FabricConfig::default(), 3);
    fabric
        .device_mut(DeviceId(0))
        .send_at(Picoseconds::ZERO, frame([0xFF; 6], mac(0), 7, 128));
    settle(&mut fabric);
    let sent = fabric.device(DeviceId(0)).sent_buffers.clone();
    assert!(fabric.device(DeviceId(1)).kept_buffers.is_empty());
    assert_eq!(fabric.device(DeviceId(2)).kept_buffers, sent);
    for receiver in [1, 2] {
        assert_eq!(fabric.device(DeviceId(receiver)).received_sequences(), [7]);
    }
    assert_buffers_returned(&fabric);
}

#[test]
fn frames_arrive_one_link_latency_after_they_leave() {
    let mut fabric = fabric_with(FabricConfig::default(), 2);
    let sent = frame(mac(1), mac(0), 1, 64);
    fabric
        .device_mut(DeviceId(0))
        .send_at(Picoseconds(5 * NS), sent.clone());
    settle(&mut fabric);
    let received = &fabric.device(DeviceId(1)).received;
    assert_eq!(received, &vec![(Picoseconds(5 * NS + US), sent)]);

    // A round trip: two link latencies and the echo's turnaround.
    let config = FabricConfig {
        link_latency: Picoseconds(700 * NS),
        ..FabricConfig::default()
    };
    let mut fabric = fabric_with(config, 2);
    fabric.device_mut(DeviceId(1)).echo = Some(Picoseconds(100 * NS));
    fabric
        .device_mut(DeviceId(0))
        .send_at(Picoseconds(5 * NS), frame(mac(1), mac(0), 9, 64));
    settle(&mut fabric);
    let back = &fabric.device(DeviceId(0)).received;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].0, Picoseconds(5 * NS + 2 * 700 * NS + 100 * NS));
    assert_eq!(&back[0].1[..6], &mac(0));
    assert_buffers_returned(&fabric);
}

#[test]
fn unicast_goes_to_the_device_with_the_destination_mac() {
    let mut fabric = fabric_with(FabricConfig::default(), 3);
    let port = fabric.device_mut(DeviceId(0));
    port.send_at(Picoseconds(NS), frame(mac(2), mac(0), 1, 64));
    port.send_at(Picoseconds(2 * NS), frame(mac(1), mac(0), 2, 64));
    port.send_at(Picoseconds(3 * NS), frame(mac(9), mac(0), 3, 64)); // nobody
    port.send_at(Picoseconds(4 * NS), frame(mac(1), mac(0), 4, 10)); // runt
    port.send_at(Picoseconds(5 * NS), frame(mac(0), mac(0), 5, 64)); // hairpin
    settle(&mut fabric);
    assert_eq!(fabric.device(DeviceId(1)).received_sequences(), vec![2]);
    assert_eq!(fabric.device(DeviceId(2)).received_sequences(), vec![1]);
    assert_eq!(fabric.device(DeviceId(0)).received_sequences(), vec![5]);
    let stats = fabric.statistics();
    assert_eq!((stats.sent, stats.delivered, stats.undeliverable), (5, 3, 2));
    assert_buffers_returned(&fabric);
}

#[test]
fn broadcast_and_multicast_reach_every_other_device() {
    let mut fabric = fabric_with(FabricConfig::default(), 3);
    let port = fabric.device_mut(DeviceId(1));
    port.send_at(Picoseconds(NS), frame([0xFF; 6], mac(1), 1, 64));
    port.send_at(Picoseconds(NS), frame([0x01, 0x00, 0x5E, 0, 0, 1], mac(1), 2, 64));
    settle(&mut fabric);
    assert_eq!(fabric.device(DeviceId(0)).received_sequences(), vec![1, 2]);
    assert_eq!(fabric.device(DeviceId(2)).received_sequences(), vec![1, 2]);
    assert!(fabric.device(DeviceId(1)).received.is_empty(), "not back to the sender");
    assert_eq!(fabric.statistics().delivered, 4);

    // Alone on the wire, a broadcast reaches nobody.
    let mut alone = fabric_with(FabricConfig::default(), 1);
    alone
        .device_mut(DeviceId(0))
        .send_at(Picoseconds(NS), frame([0xFF; 6], mac(0), 1, 64));
    settle(&mut alone);
    assert_eq!(alone.statistics().undeliverable, 1);
    assert_eq!(alone.statistics().delivered, 0);
}

#[test]
fn equal_time_arrivals_are_delivered_in_device_then_emission_order() {
    let mut fabric = fabric_with(FabricConfig::default(), 3);
    let at = Picoseconds(100 * NS);
    fabric
        .device_mut(DeviceId(1))
        .send_at(at, frame(mac(2), mac(1), 10, 64));
    fabric
        .device_mut(DeviceId(1))
        .send_at(at, frame(mac(2), mac(1), 11, 64));
    fabric.device_mut(DeviceId(0)).send_at(at, frame(mac(2), mac(0), 0, 64));
    fabric.device_mut(DeviceId(0)).send_at(at, frame(mac(2), mac(0), 1, 64));
    settle(&mut fabric);
    let received = &fabric.device(DeviceId(2)).received;
    assert!(received
        .iter()
        .all(|(t, _)| *t == at + FabricConfig::DEFAULT_LINK_LATENCY));
    assert_eq!(fabric.device(DeviceId(2)).received_sequences(), vec![0, 1, 10, 11]);
}

#[test]
fn capture_records_every_frame_as_it_left_before_faults() {
    let mut fabric = faulty(plan("loss=1"), 2);
    fabric.set_capture(true);
    stream(&mut fabric, 5, Picoseconds(10 * NS), 60);
    fabric
        .device_mut(DeviceId(1))
        .send_at(Picoseconds(25 * NS), frame(mac(0), mac(1), 99, 70));
    settle(&mut fabric);
    let capture = fabric.take_capture();
    let summary: Vec<_> = capture
        .iter()
        .map(|c| (c.time.0, c.from, sequence_of(&c.bytes)))
        .collect();
    assert_eq!(
        summary,
        vec![
            (10 * NS, DeviceId(0), 0),
            (20 * NS, DeviceId(0), 1),
            (25 * NS, DeviceId(1), 99),
            (30 * NS, DeviceId(0), 2),
            (40 * NS, DeviceId(0), 3),
            (50 * NS, DeviceId(0), 4),
        ]
    );
    assert_eq!(capture[0].bytes, frame(mac(1), mac(0), 0, 60));
    assert_eq!(fabric.statistics().dropped, 6);
    assert!(fabric.take_capture().is_empty(), "taking empties the capture");
}

// ---- each fault alone at probability 1 -----------------------------------------------------

#[test]
fn loss_at_one_drops_every_frame() {
    let mut fabric = faulty(plan("loss=1,seed=3"), 2);
    stream(&mut fabric, 1000, Picoseconds(50 * NS), 64);
    settle(&mut fabric);
    let stats = fabric.statistics();
    assert_eq!((stats.sent, stats.dropped, stats.delivered), (1000, 1000, 0));
    assert!(fabric.device(DeviceId(1)).received.is_empty());
    assert_buffers_returned(&fabric);
}

#[test]
fn a_drop_rule_loses_the_frames_it_picks_and_leaves_the_plans_draws_alone() {
    let run = |rule: Option<DropRule>| {
        let mut fabric = faulty(plan("loss=0.2,dup=0.1,seed=11"), 2);
        fabric.set_drop_rule(rule);
        stream(&mut fabric, 500, Picoseconds(50 * NS), 64);
        settle(&mut fabric);
        assert_buffers_returned(&fabric);
        (fabric.statistics(), fabric.device(DeviceId(1)).received_sequences())
    };
    let picked = |sequence: u32| sequence % 7 == 3;
    let (plain, plain_received) = run(None);
    let (ruled, ruled_received) = run(Some(Box::new(move |from, frame| {
        assert_eq!(from, DeviceId(0));
        picked(sequence_of(frame))
    })));
    // Exactly the picked frames are gone; every other frame met the fate it met before.
    let expected: Vec<u32> = plain_received.iter().copied().filter(|&s| !picked(s)).collect();
    assert_eq!(ruled_received, expected);
    let picked_through_the_plan = (0..500).filter(|&s| picked(s) && plain_received.contains(&s)).count() as u64;
    assert!(picked_through_the_plan > 0);
    assert_eq!(ruled.sent, plain.sent);
    assert_eq!(ruled.dropped, plain.dropped + picked_through_the_plan);
}

#[test]
fn duplicate_at_one_delivers_every_frame_twice_back_to_back() {
    let mut fabric = faulty(plan("dup=1"), 2);
    stream(&mut fabric, 100, Picoseconds(50 * NS), 64);
    settle(&mut fabric);
    let expected: Vec<u32> = (0..100).flat_map(|i| [i, i]).collect();
    assert_eq!(fabric.device(DeviceId(1)).received_sequences(), expected);
    let received = &fabric.device(DeviceId(1)).received;
    assert!(
        received.chunks(2).all(|pair| pair[0] == pair[1]),
        "same bytes, same instant"
    );
    let stats = fabric.statistics();
    assert_eq!((stats.duplicated, stats.delivered), (100, 200));
    assert_buffers_returned(&fabric);
}

#[test]
fn corrupt_at_one_flips_exactly_one_byte_past_the_ethernet_header() {
    let mut fabric = faulty(plan("corrupt=1,seed=11"), 2);
    let lengths: Vec<usize> = (0..500).map(|i| 15 + (i * 37) % 300).collect();
    let mut sent = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        let f = frame(mac(1), mac(0), i as u32, len);
        sent.push(f.clone());
        fabric
            .device_mut(DeviceId(0))
            .send_at(Picoseconds(10 * NS * (i as u64 + 1)), f);
    }
    // A header-only frame has nothing to corrupt; a VLAN tag is part of the header.
    let header_only = frame(mac(1), mac(0), 0, 14);
    let mut tagged = frame(mac(1), mac(0), 0, 64);
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    for (i, f) in [header_only.clone(), tagged.clone()].into_iter().enumerate() {
        fabric
            .device_mut(DeviceId(0))
            .send_at(Picoseconds(US * (10 + i as u64)), f);
    }
    settle(&mut fabric);

    let received = &fabric.device(DeviceId(1)).received;
    assert_eq!(received.len(), 502);
    let mut positions = std::collections::BTreeSet::new();
    for ((_, got), want) in received.iter().zip(&sent) {
        assert_eq!(got.len(), want.len());
        let differing: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
        assert_eq!(differing.len(), 1, "exactly one byte flipped");
        assert!(differing[0] >= ETHERNET_HEADER_LEN, "past the Ethernet header");
        positions.insert(differing[0]);
    }
    assert!(
        positions.len() > 100,
        "the flipped byte moves around: {}",
        positions.len()
    );
    assert_eq!(received[500].1, header_only, "nothing to corrupt");
    let differing: Vec<usize> = (0..tagged.len()).filter(|&i| received[501].1[i] != tagged[i]).collect();
    assert_eq!(differing.len(), 1);
    assert!(differing[0] >= 18, "past the VLAN tag");
    assert_eq!(fabric.statistics().corrupted, 501);
}

/// A RoCEv2 frame: Ethernet, IPv4 or IPv6, UDP to 4791, BTH, 16 bytes payload, ICRC.
fn roce_frame(ipv6: bool) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&mac(1));
    f.extend_from_slice(&mac(0));
    if ipv6 {
        f.extend_from_slice(&0x86DDu16.to_be_bytes());
        let mut ip = [0u8; 40];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&(8u16 + 12 + 16 + 4).to_be_bytes());
        ip[6] = 17;
        ip[7] = 64;
        f.extend_from_slice(&ip);
    } else {
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[8] = 64;
        ip[9] = 17;
        f.extend_from_slice(&ip);
    }
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&49152u16.to_be_bytes());
    udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
    f.extend_from_slice(&udp);
    f.extend_from_slice(&[0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0, 0, 0, 1]); // BTH
    f.extend((0..16).map(|i| i as u8));
    f.extend_from_slice(&[0xDE, 0xAD, 0xBE, 0xEF]); // ICRC
    f
}

#[test]
fn corruption_never_touches_fields_the_icrc_does_not_cover() {
    // IPv4: TOS, TTL, header checksum; UDP checksum; BTH byte 4.
    let v4 = roce_frame(false);
    assert_eq!(masked_positions(&v4), vec![15, 22, 24, 25, 40, 41, 46]);
    // IPv6: traffic class and flow label, hop limit; UDP checksum; BTH byte 4.
    let v6 = roce_frame(true);
    assert_eq!(masked_positions(&v6), vec![14, 15, 16, 17, 21, 60, 61, 66]);
    // Not RoCEv2: nothing is skipped.
    assert!(masked_positions(&frame(mac(1), mac(0), 0, 64)).is_empty());

    for original in [v4, v6] {
        let masked = masked_positions(&original);
        let candidates = original.len() - ETHERNET_HEADER_LEN - masked.len();
        let mut hit = std::collections::BTreeSet::new();
        for choice in 0..candidates as u64 * 2 {
            let mut f = original.clone();
            let position = corrupt_frame(&mut f, choice, 0x40).unwrap();
            assert_eq!(f[position], original[position] ^ 0x40);
            assert!(!masked.contains(&position), "ICRC-masked byte {position} corrupted");
            hit.insert(position);
        }
        let expected: std::collections::BTreeSet<usize> = (ETHERNET_HEADER_LEN..original.len())
            .filter(|p| !masked.contains(p))
            .collect();
        assert_eq!(hit, expected, "every covered byte can be hit");
    }
}

#[test]
fn delay_at_one_is_bounded_by_max_delay() {
    let max_delay = Picoseconds(2 * US);
    let mut fabric = faulty(plan("delay=1,max_delay=2us,seed=5"), 2);
    stream(&mut fabric, 1000, Picoseconds(50 * NS), 64);
    settle(&mut fabric);
    let latency = FabricConfig::DEFAULT_LINK_LATENCY;
    let extra: Vec<u64> = fabric
        .device(DeviceId(1))
        .received
        .iter()
        .map(|(t, f)| {
            let sent = 50 * NS * (u64::from(sequence_of(f)) + 1);
            t.0 - sent - latency.0
        })
        .collect();
    assert_eq!(extra.len(), 1000);
    assert!(
        extra.iter().all(|&d| (1..=max_delay.0).contains(&d)),
        "late by 1..=max_delay"
    );
    assert!(*extra.iter().min().unwrap() < max_delay.0 / 10);
    assert!(*extra.iter().max().unwrap() > max_delay.0 / 10 * 9);
    assert_eq!(fabric.statistics().delayed, 1000);
    let mut sequences = fabric.device(DeviceId(1)).received_sequences();
    assert_ne!(sequences, (0..1000).collect::<Vec<_>>(), "delays reorder frames");
    sequences.sort_unstable();
    assert_eq!(sequences, (0..1000).collect::<Vec<_>>(), "each frame once");
}

#[test]
fn reorder_at_one_is_bounded_by_the_window() {
    for window in [1u32, 3, 5] {
        let mut fabric = faulty(plan(&format!("reorder=1,window={window},seed=21")), 2);
        stream(&mut fabric, 1000, Picoseconds(20 * NS), 64);
        settle(&mut fabric);
        let order = fabric.device(DeviceId(1)).received_sequences();
        let mut position = vec![usize::MAX; 1000];
        for (p, &s) in order.iter().enumerate() {
            assert_eq!(position[s as usize], usize::MAX, "frame {s} delivered twice");
            position[s as usize] = p;
        }
        assert!(position.iter().all(|&p| p != usize::MAX), "every frame delivered");
        let mut most = 0;
        for i in 0..1000 {
            let overtaken_by = (i + 1..1000).filter(|&j| position[j] < position[i]).count();
            assert!(
                overtaken_by <= window as usize,
                "frame {i} overtaken by {overtaken_by} > {window}"
            );
            most = most.max(overtaken_by);
        }
        assert_eq!(most, window as usize, "the window is used in full");
        let reordered = fabric.statistics().reordered;
        assert!(reordered > 100, "window {window}: {reordered} reordered");
        // No frame arrives before its time.
        for (t, f) in &fabric.device(DeviceId(1)).received {
            assert!(t.0 >= 20 * NS * (u64::from(sequence_of(f)) + 1) + US);
        }
    }
}

#[test]
fn a_held_frame_is_let_go_when_its_sender_goes_quiet() {
    let mut fabric = faulty(plan("reorder=1,max_delay=3us"), 2);
    fabric
        .device_mut(DeviceId(0))
        .send_at(Picoseconds(NS), frame(mac(1), mac(0), 0, 64));
    fabric.advance_to(Picoseconds(2 * US));
    assert_eq!(fabric.frames_in_flight(), 1);
    assert_eq!(fabric.next_event_time(), Some(Picoseconds(NS + US + 3 * US)));
    settle(&mut fabric);
    let received = &fabric.device(DeviceId(1)).received;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].0, Picoseconds(NS + US + 3 * US));
    assert_eq!(fabric.statistics().reordered, 1);
}

// ---- statistics and determinism -------------------------------------------------------------

fn assert_near(what: &str, observed: u64, trials: u64, p: f64) {
    let mean = trials as f64 * p;
    let sigma = (trials as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (observed as f64 - mean).abs() <= 5.0 * sigma + 1.0,
        "{what}: {observed} of {trials}, expected {mean:.0} ± {:.0}",
        5.0 * sigma
    );
}

#[test]
fn fault_rates_match_the_plan_over_100000_frames() {
    const N: u32 = 100_000;
    let p = plan("loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,delay=0.01,seed=7");
    let mut fabric = faulty(p, 2);
    fabric.device_mut(DeviceId(1)).keep = false;
    stream(&mut fabric, N, Picoseconds(100 * NS), 128);
    settle(&mut fabric);
    let stats = fabric.statistics();
    let n = u64::from(N);
    assert_eq!(stats.sent, n);
    assert_near("dropped", stats.dropped, n, p.loss);
    let survived = n - stats.dropped;
    assert_near("duplicated", stats.duplicated, survived, p.duplicate);
    assert_near("reordered", stats.reordered, survived, p.reorder);
    assert_near("corrupted", stats.corrupted, survived, p.corrupt);
    assert_near("delayed", stats.delayed, survived, p.delay);
    assert_eq!(stats.delivered, survived + stats.duplicated);
    assert_eq!(fabric.device(DeviceId(1)).received_count, stats.delivered);
    assert_buffers_returned(&fabric);
    assert!(
        fabric.pool_allocations < 64,
        "steady state reuses buffers: {} allocated",
        fabric.pool_allocations
    );
}

/// What a run shows: statistics, capture, and what each port received when.
type Run = (FabricStatistics, Vec<CapturedFrame>, Vec<Vec<(Picoseconds, Vec<u8>)>>);

/// Three ports, two of them talking to an echoing third, everything going wrong.
fn busy_run(seed: u64) -> Run {
    let mut fabric = faulty(
        plan(&format!(
            "loss=0.1,dup=0.1,reorder=0.1,corrupt=0.1,delay=0.1,max_delay=500ns,seed={seed}"
        )),
        3,
    );
    fabric.set_capture(true);
    fabric.device_mut(DeviceId(2)).echo = Some(Picoseconds(30 * NS));
    for i in 0..300u32 {
        let from = (i % 2) as u8;
        fabric
            .device_mut(DeviceId(from as usize))
            .send_at(Picoseconds(u64::from(i / 2) * 40 * NS), frame(mac(2), mac(from), i, 80));
    }
    settle(&mut fabric);
    let received = (0..3).map(|i| fabric.device(DeviceId(i)).received.clone()).collect();
    (fabric.statistics(), fabric.take_capture(), received)
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let first = busy_run(7);
    let second = busy_run(7);
    assert_eq!(first.0, second.0, "statistics");
    assert_eq!(first.1, second.1, "capture");
    assert_eq!(first.2, second.2, "what each port received, when");
    assert!(first.1.len() > 300, "echoes are captured too");

    let other = busy_run(8);
    assert_ne!(first.0, other.0, "statistics");
    assert_ne!(first.2, other.2, "what each port received");
}

#[test]
fn set_faults_breaks_and_mends_the_wire() {
    let mut fabric = fabric_with(FabricConfig::default(), 2);
    stream(&mut fabric, 30, Picoseconds(US), 64);
    fabric.advance_to(Picoseconds(10 * US + 500 * NS));
    fabric.set_faults(plan("loss=1"));
    fabric.advance_to(Picoseconds(20 * US + 500 * NS));
    fabric.set_faults(FaultPlan::none());
    settle(&mut fabric);
    // Frames 0..=9 left before the break, 10..=19 during it.
    let expected: Vec<u32> = (0..10).chain(20..30).collect();
    assert_eq!(fabric.device(DeviceId(1)).received_sequences(), expected);
    assert_eq!(fabric.statistics().dropped, 10);
}

// ---- the fault plan's text form ----------------------------------------------------------

#[test]
fn fault_plan_parses_every_key() {
    let p = plan("loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,delay=0.01,seed=7");
    assert_eq!(
        p,
        FaultPlan {
            loss: 0.05,
            duplicate: 0.01,
            reorder: 0.01,
            corrupt: 0.001,
            delay: 0.01,
            seed: 7,
            ..FaultPlan::none()
        }
    );
    let p = plan(" duplicate = 1 , max_delay=250ns, reorder_window=8, seed=0x10 ");
    assert_eq!(
        (p.duplicate, p.max_delay, p.reorder_window, p.seed),
        (1.0, Picoseconds(250 * NS), 8, 16)
    );
    assert_eq!(plan("max_delay=7").max_delay, Picoseconds(7));
    assert_eq!(plan("max_delay=2ms").max_delay, Picoseconds::from_millis(2));
    assert_eq!(plan("max_delay=3µs").max_delay, Picoseconds::from_micros(3));
    assert_eq!(plan(""), FaultPlan::none());
    assert_eq!(plan("none"), FaultPlan::none());
    assert!(FaultPlan::none().is_none());
    assert!(!plan("corrupt=0.5").is_none());
    assert_eq!("loss=1".parse::<FaultPlan>().unwrap().loss, 1.0);
}

#[test]
fn fault_plan_errors_name_what_is_wrong() {
    let cases: &[(&str, FaultPlanError, &str)] = &[
        (
            "loss=0.05,jitter=1",
            FaultPlanError::UnknownKey { key: "jitter".into() },
            "jitter",
        ),
        (
            "loss=abc",
            FaultPlanError::BadNumber {
                key: "loss".into(),
                value: "abc".into(),
            },
            "loss",
        ),
        (
            "dup=1.5",
            FaultPlanError::OutOfRange {
                key: "dup".into(),
                value: "1.5".into(),
            },
            "dup",
        ),
        (
            "corrupt=-0.1",
            FaultPlanError::OutOfRange {
                key: "corrupt".into(),
                value: "-0.1".into(),
            },
            "corrupt",
        ),
        (
            "delay=NaN",
            FaultPlanError::OutOfRange {
                key: "delay".into(),
                value: "NaN".into(),
            },
            "delay",
        ),
        (
            "reorder",
            FaultPlanError::MissingValue { item: "reorder".into() },
            "reorder",
        ),
        (
            "loss=0.1,loss=0.2",
            FaultPlanError::DuplicateKey { key: "loss".into() },
            "loss",
        ),
        (
            "seed=-1",
            FaultPlanError::BadNumber {
                key: "seed".into(),
                value: "-1".into(),
            },
            "seed",
        ),
        (
            "max_delay=5 fortnights",
            FaultPlanError::BadNumber {
                key: "max_delay".into(),
                value: "5 fortnights".into(),
            },
            "max_delay",
        ),
        (
            "window=3.5",
            FaultPlanError::BadNumber {
                key: "window".into(),
                value: "3.5".into(),
            },
            "window",
        ),
    ];
    for (spec, error, named) in cases {
        let got = FaultPlan::parse(spec).unwrap_err();
        assert_eq!(&got, error, "{spec}");
        assert!(got.to_string().contains(named), "{spec}: `{got}` names {named}");
    }
}

#[test]
fn fault_plan_display_round_trips_through_parse() {
    assert_eq!(
        FaultPlan::none().to_string(),
        "loss=0,dup=0,reorder=0,corrupt=0,delay=0,max_delay=10us,window=3,seed=0"
    );
    let plans = [
        FaultPlan::none(),
        plan("loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,delay=0.01,seed=7"),
        FaultPlan {
            loss: 0.1 + 0.2,
            duplicate: 1e-9,
            reorder: 1.0,
            corrupt: f64::MIN_POSITIVE,
            delay: 0.999_999_999_999,
            max_delay: Picoseconds(1_234_567),
            reorder_window: 0,
            seed: u64::MAX,
        },
        FaultPlan {
            max_delay: Picoseconds::from_millis(3),
            reorder_window: u32::MAX,
            ..FaultPlan::none()
        },
    ];
    for p in plans {
        let text = p.to_string();
        assert_eq!(FaultPlan::parse(&text), Ok(p), "{text}");
    }
}

// ---- the clock ------------------------------------------------------------------------------

#[test]
fn advance_to_never_runs_a_device_past_t() {
    let mut fabric = fabric_with(FabricConfig::default(), 3);
    let port = fabric.device_mut(DeviceId(0));
    port.send_at(Picoseconds(10 * NS), frame(mac(1), mac(0), 0, 64));
    port.send_at(Picoseconds(2 * US), frame(mac(2), mac(0), 1, 64));
    port.send_at(Picoseconds(5 * US), frame(mac(1), mac(0), 2, 64));
    let t = Picoseconds(3 * US);
    fabric.advance_to(t);
    assert_eq!(fabric.now(), t);
    for i in 0..3 {
        let port = fabric.device(DeviceId(i));
        assert_eq!(port.now, t, "port {i} is at t");
        assert!(port.advances.iter().all(|a| *a <= t), "port {i} never past t");
        assert!(port.advances.windows(2).all(|w| w[0] <= w[1]), "in time order");
    }
    // Due at or before t: the frames of 10 ns and 2 µs (it arrives exactly at t).
    assert_eq!(fabric.device(DeviceId(1)).received_sequences(), vec![0]);
    assert_eq!(
        fabric.device(DeviceId(2)).received,
        vec![(t, frame(mac(2), mac(0), 1, 64))]
    );
    assert_eq!(fabric.device(DeviceId(0)).script.len(), 1, "5 µs frame not sent yet");
    assert_eq!(fabric.next_event_time(), Some(Picoseconds(5 * US)));

    // Time never goes back (the fake ports assert it).
    fabric.advance_to(Picoseconds(US));
    assert_eq!(fabric.now(), t);
    assert_eq!(fabric.run_until_idle(Picoseconds(5 * US)), Picoseconds(5 * US));
    assert_eq!(fabric.frames_in_flight(), 1);
    assert_eq!(fabric.run_until_idle(Picoseconds(u64::MAX)), Picoseconds(6 * US));
}

/// Port 0 streams to an echoing port 1 through every fault that holds or delays frames.
fn echoing_run() -> Fabric<FakePort> {
    let mut fabric = faulty(plan("dup=0.1,reorder=0.2,delay=0.3,max_delay=3us,loss=0.05,seed=5"), 2);
    fabric.device_mut(DeviceId(1)).echo = Some(Picoseconds(300 * NS));
    stream(&mut fabric, 60, Picoseconds(700 * NS), 64);
    fabric
}

#[test]
fn running_on_until_the_host_has_something_to_see_takes_the_steps_a_step_at_a_time_takes() {
    let limit = Picoseconds(2 * US);
    let end = Picoseconds(80 * US);
    // The host wakes when port 0 has received something (an echo) or at the end.
    let echoes = |fabric: &Fabric<FakePort>| fabric.device(DeviceId(0)).received_count;

    // A step at a time, the host looking after each.
    let mut stepped = echoing_run();
    let (mut steps, mut wakes, mut seen) = (0u64, Vec::new(), 0);
    while stepped.now() <= end {
        stepped.advance_to_next_event(limit);
        steps += 1;
        if echoes(&stepped) != seen {
            seen = echoes(&stepped);
            wakes.push((stepped.now(), seen, stepped.next_event_time()));
        }
    }

    // The fabric running on by itself until then.
    let mut run_on = echoing_run();
    let (mut steps_on, mut wakes_on, mut seen) = (0u64, Vec::new(), 0);
    let mut calls = 0;
    while run_on.now() <= end {
        steps_on += run_on.advance_to_next_event_until(limit, |fabric| echoes(fabric) != seen || fabric.now() > end);
        calls += 1;
        if echoes(&run_on) != seen {
            seen = echoes(&run_on);
            wakes_on.push((run_on.now(), seen, run_on.next_event_time()));
        }
    }

    assert_eq!(wakes_on, wakes, "the host wakes at the same instants to the same news");
    assert_eq!(steps_on, steps, "the same steps");
    for id in [DeviceId(0), DeviceId(1)] {
        let (a, b) = (stepped.device(id), run_on.device(id));
        assert_eq!(b.advances, a.advances, "{id} is moved to the same instants");
        assert_eq!(
            b.received, a.received,
            "{id} receives the same frames at the same times"
        );
    }
    assert_eq!(run_on.statistics(), stepped.statistics());
    assert_eq!(run_on.now(), stepped.now());
    let stats = stepped.statistics();
    assert!(
        stats.reordered > 0 && stats.delayed > 0 && stats.duplicated > 0 && stats.dropped > 0,
        "every fault that moves an arrival happened: {stats:?}"
    );
    assert!(wakes.len() > 20, "the host had news {} times", wakes.len());
    assert!(calls < steps / 2, "{calls} returns to the host for {steps} steps");
}

fn real_device(last_mac_byte: u8) -> Device {
    Device::new(
        DeviceConfig::with_mac(mac(last_mac_byte)),
        Arc::new(PagedMemory::new()),
        Box::new(RecordingSink::new()),
    )
}

#[test]
fn real_devices_share_the_fabric_clock() {
    let mut fabric = Fabric::new(FabricConfig::default());
    let a = fabric.add_device(real_device(1));
    let b = fabric.add_device(real_device(2));
    assert_eq!(fabric.devices(), 2);
    assert_eq!(fabric.device(b).config().mac_address, mac(2));
    let t = Picoseconds(7 * US);
    fabric.advance_to(t);
    assert_eq!((fabric.device(a).now(), fabric.device(b).now()), (t, t));
    assert_eq!(fabric.run_until_idle(Picoseconds(u64::MAX)), t, "nothing to do");

    // A device that ran ahead on its own brings the fabric to its time.
    let mut ahead = real_device(3);
    ahead.advance_to(Picoseconds(20 * US));
    let c = fabric.add_device(ahead);
    assert_eq!(fabric.now(), Picoseconds(20 * US));
    for id in [a, b, c] {
        assert_eq!(fabric.device_mut(id).now(), Picoseconds(20 * US));
    }
    // One behind is brought forward.
    let d = fabric.add_device(real_device(4));
    assert_eq!(fabric.device(d).now(), Picoseconds(20 * US));
    assert_eq!(fabric.statistics(), FabricStatistics::default());
}

#[test]
fn skipping_draws_leaves_the_generator_where_drawing_them_does() {
    for draws in [0u64, 1, 9, 1000] {
        let mut skipped = FaultRng::new(7);
        let mut drawn = FaultRng::new(7);
        skipped.skip(draws);
        for _ in 0..draws {
            drawn.next_u64();
        }
        assert_eq!(skipped.next_u64(), drawn.next_u64(), "after {draws} draws");
    }
}

#[test]
fn a_plan_without_faults_harms_no_frame_and_moves_the_generator_nine_draws() {
    let mut rng = FaultRng::new(42);
    let mut reference = FaultRng::new(42);
    for _ in 0..100 {
        let fate = FaultPlan::none().decide(&mut rng);
        assert!(!(fate.lost || fate.duplicated || fate.reordered || fate.corrupted || fate.delayed));
        for _ in 0..9 {
            reference.next_u64();
        }
    }
    assert_eq!(rng.next_u64(), reference.next_u64());
    // A plan with faults draws the same nine per frame.
    let faulty = FaultPlan::parse("loss=0.5,seed=3").unwrap();
    let mut rng = FaultRng::new(3);
    let mut reference = FaultRng::new(3);
    faulty.decide(&mut rng);
    reference.skip(9);
    assert_eq!(rng.next_u64(), reference.next_u64());
}

// ---- checksum offload ---------------------------------------------------------------------

/// A RoCEv2 RDMA WRITE ONLY from port 0 to port 1 with `payload`, emitted as a device
/// emits it: its ICRC left out (zero).
fn offloaded_write(payload: &[u8]) -> Vec<u8> {
    use crate::wire::{opcode::BthOpcode, BthRepr, EthernetRepr, IpRepr, Ipv4Repr, RethRepr, RoceRepr};
    let mut repr = RoceRepr::new(
        EthernetRepr {
            destination: mac(1),
            source: mac(0),
            vlan: None,
            ethertype: 0x0800,
        },
        IpRepr::V4(Ipv4Repr {
            source: [10, 0, 0, 1],
            destination: [10, 0, 0, 2],
            dscp: 0,
            ecn: 0,
            ttl: 64,
            identification: 7,
            dont_fragment: true,
        }),
        0xC000,
        BthRepr::new(BthOpcode::RC_RDMA_WRITE_ONLY, 0x11, 5),
    );
    repr.reth = Some(RethRepr {
        virtual_address: 0x1000,
        rkey: 0x100,
        dma_length: payload.len() as u32,
    });
    let mut frame = Vec::new();
    wire::emit_frame_offloaded(&repr, payload.len(), &mut frame, |out| out.copy_from_slice(payload));
    frame
}

/// The ICRC of an IPv4 RoCEv2 frame as the specification defines it, computed here with
/// crc32fast and nothing of the model's: the dummy LRH of ones, then the IP packet up to
/// the ICRC with TOS, TTL, header checksum, UDP checksum and BTH byte 4 set to ones.
fn independent_icrc(frame: &[u8]) -> [u8; 4] {
    let mut packet = frame[14..frame.len() - 4].to_vec();
    for offset in [1, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4] {
        packet[offset] = 0xFF;
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[0xFF; 8]);
    hasher.update(&packet);
    hasher.finalize().to_le_bytes()
}

fn offloading_pair(plan: FaultPlan) -> Fabric<FakePort> {
    let mut fabric = faulty(plan, 2);
    fabric.device_mut(DeviceId(0)).offload = true;
    fabric
}

#[test]
fn an_offloaded_frame_on_a_clean_link_is_delivered_as_it_was_and_trusted() {
    let mut fabric = offloading_pair(FaultPlan::none());
    let sent = offloaded_write(&[0x5A; 64]);
    fabric.device_mut(DeviceId(0)).send_at(Picoseconds(NS), sent.clone());
    settle(&mut fabric);
    let receiver = fabric.device(DeviceId(1));
    assert_eq!(receiver.received_icrc, [Icrc::Offloaded]);
    // No CRC was computed on the way: the ICRC field is still the emitter's zeros.
    assert_eq!(receiver.received[0].1, sent);
    assert_eq!(sent[sent.len() - 4..], [0; 4]);
    assert!(wire::parse_frame_offloaded(&sent).is_ok());
    assert!(matches!(wire::parse_frame(&sent), Err(wire::WireError::BadIcrc { .. })));
}

#[test]
fn a_captured_offloaded_frame_carries_its_exact_icrc() {
    let mut fabric = offloading_pair(FaultPlan::none());
    fabric.set_capture(true);
    let payload: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
    fabric
        .device_mut(DeviceId(0))
        .send_at(Picoseconds(NS), offloaded_write(&payload));
    settle(&mut fabric);
    let capture = fabric.take_capture();
    assert_eq!(capture.len(), 1);
    let bytes = &capture[0].bytes;
    let icrc = &bytes[bytes.len() - 4..];
    assert_eq!(icrc, independent_icrc(bytes), "the specification's CRC");
    let parsed = wire::parse_frame(bytes).expect("the model's own check passes");
    assert_eq!(parsed.payload, payload);
    // The receiver gets the same bytes, with the ICRC to check.
    let receiver = fabric.device(DeviceId(1));
    assert_eq!(receiver.received_icrc, [Icrc::Computed]);
    assert_eq!(&receiver.received[0].1, bytes);
}

#[test]
fn a_frame_the_fault_plan_corrupts_gets_its_icrc_first_and_the_receiver_checks_it() {
    let mut fabric = offloading_pair(plan("corrupt=1,seed=3"));
    let sent: Vec<Vec<u8>> = (0..50u8).map(|i| offloaded_write(&[i; 32])).collect();
    for (i, frame) in sent.iter().enumerate() {
        fabric
            .device_mut(DeviceId(0))
            .send_at(Picoseconds(NS * (i as u64 + 1)), frame.clone());
    }
    settle(&mut fabric);
    assert_eq!(fabric.statistics().corrupted, 50);
    let receiver = fabric.device(DeviceId(1));
    assert_eq!(receiver.received_icrc, vec![Icrc::Computed; 50]);
    for ((_, got), offloaded) in receiver.received.iter().zip(&sent) {
        // The damage is caught: by the ICRC, or earlier by a header check.
        assert!(wire::parse_frame(got).is_err(), "a corrupted frame must not parse");
        // Undoing the one flipped byte gives the original frame with its exact ICRC.
        let mut repaired = offloaded.clone();
        assert!(wire::fill_icrc(&mut repaired));
        let differing = got.iter().zip(&repaired).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 1);
    }
}

#[test]
fn duplicated_copies_of_an_offloaded_frame_carry_their_icrc() {
    let mut fabric = offloading_pair(plan("duplicate=1,seed=5"));
    let sent = offloaded_write(&[1, 2, 3, 4]);
    fabric.device_mut(DeviceId(0)).send_at(Picoseconds(NS), sent);
    settle(&mut fabric);
    let receiver = fabric.device(DeviceId(1));
    assert_eq!(receiver.received.len(), 2);
    for (_, frame) in &receiver.received {
        assert_eq!(frame[frame.len() - 4..], independent_icrc(frame));
    }
    assert_eq!(receiver.received_icrc, [Icrc::Computed]);
}

#[test]
fn a_port_without_offload_gets_offloaded_frames_with_their_icrc() {
    // The default `receive_frame_offloaded` fills the ICRC in for ports that check.
    #[derive(Default)]
    struct Checking(Vec<Vec<u8>>);
    impl Port for Checking {
        fn mac_address(&self) -> [u8; 6] {
            mac(9)
        }
        fn now(&self) -> Picoseconds {
            Picoseconds::ZERO
        }
        fn next_event_time(&self) -> Option<Picoseconds> {
            None
        }
        fn advance_to(&mut self, _: Picoseconds) {}
        fn poll_transmit(&mut self) -> Option<Vec<u8>> {
            None
        }
        fn receive_frame(&mut self, frame: &[u8]) {
            self.0.push(frame.to_vec());
        }
        fn recycle_frame(&mut self, _: Vec<u8>) {}
    }
    let mut port = Checking::default();
    let frame = offloaded_write(&[9; 12]);
    port.receive_frame_offloaded(frame, Icrc::Offloaded);
    assert!(wire::parse_frame(&port.0[0]).is_ok());
}
