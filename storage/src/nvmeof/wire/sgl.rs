//! SGL descriptors, 16 bytes (storage-and-cm.md B.4). Byte 15 is the identifier:
//! descriptor type in bits 7:4, subtype in bits 3:0.
//!
//! | Identifier | Descriptor | Layout |
//! |---|---|---|
//! | 0x40 | Keyed Data Block, address | 0–7 VA, 8–10 length (24 bits), 11–14 R_Key |
//! | 0x4F | Keyed Data Block, invalidate key | same; the target answers with SEND WITH INVALIDATE |
//! | 0x01 | Data Block, offset | 0–7 offset into the in-capsule data, 8–11 length |
//! | 0x00 | Data Block, address | 0–7 address, 8–11 length (PCIe; not usable on fabrics) |
//! | 0x21 / 0x31 | Segment / Last Segment, offset | 0–7 offset of a descriptor list in the capsule, 8–11 its length |
//! | 0x10 | Bit Bucket | 8–11 length |

use super::{check_len, fixed_view, le, WireError};

/// Bytes of a descriptor.
pub const SGL_DESCRIPTOR_LEN: usize = 16;

/// Descriptor types (identifier bits 7:4).
pub mod descriptor_type {
    /// Data Block.
    pub const DATA_BLOCK: u8 = 0x0;
    /// Bit Bucket.
    pub const BIT_BUCKET: u8 = 0x1;
    /// Segment.
    pub const SEGMENT: u8 = 0x2;
    /// Last Segment.
    pub const LAST_SEGMENT: u8 = 0x3;
    /// Keyed Data Block.
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
}

/// Descriptor subtypes (identifier bits 3:0).
pub mod subtype {
    /// The address field is an address.
    pub const ADDRESS: u8 = 0x0;
    /// The address field is an offset into the capsule.
    pub const OFFSET: u8 = 0x1;
    /// Keyed only: the target should invalidate the key (RDMA SEND WITH INVALIDATE).
    pub const INVALIDATE_KEY: u8 = 0xF;
}

/// Largest length a keyed descriptor carries (24 bits).
pub const MAX_KEYED_LENGTH: u32 = 0xFF_FFFF;

mod field {
    use core::ops::Range;
    pub const ADDRESS: Range<usize> = 0..8;
    pub const LENGTH: Range<usize> = 8..12;
    pub const KEYED_LENGTH: Range<usize> = 8..11;
    pub const KEY: Range<usize> = 11..15;
    pub const IDENTIFIER: usize = 15;
}

fixed_view!(
    /// A view of one SGL descriptor.
    SglDescriptor,
    "SGL descriptor",
    16
);

impl<T: AsRef<[u8]>> SglDescriptor<T> {
    /// The identifier byte.
    pub fn identifier(&self) -> u8 {
        self.buffer.as_ref()[field::IDENTIFIER]
    }
    /// Descriptor type (identifier bits 7:4).
    pub fn descriptor_type(&self) -> u8 {
        self.identifier() >> 4
    }
    /// Subtype (identifier bits 3:0).
    pub fn subtype(&self) -> u8 {
        self.identifier() & 0xF
    }
    /// Address or offset (bytes 0–7).
    pub fn address(&self) -> u64 {
        le::u64(&self.buffer.as_ref()[field::ADDRESS])
    }
    /// Length of an unkeyed descriptor (bytes 8–11).
    pub fn length(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::LENGTH])
    }
    /// Length of a keyed descriptor (bytes 8–10).
    pub fn keyed_length(&self) -> u32 {
        le::u24(&self.buffer.as_ref()[field::KEYED_LENGTH])
    }
    /// Key of a keyed descriptor (bytes 11–14).
    pub fn key(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::KEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SglDescriptor<T> {
    /// Sets the identifier byte.
    pub fn set_identifier(&mut self, value: u8) {
        self.buffer.as_mut()[field::IDENTIFIER] = value;
    }
    /// Sets the address or offset.
    pub fn set_address(&mut self, value: u64) {
        le::set_u64(&mut self.buffer.as_mut()[field::ADDRESS], value);
    }
    /// Sets an unkeyed length.
    pub fn set_length(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::LENGTH], value);
    }
    /// Sets a keyed length (low 24 bits kept).
    pub fn set_keyed_length(&mut self, value: u32) {
        le::set_u24(&mut self.buffer.as_mut()[field::KEYED_LENGTH], value);
    }
    /// Sets a key.
    pub fn set_key(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::KEY], value);
    }
}

