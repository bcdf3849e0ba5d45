//! The fault plan of the wire and the one seeded random generator that carries it out.
//!
//! A [`FaultPlan`] says how often the fabric loses, duplicates, reorders, corrupts and
//! delays a frame. Its text form, `loss=0.05,dup=0.01,reorder=0.01,corrupt=0.001,
//! delay=0.01,seed=7`, is what a command line or a test names; [`FaultPlan::parse`] reads
//! it and `Display` writes it back so that the written form parses to the same plan.
//!
//! Every frame that leaves a device takes the same fixed number of draws from one
//! [`FaultRng`] (SplitMix64), in the fabric's deterministic order, whether a fault hits or
//! not: the same seed and the same traffic give the same faults, and changing one
//! probability does not shift the decisions made for the other kinds.

use std::fmt;
use std::str::FromStr;

use crate::time::Picoseconds;

/// How the fabric mistreats frames. Each probability applies independently to each frame
/// that leaves a device; all zero (see [`FaultPlan::none`]) is a perfect wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultPlan {
    /// Probability that a frame is lost.
    pub loss: f64,
    /// Probability that a frame that is not lost arrives twice, back to back.
    pub duplicate: f64,
    /// Probability that a frame is held back so that later frames from the same sender
    /// overtake it (at most [`FaultPlan::reorder_window`] of them).
    pub reorder: f64,
    /// Probability that one byte of a frame past its Ethernet header is flipped.
    pub corrupt: f64,
    /// Probability that a frame arrives up to [`FaultPlan::max_delay`] late.
    pub delay: f64,
    /// The largest extra delay of a delayed frame, and the longest a reordered frame waits
    /// for later frames to overtake it. Default 10 µs.
    pub max_delay: Picoseconds,
    /// Bounded reorder: a reordered frame is held back behind at most this many later
    /// frames of the same sender (the number is drawn from `1..=reorder_window`).
    /// Default 3; 0 turns reordering off.
    pub reorder_window: u32,
    /// Seed of the fault generator.
    pub seed: u64,
}

impl FaultPlan {
    /// Default of [`FaultPlan::max_delay`]: 10 µs.
    pub const DEFAULT_MAX_DELAY: Picoseconds = Picoseconds::from_micros(10);
    /// Default of [`FaultPlan::reorder_window`].
    pub const DEFAULT_REORDER_WINDOW: u32 = 3;

    /// Draws [`FaultPlan::decide`] takes per frame, whatever the plan.
    const DRAWS_PER_FRAME: u64 = 9;

    /// A perfect wire: no fault of any kind, default bounds, seed 0.
    pub const fn none() -> Self {
        Self {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: 0.0,
            max_delay: Self::DEFAULT_MAX_DELAY,
            reorder_window: Self::DEFAULT_REORDER_WINDOW,
            seed: 0,
        }
    }

    /// Whether no fault can ever hit.
    pub fn is_none(&self) -> bool {
        [self.loss, self.duplicate, self.reorder, self.corrupt, self.delay]
            .iter()
            .all(|p| p.is_nan() || *p <= 0.0)
    }

