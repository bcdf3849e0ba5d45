//! Doorbells (reference sheet §6.1): the 64-bit queue doorbell word (SQ/RQ/SRQ view
//! [`Doorbell`], CQ view [`CqDoorbell`]), the EQ doorbell word ([`EqDoorbell`]) and where
//! they are written.
//!
//! A doorbell is one 64-bit little-endian store. SQ, RQ, SRQ and CQ doorbells go to
//! [`DB_OFFSET`] of a doorbell (UAR) page, EQ doorbells to [`EQ_DB_OFFSET`]; UAR page *n*
//! starts at `n × DB_PAGE_SIZE`. (HIP09 direct-WQE QPs ring their SQ doorbell at the start
//! of the QP's direct-WQE window instead; rnic's direct WQE is the page's
//! [`DWQE_OFFSET`] window followed by an SQ doorbell with `FLAG` set, docs/hw-interface.md.)

use crate::bits::Layout;
use crate::layout;

/// Offset of the SQ/RQ/SRQ/CQ doorbell register inside a doorbell page
/// (`ROCEE_DB_SQ_L_0_REG`, user `ROCEE_VF_DB_CFG0_OFFSET`).
pub const DB_OFFSET: u64 = 0x230;
/// Offset of the EQ doorbell register inside a doorbell page (`ROCEE_VF_EQ_DB_CFG0_REG`).
pub const EQ_DB_OFFSET: u64 = 0x238;
/// Size of (and stride between) doorbell pages (`DB_REG_OFFSET`).
pub const DB_PAGE_SIZE: u64 = 0x1000;
/// Offset of the direct-WQE window inside a doorbell page: the 64-byte SQ WQE is written
/// there as eight 8-byte stores, then the SQ doorbell with `FLAG` set hands it to the
/// device with the producer index (rnic's form of hns' direct WQE, sheet §6.4).
pub const DWQE_OFFSET: u64 = 0x400;
/// Size of the direct-WQE window: one SQ WQE.
pub const DWQE_SIZE: u64 = 64;

const _: () = assert!(<Doorbell as Layout>::SIZE == 8);
const _: () = assert!(<CqDoorbell as Layout>::SIZE == 8);
const _: () = assert!(<EqDoorbell as Layout>::SIZE == 8);

/// Why a doorbell value could not be interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DoorbellError {
    /// `CMD` of a queue doorbell is not 0..=4.
    #[error("unknown doorbell command {0:#x}")]
    UnknownCommand(u8),
    /// `CMD` of an EQ doorbell is not 0..=3.
    #[error("unknown EQ doorbell command {0:#x}")]
    UnknownEqCommand(u8),
}

/// `CMD` of a queue doorbell: which queue the doorbell is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DoorbellCommand {
    /// SQ producer index (`TAG` = QPN, [`Doorbell`] view).
    Sq = 0,
    /// RQ producer index (`TAG` = QPN), only when the QP has no RQ record doorbell.
    Rq = 1,
    /// SRQ index-queue producer index (`TAG` = SRQN), only without an SRQ record doorbell.
    Srq = 2,
    /// CQ consumer index update (`CQ_DB` / user `CQ_DB_PTR`; [`CqDoorbell`] view), only
    /// without a CQ record doorbell.
    CqSetCi = 3,
    /// CQ arm request (`CQ_DB_NOTIFY` / user `CQ_DB_NTR`; [`CqDoorbell`] view).
    CqArm = 4,
}

impl DoorbellCommand {
    /// Every command, in value order.
    pub const ALL: [DoorbellCommand; 5] = [Self::Sq, Self::Rq, Self::Srq, Self::CqSetCi, Self::CqArm];

    /// Whether the doorbell word is to be read as a [`CqDoorbell`].
    pub fn is_cq(self) -> bool {
        matches!(self, Self::CqSetCi | Self::CqArm)
    }
}

