//! MRA, message receipt acknowledgement (attribute 0x0011): "I got your message, give me
//! more time".
//!
//! ```text
//! 0 Local Communication ID (4)   4 Remote Communication ID (4)
//! 8 Message MRAed 7:6 · reserved   9 Service Timeout 7:3 · reserved   10 private data (222)
//! ```

use super::{be, bits, set_bits, view, MadError, CM_MESSAGE_LEN};

/// Bytes of private data in an MRA.
pub const PRIVATE_DATA_LEN: usize = 222;

/// Message MRAed.
pub mod mraed {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// A LAP.
    pub const LAP: u8 = 2;
}

mod field {
    use core::ops::Range;
    pub const LOCAL_COMM_ID: Range<usize> = 0..4;
    pub const REMOTE_COMM_ID: Range<usize> = 4..8;
    pub const MESSAGE_MRAED: usize = 8;
    pub const SERVICE_TIMEOUT: usize = 9;
    pub const PRIVATE_DATA: Range<usize> = 10..232;
}

view!("MRA", CM_MESSAGE_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }
    /// Message MRAed (2 bits).
    pub fn message_mraed(&self) -> u8 {
        bits(self.buffer.as_ref()[field::MESSAGE_MRAED], 7, 6)
    }
    /// Service Timeout (5 bits, 4.096 µs × 2^n).
    pub fn service_timeout(&self) -> u8 {
        bits(self.buffer.as_ref()[field::SERVICE_TIMEOUT], 7, 3)
    }
    /// The 222 bytes of private data.
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
    /// Sets Message MRAed (2 bits); the reserved bits become zero.
    pub fn set_message_mraed(&mut self, value: u8) {
        let mut byte = 0;
        set_bits(&mut byte, 7, 6, value);
        self.buffer.as_mut()[field::MESSAGE_MRAED] = byte;
    }
    /// Sets the Service Timeout (5 bits); the reserved bits become zero.
    pub fn set_service_timeout(&mut self, value: u8) {
        let mut byte = 0;
        set_bits(&mut byte, 7, 3, value);
        self.buffer.as_mut()[field::SERVICE_TIMEOUT] = byte;
    }
    /// The private data, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// The semantic content of an MRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Message MRAed: [`mraed::REQ`], [`mraed::REP`] or [`mraed::LAP`].
    pub message_mraed: u8,
    /// Service Timeout (5 bits).
    pub service_timeout: u8,
    /// The 222 bytes of private data.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Reads an MRA.
    ///
    /// # Errors
    /// [`MadError::Truncated`] on fewer than 232 bytes; [`MadError::Malformed`] for
    /// Message MRAed 3 (reserved).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
        packet.check_len()?;
        let message_mraed = packet.message_mraed();
        if message_mraed > mraed::LAP {
            return Err(MadError::Malformed {
                layer: "MRA",
                field: "Message MRAed",
                value: u64::from(message_mraed),
            });
        }
        let mut private_data = [0u8; PRIVATE_DATA_LEN];
        private_data.copy_from_slice(packet.private_data());
        Ok(Self {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_mraed,
            service_timeout: packet.service_timeout(),
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
        packet.set_message_mraed(self.message_mraed);
        packet.set_service_timeout(self.service_timeout);
        packet.private_data_mut().copy_from_slice(&self.private_data);
    }
}
