//! A minimal raw vfio-user client for the tests: it writes the bytes itself (layouts
//! spelled out here, not taken from the server's encoders where that matters), so it can
//! also send everything a well-behaved client never would.
#![allow(dead_code)]

pub mod netns;
pub mod process;
pub mod verbs;

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rnic_emu::os::{self, MappedRegion, Protection};
use rnic_emu::vfio_user::{Server, ServerOptions, ServerThread};

/// Command numbers, spelled out.
pub const VERSION: u16 = 1;
pub const DMA_MAP: u16 = 2;
pub const DMA_UNMAP: u16 = 3;
pub const GET_INFO: u16 = 4;
pub const GET_REGION_INFO: u16 = 5;
pub const GET_IRQ_INFO: u16 = 7;
pub const SET_IRQS: u16 = 8;
pub const REGION_READ: u16 = 9;
pub const REGION_WRITE: u16 = 10;
pub const DEVICE_RESET: u16 = 13;
pub const REGION_WRITE_MULTI: u16 = 15;

pub const NO_REPLY: u32 = 1 << 4;
pub const ERROR: u32 = 1 << 5;
pub const REPLY: u32 = 1;

pub const CONFIG_REGION: u32 = 7;
pub const MSIX_INDEX: u32 = 2;

/// SET_IRQS flags.
pub const DATA_NONE: u32 = 1;
pub const DATA_BOOL: u32 = 2;
pub const DATA_EVENTFD: u32 = 4;
pub const ACTION_MASK: u32 = 8;
pub const ACTION_UNMASK: u32 = 16;
pub const ACTION_TRIGGER: u32 = 32;

/// The capabilities JSON QEMU 10.2 sends.
pub const QEMU_CAPS: &str = r#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"write_multiple":true,"migration":{"pgsize":4096,"max_bitmap_size":268435456}}}"#;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh socket path (short enough for sun_path).
pub fn socket_path(name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!("rnic-t{}-{n}-{name}.sock", std::process::id()))
}

/// Starts an in-process server with default options (plus `tweak`) on a fresh socket.
pub fn start_server_with(name: &str, tweak: impl FnOnce(&mut ServerOptions)) -> ServerThread {
    let mut options = ServerOptions::new(socket_path(name));
    tweak(&mut options);
    Server::spawn(options).expect("server starts")
}

/// Starts an in-process server with default options.
pub fn start_server(name: &str) -> ServerThread {
    start_server_with(name, |_| {})
}

