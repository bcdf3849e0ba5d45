//! A device session: one model instance with its host memory, its MSI-X messages and its
//! port, driven by a testbench through transactions (SimBricks-shaped: register access,
//! DMA to host memory, interrupts, Ethernet frames) on virtual time.
//!
//! Host memory is either the model's own (backdoor regions the testbench reads and
//! writes directly) or the testbench's, reached through a [`HostBus`] — the C ABI turns
//! a pair of callbacks into one, so DMA reads and writes become requests the testbench
//! serves from its own memory model.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cqe::Cqe;
use rnic_firmware_if::eqe::{Aeqe, AeqeMailbox, Ceqe};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::ContextTable;
use rnic_hw_model::interrupt::{InterruptSink, MsixMessage};
use rnic_hw_model::memory::{AccessKind, Backing, MemoryError, FRAME_SIZE};
use rnic_hw_model::probe::{Observer, Transaction};
use rnic_hw_model::{Device, HostMemory, PagedMemory, Picoseconds};

use crate::checker::{Checker, EventQueue, Mismatch, Stream, Streams};
use crate::config::SessionConfig;
use crate::coverage::{Collector, Coverage};
use crate::replay::{self, Event};
use crate::trace::{Trace, Track};
use crate::VipError;

/// Host memory the testbench owns: the model's DMA requests, served by the testbench.
pub trait HostBus: Send {
    /// Reads `buffer.len()` bytes at bus address `address`; false when the testbench
    /// refuses (the device sees a failed DMA: an unsupported request).
    fn read(&mut self, address: u64, buffer: &mut [u8]) -> bool;
    /// Writes `data` at bus address `address`; false when refused.
    fn write(&mut self, address: u64, data: &[u8]) -> bool;
}

/// A [`HostBus`] as the model's [`HostMemory`].
struct BusMemory(Mutex<Box<dyn HostBus>>);

impl BusMemory {
    fn lock(&self) -> MutexGuard<'_, Box<dyn HostBus>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl HostMemory for BusMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        match self.lock().read(address, buffer) {
            true => Ok(()),
            false => Err(MemoryError::Unmapped {
                kind: AccessKind::Read,
                address,
                length: buffer.len(),
                unmapped: address,
            }),
        }
    }

    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        match self.lock().write(address, data) {
            true => Ok(()),
            false => Err(MemoryError::Unmapped {
                kind: AccessKind::Write,
                address,
                length: data.len(),
                unmapped: address,
            }),
        }
    }
}

/// What the device did, as the session's memory tap and port observers saw it, in order.
#[derive(Debug, Clone)]
enum Seen {
    /// A DMA read and its answer (None: refused).
    DmaRead {
        address: u64,
        length: usize,
        data: Option<Vec<u8>>,
    },
    /// A DMA write that host memory took.
    DmaWrite { address: u64, data: Vec<u8> },
    /// A CQE the CQ block wrote (owner bit not yet set).
    Cqe { cqn: u32, cqe: Box<Cqe> },
    /// A request for an EQE: the next DMA write is that EQE if it matches.
    EqeRequest(EqeRequest),
}

/// An EQE the event block was asked for.
#[derive(Debug, Clone, Copy)]
enum EqeRequest {
    Completion { ceqn: u32, cqn: u32 },
    Async { event: AsyncEventType, queue_number: u32 },
    Mailbox { token: u16 },
}

impl EqeRequest {
    /// Whether `data`, written right after the request, is its EQE.
    fn is_written_as(&self, data: &[u8]) -> bool {
        match *self {
            EqeRequest::Completion { cqn, .. } => data.len() >= Ceqe::SIZE && Ceqe::CQN.get(data) == u64::from(cqn),
            EqeRequest::Async { event, queue_number } => {
                data.len() >= Aeqe::SIZE
                    && Aeqe::EVENT_TYPE.get(data) == u64::from(u8::from(event))
                    && Aeqe::EVENT_QUEUE_NUM.get(data) == u64::from(queue_number)
            }
            EqeRequest::Mailbox { token } => {
                data.len() >= AeqeMailbox::SIZE
                    && AeqeMailbox::EVENT_TYPE.get(data) == u64::from(u8::from(AsyncEventType::Mb))
                    && AeqeMailbox::TOKEN.get(data) == u64::from(token)
            }
        }
    }

