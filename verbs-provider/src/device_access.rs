//! The one interface between the driver and a device, whatever carries the accesses:
//! the model in the same process ([`crate::backend::embedded`]), a vfio-user client, or
//! Linux VFIO on real hardware.
//!
//! The driver needs five things from a backend:
//!
//! * configuration-space and BAR (MMIO) accesses;
//! * DMA memory it can hand to the device: coherent buffers it allocates itself
//!   ([`DeviceAccess::allocate_dma`]) and the application's own buffers, mapped page by page
//!   ([`DeviceAccess::register_user_memory`]) — those pages may land anywhere in bus
//!   address space, which is why memory regions need translation tables;
//! * CPU access to that memory by bus address ([`DeviceAccess::dma_read`] /
//!   [`DeviceAccess::dma_write`]), since the driver writes rings, BT pages and contexts
//!   there;
//! * a notion of waiting ([`DeviceAccess::delay`]): virtual time for the model, a sleep on
//!   real hardware;
//! * the MSI-X vectors that fired ([`DeviceAccess::poll_interrupts`],
//!   [`DeviceAccess::wait_interrupt`]).
//!
//! Every method takes `&self`: backends use interior mutability, so the data path can ring
//! doorbells without taking the driver's control-path lock.

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Instant;

pub use rnic_os::ApplicationRange;

/// Nanoseconds of the host's monotonic clock since the first call in this process.
pub fn monotonic_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Why a backend could not perform an access.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The backend has no more DMA memory (or bus address space) for the request.
    #[error("out of DMA memory: cannot allocate {size} bytes aligned to {align}")]
    OutOfMemory {
        /// Requested size in bytes.
        size: usize,
        /// Requested alignment in bytes.
        align: usize,
    },
    /// The request itself is malformed (zero size, alignment not a power of two, …).
    #[error("invalid DMA request: {reason}")]
    InvalidRequest {
        /// What is wrong with it.
        reason: String,
    },
    /// A CPU access to DMA memory touched an address that is not mapped.
    #[error("DMA memory access of {length} bytes at {address:#x} failed: {reason}")]
    Unmapped {
        /// First byte of the access.
        address: u64,
        /// Length of the access in bytes.
        length: usize,
        /// The backend's explanation.
        reason: String,
    },
    /// The backend cannot do this at all (`EOPNOTSUPP`): e.g. reach an application's
    /// memory in place when the device runs in another process.
    #[error("not supported by this device: {reason}")]
    Unsupported {
        /// What the backend cannot do, and what to use instead.
        reason: String,
    },
    /// The buffer or registration is not known to this backend (double free, foreign
    /// handle).
    #[error("unknown DMA buffer or registration {token}")]
    UnknownHandle {
        /// The backend's token for the buffer.
        token: u64,
    },
}

/// A DMA-coherent buffer allocated by [`DeviceAccess::allocate_dma`]: contiguous in bus
/// address space, zero-filled, and owned by the driver until it hands it back with
/// [`DeviceAccess::free_dma`]. It deliberately has no `Drop`: the driver must free it
/// explicitly, after the device has stopped using it.
#[derive(PartialEq, Eq, Hash)]
pub struct DmaBuffer {
    address: u64,
    size: usize,
    token: u64,
}

impl DmaBuffer {
    /// Creates the handle; for backends only.
    pub fn new(address: u64, size: usize, token: u64) -> Self {
        Self { address, size, token }
    }

    /// Bus address of the first byte (what the device is told).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.size
    }

    /// True for a zero-sized buffer (backends never hand those out).
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The backend's token (for `free_dma`).
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DmaBuffer({:#x}+{:#x}, token {})",
            self.address, self.size, self.token
        )
    }
}

/// Size of the pages [`UserMemory::pages`] lists (the device's minimum page).
pub const USER_PAGE_SIZE: usize = 4096;

/// An application buffer mapped for DMA by [`DeviceAccess::register_user_memory`].
/// The bytes stay with the backend until [`DeviceAccess::unregister_user_memory`] gives
/// them back.
#[derive(Debug, PartialEq, Eq)]
pub struct UserMemory {
    pages: Vec<u64>,
    length: usize,
    token: u64,
}

impl UserMemory {
    /// Creates the handle; for backends only.
    pub fn new(pages: Vec<u64>, length: usize, token: u64) -> Self {
        Self { pages, length, token }
    }

