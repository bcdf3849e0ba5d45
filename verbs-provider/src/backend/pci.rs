//! The Linux PCI backend: the driver runs in user space on an rnic PCI function that no
//! kernel driver is bound to — inside a QEMU guest whose `vfio-user-pci` device is served
//! by `rnic-emu serve`, or on bare metal with real hardware. Everything goes through
//! sysfs and ordinary memory; it needs root.
//!
//! * **Discovery** ([`PciDevice::open`]): `pci` takes the first function (in address
//!   order) under `/sys/bus/pci/devices` whose `vendor`/`device` files carry our IDs
//!   ([`pci::DEFAULT_VENDOR_ID`]:[`pci::DEFAULT_DEVICE_ID`]); `pci:DDDD:BB:DD.F` names
//!   one. The sysfs root is an option ([`PciOptions::sysfs_root`]) so tests can build a
//!   fake tree.
//! * **Configuration space** is the function's sysfs `config` file (`pread`/`pwrite`;
//!   past the first 64 bytes the kernel wants `CAP_SYS_ADMIN`). Opening checks the IDs in
//!   it and sets memory-space decoding and bus mastering in the command register — with
//!   no kernel driver bound, nobody else does. Dropping the device clears bus mastering
//!   before the DMA memory is unmapped, so a device that is still running cannot write
//!   into pages the kernel has handed to someone else.
//! * **BARs** are the `resourceN` files, mapped `MAP_SHARED`. Every register access is
//!   one volatile, naturally aligned 32- or 64-bit load or store
//!   ([`rnic_os::MappedRegion::read_volatile_u32`] and friends). Under QEMU the mapped
//!   doorbell pages of BAR 2 are shared memory the emulator polls, so doorbells follow
//!   the rule of `docs/guides/emulator.md` ("The one rule for the mapped page"): wait
//!   until the register reads 0, then store the doorbell as one 64-bit store. A lock
//!   makes wait-and-store one step for all threads of this process (a compare-and-swap,
//!   as the vfio-user backend uses on its memfd, is not a PCI transaction). Hardware, or
//!   a trapped page, reads 0 at once.
//! * **No interrupts**: nothing in user space can receive an MSI-X message. The backend
//!   keeps every vector masked (each vector-control word the driver writes into the
//!   MSI-X table is stored with the mask bit set), so the device never sends a message to
//!   an address no one handles; [`DeviceAccess::poll_interrupts`] reports nothing and
//!   [`DeviceAccess::wait_interrupt`] sleeps its whole timeout. Completions and events are
//!   found by polling the queues: the driver's event waits are cut into slices (100 µs
//!   for the mailbox, 10 ms for completion channels), and each slice ends with a poll.
//! * **DMA memory** must be pinned, and the device must be told its bus address. With no
//!   IOMMU between the device and memory (a guest without a virtual IOMMU, whose
//!   guest-physical addresses QEMU DMA-maps to the emulator one to one, or bare metal
//!   with the IOMMU off or in passthrough) the bus address is the physical address, which
//!   `/proc/self/pagemap` tells root ([`rnic_os::PageMap`]). The backend maps 2 MiB
//!   hugetlb pages ([`HUGE_PAGE_SIZE`], `MAP_HUGETLB`, populated and `mlock`ed; the
//!   administrator reserves them in `/proc/sys/vm/nr_hugepages`), one at a time as needed,
//!   and serves [`DeviceAccess::allocate_dma`] first-fit from their physical address
//!   ranges. A hugetlb page is physically contiguous, so any buffer up to 2 MiB is; a
//!   larger one (rnic-bench's buffers for messages of 128 KiB and more, up to 64 MiB)
//!   needs huge pages that happen to be physically adjacent. Adjacent pages merge into one
//!   free range, so the backend keeps mapping pages until a run is long enough; if the
//!   pool runs out first, the request fails with an error naming the longest run found
//!   (and the pages it mapped for the attempt go back to the pool). Huge pages reserved
//!   early on a fresh system are usually adjacent.
//! * **Application memory**: [`DeviceAccess::register_user_memory`] moves the `Vec` in
//!   and copies its bytes into 4 KiB pages of the same pinned memory (anywhere, not
//!   contiguous) and reports each page's physical address, as the vfio-user backend does
//!   with its memfd arenas; [`DeviceAccess::unregister_user_memory`] copies them back.
//!   [`DeviceAccess::register_application_memory`] registers the application's own
//!   memory **in place** (`ibv_reg_mr` of the drop-in library), as DPDK and SPDK do
//!   without an IOMMU: the range is locked with `mlock` (resident, never swapped) and
//!   each 4 KiB page is translated through `/proc/self/pagemap`; the device then reads
//!   and writes the application's bytes. `mlock` does not count: when one of two
//!   overlapping registrations goes, the pages the other still covers are locked again.
//!   Caveats of the method (shared with DPDK): the kernel may still migrate a locked page
//!   (compaction: `vm.compact_unevictable_allowed=0` forbids it; huge pages are never
//!   compacted), and after `fork` a copy-on-write fault moves the writer's page.
//! * **Time** is the wall clock: [`DeviceAccess::delay`] sleeps (spins for short waits),
//!   [`DeviceAccess::idle`] yields.
//! * **Failures**: a configuration-space access that fails reads all ones and is logged;
//!   an access to a BAR that is not mapped reads all ones and is dropped, as PCI does for
//!   a missing device. Nothing panics.
//!
//! A process killed while the device runs leaves bus mastering on: the next process to
//! open the function resets it (the driver's bring-up does) before using it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rnic_firmware_if::{pci, regs};
use rnic_os::{MappedRegion, PageMap, PageSize, Protection};

use super::dma_pool::{check_dma_request, DmaPool, Registration};
use super::{lock, wall_clock_delay};
use crate::device_access::{AccessError, ApplicationRange, DeviceAccess, DmaBuffer, UserMemory, USER_PAGE_SIZE};

/// Where Linux lists PCI functions.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys/bus/pci/devices";
/// The size of the hugetlb pages DMA memory is made of.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// Most pinned memory the backend maps by default ([`PciOptions::max_dma_memory`]).
pub const MAX_DMA_MEMORY: u64 = 4 << 30;
/// How long a doorbell waits for the device to take the previous one of the same
/// register before it is dropped (bounds a dead or stuck device only).
pub const DOORBELL_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest alignment `allocate_dma` honours (the driver asks for at most 2 MiB).
const MAX_ALIGN: u64 = 1 << 30;
const PAGE: u64 = USER_PAGE_SIZE as u64;
/// The standard configuration header every function has.
const CONFIG_HEADER_SIZE: usize = 64;
/// BARs of a type-0 function.
const BAR_COUNT: usize = 6;
/// Byte offset of the vector-control word inside an MSI-X table entry.
const MSIX_VECTOR_CONTROL: u64 = 12;

