//! The GSI agent of one device: QP1 with a ring of receive buffers and a pool of send
//! buffers, what Linux's MAD layer is for the CM. It hands received MADs up with the
//! address they came from (the GRH slot's IP header and the CQE's source MAC) and sends
//! MADs to a peer's QP1 with the GSI Q_Key.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rnic_firmware_if::cmdq::GidType;
use rnic_firmware_if::context::{GSI_QKEY, GSI_QPN, UD_GRH_LENGTH};

use super::address::{gid_to_ip, ip_to_gid, NeighbourResolver};
use super::config::CmConfig;
use super::mad::MAD_LEN;
use crate::verbs::{
    AccessFlags, AhAttributes, CompletionQueue, Context, Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttributeMask,
    QpAttributes, QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair, RecvWorkRequest, SendFlags,
    SendWorkRequest, Sge, UdFields, VerbsError, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// Bytes a receive takes: the GRH slot and the largest UD message (4096), so no datagram
/// can complete a receive with a length error (which moves a QP to ERR under hns rules):
/// whatever arrives is received and judged by its length.
const RECEIVE_LENGTH: usize = UD_GRH_LENGTH + 4096;
/// Bytes between two receive buffers.
const RECEIVE_SLOT: u64 = 4096 + 64;
/// Most MADs waiting for a free send buffer; more are dropped (and counted).
const SEND_BACKLOG: usize = 1024;
/// Send work requests are told apart from receives by this bit of the `wr_id`.
const SEND_WR: u64 = 1 << 63;

/// Where a MAD goes: a peer's QP1 and how to reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MadPeer {
    /// The peer's GID.
    pub dgid: Gid,
    /// Our GID index to send from.
    pub sgid_index: u8,
    /// The peer's MAC.
    pub dmac: [u8; 6],
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

/// A MAD as it arrived.
#[derive(Debug, Clone)]
pub(crate) struct ReceivedMad {
    /// The 256 bytes (or fewer if the sender sent fewer: the CM refuses those).
    pub bytes: Vec<u8>,
    /// Where it came from, for an answer.
    pub peer: MadPeer,
    /// The sender's address (the GRH's source).
    pub source: IpAddr,
}

/// Counters of the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentCounters {
    /// MADs received.
    pub received: u64,
    /// MADs handed to the QP for sending.
    pub sent: u64,
    /// Receives that completed in error or without a usable GRH.
    pub receive_errors: u64,
    /// Sends that completed in error.
    pub send_errors: u64,
    /// MADs dropped because the send backlog was full.
    pub backlog_drops: u64,
    /// Times QP1 was found in ERR and brought back up.
    pub recoveries: u64,
}

/// One device's QP1 and its buffers.
pub(crate) struct GsiAgent {
    pub context: Context,
    pub pd: ProtectionDomain,
    pub resolver: std::sync::Arc<dyn NeighbourResolver>,
    /// Node GUID (the CA GUID of REQ/REP).
    pub node_guid: u64,
    /// The device's local CA ACK delay (REP Target ACK Delay).
    pub ca_ack_delay: u8,
    /// The port's active MTU.
    pub active_mtu: Mtu,
    /// Largest RDMA READ depth of a QP (responder and initiator).
    pub max_rd_atomic: u8,
    /// The GID table: index → (GID, type).
    pub gids: Vec<Option<(Gid, GidType)>>,
    pub mac: [u8; 6],
    cq: CompletionQueue,
    qp: QueuePair,
    buffers: MemoryRegion,
    receive_slots: u32,
    send_slots: u32,
    free_send_slots: Vec<u32>,
    backlog: VecDeque<(Box<[u8; MAD_LEN]>, MadPeer)>,
    pub counters: AgentCounters,
}

