//! REQ, the connection request (attribute 0x0010): 140 bytes of fields and 92 of private
//! data (RDMA-CM puts its 36-byte IP header first). Offsets in the 232-byte CM message:
//!
//! ```text
//!   0 Local Communication ID (4)      4 reserved (4)       8 Service ID (8)
//!  16 Local CA GUID (8)              24 reserved (4)      28 Local Q_Key (4)
//!  32 Local QPN (3) · Responder Resources (1)
//!  36 Local EECN (3) · Initiator Depth (1)
//!  40 Remote EECN (3) · Remote CM Response Timeout 7:3 · Transport Service Type 2:1 ·
//!     End-to-End Flow Control 0
//!  44 Starting PSN (3) · Local CM Response Timeout 7:3 · Retry Count 2:0
//!  48 Partition Key (2)
//!  50 Path Packet Payload MTU 7:4 · RDC Exists 3 · RNR Retry Count 2:0
//!  51 Max CM Retries 7:4 · SRQ 3 · Extended Transport Type 2:0
//!  52 primary path (44)   96 alternate path (44)   140 private data (92)
//! ```
//!
//! A path, 44 bytes: local LID (2), remote LID (2), local GID (16), remote GID (16), flow
//! label 31:12 · reserved · packet rate 5:0 (4), traffic class, hop limit, SL 7:4 ·
//! subnet local 3, local ACK timeout 7:3.

use super::{be, bits, set_bits, view, MadError, CM_MESSAGE_LEN};

/// Bytes of private data in a REQ.
pub const PRIVATE_DATA_LEN: usize = 92;
/// Bytes of one path in a REQ.
pub const PATH_LEN: usize = 44;

mod field {
    use core::ops::Range;
    pub const LOCAL_COMM_ID: Range<usize> = 0..4;
    pub const RESERVED_4: Range<usize> = 4..8;
    pub const SERVICE_ID: Range<usize> = 8..16;
    pub const LOCAL_CA_GUID: Range<usize> = 16..24;
    pub const RESERVED_24: Range<usize> = 24..28;
    pub const LOCAL_QKEY: Range<usize> = 28..32;
    pub const LOCAL_QPN: Range<usize> = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: Range<usize> = 36..39;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: Range<usize> = 40..43;
    pub const BYTE_43: usize = 43;
    pub const STARTING_PSN: Range<usize> = 44..47;
    pub const BYTE_47: usize = 47;
    pub const PARTITION_KEY: Range<usize> = 48..50;
    pub const BYTE_50: usize = 50;
    pub const BYTE_51: usize = 51;
    pub const PRIMARY_PATH: Range<usize> = 52..96;
    pub const ALTERNATE_PATH: Range<usize> = 96..140;
    pub const PRIVATE_DATA: Range<usize> = 140..232;
}

mod path_field {
    use core::ops::Range;
    pub const LOCAL_LID: Range<usize> = 0..2;
    pub const REMOTE_LID: Range<usize> = 2..4;
    pub const LOCAL_GID: Range<usize> = 4..20;
    pub const REMOTE_GID: Range<usize> = 20..36;
    pub const FLOW_LABEL_RATE: Range<usize> = 36..40;
    pub const TRAFFIC_CLASS: usize = 40;
    pub const HOP_LIMIT: usize = 41;
    pub const SL_SUBNET_LOCAL: usize = 42;
    pub const LOCAL_ACK_TIMEOUT: usize = 43;
}

view!("REQ", CM_MESSAGE_LEN);

/// The IBA transport service types a REQ names (Transport Service Type, 2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportType {
    /// Reliable connection (0).
    Rc = 0,
    /// Unreliable connection (1).
    Uc = 1,
    /// Reliable datagram (2).
    Rd = 2,
    /// XRC, with Extended Transport Type 1 (3).
    Xrc = 3,
}

