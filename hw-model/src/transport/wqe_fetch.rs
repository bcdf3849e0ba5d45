//! WQE fetch: reads send WQEs from the SQ ring (through the QP buffer's MTR), decodes
//! and validates them into [`SendWqe`]s the requester works from, and claims receive
//! WQEs from the RQ or the QP's SRQ for the responder.
//!
//! A WQE that cannot be executed is refused here with the CQE status hardware reports:
//! unknown or unsupported opcode → LOCAL_QP_OP_ERR, lengths that do not add up or exceed
//! the limits → LOCAL_LENGTH_ERR. A WQE that cannot even be read (broken buffer
//! translation) is a WQ catastrophic error.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::ServiceType;
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::wqe::{RcSqWqe, Sge, SqOpcode, UdSqWqe, MAX_INLINE_IN_WQE, SGE_SIZE, SQ_WQE_SIZE};

use crate::diagnostics::Source;
use crate::time::Picoseconds;

use super::dma::{ExtRing, InlineData, SgeCursor, SgeList};
use super::qp_runtime::{ClaimedRecv, QpConfig};
use super::{Engine, Io};

/// Largest message (IBA: 2^31 bytes; RETH DMA length).
pub(crate) const MAX_MESSAGE: u32 = 1 << 31;
/// Largest UD inline payload packed into the WQE itself (§7.4).
const UD_PACKED_INLINE_MAX: u32 = 8;

/// What a send WQE does on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeKind {
    /// SEND (with immediate / invalidate).
    Send,
    /// RDMA WRITE (with immediate).
    Write,
    /// RDMA READ.
    Read,
    /// Compare-and-swap or fetch-and-add.
    Atomic,
}

/// Where a send WQE's payload comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload {
    /// Gathered from (or, for READ/atomic, scattered into) local SGEs.
    Sges(SgeList),
    /// Inline data.
    Inline(InlineData),
}

/// The addressing of a UD send WQE (§7.4).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdAddress {
    pub dmac: [u8; 6],
    pub dgid: [u8; 16],
    pub dest_qpn: u32,
    pub qkey: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub smac_index: u8,
    pub udp_source_port: u16,
    pub service_level: u8,
    pub vlan: Option<u16>,
}

/// A fetched send WQE and the requester's progress on it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWqe {
    /// Free-running SQ index (the CQE's WQE_IDX).
    pub index: u16,
    pub opcode: SqOpcode,
    pub kind: WqeKind,
    /// Message length in bytes (8 for atomics).
    pub length: u32,
    pub signaled: bool,
    pub fence: bool,
    pub solicited: bool,
    pub immediate: Option<u32>,
    pub invalidate: Option<u32>,
    pub remote_va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
    pub payload: Payload,
    pub ud: Option<UdAddress>,
    /// The QP's service type when the WQE was fetched. Every packet of the WQE is built
    /// as that service, even if a later MODIFY_QPC (or a context rewritten in host memory)
    /// says otherwise: the requester then completes the WQE in error.
    pub service: ServiceType,
    /// Path MTU in bytes when the WQE was fetched: `packets` was counted with it, so the
    /// packets (and READ responses) of this WQE are cut with it.
    pub mtu: u32,
    /// PSNs: the first one and how many the WQE occupies (READ: its responses).
    pub first_psn: u32,
    pub packets: u32,
    /// PSNs have been given (the first packet went out).
    pub assigned: bool,
    /// Gather (or READ-response scatter) position.
    pub cursor: SgeCursor,
}

/// Why a WQE could not be taken.
#[derive(Debug, Clone)]
pub(crate) enum FetchError {
    /// The WQE buffer could not be read: WQ catastrophic error (sub-type 4).
    Unreachable(String),
    /// The WQE is malformed: it completes with `status`.
    Invalid {
        opcode: u8,
        status: CqeStatus,
        reason: String,
    },
}

