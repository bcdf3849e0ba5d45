//! Memory descriptors of an SRP_CMD (storage-and-cm.md C.4): where the initiator's data
//! buffers are, or how much immediate data follows in the IU.

use super::{be, check_len, WireError};

/// Bytes of a direct descriptor.
pub const DIRECT_LEN: usize = 16;
/// Bytes of an indirect descriptor's fixed part (table descriptor + total length).
pub const INDIRECT_HEADER_LEN: usize = 20;
/// Bytes of an immediate-data descriptor (the length).
pub const IMMEDIATE_LEN: usize = 4;

/// A descriptor format: one nibble of SRP_CMD byte 5 (high: data-out, low: data-in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DescriptorFormat {
    /// No data in this direction.
    #[default]
    None,
    /// One direct descriptor.
    Direct,
    /// An indirect descriptor table.
    Indirect,
    /// Immediate data in the IU (SRP-2; data-out only).
    Immediate,
}

impl DescriptorFormat {
    /// The nibble.
    pub fn code(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Direct => 1,
            Self::Indirect => 2,
            Self::Immediate => 3,
        }
    }

    /// From a nibble.
    ///
    /// # Errors
    /// [`WireError::Malformed`] for 4..=15.
    pub fn from_code(code: u8) -> Result<Self, WireError> {
        Ok(match code {
            0 => Self::None,
            1 => Self::Direct,
            2 => Self::Indirect,
            3 => Self::Immediate,
            _ => {
                return Err(WireError::Malformed {
                    format: "SRP_CMD",
                    field: "buf_fmt",
                    value: u64::from(code),
                })
            }
        })
    }
}

/// A direct data buffer descriptor: a virtually contiguous region of initiator memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DirectDescriptor {
    /// Virtual address (as the initiator's memory region names it).
    pub va: u64,
    /// Remote key of the region.
    pub key: u32,
    /// Bytes.
    pub len: u32,
}

impl DirectDescriptor {
    /// Reads 16 bytes.
    ///
    /// # Errors
    /// Truncated input.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("srp_direct_buf", DIRECT_LEN, bytes.len())?;
        Ok(Self {
            va: be::u64(&bytes[0..8]),
            key: be::u32(&bytes[8..12]),
            len: be::u32(&bytes[12..16]),
        })
    }

    /// Writes 16 bytes.
    ///
    /// # Panics
    /// If `out` is shorter than 16 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        be::set_u64(&mut out[0..8], self.va);
        be::set_u32(&mut out[8..12], self.key);
        be::set_u32(&mut out[12..16], self.len);
    }
}

/// The data descriptor of one direction of an SRP_CMD.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DataDescriptor {
    /// No data.
    #[default]
    None,
    /// One region.
    Direct(DirectDescriptor),
    /// A descriptor table: `table` locates the whole table in initiator memory;
    /// `list` holds the entries carried in the IU (all of them unless the table is
    /// external: `table.len / 16 > list.len()`).
    Indirect {
        /// Address, key and length (16 × entries) of the whole table.
        table: DirectDescriptor,
        /// Sum of the entries' lengths, bytes.
        total_len: u32,
        /// The entries present in the IU.
        list: Vec<DirectDescriptor>,
    },
    /// Immediate data: `len` bytes at the negotiated offset of the IU.
    Immediate {
        /// Bytes.
        len: u32,
    },
}

impl DataDescriptor {
    /// Its format.
    pub fn format(&self) -> DescriptorFormat {
        match self {
            Self::None => DescriptorFormat::None,
            Self::Direct(_) => DescriptorFormat::Direct,
            Self::Indirect { .. } => DescriptorFormat::Indirect,
            Self::Immediate { .. } => DescriptorFormat::Immediate,
        }
    }

    /// The count the SRP_CMD carries for it (the in-IU entries of an indirect table;
    /// Linux leaves it 0 for direct and immediate descriptors).
    pub fn count(&self) -> u8 {
        match self {
            Self::Indirect { list, .. } => list.len().min(255) as u8,
            _ => 0,
        }
    }

