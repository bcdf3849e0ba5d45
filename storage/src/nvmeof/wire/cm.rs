//! The private data an NVMe queue's RDMA CM exchange carries (NVMe-oF RDMA transport;
//! storage-and-cm.md B.2). All little-endian. In a CM REQ it sits right after RDMA-CM's
//! 36-byte IP header; Wireshark reads the QID from there.
//!
//! | Message | Bytes | Fields |
//! |---|---|---|
//! | REQ | 32 | RECFMT, QID, HRQSIZE (1-based), HSQSIZE (0-based), CNTLID, 22 reserved |
//! | REP | 32 | RECFMT, CRQSIZE, 28 reserved |
//! | REJ | 4 | RECFMT, STS (with CM reject reason 28, consumer defined) |

use super::{check_len, fixed_view, le, WireError};

/// The only record format defined.
pub const RECFMT: u16 = 0;

/// The IB CM reject reason that carries a consumer's REJ private data ("consumer
/// defined"); an NVMe-oF REJ uses it.
pub const REJECT_REASON_CONSUMER_DEFINED: u16 = 28;

mod field {
    use core::ops::Range;
    pub const RECFMT: Range<usize> = 0..2;
    pub const QID: Range<usize> = 2..4;
    pub const HRQSIZE: Range<usize> = 4..6;
    pub const HSQSIZE: Range<usize> = 6..8;
    pub const CNTLID: Range<usize> = 8..10;
    pub const CRQSIZE: Range<usize> = 2..4;
    pub const STS: Range<usize> = 2..4;
}

fixed_view!(
    /// A view of the 32-byte private data of a CM REQ for an NVMe queue.
    CmRequest,
    "NVMe CM REQ private data",
    32
);

impl<T: AsRef<[u8]>> CmRequest<T> {
    /// Record format (0).
    pub fn recfmt(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::RECFMT])
    }
    /// Queue identifier: 0 for the admin queue.
    pub fn qid(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::QID])
    }
    /// Host receive queue size, entries (1-based).
    pub fn hrqsize(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::HRQSIZE])
    }
    /// Host send queue size, entries minus one (0-based).
    pub fn hsqsize(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::HSQSIZE])
    }
    /// Controller ID (NVMe-oF 1.1; 0 or reserved from older hosts).
    pub fn cntlid(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::CNTLID])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmRequest<T> {
    /// Sets the record format.
    pub fn set_recfmt(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::RECFMT], value);
    }
    /// Sets the queue identifier.
    pub fn set_qid(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::QID], value);
    }
    /// Sets HRQSIZE.
    pub fn set_hrqsize(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::HRQSIZE], value);
    }
    /// Sets HSQSIZE (0-based).
    pub fn set_hsqsize(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::HSQSIZE], value);
    }
    /// Sets the controller ID.
    pub fn set_cntlid(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::CNTLID], value);
    }
}

/// The content of a CM REQ's NVMe private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRequestRepr {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue identifier (0 = admin).
    pub qid: u16,
    /// Host receive queue size, entries.
    pub hrqsize: u16,
    /// Host send queue size minus one.
    pub hsqsize: u16,
    /// Controller ID the queue joins (0xFFFF or 0 for the admin queue).
    pub cntlid: u16,
}

impl CmRequestRepr {
    /// Bytes of the private data.
    pub const LEN: usize = 32;

    /// Reads the private data; the reserved bytes are ignored.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 32 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &CmRequest<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            recfmt: view.recfmt(),
            qid: view.qid(),
            hrqsize: view.hrqsize(),
            hsqsize: view.hsqsize(),
            cntlid: view.cntlid(),
        })
    }

    /// Writes the 32 bytes, reserved bytes zero.
    ///
    /// # Panics
    /// If the buffer is shorter than 32 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut CmRequest<&mut T>) {
        view.buffer.as_mut()[..Self::LEN].fill(0);
        view.set_recfmt(self.recfmt);
        view.set_qid(self.qid);
        view.set_hrqsize(self.hrqsize);
        view.set_hsqsize(self.hsqsize);
        view.set_cntlid(self.cntlid);
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut bytes = [0u8; 32];
        self.emit(&mut CmRequest::new_unchecked(&mut bytes[..]));
        bytes
    }
}

fixed_view!(
    /// A view of the 32-byte private data of a CM REP accepting an NVMe queue.
    CmReply,
    "NVMe CM REP private data",
    32
);

impl<T: AsRef<[u8]>> CmReply<T> {
    /// Record format (0).
    pub fn recfmt(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::RECFMT])
    }
    /// Controller receive queue size, entries.
    pub fn crqsize(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::CRQSIZE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmReply<T> {
    /// Sets the record format.
    pub fn set_recfmt(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::RECFMT], value);
    }
    /// Sets CRQSIZE.
    pub fn set_crqsize(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::CRQSIZE], value);
    }
}

