//! The vfio-user server against a raw test client: negotiation, regions, config space,
//! BAR0, doorbells through the mmapped page, DMA into client memory, MSI-X eventfds,
//! reset and posted writes.

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;
use rnic_emu::os::{self, MappedRegion, Protection};
use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{Descriptor, DescriptorFlags, Opcode, ReturnCode};
use rnic_firmware_if::doorbell::{Doorbell, DB_OFFSET};
use rnic_firmware_if::pci::{self, offset};
use rnic_firmware_if::regs;

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn version_negotiation_advertises_our_limits_and_no_migration() {
    let server = start_server("version");
    let mut client = TestClient::connect(server.handle().socket());
    let json = client.negotiate();
    let caps = &json["capabilities"];
    assert_eq!(caps["max_msg_fds"], 16);
    assert_eq!(caps["max_data_xfer_size"], 1 << 20);
    assert_eq!(caps["max_dma_maps"], 65535);
    assert_eq!(caps["pgsizes"], 4096);
    assert!(caps.get("migration").is_none(), "migration is not offered");
    assert!(caps.get("write_multiple").is_none());
    // QEMU's acceptance rules (reference §1.4).
    assert!(caps["max_msg_fds"].as_u64().unwrap() <= 16);
    assert!(caps["max_data_xfer_size"].as_u64().unwrap() <= 64 << 20);
    // A second VERSION is refused; the connection carries on.
    assert_eq!(client.version(Some(QEMU_CAPS)).unwrap_err(), libc::EINVAL);
    client.assert_in_sync();
}

#[test]
fn socket_is_private_and_device_info_is_pci_with_reset() {
    let server = start_server("info");
    let mode = std::fs::metadata(server.handle().socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let mut client = TestClient::attach(server.handle().socket());
    let mut payload = 16u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&[0; 12]);
    let reply = client.request(GET_INFO, &payload, &[]).unwrap();
    assert_eq!(le32(&reply.payload, 0), 16);
    assert_eq!(le32(&reply.payload, 4), 0b11, "RESET | PCI");
    assert_eq!(le32(&reply.payload, 8), 9, "regions");
    assert_eq!(le32(&reply.payload, 12), 5, "irq indices");
    // MSI-X only: no INTx, no MSI.
    for (index, expected) in [(0u32, 0u32), (1, 0), (2, 6), (3, 0), (4, 0)] {
        let mut request = 16u32.to_le_bytes().to_vec();
        request.extend_from_slice(&0u32.to_le_bytes());
        request.extend_from_slice(&index.to_le_bytes());
        request.extend_from_slice(&0u32.to_le_bytes());
        let reply = client.request(GET_IRQ_INFO, &request, &[]).unwrap();
        assert_eq!(le32(&reply.payload, 12), expected, "irq index {index}");
        if index == MSIX_INDEX {
            assert_eq!(le32(&reply.payload, 4) & 1, 1, "EVENTFD");
        }
    }
}

#[test]
fn region_info_reports_the_bars_and_the_sparse_doorbell_area_with_its_fd() {
    let server = start_server("regions");
    let mut client = TestClient::attach(server.handle().socket());
    let expected: [(u32, u64, u32); 9] = [
        (0, regs::BAR0_SIZE, 0b11),
        (1, 0, 0),
        (2, 64 * 4096, 0b1111),
        (3, 0, 0),
        (4, regs::MSIX_BAR_SIZE, 0b11),
        (5, 0, 0),
        (6, 0, 0),
        (7, 4096, 0b11),
        (8, 0, 0),
    ];
    for (index, size, flags) in expected {
        let (payload, fds) = client.region_info(index, 256).unwrap();
        assert_eq!(le32(&payload, 8), index);
        assert_eq!(le64(&payload, 16), size, "region {index} size");
        assert_eq!(le32(&payload, 4), flags, "region {index} flags");
        assert_eq!(fds.len(), usize::from(index == 2), "region {index} fds");
    }
    let (payload, fds) = client.region_info(2, 256).unwrap();
    assert_eq!(le32(&payload, 0), 64, "argsz needed: 32 + 16 + 16");
    assert_eq!(le32(&payload, 12), 32, "cap_offset");
    assert_eq!(le16(&payload, 32), 1, "SPARSE_MMAP id");
    assert_eq!(le16(&payload, 34), 1, "version");
    assert_eq!(le32(&payload, 36), 0, "next");
    assert_eq!(le32(&payload, 40), 1, "nr_areas");
    assert_eq!((le64(&payload, 48), le64(&payload, 56)), (0, 64 * 4096));
    assert_eq!(le64(&payload, 24), 0, "mmap offset");
    let pages = map_doorbells(&fds[0], 64 * 4096);
    assert_eq!(pages.load_u64(DB_OFFSET as usize), Some(0));
    assert_eq!(client.region_info(9, 256).unwrap_err(), libc::EINVAL);
}

