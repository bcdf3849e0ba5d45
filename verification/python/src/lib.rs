//! # rnic_vip — the verification IP as a Python module
//!
//! The operations of the C ABI (`verification/capi`) over the same core (`rnic-vip`), for
//! cocotb and plain Python testbenches: a [`Session`] is one model instance driven by
//! transactions (configuration space, BARs, backdoor memory, frames in and out with their
//! virtual times, MSI-X, the port checker, coverage, recording, traces), `transact` runs
//! a batch of them in one call, `decode`/`encode` are the RoCEv2 header codec by field
//! name, and `Stimulus`/`Scoreboard` are the seeded constrained-random work requests and
//! the per-QP scoreboard of `rnic_vip::stimulus`.
//!
//! Errors are Python exceptions carrying the core's message (`VipError`; `ScoreboardError`
//! for a scoreboard mismatch, its message starting with the seed). No panic crosses the
//! boundary: every entry point runs under `catch_unwind` and a panic becomes a `VipError`
//! saying so (PyO3 would raise its `PanicException`, which `except Exception` misses).
//! See docs/guides/verification.md.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use rnic_firmware_if::mailbox::ContextTable;
use rnic_hw_model::Picoseconds;
use vip::checker::{EventQueue, Mismatch, Stream, Streams};
use vip::stimulus::{
    Completion, QpPair, Scoreboard as CoreScoreboard, Side, SizeClass, Stimulus as CoreStimulus, StimulusConfig,
    StimulusError, WorkRequest as CoreWorkRequest, WrOpcode,
};
use vip::{codec, replay, VipError as CoreError};

create_exception!(
    rnic_vip,
    VipError,
    PyException,
    "A verification call failed; the message says why."
);
create_exception!(
    rnic_vip,
    ScoreboardError,
    VipError,
    "The scoreboard found a difference; the message names the seed, the QP and the work request."
);

fn error(e: CoreError) -> PyErr {
    VipError::new_err(e.to_string())
}

fn invalid(message: impl Into<String>) -> PyErr {
    VipError::new_err(message.into())
}

fn stimulus_error(e: StimulusError) -> PyErr {
    match e {
        StimulusError::Mismatch(m) => ScoreboardError::new_err(m.to_string()),
        other => VipError::new_err(other.to_string()),
    }
}

/// Runs `f`; a panic inside becomes a `VipError` with the panic's message.
fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(VipError::new_err(format!("internal error (panic): {message}")))
    })
}

fn context_table(table: &Bound<'_, PyAny>) -> PyResult<ContextTable> {
    if let Ok(number) = table.extract::<u32>() {
        return match number {
            0 => Ok(ContextTable::Qpc),
            1 => Ok(ContextTable::Mpt),
            2 => Ok(ContextTable::Cqc),
            3 => Ok(ContextTable::Srqc),
            _ => Err(invalid(format!(
                "context table {number}: 0 (QPC), 1 (MPT), 2 (CQC) or 3 (SRQC)"
            ))),
        };
    }
    let name: String = table.extract()?;
    match name.to_ascii_uppercase().as_str() {
        "QPC" => Ok(ContextTable::Qpc),
        "MPT" => Ok(ContextTable::Mpt),
        "CQC" => Ok(ContextTable::Cqc),
        "SRQC" => Ok(ContextTable::Srqc),
        _ => Err(invalid(format!("context table {name:?}: QPC, MPT, CQC or SRQC"))),
    }
}

fn mismatch_dict<'py>(py: Python<'py>, m: &Mismatch) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("stream", m.stream.name())?;
    dict.set_item("index", m.index)?;
    dict.set_item("qpn", m.qpn)?;
    dict.set_item("queue", &m.queue)?;
    dict.set_item("field", &m.field)?;
    dict.set_item("model", &m.expected)?;
    dict.set_item("dut", &m.actual)?;
    dict.set_item("message", m.to_string())?;
    Ok(dict)
}

/// One model instance (a device and its backdoor host memory) on virtual time.
///
/// `Session(config="")`: the configuration as TOML, or JSON when it starts with `{`
/// (docs/guides/verification.md). Times are integer picoseconds. A session is used from
/// the thread that created it.
#[pyclass(unsendable, module = "rnic_vip")]
pub struct Session {
    inner: vip::Session,
}

