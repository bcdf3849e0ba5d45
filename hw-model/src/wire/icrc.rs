//! The RoCEv2 invariant CRC (roce-wire §1.6).
//!
//! CRC-32/IEEE (reflected polynomial 0xEDB88320, initial value and final XOR all ones; the
//! zlib and Ethernet FCS CRC) over, in order:
//!
//! 1. eight 0xFF bytes standing in for the InfiniBand LRH;
//! 2. the IP header with the variant fields set to ones: IPv4 TOS (DSCP+ECN), TTL and header
//!    checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with the checksum set to ones;
//! 4. the BTH with byte 4 (FECN, BECN, resv6) set to ones;
//! 5. the extension headers, payload and pad, up to the ICRC (the extent is the UDP length;
//!    Ethernet padding is not covered).
//!
//! The 32-bit result goes on the wire least-significant byte first ([`to_wire`]).
//!
//! Short frames (acknowledgements, small messages) are most of the traffic, and for them the
//! fixed cost dominates, so: the dummy LRH is never hashed (every CRC starts from the
//! constant state after it, [`LRH_STATE`]); the masked fields are a list of at most eight
//! (offset, OR mask) pairs; and each packet is hashed in one pass. [`icrc`] copies a packet
//! of at most [`ONE_PASS_LEN`] bytes to the stack to mask it, longer ones stream all but the
//! masked headers straight from the packet; [`icrc_masking_in_place`] (for a frame being
//! emitted) masks the packet itself and restores it.

use std::sync::OnceLock;

use super::{bth, udp};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// The CRC state (in `crc32fast`'s convention: the value `finalize` would return) after the
/// eight 0xFF bytes of the dummy LRH: `crc32fast::hash(&[0xFF; 8])`, the complement of rxe's
/// seed 0xDEBB20E3.
pub const LRH_STATE: u32 = 0x2144_DF1C;
/// Longest packet [`icrc`] masks in a stack copy and hashes in one pass.
pub const ONE_PASS_LEN: usize = 128;
/// Longest masked prefix: IPv4 header with options + UDP + BTH.
const PREFIX_CAP: usize = 60 + udp::HEADER_LEN + bth::HEADER_LEN;

/// A hasher in the state after the dummy LRH. The CPU-feature probe of
/// `crc32fast::Hasher::new` runs once; every ICRC clones the result.
fn lrh_hasher() -> crc32fast::Hasher {
    static TEMPLATE: OnceLock<crc32fast::Hasher> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| crc32fast::Hasher::new_with_initial(LRH_STATE))
        .clone()
}

/// The variant bytes of an IP packet's headers: eight offsets from the start of the IP
/// header, each ORed with its mask (0xFF sets the byte to ones; 0x0F the low nibble, the
/// IPv6 traffic class's first half). IPv4 has seven; its eighth entry repeats the first,
/// which is harmless for masking and, as [`icrc_masking_in_place`] saves every byte before
/// masking any, for restoring.
struct MaskedBytes {
    offsets: [usize; 8],
    masks: [u8; 8],
    /// Bytes from the start of the IP header to the end of the BTH.
    headers_len: usize,
}

impl MaskedBytes {
    /// The variant bytes of a packet whose IP header starts with `first` (6 in the high
    /// nibble = IPv6, anything else is read as IPv4 with its IHL, at least 5).
    #[inline(always)]
    fn of(first: u8) -> MaskedBytes {
        const FF: u8 = 0xFF;
        // UDP checksum (2 bytes) and BTH byte 4 (FECN, BECN, resv6) follow the IP header.
        let udp = 6;
        let bth = udp::HEADER_LEN + bth::RESV8A_OFFSET;
        if first >> 4 == 6 {
            // Traffic class (low nibble of byte 0 + high nibble of byte 1), flow label (bytes
            // 1-3), hop limit (byte 7).
            let ip = 40;
            MaskedBytes {
                offsets: [0, 1, 2, 3, 7, ip + udp, ip + udp + 1, ip + bth],
                masks: [0x0F, FF, FF, FF, FF, FF, FF, FF],
                headers_len: ip + udp::HEADER_LEN + bth::HEADER_LEN,
            }
        } else {
            // TOS, TTL, header checksum.
            let ip = (usize::from(first & 0x0F) * 4).max(20);
            MaskedBytes {
                offsets: [1, 8, 10, 11, ip + udp, ip + udp + 1, ip + bth, 1],
                masks: [FF; 8],
                headers_len: ip + udp::HEADER_LEN + bth::HEADER_LEN,
            }
        }
    }

