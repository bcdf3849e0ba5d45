//! REP, the connection reply (attribute 0x0013): 36 bytes of fields, 196 of private data.
//!
//! ```text
//!  0 Local Communication ID (4)   4 Remote Communication ID (4)   8 Local Q_Key (4)
//! 12 Local QPN (3) · reserved     16 Local EECN (3) · reserved    20 Starting PSN (3) · reserved
//! 24 Responder Resources   25 Initiator Depth
//! 26 Target ACK Delay 7:3 · Failover Accepted 2:1 · End-to-End Flow Control 0
//! 27 RNR Retry Count 7:5 · SRQ 4 · reserved
//! 28 Local CA GUID (8)            36 private data (196)
//! ```

use super::{be, bits, set_bits, view, MadError, CM_MESSAGE_LEN};

/// Bytes of private data in a REP.
pub const PRIVATE_DATA_LEN: usize = 196;

mod field {
    use core::ops::Range;
    pub const LOCAL_COMM_ID: Range<usize> = 0..4;
    pub const REMOTE_COMM_ID: Range<usize> = 4..8;
    pub const LOCAL_QKEY: Range<usize> = 8..12;
    pub const LOCAL_QPN: Range<usize> = 12..15;
    pub const RESERVED_15: usize = 15;
    pub const LOCAL_EECN: Range<usize> = 16..19;
    pub const RESERVED_19: usize = 19;
    pub const STARTING_PSN: Range<usize> = 20..23;
    pub const RESERVED_23: usize = 23;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    pub const BYTE_26: usize = 26;
    pub const BYTE_27: usize = 27;
    pub const LOCAL_CA_GUID: Range<usize> = 28..36;
    pub const PRIVATE_DATA: Range<usize> = 36..232;
}

view!("REP", CM_MESSAGE_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    fn byte(&self, at: usize) -> u8 {
        self.buffer.as_ref()[at]
    }
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Remote Communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }
    /// Local Q_Key.
    pub fn local_qkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_QKEY])
    }
    /// Local QPN (24 bits).
    pub fn local_qpn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::LOCAL_QPN])
    }
    /// Local EECN (24 bits).
    pub fn local_eecn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::LOCAL_EECN])
    }
    /// Starting PSN (24 bits).
    pub fn starting_psn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::STARTING_PSN])
    }
    /// Responder Resources.
    pub fn responder_resources(&self) -> u8 {
        self.byte(field::RESPONDER_RESOURCES)
    }
    /// Initiator Depth.
    pub fn initiator_depth(&self) -> u8 {
        self.byte(field::INITIATOR_DEPTH)
    }
    /// Target ACK Delay (5 bits).
    pub fn target_ack_delay(&self) -> u8 {
        bits(self.byte(field::BYTE_26), 7, 3)
    }
    /// Failover Accepted (2 bits).
    pub fn failover_accepted(&self) -> u8 {
        bits(self.byte(field::BYTE_26), 2, 1)
    }
    /// End-to-End Flow Control.
    pub fn end_to_end_flow_control(&self) -> bool {
        bits(self.byte(field::BYTE_26), 0, 0) != 0
    }
    /// RNR Retry Count (3 bits).
    pub fn rnr_retry_count(&self) -> u8 {
        bits(self.byte(field::BYTE_27), 7, 5)
    }
    /// SRQ.
    pub fn srq(&self) -> bool {
        bits(self.byte(field::BYTE_27), 4, 4) != 0
    }
    /// Local CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::LOCAL_CA_GUID])
    }
    /// The 196 bytes of private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn byte_mut(&mut self, at: usize) -> &mut u8 {
        &mut self.buffer.as_mut()[at]
    }
    /// Sets the Local Communication ID.
    pub fn set_local_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::LOCAL_COMM_ID], value);
    }
    /// Sets the Remote Communication ID.
    pub fn set_remote_comm_id(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::REMOTE_COMM_ID], value);
    }
    /// Sets the Local Q_Key.
    pub fn set_local_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::LOCAL_QKEY], value);
    }
    /// Sets the Local QPN (low 24 bits).
    pub fn set_local_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::LOCAL_QPN], value);
    }
    /// Sets the Local EECN (low 24 bits).
    pub fn set_local_eecn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::LOCAL_EECN], value);
    }
    /// Sets the Starting PSN (low 24 bits).
    pub fn set_starting_psn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::STARTING_PSN], value);
    }
    /// Zeroes the reserved bytes.
    pub fn clear_reserved(&mut self) {
        for at in [field::RESERVED_15, field::RESERVED_19, field::RESERVED_23] {
            *self.byte_mut(at) = 0;
        }
    }
    /// Sets Responder Resources.
    pub fn set_responder_resources(&mut self, value: u8) {
        *self.byte_mut(field::RESPONDER_RESOURCES) = value;
    }
    /// Sets Initiator Depth.
    pub fn set_initiator_depth(&mut self, value: u8) {
        *self.byte_mut(field::INITIATOR_DEPTH) = value;
    }
    /// Sets the Target ACK Delay (5 bits).
    pub fn set_target_ack_delay(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_26), 7, 3, value);
    }
    /// Sets Failover Accepted (2 bits).
    pub fn set_failover_accepted(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_26), 2, 1, value);
    }
    /// Sets End-to-End Flow Control.
    pub fn set_end_to_end_flow_control(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_26), 0, 0, u8::from(value));
    }
    /// Sets the RNR Retry Count (3 bits); the reserved low bits become zero.
    pub fn set_rnr_retry_count_and_srq(&mut self, rnr_retry_count: u8, srq: bool) {
        let mut byte = 0;
        set_bits(&mut byte, 7, 5, rnr_retry_count);
        set_bits(&mut byte, 4, 4, u8::from(srq));
        *self.byte_mut(field::BYTE_27) = byte;
    }
    /// Sets the Local CA GUID.
    pub fn set_local_ca_guid(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::LOCAL_CA_GUID], value);
    }
    /// The private data, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// The semantic content of a REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// Local Communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the REQ's local one).
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN: the first PSN the sender expects to receive (24 bits).
    pub starting_psn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Target ACK Delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover Accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count the receiver's QP uses (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// The 196 bytes of private data.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Reads a REP.
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
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            local_eecn: packet.local_eecn(),
            starting_psn: packet.starting_psn(),
            responder_resources: packet.responder_resources(),
            initiator_depth: packet.initiator_depth(),
            target_ack_delay: packet.target_ack_delay(),
            failover_accepted: packet.failover_accepted(),
            end_to_end_flow_control: packet.end_to_end_flow_control(),
            rnr_retry_count: packet.rnr_retry_count(),
            srq: packet.srq(),
            local_ca_guid: packet.local_ca_guid(),
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
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_local_eecn(self.local_eecn);
        packet.set_starting_psn(self.starting_psn);
        packet.clear_reserved();
        packet.set_responder_resources(self.responder_resources);
        packet.set_initiator_depth(self.initiator_depth);
        *packet.byte_mut(field::BYTE_26) = 0;
        packet.set_target_ack_delay(self.target_ack_delay);
        packet.set_failover_accepted(self.failover_accepted);
        packet.set_end_to_end_flow_control(self.end_to_end_flow_control);
        packet.set_rnr_retry_count_and_srq(self.rnr_retry_count, self.srq);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.private_data_mut().copy_from_slice(&self.private_data);
    }
}
