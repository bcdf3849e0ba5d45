//! Completion queues (`ibv_cq`): a ring of 64-byte CQEs in driver DMA memory, an MTR over
//! it, and a CQC created with `CREATE_CQC`. Depth is the requested count rounded up to a
//! power of two, at least 64 (hns provider rule).
//!
//! The poller publishes its consumer index in the CQ's record doorbell (hns §6.2: a
//! 4-byte slot in DMA memory named by the CQC, which the device reads before it writes a
//! CQE), as the hns provider does; on a device without `CQ_RECORD_DB` it rings the
//! set-CI doorbell instead.
//!
//! Arming ([`CompletionQueue::req_notify`]) writes the CQ arm doorbell; the next
//! (solicited) completion makes the device post a CEQE on the CQ's completion vector,
//! which the context routes to the CQ's completion channel.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::caps::CapFlags;
use rnic_firmware_if::context::{CqArmState, CqState, Cqc, CqeSize, CQC_SIZE};
use rnic_firmware_if::doorbell::{CqDoorbell, DB_OFFSET};
use rnic_firmware_if::mailbox::{ContextTable, MailboxOpcode};
use rnic_firmware_if::mtr::{MtrRegion, MIN_PAGE_SHIFT};
use rnic_firmware_if::regs;

use super::context::{Context, ContextInner, CqRoute};
use super::error::{DestroyError, Result, VerbsError};
use super::event::CompletionChannel;
use crate::device_access::DeviceAccess;
use crate::driver::dma::{Mtr, QueueBuffer};
use crate::mtr::choose_hop;

/// Smallest CQ depth (hns provider minimum).
pub const MIN_CQ_DEPTH: u32 = 64;
/// Mask of the 24-bit consumer index in CQ doorbells.
const CI_MASK: u32 = 0xFF_FFFF;

pub(crate) struct CqInner {
    pub(crate) context: Arc<ContextInner>,
    pub(crate) cqn: u32,
    pub(crate) depth: u32,
    pub(crate) cqe_size: usize,
    comp_vector: u32,
    channel: Option<CompletionChannel>,
    /// CEQ events consumed for this CQ (the arm sequence number is `1 + this`, 2 bits).
    notifications: Arc<AtomicU32>,
    /// Completion events handed out by the channel / acknowledged
    /// (`ibv_get_cq_event` / `ibv_ack_cq_events`).
    pub(crate) events: Arc<EventCounts>,
    /// Mirror of the poller's consumer index, for arming without the poll lock.
    pub(crate) consumer_index: AtomicU32,
    /// The poller's state (rdma-core's CQ spinlock and `cons_index`).
    pub(crate) poll: Mutex<PollState>,
    /// The backend's [`DeviceAccess::driver_memory_writes`] count at which the last poll
    /// found no CQE (`u64::MAX`: none yet): while the count stays there, the CQ is still
    /// empty and a poll returns without reading it or taking the poll lock.
    pub(crate) empty_at_writes: AtomicU64,
    /// Bus address of the CQE buffer (contiguous), cached for the data path; valid until
    /// release, which waits for no poller because polling borrows the handle that
    /// destroying consumes.
    pub(crate) buffer_base: u64,
    /// Bus address of the CQ's record doorbell, when the device reads one; freed at
    /// release, after DESTROY_CQC.
    record: Option<u64>,
    released: AtomicBool,
    resources: Mutex<Option<(QueueBuffer, Mtr)>>,
}

/// What the poller keeps between calls.
#[derive(Debug, Default)]
pub(crate) struct PollState {
    /// Consumer index, free-running (24 bits reach the device).
    pub(crate) consumer_index: u32,
}

/// Completion-event accounting of one CQ.
#[derive(Debug, Default)]
pub(crate) struct EventCounts {
    pub(crate) delivered: AtomicU32,
    pub(crate) acknowledged: AtomicU32,
}

impl CqInner {
    fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut result = Ok(());
        {
            let mut state = self.context.lock();
            let destroyed = match state.driver.mailbox_plain(MailboxOpcode::DestroyCqc, self.cqn) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(cqn = self.cqn, %e, "DESTROY_CQC failed");
                    result = Err(VerbsError::mailbox("DESTROY_CQC")(e));
                    false
                }
            };
            if let Err(e) = state.driver.context_put(ContextTable::Cqc, self.cqn) {
                result = result.and(Err(VerbsError::context_table("release CQC entry")(e)));
            }
            state.cq_routes.remove(&self.cqn);
            state.allocators.cqs.free(self.cqn);
            match (self.record, destroyed) {
                // After DESTROY_CQC the device reads the slot no more.
                (Some(record), true) => state.driver.free_record(record),
                // The device may still hold the CQ: a new CQ must not share the slot
                // (it goes back with the page at shutdown).
                (Some(record), false) => tracing::warn!(cqn = self.cqn, record, "CQ record doorbell kept"),
                (None, _) => {}
            }
        }
        if let Some((buffer, mtr)) = self.resources.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let access: &dyn DeviceAccess = &*self.context.access;
            mtr.release(access);
            buffer.release(access);
        }
        tracing::debug!(cqn = self.cqn, "CQ destroyed");
        result
    }
}

