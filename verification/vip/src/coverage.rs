//! Functional coverage: a plan of named groups of bins, hit counts collected at the
//! device's ports (a [`Collector`], the observer a [`Session`](crate::Session) attaches and
//! any testbench can attach to a `Device` of its own), exported as JSON, merged across
//! runs, and reported with the holes (bins never hit) listed.
//!
//! The plan collected today (bin names are stable; a group absent from a run counts as 0):
//!
//! | Group | Bins |
//! |---|---|
//! | `transmitted.opcode_size`, `received.opcode_size` | every RC/UC/UD opcode of the wire table × payload size class (`0`, `1-256`, `257-1024`, `1025-4096`, `>4096`; `-` for opcodes without payload) |
//! | `transmitted.aeth`, `received.aeth` | ACK, RNR NAK, NAK PSN sequence error / invalid request / remote access / remote operational / invalid RD request |
//! | `transmitted.network`, `received.network` | IPv4, IPv6, each with and without an 802.1Q tag |
//! | `transmitted.congestion`, `received.congestion` | ECN CE, FECN, BECN |
//! | `received.malformed` | a frame the receive path drops as malformed (the codec says why; one bin) |
//! | `qp.transition` | every QP state transition the device accepts (`qp::state::LEGAL_TRANSITIONS`; the transport's moves to ERR included) |
//! | `completion.status` | the status of each CQE handed to the CQ block |
//! | `completion.refused` | a CQE the CQ block did not write (CQ full, in error or gone) |
//! | `event.async` | every asynchronous event type the device asked the event block for |
//! | `transmitted.opcode_size_mtu`, `received.opcode_size_mtu` | the opcode × size class cross with the QP's path MTU (256…4096; the opcode names the QP type): the size classes that fit the MTU, `-` for opcodes without payload |
//! | `mtt.hop_page` | per object kind (QP WQE buffer, CQ, EQ, MPT), the MTT hop count × buffer page size its context set up (`MPT/PA`: a physically addressed region) |
//! | `retransmission.cause` | each time a requester went back to send packets again: after a NAK PSN sequence error, after an RNR NAK, or on the retry timer (`timeout`) |
//! | `queue.wrap` | a CQ, a CEQ or the AEQ wrapped around its ring (its entries' owner bit flipped) |
//!
//! The last four are inferred by a [`Collector`] per device from what its ports show: the
//! mailbox port names the command and the bus port shows the command queue descriptor that
//! posted it and the context the firmware read from its input buffer (MTU, destination QP,
//! hop counts and page sizes come from there, so objects not created through a mailbox are
//! not seen); the bus port shows the CQE and EQE
//! writes and their owner bits; a request is a retransmission when its PSN is below one
//! already sent on its QP, and its cause is the NAK its QP received last, if any.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{Descriptor, Opcode};
use rnic_firmware_if::context::{Cqc, Eqc, Mpt, Qpc};
use rnic_firmware_if::cqe::{Cqe, CqeStatus};
use rnic_firmware_if::eqe::{Aeqe, Ceqe};
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode, PostMailbox};
use rnic_hw_model::probe::{Observer, Port, Transaction};
use rnic_hw_model::qp::state::LEGAL_TRANSITIONS;
use rnic_hw_model::wire::{BthOpcode, Service};
use rnic_hw_model::{Device, Picoseconds};
use serde::{Deserialize, Serialize};

use crate::{codec, VipError};

/// The JSON schema name and version of a coverage file.
pub const SCHEMA: &str = "rnic-vip-coverage/1";

/// One group of the plan: what it measures and its bins' hit counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// What the group measures.
    pub description: String,
    /// Hit count per bin (every bin of the plan, hit or not).
    pub bins: BTreeMap<String, u64>,
}

/// Coverage of one or more runs: the file format (JSON, [`SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// How many runs were merged into this.
    pub runs: u64,
    /// The groups by name.
    pub groups: BTreeMap<String, Group>,
}

const SIZE_CLASSES: [&str; 5] = ["0", "1-256", "257-1024", "1025-4096", ">4096"];
const AETH_BINS: [&str; 7] = [
    "ACK",
    "RNR_NAK",
    "NAK_PSN_SEQUENCE_ERROR",
    "NAK_INVALID_REQUEST",
    "NAK_REMOTE_ACCESS_ERROR",
    "NAK_REMOTE_OPERATIONAL_ERROR",
    "NAK_INVALID_RD_REQUEST",
];
const NETWORK_BINS: [&str; 4] = ["IPv4", "IPv4+VLAN", "IPv6", "IPv6+VLAN"];
const CONGESTION_BINS: [&str; 3] = ["ECN_CE", "FECN", "BECN"];
const MTUS: [u64; 5] = [256, 512, 1024, 2048, 4096];
const MTT_OBJECTS: [&str; 4] = ["QP", "CQ", "EQ", "MPT"];
const PAGE_SIZES: [&str; 3] = ["4KiB", "64KiB", "2MiB"];
const RETRANSMISSION_CAUSES: [&str; 3] = ["NAK_PSN_SEQUENCE_ERROR", "RNR_NAK", "timeout"];
const WRAP_BINS: [&str; 3] = ["CQ", "CEQ", "AEQ"];

