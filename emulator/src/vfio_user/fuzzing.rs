//! vfio-user messages against the server, for the `vfio_user` fuzz target (`fuzz/`,
//! docs/fuzzing.md) and the test that replays its corpus (`tests/fuzz_vfio_user.rs`).
//!
//! One server per process, driven on the caller's thread with [`Server::run_once`], so a
//! run is deterministic. Each input starts on a connection that has negotiated VERSION
//! and reset the device. An input is what the client writes on its socket, as records —
//!
//! * `0, n, bytes[n]`: write `n` bytes on the socket (any framing: headers split across
//!   records, several messages in one, sizes that lie);
//! * `1, n, bytes[n]`: the same with a memfd (64 KiB, the client's "guest memory")
//!   attached to the first byte, as DMA_MAP and SET_IRQS carry descriptors;
//! * `2, k`: let the server make `k mod 8` more passes;
//! * `3`: hang up and connect again (the first four times).
//!
//! After each record the server runs until it has nothing more to do and the client reads
//! every reply. Invariants (besides no panic, no hang):
//!
//! * every complete message of type command without No_reply gets exactly one reply, in
//!   order, with its id and command, the reply type, and on error the error flag with an
//!   errno and no payload; nothing else arrives — the stream never falls out of step;
//! * after hanging up, the server holds no descriptor of the client (no leak);
//! * after the input a new client negotiates VERSION, reads the device information and
//!   resets the device; that connection is where the next input starts, from a fresh
//!   device.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::protocol::{command, header_flags, DeviceInfo, Header, Version, HEADER_SIZE};
use super::server::{Limits, Server, ServerOptions};
use crate::os;
use crate::timing::TimingMode;

/// Size of the client's memfd.
const GUEST_MEMORY: u64 = 64 << 10;

/// A client's half of the conversation: what it expects and what it read.
#[derive(Debug, Default)]
struct Conversation {
    /// Bytes written but not yet a whole message.
    partial: Vec<u8>,
    /// Bytes of a message larger than a header still to skip.
    skipping: u64,
    /// (id, command) of each reply still due, in order.
    due: VecDeque<(u16, u16)>,
    /// Bytes read but not yet a whole reply.
    incoming: Vec<u8>,
}

impl Conversation {
    /// Takes note of bytes the client wrote: each complete message that is a command
    /// without No_reply is owed a reply (as the server frames them: a size below the
    /// header counts as a header alone).
    fn wrote(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.skipping > 0 {
                let skip = (self.skipping as usize).min(bytes.len());
                self.skipping -= skip as u64;
                bytes = &bytes[skip..];
                continue;
            }
            let need = HEADER_SIZE - self.partial.len();
            let take = need.min(bytes.len());
            self.partial.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.partial.len() < HEADER_SIZE {
                return;
            }
            let header = Header::decode(self.partial[..HEADER_SIZE].try_into().expect("a header"));
            self.partial.clear();
            self.skipping = u64::from(header.size).saturating_sub(HEADER_SIZE as u64);
            if header.message_type() != header_flags::TYPE_REPLY && !header.no_reply() {
                // Owed once its payload has arrived in full; noted now, checked only when
                // the server has had every byte.
                self.due.push_back((header.id, header.command));
            }
        }
    }

    /// Whether the last message written is complete.
    fn complete(&self) -> bool {
        self.partial.is_empty() && self.skipping == 0
    }

    /// Checks the replies read so far against what is due.
    fn read(&mut self, bytes: &[u8]) {
        self.incoming.extend_from_slice(bytes);
        loop {
            if self.incoming.len() < HEADER_SIZE {
                return;
            }
            let header = Header::decode(self.incoming[..HEADER_SIZE].try_into().expect("a header"));
            let size = header.size as usize;
            assert!(size >= HEADER_SIZE, "a reply of size {size}: {header:?}");
            if self.incoming.len() < size {
                return;
            }
            self.incoming.drain(..size);
            let Some((id, command)) = self.due.pop_front() else {
                panic!("a reply nobody asked for: {header:?}");
            };
            assert_eq!(
                (header.id, header.command),
                (id, command),
                "replies out of step: {header:?} for message {id} (command {command})"
            );
            assert_eq!(
                header.message_type(),
                header_flags::TYPE_REPLY,
                "a reply of the wrong type: {header:?}"
            );
            if header.flags & header_flags::ERROR != 0 {
                assert!(header.error != 0, "an error reply without errno: {header:?}");
                assert_eq!(size, HEADER_SIZE, "an error reply with a payload: {header:?}");
            } else {
                assert_eq!(header.error, 0, "a successful reply with an errno: {header:?}");
            }
        }
    }
}

