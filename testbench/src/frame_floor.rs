//! The frame floor: what moving a message through materialised RoCEv2 frames costs when
//! nothing else is modelled — the yardstick that message rates are measured against.
//!
//! The device model turns a message into frames of at most one MTU of payload. Each is
//! gathered from the source buffer into a frame (headers, payload, ICRC), checked by the
//! receiver (headers, ICRC) and its payload scattered into the destination buffer, and
//! one frame goes the other way (a WRITE's or SEND's ACK, a READ's request). This module
//! does exactly that with the model's own `wire` code and nothing else: no WQE, context,
//! translation, access check, timing or scheduler. Whatever the emulator costs on top is
//! its overhead; what this costs is the floor of any design that puts every payload byte
//! into a frame and checks every ICRC. (The in-process link of the embedded fabric leaves
//! the ICRC out, so the emulator is not held to the CRC part of this floor; the floor is
//! kept as issue 19 defines its yardstick.)
//!
//! The buffers are one message's, hot in the caches: the floor of the frame work, not of
//! the memory system (the memcpy yardstick beside it in `rnic-bench`'s table covers the
//! run's buffers). Frames carry IPv4 headers.
//!
//! `rnic-bench --mode wall` measures it for the run's operation, size and MTU before and
//! after the traffic and prints the message rate over the faster of the two
//! ([`frame_floor_rate`]);
//! `cargo bench -p rnic-testbench --bench frame_floor` prints it beside memcpy, plain
//! copies and CRC passes.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rnic_hw_model::wire::ethernet::ETHERTYPE_IPV4;
use rnic_hw_model::wire::{
    emit_frame_overwriting, frame_length, parse_frame, AethRepr, BthOpcode, BthRepr, EthernetRepr, IpRepr, Ipv4Repr,
    RethRepr, RoceRepr, WireError,
};

/// Bytes a frame occupies on an Ethernet wire besides the bytes emitted: FCS, preamble and
/// start delimiter, inter-frame gap.
pub const WIRE_OVERHEAD_BYTES: usize = 4 + 8 + 12;

/// Least wall time of one round of [`frame_floor_rate`] in `rnic-bench`.
pub const FLOOR_ROUND: Duration = Duration::from_millis(2);

/// Why the floor could not move a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameFloorError {
    /// The source or destination is not the message's length.
    #[error("buffers of {source_length} and {destination_length} bytes for a message of {message} bytes")]
    BufferLength {
        /// Bytes of the source buffer.
        source_length: usize,
        /// Bytes of the destination buffer.
        destination_length: usize,
        /// Bytes of the message.
        message: usize,
    },
    /// A frame the floor emitted did not parse back (a defect of the wire code).
    #[error("frame {index} of the message does not parse: {error}")]
    Parse {
        /// Position of the frame in the message (the reply is last).
        index: usize,
        /// What the parser said.
        error: WireError,
    },
}

/// Which message the floor moves: the frames differ in their headers and in which way the
/// data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorOperation {
    /// RDMA WRITE: RETH on the first frame, an ACK back.
    Write,
    /// SEND: no extension header, an ACK back.
    Send,
    /// RDMA READ: a request with RETH one way, the responses (AETH on the first and the
    /// last) the other.
    Read,
}

/// The frames of one message as the floor moves them.
#[derive(Debug, Clone)]
pub struct FloorMessage {
    /// Bytes of the message.
    length: usize,
    /// The frames that carry the data, in order: headers and payload bytes.
    data: Vec<(RoceRepr, usize)>,
    /// The frame that goes the other way: the ACK, or the READ request.
    reply: RoceRepr,
}

impl FloorMessage {
    /// The frames of a message of `length` bytes at an MTU of `mtu` bytes (at least one
    /// frame, empty for a zero-length message).
    pub fn new(operation: FloorOperation, length: usize, mtu: usize) -> Self {
        let mtu = mtu.max(1);
        let packets = length.div_ceil(mtu).max(1);
        let data = (0..packets)
            .map(|index| {
                let first = index == 0;
                let last = index + 1 == packets;
                let opcode = data_opcode(operation, first, last);
                let bth = BthRepr {
                    ack_request: operation != FloorOperation::Read && last,
                    ..BthRepr::new(opcode, 0x11, index as u32 & 0xFF_FFFF)
                };
                let mut repr = base_repr(bth);
                match operation {
                    FloorOperation::Write if first => repr.reth = Some(reth(length)),
                    FloorOperation::Read if first || last => repr.aeth = Some(AethRepr::ack(0x1F, 1)),
                    _ => {}
                }
                let payload = (length - index * mtu).min(mtu);
                (repr, payload)
            })
            .collect();
        let reply = match operation {
            FloorOperation::Read => {
                let mut repr = base_repr(BthRepr::new(BthOpcode::RC_RDMA_READ_REQUEST, 0x12, 0));
                repr.reth = Some(reth(length));
                repr
            }
            FloorOperation::Write | FloorOperation::Send => {
                let mut repr = base_repr(BthRepr::new(BthOpcode::RC_ACKNOWLEDGE, 0x12, 0));
                repr.aeth = Some(AethRepr::ack(0x1F, 1));
                repr
            }
        };
        Self { length, data, reply }
    }