impl From<DoorbellCommand> for u8 {
    fn from(value: DoorbellCommand) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for DoorbellCommand {
    type Error = DoorbellError;

    fn try_from(value: u8) -> Result<Self, DoorbellError> {
        Self::ALL
            .into_iter()
            .find(|c| *c as u8 == value)
            .ok_or(DoorbellError::UnknownCommand(value))
    }
}

/// `CMD` of an EQ doorbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EqDoorbellCommand {
    /// Update the AEQ consumer index only.
    AeqCi = 0,
    /// Update the AEQ consumer index and re-arm the AEQ.
    AeqCiArm = 1,
    /// Update the CEQ consumer index only.
    CeqCi = 2,
    /// Update the CEQ consumer index and re-arm the CEQ.
    CeqCiArm = 3,
}

impl EqDoorbellCommand {
    /// Every command, in value order.
    pub const ALL: [EqDoorbellCommand; 4] = [Self::AeqCi, Self::AeqCiArm, Self::CeqCi, Self::CeqCiArm];
}

impl From<EqDoorbellCommand> for u8 {
    fn from(value: EqDoorbellCommand) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for EqDoorbellCommand {
    type Error = DoorbellError;

    fn try_from(value: u8) -> Result<Self, DoorbellError> {
        Self::ALL
            .into_iter()
            .find(|c| *c as u8 == value)
            .ok_or(DoorbellError::UnknownEqCommand(value))
    }
}

layout! {
    /// Queue doorbell word (`hns_roce_v2_db`), SQ / RQ / SRQ view (`CMD` 0, 1, 2).
    /// CQ doorbells (`CMD` 3, 4) use the [`CqDoorbell`] view of the same 64 bits.
    pub struct Doorbell[8] {
        /// Queue number: QPN for SQ/RQ, SRQN for SRQ.
        TAG / tag / set_tag: u32 = 23:0,
        /// A [`DoorbellCommand`] value.
        CMD / command / set_command: u8 = 27:24,
        /// 0 for normal doorbells (1 marks a direct WQE).
        FLAG / flag / set_flag: bool = 31:31,
        /// Producer index (SQ head, RQ head or SRQ index-queue head), free-running 16 bits.
        PI / producer_index / set_producer_index: u16 = 47:32,
        /// SQ doorbell: service level of the QP (0..=7).
        SL / service_level / set_service_level: u8 = 50:48,
    }
}

impl Doorbell {
    /// SQ doorbell: `TAG = qpn, CMD = 0, PI = sq head, SL = service level`.
    pub fn sq(qpn: u32, producer_index: u16, service_level: u8) -> Self {
        let mut db = Self::zeroed();
        db.set_tag(qpn);
        db.set_command(DoorbellCommand::Sq.into());
        db.set_producer_index(producer_index);
        db.set_service_level(service_level);
        db
    }

    /// RQ doorbell: `TAG = qpn, CMD = 1, PI = rq head`.
    pub fn rq(qpn: u32, producer_index: u16) -> Self {
        let mut db = Self::zeroed();
        db.set_tag(qpn);
        db.set_command(DoorbellCommand::Rq.into());
        db.set_producer_index(producer_index);
        db
    }

    /// SRQ doorbell: `TAG = srqn, CMD = 2, PI = index-queue head`.
    pub fn srq(srqn: u32, producer_index: u16) -> Self {
        let mut db = Self::zeroed();
        db.set_tag(srqn);
        db.set_command(DoorbellCommand::Srq.into());
        db.set_producer_index(producer_index);
        db
    }

    /// The doorbell as the 64-bit value of the store (little-endian layout).
    pub fn as_u64(&self) -> u64 {
        u64::from_le_bytes(self.0)
    }

