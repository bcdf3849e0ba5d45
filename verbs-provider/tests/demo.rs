//! The demo the `rnic-emu` binary prints: two NICs with connected RC QPs.

use rnic_verbs::demo::{bring_up_two_nics, bring_up_two_nics_report};
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
    ] {
        assert!(report.contains(needle), "missing {needle:?} in:\n{report}");
    }
}
