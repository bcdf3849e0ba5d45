//! A device with live objects, brought up once per fuzzing process through the register
//! harness and returned to that moment before every input.
//!
//! The device (MAC [`LOCAL_MAC`], GID 0 = 10.0.0.1, GID 1 = fd00::1) has, in PD 1:
//!
//! | QP | service | talks to | CQ | receives into |
//! |---|---|---|---|---|
//! | 0x10 ↔ 0x14 | RC | each other (loopback, IPv4) | 1 | MR A |
//! | 0x11 ↔ 0x15 | RC | each other (loopback, IPv6) | 1 | SRQ 1 (0x11), MR A (0x15) |
//! | 0x12 ↔ 0x16 | UC | each other (loopback) | 1 | MR A |
//! | 0x13, 0x17 | UD | anyone with Q_Key [`QKEY`] | 3 | MR A2 |
//! | 0x19 | RC | QP 0x29 of the peer (MAC [`PEER_MAC`], 10.0.0.2) | 1 | MR A |
//!
//! QP 0x19 has a SEND, an RDMA WRITE, an RDMA READ and a FETCH_ADD outstanding (sent,
//! unacknowledged), so its completer waits for ACKs, READ responses and an atomic ACK.
//! Memory regions: A (MPT 1, every right, physical), A2 (MPT 2, every right, through a
//! PBL), B (MPT 3, local write only, named by no WQE), C (MPT 4, remote read only).
//!
//! In PD 2 lives the *victim*: RC QP 0x18 (CQ 2) connected to the peer's QP 0x28, with
//! receive WQEs into region D (MPT 5, every right). No input addresses it.
//!
//! The device sees memory through [`FuzzMemory`]'s checked view: the rings and tables are
//! granted as the driver would (WQE rings, page tables and the mailbox input read-only,
//! contexts and CQ/EQ rings read-write), regions by their rights (A, A2 read-write, C
//! read-only, B and everything of the victim not at all). [`LiveBed::finish`] checks what
//! the windows cannot: QP states, the victim's contexts, and every new CQE.

use std::sync::Arc;

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{Cqc, Mpt, QpState, Qpc, ServiceType, CQC_SIZE, MPT_SIZE, QPC_SIZE};
use rnic_firmware_if::cqe::{Cqe, CqeStatus};
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode};
use rnic_firmware_if::wqe::{Sge, SqOpcode};
use rnic_hw_model::{wire, DeviceConfig, Picoseconds};

use super::memory::{FuzzMemory, Grant, Window};
use crate::harness::{
    Access, CompletionQueue, HarnessCheckpoint, MemoryRegion, MrMode, QpSpec, QueuePair, RegisterHarness, SendRequest,
    SharedReceiveQueue, Table,
};

/// The device's MAC address.
pub const LOCAL_MAC: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x01];
/// The remote peer's MAC address.
pub const PEER_MAC: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x02];
/// The device's IPv4 address (GID 0).
pub const LOCAL_IPV4: [u8; 4] = [10, 0, 0, 1];
/// The peer's IPv4 address.
pub const PEER_IPV4: [u8; 4] = [10, 0, 0, 2];
/// The device's IPv6 GID (GID 1).
pub const LOCAL_GID_V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
/// The peer's IPv6 GID.
pub const PEER_GID_V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
/// Q_Key of the UD QPs.
pub const QKEY: u32 = 0x1111_2222;
/// The victim QP (PD 2).
pub const VICTIM_QPN: u32 = 0x18;
/// The peer QP that QP 0x19 talks to.
pub const PEER_QPN: u32 = 0x29;
/// The QP with requests outstanding at the peer.
pub const REMOTE_QPN: u32 = 0x19;
/// Size of the arena the harness allocates from.
pub const ARENA_SIZE: usize = 1 << 20;

/// Which side of the network a QP talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An RC/UC QP connected to another QP of this device.
    Loopback {
        /// The partner's QPN.
        peer: u32,
    },
    /// An RC QP connected to [`PEER_QPN`] at the peer.
    Remote,
    /// A UD QP.
    Datagram,
}

