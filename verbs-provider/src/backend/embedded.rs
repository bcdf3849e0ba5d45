//! The embedded backend: the device model runs in the same process, on virtual time.
//!
//! * Every NIC sits on an [`EmbeddedFabric`], an in-process wire ([`Fabric`]) that owns the
//!   devices, gives them one virtual clock and carries their frames. NICs on one fabric
//!   reach each other; [`EmbeddedDevice::new`] makes a fabric of one. Each NIC is a host
//!   of its own: its own host memory, DMA allocator and MSI-X sink.
//! * Host memory is a [`PagedMemory`] shared with the device. DMA buffers come from a bump
//!   allocator over bus-address space starting at [`DMA_BASE`]; each buffer is its own
//!   [`Backing`] mapped contiguously. Addresses are never reused, so a device access to a
//!   freed buffer fails loudly (unmapped) instead of corrupting a newer one.
//! * Application buffers ([`DeviceAccess::register_user_memory`]) are moved into a
//!   `Backing` and mapped frame by frame above [`USER_MEMORY_BASE`] — scattered over a
//!   span twice their size in a seeded shuffled order by default, so memory regions need
//!   real translation tables.
//! * Every MMIO access first advances the fabric's virtual time by
//!   [`EmbeddedConfig::mmio_cost`] (the cost of a PCIe round trip) and runs everything due
//!   by then, on every NIC and on the wire; [`DeviceAccess::delay`] advances it;
//!   [`DeviceAccess::wait_interrupt`] runs events until an MSI-X message for this NIC
//!   arrives, nothing is pending any more, or the timeout passes; an empty poll
//!   ([`DeviceAccess::idle`]) costs an MMIO's worth of time too. So whichever driver
//!   touches its NIC, all of them progress: device B answers while driver A polls.
//!
//! [`EmbeddedDevice`] and [`EmbeddedFabric`] are cheap handles (clones share the device or
//! the fabric), so a test can give one clone to the driver and keep another to look
//! inside the model or at the wire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_hw_model::config::DeviceConfig;
use rnic_hw_model::device::Device;
use rnic_hw_model::fabric::{CapturedFrame, DeviceId, Fabric, FabricConfig, FabricStatistics};
use rnic_hw_model::interrupt::RecordingSink;
use rnic_hw_model::memory::{Backing, HostMemory, PagedMemory, FRAME_SIZE};
use rnic_hw_model::time::Picoseconds;

use crate::device_access::{AccessError, DeviceAccess, DmaBuffer, UserMemory};

/// Size of a transparent huge page: application buffers at least this large are advised
/// to be backed by them.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// First bus address handed out for driver DMA buffers.
pub const DMA_BASE: u64 = 0x1_0000_0000;
/// First bus address used for application buffers.
pub const USER_MEMORY_BASE: u64 = 0x80_0000_0000;
/// Default cost of one MMIO access (a PCIe round trip is a few hundred ns; a posted write
/// less). 100 ns keeps polling loops cheap in virtual time.
pub const DEFAULT_MMIO_COST_NS: u64 = 100;

/// How application buffers are placed in bus-address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserMemoryLayout {
    /// Each 4 KiB page at a different frame, shuffled (seeded) inside a span of twice the
    /// buffer's size: no two neighbouring pages are guaranteed to be adjacent.
    Scattered,
    /// Contiguous, starting at an address aligned to 2 MiB (so the driver may choose large
    /// pages).
    Contiguous,
}

/// Configuration of an [`EmbeddedDevice`].
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// The device model's configuration (identity, caps, MAC, timing parameters).
    pub device: DeviceConfig,
    /// Virtual time one MMIO access costs.
    pub mmio_cost: Picoseconds,
    /// Placement of application buffers.
    pub user_memory_layout: UserMemoryLayout,
    /// Seed of the page shuffle for [`UserMemoryLayout::Scattered`].
    pub seed: u64,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            device: DeviceConfig::default(),
            mmio_cost: Picoseconds::from_nanos(DEFAULT_MMIO_COST_NS),
            user_memory_layout: UserMemoryLayout::Scattered,
            seed: 0x5EED_2024,
        }
    }
}