impl SendWqe {
    /// Whether the WQE needs a response beyond an ACK (and counts against SR_MAX).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(self.kind, WqeKind::Read | WqeKind::Atomic)
    }

    /// PSN one past the WQE's last PSN.
    pub fn end_psn(&self) -> u32 {
        super::qp_runtime::psn_add(self.first_psn, self.packets)
    }
}

fn invalid(opcode: u8, status: CqeStatus, reason: impl Into<String>) -> FetchError {
    FetchError::Invalid {
        opcode,
        status,
        reason: reason.into(),
    }
}

/// Number of packets (and PSNs) a message of `length` bytes takes at `mtu`.
pub(crate) fn packet_count(length: u32, mtu: u32) -> u32 {
    length.div_ceil(mtu).max(1)
}

impl<I: Io> Engine<I> {
    /// Reads and decodes SQ WQE `index` of QP `config.qpn`.
    pub(crate) fn fetch_send_wqe(&mut self, config: &QpConfig, index: u16) -> Result<SendWqe, FetchError> {
        let Some(buffer) = config.buffer else {
            return Err(FetchError::Unreachable("the QPC names no WQE buffer".into()));
        };
        // A WQE the last direct-WQE doorbell carried is in the device already.
        let direct = self
            .transport
            .qps
            .get_mut(config.qpn)
            .and_then(|runtime| runtime.requester.direct.take_if(|direct| direct.0 == index));
        let from_doorbell = direct.is_some();
        let raw = match direct {
            Some(direct) => direct.1,
            None => {
                let mut raw = [0u8; SQ_WQE_SIZE];
                self.read_buffer(&buffer.mtr, buffer.sq_wqe_offset(u32::from(index)), &mut raw)
                    .map_err(|e| FetchError::Unreachable(e.to_string()))?;
                raw
            }
        };
        // Timing: the QPC (context cache), then, unless it came with the doorbell, one
        // PCIe read round trip for the WQE.
        let context = self.io.timing().context_lookup(config.qpn);
        let params = *self.io.timing().params();
        let frame_latency = if from_doorbell {
            Picoseconds::ZERO
        } else {
            let fetch = params.wqe_fetch();
            self.io.timing().record(crate::timing::Stage::WqeFetch, fetch);
            let frame = &mut self.io.timing().frame;
            frame.read_link = frame.read_link + params.pcie_read_transfer(params.wqe_bytes);
            fetch
        };
        let frame = &mut self.io.timing().frame;
        frame.latency = frame.latency + context + frame_latency;
        let ring = (config.sge_slots > 0).then(|| ExtRing {
            mtr: buffer.mtr,
            offset: buffer.region_offsets[1],
            slots: config.sge_slots,
        });
        let wqe = match config.service {
            ServiceType::Ud => self.decode_ud_wqe(config, index, UdSqWqe(raw), ring)?,
            _ => self.decode_rc_wqe(config, index, RcSqWqe(raw), ring)?,
        };
        Ok(wqe)
    }

