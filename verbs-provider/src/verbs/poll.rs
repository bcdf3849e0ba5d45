//! Polling completions (rdma-core `hns_roce_u_v2_poll_cq`) and cleaning a CQ of a QP's
//! completions (`__hns_roce_v2_cq_clean`).
//!
//! * CQE `ci` is at `(ci & (depth − 1)) × cqe_size` and is new when
//!   `OWNER ^ ((ci & depth) != 0)` (hns §8, [`cqe_is_valid`]).
//! * The CQE's local QPN finds the QP (the context's QP table; the previous CQE's QP is
//!   kept, as rdma-core keeps `cur_qp`). Send completions first move the SQ tail up to
//!   the CQE's `WQE_IDX` — `tail += (wqe_idx − tail) & (depth − 1)` — which passes the
//!   unsignaled WQEs before it; receive completions take the RQ tail in order; SRQ
//!   completions name the WQE slot, which goes back to the free bitmap.
//! * After the batch the consumer index is published with the set-CI doorbell.
//! * An error completion (other than a flush or the vendor-specific general error) moves
//!   the QP to ERR, once the CQ is unlocked, so the device flushes what is outstanding
//!   (hns §12.2; the QP's state lock ranks above the CQ lock).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cqe::{cqe_is_valid, Cqe, CqeStatus, RecvOpcode, CQE_SIZE_64};
use rnic_firmware_if::wqe::SqOpcode;

use super::cq::{CompletionQueue, CqInner};
use super::error::{Result, VerbsError};
use super::qp::{QpAttributeMask, QpAttributes, QpInner, QpState, QpType};
use super::srq::SrqInner;
use super::wr::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::device_access::DeviceAccess;

/// QPs one poll call may move to ERR; a poll that meets more error completions than this
/// stops early (the rest are returned by the next call).
const MAX_ERROR_QPS: usize = 4;
/// CQEs one DMA read fetches ahead while polling: each read of host memory has a fixed
/// cost on every backend, so a poll that finds a completion reads the next ones together.
const POLL_BATCH: usize = 8;

/// CQEs read ahead from the ring: a window of `count` consecutive slots from `first`.
struct CqeWindow {
    bytes: [u8; POLL_BATCH * CQE_SIZE_64],
    first: u32,
    count: u32,
}

impl CqeWindow {
    /// A window that holds no CQE yet.
    fn empty() -> Self {
        Self {
            bytes: [0; POLL_BATCH * CQE_SIZE_64],
            first: 0,
            count: 0,
        }
    }
}

impl CqInner {
    fn cqe_address(&self, index: u32) -> u64 {
        self.buffer_base + u64::from(index & (self.depth - 1)) * self.cqe_size as u64
    }

    fn read_cqe(&self, index: u32) -> Result<Cqe> {
        let mut cqe = Cqe::zeroed();
        self.context
            .access
            .dma_read(self.cqe_address(index), &mut cqe.0[..self.cqe_size])
            .map_err(VerbsError::memory("read CQE"))?;
        Ok(cqe)
    }

    /// CQE `index`, from `window` when it holds it, else from a read of up to `wanted`
    /// consecutive CQEs (at most [`POLL_BATCH`], never across the end of the ring) into it.
    /// The CQEs after `index` are a snapshot: one that is not valid yet is read again by
    /// the next poll, as it would be without the window.
    fn read_cqe_ahead(&self, window: &mut CqeWindow, index: u32, wanted: usize) -> Result<Cqe> {
        let offset = index.wrapping_sub(window.first);
        if offset >= window.count {
            let slot = index & (self.depth - 1);
            let count = (wanted.clamp(1, POLL_BATCH) as u32).min(self.depth - slot);
            self.context
                .access
                .dma_read(
                    self.cqe_address(index),
                    &mut window.bytes[..count as usize * self.cqe_size],
                )
                .map_err(VerbsError::memory("read CQE"))?;
            window.first = index;
            window.count = count;
        }
        let at = index.wrapping_sub(window.first) as usize * self.cqe_size;
        let mut cqe = Cqe::zeroed();
        cqe.0[..self.cqe_size].copy_from_slice(&window.bytes[at..at + self.cqe_size]);
        Ok(cqe)
    }

