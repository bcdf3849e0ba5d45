//! Queue pairs (`ibv_qp`): one DMA buffer `[SQ][extended SGEs][RQ]` (hns §14 provider
//! layout, each region page aligned) with one MTR, and a QPC the device creates at the
//! first `MODIFY_QPC` (RESET→INIT with an all-zero mask; there is no create-QPC mailbox).
//!
//! [`QueuePair::modify`] translates ibverbs attributes into QPC fields per hns §10.2:
//! every modify sends a context and a mask (mask bit 0 = take the context's bit), with the
//! fields of the transition plus those of the optional attributes present in the mask.
//! The driver does not check the transition itself: the device does, and rejects an
//! illegal one with [`MailboxCompletion::InvalidState`].
//!
//! [`MailboxCompletion::InvalidState`]: rnic_firmware_if::mailbox::MailboxCompletion::InvalidState

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_firmware_if::bits::{Field, Layout};
use rnic_firmware_if::context::{Mtu, QpState as HardwareQpState, Qpc, ServiceType, GSI_QKEY, GSI_QPN, QPC_SIZE};
use rnic_firmware_if::doorbell::{Doorbell, DB_OFFSET, DWQE_OFFSET};
use rnic_firmware_if::mailbox::{ContextTable, MailboxOpcode};
use rnic_firmware_if::mtr::{MtrRegion, QpBufferLayout, MIN_PAGE_SHIFT};
use rnic_firmware_if::regs;
use rnic_firmware_if::wqe::RcSqWqe;

use super::ah::AhAttributes;
use super::context::{check_port, Gid};
use super::cq::{CompletionQueue, CqInner};
use super::error::{DestroyError, Result, VerbsError};
use super::mr::AccessFlags;
use super::pd::{PdInner, ProtectionDomain};
use super::srq::{SharedReceiveQueue, SrqInner};
use crate::device_access::DeviceAccess;
use crate::driver::dma::{Mtr, QueueBuffer, PAGE_SIZE};
use crate::mtr::choose_hop;

/// SQ WQE size (hns `HNS_ROCE_SQWQE_SHIFT`).
pub const SQ_WQE_SIZE: u32 = 64;
/// Extended SGE slot size.
pub const SGE_SIZE: u32 = 16;
/// Smallest extended SGE ring (one page of slots).
pub const MIN_SGE_SLOTS: u32 = 256;
/// SGEs that fit inside an RC/UC SQ WQE.
pub const SGES_IN_WQE: u32 = 2;
/// Inline bytes that fit inside an RC/UC SQ WQE.
pub const INLINE_IN_WQE: u32 = 32;
/// Largest PSN.
pub const PSN_MASK: u32 = 0xFF_FFFF;

/// `ibv_qp_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// `IBV_QPT_RC`.
    Rc = 2,
    /// `IBV_QPT_UC`.
    Uc = 3,
    /// `IBV_QPT_UD`.
    Ud = 4,
}

impl QpType {
    fn service_type(self) -> ServiceType {
        match self {
            Self::Rc => ServiceType::Rc,
            Self::Uc => ServiceType::Uc,
            Self::Ud => ServiceType::Ud,
        }
    }
}

/// `ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// `IBV_QPS_RESET`.
    Reset = 0,
    /// `IBV_QPS_INIT`.
    Init = 1,
    /// `IBV_QPS_RTR`.
    Rtr = 2,
    /// `IBV_QPS_RTS`.
    Rts = 3,
    /// `IBV_QPS_SQD`.
    Sqd = 4,
    /// `IBV_QPS_SQE`.
    Sqe = 5,
    /// `IBV_QPS_ERR`.
    Err = 6,
}

impl fmt::Display for QpState {
    /// The ibverbs spelling without the prefix (`RTS` for `IBV_QPS_RTS`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
        })
    }
}

impl From<QpState> for HardwareQpState {
    fn from(state: QpState) -> Self {
        match state {
            QpState::Reset => Self::Reset,
            QpState::Init => Self::Init,
            QpState::Rtr => Self::Rtr,
            QpState::Rts => Self::Rts,
            QpState::Sqd => Self::Sqd,
            QpState::Sqe => Self::Sqe,
            QpState::Err => Self::Err,
        }
    }
}

impl From<HardwareQpState> for QpState {
    fn from(state: HardwareQpState) -> Self {
        match state {
            HardwareQpState::Reset => Self::Reset,
            HardwareQpState::Init => Self::Init,
            HardwareQpState::Rtr => Self::Rtr,
            HardwareQpState::Rts => Self::Rts,
            // hns: SQ_DRAINING is reported as SQD.
            HardwareQpState::Sqd | HardwareQpState::SqDraining => Self::Sqd,
            HardwareQpState::Sqe => Self::Sqe,
            HardwareQpState::Err => Self::Err,
        }
    }
}

/// `ibv_qp_cap`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCapabilities {
    /// Send work requests.
    pub max_send_wr: u32,
    /// Receive work requests (0 with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send work request.
    pub max_send_sge: u32,
    /// SGEs per receive work request.
    pub max_recv_sge: u32,
    /// Inline bytes per send work request.
    pub max_inline_data: u32,
}

/// `ibv_qp_init_attr`.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttributes<'a> {
    /// CQ for send completions.
    pub send_cq: &'a CompletionQueue,
    /// CQ for receive completions.
    pub recv_cq: &'a CompletionQueue,
    /// SRQ the QP receives from, instead of its own RQ.
    pub srq: Option<&'a SharedReceiveQueue>,
    /// Requested capabilities (the QP reports the actual ones).
    pub cap: QpCapabilities,
    /// Transport.
    pub qp_type: QpType,
    /// Every send WR completes with a CQE (else only signaled ones).
    pub sq_sig_all: bool,
}

