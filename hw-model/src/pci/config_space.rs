//! The configuration space of the function: a 4 KiB type-0 header with two
//! capabilities, PCI Express (at [`pci::PCIE_CAPABILITY_OFFSET`]) and MSI-X (at
//! [`pci::MSIX_CAPABILITY_OFFSET`]), and no extended capabilities.
//!
//! The space is a byte array with a byte-granular write mask, so any access size and
//! alignment behaves like the hardware: only the writable bits change, everything else
//! keeps its value. The writable bits are the command register's memory-space, bus-master
//! and INTx-disable bits, the address bits of the BARs (which gives the standard sizing
//! protocol for free), MSI-X enable and function mask, and the PCI Express device control
//! register. Accesses beyond the 4 KiB read as all ones and are discarded on write.

use rnic_firmware_if::pci::{self, offset};
use rnic_firmware_if::regs;

use super::msix::MAX_MSIX_VECTORS;

/// Identity of the function as the configuration space reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciIdentity {
    /// Vendor id.
    pub vendor_id: u16,
    /// Device id.
    pub device_id: u16,
    /// Subsystem vendor id.
    pub subsystem_vendor_id: u16,
    /// Subsystem id.
    pub subsystem_id: u16,
    /// Revision id.
    pub revision_id: u8,
}

impl Default for PciIdentity {
    /// The firmware-interface defaults (`1234:5244`, revision 0x30).
    fn default() -> Self {
        Self {
            vendor_id: pci::DEFAULT_VENDOR_ID,
            device_id: pci::DEFAULT_DEVICE_ID,
            subsystem_vendor_id: pci::DEFAULT_SUBSYSTEM_VENDOR_ID,
            subsystem_id: pci::DEFAULT_SUBSYSTEM_ID,
            revision_id: pci::DEFAULT_REVISION_ID,
        }
    }
}

/// A BAR of the function. Every BAR is a 64-bit, non-prefetchable memory BAR: it uses
/// the BAR registers `index` (address bits 31:4 and the type bits) and `index + 1`
/// (address bits 63:32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BarDescriptor {
    /// Index of the lower BAR register, 0..=4.
    pub index: u8,
    /// Size in bytes: a power of two, at least 4096.
    pub size: u64,
}

impl BarDescriptor {
    /// The device's BARs: control registers ([`regs::CONTROL_BAR`], [`regs::BAR0_SIZE`]),
    /// `doorbell_pages` doorbell pages ([`regs::DOORBELL_BAR`], rounded up to a power of
    /// two, at least one page) and the MSI-X table and PBA ([`regs::MSIX_BAR`],
    /// [`regs::MSIX_BAR_SIZE`]).
    pub fn standard(doorbell_pages: u32) -> [BarDescriptor; 3] {
        let doorbells = u64::from(doorbell_pages.max(1)) * regs::DOORBELL_PAGE_SIZE;
        [
            BarDescriptor {
                index: regs::CONTROL_BAR,
                size: regs::BAR0_SIZE,
            },
            BarDescriptor {
                index: regs::DOORBELL_BAR,
                size: doorbells.next_power_of_two(),
            },
            BarDescriptor {
                index: regs::MSIX_BAR,
                size: regs::MSIX_BAR_SIZE,
            },
        ]
    }
}

/// Type bits of every BAR: memory space (bit 0 = 0), 64-bit (bits 2:1 = 0b10), not
/// prefetchable (bit 3 = 0).
pub const BAR_TYPE_MEMORY_64: u32 = 0b100;
/// Smallest BAR the function has: one page.
pub const MIN_BAR_SIZE: u64 = 4096;

/// Register offsets inside the PCI Express capability (PCIe base spec §7.5.3).
mod pcie {
    /// PCI Express capabilities register (u16).
    pub const CAPABILITIES: usize = 0x02;
    /// Device capabilities (u32).
    pub const DEVICE_CAPABILITIES: usize = 0x04;
    /// Device control (u16).
    pub const DEVICE_CONTROL: usize = 0x08;
    /// Link capabilities (u32).
    pub const LINK_CAPABILITIES: usize = 0x0C;
    /// Link status (u16).
    pub const LINK_STATUS: usize = 0x12;
    /// Link capabilities 2 (u32).
    pub const LINK_CAPABILITIES_2: usize = 0x2C;
    /// Link control 2 (u16).
    pub const LINK_CONTROL_2: usize = 0x30;
    /// Length of a version-2 capability structure.
    pub const LENGTH: usize = 0x3C;

