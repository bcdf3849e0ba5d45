//! Memory per RC QP (issue 19, goal 4): what N connected QPs cost in this process — the
//! driver's objects, the host memory the driver allocates for the device (WQE rings,
//! context-table pages; in a real host that is RAM too), and the model's own per-QP state —
//! measured by a counting allocator at N = 1 024 and 16 384. The figures are recorded in
//! docs/benchmarks.md ("Memory per QP"); `cargo test --release -p rnic-testbench --test
//! qp_memory -- --nocapture` prints them. The checks bound them so that a regression (a
//! per-QP reservation growing with a window or a table) is seen.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use rnic_hw_model::fabric::FabricConfig;
use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::DeviceConfig;
use rnic_verbs::backend::{EmbeddedConfig, EmbeddedFabric};
use rnic_verbs::{AccessFlags, AhAttributes, Context, Mtu, QpCapabilities, QpInitAttributes, QpType, RcConnection};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: delegates to the system allocator; only counts the bytes live.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Live heap bytes per QP when `n` RC QPs of `depth` send and receive WRs (one CQ each
/// side for all of them) are created and connected, in RTS: (all, model only).
fn bytes_per_qp(n: usize, depth: u32) -> (f64, f64) {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let nic = |mac: [u8; 6]| {
        let device = fabric.add_nic_with_config(EmbeddedConfig {
            device: DeviceConfig::with_mac(mac),
            mmio_cost: Picoseconds::ZERO,
            ..EmbeddedConfig::default()
        });
        let context = Context::open(Box::new(device.clone())).unwrap();
        let pd = context.alloc_pd().unwrap();
        let cq = context.create_cq(1024, None, 0).unwrap();
        (device, context, pd, cq)
    };
    let a = nic([2, 0, 0, 0, 0, 1]);
    let b = nic([2, 0, 0, 0, 0, 2]);
    let model_before = a.0.with_device(|d| d.qp_state_bytes());
    let before = LIVE.load(Ordering::Relaxed);
    let caps = QpCapabilities {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(n);
    for _ in 0..n {
        let qp =
            a.2.create_qp(&QpInitAttributes {
                send_cq: &a.3,
                recv_cq: &a.3,
                srq: None,
                cap: caps,
                qp_type: QpType::Rc,
                sq_sig_all: true,
            })
            .unwrap();
        // The remote end need not exist for the local QP to reach RTS.
        qp.connect_rc(&RcConnection {
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: 0x100,
            rq_psn: 0,
            sq_psn: 0,
            ah_attr: AhAttributes {
                dgid: b.1.query_gid(1, 0).unwrap(),
                dmac: b.1.mac_address(),
                hop_limit: 64,
                ..AhAttributes::default()
            },
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
        })
        .unwrap();
        qps.push(qp);
    }
    let all = (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64;
    let model = (a.0.with_device(|d| d.qp_state_bytes()) - model_before) as f64 / n as f64;
    let _ = AccessFlags::LOCAL_WRITE;
    drop(qps);
    (all, model)
}

#[test]
fn memory_per_rc_qp_at_1024_and_16384_qps() {
    // rnic-bench's queue depth (2 × its window of 16) and perftest's default (128).
    for depth in [32, 128] {
        for n in [1024, 16384] {
            let (all, model) = bytes_per_qp(n, depth);
            println!("{n:>6} QPs, depth {depth:>3}: {all:>8.0} B/QP in all, {model:>7.0} B/QP of model state");
            // The host memory the WQE rings need is the floor: 64 B per send WQE and
            // 16 B per receive WQE (one SGE).
            assert!(all >= f64::from(depth) * 80.0, "{all}");
            assert!(model < 4096.0, "model state per QP {model} B");
            assert!(all < 64.0 * 1024.0, "{all} B per QP");
        }
    }
}
