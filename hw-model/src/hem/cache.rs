//! The device's write-back context cache (hns keeps QPCs and CQCs in an on-chip cache
//! and writes them back to the HEM lazily).
//!
//! The engines update a QP's consumer indices and PSNs and a CQ's producer index on every
//! message; writing the whole context back to host memory each time is traffic the
//! hardware does not have. The cache holds the contexts the device has read, by bus
//! address (an object's address is fixed until a BT change, and every BT change comes
//! with a firmware command, mailbox or reset, which write the cache back and empty it).
//!
//! A context is written through once (the first write after it was read), which proves
//! that host memory takes writes there and keeps the error paths of a context the driver
//! mapped read-only exactly as without a cache; later writes only change the cached copy
//! and mark it dirty. [`ContextCache::take_dirty`] hands the dirty copies out for the
//! write-back, in address order.

use rnic_firmware_if::context::QPC_SIZE;

use crate::fast_hash::FastHashMap;

/// The largest context the cache holds (the QPC).
const MAX_CONTEXT: usize = QPC_SIZE;

/// Most contexts the cache holds; when it is full the device writes everything back and
/// starts over, so a hostile driver touching many objects only costs it traffic.
pub const CONTEXT_CACHE_CAPACITY: usize = 4096;

/// One cached context.
#[derive(Debug, Clone)]
struct CachedContext {
    bytes: [u8; MAX_CONTEXT],
    len: usize,
    /// A write to host memory at this address has succeeded since the context was read.
    written: bool,
    /// The cached copy is newer than host memory.
    dirty: bool,
}

/// Contexts by bus address; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct ContextCache {
    entries: FastHashMap<u64, CachedContext>,
    dirty: usize,
}

impl ContextCache {
    /// The cached `len` bytes at `address`, if the cache holds a context of that size there.
    pub fn lookup(&self, address: u64, len: usize) -> Option<&[u8]> {
        self.entries
            .get(&address)
            .filter(|entry| entry.len == len)
            .map(|entry| &entry.bytes[..len])
    }

    /// Whether the cache is full: write back and [`clear`](Self::clear) before filling.
    pub fn is_full(&self) -> bool {
        self.entries.len() >= CONTEXT_CACHE_CAPACITY
    }

    /// Remembers `bytes` just read from host memory at `address` (a clean copy). Contexts
    /// larger than the QPC are not cached.
    pub fn fill(&mut self, address: u64, bytes: &[u8]) {
        let len = bytes.len();
        if len > MAX_CONTEXT {
            return;
        }
        let mut entry = CachedContext {
            bytes: [0; MAX_CONTEXT],
            len,
            written: false,
            dirty: false,
        };
        entry.bytes[..len].copy_from_slice(bytes);
        if let Some(old) = self.entries.insert(address, entry) {
            self.dirty -= usize::from(old.dirty);
        }
    }

    /// Takes a write of `bytes` to `address` into the cache: true when the cache holds a
    /// context of that size there that has been written through before (the write is
    /// done, host memory is now stale); false when the caller must write host memory and
    /// then report it with [`written_through`](Self::written_through).
    pub fn absorb(&mut self, address: u64, bytes: &[u8]) -> bool {
        let Some(entry) = self.entries.get_mut(&address) else {
            return false;
        };
        if !entry.written || entry.len != bytes.len() {
            return false;
        }
        entry.bytes[..entry.len].copy_from_slice(bytes);
        if !entry.dirty {
            entry.dirty = true;
            self.dirty += 1;
        }
        true
    }

    /// `bytes` were written to host memory at `address`: the cached copy (if any) is
    /// now those bytes, clean, and later writes may stay in the cache. A write of another
    /// size drops the cached context (it no longer matches host memory).
    pub fn written_through(&mut self, address: u64, bytes: &[u8]) {
        let Some(entry) = self.entries.get_mut(&address) else {
            return;
        };
        if entry.len != bytes.len() {
            if let Some(old) = self.entries.remove(&address) {
                self.dirty -= usize::from(old.dirty);
            }
            return;
        }
        entry.bytes[..entry.len].copy_from_slice(bytes);
        entry.written = true;
        if entry.dirty {
            entry.dirty = false;
            self.dirty -= 1;
        }
    }