impl EmbeddedConfig {
    /// The default configuration with the given port MAC address.
    pub fn with_mac(mac_address: [u8; 6]) -> Self {
        Self {
            device: DeviceConfig::with_mac(mac_address),
            ..Self::default()
        }
    }
}

/// One driver DMA buffer.
#[derive(Debug)]
struct Allocation {
    address: u64,
    frames: u64,
}

/// One application buffer.
#[derive(Debug)]
struct Registration {
    frames: Vec<u64>,
    length: usize,
    backing: Arc<Backing>,
}

/// Bus-address bookkeeping.
#[derive(Debug)]
struct AddressSpace {
    next_dma: u64,
    next_user: u64,
    next_token: u64,
    rng: u64,
    allocations: HashMap<u64, Allocation>,
    registrations: HashMap<u64, Registration>,
}

impl AddressSpace {
    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// xorshift64*: deterministic, no external crates.
    fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves nothing half-updated that matters
    // more than the panic itself, so keep going with the inner value.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

/// Several embedded NICs on one in-process wire and one virtual clock. Clones share the
/// fabric.
///
/// ```
/// use rnic_verbs::backend::EmbeddedFabric;
/// let fabric = EmbeddedFabric::new(Default::default());
/// let a = fabric.add_nic([2, 0, 0, 0, 0, 1]);
/// let b = fabric.add_nic([2, 0, 0, 0, 0, 2]);
/// assert_eq!(a.now(), b.now());
/// ```
#[derive(Clone)]
pub struct EmbeddedFabric {
    fabric: Arc<Mutex<Fabric>>,
}

impl std::fmt::Debug for EmbeddedFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        lock(&self.fabric).fmt(f)
    }
}

impl Default for EmbeddedFabric {
    fn default() -> Self {
        Self::new(FabricConfig::default())
    }
}

impl EmbeddedFabric {
    /// An empty fabric at time zero.
    pub fn new(config: FabricConfig) -> Self {
        Self {
            fabric: Arc::new(Mutex::new(Fabric::new(config))),
        }
    }

    /// Plugs a NIC with the default configuration and MAC address `mac` into the fabric.
    pub fn add_nic(&self, mac: [u8; 6]) -> EmbeddedDevice {
        self.add_nic_with_config(EmbeddedConfig::with_mac(mac))
    }

    /// Plugs a NIC with `config` into the fabric (it starts at the fabric's time).
    pub fn add_nic_with_config(&self, config: EmbeddedConfig) -> EmbeddedDevice {
        let memory = Arc::new(PagedMemory::new());
        let interrupts = RecordingSink::new();
        let device = Device::new(
            config.device.clone(),
            memory.clone() as Arc<dyn HostMemory>,
            Box::new(interrupts.clone()),
        );
        let id = lock(&self.fabric).add_device(device);
        let space = AddressSpace {
            next_dma: DMA_BASE,
            next_user: USER_MEMORY_BASE,
            next_token: 0,
            rng: config.seed | 1,
            allocations: HashMap::new(),
            registrations: HashMap::new(),
        };
        EmbeddedDevice {
            shared: Arc::new(Shared {
                config,
                memory,
                fabric: self.clone(),
                id,
                interrupts,
                space: Mutex::new(space),
            }),
        }
    }

    /// Runs `f` on the fabric (devices, clock, capture, fault plan). Do not hold on to
    /// anything a driver needs: every access of every NIC waits for `f`.
    pub fn with_fabric<R>(&self, f: impl FnOnce(&mut Fabric) -> R) -> R {
        f(&mut lock(&self.fabric))
    }

    /// The shared virtual time.
    pub fn now(&self) -> Picoseconds {
        lock(&self.fabric).now()
    }

    /// Lets `span` of virtual time pass, running everything due on the way.
    pub fn advance(&self, span: Picoseconds) {
        let mut fabric = lock(&self.fabric);
        let target = fabric.now() + span;
        fabric.advance_to(target);
    }

    /// Runs everything due at the next pending instant (a device event, a frame arrival),
    /// or lets `limit` pass if nothing is due before `now + limit`: a poll loop that wakes
    /// exactly when something can have changed.
    pub fn advance_to_next_event(&self, limit: Picoseconds) {
        lock(&self.fabric).advance_to_next_event(limit);
    }

