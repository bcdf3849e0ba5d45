//! The common MAD header (IBA 13.4.3), 24 bytes, big-endian.
//!
//! ```text
//! 0 BaseVersion  1 MgmtClass  2 ClassVersion  3 R(7) | Method(6:0)
//! 4 Status (2)   6 ClassSpecific (2)
//! 8 TransactionID (8)
//! 16 AttributeID (2)  18 reserved (2)  20 AttributeModifier (4)
//! ```

use super::{be, view, MadError, MAD_HEADER_LEN};

mod field {
    use core::ops::Range;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Range<usize> = 4..6;
    pub const CLASS_SPECIFIC: Range<usize> = 6..8;
    pub const TRANSACTION_ID: Range<usize> = 8..16;
    pub const ATTRIBUTE_ID: Range<usize> = 16..18;
    pub const RESERVED: Range<usize> = 18..20;
    pub const ATTRIBUTE_MODIFIER: Range<usize> = 20..24;
}

view!("MAD header", MAD_HEADER_LEN);

impl<T: AsRef<[u8]>> Packet<T> {
    /// `BaseVersion`.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// `MgmtClass`.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// `ClassVersion`.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// The whole method byte (R bit 7 and method 6:0).
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// `Status`.
    pub fn status(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::STATUS])
    }
    /// `ClassSpecific`.
    pub fn class_specific(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::CLASS_SPECIFIC])
    }
    /// `TransactionID`.
    pub fn transaction_id(&self) -> u64 {
        be::u64(&self.buffer.as_ref()[field::TRANSACTION_ID])
    }
    /// `AttributeID`.
    pub fn attribute_id(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::ATTRIBUTE_ID])
    }
    /// The reserved 16 bits after the attribute ID.
    pub fn reserved(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::RESERVED])
    }
    /// `AttributeModifier`.
    pub fn attribute_modifier(&self) -> u32 {
        be::u32(&self.buffer.as_ref()[field::ATTRIBUTE_MODIFIER])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets `BaseVersion`.
    pub fn set_base_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = value;
    }
    /// Sets `MgmtClass`.
    pub fn set_mgmt_class(&mut self, value: u8) {
        self.buffer.as_mut()[field::MGMT_CLASS] = value;
    }
    /// Sets `ClassVersion`.
    pub fn set_class_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = value;
    }
    /// Sets the method byte.
    pub fn set_method(&mut self, value: u8) {
        self.buffer.as_mut()[field::METHOD] = value;
    }
    /// Sets `Status`.
    pub fn set_status(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::STATUS], value);
    }
    /// Sets `ClassSpecific`.
    pub fn set_class_specific(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::CLASS_SPECIFIC], value);
    }
    /// Sets `TransactionID`.
    pub fn set_transaction_id(&mut self, value: u64) {
        be::set_u64(&mut self.buffer.as_mut()[field::TRANSACTION_ID], value);
    }
    /// Sets `AttributeID`.
    pub fn set_attribute_id(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::ATTRIBUTE_ID], value);
    }
    /// Sets the reserved 16 bits.
    pub fn set_reserved(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::RESERVED], value);
    }
    /// Sets `AttributeModifier`.
    pub fn set_attribute_modifier(&mut self, value: u32) {
        be::set_u32(&mut self.buffer.as_mut()[field::ATTRIBUTE_MODIFIER], value);
    }
}

/// The semantic content of a MAD header (the reserved field is dropped on parse and zero
/// on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeaderRepr {
    /// `BaseVersion` (1).
    pub base_version: u8,
    /// `MgmtClass` (0x07 for the CM).
    pub mgmt_class: u8,
    /// `ClassVersion` (2 for the CM).
    pub class_version: u8,
    /// Method byte, R bit included (0x03 SEND for the CM).
    pub method: u8,
    /// `Status`.
    pub status: u16,
    /// `ClassSpecific`.
    pub class_specific: u16,
    /// `TransactionID`.
    pub transaction_id: u64,
    /// `AttributeID`.
    pub attribute_id: u16,
    /// `AttributeModifier`.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// The header of a CM message: base version 1, class 0x07, class version 2, method
    /// SEND, status 0.
    pub const fn cm(attribute_id: u16, transaction_id: u64) -> Self {
        Self {
            base_version: super::BASE_VERSION,
            mgmt_class: super::CM_CLASS,
            class_version: super::CM_CLASS_VERSION,
            method: super::METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Reads a header. Any values are accepted: whether it is a CM MAD is
    /// [`CmMad::parse`](super::CmMad::parse)'s decision.
    ///
    /// # Errors
    /// [`MadError::Truncated`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
        packet.check_len()?;
        Ok(Self {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Writes every byte of the header.
    ///
    /// # Panics
    /// If the buffer is shorter than 24 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_base_version(self.base_version);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_reserved(0);
        packet.set_attribute_modifier(self.attribute_modifier);
    }
}