    fn queue(&self) -> EventQueue {
        match *self {
            EqeRequest::Completion { ceqn, .. } => EventQueue::Completion(ceqn),
            _ => EventQueue::Async,
        }
    }
}

/// Where the session's memory tap and observers put what they saw. Nothing is kept
/// unless a check or a recording asks for it.
#[derive(Debug, Default)]
struct Tap {
    /// DMA writes, CQEs and EQE requests (a check of those streams is running).
    watch: AtomicBool,
    /// DMA reads with their answers and DMA writes (a recording of a session on the
    /// testbench's memory is running).
    record: AtomicBool,
    seen: Mutex<Vec<Seen>>,
}

impl Tap {
    fn push(&self, seen: Seen) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The device's host memory with the tap on it: every DMA the device makes passes here,
/// the BT and MTT walks included (they bypass the bus port's observer).
struct TappedMemory {
    inner: Arc<dyn HostMemory>,
    tap: Arc<Tap>,
}

impl HostMemory for TappedMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError> {
        let result = self.inner.read(address, buffer);
        if self.tap.record.load(Ordering::Relaxed) {
            self.tap.push(Seen::DmaRead {
                address,
                length: buffer.len(),
                data: result.is_ok().then(|| buffer.to_vec()),
            });
        }
        result
    }

    fn write(&self, address: u64, data: &[u8]) -> Result<(), MemoryError> {
        let result = self.inner.write(address, data);
        if result.is_ok() && (self.tap.watch.load(Ordering::Relaxed) || self.tap.record.load(Ordering::Relaxed)) {
            self.tap.push(Seen::DmaWrite {
                address,
                data: data.to_vec(),
            });
        }
        result
    }
}

/// The observer of the completion and event ports: the coverage collector, and the tap
/// while a check watches CQEs and EQEs.
struct Watch {
    coverage: Collector,
    tap: Arc<Tap>,
}

impl Observer for Watch {
    fn observe(&mut self, at: Picoseconds, transaction: &Transaction<'_>) {
        self.coverage.observe(at, transaction);
        if !self.tap.watch.load(Ordering::Relaxed) {
            return;
        }
        let request = match *transaction {
            Transaction::Cqe {
                cqn,
                cqe,
                written: true,
                ..
            } => {
                self.tap.push(Seen::Cqe {
                    cqn,
                    cqe: Box::new(*cqe),
                });
                return;
            }
            Transaction::CompletionEvent { ceqn, cqn } => EqeRequest::Completion { ceqn, cqn },
            Transaction::AsyncEvent {
                event, queue_number, ..
            } => EqeRequest::Async { event, queue_number },
            Transaction::MailboxEvent { token, .. } => EqeRequest::Mailbox { token },
            _ => return,
        };
        self.tap.push(Seen::EqeRequest(request));
    }
}

/// The bytes of the CQE `cqe` among `writes` (the DMA writes since the last CQE): the
/// write of 32 or 64 bytes equal to it but for the owner bit, the newest first.
fn written_cqe(cqe: &Cqe, writes: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let found = writes.iter().rev().find(|(_, data)| {
        (data.len() == 32 || data.len() == 64) && {
            let mut expected = *cqe;
            expected.set_owner(Cqe::OWNER.get(data) != 0);
            expected.bytes()[..data.len()] == data[..]
        }
    });
    match found {
        Some((_, data)) => data.clone(),
        None => cqe.bytes().to_vec(),
    }
}

/// An MSI-X message and when the device sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixEvent {
    /// Virtual time, ps.
    pub time: Picoseconds,
    /// The message.
    pub message: MsixMessage,
}

