//! The responder: executes inbound requests and queues what goes back.
//!
//! RC (IBA 9.7.5): a packet whose PSN is the expected PSN is new; up to 2^23 behind is a
//! duplicate (SEND/WRITE re-ACKed and not re-executed, READs re-served from the replay
//! ring, atomics answered with the saved original value); ahead is a sequence error (one
//! NAK until the expected PSN arrives). Then the opcode sequence, lengths, the QP's
//! access flags, the R_Key (PD, rights, bounds) and the receive WQE are checked before
//! anything is written. Responses (ACK, NAK, READ response, ATOMIC ACK) go into an
//! ordered queue, so an ACK never overtakes an earlier READ response; a queued ACK not
//! yet sent is coalesced with the next.
//!
//! UC: no responses; a PSN gap drops the message in progress. UD: one packet per
//! message, Q_Key checked, the IP header delivered as the 40-byte GRH.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cqe::{Cqe, CqeStatus, RecvOpcode};
use rnic_firmware_if::event::{AsyncEventType, LocalAccessSubtype};

use crate::diagnostics::Source;
use crate::mpt::{MrAccess, MrAccessError};
use crate::wire::{self, AethRepr, IpRepr, ParsedFrame, RethRepr, RoceRepr};

use super::dma::{SgeCursor, TransferError};
use super::op;
use super::path::packet_gids;
use super::qp_runtime::{
    psn_add, psn_diff, ClaimedRecv, Inbound, InboundKind, ReplayEntry, Response, ACK_COALESCE, MSN_MASK,
};
use super::requester::{bth, pad_for};
use super::wqe_fetch::{packet_count, MAX_MESSAGE};
use super::{Engine, Io};

/// Bytes of the GRH slot at the start of a UD receive buffer.
const GRH_LENGTH: usize = 40;

/// Why an inbound request cannot be executed.
#[derive(Debug)]
enum Fault {
    /// No receive WQE: RNR NAK (RC) or the message is dropped (UC).
    NoReceiveWqe,
    /// Invalid request (opcode sequence, lengths, too many READ/atomics, misaligned
    /// atomic): NAK invalid request + INV_REQ_LOCAL_WQ_ERROR.
    Invalid(String),
    /// R_Key / PD / rights / bounds, or the QP does not allow the operation: NAK remote
    /// access error + LOCAL_WQ_ACCESS_ERROR with a sub-type.
    Access(MrAccessError),
    /// Host memory behind a valid key failed: NAK remote operational error.
    Operational(String),
    /// The claimed receive WQE completes with `status` (local length, protection or
    /// invalidation errors); RC also NAKs with `nak`.
    Receive { status: CqeStatus, nak: u8, reason: String },
}

/// What a successfully executed packet did.
struct Executed {
    /// PSNs the request consumed (a READ: its responses).
    psns: u32,
    /// The packet ended a SEND or WRITE message.
    message_end: bool,
    /// The request is answered by a READ response or ATOMIC ACK, not an ACK.
    answered: bool,
}

/// The LOCAL_WQ_ACCESS_ERROR sub-type (§9.2) for an access failure.
pub(crate) fn access_subtype(error: &MrAccessError) -> LocalAccessSubtype {
    match error {
        MrAccessError::InvalidKey { .. } => LocalAccessSubtype::RkeyViolation,
        MrAccessError::KeyMismatch { .. } => LocalAccessSubtype::KeyStateError,
        MrAccessError::ProtectionDomain { .. } => LocalAccessSubtype::PdError,
        MrAccessError::Access { .. } => LocalAccessSubtype::RwAccessError,
        MrAccessError::Bounds { address, start, .. } if address < start => LocalAccessSubtype::VaError,
        MrAccessError::Bounds { .. } => LocalAccessSubtype::LengthError,
        MrAccessError::Translation { .. } => LocalAccessSubtype::MrOperationError,
    }
}

fn transfer_fault(error: TransferError) -> Fault {
    match error {
        TransferError::Length => Fault::Receive {
            status: CqeStatus::LocalLengthErr,
            nak: op::NAK_INVALID_REQUEST,
            reason: "a message no longer than the receive WQE's buffers".into(),
        },
        TransferError::Protection(e) => Fault::Receive {
            status: CqeStatus::LocalProtErr,
            nak: op::NAK_REMOTE_OPERATIONAL,
            reason: format!("receive buffers the QP may write: {e}"),
        },
        TransferError::List(e) => Fault::Receive {
            status: CqeStatus::LocalQpOpErr,
            nak: op::NAK_REMOTE_OPERATIONAL,
            reason: format!("a readable receive WQE: {e}"),
        },
        TransferError::Dma(e) => Fault::Receive {
            status: CqeStatus::LocalAccessErr,
            nak: op::NAK_REMOTE_OPERATIONAL,
            reason: format!("writable receive buffers: {e}"),
        },
    }
}

fn remote_fault(error: TransferError) -> Fault {
    match error {
        TransferError::Protection(e) => Fault::Access(e),
        other => Fault::Operational(other.to_string()),
    }
}

impl<I: Io> Engine<I> {
    // ---- RC ------------------------------------------------------------------------