    /// Masks the bytes of `packet` that are there (a truncated packet has fewer).
    #[inline(always)]
    fn apply(&self, packet: &mut [u8]) {
        if packet.len() >= self.headers_len {
            // The common case, every offset in bounds: no per-byte branch.
            for (offset, mask) in self.offsets.into_iter().zip(self.masks) {
                packet[offset] |= mask;
            }
        } else {
            for (offset, mask) in self.offsets.into_iter().zip(self.masks) {
                if let Some(byte) = packet.get_mut(offset) {
                    *byte |= mask;
                }
            }
        }
    }
}

/// The ICRC of an IP packet: `ip_packet` runs from the first byte of the IP header to the
/// last pad byte (the ICRC itself excluded). The IP version comes from the first nibble
/// (6 = IPv6, anything else is read as IPv4 with its IHL). Never panics; on a packet too
/// short to hold its headers it masks what is there.
pub fn icrc(ip_packet: &[u8]) -> u32 {
    if ip_packet.len() > ONE_PASS_LEN {
        return IcrcHasher::new(ip_packet).finalize();
    }
    let mut copy = [0u8; ONE_PASS_LEN];
    let copy = &mut copy[..ip_packet.len()];
    copy.copy_from_slice(ip_packet);
    // IPv6 and IPv4 without options (all this device sends or accepts) get their own
    // copy of the masking with constant offsets; anything else takes the general one.
    match copy.first().copied() {
        Some(0x60..=0x6F) => MaskedBytes::of(0x60).apply(copy),
        Some(0x45) => MaskedBytes::of(0x45).apply(copy),
        first => MaskedBytes::of(first.unwrap_or(0x45)).apply(copy),
    }
    let mut hasher = lrh_hasher();
    hasher.update(copy);
    hasher.finalize()
}

/// [`icrc`] of `ip_packet`, computed by setting its variant fields to ones in place,
/// hashing it in one pass and putting the fields back: `ip_packet` is unchanged
/// afterwards. For a frame being emitted, which is writable and needs no copy.
pub fn icrc_masking_in_place(ip_packet: &mut [u8]) -> u32 {
    // As in `icrc`: constant offsets for the two usual first bytes.
    match ip_packet.first().copied() {
        Some(0x60..=0x6F) => hash_masked_in_place(ip_packet, MaskedBytes::of(0x60)),
        Some(0x45) => hash_masked_in_place(ip_packet, MaskedBytes::of(0x45)),
        Some(first) => hash_masked_in_place(ip_packet, MaskedBytes::of(first)),
        None => icrc(ip_packet),
    }
}

#[inline(always)]
fn hash_masked_in_place(ip_packet: &mut [u8], masked: MaskedBytes) -> u32 {
    if ip_packet.len() < masked.headers_len {
        return icrc(ip_packet);
    }
    let mut saved = [0u8; 8];
    for (keep, offset) in saved.iter_mut().zip(masked.offsets) {
        *keep = ip_packet[offset];
    }
    masked.apply(ip_packet);
    let mut hasher = lrh_hasher();
    hasher.update(ip_packet);
    for (offset, byte) in masked.offsets.into_iter().zip(saved) {
        ip_packet[offset] = byte;
    }
    hasher.finalize()
}

/// The four wire bytes of an ICRC value (little-endian).
#[inline]
pub const fn to_wire(icrc: u32) -> [u8; 4] {
    icrc.to_le_bytes()
}

