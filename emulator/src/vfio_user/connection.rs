//! One client connection: reading whole messages without ever blocking the device loop,
//! and writing replies.
//!
//! The reader is a small state machine fed by non-blocking `recvmsg` calls that never
//! ask for more than the rest of the current message, so
//!
//! * file descriptors are attributed to the message whose bytes they arrived with (the
//!   kernel delivers them with the first byte of the `sendmsg` that carried them);
//! * every byte of every message is consumed before it is handled — including the payload
//!   of a message that turns out to be invalid — so the stream never falls out of step
//!   (the `vfio_user` crate parses leftover payload as the next header);
//! * a message larger than the negotiated limit is drained into a small scratch buffer
//!   and answered with E2BIG, so a hostile size cannot make the server allocate;
//! * a client that stops in the middle of a message only stalls its own message: the
//!   device loop keeps running.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::protocol::{Errno, Header, HEADER_SIZE};
use crate::os;

/// A message read in full.
#[derive(Debug)]
pub(crate) struct Message {
    /// The header as sent.
    pub header: Header,
    /// The bytes after the header (`header.size - 16` of them), or empty when `malformed`.
    pub payload: Vec<u8>,
    /// File descriptors that arrived with the message.
    pub fds: Vec<OwnedFd>,
    /// The client sent more descriptors than `max_msg_fds` allows (they were closed).
    pub too_many_fds: bool,
    /// Set when the message cannot be handled at all: its size field is below the header
    /// size (EINVAL) or above the limit (E2BIG, payload drained and dropped).
    pub malformed: Option<Errno>,
}

/// What one read attempt produced.
#[derive(Debug)]
pub(crate) enum ReadOutcome {
    /// A complete message.
    Message(Message),
    /// No complete message yet; nothing more to read now.
    WouldBlock,
    /// The peer closed the connection (or it failed); `mid_message` tells whether part
    /// of a message had been read.
    Closed { mid_message: bool },
}

#[derive(Debug)]
enum State {
    Header,
    Payload,
    Discard { left: u64 },
}

/// Incremental reader of vfio-user messages.
#[derive(Debug)]
pub(crate) struct MessageReader {
    state: State,
    header_bytes: [u8; HEADER_SIZE],
    have: usize,
    header: Header,
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
    too_many_fds: bool,
    max_payload: usize,
    max_fds: usize,
    scratch: Vec<u8>,
}

impl MessageReader {
    /// A reader that accepts payloads up to `max_payload` bytes and `max_fds` descriptors
    /// per message.
    pub fn new(max_payload: usize, max_fds: usize) -> Self {
        Self {
            state: State::Header,
            header_bytes: [0; HEADER_SIZE],
            have: 0,
            header: Header::default(),
            payload: Vec::new(),
            fds: Vec::new(),
            too_many_fds: false,
            max_payload,
            max_fds,
            scratch: Vec::new(),
        }
    }

    /// Whether part of a message has been read.
    fn mid_message(&self) -> bool {
        !matches!(self.state, State::Header) || self.have > 0
    }

    fn recv(&mut self, socket: BorrowedFd<'_>, target: Target) -> io::Result<usize> {
        // One descriptor more than allowed, so that an excess is seen rather than silently
        // truncated into looking valid.
        let room = self.max_fds.saturating_sub(self.fds.len()) + 1;
        let buffer = match target {
            Target::Header => &mut self.header_bytes[self.have..],
            Target::Payload => &mut self.payload[self.have..],
            Target::Scratch(len) => &mut self.scratch[..len],
        };
        let received = os::recv_with_fds(socket, buffer, &mut self.fds, room, true)?;
        if received.fds_truncated || self.fds.len() > self.max_fds {
            self.too_many_fds = true;
            // Close the excess now; the message will be refused anyway.
            self.fds.clear();
        }
        Ok(received.bytes)
    }

    fn finish(&mut self, malformed: Option<Errno>) -> Message {
        self.state = State::Header;
        self.have = 0;
        Message {
            header: self.header,
            payload: std::mem::take(&mut self.payload),
            fds: std::mem::take(&mut self.fds),
            too_many_fds: std::mem::replace(&mut self.too_many_fds, false),
            malformed,
        }
    }

