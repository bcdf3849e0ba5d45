//! A demo for the `rnic-emu` binary: two embedded NICs brought up side by side, one set
//! of objects on each, and their RC QPs connected to each other.
//!
//! ```
//! let report = rnic_verbs::demo::bring_up_two_nics_report().expect("demo");
//! assert!(report.contains("RTS"));
//! ```

use std::fmt::Write as _;

use crate::backend::{EmbeddedConfig, EmbeddedDevice};
use crate::verbs::{
    AccessFlags, AhAttributes, CompletionQueue, Context, Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttributeMask,
    QpAttributes, QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair, Result, SharedReceiveQueue,
    SrqAttributes,
};

/// MAC addresses of the two demo NICs (locally administered).
pub const DEMO_MACS: [[u8; 6]; 2] = [
    [0x02, 0x52, 0x4e, 0x49, 0x43, 0x01],
    [0x02, 0x52, 0x4e, 0x49, 0x43, 0x02],
];

/// One NIC with its objects.
pub struct DemoNic {
    /// The device (kept to look inside the model).
    pub device: EmbeddedDevice,
    /// The open context.
    pub context: Context,
    /// Its protection domain.
    pub pd: ProtectionDomain,
    /// A 64 KiB memory region.
    pub mr: MemoryRegion,
    /// A completion queue.
    pub cq: CompletionQueue,
    /// A shared receive queue.
    pub srq: SharedReceiveQueue,
    /// An RC queue pair on the CQ.
    pub qp: QueuePair,
}

impl DemoNic {
    /// Brings up an embedded NIC with `mac` and creates the objects.
    ///
    /// # Errors
    /// Any verb failure.
    pub fn set_up(mac: [u8; 6]) -> Result<Self> {
        let device = EmbeddedDevice::with_config(EmbeddedConfig::with_mac(mac));
        let context = Context::open(Box::new(device.clone()))?;
        let pd = context.alloc_pd()?;
        let mr = pd.register_provider_memory(
            64 * 1024,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
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
        let qp = &self.qp;
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::PKEY_INDEX
                | QpAttributeMask::PORT
                | QpAttributeMask::ACCESS_FLAGS,
        )?;
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Rtr,
                path_mtu: Mtu::Mtu4096,
                dest_qp_num: remote.qp.qp_num(),
                rq_psn: 0,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 12,
                ah_attr: AhAttributes {
                    dgid: remote.gid()?,
                    sgid_index: 0,
                    hop_limit: 64,
                    dmac: remote.context.mac_address(),
                    ..AhAttributes::default()
                },
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::AV
                | QpAttributeMask::PATH_MTU
                | QpAttributeMask::DEST_QPN
                | QpAttributeMask::RQ_PSN
                | QpAttributeMask::MAX_DEST_RD_ATOMIC
                | QpAttributeMask::MIN_RNR_TIMER,
        )?;
        qp.modify(
            &QpAttributes {
                qp_state: QpState::Rts,
                sq_psn: 0,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 16,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE
                | QpAttributeMask::SQ_PSN
                | QpAttributeMask::TIMEOUT
                | QpAttributeMask::RETRY_CNT
                | QpAttributeMask::RNR_RETRY
                | QpAttributeMask::MAX_QP_RD_ATOMIC,
        )
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

/// Brings up two NICs, creates objects on each, connects their RC QPs and returns both
/// NICs (for callers that want to go on, e.g. to post work once the data path exists).
///
/// # Errors
/// Any verb failure.
pub fn bring_up_two_nics() -> Result<[DemoNic; 2]> {
    let a = DemoNic::set_up(DEMO_MACS[0])?;
    let b = DemoNic::set_up(DEMO_MACS[1])?;
    a.connect_to(&b)?;
    b.connect_to(&a)?;
    Ok([a, b])
}

/// Runs [`bring_up_two_nics`] and describes the result: capabilities, objects with
/// their numbers and keys, and the QP states read back from the devices.
///
/// # Errors
/// Any verb failure during bring-up, object creation, connection or the queries.
pub fn bring_up_two_nics_report() -> Result<String> {
    let [a, b] = bring_up_two_nics()?;
    let mut out = String::from("rnic-emu: two embedded NICs, RC QPs connected\n\n");
    out += &a.report("NIC A")?;
    out.push('\n');
    out += &b.report("NIC B")?;
    Ok(out)
}