#[test]
fn config_space_and_bar0_identify_the_device() {
    let server = start_server("ident");
    let mut client = TestClient::attach(server.handle().socket());
    assert_eq!(client.config_read16(offset::VENDOR_ID as u64), pci::DEFAULT_VENDOR_ID);
    assert_eq!(client.config_read16(offset::DEVICE_ID as u64), pci::DEFAULT_DEVICE_ID);
    // QEMU reads the whole space at realize.
    let space = client.region_read(CONFIG_REGION, 0, 4096).unwrap();
    assert_eq!(le16(&space, 0), pci::DEFAULT_VENDOR_ID);
    assert_eq!(space[offset::INTERRUPT_PIN], 0, "no INTx");
    assert_eq!(space[usize::from(pci::MSIX_CAPABILITY_OFFSET)], pci::CAPABILITY_ID_MSIX);
    assert_eq!(
        le32(&space, usize::from(pci::MSIX_CAPABILITY_OFFSET) + 4) & 7,
        4,
        "MSI-X table in BAR4"
    );
    client.enable_device();
    assert_eq!(client.bar0_read32(regs::ID), regs::ID_MAGIC);
    assert_eq!(client.bar0_read32(regs::VERSION), regs::INTERFACE_VERSION);
    // A 64-bit read and a multi-dword read.
    let both = client.region_read(0, regs::ID, 8).unwrap();
    assert_eq!(le32(&both, 0), regs::ID_MAGIC);
    assert_eq!(le32(&both, 4), regs::INTERFACE_VERSION);
    let many = client.region_read(0, 0, 64).unwrap();
    assert_eq!(le32(&many, 0), regs::ID_MAGIC);
}

#[test]
fn a_doorbell_stored_in_the_mapped_page_reaches_the_device_without_a_message() {
    let server = start_server("doorbell");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    client.enable_device();
    let (_, fds) = client.region_info(2, 256).unwrap();
    let pages = map_doorbells(&fds[0], 64 * 4096);
    // VERSION, the config write and GET_REGION_INFO so far.
    let (before, settled) = handle.wait_for(WAIT, |s| s.messages == 3);
    assert!(settled, "{before:?}");
    let messages = before.messages;
    let received = |s: &rnic_emu::vfio_user::ServerStats| s.device.doorbells + s.device.doorbells_dropped;
    for n in 1..=3u16 {
        // The mmapped-doorbell rule: wait for the register to read 0, then store.
        let slot = DB_OFFSET as usize;
        assert!(eventually(WAIT, || pages.load_u64(slot) == Some(0)));
        assert!(pages.store_u64(slot, Doorbell::sq(0x10, n, 0).as_u64()));
    }
    let (stats, ok) = handle.wait_for(WAIT, |s| received(s) >= received(&before) + 3);
    assert!(ok, "three doorbells reached the device: {stats:?}");
    assert_eq!(stats.doorbells, before.doorbells + 3);
    assert_eq!(stats.messages, messages, "no socket message carried them");
    assert_eq!(pages.load_u64(DB_OFFSET as usize), Some(0), "taken and cleared");
}