/// The content of an SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SglRepr {
    /// 0x40 / 0x4F: host memory the target reads (RDMA READ) or writes (RDMA WRITE).
    /// Address 0, length 0 and key 0 means "no data".
    Keyed {
        /// Remote virtual address.
        address: u64,
        /// Bytes (at most [`MAX_KEYED_LENGTH`]).
        length: u32,
        /// R_Key.
        key: u32,
        /// 0x4F: the host asks the target to invalidate the key with its response.
        invalidate: bool,
    },
    /// 0x01: data carried in the capsule after the SQE, at `offset` from its end.
    InCapsule {
        /// Offset from the end of the SQE.
        offset: u64,
        /// Bytes.
        length: u32,
    },
    /// 0x00: a Data Block by address (PCIe host memory; meaningless on fabrics).
    DataBlockAddress {
        /// Address.
        address: u64,
        /// Bytes.
        length: u32,
    },
    /// 0x21 / 0x31: a list of descriptors in the capsule, at `offset` from the end of the
    /// SQE (`last`: a Last Segment, type 3, else a Segment, type 2).
    SegmentOffset {
        /// Offset of the list.
        offset: u64,
        /// Bytes of the list (16 per descriptor).
        length: u32,
        /// Last Segment rather than Segment.
        last: bool,
    },
    /// 0x10: a Bit Bucket of `length` bytes (data to discard).
    BitBucket {
        /// Bytes.
        length: u32,
    },
}

impl SglRepr {
    /// The "no data" descriptor Linux sends for commands without data: keyed, all zero.
    pub const NO_DATA: SglRepr = SglRepr::Keyed {
        address: 0,
        length: 0,
        key: 0,
        invalidate: false,
    };

