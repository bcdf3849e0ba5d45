//! Two embedded hosts connect through their connection managers the way two Linux hosts
//! do with rdma_cm: address, route, REQ/REP/RTU, traffic on the negotiated QPs, DREQ/DREP,
//! timewait.

mod cm_common;

use std::net::SocketAddr;

use cm_common::*;
use rnic_hw_model::fabric::FaultPlan;
use rnic_verbs::cm::{CmEventKind, ConnParam, PortSpace};
use rnic_verbs::{QpState, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, WcStatus, WrOpcode};

#[test]
fn an_rc_connection_is_established_carries_traffic_and_is_torn_down() {
    let mut world = World::new(2, 1);
    let listener = listen(&world, 1, 4420, PortSpace::Tcp);
    let client = world.hosts[0].channel.create_id(7, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
    client
        .connect(&ConnParam {
            private_data: b"hello".to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
    let request = world.expect(1, CmEventKind::ConnectRequest);
    assert_eq!(request.listen_id.as_ref(), Some(&listener));
    assert_eq!(&request.private_data[..5], b"hello");
    assert_eq!(
        request.private_data.len(),
        56,
        "a REQ's private data after the IP header"
    );
    let server = request.id.clone();
    assert_eq!(server.context().unwrap(), 0x1157, "the listener's context");
    assert_eq!(
        server.local_addr().unwrap(),
        Some(SocketAddr::new(world.hosts[1].ip, 4420))
    );
    assert_eq!(server.peer_addr().unwrap(), client.local_addr().unwrap());
    server.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
    let server_qp = server.qp().unwrap().unwrap();
    let server_mr = buffer(&world.hosts[1].pd, 4096);
    server_qp
        .post_recv(&[RecvWorkRequest {
            wr_id: 1,
            sg_list: &[Sge::new(server_mr.addr(), 4096, server_mr.lkey())],
        }])
        .unwrap();
    server.accept(&ConnParam::default()).unwrap();
    let established = world.expect(0, CmEventKind::Established);
    assert_eq!(established.id, client);
    world.expect(1, CmEventKind::Established);
    let client_qp = client.qp().unwrap().unwrap();
    assert_eq!(client_qp.state(), QpState::Rts);
    assert_eq!(server_qp.state(), QpState::Rts);
    let (a, b) = (client_qp.query().unwrap(), server_qp.query().unwrap());
    assert_eq!(a.dest_qp_num, server_qp.qp_num());
    assert_eq!(b.dest_qp_num, client_qp.qp_num());
    assert_eq!(a.sq_psn, b.rq_psn, "client sends from the PSN the server expects");
    assert_eq!(b.sq_psn, a.rq_psn);
    assert_eq!(a.path_mtu, b.path_mtu);
    assert_eq!(
        a.timeout, 19,
        "Linux 6.1's local ACK timeout: lifetime 18, ACK delay 15"
    );

    // A SEND from the client lands in the server's posted receive.
    let client_mr = buffer(&world.hosts[0].pd, 4096);
    client_mr.write(0, b"over the CM").unwrap();
    client_qp
        .post_send(&[SendWorkRequest {
            wr_id: 9,
            opcode: WrOpcode::Send,
            sg_list: &[Sge::new(client_mr.addr(), 11, client_mr.lkey())],
            send_flags: SendFlags::SIGNALED,
            ..SendWorkRequest::default()
        }])
        .unwrap();
    let send_cq = client.send_cq().unwrap().unwrap();
    let recv_cq = server.recv_cq().unwrap().unwrap();
    let mut wc = [rnic_verbs::WorkCompletion::default(); 1];
    let mut got = (0, 0);
    for _ in 0..100_000 {
        got.0 += send_cq.poll(&mut wc[..]).unwrap();
        if got.0 == 1 {
            assert_eq!(wc[0].status, WcStatus::Success);
            break;
        }
    }
    for _ in 0..100_000 {
        got.1 += recv_cq.poll(&mut wc[..]).unwrap();
        if got.1 == 1 {
            break;
        }
    }
    assert_eq!(got, (1, 1));
    assert_eq!(wc[0].byte_len, 11);
    let mut landed = [0u8; 11];
    server_mr.read(0, &mut landed).unwrap();
    assert_eq!(&landed, b"over the CM");

    // The client disconnects; both see DISCONNECTED, then TIMEWAIT_EXIT.
    client.disconnect().unwrap();
    assert_eq!(client_qp.state(), QpState::Err);
    world.expect(1, CmEventKind::Disconnected);
    server.disconnect().unwrap();
    world.expect(0, CmEventKind::Disconnected);
    world.expect(0, CmEventKind::TimewaitExit);
    world.expect(1, CmEventKind::TimewaitExit);
    drop((client_qp, server_qp, send_cq, recv_cq));
    client.destroy().unwrap();
    server.destroy().unwrap();
    listener.destroy().unwrap();
    assert_eq!(world.hosts[0].cm.ids(), 0);
    assert_eq!(world.hosts[1].cm.ids(), 0);
    let counters = world.hosts[1].cm.counters();
    assert_eq!((counters.malformed, counters.unmatched, counters.timeouts), (0, 0, 0));
}

/// Active and passive ids through REQ/REP/RTU; returns (client, server).
fn connect_pair(world: &mut World, port: u16) -> (rnic_verbs::cm::CmId, rnic_verbs::cm::CmId) {
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, port), 2000)
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
    (client, server)
}

#[test]
fn the_passive_side_can_disconnect_first() {
    let mut world = World::new(2, 2);
    let listener = listen(&world, 1, 5000, PortSpace::Tcp);
    let (client, server) = connect_pair(&mut world, 5000);
    server.disconnect().unwrap();
    let disconnected = world.expect(0, CmEventKind::Disconnected);
    assert_eq!(disconnected.status, 0);
    assert_eq!(
        client.qp().unwrap().unwrap().state(),
        QpState::Rts,
        "the DREQ alone does not touch the QP"
    );
    client.disconnect().unwrap();
    assert_eq!(client.qp().unwrap().unwrap().state(), QpState::Err);
    world.expect(1, CmEventKind::Disconnected);
    world.expect(0, CmEventKind::TimewaitExit);
    world.expect(1, CmEventKind::TimewaitExit);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn a_rejection_reaches_the_requester_with_its_reason_and_private_data() {
    let mut world = World::new(2, 3);
    let listener = listen(&world, 1, 6000, PortSpace::Tcp);
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 6000), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
    client.connect(&ConnParam::default()).unwrap();
    let server = world.expect(1, CmEventKind::ConnectRequest).id;
    server.reject(b"go away").unwrap();
    let rejected = world.expect(0, CmEventKind::Rejected);
    assert_eq!(rejected.status, 28, "consumer defined");
    assert_eq!(&rejected.private_data[..7], b"go away");
    assert_eq!(rejected.private_data.len(), 148);
    assert_eq!(client.qp().unwrap().unwrap().state(), QpState::Err);
    // As Linux's rdma_disconnect: an id that has been through the IB CM gets 0 (its QP
    // to ERR), one that never connected (the listener) EINVAL.
    assert!(client.disconnect().is_ok());
    assert!(listener.disconnect().is_err(), "nothing to disconnect");
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn nobody_listening_is_answered_at_once_with_reason_8() {
    let mut world = World::new(2, 4);
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 7000), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    let start = world.now_ns();
    client.connect(&ConnParam::default()).unwrap();
    let rejected = world.expect(0, CmEventKind::Rejected);
    assert_eq!(rejected.status, 8, "invalid Service ID");
    let elapsed = world.now_ns() - start;
    assert!(
        elapsed < 1_000_000,
        "within a round trip, not after a timeout: {elapsed} ns"
    );
    assert_eq!(world.hosts[1].cm.counters().no_listener, 1);
    client.destroy().unwrap();
}

#[test]
fn a_listener_bound_to_another_address_does_not_take_the_request() {
    let mut world = World::new(2, 5);
    // Bound to the link-local address of host b, not its IPv4 one.
    let host = &world.hosts[1];
    let link_local = std::net::IpAddr::from(host.context.query_gid(1, 1).unwrap().raw());
    let listener = host.channel.create_id(0, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(link_local, 8000)).unwrap();
    listener.listen(1).unwrap();
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 8000), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.connect(&ConnParam::default()).unwrap();
    assert_eq!(
        world.expect(0, CmEventKind::Rejected).status,
        28,
        "as Linux's cma: consumer defined"
    );
    client.destroy().unwrap();
    listener.destroy().unwrap();
}

