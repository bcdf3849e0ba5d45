#![allow(missing_docs)] // The wrappers are the C objects of verbs.h plus our handle; verbs.h documents them.
//! The exported control path: devices, contexts, PDs, MRs, CQs, channels, QPs, SRQs, AHs,
//! events, and the `verbs_context` ops the inline functions of `verbs.h` call.
//!
//! Every C object is a Box of ours with the public struct at offset 0 (so the pointer the
//! application holds is the pointer to our wrapper), followed by the Rust object.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::offset_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::{null_mut, NonNull};
use std::sync::{Arc, Mutex, Weak};

use rnic_verbs::{
    AccessFlags, AddressHandle, AhAttributes, AsyncEventElement, AsyncEventKind, CompletionChannel, CompletionQueue,
    Gid, MemoryRegion, Mtu, ProtectionDomain, QpAttributeMask, QpAttributes, QpCapabilities, QpInitAttributes, QpState,
    QpType, QueuePair, SharedReceiveQueue, SrqAttributeMask, SrqAttributes, VerbsError,
};

use crate::abi::*;
use crate::device::{self, Backend, OpenDevice};
use crate::{diag, guard, set_errno};

// ---- object wrappers ----------------------------------------------------------------------

/// An `ibv_context`: the `verbs_context` (whose `context` member is what the application
/// holds) and our state.
#[repr(C)]
pub struct Ctx {
    pub vctx: verbs_context,
    pub open: Arc<OpenDevice>,
    async_read: OwnedFd,
    async_write: OwnedFd,
    async_events: Mutex<VecDeque<(usize, c_int)>>,
}

#[repr(C)]
pub struct Pd {
    pub base: ibv_pd,
    pub pd: Option<ProtectionDomain>,
}

impl Pd {
    /// The live PD (None once deallocated, which the application may not use after).
    fn live(&self) -> Option<&ProtectionDomain> {
        self.pd.as_ref()
    }
}

#[repr(C)]
pub struct Mr {
    pub base: ibv_mr,
    pub mr: Option<MemoryRegion>,
}

#[repr(C)]
pub struct Channel {
    pub base: ibv_comp_channel,
    pub channel: CompletionChannel,
    write: Arc<OwnedFd>,
    read: OwnedFd,
}

#[repr(C)]
pub struct Cq {
    pub base: ibv_cq,
    pub cq: Option<CompletionQueue>,
}

#[repr(C)]
pub struct Srq {
    pub base: ibv_srq,
    pub srq: Option<SharedReceiveQueue>,
}

#[repr(C)]
pub struct Qp {
    pub base: ibv_qp,
    /// Shared with the connection manager for QPs `rdma_create_qp` made.
    pub qp: Option<Arc<QueuePair>>,
    /// Where inline payloads are staged for the driver's CPU copy (an application's
    /// inline buffer needs no registration).
    pub bounce: Option<Mutex<MemoryRegion>>,
    pub max_inline: u32,
    /// The rdma_cm id whose QP this is (`rdma_create_qp`), as an address.
    pub cm_owner: usize,
    /// What `rdma_create_qp` made for the QP's id (CQs, their channels, a PD) when the id
    /// was destroyed before the QP: released after the QP, by `ibv_destroy_qp`.
    pub cm_leftovers: Option<CmLeftovers>,
}

/// Objects `rdma_create_qp` made for an id whose QP outlived it (`rdma_destroy_id` before
/// `ibv_destroy_qp`, as rping's server does). Null members are absent.
pub struct CmLeftovers {
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub send_channel: *mut ibv_comp_channel,
    pub recv_channel: *mut ibv_comp_channel,
    pub pd: *mut ibv_pd,
}

impl CmLeftovers {
    /// Destroys the CQs, then their channels, then the PD.
    ///
    /// # Safety
    /// The members are null or live objects of this library nothing else uses any more.
    pub unsafe fn release(self) {
        // SAFETY: the caller's promise; each call accepts a live object of ours.
        unsafe {
            for cq in [self.send_cq, self.recv_cq] {
                if !cq.is_null() {
                    ibv_destroy_cq(cq);
                }
            }
            for channel in [self.send_channel, self.recv_channel] {
                if !channel.is_null() {
                    ibv_destroy_comp_channel(channel);
                }
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
        }
    }
}

#[repr(C)]
pub struct Ah {
    pub base: ibv_ah,
    pub ah: Option<AddressHandle>,
}

/// C objects by number, for completion and asynchronous events: (wrapper address, owning
/// context address).
#[derive(Default)]
pub struct ObjectTable {
    pub cqs: HashMap<u32, (usize, usize)>,
    pub qps: HashMap<u32, (usize, usize)>,
    pub srqs: HashMap<u32, (usize, usize)>,
}

/// The wrapper of a context pointer.
///
/// # Safety
/// `context` must be a context this library returned and not yet closed.
pub unsafe fn ctx_of<'a>(context: *mut ibv_context) -> Option<&'a Ctx> {
    let context = NonNull::new(context)?;
    // SAFETY: the caller promises `context` is the `context` member of a `Ctx`'s
    // `verbs_context`, which sits at offset 0 of the `Ctx`.
    Some(unsafe {
        &*(context
            .as_ptr()
            .cast::<u8>()
            .sub(offset_of!(verbs_context, context))
            .cast::<Ctx>())
    })
}

/// # Safety
/// `pointer` is null or a live wrapper of type `T` returned by this library.
unsafe fn wrapper<'a, T>(pointer: *mut c_void) -> Option<&'a mut T> {
    // SAFETY: the caller's promise.
    unsafe { pointer.cast::<T>().as_mut() }
}

fn errno_of(error: &VerbsError) -> i32 {
    error.errno()
}

/// Fails a pointer-returning call: errno, diagnostic, NULL.
fn fail_null<T>(verb: &str, errno: i32, why: impl std::fmt::Display) -> *mut T {
    diag!("{verb}: {why}");
    set_errno(errno);
    null_mut()
}

/// Fails an int-returning call that returns errno values.
fn fail_value(verb: &str, errno: i32, why: impl std::fmt::Display) -> c_int {
    diag!("{verb}: {why}");
    errno
}

// ---- events ----------------------------------------------------------------------------------

/// Consumes pending EQ entries and queues asynchronous events on the contexts that own
/// their objects (called on the progress thread, or by the event poller).
pub fn process_events(open: &OpenDevice) {
    open.context.process_events();
    while let Some(event) = open.context.get_async_event() {
        let event_type = match event.event_type {
            AsyncEventKind::CqError => 0,
            AsyncEventKind::QpFatal => 1,
            AsyncEventKind::QpRequestError => 2,
            AsyncEventKind::QpAccessError => 3,
            AsyncEventKind::CommunicationEstablished => 4,
            AsyncEventKind::SqDrained => 5,
            AsyncEventKind::PathMigrated => 6,
            AsyncEventKind::PathMigrationError => 7,
            AsyncEventKind::DeviceFatal => 8,
            AsyncEventKind::PortChange => 9,
            AsyncEventKind::SrqError => 14,
            AsyncEventKind::SrqLimitReached => 15,
            AsyncEventKind::QpLastWqeReached => 16,
            AsyncEventKind::Unknown => continue,
        };
        let objects = open.objects.lock().unwrap_or_else(|e| e.into_inner());
        let target = match event.element {
            AsyncEventElement::Qp(n) => objects.qps.get(&n).copied(),
            AsyncEventElement::Cq(n) => objects.cqs.get(&n).copied(),
            AsyncEventElement::Srq(n) => objects.srqs.get(&n).copied(),
            AsyncEventElement::Port(_) | AsyncEventElement::Device => None,
        };
        drop(objects);
        let contexts = open.contexts.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for context in contexts {
            let (element, wanted) = match (event.element, target) {
                (AsyncEventElement::Port(port), _) => (usize::from(port), true),
                (AsyncEventElement::Device, _) => (0, true),
                (_, Some((object, owner))) => (object, owner == context),
                (_, None) => (0, false),
            };
            if !wanted {
                continue;
            }
            // SAFETY: contexts in the list are live (removed before they are freed).
            let Some(ctx) = (unsafe { ctx_of(context as *mut ibv_context) }) else {
                continue;
            };
            ctx.async_events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back((element, event_type));
            write_byte(ctx.async_write.as_raw_fd());
        }
    }
}

/// For backends without an interrupt handler (pci, vfio-user): processes events every
/// millisecond while the device is open, so completion channels still wake up.
pub fn start_event_poller(open: Weak<OpenDevice>) {
    // Signals blocked: the application's process-directed signals are its own.
    let spawned =
        rnic_os::spawn_with_signals_blocked(std::thread::Builder::new().name("rnic-events".into()), move || loop {
            match open.upgrade() {
                Some(open) => process_events(&open),
                None => return,
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        });
    if let Err(e) = spawned {
        diag!("cannot start the event thread ({e}): completion channels will not wake up");
    }
}

fn write_byte(fd: c_int) {
    let byte = 1u8;
    // SAFETY: writes one byte from a live local to a descriptor we own (non-blocking; a
    // full pipe means the reader is far behind and already has wake-ups pending).
    let _ = unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
}

/// Reads one wake-up byte, honouring the descriptor's blocking mode. A signal that
/// interrupts the wait ends it with `EINTR`, as rdma-core's plain `read(2)` does:
/// applications rely on that to leave a blocking `ibv_get_cq_event` when a timer fires
/// (qperf's event mode ends each test that way; retrying left its server blocked for ever).
fn read_byte(fd: c_int) -> Result<(), i32> {
    let mut byte = 0u8;
    // SAFETY: reads one byte into a live local.
    let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
    if n == 1 {
        return Ok(());
    }
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    Err(if n == 0 { libc::EIO } else { errno })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), i32> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
    }
    // SAFETY: pipe2 just returned these descriptors and nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The writer never blocks (wake-ups are level information); the reader blocks unless
    // the application sets O_NONBLOCK itself, as with the kernel's descriptors.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Ok((read, write))
}

