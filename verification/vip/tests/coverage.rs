//! The coverage groups inferred per device from its ports, on a real device: the MTU and
//! destination of a QP and the hop counts and page sizes of its objects from the contexts
//! the firmware read from the mailbox, and the causes of retransmissions on a link that
//! loses a packet.

mod common;

use common::{bring_up_pair, Driver, CONFIG_B};
use rnic_vip::coverage::Coverage;
use rnic_vip::Session;

/// An RDMA WRITE of 4 KiB (four 1024-byte packets) from A to B, the `drop`-th packet A
/// sends lost on the way; A's coverage.
fn write_losing(drop: Option<usize>) -> Coverage {
    let mut a = Session::new("", None).unwrap();
    let mut b = Session::new(CONFIG_B, None).unwrap();
    let (mut driver, _): (Driver, Driver) = bring_up_pair(&mut a, &mut b);
    driver.write_wqe(&mut a, 0, 4096);
    driver.ring_sq(&mut a, 0);
    let mut sent = 0;
    let mut frames = Vec::new();
    // Carry the frames by hand: the lost one never reaches B.
    for _ in 0..100_000 {
        while let Some(frame) = a.poll_transmit() {
            if Some(sent) != drop {
                frames.push(frame.frame);
            }
            sent += 1;
        }
        for frame in frames.drain(..) {
            b.receive_frame(&frame).unwrap();
        }
        while let Some(frame) = b.poll_transmit() {
            a.receive_frame(&frame.frame).unwrap();
        }
        let next = [a.next_event_time(), b.next_event_time()].into_iter().flatten().min();
        let Some(next) = next else { break };
        a.advance_to(next).unwrap();
        b.advance_to(next).unwrap();
    }
    assert!(driver.cqe(&a, 0)[0] & 0x80 != 0, "the WRITE completed");
    a.coverage()
}

fn hits(coverage: &Coverage, group: &str, bin: &str) -> u64 {
    coverage.groups[group].bins.get(bin).copied().unwrap_or(0)
}

#[test]
fn the_mtu_and_the_mtt_set_up_by_the_contexts_are_covered() {
    let coverage = write_losing(None);
    assert_eq!(
        hits(
            &coverage,
            "transmitted.opcode_size_mtu",
            "RC_RDMA_WRITE_FIRST/257-1024/mtu1024"
        ),
        1
    );
    assert_eq!(
        hits(
            &coverage,
            "transmitted.opcode_size_mtu",
            "RC_RDMA_WRITE_LAST/257-1024/mtu1024"
        ),
        1
    );
    assert!(hits(&coverage, "received.opcode_size_mtu", "RC_ACKNOWLEDGE/-/mtu1024") >= 1);
    for bin in ["MPT/PA", "CQ/hop0/4KiB", "EQ/hop0/4KiB", "QP/hop0/4KiB"] {
        assert_eq!(
            hits(&coverage, "mtt.hop_page", bin),
            1,
            "{bin}: {:?}",
            coverage.groups["mtt.hop_page"]
        );
    }
    let retransmissions: u64 = coverage.groups["retransmission.cause"].bins.values().sum();
    assert_eq!(retransmissions, 0, "nothing was lost");
}

#[test]
fn a_lost_middle_packet_is_sent_again_after_the_sequence_nak() {
    let coverage = write_losing(Some(1));
    assert!(hits(&coverage, "received.aeth", "NAK_PSN_SEQUENCE_ERROR") >= 1);
    assert!(
        hits(&coverage, "retransmission.cause", "NAK_PSN_SEQUENCE_ERROR") >= 1,
        "{:?}",
        coverage.groups["retransmission.cause"]
    );
    assert_eq!(hits(&coverage, "retransmission.cause", "timeout"), 0);
}

#[test]
fn a_lost_last_packet_is_sent_again_when_the_retry_timer_fires() {
    let coverage = write_losing(Some(3));
    // One go-back (of however many packets), one cause.
    assert_eq!(
        hits(&coverage, "retransmission.cause", "timeout"),
        1,
        "{:?}",
        coverage.groups["retransmission.cause"]
    );
    assert_eq!(hits(&coverage, "retransmission.cause", "NAK_PSN_SEQUENCE_ERROR"), 0);
}