/// The content of a CM REP's NVMe private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmReplyRepr {
    /// Record format (0).
    pub recfmt: u16,
    /// Controller receive queue size, entries.
    pub crqsize: u16,
}

impl CmReplyRepr {
    /// Bytes of the private data.
    pub const LEN: usize = 32;

    /// Reads the private data.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 32 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &CmReply<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            recfmt: view.recfmt(),
            crqsize: view.crqsize(),
        })
    }

    /// Writes the 32 bytes, reserved bytes zero.
    ///
    /// # Panics
    /// If the buffer is shorter than 32 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut CmReply<&mut T>) {
        view.buffer.as_mut()[..Self::LEN].fill(0);
        view.set_recfmt(self.recfmt);
        view.set_crqsize(self.crqsize);
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut bytes = [0u8; 32];
        self.emit(&mut CmReply::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Why a target refused an NVMe queue's connection (STS of the REJ private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmRejectStatus {
    /// 1: the REQ private data is too short.
    InvalidPrivateDataLength,
    /// 2: RECFMT is not 0.
    InvalidRecordFormat,
    /// 3: the QID is out of range or taken.
    InvalidQid,
    /// 4: HSQSIZE is too large (or 0).
    InvalidHsqsize,
    /// 5: HRQSIZE is too small or too large.
    InvalidHrqsize,
    /// 6: the target has no resources for the queue.
    NoResources,
    /// 7: the host's responder resources (IRD) are 0: the target could not read its data.
    InvalidIrd,
    /// 8: the host's initiator depth (ORD) is invalid.
    InvalidOrd,
    /// 9: the CNTLID names no controller (newer Linux).
    InvalidCntlid,
    /// Any other value.
    Other(u16),
}

impl CmRejectStatus {
    /// The STS value.
    pub fn value(self) -> u16 {
        match self {
            Self::InvalidPrivateDataLength => 1,
            Self::InvalidRecordFormat => 2,
            Self::InvalidQid => 3,
            Self::InvalidHsqsize => 4,
            Self::InvalidHrqsize => 5,
            Self::NoResources => 6,
            Self::InvalidIrd => 7,
            Self::InvalidOrd => 8,
            Self::InvalidCntlid => 9,
            Self::Other(value) => value,
        }
    }

    /// The status of STS value `value`.
    pub fn from_value(value: u16) -> Self {
        match value {
            1 => Self::InvalidPrivateDataLength,
            2 => Self::InvalidRecordFormat,
            3 => Self::InvalidQid,
            4 => Self::InvalidHsqsize,
            5 => Self::InvalidHrqsize,
            6 => Self::NoResources,
            7 => Self::InvalidIrd,
            8 => Self::InvalidOrd,
            9 => Self::InvalidCntlid,
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for CmRejectStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            Self::InvalidPrivateDataLength => "invalid private data length",
            Self::InvalidRecordFormat => "invalid RECFMT",
            Self::InvalidQid => "invalid QID",
            Self::InvalidHsqsize => "invalid HSQSIZE",
            Self::InvalidHrqsize => "invalid HRQSIZE",
            Self::NoResources => "no resources",
            Self::InvalidIrd => "invalid IRD",
            Self::InvalidOrd => "invalid ORD",
            Self::InvalidCntlid => "invalid CNTLID",
            Self::Other(value) => return write!(f, "status {value}"),
        };
        write!(f, "{text} ({})", self.value())
    }
}

fixed_view!(
    /// A view of the 4-byte private data of a CM REJ refusing an NVMe queue.
    CmReject,
    "NVMe CM REJ private data",
    4
);

impl<T: AsRef<[u8]>> CmReject<T> {
    /// Record format (0).
    pub fn recfmt(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::RECFMT])
    }
    /// STS.
    pub fn sts(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::STS])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CmReject<T> {
    /// Sets the record format.
    pub fn set_recfmt(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::RECFMT], value);
    }
    /// Sets STS.
    pub fn set_sts(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::STS], value);
    }
}

/// The content of a CM REJ's NVMe private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRejectRepr {
    /// Record format (0).
    pub recfmt: u16,
    /// Why.
    pub status: CmRejectStatus,
}

impl CmRejectRepr {
    /// Bytes of the private data.
    pub const LEN: usize = 4;

    /// A REJ of format 0 with `status`.
    pub fn new(status: CmRejectStatus) -> Self {
        Self { recfmt: RECFMT, status }
    }

