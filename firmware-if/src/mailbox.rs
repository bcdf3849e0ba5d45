//! Mailbox commands, carried by command-queue opcode
//! [`PostMailbox`](crate::cmdq::Opcode::PostMailbox) (hns §3).
//!
//! A mailbox command names an operation ([`MailboxOpcode`]), an object index (`tag`:
//! QPN, CQN, SRQN, MPT index, EQN) and two 64-bit parameters: the DMA address of a
//! 4 KiB mailbox buffer holding a context (create/modify: `in_param`; query: `out_param`)
//! or, for base-address-table writes, the table address itself (`in_param`).
//!
//! Completion is polled with [`QueryMailboxStatus`](crate::cmdq::Opcode::QueryMailboxStatus)
//! (token `0xFFFF`, events off) or reported as an AEQE of type `MB` (0x13) carrying the
//! token, the status and `out_param` when `event_enable` is set.

use crate::layout;

/// Size of a mailbox buffer in bytes (`HNS_ROCE_MAILBOX_SIZE`); it must be 4 KiB aligned.
pub const MAILBOX_BUFFER_SIZE: usize = 4096;
/// Token used for polled (not event-reported) mailbox commands.
pub const POLL_TOKEN: u16 = 0xFFFF;

layout! {
    /// POST_MB payload (`struct hns_roce_post_mbox`).
    pub struct PostMailbox[24] {
        /// Input parameter: mailbox buffer DMA address or base address (u64).
        IN_PARAM / in_param / set_in_param: u64 = 63:0,
        /// Output parameter: mailbox buffer DMA address for queries (u64).
        OUT_PARAM / out_param / set_out_param: u64 = 127:64,
        /// Mailbox opcode ([`MailboxOpcode`]).
        CMD / command / set_command: u8 = 135:128,
        /// Object index (QPN, CQN, SRQN, MPT index, EQN), 24 bits.
        TAG / tag / set_tag: u32 = 159:136,
        /// Token echoed in the completion event.
        TOKEN / token / set_token: u16 = 175:160,
        /// 1: report completion as an AEQE of type MB (0x13).
        EVENT_EN / event_enable / set_event_enable: bool = 176:176,
    }
}

layout! {
    /// QUERY_MB_ST response payload.
    pub struct MailboxStatus[24] {
        /// Completion status of the last mailbox command ([`MailboxCompletion`]).
        STATUS / status / set_status: u8 = 7:0,
        /// 1 while a mailbox command is executing.
        HW_RUN / busy / set_busy: bool = 31:31,
    }
}

/// Completion status of a mailbox command. hns documents only `1 = success`; the failure
/// values are rnic's own, so a driver can tell what it did wrong without reading logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MailboxCompletion {
    /// No mailbox command has completed since reset.
    None = 0,
    /// Success (hns value).
    Success = 1,
    /// The tag names an object index outside the table.
    InvalidIndex = 2,
    /// The object is not in a state that allows the command (e.g. create on a valid
    /// object, modify on a free one, illegal QP state transition).
    InvalidState = 3,
    /// A context field is out of range (the diagnostic names it).
    InvalidParameter = 4,
    /// A DMA address (mailbox buffer, base-address table, context table) is unreachable.
    DmaError = 5,
    /// Unknown mailbox opcode.
    UnknownCommand = 6,
    /// The context table for this object has no base address yet.
    NoContextTable = 7,
}

impl MailboxCompletion {
    /// Decodes a status byte; `None` for values not listed.
    pub fn from_raw(raw: u8) -> Option<Self> {
        use MailboxCompletion::*;
        [
            None,
            Success,
            InvalidIndex,
            InvalidState,
            InvalidParameter,
            DmaError,
            UnknownCommand,
            NoContextTable,
        ]
        .into_iter()
        .find(|c| *c as u8 == raw)
    }
}

/// Context tables addressed by base-address-table mailbox commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContextTable {
    /// QP contexts.
    Qpc,
    /// Memory protection table entries.
    Mpt,
    /// CQ contexts.
    Cqc,
    /// SRQ contexts.
    Srqc,
}

