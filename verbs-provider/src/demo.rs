//! A demo for the `rnic-emu` binary: two embedded NICs on one fabric, one set of objects
//! on each, their RC QPs connected to each other, then real traffic between them —
//! RDMA WRITEs, SENDs, RDMA READs and atomics, every byte checked.
//!
//! ```
//! let report = rnic_verbs::demo::bring_up_two_nics_report().expect("demo");
//! assert!(report.contains("RTS"));
//! ```

use std::fmt::Write as _;

use rnic_hw_model::time::Picoseconds;

use crate::backend::{EmbeddedConfig, EmbeddedDevice, EmbeddedFabric, FabricStatistics};
use crate::device_access::DeviceAccess;
use crate::verbs::{
    AccessFlags, AhAttributes, AtomicFields, CompletionQueue, Context, Gid, MemoryRegion, Mtu, ProtectionDomain,
    QpCapabilities, QpInitAttributes, QpType, QueuePair, RcConnection, RdmaFields, RecvWorkRequest, Result, SendFlags,
    SendWorkRequest, Sge, SharedReceiveQueue, SrqAttributes, VerbsError, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

/// MAC addresses of the two demo NICs (locally administered).
pub const DEMO_MACS: [[u8; 6]; 2] = [
    [0x02, 0x52, 0x4e, 0x49, 0x43, 0x01],
    [0x02, 0x52, 0x4e, 0x49, 0x43, 0x02],
];

/// Size of each demo NIC's memory region.
pub const DEMO_MR_SIZE: usize = 8 << 20;

/// One NIC with its objects.
pub struct DemoNic {
    /// The device (kept to look inside the model and at the fabric).
    pub device: EmbeddedDevice,
    /// The open context.
    pub context: Context,
    /// Its protection domain.
    pub pd: ProtectionDomain,
    /// A memory region of [`DEMO_MR_SIZE`] bytes, open to remote reads, writes and
    /// atomics.
    pub mr: MemoryRegion,
    /// A completion queue.
    pub cq: CompletionQueue,
    /// A shared receive queue.
    pub srq: SharedReceiveQueue,
    /// An RC queue pair on the CQ.
    pub qp: QueuePair,
}

impl DemoNic {
    /// Brings up an embedded NIC with `mac`, alone on a fabric, and creates the objects.
    ///
    /// # Errors
    /// Any verb failure.
    pub fn set_up(mac: [u8; 6]) -> Result<Self> {
        Self::set_up_on(&EmbeddedFabric::default(), mac)
    }

    /// Plugs an embedded NIC with `mac` into `fabric`, brings it up and creates the
    /// objects.
    ///
    /// # Errors
    /// Any verb failure.
    pub fn set_up_on(fabric: &EmbeddedFabric, mac: [u8; 6]) -> Result<Self> {
        let device = fabric.add_nic_with_config(EmbeddedConfig::with_mac(mac));
        let context = Context::open(Box::new(device.clone()))?;
        let pd = context.alloc_pd()?;
        let mr = pd.register_provider_memory(
            DEMO_MR_SIZE,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )?;
        let cq = context.create_cq(256, None, 0)?;
        let srq = pd.create_srq(&SrqAttributes {
            max_wr: 256,
            max_sge: 2,
            srq_limit: 16,
        })?;
        let qp = pd.create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })?;
        Ok(Self {
            device,
            context,
            pd,
            mr,
            cq,
            srq,
            qp,
        })
    }

    /// GID 0 of the port.
    ///
    /// # Errors
    /// Never in practice (index 0 always exists).
    pub fn gid(&self) -> Result<Gid> {
        self.context.query_gid(1, 0)
    }

    /// Moves this NIC's QP to RTS towards `remote`'s QP (RESET→INIT→RTR→RTS).
    ///
    /// # Errors
    /// Any verb failure.
    pub fn connect_to(&self, remote: &DemoNic) -> Result<()> {
        self.qp.connect_rc(&RcConnection {
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: remote.qp.qp_num(),
            rq_psn: 0,
            sq_psn: 0,
            ah_attr: AhAttributes {
                dgid: remote.gid()?,
                sgid_index: 0,
                hop_limit: 64,
                dmac: remote.context.mac_address(),
                ..AhAttributes::default()
            },
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        })
    }

    /// A readable description of the NIC and its objects, QP attributes read back from
    /// the device.
    ///
    /// # Errors
    /// Any query failure.
    pub fn report(&self, name: &str) -> Result<String> {
        let mut out = String::new();
        let device = self.context.query_device();
        let port = self.context.query_port(1)?;
        let info = self.context.device_info();
        let mac = self.context.mac_address();
        let _ = writeln!(
            out,
            "{name}: MAC {}",
            mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
        );
        let _ = writeln!(
            out,
            "  firmware {}  hardware {:#x}  PCI {:04x}:{:04x}",
            device.fw_ver, device.hw_ver, device.vendor_id, device.vendor_part_id
        );
        let _ = writeln!(
            out,
            "  max QP {}  CQ {}  MR {}  SRQ {}  PD {}",
            device.max_qp, device.max_cq, device.max_mr, device.max_srq, device.max_pd
        );
        let _ = writeln!(
            out,
            "  max WR {}  SGE {}  CQE {}  SRQ WR {}  rd_atom {}  atomic {:?}",
            device.max_qp_wr,
            device.max_sge,
            device.max_cqe,
            device.max_srq_wr,
            device.max_qp_rd_atom,
            device.atomic_cap
        );
        let _ = writeln!(
            out,
            "  port 1 {:?}, {:?}, MTU {}, {} GIDs, {} completion vectors",
            port.state,
            port.link_layer,
            port.active_mtu.bytes(),
            port.gid_tbl_len,
            self.context.num_comp_vectors()
        );
        let _ = writeln!(out, "  GID 0 {}", self.gid()?);
        let _ = writeln!(
            out,
            "  context tables: {} QPC / {} MPT / {} CQC / {} SRQC L0 slots",
            info.resources.qpc_bt_count,
            info.resources.mpt_bt_count,
            info.resources.cqc_bt_count,
            info.resources.srqc_bt_count
        );
        let _ = writeln!(out, "  PD {}", self.pd.pd_number());
        let _ = writeln!(
            out,
            "  MR index {}  lkey {:#010x}  rkey {:#010x}  iova {:#x}  {} bytes in {} KiB pages, hop {}",
            self.mr.mpt_index(),
            self.mr.lkey(),
            self.mr.rkey(),
            self.mr.addr(),
            self.mr.length(),
            (1u64 << self.mr.page_shift()) / 1024,
            self.mr.hop()
        );
        let cq = self.cq.query()?;
        let _ = writeln!(
            out,
            "  CQ {}  {} CQEs  vector {}  {:?}",
            cq.cq_number, cq.cqe, cq.comp_vector, cq.state
        );
        let srq = self.srq.query()?;
        let _ = writeln!(
            out,
            "  SRQ {}  {} WRs  {} SGEs  limit {}",
            self.srq.srq_number(),
            srq.max_wr,
            srq.max_sge,
            srq.srq_limit
        );
        let qp = self.qp.query()?;
        let _ = writeln!(
            out,
            "  QP {} (RC)  state {}  → QP {} at {}  MTU {}  sq_psn {}  rq_psn {}  timeout {}  retry {}/{}",
            self.qp.qp_num(),
            qp.qp_state,
            qp.dest_qp_num,
            qp.ah_attr.dgid,
            qp.path_mtu.bytes(),
            qp.sq_psn,
            qp.rq_psn,
            qp.timeout,
            qp.retry_cnt,
            qp.rnr_retry
        );
        let usage = self.context.usage();
        let _ = writeln!(
            out,
            "  driver: {} cmdq commands, {} mailbox commands, {} context chunks, {} DMA buffers",
            usage.commands, usage.mailbox_commands, usage.context_chunks, usage.dma.buffers
        );
        Ok(out)
    }
}

