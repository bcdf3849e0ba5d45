//! Command descriptor blocks of the commands a block target serves (storage-and-cm.md
//! C.7), parsed into [`Cdb`] and built back into bytes for an initiator.

use super::{be, check_len, WireError};

/// Operation codes.
pub mod opcode {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE.
    pub const REQUEST_SENSE: u8 = 0x03;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// MODE SENSE(6).
    pub const MODE_SENSE_6: u8 = 0x1A;
    /// READ CAPACITY(10).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2A;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE(10).
    pub const MODE_SENSE_10: u8 = 0x5A;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8A;
    /// SYNCHRONIZE CACHE(16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// SERVICE ACTION IN(16) (READ CAPACITY(16) is its service action 0x10).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xA0;
    /// READ CAPACITY(16) service action.
    pub const READ_CAPACITY_16_SA: u8 = 0x10;
}

/// READ or WRITE parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadWrite {
    /// First logical block.
    pub lba: u64,
    /// Blocks (0 moves nothing for the 10- and 16-byte forms).
    pub blocks: u32,
    /// Force unit access.
    pub fua: bool,
    /// RDPROTECT/WRPROTECT (bits 7:5 of byte 1); only 0 is served.
    pub protect: u8,
    /// Whether the 16-byte form (else the 10-byte).
    pub sixteen: bool,
}

/// A parsed CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cdb {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// DESC bit: descriptor-format sense wanted.
        descriptor: bool,
        /// Bytes the initiator takes.
        allocation_length: u8,
    },
    /// INQUIRY.
    Inquiry {
        /// Vital product data wanted.
        evpd: bool,
        /// VPD page.
        page_code: u8,
        /// Bytes the initiator takes.
        allocation_length: u16,
    },
    /// MODE SENSE(6) or (10).
    ModeSense {
        /// Whether the 10-byte form.
        ten: bool,
        /// Disable block descriptors.
        dbd: bool,
        /// Page control (0 current, 1 changeable, 2 default, 3 saved).
        page_control: u8,
        /// Page code (0x3F: all).
        page_code: u8,
        /// Subpage code.
        subpage: u8,
        /// Bytes the initiator takes.
        allocation_length: u16,
    },
    /// READ CAPACITY(10).
    ReadCapacity10,
    /// READ CAPACITY(16).
    ReadCapacity16 {
        /// Bytes the initiator takes.
        allocation_length: u32,
    },
    /// READ(10/16).
    Read(ReadWrite),
    /// WRITE(10/16).
    Write(ReadWrite),
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache {
        /// First block (0 with 0 blocks: everything).
        lba: u64,
        /// Blocks.
        blocks: u32,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// SELECT REPORT.
        select_report: u8,
        /// Bytes the initiator takes.
        allocation_length: u32,
    },
    /// UNMAP.
    Unmap {
        /// Bytes of the parameter list (data-out).
        parameter_list_length: u16,
    },
    /// An operation this target does not serve (answered INVALID COMMAND OPERATION CODE).
    Unsupported {
        /// The operation code.
        opcode: u8,
        /// The service action (byte 1, bits 4:0) where one applies.
        service_action: u8,
    },
}

/// The length of a CDB with `opcode` by its group code, if the group has a fixed length.
pub fn cdb_length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