    /// Whether some cached context is newer than host memory.
    pub fn has_dirty(&self) -> bool {
        self.dirty > 0
    }

    /// The dirty contexts (address, bytes) in address order, now marked clean.
    pub fn take_dirty(&mut self) -> Vec<(u64, Vec<u8>)> {
        if self.dirty == 0 {
            return Vec::new();
        }
        let mut dirty: Vec<(u64, Vec<u8>)> = self
            .entries
            .iter_mut()
            .filter(|(_, entry)| entry.dirty)
            .map(|(address, entry)| {
                entry.dirty = false;
                (*address, entry.bytes[..entry.len].to_vec())
            })
            .collect();
        self.dirty = 0;
        dirty.sort_unstable_by_key(|(address, _)| *address);
        dirty
    }

    /// Forgets every context (write the dirty ones back first).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.dirty = 0;
    }

    /// Number of contexts held (for tests).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds no context.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_context_is_written_through_once_then_kept_dirty_in_the_cache() {
        let mut cache = ContextCache::default();
        cache.fill(0x1000, &[1; 64]);
        assert_eq!(cache.lookup(0x1000, 64), Some(&[1u8; 64][..]));
        assert!(!cache.absorb(0x1000, &[2; 64]), "the first write goes to host memory");
        cache.written_through(0x1000, &[2; 64]);
        assert!(!cache.has_dirty());
        assert!(cache.absorb(0x1000, &[3; 64]), "later writes stay in the cache");
        assert_eq!(cache.lookup(0x1000, 64), Some(&[3u8; 64][..]));
        assert!(cache.has_dirty());
        assert_eq!(cache.take_dirty(), vec![(0x1000, vec![3; 64])]);
        assert!(!cache.has_dirty(), "written back once");
        assert!(cache.take_dirty().is_empty());
    }

    #[test]
    fn a_failed_write_through_keeps_every_later_write_going_to_host_memory() {
        let mut cache = ContextCache::default();
        cache.fill(0x1000, &[1; 64]);
        assert!(!cache.absorb(0x1000, &[2; 64]));
        // The caller's write failed: no `written_through`.
        assert!(!cache.absorb(0x1000, &[2; 64]), "still not proven writable");
        assert_eq!(cache.lookup(0x1000, 64), Some(&[1u8; 64][..]), "host memory's bytes");
    }

    #[test]
    fn writes_to_addresses_the_cache_never_read_go_to_host_memory() {
        let mut cache = ContextCache::default();
        assert!(!cache.absorb(0x2000, &[1; 64]));
        cache.written_through(0x2000, &[1; 64]);
        assert!(cache.is_empty(), "only contexts the device read are cached");
    }

    #[test]
    fn a_lookup_or_write_of_another_size_does_not_use_the_cached_context() {
        let mut cache = ContextCache::default();
        cache.fill(0x1000, &[1; 256]);
        assert_eq!(cache.lookup(0x1000, 64), None);
        cache.written_through(0x1000, &[1; 256]);
        assert!(!cache.absorb(0x1000, &[2; 64]));
        cache.written_through(0x1000, &[2; 64]);
        assert_eq!(cache.lookup(0x1000, 256), None, "host memory changed under it: dropped");
    }

    #[test]
    fn dirty_contexts_are_handed_out_in_address_order() {
        let mut cache = ContextCache::default();
        for address in [0x3000u64, 0x1000, 0x2000] {
            cache.fill(address, &[0; 64]);
            cache.written_through(address, &[0; 64]);
        }
        assert!(cache.absorb(0x3000, &[3; 64]));
        assert!(cache.absorb(0x1000, &[1; 64]));
        let addresses: Vec<u64> = cache.take_dirty().into_iter().map(|(a, _)| a).collect();
        assert_eq!(addresses, vec![0x1000, 0x3000]);
    }
}