/// Brings up two NICs on one fabric, creates objects on each, connects their RC QPs and
/// returns both NICs (the fabric is `nic.device.fabric()`).
///
/// # Errors
/// Any verb failure.
pub fn bring_up_two_nics() -> Result<[DemoNic; 2]> {
    let fabric = EmbeddedFabric::default();
    let a = DemoNic::set_up_on(&fabric, DEMO_MACS[0])?;
    let b = DemoNic::set_up_on(&fabric, DEMO_MACS[1])?;
    a.connect_to(&b)?;
    b.connect_to(&a)?;
    Ok([a, b])
}

/// Runs [`bring_up_two_nics`], moves [`run_traffic`] between them and describes the
/// result: capabilities, objects with their numbers and keys, the QP states read back
/// from the devices, and what moved.
///
/// # Errors
/// Any verb failure during bring-up, object creation, connection, traffic (a completion
/// error, a byte that did not arrive, a timeout) or the queries.
pub fn bring_up_two_nics_report() -> Result<String> {
    let [a, b] = bring_up_two_nics()?;
    let mut out = String::from("rnic-emu: two embedded NICs on one fabric, RC QPs connected\n\n");
    out += &a.report("NIC A")?;
    out.push('\n');
    out += &b.report("NIC B")?;
    out.push('\n');
    out += &run_traffic(&a, &b)?.to_string();
    Ok(out)
}