    /// Capability version 2, device/port type 0 (PCI Express Endpoint).
    pub const CAPABILITIES_VALUE: u16 = 2;
    /// Max payload size supported 256 B (code 1), extended tag field supported (bit 5),
    /// role-based error reporting (bit 15).
    pub const DEVICE_CAPABILITIES_VALUE: u32 = 1 | 1 << 5 | 1 << 15;
    /// Device control at reset: relaxed ordering (bit 4) and no snoop (bit 11) enabled,
    /// max payload 128 B, max read request 512 B (code 2 in bits 14:12).
    pub const DEVICE_CONTROL_RESET: u16 = 1 << 4 | 1 << 11 | 2 << 12;
    /// Writable device-control bits: error reporting enables (3:0), relaxed ordering (4),
    /// max payload size (7:5), extended tag (8), no snoop (11), max read request (14:12).
    /// Phantom functions, aux power and FLR are not implemented.
    pub const DEVICE_CONTROL_WRITABLE: u16 = 0x79FF;
    /// Link speed code 3: 8 GT/s (bit 2 of the supported link speeds vector).
    pub const LINK_SPEED_8GT: u32 = 3;
    /// Link width x16.
    pub const LINK_WIDTH: u32 = 16;
    /// Max link speed 8 GT/s, max width x16, no ASPM, ASPM optionality compliance (bit 22).
    pub const LINK_CAPABILITIES_VALUE: u32 = LINK_SPEED_8GT | LINK_WIDTH << 4 | 1 << 22;
    /// Current speed 8 GT/s, negotiated width x16, slot clock configuration (bit 12).
    pub const LINK_STATUS_VALUE: u16 = (LINK_SPEED_8GT | LINK_WIDTH << 4 | 1 << 12) as u16;
    /// Supported link speeds vector: 2.5, 5 and 8 GT/s (bits 3:1).
    pub const LINK_CAPABILITIES_2_VALUE: u32 = 0b1110;
    /// Target link speed 8 GT/s.
    pub const LINK_CONTROL_2_VALUE: u16 = LINK_SPEED_8GT as u16;
}

/// Register offsets inside the MSI-X capability (PCI local bus spec 3.0 §6.8.2).
mod msix_cap {
    /// Message control (u16).
    pub const CONTROL: usize = 0x02;
    /// Table offset and BIR (u32).
    pub const TABLE: usize = 0x04;
    /// PBA offset and BIR (u32).
    pub const PBA: usize = 0x08;
}

/// Writable command-register bits.
const COMMAND_WRITABLE: u16 = pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER | pci::COMMAND_INTX_DISABLE;
/// Writable MSI-X message-control bits.
const MSIX_CONTROL_WRITABLE: u16 = pci::MSIX_CONTROL_ENABLE | pci::MSIX_CONTROL_FUNCTION_MASK;

const PCIE_CAP: usize = pci::PCIE_CAPABILITY_OFFSET as usize;
const MSIX_CAP: usize = pci::MSIX_CAPABILITY_OFFSET as usize;
const _: () = assert!(PCIE_CAP + pcie::LENGTH <= MSIX_CAP, "PCIe capability overlaps MSI-X");

/// Offset of BAR register `index` (0..=5).
const fn bar_offset(index: u8) -> usize {
    offset::BAR0 + 4 * index as usize
}

/// The configuration space: current values, write mask and power-on values.
#[derive(Clone)]
pub struct ConfigSpace {
    identity: PciIdentity,
    bars: Vec<BarDescriptor>,
    msix_vectors: u16,
    bytes: Box<[u8]>,
    write_mask: Box<[u8]>,
    power_on: Box<[u8]>,
}

/// Builds the power-on image and the write mask.
struct Image {
    bytes: Vec<u8>,
    mask: Vec<u8>,
}

