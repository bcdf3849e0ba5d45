//! The device context (`ibv_context`): opening a device, querying it, and the shared
//! state every verbs object points back to.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use rnic_firmware_if::caps::CapFlags;
use rnic_firmware_if::cmdq::GidType;
use rnic_firmware_if::context::Mtu;

use super::error::{Result, VerbsError};
use super::event::{AsyncEvent, ChannelInner};
use super::mr::MrInner;
use super::qp::QpInner;
use crate::device_access::DeviceAccess;
use crate::driver::bitmap::IndexAllocator;
use crate::driver::dma::CountingAccess;
use crate::driver::eq::EqEntry;
use crate::driver::{DeviceInfo, Driver, DriverConfig, DriverUsage};

/// The only port.
pub const PORT_NUMBER: u8 = 1;
/// Largest message the device transfers (hns: 2 GiB).
pub const MAX_MESSAGE_SIZE: u32 = 0x8000_0000;

/// A 128-bit GID (an IPv6 address for RoCEv2), network byte order.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw bytes.
    pub fn raw(&self) -> [u8; 16] {
        self.0
    }

    /// True for `::ffff:a.b.c.d`.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10..12] == [0xff, 0xff]
    }

    /// True for `fe80::/64`.
    pub fn is_link_local(&self) -> bool {
        self.0[0] == 0xfe && self.0[1] & 0xc0 == 0x80
    }

    /// The MAC a link-local GID with a modified EUI-64 interface id was derived from.
    pub fn link_local_mac(&self) -> Option<[u8; 6]> {
        let g = &self.0;
        (self.is_link_local() && g[11] == 0xff && g[12] == 0xfe)
            .then(|| [g[8] ^ 0x02, g[9], g[10], g[13], g[14], g[15]])
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl From<[u8; 16]> for Gid {
    fn from(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
}

/// `ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCapability {
    /// `IBV_ATOMIC_NONE`.
    None = 0,
    /// `IBV_ATOMIC_HCA`: atomic within this device.
    Hca = 1,
    /// `IBV_ATOMIC_GLOB`.
    Global = 2,
}

bitflags::bitflags! {
    /// `ibv_device_cap_flags` this device reports.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DeviceCapabilityFlags: u32 {
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`.
        const SYS_IMAGE_GUID = 1 << 11;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// `IBV_DEVICE_N_NOTIFY_CQ`.
        const N_NOTIFY_CQ = 1 << 14;
        /// `IBV_DEVICE_XRC`.
        const XRC = 1 << 20;
        /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`.
        const MEM_MGT_EXTENSIONS = 1 << 21;
    }
}

/// `ibv_device_attr`, field names as in ibverbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttributes {
    /// Firmware version, `major.minor.sub`.
    pub fw_ver: String,
    /// Node GUID (EUI-64 from the MAC), as a big-endian number.
    pub node_guid: u64,
    /// System image GUID (= node GUID).
    pub sys_image_guid: u64,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (bit `n` = 2^n bytes).
    pub page_size_cap: u64,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// PCI device id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// QPs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Capability flags.
    pub device_cap_flags: DeviceCapabilityFlags,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Scatter/gather entries per RDMA read.
    pub max_sge_rd: u32,
    /// CQs.
    pub max_cq: u32,
    /// Entries per CQ.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Protection domains.
    pub max_pd: u32,
    /// Outstanding RDMA reads/atomics per QP as target.
    pub max_qp_rd_atom: u32,
    /// EE contexts' read/atomic limit (no EE support: 0).
    pub max_ee_rd_atom: u32,
    /// Responder resources over all QPs.
    pub max_res_rd_atom: u32,
    /// Outstanding RDMA reads/atomics per QP as initiator.
    pub max_qp_init_rd_atom: u32,
    /// EE initiator limit (0).
    pub max_ee_init_rd_atom: u32,
    /// Atomic support.
    pub atomic_cap: AtomicCapability,
    /// EE contexts (0).
    pub max_ee: u32,
    /// RD domains (0).
    pub max_rdd: u32,
    /// Memory windows.
    pub max_mw: u32,
    /// Raw IPv6 QPs (0).
    pub max_raw_ipv6_qp: u32,
    /// Raw Ethernet QPs (0).
    pub max_raw_ethy_qp: u32,
    /// Multicast groups (0).
    pub max_mcast_grp: u32,
    /// QPs per multicast group (0).
    pub max_mcast_qp_attach: u32,
    /// Multicast attachments in total (0).
    pub max_total_mcast_qp_attach: u32,
    /// Address handles.
    pub max_ah: u32,
    /// FMRs (0).
    pub max_fmr: u32,
    /// Maps per FMR (0).
    pub max_map_per_fmr: u32,
    /// SRQs.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per SRQ work request.
    pub max_srq_sge: u32,
    /// P_Keys.
    pub max_pkeys: u16,
    /// Local CA ACK delay (IB encoding).
    pub local_ca_ack_delay: u8,
    /// Ports.
    pub phys_port_cnt: u8,
}

