//! The information units of a live channel (storage-and-cm.md C.3): SRP_CMD and its
//! SRP_RSP, task management, logouts, credit and asynchronous-event requests.

use super::descriptor::{DataDescriptor, DescriptorFormat};
use super::login::{LoginRejRepr, LoginReqRepr, LoginRspRepr};
use super::{be, check_len, opcode, WireError};

/// Bytes of SRP_CMD before the additional CDB and the descriptors.
pub const CMD_HEADER_LEN: usize = 48;
/// Bytes of SRP_RSP before the response and sense data.
pub const RSP_HEADER_LEN: usize = 36;
/// Bytes of SRP_TSK_MGMT.
pub const TSK_MGMT_LEN: usize = 48;
/// Bytes of SRP_AER_REQ before its sense data.
pub const AER_REQ_HEADER_LEN: usize = 36;
/// Bytes of the short IUs (logouts, credit and AER responses, CRED_REQ).
pub const SHORT_IU_LEN: usize = 16;

/// SRP_RSP flag: response data valid.
pub const RSPVALID: u8 = 0x01;
/// SRP_RSP flag: sense data valid.
pub const SNSVALID: u8 = 0x02;
/// SRP_RSP flag: data-out residual is an overflow.
pub const DOOVER: u8 = 0x04;
/// SRP_RSP flag: data-out residual is an underflow.
pub const DOUNDER: u8 = 0x08;
/// SRP_RSP flag: data-in residual is an overflow.
pub const DIOVER: u8 = 0x10;
/// SRP_RSP flag: data-in residual is an underflow.
pub const DIUNDER: u8 = 0x20;

mod cmd {
    use core::ops::Range;
    pub const SOL_NOT: usize = 1;
    pub const BUF_FMT: usize = 5;
    pub const DATA_OUT_DESC_CNT: usize = 6;
    pub const DATA_IN_DESC_CNT: usize = 7;
    pub const TAG: Range<usize> = 8..16;
    pub const LUN: Range<usize> = 20..28;
    pub const TASK_ATTR: usize = 29;
    pub const ADD_CDB_LEN: usize = 31;
    pub const CDB: Range<usize> = 32..48;
}

/// The content of an SRP_CMD.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CmdRepr {
    /// Solicited-notification flags.
    pub sol_not: u8,
    /// Tag.
    pub tag: u64,
    /// Logical unit number, the 8-byte SAM form (`00 nn 00…` for LUN nn < 256).
    pub lun: u64,
    /// Task attribute (0 simple, 1 head of queue, 2 ordered, 4 ACA).
    pub task_attr: u8,
    /// The CDB's first 16 bytes.
    pub cdb: [u8; 16],
    /// Additional CDB bytes (a multiple of 4).
    pub additional_cdb: Vec<u8>,
    /// Where data-out (initiator → target) comes from.
    pub data_out: DataDescriptor,
    /// Where data-in (target → initiator) goes.
    pub data_in: DataDescriptor,
}

