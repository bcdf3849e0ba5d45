//! The connection manager object: its devices, its lock, running it (`progress`), waiting
//! on the devices' time, and the optional progress thread for backends on wall time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::address::NeighbourResolver;
use super::agent::{AgentCounters, GsiAgent};
use super::channel::EventChannel;
use super::config::CmConfig;
use super::core::{CmCounters, Core};
use super::error::{CmError, Result};
use super::event::CmEvent;
use super::id::CmId;
use crate::verbs::Context;

/// Longest single wait on a device before the connection manager looks again (wall time).
const WAIT_SLICE_NS: u64 = 10_000_000;

/// What every handle of one connection manager shares.
pub(crate) struct Shared {
    core: Mutex<Core>,
    /// A progress thread runs the connection manager; callers only wait for events.
    threaded: AtomicBool,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic inside the core leaves at worst one id half-updated; the rest is usable.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn threaded(&self) -> bool {
        self.threaded.load(Ordering::Acquire)
    }

    fn now_of(core: &Core) -> u64 {
        core.devices
            .iter()
            .flatten()
            .next()
            .map_or_else(crate::device_access::monotonic_ns, |slot| slot.agent.context.now_ns())
    }

    /// The time of the connection manager: its first device's clock.
    pub(crate) fn now_ns(&self) -> u64 {
        Self::now_of(&self.lock())
    }

    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.lock().next_deadline()
    }

    /// Runs `f` on the core with the current time, then delivers the events it made.
    pub(crate) fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut Core, u64) -> R) -> R {
        let mut core = self.lock();
        let now = Self::now_of(&core);
        let result = f(&mut core, now);
        self.deliver(&mut core);
        result
    }

    fn deliver(self: &Arc<Self>, core: &mut Core) {
        for pending in std::mem::take(&mut core.events) {
            let Some(channel) = pending.channel.upgrade() else {
                continue;
            };
            tracing::debug!(target: "rnic::cm", event = %pending.kind, id = pending.id, status = pending.status, "event");
            channel.push(CmEvent {
                id: CmId::new(self.clone(), pending.id),
                listen_id: pending.listen_id.map(|key| CmId::new(self.clone(), key)),
                kind: pending.kind,
                status: pending.status,
                private_data: pending.private_data,
                conn: pending.conn,
                ud: pending.ud,
            });
        }
    }

    /// One pass: every MAD the devices received, every timer that is due, every event.
    /// Returns whether anything happened.
    pub(crate) fn progress(self: &Arc<Self>) -> bool {
        let mut core = self.lock();
        let mut received = Vec::new();
        let mut any = false;
        for index in 0..core.devices.len() {
            let Some(slot) = core.devices[index].as_mut() else {
                continue;
            };
            received.clear();
            any |= slot.agent.poll(&mut received);
            let now = slot.agent.context.now_ns();
            for mad in received.drain(..) {
                core.handle_mad(index, mad, now);
            }
        }
        let now = Self::now_of(&core);
        if core.next_deadline().is_some_and(|d| d <= now) {
            core.run_timers(now);
            any = true;
        }
        any |= !core.events.is_empty();
        self.deliver(&mut core);
        any
    }

    /// Lets time pass until `deadline` (device time) or until a device raises an
    /// interrupt (a MAD may have arrived), whichever comes first; at most one slice.
    pub(crate) fn wait_until(&self, deadline: u64) {
        let (context, now) = {
            let core = self.lock();
            let context = core
                .devices
                .iter()
                .flatten()
                .next()
                .map(|slot| slot.agent.context.clone());
            (context, Self::now_of(&core))
        };
        let wait = deadline.saturating_sub(now).clamp(1, WAIT_SLICE_NS);
        match context {
            Some(context) => context.wait_interrupt(wait),
            None => std::thread::sleep(Duration::from_nanos(wait)),
        }
    }
}

/// The connection manager: IB CM on QP1 of each of its devices, with RDMA-CM addressing.
/// Cheap to clone; see the [module documentation](super) for how to drive it.
#[derive(Clone)]
pub struct ConnectionManager {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for ConnectionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let core = self.shared.lock();
        f.debug_struct("ConnectionManager")
            .field("devices", &core.devices.iter().flatten().count())
            .field("ids", &core.ids.len())
            .field("counters", &core.counters)
            .finish()
    }
}