bitflags::bitflags! {
    /// `ibv_qp_attr_mask`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct QpAttributeMask: u32 {
        /// `IBV_QP_STATE`.
        const STATE = 1;
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY` (not supported).
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH` (not supported).
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE` (not supported).
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP` (resize: not supported).
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT` (not supported).
        const RATE_LIMIT = 1 << 25;
    }
}

/// `ibv_qp_attr`, field names as in ibverbs (alternate-path fields omitted: not
/// supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttributes {
    /// Target state.
    pub qp_state: QpState,
    /// Assumed current state (with [`QpAttributeMask::CUR_STATE`]).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN (24 bits).
    pub rq_psn: u32,
    /// Send PSN (24 bits).
    pub sq_psn: u32,
    /// Destination QP number (24 bits).
    pub dest_qp_num: u32,
    /// Remote access allowed.
    pub qp_access_flags: AccessFlags,
    /// Capabilities (query only).
    pub cap: QpCapabilities,
    /// Primary path.
    pub ah_attr: AhAttributes,
    /// P_Key index (0).
    pub pkey_index: u16,
    /// SQ draining (query only).
    pub sq_draining: bool,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer (IB 5-bit encoding).
    pub min_rnr_timer: u8,
    /// Port (1).
    pub port_num: u8,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttributes {
    fn default() -> Self {
        Self {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCapabilities::default(),
            ah_attr: AhAttributes::default(),
            pkey_index: 0,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

/// The values of an RC connection that differ from one caller to the next, for
/// [`QueuePair::connect_rc`] and [`QueuePair::rtr_rts_rc`]. Everything else of the
/// RESET→INIT→RTR→RTS sequence (port 1, P_Key index 0, remote write/read/atomic access,
/// and which attributes each step's mask names) is fixed by those methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnection {
    /// Path MTU (RTR).
    pub path_mtu: Mtu,
    /// The remote QP number (RTR).
    pub dest_qp_num: u32,
    /// The first PSN expected from the remote side (RTR).
    pub rq_psn: u32,
    /// The first PSN this QP sends (RTS).
    pub sq_psn: u32,
    /// The primary path: remote GID and MAC, source GID index, hop limit, traffic class (RTR).
    pub ah_attr: AhAttributes,
    /// READs and atomics the remote side may have outstanding here (RTR).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code the remote side is asked to wait (RTR).
    pub min_rnr_timer: u8,
    /// READs and atomics this QP keeps outstanding (RTS).
    pub max_rd_atomic: u8,
    /// Local ACK timeout exponent, 4.096 µs × 2^timeout (RTS).
    pub timeout: u8,
    /// Transport retries, 0..=7 (RTS).
    pub retry_cnt: u8,
    /// RNR retries, 0..=7 with 7 infinite (RTS).
    pub rnr_retry: u8,
}

/// Where the QP's rings live in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpBufferInfo {
    /// SQ depth in WQEs (a power of two).
    pub sq_depth: u32,
    /// Extended SGE slots (0 or a power of two ≥ 256).
    pub sge_count: u32,
    /// RQ depth in WQEs (0 with an SRQ).
    pub rq_depth: u32,
    /// RQ WQE stride in bytes (16 × SGEs per WQE).
    pub rq_stride: u32,
    /// Byte offsets of the SQ, SGE and RQ regions in the buffer.
    pub region_offsets: [u64; 3],
    /// Pages per region.
    pub region_pages: [u64; 3],
    /// Hop number per region.
    pub region_hops: [u8; 3],
}

/// Sizes of the three rings, as hns computes them.
#[derive(Debug, Clone, Copy)]
struct QpGeometry {
    sq_shift: u32,
    sge_shift: u32,
    rq_shift: u32,
    rq_wqe_shift: u32,
    uses_srq: bool,
    cap: QpCapabilities,
    /// Extended SGE slots per WQE (hns §14: SGEs beyond those in the WQE, or the slots
    /// of the largest inline payload).
    ext_sge_per_wqe: u32,
}

impl QpGeometry {
    fn layout(&self) -> QpBufferLayout {
        QpBufferLayout::from_shifts(
            self.sq_shift,
            self.sge_shift,
            self.rq_shift,
            self.rq_wqe_shift,
            self.uses_srq,
        )
    }

    fn sge_count(&self) -> u32 {
        if self.sge_shift == 0 {
            0
        } else {
            1 << self.sge_shift
        }
    }

    fn rq_depth(&self) -> u32 {
        if self.uses_srq {
            0
        } else {
            1 << self.rq_shift
        }
    }
}

/// Software copy of what the driver set (hns keeps the same in `hns_roce_qp`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpSoftState {
    pub(crate) state: QpState,
    access_flags: AccessFlags,
    responder_resources: u8,
    dest_qp_num: u32,
    pub(crate) service_level: u8,
    pkey_index: u16,
    port_num: u8,
    /// Q_Key, substituted for a UD work request's Q_Key with bit 31 set (rdma-core does
    /// this in software too).
    pub(crate) qkey: u32,
    /// Path MTU in bytes, the second limit on inline data (hns `check_inl_data_len`).
    pub(crate) path_mtu: u32,
}

struct QpBuffers {
    buffer: QueueBuffer,
    mtr: Mtr,
}

/// Send-queue bookkeeping of the data path (rdma-core `hns_roce_wq` plus `next_sge`).
/// Indices run freely; a ring slot is `index & (depth − 1)`.
#[derive(Debug)]
pub(crate) struct SendQueue {
    /// WQEs posted.
    pub(crate) head: u32,
    /// WQEs completed and polled (advanced past unsignaled WQEs by the next CQE).
    pub(crate) tail: u32,
    /// Next free extended-SGE slot.
    pub(crate) next_sge: u32,
    /// `wr_id` of the WQE in each slot.
    pub(crate) wrid: Box<[u64]>,
}

/// Receive-queue bookkeeping of the data path.
#[derive(Debug)]
pub(crate) struct RecvQueue {
    /// WQEs posted.
    pub(crate) head: u32,
    /// WQEs completed and polled (receive WQEs complete in order).
    pub(crate) tail: u32,
    /// `wr_id` of the WQE in each slot.
    pub(crate) wrid: Box<[u64]>,
}

pub(crate) struct QpInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    pub(crate) srq: Option<Arc<SrqInner>>,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) sq_sig_all: bool,
    geometry: QpGeometry,
    pub(crate) info: QpBufferInfo,
    /// Bus address of the QP buffer (contiguous), cached so the data path does not take
    /// the `buffers` lock. Valid until release, which the data path cannot race: posting
    /// borrows the [`QueuePair`] that destroying consumes.
    pub(crate) buffer_base: u64,
    soft: Mutex<QpSoftState>,
    /// Lock order: `soft`, then `sq`, then `rq`, then the context lock. Pollers take `sq`
    /// or `rq` under a CQ lock and never the others.
    pub(crate) sq: Mutex<SendQueue>,
    pub(crate) rq: Mutex<RecvQueue>,
    pub(crate) released: AtomicBool,
    buffers: Mutex<Option<QpBuffers>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning would only mean another thread panicked mid-post; the indices it left are
    // still the best information there is.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl QpInner {
    pub(crate) fn soft(&self) -> MutexGuard<'_, QpSoftState> {
        lock(&self.soft)
    }

    pub(crate) fn sq(&self) -> MutexGuard<'_, SendQueue> {
        lock(&self.sq)
    }

    pub(crate) fn rq(&self) -> MutexGuard<'_, RecvQueue> {
        lock(&self.rq)
    }

    /// Actual capabilities.
    pub(crate) fn cap(&self) -> QpCapabilities {
        self.geometry.cap
    }

    /// Extended SGE slots one WQE may use (hns `sq.ext_sge_cnt`).
    pub(crate) fn ext_sge_per_wqe(&self) -> u32 {
        self.geometry.ext_sge_per_wqe
    }

    /// Removes this QP's completions from its CQs (hns `__hns_roce_v2_cq_clean`), as at
    /// a move to RESET and at destroy, so a later poll does not meet CQEs of a QP that no
    /// longer has them outstanding.
    fn clean_cqs(&self) {
        self.recv_cq.clean(self.qpn, self.srq.as_deref());
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.send_cq.clean(self.qpn, None);
        }
    }

    /// Forgets every outstanding WQE (hns `hns_roce_init_qp_indices`).
    fn reset_indices(&self) {
        let mut sq = self.sq();
        sq.head = 0;
        sq.tail = 0;
        sq.next_sge = 0;
        drop(sq);
        let mut rq = self.rq();
        rq.head = 0;
        rq.tail = 0;
    }

    fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let context = &self.pd.context;
        let mut result = Ok(());
        let state = self.soft().state;
        if state != QpState::Reset {
            let mut modify = QpcModify::new(false);
            modify.set(Qpc::QP_ST, HardwareQpState::Reset as u64);
            if let Err(e) =
                context
                    .lock()
                    .driver
                    .mailbox_with_input(MailboxOpcode::ModifyQpc, self.qpn, &modify.into_bytes())
            {
                tracing::error!(qpn = self.qpn, %e, "modify to RESET at destroy failed");
                result = Err(VerbsError::mailbox("MODIFY_QPC to RESET")(e));
            }
        }
        // Unlist before the number is freed, so a new QP with the same number is never
        // removed instead, and clean the CQs before a new QP could complete into them.
        context.unlist_qp(self.qpn, self);
        self.clean_cqs();
        {
            let mut locked = context.lock();
            if let Err(e) = locked.driver.context_put(ContextTable::Qpc, self.qpn) {
                result = result.and(Err(VerbsError::context_table("release QPC entry")(e)));
            }
            if self.qpn == GSI_QPN {
                locked.gsi_qp_in_use = false;
            } else {
                locked.allocators.qps.free(self.qpn);
            }
        }
        if let Some(buffers) = lock(&self.buffers).take() {
            let access: &dyn DeviceAccess = &*context.access;
            buffers.mtr.release(access);
            buffers.buffer.release(access);
        }
        tracing::debug!(qpn = self.qpn, "QP destroyed");
        result
    }
}

/// A queue pair. Dropping it destroys it (best effort).
pub struct QueuePair {
    pub(crate) inner: Arc<QpInner>,
}

// Destruction hangs off the handle, not off `QpInner`: a poller may hold the last
// reference to a `QpInner` (looked up by QPN) while holding a CQ lock, and releasing there
// would clean that CQ and deadlock.
impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.inner.release();
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.inner.qpn)
            .field("qp_type", &self.inner.qp_type)
            .field("state", &self.inner.soft().state)
            .finish()
    }
}

/// A QPC modification: the new context and its mask (hns rule: a mask bit of 0 takes
/// the context's bit, 1 keeps the device's).
struct QpcModify {
    context: Qpc,
    mask: Qpc,
}

impl QpcModify {
    /// `write_everything`: RESET→INIT, where the mask is all zero.
    fn new(write_everything: bool) -> Self {
        Self {
            context: Qpc::zeroed(),
            mask: if write_everything {
                Qpc::zeroed()
            } else {
                Qpc::all_ones()
            },
        }
    }

    fn set(&mut self, field: Field, value: u64) {
        field.set(self.context.bytes_mut(), value);
        self.mask.open_field(field);
    }

    fn set_bool(&mut self, field: Field, value: bool) {
        self.set(field, u64::from(value));
    }

    fn set_dgid(&mut self, gid: Gid) {
        self.context.set_dgid(gid.raw());
        self.mask.open_field(Qpc::DGID_L);
        self.mask.open_field(Qpc::DGID_H);
    }

    fn set_dmac(&mut self, mac: [u8; 6]) {
        self.context.set_dmac(mac);
        self.mask.open_field(Qpc::DMAC);
    }

    fn into_bytes(self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(2 * QPC_SIZE);
        bytes.extend_from_slice(self.context.bytes());
        bytes.extend_from_slice(self.mask.bytes());
        bytes
    }
}

/// `fls(n − 1)`: log2 of `n` rounded up (hns RR_MAX / SR_MAX encoding).
fn log2_round_up(n: u8) -> u64 {
    u64::from(u32::BITS - u32::from(n.max(1) - 1).leading_zeros())
}

/// hns `get_udp_sport`: the RoCEv2 UDP source port from the flow label (or, without
/// one, from both QPNs), as `rdma_flow_label_to_udp_sport`.
pub fn udp_source_port(flow_label: u32, local_qpn: u32, remote_qpn: u32) -> u16 {
    let flow_label = if flow_label == 0 {
        let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
        v ^= v >> 20;
        v ^= v >> 40;
        (v & 0xF_FFFF) as u32
    } else {
        flow_label
    };
    let low = (flow_label & 0x3FFF) ^ ((flow_label & 0xF_C000) >> 14);
    (low | 0xC000) as u16
}

fn geometry(
    context_caps: &rnic_firmware_if::caps::DeviceCaps,
    qp_type: QpType,
    cap: &QpCapabilities,
    uses_srq: bool,
) -> Result<QpGeometry> {
    let invalid = |what: String| Err(VerbsError::InvalidArgument(what));
    if cap.max_send_wr > context_caps.max_sq_wqes {
        return invalid(format!(
            "max_send_wr {} above the device's {}",
            cap.max_send_wr, context_caps.max_sq_wqes
        ));
    }
    if !uses_srq && cap.max_recv_wr > context_caps.max_rq_wqes {
        return invalid(format!(
            "max_recv_wr {} above the device's {}",
            cap.max_recv_wr, context_caps.max_rq_wqes
        ));
    }
    if cap.max_send_sge > u32::from(context_caps.max_sq_sges) {
        return invalid(format!(
            "max_send_sge {} above the device's {}",
            cap.max_send_sge, context_caps.max_sq_sges
        ));
    }
    if cap.max_recv_sge > u32::from(context_caps.max_rq_sges) {
        return invalid(format!(
            "max_recv_sge {} above the device's {}",
            cap.max_recv_sge, context_caps.max_rq_sges
        ));
    }
    if cap.max_inline_data > u32::from(context_caps.max_sq_inline) {
        return invalid(format!(
            "max_inline_data {} above the device's {}",
            cap.max_inline_data, context_caps.max_sq_inline
        ));
    }
    let min_wqes = u32::from(context_caps.min_wqes).max(1);
    let sq_depth = cap.max_send_wr.max(min_wqes).next_power_of_two();
    // Extended SGE slots per WQE (hns §14): RC/UC keep two SGEs (or 32 inline bytes) in
    // the WQE; UD keeps none.
    let inline_slots = cap.max_inline_data.div_ceil(SGE_SIZE);
    let per_wqe = match qp_type {
        QpType::Rc | QpType::Uc => {
            let sges = cap.max_send_sge.saturating_sub(SGES_IN_WQE);
            if cap.max_inline_data > INLINE_IN_WQE {
                sges.max(inline_slots)
            } else {
                sges
            }
        }
        QpType::Ud => {
            let sges = cap.max_send_sge.max(1);
            if cap.max_inline_data > 8 {
                sges.max(inline_slots)
            } else {
                sges
            }
        }
    };
    let sge_count = if per_wqe == 0 {
        0
    } else {
        (sq_depth * per_wqe).next_power_of_two().max(MIN_SGE_SLOTS)
    };
    let rq_max_sge = cap.max_recv_sge.max(1).next_power_of_two();
    let rq_depth = if uses_srq {
        1
    } else {
        cap.max_recv_wr.max(min_wqes).next_power_of_two()
    };
    let actual = QpCapabilities {
        max_send_wr: sq_depth,
        max_recv_wr: if uses_srq { 0 } else { rq_depth },
        // A UD WQE always has room for one SGE in the extended area.
        max_send_sge: if qp_type == QpType::Ud {
            cap.max_send_sge.max(1)
        } else {
            cap.max_send_sge
        },
        max_recv_sge: if uses_srq { 0 } else { rq_max_sge },
        max_inline_data: cap.max_inline_data,
    };
    Ok(QpGeometry {
        sq_shift: sq_depth.trailing_zeros(),
        sge_shift: if sge_count == 0 { 0 } else { sge_count.trailing_zeros() },
        rq_shift: if uses_srq { 0 } else { rq_depth.trailing_zeros() },
        rq_wqe_shift: rq_max_sge.trailing_zeros(),
        uses_srq,
        cap: actual,
        ext_sge_per_wqe: per_wqe,
    })
}

impl ProtectionDomain {
    /// `ibv_create_qp`. The QP starts in RESET; nothing is sent to the device until the
    /// first [`QueuePair::modify`].
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for capabilities beyond the device or objects of
    /// another context; [`VerbsError::OutOfResources`]; context-table failures.
    pub fn create_qp(&self, attributes: &QpInitAttributes<'_>) -> Result<QueuePair> {
        self.create_qp_numbered(attributes, false)
    }

    /// Creates the port's GSI QP, QP1 (the kernel's `IB_QPT_GSI`): a UD QP with the
    /// special number, which the communication manager sends and receives its MADs on.
    /// The device gives it the GSI Q_Key 0x80010000 whatever the QPC holds; this driver
    /// writes that Q_Key too when the QP leaves RESET (with [`QpAttributeMask::QKEY`] or
    /// without). One per context.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] unless `qp_type` is UD or with an SRQ;
    /// [`VerbsError::Busy`] if QP1 exists already; otherwise as
    /// [`ProtectionDomain::create_qp`].
    pub fn create_gsi_qp(&self, attributes: &QpInitAttributes<'_>) -> Result<QueuePair> {
        if attributes.qp_type != QpType::Ud || attributes.srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "the GSI QP is a UD QP with its own receive queue".into(),
            ));
        }
        self.create_qp_numbered(attributes, true)
    }

    fn create_qp_numbered(&self, attributes: &QpInitAttributes<'_>, gsi: bool) -> Result<QueuePair> {
        let context = &self.inner.context;
        for cq in [attributes.send_cq, attributes.recv_cq] {
            if !Arc::ptr_eq(&cq.inner.context, context) {
                return Err(VerbsError::InvalidArgument("a CQ of another context".into()));
            }
        }
        if let Some(srq) = attributes.srq {
            if !Arc::ptr_eq(&srq.inner.pd.context, context) {
                return Err(VerbsError::InvalidArgument("an SRQ of another context".into()));
            }
        }
        let caps = &context.info.caps;
        let geometry = geometry(caps, attributes.qp_type, &attributes.cap, attributes.srq.is_some())?;
        let layout = geometry.layout();
        let page_counts = layout.page_counts(MIN_PAGE_SHIFT);
        let offsets = layout.region_offsets(MIN_PAGE_SHIFT);
        let total_pages: u64 = page_counts.iter().sum();
        // The firmware's hop numbers (hns caps D), raised when a region needs more levels for
        // its root to fit one BT page; never 0, since hop 0 would have to hold for all three
        // regions at once.
        let hop_for = |caps_hop: u8, pages: u64| caps_hop.max(choose_hop(pages, 512)).max(1);
        let hops = [
            hop_for(caps.sq_wqe_hops, page_counts[0]),
            hop_for(caps.ext_sge_hops, page_counts[1]),
            hop_for(caps.rq_wqe_hops, page_counts[2]),
        ];
        let regions: Vec<MtrRegion> = page_counts
            .iter()
            .zip(hops)
            .map(|(&page_count, hop)| MtrRegion { page_count, hop })
            .collect();

        let device: &dyn DeviceAccess = &*context.access;
        let buffer =
            QueueBuffer::allocate(device, total_pages * PAGE_SIZE).map_err(VerbsError::memory("allocate QP buffer"))?;
        let pages = buffer.pages();
        let mtr = match Mtr::create(device, &regions, &pages, MIN_PAGE_SHIFT, MIN_PAGE_SHIFT) {
            Ok(mtr) => mtr,
            Err(e) => {
                buffer.release(device);
                return Err(VerbsError::translation("QP buffer translation")(e));
            }
        };

        let mut state = context.lock();
        let number = if gsi {
            (!state.gsi_qp_in_use).then(|| {
                state.gsi_qp_in_use = true;
                GSI_QPN
            })
        } else {
            state.allocators.qps.allocate()
        };
        let Some(qpn) = number else {
            drop(state);
            mtr.release(device);
            buffer.release(device);
            return Err(if gsi {
                VerbsError::Busy("the GSI QP (QP1) exists already".into())
            } else {
                VerbsError::OutOfResources("no free QP number".into())
            });
        };
        if let Err(e) = state.driver.context_get(ContextTable::Qpc, qpn) {
            if gsi {
                state.gsi_qp_in_use = false;
            } else {
                state.allocators.qps.free(qpn);
            }
            drop(state);
            mtr.release(device);
            buffer.release(device);
            return Err(VerbsError::context_table("QPC entry")(e));
        }
        drop(state);

        let info = QpBufferInfo {
            sq_depth: 1 << geometry.sq_shift,
            sge_count: geometry.sge_count(),
            rq_depth: geometry.rq_depth(),
            rq_stride: SGE_SIZE << geometry.rq_wqe_shift,
            region_offsets: offsets,
            region_pages: page_counts,
            region_hops: hops,
        };
        tracing::debug!(qpn, qp_type = ?attributes.qp_type, ?info, "QP created");
        let buffer_base = buffer.address();
        let inner = Arc::new(QpInner {
            pd: self.inner.clone(),
            send_cq: attributes.send_cq.inner.clone(),
            recv_cq: attributes.recv_cq.inner.clone(),
            srq: attributes.srq.map(|s| s.inner.clone()),
            qpn,
            qp_type: attributes.qp_type,
            sq_sig_all: attributes.sq_sig_all,
            geometry,
            info,
            buffer_base,
            soft: Mutex::new(QpSoftState {
                state: QpState::Reset,
                access_flags: AccessFlags::empty(),
                responder_resources: 0,
                dest_qp_num: 0,
                service_level: 0,
                pkey_index: 0,
                port_num: 1,
                qkey: 0,
                path_mtu: if attributes.qp_type == QpType::Ud {
                    4096
                } else {
                    Mtu::Mtu1024.bytes()
                },
            }),
            sq: Mutex::new(SendQueue {
                head: 0,
                tail: 0,
                next_sge: 0,
                wrid: vec![0; info.sq_depth as usize].into_boxed_slice(),
            }),
            rq: Mutex::new(RecvQueue {
                head: 0,
                tail: 0,
                wrid: vec![0; info.rq_depth as usize].into_boxed_slice(),
            }),
            released: AtomicBool::new(false),
            buffers: Mutex::new(Some(QpBuffers { buffer, mtr })),
        });
        context.list_qp(&inner);
        Ok(QueuePair { inner })
    }
}

impl QueuePair {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// State as the driver last set it.
    pub fn state(&self) -> QpState {
        self.inner.soft().state
    }

    /// Actual capabilities (depths rounded up to powers of two).
    pub fn cap(&self) -> QpCapabilities {
        self.inner.geometry.cap
    }

    /// Buffer layout.
    pub fn buffer_info(&self) -> QpBufferInfo {
        self.inner.info
    }

    /// Send CQ number.
    pub fn send_cq_number(&self) -> u32 {
        self.inner.send_cq.cqn
    }

    /// Receive CQ number.
    pub fn recv_cq_number(&self) -> u32 {
        self.inner.recv_cq.cqn
    }

    /// SRQ number, if the QP receives from an SRQ.
    pub fn srq_number(&self) -> Option<u32> {
        self.inner.srq.as_ref().map(|s| s.srqn)
    }

    /// PD number.
    pub fn pd_number(&self) -> u32 {
        self.inner.pd.pdn
    }

    fn buffer_address(&self, region: usize, offset: u64) -> Option<u64> {
        let inner = &self.inner;
        (!inner.released.load(Ordering::Acquire))
            .then(|| inner.buffer_base + inner.info.region_offsets[region] + offset)
    }

    /// Bus address of SQ WQE `index` (modulo the depth).
    pub fn sq_wqe_address(&self, index: u32) -> Option<u64> {
        let slot = index & (self.inner.info.sq_depth - 1);
        self.buffer_address(0, u64::from(slot) * u64::from(SQ_WQE_SIZE))
    }

    /// Bus address of extended SGE slot `index` (modulo the slot count).
    pub fn sge_address(&self, index: u32) -> Option<u64> {
        let count = self.inner.info.sge_count;
        (count > 0)
            .then(|| self.buffer_address(1, u64::from(index & (count - 1)) * u64::from(SGE_SIZE)))
            .flatten()
    }

    /// Bus address of RQ WQE `index` (modulo the depth).
    pub fn rq_wqe_address(&self, index: u32) -> Option<u64> {
        let depth = self.inner.info.rq_depth;
        (depth > 0)
            .then(|| self.buffer_address(2, u64::from(index & (depth - 1)) * u64::from(self.inner.info.rq_stride)))
            .flatten()
    }

    /// Producer indices of the SQ and RQ (WQEs posted, free-running).
    pub fn heads(&self) -> (u32, u32) {
        (self.inner.sq().head, self.inner.rq().head)
    }

    /// Rings the SQ doorbell with `producer_index` without writing WQEs, and takes it as
    /// the SQ head: for tests of the device. [`QueuePair::post_send`] rings it itself.
    pub fn ring_sq_doorbell(&self, producer_index: u16) {
        self.inner.sq().head = u32::from(producer_index);
        self.inner
            .ring_sq_doorbell(producer_index, self.inner.soft().service_level);
    }

    /// Rings the RQ doorbell with `producer_index` without writing WQEs, and takes it as
    /// the RQ head: for tests of the device. [`QueuePair::post_recv`] rings it itself.
    pub fn ring_rq_doorbell(&self, producer_index: u16) {
        self.inner.rq().head = u32::from(producer_index);
        self.inner.ring_rq_doorbell(producer_index);
    }

    /// `ibv_modify_qp`.
    ///
    /// # Errors
    /// [`VerbsError::NotSupported`] for alternate paths, path migration, resizing, rate
    /// limits and SQD notification; [`VerbsError::InvalidArgument`] for values out of
    /// range; [`VerbsError::Mailbox`] when the device refuses (an illegal transition is
    /// [`MailboxCompletion::InvalidState`](rnic_firmware_if::mailbox::MailboxCompletion::InvalidState)).
    pub fn modify(&self, attr: &QpAttributes, mask: QpAttributeMask) -> Result<()> {
        self.inner.modify(attr, mask)
    }

    /// RESET → INIT for an RC (or UC) QP: port 1, P_Key index 0, remote write, read and
    /// atomic access allowed. Receives may be posted from here on, before
    /// [`QueuePair::rtr_rts_rc`] completes the connection.
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn init_rc(&self) -> Result<()> {
        self.modify(
            &QpAttributes {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::PKEY_INDEX
                | QpAttributeMask::PORT
                | QpAttributeMask::ACCESS_FLAGS,
        )
    }

    /// INIT → RTR → RTS for an RC QP with the values of `connection` (the second half of
    /// [`QueuePair::connect_rc`]).
    ///
    /// # Errors
    /// As [`QueuePair::modify`].
    pub fn rtr_rts_rc(&self, connection: &RcConnection) -> Result<()> {
        self.modify(
            &QpAttributes {
                qp_state: QpState::Rtr,
                path_mtu: connection.path_mtu,
                dest_qp_num: connection.dest_qp_num,
                rq_psn: connection.rq_psn,
                max_dest_rd_atomic: connection.max_dest_rd_atomic,
                min_rnr_timer: connection.min_rnr_timer,
                ah_attr: connection.ah_attr,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::AV
                | QpAttributeMask::PATH_MTU
                | QpAttributeMask::DEST_QPN
                | QpAttributeMask::RQ_PSN
                | QpAttributeMask::MAX_DEST_RD_ATOMIC
                | QpAttributeMask::MIN_RNR_TIMER,
        )?;
        self.modify(
            &QpAttributes {
                qp_state: QpState::Rts,
                sq_psn: connection.sq_psn,
                timeout: connection.timeout,
                retry_cnt: connection.retry_cnt,
                rnr_retry: connection.rnr_retry,
                max_rd_atomic: connection.max_rd_atomic,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::SQ_PSN
                | QpAttributeMask::TIMEOUT
                | QpAttributeMask::RETRY_CNT
                | QpAttributeMask::RNR_RETRY
                | QpAttributeMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// RESET → INIT → RTR → RTS for an RC QP: [`QueuePair::init_rc`], then
    /// [`QueuePair::rtr_rts_rc`] with `connection`.
    ///
    /// # Errors
    /// As [`QueuePair::modify`]; the QP stays in the state the failing step left it in.
    pub fn connect_rc(&self, connection: &RcConnection) -> Result<()> {
        self.init_rc()?;
        self.rtr_rts_rc(connection)
    }

    /// The QP context as the device holds it (`QUERY_QPC`).
    ///
    /// # Errors
    /// Device failures.
    pub fn query_context(&self) -> Result<Qpc> {
        let bytes = self
            .inner
            .pd
            .context
            .lock()
            .driver
            .mailbox_query(MailboxOpcode::QueryQpc, self.inner.qpn, QPC_SIZE)
            .map_err(VerbsError::mailbox("QUERY_QPC"))?;
        Ok(Qpc::parse(&bytes).expect("queried exactly QPC_SIZE bytes"))
    }

    /// `ibv_query_qp`: the attributes read back from the device's QPC (hns
    /// `hns_roce_v2_query_qp`), plus capabilities, P_Key index and port from the driver.
    /// A QP in RESET has no context on the device; its attributes are the defaults.
    ///
    /// # Errors
    /// Device failures; [`VerbsError::InvalidArgument`] if the device returns undefined
    /// state or MTU values.
    pub fn query(&self) -> Result<QpAttributes> {
        let soft = *self.inner.soft();
        let mut attributes = QpAttributes {
            cap: self.inner.geometry.cap,
            pkey_index: soft.pkey_index,
            port_num: soft.port_num,
            ..QpAttributes::default()
        };
        if soft.state == QpState::Reset {
            return Ok(attributes);
        }
        let qpc = self.query_context()?;
        let invalid =
            |e: rnic_firmware_if::context::ContextError| VerbsError::InvalidArgument(format!("device QPC: {e}"));
        let state = QpState::from(qpc.qp_state().map_err(invalid)?);
        attributes.qp_state = state;
        attributes.cur_qp_state = state;
        attributes.sq_draining = qpc.qp_state_raw() == HardwareQpState::SqDraining as u8;
        attributes.path_mtu = match qpc.mtu_raw() {
            0 => Mtu::Mtu1024,
            _ => qpc.mtu().map_err(invalid)?,
        };
        attributes.qkey = qpc.qkey_xrcd();
        attributes.rq_psn = qpc.rx_request_expected_psn();
        attributes.sq_psn = qpc.sq_current_psn();
        attributes.dest_qp_num = qpc.destination_qpn();
        let mut access = AccessFlags::empty();
        access.set(AccessFlags::REMOTE_READ, qpc.remote_read_enable());
        access.set(AccessFlags::REMOTE_WRITE, qpc.remote_write_enable());
        access.set(AccessFlags::REMOTE_ATOMIC, qpc.remote_atomic_enable());
        attributes.qp_access_flags = access;
        attributes.ah_attr = AhAttributes {
            dgid: Gid(qpc.dgid()),
            flow_label: qpc.flow_label(),
            sgid_index: qpc.sgid_index() as u8,
            hop_limit: qpc.hop_limit(),
            traffic_class: qpc.traffic_class(),
            dmac: qpc.dmac(),
            sl: qpc.service_level(),
            static_rate: 0,
            port_num: soft.port_num,
        };
        attributes.max_rd_atomic = 1 << qpc.initiator_depth_log2();
        attributes.max_dest_rd_atomic = 1 << qpc.responder_resources_log2();
        attributes.min_rnr_timer = qpc.min_rnr_timer();
        attributes.timeout = qpc.ack_timeout();
        attributes.retry_cnt = qpc.retry_count_init();
        attributes.rnr_retry = qpc.rnr_retry_init();
        Ok(attributes)
    }

    /// `ibv_destroy_qp`: moves the QP to RESET if needed, then frees its context-table
    /// reference, number and buffer.
    ///
    /// # Errors
    /// Device failures (the QP is gone anyway).
    pub fn destroy(self) -> Result<(), DestroyError<Self>> {
        self.inner.release().map_err(DestroyError::gone)
    }
}

impl QpInner {
    /// `ibv_modify_qp`.
    ///
    /// # Errors
    /// [`VerbsError::NotSupported`] for alternate paths, path migration, resizing, rate
    /// limits and SQD notification; [`VerbsError::InvalidArgument`] for values out of
    /// range; [`VerbsError::Mailbox`] when the device refuses (an illegal transition is
    /// [`MailboxCompletion::InvalidState`](rnic_firmware_if::mailbox::MailboxCompletion::InvalidState)).
    pub(crate) fn modify(&self, attr: &QpAttributes, mask: QpAttributeMask) -> Result<()> {
        let unsupported = QpAttributeMask::ALT_PATH
            | QpAttributeMask::PATH_MIG_STATE
            | QpAttributeMask::CAP
            | QpAttributeMask::RATE_LIMIT
            | QpAttributeMask::EN_SQD_ASYNC_NOTIFY;
        if mask.intersects(unsupported) {
            return Err(VerbsError::NotSupported(format!(
                "QP attributes {:?}",
                mask & unsupported
            )));
        }
        let inner = self;
        let context = &inner.pd.context;
        // Held for the whole modify: concurrent modifies of one QP are serialised, as the
        // kernel does with its QP mutex. Lock order: QP state, then context.
        let mut guard = inner.soft();
        let mut soft = *guard;
        let current = if mask.contains(QpAttributeMask::CUR_STATE) {
            attr.cur_qp_state
        } else {
            soft.state
        };
        let new = if mask.contains(QpAttributeMask::STATE) {
            attr.qp_state
        } else {
            current
        };
        if current == QpState::Reset && new == QpState::Reset {
            // hns: nothing to tell the device.
            return Ok(());
        }
        self.validate(attr, mask)?;

        let mut modify = QpcModify::new(current == QpState::Reset && new == QpState::Init);
        modify.set(Qpc::QP_ST, HardwareQpState::from(new) as u64);
        match (current, new) {
            (QpState::Reset, QpState::Init) => {
                self.reset_to_init(&mut modify);
                if inner.qpn == GSI_QPN {
                    modify.set(Qpc::QKEY_XRCD, u64::from(GSI_QKEY));
                    soft.qkey = GSI_QKEY;
                }
            }
            (QpState::Init, QpState::Init) => self.init_fields(&mut modify),
            (QpState::Init, QpState::Rtr) => self.init_to_rtr(&mut modify, attr, mask),
            (QpState::Rtr, QpState::Rts) => self.rtr_to_rts(&mut modify),
            _ => {}
        }
        // Moving to ERR holds both work queues (as rdma-core does with its SQ and RQ
        // locks) so no post slips in between reading the heads and the device flushing up
        // to them: every WQE up to the heads completes with WR_FLUSH_ERR.
        let queues = (new == QpState::Err).then(|| {
            let sq = inner.sq();
            let rq = inner.rq();
            modify.set(Qpc::SQ_PRODUCER_IDX, u64::from(sq.head & 0xFFFF));
            modify.set(Qpc::RQ_PRODUCER_IDX, u64::from(rq.head & 0xFFFF));
            (sq, rq)
        });
        self.optional_fields(&mut modify, attr, mask, &mut soft);
        if inner.qp_type == QpType::Ud {
            soft.path_mtu = 4096;
        } else if mask.contains(QpAttributeMask::PATH_MTU) {
            soft.path_mtu = attr.path_mtu.bytes();
        }

        context
            .lock()
            .driver
            .mailbox_with_input(MailboxOpcode::ModifyQpc, inner.qpn, &modify.into_bytes())
            .map_err(VerbsError::mailbox("MODIFY_QPC"))?;
        drop(queues);
        soft.state = new;
        if new == QpState::Reset {
            // The device forgot the QP's WQEs; so does the driver, with its completions.
            self.clean_cqs();
            self.reset_indices();
        }
        *guard = soft;
        tracing::debug!(qpn = inner.qpn, from = ?current, to = ?new, "QP modified");
        Ok(())
    }

    fn validate(&self, attr: &QpAttributes, mask: QpAttributeMask) -> Result<()> {
        let context = &self.pd.context;
        let caps = &context.info.caps;
        let invalid = |what: String| Err(VerbsError::InvalidArgument(what));
        if mask.contains(QpAttributeMask::PORT) {
            check_port(attr.port_num)?;
        }
        if mask.contains(QpAttributeMask::PKEY_INDEX) && attr.pkey_index != 0 {
            return invalid(format!("P_Key index {}: the table has one entry", attr.pkey_index));
        }
        if mask.contains(QpAttributeMask::PATH_MTU) {
            let port_mtu = Mtu::try_from(caps.max_mtu).unwrap_or(Mtu::Mtu4096);
            if attr.path_mtu.bytes() > port_mtu.bytes() {
                return invalid(format!(
                    "path MTU {} above the port's {}",
                    attr.path_mtu.bytes(),
                    port_mtu.bytes()
                ));
            }
        }
        let max_reads = caps.max_outstanding_reads.max(1);
        if mask.contains(QpAttributeMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > max_reads {
            return invalid(format!("max_rd_atomic {} above {max_reads}", attr.max_rd_atomic));
        }
        if mask.contains(QpAttributeMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > max_reads {
            return invalid(format!(
                "max_dest_rd_atomic {} above {max_reads}",
                attr.max_dest_rd_atomic
            ));
        }
        if mask.contains(QpAttributeMask::TIMEOUT) && attr.timeout > 31 {
            return invalid(format!("timeout {} above 31", attr.timeout));
        }
        if mask.contains(QpAttributeMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return invalid(format!("retry_cnt {} above 7", attr.retry_cnt));
        }
        if mask.contains(QpAttributeMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return invalid(format!("rnr_retry {} above 7", attr.rnr_retry));
        }
        if mask.contains(QpAttributeMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return invalid(format!("min_rnr_timer {} above 31", attr.min_rnr_timer));
        }
        if mask.contains(QpAttributeMask::DEST_QPN) && attr.dest_qp_num > PSN_MASK {
            return invalid(format!("dest_qp_num {:#x} wider than 24 bits", attr.dest_qp_num));
        }
        if mask.contains(QpAttributeMask::SQ_PSN) && attr.sq_psn > PSN_MASK {
            return invalid(format!("sq_psn {:#x} wider than 24 bits", attr.sq_psn));
        }
        if mask.contains(QpAttributeMask::RQ_PSN) && attr.rq_psn > PSN_MASK {
            return invalid(format!("rq_psn {:#x} wider than 24 bits", attr.rq_psn));
        }
        if mask.contains(QpAttributeMask::AV) {
            attr.ah_attr.validated(context.info.gids.len())?;
        }
        Ok(())
    }

    /// RESET→INIT (hns `modify_qp_reset_to_init`): service type, PD, ring shifts, CQs,
    /// SRQ, and the buffer (hns writes it at INIT→RTR; writing it here as well costs
    /// nothing and lets the device see the rings from INIT on).
    fn reset_to_init(&self, m: &mut QpcModify) {
        let inner = self;
        let g = &inner.geometry;
        self.init_fields(m);
        m.set(Qpc::RQWS, u64::from(g.rq_wqe_shift));
        m.set(Qpc::SGE_SHIFT, u64::from(g.sge_shift));
        m.set(Qpc::SQ_SHIFT, u64::from(g.sq_shift));
        m.set(Qpc::RQ_SHIFT, u64::from(g.rq_shift));
        m.set(Qpc::VLAN_ID, 0xFFF);
        m.set_bool(Qpc::FRE, true);
        m.set_bool(Qpc::SIG_TYPE, !inner.sq_sig_all);
        self.buffer_fields(m);
    }

    /// Fields rewritten by RESET→INIT and INIT→INIT.
    fn init_fields(&self, m: &mut QpcModify) {
        let inner = self;
        m.set(Qpc::TST, inner.qp_type.service_type() as u64);
        m.set(Qpc::PD, u64::from(inner.pd.pdn));
        m.set(Qpc::RX_CQN, u64::from(inner.recv_cq.cqn));
        m.set(Qpc::TX_CQN, u64::from(inner.send_cq.cqn));
        match &inner.srq {
            Some(srq) => {
                m.set_bool(Qpc::SRQ_EN, true);
                m.set(Qpc::SRQN, u64::from(srq.srqn));
                m.set_bool(Qpc::INV_CREDIT, true);
            }
            None => {
                m.set_bool(Qpc::SRQ_EN, false);
                m.set(Qpc::SRQN, 0);
            }
        }
    }

    /// The QP buffer's MTR and the RQ's first pages.
    fn buffer_fields(&self, m: &mut QpcModify) {
        let inner = self;
        let buffers = inner.buffers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(buffers) = buffers.as_ref() else {
            return;
        };
        let mtr = &buffers.mtr;
        let hops = inner.info.region_hops;
        m.set(Qpc::WQE_SGE_BA, mtr.root() >> 3);
        m.set(Qpc::SQ_HOP_NUM, u64::from(hops[0]));
        m.set(Qpc::SGE_HOP_NUM, u64::from(hops[1]));
        m.set(Qpc::RQ_HOP_NUM, u64::from(hops[2]));
        m.set(Qpc::WQE_SGE_BA_PG_SZ, u64::from(mtr.ba_page_size_field()));
        m.set(Qpc::WQE_SGE_BUF_PG_SZ, u64::from(mtr.buffer_page_size_field()));
        if inner.info.rq_depth > 0 {
            let rq = buffers.buffer.address() + inner.info.region_offsets[2];
            let rq_pages = inner.info.region_pages[2];
            m.set(Qpc::RQ_CUR_BLK_ADDR, rq >> 12);
            let next = if rq_pages > 1 { rq + PAGE_SIZE } else { 0 };
            m.set(Qpc::RQ_NXT_BLK_ADDR, next >> 12);
        }
    }

    /// INIT→RTR (hns `modify_qp_init_to_rtr`): the buffer, end-to-end credits, signal
    /// type, MTU and the long-message parameters, and clears of the responder state.
    fn init_to_rtr(&self, m: &mut QpcModify, attr: &QpAttributes, mask: QpAttributeMask) {
        let inner = self;
        self.buffer_fields(m);
        m.set_bool(Qpc::RMT_E2E, true);
        m.set_bool(Qpc::SIG_TYPE, !inner.sq_sig_all);
        let mtu = if inner.qp_type == QpType::Ud {
            // hns: UD and GSI QPs always use the largest MTU.
            Some(Mtu::Mtu4096)
        } else if mask.contains(QpAttributeMask::PATH_MTU) {
            Some(attr.path_mtu)
        } else {
            None
        };
        if let Some(mtu) = mtu {
            m.set(Qpc::MTU, mtu as u64);
            let packets = u64::from((mtu.bytes().max(1024) / mtu.bytes()).trailing_zeros());
            m.set(Qpc::LP_PKTN_INI, packets);
            m.set(Qpc::ACK_REQ_FREQ, packets);
        }
        m.set(Qpc::LP_SGEN_INI, 3);
        for field in [
            Qpc::RX_REQ_PSN_ERR,
            Qpc::RX_REQ_MSN,
            Qpc::RX_REQ_LAST_OPTYPE,
            Qpc::RQ_RNR_TIMER,
            Qpc::TRRL_HEAD_MAX,
            Qpc::TRRL_TAIL_MAX,
        ] {
            m.set(field, 0);
        }
    }

    /// RTR→RTS (hns `modify_qp_rtr_to_rts`): the SQ's first pages and clears of the
    /// requester state.
    fn rtr_to_rts(&self, m: &mut QpcModify) {
        let inner = self;
        {
            let buffers = inner.buffers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(buffers) = buffers.as_ref() {
                let base = buffers.buffer.address();
                let sq = base + inner.info.region_offsets[0];
                m.set(Qpc::SQ_CUR_BLK_ADDR, sq >> 12);
                m.set(Qpc::RX_SQ_CUR_BLK_ADDR, sq >> 12);
                let sge = if inner.info.sge_count > 0 {
                    base + inner.info.region_offsets[1]
                } else {
                    0
                };
                m.set(Qpc::SQ_CUR_SGE_BLK_ADDR, sge >> 12);
            }
        }
        for field in [
            Qpc::IRRL_SGE_IDX,
            Qpc::RX_ACK_MSN,
            Qpc::ACK_LAST_OPTYPE,
            Qpc::IRRL_PSN,
            Qpc::IRRL_PSN_VLD,
            Qpc::IRRL_TAIL_REAL,
            Qpc::RETRY_MSG_MSN,
            Qpc::RNR_RETRY_FLAG,
            Qpc::CHECK_FLG,
        ] {
            m.set(field, 0);
        }
    }

    /// The optional attributes (hns `hns_roce_v2_set_opt_fields`), on any transition.
    fn optional_fields(&self, m: &mut QpcModify, attr: &QpAttributes, mask: QpAttributeMask, soft: &mut QpSoftState) {
        let inner = self;
        if mask.contains(QpAttributeMask::DEST_QPN) {
            m.set(Qpc::DQPN, u64::from(attr.dest_qp_num));
            soft.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(QpAttributeMask::AV) {
            let ah = attr
                .ah_attr
                .validated(inner.pd.context.info.gids.len())
                .unwrap_or(attr.ah_attr);
            m.set(Qpc::SL, u64::from(ah.sl));
            m.set(Qpc::GMV_IDX, u64::from(ah.sgid_index));
            m.set(Qpc::HOPLIMIT, u64::from(ah.hop_limit));
            m.set(Qpc::TC, u64::from(ah.traffic_class));
            m.set(Qpc::FL, u64::from(ah.flow_label));
            m.set(Qpc::VLAN_ID, 0xFFF);
            m.set_dgid(ah.dgid);
            m.set_dmac(ah.dmac);
            m.set_bool(Qpc::LBI, ah.dmac == inner.pd.context.info.mac);
            let port = udp_source_port(ah.flow_label, inner.qpn, soft.dest_qp_num);
            m.set(Qpc::UDPSPN, u64::from(port));
            soft.service_level = ah.sl;
        }
        if mask.contains(QpAttributeMask::TIMEOUT) {
            m.set(Qpc::AT, u64::from(attr.timeout));
        }
        if mask.contains(QpAttributeMask::RETRY_CNT) {
            m.set(Qpc::RETRY_NUM_INIT, u64::from(attr.retry_cnt));
            m.set(Qpc::RETRY_CNT, u64::from(attr.retry_cnt));
        }
        if mask.contains(QpAttributeMask::RNR_RETRY) {
            m.set(Qpc::RNR_NUM_INIT, u64::from(attr.rnr_retry));
            m.set(Qpc::RNR_CNT, u64::from(attr.rnr_retry));
        }
        if mask.contains(QpAttributeMask::SQ_PSN) {
            let psn = u64::from(attr.sq_psn);
            for field in [
                Qpc::SQ_CUR_PSN,
                Qpc::SQ_MAX_PSN,
                Qpc::RETRY_MSG_PSN,
                Qpc::RETRY_MSG_FPKT_PSN,
                Qpc::RX_ACK_EPSN,
            ] {
                m.set(field, psn);
            }
        }
        if mask.contains(QpAttributeMask::RQ_PSN) {
            m.set(Qpc::RX_REQ_EPSN, u64::from(attr.rq_psn));
            m.set(Qpc::RAQ_PSN, u64::from(attr.rq_psn.wrapping_sub(1) & PSN_MASK));
        }
        if mask.contains(QpAttributeMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > 0 {
            m.set(Qpc::RR_MAX, log2_round_up(attr.max_dest_rd_atomic));
        }
        if mask.contains(QpAttributeMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > 0 {
            m.set(Qpc::SR_MAX, log2_round_up(attr.max_rd_atomic));
        }
        if mask.intersects(QpAttributeMask::ACCESS_FLAGS | QpAttributeMask::MAX_DEST_RD_ATOMIC) {
            // hns `set_access_flags`: without responder resources only remote write is
            // meaningful; the flags are re-applied when resources arrive later.
            if mask.contains(QpAttributeMask::MAX_DEST_RD_ATOMIC) {
                soft.responder_resources = attr.max_dest_rd_atomic;
            }
            if mask.contains(QpAttributeMask::ACCESS_FLAGS) {
                soft.access_flags = attr.qp_access_flags;
            }
            let mut flags = soft.access_flags;
            if soft.responder_resources == 0 {
                flags &= AccessFlags::REMOTE_WRITE;
            }
            m.set_bool(Qpc::RRE, flags.contains(AccessFlags::REMOTE_READ));
            m.set_bool(Qpc::RWE, flags.contains(AccessFlags::REMOTE_WRITE));
            m.set_bool(Qpc::ATE, flags.contains(AccessFlags::REMOTE_ATOMIC));
            m.set_bool(Qpc::EXT_ATE, false);
        }
        if mask.contains(QpAttributeMask::MIN_RNR_TIMER) {
            m.set(Qpc::MIN_RNR_TIME, u64::from(attr.min_rnr_timer));
        }
        if mask.contains(QpAttributeMask::QKEY) {
            // QP1 keeps the GSI Q_Key (the device ignores anything else for it).
            let qkey = if inner.qpn == GSI_QPN { GSI_QKEY } else { attr.qkey };
            m.set(Qpc::QKEY_XRCD, u64::from(qkey));
            soft.qkey = qkey;
        }
        if mask.contains(QpAttributeMask::PKEY_INDEX) {
            soft.pkey_index = attr.pkey_index;
        }
        if mask.contains(QpAttributeMask::PORT) {
            soft.port_num = attr.port_num;
        }
    }

    /// SQ doorbell (hns §6.1: `TAG = QPN, CMD = 0, PI = head, SL`).
    pub(crate) fn ring_sq_doorbell(&self, producer_index: u16, service_level: u8) {
        let doorbell = Doorbell::sq(self.qpn, producer_index, service_level);
        self.pd
            .context
            .access
            .mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, doorbell.as_u64());
    }

    /// Direct WQE (hns §6.4, in rnic's form: docs/hw-interface.md): the SQ WQE just
    /// written to the ring, with `FLAG` and `WQE_IDX` = the new producer index (and the SL
    /// bits) in its first dword, as eight 8-byte stores to the doorbell page's window,
    /// then the SQ doorbell with `FLAG` set.
    pub(crate) fn ring_sq_direct_wqe(
        &self,
        wqe: [u8; rnic_firmware_if::wqe::SQ_WQE_SIZE],
        producer_index: u16,
        service_level: u8,
    ) {
        let mut wqe = RcSqWqe(wqe);
        wqe.set_direct_flag(true);
        wqe.set_direct_wqe_index(producer_index);
        wqe.set_direct_sl_low(service_level & 0x3);
        wqe.set_direct_sl_high(service_level >> 2);
        let access = &self.pd.context.access;
        for (n, word) in wqe.0.chunks_exact(8).enumerate() {
            let value = u64::from_le_bytes(word.try_into().expect("8-byte chunks"));
            access.mmio_write64(regs::DOORBELL_BAR, DWQE_OFFSET + 8 * n as u64, value);
        }
        let mut doorbell = Doorbell::sq(self.qpn, producer_index, service_level);
        doorbell.set_flag(true);
        access.mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, doorbell.as_u64());
    }

    /// RQ doorbell (hns §6.1: `TAG = QPN, CMD = 1, PI = head`; no RQ record doorbell).
    pub(crate) fn ring_rq_doorbell(&self, producer_index: u16) {
        let doorbell = Doorbell::rq(self.qpn, producer_index);
        self.pd
            .context
            .access
            .mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, doorbell.as_u64());
    }
}
