//! Finding RoCEv2 in an Ethernet frame and recomputing its ICRC, written from the rules of
//! the RoCEv2 annex (roce-wire §1.6), independently of the device model's `wire` module:
//! a plain copy of the covered bytes, the variant fields set to ones, one CRC-32 pass.

/// UDP destination port of RoCEv2.
pub const ROCE_V2_PORT: u16 = 4791;

/// BTH opcode of an RC Acknowledge (AETH follows the BTH).
pub const RC_ACKNOWLEDGE: u8 = 0x11;

/// BTH (12) + ICRC (4): the shortest RoCEv2 UDP payload.
const MIN_ROCE_PAYLOAD: usize = 12 + 4;

/// What the checker read from one RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame {
    /// Carried over IPv6 (else IPv4).
    pub ipv6: bool,
    /// BTH opcode.
    pub opcode: u8,
    /// BTH destination QP.
    pub destination_qp: u32,
    /// BTH PSN.
    pub psn: u32,
    /// IP source address (IPv4 as an IPv4-mapped IPv6 address).
    pub source: [u8; 16],
    /// IP destination address (IPv4 as an IPv4-mapped IPv6 address).
    pub destination: [u8; 16],
    /// The AETH syndrome of an RC Acknowledge (opcode 0x11); `None` for other opcodes
    /// or an Acknowledge too short to hold one.
    pub ack_syndrome: Option<u8>,
    /// The UDP checksum as sent (0: none).
    pub udp_checksum: u16,
    /// The ICRC on the wire, read least-significant byte first.
    pub icrc_wire: u32,
    /// The ICRC recomputed here.
    pub icrc_computed: u32,
}

impl RoceFrame {
    /// Whether the ICRC on the wire is the one recomputed.
    pub fn icrc_good(&self) -> bool {
        self.icrc_wire == self.icrc_computed
    }
}

/// A frame, as far as RoCEv2 goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// Not UDP to port 4791 (ARP, neighbour discovery, other traffic).
    NotRoce,
    /// A RoCEv2 frame whose headers are consistent.
    Roce(RoceFrame),
    /// Addressed to port 4791 but not a checkable RoCEv2 frame.
    Malformed(String),
}

