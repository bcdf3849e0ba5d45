//! Shared receive queues: CREATE_SRQ / MODIFY_SRQC / QUERY_SRQC / DESTROY_SRQ, the SRQ
//! doorbell, and the receive WQEs the responder takes. The SRQC lives in host memory (the
//! SRQC table).
//!
//! The block ([`SharedReceiveQueues`]) owns its counters and the limits from the
//! capabilities. It accepts the SRQ mailbox commands, the SRQ doorbell and the
//! responder's requests for a WQE; it produces AEQEs (SRQ errors, the limit event) for
//! the event block. The rest it reaches through its [`Io`].

use rnic_firmware_if::context::Srqc;
use rnic_firmware_if::event::AsyncEventType;
use rnic_firmware_if::mtr::page_shift_from_field;

use crate::command::{merge_modifiable, Rejection};
use crate::diagnostics::Source;
use crate::memory::MemoryError;
use crate::mtt::{DmaFault, Mtr};

/// What the SRQ block needs from the rest of the device.
pub(crate) trait Io {
    /// SRQ `srqn`'s context and its bus address, from the SRQC table of the context block.
    fn read_srqc(&mut self, srqn: u32) -> Result<(Srqc, u64), Rejection>;
    /// Writes the SRQC at `address` back.
    fn write_srqc(&mut self, address: u64, srqc: &Srqc) -> Result<(), Rejection>;
    /// DMA read (the record doorbell).
    fn dma_read(&mut self, address: u64, buffer: &mut [u8]) -> Result<(), MemoryError>;
    /// Reads bytes at `offset` of the buffer `mtr` describes (the index queue).
    fn read_buffer(&mut self, mtr: &Mtr, offset: u64, buffer: &mut [u8]) -> Result<(), DmaFault>;
    /// Records a diagnostic.
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    );
    /// Event out: an AEQE.
    fn async_event(&mut self, event: AsyncEventType, sub_type: u8, queue_number: u32);
}

/// What the SRQ block counted since power-on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SrqCounters {
    /// SRQ doorbells accepted.
    pub doorbells: u64,
    /// SRQ doorbells dropped.
    pub doorbells_dropped: u64,
}

/// The shared-receive-queue block.
#[derive(Debug, Clone)]
pub(crate) struct SharedReceiveQueues {
    counters: SrqCounters,
    /// Capabilities: SRQs in the table, their depth and SGE limits, PDs.
    caps: rnic_firmware_if::caps::DeviceCaps,
}

/// SRQ_ST value of a valid SRQ.
const SRQ_VALID: u8 = 1;

/// A receive WQE taken from an SRQ's index queue by the transport.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SrqWqe {
    /// The WQE slot (the CQE's WQE_IDX, which software frees).
    pub slot: u16,
    /// Translation of the SRQ's WQE buffer.
    pub mtr: Mtr,
    /// Byte offset of the WQE in the buffer.
    pub offset: u64,
    /// SGE slots per WQE.
    pub slots: u32,
    /// The SRQ's PD (local keys of its WQEs are checked against it).
    pub pd: u32,
}

impl SharedReceiveQueues {
    /// The block of a device with `caps`.
    pub fn new(caps: &rnic_firmware_if::caps::DeviceCaps) -> Self {
        Self {
            counters: SrqCounters::default(),
            caps: *caps,
        }
    }

    /// What the block counted.
    pub fn counters(&self) -> SrqCounters {
        self.counters
    }

    fn srq_index_check(&self, srqn: u32) -> Result<(), Rejection> {
        let count = self.caps.num_srqs;
        if srqn >= count {
            return Err(Rejection::index(srqn as u64, count as u64));
        }
        Ok(())
    }

    /// Whether `srqn` names a created SRQ.
    pub fn is_valid(&mut self, io: &mut impl Io, srqn: u32) -> bool {
        self.srq_index_check(srqn).is_ok()
            && io
                .read_srqc(srqn)
                .is_ok_and(|(srqc, _)| srqc.srq_state_raw() == SRQ_VALID)
    }

    /// The WQE-buffer and index-queue translations of an SRQ.
    fn srq_buffers(srqc: &Srqc) -> Result<(Mtr, Mtr), Rejection> {
        let depth = 1u64 << srqc.shift();
        let wqe_bytes = depth * (16u64 << srqc.max_sge_shift());
        let wqe_page = page_shift_from_field(srqc.wqe_buffer_page_size());
        let wqe = Mtr::single(
            srqc.wqe_base_address() << 3,
            page_shift_from_field(srqc.wqe_ba_page_size()),
            wqe_page,
            wqe_bytes.div_ceil(1 << wqe_page),
            srqc.wqe_hop_number(),
        );
        wqe.validate()
            .map_err(|e| Rejection::parameter("WQE_BT_BA", srqc.wqe_base_address() << 3, e.to_string()))?;
        let index_page = page_shift_from_field(srqc.index_buffer_page_size());
        let index = Mtr::single(
            srqc.index_base_address() << 3,
            page_shift_from_field(srqc.index_ba_page_size()),
            index_page,
            (depth * 4).div_ceil(1 << index_page),
            srqc.index_hop_number(),
        );
        index
            .validate()
            .map_err(|e| Rejection::parameter("IDX_BT_BA", srqc.index_base_address() << 3, e.to_string()))?;
        Ok((wqe, index))
    }