    /// Bytes of the message.
    pub fn length(&self) -> usize {
        self.length
    }

    /// Frames the message takes: the data frames and the one the other way.
    pub fn frames(&self) -> usize {
        self.data.len() + 1
    }

    /// Moves `source` into `destination` through the message's frames, as the model does
    /// it: each frame emitted with its ICRC into `frame`, parsed back with the ICRC
    /// checked, its payload copied out; the reply emitted and parsed too. Returns the bytes
    /// placed.
    ///
    /// # Errors
    /// Buffers not of the message's length; a frame that does not parse.
    pub fn carry(&self, source: &[u8], destination: &mut [u8], frame: &mut Vec<u8>) -> Result<usize, FrameFloorError> {
        if source.len() != self.length || destination.len() != self.length {
            return Err(FrameFloorError::BufferLength {
                source_length: source.len(),
                destination_length: destination.len(),
                message: self.length,
            });
        }
        let mut offset = 0;
        for (index, (repr, payload)) in self.data.iter().enumerate() {
            let piece = &source[offset..offset + payload];
            emit_frame_overwriting(repr, *payload, frame, |out| out.copy_from_slice(piece));
            let parsed = parse_frame(frame).map_err(|error| FrameFloorError::Parse { index, error })?;
            destination[offset..offset + payload].copy_from_slice(parsed.payload);
            offset += payload;
        }
        emit_frame_overwriting(&self.reply, 0, frame, |_| {});
        let parsed = parse_frame(frame).map_err(|error| FrameFloorError::Parse {
            index: self.data.len(),
            error,
        })?;
        black_box(parsed.repr.bth.psn);
        Ok(offset)
    }

    /// Seconds the data frames occupy a link of `bits_per_second` (the reply goes the
    /// other way).
    pub fn wire_seconds(&self, bits_per_second: f64) -> f64 {
        let bytes: usize = self
            .data
            .iter()
            .map(|(repr, payload)| frame_length(repr, *payload) + WIRE_OVERHEAD_BYTES)
            .sum();
        bytes as f64 * 8.0 / bits_per_second
    }
}

/// The opcode of a data frame: its operation and place in the message.
fn data_opcode(operation: FloorOperation, first: bool, last: bool) -> BthOpcode {
    let [only, first_op, middle, last_op] = match operation {
        FloorOperation::Write => [
            BthOpcode::RC_RDMA_WRITE_ONLY,
            BthOpcode::RC_RDMA_WRITE_FIRST,
            BthOpcode::RC_RDMA_WRITE_MIDDLE,
            BthOpcode::RC_RDMA_WRITE_LAST,
        ],
        FloorOperation::Send => [
            BthOpcode::RC_SEND_ONLY,
            BthOpcode::RC_SEND_FIRST,
            BthOpcode::RC_SEND_MIDDLE,
            BthOpcode::RC_SEND_LAST,
        ],
        FloorOperation::Read => [
            BthOpcode::RC_RDMA_READ_RESPONSE_ONLY,
            BthOpcode::RC_RDMA_READ_RESPONSE_FIRST,
            BthOpcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            BthOpcode::RC_RDMA_READ_RESPONSE_LAST,
        ],
    };
    match (first, last) {
        (true, true) => only,
        (true, false) => first_op,
        (false, true) => last_op,
        (false, false) => middle,
    }
}

fn reth(length: usize) -> RethRepr {
    RethRepr {
        virtual_address: 0x1000,
        rkey: 0xabcd,
        dma_length: u32::try_from(length).unwrap_or(u32::MAX),
    }
}

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