/// MSI-X messages the device sent and nobody took yet.
#[derive(Debug, Clone, Default)]
struct MsixQueue(Arc<Mutex<Vec<MsixMessage>>>);

impl InterruptSink for MsixQueue {
    fn deliver(&mut self, message: MsixMessage) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(message);
    }
}

/// A transmitted frame and when it left the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameEvent {
    /// Virtual time, ps.
    pub time: Picoseconds,
    /// The Ethernet frame, without FCS.
    pub frame: Vec<u8>,
}

/// One model instance and what surrounds it.
pub struct Session {
    config: SessionConfig,
    device: Device,
    /// The memory the device DMAs into (without the tap: the testbench's own accesses).
    memory: Arc<dyn HostMemory>,
    /// What the device's memory accesses and the completion and event ports showed.
    tap: Arc<Tap>,
    /// The model's own memory (backdoor regions), when the testbench supplied none.
    backdoor: Option<Arc<PagedMemory>>,
    sink: MsixQueue,
    msix: VecDeque<MsixEvent>,
    transmitted: VecDeque<FrameEvent>,
    /// The coverage collector on the device's ports.
    coverage: Collector,
    /// The trace, once [`Session::start_trace`] was called.
    trace: Option<Trace>,
    /// Inputs and outputs, once [`Session::start_recording`] was called.
    recording: Option<Vec<Event>>,
    /// Whether any input reached the device (a recording must start before).
    touched: bool,
    /// The port checker, once [`Session::start_check`] was called.
    checker: Option<Checker>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session from configuration text (TOML or JSON, see [`SessionConfig`]), with the
    /// model's own backdoor memory, or the testbench's when `bus` is given.
    pub fn new(config_text: &str, bus: Option<Box<dyn HostBus>>) -> Result<Self, VipError> {
        let config = SessionConfig::parse(config_text)?;
        Self::with_config(config, bus)
    }

    /// [`Session::new`] from a parsed configuration.
    pub fn with_config(config: SessionConfig, bus: Option<Box<dyn HostBus>>) -> Result<Self, VipError> {
        let device_config = config.device_config()?;
        let (memory, backdoor): (Arc<dyn HostMemory>, _) = match bus {
            Some(bus) => (Arc::new(BusMemory(Mutex::new(bus))), None),
            None => {
                let memory = Arc::new(PagedMemory::new());
                for region in &config.memory {
                    let backing = Backing::zeroed(region.size as usize);
                    memory.map_contiguous(region.base, &backing, 0, (region.size / FRAME_SIZE) as usize, true);
                }
                (memory.clone() as Arc<dyn HostMemory>, Some(memory))
            }
        };
        let sink = MsixQueue::default();
        let tap = Arc::new(Tap::default());
        let tapped = Arc::new(TappedMemory {
            inner: memory.clone(),
            tap: tap.clone(),
        });
        let mut device = Device::new(device_config, tapped, Box::new(sink.clone()));
        let coverage = Collector::new();
        coverage.attach_with(&mut device, |collector| {
            Box::new(Watch {
                coverage: collector,
                tap: tap.clone(),
            })
        });
        let mut session = Self {
            config,
            device,
            memory,
            tap,
            backdoor,
            sink,
            msix: VecDeque::new(),
            transmitted: VecDeque::new(),
            coverage,
            trace: None,
            recording: None,
            touched: false,
            checker: None,
        };
        if session.config.trace {
            session.start_trace();
        }
        if session.config.record {
            session.start_recording()?;
        }
        Ok(session)
    }

    /// The configuration the session was made with.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// The device (for Rust testbenches that want more than transactions).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device, mutably. The session's coverage collector is the observer on the
    /// device's network, QP-state, completion and event ports: replacing one of those
    /// observers stops that part of the session's coverage.
    pub fn device_mut(&mut self) -> &mut Device {
        &mut self.device
    }

    /// Current virtual time.
    pub fn now(&self) -> Picoseconds {
        self.device.now()
    }

    /// Time of the next pending event.
    pub fn next_event_time(&self) -> Option<Picoseconds> {
        self.device.next_event_time()
    }

