//! 1 000 connections made and torn down between two embedded hosts, alternating which
//! side disconnects: afterwards neither device holds a QP, a QP number, a CQ or a memory
//! region more than before, and the connection managers hold no id but the listener.

mod cm_common;

use std::net::SocketAddr;

use cm_common::*;
use rnic_verbs::cm::{CmEventKind, ConnParam, PortSpace};

const CYCLES: usize = 1000;

#[test]
fn a_thousand_connect_disconnect_cycles_leave_nothing_behind() {
    let mut world = World::new(2, 0x1000);
    let listener = listen(&world, 1, 4420, PortSpace::Tcp);
    let baseline: Vec<_> = world
        .hosts
        .iter()
        .map(|h| (h.context.objects_in_use(), h.context.usage().context_chunks))
        .collect();
    let mut qpns = std::collections::BTreeSet::new();
    for cycle in 0..CYCLES {
        let client = world.hosts[0].channel.create_id(cycle as u64, PortSpace::Tcp).unwrap();
        client
            .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
            .unwrap();
        world.expect(0, CmEventKind::AddrResolved);
        client.resolve_route(2000).unwrap();
        world.expect(0, CmEventKind::RouteResolved);
        client.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
        qpns.insert(client.qp().unwrap().unwrap().qp_num());
        client.connect(&ConnParam::default()).unwrap();
        let server = world.expect(1, CmEventKind::ConnectRequest).id;
        server.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
        server.accept(&ConnParam::default()).unwrap();
        world.expect(0, CmEventKind::Established);
        world.expect(1, CmEventKind::Established);
        let (first, first_host, second, second_host) = if cycle % 2 == 0 {
            (&client, 0, &server, 1)
        } else {
            (&server, 1, &client, 0)
        };
        first.disconnect().unwrap();
        world.expect(second_host, CmEventKind::Disconnected);
        second.disconnect().unwrap();
        world.expect(first_host, CmEventKind::Disconnected);
        client.destroy().unwrap();
        server.destroy().unwrap();
    }
    // Let every timewait run out; nothing may be left waiting either.
    world.run_for(10_000_000_000);
    for (host, (objects, chunks)) in world.hosts.iter().zip(&baseline) {
        assert_eq!(host.context.objects_in_use(), *objects, "host {}: objects", host.name);
        assert_eq!(
            host.context.usage().context_chunks,
            *chunks,
            "host {}: context chunks",
            host.name
        );
        let counters = host.cm.counters();
        assert_eq!(
            (
                counters.timeouts,
                counters.malformed,
                counters.unmatched,
                counters.stale_connections
            ),
            (0, 0, 0, 0),
            "host {}: {counters:?}",
            host.name
        );
    }
    // REQ, RTU and DREQ or DREP reached the server each cycle; REP and DREP or DREQ the
    // client.
    assert_eq!(world.hosts[1].cm.counters().received, 3 * CYCLES as u64);
    assert_eq!(world.hosts[0].cm.counters().received, 2 * CYCLES as u64);
    assert_eq!(world.hosts[0].cm.ids(), 0);
    assert_eq!(world.hosts[1].cm.ids(), 1, "only the listener");
    // Nothing leaked (the objects and context chunks above are back at their baseline),
    // and no cycle connected from the number the cycle before had just destroyed: QP
    // numbers go round robin, so a peer's stale state for one never meets its next user.
    assert_eq!(qpns.len(), CYCLES, "a fresh QP number each cycle");
    listener.destroy().unwrap();
}