    fn decode_rc_wqe(
        &mut self,
        config: &QpConfig,
        index: u16,
        wqe: RcSqWqe,
        ring: Option<ExtRing>,
    ) -> Result<SendWqe, FetchError> {
        let raw_opcode = wqe.opcode();
        let opcode = SqOpcode::try_from(raw_opcode)
            .map_err(|_| invalid(raw_opcode, CqeStatus::LocalQpOpErr, "a defined SQ opcode (§7.2)"))?;
        let uc = config.service == ServiceType::Uc;
        let kind = match opcode {
            SqOpcode::Send | SqOpcode::SendWithImm => WqeKind::Send,
            // UC has no SEND with Invalidate (no IETH outside RC and XRC).
            SqOpcode::SendWithInv if !uc => WqeKind::Send,
            SqOpcode::RdmaWrite | SqOpcode::RdmaWriteWithImm => WqeKind::Write,
            SqOpcode::RdmaRead if !uc => WqeKind::Read,
            SqOpcode::AtomCmpAndSwap | SqOpcode::AtomFetchAndAdd if !uc => WqeKind::Atomic,
            _ => {
                return Err(invalid(
                    raw_opcode,
                    CqeStatus::LocalQpOpErr,
                    if uc {
                        "SEND, SEND_WITH_IMM or RDMA WRITE (with immediate) on a UC QP"
                    } else {
                        "an opcode the transport executes (masked atomics, FRMR, LOCAL_INV and BIND_MW are not supported)"
                    },
                ))
            }
        };
        let length = wqe.message_length();
        if length > MAX_MESSAGE {
            return Err(invalid(raw_opcode, CqeStatus::LocalLengthErr, "MSG_LEN at most 2^31"));
        }
        let sge_count = wqe.sge_count();
        let payload = if wqe.inline() {
            if kind != WqeKind::Send && kind != WqeKind::Write {
                return Err(invalid(
                    raw_opcode,
                    CqeStatus::LocalQpOpErr,
                    "no inline data with RDMA READ or atomics",
                ));
            }
            self.inline_payload(
                raw_opcode,
                length,
                wqe.inline_type(),
                wqe.message_start_sge_index(),
                ring,
                {
                    let mut bytes = [0u8; 32];
                    bytes.copy_from_slice(wqe.inline_bytes());
                    bytes
                },
            )?
        } else {
            if u32::from(sge_count) > u32::from(self.transport.caps.max_sq_sges) {
                return Err(invalid(
                    raw_opcode,
                    CqeStatus::LocalLengthErr,
                    format!("SGE_NUM {sge_count} at most max_sq_sges"),
                ));
            }
            let list = SgeList::Send {
                in_wqe_sges: [wqe.sge(0), wqe.sge(1)],
                in_wqe: sge_count.min(2),
                count: sge_count,
                ext_start: wqe.message_start_sge_index(),
                ring,
            };
            if kind == WqeKind::Atomic {
                // SGE 0 is the local buffer; bytes 48..64 hold the atomic operands.
                if sge_count != 1 || wqe.sge(0).length() < 8 || length != 8 {
                    return Err(invalid(
                        raw_opcode,
                        CqeStatus::LocalLengthErr,
                        "an atomic with one SGE of at least 8 bytes and MSG_LEN 8",
                    ));
                }
            } else {
                self.check_sge_total(&list, raw_opcode, length)?;
            }
            Payload::Sges(list)
        };
        let packets = match kind {
            WqeKind::Atomic => 1,
            _ => packet_count(length, config.mtu),
        };
        Ok(SendWqe {
            index,
            opcode,
            kind,
            length,
            signaled: wqe.signaled(),
            fence: wqe.fence() || wqe.strong_order(),
            solicited: wqe.solicited_event(),
            immediate: matches!(opcode, SqOpcode::SendWithImm | SqOpcode::RdmaWriteWithImm)
                .then(|| wqe.immediate_data()),
            invalidate: (opcode == SqOpcode::SendWithInv).then(|| wqe.inv_key()),
            remote_va: wqe.remote_address(),
            rkey: wqe.rkey(),
            swap_add: if kind == WqeKind::Atomic {
                wqe.atomic_swap_add()
            } else {
                0
            },
            compare: if opcode == SqOpcode::AtomCmpAndSwap {
                wqe.atomic_compare()
            } else {
                0
            },
            payload,
            ud: None,
            service: config.service,
            mtu: config.mtu,
            first_psn: 0,
            packets,
            assigned: false,
            cursor: SgeCursor::START,
        })
    }

