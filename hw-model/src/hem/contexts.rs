//! The context block: the four context tables in host memory (QPC, MPT, CQC, SRQC), the
//! write-back QPC/CQC cache in front of them, and the QP progress the transport records
//! for the QPC cache.
//!
//! Interface (its requests; every one reaches host memory only through the [`Bus`] it is
//! handed):
//! * [`Contexts::read`] / [`Contexts::write`]: an object's context by table and index, and
//!   its write-back, through the cache for QPCs and CQCs;
//! * [`Contexts::record_progress`]: what the engines did to a QP (consumer indices, PSNs,
//!   MSN), applied to its QPC before anyone reads it or the cache is written back;
//! * [`Contexts::write_back`], [`Contexts::drop_cache`], [`Contexts::forget`]: the
//!   occasions the top tells it about (a command or mailbox, a configuration write, a
//!   reset);
//! * [`Contexts::table_mut`]: the base-address-table commands of the firmware.
//!
//! It calls no other block.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::Qpc;
use rnic_firmware_if::mailbox::{BtCommand, ContextTable as ContextTableId};

use crate::bus::Bus;
use crate::command::Rejection;
use crate::config::{BtSlots, DeviceConfig};
use crate::fast_hash::FastHashMap;
use rnic_firmware_if::caps::DeviceCaps;

use super::{ContextCache, ContextTable, ContextTableAttributes, HemError};

/// The SQ half of a QP's recorded progress (only while it sends, in RTS).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqProgress {
    /// SQ_CONSUMER_IDX.
    pub consumer: u16,
    /// SQ_CUR_PSN and SQ_MAX_PSN.
    pub next_psn: u32,
    /// RX_ACK_EPSN.
    pub una_psn: u32,
    /// RETRY_CNT.
    pub retry_left: u8,
    /// RNR_CNT.
    pub rnr_left: u8,
}

/// A QP's progress as the transport recorded it, not yet in its QPC.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpcProgress {
    /// The send side; None for a QP not sending (it keeps what it last recorded).
    pub sending: Option<SqProgress>,
    /// RX_REQ_EPSN.
    pub epsn: u32,
    /// RX_REQ_MSN.
    pub msn: u32,
    /// RX_REQ_PSN_ERR.
    pub psn_error: bool,
    /// RQ_CONSUMER_IDX.
    pub rq_consumer: u16,
}

/// The context tables, their cache and the recorded QP progress.
#[derive(Debug, Clone)]
pub(crate) struct Contexts {
    qpc: ContextTable,
    mpt: ContextTable,
    cqc: ContextTable,
    srqc: ContextTable,
    /// The QPC and CQC cache (hns keeps both on chip): contexts the device read, written
    /// back to host memory lazily, before anything can look at host memory's copy.
    cache: ContextCache,
    /// Progress recorded for QPCs and not yet written into them, by QPN.
    progress: FastHashMap<u32, QpcProgress>,
    /// The objects per table and the L0 slots, to rebuild the tables.
    sizes: (DeviceCaps, BtSlots),
}

/// The tables of a device with these sizes, without attributes or base addresses.
fn tables((caps, slots): &(DeviceCaps, BtSlots)) -> [ContextTable; 4] {
    use rnic_firmware_if::context::{CQC_SIZE, MPT_SIZE, QPC_SIZE, SRQC_SIZE};
    [
        ContextTable::new("QPC", QPC_SIZE as u64, caps.num_qps, slots.qpc as usize),
        ContextTable::new("MPT", MPT_SIZE as u64, caps.num_mtpts, slots.mpt as usize),
        ContextTable::new("CQC", CQC_SIZE as u64, caps.num_cqs, slots.cqc as usize),
        ContextTable::new("SRQC", SRQC_SIZE as u64, caps.num_srqs, slots.srqc as usize),
    ]
}

impl Contexts {
    /// The tables of a device with `config` after power-on: no attributes, no base
    /// addresses, nothing cached.
    pub fn new(config: &DeviceConfig) -> Self {
        let sizes = (config.caps, config.bt_slots);
        let [qpc, mpt, cqc, srqc] = tables(&sizes);
        Self {
            qpc,
            mpt,
            cqc,
            srqc,
            cache: ContextCache::default(),
            progress: FastHashMap::default(),
            sizes,
        }
    }

    /// Forgets every table's attributes and base addresses (function reset, FUNC_CLEAR);
    /// the cache must have been dropped first.
    pub fn clear_tables(&mut self) {
        [self.qpc, self.mpt, self.cqc, self.srqc] = tables(&self.sizes);
    }

