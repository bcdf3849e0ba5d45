//! What leaves a NIC is exact RoCEv2, as an independent decoder sees it: a mixed run of
//! every RC opcode the transport sends (single- and multi-packet SEND and WRITE, with
//! immediate and invalidate, READ requests and responses, both atomics and their
//! acknowledgements, ACKs) and UD SENDs with a GRH, once over IPv4 and once over IPv6, is
//! captured, written as a pcap, and checked by the project's capture checker
//! (`rnic-pcap-check`: every ICRC recomputed independently of the model, tshark's
//! dissector with no malformed frame or error), and by `../shared/oracles/check-roce-pcap`
//! too where it exists. A frame either rejects fails the test.
//!
//! tshark is required (`scripts/test` installs it); the test fails, it does not skip,
//! when tshark is missing.

use rnic_hw_model::fabric::{CapturedFrame, FabricConfig};
use rnic_hw_model::wire;
use rnic_pcap_check::{check_file, CheckOptions};
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric};
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{
    AccessFlags, AhAttributes, AtomicFields, CompletionQueue, Context, DeviceAccess, MemoryRegion, Mtu,
    ProtectionDomain, QpAttributeMask, QpAttributes, QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair,
    RcConnection, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, UdFields, WcStatus, WorkCompletion,
    WrOpcode,
};

const QKEY: u32 = 0x1111_2222;
const MTU: u32 = 1024;

struct Side {
    device: EmbeddedDevice,
    context: Context,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
}

impl Side {
    fn new(fabric: &EmbeddedFabric, mac: [u8; 6], ipv4: Option<[u8; 4]>) -> Self {
        let device = fabric.add_nic(mac);
        let config = DriverConfig {
            ipv4_address: ipv4,
            ..DriverConfig::default()
        };
        let context = Context::open_with_config(Box::new(device.clone()), &config).expect("bring-up");
        let pd = context.alloc_pd().unwrap();
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd.register_user_memory(vec![0u8; 64 * 1024], access).unwrap();
        let cq = context.create_cq(256, None, 0).unwrap();
        Self {
            device,
            context,
            pd,
            mr,
            cq,
        }
    }

    fn qp(&self, qp_type: QpType) -> QueuePair {
        let cap = QpCapabilities {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        self.pd
            .create_qp(&QpInitAttributes {
                send_cq: &self.cq,
                recv_cq: &self.cq,
                srq: None,
                cap,
                qp_type,
                sq_sig_all: true,
            })
            .unwrap()
    }

    fn sge(&self, offset: u64, length: u32) -> Sge {
        Sge::new(self.mr.addr() + offset, length, self.mr.lkey())
    }

    /// Polls until `count` completions arrived, all successful.
    fn wait(&self, count: usize) {
        let mut out = vec![WorkCompletion::default(); count];
        let mut got = 0;
        for _ in 0..200_000 {
            got += self.cq.poll(&mut out[got..]).unwrap();
            if got == count {
                for wc in &out {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                }
                return;
            }
            self.device.delay(1_000);
        }
        panic!("{got} of {count} completions arrived");
    }
}

fn connect(qp: &QueuePair, remote: &QueuePair, remote_side: &Side) {
    qp.connect_rc(&RcConnection {
        path_mtu: Mtu::from_bytes(MTU).unwrap(),
        dest_qp_num: remote.qp_num(),
        rq_psn: 0,
        sq_psn: 0,
        ah_attr: AhAttributes {
            dgid: remote_side.context.query_gid(1, 0).unwrap(),
            dmac: remote_side.context.mac_address(),
            hop_limit: 64,
            traffic_class: 0x68,
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
    })
    .unwrap();
}

fn ud_ready(qp: &QueuePair) {
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::QKEY,
    )
    .unwrap();
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rtr,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE,
    )
    .unwrap();
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rts,
            sq_psn: 0,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
    )
    .unwrap();
}