impl Session {
    fn read(&mut self, what: &str, args: &[u64]) -> PyResult<Vec<u8>> {
        let length = |n: u64| -> PyResult<usize> {
            usize::try_from(n)
                .ok()
                .filter(|n| *n <= 1 << 30)
                .ok_or_else(|| invalid(format!("{what}: length {n} above 1 GiB")))
        };
        match (what, args) {
            ("config_read", [offset, n]) => {
                let mut data = vec![0; length(*n)?];
                self.inner.config_read(*offset as usize, &mut data).map_err(error)?;
                Ok(data)
            }
            ("bar_read", [bar, offset, n]) => {
                let bar = u8::try_from(*bar).map_err(|_| invalid(format!("BAR {bar}")))?;
                let mut data = vec![0; length(*n)?];
                self.inner.bar_read(bar, *offset, &mut data).map_err(error)?;
                Ok(data)
            }
            ("mem_read", [address, n]) => {
                let mut data = vec![0; length(*n)?];
                self.inner.memory_read(*address, &mut data).map_err(error)?;
                Ok(data)
            }
            _ => Err(invalid(format!("{what}: unknown read or wrong arguments {args:?}"))),
        }
    }

    /// One operation of a batch: a tuple whose first element names it.
    fn operation(&mut self, py: Python<'_>, op: &Bound<'_, PyTuple>) -> PyResult<Py<PyAny>> {
        let name: String = op.get_item(0)?.extract()?;
        let int = |i: usize| -> PyResult<u64> { op.get_item(i)?.extract() };
        let bytes = |i: usize| -> PyResult<Vec<u8>> { Ok(op.get_item(i)?.extract::<&[u8]>()?.to_vec()) };
        let arity = |n: usize| -> PyResult<()> {
            if op.len() == n {
                Ok(())
            } else {
                Err(invalid(format!(
                    "{name}: {} argument(s), {} given",
                    n - 1,
                    op.len() - 1
                )))
            }
        };
        let none = py.None();
        match name.as_str() {
            "config_read" => {
                arity(3)?;
                let data = self.read("config_read", &[int(1)?, int(2)?])?;
                Ok(PyBytes::new(py, &data).into_any().unbind())
            }
            "bar_read" => {
                arity(4)?;
                let data = self.read("bar_read", &[int(1)?, int(2)?, int(3)?])?;
                Ok(PyBytes::new(py, &data).into_any().unbind())
            }
            "mem_read" => {
                arity(3)?;
                let data = self.read("mem_read", &[int(1)?, int(2)?])?;
                Ok(PyBytes::new(py, &data).into_any().unbind())
            }
            "config_write" => {
                arity(3)?;
                self.inner.config_write(int(1)? as usize, &bytes(2)?).map_err(error)?;
                Ok(none)
            }
            "bar_write" => {
                arity(4)?;
                let bar = u8::try_from(int(1)?).map_err(|_| invalid("bar_write: BAR above 255"))?;
                self.inner.bar_write(bar, int(2)?, &bytes(3)?).map_err(error)?;
                Ok(none)
            }
            "bar_write32" => {
                arity(4)?;
                let bar = u8::try_from(int(1)?).map_err(|_| invalid("bar_write32: BAR above 255"))?;
                let value = u32::try_from(int(3)?).map_err(|_| invalid("bar_write32: value above 32 bits"))?;
                self.inner
                    .bar_write(bar, int(2)?, &value.to_le_bytes())
                    .map_err(error)?;
                Ok(none)
            }
            "bar_write64" => {
                arity(4)?;
                let bar = u8::try_from(int(1)?).map_err(|_| invalid("bar_write64: BAR above 255"))?;
                self.inner
                    .bar_write(bar, int(2)?, &int(3)?.to_le_bytes())
                    .map_err(error)?;
                Ok(none)
            }
            "mem_write" => {
                arity(3)?;
                self.inner.memory_write(int(1)?, &bytes(2)?).map_err(error)?;
                Ok(none)
            }
            "frame_receive" => {
                arity(2)?;
                self.inner.receive_frame(&bytes(1)?).map_err(error)?;
                Ok(none)
            }
            "advance_to" => {
                arity(2)?;
                self.inner.advance_to(Picoseconds(int(1)?)).map_err(error)?;
                Ok(none)
            }
            "run_until_idle" => {
                arity(2)?;
                let reached = self.inner.run_until_idle(Picoseconds(int(1)?));
                Ok(reached.0.into_pyobject(py)?.into_any().unbind())
            }
            _ => Err(invalid(format!(
                "unknown operation {name:?}: config_read, config_write, bar_read, bar_write, bar_write32, \
                 bar_write64, mem_read, mem_write, frame_receive, advance_to, run_until_idle"
            ))),
        }
    }
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (config = ""))]
    fn new(config: &str) -> PyResult<Self> {
        guard(|| {
            Ok(Self {
                inner: vip::Session::new(config, None).map_err(error)?,
            })
        })
    }

    /// Current virtual time, ps.
    fn now(&self) -> u64 {
        self.inner.now().0
    }

    /// Time of the next pending event, ps (None: nothing pending).
    fn next_event_time(&self) -> Option<u64> {
        self.inner.next_event_time().map(|t| t.0)
    }

    /// Runs every event due by `time_ps`, each at its own instant, then moves to `time_ps`.
    fn advance_to(&mut self, time_ps: u64) -> PyResult<()> {
        guard(|| self.inner.advance_to(Picoseconds(time_ps)).map_err(error))
    }

    /// Runs until nothing is pending or the next event is past `limit_ps`; returns the
    /// time reached.
    #[pyo3(signature = (limit_ps = u64::MAX))]
    fn run_until_idle(&mut self, limit_ps: u64) -> PyResult<u64> {
        guard(|| Ok(self.inner.run_until_idle(Picoseconds(limit_ps)).0))
    }

    /// Reads `length` (1–4) bytes of configuration space at `offset`.
    fn config_read<'py>(&mut self, py: Python<'py>, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| Ok(PyBytes::new(py, &self.read("config_read", &[offset, length])?)))
    }

    /// Writes `data` (1–4 bytes) to configuration space at `offset`.
    fn config_write(&mut self, offset: usize, data: &[u8]) -> PyResult<()> {
        guard(|| self.inner.config_write(offset, data).map_err(error))
    }

    /// Reads the little-endian 32-bit value of configuration space at `offset`.
    fn config_read32(&mut self, offset: u64) -> PyResult<u32> {
        guard(|| {
            let data = self.read("config_read", &[offset, 4])?;
            Ok(u32::from_le_bytes([data[0], data[1], data[2], data[3]]))
        })
    }

    /// Reads `length` (1, 2, 4 or 8) bytes of BAR `bar` at `offset`.
    fn bar_read<'py>(&mut self, py: Python<'py>, bar: u64, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| Ok(PyBytes::new(py, &self.read("bar_read", &[bar, offset, length])?)))
    }

    /// Reads the little-endian 32-bit register of BAR `bar` at `offset`.
    fn bar_read32(&mut self, bar: u64, offset: u64) -> PyResult<u32> {
        guard(|| {
            let data = self.read("bar_read", &[bar, offset, 4])?;
            Ok(u32::from_le_bytes([data[0], data[1], data[2], data[3]]))
        })
    }

    /// Writes `data` (1, 2, 4 or 8 bytes) to BAR `bar` at `offset`.
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) -> PyResult<()> {
        guard(|| self.inner.bar_write(bar, offset, data).map_err(error))
    }

    /// Writes the 32-bit `value` (little-endian) to BAR `bar` at `offset`.
    fn bar_write32(&mut self, bar: u8, offset: u64, value: u32) -> PyResult<()> {
        guard(|| self.inner.bar_write(bar, offset, &value.to_le_bytes()).map_err(error))
    }

    /// Writes the 64-bit `value` (little-endian) to BAR `bar` at `offset`.
    fn bar_write64(&mut self, bar: u8, offset: u64, value: u64) -> PyResult<()> {
        guard(|| self.inner.bar_write(bar, offset, &value.to_le_bytes()).map_err(error))
    }

    /// Reads `length` bytes of the backdoor host memory at `address`.
    fn mem_read<'py>(&mut self, py: Python<'py>, address: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| Ok(PyBytes::new(py, &self.read("mem_read", &[address, length])?)))
    }

    /// Writes `data` to the backdoor host memory at `address`.
    fn mem_write(&mut self, address: u64, data: &[u8]) -> PyResult<()> {
        guard(|| self.inner.memory_write(address, data).map_err(error))
    }

    /// Reads the first `length` bytes of context `index` of `table` (`"QPC"`, `"MPT"`,
    /// `"CQC"`, `"SRQC"` or 0–3) as the device would write it back.
    fn context_read<'py>(
        &mut self,
        py: Python<'py>,
        table: &Bound<'py, PyAny>,
        index: u32,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| {
            let table = context_table(table)?;
            if length > 4096 {
                return Err(invalid(format!("context_read: length {length} above 4096")));
            }
            let mut data = vec![0; length];
            self.inner.context_read(table, index, &mut data).map_err(error)?;
            Ok(PyBytes::new(py, &data))
        })
    }

    /// Hands the port an Ethernet frame (without FCS) at the current time.
    fn frame_receive(&mut self, frame: &[u8]) -> PyResult<()> {
        guard(|| self.inner.receive_frame(frame).map_err(error))
    }

    /// Takes every frame the port sent since the last call: `[(time_ps, frame), …]`.
    fn frames<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let list = PyList::empty(py);
            while let Some(event) = self.inner.poll_transmit() {
                list.append((event.time.0, PyBytes::new(py, &event.frame)))?;
            }
            Ok(list)
        })
    }

    /// Takes every MSI-X message sent since the last call:
    /// `[(time_ps, vector, address, data), …]`.
    fn msix<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let list = PyList::empty(py);
            while let Some(event) = self.inner.poll_msix() {
                let m = event.message;
                list.append((event.time.0, m.vector, m.address, m.data))?;
            }
            Ok(list)
        })
    }

    /// Runs a batch of operations in order, in one call, and returns their results (bytes
    /// for reads, the time reached for `run_until_idle`, None otherwise). Each operation
    /// is a tuple: `("config_read", offset, length)`, `("config_write", offset, data)`,
    /// `("bar_read", bar, offset, length)`, `("bar_write", bar, offset, data)`,
    /// `("bar_write32", bar, offset, value)`, `("bar_write64", bar, offset, value)`,
    /// `("mem_read", address, length)`, `("mem_write", address, data)`,
    /// `("frame_receive", frame)`, `("advance_to", time_ps)`, `("run_until_idle",
    /// limit_ps)`. The first that fails stops the batch with a `VipError` naming its
    /// index (the operations before it took effect, as they would on a bus).
    fn transact<'py>(&mut self, py: Python<'py>, operations: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let results = PyList::empty(py);
            for (index, op) in operations.try_iter()?.enumerate() {
                let op = op?;
                let tuple = op
                    .cast::<PyTuple>()
                    .map_err(|_| invalid(format!("operation {index}: a tuple expected")))?;
                if tuple.is_empty() {
                    return Err(invalid(format!("operation {index}: an empty tuple")));
                }
                let result = self.operation(py, tuple).map_err(|e| {
                    invalid(format!(
                        "operation {index} {}: {}",
                        tuple.repr().map(|r| r.to_string()).unwrap_or_default(),
                        e.value(py)
                    ))
                })?;
                results.append(result)?;
            }
            Ok(results)
        })
    }

    /// Starts the checker: every output of the model in `streams` from now on is expected
    /// from the DUT (`"frame"`, `"dma_write"`, `"cqe"`, `"eqe"`, `"msix"`; None: frames
    /// only); times must agree within `tolerance_ps` (None: not compared).
    #[pyo3(signature = (tolerance_ps = None, streams = None))]
    fn check_start(&mut self, tolerance_ps: Option<u64>, streams: Option<Vec<String>>) -> PyResult<()> {
        guard(|| {
            let mut set = Streams::default();
            for name in streams.unwrap_or_else(|| vec!["frame".into()]) {
                let stream = match name.as_str() {
                    "frame" => Stream::Frame,
                    "dma_write" => Stream::DmaWrite,
                    "cqe" => Stream::Cqe,
                    "eqe" => Stream::Eqe,
                    "msix" => Stream::Msix,
                    _ => return Err(invalid(format!("stream {name:?}: frame, dma_write, cqe, eqe or msix"))),
                };
                set = Streams(set.0 | stream.bit());
            }
            self.inner.start_check_streams(set, tolerance_ps.map(Picoseconds));
            Ok(())
        })
    }

    /// Notifies a frame the DUT transmitted at `time_ps`; returns None when it matches the
    /// model's next frame for its QP, or the mismatch as a dict (`stream`, `index`, `qpn`,
    /// `queue`, `field`, `model`, `dut`, `message`), which the checker also keeps.
    fn check_frame<'py>(
        &mut self,
        py: Python<'py>,
        time_ps: u64,
        frame: &[u8],
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        guard(|| {
            let mismatch = self.inner.check_frame(Picoseconds(time_ps), frame).map_err(error)?;
            mismatch.map(|m| mismatch_dict(py, &m)).transpose()
        })
    }

    /// Notifies a DMA write of the DUT (`data` at `address`); as `check_frame`.
    fn check_dma_write<'py>(
        &mut self,
        py: Python<'py>,
        time_ps: u64,
        address: u64,
        data: &[u8],
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        guard(|| {
            let mismatch = self
                .inner
                .check_dma_write(Picoseconds(time_ps), address, data)
                .map_err(error)?;
            mismatch.map(|m| mismatch_dict(py, &m)).transpose()
        })
    }

    /// Notifies a CQE the DUT wrote to CQ `cqn` (its bytes, owner bit included); as
    /// `check_frame`.
    fn check_cqe<'py>(
        &mut self,
        py: Python<'py>,
        time_ps: u64,
        cqn: u32,
        entry: &[u8],
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        guard(|| {
            let mismatch = self.inner.check_cqe(Picoseconds(time_ps), cqn, entry).map_err(error)?;
            mismatch.map(|m| mismatch_dict(py, &m)).transpose()
        })
    }

    /// Notifies an EQE the DUT wrote to completion EQ `queue` (an int) or to the
    /// asynchronous EQ (`"async"`); as `check_frame`.
    fn check_eqe<'py>(
        &mut self,
        py: Python<'py>,
        time_ps: u64,
        queue: &Bound<'py, PyAny>,
        entry: &[u8],
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        guard(|| {
            let queue = match queue.extract::<u32>() {
                Ok(ceqn) => EventQueue::Completion(ceqn),
                Err(_) if queue.extract::<String>().is_ok_and(|q| q == "async") => EventQueue::Async,
                Err(_) => return Err(invalid("EQE queue: a completion EQ number or \"async\"")),
            };
            let mismatch = self
                .inner
                .check_eqe(Picoseconds(time_ps), queue, entry)
                .map_err(error)?;
            mismatch.map(|m| mismatch_dict(py, &m)).transpose()
        })
    }

    /// Notifies an MSI-X message the DUT raised; as `check_frame`.
    fn check_msix<'py>(
        &mut self,
        py: Python<'py>,
        time_ps: u64,
        vector: u16,
        address: u64,
        data: u32,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        guard(|| {
            let mismatch = self
                .inner
                .check_msix(Picoseconds(time_ps), vector, address, data)
                .map_err(error)?;
            mismatch.map(|m| mismatch_dict(py, &m)).transpose()
        })
    }

    /// Ends the check: every mismatch (frames the model sent and the DUT did not
    /// included), first divergence first, as dicts.
    fn check_finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let list = PyList::empty(py);
            for m in self.inner.finish_check().map_err(error)? {
                list.append(mismatch_dict(py, &m)?)?;
            }
            Ok(list)
        })
    }

    /// The functional coverage collected so far (JSON, schema `rnic-vip-coverage/1`).
    fn coverage_json(&self) -> PyResult<String> {
        guard(|| Ok(self.inner.coverage().to_json()))
    }

    /// Writes the functional coverage to the file `path`.
    fn coverage_write(&self, path: &str) -> PyResult<()> {
        guard(|| std::fs::write(path, self.inner.coverage().to_json()).map_err(|e| invalid(format!("{path}: {e}"))))
    }

    /// Starts recording every input and output (before the first input).
    fn record_start(&mut self) -> PyResult<()> {
        guard(|| self.inner.start_recording().map_err(error))
    }

    /// The recording so far (JSON lines, schema `rnic-vip-recording/1`).
    fn recording(&self) -> PyResult<String> {
        guard(|| {
            self.inner
                .recording_text()
                .ok_or_else(|| invalid("no recording was started (record_start)"))
        })
    }

    /// Writes the recording to the file `path`.
    fn record_write(&self, path: &str) -> PyResult<()> {
        guard(|| {
            let text = self.recording()?;
            std::fs::write(path, text).map_err(|e| invalid(format!("{path}: {e}")))
        })
    }

    /// Starts tracing (again from nothing if a trace was running).
    fn trace_start(&mut self) {
        self.inner.start_trace();
    }

    /// Writes the trace to the file `path` in the Chrome/Perfetto JSON format, as process
    /// `pid` named `name`.
    #[pyo3(signature = (path, pid = 1, name = "rnic"))]
    fn trace_write(&self, path: &str, pid: u32, name: &str) -> PyResult<()> {
        guard(|| {
            let trace = self
                .inner
                .trace()
                .ok_or_else(|| invalid("no trace was started (trace_start)"))?;
            std::fs::write(path, trace.to_perfetto_json(pid, name)).map_err(|e| invalid(format!("{path}: {e}")))
        })
    }
}