/// `ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// `IBV_PORT_DOWN`.
    Down = 1,
    /// `IBV_PORT_INIT`.
    Init = 2,
    /// `IBV_PORT_ARMED`.
    Armed = 3,
    /// `IBV_PORT_ACTIVE`.
    Active = 4,
}

/// `IBV_LINK_LAYER_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_INFINIBAND`.
    Infiniband = 1,
    /// `IBV_LINK_LAYER_ETHERNET`.
    Ethernet = 2,
}

/// `ibv_port_attr`, field names as in ibverbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttributes {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// `IBV_PORT_*` capability bits.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (0 on Ethernet).
    pub lid: u16,
    /// SM LID (0 on Ethernet).
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// Virtual lanes.
    pub max_vl_num: u8,
    /// SM service level.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active width (IB encoding: 2 = 4x).
    pub active_width: u8,
    /// Active speed (IB encoding: 32 = EDR).
    pub active_speed: u8,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// `IBV_PORT_CM_SUP`.
pub const PORT_CM_SUP: u32 = 1 << 16;
/// `IBV_PORT_IP_BASED_GIDS`.
pub const PORT_IP_BASED_GIDS: u32 = 1 << 26;

/// Where a CQ's completion events go.
pub(crate) struct CqRoute {
    pub(crate) channel: Option<Weak<ChannelInner>>,
    pub(crate) notifications: Arc<std::sync::atomic::AtomicU32>,
    /// Counted by the channel when it hands the event out.
    pub(crate) events: Arc<super::cq::EventCounts>,
}

/// Object-number allocators.
pub(crate) struct Allocators {
    pub(crate) pds: IndexAllocator,
    pub(crate) mrs: IndexAllocator,
    pub(crate) cqs: IndexAllocator,
    pub(crate) qps: IndexAllocator,
    pub(crate) srqs: IndexAllocator,
}

/// Everything behind the context lock.
pub(crate) struct ContextState {
    pub(crate) driver: Driver,
    pub(crate) allocators: Allocators,
    pub(crate) async_events: VecDeque<AsyncEvent>,
    pub(crate) cq_routes: HashMap<u32, CqRoute>,
    pub(crate) address_handles: u32,
    /// QP1 exists (it is numbered outside the allocator, below the reserved QPNs).
    pub(crate) gsi_qp_in_use: bool,
}

impl ContextState {
    /// Consumes every EQ entry and routes it: CEQEs to their CQ's channel, AEQEs to the
    /// asynchronous event queue.
    pub(crate) fn process_events(&mut self) {
        // The vectors themselves do not matter: every EQ is polled.
        let _ = self.driver.access().poll_interrupts();
        for entry in self.driver.poll_event_queues() {
            match entry {
                EqEntry::Completion { cqn } => match self.cq_routes.get(&cqn) {
                    Some(route) => {
                        route.notifications.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if let Some(channel) = route.channel.as_ref().and_then(Weak::upgrade) {
                            channel.push(cqn, route.events.clone());
                        }
                    }
                    None => tracing::debug!(cqn, "completion event for an unknown CQ"),
                },
                EqEntry::Async {
                    event_type,
                    sub_type,
                    queue_number,
                } => {
                    let event = AsyncEvent::from_hardware(event_type, sub_type, queue_number);
                    tracing::debug!(?event, "asynchronous event");
                    self.async_events.push_back(event);
                }
                EqEntry::MailboxCompletion { token, status, .. } => {
                    tracing::debug!(token, status, "mailbox completion event (poll mode: ignored)");
                }
            }
        }
    }
}

