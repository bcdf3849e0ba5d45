//! Events: asynchronous events from the AEQ (`ibv_get_async_event`) and completion
//! events from the CEQs delivered through completion channels (`ibv_get_cq_event`).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use rnic_firmware_if::event::{AsyncEventType, EventObject};

use super::context::{Context, ContextInner};
use super::cq::EventCounts;
use crate::device_access::DeviceAccess;

/// `ibv_event_type`, for the events this device raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventKind {
    /// `IBV_EVENT_CQ_ERR`: CQ access error, overflow, or an invalid CQ number.
    CqError,
    /// `IBV_EVENT_QP_FATAL`: catastrophic WQ error.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request on the local WQ.
    QpRequestError,
    /// `IBV_EVENT_QP_ACCESS_ERR`: local access violation.
    QpAccessError,
    /// `IBV_EVENT_COMM_EST`.
    CommunicationEstablished,
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`.
    PathMigrated,
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigrationError,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqError,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    SrqLimitReached,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`.
    QpLastWqeReached,
    /// `IBV_EVENT_PORT_ACTIVE` (port change).
    PortChange,
    /// `IBV_EVENT_DEVICE_FATAL`: doorbell overflow, CEQ overflow, function reset.
    DeviceFatal,
    /// An event type this driver does not know.
    Unknown,
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventElement {
    /// A QP (number).
    Qp(u32),
    /// A CQ (number).
    Cq(u32),
    /// An SRQ (number).
    Srq(u32),
    /// A port.
    Port(u8),
    /// The device.
    Device,
}

/// One asynchronous event (`struct ibv_async_event`) plus the hardware detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The ibverbs event type.
    pub event_type: AsyncEventKind,
    /// The object it is about.
    pub element: AsyncEventElement,
    /// The hardware event type (`None` for a value this driver does not know).
    pub hardware_type: Option<AsyncEventType>,
    /// The raw hardware event type byte.
    pub raw_type: u8,
    /// The hardware sub-type.
    pub sub_type: u8,
}

impl AsyncEvent {
    /// Decodes an AEQE's fields.
    pub fn from_hardware(event_type: u8, sub_type: u8, queue_number: u32) -> Self {
        let hardware_type = AsyncEventType::try_from(event_type).ok();
        let (kind, element) = match hardware_type {
            Some(t) => {
                use AsyncEventType::*;
                let kind = match t {
                    PathMig => AsyncEventKind::PathMigrated,
                    PathMigFailed => AsyncEventKind::PathMigrationError,
                    CommEst => AsyncEventKind::CommunicationEstablished,
                    SqDrained => AsyncEventKind::SqDrained,
                    WqCatasError => AsyncEventKind::QpFatal,
                    InvReqLocalWqError => AsyncEventKind::QpRequestError,
                    LocalWqAccessError | XrcdViolation | InvalidXrceth => AsyncEventKind::QpAccessError,
                    SrqLimitReach => AsyncEventKind::SrqLimitReached,
                    SrqLastWqeReach => AsyncEventKind::QpLastWqeReached,
                    SrqCatasError => AsyncEventKind::SrqError,
                    CqAccessError | CqOverflow | CqIdInvalid => AsyncEventKind::CqError,
                    PortChange => AsyncEventKind::PortChange,
                    DbOverflow | CeqOverflow | Flr => AsyncEventKind::DeviceFatal,
                    Mb => AsyncEventKind::Unknown,
                };
                let element = match t.object_kind() {
                    EventObject::Qp => AsyncEventElement::Qp(queue_number),
                    EventObject::Cq => AsyncEventElement::Cq(queue_number),
                    EventObject::Srq => AsyncEventElement::Srq(queue_number),
                    EventObject::Port => AsyncEventElement::Port(queue_number as u8),
                    EventObject::Device | EventObject::Mailbox => AsyncEventElement::Device,
                };
                (kind, element)
            }
            None => (AsyncEventKind::Unknown, AsyncEventElement::Device),
        };
        Self {
            event_type: kind,
            element,
            hardware_type,
            raw_type: event_type,
            sub_type,
        }
    }
}

/// A completion event: the CQ that has a completion to look at (`ibv_get_cq_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEvent {
    /// The CQ number.
    pub cq_number: u32,
}

/// Called once per completion event queued on a channel.
type ChannelNotifier = Arc<dyn Fn() + Send + Sync>;

pub(crate) struct ChannelInner {
    pub(crate) context: Arc<ContextInner>,
    /// Pending events: the CQ and its event counters.
    events: Mutex<VecDeque<(u32, Arc<EventCounts>)>>,
    notifier: Mutex<Option<ChannelNotifier>>,
}

impl ChannelInner {
    pub(crate) fn push(&self, cqn: u32, counts: Arc<EventCounts>) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((cqn, counts));
        let notifier = self.notifier.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(notifier) = notifier {
            notifier();
        }
    }

    /// The oldest event, counted as delivered to its CQ (what `ibv_ack_cq_events` must
    /// balance).
    fn pop(&self) -> Option<u32> {
        let (cqn, counts) = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop_front()?;
        counts.delivered.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Some(cqn)
    }
}

/// A completion channel (`ibv_comp_channel`): CQs created with it report their
/// completion events here once armed with
/// [`CompletionQueue::req_notify`](super::cq::CompletionQueue::req_notify).
#[derive(Clone)]
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel").finish_non_exhaustive()
    }
}

impl Context {
    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> CompletionChannel {
        CompletionChannel {
            inner: Arc::new(ChannelInner {
                context: self.inner.clone(),
                events: Mutex::new(VecDeque::new()),
                notifier: Mutex::new(None),
            }),
        }
    }
}

impl CompletionChannel {
    /// `ibv_get_cq_event` without blocking: processes pending EQ entries and returns the
    /// oldest completion event of this channel. Every event returned must be acknowledged
    /// with [`CompletionQueue::ack_events`](super::cq::CompletionQueue::ack_events)
    /// before its CQ can be destroyed; the CQ must be re-armed for the next one.
    pub fn get_cq_event(&self) -> Option<CqEvent> {
        if let Some(cqn) = self.inner.pop() {
            return Some(CqEvent { cq_number: cqn });
        }
        self.inner.context.lock().process_events();
        self.inner.pop().map(|cqn| CqEvent { cq_number: cqn })
    }

    /// Sets a function called once for every completion event queued on this channel,
    /// from whichever thread processes the event queues (a C library's channel file
    /// descriptor is made readable that way). It runs under the context's lock: it must
    /// not call back into the verbs API.
    pub fn set_notifier(&self, notifier: impl Fn() + Send + Sync + 'static) {
        *self.inner.notifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(notifier));
    }

    /// The oldest completion event already queued on this channel, without processing the
    /// event queues (the counterpart of [`CompletionChannel::set_notifier`]: one call per
    /// notification).
    pub fn take_cq_event(&self) -> Option<CqEvent> {
        self.inner.pop().map(|cqn| CqEvent { cq_number: cqn })
    }

    /// Waits up to `timeout_ns` (device time) for a completion event.
    pub fn wait_cq_event(&self, timeout_ns: u64) -> Option<CqEvent> {
        let mut remaining = timeout_ns;
        loop {
            if let Some(event) = self.get_cq_event() {
                return Some(event);
            }
            if remaining == 0 {
                return None;
            }
            let slice = remaining.min(10_000_000);
            remaining -= slice;
            self.inner.context.access.wait_interrupt(slice);
        }
    }
}
