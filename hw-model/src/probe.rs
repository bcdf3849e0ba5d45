//! Observers at the device's stage boundaries.
//!
//! Every port of the device — where one block hands a request, a response or an event to
//! another, where DMA leaves for host memory, where a frame crosses the network port — can
//! carry one [`Observer`]: a monitor, a coverage collector, a checker, or a trace writer
//! for the verification layer. A port without one costs one branch per transaction.
//! [`Device::attach_observer`](crate::Device::attach_observer) attaches one.
//!
//! What crosses each port is a [`Transaction`]; the observer sees it after the port
//! carried it (a DMA read with the bytes read, a CQE with its owner bit set) and at the
//! virtual time it happened. Observers watch: they cannot change what the device does.

use crate::time::Picoseconds;

/// A port of the device (a boundary between two of its blocks, or between the device and
/// the outside), where transactions can be observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Port {
    /// DMA: the device's bus-master accesses to host memory (contexts, WQEs, payload,
    /// CQEs, EQEs, mailboxes and the command ring). The BT walks of the context tables and
    /// of the MTT read host memory on their own and are not shown.
    Bus,
    /// Decoded doorbells, from the doorbell block to the block owning the queue.
    Doorbell,
    /// Mailbox object commands, from the firmware to the block owning the object, with
    /// the block's answer.
    Mailbox,
    /// QP state changes, from the QP block to the transport.
    QpState,
    /// Memory-region access checks and key invalidations, from the transport to memory
    /// protection, with the answer.
    AccessCheck,
    /// Receive WQEs the responder takes from an SRQ.
    ReceiveWqe,
    /// CQEs, from the transport and the QP block (flushes) to the CQ block.
    Completion,
    /// Event requests to the event block: CEQEs, AEQEs and mailbox completions.
    Event,
    /// Frames crossing the network port (received, and handed out to the fabric).
    Network,
}

impl Port {
    /// Every port, in a fixed order.
    pub const ALL: [Port; 9] = [
        Port::Bus,
        Port::Doorbell,
        Port::Mailbox,
        Port::QpState,
        Port::AccessCheck,
        Port::ReceiveWqe,
        Port::Completion,
        Port::Event,
        Port::Network,
    ];

    /// The port's name in traces.
    pub const fn name(self) -> &'static str {
        match self {
            Port::Bus => "bus",
            Port::Doorbell => "doorbell",
            Port::Mailbox => "mailbox",
            Port::QpState => "qp-state",
            Port::AccessCheck => "access-check",
            Port::ReceiveWqe => "receive-wqe",
            Port::Completion => "completion",
            Port::Event => "event",
            Port::Network => "network",
        }
    }
}

/// The queue a doorbell names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorbellTarget {
    /// A QP's send queue.
    SendQueue,
    /// A QP's receive queue.
    ReceiveQueue,
    /// An SRQ.
    SharedReceiveQueue,
    /// A CQ (set-CI or arm).
    CompletionQueue,
    /// An EQ.
    EventQueue,
}