/// The size classes a packet can have under `mtu`.
fn size_classes_under(mtu: u64) -> impl Iterator<Item = &'static str> {
    [
        (0, SIZE_CLASSES[0]),
        (1, SIZE_CLASSES[1]),
        (257, SIZE_CLASSES[2]),
        (1025, SIZE_CLASSES[3]),
    ]
    .into_iter()
    .filter(move |(lowest, _)| *lowest <= mtu)
    .map(|(_, class)| class)
}

/// A buffer page size (`*_BUF_PG_SZ`: 4 KiB << value) as a bin name.
fn page_size_name(value: u64) -> String {
    match 12 + value {
        shift @ 12..=19 => format!("{}KiB", 1u64 << (shift - 10)),
        shift @ 20..=29 => format!("{}MiB", 1u64 << (shift - 20)),
        shift => format!("{}GiB", 1u64 << (shift.min(60) - 30)),
    }
}

fn size_class(length: u64) -> &'static str {
    match length {
        0 => SIZE_CLASSES[0],
        1..=256 => SIZE_CLASSES[1],
        257..=1024 => SIZE_CLASSES[2],
        1025..=4096 => SIZE_CLASSES[3],
        _ => SIZE_CLASSES[4],
    }
}

fn covered_opcodes() -> impl Iterator<Item = BthOpcode> {
    BthOpcode::all_known().filter(|op| matches!(op.service(), Service::Rc | Service::Uc | Service::Ud))
}

/// The AETH syndrome's bin (IBA 9.7.5.2.2): bits 7:5 say ACK (000), RNR NAK (001) or NAK
/// (011, the code in bits 4:0).
fn aeth_bin(syndrome: u64) -> Option<&'static str> {
    match (syndrome >> 5) & 0x7 {
        0b000 => Some(AETH_BINS[0]),
        0b001 => Some(AETH_BINS[1]),
        0b011 => AETH_BINS.get(2 + (syndrome & 0x1f) as usize).copied(),
        _ => None,
    }
}

fn group(description: &str, bins: impl IntoIterator<Item = String>) -> Group {
    Group {
        description: description.into(),
        bins: bins.into_iter().map(|bin| (bin, 0)).collect(),
    }
}

impl Default for Coverage {
    fn default() -> Self {
        Self::new()
    }
}

impl Coverage {
    /// The plan with every bin at 0 (one run).
    pub fn new() -> Self {
        let mut groups = BTreeMap::new();
        for direction in ["transmitted", "received"] {
            let opcode_bins = covered_opcodes().flat_map(|op| {
                let sizes: &[&str] = if op.has_payload() { &SIZE_CLASSES } else { &["-"] };
                sizes.iter().map(move |size| format!("{}/{size}", op.name()))
            });
            groups.insert(
                format!("{direction}.opcode_size"),
                group("opcode × payload size class (bytes) of each RoCEv2 packet", opcode_bins),
            );
            let mtu_bins = covered_opcodes().flat_map(|op| {
                MTUS.iter().flat_map(move |mtu| {
                    let sizes: Vec<&str> = if op.has_payload() {
                        size_classes_under(*mtu).collect()
                    } else {
                        vec!["-"]
                    };
                    sizes
                        .into_iter()
                        .map(move |size| format!("{}/{size}/mtu{mtu}", op.name()))
                })
            });
            groups.insert(
                format!("{direction}.opcode_size_mtu"),
                group(
                    "opcode × payload size class × path MTU of the QP (from its MODIFY_QPC)",
                    mtu_bins,
                ),
            );
            groups.insert(
                format!("{direction}.aeth"),
                group("AETH syndrome of each ACK/NAK", AETH_BINS.iter().map(|b| b.to_string())),
            );
            groups.insert(
                format!("{direction}.network"),
                group("IP version and 802.1Q tag", NETWORK_BINS.iter().map(|b| b.to_string())),
            );
            groups.insert(
                format!("{direction}.congestion"),
                group(
                    "congestion marks: IP ECN CE, BTH FECN, BTH BECN",
                    CONGESTION_BINS.iter().map(|b| b.to_string()),
                ),
            );
        }
        groups.insert(
            "received.malformed".into(),
            group("frames the receive path drops as malformed", ["malformed".to_string()]),
        );
        groups.insert(
            "qp.transition".into(),
            group(
                "QP state transitions the device accepts (MODIFY_QPC and the transport's)",
                LEGAL_TRANSITIONS.iter().map(|(from, to)| transition_bin(*from, *to)),
            ),
        );
        groups.insert(
            "completion.status".into(),
            group(
                "status of each CQE handed to the CQ block",
                CqeStatus::ALL.iter().map(|status| format!("{status:?}")),
            ),
        );
        groups.insert(
            "completion.refused".into(),
            group(
                "CQEs the CQ block did not write (CQ full, in error or gone)",
                ["refused".to_string()],
            ),
        );
        groups.insert(
            "event.async".into(),
            group(
                "asynchronous event types requested from the event block",
                AsyncEventType::ALL.iter().map(|event| format!("{event:?}")),
            ),
        );
        groups.insert(
            "mtt.hop_page".into(),
            group(
                "MTT hop count × buffer page size set up by each CREATE/MODIFY context",
                MTT_OBJECTS
                    .iter()
                    .flat_map(|object| {
                        (0..3)
                            .flat_map(move |hop| PAGE_SIZES.iter().map(move |page| format!("{object}/hop{hop}/{page}")))
                    })
                    .chain(["MPT/PA".to_string()]),
            ),
        );
        groups.insert(
            "retransmission.cause".into(),
            group(
                "why a request packet was sent again",
                RETRANSMISSION_CAUSES.iter().map(|b| b.to_string()),
            ),
        );
        groups.insert(
            "queue.wrap".into(),
            group(
                "a CQ, CEQ or AEQ wrapped around its ring (owner bit flipped)",
                WRAP_BINS.iter().map(|b| b.to_string()),
            ),
        );
        Self {
            schema: SCHEMA.into(),
            runs: 1,
            groups,
        }
    }

