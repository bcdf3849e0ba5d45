//! The vfio-user wire format, written from the specification (QEMU
//! `docs/interop/vfio-user.rst`, formerly libvfio-user `docs/vfio-user.rst` 0.9.2) and
//! the kernel VFIO ABI it borrows its structures from. Host byte order (little-endian on
//! every platform the emulator runs on).
//!
//! The constants are defined here rather than taken from the `vfio_user` crate, whose
//! `DmaUnmapFlags` has the wrong bit values (`ALL` must be bit 1) and whose structures
//! come with `vm-memory`/`vmm-sys-util` dependencies we do not otherwise need.
//!
//! Every parser takes the payload (the bytes after the 16-byte header) and checks its
//! length; none of them can panic on any input.

use std::fmt;

/// Size of the message header in bytes.
pub const HEADER_SIZE: usize = 16;

/// Command numbers (header `command` field).
pub mod command {
    /// Version and capability negotiation; must be the first message.
    pub const VERSION: u16 = 1;
    /// Add a DMA region.
    pub const DMA_MAP: u16 = 2;
    /// Remove a DMA region.
    pub const DMA_UNMAP: u16 = 3;
    /// Device flags and region/IRQ counts.
    pub const DEVICE_GET_INFO: u16 = 4;
    /// One region's size, flags and capabilities (and its mmap fd).
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    /// ioeventfd/ioregionfd sub-regions (not supported: QEMU never sends it).
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    /// One IRQ index's count and flags.
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    /// Wire, mask, unmask or trigger interrupts.
    pub const DEVICE_SET_IRQS: u16 = 8;
    /// Read a region.
    pub const REGION_READ: u16 = 9;
    /// Write a region.
    pub const REGION_WRITE: u16 = 10;
    /// Server → client DMA read (never sent by this server; invalid from a client).
    pub const DMA_READ: u16 = 11;
    /// Server → client DMA write (never sent by this server; invalid from a client).
    pub const DMA_WRITE: u16 = 12;
    /// Reset the device.
    pub const DEVICE_RESET: u16 = 13;
    /// Removed with migration v1.
    pub const DIRTY_PAGES: u16 = 14;
    /// Coalesced small writes (only if the server advertised `write_multiple`).
    pub const REGION_WRITE_MULTI: u16 = 15;
    /// Migration v2 features.
    pub const DEVICE_FEATURE: u16 = 16;
    /// Migration v2 data read.
    pub const MIG_DATA_READ: u16 = 17;
    /// Migration v2 data write.
    pub const MIG_DATA_WRITE: u16 = 18;

    /// A human-readable name for logs.
    pub fn name(command: u16) -> &'static str {
        match command {
            VERSION => "VERSION",
            DMA_MAP => "DMA_MAP",
            DMA_UNMAP => "DMA_UNMAP",
            DEVICE_GET_INFO => "DEVICE_GET_INFO",
            DEVICE_GET_REGION_INFO => "DEVICE_GET_REGION_INFO",
            DEVICE_GET_REGION_IO_FDS => "DEVICE_GET_REGION_IO_FDS",
            DEVICE_GET_IRQ_INFO => "DEVICE_GET_IRQ_INFO",
            DEVICE_SET_IRQS => "DEVICE_SET_IRQS",
            REGION_READ => "REGION_READ",
            REGION_WRITE => "REGION_WRITE",
            DMA_READ => "DMA_READ",
            DMA_WRITE => "DMA_WRITE",
            DEVICE_RESET => "DEVICE_RESET",
            DIRTY_PAGES => "DIRTY_PAGES",
            REGION_WRITE_MULTI => "REGION_WRITE_MULTI",
            DEVICE_FEATURE => "DEVICE_FEATURE",
            MIG_DATA_READ => "MIG_DATA_READ",
            MIG_DATA_WRITE => "MIG_DATA_WRITE",
            _ => "unknown",
        }
    }
}

/// Header `flags` bits.
pub mod header_flags {
    /// Bits 0–3: message type.
    pub const TYPE_MASK: u32 = 0xF;
    /// Type 0: a command.
    pub const TYPE_COMMAND: u32 = 0;
    /// Type 1: a reply.
    pub const TYPE_REPLY: u32 = 1;
    /// Bit 4: the sender wants no reply (posted write).
    pub const NO_REPLY: u32 = 1 << 4;
    /// Bit 5: the reply reports an error (`errno` field).
    pub const ERROR: u32 = 1 << 5;
}

