//! The wire between NICs: an in-process switch on virtual time, with a seeded fault plan.
//!
//! A [`Fabric`] owns the devices and co-simulates them: it always runs the earliest thing
//! that is due — a device's next event or a frame's arrival — after moving every device to
//! that instant, so all devices share one virtual clock. A frame a device transmits is
//! taken from its port right after the device ran ([`Port::poll_transmit`] until `None`),
//! goes through the [`FaultPlan`] and arrives `link_latency` later at the device whose
//! MAC address it is sent to (broadcast and multicast: at every other device).
//!
//! Everything is deterministic: one seeded generator decides every fault, frames are
//! taken from devices in device order and in the order each device sent them, and frames
//! arriving at the same instant are delivered in the order they were scheduled. The same
//! configuration, seed and inputs give the same statistics and the same capture.
//!
//! The fabric talks to a device only through the [`Port`] trait, which [`Device`]
//! implements; tests drive the same loop with scripted ports.
//!
//! ## Faults
//!
//! Each frame that leaves a device draws its fate once (see [`FaultPlan`]):
//!
//! - **loss**: the frame disappears.
//! - **duplicate**: the frame arrives twice, back to back.
//! - **corrupt**: one byte past the Ethernet header is XORed with a random non-zero mask.
//!   In a RoCEv2 frame the fields the ICRC does not cover (IP TOS/traffic class, TTL/hop
//!   limit, flow label, IPv4 header checksum, UDP checksum, BTH FECN/BECN byte) are never
//!   chosen (nor, for IPv6, the byte holding the version), so the receiver's ICRC check
//!   always sees the damage.
//! - **delay**: the frame arrives `1..=max_delay` picoseconds late.
//! - **reorder**: the frame is held back until `k` later frames of the same sender
//!   (`k` drawn from `1..=reorder_window`) have gone on the wire (lost frames do not count)
//!   and is then delivered right after the last of them; so at most `reorder_window` later
//!   frames overtake it. While a frame of a sender is held, that sender's frames are not
//!   reordered. If the sender goes quiet, the frame is let go `max_delay` after its normal
//!   arrival.
//!
//! Frames to a unicast MAC address no device has, and runts shorter than an Ethernet
//! header, are counted as undeliverable and dropped before any fault. A unicast frame goes
//! to every device with that address, the sender included (hairpin); a broadcast or
//! multicast frame to every device but the sender.
//!
//! ## Buffers
//!
//! A frame travels in the buffer its sender handed out; in exchange the fabric at once
//! gives the sender a buffer from its own pool with [`Port::recycle_frame`], so each port
//! gets back exactly as many buffers as it handed out. The last receiver of a frame takes
//! its buffer with [`Port::receive_frame_owned`] and gives one back for the pool (a port
//! that queues frames keeps the buffer instead of copying it). So the payload is not
//! copied on the wire, and once traffic is steady nothing is allocated per frame (except
//! the capture, when it is on).
//!
//! ## Checksum offload
//!
//! A frame that goes from one device to another in this process, uncaptured and
//! unaltered, needs no ICRC, as virtio-net needs no checksum between local guests: the
//! sender leaves it out ([`Port::poll_transmit_offloaded`] hands out the frame with
//! [`Icrc::Offloaded`]) and the receiver trusts that mark
//! ([`Port::receive_frame_offloaded`]). The fabric fills the ICRC in
//! ([`wire::fill_icrc`]) whenever someone could see or alter the bytes: before a frame is
//! captured, before the corrupt fault damages it (the receiver then checks it, as it does
//! every frame with [`Icrc::Computed`]) and before a frame goes to more than one receiver
//! (duplicates, broadcasts). Frames leaving the process (`Device::poll_transmit`, the
//! network backends) and frames an observer on a device's network port sees always carry
//! their ICRC. Nothing the model computes depends on it: the virtual results are the same.

mod fault;
pub mod pcap;
#[cfg(test)]
mod tests;

