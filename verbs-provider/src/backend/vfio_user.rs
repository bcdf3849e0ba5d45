//! The vfio-user client backend: the driver talks to a NIC running in another process
//! (`rnic-emu serve --socket PATH`) over its vfio-user socket, acting as the VMM.
//!
//! * **Handshake** ([`VfioUserDevice::connect`]): VERSION (our limits as capabilities,
//!   the server's read back), DEVICE_GET_INFO (a PCI device with at least 9 regions),
//!   GET_REGION_INFO for configuration space and BARs 0, 2 and 4 (following the argsz
//!   protocol for the capability chain), GET_IRQ_INFO for MSI-X, then SET_IRQS wiring one
//!   eventfd per MSI-X vector (in batches of at most the server's `max_msg_fds`).
//! * **Register accesses**: configuration space and BARs 0 and 4 are trapped: each access
//!   is a REGION_READ or REGION_WRITE round trip on the socket. The doorbell pages of
//!   BAR 2 come with the sparse-mmap capability and the server's memfd: they are mapped
//!   here, and a 64-bit doorbell is one store into the page — after waiting until the
//!   register reads 0, the rule of `docs/register-map.md` §3 (the device takes a doorbell
//!   by clearing the word; storing over one it has not taken yet would lose it). The
//!   wait-and-store is one compare-and-swap, so two threads ringing the same register
//!   cannot overwrite each other either. Everything else in BAR 2 is trapped.
//! * **DMA memory**: arenas of memfd-backed memory ([`ARENA_SIZE`] each, more when a
//!   request needs it), mapped in this process and DMA_MAPped to the server at IOVAs
//!   from [`DMA_BASE`] up. A first-fit allocator over them serves
//!   [`DeviceAccess::allocate_dma`] (zero-filled, reused after [`DeviceAccess::free_dma`]).
//! * **Application memory**: the device can only reach memory the server can map, i.e.
//!   memfd-backed pages, and a `Vec<u8>` lives on the ordinary heap. So
//!   [`DeviceAccess::register_user_memory`] moves the `Vec` in, copies its bytes into
//!   arena pages and returns their bus addresses; the application reads and writes the
//!   registered memory through the memory region (as with every backend);
//!   [`DeviceAccess::unregister_user_memory`] copies the pages back into the same `Vec`
//!   and hands it back.
//! * **Interrupts**: [`DeviceAccess::poll_interrupts`] reads every vector's eventfd
//!   without blocking; [`DeviceAccess::wait_interrupt`] waits on all of them with `ppoll`
//!   and a real timeout.
//! * **Time** is the wall clock: [`DeviceAccess::delay`] sleeps (spins for short waits),
//!   [`DeviceAccess::idle`] yields the CPU.
//! * **Failures**: the MMIO methods of [`DeviceAccess`] cannot fail, so once the socket
//!   breaks (server gone, timeout, protocol error) the connection is marked broken:
//!   reads return all ones (what PCI returns for a missing device), writes are dropped,
//!   both at once without touching the socket, and the driver's own checks turn that into
//!   errors. `delay` and `wait_interrupt` stop waiting too (nothing can change any more),
//!   so the driver's poll budgets run out in microseconds. [`VfioUserDevice::is_connected`] and [`VfioUserDevice::last_error`] say
//!   what happened. Nothing panics.
//! * **Drop**: DMA_UNMAP of every arena, then the socket is closed; the server keeps the
//!   device state for the next client.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use rnic_firmware_if::regs;

use super::dma_pool::{check_dma_request, DmaPool};
use super::{lock, wall_clock_delay};
use crate::device_access::{AccessError, DeviceAccess, DmaBuffer, UserMemory, USER_PAGE_SIZE};
use rnic_os::{self as os, MappedRegion, Protection};

/// First IOVA (bus address) of the DMA arenas.
pub const DMA_BASE: u64 = 0x1_0000_0000;
/// Size of one DMA arena (memfd files are sparse: untouched pages cost nothing).
pub const ARENA_SIZE: u64 = 256 << 20;
/// Most DMA memory the backend maps in total.
pub const MAX_DMA_MEMORY: u64 = 16 << 30;
/// Gap left between arenas in IOVA space, so no buffer or access can run from one arena
/// into the next.
const ARENA_GAP: u64 = 2 << 20;
/// How long one request waits for its reply before the connection is declared broken.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a doorbell store waits for the device to take the previous doorbell of the
/// same register before it is dropped (the server polls the pages at least every
/// millisecond by default; this only bounds a dead or stuck server).
pub const DOORBELL_TIMEOUT: Duration = Duration::from_secs(2);
/// The MAC address used when none is given: `rnic-emu serve`'s default (`--mac`).
pub const DEFAULT_MAC: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x01];

