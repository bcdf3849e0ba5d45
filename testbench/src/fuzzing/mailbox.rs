//! Mailbox commands with contexts and masks from a hostile driver, against a device with
//! live objects: CREATE/MODIFY/QUERY/DESTROY of QPCs (MODIFY only: the one way a QP is
//! created, moved and torn down), CQCs, SRQCs, MPTs and EQCs, and the base-address-table
//! commands, each context built from a live object's context with any fields changed (or
//! raw bytes), masks opening any fields (or raw), tags of live, new or any objects; then
//! doorbells and time, so the data path runs on what the contexts now say.
//!
//! The driver may point the device anywhere in its memory, so the DMA check is that every
//! access stays in the arena or fails as unmapped. The invariants are the context rules,
//! checked around every command by querying the object before and after (until a raw
//! command, which may point a table at the mailbox buffers themselves):
//!
//! * a command that fails leaves the object exactly as it was (same query answer);
//! * a MODIFY_QPC that succeeds moves the QP along a transition the hns interface allows
//!   (a table written here, not the device's) and
//!   leaves exactly the merged context — current bits where the mask has ones, the new
//!   context's where it has zeros;
//!
//! both comparing every field but those the device moves itself as it runs (indices,
//! PSNs, retry counters, arm and error states), which traffic set off by an earlier
//! command may change between the queries;
//! * at the end, unless a base-address-table or raw command may have pointed the QPC
//!   table elsewhere, every QP the bed created is gone or in a state the state machine
//!   allows.

use std::cell::RefCell;

use arbitrary::{Arbitrary, Unstructured};
use rnic_firmware_if::bits::{Field, Layout};
use rnic_firmware_if::context::{Cqc, Eqc, Mpt, QpState, Qpc, Srqc};
use rnic_firmware_if::doorbell::Doorbell;
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode};
use rnic_hw_model::{HostMemory, Picoseconds};

use super::live::{LiveBed, Victim, ARENA_SIZE};
use crate::harness::DMA_BASE;

/// The QP transitions MODIFY_QPC may make, written here from the hns interface
/// (§10.1: RESET→{RESET, INIT}; INIT→{RESET, INIT, RTR, ERR}; RTR→{RESET, RTS, ERR};
/// RTS→{RESET, RTS, ERR}; ERR→{RESET, ERR}) and the rnic deviation RESET→ERR
/// (docs/hw-interface.md), apart from the device's own table.
fn legal_transition(from: QpState, to: QpState) -> bool {
    use QpState::*;
    matches!(
        (from, to),
        (Reset, Reset | Init | Err)
            | (Init, Reset | Init | Rtr | Err)
            | (Rtr, Reset | Rts | Err)
            | (Rts, Reset | Rts | Err)
            | (Err, Reset | Err)
    )
}

/// The context types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Qp,
    Cq,
    Srq,
    Mpt,
    Ceq,
    Aeq,
}

const KINDS: [Kind; 6] = [Kind::Qp, Kind::Cq, Kind::Srq, Kind::Mpt, Kind::Ceq, Kind::Aeq];