    /// An RC request packet for QP `qpn`.
    pub(crate) fn rc_receive(&mut self, qpn: u32, parsed: &ParsedFrame<'_>) {
        let repr = &parsed.repr;
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        // Fields, not the whole QpConfig: this runs for every request.
        let min_rnr_timer = runtime.config.min_rnr_timer;
        let epsn = runtime.responder.epsn;
        if !self.source_matches(qpn, repr) {
            return;
        }
        let operation = op::operation(repr.bth.opcode.0);
        let psn = repr.bth.psn;
        let distance = psn_diff(psn, epsn);
        if distance > 0 {
            self.transport.counters.out_of_sequence += 1;
            let runtime = self.transport.qps.get_mut(qpn).expect("looked up above");
            if !runtime.responder.psn_error_sent {
                runtime.responder.psn_error_sent = true;
                runtime.responder.pending.push_back(Response::Ack {
                    psn: epsn,
                    syndrome: op::AETH_NAK | op::NAK_PSN_SEQUENCE,
                });
                self.transport.counters.naks_sent += 1;
                self.kick_qp(qpn);
            }
            return;
        }
        if distance < 0 {
            self.rc_duplicate(qpn, repr, operation, psn);
            return;
        }
        match self.execute(qpn, parsed, operation, true) {
            Ok(executed) => {
                let runtime = self.transport.qps.get_mut(qpn).expect("executed on a live QP");
                let responder = &mut runtime.responder;
                responder.psn_error_sent = false;
                responder.epsn = psn_add(psn, executed.psns);
                responder.since_ack += 1;
                if executed.answered {
                    responder.since_ack = 0;
                } else {
                    responder.ackable_psn = Some(psn);
                    if repr.bth.ack_request || executed.message_end || responder.since_ack >= ACK_COALESCE {
                        responder.since_ack = 0;
                        queue_ack(&mut responder.pending, psn);
                    }
                }
                let kick = !responder.pending.is_empty();
                if executed.message_end {
                    self.sync_qpc(qpn);
                }
                if kick {
                    self.kick_qp(qpn);
                }
            }
            Err(Fault::NoReceiveWqe) => {
                let runtime = self.transport.qps.get_mut(qpn).expect("executed on a live QP");
                if !runtime.responder.has_room() {
                    self.transport.counters.responses_dropped += 1;
                    return;
                }
                let syndrome = op::AETH_RNR_NAK | (min_rnr_timer & 0x1F);
                runtime.responder.pending.push_back(Response::Ack { psn, syndrome });
                self.transport.counters.rnr_naks_sent += 1;
                self.kick_qp(qpn);
            }
            Err(fault) => self.rc_fault(qpn, psn, operation, fault),
        }
    }

    /// A fatal responder error on an RC QP: diagnostic, receive CQE, NAK, async event, ERR.
    fn rc_fault(&mut self, qpn: u32, psn: u32, operation: u8, fault: Fault) {
        let object = format!("QP {qpn:#x} PSN {psn:#x}");
        match fault {
            Fault::NoReceiveWqe => {}
            Fault::Invalid(reason) => {
                self.diagnose(Source::Transport, object, "BTH OpCode", u64::from(operation), reason);
                self.responder_fatal(
                    qpn,
                    Some((psn, op::AETH_NAK | op::NAK_INVALID_REQUEST)),
                    Some((AsyncEventType::InvReqLocalWqError, 0)),
                );
            }
            Fault::Access(error) => {
                let sub_type = access_subtype(&error) as u8;
                self.diagnose(
                    Source::Transport,
                    object,
                    "R_Key",
                    u64::from(sub_type),
                    format!("a remote access the QP and region grant: {error}"),
                );
                self.responder_fatal(
                    qpn,
                    Some((psn, op::AETH_NAK | op::NAK_REMOTE_ACCESS)),
                    Some((AsyncEventType::LocalWqAccessError, sub_type)),
                );
            }
            Fault::Operational(reason) => {
                self.diagnose(
                    Source::Transport,
                    object,
                    "DMA",
                    0,
                    format!("host memory behind the region: {reason}"),
                );
                self.responder_fatal(qpn, Some((psn, op::AETH_NAK | op::NAK_REMOTE_OPERATIONAL)), None);
            }
            Fault::Receive { status, nak, reason } => {
                self.diagnose(
                    Source::Transport,
                    object,
                    "receive WQE",
                    u64::from(status as u8),
                    reason,
                );
                self.fail_claimed_receive(qpn, status);
                self.responder_fatal(qpn, Some((psn, op::AETH_NAK | nak)), None);
            }
        }
    }

