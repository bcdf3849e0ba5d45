//! The completion queue entry, 16 bytes: the whole response capsule on NVMe-oF/RDMA
//! (storage-and-cm.md B.3). DW0 and DW1 are command specific, SQHD tells the host how far
//! the controller consumed the submission queue, SQID and CID name the command.

use super::status::Status;
use super::{fixed_view, le, WireError};

/// Bytes of a CQE.
pub const CQE_LEN: usize = 16;

mod field {
    use core::ops::Range;
    pub const DW0: Range<usize> = 0..4;
    pub const DW1: Range<usize> = 4..8;
    pub const SQHD: Range<usize> = 8..10;
    pub const SQID: Range<usize> = 10..12;
    pub const CID: Range<usize> = 12..14;
    pub const STATUS: Range<usize> = 14..16;
}

fixed_view!(
    /// A view of a completion queue entry.
    Cqe,
    "CQE",
    16
);

impl<T: AsRef<[u8]>> Cqe<T> {
    /// Command-specific dword 0.
    pub fn dw0(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::DW0])
    }
    /// Command-specific dword 1.
    pub fn dw1(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::DW1])
    }
    /// Submission queue head pointer.
    pub fn sqhd(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::SQHD])
    }
    /// Submission queue identifier.
    pub fn sqid(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::SQID])
    }
    /// Command identifier.
    pub fn cid(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::CID])
    }
    /// The status word, phase bit included.
    pub fn status_field(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::STATUS])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Cqe<T> {
    /// Sets DW0.
    pub fn set_dw0(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::DW0], value);
    }
    /// Sets DW1.
    pub fn set_dw1(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::DW1], value);
    }
    /// Sets SQHD.
    pub fn set_sqhd(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::SQHD], value);
    }
    /// Sets SQID.
    pub fn set_sqid(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::SQID], value);
    }
    /// Sets the CID.
    pub fn set_cid(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::CID], value);
    }
    /// Sets the status word.
    pub fn set_status_field(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::STATUS], value);
    }
}

/// The content of a CQE.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CqeRepr {
    /// Command-specific dword 0 (Connect: the controller ID; Property Get: the low half).
    pub dw0: u32,
    /// Command-specific dword 1 (Property Get: the high half of an 8-byte property).
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// Status.
    pub status: Status,
    /// Phase tag (always 0 on fabrics).
    pub phase: bool,
}

impl CqeRepr {
    /// Reads a CQE.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 16 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &Cqe<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        let (status, phase) = Status::from_field(view.status_field());
        Ok(Self {
            dw0: view.dw0(),
            dw1: view.dw1(),
            sqhd: view.sqhd(),
            sqid: view.sqid(),
            cid: view.cid(),
            status,
            phase,
        })
    }

    /// Writes a CQE.
    ///
    /// # Panics
    /// If the buffer is shorter than 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut Cqe<&mut T>) {
        view.set_dw0(self.dw0);
        view.set_dw1(self.dw1);
        view.set_sqhd(self.sqhd);
        view.set_sqid(self.sqid);
        view.set_cid(self.cid);
        view.set_status_field(self.status.to_field(self.phase));
    }

    /// The 16 bytes.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut bytes = [0u8; CQE_LEN];
        self.emit(&mut Cqe::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Parses a response capsule (the fuzzing entry point).
///
/// # Errors
/// [`WireError::Truncated`] below 16 bytes.
pub fn parse_cqe(bytes: &[u8]) -> Result<CqeRepr, WireError> {
    CqeRepr::parse(&Cqe::new_checked(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvmeof::wire::XorShift;

    /// The reference builder's Connect CQE (B.6, Appendix): CID 1, DW0 = CNTLID 1.
    const CONNECT_CQE: [u8; 16] = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    /// A Read's CQE on queue 1: CID 5, SQHD 9, LBA Out of Range with DNR.
    const READ_OUT_OF_RANGE: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1, 0, 5, 0, 0x00, 0x81];

    #[test]
    fn parses_known_bytes() {
        let cqe = parse_cqe(&CONNECT_CQE).unwrap();
        assert_eq!(
            cqe,
            CqeRepr {
                dw0: 1,
                cid: 1,
                ..CqeRepr::default()
            }
        );
        let cqe = parse_cqe(&READ_OUT_OF_RANGE).unwrap();
        assert_eq!((cqe.cid, cqe.sqid, cqe.sqhd), (5, 1, 9));
        assert_eq!(cqe.status, Status::LBA_OUT_OF_RANGE);
        let distinct: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
        let cqe = parse_cqe(&distinct).unwrap();
        assert_eq!(
            (cqe.dw0, cqe.dw1, cqe.sqhd, cqe.sqid, cqe.cid),
            (0x0403_0201, 0x0807_0605, 0x0A09, 0x0C0B, 0x0E0D)
        );
        assert_eq!(cqe.status.to_field(cqe.phase), 0x100F);
    }

    #[test]
    fn emits_known_bytes() {
        let cqe = CqeRepr {
            cid: 5,
            sqid: 1,
            sqhd: 9,
            status: Status::LBA_OUT_OF_RANGE,
            ..CqeRepr::default()
        };
        assert_eq!(cqe.to_bytes(), READ_OUT_OF_RANGE);
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xC9E);
        for _ in 0..1000 {
            let (status, phase) = Status::from_field(rng.u16());
            let cqe = CqeRepr {
                dw0: rng.u32(),
                dw1: rng.u32(),
                sqhd: rng.u16(),
                sqid: rng.u16(),
                cid: rng.u16(),
                status,
                phase,
            };
            assert_eq!(parse_cqe(&cqe.to_bytes()).unwrap(), cqe);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..CQE_LEN {
            assert!(matches!(
                parse_cqe(&CONNECT_CQE[..len]),
                Err(WireError::Truncated { format: "CQE", .. })
            ));
            assert!(CqeRepr::parse(&Cqe::new_unchecked(&CONNECT_CQE[..len])).is_err());
        }
    }
}