/// `DEVICE_GET_INFO` flags (`VFIO_DEVICE_FLAGS_*`).
pub mod device_flags {
    /// The device supports DEVICE_RESET.
    pub const RESET: u32 = 1 << 0;
    /// A PCI device (region and IRQ indices follow vfio-pci).
    pub const PCI: u32 = 1 << 1;
}

/// Region info flags (`VFIO_REGION_INFO_FLAG_*`).
pub mod region_flags {
    /// Readable through REGION_READ.
    pub const READ: u32 = 1 << 0;
    /// Writable through REGION_WRITE.
    pub const WRITE: u32 = 1 << 1;
    /// The reply carries an fd the client may mmap (at the region's `offset`).
    pub const MMAP: u32 = 1 << 2;
    /// A capability chain follows the structure.
    pub const CAPS: u32 = 1 << 3;
}

/// Region capability ids.
pub mod region_caps {
    /// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`: only the listed areas may be mmapped.
    pub const SPARSE_MMAP: u16 = 1;
    /// Version of the sparse-mmap capability.
    pub const SPARSE_MMAP_VERSION: u16 = 1;
}

/// PCI region indices (`VFIO_PCI_*_REGION_INDEX`).
pub mod region_index {
    /// Expansion ROM.
    pub const ROM: u32 = 6;
    /// Configuration space.
    pub const CONFIG: u32 = 7;
    /// Legacy VGA.
    pub const VGA: u32 = 8;
    /// Number of regions a vfio-pci device reports.
    pub const COUNT: u32 = 9;
}

/// PCI IRQ indices (`VFIO_PCI_*_IRQ_INDEX`).
pub mod irq_index {
    /// Legacy INTx.
    pub const INTX: u32 = 0;
    /// MSI.
    pub const MSI: u32 = 1;
    /// MSI-X.
    pub const MSIX: u32 = 2;
    /// Error notification.
    pub const ERR: u32 = 3;
    /// Device request notification.
    pub const REQ: u32 = 4;
    /// Number of IRQ indices a vfio-pci device reports.
    pub const COUNT: u32 = 5;
}

/// IRQ info flags (`VFIO_IRQ_INFO_*`).
pub mod irq_info_flags {
    /// Interrupts are signalled through eventfds.
    pub const EVENTFD: u32 = 1 << 0;
    /// Vectors can be masked and unmasked with SET_IRQS.
    pub const MASKABLE: u32 = 1 << 1;
    /// The device masks a vector when it fires (INTx style).
    pub const AUTOMASKED: u32 = 1 << 2;
    /// The vector set cannot be resized while enabled.
    pub const NORESIZE: u32 = 1 << 3;
}

/// SET_IRQS flags (`VFIO_IRQ_SET_*`).
pub mod irq_set_flags {
    /// No data: the action applies to every vector of the range.
    pub const DATA_NONE: u32 = 1 << 0;
    /// One byte per vector: the action applies where it is non-zero.
    pub const DATA_BOOL: u32 = 1 << 1;
    /// One eventfd per vector as ancillary data (none: de-assign).
    pub const DATA_EVENTFD: u32 = 1 << 2;
    /// Mask the vectors.
    pub const ACTION_MASK: u32 = 1 << 3;
    /// Unmask the vectors.
    pub const ACTION_UNMASK: u32 = 1 << 4;
    /// Trigger the vectors (DATA_NONE/BOOL) or wire their eventfds (DATA_EVENTFD).
    pub const ACTION_TRIGGER: u32 = 1 << 5;
    /// All data-type bits.
    pub const DATA_MASK: u32 = DATA_NONE | DATA_BOOL | DATA_EVENTFD;
    /// All action bits.
    pub const ACTION_MASK_ALL: u32 = ACTION_MASK | ACTION_UNMASK | ACTION_TRIGGER;
}

/// DMA_MAP flags.
pub mod dma_map_flags {
    /// The device may read the region.
    pub const READ: u32 = 1 << 0;
    /// The device may write the region.
    pub const WRITE: u32 = 1 << 1;
}