impl CmdRepr {
    /// Reads an SRP_CMD.
    ///
    /// # Errors
    /// Truncated input (header, additional CDB or descriptors); another opcode; a
    /// descriptor format above 3, or immediate data for data-in.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP_CMD", CMD_HEADER_LEN, bytes.len())?;
        if bytes[0] != opcode::CMD {
            return Err(WireError::Malformed {
                format: "SRP_CMD",
                field: "opcode",
                value: u64::from(bytes[0]),
            });
        }
        let out_format = DescriptorFormat::from_code(bytes[cmd::BUF_FMT] >> 4)?;
        let in_format = DescriptorFormat::from_code(bytes[cmd::BUF_FMT] & 0x0F)?;
        if in_format == DescriptorFormat::Immediate {
            return Err(WireError::Malformed {
                format: "SRP_CMD",
                field: "buf_fmt",
                value: u64::from(bytes[cmd::BUF_FMT]),
            });
        }
        let add_cdb_len = usize::from(bytes[cmd::ADD_CDB_LEN] & 0xFC);
        check_len("SRP_CMD", CMD_HEADER_LEN + add_cdb_len, bytes.len())?;
        let mut at = CMD_HEADER_LEN + add_cdb_len;
        let (data_out, used) = DataDescriptor::parse(out_format, bytes[cmd::DATA_OUT_DESC_CNT], &bytes[at..])?;
        at += used;
        let (data_in, _) = DataDescriptor::parse(in_format, bytes[cmd::DATA_IN_DESC_CNT], &bytes[at..])?;
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&bytes[cmd::CDB]);
        Ok(Self {
            sol_not: bytes[cmd::SOL_NOT],
            tag: be::u64(&bytes[cmd::TAG]),
            lun: be::u64(&bytes[cmd::LUN]),
            task_attr: bytes[cmd::TASK_ATTR],
            cdb,
            additional_cdb: bytes[CMD_HEADER_LEN..CMD_HEADER_LEN + add_cdb_len].to_vec(),
            data_out,
            data_in,
        })
    }

    /// Bytes of the IU up to the end of its descriptors.
    pub fn buffer_len(&self) -> usize {
        CMD_HEADER_LEN + self.additional_cdb.len().min(252) / 4 * 4 + self.data_out.wire_len() + self.data_in.wire_len()
    }

    /// Writes the IU (without immediate data, which goes at the negotiated offset);
    /// returns the bytes written.
    ///
    /// # Panics
    /// If `out` is shorter than [`Self::buffer_len`].
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let add_cdb_len = self.additional_cdb.len().min(252) / 4 * 4;
        out[..CMD_HEADER_LEN].fill(0);
        out[0] = opcode::CMD;
        out[cmd::SOL_NOT] = self.sol_not;
        out[cmd::BUF_FMT] = self.data_out.format().code() << 4 | self.data_in.format().code();
        out[cmd::DATA_OUT_DESC_CNT] = self.data_out.count();
        out[cmd::DATA_IN_DESC_CNT] = self.data_in.count();
        be::set_u64(&mut out[cmd::TAG], self.tag);
        be::set_u64(&mut out[cmd::LUN], self.lun);
        out[cmd::TASK_ATTR] = self.task_attr;
        out[cmd::ADD_CDB_LEN] = add_cdb_len as u8;
        out[cmd::CDB].copy_from_slice(&self.cdb);
        out[CMD_HEADER_LEN..CMD_HEADER_LEN + add_cdb_len].copy_from_slice(&self.additional_cdb[..add_cdb_len]);
        let mut at = CMD_HEADER_LEN + add_cdb_len;
        at += self.data_out.emit(&mut out[at..]);
        at += self.data_in.emit(&mut out[at..]);
        at
    }

    /// The immediate data of `iu` (this command's bytes) when its data-out is
    /// immediate, starting at `offset` (the login's immediate data offset).
    ///
    /// # Errors
    /// [`WireError::Malformed`] if the data would overlap the descriptors or reach past
    /// the IU.
    pub fn immediate_data<'a>(&self, iu: &'a [u8], offset: usize) -> Result<&'a [u8], WireError> {
        let DataDescriptor::Immediate { len } = self.data_out else {
            return Ok(&[]);
        };
        let end = offset.checked_add(len as usize);
        match end {
            Some(end) if offset >= self.buffer_len() && end <= iu.len() => Ok(&iu[offset..end]),
            _ => Err(WireError::Malformed {
                format: "SRP_CMD",
                field: "srp_imm_buf.len",
                value: u64::from(len),
            }),
        }
    }
}

/// A residual count of one direction of an SRP_RSP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResidualCount {
    /// Everything moved.
    #[default]
    None,
    /// Fewer bytes moved than the descriptors described, by this many.
    Underflow(u32),
    /// The command wanted this many bytes more than the descriptors described.
    Overflow(u32),
}

/// The content of an SRP_RSP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RspRepr {
    /// Solicited-notification flag.
    pub sol_not: u8,
    /// Credits returned.
    pub req_lim_delta: u32,
    /// The command's (or task management request's) tag.
    pub tag: u64,
    /// SCSI status.
    pub status: u8,
    /// Data-out residual.
    pub data_out_residual: ResidualCount,
    /// Data-in residual.
    pub data_in_residual: ResidualCount,
    /// Response data (task management: 4 bytes, the code in the last), when valid.
    pub response_data: Option<Vec<u8>>,
    /// Sense data, when valid.
    pub sense: Option<Vec<u8>>,
}

fn residual(flags: u8, over: u8, under: u8, count: u32, field: &'static str) -> Result<ResidualCount, WireError> {
    match (flags & over != 0, flags & under != 0) {
        (false, false) => Ok(ResidualCount::None),
        (true, false) => Ok(ResidualCount::Overflow(count)),
        (false, true) => Ok(ResidualCount::Underflow(count)),
        (true, true) => Err(WireError::Malformed {
            format: "SRP_RSP",
            field,
            value: u64::from(flags),
        }),
    }
}

