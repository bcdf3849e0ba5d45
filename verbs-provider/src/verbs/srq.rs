//! Shared receive queues (`ibv_srq`): a WQE buffer and an index queue (4-byte entries
//! naming WQE slots), each with its own MTR, described by an SRQC (`CREATE_SRQ`). Only the
//! limit can be changed afterwards (`MODIFY_SRQC`, context ‖ mask); resizing is not
//! supported (hns).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{Srqc, SRQC_SIZE};
use rnic_firmware_if::doorbell::{Doorbell, DB_OFFSET};
use rnic_firmware_if::mailbox::{ContextTable, MailboxOpcode};
use rnic_firmware_if::mtr::{MtrRegion, MIN_PAGE_SHIFT};
use rnic_firmware_if::regs;

use super::error::{DestroyError, Result, VerbsError};
use super::pd::{PdInner, ProtectionDomain};
use crate::device_access::DeviceAccess;
use crate::driver::dma::{Mtr, QueueBuffer};
use crate::mtr::choose_hop;

/// Size of one SGE in a receive WQE.
pub const SGE_SIZE: u32 = 16;
/// Size of one index-queue entry.
pub const INDEX_ENTRY_SIZE: u32 = 4;

/// `ibv_srq_init_attr.attr` / `ibv_srq_attr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SrqAttributes {
    /// Work requests (on create: at least; the actual depth is returned).
    pub max_wr: u32,
    /// SGEs per work request.
    pub max_sge: u32,
    /// Limit: SRQ_LIMIT_REACHED fires when fewer WQEs remain (0 = disarmed).
    pub srq_limit: u32,
}

bitflags::bitflags! {
    /// `ibv_srq_attr_mask`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SrqAttributeMask: u32 {
        /// `IBV_SRQ_MAX_WR` (resize: not supported).
        const MAX_WR = 1;
        /// `IBV_SRQ_LIMIT`.
        const LIMIT = 1 << 1;
    }
}

struct SrqBuffers {
    wqe: QueueBuffer,
    wqe_mtr: Mtr,
    index: QueueBuffer,
    index_mtr: Mtr,
}

impl SrqBuffers {
    fn release(self, access: &dyn DeviceAccess) {
        self.wqe_mtr.release(access);
        self.wqe.release(access);
        self.index_mtr.release(access);
        self.index.release(access);
    }
}

/// Data-path bookkeeping of an SRQ (rdma-core `hns_roce_idx_que` and `wrid`).
#[derive(Debug)]
pub(crate) struct SrqState {
    /// Index-queue producer index (entries written, free-running).
    pub(crate) head: u32,
    /// One bit per WQE slot, set while the slot is free.
    pub(crate) free: Box<[u64]>,
    /// `wr_id` of the WQE in each slot.
    pub(crate) wrid: Box<[u64]>,
}

impl SrqState {
    fn new(depth: u32) -> Self {
        let words = depth.div_ceil(64) as usize;
        let mut free = vec![u64::MAX; words].into_boxed_slice();
        let tail = depth & 63;
        if tail != 0 {
            // Slots beyond the depth never exist.
            free[words - 1] = (1u64 << tail) - 1;
        }
        Self {
            head: 0,
            free,
            wrid: vec![0; depth as usize].into_boxed_slice(),
        }
    }

    /// Takes the lowest free WQE slot (hns `get_wqe_idx`).
    pub(crate) fn take_slot(&mut self) -> Option<u32> {
        let (word, bits) = self.free.iter_mut().enumerate().find(|(_, bits)| **bits != 0)?;
        let bit = bits.trailing_zeros();
        *bits &= !(1u64 << bit);
        Some(word as u32 * 64 + bit)
    }

    /// Gives a slot back once its completion is polled (hns `hns_roce_free_srq_wqe`).
    pub(crate) fn free_slot(&mut self, slot: u32) {
        if let Some(bits) = self.free.get_mut((slot / 64) as usize) {
            *bits |= 1u64 << (slot % 64);
        }
    }
}