/// DMA_UNMAP flags. (The `vfio_user` crate 0.1.7 has these as 1<<1 and 1<<2: wrong.)
pub mod dma_unmap_flags {
    /// Return the dirty bitmap of the range (migration; not supported here).
    pub const GET_DIRTY_BITMAP: u32 = 1 << 0;
    /// Unmap every region; address and size must be 0.
    pub const ALL: u32 = 1 << 1;
}

/// An errno value for an error reply. Always one of the standard Linux values, never 0.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// Invalid argument: a malformed message or a value out of range.
    pub const EINVAL: Self = Self(libc::EINVAL);
    /// Argument list too long: a message or transfer above the negotiated limits.
    pub const E2BIG: Self = Self(libc::E2BIG);
    /// Operation not supported: a command or mode this server does not implement.
    pub const ENOTSUP: Self = Self(libc::EOPNOTSUPP);
    /// No such entry: DMA_UNMAP of a range that was never mapped.
    pub const ENOENT: Self = Self(libc::ENOENT);
    /// Exists: DMA_MAP over an existing mapping.
    pub const EEXIST: Self = Self(libc::EEXIST);
    /// No space: more DMA mappings than `max_dma_maps`.
    pub const ENOSPC: Self = Self(libc::ENOSPC);
    /// Bad file descriptor: an fd that cannot be used for what it was sent for.
    pub const EBADF: Self = Self(libc::EBADF);
    /// I/O error: a failure inside the server.
    pub const EIO: Self = Self(libc::EIO);

    /// The errno of an I/O error (EIO when it has none).
    pub fn from_io(error: &std::io::Error) -> Self {
        match error.raw_os_error() {
            Some(code) if code > 0 => Self(code),
            _ => Self::EIO,
        }
    }

    /// The value as sent in the header's errno field.
    pub fn code(self) -> u32 {
        self.0 as u32
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "errno {} ({})", self.0, std::io::Error::from_raw_os_error(self.0))
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The 16-byte message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Message id, echoed in the reply.
    pub id: u16,
    /// Command number.
    pub command: u16,
    /// Message size including the header.
    pub size: u32,
    /// Type, No_reply and Error bits.
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

impl Header {
    /// Decodes a header.
    pub fn decode(bytes: &[u8; HEADER_SIZE]) -> Self {
        Self {
            id: u16::from_le_bytes([bytes[0], bytes[1]]),
            command: u16::from_le_bytes([bytes[2], bytes[3]]),
            size: u32_at(bytes, 4),
            flags: u32_at(bytes, 8),
            error: u32_at(bytes, 12),
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..2].copy_from_slice(&self.id.to_le_bytes());
        out[2..4].copy_from_slice(&self.command.to_le_bytes());
        out[4..8].copy_from_slice(&self.size.to_le_bytes());
        out[8..12].copy_from_slice(&self.flags.to_le_bytes());
        out[12..16].copy_from_slice(&self.error.to_le_bytes());
        out
    }

    /// The message type (bits 0–3 of the flags).
    pub fn message_type(&self) -> u32 {
        self.flags & header_flags::TYPE_MASK
    }

    /// Whether the sender asked for no reply.
    pub fn no_reply(&self) -> bool {
        self.flags & header_flags::NO_REPLY != 0
    }

    /// The header of a successful reply to `self` with `payload_len` payload bytes.
    pub fn reply(&self, payload_len: usize) -> Self {
        Self {
            id: self.id,
            command: self.command,
            size: (HEADER_SIZE + payload_len) as u32,
            flags: header_flags::TYPE_REPLY,
            error: 0,
        }
    }

    /// The header of an error reply to `self` (an error reply carries only the header).
    pub fn error_reply(&self, errno: Errno) -> Self {
        Self {
            id: self.id,
            command: self.command,
            size: HEADER_SIZE as u32,
            flags: header_flags::TYPE_REPLY | header_flags::ERROR,
            error: errno.code(),
        }
    }
}

/// Little-endian u32 at `at` (caller checked the length).
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Little-endian u64 at `at` (caller checked the length).
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Requires exactly `len` payload bytes.
fn exact(payload: &[u8], len: usize) -> Result<(), Errno> {
    if payload.len() == len {
        Ok(())
    } else {
        Err(Errno::EINVAL)
    }
}

