//! The vfio-user server: one thread that owns the device and runs, in a loop,
//!
//! 1. a wait (`ppoll`) on the listening socket and the client socket, as long as the
//!    [`PollGovernor`] and the device's next event allow (zero while spinning);
//! 2. the frames the network backend received (at most [`FRAMES_PER_PASS`]), given to
//!    the device at its time of the last pass, before anything moves its clock: a frame
//!    that waited in the socket while the scheduler kept the loop away (an ACK) is not
//!    overtaken by a timer that expired meanwhile (the ACK timeout);
//! 3. the client's complete messages, in arrival order (at most
//!    [`MESSAGES_PER_PASS`] per pass, so doorbells and time keep moving under a flood);
//! 4. one doorbell poll pass over the shared doorbell pages;
//! 5. the device's due events ([`Clock::sync`]) and its transmitted frames, which go to
//!    the backend ([`crate::net`]; dropped with `--net none`). `--pcap` records both
//!    directions as the device saw them.
//!
//! One client at a time; a second connection is accepted and closed at once. When the
//! client goes away (close, crash, kill -9), its DMA maps and eventfds are dropped and
//! the device keeps its state for the next client.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use rnic_diag::{KindCount, Limiter, Policy};
use rnic_firmware_if::pci::{offset as pci_offset, COMMAND_MEMORY_SPACE};
use rnic_firmware_if::regs;
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::transport::TransportCounters;
use rnic_hw_model::wire::{self, Icrc};

use super::wire_totals::TransportTotals;
use rnic_hw_model::{Counters, Device, DeviceConfig, HostMemory};

use super::connection::{configure_client_socket, send_message, Message, MessageReader, ReadOutcome};
use super::dma::DmaSpace;
use super::doorbell::{DoorbellPages, PollGovernor};
use super::irq::{self, EventfdSink, MsixState, SharedMsix};
use super::protocol::{
    command, device_flags, dma_unmap_flags, encode_sparse_mmap, header_flags, irq_index, irq_info_flags, irq_set_flags,
    region_flags, region_index, DeviceInfo, DmaMap, DmaUnmap, Errno, Header, IrqInfo, IrqSet, RegionAccess, RegionInfo,
    Version,
};
use super::regions::{RegionKind, RegionTable};
use crate::net::{self, NetBackend, NetSpec, NetStats};
use crate::os;
use crate::pcap::{self as pcap_file, PcapWriter};
use crate::timing::{Clock, TimingMode};

/// Most messages handled per loop pass.
pub const MESSAGES_PER_PASS: usize = 64;

/// Most received frames handed to the device per loop pass (so doorbells, the client
/// and time keep moving under a flood of network traffic).
pub const FRAMES_PER_PASS: usize = 64;

/// Longest wait while no client is attached.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Bits of [`os::wait_readable`]'s result: the listener, the wake eventfd; then the
/// network backend's descriptor and the client's, when present, in that order.
const LISTENER: u64 = 1 << 0;
const WAKE: u64 = 1 << 1;

/// Protocol limits the server advertises and enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most file descriptors per message the server accepts (`max_msg_fds`). QEMU refuses
    /// servers that advertise more than 16.
    pub max_msg_fds: u32,
    /// Largest REGION_READ/WRITE count (`max_data_xfer_size`). QEMU refuses more than
    /// 64 MiB.
    pub max_data_xfer_size: u32,
    /// Most DMA maps at once (`max_dma_maps`); QEMU refuses more than 65535.
    pub max_dma_maps: u32,
    /// How long a reply may wait for the client to make room in its socket before the
    /// client is disconnected.
    pub reply_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_msg_fds: 16,
            max_data_xfer_size: 1 << 20,
            max_dma_maps: 65535,
            reply_timeout: Duration::from_secs(2),
        }
    }
}

/// Doorbell polling parameters (see [`PollGovernor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polling {
    /// Busy-poll this long after the last activity. The default is [`DEFAULT_SPIN`] on a
    /// host with at least [`SPIN_MIN_CPUS`] CPUs and zero on a smaller one.
    pub spin: Duration,
    /// Longest sleep between two poll passes when idle: the worst-case extra doorbell
    /// latency.
    pub max_sleep: Duration,
}

/// The default busy-poll time after activity on a host with CPUs to spare.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

/// The fewest CPUs on which the server busy-polls by default. A busy poll only pays when
/// nobody else needs its CPU: the cross-process setup alone runs four busy processes (two
/// servers, their two clients), and on two CPUs a spinning server keeps its own client
/// and its peer from running: measured there, the two servers used ≈ 30 % more CPU per
/// 8-byte WRITE with the spin than without, and waited longer for a CPU
/// (docs/benchmarks.md, issue 19 goal 6).
pub const SPIN_MIN_CPUS: usize = 4;

impl Polling {
    /// The default spin for a host with `cpus` CPUs.
    pub fn default_spin(cpus: usize) -> Duration {
        if cpus >= SPIN_MIN_CPUS {
            DEFAULT_SPIN
        } else {
            Duration::ZERO
        }
    }
}

impl Default for Polling {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            spin: Self::default_spin(cpus),
            max_sleep: Duration::from_millis(1),
        }
    }
}

/// Everything the server needs.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Path of the listening socket (created with mode 0600; a stale socket there is
    /// replaced, a live one is an error).
    pub socket: PathBuf,
    /// The device model's configuration.
    pub device: DeviceConfig,
    /// Virtual-time mapping.
    pub timing: TimingMode,
    /// Protocol limits.
    pub limits: Limits,
    /// Doorbell polling.
    pub polling: Polling,
    /// Capture file for every frame sent or received.
    pub pcap: Option<PathBuf>,
    /// The network backend, opened by [`Server::bind`].
    pub net: NetSpec,
    /// Stop on SIGINT/SIGTERM (the binary); tests stop through [`ServerHandle::stop`].
    pub handle_signals: bool,
}

impl ServerOptions {
    /// Default options for a socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            device: DeviceConfig::default(),
            timing: TimingMode::default(),
            limits: Limits::default(),
            polling: Polling::default(),
            pcap: None,
            net: NetSpec::None,
            handle_signals: false,
        }
    }
}

