//! Context layouts: the per-object state records the device keeps in host memory (HEM
//! tables) or receives through mailbox commands.
//!
//! | Layout | Size | Mailbox | hns source |
//! |---|---|---|---|
//! | [`Qpc`] | [`QPC_SIZE`] = 256 B | MODIFY_QPC / QUERY_QPC | "v2" QPC (HIP08); the HIP09 512-byte extension is not modelled |
//! | [`Cqc`] | [`CQC_SIZE`] = 64 B | CREATE/MODIFY/QUERY_CQC | CQC |
//! | [`Srqc`] | [`SRQC_SIZE`] = 64 B | CREATE_SRQ / MODIFY/QUERY_SRQC | SRQC |
//! | [`Mpt`] | [`MPT_SIZE`] = 64 B | CREATE/QUERY_MPT | MTPT entry |
//! | [`Eqc`] | [`EQC_SIZE`] = 64 B | CREATE/MODIFY/QUERY_AEQC/CEQC | EQC |
//!
//! Field names are the hns names without the `QPC_`/`CQC_`/… prefix. Where hns splits a
//! field into contiguous `_L`/`_M`/`_H` pieces we declare one field and name the pieces in
//! its doc. Fields holding an enumerated value have a `*_raw` accessor (the bits) and a
//! typed one returning one of the enums below; an undefined raw value is reported as
//! [`ContextError::InvalidValue`].
//!
//! Addresses follow the hns encodings: root BT addresses `>> 3`, queue block (page)
//! addresses `>> 12`, MPT page addresses `>> 6`, IRRL `>> 6`, TRRL `>> 4`; record-doorbell
//! addresses share a 64-bit word with their enable bit (`(addr & !1) | enable`). Page-size
//! fields hold `page_shift − 12`; hop-number fields hold 0 for "direct" (the driver's 0xff
//! marker is never written).

pub mod cqc;
pub mod eqc;
pub mod mpt;
pub mod qpc;
pub mod srqc;

pub use cqc::Cqc;
pub use eqc::Eqc;
pub use mpt::Mpt;
pub use qpc::Qpc;
pub use srqc::Srqc;

/// QP0, the subnet management QP of InfiniBand. RoCE has no subnet manager: the device
/// refuses MODIFY_QPC of QPN 0 (as rdma_rxe drops packets for it).
pub const SMI_QPN: u32 = 0;
/// QP1, the port's general services interface (GSI) QP: UD, carries the MADs of the
/// communication manager. The driver creates it like any QP, by MODIFY_QPC of QPN 1 with
/// `TST` UD (hns: the GSI QP takes QPN 1 of the reserved range).
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1. The device sends and receives on QP1 with this Q_Key
/// whatever the QPC's `QKEY_XRCD` holds, and drops a packet to QPN 1 carrying another.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Bytes in front of the payload of every UD receive: the 40-byte GRH slot, holding the
/// IPv6 header, or 20 zero bytes followed by the IPv4 header (IBA, rdma_rxe).
pub const UD_GRH_LENGTH: usize = 40;

/// Size of a QP context in bytes (hns `HNS_ROCE_V2_QPC_SZ`).
pub const QPC_SIZE: usize = 256;
/// Size of a CQ context in bytes.
pub const CQC_SIZE: usize = 64;
/// Size of an SRQ context in bytes.
pub const SRQC_SIZE: usize = 64;
/// Size of an MPT (memory protection table) entry in bytes.
pub const MPT_SIZE: usize = 64;
/// Size of an EQ context in bytes.
pub const EQC_SIZE: usize = 64;

/// A context field holds a value outside its defined encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// The raw value of `field` is not one of its defined values.
    #[error("{field}: invalid value {value:#x}")]
    InvalidValue {
        /// hns field name (e.g. `QP_ST`).
        field: &'static str,
        /// The raw value found.
        value: u64,
    },
}