/// A frame taken apart by the model's codec.
#[pyclass(frozen, module = "rnic_vip")]
pub struct Parsed {
    fields: Vec<(&'static str, u64)>,
    /// The payload, without pad and ICRC.
    #[pyo3(get)]
    payload: Vec<u8>,
    /// The opcode's name (`RC_RDMA_WRITE_FIRST`…).
    #[pyo3(get)]
    opcode: String,
}

#[pymethods]
impl Parsed {
    /// The fields in header order, as a dict (`bth.psn`, `reth.va`, …).
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, value) in &self.fields {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        format!(
            "Parsed({}, {} field(s), {} payload byte(s))",
            self.opcode,
            self.fields.len(),
            self.payload.len()
        )
    }
}

/// Takes a frame apart: its fields, payload and opcode name. `VipError` when the device's
/// receive path would drop it (the ICRC included).
#[pyfunction]
fn parse(frame: &[u8]) -> PyResult<Parsed> {
    guard(|| {
        let decoded = codec::decode(frame).map_err(error)?;
        Ok(Parsed {
            fields: decoded.fields,
            payload: decoded.payload,
            opcode: decoded.opcode_name,
        })
    })
}

/// The frame's fields in header order, as a dict (`parse(frame).fields`).
#[pyfunction]
fn decode<'py>(py: Python<'py>, frame: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    parse(frame)?.fields(py)
}