pub use fault::{FaultPlan, FaultPlanError, FaultRng};

use crate::device::Device;
use crate::port::FramePool;
use crate::time::{Picoseconds, TimeQueue};
use crate::wire::{self, Icrc};

/// Bytes of an Ethernet header without VLAN tag: the shortest frame the fabric forwards.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// Capacity of a pool buffer: a 4096-byte payload plus every header RoCEv2 can stack
/// (Ethernet + VLAN 18, IPv6 40, UDP 8, BTH 12, AtomicETH 28, pad 3, ICRC 4), rounded up.
const MAX_FRAME_CAPACITY: usize = 4096 + 128;

/// What the fabric needs from a device: its clock and its network port.
///
/// [`Device`] implements it; anything else that keeps virtual time the same way (a
/// scripted traffic source in a test, a packet generator) can be put on the wire.
pub trait Port {
    /// The port's MAC address: unicast frames to it are delivered here.
    fn mac_address(&self) -> [u8; 6];
    /// The port's current virtual time.
    fn now(&self) -> Picoseconds;
    /// Time of the port's next pending event, if any.
    fn next_event_time(&self) -> Option<Picoseconds>;
    /// Runs every event due at or before `t`, then moves the port's time to `t`.
    fn advance_to(&mut self, t: Picoseconds);
    /// The next frame (Ethernet, no FCS) the port put on the wire at or before now.
    fn poll_transmit(&mut self) -> Option<Vec<u8>>;
    /// Delivers a frame (Ethernet, no FCS) to the port now.
    fn receive_frame(&mut self, frame: &[u8]);
    /// Delivers a frame the port may keep, and returns a buffer (this one, or a spare of
    /// the port's) for the fabric's pool. The default copies, as [`Port::receive_frame`].
    fn receive_frame_owned(&mut self, frame: Vec<u8>) -> Vec<u8> {
        self.receive_frame(&frame);
        frame
    }
    /// The next frame, as [`Port::poll_transmit`], with its ICRC possibly left to the link
    /// ([`Icrc::Offloaded`]: the field is zero). The default hands out frames with their
    /// ICRC ([`Icrc::Computed`]).
    fn poll_transmit_offloaded(&mut self) -> Option<(Vec<u8>, Icrc)> {
        self.poll_transmit().map(|frame| (frame, Icrc::Computed))
    }
    /// [`Port::receive_frame_owned`] of a frame whose ICRC is `icrc`: an
    /// [`Icrc::Offloaded`] frame is unaltered from a port of this fabric and need not be
    /// checked. The default fills its ICRC in and delivers it as any other frame.
    fn receive_frame_offloaded(&mut self, mut frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        if icrc == Icrc::Offloaded {
            wire::fill_icrc(&mut frame);
        }
        self.receive_frame_owned(frame)
    }
    /// Gives the port a buffer to reuse, one for each frame [`Port::poll_transmit`]
    /// handed out (not necessarily the same one; its old bytes mean nothing).
    fn recycle_frame(&mut self, buffer: Vec<u8>);
}

// Inline: the fabric asks every device for its next event, moves it and polls it on
// every step, and each of those was a call even when the device had nothing to do. The
// device's own `advance_to` and `poll_transmit` are inline and return at once then.
impl Port for Device {
    fn mac_address(&self) -> [u8; 6] {
        self.config().mac_address
    }

    #[inline]
    fn now(&self) -> Picoseconds {
        Device::now(self)
    }

    #[inline]
    fn next_event_time(&self) -> Option<Picoseconds> {
        Device::next_event_time(self)
    }

    #[inline]
    fn advance_to(&mut self, t: Picoseconds) {
        Device::advance_to(self, t);
    }

