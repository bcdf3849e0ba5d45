//! librdmacm's functions over `rnic_verbs::cm`, the connection manager, on this library's
//! one device instance. Our `librdmacm.so.1` forwards every `rdma_*` call to the
//! `rnic_rdma_*` function of the same name here (private node `RNIC_PRIVATE_1`), so the
//! CM ids, their QPs and the application's verbs objects all live in one place.
//!
//! * The connection manager is made on the first call, with a progress thread, over the
//!   device's open context; CM ids point at a context of this library (`id->verbs`).
//! * Event channels are the CM's: `fd` is its eventfd (readable while events wait).
//! * An id made without a channel (`rdma_create_id(NULL, …)`, `rdma_create_ep`) is
//!   synchronous, as in librdmacm: each call waits for its own event.
//! * Not supported: multicast (`EOPNOTSUPP`), and rsockets (our librdmacm answers
//!   `ENOSYS` itself).
#![allow(missing_docs)] // the C structs of rdma_cma.h, documented there

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_verbs::cm::{
    CmConfig, CmEvent, CmEventKind, CmId, CmQpInit, ConnParam, ConnectionManager, EventChannel, KernelNeighbours,
    Neighbour, NeighbourResolver, PortSpace, ProgressThread,
};
use rnic_verbs::{QpCapabilities, QpState};

use crate::abi::*;
use crate::device::{Backend, OpenDevice};
use crate::verbs::{ah_attributes_c, ctx_of, CmLeftovers, Cq, Pd, Qp, Srq};
use crate::{diag, guard, set_errno};

