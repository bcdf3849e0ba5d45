//! Create / query / destroy of every object kind, through registers only.

mod common;

use common::{assert_no_diagnostics, create_qp, open, open_with};
use rnic_firmware_if::context::mpt::index_to_key;
use rnic_firmware_if::context::{CqArmState, CqState, MptState};
use rnic_hw_model::mpt::MrAccess;
use rnic_hw_model::mtt;
use rnic_verbs::backend::{EmbeddedConfig, EmbeddedDevice, UserMemoryLayout};
use rnic_verbs::{AccessFlags, AhAttributes, Gid, MemoryRegion, QpType, SrqAttributeMask, SrqAttributes};

/// The bus address the device reaches for byte `offset` of `mr`, found by the model's
/// own MPT check and MTT walk.
fn device_address(device: &EmbeddedDevice, mr: &MemoryRegion, offset: u64) -> u64 {
    device.with_device(|d| {
        let translation = d
            .check_memory_access(mr.lkey(), mr.pd_number(), mr.addr() + offset, 1, MrAccess::LOCAL_WRITE)
            .expect("the device accepts the access");
        let mtr = translation.mtr.expect("a translated region");
        mtt::translate(&**device.memory(), &mtr, translation.offset).expect("translation")
    })
}

#[test]
fn protection_domains_are_numbered_above_the_reserved_range_and_reused() {
    let (_device, context) = open();
    let first = context.alloc_pd().unwrap();
    let second = context.alloc_pd().unwrap();
    assert!(first.pd_number() >= 1, "PD 0 is reserved");
    assert_ne!(first.pd_number(), second.pd_number());
    let freed = first.pd_number();
    first.dealloc().unwrap();
    assert_eq!(context.alloc_pd().unwrap().pd_number(), freed);
    drop(second);
}

#[test]
fn queue_pair_numbers_are_handed_out_round_robin_so_a_destroyed_number_is_not_reused_at_once() {
    // A peer's CM may still hold a connection from a destroyed QP's number; hns hands QP
    // numbers out round robin, and so does the driver.
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(16, None, 0).unwrap();
    let first = create_qp(&pd, &cq, QpType::Rc);
    let freed = first.qp_num();
    first.destroy().unwrap();
    let second = create_qp(&pd, &cq, QpType::Rc);
    assert_ne!(second.qp_num(), freed, "the number just freed is not handed back");
    assert_eq!(second.qp_num(), freed + 1);
    second.destroy().unwrap();
}

#[test]
fn a_protection_domain_in_use_cannot_be_deallocated() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let mr = pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let refused = pd.dealloc().unwrap_err();
    assert_eq!(refused.errno(), 16, "EBUSY");
    let pd = refused.object.expect("the PD is handed back");
    mr.deregister().unwrap();
    pd.dealloc().unwrap();
}

#[test]
fn provider_memory_region_is_one_large_page_and_the_device_agrees_on_the_mpt() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.register_provider_memory(64 * 1024, access).unwrap();

    assert_eq!(mr.lkey(), index_to_key(mr.mpt_index()));
    assert_eq!(mr.rkey(), mr.lkey());
    assert_eq!(
        mr.page_shift(),
        16,
        "64 KiB aligned contiguous buffer → one 64 KiB page"
    );
    assert_eq!(mr.hop(), 1);

    let mpt = mr.query_mpt().unwrap();
    assert_eq!(mpt.mpt_state(), Ok(MptState::Valid));
    assert_eq!(mpt.protection_domain(), pd.pd_number());
    assert_eq!(mpt.lkey(), mr.lkey());
    assert_eq!(mpt.virtual_address(), mr.addr());
    assert_eq!(mpt.length(), 64 * 1024);
    assert_eq!(mpt.pbl_size(), 1);
    assert!(mpt.local_write_enable() && mpt.remote_write_enable() && mpt.remote_read_enable());
    assert!(!mpt.atomic_enable());

    let pattern: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    mr.write(5000, &pattern).unwrap();
    let mut back = vec![0u8; pattern.len()];
    mr.read(5000, &mut back).unwrap();
    assert_eq!(back, pattern);
    assert_eq!(device_address(&device, &mr, 40_000), mr.pages()[9] + 40_000 % 4096);
    assert!(mr.read(64 * 1024 - 1, &mut [0; 2]).is_err(), "past the end");

    assert_eq!(mr.deregister().unwrap(), None);
    assert_eq!(context.chunks_in_use(), 0);
    assert_no_diagnostics(&device);
}

