//! Record doorbells (hns §6.2): 4-byte slots in DMA memory where the driver keeps a
//! queue index for the device to read, instead of writing it to a doorbell register.
//! Like the hns provider's "db pages", slots are carved from page-sized DMA buffers; a
//! page goes back to the backend when its last slot is freed.
//!
//! A slot is zeroed when it is handed out, so a queue never starts from the index a
//! destroyed queue left there.

use super::bitmap::IndexAllocator;
use crate::device_access::{AccessError, DeviceAccess, DmaBuffer};

/// Bytes per record-doorbell page (one 4 KiB frame).
pub const RECORD_PAGE_SIZE: usize = 4096;
/// Bytes per record slot (a little-endian u32).
pub const RECORD_SLOT_SIZE: usize = 4;
const SLOTS_PER_PAGE: usize = RECORD_PAGE_SIZE / RECORD_SLOT_SIZE;

/// One page of record slots.
#[derive(Debug)]
struct RecordPage {
    buffer: DmaBuffer,
    /// The slots in use, by index in the page.
    slots: IndexAllocator,
}

/// The record-doorbell slots of one function.
#[derive(Debug, Default)]
pub struct RecordPages {
    pages: Vec<RecordPage>,
}

impl RecordPages {
    /// Bus address of a free, zeroed 4-byte slot (a new page when all are in use).
    ///
    /// # Errors
    /// The backend's, when a new page cannot be allocated or the slot not zeroed.
    pub fn allocate(&mut self, access: &dyn DeviceAccess) -> Result<u64, AccessError> {
        let page = match self
            .pages
            .iter()
            .position(|page| page.slots.in_use() < page.slots.capacity())
        {
            Some(index) => &mut self.pages[index],
            None => {
                let buffer = access.allocate_dma(RECORD_PAGE_SIZE, RECORD_PAGE_SIZE)?;
                self.pages.push(RecordPage {
                    buffer,
                    slots: IndexAllocator::new(0, SLOTS_PER_PAGE as u32),
                });
                self.pages.last_mut().expect("just pushed")
            }
        };
        let slot = page.slots.allocate().expect("a page with a free slot");
        let address = page.buffer.address() + u64::from(slot) * RECORD_SLOT_SIZE as u64;
        // A freed slot still holds its last queue's index.
        if let Err(error) = access.dma_write(address, &[0; RECORD_SLOT_SIZE]) {
            page.slots.free(slot);
            return Err(error);
        }
        Ok(address)
    }

    /// Gives slot `address` back; the device must no longer read it. Frees its page when
    /// that was the page's last slot. An address this allocator did not hand out is
    /// ignored (and logged).
    pub fn free(&mut self, access: &dyn DeviceAccess, address: u64) {
        let found = self.pages.iter().position(|page| {
            let base = page.buffer.address();
            address >= base && address < base + RECORD_PAGE_SIZE as u64
        });
        let Some(index) = found else {
            tracing::error!(address, "record doorbell freed that was never allocated");
            return;
        };
        let page = &mut self.pages[index];
        let slot = (address - page.buffer.address()) as usize / RECORD_SLOT_SIZE;
        if !page.slots.free(slot as u32) {
            tracing::error!(address, "record doorbell freed twice");
            return;
        }
        if page.slots.in_use() == 0 {
            let page = self.pages.swap_remove(index);
            access.free_dma(page.buffer);
        }
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.pages.iter().map(|page| page.slots.in_use() as usize).sum()
    }

    /// Frees every page (after the function reset: the device reads none of them).
    pub fn release_all(&mut self, access: &dyn DeviceAccess) {
        for page in self.pages.drain(..) {
            access.free_dma(page.buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::embedded::EmbeddedDevice;

    #[test]
    fn slots_fill_a_page_before_the_next_and_an_emptied_page_goes_back() {
        let device = EmbeddedDevice::new();
        let mut records = RecordPages::default();
        let slots: Vec<u64> = (0..SLOTS_PER_PAGE + 1)
            .map(|_| records.allocate(&device).unwrap())
            .collect();
        let mut distinct = slots.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), slots.len(), "every slot is handed out once");
        assert!(slots.iter().all(|slot| slot % RECORD_SLOT_SIZE as u64 == 0));
        assert_eq!(device.dma_buffers_in_use(), 2, "a full page, then one slot of a second");

        records.free(&device, slots[SLOTS_PER_PAGE]);
        assert_eq!(device.dma_buffers_in_use(), 1, "the second page had no other slot");
        device.dma_write(slots[3], &7u32.to_le_bytes()).unwrap();
        records.free(&device, slots[3]);
        records.free(&device, slots[3]);
        assert_eq!(records.in_use(), SLOTS_PER_PAGE - 1, "a double free changes nothing");
        assert_eq!(records.allocate(&device).unwrap(), slots[3], "the lowest free slot");
        let mut value = [0xFF; 4];
        device.dma_read(slots[3], &mut value).unwrap();
        assert_eq!(value, [0; 4], "zeroed when handed out again");

        records.release_all(&device);
        assert_eq!(device.dma_buffers_in_use(), 0);
    }
}