impl CqInner {
    pub(crate) fn poll(&self) -> std::sync::MutexGuard<'_, PollState> {
        // A panic mid-poll leaves the consumer index at the last CQE consumed: still right.
        self.poll.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the device the consumer index: the record doorbell (rdma-core hns
    /// `update_cq_db`: `cons_index & 0xFFFFFF` into the slot), else the set-CI doorbell
    /// (hns §6.1 `CMD = 3`, 24-bit CI).
    pub(crate) fn publish_consumer_index(&self, consumer_index: u32) {
        self.consumer_index.store(consumer_index, Ordering::Release);
        let ci = consumer_index & CI_MASK;
        match self.record {
            Some(record) => {
                if let Err(e) = self.context.access.dma_write(record, &ci.to_le_bytes()) {
                    // The slot is the driver's own DMA memory: only a backend failure
                    // gets here, and the device then sees an older index (at worst an
                    // overflow it reports).
                    tracing::error!(cqn = self.cqn, %e, "CQ record doorbell write failed");
                }
            }
            None => {
                let doorbell = CqDoorbell::update(self.cqn, ci);
                self.context
                    .access
                    .mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, doorbell.as_u64());
            }
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// What the device holds about a CQ (`QUERY_CQC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqAttributes {
    /// CQ number.
    pub cq_number: u32,
    /// Depth in CQEs.
    pub cqe: u32,
    /// Completion vector (CEQ).
    pub comp_vector: u32,
    /// Context state.
    pub state: CqState,
    /// Arm state.
    pub arm_state: CqArmState,
    /// Device producer index (24 bits).
    pub producer_index: u32,
    /// Device consumer index (24 bits).
    pub consumer_index: u32,
    /// CQE size in bytes.
    pub cqe_size: usize,
}

/// A completion queue. QPs using it keep it alive.
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("cqn", &self.inner.cqn)
            .field("cqe", &self.inner.depth)
            .field("comp_vector", &self.inner.comp_vector)
            .finish()
    }
}