// ---- devices -------------------------------------------------------------------------------

/// `ibv_get_device_list`.
///
/// # Safety
/// `num` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard("ibv_get_device_list", null_mut(), || {
        crate::init_logging();
        let entry = device::device().ok();
        let count = usize::from(entry.is_some());
        // SAFETY: calloc of count + 1 pointers (NULL-terminated), freed by
        // ibv_free_device_list.
        let list = unsafe { libc::calloc(count + 1, std::mem::size_of::<*mut ibv_device>()) } as *mut *mut ibv_device;
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return null_mut();
        }
        if let Some(entry) = entry {
            // SAFETY: `list` has room for two pointers; the entry lives for the process.
            unsafe { *list = &entry.device as *const ibv_device as *mut ibv_device };
        }
        if !num.is_null() {
            // SAFETY: the caller's promise.
            unsafe { *num = count as c_int };
        }
        list
    })
}

/// `ibv_free_device_list`.
///
/// # Safety
/// `list` came from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: allocated with calloc by ibv_get_device_list (or null).
    unsafe { libc::free(list.cast()) }
}

fn our_device(device: *mut ibv_device) -> Option<&'static device::DeviceEntry> {
    let entry = device::device().ok()?;
    std::ptr::eq(device, &entry.device).then_some(entry)
}

/// `ibv_get_device_name`.
#[no_mangle]
pub extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match our_device(device) {
        Some(entry) => entry.device.name.as_ptr(),
        None => fail_null("ibv_get_device_name", libc::EINVAL, "not a device of this library"),
    }
}

/// `ibv_get_device_guid`: the node GUID in network byte order.
#[no_mangle]
pub extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    our_device(device).map_or(0, |entry| entry.guid.to_be())
}

/// `ibv_get_device_index`.
#[no_mangle]
pub extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    if our_device(device).is_some() {
        0
    } else {
        -1
    }
}

/// `ibv_open_device`.
///
/// # Safety
/// `device` came from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard("ibv_open_device", null_mut(), || {
        crate::init_logging();
        let Some(entry) = our_device(device) else {
            return fail_null("ibv_open_device", libc::EINVAL, "not a device of this library");
        };
        let open = match device::open(entry) {
            Ok(open) => open,
            Err((errno, message)) => {
                eprintln!("{message}");
                set_errno(errno);
                return null_mut();
            }
        };
        let (async_read, async_write) = match pipe() {
            Ok(p) => p,
            Err(errno) => return fail_null("ibv_open_device", errno, "no descriptor for async events"),
        };
        let mut ops = [std::ptr::null::<c_void>(); 32];
        ops[crate::abi::ops::COMPAT_QUERY_DEVICE] = ibv_query_device as *const c_void;
        ops[crate::abi::ops::COMPAT_QUERY_PORT] = ibv_query_port as *const c_void;
        ops[crate::abi::ops::ALLOC_MW] = crate::unsupported::alloc_mw as *const c_void;
        ops[crate::abi::ops::BIND_MW] = crate::unsupported::bind_mw as *const c_void;
        ops[crate::abi::ops::DEALLOC_MW] = crate::unsupported::dealloc_mw as *const c_void;
        ops[crate::abi::ops::POLL_CQ] = crate::datapath::poll_cq as *const c_void;
        ops[crate::abi::ops::REQ_NOTIFY_CQ] = crate::datapath::req_notify_cq as *const c_void;
        ops[crate::abi::ops::POST_SRQ_RECV] = crate::datapath::post_srq_recv as *const c_void;
        ops[crate::abi::ops::POST_SEND] = crate::datapath::post_send as *const c_void;
        ops[crate::abi::ops::POST_RECV] = crate::datapath::post_recv as *const c_void;
        let mut vops = [std::ptr::null::<c_void>(); 38];
        vops[crate::abi::vops::QUERY_PORT] = query_port_op as *const c_void;
        vops[crate::abi::vops::QUERY_DEVICE_EX] = query_device_ex_op as *const c_void;
        vops[crate::abi::vops::CREATE_QP_EX] = create_qp_ex_op as *const c_void;
        vops[crate::abi::vops::CREATE_SRQ_EX] = create_srq_ex_op as *const c_void;
        crate::unsupported::fill_extended_ops(&mut vops);
        let num_comp_vectors = open.context.num_comp_vectors() as c_int;
        let ctx = Box::new(Ctx {
            vctx: verbs_context {
                ops: vops,
                _abi_placeholder3: 0,
                sz: VERBS_CONTEXT_SIZE,
                context: ibv_context {
                    device,
                    ops,
                    cmd_fd: -1,
                    async_fd: async_read.as_raw_fd(),
                    num_comp_vectors,
                    _pad: 0,
                    mutex: [0; 5],
                    abi_compat: usize::MAX as *mut c_void,
                },
            },
            open: open.clone(),
            async_read,
            async_write,
            async_events: Mutex::new(VecDeque::new()),
        });
        let ctx = Box::into_raw(ctx);
        open.contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ctx as usize);
        // SAFETY: just allocated; the member's address is what applications hold.
        unsafe { &mut (*ctx).vctx.context }
    })
}

/// `ibv_close_device`.
///
/// # Safety
/// `context` came from `ibv_open_device` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard("ibv_close_device", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return fail_value("ibv_close_device", libc::EINVAL, "NULL context");
        };
        let address = ctx as *const Ctx as usize;
        ctx.open
            .contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| *c != address);
        // SAFETY: allocated by Box in ibv_open_device and no longer listed anywhere.
        drop(unsafe { Box::from_raw(address as *mut Ctx) });
        0
    })
}

/// `ibv_get_async_event`: blocks (unless the application made `async_fd` non-blocking)
/// until an asynchronous event is queued.
///
/// # Safety
/// Valid context and event pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    guard("ibv_get_async_event", -1, || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        if let Err(errno) = read_byte(ctx.async_read.as_raw_fd()) {
            set_errno(errno);
            return -1;
        }
        let Some((element, event_type)) = ctx.async_events.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        // SAFETY: the caller's promise.
        unsafe {
            (*event).element = element as *mut c_void;
            (*event).event_type = event_type;
        }
        0
    })
}

/// `ibv_ack_async_event`.
///
/// # Safety
/// `event` came from `ibv_get_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: the caller's promise; the element is one of our wrappers for object events.
    unsafe {
        let Some(event) = event.as_ref() else { return };
        match event.event_type {
            0 => {
                if let Some(cq) = wrapper::<Cq>(event.element) {
                    cq.base.async_events_completed += 1;
                }
            }
            1..=7 | 16 => {
                if let Some(qp) = wrapper::<Qp>(event.element) {
                    qp.base.events_completed += 1;
                }
            }
            14 | 15 => {
                if let Some(srq) = wrapper::<Srq>(event.element) {
                    srq.base.events_completed += 1;
                }
            }
            _ => {}
        }
    }
}