const PAGE: u64 = USER_PAGE_SIZE as u64;
const HEADER_SIZE: usize = 16;
/// Largest reply payload accepted (REGION_READ of 1 MiB plus its header structure, with
/// room for a region-info capability chain).
const MAX_REPLY: usize = (1 << 20) + 64;
/// The capabilities we announce: what this client can receive.
const CLIENT_CAPS: &str =
    r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535}}"#;

/// vfio-user command numbers (QEMU `docs/interop/vfio-user.rst`).
mod command {
    pub const VERSION: u16 = 1;
    pub const DMA_MAP: u16 = 2;
    pub const DMA_UNMAP: u16 = 3;
    pub const DEVICE_GET_INFO: u16 = 4;
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    pub const DEVICE_SET_IRQS: u16 = 8;
    pub const REGION_READ: u16 = 9;
    pub const REGION_WRITE: u16 = 10;
}

/// Header flag bits.
const TYPE_MASK: u32 = 0xF;
const TYPE_REPLY: u32 = 1;
const FLAG_ERROR: u32 = 1 << 5;
/// `VFIO_DEVICE_FLAGS_PCI`.
const DEVICE_FLAG_PCI: u32 = 1 << 1;
/// Region info flags.
const REGION_FLAG_MMAP: u32 = 1 << 2;
const REGION_FLAG_CAPS: u32 = 1 << 3;
/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`.
const CAP_SPARSE_MMAP: u16 = 1;
/// vfio-pci region and IRQ indices.
const CONFIG_REGION: u32 = 7;
const MSIX_IRQ_INDEX: u32 = 2;
/// SET_IRQS: one eventfd per vector, wired (ACTION_TRIGGER with DATA_EVENTFD).
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
/// DMA_MAP: the device may read and write.
const DMA_READ_WRITE: u32 = 0b11;

/// Options of [`VfioUserDevice::connect_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioUserOptions {
    /// The port's MAC address as the platform knows it. The vfio-user device does not
    /// report one (a real NIC's netdev would), so it must match the emulator's `--mac`.
    pub mac_address: [u8; 6],
    /// How long one request waits for its reply.
    pub reply_timeout: Duration,
}

impl Default for VfioUserOptions {
    fn default() -> Self {
        Self {
            mac_address: DEFAULT_MAC,
            reply_timeout: REPLY_TIMEOUT,
        }
    }
}

/// Size and mapping of one region, as GET_REGION_INFO reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionSummary {
    /// Region size in bytes.
    pub size: u64,
    /// Region flags (`VFIO_REGION_INFO_FLAG_*`).
    pub flags: u32,
}

/// The socket and request bookkeeping.
#[derive(Debug)]
struct Connection {
    stream: Option<UnixStream>,
    next_id: u16,
    last_error: Option<String>,
}

