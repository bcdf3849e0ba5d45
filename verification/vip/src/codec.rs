//! The RoCEv2 header codec for stimulus and checking, flattened to named fields so that
//! testbenches in any language (Python, SystemVerilog) compare frames field by field and
//! report the first field that differs.
//!
//! Field names (values as unsigned integers; absent headers have no fields):
//!
//! | Header | Fields |
//! |---|---|
//! | Ethernet | `eth.dst`, `eth.src` (48-bit), `eth.vlan` (TCI: PCP 15:13, DEI 12, VID 11:0) |
//! | IP | `ip.version` (4 or 6); IPv4: `ip.src`, `ip.dst`, `ip.dscp`, `ip.ecn`, `ip.ttl`, `ip.id`, `ip.df`; IPv6: `ip.src_hi`, `ip.src_lo`, `ip.dst_hi`, `ip.dst_lo`, `ip.tclass`, `ip.flow_label`, `ip.hop_limit` |
//! | UDP | `udp.sport` (the destination is always 4791) |
//! | BTH | `bth.opcode`, `bth.se`, `bth.m`, `bth.pad`, `bth.tver`, `bth.pkey`, `bth.fecn`, `bth.becn`, `bth.dqpn`, `bth.ackreq`, `bth.psn` |
//! | RETH | `reth.va`, `reth.rkey`, `reth.len` |
//! | AETH | `aeth.syndrome`, `aeth.msn` |
//! | AtomicETH | `atomic.va`, `atomic.rkey`, `atomic.swap_add`, `atomic.compare` |
//! | AtomicAckETH | `atomic_ack.orig` |
//! | ImmDt, IETH | `immdt`, `ieth.rkey` |
//! | DETH | `deth.qkey`, `deth.sqpn` |
//! | trailer | `payload.len`, `icrc` |
//!
//! [`decode`] checks the frame as the device's receive path does (lengths, opcode,
//! headers, ICRC); [`encode`] builds a valid frame from fields (defaults for the rest).

use std::collections::BTreeMap;

use rnic_hw_model::wire::{
    self, AethRepr, AtomicEthRepr, BthOpcode, BthRepr, DethRepr, EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr, RethRepr,
    RoceRepr, VlanTag,
};

use crate::VipError;

/// A frame taken apart: its fields in header order, and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// `(name, value)` in the order the headers appear.
    pub fields: Vec<(&'static str, u64)>,
    /// The payload, without pad and ICRC.
    pub payload: Vec<u8>,
    /// The opcode's name (`RC_RDMA_WRITE_FIRST`…).
    pub opcode_name: String,
}

impl Decoded {
    /// The value of field `name`, if the frame has it.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.fields.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

fn mac_u64(mac: &[u8; 6]) -> u64 {
    mac.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b))
}

fn u64_mac(value: u64) -> [u8; 6] {
    let bytes = value.to_be_bytes();
    [bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7]]
}