impl ConnectionManager {
    /// A connection manager without devices.
    pub fn new(config: CmConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                core: Mutex::new(Core::new(config)),
                threaded: AtomicBool::new(false),
            }),
        }
    }

    /// Adds a device (the kernel's `cm_add_one`): creates its QP1, brings it up and posts
    /// its receives. `neighbours` finds peers' MACs on the device's network (see
    /// [`super::address`]). Returns the device's index.
    ///
    /// # Errors
    /// [`CmError::Verbs`] when QP1 cannot be created (another QP1 exists on the context).
    pub fn add_device(&self, context: &Context, neighbours: Arc<dyn NeighbourResolver>) -> Result<usize> {
        let mut core = self.shared.lock();
        if core
            .devices
            .iter()
            .flatten()
            .any(|slot| slot.agent.context.is_same(context))
        {
            return Err(CmError::InvalidArgument("the device is already added".into()));
        }
        let agent = GsiAgent::new(context, neighbours, &core.config)?;
        Ok(core.add_device(agent))
    }

    /// Removes device `index`: every id on it gets DEVICE_REMOVAL and can only be
    /// destroyed; QP1 goes.
    ///
    /// # Errors
    /// [`CmError::NoDevice`] for an unknown index.
    pub fn remove_device(&self, index: usize) -> Result<()> {
        let slot = self
            .shared
            .with(|core, _| core.remove_device(index))
            .ok_or_else(|| CmError::NoDevice(format!("device {index}")))?;
        drop(slot);
        Ok(())
    }

    /// The devices (`rdma_get_devices`), by index; removed ones are `None`.
    pub fn devices(&self) -> Vec<Option<Context>> {
        self.shared
            .lock()
            .devices
            .iter()
            .map(|slot| slot.as_ref().map(|s| s.agent.context.clone()))
            .collect()
    }

    /// `rdma_create_event_channel`.
    ///
    /// # Errors
    /// [`CmError::Os`] when the descriptor cannot be made.
    pub fn create_event_channel(&self) -> Result<EventChannel> {
        EventChannel::new(self.shared.clone())
    }

    /// Runs the connection manager once: received MADs, due timers, events to their
    /// channels. Returns whether anything happened. A single-threaded program on virtual
    /// time calls it (or [`EventChannel::get_event`], which does) in its loop.
    pub fn progress(&self) -> bool {
        self.shared.progress()
    }

    /// When the next timer is due (device time, ns), for a loop that lets time pass.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        self.shared.next_deadline()
    }

    /// The connection manager's time: its first device's clock, in ns.
    pub fn now_ns(&self) -> u64 {
        self.shared.now_ns()
    }

    /// The connection manager's counters.
    pub fn counters(&self) -> CmCounters {
        self.shared.lock().counters
    }

    /// The counters of device `index`'s QP1.
    pub fn agent_counters(&self, index: usize) -> Option<AgentCounters> {
        self.shared
            .lock()
            .devices
            .get(index)
            .and_then(Option::as_ref)
            .map(|slot| slot.agent.counters)
    }

    /// Waits until every MAD the connection manager sent has left QP1 (its send
    /// completed), at most `limit` of wall time. A process that ends right after
    /// destroying its ids calls it so that the DREQ, DREP or REJ they sent reaches the
    /// wire: Linux's MAD layer, in the kernel, outlives the process; ours does not.
    /// Returns whether nothing is in flight any more.
    pub fn wait_sent(&self, limit: Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        loop {
            self.shared.progress();
            let in_flight: usize = {
                let core = self.shared.lock();
                core.devices
                    .iter()
                    .flatten()
                    .map(|slot| slot.agent.sends_in_flight())
                    .sum()
            };
            if in_flight == 0 {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            let now = self.shared.now_ns();
            self.shared.wait_until(now + 1_000_000);
        }
    }

    /// Live ids (destroyed ones are gone).
    pub fn ids(&self) -> usize {
        self.shared.lock().ids.len()
    }

    /// Starts a thread that runs the connection manager on wall time (for the vfio-user
    /// and PCI backends, and for callers that block in [`EventChannel::wait_event`]
    /// while another thread owns the data path). It stops when the handle is dropped.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] if one runs already; [`CmError::Os`] if the thread
    /// cannot be spawned.
    pub fn spawn_progress_thread(&self) -> Result<ProgressThread> {
        if self.shared.threaded.swap(true, Ordering::AcqRel) {
            return Err(CmError::InvalidArgument("a progress thread runs already".into()));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let shared = self.shared.clone();
        let flag = stop.clone();
        // Signals blocked: in the drop-in librdmacm this thread lives in an application,
        // whose process-directed signals are its own.
        let handle =
            rnic_os::spawn_with_signals_blocked(std::thread::Builder::new().name("rnic-cm".into()), move || {
                while !flag.load(Ordering::Acquire) {
                    if shared.progress() {
                        continue;
                    }
                    let deadline = shared.next_deadline().unwrap_or(u64::MAX);
                    shared.wait_until(deadline);
                }
            })
            .map_err(|e| {
                self.shared.threaded.store(false, Ordering::Release);
                CmError::Os(e)
            })?;
        Ok(ProgressThread {
            stop,
            handle: Some(handle),
            shared: self.shared.clone(),
        })
    }
}

/// A running progress thread; dropping it stops the thread and waits for it.
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProgressThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressThread").finish_non_exhaustive()
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
        self.shared.threaded.store(false, Ordering::Release);
    }
}
