//! The PCI face of the function: configuration space, BARs and MSI-X.
//!
//! - [`ConfigSpace`]: the 4 KiB configuration space — identity ([`PciIdentity`]), class
//!   "Ethernet controller", three 64-bit memory BARs ([`BarDescriptor`]), a PCI Express
//!   capability (Gen3 x16 endpoint) and an MSI-X capability. It answers config reads and
//!   writes of any size and offset and tells the rest of the device whether memory
//!   decoding, bus mastering and MSI-X are on.
//! - [`MsixTable`]: the MSI-X table and pending-bit array behind BAR
//!   [`regs::MSIX_BAR`](rnic_firmware_if::regs::MSIX_BAR), and the logic that turns a
//!   signalled vector into an [`MsixMessage`](crate::interrupt::MsixMessage) for the
//!   [`InterruptSink`](crate::interrupt::InterruptSink), or into a pending bit while the
//!   vector or the function is masked.
//!
//! The owner of both (the device) wires them together: it passes
//! [`ConfigSpace::msix_enabled`] and [`ConfigSpace::msix_function_masked`] to
//! [`MsixTable::signal`] and [`MsixTable::write`], and after a configuration write that
//! changes the MSI-X message control register it calls [`MsixTable::deliver_pending`].
//! Neither part ever panics on guest input: bad sizes, offsets and values are ignored
//! (or read as all ones / zero) with a debug trace.

mod config_space;
mod msix;

pub use config_space::{BarDescriptor, ConfigSpace, PciIdentity, BAR_TYPE_MEMORY_64, MIN_BAR_SIZE};
pub use msix::{MsixEntry, MsixTable, MAX_MSIX_VECTORS};
