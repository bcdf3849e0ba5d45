//! CM MADs as the connection manager receives them on QP1: any bytes as a 256-byte MAD
//! (header and REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ or SIDR_REP), and the
//! RDMA-CM IP header at the start of a REQ's or SIDR_REQ's private data.
//!
//! Invariants: nothing panics; a MAD that parses emits to 256 bytes that parse back to the
//! same MAD, and an RDMA-CM header that parses emits to one that parses back to it.

use rnic_verbs::cm::mad::{cma, CmMad, CmMessage, CmaHeaderRepr, CMA_HEADER_LEN};

/// Runs one input.
pub fn run(data: &[u8]) {
    if let Ok(mad) = CmMad::parse(data) {
        let bytes = mad.to_bytes();
        assert_eq!(CmMad::parse(&bytes), Ok(mad), "MAD round trip");
        let private = match &mad.message {
            CmMessage::Req(req) => Some(&req.private_data[..]),
            CmMessage::SidrReq(req) => Some(&req.private_data[..]),
            _ => None,
        };
        if let Some(private) = private {
            cma_header(private);
        }
    }
    cma_header(data);
}

fn cma_header(bytes: &[u8]) {
    let Ok(packet) = cma::Packet::new_checked(bytes) else {
        return;
    };
    let Ok(header) = CmaHeaderRepr::parse(&packet) else {
        return;
    };
    // A header whose two addresses are of different families cannot be emitted as one.
    if header.source.is_ipv4() != header.destination.is_ipv4() {
        return;
    }
    let mut out = [0u8; CMA_HEADER_LEN];
    header.emit(&mut cma::Packet::new_unchecked(&mut out[..]));
    let again = CmaHeaderRepr::parse(&cma::Packet::new_checked(&out[..]).expect("the header's length"));
    assert_eq!(again, Ok(header), "RDMA-CM IP header round trip");
}
