//! The floor under the embedded data path: what moving an RDMA WRITE through materialised
//! RoCEv2 frames costs when nothing else is modelled.
//!
//! The device model turns a 64 KiB WRITE into 16 frames of 4 KiB. Each is gathered from
//! the source buffer into a frame (headers, payload, ICRC), checked by the receiver
//! (headers, ICRC) and scattered into the destination buffer, and one ACK frame comes
//! back. This bench does exactly that work with the model's own `wire` code and nothing
//! else: no WQE, no context, no translation, no access check, no timing, no scheduler.
//! Whatever the model costs on top is overhead; what this costs is the floor for any
//! design that puts every payload byte into a frame and checks every ICRC.
//!
//! Printed side by side, in one run, medians of alternating rounds:
//! - `memcpy`: one copy of a 64 KiB buffer into another (the goal's yardstick);
//! - `two copies`: 64 KiB through a 4 KiB frame buffer, in and out, no headers or ICRC;
//! - `two CRC-32 passes`: the sender's ICRC and the receiver's check over 64 KiB, and the
//!   bound the copies and the CRCs alone set (their times added);
//! - `frames`: the full floor above, for 64 KiB and for 8-byte messages, and for 64 KiB the
//!   simulation speed a model doing only this work would reach at 100 Gb/s.
//!
//! Run: `cargo bench -p rnic-hw-model --bench frame_floor`.

use std::hint::black_box;
use std::time::Instant;

use rnic_hw_model::wire::ethernet::ETHERTYPE_IPV4;
use rnic_hw_model::wire::{
    emit_frame_overwriting, frame_length, parse_frame, AethRepr, BthOpcode, BthRepr, EthernetRepr, IpRepr, Ipv4Repr,
    RethRepr, RoceRepr,
};

const MESSAGE: usize = 64 << 10;
const MTU: usize = 4096;
const ROUNDS: usize = 7;
/// The link rate of the simulation-speed goal, bits per second.
const LINK_BITS_PER_SECOND: f64 = 100e9;
/// What a frame occupies on the wire besides the bytes emitted: FCS, preamble and start
/// delimiter, inter-frame gap.
const WIRE_OVERHEAD_BYTES: usize = 4 + 8 + 12;

fn base_repr(bth: BthRepr) -> RoceRepr {
    let ethernet = EthernetRepr {
        destination: [2, 0x52, 0x4e, 0x49, 0x43, 0xB0],
        source: [2, 0x52, 0x4e, 0x49, 0x43, 0xA0],
        vlan: None,
        ethertype: ETHERTYPE_IPV4,
    };
    let ip = IpRepr::V4(Ipv4Repr {
        source: [10, 0, 0, 1],
        destination: [10, 0, 0, 2],
        dscp: 0,
        ecn: 2,
        ttl: 64,
        identification: 0,
        dont_fragment: true,
    });
    RoceRepr::new(ethernet, ip, 0xc0de, bth)
}

/// The request frames of one WRITE of `length` bytes at PSN `psn`: opcode and headers per
/// position, as the requester sends them.
fn write_reprs(length: usize, psn: u32) -> Vec<(RoceRepr, usize)> {
    let packets = length.div_ceil(MTU).max(1);
    (0..packets)
        .map(|i| {
            let opcode = match (packets, i) {
                (1, _) => BthOpcode::RC_RDMA_WRITE_ONLY,
                (_, 0) => BthOpcode::RC_RDMA_WRITE_FIRST,
                (n, i) if i + 1 == n => BthOpcode::RC_RDMA_WRITE_LAST,
                _ => BthOpcode::RC_RDMA_WRITE_MIDDLE,
            };
            let last = i + 1 == packets;
            let bth = BthRepr {
                ack_request: last,
                ..BthRepr::new(opcode, 0x11, psn.wrapping_add(i as u32) & 0xFF_FFFF)
            };
            let mut repr = base_repr(bth);
            if i == 0 {
                repr.reth = Some(RethRepr {
                    virtual_address: 0x1000,
                    rkey: 0xabcd,
                    dma_length: length as u32,
                });
            }
            let payload = (length - i * MTU).min(MTU);
            (repr, payload)
        })
        .collect()
}

fn ack_repr(psn: u32) -> RoceRepr {
    let mut repr = base_repr(BthRepr::new(BthOpcode::RC_ACKNOWLEDGE, 0x12, psn));
    repr.aeth = Some(AethRepr::ack(0x1F, 1));
    repr
}

