//! Command-queue descriptor chains from a hostile driver, against a device with live
//! objects: chains of up to eight descriptors with any opcode, flags and payload (POST_MB
//! payloads with any mailbox command, tag and in/out addresses, the mailbox input filled
//! with any bytes), producer steps that post fewer or more descriptors than written, the
//! ring registers reprogrammed with any value, and virtual time passing.
//!
//! The driver may point the device anywhere in its memory here, so the DMA check is that
//! every access stays in the arena or fails as unmapped. Invariants beyond that: while
//! the ring stays where the harness put it, every posted descriptor comes back with OUT
//! set and a defined return code, unposted ones untouched, and the firmware consumes
//! everything posted (CI = PI once settled) unless it reports a fatal error; after the
//! sequence the driver recovers (re-initialising the ring, or resetting the function if
//! the ring is wedged or fatal), the firmware answers QUERY_FW_VER and every mailbox
//! completes with a defined status.

use std::cell::RefCell;

use arbitrary::{Arbitrary, Unstructured};
use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::cmdq::{Descriptor, DescriptorFlags, Opcode, ReturnCode, DESCRIPTOR_SIZE};
use rnic_firmware_if::context::Qpc;
use rnic_firmware_if::mailbox::{MailboxOpcode, PostMailbox};
use rnic_firmware_if::{pci, regs};
use rnic_hw_model::{HostMemory, Picoseconds};

use super::live::{LiveBed, Victim, ARENA_SIZE};
use crate::harness::{DMA_BASE, RING_DEPTH};

/// A DMA address in a descriptor.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum AddressChoice {
    /// The mailbox input buffer.
    MailboxIn,
    /// The mailbox output buffer.
    MailboxOut,
    /// Any offset into the arena.
    Arena(u32),
    /// Any address.
    Raw(u64),
}

/// A descriptor's opcode.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum OpcodeChoice {
    /// One the firmware implements.
    Known(u8),
    /// Any value.
    Raw(u16),
}

/// A descriptor's flags.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum FlagsChoice {
    /// IN (a write command).
    In,
    /// IN | WR (a read command).
    Read,
    /// IN | NEXT (more of the chain follows).
    Next,
    /// Any value.
    Raw(u16),
}

/// A descriptor's 24-byte payload.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum PayloadChoice {
    /// Any bytes.
    Raw([u8; 24]),
    /// A POST_MB payload.
    Mailbox {
        command: u8,
        raw_command: bool,
        tag: u32,
        input: AddressChoice,
        output: AddressChoice,
        event: bool,
        token: u16,
    },
}

/// One descriptor.
#[derive(Debug, Clone, Copy, Arbitrary)]
struct DescriptorSpec {
    opcode: OpcodeChoice,
    flags: FlagsChoice,
    payload: PayloadChoice,
}

/// One operation.
#[derive(Debug, Clone, Arbitrary)]
enum Op {
    /// Write the chain at the producer index and move it by `step` (None: the chain's
    /// length), then let the firmware run.
    Submit {
        chain: Vec<DescriptorSpec>,
        step: Option<u8>,
    },
    /// Fill the mailbox input buffer with these bytes.
    MailboxInput(Vec<u8>),
    /// Write CSQ_BASE_LOW, CSQ_BASE_HIGH, CSQ_DEPTH, CSQ_PRODUCER_INDEX or
    /// CSQ_CONSUMER_INDEX (register modulo 5).
    Register { register: u8, value: u32 },
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
    super::with_bed(&BED, Victim::Anything, |bed| {
        let mut ring_moved = false;
        for op in ops {
            ring_moved |= apply(bed, op, ring_moved);
        }
        finish(bed, ring_moved);
    });
}

fn address(bed: &LiveBed, choice: AddressChoice) -> u64 {
    let (_, mailbox_in, mailbox_out) = bed.h.command_buffers();
    match choice {
        AddressChoice::MailboxIn => mailbox_in,
        AddressChoice::MailboxOut => mailbox_out,
        AddressChoice::Arena(offset) => DMA_BASE + u64::from(offset) % ARENA_SIZE as u64,
        AddressChoice::Raw(address) => address,
    }
}