    /// Runs every event due by `t` (each at its own instant, so outputs carry the time
    /// they happened), then moves virtual time to `t`. A `t` in the past is an error.
    pub fn advance_to(&mut self, t: Picoseconds) -> Result<(), VipError> {
        if t < self.device.now() {
            return Err(VipError::Invalid(format!(
                "advance to {} ps: the session is at {} ps already",
                t.0,
                self.device.now().0
            )));
        }
        self.record(|| Event::AdvanceTo { time_ps: t.0 });
        while let Some(next) = self.device.next_event_time().filter(|next| *next <= t) {
            self.device.advance_to(next);
            self.collect();
        }
        self.device.advance_to(t);
        self.collect();
        Ok(())
    }

    /// Runs until nothing is pending or the next event is past `limit`; returns the time
    /// reached.
    pub fn run_until_idle(&mut self, limit: Picoseconds) -> Picoseconds {
        self.record(|| Event::RunUntilIdle { limit_ps: limit.0 });
        while let Some(next) = self.device.next_event_time().filter(|next| *next <= limit) {
            self.device.advance_to(next);
            self.collect();
        }
        self.device.now()
    }

    /// Hands what the tap saw at the current instant to the check and the recording.
    fn collect_tapped(&mut self, now: Picoseconds) {
        let seen = self.tap.take();
        if seen.is_empty() {
            return;
        }
        // The DMA writes since the last CQE (one of them is the next CQE's), and the EQE
        // request waiting for its write.
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut eqe_request: Option<EqeRequest> = None;
        for event in seen {
            match event {
                Seen::DmaRead { address, length, data } => {
                    if let Some(recording) = self.recording.as_mut() {
                        recording.push(Event::DmaRead {
                            time_ps: now.0,
                            address,
                            length,
                            data: data.as_deref().map(replay::hex),
                        });
                    }
                }
                Seen::DmaWrite { address, data } => {
                    if let Some(recording) = self.recording.as_mut().filter(|_| self.backdoor.is_none()) {
                        recording.push(Event::DmaWrite {
                            time_ps: now.0,
                            address,
                            data: replay::hex(&data),
                        });
                    }
                    if let Some(checker) = self.checker.as_mut() {
                        checker.expect_dma_write(now, address, &data);
                        if let Some(request) = eqe_request.take().filter(|r| r.is_written_as(&data)) {
                            checker.expect_eqe(now, request.queue(), &data);
                        }
                    }
                    if writes.len() >= 64 {
                        writes.remove(0);
                    }
                    writes.push((address, data));
                }
                Seen::Cqe { cqn, cqe } => {
                    let entry = written_cqe(&cqe, &writes);
                    writes.clear();
                    if let Some(checker) = self.checker.as_mut() {
                        checker.expect_cqe(now, cqn, &entry);
                    }
                }
                Seen::EqeRequest(request) => eqe_request = Some(request),
            }
        }
    }