/// What [`run_traffic`] moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrafficReport {
    /// RDMA WRITEs and their bytes.
    pub writes: (u32, u64),
    /// SENDs and their bytes.
    pub sends: (u32, u64),
    /// RDMA READs and their bytes.
    pub reads: (u32, u64),
    /// Atomics (fetch-and-add and compare-and-swap).
    pub atomics: u32,
    /// The fabric's counters over the run.
    pub fabric: FabricStatistics,
    /// Virtual time the traffic took.
    pub elapsed: Picoseconds,
}

impl std::fmt::Display for TrafficReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.writes.1 + self.sends.1 + self.reads.1 + 8 * u64::from(self.atomics);
        let ns = self.elapsed.as_nanos().max(1);
        writeln!(f, "traffic A → B (every byte checked):")?;
        writeln!(
            f,
            "  RDMA WRITE  {:4} messages  {:>10} bytes",
            self.writes.0, self.writes.1
        )?;
        writeln!(
            f,
            "  SEND/RECV   {:4} messages  {:>10} bytes",
            self.sends.0, self.sends.1
        )?;
        writeln!(
            f,
            "  RDMA READ   {:4} messages  {:>10} bytes",
            self.reads.0, self.reads.1
        )?;
        writeln!(
            f,
            "  atomics     {:4} messages  {:>10} bytes",
            self.atomics,
            8 * self.atomics
        )?;
        writeln!(
            f,
            "  fabric: {} frames sent, {} delivered, {} dropped",
            self.fabric.sent, self.fabric.delivered, self.fabric.dropped
        )?;
        writeln!(
            f,
            "  virtual time {:.3} µs, {:.2} Gb/s of payload",
            self.elapsed.0 as f64 / 1e6,
            bytes as f64 * 8.0 / ns as f64
        )
    }
}

/// Regions of the demo MR: WRITE payloads, SEND buffers, READ sources/targets, atomics.
const WRITE_REGION: u64 = 0;
const SEND_REGION: u64 = 4 << 20;
const READ_REGION: u64 = 5 << 20;
const ATOMIC_REGION: u64 = 7 << 20;
/// Message counts and sizes.
const WRITES: u32 = 64;
const WRITE_SIZE: u32 = 64 * 1024;
const SENDS: u32 = 64;
const SEND_SIZE: u32 = 4096;
const READS: u32 = 16;
const READ_SIZE: u32 = 64 * 1024;
const ATOMICS: u32 = 64;
/// How long the demo waits for one batch of completions, in virtual time.
const BATCH_TIMEOUT_NS: u64 = 1_000_000_000;

/// The byte at `offset` of the data the demo moves (differs per direction and region).
fn pattern(seed: u64, offset: u64) -> u8 {
    (offset.wrapping_mul(31).wrapping_add(seed) ^ (offset >> 9)) as u8
}

fn fill(mr: &MemoryRegion, offset: u64, length: u64, seed: u64) -> Result<()> {
    let bytes: Vec<u8> = (offset..offset + length).map(|o| pattern(seed, o)).collect();
    mr.write(offset, &bytes)
}

fn check(mr: &MemoryRegion, offset: u64, length: u64, seed: u64, what: &str) -> Result<()> {
    let mut bytes = vec![0u8; length as usize];
    mr.read(offset, &mut bytes)?;
    match (offset..offset + length)
        .zip(&bytes)
        .find(|(o, b)| pattern(seed, *o) != **b)
    {
        None => Ok(()),
        Some((o, b)) => Err(VerbsError::InvalidArgument(format!(
            "{what}: byte {o:#x} is {b:#04x}, expected {:#04x}",
            pattern(seed, o)
        ))),
    }
}