// ---- queries ---------------------------------------------------------------------------------

fn device_attr(ctx: &Ctx) -> ibv_device_attr {
    let a = ctx.open.context.query_device();
    let mut fw_ver = [0 as c_char; 64];
    for (slot, byte) in fw_ver.iter_mut().zip(a.fw_ver.bytes().take(63)) {
        *slot = byte as c_char;
    }
    let int = |v: u32| v.min(i32::MAX as u32) as c_int;
    ibv_device_attr {
        fw_ver,
        node_guid: a.node_guid.to_be(),
        sys_image_guid: a.sys_image_guid.to_be(),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: int(a.max_qp),
        max_qp_wr: int(a.max_qp_wr),
        device_cap_flags: a.device_cap_flags.bits(),
        max_sge: int(a.max_sge),
        max_sge_rd: int(a.max_sge_rd),
        max_cq: int(a.max_cq),
        max_cqe: int(a.max_cqe),
        max_mr: int(a.max_mr),
        max_pd: int(a.max_pd),
        max_qp_rd_atom: int(a.max_qp_rd_atom),
        max_ee_rd_atom: int(a.max_ee_rd_atom),
        max_res_rd_atom: int(a.max_res_rd_atom),
        max_qp_init_rd_atom: int(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: int(a.max_ee_init_rd_atom),
        atomic_cap: a.atomic_cap as c_int,
        max_ee: int(a.max_ee),
        max_rdd: int(a.max_rdd),
        // Memory windows are not offered through this library (ibv_alloc_mw fails).
        max_mw: 0,
        max_raw_ipv6_qp: int(a.max_raw_ipv6_qp),
        max_raw_ethy_qp: int(a.max_raw_ethy_qp),
        max_mcast_grp: int(a.max_mcast_grp),
        max_mcast_qp_attach: int(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: int(a.max_total_mcast_qp_attach),
        max_ah: int(a.max_ah),
        max_fmr: int(a.max_fmr),
        max_map_per_fmr: int(a.max_map_per_fmr),
        max_srq: int(a.max_srq),
        max_srq_wr: int(a.max_srq_wr),
        max_srq_sge: int(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
    }
}

/// `ibv_query_device`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard("ibv_query_device", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), attr.is_null()) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's promise.
        unsafe { attr.write(device_attr(ctx)) };
        0
    })
}

/// The `query_device_ex` op behind the inline `ibv_query_device_ex`.
unsafe extern "C" fn query_device_ex_op(
    context: *mut ibv_context,
    input: *const u32,
    attr: *mut u8,
    size: usize,
) -> c_int {
    guard("ibv_query_device_ex", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: `input` is null or points at `struct ibv_query_device_ex_input`, whose
        // first member is `comp_mask`.
        if !input.is_null() && unsafe { *input } != 0 {
            return fail_value("ibv_query_device_ex", libc::EINVAL, "input comp_mask must be 0");
        }
        if attr.is_null() || size < std::mem::size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let orig = device_attr(ctx);
        // SAFETY: the caller's struct is `size` bytes long (its header's sizeof).
        unsafe {
            std::ptr::write_bytes(attr, 0, size);
            attr.cast::<ibv_device_attr>().write_unaligned(orig);
            if size >= DEVICE_ATTR_EX_SIZE {
                attr.add(DEVICE_ATTR_EX_PHYS_PORT_CNT_EX)
                    .cast::<u32>()
                    .write_unaligned(u32::from(orig.phys_port_cnt));
            }
        }
        0
    })
}

fn port_attr(ctx: &Ctx, port: u8) -> Result<ibv_port_attr, i32> {
    let p = ctx.open.context.query_port(port).map_err(|e| e.errno())?;
    let active = if (ctx.open.entry.spec.active_mtu as u8) < (p.max_mtu as u8) {
        ctx.open.entry.spec.active_mtu
    } else {
        p.max_mtu
    };
    Ok(ibv_port_attr {
        state: p.state as c_int,
        max_mtu: p.max_mtu as c_int,
        active_mtu: active as c_int,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer as u8,
        flags: 0,
        port_cap_flags2: 0,
        active_speed_ex: 0,
    })
}

fn write_port_attr(ctx: &Ctx, port: u8, attr: *mut u8, size: usize) -> c_int {
    match port_attr(ctx, port) {
        Ok(value) => {
            let ours = std::mem::size_of::<ibv_port_attr>();
            // SAFETY: the caller's struct is `size` bytes; we copy at most that much.
            unsafe {
                std::ptr::write_bytes(attr, 0, size);
                std::ptr::copy_nonoverlapping((&value as *const ibv_port_attr).cast::<u8>(), attr, size.min(ours));
            }
            0
        }
        Err(errno) => fail_value("ibv_query_port", errno, format!("port {port}: the device has port 1")),
    }
}

/// `ibv_query_port` (the exported, 48-byte form).
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), attr.is_null()) else {
            return libc::EINVAL;
        };
        write_port_attr(ctx, port, attr.cast(), PORT_ATTR_OLD_SIZE)
    })
}

unsafe extern "C" fn query_port_op(context: *mut ibv_context, port: u8, attr: *mut u8, size: usize) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), attr.is_null()) else {
            return libc::EINVAL;
        };
        write_port_attr(ctx, port, attr, size)
    })
}

/// `ibv_query_gid`: all-zero for an empty slot below the table length.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut [u8; 16]) -> c_int {
    guard("ibv_query_gid", -1, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), gid.is_null()) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        match u32::try_from(index).map(|i| ctx.open.context.query_gid(port, i)) {
            Ok(Ok(value)) => {
                // SAFETY: the caller's promise.
                unsafe { *gid = value.raw() };
                0
            }
            _ => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0 or a positive errno.
///
/// # Safety
/// Valid pointers; `entry` holds `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard("ibv_query_gid_ex", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), entry.is_null()) else {
            return libc::EINVAL;
        };
        if flags != 0 {
            return fail_value(
                "ibv_query_gid_ex",
                libc::EINVAL,
                format!("flags {flags:#x} (must be 0)"),
            );
        }
        if entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port) else {
            return libc::EINVAL;
        };
        match ctx.open.context.query_gid_entry(port, index) {
            Ok(Some((gid, _))) => {
                let value = ibv_gid_entry {
                    gid: gid.raw(),
                    gid_index: index,
                    port_num: u32::from(port),
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                };
                // SAFETY: the caller's promise (size checked above).
                unsafe { entry.write_unaligned(value) };
                0
            }
            Ok(None) => libc::ENODATA,
            Err(e) => errno_of(&e),
        }
    })
}

/// `_ibv_query_gid_table`: the valid entries; their count, or a negative errno.
///
/// # Safety
/// `entries` holds `max_entries` entries of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut u8,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() || entries.is_null() {
            return -(libc::EINVAL as isize);
        }
        let length = ctx.open.context.query_port(1).map(|p| p.gid_tbl_len).unwrap_or(0);
        let mut count = 0usize;
        for index in 0..length {
            if let Ok(Some((gid, _))) = ctx.open.context.query_gid_entry(1, index) {
                if count == max_entries {
                    return -(libc::EINVAL as isize);
                }
                let value = ibv_gid_entry {
                    gid: gid.raw(),
                    gid_index: index,
                    port_num: 1,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                };
                // SAFETY: `count < max_entries`, each `entry_size` bytes.
                unsafe {
                    entries
                        .add(count * entry_size)
                        .cast::<ibv_gid_entry>()
                        .write_unaligned(value)
                };
                count += 1;
            }
        }
        count as isize
    })
}

/// `ibv_query_gid_type` (private; `ibv_devinfo -v`): sysfs numbering, 1 = RoCE v2.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: u32,
    gid_type: *mut c_int,
) -> c_int {
    guard("ibv_query_gid_type", -1, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), gid_type.is_null()) else {
            return -1;
        };
        match ctx.open.context.query_gid_entry(port, index) {
            Ok(_) => {
                // SAFETY: the caller's promise.
                unsafe { *gid_type = IBV_GID_TYPE_SYSFS_ROCE_V2 };
                0
            }
            Err(_) => -1,
        }
    })
}