/// A reply (or any message) as received.
#[derive(Debug)]
pub struct Received {
    pub id: u16,
    pub command: u16,
    pub size: u32,
    pub flags: u32,
    pub error: u32,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Received {
    pub fn is_error(&self) -> bool {
        self.flags & ERROR != 0
    }
}

pub fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Encodes a header.
pub fn header(id: u16, command: u16, size: u32, flags: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(&command.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h
}

/// REGION_READ/WRITE leading structure.
pub fn access(offset: u64, region: u32, count: u32) -> Vec<u8> {
    let mut p = offset.to_le_bytes().to_vec();
    p.extend_from_slice(&region.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    p
}

/// The raw client.
pub struct TestClient {
    pub stream: UnixStream,
    next_id: u16,
}

impl TestClient {
    /// Connects (the server is already listening when `spawn` returns).
    pub fn connect(path: &Path) -> Self {
        let stream = UnixStream::connect(path).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Self { stream, next_id: 1 }
    }

    /// Connects and negotiates like QEMU.
    pub fn attach(path: &Path) -> Self {
        let mut client = Self::connect(path);
        client.negotiate();
        client
    }

    pub fn next_id(&mut self) -> u16 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Sends raw bytes with descriptors on the first byte.
    pub fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut sent = 0;
        while sent < bytes.len() {
            let attach = if sent == 0 { fds } else { &[] };
            sent += os::send_with_fds(self.stream.as_fd(), &[&bytes[sent..]], attach).expect("send");
        }
    }

    /// Sends a command; returns its id.
    pub fn send(&mut self, command: u16, flags: u32, payload: &[u8], fds: &[BorrowedFd<'_>]) -> u16 {
        let id = self.next_id();
        let mut bytes = header(id, command, (16 + payload.len()) as u32, flags);
        bytes.extend_from_slice(payload);
        self.send_raw(&bytes, fds);
        id
    }

    fn recv_exact(&self, buffer: &mut [u8], fds: &mut Vec<OwnedFd>) -> std::io::Result<()> {
        let mut have = 0;
        while have < buffer.len() {
            let got = os::recv_with_fds(self.stream.as_fd(), &mut buffer[have..], fds, 8, false)?;
            if got.bytes == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            have += got.bytes;
        }
        Ok(())
    }

    /// Receives one message (blocking, 5 s timeout).
    pub fn try_recv(&mut self) -> std::io::Result<Received> {
        let mut fds = Vec::new();
        let mut h = [0u8; 16];
        self.recv_exact(&mut h, &mut fds)?;
        let size = le32(&h, 4);
        assert!(size >= 16, "reply size {size} below the header");
        let mut payload = vec![0u8; size as usize - 16];
        self.recv_exact(&mut payload, &mut fds)?;
        Ok(Received {
            id: le16(&h, 0),
            command: le16(&h, 2),
            size,
            flags: le32(&h, 8),
            error: le32(&h, 12),
            payload,
            fds,
        })
    }

    pub fn recv(&mut self) -> Received {
        self.try_recv().expect("reply")
    }

    /// Sends a command and returns its reply (checked to match), or the errno of an
    /// error reply.
    pub fn request(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<Received, i32> {
        let id = self.send(command, 0, payload, fds);
        let reply = self.recv();
        assert_eq!(reply.id, id, "reply id");
        assert_eq!(reply.command, command, "reply command");
        assert_eq!(reply.flags & 0xF, REPLY, "reply type");
        if reply.is_error() {
            assert_eq!(reply.size, 16, "an error reply carries only the header");
            assert_ne!(reply.error, 0, "an error reply names a real errno");
            return Err(reply.error as i32);
        }
        Ok(reply)
    }

    /// VERSION with `json` (None: no JSON at all); returns the server's JSON.
    pub fn version(&mut self, json: Option<&str>) -> Result<serde_json::Value, i32> {
        let mut payload = vec![0, 0, 0, 0];
        if let Some(json) = json {
            payload.extend_from_slice(json.as_bytes());
            payload.push(0);
        }
        let reply = self.request(VERSION, &payload, &[])?;
        assert_eq!(&reply.payload[..4], &[0, 0, 0, 0], "version 0.0");
        let text = &reply.payload[4..];
        assert_eq!(text.last(), Some(&0), "JSON is NUL-terminated");
        Ok(serde_json::from_slice(&text[..text.len() - 1]).expect("server JSON parses"))
    }

    pub fn negotiate(&mut self) -> serde_json::Value {
        self.version(Some(QEMU_CAPS)).expect("VERSION")
    }

    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Result<Vec<u8>, i32> {
        let reply = self.request(REGION_READ, &access(offset, region, count), &[])?;
        assert_eq!(reply.payload.len(), 16 + count as usize);
        assert_eq!(reply.payload[..16], access(offset, region, count)[..]);
        Ok(reply.payload[16..].to_vec())
    }

    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), i32> {
        let mut payload = access(offset, region, data.len() as u32);
        payload.extend_from_slice(data);
        let reply = self.request(REGION_WRITE, &payload, &[])?;
        assert_eq!(reply.payload, access(offset, region, data.len() as u32));
        Ok(())
    }

    pub fn config_read16(&mut self, offset: u64) -> u16 {
        le16(&self.region_read(CONFIG_REGION, offset, 2).unwrap(), 0)
    }

    pub fn config_write16(&mut self, offset: u64, value: u16) {
        self.region_write(CONFIG_REGION, offset, &value.to_le_bytes()).unwrap();
    }

    pub fn bar0_read32(&mut self, offset: u64) -> u32 {
        le32(&self.region_read(0, offset, 4).unwrap(), 0)
    }

    pub fn bar0_write32(&mut self, offset: u64, value: u32) {
        self.region_write(0, offset, &value.to_le_bytes()).unwrap();
    }

    /// Turns on memory decoding and bus mastering.
    pub fn enable_device(&mut self) {
        use rnic_firmware_if::pci::{offset, COMMAND_BUS_MASTER, COMMAND_MEMORY_SPACE};
        self.config_write16(offset::COMMAND as u64, COMMAND_MEMORY_SPACE | COMMAND_BUS_MASTER);
    }

    /// Turns on MSI-X in the capability.
    pub fn enable_msix(&mut self) {
        use rnic_firmware_if::pci::{MSIX_CAPABILITY_OFFSET, MSIX_CONTROL_ENABLE};
        let at = u64::from(MSIX_CAPABILITY_OFFSET) + 2;
        let control = self.config_read16(at);
        self.config_write16(at, control | MSIX_CONTROL_ENABLE);
    }

    /// GET_REGION_INFO with the given argsz; returns the reply payload and its fds.
    pub fn region_info(&mut self, index: u32, argsz: u32) -> Result<(Vec<u8>, Vec<OwnedFd>), i32> {
        let mut payload = argsz.to_le_bytes().to_vec();
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.extend_from_slice(&index.to_le_bytes());
        payload.extend_from_slice(&[0u8; 20]);
        let reply = self.request(GET_REGION_INFO, &payload, &[])?;
        Ok((reply.payload, reply.fds))
    }

    /// DMA_MAP.
    pub fn dma_map(
        &mut self,
        fd: Option<BorrowedFd<'_>>,
        offset: u64,
        address: u64,
        size: u64,
        flags: u32,
    ) -> Result<(), i32> {
        let mut payload = 32u32.to_le_bytes().to_vec();
        payload.extend_from_slice(&flags.to_le_bytes());
        payload.extend_from_slice(&offset.to_le_bytes());
        payload.extend_from_slice(&address.to_le_bytes());
        payload.extend_from_slice(&size.to_le_bytes());
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        let reply = self.request(DMA_MAP, &payload, &fds)?;
        assert!(reply.payload.is_empty());
        Ok(())
    }

    /// DMA_UNMAP; returns the echoed structure.
    pub fn dma_unmap(&mut self, flags: u32, address: u64, size: u64) -> Result<Vec<u8>, i32> {
        let mut payload = 24u32.to_le_bytes().to_vec();
        payload.extend_from_slice(&flags.to_le_bytes());
        payload.extend_from_slice(&address.to_le_bytes());
        payload.extend_from_slice(&size.to_le_bytes());
        Ok(self.request(DMA_UNMAP, &payload, &[])?.payload)
    }

    /// SET_IRQS.
    pub fn set_irqs(
        &mut self,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        bools: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), i32> {
        let mut payload = Vec::new();
        for v in [(20 + bools.len()) as u32, flags, index, start, count] {
            payload.extend_from_slice(&v.to_le_bytes());
        }
        payload.extend_from_slice(bools);
        self.request(SET_IRQS, &payload, fds).map(|_| ())
    }

    /// A request that must succeed, to show the stream is still in step after abuse.
    /// (A config-space read: it works whether or not memory decoding is on.)
    pub fn assert_in_sync(&mut self) {
        use rnic_firmware_if::pci::{offset, DEFAULT_DEVICE_ID, DEFAULT_VENDOR_ID};
        let ids = self
            .region_read(CONFIG_REGION, offset::VENDOR_ID as u64, 4)
            .expect("stream in sync");
        assert_eq!(
            (le16(&ids, 0), le16(&ids, 2)),
            (DEFAULT_VENDOR_ID, DEFAULT_DEVICE_ID),
            "stream in sync"
        );
    }
}

/// Maps the doorbell memfd from a region-info reply.
pub fn map_doorbells(fd: &OwnedFd, len: usize) -> MappedRegion {
    MappedRegion::map(fd.as_fd(), 0, len, Protection::READ_WRITE).expect("mmap doorbell pages")
}

/// Waits until `fd` (an eventfd) is readable, then reads its counter.
pub fn wait_eventfd(fd: &OwnedFd, timeout: Duration) -> Option<u64> {
    if os::wait_readable(&[fd.as_fd()], Some(timeout)).unwrap() == 0 {
        return None;
    }
    let mut counter = [0u8; 8];
    File::from(fd.as_fd().try_clone_to_owned().unwrap())
        .read_exact(&mut counter)
        .ok()?;
    Some(u64::from_ne_bytes(counter))
}

/// Polls `read` until it returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    condition()
}