pub(crate) struct SrqInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) srqn: u32,
    pub(crate) depth: u32,
    pub(crate) max_sge: u32,
    limit: AtomicU32,
    pub(crate) released: AtomicBool,
    /// Bus addresses of the WQE buffer and the index queue (both contiguous), cached so
    /// the data path does not take the `buffers` lock; valid until release, which cannot
    /// race a post (posting borrows the handle that destroying consumes).
    pub(crate) wqe_base: u64,
    pub(crate) index_base: u64,
    pub(crate) state: Mutex<SrqState>,
    buffers: Mutex<Option<SrqBuffers>>,
}

impl SrqInner {
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, SrqState> {
        // A panic mid-post leaves at worst one slot taken and never posted.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// SRQ doorbell (hns §6.1: `TAG = SRQN, CMD = 2, PI = index-queue head`).
    pub(crate) fn ring_doorbell(&self, producer_index: u16) {
        let doorbell = Doorbell::srq(self.srqn, producer_index);
        self.pd
            .context
            .access
            .mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, doorbell.as_u64());
    }
}

impl SrqInner {
    fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let context = &self.pd.context;
        let mut result = Ok(());
        {
            let mut state = context.lock();
            if let Err(e) = state.driver.mailbox_plain(MailboxOpcode::DestroySrq, self.srqn) {
                tracing::error!(srqn = self.srqn, %e, "DESTROY_SRQ failed");
                result = Err(VerbsError::mailbox("DESTROY_SRQ")(e));
            }
            if let Err(e) = state.driver.context_put(ContextTable::Srqc, self.srqn) {
                result = result.and(Err(VerbsError::context_table("release SRQC entry")(e)));
            }
            state.allocators.srqs.free(self.srqn);
        }
        if let Some(buffers) = self.buffers.lock().unwrap_or_else(|e| e.into_inner()).take() {
            buffers.release(&*context.access);
        }
        tracing::debug!(srqn = self.srqn, "SRQ destroyed");
        result
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// A shared receive queue. QPs using it keep it alive.
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("srqn", &self.inner.srqn)
            .field("max_wr", &self.inner.depth)
            .field("max_sge", &self.inner.max_sge)
            .finish()
    }
}

fn single_region_mtr(access: &dyn DeviceAccess, buffer: &QueueBuffer) -> Result<Mtr> {
    let pages = buffer.pages();
    let regions = [MtrRegion {
        page_count: pages.len() as u64,
        hop: choose_hop(pages.len() as u64, 512),
    }];
    Mtr::create(access, &regions, &pages, MIN_PAGE_SHIFT, MIN_PAGE_SHIFT)
        .map_err(VerbsError::translation("SRQ buffer translation"))
}

