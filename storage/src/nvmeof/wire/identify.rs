//! Identify data structures, 4096 bytes each (storage-and-cm.md B.8): Identify Controller
//! (CNS 1), Identify Namespace (CNS 0), the active namespace ID list (CNS 2) and the
//! namespace identification descriptor list (CNS 3).
//!
//! The representations carry the fields hosts look at; everything else is zero when
//! emitted and ignored when parsed.

use super::{
    check_len, emit_nul_terminated, emit_space_padded, fixed_view, le, parse_nul_terminated, parse_space_padded,
    WireError,
};

/// Bytes of every Identify structure.
pub const IDENTIFY_LEN: usize = 4096;

/// SGLS bits (Identify Controller byte 536).
pub mod sgls {
    /// SGLs supported, byte alignment (bits 1:0 = 01b).
    pub const SUPPORTED: u32 = 0b01;
    /// Keyed SGL Data Block descriptors supported (Linux hosts require it).
    pub const KEYED: u32 = 1 << 2;
    /// Bit Bucket descriptors supported.
    pub const BIT_BUCKET: u32 = 1 << 16;
    /// The offset subtype (in-capsule data) supported; Linux hosts send in-capsule data
    /// only when it is set.
    pub const OFFSET: u32 = 1 << 20;
}

/// ONCS bits (optional NVM commands supported).
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

/// Controller types (CNTRLTYPE).
pub mod controller_type {
    /// I/O controller.
    pub const IO: u8 = 1;
    /// Discovery controller.
    pub const DISCOVERY: u8 = 2;
    /// Administrative controller.
    pub const ADMIN: u8 = 3;
}

mod controller_field {
    use core::ops::Range;
    pub const VID: Range<usize> = 0..2;
    pub const SSVID: Range<usize> = 2..4;
    pub const SN: Range<usize> = 4..24;
    pub const MN: Range<usize> = 24..64;
    pub const FR: Range<usize> = 64..72;
    pub const RAB: usize = 72;
    pub const IEEE: Range<usize> = 73..76;
    pub const CMIC: usize = 76;
    pub const MDTS: usize = 77;
    pub const CNTLID: Range<usize> = 78..80;
    pub const VER: Range<usize> = 80..84;
    pub const OAES: Range<usize> = 92..96;
    pub const CTRATT: Range<usize> = 96..100;
    pub const CNTRLTYPE: usize = 111;
    pub const FGUID: Range<usize> = 112..128;
    pub const OACS: Range<usize> = 256..258;
    pub const ACL: usize = 258;
    pub const AERL: usize = 259;
    pub const FRMW: usize = 260;
    pub const LPA: usize = 261;
    pub const ELPE: usize = 262;
    pub const NPSS: usize = 263;
    pub const KAS: Range<usize> = 320..322;
    pub const SQES: usize = 512;
    pub const CQES: usize = 513;
    pub const MAXCMD: Range<usize> = 514..516;
    pub const NN: Range<usize> = 516..520;
    pub const ONCS: Range<usize> = 520..522;
    pub const FUSES: Range<usize> = 522..524;
    pub const FNA: usize = 524;
    pub const VWC: usize = 525;
    pub const AWUN: Range<usize> = 526..528;
    pub const AWUPF: Range<usize> = 528..530;
    pub const SGLS: Range<usize> = 536..540;
    pub const MNAN: Range<usize> = 540..544;
    pub const SUBNQN: Range<usize> = 768..1024;
    pub const IOCCSZ: Range<usize> = 1792..1796;
    pub const IORCSZ: Range<usize> = 1796..1800;
    pub const ICDOFF: Range<usize> = 1800..1802;
    pub const CTRATTR: usize = 1802;
    pub const MSDBD: usize = 1803;
    pub const OFCS: Range<usize> = 1804..1806;
}

fixed_view!(
    /// A view of Identify Controller data.
    IdentifyController,
    "Identify Controller",
    4096
);

