//! The MSI-X table and pending-bit array (PBA) of BAR [`regs::MSIX_BAR`].
//!
//! The table starts at offset 0 with one 16-byte entry per vector (message address low,
//! message address high, message data, vector control with the mask in bit 0); the PBA,
//! one bit per vector in 64-bit words, is at [`regs::MSIX_PBA_OFFSET`] and read-only.
//! Entries come out of reset masked, as the PCI spec requires.
//!
//! The enable and function-mask bits live in the configuration space
//! ([`super::ConfigSpace`]); the owner of both passes them to [`MsixTable::signal`] and
//! [`MsixTable::write`], and calls [`MsixTable::function_unmasked`] (or
//! [`MsixTable::deliver_pending`]) when a configuration write clears the function mask or
//! sets the enable bit, so that messages held pending while masked go out.

use rnic_firmware_if::pci::MSIX_VECTOR_MASKED;
use rnic_firmware_if::regs;

use crate::interrupt::{InterruptSink, MsixMessage};

/// Most vectors the table can hold: the entries must end before the PBA.
pub const MAX_MSIX_VECTORS: u16 = (regs::MSIX_PBA_OFFSET / regs::MSIX_ENTRY_SIZE) as u16;

/// One table entry as software programmed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixEntry {
    /// Message address (bits 1:0 always zero).
    pub address: u64,
    /// Message data.
    pub data: u32,
    /// Vector control: bit 0 is the per-vector mask, the other bits read as zero.
    pub control: u32,
}

impl MsixEntry {
    /// The reset state: address and data zero, vector masked.
    pub const RESET: Self = Self {
        address: 0,
        data: 0,
        control: MSIX_VECTOR_MASKED,
    };

    /// True when the per-vector mask bit is set.
    pub fn masked(&self) -> bool {
        self.control & MSIX_VECTOR_MASKED != 0
    }
}

/// The MSI-X table and PBA of the function.
#[derive(Debug, Clone)]
pub struct MsixTable {
    entries: Vec<MsixEntry>,
    /// Pending bits, vector `v` at bit `v % 64` of word `v / 64` (the PBA layout).
    pending: Vec<u64>,
}

/// Register of a table entry, by dword index inside the entry.
const ADDRESS_LOW: u64 = 0;
const ADDRESS_HIGH: u64 = 1;
const DATA: u64 = 2;
const CONTROL: u64 = 3;

impl MsixTable {
    /// A table of `vectors` entries, all masked, none pending.
    ///
    /// # Panics
    ///
    /// When `vectors` is outside `1..=`[`MAX_MSIX_VECTORS`] (a device configuration
    /// error, not a guest input).
    pub fn new(vectors: u16) -> Self {
        assert!(
            (1..=MAX_MSIX_VECTORS).contains(&vectors),
            "MSI-X vector count {vectors} outside 1..={MAX_MSIX_VECTORS}"
        );
        Self {
            entries: vec![MsixEntry::RESET; usize::from(vectors)],
            pending: vec![0; usize::from(vectors).div_ceil(64)],
        }
    }

    /// Number of vectors.
    pub fn vectors(&self) -> u16 {
        self.entries.len() as u16
    }

    /// The entry of `vector`, if the table has it.
    pub fn entry(&self, vector: u16) -> Option<MsixEntry> {
        self.entries.get(usize::from(vector)).copied()
    }

    /// True when `vector`'s pending bit is set.
    pub fn is_pending(&self, vector: u16) -> bool {
        let v = usize::from(vector);
        self.pending.get(v / 64).is_some_and(|word| word & (1 << (v % 64)) != 0)
    }

    /// True when `vector` is masked by its own mask bit (false for an absent vector).
    pub fn is_masked(&self, vector: u16) -> bool {
        self.entry(vector).is_some_and(|e| e.masked())
    }

    /// Back to the reset state: every entry zero and masked, nothing pending.
    pub fn reset(&mut self) {
        self.entries.fill(MsixEntry::RESET);
        self.pending.fill(0);
    }

    fn set_pending(&mut self, vector: u16, pending: bool) {
        let v = usize::from(vector);
        if let Some(word) = self.pending.get_mut(v / 64) {
            if pending {
                *word |= 1 << (v % 64);
            } else {
                *word &= !(1 << (v % 64));
            }
        }
    }

    fn message(&self, vector: u16) -> Option<MsixMessage> {
        let entry = self.entry(vector)?;
        Some(MsixMessage {
            vector,
            address: entry.address,
            data: entry.data,
        })
    }