impl TransportType {
    fn from_bits(value: u8) -> Self {
        match value & 3 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            _ => Self::Xrc,
        }
    }
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn byte(&self, at: usize) -> u8 {
        self.buffer.as_ref()[at]
    }
    /// Local Communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::SERVICE_ID])
    }
    /// Local CA GUID (the sender's node GUID).
    pub fn local_ca_guid(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::LOCAL_CA_GUID])
    }
    /// Local Q_Key (0 for RC).
    pub fn local_qkey(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::LOCAL_QKEY])
    }
    /// Local QPN (24 bits).
    pub fn local_qpn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::LOCAL_QPN])
    }
    /// Responder Resources.
    pub fn responder_resources(&self) -> u8 {
        self.byte(field::RESPONDER_RESOURCES)
    }
    /// Local EECN (24 bits).
    pub fn local_eecn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::LOCAL_EECN])
    }
    /// Initiator Depth.
    pub fn initiator_depth(&self) -> u8 {
        self.byte(field::INITIATOR_DEPTH)
    }
    /// Remote EECN (24 bits).
    pub fn remote_eecn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::REMOTE_EECN])
    }
    /// Remote CM Response Timeout (5 bits, 4.096 µs × 2^n).
    pub fn remote_cm_response_timeout(&self) -> u8 {
        bits(self.byte(field::BYTE_43), 7, 3)
    }
    /// Transport Service Type (2 bits).
    pub fn transport_service_type(&self) -> u8 {
        bits(self.byte(field::BYTE_43), 2, 1)
    }
    /// End-to-End Flow Control.
    pub fn end_to_end_flow_control(&self) -> bool {
        bits(self.byte(field::BYTE_43), 0, 0) != 0
    }
    /// Starting PSN (24 bits).
    pub fn starting_psn(&self) -> u32 {
        be::u24(&self.buffer.as_ref()[field::STARTING_PSN])
    }
    /// Local CM Response Timeout (5 bits).
    pub fn local_cm_response_timeout(&self) -> u8 {
        bits(self.byte(field::BYTE_47), 7, 3)
    }
    /// Retry Count (3 bits).
    pub fn retry_count(&self) -> u8 {
        bits(self.byte(field::BYTE_47), 2, 0)
    }
    /// Partition Key.
    pub fn partition_key(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::PARTITION_KEY])
    }
    /// Path Packet Payload MTU (IB enum, 4 bits).
    pub fn path_mtu(&self) -> u8 {
        bits(self.byte(field::BYTE_50), 7, 4)
    }
    /// RDC Exists.
    pub fn rdc_exists(&self) -> bool {
        bits(self.byte(field::BYTE_50), 3, 3) != 0
    }
    /// RNR Retry Count (3 bits).
    pub fn rnr_retry_count(&self) -> u8 {
        bits(self.byte(field::BYTE_50), 2, 0)
    }
    /// Max CM Retries (4 bits).
    pub fn max_cm_retries(&self) -> u8 {
        bits(self.byte(field::BYTE_51), 7, 4)
    }
    /// SRQ.
    pub fn srq(&self) -> bool {
        bits(self.byte(field::BYTE_51), 3, 3) != 0
    }
    /// Extended Transport Type (3 bits).
    pub fn extended_transport_type(&self) -> u8 {
        bits(self.byte(field::BYTE_51), 2, 0)
    }
    /// The primary path's 44 bytes.
    pub fn primary_path(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIMARY_PATH]
    }
    /// The alternate path's 44 bytes.
    pub fn alternate_path(&self) -> &[u8] {
        &self.buffer.as_ref()[field::ALTERNATE_PATH]
    }
    /// The 92 bytes of private data.
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
    /// Zeroes the reserved fields.
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[field::RESERVED_4].fill(0);
        self.buffer.as_mut()[field::RESERVED_24].fill(0);
    }
    /// Sets the Service ID.
    pub fn set_service_id(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::SERVICE_ID], value);
    }
    /// Sets the Local CA GUID.
    pub fn set_local_ca_guid(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::LOCAL_CA_GUID], value);
    }
    /// Sets the Local Q_Key.
    pub fn set_local_qkey(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::LOCAL_QKEY], value);
    }
    /// Sets the Local QPN (low 24 bits).
    pub fn set_local_qpn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::LOCAL_QPN], value);
    }
    /// Sets Responder Resources.
    pub fn set_responder_resources(&mut self, value: u8) {
        *self.byte_mut(field::RESPONDER_RESOURCES) = value;
    }
    /// Sets the Local EECN (low 24 bits).
    pub fn set_local_eecn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::LOCAL_EECN], value);
    }
    /// Sets Initiator Depth.
    pub fn set_initiator_depth(&mut self, value: u8) {
        *self.byte_mut(field::INITIATOR_DEPTH) = value;
    }
    /// Sets the Remote EECN (low 24 bits).
    pub fn set_remote_eecn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::REMOTE_EECN], value);
    }
    /// Sets the Remote CM Response Timeout (5 bits).
    pub fn set_remote_cm_response_timeout(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_43), 7, 3, value);
    }
    /// Sets the Transport Service Type (2 bits).
    pub fn set_transport_service_type(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_43), 2, 1, value);
    }
    /// Sets End-to-End Flow Control.
    pub fn set_end_to_end_flow_control(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_43), 0, 0, u8::from(value));
    }
    /// Sets the Starting PSN (low 24 bits).
    pub fn set_starting_psn(&mut self, value: u32) {
        be::set_u24(&mut self.buffer.as_mut()[field::STARTING_PSN], value);
    }
    /// Sets the Local CM Response Timeout (5 bits).
    pub fn set_local_cm_response_timeout(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_47), 7, 3, value);
    }
    /// Sets the Retry Count (3 bits).
    pub fn set_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_47), 2, 0, value);
    }
    /// Sets the Partition Key.
    pub fn set_partition_key(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::PARTITION_KEY], value);
    }
    /// Sets the Path Packet Payload MTU (4 bits).
    pub fn set_path_mtu(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_50), 7, 4, value);
    }
    /// Sets RDC Exists.
    pub fn set_rdc_exists(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_50), 3, 3, u8::from(value));
    }
    /// Sets the RNR Retry Count (3 bits).
    pub fn set_rnr_retry_count(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_50), 2, 0, value);
    }
    /// Sets Max CM Retries (4 bits).
    pub fn set_max_cm_retries(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_51), 7, 4, value);
    }
    /// Sets SRQ.
    pub fn set_srq(&mut self, value: bool) {
        set_bits(self.byte_mut(field::BYTE_51), 3, 3, u8::from(value));
    }
    /// Sets the Extended Transport Type (3 bits).
    pub fn set_extended_transport_type(&mut self, value: u8) {
        set_bits(self.byte_mut(field::BYTE_51), 2, 0, value);
    }
    /// The primary path's 44 bytes, writable.
    pub fn primary_path_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIMARY_PATH]
    }
    /// The alternate path's 44 bytes, writable.
    pub fn alternate_path_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::ALTERNATE_PATH]
    }
    /// The private data, writable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PRIVATE_DATA]
    }
}