/// `ibv_query_pkey`: the one P_Key, 0xFFFF (network order).
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(context: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    guard("ibv_query_pkey", -1, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), false) = ((unsafe { ctx_of(context) }), pkey.is_null()) else {
            return -1;
        };
        match u16::try_from(index).map(|i| ctx.open.context.query_pkey(port, i)) {
            Ok(Ok(value)) => {
                // SAFETY: the caller's promise.
                unsafe { *pkey = value.to_be() };
                0
            }
            _ => -1,
        }
    })
}

/// `ibv_get_pkey_index`.
///
/// # Safety
/// A valid context.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: the caller's promise.
    let ctx = unsafe { ctx_of(context) };
    if ctx.is_some() && port == 1 && u16::from_be(pkey) == 0xFFFF {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}

/// `ibv_read_sysfs_file`: answers `board_id` of our device (nothing else is read).
///
/// # Safety
/// Valid strings and a `size`-byte buffer.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: the caller's NUL-terminated strings.
    let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let ours = device::device().ok().map(|e| {
        // SAFETY: our own NUL-terminated name.
        unsafe { CStr::from_ptr(e.device.ibdev_path.as_ptr()) }
    });
    if Some(dir) != ours || file.to_bytes() != b"board_id" {
        return -1;
    }
    let text = b"RNIC-EMU-1\n";
    let n = text.len().min(size - 1);
    // SAFETY: `n < size` bytes into the caller's buffer, then the terminator.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
    n as c_int
}

/// `ibv_get_sysfs_path`.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

// ---- protection domains and memory regions -------------------------------------------------

/// `ibv_alloc_pd`.
///
/// # Safety
/// A valid context.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard("ibv_alloc_pd", null_mut(), || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return fail_null("ibv_alloc_pd", libc::EINVAL, "NULL context");
        };
        match ctx.open.context.alloc_pd() {
            Ok(pd) => {
                let handle = pd.pd_number();
                Box::into_raw(Box::new(Pd {
                    base: ibv_pd { context, handle },
                    pd: Some(pd),
                }))
                .cast()
            }
            Err(e) => fail_null("ibv_alloc_pd", e.errno(), e),
        }
    })
}

/// `ibv_dealloc_pd`: `EBUSY` while objects use it.
///
/// # Safety
/// A PD of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Pd>(pd.cast()) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = wrapper.pd.take() else {
            return libc::EINVAL;
        };
        match rust.dealloc() {
            Ok(()) => {
                // SAFETY: allocated by Box in ibv_alloc_pd; the application gives it up.
                drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
                0
            }
            Err(e) => {
                let errno = e.errno();
                // Still in use: the application keeps its PD.
                wrapper.pd = e.object;
                fail_value("ibv_dealloc_pd", errno, e.error)
            }
        }
    })
}

/// `ibv_reg_mr` (constant access flags without optional bits).
///
/// # Safety
/// `addr .. addr + length` is memory of the process the application keeps mapped until
/// it deregisters the region.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    // SAFETY: forwarded with the same promise.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded with the same promise.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as u32) }
}

/// `ibv_reg_mr_iova2`: the real entry point. The device reads and writes the
/// application's bytes in place (a remote WRITE is in the buffer when its completion is
/// seen); a device that cannot reach this process's memory fails with `EOPNOTSUPP`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard("ibv_reg_mr", null_mut(), || {
        // SAFETY: the caller's promise.
        let Some(pd_wrapper) = (unsafe { wrapper::<Pd>(pd.cast()) }) else {
            return fail_null("ibv_reg_mr", libc::EINVAL, "NULL PD");
        };
        if access & IBV_ACCESS_ON_DEMAND != 0 {
            return fail_null(
                "ibv_reg_mr",
                libc::EOPNOTSUPP,
                "IBV_ACCESS_ON_DEMAND: on-demand paging (ODP) is not supported; register pinned memory",
            );
        }
        if access & IBV_ACCESS_ZERO_BASED != 0 {
            return fail_null(
                "ibv_reg_mr",
                libc::EOPNOTSUPP,
                "IBV_ACCESS_ZERO_BASED regions are not supported",
            );
        }
        // rdma-core clears the optional range when the device cannot take it; HUGETLB is
        // only a hint.
        let known = 0x1f | IBV_ACCESS_HUGETLB;
        let access = access & !IBV_ACCESS_OPTIONAL_RANGE;
        if access & !known != 0 {
            return fail_null(
                "ibv_reg_mr",
                libc::EINVAL,
                format!("unknown access flags {:#x}", access & !known),
            );
        }
        let flags = AccessFlags::from_bits_truncate(access & 0x1f);
        if length == 0 || addr.is_null() {
            return fail_null("ibv_reg_mr", libc::EINVAL, format!("{length} bytes at {addr:p}"));
        }
        // SAFETY: `ibv_reg_mr`'s contract (the caller's promise above): the range stays
        // mapped until ibv_dereg_mr, which unmaps it from the device first.
        let Some(range) = (unsafe { rnic_os::ApplicationRange::new(addr as usize, length) }) else {
            return fail_null(
                "ibv_reg_mr",
                libc::EINVAL,
                format!("{length} bytes at {addr:p} wrap the address space"),
            );
        };
        let Some(live) = pd_wrapper.live() else {
            return fail_null("ibv_reg_mr", libc::EINVAL, "a deallocated PD");
        };
        match live.register_application_memory(Arc::new(range), iova, flags) {
            Ok(mr) => {
                let (lkey, rkey) = (mr.lkey(), mr.rkey());
                let handle = mr.mpt_index();
                Box::into_raw(Box::new(Mr {
                    base: ibv_mr {
                        context: pd_wrapper.base.context,
                        pd,
                        addr,
                        length,
                        handle,
                        lkey,
                        rkey,
                    },
                    mr: Some(mr),
                }))
                .cast()
            }
            Err(e) => fail_null("ibv_reg_mr", e.errno(), e),
        }
    })
}

/// `ibv_dereg_mr`.
///
/// # Safety
/// A region of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Mr>(mr.cast()) }) else {
            return libc::EINVAL;
        };
        let Some(region) = wrapper.mr.take() else {
            return libc::EINVAL;
        };
        match region.deregister() {
            Ok(_) => {
                // SAFETY: allocated by Box in ibv_reg_mr_iova2; the application gives it up.
                drop(unsafe { Box::from_raw(mr.cast::<Mr>()) });
                0
            }
            Err(e) => {
                let errno = e.errno();
                wrapper.mr = e.object;
                fail_value("ibv_dereg_mr", errno, e.error)
            }
        }
    })
}

/// `ibv_rereg_mr`: not supported (`IBV_REREG_MR_ERR_INPUT`, errno `EOPNOTSUPP`).
#[no_mangle]
pub extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    diag!("ibv_rereg_mr: re-registration is not supported; deregister and register again");
    set_errno(libc::EOPNOTSUPP);
    -1
}

// ---- completion channels and CQs -----------------------------------------------------------

/// `ibv_create_comp_channel`: `fd` is a pipe that holds one byte per completion event.
///
/// # Safety
/// A valid context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", null_mut(), || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return fail_null("ibv_create_comp_channel", libc::EINVAL, "NULL context");
        };
        let (read, write) = match pipe() {
            Ok(p) => p,
            Err(errno) => return fail_null("ibv_create_comp_channel", errno, "no descriptor"),
        };
        let write = Arc::new(write);
        let channel = ctx.open.context.create_comp_channel();
        let writer = write.clone();
        channel.set_notifier(move || write_byte(writer.as_raw_fd()));
        let fd = read.as_raw_fd();
        Box::into_raw(Box::new(Channel {
            base: ibv_comp_channel { context, fd, refcnt: 0 },
            channel,
            write,
            read,
        }))
        .cast()
    })
}

/// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
///
/// # Safety
/// A channel of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Channel>(channel.cast()) }) else {
            return libc::EINVAL;
        };
        if wrapper.base.refcnt > 0 {
            return fail_value(
                "ibv_destroy_comp_channel",
                libc::EBUSY,
                format!("{} CQs still use the channel", wrapper.base.refcnt),
            );
        }
        // SAFETY: allocated by Box in ibv_create_comp_channel.
        let channel = unsafe { Box::from_raw(channel.cast::<Channel>()) };
        drop((channel.write, channel.read));
        0
    })
}