/// A QP of the bed with the host side of its rings.
#[derive(Debug, Clone)]
pub struct BedQp {
    /// The harness's record (ring heads).
    pub qp: QueuePair,
    /// Who it talks to.
    pub role: Role,
    /// Index into [`LiveBed::cqs`] of its CQ (send and receive).
    pub cq: usize,
}

/// A memory region of the bed.
#[derive(Debug, Clone, Copy)]
pub struct BedRegion {
    /// The region.
    pub region: MemoryRegion,
    /// "A", "A2", "B", "C" or "D".
    pub name: &'static str,
}

/// What a target may do to the victim (QP 0x18, CQ 2, region D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Victim {
    /// Nothing reaches it: any DMA to its memory and any change of its contexts is a
    /// violation (frames and WQEs of PD 1).
    Untouchable,
    /// It is the driver's like everything else (doorbell and register targets, where the
    /// driver may ring any of its own queues): its rings are granted as the others are.
    Owned,
    /// The driver may point the device anywhere in its memory (command-queue and mailbox
    /// targets, whose inputs carry DMA addresses): one read-write window over the arena,
    /// so the check is that DMA stays in the driver's memory or fails as unmapped.
    Anything,
}

/// The state a CQ scan starts from.
#[derive(Debug, Clone)]
struct Initial {
    qps: Vec<BedQp>,
    cqs: Vec<CompletionQueue>,
    srq: SharedReceiveQueue,
}

/// The bed: see the module documentation.
pub struct LiveBed {
    /// The harness (device and register-level driver).
    pub h: RegisterHarness,
    /// The shared arena.
    pub memory: Arc<FuzzMemory>,
    /// The QPs inputs may use (everything but the victim), in QPN order.
    pub qps: Vec<BedQp>,
    /// The victim QP.
    pub victim: BedQp,
    /// Regions A, A2, B, C, D in that order.
    pub regions: [BedRegion; 5],
    /// CQ 1 (RC/UC), CQ 2 (victim), CQ 3 (UD).
    pub cqs: Vec<CompletionQueue>,
    /// SRQ 1 (QP 0x11's receive queue).
    pub srq: SharedReceiveQueue,
    /// Frames the device transmitted during the current input.
    pub transmitted: usize,
    victim_policy: Victim,
    /// The victim's QPC, CQC and MPT bytes after bring-up.
    victim_contexts: [Vec<u8>; 3],
    tables: ContextTables,
    initial: Initial,
    snapshot: Vec<u8>,
    checkpoint: HarnessCheckpoint,
}

impl std::fmt::Debug for LiveBed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveBed")
            .field("device", &self.h.device)
            .finish_non_exhaustive()
    }
}

/// Bytes of each context-table chunk the harness allocates (hop 0).
const CHUNK: u64 = 64 << 10;

/// Where the bed's context tables are: one chunk each, at these bus addresses.
#[derive(Debug, Clone, Copy)]
struct ContextTables {
    qpc: u64,
    cqc: u64,
    mpt: u64,
}

impl ContextTables {
    fn qpc(&self, qpn: u32) -> u64 {
        self.qpc + u64::from(qpn) * QPC_SIZE as u64
    }

    /// The victim's QPC, CQC and MPT: (address, size).
    fn victim(&self) -> [(u64, usize); 3] {
        [
            (self.qpc(VICTIM_QPN), QPC_SIZE),
            (self.cqc + 2 * CQC_SIZE as u64, CQC_SIZE),
            (self.mpt + 5 * MPT_SIZE as u64, MPT_SIZE),
        ]
    }
}

/// Records the allocations of one bring-up step as a window.
struct Windows {
    list: Vec<Window>,
}

impl Windows {
    fn step<T>(
        &mut self,
        h: &mut RegisterHarness,
        name: &str,
        grant: Grant,
        f: impl FnOnce(&mut RegisterHarness) -> T,
    ) -> T {
        let start = h.next_free();
        let value = f(h);
        let end = h.next_free();
        if end > start {
            self.list.push(Window {
                start,
                end,
                grant,
                name: name.to_string(),
            });
        }
        value
    }
}

fn ipv4_gid(address: [u8; 4]) -> [u8; 16] {
    wire::ipv4_to_gid(address)
}