    /// Bus address of each 4 KiB page of the buffer, in buffer order. Byte `i` of the
    /// buffer is at `pages[i / 4096] + i % 4096`.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// Length of the application's buffer in bytes.
    pub fn len(&self) -> usize {
        self.length
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The backend's token (for `unregister_user_memory`).
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// Access to one rnic PCI function. See the module documentation.
///
/// Offsets are byte offsets inside the configuration space or inside the BAR. MMIO
/// accesses are little-endian, naturally aligned, and never fail from the driver's point
/// of view (a PCI read from a missing device returns all ones, which the driver checks
/// for where it matters).
pub trait DeviceAccess: Send + Sync {
    /// Reads `data.len()` bytes of configuration space at `offset`.
    fn config_read(&self, offset: u16, data: &mut [u8]);

    /// Writes `data` to configuration space at `offset`.
    fn config_write(&self, offset: u16, data: &[u8]);

    /// Reads a 32-bit register of `bar`.
    fn mmio_read32(&self, bar: u8, offset: u64) -> u32;

    /// Writes a 32-bit register of `bar`.
    fn mmio_write32(&self, bar: u8, offset: u64, value: u32);

    /// Writes 64 bits to `bar` as one store (doorbells must not be split).
    fn mmio_write64(&self, bar: u8, offset: u64, value: u64);

    /// Allocates a zero-filled DMA buffer of `size` bytes, contiguous in bus address space
    /// and aligned to `align` (a power of two, at least 4096 is always honoured).
    ///
    /// # Errors
    /// [`AccessError::OutOfMemory`] or [`AccessError::InvalidRequest`].
    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError>;

    /// Returns a buffer from [`DeviceAccess::allocate_dma`]. The device must no longer
    /// use it.
    fn free_dma(&self, buffer: DmaBuffer);

    /// CPU read of DMA memory at bus address `address`.
    ///
    /// # Errors
    /// [`AccessError::Unmapped`] when part of the range is not DMA memory of this backend.
    fn dma_read(&self, address: u64, out: &mut [u8]) -> Result<(), AccessError>;

    /// CPU write of DMA memory at bus address `address`.
    ///
    /// # Errors
    /// [`AccessError::Unmapped`] when part of the range is not DMA memory of this backend.
    fn dma_write(&self, address: u64, data: &[u8]) -> Result<(), AccessError>;

    /// Maps the application's buffer for DMA and returns the bus address of each of its
    /// 4 KiB pages. The pages need not be contiguous or in order.
    ///
    /// # Errors
    /// [`AccessError::OutOfMemory`] or [`AccessError::InvalidRequest`] (empty buffer).
    fn register_user_memory(&self, bytes: Vec<u8>) -> Result<UserMemory, AccessError>;

    /// Unmaps a registration and gives the application its bytes back (with whatever the
    /// device wrote into them).
    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8>;

    /// Maps the application's own memory `range` for DMA **in place** (what `ibv_reg_mr`
    /// does on hardware: the device reads and writes the application's bytes, and a
    /// remote WRITE is visible in its buffer when the completion is) and returns the bus
    /// address of every 4 KiB page that holds a byte of it, the first page being the one
    /// that holds `range.address()`. The device reaches only the bytes of the range.
    ///
    /// # Errors
    /// [`AccessError::Unsupported`] for a backend whose device cannot reach this
    /// process's memory (the default); what mapping failed with otherwise.
    fn register_application_memory(&self, range: Arc<ApplicationRange>) -> Result<UserMemory, AccessError> {
        Err(AccessError::Unsupported {
            reason: format!(
                "this backend cannot reach application memory in place ({} bytes at {:#x})",
                range.len(),
                range.address()
            ),
        })
    }

    /// Unmaps a registration of [`DeviceAccess::register_application_memory`]; the device
    /// no longer reaches those bytes.
    fn unregister_application_memory(&self, memory: UserMemory) {
        tracing::error!(?memory, "unregister of application memory this backend never mapped");
    }

    /// Waits `nanoseconds` (the model: virtual time passes and due events run; real
    /// hardware: sleep or spin).
    fn delay(&self, nanoseconds: u64);

    /// MSI-X vectors that fired since the last call (in firing order, repeats kept).
    fn poll_interrupts(&self) -> Vec<u16>;

    /// Waits up to `timeout_ns` for at least one MSI-X message; returns the vectors that
    /// fired (empty on timeout). Never blocks past the timeout; the model returns at once
    /// when nothing is pending that could ever raise an interrupt.
    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16>;

    /// The driver looked for work and found none (an empty poll of a completion queue).
    /// A model on virtual time lets a little of it pass, so an application spinning on
    /// `poll` sees its completions arrive; on real hardware time passes anyway and this
    /// does nothing.
    fn idle(&self) {}

    /// A count that rises after every write to the driver's DMA memory (the device's CQEs
    /// and EQEs, the driver's own writes), raised with release ordering once the written
    /// bytes are visible to [`DeviceAccess::dma_read`]; `None` when the backend keeps no
    /// such count. A poller that found a queue empty at count `n` knows it is still empty
    /// while the count is `n` and need not read it again: the empty polls of a spinning
    /// application then touch nothing the device writes. [`DeviceAccess::idle`] is still
    /// called for each empty poll.
    fn driver_memory_writes(&self) -> Option<u64> {
        None
    }

    /// The port's MAC address as the platform knows it (the netdev's address on Linux,
    /// the device configuration for the model), if the backend knows it. The driver
    /// programs it as source MAC 0 and derives the default GID from it.
    fn mac_address(&self) -> Option<[u8; 6]> {
        None
    }

    /// The time the device lives in, in nanoseconds from an arbitrary start: the model's
    /// virtual time for the embedded backend, the host's monotonic clock for the others.
    /// Timers above the driver (the connection manager's) read it, so runs on virtual time
    /// stay reproducible.
    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    /// Reads a 16-bit configuration register.
    fn config_read16(&self, offset: u16) -> u16 {
        let mut b = [0u8; 2];
        self.config_read(offset, &mut b);
        u16::from_le_bytes(b)
    }

    /// Writes a 16-bit configuration register.
    fn config_write16(&self, offset: u16, value: u16) {
        self.config_write(offset, &value.to_le_bytes());
    }

    /// Reads a 32-bit configuration register.
    fn config_read32(&self, offset: u16) -> u32 {
        let mut b = [0u8; 4];
        self.config_read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    /// Writes a 32-bit configuration register.
    fn config_write32(&self, offset: u16, value: u32) {
        self.config_write(offset, &value.to_le_bytes());
    }
}