/// Requires an `argsz` of at least `min`.
fn argsz_at_least(argsz: u32, min: usize) -> Result<(), Errno> {
    if argsz as usize >= min {
        Ok(())
    } else {
        Err(Errno::EINVAL)
    }
}

/// VERSION payload: major, minor and the optional NUL-terminated JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version<'a> {
    /// Major version.
    pub major: u16,
    /// Minor version.
    pub minor: u16,
    /// The JSON text without its NUL, or `None` when the message carries none (the spec
    /// makes it optional; the `vfio_user` crate panics on this case).
    pub json: Option<&'a str>,
}

impl<'a> Version<'a> {
    /// Size of major + minor.
    pub const FIXED_SIZE: usize = 4;

    /// Parses a VERSION payload. The JSON, when present, must be valid UTF-8 terminated by
    /// exactly one NUL at the end of the message.
    pub fn parse(payload: &'a [u8]) -> Result<Self, Errno> {
        if payload.len() < Self::FIXED_SIZE {
            return Err(Errno::EINVAL);
        }
        let major = u16::from_le_bytes([payload[0], payload[1]]);
        let minor = u16::from_le_bytes([payload[2], payload[3]]);
        let rest = &payload[Self::FIXED_SIZE..];
        let json = match rest {
            [] | [0] => None,
            [text @ .., 0] if !text.contains(&0) => Some(std::str::from_utf8(text).map_err(|_| Errno::EINVAL)?),
            _ => return Err(Errno::EINVAL),
        };
        Ok(Self { major, minor, json })
    }

    /// Encodes a VERSION payload (with its NUL when `json` is given).
    pub fn encode(major: u16, minor: u16, json: Option<&str>) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::FIXED_SIZE + json.map_or(0, |j| j.len() + 1));
        out.extend_from_slice(&major.to_le_bytes());
        out.extend_from_slice(&minor.to_le_bytes());
        if let Some(json) = json {
            out.extend_from_slice(json.as_bytes());
            out.push(0);
        }
        out
    }
}

/// DMA_MAP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaMap {
    /// Size of the structure.
    pub argsz: u32,
    /// [`dma_map_flags`].
    pub flags: u32,
    /// Offset of the region in the attached file.
    pub offset: u64,
    /// Bus (IOVA) address of the region.
    pub address: u64,
    /// Size of the region in bytes.
    pub size: u64,
}

impl DmaMap {
    /// Size of the structure.
    pub const SIZE: usize = 32;

    /// Parses a DMA_MAP payload.
    pub fn parse(payload: &[u8]) -> Result<Self, Errno> {
        exact(payload, Self::SIZE)?;
        let map = Self {
            argsz: u32_at(payload, 0),
            flags: u32_at(payload, 4),
            offset: u64_at(payload, 8),
            address: u64_at(payload, 16),
            size: u64_at(payload, 24),
        };
        argsz_at_least(map.argsz, Self::SIZE)?;
        Ok(map)
    }

    /// Encodes the structure.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        out.extend_from_slice(&self.argsz.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.address.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out
    }
}

/// DMA_UNMAP payload (without the dirty-bitmap extension, which is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaUnmap {
    /// Size of the structure.
    pub argsz: u32,
    /// [`dma_unmap_flags`].
    pub flags: u32,
    /// Bus address of the region.
    pub address: u64,
    /// Size of the region.
    pub size: u64,
}

impl DmaUnmap {
    /// Size of the structure.
    pub const SIZE: usize = 24;

    /// Parses a DMA_UNMAP payload. A payload longer than the structure is accepted only
    /// with GET_DIRTY_BITMAP (whose bitmap descriptor follows); the caller rejects that
    /// flag.
    pub fn parse(payload: &[u8]) -> Result<Self, Errno> {
        if payload.len() < Self::SIZE {
            return Err(Errno::EINVAL);
        }
        let unmap = Self {
            argsz: u32_at(payload, 0),
            flags: u32_at(payload, 4),
            address: u64_at(payload, 8),
            size: u64_at(payload, 16),
        };
        if payload.len() > Self::SIZE && unmap.flags & dma_unmap_flags::GET_DIRTY_BITMAP == 0 {
            return Err(Errno::EINVAL);
        }
        argsz_at_least(unmap.argsz, Self::SIZE)?;
        Ok(unmap)
    }