/// Takes `frame` (Ethernet, without FCS) apart; refuses what the device would drop as
/// malformed (the ICRC included).
pub fn decode(frame: &[u8]) -> Result<Decoded, VipError> {
    let parsed = wire::parse_frame(frame).map_err(|e| VipError::Codec(e.to_string()))?;
    let repr = parsed.repr;
    let mut fields: Vec<(&'static str, u64)> = vec![
        ("eth.dst", mac_u64(&repr.ethernet.destination)),
        ("eth.src", mac_u64(&repr.ethernet.source)),
    ];
    if let Some(vlan) = repr.ethernet.vlan {
        fields.push((
            "eth.vlan",
            u64::from(vlan.pcp) << 13 | u64::from(vlan.dei) << 12 | u64::from(vlan.vid),
        ));
    }
    match repr.ip {
        IpRepr::V4(ip) => fields.extend([
            ("ip.version", 4),
            ("ip.src", u64::from(u32::from_be_bytes(ip.source))),
            ("ip.dst", u64::from(u32::from_be_bytes(ip.destination))),
            ("ip.dscp", u64::from(ip.dscp)),
            ("ip.ecn", u64::from(ip.ecn)),
            ("ip.ttl", u64::from(ip.ttl)),
            ("ip.id", u64::from(ip.identification)),
            ("ip.df", u64::from(ip.dont_fragment)),
        ]),
        IpRepr::V6(ip) => {
            let half = |b: &[u8; 16], i: usize| u64::from_be_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            fields.extend([
                ("ip.version", 6),
                ("ip.src_hi", half(&ip.source, 0)),
                ("ip.src_lo", half(&ip.source, 1)),
                ("ip.dst_hi", half(&ip.destination, 0)),
                ("ip.dst_lo", half(&ip.destination, 1)),
                ("ip.tclass", u64::from(ip.traffic_class)),
                ("ip.flow_label", u64::from(ip.flow_label)),
                ("ip.hop_limit", u64::from(ip.hop_limit)),
            ])
        }
    }
    let bth = repr.bth;
    fields.extend([
        ("udp.sport", u64::from(repr.udp_source_port)),
        ("bth.opcode", u64::from(u8::from(bth.opcode))),
        ("bth.se", u64::from(bth.solicited)),
        ("bth.m", u64::from(bth.migration)),
        ("bth.pad", u64::from(bth.pad_count)),
        ("bth.tver", u64::from(bth.transport_version)),
        ("bth.pkey", u64::from(bth.partition_key)),
        ("bth.fecn", u64::from(bth.fecn)),
        ("bth.becn", u64::from(bth.becn)),
        ("bth.dqpn", u64::from(bth.destination_qp)),
        ("bth.ackreq", u64::from(bth.ack_request)),
        ("bth.psn", u64::from(bth.psn)),
    ]);
    if let Some(deth) = repr.deth {
        fields.extend([
            ("deth.qkey", u64::from(deth.qkey)),
            ("deth.sqpn", u64::from(deth.source_qp)),
        ]);
    }
    if let Some(reth) = repr.reth {
        fields.extend([
            ("reth.va", reth.virtual_address),
            ("reth.rkey", u64::from(reth.rkey)),
            ("reth.len", u64::from(reth.dma_length)),
        ]);
    }
    if let Some(atomic) = repr.atomic_eth {
        fields.extend([
            ("atomic.va", atomic.virtual_address),
            ("atomic.rkey", u64::from(atomic.rkey)),
            ("atomic.swap_add", atomic.swap_or_add),
            ("atomic.compare", atomic.compare),
        ]);
    }
    if let Some(aeth) = repr.aeth {
        fields.extend([
            ("aeth.syndrome", u64::from(aeth.syndrome)),
            ("aeth.msn", u64::from(aeth.msn)),
        ]);
    }
    if let Some(original) = repr.atomic_ack {
        fields.push(("atomic_ack.orig", original));
    }
    if let Some(immediate) = repr.immediate {
        fields.push(("immdt", u64::from(immediate)));
    }
    if let Some(rkey) = repr.invalidate_rkey {
        fields.push(("ieth.rkey", u64::from(rkey)));
    }
    let icrc = frame
        .get(frame.len().saturating_sub(4)..)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .unwrap_or_default();
    fields.extend([("payload.len", parsed.payload.len() as u64), ("icrc", u64::from(icrc))]);
    Ok(Decoded {
        fields,
        payload: parsed.payload.to_vec(),
        opcode_name: bth.opcode.name().to_string(),
    })
}