/// Declares a `u8`-represented enum with `TryFrom<u8>` (error [`ContextError`]) and
/// `From<Enum> for u8`.
macro_rules! context_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident in $field:literal {
            $( $(#[$vmeta:meta])+ $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])+ $variant = $value, )+
        }

        impl $name {
            /// Name of the context field(s) holding this value, for diagnostics.
            pub const FIELD: &'static str = $field;
            /// Every defined value, in numeric order.
            pub const ALL: &'static [$name] = &[$(Self::$variant),+];
        }

        impl TryFrom<u8> for $name {
            type Error = ContextError;
            fn try_from(value: u8) -> Result<Self, ContextError> {
                match value {
                    $( $value => Ok(Self::$variant), )+
                    _ => Err(ContextError::InvalidValue { field: $field, value: u64::from(value) }),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(value: $name) -> u8 {
                value as u8
            }
        }
    };
}

context_enum! {
    /// QP state (`QPC.QP_ST`), IB numbering.
    pub enum QpState in "QP_ST" {
        /// RESET: the context is not in use.
        Reset = 0,
        /// INIT: receive WQEs may be posted; nothing is transmitted.
        Init = 1,
        /// RTR (ready to receive): the responder side is running.
        Rtr = 2,
        /// RTS (ready to send): both sides are running.
        Rts = 3,
        /// SQD (send queue drained); not a supported source state in hns.
        Sqd = 4,
        /// SQE (send queue error); not a supported source state in hns.
        Sqe = 5,
        /// ERR: outstanding WQEs complete with WR_FLUSH_ERR.
        Err = 6,
        /// SQ draining (hns internal; reported as SQD by query).
        SqDraining = 7,
    }
}

context_enum! {
    /// Transport service type (`QPC.TST`).
    pub enum ServiceType in "TST" {
        /// Reliable connected.
        Rc = 0,
        /// Unreliable connected.
        Uc = 1,
        /// Reliable datagram (not used by the hns drivers).
        Rd = 2,
        /// Unreliable datagram (also the GSI QP).
        Ud = 3,
        /// XRC (initiator or target).
        Xrc = 5,
    }
}

context_enum! {
    /// Path MTU (`QPC.MTU`), IB MTU enum.
    pub enum Mtu in "MTU" {
        /// 256 bytes.
        Mtu256 = 1,
        /// 512 bytes.
        Mtu512 = 2,
        /// 1024 bytes.
        Mtu1024 = 3,
        /// 2048 bytes.
        Mtu2048 = 4,
        /// 4096 bytes.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// The MTU in bytes (256 << (value − 1)).
    pub const fn bytes(self) -> u32 {
        256 << (self as u8 - 1)
    }

    /// The enum value for an MTU of exactly `bytes` bytes, if it is one of 256..=4096.
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Self::Mtu256),
            512 => Some(Self::Mtu512),
            1024 => Some(Self::Mtu1024),
            2048 => Some(Self::Mtu2048),
            4096 => Some(Self::Mtu4096),
            _ => None,
        }
    }
}

context_enum! {
    /// CQ state (`CQC.CQ_ST`). hns defines only 1 = valid; the other values are ours.
    pub enum CqState in "CQ_ST" {
        /// Not in use (all-zero context).
        Invalid = 0,
        /// Valid: the CQ accepts completions (hns `V2_CQ_STATE_VALID`).
        Valid = 1,
        /// rnic: the CQ overflowed (same numbering as `EQ_ST`).
        Overflow = 2,
        /// rnic: the CQ hit an access error (same numbering as `EQ_ST`).
        Failure = 3,
    }
}

context_enum! {
    /// EQ state (`EQC.EQ_ST`).
    pub enum EqState in "EQ_ST" {
        /// Not in use.
        Invalid = 0,
        /// Valid.
        Valid = 1,
        /// The EQ overflowed.
        Overflow = 2,
        /// The EQ failed.
        Failure = 3,
    }
}

context_enum! {
    /// CQ arm state (`CQC.ARM_ST`): which completion, if any, posts a CEQE.
    pub enum CqArmState in "ARM_ST" {
        /// Not armed: completions post no event.
        NoArmed = 0,
        /// Armed for the next completion (`REG_NXT_CEQE`).
        NextCompletion = 2,
        /// Armed for the next solicited completion (`REG_NXT_SE_CEQE`).
        NextSolicited = 3,
    }
}

context_enum! {
    /// EQ arm state (`EQC.ARM_ST`): whether a new EQE raises the interrupt.
    pub enum EqArmState in "ARM_ST" {
        /// Fired: an interrupt was raised; the next waits for a re-arm doorbell.
        Fired = 0,
        /// Armed: the next EQE raises the interrupt.
        Armed = 1,
        /// Always armed: every EQE may raise the interrupt (hns driver default).
        AlwaysArmed = 3,
    }
}

context_enum! {
    /// MPT entry state (`MPT.MPT_ST`).
    pub enum MptState in "MPT_ST" {
        /// Valid: the key may be used.
        Valid = 1,
        /// Free: allocated but not usable until registered (FRMR and MW start here).
        Free = 2,
    }
}

context_enum! {
    /// CQE size (`CQC.CQE_SIZE`).
    pub enum CqeSize in "CQE_SIZE" {
        /// 32-byte CQEs (HIP08).
        Bytes32 = 0,
        /// 64-byte CQEs (HIP09).
        Bytes64 = 1,
    }
}

