//! The data path the inline functions of `verbs.h` jump to through `ibv_context.ops`:
//! `post_send`, `post_recv`, `post_srq_recv`, `poll_cq`, `req_notify_cq`. Work requests
//! are converted in batches on the stack; SGE arrays are handed over as they are
//! (`rnic_verbs::Sge` is laid out as `ibv_sge`).

use std::ffi::c_int;

use rnic_verbs::{
    AtomicFields, PostError, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, UdFields, WcFlags,
    WorkCompletion, WrOpcode,
};

use crate::abi::*;
use crate::verbs::{Ah, Cq, Qp, Srq};
use crate::{diag, guard};

/// Work requests converted per call into the Rust API.
const BATCH: usize = 16;

/// # Safety
/// `list` is null or points at `count` SGEs the application keeps valid for the call.
unsafe fn sges<'a>(list: *const ibv_sge, count: c_int) -> Result<&'a [Sge], String> {
    match (count, list.is_null()) {
        (0, _) => Ok(&[]),
        (n, false) if n > 0 => {
            // SAFETY: `rnic_verbs::Sge` is `#[repr(C)]` with the fields of `ibv_sge`; the
            // caller's promise covers the `count` entries.
            Ok(unsafe { std::slice::from_raw_parts(list.cast::<Sge>(), n as usize) })
        }
        (n, _) => Err(format!("num_sge {n} with sg_list {list:p}")),
    }
}

fn opcode(value: c_int) -> Result<WrOpcode, String> {
    Ok(match value {
        0 => WrOpcode::RdmaWrite,
        1 => WrOpcode::RdmaWriteWithImm,
        2 => WrOpcode::Send,
        3 => WrOpcode::SendWithImm,
        4 => WrOpcode::RdmaRead,
        5 => WrOpcode::AtomicCmpSwp,
        6 => WrOpcode::AtomicFetchAdd,
        9 => WrOpcode::SendWithInv,
        7 => return Err("IBV_WR_LOCAL_INV is not supported".into()),
        8 => return Err("IBV_WR_BIND_MW: memory windows are not supported".into()),
        10 => return Err("IBV_WR_TSO is not supported".into()),
        15 => return Err("IBV_WR_ATOMIC_WRITE is not supported".into()),
        other => return Err(format!("work request opcode {other} is not supported")),
    })
}

/// One C send work request as ours; `ah` keeps the address handle borrowed.
///
/// # Safety
/// `wr` is a live work request of the application.
unsafe fn convert_send<'a>(wr: &'a ibv_send_wr, ud: bool) -> Result<SendWorkRequest<'a>, String> {
    let op = opcode(wr.opcode)?;
    let known = SendFlags::all().bits();
    // IBV_SEND_IP_CSUM (16) only matters for raw packet QPs, which do not exist here.
    if wr.send_flags & !(known | 16) != 0 {
        return Err(format!("send flags {:#x}", wr.send_flags & !(known | 16)));
    }
    // SAFETY: the caller's promise covers the SGE list.
    let sg_list = unsafe { sges(wr.sg_list, wr.num_sge) }?;
    let mut request = SendWorkRequest {
        wr_id: wr.wr_id,
        opcode: op,
        sg_list,
        send_flags: SendFlags::from_bits_truncate(wr.send_flags),
        imm_data: u32::from_be(wr.imm_data),
        invalidate_rkey: wr.imm_data,
        ..SendWorkRequest::default()
    };
    request.rdma = RdmaFields {
        remote_addr: wr.wr[0],
        rkey: wr.wr[1] as u32,
    };
    request.atomic = AtomicFields {
        remote_addr: wr.wr[0],
        compare_add: wr.wr[1],
        swap: wr.wr[2],
        rkey: wr.wr[3] as u32,
    };
    if !ud {
        return Ok(request);
    }
    let ah = wr.wr[0] as *mut Ah;
    // SAFETY: on a UD QP `wr.ud.ah` is an address handle of this library (the
    // application's promise).
    if let Some(handle) = unsafe { ah.as_ref() }.and_then(|a| a.ah.as_ref()) {
        request.ud = Some(UdFields {
            ah: handle,
            remote_qpn: wr.wr[1] as u32,
            remote_qkey: (wr.wr[1] >> 32) as u32,
        });
    }
    Ok(request)
}