/// Builds a valid frame from `fields` (names as in [`decode`]; any not given take a
/// default: IPv4 10.0.0.1 → 10.0.0.2, the MACs of two rnic ports, TTL 64, P_Key
/// 0xFFFF) and `payload`. Derived fields (`bth.pad`, `payload.len`, `icrc`, lengths and
/// checksums) are ignored if given. Extension headers are those the opcode requires.
pub fn encode(fields: &BTreeMap<String, u64>, payload: &[u8]) -> Result<Vec<u8>, VipError> {
    let known = [
        "eth.dst",
        "eth.src",
        "eth.vlan",
        "ip.version",
        "ip.src",
        "ip.dst",
        "ip.dscp",
        "ip.ecn",
        "ip.ttl",
        "ip.id",
        "ip.df",
        "ip.src_hi",
        "ip.src_lo",
        "ip.dst_hi",
        "ip.dst_lo",
        "ip.tclass",
        "ip.flow_label",
        "ip.hop_limit",
        "udp.sport",
        "bth.opcode",
        "bth.se",
        "bth.m",
        "bth.pad",
        "bth.tver",
        "bth.pkey",
        "bth.fecn",
        "bth.becn",
        "bth.dqpn",
        "bth.ackreq",
        "bth.psn",
        "reth.va",
        "reth.rkey",
        "reth.len",
        "aeth.syndrome",
        "aeth.msn",
        "atomic.va",
        "atomic.rkey",
        "atomic.swap_add",
        "atomic.compare",
        "atomic_ack.orig",
        "immdt",
        "ieth.rkey",
        "deth.qkey",
        "deth.sqpn",
        "payload.len",
        "icrc",
    ];
    if let Some(unknown) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(VipError::Codec(format!("no field {unknown:?}")));
    }
    let get = |name: &str, default: u64| fields.get(name).copied().unwrap_or(default);
    let narrow = |name: &str, default: u64, bits: u32| -> Result<u64, VipError> {
        let value = get(name, default);
        if bits < 64 && value >> bits != 0 {
            return Err(VipError::Codec(format!("{name} = {value:#x}: {bits} bits")));
        }
        Ok(value)
    };
    let opcode = BthOpcode::from(narrow("bth.opcode", 0x0a, 8)? as u8);
    let ethernet = EthernetRepr {
        destination: u64_mac(narrow("eth.dst", 0x0252_4e49_4302, 48)?),
        source: u64_mac(narrow("eth.src", 0x0252_4e49_4301, 48)?),
        vlan: match fields.get("eth.vlan") {
            Some(&tci) if tci <= 0xFFFF => Some(VlanTag {
                pcp: (tci >> 13) as u8,
                dei: tci >> 12 & 1 == 1,
                vid: (tci & 0xFFF) as u16,
            }),
            Some(&tci) => return Err(VipError::Codec(format!("eth.vlan = {tci:#x}: 16 bits"))),
            None => None,
        },
        ethertype: 0,
    };
    let ip = match get("ip.version", 4) {
        4 => IpRepr::V4(Ipv4Repr {
            source: (narrow("ip.src", 0x0a00_0001, 32)? as u32).to_be_bytes(),
            destination: (narrow("ip.dst", 0x0a00_0002, 32)? as u32).to_be_bytes(),
            dscp: narrow("ip.dscp", 0, 6)? as u8,
            ecn: narrow("ip.ecn", 0, 2)? as u8,
            ttl: narrow("ip.ttl", 64, 8)? as u8,
            identification: narrow("ip.id", 0, 16)? as u16,
            dont_fragment: narrow("ip.df", 1, 1)? == 1,
        }),
        6 => {
            let gid = |hi: &str, lo: &str, default_lo: u64| -> [u8; 16] {
                let mut g = [0u8; 16];
                g[..8].copy_from_slice(&get(hi, 0xfd00_0000_0000_0000).to_be_bytes());
                g[8..].copy_from_slice(&get(lo, default_lo).to_be_bytes());
                g
            };
            IpRepr::V6(Ipv6Repr {
                source: gid("ip.src_hi", "ip.src_lo", 1),
                destination: gid("ip.dst_hi", "ip.dst_lo", 2),
                traffic_class: narrow("ip.tclass", 0, 8)? as u8,
                flow_label: narrow("ip.flow_label", 0, 20)? as u32,
                hop_limit: narrow("ip.hop_limit", 64, 8)? as u8,
            })
        }
        other => return Err(VipError::Codec(format!("ip.version {other}: 4 or 6"))),
    };
    let bth = BthRepr {
        opcode,
        solicited: narrow("bth.se", 0, 1)? == 1,
        migration: narrow("bth.m", 0, 1)? == 1,
        pad_count: 0,
        transport_version: narrow("bth.tver", 0, 4)? as u8,
        partition_key: narrow("bth.pkey", 0xFFFF, 16)? as u16,
        fecn: narrow("bth.fecn", 0, 1)? == 1,
        becn: narrow("bth.becn", 0, 1)? == 1,
        destination_qp: narrow("bth.dqpn", 0, 24)? as u32,
        ack_request: narrow("bth.ackreq", 0, 1)? == 1,
        psn: narrow("bth.psn", 0, 24)? as u32,
    };
    let mut repr = RoceRepr::new(ethernet, ip, narrow("udp.sport", 0xC000, 16)? as u16, bth);
    let headers = opcode.headers();
    if headers.contains(wire::ExtHeaders::RETH) {
        repr.reth = Some(RethRepr {
            virtual_address: get("reth.va", 0),
            rkey: narrow("reth.rkey", 0, 32)? as u32,
            dma_length: narrow("reth.len", payload.len() as u64, 32)? as u32,
        });
    }
    if headers.contains(wire::ExtHeaders::AETH) {
        repr.aeth = Some(AethRepr {
            syndrome: narrow("aeth.syndrome", 0x1f, 8)? as u8,
            msn: narrow("aeth.msn", 0, 24)? as u32,
        });
    }
    if headers.contains(wire::ExtHeaders::ATOMIC_ETH) {
        repr.atomic_eth = Some(AtomicEthRepr {
            virtual_address: get("atomic.va", 0),
            rkey: narrow("atomic.rkey", 0, 32)? as u32,
            swap_or_add: get("atomic.swap_add", 0),
            compare: get("atomic.compare", 0),
        });
    }
    if headers.contains(wire::ExtHeaders::ATOMIC_ACK_ETH) {
        repr.atomic_ack = Some(get("atomic_ack.orig", 0));
    }
    if headers.contains(wire::ExtHeaders::IMMDT) {
        repr.immediate = Some(narrow("immdt", 0, 32)? as u32);
    }
    if headers.contains(wire::ExtHeaders::IETH) {
        repr.invalidate_rkey = Some(narrow("ieth.rkey", 0, 32)? as u32);
    }
    if headers.contains(wire::ExtHeaders::DETH) {
        repr.deth = Some(DethRepr {
            qkey: narrow("deth.qkey", 0, 32)? as u32,
            source_qp: narrow("deth.sqpn", 0, 24)? as u32,
        });
    }
    repr.check(payload.len()).map_err(|e| VipError::Codec(e.to_string()))?;
    let mut out = Vec::new();
    wire::emit_frame(&repr, payload, &mut out);
    Ok(out)
}

