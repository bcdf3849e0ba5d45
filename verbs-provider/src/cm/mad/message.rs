//! A whole CM MAD: header and message together, parsed from and emitted into the 256
//! bytes a MAD occupies.

use super::header::{MadHeaderRepr, Packet as HeaderPacket};
use super::{
    attribute, drep, dreq, mra, rej, rep, req, rtu, sidr, DrepRepr, DreqRepr, MadError, MraRepr, RejRepr, RepRepr,
    ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, BASE_VERSION, CM_CLASS, CM_CLASS_VERSION, MAD_HEADER_LEN, MAD_LEN,
    METHOD_SEND,
};

/// One CM message, by attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// REQ (0x0010).
    Req(ReqRepr),
    /// MRA (0x0011).
    Mra(MraRepr),
    /// REJ (0x0012).
    Rej(RejRepr),
    /// REP (0x0013).
    Rep(RepRepr),
    /// RTU (0x0014).
    Rtu(RtuRepr),
    /// DREQ (0x0015).
    Dreq(DreqRepr),
    /// DREP (0x0016).
    Drep(DrepRepr),
    /// SIDR_REQ (0x0017).
    SidrReq(SidrReqRepr),
    /// SIDR_REP (0x0018).
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// Its attribute ID.
    pub fn attribute_id(&self) -> u16 {
        match self {
            Self::Req(_) => attribute::REQ,
            Self::Mra(_) => attribute::MRA,
            Self::Rej(_) => attribute::REJ,
            Self::Rep(_) => attribute::REP,
            Self::Rtu(_) => attribute::RTU,
            Self::Dreq(_) => attribute::DREQ,
            Self::Drep(_) => attribute::DREP,
            Self::SidrReq(_) => attribute::SIDR_REQ,
            Self::SidrRep(_) => attribute::SIDR_REP,
        }
    }

    /// Its IBA name.
    pub fn name(&self) -> &'static str {
        attribute_name(self.attribute_id())
    }
}

/// The IBA name of a CM attribute ("REQ", "REP", …; "unknown" for others).
pub fn attribute_name(attribute_id: u16) -> &'static str {
    match attribute_id {
        attribute::CLASS_PORT_INFO => "ClassPortInfo",
        attribute::REQ => "REQ",
        attribute::MRA => "MRA",
        attribute::REJ => "REJ",
        attribute::REP => "REP",
        attribute::RTU => "RTU",
        attribute::DREQ => "DREQ",
        attribute::DREP => "DREP",
        attribute::SIDR_REQ => "SIDR_REQ",
        attribute::SIDR_REP => "SIDR_REP",
        attribute::LAP => "LAP",
        attribute::APR => "APR",
        _ => "unknown",
    }
}

/// A CM MAD: the header (whose attribute ID is always the message's) and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute Modifier (0 from Linux except with ECE).
    pub attribute_modifier: u32,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// A MAD carrying `message` with transaction ID `transaction_id`.
    pub fn new(transaction_id: u64, message: CmMessage) -> Self {
        Self {
            transaction_id,
            attribute_modifier: 0,
            message,
        }
    }

    /// Parses the 256 bytes of a MAD (more are ignored: a receive buffer may be larger).
    ///
    /// # Errors
    /// [`MadError::Truncated`] on fewer than 256 bytes; [`MadError::NotCm`] for another
    /// base version, class, class version or method (Linux drops those);
    /// [`MadError::UnknownAttribute`] for ClassPortInfo, LAP, APR and unknown attributes;
    /// the message's own errors.
    pub fn parse(bytes: &[u8]) -> Result<Self, MadError> {
        super::check_len("MAD", MAD_LEN, bytes.len())?;
        let bytes = &bytes[..MAD_LEN];
        let header = MadHeaderRepr::parse(&HeaderPacket::new_checked(bytes)?)?;
        let checks = [
            ("BaseVersion", header.base_version, BASE_VERSION),
            ("MgmtClass", header.mgmt_class, CM_CLASS),
            ("ClassVersion", header.class_version, CM_CLASS_VERSION),
            ("Method", header.method, METHOD_SEND),
        ];
        for (field, value, expected) in checks {
            if value != expected {
                return Err(MadError::NotCm {
                    field,
                    value: u64::from(value),
                });
            }
        }
        let body = &bytes[MAD_HEADER_LEN..];
        let message = match header.attribute_id {
            attribute::REQ => CmMessage::Req(ReqRepr::parse(&req::Packet::new_checked(body)?)?),
            attribute::MRA => CmMessage::Mra(MraRepr::parse(&mra::Packet::new_checked(body)?)?),
            attribute::REJ => CmMessage::Rej(RejRepr::parse(&rej::Packet::new_checked(body)?)?),
            attribute::REP => CmMessage::Rep(RepRepr::parse(&rep::Packet::new_checked(body)?)?),
            attribute::RTU => CmMessage::Rtu(RtuRepr::parse(&rtu::Packet::new_checked(body)?)?),
            attribute::DREQ => CmMessage::Dreq(DreqRepr::parse(&dreq::Packet::new_checked(body)?)?),
            attribute::DREP => CmMessage::Drep(DrepRepr::parse(&drep::Packet::new_checked(body)?)?),
            attribute::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(&sidr::SidrReqPacket::new_checked(body)?)?),
            attribute::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(&sidr::SidrRepPacket::new_checked(body)?)?),
            other => return Err(MadError::UnknownAttribute(other)),
        };
        Ok(Self {
            transaction_id: header.transaction_id,
            attribute_modifier: header.attribute_modifier,
            message,
        })
    }

    /// Writes all 256 bytes of the MAD into the start of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than 256 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        let out = &mut out[..MAD_LEN];
        let mut header = MadHeaderRepr::cm(self.message.attribute_id(), self.transaction_id);
        header.attribute_modifier = self.attribute_modifier;
        let (head, body) = out.split_at_mut(MAD_HEADER_LEN);
        header.emit(&mut HeaderPacket::new_unchecked(head));
        match &self.message {
            CmMessage::Req(m) => m.emit(&mut req::Packet::new_unchecked(body)),
            CmMessage::Mra(m) => m.emit(&mut mra::Packet::new_unchecked(body)),
            CmMessage::Rej(m) => m.emit(&mut rej::Packet::new_unchecked(body)),
            CmMessage::Rep(m) => m.emit(&mut rep::Packet::new_unchecked(body)),
            CmMessage::Rtu(m) => m.emit(&mut rtu::Packet::new_unchecked(body)),
            CmMessage::Dreq(m) => m.emit(&mut dreq::Packet::new_unchecked(body)),
            CmMessage::Drep(m) => m.emit(&mut drep::Packet::new_unchecked(body)),
            CmMessage::SidrReq(m) => m.emit(&mut sidr::SidrReqPacket::new_unchecked(body)),
            CmMessage::SidrRep(m) => m.emit(&mut sidr::SidrRepPacket::new_unchecked(body)),
        }
    }

    /// The 256 bytes of the MAD.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut bytes = [0u8; MAD_LEN];
        self.emit(&mut bytes);
        bytes
    }
}