/// Shared by the [`Context`] and every object created from it.
pub(crate) struct ContextInner {
    pub(crate) access: Arc<CountingAccess>,
    state: Mutex<ContextState>,
    /// QPN → QP, for polling (rdma-core's `qp_table`). Apart from the context lock so the
    /// data path never waits for a mailbox command. Weak: the QP handle owns the QP.
    qps: RwLock<HashMap<u32, Weak<QpInner>>>,
    /// Key → memory region, for the CPU copy of inline data.
    mrs: RwLock<HashMap<u32, Weak<MrInner>>>,
    pub(crate) info: DeviceInfo,
    pub(crate) attributes: DeviceAttributes,
    pub(crate) completion_vectors: u32,
}

impl ContextInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ContextState> {
        // A panic while holding the lock may leave an object half-created; the driver
        // state itself stays consistent enough to tear down, so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes a QP findable by number for [`ContextInner::find_qp`].
    pub(crate) fn list_qp(&self, qp: &Arc<QpInner>) {
        write(&self.qps).insert(qp.qpn, Arc::downgrade(qp));
    }

    /// Forgets QP `qpn` if the entry is `qp` (not a newer QP with a reused number).
    pub(crate) fn unlist_qp(&self, qpn: u32, qp: &QpInner) {
        let mut qps = write(&self.qps);
        if qps.get(&qpn).is_some_and(|w| std::ptr::eq(w.as_ptr(), qp)) {
            qps.remove(&qpn);
        }
    }

    /// The live QP numbered `qpn`. Allocation-free: the poller calls it for every CQE of a
    /// QP other than the previous CQE's.
    pub(crate) fn find_qp(&self, qpn: u32) -> Option<Arc<QpInner>> {
        read(&self.qps).get(&qpn).and_then(Weak::upgrade)
    }

    /// Makes a memory region findable by key for [`ContextInner::find_mr`].
    pub(crate) fn list_mr(&self, key: u32, mr: &Arc<MrInner>) {
        write(&self.mrs).insert(key, Arc::downgrade(mr));
    }

    /// Forgets key `key` if the entry is `mr`.
    pub(crate) fn unlist_mr(&self, key: u32, mr: &MrInner) {
        let mut mrs = write(&self.mrs);
        if mrs.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), mr)) {
            mrs.remove(&key);
        }
    }

    /// The live memory region with key `key`.
    pub(crate) fn find_mr(&self, key: u32) -> Option<Arc<MrInner>> {
        read(&self.mrs).get(&key).and_then(Weak::upgrade)
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // The tables are updated in one call each; a panic elsewhere leaves them whole.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        state.driver.shut_down();
    }
}