impl Cdb {
    /// Reads a CDB (SRP carries 16 bytes; shorter forms use their first bytes).
    ///
    /// # Errors
    /// [`WireError::Truncated`] if `bytes` is shorter than the opcode's CDB length.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("CDB", 1, bytes.len())?;
        let op = bytes[0];
        if let Some(len) = cdb_length(op) {
            check_len("CDB", len, bytes.len())?;
        }
        let rw = |sixteen: bool| -> ReadWrite {
            if sixteen {
                ReadWrite {
                    lba: be::u64(&bytes[2..10]),
                    blocks: be::u32(&bytes[10..14]),
                    fua: bytes[1] & 0x08 != 0,
                    protect: bytes[1] >> 5,
                    sixteen,
                }
            } else {
                ReadWrite {
                    lba: u64::from(be::u32(&bytes[2..6])),
                    blocks: u32::from(be::u16(&bytes[7..9])),
                    fua: bytes[1] & 0x08 != 0,
                    protect: bytes[1] >> 5,
                    sixteen,
                }
            }
        };
        Ok(match op {
            opcode::TEST_UNIT_READY => Self::TestUnitReady,
            opcode::REQUEST_SENSE => Self::RequestSense {
                descriptor: bytes[1] & 1 != 0,
                allocation_length: bytes[4],
            },
            opcode::INQUIRY => Self::Inquiry {
                evpd: bytes[1] & 1 != 0,
                page_code: bytes[2],
                allocation_length: be::u16(&bytes[3..5]),
            },
            opcode::MODE_SENSE_6 => Self::ModeSense {
                ten: false,
                dbd: bytes[1] & 0x08 != 0,
                page_control: bytes[2] >> 6,
                page_code: bytes[2] & 0x3F,
                subpage: bytes[3],
                allocation_length: u16::from(bytes[4]),
            },
            opcode::MODE_SENSE_10 => Self::ModeSense {
                ten: true,
                dbd: bytes[1] & 0x08 != 0,
                page_control: bytes[2] >> 6,
                page_code: bytes[2] & 0x3F,
                subpage: bytes[3],
                allocation_length: be::u16(&bytes[7..9]),
            },
            opcode::READ_CAPACITY_10 => Self::ReadCapacity10,
            opcode::SERVICE_ACTION_IN_16 if bytes[1] & 0x1F == opcode::READ_CAPACITY_16_SA => Self::ReadCapacity16 {
                allocation_length: be::u32(&bytes[10..14]),
            },
            opcode::READ_10 => Self::Read(rw(false)),
            opcode::READ_16 => Self::Read(rw(true)),
            opcode::WRITE_10 => Self::Write(rw(false)),
            opcode::WRITE_16 => Self::Write(rw(true)),
            opcode::SYNCHRONIZE_CACHE_10 => Self::SynchronizeCache {
                lba: u64::from(be::u32(&bytes[2..6])),
                blocks: u32::from(be::u16(&bytes[7..9])),
            },
            opcode::SYNCHRONIZE_CACHE_16 => Self::SynchronizeCache {
                lba: be::u64(&bytes[2..10]),
                blocks: be::u32(&bytes[10..14]),
            },
            opcode::REPORT_LUNS => Self::ReportLuns {
                select_report: bytes[2],
                allocation_length: be::u32(&bytes[6..10]),
            },
            opcode::UNMAP => Self::Unmap {
                parameter_list_length: be::u16(&bytes[7..9]),
            },
            other => Self::Unsupported {
                opcode: other,
                service_action: if other == opcode::SERVICE_ACTION_IN_16 || other == 0xA3 {
                    bytes.get(1).map_or(0, |b| b & 0x1F)
                } else {
                    0
                },
            },
        })
    }

    /// Builds the 16 bytes an SRP_CMD carries.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        let put_rw = |b: &mut [u8; 16], op10: u8, op16: u8, rw: &ReadWrite| {
            b[1] = (rw.protect << 5) | if rw.fua { 0x08 } else { 0 };
            if rw.sixteen {
                b[0] = op16;
                be::set_u64(&mut b[2..10], rw.lba);
                be::set_u32(&mut b[10..14], rw.blocks);
            } else {
                b[0] = op10;
                be::set_u32(&mut b[2..6], rw.lba as u32);
                be::set_u16(&mut b[7..9], rw.blocks as u16);
            }
        };
        match *self {
            Self::TestUnitReady => {}
            Self::RequestSense {
                descriptor,
                allocation_length,
            } => {
                b[0] = opcode::REQUEST_SENSE;
                b[1] = u8::from(descriptor);
                b[4] = allocation_length;
            }
            Self::Inquiry {
                evpd,
                page_code,
                allocation_length,
            } => {
                b[0] = opcode::INQUIRY;
                b[1] = u8::from(evpd);
                b[2] = page_code;
                be::set_u16(&mut b[3..5], allocation_length);
            }
            Self::ModeSense {
                ten,
                dbd,
                page_control,
                page_code,
                subpage,
                allocation_length,
            } => {
                b[1] = if dbd { 0x08 } else { 0 };
                b[2] = (page_control << 6) | (page_code & 0x3F);
                b[3] = subpage;
                if ten {
                    b[0] = opcode::MODE_SENSE_10;
                    be::set_u16(&mut b[7..9], allocation_length);
                } else {
                    b[0] = opcode::MODE_SENSE_6;
                    b[4] = allocation_length.min(255) as u8;
                }
            }
            Self::ReadCapacity10 => b[0] = opcode::READ_CAPACITY_10,
            Self::ReadCapacity16 { allocation_length } => {
                b[0] = opcode::SERVICE_ACTION_IN_16;
                b[1] = opcode::READ_CAPACITY_16_SA;
                be::set_u32(&mut b[10..14], allocation_length);
            }
            Self::Read(rw) => put_rw(&mut b, opcode::READ_10, opcode::READ_16, &rw),
            Self::Write(rw) => put_rw(&mut b, opcode::WRITE_10, opcode::WRITE_16, &rw),
            Self::SynchronizeCache { lba, blocks } => {
                b[0] = opcode::SYNCHRONIZE_CACHE_16;
                be::set_u64(&mut b[2..10], lba);
                be::set_u32(&mut b[10..14], blocks);
            }
            Self::ReportLuns {
                select_report,
                allocation_length,
            } => {
                b[0] = opcode::REPORT_LUNS;
                b[2] = select_report;
                be::set_u32(&mut b[6..10], allocation_length);
            }
            Self::Unmap { parameter_list_length } => {
                b[0] = opcode::UNMAP;
                be::set_u16(&mut b[7..9], parameter_list_length);
            }
            Self::Unsupported { opcode, service_action } => {
                b[0] = opcode;
                b[1] = service_action;
            }
        }
        b
    }
}