/// The fields of Identify Controller a fabrics host and target use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct IdentifyControllerRepr {
    /// PCI vendor ID.
    pub vid: u16,
    /// PCI subsystem vendor ID.
    pub ssvid: u16,
    /// Serial number (20 ASCII, space padded).
    pub serial_number: String,
    /// Model number (40 ASCII).
    pub model_number: String,
    /// Firmware revision (8 ASCII).
    pub firmware_revision: String,
    /// Recommended arbitration burst.
    pub rab: u8,
    /// IEEE OUI, little-endian.
    pub ieee: [u8; 3],
    /// Controller multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size, 2^MDTS minimum pages (0 = no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (VS).
    pub version: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// Controller attributes.
    pub ctratt: u32,
    /// Controller type (1 I/O, 2 discovery, 3 admin).
    pub cntrltype: u8,
    /// FRU globally unique identifier.
    pub fguid: [u8; 16],
    /// Optional admin command support.
    pub oacs: u16,
    /// Abort command limit, 0-based.
    pub acl: u8,
    /// Asynchronous event request limit, 0-based.
    pub aerl: u8,
    /// Firmware updates.
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, 0-based.
    pub elpe: u8,
    /// Number of power states supported, 0-based.
    pub npss: u8,
    /// Keep-alive support: granularity in 100 ms units (0 = no keep alive).
    pub kas: u16,
    /// Submission queue entry size (0x66: 64 bytes required and maximum).
    pub sqes: u8,
    /// Completion queue entry size (0x44).
    pub cqes: u8,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (the highest NSID).
    pub nn: u32,
    /// Optional NVM command support.
    pub oncs: u16,
    /// Fused operation support.
    pub fuses: u16,
    /// Format NVM attributes.
    pub fna: u8,
    /// Volatile write cache (bit 0: present).
    pub vwc: u8,
    /// Atomic write unit normal, 0-based blocks.
    pub awun: u16,
    /// Atomic write unit power fail, 0-based blocks.
    pub awupf: u16,
    /// SGL support ([`sgls`]).
    pub sgls: u32,
    /// Maximum number of allowed namespaces.
    pub mnan: u32,
    /// NVM subsystem NQN.
    pub subnqn: String,
    /// I/O queue command capsule supported size, 16-byte units (4 + in-capsule data / 16).
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, 16-byte units (1).
    pub iorcsz: u32,
    /// In-capsule data offset, 16-byte units (0).
    pub icdoff: u16,
    /// Fabrics controller attributes (bit 0: static controller model).
    pub ctrattr: u8,
    /// Maximum SGL data block descriptors per capsule.
    pub msdbd: u8,
    /// Optional fabric commands supported (bit 0: Disconnect).
    pub ofcs: u16,
}