/// `ibv_create_cq`.
///
/// # Safety
/// Valid context and (optional) channel.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", null_mut(), || {
        // SAFETY: the caller's promise.
        let Some(ctx) = (unsafe { ctx_of(context) }) else {
            return fail_null("ibv_create_cq", libc::EINVAL, "NULL context");
        };
        let (Ok(cqe), Ok(vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
            return fail_null(
                "ibv_create_cq",
                libc::EINVAL,
                format!("cqe {cqe}, comp_vector {comp_vector}"),
            );
        };
        // SAFETY: the caller's promise.
        let channel_wrapper = unsafe { wrapper::<Channel>(channel.cast()) };
        let rust_channel = channel_wrapper.as_ref().map(|c| &c.channel);
        match ctx.open.context.create_cq(cqe.max(1), rust_channel, vector) {
            Ok(cq) => {
                if let Some(c) = channel_wrapper {
                    c.base.refcnt += 1;
                }
                let number = cq.cq_number();
                let depth = cq.cqe();
                let pointer = Box::into_raw(Box::new(Cq {
                    base: ibv_cq {
                        context,
                        channel,
                        cq_context,
                        handle: number,
                        cqe: depth.min(i32::MAX as u32) as c_int,
                        mutex: [0; 5],
                        cond: [0; 6],
                        comp_events_completed: 0,
                        async_events_completed: 0,
                    },
                    cq: Some(cq),
                }));
                ctx.open
                    .objects
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .cqs
                    .insert(number, (pointer as usize, ctx as *const Ctx as usize));
                pointer.cast()
            }
            Err(e) => fail_null("ibv_create_cq", e.errno(), e),
        }
    })
}

/// `ibv_resize_cq`: not supported.
#[no_mangle]
pub extern "C" fn ibv_resize_cq(_cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    fail_value("ibv_resize_cq", libc::EOPNOTSUPP, "resizing a CQ is not supported")
}

/// `ibv_destroy_cq`: `EBUSY` while QPs use it or events are unacknowledged.
///
/// # Safety
/// A CQ of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Cq>(cq.cast()) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the CQ's context is live while the CQ is.
        let Some(ctx) = (unsafe { ctx_of(wrapper.base.context) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = wrapper.cq.take() else {
            return libc::EINVAL;
        };
        let number = rust.cq_number();
        match rust.destroy() {
            Ok(()) => {
                ctx.open
                    .objects
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .cqs
                    .remove(&number);
                // SAFETY: the channel outlives the CQs counted in its refcnt.
                if let Some(channel) = unsafe { self::wrapper::<Channel>(wrapper.base.channel.cast()) } {
                    channel.base.refcnt -= 1;
                }
                // SAFETY: allocated by Box in ibv_create_cq.
                drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
                0
            }
            Err(e) => {
                let errno = e.errno();
                wrapper.cq = e.object;
                fail_value("ibv_destroy_cq", errno, e.error)
            }
        }
    })
}

/// `ibv_get_cq_event`: blocks (unless the channel's fd is non-blocking) until a CQ of the
/// channel has a completion event.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Channel>(channel.cast()) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        if let Err(errno) = read_byte(wrapper.read.as_raw_fd()) {
            set_errno(errno);
            return -1;
        }
        let Some(event) = wrapper.channel.take_cq_event() else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        // SAFETY: the channel's context is live while the channel is.
        let Some(ctx) = (unsafe { ctx_of(wrapper.base.context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let found = ctx
            .open
            .objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cqs
            .get(&event.cq_number)
            .copied();
        let Some((pointer, _)) = found else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        let c_cq = pointer as *mut Cq;
        // SAFETY: a live CQ (it cannot be destroyed with unacknowledged events), and the
        // caller's out-pointers.
        unsafe {
            *cq = c_cq.cast();
            *cq_context = (*c_cq).base.cq_context;
        }
        0
    })
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// A CQ of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    // SAFETY: the caller's promise.
    if let Some(wrapper) = unsafe { wrapper::<Cq>(cq.cast()) } {
        wrapper.base.comp_events_completed = wrapper.base.comp_events_completed.wrapping_add(nevents);
        if let Some(rust) = &wrapper.cq {
            rust.ack_events(nevents);
        }
    }
}

// ---- shared receive queues -------------------------------------------------------------------

/// `ibv_create_srq`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard("ibv_create_srq", null_mut(), || {
        // SAFETY: the caller's promise.
        let (Some(pd_wrapper), Some(init)) = (unsafe { wrapper::<Pd>(pd.cast()) }, unsafe { init.as_mut() }) else {
            return fail_null("ibv_create_srq", libc::EINVAL, "NULL PD or attributes");
        };
        let attributes = SrqAttributes {
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            srq_limit: init.attr.srq_limit,
        };
        let Some(live) = pd_wrapper.live() else {
            return fail_null("ibv_create_srq", libc::EINVAL, "a deallocated PD");
        };
        match live.create_srq(&attributes) {
            Ok(srq) => {
                let actual = srq.attributes();
                init.attr.max_wr = actual.max_wr;
                init.attr.max_sge = actual.max_sge;
                let number = srq.srq_number();
                let context = pd_wrapper.base.context;
                let pointer = Box::into_raw(Box::new(Srq {
                    base: ibv_srq {
                        context,
                        srq_context: init.srq_context,
                        pd,
                        handle: number,
                        mutex: [0; 5],
                        cond: [0; 6],
                        events_completed: 0,
                    },
                    srq: Some(srq),
                }));
                // SAFETY: the PD's context is live.
                if let Some(ctx) = unsafe { ctx_of(context) } {
                    ctx.open
                        .objects
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .srqs
                        .insert(number, (pointer as usize, ctx as *const Ctx as usize));
                }
                pointer.cast()
            }
            Err(e) => fail_null("ibv_create_srq", e.errno(), e),
        }
    })
}

/// The `create_srq_ex` op: basic SRQs only (XRC SRQs are not supported).
unsafe extern "C" fn create_srq_ex_op(_context: *mut ibv_context, attr: *mut u8) -> *mut ibv_srq {
    guard("ibv_create_srq_ex", null_mut(), || {
        if attr.is_null() {
            return fail_null("ibv_create_srq_ex", libc::EINVAL, "NULL attributes");
        }
        // SAFETY: `struct ibv_srq_init_attr_ex`: srq_context (8), attr (12), comp_mask
        // (u32 at 20), srq_type (int at 24), pd (pointer at 32).
        let (comp_mask, srq_type, pd) = unsafe {
            (
                attr.add(20).cast::<u32>().read_unaligned(),
                attr.add(24).cast::<c_int>().read_unaligned(),
                attr.add(32).cast::<*mut ibv_pd>().read_unaligned(),
            )
        };
        let basic = comp_mask & !0x3 == 0 && (comp_mask & 0x1 == 0 || srq_type == 0);
        if !basic || comp_mask & 0x2 == 0 {
            return fail_null(
                "ibv_create_srq_ex",
                libc::EOPNOTSUPP,
                format!("comp_mask {comp_mask:#x}, srq_type {srq_type}: only basic SRQs with a PD (no XRC, no tag matching)"),
            );
        }
        // SAFETY: the first 24 bytes are a `struct ibv_srq_init_attr`.
        unsafe { ibv_create_srq(pd, attr.cast()) }
    })
}

/// `ibv_modify_srq` (`IBV_SRQ_LIMIT`; resizing is not supported).
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(wrapper), Some(attr)) = (unsafe { wrapper::<Srq>(srq.cast()) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let Some(rust) = &wrapper.srq else { return libc::EINVAL };
        let attributes = SrqAttributes {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            srq_limit: attr.srq_limit,
        };
        match rust.modify(&attributes, SrqAttributeMask::from_bits_truncate(mask as u32)) {
            Ok(()) => 0,
            Err(e) => fail_value("ibv_modify_srq", e.errno(), e),
        }
    })
}

