//! Doorbells: decode the 64-bit word written at offset 0x230 of a doorbell page and hand
//! it to the engine that owns the named queue. SQ and RQ doorbells move QP producer
//! indices, SRQ doorbells the SRQ index-queue producer, CQ doorbells the CQ consumer
//! index and arming. (EQ doorbells at 0x238 go to [`crate::eq`].)

use rnic_firmware_if::doorbell::{Doorbell, DoorbellCommand};

use crate::device::Device;
use crate::diagnostics::Source;
use crate::qp::WorkQueue;

impl Device {
    /// A queue doorbell written to doorbell page `page`.
    pub(crate) fn queue_doorbell(&mut self, page: u32, word: u64) {
        let doorbell = Doorbell::from_u64(word);
        let tag = doorbell.tag();
        if doorbell.flag() {
            self.counters.doorbells_dropped += 1;
            self.diagnose(
                Source::Doorbell,
                format!("doorbell page {page}"),
                "FLAG",
                1,
                "0 (direct WQE is not supported)",
            );
            return;
        }
        let command = match DoorbellCommand::try_from(doorbell.command()) {
            Ok(command) => command,
            Err(_) => {
                self.counters.doorbells_dropped += 1;
                self.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "CMD",
                    doorbell.command() as u64,
                    "0 SQ, 1 RQ, 2 SRQ, 3 CQ set-CI, 4 CQ arm",
                );
                return;
            }
        };
        tracing::trace!(target: "rnic::doorbell", page, ?command, tag, "doorbell");
        match command {
            DoorbellCommand::Sq => self.qp_doorbell(tag, WorkQueue::Send, doorbell.producer_index()),
            DoorbellCommand::Rq => self.qp_doorbell(tag, WorkQueue::Receive, doorbell.producer_index()),
            DoorbellCommand::Srq => self.srq_doorbell(tag, doorbell.producer_index()),
            DoorbellCommand::CqSetCi | DoorbellCommand::CqArm => self.cq_doorbell(tag, word),
        }
    }
}