impl IdentifyControllerRepr {
    /// Reads Identify Controller data.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 4096 bytes; [`WireError::Malformed`] when SUBNQN
    /// has no terminating NUL or bytes that are not printable ASCII.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &IdentifyController<&T>) -> Result<Self, WireError> {
        use controller_field as f;
        view.check_len()?;
        let b = view.buffer.as_ref();
        let subnqn_field = &b[f::SUBNQN];
        let subnqn = if subnqn_field.iter().all(|x| *x == 0) {
            String::new()
        } else {
            parse_nul_terminated("Identify Controller", "SUBNQN", subnqn_field)?
        };
        let mut fguid = [0u8; 16];
        fguid.copy_from_slice(&b[f::FGUID]);
        Ok(Self {
            vid: le::u16(&b[f::VID]),
            ssvid: le::u16(&b[f::SSVID]),
            serial_number: parse_space_padded(&b[f::SN]),
            model_number: parse_space_padded(&b[f::MN]),
            firmware_revision: parse_space_padded(&b[f::FR]),
            rab: b[f::RAB],
            ieee: [b[f::IEEE.start], b[f::IEEE.start + 1], b[f::IEEE.start + 2]],
            cmic: b[f::CMIC],
            mdts: b[f::MDTS],
            cntlid: le::u16(&b[f::CNTLID]),
            version: le::u32(&b[f::VER]),
            oaes: le::u32(&b[f::OAES]),
            ctratt: le::u32(&b[f::CTRATT]),
            cntrltype: b[f::CNTRLTYPE],
            fguid,
            oacs: le::u16(&b[f::OACS]),
            acl: b[f::ACL],
            aerl: b[f::AERL],
            frmw: b[f::FRMW],
            lpa: b[f::LPA],
            elpe: b[f::ELPE],
            npss: b[f::NPSS],
            kas: le::u16(&b[f::KAS]),
            sqes: b[f::SQES],
            cqes: b[f::CQES],
            maxcmd: le::u16(&b[f::MAXCMD]),
            nn: le::u32(&b[f::NN]),
            oncs: le::u16(&b[f::ONCS]),
            fuses: le::u16(&b[f::FUSES]),
            fna: b[f::FNA],
            vwc: b[f::VWC],
            awun: le::u16(&b[f::AWUN]),
            awupf: le::u16(&b[f::AWUPF]),
            sgls: le::u32(&b[f::SGLS]),
            mnan: le::u32(&b[f::MNAN]),
            subnqn,
            ioccsz: le::u32(&b[f::IOCCSZ]),
            iorcsz: le::u32(&b[f::IORCSZ]),
            icdoff: le::u16(&b[f::ICDOFF]),
            ctrattr: b[f::CTRATTR],
            msdbd: b[f::MSDBD],
            ofcs: le::u16(&b[f::OFCS]),
        })
    }

    /// Writes the 4096 bytes; fields not in the representation are zero.
    ///
    /// # Panics
    /// If the buffer is shorter than 4096 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut IdentifyController<&mut T>) {
        use controller_field as f;
        let b = &mut view.buffer.as_mut()[..IDENTIFY_LEN];
        b.fill(0);
        le::set_u16(&mut b[f::VID], self.vid);
        le::set_u16(&mut b[f::SSVID], self.ssvid);
        emit_space_padded(&mut b[f::SN], &self.serial_number);
        emit_space_padded(&mut b[f::MN], &self.model_number);
        emit_space_padded(&mut b[f::FR], &self.firmware_revision);
        b[f::RAB] = self.rab;
        b[f::IEEE].copy_from_slice(&self.ieee);
        b[f::CMIC] = self.cmic;
        b[f::MDTS] = self.mdts;
        le::set_u16(&mut b[f::CNTLID], self.cntlid);
        le::set_u32(&mut b[f::VER], self.version);
        le::set_u32(&mut b[f::OAES], self.oaes);
        le::set_u32(&mut b[f::CTRATT], self.ctratt);
        b[f::CNTRLTYPE] = self.cntrltype;
        b[f::FGUID].copy_from_slice(&self.fguid);
        le::set_u16(&mut b[f::OACS], self.oacs);
        b[f::ACL] = self.acl;
        b[f::AERL] = self.aerl;
        b[f::FRMW] = self.frmw;
        b[f::LPA] = self.lpa;
        b[f::ELPE] = self.elpe;
        b[f::NPSS] = self.npss;
        le::set_u16(&mut b[f::KAS], self.kas);
        b[f::SQES] = self.sqes;
        b[f::CQES] = self.cqes;
        le::set_u16(&mut b[f::MAXCMD], self.maxcmd);
        le::set_u32(&mut b[f::NN], self.nn);
        le::set_u16(&mut b[f::ONCS], self.oncs);
        le::set_u16(&mut b[f::FUSES], self.fuses);
        b[f::FNA] = self.fna;
        b[f::VWC] = self.vwc;
        le::set_u16(&mut b[f::AWUN], self.awun);
        le::set_u16(&mut b[f::AWUPF], self.awupf);
        le::set_u32(&mut b[f::SGLS], self.sgls);
        le::set_u32(&mut b[f::MNAN], self.mnan);
        emit_nul_terminated(&mut b[f::SUBNQN], &self.subnqn);
        le::set_u32(&mut b[f::IOCCSZ], self.ioccsz);
        le::set_u32(&mut b[f::IORCSZ], self.iorcsz);
        le::set_u16(&mut b[f::ICDOFF], self.icdoff);
        b[f::CTRATTR] = self.ctrattr;
        b[f::MSDBD] = self.msdbd;
        le::set_u16(&mut b[f::OFCS], self.ofcs);
    }

    /// The 4096 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; IDENTIFY_LEN];
        self.emit(&mut IdentifyController::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Parses Identify Controller data from bytes.
///
/// # Errors
/// As [`IdentifyControllerRepr::parse`].
pub fn parse_identify_controller(bytes: &[u8]) -> Result<IdentifyControllerRepr, WireError> {
    IdentifyControllerRepr::parse(&IdentifyController::new_checked(bytes)?)
}

mod namespace_field {
    use core::ops::Range;
    pub const NSZE: Range<usize> = 0..8;
    pub const NCAP: Range<usize> = 8..16;
    pub const NUSE: Range<usize> = 16..24;
    pub const NSFEAT: usize = 24;
    pub const NLBAF: usize = 25;
    pub const FLBAS: usize = 26;
    pub const NMIC: usize = 30;
    pub const DLFEAT: usize = 33;
    pub const NGUID: Range<usize> = 104..120;
    pub const EUI64: Range<usize> = 120..128;
    pub const LBAF0: usize = 128;
}

/// Most LBA formats Identify Namespace describes (NLBAF is 0-based, at most 15 here).
pub const MAX_LBA_FORMATS: usize = 16;

/// One LBA format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: u16,
    /// Block size, 2^LBADS bytes (9 = 512, 12 = 4096).
    pub lbads: u8,
    /// Relative performance (bits 1:0).
    pub rp: u8,
}