/// Stages an inline payload in the QP's bounce region and posts that one request.
///
/// # Safety
/// The request's SGEs point at bytes the application keeps valid for the call.
unsafe fn post_inline(qp: &Qp, request: &SendWorkRequest<'_>) -> Result<(), c_int> {
    let (Some(rust), Some(bounce)) = (&qp.qp, &qp.bounce) else {
        diag!("ibv_post_send: IBV_SEND_INLINE on a QP created with max_inline_data 0");
        return Err(libc::EINVAL);
    };
    let total: u64 = request.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(qp.max_inline) {
        diag!("ibv_post_send: {total} inline bytes, the QP takes {}", qp.max_inline);
        return Err(libc::EINVAL);
    }
    let region = bounce.lock().unwrap_or_else(|e| e.into_inner());
    let mut staged = [0u8; 1024];
    let mut offset = 0u64;
    for sge in request.sg_list {
        let mut done = 0usize;
        while done < sge.length as usize {
            let n = (sge.length as usize - done).min(staged.len());
            // SAFETY: inline SGEs are plain addresses of this process that the
            // application keeps readable for the call (ibverbs: no registration needed).
            unsafe { std::ptr::copy_nonoverlapping((sge.addr as usize + done) as *const u8, staged.as_mut_ptr(), n) };
            if region.write(offset, &staged[..n]).is_err() {
                return Err(libc::EFAULT);
            }
            offset += n as u64;
            done += n;
        }
    }
    let sge = [Sge::new(region.addr(), total as u32, region.lkey())];
    let staged_request = SendWorkRequest {
        sg_list: if total == 0 { &[] } else { &sge },
        ..*request
    };
    rust.post_send(&[staged_request]).map_err(|e| {
        diag!("ibv_post_send: {e}");
        e.errno()
    })
}

fn report(verb: &str, error: &PostError) -> c_int {
    // A full queue is ordinary back-pressure, not misuse.
    if error.errno() != libc::ENOMEM {
        diag!("{verb}: {error}");
    }
    error.errno()
}

/// `ops.post_send`.
pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        // SAFETY: the application's QP.
        let Some(wrapper) = (unsafe { qp.cast::<Qp>().as_ref() }) else {
            return libc::EINVAL;
        };
        let fail = |at: *mut ibv_send_wr, errno: c_int| {
            if !bad_wr.is_null() {
                // SAFETY: the application's out-pointer.
                unsafe { *bad_wr = at };
            }
            errno
        };
        let Some(rust) = &wrapper.qp else {
            return fail(wr, libc::EINVAL);
        };
        let ud = wrapper.base.qp_type == IBV_QPT_UD;
        let mut current = wr;
        while !current.is_null() {
            let mut batch: [SendWorkRequest<'_>; BATCH] = [SendWorkRequest::default(); BATCH];
            let mut sources = [std::ptr::null_mut::<ibv_send_wr>(); BATCH];
            let mut count = 0;
            let mut inline = None;
            while count < BATCH && !current.is_null() {
                // SAFETY: a live work request of the application's list.
                let c_wr = unsafe { &*current };
                // SAFETY: as above.
                match unsafe { convert_send(c_wr, ud) } {
                    Ok(request) if request.send_flags.contains(SendFlags::INLINE) && !request.opcode.is_atomic() => {
                        inline = Some((request, current));
                        current = c_wr.next;
                        break;
                    }
                    Ok(request) => {
                        batch[count] = request;
                        sources[count] = current;
                        count += 1;
                        current = c_wr.next;
                    }
                    Err(why) => {
                        if count > 0 {
                            if let Err(e) = rust.post_send(&batch[..count]) {
                                return fail(sources[e.index_of_bad_wr], report("ibv_post_send", &e));
                            }
                        }
                        diag!("ibv_post_send: {why}");
                        return fail(current, libc::EINVAL);
                    }
                }
            }
            if count > 0 {
                if let Err(e) = rust.post_send(&batch[..count]) {
                    return fail(sources[e.index_of_bad_wr], report("ibv_post_send", &e));
                }
            }
            if let Some((request, source)) = inline {
                // SAFETY: the application's inline buffers, valid for the call.
                if let Err(errno) = unsafe { post_inline(wrapper, &request) } {
                    return fail(source, errno);
                }
            }
        }
        0
    })
}

