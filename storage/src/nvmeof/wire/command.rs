//! Typed commands over a raw [`SqeRepr`]: the Fabrics commands (storage-and-cm.md B.6),
//! the admin commands a controller needs (B.8) and the NVM I/O commands (B.9), plus
//! [`parse_command_capsule`], which checks a whole received capsule the way a target must
//! before acting on it.
//!
//! Counts follow the specification's encoding on the wire (NLB, NUMD, NR and SQSIZE are
//! 0-based there) but are 1-based in the typed commands: `blocks: 8` is NLB 7.

use std::ops::Range;

use super::sgl::{self, SglRepr};
use super::sqe::{SqeRepr, PSDT_SGL_MPTR_CONTIGUOUS, SQE_LEN};
use super::status::Status;
use super::WireError;

/// Opcodes.
pub mod opcode {
    /// Admin: Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Admin: Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Admin: Abort.
    pub const ABORT: u8 = 0x08;
    /// Admin: Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Admin: Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Admin: Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// Admin: Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Fabrics commands (any queue; FCTYPE says which).
    pub const FABRICS: u8 = 0x7F;
    /// NVM: Flush.
    pub const FLUSH: u8 = 0x00;
    /// NVM: Write.
    pub const WRITE: u8 = 0x01;
    /// NVM: Read.
    pub const READ: u8 = 0x02;
    /// NVM: Compare.
    pub const COMPARE: u8 = 0x05;
    /// NVM: Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// NVM: Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Fabrics command types (SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    /// Disconnect (one I/O queue).
    pub const DISCONNECT: u8 = 0x08;
}

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NAMESPACE_DESCRIPTORS: u8 = 0x03;
    /// I/O command set specific Identify Namespace.
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O command set specific Identify Controller.
    pub const CSI_CONTROLLER: u8 = 0x06;
}

/// Feature identifiers.
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIGURATION: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// Host Identifier (not used on fabrics).
    pub const HOST_IDENTIFIER: u8 = 0x81;
}

/// Log page identifiers.
pub mod log_page {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const COMMANDS_EFFECTS: u8 = 0x05;
    /// Discovery (discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
}

/// The queue a command arrived on: opcodes mean different things on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// QID 0.
    Admin,
    /// QID 1 and up.
    Io,
}

/// Width of a property access (ATTRIB bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropertySize {
    /// 4 bytes (ATTRIB 0).
    Four,
    /// 8 bytes (ATTRIB 1).
    Eight,
}

/// The block range and flags of Read, Write and Compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRange {
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Blocks, 1..=65536 (NLB + 1).
    pub blocks: u32,
    /// Force Unit Access: durable before completion.
    pub fua: bool,
}

/// Which way a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataDirection {
    /// No data.
    None,
    /// Host to controller (the target RDMA-READs or takes it from the capsule).
    HostToController,
    /// Controller to host (the target RDMA-WRITEs).
    ControllerToHost,
}

/// A command, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Fabrics Property Set.
    PropertySet {
        /// Width.
        size: PropertySize,
        /// Property offset (0x14 CC, ...).
        offset: u32,
        /// Value.
        value: u64,
    },
    /// Fabrics Connect (its 1024 bytes of data travel by SGL1).
    Connect {
        /// Record format (0).
        recfmt: u16,
        /// Queue to create (0 = admin).
        qid: u16,
        /// Submission queue size minus one (SQSIZE is 0-based).
        sqsize: u16,
        /// Connect attributes.
        cattr: u8,
        /// Keep-alive timeout, ms (admin queue only; 0 disables).
        kato: u32,
    },
    /// Fabrics Property Get.
    PropertyGet {
        /// Width.
        size: PropertySize,
        /// Property offset.
        offset: u32,
    },
    /// Fabrics Disconnect of the I/O queue it arrives on.
    Disconnect {
        /// Record format (0).
        recfmt: u16,
    },
    /// Identify.
    Identify {
        /// Controller or namespace structure (CNS).
        cns: u8,
        /// Controller ID (CNTID).
        cntid: u16,
        /// Namespace ID.
        nsid: u32,
        /// Command set identifier (CSI).
        csi: u8,
    },
    /// Get Log Page.
    GetLogPage {
        /// Log page identifier.
        lid: u8,
        /// Log specific field.
        lsp: u8,
        /// Retain asynchronous event.
        rae: bool,
        /// Dwords to return (NUMD + 1: 1 to 2^32, so wider than NUMD's 32 bits).
        dwords: u64,
        /// Byte offset into the log page.
        offset: u64,
        /// Namespace ID.
        nsid: u32,
    },
    /// Set Features.
    SetFeatures {
        /// Feature identifier.
        fid: u8,
        /// Save across power cycles (SV).
        save: bool,
        /// Namespace ID.
        nsid: u32,
        /// CDW11, the value for most features.
        value: u32,
    },
    /// Get Features.
    GetFeatures {
        /// Feature identifier.
        fid: u8,
        /// Select: 0 current, 1 default, 2 saved, 3 supported capabilities.
        select: u8,
        /// Namespace ID.
        nsid: u32,
        /// CDW11 (feature specific).
        cdw11: u32,
    },
    /// Asynchronous Event Request.
    AsyncEventRequest,
    /// Keep Alive.
    KeepAlive,
    /// Abort.
    Abort {
        /// Submission queue of the command to abort.
        sqid: u16,
        /// Its command identifier.
        cid: u16,
    },
    /// Read.
    Read(BlockRange),
    /// Write.
    Write(BlockRange),
    /// Compare.
    Compare(BlockRange),
    /// Flush.
    Flush {
        /// Namespace (0xFFFFFFFF: all).
        nsid: u32,
    },
    /// Write Zeroes.
    WriteZeroes {
        /// The blocks.
        range: BlockRange,
        /// Deallocate them too (DEAC).
        deallocate: bool,
    },
    /// Dataset Management (its ranges travel by SGL1, 16 bytes each).
    DatasetManagement {
        /// Namespace.
        nsid: u32,
        /// Ranges, 1..=256 (NR + 1).
        ranges: u16,
        /// Deallocate the ranges (AD).
        deallocate: bool,
    },
}