/// What the server has done, as last published by its loop (once per pass).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Clients accepted.
    pub connections: u64,
    /// Connections refused because a client was attached.
    pub rejected_connections: u64,
    /// Clients that went away (closed, failed or killed).
    pub disconnections: u64,
    /// Whether a client is attached.
    pub connected: bool,
    /// Messages received.
    pub messages: u64,
    /// Messages that failed (error reply sent, or suppressed by No_reply).
    pub errors: u64,
    /// Doorbells taken from the shared pages and given to the device.
    pub doorbells: u64,
    /// Doorbell poll passes.
    pub poll_passes: u64,
    /// Live DMA maps.
    pub dma_maps: usize,
    /// MSI-X vectors with an eventfd.
    pub irq_eventfds: usize,
    /// Eventfd writes (device interrupts and SET_IRQS triggers).
    pub interrupts: u64,
    /// Interrupts for vectors without an eventfd.
    pub interrupts_dropped: u64,
    /// Frames the device transmitted (given to the network backend).
    pub frames_transmitted: u64,
    /// Frames the network backend received and gave to the device.
    pub frames_received: u64,
    /// The network backend's statistics.
    pub net: NetStats,
    /// Device resets (DEVICE_RESET).
    pub resets: u64,
    /// The device's counters.
    pub device: Counters,
    /// The transport's counters (frames dropped, sequence errors, duplicates, ...) since
    /// the server started, summed over device resets.
    pub transport: TransportCounters,
    /// The device's virtual time.
    pub virtual_time: Picoseconds,
    /// Total diagnostics the device recorded.
    pub diagnostics: u64,
    /// Diagnostics by kind, the device's and the server's own (malformed client
    /// messages): counted always, logged only as far as [`DIAGNOSTICS_POLICY`] allows.
    pub diagnostic_counts: Vec<KindCount>,
}

/// How much of the diagnostics under `rnic::diag` the server logs, the device's included:
/// the first 10 of each kind in full, the 10th followed by a note, then one line per
/// [`DIAGNOSTICS_PERIOD`] with the totals of the kinds that had more, and a summary line
/// when the server stops. So a flood of hostile frames or client messages adds at most
/// 11 lines per kind and one line per period (docs/guides/emulator.md, "Diagnostics").
pub const DIAGNOSTICS_POLICY: Policy = Policy::timed(DIAGNOSTICS_PERIOD.as_nanos() as u64);

/// The period of the diagnostics totals lines.
pub const DIAGNOSTICS_PERIOD: Duration = Duration::from_secs(10);

/// Diagnostics of the server itself (the device's are the model's `Source` and field).
mod diag_kind {
    use rnic_diag::Kind;
    /// A request the server refused (error reply or suppressed).
    pub const COMMAND_FAILED: Kind = Kind::new("vfio-user", "command failed");
    /// A reply from the client, which never gets requests.
    pub const UNEXPECTED_REPLY: Kind = Kind::new("vfio-user", "unexpected reply");
}

/// A handle to a running server: stop it, read its statistics.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    /// An eventfd in the loop's wait set, so a stop request needs no polling.
    wake: Arc<File>,
    stats: Arc<Mutex<ServerStats>>,
    socket: PathBuf,
}

