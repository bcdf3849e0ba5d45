//! Work requests and work completions: `ibv_sge`, `ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`
//! and their enums, shaped so a C ABI layer maps them 1:1.
//!
//! Differences from the C structures, all forced by Rust rather than chosen:
//!
//! * lists are borrowed slices (`sg_list`, and the slice of work requests handed to a post
//!   call) instead of `next` pointers and `num_sge`, so posting allocates nothing;
//! * the `wr` union is three plain fields ([`SendWorkRequest::rdma`],
//!   [`SendWorkRequest::atomic`], [`SendWorkRequest::ud`]); the opcode says which one is
//!   read, as in C;
//! * immediate data is in **host order** both ways ([`SendWorkRequest::imm_data`],
//!   [`WorkCompletion::imm_data`]); the C layer converts from and to the `__be32` of
//!   `ibv_send_wr` / `ibv_wc`;
//! * the `imm_data` / `invalidated_rkey` union of `ibv_wc` is two fields, only the one
//!   named by [`WcFlags`] meaningful.
//!
//! Enum discriminants are the ibverbs values.

use std::fmt;

use rnic_firmware_if::cqe::CqeStatus;

use super::ah::AddressHandle;
use super::error::{EFAULT, EINVAL, ENOMEM};
use super::qp::{QpState, QpType};

/// `ibv_sge`: one local buffer, `length` bytes at `addr` in the memory region of `lkey`.
/// Laid out as the C `struct ibv_sge`, so a C ABI layer can hand an application's SGE
/// array over as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Sge {
    /// Address (an iova of the region of `lkey`).
    pub addr: u64,
    /// Length in bytes (zero-length entries are skipped).
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

impl Sge {
    /// `length` bytes at `addr` in the region of `lkey`.
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Self {
        Self { addr, length, lkey }
    }
}

/// `ibv_wr_opcode`, the operations this device carries out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite = 0,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteWithImm = 1,
    /// `IBV_WR_SEND`.
    #[default]
    Send = 2,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm = 3,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead = 4,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    AtomicCmpSwp = 5,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    AtomicFetchAdd = 6,
    /// `IBV_WR_SEND_WITH_INV`.
    SendWithInv = 9,
}

impl WrOpcode {
    /// Whether a QP of `qp_type` may post it (IB transport rules: UD sends only; UC has
    /// no reads, atomics or invalidation).
    pub fn allowed_on(self, qp_type: QpType) -> bool {
        match qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(
                self,
                Self::Send | Self::SendWithImm | Self::RdmaWrite | Self::RdmaWriteWithImm
            ),
            QpType::Ud => matches!(self, Self::Send | Self::SendWithImm),
        }
    }

    /// Whether it is one of the two 8-byte atomics.
    pub fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicCmpSwp | Self::AtomicFetchAdd)
    }

    /// Whether it carries immediate data.
    pub fn has_immediate(self) -> bool {
        matches!(self, Self::SendWithImm | Self::RdmaWriteWithImm)
    }
}

bitflags::bitflags! {
    /// `ibv_send_flags`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier RDMA READs and atomics first.
        const FENCE = 1;
        /// `IBV_SEND_SIGNALED`: complete with a work completion (always, with `sq_sig_all`).
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: ask for a solicited event at the responder.
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: the CPU copies the payload into the queue at post time; the
        /// buffers need no registration and may be reused as soon as the post returns.
        const INLINE = 1 << 3;
    }
}

/// `wr.rdma` of `ibv_send_wr`: the remote buffer of an RDMA READ or WRITE.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RdmaFields {
    /// Remote address (an iova of the remote region).
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.atomic` of `ibv_send_wr`: the remote 8-byte word and the operands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AtomicFields {
    /// Remote address (8-byte aligned).
    pub remote_addr: u64,
    /// Compare value (compare-and-swap) or addend (fetch-and-add).
    pub compare_add: u64,
    /// Swap value (compare-and-swap only).
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.ud` of `ibv_send_wr`: where a UD send goes.
#[derive(Debug, Clone, Copy)]
pub struct UdFields<'a> {
    /// Address handle of the destination.
    pub ah: &'a AddressHandle,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Q_Key; with bit 31 set the QP's own Q_Key is used instead.
    pub remote_qkey: u32,
}