    fn write_cqe(&self, index: u32, cqe: &Cqe) -> Result<()> {
        self.context
            .access
            .dma_write(self.cqe_address(index), &cqe.0[..self.cqe_size])
            .map_err(VerbsError::memory("write CQE"))
    }

    fn poll_into(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        // Read before the CQE: a CQE written after it raises the count past it.
        let writes = self.context.access.driver_memory_writes();
        if writes.is_some() && writes == Some(self.empty_at_writes.load(Ordering::Acquire)) {
            // Nothing written since this CQ was found empty: still empty. A spinning
            // poller on a device emulated by threads of this process then takes no lock
            // of the device and no CPU from them.
            self.context.access.idle();
            return Ok(0);
        }
        // Declared before the lock guard so that they are dropped after it.
        let mut to_error: [Option<Arc<QpInner>>; MAX_ERROR_QPS] = Default::default();
        let mut current: Option<Arc<QpInner>> = None;
        let mut polled = 0usize;
        let mut result = Ok(());
        {
            let mut state = self.poll();
            let start = state.consumer_index;
            // Made only when a poll finds a completion and wants more.
            let mut window: Option<CqeWindow> = None;
            while polled < out.len() {
                let ci = state.consumer_index;
                // The first read takes one CQE, so an empty poll (a spinning caller) costs
                // no more than before; once one is there, read ahead.
                let read = if polled == 0 {
                    self.read_cqe(ci)
                } else {
                    let window = window.get_or_insert_with(CqeWindow::empty);
                    self.read_cqe_ahead(window, ci, out.len() - polled)
                };
                let cqe = match read {
                    Ok(cqe) => cqe,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                };
                if !cqe_is_valid(cqe.owner(), ci, self.depth) {
                    break;
                }
                state.consumer_index = ci.wrapping_add(1);
                let qpn = cqe.local_qp_number();
                if current.as_ref().map(|qp| qp.qpn) != Some(qpn) {
                    current = self.context.find_qp(qpn);
                }
                let Some(qp) = current.as_ref() else {
                    // hns cleans a QP's CQEs when it is reset or destroyed, so this is a
                    // device bug or a race with destroy: drop the CQE, keep polling.
                    rnic_diag::warn!(
                        rnic_diag::global(),
                        crate::diag::CQE_OF_UNKNOWN_QP,
                        cqn = self.cqn,
                        qpn,
                        "CQE of an unknown QP skipped"
                    );
                    continue;
                };
                let status = CqeStatus::try_from(cqe.status()).unwrap_or(CqeStatus::GeneralErr);
                if status.moves_qp_to_error() && !to_error.iter().flatten().any(|q| q.qpn == qpn) {
                    match to_error.iter_mut().find(|slot| slot.is_none()) {
                        Some(slot) => *slot = Some(qp.clone()),
                        None => {
                            // No room to remember the QP: leave the CQE for the next call,
                            // which comes after these QPs moved.
                            state.consumer_index = ci;
                            break;
                        }
                    }
                }
                complete(qp, &cqe, &mut out[polled]);
                polled += 1;
            }
            if state.consumer_index != start {
                self.publish_consumer_index(state.consumer_index);
            }
        }
        for qp in to_error.iter().flatten() {
            qp.enter_error_after_completion();
        }
        if polled == 0 && !out.is_empty() && result.is_ok() {
            if let Some(writes) = writes {
                self.empty_at_writes.store(writes, Ordering::Release);
            }
            // Nothing yet: on a model, let time pass so a spinning caller gets its
            // completions (no-op on hardware).
            self.context.access.idle();
        }
        result.map(|()| polled)
    }

    /// Removes every CQE of QP `qpn` not yet polled, sliding later CQEs over them while
    /// each slot keeps its owner bit, and gives their SRQ slots back (hns §8, rdma-core
    /// `__hns_roce_v2_cq_clean`).
    pub(crate) fn clean(&self, qpn: u32, srq: Option<&SrqInner>) {
        if let Err(e) = self.try_clean(qpn, srq) {
            tracing::error!(cqn = self.cqn, qpn, %e, "cleaning the CQ failed");
        }
    }