    /// Bytes it takes in the IU.
    pub fn wire_len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::Direct(_) => DIRECT_LEN,
            Self::Indirect { list, .. } => INDIRECT_HEADER_LEN + DIRECT_LEN * list.len(),
            Self::Immediate { .. } => IMMEDIATE_LEN,
        }
    }

    /// Bytes of data it describes.
    pub fn data_len(&self) -> u64 {
        match self {
            Self::None => 0,
            Self::Direct(d) => u64::from(d.len),
            Self::Indirect { total_len, .. } => u64::from(*total_len),
            Self::Immediate { len } => u64::from(*len),
        }
    }

    /// Whether the table is only partly in the IU (the rest would have to be fetched
    /// from initiator memory).
    pub fn is_external(&self) -> bool {
        matches!(self, Self::Indirect { table, list, .. } if (table.len as usize / DIRECT_LEN) > list.len())
    }

    /// Reads a descriptor of `format` with `count` in-IU entries from the front of
    /// `bytes`; returns it and the bytes it took.
    ///
    /// # Errors
    /// Truncated input; a table length that is not a multiple of 16.
    pub fn parse(format: DescriptorFormat, count: u8, bytes: &[u8]) -> Result<(Self, usize), WireError> {
        match format {
            DescriptorFormat::None => Ok((Self::None, 0)),
            DescriptorFormat::Direct => Ok((Self::Direct(DirectDescriptor::parse(bytes)?), DIRECT_LEN)),
            DescriptorFormat::Immediate => {
                check_len("srp_imm_buf", IMMEDIATE_LEN, bytes.len())?;
                Ok((
                    Self::Immediate {
                        len: be::u32(&bytes[..4]),
                    },
                    IMMEDIATE_LEN,
                ))
            }
            DescriptorFormat::Indirect => {
                let needed = INDIRECT_HEADER_LEN + DIRECT_LEN * usize::from(count);
                check_len("srp_indirect_buf", needed, bytes.len())?;
                let table = DirectDescriptor::parse(bytes)?;
                if !(table.len as usize).is_multiple_of(DIRECT_LEN) {
                    return Err(WireError::Malformed {
                        format: "srp_indirect_buf",
                        field: "table_desc.len",
                        value: u64::from(table.len),
                    });
                }
                let total_len = be::u32(&bytes[16..20]);
                let list = bytes[INDIRECT_HEADER_LEN..needed]
                    .chunks_exact(DIRECT_LEN)
                    .map(DirectDescriptor::parse)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((Self::Indirect { table, total_len, list }, needed))
            }
        }
    }

    /// Writes it at the front of `out`; returns the bytes written.
    ///
    /// # Panics
    /// If `out` is shorter than [`Self::wire_len`].
    pub fn emit(&self, out: &mut [u8]) -> usize {
        match self {
            Self::None => {}
            Self::Direct(d) => d.emit(out),
            Self::Immediate { len } => be::set_u32(&mut out[..4], *len),
            Self::Indirect { table, total_len, list } => {
                table.emit(out);
                be::set_u32(&mut out[16..20], *total_len);
                for (i, d) in list.iter().enumerate() {
                    d.emit(&mut out[INDIRECT_HEADER_LEN + i * DIRECT_LEN..]);
                }
            }
        }
        self.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIRECT: [u8; 16] = [
        0, 0, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0x10, 0,
    ];

    #[test]
    fn parses_and_emits_a_known_direct_descriptor() {
        let d = DirectDescriptor::parse(&DIRECT).unwrap();
        assert_eq!(
            d,
            DirectDescriptor {
                va: 0x7f12_3456_7000,
                key: 0xdead_beef,
                len: 4096
            }
        );
        let mut out = [0u8; 16];
        d.emit(&mut out);
        assert_eq!(out, DIRECT);
    }

    #[test]
    fn indirect_tables_round_trip_and_tell_external_ones() {
        let list = vec![
            DirectDescriptor {
                va: 0x1000,
                key: 1,
                len: 512,
            },
            DirectDescriptor {
                va: 0x3000,
                key: 1,
                len: 1024,
            },
        ];
        let whole = DataDescriptor::Indirect {
            table: DirectDescriptor {
                va: 0x9000,
                key: 2,
                len: 32,
            },
            total_len: 1536,
            list: list.clone(),
        };
        let mut out = [0u8; 52];
        assert_eq!(whole.emit(&mut out), 52);
        assert_eq!(&out[16..20], &[0, 0, 6, 0]);
        let (back, used) = DataDescriptor::parse(DescriptorFormat::Indirect, 2, &out).unwrap();
        assert_eq!((back.clone(), used), (whole, 52));
        assert!(!back.is_external());
        assert_eq!(back.count(), 2);
        let external = DataDescriptor::Indirect {
            table: DirectDescriptor {
                va: 0x9000,
                key: 2,
                len: 48,
            },
            total_len: 1536,
            list,
        };
        assert!(external.is_external());
    }

    #[test]
    fn refuses_truncated_and_malformed_descriptors() {
        assert!(DirectDescriptor::parse(&DIRECT[..15]).is_err());
        assert!(DataDescriptor::parse(DescriptorFormat::Immediate, 0, &[0; 3]).is_err());
        assert!(DataDescriptor::parse(DescriptorFormat::Indirect, 1, &[0; 35]).is_err());
        let mut odd = [0u8; 20];
        odd[15] = 17;
        assert!(matches!(
            DataDescriptor::parse(DescriptorFormat::Indirect, 0, &odd),
            Err(WireError::Malformed { .. })
        ));
        assert!(DescriptorFormat::from_code(4).is_err());
        for code in 0..4 {
            assert_eq!(DescriptorFormat::from_code(code).unwrap().code(), code);
        }
    }
}