#[test]
fn application_memory_on_scattered_pages_is_translated_page_by_page() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let length = 20 * 4096 + 123;
    let bytes: Vec<u8> = (0..length).map(|i| (i * 7 % 256) as u8).collect();
    let mr = pd
        .register_user_memory(bytes.clone(), AccessFlags::LOCAL_WRITE)
        .unwrap();

    let pages = mr.pages().to_vec();
    assert_eq!(pages.len(), 21);
    assert!(
        pages.windows(2).any(|w| w[1] != w[0] + 4096),
        "the embedded backend scatters application pages"
    );
    assert_eq!(mr.page_shift(), 12);
    assert_eq!(mr.query_mpt().unwrap().pbl_size(), 21);

    // The device walks the driver's PBL to exactly the page the backend mapped.
    for (page, &address) in pages.iter().enumerate() {
        let offset = page as u64 * 4096 + 17;
        if offset < length as u64 {
            assert_eq!(device_address(&device, &mr, offset), address + 17, "page {page}");
        }
    }
    // The application's bytes are where the device looks.
    let mut seen = [0u8; 3];
    device.memory();
    mr.read(4096 * 7 + 1, &mut seen).unwrap();
    assert_eq!(seen, bytes[4096 * 7 + 1..4096 * 7 + 4]);

    mr.write(10, b"written by the provider").unwrap();
    let returned = mr.deregister().unwrap().expect("the application's bytes");
    assert_eq!(returned.len(), length);
    assert_eq!(&returned[10..33], b"written by the provider");
    assert_eq!(returned[5000], bytes[5000]);
    assert_eq!(device.user_registrations_in_use(), 0);
    assert_no_diagnostics(&device);
}

