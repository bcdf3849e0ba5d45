//! A small exact LRU set: a hash map from key to a slot in an intrusive doubly linked list.

use std::hash::Hash;

use crate::fast_hash::FastHashMap;

const NONE: usize = usize::MAX;

#[derive(Debug, Clone)]
struct Node<K> {
    key: K,
    prev: usize,
    next: usize,
}

/// A set of at most `capacity` keys that forgets the least recently used one.
#[derive(Debug, Clone)]
pub struct LruCache<K: Hash + Eq + Copy> {
    capacity: usize,
    map: FastHashMap<K, usize>,
    nodes: Vec<Node<K>>,
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
}

impl<K: Hash + Eq + Copy> LruCache<K> {
    /// An empty cache of `capacity` entries (0: nothing is ever cached).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            map: FastHashMap::default(),
            nodes: Vec::new(),
            head: NONE,
            tail: NONE,
        }
    }

    /// Keys cached.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev != NONE {
            self.nodes[prev].next = next;
        } else {
            self.head = next;
        }
        if next != NONE {
            self.nodes[next].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NONE;
        self.nodes[i].next = self.head;
        if self.head != NONE {
            self.nodes[self.head].prev = i;
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
        if let Some(&i) = self.map.get(&key) {
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            return true;
        }
        let i = if self.nodes.len() < self.capacity {
            self.nodes.push(Node {
                key,
                prev: NONE,
                next: NONE,
            });
            self.nodes.len() - 1
        } else {
            let victim = self.tail;
            self.unlink(victim);
            let old = self.nodes[victim].key;
            self.map.remove(&old);
            self.nodes[victim].key = key;
            victim
        };
        self.push_front(i);
        self.map.insert(key, i);
        false
    }
}