const RDMA_PS_IPOIB: c_int = 0x0002;
const RDMA_PS_TCP: c_int = 0x0106;
const RDMA_PS_UDP: c_int = 0x0111;
const RDMA_PS_IB: c_int = 0x013F;
const RAI_PASSIVE: c_int = 1;

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` (416 bytes; `route` is 312 bytes at 32).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    /// `struct rdma_route`: src (128), dst (128), `rdma_ib_addr` (40), path_rec, num_paths.
    pub route: [u64; 39],
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

#[repr(C)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

#[repr(C)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    /// The `conn` / `ud` union (56 bytes).
    pub param: [u64; 7],
}

#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut u8,
    pub ai_dst_addr: *mut u8,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

const _: () = {
    assert!(std::mem::size_of::<rdma_cm_id>() == 416);
    assert!(std::mem::offset_of!(rdma_cm_id, ps) == 344);
    assert!(std::mem::offset_of!(rdma_cm_id, event) == 352);
    assert!(std::mem::offset_of!(rdma_cm_id, qp_type) == 408);
    assert!(std::mem::size_of::<rdma_cm_event>() == 80);
    assert!(std::mem::size_of::<rdma_conn_param>() == 24);
    assert!(std::mem::size_of::<rdma_ud_param>() == 56);
    assert!(std::mem::offset_of!(rdma_ud_param, qp_num) == 48);
    assert!(std::mem::size_of::<rdma_addrinfo>() == 96);
};

/// The process's connection manager.
struct CmState {
    /// Keeps the device open while the connection manager uses it.
    _open: Arc<OpenDevice>,
    /// The context CM ids report as `verbs` (one, for the process).
    context: usize,
    cm: ConnectionManager,
    _progress: ProgressThread,
    /// CM id handle → our `Id`.
    ids: Mutex<HashMap<u64, usize>>,
}

/// MACs on `udp:`: the peer's default MAC (the backend carries frames by IP anyway).
#[derive(Debug)]
struct UdpNeighbours;

impl NeighbourResolver for UdpNeighbours {
    fn resolve(&self, _local: IpAddr, peer: IpAddr) -> Neighbour {
        let gid = rnic_verbs::cm::address::ip_to_gid(peer);
        Neighbour::Known(crate::verbs::resolve_mac_for_udp(&gid))
    }
}

/// The process's connection manager, made on first use.
static STATE: Mutex<Option<Arc<CmState>>> = Mutex::new(None);

fn state() -> Result<Arc<CmState>, (i32, String)> {
    let mut slot = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(state) = slot.as_ref() {
        return Ok(state.clone());
    }
    crate::init_logging();
    let mut count = 0;
    // SAFETY: our own entry points, used as the application would.
    let context = unsafe {
        let list = crate::verbs::ibv_get_device_list(&mut count);
        if list.is_null() || count == 0 {
            return Err((libc::ENODEV, "no rnic device (see RNIC_DEVICE)".into()));
        }
        let context = crate::verbs::ibv_open_device(*list);
        crate::verbs::ibv_free_device_list(list);
        context
    };
    // SAFETY: just opened (or null).
    let Some(ctx) = (unsafe { ctx_of(context) }) else {
        return Err((libc::ENODEV, "the rnic device did not open".into()));
    };
    let open = ctx.open.clone();
    let cm = ConnectionManager::new(CmConfig::default());
    let neighbours: Arc<dyn NeighbourResolver> = match &open.entry.spec.backend {
        Backend::Host {
            net: rnic_net::NetSpec::Udp(_),
            ..
        } => Arc::new(UdpNeighbours),
        _ => Arc::new(KernelNeighbours::new()),
    };
    cm.add_device(&open.context, neighbours)
        .map_err(|e| (e.errno(), format!("the connection manager cannot use the device: {e}")))?;
    let progress = cm
        .spawn_progress_thread()
        .map_err(|e| (e.errno(), format!("connection manager thread: {e}")))?;
    let state = Arc::new(CmState {
        _open: open,
        context: context as usize,
        cm,
        _progress: progress,
        ids: Mutex::new(HashMap::new()),
    });
    *slot = Some(state.clone());
    register_exit_handler();
    Ok(state)
}

/// The process that made the connection manager (a forked child inherits the exit handler
/// but none of our threads, and must not speak for its parent's connections).
static CM_PROCESS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// At `exit`, the kernel would close the process's rdma_cm descriptor and destroy every id
/// still open (Linux's `ucma_close`): a live connection gets its DREQ, one the peer asked
/// to end its DREP, a pending request its REJ. Our connection manager lives in the
/// process, so an exit handler does the same and waits (bounded) until those MADs have
/// left, since the progress threads end with the process.
fn register_exit_handler() {
    extern "C" fn at_exit() {
        if CM_PROCESS.load(std::sync::atomic::Ordering::Acquire) != std::process::id() {
            return;
        }
        let Some(state) = STATE.try_lock().ok().and_then(|slot| slot.clone()) else {
            return;
        };
        // On a thread of its own: the exiting thread's thread-locals (which tracing
        // uses) are already gone when exit handlers run.
        let work =
            rnic_os::spawn_with_signals_blocked(std::thread::Builder::new().name("rnic-cm-exit".into()), move || {
                let live = destroy_ids(&state, |_| true);
                if live > 0 && !state.cm.wait_sent(EXIT_FLUSH_LIMIT) {
                    diag!("exit: the connection manager's last MADs did not leave within {EXIT_FLUSH_LIMIT:?}");
                }
            });
        if let Ok(work) = work {
            let _ = work.join();
        }
    }
    if CM_PROCESS.swap(std::process::id(), std::sync::atomic::Ordering::AcqRel) == 0 {
        // SAFETY: registers a function of this library; glibc runs it at exit, or when
        // the library is unloaded (atexit from a shared object is tied to it).
        unsafe { libc::atexit(at_exit) };
    }
}

/// How long an exiting process waits for its last MADs (DREQ, DREP, REJ) to leave.
const EXIT_FLUSH_LIMIT: Duration = Duration::from_millis(500);

/// Destroys the connection manager's side of every listed id `which` selects (what
/// Linux's `cm_destroy_id` sends in its state goes out), leaving the C structs to the
/// application, which may still pass them to `rdma_destroy_id`. Returns how many.
fn destroy_ids(state: &CmState, which: impl Fn(&Id) -> bool) -> usize {
    let pointers: Vec<usize> = state
        .ids
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .copied()
        .collect();
    let mut destroyed = 0;
    for pointer in pointers {
        // SAFETY: listed ids are live (rdma_destroy_id unlists before it frees).
        let id = unsafe { &mut *(pointer as *mut Id) };
        if !which(id) {
            continue;
        }
        forget(state, id);
        id.orphaned = true;
        if id.id.destroy().is_ok() {
            destroyed += 1;
        }
    }
    destroyed
}

/// Our event channel: the C struct first.
#[repr(C)]
struct Channel {
    base: rdma_event_channel,
    channel: EventChannel,
    /// Events a synchronous call took out of order, handed out first.
    stash: Mutex<VecDeque<CmEvent>>,
    /// Threads blocked in `rdma_get_cm_event` on this channel. A channel destroyed under
    /// one is not freed: as with librdmacm's descriptor, the blocked thread stays blocked
    /// (rping destroys the channel its CM thread waits on, then exits).
    waiters: AtomicUsize,
}

/// Our id: the C struct first.
#[repr(C)]
struct Id {
    base: rdma_cm_id,
    id: CmId,
    /// The private channel of a synchronous id.
    sync_channel: Option<*mut Channel>,
    /// CQs and channels we made for `rdma_create_qp` without CQs, destroyed with the id.
    own_cqs: bool,
    own_pd: bool,
    /// Its event channel was destroyed, and with it the connection manager's id.
    orphaned: bool,
    /// Events of this id that `rdma_get_cm_event` handed out and the application has not
    /// acknowledged yet (connection requests count on the listener): `rdma_destroy_id`
    /// waits for them, as librdmacm's does, so another thread still handling one never
    /// sees the id freed.
    unacked_events: AtomicUsize,
}

/// Our event: the C struct first, then what its pointers point into.
#[repr(C)]
struct Event {
    base: rdma_cm_event,
    private_data: Vec<u8>,
    /// The id whose `unacked_events` counts this event (null: not counted).
    counted: *const Id,
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: `rdma_destroy_id` frees an id only once no event counts in it, so the id
        // this event counts in is live.
        if let Some(id) = unsafe { self.counted.as_ref() } {
            id.unacked_events.fetch_sub(1, Ordering::Release);
        }
    }
}

/// How long `rdma_destroy_id` waits for the application to acknowledge the id's events
/// (librdmacm waits for ever); after it the id is kept, not freed, and a diagnostic says so.
const UNACKED_EVENTS_WAIT: Duration = Duration::from_secs(5);

fn fail(verb: &str, errno: i32, why: impl std::fmt::Display) -> c_int {
    diag!("{verb}: {why}");
    set_errno(errno);
    -1
}

fn cm_fail(verb: &str, error: &rnic_verbs::cm::CmError) -> c_int {
    fail(verb, error.errno(), error)
}

/// # Safety
/// `pointer` is null or a live sockaddr.
unsafe fn socket_address(pointer: *const u8) -> Option<SocketAddr> {
    if pointer.is_null() {
        return None;
    }
    // SAFETY: the caller's promise: a sockaddr whose family says its size.
    unsafe {
        let family = pointer.cast::<u16>().read_unaligned();
        let port = u16::from_be(pointer.add(2).cast::<u16>().read_unaligned());
        match family as c_int {
            libc::AF_INET => {
                let mut octets = [0u8; 4];
                std::ptr::copy_nonoverlapping(pointer.add(4), octets.as_mut_ptr(), 4);
                Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(octets)), port))
            }
            libc::AF_INET6 => {
                let mut octets = [0u8; 16];
                std::ptr::copy_nonoverlapping(pointer.add(8), octets.as_mut_ptr(), 16);
                Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
            }
            _ => None,
        }
    }
}

/// Writes `address` as a sockaddr_in / sockaddr_in6 into 128 zeroed bytes.
fn write_socket_address(out: &mut [u8], address: SocketAddr) {
    out.fill(0);
    match address {
        SocketAddr::V4(v4) => {
            out[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&v4.port().to_be_bytes());
            out[4..8].copy_from_slice(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            out[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&v6.port().to_be_bytes());
            out[8..24].copy_from_slice(&v6.ip().octets());
        }
    }
}

fn sockaddr_len(address: SocketAddr) -> u32 {
    match address {
        SocketAddr::V4(_) => 16,
        SocketAddr::V6(_) => 28,
    }
}

/// Refreshes `id->route` (addresses and GIDs) from the CM.
fn refresh_route(id: &mut Id) {
    let mut bytes = [0u8; 312];
    if let Ok(Some(local)) = id.id.local_addr() {
        write_socket_address(&mut bytes[0..128], local);
    }
    if let Ok(Some(peer)) = id.id.peer_addr() {
        write_socket_address(&mut bytes[128..256], peer);
    }
    if let Ok(Some(route)) = id.id.route() {
        bytes[256..272].copy_from_slice(&route.sgid.raw());
        bytes[272..288].copy_from_slice(&route.dgid.raw());
        bytes[288..290].copy_from_slice(&0xffffu16.to_be_bytes());
    }
    // SAFETY: `route` is 312 plain bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), id.base.route.as_mut_ptr().cast::<u8>(), 312) };
}

fn port_space(code: c_int) -> Option<PortSpace> {
    Some(match code {
        RDMA_PS_TCP => PortSpace::Tcp,
        RDMA_PS_UDP => PortSpace::Udp,
        RDMA_PS_IB => PortSpace::Ib,
        RDMA_PS_IPOIB => PortSpace::Ipoib,
        _ => return None,
    })
}

fn new_channel(state: &CmState) -> Result<*mut Channel, rnic_verbs::cm::CmError> {
    let channel = state.cm.create_event_channel()?;
    let fd = channel.fd().as_raw_fd();
    // The channel's eventfd is made non-blocking; the application decides (librdmacm's
    // fd blocks until it sets O_NONBLOCK, which rdma_get_cm_event then honours). The CM
    // reads it only while its counter is non-zero, so it never blocks there.
    // SAFETY: fcntl on the channel's own descriptor.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(Box::into_raw(Box::new(Channel {
        base: rdma_event_channel { fd },
        channel,
        stash: Mutex::new(VecDeque::new()),
        waiters: AtomicUsize::new(0),
    })))
}

/// Wraps a CM id in our `Id` and lists it.
fn wrap_id(state: &CmState, id: CmId, channel: *mut Channel, context: *mut c_void, ps: c_int) -> *mut Id {
    let qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    let handle = id.handle();
    let pointer = Box::into_raw(Box::new(Id {
        base: rdma_cm_id {
            verbs: state.context as *mut ibv_context,
            channel: channel.cast(),
            context,
            qp: null_mut(),
            route: [0; 39],
            ps,
            port_num: 1,
            event: null_mut(),
            send_cq_channel: null_mut(),
            send_cq: null_mut(),
            recv_cq_channel: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            pd: null_mut(),
            qp_type,
        },
        id,
        sync_channel: None,
        own_cqs: false,
        own_pd: false,
        orphaned: false,
        unacked_events: AtomicUsize::new(0),
    }));
    state
        .ids
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(handle, pointer as usize);
    pointer
}

/// # Safety
/// `id` is null or an id of this library.
unsafe fn id_of<'a>(id: *mut rdma_cm_id) -> Option<&'a mut Id> {
    // SAFETY: the caller's promise; the C struct sits at offset 0 of `Id`.
    unsafe { id.cast::<Id>().as_mut() }
}

/// The next event of `channel`: the stash first, then the CM (blocking up to `timeout`).
fn next_event(channel: &Channel, timeout: Option<Duration>) -> Option<CmEvent> {
    if let Some(event) = channel.stash.lock().unwrap_or_else(|e| e.into_inner()).pop_front() {
        return Some(event);
    }
    match timeout {
        Some(t) if t.is_zero() => channel.channel.get_event(),
        Some(t) => channel.channel.wait_event(t),
        None => {
            channel.waiters.fetch_add(1, Ordering::AcqRel);
            let event = loop {
                if let Some(event) = channel.channel.wait_event(Duration::from_secs(3600)) {
                    break event;
                }
            };
            channel.waiters.fetch_sub(1, Ordering::AcqRel);
            Some(event)
        }
    }
}

/// Makes the C event of a CM event (new ids for connection requests). `None` for an
/// event of an id the application has destroyed meanwhile: the kernel drops those, and an
/// application handed one would find its context freed. With `counted`, the event counts
/// in its id's (a connection request: its listener's) unacknowledged events until freed.
fn c_event(state: &CmState, channel: *mut Channel, event: CmEvent, counted: bool) -> Option<*mut Event> {
    // Looked up and counted under the lock `rdma_destroy_id` forgets the id under: an id
    // found here is not freed before this event is acknowledged.
    let (known, listen_id, counted) = {
        let ids = state.ids.lock().unwrap_or_else(|e| e.into_inner());
        let listen_id = event
            .listen_id
            .as_ref()
            .and_then(|l| ids.get(&l.handle()).copied())
            .map_or(null_mut(), |p| p as *mut Id);
        let known = ids.get(&event.id.handle()).map(|&p| p as *mut Id);
        if known.is_none() && event.kind != CmEventKind::ConnectRequest {
            tracing::debug!(target: "rnic::cm", kind = ?event.kind, "an event of a destroyed id: dropped");
            return None;
        }
        let owner = if !counted {
            null_mut()
        } else if event.kind == CmEventKind::ConnectRequest {
            listen_id
        } else {
            known.unwrap_or(null_mut())
        };
        // SAFETY: listed ids are live, and stay so while the lock is held.
        if let Some(owner) = unsafe { owner.as_ref() } {
            owner.unacked_events.fetch_add(1, Ordering::AcqRel);
        }
        (known, listen_id, owner as *const Id)
    };
    let id = match known {
        Some(p) => p,
        None => {
            // A connection request's new id: on the listener's channel, with its context
            // and port space.
            // SAFETY: listed ids are live.
            let (context, ps, channel) = match unsafe { listen_id.as_ref() } {
                Some(l) => (l.base.context, l.base.ps, l.base.channel.cast::<Channel>()),
                None => (null_mut(), RDMA_PS_TCP, channel),
            };
            wrap_id(state, event.id.clone(), channel, context, ps)
        }
    };
    // SAFETY: live ids.
    unsafe {
        if let Some(id) = id.as_mut() {
            refresh_route(id);
        }
        if let Some(listen) = listen_id.as_mut() {
            refresh_route(listen);
        }
    }
    let mut boxed = Box::new(Event {
        base: rdma_cm_event {
            id: id.cast(),
            listen_id: listen_id.cast(),
            event: event.kind as c_int,
            status: event.status,
            param: [0; 7],
        },
        private_data: event.private_data.clone(),
        counted,
    });
    let data = if boxed.private_data.is_empty() {
        std::ptr::null()
    } else {
        boxed.private_data.as_ptr().cast::<c_void>()
    };
    let data_len = boxed.private_data.len().min(255) as u8;
    let param = boxed.base.param.as_mut_ptr().cast::<u8>();
    match &event.ud {
        Some(ud) => {
            let value = rdma_ud_param {
                private_data: data,
                private_data_len: data_len,
                ah_attr: ah_attributes_c(&ud.ah_attr),
                qp_num: ud.qp_num,
                qkey: ud.qkey,
            };
            // SAFETY: the 56-byte union holds an `rdma_ud_param`.
            unsafe { param.cast::<rdma_ud_param>().write_unaligned(value) };
        }
        None => {
            let c = &event.conn;
            let value = rdma_conn_param {
                private_data: data,
                private_data_len: data_len,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                flow_control: u8::from(c.flow_control),
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                srq: u8::from(c.srq),
                qp_num: c.qp_num,
            };
            // SAFETY: the union holds an `rdma_conn_param`.
            unsafe { param.cast::<rdma_conn_param>().write_unaligned(value) };
        }
    }
    Some(Box::into_raw(boxed))
}

/// A synchronous id's wait for `kind` (other events of other ids are stashed).
fn wait_for(state: &CmState, id: &mut Id, wanted: &[CmEventKind], verb: &str) -> c_int {
    let Some(channel) = id.sync_channel else { return 0 };
    // SAFETY: a synchronous id's private channel lives as long as the id.
    let channel = unsafe { &*channel };
    loop {
        let Some(event) = next_event(channel, None) else {
            return fail(verb, libc::ETIMEDOUT, "no event");
        };
        if event.id.handle() != id.id.handle() && event.listen_id.is_none() {
            channel.stash.lock().unwrap_or_else(|e| e.into_inner()).push_back(event);
            continue;
        }
        let kind = event.kind;
        let status = event.status;
        refresh_route(id);
        let _ = state;
        if wanted.contains(&kind) && status == 0 {
            return 0;
        }
        return fail(
            verb,
            if status < 0 { -status } else { libc::ECONNREFUSED },
            format!("{kind} (status {status})"),
        );
    }
}

// ---- the entry points ------------------------------------------------------------------------

macro_rules! with_state {
    ($verb:expr, $fail:expr) => {
        match state() {
            Ok(state) => state,
            Err((errno, why)) => {
                eprintln!("rnic: {}: {why}", $verb);
                set_errno(errno);
                return $fail;
            }
        }
    };
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn rnic_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard("rdma_create_event_channel", null_mut(), || {
        let state = with_state!("rdma_create_event_channel", null_mut());
        match new_channel(&state) {
            Ok(channel) => channel.cast(),
            Err(e) => {
                cm_fail("rdma_create_event_channel", &e);
                null_mut()
            }
        }
    })
}

/// `rdma_destroy_event_channel`. librdmacm closes the channel's descriptor, and Linux
/// then destroys every id still on it (`ucma_close`, as `rdma_destroy_id` would): a
/// connection the peer asked to end gets its DREP, a live one its DREQ, a pending request
/// its REJ. So here. qperf's server relies on it: it never destroys its connection's id,
/// only the listener and the channel, and its client waits for the DREP.
///
/// # Safety
/// A channel of this library.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if channel.is_null() {
        return;
    }
    guard("rdma_destroy_event_channel", (), || {
        if let Some(state) = STATE.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            let left = destroy_ids(&state, |id| id.sync_channel.is_none() && id.base.channel == channel);
            if left > 0 {
                tracing::debug!(target: "rnic::cm", left, "event channel destroyed with ids on it: destroyed them");
            }
        }
    });
    // SAFETY: allocated by Box in new_channel.
    let ours = unsafe { Box::from_raw(channel.cast::<Channel>()) };
    if ours.waiters.load(Ordering::Acquire) > 0 {
        // A thread is blocked in rdma_get_cm_event on it: it stays blocked, as on
        // librdmacm's closed descriptor, and must not wake in freed memory.
        tracing::debug!(target: "rnic::cm", "event channel destroyed under a waiting thread: kept");
        std::mem::forget(ours);
    }
}

/// `rdma_create_id`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard("rdma_create_id", -1, || {
        let state = with_state!("rdma_create_id", -1);
        if id.is_null() {
            return fail("rdma_create_id", libc::EINVAL, "NULL id pointer");
        }
        let Some(space) = port_space(ps) else {
            return fail("rdma_create_id", libc::EINVAL, format!("port space {ps:#x}"));
        };
        let (channel, sync) = if channel.is_null() {
            match new_channel(&state) {
                Ok(c) => (c, true),
                Err(e) => return cm_fail("rdma_create_id", &e),
            }
        } else {
            (channel.cast::<Channel>(), false)
        };
        // SAFETY: a channel of this library.
        let rust = match unsafe { &*channel }.channel.create_id(context as u64, space) {
            Ok(rust) => rust,
            Err(e) => return cm_fail("rdma_create_id", &e),
        };
        let pointer = wrap_id(&state, rust, channel, context, ps);
        if sync {
            // SAFETY: just made.
            unsafe {
                (*pointer).sync_channel = Some(channel);
                (*pointer).base.channel = null_mut();
            }
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *id = pointer.cast() };
        0
    })
}

fn forget(state: &CmState, id: &Id) {
    state
        .ids
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id.id.handle());
}

/// Frees what `rdma_create_qp` made for the id.
unsafe fn release_qp_resources(id: &mut Id) {
    if !id.base.qp.is_null() {
        // SAFETY: the QP wrapper rdma_create_qp made; its Arc is dropped first so the
        // CM can destroy the QP.
        let wrapper = unsafe { Box::from_raw(id.base.qp.cast::<Qp>()) };
        drop(wrapper);
        id.base.qp = null_mut();
        // An orphaned id's connection manager side, and its reference, are gone already.
        if !id.orphaned {
            if let Err(e) = id.id.destroy_qp() {
                diag!("rdma_destroy_qp: {e}");
            }
        }
    }
    if id.own_cqs {
        // SAFETY: the CQs and channels rdma_create_qp made.
        unsafe {
            crate::verbs::ibv_destroy_cq(id.base.send_cq);
            crate::verbs::ibv_destroy_cq(id.base.recv_cq);
            crate::verbs::ibv_destroy_comp_channel(id.base.send_cq_channel);
            crate::verbs::ibv_destroy_comp_channel(id.base.recv_cq_channel);
        }
        id.base.send_cq = null_mut();
        id.base.recv_cq = null_mut();
        id.base.send_cq_channel = null_mut();
        id.base.recv_cq_channel = null_mut();
        id.own_cqs = false;
    }
}

/// Makes the id's QP, if it still has one, an ordinary QP of the application that
/// `ibv_destroy_qp` destroys later (what the id made for it goes with it), so that the
/// QP outlives the id as it does with librdmacm. The connection manager's reference to
/// the QP goes when the id is destroyed.
///
/// # Safety
/// `id.base.qp` is null or the live QP wrapper `rdma_create_qp` made for `id`.
unsafe fn detach_qp(id: &mut Id) {
    // SAFETY: the caller's promise.
    let Some(wrapper) = (unsafe { id.base.qp.cast::<Qp>().as_mut() }) else {
        return;
    };
    wrapper.cm_owner = 0;
    let mut leftovers = CmLeftovers {
        send_cq: null_mut(),
        recv_cq: null_mut(),
        send_channel: null_mut(),
        recv_channel: null_mut(),
        pd: null_mut(),
    };
    if id.own_cqs {
        leftovers.send_cq = id.base.send_cq;
        leftovers.recv_cq = id.base.recv_cq;
        leftovers.send_channel = id.base.send_cq_channel;
        leftovers.recv_channel = id.base.recv_cq_channel;
        id.own_cqs = false;
    }
    if id.own_pd {
        leftovers.pd = id.base.pd;
        id.own_pd = false;
    }
    wrapper.cm_leftovers = Some(leftovers);
    id.base.qp = null_mut();
    id.base.send_cq = null_mut();
    id.base.recv_cq = null_mut();
    id.base.send_cq_channel = null_mut();
    id.base.recv_cq_channel = null_mut();
    id.base.pd = null_mut();
}

/// `rdma_destroy_id`.
///
/// # Safety
/// An id of this library.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || {
        let state = with_state!("rdma_destroy_id", -1);
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_destroy_id", libc::EINVAL, "NULL id");
        };
        // librdmacm's rdma_destroy_id leaves the id's QP alone: rping's server destroys
        // the id first and the QP afterwards with ibv_destroy_qp.
        // SAFETY: ours.
        unsafe { detach_qp(ours) };
        let result = if ours.orphaned {
            Err(rnic_verbs::cm::CmError::InvalidArgument(
                "its event channel was destroyed (and the id with it)".into(),
            ))
        } else {
            ours.id.destroy()
        };
        forget(&state, ours);
        // No event counts in the id from here on; wait for those handed out already.
        let kept = !wait_for_acknowledgements(ours);
        if ours.own_cqs {
            // SAFETY: ours, without a QP now.
            unsafe { release_qp_resources(ours) };
        }
        if ours.own_pd && !ours.base.pd.is_null() {
            // SAFETY: the PD we allocated for this id.
            unsafe { crate::verbs::ibv_dealloc_pd(ours.base.pd) };
        }
        if !kept {
            // SAFETY: allocated by Box in wrap_id; the application gives it up, and no
            // event refers to it any more.
            let boxed = unsafe { Box::from_raw(id.cast::<Id>()) };
            if let Some(channel) = boxed.sync_channel {
                // SAFETY: the private channel of a synchronous id.
                drop(unsafe { Box::from_raw(channel) });
            }
        }
        match result {
            Ok(()) => 0,
            Err(e) => cm_fail("rdma_destroy_id", &e),
        }
    })
}

/// Waits until the application has acknowledged every event of `id` that
/// `rdma_get_cm_event` handed out, as librdmacm's `rdma_destroy_id` does (rping's CM
/// thread may be handling DISCONNECTED while its main thread destroys the id). `false`
/// when they were not acknowledged within [`UNACKED_EVENTS_WAIT`]: then the id must be
/// kept (its events still point at it).
fn wait_for_acknowledgements(id: &Id) -> bool {
    let deadline = Instant::now() + UNACKED_EVENTS_WAIT;
    loop {
        let unacked = id.unacked_events.load(Ordering::Acquire);
        if unacked == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            diag!(
                "rdma_destroy_id: {unacked} event(s) of the id were never acknowledged \
                 (rdma_ack_cm_event); the id's memory is kept for them"
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `rdma_bind_addr`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_bind_addr(id: *mut rdma_cm_id, address: *const u8) -> c_int {
    guard("rdma_bind_addr", -1, || {
        // SAFETY: the caller's promise.
        let (Some(ours), Some(address)) = (unsafe { id_of(id) }, unsafe { socket_address(address) }) else {
            return fail("rdma_bind_addr", libc::EINVAL, "bad id or address");
        };
        match ours.id.bind_addr(address) {
            Ok(()) => {
                refresh_route(ours);
                0
            }
            Err(e) => cm_fail("rdma_bind_addr", &e),
        }
    })
}

/// `rdma_resolve_addr`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    source: *const u8,
    destination: *const u8,
    timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        let state = with_state!("rdma_resolve_addr", -1);
        // SAFETY: the caller's promise.
        let (Some(ours), Some(destination)) = (unsafe { id_of(id) }, unsafe { socket_address(destination) }) else {
            return fail("rdma_resolve_addr", libc::EINVAL, "bad id or destination");
        };
        // SAFETY: as above.
        let source = unsafe { socket_address(source) };
        match ours.id.resolve_addr(source, destination, timeout_ms.max(1) as u64) {
            Ok(()) => wait_for(&state, ours, &[CmEventKind::AddrResolved], "rdma_resolve_addr"),
            Err(e) => cm_fail("rdma_resolve_addr", &e),
        }
    })
}

/// `rdma_resolve_route`.
///
/// # Safety
/// A valid id.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let state = with_state!("rdma_resolve_route", -1);
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_resolve_route", libc::EINVAL, "NULL id");
        };
        match ours.id.resolve_route(timeout_ms.max(1) as u64) {
            Ok(()) => wait_for(&state, ours, &[CmEventKind::RouteResolved], "rdma_resolve_route"),
            Err(e) => cm_fail("rdma_resolve_route", &e),
        }
    })
}

/// `rdma_create_qp`: with the application's CQs, or new ones (with completion channels)
/// when `send_cq`/`recv_cq` are NULL; with the id's PD when `pd` is NULL.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_qp", -1, || {
        // SAFETY: the caller's promise.
        let (Some(ours), Some(init)) = (unsafe { id_of(id) }, unsafe { init.as_mut() }) else {
            return fail("rdma_create_qp", libc::EINVAL, "NULL id or attributes");
        };
        let context = ours.base.verbs;
        let mut pd = if pd.is_null() { ours.base.pd } else { pd };
        if pd.is_null() {
            // SAFETY: our own entry point on the id's context.
            pd = unsafe { crate::verbs::ibv_alloc_pd(context) };
            if pd.is_null() {
                return -1;
            }
            ours.own_pd = true;
        }
        ours.base.pd = pd;
        if init.send_cq.is_null() || init.recv_cq.is_null() {
            // SAFETY: our own entry points on the id's context.
            unsafe {
                let send_channel = crate::verbs::ibv_create_comp_channel(context);
                let recv_channel = crate::verbs::ibv_create_comp_channel(context);
                let send = crate::verbs::ibv_create_cq(
                    context,
                    init.cap.max_send_wr.max(1) as c_int,
                    id.cast(),
                    send_channel,
                    0,
                );
                let recv = crate::verbs::ibv_create_cq(
                    context,
                    init.cap.max_recv_wr.max(1) as c_int,
                    id.cast(),
                    recv_channel,
                    0,
                );
                if send.is_null() || recv.is_null() {
                    return fail("rdma_create_qp", libc::ENOMEM, "cannot make the id's CQs");
                }
                ours.base.send_cq_channel = send_channel;
                ours.base.recv_cq_channel = recv_channel;
                ours.base.send_cq = send;
                ours.base.recv_cq = recv;
                ours.own_cqs = true;
                init.send_cq = send;
                init.recv_cq = recv;
            }
        } else {
            ours.base.send_cq = init.send_cq;
            ours.base.recv_cq = init.recv_cq;
        }
        // SAFETY: objects of this library (the application's promise).
        let (pd_wrapper, send, recv, srq) = unsafe {
            (
                pd.cast::<Pd>().as_ref(),
                init.send_cq.cast::<Cq>().as_ref(),
                init.recv_cq.cast::<Cq>().as_ref(),
                init.srq.cast::<Srq>().as_ref(),
            )
        };
        let (Some(Some(rust_pd)), Some(Some(send)), Some(Some(recv))) = (
            pd_wrapper.map(|p| p.pd.as_ref()),
            send.map(|c| c.cq.as_ref()),
            recv.map(|c| c.cq.as_ref()),
        ) else {
            return fail("rdma_create_qp", libc::EINVAL, "bad PD or CQ");
        };
        let rust_srq = srq.and_then(|s| s.srq.as_ref());
        let attributes = CmQpInit {
            pd: Some(rust_pd),
            send_cq: Some(send),
            recv_cq: Some(recv),
            srq: rust_srq,
            cap: QpCapabilities {
                max_send_wr: init.cap.max_send_wr.max(64),
                max_recv_wr: if rust_srq.is_some() {
                    0
                } else {
                    init.cap.max_recv_wr.max(64)
                },
                max_send_sge: init.cap.max_send_sge.max(1),
                max_recv_sge: if rust_srq.is_some() {
                    0
                } else {
                    init.cap.max_recv_sge.max(1)
                },
                max_inline_data: init.cap.max_inline_data,
            },
            sq_sig_all: init.sq_sig_all != 0,
        };
        if let Err(e) = ours.id.create_qp(&attributes) {
            return cm_fail("rdma_create_qp", &e);
        }
        let Ok(Some(qp)) = ours.id.qp() else {
            return fail("rdma_create_qp", libc::EIO, "the connection manager made no QP");
        };
        let cap = qp.cap();
        init.cap = ibv_qp_cap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        let bounce = if cap.max_inline_data > 0 {
            match rust_pd.register_provider_memory(
                cap.max_inline_data.max(64) as usize,
                rnic_verbs::AccessFlags::LOCAL_WRITE,
            ) {
                Ok(mr) => Some(Mutex::new(mr)),
                Err(e) => return fail("rdma_create_qp", e.errno(), format!("inline staging buffer: {e}")),
            }
        } else {
            None
        };
        let number = qp.qp_num();
        let qp_type = match qp.qp_type() {
            rnic_verbs::QpType::Rc => IBV_QPT_RC,
            rnic_verbs::QpType::Uc => IBV_QPT_UC,
            rnic_verbs::QpType::Ud => IBV_QPT_UD,
        };
        let wrapper = Box::into_raw(Box::new(Qp {
            base: ibv_qp {
                context,
                qp_context: init.qp_context,
                pd,
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                srq: init.srq,
                handle: number,
                qp_num: number,
                state: qp.state() as c_int,
                qp_type,
                mutex: [0; 5],
                cond: [0; 6],
                events_completed: 0,
            },
            qp: Some(qp),
            bounce,
            max_inline: cap.max_inline_data,
            cm_owner: ours as *mut Id as usize,
            cm_leftovers: None,
        }));
        // SAFETY: the id's context is live.
        if let Some(ctx) = unsafe { ctx_of(context) } {
            ctx.open
                .objects
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .qps
                .insert(number, (wrapper as usize, ctx as *const _ as usize));
        }
        ours.base.qp = wrapper.cast();
        ours.base.qp_type = qp_type;
        0
    })
}

/// `rdma_create_qp_ex`: the `ibv_qp_init_attr_ex` form, for a PD and plain QPs.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    // SAFETY: the caller's promise.
    let Some(attr) = (unsafe { attr.as_mut() }) else {
        return fail("rdma_create_qp_ex", libc::EINVAL, "NULL attributes");
    };
    if attr.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
        return fail(
            "rdma_create_qp_ex",
            libc::EOPNOTSUPP,
            format!("comp_mask {:#x}: only a PD (no send_ops_flags, XRC)", attr.comp_mask),
        );
    }
    let pd = attr.pd;
    // SAFETY: the first 64 bytes are an `ibv_qp_init_attr`.
    unsafe { rnic_rdma_create_qp(id, pd, (attr as *mut ibv_qp_init_attr_ex).cast()) }
}

/// `ibv_destroy_qp` on a QP `rdma_create_qp` made (rping does that): what
/// `rdma_destroy_qp` does, keeping the id.
///
/// # Safety
/// `owner` is the live `Id` of the QP.
pub(crate) unsafe fn destroy_cm_qp(owner: usize) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { rnic_rdma_destroy_qp(owner as *mut rdma_cm_id) };
    0
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// A valid id.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    if let Some(ours) = unsafe { id_of(id) } {
        if !ours.base.qp.is_null() {
            // SAFETY: the QP wrapper of this id.
            let number = unsafe { (*ours.base.qp).qp_num };
            // SAFETY: the id's context is live.
            if let Some(ctx) = unsafe { ctx_of(ours.base.verbs) } {
                ctx.open
                    .objects
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .qps
                    .remove(&number);
            }
        }
        // SAFETY: ours.
        unsafe { release_qp_resources(ours) };
    }
}

/// # Safety
/// `param` is null or a live `rdma_conn_param`.
unsafe fn conn_param(param: *const rdma_conn_param) -> ConnParam {
    // SAFETY: the caller's promise.
    let Some(p) = (unsafe { param.as_ref() }) else {
        return ConnParam::default();
    };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: `private_data_len` bytes at `private_data` (the caller's promise).
        unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len)) }.to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    }
}

/// `rdma_connect`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_connect(id: *mut rdma_cm_id, param: *const rdma_conn_param) -> c_int {
    guard("rdma_connect", -1, || {
        let state = with_state!("rdma_connect", -1);
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_connect", libc::EINVAL, "NULL id");
        };
        // SAFETY: as above.
        let param = unsafe { conn_param(param) };
        match ours.id.connect(&param) {
            Ok(()) => wait_for(
                &state,
                ours,
                &[CmEventKind::Established, CmEventKind::ConnectResponse],
                "rdma_connect",
            ),
            Err(e) => cm_fail("rdma_connect", &e),
        }
    })
}

/// `rdma_listen`.
///
/// # Safety
/// A valid id.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_listen", libc::EINVAL, "NULL id");
        };
        match ours.id.listen(backlog.max(0) as u32) {
            Ok(()) => {
                refresh_route(ours);
                0
            }
            Err(e) => cm_fail("rdma_listen", &e),
        }
    })
}

/// `rdma_get_request`: the next connection request of a synchronous listening id.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    guard("rdma_get_request", -1, || {
        let state = with_state!("rdma_get_request", -1);
        // SAFETY: the caller's promise.
        let (Some(ours), false) = (unsafe { id_of(listen) }, id.is_null()) else {
            return fail("rdma_get_request", libc::EINVAL, "NULL id");
        };
        let Some(channel) = ours.sync_channel else {
            return fail(
                "rdma_get_request",
                libc::EINVAL,
                "the listening id has an event channel: use rdma_get_cm_event",
            );
        };
        loop {
            // SAFETY: the id's private channel.
            let Some(event) = next_event(unsafe { &*channel }, None) else {
                return fail("rdma_get_request", libc::ETIMEDOUT, "no request");
            };
            if event.kind != CmEventKind::ConnectRequest {
                continue;
            }
            let Some(c) = c_event(&state, channel, event, false) else {
                continue;
            };
            // SAFETY: just made.
            let new_id = unsafe { (*c).base.id.cast::<Id>() };
            // The new id is synchronous too, with a channel of its own.
            match new_channel(&state) {
                Ok(private) => {
                    // SAFETY: live objects of ours.
                    unsafe {
                        let _ = (*new_id).id.migrate(&(*private).channel);
                        (*new_id).sync_channel = Some(private);
                        (*new_id).base.channel = null_mut();
                        (*new_id).base.event = c.cast();
                        *id = new_id.cast();
                        return passive_qp(listen, new_id.cast());
                    }
                }
                Err(e) => return cm_fail("rdma_get_request", &e),
            }
        }
    })
}

/// `rdma_accept`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_accept(id: *mut rdma_cm_id, param: *const rdma_conn_param) -> c_int {
    guard("rdma_accept", -1, || {
        let state = with_state!("rdma_accept", -1);
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_accept", libc::EINVAL, "NULL id");
        };
        // SAFETY: as above.
        let param = unsafe { conn_param(param) };
        match ours.id.accept(&param) {
            Ok(()) => wait_for(&state, ours, &[CmEventKind::Established], "rdma_accept"),
            Err(e) => cm_fail("rdma_accept", &e),
        }
    })
}

/// `rdma_reject`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_reject(id: *mut rdma_cm_id, data: *const c_void, length: u8) -> c_int {
    guard("rdma_reject", -1, || {
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_reject", libc::EINVAL, "NULL id");
        };
        let data = if data.is_null() {
            Vec::new()
        } else {
            // SAFETY: `length` bytes (the caller's promise).
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(length)) }.to_vec()
        };
        match ours.id.reject(&data) {
            Ok(()) => 0,
            Err(e) => cm_fail("rdma_reject", &e),
        }
    })
}

/// `rdma_disconnect`.
///
/// # Safety
/// A valid id.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        // SAFETY: the caller's promise.
        let Some(ours) = (unsafe { id_of(id) }) else {
            return fail("rdma_disconnect", libc::EINVAL, "NULL id");
        };
        match ours.id.disconnect() {
            Ok(()) => 0,
            Err(e) => cm_fail("rdma_disconnect", &e),
        }
    })
}

/// `rdma_establish`.
///
/// # Safety
/// A valid id.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { id_of(id) }.map(|ours| ours.id.establish()) {
        Some(Ok(())) => 0,
        Some(Err(e)) => cm_fail("rdma_establish", &e),
        None => fail("rdma_establish", libc::EINVAL, "NULL id"),
    }
}

/// `rdma_get_cm_event`: blocks unless the channel's fd is non-blocking (then `EAGAIN`).
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        let state = with_state!("rdma_get_cm_event", -1);
        if channel.is_null() || event.is_null() {
            return fail("rdma_get_cm_event", libc::EINVAL, "NULL channel or event");
        }
        let ours = channel.cast::<Channel>();
        // SAFETY: a channel of this library.
        let fd = unsafe { (*channel).fd };
        // SAFETY: fcntl on the application's descriptor.
        let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        let timeout = if nonblocking { Some(Duration::ZERO) } else { None };
        loop {
            // SAFETY: as above.
            let Some(e) = next_event(unsafe { &*ours }, timeout) else {
                set_errno(libc::EAGAIN);
                return -1;
            };
            // An event of an id destroyed meanwhile is dropped: wait for the next one.
            if let Some(c) = c_event(&state, ours, e, true) {
                // SAFETY: the caller's out-pointer.
                unsafe { *event = c.cast() };
                return 0;
            }
        }
    })
}

/// `rdma_ack_cm_event`.
///
/// # Safety
/// An event of `rdma_get_cm_event`.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        return fail("rdma_ack_cm_event", libc::EINVAL, "NULL event");
    }
    // SAFETY: allocated by Box in c_event.
    drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    0
}

/// `rdma_set_option`: `RDMA_OPTION_ID_TOS` and `RDMA_OPTION_ID_AFONLY`; REUSEADDR and the
/// ACK timeout are accepted; others `ENOSYS`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    value: *const c_void,
    length: usize,
) -> c_int {
    // SAFETY: the caller's promise.
    let Some(ours) = (unsafe { id_of(id) }) else {
        return fail("rdma_set_option", libc::EINVAL, "NULL id");
    };
    match (level, name) {
        (0, 0) if length >= 1 && !value.is_null() => {
            // SAFETY: one byte of the caller's value.
            let tos = unsafe { *value.cast::<u8>() };
            match ours.id.set_tos(tos) {
                Ok(()) => 0,
                Err(e) => cm_fail("rdma_set_option", &e),
            }
        }
        // RDMA_OPTION_ID_AFONLY: an int, as the kernel's ucma takes it.
        (0, 2) => {
            if length != std::mem::size_of::<c_int>() || value.is_null() {
                return fail("rdma_set_option", libc::EINVAL, "AFONLY takes an int");
            }
            // SAFETY: an int of the caller's, its length checked above.
            let afonly = unsafe { value.cast::<c_int>().read_unaligned() } != 0;
            match ours.id.set_afonly(afonly) {
                Ok(()) => 0,
                Err(e) => cm_fail("rdma_set_option", &e),
            }
        }
        (0, 1 | 3) => 0,
        _ => fail("rdma_set_option", libc::ENOSYS, format!("option {level}/{name}")),
    }
}

/// `rdma_migrate_id`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    // SAFETY: the caller's promise.
    let (Some(ours), Some(target)) = (unsafe { id_of(id) }, unsafe { channel.cast::<Channel>().as_ref() }) else {
        return fail("rdma_migrate_id", libc::EINVAL, "NULL id or channel");
    };
    match ours.id.migrate(&target.channel) {
        Ok(()) => {
            ours.base.channel = channel;
            0
        }
        Err(e) => cm_fail("rdma_migrate_id", &e),
    }
}

/// `rdma_init_qp_attr`.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: the caller's promise.
    let (Some(ours), Some(attr), false) = (unsafe { id_of(id) }, unsafe { attr.as_mut() }, mask.is_null()) else {
        return fail("rdma_init_qp_attr", libc::EINVAL, "NULL argument");
    };
    let state = match attr.qp_state {
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        other => return fail("rdma_init_qp_attr", libc::EINVAL, format!("QP state {other}")),
    };
    match ours.id.init_qp_attr(state) {
        Ok((a, m)) => {
            crate::verbs::write_qp_attr(attr, &a);
            // SAFETY: the caller's out-pointer.
            unsafe { *mask = m.bits() as c_int };
            0
        }
        Err(e) => cm_fail("rdma_init_qp_attr", &e),
    }
}

/// `rdma_notify`: not needed (the QP's events reach the connection manager itself).
#[no_mangle]
pub extern "C" fn rnic_rdma_notify(_id: *mut rdma_cm_id, _event: c_int) -> c_int {
    0
}

/// `rdma_join_multicast` and friends: multicast is not supported.
#[no_mangle]
pub extern "C" fn rnic_rdma_join_multicast() -> c_int {
    fail("rdma_join_multicast", libc::EOPNOTSUPP, "multicast is not supported")
}

/// `rdma_leave_multicast`.
#[no_mangle]
pub extern "C" fn rnic_rdma_leave_multicast() -> c_int {
    fail("rdma_leave_multicast", libc::EOPNOTSUPP, "multicast is not supported")
}

fn id_port(id: *mut rdma_cm_id, local: bool) -> u16 {
    // SAFETY: the caller's id.
    let Some(ours) = (unsafe { id_of(id) }) else { return 0 };
    let address = if local {
        ours.id.local_addr()
    } else {
        ours.id.peer_addr()
    };
    address.ok().flatten().map_or(0, |a| a.port().to_be())
}

/// `rdma_get_src_port` (network order).
#[no_mangle]
pub extern "C" fn rnic_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    id_port(id, true)
}

/// `rdma_get_dst_port` (network order).
#[no_mangle]
pub extern "C" fn rnic_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    id_port(id, false)
}

/// `rdma_get_devices`: the CM's one context, NULL-terminated.
///
/// # Safety
/// `num` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let state = with_state!("rdma_get_devices", null_mut());
    // SAFETY: two pointers, freed by rdma_free_devices.
    let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: room for two.
    unsafe { *list = state.context as *mut ibv_context };
    if !num.is_null() {
        // SAFETY: the caller's promise.
        unsafe { *num = 1 };
    }
    list
}

/// `rdma_free_devices`.
///
/// # Safety
/// A list of `rdma_get_devices`.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: calloc'd by rdma_get_devices.
    unsafe { libc::free(list.cast()) }
}

/// `rdma_getaddrinfo`: numeric or resolvable host names and numeric services.
///
/// # Safety
/// Valid strings and pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    result: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if result.is_null() || (node.is_null() && service.is_null()) {
            return fail("rdma_getaddrinfo", libc::EINVAL, "no node and no service");
        }
        // SAFETY: the caller's NUL-terminated strings.
        let text =
            |p: *const c_char| (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        let (node, service) = (text(node), text(service));
        // SAFETY: the caller's promise.
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags);
        let port: u16 = match service.as_deref().map(str::parse) {
            None => 0,
            Some(Ok(port)) => port,
            Some(Err(_)) => {
                return fail(
                    "rdma_getaddrinfo",
                    libc::EINVAL,
                    format!("service {service:?} is not a port number"),
                )
            }
        };
        let passive = flags & RAI_PASSIVE != 0;
        let address = match node.as_deref() {
            None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            Some(name) => match (name, port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.find(|a| a.is_ipv4()).or(None))
            {
                Some(a) => a,
                None => match (name, port).to_socket_addrs().ok().and_then(|mut a| a.next()) {
                    Some(a) => a,
                    None => {
                        return fail(
                            "rdma_getaddrinfo",
                            libc::EADDRNOTAVAIL,
                            format!("cannot resolve {name:?}"),
                        )
                    }
                },
            },
        };
        let sockaddr = |a: SocketAddr| {
            // SAFETY: 128 zeroed bytes, freed by rdma_freeaddrinfo.
            let p = unsafe { libc::calloc(1, 128) }.cast::<u8>();
            if !p.is_null() {
                // SAFETY: 128 bytes.
                write_socket_address(unsafe { std::slice::from_raw_parts_mut(p, 128) }, a);
            }
            p
        };
        // SAFETY: one zeroed rdma_addrinfo, freed by rdma_freeaddrinfo.
        let info = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        if info.is_null() {
            return fail("rdma_getaddrinfo", libc::ENOMEM, "out of memory");
        }
        // SAFETY: just allocated.
        let i = unsafe { &mut *info };
        i.ai_flags = flags;
        i.ai_family = if address.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        i.ai_qp_type = hints.map_or(
            IBV_QPT_RC,
            |h| if h.ai_qp_type != 0 { h.ai_qp_type } else { IBV_QPT_RC },
        );
        i.ai_port_space = hints.map_or(RDMA_PS_TCP, |h| {
            if h.ai_port_space != 0 {
                h.ai_port_space
            } else {
                RDMA_PS_TCP
            }
        });
        if passive {
            i.ai_src_addr = sockaddr(address);
            i.ai_src_len = sockaddr_len(address);
        } else {
            i.ai_dst_addr = sockaddr(address);
            i.ai_dst_len = sockaddr_len(address);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *result = info };
        0
    })
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// A list of `rdma_getaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_freeaddrinfo(mut info: *mut rdma_addrinfo) {
    while !info.is_null() {
        // SAFETY: calloc'd by rdma_getaddrinfo, with its calloc'd addresses.
        unsafe {
            let next = (*info).ai_next;
            libc::free((*info).ai_src_addr.cast());
            libc::free((*info).ai_dst_addr.cast());
            libc::free(info.cast());
            info = next;
        }
    }
}