    #[inline]
    fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        Device::poll_transmit(self)
    }

    fn receive_frame(&mut self, frame: &[u8]) {
        Device::receive_frame(self, frame);
    }

    fn receive_frame_owned(&mut self, frame: Vec<u8>) -> Vec<u8> {
        Device::receive_frame_owned(self, frame)
    }

    #[inline]
    fn poll_transmit_offloaded(&mut self) -> Option<(Vec<u8>, Icrc)> {
        Device::poll_transmit_offloaded(self)
    }

    fn receive_frame_offloaded(&mut self, frame: Vec<u8>, icrc: Icrc) -> Vec<u8> {
        Device::receive_frame_offloaded(self, frame, icrc)
    }

    fn recycle_frame(&mut self, buffer: Vec<u8>) {
        Device::recycle_frame(self, buffer);
    }
}

/// A device's place on the fabric, in the order devices were added (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub usize);

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// How the wire behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FabricConfig {
    /// From a frame leaving one device to it arriving at another: propagation plus the
    /// switch. Default 1 µs.
    pub link_latency: Picoseconds,
    /// What goes wrong on the way.
    pub faults: FaultPlan,
}

impl FabricConfig {
    /// Default of [`FabricConfig::link_latency`]: 1 µs.
    pub const DEFAULT_LINK_LATENCY: Picoseconds = Picoseconds::from_micros(1);
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            link_latency: Self::DEFAULT_LINK_LATENCY,
            faults: FaultPlan::none(),
        }
    }
}

/// One frame as it left a device, before any fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame {
    /// When the fabric took it from the device.
    pub time: Picoseconds,
    /// The device that sent it.
    pub from: DeviceId,
    /// The frame: Ethernet, no FCS.
    pub bytes: Vec<u8>,
}

/// What the fabric did with the frames, since it was made.
///
/// Every frame sent is exactly one of: undeliverable, dropped, or scheduled (then
/// delivered once per copy and receiver). `duplicated`, `reordered`, `corrupted` and
/// `delayed` count scheduled frames the fault hit (a frame can be hit by several).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FabricStatistics {
    /// Frames taken from devices.
    pub sent: u64,
    /// Frames handed to devices: each copy to each receiver counts once (a broadcast to
    /// three devices counts three).
    pub delivered: u64,
    /// Frames lost by the loss fault or a [`DropRule`].
    pub dropped: u64,
    /// Frames delivered twice by the duplicate fault.
    pub duplicated: u64,
    /// Frames held back by the reorder fault.
    pub reordered: u64,
    /// Frames with a byte flipped by the corrupt fault.
    pub corrupted: u64,
    /// Frames made late by the delay fault.
    pub delayed: u64,
    /// Frames to a unicast MAC address no device has (or with no other device to
    /// receive a broadcast, or shorter than an Ethernet header).
    pub undeliverable: u64,
}

/// A frame on its way (its arrival time is its key in the fabric's [`TimeQueue`]).
#[derive(Debug)]
struct InFlight {
    from: usize,
    /// 1, or 2 for a duplicated frame.
    copies: u8,
    /// Whether the receiver checks the ICRC or trusts the sender's mark.
    icrc: Icrc,
    buffer: Vec<u8>,
}

/// A frame the reorder fault holds back.
#[derive(Debug)]
struct Held {
    frame: InFlight,
    /// When it would have arrived had it not been held.
    arrival: Picoseconds,
    /// Later frames of the same sender still to overtake it.
    remaining: u32,
    /// When it is let go if the sender sends too few frames.
    deadline: Picoseconds,
}

/// A chosen loss beside the random [`FaultPlan`]: called with the sender and the bytes
/// (Ethernet, no FCS; the ICRC may be unfilled) of every deliverable frame, after the
/// frame's fault draws (so a rule leaves the plan's other fates unchanged); `true` drops the
/// frame. For tests that must lose one particular frame, e.g. the ACK of a message.
pub type DropRule = Box<dyn FnMut(DeviceId, &[u8]) -> bool + Send>;

