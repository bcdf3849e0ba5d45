//! CQ context (`Cqc`, 64 bytes), carried by CREATE_CQC / MODIFY_CQC / QUERY_CQC.
//!
//! Create: `CQ_ST` = 1, `ARM_ST` = 0, `SHIFT`, `CEQN`, `CQN`, `CQE_SIZE`, buffer addresses
//! and page sizes, record doorbell; `CQ_MAX_CNT` = `CQ_PERIOD` = 0. MODIFY_CQC changes the
//! moderation fields (`CQ_MAX_CNT`, `CQ_PERIOD`) with the context ‖ mask rule.

use super::{ContextError, CqArmState, CqState, CqeSize};

crate::layout! {
    /// CQ context, 64 bytes (hns `struct hns_roce_v2_cq_context`).
    pub struct Cqc[64] {
        /// CQ state: 1 = valid; see `CqState`.
        CQ_ST / cq_state_raw / set_cq_state_raw: u8 = 1:0,
        /// Poll mode (hns POLL; meaning not documented, written 0).
        POLL / poll / set_poll: bool = 2:2,
        /// Solicited event flag (hns SE; written 0).
        SE / solicited_event / set_solicited_event: bool = 3:3,
        /// Ignore CQ overflow instead of reporting CQ_OVERFLOW (written 0).
        OVER_IGNORE / overflow_ignore / set_overflow_ignore: bool = 4:4,
        /// Arm state: 0 NO_ARMED, 2 REG_NXT_CEQE, 3 REG_NXT_SE_CEQE; see `CqArmState`.
        ARM_ST / arm_state_raw / set_arm_state_raw: u8 = 7:6,
        /// log2(CQ depth in CQEs).
        SHIFT / shift / set_shift: u8 = 12:8,
        /// Arm sequence number of the last arm doorbell (2 bits, doorbell CQ_CMD_SN).
        CMD_SN / command_sequence_number / set_command_sequence_number: u8 = 14:13,
        /// CEQ that receives this CQ's completion events (completion vector).
        CEQN / ceq_number / set_ceq_number: u16 = 23:15,
        /// CQ number (24 bits).
        CQN / cq_number / set_cq_number: u32 = 55:32,
        /// POE enable (HIP09 poll-offload engine; meaning not documented).
        POE_EN / poe_enable / set_poe_enable: bool = 56:56,
        /// POE number (HIP09; meaning not documented).
        POE_NUM / poe_number / set_poe_number: u8 = 58:57,
        /// CQE size: 0 = 32 B, 1 = 64 B; see `CqeSize`.
        CQE_SIZE / cqe_size_raw / set_cqe_size_raw: u8 = 60:59,
        /// CQE count mode (HIP09; meaning not documented).
        CQ_CNT_MODE / cq_count_mode / set_cq_count_mode: bool = 61:61,
        /// Cache stashing of CQEs (HIP09, cap STASH).
        STASH / stash / set_stash: bool = 63:63,
        /// First CQE page address >> 12 (hns CQE_CUR_BLK_ADDR_L/_H).
        CQE_CUR_BLK_ADDR / cqe_current_block_address / set_cqe_current_block_address: u64 = 115:64,
        /// POE queue id (HIP09; meaning not documented).
        POE_QID / poe_queue_id / set_poe_queue_id: u16 = 125:116,
        /// CQE buffer hop number: 0 = direct, 1..3 BT levels.
        CQE_HOP_NUM / cqe_hop_number / set_cqe_hop_number: u8 = 127:126,
        /// Second CQE page address >> 12 (hns CQE_NEX_BLK_ADDR_L/_H).
        CQE_NEX_BLK_ADDR / cqe_next_block_address / set_cqe_next_block_address: u64 = 179:128,
        /// CQE buffer BT page size, encoded page_shift − 12.
        CQE_BAR_PG_SZ / cqe_ba_page_size / set_cqe_ba_page_size: u8 = 187:184,
        /// CQE buffer data page size, encoded page_shift − 12.
        CQE_BUF_PG_SZ / cqe_buffer_page_size / set_cqe_buffer_page_size: u8 = 191:188,
        /// Producer index: CQEs written by the device (24-bit free-running count).
        CQ_PRODUCER_IDX / producer_index / set_producer_index: u32 = 215:192,
        /// Consumer index last published by software (24-bit free-running count).
        CQ_CONSUMER_IDX / consumer_index / set_consumer_index: u32 = 247:224,
        /// CQE buffer root BT address >> 3 (hns CQE_BA_L/_H).
        CQE_BA / cqe_base_address / set_cqe_base_address: u64 = 316:256,
        /// Record doorbell enable: the device reads the consumer index from host memory.
        DB_RECORD_EN / record_enable / set_record_enable: bool = 320:320,
        /// CQ record doorbell DMA address >> 1 (hns CQE_DB_RECORD_ADDR_L/_H); use `Cqc::record_address`.
        CQE_DB_RECORD_ADDR / record_address_raw / set_record_address_raw: u64 = 383:321,
        /// CQE count for moderation (hardware state; written 0).
        CQE_CNT / cqe_count / set_cqe_count: u32 = 407:384,
        /// Moderation: CQEs per event (0 = every CQE); HIP09 limit 0xFFFF.
        CQ_MAX_CNT / moderation_count / set_moderation_count: u16 = 431:416,
        /// Moderation: event period in µs (HIP08 driver multiplies by 1000, max 65).
        CQ_PERIOD / moderation_period / set_moderation_period: u16 = 447:432,
        /// Moderation report timer (hardware state; written 0).
        CQE_REPORT_TIMER / cqe_report_timer / set_cqe_report_timer: u32 = 471:448,
        /// Index of the last written CQE (hardware state; 8 bits, meaning not documented).
        WR_CQE_IDX / write_cqe_index / set_write_cqe_index: u8 = 479:472,
        /// Index of the last solicited CQE (hardware state; meaning not documented).
        SE_CQE_IDX / solicited_cqe_index / set_solicited_cqe_index: u32 = 503:480,
    }
}