impl ProtectionDomain {
    /// `ibv_create_srq`. The returned SRQ's [`SharedReceiveQueue::attributes`] hold the
    /// actual depth and SGE count.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] beyond the device limits or with a limit not below
    /// the depth; [`VerbsError::NotSupported`] without the SRQ capability;
    /// [`VerbsError::OutOfResources`]; device failures.
    pub fn create_srq(&self, attributes: &SrqAttributes) -> Result<SharedReceiveQueue> {
        let context = &self.inner.context;
        let caps = &context.info.caps;
        if !caps.flags.contains(rnic_firmware_if::caps::CapFlags::SRQ) {
            return Err(VerbsError::NotSupported("the device has no SRQ support".into()));
        }
        if attributes.max_wr == 0 || attributes.max_wr > caps.max_srq_wqes {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ max_wr {}: expected 1..={}",
                attributes.max_wr, caps.max_srq_wqes
            )));
        }
        if attributes.max_sge > u32::from(caps.max_srq_sges) {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ max_sge {}: the device allows {}",
                attributes.max_sge, caps.max_srq_sges
            )));
        }
        let depth = attributes.max_wr.max(u32::from(caps.min_wqes)).next_power_of_two();
        if attributes.srq_limit >= depth {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ limit {} not below the depth {depth}",
                attributes.srq_limit
            )));
        }
        let max_sge = attributes.max_sge.max(1).next_power_of_two();
        let device: &dyn DeviceAccess = &*context.access;

        let wqe = QueueBuffer::allocate(device, u64::from(depth * SGE_SIZE * max_sge))
            .map_err(VerbsError::memory("allocate SRQ WQE buffer"))?;
        let index = match QueueBuffer::allocate(device, u64::from(depth * INDEX_ENTRY_SIZE)) {
            Ok(index) => index,
            Err(e) => {
                wqe.release(device);
                return Err(VerbsError::memory("allocate SRQ index queue")(e));
            }
        };
        let wqe_mtr = match single_region_mtr(device, &wqe) {
            Ok(mtr) => mtr,
            Err(e) => {
                wqe.release(device);
                index.release(device);
                return Err(e);
            }
        };
        let index_mtr = match single_region_mtr(device, &index) {
            Ok(mtr) => mtr,
            Err(e) => {
                wqe_mtr.release(device);
                wqe.release(device);
                index.release(device);
                return Err(e);
            }
        };
        let buffers = SrqBuffers {
            wqe,
            wqe_mtr,
            index,
            index_mtr,
        };

        let mut state = context.lock();
        let Some(srqn) = state.allocators.srqs.allocate() else {
            drop(state);
            buffers.release(device);
            return Err(VerbsError::OutOfResources("no free SRQ number".into()));
        };
        if let Err(e) = state.driver.context_get(ContextTable::Srqc, srqn) {
            state.allocators.srqs.free(srqn);
            drop(state);
            buffers.release(device);
            return Err(VerbsError::context_table("SRQC entry")(e));
        }
        let mut srqc = Srqc::zeroed();
        srqc.set_srq_state_raw(1);
        srqc.set_wqe_hop_number(buffers.wqe_mtr.hop());
        srqc.set_shift(depth.trailing_zeros() as u8);
        srqc.set_srq_number(srqn);
        srqc.set_limit_watermark(attributes.srq_limit as u16);
        srqc.set_wqe_base_address(buffers.wqe_mtr.root() >> 3);
        srqc.set_protection_domain(self.inner.pdn);
        srqc.set_max_sge_shift(max_sge.trailing_zeros() as u8);
        srqc.set_index_base_address(buffers.index_mtr.root() >> 3);
        let [first, second] = buffers.index_mtr.first_pages();
        srqc.set_index_current_block_address(first >> 12);
        srqc.set_index_hop_number(buffers.index_mtr.hop());
        srqc.set_index_ba_page_size(buffers.index_mtr.ba_page_size_field());
        srqc.set_index_buffer_page_size(buffers.index_mtr.buffer_page_size_field());
        srqc.set_index_next_block_address(second >> 12);
        srqc.set_wqe_ba_page_size(buffers.wqe_mtr.ba_page_size_field());
        srqc.set_wqe_buffer_page_size(buffers.wqe_mtr.buffer_page_size_field());
        if let Err(e) = state
            .driver
            .mailbox_with_input(MailboxOpcode::CreateSrq, srqn, srqc.bytes())
        {
            let _ = state.driver.context_put(ContextTable::Srqc, srqn);
            state.allocators.srqs.free(srqn);
            drop(state);
            buffers.release(device);
            return Err(VerbsError::mailbox("CREATE_SRQ")(e));
        }
        drop(state);
        tracing::debug!(srqn, depth, max_sge, "SRQ created");
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                pd: self.inner.clone(),
                srqn,
                depth,
                max_sge,
                limit: AtomicU32::new(attributes.srq_limit),
                released: AtomicBool::new(false),
                wqe_base: buffers.wqe.address(),
                index_base: buffers.index.address(),
                state: Mutex::new(SrqState::new(depth)),
                buffers: Mutex::new(Some(buffers)),
            }),
        })
    }
}

impl SharedReceiveQueue {
    /// SRQ number.
    pub fn srq_number(&self) -> u32 {
        self.inner.srqn
    }

    /// The attributes as the driver knows them: actual depth, SGEs per WQE, limit.
    pub fn attributes(&self) -> SrqAttributes {
        SrqAttributes {
            max_wr: self.inner.depth,
            max_sge: self.inner.max_sge,
            srq_limit: self.inner.limit.load(Ordering::Relaxed),
        }
    }

    /// Bus address of WQE slot `index` (modulo the depth), for the data path.
    pub fn wqe_address(&self, index: u32) -> Option<u64> {
        let stride = u64::from(SGE_SIZE * self.inner.max_sge);
        let buffers = self.inner.buffers.lock().unwrap_or_else(|e| e.into_inner());
        buffers
            .as_ref()
            .map(|b| b.wqe.address() + u64::from(index & (self.inner.depth - 1)) * stride)
    }