    /// One table.
    pub fn table(&self, table: ContextTableId) -> &ContextTable {
        match table {
            ContextTableId::Qpc => &self.qpc,
            ContextTableId::Mpt => &self.mpt,
            ContextTableId::Cqc => &self.cqc,
            ContextTableId::Srqc => &self.srqc,
        }
    }

    /// One table, for the firmware's base-address-table and attribute commands.
    pub fn table_mut(&mut self, table: ContextTableId) -> &mut ContextTable {
        match table {
            ContextTableId::Qpc => &mut self.qpc,
            ContextTableId::Mpt => &mut self.mpt,
            ContextTableId::Cqc => &mut self.cqc,
            ContextTableId::Srqc => &mut self.srqc,
        }
    }

    /// CFG_BT_ATTR: the attributes of the QPC, MPT, CQC and SRQC tables, in that order,
    /// set all together or not at all; the first table refusing them and why.
    pub fn configure(&mut self, attributes: [ContextTableAttributes; 4]) -> Result<(), (ContextTableId, HemError)> {
        const ORDER: [ContextTableId; 4] = [
            ContextTableId::Qpc,
            ContextTableId::Mpt,
            ContextTableId::Cqc,
            ContextTableId::Srqc,
        ];
        for (table, candidate) in ORDER.into_iter().zip(attributes) {
            // Tried on a copy: nothing changes unless every table takes its attributes.
            self.table(table)
                .clone()
                .set_attributes(candidate)
                .map_err(|error| (table, error))?;
        }
        for (table, candidate) in ORDER.into_iter().zip(attributes) {
            self.table_mut(table).set_attributes(candidate).expect("checked above");
        }
        Ok(())
    }

    /// `WRITE`, `READ` or `DESTROY_<T>_BT<level>` with tag `index` (`address`: the base
    /// address written, or where the answer goes); a read's answer.
    pub fn base_address_table(
        &mut self,
        bus: &Bus,
        table: ContextTableId,
        command: BtCommand,
        level: u8,
        index: u32,
        address: u64,
    ) -> Result<Option<u64>, Rejection> {
        let context_table = self.table_mut(table);
        match command {
            BtCommand::Write => {
                context_table
                    .write_base_address(index, level, address)
                    .map_err(|e| Rejection::parameter("IN_PARAM", address, e.to_string()))?;
                Ok(None)
            }
            BtCommand::Destroy => {
                context_table
                    .destroy_base_address(index, level)
                    .map_err(|e| Rejection::parameter("TAG", index as u64, e.to_string()))?;
                Ok(None)
            }
            BtCommand::Read => {
                if !bus.master() && level > 0 {
                    return Err(Rejection::dma("BT", address, "bus mastering disabled"));
                }
                let found = context_table
                    .read_base_address(bus.gated_memory(), index, level)
                    .map_err(|e| Rejection::no_table("TAG", index as u64, e))?;
                Ok(Some(found))
            }
        }
    }

    /// Number of valid L0 slots per table (QP, MPT, CQ, SRQ).
    pub fn slots_in_use(&self) -> [usize; 4] {
        [
            self.qpc.valid_l0_slots(),
            self.mpt.valid_l0_slots(),
            self.cqc.valid_l0_slots(),
            self.srqc.valid_l0_slots(),
        ]
    }

    /// Bus address of object `index` in `table`.
    pub fn address(&mut self, bus: &Bus, table: ContextTableId, index: u32) -> Result<u64, Rejection> {
        let context_table = self.table_mut(table);
        if index >= context_table.object_count() {
            return Err(Rejection::index(index as u64, context_table.object_count() as u64));
        }
        let Some(memory) = bus.memory() else {
            return Err(Rejection::dma("context", 0, "bus mastering is disabled"));
        };
        let result = context_table.locate_cached(memory, index);
        result.map_err(|e| Rejection::no_table("context table", index as u64, e))
    }

    /// Reads object `index`'s context (a QPC or CQC from the cache, else from host
    /// memory); returns it and its bus address.
    pub fn read<L: Layout>(&mut self, bus: &mut Bus, table: ContextTableId, index: u32) -> Result<(L, u64), Rejection> {
        if table == ContextTableId::Qpc && !self.progress.is_empty() {
            // Whoever reads a QPC sees the engines' recorded progress in it.
            self.apply_progress(bus, index);
        }
        let address = self.address(bus, table, index)?;
        let mut context = L::zeroed();
        let cached = matches!(table, ContextTableId::Qpc | ContextTableId::Cqc);
        if cached {
            if let Some(bytes) = self.cache.lookup(address, L::SIZE) {
                context.bytes_mut().copy_from_slice(bytes);
                return Ok((context, address));
            }
        }
        bus.read(address, context.bytes_mut())
            .map_err(|e| Rejection::dma("context", address, e))?;
        if cached {
            if self.cache.is_full() {
                // Recorded QP progress stays recorded: it is applied through this cache.
                self.write_back_dirty(bus);
                self.cache.clear();
            }
            self.cache.fill(address, context.bytes());
        }
        Ok((context, address))
    }

