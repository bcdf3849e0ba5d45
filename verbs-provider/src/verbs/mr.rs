//! Memory regions (`ibv_mr`): an MPT entry per region, whose PBL (an MTR over the
//! region's pages) lets the device translate `iova + offset` to bus addresses.
//!
//! Two kinds of memory can be registered:
//!
//! * provider memory ([`ProtectionDomain::register_provider_memory`]): a contiguous DMA
//!   buffer the driver allocates — the PBL then uses the largest page the buffer's size
//!   and alignment allow;
//! * application memory ([`ProtectionDomain::register_user_memory`]): the application
//!   hands its `Vec<u8>` over, the backend maps it page by page (possibly scattered), and
//!   deregistration hands it back.
//!
//! The page size chosen is the largest one (up to 1 GiB, among `page_size_cap`) for which
//! the pages form aligned contiguous blocks and the iova is aligned; the hop count is the
//! smallest whose root fits one BT page. Register = MPT index → context-table get → PBL →
//! `CREATE_MPT`; deregister = `DESTROY_MPT` → context-table put → free the PBL.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::mpt::index_to_key;
use rnic_firmware_if::context::{Mpt, MptState, MPT_SIZE};
use rnic_firmware_if::mailbox::{ContextTable, MailboxOpcode};
use rnic_firmware_if::mtr::{MtrRegion, MIN_PAGE_SHIFT};

use super::error::{DestroyError, Result, VerbsError};
use super::pd::{PdInner, ProtectionDomain};
use crate::device_access::{DeviceAccess, DmaBuffer, UserMemory, USER_PAGE_SIZE};
use crate::driver::dma::{largest_page_blocks, Mtr, PAGE_SIZE};
use crate::mtr::{choose_hop, MAX_BUFFER_PAGE_SHIFT};

bitflags::bitflags! {
    /// `ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`.
        const MW_BIND = 1 << 4;
    }
}

impl AccessFlags {
    /// ibverbs rule: remote write or remote atomic access requires local write.
    fn check(self) -> Result<()> {
        if self.intersects(Self::REMOTE_WRITE | Self::REMOTE_ATOMIC) && !self.contains(Self::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument(format!(
                "access {self:?}: remote write and remote atomic need LOCAL_WRITE"
            )));
        }
        Ok(())
    }
}

/// BT page shift of MR PBLs (4 KiB BT pages).
const PBL_BA_PAGE_SHIFT: u32 = 12;

enum Memory {
    Provider(DmaBuffer),
    User(UserMemory),
    /// The application's own bytes, reached in place.
    Application(UserMemory),
}

pub(crate) struct MrInner {
    pd: Arc<PdInner>,
    index: u32,
    key: u32,
    iova: u64,
    length: u64,
    access: AccessFlags,
    /// 4 KiB page addresses, for the CPU helpers.
    pages: Vec<u64>,
    /// Where the region starts inside `pages[0]` (`iova % 4096`: an application buffer
    /// need not start on a page).
    first_page_offset: u64,
    page_shift: u32,
    hop: u8,
    released: AtomicBool,
    /// Freed at release; `None` afterwards.
    resources: Mutex<Option<(Memory, Mtr)>>,
}

impl MrInner {
    /// `DESTROY_MPT`, context-table put, free the PBL and the memory. Returns the
    /// application's bytes when the memory was theirs.
    fn release(&self) -> (Result<()>, Option<Vec<u8>>) {
        if self.released.swap(true, Ordering::AcqRel) {
            return (Ok(()), None);
        }
        let context = &self.pd.context;
        let mut result = Ok(());
        context.unlist_mr(self.key, self);
        {
            let mut state = context.lock();
            if let Err(e) = state.driver.mailbox_plain(MailboxOpcode::DestroyMpt, self.index) {
                tracing::error!(index = self.index, %e, "DESTROY_MPT failed");
                result = Err(VerbsError::mailbox("destroy MPT")(e));
            }
            if let Err(e) = state.driver.context_put(ContextTable::Mpt, self.index) {
                result = result.and(Err(VerbsError::context_table("release MPT entry")(e)));
            }
            state.allocators.mrs.free(self.index);
        }
        let resources = self.resources.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut bytes = None;
        if let Some((memory, mtr)) = resources {
            let access: &dyn DeviceAccess = &*context.access;
            mtr.release(access);
            match memory {
                Memory::Provider(buffer) => access.free_dma(buffer),
                Memory::User(user) => bytes = Some(access.unregister_user_memory(user)),
                Memory::Application(user) => access.unregister_application_memory(user),
            }
        }
        tracing::debug!(index = self.index, "MR deregistered");
        (result, bytes)
    }
}

