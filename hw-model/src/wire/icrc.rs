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
//! The 32-bit result goes on the wire least-significant byte first ([`to_wire`]). Only the
//! first IP+UDP+BTH bytes (at most 88) are copied, to mask them; the rest streams straight
//! from the packet through one [`crc32fast::Hasher`].

use super::{bth, udp};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Bytes of the all-ones dummy LRH.
const LRH_LEN: usize = 8;
/// Longest masked prefix: dummy LRH + IPv4 header with options + UDP + BTH.
const PREFIX_CAP: usize = LRH_LEN + 60 + udp::HEADER_LEN + bth::HEADER_LEN;

/// The ICRC of an IP packet: `ip_packet` runs from the first byte of the IP header to the
/// last pad byte (the ICRC itself excluded). The IP version comes from the first nibble
/// (6 = IPv6, anything else is read as IPv4 with its IHL). Never panics; on a packet too
/// short to hold its headers it masks what is there.
pub fn icrc(ip_packet: &[u8]) -> u32 {
    IcrcHasher::new(ip_packet).finalize()
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

#[inline]
fn set_ones(prefix: &mut [u8], index: usize) {
    if let Some(byte) = prefix.get_mut(index) {
        *byte = 0xFF;
    }
}

impl IcrcHasher {
    /// Starts an ICRC with `headers`, which must begin with the IP header and contain at
    /// least the IP, UDP and BTH headers (all masked fields); it may run on into the
    /// extension headers and payload. Continue with [`IcrcHasher::update`].
    pub fn new(headers: &[u8]) -> IcrcHasher {
        let first = headers.first().copied().unwrap_or(0x45);
        let is_v6 = first >> 4 == 6;
        let ip_len = if is_v6 {
            40
        } else {
            (usize::from(first & 0x0F) * 4).max(20)
        };
        let masked_len = headers.len().min(ip_len + udp::HEADER_LEN + bth::HEADER_LEN);

        let mut prefix = [0xFFu8; PREFIX_CAP];
        let ip = &mut prefix[LRH_LEN..LRH_LEN + masked_len];
        ip.copy_from_slice(&headers[..masked_len]);
        if is_v6 {
            // Traffic class (low nibble of byte 0 + high nibble of byte 1), flow label (bytes
            // 1-3), hop limit (byte 7).
            if let Some(b) = ip.first_mut() {
                *b |= 0x0F;
            }
            for i in [1, 2, 3, 7] {
                set_ones(ip, i);
            }
        } else {
            // TOS, TTL, header checksum.
            for i in [1, 8, 10, 11] {
                set_ones(ip, i);
            }
        }
        let udp_checksum = ip_len + 6;
        set_ones(ip, udp_checksum);
        set_ones(ip, udp_checksum + 1);
        set_ones(ip, ip_len + udp::HEADER_LEN + bth::RESV8A_OFFSET);

        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&prefix[..LRH_LEN + masked_len]);
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

    /// Reference: mask a copy, CRC the lot (the make_test_frames.py recipe).
    fn reference(ip_packet: &[u8]) -> u32 {
        let mut m = ip_packet.to_vec();
        let ip_len = if m[0] >> 4 == 6 {
            m[0] |= 0x0F;
            for i in [1, 2, 3, 7] {
                m[i] = 0xFF;
            }
            40
        } else {
            for i in [1, 8, 10, 11] {
                m[i] = 0xFF;
            }
            usize::from(m[0] & 0xF) * 4
        };
        m[ip_len + 6] = 0xFF;
        m[ip_len + 7] = 0xFF;
        m[ip_len + 12] = 0xFF;
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
    fn short_input_never_panics() {
        for len in 0..FRAME1_IP.len() {
            let _ = icrc(&FRAME1_IP[..len]);
        }
        let _ = icrc(&[0x4F; 70]);
        let _ = icrc(&[0x6F; 3]);
    }
}
