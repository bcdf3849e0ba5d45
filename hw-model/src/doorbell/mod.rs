//! Doorbells: the BAR2 decoder. It takes the 64-bit word written at offset 0x230 of a
//! doorbell page (a queue doorbell) or at 0x238 of page 0 (the EQ doorbell), as one
//! 8-byte store or two 4-byte stores (low half first; the high half commits), and turns
//! it into a [`DoorbellRequest`] for the block that owns the named queue: SQ and RQ
//! doorbells move QP producer indices, SRQ doorbells the SRQ index-queue producer, CQ
//! doorbells the CQ consumer index and arming, the EQ doorbell an EQ's consumer index.
//!
//! Direct WQE (cap `DIRECT_WQE`): a page's [`DWQE_OFFSET`] window latches a 64-byte SQ WQE
//! written as 8-byte stores; an SQ doorbell with `FLAG` set then carries it to the
//! transport, which need not fetch it (docs/hw-interface.md).
//!
//! The block ([`Doorbells`]) owns the latched low halves and counts the doorbells it
//! drops; the top routes each request. It needs nothing but diagnostics ([`Io`]).

use rnic_firmware_if::doorbell::{Doorbell, DoorbellCommand, DB_OFFSET, DWQE_OFFSET, DWQE_SIZE, EQ_DB_OFFSET};
use rnic_firmware_if::regs;
use rnic_firmware_if::wqe::SQ_WQE_SIZE;

use crate::diagnostics::Source;
use crate::qp::WorkQueue;

/// What the doorbell block needs from the rest of the device.
pub(crate) trait Io {
    /// Records a diagnostic.
    fn diagnose(
        &mut self,
        source: Source,
        object: impl Into<String>,
        field: &'static str,
        value: u64,
        expected: impl Into<String>,
    );
}

/// A decoded doorbell, for the block that owns the queue it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DoorbellRequest {
    /// SQ (command 0) or RQ (command 1) doorbell: to the QP block.
    QueuePair {
        /// The QP.
        qpn: u32,
        /// Which of its queues.
        queue: WorkQueue,
        /// The new producer index.
        producer_index: u16,
        /// SQ doorbell with `FLAG` set: the WQE written to the page's direct-WQE window.
        direct_wqe: Option<[u8; SQ_WQE_SIZE]>,
    },
    /// SRQ doorbell (command 2): to the SRQ block.
    SharedReceiveQueue {
        /// The SRQ.
        srqn: u32,
        /// The new index-queue producer index.
        producer_index: u16,
    },
    /// CQ set-CI (3) or arm (4) doorbell: to the CQ block.
    CompletionQueue {
        /// The CQ.
        cqn: u32,
        /// The doorbell word.
        word: u64,
    },
    /// EQ doorbell: to the event block.
    EventQueue {
        /// The doorbell word.
        word: u64,
    },
}

/// A page's direct-WQE window.
#[derive(Debug, Clone, Copy)]
struct DirectWindow {
    bytes: [u8; SQ_WQE_SIZE],
    /// Bit n: bytes 8n..8n+8 were written.
    written: u8,
}

impl Default for DirectWindow {
    fn default() -> Self {
        Self {
            bytes: [0; SQ_WQE_SIZE],
            written: 0,
        }
    }
}

/// The doorbell decoder.
#[derive(Debug, Clone)]
pub(crate) struct Doorbells {
    /// Low halves of 64-bit doorbells written as two 32-bit stores, per page and register
    /// (the queue doorbell, the EQ doorbell).
    latch: Vec<[Option<u32>; 2]>,
    /// Per page: the direct-WQE window and which of its eight 8-byte words were written
    /// since the last direct doorbell took it.
    direct: Vec<DirectWindow>,
    /// Doorbells dropped while decoding (bad page, offset, access or command).
    dropped: u64,
    /// The device offers direct WQE (cap `DIRECT_WQE`): `FLAG` doorbells are taken.
    direct_wqe: bool,
}