/// `ibv_send_wr` (see the module documentation for the differences).
#[derive(Debug, Clone, Copy, Default)]
pub struct SendWorkRequest<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Local buffers (gathered for sends and writes, scattered into for reads; the first
    /// one is the 8-byte result buffer of an atomic).
    pub sg_list: &'a [Sge],
    /// Flags.
    pub send_flags: SendFlags,
    /// Immediate data, host order (`*_WITH_IMM`).
    pub imm_data: u32,
    /// The rkey the responder invalidates (`SendWithInv`).
    pub invalidate_rkey: u32,
    /// Remote buffer of RDMA READ / WRITE.
    pub rdma: RdmaFields,
    /// Operands of the atomics.
    pub atomic: AtomicFields,
    /// Destination of a UD send (required on UD QPs).
    pub ud: Option<UdFields<'a>>,
}

/// `ibv_recv_wr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvWorkRequest<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// Buffers the incoming message is scattered into.
    pub sg_list: &'a [Sge],
}

/// Why a work request was refused at post time. No variant allocates, so refusing costs
/// as little as accepting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostErrorKind {
    /// The queue pair is in a state that takes no work requests of this kind (`EINVAL`):
    /// sends need RTS, SQD or ERR, receives anything but RESET.
    InvalidState(QpState),
    /// The queue is full (`ENOMEM`): outstanding work requests must complete and be
    /// polled first.
    QueueFull,
    /// More scatter/gather entries than the queue was created for (`EINVAL`).
    TooManySges {
        /// Entries in the request.
        given: usize,
        /// The queue's limit.
        max: u32,
    },
    /// Inline payload longer than the QP's `max_inline_data` or the path MTU (`EINVAL`).
    InlineTooLong {
        /// Payload bytes.
        length: u64,
        /// The limit that applies.
        max: u32,
    },
    /// The opcode is not allowed on this QP type, or with these flags (RDMA READ with
    /// `INLINE`) (`EINVAL`).
    OpcodeNotSupported {
        /// The opcode.
        opcode: WrOpcode,
        /// The QP type.
        qp_type: QpType,
    },
    /// A UD send without a destination, or with an address handle of another device
    /// (`EINVAL`).
    BadAddressHandle,
    /// An atomic without its local 8-byte buffer (`EINVAL`).
    MissingAtomicBuffer,
    /// The message exceeds the 2 GiB message size limit (`EINVAL`).
    MessageTooLong {
        /// Bytes in the request.
        length: u64,
    },
    /// The QP receives from a shared receive queue: post receives there (`EINVAL`).
    UsesSrq,
    /// Inline payload that the CPU could not read (`EFAULT`): the address is neither in
    /// the memory region of the entry's lkey nor driver DMA memory.
    BadAddress {
        /// The address.
        addr: u64,
    },
    /// The QP or SRQ is destroyed (`EINVAL`).
    Destroyed,
}

impl PostErrorKind {
    /// The errno the ibverbs call returns.
    pub fn errno(&self) -> i32 {
        match self {
            Self::QueueFull => ENOMEM,
            Self::BadAddress { .. } => EFAULT,
            _ => EINVAL,
        }
    }
}

impl fmt::Display for PostErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidState(state) => write!(f, "the QP is in {state}"),
            Self::QueueFull => f.write_str("the work queue is full"),
            Self::TooManySges { given, max } => write!(f, "{given} SGEs, the queue takes {max}"),
            Self::InlineTooLong { length, max } => write!(f, "{length} inline bytes, at most {max}"),
            Self::OpcodeNotSupported { opcode, qp_type } => write!(f, "{opcode:?} is not allowed on a {qp_type:?} QP"),
            Self::BadAddressHandle => f.write_str("a UD send needs an address handle of this device"),
            Self::MissingAtomicBuffer => f.write_str("an atomic needs its local 8-byte buffer as SGE 0"),
            Self::MessageTooLong { length } => write!(f, "a message of {length} bytes exceeds 2 GiB"),
            Self::UsesSrq => f.write_str("the QP receives from an SRQ"),
            Self::BadAddress { addr } => write!(f, "inline data at {addr:#x} is not readable"),
            Self::Destroyed => f.write_str("the queue is destroyed"),
        }
    }
}

