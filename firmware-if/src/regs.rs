//! BAR layout and the control registers of BAR0.
//!
//! | BAR | Size | Contents |
//! |---|---|---|
//! | 0 (64-bit) | [`BAR0_SIZE`] | control registers: identification, reset, command queue, interrupt enables |
//! | 2 (64-bit) | [`DOORBELL_PAGE_SIZE`] × pages | doorbell pages ("UARs"): one 4 KiB page per user context; page 0 belongs to the driver |
//! | 4 (64-bit) | [`MSIX_BAR_SIZE`] | MSI-X table at 0, PBA at [`MSIX_PBA_OFFSET`] |
//!
//! The command-queue and interrupt-enable offsets are the hns ones (`ROCEE_TX_CMQ_*` at
//! `0x07000`, `ROCEE_VF_ABN_INT_*` at `0x13000`). hns keeps registers and doorbells in one
//! BAR (BAR 2); we split them so a doorbell page can be handed to a process (or
//! sparse-mmapped to a vfio-user client) without exposing control registers.

/// BAR index of the control registers.
pub const CONTROL_BAR: u8 = 0;
/// BAR index of the doorbell pages.
pub const DOORBELL_BAR: u8 = 2;
/// BAR index of the MSI-X table and PBA.
pub const MSIX_BAR: u8 = 4;

/// Size of BAR0 in bytes.
pub const BAR0_SIZE: u64 = 0x2_0000;
/// Size of one doorbell page in bytes.
pub const DOORBELL_PAGE_SIZE: u64 = 0x1000;
/// Size of the MSI-X BAR in bytes.
pub const MSIX_BAR_SIZE: u64 = 0x2000;
/// Offset of the MSI-X pending-bit array inside the MSI-X BAR.
pub const MSIX_PBA_OFFSET: u64 = 0x1000;
/// Size of one MSI-X table entry in bytes (PCI spec).
pub const MSIX_ENTRY_SIZE: u64 = 16;

/// Value of [`ID`]: ASCII "RNIC" read as a little-endian u32.
pub const ID_MAGIC: u32 = u32::from_le_bytes(*b"RNIC");
/// Version of this register interface (major << 16 | minor).
pub const INTERFACE_VERSION: u32 = 0x0001_0000;

/// A 32-bit register of BAR0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Register {
    /// Register name.
    pub name: &'static str,
    /// Byte offset in BAR0.
    pub offset: u64,
    /// Who may write it.
    pub access: Access,
    /// Meaning, units and reset value.
    pub doc: &'static str,
}

/// Register access type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only; writes are ignored and diagnosed.
    ReadOnly,
    /// Read/write.
    ReadWrite,
    /// Write 1 to clear.
    WriteOneToClear,
    /// Write only; reads return 0.
    WriteOnly,
}

