//! The port: the device's network interface between the transport's engines and the wire.
//!
//! The block ([`Port`]) owns
//! * the address tables ([`PortAddresses`]: GID and source-MAC tables, the port's MAC);
//! * the transmit pipeline: frames built and not yet off the wire, and until when the
//!   port is serialising;
//! * the receive pipeline: received frames waiting for the engines, and the receive
//!   path's clocks (its PCIe write channel, the last frame's processing time);
//! * the transmitted frames waiting for the owner's `poll_transmit`;
//! * the frame-buffer pool (so the data path does not allocate per packet), the IPv4
//!   identification counter and the port's counters.
//!
//! Its interface: the transport (through its `Io`) hands it built frames with the time they
//! are ready and their serialisation time, takes back the frames whose last bit has left,
//! books received frames into the receive pipeline and takes them out when due, asks for
//! frame buffers and IPv4 identifications and looks up addresses; the firmware reads and
//! writes the address tables; the top hands it frames from and to the network. It needs no
//! other block and no service: the timing model's charges for the pipelines are made by
//! the transport, which knows the frame's costs, and the times come with each request.

mod addresses;

use std::collections::VecDeque;

pub use addresses::GidTableEntry;
pub(crate) use addresses::PortAddresses;

use crate::time::Picoseconds;
use crate::wire::Icrc;

/// Frame buffers kept for reuse.
pub(crate) const POOL_LIMIT: usize = 1024;
/// Transmitted frames kept for `poll_transmit` before the oldest is dropped (nobody is
/// polling the port).
pub(crate) const TRANSMIT_QUEUE_LIMIT: usize = 4096;
/// Capacity a new frame buffer gets: the largest RoCEv2 frame (4 KiB payload and headers).
const FRAME_CAPACITY: usize = 4096 + 128;
/// Frames up to this length (bytes) are short for [`FramePool`]: every header-only frame
/// (ACK, NAK, CNP, READ request, atomic request and response) and small payloads.
const SHORT_FRAME_LIMIT: usize = 512;

/// What the port counted since power-on or the last function reset (reported with the
/// transport's counters, `TransportCounters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PortCounters {
    /// Frames put on the wire (loopback included).
    pub frames_transmitted: u64,
    /// Frames delivered to the port.
    pub frames_received: u64,
    /// Frames looped back to the device itself.
    pub loopback_frames: u64,
    /// Transmitted frames dropped because nobody polled the port.
    pub transmit_overflows: u64,
}

/// The port block: address tables, transmit and receive pipelines, the frames waiting to
/// be polled, the buffer pool, the IPv4 identification counter, counters.
#[derive(Debug, Clone)]
pub(crate) struct Port {
    addresses: PortAddresses,
    /// Frames built and not yet off the wire, with the time their last bit leaves.
    transmit_pipeline: VecDeque<(Picoseconds, Vec<u8>)>,
    /// The port is serialising until then.
    transmit_free: Picoseconds,
    /// Received frames in the receive pipeline, with the time the engines process them,
    /// the destination QPN the pipeline read from the BTH and whether the ICRC is to be
    /// checked.
    receive_pipeline: VecDeque<(Picoseconds, u32, Icrc, Vec<u8>)>,
    /// The receive pipeline's PCIe write channel is busy until then.
    receive_free: Picoseconds,
    /// Processing time of the last received frame (frames are processed in order).
    receive_last: Picoseconds,
    /// Frames that left the port, for `poll_transmit`. Every frame the transport emits,
    /// and so every frame here, has its ICRC offloaded (`wire::Icrc::Offloaded`): the
    /// device fills it in as the frame leaves the in-process link.
    transmitted: VecDeque<Vec<u8>>,
    /// Free frame buffers.
    pool: FramePool,
    /// IPv4 identification of the next IPv4 packet.
    ipv4_identification: u16,
    counters: PortCounters,
}

impl Port {
    /// The port after power-on or a function reset: address tables of `entries` entries
    /// (SMAC 0 = `mac`), empty pipelines and pool.
    pub fn new(entries: usize, mac: [u8; 6]) -> Self {
        Self {
            addresses: PortAddresses::new(entries, mac),
            transmit_pipeline: VecDeque::with_capacity(32),
            transmit_free: Picoseconds::ZERO,
            receive_pipeline: VecDeque::with_capacity(64),
            receive_free: Picoseconds::ZERO,
            receive_last: Picoseconds::ZERO,
            transmitted: VecDeque::with_capacity(256),
            pool: FramePool::with_limit(POOL_LIMIT),
            ipv4_identification: 0,
            counters: PortCounters::default(),
        }
    }