/// A valid frame from named fields (defaults for the rest; derived fields ignored) and a
/// payload, as the model builds it.
#[pyfunction]
#[pyo3(signature = (fields, payload = None))]
fn encode<'py>(
    py: Python<'py>,
    fields: BTreeMap<String, u64>,
    payload: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    guard(|| {
        let frame = codec::encode(&fields, payload.unwrap_or_default()).map_err(error)?;
        Ok(PyBytes::new(py, &frame))
    })
}

/// Replays a recording (the text `Session.recording()` returned) on a fresh session and
/// returns the number of events that matched; `VipError` names the first divergence.
#[pyfunction(name = "replay")]
fn replay_recording(text: &str) -> PyResult<usize> {
    guard(|| replay::replay(text).map_err(error))
}

/// The size in bytes of the `firmware-if` layout `name` (`Qpc`, `Cqe`, `Descriptor`, …).
#[pyfunction]
fn layout_size(name: &str) -> PyResult<usize> {
    guard(|| Ok(vip::layout::layout(name).map_err(error)?.size))
}

/// Returns `data` with field `field` of layout `layout` set to `value` (`data` at least
/// the layout's size; a new bytes object, the input is not changed).
#[pyfunction]
fn field_set<'py>(
    py: Python<'py>,
    data: &[u8],
    layout: &str,
    field: &str,
    value: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    guard(|| {
        let mut bytes = data.to_vec();
        vip::layout::set_field(&mut bytes, layout, field, value).map_err(error)?;
        Ok(PyBytes::new(py, &bytes))
    })
}