    fn try_clean(&self, qpn: u32, srq: Option<&SrqInner>) -> Result<()> {
        let mut state = self.poll();
        let ci = state.consumer_index;
        let mut end = ci;
        while end.wrapping_sub(ci) < self.depth {
            let cqe = self.read_cqe(end)?;
            if !cqe_is_valid(cqe.owner(), end, self.depth) {
                break;
            }
            end = end.wrapping_add(1);
        }
        let mut freed = 0u32;
        let mut index = end;
        while index != ci {
            index = index.wrapping_sub(1);
            let mut cqe = self.read_cqe(index)?;
            if cqe.local_qp_number() == qpn {
                if let (Some(srq), true) = (srq, cqe.receive_side()) {
                    srq.state().free_slot(u32::from(cqe.wqe_index()) & (srq.depth - 1));
                }
                freed += 1;
            } else if freed > 0 {
                let destination = index.wrapping_add(freed);
                cqe.set_owner(self.read_cqe(destination)?.owner());
                self.write_cqe(destination, &cqe)?;
            }
        }
        if freed > 0 {
            state.consumer_index = ci.wrapping_add(freed);
            self.publish_consumer_index(state.consumer_index);
            tracing::debug!(cqn = self.cqn, qpn, freed, "CQ cleaned");
        }
        Ok(())
    }
}