    fn hit(&mut self, group: &str, bin: &str) {
        if let Some(count) = self.groups.get_mut(group).and_then(|g| g.bins.get_mut(bin)) {
            *count += 1;
        }
    }

    /// Like [`Coverage::hit`], adding the bin when the plan lacks it: what the model did
    /// outside the plan shows in the report rather than vanishing.
    fn hit_or_add(&mut self, group: &str, bin: String) {
        if let Some(group) = self.groups.get_mut(group) {
            *group.bins.entry(bin).or_insert(0) += 1;
        }
    }

    /// Samples one transaction seen at a port of the device: frames in and out (as
    /// [`Coverage::sample_frame`]), QP state changes, CQEs and asynchronous events; the
    /// other transactions are not in the plan.
    pub fn sample_transaction(&mut self, transaction: &Transaction<'_>) {
        match *transaction {
            Transaction::FrameIn(frame) => self.sample_frame("received", frame),
            Transaction::FrameOut(frame) => self.sample_frame("transmitted", frame),
            Transaction::QpState { from, to, .. } => self.hit_or_add("qp.transition", transition_bin(from, to)),
            Transaction::Cqe { cqe, written, .. } => {
                let status = CqeStatus::try_from(cqe.status())
                    .map_or_else(|_| format!("undefined {:#x}", cqe.status()), |s| format!("{s:?}"));
                self.hit_or_add("completion.status", status);
                if !written {
                    self.hit("completion.refused", "refused");
                }
            }
            Transaction::AsyncEvent { event, .. } => self.hit_or_add("event.async", format!("{event:?}")),
            _ => {}
        }
    }

    /// Samples one frame (Ethernet, no FCS) seen in `direction` (`"transmitted"` or
    /// `"received"`).
    pub fn sample_frame(&mut self, direction: &str, frame: &[u8]) {
        let decoded = match codec::decode(frame) {
            Ok(decoded) => decoded,
            Err(_) => {
                self.hit(&format!("{direction}.malformed"), "malformed");
                return;
            }
        };
        let get = |name: &str| decoded.get(name).unwrap_or(0);
        let opcode = BthOpcode::from(get("bth.opcode") as u8);
        let size = if opcode.has_payload() {
            size_class(get("payload.len"))
        } else {
            "-"
        };
        self.hit(
            &format!("{direction}.opcode_size"),
            &format!("{}/{size}", opcode.name()),
        );
        if let Some(bin) = decoded.get("aeth.syndrome").and_then(aeth_bin) {
            self.hit(&format!("{direction}.aeth"), bin);
        }
        let vlan = if decoded.get("eth.vlan").is_some() { "+VLAN" } else { "" };
        self.hit(
            &format!("{direction}.network"),
            &format!("IPv{}{vlan}", get("ip.version")),
        );
        if get("ip.ecn") == 3 {
            self.hit(&format!("{direction}.congestion"), "ECN_CE");
        }
        if get("bth.fecn") == 1 {
            self.hit(&format!("{direction}.congestion"), "FECN");
        }
        if get("bth.becn") == 1 {
            self.hit(&format!("{direction}.congestion"), "BECN");
        }
    }

    /// The JSON text of a coverage file.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A coverage file's JSON text; refuses another schema.
    pub fn from_json(text: &str) -> Result<Self, VipError> {
        let coverage: Self =
            serde_json::from_str(text).map_err(|e| VipError::Invalid(format!("coverage JSON: {e}")))?;
        if coverage.schema != SCHEMA {
            return Err(VipError::Invalid(format!(
                "coverage schema {:?}: {SCHEMA:?} expected",
                coverage.schema
            )));
        }
        Ok(coverage)
    }

    /// Adds `other`'s runs and hits to this; groups and bins only one side has are kept
    /// (plans of different versions of the model merge into their union).
    pub fn merge(&mut self, other: &Coverage) {
        self.runs += other.runs;
        for (name, theirs) in &other.groups {
            let ours = self.groups.entry(name.clone()).or_insert_with(|| Group {
                description: theirs.description.clone(),
                bins: BTreeMap::new(),
            });
            for (bin, count) in &theirs.bins {
                *ours.bins.entry(bin.clone()).or_insert(0) += count;
            }
        }
    }