/// Why a PCI function could not be opened or its DMA memory grown.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// `pci:ADDRESS` is not `DDDD:BB:DD.F` (or `BB:DD.F`).
    #[error("bad PCI address {0:?}: expected DDDD:BB:DD.F, e.g. 0000:00:03.0")]
    BadAddress(String),
    /// No function under the sysfs root carries our IDs.
    #[error("no PCI function {vendor:04x}:{device:04x} among the {looked_at} under {root}")]
    NotFound {
        /// The sysfs directory searched.
        root: PathBuf,
        /// Vendor ID looked for.
        vendor: u16,
        /// Device ID looked for.
        device: u16,
        /// How many functions were looked at.
        looked_at: usize,
    },
    /// The named function does not exist.
    #[error("no PCI function {address} under {root}")]
    NoSuchFunction {
        /// The sysfs directory searched.
        root: PathBuf,
        /// The function asked for.
        address: String,
    },
    /// The function is not an rnic.
    #[error(
        "PCI function {address} is {found_vendor:04x}:{found_device:04x}, not an rnic ({vendor:04x}:{device:04x})"
    )]
    WrongIds {
        /// The function.
        address: String,
        /// Its vendor ID.
        found_vendor: u16,
        /// Its device ID.
        found_device: u16,
        /// The vendor ID expected.
        vendor: u16,
        /// The device ID expected.
        device: u16,
    },
    /// The configuration file is shorter than the standard header.
    #[error("{path}: configuration space of {length} bytes, the header alone has 64")]
    ShortConfig {
        /// The config file.
        path: PathBuf,
        /// Bytes it had.
        length: usize,
    },
    /// Memory decoding or bus mastering did not stick in the command register.
    #[error("{path}: command register reads {value:#06x} after enabling memory space and bus mastering")]
    CommandNotEnabled {
        /// The config file.
        path: PathBuf,
        /// What the register read back.
        value: u16,
    },
    /// A BAR the driver needs has no mappable `resourceN` file.
    #[error("{path}: BAR {bar} is missing or empty (the driver needs BARs 0 and 2)")]
    MissingBar {
        /// The resource file.
        path: PathBuf,
        /// The BAR.
        bar: u8,
    },
    /// A file of the function could not be read, written or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// DMA memory could not be pinned or translated.
    #[error("DMA memory: {0}")]
    Dma(String),
}