/// Brings the command queue up through REGION_WRITEs with its ring in a DMA-mapped
/// memfd, runs QUERY_FW_VER and reads the firmware's answer in the client's memory.
#[test]
fn the_device_reads_and_writes_dma_mapped_client_memory() {
    const IOVA: u64 = 0x1_0000_0000;
    let server = start_server_with("dma", |o| o.device.firmware_version = 0x0002_0304);
    let mut client = TestClient::attach(server.handle().socket());
    let memory = os::memfd_create("test-guest-ram", 64 * 1024, true).unwrap();
    client.dma_map(Some(memory.as_fd()), 0, IOVA, 64 * 1024, 0b11).unwrap();
    assert_eq!(server.handle().wait_for(WAIT, |s| s.dma_maps == 1).0.dma_maps, 1);
    let ram = MappedRegion::map(memory.as_fd(), 0, 64 * 1024, Protection::READ_WRITE).unwrap();
    let descriptor = Descriptor::new(Opcode::QueryFirmwareVersion, DescriptorFlags::IN | DescriptorFlags::WR);
    assert!(ram.write_at(0, descriptor.bytes()));

    client.enable_device();
    client.bar0_write32(regs::CSQ_BASE_LOW, IOVA as u32);
    client.bar0_write32(regs::CSQ_BASE_HIGH, (IOVA >> 32) as u32);
    client.bar0_write32(regs::CSQ_DEPTH, 1);
    client.bar0_write32(regs::CSQ_CONSUMER_INDEX, 0);
    client.bar0_write32(regs::CSQ_PRODUCER_INDEX, 1);
    assert!(eventually(WAIT, || client.bar0_read32(regs::CSQ_CONSUMER_INDEX) == 1));

    let mut answer = Descriptor::zeroed();
    assert!(ram.read_at(0, answer.bytes_mut()));
    assert_eq!(ReturnCode::from_raw(answer.return_value()), ReturnCode::Success);
    assert!(answer.flags().contains(DescriptorFlags::OUT));
    assert_eq!(le32(answer.data(), 0), 0x0002_0304, "FW_VER written into client memory");
    assert_eq!(server.handle().stats().device.dma_errors, 0);
}

#[test]
fn dma_into_an_fdless_map_fails_cleanly_as_a_device_dma_error() {
    const IOVA: u64 = 0x2_0000_0000;
    let server = start_server("fdless");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    // QEMU sends ROMs and anonymous RAM like this: accepted, never touched.
    client.dma_map(None, 0, IOVA, 1 << 20, 0b11).unwrap();
    client.enable_device();
    client.bar0_write32(regs::CSQ_BASE_LOW, 0);
    client.bar0_write32(regs::CSQ_BASE_HIGH, (IOVA >> 32) as u32);
    client.bar0_write32(regs::CSQ_DEPTH, 1);
    client.bar0_write32(regs::CSQ_PRODUCER_INDEX, 1);
    assert!(eventually(WAIT, || client.bar0_read32(regs::FUNCTION_STATUS)
        & regs::STATUS_FATAL
        != 0));
    assert!(client.bar0_read32(regs::ABNORMAL_INT_STATUS) & regs::ABNORMAL_CMDQ_FATAL != 0);
    assert!(handle.wait_for(WAIT, |s| s.device.dma_errors >= 1).1);
    client.assert_in_sync();
}

/// Raises the abnormal vector (0): a producer-index write with no ring configured is a
/// command-queue fatal error.
fn raise_abnormal_vector(client: &mut TestClient) {
    client.bar0_write32(regs::CSQ_PRODUCER_INDEX, 1);
}