impl Image {
    fn put(&mut self, at: usize, value: &[u8], writable: &[u8]) {
        self.bytes[at..at + value.len()].copy_from_slice(value);
        self.mask[at..at + writable.len()].copy_from_slice(writable);
    }
    fn put8(&mut self, at: usize, value: u8) {
        self.put(at, &[value], &[0]);
    }
    fn put16(&mut self, at: usize, value: u16, writable: u16) {
        self.put(at, &value.to_le_bytes(), &writable.to_le_bytes());
    }
    fn put32(&mut self, at: usize, value: u32, writable: u32) {
        self.put(at, &value.to_le_bytes(), &writable.to_le_bytes());
    }
}

impl ConfigSpace {
    /// The configuration space of a function with `identity`, the 64-bit memory BARs
    /// `bars` and an MSI-X table of `msix_vectors` entries in BAR [`regs::MSIX_BAR`]
    /// (table at offset 0, PBA at [`regs::MSIX_PBA_OFFSET`]), in its power-on state:
    /// decoding and bus mastering off, BARs at address 0, MSI-X disabled.
    ///
    /// # Panics
    ///
    /// On a configuration no device could have (a programming error, not a guest
    /// input): a BAR index above 4, two BARs sharing a register, a BAR size that is not
    /// a power of two of at least [`MIN_BAR_SIZE`], or `msix_vectors` outside
    /// `1..=`[`MAX_MSIX_VECTORS`].
    pub fn new(identity: PciIdentity, bars: &[BarDescriptor], msix_vectors: u16) -> Self {
        assert!(
            (1..=MAX_MSIX_VECTORS).contains(&msix_vectors),
            "MSI-X vector count {msix_vectors} outside 1..={MAX_MSIX_VECTORS}"
        );
        let mut used = [false; 6];
        for bar in bars {
            assert!(bar.index <= 4, "64-bit BAR index {} above 4", bar.index);
            assert!(
                bar.size.is_power_of_two() && bar.size >= MIN_BAR_SIZE,
                "BAR {} size {:#x} is not a power of two >= {MIN_BAR_SIZE:#x}",
                bar.index,
                bar.size
            );
            for register in [bar.index, bar.index + 1] {
                assert!(!used[register as usize], "BAR register {register} used twice");
                used[register as usize] = true;
            }
        }

        let mut image = Image {
            bytes: vec![0; pci::CONFIG_SPACE_SIZE],
            mask: vec![0; pci::CONFIG_SPACE_SIZE],
        };

        // Type-0 header.
        image.put16(offset::VENDOR_ID, identity.vendor_id, 0);
        image.put16(offset::DEVICE_ID, identity.device_id, 0);
        image.put16(offset::COMMAND, 0, COMMAND_WRITABLE);
        image.put16(offset::STATUS, pci::STATUS_CAPABILITIES_LIST, 0);
        image.put8(offset::REVISION_ID, identity.revision_id);
        image.put(offset::CLASS_CODE, &pci::CLASS_CODE.to_le_bytes()[..3], &[0; 3]);
        image.put8(offset::HEADER_TYPE, 0);
        for bar in bars {
            let address_mask = !(bar.size - 1);
            let low_mask = address_mask as u32 & !0xF;
            let high_mask = (address_mask >> 32) as u32;
            image.put32(bar_offset(bar.index), BAR_TYPE_MEMORY_64, low_mask);
            image.put32(bar_offset(bar.index + 1), 0, high_mask);
        }
        image.put16(offset::SUBSYSTEM_VENDOR_ID, identity.subsystem_vendor_id, 0);
        image.put16(offset::SUBSYSTEM_ID, identity.subsystem_id, 0);
        image.put8(offset::CAPABILITIES_POINTER, pci::PCIE_CAPABILITY_OFFSET);
        image.put8(offset::INTERRUPT_PIN, 0);

        // PCI Express capability, version 2, endpoint.
        image.put8(PCIE_CAP, pci::CAPABILITY_ID_PCIE);
        image.put8(PCIE_CAP + 1, pci::MSIX_CAPABILITY_OFFSET);
        image.put16(PCIE_CAP + pcie::CAPABILITIES, pcie::CAPABILITIES_VALUE, 0);
        image.put32(PCIE_CAP + pcie::DEVICE_CAPABILITIES, pcie::DEVICE_CAPABILITIES_VALUE, 0);
        image.put16(
            PCIE_CAP + pcie::DEVICE_CONTROL,
            pcie::DEVICE_CONTROL_RESET,
            pcie::DEVICE_CONTROL_WRITABLE,
        );
        image.put32(PCIE_CAP + pcie::LINK_CAPABILITIES, pcie::LINK_CAPABILITIES_VALUE, 0);
        image.put16(PCIE_CAP + pcie::LINK_STATUS, pcie::LINK_STATUS_VALUE, 0);
        image.put32(PCIE_CAP + pcie::LINK_CAPABILITIES_2, pcie::LINK_CAPABILITIES_2_VALUE, 0);
        image.put16(PCIE_CAP + pcie::LINK_CONTROL_2, pcie::LINK_CONTROL_2_VALUE, 0);

        // MSI-X capability, last in the list.
        image.put8(MSIX_CAP, pci::CAPABILITY_ID_MSIX);
        image.put8(MSIX_CAP + 1, 0);
        image.put16(MSIX_CAP + msix_cap::CONTROL, msix_vectors - 1, MSIX_CONTROL_WRITABLE);
        image.put32(MSIX_CAP + msix_cap::TABLE, u32::from(regs::MSIX_BAR), 0);
        image.put32(
            MSIX_CAP + msix_cap::PBA,
            regs::MSIX_PBA_OFFSET as u32 | u32::from(regs::MSIX_BAR),
            0,
        );

        let power_on = image.bytes.into_boxed_slice();
        Self {
            identity,
            bars: bars.to_vec(),
            msix_vectors,
            bytes: power_on.clone(),
            write_mask: image.mask.into_boxed_slice(),
            power_on,
        }
    }

