//! Doorbell and BAR access sequences from a hostile driver against a device with live
//! QPs: BAR0 register writes and reads of any size at any offset (a function reset in
//! the middle of traffic included), doorbells of every kind for any object (the victim's
//! included: here it is the driver's own) and any index, written as one 8-byte store or
//! two 4-byte halves on any page, MSI-X table writes, configuration-space writes (bus
//! mastering and memory decoding off and on), and virtual time passing.
//!
//! Left out: the command-queue registers (base, depth, producer and consumer index),
//! which are the `cmdq` target's: here a moved ring or a producer index that replays old
//! descriptors would run commands the input did not write.
//!
//! Invariants: DMA only in the granted windows (WQE rings, page tables and the mailbox
//! input never written, region B never touched, region C never written); after the
//! sequence, once the driver re-enables the function as a driver recovering would, the
//! device is ready and — unless the input reset it — every QP is in RTS or ERR and every
//! CQE is well-formed; after a reset the function answers its identification registers.

use std::cell::RefCell;

use arbitrary::{Arbitrary, Unstructured};
use rnic_firmware_if::context::QpState;
use rnic_firmware_if::doorbell::{CqDoorbell, Doorbell, EqDoorbell, EqDoorbellCommand, DB_OFFSET, EQ_DB_OFFSET};
use rnic_firmware_if::{pci, regs};
use rnic_hw_model::Picoseconds;

use super::live::{LiveBed, Victim};

/// A BAR0 offset as an input names it.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum RegisterChoice {
    /// A register of the register map (modulo their number).
    Known(u8),
    /// The per-EQ interrupt enable of EQ `n`.
    EventEnable(u8),
    /// Any offset.
    Raw(u32),
}

/// The object a doorbell names.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum ObjectChoice {
    /// QP 0x10..=0x19 (the victim 0x18 included), CQ 1..=3, SRQ 1, EQ 0 or 1: by index.
    Bed(u8),
    /// Any number.
    Raw(u32),
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
enum Op {
    /// A BAR0 write of 1, 2, 4 or 8 bytes.
    ControlWrite {
        register: RegisterChoice,
        size: u8,
        value: u64,
    },
    /// A read of any BAR (index modulo 6) at any offset, 0..=8 bytes.
    Read { bar: u8, offset: u32, size: u8 },
    /// A queue doorbell: SQ, RQ, SRQ, CQ set-CI, CQ arm, or a raw word.
    Doorbell {
        kind: u8,
        object: ObjectChoice,
        index: u32,
        extra: u8,
        raw: u64,
        page: u8,
        halves: bool,
    },
    /// An EQ doorbell (any command, EQN and index), as one store or two halves.
    EqDoorbell {
        command: u8,
        eqn: u8,
        index: u32,
        halves: bool,
        page: u8,
    },
    /// A doorbell-BAR write of any size at any offset.
    DoorbellBar { offset: u32, size: u8, value: u64 },
    /// An MSI-X table or PBA write.
    Msix { offset: u16, size: u8, value: u64 },
    /// A configuration-space write, 1..=4 bytes.
    Config { offset: u16, size: u8, value: u32 },
    /// Let 2^(n mod 34) ns of virtual time pass.
    Advance(u8),
}

thread_local! {
    static BED: RefCell<Option<LiveBed>> = const { RefCell::new(None) };
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(ops) = Vec::<Op>::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    super::with_bed(&BED, Victim::Owned, |bed| {
        let mut reset = false;
        for op in ops {
            reset |= apply(bed, op);
        }
        finish(bed, reset);
    });
}

const SIZES: [usize; 4] = [1, 2, 4, 8];

/// Whether a BAR0 write touches the command-queue registers this target leaves alone.
fn touches_the_command_queue(offset: u64, size: usize) -> bool {
    let end = offset.saturating_add(size as u64);
    offset < regs::CSQ_CONSUMER_INDEX + 4 && regs::CSQ_BASE_LOW < end
}

/// Whether a BAR0 write of `size` bytes of `value` at `offset` starts a function reset
/// (the device decodes 4-byte writes, and 8-byte writes as two of them).
fn starts_reset(offset: u64, size: usize, value: u64) -> bool {
    let reset = regs::FUNCTION_RESET;
    match size {
        4 | 8 if offset == reset => value & 1 != 0,
        8 if offset + 4 == reset => (value >> 32) & 1 != 0,
        _ => false,
    }
}

