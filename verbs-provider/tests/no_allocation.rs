//! The data path allocates nothing: `post_send`, `post_recv`, `post_srq_recv` and `poll`
//! in a steady state, counted by a global allocator that counts the calls made on the
//! test's own thread.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{create_qp_with, open, to_rts_nowhere, to_state};
use rnic_verbs::{
    AccessFlags, QpCapabilities, QpState, QpType, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, SrqAttributes,
    WorkCompletion, WrOpcode,
};

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Forwards to the system allocator and counts allocations made while counting is on.
struct Counting;

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract; the
// counting touches only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's guarantees for `layout` are passed on as they are.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc`/`realloc` with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` and `layout` come from this allocator, as the caller guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn count() {
    // `try_with`: thread-locals may already be gone while a thread exits.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

/// Allocations made by `f` on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(|n| n.get())
}

#[test]
fn posting_and_polling_allocate_nothing() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let mr = pd.register_provider_memory(65536, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = context.create_cq(256, None, 0).unwrap();
    let qp = create_qp_with(
        &pd,
        &cq,
        QpType::Rc,
        QpCapabilities {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 128,
        },
    );
    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 1024,
            max_sge: 2,
            srq_limit: 0,
        })
        .unwrap();
    to_rts_nowhere(&qp);
    // In ERR every posted request comes straight back flushed: the whole loop of WQE
    // writing, doorbell, CQE and poll runs without a peer.
    to_state(&qp, QpState::Err).unwrap();
    let sges = [
        Sge::new(mr.addr(), 60, mr.lkey()),
        Sge::new(mr.addr() + 4096, 40, mr.lkey()),
        Sge::new(mr.addr() + 8192, 300, mr.lkey()),
        Sge::new(mr.addr() + 12288, 400, mr.lkey()),
    ];
    let sends = [
        SendWorkRequest {
            wr_id: 1,
            sg_list: &sges,
            send_flags: SendFlags::SIGNALED,
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 2,
            opcode: WrOpcode::SendWithImm,
            sg_list: &sges[..2],
            send_flags: SendFlags::INLINE,
            ..Default::default()
        },
        SendWorkRequest {
            wr_id: 3,
            opcode: WrOpcode::RdmaRead,
            sg_list: &sges[..1],
            ..Default::default()
        },
    ];
    let recvs = [RecvWorkRequest {
        wr_id: 4,
        sg_list: &sges[..2],
    }];
    let mut out = [WorkCompletion::default(); 8];
    let mut round = || {
        qp.post_send(&sends).unwrap();
        qp.post_recv(&recvs).unwrap();
        srq.post_srq_recv(&recvs).unwrap();
        let mut got = 0;
        while got < 4 {
            got += cq.poll(&mut out[got..]).unwrap();
        }
        assert_eq!(out[..4].iter().map(|wc| wc.wr_id).collect::<Vec<_>>(), [1, 2, 3, 4]);
    };
    // Warm up: the model's queues and buffers reach their working size.
    for _ in 0..50 {
        round();
    }
    let (mut posted, mut polled, mut post_allocations, mut poll_allocations) = (0, 0, 0, 0);
    for _ in 0..10 {
        // 20 rounds fill 60 of the 64 SQ slots and 20 RQ slots before anything is polled.
        post_allocations += allocations_in(|| {
            for _ in 0..20 {
                qp.post_send(&sends).unwrap();
                qp.post_recv(&recvs).unwrap();
                srq.post_srq_recv(&recvs).unwrap();
                posted += 5;
            }
        });
        poll_allocations += allocations_in(|| {
            while polled < posted / 5 * 4 {
                polled += cq.poll(&mut out[..3]).unwrap();
            }
        });
    }
    assert_eq!((posted, polled), (1000, 800));
    assert_eq!(post_allocations, 0, "allocations while posting 1000 work requests");
    // Polls that find completions publish the consumer index: set-CI doorbells included.
    assert_eq!(poll_allocations, 0, "allocations while polling 800 completions");
}

#[test]
fn rc_traffic_between_two_nics_allocates_nothing_end_to_end() {
    // Driver, transport and fabric together: WQEs out, frames across, CQEs back, polled.
    let [a, b] = rnic_verbs::demo::bring_up_two_nics().unwrap();
    let sge = [Sge::new(a.mr.addr(), 4096, a.mr.lkey())];
    let writes: Vec<SendWorkRequest<'_>> = (0..32)
        .map(|i| SendWorkRequest {
            wr_id: i,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &sge,
            send_flags: if i == 31 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            },
            rdma: rnic_verbs::RdmaFields {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            ..Default::default()
        })
        .collect();
    let mut out = [WorkCompletion::default(); 4];
    let mut round = || {
        a.qp.post_send(&writes).unwrap();
        while a.cq.poll(&mut out).unwrap() == 0 {}
        assert_eq!(out[0].wr_id, 31);
    };
    for _ in 0..50 {
        round();
    }
    let allocations = allocations_in(|| {
        for _ in 0..100 {
            round();
        }
    });
    assert_eq!(
        allocations, 0,
        "allocations in 3200 RDMA WRITEs of 4 KiB between two NICs"
    );
}