impl From<PciError> for AccessError {
    fn from(error: PciError) -> Self {
        AccessError::InvalidRequest {
            reason: error.to_string(),
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> PciError + '_ {
    move |source| PciError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Options of [`PciDevice::open_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciOptions {
    /// The directory listing PCI functions ([`DEFAULT_SYSFS_ROOT`]).
    pub sysfs_root: PathBuf,
    /// The port's MAC address. Nothing on the PCI function reports it (a real NIC's
    /// netdev would), so it must match the emulator's `--mac`.
    pub mac_address: [u8; 6],
    /// Most pinned DMA memory the backend maps, in bytes.
    pub max_dma_memory: u64,
}

impl Default for PciOptions {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from(DEFAULT_SYSFS_ROOT),
            mac_address: super::vfio_user::DEFAULT_MAC,
            max_dma_memory: MAX_DMA_MEMORY,
        }
    }
}

/// Which function [`PciDevice::open_with`] opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PciSelector {
    /// The first function with our vendor and device IDs.
    First,
    /// The function at this address (`DDDD:BB:DD.F`).
    Address(String),
}

impl PciSelector {
    /// Parses `DDDD:BB:DD.F`, or `BB:DD.F` for domain 0000, into a selector.
    ///
    /// # Errors
    /// [`PciError::BadAddress`].
    pub fn address(text: &str) -> Result<Self, PciError> {
        let bad = || PciError::BadAddress(text.to_string());
        let full = if text.len() == 7 {
            format!("0000:{text}")
        } else {
            text.to_string()
        };
        let (domain, rest) = full.split_once(':').ok_or_else(bad)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (slot, function) = rest.split_once('.').ok_or_else(bad)?;
        let hex = |s: &str, digits: usize| s.len() == digits && s.bytes().all(|b| b.is_ascii_hexdigit());
        let slot_ok = hex(slot, 2) && u8::from_str_radix(slot, 16).is_ok_and(|s| s < 32);
        let function_ok = function.len() == 1 && function.bytes().all(|b| (b'0'..=b'7').contains(&b));
        if !(hex(domain, 4) && hex(bus, 2) && slot_ok && function_ok) {
            return Err(bad());
        }
        // sysfs names functions in lower case.
        Ok(PciSelector::Address(full.to_ascii_lowercase()))
    }
}

/// Reads a sysfs ID file (`0x1234\n`).
fn read_id(path: &Path) -> Option<u16> {
    let text = std::fs::read_to_string(path).ok()?;
    u16::from_str_radix(text.trim().strip_prefix("0x")?, 16).ok()
}

/// Finds the function's sysfs directory.
fn find_function(root: &Path, selector: &PciSelector) -> Result<(String, PathBuf), PciError> {
    let (vendor, device) = (pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
    match selector {
        PciSelector::Address(address) => {
            let dir = root.join(address);
            if !dir.is_dir() {
                return Err(PciError::NoSuchFunction {
                    root: root.to_path_buf(),
                    address: address.clone(),
                });
            }
            Ok((address.clone(), dir))
        }
        PciSelector::First => {
            let mut names: Vec<String> = std::fs::read_dir(root)
                .map_err(io_error(root))?
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            let looked_at = names.len();
            names
                .into_iter()
                .find(|name| {
                    let dir = root.join(name);
                    read_id(&dir.join("vendor")) == Some(vendor) && read_id(&dir.join("device")) == Some(device)
                })
                .map(|name| {
                    let dir = root.join(&name);
                    (name, dir)
                })
                .ok_or_else(|| PciError::NotFound {
                    root: root.to_path_buf(),
                    vendor,
                    device,
                    looked_at,
                })
        }
    }
}

/// Where the MSI-X table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MsixTable {
    bar: u8,
    offset: u64,
    entries: u64,
}

/// Where pinned, physically contiguous chunks of DMA memory come from.
trait ChunkSource: Send + Sync + std::fmt::Debug {
    /// Size of every chunk (a power of two, a multiple of 4 KiB).
    fn chunk_size(&self) -> u64;
    /// Maps one more chunk and returns it with the bus address of its first byte.
    fn next_chunk(&self) -> Result<(MappedRegion, u64), PciError>;
}

/// Production chunks: 2 MiB hugetlb pages, translated through `/proc/self/pagemap`.
#[derive(Debug)]
struct HugePages {
    pagemap: Mutex<Option<PageMap>>,
}

impl ChunkSource for HugePages {
    fn chunk_size(&self) -> u64 {
        HUGE_PAGE_SIZE
    }

    fn next_chunk(&self) -> Result<(MappedRegion, u64), PciError> {
        let map = MappedRegion::anonymous_locked(HUGE_PAGE_SIZE as usize, PageSize::Huge2M).map_err(|error| {
            PciError::Dma(format!(
                "no free 2 MiB huge page ({error}): reserve more in /proc/sys/vm/nr_hugepages \
                 (HugePages_Free in /proc/meminfo)"
            ))
        })?;
        let mut pagemap = lock(&self.pagemap);
        if pagemap.is_none() {
            *pagemap = Some(PageMap::open_self().map_err(io_error(Path::new("/proc/self/pagemap")))?);
        }
        let pagemap = pagemap.as_ref().expect("opened above");
        let translate = |at: usize| {
            pagemap
                .physical_address(map.virtual_address() + at)
                .map_err(|error| PciError::Dma(format!("/proc/self/pagemap: {error}")))
        };
        let first = translate(0)?;
        let last = translate(HUGE_PAGE_SIZE as usize - USER_PAGE_SIZE)?;
        // A hugetlb page is one physical block; anything else means the mapping is not
        // what we asked for, and DMA into it would land elsewhere.
        if first % HUGE_PAGE_SIZE != 0 || last != first + HUGE_PAGE_SIZE - PAGE {
            return Err(PciError::Dma(format!(
                "huge page at physical {first:#x} is not one aligned 2 MiB block (last 4 KiB at {last:#x})"
            )));
        }
        Ok((map, first))
    }
}

/// An rnic PCI function driven from user space through sysfs. See the module
/// documentation.
///
/// ```no_run
/// let device = rnic_verbs::backend::PciDevice::open("pci").expect("an rnic function, root, huge pages");
/// let context = rnic_verbs::Context::open(Box::new(device)).expect("bring-up");
/// ```
#[derive(Debug)]
pub struct PciDevice {
    address: String,
    config_path: PathBuf,
    config: File,
    options: PciOptions,
    bars: [Option<MappedRegion>; BAR_COUNT],
    msix: Option<MsixTable>,
    /// Makes a doorbell's wait-for-zero and store one step for this process.
    doorbell: Mutex<()>,
    source: Box<dyn ChunkSource>,
    /// Mapped chunks by bus address.
    chunks: RwLock<BTreeMap<u64, MappedRegion>>,
    /// Free physical ranges (physically adjacent chunks merge), buffers and registrations.
    pool: Mutex<DmaPool>,
    /// Application memory registered in place, locked with `mlock`.
    application: Mutex<ApplicationPins>,
}

/// The application ranges registered in place, by token, and the pagemap that
/// translated them.
#[derive(Debug, Default)]
struct ApplicationPins {
    pagemap: Option<PageMap>,
    next_token: u64,
    /// Token → (virtual address, length).
    ranges: BTreeMap<u64, (usize, usize)>,
}

/// Bus (physical) addresses of the 4 KiB pages that hold `address .. address + length`,
/// the first being the page of `address`: the translation of a locked range.
fn application_pages(pagemap: &PageMap, address: usize, length: usize) -> Result<Vec<u64>, PciError> {
    let end = address
        .checked_add(length)
        .ok_or_else(|| PciError::Dma(format!("{length} bytes at {address:#x} wrap the address space")))?;
    let first = address & !(USER_PAGE_SIZE - 1);
    (first..end)
        .step_by(USER_PAGE_SIZE)
        .map(|page| {
            pagemap
                .physical_address(page)
                .map_err(|error| PciError::Dma(format!("application page at {page:#x}: /proc/self/pagemap: {error}")))
        })
        .collect()
}

impl PciDevice {
    /// Opens a function from the part of a device string after `pci`: empty for the
    /// first rnic function, `:DDDD:BB:DD.F` for a given one, with the default options.
    ///
    /// # Errors
    /// [`PciError`] naming what is missing or wrong.
    pub fn open(spec: &str) -> Result<Self, PciError> {
        let selector = match spec.strip_prefix("pci") {
            Some("") => PciSelector::First,
            Some(rest) => PciSelector::address(rest.strip_prefix(':').unwrap_or(rest))?,
            None => return Err(PciError::BadAddress(spec.to_string())),
        };
        Self::open_with(&selector, PciOptions::default())
    }

    /// Opens the function `selector` picks, with `options` (see the module
    /// documentation). No DMA memory is mapped until the driver asks for some.
    ///
    /// # Errors
    /// [`PciError`] naming what is missing or wrong.
    pub fn open_with(selector: &PciSelector, options: PciOptions) -> Result<Self, PciError> {
        let source = Box::new(HugePages {
            pagemap: Mutex::new(None),
        });
        Self::open_with_source(selector, options, source)
    }

    fn open_with_source(
        selector: &PciSelector,
        options: PciOptions,
        source: Box<dyn ChunkSource>,
    ) -> Result<Self, PciError> {
        let (address, dir) = find_function(&options.sysfs_root, selector)?;
        let config_path = dir.join("config");
        let config = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&config_path)
            .map_err(io_error(&config_path))?;
        let mut header = [0u8; CONFIG_HEADER_SIZE];
        let length = read_fully(&config, &mut header, 0).map_err(io_error(&config_path))?;
        if length < CONFIG_HEADER_SIZE {
            return Err(PciError::ShortConfig {
                path: config_path,
                length,
            });
        }
        let word = |at: usize| u16::from_le_bytes([header[at], header[at + 1]]);
        let (found_vendor, found_device) = (word(pci::offset::VENDOR_ID), word(pci::offset::DEVICE_ID));
        if (found_vendor, found_device) != (pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID) {
            return Err(PciError::WrongIds {
                address,
                found_vendor,
                found_device,
                vendor: pci::DEFAULT_VENDOR_ID,
                device: pci::DEFAULT_DEVICE_ID,
            });
        }

        let bars = map_bars(&dir)?;
        let mut device = Self {
            address,
            config_path,
            config,
            options,
            bars,
            msix: None,
            doorbell: Mutex::new(()),
            source,
            chunks: RwLock::new(BTreeMap::new()),
            pool: Mutex::new(DmaPool::default()),
            application: Mutex::new(ApplicationPins::default()),
        };

        // No kernel driver enables the function: do it before the first BAR access.
        let command = pci::offset::COMMAND as u16;
        let enable = pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER;
        device.config_write16(command, device.config_read16(command) | enable);
        let value = device.config_read16(command);
        if value & enable != enable {
            return Err(PciError::CommandNotEnabled {
                path: device.config_path.clone(),
                value,
            });
        }
        device.msix = device.find_msix();
        tracing::info!(
            target: "rnic_verbs::pci",
            address = %device.address,
            bars = ?device.bars.iter().map(|b| b.as_ref().map_or(0, MappedRegion::len)).collect::<Vec<_>>(),
            msix = ?device.msix,
            "PCI function opened"
        );
        Ok(device)
    }

    /// The function's address (`DDDD:BB:DD.F`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The options the device was opened with.
    pub fn options(&self) -> &PciOptions {
        &self.options
    }

    /// Size of BAR `bar` as mapped (0 when it is not).
    pub fn bar_size(&self, bar: u8) -> usize {
        self.bar(bar).map_or(0, MappedRegion::len)
    }

    /// Bytes of pinned DMA memory mapped.
    pub fn dma_memory_mapped(&self) -> u64 {
        lock(&self.pool).mapped
    }

    /// Driver DMA buffers currently allocated.
    pub fn dma_buffers_in_use(&self) -> usize {
        lock(&self.pool).buffers_in_use()
    }

    /// Application buffers currently registered.
    pub fn user_registrations_in_use(&self) -> usize {
        lock(&self.pool).registrations_in_use()
    }

    fn bar(&self, bar: u8) -> Option<&MappedRegion> {
        self.bars.get(usize::from(bar))?.as_ref()
    }

    /// Walks the capability list (bounded, hostile-proof) for MSI-X.
    fn find_msix(&self) -> Option<MsixTable> {
        if self.config_read16(pci::offset::STATUS as u16) & pci::STATUS_CAPABILITIES_LIST == 0 {
            return None;
        }
        let mut at = u16::from(self.config_byte(pci::offset::CAPABILITIES_POINTER as u16) & !3);
        for _ in 0..48 {
            if !(CONFIG_HEADER_SIZE as u16..=0xFC).contains(&at) {
                return None;
            }
            let header = self.config_read16(at);
            if header & 0xFF == u16::from(pci::CAPABILITY_ID_MSIX) {
                let control = self.config_read16(at + 2);
                let table = self.config_read32(at + 4);
                return Some(MsixTable {
                    bar: (table & 7) as u8,
                    offset: u64::from(table & !7),
                    entries: u64::from(control & 0x7FF) + 1,
                });
            }
            at = (header >> 8) & 0xFC;
        }
        None
    }

    fn config_byte(&self, offset: u16) -> u8 {
        let mut b = [0u8];
        self.config_read(offset, &mut b);
        b[0]
    }

    /// Whether `offset` of `bar` is the vector-control word of an MSI-X table entry.
    fn is_vector_control(&self, bar: u8, offset: u64) -> bool {
        self.msix.is_some_and(|table| {
            bar == table.bar
                && offset.checked_sub(table.offset).is_some_and(|inside| {
                    inside < table.entries * regs::MSIX_ENTRY_SIZE && inside % 16 == MSIX_VECTOR_CONTROL
                })
        })
    }

    /// Stores a doorbell once the device has taken the previous one (see the module
    /// documentation).
    fn ring(&self, map: &MappedRegion, offset: usize, value: u64) {
        let _serialised = lock(&self.doorbell);
        let deadline = Instant::now() + DOORBELL_TIMEOUT;
        let mut spins = 0u32;
        while map.read_volatile_u64(offset) != Some(0) {
            spins += 1;
            if spins & 63 == 0 {
                if Instant::now() >= deadline {
                    tracing::error!(
                        target: "rnic_verbs::pci",
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
        if !map.write_volatile_u64(offset, value) {
            rnic_diag::warn!(
                rnic_diag::global(),
                crate::diag::ACCESS_OUTSIDE_BAR,
                offset,
                "doorbell outside BAR 2 or unaligned: dropped"
            );
        }
    }

    /// Maps one more chunk into the pool. Called with the pool locked.
    fn grow(&self, pool: &mut DmaPool) -> Result<(u64, u64), PciError> {
        let size = self.source.chunk_size();
        if pool.mapped + size > self.options.max_dma_memory {
            return Err(PciError::Dma(format!(
                "the backend's limit of {} KiB of pinned memory is reached",
                self.options.max_dma_memory >> 10
            )));
        }
        let (map, bus) = self.source.next_chunk()?;
        self.chunks.write().unwrap_or_else(|e| e.into_inner()).insert(bus, map);
        pool.mapped += size;
        pool.space.give_back(bus, size);
        Ok((bus, size))
    }

    /// Unmaps chunks mapped for a request that failed (they are wholly free: the pool
    /// was locked all along).
    fn shrink(&self, pool: &mut DmaPool, added: &[(u64, u64)]) {
        let mut chunks = self.chunks.write().unwrap_or_else(|e| e.into_inner());
        for &(bus, size) in added {
            pool.space.withdraw(bus, size);
            chunks.remove(&bus);
            pool.mapped -= size;
        }
    }

    /// Takes `size` bytes at a multiple of `align` (both multiples of 4 KiB), mapping
    /// chunks until a long enough physically contiguous run exists.
    fn carve(&self, pool: &mut DmaPool, size: u64, align: u64) -> Result<u64, AccessError> {
        let mut added = Vec::new();
        loop {
            if let Some(address) = pool.space.take(size, align) {
                return Ok(address);
            }
            match self.grow(pool) {
                Ok(chunk) => added.push(chunk),
                Err(error) => {
                    let longest = pool.space.longest_free_run();
                    self.shrink(pool, &added);
                    let chunk = self.source.chunk_size();
                    let reason = if size + align.saturating_sub(PAGE) > chunk {
                        format!(
                            "{size} bytes (aligned to {align}) need physically adjacent {} KiB pages, \
                             and the longest run of them was {longest} bytes after mapping {} more ({error}); \
                             reserve huge pages early (at boot) or use smaller buffers",
                            chunk >> 10,
                            added.len(),
                        )
                    } else {
                        error.to_string()
                    };
                    tracing::error!(target: "rnic_verbs::pci", size, align, %reason, "DMA allocation failed");
                    return Err(AccessError::InvalidRequest { reason });
                }
            }
        }
    }

    /// Runs `f` on every (mapping, offset, part of the range) of `address..address+len`,
    /// which may cross chunks only where they are physically adjacent.
    fn for_each_piece(
        &self,
        address: u64,
        len: usize,
        mut f: impl FnMut(&MappedRegion, usize, std::ops::Range<usize>) -> bool,
    ) -> Result<(), AccessError> {
        let unmapped = |reason: &str| AccessError::Unmapped {
            address,
            length: len,
            reason: reason.into(),
        };
        let end = address
            .checked_add(len as u64)
            .ok_or_else(|| unmapped("range wraps around"))?;
        let chunks = self.chunks.read().unwrap_or_else(|e| e.into_inner());
        let mut at = address;
        while at < end {
            let (&bus, map) = chunks
                .range(..=at)
                .next_back()
                .filter(|(&bus, map)| at < bus + map.len() as u64)
                .ok_or_else(|| unmapped("not DMA memory of this PCI backend"))?;
            let piece_end = end.min(bus + map.len() as u64);
            let from = (at - address) as usize;
            let to = (piece_end - address) as usize;
            if !f(map, (at - bus) as usize, from..to) {
                return Err(unmapped("mapping refused the access"));
            }
            at = piece_end;
        }
        Ok(())
    }
}

/// Reads as much of `buffer` as the file has at `offset`.
fn read_fully(file: &File, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut have = 0;
    while have < buffer.len() {
        match file.read_at(&mut buffer[have..], offset + have as u64) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(have)
}

/// Maps every memory BAR that has a `resourceN` file; BARs 0 and 2 must be there.
fn map_bars(dir: &Path) -> Result<[Option<MappedRegion>; BAR_COUNT], PciError> {
    let mut bars: [Option<MappedRegion>; BAR_COUNT] = Default::default();
    for (index, slot) in bars.iter_mut().enumerate() {
        let path = dir.join(format!("resource{index}"));
        let required = index == usize::from(regs::CONTROL_BAR) || index == usize::from(regs::DOORBELL_BAR);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if size == 0 {
            if required {
                return Err(PciError::MissingBar { path, bar: index as u8 });
            }
            continue;
        }
        let mapped = OpenOptions::new().read(true).write(true).open(&path).and_then(|file| {
            let len = usize::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            MappedRegion::map(std::os::fd::AsFd::as_fd(&file), 0, len, Protection::READ_WRITE)
        });
        match mapped {
            Ok(map) => *slot = Some(map),
            Err(source) if required => return Err(PciError::Io { path, source }),
            // An I/O-port BAR or one the kernel will not map: the driver does not use it.
            Err(error) => tracing::warn!(target: "rnic_verbs::pci", path = %path.display(), %error, "BAR not mapped"),
        }
    }
    Ok(bars)
}

impl DeviceAccess for PciDevice {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        match read_fully(&self.config, data, u64::from(offset)) {
            Ok(n) if n == data.len() => {}
            result => {
                tracing::warn!(target: "rnic_verbs::pci", offset, len = data.len(), ?result, "configuration read failed");
                let n = result.unwrap_or(0);
                data[n..].fill(0xFF);
            }
        }
    }

    fn config_write(&self, offset: u16, data: &[u8]) {
        match self.config.write_at(data, u64::from(offset)) {
            Ok(n) if n == data.len() => {}
            result => {
                tracing::warn!(target: "rnic_verbs::pci", offset, len = data.len(), ?result, "configuration write failed")
            }
        }
    }

    fn mmio_read32(&self, bar: u8, offset: u64) -> u32 {
        self.bar(bar)
            .and_then(|map| map.read_volatile_u32(usize::try_from(offset).ok()?))
            .unwrap_or(u32::MAX)
    }

    fn mmio_write32(&self, bar: u8, offset: u64, mut value: u32) {
        if self.is_vector_control(bar, offset) {
            // Polling only: a message would go to an address no one handles.
            value |= pci::MSIX_VECTOR_MASKED;
        }
        let written = self
            .bar(bar)
            .zip(usize::try_from(offset).ok())
            .is_some_and(|(map, at)| map.write_volatile_u32(at, value));
        if !written {
            rnic_diag::warn!(
                rnic_diag::global(),
                crate::diag::ACCESS_OUTSIDE_BAR,
                bar,
                offset,
                "32-bit write outside a mapped BAR: dropped"
            );
        }
    }

    fn mmio_write64(&self, bar: u8, offset: u64, value: u64) {
        let Some((map, at)) = self.bar(bar).zip(usize::try_from(offset).ok()) else {
            rnic_diag::warn!(
                rnic_diag::global(),
                crate::diag::ACCESS_OUTSIDE_BAR,
                bar,
                offset,
                "64-bit write outside a mapped BAR: dropped"
            );
            return;
        };
        if bar == regs::DOORBELL_BAR && map.read_volatile_u64(at).is_some() {
            // A zero doorbell is a no-op for the device and cannot be told from "taken".
            if value != 0 {
                self.ring(map, at, value);
            }
        } else if !map.write_volatile_u64(at, value) {
            rnic_diag::warn!(
                rnic_diag::global(),
                crate::diag::ACCESS_OUTSIDE_BAR,
                bar,
                offset,
                "64-bit write outside a mapped BAR: dropped"
            );
        }
    }

    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError> {
        let (rounded, align) = check_dma_request(size, align, MAX_ALIGN, &MAX_ALIGN)?;
        let mut pool = lock(&self.pool);
        let address = self.carve(&mut pool, rounded, align)?;
        // Freed memory is reused: hand it out zeroed, as the trait promises.
        if let Err(error) = self.for_each_piece(address, rounded as usize, |map, at, range| map.zero(at, range.len())) {
            pool.space.give_back(address, rounded);
            return Err(error);
        }
        Ok(pool.record_buffer(address, rounded, size))
    }

    fn free_dma(&self, buffer: DmaBuffer) {
        if !lock(&self.pool).release_buffer(&buffer) {
            tracing::error!(target: "rnic_verbs::pci", ?buffer, "free_dma of an unknown buffer");
        }
    }

    fn dma_read(&self, address: u64, out: &mut [u8]) -> Result<(), AccessError> {
        self.for_each_piece(address, out.len(), |map, at, range| map.read_at(at, &mut out[range]))
    }

    fn dma_write(&self, address: u64, data: &[u8]) -> Result<(), AccessError> {
        self.for_each_piece(address, data.len(), |map, at, range| map.write_at(at, &data[range]))
    }

    fn register_user_memory(&self, bytes: Vec<u8>) -> Result<UserMemory, AccessError> {
        if bytes.is_empty() {
            return Err(AccessError::InvalidRequest {
                reason: "an empty application buffer".into(),
            });
        }
        let length = bytes.len();
        let pages = (length as u64).div_ceil(PAGE);
        let mut pool = lock(&self.pool);
        let mut added = Vec::new();
        let runs = loop {
            if let Some(runs) = pool.space.take_pages(pages) {
                break runs;
            }
            match self.grow(&mut pool) {
                Ok(chunk) => added.push(chunk),
                Err(error) => {
                    self.shrink(&mut pool, &added);
                    return Err(AccessError::InvalidRequest {
                        reason: format!("{pages} pages for an application buffer: {error}"),
                    });
                }
            }
        };
        let mut copied = 0;
        let mut result = Ok(());
        for &(address, size) in &runs {
            let take = (size as usize).min(length - copied);
            result = result
                .and_then(|()| self.dma_write(address, &bytes[copied..copied + take]))
                .and_then(|()| {
                    let tail = address + take as u64;
                    self.for_each_piece(tail, size as usize - take, |map, at, range| map.zero(at, range.len()))
                });
            copied += take;
        }
        if let Err(error) = result {
            pool.release_runs(&runs);
            return Err(error);
        }
        Ok(pool.record_registration(runs, bytes))
    }

    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8> {
        let mut pool = lock(&self.pool);
        let Some(Registration { runs, mut bytes }) = pool.take_registration(&memory) else {
            tracing::error!(target: "rnic_verbs::pci", ?memory, "unregister of an unknown application buffer");
            return Vec::new();
        };
        // The pages hold what the device wrote: copy them back into the application's Vec.
        let mut copied = 0;
        for &(address, size) in &runs {
            let take = (size as usize).min(bytes.len() - copied);
            if let Err(error) = self.dma_read(address, &mut bytes[copied..copied + take]) {
                tracing::error!(target: "rnic_verbs::pci", %error, "copying a registration back failed");
            }
            copied += take;
        }
        pool.release_runs(&runs);
        bytes
    }

    /// Locks the range (`mlock`) and translates its pages through `/proc/self/pagemap`
    /// (see the module documentation).
    fn register_application_memory(&self, range: Arc<ApplicationRange>) -> Result<UserMemory, AccessError> {
        let (address, length) = (range.address(), range.len());
        if length == 0 {
            return Err(AccessError::InvalidRequest {
                reason: "an empty application buffer".into(),
            });
        }
        rnic_os::lock_pages(address, length).map_err(|error| AccessError::InvalidRequest {
            reason: format!(
                "mlock of {length} bytes at {address:#x}: {error} (the locked-memory limit is \
                 `ulimit -l`; root has none)"
            ),
        })?;
        let mut pins = lock(&self.application);
        if pins.pagemap.is_none() {
            match PageMap::open_self() {
                Ok(pagemap) => pins.pagemap = Some(pagemap),
                Err(error) => {
                    rnic_os::unlock_pages(address, length);
                    return Err(io_error(Path::new("/proc/self/pagemap"))(error).into());
                }
            }
        }
        let pages = application_pages(pins.pagemap.as_ref().expect("opened above"), address, length);
        let pages = match pages {
            Ok(pages) => pages,
            Err(error) => {
                rnic_os::unlock_pages(address, length);
                return Err(error.into());
            }
        };
        pins.next_token += 1;
        let token = pins.next_token;
        pins.ranges.insert(token, (address, length));
        Ok(UserMemory::new(pages, length, token))
    }

    fn unregister_application_memory(&self, memory: UserMemory) {
        let mut pins = lock(&self.application);
        let Some((address, length)) = pins.ranges.remove(&memory.token()) else {
            tracing::error!(target: "rnic_verbs::pci", ?memory, "unregister of application memory never registered");
            return;
        };
        rnic_os::unlock_pages(address, length);
        // mlock does not count: lock again what other registrations still cover.
        let end = address + length;
        for &(other, other_length) in pins.ranges.values() {
            if other < end && address < other + other_length {
                if let Err(error) = rnic_os::lock_pages(other, other_length) {
                    tracing::error!(target: "rnic_verbs::pci", %error, "re-locking an overlapping registration");
                }
            }
        }
    }

    fn delay(&self, nanoseconds: u64) {
        wall_clock_delay(nanoseconds);
    }

    fn poll_interrupts(&self) -> Vec<u16> {
        // Every vector is masked (see the module documentation): nothing ever fires.
        Vec::new()
    }

    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16> {
        // No interrupt can end the wait early; the caller polls its queues afterwards.
        self.delay(timeout_ns);
        Vec::new()
    }

    fn idle(&self) {
        std::thread::yield_now();
    }

    fn mac_address(&self) -> Option<[u8; 6]> {
        Some(self.options.mac_address)
    }
}

impl Drop for PciDevice {
    fn drop(&mut self) {
        // Stop the device's DMA before the pinned pages go back to the kernel.
        let command = pci::offset::COMMAND as u16;
        let value = self.config_read16(command);
        self.config_write16(command, value & !pci::COMMAND_BUS_MASTER);
        for &(address, length) in lock(&self.application).ranges.values() {
            rnic_os::unlock_pages(address, length);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys/bus/pci/devices` in a temporary directory, removed on drop.
    struct FakeSysfs {
        root: PathBuf,
    }

    impl FakeSysfs {
        fn new(name: &str) -> Self {
            let root = std::env::temp_dir().join(format!("rnic-pci-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            Self { root }
        }

        /// Adds a function with `vendor:device` in both the ID files and the config
        /// header, an MSI-X capability (table in BAR 4 at 0, 6 vectors), and BARs 0, 2
        /// and 4 as regular files.
        fn function(&self, address: &str, vendor: u16, device: u16) -> PathBuf {
            let dir = self.root.join(address);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
            std::fs::write(dir.join("device"), format!("0x{device:04x}\n")).unwrap();
            let mut config = vec![0u8; 256];
            config[0..2].copy_from_slice(&vendor.to_le_bytes());
            config[2..4].copy_from_slice(&device.to_le_bytes());
            config[6..8].copy_from_slice(&pci::STATUS_CAPABILITIES_LIST.to_le_bytes());
            config[0x34] = 0x40;
            config[0x40] = pci::CAPABILITY_ID_PCIE;
            config[0x41] = 0x80;
            config[0x80] = pci::CAPABILITY_ID_MSIX;
            config[0x82..0x84].copy_from_slice(&5u16.to_le_bytes());
            config[0x84..0x88].copy_from_slice(&u32::from(regs::MSIX_BAR).to_le_bytes());
            std::fs::write(dir.join("config"), config).unwrap();
            for (bar, size) in [(0, regs::BAR0_SIZE), (2, 0x4000), (4, regs::MSIX_BAR_SIZE)] {
                let file = File::create(dir.join(format!("resource{bar}"))).unwrap();
                file.set_len(size).unwrap();
            }
            dir
        }

        fn options(&self) -> PciOptions {
            PciOptions {
                sysfs_root: self.root.clone(),
                ..PciOptions::default()
            }
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// Test chunks: memfd memory with bus addresses the test chooses, so contiguity
    /// is under the test's control (nothing here depends on the host's huge pages).
    #[derive(Debug)]
    struct ScriptedChunks {
        size: u64,
        addresses: Mutex<std::collections::VecDeque<u64>>,
    }

    impl ChunkSource for ScriptedChunks {
        fn chunk_size(&self) -> u64 {
            self.size
        }

        fn next_chunk(&self) -> Result<(MappedRegion, u64), PciError> {
            let bus = lock(&self.addresses)
                .pop_front()
                .ok_or_else(|| PciError::Dma("scripted pool exhausted".into()))?;
            // Plain shared memory: nothing here needs it pinned, so the tests need no
            // RLIMIT_MEMLOCK headroom.
            let fd =
                rnic_os::memfd_create("rnic-pci-test", self.size, false).map_err(|e| PciError::Dma(e.to_string()))?;
            let map = MappedRegion::map(
                std::os::fd::AsFd::as_fd(&fd),
                0,
                self.size as usize,
                Protection::READ_WRITE,
            )
            .map_err(|e| PciError::Dma(e.to_string()))?;
            Ok((map, bus))
        }
    }

    const CHUNK: u64 = 64 << 10;

    fn scripted(addresses: &[u64]) -> Box<dyn ChunkSource> {
        Box::new(ScriptedChunks {
            size: CHUNK,
            addresses: Mutex::new(addresses.iter().copied().collect()),
        })
    }

    fn open_scripted(sysfs: &FakeSysfs, addresses: &[u64]) -> PciDevice {
        PciDevice::open_with_source(&PciSelector::First, sysfs.options(), scripted(addresses)).unwrap()
    }

    fn config_bytes(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join("config")).unwrap()
    }

    #[test]
    fn addresses_parse_strictly() {
        assert_eq!(
            PciSelector::address("0000:00:03.0").unwrap(),
            PciSelector::Address("0000:00:03.0".into())
        );
        assert_eq!(
            PciSelector::address("01:1F.7").unwrap(),
            PciSelector::Address("0000:01:1f.7".into()),
            "short form, lower-cased as sysfs names it"
        );
        for bad in [
            "",
            "0000:00:03",
            "0000:00:03.8",
            "0000:00:20.0",
            "000:00:03.0",
            "0000:0g:03.0",
            "../x/y:00.0",
        ] {
            assert!(
                matches!(PciSelector::address(bad), Err(PciError::BadAddress(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn discovery_takes_the_first_function_with_our_ids_and_enables_it() {
        let sysfs = FakeSysfs::new("discovery");
        sysfs.function("0000:00:01.0", 0x8086, 0x100e);
        let ours = sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        sysfs.function("0000:00:05.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let device = PciDevice::open_with(&PciSelector::First, sysfs.options()).unwrap();
        assert_eq!(device.address(), "0000:00:04.0");
        let command = u16::from_le_bytes(config_bytes(&ours)[4..6].try_into().unwrap());
        assert_eq!(
            command & (pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER),
            pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER
        );
        assert_eq!(device.bar_size(0), regs::BAR0_SIZE as usize);
        assert_eq!(device.bar_size(2), 0x4000);
        assert_eq!(device.bar_size(4), regs::MSIX_BAR_SIZE as usize);
        assert_eq!(device.bar_size(1), 0);
        assert_eq!(
            device.msix,
            Some(MsixTable {
                bar: regs::MSIX_BAR,
                offset: 0,
                entries: 6
            })
        );
        assert_eq!(device.dma_memory_mapped(), 0, "no DMA memory before the driver asks");
        assert_eq!(device.mac_address(), Some(super::super::vfio_user::DEFAULT_MAC));
        drop(device);
        let command = u16::from_le_bytes(config_bytes(&ours)[4..6].try_into().unwrap());
        assert_eq!(command & pci::COMMAND_BUS_MASTER, 0, "bus mastering off after close");
        assert_ne!(command & pci::COMMAND_MEMORY_SPACE, 0);
    }

    #[test]
    fn a_named_function_opens_and_a_missing_one_is_an_error() {
        let sysfs = FakeSysfs::new("named");
        sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        sysfs.function("0000:00:06.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let named = PciSelector::address("0000:00:06.0").unwrap();
        assert_eq!(
            PciDevice::open_with(&named, sysfs.options()).unwrap().address(),
            "0000:00:06.0"
        );
        let missing = PciSelector::address("0000:00:07.0").unwrap();
        let error = PciDevice::open_with(&missing, sysfs.options()).unwrap_err();
        assert!(matches!(error, PciError::NoSuchFunction { .. }), "{error}");

        let empty = FakeSysfs::new("empty");
        empty.function("0000:00:01.0", 0x8086, 0x100e);
        let error = PciDevice::open_with(&PciSelector::First, empty.options()).unwrap_err();
        assert!(matches!(error, PciError::NotFound { looked_at: 1, .. }), "{error}");
        let no_root = PciOptions {
            sysfs_root: empty.root.join("absent"),
            ..PciOptions::default()
        };
        let error = PciDevice::open_with(&PciSelector::First, no_root).unwrap_err();
        assert!(matches!(error, PciError::Io { .. }), "{error}");
    }

    #[test]
    fn wrong_ids_short_config_and_missing_bars_are_refused() {
        let sysfs = FakeSysfs::new("refused");
        sysfs.function("0000:00:01.0", 0x8086, 0x100e);
        let other = PciSelector::address("0000:00:01.0").unwrap();
        let error = PciDevice::open_with(&other, sysfs.options()).unwrap_err();
        assert!(
            matches!(
                error,
                PciError::WrongIds {
                    found_vendor: 0x8086,
                    found_device: 0x100e,
                    ..
                }
            ),
            "{error}"
        );

        let short = sysfs.function("0000:00:02.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        std::fs::write(short.join("config"), &config_bytes(&short)[..63]).unwrap();
        let error = PciDevice::open_with(&PciSelector::address("00:02.0").unwrap(), sysfs.options()).unwrap_err();
        assert!(matches!(error, PciError::ShortConfig { length: 63, .. }), "{error}");

        let no_doorbells = sysfs.function("0000:00:03.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        std::fs::remove_file(no_doorbells.join("resource2")).unwrap();
        let error = PciDevice::open_with(&PciSelector::address("00:03.0").unwrap(), sysfs.options()).unwrap_err();
        assert!(matches!(error, PciError::MissingBar { bar: 2, .. }), "{error}");

        let empty_bar = sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        File::create(empty_bar.join("resource0")).unwrap();
        let error = PciDevice::open_with(&PciSelector::address("00:04.0").unwrap(), sysfs.options()).unwrap_err();
        assert!(matches!(error, PciError::MissingBar { bar: 0, .. }), "{error}");
    }

    #[test]
    fn bar_accesses_reach_the_resource_files_and_vectors_stay_masked() {
        let sysfs = FakeSysfs::new("bars");
        let dir = sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let device = open_scripted(&sysfs, &[]);
        let bar0 = || std::fs::read(dir.join("resource0")).unwrap();
        let bar2 = || std::fs::read(dir.join("resource2")).unwrap();
        let bar4 = || std::fs::read(dir.join("resource4")).unwrap();

        device.mmio_write32(0, 0x40, 0x1234_5678);
        assert_eq!(bar0()[0x40..0x44], 0x1234_5678u32.to_le_bytes());
        assert_eq!(device.mmio_read32(0, 0x40), 0x1234_5678);

        // A doorbell is one 64-bit store into BAR 2, once the register reads 0.
        device.mmio_write64(regs::DOORBELL_BAR, 0x1230, 0xAABB_CCDD_0011_2233);
        assert_eq!(bar2()[0x1230..0x1238], 0xAABB_CCDD_0011_2233u64.to_le_bytes());
        // The "device" takes it; the next one goes in.
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("resource2"))
            .unwrap()
            .write_at(&[0; 8], 0x1230)
            .unwrap();
        device.mmio_write64(regs::DOORBELL_BAR, 0x1230, 7);
        assert_eq!(bar2()[0x1230..0x1238], 7u64.to_le_bytes());

        // MSI-X: the address and data go in as written, the vector control is masked.
        device.mmio_write32(regs::MSIX_BAR, 16, 0xFEE0_0000);
        device.mmio_write32(regs::MSIX_BAR, 16 + 8, 1);
        device.mmio_write32(regs::MSIX_BAR, 16 + MSIX_VECTOR_CONTROL, 0);
        let table = bar4();
        assert_eq!(table[16..20], 0xFEE0_0000u32.to_le_bytes());
        assert_eq!(table[24..28], 1u32.to_le_bytes());
        assert_eq!(table[28..32], pci::MSIX_VECTOR_MASKED.to_le_bytes());
        // Past the 6-entry table (the PBA, say) nothing is rewritten.
        device.mmio_write32(regs::MSIX_BAR, 6 * 16 + MSIX_VECTOR_CONTROL, 0);
        assert_eq!(bar4()[6 * 16 + 12..6 * 16 + 16], [0; 4]);

        // Out of range, unaligned and unmapped BARs read all ones and drop writes.
        assert_eq!(device.mmio_read32(0, regs::BAR0_SIZE), u32::MAX);
        assert_eq!(device.mmio_read32(0, 0x41), u32::MAX);
        assert_eq!(device.mmio_read32(1, 0), u32::MAX);
        assert_eq!(device.mmio_read32(9, 0), u32::MAX);
        device.mmio_write32(3, 0, 1);
        device.mmio_write64(0, u64::MAX, 1);
        let start = Instant::now();
        device.mmio_write64(regs::DOORBELL_BAR, 0x4000, 1);
        device.mmio_write64(regs::DOORBELL_BAR, 0x1234, 1);
        assert!(
            start.elapsed() < DOORBELL_TIMEOUT / 2,
            "no wait for a doorbell that cannot be stored"
        );
        assert_eq!(bar2()[0x1230..0x1240], [7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(device.poll_interrupts(), Vec::<u16>::new());
        let start = Instant::now();
        assert_eq!(device.wait_interrupt(2_000_000), Vec::<u16>::new());
        assert!(start.elapsed() >= Duration::from_millis(2), "waits the whole timeout");
    }

    #[test]
    fn configuration_space_goes_through_the_config_file() {
        let sysfs = FakeSysfs::new("config");
        let dir = sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let device = open_scripted(&sysfs, &[]);
        assert_eq!(device.config_read16(0), pci::DEFAULT_VENDOR_ID);
        assert_eq!(device.config_read16(2), pci::DEFAULT_DEVICE_ID);
        device.config_write32(0x90, 0xCAFE_F00D);
        assert_eq!(config_bytes(&dir)[0x90..0x94], 0xCAFE_F00Du32.to_le_bytes());
        // The fake file ends at 256 bytes: reads past it are all ones, as on a bus error.
        let mut tail = [0u8; 4];
        device.config_read(254, &mut tail);
        assert_eq!(tail, [0, 0, 0xFF, 0xFF]);
    }

    #[test]
    fn dma_buffers_are_zeroed_aligned_and_may_span_adjacent_chunks() {
        let sysfs = FakeSysfs::new("dma");
        sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        // Chunks 2 and 3 are physically adjacent (in descending order, as a kernel free
        // list may hand them out); chunk 1 stands alone.
        let device = open_scripted(&sysfs, &[0x10_0000, 0x30_0000 + CHUNK, 0x30_0000]);
        let small = device.allocate_dma(100, 4096).unwrap();
        assert_eq!(small.address(), 0x10_0000);
        assert_eq!(device.dma_memory_mapped(), CHUNK);
        device.dma_write(small.address() + 90, &[9; 10]).unwrap();

        // Larger than one chunk: only the adjacent pair can hold it.
        let big = device.allocate_dma(CHUNK as usize + 4096, 8192).unwrap();
        assert_eq!(big.address(), 0x30_0000);
        assert_eq!(device.dma_memory_mapped(), 3 * CHUNK);
        let pattern: Vec<u8> = (0..big.len()).map(|i| (i % 251) as u8).collect();
        device.dma_write(big.address(), &pattern).unwrap();
        let mut back = vec![0u8; pattern.len()];
        device.dma_read(big.address(), &mut back).unwrap();
        assert_eq!(back, pattern, "bytes cross the chunk boundary intact");

        // Freed memory comes back zeroed.
        device.free_dma(small);
        let again = device.allocate_dma(100, 4096).unwrap();
        assert_eq!(again.address(), 0x10_0000);
        let mut out = [0xFFu8; 100];
        device.dma_read(again.address(), &mut out).unwrap();
        assert_eq!(out, [0; 100]);
        assert_eq!(device.dma_buffers_in_use(), 2);

        // Outside the chunks, or wrapping around: errors, not panics.
        assert!(matches!(
            device.dma_read(0x20_0000, &mut [0; 4]),
            Err(AccessError::Unmapped { .. })
        ));
        assert!(matches!(
            device.dma_write(0x10_0000 + CHUNK - 2, &[0; 4]),
            Err(AccessError::Unmapped { .. })
        ));
        assert!(matches!(
            device.dma_read(u64::MAX - 1, &mut [0; 4]),
            Err(AccessError::Unmapped { .. })
        ));
        assert!(matches!(
            device.allocate_dma(0, 4096),
            Err(AccessError::InvalidRequest { .. })
        ));
        assert!(matches!(
            device.allocate_dma(8, 3000),
            Err(AccessError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn a_buffer_larger_than_any_adjacent_run_fails_clearly_and_gives_the_pages_back() {
        let sysfs = FakeSysfs::new("contiguous");
        sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let device = open_scripted(&sysfs, &[0x10_0000, 0x30_0000, 0x50_0000, 0x70_0000]);
        let kept = device.allocate_dma(4096, 4096).unwrap();
        let error = device.allocate_dma(2 * CHUNK as usize, 4096).unwrap_err();
        let AccessError::InvalidRequest { reason } = &error else {
            panic!("{error}")
        };
        assert!(reason.contains("physically adjacent"), "{reason}");
        assert!(
            reason.contains(&format!("longest run of them was {CHUNK} bytes")),
            "{reason}"
        );
        assert_eq!(
            device.dma_memory_mapped(),
            CHUNK,
            "the chunks mapped for the attempt are unmapped"
        );
        device.dma_write(kept.address(), &[1; 4096]).unwrap();
        assert!(device.dma_read(0x30_0000, &mut [0; 8]).is_err(), "unmapped again");
    }

    #[test]
    fn the_pinned_memory_limit_is_an_error() {
        let sysfs = FakeSysfs::new("limit");
        sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let options = PciOptions {
            max_dma_memory: CHUNK,
            ..sysfs.options()
        };
        let device =
            PciDevice::open_with_source(&PciSelector::First, options, scripted(&[0x10_0000, 0x20_0000])).unwrap();
        device.allocate_dma(CHUNK as usize, 4096).unwrap();
        let error = device.allocate_dma(4096, 4096).unwrap_err();
        assert!(error.to_string().contains("limit"), "{error}");
    }

    /// The production chunks on this host: with free huge pages (HugePages_Free in
    /// /proc/meminfo) a chunk is one aligned 2 MiB physical block, zero-filled, and two
    /// chunks do not overlap; without any, the error says how to get them. Run it with
    /// `echo 8 > /proc/sys/vm/nr_hugepages` to see the first case on a host that has none.
    #[test]
    fn huge_page_chunks_are_aligned_physical_blocks_or_a_clear_error() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let free: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("HugePages_Free:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let source = HugePages {
            pagemap: Mutex::new(None),
        };
        if free < 2 {
            let error = source.next_chunk().and_then(|_| source.next_chunk()).unwrap_err();
            assert!(error.to_string().contains("nr_hugepages"), "{error}");
            return;
        }
        let (first, a) = source.next_chunk().unwrap();
        let (second, b) = source.next_chunk().unwrap();
        for (map, bus) in [(&first, a), (&second, b)] {
            assert_eq!(bus % HUGE_PAGE_SIZE, 0, "{bus:#x}");
            assert_ne!(bus, 0);
            assert_eq!(map.len() as u64, HUGE_PAGE_SIZE);
            let mut out = vec![0xFFu8; HUGE_PAGE_SIZE as usize];
            assert!(map.read_at(0, &mut out));
            assert!(out.iter().all(|&b| b == 0));
        }
        assert!(a.abs_diff(b) >= HUGE_PAGE_SIZE, "{a:#x} and {b:#x} overlap");
    }

    #[test]
    fn user_memory_is_copied_into_scattered_pages_and_back() {
        let sysfs = FakeSysfs::new("user");
        sysfs.function("0000:00:04.0", pci::DEFAULT_VENDOR_ID, pci::DEFAULT_DEVICE_ID);
        let device = open_scripted(&sysfs, &[0x10_0000, 0x80_0000]);
        // Most of the first chunk is taken, so the registration spills into the second.
        let hog = device.allocate_dma(CHUNK as usize - 2 * 4096, 4096).unwrap();
        let bytes: Vec<u8> = (0..5 * 4096 + 10).map(|i| (i % 241) as u8).collect();
        let memory = device.register_user_memory(bytes.clone()).unwrap();
        assert_eq!(memory.len(), bytes.len());
        let pages = memory.pages().to_vec();
        assert_eq!(pages.len(), 6);
        assert_eq!(pages[0], 0x10_0000 + CHUNK - 2 * 4096);
        assert_eq!(pages[2], 0x80_0000, "the pages need not be contiguous");
        for (i, &page) in pages.iter().enumerate() {
            let mut out = vec![0u8; 4096];
            device.dma_read(page, &mut out).unwrap();
            let start = i * 4096;
            let end = bytes.len().min(start + 4096);
            assert_eq!(out[..end - start], bytes[start..end], "page {i}");
            assert!(out[end - start..].iter().all(|&b| b == 0), "page {i} tail zeroed");
        }
        // The "device" writes into the last page; the application gets it back.
        device.dma_write(pages[5] + 2, b"dev").unwrap();
        assert_eq!(device.user_registrations_in_use(), 1);
        let back = device.unregister_user_memory(memory);
        assert_eq!(&back[5 * 4096 + 2..5 * 4096 + 5], b"dev");
        assert_eq!(back[..5 * 4096], bytes[..5 * 4096]);
        assert_eq!(device.user_registrations_in_use(), 0);
        device.free_dma(hog);
        // Everything is free again: one whole chunk fits where the hog was.
        assert_eq!(device.allocate_dma(CHUNK as usize, 4096).unwrap().address(), 0x10_0000);
        assert!(matches!(
            device.register_user_memory(Vec::new()),
            Err(AccessError::InvalidRequest { .. })
        ));
    }

    /// A stand-in for `/proc/self/pagemap`: `frames[i]` is the entry of virtual page
    /// `first_page + i` (0: not present).
    fn fake_pagemap(name: &str, first_page: u64, frames: &[u64]) -> (PathBuf, PageMap) {
        let path = std::env::temp_dir().join(format!("rnic-pagemap-{name}-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        for (i, &frame) in frames.iter().enumerate() {
            let entry = if frame == 0 {
                0
            } else {
                rnic_os::PAGEMAP_PRESENT | frame
            };
            file.write_all_at(&entry.to_le_bytes(), (first_page + i as u64) * 8)
                .unwrap();
        }
        let pagemap = PageMap::open(&path).unwrap();
        (path, pagemap)
    }

    #[test]
    fn application_memory_pages_are_the_frames_of_every_page_it_touches() {
        if rnic_os::host_page_size() != PAGE {
            return; // the stand-in has one entry per 4 KiB page
        }
        let (path, pagemap) = fake_pagemap("touches", 0x100, &[0x7_0001, 0x3_0002, 0x9_0003, 0x1]);
        // 8 KiB starting 100 bytes into page 0x100 touch pages 0x100, 0x101 and 0x102.
        let pages = application_pages(&pagemap, 0x100 * 4096 + 100, 8192).unwrap();
        assert_eq!(pages, vec![0x7_0001 * PAGE, 0x3_0002 * PAGE, 0x9_0003 * PAGE]);
        // One byte at the end of a page: that page only.
        assert_eq!(
            application_pages(&pagemap, 0x102 * 4096 + 4095, 1).unwrap(),
            vec![0x9_0003 * PAGE]
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn application_memory_with_a_page_not_in_ram_is_refused_naming_the_page() {
        if rnic_os::host_page_size() != PAGE {
            return;
        }
        let (path, pagemap) = fake_pagemap("absent", 0x200, &[0x5_0000, 0]);
        let error = application_pages(&pagemap, 0x200 * 4096, 8192).unwrap_err().to_string();
        assert!(error.contains(&format!("{:#x}", 0x201 * 4096)), "{error}");
        let error = application_pages(&pagemap, usize::MAX - 10, 100)
            .unwrap_err()
            .to_string();
        assert!(error.contains("wrap"), "{error}");
        std::fs::remove_file(path).unwrap();
    }

    /// The real thing on this process's own heap: locked, every page has a frame (as
    /// root; otherwise the kernel hides frame numbers and registration says so).
    #[test]
    fn locked_application_memory_translates_through_this_process_pagemap() {
        let buffer = vec![0x5Au8; 3 * USER_PAGE_SIZE];
        let (address, length) = (buffer.as_ptr() as usize, buffer.len());
        rnic_os::lock_pages(address, length).expect("mlock of 12 KiB");
        let pagemap = PageMap::open_self().unwrap();
        let result = application_pages(&pagemap, address, length);
        rnic_os::unlock_pages(address, length);
        match result {
            Ok(pages) => {
                let touched = (address + length - 1) / USER_PAGE_SIZE - address / USER_PAGE_SIZE + 1;
                assert_eq!(pages.len(), touched);
                assert!(pages.iter().all(|&p| p != 0 && p % PAGE == 0), "{pages:x?}");
            }
            Err(error) => assert!(error.to_string().contains("CAP_SYS_ADMIN"), "{error}"),
        }
    }
}