    /// Reads the private data.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &CmReject<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            recfmt: view.recfmt(),
            status: CmRejectStatus::from_value(view.sts()),
        })
    }

    /// Writes the 4 bytes.
    ///
    /// # Panics
    /// If the buffer is shorter than 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut CmReject<&mut T>) {
        view.set_recfmt(self.recfmt);
        view.set_sts(self.status.value());
    }

    /// The 4 bytes.
    pub fn to_bytes(&self) -> [u8; 4] {
        let mut bytes = [0u8; 4];
        self.emit(&mut CmReject::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Parses REQ private data from bytes (the fuzzing entry point).
///
/// # Errors
/// [`WireError::Truncated`] below 32 bytes.
pub fn parse_cm_request(bytes: &[u8]) -> Result<CmRequestRepr, WireError> {
    check_len("NVMe CM REQ private data", CmRequestRepr::LEN, bytes.len())?;
    CmRequestRepr::parse(&CmRequest::new_unchecked(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvmeof::wire::XorShift;

    /// The admin-queue REQ of the reference's frame builder (B.2, Appendix):
    /// `recfmt 0, qid 0, hrqsize 32, hsqsize 31, cntlid 0`, then 22 zero bytes.
    const ADMIN_REQ: [u8; 32] = [
        0, 0, 0, 0, 32, 0, 31, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    /// The builder's REP for an I/O queue of 128: `recfmt 0, crqsize 128`.
    const IO_REP: [u8; 32] = [
        0, 0, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    /// REJ with STS 6 (no resources), as the reference decoded with tshark.
    const REJ_NO_RESOURCES: [u8; 4] = [0, 0, 6, 0];

    #[test]
    fn parses_known_bytes() {
        let req = parse_cm_request(&ADMIN_REQ).unwrap();
        assert_eq!(
            req,
            CmRequestRepr {
                recfmt: 0,
                qid: 0,
                hrqsize: 32,
                hsqsize: 31,
                cntlid: 0
            }
        );
        let distinct: [u8; 32] = core::array::from_fn(|i| i as u8 + 1);
        let req = parse_cm_request(&distinct).unwrap();
        assert_eq!(
            (req.recfmt, req.qid, req.hrqsize, req.hsqsize, req.cntlid),
            (0x0201, 0x0403, 0x0605, 0x0807, 0x0A09)
        );
        let rep = CmReplyRepr::parse(&CmReply::new_checked(&IO_REP[..]).unwrap()).unwrap();
        assert_eq!(
            rep,
            CmReplyRepr {
                recfmt: 0,
                crqsize: 128
            }
        );
        let rej = CmRejectRepr::parse(&CmReject::new_checked(&REJ_NO_RESOURCES[..]).unwrap()).unwrap();
        assert_eq!(rej, CmRejectRepr::new(CmRejectStatus::NoResources));
    }

    #[test]
    fn emits_known_bytes() {
        let req = CmRequestRepr {
            recfmt: 0,
            qid: 0,
            hrqsize: 32,
            hsqsize: 31,
            cntlid: 0,
        };
        let mut bytes = [0xAAu8; 32];
        req.emit(&mut CmRequest::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, ADMIN_REQ, "reserved bytes are zeroed");
        assert_eq!(
            CmReplyRepr {
                recfmt: 0,
                crqsize: 128
            }
            .to_bytes(),
            IO_REP
        );
        assert_eq!(
            CmRejectRepr::new(CmRejectStatus::NoResources).to_bytes(),
            REJ_NO_RESOURCES
        );
    }

    #[test]
    fn round_trips_random_reprs() {
        let mut rng = XorShift::new(0xC4);
        for _ in 0..1000 {
            let req = CmRequestRepr {
                recfmt: rng.u16(),
                qid: rng.u16(),
                hrqsize: rng.u16(),
                hsqsize: rng.u16(),
                cntlid: rng.u16(),
            };
            assert_eq!(parse_cm_request(&req.to_bytes()).unwrap(), req);
            let rep = CmReplyRepr {
                recfmt: rng.u16(),
                crqsize: rng.u16(),
            };
            assert_eq!(
                CmReplyRepr::parse(&CmReply::new_checked(&rep.to_bytes()[..]).unwrap()).unwrap(),
                rep
            );
            let rej = CmRejectRepr {
                recfmt: rng.u16(),
                status: CmRejectStatus::from_value(rng.u16()),
            };
            assert_eq!(
                CmRejectRepr::parse(&CmReject::new_checked(&rej.to_bytes()[..]).unwrap()).unwrap(),
                rej
            );
        }
        for value in 0..=20u16 {
            assert_eq!(CmRejectStatus::from_value(value).value(), value);
        }
    }

    #[test]
    fn rejects_truncated_input() {
        for len in 0..32 {
            assert!(matches!(
                parse_cm_request(&ADMIN_REQ[..len]),
                Err(WireError::Truncated { needed: 32, .. })
            ));
            assert!(CmReply::new_checked(&IO_REP[..len]).is_err());
            assert!(CmReplyRepr::parse(&CmReply::new_unchecked(&IO_REP[..len])).is_err());
        }
        for len in 0..4 {
            assert!(CmReject::new_checked(&REJ_NO_RESOURCES[..len]).is_err());
        }
    }
}