/// Kind of base-address-table command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BtCommand {
    /// Write the address of a level (`in_param`).
    Write,
    /// Read back the address of a level (`out_param` mailbox receives a u64).
    Read,
    /// Forget the level.
    Destroy,
}

/// Mailbox opcodes (hns `HNS_ROCE_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)] // the names are the hns names; see the module table in docs/register-map.md
pub enum MailboxOpcode {
    WriteQpcBt0 = 0x00,
    WriteQpcBt1 = 0x01,
    WriteQpcBt2 = 0x02,
    ReadQpcBt0 = 0x04,
    ReadQpcBt1 = 0x05,
    ReadQpcBt2 = 0x06,
    DestroyQpcBt0 = 0x08,
    DestroyQpcBt1 = 0x09,
    DestroyQpcBt2 = 0x0A,
    CreateMpt = 0x0D,
    DestroyMpt = 0x0F,
    WriteCqcBt0 = 0x10,
    WriteCqcBt1 = 0x11,
    WriteCqcBt2 = 0x12,
    ReadCqcBt0 = 0x14,
    ReadCqcBt1 = 0x15,
    CreateCqc = 0x16,
    DestroyCqc = 0x17,
    DestroyCqcBt0 = 0x18,
    DestroyCqcBt1 = 0x19,
    DestroyCqcBt2 = 0x1A,
    ReadCqcBt2 = 0x1B,
    WriteMptBt0 = 0x20,
    WriteMptBt1 = 0x21,
    WriteMptBt2 = 0x22,
    ReadMptBt0 = 0x24,
    ReadMptBt1 = 0x25,
    ReadMptBt2 = 0x26,
    DestroyMptBt0 = 0x28,
    DestroyMptBt1 = 0x29,
    DestroyMptBt2 = 0x2A,
    WriteSrqcBt0 = 0x30,
    WriteSrqcBt1 = 0x31,
    WriteSrqcBt2 = 0x32,
    ReadSrqcBt0 = 0x34,
    ReadSrqcBt1 = 0x35,
    ReadSrqcBt2 = 0x36,
    DestroySrqcBt0 = 0x38,
    DestroySrqcBt1 = 0x39,
    DestroySrqcBt2 = 0x3A,
    ModifyQpc = 0x41,
    QueryQpc = 0x42,
    ModifyCqc = 0x52,
    QueryCqc = 0x53,
    QueryMpt = 0x62,
    CreateSrq = 0x70,
    ModifySrqc = 0x72,
    QuerySrqc = 0x73,
    DestroySrq = 0x74,
    CreateAeqc = 0x80,
    ModifyAeqc = 0x81,
    QueryAeqc = 0x82,
    DestroyAeqc = 0x83,
    CreateCeqc = 0x90,
    ModifyCeqc = 0x91,
    QueryCeqc = 0x92,
    DestroyCeqc = 0x93,
}

impl MailboxOpcode {
    /// Every mailbox opcode the device implements.
    pub const ALL: [MailboxOpcode; 57] = {
        use MailboxOpcode::*;
        [
            WriteQpcBt0,
            WriteQpcBt1,
            WriteQpcBt2,
            ReadQpcBt0,
            ReadQpcBt1,
            ReadQpcBt2,
            DestroyQpcBt0,
            DestroyQpcBt1,
            DestroyQpcBt2,
            CreateMpt,
            DestroyMpt,
            WriteCqcBt0,
            WriteCqcBt1,
            WriteCqcBt2,
            ReadCqcBt0,
            ReadCqcBt1,
            CreateCqc,
            DestroyCqc,
            DestroyCqcBt0,
            DestroyCqcBt1,
            DestroyCqcBt2,
            ReadCqcBt2,
            WriteMptBt0,
            WriteMptBt1,
            WriteMptBt2,
            ReadMptBt0,
            ReadMptBt1,
            ReadMptBt2,
            DestroyMptBt0,
            DestroyMptBt1,
            DestroyMptBt2,
            WriteSrqcBt0,
            WriteSrqcBt1,
            WriteSrqcBt2,
            ReadSrqcBt0,
            ReadSrqcBt1,
            ReadSrqcBt2,
            DestroySrqcBt0,
            DestroySrqcBt1,
            DestroySrqcBt2,
            ModifyQpc,
            QueryQpc,
            ModifyCqc,
            QueryCqc,
            QueryMpt,
            CreateSrq,
            ModifySrqc,
            QuerySrqc,
            DestroySrq,
            CreateAeqc,
            ModifyAeqc,
            QueryAeqc,
            DestroyAeqc,
            CreateCeqc,
            ModifyCeqc,
            QueryCeqc,
            DestroyCeqc,
        ]
    };

