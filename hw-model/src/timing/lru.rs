//! A small exact LRU set on a slab: nodes in one vector linked by `u32` indices (most to
//! least recently used), found through an open-addressing index of `(hash, node)` words.
//!
//! The timing model touches it once per buffer page per frame, and a large transfer
//! misses on every page, so a touch must be cheap in memory traffic as well as in
//! instructions: no allocation per key, one index word per probe (the stored hash
//! fragment rejects other keys without reading their nodes), and a node that holds its
//! key and both links in one place.

use std::hash::{BuildHasher, BuildHasherDefault, Hash};

use crate::fast_hash::WordHasher;

/// No node: the end of the list, or an empty index word.
const NONE: u32 = u32::MAX;
/// An index word with no node.
const EMPTY: u64 = u64::MAX;
/// Smallest index (in words); it doubles while it is more than half full.
const MIN_INDEX: usize = 16;

#[derive(Debug, Clone)]
struct Node<K> {
    key: K,
    /// More recently used neighbour.
    prev: u32,
    /// Less recently used neighbour.
    next: u32,
}

/// A set of at most `capacity` keys that forgets the least recently used one.
#[derive(Debug, Clone)]
pub struct LruCache<K: Hash + Eq + Copy> {
    capacity: usize,
    nodes: Vec<Node<K>>,
    /// Linear-probing index, a power of two long and at most half full: each word is the
    /// low 32 bits of a key's hash (which also give its home word) above its node number.
    index: Vec<u64>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    /// The key of `head`, kept here so a repeat is answered without reading a node.
    newest: Option<K>,
}

