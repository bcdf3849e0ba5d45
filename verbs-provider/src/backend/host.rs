//! The host backend: the device model runs in this process, on the wall clock, with its
//! port on a real network (`rnic-net`: `udp:IP`, `eth:IFACE`), and it reaches the
//! application's own memory in place. This is the device behind the drop-in
//! `libibverbs.so.1`: an unmodified RDMA program on one host talks to a program in another
//! process (or to Linux rxe) over the network, and a remote WRITE lands in the buffer the
//! program registered.
//!
//! * **Time.** Virtual time follows the wall clock from the moment the NIC is made (the
//!   emulator's `realtime` mapping). Whoever touches the NIC first brings the model up to
//!   the wall clock and moves frames between it and the network: an MMIO access of the
//!   driver, a delay, and the **progress thread** each NIC runs. That thread sleeps until
//!   the model's next event is due, the network has a frame or a doorbell makes
//!   something due sooner (`ppoll` on the backend's descriptor and a wake-up eventfd,
//!   with a 1 µs timer slack), so an application that blocks — on a completion channel,
//!   in `poll()`, on a byte of its buffer — still sees its traffic progress. An empty
//!   poll leaves the model to that thread ([`DeviceAccess::idle`]; it steps in only when
//!   nobody has brought the model up to date for 10 µs and the NIC's lock is free), and
//!   one that follows an empty poll of the same CQ with no write to driver memory
//!   between ([`DeviceAccess::driver_memory_writes`]) does not read the CQ either: as on
//!   hardware, a spinning poller takes next to nothing from the NIC.
//! * **Interrupts.** MSI-X messages are recorded; the progress thread calls the handler
//!   set with [`HostNic::set_interrupt_handler`] (the C library's: it processes the event
//!   queues and wakes completion channels) without holding any lock of the NIC. A thread
//!   waiting for an interrupt ([`DeviceAccess::wait_interrupt`]: the connection manager's,
//!   a mailbox command's) sleeps on a condition variable that every message rings, so an
//!   idle process uses no CPU while the progress thread moves its traffic.
//! * **Memory.** The device sees one [`HostMemory`]: the driver's DMA buffers (a
//!   [`PagedMemory`] below [`APPLICATION_BASE`]) and, above it, the application ranges
//!   registered with [`DeviceAccess::register_application_memory`] at
//!   `APPLICATION_BASE + virtual address`. Every device access to application memory is
//!   checked here against the registered ranges and copied with raw byte copies
//!   ([`ApplicationRange`]); nothing else of the process is reachable. Copying the
//!   application's `Vec` ([`DeviceAccess::register_user_memory`]) works too, as on the
//!   embedded backend.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rnic_firmware_if::doorbell::{Doorbell, DoorbellCommand, DB_OFFSET, DB_PAGE_SIZE, DWQE_OFFSET, DWQE_SIZE};
use rnic_firmware_if::regs::DOORBELL_BAR;
use rnic_hw_model::config::DeviceConfig;
use rnic_hw_model::device::Device;
use rnic_hw_model::interrupt::{InterruptSink, MsixMessage, RecordingSink};
use rnic_hw_model::memory::{AccessKind, Backing, HostMemory, MemoryError, PagedMemory, FRAME_SIZE};
use rnic_hw_model::time::Picoseconds;
use rnic_net::{NetBackend, NetSpec, NetStats};

use super::lock;
use crate::device_access::{AccessError, ApplicationRange, DeviceAccess, DmaBuffer, UserMemory, USER_PAGE_SIZE};

/// First bus address of driver DMA buffers.
pub const DMA_BASE: u64 = 0x1_0000_0000;
/// Application memory is seen by the device at `APPLICATION_BASE + virtual address`
/// (user-space addresses are below 2^47 on x86-64 and AArch64 with 48-bit VAs).
pub const APPLICATION_BASE: u64 = 1 << 52;
/// Copied application buffers ([`DeviceAccess::register_user_memory`]) start here.
const COPIED_BASE: u64 = 0x80_0000_0000;
/// Frames moved from the network into the model per pass at most, so a flood cannot hold
/// the NIC (the emulator's server loop takes as many).
const RECEIVE_BATCH: usize = 64;
/// The progress thread's longest sleep with nothing due (it also wakes for the network
/// and for doorbells).
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// An empty poll brings the model up to date itself only when nobody has for this long:
/// the progress thread, woken by a frame, may wait for a CPU behind the spinning poller
/// on a loaded host, and a poller that only looked would then wait for it (in one loaded
/// run, `ibv_rc_pingpong`'s 8-byte round trip went from 1.8 to 9.8 ms that way).
const PROGRESS_STALE_AFTER: Duration = Duration::from_micros(10);

/// Configuration of a [`HostNic`].
#[derive(Debug, Clone)]
pub struct HostNicConfig {
    /// The device model's configuration (identity, caps, MAC, timing).
    pub device: DeviceConfig,
    /// The network the port is on.
    pub net: NetSpec,
}

/// The registered application ranges, by bus address.
#[derive(Default)]
struct ApplicationMap {
    /// (bus address of the first byte, token) → range. Registrations may overlap (two
    /// regions over one buffer), so a lookup walks back from the access's address.
    ranges: BTreeMap<(u64, u64), Arc<ApplicationRange>>,
}