    fn validate_srq_limit(srqc: &Srqc) -> Result<(), Rejection> {
        let depth = 1u64 << srqc.shift();
        if srqc.limit_watermark() as u64 > depth {
            return Err(Rejection::parameter(
                "LIMIT_WL",
                srqc.limit_watermark() as u64,
                format!("a limit no larger than the depth {depth}"),
            ));
        }
        Ok(())
    }

    /// CREATE_SRQ (mailbox 0x70).
    pub fn create(&mut self, io: &mut impl Io, srqn: u32, mut srqc: Srqc) -> Result<(), Rejection> {
        self.srq_index_check(srqn)?;
        let (current, address) = io.read_srqc(srqn)?;
        if current.srq_state_raw() == SRQ_VALID {
            return Err(Rejection::state(
                "SRQ_ST",
                SRQ_VALID as u64,
                format!("SRQ {srqn:#x} not already created"),
            ));
        }
        if srqc.srq_state_raw() != SRQ_VALID {
            return Err(Rejection::parameter("SRQ_ST", srqc.srq_state_raw() as u64, "1 (valid)"));
        }
        let caps = self.caps;
        if srqc.xrc() {
            return Err(Rejection::parameter(
                "SRQ_TYPE",
                1,
                "0 (basic SRQ); XRC is not supported",
            ));
        }
        if (1u64 << srqc.shift()) > caps.max_srq_wqes as u64 {
            return Err(Rejection::parameter(
                "SHIFT",
                srqc.shift() as u64,
                format!("a depth of at most {} WQEs", caps.max_srq_wqes),
            ));
        }
        if (1u32 << srqc.max_sge_shift()) > caps.max_srq_sges as u32 {
            return Err(Rejection::parameter(
                "RQWS",
                srqc.max_sge_shift() as u64,
                format!("at most {} SGEs per WQE", caps.max_srq_sges),
            ));
        }
        if srqc.protection_domain() >= caps.num_pds {
            return Err(Rejection::parameter(
                "PD",
                srqc.protection_domain() as u64,
                format!("a PD number below {}", caps.num_pds),
            ));
        }
        if srqc.srq_number() != srqn {
            return Err(Rejection::parameter(
                "SRQN",
                srqc.srq_number() as u64,
                format!("the SRQ number of the mailbox tag, {srqn:#x}"),
            ));
        }
        Self::validate_srq_limit(&srqc)?;
        Self::srq_buffers(&srqc)?;
        srqc.set_producer_index(0);
        srqc.set_consumer_index(0);
        io.write_srqc(address, &srqc)
    }

    /// MODIFY_SRQC (mailbox 0x72): only the limit (LIMIT_WL) may change.
    pub fn modify(&mut self, io: &mut impl Io, srqn: u32, context: Srqc, mask: Srqc) -> Result<(), Rejection> {
        self.srq_index_check(srqn)?;
        let (current, address) = io.read_srqc(srqn)?;
        if current.srq_state_raw() != SRQ_VALID {
            return Err(Rejection::state(
                "SRQ_ST",
                current.srq_state_raw() as u64,
                format!("SRQ {srqn:#x} created"),
            ));
        }
        let merged = merge_modifiable(
            &current,
            &context,
            &mask,
            &[Srqc::LIMIT_WL],
            "MODIFY_SRQC (an SRQ cannot be resized)",
        )?;
        Self::validate_srq_limit(&merged)?;
        io.write_srqc(address, &merged)
    }

    /// QUERY_SRQC (mailbox 0x73).
    pub fn query(&mut self, io: &mut impl Io, srqn: u32) -> Result<Srqc, Rejection> {
        self.srq_index_check(srqn)?;
        Ok(io.read_srqc(srqn)?.0)
    }

    /// DESTROY_SRQ (mailbox 0x74).
    pub fn destroy(&mut self, io: &mut impl Io, srqn: u32) -> Result<(), Rejection> {
        self.srq_index_check(srqn)?;
        let (mut current, address) = io.read_srqc(srqn)?;
        if current.srq_state_raw() != SRQ_VALID {
            return Err(Rejection::state(
                "SRQ_ST",
                current.srq_state_raw() as u64,
                format!("SRQ {srqn:#x} created"),
            ));
        }
        current.set_srq_state_raw(0);
        io.write_srqc(address, &current)
    }