    /// End of the table in the BAR.
    fn table_end(&self) -> u64 {
        self.entries.len() as u64 * regs::MSIX_ENTRY_SIZE
    }

    /// End of the PBA in the BAR.
    fn pba_end(&self) -> u64 {
        regs::MSIX_PBA_OFFSET + self.pending.len() as u64 * 8
    }

    /// Reads `data.len()` bytes at `offset` of the MSI-X BAR. Accesses are 4 or 8 bytes,
    /// naturally aligned (PCI spec §6.8.2); any other access, and any offset outside the
    /// table and the PBA, reads as zero (traced at debug level).
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if !Self::valid_access(offset, data.len()) {
            tracing::debug!(
                offset = format_args!("{offset:#x}"),
                len = data.len(),
                "MSI-X BAR: unsupported read size or alignment reads as 0"
            );
            return;
        }
        for (i, chunk) in data.chunks_exact_mut(4).enumerate() {
            let value = self.read_dword(offset + 4 * i as u64);
            chunk.copy_from_slice(&value.to_le_bytes());
        }
    }

    fn valid_access(offset: u64, len: usize) -> bool {
        matches!(len, 4 | 8) && offset & (len as u64 - 1) == 0
    }

    fn read_dword(&self, offset: u64) -> u32 {
        if offset < self.table_end() {
            let entry = &self.entries[(offset / regs::MSIX_ENTRY_SIZE) as usize];
            match offset % regs::MSIX_ENTRY_SIZE / 4 {
                ADDRESS_LOW => entry.address as u32,
                ADDRESS_HIGH => (entry.address >> 32) as u32,
                DATA => entry.data,
                _ => entry.control,
            }
        } else if (regs::MSIX_PBA_OFFSET..self.pba_end()).contains(&offset) {
            let relative = offset - regs::MSIX_PBA_OFFSET;
            (self.pending[(relative / 8) as usize] >> (relative % 8 * 8)) as u32
        } else {
            tracing::debug!(
                offset = format_args!("{offset:#x}"),
                "MSI-X BAR: read outside the table and the PBA reads as 0"
            );
            0
        }
    }

    /// Writes `data` at `offset` of the MSI-X BAR: 4 or 8 bytes, naturally aligned, to
    /// the table (the PBA is read-only); anything else is ignored with a debug trace.
    ///
    /// A write that clears a vector's mask bit while the vector is pending delivers the
    /// pending message (with the entry's current address and data) and clears the
    /// pending bit, provided MSI-X is enabled and the function is not masked.
    pub fn write(
        &mut self,
        offset: u64,
        data: &[u8],
        msix_enabled: bool,
        function_masked: bool,
        sink: &mut dyn InterruptSink,
    ) {
        if !Self::valid_access(offset, data.len()) {
            tracing::debug!(
                offset = format_args!("{offset:#x}"),
                len = data.len(),
                "MSI-X BAR: unsupported write size or alignment ignored"
            );
            return;
        }
        for (i, chunk) in data.chunks_exact(4).enumerate() {
            let value = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if let Some(unmasked) = self.write_dword(offset + 4 * i as u64, value) {
                if msix_enabled && !function_masked {
                    self.deliver_if_pending(unmasked, sink);
                }
            }
        }
    }

    /// Applies one dword write; returns the vector whose mask bit it cleared, if any.
    fn write_dword(&mut self, offset: u64, value: u32) -> Option<u16> {
        if offset >= self.table_end() {
            tracing::debug!(
                offset = format_args!("{offset:#x}"),
                value = format_args!("{value:#x}"),
                "MSI-X BAR: write outside the table (PBA or unused space) ignored"
            );
            return None;
        }
        let vector = (offset / regs::MSIX_ENTRY_SIZE) as u16;
        let entry = &mut self.entries[usize::from(vector)];
        match offset % regs::MSIX_ENTRY_SIZE / 4 {
            ADDRESS_LOW => {
                entry.address = entry.address & !0xFFFF_FFFF | u64::from(value & !3);
            }
            ADDRESS_HIGH => {
                entry.address = entry.address & 0xFFFF_FFFF | u64::from(value) << 32;
            }
            DATA => entry.data = value,
            _ => {
                debug_assert_eq!(offset % regs::MSIX_ENTRY_SIZE / 4, CONTROL);
                let was_masked = entry.masked();
                entry.control = value & MSIX_VECTOR_MASKED;
                if was_masked && !entry.masked() {
                    return Some(vector);
                }
            }
        }
        None
    }

    fn deliver_if_pending(&mut self, vector: u16, sink: &mut dyn InterruptSink) {
        if self.is_pending(vector) && !self.is_masked(vector) {
            if let Some(message) = self.message(vector) {
                self.set_pending(vector, false);
                tracing::trace!(vector, "MSI-X: pending message delivered on unmask");
                sink.deliver(message);
            }
        }
    }

    /// Signals `vector`. With MSI-X disabled the interrupt is dropped; with the vector
    /// or the function masked its pending bit is set; otherwise the message of the
    /// vector's entry goes to `sink`. A vector beyond the table is dropped with a
    /// warning (a model bug, not a guest error).
    pub fn signal(&mut self, vector: u16, msix_enabled: bool, function_masked: bool, sink: &mut dyn InterruptSink) {
        let Some(message) = self.message(vector) else {
            tracing::warn!(
                vector,
                vectors = self.vectors(),
                "MSI-X: signal for a vector beyond the table dropped"
            );
            return;
        };
        if !msix_enabled {
            tracing::debug!(vector, "MSI-X disabled: interrupt dropped");
            return;
        }
        if function_masked || self.is_masked(vector) {
            tracing::trace!(vector, function_masked, "MSI-X: vector masked, message pending");
            self.set_pending(vector, true);
            return;
        }
        sink.deliver(message);
    }

    /// Delivers, in vector order, every pending message whose vector is not masked, and
    /// clears their pending bits. Call when the configuration space's function mask
    /// goes from 1 to 0 while MSI-X is enabled.
    pub fn function_unmasked(&mut self, sink: &mut dyn InterruptSink) {
        for vector in 0..self.vectors() {
            self.deliver_if_pending(vector, sink);
        }
    }

    /// Like [`function_unmasked`](Self::function_unmasked), but does nothing unless
    /// MSI-X is enabled and the function unmasked: safe to call after any
    /// configuration-space write to the MSI-X message control register.
    pub fn deliver_pending(&mut self, msix_enabled: bool, function_masked: bool, sink: &mut dyn InterruptSink) {
        if msix_enabled && !function_masked {
            self.function_unmasked(sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::RecordingSink;

    const ENABLED: bool = true;
    const DISABLED: bool = false;
    const MASKED: bool = true;
    const UNMASKED: bool = false;

    fn entry_offset(vector: u16) -> u64 {
        u64::from(vector) * regs::MSIX_ENTRY_SIZE
    }

    fn read32(t: &MsixTable, offset: u64) -> u32 {
        let mut b = [0; 4];
        t.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn read64(t: &MsixTable, offset: u64) -> u64 {
        let mut b = [0; 8];
        t.read(offset, &mut b);
        u64::from_le_bytes(b)
    }

    fn write32(t: &mut MsixTable, offset: u64, value: u32, sink: &mut RecordingSink) {
        t.write(offset, &value.to_le_bytes(), ENABLED, UNMASKED, sink);
    }

    /// Programs `vector` with address 0xFEE0_0000 + vector * 0x10 and data 0x4000 +
    /// vector, leaving its mask as it is.
    fn program(t: &mut MsixTable, vector: u16, sink: &mut RecordingSink) {
        let base = entry_offset(vector);
        let address = 0x1_FEE0_0000 + u64::from(vector) * 0x10;
        t.write(base, &address.to_le_bytes(), ENABLED, UNMASKED, sink);
        write32(t, base + 8, 0x4000 + u32::from(vector), sink);
    }

    fn expected(vector: u16) -> MsixMessage {
        MsixMessage {
            vector,
            address: 0x1_FEE0_0000 + u64::from(vector) * 0x10,
            data: 0x4000 + u32::from(vector),
        }
    }

    fn unmask(t: &mut MsixTable, vector: u16, function_masked: bool, sink: &mut RecordingSink) {
        t.write(
            entry_offset(vector) + 12,
            &0u32.to_le_bytes(),
            ENABLED,
            function_masked,
            sink,
        );
    }

    #[test]
    fn entries_come_out_of_reset_masked_and_zero() {
        let t = MsixTable::new(8);
        for vector in 0..8 {
            assert_eq!(read64(&t, entry_offset(vector)), 0, "address");
            assert_eq!(read32(&t, entry_offset(vector) + 8), 0, "data");
            assert_eq!(read32(&t, entry_offset(vector) + 12), 1, "vector control: masked");
        }
        assert_eq!(read64(&t, regs::MSIX_PBA_OFFSET), 0, "nothing pending");
    }

    #[test]
    fn table_entries_read_back_in_4_and_8_byte_accesses() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(4);
        program(&mut t, 2, &mut sink);
        let base = entry_offset(2);
        assert_eq!(read32(&t, base), 0xFEE0_0020);
        assert_eq!(read32(&t, base + 4), 1);
        assert_eq!(read64(&t, base), 0x1_FEE0_0020);
        assert_eq!(read64(&t, base + 8), 1 << 32 | 0x4002, "data, then control (masked)");
        write32(&mut t, base, 0xFEE0_0023, &mut sink);
        assert_eq!(read32(&t, base), 0xFEE0_0020, "address bits 1:0 are zero");
        write32(&mut t, base + 12, 0xFFFF_FFFE, &mut sink);
        assert_eq!(read32(&t, base + 12), 0, "reserved control bits read as zero");
        assert!(sink.is_empty());
    }

    #[test]
    fn unmasked_vector_delivers_its_message() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(4);
        program(&mut t, 1, &mut sink);
        unmask(&mut t, 1, UNMASKED, &mut sink);
        t.signal(1, ENABLED, UNMASKED, &mut sink);
        t.signal(1, ENABLED, UNMASKED, &mut sink);
        assert_eq!(sink.take(), vec![expected(1), expected(1)]);
        assert!(!t.is_pending(1));
    }

    #[test]
    fn masked_vector_sets_its_pba_bit_and_is_delivered_on_unmask() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(70);
        program(&mut t, 66, &mut sink);
        t.signal(66, ENABLED, UNMASKED, &mut sink);
        t.signal(66, ENABLED, UNMASKED, &mut sink);
        assert!(sink.is_empty(), "masked: nothing delivered");
        assert!(t.is_pending(66));
        assert_eq!(
            read64(&t, regs::MSIX_PBA_OFFSET + 8),
            1 << 2,
            "vector 66 is bit 2 of word 1"
        );
        assert_eq!(read32(&t, regs::MSIX_PBA_OFFSET + 8), 1 << 2);

        unmask(&mut t, 66, UNMASKED, &mut sink);
        assert_eq!(sink.take(), vec![expected(66)], "one message for both signals");
        assert!(!t.is_pending(66));
        assert_eq!(read64(&t, regs::MSIX_PBA_OFFSET + 8), 0);
    }

    #[test]
    fn the_pba_is_read_only() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(4);
        t.signal(3, ENABLED, UNMASKED, &mut sink);
        t.write(regs::MSIX_PBA_OFFSET, &0u64.to_le_bytes(), ENABLED, UNMASKED, &mut sink);
        t.write(
            regs::MSIX_PBA_OFFSET,
            &u64::MAX.to_le_bytes(),
            ENABLED,
            UNMASKED,
            &mut sink,
        );
        assert_eq!(read64(&t, regs::MSIX_PBA_OFFSET), 1 << 3);
    }

    #[test]
    fn function_mask_holds_messages_until_cleared() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(4);
        for vector in [0, 2] {
            program(&mut t, vector, &mut sink);
            unmask(&mut t, vector, MASKED, &mut sink);
        }
        t.signal(2, ENABLED, MASKED, &mut sink);
        t.signal(0, ENABLED, MASKED, &mut sink);
        assert!(sink.is_empty());
        assert!(t.is_pending(0) && t.is_pending(2));

        // Unmasking a vector while the function is masked does not deliver.
        program(&mut t, 3, &mut sink);
        t.signal(3, ENABLED, MASKED, &mut sink);
        unmask(&mut t, 3, MASKED, &mut sink);
        assert!(sink.is_empty() && t.is_pending(3));

        t.function_unmasked(&mut sink);
        assert_eq!(
            sink.take(),
            vec![expected(0), expected(2), expected(3)],
            "in vector order"
        );
        assert!(!(0..4).any(|v| t.is_pending(v)));
    }

    #[test]
    fn function_unmask_leaves_individually_masked_vectors_pending() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(2);
        t.signal(1, ENABLED, MASKED, &mut sink);
        t.function_unmasked(&mut sink);
        assert!(
            sink.is_empty() && t.is_pending(1),
            "vector 1 is still masked by its own bit"
        );
        program(&mut t, 1, &mut sink);
        unmask(&mut t, 1, UNMASKED, &mut sink);
        assert_eq!(sink.take(), vec![expected(1)]);
    }

    #[test]
    fn deliver_pending_waits_for_enable_and_function_unmask() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(1);
        program(&mut t, 0, &mut sink);
        unmask(&mut t, 0, MASKED, &mut sink);
        t.signal(0, ENABLED, MASKED, &mut sink);
        t.deliver_pending(DISABLED, UNMASKED, &mut sink);
        t.deliver_pending(ENABLED, MASKED, &mut sink);
        assert!(sink.is_empty());
        t.deliver_pending(ENABLED, UNMASKED, &mut sink);
        assert_eq!(sink.take(), vec![expected(0)]);
    }

    #[test]
    fn disabled_msix_drops_the_interrupt() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(2);
        program(&mut t, 0, &mut sink);
        unmask(&mut t, 0, UNMASKED, &mut sink);
        t.signal(0, DISABLED, UNMASKED, &mut sink);
        t.signal(1, DISABLED, MASKED, &mut sink);
        assert!(sink.is_empty());
        assert!(!t.is_pending(0) && !t.is_pending(1), "dropped, not pending");
    }

    #[test]
    fn a_vector_beyond_the_table_is_dropped() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(4);
        t.signal(4, ENABLED, UNMASKED, &mut sink);
        t.signal(u16::MAX, ENABLED, MASKED, &mut sink);
        assert!(sink.is_empty());
        assert_eq!(read64(&t, regs::MSIX_PBA_OFFSET), 0);
        assert!(!t.is_pending(4) && t.entry(4).is_none());
    }

    #[test]
    fn reset_masks_every_vector_and_clears_pending() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(4);
        program(&mut t, 1, &mut sink);
        t.signal(1, ENABLED, UNMASKED, &mut sink);
        unmask(&mut t, 2, UNMASKED, &mut sink);
        t.reset();
        assert!(!t.is_pending(1));
        for vector in 0..4 {
            assert_eq!(t.entry(vector), Some(MsixEntry::RESET));
        }
    }

    #[test]
    fn odd_sizes_alignment_and_holes_read_zero_and_ignore_writes() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(2);
        program(&mut t, 0, &mut sink);
        let mut two = [0xAA; 2];
        t.read(0, &mut two);
        assert_eq!(two, [0, 0], "2-byte read");
        let mut eight = [0xAA; 8];
        t.read(4, &mut eight);
        assert_eq!(eight, [0; 8], "misaligned 8-byte read");
        t.write(0, &[0x11, 0x22], ENABLED, UNMASKED, &mut sink);
        t.write(2, &[0; 4], ENABLED, UNMASKED, &mut sink);
        assert_eq!(read32(&t, 0), 0xFEE0_0000, "ignored writes changed nothing");
        assert_eq!(read32(&t, entry_offset(2)), 0, "past the table");
        assert_eq!(read32(&t, regs::MSIX_PBA_OFFSET + 8), 0, "past the PBA");
        assert_eq!(read32(&t, regs::MSIX_BAR_SIZE), 0, "past the BAR");
        write32(&mut t, entry_offset(2), 0x1234, &mut sink);
        assert_eq!(read32(&t, entry_offset(2)), 0);
    }

    #[test]
    fn random_accesses_never_panic() {
        let mut sink = RecordingSink::new();
        let mut t = MsixTable::new(MAX_MSIX_VECTORS);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let offset = match next() % 3 {
                0 => next() % 5000,
                1 => regs::MSIX_PBA_OFFSET - 64 + next() % 128,
                _ => next(),
            };
            let size = (next() % 9) as usize;
            let bytes = next().to_le_bytes();
            match next() % 3 {
                0 => t.write(offset, &bytes[..size], next() % 2 == 0, next() % 2 == 0, &mut sink),
                1 => {
                    let mut out = [0u8; 8];
                    t.read(offset, &mut out[..size]);
                }
                _ => t.signal((next() % 300) as u16, next() % 2 == 0, next() % 2 == 0, &mut sink),
            }
        }
        t.function_unmasked(&mut sink);
        let mut extreme = [0u8; 8];
        t.read(u64::MAX - 7, &mut extreme);
        t.write(u64::MAX - 3, &[1; 4], ENABLED, UNMASKED, &mut sink);
    }

    #[test]
    fn the_largest_table_ends_before_the_pba() {
        assert_eq!(MAX_MSIX_VECTORS, 256);
        let t = MsixTable::new(MAX_MSIX_VECTORS);
        assert_eq!(t.table_end(), regs::MSIX_PBA_OFFSET);
        assert!(t.pba_end() <= regs::MSIX_BAR_SIZE);
    }
}
