//! Service ID resolution (SIDR), how a UD consumer learns the QPN and Q_Key behind a
//! Service ID: SIDR_REQ (attribute 0x0017) and SIDR_REP (0x0018).
//!
//! ```text
//! SIDR_REQ   0 Request ID (4)   4 Partition Key (2)   6 reserved (2)   8 Service ID (8)
//!           16 private data (216)
//! SIDR_REP   0 Request ID (4)   4 Status   5 Additional Information Length   6 reserved (2)
//!            8 QPN (3) · reserved   12 Service ID (8)   20 Q_Key (4)
//!           24 Additional Information (72)   96 private data (136)
//! ```

pub use reply::{Packet as SidrRepPacket, SidrRepRepr, SidrStatus};
pub use request::{Packet as SidrReqPacket, SidrReqRepr};

/// SIDR_REQ.
pub mod request {
    use crate::cm::mad::{be, view, MadError, CM_MESSAGE_LEN};

    /// Bytes of private data in a SIDR_REQ.
    pub const PRIVATE_DATA_LEN: usize = 216;

    mod field {
        use core::ops::Range;
        pub const REQUEST_ID: Range<usize> = 0..4;
        pub const PARTITION_KEY: Range<usize> = 4..6;
        pub const RESERVED: Range<usize> = 6..8;
        pub const SERVICE_ID: Range<usize> = 8..16;
        pub const PRIVATE_DATA: Range<usize> = 16..232;
    }

    view!("SIDR_REQ", CM_MESSAGE_LEN);

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Request ID.
        pub fn request_id(&self) -> u32 {
            be::u32(&self.buffer.as_ref()[field::REQUEST_ID])
        }
        /// Partition Key.
        pub fn partition_key(&self) -> u16 {
            be::u16(&self.buffer.as_ref()[field::PARTITION_KEY])
        }
        /// Service ID.
        pub fn service_id(&self) -> u64 {
            be::u64(&self.buffer.as_ref()[field::SERVICE_ID])
        }
        /// The 216 bytes of private data.
        pub fn private_data(&self) -> &[u8] {
            &self.buffer.as_ref()[field::PRIVATE_DATA]
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the Request ID.
        pub fn set_request_id(&mut self, value: u32) {
            be::set_u32(&mut self.buffer.as_mut()[field::REQUEST_ID], value);
        }
        /// Sets the Partition Key and zeroes the reserved bytes after it.
        pub fn set_partition_key(&mut self, value: u16) {
            be::set_u16(&mut self.buffer.as_mut()[field::PARTITION_KEY], value);
            self.buffer.as_mut()[field::RESERVED].fill(0);
        }
        /// Sets the Service ID.
        pub fn set_service_id(&mut self, value: u64) {
            be::set_u64(&mut self.buffer.as_mut()[field::SERVICE_ID], value);
        }
        /// The private data, writable.
        pub fn private_data_mut(&mut self) -> &mut [u8] {
            &mut self.buffer.as_mut()[field::PRIVATE_DATA]
        }
    }

    /// The semantic content of a SIDR_REQ.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SidrReqRepr {
        /// Request ID (the requester's, echoed in the SIDR_REP).
        pub request_id: u32,
        /// Partition Key.
        pub partition_key: u16,
        /// Service ID.
        pub service_id: u64,
        /// The 216 bytes of private data (RDMA-CM: its IP header first).
        pub private_data: [u8; PRIVATE_DATA_LEN],
    }

    impl SidrReqRepr {
        /// Reads a SIDR_REQ.
        ///
        /// # Errors
        /// [`MadError::Truncated`] on fewer than 232 bytes.
        pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
            packet.check_len()?;
            let mut private_data = [0u8; PRIVATE_DATA_LEN];
            private_data.copy_from_slice(packet.private_data());
            Ok(Self {
                request_id: packet.request_id(),
                partition_key: packet.partition_key(),
                service_id: packet.service_id(),
                private_data,
            })
        }

        /// Writes every byte of the 232-byte message.
        ///
        /// # Panics
        /// If the buffer is shorter than 232 bytes.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
            packet.set_request_id(self.request_id);
            packet.set_partition_key(self.partition_key);
            packet.set_service_id(self.service_id);
            packet.private_data_mut().copy_from_slice(&self.private_data);
        }
    }
}

/// SIDR_REP.
pub mod reply {
    use crate::cm::mad::{be, view, MadError, CM_MESSAGE_LEN};

    /// Bytes of Additional Information.
    pub const INFO_LEN: usize = 72;
    /// Bytes of private data in a SIDR_REP.
    pub const PRIVATE_DATA_LEN: usize = 136;

    mod field {
        use core::ops::Range;
        pub const REQUEST_ID: Range<usize> = 0..4;
        pub const STATUS: usize = 4;
        pub const INFO_LENGTH: usize = 5;
        pub const RESERVED_6: Range<usize> = 6..8;
        pub const QPN: Range<usize> = 8..11;
        pub const RESERVED_11: usize = 11;
        pub const SERVICE_ID: Range<usize> = 12..20;
        pub const QKEY: Range<usize> = 20..24;
        pub const INFO: Range<usize> = 24..96;
        pub const PRIVATE_DATA: Range<usize> = 96..232;
    }

    view!("SIDR_REP", CM_MESSAGE_LEN);

