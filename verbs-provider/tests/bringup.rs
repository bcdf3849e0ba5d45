//! Bring-up: opening an embedded device through its registers only.

mod common;

use rnic_verbs::backend::EmbeddedDevice;
use rnic_verbs::device_access::{AccessError, DeviceAccess, DmaBuffer, UserMemory};
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{AccessFlags, Context, Gid, LinkLayer, Mtu, PortState, QpType};

#[test]
fn opening_a_device_reports_firmware_capabilities_port_and_gid() {
    let device = EmbeddedDevice::new();
    let mac = device.config().device.mac_address;
    let context = Context::open(Box::new(device.clone())).expect("bring-up");

    let attributes = context.query_device();
    assert_eq!(attributes.fw_ver, "1.0.0");
    assert!(attributes.max_qp >= 1024, "{attributes:?}");
    assert!(attributes.max_cq >= 1024);
    assert!(attributes.max_mr >= 1024);
    assert!(attributes.max_srq >= 1024);
    assert!(attributes.max_qp_wr >= 1024);
    assert!(attributes.max_sge >= 2);
    assert_eq!(attributes.phys_port_cnt, 1);

    let port = context.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert_eq!(port.active_mtu, Mtu::Mtu4096);
    assert!(port.gid_tbl_len >= 1);

    let gid = context.query_gid(1, 0).unwrap();
    assert!(gid.is_link_local());
    assert_eq!(gid.link_local_mac(), Some(mac));
    assert!(context.query_port(2).is_err());
}

#[test]
fn an_ipv4_address_makes_gid_0_ipv4_mapped_and_moves_the_link_local_gid_to_1() {
    let device = EmbeddedDevice::new();
    let config = DriverConfig {
        ipv4_address: Some([192, 168, 7, 9]),
        ..DriverConfig::default()
    };
    let context = Context::open_with_config(Box::new(device.clone()), &config).unwrap();
    let gid0 = context.query_gid(1, 0).unwrap();
    assert!(gid0.is_ipv4_mapped());
    assert_eq!(gid0.to_string(), "::ffff:192.168.7.9");
    assert!(context.query_gid(1, 1).unwrap().is_link_local());
    assert_eq!(context.query_gid(1, 2).unwrap(), Gid::default(), "empty entry");
    assert!(context.query_gid(1, 1000).is_err());
    let table = device.with_device(|d| d.gid_table().to_vec());
    assert_eq!(table[0].map(|e| e.gid), Some(gid0.raw()));
}

#[test]
fn both_mailbox_modes_drive_the_same_objects() {
    for event_mode in [false, true] {
        let device = EmbeddedDevice::new();
        let config = DriverConfig {
            mailbox_event_mode: event_mode,
            ..DriverConfig::default()
        };
        let context = Context::open_with_config(Box::new(device.clone()), &config).unwrap();
        let before = context.usage();
        let pd = context.alloc_pd().unwrap();
        let cq = context.create_cq(64, None, 0).unwrap();
        let mr = pd.register_provider_memory(8192, AccessFlags::LOCAL_WRITE).unwrap();
        let qp = common::create_qp(&pd, &cq, QpType::Ud);
        common::to_init(&qp);
        let after = context.usage();
        let mailboxes = after.mailbox_commands - before.mailbox_commands;
        let commands = after.commands - before.commands;
        if event_mode {
            assert_eq!(commands, mailboxes, "event mode: POST_MB only");
        } else {
            assert!(commands >= 2 * mailboxes, "poll mode: POST_MB plus QUERY_MB_ST");
        }
        qp.destroy().unwrap();
        mr.deregister().unwrap();
        cq.destroy().unwrap();
        common::assert_no_diagnostics(&device);
    }
}

/// A backend whose DMA allocator fails after a number of allocations.
struct FailingAllocations {
    inner: EmbeddedDevice,
    remaining: std::sync::atomic::AtomicUsize,
}

impl DeviceAccess for FailingAllocations {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.inner.config_read(offset, data)
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        self.inner.config_write(offset, data)
    }
    fn mmio_read32(&self, bar: u8, offset: u64) -> u32 {
        self.inner.mmio_read32(bar, offset)
    }
    fn mmio_write32(&self, bar: u8, offset: u64, value: u32) {
        self.inner.mmio_write32(bar, offset, value)
    }
    fn mmio_write64(&self, bar: u8, offset: u64, value: u64) {
        self.inner.mmio_write64(bar, offset, value)
    }
    fn allocate_dma(&self, size: usize, align: usize) -> Result<DmaBuffer, AccessError> {
        use std::sync::atomic::Ordering;
        if self.remaining.load(Ordering::Relaxed) == 0 {
            return Err(AccessError::OutOfMemory { size, align });
        }
        self.remaining.fetch_sub(1, Ordering::Relaxed);
        self.inner.allocate_dma(size, align)
    }
    fn free_dma(&self, buffer: DmaBuffer) {
        self.inner.free_dma(buffer)
    }
    fn dma_read(&self, address: u64, out: &mut [u8]) -> Result<(), AccessError> {
        self.inner.dma_read(address, out)
    }
    fn dma_write(&self, address: u64, data: &[u8]) -> Result<(), AccessError> {
        self.inner.dma_write(address, data)
    }
    fn register_user_memory(&self, bytes: Vec<u8>) -> Result<UserMemory, AccessError> {
        self.inner.register_user_memory(bytes)
    }
    fn unregister_user_memory(&self, memory: UserMemory) -> Vec<u8> {
        self.inner.unregister_user_memory(memory)
    }
    fn delay(&self, nanoseconds: u64) {
        self.inner.delay(nanoseconds)
    }
    fn poll_interrupts(&self) -> Vec<u16> {
        self.inner.poll_interrupts()
    }
    fn wait_interrupt(&self, timeout_ns: u64) -> Vec<u16> {
        self.inner.wait_interrupt(timeout_ns)
    }
    fn mac_address(&self) -> Option<[u8; 6]> {
        self.inner.mac_address()
    }
}

#[test]
fn a_bring_up_that_runs_out_of_memory_gives_everything_back() {
    // Fail at every point bring-up allocates: ring, mailbox buffers, EQ buffers and BTs.
    let mut succeeded = false;
    for allowed in 0..20 {
        let device = EmbeddedDevice::new();
        let access = FailingAllocations {
            inner: device.clone(),
            remaining: allowed.into(),
        };
        match Context::open(Box::new(access)) {
            Ok(context) => {
                succeeded = true;
                drop(context);
            }
            Err(e) => {
                assert_eq!(e.errno(), 5, "EIO: {e}");
                assert_eq!(device.dma_buffers_in_use(), 0, "after failing with {allowed}");
            }
        }
        assert_eq!(device.dma_buffers_in_use(), 0);
    }
    assert!(succeeded, "bring-up succeeds once enough buffers are available");
}
