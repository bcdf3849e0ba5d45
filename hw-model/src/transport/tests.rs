//! In-crate tests of the transport's receive side: what it does with frames that are not
//! for a live QP, and the timing model's serialisation (the port's buffer pool is tested
//! in `port/`). End-to-end behaviour (two NICs through the register interface and the
//! fabric) is tested in `testbench/tests/transport_*.rs`.

use std::sync::Arc;

use rnic_firmware_if::cmdq::GidType;

use super::*;
use crate::config::DeviceConfig;
use crate::device::Device;
use crate::interrupt::RecordingSink;
use crate::memory::PagedMemory;
use crate::port::GidTableEntry;
use crate::wire::{opcode::BthOpcode, BthRepr, EthernetRepr, IpRepr, Ipv4Repr, RethRepr, RoceRepr};

const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1];

fn device() -> Device {
    let mut device = Device::new(
        DeviceConfig::default(),
        Arc::new(PagedMemory::new()),
        Box::new(RecordingSink::new()),
    );
    assert!(device.transport.io.port.addresses_mut().set_gid(
        0,
        Some(GidTableEntry {
            gid: GID,
            gid_type: GidType::RoceV2Ipv4,
        })
    ));
    device
}

/// A well-formed RDMA WRITE ONLY to `qpn` of this device.
fn write_only(device: &Device, qpn: u32) -> Vec<u8> {
    let mut repr = RoceRepr::new(
        EthernetRepr {
            destination: device.config().mac_address,
            source: [2, 0, 0, 0, 0, 9],
            vlan: None,
            ethertype: 0x0800,
        },
        IpRepr::V4(Ipv4Repr {
            source: [10, 0, 0, 9],
            destination: [10, 0, 0, 1],
            dscp: 0,
            ecn: 0,
            ttl: 64,
            identification: 0,
            dont_fragment: true,
        }),
        0xC000,
        BthRepr::new(BthOpcode::RC_RDMA_WRITE_ONLY, qpn, 0),
    );
    repr.reth = Some(RethRepr {
        virtual_address: 0x1000,
        rkey: 0x100,
        dma_length: 4,
    });
    let mut frame = Vec::new();
    wire::emit_frame(&repr, b"data", &mut frame);
    frame
}

#[test]
fn garbage_is_dropped_counted_and_named() {
    let mut device = device();
    device.receive_frame(&[]);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    device.receive_frame(&[0xFF; 60]);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    let counters = device.transport_counters();
    assert_eq!(counters.frames_received, 2);
    assert_eq!(counters.frames_dropped, 2);
    let last = device.diagnostics().last().unwrap();
    assert_eq!(last.source, Source::Transport);
    assert!(last.expected.contains("well-formed RoCEv2"), "{last}");
}

#[test]
fn a_bad_icrc_is_counted_as_such() {
    let mut device = device();
    let mut frame = write_only(&device, 0x10);
    let last = frame.len() - 1;
    frame[last] ^= 1;
    device.receive_frame(&frame);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    assert_eq!(device.transport_counters().icrc_errors, 1);
    assert_eq!(device.diagnostics().last().unwrap().field, "ICRC");
}

#[test]
fn an_offloaded_frame_is_trusted_and_any_other_has_its_icrc_checked() {
    let mut device = device();
    // The frame with its ICRC field zero, as a device on the in-process link emits it.
    let mut frame = write_only(&device, 0x10);
    let at = frame.len() - wire::icrc::ICRC_LEN;
    frame[at..].fill(0);
    // Marked offloaded: trusted, it goes on to the transport's checks (no such QP).
    device.receive_frame_offloaded(frame.clone(), Icrc::Offloaded);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    assert_eq!(device.transport_counters().icrc_errors, 0);
    assert_eq!(device.diagnostics().last().unwrap().field, "BTH DestQP");
    // Marked computed, or from the network: checked and caught.
    device.receive_frame_offloaded(frame.clone(), Icrc::Computed);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    device.receive_frame(&frame);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    assert_eq!(device.transport_counters().icrc_errors, 2);
    assert_eq!(device.diagnostics().last().unwrap().field, "ICRC");
}

