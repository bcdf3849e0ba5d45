//! Object-number allocation: a bitmap over `first..end` handing out the lowest free
//! number (as the kernel's IDA does), so numbers are dense and reuse is predictable;
//! or, for numbers a peer sees on the wire, round robin (as hns hands out QP numbers:
//! the search starts after the last number given), so a number just freed is not
//! handed straight back while a peer may still hold state for it.

/// A bitmap allocator of object numbers in `first..end`.
#[derive(Debug, Clone)]
pub struct IndexAllocator {
    first: u32,
    end: u32,
    words: Vec<u64>,
    /// Every word below this index is full (lowest-free mode only).
    lowest_candidate_word: usize,
    in_use: u32,
    /// Round-robin mode: the offset (from `first`) where the next search starts.
    next_offset: Option<u32>,
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
            next_offset: None,
        }
    }

    /// Numbers `first..end` handed out round robin: each search starts after the number
    /// last given and wraps at `end`, so a freed number comes back only once the search
    /// has passed every number after it.
    pub fn round_robin(first: u32, end: u32) -> Self {
        Self {
            next_offset: Some(0),
            ..Self::new(first, end)
        }
    }

    /// A free number, marked used: the lowest, or in round-robin mode the first at or
    /// after the search position; `None` when all are in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let Some(start) = self.next_offset else {
            return self.allocate_lowest();
        };
        let bits = self.end - self.first;
        let offset = self
            .first_free_in(start, bits)
            .or_else(|| self.first_free_in(0, start))?;
        self.mark_used(offset);
        self.next_offset = Some(if offset + 1 >= bits { 0 } else { offset + 1 });
        Some(self.first + offset)
    }

    /// The first clear bit in offsets `from..to`.
    fn first_free_in(&self, from: u32, to: u32) -> Option<u32> {
        let mut offset = from;
        while offset < to {
            let (word, bit) = ((offset / 64) as usize, offset % 64);
            let free = !self.words[word] & (u64::MAX << bit);
            if free != 0 {
                let found = word as u32 * 64 + free.trailing_zeros();
                return (found < to).then_some(found);
            }
            offset = (word as u32 + 1) * 64;
        }
        None
    }

    fn mark_used(&mut self, offset: u32) {
        self.words[(offset / 64) as usize] |= 1 << (offset % 64);
        self.in_use += 1;
    }

    fn allocate_lowest(&mut self) -> Option<u32> {
        let bits = self.end - self.first;
        let Some(offset) = self.first_free_in(self.lowest_candidate_word as u32 * 64, bits) else {
            self.lowest_candidate_word = self.words.len();
            return None;
        };
        self.lowest_candidate_word = (offset / 64) as usize;
        self.mark_used(offset);
        Some(self.first + offset)
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
    fn round_robin_hands_a_freed_number_back_only_after_every_other() {
        let mut a = IndexAllocator::round_robin(2, 6);
        assert_eq!(a.allocate(), Some(2));
        assert_eq!(a.allocate(), Some(3));
        assert!(a.free(2));
        assert_eq!(a.allocate(), Some(4), "not the number just freed");
        assert!(a.free(3));
        assert_eq!(a.allocate(), Some(5));
        assert_eq!(a.allocate(), Some(2), "wraps at the end to the first free number");
        assert_eq!(a.allocate(), Some(3));
        assert_eq!(a.allocate(), None, "all four in use");
        assert!(a.free(4));
        assert_eq!(a.allocate(), Some(4));
        assert_eq!(a.in_use(), 4);
    }

    #[test]
    fn round_robin_searches_across_words_and_skips_reserved_numbers() {
        let mut a = IndexAllocator::round_robin(0, 200);
        assert!(a.reserve(1));
        assert_eq!(a.allocate(), Some(0));
        assert_eq!(a.allocate(), Some(2), "the reserved number is skipped");
        let rest: Vec<u32> = std::iter::from_fn(|| a.allocate()).collect();
        assert_eq!(rest.len(), 197);
        assert_eq!(rest.first(), Some(&3));
        assert_eq!(rest.last(), Some(&199));
        assert!(a.free(64) && a.free(150));
        assert_eq!(a.allocate(), Some(64), "wraps past the end, then searches forward");
        assert_eq!(a.allocate(), Some(150));
        assert_eq!(a.allocate(), None);
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