/// A reply: payload and received descriptors.
#[derive(Debug)]
struct Reply {
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// Why a request failed.
#[derive(Debug)]
enum RequestError {
    /// The server answered with an error reply (errno); the stream is still in step.
    Errno(u32),
    /// The connection is broken (now or earlier).
    Broken(String),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Errno(errno) => write!(f, "server error: {}", io::Error::from_raw_os_error(*errno as i32)),
            RequestError::Broken(reason) => write!(f, "connection broken: {reason}"),
        }
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The REGION_READ/WRITE leading structure.
fn region_access(offset: u64, region: u32, count: u32) -> Vec<u8> {
    let mut out = offset.to_le_bytes().to_vec();
    out.extend_from_slice(&region.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

/// The unsigned integer value of `"key":` in the server's VERSION JSON (a flat search is
/// enough for the few numeric capabilities we read; the crate has no JSON parser).
fn json_u64(json: &str, key: &str) -> Option<u64> {
    let pattern = format!("\"{key}\"");
    let rest = &json[json.find(&pattern)? + pattern.len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl Connection {
    fn broken(&mut self, reason: String) -> RequestError {
        if self.stream.take().is_some() {
            tracing::error!(target: "rnic_verbs::vfio_user", %reason, "vfio-user connection broken");
        }
        self.last_error.get_or_insert(reason.clone());
        RequestError::Broken(reason)
    }

    /// Sends a command with `fds` and waits for its reply.
    fn request(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<Reply, RequestError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let Some(stream) = self.stream.as_ref() else {
            return Err(RequestError::Broken(
                self.last_error.clone().unwrap_or_else(|| "not connected".into()),
            ));
        };
        let result = Self::exchange(stream, id, command, payload, fds);
        match result {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(errno)) => Err(RequestError::Errno(errno)),
            Err(error) => Err(self.broken(format!("command {command}: {error}"))),
        }
    }

    /// One round trip. The outer error is fatal for the connection, the inner one is an
    /// error reply.
    fn exchange(
        stream: &UnixStream,
        id: u16,
        command: u16,
        payload: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<Result<Reply, u32>> {
        let size = u32::try_from(HEADER_SIZE + payload.len()).map_err(|_| io::Error::other("message too large"))?;
        let mut header = Vec::with_capacity(HEADER_SIZE);
        header.extend_from_slice(&id.to_le_bytes());
        header.extend_from_slice(&command.to_le_bytes());
        header.extend_from_slice(&size.to_le_bytes());
        header.extend_from_slice(&[0; 8]);
        let message = [&header[..], payload].concat();
        let mut sent = 0;
        while sent < message.len() {
            let attach = if sent == 0 { fds } else { &[] };
            let n = os::send_with_fds(stream.as_fd(), &[&message[sent..]], attach)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            sent += n;
        }
        let mut received_fds = Vec::new();
        let mut head = [0u8; HEADER_SIZE];
        Self::receive_exact(stream, &mut head, &mut received_fds)?;
        let reply_size = le32(&head, 4) as usize;
        let flags = le32(&head, 8);
        if reply_size < HEADER_SIZE || reply_size - HEADER_SIZE > MAX_REPLY {
            return Err(io::Error::other(format!("reply size {reply_size}")));
        }
        let mut reply = vec![0u8; reply_size - HEADER_SIZE];
        Self::receive_exact(stream, &mut reply, &mut received_fds)?;
        // We never have more than one request in flight, and the server never sends
        // requests of its own to this client: anything else means the stream is lost.
        if le16(&head, 0) != id || le16(&head, 2) != command || flags & TYPE_MASK != TYPE_REPLY {
            return Err(io::Error::other(format!(
                "unexpected message (id {}, command {}, flags {flags:#x}) for request {id}",
                le16(&head, 0),
                le16(&head, 2)
            )));
        }
        if flags & FLAG_ERROR != 0 {
            return Ok(Err(le32(&head, 12).max(1)));
        }
        Ok(Ok(Reply {
            payload: reply,
            fds: received_fds,
        }))
    }

    fn receive_exact(stream: &UnixStream, buffer: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<()> {
        let mut have = 0;
        while have < buffer.len() {
            let n = os::recv_with_fds(stream.as_fd(), &mut buffer[have..], fds, 16, false)?.bytes;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
            have += n;
        }
        Ok(())
    }
}

/// One memfd-backed DMA arena.
#[derive(Debug)]
struct Arena {
    iova: u64,
    map: MappedRegion,
}

impl Arena {
    fn contains(&self, address: u64, len: usize) -> Option<usize> {
        let offset = address.checked_sub(self.iova)?;
        let end = offset.checked_add(len as u64)?;
        (end <= self.map.len() as u64).then_some(offset as usize)
    }
}

/// DMA bookkeeping: the shared pool over IOVAs, and where the next arena goes.
#[derive(Debug)]
struct Allocator {
    /// Free IOVA ranges (coalesced; never across arenas thanks to the gap), buffers and
    /// registrations.
    pool: DmaPool,
    next_iova: u64,
}

/// A NIC behind a vfio-user socket, driven as its VMM. See the module documentation.
///
/// ```no_run
/// use rnic_verbs::backend::VfioUserDevice;
/// let device = VfioUserDevice::connect("/tmp/rnic0.sock").expect("server running");
/// let context = rnic_verbs::Context::open(Box::new(device)).expect("bring-up");
/// ```
#[derive(Debug)]
pub struct VfioUserDevice {
    path: PathBuf,
    options: VfioUserOptions,
    connection: Mutex<Connection>,
    /// Largest REGION_READ/WRITE the server takes.
    max_transfer: u32,
    regions: [RegionSummary; 8],
    /// BAR 2's mmappable pages: (mapping, offset of the mapping inside the BAR).
    doorbells: Option<(MappedRegion, u64)>,
    arenas: RwLock<Vec<Arena>>,
    allocator: Mutex<Allocator>,
    eventfds: Vec<File>,
}

impl VfioUserDevice {
    /// Connects to the vfio-user server at `path` with default options and sets the
    /// device up (see the module documentation).
    ///
    /// # Errors
    /// [`AccessError::InvalidRequest`] naming what failed: the connection, a command the
    /// server refused, a device that is not an rnic-style PCI function, an OS call.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, AccessError> {
        Self::connect_with(path, VfioUserOptions::default())
    }

    /// [`connect`](Self::connect) with explicit options.
    ///
    /// # Errors
    /// As for [`connect`](Self::connect).
    pub fn connect_with(path: impl AsRef<Path>, options: VfioUserOptions) -> Result<Self, AccessError> {
        let path = path.as_ref().to_path_buf();
        let fail = |what: &str, error: &dyn std::fmt::Display| AccessError::InvalidRequest {
            reason: format!("vfio-user {}: {what}: {error}", path.display()),
        };
        let stream = UnixStream::connect(&path).map_err(|e| fail("connect", &e))?;
        stream
            .set_read_timeout(Some(options.reply_timeout))
            .and_then(|()| stream.set_write_timeout(Some(options.reply_timeout)))
            .map_err(|e| fail("socket timeouts", &e))?;
        let mut connection = Connection {
            stream: Some(stream),
            next_id: 1,
            last_error: None,
        };

        // VERSION: 0.0 with our receive limits; the server's limits bound what we send.
        let mut version = vec![0, 0, 0, 0];
        version.extend_from_slice(CLIENT_CAPS.as_bytes());
        version.push(0);
        let reply = connection
            .request(command::VERSION, &version, &[])
            .map_err(|e| fail("VERSION", &e))?;
        if reply.payload.len() < 4 || le16(&reply.payload, 0) != 0 {
            return Err(fail("VERSION", &"the server does not speak version 0.x"));
        }
        let json = String::from_utf8_lossy(&reply.payload[4..]);
        let json = json.trim_end_matches('\0');
        let max_transfer = json_u64(json, "max_data_xfer_size")
            .unwrap_or(1 << 20)
            .clamp(8, 1 << 20) as u32;
        let max_fds = json_u64(json, "max_msg_fds").unwrap_or(1).clamp(1, 16) as usize;

        // DEVICE_GET_INFO.
        let reply = connection
            .request(command::DEVICE_GET_INFO, &words(&[16, 0, 0, 0]), &[])
            .map_err(|e| fail("DEVICE_GET_INFO", &e))?;
        if reply.payload.len() < 16 {
            return Err(fail("DEVICE_GET_INFO", &"short reply"));
        }
        let (flags, num_regions) = (le32(&reply.payload, 4), le32(&reply.payload, 8));
        if flags & DEVICE_FLAG_PCI == 0 || num_regions <= CONFIG_REGION {
            return Err(fail(
                "DEVICE_GET_INFO",
                &format!("not a PCI device (flags {flags:#x}, {num_regions} regions)"),
            ));
        }

        // GET_REGION_INFO for the BARs we use and configuration space.
        let mut regions = [RegionSummary::default(); 8];
        let mut doorbells = None;
        for index in [0u32, 2, 4, CONFIG_REGION] {
            let (summary, payload, fds) =
                Self::region_info(&mut connection, index).map_err(|e| fail("GET_REGION_INFO", &e))?;
            regions[index as usize] = summary;
            if index == u32::from(regs::DOORBELL_BAR) && summary.flags & REGION_FLAG_MMAP != 0 {
                doorbells = Self::map_doorbells(&payload, fds).map_err(|e| fail("doorbell pages", &e))?;
            }
        }
        if regions[0].size == 0 || regions[CONFIG_REGION as usize].size == 0 {
            return Err(fail("GET_REGION_INFO", &"no BAR 0 or configuration space"));
        }

        // MSI-X: one eventfd per vector.
        let reply = connection
            .request(command::DEVICE_GET_IRQ_INFO, &words(&[16, 0, MSIX_IRQ_INDEX, 0]), &[])
            .map_err(|e| fail("GET_IRQ_INFO", &e))?;
        if reply.payload.len() < 16 {
            return Err(fail("GET_IRQ_INFO", &"short reply"));
        }
        let vectors = le32(&reply.payload, 12).min(2048);
        let eventfds: Vec<File> = (0..vectors)
            .map(|_| os::eventfd().map(File::from))
            .collect::<io::Result<_>>()
            .map_err(|e| fail("eventfd", &e))?;
        // The server wants exactly `count` descriptors per SET_IRQS and at most its
        // max_msg_fds per message: wire the vectors in batches.
        for (batch, chunk) in eventfds.chunks(max_fds).enumerate() {
            let start = (batch * max_fds) as u32;
            let fds: Vec<BorrowedFd<'_>> = chunk.iter().map(AsFd::as_fd).collect();
            let payload = words(&[
                20,
                IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER,
                MSIX_IRQ_INDEX,
                start,
                chunk.len() as u32,
            ]);
            connection
                .request(command::DEVICE_SET_IRQS, &payload, &fds)
                .map_err(|e| fail("SET_IRQS", &e))?;
        }
        tracing::info!(
            target: "rnic_verbs::vfio_user",
            path = %path.display(),
            vectors,
            doorbell_pages_mapped = doorbells.as_ref().map_or(0, |(m, _): &(MappedRegion, u64)| m.len() / PAGE as usize),
            "vfio-user device attached"
        );
        Ok(Self {
            path,
            options,
            connection: Mutex::new(connection),
            max_transfer,
            regions,
            doorbells,
            arenas: RwLock::new(Vec::new()),
            allocator: Mutex::new(Allocator {
                pool: DmaPool::default(),
                next_iova: DMA_BASE,
            }),
            eventfds,
        })
    }

    /// GET_REGION_INFO, asking again with the argsz the server needs when the capability
    /// chain did not fit.
    fn region_info(
        connection: &mut Connection,
        index: u32,
    ) -> Result<(RegionSummary, Vec<u8>, Vec<OwnedFd>), RequestError> {
        let mut argsz = 32u32;
        for _ in 0..2 {
            let mut request = words(&[argsz, 0, index, 0]);
            request.extend_from_slice(&[0; 16]);
            let reply = connection.request(command::DEVICE_GET_REGION_INFO, &request, &[])?;
            if reply.payload.len() < 32 {
                return Err(connection.broken("short GET_REGION_INFO reply".into()));
            }
            let needed = le32(&reply.payload, 0);
            let flags = le32(&reply.payload, 4);
            let summary = RegionSummary {
                size: le64(&reply.payload, 16),
                flags,
            };
            if needed > argsz && flags & REGION_FLAG_CAPS == 0 && needed <= 4096 {
                argsz = needed;
                continue;
            }
            return Ok((summary, reply.payload, reply.fds));
        }
        Err(connection.broken("GET_REGION_INFO argsz did not converge".into()))
    }

    /// Maps the first sparse-mmap area of the doorbell BAR (or the whole region when
    /// there is no capability) from the fd of the reply.
    fn map_doorbells(payload: &[u8], mut fds: Vec<OwnedFd>) -> io::Result<Option<(MappedRegion, u64)>> {
        let Some(fd) = fds.pop() else { return Ok(None) };
        let flags = le32(payload, 4);
        let cap_offset = le32(payload, 12) as usize;
        let size = le64(payload, 16);
        let file_offset = le64(payload, 24);
        let mut area = (0, size);
        if flags & REGION_FLAG_CAPS != 0 && cap_offset != 0 {
            let mut at = cap_offset;
            // Walk the chain (bounded) for the sparse-mmap capability.
            for _ in 0..16 {
                let Some(head) = payload.get(at..at + 16) else { break };
                if le16(head, 0) == CAP_SPARSE_MMAP {
                    let count = le32(head, 8) as usize;
                    area = match payload.get(at + 16..at + 32) {
                        Some(first) if count > 0 => (le64(first, 0), le64(first, 8)),
                        _ => (0, 0),
                    };
                    break;
                }
                let next = le32(head, 4) as usize;
                if next == 0 || next <= at {
                    break;
                }
                at = next;
            }
        }
        if area.1 == 0 || area.0 % PAGE != 0 || area.1 % PAGE != 0 {
            return Ok(None);
        }
        let offset = file_offset + area.0;
        // The mapping is used from its first byte: the file offset must be page aligned.
        if offset & (os::host_page_size() - 1) != 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let map = MappedRegion::map(fd.as_fd(), offset, area.1 as usize, Protection::READ_WRITE)?;
        Ok(Some((map, area.0)))
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options the device was connected with.
    pub fn options(&self) -> &VfioUserOptions {
        &self.options
    }

    /// Whether the connection is still usable.
    pub fn is_connected(&self) -> bool {
        lock(&self.connection).stream.is_some()
    }

    /// Why the connection broke, if it did.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.connection).last_error.clone()
    }

    /// Number of MSI-X vectors wired to eventfds.
    pub fn vectors(&self) -> usize {
        self.eventfds.len()
    }

    /// Whether the doorbell pages are mapped (doorbells bypass the socket).
    pub fn doorbells_mapped(&self) -> bool {
        self.doorbells.is_some()
    }

    /// Size and flags of region `index` (0..8) as the server reported them (zero for
    /// regions not asked about).
    pub fn region(&self, index: u32) -> RegionSummary {
        self.regions.get(index as usize).copied().unwrap_or_default()
    }

    /// Bytes of memfd-backed DMA memory mapped to the server.
    pub fn dma_memory_mapped(&self) -> u64 {
        lock(&self.allocator).pool.mapped
    }

    /// Driver DMA buffers currently allocated.
    pub fn dma_buffers_in_use(&self) -> usize {
        lock(&self.allocator).pool.buffers_in_use()
    }

    /// Application buffers currently registered.
    pub fn user_registrations_in_use(&self) -> usize {
        lock(&self.allocator).pool.registrations_in_use()
    }

    fn region_read(&self, region: u32, offset: u64, out: &mut [u8]) -> bool {
        let mut connection = lock(&self.connection);
        for (i, chunk) in out.chunks_mut(self.max_transfer as usize).enumerate() {
            let at = offset + (i * self.max_transfer as usize) as u64;
            let count = chunk.len() as u32;
            match connection.request(command::REGION_READ, &region_access(at, region, count), &[]) {
                Ok(reply) if reply.payload.len() == 16 + chunk.len() => chunk.copy_from_slice(&reply.payload[16..]),
                Ok(reply) => {
                    connection.broken(format!("REGION_READ reply of {} bytes", reply.payload.len()));
                    return false;
                }
                Err(error) => {
                    if let RequestError::Errno(_) = error {
                        rnic_diag::warn!(rnic_diag::global(), crate::diag::REGION_ACCESS_REFUSED, region, offset = at, count, %error, "region read refused");
                    }
                    return false;
                }
            }
        }
        true
    }

    fn region_write(&self, region: u32, offset: u64, data: &[u8]) {
        let mut connection = lock(&self.connection);
        for (i, chunk) in data.chunks(self.max_transfer as usize).enumerate() {
            let at = offset + (i * self.max_transfer as usize) as u64;
            let mut payload = region_access(at, region, chunk.len() as u32);
            payload.extend_from_slice(chunk);
            match connection.request(command::REGION_WRITE, &payload, &[]) {
                Ok(_) => {}
                Err(RequestError::Errno(errno)) => {
                    let error = RequestError::Errno(errno);
                    rnic_diag::warn!(rnic_diag::global(), crate::diag::REGION_ACCESS_REFUSED, region, offset = at, %error, "region write refused");
                }
                // Already logged when the connection broke.
                Err(RequestError::Broken(_)) => return,
            }
        }
    }

    /// The doorbell mapping and the offset inside it, when `offset..offset+8` of BAR 2
    /// is mapped.
    fn doorbell_slot(&self, bar: u8, offset: u64) -> Option<(&MappedRegion, usize)> {
        if bar != regs::DOORBELL_BAR || offset & 7 != 0 {
            return None;
        }
        let (map, start) = self.doorbells.as_ref()?;
        let inside = offset.checked_sub(*start)?;
        (inside + 8 <= map.len() as u64).then_some((map, inside as usize))
    }

    /// Whether the connection is known to be broken. Never waits for the socket lock (a
    /// request in progress means the connection was fine when it started).
    fn gone(&self) -> bool {
        self.connection.try_lock().is_ok_and(|c| c.stream.is_none())
    }

    /// Stores a doorbell into the mapped page once the device has taken the previous one.
    fn ring(&self, map: &MappedRegion, offset: usize, value: u64) {
        if value == 0 {
            // A zero doorbell is a no-op for the device and cannot be told from "taken".
            return;
        }
        let deadline = Instant::now() + DOORBELL_TIMEOUT;
        let mut spins = 0u32;
        loop {
            // Look before the compare-and-swap: a locked operation on a word the device
            // has not cleared yet would only bounce the cache line between processes.
            if map.load_u64(offset) == Some(0) {
                match map.compare_exchange_u64(offset, 0, value) {
                    Some(Ok(())) | None => return,
                    Some(Err(_)) => {}
                }
            }
            spins += 1;
            if spins & 63 == 0 {
                // A server that is gone never takes the word: do not wait for it.
                if self.gone() || Instant::now() >= deadline {
                    tracing::error!(
                        target: "rnic_verbs::vfio_user",
                        offset,
                        "the device did not take the previous doorbell: dropping this one"
                    );
                    return;
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Adds an arena of at least `size` bytes (a multiple of the arena size) and
    /// DMA_MAPs it. Called with the allocator locked.
    fn grow(&self, allocator: &mut Allocator, size: u64) -> Result<(), AccessError> {
        let length = size.next_multiple_of(ARENA_SIZE);
        if allocator.pool.mapped + length > MAX_DMA_MEMORY {
            return Err(AccessError::OutOfMemory {
                size: size as usize,
                align: PAGE as usize,
            });
        }
        let unavailable = |what: &str, error: &dyn std::fmt::Display| AccessError::InvalidRequest {
            reason: format!("DMA arena of {length:#x} bytes: {what}: {error}"),
        };
        let fd = os::memfd_create("rnic-verbs-dma", length, true).map_err(|e| unavailable("memfd", &e))?;
        let map = MappedRegion::map(fd.as_fd(), 0, length as usize, Protection::READ_WRITE)
            .map_err(|e| unavailable("mmap", &e))?;
        let iova = allocator.next_iova;
        let mut payload = words(&[32, DMA_READ_WRITE]);
        for v in [0u64, iova, length] {
            payload.extend_from_slice(&v.to_le_bytes());
        }
        lock(&self.connection)
            .request(command::DMA_MAP, &payload, &[fd.as_fd()])
            .map_err(|e| unavailable("DMA_MAP", &e))?;
        // Our descriptor can go: the server has its own, and the mapping keeps the file.
        drop(fd);
        allocator.next_iova = (iova + length + ARENA_GAP).next_multiple_of(ARENA_GAP);
        allocator.pool.mapped += length;
        allocator.pool.space.give_back(iova, length);
        self.arenas
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arena { iova, map });
        Ok(())
    }

    /// Takes `size` bytes aligned to `align` from the arenas, growing them if needed.
    fn carve(&self, allocator: &mut Allocator, size: u64, align: u64) -> Result<u64, AccessError> {
        if let Some(address) = allocator.pool.space.take(size, align) {
            return Ok(address);
        }
        self.grow(allocator, size + align)?;
        allocator.pool.space.take(size, align).ok_or(AccessError::OutOfMemory {
            size: size as usize,
            align: align as usize,
        })
    }

    fn with_arena<R>(
        &self,
        address: u64,
        len: usize,
        f: impl FnOnce(&MappedRegion, usize) -> R,
    ) -> Result<R, AccessError> {
        let arenas = self.arenas.read().unwrap_or_else(|e| e.into_inner());
        arenas
            .iter()
            .find_map(|arena| arena.contains(address, len).map(|offset| (&arena.map, offset)))
            .map(|(map, offset)| f(map, offset))
            .ok_or_else(|| AccessError::Unmapped {
                address,
                length: len,
                reason: "not inside a DMA arena of this vfio-user client".into(),
            })
    }

    fn eventfd_set(&self) -> Vec<BorrowedFd<'_>> {
        self.eventfds.iter().map(AsFd::as_fd).collect()
    }
}

impl DeviceAccess for VfioUserDevice {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        if !self.region_read(CONFIG_REGION, u64::from(offset), data) {
            data.fill(0xFF);
        }
    }

    fn config_write(&self, offset: u16, data: &[u8]) {
        self.region_write(CONFIG_REGION, u64::from(offset), data);
    }

    fn mmio_read32(&self, bar: u8, offset: u64) -> u32 {
        let mut b = [0xFFu8; 4];
        if !self.region_read(u32::from(bar), offset, &mut b) {
            return u32::MAX;
        }
        u32::from_le_bytes(b)
    }

    fn mmio_write32(&self, bar: u8, offset: u64, value: u32) {
        // 32-bit halves of a doorbell must not go through the mapped page: the device
        // takes whole non-zero words, so it could take the low half alone. Trapped, the
        // model assembles them as on hardware.
        self.region_write(u32::from(bar), offset, &value.to_le_bytes());
    }

    fn mmio_write64(&self, bar: u8, offset: u64, value: u64) {
        match self.doorbell_slot(bar, offset) {
            Some((map, at)) => self.ring(map, at, value),
            None => self.region_write(u32::from(bar), offset, &value.to_le_bytes()),
        }
    }

    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError> {
        let (rounded, align) = check_dma_request(size, align, ARENA_SIZE, &"the arena size")?;
        let mut allocator = lock(&self.allocator);
        let address = self.carve(&mut allocator, rounded, align)?;
        // Freed memory is reused: hand it out zeroed, as the trait promises.
        if let Err(error) = self.with_arena(address, rounded as usize, |map, at| map.zero(at, rounded as usize)) {
            allocator.pool.space.give_back(address, rounded);
            return Err(error);
        }
        Ok(allocator.pool.record_buffer(address, rounded, size))
    }

    fn free_dma(&self, buffer: DmaBuffer) {
        if !lock(&self.allocator).pool.release_buffer(&buffer) {
            tracing::error!(target: "rnic_verbs::vfio_user", ?buffer, "free_dma of an unknown buffer");
        }
    }

    fn dma_read(&self, address: u64, out: &mut [u8]) -> Result<(), AccessError> {
        self.with_arena(address, out.len(), |map, at| map.read_at(at, out))
            .map(|_| ())
    }

    fn dma_write(&self, address: u64, data: &[u8]) -> Result<(), AccessError> {
        self.with_arena(address, data.len(), |map, at| map.write_at(at, data))
            .map(|_| ())
    }

    fn register_user_memory(&self, bytes: Vec<u8>) -> Result<UserMemory, AccessError> {
        if bytes.is_empty() {
            return Err(AccessError::InvalidRequest {
                reason: "an empty application buffer".into(),
            });
        }
        let length = bytes.len();
        let size = (length as u64).next_multiple_of(PAGE);
        let mut allocator = lock(&self.allocator);
        // One run inside one arena, so the bytes go in (and later out) with one copy.
        let address = self.carve(&mut allocator, size, PAGE)?;
        let copied = self.with_arena(address, size as usize, |map, at| {
            map.write_at(at, &bytes);
            map.zero(at + length, size as usize - length);
        });
        if let Err(error) = copied {
            allocator.pool.space.give_back(address, size);
            return Err(error);
        }
        Ok(allocator.pool.record_registration(vec![(address, size)], bytes))
    }

    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8> {
        let mut allocator = lock(&self.allocator);
        let Some(mut registration) = allocator.pool.take_registration(&memory) else {
            tracing::error!(target: "rnic_verbs::vfio_user", ?memory, "unregister of an unknown application buffer");
            return Vec::new();
        };
        // The arena pages hold what the device wrote: copy them back into the
        // application's own Vec (one run, see `register_user_memory`).
        if let Some(&(address, _)) = registration.runs.first() {
            let _ = self.with_arena(address, registration.bytes.len(), |map, at| {
                map.read_at(at, &mut registration.bytes)
            });
        }
        allocator.pool.release_runs(&registration.runs);
        registration.bytes
    }

    fn delay(&self, nanoseconds: u64) {
        if self.gone() {
            // Nothing the driver polls for can change any more: let its poll budgets run
            // out at once instead of sleeping through them (a dead device's command
            // queue times out in microseconds rather than tens of milliseconds).
            return;
        }
        wall_clock_delay(nanoseconds);
    }

    fn poll_interrupts(&self) -> Vec<u16> {
        let mut fired = Vec::new();
        for (vector, fd) in self.eventfds.iter().enumerate() {
            // An eventfd counts signals; keep repeats (bounded, the driver only needs to
            // know a vector fired).
            let count = os::take_eventfd(fd).min(16);
            fired.extend((0..count).map(|_| vector as u16));
        }
        fired
    }

    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16> {
        let deadline = Instant::now() + Duration::from_nanos(timeout_ns);
        let fds = self.eventfd_set();
        // ppoll here takes at most 64 descriptors; with more vectors (the driver uses a
        // handful) the rest are looked at every millisecond.
        let watched = &fds[..fds.len().min(64)];
        let slice = if fds.len() > 64 {
            Duration::from_millis(1)
        } else {
            Duration::MAX
        };
        loop {
            let fired = self.poll_interrupts();
            let now = Instant::now();
            // A dead server raises nothing any more: as for `delay`, do not wait.
            if !fired.is_empty() || watched.is_empty() || now >= deadline || self.gone() {
                return fired;
            }
            if os::wait_readable(watched, (deadline - now).min(slice)).is_err() {
                // ppoll itself failed (cannot happen with valid descriptors): do not spin.
                std::thread::sleep((deadline - now).min(Duration::from_millis(1)));
            }
        }
    }

    fn idle(&self) {
        std::thread::yield_now();
    }

    fn mac_address(&self) -> Option<[u8; 6]> {
        Some(self.options.mac_address)
    }
}

impl Drop for VfioUserDevice {
    fn drop(&mut self) {
        let arenas = std::mem::take(&mut *self.arenas.write().unwrap_or_else(|e| e.into_inner()));
        let mut connection = lock(&self.connection);
        for arena in &arenas {
            let mut payload = words(&[24, 0]);
            payload.extend_from_slice(&arena.iova.to_le_bytes());
            payload.extend_from_slice(&(arena.map.len() as u64).to_le_bytes());
            if connection.stream.is_none() {
                break;
            }
            if let Err(error) = connection.request(command::DMA_UNMAP, &payload, &[]) {
                tracing::debug!(target: "rnic_verbs::vfio_user", %error, "DMA_UNMAP on close failed");
            }
        }
        // The mappings go after the server has let go of them; closing the socket tells
        // the server to drop whatever is left (eventfds).
        connection.stream = None;
        drop(connection);
        drop(arenas);
    }
}

/// Parses a MAC address written as six colon-separated hex bytes.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers_and_macs_parse() {
        let json = r#"{"capabilities":{"max_msg_fds": 16,"max_data_xfer_size":1048576}}"#;
        assert_eq!(json_u64(json, "max_msg_fds"), Some(16));
        assert_eq!(json_u64(json, "max_data_xfer_size"), Some(1 << 20));
        assert_eq!(json_u64(json, "pgsizes"), None);
        assert_eq!(parse_mac("02:52:4e:49:43:01"), Some(DEFAULT_MAC));
        assert_eq!(parse_mac("02:52:4e:49:43"), None);
        assert_eq!(parse_mac("02:52:4e:49:43:01:00"), None);
    }

    #[test]
    fn a_missing_socket_is_an_error() {
        let error = VfioUserDevice::connect("/nonexistent/rnic.sock").unwrap_err();
        assert!(matches!(error, AccessError::InvalidRequest { .. }), "{error}");
    }
}
