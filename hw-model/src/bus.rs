//! The bus: host memory as the device's DMA reaches it.
//!
//! Every DMA access of every block goes through the [`Bus`]: it is refused while the
//! driver has bus mastering off (PCI `COMMAND.BUS_MASTER`, which the top mirrors here after
//! every configuration write), a failed access is counted (the device's `dma_errors`), and
//! an observer on [`Port::Bus`](crate::probe::Port::Bus) sees each access.

use std::sync::Arc;

use crate::memory::{AccessKind, HostMemory, MemoryError};
use crate::probe::{Probe, Transaction};
use crate::time::Picoseconds;

/// Host memory behind the PCI bus-master gate.
pub(crate) struct Bus {
    memory: Arc<dyn HostMemory>,
    /// PCI `COMMAND.BUS_MASTER` as configuration space holds it.
    master: bool,
    /// Accesses that failed since power-on (the device's `dma_errors`).
    errors: u64,
    /// The virtual time of the activity using the bus (for the observer).
    now: Picoseconds,
    probe: Probe,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("master", &self.master)
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

impl Bus {
    /// The bus to `memory`, with bus mastering off (the PCI reset value).
    pub fn new(memory: Arc<dyn HostMemory>) -> Self {
        Self {
            memory,
            master: false,
            errors: 0,
            now: Picoseconds::ZERO,
            probe: Probe::default(),
        }
    }

    /// A copy onto the same host memory, without the observer.
    pub fn fork(&self) -> Self {
        Self {
            memory: self.memory.clone(),
            master: self.master,
            errors: self.errors,
            now: self.now,
            probe: Probe::default(),
        }
    }

    /// Follows `COMMAND.BUS_MASTER`.
    pub fn set_master(&mut self, enabled: bool) {
        self.master = enabled;
    }

    /// Whether bus mastering is on.
    #[inline]
    pub fn master(&self) -> bool {
        self.master
    }

    /// Follows virtual time (for the observer's timestamps).
    #[inline]
    pub fn set_now(&mut self, now: Picoseconds) {
        self.now = now;
    }

    /// DMA accesses that failed since power-on.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// Counts a failed access another block made on the bus's behalf (a BT entry read of
    /// a translation walk, which reads host memory through [`Bus::memory`]).
    pub fn count_error(&mut self) {
        self.errors += 1;
    }

    /// The observer slot of the bus.
    pub fn probe_mut(&mut self) -> &mut Probe {
        &mut self.probe
    }

    /// Reads `buffer.len()` bytes at `address`; refused unless bus mastering is on.
    #[inline]
    pub fn read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let result = if self.master {
            self.memory.read(address, buffer)
        } else {
            Err(MemoryError::Permission {
                kind: AccessKind::Read,
                address,
            })
        };
        if result.is_err() {
            self.errors += 1;
        }
        if self.probe.is_attached() {
            let (ok, length) = (result.is_ok(), buffer.len());
            let data: &[u8] = buffer;
            self.probe.observe(self.now, || match ok {
                true => Transaction::DmaRead { address, data },
                false => Transaction::DmaError {
                    address,
                    length,
                    write: false,
                },
            });
        }
        result
    }

    /// Writes `data` at `address`; refused unless bus mastering is on.
    #[inline]
    pub fn write(&mut self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        let result = if self.master {
            self.memory.write(address, data)
        } else {
            Err(MemoryError::Permission {
                kind: AccessKind::Write,
                address,
            })
        };
        if result.is_err() {
            self.errors += 1;
        }
        if self.probe.is_attached() {
            let ok = result.is_ok();
            self.probe.observe(self.now, || match ok {
                true => Transaction::DmaWrite { address, data },
                false => Transaction::DmaError {
                    address,
                    length: data.len(),
                    write: true,
                },
            });
        }
        result
    }

    /// Host memory for reads a block does on its own (translation walks, which read BT
    /// entries), when bus mastering is on.
    #[inline]
    pub fn memory(&self) -> Option<&dyn HostMemory> {
        self.master.then_some(&*self.memory as &dyn HostMemory)
    }

    /// Host memory as DMA sees it: refusing every access while bus mastering is off.
    pub fn gated_memory(&self) -> &dyn HostMemory {
        match self.master {
            true => &*self.memory,
            false => &Unreachable,
        }
    }

    /// A handle on host memory, when bus mastering is on: lets a walk borrow the memory
    /// while the block that walks records accesses on the bus.
    #[inline]
    pub fn memory_handle(&self) -> Option<Arc<dyn HostMemory>> {
        self.master.then(|| self.memory.clone())
    }
}

/// Host memory while bus mastering is off: every access is refused.
struct Unreachable;

impl HostMemory for Unreachable {
    fn read(&self, address: u64, _buffer: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError::Permission {
            kind: AccessKind::Read,
            address,
        })
    }

    fn write(&self, address: u64, _data: &[u8]) -> Result<(), MemoryError> {
        Err(MemoryError::Permission {
            kind: AccessKind::Write,
            address,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Backing, PagedMemory};
    use crate::probe::Recorder;

    fn bus() -> Bus {
        let memory = PagedMemory::new();
        let backing = Backing::zeroed(4096);
        memory.map_contiguous(0x1000, &backing, 0, 1, true);
        Bus::new(Arc::new(memory))
    }

    #[test]
    fn nothing_passes_while_bus_mastering_is_off_and_every_failure_is_counted() {
        let mut bus = bus();
        let mut word = [0u8; 4];
        assert!(matches!(
            bus.read(0x1000, &mut word),
            Err(MemoryError::Permission {
                kind: AccessKind::Read,
                ..
            })
        ));
        assert!(bus.memory().is_none() && bus.memory_handle().is_none());
        assert!(bus.gated_memory().read(0x1000, &mut word).is_err());
        bus.set_master(true);
        bus.write(0x1000, &[1, 2, 3, 4]).unwrap();
        bus.read(0x1000, &mut word).unwrap();
        assert_eq!(word, [1, 2, 3, 4]);
        assert!(bus.write(0x9000, &[0]).is_err(), "unmapped");
        assert_eq!(bus.errors(), 2);
    }

    #[test]
    fn an_observer_sees_each_access_with_its_bytes_and_time() {
        let mut bus = bus();
        bus.set_master(true);
        let recorder = Recorder::new();
        bus.probe_mut().attach(Some(Box::new(recorder.clone())));
        bus.set_now(Picoseconds(7));
        bus.write(0x1004, &[9, 8]).unwrap();
        let mut two = [0u8; 2];
        bus.read(0x1004, &mut two).unwrap();
        let _ = bus.read(0x9000, &mut two);
        let seen = recorder.seen();
        assert_eq!(seen.len(), 3);
        assert_eq!(
            seen[0],
            (Picoseconds(7), "DmaWrite { address: 4100, data: [9, 8] }".to_string())
        );
        assert_eq!(seen[1].1, "DmaRead { address: 4100, data: [9, 8] }");
        assert_eq!(seen[2].1, "DmaError { address: 36864, length: 2, write: false }");
    }
}
