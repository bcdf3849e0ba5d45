//! The completer: what comes back to an RC requester.
//!
//! * ACK with PSN p acknowledges every PSN up to p (cumulative); SEND/WRITE WQEs whose
//!   last PSN is covered complete in SQ order. A READ or atomic WQE covered by an ACK or
//!   a later response without its own response means a lost response ("implied NAK"):
//!   go back to it.
//! * READ responses are accepted in PSN order and scattered into the WQE's SGEs; the
//!   ATOMIC ACK's original value goes into its SGE (little-endian, as the host reads it).
//! * NAK PSN sequence error: go back N to its PSN (a retry). RNR NAK: wait the RNR timer
//!   (IBA table 45) and go back N; `RNR_CNT` retries, 7 = infinite. Other NAKs complete
//!   the WQE with the matching remote error and move the QP to ERR.
//! * The local ACK timer (4.096 µs × 2^AT, 0 = off) goes back N from the oldest
//!   unacknowledged PSN; `RETRY_CNT` retries, then TRANSPORT_RETRY_EXC_ERR. Any progress
//!   restores both counters.

use rnic_firmware_if::cqe::CqeStatus;

use crate::diagnostics::Source;
use crate::wire::ParsedFrame;

use super::op;
use super::path::packet_gids;
use super::qp_runtime::{psn_add, psn_diff, rnr_delay, INFINITE_RETRY, MAX_UNACKED_PSNS, RETRY_WINDOW_START};
use super::requester::local_status;
use super::wqe_fetch::{Payload, SendWqe, WqeKind};
use super::FailedWqe;
use super::{Engine, Io, Timer};

/// Why `acknowledge_through` stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acked {
    /// Everything before the PSN is complete.
    Through,
    /// A READ/atomic before the PSN has not been answered: its response was lost.
    ImpliedNak,
}