/// Runs every operation once between two NICs and returns every frame that crossed.
fn mixed_run(ipv4: bool) -> Vec<CapturedFrame> {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    fabric.set_capture(true);
    // Documentation addresses (RFC 5737): they exist only inside the model.
    let a = Side::new(&fabric, [0x02, 0, 0, 0, 0, 0x0A], ipv4.then_some([192, 0, 2, 1]));
    let b = Side::new(&fabric, [0x02, 0, 0, 0, 0, 0x0B], ipv4.then_some([192, 0, 2, 2]));
    // Payloads start with a zero byte: tshark's Ethernet-over-IB heuristic claims UD
    // payloads that begin with the bits 01 and calls them malformed.
    a.mr.write(0, &(0..16_384u32).map(|i| (i % 251) as u8 & 0x3F).collect::<Vec<u8>>())
        .unwrap();

    let qa = a.qp(QpType::Rc);
    let qb = b.qp(QpType::Rc);
    connect(&qa, &qb, &b);
    connect(&qb, &qa, &a);
    let target =
        b.pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let remote = RdmaFields {
        remote_addr: b.mr.addr() + 32_768,
        rkey: b.mr.rkey(),
    };
    let receives = 6;
    for i in 0..receives {
        qb.post_recv(&[RecvWorkRequest {
            wr_id: i,
            sg_list: &[b.sge(i * 4096, 4096)],
        }])
        .unwrap();
    }
    let sends: Vec<(WrOpcode, u32)> = vec![
        (WrOpcode::Send, 200),              // SEND ONLY
        (WrOpcode::Send, 3 * MTU + 100),    // SEND FIRST/MIDDLE/LAST
        (WrOpcode::SendWithImm, 100),       // SEND ONLY WITH IMMEDIATE
        (WrOpcode::SendWithImm, 2 * MTU),   // SEND LAST WITH IMMEDIATE
        (WrOpcode::SendWithInv, 64),        // SEND ONLY WITH INVALIDATE
        (WrOpcode::RdmaWrite, 100),         // WRITE ONLY
        (WrOpcode::RdmaWrite, 3 * MTU + 1), // WRITE FIRST/MIDDLE/LAST
        (WrOpcode::RdmaWriteWithImm, 100),  // WRITE ONLY WITH IMMEDIATE (consumes a receive)
        (WrOpcode::RdmaRead, 3 * MTU + 10), // READ REQUEST, RESPONSE FIRST/MIDDLE/LAST
        (WrOpcode::RdmaRead, 16),           // READ RESPONSE ONLY
        (WrOpcode::AtomicCmpSwp, 8),        // COMPARE SWAP, ATOMIC ACKNOWLEDGE
        (WrOpcode::AtomicFetchAdd, 8),      // FETCH ADD
    ];
    for (i, (opcode, length)) in sends.iter().enumerate() {
        let local = [a.sge(0, *length)];
        let mut request = SendWorkRequest {
            wr_id: i as u64,
            opcode: *opcode,
            sg_list: &local,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        };
        match opcode {
            WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm => request.imm_data = 0x0102_0304,
            WrOpcode::SendWithInv => request.invalidate_rkey = target.rkey(),
            _ => {}
        }
        if matches!(
            opcode,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead
        ) {
            request.rdma = remote;
        }
        if matches!(opcode, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd) {
            request.atomic = AtomicFields {
                remote_addr: b.mr.addr() + 60_000,
                compare_add: 0,
                swap: 7,
                rkey: b.mr.rkey(),
            };
        }
        qa.post_send(&[request]).unwrap();
        a.wait(1);
    }
    b.wait(receives as usize);

    // UD with a GRH: SEND ONLY and SEND ONLY WITH IMMEDIATE.
    let ua = a.qp(QpType::Ud);
    let ub = b.qp(QpType::Ud);
    ud_ready(&ua);
    ud_ready(&ub);
    let ah =
        a.pd.create_ah(&AhAttributes {
            dgid: b.context.query_gid(1, 0).unwrap(),
            dmac: b.context.mac_address(),
            hop_limit: 64,
            ..AhAttributes::default()
        })
        .unwrap();
    for i in 0..2u64 {
        ub.post_recv(&[RecvWorkRequest {
            wr_id: 100 + i,
            sg_list: &[b.sge(40_000 + i * 2048, 2048)],
        }])
        .unwrap();
        let local = [a.sge(0, 300)];
        qa_ud_send(&ua, &ah, &ub, &local, i == 1);
        a.wait(1);
    }
    b.wait(2);
    fabric.take_capture()
}