#[test]
fn msix_interrupts_arrive_on_the_eventfds_wired_with_set_irqs() {
    let server = start_server("msix");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    client.enable_device();
    client.enable_msix();
    client.bar0_write32(regs::ABNORMAL_INT_CONFIG, 1);
    client.bar0_write32(regs::ABNORMAL_INT_ENABLE, regs::ABNORMAL_CMDQ_FATAL);

    let vector0 = os::eventfd().unwrap();
    client
        .set_irqs(DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 0, 1, &[], &[vector0.as_fd()])
        .unwrap();
    raise_abnormal_vector(&mut client);
    assert_eq!(wait_eventfd(&vector0, WAIT), Some(1), "device interrupt on vector 0");

    // Masked: the interrupt stays pending (PBA) and arrives on unmask.
    client
        .set_irqs(DATA_NONE | ACTION_MASK, MSIX_INDEX, 0, 1, &[], &[])
        .unwrap();
    raise_abnormal_vector(&mut client);
    assert_eq!(wait_eventfd(&vector0, Duration::from_millis(50)), None);
    let pba = client.region_read(4, regs::MSIX_PBA_OFFSET, 8).unwrap();
    assert_eq!(le64(&pba, 0) & 1, 1, "pending bit of vector 0");
    client
        .set_irqs(DATA_BOOL | ACTION_UNMASK, MSIX_INDEX, 0, 1, &[1], &[])
        .unwrap();
    assert_eq!(
        wait_eventfd(&vector0, WAIT),
        Some(1),
        "pending interrupt delivered on unmask"
    );
    let pba = client.region_read(4, regs::MSIX_PBA_OFFSET, 8).unwrap();
    assert_eq!(le64(&pba, 0) & 1, 0);

    // Loopback trigger.
    client
        .set_irqs(DATA_NONE | ACTION_TRIGGER, MSIX_INDEX, 0, 1, &[], &[])
        .unwrap();
    assert_eq!(wait_eventfd(&vector0, WAIT), Some(1));

    // A sub-range, vector by vector as QEMU does without NORESIZE.
    let more: Vec<_> = (0..2).map(|_| os::eventfd().unwrap()).collect();
    client
        .set_irqs(
            DATA_EVENTFD | ACTION_TRIGGER,
            MSIX_INDEX,
            3,
            2,
            &[],
            &[more[0].as_fd(), more[1].as_fd()],
        )
        .unwrap();
    client
        .set_irqs(DATA_BOOL | ACTION_TRIGGER, MSIX_INDEX, 3, 2, &[0, 1], &[])
        .unwrap();
    assert_eq!(wait_eventfd(&more[1], WAIT), Some(1));
    assert_eq!(wait_eventfd(&more[0], Duration::from_millis(20)), None);
    assert_eq!(handle.wait_for(WAIT, |s| s.irq_eventfds == 3).0.irq_eventfds, 3);

    // De-assign a range (DATA_EVENTFD without fds), then disable all (count 0).
    client
        .set_irqs(DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 3, 1, &[], &[])
        .unwrap();
    assert_eq!(handle.wait_for(WAIT, |s| s.irq_eventfds == 2).0.irq_eventfds, 2);
    client
        .set_irqs(DATA_NONE | ACTION_TRIGGER, MSIX_INDEX, 0, 0, &[], &[])
        .unwrap();
    assert_eq!(handle.wait_for(WAIT, |s| s.irq_eventfds == 0).0.irq_eventfds, 0);
    raise_abnormal_vector(&mut client);
    assert_eq!(wait_eventfd(&vector0, Duration::from_millis(50)), None, "disabled");
}

#[test]
fn eventfds_wired_before_memory_decoding_take_effect_once_it_is_on() {
    let server = start_server("msix-early");
    let mut client = TestClient::attach(server.handle().socket());
    let vector0 = os::eventfd().unwrap();
    client
        .set_irqs(DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 0, 1, &[], &[vector0.as_fd()])
        .unwrap();
    client.enable_device();
    client.enable_msix();
    client.bar0_write32(regs::ABNORMAL_INT_CONFIG, 1);
    client.bar0_write32(regs::ABNORMAL_INT_ENABLE, regs::ABNORMAL_CMDQ_FATAL);
    raise_abnormal_vector(&mut client);
    assert_eq!(wait_eventfd(&vector0, WAIT), Some(1));
}