/// `rdma_create_ep`: a synchronous id, bound (passive) or resolved (active), with a QP
/// when `qp_init_attr` is given.
///
/// # Safety
/// Valid pointers.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    info: *const rdma_addrinfo,
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        // SAFETY: the caller's promise.
        let (Some(info), false) = (unsafe { info.as_ref() }, id.is_null()) else {
            return fail("rdma_create_ep", libc::EINVAL, "NULL argument");
        };
        let mut new_id = null_mut();
        // SAFETY: our own entry points, in librdmacm's order.
        unsafe {
            if rnic_rdma_create_id(null_mut(), &mut new_id, null_mut(), info.ai_port_space) != 0 {
                return -1;
            }
            let done = if info.ai_flags & RAI_PASSIVE != 0 {
                rnic_rdma_bind_addr(new_id, info.ai_src_addr)
            } else {
                let r = rnic_rdma_resolve_addr(new_id, info.ai_src_addr, info.ai_dst_addr, 2000);
                if r == 0 {
                    rnic_rdma_resolve_route(new_id, 2000)
                } else {
                    r
                }
            };
            if done != 0 {
                let errno = *libc::__errno_location();
                rnic_rdma_destroy_id(new_id);
                set_errno(errno);
                return -1;
            }
            if !pd.is_null() {
                (*new_id).pd = pd;
            }
            if !init.is_null() && info.ai_flags & RAI_PASSIVE == 0 && rnic_rdma_create_qp(new_id, pd, init) != 0 {
                let errno = *libc::__errno_location();
                rnic_rdma_destroy_id(new_id);
                set_errno(errno);
                return -1;
            }
            if !init.is_null() && info.ai_flags & RAI_PASSIVE != 0 {
                // A listening id keeps the attributes for the ids rdma_get_request returns.
                PASSIVE_QP
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(HashMap::new)
                    .insert(
                        new_id as usize,
                        (pd as usize, (*init).cap, (*init).qp_type, (*init).sq_sig_all),
                    );
            }
            *id = new_id;
        }
        0
    })
}

