//! Rules between the frames of one RC connection, which no single frame shows.
//!
//! One rule so far: **a plain ACK never names the PSN of an RDMA READ request.** A READ is
//! answered by its READ responses, and a requester that gets a plain ACK with the READ's
//! PSN may take it as the READ's completion: Linux rdma_rxe does (`rxe_comp.c`: a plain
//! ACK at a pending WQE's last PSN completes it), without the data when the responses
//! were lost — nvmet-rdma then stored a buffer it never filled. rxe's own responder never
//! sends such an ACK (it re-acknowledges duplicates with its last SEND/WRITE PSN); this
//! project's did once, for a duplicate WRITE behind a READ.
//!
//! A connection is known from the wire alone: a READ request (requester X to responder
//! Y's QP) and its first READ response (Y to X's QP, the same PSN) pair X's QP with Y's.
//! An ACK on a pair seen no READ response for is not judged. Atomics are not checked:
//! some rxe versions acknowledge duplicates with an atomic's PSN, and the rule is about
//! READ data.

use std::collections::HashMap;

use crate::roce::{RoceFrame, RC_ACKNOWLEDGE};

/// BTH opcode of an RC RDMA READ request.
const RC_READ_REQUEST: u8 = 0x0C;
/// BTH opcodes of the READ responses that start an answer (FIRST, ONLY).
const RC_READ_RESPONSE_FIRST: u8 = 0x0D;
const RC_READ_RESPONSE_ONLY: u8 = 0x10;

/// A plain ACK naming a READ request's PSN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckNamesRead {
    /// Frame number of the ACK.
    pub ack_frame: u64,
    /// Frame number of the READ request it names.
    pub read_frame: u64,
    /// The PSN both carry.
    pub psn: u32,
    /// The requester's QP (the ACK's destination).
    pub requester_qp: u32,
    /// The responder's QP (the READ's destination).
    pub responder_qp: u32,
}

/// Endpoint: an IP address and a QP number.
type Endpoint = ([u8; 16], u32);

/// A READ request by requester IP, responder IP and PSN.
type ReadKey = ([u8; 16], [u8; 16], u32);

/// Checks the rule over `frames` (frame number, frame) in capture order.
pub fn acks_naming_reads<'a>(frames: impl IntoIterator<Item = (u64, &'a RoceFrame)>) -> Vec<AckNamesRead> {
    // (requester IP, responder IP, PSN) -> the responder's QP and the READ's frame.
    let mut reads: HashMap<ReadKey, (u32, u64)> = HashMap::new();
    // Requester endpoint -> responder endpoint, learnt from READ responses.
    let mut peers: HashMap<Endpoint, Endpoint> = HashMap::new();
    let mut found = Vec::new();
    for (number, frame) in frames {
        let (requester_ip, responder_ip) = match frame.opcode {
            RC_READ_REQUEST => (frame.source, frame.destination),
            _ => (frame.destination, frame.source),
        };
        let key = (requester_ip, responder_ip, frame.psn);
        match frame.opcode {
            RC_READ_REQUEST => {
                reads.insert(key, (frame.destination_qp, number));
            }
            RC_READ_RESPONSE_FIRST | RC_READ_RESPONSE_ONLY => {
                if let Some(&(responder_qp, _)) = reads.get(&key) {
                    peers
                        .entry((requester_ip, frame.destination_qp))
                        .or_insert((responder_ip, responder_qp));
                }
            }
            RC_ACKNOWLEDGE if frame.ack_syndrome.is_some_and(|syndrome| syndrome >> 5 == 0) => {
                let requester = (requester_ip, frame.destination_qp);
                let Some(&(_, paired_qp)) = peers.get(&requester) else {
                    continue;
                };
                match reads.get(&key) {
                    Some(&(responder_qp, read_frame)) if responder_qp == paired_qp => found.push(AckNamesRead {
                        ack_frame: number,
                        read_frame,
                        psn: frame.psn,
                        requester_qp: requester.1,
                        responder_qp,
                    }),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2];
    const Y: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 3];
    /// X's QP and Y's QP of the connection.
    const QX: u32 = 0x20;
    const QY: u32 = 0x0A;

    fn frame(source: [u8; 16], destination: [u8; 16], opcode: u8, qp: u32, psn: u32, syndrome: u8) -> RoceFrame {
        RoceFrame {
            ipv6: false,
            opcode,
            destination_qp: qp,
            psn,
            source,
            destination,
            ack_syndrome: (opcode == RC_ACKNOWLEDGE).then_some(syndrome),
            udp_checksum: 0,
            icrc_wire: 0,
            icrc_computed: 0,
        }
    }

    fn check(frames: &[RoceFrame]) -> Vec<AckNamesRead> {
        acks_naming_reads(frames.iter().enumerate().map(|(i, f)| (i as u64 + 1, f)))
    }

    /// What the lossy NVMe-oF run captured (PSNs shortened): X READs PSN 97 and WRITEs
    /// PSN 92 again; Y answers the READ, then acknowledges the duplicate WRITE with 97.
    #[test]
    fn an_ack_with_a_reads_psn_is_found() {
        let frames = [
            frame(X, Y, RC_READ_REQUEST, QY, 97, 0),
            frame(Y, X, RC_READ_RESPONSE_ONLY, QX, 97, 0),
            frame(X, Y, 0x0A, QY, 92, 0),
            frame(Y, X, RC_ACKNOWLEDGE, QX, 97, 0x1F),
        ];
        assert_eq!(
            check(&frames),
            [AckNamesRead {
                ack_frame: 4,
                read_frame: 1,
                psn: 97,
                requester_qp: QX,
                responder_qp: QY,
            }]
        );
    }

    #[test]
    fn acks_of_writes_naks_and_other_connections_are_not() {
        let frames = [
            frame(X, Y, RC_READ_REQUEST, QY, 97, 0),
            frame(Y, X, RC_READ_RESPONSE_FIRST, QX, 97, 0),
            // An ACK of the WRITE before the READ.
            frame(Y, X, RC_ACKNOWLEDGE, QX, 96, 0x1F),
            // A PSN sequence NAK and an RNR NAK at the READ's PSN are not plain ACKs.
            frame(Y, X, RC_ACKNOWLEDGE, QX, 97, 0x60),
            frame(Y, X, RC_ACKNOWLEDGE, QX, 97, 0x20 | 0x0E),
            // Another QP of X, whose connection answered no READ.
            frame(Y, X, RC_ACKNOWLEDGE, QX + 1, 97, 0x1F),
            // The other direction: Y is not a requester of any READ.
            frame(X, Y, RC_ACKNOWLEDGE, QY, 97, 0x1F),
        ];
        assert_eq!(check(&frames), []);
    }

    #[test]
    fn a_connection_whose_read_was_never_answered_is_not_judged() {
        let frames = [
            frame(X, Y, RC_READ_REQUEST, QY, 97, 0),
            frame(Y, X, RC_ACKNOWLEDGE, QX, 97, 0x1F),
        ];
        assert_eq!(check(&frames), []);
    }
}