fn residual_bits(residual: ResidualCount, over: u8, under: u8) -> (u8, u32) {
    match residual {
        ResidualCount::None => (0, 0),
        ResidualCount::Overflow(n) => (over, n),
        ResidualCount::Underflow(n) => (under, n),
    }
}

impl RspRepr {
    /// Reads an SRP_RSP.
    ///
    /// # Errors
    /// Truncated input (header, or the response and sense data its lengths announce);
    /// another opcode; both overflow and underflow for one direction.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP_RSP", RSP_HEADER_LEN, bytes.len())?;
        if bytes[0] != opcode::RSP {
            return Err(WireError::Malformed {
                format: "SRP_RSP",
                field: "opcode",
                value: u64::from(bytes[0]),
            });
        }
        let flags = bytes[18];
        let sense_len = if flags & SNSVALID != 0 {
            be::u32(&bytes[28..32]) as usize
        } else {
            0
        };
        let resp_len = if flags & RSPVALID != 0 {
            be::u32(&bytes[32..36]) as usize
        } else {
            0
        };
        let needed = RSP_HEADER_LEN.saturating_add(sense_len).saturating_add(resp_len);
        check_len("SRP_RSP", needed, bytes.len())?;
        let resp_end = RSP_HEADER_LEN + resp_len;
        Ok(Self {
            sol_not: bytes[1],
            req_lim_delta: be::u32(&bytes[4..8]),
            tag: be::u64(&bytes[8..16]),
            status: bytes[19],
            data_out_residual: residual(flags, DOOVER, DOUNDER, be::u32(&bytes[20..24]), "flags (data-out)")?,
            data_in_residual: residual(flags, DIOVER, DIUNDER, be::u32(&bytes[24..28]), "flags (data-in)")?,
            response_data: (flags & RSPVALID != 0).then(|| bytes[RSP_HEADER_LEN..resp_end].to_vec()),
            sense: (flags & SNSVALID != 0).then(|| bytes[resp_end..resp_end + sense_len].to_vec()),
        })
    }

    /// Bytes of the IU.
    pub fn buffer_len(&self) -> usize {
        RSP_HEADER_LEN + self.response_data.as_ref().map_or(0, Vec::len) + self.sense.as_ref().map_or(0, Vec::len)
    }

    /// Writes the IU; returns the bytes written.
    ///
    /// # Panics
    /// If `out` is shorter than [`Self::buffer_len`].
    pub fn emit(&self, out: &mut [u8]) -> usize {
        out[..RSP_HEADER_LEN].fill(0);
        out[0] = opcode::RSP;
        out[1] = self.sol_not;
        be::set_u32(&mut out[4..8], self.req_lim_delta);
        be::set_u64(&mut out[8..16], self.tag);
        let (out_bits, out_count) = residual_bits(self.data_out_residual, DOOVER, DOUNDER);
        let (in_bits, in_count) = residual_bits(self.data_in_residual, DIOVER, DIUNDER);
        let mut flags = out_bits | in_bits;
        let mut at = RSP_HEADER_LEN;
        if let Some(response) = &self.response_data {
            flags |= RSPVALID;
            be::set_u32(&mut out[32..36], response.len() as u32);
            out[at..at + response.len()].copy_from_slice(response);
            at += response.len();
        }
        if let Some(sense) = &self.sense {
            flags |= SNSVALID;
            be::set_u32(&mut out[28..32], sense.len() as u32);
            out[at..at + sense.len()].copy_from_slice(sense);
            at += sense.len();
        }
        out[18] = flags;
        out[19] = self.status;
        be::set_u32(&mut out[20..24], out_count);
        be::set_u32(&mut out[24..28], in_count);
        at
    }

    /// The task management response code (byte 3 of the response data), if any.
    pub fn task_management_code(&self) -> Option<u8> {
        self.response_data.as_ref().and_then(|r| r.get(3).copied())
    }
}

/// A task management function (SRP_TSK_MGMT byte 30).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskManagementFunction {
    /// ABORT TASK (the task named by the task tag).
    AbortTask,
    /// ABORT TASK SET.
    AbortTaskSet,
    /// CLEAR TASK SET.
    ClearTaskSet,
    /// LOGICAL UNIT RESET.
    LogicalUnitReset,
    /// CLEAR ACA.
    ClearAca,
    /// A value SRP does not define.
    Other(u8),
}