/// Polls `cq` until `count` completions arrived, letting virtual time pass between
/// empty polls; every one must be a success of `opcode`.
fn wait_for(nic: &DemoNic, count: usize, opcode: WcOpcode) -> Result<Vec<WorkCompletion>> {
    let mut out = vec![WorkCompletion::default(); count];
    let mut got = 0;
    let deadline = nic.device.now() + Picoseconds::from_nanos(BATCH_TIMEOUT_NS);
    while got < count {
        got += nic.cq.poll(&mut out[got..])?;
        if got < count {
            if nic.device.now() > deadline {
                return Err(VerbsError::TimedOut(format!(
                    "{got} of {count} {opcode:?} completions on CQ {}",
                    nic.cq.cq_number()
                )));
            }
            nic.device.delay(1_000);
        }
    }
    if let Some(bad) = out
        .iter()
        .find(|wc| wc.status != WcStatus::Success || wc.opcode != opcode)
    {
        return Err(VerbsError::Completion {
            wr_id: bad.wr_id,
            status: bad.status,
        });
    }
    Ok(out)
}

fn posted<T>(result: std::result::Result<T, crate::verbs::PostError>) -> Result<T> {
    result.map_err(|e| VerbsError::InvalidArgument(format!("post: {e}")))
}

/// Moves real traffic from `a` to `b` over their connected RC QPs and checks every byte:
/// 64 RDMA WRITEs of 64 KiB, 64 SENDs of 4 KiB into posted receives, 16 RDMA READs of
/// 64 KiB, 64 fetch-and-adds and a compare-and-swap.
///
/// # Errors
/// A post refused, a completion error or timeout, or data that did not arrive intact.
pub fn run_traffic(a: &DemoNic, b: &DemoNic) -> Result<TrafficReport> {
    let fabric = a.device.fabric();
    let start = fabric.now();
    let before = fabric.statistics();
    let (lkey, rkey) = (a.mr.lkey(), b.mr.rkey());
    let (local, remote) = (a.mr.addr(), b.mr.addr());

    // RDMA WRITE: A's region → B's region.
    fill(&a.mr, WRITE_REGION, u64::from(WRITES * WRITE_SIZE), 1)?;
    let sges: Vec<[Sge; 1]> = (0..WRITES)
        .map(|i| {
            [Sge::new(
                local + WRITE_REGION + u64::from(i * WRITE_SIZE),
                WRITE_SIZE,
                lkey,
            )]
        })
        .collect();
    let wrs: Vec<SendWorkRequest<'_>> = (0..WRITES as usize)
        .map(|i| SendWorkRequest {
            wr_id: i as u64,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sges[i],
            send_flags: SendFlags::SIGNALED,
            rdma: RdmaFields {
                remote_addr: remote + WRITE_REGION + (i as u64) * u64::from(WRITE_SIZE),
                rkey,
            },
            ..Default::default()
        })
        .collect();
    posted(a.qp.post_send(&wrs))?;
    wait_for(a, WRITES as usize, WcOpcode::RdmaWrite)?;
    check(&b.mr, WRITE_REGION, u64::from(WRITES * WRITE_SIZE), 1, "RDMA WRITE")?;

    // SEND: into B's posted receives.
    fill(&a.mr, SEND_REGION, u64::from(SENDS * SEND_SIZE), 2)?;
    let at =
        |mr: &MemoryRegion, i: u32| Sge::new(mr.addr() + SEND_REGION + u64::from(i * SEND_SIZE), SEND_SIZE, mr.lkey());
    let recv_sges: Vec<[Sge; 1]> = (0..SENDS).map(|i| [at(&b.mr, i)]).collect();
    let recvs: Vec<RecvWorkRequest<'_>> = recv_sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| RecvWorkRequest {
            wr_id: 1000 + i as u64,
            sg_list,
        })
        .collect();
    posted(b.qp.post_recv(&recvs))?;
    let send_sges: Vec<[Sge; 1]> = (0..SENDS).map(|i| [at(&a.mr, i)]).collect();
    let sends: Vec<SendWorkRequest<'_>> = send_sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| SendWorkRequest {
            wr_id: 2000 + i as u64,
            sg_list,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        })
        .collect();
    posted(a.qp.post_send(&sends))?;
    wait_for(a, SENDS as usize, WcOpcode::Send)?;
    let received = wait_for(b, SENDS as usize, WcOpcode::Recv)?;
    if let Some(wc) = received.iter().find(|wc| wc.byte_len != SEND_SIZE) {
        return Err(VerbsError::InvalidArgument(format!(
            "a receive of {} bytes",
            wc.byte_len
        )));
    }
    check(&b.mr, SEND_REGION, u64::from(SENDS * SEND_SIZE), 2, "SEND")?;

    // RDMA READ: B's region → A's region.
    fill(&b.mr, READ_REGION, u64::from(READS * READ_SIZE), 3)?;
    let read_sges: Vec<[Sge; 1]> = (0..READS)
        .map(|i| {
            [Sge::new(
                local + READ_REGION + u64::from(i * READ_SIZE),
                READ_SIZE,
                lkey,
            )]
        })
        .collect();
    let reads: Vec<SendWorkRequest<'_>> = read_sges
        .iter()
        .enumerate()
        .map(|(i, sg_list)| SendWorkRequest {
            wr_id: 3000 + i as u64,
            opcode: WrOpcode::RdmaRead,
            sg_list,
            send_flags: SendFlags::SIGNALED,
            rdma: RdmaFields {
                remote_addr: remote + READ_REGION + (i as u64) * u64::from(READ_SIZE),
                rkey,
            },
            ..Default::default()
        })
        .collect();
    posted(a.qp.post_send(&reads))?;
    wait_for(a, READS as usize, WcOpcode::RdmaRead)?;
    check(&a.mr, READ_REGION, u64::from(READS * READ_SIZE), 3, "RDMA READ")?;

    // Atomics: 63 fetch-and-adds of 1..=63 on B's counter, then a compare-and-swap.
    b.mr.write(ATOMIC_REGION, &1000u64.to_le_bytes())?;
    let results: Vec<[Sge; 1]> = (0..ATOMICS)
        .map(|i| [Sge::new(local + ATOMIC_REGION + u64::from(i) * 8, 8, lkey)])
        .collect();
    let atomics: Vec<SendWorkRequest<'_>> = results
        .iter()
        .enumerate()
        .map(|(i, sg_list)| {
            let last = i as u32 == ATOMICS - 1;
            // The counter before atomic i: 1000 plus the addends 1..=i before it.
            let expected_before = 1000 + (1..=i as u64).sum::<u64>();
            SendWorkRequest {
                wr_id: 4000 + i as u64,
                opcode: if last {
                    WrOpcode::AtomicCmpSwp
                } else {
                    WrOpcode::AtomicFetchAdd
                },
                sg_list,
                send_flags: SendFlags::SIGNALED,
                atomic: AtomicFields {
                    remote_addr: remote + ATOMIC_REGION,
                    compare_add: if last { expected_before } else { i as u64 + 1 },
                    swap: 0xC0FFEE,
                    rkey,
                },
                ..Default::default()
            }
        })
        .collect();
    posted(a.qp.post_send(&atomics[..ATOMICS as usize - 1]))?;
    wait_for(a, ATOMICS as usize - 1, WcOpcode::FetchAdd)?;
    posted(a.qp.post_send(&atomics[ATOMICS as usize - 1..]))?;
    wait_for(a, 1, WcOpcode::CompSwap)?;
    let mut value = [0u8; 8];
    b.mr.read(ATOMIC_REGION, &mut value)?;
    let mut counter = 1000u64;
    for i in 0..u64::from(ATOMICS) {
        let mut old = [0u8; 8];
        a.mr.read(ATOMIC_REGION + i * 8, &mut old)?;
        if u64::from_le_bytes(old) != counter {
            return Err(VerbsError::InvalidArgument(format!(
                "atomic {i} returned {}, expected {counter}",
                u64::from_le_bytes(old)
            )));
        }
        counter = if i + 1 == u64::from(ATOMICS) {
            0xC0FFEE
        } else {
            counter + i + 1
        };
    }
    if u64::from_le_bytes(value) != 0xC0FFEE {
        return Err(VerbsError::InvalidArgument(format!(
            "the counter ended at {:#x}, expected 0xc0ffee",
            u64::from_le_bytes(value)
        )));
    }

    let after = fabric.statistics();
    Ok(TrafficReport {
        writes: (WRITES, u64::from(WRITES * WRITE_SIZE)),
        sends: (SENDS, u64::from(SENDS * SEND_SIZE)),
        reads: (READS, u64::from(READS * READ_SIZE)),
        atomics: ATOMICS,
        fabric: FabricStatistics {
            sent: after.sent - before.sent,
            delivered: after.delivered - before.delivered,
            dropped: after.dropped - before.dropped,
            duplicated: after.duplicated - before.duplicated,
            reordered: after.reordered - before.reordered,
            corrupted: after.corrupted - before.corrupted,
            delayed: after.delayed - before.delayed,
            undeliverable: after.undeliverable - before.undeliverable,
        },
        elapsed: Picoseconds(fabric.now().0 - start.0),
    })
}