    /// SIDR_REP Status.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum SidrStatus {
        /// 0: the QPN and Q_Key are valid.
        Success,
        /// 1: no listener for the Service ID.
        Unsupported,
        /// 2: the consumer rejected the request.
        Reject,
        /// 3: no QP.
        NoQp,
        /// 4: redirect.
        Redirect,
        /// 5: unsupported class version.
        UnsupportedVersion,
        /// Another code.
        Other(u8),
    }

    impl SidrStatus {
        /// The status byte.
        pub fn code(self) -> u8 {
            match self {
                Self::Success => 0,
                Self::Unsupported => 1,
                Self::Reject => 2,
                Self::NoQp => 3,
                Self::Redirect => 4,
                Self::UnsupportedVersion => 5,
                Self::Other(code) => code,
            }
        }

        /// The status of a byte.
        pub fn from_code(code: u8) -> Self {
            match code {
                0 => Self::Success,
                1 => Self::Unsupported,
                2 => Self::Reject,
                3 => Self::NoQp,
                4 => Self::Redirect,
                5 => Self::UnsupportedVersion,
                other => Self::Other(other),
            }
        }
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Request ID.
        pub fn request_id(&self) -> u32 {
            be::u32(&self.buffer.as_ref()[field::REQUEST_ID])
        }
        /// Status.
        pub fn status(&self) -> u8 {
            self.buffer.as_ref()[field::STATUS]
        }
        /// Additional Information Length.
        pub fn info_length(&self) -> u8 {
            self.buffer.as_ref()[field::INFO_LENGTH]
        }
        /// QPN (24 bits).
        pub fn qpn(&self) -> u32 {
            be::u24(&self.buffer.as_ref()[field::QPN])
        }
        /// Service ID.
        pub fn service_id(&self) -> u64 {
            be::u64(&self.buffer.as_ref()[field::SERVICE_ID])
        }
        /// Q_Key.
        pub fn qkey(&self) -> u32 {
            be::u32(&self.buffer.as_ref()[field::QKEY])
        }
        /// The 72 bytes of Additional Information.
        pub fn info(&self) -> &[u8] {
            &self.buffer.as_ref()[field::INFO]
        }
        /// The 136 bytes of private data.
        pub fn private_data(&self) -> &[u8] {
            &self.buffer.as_ref()[field::PRIVATE_DATA]
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the Request ID.
        pub fn set_request_id(&mut self, value: u32) {
            be::set_u32(&mut self.buffer.as_mut()[field::REQUEST_ID], value);
        }
        /// Sets the Status.
        pub fn set_status(&mut self, value: u8) {
            self.buffer.as_mut()[field::STATUS] = value;
        }
        /// Sets the Additional Information Length and zeroes the reserved bytes after it.
        pub fn set_info_length(&mut self, value: u8) {
            self.buffer.as_mut()[field::INFO_LENGTH] = value;
            self.buffer.as_mut()[field::RESERVED_6].fill(0);
        }
        /// Sets the QPN (low 24 bits) and zeroes the reserved byte after it.
        pub fn set_qpn(&mut self, value: u32) {
            be::set_u24(&mut self.buffer.as_mut()[field::QPN], value);
            self.buffer.as_mut()[field::RESERVED_11] = 0;
        }
        /// Sets the Service ID.
        pub fn set_service_id(&mut self, value: u64) {
            be::set_u64(&mut self.buffer.as_mut()[field::SERVICE_ID], value);
        }
        /// Sets the Q_Key.
        pub fn set_qkey(&mut self, value: u32) {
            be::set_u32(&mut self.buffer.as_mut()[field::QKEY], value);
        }
        /// The Additional Information, writable.
        pub fn info_mut(&mut self) -> &mut [u8] {
            &mut self.buffer.as_mut()[field::INFO]
        }
        /// The private data, writable.
        pub fn private_data_mut(&mut self) -> &mut [u8] {
            &mut self.buffer.as_mut()[field::PRIVATE_DATA]
        }
    }

    /// The semantic content of a SIDR_REP.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SidrRepRepr {
        /// Request ID (the SIDR_REQ's).
        pub request_id: u32,
        /// Status.
        pub status: SidrStatus,
        /// Additional Information Length (at most 72).
        pub info_length: u8,
        /// QPN of the UD QP behind the Service ID (24 bits).
        pub qpn: u32,
        /// Service ID.
        pub service_id: u64,
        /// Q_Key of that QP.
        pub qkey: u32,
        /// Additional Information.
        pub info: [u8; INFO_LEN],
        /// The 136 bytes of private data.
        pub private_data: [u8; PRIVATE_DATA_LEN],
    }

    impl SidrRepRepr {
        /// Reads a SIDR_REP.
        ///
        /// # Errors
        /// [`MadError::Truncated`] on fewer than 232 bytes; [`MadError::Malformed`] when
        /// the Additional Information Length exceeds 72.
        pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
            packet.check_len()?;
            let info_length = packet.info_length();
            if usize::from(info_length) > INFO_LEN {
                return Err(MadError::Malformed {
                    layer: "SIDR_REP",
                    field: "Additional Information Length",
                    value: u64::from(info_length),
                });
            }
            let mut info = [0u8; INFO_LEN];
            info.copy_from_slice(packet.info());
            let mut private_data = [0u8; PRIVATE_DATA_LEN];
            private_data.copy_from_slice(packet.private_data());
            Ok(Self {
                request_id: packet.request_id(),
                status: SidrStatus::from_code(packet.status()),
                info_length,
                qpn: packet.qpn(),
                service_id: packet.service_id(),
                qkey: packet.qkey(),
                info,
                private_data,
            })
        }

        /// Writes every byte of the 232-byte message.
        ///
        /// # Panics
        /// If the buffer is shorter than 232 bytes.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
            packet.set_request_id(self.request_id);
            packet.set_status(self.status.code());
            packet.set_info_length(self.info_length);
            packet.set_qpn(self.qpn);
            packet.set_service_id(self.service_id);
            packet.set_qkey(self.qkey);
            packet.info_mut().copy_from_slice(&self.info);
            packet.private_data_mut().copy_from_slice(&self.private_data);
        }
    }
}
