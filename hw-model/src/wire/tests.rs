//! Whole-frame tests: oracle frames, masked fields, corruption, round trips, robustness,
//! and the external tshark + Lua ICRC oracle on frames this module emits.

use super::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use super::test_util::{pcap_frames, pcapng_frames, XorShift};
use super::*;

const ORACLE_FRAMES: &[u8] = include_bytes!("testdata/roce-test-frames.pcap");
const RXE_CAPTURE: &[u8] = include_bytes!("testdata/rxe-cm-connect-request.pcapng");

const ETH_LEN: usize = 14;
const IP4_LEN: usize = 20;

fn oracle_frames() -> Vec<&'static [u8]> {
    let frames = pcap_frames(ORACLE_FRAMES);
    assert_eq!(frames.len(), 9);
    frames
}

fn rxe_roce_frames() -> Vec<&'static [u8]> {
    pcapng_frames(RXE_CAPTURE)
        .into_iter()
        .filter(|f| f.len() > 42 && f[12..14] == [0x08, 0x00] && f[23] == 17 && f[36..38] == [0x12, 0xb7])
        .collect()
}

fn ipv4_example(ttl: u8) -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        source: [192, 168, 1, 1],
        destination: [192, 168, 1, 2],
        dscp: 0,
        ecn: 2,
        ttl,
        identification: 0x1234,
        dont_fragment: true,
    })
}

fn ethernet_example() -> EthernetRepr {
    EthernetRepr {
        destination: [2, 0, 0, 0, 0, 2],
        source: [2, 0, 0, 0, 0, 1],
        vlan: None,
        ethertype: ETHERTYPE_IPV4,
    }
}

/// The repr of oracle frame 1: IPv4 RC RDMA WRITE ONLY, "hello-roce!!".
fn frame1_repr() -> RoceRepr {
    let bth = BthRepr {
        ack_request: true,
        ..BthRepr::new(BthOpcode::RC_RDMA_WRITE_ONLY, 0x11, 0x100)
    };
    RoceRepr {
        reth: Some(RethRepr {
            virtual_address: 0x1000,
            rkey: 0xabcd,
            dma_length: 12,
        }),
        ..RoceRepr::new(ethernet_example(), ipv4_example(64), 0xc0de, bth)
    }
}