/// What crossed a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transaction<'a> {
    /// A DMA read (only successful ones carry data; a failed one is [`Transaction::DmaError`]).
    DmaRead {
        /// Bus address.
        address: u64,
        /// The bytes read.
        data: &'a [u8],
    },
    /// A DMA write.
    DmaWrite {
        /// Bus address.
        address: u64,
        /// The bytes written.
        data: &'a [u8],
    },
    /// A DMA access host memory refused (or bus mastering was off).
    DmaError {
        /// Bus address.
        address: u64,
        /// Bytes the access wanted.
        length: usize,
        /// Whether it was a write.
        write: bool,
    },
    /// A decoded doorbell.
    Doorbell {
        /// The kind of queue.
        target: DoorbellTarget,
        /// Its number (QPN, SRQN, CQN; 0 for the EQ doorbell, whose word names the EQ).
        number: u32,
        /// The new producer index (SQ, RQ, SRQ) or the doorbell word (CQ, EQ).
        value: u64,
    },
    /// A mailbox's object command and the status its block answered.
    Mailbox {
        /// The mailbox opcode.
        opcode: rnic_firmware_if::mailbox::MailboxOpcode,
        /// The object number (mailbox tag).
        tag: u32,
        /// The block's answer.
        status: rnic_firmware_if::mailbox::MailboxCompletion,
    },
    /// A QP changed state.
    QpState {
        /// The QP.
        qpn: u32,
        /// Its state before.
        from: rnic_firmware_if::context::QpState,
        /// Its state now.
        to: rnic_firmware_if::context::QpState,
    },
    /// An access check of a memory-region key.
    AccessCheck {
        /// The key.
        key: u32,
        /// The QP's protection domain.
        pd: u32,
        /// First byte (IOVA).
        address: u64,
        /// Bytes.
        length: u64,
        /// The rights needed (`mpt::MrAccess` bits).
        needed: u8,
        /// Whether the access was granted.
        granted: bool,
    },
    /// A SEND with invalidate freed (or failed to free) the region of a key.
    Invalidate {
        /// The key.
        rkey: u32,
        /// Whether the region was invalidated.
        done: bool,
    },
    /// The responder took (or found no) receive WQE of an SRQ.
    ReceiveWqe {
        /// The SRQ.
        srqn: u32,
        /// The WQE slot taken, if any.
        slot: Option<u16>,
    },
    /// A CQE for a CQ (owner bit not yet set), and whether the CQ took it.
    Cqe {
        /// The CQ.
        cqn: u32,
        /// The CQE.
        cqe: &'a rnic_firmware_if::cqe::Cqe,
        /// The solicited-event bit of the completed request.
        solicited: bool,
        /// Whether the CQ block wrote it.
        written: bool,
    },
    /// A request for a CEQE naming a CQ.
    CompletionEvent {
        /// The CEQ.
        ceqn: u32,
        /// The CQ.
        cqn: u32,
    },
    /// A request for an AEQE.
    AsyncEvent {
        /// The event type.
        event: rnic_firmware_if::event::AsyncEventType,
        /// Its sub-type.
        sub_type: u8,
        /// The queue it is about.
        queue_number: u32,
    },
    /// A request for a mailbox-completion AEQE.
    MailboxEvent {
        /// The mailbox token.
        token: u16,
        /// Its completion status.
        status: u8,
    },
    /// A frame the port received.
    FrameIn(&'a [u8]),
    /// A frame the port handed out to the network.
    FrameOut(&'a [u8]),
}

impl Transaction<'_> {
    /// The port this transaction crosses.
    pub const fn port(&self) -> Port {
        match self {
            Transaction::DmaRead { .. } | Transaction::DmaWrite { .. } | Transaction::DmaError { .. } => Port::Bus,
            Transaction::Doorbell { .. } => Port::Doorbell,
            Transaction::Mailbox { .. } => Port::Mailbox,
            Transaction::QpState { .. } => Port::QpState,
            Transaction::AccessCheck { .. } | Transaction::Invalidate { .. } => Port::AccessCheck,
            Transaction::ReceiveWqe { .. } => Port::ReceiveWqe,
            Transaction::Cqe { .. } => Port::Completion,
            Transaction::CompletionEvent { .. } | Transaction::AsyncEvent { .. } | Transaction::MailboxEvent { .. } => {
                Port::Event
            }
            Transaction::FrameIn(_) | Transaction::FrameOut(_) => Port::Network,
        }
    }
}

/// Watches the transactions of one port.
pub trait Observer: Send {
    /// `transaction` crossed the port at virtual time `at`.
    fn observe(&mut self, at: Picoseconds, transaction: &Transaction<'_>);
}

/// The observer slot of one port: empty unless someone attached an observer.
#[derive(Default)]
pub struct Probe {
    observer: Option<Box<dyn Observer>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("attached", &self.observer.is_some())
            .finish()
    }
}

impl Probe {
    /// Puts `observer` on the port; returns the one it replaces.
    pub fn attach(&mut self, observer: Option<Box<dyn Observer>>) -> Option<Box<dyn Observer>> {
        std::mem::replace(&mut self.observer, observer)
    }

    /// Whether an observer is attached.
    #[inline]
    pub fn is_attached(&self) -> bool {
        self.observer.is_some()
    }

    /// Shows the transaction `describe` builds to the observer, if there is one (the
    /// transaction is not built otherwise).
    #[inline]
    pub fn observe<'a>(&mut self, at: Picoseconds, describe: impl FnOnce() -> Transaction<'a>) {
        if let Some(observer) = self.observer.as_mut() {
            observer.observe(at, &describe());
        }
    }
}

/// The observer slots of the ports the top routes (every port but the bus, whose slot is
/// the bus's own).
#[derive(Debug, Default)]
pub(crate) struct Probes {
    slots: [Probe; Port::ALL.len()],
}

impl Probes {
    /// The slot of `port`.
    pub fn slot(&mut self, port: Port) -> &mut Probe {
        &mut self.slots[port as usize]
    }

    /// Shows `port`'s transaction (built only when an observer is attached).
    #[inline]
    pub fn observe<'a>(&mut self, port: Port, at: Picoseconds, describe: impl FnOnce() -> Transaction<'a>) {
        self.slots[port as usize].observe(at, describe);
    }
}

/// An observer that keeps a copy of what it saw (owned), for tests and simple traces.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(Picoseconds, String)>>>,
}

impl Recorder {
    /// An empty record; clones share it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Everything seen so far (time and the transaction's `Debug` form), oldest first.
    pub fn seen(&self) -> Vec<(Picoseconds, String)> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Observer for Recorder {
    fn observe(&mut self, at: Picoseconds, transaction: &Transaction<'_>) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, format!("{transaction:?}")));
    }
}