impl Cqc {
    /// `CQ_ST` as a [`CqState`].
    pub fn cq_state(&self) -> Result<CqState, ContextError> {
        CqState::try_from(self.cq_state_raw())
    }

    /// Sets `CQ_ST`.
    pub fn set_cq_state(&mut self, state: CqState) {
        self.set_cq_state_raw(state.into());
    }

    /// `ARM_ST` as a [`CqArmState`].
    pub fn arm_state(&self) -> Result<CqArmState, ContextError> {
        CqArmState::try_from(self.arm_state_raw())
    }

    /// Sets `ARM_ST`.
    pub fn set_arm_state(&mut self, state: CqArmState) {
        self.set_arm_state_raw(state.into());
    }

    /// `CQE_SIZE` as a [`CqeSize`].
    pub fn cqe_size(&self) -> Result<CqeSize, ContextError> {
        CqeSize::try_from(self.cqe_size_raw())
    }

    /// Sets `CQE_SIZE`.
    pub fn set_cqe_size(&mut self, size: CqeSize) {
        self.set_cqe_size_raw(size.into());
    }

    /// The CQ record doorbell DMA address (`CQE_DB_RECORD_ADDR << 1`; bit 0 is `DB_RECORD_EN`).
    pub fn record_address(&self) -> u64 {
        self.record_address_raw() << 1
    }

