//! Object-number allocation: a bitmap over `first..end` handing out the lowest free
//! number (as the kernel's IDA does), so numbers are dense and reuse is predictable.

/// A bitmap allocator of object numbers in `first..end`.
#[derive(Debug, Clone)]
pub struct IndexAllocator {
    first: u32,
    end: u32,
    words: Vec<u64>,
    /// Every word below this index is full.
    lowest_candidate_word: usize,
    in_use: u32,
}

impl IndexAllocator {
    /// Numbers `first..end` available (numbers below `first` are reserved).
    pub fn new(first: u32, end: u32) -> Self {
        let end = end.max(first);
        let bits = (end - first) as usize;
        Self {
            first,
            end,
            words: vec![0; bits.div_ceil(64)],
            lowest_candidate_word: 0,
            in_use: 0,
        }
    }

    /// The lowest free number, marked used; `None` when all are in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let bits = self.end - self.first;
        for word_index in self.lowest_candidate_word..self.words.len() {
            let word = self.words[word_index];
            if word == u64::MAX {
                continue;
            }
            let bit = (!word).trailing_zeros();
            let offset = word_index as u32 * 64 + bit;
            if offset >= bits {
                break;
            }
            self.words[word_index] |= 1 << bit;
            self.lowest_candidate_word = word_index;
            self.in_use += 1;
            return Some(self.first + offset);
        }
        self.lowest_candidate_word = self.words.len();
        None
    }

    /// Marks `number` used (for fixed numbers such as the GSI QP); false if it is out of
    /// range or already used.
    pub fn reserve(&mut self, number: u32) -> bool {
        if number < self.first || number >= self.end {
            return false;
        }
        let offset = (number - self.first) as usize;
        let (word, bit) = (offset / 64, offset % 64);
        if self.words[word] & (1 << bit) != 0 {
            return false;
        }
        self.words[word] |= 1 << bit;
        self.in_use += 1;
        true
    }

    /// Returns `number`; false if it was not allocated.
    pub fn free(&mut self, number: u32) -> bool {
        if number < self.first || number >= self.end {
            return false;
        }
        let offset = (number - self.first) as usize;
        let (word, bit) = (offset / 64, offset % 64);
        if self.words[word] & (1 << bit) == 0 {
            return false;
        }
        self.words[word] &= !(1 << bit);
        self.lowest_candidate_word = self.lowest_candidate_word.min(word);
        self.in_use -= 1;
        true
    }

    /// Whether `number` is allocated.
    pub fn is_allocated(&self, number: u32) -> bool {
        if number < self.first || number >= self.end {
            return false;
        }
        let offset = (number - self.first) as usize;
        self.words[offset / 64] & (1 << (offset % 64)) != 0
    }

    /// Numbers currently allocated.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Numbers that can ever be allocated.
    pub fn capacity(&self) -> u32 {
        self.end - self.first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_lowest_free_number_above_the_reserved_range() {
        let mut a = IndexAllocator::new(8, 200);
        assert_eq!(a.allocate(), Some(8));
        assert_eq!(a.allocate(), Some(9));
        assert!(a.free(8));
        assert!(!a.free(8), "double free is refused");
        assert_eq!(a.allocate(), Some(8));
        assert_eq!(a.in_use(), 2);
    }

    #[test]
    fn runs_out_exactly_at_the_end() {
        let mut a = IndexAllocator::new(1, 131);
        let all: Vec<u32> = std::iter::from_fn(|| a.allocate()).collect();
        assert_eq!(all.len(), 130);
        assert_eq!(*all.last().unwrap(), 130);
        assert_eq!(a.allocate(), None);
        assert!(a.free(70));
        assert_eq!(a.allocate(), Some(70));
    }

    #[test]
    fn reserve_takes_a_fixed_number() {
        let mut a = IndexAllocator::new(0, 16);
        assert!(a.reserve(1));
        assert!(!a.reserve(1));
        assert_eq!(a.allocate(), Some(0));
        assert_eq!(a.allocate(), Some(2));
        assert!(a.is_allocated(1));
    }
}