/// QP attributes of passive endpoints, for the ids their requests bring.
/// What a passive endpoint's QPs are made with: PD (address), caps, QP type, sq_sig_all.
type PassiveQp = (usize, ibv_qp_cap, c_int, c_int);

static PASSIVE_QP: Mutex<Option<HashMap<usize, PassiveQp>>> = Mutex::new(None);

/// `rdma_destroy_ep`.
///
/// # Safety
/// An id of `rdma_create_ep`.
#[no_mangle]
pub unsafe extern "C" fn rnic_rdma_destroy_ep(id: *mut rdma_cm_id) {
    if let Some(table) = PASSIVE_QP.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        table.remove(&(id as usize));
    }
    // SAFETY: forwarded.
    unsafe {
        rnic_rdma_destroy_qp(id);
        rnic_rdma_destroy_id(id);
    }
}

/// After `rdma_get_request` on a passive endpoint made with QP attributes: the new id
/// gets its QP, as librdmacm does.
///
/// # Safety
/// Live ids of this library.
unsafe fn passive_qp(listen: *mut rdma_cm_id, new_id: *mut rdma_cm_id) -> c_int {
    let entry = PASSIVE_QP
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|t| t.get(&(listen as usize)).copied());
    let Some((pd, cap, qp_type, sq_sig_all)) = entry else {
        return 0;
    };
    let mut init = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: null_mut(),
        recv_cq: null_mut(),
        srq: null_mut(),
        cap,
        qp_type,
        sq_sig_all,
    };
    // SAFETY: forwarded.
    unsafe { rnic_rdma_create_qp(new_id, pd as *mut ibv_pd, &mut init) }
}
