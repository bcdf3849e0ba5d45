//! Fuzzes `wire::parse_frame`: it must never panic, and every frame it accepts must
//! re-emit to a frame that parses back to the same headers and payload.
//!
//! Random bytes rarely carry a valid ICRC, so each input is also tried "sealed": with its
//! IPv4 header checksum and ICRC recomputed where the headers say they are, which lets the
//! fuzzer reach the transport-header checks behind the ICRC.

use rnic_hw_model::wire::{emit_frame, frame_length, parse_frame};

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

/// Runs one input: the bytes as they are, then sealed.
pub fn run(data: &[u8]) {
    check(data);
    let mut sealed = data.to_vec();
    super::seal(&mut sealed);
    check(&sealed);
}