fn descriptor(bed: &LiveBed, spec: &DescriptorSpec) -> Descriptor {
    let mut descriptor = Descriptor::zeroed();
    descriptor.set_opcode(match spec.opcode {
        OpcodeChoice::Known(i) => Opcode::ALL[usize::from(i) % Opcode::ALL.len()] as u16,
        OpcodeChoice::Raw(raw) => raw,
    });
    descriptor.set_flags_raw(match spec.flags {
        FlagsChoice::In => DescriptorFlags::IN.bits(),
        FlagsChoice::Read => (DescriptorFlags::IN | DescriptorFlags::WR).bits(),
        FlagsChoice::Next => (DescriptorFlags::IN | DescriptorFlags::NEXT).bits(),
        FlagsChoice::Raw(raw) => raw,
    });
    match spec.payload {
        PayloadChoice::Raw(bytes) => descriptor.data_mut().copy_from_slice(&bytes),
        PayloadChoice::Mailbox {
            command,
            raw_command,
            tag,
            input,
            output,
            event,
            token,
        } => {
            let mut post = PostMailbox::zeroed();
            post.set_command(if raw_command {
                command
            } else {
                MailboxOpcode::ALL[usize::from(command) % MailboxOpcode::ALL.len()] as u8
            });
            post.set_tag(if tag & 0x8000_0000 != 0 { tag } else { tag % 0x40 });
            post.set_in_param(address(bed, input));
            post.set_out_param(address(bed, output));
            post.set_event_enable(event);
            post.set_token(token);
            descriptor.data_mut().copy_from_slice(post.bytes());
        }
    }
    descriptor
}

/// Applies one operation; returns whether it reprogrammed the ring registers.
fn apply(bed: &mut LiveBed, op: Op, ring_moved: bool) -> bool {
    match op {
        Op::Submit { chain, step } => {
            let descriptors: Vec<Descriptor> = chain.iter().take(8).map(|spec| descriptor(bed, spec)).collect();
            if descriptors.is_empty() {
                return false;
            }
            let step = step.map_or(descriptors.len() as u32, u32::from);
            // The driver may point a mailbox's output or a context table at the ring, so
            // the ring read back after the firmware ran may hold those bytes on top of
            // the write-backs: the check reads what the device wrote into the ring.
            let (ring, _, _) = bed.h.command_buffers();
            let first = bed.h.producer_index();
            bed.memory
                .watch(ring, ring + u64::from(RING_DEPTH) * DESCRIPTOR_SIZE as u64);
            let back = bed.h.submit_raw(&descriptors, step);
            let writes = bed.memory.take_watched_writes();
            bed.memory.stop_watching();
            if !ring_moved {
                check_ring(bed, &descriptors, &back, step, first, &writes);
            }
        }
        Op::MailboxInput(bytes) => {
            let (_, mailbox_in, _) = bed.h.command_buffers();
            let length = bytes.len().min(4096);
            bed.h.memory.write(mailbox_in, &bytes[..length]).expect("in the arena");
        }
        Op::Register { register, value } => {
            let offset = [
                regs::CSQ_BASE_LOW,
                regs::CSQ_BASE_HIGH,
                regs::CSQ_DEPTH,
                regs::CSQ_PRODUCER_INDEX,
                regs::CSQ_CONSUMER_INDEX,
            ][usize::from(register) % 5];
            bed.h.write_register(offset, value);
            bed.h.settle();
            return true;
        }
        Op::Advance(n) => bed.advance(Picoseconds(1_000u64 << (n % 34))),
    }
    bed.drain_transmit();
    false
}