    /// Sets the CQ record doorbell DMA address (bit 0 dropped). Does not touch `DB_RECORD_EN`.
    pub fn set_record_address(&mut self, address: u64) {
        self.set_record_address_raw(address >> 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{Layout, LayoutError};
    use crate::context::testutil;
    use crate::context::CQC_SIZE;

    /// A CQC with a handful of fields set, written byte by byte from the bit positions.
    fn known_bytes() -> [u8; CQC_SIZE] {
        let mut b = [0u8; CQC_SIZE];
        // Byte 0: CQ_ST 1:0 = 1, ARM_ST 7:6 = 2 -> 0x81.
        b[0] = 0x81;
        // Bits 12:8 SHIFT = 10, 14:13 CMD_SN = 1, 23:15 CEQN = 3:
        // byte 1 = 0x0A | 1 << 5 | (3 & 1) << 7 = 0xAA, byte 2 = 3 >> 1 = 0x01.
        b[1] = 0xAA;
        b[2] = 0x01;
        // Bytes 4..7: CQN 55:32 = 0x000405; byte 7 bits 4:3: CQE_SIZE 60:59 = 1 -> 0x08.
        b[4..7].copy_from_slice(&[0x05, 0x04, 0x00]);
        b[7] = 0x08;
        // Bytes 24..27: CQ_PRODUCER_IDX 215:192 = 0x123456; byte 28: CQ_CONSUMER_IDX = 0x10.
        b[24..27].copy_from_slice(&[0x56, 0x34, 0x12]);
        b[28] = 0x10;
        // Bytes 32..37: CQE_BA 316:256 = 0x2_0000_0001.
        b[32..37].copy_from_slice(&[0x01, 0x00, 0x00, 0x00, 0x02]);
        // Bytes 40..48: the word (addr & !1) | DB_RECORD_EN for addr 0x1000_0040.
        b[40..48].copy_from_slice(&[0x41, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00]);
        b
    }

    #[test]
    fn parses_known_bytes() {
        let c = Cqc::parse(&known_bytes()).unwrap();
        assert_eq!(c.cq_state(), Ok(CqState::Valid));
        assert_eq!(c.arm_state(), Ok(CqArmState::NextCompletion));
        assert!(!c.overflow_ignore());
        assert_eq!(c.shift(), 10);
        assert_eq!(c.command_sequence_number(), 1);
        assert_eq!(c.ceq_number(), 3);
        assert_eq!(c.cq_number(), 0x405);
        assert_eq!(c.cqe_size(), Ok(CqeSize::Bytes64));
        assert_eq!(c.producer_index(), 0x12_3456);
        assert_eq!(c.consumer_index(), 0x10);
        assert_eq!(c.cqe_base_address(), 0x2_0000_0001);
        assert!(c.record_enable());
        assert_eq!(c.record_address(), 0x1000_0040);
    }

    #[test]
    fn emits_known_bytes() {
        let mut c = Cqc::zeroed();
        c.set_cq_state(CqState::Valid);
        c.set_arm_state(CqArmState::NextCompletion);
        c.set_shift(10);
        c.set_command_sequence_number(1);
        c.set_ceq_number(3);
        c.set_cq_number(0x405);
        c.set_cqe_size(CqeSize::Bytes64);
        c.set_producer_index(0x12_3456);
        c.set_consumer_index(0x10);
        c.set_cqe_base_address(0x2_0000_0001);
        c.set_record_enable(true);
        c.set_record_address(0x1000_0040);
        assert_eq!(c.bytes(), &known_bytes()[..]);
    }

    #[test]
    fn round_trips_every_field() {
        testutil::assert_round_trips_every_field::<Cqc>(0xC0C0_2024_0002);
    }

    #[test]
    fn rejects_truncated_input() {
        assert_eq!(
            Cqc::parse(&known_bytes()[..CQC_SIZE - 1]),
            Err(LayoutError::Truncated {
                layout: "Cqc",
                expected: 64,
                actual: 63
            })
        );
        testutil::assert_rejects_truncated::<Cqc>();
    }

    #[test]
    fn typed_accessors_reject_undefined_values() {
        let mut c = Cqc::zeroed();
        c.set_arm_state_raw(1);
        assert_eq!(
            c.arm_state(),
            Err(ContextError::InvalidValue {
                field: "ARM_ST",
                value: 1
            })
        );
        c.set_cqe_size_raw(2);
        assert_eq!(
            c.cqe_size(),
            Err(ContextError::InvalidValue {
                field: "CQE_SIZE",
                value: 2
            })
        );
        assert_eq!(c.cq_state(), Ok(CqState::Invalid));
    }
}