/// The 16-byte range of a Dataset Management command's data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DsmRange {
    /// Context attributes.
    pub attributes: u32,
    /// Blocks.
    pub blocks: u32,
    /// Starting LBA.
    pub slba: u64,
}

impl DsmRange {
    /// Bytes of a range.
    pub const LEN: usize = 16;

    /// Reads the ranges in `bytes` (any trailing partial range is ignored).
    pub fn parse_all(bytes: &[u8]) -> Vec<DsmRange> {
        bytes
            .chunks_exact(Self::LEN)
            .map(|c| DsmRange {
                attributes: super::le::u32(&c[0..4]),
                blocks: super::le::u32(&c[4..8]),
                slba: super::le::u64(&c[8..16]),
            })
            .collect()
    }

    /// The 16 bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        super::le::set_u32(&mut b[0..4], self.attributes);
        super::le::set_u32(&mut b[4..8], self.blocks);
        super::le::set_u64(&mut b[8..16], self.slba);
        b
    }
}

fn property_size(attrib: u32) -> Result<PropertySize, Status> {
    match attrib & 0x7 {
        0 => Ok(PropertySize::Four),
        1 => Ok(PropertySize::Eight),
        _ => Err(Status::INVALID_FIELD),
    }
}

fn block_range(sqe: &SqeRepr) -> BlockRange {
    BlockRange {
        nsid: sqe.nsid,
        slba: u64::from(sqe.cdw(10)) | u64::from(sqe.cdw(11)) << 32,
        blocks: (sqe.cdw(12) & 0xFFFF) + 1,
        fua: sqe.cdw(12) & (1 << 30) != 0,
    }
}

fn set_block_range(sqe: &mut SqeRepr, range: &BlockRange) {
    sqe.nsid = range.nsid;
    sqe.cdw[0] = range.slba as u32;
    sqe.cdw[1] = (range.slba >> 32) as u32;
    sqe.cdw[2] = (range.blocks.saturating_sub(1) & 0xFFFF) | u32::from(range.fua) << 30;
}