impl ApplicationMap {
    fn find(&self, address: u64, length: usize) -> Option<(&ApplicationRange, usize)> {
        let end = address.checked_add(length as u64)?;
        self.ranges
            .range(..=(address, u64::MAX))
            .rev()
            .find(|((start, _), range)| end <= start + range.len() as u64)
            .map(|((start, _), range)| (&**range, (address - start) as usize))
    }
}

/// What the device sees as host memory: the driver's DMA buffers below
/// [`APPLICATION_BASE`], the application's registered ranges above it.
struct HostMemoryMap {
    dma: PagedMemory,
    application: RwLock<ApplicationMap>,
    /// Writes to `dma` so far ([`DeviceAccess::driver_memory_writes`]), raised after each.
    dma_writes: AtomicU64,
}

impl HostMemoryMap {
    fn application_access(
        &self,
        kind: AccessKind,
        address: u64,
        length: usize,
        copy: impl FnOnce(&ApplicationRange, usize) -> bool,
    ) -> Result<(), MemoryError> {
        let map = self.application.read().unwrap_or_else(|e| e.into_inner());
        match map.find(address, length) {
            Some((range, offset)) if copy(range, offset) => Ok(()),
            _ => Err(MemoryError::Unmapped {
                kind,
                address,
                length,
                unmapped: address,
            }),
        }
    }
}

impl HostMemory for HostMemoryMap {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        if address >= APPLICATION_BASE {
            let length = buffer.len();
            return self.application_access(AccessKind::Read, address, length, |range, offset| {
                range.read_at(offset, buffer)
            });
        }
        self.dma.read(address, buffer)
    }

    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        if address >= APPLICATION_BASE {
            return self.application_access(AccessKind::Write, address, data.len(), |range, offset| {
                range.write_at(offset, data)
            });
        }
        let result = self.dma.write(address, data);
        // After the bytes are in: a reader that sees the new count sees them.
        self.dma_writes.fetch_add(1, Ordering::Release);
        result
    }
}

/// The model and its network: everything the progress thread and the driver's accesses
/// share under one lock.
struct Engine {
    device: Device,
    net: Box<dyn NetBackend>,
    /// Wall instant at which virtual time was zero.
    epoch: Instant,
    /// When the model was last brought up to date, in wall nanoseconds since `epoch`;
    /// read without the lock by empty polls.
    pumped_at_ns: Arc<AtomicU64>,
    frame: Vec<u8>,
    addresses: Vec<IpAddr>,
    passes: u64,
    /// Posted doorbells being applied (kept for its allocation).
    doorbells: Vec<PostedDoorbell>,
}

/// An SQ doorbell or direct-WQE store (`DeviceAccess::mmio_write64`) the driver made
/// while the progress thread was awake or the NIC busy: applied on the NIC's next pass,
/// in the order made, as a NIC takes a posted PCIe write without the CPU waiting for it.
#[derive(Debug, Clone, Copy)]
struct PostedDoorbell {
    bar: u8,
    offset: u64,
    value: u64,
}

impl Engine {
    fn wall_now(&self) -> Picoseconds {
        Picoseconds(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX / 1000) * 1000)
    }

    /// Brings the model up to the wall clock and moves frames both ways until the network
    /// has nothing more for now.
    fn pump(&mut self) {
        let target = self.wall_now();
        self.pumped_at_ns.store(target.0 / 1000, Ordering::Relaxed);
        if target > self.device.now() {
            self.device.advance_to(target);
        }
        if self.net.wants_local_addresses() && self.passes & 63 == 0 {
            gid_addresses(&self.device, &mut self.addresses);
            self.net.set_local_addresses(&self.addresses);
        }
        self.passes = self.passes.wrapping_add(1);
        loop {
            self.transmit();
            let mut received = 0;
            while received < RECEIVE_BATCH && self.net.receive(&mut self.frame) {
                // The device keeps the buffer (no copy) and gives one back.
                let frame = std::mem::take(&mut self.frame);
                self.frame = self.device.receive_frame_owned(frame);
                received += 1;
            }
            if received == 0 {
                break;
            }
        }
    }

    /// Hands the device's frames to the backend, buffer and all, their ICRC left to it
    /// (`udp:` computes it once, for the headers it sends with), and sends them together.
    fn transmit(&mut self) {
        while let Some((frame, icrc)) = self.device.poll_transmit_offloaded() {
            let spare = self.net.send_owned(frame, icrc);
            self.device.recycle_frame(spare);
        }
        self.net.flush();
    }

    /// How long until the model's next event is due on the wall clock (`None`: nothing
    /// pending).
    fn until_next_event(&self) -> Option<Duration> {
        let next = self.device.next_event_time()?;
        let now = self.wall_now();
        Some(Duration::from_nanos(next.0.saturating_sub(now.0) / 1000))
    }
}

/// The device's IP addresses from its GID table (IPv4-mapped GIDs as IPv4).
fn gid_addresses(device: &Device, out: &mut Vec<IpAddr>) {
    rnic_net::gid_addresses(device, out);
}

/// Driver DMA and copied-buffer bookkeeping.
#[derive(Default)]
struct AddressSpace {
    next_dma: u64,
    next_copied: u64,
    next_token: u64,
    allocations: HashMap<u64, (u64, u64)>,
    copied: HashMap<u64, (Vec<u64>, usize, Arc<Backing>)>,
    application: HashMap<u64, (u64, Arc<ApplicationRange>)>,
}

