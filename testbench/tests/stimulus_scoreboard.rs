//! The verification IP's constrained-random stimulus and per-QP scoreboard
//! (`rnic_vip::stimulus`) against the model itself: seeded work requests posted on three RC
//! QP pairs between two register-level NICs; every CQE and every destination buffer handed
//! to the scoreboard, which must agree with the model on all of them — and must catch one
//! deliberately corrupted result, naming the QP, the request and the seed.

mod transport_common;

use std::collections::BTreeMap;

use rnic_firmware_if::context::Mtu;
use rnic_firmware_if::cqe::Cqe;
use rnic_firmware_if::wqe::SqOpcode;
use rnic_hw_model::HostMemory;
use rnic_testbench::harness::{Access, MemoryRegion, MrMode, QpSpec, QueuePair, SendRequest};
use rnic_vip::stimulus::{Completion, QpPair, Scoreboard, Side, Stimulus, StimulusConfig, StimulusError, WrOpcode};
use transport_common::*;

const PAIRS: [QpPair; 3] = [
    QpPair {
        requester: 0x10,
        responder: 0x20,
    },
    QpPair {
        requester: 0x11,
        responder: 0x21,
    },
    QpPair {
        requester: 0x12,
        responder: 0x22,
    },
];

/// What the model did with a stimulus.
struct Outcome {
    /// Every CQE of both NICs, in the order polled.
    completions: Vec<Completion>,
    /// Per request, the bytes at its destination after the run.
    landed: Vec<(u64, Vec<u8>)>,
}

fn sq_opcode(opcode: WrOpcode) -> SqOpcode {
    match opcode {
        WrOpcode::Send => SqOpcode::Send,
        WrOpcode::SendWithImm => SqOpcode::SendWithImm,
        WrOpcode::RdmaWrite => SqOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm => SqOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead => SqOpcode::RdmaRead,
    }
}

/// Posts every request of `stimulus` on two NICs (QPs of `PAIRS`, one CQ and one region per
/// node), runs until idle and collects what came back.
fn run_on_the_model(stimulus: &Stimulus) -> Outcome {
    let mtu = Mtu::from_bytes(stimulus.config().mtu).expect("a valid MTU");
    let mut pair = Pair::new(false);
    let size = stimulus.region_size() as usize;
    let mut regions: Vec<MemoryRegion> = Vec::new();
    let mut cqs = Vec::new();
    let mut qps: BTreeMap<u32, QueuePair> = BTreeMap::new();
    for node in [1u8, 2] {
        let h = if node == 1 { pair.a() } else { pair.b() };
        cqs.push(h.create_polled_cq(1, 1024));
        let bus = h.allocate_filled(size, |_| 0xEE);
        regions.push(h.register_mr(1, bus, size as u64, 1, Access::ALL, MrMode::Physical));
        for p in PAIRS {
            let (qpn, dest) = if node == 1 {
                (p.requester, p.responder)
            } else {
                (p.responder, p.requester)
            };
            let mut spec = QpSpec::rc(qpn, 1, dest);
            spec.mtu = mtu;
            spec.dmac = mac(3 - node);
            spec.dgid = gid(3 - node, false);
            qps.insert(qpn, h.create_qp(&spec));
        }
    }
    pair.sync();
    let (ma, mb) = (regions[0], regions[1]);
    // Per (requester QP, WQE index), the request it carries.
    let mut posted: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for r in stimulus.requests() {
        let payload = r.payload();
        if r.lands_at_requester() {
            pair.b().memory.write(mb.bus + r.remote_offset, &payload).unwrap();
        } else {
            pair.a().memory.write(ma.bus + r.local_offset, &payload).unwrap();
        }
        if r.opcode.consumes_receive() {
            let h = pair.b();
            let qp = qps.get_mut(&r.remote_qpn).unwrap();
            h.post_recv(qp, &[mb.sge(r.remote_offset, r.length.max(1))]);
        }
        let mut request = SendRequest::rdma(
            sq_opcode(r.opcode),
            vec![ma.sge(r.local_offset, r.length)],
            mb.at(r.remote_offset),
            mb.key,
        );
        request.immediate = r.immediate.unwrap_or(0);
        let h = pair.a();
        let qp = qps.get_mut(&r.qpn).unwrap();
        let index = h.post_send(qp, &request);
        h.ring_send(qp);
        posted.insert((r.qpn, index), r.index);
    }
    pair.run();
    let mut completions = Vec::new();
    for (node, cq) in cqs.iter_mut().enumerate() {
        let h = if node == 0 { pair.a() } else { pair.b() };
        let cqes: Vec<Cqe> = h.poll_cq(cq);
        for cqe in cqes {
            let qpn = cqe.local_qp_number();
            let receive = cqe.receive_side();
            completions.push(Completion {
                qpn,
                side: if receive { Side::Responder } else { Side::Requester },
                wr_id: (!receive).then(|| {
                    posted
                        .get(&(qpn, u32::from(cqe.wqe_index())))
                        .copied()
                        .unwrap_or(u64::MAX)
                }),
                status: u32::from(cqe.status()),
                byte_len: receive.then(|| cqe.byte_count()),
                immediate: receive.then(|| cqe.immediate_data()),
            });
        }
    }
    let landed = stimulus
        .requests()
        .iter()
        .map(|r| {
            let bytes = if r.lands_at_requester() {
                pair.a().read_bytes(ma.bus + r.local_offset, r.length as usize)
            } else {
                pair.b().read_bytes(mb.bus + r.remote_offset, r.length as usize)
            };
            (r.index, bytes)
        })
        .collect();
    Outcome { completions, landed }
}