/// One path of a REQ (primary or alternate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local port LID (RoCE: 0xFFFF, permissive, when the hop limit is above 1).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IB rate enum; 0 = the port's rate).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, 4.096 µs × 2^n).
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Reads a path from its 44 bytes (the caller's view guarantees the length).
    fn parse(bytes: &[u8]) -> Self {
        let word = be::u32(&bytes[path_field::FLOW_LABEL_RATE]);
        let sl_byte = bytes[path_field::SL_SUBNET_LOCAL];
        Self {
            local_lid: be::u16(&bytes[path_field::LOCAL_LID]),
            remote_lid: be::u16(&bytes[path_field::REMOTE_LID]),
            local_gid: bytes[path_field::LOCAL_GID].try_into().unwrap_or_default(),
            remote_gid: bytes[path_field::REMOTE_GID].try_into().unwrap_or_default(),
            flow_label: word >> 12,
            packet_rate: (word & 0x3F) as u8,
            traffic_class: bytes[path_field::TRAFFIC_CLASS],
            hop_limit: bytes[path_field::HOP_LIMIT],
            sl: bits(sl_byte, 7, 4),
            subnet_local: bits(sl_byte, 3, 3) != 0,
            local_ack_timeout: bits(bytes[path_field::LOCAL_ACK_TIMEOUT], 7, 3),
        }
    }

    /// Writes every byte of a path (reserved bits zero).
    fn emit(&self, bytes: &mut [u8]) {
        be::set_u16(&mut bytes[path_field::LOCAL_LID], self.local_lid);
        be::set_u16(&mut bytes[path_field::REMOTE_LID], self.remote_lid);
        bytes[path_field::LOCAL_GID].copy_from_slice(&self.local_gid);
        bytes[path_field::REMOTE_GID].copy_from_slice(&self.remote_gid);
        let word = ((self.flow_label & 0xF_FFFF) << 12) | u32::from(self.packet_rate & 0x3F);
        be::set_u32(&mut bytes[path_field::FLOW_LABEL_RATE], word);
        bytes[path_field::TRAFFIC_CLASS] = self.traffic_class;
        bytes[path_field::HOP_LIMIT] = self.hop_limit;
        let mut sl_byte = 0;
        set_bits(&mut sl_byte, 7, 4, self.sl);
        set_bits(&mut sl_byte, 3, 3, u8::from(self.subnet_local));
        bytes[path_field::SL_SUBNET_LOCAL] = sl_byte;
        let mut timeout = 0;
        set_bits(&mut timeout, 7, 3, self.local_ack_timeout);
        bytes[path_field::LOCAL_ACK_TIMEOUT] = timeout;
    }

    /// Whether every field is zero (rdma_cm sends no alternate path).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The semantic content of a REQ (reserved bits are dropped on parse and zero on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder Resources: RDMA READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator Depth: RDMA READs/atomics the sender keeps outstanding.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport Service Type.
    pub transport: TransportType,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN: the first PSN the sender expects to receive (24 bits).
    pub starting_psn: u32,
    /// Local CM Response Timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry Count (3 bits).
    pub retry_count: u8,
    /// Partition Key.
    pub partition_key: u16,
    /// Path Packet Payload MTU (IB enum, 4 bits).
    pub path_mtu: u8,
    /// RDC Exists.
    pub rdc_exists: bool,
    /// RNR Retry Count the receiver's QP uses (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM Retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ: the sender's QP receives from a shared receive queue.
    pub srq: bool,
    /// Extended Transport Type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: CmPath,
    /// Alternate path (all zero: none).
    pub alternate_path: CmPath,
    /// The 92 bytes of private data.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Reads a REQ.
    ///
    /// # Errors
    /// [`MadError::Truncated`] on fewer than 232 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
        packet.check_len()?;
        let mut private_data = [0u8; PRIVATE_DATA_LEN];
        private_data.copy_from_slice(packet.private_data());
        Ok(Self {
            local_comm_id: packet.local_comm_id(),
            service_id: packet.service_id(),
            local_ca_guid: packet.local_ca_guid(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            responder_resources: packet.responder_resources(),
            local_eecn: packet.local_eecn(),
            initiator_depth: packet.initiator_depth(),
            remote_eecn: packet.remote_eecn(),
            remote_cm_response_timeout: packet.remote_cm_response_timeout(),
            transport: TransportType::from_bits(packet.transport_service_type()),
            end_to_end_flow_control: packet.end_to_end_flow_control(),
            starting_psn: packet.starting_psn(),
            local_cm_response_timeout: packet.local_cm_response_timeout(),
            retry_count: packet.retry_count(),
            partition_key: packet.partition_key(),
            path_mtu: packet.path_mtu(),
            rdc_exists: packet.rdc_exists(),
            rnr_retry_count: packet.rnr_retry_count(),
            max_cm_retries: packet.max_cm_retries(),
            srq: packet.srq(),
            extended_transport_type: packet.extended_transport_type(),
            primary_path: CmPath::parse(packet.primary_path()),
            alternate_path: CmPath::parse(packet.alternate_path()),
            private_data,
        })
    }

    /// Writes every byte of the 232-byte message.
    ///
    /// # Panics
    /// If the buffer is shorter than 232 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.clear_reserved();
        packet.set_service_id(self.service_id);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_responder_resources(self.responder_resources);
        packet.set_local_eecn(self.local_eecn);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_remote_eecn(self.remote_eecn);
        *packet.byte_mut(field::BYTE_43) = 0;
        packet.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        packet.set_transport_service_type(self.transport as u8);
        packet.set_end_to_end_flow_control(self.end_to_end_flow_control);
        packet.set_starting_psn(self.starting_psn);
        *packet.byte_mut(field::BYTE_47) = 0;
        packet.set_local_cm_response_timeout(self.local_cm_response_timeout);
        packet.set_retry_count(self.retry_count);
        packet.set_partition_key(self.partition_key);
        *packet.byte_mut(field::BYTE_50) = 0;
        packet.set_path_mtu(self.path_mtu);
        packet.set_rdc_exists(self.rdc_exists);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        *packet.byte_mut(field::BYTE_51) = 0;
        packet.set_max_cm_retries(self.max_cm_retries);
        packet.set_srq(self.srq);
        packet.set_extended_transport_type(self.extended_transport_type);
        self.primary_path.emit(packet.primary_path_mut());
        self.alternate_path.emit(packet.alternate_path_mut());
        packet.private_data_mut().copy_from_slice(&self.private_data);
    }
}
