//! MSI-X over vfio-user: one eventfd per vector, wired with SET_IRQS, written by the
//! device's [`InterruptSink`].
//!
//! A vfio-user client (QEMU) emulates the MSI-X *table* itself: the guest's table writes
//! never reach the server, so the model's own table stays in its reset state (every
//! vector masked). The server therefore drives the model's per-vector mask bits from
//! SET_IRQS: a vector is unmasked in the model exactly while it has an eventfd and the
//! client has not masked it with ACTION_MASK. While it is masked, the model keeps the
//! interrupt pending (PBA bit, which QEMU reads from BAR4) and delivers it on unmask, so
//! nothing is lost between SET_IRQS calls. [`MsixState::desired_mask`] is what the
//! server writes into the model; see `server.rs`.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_hw_model::interrupt::{InterruptSink, MsixMessage};

/// Per-vector state set by the client.
#[derive(Debug, Default)]
struct Vector {
    eventfd: Option<File>,
    /// Masked with SET_IRQS ACTION_MASK (cleared by ACTION_UNMASK or a new eventfd).
    masked: bool,
}

/// The eventfds and client masks of the MSI-X vectors, plus delivery statistics.
#[derive(Debug)]
pub struct MsixState {
    vectors: Vec<Vector>,
    /// Messages written to an eventfd.
    pub delivered: u64,
    /// Messages the device sent for a vector without an eventfd (dropped).
    pub dropped: u64,
}

impl MsixState {
    /// `count` vectors, none wired.
    pub fn new(count: u16) -> Self {
        Self {
            vectors: (0..count).map(|_| Vector::default()).collect(),
            delivered: 0,
            dropped: 0,
        }
    }

    /// Number of vectors.
    pub fn count(&self) -> u32 {
        self.vectors.len() as u32
    }

    /// Number of vectors with an eventfd.
    pub fn wired(&self) -> usize {
        self.vectors.iter().filter(|v| v.eventfd.is_some()).count()
    }

    /// Sets (Some) or removes (None) the eventfd of `vector`. A new eventfd also clears
    /// the client mask, as re-wiring a vector does in VFIO.
    pub fn set_eventfd(&mut self, vector: u32, fd: Option<OwnedFd>) {
        if let Some(v) = self.vectors.get_mut(vector as usize) {
            v.masked &= fd.is_none();
            v.eventfd = fd.map(File::from);
        }
    }

    /// Sets the client mask of `vector`.
    pub fn set_masked(&mut self, vector: u32, masked: bool) {
        if let Some(v) = self.vectors.get_mut(vector as usize) {
            v.masked = masked;
        }
    }

    /// Removes every eventfd and client mask (SET_IRQS disable, or client disconnect).
    pub fn clear(&mut self) {
        for v in &mut self.vectors {
            *v = Vector::default();
        }
    }

    /// Whether the model should have `vector` masked: no eventfd, or masked by the client.
    pub fn desired_mask(&self, vector: u32) -> bool {
        self.vectors
            .get(vector as usize)
            .map_or(true, |v| v.eventfd.is_none() || v.masked)
    }

    /// Signals `vector`'s eventfd (the model's MSI-X message, or a SET_IRQS loopback
    /// trigger). Returns false when the vector has none.
    pub fn signal(&mut self, vector: u32) -> bool {
        let Some(file) = self.vectors.get(vector as usize).and_then(|v| v.eventfd.as_ref()) else {
            self.dropped += 1;
            return false;
        };
        // An eventfd write only fails when the counter would overflow (the client never
        // reads it) or the fd is not an eventfd; either way the interrupt is lost, as on
        // a bus with nobody listening.
        match (&*file).write(&1u64.to_ne_bytes()) {
            Ok(8) => {
                self.delivered += 1;
                true
            }
            result => {
                tracing::debug!(target: "rnic_emu::irq", vector, ?result, "eventfd write failed");
                self.dropped += 1;
                false
            }
        }
    }
}

/// The shared MSI-X state: the server changes it on SET_IRQS, the sink reads it.
pub type SharedMsix = Arc<Mutex<MsixState>>;

/// Locks the shared state (a panic while holding the lock cannot corrupt it).
pub fn lock(state: &SharedMsix) -> MutexGuard<'_, MsixState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The model's interrupt sink: writes the vector's eventfd.
#[derive(Debug, Clone)]
pub struct EventfdSink {
    state: SharedMsix,
}

impl EventfdSink {
    /// A sink over `state`.
    pub fn new(state: SharedMsix) -> Self {
        Self { state }
    }
}

impl InterruptSink for EventfdSink {
    fn deliver(&mut self, message: MsixMessage) {
        if !lock(&self.state).signal(u32::from(message.vector)) {
            tracing::trace!(target: "rnic_emu::irq", vector = message.vector, "MSI-X message without an eventfd dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os;
    use std::io::Read;
    use std::os::fd::AsFd;

    #[test]
    fn signal_writes_the_vector_eventfd_and_masks_follow_wiring() {
        let mut state = MsixState::new(4);
        assert!(state.desired_mask(1));
        let event = os::eventfd().unwrap();
        let clone = event.as_fd().try_clone_to_owned().unwrap();
        state.set_eventfd(1, Some(clone));
        assert!(!state.desired_mask(1));
        state.set_masked(1, true);
        assert!(state.desired_mask(1));
        assert!(state.signal(1));
        assert!(!state.signal(2));
        let mut counter = [0u8; 8];
        File::from(event).read_exact(&mut counter).unwrap();
        assert_eq!(u64::from_ne_bytes(counter), 1);
        assert_eq!((state.delivered, state.dropped), (1, 1));
        state.clear();
        assert_eq!(state.wired(), 0);
        assert!(state.desired_mask(9), "vectors beyond the table count as masked");
    }
}