impl TaskManagementFunction {
    /// The code.
    pub fn code(self) -> u8 {
        match self {
            Self::AbortTask => 0x01,
            Self::AbortTaskSet => 0x02,
            Self::ClearTaskSet => 0x04,
            Self::LogicalUnitReset => 0x08,
            Self::ClearAca => 0x40,
            Self::Other(code) => code,
        }
    }
    /// From the code.
    pub fn from_code(code: u8) -> Self {
        match code {
            0x01 => Self::AbortTask,
            0x02 => Self::AbortTaskSet,
            0x04 => Self::ClearTaskSet,
            0x08 => Self::LogicalUnitReset,
            0x40 => Self::ClearAca,
            other => Self::Other(other),
        }
    }
}

/// Task management response codes (SRP_RSP response data byte 3).
pub mod task_management_response {
    /// Function complete / succeeded.
    pub const COMPLETE: u8 = 0x00;
    /// Function not supported.
    pub const NOT_SUPPORTED: u8 = 0x04;
    /// Function failed.
    pub const FAILED: u8 = 0x05;
}

/// The content of an SRP_TSK_MGMT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TskMgmtRepr {
    /// Solicited-notification flags.
    pub sol_not: u8,
    /// Tag of this request.
    pub tag: u64,
    /// Logical unit.
    pub lun: u64,
    /// Function.
    pub function: TaskManagementFunction,
    /// Tag of the task to manage (ABORT TASK).
    pub task_tag: u64,
}

impl TskMgmtRepr {
    /// Reads an SRP_TSK_MGMT.
    ///
    /// # Errors
    /// Truncated input or another opcode.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP_TSK_MGMT", TSK_MGMT_LEN, bytes.len())?;
        if bytes[0] != opcode::TSK_MGMT {
            return Err(WireError::Malformed {
                format: "SRP_TSK_MGMT",
                field: "opcode",
                value: u64::from(bytes[0]),
            });
        }
        Ok(Self {
            sol_not: bytes[1],
            tag: be::u64(&bytes[8..16]),
            lun: be::u64(&bytes[20..28]),
            function: TaskManagementFunction::from_code(bytes[30]),
            task_tag: be::u64(&bytes[32..40]),
        })
    }

    /// Writes the 48 bytes.
    ///
    /// # Panics
    /// If `out` is shorter than 48 bytes.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        out[..TSK_MGMT_LEN].fill(0);
        out[0] = opcode::TSK_MGMT;
        out[1] = self.sol_not;
        be::set_u64(&mut out[8..16], self.tag);
        be::set_u64(&mut out[20..28], self.lun);
        out[30] = self.function.code();
        be::set_u64(&mut out[32..40], self.task_tag);
        TSK_MGMT_LEN
    }
}

/// The content of an SRP_T_LOGOUT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TLogoutRepr {
    /// Solicited-notification flag.
    pub sol_not: u8,
    /// Reason (0: no reason given; 1: inactive channel; 2: invalid IU type; 3: unexpected
    /// response; 4: multi-channel action; 6: unsupported format; 7: no more channels;
    /// 8: shutdown).
    pub reason: u32,
    /// Tag.
    pub tag: u64,
}

/// The content of an SRP_CRED_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CredReqRepr {
    /// Solicited-notification flag.
    pub sol_not: u8,
    /// Credits given.
    pub req_lim_delta: u32,
    /// Tag.
    pub tag: u64,
}

/// The content of an SRP_AER_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AerReqRepr {
    /// Solicited-notification flag.
    pub sol_not: u8,
    /// Credits given.
    pub req_lim_delta: u32,
    /// Tag.
    pub tag: u64,
    /// Logical unit.
    pub lun: u64,
    /// Sense data of the event.
    pub sense: Vec<u8>,
}

