//! EQ context (`Eqc`, 64 bytes), carried by CREATE/MODIFY/QUERY_AEQC (0x80..0x82) and
//! CREATE/MODIFY/QUERY_CEQC (0x90..0x92). The EQC is not a HEM table: it only travels in
//! the mailbox.
//!
//! Driver values at create: `EQ_ST` = 1, `ARM_ST` = 3 (always armed), `EQN`, `SHIFT`,
//! buffer root/pages; `EQE_CNT`, `EQ_PROD_INDX`, `EQE_REPORT_TIMER`, `MSI_INDX`,
//! `EQ_CONS_INDX`, `OVER_IGNORE`, `COALESCE` = 0; moderation from `EQ_MAX_CNT`/`EQ_PERIOD`.

use super::{ContextError, EqArmState, EqState, EqeSize};

crate::layout! {
    /// EQ context, 64 bytes (hns `struct hns_roce_eq_context`).
    pub struct Eqc[64] {
        /// EQ state: 0 invalid, 1 valid, 2 overflow, 3 failure; see `EqState`.
        EQ_ST / eq_state_raw / set_eq_state_raw: u8 = 1:0,
        /// EQE buffer hop number: 0 = direct, 1..3 BT levels (HIP08 driver 2, HIP09 1).
        EQE_HOP_NUM / eqe_hop_number / set_eqe_hop_number: u8 = 3:2,
        /// Ignore overflow instead of reporting it (written 0).
        OVER_IGNORE / overflow_ignore / set_overflow_ignore: bool = 4:4,
        /// Coalescing enable (written 0).
        COALESCE / coalesce / set_coalesce: bool = 5:5,
        /// Arm state: 0 fired, 1 armed, 3 always armed; see `EqArmState`.
        ARM_ST / arm_state_raw / set_arm_state_raw: u8 = 7:6,
        /// EQ number (8 bits).
        EQN / eq_number / set_eq_number: u8 = 15:8,
        /// EQE count for coalescing (hardware state; written 0).
        EQE_CNT / eqe_count / set_eqe_count: u16 = 31:16,
        /// EQE buffer BT page size, encoded page_shift − 12.
        EQE_BA_PG_SZ / eqe_ba_page_size / set_eqe_ba_page_size: u8 = 35:32,
        /// EQE buffer data page size, encoded page_shift − 12.
        EQE_BUF_PG_SZ / eqe_buffer_page_size / set_eqe_buffer_page_size: u8 = 39:36,
        /// Producer index: EQEs written by the device (24-bit free-running count; written 0).
        EQ_PROD_INDX / producer_index / set_producer_index: u32 = 63:40,
        /// Coalescing: EQEs per interrupt.
        EQ_MAX_CNT / max_count / set_max_count: u16 = 79:64,
        /// Coalescing period in µs (HIP08 driver caps at 65 and multiplies by 1000).
        EQ_PERIOD / period / set_period: u16 = 95:80,
        /// Coalescing report timer (hardware state; written 0).
        EQE_REPORT_TIMER / eqe_report_timer / set_eqe_report_timer: u32 = 127:96,
        /// EQE buffer root BT address >> 3 (hns EQE_BA_L/_H).
        EQE_BA / eqe_base_address / set_eqe_base_address: u64 = 188:128,
        /// log2(EQ depth in EQEs).
        SHIFT / shift / set_shift: u8 = 199:192,
        /// MSI-X index (written 0; vectors are bound to EQ numbers).
        MSI_INDX / msi_index / set_msi_index: u8 = 207:200,
        /// First EQE page address >> 12 (hns CUR_EQE_BA_L 16 b / _M 32 b / _H 4 b).
        CUR_EQE_BA / current_eqe_address / set_current_eqe_address: u64 = 259:208,
        /// Consumer index last published by software (24-bit; written 0).
        EQ_CONS_INDX / consumer_index / set_consumer_index: u32 = 287:264,
        /// Second EQE page address >> 12 (hns NEX_EQE_BA_L/_H).
        NEX_EQE_BA / next_eqe_address / set_next_eqe_address: u64 = 339:288,
        /// EQE size: 0 = CEQE 4 B / AEQE 16 B, 1 = 64 B; see `EqeSize`.
        EQE_SIZE / eqe_size_raw / set_eqe_size_raw: u8 = 341:340,
    }
}

impl Eqc {
    /// `EQ_ST` as an [`EqState`].
    pub fn eq_state(&self) -> Result<EqState, ContextError> {
        EqState::try_from(self.eq_state_raw())
    }

    /// Sets `EQ_ST`.
    pub fn set_eq_state(&mut self, state: EqState) {
        self.set_eq_state_raw(state.into());
    }

    /// `ARM_ST` as an [`EqArmState`].
    pub fn arm_state(&self) -> Result<EqArmState, ContextError> {
        EqArmState::try_from(self.arm_state_raw())
    }

    /// Sets `ARM_ST`.
    pub fn set_arm_state(&mut self, state: EqArmState) {
        self.set_arm_state_raw(state.into());
    }