    /// The address tables.
    #[inline]
    pub fn addresses(&self) -> &PortAddresses {
        &self.addresses
    }

    /// The address tables, for the firmware's table writes.
    pub fn addresses_mut(&mut self) -> &mut PortAddresses {
        &mut self.addresses
    }

    /// What the port counted.
    pub fn counters(&self) -> PortCounters {
        self.counters
    }

    /// The identification field of the next IPv4 header.
    #[inline]
    pub fn next_ipv4_identification(&mut self) -> u16 {
        let id = self.ipv4_identification;
        self.ipv4_identification = id.wrapping_add(1);
        id
    }

    // ---- buffers ------------------------------------------------------------------------

    /// An empty frame buffer from the pool, for a frame of `frame_length` bytes.
    #[inline]
    pub fn take_buffer(&mut self, frame_length: usize) -> Vec<u8> {
        let mut buffer = self.take_frame_buffer(frame_length);
        buffer.clear();
        buffer
    }

    /// A buffer from the pool for a frame of `frame_length` bytes that may still hold an
    /// old frame's bytes: only for `wire::emit_frame_overwriting` / `emit_frame_offloaded`,
    /// which write or zero every byte they keep.
    #[inline]
    pub fn take_frame_buffer(&mut self, frame_length: usize) -> Vec<u8> {
        self.pool
            .take(frame_length)
            .unwrap_or_else(|| Vec::with_capacity(FRAME_CAPACITY))
    }

    /// Returns a buffer to the pool (kept if the pool has room).
    #[inline]
    pub fn give_buffer(&mut self, buffer: Vec<u8>) {
        // Not cleared: `take_buffer` clears, and `take_frame_buffer` reuses the bytes.
        self.pool.give(buffer);
    }

    // ---- transmit -----------------------------------------------------------------------

    /// Queues a built frame, ready at `ready`, whose serialisation takes `serialisation`:
    /// it starts when it is ready and the port is free. Returns when it starts.
    #[inline]
    pub fn transmit(&mut self, ready: Picoseconds, serialisation: Picoseconds, frame: Vec<u8>) -> Picoseconds {
        let start = ready.max(self.transmit_free);
        let end = start + serialisation;
        self.transmit_free = end;
        self.transmit_pipeline.push_back((end, frame));
        start
    }

    /// Frames in the transmit pipeline (built, last bit not yet out).
    #[inline]
    pub fn transmit_pipeline_len(&self) -> usize {
        self.transmit_pipeline.len()
    }

    /// When the oldest frame in the transmit pipeline leaves the port.
    #[inline]
    pub fn next_departure(&self) -> Option<Picoseconds> {
        self.transmit_pipeline.front().map(|(end, _)| *end)
    }

    /// The oldest frame in the transmit pipeline if its last bit has left by `now`.
    #[inline]
    pub fn departed(&mut self, now: Picoseconds) -> Option<Vec<u8>> {
        if self.transmit_pipeline.front().is_some_and(|(end, _)| *end <= now) {
            return self.transmit_pipeline.pop_front().map(|(_, frame)| frame);
        }
        None
    }

    /// A frame left the port: counted; a frame for one of the port's own MAC addresses is
    /// handed back to loop back into the receive side, any other waits for
    /// [`Port::poll_transmit`] (the oldest is dropped when nobody polls).
    #[inline]
    pub fn frame_left(&mut self, frame: Vec<u8>) -> Option<Vec<u8>> {
        self.counters.frames_transmitted += 1;
        let destination: [u8; 6] = frame.get(..6).and_then(|mac| mac.try_into().ok()).unwrap_or_default();
        if self.addresses.is_local_mac(&destination) {
            self.counters.loopback_frames += 1;
            return Some(frame);
        }
        if self.transmitted.len() >= TRANSMIT_QUEUE_LIMIT {
            self.counters.transmit_overflows += 1;
            if let Some(old) = self.transmitted.pop_front() {
                self.give_buffer(old);
            }
        }
        self.transmitted.push_back(frame);
        None
    }