    /// Encodes the structure (the DMA_UNMAP reply echoes it).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        out.extend_from_slice(&self.argsz.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.address.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out
    }
}

/// DEVICE_GET_INFO payload (`struct vfio_device_info` without the caps fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Size of the structure.
    pub argsz: u32,
    /// [`device_flags`].
    pub flags: u32,
    /// Number of regions.
    pub num_regions: u32,
    /// Number of IRQ indices.
    pub num_irqs: u32,
}

impl DeviceInfo {
    /// Size of the structure.
    pub const SIZE: usize = 16;

    /// Parses the request: argsz must leave room for the reply.
    pub fn parse_request(payload: &[u8]) -> Result<u32, Errno> {
        exact(payload, Self::SIZE)?;
        let argsz = u32_at(payload, 0);
        argsz_at_least(argsz, Self::SIZE)?;
        Ok(argsz)
    }

    /// Parses a reply.
    pub fn parse(payload: &[u8]) -> Result<Self, Errno> {
        exact(payload, Self::SIZE)?;
        Ok(Self {
            argsz: u32_at(payload, 0),
            flags: u32_at(payload, 4),
            num_regions: u32_at(payload, 8),
            num_irqs: u32_at(payload, 12),
        })
    }

    /// Encodes the structure.
    pub fn encode(&self) -> Vec<u8> {
        [self.argsz, self.flags, self.num_regions, self.num_irqs]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }
}

/// `struct vfio_region_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionInfo {
    /// Request: the buffer size the client can take; reply: the size needed.
    pub argsz: u32,
    /// [`region_flags`].
    pub flags: u32,
    /// Region index.
    pub index: u32,
    /// Offset of the first capability from the start of this structure (0: none).
    pub cap_offset: u32,
    /// Region size.
    pub size: u64,
    /// Offset at which to mmap the region's fd.
    pub offset: u64,
}

impl RegionInfo {
    /// Size of the structure.
    pub const SIZE: usize = 32;

    /// Parses the request or a reply's leading structure.
    pub fn parse(payload: &[u8]) -> Result<Self, Errno> {
        if payload.len() < Self::SIZE {
            return Err(Errno::EINVAL);
        }
        Ok(Self {
            argsz: u32_at(payload, 0),
            flags: u32_at(payload, 4),
            index: u32_at(payload, 8),
            cap_offset: u32_at(payload, 12),
            size: u64_at(payload, 16),
            offset: u64_at(payload, 24),
        })
    }

    /// Encodes the structure.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        for v in [self.argsz, self.flags, self.index, self.cap_offset] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out
    }
}

/// One sparse-mmap area (offset from the region start, size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseArea {
    /// Offset inside the region.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Encodes a sparse-mmap capability (header id 1 version 1, `next` = 0, `nr_areas`,
/// reserved, then the areas).
pub fn encode_sparse_mmap(areas: &[SparseArea]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 16 * areas.len());
    out.extend_from_slice(&region_caps::SPARSE_MMAP.to_le_bytes());
    out.extend_from_slice(&region_caps::SPARSE_MMAP_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(areas.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for area in areas {
        out.extend_from_slice(&area.offset.to_le_bytes());
        out.extend_from_slice(&area.size.to_le_bytes());
    }
    out
}

/// Parses a sparse-mmap capability at `cap_offset` of a region-info reply payload (the
/// offset counts from the start of `vfio_region_info`, i.e. of the payload).
pub fn parse_sparse_mmap(payload: &[u8], cap_offset: u32) -> Result<Vec<SparseArea>, Errno> {
    let at = cap_offset as usize;
    let head = payload
        .get(at..at.checked_add(16).ok_or(Errno::EINVAL)?)
        .ok_or(Errno::EINVAL)?;
    if u16::from_le_bytes([head[0], head[1]]) != region_caps::SPARSE_MMAP {
        return Err(Errno::EINVAL);
    }
    let count = u32_at(head, 8) as usize;
    (0..count)
        .map(|i| {
            let start = at + 16 + 16 * i;
            let area = payload.get(start..start + 16).ok_or(Errno::EINVAL)?;
            Ok(SparseArea {
                offset: u64_at(area, 0),
                size: u64_at(area, 8),
            })
        })
        .collect()
}

/// `struct vfio_irq_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrqInfo {
    /// Size of the structure.
    pub argsz: u32,
    /// [`irq_info_flags`].
    pub flags: u32,
    /// IRQ index.
    pub index: u32,
    /// Number of vectors.
    pub count: u32,
}