    /// Completes the claimed receive WQE (if any) with an error status.
    fn fail_claimed_receive(&mut self, qpn: u32, status: CqeStatus) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let Some(claimed) = runtime.responder.inbound.recv.take() else {
            return;
        };
        runtime.responder.inbound = Inbound::IDLE;
        if claimed.srq.is_none() {
            runtime.responder.rq_consumer = runtime.responder.rq_consumer.wrapping_add(1);
        }
        let recv_cq = runtime.config.recv_cq;
        let mut cqe = Cqe::zeroed();
        cqe.set_opcode(RecvOpcode::Send as u8);
        cqe.set_receive_side(true);
        cqe.set_status(status as u8);
        cqe.set_wqe_index(claimed.wqe_index);
        cqe.set_local_qp_number(qpn);
        let _ = self.post_cqe(recv_cq, cqe, false);
        self.sync_qpc(qpn);
    }

    /// A duplicate RC request (PSN behind the expected one).
    fn rc_duplicate(&mut self, qpn: u32, repr: &RoceRepr, operation: u8, psn: u32) {
        self.transport.counters.duplicate_requests += 1;
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let responder = &mut runtime.responder;
        if !responder.has_room() {
            // A flood of duplicates: the requester's timer recovers what is not answered.
            self.transport.counters.responses_dropped += 1;
            return;
        }
        match operation {
            o if op::is_send(o) || op::is_write(o) => {
                // Not executed again; re-acknowledge what was received (C9-105) up to the
                // last SEND/WRITE, as rxe does (its `resp.ack_psn`). Never `epsn - 1`
                // when that is a READ or an atomic: an ACK naming a READ's PSN is taken by
                // rxe's completer as the READ's completion, without data when the READ
                // response was lost, and nvmet-rdma stored a buffer it never filled.
                let acknowledged = responder
                    .ackable_psn
                    .filter(|&ackable| psn_diff(ackable, psn) >= 0)
                    .unwrap_or(psn);
                queue_ack(&mut responder.pending, acknowledged);
            }
            op::READ_REQUEST => {
                let Some(reth) = repr.reth else { return };
                let found = responder.replay.iter().find(|entry| {
                    entry.atomic.is_none()
                        && psn_diff(psn, entry.first_psn) >= 0
                        && psn_diff(entry.last_psn, psn) >= 0
                        && entry.rkey == reth.rkey
                        && reth.virtual_address >= entry.va
                        && reth.virtual_address.wrapping_add(u64::from(reth.dma_length))
                            <= entry.va.wrapping_add(u64::from(entry.length))
                });
                let Some(entry) = found.copied() else {
                    return;
                };
                let response = |replay| Response::Read {
                    next_psn: psn,
                    va: reth.virtual_address,
                    rkey: reth.rkey,
                    remaining: reth.dma_length,
                    first: true,
                    replay,
                };
                // A READ still being answered restarts at the requested PSN (and keeps
                // whatever responder resource it holds).
                let in_progress = responder.pending.iter().position(|r| {
                    matches!(r, Response::Read { next_psn, .. }
                        if psn_diff(*next_psn, entry.first_psn) >= 0 && psn_diff(entry.last_psn, *next_psn) >= 0)
                });
                match in_progress {
                    Some(index) => {
                        let replay = matches!(responder.pending[index], Response::Read { replay: true, .. });
                        responder.pending[index] = response(replay);
                    }
                    None => responder.pending.push_back(response(true)),
                }
            }
            op::COMPARE_SWAP | op::FETCH_ADD => {
                let Some(original) = responder
                    .replay
                    .iter()
                    .find(|entry| entry.first_psn == psn)
                    .and_then(|entry| entry.atomic)
                else {
                    return;
                };
                responder.pending.push_back(Response::Atomic {
                    psn,
                    original,
                    replay: true,
                });
            }
            _ => return,
        }
        self.kick_qp(qpn);
    }

    /// Whether the packet comes from the QP's peer (RC/UC address check, as rxe does).
    fn source_matches(&mut self, qpn: u32, repr: &RoceRepr) -> bool {
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return false;
        };
        let Some(path) = runtime.config.path else {
            return true;
        };
        let (source, _) = packet_gids(&repr.ip);
        if source == path.dgid {
            return true;
        }
        self.drop_frame(
            format!("QP {qpn:#x}"),
            "source IP",
            u64::from_be_bytes(source[8..].try_into().unwrap_or_default()),
            "the QP's destination GID (QPC DGID)".into(),
        );
        false
    }

    // ---- UC ------------------------------------------------------------------------

    /// A UC packet for QP `qpn`.
    pub(crate) fn uc_receive(&mut self, qpn: u32, parsed: &ParsedFrame<'_>) {
        let repr = &parsed.repr;
        if !self.source_matches(qpn, repr) {
            return;
        }
        let operation = op::operation(repr.bth.opcode.0);
        let psn = repr.bth.psn;
        let runtime = self.transport.qps.get_mut(qpn).expect("checked by the caller");
        let responder = &mut runtime.responder;
        if psn != responder.epsn {
            // A gap: the message in progress is lost (its receive WQE is kept for the next).
            if responder.inbound.kind != InboundKind::Idle {
                self.transport.counters.messages_dropped += 1;
            }
            responder.inbound = Inbound::idle_keeping(responder.inbound.recv);
            responder.inbound.discard = !op::is_first(operation);
        }
        responder.epsn = psn_add(psn, 1);
        if responder.inbound.discard {
            if !op::is_first(operation) {
                return;
            }
            responder.inbound.discard = false;
        }
        match self.execute(qpn, parsed, operation, false) {
            Ok(executed) => {
                if executed.message_end {
                    self.sync_qpc(qpn);
                }
            }
            Err(fault) => {
                self.transport.counters.messages_dropped += 1;
                let (field, reason) = match &fault {
                    Fault::NoReceiveWqe => ("receive WQE", "a posted receive WQE (UC: message dropped)".to_string()),
                    Fault::Invalid(r) => ("BTH OpCode", r.clone()),
                    Fault::Access(e) => ("R_Key", format!("a remote access the QP and region grant: {e}")),
                    Fault::Operational(r) => ("DMA", r.clone()),
                    Fault::Receive { reason, .. } => ("receive WQE", reason.clone()),
                };
                self.diagnose(
                    Source::Transport,
                    format!("QP {qpn:#x} PSN {psn:#x}"),
                    field,
                    u64::from(operation),
                    reason,
                );
                if let Fault::Receive { status, .. } = fault {
                    self.fail_claimed_receive(qpn, status);
                }
                if let Some(runtime) = self.transport.qps.get_mut(qpn) {
                    runtime.responder.inbound = Inbound::idle_keeping(runtime.responder.inbound.recv);
                    runtime.responder.inbound.discard = !op::is_last(operation);
                }
            }
        }
    }

    // ---- RC/UC execution -------------------------------------------------------------

    /// Executes a new (in-sequence) request packet.
    fn execute(
        &mut self,
        qpn: u32,
        parsed: &ParsedFrame<'_>,
        operation: u8,
        reliable: bool,
    ) -> Result<Executed, Fault> {
        let repr = &parsed.repr;
        let payload = parsed.payload;
        let runtime = self.transport.qps.get(qpn).expect("checked by the caller");
        let mtu = runtime.config.mtu as usize;
        let inbound_kind = runtime.responder.inbound.kind;
        let first = op::is_first(operation);
        let last = op::is_last(operation);
        // Opcode sequence (IBA 9.7.5.1.3 / C9-88..): FIRST/ONLY only between messages,
        // MIDDLE/LAST only inside a message of the same kind.
        let in_sequence = match inbound_kind {
            InboundKind::Idle => first,
            InboundKind::Send => !first && op::is_send(operation),
            InboundKind::Write => !first && op::is_write(operation),
        };
        if !in_sequence {
            return Err(Fault::Invalid(format!(
                "an opcode continuing the message in progress ({inbound_kind:?})"
            )));
        }
        let sized = if op::is_send(operation) || op::is_write(operation) {
            if !last {
                payload.len() == mtu
            } else if first {
                payload.len() <= mtu
            } else {
                (1..=mtu).contains(&payload.len())
            }
        } else {
            payload.is_empty()
        };
        if !sized {
            return Err(Fault::Invalid(format!(
                "a payload of {} bytes fitting the opcode and the path MTU {mtu}",
                payload.len()
            )));
        }
        match operation {
            o if op::is_send(o) => self.execute_send(qpn, repr, payload, operation),
            o if op::is_write(o) => self.execute_write(qpn, repr, payload, operation),
            op::READ_REQUEST if reliable => self.execute_read(qpn, repr),
            op::COMPARE_SWAP | op::FETCH_ADD if reliable => self.execute_atomic(qpn, repr, operation),
            _ => Err(Fault::Invalid("an opcode the QP's service type executes".into())),
        }
    }

    /// SEND FIRST/MIDDLE/LAST/ONLY (with immediate / invalidate).
    fn execute_send(&mut self, qpn: u32, repr: &RoceRepr, payload: &[u8], operation: u8) -> Result<Executed, Fault> {
        let runtime = self.transport.qps.get(qpn).expect("checked by the caller");
        let config = runtime.config;
        let mut inbound = runtime.responder.inbound;
        let first = op::is_first(operation);
        let last = op::is_last(operation);
        if first {
            let claimed = match inbound.recv {
                Some(claimed) => claimed,
                None => self.claim_receive_wqe(&config).ok_or(Fault::NoReceiveWqe)?,
            };
            inbound = Inbound {
                kind: InboundKind::Send,
                recv: Some(claimed),
                ..Inbound::IDLE
            };
            // Keep the claim even if this packet fails (an SRQ WQE is already consumed).
            self.set_inbound(qpn, inbound);
        }
        let claimed = inbound.recv.expect("a SEND in progress has a receive WQE");
        let mut probe = inbound.cursor;
        self.check_scatter(&claimed.list, claimed.pd, &mut probe, inbound.offset, payload.len())
            .map_err(transfer_fault)?;
        self.scatter(&claimed.list, claimed.pd, &mut inbound.cursor, inbound.offset, payload)
            .map_err(transfer_fault)?;
        inbound.offset += payload.len() as u64;
        if !last {
            self.set_inbound(qpn, inbound);
            return Ok(Executed {
                psns: 1,
                message_end: false,
                answered: false,
            });
        }
        self.set_inbound(qpn, inbound);
        let (opcode, data) = if op::has_invalidate(operation) {
            let rkey = repr.invalidate_rkey.unwrap_or(0);
            if let Err(reason) = self.invalidate_rkey(rkey, config.pd) {
                return Err(Fault::Receive {
                    status: CqeStatus::LocalAccessErr,
                    nak: op::NAK_INVALID_REQUEST,
                    reason: format!("an rkey this QP may invalidate: {reason}"),
                });
            }
            (RecvOpcode::SendWithInv, rkey)
        } else if op::has_immediate(operation) {
            (RecvOpcode::SendWithImm, repr.immediate.unwrap_or(0))
        } else {
            (RecvOpcode::Send, 0)
        };
        self.complete_receive(
            qpn,
            &claimed,
            opcode,
            inbound.offset as u32,
            data,
            repr.bth.solicited,
            None,
        );
        Ok(Executed {
            psns: 1,
            message_end: true,
            answered: false,
        })
    }

    /// RDMA WRITE FIRST/MIDDLE/LAST/ONLY (with immediate).
    fn execute_write(&mut self, qpn: u32, repr: &RoceRepr, payload: &[u8], operation: u8) -> Result<Executed, Fault> {
        let runtime = self.transport.qps.get(qpn).expect("checked by the caller");
        let (pd, remote_write) = (runtime.config.pd, runtime.config.remote_write);
        let mut inbound = runtime.responder.inbound;
        let first = op::is_first(operation);
        let last = op::is_last(operation);
        if first {
            let Some(reth) = repr.reth else {
                return Err(Fault::Invalid("a RETH on RDMA WRITE FIRST/ONLY".into()));
            };
            self.check_reth(&reth, pd, remote_write, MrAccess::REMOTE_WRITE)?;
            inbound = Inbound {
                kind: InboundKind::Write,
                va: reth.virtual_address,
                rkey: reth.rkey,
                dma_length: reth.dma_length,
                recv: inbound.recv,
                ..Inbound::IDLE
            };
        }
        let end = inbound.offset + payload.len() as u64;
        if end > u64::from(inbound.dma_length) {
            return Err(Fault::Invalid(format!(
                "no more data than the RETH DMA length {}",
                inbound.dma_length
            )));
        }
        if last && end != u64::from(inbound.dma_length) {
            return Err(Fault::Invalid(format!(
                "as much data as the RETH DMA length {} (got {end})",
                inbound.dma_length
            )));
        }
        let immediate = op::has_immediate(operation);
        if immediate && inbound.recv.is_none() {
            // WRITE with immediate consumes a receive WQE: check before writing anything.
            let config = self.transport.qps.get(qpn).expect("checked by the caller").config;
            inbound.recv = Some(self.claim_receive_wqe(&config).ok_or(Fault::NoReceiveWqe)?);
        }
        if !payload.is_empty() {
            let address = inbound.va.wrapping_add(inbound.offset);
            match self.check_memory_access(inbound.rkey, pd, address, payload.len() as u64, MrAccess::REMOTE_WRITE) {
                Ok(region) => self.write_region(&region, payload).map_err(remote_fault)?,
                Err(error) => return Err(Fault::Access(error)),
            }
        }
        inbound.offset = end;
        if !last {
            self.set_inbound(qpn, inbound);
            return Ok(Executed {
                psns: 1,
                message_end: false,
                answered: false,
            });
        }
        if immediate {
            let claimed = inbound.recv.expect("claimed above");
            self.set_inbound(qpn, inbound);
            self.complete_receive(
                qpn,
                &claimed,
                RecvOpcode::RdmaWriteWithImm,
                inbound.dma_length,
                repr.immediate.unwrap_or(0),
                repr.bth.solicited,
                None,
            );
        } else {
            self.set_inbound(qpn, Inbound::idle_keeping(inbound.recv));
            self.count_message(qpn);
        }
        Ok(Executed {
            psns: 1,
            message_end: true,
            answered: false,
        })
    }

    /// RDMA READ request: checked now, answered by queued READ responses.
    fn execute_read(&mut self, qpn: u32, repr: &RoceRepr) -> Result<Executed, Fault> {
        let runtime = self.transport.qps.get(qpn).expect("checked by the caller");
        let config = runtime.config;
        let Some(reth) = repr.reth else {
            return Err(Fault::Invalid("a RETH on an RDMA READ request".into()));
        };
        self.check_reth(&reth, config.pd, config.remote_read, MrAccess::REMOTE_READ)?;
        self.reserve_responder_resource(qpn)?;
        let psn = repr.bth.psn;
        let packets = packet_count(reth.dma_length, config.mtu);
        let runtime = self.transport.qps.get_mut(qpn).expect("checked by the caller");
        let responder = &mut runtime.responder;
        push_replay(
            &mut responder.replay,
            config.responder_resources as usize,
            ReplayEntry {
                first_psn: psn,
                last_psn: psn_add(psn, packets - 1),
                va: reth.virtual_address,
                rkey: reth.rkey,
                length: reth.dma_length,
                atomic: None,
            },
        );
        responder.pending.push_back(Response::Read {
            next_psn: psn,
            va: reth.virtual_address,
            rkey: reth.rkey,
            remaining: reth.dma_length,
            first: true,
            replay: false,
        });
        responder.msn = (responder.msn + 1) & MSN_MASK;
        Ok(Executed {
            psns: packets,
            message_end: false,
            answered: true,
        })
    }

    /// Compare-and-swap or fetch-and-add: executed once, the original value saved.
    fn execute_atomic(&mut self, qpn: u32, repr: &RoceRepr, operation: u8) -> Result<Executed, Fault> {
        let runtime = self.transport.qps.get(qpn).expect("checked by the caller");
        let config = runtime.config;
        let Some(atomic) = repr.atomic_eth else {
            return Err(Fault::Invalid("an AtomicETH on an atomic request".into()));
        };
        if !config.remote_atomic {
            return Err(Fault::Access(MrAccessError::Access {
                key: atomic.rkey,
                needed: MrAccess::REMOTE_ATOMIC,
            }));
        }
        if atomic.virtual_address % 8 != 0 {
            return Err(Fault::Invalid(format!(
                "an 8-byte aligned atomic address, not {:#x}",
                atomic.virtual_address
            )));
        }
        let region = match self.check_memory_access(
            atomic.rkey,
            config.pd,
            atomic.virtual_address,
            8,
            MrAccess::REMOTE_ATOMIC,
        ) {
            Ok(region) => region,
            Err(error) => return Err(Fault::Access(error)),
        };
        self.reserve_responder_resource(qpn)?;
        let mut bytes = [0u8; 8];
        self.read_region(&region, &mut bytes).map_err(remote_fault)?;
        let original = u64::from_le_bytes(bytes);
        let new = if operation == op::COMPARE_SWAP {
            if original == atomic.compare {
                atomic.swap_or_add
            } else {
                original
            }
        } else {
            original.wrapping_add(atomic.swap_or_add)
        };
        if new != original {
            self.write_region(&region, &new.to_le_bytes()).map_err(remote_fault)?;
        }
        let psn = repr.bth.psn;
        let runtime = self.transport.qps.get_mut(qpn).expect("checked by the caller");
        let responder = &mut runtime.responder;
        push_replay(
            &mut responder.replay,
            config.responder_resources as usize,
            ReplayEntry {
                first_psn: psn,
                last_psn: psn,
                va: atomic.virtual_address,
                rkey: atomic.rkey,
                length: 8,
                atomic: Some(original),
            },
        );
        responder.pending.push_back(Response::Atomic {
            psn,
            original,
            replay: false,
        });
        responder.msn = (responder.msn + 1) & MSN_MASK;
        Ok(Executed {
            psns: 1,
            message_end: false,
            answered: true,
        })
    }

    /// Checks the RETH of a WRITE FIRST/ONLY or READ request before any byte moves: the QP
    /// allows the remote access (`permitted`), the length fits a message, and the whole
    /// target range lies in a region of the QP's PD with the `needed` right.
    fn check_reth(&mut self, reth: &RethRepr, pd: u32, permitted: bool, needed: MrAccess) -> Result<(), Fault> {
        if !permitted {
            return Err(Fault::Access(MrAccessError::Access { key: reth.rkey, needed }));
        }
        if reth.dma_length > MAX_MESSAGE {
            return Err(Fault::Invalid("a RETH DMA length of at most 2^31".into()));
        }
        if reth.dma_length > 0 {
            if let Err(error) =
                self.check_memory_access(reth.rkey, pd, reth.virtual_address, u64::from(reth.dma_length), needed)
            {
                return Err(Fault::Access(error));
            }
        }
        Ok(())
    }

    /// Refuses a READ/atomic beyond the responder resources (RR_MAX) still being answered.
    fn reserve_responder_resource(&mut self, qpn: u32) -> Result<(), Fault> {
        let runtime = self.transport.qps.get(qpn).expect("checked by the caller");
        let limit = runtime.config.responder_resources as usize;
        if runtime.responder.responses_in_progress() >= limit {
            return Err(Fault::Invalid(format!(
                "at most {limit} outstanding READ/atomic requests (RR_MAX)"
            )));
        }
        Ok(())
    }

    fn set_inbound(&mut self, qpn: u32, inbound: Inbound) {
        if let Some(runtime) = self.transport.qps.get_mut(qpn) {
            runtime.responder.inbound = inbound;
        }
    }

    /// A message without a receive CQE (RDMA WRITE) completed: MSN moves on.
    fn count_message(&mut self, qpn: u32) {
        if let Some(runtime) = self.transport.qps.get_mut(qpn) {
            runtime.responder.msn = (runtime.responder.msn + 1) & MSN_MASK;
        }
    }

    /// A message that consumed `claimed` completed: receive CQE, RQ consumer, MSN.
    #[allow(clippy::too_many_arguments)]
    fn complete_receive(
        &mut self,
        qpn: u32,
        claimed: &ClaimedRecv,
        opcode: RecvOpcode,
        bytes: u32,
        data: u32,
        solicited: bool,
        ud: Option<(&RoceRepr, u32)>,
    ) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let responder = &mut runtime.responder;
        responder.msn = (responder.msn + 1) & MSN_MASK;
        if claimed.srq.is_none() {
            responder.rq_consumer = responder.rq_consumer.wrapping_add(1);
        }
        responder.inbound = Inbound::IDLE;
        let recv_cq = runtime.config.recv_cq;
        let mut cqe = Cqe::zeroed();
        cqe.set_opcode(opcode as u8);
        cqe.set_receive_side(true);
        cqe.set_status(CqeStatus::Success as u8);
        cqe.set_wqe_index(claimed.wqe_index);
        cqe.set_local_qp_number(qpn);
        cqe.set_byte_count(bytes);
        cqe.set_immediate_data(data);
        if let Some((repr, source_qp)) = ud {
            cqe.set_remote_qp_number(source_qp);
            cqe.set_source_mac_bytes(repr.ethernet.source);
            cqe.set_grh_present(true);
            if let Some(vlan) = &repr.ethernet.vlan {
                cqe.set_vlan_valid(true);
                cqe.set_vlan_id(vlan.vid);
                cqe.set_service_level(vlan.pcp);
            }
        }
        let _ = self.post_cqe(recv_cq, cqe, solicited);
    }

    // ---- UD ------------------------------------------------------------------------

    /// A UD packet for QP `qpn`; `frame` is the raw frame (its IP header becomes the GRH).
    pub(crate) fn ud_receive(&mut self, qpn: u32, frame: &[u8], parsed: &ParsedFrame<'_>) {
        let repr = &parsed.repr;
        let payload = parsed.payload;
        let operation = op::operation(repr.bth.opcode.0);
        let object = || format!("QP {qpn:#x}");
        if operation != op::SEND_ONLY && operation != op::SEND_ONLY_IMM {
            self.drop_frame(
                object(),
                "BTH OpCode",
                u64::from(operation),
                "UD SEND ONLY (with immediate)".into(),
            );
            return;
        }
        let Some(deth) = repr.deth else {
            self.drop_frame(object(), "DETH", 0, "a DETH on a UD packet".into());
            return;
        };
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        let config = runtime.config;
        if deth.qkey != config.qkey {
            self.transport.counters.qkey_violations += 1;
            self.drop_frame(
                object(),
                "DETH Q_Key",
                u64::from(deth.qkey),
                format!("the QP's Q_Key {:#x}", config.qkey),
            );
            return;
        }
        let Some(claimed) = self.claim_receive_wqe(&config) else {
            self.transport.counters.messages_dropped += 1;
            self.diagnose(
                Source::Transport,
                object(),
                "receive WQE",
                0,
                "a posted receive WQE (UD: the datagram is dropped)",
            );
            return;
        };
        let grh = grh_bytes(frame, repr);
        let total = GRH_LENGTH + payload.len();
        let mut cursor = SgeCursor::START;
        let result = self
            .check_scatter(&claimed.list, claimed.pd, &mut cursor, 0, total)
            .and_then(|()| {
                let mut cursor = SgeCursor::START;
                self.scatter(&claimed.list, claimed.pd, &mut cursor, 0, &grh)?;
                self.scatter(&claimed.list, claimed.pd, &mut cursor, GRH_LENGTH as u64, payload)
            });
        if let Err(error) = result {
            let Fault::Receive { status, reason, .. } = transfer_fault(error) else {
                unreachable!("transfer faults are receive faults")
            };
            self.diagnose(Source::Transport, object(), "receive WQE", total as u64, reason);
            if let Some(runtime) = self.transport.qps.get_mut(qpn) {
                runtime.responder.inbound.recv = Some(claimed);
            }
            self.fail_claimed_receive(qpn, status);
            return;
        }
        let (opcode, data) = if operation == op::SEND_ONLY_IMM {
            (RecvOpcode::SendWithImm, repr.immediate.unwrap_or(0))
        } else {
            (RecvOpcode::Send, 0)
        };
        self.complete_receive(
            qpn,
            &claimed,
            opcode,
            total as u32,
            data,
            repr.bth.solicited,
            Some((repr, deth.source_qp)),
        );
        self.sync_qpc(qpn);
    }

    // ---- responses -------------------------------------------------------------------

    /// Builds QP `qpn`'s next queued response (ACK, NAK, READ response, ATOMIC ACK).
    pub(crate) fn responder_next_packet(&mut self, qpn: u32) -> Option<Vec<u8>> {
        let runtime = self.transport.qps.get(qpn)?;
        let response = *runtime.responder.pending.front()?;
        // Fields, not the whole QpConfig: this runs for every response.
        let (path, mtu, dest_qpn, pd) = (
            runtime.config.path,
            runtime.config.mtu,
            runtime.config.dest_qpn,
            runtime.config.pd,
        );
        let msn = runtime.responder.msn;
        let Some(path) = path else {
            self.transport.qps.get_mut(qpn)?.responder.pending.pop_front();
            return None;
        };
        let (opcode, psn) = match response {
            Response::Ack { psn, .. } => (op::ACKNOWLEDGE, psn),
            Response::Atomic { psn, .. } => (op::ATOMIC_ACKNOWLEDGE, psn),
            Response::Read {
                next_psn,
                remaining,
                first,
                ..
            } => {
                let last = remaining <= mtu;
                let opcode = match (first, last) {
                    (true, true) => op::READ_RESPONSE_ONLY,
                    (true, false) => op::READ_RESPONSE_FIRST,
                    (false, true) => op::READ_RESPONSE_LAST,
                    (false, false) => op::READ_RESPONSE_MIDDLE,
                };
                (opcode, next_psn)
            }
        };
        let bth = bth(opcode, dest_qpn, psn);
        let mut repr = match self.packet_headers(&path, None, qpn, dest_qpn, bth) {
            Ok(repr) => repr,
            Err(error) => {
                self.diagnose(
                    Source::Transport,
                    format!("QP {qpn:#x}"),
                    "GMV_IDX",
                    u64::from(path.sgid_index),
                    format!("{error} to send a response (dropped)"),
                );
                self.transport.qps.get_mut(qpn)?.responder.pending.pop_front();
                return None;
            }
        };
        let ack = AethRepr {
            syndrome: op::AETH_ACK,
            msn,
        };
        // A READ response carries what remains of the READ, at most an MTU.
        let length = match &response {
            Response::Read { remaining, .. } => (*remaining).min(mtu),
            _ => 0,
        };
        // Every emit below writes or zeroes each byte of the frame it keeps; the READ
        // response's payload is dropped unless the read filled all of it. The AETH is not
        // counted in the length yet: near enough to choose a buffer by.
        let mut buffer = self
            .io
            .port()
            .take_frame_buffer(wire::frame_length(&repr, length as usize));
        match response {
            Response::Ack { syndrome, .. } => {
                repr.aeth = Some(AethRepr { syndrome, msn });
                wire::emit_frame_offloaded(&repr, 0, &mut buffer, |_| {});
                self.transport.qps.get_mut(qpn)?.responder.pending.pop_front();
            }
            Response::Atomic { original, .. } => {
                repr.aeth = Some(ack);
                repr.atomic_ack = Some(original);
                wire::emit_frame_offloaded(&repr, 0, &mut buffer, |_| {});
                self.transport.qps.get_mut(qpn)?.responder.pending.pop_front();
            }
            Response::Read {
                next_psn,
                va,
                rkey,
                remaining,
                first,
                ..
            } => {
                let last = remaining <= mtu;
                if first || last {
                    repr.aeth = Some(ack);
                }
                repr.bth.pad_count = pad_for(length as usize);
                let mut failure = None;
                wire::emit_frame_offloaded(&repr, length as usize, &mut buffer, |payload| {
                    if payload.is_empty() {
                        return;
                    }
                    failure = match self.check_memory_access(rkey, pd, va, payload.len() as u64, MrAccess::REMOTE_READ)
                    {
                        Ok(region) => self.read_region(&region, payload).err().map(remote_fault),
                        Err(error) => Some(Fault::Access(error)),
                    };
                });
                if let Some(fault) = failure {
                    // The region changed under an accepted READ: NAK it where it stands.
                    self.io.port().give_buffer(buffer);
                    self.transport.qps.get_mut(qpn)?.responder.pending.pop_front();
                    self.rc_fault(qpn, next_psn, op::READ_REQUEST, fault);
                    return None;
                }
                let responder = &mut self.transport.qps.get_mut(qpn)?.responder;
                if last {
                    responder.pending.pop_front();
                } else if let Some(Response::Read {
                    next_psn: n,
                    va: v,
                    remaining: r,
                    first: f,
                    ..
                }) = responder.pending.front_mut()
                {
                    *n = psn_add(next_psn, 1);
                    *v = va.wrapping_add(u64::from(length));
                    *r = remaining - length;
                    *f = false;
                }
            }
        }
        Some(buffer)
    }
}