impl Kind {
    fn fields(self) -> &'static [Field] {
        match self {
            Kind::Qp => Qpc::FIELDS,
            Kind::Cq => Cqc::FIELDS,
            Kind::Srq => Srqc::FIELDS,
            Kind::Mpt => Mpt::FIELDS,
            Kind::Ceq | Kind::Aeq => Eqc::FIELDS,
        }
    }

    fn size(self) -> usize {
        match self {
            Kind::Qp => Qpc::SIZE,
            Kind::Cq => Cqc::SIZE,
            Kind::Srq => Srqc::SIZE,
            Kind::Mpt => Mpt::SIZE,
            Kind::Ceq | Kind::Aeq => Eqc::SIZE,
        }
    }

    /// The fields the device itself moves while it runs (queue indices, PSNs, retry
    /// counters, arm and error states): traffic a command set off earlier may change them
    /// between two queries, so the context rules compare every other field.
    fn device_maintained(self) -> &'static [&'static str] {
        match self {
            Kind::Qp => &[
                "QP_ST",
                "SQ_PRODUCER_IDX",
                "SQ_CONSUMER_IDX",
                "RQ_PRODUCER_IDX",
                "RQ_CONSUMER_IDX",
                "SQ_CUR_PSN",
                "SQ_MAX_PSN",
                "RX_ACK_EPSN",
                "RETRY_CNT",
                "RNR_CNT",
                "RX_REQ_EPSN",
                "RX_REQ_MSN",
                "RX_REQ_PSN_ERR",
            ],
            Kind::Cq => &["CQ_ST", "CQ_PRODUCER_IDX", "CQ_CONSUMER_IDX", "ARM_ST", "CMD_SN"],
            Kind::Srq => &["SRQ_ST", "PRODUCER_IDX", "CONSUMER_IDX", "LIMIT_WL"],
            Kind::Mpt => &["MPT_ST"],
            // EQE_CNT: QUERY reports the events waiting for coalescing (hardware state,
            // docs/hw-interface.md), which moves as events arrive and interrupts fire.
            Kind::Ceq | Kind::Aeq => &["EQ_ST", "EQ_PROD_INDX", "EQ_CONS_INDX", "ARM_ST", "EQE_CNT"],
        }
    }

    /// The driver-owned fields in which `a` and `b` differ.
    fn differing(self, a: &[u8], b: &[u8]) -> Vec<&'static str> {
        let dynamic = self.device_maintained();
        self.fields()
            .iter()
            .filter(|f| !dynamic.contains(&f.name) && f.get(a) != f.get(b))
            .map(|f| f.name)
            .collect()
    }

    /// (create, modify, query, destroy).
    fn opcodes(self) -> [Option<MailboxOpcode>; 4] {
        use MailboxOpcode::*;
        match self {
            Kind::Qp => [None, Some(ModifyQpc), Some(QueryQpc), None],
            Kind::Cq => [Some(CreateCqc), Some(ModifyCqc), Some(QueryCqc), Some(DestroyCqc)],
            Kind::Srq => [Some(CreateSrq), Some(ModifySrqc), Some(QuerySrqc), Some(DestroySrq)],
            Kind::Mpt => [Some(CreateMpt), None, Some(QueryMpt), Some(DestroyMpt)],
            Kind::Ceq => [Some(CreateCeqc), Some(ModifyCeqc), Some(QueryCeqc), Some(DestroyCeqc)],
            Kind::Aeq => [Some(CreateAeqc), Some(ModifyAeqc), Some(QueryAeqc), Some(DestroyAeqc)],
        }
    }
}

/// An object number.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum TagChoice {
    /// One of the bed's objects of that kind.
    Live(u8),
    /// A small number (within the context-table chunk the bed allocated).
    Near(u8),
    /// Any number.
    Raw(u32),
}

/// A context: a live object's context with fields changed, or raw bytes.
#[derive(Debug, Clone, Arbitrary)]
struct ContextSpec {
    template: u8,
    /// (field index modulo the layout's fields, value).
    fields: Vec<(u8, u64)>,
    raw: Option<Vec<u8>>,
}

/// A mask: keep everything but the opened fields, or raw bytes.
#[derive(Debug, Clone, Arbitrary)]
struct MaskSpec {
    open: Vec<u8>,
    raw: Option<Vec<u8>>,
}

/// What a command does.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Action {
    Create,
    Modify,
    Query,
    Destroy,
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
enum Op {
    /// A context command on an object of `kind` (modulo 6: QP, CQ, SRQ, MPT, CEQ, AEQ).
    Context {
        kind: u8,
        action: Action,
        tag: TagChoice,
        context: ContextSpec,
        mask: MaskSpec,
    },
    /// A base-address-table command (opcode chosen among the BT commands) with the
    /// address of a page of the arena or any address.
    Table {
        opcode: u8,
        tag: TagChoice,
        page: u16,
        raw_address: Option<u64>,
    },
    /// Any mailbox opcode with the mailbox input filled with `input`.
    Raw { opcode: u8, tag: u32, input: Vec<u8> },
    /// A doorbell to a QP (SQ or RQ) with any producer index.
    Doorbell { qp: TagChoice, send: bool, index: u16 },
    /// Let 2^(n mod 34) ns of virtual time pass.
    Advance(u8),
}