/// An open device (`ibv_context`). Cheap to clone; every object created from it keeps it
/// alive, and the device is shut down when the last one goes.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("mac", &self.inner.info.mac)
            .field("fw_ver", &self.inner.attributes.fw_ver)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens the device behind `access` with the default [`DriverConfig`]: brings the
    /// function up (reset, command queue, capabilities, context tables, GIDs, EQs).
    ///
    /// # Errors
    /// [`VerbsError::BringUp`].
    pub fn open(access: Box<dyn DeviceAccess>) -> Result<Self> {
        Self::open_with_config(access, &DriverConfig::default())
    }

    /// As [`Context::open`] with explicit driver choices.
    ///
    /// # Errors
    /// [`VerbsError::BringUp`].
    pub fn open_with_config(access: Box<dyn DeviceAccess>, config: &DriverConfig) -> Result<Self> {
        let driver = Driver::bring_up(access, config).map_err(VerbsError::BringUp)?;
        let info = driver.info().clone();
        let caps = &info.caps;
        let allocators = Allocators {
            pds: IndexAllocator::new(caps.reserved_pds, caps.num_pds),
            mrs: IndexAllocator::new(caps.reserved_mrws.max(1), caps.num_mtpts),
            cqs: IndexAllocator::new(caps.reserved_cqs, caps.num_cqs),
            qps: IndexAllocator::round_robin(caps.reserved_qps.max(2), caps.num_qps),
            srqs: IndexAllocator::new(caps.reserved_srqs, caps.num_srqs),
        };
        let attributes = device_attributes(&info);
        let completion_vectors = driver.completion_vectors();
        let access = driver.access().clone();
        Ok(Self {
            inner: Arc::new(ContextInner {
                access,
                state: Mutex::new(ContextState {
                    driver,
                    allocators,
                    async_events: VecDeque::new(),
                    cq_routes: HashMap::new(),
                    address_handles: 0,
                    gsi_qp_in_use: false,
                }),
                qps: RwLock::new(HashMap::new()),
                mrs: RwLock::new(HashMap::new()),
                info,
                attributes,
                completion_vectors,
            }),
        })
    }

    /// Whether `other` is a handle of this same open device.
    pub fn is_same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The device's clock in nanoseconds ([`DeviceAccess::now_ns`]): virtual time for an
    /// embedded NIC.
    pub fn now_ns(&self) -> u64 {
        self.inner.access.now_ns()
    }

    /// Waits up to `timeout_ns` (device time) for any MSI-X message of the device;
    /// returns at once when the model has nothing pending that could raise one.
    pub fn wait_interrupt(&self, timeout_ns: u64) {
        let _ = self.inner.access.wait_interrupt(timeout_ns);
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttributes {
        self.inner.attributes.clone()
    }

    /// `ibv_query_port`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a port other than 1.
    pub fn query_port(&self, port_num: u8) -> Result<PortAttributes> {
        check_port(port_num)?;
        let info = &self.inner.info;
        let max_mtu = Mtu::try_from(info.caps.max_mtu).unwrap_or(Mtu::Mtu4096);
        Ok(PortAttributes {
            state: PortState::Active,
            max_mtu,
            active_mtu: max_mtu,
            gid_tbl_len: info.gids.len() as u32,
            port_cap_flags: PORT_CM_SUP | PORT_IP_BASED_GIDS,
            max_msg_sz: MAX_MESSAGE_SIZE,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: u16::from(info.caps.pkey_table_length.max(1)),
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 2,
            active_speed: 32,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
        })
    }

    /// `ibv_query_gid`: the GID at `index` (all zero for an empty entry, as ibverbs).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a bad port or an index beyond the table.
    pub fn query_gid(&self, port_num: u8, index: u32) -> Result<Gid> {
        Ok(self
            .query_gid_entry(port_num, index)?
            .map(|(gid, _)| gid)
            .unwrap_or_default())
    }

    /// The GID at `index` with its type, `None` for an empty entry (`ibv_query_gid_ex`).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a bad port or an index beyond the table.
    pub fn query_gid_entry(&self, port_num: u8, index: u32) -> Result<Option<(Gid, GidType)>> {
        check_port(port_num)?;
        let gids = &self.inner.info.gids;
        let entry = gids.get(index as usize).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("GID index {index} beyond the table of {}", gids.len()))
        })?;
        Ok(entry.map(|e| (Gid(e.gid), e.gid_type)))
    }

    /// `ibv_query_pkey`: the only P_Key is the default 0xFFFF.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a bad port or index.
    pub fn query_pkey(&self, port_num: u8, index: u16) -> Result<u16> {
        check_port(port_num)?;
        if index != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "P_Key index {index}: the table has one entry"
            )));
        }
        Ok(0xFFFF)
    }

    /// The port MAC address.
    pub fn mac_address(&self) -> [u8; 6] {
        self.inner.info.mac
    }

    /// Number of completion vectors (`num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        self.inner.completion_vectors
    }

    /// What bring-up learned (versions, caps, resources).
    pub fn device_info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// `ibv_get_async_event` without blocking: processes pending EQ entries and returns
    /// the oldest asynchronous event, if any.
    pub fn get_async_event(&self) -> Option<AsyncEvent> {
        let mut state = self.inner.lock();
        state.process_events();
        state.async_events.pop_front()
    }

    /// Consumes every pending event-queue entry: completion events go to their CQ's
    /// channel (and its notifier), asynchronous events to the queue
    /// [`Context::get_async_event`] reads. What an interrupt handler calls.
    pub fn process_events(&self) {
        self.inner.lock().process_events();
    }

    /// Waits up to `timeout_ns` (device time) for an asynchronous event. The wait is
    /// cut into slices of at most 10 ms, each ended early by any interrupt, so the total
    /// wait never exceeds the timeout.
    pub fn wait_async_event(&self, timeout_ns: u64) -> Option<AsyncEvent> {
        let mut remaining = timeout_ns;
        loop {
            if let Some(event) = self.get_async_event() {
                return Some(event);
            }
            if remaining == 0 {
                return None;
            }
            let slice = remaining.min(10_000_000);
            remaining -= slice;
            self.inner.access.wait_interrupt(slice);
        }
    }

    /// Leak counters: context-table chunks, BT pages, L0 slots, DMA held.
    pub fn usage(&self) -> DriverUsage {
        self.inner.lock().driver.usage()
    }

    /// Context-table chunks in use, all tables (0 when every object is gone).
    pub fn chunks_in_use(&self) -> usize {
        self.inner.lock().driver.chunks_in_use()
    }

    /// Object numbers in use: (PDs, MRs, CQs, QPs, SRQs).
    pub fn objects_in_use(&self) -> ObjectCounts {
        let state = self.inner.lock();
        let a = &state.allocators;
        ObjectCounts {
            protection_domains: a.pds.in_use(),
            memory_regions: a.mrs.in_use(),
            completion_queues: a.cqs.in_use(),
            queue_pairs: a.qps.in_use() + u32::from(state.gsi_qp_in_use),
            shared_receive_queues: a.srqs.in_use(),
            address_handles: state.address_handles,
        }
    }
}

