//! What both ends of an SRP RDMA channel need: an RC QP with one CQ, and work request
//! IDs that say what a completion is for.

use rnic_verbs::{CompletionQueue, Context, ProtectionDomain, QpCapabilities, QpInitAttributes, QpType, QueuePair};

/// What a work request was for: the top byte of its `wr_id`, an index below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkKind {
    /// A receive of an IU (index: receive slot).
    Receive = 1,
    /// An RDMA READ of data-out (index: request).
    ReadData = 2,
    /// An RDMA WRITE of data-in (index: request; unsignaled).
    WriteData = 3,
    /// The SEND of an IU (index: request or send slot).
    Send = 4,
}

pub(crate) fn wr_id(kind: WorkKind, index: usize) -> u64 {
    (kind as u64) << 56 | index as u64
}

pub(crate) fn decode_wr_id(wr_id: u64) -> Option<(WorkKind, usize)> {
    let index = (wr_id & 0x00FF_FFFF_FFFF_FFFF) as usize;
    let kind = match wr_id >> 56 {
        1 => WorkKind::Receive,
        2 => WorkKind::ReadData,
        3 => WorkKind::WriteData,
        4 => WorkKind::Send,
        _ => return None,
    };
    Some((kind, index))
}

/// Creates an RC QP (in RESET) whose send and receive queues share one new CQ.
pub(crate) fn create_rc_qp(
    context: &Context,
    pd: &ProtectionDomain,
    send_depth: u32,
    recv_depth: u32,
) -> rnic_verbs::Result<(QueuePair, CompletionQueue)> {
    let cq = context.create_cq(send_depth + recv_depth, None, 0)?;
    let qp = pd.create_qp(&QpInitAttributes {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCapabilities {
            max_send_wr: send_depth,
            max_recv_wr: recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    })?;
    Ok((qp, cq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_round_trip() {
        for kind in [
            WorkKind::Receive,
            WorkKind::ReadData,
            WorkKind::WriteData,
            WorkKind::Send,
        ] {
            for index in [0usize, 1, 255, 1 << 40] {
                assert_eq!(decode_wr_id(wr_id(kind, index)), Some((kind, index)));
            }
        }
        assert_eq!(decode_wr_id(0), None);
        assert_eq!(decode_wr_id(7 << 56), None);
    }
}