/// What the firmware wrote back into the ring it was given: `writes` are the device's
/// writes into the ring during the submission, `back` the slots read afterwards, `first`
/// the slot of the chain's first descriptor.
fn check_ring(
    bed: &mut LiveBed,
    written: &[Descriptor],
    back: &[Descriptor],
    step: u32,
    first: u32,
    writes: &[(u64, Vec<u8>)],
) {
    let status = bed.h.read_register(regs::FUNCTION_STATUS);
    if status & regs::STATUS_FATAL != 0 {
        return;
    }
    let (ring, _, _) = bed.h.command_buffers();
    let slot_address = |i: usize| ring + u64::from((first + i as u32) % RING_DEPTH) * DESCRIPTOR_SIZE as u64;
    // A write-back: one whole descriptor at its slot.
    let write_back = |address: u64| {
        writes
            .iter()
            .rev()
            .find(|(at, bytes)| *at == address && bytes.len() == DESCRIPTOR_SIZE)
            .and_then(|(_, bytes)| Descriptor::parse(bytes).ok())
    };
    let posted = (step % RING_DEPTH) as usize;
    for (i, (sent, got)) in written.iter().zip(back).enumerate() {
        let address = slot_address(i);
        if i < posted {
            let Some(completed) = write_back(address) else {
                panic!("descriptor {i} of {posted} posted was never written back (read back: {got:?})");
            };
            assert!(
                completed.flags().contains(DescriptorFlags::OUT),
                "descriptor {i} of {posted} posted came back without OUT: {completed:?}"
            );
            let code = completed.return_value();
            assert!(
                ReturnCode::from_raw(code) != ReturnCode::Other || code == ReturnCode::Other as u16,
                "descriptor {i}: undefined return value {code:#x}"
            );
        } else {
            let overwritten = writes
                .iter()
                .any(|(at, bytes)| *at < address + DESCRIPTOR_SIZE as u64 && at + bytes.len() as u64 > address);
            assert!(
                write_back(address).is_none(),
                "descriptor {i} was not posted, yet the firmware completed it"
            );
            if !overwritten {
                assert_eq!(
                    sent.bytes(),
                    got.bytes(),
                    "descriptor {i} was not posted, yet it changed"
                );
            }
        }
    }
    let producer = bed.h.read_register(regs::CSQ_PRODUCER_INDEX);
    let consumer = bed.h.read_register(regs::CSQ_CONSUMER_INDEX);
    assert_eq!(
        consumer, producer,
        "the firmware consumed everything posted once settled"
    );
}

/// The driver recovers, then the firmware must answer and every QP be in a legal state.
fn finish(bed: &mut LiveBed, ring_moved: bool) {
    bed.h.settle();
    let status = bed.h.read_register(regs::FUNCTION_STATUS);
    let wedged = bed.h.read_register(regs::CSQ_PRODUCER_INDEX) != bed.h.read_register(regs::CSQ_CONSUMER_INDEX);
    if status & regs::STATUS_FATAL != 0 || wedged {
        // A driver resets a function whose command queue failed or stopped.
        bed.h.write_register(regs::FUNCTION_RESET, 1);
        bed.h.settle();
        assert_eq!(
            bed.h.read_register(regs::FUNCTION_STATUS),
            regs::STATUS_READY,
            "ready after reset"
        );
        assert_eq!(bed.h.read_register(regs::ID), regs::ID_MAGIC);
        bed.drain_transmit();
        return;
    }
    if ring_moved {
        bed.h.reinitialize_command_queue();
    }
    let command = pci::COMMAND_MEMORY_SPACE | pci::COMMAND_BUS_MASTER;
    bed.h.device.config_write(pci::offset::COMMAND, &command.to_le_bytes());
    let (code, _) = bed.h.command(Opcode::QueryFirmwareVersion, true, &[0; 24]);
    assert_eq!(code, ReturnCode::Success, "QUERY_FW_VER after the sequence");
    // A mailbox still completes with a defined status (the harness checks it). The QPs'
    // states are whatever the input's commands made of the tables, so they are not
    // checked here; the mailbox target checks each MODIFY.
    bed.h.query::<Qpc>(MailboxOpcode::QueryQpc, bed.qps[0].qp.qpn);
    bed.drain_transmit();
}