/// The first field where `expected` and `actual` differ (a field only one has counts),
/// as `(name, expected, actual)`; None when they agree field for field.
pub fn first_difference(expected: &Decoded, actual: &Decoded) -> Option<(String, Option<u64>, Option<u64>)> {
    for (name, value) in &expected.fields {
        let other = actual.get(name);
        if other != Some(*value) {
            return Some((name.to_string(), Some(*value), other));
        }
    }
    for (name, value) in &actual.fields {
        if expected.get(name).is_none() {
            return Some((name.to_string(), None, Some(*value)));
        }
    }
    (expected.payload != actual.payload).then(|| ("payload".to_string(), None, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn an_encoded_write_first_decodes_to_the_same_fields() {
        let given = fields(&[
            ("bth.opcode", 0x06),
            ("bth.dqpn", 0x12_3456),
            ("bth.psn", 0xAB_CDEF),
            ("bth.ackreq", 1),
            ("reth.va", 0x1122_3344_5566_7788),
            ("reth.rkey", 0xCAFE_F00D),
            ("reth.len", 4096),
        ]);
        let frame = encode(&given, &[0x5A; 1024]).unwrap();
        let decoded = decode(&frame).unwrap();
        for (name, value) in &given {
            assert_eq!(decoded.get(name), Some(*value), "{name}");
        }
        assert_eq!(decoded.get("payload.len"), Some(1024));
        assert_eq!(decoded.get("bth.pad"), Some(0));
        assert_eq!(decoded.opcode_name, "RC_RDMA_WRITE_FIRST");
        assert_eq!(decoded.payload, vec![0x5A; 1024]);
    }

    #[test]
    fn ipv6_acks_and_padding_round_trip() {
        let given = fields(&[
            ("ip.version", 6),
            ("ip.dst_lo", 9),
            ("bth.opcode", 0x11),
            ("aeth.syndrome", 0x60),
            ("aeth.msn", 7),
        ]);
        let decoded = decode(&encode(&given, &[]).unwrap()).unwrap();
        assert_eq!(decoded.get("ip.dst_lo"), Some(9));
        assert_eq!(decoded.get("aeth.syndrome"), Some(0x60));
        let send = decode(&encode(&fields(&[("bth.opcode", 0x04)]), &[1, 2, 3]).unwrap()).unwrap();
        assert_eq!(send.get("bth.pad"), Some(1));
        assert_eq!(send.payload, vec![1, 2, 3]);
    }

    #[test]
    fn a_corrupted_frame_is_refused_and_a_changed_field_is_the_first_difference() {
        let frame = encode(&fields(&[("bth.opcode", 0x0a), ("reth.len", 8)]), &[0; 8]).unwrap();
        let mut broken = frame.clone();
        let last = broken.len() - 5;
        broken[last] ^= 1;
        assert!(
            matches!(decode(&broken), Err(VipError::Codec(_))),
            "the ICRC no longer matches"
        );
        assert!(decode(&frame[..20]).is_err(), "truncated");
        let a = decode(&frame).unwrap();
        let b = decode(
            &encode(
                &fields(&[("bth.opcode", 0x0a), ("reth.len", 8), ("bth.psn", 3)]),
                &[0; 8],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(first_difference(&a, &b), Some(("bth.psn".into(), Some(0), Some(3))));
        assert_eq!(first_difference(&a, &a), None);
    }

    #[test]
    fn unknown_fields_and_values_too_wide_are_refused() {
        assert!(encode(&fields(&[("bth.nope", 1)]), &[]).is_err());
        assert!(encode(&fields(&[("bth.psn", 1 << 24)]), &[]).is_err());
        assert!(encode(&fields(&[("ip.version", 5)]), &[]).is_err());
    }
}
