//! The requester: turns the QP's send WQEs into request packets.
//!
//! It works through a window of fetched WQEs (the oldest is the SQ consumer index). A
//! WQE gets its PSNs when its first packet goes out: `ceil(length / MTU)` (at least one)
//! for SEND and WRITE, as many as its responses for READ, one for an atomic. Packets go
//! out one per port slot; after a NAK, an RNR NAK or a timeout the completer moves the
//! transmit cursor back (go-back-N) and the same PSNs go out again.
//!
//! A new WQE waits while: a FENCE/SO WQE has READ/atomic WQEs outstanding before it,
//! a READ/atomic would exceed SR_MAX outstanding, or the unacknowledged PSNs reach the
//! send window: [`MAX_UNACKED_PSNS`], or fewer while recovering from a retry
//! ([`RETRY_WINDOW_START`], doubled by every acknowledgement that makes progress); a
//! go-back-N resends no further than that window either. UC and UD WQEs complete when
//! their last packet is sent.

use rnic_firmware_if::context::{QpState, ServiceType};
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::event::{AsyncEventType, WqCatastrophicSubtype};

use crate::diagnostics::Source;
use crate::wire::{self, opcode::BthOpcode, AtomicEthRepr, BthRepr, DethRepr, RethRepr};

use super::dma::TransferError;
use super::op;
use super::path::Path;
use super::qp_runtime::{psn_add, psn_diff, ACK_REQUEST_INTERVAL, MAX_WINDOW_WQES};
#[cfg(doc)]
use super::qp_runtime::{MAX_UNACKED_PSNS, RETRY_WINDOW_START};
use super::wqe_fetch::{FetchError, Payload, WqeKind};
use super::FailedWqe;
use super::{Engine, Io, Timer};

/// The CQE status for a local transfer failure.
pub(crate) fn local_status(error: &TransferError) -> CqeStatus {
    match error {
        TransferError::Protection(_) => CqeStatus::LocalProtErr,
        TransferError::Length => CqeStatus::LocalLengthErr,
        TransferError::List(_) => CqeStatus::LocalQpOpErr,
        TransferError::Dma(_) => CqeStatus::LocalAccessErr,
    }
}

/// Pad bytes after a payload of `length` bytes (to a multiple of four).
pub(crate) fn pad_for(length: usize) -> u8 {
    ((4 - length % 4) % 4) as u8
}

/// A BTH with the fields every packet of this device shares.
pub(crate) fn bth(opcode: u8, destination_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode: BthOpcode(opcode),
        solicited: false,
        // Hardware RNICs send MigReq = 1 (path migration state MIGRATED, no APM).
        migration: true,
        pad_count: 0,
        transport_version: 0,
        partition_key: 0xFFFF,
        fecn: false,
        becn: false,
        destination_qp,
        ack_request: false,
        psn,
    }
}