impl ServerHandle {
    /// Asks the loop to stop; it does at once.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Only fails if the counter would overflow, and then the loop is awake anyway.
        let _ = (&*self.wake).write(&1u64.to_ne_bytes());
    }

    /// The latest statistics.
    pub fn stats(&self) -> ServerStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Waits until `condition` holds for the statistics, at most `timeout`; returns the
    /// last statistics seen and whether the condition held.
    pub fn wait_for(&self, timeout: Duration, condition: impl Fn(&ServerStats) -> bool) -> (ServerStats, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.stats();
            if condition(&stats) {
                return (stats, true);
            }
            if Instant::now() >= deadline {
                return (stats, false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A server running on its own thread; stopped and joined on drop.
#[derive(Debug)]
pub struct ServerThread {
    handle: ServerHandle,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl ServerThread {
    /// The handle.
    pub fn handle(&self) -> &ServerHandle {
        &self.handle
    }

    /// Stops the server and returns the loop's result.
    pub fn stop(mut self) -> io::Result<()> {
        self.handle.stop();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("server thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.handle.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Capabilities the client announced in VERSION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ClientCaps {
    /// Descriptors the client can receive per message (we send at most one).
    max_msg_fds: u64,
    /// Largest transfer the client can receive.
    max_data_xfer_size: u64,
}

/// The attached client.
#[derive(Debug)]
struct Client {
    stream: UnixStream,
    reader: MessageReader,
    caps: Option<ClientCaps>,
    regions: RegionTable,
    number: u64,
}

/// A successful reply's payload.
#[derive(Debug, Default)]
struct Reply {
    payload: Vec<u8>,
    /// Attach the doorbell memfd.
    doorbell_fd: bool,
}

impl Reply {
    fn with(payload: Vec<u8>) -> Self {
        Self {
            payload,
            doorbell_fd: false,
        }
    }
}

/// The vfio-user server.
pub struct Server {
    options: ServerOptions,
    listener: UnixListener,
    device: Device,
    dma: Arc<DmaSpace>,
    msix: SharedMsix,
    vectors: u16,
    doorbells: DoorbellPages,
    clock: Clock,
    governor: PollGovernor,
    client: Option<Client>,
    /// A mask update for the model's MSI-X table waits for memory decoding to be on.
    mask_sync_pending: bool,
    stop: Arc<AtomicBool>,
    wake: Arc<File>,
    shared_stats: Arc<Mutex<ServerStats>>,
    stats: ServerStats,
    /// The transport's counters over device resets (the driver resets when it unloads).
    transport_totals: TransportTotals,
    pcap: Option<PcapWriter>,
    pcap_dirty: bool,
    net: Box<dyn NetBackend>,
    /// Reused buffer for received frames.
    rx_frame: Vec<u8>,
    /// Reused list of the device's IP addresses (for backends that answer ARP/ND).
    addresses: Vec<std::net::IpAddr>,
    /// Wall-clock time of virtual time 0, for capture timestamps.
    start_unix: Duration,
    /// The server's own diagnostics (the device keeps its own).
    diag: Limiter,
    /// Origin of the time given to the limiters.
    started: Instant,
    /// Diagnostics counted at the last [`Server::publish_stats`].
    published_diagnostics: u64,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("socket", &self.options.socket)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn build_device(config: &DeviceConfig, dma: &Arc<DmaSpace>, msix: &SharedMsix) -> Device {
    let memory: Arc<dyn HostMemory> = dma.clone();
    let mut device = Device::new(config.clone(), memory, Box::new(EventfdSink::new(msix.clone())));
    device.diagnostics_mut().set_policy(DIAGNOSTICS_POLICY);
    device
}

/// Removes a socket file left behind by a server that is gone; refuses to touch a live
/// socket or anything that is not a socket.
fn clear_stale_socket(path: &Path) -> io::Result<()> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another server is listening on {}", path.display()),
        )),
        Err(_) => std::fs::remove_file(path),
    }
}

impl Server {
    /// Validates the options, creates the device and the doorbell memfd, and binds the
    /// socket (mode 0600).
    pub fn bind(options: ServerOptions) -> io::Result<Self> {
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
        let limits = &options.limits;
        if !(1..=os::MAX_FDS_PER_MESSAGE as u32).contains(&limits.max_msg_fds) {
            return Err(invalid(format!("max_msg_fds {} outside 1..=253", limits.max_msg_fds)));
        }
        if !(4096..=64 << 20).contains(&limits.max_data_xfer_size) {
            return Err(invalid(format!(
                "max_data_xfer_size {} outside 4096..=64 MiB",
                limits.max_data_xfer_size
            )));
        }
        if !(1..=65535).contains(&limits.max_dma_maps) {
            return Err(invalid(format!(
                "max_dma_maps {} outside 1..=65535",
                limits.max_dma_maps
            )));
        }
        let vectors = rnic_hw_model::config::msix_vector_count(&options.device.caps);
        if !(1..=rnic_hw_model::pci::MAX_MSIX_VECTORS).contains(&vectors) {
            return Err(invalid(format!("the device configuration has {vectors} MSI-X vectors")));
        }
        let doorbells = DoorbellPages::new(options.device.doorbell_pages)?;
        let dma = Arc::new(DmaSpace::new());
        let msix: SharedMsix = Arc::new(Mutex::new(MsixState::new(vectors)));
        let device = build_device(&options.device, &dma, &msix);
        let pcap = options.pcap.as_deref().map(pcap_file::create).transpose()?;
        let mut net = net::open(&options.net, options.device.mac_address)?;
        // Each pass ends with a flush (drain_transmit), so the backend may hand a pass's
        // frames to the kernel together.
        net.set_send_batching(true);
        clear_stale_socket(&options.socket)?;
        let listener = os::bind_unix_listener(&options.socket, 0o600)?;
        listener.set_nonblocking(true)?;
        let clock = Clock::new(options.timing, device.now());
        let governor = PollGovernor::new(options.polling.spin, options.polling.max_sleep);
        Ok(Self {
            listener,
            device,
            dma,
            msix,
            vectors,
            doorbells,
            clock,
            governor,
            client: None,
            mask_sync_pending: false,
            stop: Arc::new(AtomicBool::new(false)),
            wake: Arc::new(File::from(os::eventfd()?)),
            shared_stats: Arc::new(Mutex::new(ServerStats::default())),
            stats: ServerStats::default(),
            transport_totals: TransportTotals::default(),
            pcap,
            pcap_dirty: false,
            net,
            rx_frame: Vec::with_capacity(9000),
            addresses: Vec::new(),
            start_unix: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default(),
            options,
            diag: Limiter::new(DIAGNOSTICS_POLICY),
            started: Instant::now(),
            published_diagnostics: u64::MAX,
        })
    }

    /// A handle to stop the server and read its statistics.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            stop: self.stop.clone(),
            wake: self.wake.clone(),
            stats: self.shared_stats.clone(),
            socket: self.options.socket.clone(),
        }
    }

    /// Binds and runs a server on a new thread.
    pub fn spawn(options: ServerOptions) -> io::Result<ServerThread> {
        let server = Self::bind(options)?;
        let handle = server.handle();
        let thread = std::thread::Builder::new()
            .name("rnic-emu-vfio-user".into())
            .spawn(move || server.run())?;
        Ok(ServerThread {
            handle,
            thread: Some(thread),
        })
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || (self.options.handle_signals && os::termination_requested())
    }

    /// Runs until stopped ([`ServerHandle::stop`], or SIGINT/SIGTERM with
    /// `handle_signals`). Clients come and go; only a failure of the listening socket or
    /// of the wait ends the loop with an error.
    pub fn run(mut self) -> io::Result<()> {
        os::set_thread_timer_slack(Duration::from_micros(1));
        tracing::info!(
            target: "rnic_emu::vfio_user",
            socket = %self.options.socket.display(),
            timing = %self.options.timing,
            doorbell_pages = self.doorbells.pages(),
            msix_vectors = self.vectors,
            net = %self.net.describe(),
            "vfio-user server listening"
        );
        self.publish_stats();
        let result = self.run_loop();
        if let Some(client) = self.client.take() {
            self.detach(client, "server stopping");
        }
        if let Some(pcap) = &mut self.pcap {
            pcap.flush()?;
        }
        self.publish_stats();
        self.log_wire_counters("server stopping");
        self.diagnostics_summary().log_summary();
        tracing::info!(target: "rnic_emu::vfio_user", "vfio-user server stopped");
        result
    }

    /// One pass of the loop without its wait, on the caller's thread: the attached
    /// client's complete messages, a waiting connection, the doorbell pages, the
    /// network's frames, the device's due events and its transmitted frames. Returns
    /// whether anything happened. For fuzzers and tests that drive the server
    /// deterministically instead of [`Server::run`] on a thread of its own.
    pub fn run_once(&mut self) -> io::Result<bool> {
        // The network first, as in the loop (see there).
        let mut activity = self.receive_network()?;
        if self.client.is_some() {
            activity |= self.serve_client();
        }
        if self.client.is_none() {
            let before = self.stats.connections;
            self.accept();
            activity |= self.stats.connections != before;
        }
        if self.client.is_some() {
            activity |= self.poll_doorbells() > 0;
        }
        activity |= self.clock.sync(&mut self.device);
        self.drain_transmit()?;
        self.publish_stats();
        Ok(activity)
    }

    fn run_loop(&mut self) -> io::Result<()> {
        while !self.should_stop() {
            let now = Instant::now();
            // Without a client nobody can write a doorbell: sleep until a connection, a
            // device event or a stop request. (The cap only covers a SIGTERM that lands
            // just before the wait starts.)
            let mut wait = if self.client.is_some() {
                self.governor.next_wait(now)
            } else {
                IDLE_WAIT
            };
            if let Some(until_event) = self.clock.until_next_event(&self.device) {
                wait = wait.min(until_event);
            }
            if !wait.is_zero() && self.pcap_dirty {
                if let Some(pcap) = &mut self.pcap {
                    pcap.flush()?;
                }
                self.pcap_dirty = false;
            }
            let (ready, client_bit) = {
                let mut fds = vec![self.listener.as_fd(), self.wake.as_fd()];
                // The backend's descriptor only wakes the loop: receive_network polls the
                // backend every pass anyway, so its own bit is not needed.
                if let Some(fd) = self.net.pollable_fd() {
                    fds.push(fd);
                }
                let client_bit = 1u64 << fds.len();
                if let Some(client) = &self.client {
                    fds.push(client.stream.as_fd());
                }
                (os::wait_readable(&fds, Some(wait))?, client_bit)
            };
            if ready & WAKE != 0 {
                let mut counter = [0u8; 8];
                let _ = (&*self.wake).read(&mut counter);
            }
            // Frames the kernel holds first, at the device's time of the last pass: every
            // step below may move the device's clock to now, and a frame delivered after
            // that would arrive late in virtual time. After a pass the scheduler delayed
            // (a busy host), an ACK that was waiting in the socket would then come after
            // the ACK timer it should have stopped, and the requester would resend its
            // window for nothing.
            let mut activity = self.receive_network()?;
            // The client first: if it hung up, its EOF detaches it before a new
            // connection waiting in the same pass is looked at.
            if ready & client_bit != 0 {
                activity |= self.serve_client();
            }
            if ready & LISTENER != 0 {
                self.accept();
                activity = true;
            }
            if self.client.is_some() {
                activity |= self.poll_doorbells() > 0;
            }
            activity |= self.clock.sync(&mut self.device);
            self.drain_transmit()?;
            let now = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.device.diagnostics_mut().tick(now);
            self.diag.tick(now);
            if activity {
                self.governor.activity(Instant::now());
            }
            self.publish_stats();
        }
        Ok(())
    }

    /// Takes one new client if none is attached (further connections wait for the next
    /// pass, by when a client that hung up has been detached), or refuses every pending
    /// connection while one is.
    fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) => {
                    tracing::warn!(target: "rnic_emu::vfio_user", %error, "accept failed");
                    return;
                }
            };
            if self.client.is_some() {
                self.stats.rejected_connections += 1;
                tracing::warn!(target: "rnic_emu::vfio_user", "second client refused: one client at a time");
                drop(stream);
                continue;
            }
            if let Err(error) = configure_client_socket(&stream, self.options.limits.reply_timeout) {
                tracing::warn!(target: "rnic_emu::vfio_user", %error, "client socket setup failed");
                continue;
            }
            self.stats.connections += 1;
            let number = self.stats.connections;
            tracing::info!(target: "rnic_emu::vfio_user", client = number, "client attached");
            let limits = &self.options.limits;
            self.client = Some(Client {
                stream,
                reader: MessageReader::new(max_payload(limits), limits.max_msg_fds as usize),
                caps: None,
                regions: RegionTable::new(self.options.device.doorbell_pages, true),
                number,
            });
            return;
        }
    }

    /// Handles the client's complete messages; returns whether there was any.
    fn serve_client(&mut self) -> bool {
        let mut handled = 0;
        while handled < MESSAGES_PER_PASS {
            let Some(client) = &mut self.client else { break };
            match client.reader.read(client.stream.as_fd()) {
                ReadOutcome::Message(message) => {
                    handled += 1;
                    if let Err(error) = self.handle_message(message) {
                        let client = self.client.take().expect("client checked above");
                        self.detach(client, &format!("reply failed: {error}"));
                        break;
                    }
                }
                ReadOutcome::WouldBlock => break,
                ReadOutcome::Closed { mid_message } => {
                    let client = self.client.take().expect("client checked above");
                    let reason = if mid_message {
                        "connection closed in the middle of a message"
                    } else {
                        "connection closed"
                    };
                    self.detach(client, reason);
                    handled += 1;
                    break;
                }
            }
        }
        handled > 0
    }

    /// Drops everything the client owned; the device keeps its state.
    fn detach(&mut self, client: Client, reason: &str) {
        let maps = self.dma.clear();
        let eventfds = {
            let mut msix = irq::lock(&self.msix);
            let wired = msix.wired();
            msix.clear();
            wired
        };
        self.sync_all_masks();
        self.stats.disconnections += 1;
        self.log_wire_counters("client detached");
        tracing::info!(
            target: "rnic_emu::vfio_user",
            client = client.number,
            reason,
            dma_maps_dropped = maps,
            eventfds_dropped = eventfds,
            "client detached; device state kept"
        );
    }

    fn handle_message(&mut self, message: Message) -> io::Result<()> {
        self.stats.messages += 1;
        let header = message.header;
        if header.message_type() == header_flags::TYPE_REPLY {
            // This server never sends requests, so no reply can be expected.
            rnic_diag::warn!(
                self.diag,
                diag_kind::UNEXPECTED_REPLY,
                id = header.id,
                "unexpected reply from the client ignored"
            );
            self.stats.errors += 1;
            return Ok(());
        }
        let result = if let Some(errno) = message.malformed {
            Err(errno)
        } else if header.message_type() != header_flags::TYPE_COMMAND || message.too_many_fds {
            Err(Errno::EINVAL)
        } else {
            self.dispatch(&header, &message.payload, message.fds)
        };
        let Some(client) = &self.client else { return Ok(()) };
        match result {
            Ok(reply) => {
                if header.no_reply() {
                    return Ok(());
                }
                let fd = reply.doorbell_fd.then(|| self.doorbells.fd());
                send_message(&client.stream, &header.reply(reply.payload.len()), &reply.payload, fd)
            }
            Err(errno) => {
                self.stats.errors += 1;
                rnic_diag::warn!(
                    self.diag,
                    diag_kind::COMMAND_FAILED,
                    client = client.number,
                    id = header.id,
                    command = header.command,
                    name = command::name(header.command),
                    size = header.size,
                    %errno,
                    posted = header.no_reply(),
                    "command failed"
                );
                if header.no_reply() {
                    // The sender asked for no reply at all; QEMU would log an error reply
                    // it is not waiting for.
                    return Ok(());
                }
                send_message(&client.stream, &header.error_reply(errno), &[], None)
            }
        }
    }

    fn dispatch(&mut self, header: &Header, payload: &[u8], fds: Vec<OwnedFd>) -> Result<Reply, Errno> {
        let client = self.client.as_ref().ok_or(Errno::EIO)?;
        if header.command != command::VERSION && client.caps.is_none() {
            // VERSION must come first.
            return Err(Errno::EINVAL);
        }
        if !fds.is_empty() && !matches!(header.command, command::DMA_MAP | command::DEVICE_SET_IRQS) {
            return Err(Errno::EINVAL);
        }
        match header.command {
            command::VERSION => self.version(payload),
            command::DMA_MAP => self.dma_map(payload, fds),
            command::DMA_UNMAP => self.dma_unmap(payload),
            command::DEVICE_GET_INFO => self.device_info(payload),
            command::DEVICE_GET_REGION_INFO => self.region_info(payload),
            command::DEVICE_GET_IRQ_INFO => self.irq_info(payload),
            command::DEVICE_SET_IRQS => self.set_irqs(payload, fds),
            command::REGION_READ => self.region_read(payload),
            command::REGION_WRITE => self.region_write(payload),
            command::DEVICE_RESET => self.reset(payload),
            // Server → client only.
            command::DMA_READ | command::DMA_WRITE => Err(Errno::EINVAL),
            _ => Err(Errno::ENOTSUP),
        }
    }

    // ---- commands -------------------------------------------------------------------

    fn version(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        let client = self.client.as_mut().ok_or(Errno::EIO)?;
        if client.caps.is_some() {
            return Err(Errno::EINVAL);
        }
        let version = Version::parse(payload)?;
        if version.major != 0 {
            return Err(Errno::ENOTSUP);
        }
        let caps = parse_client_caps(version.json)?;
        client.caps = Some(caps);
        client.regions = RegionTable::new(self.options.device.doorbell_pages, caps.max_msg_fds >= 1);
        let limits = &self.options.limits;
        // Advertised: our receive limits only. No migration (QEMU 10.x cannot migrate a
        // vfio-user device anyway), no twin socket, no write_multiple.
        let json = serde_json::json!({
            "capabilities": {
                "max_msg_fds": limits.max_msg_fds,
                "max_data_xfer_size": limits.max_data_xfer_size,
                "max_dma_maps": limits.max_dma_maps,
                "pgsizes": os::PAGE_SIZE,
            }
        })
        .to_string();
        tracing::info!(
            target: "rnic_emu::vfio_user",
            client = client.number,
            minor = version.minor,
            client_caps = version.json.unwrap_or("(none)"),
            "version negotiated"
        );
        Ok(Reply::with(Version::encode(0, 0, Some(&json))))
    }

    fn dma_map(&mut self, payload: &[u8], mut fds: Vec<OwnedFd>) -> Result<Reply, Errno> {
        let request = DmaMap::parse(payload)?;
        if fds.len() > 1 {
            return Err(Errno::EINVAL);
        }
        let fd = fds.pop();
        let backed = fd.is_some();
        self.dma.map(&request, fd, self.options.limits.max_dma_maps as usize)?;
        tracing::debug!(
            target: "rnic_emu::vfio_user",
            address = format_args!("{:#x}", request.address),
            size = format_args!("{:#x}", request.size),
            flags = request.flags,
            backed,
            "DMA map"
        );
        Ok(Reply::default())
    }

    fn dma_unmap(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        let request = DmaUnmap::parse(payload)?;
        if request.flags & dma_unmap_flags::GET_DIRTY_BITMAP != 0 {
            return Err(Errno::ENOTSUP);
        }
        if request.flags & !dma_unmap_flags::ALL != 0 {
            return Err(Errno::EINVAL);
        }
        if request.flags & dma_unmap_flags::ALL != 0 {
            if request.address != 0 || request.size != 0 {
                return Err(Errno::EINVAL);
            }
            let count = self.dma.clear();
            tracing::debug!(target: "rnic_emu::vfio_user", count, "DMA unmap all");
        } else {
            self.dma.unmap(request.address, request.size)?;
        }
        // The device runs on this thread: no DMA into the range is in flight now.
        Ok(Reply::with(request.encode()))
    }

    fn device_info(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        DeviceInfo::parse_request(payload)?;
        Ok(Reply::with(
            DeviceInfo {
                argsz: DeviceInfo::SIZE as u32,
                flags: device_flags::PCI | device_flags::RESET,
                num_regions: region_index::COUNT,
                num_irqs: irq_index::COUNT,
            }
            .encode(),
        ))
    }

    fn region_info(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        if payload.len() != RegionInfo::SIZE {
            return Err(Errno::EINVAL);
        }
        let request = RegionInfo::parse(payload)?;
        if (request.argsz as usize) < RegionInfo::SIZE {
            return Err(Errno::EINVAL);
        }
        let client = self.client.as_ref().ok_or(Errno::EIO)?;
        let region = client.regions.get(request.index).ok_or(Errno::EINVAL)?;
        let mut info = RegionInfo {
            argsz: RegionInfo::SIZE as u32,
            flags: region.flags,
            index: request.index,
            cap_offset: 0,
            size: region.size,
            offset: 0,
        };
        let mut caps = Vec::new();
        if !region.sparse.is_empty() {
            let chain = encode_sparse_mmap(&region.sparse);
            info.argsz = (RegionInfo::SIZE + chain.len()) as u32;
            // The chain only goes out when the client's buffer can take it; the argsz
            // tells it how much to ask for next time. CAPS is set only together with the
            // chain: QEMU's vfio-user client rejects CAPS with cap_offset 0 (the kernel
            // would set it anyway).
            if request.argsz >= info.argsz {
                info.flags |= region_flags::CAPS;
                info.cap_offset = RegionInfo::SIZE as u32;
                caps = chain;
            }
        }
        let mut payload = info.encode();
        payload.extend(caps);
        // The fd goes with every reply for a mappable region, with or without the chain
        // (the `vfio_user` crate sends it only together with sparse areas).
        Ok(Reply {
            payload,
            doorbell_fd: region.mappable(),
        })
    }

    fn irq_info(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        let request = IrqInfo::parse(payload)?;
        if request.index >= irq_index::COUNT {
            return Err(Errno::EINVAL);
        }
        let (flags, count) = if request.index == irq_index::MSIX {
            (
                irq_info_flags::EVENTFD | irq_info_flags::MASKABLE,
                u32::from(self.vectors),
            )
        } else {
            // No INTx (interrupt pin 0), no MSI, no error/request notifiers.
            (0, 0)
        };
        Ok(Reply::with(
            IrqInfo {
                argsz: IrqInfo::SIZE as u32,
                flags,
                index: request.index,
                count,
            }
            .encode(),
        ))
    }

    fn set_irqs(&mut self, payload: &[u8], fds: Vec<OwnedFd>) -> Result<Reply, Errno> {
        use irq_set_flags::*;
        let set = IrqSet::parse(payload)?;
        let data = set.flags & DATA_MASK;
        let action = set.flags & ACTION_MASK_ALL;
        if set.index >= irq_index::COUNT {
            return Err(Errno::EINVAL);
        }
        if data != DATA_EVENTFD && !fds.is_empty() {
            return Err(Errno::EINVAL);
        }
        if set.index != irq_index::MSIX {
            // Disabling an index that has no vectors is harmless; anything else is not.
            return if set.count == 0 && data == DATA_NONE && action == ACTION_TRIGGER {
                Ok(Reply::default())
            } else {
                Err(Errno::EINVAL)
            };
        }
        if set.count == 0 {
            if data == DATA_NONE && action == ACTION_TRIGGER {
                irq::lock(&self.msix).clear();
                self.sync_all_masks();
                return Ok(Reply::default());
            }
            return Err(Errno::EINVAL);
        }
        let end = set.start.checked_add(set.count).ok_or(Errno::EINVAL)?;
        if end > u32::from(self.vectors) {
            return Err(Errno::EINVAL);
        }
        if data == DATA_EVENTFD && !fds.is_empty() && fds.len() != set.count as usize {
            return Err(Errno::EINVAL);
        }
        let selected = |i: u32| data != DATA_BOOL || set.bools[i as usize] != 0;
        {
            let mut msix = irq::lock(&self.msix);
            match (action, data) {
                (ACTION_TRIGGER, DATA_EVENTFD) => {
                    let mut fds = fds.into_iter();
                    for vector in set.start..end {
                        // No fds: de-assign the range.
                        msix.set_eventfd(vector, fds.next());
                    }
                }
                (ACTION_TRIGGER, _) => {
                    for i in 0..set.count {
                        if selected(i) {
                            msix.signal(set.start + i);
                        }
                    }
                }
                (ACTION_MASK | ACTION_UNMASK, DATA_NONE | DATA_BOOL) => {
                    for i in 0..set.count {
                        if selected(i) {
                            msix.set_masked(set.start + i, action == ACTION_MASK);
                        }
                    }
                }
                // Mask/unmask eventfds (signalled on mask changes) are not implemented.
                _ => return Err(Errno::ENOTSUP),
            }
        }
        self.sync_masks(set.start..end);
        Ok(Reply::default())
    }

    /// Validates a region access and returns the region's kind.
    fn check_access(&self, access: &RegionAccess) -> Result<RegionKind, Errno> {
        let client = self.client.as_ref().ok_or(Errno::EIO)?;
        let region = client.regions.get(access.region).ok_or(Errno::EINVAL)?;
        let mut limit = u64::from(self.options.limits.max_data_xfer_size);
        if let Some(caps) = client.caps {
            limit = limit.min(caps.max_data_xfer_size);
        }
        if u64::from(access.count) > limit {
            return Err(Errno::E2BIG);
        }
        let end = access
            .offset
            .checked_add(u64::from(access.count))
            .ok_or(Errno::EINVAL)?;
        if region.kind == RegionKind::Absent || access.count == 0 || end > region.size {
            return Err(Errno::EINVAL);
        }
        if let RegionKind::Bar(_) = region.kind {
            let single = matches!(access.count, 1 | 2 | 4 | 8);
            let dwords = access.count % 4 == 0 && access.offset % 4 == 0;
            if !single && !dwords {
                return Err(Errno::EINVAL);
            }
        }
        Ok(region.kind)
    }

    fn region_read(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        let access = RegionAccess::parse_read(payload)?;
        let kind = self.check_access(&access)?;
        self.clock.sync(&mut self.device);
        let mut reply = access.encode();
        let start = reply.len();
        reply.resize(start + access.count as usize, 0);
        let data = &mut reply[start..];
        match kind {
            RegionKind::Config => self.device.config_read(access.offset as usize, data),
            RegionKind::Bar(bar) => {
                if matches!(data.len(), 1 | 2 | 4 | 8) {
                    self.device.bar_read(bar, access.offset, data);
                } else {
                    for (i, chunk) in data.chunks_exact_mut(4).enumerate() {
                        self.device.bar_read(bar, access.offset + 4 * i as u64, chunk);
                    }
                }
            }
            RegionKind::Absent => return Err(Errno::EINVAL),
        }
        Ok(Reply::with(reply))
    }

    fn region_write(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        let (access, data) = RegionAccess::parse_write(payload)?;
        let kind = self.check_access(&access)?;
        self.clock.sync(&mut self.device);
        match kind {
            RegionKind::Config => {
                self.device.config_write(access.offset as usize, data);
                if self.mask_sync_pending {
                    self.sync_all_masks();
                }
            }
            RegionKind::Bar(bar) => {
                if matches!(data.len(), 1 | 2 | 4 | 8) {
                    self.device.bar_write(bar, access.offset, data);
                } else {
                    for (i, chunk) in data.chunks_exact(4).enumerate() {
                        self.device.bar_write(bar, access.offset + 4 * i as u64, chunk);
                    }
                }
            }
            RegionKind::Absent => return Err(Errno::EINVAL),
        }
        Ok(Reply::with(access.encode()))
    }

    fn reset(&mut self, payload: &[u8]) -> Result<Reply, Errno> {
        if !payload.is_empty() {
            return Err(Errno::EINVAL);
        }
        // A full function reset: the device in its power-on state, configuration space
        // included. The client's DMA maps and eventfds stay (they are the client's, not
        // the device's); the model's vector masks follow them once decoding is back on.
        // The counters (and the kinds already quiet) survive: a client resetting in a loop
        // must not restart the log's allowance.
        let limiter = self.device.diagnostics_mut().replace_limiter(Limiter::default());
        self.device = build_device(&self.options.device, &self.dma, &self.msix);
        self.device.diagnostics_mut().replace_limiter(limiter);
        self.clock.rebase(self.device.now());
        self.doorbells.clear();
        self.mask_sync_pending = true;
        self.stats.resets += 1;
        tracing::info!(target: "rnic_emu::vfio_user", "device reset");
        Ok(Reply::default())
    }

    // ---- MSI-X masks ----------------------------------------------------------------

    fn memory_enabled(&mut self) -> bool {
        let mut command = [0u8; 2];
        self.device.config_read(pci_offset::COMMAND, &mut command);
        u16::from_le_bytes(command) & COMMAND_MEMORY_SPACE != 0
    }

    /// Writes the SET_IRQS-derived mask of `vectors` into the model's MSI-X table (vector
    /// control dword). The model ignores BAR writes while memory decoding is off, so
    /// then the update waits for the next configuration write.
    fn sync_masks(&mut self, vectors: std::ops::Range<u32>) {
        if !self.memory_enabled() {
            self.mask_sync_pending = true;
            return;
        }
        for vector in vectors {
            let masked = irq::lock(&self.msix).desired_mask(vector);
            let offset = u64::from(vector) * regs::MSIX_ENTRY_SIZE + 12;
            self.device
                .bar_write(regs::MSIX_BAR, offset, &u32::from(masked).to_le_bytes());
        }
    }

    fn sync_all_masks(&mut self) {
        self.mask_sync_pending = false;
        self.sync_masks(0..u32::from(self.vectors));
    }

    // ---- doorbells, network, statistics ---------------------------------------------

    fn poll_doorbells(&mut self) -> usize {
        self.stats.poll_passes += 1;
        let device = &mut self.device;
        let clock = &self.clock;
        let taken = self.doorbells.poll(|offset, word| {
            clock.sync(device);
            device.bar_write(regs::DOORBELL_BAR, offset, &word.to_le_bytes());
        });
        self.stats.doorbells += taken as u64;
        taken
    }

    /// Records `frame` in the capture, stamped with the device's virtual time mapped to
    /// the wall clock.
    fn capture(&mut self, frame: &[u8]) -> io::Result<()> {
        if let Some(pcap) = &mut self.pcap {
            let at = self.start_unix + Duration::from_nanos(self.device.now().as_nanos());
            let at = rnic_hw_model::Picoseconds((at.as_nanos() as u64).saturating_mul(1_000));
            pcap.write_frame(at, frame)?;
            self.pcap_dirty = true;
        }
        Ok(())
    }

    /// Hands the device's transmitted frames to the backend, buffer and all
    /// ([`NetBackend::send_owned`]). Their ICRC is left to the backend (`udp:` computes it
    /// once for the headers it really sends) unless the frame is captured: `--pcap` records
    /// it as the device sent it.
    fn drain_transmit(&mut self) -> io::Result<()> {
        while let Some((mut frame, mut icrc)) = self.device.poll_transmit_offloaded() {
            self.stats.frames_transmitted += 1;
            if self.pcap.is_some() && icrc == Icrc::Offloaded {
                wire::fill_icrc(&mut frame);
                icrc = Icrc::Computed;
            }
            self.capture(&frame)?;
            // The backend keeps the buffer until the frame is sent and gives one back.
            let spare = self.net.send_owned(frame, icrc);
            self.device.recycle_frame(spare);
        }
        self.net.flush();
        Ok(())
    }

    /// One log line with what the wire did so far: the transport's retransmissions and
    /// the backend's losses, so a user of `udp:` sees whether a run was clean.
    fn log_wire_counters(&mut self, when: &str) {
        let transport = self.transport_totals.total(self.device.transport_counters());
        let net = self.net.stats();
        tracing::info!(
            target: "rnic_emu::vfio_user",
            when,
            frames_sent = net.frames_sent,
            frames_received = net.frames_received,
            retransmitted_packets = transport.retransmitted_packets,
            ack_timeouts = transport.ack_timeouts,
            out_of_sequence = transport.out_of_sequence,
            duplicate_requests = transport.duplicate_requests,
            tx_errors = net.tx_errors,
            tx_stalls = net.tx_stalls,
            rx_errors = net.rx_errors,
            rx_malformed = net.rx_malformed,
            "wire counters"
        );
    }

    /// Gives the device up to [`FRAMES_PER_PASS`] frames from the network, at the
    /// device's current time (the clock is not moved first: the frames arrived at some
    /// instant since the last pass, and the device's time is that of the last pass);
    /// returns whether there was any.
    fn receive_network(&mut self) -> io::Result<bool> {
        if self.net.wants_local_addresses() {
            // The driver may change the GID table with any command: follow it each pass.
            net::gid_addresses(&self.device, &mut self.addresses);
            self.net.set_local_addresses(&self.addresses);
        }
        let mut frame = std::mem::take(&mut self.rx_frame);
        let mut received = 0;
        while received < FRAMES_PER_PASS && self.net.receive(&mut frame) {
            received += 1;
            self.stats.frames_received += 1;
            let captured = self.capture(&frame);
            // The device keeps the buffer (no copy) and gives one back.
            frame = self.device.receive_frame_owned(frame);
            if let Err(error) = captured {
                self.rx_frame = frame;
                return Err(error);
            }
        }
        self.rx_frame = frame;
        Ok(received > 0)
    }

    /// The device's diagnostics counters and the server's together.
    fn diagnostics_summary(&self) -> Limiter {
        let mut all = self.device.diagnostics().limiter().clone();
        all.absorb(&self.diag);
        all
    }

    fn publish_stats(&mut self) {
        self.stats.connected = self.client.is_some();
        self.stats.dma_maps = self.dma.len();
        {
            let msix = irq::lock(&self.msix);
            self.stats.irq_eventfds = msix.wired();
            self.stats.interrupts = msix.delivered;
            self.stats.interrupts_dropped = msix.dropped;
        }
        self.stats.device = self.device.counters();
        self.stats.transport = self.transport_totals.total(self.device.transport_counters());
        self.stats.net = self.net.stats();
        self.stats.virtual_time = self.device.now();
        self.stats.diagnostics = self.device.diagnostics().total();
        let counted = self.stats.diagnostics + self.diag.total();
        if counted != self.published_diagnostics {
            self.published_diagnostics = counted;
            self.stats.diagnostic_counts = self.diagnostics_summary().counts().to_vec();
        }
        *self.shared_stats.lock().unwrap_or_else(|e| e.into_inner()) = self.stats.clone();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only our own socket: bind refused to replace a live one.
        if std::fs::symlink_metadata(&self.options.socket).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(&self.options.socket);
        }
    }
}

