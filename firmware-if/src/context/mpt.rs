//! MPT entry (`Mpt`, 64 bytes): one memory region or memory window, carried by
//! CREATE_MPT / QUERY_MPT.
//!
//! Keys and table indices are related by an 8-bit rotation ([`index_to_key`],
//! [`key_to_index`]): with 24-bit indices the low byte of a key is 0 and `key >> 8` is the
//! MPT index. The slot used in mailbox commands is `index & (num_mtpts − 1)`.
//!
//! Register: fill the entry with `MPT_ST` = VALID (FRMR/MW: FREE), then CREATE_MPT with
//! tag = index. Deregister: DESTROY_MPT. Re-register: QUERY_MPT, DESTROY_MPT, rewrite the
//! changed fields, CREATE_MPT again.

use super::{ContextError, MptState};

crate::layout! {
    /// MPT entry, 64 bytes (hns `struct hns_roce_v2_mpt_entry`).
    pub struct Mpt[64] {
        /// Entry state: 1 = VALID, 2 = FREE; see `MptState`.
        MPT_ST / mpt_state_raw / set_mpt_state_raw: u8 = 1:0,
        /// PBL hop number: 0 = direct, 1..3 BT levels.
        PBL_HOP_NUM / pbl_hop_number / set_pbl_hop_number: u8 = 3:2,
        /// PBL BT page size, encoded page_shift − 12.
        PBL_BA_PG_SZ / pbl_ba_page_size / set_pbl_ba_page_size: u8 = 7:4,
        /// Protection domain number (24 bits).
        PD / protection_domain / set_protection_domain: u32 = 31:8,
        /// RA enable, set for FRMR (meaning not documented).
        RA_EN / ra_enable / set_ra_enable: bool = 32:32,
        /// Remote invalidate allowed (FRMR, MW).
        R_INV_EN / remote_invalidate_enable / set_remote_invalidate_enable: bool = 33:33,
        /// Local invalidate allowed.
        L_INV_EN / local_invalidate_enable / set_local_invalidate_enable: bool = 34:34,
        /// Memory windows may be bound to this MR (IB_ACCESS_MW_BIND).
        BIND_EN / bind_enable / set_bind_enable: bool = 35:35,
        /// Remote atomic access (IB_ACCESS_REMOTE_ATOMIC).
        ATOMIC_EN / atomic_enable / set_atomic_enable: bool = 36:36,
        /// Remote read access (IB_ACCESS_REMOTE_READ).
        RR_EN / remote_read_enable / set_remote_read_enable: bool = 37:37,
        /// Remote write access (IB_ACCESS_REMOTE_WRITE).
        RW_EN / remote_write_enable / set_remote_write_enable: bool = 38:38,
        /// Local write access (IB_ACCESS_LOCAL_WRITE; local read is implicit).
        LW_EN / local_write_enable / set_local_write_enable: bool = 39:39,
        /// Number of memory windows bound to this MR (24 bits).
        MW_CNT / mw_count / set_mw_count: u32 = 63:40,
        /// Fast-register enable (FRMR).
        FRE / fast_register_enable / set_fast_register_enable: bool = 64:64,
        /// Physical addressing: no translation, VA is the DMA address (DMA MRs).
        PA / physical_address / set_physical_address: bool = 65:65,
        /// Zero-based VA: offsets count from 0 instead of from VA.
        ZBVA / zero_based / set_zero_based: bool = 66:66,
        /// Shared MR.
        SHARE / share / set_share: bool = 67:67,
        /// Entry kind: 0 = MR, 1 = MW.
        MR_MW / memory_window / set_memory_window: bool = 68:68,
        /// Bound to a PD (FRMR / MW).
        BPD / bound_to_pd / set_bound_to_pd: bool = 69:69,
        /// Type 2 MW, bound to a QP.
        BQP / bound_to_qp / set_bound_to_qp: bool = 70:70,
        /// PA0 / PA1 hold valid first and second page addresses.
        INNER_PA_VLD / inner_pa_valid / set_inner_pa_valid: bool = 71:71,
        /// QP a type 2 MW is bound to (24 bits).
        MW_BIND_QPN / mw_bind_qpn / set_mw_bind_qpn: u32 = 95:72,
        /// L_Key of the MR a window is bound to.
        BOUND_LKEY / bound_lkey / set_bound_lkey: u32 = 127:96,
        /// Region length in bytes, 64 bits (hns len_l / len_h).
        LEN / length / set_length: u64 = 191:128,
        /// Key of the region (its L_Key, also its R_Key); index_to_key(index) plus a variant byte.
        LKEY / lkey / set_lkey: u32 = 223:192,
        /// Start IOVA of the region, 64 bits (hns va_l / va_h).
        VA / virtual_address / set_virtual_address: u64 = 287:224,
        /// Number of pages in the PBL.
        PBL_SIZE / pbl_size / set_pbl_size: u32 = 319:288,
        /// PBL root BT address >> 3 (hns PBL_BA_L/_H).
        PBL_BA / pbl_base_address / set_pbl_base_address: u64 = 380:320,
        /// Block mode (meaning not documented).
        BLK_MODE / block_mode / set_block_mode: bool = 381:381,
        /// First page address >> 6, i.e. in 64-byte units (hns PA0_L/_H); valid with INNER_PA_VLD.
        PA0 / page0_address / set_page0_address: u64 = 441:384,
        /// Bound VA bits (MW; 6 bits, meaning not documented).
        BOUND_VA / bound_va / set_bound_va: u8 = 447:442,
        /// Second page address >> 6, i.e. in 64-byte units (hns PA1_L/_H); valid with INNER_PA_VLD.
        PA1 / page1_address / set_page1_address: u64 = 505:448,
        /// Persistent entry (meaning not documented).
        PERSIST_EN / persist_enable / set_persist_enable: bool = 506:506,
        /// Page size of the region's pages, encoded page_shift − 12.
        PBL_BUF_PG_SZ / pbl_buffer_page_size / set_pbl_buffer_page_size: u8 = 511:508,
    }
}