    /// Bus address of index-queue entry `index` (modulo the depth), for the data path.
    pub fn index_entry_address(&self, index: u32) -> Option<u64> {
        let buffers = self.inner.buffers.lock().unwrap_or_else(|e| e.into_inner());
        buffers
            .as_ref()
            .map(|b| b.index.address() + u64::from(index & (self.inner.depth - 1)) * u64::from(INDEX_ENTRY_SIZE))
    }

    /// `ibv_modify_srq`: only [`SrqAttributeMask::LIMIT`] is supported (`MODIFY_SRQC`).
    ///
    /// # Errors
    /// [`VerbsError::NotSupported`] for a resize; [`VerbsError::InvalidArgument`] for a
    /// limit not below the depth; device failures.
    pub fn modify(&self, attributes: &SrqAttributes, mask: SrqAttributeMask) -> Result<()> {
        if mask.contains(SrqAttributeMask::MAX_WR) {
            return Err(VerbsError::NotSupported("resizing an SRQ".into()));
        }
        if !mask.contains(SrqAttributeMask::LIMIT) {
            return Ok(());
        }
        if attributes.srq_limit >= self.inner.depth {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ limit {} not below the depth {}",
                attributes.srq_limit, self.inner.depth
            )));
        }
        let mut context = Srqc::zeroed();
        let mut mask_bits = Srqc::all_ones();
        context.set_limit_watermark(attributes.srq_limit as u16);
        mask_bits.open_field(Srqc::LIMIT_WL);
        let mut input = Vec::with_capacity(2 * SRQC_SIZE);
        input.extend_from_slice(context.bytes());
        input.extend_from_slice(mask_bits.bytes());
        self.inner
            .pd
            .context
            .lock()
            .driver
            .mailbox_with_input(MailboxOpcode::ModifySrqc, self.inner.srqn, &input)
            .map_err(VerbsError::mailbox("MODIFY_SRQC"))?;
        self.inner.limit.store(attributes.srq_limit, Ordering::Relaxed);
        Ok(())
    }

    /// `ibv_query_srq`: depth and SGEs from the driver, the limit from the device
    /// (`QUERY_SRQC`).
    ///
    /// # Errors
    /// Device failures.
    pub fn query(&self) -> Result<SrqAttributes> {
        let srqc = self.query_context()?;
        Ok(SrqAttributes {
            max_wr: 1 << srqc.shift(),
            max_sge: 1 << srqc.max_sge_shift(),
            srq_limit: u32::from(srqc.limit_watermark()),
        })
    }

    /// The SRQ context as the device holds it.
    ///
    /// # Errors
    /// Device failures.
    pub fn query_context(&self) -> Result<Srqc> {
        let bytes = self
            .inner
            .pd
            .context
            .lock()
            .driver
            .mailbox_query(MailboxOpcode::QuerySrqc, self.inner.srqn, SRQC_SIZE)
            .map_err(VerbsError::mailbox("QUERY_SRQC"))?;
        Ok(Srqc::parse(&bytes).expect("queried exactly SRQC_SIZE bytes"))
    }

    /// Rings the SRQ doorbell with index-queue producer index `producer_index` without
    /// writing WQEs: for tests of the device. [`SharedReceiveQueue::post_srq_recv`] rings
    /// it itself.
    pub fn ring_doorbell(&self, producer_index: u16) {
        self.inner.ring_doorbell(producer_index);
    }

    /// WQE slots currently free to post into.
    pub fn free_slots(&self) -> u32 {
        self.inner.state().free.iter().map(|bits| bits.count_ones()).sum()
    }

    /// `ibv_destroy_srq`.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] (the SRQ handed back) while QPs use it; device failures (the
    /// SRQ is gone anyway).
    pub fn destroy(self) -> Result<(), DestroyError<Self>> {
        if Arc::strong_count(&self.inner) > 1 {
            let srqn = self.inner.srqn;
            return Err(DestroyError::busy(self, format!("SRQ {srqn} is used by QPs")));
        }
        self.inner.release().map_err(DestroyError::gone)
    }
}