    /// Reads `data.len()` bytes at `offset`. Any size and alignment works (a CPU issues
    /// 1, 2 or 4 bytes, naturally aligned); bytes beyond the 4 KiB space read as 0xFF.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, out) in data.iter_mut().enumerate() {
            *out = offset
                .checked_add(i)
                .and_then(|at| self.bytes.get(at))
                .copied()
                .unwrap_or(0xFF);
        }
    }

    /// Writes `data` at `offset`. Only writable bits change; read-only bits and bytes
    /// beyond the 4 KiB space keep their value, and a write that tried to change them
    /// is traced at debug level. Never fails.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        let mut ignored = false;
        for (i, &value) in data.iter().enumerate() {
            let at = offset.checked_add(i);
            match at.and_then(|at| self.bytes.get_mut(at).zip(self.write_mask.get(at))) {
                Some((byte, &mask)) => {
                    ignored |= (*byte ^ value) & !mask != 0;
                    *byte = (*byte & !mask) | (value & mask);
                }
                None => ignored = true,
            }
        }
        if ignored {
            tracing::debug!(
                offset = format_args!("{offset:#x}"),
                value = format_args!("{:#x}", little_endian(data)),
                len = data.len(),
                "config space: write to read-only or absent bits ignored"
            );
        }
    }

    /// Back to the power-on state (function-level reset): command register, BAR
    /// addresses, MSI-X control and device control return to their reset values.
    pub fn reset(&mut self) {
        self.bytes.copy_from_slice(&self.power_on);
    }

    fn read16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    fn read32(&self, at: usize) -> u32 {
        u32::from_le_bytes([
            self.bytes[at],
            self.bytes[at + 1],
            self.bytes[at + 2],
            self.bytes[at + 3],
        ])
    }

    /// The identity the space was built with.
    pub fn identity(&self) -> PciIdentity {
        self.identity
    }

    /// The BARs the space was built with.
    pub fn bars(&self) -> &[BarDescriptor] {
        &self.bars
    }

    /// Number of MSI-X vectors the capability advertises.
    pub fn msix_vectors(&self) -> u16 {
        self.msix_vectors
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.read16(offset::COMMAND)
    }

    /// True when the function decodes its memory BARs (command bit 1).
    pub fn memory_enabled(&self) -> bool {
        self.command() & pci::COMMAND_MEMORY_SPACE != 0
    }

    /// True when the function may issue DMA, MSI-X messages included (command bit 2).
    pub fn bus_master_enabled(&self) -> bool {
        self.command() & pci::COMMAND_BUS_MASTER != 0
    }

    /// The MSI-X message control register.
    pub fn msix_control(&self) -> u16 {
        self.read16(MSIX_CAP + msix_cap::CONTROL)
    }

    /// True when MSI-X is enabled (message control bit 15).
    pub fn msix_enabled(&self) -> bool {
        self.msix_control() & pci::MSIX_CONTROL_ENABLE != 0
    }

    /// True when every vector is masked by the function mask (message control bit 14).
    pub fn msix_function_masked(&self) -> bool {
        self.msix_control() & pci::MSIX_CONTROL_FUNCTION_MASK != 0
    }

    /// The PCI Express device control register.
    pub fn device_control(&self) -> u16 {
        self.read16(PCIE_CAP + pcie::DEVICE_CONTROL)
    }

    /// Max payload size programmed in device control, in bytes (128 << code).
    pub fn max_payload_size(&self) -> u32 {
        128 << ((self.device_control() >> 5) & 7)
    }

    /// Max read request size programmed in device control, in bytes (128 << code).
    pub fn max_read_request_size(&self) -> u32 {
        128 << ((self.device_control() >> 12) & 7)
    }

    /// The address programmed in the 64-bit BAR whose lower register is `index` (type
    /// bits cleared), or 0 when the function has no such BAR.
    pub fn bar_address(&self, index: u8) -> u64 {
        if !self.bars.iter().any(|bar| bar.index == index) {
            return 0;
        }
        let low = self.read32(bar_offset(index));
        let high = self.read32(bar_offset(index + 1));
        (u64::from(high) << 32 | u64::from(low)) & !0xF
    }

    /// Size of the BAR whose lower register is `index`, if the function has it.
    pub fn bar_size(&self, index: u8) -> Option<u64> {
        self.bars.iter().find(|bar| bar.index == index).map(|bar| bar.size)
    }
}