/// The switch and the devices on it. See the [module documentation](self).
///
/// Generic over the [`Port`] so the same loop runs devices and test doubles; the default,
/// `Fabric` alone, is a fabric of [`Device`]s.
pub struct Fabric<P: Port = Device> {
    config: FabricConfig,
    ports: Vec<P>,
    /// MAC address of each port, read when it was added.
    macs: Vec<[u8; 6]>,
    now: Picoseconds,
    rng: FaultRng,
    /// Frames by arrival; frames arriving at the same instant in launch order.
    in_flight: TimeQueue<InFlight>,
    /// The frame held back by the reorder fault, per sender.
    held: Vec<Option<Held>>,
    /// How many entries of `held` are `Some`: lets the common no-reorder case skip
    /// scanning them on every step.
    held_count: usize,
    /// Spare frame buffers, kept by the length of the frame each last held.
    pool: FramePool,
    /// Buffers the pool had to allocate (bounded by the most frames ever in flight).
    pool_allocations: u64,
    capture_on: bool,
    capture: Vec<CapturedFrame>,
    statistics: FabricStatistics,
    drop_rule: Option<DropRule>,
}

impl<P: Port> std::fmt::Debug for Fabric<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("now", &self.now)
            .field("devices", &self.ports.len())
            .field("in_flight", &self.frames_in_flight())
            .field("statistics", &self.statistics)
            .finish_non_exhaustive()
    }
}

impl Fabric {
    /// An empty fabric of [`Device`]s at time zero.
    pub fn new(config: FabricConfig) -> Self {
        Self::new_generic(config)
    }
}

impl<P: Port> Fabric<P> {
    /// An empty fabric of ports of type `P` at time zero.
    pub fn new_generic(config: FabricConfig) -> Self {
        Self {
            config,
            ports: Vec::new(),
            macs: Vec::new(),
            now: Picoseconds::ZERO,
            rng: FaultRng::new(config.faults.seed),
            in_flight: TimeQueue::new(),
            held: Vec::new(),
            held_count: 0,
            pool: FramePool::with_limit(usize::MAX),
            pool_allocations: 0,
            capture_on: false,
            capture: Vec::new(),
            statistics: FabricStatistics::default(),
            drop_rule: None,
        }
    }

    /// The configuration, with the fault plan in force.
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// Replaces the fault plan from now on (to break the wire, or mend it, mid-run) and
    /// reseeds the fault generator with the new plan's seed. Frames already on the wire
    /// keep the fate they drew.
    pub fn set_faults(&mut self, faults: FaultPlan) {
        self.config.faults = faults;
        self.rng = FaultRng::new(faults.seed);
    }

    /// Loses the frames `rule` picks from now on, besides the fault plan's; `None` stops.
    pub fn set_drop_rule(&mut self, rule: Option<DropRule>) {
        self.drop_rule = rule;
    }

    /// Connects `device` to the fabric. A device behind the fabric's clock is moved to it;
    /// a device ahead of it moves the whole fabric to its time.
    pub fn add_device(&mut self, mut device: P) -> DeviceId {
        let id = self.ports.len();
        let ahead = device.now().max(self.now);
        device.advance_to(self.now);
        self.macs.push(device.mac_address());
        self.ports.push(device);
        self.held.push(None);
        if ahead > self.now {
            self.advance_to(ahead);
        }
        DeviceId(id)
    }

    /// The device `id`. Panics if `id` is not from this fabric.
    pub fn device(&self, id: DeviceId) -> &P {
        &self.ports[id.0]
    }

    /// The device `id`, to drive it (registers, doorbells). Do not advance its clock
    /// yourself: use [`Fabric::advance_to`]. Panics if `id` is not from this fabric.
    pub fn device_mut(&mut self, id: DeviceId) -> &mut P {
        &mut self.ports[id.0]
    }

    /// Number of devices.
    pub fn devices(&self) -> usize {
        self.ports.len()
    }

    /// The fabric's virtual time; every device is at this time too.
    pub fn now(&self) -> Picoseconds {
        self.now
    }