impl std::fmt::Debug for GsiAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GsiAgent")
            .field("mac", &self.mac)
            .field("node_guid", &format_args!("{:#018x}", self.node_guid))
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl GsiAgent {
    /// Creates QP1 on `context`, brings it to RTS and posts every receive.
    pub fn new(
        context: &Context,
        resolver: std::sync::Arc<dyn NeighbourResolver>,
        config: &CmConfig,
    ) -> Result<Self, VerbsError> {
        let receive_slots = config.receive_buffers.clamp(8, 4096).next_power_of_two();
        let send_slots = config.send_buffers.clamp(4, 1024).next_power_of_two();
        let pd = context.alloc_pd()?;
        let cq = context.create_cq(receive_slots + send_slots, None, 0)?;
        let qp = pd.create_gsi_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: send_slots,
                max_recv_wr: receive_slots,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Ud,
            sq_sig_all: true,
        })?;
        let length = u64::from(receive_slots) * RECEIVE_SLOT + u64::from(send_slots) * MAD_LEN as u64;
        let buffers = pd.register_provider_memory(length as usize, AccessFlags::LOCAL_WRITE)?;
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qkey: GSI_QKEY,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::QKEY,
        )?;
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Rtr,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE,
        )?;
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Rts,
                sq_psn: 0,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
        )?;
        let port = context.query_port(1)?;
        let attributes = context.query_device();
        let gids = (0..port.gid_tbl_len)
            .map(|index| context.query_gid_entry(1, index).ok().flatten())
            .collect();
        let agent = Self {
            context: context.clone(),
            pd,
            resolver,
            node_guid: attributes.node_guid,
            ca_ack_delay: attributes.local_ca_ack_delay,
            active_mtu: port.active_mtu,
            max_rd_atomic: attributes.max_qp_rd_atom.min(255) as u8,
            gids,
            mac: context.mac_address(),
            cq,
            qp,
            buffers,
            receive_slots,
            send_slots,
            free_send_slots: (0..send_slots).rev().collect(),
            backlog: VecDeque::new(),
            counters: AgentCounters::default(),
        };
        for slot in 0..receive_slots {
            agent.post_receive(slot)?;
        }
        agent.cq.req_notify(false);
        Ok(agent)
    }

    fn receive_address(&self, slot: u32) -> u64 {
        self.buffers.addr() + u64::from(slot) * RECEIVE_SLOT
    }

    fn send_offset(&self, slot: u32) -> u64 {
        u64::from(self.receive_slots) * RECEIVE_SLOT + u64::from(slot) * MAD_LEN as u64
    }

    fn post_receive(&self, slot: u32) -> Result<(), VerbsError> {
        let sge = [Sge::new(
            self.receive_address(slot),
            RECEIVE_LENGTH as u32,
            self.buffers.lkey(),
        )];
        self.qp
            .post_recv(&[RecvWorkRequest {
                wr_id: u64::from(slot),
                sg_list: &sge,
            }])
            .map_err(|e| VerbsError::InvalidArgument(format!("QP1 receive: {e:?}")))
    }

    /// The GID index of `ip` in our table.
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        let gid = ip_to_gid(ip);
        self.gids
            .iter()
            .position(|entry| entry.is_some_and(|(g, _)| g == gid))
            .map(|index| index as u8)
    }

    /// Our addresses, in table order.
    pub fn addresses(&self) -> impl Iterator<Item = (u8, IpAddr)> + '_ {
        self.gids
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| entry.map(|(gid, _)| (index as u8, gid_to_ip(gid))))
    }

    /// Takes every completion: received MADs go to `out` (their buffers are posted
    /// again), finished sends free their buffers for the backlog. Re-arms the CQ.
    pub fn poll(&mut self, out: &mut Vec<ReceivedMad>) -> bool {
        let mut any = false;
        let mut completions = [WorkCompletion::default(); 32];
        loop {
            let count = match self.cq.poll(&mut completions) {
                Ok(count) => count,
                Err(error) => {
                    rnic_diag::warn!(rnic_diag::global(), crate::diag::QP1_POLL_FAILED, %error, "QP1 CQ poll failed");
                    0
                }
            };
            if count == 0 {
                break;
            }
            any = true;
            for wc in &completions[..count] {
                if wc.wr_id & SEND_WR != 0 {
                    if wc.status != WcStatus::Success {
                        self.counters.send_errors += 1;
                        rnic_diag::warn!(rnic_diag::global(), crate::diag::QP1_SEND_FAILED, status = ?wc.status, "QP1 send failed");
                    }
                    self.free_send_slots.push((wc.wr_id & 0xFFFF_FFFF) as u32);
                    continue;
                }
                let slot = (wc.wr_id as u32) & (self.receive_slots - 1);
                if let Some(mad) = self.take_receive(slot, wc) {
                    out.push(mad);
                }
                // A failed receive means QP1 went to ERR; it is rebuilt below, with every
                // receive posted again (posting to a QP in ERR would only flush again).
                if wc.status == WcStatus::Success {
                    if let Err(error) = self.post_receive(slot) {
                        rnic_diag::warn!(rnic_diag::global(), crate::diag::QP1_RECEIVE_NOT_POSTED, %error, slot, "QP1 receive could not be posted again");
                    }
                }
            }
        }
        if self.qp.state() == QpState::Err {
            self.recover();
        }
        self.flush_backlog();
        self.cq.req_notify(false);
        any
    }

    /// Brings QP1 back from ERR: RESET (which forgets its WQEs and their completions),
    /// INIT → RTR → RTS, every receive posted, every send buffer free. Linux's MAD layer
    /// leaves a QP1 in error dead; a CM that hostile input could silence is worse.
    fn recover(&mut self) {
        self.counters.recoveries += 1;
        rnic_diag::warn!(
            rnic_diag::global(),
            crate::diag::QP1_RECOVERY,
            recoveries = self.counters.recoveries,
            "QP1 was in ERR: brought back up"
        );
        let steps = [
            (
                QpAttributes {
                    qp_state: QpState::Reset,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE,
            ),
            (
                QpAttributes {
                    qp_state: QpState::Init,
                    pkey_index: 0,
                    port_num: 1,
                    qkey: GSI_QKEY,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT | QpAttributeMask::QKEY,
            ),
            (
                QpAttributes {
                    qp_state: QpState::Rtr,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE,
            ),
            (
                QpAttributes {
                    qp_state: QpState::Rts,
                    sq_psn: 0,
                    ..QpAttributes::default()
                },
                QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
            ),
        ];
        for (attributes, mask) in steps {
            if let Err(error) = self.qp.modify(&attributes, mask) {
                rnic_diag::warn!(rnic_diag::global(), crate::diag::QP1_RECOVERY, %error, "QP1 could not be brought back up");
                return;
            }
        }
        self.free_send_slots = (0..self.send_slots).rev().collect();
        for slot in 0..self.receive_slots {
            if let Err(error) = self.post_receive(slot) {
                rnic_diag::warn!(rnic_diag::global(), crate::diag::QP1_RECEIVE_NOT_POSTED, %error, slot, "QP1 receive could not be posted");
            }
        }
    }

    fn take_receive(&mut self, slot: u32, wc: &WorkCompletion) -> Option<ReceivedMad> {
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
            // A flush at teardown, or a datagram larger than a MAD (length error).
            self.counters.receive_errors += 1;
            return None;
        }
        let length = (wc.byte_len as usize).min(RECEIVE_LENGTH);
        let mut bytes = vec![0u8; length];
        if self
            .buffers
            .read(self.receive_address(slot) - self.buffers.addr(), &mut bytes)
            .is_err()
        {
            self.counters.receive_errors += 1;
            return None;
        }
        let Some((source, destination, traffic_class, flow_label)) = parse_grh(&bytes) else {
            self.counters.receive_errors += 1;
            rnic_diag::warn!(
                rnic_diag::global(),
                crate::diag::QP1_RECEIVE_WITHOUT_GRH,
                slot,
                "QP1 receive without a usable GRH slot: dropped"
            );
            return None;
        };
        let Some(sgid_index) = self.gid_index(destination) else {
            self.counters.receive_errors += 1;
            return None;
        };
        self.counters.received += 1;
        Some(ReceivedMad {
            bytes: bytes.split_off(UD_GRH_LENGTH.min(bytes.len())),
            peer: MadPeer {
                dgid: ip_to_gid(source),
                sgid_index,
                dmac: wc.smac,
                hop_limit: 64,
                traffic_class,
                flow_label,
            },
            source,
        })
    }

    /// MADs handed to [`GsiAgent::send`] whose send has not completed yet (posted to QP1
    /// or waiting in the backlog).
    pub fn sends_in_flight(&self) -> usize {
        (self.send_slots as usize).saturating_sub(self.free_send_slots.len()) + self.backlog.len()
    }

    /// Sends a MAD to `peer`'s QP1 (queued while every send buffer is in flight).
    pub fn send(&mut self, mad: &[u8; MAD_LEN], peer: MadPeer) {
        if self.backlog.len() >= SEND_BACKLOG {
            self.counters.backlog_drops += 1;
            rnic_diag::warn!(
                rnic_diag::global(),
                crate::diag::QP1_BACKLOG_FULL,
                "QP1 send backlog full: MAD dropped"
            );
            return;
        }
        self.backlog.push_back((Box::new(*mad), peer));
        self.flush_backlog();
    }

    fn flush_backlog(&mut self) {
        while !self.backlog.is_empty() {
            let Some(slot) = self.free_send_slots.pop() else {
                return;
            };
            let Some((mad, peer)) = self.backlog.pop_front() else {
                self.free_send_slots.push(slot);
                return;
            };
            if let Err(error) = self.post_send(slot, &mad, &peer) {
                self.counters.send_errors += 1;
                self.free_send_slots.push(slot);
                rnic_diag::warn!(rnic_diag::global(), crate::diag::QP1_SEND_REFUSED, %error, dgid = %peer.dgid, "QP1 send refused");
            }
        }
    }

    fn post_send(&mut self, slot: u32, mad: &[u8; MAD_LEN], peer: &MadPeer) -> Result<(), VerbsError> {
        let offset = self.send_offset(slot);
        self.buffers.write(offset, mad)?;
        let ah = self.pd.create_ah(&AhAttributes {
            dgid: peer.dgid,
            flow_label: peer.flow_label,
            sgid_index: peer.sgid_index,
            hop_limit: peer.hop_limit,
            traffic_class: peer.traffic_class,
            dmac: peer.dmac,
            ..AhAttributes::default()
        })?;
        let sge = [Sge::new(
            self.buffers.addr() + offset,
            MAD_LEN as u32,
            self.buffers.lkey(),
        )];
        self.qp
            .post_send(&[SendWorkRequest {
                wr_id: SEND_WR | u64::from(slot),
                opcode: WrOpcode::Send,
                sg_list: &sge,
                send_flags: SendFlags::SIGNALED,
                ud: Some(UdFields {
                    ah: &ah,
                    remote_qpn: GSI_QPN,
                    remote_qkey: GSI_QKEY,
                }),
                ..SendWorkRequest::default()
            }])
            .map_err(|e| VerbsError::InvalidArgument(format!("QP1 send: {e:?}")))?;
        self.counters.sent += 1;
        Ok(())
    }
}

/// The addresses in a UD receive's 40-byte GRH slot: (source, destination, traffic class,
/// flow label). IPv4 when the first 20 bytes are zero and an IPv4 header with a valid
/// checksum follows (rdma-core's rule), otherwise an IPv6 header.
fn parse_grh(bytes: &[u8]) -> Option<(IpAddr, IpAddr, u8, u32)> {
    let grh = bytes.get(..UD_GRH_LENGTH)?;
    let v4 = &grh[20..40];
    if grh[..20].iter().all(|b| *b == 0) && v4[0] == 0x45 && ipv4_checksum(v4) == 0 {
        let source = Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15]);
        let destination = Ipv4Addr::new(v4[16], v4[17], v4[18], v4[19]);
        return Some((IpAddr::V4(source), IpAddr::V4(destination), v4[1], 0));
    }
    if grh[0] >> 4 != 6 {
        return None;
    }
    let word = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
    let traffic_class = ((word >> 20) & 0xFF) as u8;
    let flow_label = word & 0xF_FFFF;
    let mut source = [0u8; 16];
    source.copy_from_slice(&grh[8..24]);
    let mut destination = [0u8; 16];
    destination.copy_from_slice(&grh[24..40]);
    Some((
        gid_to_ip(Gid(Ipv6Addr::from(source).octets())),
        gid_to_ip(Gid(Ipv6Addr::from(destination).octets())),
        traffic_class,
        flow_label,
    ))
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grh_slot_tells_ipv4_from_ipv6() {
        let mut slot = [0u8; 40];
        let header = [
            0x45, 0x00, 0x01, 0x34, 0x64, 0xbb, 0x40, 0x00, 0x40, 0x11, 0xc0, 0x35, 10, 99, 0, 2, 10, 99, 0, 1,
        ];
        slot[20..].copy_from_slice(&header);
        let (source, destination, tc, fl) = parse_grh(&slot).unwrap();
        assert_eq!(source, IpAddr::V4(Ipv4Addr::new(10, 99, 0, 2)));
        assert_eq!(destination, IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1)));
        assert_eq!((tc, fl), (0, 0));
        // A wrong checksum: not IPv4, and not IPv6 either.
        slot[30] ^= 1;
        assert_eq!(parse_grh(&slot), None);
        let mut six = [0u8; 40];
        six[0] = 0x6A;
        six[1] = 0xB1;
        six[2] = 0x23;
        six[3] = 0x45;
        six[8] = 0xfe;
        six[9] = 0x80;
        six[23] = 1;
        six[24] = 0xfe;
        six[25] = 0x80;
        six[39] = 2;
        let (source, destination, tc, fl) = parse_grh(&six).unwrap();
        assert_eq!(source, "fe80::1".parse::<IpAddr>().unwrap());
        assert_eq!(destination, "fe80::2".parse::<IpAddr>().unwrap());
        assert_eq!((tc, fl), (0xAB, 0x12345));
        assert_eq!(parse_grh(&six[..39]), None);
    }
}