impl IrqInfo {
    /// Size of the structure.
    pub const SIZE: usize = 16;

    /// Parses the request or a reply.
    pub fn parse(payload: &[u8]) -> Result<Self, Errno> {
        exact(payload, Self::SIZE)?;
        let info = Self {
            argsz: u32_at(payload, 0),
            flags: u32_at(payload, 4),
            index: u32_at(payload, 8),
            count: u32_at(payload, 12),
        };
        argsz_at_least(info.argsz, Self::SIZE)?;
        Ok(info)
    }

    /// Encodes the structure.
    pub fn encode(&self) -> Vec<u8> {
        [self.argsz, self.flags, self.index, self.count]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }
}

/// `struct vfio_irq_set` and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqSet<'a> {
    /// Size of the structure plus data.
    pub argsz: u32,
    /// [`irq_set_flags`].
    pub flags: u32,
    /// IRQ index.
    pub index: u32,
    /// First vector.
    pub start: u32,
    /// Number of vectors.
    pub count: u32,
    /// One byte per vector with DATA_BOOL, else empty.
    pub bools: &'a [u8],
}

impl<'a> IrqSet<'a> {
    /// Size of the structure without data.
    pub const SIZE: usize = 20;

    /// Parses a SET_IRQS payload: exactly one data type and one action, no unknown bits,
    /// and exactly `count` bytes of data with DATA_BOOL (none otherwise).
    pub fn parse(payload: &'a [u8]) -> Result<Self, Errno> {
        use irq_set_flags::*;
        if payload.len() < Self::SIZE {
            return Err(Errno::EINVAL);
        }
        let set = Self {
            argsz: u32_at(payload, 0),
            flags: u32_at(payload, 4),
            index: u32_at(payload, 8),
            start: u32_at(payload, 12),
            count: u32_at(payload, 16),
            bools: &payload[Self::SIZE..],
        };
        argsz_at_least(set.argsz, Self::SIZE)?;
        let data = set.flags & DATA_MASK;
        let action = set.flags & ACTION_MASK_ALL;
        if set.flags & !(DATA_MASK | ACTION_MASK_ALL) != 0 || data.count_ones() != 1 || action.count_ones() != 1 {
            return Err(Errno::EINVAL);
        }
        let data_len = if data == DATA_BOOL { set.count as usize } else { 0 };
        if set.bools.len() != data_len {
            return Err(Errno::EINVAL);
        }
        Ok(set)
    }

    /// Encodes the structure and data (argsz is computed).
    pub fn encode(flags: u32, index: u32, start: u32, count: u32, bools: &[u8]) -> Vec<u8> {
        let argsz = (Self::SIZE + bools.len()) as u32;
        let mut out: Vec<u8> = [argsz, flags, index, start, count]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        out.extend_from_slice(bools);
        out
    }
}

/// REGION_READ / REGION_WRITE leading structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionAccess {
    /// Offset inside the region.
    pub offset: u64,
    /// Region index.
    pub region: u32,
    /// Bytes to read or write.
    pub count: u32,
}

impl RegionAccess {
    /// Size of the structure.
    pub const SIZE: usize = 16;

    /// Parses a REGION_READ request (exactly the structure).
    pub fn parse_read(payload: &[u8]) -> Result<Self, Errno> {
        exact(payload, Self::SIZE)?;
        Ok(Self::decode(payload))
    }

    /// Parses a REGION_WRITE request: the structure followed by exactly `count` bytes.
    pub fn parse_write(payload: &[u8]) -> Result<(Self, &[u8]), Errno> {
        if payload.len() < Self::SIZE {
            return Err(Errno::EINVAL);
        }
        let access = Self::decode(payload);
        let data = &payload[Self::SIZE..];
        if data.len() != access.count as usize {
            return Err(Errno::EINVAL);
        }
        Ok((access, data))
    }