/// The value of field `field` of layout `layout` in `data`.
#[pyfunction]
fn field_get(data: &[u8], layout: &str, field: &str) -> PyResult<u64> {
    guard(|| vip::layout::get_field(data, layout, field).map_err(error))
}

/// One work request of a [`Stimulus`].
#[pyclass(frozen, module = "rnic_vip")]
pub struct WorkRequest {
    inner: CoreWorkRequest,
}

#[pymethods]
impl WorkRequest {
    /// Its number in the stimulus (0 first); also its `wr_id`.
    #[getter]
    fn index(&self) -> u64 {
        self.inner.index
    }
    /// The requester QP.
    #[getter]
    fn qpn(&self) -> u32 {
        self.inner.qpn
    }
    /// The responder QP.
    #[getter]
    fn remote_qpn(&self) -> u32 {
        self.inner.remote_qpn
    }
    /// Its number among its QP's requests.
    #[getter]
    fn sequence(&self) -> u64 {
        self.inner.sequence
    }
    /// The opcode's name (`SEND`, `SEND_WITH_IMM`, `RDMA_WRITE`, `RDMA_WRITE_WITH_IMM`,
    /// `RDMA_READ`).
    #[getter]
    fn opcode(&self) -> &'static str {
        self.inner.opcode.name()
    }
    /// The size class's name.
    #[getter]
    fn size_class(&self) -> &'static str {
        self.inner.size_class.name()
    }
    /// Message length, bytes.
    #[getter]
    fn length(&self) -> u32 {
        self.inner.length
    }
    /// The immediate (None for opcodes without one).
    #[getter]
    fn immediate(&self) -> Option<u32> {
        self.inner.immediate
    }
    /// Offset of its buffer in the requester's region.
    #[getter]
    fn local_offset(&self) -> u64 {
        self.inner.local_offset
    }
    /// Offset of its buffer in the responder's region.
    #[getter]
    fn remote_offset(&self) -> u64 {
        self.inner.remote_offset
    }
    /// Whether a receive is consumed at the responder.
    #[getter]
    fn consumes_receive(&self) -> bool {
        self.inner.opcode.consumes_receive()
    }
    /// The bytes its source buffer holds, and so the bytes that must land.
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.payload())
    }
    fn __repr__(&self) -> String {
        format!(
            "WorkRequest(index={}, qpn={:#x}, opcode={}, length={})",
            self.inner.index,
            self.inner.qpn,
            self.inner.opcode.name(),
            self.inner.length
        )
    }
}