    /// Gathers what the device produced at the current instant.
    fn collect(&mut self) {
        let now = self.device.now();
        self.collect_tapped(now);
        let messages = std::mem::take(&mut *self.sink.0.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(trace) = self.trace.as_mut() {
            let charges = self.device.timing_mut().take_stage_log();
            trace.add_charges(now, &charges, self.device.timing().totals());
            for message in &messages {
                trace.add_instant(
                    now,
                    Track::Msix,
                    format!("MSI-X vector {}", message.vector),
                    vec![("data".into(), format!("{:#x}", message.data))],
                );
            }
        }
        if let Some(recording) = self.recording.as_mut() {
            recording.extend(messages.iter().map(|message| Event::Msix {
                time_ps: now.0,
                vector: message.vector,
                address: message.address,
                data: message.data,
            }));
        }
        if let Some(checker) = self.checker.as_mut() {
            for message in &messages {
                checker.expect_msix(MsixEvent {
                    time: now,
                    message: *message,
                });
            }
        }
        self.msix
            .extend(messages.into_iter().map(|message| MsixEvent { time: now, message }));
        while let Some(frame) = self.device.poll_transmit() {
            if let Some(trace) = self.trace.as_mut() {
                trace.add_frame(now, "frame out", &frame);
            }
            if let Some(checker) = self.checker.as_mut() {
                checker.expect(FrameEvent {
                    time: now,
                    frame: frame.clone(),
                });
            }
            if let Some(recording) = self.recording.as_mut() {
                recording.push(Event::FrameOut {
                    time_ps: now.0,
                    frame: replay::hex(&frame),
                });
            }
            self.transmitted.push_back(FrameEvent { time: now, frame });
        }
    }

    /// Reads configuration space.
    pub fn config_read(&mut self, offset: usize, data: &mut [u8]) -> Result<(), VipError> {
        check_config_access(offset, data.len())?;
        let length = data.len();
        self.record(|| Event::ConfigRead { offset, length });
        self.device.config_read(offset, data);
        if let Some(recording) = self.recording.as_mut() {
            recording.push(Event::ReadData {
                data: replay::hex(data),
            });
        }
        Ok(())
    }

    /// Writes configuration space.
    pub fn config_write(&mut self, offset: usize, data: &[u8]) -> Result<(), VipError> {
        check_config_access(offset, data.len())?;
        self.record(|| Event::ConfigWrite {
            offset,
            data: replay::hex(data),
        });
        self.device.config_write(offset, data);
        self.collect();
        Ok(())
    }

    /// Reads a BAR (1, 2, 4 or 8 bytes).
    pub fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]) -> Result<(), VipError> {
        check_bar_access(offset, data.len())?;
        let length = data.len();
        self.record(|| Event::BarRead { bar, offset, length });
        self.device.bar_read(bar, offset, data);
        if let Some(recording) = self.recording.as_mut() {
            recording.push(Event::ReadData {
                data: replay::hex(data),
            });
        }
        self.collect();
        Ok(())
    }

    /// Writes a BAR (1, 2, 4 or 8 bytes).
    pub fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> Result<(), VipError> {
        check_bar_access(offset, data.len())?;
        self.record(|| Event::BarWrite {
            bar,
            offset,
            data: replay::hex(data),
        });
        if let Some(trace) = self.trace.as_mut() {
            let mut value = [0u8; 8];
            value[..data.len()].copy_from_slice(data);
            trace.add_instant(
                self.device.now(),
                Track::Mmio,
                format!("BAR{bar} write {offset:#x}"),
                vec![("value".into(), format!("{:#x}", u64::from_le_bytes(value)))],
            );
        }
        self.device.bar_write(bar, offset, data);
        self.collect();
        Ok(())
    }

    /// Reads host memory: the backdoor regions, or the testbench's memory through its bus.
    pub fn memory_read(&self, address: u64, data: &mut [u8]) -> Result<(), VipError> {
        self.host_memory().read(address, data).map_err(VipError::Memory)
    }

    /// Writes host memory (as [`Session::memory_read`]).
    pub fn memory_write(&mut self, address: u64, data: &[u8]) -> Result<(), VipError> {
        self.record(|| Event::MemoryWrite {
            address,
            data: replay::hex(data),
        });
        self.host_memory().write(address, data).map_err(VipError::Memory)
    }

    fn host_memory(&self) -> &dyn HostMemory {
        match &self.backdoor {
            Some(memory) => &**memory,
            None => &*self.memory,
        }
    }

    /// Whether host memory is the model's own (backdoor regions).
    pub fn has_backdoor_memory(&self) -> bool {
        self.backdoor.is_some()
    }

    /// Delivers an Ethernet frame (without FCS) to the port now.
    pub fn receive_frame(&mut self, frame: &[u8]) -> Result<(), VipError> {
        if frame.len() > 16 * 1024 {
            return Err(VipError::Invalid(format!(
                "a {}-byte frame: at most 16 KiB",
                frame.len()
            )));
        }
        self.record(|| Event::ReceiveFrame {
            frame: replay::hex(frame),
        });
        if let Some(trace) = self.trace.as_mut() {
            trace.add_frame(self.device.now(), "frame in", frame);
        }
        self.device.receive_frame(frame);
        self.collect();
        Ok(())
    }

    /// Starts checking a DUT's port against the model's (crate::checker): from now on
    /// every frame the model transmits is expected from the DUT too; `tolerance` bounds
    /// the difference of transmit times (None: not compared). Starting again starts afresh.
    pub fn start_check(&mut self, tolerance: Option<Picoseconds>) {
        self.start_check_streams(Streams::FRAMES, tolerance);
    }

    /// Starts checking `streams` of the DUT against the model's (crate::checker): from now
    /// on every output of those streams the model produces is expected from the DUT too,
    /// with the time it happened; `tolerance` bounds the difference of times (None: not
    /// compared). Starting again starts afresh.
    pub fn start_check_streams(&mut self, streams: Streams, tolerance: Option<Picoseconds>) {
        // What the device did before the check is not expected.
        self.collect_tapped(self.device.now());
        let watch = [Stream::DmaWrite, Stream::Cqe, Stream::Eqe]
            .into_iter()
            .any(|stream| streams.contains(stream));
        self.tap.watch.store(watch, Ordering::Relaxed);
        self.checker = Some(Checker::with_streams(streams, tolerance));
    }

    fn checker_of(&mut self, stream: Stream) -> Result<&mut Checker, VipError> {
        let checker = self
            .checker
            .as_mut()
            .ok_or_else(|| VipError::Invalid("no check was started".into()))?;
        if !checker.checks(stream) {
            return Err(VipError::Invalid(format!(
                "the check was started without the {} stream",
                stream.name()
            )));
        }
        Ok(checker)
    }

    /// The DUT transmitted `frame` at `time`: the mismatch with the model's frame, if any.
    pub fn check_frame(&mut self, time: Picoseconds, frame: &[u8]) -> Result<Option<Mismatch>, VipError> {
        Ok(self.checker_of(Stream::Frame)?.notify_frame(time, frame))
    }

    /// The DUT wrote `data` at bus address `address` at `time`: the mismatch with the
    /// model's write to that address, if any.
    pub fn check_dma_write(
        &mut self,
        time: Picoseconds,
        address: u64,
        data: &[u8],
    ) -> Result<Option<Mismatch>, VipError> {
        Ok(self.checker_of(Stream::DmaWrite)?.notify_dma_write(time, address, data))
    }

    /// The DUT wrote the CQE `entry` (32 or 64 bytes, as in the CQ buffer) to CQ `cqn` at
    /// `time`: the mismatch with the model's CQE, if any.
    pub fn check_cqe(&mut self, time: Picoseconds, cqn: u32, entry: &[u8]) -> Result<Option<Mismatch>, VipError> {
        Ok(self.checker_of(Stream::Cqe)?.notify_cqe(time, cqn, entry))
    }

    /// The DUT wrote the EQE `entry` to `queue` at `time`: the mismatch, if any.
    pub fn check_eqe(
        &mut self,
        time: Picoseconds,
        queue: EventQueue,
        entry: &[u8],
    ) -> Result<Option<Mismatch>, VipError> {
        Ok(self.checker_of(Stream::Eqe)?.notify_eqe(time, queue, entry))
    }

    /// The DUT raised MSI-X `vector` (`address`, `data`) at `time`: the mismatch, if any.
    pub fn check_msix(
        &mut self,
        time: Picoseconds,
        vector: u16,
        address: u64,
        data: u32,
    ) -> Result<Option<Mismatch>, VipError> {
        Ok(self.checker_of(Stream::Msix)?.notify_msix(time, vector, address, data))
    }

    /// The check, once started: its mismatches and what matched so far.
    pub fn checker(&self) -> Option<&Checker> {
        self.checker.as_ref()
    }

    /// Ends the check: every mismatch, the first divergence first (outputs the model
    /// produced and the DUT did not included).
    pub fn finish_check(&mut self) -> Result<Vec<Mismatch>, VipError> {
        let checker = self
            .checker
            .as_mut()
            .ok_or_else(|| VipError::Invalid("no check was started".into()))?;
        Ok(checker.finish().to_vec())
    }

    /// Starts recording inputs and outputs (crate::replay). Only before the first input.
    /// On the testbench's memory (callbacks), every DMA read is recorded with its answer
    /// as an input and every DMA write as an output, so the replay needs no callbacks.
    pub fn start_recording(&mut self) -> Result<(), VipError> {
        if self.touched {
            return Err(VipError::Invalid(
                "a recording starts before the session's first input".into(),
            ));
        }
        self.tap.record.store(self.backdoor.is_none(), Ordering::Relaxed);
        self.recording = Some(Vec::new());
        Ok(())
    }

    /// The events recorded so far.
    pub fn recording(&self) -> Option<&[Event]> {
        self.recording.as_deref()
    }

    /// The recording as text: the configuration, then one event a line (JSON lines).
    pub fn recording_text(&self) -> Option<String> {
        let events = self.recording.as_ref()?;
        Some(replay::to_text(&self.config.to_json(), self.backdoor.is_none(), events))
    }

    fn record(&mut self, event: impl FnOnce() -> Event) {
        self.touched = true;
        if let Some(recording) = self.recording.as_mut() {
            recording.push(event());
        }
    }

    /// Has the device write its cached contexts back to host memory (what a backdoor
    /// context read does first).
    pub fn write_back_contexts(&mut self) {
        self.record(|| Event::ContextWriteBack);
        self.device.write_back_contexts();
        self.collect();
    }

    /// Starts a trace (crate::trace): from now on the timing model's charges, frames,
    /// MMIO writes and MSI-X messages are recorded. Starting again starts afresh.
    pub fn start_trace(&mut self) {
        self.device.timing_mut().set_stage_log(true);
        self.trace = Some(Trace::new(self.device.timing().totals()));
    }

    /// The trace, if one was started.
    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    /// The functional coverage collected so far at the device's ports (crate::coverage).
    pub fn coverage(&self) -> Coverage {
        self.coverage.coverage()
    }

    /// The oldest transmitted frame nobody took yet.
    pub fn poll_transmit(&mut self) -> Option<FrameEvent> {
        self.transmitted.pop_front()
    }

    /// The oldest transmitted frame nobody took yet, left in place.
    pub fn peek_transmit(&self) -> Option<&FrameEvent> {
        self.transmitted.front()
    }

    /// The oldest MSI-X message nobody took yet.
    pub fn poll_msix(&mut self) -> Option<MsixEvent> {
        self.msix.pop_front()
    }

    /// Reads context `index` of `table` from host memory after the device wrote its
    /// cached contexts back (the state a QUERY mailbox would return), without a command:
    /// a backdoor read. `data.len()` bytes from the context's start.
    pub fn context_read(&mut self, table: ContextTable, index: u32, data: &mut [u8]) -> Result<(), VipError> {
        self.write_back_contexts();
        let address = self
            .device
            .context_address(table, index)
            .ok_or_else(|| VipError::Invalid(format!("{table:?} {index}: no such object in the table")))?;
        self.host_memory().read(address, data).map_err(VipError::Memory)
    }
}

fn check_config_access(offset: usize, len: usize) -> Result<(), VipError> {
    if !(1..=4).contains(&len) || offset.checked_add(len).is_none_or(|end| end > 4096) {
        return Err(VipError::Invalid(format!(
            "configuration access of {len} bytes at {offset:#x}: 1..4 bytes inside 4 KiB"
        )));
    }
    Ok(())
}

fn check_bar_access(offset: u64, len: usize) -> Result<(), VipError> {
    if ![1, 2, 4, 8].contains(&len) || offset.checked_add(len as u64).is_none() {
        return Err(VipError::Invalid(format!(
            "BAR access of {len} bytes at {offset:#x}: 1, 2, 4 or 8 bytes"
        )));
    }
    Ok(())
}