/// `ibv_query_srq`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("ibv_query_srq", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(wrapper), false) = (unsafe { wrapper::<Srq>(srq.cast()) }, attr.is_null()) else {
            return libc::EINVAL;
        };
        let Some(rust) = &wrapper.srq else { return libc::EINVAL };
        match rust.query() {
            Ok(a) => {
                // SAFETY: the caller's promise.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        srq_limit: a.srq_limit,
                    })
                };
                0
            }
            Err(e) => fail_value("ibv_query_srq", e.errno(), e),
        }
    })
}

/// `ibv_destroy_srq`.
///
/// # Safety
/// An SRQ of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Srq>(srq.cast()) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = wrapper.srq.take() else {
            return libc::EINVAL;
        };
        let number = rust.srq_number();
        match rust.destroy() {
            Ok(()) => {
                // SAFETY: the SRQ's context is live while the SRQ is.
                if let Some(ctx) = unsafe { ctx_of(wrapper.base.context) } {
                    ctx.open
                        .objects
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .srqs
                        .remove(&number);
                }
                // SAFETY: allocated by Box in ibv_create_srq.
                drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
                0
            }
            Err(e) => {
                let errno = e.errno();
                wrapper.srq = e.object;
                fail_value("ibv_destroy_srq", errno, e.error)
            }
        }
    })
}

// ---- queue pairs -----------------------------------------------------------------------------

fn qp_type(value: c_int) -> Result<QpType, (i32, String)> {
    match value {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        8 => Err((
            libc::EOPNOTSUPP,
            "raw packet QPs (IBV_QPT_RAW_PACKET) are not supported".into(),
        )),
        9 | 10 => Err((libc::EOPNOTSUPP, "XRC QPs are not supported".into())),
        255 => Err((
            libc::EOPNOTSUPP,
            "driver QPs (IBV_QPT_DRIVER: DC, SRD) are not supported".into(),
        )),
        other => Err((libc::EINVAL, format!("unknown QP type {other}"))),
    }
}

/// Smallest send and receive queue a QP gets (the actual depths are written back, as
/// providers round up). perftest's latency tests ask for a send queue of 1 and, with
/// `-e`, do not wait for each send's completion: on a loaded host, where the peer's ACKs
/// come late, a deeper queue keeps their posts from failing with ENOMEM.
const MIN_QUEUE_DEPTH: u32 = 256;

unsafe fn create_qp_common(pd: *mut ibv_pd, init: &mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: the caller's promise.
    let Some(pd_wrapper) = (unsafe { wrapper::<Pd>(pd.cast()) }) else {
        return fail_null("ibv_create_qp", libc::EINVAL, "NULL PD");
    };
    let kind = match qp_type(init.qp_type) {
        Ok(kind) => kind,
        Err((errno, why)) => return fail_null("ibv_create_qp", errno, why),
    };
    // SAFETY: CQ and SRQ pointers of this library (the application's promise).
    let (send_cq, recv_cq, srq) = unsafe {
        (
            wrapper::<Cq>(init.send_cq.cast()),
            wrapper::<Cq>(init.recv_cq.cast()),
            wrapper::<Srq>(init.srq.cast()),
        )
    };
    let (Some(Some(send)), Some(Some(recv))) = (send_cq.map(|c| c.cq.as_ref()), recv_cq.map(|c| c.cq.as_ref())) else {
        return fail_null("ibv_create_qp", libc::EINVAL, "a QP needs a send CQ and a receive CQ");
    };
    let srq_rust = match srq {
        Some(s) => match &s.srq {
            Some(r) => Some(r),
            None => return fail_null("ibv_create_qp", libc::EINVAL, "a destroyed SRQ"),
        },
        None => None,
    };
    let attributes = QpInitAttributes {
        send_cq: send,
        recv_cq: recv,
        srq: srq_rust,
        // Queues hold at least MIN_QUEUE_DEPTH work requests, as hns rounds them up (the
        // actual depths are written back): a latency test with a depth of 1 may post its
        // next send before the ACK of the previous one is in.
        cap: QpCapabilities {
            max_send_wr: init.cap.max_send_wr.max(MIN_QUEUE_DEPTH),
            max_recv_wr: if srq_rust.is_some() {
                0
            } else {
                init.cap.max_recv_wr.max(MIN_QUEUE_DEPTH)
            },
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: if srq_rust.is_some() { 0 } else { init.cap.max_recv_sge },
            max_inline_data: init.cap.max_inline_data,
        },
        qp_type: kind,
        sq_sig_all: init.sq_sig_all != 0,
    };
    let Some(live) = pd_wrapper.live() else {
        return fail_null("ibv_create_qp", libc::EINVAL, "a deallocated PD");
    };
    match live.create_qp(&attributes) {
        Ok(qp) => {
            let cap = qp.cap();
            init.cap = ibv_qp_cap {
                max_send_wr: cap.max_send_wr,
                max_recv_wr: cap.max_recv_wr,
                max_send_sge: cap.max_send_sge,
                max_recv_sge: cap.max_recv_sge,
                max_inline_data: cap.max_inline_data,
            };
            let bounce = if cap.max_inline_data > 0 {
                match live.register_provider_memory(cap.max_inline_data.max(64) as usize, AccessFlags::LOCAL_WRITE) {
                    Ok(mr) => Some(Mutex::new(mr)),
                    Err(e) => return fail_null("ibv_create_qp", e.errno(), format!("inline staging buffer: {e}")),
                }
            } else {
                None
            };
            let number = qp.qp_num();
            let context = pd_wrapper.base.context;
            let pointer = Box::into_raw(Box::new(Qp {
                base: ibv_qp {
                    context,
                    qp_context: init.qp_context,
                    pd,
                    send_cq: init.send_cq,
                    recv_cq: init.recv_cq,
                    srq: init.srq,
                    handle: number,
                    qp_num: number,
                    state: 0,
                    qp_type: init.qp_type,
                    mutex: [0; 5],
                    cond: [0; 6],
                    events_completed: 0,
                },
                qp: Some(Arc::new(qp)),
                bounce,
                max_inline: cap.max_inline_data,
                cm_owner: 0,
                cm_leftovers: None,
            }));
            // SAFETY: the PD's context is live.
            if let Some(ctx) = unsafe { ctx_of(context) } {
                ctx.open
                    .objects
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .qps
                    .insert(number, (pointer as usize, ctx as *const Ctx as usize));
            }
            pointer.cast()
        }
        Err(e) => fail_null("ibv_create_qp", e.errno(), e),
    }
}

/// `ibv_create_qp` (RC, UC, UD).
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard("ibv_create_qp", null_mut(), || {
        // SAFETY: the caller's promise.
        match unsafe { init.as_mut() } {
            // SAFETY: the caller's promise.
            Some(init) => unsafe { create_qp_common(pd, init) },
            None => fail_null("ibv_create_qp", libc::EINVAL, "NULL attributes"),
        }
    })
}

/// The `create_qp_ex` op: what `ibv_create_qp` does, for `comp_mask` PD (+ zero create
/// flags). The `ibv_wr_*` API (`send_ops_flags`) is not supported.
unsafe extern "C" fn create_qp_ex_op(_context: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    guard("ibv_create_qp_ex", null_mut(), || {
        // SAFETY: the caller's promise.
        let Some(attr) = (unsafe { attr.as_mut() }) else {
            return fail_null("ibv_create_qp_ex", libc::EINVAL, "NULL attributes");
        };
        if attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
            return fail_null(
                "ibv_create_qp_ex",
                libc::EOPNOTSUPP,
                "send_ops_flags: the ibv_wr_* work-request API is not supported; use ibv_post_send",
            );
        }
        let supported = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        if attr.comp_mask & !supported != 0 || attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return fail_null(
                "ibv_create_qp_ex",
                libc::EOPNOTSUPP,
                format!(
                    "comp_mask {:#x}: only a PD (no XRC domain, RSS, TSO, source QPN)",
                    attr.comp_mask
                ),
            );
        }
        if attr.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && attr.create_flags != 0 {
            return fail_null(
                "ibv_create_qp_ex",
                libc::EOPNOTSUPP,
                format!("create_flags {:#x}", attr.create_flags),
            );
        }
        // SAFETY: the first 64 bytes of `ibv_qp_init_attr_ex` are an `ibv_qp_init_attr`.
        unsafe {
            create_qp_common(
                attr.pd,
                &mut *(attr as *mut ibv_qp_init_attr_ex).cast::<ibv_qp_init_attr>(),
            )
        }
    })
}