    /// `EQE_SIZE` as an [`EqeSize`].
    pub fn eqe_size(&self) -> Result<EqeSize, ContextError> {
        EqeSize::try_from(self.eqe_size_raw())
    }

    /// Sets `EQE_SIZE`.
    pub fn set_eqe_size(&mut self, size: EqeSize) {
        self.set_eqe_size_raw(size.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{Layout, LayoutError};
    use crate::context::testutil;
    use crate::context::EQC_SIZE;

    /// An EQC with a handful of fields set, written byte by byte from the bit positions.
    fn known_bytes() -> [u8; EQC_SIZE] {
        let mut b = [0u8; EQC_SIZE];
        // Byte 0: EQ_ST 1:0 = 1, EQE_HOP_NUM 3:2 = 1, OVER_IGNORE 4 = 1, ARM_ST 7:6 = 3 -> 0xD5.
        b[0] = 0xD5;
        // Byte 1: EQN = 0x12. Byte 4: EQE_BA_PG_SZ 35:32 = 0, EQE_BUF_PG_SZ 39:36 = 1.
        b[1] = 0x12;
        b[4] = 0x10;
        // Bytes 16..20: EQE_BA 188:128 = 0x1000_0000. Byte 24: SHIFT = 12.
        b[16..20].copy_from_slice(&[0x00, 0x00, 0x00, 0x10]);
        b[24] = 0x0C;
        // Bits 259:208 CUR_EQE_BA = 0x12_3456_7000 >> 12 = 0x123_4567, LE from byte 26
        // (hns L = 0x4567 in bytes 26..28, M = 0x123 in bytes 28..32).
        b[26..30].copy_from_slice(&[0x67, 0x45, 0x23, 0x01]);
        // Bytes 33..36: EQ_CONS_INDX 287:264 = 0x000100.
        b[33..36].copy_from_slice(&[0x00, 0x01, 0x00]);
        // Bytes 36..40: NEX_EQE_BA 339:288 = 0x123_4568.
        b[36..40].copy_from_slice(&[0x68, 0x45, 0x23, 0x01]);
        // Byte 42 bits 5:4: EQE_SIZE 341:340 = 1.
        b[42] = 0x10;
        b
    }

    #[test]
    fn parses_known_bytes() {
        let e = Eqc::parse(&known_bytes()).unwrap();
        assert_eq!(e.eq_state(), Ok(EqState::Valid));
        assert_eq!(e.eqe_hop_number(), 1);
        assert!(e.overflow_ignore());
        assert!(!e.coalesce());
        assert_eq!(e.arm_state(), Ok(EqArmState::AlwaysArmed));
        assert_eq!(e.eq_number(), 0x12);
        assert_eq!(e.eqe_ba_page_size(), 0);
        assert_eq!(e.eqe_buffer_page_size(), 1);
        assert_eq!(e.eqe_base_address(), 0x1000_0000);
        assert_eq!(e.shift(), 12);
        assert_eq!(e.current_eqe_address() << 12, 0x12_3456_7000);
        assert_eq!(e.consumer_index(), 0x100);
        assert_eq!(e.next_eqe_address(), 0x123_4568);
        assert_eq!(e.eqe_size(), Ok(EqeSize::Bytes64));
    }

    #[test]
    fn emits_known_bytes() {
        let mut e = Eqc::zeroed();
        e.set_eq_state(EqState::Valid);
        e.set_eqe_hop_number(1);
        e.set_overflow_ignore(true);
        e.set_arm_state(EqArmState::AlwaysArmed);
        e.set_eq_number(0x12);
        e.set_eqe_buffer_page_size(1);
        e.set_eqe_base_address(0x1000_0000);
        e.set_shift(12);
        e.set_current_eqe_address(0x12_3456_7000 >> 12);
        e.set_consumer_index(0x100);
        e.set_next_eqe_address(0x123_4568);
        e.set_eqe_size(EqeSize::Bytes64);
        assert_eq!(e.bytes(), &known_bytes()[..]);
    }

    #[test]
    fn round_trips_every_field() {
        testutil::assert_round_trips_every_field::<Eqc>(0xE9C0_2024_0005);
    }

    #[test]
    fn rejects_truncated_input() {
        assert_eq!(
            Eqc::parse(&known_bytes()[..EQC_SIZE - 1]),
            Err(LayoutError::Truncated {
                layout: "Eqc",
                expected: 64,
                actual: 63
            })
        );
        testutil::assert_rejects_truncated::<Eqc>();
    }

    #[test]
    fn typed_accessors_reject_undefined_values() {
        let mut e = Eqc::zeroed();
        assert_eq!(e.eq_state(), Ok(EqState::Invalid));
        e.set_arm_state_raw(2);
        assert_eq!(
            e.arm_state(),
            Err(ContextError::InvalidValue {
                field: "ARM_ST",
                value: 2
            })
        );
        e.set_eqe_size_raw(3);
        assert_eq!(
            e.eqe_size(),
            Err(ContextError::InvalidValue {
                field: "EQE_SIZE",
                value: 3
            })
        );
        e.set_eq_state_raw(2);
        assert_eq!(e.eq_state(), Ok(EqState::Overflow));
    }
}