/// Any IU, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IuRepr {
    /// SRP_LOGIN_REQ (the full 64-byte form).
    LoginReq(LoginReqRepr),
    /// SRP_LOGIN_RSP.
    LoginRsp(LoginRspRepr),
    /// SRP_LOGIN_REJ.
    LoginRej(LoginRejRepr),
    /// SRP_CMD.
    Cmd(CmdRepr),
    /// SRP_RSP.
    Rsp(RspRepr),
    /// SRP_TSK_MGMT.
    TskMgmt(TskMgmtRepr),
    /// SRP_I_LOGOUT, with its tag.
    ILogout {
        /// Tag.
        tag: u64,
    },
    /// SRP_T_LOGOUT.
    TLogout(TLogoutRepr),
    /// SRP_CRED_REQ.
    CredReq(CredReqRepr),
    /// SRP_CRED_RSP, with its tag.
    CredRsp {
        /// Tag.
        tag: u64,
    },
    /// SRP_AER_REQ.
    AerReq(AerReqRepr),
    /// SRP_AER_RSP, with its tag.
    AerRsp {
        /// Tag.
        tag: u64,
    },
}

impl IuRepr {
    /// Reads any IU by its opcode.
    ///
    /// # Errors
    /// Truncated input; an unknown opcode; whatever the IU's own parser refuses.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("SRP IU", 1, bytes.len())?;
        let short = |format| -> Result<(), WireError> { check_len(format, SHORT_IU_LEN, bytes.len()) };
        Ok(match bytes[0] {
            opcode::LOGIN_REQ => Self::LoginReq(LoginReqRepr::parse(bytes)?),
            opcode::LOGIN_RSP => Self::LoginRsp(LoginRspRepr::parse(bytes)?),
            opcode::LOGIN_REJ => Self::LoginRej(LoginRejRepr::parse(bytes)?),
            opcode::CMD => Self::Cmd(CmdRepr::parse(bytes)?),
            opcode::RSP => Self::Rsp(RspRepr::parse(bytes)?),
            opcode::TSK_MGMT => Self::TskMgmt(TskMgmtRepr::parse(bytes)?),
            opcode::I_LOGOUT => {
                short("SRP_I_LOGOUT")?;
                Self::ILogout {
                    tag: be::u64(&bytes[8..16]),
                }
            }
            opcode::T_LOGOUT => {
                short("SRP_T_LOGOUT")?;
                Self::TLogout(TLogoutRepr {
                    sol_not: bytes[1],
                    reason: be::u32(&bytes[4..8]),
                    tag: be::u64(&bytes[8..16]),
                })
            }
            opcode::CRED_REQ => {
                short("SRP_CRED_REQ")?;
                Self::CredReq(CredReqRepr {
                    sol_not: bytes[1],
                    req_lim_delta: be::u32(&bytes[4..8]),
                    tag: be::u64(&bytes[8..16]),
                })
            }
            opcode::CRED_RSP => {
                short("SRP_CRED_RSP")?;
                Self::CredRsp {
                    tag: be::u64(&bytes[8..16]),
                }
            }
            opcode::AER_REQ => {
                check_len("SRP_AER_REQ", AER_REQ_HEADER_LEN, bytes.len())?;
                let sense_len = be::u32(&bytes[28..32]) as usize;
                check_len("SRP_AER_REQ", AER_REQ_HEADER_LEN.saturating_add(sense_len), bytes.len())?;
                Self::AerReq(AerReqRepr {
                    sol_not: bytes[1],
                    req_lim_delta: be::u32(&bytes[4..8]),
                    tag: be::u64(&bytes[8..16]),
                    lun: be::u64(&bytes[20..28]),
                    sense: bytes[AER_REQ_HEADER_LEN..AER_REQ_HEADER_LEN + sense_len].to_vec(),
                })
            }
            opcode::AER_RSP => {
                short("SRP_AER_RSP")?;
                Self::AerRsp {
                    tag: be::u64(&bytes[8..16]),
                }
            }
            other => {
                return Err(WireError::Malformed {
                    format: "SRP IU",
                    field: "opcode",
                    value: u64::from(other),
                })
            }
        })
    }

    /// Bytes of the IU.
    pub fn buffer_len(&self) -> usize {
        match self {
            Self::LoginReq(_) => super::login::LOGIN_REQ_LEN,
            Self::LoginRsp(_) => super::login::LOGIN_RSP_LEN,
            Self::LoginRej(_) => super::login::LOGIN_REJ_LEN,
            Self::Cmd(c) => c.buffer_len(),
            Self::Rsp(r) => r.buffer_len(),
            Self::TskMgmt(_) => TSK_MGMT_LEN,
            Self::AerReq(a) => AER_REQ_HEADER_LEN + a.sense.len(),
            Self::ILogout { .. } | Self::TLogout(_) | Self::CredReq(_) | Self::CredRsp { .. } | Self::AerRsp { .. } => {
                SHORT_IU_LEN
            }
        }
    }

    /// Writes the IU; returns the bytes written.
    ///
    /// # Panics
    /// If `out` is shorter than [`Self::buffer_len`].
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let len = self.buffer_len();
        let short = |out: &mut [u8], op: u8, sol_not: u8, word: u32, tag: u64| {
            out[..SHORT_IU_LEN].fill(0);
            out[0] = op;
            out[1] = sol_not;
            be::set_u32(&mut out[4..8], word);
            be::set_u64(&mut out[8..16], tag);
        };
        match self {
            Self::LoginReq(r) => r.emit(out),
            Self::LoginRsp(r) => r.emit(out),
            Self::LoginRej(r) => r.emit(out),
            Self::Cmd(c) => {
                c.emit(out);
            }
            Self::Rsp(r) => {
                r.emit(out);
            }
            Self::TskMgmt(t) => {
                t.emit(out);
            }
            Self::ILogout { tag } => short(out, opcode::I_LOGOUT, 0, 0, *tag),
            Self::TLogout(t) => short(out, opcode::T_LOGOUT, t.sol_not, t.reason, t.tag),
            Self::CredReq(c) => short(out, opcode::CRED_REQ, c.sol_not, c.req_lim_delta, c.tag),
            Self::CredRsp { tag } => short(out, opcode::CRED_RSP, 0, 0, *tag),
            Self::AerRsp { tag } => short(out, opcode::AER_RSP, 0, 0, *tag),
            Self::AerReq(a) => {
                out[..AER_REQ_HEADER_LEN].fill(0);
                out[0] = opcode::AER_REQ;
                out[1] = a.sol_not;
                be::set_u32(&mut out[4..8], a.req_lim_delta);
                be::set_u64(&mut out[8..16], a.tag);
                be::set_u64(&mut out[20..28], a.lun);
                be::set_u32(&mut out[28..32], a.sense.len() as u32);
                out[AER_REQ_HEADER_LEN..len].copy_from_slice(&a.sense);
            }
        }
        len
    }

    /// As bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.buffer_len()];
        self.emit(&mut out);
        out
    }
}