fixed_view!(
    /// A view of Identify Namespace data.
    IdentifyNamespace,
    "Identify Namespace",
    4096
);

/// The fields of Identify Namespace a host uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct IdentifyNamespaceRepr {
    /// Namespace size, blocks.
    pub nsze: u64,
    /// Namespace capacity, blocks.
    pub ncap: u64,
    /// Namespace utilization, blocks.
    pub nuse: u64,
    /// Namespace features.
    pub nsfeat: u8,
    /// Formatted LBA size: index of the format in use (bits 3:0).
    pub flbas: u8,
    /// Namespace multi-path I/O and sharing (bit 0: may be shared).
    pub nmic: u8,
    /// Deallocate logical block features (bits 2:0 = 001b: deallocated blocks read as zeroes).
    pub dlfeat: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
    /// LBA formats (1..=16; NLBAF is their count minus one).
    pub lba_formats: Vec<LbaFormat>,
}

impl IdentifyNamespaceRepr {
    /// Reads Identify Namespace data.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 4096 bytes; [`WireError::Malformed`] for NLBAF
    /// above 15 or FLBAS naming a format that is not there.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &IdentifyNamespace<&T>) -> Result<Self, WireError> {
        use namespace_field as f;
        view.check_len()?;
        let b = view.buffer.as_ref();
        let count = usize::from(b[f::NLBAF]) + 1;
        if count > MAX_LBA_FORMATS {
            return Err(WireError::Malformed {
                format: "Identify Namespace",
                field: "NLBAF",
                value: u64::from(b[f::NLBAF]),
            });
        }
        if usize::from(b[f::FLBAS] & 0xF) >= count {
            return Err(WireError::Malformed {
                format: "Identify Namespace",
                field: "FLBAS",
                value: u64::from(b[f::FLBAS]),
            });
        }
        let lba_formats = (0..count)
            .map(|i| {
                let at = f::LBAF0 + 4 * i;
                LbaFormat {
                    ms: le::u16(&b[at..at + 2]),
                    lbads: b[at + 2],
                    rp: b[at + 3] & 0x3,
                }
            })
            .collect();
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[f::NGUID]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[f::EUI64]);
        Ok(Self {
            nsze: le::u64(&b[f::NSZE]),
            ncap: le::u64(&b[f::NCAP]),
            nuse: le::u64(&b[f::NUSE]),
            nsfeat: b[f::NSFEAT],
            flbas: b[f::FLBAS],
            nmic: b[f::NMIC],
            dlfeat: b[f::DLFEAT],
            nguid,
            eui64,
            lba_formats,
        })
    }

    /// Writes the 4096 bytes; fields not in the representation are zero.
    ///
    /// # Panics
    /// If the buffer is shorter than 4096 bytes, or with more than 16 LBA formats.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut IdentifyNamespace<&mut T>) {
        use namespace_field as f;
        assert!(self.lba_formats.len() <= MAX_LBA_FORMATS, "at most 16 LBA formats");
        let b = &mut view.buffer.as_mut()[..IDENTIFY_LEN];
        b.fill(0);
        le::set_u64(&mut b[f::NSZE], self.nsze);
        le::set_u64(&mut b[f::NCAP], self.ncap);
        le::set_u64(&mut b[f::NUSE], self.nuse);
        b[f::NSFEAT] = self.nsfeat;
        b[f::NLBAF] = self.lba_formats.len().saturating_sub(1) as u8;
        b[f::FLBAS] = self.flbas;
        b[f::NMIC] = self.nmic;
        b[f::DLFEAT] = self.dlfeat;
        b[f::NGUID].copy_from_slice(&self.nguid);
        b[f::EUI64].copy_from_slice(&self.eui64);
        for (i, format) in self.lba_formats.iter().enumerate() {
            let at = f::LBAF0 + 4 * i;
            le::set_u16(&mut b[at..at + 2], format.ms);
            b[at + 2] = format.lbads;
            b[at + 3] = format.rp & 0x3;
        }
    }

    /// The 4096 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; IDENTIFY_LEN];
        self.emit(&mut IdentifyNamespace::new_unchecked(&mut bytes[..]));
        bytes
    }

    /// Block size of the format in use, bytes (`None` if LBADS is outside 9..=16).
    pub fn block_size(&self) -> Option<u32> {
        let format = self.lba_formats.get(usize::from(self.flbas & 0xF))?;
        (9..=16).contains(&format.lbads).then(|| 1u32 << format.lbads)
    }
}