/// The live bed with its objects' contexts to start new ones from, and their numbers.
struct Bed<'a> {
    live: &'a mut LiveBed,
    templates: &'a [Vec<Vec<u8>>],
    tags: &'a [Vec<u32>],
    /// A raw command ran: it may have pointed a table at the mailbox buffers or at
    /// another table, so a context may now change when the driver writes a mailbox.
    aliased: bool,
}

/// Per kind: the live objects' contexts, and their numbers.
type Templates = (Vec<Vec<Vec<u8>>>, Vec<Vec<u32>>);

thread_local! {
    static BED: RefCell<Option<LiveBed>> = const { RefCell::new(None) };
    static TEMPLATES: RefCell<Option<Templates>> = const { RefCell::new(None) };
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(ops) = Vec::<Op>::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    super::with_bed(&BED, Victim::Anything, |live| {
        TEMPLATES.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(templates(live));
                // The template queries ran commands: start the input from the checkpoint.
                live.begin();
            }
            let (templates, tags) = cell.as_ref().expect("just filled");
            let mut bed = Bed {
                live,
                templates,
                tags,
                aliased: false,
            };
            // Once a base-address-table command ran, a table may point at fresh memory,
            // and a QPC holds whatever bytes are there.
            let mut tables_moved = false;
            for op in ops {
                tables_moved |= matches!(op, Op::Table { .. } | Op::Raw { .. });
                apply(&mut bed, op);
            }
            finish(&mut bed, tables_moved);
        })
    });
}

/// The contexts of the bed's live objects, per kind, and their numbers.
fn templates(live: &mut LiveBed) -> Templates {
    let aeqn = live.h.device.config().caps.num_ceqs as u32;
    let numbers: [Vec<u32>; 6] = [
        live.qps.iter().map(|q| q.qp.qpn).chain([live.victim.qp.qpn]).collect(),
        vec![1, 2, 3],
        vec![1],
        vec![1, 2, 3, 4, 5],
        vec![0],
        vec![aeqn],
    ];
    let mut templates = Vec::new();
    for (kind, tags) in KINDS.iter().zip(&numbers) {
        let query = kind.opcodes()[2].expect("every kind has a query");
        let mut contexts = Vec::new();
        for &tag in tags {
            let (status, bytes) = query_bytes(live, query, tag, kind.size());
            assert_eq!(status, MailboxCompletion::Success, "{query:?} {tag}");
            contexts.push(bytes);
        }
        templates.push(contexts);
    }
    (templates, numbers.to_vec())
}

fn query_bytes(live: &mut LiveBed, opcode: MailboxOpcode, tag: u32, size: usize) -> (MailboxCompletion, Vec<u8>) {
    let (_, _, mailbox_out) = live.h.command_buffers();
    // A failed query leaves the output buffer alone: clear it so stale bytes never pass
    // for an answer.
    live.h
        .memory
        .write(mailbox_out, &vec![0u8; size])
        .expect("in the arena");
    let status = live.h.mailbox_raw(opcode as u8, tag, 0, mailbox_out);
    let mut bytes = vec![0u8; size];
    live.h.memory.read(mailbox_out, &mut bytes).expect("in the arena");
    (status, bytes)
}

fn tag(bed: &Bed, kind: usize, choice: TagChoice) -> u32 {
    match choice {
        TagChoice::Live(i) => bed.tags[kind][usize::from(i) % bed.tags[kind].len()],
        TagChoice::Near(n) => u32::from(n % 64),
        TagChoice::Raw(raw) => raw,
    }
}