impl<I: Io> Engine<I> {
    /// An RC response (READ response, ACK/NAK, ATOMIC ACK) for QP `qpn`.
    pub(crate) fn completer_receive(&mut self, qpn: u32, parsed: &ParsedFrame<'_>) {
        let repr = &parsed.repr;
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        if let Some(path) = runtime.config.path {
            let (source, _) = packet_gids(&repr.ip);
            if source != path.dgid {
                self.drop_frame(
                    format!("QP {qpn:#x}"),
                    "source IP",
                    u64::from_be_bytes(source[8..].try_into().unwrap_or_default()),
                    "the QP's destination GID (QPC DGID)".into(),
                );
                return;
            }
        }
        let requester = &runtime.requester;
        let before = (requester.consumer(), requester.retry_left, requester.rnr_left);
        let psn = repr.bth.psn;
        let operation = op::operation(repr.bth.opcode.0);
        if psn_diff(psn, requester.una_psn) < 0 {
            // Already acknowledged or answered: a duplicate.
            self.transport.counters.duplicate_responses += 1;
            return;
        }
        if psn_diff(psn, requester.transmitted_psn) >= 0 {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "BTH PSN",
                u64::from(psn),
                format!(
                    "a response to a transmitted PSN (oldest unacknowledged {:#x}, next {:#x})",
                    requester.una_psn, requester.transmitted_psn
                ),
            );
            return;
        }
        match operation {
            op::ACKNOWLEDGE => {
                let Some(aeth) = repr.aeth else {
                    self.drop_frame(format!("QP {qpn:#x}"), "AETH", 0, "an AETH on an ACK".into());
                    return;
                };
                match aeth.syndrome >> 5 {
                    0 => self.ack_received(qpn, psn),
                    1 => self.rnr_nak_received(qpn, psn, aeth.syndrome & 0x1F),
                    3 => self.nak_received(qpn, psn, aeth.syndrome & 0x1F),
                    _ => self.drop_frame(
                        format!("QP {qpn:#x}"),
                        "AETH syndrome",
                        u64::from(aeth.syndrome),
                        "an ACK, RNR NAK or NAK syndrome".into(),
                    ),
                }
            }
            op::ATOMIC_ACKNOWLEDGE => match repr.atomic_ack {
                Some(original) => self.atomic_ack_received(qpn, psn, original),
                None => self.drop_frame(
                    format!("QP {qpn:#x}"),
                    "AtomicAckETH",
                    0,
                    "an AtomicAckETH on an ATOMIC ACKNOWLEDGE".into(),
                ),
            },
            _ => self.read_response_received(qpn, psn, parsed.payload),
        }
        // Write the QPC back when something visible changed (not per READ response).
        let after = self
            .transport
            .qps
            .get(qpn)
            .map(|r| (r.requester.consumer(), r.requester.retry_left, r.requester.rnr_left));
        if after.is_some_and(|after| after != before) {
            self.sync_qpc(qpn);
        }
        self.kick_qp(qpn);
    }

    /// Completes SEND/WRITE WQEs whose PSNs all lie before `boundary` and moves the
    /// oldest unacknowledged PSN up to it (not past an unanswered READ/atomic).
    fn acknowledge_through(&mut self, qpn: u32, boundary: u32) -> Acked {
        let mut progressed = false;
        let mut outcome = Acked::Through;
        loop {
            let Some(runtime) = self.transport.qps.get_mut(qpn) else {
                return Acked::Through;
            };
            let requester = &mut runtime.requester;
            let Some(front) = requester.window.front().copied() else {
                break;
            };
            if !front.assigned {
                break;
            }
            if psn_diff(front.end_psn(), boundary) > 0 {
                // Partly covered: the packets before the boundary are acknowledged.
                if matches!(front.kind, WqeKind::Send | WqeKind::Write) && psn_diff(boundary, requester.una_psn) > 0 {
                    requester.una_psn = boundary;
                    progressed = true;
                }
                break;
            }
            if front.is_read_or_atomic() {
                outcome = Acked::ImpliedNak;
                break;
            }
            requester.pop_front();
            if psn_diff(front.end_psn(), requester.una_psn) > 0 {
                requester.una_psn = front.end_psn();
            }
            progressed = true;
            self.complete_send(qpn, &FailedWqe::of(&front, CqeStatus::Success));
        }
        if progressed {
            self.requester_progress(qpn);
        }
        outcome
    }

    /// Something was acknowledged or answered: counters restored, cursor kept at or after
    /// the oldest unacknowledged PSN, timer restarted or stopped.
    fn requester_progress(&mut self, qpn: u32) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let retry = runtime.config.retry_init;
        let rnr = runtime.config.rnr_init;
        let requester = &mut runtime.requester;
        requester.retry_left = retry;
        requester.rnr_left = rnr;
        requester.retry_pending = false;
        requester.timeouts_in_row = 0;
        // Slow start after a retry: each acknowledgement that makes progress doubles the
        // window until it is whole again.
        requester.send_window = requester.send_window.saturating_mul(2).min(MAX_UNACKED_PSNS);
        // A go-back-N in progress need not resend what is now acknowledged.
        if requester.cursor_slot == 0 {
            if let Some(front) = requester.window.front() {
                if front.assigned {
                    let acked = psn_diff(requester.una_psn, front.first_psn).max(0) as u32;
                    if front.kind != WqeKind::Read && requester.cursor_packet < acked {
                        requester.cursor_packet = acked.min(front.packets);
                    }
                }
            }
        }
        let outstanding = requester.outstanding();
        if outstanding {
            self.restart_ack_timer(qpn);
        } else {
            self.stop_ack_timer(qpn);
        }
    }

    /// ACK for `psn`: everything up to it is done.
    fn ack_received(&mut self, qpn: u32, psn: u32) {
        if self.acknowledge_through(qpn, psn_add(psn, 1)) == Acked::ImpliedNak {
            self.retry(qpn, "a READ/atomic response (implied NAK)");
        }
    }

    /// RNR NAK for `psn`: wait, then resend from it.
    fn rnr_nak_received(&mut self, qpn: u32, psn: u32, timer: u8) {
        self.transport.counters.rnr_naks_received += 1;
        if self.acknowledge_through(qpn, psn) == Acked::ImpliedNak {
            self.retry(qpn, "a READ/atomic response (implied NAK)");
            return;
        }
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let infinite = runtime.config.rnr_init == INFINITE_RETRY;
        let requester = &mut runtime.requester;
        if !infinite {
            if requester.rnr_left == 0 {
                let failed = requester
                    .window
                    .front()
                    .map(|w| FailedWqe::of(w, CqeStatus::RnrRetryExcErr));
                self.diagnose(
                    Source::Transport,
                    format!("QP {qpn:#x} PSN {psn:#x}"),
                    "RNR_CNT",
                    0,
                    "a receive WQE at the responder before the RNR retries ran out",
                );
                self.requester_fatal(qpn, failed);
                return;
            }
            requester.rnr_left -= 1;
        }
        requester.rnr_wait = true;
        requester.ack_deadline = None;
        self.go_back(qpn, psn);
        let generation = self.transport.next_generation();
        if let Some(runtime) = self.transport.qps.get_mut(qpn) {
            runtime.requester.rnr_timer = generation;
        }
        self.io.schedule_in(rnr_delay(timer), Timer::Rnr { qpn, generation });
    }

    /// NAK with `code` for `psn`.
    fn nak_received(&mut self, qpn: u32, psn: u32, code: u8) {
        self.transport.counters.naks_received += 1;
        let implied = self.acknowledge_through(qpn, psn) == Acked::ImpliedNak;
        if code == op::NAK_PSN_SEQUENCE || implied {
            self.retry(qpn, "the responder's expected PSN (sequence error NAK)");
            return;
        }
        let status = match code {
            op::NAK_INVALID_REQUEST => CqeStatus::RemoteInvalReqErr,
            op::NAK_REMOTE_ACCESS => CqeStatus::RemoteAccessErr,
            _ => CqeStatus::RemoteOpErr,
        };
        let failed = self
            .transport
            .qps
            .get(qpn)
            .and_then(|r| r.requester.window.front())
            .map(|w| FailedWqe::of(w, status));
        self.diagnose(
            Source::Transport,
            format!("QP {qpn:#x} PSN {psn:#x}"),
            "AETH NAK code",
            u64::from(code),
            format!("no NAK from the responder (the WQE completes with {status:?})"),
        );
        self.requester_fatal(qpn, failed);
    }

    /// READ response `psn` with `payload`.
    fn read_response_received(&mut self, qpn: u32, psn: u32, payload: &[u8]) {
        if self.acknowledge_through(qpn, psn) == Acked::ImpliedNak {
            // Responses of an earlier READ/atomic are missing.
            self.retry(qpn, "the earlier READ/atomic responses (implied NAK)");
            return;
        }
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        let config = runtime.config;
        let requester = &runtime.requester;
        let Some(front) = requester.window.front().copied() else {
            return;
        };
        if front.kind != WqeKind::Read || !front.assigned || psn_diff(psn, front.first_psn) < 0 {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "BTH OpCode",
                u64::from(psn),
                "a READ response for an outstanding RDMA READ".into(),
            );
            return;
        }
        if psn != requester.una_psn {
            // A response is missing in between.
            self.retry(qpn, "the missing READ response");
            return;
        }
        let index = psn_diff(psn, front.first_psn) as u64;
        // The WQE's own MTU: its response count was fixed with it at fetch.
        let offset = index * u64::from(front.mtu);
        let expected = u64::from(front.length).saturating_sub(offset).min(u64::from(front.mtu)) as usize;
        if payload.len() != expected {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "payload length",
                payload.len() as u64,
                format!("{expected} bytes of READ response data at PSN {psn:#x}"),
            );
            return;
        }
        let mut wqe = front;
        if !payload.is_empty()
            && !self.scatter_response(
                qpn,
                config.pd,
                &mut wqe,
                offset,
                payload,
                "local buffers the READ may write",
            )
        {
            return;
        }
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let requester = &mut runtime.requester;
        requester.una_psn = psn_add(psn, 1);
        let done = offset + payload.len() as u64 == u64::from(wqe.length);
        if done {
            requester.pop_front();
            requester.una_psn = wqe.end_psn();
        } else if let Some(front) = requester.window.front_mut() {
            front.cursor = wqe.cursor;
        }
        if requester.cursor_slot == 0 && requester.cursor_packet <= index as u32 && !done {
            // A re-request from here on would start after what just arrived.
            requester.cursor_packet = index as u32 + 1;
        }
        self.requester_progress(qpn);
        if done {
            self.complete_send(qpn, &FailedWqe::of(&wqe, CqeStatus::Success));
        }
    }

    /// ATOMIC ACKNOWLEDGE `psn` with the original value.
    fn atomic_ack_received(&mut self, qpn: u32, psn: u32, original: u64) {
        if self.acknowledge_through(qpn, psn) == Acked::ImpliedNak {
            self.retry(qpn, "the earlier READ/atomic responses (implied NAK)");
            return;
        }
        let Some(runtime) = self.transport.qps.get(qpn) else {
            return;
        };
        let config = runtime.config;
        let Some(mut wqe) = runtime.requester.window.front().copied() else {
            return;
        };
        if wqe.kind != WqeKind::Atomic || !wqe.assigned || wqe.first_psn != psn {
            self.drop_frame(
                format!("QP {qpn:#x}"),
                "BTH OpCode",
                u64::from(psn),
                "an ATOMIC ACKNOWLEDGE for an outstanding atomic".into(),
            );
            return;
        }
        if !self.scatter_response(
            qpn,
            config.pd,
            &mut wqe,
            0,
            &original.to_le_bytes(),
            "a local buffer the atomic may write",
        ) {
            return;
        }
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let requester = &mut runtime.requester;
        requester.pop_front();
        requester.una_psn = psn_add(psn, 1);
        self.requester_progress(qpn);
        self.complete_send(qpn, &FailedWqe::of(&wqe, CqeStatus::Success));
    }

    /// Scatters response bytes (READ data, an atomic's original value) into `wqe`'s local
    /// buffers at message offset `offset`. A buffer the WQE may not write ends the QP
    /// (requester fatal, `expected` in the diagnostic); `false` means drop the response.
    fn scatter_response(
        &mut self,
        qpn: u32,
        pd: u32,
        wqe: &mut SendWqe,
        offset: u64,
        bytes: &[u8],
        expected: &str,
    ) -> bool {
        let Payload::Sges(list) = wqe.payload else {
            return false;
        };
        let Err(error) = self.scatter(&list, pd, &mut wqe.cursor, offset, bytes) else {
            return true;
        };
        self.diagnose(
            Source::Transport,
            format!("QP {qpn:#x} SQ WQE {}", wqe.index),
            "SGE",
            offset,
            format!("{expected}: {error}"),
        );
        self.requester_fatal(qpn, Some(FailedWqe::of(wqe, local_status(&error))));
        false
    }

    /// A retry: go back N from the oldest unacknowledged PSN, or give up with
    /// TRANSPORT_RETRY_EXC_ERR when RETRY_CNT is used up.
    fn retry(&mut self, qpn: u32, missing: &str) {
        self.retry_from(qpn, missing, false);
    }

    /// [`Engine::retry`](Self::retry); a gap seen while a go-back-N is under way is ignored unless the
    /// timer expired (`timeout`).
    fn retry_from(&mut self, qpn: u32, missing: &str, timeout: bool) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let requester = &mut runtime.requester;
        if requester.retry_pending && !timeout {
            return;
        }
        let una = requester.una_psn;
        if requester.retry_left == 0 {
            let failed = requester
                .window
                .front()
                .map(|w| FailedWqe::of(w, CqeStatus::TransportRetryExcErr));
            self.diagnose(
                Source::Transport,
                format!("QP {qpn:#x} PSN {una:#x}"),
                "RETRY_CNT",
                0,
                format!("{missing} before the retries ran out"),
            );
            self.requester_fatal(qpn, failed);
            return;
        }
        requester.retry_left -= 1;
        requester.retry_pending = true;
        requester.send_window = RETRY_WINDOW_START;
        self.transport.counters.retries += 1;
        self.go_back(qpn, una);
        self.restart_ack_timer(qpn);
    }

    /// Moves the transmit cursor back to `psn` (go-back-N).
    fn go_back(&mut self, qpn: u32, psn: u32) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let requester = &mut runtime.requester;
        let mut slot = requester.window.len();
        let mut packet = 0;
        for (i, wqe) in requester.window.iter().enumerate() {
            if !wqe.assigned {
                slot = i;
                break;
            }
            let into = psn_diff(psn, wqe.first_psn);
            if into >= 0 && (into as u32) < wqe.packets {
                slot = i;
                packet = into as u32;
                break;
            }
        }
        requester.cursor_slot = slot;
        requester.cursor_packet = packet;
        requester.since_ack_request = 0;
    }

    /// The local ACK timer event of QP `qpn`.
    pub(crate) fn ack_timer_event(&mut self, qpn: u32, generation: u64) {
        let now = self.now();
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        let requester = &mut runtime.requester;
        if requester.generation != generation || requester.ack_event_at != Some(now) {
            return;
        }
        requester.ack_event_at = None;
        match requester.ack_deadline {
            None => return,
            Some(deadline) if deadline > now => {
                requester.ack_event_at = Some(deadline);
                self.io.schedule_at(deadline, Timer::Ack { qpn, generation });
                return;
            }
            Some(_) => requester.ack_deadline = None,
        }
        if !requester.outstanding() || requester.rnr_wait {
            return;
        }
        self.transport.counters.ack_timeouts += 1;
        requester.timeouts_in_row = requester.timeouts_in_row.saturating_add(1);
        self.retry_from(qpn, "an acknowledgement (local ACK timeout)", true);
        self.sync_qpc(qpn);
        self.kick_qp(qpn);
    }

    /// The RNR timer event of QP `qpn`: resend.
    pub(crate) fn rnr_timer_event(&mut self, qpn: u32, generation: u64) {
        let Some(runtime) = self.transport.qps.get_mut(qpn) else {
            return;
        };
        if runtime.requester.rnr_timer != generation || !runtime.requester.rnr_wait {
            return;
        }
        runtime.requester.rnr_timer = 0;
        runtime.requester.rnr_wait = false;
        self.restart_ack_timer(qpn);
        self.kick_qp(qpn);
    }
}
