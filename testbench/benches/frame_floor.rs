//! The floor under the embedded data path, beside what it is made of.
//!
//! `rnic_testbench::frame_floor` moves a message through RoCEv2 frames with the model's
//! own `wire` code and nothing else (its documentation says what that includes); this
//! prints, side by side in one run, medians of alternating rounds:
//! - `memcpy`: one copy of a 64 KiB buffer into another (issue 19's yardstick);
//! - `two copies`: 64 KiB through a 4 KiB frame buffer, in and out, no headers or ICRC;
//! - `two CRC-32 passes`: the sender's ICRC and the receiver's check over 64 KiB, and the
//!   bound the copies and the CRCs alone set (their times added);
//! - `frames`: the floor for a 64 KiB WRITE and for an 8-byte WRITE, and for 64 KiB the
//!   simulation speed a model doing only this work would reach at 100 Gb/s.
//!
//! `rnic-bench --mode wall` measures the same floor for its own run and prints its message
//! rate over it. Run: `cargo bench -p rnic-testbench --bench frame_floor`.

use std::hint::black_box;
use std::time::Duration;

use rnic_testbench::frame_floor::{median, seconds_per_call, FloorMessage, FloorOperation};

const MESSAGE: usize = 64 << 10;
const MTU: usize = 4096;
const ROUNDS: usize = 7;
/// The link rate of the simulation-speed goal, bits per second.
const LINK_BITS_PER_SECOND: f64 = 100e9;

fn main() {
    let source: Vec<u8> = (0..MESSAGE).map(|i| (i * 7 + 3) as u8).collect();
    let mut destination = vec![0u8; MESSAGE];
    let mut frame = Vec::with_capacity(MTU + 128);
    let mut bounce = vec![0u8; MTU];
    let large = FloorMessage::new(FloorOperation::Write, MESSAGE, MTU);
    let small = FloorMessage::new(FloorOperation::Write, 8, MTU);

    // Warm every buffer and check the floor does move the bytes.
    assert_eq!(large.carry(&source, &mut destination, &mut frame), Ok(MESSAGE));
    assert_eq!(source, destination);
    let mut small_destination = [0u8; 8];

    let calls = 20_000;
    let small_calls = 2_000_000;
    let (mut memcpy, mut copies, mut crcs, mut frames, mut tiny) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        memcpy.push(seconds_per_call(calls, Duration::ZERO, || {
            destination.copy_from_slice(black_box(&source));
            black_box(&mut destination);
        }));
        copies.push(seconds_per_call(calls, Duration::ZERO, || {
            for (i, chunk) in source.chunks(MTU).enumerate() {
                bounce[..chunk.len()].copy_from_slice(black_box(chunk));
                destination[i * MTU..i * MTU + chunk.len()].copy_from_slice(black_box(&bounce[..chunk.len()]));
            }
            black_box(&mut destination);
        }));
        crcs.push(seconds_per_call(calls, Duration::ZERO, || {
            // The sender's ICRC and the receiver's check: two CRC-32 passes per byte.
            for chunk in source.chunks(MTU) {
                black_box(crc32fast::hash(black_box(chunk)));
                black_box(crc32fast::hash(black_box(chunk)));
            }
        }));
        frames.push(seconds_per_call(calls, Duration::ZERO, || {
            let _ = black_box(large.carry(black_box(&source), &mut destination, &mut frame));
        }));
        tiny.push(seconds_per_call(small_calls, Duration::ZERO, || {
            let _ = black_box(small.carry(black_box(&source[..8]), &mut small_destination, &mut frame));
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
        large.wire_seconds(LINK_BITS_PER_SECOND) / frame_seconds
    );
    println!("  8-byte WRITE as 1 frame + ACK (floor):     {tiny:8.2} M messages/s");
}