fn context(bed: &Bed, kind: usize, spec: &ContextSpec) -> Vec<u8> {
    let size = KINDS[kind].size();
    let mut bytes = match &spec.raw {
        Some(raw) => {
            let mut raw = raw.clone();
            raw.resize(size, 0);
            raw
        }
        None => bed.templates[kind][usize::from(spec.template) % bed.templates[kind].len()].clone(),
    };
    let fields = KINDS[kind].fields();
    for &(field, value) in spec.fields.iter().take(16) {
        fields[usize::from(field) % fields.len()].set(&mut bytes, value);
    }
    bytes
}

fn mask(kind: usize, spec: &MaskSpec) -> Vec<u8> {
    let size = KINDS[kind].size();
    match &spec.raw {
        Some(raw) => {
            let mut raw = raw.clone();
            raw.resize(size, 0xFF);
            raw
        }
        None => {
            let mut mask = vec![0xFF; size];
            let fields = KINDS[kind].fields();
            for &field in spec.open.iter().take(32) {
                fields[usize::from(field) % fields.len()].set(&mut mask, 0);
            }
            mask
        }
    }
}

/// Posts `opcode` with `input` (and `mask` after it) in the mailbox input buffer.
fn post(live: &mut LiveBed, opcode: MailboxOpcode, tag: u32, input: &[u8], mask: Option<&[u8]>) -> MailboxCompletion {
    let (_, mailbox_in, _) = live.h.command_buffers();
    live.h.memory.write(mailbox_in, input).expect("in the arena");
    if let Some(mask) = mask {
        live.h
            .memory
            .write(mailbox_in + input.len() as u64, mask)
            .expect("in the arena");
    }
    live.h.mailbox_raw(opcode as u8, tag, mailbox_in, 0)
}

fn apply(bed: &mut Bed, op: Op) {
    match op {
        Op::Context {
            kind,
            action,
            tag: choice,
            context: context_spec,
            mask: mask_spec,
        } => {
            let k = usize::from(kind) % KINDS.len();
            let kind = KINDS[k];
            let [create, modify, query, destroy] = kind.opcodes();
            let query = query.expect("every kind has a query");
            let tag = tag(bed, k, choice);
            let size = kind.size();
            let before = query_bytes(bed.live, query, tag, size);
            let (opcode, context, mask) = match action {
                Action::Create => (create, Some(context(bed, k, &context_spec)), None),
                Action::Modify => (modify, Some(context(bed, k, &context_spec)), Some(mask(k, &mask_spec))),
                Action::Query => (Some(query), None, None),
                Action::Destroy => (destroy, None, None),
            };
            let Some(opcode) = opcode else { return };
            let status = match &context {
                Some(context) => post(bed.live, opcode, tag, context, mask.as_deref()),
                None => bed
                    .live
                    .h
                    .mailbox_raw(opcode as u8, tag, 0, bed.live.h.command_buffers().2),
            };
            let after = query_bytes(bed.live, query, tag, size);
            if bed.aliased {
                return;
            }
            if status != MailboxCompletion::Success {
                assert_eq!(
                    before.0, after.0,
                    "{opcode:?} {tag:#x} failed with {status:?} yet changed the object"
                );
                let changed = kind.differing(&before.1, &after.1);
                assert!(
                    changed.is_empty(),
                    "{opcode:?} {tag:#x} failed with {status:?} yet changed the fields {changed:?}"
                );
            } else if opcode == MailboxOpcode::ModifyQpc {
                check_modify_qpc(tag, &before, &after, context.as_deref(), mask.as_deref());
            }
        }
        Op::Table {
            opcode,
            tag: choice,
            page,
            raw_address,
        } => {
            let tables: Vec<MailboxOpcode> = MailboxOpcode::ALL
                .into_iter()
                .filter(|o| o.base_address_table().is_some())
                .collect();
            let opcode = tables[usize::from(opcode) % tables.len()];
            let table = opcode.base_address_table().expect("filtered").0 as usize;
            let kind = [0usize, 3, 1, 2].get(table).copied().unwrap_or(0);
            let tag = tag(bed, kind, choice);
            // Pages nothing else uses (after the bed's allocations), or addresses outside
            // the driver's memory: a table never aliases a mailbox buffer or a ring.
            let scratch = bed.live.h.next_free();
            let pages = (DMA_BASE + ARENA_SIZE as u64 - scratch) / 4096;
            let in_scratch = scratch + (u64::from(page) % pages) * 4096;
            let arena = DMA_BASE..DMA_BASE + ARENA_SIZE as u64;
            let address = match raw_address {
                Some(address) if !arena.contains(&address) => address,
                _ => in_scratch,
            };
            bed.live.h.mailbox_raw(opcode as u8, tag, address, 0);
        }
        Op::Raw { opcode, tag, input } => {
            bed.aliased = true;
            let (_, mailbox_in, mailbox_out) = bed.live.h.command_buffers();
            let length = input.len().min(4096);
            bed.live
                .h
                .memory
                .write(mailbox_in, &input[..length])
                .expect("in the arena");
            bed.live.h.mailbox_raw(opcode, tag, mailbox_in, mailbox_out);
        }
        Op::Doorbell { qp, send, index } => {
            let qpn = tag(bed, 0, qp);
            let word = if send {
                Doorbell::sq(qpn, index, 0)
            } else {
                Doorbell::rq(qpn, index)
            };
            bed.live.h.doorbell(word.as_u64());
            bed.live.drain_transmit();
        }
        Op::Advance(n) => bed.live.advance(Picoseconds(1_000u64 << (n % 34))),
    }
}

