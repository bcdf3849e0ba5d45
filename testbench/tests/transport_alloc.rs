//! The data path allocates nothing per packet once warm: after a few rounds of traffic,
//! a round of SENDs, WRITEs, READs and atomics (thousands of frames through both devices
//! and the fabric) runs without a single heap allocation.

mod transport_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rnic_firmware_if::context::{Mtu, ServiceType};
use rnic_firmware_if::wqe::SqOpcode;
use rnic_testbench::harness::SendRequest;
use transport_common::*;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: delegates to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One round: 8 × (SEND 20 KiB, WRITE 20 KiB, READ 20 KiB, FAA), posted, then run.
fn round(c: &mut Connection, requests: &[SendRequest], measure: bool) -> u64 {
    let mb = c.mb;
    for i in 0..8u64 {
        c.recv_b(&[mb.sge(i * 0x8000, 0x8000)]);
    }
    for request in requests {
        let h = &mut c.pair.fabric.device_mut(c.pair.a).h;
        h.post_send(&mut c.qa, request);
    }
    let qa = c.qa.clone();
    c.pair.a().ring_send(&qa);
    ALLOCATIONS.store(0, Ordering::Relaxed);
    COUNTING.store(measure, Ordering::Relaxed);
    c.run();
    COUNTING.store(false, Ordering::Relaxed);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(c.cqes_a().len(), requests.len());
    assert_eq!(c.cqes_b().len(), 8);
    allocations
}

#[test]
fn steady_state_traffic_allocates_nothing() {
    // What is counted is the device's allocations: the coverage collector that
    // RNIC_COVERAGE would attach decodes every frame into owned fields, so not here (this
    // binary's one test: no other thread reads the environment).
    std::env::remove_var(rnic_testbench::coverage::ENVIRONMENT);
    let mut c = connect(ServiceType::Rc, Mtu::Mtu1024, false, |spec| spec.sq_shift = 7);
    let (ma, mb) = (c.ma, c.mb);
    let mut requests = Vec::new();
    for i in 0..8u64 {
        requests.push(SendRequest::new(SqOpcode::Send, vec![ma.sge(i * 0x8000, 20_000)]));
        requests.push(SendRequest::rdma(
            SqOpcode::RdmaWrite,
            vec![ma.sge(0x10_0000 + i * 0x8000, 20_000)],
            mb.at(0x10_0000 + i * 0x8000),
            mb.key,
        ));
        requests.push(SendRequest::rdma(
            SqOpcode::RdmaRead,
            vec![ma.sge(0x20_0000 + i * 0x8000, 20_000)],
            mb.at(0x20_0000 + i * 0x8000),
            mb.key,
        ));
        requests.push(SendRequest {
            swap_add: 1,
            ..SendRequest::rdma(
                SqOpcode::AtomFetchAndAdd,
                vec![ma.sge(0x30_0000 + i * 8, 8)],
                mb.at(0x30_0000),
                mb.key,
            )
        });
    }
    // Warm up until every pool (the device's and the fabric's) holds full-size buffers.
    for _ in 0..10 {
        round(&mut c, &requests, false);
    }
    let frames_before = c.pair.fabric.statistics().sent;
    let allocations = round(&mut c, &requests, true);
    let frames = c.pair.fabric.statistics().sent - frames_before;
    assert!(frames > 400, "{frames} frames");
    assert_eq!(allocations, 0, "{allocations} allocations for {frames} frames");
}
