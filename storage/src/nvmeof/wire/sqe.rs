//! The submission queue entry, 64 bytes: the head of every command capsule
//! (storage-and-cm.md B.3). This module keeps it raw — every byte round-trips — and
//! [`super::command`] gives the dwords their meaning per opcode.
//!
//! | Off | Size | Field |
//! |---|---|---|
//! | 0 | 1 | Opcode |
//! | 1 | 1 | Flags: FUSE 1:0, PSDT 7:6 (fabrics: 01b, i.e. 0x40) |
//! | 2 | 2 | Command Identifier |
//! | 4 | 4 | NSID (Fabrics: byte 4 is FCTYPE) |
//! | 8 | 8 | CDW2–3 |
//! | 16 | 8 | MPTR |
//! | 24 | 16 | SGL1 |
//! | 40 | 24 | CDW10–CDW15 |

use super::{fixed_view, le, WireError};

/// Bytes of an SQE.
pub const SQE_LEN: usize = 64;

/// PSDT value NVMe-oF requires: SGLs for data, metadata by address (flags bits 7:6 = 01b).
pub const PSDT_SGL_MPTR_CONTIGUOUS: u8 = 0b01;

mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const CID: Range<usize> = 2..4;
    pub const NSID: Range<usize> = 4..8;
    pub const CDW2: Range<usize> = 8..12;
    pub const CDW3: Range<usize> = 12..16;
    pub const MPTR: Range<usize> = 16..24;
    pub const SGL1: Range<usize> = 24..40;
    pub const CDW10: usize = 40;
}

fixed_view!(
    /// A view of a submission queue entry.
    Sqe,
    "SQE",
    64
);

impl<T: AsRef<[u8]>> Sqe<T> {
    /// Opcode.
    pub fn opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }
    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Fused operation (flags bits 1:0).
    pub fn fuse(&self) -> u8 {
        self.flags() & 0x3
    }
    /// PRP or SGL for data transfer (flags bits 7:6).
    pub fn psdt(&self) -> u8 {
        self.flags() >> 6
    }
    /// Command identifier.
    pub fn cid(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::CID])
    }
    /// Namespace identifier.
    pub fn nsid(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::NSID])
    }
    /// Fabrics command type (byte 4; meaningful for opcode 0x7F).
    pub fn fctype(&self) -> u8 {
        self.buffer.as_ref()[field::NSID.start]
    }
    /// Command dword 2.
    pub fn cdw2(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::CDW2])
    }
    /// Command dword 3.
    pub fn cdw3(&self) -> u32 {
        le::u32(&self.buffer.as_ref()[field::CDW3])
    }
    /// Metadata pointer.
    pub fn mptr(&self) -> u64 {
        le::u64(&self.buffer.as_ref()[field::MPTR])
    }
    /// The SGL1 descriptor's 16 bytes.
    pub fn sgl1(&self) -> &[u8] {
        &self.buffer.as_ref()[field::SGL1]
    }
    /// Command dword `n`, 10..=15.
    ///
    /// # Panics
    /// For `n` outside 10..=15.
    pub fn cdw(&self, n: usize) -> u32 {
        assert!((10..=15).contains(&n), "CDW{n} is not one of CDW10..CDW15");
        let at = field::CDW10 + (n - 10) * 4;
        le::u32(&self.buffer.as_ref()[at..at + 4])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Sqe<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, value: u8) {
        self.buffer.as_mut()[field::OPCODE] = value;
    }
    /// Sets the flags byte.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::FLAGS] = value;
    }
    /// Sets the command identifier.
    pub fn set_cid(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::CID], value);
    }
    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::NSID], value);
    }
    /// Sets CDW2.
    pub fn set_cdw2(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::CDW2], value);
    }
    /// Sets CDW3.
    pub fn set_cdw3(&mut self, value: u32) {
        le::set_u32(&mut self.buffer.as_mut()[field::CDW3], value);
    }
    /// Sets the metadata pointer.
    pub fn set_mptr(&mut self, value: u64) {
        le::set_u64(&mut self.buffer.as_mut()[field::MPTR], value);
    }
    /// Sets SGL1's 16 bytes.
    pub fn set_sgl1(&mut self, value: &[u8; 16]) {
        self.buffer.as_mut()[field::SGL1].copy_from_slice(value);
    }
    /// Sets command dword `n`, 10..=15.
    ///
    /// # Panics
    /// For `n` outside 10..=15.
    pub fn set_cdw(&mut self, n: usize, value: u32) {
        assert!((10..=15).contains(&n), "CDW{n} is not one of CDW10..CDW15");
        let at = field::CDW10 + (n - 10) * 4;
        le::set_u32(&mut self.buffer.as_mut()[at..at + 4], value);
    }
}

/// The content of an SQE, every byte kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SqeRepr {
    /// Opcode.
    pub opcode: u8,
    /// The flags byte (FUSE 1:0, PSDT 7:6).
    pub flags: u8,
    /// Command identifier.
    pub cid: u16,
    /// Namespace identifier (Fabrics: FCTYPE in the low byte, the rest reserved).
    pub nsid: u32,
    /// CDW2.
    pub cdw2: u32,
    /// CDW3.
    pub cdw3: u32,
    /// Metadata pointer.
    pub mptr: u64,
    /// SGL1, raw (parse it with [`super::sgl::parse_sgl`]).
    pub sgl1: [u8; 16],
    /// CDW10..CDW15.
    pub cdw: [u32; 6],
}