/// Rewrites the checksum of the 20-byte IPv4 header at `ip_start` (whatever its IHL says).
fn recompute_ipv4_checksum(frame: &mut [u8], ip_start: usize) {
    let header = &mut frame[ip_start..ip_start + IP4_LEN];
    header[10..12].copy_from_slice(&[0, 0]);
    let sum = ipv4::checksum(header);
    header[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// A random but valid repr and payload for `op`.
fn random_frame(rng: &mut XorShift, op: BthOpcode) -> (RoceRepr, Vec<u8>) {
    let ip = if rng.bool() {
        IpRepr::V4(Ipv4Repr {
            source: rng.bytes(),
            destination: rng.bytes(),
            dscp: rng.u8() & 0x3F,
            ecn: rng.u8() & 3,
            ttl: rng.u8(),
            identification: rng.u16(),
            dont_fragment: rng.bool(),
        })
    } else {
        IpRepr::V6(Ipv6Repr {
            source: rng.bytes(),
            destination: rng.bytes(),
            traffic_class: rng.u8(),
            flow_label: rng.u32() & 0xF_FFFF,
            hop_limit: rng.u8(),
        })
    };
    let ethernet = EthernetRepr {
        destination: rng.bytes(),
        source: rng.bytes(),
        vlan: rng.bool().then(|| VlanTag::from_tci(rng.u16())),
        ethertype: ip.ethertype(),
    };
    let bth = BthRepr {
        opcode: op,
        solicited: rng.bool(),
        migration: rng.bool(),
        pad_count: 0,
        transport_version: 0,
        partition_key: rng.u16(),
        fecn: rng.bool(),
        becn: rng.bool(),
        destination_qp: rng.u32() & 0xFF_FFFF,
        ack_request: rng.bool(),
        psn: rng.u32() & 0xFF_FFFF,
    };
    let headers = op.headers();
    let mut repr = RoceRepr::new(ethernet, ip, rng.u16(), bth);
    if headers.contains(ExtHeaders::RETH) {
        repr.reth = Some(RethRepr {
            virtual_address: rng.next_u64(),
            rkey: rng.u32(),
            dma_length: rng.u32(),
        });
    }
    if headers.contains(ExtHeaders::AETH) {
        repr.aeth = Some(AethRepr {
            syndrome: rng.u8(),
            msn: rng.u32() & 0xFF_FFFF,
        });
    }
    if headers.contains(ExtHeaders::ATOMIC_ETH) {
        repr.atomic_eth = Some(AtomicEthRepr {
            virtual_address: rng.next_u64(),
            rkey: rng.u32(),
            swap_or_add: rng.next_u64(),
            compare: rng.next_u64(),
        });
    }
    if headers.contains(ExtHeaders::ATOMIC_ACK_ETH) {
        repr.atomic_ack = Some(rng.next_u64());
    }
    if headers.contains(ExtHeaders::IMMDT) {
        repr.immediate = Some(rng.u32());
    }
    if headers.contains(ExtHeaders::IETH) {
        repr.invalidate_rkey = Some(rng.u32());
    }
    if headers.contains(ExtHeaders::DETH) {
        repr.deth = Some(DethRepr {
            qkey: rng.u32(),
            source_qp: rng.u32() & 0xFF_FFFF,
        });
    }
    let payload_len = if op == BthOpcode::RC_ATOMIC_WRITE {
        8
    } else if op.has_payload() {
        match rng.below(4) {
            0 => 0,
            1 => rng.below(8),
            2 => rng.below(300),
            _ => 1024 + rng.below(3100),
        }
    } else {
        0
    };
    let mut payload = vec![0u8; payload_len];
    rng.fill(&mut payload);
    (repr, payload)
}

/// Every opcode `RoceRepr` can carry.
fn supported_opcodes() -> Vec<BthOpcode> {
    BthOpcode::all_known().filter(|op| *op != BthOpcode::RC_FLUSH).collect()
}

fn expected_after_parse(repr: &RoceRepr, payload_len: usize) -> RoceRepr {
    let mut expected = *repr;
    expected.bth.pad_count = (payload_len.wrapping_neg() & 3) as u8;
    expected.ethernet.ethertype = repr.ip.ethertype();
    expected
}

#[test]
fn oracle_frames_parse_and_verify() {
    let frames = oracle_frames();

    let f1 = parse_frame(frames[0]).unwrap();
    assert_eq!(f1.repr, frame1_repr());
    assert_eq!(f1.payload, b"hello-roce!!");

    assert_eq!(
        parse_frame(frames[1]),
        Err(WireError::BadIcrc {
            computed: 0x8693_EF6A,
            found: 0x8693_EF6B
        })
    );

    let f3 = parse_frame(frames[2]).unwrap();
    assert_eq!(f3.repr.bth.opcode, BthOpcode::RC_SEND_ONLY);
    assert_eq!((f3.repr.bth.pad_count, f3.repr.bth.psn), (1, 0xFF_FFFF));
    assert_eq!(f3.payload, b"abc");
    match f3.repr.ip {
        IpRepr::V4(ip) => assert_eq!((ip.dscp, ip.ecn, ip.ttl), (46, 0, 3)),
        other => panic!("{other:?}"),
    }

    let f4 = parse_frame(frames[3]).unwrap();
    assert_eq!(f4.repr.bth.opcode, BthOpcode::RC_ACKNOWLEDGE);
    assert_eq!(f4.repr.aeth, Some(AethRepr::ack(aeth::UNLIMITED_CREDITS, 1)));
    assert_eq!(f4.repr.aeth.unwrap().kind(), AethKind::Ack { credits: 31 });
    assert!(f4.payload.is_empty());

    let f5 = parse_frame(frames[4]).unwrap();
    match f5.repr.ip {
        IpRepr::V6(ip) => {
            assert_eq!((ip.traffic_class, ip.flow_label, ip.hop_limit), (0x02, 0x12345, 64));
            assert_eq!(ip.source[..2], [0xfe, 0x80]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(f5.repr.ethernet.ethertype, ETHERTYPE_IPV6);
    assert_eq!(f5.repr.reth, frame1_repr().reth);
    assert_eq!(f5.payload, b"hello-roce!!");

    assert!(matches!(parse_frame(frames[5]), Err(WireError::BadIcrc { .. })));

    let f7 = parse_frame(frames[6]).unwrap();
    assert_eq!(f7.repr.bth.opcode, BthOpcode::UD_SEND_ONLY);
    assert_eq!(
        f7.repr.deth,
        Some(DethRepr {
            qkey: deth::GSI_QKEY,
            source_qp: 1
        })
    );
    assert_eq!(f7.payload, [0u8; 8]);

    let f8 = parse_frame(frames[7]).unwrap();
    assert!(f8.repr.bth.fecn && !f8.repr.bth.becn);
    assert_eq!(
        f8.repr,
        RoceRepr {
            bth: BthRepr {
                fecn: true,
                ..f1.repr.bth
            },
            ..f1.repr
        }
    );

    // Frame 9: the ICRC written big-endian is rejected.
    assert_eq!(
        parse_frame(frames[8]),
        Err(WireError::BadIcrc {
            computed: 0x8693_EF6A,
            found: 0x6AEF_9386
        })
    );
}

#[test]
fn emit_reproduces_oracle_frames() {
    let frames = oracle_frames();
    let mut out = Vec::new();
    // IPv4 frames with UDP checksum 0 come back byte for byte (frame 8 with FECN too).
    for index in [0, 2, 3, 6, 7] {
        let parsed = parse_frame(frames[index]).unwrap();
        emit_frame(&parsed.repr, parsed.payload, &mut out);
        assert_eq!(out, frames[index], "frame {}", index + 1);
        assert_eq!(frame_length(&parsed.repr, parsed.payload.len()), frames[index].len());
    }
    // The IPv6 frame carries a real UDP checksum; everything else is identical.
    let parsed = parse_frame(frames[4]).unwrap();
    emit_frame(&parsed.repr, parsed.payload, &mut out);
    let checksum = ETH_LEN + 40 + 6;
    assert_eq!(out[..checksum], frames[4][..checksum]);
    assert_eq!(out[checksum..checksum + 2], [0, 0]);
    assert_eq!(out[checksum + 2..], frames[4][checksum + 2..]);
    // Known bytes from a repr written by hand.
    emit_frame(&frame1_repr(), b"hello-roce!!", &mut out);
    assert_eq!(out, frames[0]);
}

#[test]
fn rxe_capture_parses_and_verifies() {
    let all = pcapng_frames(RXE_CAPTURE);
    let roce = rxe_roce_frames();
    assert_eq!(roce.len(), 7);
    let mut out = Vec::new();
    for (i, frame) in roce.iter().enumerate() {
        let parsed = parse_frame(frame).unwrap_or_else(|e| panic!("rxe frame {i}: {e}"));
        let repr = parsed.repr;
        assert_eq!(repr.bth.opcode, BthOpcode::UD_SEND_ONLY);
        assert_eq!(repr.bth.destination_qp, 1);
        assert_eq!(repr.bth.partition_key, 0xFFFF);
        assert_eq!(
            repr.deth,
            Some(DethRepr {
                qkey: deth::GSI_QKEY,
                source_qp: 1
            })
        );
        assert_eq!(repr.udp_source_port, 0xd872);
        match repr.ip {
            IpRepr::V4(ip) => {
                assert_eq!((ip.source, ip.destination), ([10, 99, 0, 2], [10, 99, 0, 1]));
                assert!(ip.dont_fragment);
            }
            other => panic!("{other:?}"),
        }
        // One 256-byte MAD: base version 1, class 7 (CM), class version 2, ConnectRequest.
        assert_eq!(parsed.payload.len(), 256);
        assert_eq!(parsed.payload[..4], [1, 7, 2, 3]);
        // Attribute: ConnectRequest, or the Reject rxe sends when a REQ timed out.
        assert!(
            matches!(parsed.payload[16..18], [0x00, 0x10] | [0x00, 0x12]),
            "{:?}",
            &parsed.payload[16..18]
        );
        // rxe sends UDP checksum 0 over IPv4, so the model re-creates the frame exactly.
        emit_frame(&repr, parsed.payload, &mut out);
        assert_eq!(&out[..], *frame, "rxe frame {i}");
    }
    // Everything else in the capture (ARP, ICMP, ICMPv6 with hop-by-hop options) is not RoCE.
    let others: Vec<_> = all.iter().filter(|f| !roce.contains(f)).collect();
    assert_eq!(others.len(), all.len() - 7);
    for frame in others {
        assert!(
            matches!(parse_frame(frame), Err(WireError::NotRoce { .. })),
            "{:?}",
            parse_frame(frame)
        );
    }
}

#[test]
fn masked_fields_still_verify() {
    let frames = oracle_frames();
    let v4 = frames[0];
    let ip = ETH_LEN;
    let bth = ETH_LEN + IP4_LEN + 8;
    let icrc_of = |f: &[u8]| icrc::icrc(&f[ETH_LEN..f.len() - 4]);
    let reference = icrc_of(v4);

    // IPv4 TTL, DSCP and ECN rewritten by a router that fixes the header checksum.
    for (offset, xor) in [(8, 0x3F), (1, 0xFC), (1, 0x03)] {
        let mut f = v4.to_vec();
        f[ip + offset] ^= xor;
        recompute_ipv4_checksum(&mut f, ip);
        assert_eq!(icrc_of(&f), reference);
        let parsed = parse_frame(&f).unwrap();
        assert_eq!(parsed.payload, b"hello-roce!!");
    }
    // IPv4 header checksum changed: ICRC still verifies; the IP layer rejects the frame first.
    let mut f = v4.to_vec();
    f[ip + 10] ^= 0x55;
    assert_eq!(icrc_of(&f), reference);
    assert_eq!(parse_frame(&f), Err(WireError::BadIpChecksum));
    // UDP checksum, FECN, BECN and resv6.
    for (offset, value) in [
        (ETH_LEN + IP4_LEN + 6, 0x12),
        (ETH_LEN + IP4_LEN + 7, 0x34),
        (bth + 4, 0x80),
        (bth + 4, 0x40),
    ] {
        let mut f = v4.to_vec();
        f[offset] ^= value;
        assert!(parse_frame(&f).is_ok(), "offset {offset}");
    }
    let mut f = v4.to_vec();
    f[bth + 4] = 0xFF;
    let parsed = parse_frame(&f).unwrap();
    assert!(parsed.repr.bth.fecn && parsed.repr.bth.becn);

    // IPv6 traffic class, flow label and hop limit.
    let v6 = frames[4];
    for (offset, xor) in [(0, 0x0F), (1, 0xF0), (1, 0x0F), (2, 0xFF), (3, 0x01), (7, 0x20)] {
        let mut f = v6.to_vec();
        f[ETH_LEN + offset] ^= xor;
        let parsed = parse_frame(&f).unwrap_or_else(|e| panic!("IPv6 offset {offset}: {e}"));
        assert_eq!(parsed.payload, b"hello-roce!!");
    }
    let mut f = v6.to_vec();
    f[ETH_LEN + 1..ETH_LEN + 4].copy_from_slice(&[0x0A, 0xBC, 0xDE]);
    match parse_frame(&f).unwrap().repr.ip {
        IpRepr::V6(ip) => assert_eq!(ip.flow_label, 0xABCDE),
        other => panic!("{other:?}"),
    }
}

/// Offsets (from the IP header) of fields whose change makes the frame structurally invalid
/// (or not RoCE) before the ICRC is checked.
fn structural(v6: bool, offset: usize) -> bool {
    if v6 {
        matches!(offset, 0 | 4 | 5 | 6 | 42 | 43 | 44 | 45)
    } else {
        matches!(offset, 0 | 2 | 3 | 6 | 7 | 9 | 22 | 23 | 24 | 25)
    }
}

fn masked(v6: bool, offset: usize, xor: u8) -> bool {
    let ip_len = if v6 { 40 } else { 20 };
    let ip_masked = if v6 {
        (offset == 0 && xor & 0xF0 == 0) || matches!(offset, 1..=3 | 7)
    } else {
        matches!(offset, 1 | 8 | 10 | 11)
    };
    ip_masked || offset == ip_len + 6 || offset == ip_len + 7 || offset == ip_len + 8 + 4
}

#[test]
fn any_other_byte_changed_fails() {
    let frames = oracle_frames();
    let mut rng = XorShift::new(0xBAD1C4C);
    let mut checked = 0;
    for (frame, v6) in [
        (frames[0], false),
        (frames[2], false),
        (frames[3], false),
        (frames[4], true),
        (frames[6], false),
    ] {
        for offset in 0..frame.len() - ETH_LEN {
            for xor in [0x01, 0x80, rng.u8() | 1] {
                let mut f = frame.to_vec();
                f[ETH_LEN + offset] ^= xor;
                if !v6 && matches!(offset, 10 | 11) {
                    // The IPv4 checksum is masked out of the ICRC, but the IP layer checks it.
                    assert_eq!(parse_frame(&f), Err(WireError::BadIpChecksum));
                    assert_eq!(
                        icrc::icrc(&f[ETH_LEN..f.len() - 4]),
                        icrc::icrc(&frame[ETH_LEN..frame.len() - 4])
                    );
                    continue;
                }
                if !v6 {
                    // A NAT-like rewriter fixes the IPv4 header checksum: only the ICRC can tell.
                    recompute_ipv4_checksum(&mut f, ETH_LEN);
                }
                let result = parse_frame(&f);
                if masked(v6, offset, xor) {
                    assert!(result.is_ok(), "masked offset {offset} xor {xor:#x}: {result:?}");
                } else if structural(v6, offset) {
                    assert!(result.is_err(), "structural offset {offset} xor {xor:#x}");
                } else {
                    assert!(
                        matches!(result, Err(WireError::BadIcrc { .. })),
                        "offset {offset} xor {xor:#x}: {result:?}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 500);
    // MAC addresses are not covered by the ICRC (the FCS protects them).
    let mut f = frames[0].to_vec();
    f[0] ^= 1;
    assert!(parse_frame(&f).is_ok());
}

#[test]
fn big_endian_icrc_is_rejected() {
    let mut rng = XorShift::new(0xB1E);
    let mut out = Vec::new();
    for op in supported_opcodes() {
        let (repr, payload) = random_frame(&mut rng, op);
        emit_frame(&repr, &payload, &mut out);
        let n = out.len();
        let wire = [out[n - 4], out[n - 3], out[n - 2], out[n - 1]];
        if wire[0] == wire[3] && wire[1] == wire[2] {
            continue; // a palindrome reads the same both ways
        }
        out[n - 4..].reverse();
        let computed = u32::from_le_bytes(wire);
        assert_eq!(
            parse_frame(&out),
            Err(WireError::BadIcrc {
                computed,
                found: u32::from_be_bytes(wire)
            }),
            "{op}"
        );
    }
}

#[test]
fn every_opcode_round_trips_with_vlan_and_ipv6() {
    let mut rng = XorShift::new(0x5EED_F00D);
    let mut out = Vec::new();
    let mut seen_vlan_v6 = 0;
    for round in 0..40 {
        for op in supported_opcodes() {
            let (repr, payload) = random_frame(&mut rng, op);
            assert_eq!(repr.check(payload.len()), Ok(()), "round {round} {op}");
            emit_frame(&repr, &payload, &mut out);
            assert_eq!(out.len(), frame_length(&repr, payload.len()));
            assert_eq!(
                out.len() - 4 - repr.header_len(),
                payload.len() + (payload.len().wrapping_neg() & 3)
            );
            let parsed = parse_frame(&out).unwrap_or_else(|e| panic!("round {round} {op}: {e}"));
            assert_eq!(
                parsed.repr,
                expected_after_parse(&repr, payload.len()),
                "round {round} {op}"
            );
            assert_eq!(parsed.payload, &payload[..], "round {round} {op}");
            if repr.ethernet.vlan.is_some() && matches!(repr.ip, IpRepr::V6(_)) {
                seen_vlan_v6 += 1;
            }
        }
    }
    assert!(seen_vlan_v6 > 100);
}

/// The straightforward ICRC of an emitted frame: copy everything from the IP header to the
/// ICRC, set the variant fields to ones, put eight 0xFF bytes in front, CRC the lot.
fn straightforward_icrc(frame: &[u8], ip_start: usize) -> u32 {
    let mut masked = frame[ip_start..frame.len() - 4].to_vec();
    let ip_len = if masked[0] >> 4 == 6 {
        masked[0] |= 0x0F;
        for i in [1, 2, 3, 7] {
            masked[i] = 0xFF;
        }
        40
    } else {
        for i in [1, 8, 10, 11] {
            masked[i] = 0xFF;
        }
        usize::from(masked[0] & 0x0F) * 4
    };
    for i in [ip_len + 6, ip_len + 7, ip_len + 12] {
        masked[i] = 0xFF;
    }
    let mut all = vec![0xFF; 8];
    all.extend_from_slice(&masked);
    crc32fast::hash(&all)
}

/// Differential test of the emit and parse ICRC paths (one-pass stack copy, in-place
/// masking, streaming) against the straightforward computation, on seeded random frames of
/// every header combination: every opcode, IPv4 and IPv6, with and without VLAN, payloads
/// on both sides of the one-pass limit; and a corrupted ICRC is still refused.
#[test]
fn icrc_paths_match_the_straightforward_computation_for_every_header_combination() {
    let mut rng = XorShift::new(0x1C2C_F4A3);
    let mut out = Vec::new();
    for round in 0..60 {
        for op in supported_opcodes() {
            let (repr, payload) = random_frame(&mut rng, op);
            emit_frame(&repr, &payload, &mut out);
            let ip_start = repr.ethernet.header_len();
            let expected = straightforward_icrc(&out, ip_start);
            let trailer: [u8; 4] = out[out.len() - 4..].try_into().unwrap();
            assert_eq!(icrc::from_wire(trailer), expected, "round {round} {op}");
            assert_eq!(
                icrc::icrc(&out[ip_start..out.len() - 4]),
                expected,
                "round {round} {op}"
            );
            assert!(parse_frame(&out).is_ok(), "round {round} {op}");
            // One flipped bit from the BTH on (the lengths stay intact) fails the ICRC,
            // unless it is in the masked BTH byte 4.
            let bth_start = ip_start + repr.ip.header_len() + 8;
            let at = bth_start + rng.below(out.len() - 4 - bth_start);
            let mut corrupted = out.clone();
            corrupted[at] ^= 1 << rng.below(8);
            match parse_frame(&corrupted) {
                Err(WireError::BadIcrc { computed, found }) => {
                    assert_eq!(found, expected, "round {round} {op}: the trailer is read as is");
                    assert_eq!(
                        computed,
                        straightforward_icrc(&corrupted, ip_start),
                        "round {round} {op}: byte {at}"
                    );
                }
                Ok(_) => assert_eq!(at, bth_start + 4, "round {round} {op}: only a masked byte may change"),
                Err(other) => panic!("round {round} {op}: byte {at}: {other}"),
            }
        }
    }
}

#[test]
fn vlan_and_ipv6_known_layout() {
    let mut repr = frame1_repr();
    repr.ethernet.vlan = Some(VlanTag {
        pcp: 3,
        dei: false,
        vid: 100,
    });
    let mut out = Vec::new();
    emit_frame(&repr, b"hello-roce!!", &mut out);
    let untagged = &oracle_frames()[0];
    // Tag inserted after the source MAC; the ICRC does not cover Ethernet, so it is unchanged.
    assert_eq!(out.len(), untagged.len() + 4);
    assert_eq!(out[12..18], [0x81, 0x00, 0x60, 0x64, 0x08, 0x00]);
    assert_eq!(out[18..], untagged[14..]);
    assert_eq!(parse_frame(&out).unwrap().repr, repr);

    // IPv6 repr of oracle frame 5: same bytes except the (masked) UDP checksum.
    let frame5 = oracle_frames()[4];
    let v6 = parse_frame(frame5).unwrap().repr;
    let mut tagged = v6;
    tagged.ethernet.vlan = Some(VlanTag {
        pcp: 7,
        dei: true,
        vid: 0xFFF,
    });
    emit_frame(&tagged, b"hello-roce!!", &mut out);
    assert_eq!(out[12..18], [0x81, 0x00, 0xFF, 0xFF, 0x86, 0xDD]);
    assert_eq!(out[18..18 + 46], frame5[14..14 + 46]);
    assert_eq!(out[out.len() - 4..], frame5[frame5.len() - 4..]);
    assert_eq!(parse_frame(&out).unwrap().repr, tagged);
}

#[test]
fn emit_reuses_capacity_and_fills_in_place() {
    let repr = frame1_repr();
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&[0xAA; 200]);
    let pointer = out.as_ptr();
    let mut called = false;
    emit_frame_with(
        &RoceRepr {
            reth: Some(RethRepr {
                dma_length: 5,
                ..repr.reth.unwrap()
            }),
            ..repr
        },
        5,
        &mut out,
        |p| {
            assert_eq!(p, [0; 5]);
            p.copy_from_slice(b"12345");
            called = true;
        },
    );
    assert!(called);
    assert_eq!((out.as_ptr(), out.capacity()), (pointer, 256));
    let parsed = parse_frame(&out).unwrap();
    assert_eq!(parsed.payload, b"12345");
    assert_eq!(parsed.repr.bth.pad_count, 3);
    // The pad bytes are zero even though the buffer held 0xAA before.
    let n = out.len();
    assert_eq!(out[n - 7..n - 4], [0, 0, 0]);
    // bth.pad_count and ethernet.ethertype in the repr are ignored.
    let mut odd = repr;
    odd.bth.pad_count = 2;
    odd.ethernet.ethertype = 0x1234;
    emit_frame(&odd, b"hello-roce!!", &mut out);
    assert_eq!(out, oracle_frames()[0]);
}

#[test]
fn parse_rejects_invalid_transport() {
    let mut out = Vec::new();
    // Re-seal a frame after patching it: recompute the ICRC so only the patch is wrong.
    let reseal = |f: &mut Vec<u8>| {
        let n = f.len();
        let value = icrc::icrc(&f[ETH_LEN..n - 4]);
        f[n - 4..].copy_from_slice(&value.to_le_bytes());
    };
    let bth = ETH_LEN + IP4_LEN + 8;

    emit_frame(&frame1_repr(), b"hello-roce!!", &mut out);
    let mut f = out.clone();
    f[bth + 1] |= 0x01; // TVer 1
    reseal(&mut f);
    assert_eq!(
        parse_frame(&f),
        Err(WireError::Malformed {
            layer: "BTH",
            field: "TVer",
            value: 1
        })
    );

    for unknown in [0x15u8, 0x18, 0x2C, 0x40, 0x60, 0x66, 0x80, 0xA0, 0xFF] {
        let mut f = out.clone();
        f[bth] = unknown;
        reseal(&mut f);
        assert_eq!(parse_frame(&f), Err(WireError::UnknownOpcode(unknown)));
    }
    let mut f = out.clone();
    f[bth] = BthOpcode::RC_FLUSH.0;
    reseal(&mut f);
    assert_eq!(parse_frame(&f), Err(WireError::UnsupportedOpcode(0x1C)));

    // PadCnt 1 on a 12-byte body: 11 bytes of payload and a pad byte.
    let mut f = out.clone();
    f[bth + 1] |= 0x10;
    reseal(&mut f);
    let parsed = parse_frame(&f).unwrap(); // pad 1 of 12 bytes: payload 11 bytes, 11+1 = 12, fine
    assert_eq!(parsed.payload, b"hello-roce!");

    // An ACK carrying payload; an opcode whose headers do not fit.
    let ack = RoceRepr {
        aeth: Some(AethRepr::ack(31, 5)),
        ..RoceRepr::new(
            ethernet_example(),
            ipv4_example(64),
            0xC000,
            BthRepr::new(BthOpcode::RC_ACKNOWLEDGE, 3, 9),
        )
    };
    emit_frame(&ack, &[], &mut out);
    let mut f = out.clone();
    f[bth] = BthOpcode::RC_SEND_ONLY.0; // same length: 4 bytes of payload
    reseal(&mut f);
    assert_eq!(parse_frame(&f).unwrap().payload, [31, 0, 0, 5]);
    let mut f = out.clone();
    f[bth] = BthOpcode::RC_RDMA_WRITE_ONLY.0; // RETH needs 16 bytes, 4 are there
    reseal(&mut f);
    assert_eq!(
        parse_frame(&f),
        Err(WireError::Truncated {
            layer: "RETH",
            needed: 16,
            available: 4
        })
    );
    let mut f = out.clone();
    f[bth] = BthOpcode::RC_RDMA_READ_REQUEST.0;
    reseal(&mut f);
    assert!(matches!(
        parse_frame(&f),
        Err(WireError::Truncated { layer: "RETH", .. })
    ));
    let mut f = out.clone();
    f[bth] = BthOpcode::RC_RDMA_WRITE_MIDDLE.0;
    f[bth + 1] |= 0x30; // PadCnt 3 of 4 bytes: fine
    reseal(&mut f);
    assert_eq!(parse_frame(&f).unwrap().payload, [31]);
    let mut f = out.clone();
    f[bth] = BthOpcode::RC_COMPARE_SWAP.0;
    reseal(&mut f);
    assert!(matches!(
        parse_frame(&f),
        Err(WireError::Truncated { layer: "AtomicETH", .. })
    ));

    // An ACK with 4 extra bytes of payload.
    let mut f = out.clone();
    let n = f.len();
    f.splice(n - 4..n - 4, [1, 2, 3, 4]);
    f[ETH_LEN + 3] += 4; // IPv4 total length
    f[ETH_LEN + IP4_LEN + 5] += 4; // UDP length
    recompute_ipv4_checksum(&mut f, ETH_LEN);
    reseal(&mut f);
    assert_eq!(
        parse_frame(&f),
        Err(WireError::Malformed {
            layer: "RC_ACKNOWLEDGE",
            field: "payload length",
            value: 4
        })
    );
    // Payload + pad not a multiple of 4.
    let mut f = out.clone();
    f.insert(n - 4, 0);
    f[ETH_LEN + 3] += 1;
    f[ETH_LEN + IP4_LEN + 5] += 1;
    recompute_ipv4_checksum(&mut f, ETH_LEN);
    reseal(&mut f);
    assert!(matches!(
        parse_frame(&f),
        Err(WireError::Malformed {
            field: "payload+pad length",
            ..
        })
    ));
    // PadCnt larger than what follows the headers.
    let mut f = out.clone();
    f[bth + 1] |= 0x10;
    reseal(&mut f);
    assert_eq!(
        parse_frame(&f),
        Err(WireError::Malformed {
            layer: "BTH",
            field: "PadCnt",
            value: 1
        })
    );
}

#[test]
fn parse_rejects_non_roce_and_bad_lengths() {
    let frames = oracle_frames();
    let mut f = frames[0].to_vec();
    f[ETH_LEN + IP4_LEN + 2..ETH_LEN + IP4_LEN + 4].copy_from_slice(&53u16.to_be_bytes());
    assert_eq!(
        parse_frame(&f),
        Err(WireError::NotRoce {
            layer: "UDP",
            field: "destination port",
            value: 53
        })
    );
    let mut f = frames[0].to_vec();
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(
        parse_frame(&f),
        Err(WireError::NotRoce {
            layer: "Ethernet",
            field: "EtherType",
            value: 0x0806
        })
    );
    // RoCEv1 (EtherType 0x8915) is not RoCEv2.
    f[12..14].copy_from_slice(&[0x89, 0x15]);
    assert!(matches!(parse_frame(&f), Err(WireError::NotRoce { value: 0x8915, .. })));
    // A QinQ frame: the inner tag reads as the EtherType.
    let mut f = frames[0].to_vec();
    f.splice(12..12, [0x81, 0x00, 0x00, 0x01]);
    f.splice(16..16, [0x81, 0x00, 0x00, 0x02]);
    assert!(matches!(parse_frame(&f), Err(WireError::NotRoce { value: 0x8100, .. })));

    // Ethernet padding after the IP packet is ignored, by the ICRC too.
    let mut f = frames[3].to_vec();
    f.extend_from_slice(&[0xEE; 20]);
    assert_eq!(parse_frame(&f).unwrap().repr, parse_frame(frames[3]).unwrap().repr);
    // ... and so are bytes between the UDP length and the IP total length (the IP total
    // length itself is covered by the ICRC, so the sender computed it over the longer one).
    let mut f = frames[3].to_vec();
    let n = f.len();
    f.splice(n..n, [0xEE; 8]);
    f[ETH_LEN + 3] += 8;
    recompute_ipv4_checksum(&mut f, ETH_LEN);
    let value = icrc::icrc(&f[ETH_LEN..n - 4]);
    f[n - 4..n].copy_from_slice(&value.to_le_bytes());
    assert_eq!(parse_frame(&f).unwrap().repr, parse_frame(frames[3]).unwrap().repr);

    // UDP datagram too short for a BTH + ICRC.
    let mut f = frames[3].to_vec();
    f[ETH_LEN + IP4_LEN + 5] = 8 + 12;
    assert_eq!(
        parse_frame(&f),
        Err(WireError::Truncated {
            layer: "ICRC",
            needed: 4,
            available: 0
        })
    );
    f[ETH_LEN + IP4_LEN + 5] = 8 + 3;
    assert_eq!(
        parse_frame(&f),
        Err(WireError::Truncated {
            layer: "BTH",
            needed: 12,
            available: 3
        })
    );
}

#[test]
fn cnp_frames_round_trip() {
    let repr = RoceRepr::new(
        ethernet_example(),
        ipv4_example(64),
        udp_source_port(0, 0x11, 0x12),
        BthRepr {
            becn: true,
            ..BthRepr::new(BthOpcode::CNP, 0x11, 0)
        },
    );
    let mut out = Vec::new();
    emit_frame(&repr, &[], &mut out);
    assert_eq!(out.len(), ETH_LEN + IP4_LEN + 8 + 12 + 16 + 4);
    assert_eq!(out[ETH_LEN + IP4_LEN + 8 + 12..out.len() - 4], [0; 16]);
    let parsed = parse_frame(&out).unwrap();
    assert_eq!(parsed.repr, repr);
    assert!(parsed.payload.is_empty());
}

#[test]
fn repr_check_rejects_inconsistent_reprs() {
    let repr = frame1_repr();
    assert_eq!(repr.check(12), Ok(()));
    let bad = |r: RoceRepr, len| r.check(len).unwrap_err();
    assert!(matches!(
        bad(RoceRepr { reth: None, ..repr }, 1),
        WireError::Malformed {
            field: "reth",
            value: 0,
            ..
        }
    ));
    assert!(matches!(
        bad(
            RoceRepr {
                immediate: Some(1),
                ..repr
            },
            1
        ),
        WireError::Malformed {
            field: "immediate",
            value: 1,
            ..
        }
    ));
    let read = RoceRepr {
        bth: BthRepr {
            opcode: BthOpcode::RC_RDMA_READ_REQUEST,
            ..repr.bth
        },
        ..repr
    };
    assert_eq!(read.check(0), Ok(()));
    assert!(matches!(
        bad(read, 1),
        WireError::Malformed {
            field: "payload length",
            ..
        }
    ));
    let atomic_write = RoceRepr {
        bth: BthRepr {
            opcode: BthOpcode::RC_ATOMIC_WRITE,
            ..repr.bth
        },
        ..repr
    };
    assert_eq!(atomic_write.check(8), Ok(()));
    assert!(matches!(
        bad(atomic_write, 4),
        WireError::Malformed {
            field: "payload length",
            ..
        }
    ));
    assert_eq!(
        bad(
            RoceRepr {
                bth: BthRepr {
                    opcode: BthOpcode(0x15),
                    ..repr.bth
                },
                ..repr
            },
            0
        ),
        WireError::UnknownOpcode(0x15)
    );
    assert_eq!(
        bad(
            RoceRepr {
                bth: BthRepr {
                    opcode: BthOpcode::RC_FLUSH,
                    ..repr.bth
                },
                ..repr
            },
            0
        ),
        WireError::UnsupportedOpcode(0x1C)
    );
    assert!(matches!(
        bad(
            RoceRepr {
                bth: BthRepr {
                    psn: 1 << 24,
                    ..repr.bth
                },
                ..repr
            },
            0
        ),
        WireError::Malformed { field: "bth.psn", .. }
    ));
    assert!(matches!(
        bad(repr, 65_536),
        WireError::Malformed {
            field: "payload length",
            ..
        }
    ));
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "inconsistent RoceRepr")]
fn emit_panics_on_inconsistent_repr_in_debug() {
    let mut out = Vec::new();
    emit_frame(
        &RoceRepr {
            reth: None,
            ..frame1_repr()
        },
        b"x",
        &mut out,
    );
}

#[test]
fn parse_never_panics_on_random_bytes() {
    let mut rng = XorShift::new(0xF022);
    let mut buffer = vec![0u8; 600];
    for _ in 0..20_000 {
        let len = rng.below(buffer.len());
        rng.fill(&mut buffer[..len]);
        if rng.bool() && len >= 14 {
            // Make it likely to get past the Ethernet and IP layers.
            buffer[12..14].copy_from_slice(if rng.bool() { &[0x08, 0x00] } else { &[0x86, 0xDD] });
            buffer[14] = if buffer[13] == 0 { 0x45 } else { 0x60 };
        }
        let _ = parse_frame(&buffer[..len]);
    }
}

#[test]
fn parse_never_panics_on_truncated_or_mutated_frames() {
    let mut rng = XorShift::new(0x7A0C);
    let mut out = Vec::new();
    let mut frames: Vec<Vec<u8>> = oracle_frames().iter().map(|f| f.to_vec()).collect();
    frames.extend(rxe_roce_frames().iter().map(|f| f.to_vec()));
    for op in supported_opcodes() {
        let (repr, payload) = random_frame(&mut rng, op);
        emit_frame(&repr, &payload[..payload.len().min(64)], &mut out);
        frames.push(out.clone());
    }
    for frame in &frames {
        for len in 0..frame.len() {
            let result = parse_frame(&frame[..len]);
            assert!(result.is_err(), "a truncation to {len} of {} bytes parsed", frame.len());
        }
        for _ in 0..200 {
            let mut f = frame.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(f.len());
                f[i] = rng.u8();
            }
            let _ = parse_frame(&f);
        }
    }
}

#[test]
fn udp_source_port_follows_linux() {
    // rdma_flow_label_to_udp_sport: 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)).
    assert_eq!(udp_source_port(0x12345, 1, 2), 0xC000 | (0x2345 ^ 0x4));
    assert_eq!(udp_source_port(0xFFFFF, 1, 2), 0xC000 | (0x3FFF ^ 0x3F));
    // rdma_calc_flow_label: v = lqpn * rqpn; v ^= v >> 20; v ^= v >> 40; fl = v & 0xFFFFF.
    assert_eq!(udp_source_port(0, 0x11, 0x12), 0xC132);
    let (l, r) = (0xABCDEFu32, 0x123456u32);
    let mut v = u64::from(l) * u64::from(r);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xF_FFFF) as u32;
    assert_eq!(udp_source_port(0, l, r), udp_source_port(fl, 0, 0));
    let mut rng = XorShift::new(0x5047);
    for _ in 0..1000 {
        let (a, b) = (rng.u32() & 0xFF_FFFF, rng.u32() & 0xFF_FFFF);
        let port = udp_source_port(0, a, b);
        assert_eq!(port, udp_source_port(0, b, a), "symmetric");
        assert!(port >= 0xC000);
        assert!(udp_source_port(rng.u32(), a, b) >= 0xC000);
    }
}

#[test]
fn gid_mapping() {
    let gid = ipv4_to_gid([10, 99, 0, 2]);
    assert_eq!(gid, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 99, 0, 2]);
    assert_eq!(gid_to_ipv4(&gid), Some([10, 99, 0, 2]));
    let mut link_local = [0u8; 16];
    link_local[..2].copy_from_slice(&[0xfe, 0x80]);
    assert_eq!(gid_to_ipv4(&link_local), None);
    let mut almost = gid;
    almost[9] = 1;
    assert_eq!(gid_to_ipv4(&almost), None);
    assert_eq!(ipv4_example(1).source_gid(), ipv4_to_gid([192, 168, 1, 1]));
}

// ---------------------------------------------------------------------------------------
// The external checker: rnic-pcap-check (an ICRC written apart from this module, tshark's
// dissector), with shared/oracles/check-roce-pcap as a second opinion where it exists.

/// A classic pcap (Ethernet link type) of `frames` — the 24-byte global header and a
/// 16-byte record header per frame, written by hand.
fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let mut file = Vec::new();
    file.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    file.extend_from_slice(&2u16.to_le_bytes());
    file.extend_from_slice(&4u16.to_le_bytes());
    file.extend_from_slice(&0i32.to_le_bytes());
    file.extend_from_slice(&0u32.to_le_bytes());
    file.extend_from_slice(&65_535u32.to_le_bytes());
    file.extend_from_slice(&1u32.to_le_bytes());
    for (i, frame) in frames.iter().enumerate() {
        file.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        file.extend_from_slice(&(i as u32).to_le_bytes());
        file.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        file.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        file.extend_from_slice(frame);
    }
    std::fs::write(path, file).unwrap();
}

/// The fields compared with tshark, in `-e` order (roce-wire §3.5 names).
const TSHARK_FIELDS: [&str; 23] = [
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.reserved",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "udp.srcport",
    "vlan.id",
];

/// The values parse_frame gives for [`TSHARK_FIELDS`].
fn expected_fields(repr: &RoceRepr) -> [Option<u64>; 23] {
    let b = &repr.bth;
    let (va, rkey) = match (repr.reth, repr.atomic_eth) {
        (Some(r), _) => (Some(r.virtual_address), Some(u64::from(r.rkey))),
        // tshark shows the AtomicETH address and R_Key under the RETH field names.
        (None, Some(a)) => (Some(a.virtual_address), Some(u64::from(a.rkey))),
        (None, None) => (None, None),
    };
    [
        Some(b.opcode.0.into()),
        Some(b.solicited.into()),
        Some(b.migration.into()),
        Some(b.pad_count.into()),
        Some(b.partition_key.into()),
        Some((u64::from(b.fecn) << 7) | (u64::from(b.becn) << 6)),
        Some(b.destination_qp.into()),
        Some(b.ack_request.into()),
        Some(b.psn.into()),
        va,
        rkey,
        repr.reth.map(|r| r.dma_length.into()),
        repr.aeth.map(|a| a.syndrome.into()),
        repr.aeth.map(|a| a.msn.into()),
        repr.deth.map(|d| d.qkey.into()),
        repr.deth.map(|d| d.source_qp.into()),
        repr.immediate.map(u64::from),
        repr.invalidate_rkey.map(u64::from),
        repr.atomic_eth.map(|a| a.swap_or_add),
        repr.atomic_eth.map(|a| a.compare),
        repr.atomic_ack,
        Some(repr.udp_source_port.into()),
        repr.ethernet.vlan.map(|v| v.vid.into()),
    ]
}

/// Parses one tshark field value: `0x` hex, bare hex for the byte-string fields, else
/// decimal; empty = absent.
fn tshark_value(field: &str, text: &str) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    let bare_hex = matches!(field, "infiniband.reserved" | "infiniband.immdt" | "infiniband.ieth");
    let value = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None if bare_hex => u64::from_str_radix(text, 16),
        None => text.parse(),
    };
    Some(value.unwrap_or_else(|e| panic!("{field}: cannot read {text:?}: {e}")))
}

fn compare_with_tshark_fields(pcap: &std::path::Path, frames: &[Vec<u8>]) {
    let mut command = std::process::Command::new("/usr/bin/tshark");
    command
        .arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "occurrence=f", "-E", "separator=,"]);
    for field in TSHARK_FIELDS {
        command.args(["-e", field]);
    }
    let output = command.output().expect("run tshark");
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), frames.len(), "{}", String::from_utf8_lossy(&output.stderr));
    for (i, (line, frame)) in lines.iter().zip(frames).enumerate() {
        let repr = parse_frame(frame).unwrap().repr;
        let shown: Vec<Option<u64>> = line
            .split(',')
            .zip(TSHARK_FIELDS)
            .map(|(text, field)| tshark_value(field, text))
            .collect();
        // tshark 4.0.17 decodes neither CNP nor ATOMIC WRITE (IBA 1.5) past the BTH.
        let undecoded = matches!(repr.bth.opcode, BthOpcode::CNP | BthOpcode::RC_ATOMIC_WRITE);
        for (index, ((field, shown), expected)) in
            TSHARK_FIELDS.iter().zip(&shown).zip(expected_fields(&repr)).enumerate()
        {
            if undecoded && field.starts_with("infiniband.") && index > 8 {
                assert_eq!(*shown, None, "frame {}: {field}", i + 1);
                continue;
            }
            assert_eq!(*shown, expected, "frame {} ({}): {field}", i + 1, repr.bth.opcode);
        }
    }
}