    /// Reads a plan from comma-separated `key=value` items; keys not given keep the value
    /// of [`FaultPlan::none`]. An empty spec or `none` is the perfect wire.
    ///
    /// | key | value |
    /// | --- | --- |
    /// | `loss`, `dup` (or `duplicate`), `reorder`, `corrupt`, `delay` | probability in `[0, 1]` |
    /// | `max_delay` | duration: an integer with unit `ps`, `ns`, `us` or `ms` (no unit: ps) |
    /// | `window` (or `reorder_window`) | integer |
    /// | `seed` | integer, decimal or `0x` hexadecimal |
    ///
    /// An unknown key, a key given twice, an item without `=`, a value that is not a
    /// number or a probability outside `[0, 1]` is an error that names the key.
    pub fn parse(spec: &str) -> Result<Self, FaultPlanError> {
        let mut plan = Self::none();
        let spec = spec.trim();
        if spec.is_empty() || spec == "none" {
            return Ok(plan);
        }
        let mut seen: Vec<Key> = Vec::new();
        for item in spec.split(',') {
            let item = item.trim();
            let Some((key, value)) = item.split_once('=') else {
                return Err(FaultPlanError::MissingValue { item: item.to_owned() });
            };
            let (key, value) = (key.trim(), value.trim());
            let parsed = Key::from_name(key).ok_or_else(|| FaultPlanError::UnknownKey { key: key.to_owned() })?;
            if seen.contains(&parsed) {
                return Err(FaultPlanError::DuplicateKey { key: key.to_owned() });
            }
            seen.push(parsed);
            let bad_number = || FaultPlanError::BadNumber {
                key: key.to_owned(),
                value: value.to_owned(),
            };
            match parsed {
                Key::Loss | Key::Duplicate | Key::Reorder | Key::Corrupt | Key::Delay => {
                    let p: f64 = value.parse().map_err(|_| bad_number())?;
                    if !(0.0..=1.0).contains(&p) {
                        return Err(FaultPlanError::OutOfRange {
                            key: key.to_owned(),
                            value: value.to_owned(),
                        });
                    }
                    *plan.probability_mut(parsed) = p;
                }
                Key::MaxDelay => plan.max_delay = parse_duration(value).ok_or_else(bad_number)?,
                Key::ReorderWindow => plan.reorder_window = value.parse().map_err(|_| bad_number())?,
                Key::Seed => plan.seed = parse_u64(value).ok_or_else(bad_number)?,
            }
        }
        Ok(plan)
    }

    fn probability_mut(&mut self, key: Key) -> &mut f64 {
        match key {
            Key::Loss => &mut self.loss,
            Key::Duplicate => &mut self.duplicate,
            Key::Reorder => &mut self.reorder,
            Key::Corrupt => &mut self.corrupt,
            _ => &mut self.delay,
        }
    }

    /// Draws the fate of one frame. Always takes the same number of draws (nine).
    pub(crate) fn decide(&self, rng: &mut FaultRng) -> Decision {
        if self.is_none() {
            // The perfect wire: no draw can hit, so only the generator moves on (as nine
            // draws move it), without drawing; the fabric's usual case.
            rng.skip(Self::DRAWS_PER_FRAME);
            return Decision::CLEAN;
        }
        Decision {
            lost: rng.hit(self.loss),
            duplicated: rng.hit(self.duplicate),
            reordered: rng.hit(self.reorder),
            corrupted: rng.hit(self.corrupt),
            delayed: rng.hit(self.delay),
            hold_behind: match self.reorder_window {
                0 => {
                    rng.next_u64();
                    0
                }
                window => 1 + (rng.next_u64() % u64::from(window)) as u32,
            },
            corrupt_choice: rng.next_u64(),
            corrupt_mask: 1 + (rng.next_u64() % 255) as u8,
            extra_delay: match self.max_delay.0 {
                0 => {
                    rng.next_u64();
                    Picoseconds::ZERO
                }
                max => Picoseconds(1 + rng.next_u64() % max),
            },
        }
    }
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self::none()
    }
}

impl fmt::Display for FaultPlan {
    /// Every field, in the form [`FaultPlan::parse`] reads back to the same plan:
    /// `loss=0,dup=0,reorder=0,corrupt=0,delay=0,max_delay=10us,window=3,seed=0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{}` of an f64 is the shortest text that parses back to the same value.
        write!(
            f,
            "loss={},dup={},reorder={},corrupt={},delay={},max_delay={},window={},seed={}",
            self.loss,
            self.duplicate,
            self.reorder,
            self.corrupt,
            self.delay,
            DurationText(self.max_delay),
            self.reorder_window,
            self.seed
        )
    }
}