/// Seeded constrained-random work requests (`rnic_vip::stimulus`).
///
/// `Stimulus(seed, count=32, qps=[(0x10, 0x20)], opcodes=None, size_classes=None,
/// mtu=1024, max_packets=4)`: `qps` as (requester, responder) QPN pairs; `opcodes` and
/// `size_classes` by name (None: all).
#[pyclass(frozen, module = "rnic_vip")]
pub struct Stimulus {
    inner: CoreStimulus,
}

#[pymethods]
impl Stimulus {
    #[new]
    #[pyo3(signature = (seed, count = 32, qps = None, opcodes = None, size_classes = None, mtu = 1024, max_packets = 4))]
    fn new(
        seed: u64,
        count: usize,
        qps: Option<Vec<(u32, u32)>>,
        opcodes: Option<Vec<String>>,
        size_classes: Option<Vec<String>>,
        mtu: u32,
        max_packets: u32,
    ) -> PyResult<Self> {
        guard(|| {
            let defaults = StimulusConfig::default();
            let opcodes = match opcodes {
                None => defaults.opcodes,
                Some(names) => names
                    .iter()
                    .map(|n| {
                        WrOpcode::from_name(n).ok_or_else(|| invalid(format!("seed {seed}: unknown opcode {n:?}")))
                    })
                    .collect::<PyResult<_>>()?,
            };
            let size_classes = match size_classes {
                None => defaults.size_classes,
                Some(names) => names
                    .iter()
                    .map(|n| {
                        SizeClass::from_name(n).ok_or_else(|| invalid(format!("seed {seed}: unknown size class {n:?}")))
                    })
                    .collect::<PyResult<_>>()?,
            };
            if count > 1 << 20 {
                return Err(invalid(format!("seed {seed}: count {count} above 1048576")));
            }
            let config = StimulusConfig {
                seed,
                count,
                qps: qps.map_or(defaults.qps, |pairs| {
                    pairs
                        .into_iter()
                        .map(|(requester, responder)| QpPair { requester, responder })
                        .collect()
                }),
                opcodes,
                size_classes,
                mtu,
                max_packets,
            };
            Ok(Self {
                inner: CoreStimulus::generate(config).map_err(stimulus_error)?,
            })
        })
    }