/// The project's capture checker on `pcap` (and the shared oracle where it exists).
fn run_oracle(pcap: &std::path::Path, allow_zero_udp_checksum: bool) -> rnic_pcap_check::Report {
    let options = rnic_pcap_check::CheckOptions {
        allow_zero_udp_checksum,
        ..rnic_pcap_check::CheckOptions::default()
    };
    rnic_pcap_check::check_file(pcap, &options).unwrap_or_else(|error| panic!("{error}"))
}

#[test]
fn emitted_frames_pass_the_tshark_icrc_oracle() {
    // No skip: scripts/test installs tshark, and an oracle that did not run checked nothing.
    assert!(
        std::process::Command::new("tshark").arg("-v").output().is_ok(),
        "tshark is required (Debian package tshark; scripts/test installs it)"
    );
    let dir = std::env::temp_dir().join(format!("rnic-wire-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Every supported opcode over IPv4 (with and without a VLAN tag), payload sizes that
    // exercise every pad count.
    let mut rng = XorShift::new(0x7534_4A2C);
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for (i, op) in supported_opcodes().into_iter().enumerate() {
        for copy in 0..2 {
            let (mut repr, mut payload) = random_frame(&mut rng, op);
            if op.has_payload() && op != BthOpcode::RC_ATOMIC_WRITE {
                payload.truncate(1 + (i + copy) % 40);
            }
            if op.service() == Service::Ud && payload.is_empty() {
                // tshark 4.0 runs its payload heuristics on an empty UD payload and reports
                // an exception ("Malformed Packet: Mellanox EoIB"); zero-length UD SENDs are
                // valid, they just cannot go through this oracle.
                payload.push(0);
            }
            if let Some(first) = payload.first_mut() {
                // tshark's Mellanox EoIB heuristic (not disabled by check-roce-pcap) claims
                // payloads whose first two bits are 01 and reports them malformed.
                *first &= 0x3F;
            }
            let ip = repr.ip;
            repr.ip = ipv4_example(64);
            if let (IpRepr::V4(mut r), IpRepr::V4(random)) = (repr.ip, ip) {
                r.identification = random.identification;
                repr.ip = IpRepr::V4(r);
            }
            let mut out = Vec::new();
            emit_frame(&repr, &payload, &mut out);
            v4.push(out);
            if let IpRepr::V6(_) = ip {
                repr.ip = ip;
                let mut out = Vec::new();
                emit_frame(&repr, &payload, &mut out);
                v6.push(out);
            }
        }
    }
    println!("oracle pcaps in {}", dir.display());
    let v4_path = dir.join("emitted-ipv4.pcap");
    write_pcap(&v4_path, &v4);
    let report = run_oracle(&v4_path, false);
    println!("IPv4, {} frames: {report}", v4.len());
    assert!(report.passed(), "{report}");
    assert_eq!(report.roce_frames, v4.len() as u64, "{report}");

    // tshark's own decoder reads every field as parse_frame does.
    compare_with_tshark_fields(&v4_path, &v4);

    // IPv6 with UDP checksum 0 (as rxe sends): tshark flags the zero checksum itself.
    let v6_path = dir.join("emitted-ipv6.pcap");
    write_pcap(&v6_path, &v6);
    let report = run_oracle(&v6_path, true);
    println!("IPv6, {} frames, zero UDP checksums allowed: {report}", v6.len());
    assert!(report.passed(), "{report}");
    assert_eq!(report.roce_frames, v6.len() as u64, "{report}");

    // Negative control: the oracle does catch a frame whose ICRC we break.
    let mut broken = v4[0].clone();
    let n = broken.len();
    broken[n - 1] ^= 0x01;
    let bad_path = dir.join("broken.pcap");
    write_pcap(&bad_path, &[broken]);
    let report = run_oracle(&bad_path, false);
    assert!(!report.passed(), "the checker accepted a broken ICRC: {report}");
    assert!(report.problems.iter().any(|p| p.what.contains("bad ICRC")), "{report}");
    if let Some(shared) = &report.shared {
        assert!(
            !shared.passed,
            "the shared oracle accepted a broken ICRC: {}",
            shared.output
        );
    }
    // KEEP_ORACLE_DIR=1 keeps the pcaps (in the temp dir printed above) for a look in Wireshark.
    if std::env::var_os("KEEP_ORACLE_DIR").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn emit_overwriting_reuses_stale_payload_bytes_and_matches_emit_with() {
    let repr = frame1_repr();
    let repr = RoceRepr {
        reth: Some(RethRepr {
            dma_length: 5,
            ..repr.reth.unwrap()
        }),
        ..repr
    };
    let mut expected = Vec::new();
    emit_frame_with(&repr, 5, &mut expected, |p| p.copy_from_slice(b"12345"));
    // A recycled buffer full of old bytes, longer and shorter than the frame.
    for stale_len in [0, 10, expected.len(), 300] {
        let mut out = vec![0xAA; stale_len];
        emit_frame_overwriting(&repr, 5, &mut out, |p| {
            assert_eq!(p.len(), 5);
            p.copy_from_slice(b"12345");
        });
        assert_eq!(out, expected, "stale length {stale_len}");
    }
}

#[test]
fn emit_overwriting_a_garbage_buffer_matches_emit_for_every_header_combination() {
    // `emit_frame_overwriting` zeroes nothing: every byte outside the payload must be
    // written by an emitter (or zeroed explicitly) for the frame to match `emit_frame`.
    let mut rng = XorShift::new(0x6A6B);
    for op in supported_opcodes() {
        for round in 0..40 {
            let (mut repr, payload) = random_frame(&mut rng, op);
            // Cover every Ethernet/IP combination for each opcode, not only by chance.
            if round < 4 {
                repr.ethernet.vlan = (round & 1 == 1).then(|| VlanTag::from_tci(rng.u16()));
            }
            let mut expected = Vec::new();
            emit_frame(&repr, &payload, &mut expected);
            let stale_len = match rng.below(3) {
                0 => rng.below(expected.len() + 1),
                1 => expected.len(),
                _ => expected.len() + rng.below(5000),
            };
            let mut out = vec![0u8; stale_len];
            rng.fill(&mut out);
            emit_frame_overwriting(&repr, payload.len(), &mut out, |p| p.copy_from_slice(&payload));
            assert_eq!(out, expected, "{op:?} round {round}, stale length {stale_len}");
        }
    }
}