impl FromStr for FaultPlan {
    type Err = FaultPlanError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Why a fault-plan spec was refused; each names the key or item at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultPlanError {
    /// The key is not one of the plan's.
    #[error(
        "fault plan: unknown key `{key}` (expected loss, dup, reorder, corrupt, delay, max_delay, window or seed)"
    )]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// The key was given more than once.
    #[error("fault plan: `{key}` is given twice")]
    DuplicateKey {
        /// The key as written.
        key: String,
    },
    /// An item is not `key=value`.
    #[error("fault plan: `{item}` is not key=value")]
    MissingValue {
        /// The item as written.
        item: String,
    },
    /// The value is not a number of the key's kind.
    #[error("fault plan: `{key}` has bad number `{value}`")]
    BadNumber {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
    },
    /// A probability outside `[0, 1]` (or NaN).
    #[error("fault plan: `{key}` = {value} is not a probability in [0, 1]")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
    },
}

/// The keys of the text form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Loss,
    Duplicate,
    Reorder,
    Corrupt,
    Delay,
    MaxDelay,
    ReorderWindow,
    Seed,
}

impl Key {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "loss" => Key::Loss,
            "dup" | "duplicate" => Key::Duplicate,
            "reorder" => Key::Reorder,
            "corrupt" => Key::Corrupt,
            "delay" => Key::Delay,
            "max_delay" => Key::MaxDelay,
            "window" | "reorder_window" => Key::ReorderWindow,
            "seed" => Key::Seed,
            _ => return None,
        })
    }
}

const UNITS: [(&str, u64); 4] = [("ms", 1_000_000_000), ("us", 1_000_000), ("ns", 1_000), ("ps", 1)];

/// A duration in the largest unit that writes it exactly.
struct DurationText(Picoseconds);

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ps = self.0 .0;
        let (unit, scale) = UNITS
            .iter()
            .copied()
            .find(|(_, scale)| ps / scale * scale == ps)
            .unwrap_or(("ps", 1));
        write!(f, "{}{unit}", ps / scale)
    }
}

fn parse_duration(text: &str) -> Option<Picoseconds> {
    let text = text.trim();
    let (digits, scale) = UNITS
        .iter()
        .chain(&[("µs", 1_000_000)])
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|d| (d, *scale)))
        .unwrap_or((text, 1));
    let value: u64 = digits.trim().parse().ok()?;
    value.checked_mul(scale).map(Picoseconds)
}

fn parse_u64(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// What happens to one frame; drawn by [`FaultPlan::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    pub lost: bool,
    pub duplicated: bool,
    pub reordered: bool,
    pub corrupted: bool,
    pub delayed: bool,
    /// How many later frames overtake the frame if it is reordered (0: reordering off).
    pub hold_behind: u32,
    /// Picks the corrupted byte among the candidates.
    pub corrupt_choice: u64,
    /// Non-zero XOR mask for the corrupted byte.
    pub corrupt_mask: u8,
    /// Extra delay if delayed, in `1..=max_delay` (zero if `max_delay` is zero).
    pub extra_delay: Picoseconds,
}

impl Decision {
    /// Nothing happens to the frame (what every frame of a plan without faults gets).
    const CLEAN: Self = Self {
        lost: false,
        duplicated: false,
        reordered: false,
        corrupted: false,
        delayed: false,
        hold_behind: 0,
        corrupt_choice: 0,
        corrupt_mask: 1,
        extra_delay: Picoseconds::ZERO,
    };
}

/// SplitMix64: the fabric's one source of randomness. Small, fast, and the same sequence
/// on every platform.
#[derive(Debug, Clone)]
pub struct FaultRng {
    state: u64,
}

impl FaultRng {
    /// SplitMix64's state increment per draw.
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Moves on as `draws` calls of [`FaultRng::next_u64`] would, without computing them
    /// (each call adds the same constant to the state).
    pub fn skip(&mut self, draws: u64) {
        self.state = self.state.wrapping_add(Self::GAMMA.wrapping_mul(draws));
    }