/// Parses Identify Namespace data from bytes.
///
/// # Errors
/// As [`IdentifyNamespaceRepr::parse`].
pub fn parse_identify_namespace(bytes: &[u8]) -> Result<IdentifyNamespaceRepr, WireError> {
    IdentifyNamespaceRepr::parse(&IdentifyNamespace::new_checked(bytes)?)
}

/// Most NSIDs an active namespace list holds.
pub const MAX_ACTIVE_NAMESPACES: usize = IDENTIFY_LEN / 4;

/// Reads an active namespace ID list (CNS 2): little-endian NSIDs up to the first zero.
///
/// # Errors
/// [`WireError::Truncated`] below 4096 bytes; [`WireError::Malformed`] if the NSIDs are
/// not strictly ascending.
pub fn parse_active_namespaces(bytes: &[u8]) -> Result<Vec<u32>, WireError> {
    check_len("active namespace list", IDENTIFY_LEN, bytes.len())?;
    let mut out = Vec::new();
    for chunk in bytes[..IDENTIFY_LEN].chunks_exact(4) {
        let nsid = le::u32(chunk);
        if nsid == 0 {
            break;
        }
        if out.last().is_some_and(|last| *last >= nsid) {
            return Err(WireError::Malformed {
                format: "active namespace list",
                field: "NSID",
                value: u64::from(nsid),
            });
        }
        out.push(nsid);
    }
    Ok(out)
}