/// Classifies an Ethernet frame and recomputes its ICRC if it is RoCEv2.
pub fn classify(frame: &[u8]) -> Classified {
    let Some(mut ethertype) = read_u16(frame, 12) else {
        return Classified::NotRoce;
    };
    let mut ip = 14;
    // 802.1Q and 802.1ad tags, at most two.
    for _ in 0..2 {
        if ethertype != 0x8100 && ethertype != 0x88A8 {
            break;
        }
        let Some(inner) = read_u16(frame, ip + 2) else {
            return Classified::NotRoce;
        };
        ethertype = inner;
        ip += 4;
    }
    let mut source = [0u8; 16];
    let mut destination = [0u8; 16];
    let (ipv6, ip_end, udp) = match ethertype {
        0x0800 => {
            let Some(&first) = frame.get(ip) else {
                return Classified::NotRoce;
            };
            let header = usize::from(first & 0x0F) * 4;
            if first >> 4 != 4 || header < 20 || frame.len() < ip + header || frame[ip + 9] != 17 {
                return Classified::NotRoce;
            }
            let fragment = read_u16(frame, ip + 6).unwrap_or(0);
            if fragment & 0x1FFF != 0 {
                return Classified::NotRoce; // a later fragment: no UDP header
            }
            let total = usize::from(read_u16(frame, ip + 2).unwrap_or(0));
            if read_u16(frame, ip + header + 2) == Some(ROCE_V2_PORT) && fragment & 0x2000 != 0 {
                return Classified::Malformed("a fragmented IPv4 packet (RoCEv2 is never fragmented)".into());
            }
            for (address, at) in [(&mut source, ip + 12), (&mut destination, ip + 16)] {
                address[10] = 0xFF;
                address[11] = 0xFF;
                address[12..].copy_from_slice(&frame[at..at + 4]);
            }
            (false, ip + total, ip + header)
        }
        0x86DD => {
            if frame.len() < ip + 40 || frame[ip + 6] != 17 || frame[ip] >> 4 != 6 {
                return Classified::NotRoce;
            }
            let payload = usize::from(read_u16(frame, ip + 4).unwrap_or(0));
            source.copy_from_slice(&frame[ip + 8..ip + 24]);
            destination.copy_from_slice(&frame[ip + 24..ip + 40]);
            (true, ip + 40 + payload, ip + 40)
        }
        _ => return Classified::NotRoce,
    };
    if read_u16(frame, udp + 2) != Some(ROCE_V2_PORT) {
        return Classified::NotRoce;
    }
    let Some(udp_length) = read_u16(frame, udp + 4).map(usize::from) else {
        return Classified::Malformed("the UDP header is cut short".into());
    };
    if ip_end > frame.len() {
        return Classified::Malformed(format!(
            "the IP packet ends at byte {ip_end}, past the frame's {} bytes",
            frame.len()
        ));
    }
    if udp_length < 8 + MIN_ROCE_PAYLOAD {
        return Classified::Malformed(format!("UDP length {udp_length}: shorter than a BTH and an ICRC"));
    }
    if udp + udp_length != ip_end {
        return Classified::Malformed(format!(
            "UDP length {udp_length} does not fill the IP packet ({} bytes after the IP header)",
            ip_end - udp
        ));
    }
    let icrc_at = udp + udp_length - 4;
    let bth = udp + 8;
    let mut covered = frame[ip..icrc_at].to_vec();
    if ipv6 {
        covered[0] |= 0x0F; // traffic class, high half
        covered[1] = 0xFF; // traffic class, low half, and flow label
        covered[2] = 0xFF;
        covered[3] = 0xFF;
        covered[7] = 0xFF; // hop limit
    } else {
        covered[1] = 0xFF; // TOS (DSCP and ECN)
        covered[8] = 0xFF; // TTL
        covered[10] = 0xFF; // header checksum
        covered[11] = 0xFF;
    }
    let udp_in_covered = udp - ip;
    covered[udp_in_covered + 6] = 0xFF; // UDP checksum
    covered[udp_in_covered + 7] = 0xFF;
    covered[bth - ip + 4] = 0xFF; // FECN, BECN, resv6
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[0xFF; 8]); // the InfiniBand LRH the annex stands in with ones
    hasher.update(&covered);
    let icrc_computed = hasher.finalize();
    let icrc_wire = u32::from_le_bytes([
        frame[icrc_at],
        frame[icrc_at + 1],
        frame[icrc_at + 2],
        frame[icrc_at + 3],
    ]);
    let opcode = frame[bth];
    let ack_syndrome = (opcode == RC_ACKNOWLEDGE && bth + 12 + 4 <= icrc_at).then(|| frame[bth + 12]);
    Classified::Roce(RoceFrame {
        ipv6,
        opcode,
        destination_qp: u32::from_be_bytes([0, frame[bth + 5], frame[bth + 6], frame[bth + 7]]),
        psn: u32::from_be_bytes([0, frame[bth + 9], frame[bth + 10], frame[bth + 11]]),
        source,
        destination,
        ack_syndrome,
        udp_checksum: read_u16(frame, udp + 6).unwrap_or(0),
        icrc_wire,
        icrc_computed,
    })
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::read_capture;

    /// The nine hand-built frames of roce-wire §3.2, their ICRC verdicts in §3.3.
    const TEST_FRAMES: &[u8] = include_bytes!("../../../hw-model/src/wire/testdata/roce-test-frames.pcap");
    /// Linux 6.1 rdma_rxe's RDMA-CM ConnectRequests (pcapng), with ARP and ICMP around them.
    const RXE_CAPTURE: &[u8] = include_bytes!("../../../hw-model/src/wire/testdata/rxe-cm-connect-request.pcapng");

    fn roce(frame: &[u8]) -> RoceFrame {
        match classify(frame) {
            Classified::Roce(found) => found,
            other => panic!("not RoCEv2: {other:?}"),
        }
    }

    #[test]
    fn the_reference_frames_get_the_reference_verdicts() {
        let packets = read_capture(TEST_FRAMES).unwrap();
        let verdicts: Vec<bool> = packets.iter().map(|p| roce(&p.bytes).icrc_good()).collect();
        // Bad: 2 (a flipped ICRC bit), 6 (the same over IPv6), 9 (the ICRC big-endian).
        assert_eq!(verdicts, [true, false, true, true, true, false, true, true, false]);
        let first = roce(&packets[0].bytes);
        assert_eq!(first.icrc_wire, 0x8693_EF6A, "roce-wire §1.6: the value of frame 1");
        assert_eq!((first.opcode, first.destination_qp, first.psn), (0x0A, 0x11, 256));
        assert!(!first.ipv6 && roce(&packets[4].bytes).ipv6);
        assert_eq!(roce(&packets[2].bytes).psn, 0xFF_FFFF);
        // Frame 8 is frame 1 with FECN set after the ICRC: masked, still good.
        assert_eq!(roce(&packets[7].bytes).icrc_computed, first.icrc_computed);
        assert_eq!(first.ack_syndrome, None, "a WRITE holds no AETH");
    }

    #[test]
    fn addresses_and_an_acknowledges_syndrome_are_read() {
        let packets = read_capture(TEST_FRAMES).unwrap();
        let mut frame = packets[0].bytes.clone();
        let v4 = roce(&frame);
        let mapped = |a: &[u8]| {
            let mut m = [0u8; 16];
            m[10] = 0xFF;
            m[11] = 0xFF;
            m[12..].copy_from_slice(a);
            m
        };
        assert_eq!(v4.source, mapped(&frame[14 + 12..14 + 16]));
        assert_eq!(v4.destination, mapped(&frame[14 + 16..14 + 20]));
        let v6_frame = &packets[4].bytes;
        let v6 = roce(v6_frame);
        assert_eq!(v6.source[..], v6_frame[14 + 8..14 + 24]);
        assert_eq!(v6.destination[..], v6_frame[14 + 24..14 + 40]);
        // The same bytes read as an Acknowledge: the syndrome is the byte after the BTH.
        let bth = 14 + 20 + 8;
        frame[bth] = RC_ACKNOWLEDGE;
        frame[bth + 12] = 0x1F;
        assert_eq!(roce(&frame).ack_syndrome, Some(0x1F));
    }

    #[test]
    fn rxes_own_frames_verify() {
        let packets = read_capture(RXE_CAPTURE).unwrap();
        let frames: Vec<RoceFrame> = packets
            .iter()
            .filter_map(|p| match classify(&p.bytes) {
                Classified::Roce(found) => Some(found),
                _ => None,
            })
            .collect();
        assert_eq!(frames.len(), 7);
        assert!(frames
            .iter()
            .all(|f| f.icrc_good() && f.opcode == 0x64 && f.destination_qp == 1));
    }

    #[test]
    fn every_covered_byte_counts_and_every_masked_byte_does_not() {
        let packets = read_capture(TEST_FRAMES).unwrap();
        for (index, ipv6) in [(0, false), (4, true)] {
            let frame = &packets[index].bytes;
            let good = roce(frame).icrc_computed;
            let masked: &[usize] = if ipv6 {
                &[15, 16, 17, 21, 14 + 40 + 6, 14 + 40 + 7, 14 + 40 + 8 + 4]
            } else {
                &[15, 22, 24, 25, 14 + 20 + 6, 14 + 20 + 7, 14 + 20 + 8 + 4]
            };
            let udp = if ipv6 { 14 + 40 } else { 14 + 20 };
            for at in 14..frame.len() - 4 {
                // Lengths, fragment and protocol fields change what the frame is, not just its CRC.
                let structural = if ipv6 {
                    (18..=20).contains(&at)
                } else {
                    (16..=17).contains(&at) || (20..=21).contains(&at) || at == 23
                } || (udp + 2..udp + 6).contains(&at)
                    || at == 14;
                if structural {
                    continue;
                }
                let mut changed = frame.clone();
                changed[at] ^= 0x01;
                let computed = roce(&changed).icrc_computed;
                if masked.contains(&at) {
                    assert_eq!(computed, good, "byte {at} is masked");
                } else {
                    assert_ne!(computed, good, "byte {at} is covered");
                }
            }
        }
    }

    #[test]
    fn frames_to_port_4791_that_cannot_be_checked_are_malformed() {
        let frame = read_capture(TEST_FRAMES).unwrap()[0].bytes.clone();
        let mut short = frame.clone();
        short.truncate(frame.len() - 6);
        assert!(matches!(classify(&short), Classified::Malformed(_)));
        let mut lying = frame.clone();
        lying[14 + 20 + 5] -= 4; // UDP length 4 short of the IP packet
        assert!(matches!(classify(&lying), Classified::Malformed(_)));
        let mut fragment = frame.clone();
        fragment[14 + 6] |= 0x20; // more fragments
        assert!(matches!(classify(&fragment), Classified::Malformed(_)));
        let mut other_port = frame;
        other_port[14 + 20 + 3] = 0x53;
        assert_eq!(classify(&other_port), Classified::NotRoce);
        assert_eq!(classify(&[0u8; 10]), Classified::NotRoce);
    }
}