#[test]
fn contiguous_application_memory_gets_large_pages_and_two_hops_when_needed() {
    let (device, context) = open_with(EmbeddedConfig {
        user_memory_layout: UserMemoryLayout::Contiguous,
        ..EmbeddedConfig::default()
    });
    let pd = context.alloc_pd().unwrap();
    let mr = pd
        .register_user_memory(vec![0xAB; 4 << 20], AccessFlags::LOCAL_WRITE)
        .unwrap();
    // The first contiguous registration starts at a highly aligned bus address, so the
    // whole 4 MiB buffer is one page.
    assert_eq!(mr.page_shift(), 22, "4 MiB-aligned 4 MiB buffer → one 4 MiB page");
    assert_eq!(mr.query_mpt().unwrap().pbl_size(), 1);
    assert_eq!(device_address(&device, &mr, 3 << 20), mr.pages()[768]);
    mr.deregister().unwrap();

    // 600 scattered pages need more root entries than one 4 KiB BT page has at hop 1.
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let mr = pd
        .register_user_memory(vec![1; 600 * 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(mr.page_shift(), 12);
    assert_eq!(mr.hop(), 2);
    assert_eq!(device_address(&device, &mr, 599 * 4096), mr.pages()[599]);
    mr.deregister().unwrap();
    assert_no_diagnostics(&device);
}

#[test]
fn memory_region_arguments_are_checked() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let error = pd
        .register_provider_memory(4096, AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    assert_eq!(error.errno(), 22, "remote write needs local write: EINVAL");
    assert!(pd.register_provider_memory(0, AccessFlags::empty()).is_err());
    assert!(pd
        .register_user_memory_at(vec![0; 10], 0x1001, AccessFlags::empty())
        .is_err());
}

#[test]
fn completion_queue_depth_vector_and_context_round_trip() {
    let (device, context) = open();
    let channel = context.create_comp_channel();
    let cq = context.create_cq(100, Some(&channel), 1).unwrap();
    assert_eq!(cq.cqe(), 128, "rounded up to a power of two");
    let small = context.create_cq(1, None, 0).unwrap();
    assert_eq!(small.cqe(), 64, "at least 64 entries");

    let attributes = cq.query().unwrap();
    assert_eq!(attributes.cq_number, cq.cq_number());
    assert_eq!(attributes.cqe, 128);
    assert_eq!(attributes.comp_vector, 1);
    assert_eq!(attributes.state, CqState::Valid);
    assert_eq!(attributes.arm_state, CqArmState::NoArmed);
    assert_eq!(attributes.cqe_size, 64);

    cq.req_notify(false);
    assert_eq!(cq.query().unwrap().arm_state, CqArmState::NextCompletion);

    assert!(context.create_cq(1 << 30, None, 0).is_err(), "deeper than max_cqe");
    assert!(context.create_cq(64, None, 99).is_err(), "no such vector");

    cq.destroy().unwrap();
    small.destroy().unwrap();
    assert_eq!(context.chunks_in_use(), 0);
    assert_no_diagnostics(&device);
}

#[test]
fn a_completion_queue_used_by_a_queue_pair_cannot_be_destroyed() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let refused = cq.destroy().unwrap_err();
    assert_eq!(refused.errno(), 16, "EBUSY");
    let cq = refused.object.unwrap();
    qp.destroy().unwrap();
    cq.destroy().unwrap();
}

#[test]
fn shared_receive_queue_limit_is_modified_and_queried_from_the_device() {
    let (device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 100,
            max_sge: 3,
            srq_limit: 10,
        })
        .unwrap();
    assert_eq!(
        srq.attributes(),
        SrqAttributes {
            max_wr: 128,
            max_sge: 4,
            srq_limit: 10
        }
    );
    assert_eq!(srq.query().unwrap(), srq.attributes());
    let srqc = srq.query_context().unwrap();
    assert_eq!(srqc.srq_number(), srq.srq_number());
    assert_eq!(srqc.protection_domain(), pd.pd_number());

    srq.modify(
        &SrqAttributes {
            srq_limit: 32,
            ..SrqAttributes::default()
        },
        SrqAttributeMask::LIMIT,
    )
    .unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 32);
    assert!(srq.modify(&SrqAttributes::default(), SrqAttributeMask::MAX_WR).is_err());
    assert!(srq
        .modify(
            &SrqAttributes {
                srq_limit: 128,
                ..SrqAttributes::default()
            },
            SrqAttributeMask::LIMIT
        )
        .is_err());

    srq.destroy().unwrap();
    assert_eq!(context.chunks_in_use(), 0);
    assert_no_diagnostics(&device);
}

#[test]
fn address_handles_resolve_the_mac_of_a_link_local_gid() {
    let (_device, context) = open();
    let pd = context.alloc_pd().unwrap();
    let remote_mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    let dgid = Gid(rnic_verbs::driver::bringup::link_local_gid(remote_mac));
    let ah = pd
        .create_ah(&AhAttributes {
            dgid,
            sl: 3,
            ..AhAttributes::default()
        })
        .unwrap();
    assert_eq!(ah.attributes().dmac, remote_mac);
    assert_eq!(context.objects_in_use().address_handles, 1);
    ah.destroy().unwrap();
    assert_eq!(context.objects_in_use().address_handles, 0);

    assert!(pd
        .create_ah(&AhAttributes {
            sl: 8,
            ..AhAttributes::default()
        })
        .is_err());
    assert!(pd
        .create_ah(&AhAttributes {
            sgid_index: 200,
            ..AhAttributes::default()
        })
        .is_err());
}
