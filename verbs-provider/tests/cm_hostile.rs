//! Hostile MADs at QP1: truncated, oversized, of other classes, of unknown attributes, with
//! impossible lengths, for connections that do not exist, DREQ storms, forged messages
//! for a live connection. Each is dropped or answered as IBA and Linux do, counted, logged
//! under `rnic::diag` (a bounded number of times), never a panic — and the live
//! connection's QP is never touched by a message that is not its own.

mod cm_common;

use std::net::SocketAddr;

use cm_common::*;
use rnic_verbs::cm::mad::{
    attribute, drep, dreq, rej, rep, rtu, CmMad, CmMessage, DrepRepr, DreqRepr, RejReason, RejRepr, RepRepr, RtuRepr,
    MAD_LEN,
};
use rnic_verbs::cm::{CmEventKind, ConnParam, PortSpace};
use rnic_verbs::{
    AhAttributes, MemoryRegion, QpAttributeMask, QpAttributes, QpInitAttributes, QpState, QpType, QueuePair, SendFlags,
    SendWorkRequest, Sge, UdFields, WrOpcode,
};

const GSI_QKEY: u32 = 0x8001_0000;
/// The attacker's send buffers: a send reads its bytes when the device gets to it, so
/// each of the last `SLOTS` sends has a buffer of its own.
const SLOTS: usize = 64;
const SLOT: usize = 4096;

/// Host c's raw UD QP, speaking to host b's QP1.
struct Attacker {
    qp: QueuePair,
    mr: MemoryRegion,
    ah: rnic_verbs::AddressHandle,
    _cq: rnic_verbs::CompletionQueue,
    sent: u64,
}

impl Attacker {
    fn new(world: &World, target: usize) -> Self {
        let host = &world.hosts[2];
        let cq = host.context.create_cq(4096, None, 0).unwrap();
        let qp = host
            .pd
            .create_qp(&QpInitAttributes {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: rnic_verbs::QpCapabilities {
                    max_send_wr: 1024,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Ud,
                sq_sig_all: false,
            })
            .unwrap();
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Init,
                port_num: 1,
                qkey: GSI_QKEY,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE | QpAttributeMask::PORT | QpAttributeMask::PKEY_INDEX | QpAttributeMask::QKEY,
        )
        .unwrap();
        for state in [QpState::Rtr, QpState::Rts] {
            qp.modify(
                &QpAttributes {
                    qp_state: state,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE,
            )
            .unwrap();
        }
        let mr = buffer(&host.pd, SLOTS * SLOT);
        let ah = host
            .pd
            .create_ah(&AhAttributes {
                dgid: rnic_verbs::cm::address::ip_to_gid(world.hosts[target].ip),
                dmac: mac(target as u8 + 1),
                ..AhAttributes::default()
            })
            .unwrap();
        Self {
            qp,
            mr,
            ah,
            _cq: cq,
            sent: 0,
        }
    }

    /// Sends `bytes` as one datagram to the target's QP1 with the GSI Q_Key.
    fn send(&mut self, bytes: &[u8]) {
        let offset = (self.sent as usize % SLOTS) * SLOT;
        self.mr.write(offset as u64, bytes).unwrap();
        self.sent += 1;
        self.qp
            .post_send(&[SendWorkRequest {
                wr_id: self.sent,
                opcode: WrOpcode::Send,
                sg_list: &[Sge::new(
                    self.mr.addr() + offset as u64,
                    bytes.len() as u32,
                    self.mr.lkey(),
                )],
                send_flags: if self.sent & 63 == 0 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                },
                ud: Some(UdFields {
                    ah: &self.ah,
                    remote_qpn: 1,
                    remote_qkey: GSI_QKEY,
                }),
                ..SendWorkRequest::default()
            }])
            .unwrap();
        let mut wc = [rnic_verbs::WorkCompletion::default(); 16];
        let _ = self._cq.poll(&mut wc);
    }
}