/// The server, its socket, the client and its memory.
struct Session {
    server: Server,
    socket: PathBuf,
    client: Option<UnixStream>,
    conversation: Conversation,
    memory: OwnedFd,
    /// The session's kind of open descriptors with no client attached ([`session_fds`]).
    baseline_fds: Vec<String>,
    next_id: u16,
}

/// What this process's open descriptors of the kinds a vfio-user session creates refer
/// to (sockets, memfds, eventfds and other anonymous inodes, pipes), sorted. Regular files
/// and directories are left out: libFuzzer opens corpus and artifact files of its own
/// between inputs, and this listing's own directory descriptor is one of them.
fn session_fds() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut targets: Vec<String> = entries
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| {
            ["socket:", "anon_inode:", "pipe:", "/memfd:"]
                .iter()
                .any(|kind| target.starts_with(kind))
        })
        .collect();
    targets.sort();
    targets
}

/// What the kernel's socket tables say of `target` (`socket:[INODE]`): the table and
/// its line (for a Unix socket: state 01 listening, 03 connected, and the path it is
/// bound or was accepted on), or that no table lists it.
fn socket_details(target: &str) -> String {
    let Some(inode) = target.strip_prefix("socket:[").and_then(|rest| rest.strip_suffix(']')) else {
        return "not a socket".into();
    };
    // Each table with the column of its inode.
    for (table, column) in [("unix", 6), ("udp", 9), ("udp6", 9), ("tcp", 9), ("tcp6", 9)] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/net/{table}")) else {
            continue;
        };
        if let Some(line) = text
            .lines()
            .find(|line| line.split_whitespace().nth(column) == Some(inode))
        {
            return format!("{table}: {}", line.trim());
        }
    }
    "in no socket table of /proc/net".into()
}