fn stimulus(seed: u64) -> Stimulus {
    Stimulus::generate(StimulusConfig {
        seed,
        count: 48,
        qps: PAIRS.to_vec(),
        mtu: 1024,
        max_packets: 4,
        ..StimulusConfig::default()
    })
    .expect("valid constraints")
}

/// Hands the outcome to the scoreboard; returns the messages of every mismatch.
fn score(stimulus: &Stimulus, outcome: &Outcome) -> Vec<String> {
    let mut scoreboard = Scoreboard::new(stimulus);
    for completion in &outcome.completions {
        let _ = scoreboard.complete(completion);
    }
    for (wr, bytes) in &outcome.landed {
        let _ = scoreboard.check_data(*wr, bytes);
    }
    scoreboard.finish().iter().map(ToString::to_string).collect()
}

#[test]
fn the_model_matches_every_prediction_of_seeded_stimuli() {
    for seed in [1, 2, 3] {
        let stimulus = stimulus(seed);
        let outcome = run_on_the_model(&stimulus);
        let mismatches = score(&stimulus, &outcome);
        assert!(mismatches.is_empty(), "seed {seed}: {mismatches:#?}");
        let receives = stimulus
            .requests()
            .iter()
            .filter(|r| r.opcode.consumes_receive())
            .count();
        assert_eq!(
            outcome.completions.len(),
            stimulus.requests().len() + receives,
            "seed {seed}"
        );
    }
}

#[test]
fn a_corrupted_result_from_the_model_is_caught_naming_the_qp_the_request_and_the_seed() {
    let stimulus = stimulus(42);
    let mut outcome = run_on_the_model(&stimulus);
    let victim = stimulus
        .requests()
        .iter()
        .find(|r| r.qpn == 0x11 && r.length > 100)
        .expect("a request with data on QP 0x11")
        .clone();
    // One byte of the victim's destination flipped, as a faulty DMA write would.
    outcome.landed[victim.index as usize].1[100] ^= 0x01;
    let mismatches = score(&stimulus, &outcome);
    assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
    let expected_start = format!(
        "seed 42: QP 0x11, WR {} ({}, {} B): data at ",
        victim.index,
        victim.opcode.name(),
        victim.length
    );
    assert!(mismatches[0].starts_with(&expected_start), "{}", mismatches[0]);
    assert!(mismatches[0].contains("byte 100"), "{}", mismatches[0]);

    // A completion with a wrong status is caught the same way.
    let mut scoreboard = Scoreboard::new(&stimulus);
    let first = outcome.completions[0];
    let error = scoreboard.complete(&Completion { status: 0x12, ..first }).unwrap_err();
    let StimulusError::Mismatch(mismatch) = error else {
        panic!("a mismatch expected: {error}")
    };
    assert_eq!((mismatch.seed, mismatch.qpn), (42, first.qpn));
    assert!(mismatch.wr.is_some());
}