fn established_pair(world: &mut World) -> (rnic_verbs::cm::CmId, rnic_verbs::cm::CmId, rnic_verbs::cm::CmId) {
    let listener = listen(world, 1, 4420, PortSpace::Tcp);
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
    client.connect(&ConnParam::default()).unwrap();
    let server = world.expect(1, CmEventKind::ConnectRequest).id;
    server.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
    server.accept(&ConnParam::default()).unwrap();
    world.expect(0, CmEventKind::Established);
    world.expect(1, CmEventKind::Established);
    (listener, client, server)
}

fn mad(message: CmMessage) -> [u8; MAD_LEN] {
    CmMad::new(0x0bad_0bad, message).to_bytes()
}

#[test]
fn hostile_mads_are_dropped_or_answered_counted_and_harmless() {
    let mut world = World::new(3, 0xBAD);
    let (listener, client, server) = established_pair(&mut world);
    let server_qp = server.qp().unwrap().unwrap();
    let server_qpn = server_qp.qp_num();
    let mut attacker = Attacker::new(&world, 1);
    let valid_rtu = mad(CmMessage::Rtu(RtuRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: [0; rtu::PRIVATE_DATA_LEN],
    }));

    // Truncated MADs, every length from 0 to 255: malformed (0 bytes: a receive of just
    // the GRH, still refused).
    for length in [0usize, 1, 23, 24, 100, 255] {
        attacker.send(&valid_rtu[..length]);
    }
    // A datagram longer than a MAD: received whole (QP1's buffers take any UD message, so
    // no receive fails) and refused by its length.
    attacker.send(&[0xAB; 1024]);
    // Another management class (device management, SRP discovery on InfiniBand).
    let mut other_class = valid_rtu;
    other_class[1] = 0x06;
    attacker.send(&other_class);
    // Unknown and unhandled CM attributes.
    for id in [0x0042u16, attribute::LAP, attribute::APR, attribute::CLASS_PORT_INFO] {
        let mut unknown = valid_rtu;
        unknown[16..18].copy_from_slice(&id.to_be_bytes());
        attacker.send(&unknown);
    }
    // A REJ whose Reject Info Length says 127 bytes of a 72-byte field.
    let mut absurd = mad(CmMessage::Rej(RejRepr {
        local_comm_id: 5,
        remote_comm_id: 6,
        message_rejected: rej::rejected::OTHER,
        reject_info_length: 8,
        reason: RejReason::ConsumerDefined,
        ari: [0; rej::ARI_LEN],
        private_data: [0; rej::PRIVATE_DATA_LEN],
    }));
    absurd[24 + 9] = 127 << 1;
    attacker.send(&absurd);
    // A REQ whose RDMA-CM header has IP version 5.
    let mut request = include_req();
    request[24 + 140 + 1] = 0x50;
    attacker.send(&request);
    // A REP, RTU, DREP, MRA and REJ for connections nobody has.
    attacker.send(&mad(CmMessage::Rep(RepRepr {
        local_comm_id: 0x1111,
        remote_comm_id: 0xDEAD_BEEF,
        local_qkey: 0,
        local_qpn: 0x77,
        local_eecn: 0,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x42,
        private_data: [0; rep::PRIVATE_DATA_LEN],
    })));
    attacker.send(&valid_rtu);
    attacker.send(&mad(CmMessage::Drep(DrepRepr {
        local_comm_id: 3,
        remote_comm_id: 4,
        private_data: [0; drep::PRIVATE_DATA_LEN],
    })));
    world.run_for(10_000_000);
    let counters = world.hosts[1].cm.counters();
    assert_eq!(counters.malformed, 6 + 1 + 1 + 1, "{counters:?}");
    assert_eq!(counters.not_cm, 1, "{counters:?}");
    assert_eq!(counters.unknown_attribute, 4, "{counters:?}");
    assert_eq!(counters.unmatched, 3, "{counters:?}");
    let agent = world.hosts[1].cm.agent_counters(0).unwrap();
    assert_eq!((agent.receive_errors, agent.recoveries), (0, 0), "{agent:?}");
    assert_eq!(world.hosts[1].cm.ids(), 2, "the bad REQ made no id");

    // A DREQ storm for connections that do not exist: each is answered with a DREP, as
    // Linux does, and the log stays short.
    let storm = 500;
    for n in 0..storm {
        attacker.send(&mad(CmMessage::Dreq(DreqRepr {
            local_comm_id: 0x5000 + n,
            remote_comm_id: 0x6000 + n,
            remote_qpn: 0x77,
            private_data: [0; dreq::PRIVATE_DATA_LEN],
        })));
        if n % 32 == 31 {
            world.run_for(1_000_000);
        }
    }
    world.run_for(100_000_000);
    assert_eq!(world.hosts[1].cm.counters().unknown_dreq_answered, u64::from(storm));

    // Forged messages for the live connection: right communication IDs, wrong QPN for
    // the DREQ; a REJ with a wrong remote ID. Neither touches the connection.
    let local = server_comm_ids(&world, &server);
    attacker.send(&mad(CmMessage::Dreq(DreqRepr {
        local_comm_id: local.1,
        remote_comm_id: local.0,
        remote_qpn: server_qpn ^ 1,
        private_data: [0; dreq::PRIVATE_DATA_LEN],
    })));
    attacker.send(&mad(CmMessage::Rej(RejRepr {
        local_comm_id: local.1 ^ 0xFFFF,
        remote_comm_id: local.0,
        message_rejected: rej::rejected::OTHER,
        reject_info_length: 0,
        reason: RejReason::ConsumerDefined,
        ari: [0; rej::ARI_LEN],
        private_data: [0; rej::PRIVATE_DATA_LEN],
    })));
    let events = world.run_for(100_000_000);
    assert!(
        events.is_empty(),
        "no event from forged messages: {:?}",
        events.iter().map(|(h, e)| (*h, e.kind)).collect::<Vec<_>>()
    );
    assert_eq!(world.hosts[1].cm.counters().dreq_wrong_qpn, 1);
    assert_eq!(server_qp.state(), QpState::Rts);
    assert!(server.state().contains("ESTABLISHED"), "{}", server.state());
    assert!(client.state().contains("ESTABLISHED"), "{}", client.state());

    // The connection still works and ends normally.
    client.disconnect().unwrap();
    world.expect(1, CmEventKind::Disconnected);
    server.disconnect().unwrap();
    world.expect(0, CmEventKind::Disconnected);
    drop(server_qp);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