/// `ibv_qp_to_qp_ex`: NULL — this library creates no extended (`ibv_wr_*`) QPs.
#[no_mangle]
pub extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut c_void {
    null_mut()
}

fn state_of(value: c_int) -> Option<QpState> {
    Some(match value {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

/// The destination MAC of an IPv4-mapped GID: on `udp:` the peer's default MAC (the
/// backend carries frames by IP anyway); on `eth:` and `pci` (a guest on a real link) the
/// kernel's neighbour entry where it has one, else that default MAC.
pub fn resolve_mac(open: &OpenDevice, gid: &Gid) -> [u8; 6] {
    if let Some(mac) = gid.link_local_mac() {
        return mac;
    }
    if !gid.is_ipv4_mapped() {
        return [0; 6];
    }
    let ip = std::net::Ipv4Addr::new(gid.0[12], gid.0[13], gid.0[14], gid.0[15]);
    if matches!(
        &open.entry.spec.backend,
        Backend::Host {
            net: rnic_net::NetSpec::Eth(_),
            ..
        } | Backend::Other { .. }
    ) {
        if let Some(mac) = arp_lookup(ip) {
            return mac;
        }
    }
    resolve_mac_for_udp(gid)
}

/// On `udp:`, the MAC a peer at an IPv4-mapped GID has by default (the backend carries
/// frames by IP, so this only labels them).
pub fn resolve_mac_for_udp(gid: &Gid) -> [u8; 6] {
    [0x02, 0x52, 0x4e, gid.0[13], gid.0[14], gid.0[15]]
}

/// Fills a C `ibv_qp_attr` from ours.
pub fn write_qp_attr(attr: &mut ibv_qp_attr, a: &QpAttributes) {
    attr.qp_state = a.qp_state as c_int;
    attr.cur_qp_state = a.cur_qp_state as c_int;
    attr.path_mtu = a.path_mtu as c_int;
    attr.qkey = a.qkey;
    attr.rq_psn = a.rq_psn;
    attr.sq_psn = a.sq_psn;
    attr.dest_qp_num = a.dest_qp_num;
    attr.qp_access_flags = a.qp_access_flags.bits();
    attr.ah_attr = ah_attributes_c(&a.ah_attr);
    attr.pkey_index = a.pkey_index;
    attr.max_rd_atomic = a.max_rd_atomic;
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.min_rnr_timer = a.min_rnr_timer;
    attr.port_num = a.port_num;
    attr.timeout = a.timeout;
    attr.retry_cnt = a.retry_cnt;
    attr.rnr_retry = a.rnr_retry;
}

fn arp_lookup(ip: std::net::Ipv4Addr) -> Option<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/net/arp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first()?.parse::<std::net::Ipv4Addr>().ok()? != ip {
            return None;
        }
        let mut mac = [0u8; 6];
        let mut parts = fields.get(3)?.split(':');
        for byte in &mut mac {
            *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
        }
        (mac != [0; 6]).then_some(mac)
    })
}

/// `ibv_modify_qp`. RoCE needs a GRH: an address vector with `is_global = 0` is refused
/// with `EINVAL`, as on hardware.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(wrapper), Some(attr)) = (unsafe { wrapper::<Qp>(qp.cast()) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let Some(rust) = &wrapper.qp else { return libc::EINVAL };
        // SAFETY: the QP's context is live.
        let Some(ctx) = (unsafe { ctx_of(wrapper.base.context) }) else {
            return libc::EINVAL;
        };
        let mask = QpAttributeMask::from_bits_retain(mask as u32);
        let unknown = mask.bits() & !QpAttributeMask::all().bits();
        if unknown != 0 {
            return fail_value(
                "ibv_modify_qp",
                libc::EOPNOTSUPP,
                format!("attribute mask bits {unknown:#x}"),
            );
        }
        let mut rust_attr = QpAttributes::default();
        if mask.contains(QpAttributeMask::STATE) {
            match state_of(attr.qp_state) {
                Some(s) => rust_attr.qp_state = s,
                None => return fail_value("ibv_modify_qp", libc::EINVAL, format!("QP state {}", attr.qp_state)),
            }
        }
        if mask.contains(QpAttributeMask::CUR_STATE) {
            match state_of(attr.cur_qp_state) {
                Some(s) => rust_attr.cur_qp_state = s,
                None => {
                    return fail_value(
                        "ibv_modify_qp",
                        libc::EINVAL,
                        format!("current state {}", attr.cur_qp_state),
                    )
                }
            }
        }
        if mask.contains(QpAttributeMask::PATH_MTU) {
            match u8::try_from(attr.path_mtu).ok().and_then(|m| Mtu::try_from(m).ok()) {
                Some(m) => rust_attr.path_mtu = m,
                None => return fail_value("ibv_modify_qp", libc::EINVAL, format!("path MTU {}", attr.path_mtu)),
            }
        }
        if mask.contains(QpAttributeMask::AV) {
            let ah = &attr.ah_attr;
            if ah.is_global == 0 {
                return fail_value(
                    "ibv_modify_qp",
                    libc::EINVAL,
                    "an address vector without a GRH (is_global = 0): RoCE addresses by GID (give the GID index, e.g. ibv_rc_pingpong -g 1)",
                );
            }
            rust_attr.ah_attr = ah_attributes(&ctx.open, ah);
        }
        rust_attr.qkey = attr.qkey;
        rust_attr.rq_psn = attr.rq_psn;
        rust_attr.sq_psn = attr.sq_psn;
        rust_attr.dest_qp_num = attr.dest_qp_num;
        rust_attr.qp_access_flags = AccessFlags::from_bits_truncate(attr.qp_access_flags);
        rust_attr.pkey_index = attr.pkey_index;
        rust_attr.max_rd_atomic = attr.max_rd_atomic;
        rust_attr.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        rust_attr.min_rnr_timer = attr.min_rnr_timer;
        rust_attr.port_num = attr.port_num;
        rust_attr.timeout = attr.timeout;
        rust_attr.retry_cnt = attr.retry_cnt;
        rust_attr.rnr_retry = attr.rnr_retry;
        match rust.modify(&rust_attr, mask) {
            Ok(()) => {
                wrapper.base.state = rust.state() as c_int;
                0
            }
            Err(e) => fail_value("ibv_modify_qp", e.errno(), e),
        }
    })
}

/// Our address-vector attributes of a C one (GRH fields, resolved MAC).
pub fn ah_attributes(open: &OpenDevice, ah: &ibv_ah_attr) -> AhAttributes {
    let dgid = Gid(ah.grh.dgid);
    AhAttributes {
        dgid,
        flow_label: ah.grh.flow_label,
        sgid_index: ah.grh.sgid_index,
        hop_limit: ah.grh.hop_limit,
        traffic_class: ah.grh.traffic_class,
        dmac: resolve_mac(open, &dgid),
        sl: ah.sl,
        static_rate: ah.static_rate,
        port_num: ah.port_num,
    }
}

/// The C address vector of ours.
pub fn ah_attributes_c(a: &AhAttributes) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: a.dgid.raw(),
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: 0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: a.static_rate,
        is_global: 1,
        port_num: a.port_num,
    }
}