    /// Refuses a WQE whose MSG_LEN is not the sum of its SGE lengths (LOC_LEN_ERR).
    fn check_sge_total(&mut self, list: &SgeList, opcode: u8, length: u32) -> Result<(), FetchError> {
        let total = self
            .sge_list_length(list)
            .map_err(|e| FetchError::Unreachable(e.to_string()))?;
        if total != u64::from(length) {
            return Err(invalid(
                opcode,
                CqeStatus::LocalLengthErr,
                format!("MSG_LEN {length} equal to the sum of the SGE lengths {total}"),
            ));
        }
        Ok(())
    }

    /// Inline payload of `length` bytes: in the WQE (`in_wqe` bytes) or in the ring.
    fn inline_payload(
        &mut self,
        opcode: u8,
        length: u32,
        in_ring: bool,
        start: u32,
        ring: Option<ExtRing>,
        in_wqe: [u8; 32],
    ) -> Result<Payload, FetchError> {
        let max_inline = u32::from(self.transport.caps.max_sq_inline);
        if length > max_inline {
            return Err(invalid(
                opcode,
                CqeStatus::LocalLengthErr,
                format!("inline data of at most {max_inline} bytes, not {length}"),
            ));
        }
        if !in_ring {
            if length as usize > MAX_INLINE_IN_WQE {
                return Err(invalid(
                    opcode,
                    CqeStatus::LocalLengthErr,
                    format!("INLINE_TYPE 0 with at most {MAX_INLINE_IN_WQE} bytes, not {length}"),
                ));
            }
            return Ok(Payload::Inline(InlineData::InWqe(in_wqe)));
        }
        let Some(ring) = ring else {
            return Err(invalid(
                opcode,
                CqeStatus::LocalQpOpErr,
                "INLINE_TYPE 1 needs an extended SGE ring (SGE_SHIFT > 0)",
            ));
        };
        if u64::from(length) > u64::from(ring.slots) * SGE_SIZE as u64 {
            return Err(invalid(
                opcode,
                CqeStatus::LocalLengthErr,
                "inline data no longer than the extended SGE ring",
            ));
        }
        Ok(Payload::Inline(InlineData::Ring { ring, start }))
    }

    fn decode_ud_wqe(
        &mut self,
        config: &QpConfig,
        index: u16,
        wqe: UdSqWqe,
        ring: Option<ExtRing>,
    ) -> Result<SendWqe, FetchError> {
        let raw_opcode = wqe.opcode();
        let opcode = SqOpcode::try_from(raw_opcode)
            .ok()
            .filter(|op| op.allowed_on_ud())
            .ok_or_else(|| invalid(raw_opcode, CqeStatus::LocalQpOpErr, "SEND or SEND_WITH_IMM on a UD QP"))?;
        if wqe.protection_domain() != config.pd {
            return Err(invalid(
                raw_opcode,
                CqeStatus::LocalQpOpErr,
                format!(
                    "the address handle's PD {} equal to the QP's PD {}",
                    wqe.protection_domain(),
                    config.pd
                ),
            ));
        }
        let mut length = wqe.message_length();
        let payload = if wqe.inline() {
            if !wqe.inline_type() {
                // ≤ 8 bytes packed into spare fields, which overlap MSG_LEN bits 31:16.
                length &= 0xFFFF;
                if length > UD_PACKED_INLINE_MAX {
                    return Err(invalid(
                        raw_opcode,
                        CqeStatus::LocalLengthErr,
                        "packed UD inline data of at most 8 bytes",
                    ));
                }
                let mut bytes = [0u8; 32];
                bytes[..8].copy_from_slice(&wqe.packed_inline_data().to_le_bytes());
                Payload::Inline(InlineData::InWqe(bytes))
            } else {
                self.inline_payload(raw_opcode, length, true, wqe.message_start_sge_index(), ring, [0; 32])?
            }
        } else {
            let list = SgeList::Send {
                in_wqe_sges: [Sge::zeroed(); 2],
                in_wqe: 0,
                count: wqe.sge_count(),
                ext_start: wqe.message_start_sge_index(),
                ring,
            };
            self.check_sge_total(&list, raw_opcode, length)?;
            Payload::Sges(list)
        };
        if length > config.mtu {
            return Err(invalid(
                raw_opcode,
                CqeStatus::LocalLengthErr,
                format!("a UD message of at most one MTU ({} bytes), not {length}", config.mtu),
            ));
        }
        let qkey = if wqe.qkey() & 0x8000_0000 != 0 {
            config.qkey
        } else {
            wqe.qkey()
        };
        Ok(SendWqe {
            index,
            opcode,
            kind: WqeKind::Send,
            length,
            signaled: wqe.signaled(),
            fence: false,
            solicited: wqe.solicited_event(),
            immediate: (opcode == SqOpcode::SendWithImm).then(|| wqe.immediate_data()),
            invalidate: None,
            remote_va: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
            payload,
            ud: Some(UdAddress {
                dmac: wqe.dmac(),
                dgid: wqe.dgid(),
                dest_qpn: wqe.destination_qpn(),
                qkey,
                hop_limit: wqe.hop_limit(),
                traffic_class: wqe.traffic_class(),
                flow_label: wqe.flow_label(),
                sgid_index: wqe.sgid_index(),
                smac_index: wqe.smac_index(),
                udp_source_port: wqe.udp_source_port(),
                service_level: wqe.service_level(),
                vlan: (wqe.vlan_enable() && wqe.vlan() < 0xFFF).then(|| wqe.vlan()),
            }),
            service: config.service,
            mtu: config.mtu,
            first_psn: 0,
            packets: 1,
            assigned: false,
            cursor: SgeCursor::START,
        })
    }

