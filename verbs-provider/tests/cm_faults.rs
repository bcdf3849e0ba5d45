//! Connections through a faulty wire: CM MADs (and everything else) lost, duplicated,
//! reordered and corrupted. Every connect ends ESTABLISHED, REJECTED or UNREACHABLE —
//! none hangs — and the same seeds give the same events at the same virtual times.

mod cm_common;

use std::net::SocketAddr;

use cm_common::*;
use rnic_hw_model::fabric::{FabricConfig, FaultPlan};
use rnic_verbs::cm::{CmEventKind, CmId, ConnParam, PortSpace};

const ATTEMPTS: usize = 12;

/// One run: `ATTEMPTS` connections one after the other, each disconnected once
/// established. Returns every event as (virtual ns, host, kind, status, id).
/// (virtual ns, host, kind, status, id handle).
type Log = Vec<(u64, usize, CmEventKind, i32, u64)>;

fn run(fault_seed: u64) -> (Log, Vec<CmEventKind>) {
    let faults: FaultPlan = format!("loss=0.15,dup=0.1,reorder=0.1,corrupt=0.02,seed={fault_seed}")
        .parse()
        .unwrap();
    let mut world = World::with_fabric(
        2,
        0xFA17,
        FabricConfig {
            faults,
            ..FabricConfig::default()
        },
    );
    let listener = listen(&world, 1, 4420, PortSpace::Tcp);
    let mut log = Vec::new();
    let mut outcomes = Vec::new();
    let mut servers: Vec<CmId> = Vec::new();
    for _ in 0..ATTEMPTS {
        let client = world.hosts[0].channel.create_id(0, PortSpace::Tcp).unwrap();
        client
            .resolve_addr(None, SocketAddr::new(world.hosts[1].ip, 4420), 2000)
            .unwrap();
        let mut outcome = None;
        let mut finished = false;
        // Bound: 16 REQs 6.1 s apart, 16 REPs 4.1 s apart, MRAs and DREQs: well below.
        let end = world.now_ns() + 600_000_000_000;
        while !finished {
            assert!(world.now_ns() < end, "a connection attempt hung: {log:?}");
            for (host, event) in world.poll() {
                log.push((world.now_ns(), host, event.kind, event.status, event.id.handle()));
                let id = event.id.clone();
                match (host, event.kind) {
                    (0, CmEventKind::AddrResolved) => id.resolve_route(2000).unwrap(),
                    (0, CmEventKind::RouteResolved) => {
                        id.create_qp(&qp_init(&world.hosts[0].pd)).unwrap();
                        id.connect(&ConnParam::default()).unwrap();
                    }
                    (0, CmEventKind::Established) => {
                        outcome = Some(CmEventKind::Established);
                        id.disconnect().unwrap();
                    }
                    (0, kind @ (CmEventKind::Rejected | CmEventKind::Unreachable)) => {
                        outcome = Some(kind);
                        finished = true;
                    }
                    (0, CmEventKind::Disconnected) => finished = true,
                    (1, CmEventKind::ConnectRequest) => {
                        id.create_qp(&qp_init(&world.hosts[1].pd)).unwrap();
                        id.accept(&ConnParam::default()).unwrap();
                        servers.push(id);
                    }
                    (1, CmEventKind::Disconnected) => {
                        let _ = id.disconnect();
                    }
                    (1, CmEventKind::TimewaitExit | CmEventKind::Unreachable | CmEventKind::Rejected) => {
                        servers.retain(|s| *s != id);
                        id.destroy().unwrap();
                    }
                    _ => {}
                }
            }
            world.advance(1_000_000_000);
        }
        outcomes.push(outcome.expect("every attempt ends established, rejected or unreachable"));
        client.destroy().unwrap();
    }
    // Whatever the server side still holds finishes on its own (timewait, REP retries).
    let end = world.now_ns() + 120_000_000_000;
    while !servers.is_empty() && world.now_ns() < end {
        for (host, event) in world.poll() {
            log.push((world.now_ns(), host, event.kind, event.status, event.id.handle()));
            if host == 1
                && matches!(
                    event.kind,
                    CmEventKind::TimewaitExit | CmEventKind::Unreachable | CmEventKind::Rejected
                )
            {
                servers.retain(|s| *s != event.id);
                event.id.destroy().unwrap();
            } else if host == 1 && event.kind == CmEventKind::Disconnected {
                let _ = event.id.disconnect();
            }
        }
        world.advance(1_000_000_000);
    }
    assert!(servers.is_empty(), "server ids left hanging: {servers:?}");
    listener.destroy().unwrap();
    let statistics = world.fabric.statistics();
    assert!(statistics.dropped > 0 && statistics.duplicated > 0, "{statistics:?}");
    // The faults hit the CM's own MADs: lost ones were sent again, doubled ones absorbed.
    let (a, b) = (world.hosts[0].cm.counters(), world.hosts[1].cm.counters());
    assert!(a.retransmissions + b.retransmissions > 0, "{a:?} {b:?}");
    assert!(a.duplicates + b.duplicates > 0, "{a:?} {b:?}");
    (log, outcomes)
}

#[test]
fn every_connect_ends_and_the_same_seed_gives_the_same_events() {
    let (first, outcomes) = run(7);
    let (second, _) = run(7);
    assert_eq!(first, second, "same seeds, same events at the same virtual times");
    assert!(outcomes.contains(&CmEventKind::Established), "{outcomes:?}");
    let (other, _) = run(8);
    assert_ne!(first, other, "another fault seed, another run");
}
