//! A hasher for the model's small integer keys (frame numbers, object indices, cache
//! keys): one multiply per word (Fibonacci hashing). The maps it serves are looked up
//! on every DMA access and every packet, where SipHash's cost showed in the profile
//! (docs/benchmarks.md); their keys come from the device's own arithmetic, and none of
//! them is ever iterated, so neither flooding resistance nor order matters.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` hashed with [`WordHasher`].
pub(crate) type FastHashMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// A `HashSet` hashed with [`WordHasher`].
pub(crate) type FastHashSet<K> = HashSet<K, BuildHasherDefault<WordHasher>>;

/// 2⁶⁴ over the golden ratio: the multiplier of Fibonacci hashing, whose product's top
/// bits spread consecutive or evenly spaced keys.
pub(crate) const FIBONACCI_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// One multiply per word. Byte slices (what arrays of integers hash as) are folded in
/// eight bytes at a time.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut le = [0u8; 8];
            le.copy_from_slice(word);
            self.write_u64(u64::from_le_bytes(le));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut le = [0u8; 8];
            le[..rest.len()].copy_from_slice(rest);
            // The length keeps b"\0" and b"" (and other zero-padded tails) apart.
            self.write_u64(u64::from_le_bytes(le) ^ (rest.len() as u64) << 59);
        }
    }
    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }
    fn write_u16(&mut self, value: u16) {
        self.write_u64(u64::from(value));
    }
    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }
    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
    fn write_u64(&mut self, value: u64) {
        // The high bits of the product pick the bucket group and the control byte; fold
        // them down so both halves of the hash are well mixed. Rotating the running state
        // first keeps (a, b) and (b, a) apart in tuple keys.
        let h = (self.0.rotate_left(5) ^ value).wrapping_mul(FIBONACCI_MULTIPLIER);
        self.0 = h ^ (h >> 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash<T: std::hash::Hash>(value: T) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(value)
    }

    #[test]
    fn consecutive_keys_spread_over_the_low_and_high_bits() {
        let hashes: Vec<u64> = (0u64..1024).map(hash).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0x3FF).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 600, "low 10 bits take {} distinct values", low.len());
        assert_eq!(high.len(), 128, "the top 7 bits (hashbrown's tag) take every value");
    }

    #[test]
    fn tuple_keys_depend_on_field_order() {
        assert_ne!(hash((1u64, 2u64)), hash((2u64, 1u64)));
        assert_ne!(hash((0u64, 5u64)), hash((5u64, 0u64)));
    }

    #[test]
    fn byte_slices_hash_by_content_and_length() {
        let words: [u64; 3] = [1, 2, 3];
        assert_eq!(hash(words), hash([1u64, 2, 3]));
        assert_ne!(hash(words), hash([1u64, 3, 2]));
        let mut a = WordHasher::default();
        a.write(b"");
        let mut b = WordHasher::default();
        b.write(b"\0");
        let mut c = WordHasher::default();
        c.write(b"\0\0");
        assert_ne!(a.finish(), b.finish());
        assert_ne!(b.finish(), c.finish());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map = FastHashMap::default();
        for key in 0u32..10_000 {
            map.insert(key.wrapping_mul(4096), key);
        }
        for key in 0u32..10_000 {
            assert_eq!(map.get(&key.wrapping_mul(4096)), Some(&key));
        }
        assert_eq!(map.get(&1), None);
    }
}