impl Session {
    fn new() -> io::Result<Self> {
        // One directory per session, so sessions in one process (tests) never share a path.
        static SESSIONS: AtomicU64 = AtomicU64::new(0);
        let directory = std::env::temp_dir().join(format!(
            "rnic-fuzz-vfio-user-{}-{}",
            std::process::id(),
            SESSIONS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&directory)?;
        let socket = directory.join("server.sock");
        let mut options = ServerOptions::new(&socket);
        options.timing = TimingMode::Fast;
        // Two doorbell pages: a reset clears them all, per input.
        options.device.doorbell_pages = 2;
        // Replies no larger than a page, so a pass's replies always fit the socket.
        options.limits = Limits {
            max_data_xfer_size: 4096,
            max_dma_maps: 64,
            ..Limits::default()
        };
        let server = Server::bind(options)?;
        let memory = os::memfd_create("rnic-fuzz-guest", GUEST_MEMORY, false)?;
        let mut session = Self {
            server,
            socket,
            client: None,
            conversation: Conversation::default(),
            memory,
            baseline_fds: Vec::new(),
            next_id: 0,
        };
        session.settle()?;
        session.baseline_fds = session_fds();
        session.fresh_client()?;
        Ok(session)
    }

    fn connect(&mut self) -> io::Result<()> {
        let stream = UnixStream::connect(&self.socket)?;
        stream.set_nonblocking(true)?;
        self.client = Some(stream);
        self.conversation = Conversation::default();
        self.settle()
    }

    /// Hangs up: shuts the client's socket down, then closes it.
    ///
    /// Closing alone delivers the EOF only if this close is the last reference to the
    /// client's file. Any other task that reads the link `/proc/PID/fd/N` (`ls -l`, `lsof`,
    /// a process monitor) holds a reference for a moment; when it is the last to let go,
    /// the server sees the EOF after that task's release, perhaps after the settle below
    /// has already found the server idle and the check that follows it fails. A shutdown
    /// reaches the server's end at once, whoever else holds the file.
    fn hang_up(&mut self) -> io::Result<()> {
        if let Some(client) = self.client.take() {
            client.shutdown(Shutdown::Both)?;
        }
        self.settle()
    }

    /// Hangs up and checks the server let the client go and closed every descriptor the
    /// client sent it.
    fn hang_up_and_count(&mut self) -> io::Result<()> {
        // Named now, so that a failure can tell the client's own socket from the server's.
        let client_socket = self
            .client
            .as_ref()
            .and_then(|client| std::fs::read_link(format!("/proc/self/fd/{}", client.as_raw_fd())).ok());
        self.hang_up()?;
        let stats = self.server.handle().stats();
        if stats.connected {
            // Whether the client's end still exists (referenced from somewhere) tells a
            // missed EOF from a connection the server took after it.
            let client_now = client_socket
                .as_ref()
                .map(|target| socket_details(&target.to_string_lossy()));
            let sockets: Vec<String> = session_fds()
                .iter()
                .map(|target| format!("{target} = {}", socket_details(target)))
                .collect();
            panic!(
                "the server still serves a client that hung up (client socket {client_socket:?}, now {client_now:?}; \
                 the process's sockets {sockets:?}): {stats:?}"
            );
        }
        let now = session_fds();
        if now != self.baseline_fds {
            let extra: Vec<String> = now
                .iter()
                .filter(|target| !self.baseline_fds.contains(target))
                .map(|target| format!("{target} = {}", socket_details(target)))
                .collect();
            panic!(
                "descriptors left open after the client hung up: {now:?}, with no client {:?}; the extra ones: \
                 {extra:?}; the client's socket was {client_socket:?}; the server accepted {} clients and saw {} go",
                self.baseline_fds, stats.connections, stats.disconnections
            );
        }
        Ok(())
    }

    /// Runs the server until it has nothing more to do, reading the replies.
    fn settle(&mut self) -> io::Result<()> {
        for _ in 0..1024 {
            let busy = self.server.run_once()?;
            let read = self.read_replies()?;
            if !busy && !read {
                return Ok(());
            }
        }
        panic!("the server never settles");
    }

    fn read_replies(&mut self) -> io::Result<bool> {
        let Some(client) = &self.client else {
            return Ok(false);
        };
        let mut any = false;
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            let mut fds = Vec::new();
            match os::recv_with_fds(client.as_fd(), &mut buffer, &mut fds, 4, true) {
                Ok(received) if received.bytes == 0 => panic!("the server hung up on the client"),
                Ok(received) => {
                    any = true;
                    self.conversation.read(&buffer[..received.bytes]);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(any),
                Err(error) => return Err(error),
            }
        }
    }

    fn write(&mut self, bytes: &[u8], with_memory: bool) -> io::Result<()> {
        let Some(client) = self.client.as_ref().map(UnixStream::try_clone).transpose()? else {
            return Ok(());
        };
        let mut sent = 0;
        loop {
            let attach = if with_memory && sent == 0 {
                vec![self.memory.as_fd()]
            } else {
                Vec::new()
            };
            match os::send_with_fds(client.as_fd(), &[&bytes[sent..]], &attach) {
                Ok(n) => {
                    // Noted as it goes: a reply may come while the rest waits for room.
                    self.conversation.wrote(&bytes[sent..sent + n]);
                    sent += n;
                }
                // The socket is full: let the server read, then go on.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.settle()?,
                Err(error) => return Err(error),
            }
            if sent >= bytes.len() {
                break;
            }
        }
        drop(client);
        self.settle()
    }

    /// Sends a well-formed command and checks its reply came back successful.
    fn command(&mut self, command: u16, payload: &[u8]) -> io::Result<()> {
        self.next_id = self.next_id.wrapping_add(1);
        let header = Header {
            id: self.next_id,
            command,
            size: (HEADER_SIZE + payload.len()) as u32,
            flags: header_flags::TYPE_COMMAND,
            error: 0,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(payload);
        let errors_before = self.server.handle().stats().errors;
        self.write(&bytes, false)?;
        assert!(self.conversation.due.is_empty(), "command {command} got no reply");
        assert_eq!(
            self.server.handle().stats().errors,
            errors_before,
            "command {command} failed"
        );
        Ok(())
    }

    fn negotiate(&mut self) -> io::Result<()> {
        self.command(command::VERSION, &Version::encode(0, 1, None))
    }

    /// Connects a new client, negotiates VERSION, reads the device information and
    /// resets the device: the server still serves, and the next input starts afresh.
    fn fresh_client(&mut self) -> io::Result<()> {
        self.connect()?;
        self.negotiate()?;
        let info = DeviceInfo {
            argsz: DeviceInfo::SIZE as u32,
            flags: 0,
            num_regions: 0,
            num_irqs: 0,
        };
        self.command(command::DEVICE_GET_INFO, &info.encode())?;
        self.command(command::DEVICE_RESET, &[])
    }

    fn run(&mut self, mut records: &[u8]) -> io::Result<()> {
        let mut reconnects = 0;
        while let Some((&tag, rest)) = records.split_first() {
            records = rest;
            match tag % 4 {
                kind @ (0 | 1) => {
                    let Some((&length, rest)) = records.split_first() else {
                        break;
                    };
                    let length = usize::from(length).min(rest.len());
                    self.write(&rest[..length], kind == 1)?;
                    records = &rest[length..];
                }
                2 => {
                    let passes = records.first().map_or(1, |k| k % 8);
                    records = records.get(1..).unwrap_or_default();
                    for _ in 0..passes {
                        self.server.run_once()?;
                        self.read_replies()?;
                    }
                }
                // A connection costs the kernel more than anything else here: a few per input.
                _ if reconnects < 4 => {
                    reconnects += 1;
                    self.finish_conversation();
                    self.hang_up()?;
                    self.connect()?;
                }
                _ => {}
            }
        }
        self.finish_conversation();
        self.hang_up_and_count()?;
        self.fresh_client()
    }

    /// Every reply owed for complete messages has arrived.
    fn finish_conversation(&mut self) {
        let owed = self.conversation.due.len();
        if self.conversation.complete() {
            assert_eq!(owed, 0, "replies never sent: {:?}", self.conversation.due);
        } else {
            // The last message is still being read: only it may be owed.
            assert!(owed <= 1, "replies never sent: {:?}", self.conversation.due);
        }
    }
}

thread_local! {
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
}

/// Runs one input (see the module documentation).
///
/// # Panics
/// When an invariant fails, or the socket or memfd cannot be set up.
pub fn run(data: &[u8]) {
    SESSION.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(Session::new().expect("a vfio-user server for fuzzing"));
        }
        let session = cell.as_mut().expect("just created");
        session.run(data).expect("socket I/O with the server");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_hang_up_reaches_the_server_while_another_task_still_holds_the_clients_socket() {
        let mut session = Session::new().unwrap();
        assert!(session.server.handle().stats().connected);
        // What a reader of /proc/PID/fd/N holds for a moment: another reference to the
        // client's open file, released after the harness has looked at the server.
        let other_reference = session.client.as_ref().unwrap().try_clone().unwrap();
        session.hang_up().unwrap();
        let stats = session.server.handle().stats();
        assert!(
            !stats.connected,
            "the server let the client go at the hang-up: {stats:?}"
        );
        drop(other_reference);
        session.fresh_client().unwrap();
        let directory = session.socket.parent().unwrap().to_path_buf();
        drop(session);
        let _ = std::fs::remove_dir_all(directory);
    }

    #[test]
    fn a_leaked_socket_is_described_from_the_kernels_tables() {
        let directory = std::env::temp_dir().join(format!("rnic-socket-details-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let target = std::fs::read_link(format!("/proc/self/fd/{}", listener.as_raw_fd())).unwrap();
        let details = socket_details(&target.to_string_lossy());
        assert!(details.starts_with("unix: "), "{details}");
        assert!(
            details.contains(" 01 ") && details.ends_with("s.sock"),
            "listening, on its path: {details}"
        );
        assert_eq!(socket_details("/memfd:x (deleted)"), "not a socket");
        assert_eq!(socket_details("socket:[1]"), "in no socket table of /proc/net");
        drop(listener);
        let _ = std::fs::remove_dir_all(&directory);
    }
}