    /// The next Ethernet frame (without FCS) the port has transmitted, if any.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmitted.pop_front()
    }

    /// Returns a buffer obtained from [`Port::poll_transmit`] for reuse.
    pub fn recycle_frame(&mut self, buffer: Vec<u8>) {
        self.give_buffer(buffer);
    }

    // ---- receive ------------------------------------------------------------------------

    /// A frame arrived at `now`: counted; returns when the receive pipeline can start on
    /// it (now, or when its PCIe write channel is free).
    #[inline]
    pub fn receive_start(&mut self, now: Picoseconds) -> Picoseconds {
        self.counters.frames_received += 1;
        now.max(self.receive_free)
    }

    /// Books the frame started at `start`: it holds the PCIe write channel for `link` and
    /// is processed `latency` after its start, not before the frame ahead of it. Returns
    /// when it is due.
    #[inline]
    pub fn receive_book(&mut self, start: Picoseconds, link: Picoseconds, latency: Picoseconds) -> Picoseconds {
        self.receive_free = start + link;
        let due = (start + latency).max(self.receive_last);
        self.receive_last = due;
        due
    }

    /// Whether no received frame waits in the receive pipeline.
    #[inline]
    pub fn receive_pipeline_is_empty(&self) -> bool {
        self.receive_pipeline.is_empty()
    }

    /// Queues a booked frame, due at `due`, for destination QP `qpn`, with its ICRC to
    /// check (`Icrc::Computed`) or to trust.
    #[inline]
    pub fn queue_received(&mut self, due: Picoseconds, qpn: u32, icrc: Icrc, frame: Vec<u8>) {
        self.receive_pipeline.push_back((due, qpn, icrc, frame));
    }

    /// The oldest received frame if it is due by `now`, with its QPN and ICRC state.
    #[inline]
    pub fn received(&mut self, now: Picoseconds) -> Option<(u32, Icrc, Vec<u8>)> {
        if self.receive_pipeline.front().is_some_and(|(due, _, _, _)| *due <= now) {
            return self
                .receive_pipeline
                .pop_front()
                .map(|(_, qpn, icrc, frame)| (qpn, icrc, frame));
        }
        None
    }
}

/// Free frame buffers, kept in two stacks by the length of the frame each last held.
///
/// A frame is built over whatever its buffer held (`wire::emit_frame_offloaded`), so only
/// the bytes past the buffer's old length are zero-filled. With one stack, a 4 KiB data
/// frame was built in a buffer that had just carried an ACK on the way back, and the whole
/// payload was zero-filled before the DMA overwrote it, every packet. Taken by the length
/// of the frame to be built, a long frame gets a buffer that held a long one and a short
/// frame one that held a short one, whenever the pool has one.
#[derive(Debug, Clone)]
pub(crate) struct FramePool {
    /// Buffers whose last frame was at most [`SHORT_FRAME_LIMIT`] bytes long.
    short: Vec<Vec<u8>>,
    /// Buffers whose last frame was longer.
    long: Vec<Vec<u8>>,
    /// Buffers kept at most (both stacks); more are dropped.
    limit: usize,
}