impl Mpt {
    /// `MPT_ST` as an [`MptState`].
    pub fn mpt_state(&self) -> Result<MptState, ContextError> {
        MptState::try_from(self.mpt_state_raw())
    }

    /// Sets `MPT_ST`.
    pub fn set_mpt_state(&mut self, state: MptState) {
        self.set_mpt_state_raw(state.into());
    }
}

/// MPT index of a key (L_Key or R_Key): `rotr32(key, 8)` (hns `key_to_hw_index`). With
/// 24-bit indices this is `key >> 8` and the key's low byte is 0; mask the result with
/// `num_mtpts − 1` to get the table slot.
pub fn key_to_index(key: u32) -> u32 {
    key.rotate_right(8)
}

/// Key for an MPT index: `rotl32(index, 8)` = `(index << 8) | (index >> 24)` (hns
/// `hw_index_to_key`).
pub fn index_to_key(index: u32) -> u32 {
    index.rotate_left(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{Layout, LayoutError};
    use crate::context::testutil;
    use crate::context::MPT_SIZE;

    /// An MPT entry with a handful of fields set, written byte by byte from the bit positions.
    fn known_bytes() -> [u8; MPT_SIZE] {
        let mut b = [0u8; MPT_SIZE];
        // Byte 0: MPT_ST 1:0 = 1, PBL_HOP_NUM 3:2 = 2, PBL_BA_PG_SZ 7:4 = 2 -> 0x29.
        b[0] = 0x29;
        // Bytes 1..4: PD 31:8 = 0x000123.
        b[1..4].copy_from_slice(&[0x23, 0x01, 0x00]);
        // Byte 4: RR_EN 37, RW_EN 38, LW_EN 39 = bits 5, 6, 7 -> 0xE0.
        b[4] = 0xE0;
        // Byte 8: INNER_PA_VLD 71 = bit 7.
        b[8] = 0x80;
        // Bytes 16..24: LEN = 4 GiB.
        b[16..24].copy_from_slice(&[0, 0, 0, 0, 0x01, 0, 0, 0]);
        // Bytes 24..28: LKEY = 0x0001_2300.
        b[24..28].copy_from_slice(&[0x00, 0x23, 0x01, 0x00]);
        // Bytes 28..36: VA = 0x7f00_1234_5000.
        b[28..36].copy_from_slice(&[0x00, 0x50, 0x34, 0x12, 0x00, 0x7f, 0x00, 0x00]);
        // Bytes 36..40: PBL_SIZE = 3.
        b[36] = 0x03;
        // Bytes 40..45: PBL_BA 380:320 = 0x8_8000_1000 >> 3 = 0x1_1000_0200;
        // byte 47 bit 5: BLK_MODE 381.
        b[40..45].copy_from_slice(&[0x00, 0x02, 0x00, 0x10, 0x01]);
        b[47] = 0x20;
        // Bytes 48..52: PA0 441:384 = 0x1_2345_6000 >> 6 = 0x048D_1580.
        b[48..52].copy_from_slice(&[0x80, 0x15, 0x8D, 0x04]);
        // Byte 63 bits 7:4: PBL_BUF_PG_SZ 511:508 = 9 (2 MiB pages).
        b[63] = 0x90;
        b
    }

    #[test]
    fn parses_known_bytes() {
        let m = Mpt::parse(&known_bytes()).unwrap();
        assert_eq!(m.mpt_state(), Ok(MptState::Valid));
        assert_eq!(m.pbl_hop_number(), 2);
        assert_eq!(m.pbl_ba_page_size(), 2);
        assert_eq!(m.protection_domain(), 0x123);
        assert!(m.remote_read_enable() && m.remote_write_enable() && m.local_write_enable());
        assert!(!m.atomic_enable());
        assert!(m.inner_pa_valid());
        assert!(!m.memory_window());
        assert_eq!(m.length(), 1 << 32);
        assert_eq!(m.lkey(), 0x0001_2300);
        assert_eq!(m.virtual_address(), 0x7f00_1234_5000);
        assert_eq!(m.pbl_size(), 3);
        assert_eq!(m.pbl_base_address() << 3, 0x8_8000_1000);
        assert!(m.block_mode());
        assert_eq!(m.page0_address() << 6, 0x1_2345_6000);
        assert_eq!(m.page1_address(), 0);
        assert_eq!(m.pbl_buffer_page_size(), 9);
    }

    #[test]
    fn emits_known_bytes() {
        let mut m = Mpt::zeroed();
        m.set_mpt_state(MptState::Valid);
        m.set_pbl_hop_number(2);
        m.set_pbl_ba_page_size(2);
        m.set_protection_domain(0x123);
        m.set_remote_read_enable(true);
        m.set_remote_write_enable(true);
        m.set_local_write_enable(true);
        m.set_inner_pa_valid(true);
        m.set_length(1 << 32);
        m.set_lkey(0x0001_2300);
        m.set_virtual_address(0x7f00_1234_5000);
        m.set_pbl_size(3);
        m.set_pbl_base_address(0x8_8000_1000 >> 3);
        m.set_block_mode(true);
        m.set_page0_address(0x1_2345_6000 >> 6);
        m.set_pbl_buffer_page_size(9);
        assert_eq!(m.bytes(), &known_bytes()[..]);
    }

    #[test]
    fn round_trips_every_field() {
        testutil::assert_round_trips_every_field::<Mpt>(0x3A7E_2024_0004);
    }

    #[test]
    fn rejects_truncated_input() {
        assert_eq!(
            Mpt::parse(&known_bytes()[..MPT_SIZE - 1]),
            Err(LayoutError::Truncated {
                layout: "Mpt",
                expected: 64,
                actual: 63
            })
        );
        testutil::assert_rejects_truncated::<Mpt>();
    }

    #[test]
    fn typed_state_rejects_undefined_values() {
        let mut m = Mpt::zeroed();
        assert_eq!(
            m.mpt_state(),
            Err(ContextError::InvalidValue {
                field: "MPT_ST",
                value: 0
            })
        );
        m.set_mpt_state(MptState::Free);
        assert_eq!(m.mpt_state_raw(), 2);
        m.set_mpt_state_raw(3);
        assert!(m.mpt_state().is_err());
    }

    #[test]
    fn keys_and_indices_rotate_by_eight_bits() {
        assert_eq!(index_to_key(0x12_3456), 0x1234_5600);
        assert_eq!(key_to_index(0x1234_5600), 0x12_3456);
        // With a 24-bit index the key's low byte is 0 and key >> 8 is the index.
        assert_eq!(index_to_key(0x12_3456) & 0xFF, 0);
        assert_eq!(index_to_key(0x12_3456) >> 8, 0x12_3456);
        // The top byte of an index wraps into the key's low byte.
        assert_eq!(index_to_key(0xAB00_0001), 0x0000_01AB);
        assert_eq!(key_to_index(0x0000_01AB), 0xAB00_0001);
        let mut rng = testutil::XorShift(0x6B65_795F_726F_7461);
        for _ in 0..1000 {
            let v = rng.next() as u32;
            assert_eq!(key_to_index(index_to_key(v)), v);
            assert_eq!(index_to_key(key_to_index(v)), v);
        }
    }
}