#[test]
fn posted_writes_get_no_reply_and_take_effect() {
    let server = start_server("posted");
    let mut client = TestClient::attach(server.handle().socket());
    client.enable_device();
    let mut payload = access(regs::CSQ_BASE_LOW, 0, 4);
    payload.extend_from_slice(&0x4000u32.to_le_bytes());
    client.send(REGION_WRITE, NO_REPLY, &payload, &[]);
    // The next reply is the read's: the posted write produced none.
    assert_eq!(client.bar0_read32(regs::CSQ_BASE_LOW), 0x4000);
}

#[test]
fn device_reset_returns_the_device_to_power_on_but_keeps_client_resources() {
    let server = start_server("reset");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    let memory = os::memfd_create("test-ram", 4096, true).unwrap();
    client.dma_map(Some(memory.as_fd()), 0, 0x10_0000, 4096, 0b11).unwrap();
    client.enable_device();
    client.bar0_write32(regs::CSQ_BASE_LOW, 0x8000);
    client.request(DEVICE_RESET, &[], &[]).unwrap();
    assert_eq!(
        client.config_read16(offset::COMMAND as u64),
        0,
        "decoding off after reset"
    );
    client.enable_device();
    assert_eq!(client.bar0_read32(regs::CSQ_BASE_LOW), 0);
    assert!(handle.wait_for(WAIT, |s| s.resets == 1 && s.dma_maps == 1).1);
    assert_eq!(client.request(DEVICE_RESET, &[0; 4], &[]).unwrap_err(), libc::EINVAL);
}

#[test]
fn dma_unmap_echoes_the_request_and_unmap_all_uses_bit_one() {
    let server = start_server("unmap");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    for i in 0..3u64 {
        client.dma_map(None, 0, 0x10_0000 * (i + 1), 0x1000, 0b01).unwrap();
    }
    let echo = client.dma_unmap(0, 0x10_0000, 0x1000).unwrap();
    assert_eq!(echo.len(), 24, "40-byte reply, as QEMU expects");
    assert_eq!(le64(&echo, 8), 0x10_0000);
    assert_eq!(handle.wait_for(WAIT, |s| s.dma_maps == 2).0.dma_maps, 2);
    client.dma_unmap(2, 0, 0).unwrap();
    assert_eq!(handle.wait_for(WAIT, |s| s.dma_maps == 0).0.dma_maps, 0);
}

#[test]
fn a_client_that_takes_no_descriptors_gets_a_trapped_doorbell_bar() {
    let server = start_server("no-fds");
    let mut client = TestClient::connect(server.handle().socket());
    client.version(Some(r#"{"capabilities":{"max_msg_fds":0}}"#)).unwrap();
    let (payload, fds) = client.region_info(2, 256).unwrap();
    assert_eq!(le32(&payload, 4), 0b11, "READ | WRITE, no MMAP");
    assert!(fds.is_empty());
    // Doorbells then go through REGION_WRITE, the trapped path.
    client.enable_device();
    let before = server.handle().stats().device;
    client
        .region_write(2, DB_OFFSET, &Doorbell::sq(0x10, 1, 0).as_u64().to_le_bytes())
        .unwrap();
    let (after, ok) = server.handle().wait_for(WAIT, |s| {
        s.device.doorbells + s.device.doorbells_dropped > before.doorbells + before.doorbells_dropped
    });
    assert!(ok, "{after:?}");
}

#[test]
fn an_unattached_server_sleeps_and_stops_at_once() {
    let server = start_server("idle");
    let handle = server.handle().clone();
    let (first, _) = handle.wait_for(WAIT, |s| s.poll_passes == 0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        handle.stats().poll_passes,
        first.poll_passes,
        "no polling without a client"
    );
    let start = std::time::Instant::now();
    server.stop().unwrap();
    assert!(start.elapsed() < Duration::from_millis(500), "stop wakes the loop");
    assert!(!handle.socket().exists(), "socket removed");
}