impl LiveBed {
    /// Brings the bed up (a few milliseconds); `victim` says what inputs may do to the
    /// victim.
    pub fn new(victim: Victim) -> Self {
        let memory = FuzzMemory::new(ARENA_SIZE);
        let mut h = RegisterHarness::with_memory(
            DeviceConfig::with_mac(LOCAL_MAC),
            memory.driver_view(),
            memory.device_view(),
            ARENA_SIZE,
        );
        let (ring, mailbox_in, mailbox_out) = h.command_buffers();
        let page = rnic_hw_model::memory::FRAME_SIZE;
        let mut w = Windows {
            list: vec![
                Window {
                    start: ring,
                    end: ring + page,
                    grant: Grant::ReadWrite,
                    name: "command ring".into(),
                },
                Window {
                    start: mailbox_in,
                    end: mailbox_in + page,
                    grant: Grant::Read,
                    name: "mailbox input".into(),
                },
                Window {
                    start: mailbox_out,
                    end: mailbox_out + page,
                    grant: Grant::Write,
                    name: "mailbox output".into(),
                },
            ],
        };
        let owned = |grant: Grant| {
            if victim == Victim::Untouchable {
                Grant::None
            } else {
                grant
            }
        };
        h.configure_tables();
        w.step(&mut h, "AEQ", Grant::ReadWrite, |h| h.create_aeq());
        h.set_gid(0, ipv4_gid(LOCAL_IPV4));
        h.set_gid(1, LOCAL_GID_V6);
        // Hop 0, one 64 KiB chunk per table: object n's context is at chunk + n × size.
        let tables = ContextTables {
            qpc: h.next_free(),
            cqc: h.next_free() + CHUNK,
            mpt: h.next_free() + 2 * CHUNK,
        };
        w.step(&mut h, "QPC table", Grant::ReadWrite, |h| {
            h.ensure_context(Table::Qpc, 0x10)
        });
        w.step(&mut h, "CQC table", Grant::ReadWrite, |h| {
            h.ensure_context(Table::Cqc, 1)
        });
        w.step(&mut h, "MPT table", Grant::ReadWrite, |h| {
            h.ensure_context(Table::Mpt, 1)
        });
        w.step(&mut h, "SRQC table", Grant::ReadWrite, |h| {
            h.ensure_context(Table::Srqc, 1)
        });
        let cq1 = w.step(&mut h, "CEQ 0 and CQ 1", Grant::ReadWrite, |h| {
            h.create_polled_cq(1, 128)
        });
        let cq2 = w.step(&mut h, "CQ 2 (victim)", owned(Grant::ReadWrite), |h| {
            h.create_polled_cq(2, 64)
        });
        let cq3 = w.step(&mut h, "CQ 3", Grant::ReadWrite, |h| h.create_polled_cq(3, 128));

        let pattern = |seed: u8| move |i: usize| (i as u8).wrapping_mul(37).wrapping_add(seed);
        let region = |h: &mut RegisterHarness,
                      w: &mut Windows,
                      name: &'static str,
                      index: u32,
                      length: usize,
                      pd: u32,
                      access: Access,
                      mode: MrMode,
                      grant: Grant| {
            let bus = w.step(h, name, grant, |h| h.allocate_filled(length, pattern(index as u8)));
            let region = w.step(h, &format!("PBL of MR {name}"), Grant::Read, |h| {
                h.register_mr(index, bus, length as u64, pd, access, mode)
            });
            BedRegion { region, name }
        };
        let remote_read_only = Access {
            local_write: false,
            remote_read: true,
            remote_write: false,
            remote_atomic: false,
        };
        let regions = [
            region(
                &mut h,
                &mut w,
                "A",
                1,
                16 << 10,
                1,
                Access::ALL,
                MrMode::Physical,
                Grant::ReadWrite,
            ),
            region(
                &mut h,
                &mut w,
                "A2",
                2,
                12 << 10,
                1,
                Access::ALL,
                MrMode::Pbl { iova: 0x7f00_0000_0000 },
                Grant::ReadWrite,
            ),
            region(
                &mut h,
                &mut w,
                "B",
                3,
                8 << 10,
                1,
                Access::LOCAL_WRITE,
                MrMode::Physical,
                Grant::None,
            ),
            region(
                &mut h,
                &mut w,
                "C",
                4,
                8 << 10,
                1,
                remote_read_only,
                MrMode::Physical,
                Grant::Read,
            ),
            region(
                &mut h,
                &mut w,
                "D",
                5,
                8 << 10,
                2,
                Access::ALL,
                MrMode::Physical,
                owned(Grant::ReadWrite),
            ),
        ];
        let srq = w.step(&mut h, "SRQ 1", Grant::Read, |h| h.create_srq(1, 1, 16, 1, 0));

        let loopback = |qpn: u32, peer: u32, service: ServiceType, ipv6: bool| {
            let mut spec = QpSpec::rc(qpn, 1, peer);
            spec.service = service;
            spec.dmac = LOCAL_MAC;
            if ipv6 {
                spec.dgid = LOCAL_GID_V6;
                spec.sgid_index = 1;
            } else {
                spec.dgid = ipv4_gid(LOCAL_IPV4);
            }
            (spec, Role::Loopback { peer })
        };
        let datagram = |qpn: u32| {
            let mut spec = QpSpec::rc(qpn, 3, 0);
            spec.service = ServiceType::Ud;
            spec.qkey = QKEY;
            (spec, Role::Datagram)
        };
        let remote = |qpn: u32, peer: u32, pd: u32, cq: u32| {
            let mut spec = QpSpec::rc(qpn, cq, peer);
            spec.pd = pd;
            spec.dmac = PEER_MAC;
            spec.dgid = ipv4_gid(PEER_IPV4);
            (spec, Role::Remote)
        };
        let mut specs = vec![
            loopback(0x10, 0x14, ServiceType::Rc, false),
            loopback(0x11, 0x15, ServiceType::Rc, true),
            loopback(0x12, 0x16, ServiceType::Uc, false),
            datagram(0x13),
            loopback(0x14, 0x10, ServiceType::Rc, false),
            loopback(0x15, 0x11, ServiceType::Rc, true),
            loopback(0x16, 0x12, ServiceType::Uc, false),
            datagram(0x17),
            remote(REMOTE_QPN, PEER_QPN, 1, 1),
        ];
        specs[1].0.srq = Some(1);
        let mut qps = Vec::new();
        for (mut spec, role) in specs {
            // Bounded retries, short timers: an input's retransmissions end in virtual
            // milliseconds, and the CQs stay small.
            spec.ack_timeout = 10;
            spec.retry_cnt = 2;
            spec.rnr_retry = 2;
            spec.min_rnr_timer = 1;
            let cq = match spec.send_cq {
                1 => 0,
                _ => 2,
            };
            let qp = w.step(&mut h, &format!("WQE buffer of QP {:#x}", spec.qpn), Grant::Read, |h| {
                h.create_qp(&spec)
            });
            qps.push(BedQp { qp, role, cq });
        }
        let (victim_spec, _) = remote(VICTIM_QPN, 0x28, 2, 2);
        let victim_qp = w.step(&mut h, "WQE buffer of QP 0x18 (victim)", owned(Grant::Read), |h| {
            h.create_qp(&victim_spec)
        });
        let mut victim_bed = BedQp {
            qp: victim_qp,
            role: Role::Remote,
            cq: 1,
        };

        // Receive buffers: 1 KiB each in A (RC/UC) or A2 (UD, SRQ).
        let [a, a2, _, _, d] = regions.map(|r| r.region);
        let mut srq = srq;
        for bed_qp in &mut qps {
            if bed_qp.qp.spec.srq.is_some() {
                continue;
            }
            let target = if bed_qp.role == Role::Datagram { a2 } else { a };
            for i in 0..8u64 {
                let sge = target.sge(((i + u64::from(bed_qp.qp.qpn)) % 12) * 1024, 1024);
                h.post_recv(&mut bed_qp.qp, &[sge]);
            }
        }
        for i in 0..8u64 {
            h.post_srq(&mut srq, &[a2.sge(i * 1024, 1024)]);
        }
        for i in 0..4u64 {
            h.post_recv(&mut victim_bed.qp, &[d.sge(i * 1024, 1024)]);
        }
        h.settle();
        // The contexts as the device sees them, queried, and the same bytes in host memory.
        let victim_contexts = [
            query_ok::<Qpc>(&mut h, MailboxOpcode::QueryQpc, VICTIM_QPN)
                .bytes()
                .to_vec(),
            query_ok::<Cqc>(&mut h, MailboxOpcode::QueryCqc, 2).bytes().to_vec(),
            query_ok::<Mpt>(&mut h, MailboxOpcode::QueryMpt, 5).bytes().to_vec(),
        ];
        for (context, (address, _)) in victim_contexts.iter().zip(tables.victim()) {
            assert_eq!(
                &memory.read_bytes(address, context.len()),
                context,
                "the context table layout"
            );
        }

        // QP 0x19's outstanding requests: the peer never answers on its own.
        let remote_qp = qps.iter_mut().find(|q| q.qp.qpn == REMOTE_QPN).expect("QP 0x19");
        let peer_rkey = 0x0029_0001;
        let requests = [
            SendRequest::new(SqOpcode::Send, vec![a.sge(0, 100)]),
            SendRequest::rdma(SqOpcode::RdmaWrite, vec![a.sge(0x100, 2000)], 0x5000_0000, peer_rkey),
            SendRequest::rdma(SqOpcode::RdmaRead, vec![a.sge(0x2000, 3000)], 0x5000_1000, peer_rkey),
            SendRequest {
                swap_add: 5,
                ..SendRequest::rdma(
                    SqOpcode::AtomFetchAndAdd,
                    vec![a.sge(0x3F00, 8)],
                    0x5000_2000,
                    peer_rkey,
                )
            },
        ];
        for request in &requests {
            h.post_send(&mut remote_qp.qp, request);
        }
        h.ring_send(&remote_qp.qp);
        let until = h.device.now() + Picoseconds::from_micros(50);
        h.device.advance_to(until);
        while let Some(frame) = h.device.poll_transmit() {
            h.device.recycle_frame(frame);
        }
        h.device.take_diagnostics();

        let cqs = vec![cq1, cq2, cq3];
        if victim == Victim::Anything {
            w.list = vec![Window {
                start: crate::harness::DMA_BASE,
                end: crate::harness::DMA_BASE + ARENA_SIZE as u64,
                grant: Grant::ReadWrite,
                name: "the driver's memory".into(),
            }];
        }
        memory.grant(w.list);
        let snapshot = memory.snapshot();
        let checkpoint = h.checkpoint();
        let initial = Initial {
            qps: qps.clone(),
            cqs: cqs.clone(),
            srq: srq.clone(),
        };
        Self {
            h,
            memory,
            qps,
            victim: victim_bed,
            regions,
            cqs,
            srq,
            transmitted: 0,
            victim_policy: victim,
            victim_contexts,
            tables,
            initial,
            snapshot,
            checkpoint,
        }
    }