    /// [`EmbeddedFabric::advance_to_next_event`] again and again, without letting go of the
    /// fabric, until `stop` holds after a step; returns the steps taken (at least one). For
    /// a poll loop that has nothing to do until something it can see changes (a CQE
    /// written): the same steps as calling it once per pass, without the passes.
    pub fn advance_to_next_event_until(&self, limit: Picoseconds, stop: impl FnMut(&Fabric) -> bool) -> u64 {
        lock(&self.fabric).advance_to_next_event_until(limit, stop)
    }

    /// Runs until nothing is pending or the next thing is after `now + limit` (timers
    /// keep the wire busy forever while a QP waits for an answer); returns the time
    /// reached.
    pub fn run_until_idle(&self, limit: Picoseconds) -> Picoseconds {
        let mut fabric = lock(&self.fabric);
        let limit = fabric.now() + limit;
        fabric.run_until_idle(limit)
    }

    /// What the wire did with the frames so far.
    pub fn statistics(&self) -> FabricStatistics {
        lock(&self.fabric).statistics()
    }

    /// Starts or stops recording every frame put on the wire.
    pub fn set_capture(&self, on: bool) {
        lock(&self.fabric).set_capture(on);
    }

    /// Takes the frames recorded so far, oldest first.
    pub fn take_capture(&self) -> Vec<CapturedFrame> {
        lock(&self.fabric).take_capture()
    }

    /// Number of NICs on the fabric.
    pub fn nics(&self) -> usize {
        lock(&self.fabric).devices()
    }

    /// The MAC of the NIC whose GID table holds `gid`: neighbour resolution on the
    /// in-process wire (what ARP or ND finds on an Ethernet), for the connection manager.
    pub fn neighbour_mac(&self, gid: &[u8; 16]) -> Option<[u8; 6]> {
        let fabric = lock(&self.fabric);
        (0..fabric.devices()).map(DeviceId).find_map(|id| {
            let device = fabric.device(id);
            device
                .gid_table()
                .iter()
                .flatten()
                .any(|entry| entry.gid == *gid)
                .then(|| device.config().mac_address)
        })
    }
}

struct Shared {
    config: EmbeddedConfig,
    memory: Arc<PagedMemory>,
    fabric: EmbeddedFabric,
    id: DeviceId,
    interrupts: RecordingSink,
    space: Mutex<AddressSpace>,
}

/// One NIC of an [`EmbeddedFabric`] behind [`DeviceAccess`]. Clones share the NIC.
#[derive(Clone)]
pub struct EmbeddedDevice {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EmbeddedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedDevice")
            .field("mac", &self.shared.config.device.mac_address)
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

impl EmbeddedDevice {
    /// A NIC with the default configuration, alone on a fabric of its own.
    pub fn new() -> Self {
        Self::with_config(EmbeddedConfig::default())
    }

    /// A NIC with `config`, alone on a fabric of its own.
    pub fn with_config(config: EmbeddedConfig) -> Self {
        EmbeddedFabric::default().add_nic_with_config(config)
    }

    /// The configuration this device was built with.
    pub fn config(&self) -> &EmbeddedConfig {
        &self.shared.config
    }

    /// The fabric the NIC is plugged into.
    pub fn fabric(&self) -> &EmbeddedFabric {
        &self.shared.fabric
    }

    /// The NIC's place on its fabric.
    pub fn device_id(&self) -> DeviceId {
        self.shared.id
    }

    /// Runs `f` on the model, for inspection (context tables, counters, diagnostics).
    /// Holds the whole fabric meanwhile.
    pub fn with_device<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        f(lock(&self.shared.fabric.fabric).device_mut(self.shared.id))
    }

    /// Current virtual time (the fabric's).
    pub fn now(&self) -> Picoseconds {
        self.shared.fabric.now()
    }

    /// The host memory the device sees.
    pub fn memory(&self) -> &Arc<PagedMemory> {
        &self.shared.memory
    }

    /// Driver DMA buffers currently allocated.
    pub fn dma_buffers_in_use(&self) -> usize {
        lock(&self.shared.space).allocations.len()
    }

