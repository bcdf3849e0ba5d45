//! PCI identity and configuration-space layout of the function.
//!
//! The default vendor/device pair is chosen so that no in-tree Linux driver binds to the
//! function (the hns RoCE IDs `19e5:a222..a22f` would make `hns_roce_hw_v2` and `hns3`
//! try to probe it). Both IDs are configurable in the model.

/// Default PCI vendor id: 0x1234, the id QEMU uses for its own emulated test devices.
pub const DEFAULT_VENDOR_ID: u16 = 0x1234;
/// Default PCI device id. Linux matches `1234:1111` (bochs-drm) and no driver matches
/// this pair; our guest driver binds by this id.
pub const DEFAULT_DEVICE_ID: u16 = 0x5244;
/// Default subsystem vendor id.
pub const DEFAULT_SUBSYSTEM_VENDOR_ID: u16 = 0x1234;
/// Default subsystem id.
pub const DEFAULT_SUBSYSTEM_ID: u16 = 0x0001;
/// Revision id: 0x30, as hns hip09 (the layouts follow hip08's "v2" contexts with hip09
/// sizes where noted in docs/hw-interface.md).
pub const DEFAULT_REVISION_ID: u8 = 0x30;
/// Class code: network controller (0x02), Ethernet (0x00), programming interface 0.
pub const CLASS_CODE: u32 = 0x02_00_00;

/// Size of the configuration space (PCIe extended space).
pub const CONFIG_SPACE_SIZE: usize = 4096;
/// Offset of the PCI Express capability.
pub const PCIE_CAPABILITY_OFFSET: u8 = 0x40;
/// Offset of the MSI-X capability.
pub const MSIX_CAPABILITY_OFFSET: u8 = 0x80;
/// Capability id of PCI Express.
pub const CAPABILITY_ID_PCIE: u8 = 0x10;
/// Capability id of MSI-X.
pub const CAPABILITY_ID_MSIX: u8 = 0x11;

/// Standard configuration-space register offsets used by the device.
pub mod offset {
    /// Vendor id (u16).
    pub const VENDOR_ID: usize = 0x00;
    /// Device id (u16).
    pub const DEVICE_ID: usize = 0x02;
    /// Command register (u16).
    pub const COMMAND: usize = 0x04;
    /// Status register (u16).
    pub const STATUS: usize = 0x06;
    /// Revision id (u8).
    pub const REVISION_ID: usize = 0x08;
    /// Class code (3 bytes, programming interface first).
    pub const CLASS_CODE: usize = 0x09;
    /// Header type (u8).
    pub const HEADER_TYPE: usize = 0x0E;
    /// BAR0 (u32); BARs 0..5 follow at 4-byte steps.
    pub const BAR0: usize = 0x10;
    /// Subsystem vendor id (u16).
    pub const SUBSYSTEM_VENDOR_ID: usize = 0x2C;
    /// Subsystem id (u16).
    pub const SUBSYSTEM_ID: usize = 0x2E;
    /// Capabilities pointer (u8).
    pub const CAPABILITIES_POINTER: usize = 0x34;
    /// Interrupt pin (u8): 0, the function has no INTx.
    pub const INTERRUPT_PIN: usize = 0x3D;
}

/// Command register bit: memory space enable.
pub const COMMAND_MEMORY_SPACE: u16 = 1 << 1;
/// Command register bit: bus master enable (DMA allowed).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// Command register bit: INTx disable.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status register bit: capability list present.
pub const STATUS_CAPABILITIES_LIST: u16 = 1 << 4;
/// MSI-X message control bit: MSI-X enable.
pub const MSIX_CONTROL_ENABLE: u16 = 1 << 15;
/// MSI-X message control bit: function mask.
pub const MSIX_CONTROL_FUNCTION_MASK: u16 = 1 << 14;
/// MSI-X vector control bit: vector masked.
pub const MSIX_VECTOR_MASKED: u32 = 1;