    /// The seed.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }

    /// Bytes each side's region needs for every request's buffer.
    #[getter]
    fn region_size(&self) -> u64 {
        self.inner.region_size()
    }

    /// The requests in posting order.
    fn requests(&self) -> Vec<WorkRequest> {
        self.inner
            .requests()
            .iter()
            .map(|r| WorkRequest { inner: r.clone() })
            .collect()
    }

    /// The requests as JSON.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    fn __len__(&self) -> usize {
        self.inner.requests().len()
    }
}

/// The per-QP scoreboard of a [`Stimulus`]: predicted completions and data, compared with
/// what the testbench observed. Every mismatch raises `ScoreboardError` (naming the seed,
/// the QP and the request) and is kept.
#[pyclass(unsendable, module = "rnic_vip")]
pub struct Scoreboard {
    inner: CoreScoreboard,
}

#[pymethods]
impl Scoreboard {
    #[new]
    fn new(stimulus: &Stimulus) -> Self {
        Self {
            inner: CoreScoreboard::new(&stimulus.inner),
        }
    }

    /// An observed completion: `side` is `"requester"` (send completion, `wr_id` the
    /// request's index) or `"responder"` (receive completion on the responder QP `qpn`,
    /// with `byte_len` and `immediate`); `status` 0 is success.
    #[pyo3(signature = (qpn, side, wr_id = None, status = 0, byte_len = None, immediate = None))]
    fn complete(
        &mut self,
        qpn: u32,
        side: &str,
        wr_id: Option<u64>,
        status: u32,
        byte_len: Option<u32>,
        immediate: Option<u32>,
    ) -> PyResult<()> {
        guard(|| {
            let side = match side {
                "requester" => Side::Requester,
                "responder" => Side::Responder,
                _ => {
                    return Err(invalid(format!(
                        "seed {}: side {side:?}: \"requester\" or \"responder\"",
                        self.inner.seed()
                    )))
                }
            };
            self.inner
                .complete(&Completion {
                    qpn,
                    side,
                    wr_id,
                    status,
                    byte_len,
                    immediate,
                })
                .map_err(stimulus_error)
        })
    }