/// Sends `source` to `destination` as the frames of `reprs`, and an ACK back: emit with
/// ICRC, parse with the ICRC check, scatter. Returns the bytes placed.
fn move_through_frames(
    reprs: &[(RoceRepr, usize)],
    ack: &RoceRepr,
    source: &[u8],
    destination: &mut [u8],
    frame: &mut Vec<u8>,
) -> usize {
    let mut offset = 0;
    for (repr, payload) in reprs {
        let piece = &source[offset..offset + payload];
        emit_frame_overwriting(repr, *payload, frame, |out| out.copy_from_slice(piece));
        let parsed = parse_frame(frame).expect("the floor's own frame parses");
        destination[offset..offset + payload].copy_from_slice(parsed.payload);
        offset += payload;
    }
    emit_frame_overwriting(ack, 0, frame, |_| {});
    let parsed = parse_frame(frame).expect("the floor's own ACK parses");
    black_box(parsed.repr.bth.psn);
    offset
}

/// Seconds the data frames (not the ACK, which travels the other way) of `reprs` occupy a
/// 100 Gb/s link.
fn wire_seconds(reprs: &[(RoceRepr, usize)]) -> f64 {
    let bytes: usize = reprs
        .iter()
        .map(|(repr, payload)| frame_length(repr, *payload) + WIRE_OVERHEAD_BYTES)
        .sum();
    bytes as f64 * 8.0 / LINK_BITS_PER_SECOND
}

/// Seconds per call of `work`, measured over `calls` calls.
fn seconds_per_call(calls: usize, mut work: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        work();
    }
    start.elapsed().as_secs_f64() / calls as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let source: Vec<u8> = (0..MESSAGE).map(|i| (i * 7 + 3) as u8).collect();
    let mut destination = vec![0u8; MESSAGE];
    let mut frame = Vec::with_capacity(MTU + 128);
    let mut bounce = vec![0u8; MTU];
    let large = write_reprs(MESSAGE, 0);
    let small = write_reprs(8, 0);
    let ack = ack_repr(0);

    // Warm every buffer and check the floor does move the bytes.
    assert_eq!(
        move_through_frames(&large, &ack, &source, &mut destination, &mut frame),
        MESSAGE
    );
    assert_eq!(source, destination);

    let calls = 20_000;
    let small_calls = 2_000_000;
    let (mut memcpy, mut copies, mut crcs, mut frames, mut tiny) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        memcpy.push(seconds_per_call(calls, || {
            destination.copy_from_slice(black_box(&source));
            black_box(&mut destination);
        }));
        copies.push(seconds_per_call(calls, || {
            for (i, chunk) in source.chunks(MTU).enumerate() {
                bounce[..chunk.len()].copy_from_slice(black_box(chunk));
                destination[i * MTU..i * MTU + chunk.len()].copy_from_slice(black_box(&bounce[..chunk.len()]));
            }
            black_box(&mut destination);
        }));
        crcs.push(seconds_per_call(calls, || {
            // The sender's ICRC and the receiver's check: two CRC-32 passes per byte.
            for chunk in source.chunks(MTU) {
                black_box(crc32fast::hash(black_box(chunk)));
                black_box(crc32fast::hash(black_box(chunk)));
            }
        }));
        frames.push(seconds_per_call(calls, || {
            black_box(move_through_frames(
                &large,
                &ack,
                black_box(&source),
                &mut destination,
                &mut frame,
            ));
        }));
        tiny.push(seconds_per_call(small_calls, || {
            black_box(move_through_frames(
                &small,
                &ack,
                black_box(&source[..8]),
                &mut destination[..8],
                &mut frame,
            ));
        }));
    }
    let gigabytes = |seconds: f64| MESSAGE as f64 / seconds / 1e9;
    let memcpy = gigabytes(median(memcpy));
    let copies = gigabytes(median(copies));
    let crcs = gigabytes(median(crcs));
    let frame_seconds = median(frames);
    let frames = gigabytes(frame_seconds);
    // With the copies and the two CRC passes as the only costs, their times add up.
    let bound = 1.0 / (1.0 / copies + 1.0 / crcs);
    let tiny = 1.0 / median(tiny) / 1e6;
    println!("frame_floor: medians of {ROUNDS} alternating rounds");
    println!("  memcpy, 64 KiB buffers:                    {memcpy:8.2} GB/s   ratio 1.000");
    println!(
        "  two copies through a 4 KiB frame buffer:   {copies:8.2} GB/s   ratio {:.3}",
        copies / memcpy
    );
    println!(
        "  two CRC-32 passes (crc32fast), 4 KiB each:  {crcs:8.2} GB/s   ratio {:.3}",
        crcs / memcpy
    );
    println!(
        "  bound from the copies and the CRCs alone:  {bound:8.2} GB/s   ratio {:.3}",
        bound / memcpy
    );
    println!(
        "  64 KiB WRITE as 16 frames + ACK (floor):   {frames:8.2} GB/s   ratio {:.3}",
        frames / memcpy
    );
    println!(
        "  simulated s per wall s at 100 Gb/s, 64 KiB WRITEs, with only this work: {:.3}",
        wire_seconds(&large) / frame_seconds
    );
    println!("  8-byte WRITE as 1 frame + ACK (floor):     {tiny:8.2} M messages/s");
}