/// Posts a receive list to `post` in batches.
fn post_receives(
    verb: &str,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl Fn(&[RecvWorkRequest<'_>]) -> Result<(), PostError>,
) -> c_int {
    let fail = |at: *mut ibv_recv_wr, errno: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: the application's out-pointer.
            unsafe { *bad_wr = at };
        }
        errno
    };
    let mut current = wr;
    while !current.is_null() {
        let mut batch: [RecvWorkRequest<'_>; BATCH] = [RecvWorkRequest::default(); BATCH];
        let mut sources = [std::ptr::null_mut::<ibv_recv_wr>(); BATCH];
        let mut count = 0;
        let mut bad = None;
        while count < BATCH && !current.is_null() {
            // SAFETY: a live work request of the application's list.
            let c_wr = unsafe { &*current };
            // SAFETY: as above, with its SGE list.
            match unsafe { sges(c_wr.sg_list, c_wr.num_sge) } {
                Ok(sg_list) => {
                    batch[count] = RecvWorkRequest {
                        wr_id: c_wr.wr_id,
                        sg_list,
                    };
                    sources[count] = current;
                    count += 1;
                    current = c_wr.next;
                }
                Err(why) => {
                    bad = Some((current, why));
                    break;
                }
            }
        }
        if count > 0 {
            if let Err(e) = post(&batch[..count]) {
                return fail(sources[e.index_of_bad_wr], report(verb, &e));
            }
        }
        if let Some((at, why)) = bad {
            diag!("{verb}: {why}");
            return fail(at, libc::EINVAL);
        }
    }
    0
}

/// `ops.post_recv`.
pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        // SAFETY: the application's QP.
        match unsafe { qp.cast::<Qp>().as_ref() }.and_then(|q| q.qp.as_ref()) {
            Some(rust) => post_receives("ibv_post_recv", wr, bad_wr, |batch| rust.post_recv(batch)),
            None => libc::EINVAL,
        }
    })
}

/// `ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: the application's SRQ.
        match unsafe { srq.cast::<Srq>().as_ref() }.and_then(|s| s.srq.as_ref()) {
            Some(rust) => post_receives("ibv_post_srq_recv", wr, bad_wr, |batch| rust.post_srq_recv(batch)),
            None => libc::EINVAL,
        }
    })
}

fn c_wc(wc: &WorkCompletion) -> ibv_wc {
    let imm_data = if wc.wc_flags.contains(WcFlags::WITH_IMM) {
        wc.imm_data.to_be()
    } else if wc.wc_flags.contains(WcFlags::WITH_INV) {
        wc.invalidated_rkey
    } else {
        0
    };
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status as c_int,
        opcode: wc.opcode as c_int,
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm_data,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: wc.wc_flags.bits(),
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

/// `ops.poll_cq`: the number of completions written, or −1.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard("ibv_poll_cq", -1, || {
        // SAFETY: the application's CQ.
        let Some(rust) = (unsafe { cq.cast::<Cq>().as_ref() }).and_then(|c| c.cq.as_ref()) else {
            return -1;
        };
        if entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let wanted = entries as usize;
        let mut buffer = [WorkCompletion::default(); BATCH];
        let mut total = 0usize;
        while total < wanted {
            let chunk = (wanted - total).min(BATCH);
            match rust.poll(&mut buffer[..chunk]) {
                Ok(got) => {
                    for (i, completion) in buffer[..got].iter().enumerate() {
                        // SAFETY: the application's array of `entries` completions.
                        unsafe { wc.add(total + i).write(c_wc(completion)) };
                    }
                    total += got;
                    if got < chunk {
                        break;
                    }
                }
                Err(e) => {
                    diag!("ibv_poll_cq: {e}");
                    return if total > 0 { total as c_int } else { -1 };
                }
            }
        }
        total as c_int
    })
}

/// `ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard("ibv_req_notify_cq", libc::EIO, || {
        // SAFETY: the application's CQ.
        match unsafe { cq.cast::<Cq>().as_ref() }.and_then(|c| c.cq.as_ref()) {
            Some(rust) => {
                rust.req_notify(solicited_only != 0);
                0
            }
            None => libc::EINVAL,
        }
    })
}
