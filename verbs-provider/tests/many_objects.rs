//! 10 000 objects created and destroyed: nothing leaks — not context-table chunks or BT
//! pages in the driver, not DMA memory in the backend, not L0 slots in the device.

mod common;

use std::time::Instant;

use common::{assert_no_diagnostics, open, small_caps, to_init};
use rnic_verbs::{AccessFlags, QpInitAttributes, QpType, SrqAttributes};

const EACH: usize = 2_500;

#[test]
fn ten_thousand_objects_come_and_go_without_leaks() {
    let started = Instant::now();
    let (device, context) = open();
    let baseline_driver = context.usage();
    let baseline_buffers = device.dma_buffers_in_use();
    let baseline_frames = device.mapped_frames();
    assert_eq!(device.with_device(|d| d.context_table_slots_in_use()), [0; 4]);

    let pd = context.alloc_pd().unwrap();
    let mut memory_regions = Vec::with_capacity(EACH);
    let mut completion_queues = Vec::with_capacity(EACH);
    let mut shared_receive_queues = Vec::with_capacity(EACH);
    let mut queue_pairs = Vec::with_capacity(EACH);
    for i in 0..EACH {
        let mr = if i % 2 == 0 {
            pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE)
        } else {
            pd.register_user_memory(vec![i as u8; 3 * 4096], AccessFlags::LOCAL_WRITE)
        };
        memory_regions.push(mr.unwrap());
        let cq = context
            .create_cq(64, None, (i % context.num_comp_vectors() as usize) as u32)
            .unwrap();
        let srq = pd
            .create_srq(&SrqAttributes {
                max_wr: 64,
                max_sge: 1,
                srq_limit: 0,
            })
            .unwrap();
        let qp = pd
            .create_qp(&QpInitAttributes {
                send_cq: &cq,
                recv_cq: &cq,
                srq: if i % 3 == 0 { Some(&srq) } else { None },
                cap: small_caps(),
                qp_type: [QpType::Rc, QpType::Uc, QpType::Ud][i % 3],
                sq_sig_all: false,
            })
            .unwrap();
        to_init(&qp);
        completion_queues.push(cq);
        shared_receive_queues.push(srq);
        queue_pairs.push(qp);
    }

    let live = context.objects_in_use();
    assert_eq!(live.memory_regions as usize, EACH);
    assert_eq!(live.completion_queues as usize, EACH);
    assert_eq!(live.shared_receive_queues as usize, EACH);
    assert_eq!(live.queue_pairs as usize, EACH);
    let busy = context.usage();
    assert!(busy.context_chunks > 0);
    let slots = device.with_device(|d| d.context_table_slots_in_use());
    assert_eq!(slots, busy.context_l0_slots, "driver and device agree on L0 slots");
    assert!(slots.iter().all(|&s| s > 0), "{slots:?}");
    let created = started.elapsed();

    // Tear down in an order unlike creation, so chunks empty out of order.
    for qp in queue_pairs.into_iter().rev() {
        qp.destroy().unwrap();
    }
    for (i, cq) in completion_queues.into_iter().enumerate() {
        if i % 2 == 0 {
            cq.destroy().unwrap();
        } else {
            drop(cq);
        }
    }
    while let Some(srq) = shared_receive_queues.pop() {
        srq.destroy().unwrap();
    }
    for mr in memory_regions {
        mr.deregister().unwrap();
    }
    pd.dealloc().unwrap();

    let after = context.usage();
    assert_eq!(context.chunks_in_use(), 0);
    assert_eq!(after.context_bt_pages, 0);
    assert_eq!(after.context_l0_slots, [0; 4]);
    assert_eq!(after.dma, baseline_driver.dma, "driver DMA back to its baseline");
    assert_eq!(device.dma_buffers_in_use(), baseline_buffers);
    assert_eq!(device.user_registrations_in_use(), 0);
    assert_eq!(device.mapped_frames(), baseline_frames);
    assert_eq!(device.with_device(|d| d.context_table_slots_in_use()), [0; 4]);
    assert_eq!(context.objects_in_use(), Default::default());
    assert_no_diagnostics(&device);
    eprintln!(
        "10 000 objects: created in {created:?}, all gone after {:?}; {} mailbox commands, {} cmdq commands",
        started.elapsed(),
        after.mailbox_commands,
        after.commands
    );

    // Closing the context releases everything else the driver held.
    drop(context);
    assert_eq!(device.dma_buffers_in_use(), 0);
    assert_eq!(device.mapped_frames(), 0);
    assert_no_diagnostics(&device);
}