    /// The doorbell carried by a 64-bit store.
    pub fn from_u64(value: u64) -> Self {
        Self(value.to_le_bytes())
    }
}

layout! {
    /// Queue doorbell word, CQ view (`CMD` 3 set-CI, 4 arm). Shares `TAG`, `CMD` and `FLAG`
    /// with [`Doorbell`]; `CQ_CI` overlaps `PI` and `SL`.
    pub struct CqDoorbell[8] {
        /// CQ number.
        TAG / tag / set_tag: u32 = 23:0,
        /// A [`DoorbellCommand`] value (3 or 4).
        CMD / command / set_command: u8 = 27:24,
        /// 0 for normal doorbells.
        FLAG / flag / set_flag: bool = 31:31,
        /// CQ consumer index, free-running 24 bits.
        CQ_CI / consumer_index / set_consumer_index: u32 = 55:32,
        /// Arm type: 1 = solicited completions only, 0 = next completion.
        CQ_NOTIFY / solicited_only / set_solicited_only: bool = 56:56,
        /// Arm sequence number (starts at 1, +1 for every consumed CQ event; 1 for set-CI).
        CQ_CMD_SN / command_sequence / set_command_sequence: u8 = 58:57,
    }
}

impl CqDoorbell {
    /// CQ set-CI doorbell: `TAG = cqn, CMD = 3, CQ_CI = ci, CQ_CMD_SN = 1`.
    pub fn update(cqn: u32, consumer_index: u32) -> Self {
        let mut db = Self::zeroed();
        db.set_tag(cqn);
        db.set_command(DoorbellCommand::CqSetCi.into());
        db.set_consumer_index(consumer_index);
        db.set_command_sequence(1);
        db
    }

    /// CQ arm doorbell: `TAG = cqn, CMD = 4, CQ_CI = ci, CQ_CMD_SN = sn, CQ_NOTIFY`.
    pub fn arm(cqn: u32, consumer_index: u32, sequence: u8, solicited_only: bool) -> Self {
        let mut db = Self::zeroed();
        db.set_tag(cqn);
        db.set_command(DoorbellCommand::CqArm.into());
        db.set_consumer_index(consumer_index);
        db.set_command_sequence(sequence);
        db.set_solicited_only(solicited_only);
        db
    }

    /// The doorbell as the 64-bit value of the store (little-endian layout).
    pub fn as_u64(&self) -> u64 {
        u64::from_le_bytes(self.0)
    }

    /// The doorbell carried by a 64-bit store.
    pub fn from_u64(value: u64) -> Self {
        Self(value.to_le_bytes())
    }
}

layout! {
    /// EQ doorbell word (written at [`EQ_DB_OFFSET`]): publishes an EQ consumer index.
    pub struct EqDoorbell[8] {
        /// EQ number (used for CEQs).
        TAG / tag / set_tag: u8 = 7:0,
        /// An [`EqDoorbellCommand`] value.
        CMD / command / set_command: u8 = 17:16,
        /// EQ consumer index (the device treats it modulo 2 × depth).
        CI / consumer_index / set_consumer_index: u32 = 55:32,
    }
}

impl EqDoorbell {
    /// EQ doorbell: `TAG = eqn, CMD = command, CI = consumer index`.
    pub fn new(command: EqDoorbellCommand, eqn: u8, consumer_index: u32) -> Self {
        let mut db = Self::zeroed();
        db.set_tag(eqn);
        db.set_command(command.into());
        db.set_consumer_index(consumer_index);
        db
    }

    /// The doorbell as the 64-bit value of the store (little-endian layout).
    pub fn as_u64(&self) -> u64 {
        u64::from_le_bytes(self.0)
    }

