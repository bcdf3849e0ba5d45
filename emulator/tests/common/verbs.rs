//! rnic-verbs over vfio-user for the tests: memory patterns and RC queue pairs taken
//! from RESET to RTS.
#![allow(dead_code)]

use rnic_verbs::{
    AccessFlags, AhAttributes, CompletionQueue, Context, Mtu, ProtectionDomain, QpCapabilities, QpInitAttributes,
    QpType, QueuePair, RcConnection,
};

/// Local write and every remote access.
pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// `len` bytes of a pattern that depends on `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// An RC QP with 16 send and receive WRs of 2 SGEs each, every WR signalled.
pub fn rc_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> QueuePair {
    pd.create_qp(&QpInitAttributes {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCapabilities {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: true,
    })
    .expect("create RC QP")
}

/// RESET → INIT → RTR → RTS towards `remote_qpn` on the NIC with `remote` context.
pub fn connect(qp: &QueuePair, remote: &Context, remote_qpn: u32) {
    qp.connect_rc(&RcConnection {
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: remote_qpn,
        rq_psn: 0,
        sq_psn: 0,
        ah_attr: AhAttributes {
            dgid: remote.query_gid(1, 0).unwrap(),
            sgid_index: 0,
            hop_limit: 64,
            dmac: remote.mac_address(),
            ..AhAttributes::default()
        },
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        max_rd_atomic: 4,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
    })
    .expect("RESET → INIT → RTR → RTS");
}