    /// Application buffers currently registered.
    pub fn user_registrations_in_use(&self) -> usize {
        lock(&self.shared.space).registrations.len()
    }

    /// Frames mapped in host memory (DMA buffers plus application buffers).
    pub fn mapped_frames(&self) -> usize {
        self.shared.memory.mapped_frames()
    }

    /// Lets `span` pass on the fabric, then runs `f` on this NIC: one MMIO access.
    fn access<R>(&self, span: Picoseconds, f: impl FnOnce(&mut Device) -> R) -> R {
        let mut fabric = lock(&self.shared.fabric.fabric);
        let target = fabric.now() + span;
        fabric.advance_to(target);
        f(fabric.device_mut(self.shared.id))
    }
}

impl Default for EmbeddedDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceAccess for EmbeddedDevice {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.access(self.shared.config.mmio_cost, |device| {
            device.config_read(usize::from(offset), data)
        });
    }

    fn config_write(&self, offset: u16, data: &[u8]) {
        self.access(self.shared.config.mmio_cost, |device| {
            device.config_write(usize::from(offset), data)
        });
    }

    fn mmio_read32(&self, bar: u8, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.access(self.shared.config.mmio_cost, |device| {
            device.bar_read(bar, offset, &mut b)
        });
        u32::from_le_bytes(b)
    }

    fn mmio_write32(&self, bar: u8, offset: u64, value: u32) {
        self.access(self.shared.config.mmio_cost, |device| {
            device.bar_write(bar, offset, &value.to_le_bytes())
        });
    }

    fn mmio_write64(&self, bar: u8, offset: u64, value: u64) {
        self.access(self.shared.config.mmio_cost, |device| {
            device.bar_write(bar, offset, &value.to_le_bytes())
        });
    }

    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError> {
        if size == 0 {
            return Err(AccessError::InvalidRequest {
                reason: "a DMA buffer of 0 bytes".into(),
            });
        }
        if !align.is_power_of_two() {
            return Err(AccessError::InvalidRequest {
                reason: format!("alignment {align} is not a power of two"),
            });
        }
        let align = (align as u64).max(FRAME_SIZE);
        let frames = (size as u64).div_ceil(FRAME_SIZE);
        let mut space = lock(&self.shared.space);
        let address = align_up(space.next_dma, align);
        let end = address
            .checked_add(frames * FRAME_SIZE)
            .filter(|end| *end <= USER_MEMORY_BASE)
            .ok_or(AccessError::OutOfMemory {
                size,
                align: align as usize,
            })?;
        space.next_dma = end;
        let backing = Backing::zeroed((frames * FRAME_SIZE) as usize);
        self.shared
            .memory
            .map_contiguous(address, &backing, 0, frames as usize, true);
        let token = space.token();
        space.allocations.insert(token, Allocation { address, frames });
        Ok(DmaBuffer::new(address, size, token))
    }

    fn free_dma(&self, buffer: DmaBuffer) {
        let mut space = lock(&self.shared.space);
        match space.allocations.remove(&buffer.token()) {
            Some(allocation) => {
                for frame in 0..allocation.frames {
                    self.shared.memory.unmap_frame(allocation.address + frame * FRAME_SIZE);
                }
            }
            None => tracing::error!(?buffer, "free_dma of an unknown buffer"),
        }
    }

    fn dma_read(&self, address: u64, out: &mut [u8]) -> Result<(), AccessError> {
        self.shared
            .memory
            .read(address, out)
            .map_err(|e| AccessError::Unmapped {
                address,
                length: out.len(),
                reason: e.to_string(),
            })
    }

    fn dma_write(&self, address: u64, data: &[u8]) -> Result<(), AccessError> {
        self.shared
            .memory
            .write(address, data)
            .map_err(|e| AccessError::Unmapped {
                address,
                length: data.len(),
                reason: e.to_string(),
            })
    }

    fn register_user_memory(&self, bytes: Vec<u8>) -> Result<UserMemory, AccessError> {
        if bytes.is_empty() {
            return Err(AccessError::InvalidRequest {
                reason: "an empty application buffer".into(),
            });
        }
        let length = bytes.len();
        let page_count = (length as u64).div_ceil(FRAME_SIZE);
        let mut bytes = bytes;
        // Whole frames now, so the backing keeps this allocation and the advice below.
        bytes.resize((page_count * FRAME_SIZE) as usize, 0);
        if bytes.len() >= HUGE_PAGE_BYTES {
            // The model's DMA streams through large buffers page after page: backed by
            // huge pages, they cost the TLB one entry per 2 MiB (docs/benchmarks.md,
            // issue 19). Advice only: without transparent huge pages nothing changes.
            let _ = rnic_os::advise_huge_pages(bytes.as_ptr() as usize, bytes.len());
        }
        let backing = Backing::from_vec(bytes);
        let mut space = lock(&self.shared.space);
        let frames: Vec<u64> = match self.shared.config.user_memory_layout {
            UserMemoryLayout::Contiguous => {
                let base = align_up(space.next_user, 2 << 20);
                space.next_user = base + page_count * FRAME_SIZE;
                (0..page_count).map(|i| base + i * FRAME_SIZE).collect()
            }
            UserMemoryLayout::Scattered => {
                // Shuffle 2n frame slots and take the first n: pages end up out of order
                // with gaps between them.
                let span = page_count * 2;
                let base = space.next_user;
                space.next_user = base + (span + 1) * FRAME_SIZE;
                let mut slots: Vec<u64> = (0..span).collect();
                for i in (1..slots.len()).rev() {
                    let j = (space.random() % (i as u64 + 1)) as usize;
                    slots.swap(i, j);
                }
                slots
                    .into_iter()
                    .take(page_count as usize)
                    .map(|slot| base + slot * FRAME_SIZE)
                    .collect()
            }
        };
        for (page, address) in frames.iter().enumerate() {
            self.shared.memory.map_frame(*address, &backing, page, true);
        }
        let token = space.token();
        space.registrations.insert(
            token,
            Registration {
                frames: frames.clone(),
                length,
                backing,
            },
        );
        Ok(UserMemory::new(frames, length, token))
    }

    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8> {
        let registration = lock(&self.shared.space).registrations.remove(&memory.token());
        let Some(registration) = registration else {
            tracing::error!(?memory, "unregister of an unknown application buffer");
            return Vec::new();
        };
        for address in &registration.frames {
            self.shared.memory.unmap_frame(*address);
        }
        match registration.backing.into_vec() {
            Ok(mut bytes) => {
                bytes.truncate(registration.length);
                bytes
            }
            Err(backing) => {
                // Someone still maps a frame of it (cannot happen: we unmapped them all);
                // hand back a copy rather than nothing.
                let mut bytes = vec![0u8; registration.length];
                backing.read_at(0, &mut bytes);
                bytes
            }
        }
    }

    fn delay(&self, nanoseconds: u64) {
        self.shared.fabric.advance(Picoseconds::from_nanos(nanoseconds));
    }

    fn poll_interrupts(&self) -> Vec<u16> {
        self.shared.interrupts.take().into_iter().map(|m| m.vector).collect()
    }

    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16> {
        let mut fabric = lock(&self.shared.fabric.fabric);
        let deadline = fabric.now() + Picoseconds::from_nanos(timeout_ns);
        loop {
            let fired = self.poll_interrupts();
            if !fired.is_empty() {
                return fired;
            }
            // Everything on the fabric runs, not only this NIC: its interrupt may wait
            // for a frame from another one.
            match fabric.next_event_time() {
                Some(next) if next <= deadline => fabric.advance_to(next),
                // Nothing due before the deadline (or nothing at all): the wait times out.
                _ => {
                    fabric.advance_to(deadline);
                    return self.poll_interrupts();
                }
            }
        }
    }

    /// One MMIO access's worth of virtual time: what reading an empty CQE costs the CPU
    /// is of that order, and it keeps a spinning poller from stopping the clock.
    fn idle(&self) {
        self.shared.fabric.advance(self.shared.config.mmio_cost);
    }

    fn mac_address(&self) -> Option<[u8; 6]> {
        Some(self.shared.config.device.mac_address)
    }

    /// The fabric's virtual time.
    fn now_ns(&self) -> u64 {
        self.now().0 / 1000
    }
}