type InterruptHandler = Arc<dyn Fn() + Send + Sync>;

/// Records MSI-X messages for the driver ([`DeviceAccess::poll_interrupts`]) and, apart
/// from that queue, tells the progress thread to run the interrupt handler: whoever takes
/// the messages (a driver waiting for its mailbox takes every vector), the handler still
/// runs and processes every event queue.
struct NotifyingSink {
    messages: RecordingSink,
    pending: Arc<AtomicBool>,
    wake: Arc<std::fs::File>,
    bell: Arc<InterruptBell>,
}

/// Counts MSI-X messages and wakes the threads in [`DeviceAccess::wait_interrupt`].
/// Whoever takes the messages (the progress thread's handler takes every vector), a
/// waiter still learns that one fired and looks at what it waits for.
#[derive(Default)]
struct InterruptBell {
    rung: Mutex<u64>,
    ringing: Condvar,
}

impl InterruptBell {
    fn ring(&self) {
        *lock(&self.rung) += 1;
        self.ringing.notify_all();
    }

    fn count(&self) -> u64 {
        *lock(&self.rung)
    }

    /// Sleeps until the count differs from `seen` or `deadline` passes.
    fn wait_past(&self, seen: u64, deadline: Instant) {
        let mut rung = lock(&self.rung);
        while *rung == seen {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            rung = match self.ringing.wait_timeout(rung, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

impl InterruptSink for NotifyingSink {
    fn deliver(&mut self, message: MsixMessage) {
        self.messages.deliver(message);
        self.bell.ring();
        if !self.pending.swap(true, Ordering::AcqRel) {
            use std::io::Write;
            // A full eventfd counter means a wake-up is pending anyway.
            let _ = (&*self.wake).write_all(&1u64.to_ne_bytes());
        }
    }
}

struct Shared {
    config: HostNicConfig,
    engine: Mutex<Engine>,
    memory: Arc<HostMemoryMap>,
    space: Mutex<AddressSpace>,
    interrupts: RecordingSink,
    handler: Mutex<Option<InterruptHandler>>,
    /// Set by the sink when a message arrives; the progress thread runs the handler.
    interrupted: Arc<AtomicBool>,
    /// Rung by the sink for every message: wakes [`DeviceAccess::wait_interrupt`].
    bell: Arc<InterruptBell>,
    /// Wakes the progress thread (doorbells, interrupts, shutdown): an eventfd.
    wake: Arc<std::fs::File>,
    /// Wall time (ns since the epoch) until which the progress thread sleeps;
    /// `u64::MAX` while it runs. A doorbell that makes something due earlier wakes it.
    sleeping_until: AtomicU64,
    stop: AtomicBool,
    net_description: String,
    /// The network has a descriptor the progress thread waits on, so a frame wakes it; a
    /// network without one is also pumped by empty polls ([`DeviceAccess::idle`]).
    network_wakes_progress: bool,
    /// The engine's `epoch`, for reading the wall clock without its lock.
    epoch: Instant,
    /// The engine's `pumped_at_ns`.
    pumped_at_ns: Arc<AtomicU64>,
    /// Doorbells rung while the progress thread was awake or the NIC busy, oldest first.
    posted: Mutex<Vec<PostedDoorbell>>,
    /// Whether `posted` may hold doorbells: set after a push, cleared by whoever takes
    /// them. Sequentially consistent with `sleeping_until`, so a doorbell posted as the
    /// progress thread goes to sleep is seen by one side or the other (see `progress`).
    posted_pending: AtomicBool,
}

impl Shared {
    fn engine(&self) -> MutexGuard<'_, Engine> {
        lock(&self.engine)
    }

    /// Runs `f` on the model after bringing it up to date, then sends what it produced
    /// and wakes the progress thread if the model now has something due before it would
    /// have woken.
    fn access<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        self.access_locked(self.engine(), f)
    }

    /// [`Shared::access`] with the NIC already held.
    fn access_locked<R>(&self, mut engine: MutexGuard<'_, Engine>, f: impl FnOnce(&mut Device) -> R) -> R {
        self.pump_locked(&mut engine);
        let result = f(&mut engine.device);
        engine.transmit();
        let next = engine.device.next_event_time();
        drop(engine);
        self.kick_if_sooner(next);
        result
    }

    /// The NIC if nobody holds it.
    fn try_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(engine) => Some(engine),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Brings the model up to date from a driver thread (an empty poll, a delay): frames
    /// it takes from the network no longer wake the progress thread, so wake it when the
    /// model now has something due before it would have woken.
    fn pump(&self) {
        let mut engine = self.engine();
        self.pump_locked(&mut engine);
        let next = engine.device.next_event_time();
        drop(engine);
        self.kick_if_sooner(next);
    }

    /// An empty poll's share of the work: bring the model up to date only if nobody has
    /// for [`PROGRESS_STALE_AFTER`] (the progress thread is not getting a CPU) and the NIC
    /// is free; never wait for the progress thread.
    fn pump_if_stale(&self) {
        let now_ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let pumped_at_ns = self.pumped_at_ns.load(Ordering::Relaxed);
        // A doorbell the progress thread has not taken yet (it may be waiting for a CPU
        // behind this poller) is not left to wait for staleness.
        if now_ns.saturating_sub(pumped_at_ns) < PROGRESS_STALE_AFTER.as_nanos() as u64
            && !self.posted_pending.load(Ordering::Relaxed)
        {
            return;
        }
        let Some(mut engine) = self.try_engine() else {
            return;
        };
        self.pump_locked(&mut engine);
        let next = engine.device.next_event_time();
        drop(engine);
        self.kick_if_sooner(next);
    }

    /// Brings the model up to date (the caller holds the NIC), then applies the doorbells
    /// posted meanwhile, in order; what they make due runs on the next pass, as a
    /// doorbell applied on the caller does.
    fn pump_locked(&self, engine: &mut Engine) {
        engine.pump();
        // A plain load first: every pass comes here, a posted doorbell rarely.
        if !self.posted_pending.load(Ordering::SeqCst) || !self.posted_pending.swap(false, Ordering::SeqCst) {
            return;
        }
        std::mem::swap(&mut engine.doorbells, &mut *lock(&self.posted));
        for doorbell in engine.doorbells.drain(..) {
            engine
                .device
                .bar_write(doorbell.bar, doorbell.offset, &doorbell.value.to_le_bytes());
        }
    }

    /// A 64-bit store to the device. On hardware the CPU posts an SQ doorbell and goes on.
    /// Applying it here means taking the NIC's lock and doing the NIC's work, system calls
    /// included, so the application's thread does that only when the progress thread
    /// sleeps and the NIC is free (the shortest way for a lone doorbell, as in a
    /// ping-pong). Otherwise it posts the doorbell for the NIC's next pass (the progress
    /// thread's, or an empty poll's) and wakes the progress thread if it sleeps: it never
    /// waits for the lock, and a stream of doorbells is taken in batches
    /// (docs/benchmarks.md, "Posted doorbells"). Stores that must take effect at once
    /// ([`may_be_posted`]) are applied as before.
    fn ring_doorbell(&self, bar: u8, offset: u64, value: u64) {
        let bytes = value.to_le_bytes();
        if !may_be_posted(bar, offset, value) {
            self.access(|device| device.bar_write(bar, offset, &bytes));
            return;
        }
        if self.sleeping_until.load(Ordering::SeqCst) != u64::MAX || self.stop.load(Ordering::Acquire) {
            if let Some(engine) = self.try_engine() {
                self.access_locked(engine, |device| device.bar_write(bar, offset, &bytes));
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                // No progress thread to take a posted doorbell: wait for the NIC.
                self.access(|device| device.bar_write(bar, offset, &bytes));
                return;
            }
        }
        lock(&self.posted).push(PostedDoorbell { bar, offset, value });
        self.posted_pending.store(true, Ordering::SeqCst);
        // The progress thread publishes its deadline, then looks for posted doorbells
        // (both sequentially consistent): it has seen this one, or this sees it asleep.
        if self.sleeping_until.load(Ordering::SeqCst) != u64::MAX {
            self.kick();
        }
    }

    fn kick_if_sooner(&self, next: Option<Picoseconds>) {
        if let Some(next) = next {
            if next.0 / 1000 < self.sleeping_until.load(Ordering::Acquire) {
                self.kick();
            }
        }
    }

    fn kick(&self) {
        use std::io::Write;
        // An eventfd write only fails when the counter would overflow, which a pending
        // wake-up makes irrelevant.
        let _ = (&*self.wake).write_all(&1u64.to_ne_bytes());
    }

    fn fire_handler_if_interrupted(&self) {
        if !self.interrupted.swap(false, Ordering::AcqRel) {
            return;
        }
        let handler = lock(&self.handler).clone();
        if let Some(handler) = handler {
            handler();
        }
    }
}

/// Stops the progress thread when the last handle goes.
struct Stopper {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Stopper {
    fn drop(&mut self) {
        {
            let engine = self.shared.engine();
            tracing::info!(
                net = ?engine.net.stats(),
                transport = ?engine.device.transport_counters(),
                "host NIC closed"
            );
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.kick();
        if let Some(thread) = lock(&self.thread).take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// One NIC in this process on the wall clock, with its port on a network. Clones share
/// the NIC; the progress thread stops when the last clone goes.
#[derive(Clone)]
pub struct HostNic {
    shared: Arc<Shared>,
    _stopper: Arc<Stopper>,
}

impl std::fmt::Debug for HostNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostNic")
            .field("mac", &self.shared.config.device.mac_address)
            .field("net", &self.shared.net_description)
            .finish_non_exhaustive()
    }
}

impl HostNic {
    /// Makes the NIC, opens its network backend and starts its progress thread.
    ///
    /// # Errors
    /// What opening the network backend failed with (address in use, no such interface,
    /// no CAP_NET_RAW), as an [`AccessError::InvalidRequest`] naming the backend.
    pub fn open(config: HostNicConfig) -> Result<Self, AccessError> {
        let mut net =
            rnic_net::open(&config.net, config.device.mac_address).map_err(|e| AccessError::InvalidRequest {
                reason: format!("network {}: {e}", config.net),
            })?;
        // Each pump's frames go out together (`Engine::transmit` flushes): on `udp:` one
        // system call per burst, a multi-packet message's datagrams cut by the kernel.
        net.set_send_batching(true);
        let net_description = net.describe();
        let network_wakes_progress = net.pollable_fd().is_some();
        let epoch = Instant::now();
        let pumped_at_ns = Arc::new(AtomicU64::new(0));
        let memory = Arc::new(HostMemoryMap {
            dma: PagedMemory::new(),
            application: RwLock::new(ApplicationMap::default()),
            dma_writes: AtomicU64::new(0),
        });
        let interrupts = RecordingSink::new();
        let wake = Arc::new(std::fs::File::from(rnic_os::eventfd().map_err(|e| {
            AccessError::InvalidRequest {
                reason: format!("eventfd: {e}"),
            }
        })?));
        let interrupted = Arc::new(AtomicBool::new(false));
        let bell = Arc::new(InterruptBell::default());
        let device = Device::new(
            config.device.clone(),
            memory.clone() as Arc<dyn HostMemory>,
            Box::new(NotifyingSink {
                messages: interrupts.clone(),
                pending: interrupted.clone(),
                wake: wake.clone(),
                bell: bell.clone(),
            }),
        );
        let shared = Arc::new(Shared {
            config,
            engine: Mutex::new(Engine {
                device,
                net,
                epoch,
                pumped_at_ns: pumped_at_ns.clone(),
                frame: Vec::with_capacity(9216),
                addresses: Vec::new(),
                passes: 0,
                doorbells: Vec::new(),
            }),
            memory,
            space: Mutex::new(AddressSpace {
                next_dma: DMA_BASE,
                next_copied: COPIED_BASE,
                ..AddressSpace::default()
            }),
            interrupts,
            handler: Mutex::new(None),
            interrupted,
            bell,
            wake,
            sleeping_until: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            net_description,
            network_wakes_progress,
            epoch,
            pumped_at_ns,
            posted: Mutex::new(Vec::new()),
            posted_pending: AtomicBool::new(false),
        });
        let thread = {
            let shared = shared.clone();
            // Signals blocked: the application's process-directed signals are its own.
            rnic_os::spawn_with_signals_blocked(std::thread::Builder::new().name("rnic-progress".into()), move || {
                progress(&shared)
            })
            .map_err(|e| AccessError::InvalidRequest {
                reason: format!("cannot start the progress thread: {e}"),
            })?
        };
        let stopper = Arc::new(Stopper {
            shared: shared.clone(),
            thread: Mutex::new(Some(thread)),
        });
        Ok(Self {
            shared,
            _stopper: stopper,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HostNicConfig {
        &self.shared.config
    }

    /// Sets the function the progress thread calls when MSI-X messages are waiting
    /// (replacing any earlier one). It runs on the progress thread with no lock of the NIC
    /// held, so it may call into the driver.
    pub fn set_interrupt_handler(&self, handler: impl Fn() + Send + Sync + 'static) {
        *lock(&self.shared.handler) = Some(Arc::new(handler));
    }

    /// The network backend's counters.
    pub fn net_stats(&self) -> NetStats {
        self.shared.engine().net.stats()
    }

    /// The network backend, as `udp:127.0.0.1:4791`.
    pub fn net_description(&self) -> &str {
        &self.shared.net_description
    }

    /// Runs `f` on the model, for inspection (counters, diagnostics).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        f(&mut self.shared.engine().device)
    }

    /// Application ranges currently registered.
    pub fn application_ranges(&self) -> usize {
        lock(&self.shared.space).application.len()
    }
}

/// The progress thread: pumps the model and the network, sleeps until something is due.
fn progress(shared: &Shared) {
    rnic_os::set_thread_timer_slack(Duration::from_micros(1));
    let wake = &*shared.wake;
    // A duplicate of the backend's descriptor (same socket, same readiness), so the wait
    // holds no lock.
    let net_fd: Option<OwnedFd> = shared
        .engine()
        .net
        .pollable_fd()
        .and_then(|fd| fd.try_clone_to_owned().ok());
    while !shared.stop.load(Ordering::Acquire) {
        {
            let mut engine = shared.engine();
            shared.pump_locked(&mut engine);
        }
        shared.fire_handler_if_interrupted();
        let wait = {
            let engine = shared.engine();
            let wait = engine.until_next_event().unwrap_or(IDLE_WAIT).min(IDLE_WAIT);
            if !wait.is_zero() {
                // Published under the lock: a doorbell rung before this is in the wait
                // just computed, one rung after it sees the deadline and wakes the thread
                // if it makes something due sooner (nothing else pumps for it: empty
                // polls leave the model to this thread).
                let deadline_ns = engine.wall_now().0 / 1000 + wait.as_nanos() as u64;
                shared.sleeping_until.store(deadline_ns, Ordering::SeqCst);
                // A doorbell posted before the deadline was visible is taken now rather
                // than after the sleep (`Shared::ring_doorbell`).
                if shared.posted_pending.load(Ordering::SeqCst) {
                    shared.sleeping_until.store(u64::MAX, Ordering::SeqCst);
                    Duration::ZERO
                } else {
                    wait
                }
            } else {
                wait
            }
        };
        if wait.is_zero() {
            continue;
        }
        let mut fds = vec![wake.as_fd()];
        if let Some(fd) = net_fd.as_ref() {
            fds.push(fd.as_fd());
        }
        if let Err(e) = rnic_os::wait_readable(&fds, wait) {
            tracing::debug!(%e, "progress thread wait");
        }
        shared.sleeping_until.store(u64::MAX, Ordering::SeqCst);
        rnic_os::take_eventfd(wake);
    }
}

/// Whether a 64-bit store may wait for the NIC's next pass: an SQ doorbell or a store
/// into a direct-WQE window, which only say "there is work to send". Every other store
/// is applied before the call returns: an RQ or SRQ doorbell must make its receives ready
/// before the application tells a peer over its own channel to send (a posted one could
/// lose that race and draw RNR NAKs), and CQ and EQ doorbells carry consumer indices the
/// NIC's overflow checks read.
fn may_be_posted(bar: u8, offset: u64, value: u64) -> bool {
    if bar != DOORBELL_BAR {
        return false;
    }
    let in_page = offset % DB_PAGE_SIZE;
    (DWQE_OFFSET..DWQE_OFFSET + DWQE_SIZE).contains(&in_page)
        || (in_page == DB_OFFSET && Doorbell::from_u64(value).command() == DoorbellCommand::Sq as u8)
}

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

impl DeviceAccess for HostNic {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.shared
            .access(|device| device.config_read(usize::from(offset), data));
    }

    fn config_write(&self, offset: u16, data: &[u8]) {
        self.shared
            .access(|device| device.config_write(usize::from(offset), data));
    }

    fn mmio_read32(&self, bar: u8, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.shared.access(|device| device.bar_read(bar, offset, &mut b));
        u32::from_le_bytes(b)
    }

    fn mmio_write32(&self, bar: u8, offset: u64, value: u32) {
        self.shared
            .access(|device| device.bar_write(bar, offset, &value.to_le_bytes()));
    }

    fn mmio_write64(&self, bar: u8, offset: u64, value: u64) {
        self.shared.ring_doorbell(bar, offset, value);
    }

    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError> {
        if size == 0 || !align.is_power_of_two() {
            return Err(AccessError::InvalidRequest {
                reason: format!("a DMA buffer of {size} bytes aligned to {align}"),
            });
        }
        let align = (align as u64).max(FRAME_SIZE);
        let frames = (size as u64).div_ceil(FRAME_SIZE);
        let mut space = lock(&self.shared.space);
        let address = align_up(space.next_dma, align);
        let end = address
            .checked_add(frames * FRAME_SIZE)
            .filter(|end| *end <= COPIED_BASE)
            .ok_or(AccessError::OutOfMemory {
                size,
                align: align as usize,
            })?;
        space.next_dma = end;
        let backing = Backing::zeroed((frames * FRAME_SIZE) as usize);
        self.shared
            .memory
            .dma
            .map_contiguous(address, &backing, 0, frames as usize, true);
        space.next_token += 1;
        let token = space.next_token;
        space.allocations.insert(token, (address, frames));
        Ok(DmaBuffer::new(address, size, token))
    }

    fn free_dma(&self, buffer: DmaBuffer) {
        match lock(&self.shared.space).allocations.remove(&buffer.token()) {
            Some((address, frames)) => {
                for frame in 0..frames {
                    self.shared.memory.dma.unmap_frame(address + frame * FRAME_SIZE);
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
        let pages = (length as u64).div_ceil(FRAME_SIZE);
        let backing = Backing::from_vec(bytes);
        let mut space = lock(&self.shared.space);
        let base = align_up(space.next_copied, 2 << 20);
        let end = base + pages * FRAME_SIZE;
        if end > APPLICATION_BASE {
            return Err(AccessError::OutOfMemory {
                size: length,
                align: USER_PAGE_SIZE,
            });
        }
        space.next_copied = end;
        let frames: Vec<u64> = (0..pages).map(|i| base + i * FRAME_SIZE).collect();
        self.shared
            .memory
            .dma
            .map_contiguous(base, &backing, 0, pages as usize, true);
        space.next_token += 1;
        let token = space.next_token;
        space.copied.insert(token, (frames.clone(), length, backing));
        Ok(UserMemory::new(frames, length, token))
    }

    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8> {
        let Some((frames, length, backing)) = lock(&self.shared.space).copied.remove(&memory.token()) else {
            tracing::error!(?memory, "unregister of an unknown application buffer");
            return Vec::new();
        };
        for address in &frames {
            self.shared.memory.dma.unmap_frame(*address);
        }
        let mut bytes = vec![0u8; length];
        backing.read_at(0, &mut bytes);
        bytes
    }

    fn register_application_memory(&self, range: Arc<ApplicationRange>) -> Result<UserMemory, AccessError> {
        let address = range.address() as u64;
        let length = range.len();
        let first_page = address & !(USER_PAGE_SIZE as u64 - 1);
        let end = address + length as u64;
        let page_count = (end - first_page).div_ceil(USER_PAGE_SIZE as u64);
        let bus = APPLICATION_BASE
            .checked_add(address)
            .filter(|b| b.checked_add(length as u64).is_some())
            .ok_or_else(|| AccessError::InvalidRequest {
                reason: format!("application address {address:#x} is beyond the device's reach"),
            })?;
        let pages = (0..page_count)
            .map(|i| APPLICATION_BASE + first_page + i * USER_PAGE_SIZE as u64)
            .collect();
        let mut space = lock(&self.shared.space);
        space.next_token += 1;
        let token = space.next_token;
        space.application.insert(token, (bus, range.clone()));
        self.shared
            .memory
            .application
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .ranges
            .insert((bus, token), range);
        Ok(UserMemory::new(pages, length, token))
    }

    fn unregister_application_memory(&self, memory: UserMemory) {
        let Some((bus, _range)) = lock(&self.shared.space).application.remove(&memory.token()) else {
            tracing::error!(?memory, "unregister of unknown application memory");
            return;
        };
        self.shared
            .memory
            .application
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .ranges
            .remove(&(bus, memory.token()));
    }

    fn delay(&self, nanoseconds: u64) {
        super::wall_clock_delay(nanoseconds);
        self.shared.pump();
    }

    fn poll_interrupts(&self) -> Vec<u16> {
        self.shared.interrupts.take().into_iter().map(|m| m.vector).collect()
    }

    /// Sleeps until an MSI-X message fires or the timeout passes; the progress thread
    /// moves the model meanwhile. When the progress thread's handler took the message
    /// first, this returns early with no vectors: the caller looks for its work again.
    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16> {
        let deadline = Instant::now() + Duration::from_nanos(timeout_ns);
        let seen = self.shared.bell.count();
        self.shared.pump();
        let fired = self.poll_interrupts();
        if !fired.is_empty() {
            return fired;
        }
        self.shared.bell.wait_past(seen, deadline);
        self.poll_interrupts()
    }

    /// An empty poll leaves the model to the progress thread, which wakes by itself for
    /// everything that moves it (a frame on the network's descriptor, a doorbell that
    /// makes something due, the model's next event): on hardware a spinning poller costs
    /// the NIC nothing, and here pumping from every poll took the NIC's lock and the CPU
    /// from that thread. Only when the model has not been brought up to date for
    /// `PROGRESS_STALE_AFTER` (10 µs: the progress thread is waiting for a CPU the poller
    /// holds) and its lock is free does the poller do it. A network without a descriptor
    /// is pumped from every empty poll.
    fn idle(&self) {
        if self.shared.network_wakes_progress {
            self.shared.pump_if_stale();
        } else {
            self.shared.pump();
        }
    }

    fn driver_memory_writes(&self) -> Option<u64> {
        Some(self.shared.memory.dma_writes.load(Ordering::Acquire))
    }

    fn mac_address(&self) -> Option<[u8; 6]> {
        Some(self.shared.config.device.mac_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`).
    fn thread_cpu_ns() -> u64 {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        text.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .expect("run time")
    }

    /// The connection manager's thread waits here between MADs for the life of the
    /// process: with nothing happening it must sleep, not spin (a spinning waiter in each
    /// process starves the progress threads of a small host, and a peer then misses its
    /// receives: RNR NAKs where the application did nothing wrong).
    #[test]
    fn waiting_for_an_interrupt_sleeps_until_the_timeout() {
        let nic = HostNic::open(HostNicConfig {
            device: DeviceConfig::default(),
            net: NetSpec::None,
        })
        .expect("a NIC without a network");
        let started = Instant::now();
        let cpu_before = thread_cpu_ns();
        let fired = nic.wait_interrupt(300_000_000);
        let cpu = thread_cpu_ns() - cpu_before;
        assert!(fired.is_empty(), "no interrupt source exists: {fired:?}");
        assert!(started.elapsed() >= Duration::from_millis(300), "returned early");
        assert!(cpu < 30_000_000, "the wait ran on the CPU for {cpu} ns of 300 ms");
    }

    /// A NIC on UDP loopback at 127.0.9.`host` (MAC 02:52:4e:00:09:`host`), brought up.
    fn open_on_loopback(host: u8) -> (HostNic, crate::verbs::Context) {
        let mac = [0x02, 0x52, 0x4e, 0x00, 0x09, host];
        let nic = HostNic::open(HostNicConfig {
            device: DeviceConfig::with_mac(mac),
            net: NetSpec::Udp([127, 0, 9, host].into()),
        })
        .expect("a NIC on UDP loopback");
        let driver = crate::driver::DriverConfig {
            mac_address: Some(mac),
            ipv4_address: Some([127, 0, 9, host]),
            link_local_gid_first: true,
            ..crate::driver::DriverConfig::default()
        };
        let context = crate::verbs::Context::open_with_config(Box::new(nic.clone()), &driver).expect("bring-up");
        (nic, context)
    }

    /// On hardware an application spinning on `ibv_poll_cq` costs the NIC nothing. Here the
    /// NIC is this process's progress thread, so an empty poll must not take the model's
    /// lock (nor ask the network for frames): polls from another thread return while the
    /// lock is held.
    #[test]
    fn an_empty_poll_does_not_wait_for_the_nic() {
        let (nic, context) = open_on_loopback(41);
        let cq = context.create_cq(64, None, 0).expect("a CQ");
        let (done, polled) = std::sync::mpsc::channel();
        // Not scoped: if a poll blocked, the failed wait below releases the lock as it
        // unwinds instead of waiting for the poller forever.
        let poller = nic.with_device(|_| {
            let poller = std::thread::spawn(move || {
                let mut completions = [crate::verbs::WorkCompletion::default(); 4];
                let found: usize = (0..1000).map(|_| cq.poll(&mut completions).expect("poll")).sum();
                done.send(found).expect("the test waits");
                cq
            });
            let found = polled
                .recv_timeout(Duration::from_secs(10))
                .expect("1000 empty polls returned while the NIC's lock was held");
            assert_eq!(found, 0, "nothing was posted");
            poller
        });
        let cq = poller.join().expect("the poller");
        cq.destroy().expect("destroy the CQ");
    }

    /// Only stores that merely announce work to send wait for the NIC's next pass; receive,
    /// CQ and EQ doorbells, and anything outside the doorbell BAR, take effect at once.
    #[test]
    fn only_sq_doorbells_and_direct_wqe_stores_may_be_posted() {
        use rnic_firmware_if::doorbell::{CqDoorbell, EQ_DB_OFFSET};
        let page = 3 * DB_PAGE_SIZE;
        let (bar, db, dwqe) = (DOORBELL_BAR, page + DB_OFFSET, page + DWQE_OFFSET);
        let sq = Doorbell::sq(0x12, 7, 0).as_u64();
        let rq = Doorbell::rq(0x12, 7).as_u64();
        let srq = Doorbell::srq(0x12, 7).as_u64();
        let set_ci = CqDoorbell::update(5, 9).as_u64();
        let arm = CqDoorbell::arm(5, 9, 1, false).as_u64();
        let cases = [
            ("SQ doorbell", bar, db, sq, true),
            ("first direct-WQE store", bar, dwqe, 0xdead_beef, true),
            ("last direct-WQE store", bar, dwqe + DWQE_SIZE - 8, 0, true),
            ("past the direct-WQE window", bar, dwqe + DWQE_SIZE, 0, false),
            ("RQ doorbell", bar, db, rq, false),
            ("SRQ doorbell", bar, db, srq, false),
            ("CQ set-CI", bar, db, set_ci, false),
            ("CQ arm", bar, db, arm, false),
            ("EQ doorbell register", bar, page + EQ_DB_OFFSET, sq, false),
            ("another BAR", 0, db, sq, false),
        ];
        for (name, bar, offset, value, posted) in cases {
            assert_eq!(may_be_posted(bar, offset, value), posted, "{name}");
        }
    }

    /// On hardware a doorbell is a posted write: the CPU goes on at once and the NIC takes
    /// it when it can. A doorbell rung while the NIC is busy (its lock held, as by the
    /// progress thread in mid-pass) returns at once, and the NIC carries out the work
    /// request on its next pass.
    #[test]
    fn a_doorbell_rung_while_the_nic_is_busy_is_posted_and_taken_on_the_next_pass() {
        use crate::verbs::{
            AccessFlags, AhAttributes, Mtu, QpCapabilities, QpInitAttributes, QpType, RcConnection, RdmaFields,
            SendFlags, SendWorkRequest, Sge, WcStatus, WorkCompletion, WrOpcode,
        };
        let (nic, mac, context) = {
            let (nic, context) = open_on_loopback(42);
            let mac = context.mac_address();
            (nic, mac, context)
        };
        let pd = context.alloc_pd().expect("a PD");
        let mr = pd
            .register_provider_memory(8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("an MR");
        let cq = context.create_cq(16, None, 0).expect("a CQ");
        let qp = pd
            .create_qp(&QpInitAttributes {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCapabilities {
                    max_send_wr: 8,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: true,
            })
            .expect("an RC QP");
        // Connected to itself: the WRITE loops back inside the NIC.
        qp.connect_rc(&RcConnection {
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: qp.qp_num(),
            rq_psn: 0,
            sq_psn: 0,
            ah_attr: AhAttributes {
                dgid: context.query_gid(1, 0).expect("GID 0"),
                sgid_index: 0,
                hop_limit: 64,
                dmac: mac,
                ..AhAttributes::default()
            },
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        })
        .expect("RTS");
        mr.write(0, &[0xa5; 64]).expect("the source bytes");
        let (local, remote) = (
            Sge::new(mr.addr(), 64, mr.lkey()),
            RdmaFields {
                remote_addr: mr.addr() + 4096,
                rkey: mr.rkey(),
            },
        );
        let (rang, returned) = std::sync::mpsc::channel();
        // Not scoped, as above: a doorbell that blocked must not hold the test forever.
        let poster = nic.with_device(|_| {
            let poster = std::thread::spawn(move || {
                let request = SendWorkRequest {
                    wr_id: 7,
                    opcode: WrOpcode::RdmaWrite,
                    sg_list: std::slice::from_ref(&local),
                    send_flags: SendFlags::SIGNALED,
                    rdma: remote,
                    ..SendWorkRequest::default()
                };
                qp.post_send(&[request]).expect("post the WRITE");
                rang.send(()).expect("the test waits");
                qp
            });
            returned
                .recv_timeout(Duration::from_secs(10))
                .expect("the doorbell returned while the NIC's lock was held");
            poster
        });
        let qp = poster.join().expect("the poster");
        let mut completions = [WorkCompletion::default(); 1];
        let deadline = Instant::now() + Duration::from_secs(10);
        while cq.poll(&mut completions).expect("poll") == 0 {
            assert!(Instant::now() < deadline, "the posted doorbell was never taken");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((completions[0].wr_id, completions[0].status), (7, WcStatus::Success));
        let mut written = [0u8; 64];
        mr.read(4096, &mut written).expect("the destination bytes");
        assert_eq!(written, [0xa5; 64], "the WRITE landed");
        drop(qp);
    }
}