#[test]
fn frames_for_no_live_qp_or_another_address_are_dropped() {
    let mut device = device();
    let frame = write_only(&device, 0x10);
    device.receive_frame(&frame);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    assert_eq!(device.diagnostics().last().unwrap().field, "BTH DestQP");
    // Another destination MAC.
    let mut repaired = Vec::new();
    let parsed = wire::parse_frame(&frame).unwrap();
    let mut repr = parsed.repr;
    repr.ethernet.destination[5] ^= 0x40;
    wire::emit_frame(&repr, parsed.payload, &mut repaired);
    device.receive_frame(&repaired);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    assert_eq!(device.diagnostics().last().unwrap().field, "destination MAC");
    // Another destination IP.
    let mut repr = parsed.repr;
    if let IpRepr::V4(v4) = &mut repr.ip {
        v4.destination = [10, 0, 0, 2];
    }
    wire::emit_frame(&repr, parsed.payload, &mut repaired);
    device.receive_frame(&repaired);
    device.advance_to(device.now() + Picoseconds::from_micros(10));
    assert_eq!(device.diagnostics().last().unwrap().field, "destination IP");
    assert_eq!(device.transport_counters().frames_dropped, 3);
    assert_eq!(device.poll_transmit(), None, "nothing is answered");
}

#[test]
fn serialisation_follows_the_timing_model() {
    // (1000 + 8 preamble + 12 IFG + 4 FCS) bytes × 8 bits at 100 Gb/s = 81.92 ns.
    let params = crate::timing::TimingParams::hns_100g();
    assert_eq!(params.serialisation(1000), Picoseconds(81_920));
    assert_eq!(params.serialisation(0), Picoseconds(1_920));
}

/// Device with QP `qpn` in RTS (a zeroed QPC: producer and consumer index 0).
fn device_with_qp_in_rts(qpn: u32) -> Device {
    let mut device = device();
    modify(&mut device, qpn, QpState::Init, QpState::Rtr);
    modify(&mut device, qpn, QpState::Rtr, QpState::Rts);
    device
}

/// QP `qpn` changes state `from` → `to` (a zeroed QPC).
fn modify(device: &mut Device, qpn: u32, from: QpState, to: QpState) {
    device.transport.qp_modified(qpn, from, to, &Qpc::zeroed());
}

/// The requester's producer index of QP `qpn`, and whether the QP is on the port's ring.
fn producer_and_ring(device: &Device, qpn: u32) -> (u16, bool) {
    let runtime = device.transport.transport.qps.get(qpn).expect("the QP's runtime");
    (runtime.requester.producer, runtime.in_ring)
}

#[test]
fn a_doorbell_takes_effect_when_it_arrives_and_not_before() {
    let mut device = device_with_qp_in_rts(0x10);
    device.advance_to(Picoseconds(1_000_000));
    let (_, in_ring) = producer_and_ring(&device, 0x10);
    assert!(!in_ring, "nothing to send yet");
    device.transport.sq_doorbell(0x10, 1, None);
    let arrives = Picoseconds(1_000_000 + device.config().timing.doorbell_ps);
    device.advance_to(Picoseconds(arrives.0 - 1));
    assert_eq!(producer_and_ring(&device, 0x10), (0, false), "in flight");
    device.advance_to(arrives);
    assert_eq!(device.transport.transport.doorbells.len(), 0);
    assert_eq!(producer_and_ring(&device, 0x10).0, 1, "arrived");
}

#[test]
fn a_doorbell_for_a_qp_that_left_rts_or_was_recreated_in_flight_is_dropped() {
    // To ERR while the doorbell flies: the flush reads the QPC; the requester ignores it.
    let mut device = device_with_qp_in_rts(0x10);
    device.transport.sq_doorbell(0x10, 1, None);
    modify(&mut device, 0x10, QpState::Rts, QpState::Err);
    device.advance_to(Picoseconds(10_000_000));
    assert_eq!(producer_and_ring(&device, 0x10), (0, false));
    // Reset and brought back to RTS: a new requester, which read its index from the QPC.
    let mut device = device_with_qp_in_rts(0x10);
    device.transport.sq_doorbell(0x10, 1, None);
    modify(&mut device, 0x10, QpState::Rts, QpState::Reset);
    modify(&mut device, 0x10, QpState::Init, QpState::Rtr);
    modify(&mut device, 0x10, QpState::Rtr, QpState::Rts);
    device.advance_to(Picoseconds(10_000_000));
    assert_eq!(producer_and_ring(&device, 0x10).0, 0);
    // Destroyed: nothing to deliver to.
    let mut device = device_with_qp_in_rts(0x10);
    device.transport.sq_doorbell(0x10, 1, None);
    modify(&mut device, 0x10, QpState::Rts, QpState::Reset);
    device.advance_to(Picoseconds(10_000_000));
    assert!(device.transport.transport.qps.get(0x10).is_none());
    assert!(device.transport.transport.doorbells.is_empty());
}