    /// Decodes an opcode; `None` if the device does not implement it.
    pub fn from_raw(raw: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|op| *op as u8 == raw)
    }

    /// For base-address-table commands: the table, the kind and the level (0..=2).
    pub fn base_address_table(self) -> Option<(ContextTable, BtCommand, u8)> {
        use BtCommand::*;
        use ContextTable::*;
        use MailboxOpcode::*;
        Some(match self {
            WriteQpcBt0 => (Qpc, Write, 0),
            WriteQpcBt1 => (Qpc, Write, 1),
            WriteQpcBt2 => (Qpc, Write, 2),
            ReadQpcBt0 => (Qpc, Read, 0),
            ReadQpcBt1 => (Qpc, Read, 1),
            ReadQpcBt2 => (Qpc, Read, 2),
            DestroyQpcBt0 => (Qpc, Destroy, 0),
            DestroyQpcBt1 => (Qpc, Destroy, 1),
            DestroyQpcBt2 => (Qpc, Destroy, 2),
            WriteCqcBt0 => (Cqc, Write, 0),
            WriteCqcBt1 => (Cqc, Write, 1),
            WriteCqcBt2 => (Cqc, Write, 2),
            ReadCqcBt0 => (Cqc, Read, 0),
            ReadCqcBt1 => (Cqc, Read, 1),
            ReadCqcBt2 => (Cqc, Read, 2),
            DestroyCqcBt0 => (Cqc, Destroy, 0),
            DestroyCqcBt1 => (Cqc, Destroy, 1),
            DestroyCqcBt2 => (Cqc, Destroy, 2),
            WriteMptBt0 => (Mpt, Write, 0),
            WriteMptBt1 => (Mpt, Write, 1),
            WriteMptBt2 => (Mpt, Write, 2),
            ReadMptBt0 => (Mpt, Read, 0),
            ReadMptBt1 => (Mpt, Read, 1),
            ReadMptBt2 => (Mpt, Read, 2),
            DestroyMptBt0 => (Mpt, Destroy, 0),
            DestroyMptBt1 => (Mpt, Destroy, 1),
            DestroyMptBt2 => (Mpt, Destroy, 2),
            WriteSrqcBt0 => (Srqc, Write, 0),
            WriteSrqcBt1 => (Srqc, Write, 1),
            WriteSrqcBt2 => (Srqc, Write, 2),
            ReadSrqcBt0 => (Srqc, Read, 0),
            ReadSrqcBt1 => (Srqc, Read, 1),
            ReadSrqcBt2 => (Srqc, Read, 2),
            DestroySrqcBt0 => (Srqc, Destroy, 0),
            DestroySrqcBt1 => (Srqc, Destroy, 1),
            DestroySrqcBt2 => (Srqc, Destroy, 2),
            _ => return None,
        })
    }

    /// The base-address-table opcode for a table, kind and level (0..=2).
    pub fn for_base_address_table(table: ContextTable, command: BtCommand, level: u8) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|op| op.base_address_table() == Some((table, command, level)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{check_fields, Layout};

    const KNOWN_POST: [u8; 24] = [
        0x00, 0x10, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // in_param 0x1_0000_1000
        0, 0, 0, 0, 0, 0, 0, 0, // out_param 0
        0x41, 0x07, 0x00, 0x00, // cmd MODIFY_QPC, tag 7
        0xFF, 0xFF, 0x01, 0x00, // token 0xFFFF, event_en 1
    ];

    #[test]
    fn post_mailbox_parses_known_bytes() {
        let p = PostMailbox::parse(&KNOWN_POST).unwrap();
        assert_eq!(p.in_param(), 0x1_0000_1000);
        assert_eq!(p.out_param(), 0);
        assert_eq!(MailboxOpcode::from_raw(p.command()), Some(MailboxOpcode::ModifyQpc));
        assert_eq!(p.tag(), 7);
        assert_eq!(p.token(), POLL_TOKEN);
        assert!(p.event_enable());
    }

    #[test]
    fn post_mailbox_emits_known_bytes() {
        let mut p = PostMailbox::zeroed();
        p.set_in_param(0x1_0000_1000);
        p.set_command(MailboxOpcode::ModifyQpc as u8);
        p.set_tag(7);
        p.set_token(POLL_TOKEN);
        p.set_event_enable(true);
        assert_eq!(p.0, KNOWN_POST);
    }

    #[test]
    fn post_mailbox_round_trips_and_rejects_truncated_input() {
        check_fields(PostMailbox::NAME, PostMailbox::SIZE, PostMailbox::FIELDS).unwrap();
        check_fields(MailboxStatus::NAME, MailboxStatus::SIZE, MailboxStatus::FIELDS).unwrap();
        let p = PostMailbox::parse(&KNOWN_POST).unwrap();
        let mut out = [0u8; 24];
        p.emit(&mut out).unwrap();
        assert_eq!(PostMailbox::parse(&out).unwrap(), p);
        assert!(PostMailbox::parse(&KNOWN_POST[..23]).is_err());
    }

    #[test]
    fn mailbox_status_busy_is_bit_31() {
        let mut bytes = [0u8; 24];
        bytes[3] = 0x80;
        bytes[0] = 1;
        let s = MailboxStatus::parse(&bytes).unwrap();
        assert!(s.busy());
        assert_eq!(
            MailboxCompletion::from_raw(s.status()),
            Some(MailboxCompletion::Success)
        );
    }

    #[test]
    fn every_mailbox_opcode_decodes_to_itself() {
        for op in MailboxOpcode::ALL {
            assert_eq!(MailboxOpcode::from_raw(op as u8), Some(op));
        }
        assert_eq!(MailboxOpcode::from_raw(0x03), None);
        assert_eq!(MailboxOpcode::ReadCqcBt2 as u8, 0x1B, "hns quirk: READ_CQC_BT2 is 0x1B");
    }

    #[test]
    fn base_address_table_opcodes_map_both_ways() {
        for table in [
            ContextTable::Qpc,
            ContextTable::Mpt,
            ContextTable::Cqc,
            ContextTable::Srqc,
        ] {
            for command in [BtCommand::Write, BtCommand::Read, BtCommand::Destroy] {
                for level in 0..3 {
                    let op = MailboxOpcode::for_base_address_table(table, command, level).unwrap();
                    assert_eq!(op.base_address_table(), Some((table, command, level)));
                }
            }
        }
        assert_eq!(MailboxOpcode::ModifyQpc.base_address_table(), None);
    }

    #[test]
    fn mailbox_status_emits_known_bytes_round_trips_and_rejects_truncated_input() {
        let mut s = MailboxStatus::zeroed();
        s.set_busy(true);
        s.set_status(MailboxCompletion::InvalidState as u8);
        let mut expected = [0u8; 24];
        expected[0] = 3;
        expected[3] = 0x80;
        assert_eq!(s.0, expected);
        crate::context::testutil::assert_round_trips_every_field::<MailboxStatus>(21);
        crate::context::testutil::assert_round_trips_every_field::<PostMailbox>(22);
        crate::context::testutil::assert_rejects_truncated::<MailboxStatus>();
        crate::context::testutil::assert_rejects_truncated::<PostMailbox>();
    }
}