/// Reads the client's capabilities from the VERSION JSON (all optional, spec defaults:
/// one fd, 1 MiB). Malformed JSON or a capability of the wrong type is EINVAL; unknown
/// capabilities are ignored.
fn parse_client_caps(json: Option<&str>) -> Result<ClientCaps, Errno> {
    let mut caps = ClientCaps {
        max_msg_fds: 1,
        max_data_xfer_size: 1 << 20,
    };
    let Some(json) = json else { return Ok(caps) };
    let value: serde_json::Value = serde_json::from_str(json).map_err(|_| Errno::EINVAL)?;
    let object = value.as_object().ok_or(Errno::EINVAL)?;
    let Some(capabilities) = object.get("capabilities") else {
        return Ok(caps);
    };
    let capabilities = capabilities.as_object().ok_or(Errno::EINVAL)?;
    for (key, value) in capabilities {
        match key.as_str() {
            "max_msg_fds" => caps.max_msg_fds = value.as_u64().ok_or(Errno::EINVAL)?,
            "max_data_xfer_size" => caps.max_data_xfer_size = value.as_u64().ok_or(Errno::EINVAL)?,
            "max_dma_maps" | "pgsizes" => {
                value.as_u64().ok_or(Errno::EINVAL)?;
            }
            "write_multiple" => {
                value.as_bool().ok_or(Errno::EINVAL)?;
            }
            "migration" | "twin_socket" => {
                value.as_object().ok_or(Errno::EINVAL)?;
            }
            other => {
                tracing::debug!(target: "rnic_emu::vfio_user", capability = other, "unknown client capability ignored")
            }
        }
    }
    Ok(caps)
}