/// Seconds per call of `work`, over at least `calls` calls and `least` of wall time (the
/// clock read once per `calls`).
pub fn seconds_per_call(calls: usize, least: Duration, mut work: impl FnMut()) -> f64 {
    let calls = calls.max(1);
    let start = Instant::now();
    let mut done = 0usize;
    loop {
        for _ in 0..calls {
            work();
        }
        done += calls;
        let elapsed = start.elapsed();
        if elapsed >= least {
            return elapsed.as_secs_f64() / done as f64;
        }
    }
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Messages per second this machine moves through `message`'s frames: the median of
/// `rounds` rounds of at least `round` each, after one checked pass and one uncounted
/// round that warm the code and the buffers.
///
/// # Errors
/// A frame that does not parse (the warm-up pass finds it).
pub fn frame_floor_rate(message: &FloorMessage, rounds: usize, round: Duration) -> Result<f64, FrameFloorError> {
    let source: Vec<u8> = (0..message.length()).map(|i| (i * 7 + 3) as u8).collect();
    let mut destination = vec![0u8; message.length()];
    let mut frame = Vec::with_capacity(
        message
            .data
            .first()
            .map_or(0, |(repr, payload)| frame_length(repr, *payload)),
    );
    message.carry(&source, &mut destination, &mut frame)?;
    // About 64 KiB of payload between two reads of the clock, at least one message.
    let calls = ((64 << 10) / message.length().max(64)).max(1);
    let mut seconds = Vec::with_capacity(rounds.max(1));
    // One round more, first, not counted: the code and the buffers get warm.
    for round_number in 0..=rounds.max(1) {
        let round_seconds = seconds_per_call(calls, round, || {
            // The checked pass returned Ok with these very frames and buffers.
            let _ = black_box(message.carry(black_box(&source), &mut destination, &mut frame));
        });
        if round_number > 0 {
            seconds.push(round_seconds);
        }
    }
    Ok(1.0 / median(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_cut_into_frames_of_one_mtu_and_one_frame_goes_back() {
        assert_eq!(FloorMessage::new(FloorOperation::Write, 8, 4096).frames(), 2);
        assert_eq!(FloorMessage::new(FloorOperation::Write, 0, 4096).frames(), 2);
        assert_eq!(FloorMessage::new(FloorOperation::Write, 4096, 4096).frames(), 2);
        assert_eq!(FloorMessage::new(FloorOperation::Send, 4097, 4096).frames(), 3);
        assert_eq!(FloorMessage::new(FloorOperation::Read, 64 << 10, 4096).frames(), 17);
        assert_eq!(FloorMessage::new(FloorOperation::Write, 6000, 1024).frames(), 7);
    }

    #[test]
    fn every_operation_carries_the_source_bytes_into_the_destination() {
        for operation in [FloorOperation::Write, FloorOperation::Send, FloorOperation::Read] {
            for (length, mtu) in [(0, 4096), (8, 4096), (4095, 1024), (64 << 10, 4096), (10_001, 256)] {
                let message = FloorMessage::new(operation, length, mtu);
                let source: Vec<u8> = (0..length).map(|i| (i * 31 + 1) as u8).collect();
                let mut destination = vec![0u8; length];
                let mut frame = Vec::new();
                assert_eq!(
                    message.carry(&source, &mut destination, &mut frame),
                    Ok(length),
                    "{operation:?} {length} B at MTU {mtu}"
                );
                assert_eq!(destination, source, "{operation:?} {length} B at MTU {mtu}");
            }
        }
    }

    #[test]
    fn the_frames_have_the_headers_the_operation_puts_on_the_wire() {
        let write = FloorMessage::new(FloorOperation::Write, 10_000, 4096);
        let opcodes: Vec<_> = write.data.iter().map(|(repr, _)| repr.bth.opcode).collect();
        assert_eq!(
            opcodes,
            [
                BthOpcode::RC_RDMA_WRITE_FIRST,
                BthOpcode::RC_RDMA_WRITE_MIDDLE,
                BthOpcode::RC_RDMA_WRITE_LAST
            ]
        );
        assert!(write.data[0].0.reth.is_some() && write.data[1].0.reth.is_none());
        assert!(write.data[2].0.bth.ack_request, "the last frame asks for the ACK");
        assert_eq!(write.reply.bth.opcode, BthOpcode::RC_ACKNOWLEDGE);

        let read = FloorMessage::new(FloorOperation::Read, 8, 4096);
        assert_eq!(read.data[0].0.bth.opcode, BthOpcode::RC_RDMA_READ_RESPONSE_ONLY);
        assert!(read.data[0].0.aeth.is_some());
        assert_eq!(read.reply.bth.opcode, BthOpcode::RC_RDMA_READ_REQUEST);
        assert_eq!(read.reply.reth.map(|reth| reth.dma_length), Some(8));

        let send = FloorMessage::new(FloorOperation::Send, 8, 4096);
        assert_eq!(send.data[0].0.bth.opcode, BthOpcode::RC_SEND_ONLY);
        assert!(send.data[0].0.reth.is_none() && send.data[0].0.aeth.is_none());
    }

    #[test]
    fn buffers_of_another_length_are_refused_and_nothing_is_written() {
        let message = FloorMessage::new(FloorOperation::Write, 16, 4096);
        let mut destination = [7u8; 16];
        assert_eq!(
            message.carry(&[1u8; 8], &mut destination, &mut Vec::new()),
            Err(FrameFloorError::BufferLength {
                source_length: 8,
                destination_length: 16,
                message: 16
            })
        );
        assert_eq!(destination, [7u8; 16]);
    }

    #[test]
    fn wire_time_counts_every_data_frame_with_its_ethernet_overhead() {
        // 8 bytes as WRITE Only over IPv4: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16,
        // payload 8, ICRC 4 = 82 bytes, plus 24 of FCS, preamble and gap.
        let message = FloorMessage::new(FloorOperation::Write, 8, 4096);
        let seconds = message.wire_seconds(100e9);
        assert!((seconds - 106.0 * 8.0 / 100e9).abs() < 1e-15, "{seconds}");
    }

    #[test]
    fn the_rate_is_a_positive_number_of_messages_per_second() {
        let message = FloorMessage::new(FloorOperation::Write, 8, 4096);
        let rate = frame_floor_rate(&message, 1, Duration::ZERO).unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
    }

    #[test]
    fn the_median_of_none_is_zero_and_of_some_the_middle_one() {
        assert_eq!(median(Vec::new()), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
    }
}
