//! The demo the `rnic-emu` binary prints: two NICs with connected RC QPs.

use rnic_verbs::demo::{bring_up_two_nics, bring_up_two_nics_report, run_traffic};
use rnic_verbs::QpState;

#[test]
fn the_two_demo_nics_end_up_with_their_queue_pairs_connected_in_rts() {
    let [a, b] = bring_up_two_nics().expect("demo");
    let qa = a.qp.query().unwrap();
    let qb = b.qp.query().unwrap();
    assert_eq!(qa.qp_state, QpState::Rts);
    assert_eq!(qb.qp_state, QpState::Rts);
    assert_eq!(qa.dest_qp_num, b.qp.qp_num());
    assert_eq!(qb.dest_qp_num, a.qp.qp_num());
    assert_eq!(qa.ah_attr.dgid, b.gid().unwrap());
    assert_eq!(qa.ah_attr.dmac, b.context.mac_address());
    assert_ne!(a.context.mac_address(), b.context.mac_address());
}

#[test]
fn the_report_names_capabilities_objects_and_states() {
    let report = bring_up_two_nics_report().expect("demo");
    println!("{report}");
    for needle in [
        "NIC A",
        "NIC B",
        "firmware 1.0.0",
        "GID 0 fe80::",
        "lkey",
        "state RTS",
        "SRQ",
        "RDMA WRITE    64 messages     4194304 bytes",
        "SEND/RECV     64 messages",
        "RDMA READ     16 messages",
        "atomics       64 messages",
        "frames sent",
        "virtual time",
    ] {
        assert!(report.contains(needle), "missing {needle:?} in:\n{report}");
    }
}

#[test]
fn the_demo_traffic_moves_every_byte_over_one_fabric() {
    let [a, b] = bring_up_two_nics().expect("demo");
    assert_eq!(a.device.fabric().nics(), 2, "both NICs on one fabric");
    assert_eq!(a.device.now(), b.device.now());
    let report = run_traffic(&a, &b).expect("traffic");
    assert_eq!(report.writes, (64, 64 * 65536));
    assert_eq!(report.sends, (64, 64 * 4096));
    assert_eq!(report.reads, (16, 16 * 65536));
    assert_eq!(report.atomics, 64);
    // At 4 KiB MTU: 1024 + 64 + 256 + 64 request/response packets at least, plus ACKs.
    assert!(report.fabric.sent >= 1408, "{report:?}");
    assert_eq!(report.fabric.sent, report.fabric.delivered);
    assert!(report.elapsed.0 > 0);
    // Again, on the same QPs: the rings and CQs keep going round.
    run_traffic(&a, &b).expect("second run");
}