impl Command {
    /// Decodes `sqe` as a command of a `queue`.
    ///
    /// # Errors
    /// [`Status::INVALID_OPCODE`] for an opcode or Fabrics type this queue does not take;
    /// [`Status::INVALID_FIELD`] for a property width other than 4 or 8 bytes.
    pub fn from_sqe(sqe: &SqeRepr, queue: QueueKind) -> Result<Command, Status> {
        if sqe.opcode == opcode::FABRICS {
            return match (sqe.fctype(), queue) {
                (fctype::CONNECT, _) => Ok(Command::Connect {
                    recfmt: sqe.cdw(10) as u16,
                    qid: (sqe.cdw(10) >> 16) as u16,
                    sqsize: sqe.cdw(11) as u16,
                    cattr: (sqe.cdw(11) >> 16) as u8,
                    kato: sqe.cdw(12),
                }),
                (fctype::PROPERTY_SET, QueueKind::Admin) => Ok(Command::PropertySet {
                    size: property_size(sqe.cdw(10))?,
                    offset: sqe.cdw(11),
                    value: u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32,
                }),
                (fctype::PROPERTY_GET, QueueKind::Admin) => Ok(Command::PropertyGet {
                    size: property_size(sqe.cdw(10))?,
                    offset: sqe.cdw(11),
                }),
                (fctype::DISCONNECT, QueueKind::Io) => Ok(Command::Disconnect {
                    recfmt: sqe.cdw(10) as u16,
                }),
                _ => Err(Status::INVALID_OPCODE),
            };
        }
        match queue {
            QueueKind::Admin => match sqe.opcode {
                opcode::IDENTIFY => Ok(Command::Identify {
                    cns: sqe.cdw(10) as u8,
                    cntid: (sqe.cdw(10) >> 16) as u16,
                    nsid: sqe.nsid,
                    csi: (sqe.cdw(11) >> 24) as u8,
                }),
                opcode::GET_LOG_PAGE => {
                    let numdl = sqe.cdw(10) >> 16;
                    let numdu = sqe.cdw(11) & 0xFFFF;
                    Ok(Command::GetLogPage {
                        lid: sqe.cdw(10) as u8,
                        lsp: ((sqe.cdw(10) >> 8) & 0x7F) as u8,
                        rae: sqe.cdw(10) & (1 << 15) != 0,
                        dwords: u64::from(numdu << 16 | numdl) + 1,
                        offset: u64::from(sqe.cdw(12)) | u64::from(sqe.cdw(13)) << 32,
                        nsid: sqe.nsid,
                    })
                }
                opcode::SET_FEATURES => Ok(Command::SetFeatures {
                    fid: sqe.cdw(10) as u8,
                    save: sqe.cdw(10) & (1 << 31) != 0,
                    nsid: sqe.nsid,
                    value: sqe.cdw(11),
                }),
                opcode::GET_FEATURES => Ok(Command::GetFeatures {
                    fid: sqe.cdw(10) as u8,
                    select: ((sqe.cdw(10) >> 8) & 0x7) as u8,
                    nsid: sqe.nsid,
                    cdw11: sqe.cdw(11),
                }),
                opcode::ASYNC_EVENT_REQUEST => Ok(Command::AsyncEventRequest),
                opcode::KEEP_ALIVE => Ok(Command::KeepAlive),
                opcode::ABORT => Ok(Command::Abort {
                    sqid: sqe.cdw(10) as u16,
                    cid: (sqe.cdw(10) >> 16) as u16,
                }),
                _ => Err(Status::INVALID_OPCODE),
            },
            QueueKind::Io => match sqe.opcode {
                opcode::READ => Ok(Command::Read(block_range(sqe))),
                opcode::WRITE => Ok(Command::Write(block_range(sqe))),
                opcode::COMPARE => Ok(Command::Compare(block_range(sqe))),
                opcode::FLUSH => Ok(Command::Flush { nsid: sqe.nsid }),
                opcode::WRITE_ZEROES => Ok(Command::WriteZeroes {
                    range: block_range(sqe),
                    deallocate: sqe.cdw(12) & (1 << 25) != 0,
                }),
                opcode::DATASET_MANAGEMENT => Ok(Command::DatasetManagement {
                    nsid: sqe.nsid,
                    ranges: (sqe.cdw(10) & 0xFF) as u16 + 1,
                    deallocate: sqe.cdw(11) & (1 << 2) != 0,
                }),
                _ => Err(Status::INVALID_OPCODE),
            },
        }
    }