impl SqeRepr {
    /// Reads an SQE.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 64 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &Sqe<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        let mut sgl1 = [0u8; 16];
        sgl1.copy_from_slice(view.sgl1());
        Ok(Self {
            opcode: view.opcode(),
            flags: view.flags(),
            cid: view.cid(),
            nsid: view.nsid(),
            cdw2: view.cdw2(),
            cdw3: view.cdw3(),
            mptr: view.mptr(),
            sgl1,
            cdw: core::array::from_fn(|i| view.cdw(10 + i)),
        })
    }

    /// Writes the SQE.
    ///
    /// # Panics
    /// If the buffer is shorter than 64 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut Sqe<&mut T>) {
        view.set_opcode(self.opcode);
        view.set_flags(self.flags);
        view.set_cid(self.cid);
        view.set_nsid(self.nsid);
        view.set_cdw2(self.cdw2);
        view.set_cdw3(self.cdw3);
        view.set_mptr(self.mptr);
        view.set_sgl1(&self.sgl1);
        for (i, value) in self.cdw.iter().enumerate() {
            view.set_cdw(10 + i, *value);
        }
    }

    /// The 64 bytes.
    pub fn to_bytes(&self) -> [u8; SQE_LEN] {
        let mut bytes = [0u8; SQE_LEN];
        self.emit(&mut Sqe::new_unchecked(&mut bytes[..]));
        bytes
    }

    /// Fused operation (flags bits 1:0).
    pub fn fuse(&self) -> u8 {
        self.flags & 0x3
    }

    /// PSDT (flags bits 7:6).
    pub fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// Fabrics command type (the low byte of the NSID field).
    pub fn fctype(&self) -> u8 {
        self.nsid as u8
    }

    /// CDW`n`, 10..=15.
    ///
    /// # Panics
    /// For `n` outside 10..=15.
    pub fn cdw(&self, n: usize) -> u32 {
        self.cdw[n - 10]
    }
}

/// Parses an SQE from bytes.
///
/// # Errors
/// [`WireError::Truncated`] below 64 bytes.
pub fn parse_sqe(bytes: &[u8]) -> Result<SqeRepr, WireError> {
    SqeRepr::parse(&Sqe::new_checked(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvmeof::wire::XorShift;

    /// The reference builder's Identify Controller command (B.8, Appendix): opcode 6,
    /// flags 0x40, CID 4, NSID 0, keyed SGL with invalidate (VA 0x7f0000002000, 4096 B,
    /// R_Key 0x5678), CDW10 CNS 1.
    pub(crate) const IDENTIFY_CONTROLLER: [u8; 64] = [
        0x06, 0x40, 0x04, 0x00, 0, 0, 0, 0, // opcode, flags, CID, NSID
        0, 0, 0, 0, 0, 0, 0, 0, // CDW2-3
        0, 0, 0, 0, 0, 0, 0, 0, // MPTR
        0x00, 0x20, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0x78, 0x56, 0x00, 0x00, 0x4F, // SGL1
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // CDW10-12
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // CDW13-15
    ];

    #[test]
    fn parses_known_bytes() {
        let sqe = parse_sqe(&IDENTIFY_CONTROLLER).unwrap();
        assert_eq!(sqe.opcode, 0x06);
        assert_eq!(sqe.psdt(), PSDT_SGL_MPTR_CONTIGUOUS);
        assert_eq!(sqe.fuse(), 0);
        assert_eq!(sqe.cid, 4);
        assert_eq!(sqe.cdw(10), 1);
        assert_eq!(sqe.sgl1[15], 0x4F);
        let distinct: [u8; 64] = core::array::from_fn(|i| i as u8);
        let sqe = parse_sqe(&distinct).unwrap();
        assert_eq!((sqe.opcode, sqe.flags, sqe.cid, sqe.nsid), (0, 1, 0x0302, 0x0706_0504));
        assert_eq!(
            (sqe.cdw2, sqe.cdw3, sqe.mptr),
            (0x0B0A_0908, 0x0F0E_0D0C, 0x1716_1514_1312_1110)
        );
        assert_eq!(sqe.cdw(10), 0x2B2A_2928);
        assert_eq!(sqe.cdw(15), 0x3F3E_3D3C);
        assert_eq!(sqe.fctype(), 4);
    }

    #[test]
    fn emits_known_bytes() {
        let mut sgl1 = [0u8; 16];
        sgl1.copy_from_slice(&IDENTIFY_CONTROLLER[24..40]);
        let sqe = SqeRepr {
            opcode: 0x06,
            flags: 0x40,
            cid: 4,
            sgl1,
            cdw: [1, 0, 0, 0, 0, 0],
            ..SqeRepr::default()
        };
        assert_eq!(sqe.to_bytes(), IDENTIFY_CONTROLLER);
    }

    #[test]
    fn round_trips_random_bytes() {
        let mut rng = XorShift::new(0x5E);
        for _ in 0..1000 {
            let bytes: [u8; 64] = core::array::from_fn(|_| rng.u8());
            assert_eq!(parse_sqe(&bytes).unwrap().to_bytes(), bytes);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..SQE_LEN {
            assert!(matches!(
                parse_sqe(&IDENTIFY_CONTROLLER[..len]),
                Err(WireError::Truncated {
                    format: "SQE",
                    needed: 64,
                    ..
                })
            ));
            assert!(SqeRepr::parse(&Sqe::new_unchecked(&IDENTIFY_CONTROLLER[..len])).is_err());
        }
    }
}