/// Parses any IU (a fuzz entry point): never panics, whatever the bytes.
///
/// # Errors
/// See [`IuRepr::parse`].
pub fn parse_iu(bytes: &[u8]) -> Result<IuRepr, WireError> {
    IuRepr::parse(bytes)
}

#[cfg(test)]
mod tests {
    use super::super::descriptor::DirectDescriptor;
    use super::super::login::{LoginRejReason, PortId};
    use super::super::XorShift;
    use super::*;

    /// READ(10) of 8 blocks at LBA 0x20 on LUN 1 into one direct descriptor, the way
    /// `ib_srp` builds it.
    fn read_cmd() -> (CmdRepr, [u8; 64]) {
        let mut bytes = [0u8; 64];
        bytes[0] = 0x02;
        bytes[5] = 0x01; // data-in direct
        bytes[8..16].copy_from_slice(&5u64.to_be_bytes());
        bytes[21] = 1; // LUN 1
        bytes[32] = 0x28;
        bytes[37] = 0x20;
        bytes[40] = 8;
        bytes[48..56].copy_from_slice(&0x1000u64.to_be_bytes());
        bytes[56..60].copy_from_slice(&0x1234u32.to_be_bytes());
        bytes[60..64].copy_from_slice(&4096u32.to_be_bytes());
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        cdb[5] = 0x20;
        cdb[8] = 8;
        let repr = CmdRepr {
            tag: 5,
            lun: 0x0001_0000_0000_0000,
            cdb,
            data_in: DataDescriptor::Direct(DirectDescriptor {
                va: 0x1000,
                key: 0x1234,
                len: 4096,
            }),
            ..CmdRepr::default()
        };
        (repr, bytes)
    }

    #[test]
    fn parses_a_known_command() {
        let (repr, bytes) = read_cmd();
        assert_eq!(CmdRepr::parse(&bytes).unwrap(), repr);
        assert_eq!(parse_iu(&bytes).unwrap(), IuRepr::Cmd(repr));
    }

    #[test]
    fn emits_a_known_command() {
        let (repr, bytes) = read_cmd();
        let mut out = [0xFFu8; 64];
        assert_eq!(repr.emit(&mut out), 64);
        assert_eq!(out, bytes);
    }