    /// The SQE of this command with `cid` and SGL1 `sgl`, PSDT 01b as fabrics require.
    pub fn to_sqe(&self, cid: u16, sgl: &SglRepr) -> SqeRepr {
        let mut sqe = SqeRepr {
            opcode: self.opcode(),
            flags: PSDT_SGL_MPTR_CONTIGUOUS << 6,
            cid,
            sgl1: sgl.to_bytes(),
            ..SqeRepr::default()
        };
        let size_attrib = |size: PropertySize| match size {
            PropertySize::Four => 0,
            PropertySize::Eight => 1,
        };
        match *self {
            Command::PropertySet { size, offset, value } => {
                sqe.nsid = u32::from(fctype::PROPERTY_SET);
                sqe.cdw[0] = size_attrib(size);
                sqe.cdw[1] = offset;
                sqe.cdw[2] = value as u32;
                sqe.cdw[3] = (value >> 32) as u32;
            }
            Command::Connect {
                recfmt,
                qid,
                sqsize,
                cattr,
                kato,
            } => {
                sqe.nsid = u32::from(fctype::CONNECT);
                sqe.cdw[0] = u32::from(recfmt) | u32::from(qid) << 16;
                sqe.cdw[1] = u32::from(sqsize) | u32::from(cattr) << 16;
                sqe.cdw[2] = kato;
            }
            Command::PropertyGet { size, offset } => {
                sqe.nsid = u32::from(fctype::PROPERTY_GET);
                sqe.cdw[0] = size_attrib(size);
                sqe.cdw[1] = offset;
            }
            Command::Disconnect { recfmt } => {
                sqe.nsid = u32::from(fctype::DISCONNECT);
                sqe.cdw[0] = u32::from(recfmt);
            }
            Command::Identify { cns, cntid, nsid, csi } => {
                sqe.nsid = nsid;
                sqe.cdw[0] = u32::from(cns) | u32::from(cntid) << 16;
                sqe.cdw[1] = u32::from(csi) << 24;
            }
            Command::GetLogPage {
                lid,
                lsp,
                rae,
                dwords,
                offset,
                nsid,
            } => {
                let numd = dwords.saturating_sub(1).min(u64::from(u32::MAX)) as u32;
                sqe.nsid = nsid;
                sqe.cdw[0] = u32::from(lid) | u32::from(lsp & 0x7F) << 8 | u32::from(rae) << 15 | (numd & 0xFFFF) << 16;
                sqe.cdw[1] = numd >> 16;
                sqe.cdw[2] = offset as u32;
                sqe.cdw[3] = (offset >> 32) as u32;
            }
            Command::SetFeatures { fid, save, nsid, value } => {
                sqe.nsid = nsid;
                sqe.cdw[0] = u32::from(fid) | u32::from(save) << 31;
                sqe.cdw[1] = value;
            }
            Command::GetFeatures {
                fid,
                select,
                nsid,
                cdw11,
            } => {
                sqe.nsid = nsid;
                sqe.cdw[0] = u32::from(fid) | u32::from(select & 0x7) << 8;
                sqe.cdw[1] = cdw11;
            }
            Command::AsyncEventRequest | Command::KeepAlive => {}
            Command::Abort { sqid, cid } => sqe.cdw[0] = u32::from(sqid) | u32::from(cid) << 16,
            Command::Read(range) | Command::Write(range) | Command::Compare(range) => {
                set_block_range(&mut sqe, &range);
            }
            Command::Flush { nsid } => sqe.nsid = nsid,
            Command::WriteZeroes { range, deallocate } => {
                set_block_range(&mut sqe, &range);
                sqe.cdw[2] |= u32::from(deallocate) << 25;
            }
            Command::DatasetManagement {
                nsid,
                ranges,
                deallocate,
            } => {
                sqe.nsid = nsid;
                sqe.cdw[0] = u32::from(ranges.saturating_sub(1) & 0xFF);
                sqe.cdw[1] = u32::from(deallocate) << 2;
            }
        }
        sqe
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        match self {
            Command::PropertySet { .. }
            | Command::Connect { .. }
            | Command::PropertyGet { .. }
            | Command::Disconnect { .. } => opcode::FABRICS,
            Command::Identify { .. } => opcode::IDENTIFY,
            Command::GetLogPage { .. } => opcode::GET_LOG_PAGE,
            Command::SetFeatures { .. } => opcode::SET_FEATURES,
            Command::GetFeatures { .. } => opcode::GET_FEATURES,
            Command::AsyncEventRequest => opcode::ASYNC_EVENT_REQUEST,
            Command::KeepAlive => opcode::KEEP_ALIVE,
            Command::Abort { .. } => opcode::ABORT,
            Command::Read(_) => opcode::READ,
            Command::Write(_) => opcode::WRITE,
            Command::Compare(_) => opcode::COMPARE,
            Command::Flush { .. } => opcode::FLUSH,
            Command::WriteZeroes { .. } => opcode::WRITE_ZEROES,
            Command::DatasetManagement { .. } => opcode::DATASET_MANAGEMENT,
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::PropertySet { .. } => "Property Set",
            Command::Connect { .. } => "Connect",
            Command::PropertyGet { .. } => "Property Get",
            Command::Disconnect { .. } => "Disconnect",
            Command::Identify { .. } => "Identify",
            Command::GetLogPage { .. } => "Get Log Page",
            Command::SetFeatures { .. } => "Set Features",
            Command::GetFeatures { .. } => "Get Features",
            Command::AsyncEventRequest => "Asynchronous Event Request",
            Command::KeepAlive => "Keep Alive",
            Command::Abort { .. } => "Abort",
            Command::Read(_) => "Read",
            Command::Write(_) => "Write",
            Command::Compare(_) => "Compare",
            Command::Flush { .. } => "Flush",
            Command::WriteZeroes { .. } => "Write Zeroes",
            Command::DatasetManagement { .. } => "Dataset Management",
        }
    }

    /// Which way the command's data moves.
    pub fn data_direction(&self) -> DataDirection {
        match self {
            Command::Connect { .. } | Command::Write(_) | Command::Compare(_) | Command::DatasetManagement { .. } => {
                DataDirection::HostToController
            }
            Command::Identify { .. } | Command::GetLogPage { .. } | Command::Read(_) => DataDirection::ControllerToHost,
            _ => DataDirection::None,
        }
    }
}

/// Where a command's data is, after the capsule was checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DataPointer {
    /// The command has no data (keyed, length 0).
    None,
    /// In the capsule: this range of the bytes after the SQE.
    InCapsule(Range<usize>),
    /// In host memory, reached with RDMA.
    Keyed {
        /// Remote virtual address.
        address: u64,
        /// Bytes.
        length: u32,
        /// R_Key.
        key: u32,
        /// The host asked for SEND WITH INVALIDATE of the key.
        invalidate: bool,
    },
}

impl DataPointer {
    /// Bytes the pointer describes.
    pub fn length(&self) -> u64 {
        match self {
            DataPointer::None => 0,
            DataPointer::InCapsule(range) => range.len() as u64,
            DataPointer::Keyed { length, .. } => u64::from(*length),
        }
    }
}

/// A received command capsule that passed the checks every command must pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCapsule<'a> {
    /// The SQE as received.
    pub sqe: SqeRepr,
    /// The decoded command.
    pub command: Command,
    /// Where its data is.
    pub data: DataPointer,
    /// The bytes after the SQE.
    pub in_capsule: &'a [u8],
}

/// Why a capsule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapsuleError {
    /// Shorter than an SQE: there is no command identifier to answer (a target tears
    /// the queue down, as Linux does).
    #[error("capsule of {0} bytes, shorter than a 64-byte SQE")]
    Truncated(usize),
    /// The command is answered with `status`.
    #[error("command {cid}: {status}")]
    Refused {
        /// Command identifier.
        cid: u16,
        /// Status to answer with.
        status: Status,
        /// What was wrong, for the diagnostic.
        reason: &'static str,
    },
}

