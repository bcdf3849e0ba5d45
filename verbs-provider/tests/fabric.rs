//! Several embedded NICs on one fabric: one virtual clock that any driver's access moves,
//! separate hosts, and the wire's statistics and capture visible to tests.

mod common;

use rnic_firmware_if::regs;
use rnic_hw_model::time::Picoseconds;
use rnic_verbs::backend::{EmbeddedDevice, EmbeddedFabric, FabricConfig};
use rnic_verbs::{Context, DeviceAccess};

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0xB];

#[test]
fn nics_on_one_fabric_share_one_clock_that_any_access_moves() {
    let fabric = EmbeddedFabric::new(FabricConfig::default());
    let a = fabric.add_nic(MAC_A);
    let b = fabric.add_nic(MAC_B);
    assert_eq!(fabric.nics(), 2);
    assert_eq!((a.device_id().0, b.device_id().0), (0, 1));
    let start = fabric.now();
    a.delay(5_000);
    assert_eq!(b.now().0 - start.0, 5_000_000, "B's clock is A's");
    let _ = b.mmio_read32(regs::CONTROL_BAR, regs::ID);
    assert_eq!(a.now().0 - start.0, 5_000_000 + a.config().mmio_cost.0);
    let both = a.with_device(|d| d.now()) == b.with_device(|d| d.now());
    assert!(both, "every device is at the fabric's time");
}

#[test]
fn one_drivers_waiting_lets_the_other_device_finish_its_work() {
    let fabric = EmbeddedFabric::default();
    let a = fabric.add_nic(MAC_A);
    let b = fabric.add_nic(MAC_B);
    // Enable B's memory decoding, then start a function reset on it (10 µs in the model).
    let command = b.config_read16(0x04);
    b.config_write16(0x04, command | 0x6);
    b.mmio_write32(regs::CONTROL_BAR, regs::FUNCTION_RESET, 1);
    assert!(b.with_device(|d| d.next_event_time().is_some()), "reset pending");
    // Only driver A does anything: it waits for an interrupt that never comes.
    assert!(a.wait_interrupt(20_000).is_empty());
    assert_eq!(
        b.with_device(|d| d.next_event_time()),
        None,
        "B's reset completed on A's time"
    );
    assert_eq!(b.mmio_read32(regs::CONTROL_BAR, regs::FUNCTION_RESET), 0);
}

#[test]
fn each_nic_is_a_host_of_its_own_and_the_fabric_is_visible() {
    let fabric = EmbeddedFabric::default();
    let a = fabric.add_nic(MAC_A);
    let b = fabric.add_nic(MAC_B);
    fabric.set_capture(true);
    let context_a = Context::open(Box::new(a.clone())).unwrap();
    let context_b = Context::open(Box::new(b.clone())).unwrap();
    assert_eq!(context_a.mac_address(), MAC_A);
    assert_eq!(context_b.mac_address(), MAC_B);
    assert!(!std::sync::Arc::ptr_eq(a.memory(), b.memory()));
    assert!(a.mapped_frames() > 0 && b.mapped_frames() > 0);
    assert_eq!(fabric.statistics().sent, 0);
    assert!(fabric.take_capture().is_empty(), "bring-up puts nothing on the wire");
    let before = fabric.now();
    let reached = fabric.run_until_idle(Picoseconds::from_millis(1));
    assert!(reached >= before && reached <= before + Picoseconds::from_millis(1));
}

#[test]
fn a_lone_embedded_device_is_a_fabric_of_one() {
    let device = EmbeddedDevice::new();
    assert_eq!(device.fabric().nics(), 1);
    let before = device.now();
    device.delay(1_000);
    assert_eq!(device.fabric().now().0 - before.0, 1_000_000);
    common::open();
}