    /// Reads a descriptor.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 16 bytes; [`WireError::Malformed`] (field
    /// "SGL identifier") for a type/subtype combination that is not one of the variants.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &SglDescriptor<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        let identifier = view.identifier();
        let malformed = Err(WireError::Malformed {
            format: "SGL descriptor",
            field: "SGL identifier",
            value: u64::from(identifier),
        });
        match (view.descriptor_type(), view.subtype()) {
            (descriptor_type::KEYED_DATA_BLOCK, s @ (subtype::ADDRESS | subtype::INVALIDATE_KEY)) => {
                Ok(SglRepr::Keyed {
                    address: view.address(),
                    length: view.keyed_length(),
                    key: view.key(),
                    invalidate: s == subtype::INVALIDATE_KEY,
                })
            }
            (descriptor_type::DATA_BLOCK, subtype::OFFSET) => Ok(SglRepr::InCapsule {
                offset: view.address(),
                length: view.length(),
            }),
            (descriptor_type::DATA_BLOCK, subtype::ADDRESS) => Ok(SglRepr::DataBlockAddress {
                address: view.address(),
                length: view.length(),
            }),
            (t @ (descriptor_type::SEGMENT | descriptor_type::LAST_SEGMENT), subtype::OFFSET) => {
                Ok(SglRepr::SegmentOffset {
                    offset: view.address(),
                    length: view.length(),
                    last: t == descriptor_type::LAST_SEGMENT,
                })
            }
            (descriptor_type::BIT_BUCKET, subtype::ADDRESS) => Ok(SglRepr::BitBucket { length: view.length() }),
            _ => malformed,
        }
    }

    /// The identifier byte of this descriptor.
    pub fn identifier(&self) -> u8 {
        match *self {
            SglRepr::Keyed { invalidate, .. } => {
                descriptor_type::KEYED_DATA_BLOCK << 4
                    | if invalidate {
                        subtype::INVALIDATE_KEY
                    } else {
                        subtype::ADDRESS
                    }
            }
            SglRepr::InCapsule { .. } => descriptor_type::DATA_BLOCK << 4 | subtype::OFFSET,
            SglRepr::DataBlockAddress { .. } => descriptor_type::DATA_BLOCK << 4 | subtype::ADDRESS,
            SglRepr::SegmentOffset { last, .. } => {
                (if last {
                    descriptor_type::LAST_SEGMENT
                } else {
                    descriptor_type::SEGMENT
                }) << 4
                    | subtype::OFFSET
            }
            SglRepr::BitBucket { .. } => descriptor_type::BIT_BUCKET << 4 | subtype::ADDRESS,
        }
    }

    /// The bytes the descriptor describes.
    pub fn length(&self) -> u32 {
        match *self {
            SglRepr::Keyed { length, .. }
            | SglRepr::InCapsule { length, .. }
            | SglRepr::DataBlockAddress { length, .. }
            | SglRepr::SegmentOffset { length, .. }
            | SglRepr::BitBucket { length } => length,
        }
    }

    /// Writes the descriptor; unused bytes are zeroed. A keyed length keeps its low 24 bits.
    ///
    /// # Panics
    /// If the buffer is shorter than 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut SglDescriptor<&mut T>) {
        view.buffer.as_mut()[..SGL_DESCRIPTOR_LEN].fill(0);
        match *self {
            SglRepr::Keyed {
                address, length, key, ..
            } => {
                view.set_address(address);
                view.set_keyed_length(length);
                view.set_key(key);
            }
            SglRepr::InCapsule { offset, length } | SglRepr::SegmentOffset { offset, length, .. } => {
                view.set_address(offset);
                view.set_length(length);
            }
            SglRepr::DataBlockAddress { address, length } => {
                view.set_address(address);
                view.set_length(length);
            }
            SglRepr::BitBucket { length } => view.set_length(length),
        }
        view.set_identifier(self.identifier());
    }

    /// The 16 bytes.
    pub fn to_bytes(&self) -> [u8; SGL_DESCRIPTOR_LEN] {
        let mut bytes = [0u8; SGL_DESCRIPTOR_LEN];
        self.emit(&mut SglDescriptor::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Parses one SGL descriptor from bytes (the fuzzing entry point).
///
/// # Errors
/// As [`SglRepr::parse`].
pub fn parse_sgl(bytes: &[u8]) -> Result<SglRepr, WireError> {
    check_len("SGL descriptor", SGL_DESCRIPTOR_LEN, bytes.len())?;
    SglRepr::parse(&SglDescriptor::new_unchecked(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvmeof::wire::XorShift;

    /// The reference builder's Identify SGL (B.4, Appendix): keyed with invalidate,
    /// VA 0x7f0000002000, 4096 bytes, R_Key 0x5678.
    const KEYED_INVALIDATE: [u8; 16] = [
        0x00, 0x20, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0x78, 0x56, 0x00, 0x00, 0x4F,
    ];
    /// The builder's in-capsule SGL of a 512-byte write: offset 0, length 512.
    const IN_CAPSULE_512: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0, 0, 0, 0, 0, 0x01];

    #[test]
    fn parses_known_bytes() {
        assert_eq!(
            parse_sgl(&KEYED_INVALIDATE).unwrap(),
            SglRepr::Keyed {
                address: 0x7f00_0000_2000,
                length: 4096,
                key: 0x5678,
                invalidate: true
            }
        );
        assert_eq!(
            parse_sgl(&IN_CAPSULE_512).unwrap(),
            SglRepr::InCapsule { offset: 0, length: 512 }
        );
        assert_eq!(parse_sgl(&[0u8; 16]).unwrap().length(), 0);
        let mut last_segment = [0u8; 16];
        last_segment[8] = 32;
        last_segment[15] = 0x31;
        assert_eq!(
            parse_sgl(&last_segment).unwrap(),
            SglRepr::SegmentOffset {
                offset: 0,
                length: 32,
                last: true
            }
        );
        let mut keyed = [0u8; 16];
        keyed[15] = 0x40;
        assert_eq!(parse_sgl(&keyed).unwrap(), SglRepr::NO_DATA);
    }

    #[test]
    fn emits_known_bytes() {
        let keyed = SglRepr::Keyed {
            address: 0x7f00_0000_2000,
            length: 4096,
            key: 0x5678,
            invalidate: true,
        };
        assert_eq!(keyed.to_bytes(), KEYED_INVALIDATE);
        assert_eq!(SglRepr::InCapsule { offset: 0, length: 512 }.to_bytes(), IN_CAPSULE_512);
        assert_eq!(SglRepr::NO_DATA.to_bytes()[15], 0x40);
    }

    #[test]
    fn refuses_unknown_identifiers() {
        for identifier in 0..=u8::MAX {
            let mut bytes = [0u8; 16];
            bytes[15] = identifier;
            let known = matches!(identifier, 0x00 | 0x01 | 0x10 | 0x21 | 0x31 | 0x40 | 0x4F);
            match parse_sgl(&bytes) {
                Ok(repr) => {
                    assert!(known, "{identifier:#x} parsed");
                    assert_eq!(repr.identifier(), identifier);
                }
                Err(error) => {
                    assert!(!known, "{identifier:#x} refused");
                    assert_eq!(
                        error,
                        WireError::Malformed {
                            format: "SGL descriptor",
                            field: "SGL identifier",
                            value: u64::from(identifier)
                        }
                    );
                }
            }
        }
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0x5C1);
        for _ in 0..1000 {
            let address = rng.next_u64();
            let length = rng.u32();
            let repr = match rng.u8() % 6 {
                0 => SglRepr::Keyed {
                    address,
                    length: length & MAX_KEYED_LENGTH,
                    key: rng.u32(),
                    invalidate: rng.u8() & 1 == 1,
                },
                1 => SglRepr::InCapsule {
                    offset: address,
                    length,
                },
                2 => SglRepr::DataBlockAddress { address, length },
                3 => SglRepr::SegmentOffset {
                    offset: address,
                    length,
                    last: rng.u8() & 1 == 1,
                },
                4 => SglRepr::BitBucket { length },
                _ => SglRepr::NO_DATA,
            };
            assert_eq!(parse_sgl(&repr.to_bytes()).unwrap(), repr);
        }
    }

    #[test]
    fn keyed_length_keeps_24_bits() {
        let repr = SglRepr::Keyed {
            address: 0,
            length: 0x0100_0001,
            key: 0xAABB_CCDD,
            invalidate: false,
        };
        let parsed = parse_sgl(&repr.to_bytes()).unwrap();
        assert_eq!(parsed.length(), 1);
        assert!(matches!(parsed, SglRepr::Keyed { key: 0xAABB_CCDD, .. }));
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..SGL_DESCRIPTOR_LEN {
            assert!(matches!(
                parse_sgl(&KEYED_INVALIDATE[..len]),
                Err(WireError::Truncated { needed: 16, .. })
            ));
            assert!(SglRepr::parse(&SglDescriptor::new_unchecked(&KEYED_INVALIDATE[..len])).is_err());
        }
    }
}