/// Writes an active namespace ID list: the NSIDs of `nsids` above `after`, ascending, at
/// most 1024, zero-terminated.
pub fn emit_active_namespaces(nsids: &[u32], after: u32) -> Vec<u8> {
    let mut sorted: Vec<u32> = nsids.iter().copied().filter(|n| *n > after).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut bytes = vec![0u8; IDENTIFY_LEN];
    for (chunk, nsid) in bytes.chunks_exact_mut(4).zip(sorted.iter().take(MAX_ACTIVE_NAMESPACES)) {
        le::set_u32(chunk, *nsid);
    }
    bytes
}

/// One namespace identification descriptor (CNS 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamespaceDescriptor {
    /// NIDT 1: IEEE EUI-64.
    Eui64([u8; 8]),
    /// NIDT 2: NGUID.
    Nguid([u8; 16]),
    /// NIDT 3: UUID.
    Uuid([u8; 16]),
    /// NIDT 4: command set identifier.
    Csi(u8),
}

impl NamespaceDescriptor {
    fn type_and_length(&self) -> (u8, usize) {
        match self {
            Self::Eui64(_) => (1, 8),
            Self::Nguid(_) => (2, 16),
            Self::Uuid(_) => (3, 16),
            Self::Csi(_) => (4, 1),
        }
    }
}

/// Reads a namespace identification descriptor list: descriptors up to one with NIDT 0.
///
/// # Errors
/// [`WireError::Truncated`] below 4096 bytes or for a descriptor running past the end;
/// [`WireError::Malformed`] for an unknown NIDT or an NIDL that does not match it.
pub fn parse_namespace_descriptors(bytes: &[u8]) -> Result<Vec<NamespaceDescriptor>, WireError> {
    check_len("namespace descriptor list", IDENTIFY_LEN, bytes.len())?;
    let bytes = &bytes[..IDENTIFY_LEN];
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() && bytes[at] != 0 {
        let (nidt, nidl) = (bytes[at], usize::from(bytes[at + 1]));
        let expected = match nidt {
            1 => 8,
            2 | 3 => 16,
            4 => 1,
            _ => {
                return Err(WireError::Malformed {
                    format: "namespace descriptor list",
                    field: "NIDT",
                    value: u64::from(nidt),
                })
            }
        };
        if nidl != expected {
            return Err(WireError::Malformed {
                format: "namespace descriptor list",
                field: "NIDL",
                value: nidl as u64,
            });
        }
        let id = bytes.get(at + 4..at + 4 + nidl).ok_or(WireError::Truncated {
            format: "namespace descriptor list",
            needed: at + 4 + nidl,
            available: bytes.len(),
        })?;
        out.push(match nidt {
            1 => NamespaceDescriptor::Eui64(id.try_into().expect("8 bytes")),
            2 => NamespaceDescriptor::Nguid(id.try_into().expect("16 bytes")),
            3 => NamespaceDescriptor::Uuid(id.try_into().expect("16 bytes")),
            _ => NamespaceDescriptor::Csi(id[0]),
        });
        at += 4 + nidl;
    }
    Ok(out)
}