impl CqeSize {
    /// Size of one CQE in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            Self::Bytes32 => 32,
            Self::Bytes64 => 64,
        }
    }
}

context_enum! {
    /// EQE size (`EQC.EQE_SIZE`).
    pub enum EqeSize in "EQE_SIZE" {
        /// hns HIP08 sizes: CEQE 4 bytes, AEQE 16 bytes.
        Compact = 0,
        /// 64-byte CEQEs and AEQEs (HIP09).
        Bytes64 = 1,
    }
}

impl EqeSize {
    /// Size of one CEQE in bytes.
    pub const fn ceqe_bytes(self) -> usize {
        match self {
            Self::Compact => 4,
            Self::Bytes64 => 64,
        }
    }

    /// Size of one AEQE in bytes.
    pub const fn aeqe_bytes(self) -> usize {
        match self {
            Self::Compact => 16,
            Self::Bytes64 => 64,
        }
    }
}

/// Helpers shared by the layout tests of this module.
#[cfg(test)]
pub(crate) mod testutil {
    use crate::bits::{self, Layout, LayoutError};

    /// Tiny deterministic xorshift64 generator (no external crates).
    pub(crate) struct XorShift(pub u64);

    impl XorShift {
        pub(crate) fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
    }

    /// Sets every field of `L` to a pseudo-random value, emits, parses back and checks
    /// each field; also checks the field table itself.
    pub(crate) fn assert_round_trips_every_field<L: Layout>(seed: u64) {
        assert_eq!(bits::check_fields(L::NAME, L::SIZE, L::FIELDS), Ok(()));
        for round in 0..8u64 {
            let mut rng = XorShift((seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
            let mut layout = L::zeroed();
            let values: Vec<u64> = L::FIELDS
                .iter()
                .map(|f| {
                    let v = rng.next() & f.max_value();
                    f.set(layout.bytes_mut(), v);
                    v
                })
                .collect();
            let mut buffer = vec![0u8; L::SIZE + 3];
            layout.emit(&mut buffer).unwrap();
            let parsed = L::parse(&buffer).unwrap();
            for (f, v) in L::FIELDS.iter().zip(&values) {
                assert_eq!(f.get(parsed.bytes()), *v, "{}.{}", L::NAME, f.name);
            }
            assert_eq!(parsed.bytes(), layout.bytes());
        }
    }

    /// `parse` of one byte too few fails with the right numbers; so does `emit`.
    pub(crate) fn assert_rejects_truncated<L: Layout>() {
        let bytes = vec![0u8; L::SIZE];
        let expected = LayoutError::Truncated {
            layout: L::NAME,
            expected: L::SIZE,
            actual: L::SIZE - 1,
        };
        assert_eq!(L::parse(&bytes[..L::SIZE - 1]).err(), Some(expected));
        let mut short = vec![0u8; L::SIZE - 1];
        assert_eq!(L::zeroed().emit(&mut short).err(), Some(expected));
        assert!(L::parse(&bytes).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_convert_to_and_from_raw_values() {
        assert_eq!(QpState::try_from(3), Ok(QpState::Rts));
        assert_eq!(u8::from(QpState::SqDraining), 7);
        assert_eq!(ServiceType::try_from(5), Ok(ServiceType::Xrc));
        assert_eq!(
            ServiceType::try_from(4),
            Err(ContextError::InvalidValue { field: "TST", value: 4 })
        );
        assert_eq!(CqArmState::try_from(2), Ok(CqArmState::NextCompletion));
        assert!(CqArmState::try_from(1).is_err());
        assert_eq!(EqArmState::try_from(3), Ok(EqArmState::AlwaysArmed));
        assert!(EqArmState::try_from(2).is_err());
        assert_eq!(MptState::try_from(2), Ok(MptState::Free));
        assert_eq!(
            MptState::try_from(0),
            Err(ContextError::InvalidValue {
                field: "MPT_ST",
                value: 0
            })
        );
        for s in QpState::ALL {
            assert_eq!(QpState::try_from(*s as u8), Ok(*s));
        }
    }

    #[test]
    fn mtu_converts_to_and_from_bytes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(*m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::try_from(0).err().unwrap().to_string(), "MTU: invalid value 0x0");
    }

    #[test]
    fn entry_sizes() {
        assert_eq!(CqeSize::Bytes32.bytes(), 32);
        assert_eq!(CqeSize::Bytes64.bytes(), 64);
        assert_eq!((EqeSize::Compact.ceqe_bytes(), EqeSize::Compact.aeqe_bytes()), (4, 16));
        assert_eq!((EqeSize::Bytes64.ceqe_bytes(), EqeSize::Bytes64.aeqe_bytes()), (64, 64));
    }
}