/// The communication IDs of an established id: (its local, its remote).
fn server_comm_ids(_world: &World, server: &rnic_verbs::cm::CmId) -> (u32, u32) {
    server.communication_ids().unwrap().expect("an established id")
}

/// The Linux REQ of the reference capture, as a starting point for a mangled one.
fn include_req() -> [u8; MAD_LEN] {
    let mut bytes = [0u8; MAD_LEN];
    let req = rnic_verbs::cm::mad::ReqRepr {
        local_comm_id: 0xeff1_7d17,
        service_id: PortSpace::Tcp.service_id(4420),
        local_ca_guid: 0x5054_00ff_fe12_3456,
        local_qkey: 0,
        local_qpn: 0x13,
        responder_resources: 0,
        local_eecn: 0,
        initiator_depth: 0,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport: rnic_verbs::cm::mad::TransportType::Rc,
        end_to_end_flow_control: false,
        starting_psn: 0x54_e0f0,
        local_cm_response_timeout: 20,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: rnic_verbs::cm::mad::CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: rnic_verbs::cm::address::ip_to_gid(ipv4(3)).raw(),
            remote_gid: rnic_verbs::cm::address::ip_to_gid(ipv4(2)).raw(),
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        },
        alternate_path: rnic_verbs::cm::mad::CmPath::default(),
        private_data: [0; 92],
    };
    let mut req = req;
    req.private_data[1] = 0x40;
    CmMad::new(1, CmMessage::Req(req)).emit(&mut bytes);
    bytes
}