/// Writes a namespace identification descriptor list (4096 bytes).
pub fn emit_namespace_descriptors(descriptors: &[NamespaceDescriptor]) -> Vec<u8> {
    let mut bytes = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    for descriptor in descriptors {
        let (nidt, nidl) = descriptor.type_and_length();
        if at + 4 + nidl > IDENTIFY_LEN {
            break;
        }
        bytes[at] = nidt;
        bytes[at + 1] = nidl as u8;
        let id = &mut bytes[at + 4..at + 4 + nidl];
        match descriptor {
            NamespaceDescriptor::Eui64(v) => id.copy_from_slice(v),
            NamespaceDescriptor::Nguid(v) | NamespaceDescriptor::Uuid(v) => id.copy_from_slice(v),
            NamespaceDescriptor::Csi(v) => id[0] = *v,
        }
        at += 4 + nidl;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller() -> IdentifyControllerRepr {
        IdentifyControllerRepr {
            serial_number: "SN-EXAMPLE-000000001".into(),
            model_number: "Rust soft RoCE NVMe-oF target".into(),
            firmware_revision: "0.1".into(),
            cmic: 0x2,
            mdts: 8,
            cntlid: 1,
            version: 0x0001_0300,
            cntrltype: controller_type::IO,
            aerl: 3,
            lpa: 0x4,
            elpe: 15,
            kas: 10,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 128,
            nn: 4,
            oncs: oncs::DATASET_MANAGEMENT | oncs::WRITE_ZEROES,
            vwc: 1,
            sgls: sgls::SUPPORTED | sgls::KEYED | sgls::OFFSET,
            subnqn: "nqn.2024-01.io.example:sub1".into(),
            ioccsz: 260,
            iorcsz: 1,
            msdbd: 1,
            ofcs: 1,
            ..IdentifyControllerRepr::default()
        }
    }

    #[test]
    fn controller_fields_sit_at_their_offsets() {
        let bytes = controller().to_bytes();
        // B.8: SN at 4, MN at 24, MDTS 77, CNTLID 78, SQES 512, CQES 513, MAXCMD 514,
        // NN 516, SGLS 536, SUBNQN 768, IOCCSZ 1792, IORCSZ 1796, MSDBD 1803, OFCS 1804.
        assert_eq!(&bytes[4..24], b"SN-EXAMPLE-000000001");
        assert_eq!(&bytes[24..53], b"Rust soft RoCE NVMe-oF target");
        assert_eq!(bytes[53], b' ');
        assert_eq!(&bytes[64..72], b"0.1     ");
        assert_eq!((bytes[76], bytes[77]), (2, 8));
        assert_eq!(&bytes[78..80], &[1, 0]);
        assert_eq!(&bytes[80..84], &[0, 3, 1, 0]);
        assert_eq!(bytes[111], 1);
        assert_eq!(&bytes[320..322], &[10, 0]);
        assert_eq!((bytes[512], bytes[513]), (0x66, 0x44));
        assert_eq!(&bytes[514..516], &[128, 0]);
        assert_eq!(&bytes[516..520], &[4, 0, 0, 0]);
        assert_eq!(&bytes[536..540], &[0x05, 0x00, 0x10, 0x00]);
        assert_eq!(&bytes[768..795], b"nqn.2024-01.io.example:sub1");
        assert_eq!(bytes[795], 0);
        assert_eq!(&bytes[1792..1796], &[4, 1, 0, 0]);
        assert_eq!(&bytes[1796..1800], &[1, 0, 0, 0]);
        assert_eq!((bytes[1803], bytes[1804]), (1, 1));
    }

    #[test]
    fn controller_round_trips() {
        let repr = controller();
        assert_eq!(parse_identify_controller(&repr.to_bytes()).unwrap(), repr);
        let distinct = IdentifyControllerRepr {
            vid: 0x1234,
            ssvid: 0x5678,
            rab: 6,
            ieee: [1, 2, 3],
            oaes: 0x100,
            ctratt: 0x80,
            fguid: [9; 16],
            oacs: 0x4,
            acl: 3,
            frmw: 0x3,
            npss: 1,
            fuses: 1,
            fna: 2,
            awun: 7,
            awupf: 8,
            mnan: 9,
            icdoff: 0,
            ctrattr: 1,
            ..controller()
        };
        assert_eq!(parse_identify_controller(&distinct.to_bytes()).unwrap(), distinct);
    }

    fn namespace() -> IdentifyNamespaceRepr {
        IdentifyNamespaceRepr {
            nsze: 262_144,
            ncap: 262_144,
            nuse: 262_144,
            nmic: 1,
            dlfeat: 1,
            nguid: [0xA5; 16],
            eui64: [0x5A; 8],
            lba_formats: vec![LbaFormat {
                ms: 0,
                lbads: 12,
                rp: 0,
            }],
            ..IdentifyNamespaceRepr::default()
        }
    }

    #[test]
    fn namespace_fields_sit_at_their_offsets() {
        let bytes = namespace().to_bytes();
        // B.8: NSZE 0, NCAP 8, NUSE 16, NLBAF 25, FLBAS 26, NMIC 30, NGUID 104,
        // EUI64 120, LBAF[0].LBADS at 130.
        assert_eq!(&bytes[0..8], &262_144u64.to_le_bytes());
        assert_eq!(&bytes[8..16], &262_144u64.to_le_bytes());
        assert_eq!((bytes[25], bytes[26], bytes[30], bytes[33]), (0, 0, 1, 1));
        assert_eq!(&bytes[104..120], &[0xA5; 16]);
        assert_eq!(&bytes[120..128], &[0x5A; 8]);
        assert_eq!(bytes[130], 12);
    }

    #[test]
    fn namespace_round_trips_and_checks_formats() {
        let repr = namespace();
        let parsed = parse_identify_namespace(&repr.to_bytes()).unwrap();
        assert_eq!(parsed, repr);
        assert_eq!(parsed.block_size(), Some(4096));
        let mut bytes = repr.to_bytes();
        bytes[26] = 1; // FLBAS names format 1, NLBAF says there is one format
        assert!(matches!(
            parse_identify_namespace(&bytes),
            Err(WireError::Malformed { field: "FLBAS", .. })
        ));
        bytes[25] = 16;
        assert!(matches!(
            parse_identify_namespace(&bytes),
            Err(WireError::Malformed { field: "NLBAF", .. })
        ));
    }

    #[test]
    fn active_namespace_list() {
        let bytes = emit_active_namespaces(&[3, 1, 2, 7], 1);
        assert_eq!(&bytes[..16], &[2, 0, 0, 0, 3, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_active_namespaces(&bytes).unwrap(), vec![2, 3, 7]);
        let mut unordered = bytes.clone();
        unordered[4] = 1;
        assert!(parse_active_namespaces(&unordered).is_err());
        assert!(parse_active_namespaces(&bytes[..4095]).is_err());
    }

    #[test]
    fn namespace_descriptors() {
        let list = [
            NamespaceDescriptor::Nguid([1; 16]),
            NamespaceDescriptor::Uuid([2; 16]),
            NamespaceDescriptor::Csi(0),
        ];
        let bytes = emit_namespace_descriptors(&list);
        assert_eq!(&bytes[..4], &[2, 16, 0, 0]);
        assert_eq!(&bytes[20..24], &[3, 16, 0, 0]);
        assert_eq!(&bytes[40..45], &[4, 1, 0, 0, 0]);
        assert_eq!(parse_namespace_descriptors(&bytes).unwrap(), list);
        let mut bad = bytes.clone();
        bad[1] = 8;
        assert!(matches!(
            parse_namespace_descriptors(&bad),
            Err(WireError::Malformed { field: "NIDL", .. })
        ));
        let mut bad = bytes;
        bad[0] = 9;
        assert!(matches!(
            parse_namespace_descriptors(&bad),
            Err(WireError::Malformed { field: "NIDT", .. })
        ));
    }

    #[test]
    fn rejects_truncated_input() {
        let bytes = controller().to_bytes();
        for len in [0, 4, 1023, 4095] {
            assert!(parse_identify_controller(&bytes[..len]).is_err());
            assert!(parse_identify_namespace(&bytes[..len]).is_err());
            assert!(parse_namespace_descriptors(&bytes[..len]).is_err());
        }
    }
}