    fn decode(payload: &[u8]) -> Self {
        Self {
            offset: u64_at(payload, 0),
            region: u32_at(payload, 8),
            count: u32_at(payload, 12),
        }
    }

    /// Encodes the structure.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::SIZE);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.region.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let header = Header {
            id: 0x1234,
            command: command::REGION_WRITE,
            size: 40,
            flags: header_flags::NO_REPLY,
            error: 0,
        };
        assert_eq!(Header::decode(&header.encode()), header);
        assert!(header.no_reply());
        let error = header.error_reply(Errno::ENOENT);
        assert_eq!(error.size, 16);
        assert_eq!(error.flags, header_flags::TYPE_REPLY | header_flags::ERROR);
        assert_eq!(error.error, libc::ENOENT as u32);
    }

    #[test]
    fn version_json_is_optional_but_must_be_terminated() {
        assert_eq!(Version::parse(&[0, 0, 1, 0]).unwrap().json, None);
        assert_eq!(Version::parse(&[0, 0, 0, 0, 0]).unwrap().json, None);
        let with = Version::encode(0, 0, Some("{}"));
        assert_eq!(Version::parse(&with).unwrap().json, Some("{}"));
        assert_eq!(Version::parse(&[0, 0, 0, 0, b'{', b'}']), Err(Errno::EINVAL));
        assert_eq!(Version::parse(&[0, 0, 0, 0, b'{', 0, b'}', 0]), Err(Errno::EINVAL));
        assert_eq!(Version::parse(&[0, 0, 0, 0, 0xFF, 0]), Err(Errno::EINVAL));
        assert_eq!(Version::parse(&[0, 0]), Err(Errno::EINVAL));
    }

    #[test]
    fn unmap_all_is_bit_one() {
        assert_eq!(dma_unmap_flags::ALL, 2);
        assert_eq!(dma_unmap_flags::GET_DIRTY_BITMAP, 1);
    }

    #[test]
    fn irq_set_needs_one_data_type_and_one_action() {
        use irq_set_flags::*;
        let ok = IrqSet::encode(DATA_EVENTFD | ACTION_TRIGGER, 2, 0, 3, &[]);
        assert_eq!(IrqSet::parse(&ok).unwrap().count, 3);
        let two_actions = IrqSet::encode(DATA_NONE | ACTION_MASK | ACTION_TRIGGER, 2, 0, 1, &[]);
        assert_eq!(IrqSet::parse(&two_actions), Err(Errno::EINVAL));
        let bools = IrqSet::encode(DATA_BOOL | ACTION_TRIGGER, 2, 0, 2, &[1, 0]);
        assert_eq!(IrqSet::parse(&bools).unwrap().bools, &[1, 0]);
        let short_bools = IrqSet::encode(DATA_BOOL | ACTION_TRIGGER, 2, 0, 3, &[1]);
        assert_eq!(IrqSet::parse(&short_bools), Err(Errno::EINVAL));
        let unknown = IrqSet::encode(DATA_NONE | ACTION_TRIGGER | 1 << 9, 2, 0, 0, &[]);
        assert_eq!(IrqSet::parse(&unknown), Err(Errno::EINVAL));
    }

    #[test]
    fn sparse_mmap_capability_round_trips() {
        let areas = [SparseArea {
            offset: 0,
            size: 0x4000,
        }];
        let mut payload = RegionInfo::default().encode();
        payload.extend(encode_sparse_mmap(&areas));
        assert_eq!(parse_sparse_mmap(&payload, 32).unwrap(), areas);
        assert_eq!(
            parse_sparse_mmap(&payload, 48),
            Err(Errno::EINVAL),
            "no capability id there"
        );
        assert_eq!(parse_sparse_mmap(&payload, u32::MAX), Err(Errno::EINVAL));
    }

    #[test]
    fn region_write_data_must_match_count() {
        let mut payload = RegionAccess {
            offset: 4,
            region: 0,
            count: 4,
        }
        .encode();
        assert_eq!(RegionAccess::parse_write(&payload), Err(Errno::EINVAL));
        payload.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(RegionAccess::parse_write(&payload).unwrap().1, &[1, 2, 3, 4]);
        payload.push(5);
        assert_eq!(RegionAccess::parse_write(&payload), Err(Errno::EINVAL));
    }
}
