//! Shared helpers for the driver-shaped tests: every test talks to the model only
//! through `DeviceAccess` on an `EmbeddedDevice`; the kept clone is used to look inside
//! the model afterwards (diagnostics, context tables, memory).

#![allow(dead_code)]

use rnic_verbs::backend::{EmbeddedConfig, EmbeddedDevice};
use rnic_verbs::{
    AccessFlags, AhAttributes, CompletionQueue, Context, Gid, Mtu, ProtectionDomain, QpAttributeMask, QpAttributes,
    QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair,
};

/// A device and a context opened on it.
pub fn open() -> (EmbeddedDevice, Context) {
    open_with(EmbeddedConfig::default())
}

/// As [`open`] with a device configuration.
pub fn open_with(config: EmbeddedConfig) -> (EmbeddedDevice, Context) {
    let device = EmbeddedDevice::with_config(config);
    let context = Context::open(Box::new(device.clone())).expect("bring-up");
    (device, context)
}

/// Fails the test if the model recorded any diagnostic (a driver protocol violation).
pub fn assert_no_diagnostics(device: &EmbeddedDevice) {
    let diagnostics = device.with_device(|d| d.take_diagnostics());
    assert!(
        diagnostics.is_empty(),
        "the model diagnosed the driver:\n{}",
        diagnostics
            .iter()
            .map(|d| format!("  {d}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Ordinary capabilities for a test QP.
pub fn small_caps() -> QpCapabilities {
    QpCapabilities {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// A QP of `qp_type` on one CQ.
pub fn create_qp(pd: &ProtectionDomain, cq: &CompletionQueue, qp_type: QpType) -> QueuePair {
    pd.create_qp(&QpInitAttributes {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: small_caps(),
        qp_type,
        sq_sig_all: false,
    })
    .expect("create QP")
}

/// RESET→INIT with the attributes ibverbs requires for the QP type.
pub fn to_init(qp: &QueuePair) {
    let mut attr = QpAttributes {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        qkey: 0x1111_1111,
        ..QpAttributes::default()
    };
    let mut mask = QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT;
    match qp.qp_type() {
        QpType::Ud => mask |= QpAttributeMask::QKEY,
        _ => mask |= QpAttributeMask::ACCESS_FLAGS,
    }
    attr.cur_qp_state = QpState::Reset;
    qp.modify(&attr, mask).expect("RESET→INIT");
}

/// INIT→RTR towards `remote_qpn` at `remote_gid` / `remote_mac`.
pub fn to_rtr(qp: &QueuePair, remote_qpn: u32, remote_gid: Gid, remote_mac: [u8; 6]) {
    let attr = QpAttributes {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: remote_qpn,
        rq_psn: 0x123,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ah_attr: AhAttributes {
            dgid: remote_gid,
            sgid_index: 0,
            hop_limit: 64,
            dmac: remote_mac,
            ..AhAttributes::default()
        },
        ..QpAttributes::default()
    };
    let mask = match qp.qp_type() {
        QpType::Ud => QpAttributeMask::STATE,
        QpType::Uc => {
            QpAttributeMask::STATE
                | QpAttributeMask::AV
                | QpAttributeMask::PATH_MTU
                | QpAttributeMask::DEST_QPN
                | QpAttributeMask::RQ_PSN
        }
        QpType::Rc => {
            QpAttributeMask::STATE
                | QpAttributeMask::AV
                | QpAttributeMask::PATH_MTU
                | QpAttributeMask::DEST_QPN
                | QpAttributeMask::RQ_PSN
                | QpAttributeMask::MAX_DEST_RD_ATOMIC
                | QpAttributeMask::MIN_RNR_TIMER
        }
    };
    qp.modify(&attr, mask).expect("INIT→RTR");
}

/// RTR→RTS.
pub fn to_rts(qp: &QueuePair) {
    let attr = QpAttributes {
        qp_state: QpState::Rts,
        sq_psn: 0x456,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttributes::default()
    };
    let mask = match qp.qp_type() {
        QpType::Ud | QpType::Uc => QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
        QpType::Rc => {
            QpAttributeMask::STATE
                | QpAttributeMask::SQ_PSN
                | QpAttributeMask::TIMEOUT
                | QpAttributeMask::RETRY_CNT
                | QpAttributeMask::RNR_RETRY
                | QpAttributeMask::MAX_QP_RD_ATOMIC
        }
    };
    qp.modify(&attr, mask).expect("RTR→RTS");
}

/// Moves a QP to `state` with only the state attribute.
pub fn to_state(qp: &QueuePair, state: QpState) -> rnic_verbs::Result<()> {
    qp.modify(
        &QpAttributes {
            qp_state: state,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE,
    )
}

/// Reads `length` bytes of the model's host memory at bus address `address`.
pub fn read_memory(device: &EmbeddedDevice, address: u64, length: usize) -> Vec<u8> {
    use rnic_verbs::DeviceAccess;
    let mut bytes = vec![0u8; length];
    device.dma_read(address, &mut bytes).expect("readable host memory");
    bytes
}

/// A QP of `qp_type` with capabilities `cap`, sending and receiving on `cq`.
pub fn create_qp_with(pd: &ProtectionDomain, cq: &CompletionQueue, qp_type: QpType, cap: QpCapabilities) -> QueuePair {
    pd.create_qp(&QpInitAttributes {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap,
        qp_type,
        sq_sig_all: false,
    })
    .expect("create QP")
}

/// MAC of a peer that does not exist (its frames, if any, go nowhere).
pub const NOWHERE_MAC: [u8; 6] = [0x02, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE];

/// Moves a fresh QP to RTS towards a peer that does not exist: enough for the posting
/// paths, which never look at the peer.
pub fn to_rts_nowhere(qp: &QueuePair) {
    to_init(qp);
    let gid = Gid(rnic_verbs::driver::bringup::link_local_gid(NOWHERE_MAC));
    to_rtr(qp, 0x99, gid, NOWHERE_MAC);
    to_rts(qp);
}

/// Polls `cq` until `count` completions arrived (or panics after many empty polls, each
/// of which lets device time pass).
pub fn poll_n(device: &EmbeddedDevice, cq: &CompletionQueue, count: usize) -> Vec<rnic_verbs::WorkCompletion> {
    use rnic_verbs::DeviceAccess;
    let mut out = vec![rnic_verbs::WorkCompletion::default(); count];
    let mut got = 0;
    for _ in 0..100_000 {
        got += cq.poll(&mut out[got..]).expect("poll");
        if got == count {
            return out;
        }
        device.delay(1_000);
    }
    panic!("{got} of {count} completions arrived: {:#?}", &out[..got]);
}