    /// SRQ doorbell (cmd 2): the new index-queue producer index.
    pub fn doorbell(&mut self, io: &mut impl Io, srqn: u32, producer_index: u16) {
        let found = self.srq_index_check(srqn).and_then(|()| io.read_srqc(srqn));
        match found {
            Ok((mut srqc, address)) if srqc.srq_state_raw() == SRQ_VALID => {
                let depth = 1u32 << srqc.shift();
                let outstanding = producer_index.wrapping_sub(srqc.consumer_index()) as u32;
                if outstanding > depth {
                    self.counters.doorbells_dropped += 1;
                    io.diagnose(
                        Source::Doorbell,
                        format!("SRQ {srqn:#x}"),
                        "PI",
                        producer_index as u64,
                        format!("at most {depth} WQEs past the consumer index {}", srqc.consumer_index()),
                    );
                    io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
                    return;
                }
                srqc.set_producer_index(producer_index);
                self.counters.doorbells += 1;
                let _ = io.write_srqc(address, &srqc);
            }
            _ => {
                self.counters.doorbells_dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("SRQ {srqn:#x}"),
                    "TAG",
                    srqn as u64,
                    "an existing SRQ",
                );
                io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
            }
        }
    }

    /// Takes the next posted WQE of SRQ `srqn` for an inbound message: reads the slot
    /// from the index queue at the consumer index (the producer index comes from the
    /// record doorbell when `DB_RECORD_EN`), advances the consumer index, and when fewer
    /// than `LIMIT_WL` WQEs remain posted raises SRQ_LIMIT_REACH and disarms the limit
    /// (LIMIT_WL = 0, as hns and IB do). None when the SRQ is empty or broken (the
    /// latter diagnosed and reported with SRQ_CATAS_ERROR).
    pub fn take_wqe(&mut self, io: &mut impl Io, srqn: u32) -> Option<SrqWqe> {
        let object = || format!("SRQ {srqn:#x}");
        let (mut srqc, address) = match self.srq_index_check(srqn).and_then(|()| io.read_srqc(srqn)) {
            Ok((srqc, address)) if srqc.srq_state_raw() == SRQ_VALID => (srqc, address),
            _ => {
                io.diagnose(
                    Source::Transport,
                    object(),
                    "SRQN",
                    srqn as u64,
                    "a created SRQ for the QP",
                );
                io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
                return None;
            }
        };
        let depth = 1u32 << srqc.shift();
        let producer = if srqc.record_enable() {
            let mut record = [0u8; 4];
            if let Err(error) = io.dma_read(srqc.record_address(), &mut record) {
                io.diagnose(
                    Source::Transport,
                    object(),
                    "DB_RECORD_ADDR",
                    srqc.record_address(),
                    format!("a readable SRQ record doorbell: {error}"),
                );
                io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
                return None;
            }
            u32::from_le_bytes(record) as u16
        } else {
            srqc.producer_index()
        };
        let consumer = srqc.consumer_index();
        let posted = producer.wrapping_sub(consumer) as u32;
        if posted == 0 {
            return None;
        }
        if posted > depth {
            io.diagnose(
                Source::Transport,
                object(),
                "PRODUCER_IDX",
                producer as u64,
                format!("at most {depth} WQEs past the consumer index {consumer}"),
            );
            io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
            return None;
        }
        let buffers = Self::srq_buffers(&srqc);
        let Ok((wqe_mtr, index_mtr)) = buffers else {
            io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
            return None;
        };
        let mut entry = [0u8; 4];
        let index_offset = (consumer as u64 & (depth as u64 - 1)) * 4;
        if let Err(error) = io.read_buffer(&index_mtr, index_offset, &mut entry) {
            io.diagnose(
                Source::Transport,
                object(),
                "IDX_BT_BA",
                index_offset,
                // The words a transfer error of the engines has (DMA: …).
                format!("a readable index queue: DMA: {error}"),
            );
            io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
            return None;
        }
        let slot = u32::from_le_bytes(entry);
        if slot >= depth {
            io.diagnose(
                Source::Transport,
                object(),
                "index queue entry",
                slot as u64,
                format!("a WQE slot below the depth {depth}"),
            );
            io.async_event(AsyncEventType::SrqCatasError, 0, srqn);
            return None;
        }
        let consumer = consumer.wrapping_add(1);
        srqc.set_consumer_index(consumer);
        let remaining = producer.wrapping_sub(consumer) as u32;
        let limit = srqc.limit_watermark() as u32;
        let limit_reached = limit != 0 && remaining < limit;
        if limit_reached {
            srqc.set_limit_watermark(0);
        }
        let _ = io.write_srqc(address, &srqc);
        if limit_reached {
            io.async_event(AsyncEventType::SrqLimitReach, 0, srqn);
        }
        let shift = srqc.max_sge_shift() as u32;
        Some(SrqWqe {
            slot: slot as u16,
            mtr: wqe_mtr,
            offset: (slot as u64) << (4 + shift),
            slots: 1 << shift,
            pd: srqc.protection_domain(),
        })
    }
}
