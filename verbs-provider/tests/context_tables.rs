//! Context tables at every hop count the device supports: objects spread over several
//! chunks come and go, the device finds every context through the driver's BT pages,
//! and the driver's accounting matches the device's L0 slots at every step.

mod common;

use common::{assert_no_diagnostics, create_qp, open_with, to_init};
use rnic_verbs::backend::{EmbeddedConfig, EmbeddedDevice};
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{AccessFlags, Context, QpType};

fn open_at_hop(hop: u8) -> (EmbeddedDevice, Context) {
    let device = EmbeddedDevice::with_config(EmbeddedConfig::default());
    let config = DriverConfig {
        context_hop: hop,
        ..DriverConfig::default()
    };
    let context = Context::open_with_config(Box::new(device.clone()), &config)
        .unwrap_or_else(|e| panic!("bring-up at hop {hop}: {e}"));
    (device, context)
}

fn assert_slots_agree(device: &EmbeddedDevice, context: &Context) {
    assert_eq!(
        device.with_device(|d| d.context_table_slots_in_use()),
        context.usage().context_l0_slots
    );
}

#[test]
fn objects_spanning_many_chunks_work_at_every_hop_count() {
    for hop in 0..=3u8 {
        let (device, context) = open_at_hop(hop);
        let pd = context.alloc_pd().unwrap();
        // 300 CQs and 300 MRs span several chunks: 4 KiB chunks of 64 entries with hops,
        // 16 KiB chunks at hop 0 (where 256 slots must reach 65536 objects directly).
        let cqs: Vec<_> = (0..300).map(|_| context.create_cq(64, None, 0).unwrap()).collect();
        let mrs: Vec<_> = (0..300)
            .map(|_| pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE).unwrap())
            .collect();
        let qps: Vec<_> = (0..40)
            .map(|i| {
                let qp = create_qp(&pd, &cqs[i], QpType::Rc);
                to_init(&qp);
                qp
            })
            .collect();
        assert!(context.chunks_in_use() >= 5, "hop {hop}: {:?}", context.usage());
        assert_slots_agree(&device, &context);

        // The device reads back what it stored through the driver's tables.
        for cq in cqs.iter().step_by(37) {
            assert_eq!(cq.query().unwrap().cq_number, cq.cq_number(), "hop {hop}");
        }
        for mr in mrs.iter().step_by(41) {
            assert_eq!(mr.query_mpt().unwrap().lkey(), mr.lkey(), "hop {hop}");
        }

        // Free every other object first, so chunks empty out of order.
        drop(qps);
        let (even, odd): (Vec<_>, Vec<_>) = cqs.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
        for (_, cq) in even {
            cq.destroy().unwrap();
        }
        assert_slots_agree(&device, &context);
        for (_, cq) in odd.into_iter().rev() {
            cq.destroy().unwrap();
        }
        for mr in mrs.into_iter().rev() {
            mr.deregister().unwrap();
        }
        let usage = context.usage();
        assert_eq!(usage.context_chunks, 0, "hop {hop}");
        assert_eq!(usage.context_bt_pages, 0, "hop {hop}");
        assert_eq!(device.with_device(|d| d.context_table_slots_in_use()), [0; 4]);
        assert_no_diagnostics(&device);
    }
}

#[test]
fn the_default_geometry_uses_one_level_and_4k_pages() {
    let (device, context) = open_with(EmbeddedConfig::default());
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Ud);
    to_init(&qp);
    let usage = context.usage();
    assert_eq!(usage.context_chunks, 2, "one QPC chunk and one CQC chunk");
    assert_eq!(usage.context_bt_pages, 2, "one level-0 BT page each");
    assert_eq!(usage.context_l0_slots, [1, 0, 1, 0]);
    assert_slots_agree(&device, &context);
}