impl<K: Hash + Eq + Copy> LruCache<K> {
    /// An empty cache of `capacity` entries (0: nothing is ever cached). Node numbers are
    /// 32-bit, so a capacity above `u32::MAX - 1` entries acts as that many (hundreds of
    /// gigabytes of nodes, more than the process could hold).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.min(NONE as usize - 1),
            nodes: Vec::new(),
            index: Vec::new(),
            head: NONE,
            tail: NONE,
            newest: None,
        }
    }

    /// Keys cached.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn hash(key: &K) -> u32 {
        BuildHasherDefault::<WordHasher>::default().hash_one(key) as u32
    }

    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    /// The index position holding `key` (hash `hash`), or the empty word where it would go.
    fn find(&self, key: &K, hash: u32) -> (usize, bool) {
        let mask = self.mask();
        let mut position = hash as usize & mask;
        loop {
            let word = self.index[position];
            if word == EMPTY {
                return (position, false);
            }
            if (word >> 32) as u32 == hash && self.nodes[word as u32 as usize].key == *key {
                return (position, true);
            }
            position = (position + 1) & mask;
        }
    }

    /// Puts node `node` (hash `hash`) into the index at its first empty word.
    fn insert_index(&mut self, hash: u32, node: u32) {
        let mask = self.mask();
        let mut position = hash as usize & mask;
        while self.index[position] != EMPTY {
            position = (position + 1) & mask;
        }
        self.index[position] = u64::from(hash) << 32 | u64::from(node);
    }

    /// Removes the index word of node `node` (hash `hash`), shifting later words of the
    /// probe run back so every key stays reachable from its home word.
    fn remove_index(&mut self, hash: u32, node: u32) {
        let mask = self.mask();
        let mut hole = hash as usize & mask;
        while self.index[hole] as u32 != node {
            hole = (hole + 1) & mask;
        }
        let mut position = hole;
        loop {
            position = (position + 1) & mask;
            let word = self.index[position];
            if word == EMPTY {
                break;
            }
            let home = (word >> 32) as usize & mask;
            // The word may fill the hole unless its home lies cyclically in (hole, position].
            if position.wrapping_sub(home) & mask >= position.wrapping_sub(hole) & mask {
                self.index[hole] = word;
                hole = position;
            }
        }
        self.index[hole] = EMPTY;
    }

    /// Doubles the index (or makes the first one) when one more key would fill it past half.
    fn reserve_one(&mut self) {
        if (self.nodes.len() + 1) * 2 <= self.index.len() {
            return;
        }
        let size = (self.index.len() * 2).max(MIN_INDEX);
        self.index = vec![EMPTY; size];
        for node in 0..self.nodes.len() {
            let hash = Self::hash(&self.nodes[node].key);
            self.insert_index(hash, node as u32);
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = (self.nodes[i as usize].prev, self.nodes[i as usize].next);
        if prev != NONE {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NONE {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NONE;
        self.nodes[i as usize].next = self.head;
        if self.head != NONE {
            self.nodes[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NONE {
            self.tail = i;
        }
    }

    /// Uses `key`: returns whether it was cached (a hit); either way it is now the most
    /// recently used, evicting the least recently used key when full.
    pub fn touch(&mut self, key: K) -> bool {
        if self.capacity == 0 {
            return false;
        }
        // A repeat of the newest key (the same page frame after frame, the same QP
        // message after message) needs neither the hash nor the index.
        if self.newest == Some(key) {
            return true;
        }
        self.newest = Some(key);
        let hash = Self::hash(&key);
        if !self.index.is_empty() {
            let (position, found) = self.find(&key, hash);
            if found {
                let i = self.index[position] as u32;
                if self.head != i {
                    self.unlink(i);
                    self.push_front(i);
                }
                return true;
            }
        }
        let i = if self.nodes.len() < self.capacity {
            self.reserve_one();
            self.nodes.push(Node {
                key,
                prev: NONE,
                next: NONE,
            });
            (self.nodes.len() - 1) as u32
        } else {
            let victim = self.tail;
            self.unlink(victim);
            let old = Self::hash(&self.nodes[victim as usize].key);
            self.remove_index(old, victim);
            self.nodes[victim as usize].key = key;
            victim
        };
        self.insert_index(hash, i);
        self.push_front(i);
        false
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// The specification: a list from most to least recently used, searched linearly.
    struct ReferenceLru {
        capacity: usize,
        keys: VecDeque<u64>,
    }

    impl ReferenceLru {
        fn touch(&mut self, key: u64) -> bool {
            if self.capacity == 0 {
                return false;
            }
            let hit = match self.keys.iter().position(|&k| k == key) {
                Some(at) => {
                    self.keys.remove(at);
                    true
                }
                None => {
                    if self.keys.len() == self.capacity {
                        self.keys.pop_back();
                    }
                    false
                }
            };
            self.keys.push_front(key);
            hit
        }
    }

    /// SplitMix64: a seeded, reproducible key stream.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Every touch of the slab LRU answers as the reference does, and both hold the same
    /// number of keys throughout.
    fn agrees_with_the_reference(capacity: usize, key_space: u64, touches: usize, seed: u64) {
        let mut lru = LruCache::new(capacity);
        let mut reference = ReferenceLru {
            capacity,
            keys: VecDeque::new(),
        };
        let mut state = seed;
        let (mut hits, mut misses) = (0, 0);
        for step in 0..touches {
            // Mostly a small hot set, sometimes anything: both hits and evictions happen.
            let r = next(&mut state);
            let key = if r.is_multiple_of(4) {
                next(&mut state) % key_space
            } else {
                next(&mut state) % (capacity as u64 / 2 + 2)
            };
            let expected = reference.touch(key);
            assert_eq!(
                lru.touch(key),
                expected,
                "capacity {capacity}, seed {seed}, step {step}, key {key}"
            );
            assert_eq!(lru.len(), reference.keys.len());
            if expected {
                hits += 1;
            } else {
                misses += 1;
            }
        }
        assert!(capacity == 0 || (hits > 0 && misses > 0), "the stream exercises both");
    }

    #[test]
    fn hits_misses_and_evictions_match_a_reference_lru() {
        for capacity in [0, 1, 2, 3, 7, 64, 1000] {
            for seed in 1..=3 {
                agrees_with_the_reference(capacity, capacity as u64 * 3 + 5, 20_000, seed);
            }
        }
    }

    #[test]
    fn tuple_keys_that_collide_in_the_index_stay_apart() {
        // Many keys with the same page and different roots, and the other way round.
        let mut lru = LruCache::new(300);
        for round in 0..3 {
            for i in 0..150u64 {
                assert_eq!(lru.touch((i, 7u64)), round > 0, "root {i}");
                assert_eq!(lru.touch((7u64, 1000 + i)), round > 0, "page {}", 1000 + i);
            }
        }
        assert_eq!(lru.len(), 300);
    }

    #[test]
    fn a_cyclic_stream_one_larger_than_the_cache_always_misses() {
        let mut lru = LruCache::new(4096);
        let mut misses = 0;
        for _ in 0..3 {
            for page in 0..4097u64 {
                misses += usize::from(!lru.touch((1u64, page)));
            }
        }
        assert_eq!(misses, 3 * 4097);
        assert_eq!(lru.len(), 4096);
    }
}