/// Parses and checks a received command capsule on a queue of `queue` kind: an SQE of
/// PSDT 01b without fused operations, a known command, and an SGL1 that is one keyed
/// descriptor, in-capsule data at offset 0 that fits the capsule, or a Last Segment in
/// the capsule holding exactly one keyed descriptor.
///
/// This is the target's entry point for every byte a host sends, and a fuzzing entry
/// point: it never panics.
///
/// # Errors
/// [`CapsuleError::Truncated`] below 64 bytes; otherwise [`CapsuleError::Refused`] with
/// the status the command must be answered with.
pub fn parse_command_capsule(bytes: &[u8], queue: QueueKind) -> Result<CommandCapsule<'_>, CapsuleError> {
    let Ok(sqe) = super::sqe::parse_sqe(bytes) else {
        return Err(CapsuleError::Truncated(bytes.len()));
    };
    let in_capsule = &bytes[SQE_LEN..];
    let refuse = |status: Status, reason: &'static str| CapsuleError::Refused {
        cid: sqe.cid,
        status,
        reason,
    };
    if sqe.psdt() != PSDT_SGL_MPTR_CONTIGUOUS {
        return Err(refuse(Status::INVALID_FIELD, "PSDT is not 01b (SGLs)"));
    }
    if sqe.fuse() != 0 {
        return Err(refuse(Status::INVALID_FIELD, "fused operations are not supported"));
    }
    let command = Command::from_sqe(&sqe, queue).map_err(|status| refuse(status, "unknown opcode or Fabrics type"))?;
    let data = data_pointer(&sqe.sgl1, in_capsule).map_err(|(status, reason)| refuse(status, reason))?;
    Ok(CommandCapsule {
        sqe,
        command,
        data,
        in_capsule,
    })
}

fn data_pointer(sgl1: &[u8; 16], in_capsule: &[u8]) -> Result<DataPointer, (Status, &'static str)> {
    let descriptor =
        sgl::parse_sgl(sgl1).map_err(|_| (Status::SGL_DESCRIPTOR_TYPE_INVALID, "unknown SGL identifier"))?;
    match descriptor {
        SglRepr::Keyed {
            address,
            length,
            key,
            invalidate,
        } => Ok(if length == 0 {
            DataPointer::None
        } else {
            DataPointer::Keyed {
                address,
                length,
                key,
                invalidate,
            }
        }),
        SglRepr::InCapsule { offset, length } => {
            if offset != 0 {
                return Err((Status::INVALID_SGL_OFFSET, "in-capsule data not at offset 0 (ICDOFF 0)"));
            }
            if length as usize > in_capsule.len() {
                return Err((
                    Status::DATA_SGL_LENGTH_INVALID,
                    "the in-capsule SGL is longer than the capsule's data",
                ));
            }
            Ok(DataPointer::InCapsule(0..length as usize))
        }
        SglRepr::SegmentOffset { offset, length, last } => {
            if !last {
                return Err((Status::INVALID_SGL_SEGMENT_DESCRIPTOR, "a Segment that is not the last"));
            }
            if length as usize != sgl::SGL_DESCRIPTOR_LEN {
                return Err((
                    Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS,
                    "a descriptor list of other than one descriptor (MSDBD 1)",
                ));
            }
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            let Some(list) = start
                .checked_add(sgl::SGL_DESCRIPTOR_LEN)
                .and_then(|end| in_capsule.get(start..end))
            else {
                return Err((
                    Status::DATA_SGL_LENGTH_INVALID,
                    "the descriptor list reaches past the capsule",
                ));
            };
            match sgl::parse_sgl(list) {
                Ok(SglRepr::Keyed {
                    address,
                    length,
                    key,
                    invalidate,
                }) if length > 0 => Ok(DataPointer::Keyed {
                    address,
                    length,
                    key,
                    invalidate,
                }),
                Ok(SglRepr::Keyed { .. }) => Ok(DataPointer::None),
                _ => Err((
                    Status::SGL_DESCRIPTOR_TYPE_INVALID,
                    "a descriptor in the list that is not keyed",
                )),
            }
        }
        // Some hosts leave SGL1 all zero on commands without data.
        SglRepr::DataBlockAddress { length: 0, .. } => Ok(DataPointer::None),
        SglRepr::DataBlockAddress { .. } | SglRepr::BitBucket { .. } => Err((
            Status::SGL_DESCRIPTOR_TYPE_INVALID,
            "a descriptor type fabrics do not carry",
        )),
    }
}