/// The largest message payload a server with `limits` accepts (REGION_WRITE of
/// `max_data_xfer_size` bytes); larger messages are drained and refused with E2BIG.
pub fn max_payload(limits: &Limits) -> usize {
    RegionAccess::SIZE + limits.max_data_xfer_size as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_busy_polls_by_default_only_with_cpus_to_spare() {
        assert_eq!(Polling::default_spin(1), Duration::ZERO);
        assert_eq!(Polling::default_spin(2), Duration::ZERO);
        assert_eq!(Polling::default_spin(3), Duration::ZERO);
        assert_eq!(Polling::default_spin(4), DEFAULT_SPIN);
        assert_eq!(Polling::default_spin(64), DEFAULT_SPIN);
    }

    #[test]
    fn client_caps_default_and_validate() {
        assert_eq!(
            parse_client_caps(None).unwrap(),
            ClientCaps {
                max_msg_fds: 1,
                max_data_xfer_size: 1 << 20
            }
        );
        let qemu = r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,
            "max_dma_maps":65535,"write_multiple":true,"migration":{"pgsize":4096,"max_bitmap_size":268435456}}}"#;
        assert_eq!(parse_client_caps(Some(qemu)).unwrap().max_msg_fds, 16);
        assert_eq!(parse_client_caps(Some("[]")), Err(Errno::EINVAL));
        assert_eq!(parse_client_caps(Some("{")), Err(Errno::EINVAL));
        assert_eq!(
            parse_client_caps(Some(r#"{"capabilities":{"max_msg_fds":"many"}}"#)),
            Err(Errno::EINVAL)
        );
        assert!(parse_client_caps(Some(r#"{"capabilities":{"future":1}}"#)).is_ok());
    }
}