/// Fills `wc` from `cqe` of `qp`, taking the `wr_id` from the QP's (or SRQ's) records.
fn complete(qp: &QpInner, cqe: &Cqe, wc: &mut WorkCompletion) {
    let mut status = WcStatus::from_hardware(cqe.status());
    let mut flags = WcFlags::empty();
    let mut opcode = WcOpcode::Send;
    let mut byte_len = 0;
    let mut imm_data = 0;
    let mut invalidated_rkey = 0;
    let mut src_qp = 0;
    let mut smac = [0u8; 6];
    let mut sl = 0;
    let wqe_index = u32::from(cqe.wqe_index());
    let wr_id;
    if !cqe.receive_side() {
        let depth = qp.info.sq_depth;
        let mut sq = qp.sq();
        // Unsignaled WQEs before this one completed with it (§8).
        let tail = sq.tail;
        sq.tail = tail.wrapping_add(wqe_index.wrapping_sub(tail) & (depth - 1));
        wr_id = sq.wrid[(sq.tail & (depth - 1)) as usize];
        sq.tail = sq.tail.wrapping_add(1);
        drop(sq);
        match SqOpcode::try_from(cqe.opcode()) {
            Ok(SqOpcode::Send | SqOpcode::SendWithInv) => opcode = WcOpcode::Send,
            Ok(SqOpcode::SendWithImm) => {
                opcode = WcOpcode::Send;
                flags |= WcFlags::WITH_IMM;
            }
            Ok(SqOpcode::RdmaWrite) => opcode = WcOpcode::RdmaWrite,
            Ok(SqOpcode::RdmaWriteWithImm) => {
                opcode = WcOpcode::RdmaWrite;
                flags |= WcFlags::WITH_IMM;
            }
            Ok(SqOpcode::RdmaRead) => {
                opcode = WcOpcode::RdmaRead;
                byte_len = cqe.byte_count();
            }
            Ok(SqOpcode::AtomCmpAndSwap | SqOpcode::AtomMskCmpAndSwap) => {
                opcode = WcOpcode::CompSwap;
                byte_len = cqe.byte_count();
            }
            Ok(SqOpcode::AtomFetchAndAdd | SqOpcode::AtomMskFetchAndAdd) => {
                opcode = WcOpcode::FetchAdd;
                byte_len = cqe.byte_count();
            }
            Ok(SqOpcode::BindMw) => opcode = WcOpcode::BindMw,
            Ok(SqOpcode::LocalInv) => {
                opcode = WcOpcode::LocalInv;
                flags |= WcFlags::WITH_INV;
            }
            Ok(SqOpcode::FastRegPmr | SqOpcode::Mask) | Err(_) => {
                if status == WcStatus::Success {
                    status = WcStatus::GeneralErr;
                }
            }
        }
    } else {
        byte_len = cqe.byte_count();
        sl = cqe.service_level();
        match RecvOpcode::try_from(cqe.opcode()) {
            Ok(RecvOpcode::RdmaWriteWithImm) => {
                opcode = WcOpcode::RecvRdmaWithImm;
                flags |= WcFlags::WITH_IMM;
                imm_data = cqe.immediate_data();
            }
            Ok(RecvOpcode::Send) => opcode = WcOpcode::Recv,
            Ok(RecvOpcode::SendWithImm) => {
                opcode = WcOpcode::Recv;
                flags |= WcFlags::WITH_IMM;
                imm_data = cqe.immediate_data();
            }
            Ok(RecvOpcode::SendWithInv) => {
                opcode = WcOpcode::Recv;
                flags |= WcFlags::WITH_INV;
                invalidated_rkey = cqe.invalidated_rkey();
            }
            Err(_) => {
                opcode = WcOpcode::Recv;
                if status == WcStatus::Success {
                    status = WcStatus::GeneralErr;
                }
            }
        }
        if let Some(srq) = &qp.srq {
            let slot = wqe_index & (srq.depth - 1);
            let mut state = srq.state();
            wr_id = state.wrid[slot as usize];
            state.free_slot(slot);
        } else if qp.info.rq_depth > 0 {
            let depth = qp.info.rq_depth;
            let mut rq = qp.rq();
            let slot = rq.tail & (depth - 1);
            if slot != wqe_index & (depth - 1) {
                // Receive WQEs complete in order; a device that says otherwise is wrong,
                // and the in-order answer is what rdma-core reports.
                rnic_diag::warn!(
                    rnic_diag::global(),
                    crate::diag::RECEIVE_CQE_OUT_OF_ORDER,
                    qpn = qp.qpn,
                    slot,
                    wqe_index,
                    "receive CQE out of order"
                );
            }
            wr_id = rq.wrid[slot as usize];
            rq.tail = rq.tail.wrapping_add(1);
        } else {
            wr_id = 0;
        }
        if qp.qp_type == QpType::Ud {
            src_qp = cqe.remote_qp_number();
            smac = cqe.source_mac_bytes();
            if cqe.grh_present() {
                flags |= WcFlags::GRH;
            }
        }
    }
    *wc = WorkCompletion {
        wr_id,
        status,
        opcode,
        vendor_err: u32::from(cqe.sub_status()),
        byte_len,
        imm_data,
        invalidated_rkey,
        qp_num: cqe.local_qp_number(),
        src_qp,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl,
        dlid_path_bits: 0,
        smac,
    };
}

impl QpInner {
    /// After an error completion: moves the QP to ERR (if it is not there already) so
    /// the device completes every other outstanding WQE with `WrFlushErr`.
    fn enter_error_after_completion(&self) {
        if self.released.load(Ordering::Acquire) || self.soft().state == QpState::Err {
            return;
        }
        let attr = QpAttributes {
            qp_state: QpState::Err,
            ..QpAttributes::default()
        };
        if let Err(e) = self.modify(&attr, QpAttributeMask::STATE) {
            tracing::error!(qpn = self.qpn, %e, "moving the QP to ERR after an error completion failed");
        }
    }
}

impl CompletionQueue {
    /// `ibv_poll_cq`: fills `out` from the front with up to `out.len()` completions and
    /// returns how many, 0 when none is pending. Allocation-free. An empty poll tells the
    /// backend it is idle ([`DeviceAccess::idle`]), so spinning on `poll` works on the
    /// embedded model too.
    ///
    /// # Errors
    /// [`VerbsError::Memory`] if the CQ buffer cannot be read (the completions filled
    /// before are consumed; the error hides their count, as `ibv_poll_cq` returning −1).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        self.inner.poll_into(out)
    }
}