    /// The earliest of every device's next event, every frame's arrival and every held
    /// frame's deadline.
    pub fn next_event_time(&self) -> Option<Picoseconds> {
        let mut next = self.in_flight.peek_time();
        for port in &self.ports {
            next = earliest(next, port.next_event_time());
        }
        if self.held_count > 0 {
            for held in self.held.iter().flatten() {
                next = earliest(next, Some(held.deadline));
            }
        }
        next.map(|t| t.max(self.now))
    }

    /// Frames on the wire (scheduled or held back), not yet delivered.
    pub fn frames_in_flight(&self) -> usize {
        self.in_flight.len() + self.held_count
    }

    /// Runs every device event, frame arrival and fault due at or before `t`, in time
    /// order, and leaves every device at `t`. Time never goes back: an earlier `t` only
    /// settles what is due now.
    pub fn advance_to(&mut self, t: Picoseconds) {
        let next = self.next_event_time();
        self.advance_to_known(t.max(self.now), next, true);
    }

    /// Runs everything due at the next pending instant (a device event, a frame arrival, a
    /// held frame's deadline), or lets `limit` pass if nothing is due before
    /// `now + limit`: one step of a poll loop that wakes exactly when something can have
    /// changed.
    pub fn advance_to_next_event(&mut self, limit: Picoseconds) {
        let next = self.next_event_time();
        let target = self.next_target(next, limit);
        self.advance_to_known(target, next, true);
    }

    /// Takes [`Fabric::advance_to_next_event`] steps until `stop` holds after one; returns
    /// how many were taken (at least one). The same steps, in the same order and to the
    /// same instants, as calling [`Fabric::advance_to_next_event`] and then `stop` in a
    /// loop: a host that only needs to wake when something it can see has changed (a
    /// completion written) lets the fabric run on instead of returning after every step.
    pub fn advance_to_next_event_until(&mut self, limit: Picoseconds, mut stop: impl FnMut(&Self) -> bool) -> u64 {
        let mut steps = 0;
        // Each step ends by computing the next event's time; `stop` cannot change it (it
        // sees the fabric only), so the next step starts from it instead of asking again.
        let mut next = self.next_event_time();
        loop {
            let target = self.next_target(next, limit);
            // Only the first step can find frames from a host-side call: a step ends with
            // every transmit queue drained (`run_at` stops after a collection that led to
            // no delivery), and nothing but `stop`, which cannot send, runs in between.
            next = self.advance_to_known(target, next, steps == 0);
            steps += 1;
            if stop(self) {
                return steps;
            }
        }
    }

    /// Where [`Fabric::advance_to_next_event`] goes from `next`, the next event's time.
    #[inline]
    fn next_target(&self, next: Option<Picoseconds>, limit: Picoseconds) -> Picoseconds {
        let idle = self.now + limit;
        next.map_or(idle, |next| next.min(idle))
    }

    /// [`Fabric::advance_to`] `target` (not before now), given `next`, what
    /// [`Fabric::next_event_time`] says now; returns what it says afterwards. The three
    /// questions a step used to ask are one: a step that launched no frame from a host-side
    /// call leaves the next event where it was. `host_acted`: whether a host may have made a
    /// device send since the last step (false only when nothing but the fabric ran since).
    fn advance_to_known(
        &mut self,
        target: Picoseconds,
        mut next: Option<Picoseconds>,
        host_acted: bool,
    ) -> Option<Picoseconds> {
        // Frames a device sent from a host-side call (a doorbell) since the last step.
        if host_acted {
            let sent = self.statistics.sent;
            self.collect(self.now);
            if self.statistics.sent != sent {
                next = self.next_event_time();
            }
        }
        loop {
            let step = match next {
                Some(next) if next < target => next,
                _ => target,
            };
            self.run_at(step);
            // Computed once per step: it is both the end test and the next step.
            next = self.next_event_time();
            if step == target && !matches!(next, Some(next) if next <= target) {
                return next;
            }
        }
    }