impl MrInner {
    /// CPU read of `out.len()` bytes at iova `address` of the region, page by page
    /// through its (possibly scattered) pages. False when the range is not inside the
    /// region or the memory is gone.
    pub(crate) fn cpu_read(&self, address: u64, out: &mut [u8]) -> bool {
        let Some(offset) = address.checked_sub(self.iova) else {
            return false;
        };
        if !matches!(offset.checked_add(out.len() as u64), Some(end) if end <= self.length) {
            return false;
        }
        let access = &*self.pd.context.access;
        let mut done = 0usize;
        while done < out.len() {
            let at = self.first_page_offset + offset + done as u64;
            let in_page = (at % PAGE_SIZE) as usize;
            let chunk = (PAGE_SIZE as usize - in_page).min(out.len() - done);
            let page = self.pages[(at >> MIN_PAGE_SHIFT) as usize];
            if access
                .dma_read(page + in_page as u64, &mut out[done..done + chunk])
                .is_err()
            {
                return false;
            }
            done += chunk;
        }
        true
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// A registered memory region.
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("MemoryRegion")
            .field("index", &i.index)
            .field("lkey", &format_args!("{:#x}", i.key))
            .field("iova", &format_args!("{:#x}", i.iova))
            .field("length", &i.length)
            .field("page_shift", &i.page_shift)
            .field("hop", &i.hop)
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_reg_mr` on memory the provider allocates: a zero-filled, contiguous DMA
    /// buffer of `length` bytes, aligned to its size (up to 2 MiB) so large pages apply.
    /// Its iova is its bus address.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a zero length or bad access flags;
    /// [`VerbsError::OutOfResources`] without MPT entries or memory; device failures.
    #[doc(alias = "reg_mr")]
    pub fn register_provider_memory(&self, length: usize, access: AccessFlags) -> Result<MemoryRegion> {
        if length == 0 {
            return Err(VerbsError::InvalidArgument("a memory region of 0 bytes".into()));
        }
        access.check()?;
        let device = &*self.inner.context.access;
        let align = length.next_power_of_two().clamp(USER_PAGE_SIZE, 2 << 20);
        let buffer = device
            .allocate_dma(length, align)
            .map_err(VerbsError::memory("allocate memory region buffer"))?;
        let base = buffer.address();
        let pages: Vec<u64> = (0..(length as u64).div_ceil(PAGE_SIZE))
            .map(|i| base + i * PAGE_SIZE)
            .collect();
        self.register(Memory::Provider(buffer), pages, base, length as u64, access)
    }

    /// `ibv_reg_mr` on the application's buffer: `bytes` is mapped for DMA (page by page,
    /// wherever the backend puts the pages) until deregistration gives it back. The iova
    /// is the bus address of the first page.
    ///
    /// # Errors
    /// As [`ProtectionDomain::register_provider_memory`].
    #[doc(alias = "reg_mr")]
    pub fn register_user_memory(&self, bytes: Vec<u8>, access: AccessFlags) -> Result<MemoryRegion> {
        self.register_user_memory_inner(bytes, None, access)
    }

    /// As [`ProtectionDomain::register_user_memory`] with the iova chosen by the caller
    /// (4 KiB aligned), like `ibv_reg_mr_iova`.
    ///
    /// # Errors
    /// As [`ProtectionDomain::register_provider_memory`]; a misaligned iova is invalid.
    pub fn register_user_memory_at(&self, bytes: Vec<u8>, iova: u64, access: AccessFlags) -> Result<MemoryRegion> {
        self.register_user_memory_inner(bytes, Some(iova), access)
    }

    fn register_user_memory_inner(
        &self,
        bytes: Vec<u8>,
        iova: Option<u64>,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        if bytes.is_empty() {
            return Err(VerbsError::InvalidArgument("a memory region of 0 bytes".into()));
        }
        if let Some(iova) = iova {
            if iova % PAGE_SIZE != 0 {
                return Err(VerbsError::InvalidArgument(format!(
                    "iova {iova:#x} is not 4 KiB aligned (the buffer starts on a page)"
                )));
            }
        }
        access.check()?;
        let device = &*self.inner.context.access;
        let length = bytes.len() as u64;
        let user = device
            .register_user_memory(bytes)
            .map_err(VerbsError::memory("map application buffer"))?;
        let pages = user.pages().to_vec();
        let iova = iova.unwrap_or(pages[0]);
        self.register(Memory::User(user), pages, iova, length, access)
    }

    /// `ibv_reg_mr_iova2` on the application's own memory, reached in place
    /// ([`DeviceAccess::register_application_memory`]): the device reads and writes the
    /// bytes of `range` while the application keeps using them, and the region counts
    /// from `iova`. `iova` must sit at the same offset inside its 4 KiB page as
    /// `range.address()` (a page maps to a page).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for bad access flags or a misplaced iova;
    /// [`VerbsError::Memory`] with [`AccessError::Unsupported`](crate::device_access::AccessError::Unsupported)
    /// (`EOPNOTSUPP`) when the backend cannot reach application memory; as
    /// [`ProtectionDomain::register_provider_memory`] otherwise.
    pub fn register_application_memory(
        &self,
        range: Arc<crate::device_access::ApplicationRange>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        if iova % PAGE_SIZE != range.address() as u64 % PAGE_SIZE {
            return Err(VerbsError::InvalidArgument(format!(
                "iova {iova:#x} and address {:#x} sit at different offsets in their 4 KiB pages",
                range.address()
            )));
        }
        if iova.checked_add(range.len() as u64).is_none() {
            return Err(VerbsError::InvalidArgument(format!(
                "iova {iova:#x} + {} bytes wraps the address space",
                range.len()
            )));
        }
        access.check()?;
        let length = range.len() as u64;
        let device = &*self.inner.context.access;
        let user = device
            .register_application_memory(range)
            .map_err(VerbsError::memory("map application memory"))?;
        let pages = user.pages().to_vec();
        self.register(Memory::Application(user), pages, iova, length, access)
    }

    fn register(
        &self,
        memory: Memory,
        pages: Vec<u64>,
        iova: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        let context = &self.inner.context;
        let device: &dyn DeviceAccess = &*context.access;
        let give_back = |memory: Memory| match memory {
            Memory::Provider(buffer) => device.free_dma(buffer),
            Memory::User(user) => {
                device.unregister_user_memory(user);
            }
            Memory::Application(user) => device.unregister_application_memory(user),
        };

        let caps = &context.info.caps;
        let (page_shift, blocks) = largest_page_blocks(&pages, iova, caps.page_size_cap, MAX_BUFFER_PAGE_SHIFT);
        let unit = (1u64 << PBL_BA_PAGE_SHIFT) / 8;
        let hop = choose_hop(blocks.len() as u64, unit);
        let regions = [MtrRegion {
            page_count: blocks.len() as u64,
            hop,
        }];
        let mtr = match Mtr::create(device, &regions, &blocks, page_shift, PBL_BA_PAGE_SHIFT) {
            Ok(mtr) => mtr,
            Err(e) => {
                give_back(memory);
                return Err(VerbsError::translation("build memory region PBL")(e));
            }
        };

        let mut state = context.lock();
        let Some(index) = state.allocators.mrs.allocate() else {
            drop(state);
            mtr.release(device);
            give_back(memory);
            return Err(VerbsError::OutOfResources("no free MPT entry".into()));
        };
        let key = index_to_key(index);
        if let Err(e) = state.driver.context_get(ContextTable::Mpt, index) {
            state.allocators.mrs.free(index);
            drop(state);
            mtr.release(device);
            give_back(memory);
            return Err(VerbsError::context_table("MPT entry")(e));
        }

        let mut mpt = Mpt::zeroed();
        mpt.set_mpt_state(MptState::Valid);
        mpt.set_pbl_hop_number(hop);
        mpt.set_pbl_ba_page_size(mtr.ba_page_size_field());
        mpt.set_protection_domain(self.inner.pdn);
        mpt.set_local_invalidate_enable(true);
        mpt.set_bind_enable(access.contains(AccessFlags::MW_BIND));
        mpt.set_atomic_enable(access.contains(AccessFlags::REMOTE_ATOMIC));
        mpt.set_remote_read_enable(access.contains(AccessFlags::REMOTE_READ));
        mpt.set_remote_write_enable(access.contains(AccessFlags::REMOTE_WRITE));
        mpt.set_local_write_enable(access.contains(AccessFlags::LOCAL_WRITE));
        mpt.set_length(length);
        mpt.set_lkey(key);
        mpt.set_virtual_address(iova);
        mpt.set_pbl_size(blocks.len() as u32);
        mpt.set_pbl_base_address(mtr.root() >> 3);
        mpt.set_inner_pa_valid(true);
        let [first, second] = mtr.first_pages();
        mpt.set_page0_address(first >> 6);
        mpt.set_page1_address(second >> 6);
        mpt.set_pbl_buffer_page_size(mtr.buffer_page_size_field());
        debug_assert_eq!(mpt.bytes().len(), MPT_SIZE);
        if let Err(e) = state
            .driver
            .mailbox_with_input(MailboxOpcode::CreateMpt, index, mpt.bytes())
        {
            let _ = state.driver.context_put(ContextTable::Mpt, index);
            state.allocators.mrs.free(index);
            drop(state);
            mtr.release(device);
            give_back(memory);
            return Err(VerbsError::mailbox("CREATE_MPT")(e));
        }
        drop(state);
        tracing::debug!(
            index,
            key = format_args!("{key:#x}"),
            pages = blocks.len(),
            page_shift,
            hop,
            "MR registered"
        );
        let inner = Arc::new(MrInner {
            pd: self.inner.clone(),
            index,
            key,
            iova,
            length,
            access,
            pages,
            first_page_offset: iova % PAGE_SIZE,
            page_shift,
            hop,
            released: AtomicBool::new(false),
            resources: Mutex::new(Some((memory, mtr))),
        });
        context.list_mr(key, &inner);
        Ok(MemoryRegion { inner })
    }
}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.key
    }

    /// Remote key (the same key: hns uses one key for both).
    pub fn rkey(&self) -> u32 {
        self.inner.key
    }

    /// The iova SGEs and remote addresses count from (`addr`).
    pub fn addr(&self) -> u64 {
        self.inner.iova
    }

    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.inner.length
    }

    /// Access flags.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// MPT index (`key >> 8`).
    pub fn mpt_index(&self) -> u32 {
        self.inner.index
    }

    /// PD number.
    pub fn pd_number(&self) -> u32 {
        self.inner.pd.pdn
    }

    /// Page shift the PBL uses.
    pub fn page_shift(&self) -> u32 {
        self.inner.page_shift
    }

    /// PBL hop number.
    pub fn hop(&self) -> u8 {
        self.inner.hop
    }

    /// Bus addresses of the region's 4 KiB pages.
    pub fn pages(&self) -> &[u64] {
        &self.inner.pages
    }

    /// The MPT entry as the device holds it (`QUERY_MPT`).
    ///
    /// # Errors
    /// Device failures.
    pub fn query_mpt(&self) -> Result<Mpt> {
        let bytes = self
            .inner
            .pd
            .context
            .lock()
            .driver
            .mailbox_query(MailboxOpcode::QueryMpt, self.inner.index, MPT_SIZE)
            .map_err(VerbsError::mailbox("QUERY_MPT"))?;
        Ok(Mpt::parse(&bytes).expect("queried exactly MPT_SIZE bytes"))
    }

    fn check_range(&self, offset: u64, length: usize) -> Result<()> {
        match offset.checked_add(length as u64) {
            Some(end) if end <= self.inner.length => Ok(()),
            _ => Err(VerbsError::InvalidArgument(format!(
                "{length} bytes at offset {offset} exceed the region of {} bytes",
                self.inner.length
            ))),
        }
    }

    /// Visits the bus-address pieces of `offset..offset + length`.
    fn for_each_piece(
        &self,
        offset: u64,
        length: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        self.check_range(offset, length)?;
        let mut done = 0usize;
        while done < length {
            let at = self.inner.first_page_offset + offset + done as u64;
            let page = (at >> MIN_PAGE_SHIFT) as usize;
            let in_page = (at % PAGE_SIZE) as usize;
            let chunk = (PAGE_SIZE as usize - in_page).min(length - done);
            f(self.inner.pages[page] + in_page as u64, done..done + chunk)?;
            done += chunk;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of the region at `offset` (from the region start) out.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] outside the region.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let device = self.inner.pd.context.access.clone();
        self.for_each_piece(offset, out.len(), |address, range| {
            device
                .dma_read(address, &mut out[range])
                .map_err(VerbsError::memory("read memory region"))
        })
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] outside the region.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let device = self.inner.pd.context.access.clone();
        self.for_each_piece(offset, data.len(), |address, range| {
            device
                .dma_write(address, &data[range])
                .map_err(VerbsError::memory("write memory region"))
        })
    }

    /// `ibv_dereg_mr`. Returns the application's bytes for a region registered with
    /// [`ProtectionDomain::register_user_memory`], `None` for provider memory.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] (the region handed back) while another handle shares it;
    /// device failures (the region is gone anyway).
    #[doc(alias = "dereg_mr")]
    pub fn deregister(self) -> Result<Option<Vec<u8>>, DestroyError<Self>> {
        if Arc::strong_count(&self.inner) > 1 {
            let index = self.inner.index;
            return Err(DestroyError::busy(self, format!("MR {index} is in use")));
        }
        let (result, bytes) = self.inner.release();
        result.map(|()| bytes).map_err(DestroyError::gone)
    }
}
