//! # rnic-os — the project's one home for `unsafe` OS calls
//!
//! Every `unsafe` block of the workspace that talks to the operating system lives in
//! this crate, behind small safe functions and types, each block with a `SAFETY`
//! comment. The emulator (`rnic-emu`, whose vfio-user server) and the verbs provider
//! (`rnic-verbs`, whose vfio-user client backend) both use it; they are
//! `#![deny(unsafe_code)]` themselves. Here too the crate root denies `unsafe` and only
//! the modules that make system calls allow it.
//!
//! What needs raw system calls and why:
//!
//! * shared memory ([`memfd_create`], [`file_seals`], [`MappedRegion`]): `memfd_create`,
//!   file seals and `mmap`/`munmap` — the doorbell pages the server exports and the client
//!   maps, and the client's DMA memory the device reads and writes;
//! * [`eventfd`] — one per MSI-X vector, handed from the client to the server with
//!   SET_IRQS, and the server's own wake-up descriptor;
//! * `sendmsg`/`recvmsg` with `SCM_RIGHTS` ([`send_with_fds`], [`recv_with_fds`]) —
//!   vfio-user passes descriptors as ancillary data, which `std` cannot do yet;
//! * `ppoll` ([`wait_readable`], [`wait_writable`]) — sub-millisecond waits on sockets and
//!   eventfds;
//! * `recvmmsg`/`sendmmsg` ([`receive_datagrams`], [`send_segmented`]), `UDP_SEGMENT`
//!   (the same call), `UDP_GRO` ([`enable_receive_coalescing`]) and `SO_SNDBUF`
//!   ([`set_send_buffer`]) — UDP datagrams in batches, cut and joined by the kernel, for
//!   the `udp:` network backend;
//! * `socket`/`bind`/`listen` ([`bind_unix_listener`]) — to restrict the socket's mode to
//!   0600 *before* anyone can connect (std's `UnixListener::bind` listens at once);
//! * pinned DMA memory and device registers for a user-space driver on a PCI function
//!   ([`MappedRegion::anonymous_locked`]: `mmap` with `MAP_HUGETLB`, `mlock`;
//!   [`MappedRegion::read_volatile_u32`] and friends: single, volatile MMIO accesses to
//!   a BAR mapped from its sysfs `resourceN` file), and [`PageMap`], the
//!   `/proc/self/pagemap` reader that turns their virtual addresses into physical ones;
//! * an application's own registered memory ([`ApplicationRange`]), which the device
//!   model of the drop-in `libibverbs.so.1` reads and writes in place, and `mlock`
//!   ([`lock_pages`]) for registrations on a PCI function;
//! * `setns`, `prctl(PR_SET_TIMERSLACK)` and `sigaction` for the emulator process
//!   ([`enter_network_namespace`], [`set_thread_timer_slack`],
//!   [`install_termination_handlers`]);
//! * `pthread_sigmask` ([`spawn_with_signals_blocked`]) — the drop-in libraries' threads
//!   must not take the application's process-directed signals;
//! * `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` ([`thread_cpu_time`]) — a benchmark's CPU
//!   cost on a machine shared with other work, which `std` does not offer;
//! * `madvise(MADV_HUGEPAGE)` ([`advise_huge_pages`]) — transparent huge pages for large
//!   registered application buffers and the storage crate's RAM disks, read at random;
//! * `prefetcht1` ([`read_ahead`]) — not a system call, but the one `unsafe` the device
//!   model needs: the page after a DMA copy that ended at a page boundary, asked for
//!   while the model does a packet's other work (`core::arch` offers the instruction as
//!   an `unsafe` function).
//!
//! Memory shared with another process is only ever touched through raw pointers
//! (`copy_nonoverlapping`) or atomics, never through Rust references: the other process
//! writes it concurrently, which a `&[u8]` would promise cannot happen.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod application;
mod cache;
mod datagram;
mod event;
mod memory;
mod pagemap;
mod process;
mod socket;
mod thread;

use std::io;

pub use application::{advise_huge_pages, lock_pages, unlock_pages, ApplicationRange};
pub use cache::{read_ahead, READ_AHEAD_BYTES};
pub use datagram::{
    enable_receive_coalescing, receive_datagrams, send_segmented, wait_writable, DatagramBatch, SegmentedDatagrams,
    MAX_BATCH as MAX_DATAGRAM_BATCH, MAX_SEGMENTED_BYTES, MAX_SEGMENTS,
};
pub use event::{eventfd, take_eventfd, wait_readable};
pub use memory::{file_seals, host_page_size, memfd_create, MappedRegion, PageSize, Protection};
pub use pagemap::{PageMap, PagemapEntry, PAGEMAP_PFN_MASK, PAGEMAP_PRESENT, PAGEMAP_SWAPPED};
pub use process::{
    enter_network_namespace, install_termination_handlers, set_thread_timer_slack, termination_requested,
};
pub use socket::{
    bind_unix_listener, recv_with_fds, send_with_fds, set_receive_buffer, set_send_buffer, Received,
    MAX_FDS_PER_MESSAGE,
};
pub use thread::{signal_blocked_in_this_thread, spawn_with_signals_blocked, thread_cpu_time};

/// Turns a negative libc return value into the thread's `errno`.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}