/// Parses a CDB (a fuzz entry point): never panics, whatever the bytes.
///
/// # Errors
/// See [`Cdb::parse`].
pub fn parse_cdb(bytes: &[u8]) -> Result<Cdb, WireError> {
    Cdb::parse(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_cdbs_linux_sends() {
        // sd's READ(10) of 8 blocks at LBA 0x12345678 with FUA.
        let read10 = [0x28, 0x08, 0x12, 0x34, 0x56, 0x78, 0, 0, 8, 0];
        assert_eq!(
            Cdb::parse(&read10).unwrap(),
            Cdb::Read(ReadWrite {
                lba: 0x1234_5678,
                blocks: 8,
                fua: true,
                protect: 0,
                sixteen: false
            })
        );
        // READ CAPACITY(16), allocation length 32.
        let rc16 = [0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
        assert_eq!(
            Cdb::parse(&rc16).unwrap(),
            Cdb::ReadCapacity16 { allocation_length: 32 }
        );
        // INQUIRY VPD 0x83, 255 bytes.
        assert_eq!(
            Cdb::parse(&[0x12, 1, 0x83, 0, 0xFF, 0]).unwrap(),
            Cdb::Inquiry {
                evpd: true,
                page_code: 0x83,
                allocation_length: 255
            }
        );
        // MODE SENSE(6) all pages, 192 bytes.
        assert_eq!(
            Cdb::parse(&[0x1A, 0, 0x3F, 0, 192, 0]).unwrap(),
            Cdb::ModeSense {
                ten: false,
                dbd: false,
                page_control: 0,
                page_code: 0x3F,
                subpage: 0,
                allocation_length: 192
            }
        );
        assert_eq!(
            Cdb::parse(&[0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(),
            Cdb::Unsupported {
                opcode: 0xA3,
                service_action: 0x0C
            }
        );
    }

    #[test]
    fn emits_known_cdbs() {
        let write16 = Cdb::Write(ReadWrite {
            lba: 0x0102_0304_0506_0708,
            blocks: 0x10,
            fua: false,
            protect: 0,
            sixteen: true,
        });
        assert_eq!(
            write16.to_bytes(),
            [0x8A, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0x10, 0, 0]
        );
        assert_eq!(
            Cdb::ReportLuns {
                select_report: 0,
                allocation_length: 4096
            }
            .to_bytes(),
            [0xA0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn round_trips_every_form() {
        let rw = |sixteen| ReadWrite {
            lba: if sixteen { 1 << 40 } else { 77 },
            blocks: 9,
            fua: true,
            protect: 0,
            sixteen,
        };
        let all = [
            Cdb::TestUnitReady,
            Cdb::RequestSense {
                descriptor: false,
                allocation_length: 18,
            },
            Cdb::Inquiry {
                evpd: false,
                page_code: 0,
                allocation_length: 36,
            },
            Cdb::ModeSense {
                ten: true,
                dbd: true,
                page_control: 0,
                page_code: 8,
                subpage: 0,
                allocation_length: 512,
            },
            Cdb::ReadCapacity10,
            Cdb::ReadCapacity16 { allocation_length: 32 },
            Cdb::Read(rw(false)),
            Cdb::Read(rw(true)),
            Cdb::Write(rw(false)),
            Cdb::Write(rw(true)),
            Cdb::SynchronizeCache { lba: 5, blocks: 6 },
            Cdb::ReportLuns {
                select_report: 2,
                allocation_length: 16,
            },
            Cdb::Unmap {
                parameter_list_length: 24,
            },
            Cdb::Unsupported {
                opcode: 0x1B,
                service_action: 0,
            },
        ];
        for cdb in all {
            assert_eq!(Cdb::parse(&cdb.to_bytes()).unwrap(), cdb);
        }
    }

    #[test]
    fn refuses_truncated_cdbs() {
        assert!(Cdb::parse(&[]).is_err());
        assert!(Cdb::parse(&[0x28; 9]).is_err());
        assert!(Cdb::parse(&[0x88; 15]).is_err());
        assert!(Cdb::parse(&[0x12; 5]).is_err());
        assert!(Cdb::parse(&[0xA0; 11]).is_err());
        // Any 16 bytes parse.
        for op in 0..=255u8 {
            let mut b = [0xFFu8; 16];
            b[0] = op;
            assert!(Cdb::parse(&b).is_ok());
        }
    }
}