/// A successful MODIFY_QPC: a legal transition, and exactly the merged context.
fn check_modify_qpc(
    qpn: u32,
    before: &(MailboxCompletion, Vec<u8>),
    after: &(MailboxCompletion, Vec<u8>),
    context: Option<&[u8]>,
    mask: Option<&[u8]>,
) {
    let (Some(context), Some(mask)) = (context, mask) else {
        return;
    };
    assert_eq!(
        before.0,
        MailboxCompletion::Success,
        "QP {qpn:#x} modified yet not queryable before"
    );
    assert_eq!(
        after.0,
        MailboxCompletion::Success,
        "QP {qpn:#x} modified yet not queryable after"
    );
    let current = Qpc::parse(&before.1).expect("QPC size");
    let now = Qpc::parse(&after.1).expect("QPC size");
    let (from, to) = (current.qp_state(), now.qp_state());
    let (Ok(from), Ok(to)) = (from, to) else {
        panic!("QP {qpn:#x} modified from {from:?} to {to:?}");
    };
    assert!(legal_transition(from, to), "QP {qpn:#x} moved {from:?} -> {to:?}");
    let mut expected = Qpc::zeroed();
    for (i, byte) in expected.bytes_mut().iter_mut().enumerate() {
        *byte = (before.1[i] & mask[i]) | (context[i] & !mask[i]);
    }
    let differing = Kind::Qp.differing(expected.bytes(), now.bytes());
    assert!(
        differing.is_empty(),
        "QP {qpn:#x} {from:?} -> {to:?}: the context is not the merge of context and mask; fields {differing:?} differ"
    );
}

fn finish(bed: &mut Bed, tables_moved: bool) {
    bed.live.h.settle();
    if tables_moved {
        bed.live.drain_transmit();
        return;
    }
    for &qpn in &bed.tags[0] {
        let (status, bytes) = query_bytes(bed.live, MailboxOpcode::QueryQpc, qpn, Qpc::SIZE);
        if status == MailboxCompletion::Success {
            let state = Qpc::parse(&bytes).expect("QPC size").qp_state();
            assert!(
                matches!(
                    state,
                    Ok(QpState::Reset | QpState::Init | QpState::Rtr | QpState::Rts | QpState::Err)
                ),
                "QP {qpn:#x} in state {state:?}"
            );
        }
    }
    bed.live.drain_transmit();
}