fn qa_ud_send(qp: &QueuePair, ah: &rnic_verbs::AddressHandle, remote: &QueuePair, local: &[Sge], with_immediate: bool) {
    qp.post_send(&[SendWorkRequest {
        wr_id: 0x500,
        opcode: if with_immediate {
            WrOpcode::SendWithImm
        } else {
            WrOpcode::Send
        },
        sg_list: local,
        send_flags: SendFlags::SIGNALED,
        imm_data: 0xBEEF,
        ud: Some(UdFields {
            ah,
            remote_qpn: remote.qp_num(),
            remote_qkey: QKEY,
        }),
        ..Default::default()
    }])
    .unwrap();
}

fn check_with_oracle(name: &str, frames: &[CapturedFrame], allow_zero_udp_checksum: bool) {
    let path = std::env::temp_dir().join(format!("rnic-{name}-{}.pcap", std::process::id()));
    rnic_testbench::pcap::write_pcap(&path, frames).unwrap();
    let options = CheckOptions {
        allow_zero_udp_checksum,
        ..CheckOptions::default()
    };
    let report = check_file(&path, &options).unwrap_or_else(|error| panic!("{error}"));
    eprintln!("{report}");
    assert!(report.passed(), "{report}\n(capture kept at {})", path.display());
    assert_eq!(report.roce_frames, frames.len() as u64, "{report}");
    std::fs::remove_file(&path).unwrap();
}

/// Every opcode the run must have put on the wire, by name.
fn opcodes_seen(frames: &[CapturedFrame]) -> std::collections::BTreeSet<String> {
    frames
        .iter()
        .map(|f| {
            wire::parse_frame(&f.bytes)
                .expect("our own frames parse")
                .repr
                .bth
                .opcode
                .name()
                .to_string()
        })
        .collect()
}

const EXPECTED_OPCODES: &[&str] = &[
    "RC_SEND_ONLY",
    "RC_SEND_FIRST",
    "RC_SEND_MIDDLE",
    "RC_SEND_LAST",
    "RC_SEND_ONLY_WITH_IMMEDIATE",
    "RC_SEND_LAST_WITH_IMMEDIATE",
    "RC_SEND_ONLY_WITH_INVALIDATE",
    "RC_RDMA_WRITE_ONLY",
    "RC_RDMA_WRITE_FIRST",
    "RC_RDMA_WRITE_MIDDLE",
    "RC_RDMA_WRITE_LAST",
    "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "RC_RDMA_READ_REQUEST",
    "RC_RDMA_READ_RESPONSE_FIRST",
    "RC_RDMA_READ_RESPONSE_MIDDLE",
    "RC_RDMA_READ_RESPONSE_LAST",
    "RC_RDMA_READ_RESPONSE_ONLY",
    "RC_ACKNOWLEDGE",
    "RC_ATOMIC_ACKNOWLEDGE",
    "RC_COMPARE_SWAP",
    "RC_FETCH_ADD",
    "UD_SEND_ONLY",
    "UD_SEND_ONLY_WITH_IMMEDIATE",
];

#[test]
fn a_mixed_run_over_ipv4_passes_the_tshark_icrc_oracle() {
    let frames = mixed_run(true);
    let seen = opcodes_seen(&frames);
    for name in EXPECTED_OPCODES {
        assert!(seen.contains(*name), "{name} missing from the run: {seen:?}");
    }
    assert!(frames.iter().all(|f| f.bytes[12..14] == [0x08, 0x00]), "IPv4 frames");
    check_with_oracle("ipv4", &frames, false);
}

#[test]
fn a_mixed_run_over_ipv6_passes_the_tshark_icrc_oracle() {
    let frames = mixed_run(false);
    let seen = opcodes_seen(&frames);
    for name in EXPECTED_OPCODES {
        assert!(seen.contains(*name), "{name} missing from the run: {seen:?}");
    }
    assert!(frames.iter().all(|f| f.bytes[12..14] == [0x86, 0xDD]), "IPv6 frames");
    // Like rdma_rxe, the model sends UDP checksum 0 over IPv6 (the ICRC protects the
    // payload); the checker's flag accepts exactly that and nothing else.
    check_with_oracle("ipv6", &frames, true);
}