    /// The doorbell carried by a 64-bit store.
    pub fn from_u64(value: u64) -> Self {
        Self(value.to_le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{check_fields, LayoutError};

    /// Tiny xorshift64 generator so the round-trip tests are reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Sets every field of `L` to a seeded pseudo-random value, emits, parses back and
    /// checks that every field reads back unchanged; also checks the field table.
    fn assert_round_trip<L: Layout>(seed: u64) {
        check_fields(L::NAME, L::SIZE, L::FIELDS).unwrap();
        let mut rng = XorShift(seed);
        let mut value = L::zeroed();
        let expected: Vec<u64> = L::FIELDS
            .iter()
            .map(|field| {
                let v = rng.next() & field.max_value();
                field.set(value.bytes_mut(), v);
                v
            })
            .collect();
        let mut wire = vec![0u8; L::SIZE];
        value.emit(&mut wire).unwrap();
        let parsed = L::parse(&wire).unwrap();
        for (field, v) in L::FIELDS.iter().zip(expected) {
            assert_eq!(field.get(parsed.bytes()), v, "{}.{}", L::NAME, field.name);
        }
    }

    // ---- Doorbell ----

    /// TAG 0x0ABCDE, CMD 2, FLAG, PI 0x1234, SL 5.
    const DB_BYTES: [u8; 8] = [0xDE, 0xBC, 0x0A, 0x82, 0x34, 0x12, 0x05, 0x00];

    #[test]
    fn doorbell_parses_known_bytes() {
        let db = Doorbell::parse(&DB_BYTES).unwrap();
        assert_eq!(db.tag(), 0x0A_BCDE);
        assert_eq!(db.command(), 2);
        assert!(db.flag());
        assert_eq!(db.producer_index(), 0x1234);
        assert_eq!(db.service_level(), 5);
    }

    #[test]
    fn doorbell_emits_known_bytes() {
        let mut db = Doorbell::zeroed();
        db.set_tag(0x0A_BCDE);
        db.set_command(2);
        db.set_flag(true);
        db.set_producer_index(0x1234);
        db.set_service_level(5);
        assert_eq!(db.0, DB_BYTES);
    }

    #[test]
    fn doorbell_round_trips_every_field() {
        assert_round_trip::<Doorbell>(0x5EED_0031);
    }

    #[test]
    fn doorbell_parse_rejects_truncated_input() {
        assert_eq!(
            Doorbell::parse(&DB_BYTES[..7]),
            Err(LayoutError::Truncated {
                layout: "Doorbell",
                expected: 8,
                actual: 7
            })
        );
    }

    #[test]
    fn queue_doorbells_as_64_bit_stores() {
        // SQ: QPN 0x21, head 0x10, SL 3.
        assert_eq!(Doorbell::sq(0x21, 0x10, 3).as_u64(), 0x0003_0010_0000_0021);
        // RQ: CMD 1 in bits 27:24.
        assert_eq!(Doorbell::rq(0x21, 0xFFFF).as_u64(), 0x0000_FFFF_0100_0021);
        // SRQ: CMD 2.
        assert_eq!(Doorbell::srq(7, 2).as_u64(), 0x0000_0002_0200_0007);
        let db = Doorbell::from_u64(0x0003_0010_0000_0021);
        assert_eq!(db, Doorbell::sq(0x21, 0x10, 3));
        assert_eq!(Doorbell::from_u64(u64::from_le_bytes(DB_BYTES)).0, DB_BYTES);
    }

    // ---- CqDoorbell ----

    /// TAG 0x42, CMD 4 (arm), CQ_CI 0xABCDEF, notify solicited, CMD_SN 3.
    const CQ_DB_BYTES: [u8; 8] = [0x42, 0x00, 0x00, 0x04, 0xEF, 0xCD, 0xAB, 0x07];

    #[test]
    fn cq_doorbell_parses_known_bytes() {
        let db = CqDoorbell::parse(&CQ_DB_BYTES).unwrap();
        assert_eq!(db.tag(), 0x42);
        assert_eq!(db.command(), DoorbellCommand::CqArm as u8);
        assert!(!db.flag());
        assert_eq!(db.consumer_index(), 0xAB_CDEF);
        assert!(db.solicited_only());
        assert_eq!(db.command_sequence(), 3);
    }

    #[test]
    fn cq_doorbell_emits_known_bytes() {
        let mut db = CqDoorbell::zeroed();
        db.set_tag(0x42);
        db.set_command(DoorbellCommand::CqArm.into());
        db.set_consumer_index(0xAB_CDEF);
        db.set_solicited_only(true);
        db.set_command_sequence(3);
        assert_eq!(db.0, CQ_DB_BYTES);
        assert_eq!(CqDoorbell::arm(0x42, 0xAB_CDEF, 3, true), db);
    }

    #[test]
    fn cq_doorbell_round_trips_every_field() {
        assert_round_trip::<CqDoorbell>(0x5EED_0032);
    }

    #[test]
    fn cq_doorbell_parse_rejects_truncated_input() {
        assert_eq!(
            CqDoorbell::parse(&CQ_DB_BYTES[..7]),
            Err(LayoutError::Truncated {
                layout: "CqDoorbell",
                expected: 8,
                actual: 7
            })
        );
    }

    #[test]
    fn cq_set_ci_doorbell_uses_command_3_and_sequence_1() {
        assert_eq!(CqDoorbell::update(5, 0x12_3456).as_u64(), 0x0212_3456_0300_0005);
        assert_eq!(
            CqDoorbell::from_u64(0x0212_3456_0300_0005),
            CqDoorbell::update(5, 0x12_3456)
        );
    }

    #[test]
    fn both_doorbell_views_share_tag_command_and_flag() {
        for name in ["TAG", "CMD", "FLAG"] {
            assert_eq!(
                Doorbell::field(name).map(|f| (f.hi, f.lo)),
                CqDoorbell::field(name).map(|f| (f.hi, f.lo)),
                "{name}"
            );
        }
    }

    // ---- EqDoorbell ----

    /// TAG 5, CMD 3 (CEQ CI + arm), CI 0x100.
    const EQ_DB_BYTES: [u8; 8] = [0x05, 0x00, 0x03, 0x00, 0x00, 0x01, 0x00, 0x00];

    #[test]
    fn eq_doorbell_parses_known_bytes() {
        let db = EqDoorbell::parse(&EQ_DB_BYTES).unwrap();
        assert_eq!(db.tag(), 5);
        assert_eq!(db.command(), EqDoorbellCommand::CeqCiArm as u8);
        assert_eq!(db.consumer_index(), 0x100);
    }

    #[test]
    fn eq_doorbell_emits_known_bytes() {
        let mut db = EqDoorbell::zeroed();
        db.set_tag(5);
        db.set_command(3);
        db.set_consumer_index(0x100);
        assert_eq!(db.0, EQ_DB_BYTES);
        assert_eq!(EqDoorbell::new(EqDoorbellCommand::CeqCiArm, 5, 0x100), db);
        assert_eq!(db.as_u64(), 0x0000_0100_0003_0005);
        assert_eq!(EqDoorbell::from_u64(0x0000_0100_0003_0005), db);
    }

    #[test]
    fn eq_doorbell_round_trips_every_field() {
        assert_round_trip::<EqDoorbell>(0x5EED_0033);
    }

    #[test]
    fn eq_doorbell_parse_rejects_truncated_input() {
        assert_eq!(
            EqDoorbell::parse(&EQ_DB_BYTES[..7]),
            Err(LayoutError::Truncated {
                layout: "EqDoorbell",
                expected: 8,
                actual: 7
            })
        );
    }

    // ---- commands and offsets ----

    #[test]
    fn doorbell_commands_have_the_hns_values() {
        let table = [
            (0, DoorbellCommand::Sq),
            (1, DoorbellCommand::Rq),
            (2, DoorbellCommand::Srq),
            (3, DoorbellCommand::CqSetCi),
            (4, DoorbellCommand::CqArm),
        ];
        assert_eq!(table.len(), DoorbellCommand::ALL.len());
        for (value, cmd) in table {
            assert_eq!(u8::from(cmd), value);
            assert_eq!(DoorbellCommand::try_from(value), Ok(cmd));
            assert_eq!(cmd.is_cq(), value >= 3);
        }
        for value in 5..=u8::MAX {
            assert_eq!(
                DoorbellCommand::try_from(value),
                Err(DoorbellError::UnknownCommand(value))
            );
        }
    }

    #[test]
    fn eq_doorbell_commands_have_the_hns_values() {
        let table = [
            (0, EqDoorbellCommand::AeqCi),
            (1, EqDoorbellCommand::AeqCiArm),
            (2, EqDoorbellCommand::CeqCi),
            (3, EqDoorbellCommand::CeqCiArm),
        ];
        assert_eq!(table.len(), EqDoorbellCommand::ALL.len());
        for (value, cmd) in table {
            assert_eq!(u8::from(cmd), value);
            assert_eq!(EqDoorbellCommand::try_from(value), Ok(cmd));
        }
        for value in 4..=u8::MAX {
            assert_eq!(
                EqDoorbellCommand::try_from(value),
                Err(DoorbellError::UnknownEqCommand(value))
            );
        }
    }

    #[test]
    fn doorbell_registers_sit_inside_the_first_page() {
        assert_eq!(DB_OFFSET, 0x230);
        assert_eq!(EQ_DB_OFFSET, 0x238);
        assert_eq!(DB_PAGE_SIZE, 0x1000);
        const { assert!(EQ_DB_OFFSET + 8 <= DB_PAGE_SIZE) };
    }
}