    /// A uniform number in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One draw: true with probability `p` (never for `p <= 0` or NaN, always for `p >= 1`).
    pub fn hit(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

// ---- corruption ------------------------------------------------------------------------

/// Length of the Ethernet header of `frame`, counting one 802.1Q tag if present.
pub(crate) fn ethernet_header_len(frame: &[u8]) -> usize {
    const VLAN: u16 = 0x8100;
    match frame.get(12..14) {
        Some(&[a, b]) if u16::from_be_bytes([a, b]) == VLAN => 18,
        _ => 14,
    }
}

/// The bytes of a RoCEv2 frame that the ICRC does not cover (the "variant" fields it
/// masks to ones): flipping one of them would pass the ICRC, so corruption skips them.
/// Empty for frames that are not RoCEv2 (IPv4 or IPv6, UDP to port 4791). At most 8.
fn icrc_masked_bytes(frame: &[u8], l2: usize) -> ([usize; 8], usize) {
    const ETHERTYPE_IPV4: u16 = 0x0800;
    const ETHERTYPE_IPV6: u16 = 0x86DD;
    const UDP: u8 = 17;
    const ROCE_V2_PORT: u16 = 4791;
    let mut masked = [0usize; 8];
    let be16 = |at: usize| frame.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let Some(ethertype) = be16(l2 - 2) else {
        return (masked, 0);
    };
    let (l3_masked, udp): (&[usize], usize) = match ethertype {
        ETHERTYPE_IPV4 => {
            let Some(&version_ihl) = frame.get(l2) else {
                return (masked, 0);
            };
            if frame.get(l2 + 9) != Some(&UDP) {
                return (masked, 0);
            }
            // TOS, TTL, header checksum.
            (&[1, 8, 10, 11], l2 + usize::from(version_ihl & 0x0F) * 4)
        }
        // Traffic class and flow label (bytes 0-3 but the version nibble), hop limit.
        ETHERTYPE_IPV6 if frame.get(l2 + 6) == Some(&UDP) => (&[0, 1, 2, 3, 7], l2 + 40),
        _ => return (masked, 0),
    };
    if be16(udp + 2) != Some(ROCE_V2_PORT) {
        return (masked, 0);
    }
    let mut n = 0;
    let positions = l3_masked
        .iter()
        .map(|offset| l2 + offset)
        // UDP checksum; BTH byte 4 (FECN, BECN, reserved).
        .chain([udp + 6, udp + 7, udp + 8 + 4]);
    for position in positions {
        if position < frame.len() && position >= l2 {
            masked[n] = position;
            n += 1;
        }
    }
    masked[..n].sort_unstable();
    (masked, n)
}

/// Flips one byte of `frame` past its Ethernet header (XOR with the non-zero `mask`),
/// chosen by `choice` uniformly among the bytes a receiver's checks cover (for RoCEv2,
/// the ICRC-covered bytes). Returns the position, or `None` if the frame has no such byte.
pub(crate) fn corrupt_frame(frame: &mut [u8], choice: u64, mask: u8) -> Option<usize> {
    let l2 = ethernet_header_len(frame);
    if frame.len() <= l2 {
        return None;
    }
    let (masked, n) = icrc_masked_bytes(frame, l2);
    let candidates = (frame.len() - l2 - n) as u64;
    if candidates == 0 {
        return None;
    }
    let mut position = l2 + (choice % candidates) as usize;
    // Step over the skipped bytes at or before the position, in ascending order.
    for &skipped in &masked[..n] {
        if skipped <= position {
            position += 1;
        }
    }
    frame[position] ^= mask;
    Some(position)
}

#[cfg(test)]
pub(crate) fn masked_positions(frame: &[u8]) -> Vec<usize> {
    let (masked, n) = icrc_masked_bytes(frame, ethernet_header_len(frame));
    masked[..n].to_vec()
}