macro_rules! registers {
    ($($(#[doc = $doc:literal])+ $name:ident = $offset:literal, $access:ident;)*) => {
        $(
            $(#[doc = $doc])+
            pub const $name: u64 = $offset;
        )*
        /// Every fixed BAR0 register, in offset order.
        pub const REGISTERS: &[Register] = &[
            $(Register { name: stringify!($name), offset: $offset, access: Access::$access,
                         doc: concat!($($doc),+) },)*
        ];
    };
}

registers! {
    /// Identification: reads [`ID_MAGIC`] ("RNIC").
    ID = 0x0000, ReadOnly;
    /// Register-interface version, major << 16 | minor (rnic addition).
    VERSION = 0x0004, ReadOnly;
    /// Function reset: write 1 to reset the function (all contexts, queues and table
    /// addresses forgotten); reads 1 while the reset is in progress, 0 when done.
    FUNCTION_RESET = 0x0010, ReadWrite;
    /// Function status: bit 0 ready (firmware accepts commands), bit 1 fatal error (a
    /// command-queue or DMA failure that needs a reset).
    FUNCTION_STATUS = 0x0014, ReadOnly;
    /// Command send queue base address, bits 31:0 (hns ROCEE_TX_CMQ_BASEADDR_L_REG).
    CSQ_BASE_LOW = 0x7000, ReadWrite;
    /// Command send queue base address, bits 63:32 (hns ROCEE_TX_CMQ_BASEADDR_H_REG).
    CSQ_BASE_HIGH = 0x7004, ReadWrite;
    /// Command send queue depth in units of 8 descriptors (hns writes desc_num >> 3).
    /// Written while the ring is idle, it starts the ring over: both indices return to 0.
    CSQ_DEPTH = 0x7008, ReadWrite;
    /// Command send queue producer index, written by the driver (hns ROCEE_TX_CMQ_PI_REG).
    CSQ_PRODUCER_INDEX = 0x7010, ReadWrite;
    /// Command send queue consumer index, advanced by firmware (hns ROCEE_TX_CMQ_CI_REG);
    /// the driver writes 0 during initialisation.
    CSQ_CONSUMER_INDEX = 0x7014, ReadWrite;
    /// Abnormal interrupt configuration (hns ROCEE_VF_ABN_INT_CFG_REG): bit 0 enables the
    /// abnormal vector.
    ABNORMAL_INT_CONFIG = 0x13000, ReadWrite;
    /// Abnormal interrupt status, write 1 to clear (hns ROCEE_VF_ABN_INT_ST_REG): bit 0
    /// AEQ overflow, bit 1 (rnic) command-queue fatal error.
    ABNORMAL_INT_STATUS = 0x13004, WriteOneToClear;
    /// Abnormal interrupt enable mask (hns ROCEE_VF_ABN_INT_EN_REG).
    ABNORMAL_INT_ENABLE = 0x13008, ReadWrite;
}

/// Per-EQ interrupt enable (hns ROCEE_VF_EVENT_INT_EN_REG): the register for EQ `eqn` is
/// at `EVENT_INT_ENABLE_BASE + 4 * eqn`; 1 enables the EQ's MSI-X vector.
pub const EVENT_INT_ENABLE_BASE: u64 = 0x1300C;
/// Number of per-EQ enable registers BAR0 has room for.
pub const MAX_EVENT_INT_ENABLES: u64 = 256;

/// [`ABNORMAL_INT_STATUS`] bit: AEQ overflow.
pub const ABNORMAL_AEQ_OVERFLOW: u32 = 1 << 0;
/// [`ABNORMAL_INT_STATUS`] bit: the command queue hit a fatal error (rnic addition).
pub const ABNORMAL_CMDQ_FATAL: u32 = 1 << 1;
/// [`FUNCTION_STATUS`] bit: firmware ready.
pub const STATUS_READY: u32 = 1 << 0;
/// [`FUNCTION_STATUS`] bit: fatal error, reset required.
pub const STATUS_FATAL: u32 = 1 << 1;

/// Offset of the per-EQ interrupt enable register for `eqn`.
pub const fn event_int_enable(eqn: u32) -> u64 {
    EVENT_INT_ENABLE_BASE + 4 * eqn as u64
}

/// MSI-X vector order (hns §9.4): vector 0 is the abnormal vector, then the AEQ vectors,
/// then one vector per CEQ.
pub const ABNORMAL_VECTOR: u16 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_sorted_aligned_and_inside_bar0() {
        for pair in REGISTERS.windows(2) {
            assert!(pair[0].offset < pair[1].offset, "{pair:?}");
        }
        for r in REGISTERS {
            assert_eq!(r.offset % 4, 0, "{}", r.name);
            assert!(r.offset + 4 <= BAR0_SIZE, "{}", r.name);
        }
        const LAST_ENABLE_END: u64 = event_int_enable(MAX_EVENT_INT_ENABLES as u32 - 1) + 4;
        const { assert!(LAST_ENABLE_END <= BAR0_SIZE) };
    }

    #[test]
    fn command_queue_offsets_follow_hns() {
        assert_eq!(CSQ_BASE_LOW, 0x07000);
        assert_eq!(CSQ_DEPTH, 0x07008);
        assert_eq!(CSQ_PRODUCER_INDEX, 0x07010);
        assert_eq!(CSQ_CONSUMER_INDEX, 0x07014);
        assert_eq!(event_int_enable(2), 0x13014);
    }

    #[test]
    fn id_magic_reads_rnic() {
        assert_eq!(ID_MAGIC.to_le_bytes(), *b"RNIC");
    }

    #[test]
    fn msix_table_and_pba_fit_the_bar() {
        const { assert!(MSIX_PBA_OFFSET + 8 <= MSIX_BAR_SIZE) };
    }
}
