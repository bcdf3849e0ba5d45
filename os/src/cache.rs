//! Read-ahead for the device model's DMA streams: a hint to the CPU's caches.
//!
//! The model copies a message a packet at a time (4 KiB at the 4096 MTU), with one to two
//! microseconds of other work (headers, checks, timing, the other device) between two
//! pages of the same buffer. The CPU's own stream prefetchers stop at the 4 KiB page
//! boundary, so every page of a buffer past the last-level cache started cold: its copy
//! waited on memory instead of overlapping with that other work. A copy that ends at a
//! page boundary therefore asks for the page after it here. A hint has no effect on what
//! any access reads or writes (the model stays deterministic), and it never faults.
//!
//! The hint asks for the second-level cache (`prefetcht1`), not the first: a page per
//! copy would churn the first level (32 KiB here), which holds the model's own state
//! (contexts, tables, the frame being built), and from the second the copy's loads are a
//! short wait that the CPU's first-level prefetchers hide within the page. The destination of a write is asked
//! for the same way: a line no other core holds arrives exclusive, and the stores that
//! follow take it without another trip. (`prefetcht0`, and `prefetchw` for writes, was
//! measured too: nowhere faster beyond the rounds' spread; docs/benchmarks.md, "Cold
//! buffers".)
//!
//! This module holds the instruction itself, which Rust's `core::arch` only offers as an
//! `unsafe` function; on other architectures it does nothing.
#![allow(unsafe_code)]

/// Bytes apart of the lines a prefetch asks for (the cache line of x86-64 CPUs).
const LINE: usize = 64;

/// Bytes a copy that ends at a page boundary asks for after it: one page.
pub const READ_AHEAD_BYTES: usize = 4096;

/// Asks the CPU to start loading every cache line of `bytes` into its second-level cache.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        // A counted loop over addresses: it runs after every page-sized copy, also when
        // the page is in the cache already, and `chunks` cost ≈ 5 instructions a line
        // more (8 % of a hot 64 KiB WRITE run).
        let start = bytes.as_ptr();
        let mut offset = 0;
        while offset < bytes.len() {
            // Pointer arithmetic only: nothing is dereferenced here.
            let address = start.wrapping_add(offset).cast::<i8>();
            // SAFETY: a prefetch reads and writes no memory and raises no fault whatever the
            // address (Intel SDM and AMD APM, PREFETCHh), and this one is inside a live
            // slice; `sse`, which the intrinsic is declared with, is part of every x86-64
            // CPU.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(address) };
            offset += LINE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The page of a buffer of `length` bytes (pages from offset 0) that follows a copy that
/// ended at byte `end`, if the copy ended at a page boundary and the buffer goes on (at
/// most [`READ_AHEAD_BYTES`], never past `length`).
#[inline]
fn read_ahead_range(end: usize, length: usize) -> Option<std::ops::Range<usize>> {
    if end == 0 || end % READ_AHEAD_BYTES != 0 || end >= length {
        return None;
    }
    Some(end..end + READ_AHEAD_BYTES.min(length - end))
}

/// After a copy that ended at byte `end` of `buffer` (whose pages start at offset 0), out
/// of it or into it: a prefetch of the buffer's next page when the copy ended at a page
/// boundary.
#[inline]
pub fn read_ahead(buffer: &[u8], end: usize) {
    if let Some(range) = read_ahead_range(end, buffer.len()) {
        prefetch(&buffer[range]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_any_slice_leaves_its_bytes_as_they_were() {
        let mut bytes = vec![0u8; 3 * READ_AHEAD_BYTES + 17];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = i as u8;
        }
        let before = bytes.clone();
        prefetch(&bytes);
        prefetch(&bytes[5..70]);
        prefetch(&bytes[..0]);
        prefetch(&bytes[bytes.len() - 1..]);
        read_ahead(&bytes, READ_AHEAD_BYTES);
        read_ahead(&bytes, 3 * READ_AHEAD_BYTES);
        assert_eq!(bytes, before);
    }

    #[test]
    fn a_copy_that_ends_at_a_page_boundary_reads_ahead_the_next_page_inside_the_buffer() {
        let page = READ_AHEAD_BYTES;
        assert_eq!(read_ahead_range(page, 4 * page), Some(page..2 * page));
        assert_eq!(read_ahead_range(3 * page, 4 * page), Some(3 * page..4 * page));
        // The buffer's last page is short: only what is there.
        assert_eq!(read_ahead_range(page, page + 100), Some(page..page + 100));
    }

    #[test]
    fn a_copy_that_ends_inside_a_page_or_at_the_buffer_end_reads_nothing_ahead() {
        let page = READ_AHEAD_BYTES;
        assert_eq!(read_ahead_range(page - 64, 4 * page), None);
        assert_eq!(read_ahead_range(4 * page, 4 * page), None);
        assert_eq!(read_ahead_range(0, 4 * page), None);
        assert_eq!(read_ahead_range(8 * page, 4 * page), None);
    }
}