/// Live objects of a context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Protection domains.
    pub protection_domains: u32,
    /// Memory regions.
    pub memory_regions: u32,
    /// Completion queues.
    pub completion_queues: u32,
    /// Queue pairs.
    pub queue_pairs: u32,
    /// Shared receive queues.
    pub shared_receive_queues: u32,
    /// Address handles.
    pub address_handles: u32,
}

pub(crate) fn check_port(port_num: u8) -> Result<()> {
    if port_num != PORT_NUMBER {
        return Err(VerbsError::InvalidArgument(format!(
            "port {port_num}: the device has one port, number 1"
        )));
    }
    Ok(())
}

fn device_attributes(info: &DeviceInfo) -> DeviceAttributes {
    let caps = &info.caps;
    let mac = info.mac;
    let guid = u64::from_be_bytes([mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]);
    let mut flags = DeviceCapabilityFlags::CURR_QP_STATE_MOD
        | DeviceCapabilityFlags::PORT_ACTIVE_EVENT
        | DeviceCapabilityFlags::SYS_IMAGE_GUID
        | DeviceCapabilityFlags::RC_RNR_NAK_GEN;
    if caps.flags.contains(CapFlags::XRC) {
        flags |= DeviceCapabilityFlags::XRC;
    }
    if caps.flags.contains(CapFlags::FRMR) {
        flags |= DeviceCapabilityFlags::MEM_MGT_EXTENSIONS;
    }
    let rd_atom = u32::from(caps.max_outstanding_reads);
    DeviceAttributes {
        fw_ver: info.firmware_version_string(),
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: u64::MAX,
        page_size_cap: u64::from(caps.page_size_cap),
        vendor_id: u32::from(info.pci_vendor_id),
        vendor_part_id: u32::from(info.pci_device_id),
        hw_ver: u32::from(info.hardware_version),
        max_qp: caps.num_qps,
        max_qp_wr: caps.max_sq_wqes.min(caps.max_rq_wqes),
        device_cap_flags: flags,
        max_sge: u32::from(caps.max_sq_sges.min(caps.max_rq_sges)),
        max_sge_rd: u32::from(caps.max_sq_sges),
        max_cq: caps.num_cqs,
        max_cqe: caps.max_cqes,
        max_mr: caps.num_mtpts,
        max_pd: caps.num_pds,
        max_qp_rd_atom: rd_atom,
        max_ee_rd_atom: 0,
        max_res_rd_atom: rd_atom.saturating_mul(caps.num_qps),
        max_qp_init_rd_atom: rd_atom,
        max_ee_init_rd_atom: 0,
        atomic_cap: if caps.flags.contains(CapFlags::ATOMIC) {
            AtomicCapability::Hca
        } else {
            AtomicCapability::None
        },
        max_ee: 0,
        max_rdd: 0,
        max_mw: if caps.flags.contains(CapFlags::MW) {
            caps.num_mtpts
        } else {
            0
        },
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: i32::MAX as u32,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: if caps.flags.contains(CapFlags::SRQ) {
            caps.num_srqs
        } else {
            0
        },
        max_srq_wr: caps.max_srq_wqes,
        max_srq_sge: u32::from(caps.max_srq_sges),
        max_pkeys: u16::from(caps.pkey_table_length.max(1)),
        local_ca_ack_delay: caps.local_ca_ack_delay,
        phys_port_cnt: caps.num_ports.max(1),
    }
}