/// `ibv_query_qp`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        // SAFETY: the caller's promise.
        let (Some(wrapper), false, false) = (unsafe { wrapper::<Qp>(qp.cast()) }, attr.is_null(), init.is_null())
        else {
            return libc::EINVAL;
        };
        let Some(rust) = &wrapper.qp else { return libc::EINVAL };
        let a = match rust.query() {
            Ok(a) => a,
            Err(e) => return fail_value("ibv_query_qp", e.errno(), e),
        };
        let cap = ibv_qp_cap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        };
        let value = ibv_qp_attr {
            qp_state: a.qp_state as c_int,
            cur_qp_state: a.cur_qp_state as c_int,
            path_mtu: a.path_mtu as c_int,
            path_mig_state: 0,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags.bits(),
            cap,
            ah_attr: ah_attributes_c(&a.ah_attr),
            alt_ah_attr: ibv_ah_attr::default(),
            pkey_index: a.pkey_index,
            alt_pkey_index: 0,
            en_sqd_async_notify: 0,
            sq_draining: u8::from(a.sq_draining),
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        };
        // SAFETY: the caller's promise.
        unsafe {
            attr.write(value);
            (*init).qp_context = wrapper.base.qp_context;
            (*init).send_cq = wrapper.base.send_cq;
            (*init).recv_cq = wrapper.base.recv_cq;
            (*init).srq = wrapper.base.srq;
            (*init).cap = cap;
            (*init).qp_type = wrapper.base.qp_type;
            (*init).sq_sig_all = 0;
        }
        0
    })
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// A QP of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Qp>(qp.cast()) }) else {
            return libc::EINVAL;
        };
        if wrapper.cm_owner != 0 {
            // SAFETY: the owner id outlives its QP; the wrapper is ours.
            return unsafe { crate::rdmacm::destroy_cm_qp(wrapper.cm_owner) };
        }
        let Some(shared) = wrapper.qp.take() else {
            return libc::EINVAL;
        };
        let rust = match Arc::try_unwrap(shared) {
            Ok(rust) => rust,
            Err(shared) => {
                wrapper.qp = Some(shared);
                return fail_value(
                    "ibv_destroy_qp",
                    libc::EBUSY,
                    "the QP belongs to an rdma_cm id: destroy it with rdma_destroy_qp",
                );
            }
        };
        let number = rust.qp_num();
        match rust.destroy() {
            Ok(()) => {
                // SAFETY: the QP's context is live while the QP is.
                if let Some(ctx) = unsafe { ctx_of(wrapper.base.context) } {
                    ctx.open
                        .objects
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .qps
                        .remove(&number);
                }
                // SAFETY: allocated by Box in create_qp_common or rdma_create_qp.
                let qp = unsafe { Box::from_raw(qp.cast::<Qp>()) };
                if let Some(bounce) = qp.bounce {
                    let _ = bounce.into_inner().unwrap_or_else(|e| e.into_inner()).deregister();
                }
                if let Some(leftovers) = qp.cm_leftovers {
                    // SAFETY: made by rdma_create_qp for the destroyed id; only this QP
                    // used them.
                    unsafe { leftovers.release() };
                }
                0
            }
            Err(e) => {
                let errno = e.errno();
                wrapper.qp = e.object.map(Arc::new);
                fail_value("ibv_destroy_qp", errno, e.error)
            }
        }
    })
}

// ---- address handles -----------------------------------------------------------------------

fn make_ah(pd: *mut ibv_pd, attributes: &AhAttributes) -> *mut ibv_ah {
    // SAFETY: the caller's promise (checked non-null by the callers).
    let Some(pd_wrapper) = (unsafe { wrapper::<Pd>(pd.cast()) }) else {
        return fail_null("ibv_create_ah", libc::EINVAL, "NULL PD");
    };
    let Some(live) = pd_wrapper.live() else {
        return fail_null("ibv_create_ah", libc::EINVAL, "a deallocated PD");
    };
    match live.create_ah(attributes) {
        Ok(ah) => Box::into_raw(Box::new(Ah {
            base: ibv_ah {
                context: pd_wrapper.base.context,
                pd,
                handle: 0,
            },
            ah: Some(ah),
        }))
        .cast(),
        Err(e) => fail_null("ibv_create_ah", e.errno(), e),
    }
}

/// `ibv_create_ah`: RoCE addresses need a GRH (`is_global`), else `EINVAL`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("ibv_create_ah", null_mut(), || {
        // SAFETY: the caller's promise.
        let (Some(pd_wrapper), Some(attr)) = (unsafe { wrapper::<Pd>(pd.cast()) }, unsafe { attr.as_ref() }) else {
            return fail_null("ibv_create_ah", libc::EINVAL, "NULL PD or attributes");
        };
        if attr.is_global == 0 {
            return fail_null(
                "ibv_create_ah",
                libc::EINVAL,
                "an address without a GRH (is_global = 0): RoCE addresses by GID (e.g. ibv_ud_pingpong -g 1)",
            );
        }
        // SAFETY: the PD's context is live.
        let Some(ctx) = (unsafe { ctx_of(pd_wrapper.base.context) }) else {
            return fail_null("ibv_create_ah", libc::EINVAL, "PD without context");
        };
        make_ah(pd, &ah_attributes(&ctx.open, attr))
    })
}

/// Fills `ah_attr` to answer the sender of a received UD message (its GRH: for RoCEv2
/// over IPv4, 20 unused bytes and the IPv4 header).
///
/// # Safety
/// Valid pointers; `grh` points at the 40 bytes in front of the payload.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard("ibv_init_ah_from_wc", -1, || {
        // SAFETY: the caller's promise.
        let (Some(ctx), Some(wc), false, false) = (
            unsafe { ctx_of(context) },
            unsafe { wc.as_ref() },
            grh.is_null(),
            ah_attr.is_null(),
        ) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let mut bytes = [0u8; 40];
        // SAFETY: the caller's 40-byte GRH area.
        unsafe { std::ptr::copy_nonoverlapping(grh, bytes.as_mut_ptr(), 40) };
        let (dgid, hop_limit, traffic_class) = if bytes[20] >> 4 == 4 {
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(&bytes[32..36]);
            (gid, bytes[28], bytes[21])
        } else {
            let mut gid = [0u8; 16];
            gid.copy_from_slice(&bytes[8..24]);
            (gid, bytes[7], ((bytes[0] & 0x0f) << 4) | (bytes[1] >> 4))
        };
        // The GID of ours of the same family as the sender's.
        let want_v4 = Gid(dgid).is_ipv4_mapped();
        let length = ctx.open.context.query_port(1).map(|p| p.gid_tbl_len).unwrap_or(0);
        let sgid_index = (0..length)
            .find(|&i| matches!(ctx.open.context.query_gid_entry(1, i), Ok(Some((g, _))) if g.is_ipv4_mapped() == want_v4))
            .unwrap_or(0);
        let value = ibv_ah_attr {
            grh: ibv_global_route {
                dgid,
                flow_label: 0,
                sgid_index: sgid_index as u8,
                hop_limit: hop_limit.max(1),
                traffic_class,
            },
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            port_num: port,
        };
        // SAFETY: the caller's promise.
        unsafe { ah_attr.write(value) };
        0
    })
}

/// `ibv_create_ah_from_wc`.
///
/// # Safety
/// As `ibv_init_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port: u8,
) -> *mut ibv_ah {
    guard("ibv_create_ah_from_wc", null_mut(), || {
        // SAFETY: the caller's promise.
        let Some(pd_wrapper) = (unsafe { wrapper::<Pd>(pd.cast()) }) else {
            return fail_null("ibv_create_ah_from_wc", libc::EINVAL, "NULL PD");
        };
        let mut attr = ibv_ah_attr::default();
        // SAFETY: forwarded with the caller's promise.
        if unsafe { ibv_init_ah_from_wc(pd_wrapper.base.context, port, wc, grh, &mut attr) } != 0 {
            return null_mut();
        }
        // SAFETY: as above.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// An AH of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard("ibv_destroy_ah", libc::EIO, || {
        // SAFETY: the caller's promise.
        let Some(wrapper) = (unsafe { wrapper::<Ah>(ah.cast()) }) else {
            return libc::EINVAL;
        };
        let Some(rust) = wrapper.ah.take() else {
            return libc::EINVAL;
        };
        match rust.destroy() {
            Ok(()) => {
                // SAFETY: allocated by Box in make_ah.
                drop(unsafe { Box::from_raw(ah.cast::<Ah>()) });
                0
            }
            Err(e) => {
                let errno = e.errno();
                wrapper.ah = e.object;
                fail_value("ibv_destroy_ah", errno, e.error)
            }
        }
    })
}

/// `ibv_resolve_eth_l2_from_gid`: the destination MAC of an address vector.
///
/// # Safety
/// Valid pointers (`eth_mac` 6 bytes).
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    // SAFETY: the caller's promise.
    let (Some(ctx), Some(attr), false) = (unsafe { ctx_of(context) }, unsafe { attr.as_ref() }, eth_mac.is_null())
    else {
        return libc::EINVAL;
    };
    let mac = resolve_mac(&ctx.open, &Gid(attr.grh.dgid));
    // SAFETY: the caller's promise.
    unsafe {
        std::ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, 6);
        if !vid.is_null() {
            *vid = 0xffff;
        }
    }
    0
}