#[test]
fn ipv6_connections_use_link_local_gids() {
    let mut world = World::new(2, 6);
    let address = |host: &Host| std::net::IpAddr::from(host.context.query_gid(1, 1).unwrap().raw());
    let (a, b) = (address(&world.hosts[0]), address(&world.hosts[1]));
    assert!(a.is_ipv6());
    let listener = world.hosts[1].channel.create_id(0, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(b, 4420)).unwrap();
    listener.listen(1).unwrap();
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client.resolve_addr(None, SocketAddr::new(b, 4420), 2000).unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    assert_eq!(
        client.local_addr().unwrap().unwrap().ip(),
        a,
        "an IPv6 source for an IPv6 peer"
    );
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    assert_eq!(
        client.route().unwrap().unwrap().flow_label,
        0,
        "IPv6: the socket's flow label, 0"
    );
    client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
    client.connect(&ConnParam::default()).unwrap();
    let request = world.expect(1, CmEventKind::ConnectRequest);
    assert_eq!(request.id.peer_addr().unwrap().unwrap().ip(), a);
    request.id.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
    request.id.accept(&ConnParam::default()).unwrap();
    world.expect(0, CmEventKind::Established);
    world.expect(1, CmEventKind::Established);
    let qp = client.qp().unwrap().unwrap();
    assert_eq!(
        qp.query().unwrap().ah_attr.dgid.raw(),
        match b {
            std::net::IpAddr::V6(v6) => v6.octets(),
            _ => unreachable!(),
        }
    );
    drop(qp);
    for id in [client, request.id, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn ud_ids_resolve_the_peer_qp_with_sidr() {
    let mut world = World::new(2, 7);
    let listener = listen(&world, 1, 9000, PortSpace::Udp);
    let client = world.hosts[0].channel.create_id(1, PortSpace::Udp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 9000), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
    assert_eq!(
        client.qp().unwrap().unwrap().state(),
        QpState::Rts,
        "a UD QP is ready at once"
    );
    client
        .connect(&ConnParam {
            private_data: b"sidr".to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
    let request = world.expect(1, CmEventKind::ConnectRequest);
    assert_eq!(&request.private_data[..4], b"sidr");
    let ud = request.ud.clone().expect("UD parameters");
    assert_eq!(ud.ah_attr.dmac, mac(1));
    request.id.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
    let server_qp = request.id.qp().unwrap().unwrap();
    request.id.accept(&ConnParam::default()).unwrap();
    let established = world.expect(0, CmEventKind::Established);
    let ud = established.ud.expect("the peer's QPN and Q_Key");
    assert_eq!(ud.qp_num, server_qp.qp_num());
    assert_eq!(ud.qkey, 0x0123_4567);
    assert_eq!(ud.ah_attr.dmac, mac(2));
    // A datagram with the resolved address reaches the server's QP.
    let server_mr = buffer(&world.hosts[1].pd, 4096);
    server_qp
        .post_recv(&[RecvWorkRequest {
            wr_id: 5,
            sg_list: &[Sge::new(server_mr.addr(), 4096, server_mr.lkey())],
        }])
        .unwrap();
    let ah = world.hosts[0].pd.create_ah(&ud.ah_attr).unwrap();
    let client_mr = buffer(&world.hosts[0].pd, 4096);
    client_mr.write(0, b"datagram").unwrap();
    client
        .qp()
        .unwrap()
        .unwrap()
        .post_send(&[SendWorkRequest {
            wr_id: 1,
            opcode: WrOpcode::Send,
            sg_list: &[Sge::new(client_mr.addr(), 8, client_mr.lkey())],
            send_flags: SendFlags::SIGNALED,
            ud: Some(rnic_verbs::UdFields {
                ah: &ah,
                remote_qpn: ud.qp_num,
                remote_qkey: ud.qkey,
            }),
            ..SendWorkRequest::default()
        }])
        .unwrap();
    let recv_cq = request.id.recv_cq().unwrap().unwrap();
    let mut wc = [rnic_verbs::WorkCompletion::default(); 1];
    let mut got = 0;
    for _ in 0..100_000 {
        got += recv_cq.poll(&mut wc).unwrap();
        if got == 1 {
            break;
        }
    }
    assert_eq!(got, 1);
    assert_eq!(wc[0].byte_len, 40 + 8);
    drop((server_qp, recv_cq, ah));
    for id in [client, request.id, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn sidr_to_a_port_nobody_listens_on_is_unreachable_with_status_1() {
    let mut world = World::new(2, 8);
    let client = world.hosts[0].channel.create_id(1, PortSpace::Udp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 9001), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.connect(&ConnParam::default()).unwrap();
    assert_eq!(
        world.expect(0, CmEventKind::Unreachable).status,
        1,
        "SIDR_REP status unsupported"
    );
    client.destroy().unwrap();
}

#[test]
fn a_peer_that_never_answers_makes_the_request_unreachable_after_linuxs_retries() {
    let world = World::new(2, 9);
    // Host b's connection manager never runs: its QP1 receives, nobody answers.
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
        .unwrap();
    let start;
    {
        let host = &world.hosts[0];
        loop {
            host.cm.progress();
            if let Some(event) = host.channel.get_event() {
                assert_eq!(event.kind, CmEventKind::AddrResolved);
                break;
            }
            world.advance(1_000_000);
        }
        client.resolve_route(2000).unwrap();
        assert_eq!(host.channel.get_event().unwrap().kind, CmEventKind::RouteResolved);
        start = world.now_ns();
        client.connect(&ConnParam::default()).unwrap();
        let event = loop {
            host.cm.progress();
            if let Some(event) = host.channel.get_event() {
                break event;
            }
            let next = host.cm.next_deadline_ns().unwrap();
            world
                .fabric
                .advance(rnic_hw_model::time::Picoseconds::from_nanos(next - world.now_ns()));
        };
        assert_eq!((event.kind, event.status), (CmEventKind::Unreachable, -110));
    }
    // 1 + 15 REQs, 6144 ms apart (2 × 2^(18-8) + 2^(20-8) ms), then the last timeout.
    // (The connection manager's own register accesses add a few microseconds.)
    let elapsed = world.now_ns() - start;
    assert!(
        (16 * 6_144_000_000..16 * 6_144_000_000 + 1_000_000).contains(&elapsed),
        "{elapsed} ns"
    );
    let counters = world.hosts[0].cm.counters();
    assert_eq!(
        (counters.sent, counters.retransmissions, counters.timeouts),
        (16, 15, 1)
    );
    client.destroy().unwrap();
}

#[test]
fn a_slow_acceptor_answers_a_repeated_req_with_an_mra() {
    let mut world = World::new(2, 10);
    let listener = listen(&world, 1, 4420, PortSpace::Tcp);
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
    // The acceptor takes 20 s to decide: the REQ is repeated (6.1 s), answered with an
    // MRA (service timeout 24, about 69 s), and the requester waits instead of giving up.
    world.run_for(20_000_000_000);
    assert!(world.hosts[1].cm.counters().duplicates >= 1);
    assert!(client.state().contains("MRA_REQ_RCVD"), "{}", client.state());
    server.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
    server.accept(&ConnParam::default()).unwrap();
    world.expect(0, CmEventKind::Established);
    world.expect(1, CmEventKind::Established);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

/// An active id whose application brings its own QP (`ConnParam::qp_num`), connected up
/// to CONNECT_RESPONSE and its QP moved to RTS with the id's attributes; the passive id
/// has accepted (REP_SENT). The RTU is the caller's (`establish`).
struct OwnQpConnection {
    listener: rnic_verbs::cm::CmId,
    client: rnic_verbs::cm::CmId,
    request: rnic_verbs::cm::CmEvent,
    response: rnic_verbs::cm::CmEvent,
    qp: rnic_verbs::QueuePair,
    /// The QP's CQ, kept alive with it.
    cq: rnic_verbs::CompletionQueue,
}

fn connect_with_own_qp(world: &mut World) -> OwnQpConnection {
    let listener = listen(world, 1, 4420, PortSpace::Tcp);
    let host = &world.hosts[0];
    let cq = host.context.create_cq(64, None, 0).unwrap();
    let qp = host
        .pd
        .create_qp(&rnic_verbs::QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: caps(),
            qp_type: rnic_verbs::QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    let client = host.channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client
        .connect(&ConnParam {
            qp_num: qp.qp_num(),
            ..ConnParam::default()
        })
        .unwrap();
    let request = world.expect(1, CmEventKind::ConnectRequest);
    request.id.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
    request.id.accept(&ConnParam::default()).unwrap();
    let response = world.expect(0, CmEventKind::ConnectResponse);
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let (attributes, mask) = client.init_qp_attr(state).unwrap();
        qp.modify(&attributes, mask).unwrap();
    }
    OwnQpConnection {
        listener,
        client,
        request,
        response,
        qp,
        cq,
    }
}

#[test]
fn an_application_with_its_own_qp_gets_connect_response_and_establishes() {
    let mut world = World::new(2, 11);
    let OwnQpConnection {
        listener,
        client,
        request,
        response,
        qp,
        cq: _cq,
    } = connect_with_own_qp(&mut world);
    assert_eq!(request.conn.qp_num, qp.qp_num());
    assert_eq!(response.conn.qp_num, request.id.qp().unwrap().unwrap().qp_num());
    client.establish().unwrap();
    world.expect(1, CmEventKind::Established);
    assert_eq!(
        qp.query().unwrap().dest_qp_num,
        request.id.qp().unwrap().unwrap().qp_num()
    );
    for id in [client, request.id, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn destroying_an_id_in_req_sent_rejects_with_timeout_like_linux() {
    let mut world = World::new(2, 12);
    let listener = listen(&world, 1, 4420, PortSpace::Tcp);
    let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
        .unwrap();
    world.expect(0, CmEventKind::AddrResolved);
    client.resolve_route(2000).unwrap();
    world.expect(0, CmEventKind::RouteResolved);
    client.connect(&ConnParam::default()).unwrap();
    let server = world.expect(1, CmEventKind::ConnectRequest).id;
    client.destroy().unwrap();
    // The REJ (reason 4, our GUID as ARI) finds the passive id by remote ID and GUID.
    let rejected = world.expect(1, CmEventKind::Rejected);
    assert_eq!((rejected.id, rejected.status), (server.clone(), 4));
    assert!(server.accept(&ConnParam::default()).is_err());
    server.destroy().unwrap();
    listener.destroy().unwrap();
}

#[test]
fn an_unanswered_dreq_still_disconnects_after_linuxs_retries() {
    // Linux (cm.c, cma.c): the DREQ is sent 1 + 15 times; when no DREP comes, the id
    // enters timewait and the application gets DISCONNECTED with -ETIMEDOUT, so that a
    // client waiting for it after rdma_disconnect (qperf) ends.
    let mut world = World::new(2, 11);
    let listener = listen(&world, 1, 5100, PortSpace::Tcp);
    let (client, server) = connect_pair(&mut world, 5100);
    // From here host b's connection manager never runs: the DREQ reaches its QP1 and
    // nobody answers.
    let host = &world.hosts[0];
    let sent_before = host.cm.counters().sent;
    let start = world.now_ns();
    client.disconnect().unwrap();
    assert_eq!(client.qp().unwrap().unwrap().state(), QpState::Err);
    let event = loop {
        host.cm.progress();
        if let Some(event) = host.channel.get_event() {
            break event;
        }
        let next = host.cm.next_deadline_ns().expect("a DREQ timer runs");
        world.fabric.advance(rnic_hw_model::time::Picoseconds::from_nanos(
            next.saturating_sub(world.now_ns()).max(1),
        ));
    };
    assert_eq!(
        (event.kind, event.status, event.id.clone()),
        (CmEventKind::Disconnected, -110, client.clone())
    );
    let elapsed = world.now_ns() - start;
    // 1 + 15 DREQs, each waited for as long as the REQ (2 × 2^(18-8) + 2^(20-8) ms).
    assert!(
        (16 * 6_144_000_000..16 * 6_144_000_000 + 1_000_000).contains(&elapsed),
        "{elapsed} ns"
    );
    let counters = host.cm.counters();
    assert_eq!(counters.sent - sent_before, 16, "the DREQ and its 15 retransmissions");
    assert_eq!(counters.timeouts, 1);
    // Then timewait, as after a DREP; no second DISCONNECTED.
    let event = loop {
        host.cm.progress();
        if let Some(event) = host.channel.get_event() {
            break event;
        }
        let next = host.cm.next_deadline_ns().expect("the timewait timer runs");
        world.fabric.advance(rnic_hw_model::time::Picoseconds::from_nanos(
            next.saturating_sub(world.now_ns()).max(1),
        ));
    };
    assert_eq!(event.kind, CmEventKind::TimewaitExit);
    // Disconnecting again is harmless (Linux returns 0) and sends nothing.
    client.disconnect().unwrap();
    host.cm.progress();
    assert_eq!(host.cm.counters().sent - sent_before, 16);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn a_peer_that_takes_the_dreq_but_never_disconnects_is_timed_out() {
    // The peer's connection manager runs, reports DISCONNECTED to its application and
    // waits for it to disconnect (DREQ_RCVD); the application never does (qperf's server
    // before its next test). No DREP comes: our retransmissions are duplicates there, and
    // we give up after Linux's retries, DISCONNECTED with -ETIMEDOUT.
    let mut world = World::new(2, 12);
    let listener = listen(&world, 1, 5200, PortSpace::Tcp);
    let (client, server) = connect_pair(&mut world, 5200);
    let start = world.now_ns();
    client.disconnect().unwrap();
    let seen = world.run_until(200_000_000_000, |host, e| {
        host == 0 && e.kind == CmEventKind::Disconnected
    });
    let elapsed = world.now_ns() - start;
    let seen: Vec<_> = seen.iter().map(|(h, e)| (*h, e.kind, e.status)).collect();
    assert_eq!(
        seen,
        [(1, CmEventKind::Disconnected, 0), (0, CmEventKind::Disconnected, -110)]
    );
    assert!(
        (16 * 6_144_000_000..16 * 6_144_000_000 + 1_000_000).contains(&elapsed),
        "{elapsed} ns"
    );
    assert_eq!(
        world.hosts[1].cm.counters().duplicates,
        15,
        "the DREQ's retransmissions"
    );
    // The peer's late disconnect is answered by nobody (we are in timewait or done) and
    // harms nothing.
    server.disconnect().unwrap();
    world.run_for(10_000_000_000);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn wildcards_of_both_families_share_a_port_when_both_are_family_only() {
    // tgtd's iSER portals: getaddrinfo(NULL, "3260", AI_PASSIVE) gives 0.0.0.0 and ::,
    // each bound by its own id made family-only (RDMA_OPTION_ID_AFONLY) and listened on.
    // Linux's rdma_cm lets both take the port; each listener gets its family's requests.
    let mut world = World::new(2, 14);
    let server_v6 = std::net::IpAddr::from(world.hosts[1].context.query_gid(1, 1).unwrap().raw());
    assert!(server_v6.is_ipv6());
    let (v4, v6) = {
        let channel = &world.hosts[1].channel;
        let v4 = channel.create_id(4, PortSpace::Tcp).unwrap();
        v4.set_afonly(true).unwrap();
        v4.bind_addr("0.0.0.0:3260".parse().unwrap()).unwrap();
        v4.listen(0).unwrap();
        let v6 = channel.create_id(6, PortSpace::Tcp).unwrap();
        v6.set_afonly(true).unwrap();
        v6.bind_addr("[::]:3260".parse().unwrap()).unwrap();
        v6.listen(0).unwrap();
        (v4, v6)
    };
    for (destination, listener) in [(world.hosts[1].ip, &v4), (server_v6, &v6)] {
        let client = world.hosts[0].channel.create_id(1, PortSpace::Tcp).unwrap();
        client
            .resolve_addr(None, SocketAddr::new(destination, 3260), 2000)
            .unwrap();
        world.expect(0, CmEventKind::AddrResolved);
        client.resolve_route(2000).unwrap();
        world.expect(0, CmEventKind::RouteResolved);
        client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
        client.connect(&ConnParam::default()).unwrap();
        let request = world.expect(1, CmEventKind::ConnectRequest);
        assert_eq!(request.listen_id.as_ref(), Some(listener), "{destination}");
        request.id.reject(&[]).unwrap();
        world.expect(0, CmEventKind::Rejected);
        for id in [client, request.id] {
            id.destroy().unwrap();
        }
    }
    for id in [v4, v6] {
        id.destroy().unwrap();
    }
}

#[test]
fn binding_a_port_follows_linuxs_rules_for_wildcards_and_families() {
    let world = World::new(1, 15);
    let host = &world.hosts[0];
    let v6_address = std::net::IpAddr::from(host.context.query_gid(1, 1).unwrap().raw());
    let id = |context| host.channel.create_id(context, PortSpace::Tcp).unwrap();
    let errno = |result: rnic_verbs::cm::Result<()>| result.unwrap_err().errno();
    let v4_any = id(1);
    v4_any.bind_addr("0.0.0.0:3260".parse().unwrap()).unwrap();
    // An IPv6 wildcard that is not family-only (the default: net.ipv6.bindv6only = 0)
    // overlaps the IPv4 wildcard: EADDRNOTAVAIL, as cma_check_port answers.
    let v6_any = id(2);
    assert_eq!(errno(v6_any.bind_addr("[::]:3260".parse().unwrap())), 99);
    // So does a specific IPv4 address on the wildcard's port.
    let v4_one = id(3);
    assert_eq!(errno(v4_one.bind_addr(SocketAddr::new(host.ip, 3260))), 99);
    // Family-only, the IPv6 wildcard takes the port (an IPv4 id is family-only already).
    v6_any.set_afonly(true).unwrap();
    v6_any.bind_addr("[::]:3260".parse().unwrap()).unwrap();
    // The same specific address twice: EADDRINUSE; addresses of two families: no clash.
    v4_one.bind_addr(SocketAddr::new(host.ip, 3261)).unwrap();
    let again = id(4);
    assert_eq!(errno(again.bind_addr(SocketAddr::new(host.ip, 3261))), 98);
    let v6_one = id(5);
    v6_one.bind_addr(SocketAddr::new(v6_address, 3261)).unwrap();
    // Another port space is another set of ports.
    let udp = host.channel.create_id(6, PortSpace::Udp).unwrap();
    udp.bind_addr("0.0.0.0:3260".parse().unwrap()).unwrap();
    // The option is the id's until it listens or connects (EINVAL after).
    v6_any.listen(0).unwrap();
    assert_eq!(errno(v6_any.set_afonly(false)), 22);
    // A destroyed id gives its port back: the specific IPv4 address refused above now
    // shares the port with the family-only IPv6 wildcard.
    v4_any.destroy().unwrap();
    let v4_after = id(7);
    v4_after.bind_addr(SocketAddr::new(host.ip, 3260)).unwrap();
    for id in [v6_any, v4_one, again, v6_one, udp, v4_after] {
        id.destroy().unwrap();
    }
}

/// An active id with its own QP, established, whose RTU was lost: the passive id
/// (`request.id`) is still in REP_SENT (its QP RTS since the accept, as Linux's).
fn established_with_a_lost_rtu(world: &mut World) -> OwnQpConnection {
    let connection = connect_with_own_qp(world);
    world
        .fabric
        .with_fabric(|fabric| fabric.set_faults("loss=1".parse().unwrap()));
    connection.client.establish().unwrap();
    let lost = world.run_for(1_000_000);
    world
        .fabric
        .with_fabric(|fabric| fabric.set_faults(FaultPlan::default()));
    assert!(world.fabric.statistics().dropped > 0, "the RTU was sent and lost");
    assert!(
        lost.iter().all(|(host, _)| *host == 0),
        "the server saw no RTU: {lost:?}"
    );
    connection
}

#[test]
fn a_lost_rtu_leaves_the_passive_side_in_rep_sent_and_its_disconnect_rejects_nothing() {
    // The capture behind this test: rxe's perftest connected to ours, netem lost the RTU,
    // the SENDs flowed anyway (our QP was RTS since the accept), and at the end our
    // server's disconnect in REP_SENT sent a REJ that reached rxe, established and
    // disconnecting, as "RDMA_CM_EVENT_REJECTED; error: 28". Linux sends nothing there
    // and takes the peer's DREQ in REP_SENT.
    let mut world = World::new(2, 13);
    // The QP and CQ stay bound in `connection` for the test's length.
    let connection = established_with_a_lost_rtu(&mut world);
    let (listener, client, server) = (connection.listener, connection.client, connection.request.id);
    let rejects_before = world.hosts[1].cm.counters().rejects_sent;
    // The server disconnects first: its QP goes to ERR, nothing goes on the wire.
    server.disconnect().unwrap();
    assert_eq!(server.qp().unwrap().unwrap().state(), QpState::Err);
    // The client, established, disconnects: its DREQ is taken in REP_SENT.
    client.disconnect().unwrap();
    let mut seen = world.run_until(10_000_000_000, |host, event| {
        host == 1 && event.kind == CmEventKind::Disconnected
    });
    // Answering the DREQ (the DREP) ends the client's disconnect without an error.
    server.disconnect().unwrap();
    seen.extend(world.run_until(10_000_000_000, |host, event| {
        host == 0 && event.kind == CmEventKind::Disconnected
    }));
    let client_disconnected = seen
        .iter()
        .find(|(host, event)| *host == 0 && event.kind == CmEventKind::Disconnected);
    assert_eq!(client_disconnected.map(|(_, event)| event.status), Some(0));
    assert!(
        seen.iter().all(|(_, event)| event.kind != CmEventKind::Rejected),
        "nobody is rejected: {:?}",
        seen.iter().map(|(h, e)| (*h, e.kind, e.status)).collect::<Vec<_>>()
    );
    assert_eq!(
        world.hosts[1].cm.counters().rejects_sent,
        rejects_before,
        "no REJ from the server"
    );
    world.expect(0, CmEventKind::TimewaitExit);
    world.expect(1, CmEventKind::TimewaitExit);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}

#[test]
fn after_a_disconnect_in_rep_sent_the_repeated_rep_brings_the_rtu_and_a_second_disconnect_sends_the_dreq() {
    // A peer that never disconnects: the REP is retransmitted, the established client
    // answers it with its RTU again (cm_dup_rep_handler), the server reports ESTABLISHED
    // (Linux's cm_rtu_handler does so in REP_SENT whatever the QP's state) and its
    // application's next disconnect is an ordinary DREQ.
    let mut world = World::new(2, 14);
    // The QP and CQ stay bound in `connection` for the test's length.
    let connection = established_with_a_lost_rtu(&mut world);
    let (listener, client, server) = (connection.listener, connection.client, connection.request.id);
    server.disconnect().unwrap();
    let seen = world.run_until(30_000_000_000, |host, event| {
        host == 1 && event.kind == CmEventKind::Established
    });
    assert!(
        seen.iter().all(|(_, event)| event.kind != CmEventKind::Rejected),
        "{seen:?}"
    );
    assert!(
        world.hosts[1].cm.counters().retransmissions > 0,
        "the REP was sent again"
    );
    server.disconnect().unwrap();
    let disconnected = world.expect(0, CmEventKind::Disconnected);
    assert_eq!(disconnected.status, 0);
    client.disconnect().unwrap();
    world.expect(1, CmEventKind::Disconnected);
    world.expect(0, CmEventKind::TimewaitExit);
    world.expect(1, CmEventKind::TimewaitExit);
    for id in [client, server, listener] {
        id.destroy().unwrap();
    }
}
