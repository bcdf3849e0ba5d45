//! Event channels (`struct rdma_event_channel`): a queue of events with a descriptor that
//! is readable while the queue holds one, so an event loop can `poll` it next to its
//! sockets.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::error::Result;
use super::event::CmEvent;
use super::id::CmId;
use super::mad::PortSpace;
use super::manager::Shared;

/// What an [`EventChannel`] shares with the ids that deliver to it.
pub(crate) struct ChannelInner {
    queue: Mutex<VecDeque<CmEvent>>,
    ready: Condvar,
    /// An eventfd whose counter is non-zero exactly while the queue is not empty.
    fd: File,
}

impl ChannelInner {
    fn lock(&self) -> MutexGuard<'_, VecDeque<CmEvent>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, event: CmEvent) {
        let mut queue = self.lock();
        if queue.is_empty() {
            let _ = (&self.fd).write(&1u64.to_ne_bytes());
        }
        queue.push_back(event);
        self.ready.notify_all();
    }

    fn pop(&self) -> Option<CmEvent> {
        let mut queue = self.lock();
        let event = queue.pop_front();
        if event.is_some() && queue.is_empty() {
            rnic_os::take_eventfd(&self.fd);
        }
        event
    }
}

/// An event channel. Ids created on it deliver their events here; a CONNECT_REQUEST's new
/// id delivers to its listener's channel.
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

impl EventChannel {
    pub(crate) fn new(shared: Arc<Shared>) -> Result<Self> {
        let fd = File::from(rnic_os::eventfd()?);
        Ok(Self {
            inner: Arc::new(ChannelInner {
                queue: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                fd,
            }),
            shared,
        })
    }

    /// `rdma_create_id`: a new id in `port_space` (TCP: RC connections; UDP: UD with
    /// SIDR) whose events come to this channel; `context` is the caller's own value
    /// (librdmacm's `void *context`).
    ///
    /// # Errors
    /// [`super::CmError::InvalidArgument`] for the IPoIB port space.
    pub fn create_id(&self, context: u64, port_space: PortSpace) -> Result<CmId> {
        let key = self
            .shared
            .lock()
            .create_id(Arc::downgrade(&self.inner), context, port_space)?;
        Ok(CmId::new(self.shared.clone(), key))
    }

    /// `rdma_get_cm_event` without blocking: runs the connection manager once (unless a
    /// progress thread does) and returns the oldest event, if any.
    pub fn get_event(&self) -> Option<CmEvent> {
        if let Some(event) = self.inner.pop() {
            return Some(event);
        }
        if !self.shared.threaded() {
            self.shared.progress();
        }
        self.inner.pop()
    }

    /// `rdma_get_cm_event`, waiting at most `timeout` of the device's time (virtual time
    /// on an embedded NIC: the wait lets it pass). Without a progress thread the wait
    /// drives the connection manager itself.
    pub fn wait_event(&self, timeout: Duration) -> Option<CmEvent> {
        if self.shared.threaded() {
            let end = Instant::now() + timeout;
            let mut queue = self.inner.lock();
            loop {
                if let Some(event) = queue.pop_front() {
                    if queue.is_empty() {
                        rnic_os::take_eventfd(&self.inner.fd);
                    }
                    return Some(event);
                }
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                queue = self
                    .inner
                    .ready
                    .wait_timeout(queue, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let end = self.shared.now_ns().saturating_add(timeout_ns);
        loop {
            if let Some(event) = self.get_event() {
                return Some(event);
            }
            let now = self.shared.now_ns();
            if now >= end {
                return None;
            }
            self.shared
                .wait_until(end.min(self.shared.next_deadline().unwrap_or(u64::MAX)));
        }
    }

    /// `rdma_ack_cm_event` (dropping the event does the same).
    pub fn ack_event(&self, event: CmEvent) {
        drop(event);
    }

    /// Events waiting.
    pub fn pending(&self) -> usize {
        self.inner.lock().len()
    }

    /// A descriptor readable while an event waits (librdmacm's `channel->fd`). Without a
    /// progress thread, events only arrive when someone runs the connection manager
    /// ([`EventChannel::get_event`], [`super::ConnectionManager::progress`]).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}
