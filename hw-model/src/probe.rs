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
}

impl Port {
    /// Every port, in a fixed order.
    pub const ALL: &'static [Port] = &[Port::Bus];

    /// The port's name in traces.
    pub const fn name(self) -> &'static str {
        match self {
            Port::Bus => "bus",
        }
    }
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
}

impl Transaction<'_> {
    /// The port this transaction crosses.
    pub const fn port(&self) -> Port {
        match self {
            Transaction::DmaRead { .. } | Transaction::DmaWrite { .. } | Transaction::DmaError { .. } => Port::Bus,
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