    /// Returns to the moment the bed was brought up: host memory, device, driver records.
    pub fn begin(&mut self) {
        self.memory.restore(&self.snapshot);
        self.h.restore(&self.checkpoint);
        self.qps.clone_from(&self.initial.qps);
        self.cqs.clone_from(&self.initial.cqs);
        self.srq.clone_from(&self.initial.srq);
        self.transmitted = 0;
    }

    /// The region named by `index` (taken modulo 5: A, A2, B, C, D).
    pub fn region(&self, index: u8) -> MemoryRegion {
        self.regions[usize::from(index) % self.regions.len()].region
    }

    /// The QP `index` names (taken modulo the number of QPs inputs may use).
    pub fn qp_index(&self, index: u8) -> usize {
        usize::from(index) % self.qps.len()
    }

    /// Takes every frame the device transmitted; each must be a well-formed RoCEv2 frame
    /// from this port, unless the input may reprogram the port's addresses, UDP port and
    /// GID types (the command-queue and mailbox targets). Returns how many there were.
    pub fn drain_transmit(&mut self) -> usize {
        let mut count = 0;
        while let Some(frame) = self.h.device.poll_transmit() {
            count += 1;
            if self.victim_policy == Victim::Anything {
                self.h.device.recycle_frame(frame);
                continue;
            }
            match wire::parse_frame(&frame) {
                Ok(parsed) => {
                    assert_eq!(
                        parsed.repr.ethernet.source, LOCAL_MAC,
                        "a transmitted frame carries the port's MAC address"
                    );
                    let source = parsed.repr.ip.source_gid();
                    assert!(
                        source == ipv4_gid(LOCAL_IPV4) || source == LOCAL_GID_V6,
                        "a transmitted frame comes from one of the port's GIDs, not {source:02x?}"
                    );
                }
                Err(error) => panic!("the device transmitted a frame that does not parse: {error}: {frame:02x?}"),
            }
            self.h.device.recycle_frame(frame);
        }
        self.transmitted += count;
        count
    }

