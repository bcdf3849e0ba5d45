//! Interrupts as the device sends them: MSI-X messages handed to an [`InterruptSink`].
//!
//! An MSI-X interrupt is a DMA write of `data` to `address`; the model does not perform
//! that write itself but hands the message to the sink, which the backend implements
//! (an eventfd for vfio-user, a callback for the embedded backend). [`RecordingSink`]
//! keeps every message, for tests and for a backend that polls.

use std::sync::{Arc, Mutex, MutexGuard};

/// One MSI-X message, as read from the vector's table entry when it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixMessage {
    /// Vector number (index of the MSI-X table entry).
    pub vector: u16,
    /// Message address (table entry address high << 32 | address low).
    pub address: u64,
    /// Message data (table entry message data).
    pub data: u32,
}

/// Where the device delivers its MSI-X messages.
pub trait InterruptSink: Send {
    /// Delivers one message. Called only for an enabled, unmasked vector; masking and
    /// pending bits are handled before this by [`crate::pci::MsixTable`].
    fn deliver(&mut self, message: MsixMessage);
}

/// A sink that records every message. Clones share the same record, so a test can keep
/// one handle and give the other to the device.
#[derive(Debug, Clone, Default)]
pub struct RecordingSink {
    messages: Arc<Mutex<Vec<MsixMessage>>>,
}

impl RecordingSink {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<MsixMessage>> {
        // A panic while holding the lock cannot leave the Vec inconsistent.
        self.messages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes and returns every message recorded so far, oldest first.
    pub fn take(&self) -> Vec<MsixMessage> {
        std::mem::take(&mut *self.lock())
    }

    /// A copy of the messages recorded so far, oldest first, without removing them.
    pub fn messages(&self) -> Vec<MsixMessage> {
        self.lock().clone()
    }

    /// Number of recorded (not yet taken) messages for `vector`.
    pub fn count(&self, vector: u16) -> usize {
        self.lock().iter().filter(|m| m.vector == vector).count()
    }

    /// Number of recorded (not yet taken) messages, all vectors.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no message is recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl InterruptSink for RecordingSink {
    fn deliver(&mut self, message: MsixMessage) {
        self.lock().push(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(vector: u16) -> MsixMessage {
        MsixMessage {
            vector,
            address: 0xFEE0_0000 + u64::from(vector) * 4,
            data: 0x40 + u32::from(vector),
        }
    }

    #[test]
    fn clones_share_one_record_in_delivery_order() {
        let observer = RecordingSink::new();
        let mut device_side = observer.clone();
        device_side.deliver(message(1));
        device_side.deliver(message(0));
        device_side.deliver(message(1));
        assert_eq!(observer.len(), 3);
        assert_eq!(observer.count(1), 2);
        assert_eq!(observer.count(0), 1);
        assert_eq!(observer.count(7), 0);
        assert_eq!(observer.messages(), vec![message(1), message(0), message(1)]);
    }

    #[test]
    fn take_empties_the_record() {
        let mut sink = RecordingSink::new();
        sink.deliver(message(3));
        assert_eq!(sink.take(), vec![message(3)]);
        assert!(sink.is_empty());
        assert_eq!(sink.count(3), 0);
        assert_eq!(sink.take(), vec![]);
    }

    #[test]
    fn a_sink_is_usable_as_a_trait_object() {
        let record = RecordingSink::new();
        let mut boxed: Box<dyn InterruptSink> = Box::new(record.clone());
        boxed.deliver(message(2));
        assert_eq!(record.take(), vec![message(2)]);
    }
}