/// Parses bytes as an SQE and decodes its command for `queue` (no SGL checks).
///
/// # Errors
/// [`WireError::Truncated`] below 64 bytes; [`WireError::Malformed`] (field "opcode")
/// for a command the queue does not take.
pub fn parse_command(bytes: &[u8], queue: QueueKind) -> Result<(SqeRepr, Command), WireError> {
    let sqe = super::sqe::parse_sqe(bytes)?;
    let command = Command::from_sqe(&sqe, queue).map_err(|_| WireError::Malformed {
        format: "SQE",
        field: "opcode",
        value: u64::from(sqe.opcode),
    })?;
    Ok((sqe, command))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvmeof::wire::XorShift;

    fn keyed(address: u64, length: u32, key: u32) -> SglRepr {
        SglRepr::Keyed {
            address,
            length,
            key,
            invalidate: false,
        }
    }

    /// The reference builder's admin Connect (B.6, Appendix): CID 1, keyed SGL VA
    /// 0x7f0000001000, 1024 B, R_Key 0x1234; RECFMT 0, QID 0, SQSIZE 31, KATO 5000.
    const CONNECT: [u8; 64] = [
        0x7F, 0x40, 0x01, 0x00, 0x01, 0, 0, 0, // opcode, flags, CID, FCTYPE Connect
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
        0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x04, 0x00, 0x34, 0x12, 0x00, 0x00, 0x40, // SGL1
        0, 0, 0, 0, 31, 0, 0, 0, 0x88, 0x13, 0, 0, // RECFMT, QID, SQSIZE, CATTR, KATO 5000
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    /// The builder's Property Set CC = 0x00460001 (CID 3).
    const PROPERTY_SET_CC: [u8; 64] = [
        0x7F, 0x40, 0x03, 0x00, 0x00, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        0, 0, 0, 0, 0x14, 0, 0, 0, 0x01, 0x00, 0x46, 0x00, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    /// The builder's Read of 8 blocks at LBA 0 on NSID 1 (CID 5), keyed with invalidate.
    const READ_8: [u8; 64] = [
        0x02, 0x40, 0x05, 0x00, 0x01, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        0x00, 0x00, 0x01, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0xbc, 0x9a, 0x00, 0x00, 0x4F, //
        0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn parses_known_bytes() {
        let (sqe, command) = parse_command(&CONNECT, QueueKind::Admin).unwrap();
        assert_eq!(sqe.cid, 1);
        assert_eq!(
            command,
            Command::Connect {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 0,
                kato: 5000
            }
        );
        let (_, command) = parse_command(&PROPERTY_SET_CC, QueueKind::Admin).unwrap();
        assert_eq!(
            command,
            Command::PropertySet {
                size: PropertySize::Four,
                offset: 0x14,
                value: 0x0046_0001
            }
        );
        let capsule = parse_command_capsule(&READ_8, QueueKind::Io).unwrap();
        assert_eq!(
            capsule.command,
            Command::Read(BlockRange {
                nsid: 1,
                slba: 0,
                blocks: 8,
                fua: false
            })
        );
        assert_eq!(
            capsule.data,
            DataPointer::Keyed {
                address: 0x7f00_0001_0000,
                length: 4096,
                key: 0x9abc,
                invalidate: true
            }
        );
    }

    /// Found by the `nvme_capsules` fuzz target (docs/fuzzing.md): NUMD is 0-based, so
    /// its largest value asks for 2^32 dwords, one more than 32 bits hold; the parser
    /// overflowed.
    #[test]
    fn get_log_page_of_the_largest_numd_asks_for_two_to_the_32_dwords() {
        let sqe = SqeRepr {
            opcode: opcode::GET_LOG_PAGE,
            cdw: [0xFFFF_0002, 0xFFFF, 0, 0, 0, 0],
            ..SqeRepr::default()
        };
        let (_, command) = parse_command(&sqe.to_bytes(), QueueKind::Admin).unwrap();
        let Command::GetLogPage { lid, dwords, .. } = command else {
            panic!("{command:?}")
        };
        assert_eq!((lid, dwords), (2, 1 << 32));
        let sgl = crate::nvmeof::wire::sgl::SglRepr::Keyed {
            address: 0,
            length: 0,
            key: 0,
            invalidate: false,
        };
        assert_eq!(
            command.to_sqe(0, &sgl).cdw[..2],
            [0xFFFF_0002, 0xFFFF],
            "and emits back"
        );
    }

    #[test]
    fn emits_known_bytes() {
        let connect = Command::Connect {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 5000,
        };
        assert_eq!(
            connect.to_sqe(1, &keyed(0x7f00_0000_1000, 1024, 0x1234)).to_bytes(),
            CONNECT
        );
        let set = Command::PropertySet {
            size: PropertySize::Four,
            offset: 0x14,
            value: 0x0046_0001,
        };
        assert_eq!(
            set.to_sqe(3, &SglRepr::InCapsule { offset: 0, length: 0 }).to_bytes()[..24],
            PROPERTY_SET_CC[..24]
        );
        assert_eq!(
            set.to_sqe(3, &SglRepr::InCapsule { offset: 0, length: 0 }).to_bytes()[40..],
            PROPERTY_SET_CC[40..]
        );
        let read = Command::Read(BlockRange {
            nsid: 1,
            slba: 0,
            blocks: 8,
            fua: false,
        });
        let sgl = SglRepr::Keyed {
            address: 0x7f00_0001_0000,
            length: 4096,
            key: 0x9abc,
            invalidate: true,
        };
        assert_eq!(read.to_sqe(5, &sgl).to_bytes(), READ_8);
    }

    fn random_command(rng: &mut XorShift) -> (Command, QueueKind) {
        let range = BlockRange {
            nsid: rng.u32(),
            slba: rng.next_u64(),
            blocks: u32::from(rng.u16()) + 1,
            fua: rng.u8() & 1 == 1,
        };
        let size = if rng.u8() & 1 == 1 {
            PropertySize::Four
        } else {
            PropertySize::Eight
        };
        match rng.u8() % 17 {
            0 => (
                Command::PropertySet {
                    size,
                    offset: rng.u32(),
                    value: rng.next_u64(),
                },
                QueueKind::Admin,
            ),
            1 => (
                Command::Connect {
                    recfmt: rng.u16(),
                    qid: rng.u16(),
                    sqsize: rng.u16(),
                    cattr: rng.u8(),
                    kato: rng.u32(),
                },
                QueueKind::Io,
            ),
            2 => (
                Command::PropertyGet {
                    size,
                    offset: rng.u32(),
                },
                QueueKind::Admin,
            ),
            3 => (Command::Disconnect { recfmt: rng.u16() }, QueueKind::Io),
            4 => (
                Command::Identify {
                    cns: rng.u8(),
                    cntid: rng.u16(),
                    nsid: rng.u32(),
                    csi: rng.u8(),
                },
                QueueKind::Admin,
            ),
            5 => (
                Command::GetLogPage {
                    lid: rng.u8(),
                    lsp: rng.u8() & 0x7F,
                    rae: rng.u8() & 1 == 1,
                    dwords: u64::from(rng.u32()) + 1,
                    offset: rng.next_u64(),
                    nsid: rng.u32(),
                },
                QueueKind::Admin,
            ),
            6 => (
                Command::SetFeatures {
                    fid: rng.u8(),
                    save: rng.u8() & 1 == 1,
                    nsid: rng.u32(),
                    value: rng.u32(),
                },
                QueueKind::Admin,
            ),
            7 => (
                Command::GetFeatures {
                    fid: rng.u8(),
                    select: rng.u8() & 7,
                    nsid: rng.u32(),
                    cdw11: rng.u32(),
                },
                QueueKind::Admin,
            ),
            8 => (Command::AsyncEventRequest, QueueKind::Admin),
            9 => (Command::KeepAlive, QueueKind::Admin),
            10 => (
                Command::Abort {
                    sqid: rng.u16(),
                    cid: rng.u16(),
                },
                QueueKind::Admin,
            ),
            11 => (Command::Read(range), QueueKind::Io),
            12 => (Command::Write(range), QueueKind::Io),
            13 => (Command::Compare(range), QueueKind::Io),
            14 => (Command::Flush { nsid: rng.u32() }, QueueKind::Io),
            15 => (
                Command::WriteZeroes {
                    range,
                    deallocate: rng.u8() & 1 == 1,
                },
                QueueKind::Io,
            ),
            _ => (
                Command::DatasetManagement {
                    nsid: rng.u32(),
                    ranges: u16::from(rng.u8()) + 1,
                    deallocate: rng.u8() & 1 == 1,
                },
                QueueKind::Io,
            ),
        }
    }

    #[test]
    fn round_trips_random_commands() {
        let mut rng = XorShift::new(0xC0_11A5D);
        for _ in 0..5000 {
            let (command, queue) = random_command(&mut rng);
            let cid = rng.u16();
            let sqe = command.to_sqe(cid, &keyed(rng.next_u64(), rng.u32() & 0xFF_FFFF, rng.u32()));
            let bytes = sqe.to_bytes();
            let (parsed_sqe, parsed) = parse_command(&bytes, queue).unwrap();
            assert_eq!(parsed, command);
            assert_eq!(parsed_sqe, sqe);
        }
    }

    #[test]
    fn refuses_what_the_queue_does_not_take() {
        // Read on the admin queue is Get Log Page's opcode: it decodes as that; Identify
        // (6) on an I/O queue is unknown there.
        let identify = Command::Identify {
            cns: 1,
            cntid: 0,
            nsid: 0,
            csi: 0,
        }
        .to_sqe(9, &SglRepr::NO_DATA)
        .to_bytes();
        assert!(matches!(
            parse_command_capsule(&identify, QueueKind::Io),
            Err(CapsuleError::Refused {
                cid: 9,
                status: Status::INVALID_OPCODE,
                ..
            })
        ));
        // Property Get on an I/O queue, Disconnect on the admin queue.
        let get = Command::PropertyGet {
            size: PropertySize::Eight,
            offset: 0,
        }
        .to_sqe(1, &SglRepr::NO_DATA)
        .to_bytes();
        assert!(parse_command_capsule(&get, QueueKind::Io).is_err());
        let disconnect = Command::Disconnect { recfmt: 0 }
            .to_sqe(1, &SglRepr::NO_DATA)
            .to_bytes();
        assert!(parse_command_capsule(&disconnect, QueueKind::Admin).is_err());
        // Unknown FCTYPE and property width.
        let mut bytes = get;
        bytes[4] = 0x42;
        assert!(matches!(
            parse_command_capsule(&bytes, QueueKind::Admin),
            Err(CapsuleError::Refused {
                status: Status::INVALID_OPCODE,
                ..
            })
        ));
        let mut bytes = get;
        bytes[40] = 2;
        assert!(matches!(
            parse_command_capsule(&bytes, QueueKind::Admin),
            Err(CapsuleError::Refused {
                status: Status::INVALID_FIELD,
                ..
            })
        ));
    }

    #[test]
    fn checks_psdt_fuse_and_sgl() {
        let read = Command::Read(BlockRange {
            nsid: 1,
            slba: 0,
            blocks: 1,
            fua: false,
        });
        let check = |bytes: &[u8]| match parse_command_capsule(bytes, QueueKind::Io) {
            Ok(_) => None,
            Err(CapsuleError::Refused { status, cid: 7, .. }) => Some(status),
            Err(other) => panic!("{other}"),
        };
        let base = read.to_sqe(7, &keyed(0x1000, 512, 1)).to_bytes();
        assert_eq!(check(&base), None);
        let mut bytes = base;
        bytes[1] = 0x00; // PSDT 00b: PRPs
        assert_eq!(check(&bytes), Some(Status::INVALID_FIELD));
        let mut bytes = base;
        bytes[1] = 0x41; // fused
        assert_eq!(check(&bytes), Some(Status::INVALID_FIELD));
        let mut bytes = base;
        bytes[39] = 0x5A; // unknown SGL identifier
        assert_eq!(check(&bytes), Some(Status::SGL_DESCRIPTOR_TYPE_INVALID));
        // In-capsule data: offset 0 within the capsule only.
        let write = Command::Write(BlockRange {
            nsid: 1,
            slba: 0,
            blocks: 1,
            fua: false,
        });
        let mut capsule = write
            .to_sqe(7, &SglRepr::InCapsule { offset: 0, length: 512 })
            .to_bytes()
            .to_vec();
        capsule.extend_from_slice(&[0xAB; 512]);
        let parsed = parse_command_capsule(&capsule, QueueKind::Io).unwrap();
        assert_eq!(parsed.data, DataPointer::InCapsule(0..512));
        assert_eq!(check(&capsule[..64 + 511]), Some(Status::DATA_SGL_LENGTH_INVALID));
        let mut shifted = write
            .to_sqe(
                7,
                &SglRepr::InCapsule {
                    offset: 16,
                    length: 496,
                },
            )
            .to_bytes()
            .to_vec();
        shifted.extend_from_slice(&[0; 512]);
        assert_eq!(check(&shifted), Some(Status::INVALID_SGL_OFFSET));
        // A Last Segment holding one keyed descriptor.
        let mut listed = write
            .to_sqe(
                7,
                &SglRepr::SegmentOffset {
                    offset: 0,
                    length: 16,
                    last: true,
                },
            )
            .to_bytes()
            .to_vec();
        listed.extend_from_slice(&keyed(0x2000, 512, 0x77).to_bytes());
        assert_eq!(
            parse_command_capsule(&listed, QueueKind::Io).unwrap().data,
            DataPointer::Keyed {
                address: 0x2000,
                length: 512,
                key: 0x77,
                invalidate: false
            }
        );
        assert_eq!(check(&listed[..70]), Some(Status::DATA_SGL_LENGTH_INVALID));
        let two = write.to_sqe(
            7,
            &SglRepr::SegmentOffset {
                offset: 0,
                length: 32,
                last: true,
            },
        );
        assert_eq!(check(&two.to_bytes()), Some(Status::INVALID_NUMBER_OF_SGL_DESCRIPTORS));
        let address = write.to_sqe(
            7,
            &SglRepr::DataBlockAddress {
                address: 0,
                length: 512,
            },
        );
        assert_eq!(check(&address.to_bytes()), Some(Status::SGL_DESCRIPTOR_TYPE_INVALID));
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..SQE_LEN {
            assert_eq!(
                parse_command_capsule(&READ_8[..len], QueueKind::Io),
                Err(CapsuleError::Truncated(len))
            );
            assert!(matches!(
                parse_command(&READ_8[..len], QueueKind::Io),
                Err(WireError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn never_panics_on_random_capsules() {
        let mut rng = XorShift::new(0xF422);
        for _ in 0..20_000 {
            let len = (rng.u16() % 200) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8()).collect();
            if len > 1 && rng.u8() & 1 == 1 {
                bytes[1] = 0x40;
            }
            let queue = if rng.u8() & 1 == 1 {
                QueueKind::Admin
            } else {
                QueueKind::Io
            };
            let _ = parse_command_capsule(&bytes, queue);
        }
    }

    #[test]
    fn dsm_ranges_round_trip() {
        let range = DsmRange {
            attributes: 1,
            blocks: 8,
            slba: 0x1234,
        };
        let mut bytes = range.to_bytes().to_vec();
        bytes.extend_from_slice(&[1, 2, 3]);
        assert_eq!(DsmRange::parse_all(&bytes), vec![range]);
        assert_eq!(&range.to_bytes()[4..8], &[8, 0, 0, 0]);
    }
}