    /// Bins hit and bins in the plan, over every group.
    pub fn totals(&self) -> (usize, usize) {
        self.groups.values().fold((0, 0), |(hit, all), group| {
            (
                hit + group.bins.values().filter(|c| **c > 0).count(),
                all + group.bins.len(),
            )
        })
    }

    /// The report: a table of groups (bins hit of bins, percent) and then every hole,
    /// group by group. A hole is information, not a failure.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let (hit, all) = self.totals();
        out.push_str(&format!(
            "coverage of {} run(s): {hit} of {all} bins hit ({:.1} %)\n\n",
            self.runs,
            percent(hit, all)
        ));
        out.push_str(&format!(
            "{:<28} {:>6} {:>6} {:>7}  {}\n",
            "group", "hit", "bins", "%", "measures"
        ));
        for (name, group) in &self.groups {
            let hit = group.bins.values().filter(|c| **c > 0).count();
            out.push_str(&format!(
                "{name:<28} {hit:>6} {:>6} {:>7.1}  {}\n",
                group.bins.len(),
                percent(hit, group.bins.len()),
                group.description
            ));
        }
        out.push_str("\nholes (bins never hit):\n");
        for (name, group) in &self.groups {
            let holes: Vec<&str> = group
                .bins
                .iter()
                .filter(|(_, c)| **c == 0)
                .map(|(b, _)| b.as_str())
                .collect();
            if !holes.is_empty() {
                out.push_str(&format!("  {name} ({}): {}\n", holes.len(), holes.join(", ")));
            }
        }
        out
    }
}

fn transition_bin(from: rnic_firmware_if::context::QpState, to: rnic_firmware_if::context::QpState) -> String {
    format!("{from:?}->{to:?}").to_uppercase()
}

/// The ports a [`Collector`] watches.
pub const COLLECTED_PORTS: [Port; 6] = [
    Port::Network,
    Port::QpState,
    Port::Completion,
    Port::Event,
    Port::Mailbox,
    Port::Bus,
];

/// A coverage collector at the device's ports: an [`Observer`] that samples what crosses
/// them into one [`Coverage`]. Clones share it, so one collector can watch every port of
/// several devices (both ends of a link, say) and a testbench needs no [`Session`](crate::Session):
/// [`Collector::attach`] puts it on a `Device`.
#[derive(Debug, Clone, Default)]
pub struct Collector {
    coverage: Arc<Mutex<Coverage>>,
    /// What one device's ports showed that later transactions are read against (each
    /// [`Collector::attach`] makes its device its own).
    device: Arc<Mutex<DeviceWatch>>,
}

/// Per device: the recent DMA, the QPs' MTU and destination, the queues' owner bits, the
/// PSNs sent and the NAKs received.
#[derive(Debug, Default)]
struct DeviceWatch {
    /// The last DMA reads of a context's size (address, bytes), newest last.
    reads: VecDeque<(u64, Vec<u8>)>,
    /// The input buffer of each mailbox command posted and not yet completed, by
    /// (command, tag), from the command queue descriptors read.
    mailbox_inputs: BTreeMap<(u8, u32), u64>,
    /// DMA writes since the last CQE (one of them is the next CQE's), newest last.
    writes: VecDeque<Vec<u8>>,
    /// An EQE asked for and not yet seen written: its queue and how to recognise it.
    pending_eqe: Option<(String, EqeSought)>,
    /// The owner bit of the last entry written, per queue (`CQ 1`, `CEQ 0`, `AEQ`).
    owners: BTreeMap<String, bool>,
    /// Per local QP: (destination QPN, path MTU in bytes).
    qps: BTreeMap<u32, (u32, u64)>,
    /// Per local QP: the PSN after the highest request PSN sent.
    next_psn: BTreeMap<u32, u32>,
    /// Per local QP: the last NAK received and not yet followed by a retransmission.
    nak: BTreeMap<u32, &'static str>,
    /// Per local QP: the PSN of the last packet sent again, while the requester is going
    /// back (one episode, one cause).
    resending: BTreeMap<u32, u32>,
}

#[derive(Debug, Clone, Copy)]
enum EqeSought {
    Completion(u32),
    Async(u8),
}

const CONTEXT_READS: usize = 16;
const WRITES_KEPT: usize = 32;
const PSN_MASK: u32 = 0xFF_FFFF;