impl std::fmt::Debug for ConfigSpace {
    /// The identity, BARs and control registers; not the 4 KiB of bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addresses: Vec<String> = self
            .bars
            .iter()
            .map(|bar| format!("{}@{:#x}", bar.index, self.bar_address(bar.index)))
            .collect();
        f.debug_struct("ConfigSpace")
            .field("identity", &self.identity)
            .field("bars", &self.bars)
            .field("bar_addresses", &addresses)
            .field("command", &format_args!("{:#06x}", self.command()))
            .field("msix_control", &format_args!("{:#06x}", self.msix_control()))
            .field("device_control", &format_args!("{:#06x}", self.device_control()))
            .finish()
    }
}

/// The first (up to) eight bytes of `data` as a little-endian number, for traces.
fn little_endian(data: &[u8]) -> u64 {
    data.iter()
        .take(8)
        .rev()
        .fold(0, |value, &byte| value << 8 | u64::from(byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> ConfigSpace {
        ConfigSpace::new(PciIdentity::default(), &BarDescriptor::standard(64), 32)
    }

    fn read8(c: &ConfigSpace, at: usize) -> u8 {
        let mut b = [0; 1];
        c.read(at, &mut b);
        b[0]
    }

    fn read16(c: &ConfigSpace, at: usize) -> u16 {
        let mut b = [0; 2];
        c.read(at, &mut b);
        u16::from_le_bytes(b)
    }

    fn read32(c: &ConfigSpace, at: usize) -> u32 {
        let mut b = [0; 4];
        c.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    fn write16(c: &mut ConfigSpace, at: usize, value: u16) {
        c.write(at, &value.to_le_bytes());
    }

    fn write32(c: &mut ConfigSpace, at: usize, value: u32) {
        c.write(at, &value.to_le_bytes());
    }

    #[test]
    fn ids_class_and_header_read_back() {
        let identity = PciIdentity {
            vendor_id: 0x1af4,
            device_id: 0x1234,
            subsystem_vendor_id: 0x8086,
            subsystem_id: 0x0042,
            revision_id: 7,
        };
        let c = ConfigSpace::new(identity, &BarDescriptor::standard(1), 4);
        assert_eq!(read16(&c, offset::VENDOR_ID), 0x1af4);
        assert_eq!(read16(&c, offset::DEVICE_ID), 0x1234);
        assert_eq!(read32(&c, 0), 0x1234_1af4, "vendor and device as one dword");
        assert_eq!(read16(&c, offset::SUBSYSTEM_VENDOR_ID), 0x8086);
        assert_eq!(read16(&c, offset::SUBSYSTEM_ID), 0x0042);
        assert_eq!(read8(&c, offset::REVISION_ID), 7);
        assert_eq!(
            read32(&c, offset::REVISION_ID) >> 8,
            0x02_00_00,
            "class: Ethernet controller"
        );
        assert_eq!(read8(&c, offset::HEADER_TYPE), 0);
        assert_ne!(read16(&c, offset::STATUS) & pci::STATUS_CAPABILITIES_LIST, 0);
        assert_eq!(read8(&c, offset::INTERRUPT_PIN), 0, "no INTx");
        assert_eq!(c.identity(), identity);
    }

    #[test]
    fn default_identity_is_the_firmware_interface_one() {
        let c = space();
        assert_eq!(read16(&c, offset::VENDOR_ID), pci::DEFAULT_VENDOR_ID);
        assert_eq!(read16(&c, offset::DEVICE_ID), pci::DEFAULT_DEVICE_ID);
        assert_eq!(read8(&c, offset::REVISION_ID), pci::DEFAULT_REVISION_ID);
    }

    #[test]
    fn a_64_bit_bar_follows_the_sizing_protocol() {
        let mut c = space();
        let low = bar_offset(regs::CONTROL_BAR);
        let high = low + 4;
        assert_eq!(read32(&c, low), BAR_TYPE_MEMORY_64, "64-bit, non-prefetchable, at 0");
        assert_eq!(read32(&c, high), 0);

        write32(&mut c, low, 0xFFFF_FFFF);
        write32(&mut c, high, 0xFFFF_FFFF);
        let low_value = read32(&c, low);
        assert_eq!(low_value & 0xF, BAR_TYPE_MEMORY_64, "type bits are read-only");
        let mask = u64::from(read32(&c, high)) << 32 | u64::from(low_value & !0xF);
        assert_eq!(!mask + 1, regs::BAR0_SIZE, "size read back from the mask");

        write32(&mut c, low, 0xFEB0_0000);
        write32(&mut c, high, 0x0000_0040);
        assert_eq!(read32(&c, low), 0xFEB0_0000 | BAR_TYPE_MEMORY_64);
        assert_eq!(c.bar_address(regs::CONTROL_BAR), 0x40_FEB0_0000);

        write32(&mut c, low, 0xFEB0_1234);
        assert_eq!(
            c.bar_address(regs::CONTROL_BAR),
            0x40_FEB0_0000,
            "bits below the size are read-only"
        );
    }

    #[test]
    fn every_bar_reports_its_size_and_the_rom_bar_is_absent() {
        let mut c = space();
        for bar in BarDescriptor::standard(64) {
            let low = bar_offset(bar.index);
            write32(&mut c, low, 0xFFFF_FFFF);
            write32(&mut c, low + 4, 0xFFFF_FFFF);
            let mask = u64::from(read32(&c, low + 4)) << 32 | u64::from(read32(&c, low) & !0xF);
            assert_eq!(!mask + 1, bar.size, "BAR {}", bar.index);
            assert_eq!(c.bar_size(bar.index), Some(bar.size));
        }
        assert_eq!(c.bar_size(regs::DOORBELL_BAR), Some(64 * regs::DOORBELL_PAGE_SIZE));
        write32(&mut c, 0x30, 0xFFFF_FFFF);
        assert_eq!(read32(&c, 0x30), 0, "no expansion ROM");
        assert_eq!(c.bar_address(1), 0, "no BAR starts at register 1");
    }

    #[test]
    fn a_bar_larger_than_4_gib_masks_its_upper_dword() {
        let bars = [BarDescriptor {
            index: 0,
            size: 1 << 34,
        }];
        let mut c = ConfigSpace::new(PciIdentity::default(), &bars, 1);
        write32(&mut c, 0x10, 0xFFFF_FFFF);
        write32(&mut c, 0x14, 0xFFFF_FFFF);
        assert_eq!(read32(&c, 0x10), BAR_TYPE_MEMORY_64);
        assert_eq!(read32(&c, 0x14), 0xFFFF_FFFC);
    }

    #[test]
    fn read_only_fields_ignore_writes() {
        let mut c = space();
        let before: Vec<u8> = (0..pci::CONFIG_SPACE_SIZE).map(|at| read8(&c, at)).collect();
        write32(&mut c, offset::VENDOR_ID, 0xDEAD_BEEF);
        write32(&mut c, offset::REVISION_ID, 0xFFFF_FFFF);
        write32(&mut c, 0x0C, 0xFFFF_FFFF); // cache line, latency, header type, BIST
        write32(&mut c, offset::SUBSYSTEM_VENDOR_ID, 0x1111_2222);
        write32(&mut c, offset::CAPABILITIES_POINTER, 0xFF);
        write32(&mut c, 0x3C, 0xFFFF_FFFF); // interrupt line and pin
        write16(&mut c, offset::STATUS, 0xFFFF);
        write32(&mut c, PCIE_CAP, 0xFFFF_FFFF);
        write32(&mut c, PCIE_CAP + pcie::LINK_CAPABILITIES, 0);
        write32(&mut c, MSIX_CAP + msix_cap::TABLE, 0xFFFF_FFFF);
        write32(&mut c, MSIX_CAP + msix_cap::PBA, 0);
        write32(&mut c, 0x100, 0xFFFF_FFFF);
        let after: Vec<u8> = (0..pci::CONFIG_SPACE_SIZE).map(|at| read8(&c, at)).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn command_register_has_exactly_three_writable_bits() {
        let mut c = space();
        assert!(!c.memory_enabled() && !c.bus_master_enabled());
        write16(&mut c, offset::COMMAND, 0xFFFF);
        assert_eq!(read16(&c, offset::COMMAND), 0x0406);
        assert!(c.memory_enabled() && c.bus_master_enabled());
        write16(&mut c, offset::COMMAND, pci::COMMAND_MEMORY_SPACE);
        assert!(c.memory_enabled() && !c.bus_master_enabled());
        assert_eq!(
            read16(&c, offset::STATUS),
            pci::STATUS_CAPABILITIES_LIST,
            "status untouched"
        );
    }

    #[test]
    fn capability_chain_is_pcie_then_msix_then_end() {
        let c = space();
        let mut found = Vec::new();
        let mut at = read8(&c, offset::CAPABILITIES_POINTER) as usize;
        while at != 0 {
            assert!(found.len() < 48, "capability list loops");
            assert_eq!(at % 4, 0);
            found.push((at, read8(&c, at)));
            at = read8(&c, at + 1) as usize;
        }
        assert_eq!(
            found,
            vec![(0x40, pci::CAPABILITY_ID_PCIE), (0x80, pci::CAPABILITY_ID_MSIX)]
        );
        assert_eq!(read32(&c, 0x100), 0, "no extended capabilities");
    }

    #[test]
    fn pcie_capability_describes_a_gen3_x16_endpoint() {
        let c = space();
        let capabilities = read16(&c, PCIE_CAP + pcie::CAPABILITIES);
        assert_eq!(capabilities & 0xF, 2, "capability version 2");
        assert_eq!((capabilities >> 4) & 0xF, 0, "PCI Express Endpoint");
        assert_eq!(
            read32(&c, PCIE_CAP + pcie::DEVICE_CAPABILITIES) & 7,
            1,
            "max payload 256 B"
        );
        let link_capabilities = read32(&c, PCIE_CAP + pcie::LINK_CAPABILITIES);
        assert_eq!(link_capabilities & 0xF, 3, "8 GT/s");
        assert_eq!((link_capabilities >> 4) & 0x3F, 16, "x16");
        let link_status = read16(&c, PCIE_CAP + pcie::LINK_STATUS);
        assert_eq!(link_status & 0xF, 3);
        assert_eq!((link_status >> 4) & 0x3F, 16);
        assert_ne!(
            read32(&c, PCIE_CAP + pcie::LINK_CAPABILITIES_2) & 1 << 3,
            0,
            "8 GT/s supported"
        );
    }

    #[test]
    fn pcie_device_control_is_writable() {
        let mut c = space();
        assert_eq!(c.max_payload_size(), 128);
        assert_eq!(c.max_read_request_size(), 512);
        let control = c.device_control() & !(7 << 5) | 1 << 5;
        write16(&mut c, PCIE_CAP + pcie::DEVICE_CONTROL, control);
        assert_eq!(c.max_payload_size(), 256);
        write16(&mut c, PCIE_CAP + pcie::DEVICE_CONTROL, 0xFFFF);
        assert_eq!(
            c.device_control(),
            pcie::DEVICE_CONTROL_WRITABLE,
            "FLR, phantom, aux are read-only"
        );
    }

    #[test]
    fn msix_capability_points_at_bar4() {
        let c = space();
        assert_eq!(
            read16(&c, MSIX_CAP + msix_cap::CONTROL) & 0x7FF,
            31,
            "table size is vectors - 1"
        );
        assert_eq!(c.msix_vectors(), 32);
        assert_eq!(read32(&c, MSIX_CAP + msix_cap::TABLE), 4, "BIR 4, offset 0");
        assert_eq!(read32(&c, MSIX_CAP + msix_cap::PBA), 0x1004, "BIR 4, offset 0x1000");
        let single = ConfigSpace::new(PciIdentity::default(), &[], 1);
        assert_eq!(read16(&single, MSIX_CAP + msix_cap::CONTROL), 0);
    }

    #[test]
    fn msix_enable_and_function_mask_are_the_only_writable_control_bits() {
        let mut c = space();
        assert!(!c.msix_enabled() && !c.msix_function_masked());
        write16(&mut c, MSIX_CAP + msix_cap::CONTROL, 0xFFFF);
        assert!(c.msix_enabled() && c.msix_function_masked());
        assert_eq!(c.msix_control(), 0xC000 | 31);
        // A byte write to the upper half, as Linux does, clears the function mask alone.
        c.write(MSIX_CAP + msix_cap::CONTROL + 1, &[0x80]);
        assert!(c.msix_enabled() && !c.msix_function_masked());
    }

    #[test]
    fn reset_restores_power_on_values() {
        let mut c = space();
        write16(&mut c, offset::COMMAND, 0x0006);
        write32(&mut c, bar_offset(regs::MSIX_BAR), 0xFE00_0000);
        write16(&mut c, MSIX_CAP + msix_cap::CONTROL, 0x8000);
        c.reset();
        assert_eq!(c.command(), 0);
        assert_eq!(c.bar_address(regs::MSIX_BAR), 0);
        assert!(!c.msix_enabled());
        assert_eq!(c.device_control(), pcie::DEVICE_CONTROL_RESET);
    }

    #[test]
    fn accesses_beyond_the_space_read_ones_and_are_ignored() {
        let mut c = space();
        assert_eq!(read32(&c, 4096), 0xFFFF_FFFF);
        assert_eq!(read32(&c, 4094), 0xFFFF_0000, "straddling: two real bytes, two absent");
        c.write(4094, &[1, 2, 3, 4]);
        assert_eq!(read32(&c, 4094), 0xFFFF_0000);
        let mut b = [0u8; 4];
        c.read(usize::MAX - 1, &mut b);
        assert_eq!(b, [0xFF; 4]);
        c.write(usize::MAX, &[0; 4]);
    }

    #[test]
    fn random_accesses_never_panic() {
        let mut c = space();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let offset = (next() % 5000) as usize;
            let size = (next() % 9) as usize;
            let value = next().to_le_bytes();
            if next() % 2 == 0 {
                c.write(offset, &value[..size]);
            } else {
                let mut out = [0u8; 8];
                c.read(offset, &mut out[..size]);
                if offset >= pci::CONFIG_SPACE_SIZE {
                    assert!(out[..size].iter().all(|&b| b == 0xFF));
                }
            }
        }
        // The read-only identity survived.
        assert_eq!(read16(&c, offset::VENDOR_ID), pci::DEFAULT_VENDOR_ID);
        assert_eq!(read8(&c, offset::CAPABILITIES_POINTER), pci::PCIE_CAPABILITY_OFFSET);
    }

    #[test]
    fn debug_output_summarises_the_registers() {
        let mut c = space();
        write16(&mut c, offset::COMMAND, 0x0006);
        let text = format!("{c:?}");
        assert!(text.contains("command: 0x0006"), "{text}");
        assert!(text.len() < 1000, "not a dump of the 4 KiB: {text}");
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn a_bar_size_must_be_a_power_of_two() {
        ConfigSpace::new(PciIdentity::default(), &[BarDescriptor { index: 0, size: 0x3000 }], 1);
    }

    #[test]
    #[should_panic(expected = "used twice")]
    fn bars_may_not_overlap() {
        let bars = [
            BarDescriptor { index: 0, size: 4096 },
            BarDescriptor { index: 1, size: 4096 },
        ];
        ConfigSpace::new(PciIdentity::default(), &bars, 1);
    }
}