    /// Reads until a message is complete, the socket has nothing more, or it closed.
    pub fn read(&mut self, socket: BorrowedFd<'_>) -> ReadOutcome {
        loop {
            let target = match self.state {
                State::Header => Target::Header,
                State::Payload => Target::Payload,
                State::Discard { left } => {
                    if self.scratch.is_empty() {
                        self.scratch = vec![0; 64 * 1024];
                    }
                    Target::Scratch(left.min(self.scratch.len() as u64) as usize)
                }
            };
            let n = match self.recv(socket, target) {
                Ok(0) => {
                    return ReadOutcome::Closed {
                        mid_message: self.mid_message(),
                    }
                }
                Ok(n) => n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return ReadOutcome::WouldBlock,
                Err(error) => {
                    tracing::debug!(target: "rnic_emu::vfio_user", %error, "client socket read failed");
                    return ReadOutcome::Closed {
                        mid_message: self.mid_message(),
                    };
                }
            };
            match self.state {
                State::Header => {
                    self.have += n;
                    if self.have < HEADER_SIZE {
                        continue;
                    }
                    self.header = Header::decode(&self.header_bytes);
                    self.have = 0;
                    let size = self.header.size as usize;
                    if size < HEADER_SIZE {
                        // The size cannot be trusted to find the next message; treat the
                        // header as the whole message, which keeps a client that merely
                        // filled in a bad size in step.
                        return ReadOutcome::Message(self.finish(Some(Errno::EINVAL)));
                    }
                    let payload_len = size - HEADER_SIZE;
                    if payload_len == 0 {
                        return ReadOutcome::Message(self.finish(None));
                    }
                    if payload_len > self.max_payload {
                        self.state = State::Discard {
                            left: payload_len as u64,
                        };
                    } else {
                        self.payload = vec![0; payload_len];
                        self.state = State::Payload;
                    }
                }
                State::Payload => {
                    self.have += n;
                    if self.have == self.payload.len() {
                        return ReadOutcome::Message(self.finish(None));
                    }
                }
                State::Discard { left } => {
                    let left = left - n as u64;
                    if left == 0 {
                        return ReadOutcome::Message(self.finish(Some(Errno::E2BIG)));
                    }
                    self.state = State::Discard { left };
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Header,
    Payload,
    Scratch(usize),
}

/// Writes one whole message (header, payload, and `fd` attached to its first byte).
/// The socket is blocking with a write timeout, so a client that stops reading its
/// replies is disconnected after that timeout instead of stalling the device forever.
pub(crate) fn send_message(
    stream: &UnixStream,
    header: &Header,
    payload: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let header_bytes = header.encode();
    let total = header_bytes.len() + payload.len();
    let mut sent = 0usize;
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    while sent < total {
        let (head, body) = if sent < HEADER_SIZE {
            (&header_bytes[sent..], payload)
        } else {
            (&[][..], &payload[sent - HEADER_SIZE..])
        };
        let attach = if sent == 0 { &fds[..] } else { &[] };
        let n = os::send_with_fds(stream.as_fd(), &[head, body], attach)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        sent += n;
    }
    Ok(())
}

/// Prepares an accepted client socket: blocking writes with `reply_timeout`; reads are
/// done non-blocking per call (`MSG_DONTWAIT`).
pub(crate) fn configure_client_socket(stream: &UnixStream, reply_timeout: Duration) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(reply_timeout))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio_user::protocol::command;
    use std::io::Write;

    fn header(command: u16, size: u32) -> [u8; HEADER_SIZE] {
        Header {
            id: 7,
            command,
            size,
            flags: 0,
            error: 0,
        }
        .encode()
    }

    #[test]
    fn a_message_split_over_many_writes_is_assembled() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let mut reader = MessageReader::new(1024, 4);
        let bytes = [&header(command::REGION_READ, 32)[..], &[9u8; 16]].concat();
        for chunk in bytes.chunks(5) {
            assert!(matches!(reader.read(server.as_fd()), ReadOutcome::WouldBlock));
            client.write_all(chunk).unwrap();
        }
        match reader.read(server.as_fd()) {
            ReadOutcome::Message(m) => {
                assert_eq!(m.header.command, command::REGION_READ);
                assert_eq!(m.payload, vec![9u8; 16]);
                assert!(m.malformed.is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oversized_payloads_are_drained_and_the_next_message_still_parses() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let mut reader = MessageReader::new(64, 4);
        client.write_all(&header(command::REGION_WRITE, 16 + 100_000)).unwrap();
        let writer = std::thread::spawn(move || {
            client.write_all(&vec![0xAA; 100_000]).unwrap();
            client.write_all(&header(command::DEVICE_RESET, 16)).unwrap();
            client
        });
        let mut seen = Vec::new();
        while seen.len() < 2 {
            match reader.read(server.as_fd()) {
                ReadOutcome::Message(m) => seen.push((m.header.command, m.malformed)),
                ReadOutcome::WouldBlock => std::thread::yield_now(),
                ReadOutcome::Closed { .. } => panic!("closed"),
            }
        }
        drop(writer.join().unwrap());
        assert_eq!(
            seen,
            vec![
                (command::REGION_WRITE, Some(Errno::E2BIG)),
                (command::DEVICE_RESET, None)
            ]
        );
    }

    #[test]
    fn a_size_below_the_header_is_malformed_and_consumes_only_the_header() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let mut reader = MessageReader::new(64, 4);
        client.write_all(&header(command::VERSION, 3)).unwrap();
        client.write_all(&header(command::DEVICE_RESET, 16)).unwrap();
        let ReadOutcome::Message(first) = reader.read(server.as_fd()) else {
            panic!()
        };
        assert_eq!(first.malformed, Some(Errno::EINVAL));
        let ReadOutcome::Message(second) = reader.read(server.as_fd()) else {
            panic!()
        };
        assert_eq!(second.header.command, command::DEVICE_RESET);
    }

    #[test]
    fn closing_mid_message_is_reported() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let mut reader = MessageReader::new(64, 4);
        client.write_all(&header(command::REGION_READ, 32)).unwrap();
        client.write_all(&[0; 4]).unwrap();
        drop(client);
        assert!(matches!(
            reader.read(server.as_fd()),
            ReadOutcome::Closed { mid_message: true }
        ));
    }
}