impl Doorbells {
    /// The decoder of `pages` doorbell pages.
    pub fn new(pages: usize) -> Self {
        Self {
            latch: vec![[None; 2]; pages],
            direct: vec![DirectWindow::default(); pages],
            dropped: 0,
            direct_wqe: true,
        }
    }

    /// This decoder with direct WQE offered (`true`, the default) or not: without it a
    /// doorbell with `FLAG` set is dropped with a diagnostic.
    pub fn with_direct_wqe(mut self, offered: bool) -> Self {
        self.direct_wqe = offered;
        self
    }

    /// Forgets every latched low half (function reset).
    pub fn reset(&mut self) {
        for latch in &mut self.latch {
            *latch = [None; 2];
        }
        for window in &mut self.direct {
            *window = DirectWindow::default();
        }
    }

    /// Doorbells dropped while decoding, since power-on.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// A write of `data` at `offset` of the doorbell BAR; the request it completes, if
    /// any.
    pub fn write(&mut self, io: &mut impl Io, offset: u64, data: &[u8]) -> Option<DoorbellRequest> {
        let page = (offset / regs::DOORBELL_PAGE_SIZE) as usize;
        let in_page = offset % regs::DOORBELL_PAGE_SIZE;
        if page >= self.latch.len() {
            self.dropped += 1;
            io.diagnose(
                Source::Doorbell,
                format!("doorbell page {page}"),
                "page",
                page as u64,
                format!("a page below {}", self.latch.len()),
            );
            return None;
        }
        if (DWQE_OFFSET..DWQE_OFFSET + DWQE_SIZE).contains(&in_page) {
            self.direct_window_write(io, page, in_page - DWQE_OFFSET, data);
            return None;
        }
        let (register, base) = match in_page {
            o if (DB_OFFSET..DB_OFFSET + 8).contains(&o) => (0usize, DB_OFFSET),
            o if (EQ_DB_OFFSET..EQ_DB_OFFSET + 8).contains(&o) => (1usize, EQ_DB_OFFSET),
            o => {
                self.dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "offset",
                    o,
                    format!(
                        "{DB_OFFSET:#x} (queue doorbell), {EQ_DB_OFFSET:#x} (EQ doorbell) or \
                         {DWQE_OFFSET:#x}..{:#x} (direct WQE)",
                        DWQE_OFFSET + DWQE_SIZE
                    ),
                );
                return None;
            }
        };
        let word = match (in_page - base, data.len()) {
            (0, 8) => Some(u64::from_le_bytes(data.try_into().expect("length checked"))),
            (0, 4) => {
                self.latch[page][register] = Some(u32::from_le_bytes(data.try_into().expect("length checked")));
                None
            }
            (4, 4) => match self.latch[page][register].take() {
                Some(low) => {
                    Some((u32::from_le_bytes(data.try_into().expect("length checked")) as u64) << 32 | low as u64)
                }
                None => {
                    self.dropped += 1;
                    io.diagnose(
                        Source::Doorbell,
                        format!("doorbell page {page}"),
                        "high half",
                        0,
                        "the low 32 bits written first",
                    );
                    None
                }
            },
            (o, n) => {
                self.dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "access",
                    o << 8 | n as u64,
                    "one 8-byte store, or 4-byte stores to the low then high half",
                );
                None
            }
        };
        let word = word?;
        if register == 1 {
            if page != 0 {
                self.dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "EQ doorbell",
                    word,
                    "EQ doorbells on the driver's page 0 only",
                );
                return None;
            }
            return Some(DoorbellRequest::EventQueue { word });
        }
        self.queue_doorbell(io, page as u32, word)
    }

    /// An 8-byte store into page `page`'s direct-WQE window at `offset`.
    fn direct_window_write(&mut self, io: &mut impl Io, page: usize, offset: u64, data: &[u8]) {
        if !offset.is_multiple_of(8) || data.len() != 8 {
            self.dropped += 1;
            io.diagnose(
                Source::Doorbell,
                format!("doorbell page {page}"),
                "direct WQE access",
                offset << 8 | data.len() as u64,
                "8-byte stores at 8-byte offsets of the direct-WQE window",
            );
            return;
        }
        let window = &mut self.direct[page];
        let at = offset as usize;
        window.bytes[at..at + 8].copy_from_slice(data);
        window.written |= 1 << (offset / 8);
    }

    fn queue_doorbell(&mut self, io: &mut impl Io, page: u32, word: u64) -> Option<DoorbellRequest> {
        let doorbell = Doorbell::from_u64(word);
        let tag = doorbell.tag();
        let mut direct_wqe = None;
        if doorbell.flag() && !self.direct_wqe {
            self.dropped += 1;
            io.diagnose(
                Source::Doorbell,
                format!("doorbell page {page}"),
                "FLAG",
                1,
                "0 (direct WQE is not offered: cap DIRECT_WQE is off)",
            );
            return None;
        }
        if doorbell.flag() {
            let window = std::mem::take(&mut self.direct[page as usize]);
            let command = doorbell.command();
            if command != u8::from(DoorbellCommand::Sq) || window.written != 0xFF {
                self.dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "FLAG",
                    u64::from(window.written) << 8 | u64::from(command),
                    "FLAG only on an SQ doorbell after all 64 bytes of the direct-WQE window",
                );
                return None;
            }
            direct_wqe = Some(window.bytes);
        }
        let command = match DoorbellCommand::try_from(doorbell.command()) {
            Ok(command) => command,
            Err(_) => {
                self.dropped += 1;
                io.diagnose(
                    Source::Doorbell,
                    format!("doorbell page {page}"),
                    "CMD",
                    doorbell.command() as u64,
                    "0 SQ, 1 RQ, 2 SRQ, 3 CQ set-CI, 4 CQ arm",
                );
                return None;
            }
        };
        tracing::trace!(target: "rnic::doorbell", page, ?command, tag, "doorbell");
        Some(match command {
            DoorbellCommand::Sq => DoorbellRequest::QueuePair {
                qpn: tag,
                queue: WorkQueue::Send,
                producer_index: doorbell.producer_index(),
                direct_wqe,
            },
            DoorbellCommand::Rq => DoorbellRequest::QueuePair {
                qpn: tag,
                queue: WorkQueue::Receive,
                producer_index: doorbell.producer_index(),
                direct_wqe: None,
            },
            DoorbellCommand::Srq => DoorbellRequest::SharedReceiveQueue {
                srqn: tag,
                producer_index: doorbell.producer_index(),
            },
            DoorbellCommand::CqSetCi | DoorbellCommand::CqArm => DoorbellRequest::CompletionQueue { cqn: tag, word },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Diagnostics(Vec<&'static str>);

    impl Io for Diagnostics {
        fn diagnose(
            &mut self,
            _source: Source,
            _object: impl Into<String>,
            field: &'static str,
            _value: u64,
            _expected: impl Into<String>,
        ) {
            self.0.push(field);
        }
    }

    fn direct_doorbell(qpn: u32, producer_index: u16) -> [u8; 8] {
        let mut doorbell = Doorbell::sq(qpn, producer_index, 0);
        doorbell.set_flag(true);
        doorbell.as_u64().to_le_bytes()
    }

    fn fill_window(doorbells: &mut Doorbells, io: &mut Diagnostics, page: u64, words: usize) -> [u8; SQ_WQE_SIZE] {
        let mut wqe = [0u8; SQ_WQE_SIZE];
        for (n, byte) in wqe.iter_mut().enumerate() {
            *byte = n as u8 ^ 0xA5;
        }
        for n in 0..words {
            let offset = page * regs::DOORBELL_PAGE_SIZE + DWQE_OFFSET + 8 * n as u64;
            assert_eq!(doorbells.write(io, offset, &wqe[8 * n..8 * n + 8]), None);
        }
        wqe
    }

    #[test]
    fn a_flagged_sq_doorbell_carries_the_wqe_written_to_its_pages_window() {
        let (mut doorbells, mut io) = (Doorbells::new(2), Diagnostics::default());
        let wqe = fill_window(&mut doorbells, &mut io, 1, 8);
        let request = doorbells.write(&mut io, regs::DOORBELL_PAGE_SIZE + DB_OFFSET, &direct_doorbell(7, 3));
        assert_eq!(
            request,
            Some(DoorbellRequest::QueuePair {
                qpn: 7,
                queue: WorkQueue::Send,
                producer_index: 3,
                direct_wqe: Some(wqe),
            })
        );
        // The window was taken: a second flagged doorbell finds it empty.
        assert_eq!(
            doorbells.write(&mut io, regs::DOORBELL_PAGE_SIZE + DB_OFFSET, &direct_doorbell(7, 4)),
            None
        );
        assert_eq!((doorbells.dropped(), io.0.as_slice()), (1, ["FLAG"].as_slice()));
    }

    #[test]
    fn a_flagged_doorbell_after_a_partly_written_window_or_on_another_page_is_dropped() {
        let (mut doorbells, mut io) = (Doorbells::new(2), Diagnostics::default());
        fill_window(&mut doorbells, &mut io, 0, 7);
        assert_eq!(doorbells.write(&mut io, DB_OFFSET, &direct_doorbell(7, 1)), None);
        fill_window(&mut doorbells, &mut io, 0, 8);
        assert_eq!(
            doorbells.write(&mut io, regs::DOORBELL_PAGE_SIZE + DB_OFFSET, &direct_doorbell(7, 1)),
            None
        );
        assert_eq!(doorbells.dropped(), 2);
    }

    #[test]
    fn flag_on_an_rq_doorbell_and_odd_window_stores_are_refused() {
        let (mut doorbells, mut io) = (Doorbells::new(1), Diagnostics::default());
        fill_window(&mut doorbells, &mut io, 0, 8);
        let mut rq = Doorbell::rq(7, 1);
        rq.set_flag(true);
        assert_eq!(doorbells.write(&mut io, DB_OFFSET, &rq.as_u64().to_le_bytes()), None);
        assert_eq!(doorbells.write(&mut io, DWQE_OFFSET + 4, &[0; 4]), None);
        assert_eq!(doorbells.write(&mut io, DWQE_OFFSET + 3, &[0; 8]), None);
        assert_eq!(doorbells.dropped(), 3);
        assert_eq!(io.0, ["FLAG", "direct WQE access", "direct WQE access"]);
    }

    #[test]
    fn without_the_capability_a_flagged_doorbell_is_dropped() {
        let (mut doorbells, mut io) = (Doorbells::new(1).with_direct_wqe(false), Diagnostics::default());
        fill_window(&mut doorbells, &mut io, 0, 8);
        assert_eq!(doorbells.write(&mut io, DB_OFFSET, &direct_doorbell(7, 1)), None);
        assert_eq!((doorbells.dropped(), io.0.as_slice()), (1, ["FLAG"].as_slice()));
    }

    #[test]
    fn an_unflagged_doorbell_leaves_the_window_alone() {
        let (mut doorbells, mut io) = (Doorbells::new(1), Diagnostics::default());
        let wqe = fill_window(&mut doorbells, &mut io, 0, 8);
        let plain = Doorbell::sq(7, 1, 0).as_u64().to_le_bytes();
        assert!(matches!(
            doorbells.write(&mut io, DB_OFFSET, &plain),
            Some(DoorbellRequest::QueuePair { direct_wqe: None, .. })
        ));
        assert!(matches!(
            doorbells.write(&mut io, DB_OFFSET, &direct_doorbell(7, 2)),
            Some(DoorbellRequest::QueuePair { direct_wqe: Some(w), .. }) if w == wqe
        ));
    }
}