    /// Claims the receive WQE for the next inbound message of QP `config.qpn`: the WQE at
    /// the RQ consumer index (consumed when the message completes) or the next WQE of the
    /// SRQ (consumed from its index queue now). None when nothing is posted.
    pub(crate) fn claim_receive_wqe(&mut self, config: &QpConfig) -> Option<ClaimedRecv> {
        if let Some(srqn) = config.srqn {
            let taken = self.srq_take_wqe(srqn)?;
            return Some(ClaimedRecv {
                wqe_index: taken.slot,
                srq: Some(srqn),
                list: SgeList::Receive {
                    mtr: taken.mtr,
                    offset: taken.offset,
                    slots: taken.slots,
                },
                pd: taken.pd,
            });
        }
        let qpn = config.qpn;
        let buffer = config.buffer?;
        let (consumer, cached_producer) = {
            let runtime = self.transport.qps.get(qpn)?;
            (runtime.responder.rq_consumer, runtime.responder.rq_producer)
        };
        let producer = match config.rq_record {
            Some(address) => {
                let mut record = [0u8; 4];
                if let Err(error) = self.dma_read(address, &mut record) {
                    self.diagnose(
                        Source::Transport,
                        format!("QP {qpn:#x}"),
                        "RQ_DB_RECORD_ADDR",
                        address,
                        format!("a readable RQ record doorbell: {error}"),
                    );
                    return None;
                }
                u32::from_le_bytes(record) as u16
            }
            None => cached_producer,
        };
        let posted = producer.wrapping_sub(consumer);
        if posted == 0 {
            return None;
        }
        if u32::from(posted) > buffer.rq_depth {
            self.diagnose(
                Source::Transport,
                format!("QP {qpn:#x}"),
                "RQ producer index",
                u64::from(producer),
                format!("at most {} WQEs past the consumer index {consumer}", buffer.rq_depth),
            );
            return None;
        }
        let stride = (SGE_SIZE as u64) << config.rq_wqe_shift;
        Some(ClaimedRecv {
            wqe_index: consumer,
            srq: None,
            list: SgeList::Receive {
                mtr: buffer.mtr,
                offset: buffer.region_offsets[2] + u64::from(u32::from(consumer) & (buffer.rq_depth - 1)) * stride,
                slots: 1 << config.rq_wqe_shift,
            },
            pd: config.pd,
        })
    }
}