    /// Moves virtual time on by `span`, taking what the device transmits.
    pub fn advance(&mut self, span: Picoseconds) {
        let until = self.h.device.now() + span;
        self.h.device.advance_to(until);
        self.drain_transmit();
    }

    /// Takes the new CQEs of CQ `index` (publishing the consumer index) and checks each:
    /// a defined status, a QP that completes to this CQ.
    pub fn poll_cq(&mut self, index: usize) -> Vec<Cqe> {
        let index = index % self.cqs.len();
        let cqn = self.cqs[index].cqn;
        let cqes = self.h.poll_cq(&mut self.cqs[index]);
        for cqe in &cqes {
            assert!(
                CqeStatus::try_from(cqe.status()).is_ok(),
                "CQ {cqn}: CQE with undefined status {:#x}: {cqe:?}",
                cqe.status()
            );
            let qpn = cqe.local_qp_number();
            let owner = self
                .qps
                .iter()
                .chain(std::iter::once(&self.victim))
                .find(|q| q.qp.qpn == qpn);
            match owner {
                Some(q) => assert_eq!(
                    q.cq, index,
                    "CQ {cqn}: CQE of QP {qpn:#x}, which completes elsewhere: {cqe:?}"
                ),
                None => panic!("CQ {cqn}: CQE for QP {qpn:#x}, which does not exist: {cqe:?}"),
            }
        }
        cqes
    }