impl DeviceWatch {
    /// Samples what the plan's inferred groups need from `transaction` into `coverage`.
    fn sample(&mut self, coverage: &mut Coverage, transaction: &Transaction<'_>) {
        match *transaction {
            Transaction::DmaRead { address, data } => {
                // A command queue descriptor posting a mailbox: where its input is.
                if data.len() == Descriptor::SIZE && Descriptor::OPCODE.get(data) == Opcode::PostMailbox as u64 {
                    let post = &data[8..];
                    let key = (PostMailbox::CMD.get(post) as u8, PostMailbox::TAG.get(post) as u32);
                    if self.mailbox_inputs.len() < 64 || self.mailbox_inputs.contains_key(&key) {
                        self.mailbox_inputs.insert(key, PostMailbox::IN_PARAM.get(post));
                    }
                }
                if [Qpc::SIZE, Cqc::SIZE].contains(&data.len()) {
                    if self.reads.len() == CONTEXT_READS {
                        self.reads.pop_front();
                    }
                    self.reads.push_back((address, data.to_vec()));
                }
            }
            Transaction::DmaWrite { data, .. } => {
                if let Some((queue, sought)) = self.pending_eqe.take() {
                    let (matches, owner) = match sought {
                        EqeSought::Completion(cqn) => (
                            data.len() >= Ceqe::SIZE && Ceqe::CQN.get(data) == u64::from(cqn),
                            Ceqe::OWNER.get(data) != 0,
                        ),
                        EqeSought::Async(event) => (
                            data.len() >= Aeqe::SIZE && Aeqe::EVENT_TYPE.get(data) == u64::from(event),
                            Aeqe::OWNER.get(data) != 0,
                        ),
                    };
                    if matches {
                        self.owner(coverage, queue, owner);
                    }
                }
                if data.len() == 32 || data.len() == 64 {
                    if self.writes.len() == WRITES_KEPT {
                        self.writes.pop_front();
                    }
                    self.writes.push_back(data.to_vec());
                }
            }
            Transaction::Cqe {
                cqn,
                cqe,
                written: true,
                ..
            } => {
                let written = self.writes.iter().rev().find(|data| {
                    let mut expected = *cqe;
                    expected.set_owner(Cqe::OWNER.get(data) != 0);
                    expected.bytes()[..data.len()] == data[..]
                });
                if let Some(data) = written {
                    let owner = Cqe::OWNER.get(data) != 0;
                    self.owner(coverage, format!("CQ {cqn}"), owner);
                }
                self.writes.clear();
            }
            Transaction::CompletionEvent { ceqn, cqn } => {
                self.pending_eqe = Some((format!("CEQ {ceqn}"), EqeSought::Completion(cqn)));
            }
            Transaction::AsyncEvent { event, .. } => {
                self.pending_eqe = Some(("AEQ".into(), EqeSought::Async(event.into())));
            }
            Transaction::MailboxEvent { .. } => {
                self.pending_eqe = Some(("AEQ".into(), EqeSought::Async(AsyncEventType::Mb.into())));
            }
            Transaction::Mailbox {
                opcode,
                tag,
                status: MailboxCompletion::Success,
            } => self.mailbox(coverage, opcode, tag),
            Transaction::FrameOut(frame) => self.frame_out(coverage, frame),
            Transaction::FrameIn(frame) => self.frame_in(coverage, frame),
            _ => {}
        }
    }

    /// The entry just written to `queue` had `owner`: a flip is a wrap of the ring.
    fn owner(&mut self, coverage: &mut Coverage, queue: String, owner: bool) {
        let kind = queue.split(' ').next().unwrap_or_default().to_string();
        if self.owners.insert(queue, owner).is_some_and(|before| before != owner) {
            coverage.hit("queue.wrap", &kind);
        }
    }

    /// The `size` bytes last read at `address`.
    fn read_at(&self, address: u64, size: usize) -> Option<&[u8]> {
        self.reads
            .iter()
            .rev()
            .find(|(a, d)| *a == address && d.len() == size)
            .map(|(_, d)| d.as_slice())
    }

    /// A successful object command: what its context (read from its input buffer) set up.
    fn mailbox(&mut self, coverage: &mut Coverage, opcode: MailboxOpcode, tag: u32) {
        let Some(input) = self.mailbox_inputs.remove(&(opcode as u8, tag)) else {
            return;
        };
        let mut hop_page = |object: &str, hop: u64, page: u64| {
            coverage.hit_or_add("mtt.hop_page", format!("{object}/hop{hop}/{}", page_size_name(page)));
        };
        match opcode {
            MailboxOpcode::ModifyQpc => {
                // The context and its mask, one after the other in the input buffer.
                let (Some(context), Some(mask)) = (
                    self.read_at(input, Qpc::SIZE),
                    self.read_at(input + Qpc::SIZE as u64, Qpc::SIZE),
                ) else {
                    return;
                };
                let (context, mask) = (context.to_vec(), mask.to_vec());
                let (context, mask) = (context.as_slice(), mask.as_slice());
                let opened = |field: rnic_firmware_if::bits::Field| field.get(mask) == 0;
                let (mut dqpn, mut mtu) = self.qps.get(&tag).copied().unwrap_or((0, 0));
                if opened(Qpc::DQPN) {
                    dqpn = Qpc::DQPN.get(context) as u32;
                }
                if opened(Qpc::MTU) {
                    mtu = match Qpc::MTU.get(context) {
                        raw @ 1..=5 => 128 << raw,
                        _ => 0,
                    };
                }
                self.qps.insert(tag, (dqpn, mtu));
                if opened(Qpc::SQ_HOP_NUM) && opened(Qpc::WQE_SGE_BUF_PG_SZ) {
                    hop_page("QP", Qpc::SQ_HOP_NUM.get(context), Qpc::WQE_SGE_BUF_PG_SZ.get(context));
                }
            }
            MailboxOpcode::CreateMpt => {
                let Some(mpt) = self.read_at(input, Mpt::SIZE) else {
                    return;
                };
                if Mpt::PA.get(mpt) != 0 {
                    coverage.hit("mtt.hop_page", "MPT/PA");
                } else {
                    hop_page("MPT", Mpt::PBL_HOP_NUM.get(mpt), Mpt::PBL_BUF_PG_SZ.get(mpt));
                }
            }
            MailboxOpcode::CreateCqc => {
                if let Some(cqc) = self.read_at(input, Cqc::SIZE) {
                    hop_page("CQ", Cqc::CQE_HOP_NUM.get(cqc), Cqc::CQE_BUF_PG_SZ.get(cqc));
                }
                self.owners.remove(&format!("CQ {tag}"));
            }
            MailboxOpcode::CreateCeqc | MailboxOpcode::CreateAeqc => {
                if let Some(eqc) = self.read_at(input, Eqc::SIZE) {
                    hop_page("EQ", Eqc::EQE_HOP_NUM.get(eqc), Eqc::EQE_BUF_PG_SZ.get(eqc));
                }
                let queue = match opcode {
                    MailboxOpcode::CreateCeqc => format!("CEQ {tag}"),
                    _ => "AEQ".into(),
                };
                self.owners.remove(&queue);
            }
            _ => {}
        }
    }