impl<I: Io> Engine<I> {
    /// Builds QP `qpn`'s next request packet, or None when it has nothing it may send.
    pub(crate) fn requester_next_packet(&mut self, qpn: u32) -> Option<Vec<u8>> {
        loop {
            let runtime = self.transport.qps.get(qpn)?;
            if runtime.state != QpState::Rts {
                return None;
            }
            // Fields, not the whole QpConfig: the loop runs for every packet.
            let (service, max_rd_atomic) = (runtime.config.service, runtime.config.max_rd_atomic);
            let requester = &runtime.requester;
            if requester.rnr_wait || requester.stalled {
                return None;
            }
            if requester.cursor_slot >= requester.window.len() {
                if requester.fetched == requester.producer || requester.window.len() >= MAX_WINDOW_WQES {
                    return None;
                }
                let index = requester.fetched;
                let config = runtime.config;
                match self.fetch_send_wqe(&config, index) {
                    Ok(wqe) => {
                        let runtime = self.transport.qps.get_mut(qpn)?;
                        runtime.requester.window.push_back(wqe);
                        runtime.requester.fetched = index.wrapping_add(1);
                        continue;
                    }
                    Err(FetchError::Unreachable(reason)) => {
                        self.diagnose(
                            Source::Transport,
                            format!("QP {qpn:#x} SQ WQE {index}"),
                            "WQE_SGE_BA",
                            u64::from(index),
                            format!("a readable SQ WQE and SGE list: {reason}"),
                        );
                        self.post_async_event(
                            AsyncEventType::WqCatasError,
                            WqCatastrophicSubtype::WqeAddrError as u8,
                            qpn,
                        );
                        self.requester_fatal(qpn, None);
                        return None;
                    }
                    Err(FetchError::Invalid { opcode, status, reason }) => {
                        self.diagnose(
                            Source::Transport,
                            format!("QP {qpn:#x} SQ WQE {index}"),
                            "OPCODE",
                            u64::from(opcode),
                            reason,
                        );
                        let failed = FailedWqe {
                            index,
                            opcode,
                            length: 0,
                            signaled: true,
                            status,
                        };
                        self.requester_fatal(qpn, Some(failed));
                        return None;
                    }
                }
            }
            let slot = requester.cursor_slot;
            let wqe = requester.window[slot];
            if !wqe.assigned {
                if wqe.fence && requester.reads_outstanding > 0 {
                    return None;
                }
                if wqe.is_read_or_atomic() && requester.reads_outstanding >= max_rd_atomic {
                    return None;
                }
                if service == ServiceType::Rc
                    && psn_diff(requester.next_psn, requester.una_psn) >= requester.send_window
                {
                    return None;
                }
                let runtime = self.transport.qps.get_mut(qpn)?;
                let requester = &mut runtime.requester;
                let wqe = &mut requester.window[slot];
                wqe.first_psn = requester.next_psn;
                wqe.assigned = true;
                requester.next_psn = psn_add(requester.next_psn, wqe.packets);
                if wqe.is_read_or_atomic() {
                    requester.reads_outstanding += 1;
                }
                continue;
            }
            let packet = requester.cursor_packet;
            let psn = psn_add(wqe.first_psn, packet);
            if service == ServiceType::Rc && psn_diff(psn, requester.una_psn) >= requester.send_window {
                return None;
            }
            return self.build_request(qpn, slot, packet);
        }
    }