    /// The bytes found at request `wr`'s destination.
    fn check_data(&mut self, wr: u64, data: &[u8]) -> PyResult<()> {
        guard(|| self.inner.check_data(wr, data).map_err(stimulus_error))
    }

    /// Ends the comparison; returns every mismatch's message (predictions that never came
    /// included). Empty: everything agreed.
    fn finish(&mut self) -> PyResult<Vec<String>> {
        guard(|| Ok(self.inner.finish().iter().map(ToString::to_string).collect()))
    }

    /// Completions and data checks that agreed so far.
    #[getter]
    fn matched(&self) -> u64 {
        self.inner.matched()
    }

    /// The seed of the stimulus.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }
}

/// The module.
#[pymodule]
fn rnic_vip(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("VipError", m.py().get_type::<VipError>())?;
    m.add("ScoreboardError", m.py().get_type::<ScoreboardError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Session>()?;
    m.add_class::<Parsed>()?;
    m.add_class::<Stimulus>()?;
    m.add_class::<WorkRequest>()?;
    m.add_class::<Scoreboard>()?;
    m.add_function(wrap_pyfunction!(parse, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(replay_recording, m)?)?;
    m.add_function(wrap_pyfunction!(layout_size, m)?)?;
    m.add_function(wrap_pyfunction!(field_set, m)?)?;
    m.add_function(wrap_pyfunction!(field_get, m)?)?;
    Ok(())
}