/// The ICRC value of four wire bytes (little-endian).
#[inline]
pub const fn from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// Streaming ICRC, for packets whose payload is not contiguous with the headers (e.g.
/// gathered from several host buffers).
#[derive(Clone)]
pub struct IcrcHasher {
    hasher: crc32fast::Hasher,
}

impl IcrcHasher {
    /// Starts an ICRC with `headers`, which must begin with the IP header and contain at
    /// least the IP, UDP and BTH headers (all masked fields); it may run on into the
    /// extension headers and payload. Continue with [`IcrcHasher::update`].
    pub fn new(headers: &[u8]) -> IcrcHasher {
        let masked = MaskedBytes::of(headers.first().copied().unwrap_or(0x45));
        let masked_len = headers.len().min(masked.headers_len);
        let mut prefix = [0u8; PREFIX_CAP];
        let prefix = &mut prefix[..masked_len];
        prefix.copy_from_slice(&headers[..masked_len]);
        masked.apply(prefix);
        let mut hasher = lrh_hasher();
        hasher.update(prefix);
        hasher.update(&headers[masked_len..]);
        IcrcHasher { hasher }
    }

    /// Adds bytes that follow (extension headers, payload, pad), unmasked.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// The ICRC value (write it with [`to_wire`]).
    pub fn finalize(self) -> u32 {
        self.hasher.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    /// Oracle test frame 1 (make_test_frames.py) from the IPv4 header to the end of the
    /// payload; its ICRC is 0x8693EF6A, on the wire 6A EF 93 86 (roce-wire §1.6, §3.3).
    const FRAME1_IP: [u8; 68] = [
        0x45, 0x02, 0x00, 0x48, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0xa5, 0x1b, 0xc0, 0xa8, 0x01, 0x01, 0xc0, 0xa8,
        0x01, 0x02, // IPv4
        0xc0, 0xde, 0x12, 0xb7, 0x00, 0x34, 0x00, 0x00, // UDP
        0x0a, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x01, 0x00, // BTH
        0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0xab, 0xcd, 0, 0, 0, 0x0c, // RETH
        b'h', b'e', b'l', b'l', b'o', b'-', b'r', b'o', b'c', b'e', b'!', b'!',
    ];

    /// Reference: mask a copy, CRC the lot (the make_test_frames.py recipe), masking only
    /// the bytes a truncated packet has; IPv4 headers are at least 20 bytes.
    fn reference(ip_packet: &[u8]) -> u32 {
        let mut m = ip_packet.to_vec();
        let mut set = |i: usize, mask: u8| {
            if let Some(b) = m.get_mut(i) {
                *b |= mask;
            }
        };
        let v6 = ip_packet.first().is_some_and(|b| b >> 4 == 6);
        let ip_len = if v6 {
            set(0, 0x0F);
            for i in [1, 2, 3, 7] {
                set(i, 0xFF);
            }
            40
        } else {
            for i in [1, 8, 10, 11] {
                set(i, 0xFF);
            }
            (usize::from(ip_packet.first().map_or(5, |b| b & 0xF)) * 4).max(20)
        };
        set(ip_len + 6, 0xFF);
        set(ip_len + 7, 0xFF);
        set(ip_len + 12, 0xFF);
        let mut all = vec![0xFF; 8];
        all.extend_from_slice(&m);
        crc32fast::hash(&all)
    }

    #[test]
    fn known_frame_icrc() {
        assert_eq!(icrc(&FRAME1_IP), 0x8693_EF6A);
        assert_eq!(to_wire(icrc(&FRAME1_IP)), [0x6A, 0xEF, 0x93, 0x86]);
        assert_eq!(from_wire([0x6A, 0xEF, 0x93, 0x86]), 0x8693_EF6A);
    }

    #[test]
    fn rxe_seed_is_the_state_after_the_dummy_lrh() {
        // rxe seeds a raw (non-inverted) crc32_le with 0xDEBB20E3 (roce-wire §1.6).
        assert_eq!(!crc32fast::hash(&[0xFF; 8]), 0xDEBB_20E3);
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let base = icrc(&FRAME1_IP);
        for (index, xor) in [
            (1, 0xFF),
            (8, 0x3F),
            (10, 0x12),
            (11, 0x34),
            (26, 0xAB),
            (27, 0xCD),
            (32, 0xC0),
        ] {
            let mut p = FRAME1_IP;
            p[index] ^= xor;
            assert_eq!(icrc(&p), base, "byte {index}");
        }
        for index in (0..FRAME1_IP.len()).filter(|i| ![1, 8, 10, 11, 26, 27, 32].contains(i)) {
            let mut p = FRAME1_IP;
            p[index] ^= 0x01;
            assert_ne!(icrc(&p), base, "byte {index}");
        }
    }

    #[test]
    fn matches_reference_and_streams() {
        let mut rng = XorShift::new(0x1C2C);
        for n in 0..300 {
            let v6 = n % 2 == 1;
            let ip_len = if v6 { 40 } else { 20 + 4 * (n % 3) };
            let mut p = vec![0u8; ip_len + 20 + rng.below(80)];
            rng.fill(&mut p);
            p[0] = if v6 {
                0x60 | (p[0] & 0x0F)
            } else {
                0x40 | (ip_len / 4) as u8
            };
            let expected = reference(&p);
            assert_eq!(icrc(&p), expected, "case {n}");
            let split = ip_len + 20 + rng.below(p.len() - ip_len - 20 + 1);
            let mut h = IcrcHasher::new(&p[..split]);
            h.update(&p[split..]);
            assert_eq!(h.finalize(), expected, "case {n} split {split}");
        }
    }

    #[test]
    fn lrh_state_is_the_crc_of_eight_ones() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), LRH_STATE);
    }

    /// The one-pass copy, the in-place masking and the streaming hasher against the
    /// straightforward computation, on seeded random packets: IPv4 with every IHL (also
    /// the invalid ones below 5), IPv6, whole and truncated, on both sides of
    /// `ONE_PASS_LEN`.
    #[test]
    fn every_path_matches_the_reference_on_random_packets() {
        let mut rng = XorShift::new(0x1C2C_0DD5);
        for n in 0..3000 {
            let len = match n % 3 {
                0 => rng.below(100),
                1 => rng.below(ONE_PASS_LEN + 40),
                _ => rng.below(600),
            };
            let mut p = vec![0u8; len];
            rng.fill(&mut p);
            if let Some(first) = p.first_mut() {
                *first = if n % 2 == 0 {
                    0x60 | (*first & 0x0F)
                } else {
                    0x40 | (*first & 0x0F)
                };
            }
            let expected = reference(&p);
            assert_eq!(icrc(&p), expected, "case {n} one pass, length {len}");
            let before = p.clone();
            assert_eq!(
                icrc_masking_in_place(&mut p),
                expected,
                "case {n} in place, length {len}"
            );
            assert_eq!(p, before, "case {n}: the in-place ICRC restores the packet");
            let split = rng.below(len + 1);
            let mut h = IcrcHasher::new(&p[..split]);
            h.update(&p[split..]);
            if split >= MaskedBytes::of(p.first().copied().unwrap_or(0x45)).headers_len.min(len) {
                assert_eq!(h.finalize(), expected, "case {n} streamed, split {split}");
            }
        }
    }

    #[test]
    fn short_input_never_panics() {
        for len in 0..FRAME1_IP.len() {
            let _ = icrc(&FRAME1_IP[..len]);
        }
        let _ = icrc(&[0x4F; 70]);
        let _ = icrc(&[0x6F; 3]);
        let _ = icrc_masking_in_place(&mut []);
        let _ = icrc_masking_in_place(&mut [0x4F; 70]);
        let _ = icrc_masking_in_place(&mut [0x6F; 3]);
        let _ = IcrcHasher::new(&[]).finalize();
    }
}