    /// Builds packet `packet` of the WQE in window slot `slot` and moves the cursor on.
    fn build_request(&mut self, qpn: u32, slot: usize, packet: u32) -> Option<Vec<u8>> {
        let runtime = self.transport.qps.get(qpn)?;
        let config = runtime.config;
        let mut wqe = runtime.requester.window[slot];
        let since_ack_request = runtime.requester.since_ack_request;
        let retransmission = psn_diff(psn_add(wqe.first_psn, packet), runtime.requester.transmitted_psn) < 0;
        if wqe.service != config.service {
            // The QPC's service type changed under a fetched WQE (hns fixes TST at
            // RESET→INIT, and MODIFY_QPC refuses a change, but a driver can rewrite the
            // context in host memory): the WQE cannot be sent as either, so it fails.
            self.diagnose(
                Source::Transport,
                format!("QP {qpn:#x} SQ WQE {}", wqe.index),
                "TST",
                u64::from(u8::from(config.service)),
                format!("the service type the WQE was fetched as ({:?})", wqe.service),
            );
            self.requester_fatal(qpn, Some(FailedWqe::of(&wqe, CqeStatus::LocalQpOpErr)));
            return None;
        }
        // The WQE's own MTU: its packet count was fixed with it at fetch.
        let mtu = wqe.mtu;
        let psn = psn_add(wqe.first_psn, packet);
        let (path, remote_qpn, smac_index) = match (&wqe.ud, config.path) {
            (Some(ud), _) => (Path::from_ud(ud), ud.dest_qpn, Some(ud.smac_index)),
            (None, Some(path)) => (path, config.dest_qpn, None),
            (None, None) => return None,
        };
        let service_bits = match wqe.service {
            ServiceType::Uc => op::UC,
            ServiceType::Ud => op::UD,
            _ => op::RC,
        };
        let reliable = wqe.service == ServiceType::Rc;
        // What this packet carries.
        let offset = u64::from(packet) * u64::from(mtu);
        let (opcode, payload_length, last) = match wqe.kind {
            WqeKind::Send => {
                let last = packet + 1 == wqe.packets;
                let (last_op, only_op) = if wqe.immediate.is_some() {
                    (op::SEND_LAST_IMM, op::SEND_ONLY_IMM)
                } else if wqe.invalidate.is_some() {
                    (op::SEND_LAST_INV, op::SEND_ONLY_INV)
                } else {
                    (op::SEND_LAST, op::SEND_ONLY)
                };
                let opcode = op::position(packet, wqe.packets, only_op, op::SEND_FIRST, op::SEND_MIDDLE, last_op);
                let length = (u64::from(wqe.length) - offset).min(u64::from(mtu)) as usize;
                (opcode, length, last)
            }
            WqeKind::Write => {
                let last = packet + 1 == wqe.packets;
                let (last_op, only_op) = if wqe.immediate.is_some() {
                    (op::WRITE_LAST_IMM, op::WRITE_ONLY_IMM)
                } else {
                    (op::WRITE_LAST, op::WRITE_ONLY)
                };
                let opcode = op::position(packet, wqe.packets, only_op, op::WRITE_FIRST, op::WRITE_MIDDLE, last_op);
                let length = (u64::from(wqe.length) - offset).min(u64::from(mtu)) as usize;
                (opcode, length, last)
            }
            WqeKind::Read => (op::READ_REQUEST, 0, true),
            WqeKind::Atomic => (
                if wqe.opcode == rnic_firmware_if::wqe::SqOpcode::AtomCmpAndSwap {
                    op::COMPARE_SWAP
                } else {
                    op::FETCH_ADD
                },
                0,
                true,
            ),
        };
        let opcode = if wqe.service == ServiceType::Ud {
            if wqe.immediate.is_some() {
                op::UD | op::SEND_ONLY_IMM
            } else {
                op::UD | op::SEND_ONLY
            }
        } else {
            service_bits | opcode
        };
        let ack_request = reliable && (last || since_ack_request + 1 >= ACK_REQUEST_INTERVAL);
        let mut bth = bth(opcode, remote_qpn, psn);
        bth.ack_request = ack_request;
        bth.pad_count = pad_for(payload_length);
        bth.solicited = last
            && wqe.solicited
            && (wqe.kind == WqeKind::Send || (wqe.kind == WqeKind::Write && wqe.immediate.is_some()));
        let mut repr = match self.packet_headers(&path, smac_index, qpn, remote_qpn, bth) {
            Ok(repr) => repr,
            Err(error) => {
                // No source address: the port cannot send. The WQE waits (a driver that
                // configures the GID and rings the doorbell again resumes it).
                self.diagnose(
                    Source::Transport,
                    format!("QP {qpn:#x} SQ WQE {}", wqe.index),
                    "GMV_IDX",
                    u64::from(path.sgid_index),
                    error.to_string(),
                );
                let runtime = self.transport.qps.get_mut(qpn)?;
                runtime.requester.stalled = true;
                return None;
            }
        };
        let first = packet == 0;
        match wqe.kind {
            WqeKind::Write if first => {
                repr.reth = Some(RethRepr {
                    virtual_address: wqe.remote_va,
                    rkey: wqe.rkey,
                    dma_length: wqe.length,
                });
            }
            WqeKind::Read => {
                let done = u64::from(packet) * u64::from(mtu);
                repr.reth = Some(RethRepr {
                    virtual_address: wqe.remote_va.wrapping_add(done),
                    rkey: wqe.rkey,
                    dma_length: (u64::from(wqe.length) - done) as u32,
                });
            }
            WqeKind::Atomic => {
                repr.atomic_eth = Some(AtomicEthRepr {
                    virtual_address: wqe.remote_va,
                    rkey: wqe.rkey,
                    swap_or_add: wqe.swap_add,
                    compare: wqe.compare,
                });
            }
            _ => {}
        }
        if last {
            repr.immediate = wqe.immediate;
            repr.invalidate_rkey = wqe.invalidate;
        }
        if let Some(ud) = &wqe.ud {
            repr.deth = Some(DethRepr {
                qkey: ud.qkey,
                source_qp: qpn,
            });
        }
        let mut buffer = self
            .io
            .port()
            .take_frame_buffer(wire::frame_length(&repr, payload_length));
        let mut failure = None;
        let pd = config.pd;
        // On success the gather writes every payload byte; on failure the frame is dropped.
        wire::emit_frame_offloaded(&repr, payload_length, &mut buffer, |payload| {
            if payload.is_empty() {
                return;
            }
            let result = match &wqe.payload {
                Payload::Sges(list) => self.gather(list, pd, &mut wqe.cursor, offset, payload),
                Payload::Inline(data) => self.gather_inline(data, offset, payload),
            };
            failure = result.err();
        });
        if let Some(error) = failure {
            self.io.port().give_buffer(buffer);
            self.diagnose(
                Source::Transport,
                format!("QP {qpn:#x} SQ WQE {}", wqe.index),
                "SGE",
                offset,
                format!("local data the WQE may read: {error}"),
            );
            self.requester_fatal(qpn, Some(FailedWqe::of(&wqe, local_status(&error))));
            return None;
        }
        // The packet is built: move the cursor, count, and complete unreliable WQEs.
        let runtime = self.transport.qps.get_mut(qpn)?;
        let requester = &mut runtime.requester;
        requester.window[slot].cursor = wqe.cursor;
        requester.since_ack_request = if ack_request { 0 } else { since_ack_request + 1 };
        let end = match wqe.kind {
            WqeKind::Read => wqe.end_psn(),
            _ => psn_add(psn, 1),
        };
        if psn_diff(end, requester.transmitted_psn) > 0 {
            requester.transmitted_psn = end;
        }
        let whole = matches!(wqe.kind, WqeKind::Read | WqeKind::Atomic) || last;
        if whole {
            requester.cursor_slot = slot + 1;
            requester.cursor_packet = 0;
        } else {
            requester.cursor_packet = packet + 1;
        }
        if retransmission {
            self.transport.counters.retransmitted_packets += 1;
        }
        if reliable {
            self.ensure_ack_timer(qpn);
        } else if whole {
            // UC/UD: a message is complete once sent.
            // Earlier UC/UD WQEs completed when sent, so this one is the oldest.
            if let Some(runtime) = self.transport.qps.get_mut(qpn) {
                runtime.requester.pop_front();
            }
            self.complete_send(qpn, &FailedWqe::of(&wqe, CqeStatus::Success));
            self.sync_qpc(qpn);
        }
        Some(buffer)
    }