    /// Runs until nothing is pending or the next thing is after `limit`; returns the time
    /// reached (that of the last thing run, not `limit`).
    pub fn run_until_idle(&mut self, limit: Picoseconds) -> Picoseconds {
        self.advance_to(self.now);
        while let Some(next) = self.next_event_time() {
            if next > limit {
                break;
            }
            self.advance_to(next);
        }
        self.now
    }

    /// Starts (`true`) or stops recording every frame as it leaves a device, before
    /// faults. Stopping keeps what was recorded until [`Fabric::take_capture`].
    pub fn set_capture(&mut self, on: bool) {
        self.capture_on = on;
    }

    /// Takes the frames recorded so far, oldest first.
    pub fn take_capture(&mut self) -> Vec<CapturedFrame> {
        std::mem::take(&mut self.capture)
    }

    /// What the fabric did with the frames so far.
    pub fn statistics(&self) -> FabricStatistics {
        self.statistics
    }

    // ---- the loop ---------------------------------------------------------------------

    /// Moves every device to `t`, then takes their frames and delivers what is due, until
    /// nothing more happens at `t`.
    fn run_at(&mut self, t: Picoseconds) {
        self.now = t;
        for port in &mut self.ports {
            port.advance_to(t);
        }
        loop {
            self.collect(t);
            self.release_expired(t);
            if !self.deliver_due(t) {
                break;
            }
        }
    }

    /// Takes every frame the devices sent, in device order, and puts it on the wire at `t`.
    #[inline]
    fn collect(&mut self, t: Picoseconds) {
        for from in 0..self.ports.len() {
            while let Some((frame, icrc)) = self.ports[from].poll_transmit_offloaded() {
                self.launch(from, t, frame, icrc);
            }
        }
    }

    fn deliverable(&self, from: usize, frame: &[u8]) -> bool {
        if frame.len() < ETHERNET_HEADER_LEN {
            return false;
        }
        let destination = &frame[..6];
        if destination[0] & 1 != 0 {
            (0..self.ports.len()).any(|id| id != from)
        } else {
            self.macs.iter().any(|mac| mac[..] == *destination)
        }
    }