    fn frame_out(&mut self, coverage: &mut Coverage, frame: &[u8]) {
        let Ok(decoded) = codec::decode(frame) else { return };
        let (Some(dqpn), Some(psn), Some(opcode)) = (
            decoded.get("bth.dqpn"),
            decoded.get("bth.psn"),
            decoded.get("bth.opcode"),
        ) else {
            return;
        };
        let opcode = BthOpcode::from(opcode as u8);
        // The local QP: the one whose destination this is (RC and UC).
        let local = self
            .qps
            .iter()
            .find(|(_, (d, _))| u64::from(*d) == dqpn)
            .map(|(q, (_, mtu))| (*q, *mtu));
        sample_mtu(coverage, "transmitted", &decoded, local.map(|l| l.1));
        let Some((local, _)) = local else { return };
        if !opcode.is_request() || matches!(opcode.service(), Service::Ud) {
            return;
        }
        let psn = psn as u32 & PSN_MASK;
        match self.next_psn.get(&local).copied() {
            // Behind what was sent (within half the PSN space): sent again. The packets
            // after the first of a go-back are the same episode, with the same cause.
            Some(next) if (1..=PSN_MASK / 2).contains(&(next.wrapping_sub(psn) & PSN_MASK)) => {
                let going_on = self
                    .resending
                    .get(&local)
                    .is_some_and(|last| (last + 1) & PSN_MASK == psn);
                if !going_on {
                    let cause = self.nak.remove(&local).unwrap_or("timeout");
                    coverage.hit("retransmission.cause", cause);
                }
                self.resending.insert(local, psn);
            }
            _ => {
                self.resending.remove(&local);
                self.next_psn.insert(local, (psn + 1) & PSN_MASK);
            }
        }
    }

    fn frame_in(&mut self, coverage: &mut Coverage, frame: &[u8]) {
        let Ok(decoded) = codec::decode(frame) else { return };
        let Some(dqpn) = decoded.get("bth.dqpn") else { return };
        let local = dqpn as u32;
        sample_mtu(coverage, "received", &decoded, self.qps.get(&local).map(|q| q.1));
        if let Some(nak @ ("RNR_NAK" | "NAK_PSN_SEQUENCE_ERROR")) = decoded.get("aeth.syndrome").and_then(aeth_bin) {
            self.nak.insert(local, nak);
        }
    }
}

/// The opcode × size × MTU bin of a decoded frame (`mtu?` when its QP's MTU is unknown).
fn sample_mtu(coverage: &mut Coverage, direction: &str, decoded: &codec::Decoded, mtu: Option<u64>) {
    let opcode = BthOpcode::from(decoded.get("bth.opcode").unwrap_or(0) as u8);
    if !matches!(opcode.service(), Service::Rc | Service::Uc | Service::Ud) {
        return;
    }
    let size = if opcode.has_payload() {
        size_class(decoded.get("payload.len").unwrap_or(0))
    } else {
        "-"
    };
    let mtu = mtu.filter(|m| *m > 0).map_or("mtu?".to_string(), |m| format!("mtu{m}"));
    coverage.hit_or_add(
        &format!("{direction}.opcode_size_mtu"),
        format!("{}/{size}/{mtu}", opcode.name()),
    );
}