/// Queues an ACK for `psn`, merged into a queued ACK not sent yet (coalescing).
fn queue_ack(pending: &mut std::collections::VecDeque<Response>, psn: u32) {
    if let Some(Response::Ack {
        psn: queued,
        syndrome: op::AETH_ACK,
    }) = pending.back_mut()
    {
        *queued = psn;
        return;
    }
    pending.push_back(Response::Ack {
        psn,
        syndrome: op::AETH_ACK,
    });
}

/// Records a READ/atomic for duplicate detection, forgetting the oldest beyond `capacity`.
fn push_replay(replay: &mut std::collections::VecDeque<ReplayEntry>, capacity: usize, entry: ReplayEntry) {
    while replay.len() >= capacity.max(1) {
        replay.pop_front();
    }
    replay.push_back(entry);
}

/// The 40-byte GRH slot of a UD receive: the IPv6 header, or 20 zero bytes and the IPv4
/// header (IBA / rxe layout).
fn grh_bytes(frame: &[u8], repr: &RoceRepr) -> [u8; GRH_LENGTH] {
    let mut grh = [0u8; GRH_LENGTH];
    let ip_start = 14 + if repr.ethernet.vlan.is_some() { 4 } else { 0 };
    match repr.ip {
        IpRepr::V4(_) => {
            if let Some(header) = frame.get(ip_start..ip_start + 20) {
                grh[20..].copy_from_slice(header);
            }
        }
        IpRepr::V6(_) => {
            if let Some(header) = frame.get(ip_start..ip_start + 40) {
                grh.copy_from_slice(header);
            }
        }
    }
    grh
}