    /// The end of an input: checks that every QP is in one of `allowed` states, that the
    /// victim's contexts are as they were (when it is untouchable), and every new CQE. The
    /// device writes its cached contexts back first (as before any command), so host
    /// memory holds them as the device sees them.
    pub fn finish(&mut self, allowed: &[QpState]) {
        self.drain_transmit();
        self.h.device.write_back_contexts();
        for i in 0..self.qps.len() {
            let qpn = self.qps[i].qp.qpn;
            let qpc = Qpc::parse(&self.memory.read_bytes(self.tables.qpc(qpn), QPC_SIZE)).expect("QPC size");
            let state = qpc.qp_state();
            assert!(
                state.is_ok_and(|s| allowed.contains(&s)),
                "QP {qpn:#x} is in state {:?} ({:#x}); allowed: {allowed:?}",
                state,
                qpc.qp_state_raw()
            );
        }
        if self.victim_policy == Victim::Untouchable {
            let names = [
                "QPC of the victim QP",
                "CQC of the victim CQ",
                "MPT of the victim region",
            ];
            for ((address, size), (before, name)) in self
                .tables
                .victim()
                .into_iter()
                .zip(self.victim_contexts.iter().zip(names))
            {
                assert!(self.memory.read_bytes(address, size) == *before, "the {name} changed");
            }
        }
        for index in 0..self.cqs.len() {
            self.poll_cq(index);
        }
        self.drain_transmit();
    }

    /// An SGE of `length` bytes at `offset` into region `index` (modulo 5), not checked
    /// against the region's length.
    pub fn sge(&self, index: u8, offset: u64, length: u32) -> Sge {
        let region = self.region(index);
        Sge::new(length, region.key, region.iova.wrapping_add(offset))
    }
}

/// A query that must succeed (the bed's own objects always exist).
fn query_ok<L: Layout>(h: &mut RegisterHarness, opcode: MailboxOpcode, tag: u32) -> L {
    let (status, context) = h.query::<L>(opcode, tag);
    assert_eq!(status, MailboxCompletion::Success, "{opcode:?} {tag:#x}");
    context
}