    /// Applies the fault plan to one frame sent by `from` at `t` and schedules what is
    /// left of it.
    // Out of line: `collect` runs on every step, a frame is launched on few of them.
    #[inline(never)]
    fn launch(&mut self, from: usize, t: Picoseconds, mut frame: Vec<u8>, mut icrc: Icrc) {
        self.statistics.sent += 1;
        if self.capture_on {
            // Captured bytes are seen outside the process: they carry their ICRC.
            if icrc == Icrc::Offloaded {
                wire::fill_icrc(&mut frame);
                icrc = Icrc::Computed;
            }
            self.capture.push(CapturedFrame {
                time: t,
                from: DeviceId(from),
                bytes: frame.clone(),
            });
        }
        let plan = self.config.faults;
        let fate = plan.decide(&mut self.rng);
        if !self.deliverable(from, &frame) {
            self.statistics.undeliverable += 1;
            self.ports[from].recycle_frame(frame);
            return;
        }
        let chosen = self.drop_rule.as_mut().is_some_and(|rule| rule(DeviceId(from), &frame));
        if fate.lost || chosen {
            self.statistics.dropped += 1;
            self.ports[from].recycle_frame(frame);
            return;
        }

        // The frame travels in the sender's buffer; the sender gets one from the pool.
        let spare = match self.pool.take(frame.len()) {
            Some(buffer) => buffer,
            None => {
                self.pool_allocations += 1;
                // Sized for the largest frame (4 KiB payload and every header), so a pool
                // buffer never has to grow later.
                Vec::with_capacity(frame.len().max(MAX_FRAME_CAPACITY))
            }
        };
        self.ports[from].recycle_frame(spare);
        let mut buffer = frame;

        if fate.corrupted {
            // The receiver must see the damage: the ICRC is computed before it is done,
            // and checked at the other end.
            if icrc == Icrc::Offloaded {
                wire::fill_icrc(&mut buffer);
                icrc = Icrc::Computed;
            }
            if fault::corrupt_frame(&mut buffer, fate.corrupt_choice, fate.corrupt_mask).is_some() {
                self.statistics.corrupted += 1;
            }
        }
        let copies = if fate.duplicated {
            self.statistics.duplicated += 1;
            2
        } else {
            1
        };
        let mut arrival = t + self.config.link_latency;
        if fate.delayed && fate.extra_delay > Picoseconds::ZERO {
            self.statistics.delayed += 1;
            arrival = arrival + fate.extra_delay;
        }
        let frame = InFlight {
            from,
            copies,
            icrc,
            buffer,
        };

        match &mut self.held[from] {
            Some(held) => {
                // This frame overtakes the held one; the last to overtake lets it go.
                held.remaining -= 1;
                let released = held.remaining == 0;
                self.in_flight.push(arrival, frame);
                if released {
                    if let Some(held) = self.held[from].take() {
                        self.held_count -= 1;
                        self.in_flight.push(held.arrival.max(arrival), held.frame);
                    }
                }
            }
            None if fate.reordered && fate.hold_behind > 0 => {
                self.statistics.reordered += 1;
                self.held[from] = Some(Held {
                    remaining: fate.hold_behind,
                    deadline: arrival + plan.max_delay,
                    arrival,
                    frame,
                });
                self.held_count += 1;
            }
            None => self.in_flight.push(arrival, frame),
        }
    }

    /// Lets go the held frames whose sender went quiet, in device order.
    fn release_expired(&mut self, t: Picoseconds) {
        if self.held_count == 0 {
            return;
        }
        for from in 0..self.held.len() {
            if self.held[from].as_ref().is_some_and(|h| h.deadline <= t) {
                if let Some(held) = self.held[from].take() {
                    self.held_count -= 1;
                    self.in_flight.push(held.arrival.max(held.deadline), held.frame);
                }
            }
        }
    }

    /// Delivers every frame due at or before `t`; returns whether there was one.
    fn deliver_due(&mut self, t: Picoseconds) -> bool {
        let mut delivered = false;
        while let Some((_, frame)) = self.in_flight.pop_due(t) {
            self.deliver(frame);
            delivered = true;
        }
        delivered
    }

    fn deliver(&mut self, frame: InFlight) {
        let mut destination = [0u8; 6];
        destination.copy_from_slice(&frame.buffer[..6]);
        let group = destination[0] & 1 != 0;
        let macs = &self.macs;
        let to = |id: usize| {
            if group {
                id != frame.from
            } else {
                macs[id] == destination
            }
        };
        // Every receiver but the last gets a copy; the last one takes the buffer.
        let mut left = frame.copies as usize * (0..self.ports.len()).filter(|&id| to(id)).count();
        let mut buffer = frame.buffer;
        let mut icrc = frame.icrc;
        if left > 1 && icrc == Icrc::Offloaded {
            // Copies go through `receive_frame`, which checks: give them their ICRC.
            wire::fill_icrc(&mut buffer);
            icrc = Icrc::Computed;
        }
        for _ in 0..frame.copies {
            for (id, port) in self.ports.iter_mut().enumerate() {
                if to(id) {
                    left -= 1;
                    if left == 0 {
                        buffer = port.receive_frame_offloaded(buffer, icrc);
                    } else {
                        port.receive_frame(&buffer);
                    }
                    self.statistics.delivered += 1;
                }
            }
        }
        self.pool.give(buffer);
    }
}

/// The earlier of two optional times (`None`: nothing pending).
#[inline]
fn earliest(a: Option<Picoseconds>, b: Option<Picoseconds>) -> Option<Picoseconds> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