impl FramePool {
    /// An empty pool that keeps at most `limit` buffers.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            short: Vec::with_capacity(32),
            long: Vec::with_capacity(32),
            limit,
        }
    }

    /// A buffer for a frame of `frame_length` bytes: the last one returned whose old frame
    /// was of the same kind (short or long), else any; None when the pool is empty.
    #[inline]
    pub fn take(&mut self, frame_length: usize) -> Option<Vec<u8>> {
        let (same, other) = if frame_length > SHORT_FRAME_LIMIT {
            (&mut self.long, &mut self.short)
        } else {
            (&mut self.short, &mut self.long)
        };
        same.pop().or_else(|| other.pop())
    }

    /// Keeps `buffer` for reuse, its bytes as they are, unless the pool is full.
    #[inline]
    pub fn give(&mut self, buffer: Vec<u8>) {
        if self.len() < self.limit {
            if buffer.len() > SHORT_FRAME_LIMIT {
                self.long.push(buffer);
            } else {
                self.short.push(buffer);
            }
        }
    }

    /// Buffers in the pool.
    #[inline]
    pub fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];

    #[test]
    fn recycled_buffers_are_reused_and_the_pool_is_bounded() {
        let mut port = Port::new(4, MAC);
        for _ in 0..POOL_LIMIT + 10 {
            port.recycle_frame(Vec::with_capacity(64));
        }
        assert_eq!(port.pool.len(), POOL_LIMIT);
        let buffer = port.take_buffer(64);
        assert!(buffer.is_empty() && buffer.capacity() >= 64);
    }

    #[test]
    fn a_long_frame_gets_a_buffer_that_held_a_long_frame_and_a_short_one_a_short() {
        let mut pool = FramePool::with_limit(8);
        pool.give(vec![1; 4096 + 62]);
        // The ACK that came back last sits on top, but a data frame does not get it.
        pool.give(vec![2; 62]);
        assert_eq!(pool.take(4096 + 62).map(|b| b.len()), Some(4096 + 62));
        assert_eq!(pool.take(70).map(|b| b.len()), Some(62));
        assert_eq!(pool.take(70), None);
    }

    #[test]
    fn a_frame_takes_a_buffer_of_the_other_kind_rather_than_none() {
        let mut pool = FramePool::with_limit(8);
        pool.give(vec![0; 62]);
        assert_eq!(pool.take(4096).map(|b| b.len()), Some(62));
        pool.give(vec![0; 4096]);
        assert_eq!(pool.take(62).map(|b| b.len()), Some(4096));
    }

    #[test]
    fn the_pool_keeps_at_most_its_limit_across_both_kinds() {
        let mut pool = FramePool::with_limit(3);
        pool.give(vec![0; 62]);
        pool.give(vec![0; 4096]);
        pool.give(vec![0; 62]);
        pool.give(vec![0; 4096]);
        assert_eq!(pool.len(), 3);
    }

    #[test]
    fn a_frame_starts_when_ready_and_the_port_is_free_and_leaves_after_its_serialisation() {
        let mut port = Port::new(4, MAC);
        assert_eq!(
            port.transmit(Picoseconds(100), Picoseconds(50), vec![1]),
            Picoseconds(100)
        );
        // Ready earlier than the port is free: it waits for the first to finish.
        assert_eq!(
            port.transmit(Picoseconds(120), Picoseconds(50), vec![2]),
            Picoseconds(150)
        );
        assert_eq!(port.transmit_pipeline_len(), 2);
        assert_eq!(port.next_departure(), Some(Picoseconds(150)));
        assert_eq!(port.departed(Picoseconds(149)), None);
        assert_eq!(port.departed(Picoseconds(200)), Some(vec![1]));
        assert_eq!(port.departed(Picoseconds(200)), Some(vec![2]));
        assert_eq!(port.departed(Picoseconds(200)), None);
    }

    #[test]
    fn frames_to_the_port_s_own_mac_loop_back_and_others_wait_for_a_poll() {
        let mut port = Port::new(4, MAC);
        let mut own = MAC.to_vec();
        own.extend_from_slice(&[0; 8]);
        assert_eq!(port.frame_left(own.clone()), Some(own));
        let other = vec![0x02, 0, 0, 0, 0, 9, 0, 0];
        assert_eq!(port.frame_left(other.clone()), None);
        assert_eq!(port.poll_transmit(), Some(other));
        assert_eq!(port.poll_transmit(), None);
        let counters = port.counters();
        assert_eq!((counters.frames_transmitted, counters.loopback_frames), (2, 1));
    }

    #[test]
    fn nobody_polling_drops_the_oldest_transmitted_frame() {
        let mut port = Port::new(4, MAC);
        for i in 0..TRANSMIT_QUEUE_LIMIT + 1 {
            let frame = vec![0x02, 0, 0, 0, 0, 9, (i >> 8) as u8, i as u8];
            assert_eq!(port.frame_left(frame), None);
        }
        assert_eq!(port.counters().transmit_overflows, 1);
        assert_eq!(port.poll_transmit().map(|f| f[6..].to_vec()), Some(vec![0, 1]));
    }

    #[test]
    fn received_frames_are_processed_in_order_and_not_before_they_are_due() {
        let mut port = Port::new(4, MAC);
        let start = port.receive_start(Picoseconds(10));
        assert_eq!(start, Picoseconds(10));
        let due = port.receive_book(start, Picoseconds(40), Picoseconds(100));
        assert_eq!(due, Picoseconds(110));
        port.queue_received(due, 7, Icrc::Computed, vec![1]);
        // The next frame waits for the write channel and is not processed before the first.
        let start = port.receive_start(Picoseconds(20));
        assert_eq!(start, Picoseconds(50));
        let due = port.receive_book(start, Picoseconds(1), Picoseconds(5));
        assert_eq!(due, Picoseconds(110));
        port.queue_received(due, 8, Icrc::Offloaded, vec![2]);
        assert!(!port.receive_pipeline_is_empty());
        assert_eq!(port.received(Picoseconds(109)), None);
        assert_eq!(port.received(Picoseconds(110)), Some((7, Icrc::Computed, vec![1])));
        assert_eq!(port.received(Picoseconds(110)), Some((8, Icrc::Offloaded, vec![2])));
        assert!(port.receive_pipeline_is_empty());
        assert_eq!(port.counters().frames_received, 2);
    }
}