    /// Arms the local ACK timer if it is not running (a packet just went out).
    pub(crate) fn ensure_ack_timer(&mut self, qpn: u32) {
        let armed = self
            .transport
            .qps
            .get(qpn)
            .is_some_and(|r| r.requester.ack_deadline.is_some());
        if !armed {
            self.restart_ack_timer(qpn);
        }
    }

    /// (Re)starts QP `qpn`'s local ACK timer from now (AT = 0: no timer).
    pub(crate) fn restart_ack_timer(&mut self, qpn: u32) {
        let now = self.now();
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let Some(timeout) = super::qp_runtime::ack_timeout(runtime.config.ack_timeout) else {
            return;
        };
        let requester = &mut runtime.requester;
        let deadline = now + requester.backed_off(timeout);
        requester.ack_deadline = Some(deadline);
        // A pending event due later (armed with a longer backoff) would fire late.
        if requester.ack_event_at.is_none_or(|at| at > deadline) {
            requester.ack_event_at = Some(deadline);
            let generation = requester.generation;
            self.io.schedule_at(deadline, Timer::Ack { qpn, generation });
        }
    }

    /// Stops QP `qpn`'s local ACK timer (nothing outstanding).
    pub(crate) fn stop_ack_timer(&mut self, qpn: u32) {
        if let Some(runtime) = self.transport.qps.get_mut(qpn) {
            runtime.requester.ack_deadline = None;
        }
    }
}