/// Applies one operation; returns whether it started a function reset.
fn apply(bed: &mut LiveBed, op: Op) -> bool {
    let device = &mut bed.h.device;
    match op {
        Op::ControlWrite { register, size, value } => {
            let offset = match register {
                RegisterChoice::Known(i) => regs::REGISTERS[usize::from(i) % regs::REGISTERS.len()].offset,
                RegisterChoice::EventEnable(n) => regs::event_int_enable(u32::from(n)),
                RegisterChoice::Raw(offset) => u64::from(offset) % (regs::BAR0_SIZE + 0x100),
            };
            let size = SIZES[usize::from(size) % 4];
            if touches_the_command_queue(offset, size) {
                return false;
            }
            device.bar_write(regs::CONTROL_BAR, offset, &value.to_le_bytes()[..size]);
            bed.drain_transmit();
            return starts_reset(offset, size, value);
        }
        Op::Read { bar, offset, size } => {
            let mut data = vec![0u8; usize::from(size) % 9];
            device.bar_read(bar % 6, u64::from(offset), &mut data);
        }
        Op::Doorbell {
            kind,
            object,
            index,
            extra,
            raw,
            page,
            halves,
        } => {
            let (qpns, cqns) = ([0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19], [1, 2, 3]);
            let number = |n: usize| match object {
                ObjectChoice::Bed(i) => usize::from(i) % n,
                ObjectChoice::Raw(value) => value as usize,
            };
            let word = match kind % 6 {
                0 => Doorbell::sq(qp_number(object, &qpns, number(qpns.len())), index as u16, extra).as_u64(),
                1 => Doorbell::rq(qp_number(object, &qpns, number(qpns.len())), index as u16).as_u64(),
                2 => Doorbell::srq(object_number(object, 1), index as u16).as_u64(),
                3 => CqDoorbell::update(qp_number(object, &cqns, number(cqns.len())), index & 0xFF_FFFF).as_u64(),
                4 => CqDoorbell::arm(
                    qp_number(object, &cqns, number(cqns.len())),
                    index & 0xFF_FFFF,
                    extra & 3,
                    extra & 4 != 0,
                )
                .as_u64(),
                _ => raw,
            };
            let at = u64::from(page % 4) * regs::DOORBELL_PAGE_SIZE + DB_OFFSET;
            store(bed, at, word, halves);
        }
        Op::EqDoorbell {
            command,
            eqn,
            index,
            halves,
            page,
        } => {
            let command = EqDoorbellCommand::ALL[usize::from(command) % 4];
            let word = EqDoorbell::new(command, eqn % 4, index & 0xFF_FFFF).as_u64();
            // Page 0 nearly always: EQ doorbells on other pages are refused.
            let page = u64::from(page == 0xFF);
            store(bed, page * regs::DOORBELL_PAGE_SIZE + EQ_DB_OFFSET, word, halves);
        }
        Op::DoorbellBar { offset, size, value } => {
            let size = SIZES[usize::from(size) % 4];
            device.bar_write(
                regs::DOORBELL_BAR,
                u64::from(offset) % (8 * regs::DOORBELL_PAGE_SIZE),
                &value.to_le_bytes()[..size],
            );
        }
        Op::Msix { offset, size, value } => {
            let size = SIZES[usize::from(size) % 4];
            device.bar_write(
                regs::MSIX_BAR,
                u64::from(offset) % regs::MSIX_BAR_SIZE,
                &value.to_le_bytes()[..size],
            );
        }
        Op::Config { offset, size, value } => {
            let size = 1 + usize::from(size) % 4;
            device.config_write(
                usize::from(offset) % pci::CONFIG_SPACE_SIZE,
                &value.to_le_bytes()[..size],
            );
        }
        Op::Advance(n) => {
            let until = device.now() + Picoseconds(1_000u64 << (n % 34));
            device.advance_to(until);
        }
    }
    bed.drain_transmit();
    false
}

fn qp_number(object: ObjectChoice, numbers: &[u32], index: usize) -> u32 {
    match object {
        ObjectChoice::Bed(_) => numbers[index % numbers.len()],
        ObjectChoice::Raw(value) => value & 0xFF_FFFF,
    }
}

fn object_number(object: ObjectChoice, default: u32) -> u32 {
    match object {
        ObjectChoice::Bed(_) => default,
        ObjectChoice::Raw(value) => value & 0xFF_FFFF,
    }
}

/// Writes a 64-bit doorbell word at `offset` of the doorbell BAR: one store, or the low
/// half then the high half.
fn store(bed: &mut LiveBed, offset: u64, word: u64, halves: bool) {
    let device = &mut bed.h.device;
    if halves {
        device.bar_write(regs::DOORBELL_BAR, offset, &(word as u32).to_le_bytes());
        device.bar_write(regs::DOORBELL_BAR, offset + 4, &((word >> 32) as u32).to_le_bytes());
    } else {
        device.bar_write(regs::DOORBELL_BAR, offset, &word.to_le_bytes());
    }
    bed.drain_transmit();
}

/// The driver recovers as a driver would (memory decoding and bus mastering back on),
/// then the device must answer.
fn finish(bed: &mut LiveBed, reset: bool) {
    let command = pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER;
    bed.h.device.config_write(pci::offset::COMMAND, &command.to_le_bytes());
    bed.h.settle();
    assert_eq!(
        bed.h.read_register(regs::FUNCTION_STATUS) & regs::STATUS_READY,
        regs::STATUS_READY,
        "the function is ready after the sequence"
    );
    assert_eq!(bed.h.read_register(regs::ID), regs::ID_MAGIC);
    if reset {
        // The function forgot every object: nothing more to ask it.
        bed.drain_transmit();
        return;
    }
    bed.finish(&[QpState::Rts, QpState::Err]);
}