impl Context {
    /// `ibv_create_cq`: a CQ of at least `cqe` entries on completion vector
    /// `comp_vector`, reporting completion events to `channel` when armed.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a depth above `max_cqe` or a vector beyond
    /// `num_comp_vectors`; [`VerbsError::OutOfResources`]; device failures.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&CompletionChannel>,
        comp_vector: u32,
    ) -> Result<CompletionQueue> {
        let context = &self.inner;
        let caps = &context.info.caps;
        if cqe > caps.max_cqes {
            return Err(VerbsError::InvalidArgument(format!(
                "{cqe} CQEs requested, the device allows {}",
                caps.max_cqes
            )));
        }
        if comp_vector >= context.completion_vectors {
            return Err(VerbsError::InvalidArgument(format!(
                "completion vector {comp_vector}: the context has {}",
                context.completion_vectors
            )));
        }
        if let Some(channel) = channel {
            if !Arc::ptr_eq(&channel.inner.context, context) {
                return Err(VerbsError::InvalidArgument(
                    "the completion channel belongs to another context".into(),
                ));
            }
        }
        let depth = cqe.max(MIN_CQ_DEPTH).max(u32::from(caps.min_cqes)).next_power_of_two();
        let (cqe_size_field, cqe_size) = if caps.cqe_size == 32 {
            (CqeSize::Bytes32, 32usize)
        } else {
            (CqeSize::Bytes64, 64usize)
        };
        let device: &dyn DeviceAccess = &*context.access;
        let buffer = QueueBuffer::allocate(device, u64::from(depth) * cqe_size as u64)
            .map_err(VerbsError::memory("allocate CQ buffer"))?;
        let pages = buffer.pages();
        let regions = [MtrRegion {
            page_count: pages.len() as u64,
            hop: choose_hop(pages.len() as u64, 512),
        }];
        let mtr = match Mtr::create(device, &regions, &pages, MIN_PAGE_SHIFT, MIN_PAGE_SHIFT) {
            Ok(mtr) => mtr,
            Err(e) => {
                buffer.release(device);
                return Err(VerbsError::translation("CQ buffer translation")(e));
            }
        };

        let mut state = context.lock();
        let Some(cqn) = state.allocators.cqs.allocate() else {
            drop(state);
            mtr.release(device);
            buffer.release(device);
            return Err(VerbsError::OutOfResources("no free CQ number".into()));
        };
        // Zeroed before CREATE_CQC: the device may read it from the first CQE on.
        let record = if caps.flags.contains(CapFlags::CQ_RECORD_DB) {
            match state.driver.allocate_record() {
                Ok(address) => Some(address),
                Err(e) => {
                    state.allocators.cqs.free(cqn);
                    drop(state);
                    mtr.release(device);
                    buffer.release(device);
                    return Err(VerbsError::memory("allocate CQ record doorbell")(e));
                }
            }
        } else {
            None
        };
        let release_record = |state: &mut super::context::ContextState| {
            if let Some(record) = record {
                state.driver.free_record(record);
            }
        };
        if let Err(e) = state.driver.context_get(ContextTable::Cqc, cqn) {
            release_record(&mut state);
            state.allocators.cqs.free(cqn);
            drop(state);
            mtr.release(device);
            buffer.release(device);
            return Err(VerbsError::context_table("CQC entry")(e));
        }
        let mut cqc = Cqc::zeroed();
        cqc.set_cq_state(CqState::Valid);
        cqc.set_arm_state(CqArmState::NoArmed);
        cqc.set_shift(depth.trailing_zeros() as u8);
        cqc.set_ceq_number(comp_vector as u16);
        cqc.set_cq_number(cqn);
        cqc.set_cqe_size(cqe_size_field);
        let [first, second] = mtr.first_pages();
        cqc.set_cqe_current_block_address(first >> 12);
        cqc.set_cqe_hop_number(mtr.hop());
        cqc.set_cqe_next_block_address(second >> 12);
        cqc.set_cqe_ba_page_size(mtr.ba_page_size_field());
        cqc.set_cqe_buffer_page_size(mtr.buffer_page_size_field());
        cqc.set_cqe_base_address(mtr.root() >> 3);
        if let Some(record) = record {
            cqc.set_record_enable(true);
            cqc.set_record_address(record);
        }
        if let Err(e) = state
            .driver
            .mailbox_with_input(MailboxOpcode::CreateCqc, cqn, cqc.bytes())
        {
            let _ = state.driver.context_put(ContextTable::Cqc, cqn);
            release_record(&mut state);
            state.allocators.cqs.free(cqn);
            drop(state);
            mtr.release(device);
            buffer.release(device);
            return Err(VerbsError::mailbox("CREATE_CQC")(e));
        }
        let notifications = Arc::new(AtomicU32::new(0));
        let events = Arc::new(EventCounts::default());
        state.cq_routes.insert(
            cqn,
            CqRoute {
                channel: channel.map(|c| Arc::downgrade(&c.inner)),
                notifications: notifications.clone(),
                events: events.clone(),
            },
        );
        drop(state);
        tracing::debug!(cqn, depth, comp_vector, "CQ created");
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                context: context.clone(),
                cqn,
                depth,
                cqe_size,
                comp_vector,
                channel: channel.cloned(),
                notifications,
                events,
                consumer_index: AtomicU32::new(0),
                poll: Mutex::new(PollState::default()),
                empty_at_writes: AtomicU64::new(u64::MAX),
                buffer_base: buffer.address(),
                record,
                released: AtomicBool::new(false),
                resources: Mutex::new(Some((buffer, mtr))),
            }),
        })
    }
}

impl CompletionQueue {
    /// CQ number (`handle`).
    pub fn cq_number(&self) -> u32 {
        self.inner.cqn
    }

    /// Depth in CQEs (`cqe`).
    pub fn cqe(&self) -> u32 {
        self.inner.depth
    }

    /// Completion vector.
    pub fn comp_vector(&self) -> u32 {
        self.inner.comp_vector
    }

    /// The completion channel, if any.
    pub fn channel(&self) -> Option<&CompletionChannel> {
        self.inner.channel.as_ref()
    }

    /// CEQ events received for this CQ so far.
    pub fn notifications(&self) -> u32 {
        self.inner.notifications.load(Ordering::Relaxed)
    }

    /// Bus address of CQE `index` (modulo the depth), for the data path.
    pub fn cqe_address(&self, index: u32) -> Option<u64> {
        let resources = self.inner.resources.lock().unwrap_or_else(|e| e.into_inner());
        resources.as_ref().map(|(buffer, _)| {
            buffer.address() + u64::from(index & (self.inner.depth - 1)) * self.inner.cqe_size as u64
        })
    }