    #[test]
    fn immediate_data_sits_at_the_login_offset() {
        let repr = CmdRepr {
            tag: 1,
            data_out: DataDescriptor::Immediate { len: 8 },
            ..CmdRepr::default()
        };
        let mut iu = vec![0u8; 68 + 8];
        assert_eq!(repr.emit(&mut iu), 52);
        assert_eq!(iu[5], 0x30);
        iu[68..].copy_from_slice(b"immediat");
        let back = CmdRepr::parse(&iu).unwrap();
        assert_eq!(back.immediate_data(&iu, 68).unwrap(), b"immediat");
        // Past the IU, or overlapping the descriptor: malformed.
        assert!(back.immediate_data(&iu[..75], 68).is_err());
        assert!(back.immediate_data(&iu, 50).is_err());
    }

    #[test]
    fn parses_and_emits_a_known_response_with_sense() {
        let sense = vec![0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
        let repr = RspRepr {
            req_lim_delta: 1,
            tag: 9,
            status: 2,
            data_in_residual: ResidualCount::Underflow(512),
            sense: Some(sense.clone()),
            ..RspRepr::default()
        };
        let mut known = vec![0u8; 36];
        known[0] = 0xC1;
        known[7] = 1;
        known[15] = 9;
        known[18] = SNSVALID | DIUNDER;
        known[19] = 2;
        known[26] = 2; // 512
        known[31] = 18;
        known.extend_from_slice(&sense);
        assert_eq!(IuRepr::Rsp(repr.clone()).to_bytes(), known);
        assert_eq!(RspRepr::parse(&known).unwrap(), repr);
        for n in 0..known.len() {
            assert!(RspRepr::parse(&known[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn task_management_response_carries_its_code() {
        let repr = RspRepr {
            req_lim_delta: 1,
            tag: 3,
            response_data: Some(vec![0, 0, 0, task_management_response::NOT_SUPPORTED]),
            ..RspRepr::default()
        };
        let bytes = IuRepr::Rsp(repr.clone()).to_bytes();
        assert_eq!(bytes.len(), 40);
        assert_eq!(bytes[18], RSPVALID);
        assert_eq!(bytes[35], 4);
        assert_eq!(RspRepr::parse(&bytes).unwrap().task_management_code(), Some(4));
    }

    #[test]
    fn parses_and_emits_known_short_ius() {
        let mut t_logout = [0u8; 16];
        t_logout[0] = 0x80;
        t_logout[7] = 8;
        t_logout[15] = 2;
        let repr = IuRepr::TLogout(TLogoutRepr {
            sol_not: 0,
            reason: 8,
            tag: 2,
        });
        assert_eq!(parse_iu(&t_logout).unwrap(), repr);
        assert_eq!(repr.to_bytes(), t_logout);
        let mut tsk = [0u8; 48];
        tsk[0] = 0x01;
        tsk[15] = 7;
        tsk[21] = 2;
        tsk[30] = 0x08;
        let repr = TskMgmtRepr {
            sol_not: 0,
            tag: 7,
            lun: 0x0002_0000_0000_0000,
            function: TaskManagementFunction::LogicalUnitReset,
            task_tag: 0,
        };
        assert_eq!(TskMgmtRepr::parse(&tsk).unwrap(), repr);
        assert_eq!(IuRepr::TskMgmt(repr).to_bytes(), tsk);
    }

    fn random_descriptor(rng: &mut XorShift, data_in: bool) -> DataDescriptor {
        let direct = |rng: &mut XorShift| DirectDescriptor {
            va: rng.next_u64(),
            key: rng.u32(),
            len: rng.u32(),
        };
        match rng.u8() % if data_in { 3 } else { 4 } {
            0 => DataDescriptor::None,
            1 => DataDescriptor::Direct(direct(rng)),
            2 => {
                let n = usize::from(rng.u8() % 5);
                DataDescriptor::Indirect {
                    table: DirectDescriptor {
                        len: 16 * n as u32,
                        ..direct(rng)
                    },
                    total_len: rng.u32(),
                    list: (0..n).map(|_| direct(rng)).collect(),
                }
            }
            _ => DataDescriptor::Immediate { len: rng.u32() },
        }
    }

    #[test]
    fn round_trips_random_ius() {
        let mut rng = XorShift::new(11);
        for _ in 0..500 {
            let mut cdb = [0u8; 16];
            cdb.iter_mut().for_each(|b| *b = rng.u8());
            let ius = [
                IuRepr::Cmd(CmdRepr {
                    sol_not: rng.u8(),
                    tag: rng.next_u64(),
                    lun: rng.next_u64(),
                    task_attr: rng.u8() & 7,
                    cdb,
                    additional_cdb: vec![rng.u8(); 4 * usize::from(rng.u8() % 4)],
                    data_out: random_descriptor(&mut rng, false),
                    data_in: random_descriptor(&mut rng, true),
                }),
                IuRepr::Rsp(RspRepr {
                    sol_not: rng.u8(),
                    req_lim_delta: rng.u32(),
                    tag: rng.next_u64(),
                    status: rng.u8(),
                    data_out_residual: ResidualCount::Overflow(rng.u32()),
                    data_in_residual: ResidualCount::Underflow(rng.u32()),
                    response_data: (rng.u8() & 1 == 0).then(|| vec![rng.u8(); 4]),
                    sense: (rng.u8() & 1 == 0).then(|| vec![rng.u8(); usize::from(rng.u8() % 96)]),
                }),
                IuRepr::TskMgmt(TskMgmtRepr {
                    sol_not: rng.u8(),
                    tag: rng.next_u64(),
                    lun: rng.next_u64(),
                    function: TaskManagementFunction::from_code(rng.u8()),
                    task_tag: rng.next_u64(),
                }),
                IuRepr::ILogout { tag: rng.next_u64() },
                IuRepr::TLogout(TLogoutRepr {
                    sol_not: rng.u8(),
                    reason: rng.u32(),
                    tag: rng.next_u64(),
                }),
                IuRepr::CredReq(CredReqRepr {
                    sol_not: rng.u8(),
                    req_lim_delta: rng.u32(),
                    tag: rng.next_u64(),
                }),
                IuRepr::CredRsp { tag: rng.next_u64() },
                IuRepr::AerReq(AerReqRepr {
                    sol_not: rng.u8(),
                    req_lim_delta: rng.u32(),
                    tag: rng.next_u64(),
                    lun: rng.next_u64(),
                    sense: vec![rng.u8(); usize::from(rng.u8() % 32)],
                }),
                IuRepr::AerRsp { tag: rng.next_u64() },
                IuRepr::LoginRej(LoginRejRepr {
                    reason: LoginRejReason::from_code(rng.u32()),
                    tag: rng.next_u64(),
                    buf_fmt: rng.u16(),
                }),
                IuRepr::LoginReq(LoginReqRepr {
                    tag: rng.next_u64(),
                    req_it_iu_len: rng.u32(),
                    req_buf_fmt: rng.u16(),
                    req_flags: rng.u8() & 0x81,
                    imm_data_offset: rng.u16(),
                    initiator_port_id: PortId(rng.bytes()),
                    target_port_id: PortId(rng.bytes()),
                }),
            ];
            for iu in ius {
                let bytes = iu.to_bytes();
                assert_eq!(parse_iu(&bytes).unwrap(), iu);
            }
        }
    }

    #[test]
    fn refuses_truncated_ius_of_every_kind() {
        let (_, cmd) = read_cmd();
        for n in 0..cmd.len() {
            assert!(parse_iu(&cmd[..n]).is_err(), "SRP_CMD of {n} bytes");
        }
        for op in [0x03u8, 0x80, 0x81, 0x41, 0x42, 0x82, 0x01] {
            let mut iu = [0u8; 15];
            iu[0] = op;
            assert!(matches!(parse_iu(&iu), Err(WireError::Truncated { .. })), "{op:#x}");
        }
        assert!(matches!(
            parse_iu(&[0x55; 64]),
            Err(WireError::Malformed { field: "opcode", .. })
        ));
        // An indirect table announcing more in-IU entries than the IU holds.
        let mut bad = cmd;
        bad[5] = 0x02;
        bad[7] = 2;
        assert!(matches!(parse_iu(&bad), Err(WireError::Truncated { .. })));
        // Both overflow and underflow.
        let mut rsp = [0u8; 36];
        rsp[0] = 0xC1;
        rsp[18] = DIOVER | DIUNDER;
        assert!(matches!(parse_iu(&rsp), Err(WireError::Malformed { .. })));
        // A sense length that does not fit.
        rsp[18] = SNSVALID;
        rsp[28..32].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(parse_iu(&rsp), Err(WireError::Truncated { .. })));
        assert!(parse_iu(&[]).is_err());
    }
}