impl Collector {
    /// An empty plan (one run).
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Coverage> {
        self.coverage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts a clone of this collector on each of [`COLLECTED_PORTS`] of `device` (replacing
    /// whatever observer was there). Observers watch only: the device does the same.
    pub fn attach(&self, device: &mut Device) {
        self.attach_with(device, |collector| Box::new(collector));
    }

    /// [`Collector::attach`], each port's observer made by `wrap` from a clone (for a
    /// testbench that wants to act when the device lets its observers go, say). The
    /// clones on one device share what that device showed; the counts are shared by all.
    pub fn attach_with(&self, device: &mut Device, mut wrap: impl FnMut(Collector) -> Box<dyn Observer>) {
        let for_device = Collector {
            coverage: self.coverage.clone(),
            device: Arc::default(),
        };
        for port in COLLECTED_PORTS {
            device.attach_observer(port, Some(wrap(for_device.clone())));
        }
    }

    /// The coverage collected so far.
    pub fn coverage(&self) -> Coverage {
        self.lock().clone()
    }

    /// Samples a frame directly (as [`Coverage::sample_frame`]).
    pub fn sample_frame(&self, direction: &str, frame: &[u8]) {
        self.lock().sample_frame(direction, frame);
    }
}

impl Observer for Collector {
    fn observe(&mut self, _at: Picoseconds, transaction: &Transaction<'_>) {
        let mut coverage = self.coverage.lock().unwrap_or_else(|e| e.into_inner());
        coverage.sample_transaction(transaction);
        self.device
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sample(&mut coverage, transaction);
    }
}

fn percent(hit: usize, all: usize) -> f64 {
    if all == 0 {
        100.0
    } else {
        hit as f64 * 100.0 / all as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(fields: &[(&str, u64)], payload_len: usize) -> Vec<u8> {
        let fields = fields.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        codec::encode(&fields, &vec![0xA5; payload_len]).unwrap()
    }

    #[test]
    fn a_sampled_frame_hits_its_opcode_size_network_and_congestion_bins() {
        let mut coverage = Coverage::new();
        let write = frame(
            &[
                ("bth.opcode", 0x0A),
                ("reth.len", 300),
                ("bth.fecn", 1),
                ("eth.vlan", 5),
            ],
            300,
        );
        coverage.sample_frame("transmitted", &write);
        let bins = |group: &str| &coverage.groups[group].bins;
        assert_eq!(bins("transmitted.opcode_size")["RC_RDMA_WRITE_ONLY/257-1024"], 1);
        assert_eq!(bins("transmitted.network")["IPv4+VLAN"], 1);
        assert_eq!(bins("transmitted.congestion")["FECN"], 1);
        assert_eq!(bins("transmitted.congestion")["BECN"], 0);
        assert_eq!(bins("received.opcode_size")["RC_RDMA_WRITE_ONLY/257-1024"], 0);
    }

    #[test]
    fn acks_and_naks_fall_in_their_syndrome_bins_and_a_bad_frame_is_malformed() {
        let mut coverage = Coverage::new();
        coverage.sample_frame("received", &frame(&[("bth.opcode", 0x11), ("aeth.syndrome", 0x1F)], 0));
        coverage.sample_frame("received", &frame(&[("bth.opcode", 0x11), ("aeth.syndrome", 0x62)], 0));
        coverage.sample_frame("received", &frame(&[("bth.opcode", 0x11), ("aeth.syndrome", 0x21)], 0));
        let mut bad = frame(&[("bth.opcode", 0x04)], 8);
        let last = bad.len() - 1;
        bad[last] ^= 0xFF;
        coverage.sample_frame("received", &bad);
        let aeth = &coverage.groups["received.aeth"].bins;
        assert_eq!(aeth["ACK"], 1);
        assert_eq!(aeth["NAK_REMOTE_ACCESS_ERROR"], 1);
        assert_eq!(aeth["RNR_NAK"], 1);
        assert_eq!(coverage.groups["received.malformed"].bins["malformed"], 1);
        assert_eq!(coverage.groups["received.opcode_size"].bins["RC_ACKNOWLEDGE/-"], 3);
    }

    #[test]
    fn merged_runs_add_their_hits_and_keep_the_union_of_bins() {
        let mut first = Coverage::new();
        first.sample_frame("transmitted", &frame(&[("bth.opcode", 0x04)], 0));
        let mut second = Coverage::new();
        second.sample_frame("transmitted", &frame(&[("bth.opcode", 0x04)], 0));
        second.sample_frame("transmitted", &frame(&[("bth.opcode", 0x04), ("ip.version", 6)], 2000));
        second
            .groups
            .get_mut("transmitted.network")
            .unwrap()
            .bins
            .insert("IPv7".into(), 4);
        let mut merged = Coverage::from_json(&first.to_json()).unwrap();
        merged.merge(&Coverage::from_json(&second.to_json()).unwrap());
        assert_eq!(merged.runs, 2);
        let sizes = &merged.groups["transmitted.opcode_size"].bins;
        assert_eq!(sizes["RC_SEND_ONLY/0"], 2);
        assert_eq!(sizes["RC_SEND_ONLY/1025-4096"], 1);
        assert_eq!(merged.groups["transmitted.network"].bins["IPv7"], 4);
        assert_eq!(merged.groups["transmitted.network"].bins["IPv6"], 1);
    }

    #[test]
    fn the_report_counts_bins_and_lists_every_hole() {
        let mut coverage = Coverage::new();
        coverage.sample_frame("transmitted", &frame(&[("bth.opcode", 0x04)], 0));
        let (hit, all) = coverage.totals();
        assert_eq!(hit, 2, "its opcode/size and network bins, nothing else");
        let report = coverage.report();
        assert!(
            report.starts_with(&format!("coverage of 1 run(s): 2 of {all} bins hit")),
            "{report}"
        );
        let holes = report.split("holes (bins never hit):").nth(1).unwrap();
        let transmitted = holes
            .lines()
            .find(|l| l.starts_with("  transmitted.opcode_size"))
            .unwrap();
        assert!(transmitted.contains(" RC_SEND_ONLY/1-256,"), "{transmitted}");
        assert!(
            !transmitted.contains(" RC_SEND_ONLY/0,"),
            "the bin hit is no hole: {transmitted}"
        );
        let received = holes.lines().find(|l| l.starts_with("  received.opcode_size")).unwrap();
        assert!(received.contains(" RC_SEND_ONLY/0,"), "{received}");
        assert!(holes.contains("received.malformed (1): malformed"));
    }

    #[test]
    fn the_collector_samples_frames_qp_transitions_cqes_and_events_at_the_ports() {
        use rnic_firmware_if::bits::Layout;
        use rnic_firmware_if::context::QpState;
        use rnic_firmware_if::cqe::Cqe;

        let collector = Collector::new();
        let mut port = collector.clone();
        let at = Picoseconds(1);
        port.observe(
            at,
            &Transaction::QpState {
                qpn: 8,
                from: QpState::Init,
                to: QpState::Rtr,
            },
        );
        port.observe(
            at,
            &Transaction::QpState {
                qpn: 8,
                from: QpState::Rtr,
                to: QpState::Init,
            },
        );
        let mut cqe = Cqe::zeroed();
        cqe.set_status(CqeStatus::RemoteAccessErr as u8);
        port.observe(
            at,
            &Transaction::Cqe {
                cqn: 1,
                cqe: &cqe,
                solicited: false,
                written: false,
            },
        );
        port.observe(
            at,
            &Transaction::AsyncEvent {
                event: AsyncEventType::CqOverflow,
                sub_type: 0,
                queue_number: 1,
            },
        );
        port.observe(at, &Transaction::FrameOut(&frame(&[("bth.opcode", 0x04)], 0)));
        port.observe(at, &Transaction::DmaWrite { address: 0, data: &[1] });
        let coverage = collector.coverage();
        let bins = |group: &str| &coverage.groups[group].bins;
        assert_eq!(bins("qp.transition")["INIT->RTR"], 1);
        assert_eq!(
            bins("qp.transition")["RTR->INIT"],
            1,
            "outside the plan: a bin of its own"
        );
        assert_eq!(bins("qp.transition")["RTR->RTS"], 0);
        assert_eq!(bins("completion.status")["RemoteAccessErr"], 1);
        assert_eq!(bins("completion.refused")["refused"], 1);
        assert_eq!(bins("event.async")["CqOverflow"], 1);
        assert_eq!(bins("transmitted.opcode_size")["RC_SEND_ONLY/0"], 1);
        assert_eq!(
            bins("transmitted.opcode_size_mtu")["RC_SEND_ONLY/0/mtu?"],
            1,
            "no MODIFY_QPC was seen: the MTU is unknown, a bin of its own"
        );
        assert_eq!(
            coverage.totals().0,
            8,
            "the DMA write alone is in no group: {}",
            coverage.report()
        );
    }

    #[test]
    fn a_queue_whose_entries_flip_their_owner_bit_has_wrapped() {
        use rnic_firmware_if::bits::Layout;
        use rnic_firmware_if::cqe::Cqe;
        use rnic_firmware_if::eqe::Ceqe;

        let collector = Collector::new();
        let mut port = collector.clone();
        let at = Picoseconds(1);
        let mut cqe = Cqe::zeroed();
        cqe.set_local_qp_number(8);
        // Lap 0 (owner 1) twice, then lap 1 (owner 0): the CQ wrapped once.
        for owner in [true, true, false] {
            let mut written = cqe;
            written.set_owner(owner);
            port.observe(
                at,
                &Transaction::DmaWrite {
                    address: 0x1000,
                    data: written.bytes(),
                },
            );
            port.observe(at, &Transaction::CompletionEvent { ceqn: 0, cqn: 1 });
            let mut ceqe = Ceqe::zeroed();
            ceqe.set_cq_number(1);
            ceqe.set_owner(owner);
            port.observe(
                at,
                &Transaction::DmaWrite {
                    address: 0x2000,
                    data: ceqe.bytes(),
                },
            );
            port.observe(
                at,
                &Transaction::Cqe {
                    cqn: 1,
                    cqe: &cqe,
                    solicited: false,
                    written: true,
                },
            );
        }
        let coverage = collector.coverage();
        let wrap = &coverage.groups["queue.wrap"].bins;
        assert_eq!((wrap["CQ"], wrap["CEQ"], wrap["AEQ"]), (1, 1, 0));
    }

    #[test]
    fn another_schema_or_broken_json_is_refused() {
        let mut coverage = Coverage::new();
        coverage.schema = "rnic-vip-coverage/0".into();
        assert!(Coverage::from_json(&coverage.to_json()).is_err());
        assert!(Coverage::from_json("{").is_err());
    }
}
