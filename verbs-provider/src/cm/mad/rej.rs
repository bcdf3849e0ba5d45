//! REJ, the connection reject (attribute 0x0012).
//!
//! ```text
//!  0 Local Communication ID (4)   4 Remote Communication ID (4)
//!  8 Message REJected 7:6 · reserved   9 Reject Info Length 7:1 · reserved
//! 10 Reason (2)   12 Additional Reject Information (72)   84 private data (148)
//! ```
//!
//! Linux sends Local Communication ID 0 when it rejects a REQ it has not answered yet
//! (state REQ_RCVD); the receiver then matches the REJ by its Remote Communication ID.

use super::{be, bits, set_bits, view, MadError, CM_MESSAGE_LEN};

/// Bytes of Additional Reject Information.
pub const ARI_LEN: usize = 72;
/// Bytes of private data in a REJ.
pub const PRIVATE_DATA_LEN: usize = 148;

/// Message REJected: the message being rejected.
pub mod rejected {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Anything else (a REJ after a timeout, a stale connection, …).
    pub const OTHER: u8 = 2;
}

mod field {
    use core::ops::Range;
    pub const LOCAL_COMM_ID: Range<usize> = 0..4;
    pub const REMOTE_COMM_ID: Range<usize> = 4..8;
    pub const MESSAGE_REJECTED: usize = 8;
    pub const REJECT_INFO_LENGTH: usize = 9;
    pub const REASON: Range<usize> = 10..12;
    pub const ARI: Range<usize> = 12..84;
    pub const PRIVATE_DATA: Range<usize> = 84..232;
}

view!("REJ", CM_MESSAGE_LEN);

/// REJ reason codes (IBA table 103, Linux `ib_cm_rej_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 3: no resources.
    NoResources,
    /// 4: timeout (the sender gave up waiting, e.g. its consumer destroyed the id).
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid Service ID (nobody listens on it).
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection (the QP is still in timewait on the receiver).
    StaleConnection,
    /// 12: invalid GID (the REQ's remote port GID is not ours).
    InvalidGid,
    /// 26: invalid MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientResponderResources,
    /// 28: consumer defined (`rdma_reject`); the private data says why.
    ConsumerDefined,
    /// 29: invalid RNR retry.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: invalid class version.
    InvalidClassVersion,
    /// Any other code.
    Other(u16),
}

impl RejReason {
    /// The 16-bit code.
    pub fn code(self) -> u16 {
        match self {
            Self::NoQp => 1,
            Self::NoResources => 3,
            Self::Timeout => 4,
            Self::Unsupported => 5,
            Self::InvalidCommId => 6,
            Self::InvalidCommInstance => 7,
            Self::InvalidServiceId => 8,
            Self::InvalidTransportType => 9,
            Self::StaleConnection => 10,
            Self::InvalidGid => 12,
            Self::InvalidMtu => 26,
            Self::InsufficientResponderResources => 27,
            Self::ConsumerDefined => 28,
            Self::InvalidRnrRetry => 29,
            Self::DuplicateLocalCommId => 30,
            Self::InvalidClassVersion => 31,
            Self::Other(code) => code,
        }
    }

    /// The reason of a 16-bit code.
    pub fn from_code(code: u16) -> Self {
        match code {
            1 => Self::NoQp,
            3 => Self::NoResources,
            4 => Self::Timeout,
            5 => Self::Unsupported,
            6 => Self::InvalidCommId,
            7 => Self::InvalidCommInstance,
            8 => Self::InvalidServiceId,
            9 => Self::InvalidTransportType,
            10 => Self::StaleConnection,
            12 => Self::InvalidGid,
            26 => Self::InvalidMtu,
            27 => Self::InsufficientResponderResources,
            28 => Self::ConsumerDefined,
            29 => Self::InvalidRnrRetry,
            30 => Self::DuplicateLocalCommId,
            31 => Self::InvalidClassVersion,
            other => Self::Other(other),
        }
    }
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }
    /// Message REJected (2 bits).
    pub fn message_rejected(&self) -> u8 {
        bits(self.buffer.as_ref()[field::MESSAGE_REJECTED], 7, 6)
    }
    /// Reject Info Length (7 bits).
    pub fn reject_info_length(&self) -> u8 {
        bits(self.buffer.as_ref()[field::REJECT_INFO_LENGTH], 7, 1)
    }
    /// Reason.
    pub fn reason(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::REASON])
    }
    /// The 72 bytes of Additional Reject Information.
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ARI]
    }
    /// The 148 bytes of private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::LOCAL_COMM_ID], value);
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::REMOTE_COMM_ID], value);
    }
    /// Sets Message REJected (2 bits); the reserved bits become zero.
    pub fn set_message_rejected(&mut self, value: u8) {
        let mut byte = 0;
        set_bits(&mut byte, 7, 6, value);
        self.buffer.as_mut()[field::MESSAGE_REJECTED] = byte;
    }
    /// Sets Reject Info Length (7 bits); the reserved bit becomes zero.
    pub fn set_reject_info_length(&mut self, value: u8) {
        let mut byte = 0;
        set_bits(&mut byte, 7, 1, value);
        self.buffer.as_mut()[field::REJECT_INFO_LENGTH] = byte;
    }
    /// Sets the Reason.
    pub fn set_reason(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::REASON], value);
    }
    /// The ARI, writable.
    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ARI]
    }
    /// The private data, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// The semantic content of a REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// Local Communication ID (the sender's; 0 when rejecting an unanswered REQ).
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message REJected: [`rejected::REQ`], [`rejected::REP`] or [`rejected::OTHER`].
    pub message_rejected: u8,
    /// Reject Info Length: the bytes of `ari` that mean something (7 bits, at most 72).
    pub reject_info_length: u8,
    /// Reason.
    pub reason: RejReason,
    /// Additional Reject Information.
    pub ari: [u8; ARI_LEN],
    /// The 148 bytes of private data.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Reads a REJ.
    ///
    /// # Errors
    /// [`MadError::Truncated`] on fewer than 232 bytes; [`MadError::Malformed`] when Reject
    /// Info Length exceeds the 72 bytes of ARI.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
        packet.check_len()?;
        let reject_info_length = packet.reject_info_length();
        if usize::from(reject_info_length) > ARI_LEN {
            return Err(MadError::Malformed {
                layer: "REJ",
                field: "Reject Info Length",
                value: u64::from(reject_info_length),
            });
        }
        let mut ari = [0u8; ARI_LEN];
        ari.copy_from_slice(packet.ari());
        let mut private_data = [0u8; PRIVATE_DATA_LEN];
        private_data.copy_from_slice(packet.private_data());
        Ok(Self {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_rejected: packet.message_rejected(),
            reject_info_length,
            reason: RejReason::from_code(packet.reason()),
            ari,
            private_data,
        })
    }

    /// Writes every byte of the 232-byte message.
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_rejected(self.message_rejected);
        packet.set_reject_info_length(self.reject_info_length);
        packet.set_reason(self.reason.code());
        packet.ari_mut().copy_from_slice(&self.ari);
        packet.private_data_mut().copy_from_slice(&self.private_data);
    }
}