    /// The cached `len` bytes of the context at `address`, if the cache holds them.
    #[inline]
    pub fn cached(&self, address: u64, len: usize) -> Option<&[u8]> {
        self.cache.lookup(address, len)
    }

    /// Whether the cache holds no context.
    #[cfg(test)]
    pub fn cache_is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Writes a context: into the cache when it holds the context and host memory has
    /// taken a write there before, else to host memory.
    pub fn write<L: Layout>(&mut self, bus: &mut Bus, address: u64, context: &L) -> Result<(), Rejection> {
        // The cache is empty while bus mastering is off (the top drops it before every
        // configuration write).
        if self.cache.absorb(address, context.bytes()) {
            return Ok(());
        }
        bus.write(address, context.bytes())
            .map_err(|e| Rejection::dma("context", address, e))?;
        self.cache.written_through(address, context.bytes());
        Ok(())
    }

    /// Records QP `qpn`'s progress for its QPC, with exactly the values of this moment. A
    /// QP that stopped sending keeps the SQ fields it last recorded.
    pub fn record_progress(&mut self, qpn: u32, mut progress: QpcProgress) {
        if progress.sending.is_none() {
            progress.sending = self.progress.get(&qpn).and_then(|earlier| earlier.sending);
        }
        self.progress.insert(qpn, progress);
    }

    /// Applies the QPs' recorded progress to their QPCs, then writes the cached contexts
    /// that are newer than host memory back to it: before a firmware command or mailbox
    /// runs and before it completes, before a configuration write (which may end bus
    /// mastering), before a function reset, and when the cache is full. A write-back that
    /// fails is counted as a DMA error.
    pub fn write_back(&mut self, bus: &mut Bus) {
        self.apply_all_progress(bus);
        self.write_back_dirty(bus);
    }

    /// Writes the cached contexts back ([`Self::write_back`]) and forgets them.
    pub fn drop_cache(&mut self, bus: &mut Bus) {
        self.write_back(bus);
        self.cache.clear();
    }

    /// Drops the cache and forgets the object addresses the tables remember: the driver
    /// may have changed host BT pages or contexts before any command or mailbox.
    pub fn forget(&mut self, bus: &mut Bus) {
        self.drop_cache(bus);
        self.qpc.forget_locations();
        self.mpt.forget_locations();
        self.cqc.forget_locations();
        self.srqc.forget_locations();
    }

    /// Writes the dirty cached contexts back to host memory.
    fn write_back_dirty(&mut self, bus: &mut Bus) {
        if !self.cache.has_dirty() {
            return;
        }
        for (address, bytes) in self.cache.take_dirty() {
            let _ = bus.write(address, &bytes);
        }
    }

    /// Writes QP `qpn`'s recorded progress (if any) into its QPC.
    fn apply_progress(&mut self, bus: &mut Bus, qpn: u32) {
        let Some(progress) = self.progress.remove(&qpn) else {
            return;
        };
        let Ok((mut qpc, address)) = self.read::<Qpc>(bus, ContextTableId::Qpc, qpn) else {
            return;
        };
        if let Some(sq) = progress.sending {
            qpc.set_sq_consumer_index(sq.consumer);
            qpc.set_sq_current_psn(sq.next_psn);
            qpc.set_sq_max_psn(sq.next_psn);
            qpc.set_rx_ack_expected_psn(sq.una_psn);
            qpc.set_retry_count(sq.retry_left);
            qpc.set_rnr_retry_count(sq.rnr_left);
        }
        qpc.set_rx_request_expected_psn(progress.epsn);
        qpc.set_rx_request_msn(progress.msn);
        qpc.set_rx_request_psn_error(progress.psn_error);
        qpc.set_rq_consumer_index(progress.rq_consumer);
        let _ = self.write(bus, address, &qpc);
    }

    /// Writes every QP's recorded progress into its QPC, in QPN order.
    fn apply_all_progress(&mut self, bus: &mut Bus) {
        if self.progress.is_empty() {
            return;
        }
        let mut qpns: Vec<u32> = self.progress.keys().copied().collect();
        qpns.sort_unstable();
        for qpn in qpns {
            self.apply_progress(bus, qpn);
        }
    }
}
