//! DREQ, the disconnection request (attribute 0x0015): both communication IDs, the
//! receiver's QPN, and 220 bytes of private data. Linux ignores a DREQ whose Remote
//! QPN/EECN is not the receiver's local QPN.
//!
//! ```text
//! 0 Local Communication ID (4)   4 Remote Communication ID (4)
//! 8 Remote QPN/EECN (3) · reserved   12 private data (220)
//! ```

use super::{be, view, MadError, CM_MESSAGE_LEN};

/// Bytes of private data in a DREQ.
pub const PRIVATE_DATA_LEN: usize = 220;

mod field {
    use core::ops::Range;
    pub const LOCAL_COMM_ID: Range<usize> = 0..4;
    pub const REMOTE_COMM_ID: Range<usize> = 4..8;
    pub const REMOTE_QPN_EECN: Range<usize> = 8..11;
    pub const RESERVED: usize = 11;
    pub const PRIVATE_DATA: Range<usize> = 12..232;
}

view!("DREQ", CM_MESSAGE_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }
    /// Remote QPN/EECN (24 bits): the receiver's QP.
    pub fn remote_qpn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::REMOTE_QPN_EECN])
    }
    /// The 220 bytes of private data.
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
    /// Sets the Remote QPN/EECN (low 24 bits) and zeroes the reserved byte after it.
    pub fn set_remote_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::REMOTE_QPN_EECN], value);
        self.buffer.as_mut()[field::RESERVED] = 0;
    }
    /// The private data, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// The semantic content of a DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN: the receiver's QP (24 bits).
    pub remote_qpn: u32,
    /// The 220 bytes of private data.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Reads a DREQ.
    ///
    /// # Errors
    /// [`MadError::Truncated`] on fewer than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
        packet.check_len()?;
        let mut private_data = [0u8; PRIVATE_DATA_LEN];
        private_data.copy_from_slice(packet.private_data());
        Ok(Self {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            remote_qpn: packet.remote_qpn(),
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
        packet.set_remote_qpn(self.remote_qpn);
        packet.private_data_mut().copy_from_slice(&self.private_data);
    }
}