/// A refused post: the work requests before `index_of_bad_wr` were posted (and the
/// doorbell rung for them), that one and the rest were not — ibverbs' `bad_wr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("work request {index_of_bad_wr}: {error}")]
pub struct PostError {
    /// Index of the first work request not posted.
    pub index_of_bad_wr: usize,
    /// Why.
    pub error: PostErrorKind,
}

impl PostError {
    /// The errno the ibverbs call returns.
    pub fn errno(&self) -> i32 {
        self.error.errno()
    }
}

/// `ibv_wc_status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR` (not reported by this device).
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR` (not reported by this device).
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR` (hns: XRC violations).
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR` (not reported by this device).
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR` (not reported by this device).
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR` (not reported by this device).
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR` (not reported by this device).
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`: vendor-specific; also every status this driver does not
    /// know.
    GeneralErr = 21,
}

impl WcStatus {
    /// The ibverbs status of a raw CQE `STATUS` byte (hns §8 table; unknown values are
    /// general errors, as in rdma-core).
    pub fn from_hardware(status: u8) -> Self {
        match CqeStatus::try_from(status) {
            Ok(status) => status.into(),
            Err(_) => Self::GeneralErr,
        }
    }
}

impl From<CqeStatus> for WcStatus {
    fn from(status: CqeStatus) -> Self {
        match status {
            CqeStatus::Success => Self::Success,
            CqeStatus::LocalLengthErr => Self::LocLenErr,
            CqeStatus::LocalQpOpErr => Self::LocQpOpErr,
            CqeStatus::LocalProtErr => Self::LocProtErr,
            CqeStatus::WrFlushErr => Self::WrFlushErr,
            CqeStatus::MwBindErr => Self::MwBindErr,
            CqeStatus::BadRespErr => Self::BadRespErr,
            CqeStatus::LocalAccessErr => Self::LocAccessErr,
            CqeStatus::RemoteInvalReqErr => Self::RemInvReqErr,
            CqeStatus::RemoteAccessErr => Self::RemAccessErr,
            CqeStatus::RemoteOpErr => Self::RemOpErr,
            CqeStatus::TransportRetryExcErr => Self::RetryExcErr,
            CqeStatus::RnrRetryExcErr => Self::RnrRetryExcErr,
            CqeStatus::RemoteAbortErr => Self::RemAbortErr,
            CqeStatus::GeneralErr => Self::GeneralErr,
            CqeStatus::XrcViolation => Self::RemInvRdReqErr,
        }
    }
}

/// `ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// `IBV_WC_SEND` (also SEND_WITH_IMM and SEND_WITH_INV).
    #[default]
    Send = 0,
    /// `IBV_WC_RDMA_WRITE` (also RDMA_WRITE_WITH_IMM).
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv = 6,
    /// `IBV_WC_RECV`: an incoming SEND consumed a receive WQE.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: an incoming RDMA WRITE with immediate consumed one.
    RecvRdmaWithImm = 129,
}

bitflags::bitflags! {
    /// `ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold the GRH (UD).
        const GRH = 1;
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK` (never set: no IP checksum offload).
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// `ibv_wc` (see the module documentation for the differences).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation (also decoded for error completions, as rdma-core's hns provider does).
    pub opcode: WcOpcode,
    /// Vendor error: the CQE's `SUB_STATUS`.
    pub vendor_err: u32,
    /// Bytes received (receive side), read (RDMA READ) or 8 (atomics); 0 otherwise.
    pub byte_len: u32,
    /// Immediate data, host order (with [`WcFlags::WITH_IMM`]).
    pub imm_data: u32,
    /// The rkey the sender invalidated (with [`WcFlags::WITH_INV`]).
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP number (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (always 0: one P_Key).
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level of the received packet.
    pub sl: u8,
    /// DLID path bits (0 on RoCE).
    pub dlid_path_bits: u8,
    /// Source MAC of a UD receive (the CQE's `SMAC`, as hns reports it to the kernel's
    /// `ib_wc.smac`); all zero otherwise. Not in `ibv_wc`: the connection manager answers
    /// a MAD through it without resolving the sender's address.
    pub smac: [u8; 6],
}
