//! Fuzzes `wire::parse_frame`: it must never panic, and every frame it accepts must
//! re-emit to a frame that parses back to the same headers and payload.
//!
//! Random bytes rarely carry a valid ICRC, so each input is also tried "sealed": with its
//! IPv4 header checksum and ICRC recomputed where the headers say they are, which lets the
//! fuzzer reach the transport-header checks behind the ICRC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rnic_hw_model::wire::{emit_frame, frame_length, icrc, ipv4, parse_frame};

fn check(data: &[u8]) {
    let Ok(parsed) = parse_frame(data) else {
        return;
    };
    // A parsed repr is always consistent, so emitting it must not trip the debug assertion.
    assert_eq!(parsed.repr.check(parsed.payload.len()), Ok(()));
    let mut out = Vec::with_capacity(data.len());
    emit_frame(&parsed.repr, parsed.payload, &mut out);
    assert_eq!(out.len(), frame_length(&parsed.repr, parsed.payload.len()));
    assert!(out.len() <= data.len(), "re-emitted frame longer than the input");
    let again = parse_frame(&out).expect("a re-emitted frame must parse");
    assert_eq!(again.repr, parsed.repr);
    assert_eq!(again.payload, parsed.payload);
}

/// Recomputes the IPv4 header checksum and the ICRC in place, trusting the length fields
/// as far as they fit. Leaves the frame alone where they do not.
fn seal(frame: &mut [u8]) {
    let mut ip = 14;
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        ip += 4;
    }
    let Some(&first) = frame.get(ip) else { return };
    let ip_len = if first >> 4 == 6 {
        40
    } else {
        let ihl = usize::from(first & 0x0F) * 4;
        if ihl < 20 || frame.len() < ip + ihl {
            return;
        }
        frame[ip + 10] = 0;
        frame[ip + 11] = 0;
        let sum = ipv4::checksum(&frame[ip..ip + ihl]);
        frame[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        ihl
    };
    let udp = ip + ip_len;
    let Some(length) = frame.get(udp + 4..udp + 6) else {
        return;
    };
    let end = udp + usize::from(u16::from_be_bytes([length[0], length[1]]));
    if end < udp + 12 || end > frame.len() {
        return;
    }
    let value = icrc::icrc(&frame[ip..end - 4]);
    frame[end - 4..end].copy_from_slice(&icrc::to_wire(value));
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut sealed = data.to_vec();
    seal(&mut sealed);
    check(&sealed);
});