    /// `ibv_req_notify_cq`: arms the CQ so the next completion (`solicited_only`: the
    /// next solicited one, or an error) posts a completion event. The arm carries the
    /// consumer index the poller has published, so completions already written but not
    /// yet polled raise the event at once (for a next-completion arm), as hardware does.
    pub fn req_notify(&self, solicited_only: bool) {
        let sequence = (1 + self.inner.notifications.load(Ordering::Relaxed)) & 3;
        let ci = self.inner.consumer_index.load(Ordering::Acquire) & CI_MASK;
        let doorbell = CqDoorbell::arm(self.inner.cqn, ci, sequence as u8, solicited_only);
        self.inner
            .context
            .access
            .mmio_write64(regs::DOORBELL_BAR, DB_OFFSET, doorbell.as_u64());
    }

    /// Publishes `consumer_index` as polling does (record or set-CI doorbell) and takes
    /// it as the poller's consumer index: for tests of the device.
    /// [`CompletionQueue::poll`] publishes its own.
    pub fn update_consumer_index(&self, consumer_index: u32) {
        self.inner.poll().consumer_index = consumer_index;
        self.inner.publish_consumer_index(consumer_index);
    }

    /// `ibv_ack_cq_events`: acknowledges `nevents` completion events of this CQ returned
    /// by its channel. A CQ with unacknowledged events cannot be destroyed.
    pub fn ack_events(&self, nevents: u32) {
        self.inner.events.acknowledged.fetch_add(nevents, Ordering::AcqRel);
    }

    /// Completion events returned by the channel for this CQ so far
    /// (`comp_events_completed` counts the acknowledged ones).
    pub fn events_delivered(&self) -> u32 {
        self.inner.events.delivered.load(Ordering::Acquire)
    }

    /// Bus address of the CQ's record doorbell (the consumer index the device reads),
    /// or `None` when the device has no `CQ_RECORD_DB` and the set-CI doorbell is used.
    pub fn record_doorbell(&self) -> Option<u64> {
        self.inner.record
    }

    /// The poller's consumer index (free-running).
    pub fn consumer_index(&self) -> u32 {
        self.inner.poll().consumer_index
    }

    /// The CQ context as the device holds it (`QUERY_CQC`).
    ///
    /// # Errors
    /// Device failures; [`VerbsError::InvalidArgument`] if the device returns an
    /// undefined state value.
    pub fn query(&self) -> Result<CqAttributes> {
        let bytes = self
            .inner
            .context
            .lock()
            .driver
            .mailbox_query(MailboxOpcode::QueryCqc, self.inner.cqn, CQC_SIZE)
            .map_err(VerbsError::mailbox("QUERY_CQC"))?;
        let cqc = Cqc::parse(&bytes).expect("queried exactly CQC_SIZE bytes");
        let invalid =
            |e: rnic_firmware_if::context::ContextError| VerbsError::InvalidArgument(format!("device CQC: {e}"));
        Ok(CqAttributes {
            cq_number: cqc.cq_number(),
            cqe: 1 << cqc.shift(),
            comp_vector: u32::from(cqc.ceq_number()),
            state: cqc.cq_state().map_err(invalid)?,
            arm_state: cqc.arm_state().map_err(invalid)?,
            producer_index: cqc.producer_index(),
            consumer_index: cqc.consumer_index(),
            cqe_size: cqc.cqe_size().map_err(invalid)?.bytes(),
        })
    }

    /// `ibv_destroy_cq`.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] (the CQ handed back) while QPs use it; device failures (the
    /// CQ is gone anyway).
    pub fn destroy(self) -> Result<(), DestroyError<Self>> {
        if Arc::strong_count(&self.inner) > 1 {
            let cqn = self.inner.cqn;
            return Err(DestroyError::busy(self, format!("CQ {cqn} is used by QPs")));
        }
        let delivered = self.inner.events.delivered.load(Ordering::Acquire);
        let acknowledged = self.inner.events.acknowledged.load(Ordering::Acquire);
        if acknowledged < delivered {
            // ibverbs blocks in ibv_destroy_cq until every event is acknowledged; without
            // threads to wait for, refusing is the equivalent.
            let cqn = self.inner.cqn;
            return Err(DestroyError::busy(
                self,
                format!(
                    "CQ {cqn} has {} unacknowledged completion events",
                    delivered - acknowledged
                ),
            ));
        }
        self.inner.release().map_err(DestroyError::gone)
    }
}
