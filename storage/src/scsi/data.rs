//! Parameter data of the commands a block target serves: INQUIRY standard data and the
//! VPD pages Linux asks for, READ CAPACITY(10/16) data, MODE SENSE headers and pages,
//! REPORT LUNS lists and UNMAP parameter lists (SPC-4/SBC-3 layouts; storage-and-cm.md
//! C.7).

use super::{be, check_len, parse_space_padded, space_padded, WireError};

/// Bytes of standard INQUIRY data sent here.
pub const INQUIRY_LEN: usize = 36;

/// Standard INQUIRY data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InquiryRepr {
    /// Peripheral qualifier (bits 7:5) and device type (4:0): 0x00 a connected disk,
    /// 0x7F no logical unit here.
    pub peripheral: u8,
    /// Removable medium.
    pub removable: bool,
    /// VERSION (0x06: SPC-4 — Linux then tries READ CAPACITY(16) first).
    pub version: u8,
    /// HISUP (hierarchical LUN addressing).
    pub hisup: bool,
    /// 3PC, PROTECT and TPGS (byte 5).
    pub byte5: u8,
    /// CMDQUE: command queueing.
    pub cmdque: bool,
    /// T10 vendor identification (8 ASCII).
    pub vendor: String,
    /// Product identification (16 ASCII).
    pub product: String,
    /// Product revision level (4 ASCII).
    pub revision: String,
}

impl InquiryRepr {
    /// Writes the 36 bytes (additional length 31).
    ///
    /// # Panics
    /// If `out` is shorter than 36 bytes.
    pub fn emit(&self, out: &mut [u8]) {
        out[..INQUIRY_LEN].fill(0);
        out[0] = self.peripheral;
        out[1] = if self.removable { 0x80 } else { 0 };
        out[2] = self.version;
        out[3] = 0x02 | if self.hisup { 0x10 } else { 0 };
        out[4] = (INQUIRY_LEN - 5) as u8;
        out[5] = self.byte5;
        out[7] = if self.cmdque { 0x02 } else { 0 };
        space_padded(&mut out[8..16], &self.vendor);
        space_padded(&mut out[16..32], &self.product);
        space_padded(&mut out[32..36], &self.revision);
    }

    /// As bytes.
    pub fn to_bytes(&self) -> [u8; INQUIRY_LEN] {
        let mut out = [0u8; INQUIRY_LEN];
        self.emit(&mut out);
        out
    }

    /// Reads standard INQUIRY data (at least 36 bytes).
    ///
    /// # Errors
    /// Truncated input; a response data format other than 2.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("INQUIRY data", INQUIRY_LEN, bytes.len())?;
        if bytes[3] & 0x0F != 2 {
            return Err(WireError::Malformed {
                format: "INQUIRY data",
                field: "response data format",
                value: u64::from(bytes[3] & 0x0F),
            });
        }
        Ok(Self {
            peripheral: bytes[0],
            removable: bytes[1] & 0x80 != 0,
            version: bytes[2],
            hisup: bytes[3] & 0x10 != 0,
            byte5: bytes[5],
            cmdque: bytes[7] & 0x02 != 0,
            vendor: parse_space_padded(&bytes[8..16]),
            product: parse_space_padded(&bytes[16..32]),
            revision: parse_space_padded(&bytes[32..36]),
        })
    }
}

/// VPD page codes served.
pub mod vpd {
    /// Supported VPD pages.
    pub const SUPPORTED_PAGES: u8 = 0x00;
    /// Unit serial number.
    pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
    /// Device identification.
    pub const DEVICE_IDENTIFICATION: u8 = 0x83;
    /// Block limits.
    pub const BLOCK_LIMITS: u8 = 0xB0;
    /// Block device characteristics.
    pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xB1;
    /// Logical block provisioning.
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xB2;
    /// All of them, ascending.
    pub const ALL: [u8; 6] = [
        SUPPORTED_PAGES,
        UNIT_SERIAL_NUMBER,
        DEVICE_IDENTIFICATION,
        BLOCK_LIMITS,
        BLOCK_DEVICE_CHARACTERISTICS,
        LOGICAL_BLOCK_PROVISIONING,
    ];
}

/// A VPD page: 4-byte header (device type, page code, page length) and `payload`.
pub fn vpd_page(peripheral: u8, page: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![peripheral, page, 0, 0];
    be::set_u16(&mut out[2..4], payload.len().min(0xFFFF) as u16);
    out.extend_from_slice(payload);
    out
}

/// Reads a VPD page: its code and payload (clipped to the bytes present).
///
/// # Errors
/// Fewer than 4 bytes.
pub fn parse_vpd_page(bytes: &[u8]) -> Result<(u8, &[u8]), WireError> {
    check_len("VPD page", 4, bytes.len())?;
    let len = usize::from(be::u16(&bytes[2..4]));
    Ok((bytes[1], &bytes[4..bytes.len().min(4 + len)]))
}

/// The device identification payload: an NAA IEEE Registered (6) designator of the LU
/// and a T10 vendor ID designator (`vendor` + `serial`), both with association 0 (LU).
pub fn device_identification(naa: [u8; 16], vendor: &str, serial: &str) -> Vec<u8> {
    let mut out = vec![0x01, 0x03, 0x00, 0x10];
    out.extend_from_slice(&naa);
    let mut t10 = vec![0u8; 8];
    space_padded(&mut t10, vendor);
    t10.extend_from_slice(serial.as_bytes());
    out.extend_from_slice(&[0x02, 0x01, 0x00, t10.len().min(255) as u8]);
    out.extend_from_slice(&t10[..t10.len().min(255)]);
    out
}

/// The designators of a device identification payload: (code set, type, identifier).
pub fn parse_designators(payload: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= payload.len() {
        let len = usize::from(payload[at + 3]);
        let end = (at + 4 + len).min(payload.len());
        out.push((
            payload[at] & 0x0F,
            payload[at + 1] & 0x0F,
            payload[at + 4..end].to_vec(),
        ));
        at += 4 + len;
    }
    out
}

/// Block limits (0xB0) payload, 0x3C bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockLimits {
    /// Maximum transfer length, blocks.
    pub max_transfer_blocks: u32,
    /// Optimal transfer length, blocks.
    pub optimal_transfer_blocks: u32,
    /// Maximum unmap LBA count.
    pub max_unmap_blocks: u32,
    /// Maximum unmap block descriptor count.
    pub max_unmap_descriptors: u32,
}

impl BlockLimits {
    /// The payload.
    pub fn to_payload(&self) -> Vec<u8> {
        let mut out = vec![0u8; 0x3C];
        be::set_u16(&mut out[2..4], 1); // optimal transfer length granularity
        be::set_u32(&mut out[4..8], self.max_transfer_blocks);
        be::set_u32(&mut out[8..12], self.optimal_transfer_blocks);
        be::set_u32(&mut out[16..20], self.max_unmap_blocks);
        be::set_u32(&mut out[20..24], self.max_unmap_descriptors);
        be::set_u32(&mut out[24..28], 1); // unmap granularity
        out
    }

    /// Reads the payload.
    ///
    /// # Errors
    /// Fewer than 24 bytes.
    pub fn parse(payload: &[u8]) -> Result<Self, WireError> {
        check_len("block limits VPD", 24, payload.len())?;
        Ok(Self {
            max_transfer_blocks: be::u32(&payload[4..8]),
            optimal_transfer_blocks: be::u32(&payload[8..12]),
            max_unmap_blocks: be::u32(&payload[16..20]),
            max_unmap_descriptors: be::u32(&payload[20..24]),
        })
    }
}

/// Block device characteristics (0xB1) payload: non-rotating medium.
pub fn block_device_characteristics() -> Vec<u8> {
    let mut out = vec![0u8; 0x3C];
    be::set_u16(&mut out[0..2], 1);
    out
}

/// Logical block provisioning (0xB2) payload: UNMAP supported (LBPU), unmapped blocks
/// read zero (LBPRZ), thin provisioned.
pub fn logical_block_provisioning() -> Vec<u8> {
    vec![0x00, 0x80 | 0x04, 0x02, 0x00]
}

/// READ CAPACITY(10) data: the last LBA (saturated at 0xFFFFFFFF) and the block length.
pub fn read_capacity_10(blocks: u64, block_size: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    let last = blocks.saturating_sub(1).min(u64::from(u32::MAX)) as u32;
    be::set_u32(&mut out[0..4], last);
    be::set_u32(&mut out[4..8], block_size);
    out
}

/// READ CAPACITY(16) data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity16 {
    /// Last logical block address.
    pub last_lba: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Logical block provisioning management enabled (UNMAP served).
    pub lbpme: bool,
    /// Unmapped blocks read zero.
    pub lbprz: bool,
}

impl Capacity16 {
    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        be::set_u64(&mut out[0..8], self.last_lba);
        be::set_u32(&mut out[8..12], self.block_size);
        out[14] = if self.lbpme { 0x80 } else { 0 } | if self.lbprz { 0x40 } else { 0 };
        out
    }

    /// Reads at least 12 bytes.
    ///
    /// # Errors
    /// Truncated input.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        check_len("READ CAPACITY(16) data", 12, bytes.len())?;
        Ok(Self {
            last_lba: be::u64(&bytes[0..8]),
            block_size: be::u32(&bytes[8..12]),
            lbpme: bytes.get(14).is_some_and(|b| b & 0x80 != 0),
            lbprz: bytes.get(14).is_some_and(|b| b & 0x40 != 0),
        })
    }
}

/// Reads READ CAPACITY(10) data: (last LBA, block length).
///
/// # Errors
/// Truncated input.
pub fn parse_read_capacity_10(bytes: &[u8]) -> Result<(u32, u32), WireError> {
    check_len("READ CAPACITY(10) data", 8, bytes.len())?;
    Ok((be::u32(&bytes[0..4]), be::u32(&bytes[4..8])))
}

/// Mode page codes served.
pub mod mode_page {
    /// Caching.
    pub const CACHING: u8 = 0x08;
    /// Control.
    pub const CONTROL: u8 = 0x0A;
    /// All pages.
    pub const ALL: u8 = 0x3F;
}

/// The caching mode page (0x08, 20 bytes); `changeable` gives the changeable-values
/// mask (nothing is).
pub fn caching_page(write_cache: bool, changeable: bool) -> Vec<u8> {
    let mut out = vec![0u8; 20];
    out[0] = mode_page::CACHING;
    out[1] = 0x12;
    if write_cache && !changeable {
        out[2] = 0x04;
    }
    out
}

/// The control mode page (0x0A, 12 bytes): fixed-format sense (D_SENSE 0), unrestricted
/// reordering of simple tasks.
pub fn control_page(changeable: bool) -> Vec<u8> {
    let mut out = vec![0u8; 12];
    out[0] = mode_page::CONTROL;
    out[1] = 0x0A;
    if !changeable {
        out[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted
        be::set_u16(&mut out[8..10], 0xFFFF); // busy timeout period: unlimited
    }
    out
}

/// MODE SENSE parameter data: header (6- or 10-byte form), an optional short block
/// descriptor and `pages`.
pub fn mode_parameters(ten: bool, write_protect: bool, block: Option<(u64, u32)>, pages: &[u8]) -> Vec<u8> {
    let device_specific = 0x10 | if write_protect { 0x80 } else { 0 }; // DPOFUA
    let mut descriptor = Vec::new();
    if let Some((blocks, block_size)) = block {
        descriptor = vec![0u8; 8];
        be::set_u32(&mut descriptor[0..4], blocks.min(u64::from(u32::MAX)) as u32);
        be::set_u32(&mut descriptor[4..8], block_size & 0x00FF_FFFF);
    }
    let mut out = if ten {
        let mut h = vec![0u8; 8];
        h[3] = device_specific;
        be::set_u16(&mut h[6..8], descriptor.len() as u16);
        h
    } else {
        vec![0, 0, device_specific, descriptor.len() as u8]
    };
    out.extend_from_slice(&descriptor);
    out.extend_from_slice(pages);
    if ten {
        let len = (out.len() - 2).min(0xFFFF) as u16;
        be::set_u16(&mut out[0..2], len);
    } else {
        out[0] = (out.len() - 1).min(255) as u8;
    }
    out
}

/// REPORT LUNS parameter data for `luns` (8-byte SAM LUNs).
pub fn report_luns(luns: &[u64]) -> Vec<u8> {
    let mut out = vec![0u8; 8 + 8 * luns.len()];
    be::set_u32(&mut out[0..4], (8 * luns.len()) as u32);
    for (i, lun) in luns.iter().enumerate() {
        be::set_u64(&mut out[8 + 8 * i..16 + 8 * i], *lun);
    }
    out
}

/// Reads REPORT LUNS parameter data (the LUNs present in the bytes given).
///
/// # Errors
/// Fewer than 8 bytes.
pub fn parse_report_luns(bytes: &[u8]) -> Result<Vec<u64>, WireError> {
    check_len("REPORT LUNS data", 8, bytes.len())?;
    let len = be::u32(&bytes[0..4]) as usize;
    let end = bytes.len().min(8usize.saturating_add(len));
    Ok(bytes[8..end].chunks_exact(8).map(be::u64).collect())
}

/// One UNMAP block descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnmapDescriptor {
    /// First block.
    pub lba: u64,
    /// Blocks.
    pub blocks: u32,
}

/// Builds an UNMAP parameter list.
pub fn unmap_parameters(descriptors: &[UnmapDescriptor]) -> Vec<u8> {
    let mut out = vec![0u8; 8 + 16 * descriptors.len()];
    let len = (out.len() - 2) as u16;
    be::set_u16(&mut out[0..2], len);
    be::set_u16(&mut out[2..4], (16 * descriptors.len()) as u16);
    for (i, d) in descriptors.iter().enumerate() {
        be::set_u64(&mut out[8 + 16 * i..16 + 16 * i], d.lba);
        be::set_u32(&mut out[16 + 16 * i..20 + 16 * i], d.blocks);
    }
    out
}

/// Reads an UNMAP parameter list.
///
/// # Errors
/// Truncated input (header, or the descriptors it announces); a block descriptor data
/// length that is not a multiple of 16.
pub fn parse_unmap_parameters(bytes: &[u8]) -> Result<Vec<UnmapDescriptor>, WireError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    check_len("UNMAP parameter list", 8, bytes.len())?;
    let descriptor_len = usize::from(be::u16(&bytes[2..4]));
    if !descriptor_len.is_multiple_of(16) {
        return Err(WireError::Malformed {
            format: "UNMAP parameter list",
            field: "block descriptor data length",
            value: descriptor_len as u64,
        });
    }
    check_len("UNMAP parameter list", 8 + descriptor_len, bytes.len())?;
    Ok(bytes[8..8 + descriptor_len]
        .chunks_exact(16)
        .map(|d| UnmapDescriptor {
            lba: be::u64(&d[0..8]),
            blocks: be::u32(&d[8..12]),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inquiry() -> InquiryRepr {
        InquiryRepr {
            peripheral: 0,
            removable: false,
            version: 6,
            hisup: true,
            byte5: 0,
            cmdque: true,
            vendor: "RNIC-EMU".into(),
            product: "SRP disk".into(),
            revision: "0.1".into(),
        }
    }

    #[test]
    fn emits_and_parses_known_standard_inquiry() {
        let bytes = inquiry().to_bytes();
        assert_eq!(&bytes[..8], &[0, 0, 6, 0x12, 31, 0, 0, 2]);
        assert_eq!(&bytes[8..16], b"RNIC-EMU");
        assert_eq!(&bytes[16..32], b"SRP disk        ");
        assert_eq!(&bytes[32..36], b"0.1 ");
        assert_eq!(InquiryRepr::parse(&bytes).unwrap(), inquiry());
        assert!(InquiryRepr::parse(&bytes[..35]).is_err());
        let mut bad = bytes;
        bad[3] = 1;
        assert!(InquiryRepr::parse(&bad).is_err());
    }

    #[test]
    fn capacities_round_trip_and_saturate() {
        assert_eq!(read_capacity_10(2048, 512), [0, 0, 0x07, 0xFF, 0, 0, 2, 0]);
        assert_eq!(
            parse_read_capacity_10(&read_capacity_10(1 << 40, 4096)).unwrap(),
            (u32::MAX, 4096)
        );
        let c = Capacity16 {
            last_lba: (1 << 40) - 1,
            block_size: 512,
            lbpme: true,
            lbprz: true,
        };
        let bytes = c.to_bytes();
        assert_eq!(bytes[14], 0xC0);
        assert_eq!(Capacity16::parse(&bytes).unwrap(), c);
        assert!(Capacity16::parse(&bytes[..11]).is_err());
    }

    #[test]
    fn vpd_pages_and_designators() {
        let page = vpd_page(
            0,
            vpd::DEVICE_IDENTIFICATION,
            &device_identification([0x60; 16], "RNIC-EMU", "abc"),
        );
        assert_eq!(&page[..8], &[0, 0x83, 0, 35, 0x01, 0x03, 0, 0x10]);
        let (code, payload) = parse_vpd_page(&page).unwrap();
        assert_eq!(code, 0x83);
        let designators = parse_designators(payload);
        assert_eq!(designators[0], (1, 3, vec![0x60; 16]));
        assert_eq!(designators[1].2, b"RNIC-EMUabc".to_vec());
        let limits = BlockLimits {
            max_transfer_blocks: 512,
            optimal_transfer_blocks: 8,
            max_unmap_blocks: 1 << 20,
            max_unmap_descriptors: 64,
        };
        let payload = limits.to_payload();
        assert_eq!(payload.len(), 0x3C);
        assert_eq!(BlockLimits::parse(&payload).unwrap(), limits);
        assert!(parse_vpd_page(&[0, 0x80, 0]).is_err());
    }

    #[test]
    fn mode_parameter_headers() {
        let pages = caching_page(true, false);
        let six = mode_parameters(false, false, Some((100, 512)), &pages);
        assert_eq!(&six[..4], &[(4 + 8 + 20 - 1) as u8, 0, 0x10, 8]);
        assert_eq!(&six[4..12], &[0, 0, 0, 100, 0, 0, 2, 0]);
        assert_eq!(six[12], 0x08);
        assert_eq!(six[14], 0x04);
        let ten = mode_parameters(true, true, None, &control_page(false));
        assert_eq!(&ten[..8], &[0, 18, 0, 0x90, 0, 0, 0, 0]);
    }

    #[test]
    fn report_luns_and_unmap_lists_round_trip() {
        let luns = [0u64, 1 << 48, 7 << 48];
        let bytes = report_luns(&luns);
        assert_eq!(&bytes[..8], &[0, 0, 0, 24, 0, 0, 0, 0]);
        assert_eq!(parse_report_luns(&bytes).unwrap(), luns);
        // A short allocation length clips the list.
        assert_eq!(parse_report_luns(&bytes[..16]).unwrap(), [0]);
        let descriptors = [
            UnmapDescriptor { lba: 8, blocks: 16 },
            UnmapDescriptor {
                lba: 1 << 33,
                blocks: 1,
            },
        ];
        let list = unmap_parameters(&descriptors);
        assert_eq!(&list[..4], &[0, 38, 0, 32]);
        assert_eq!(parse_unmap_parameters(&list).unwrap(), descriptors);
        assert!(parse_unmap_parameters(&list[..39]).is_err());
        let mut odd = list.clone();
        odd[3] = 17;
        assert!(parse_unmap_parameters(&odd).is_err());
        assert!(parse_unmap_parameters(&[]).unwrap().is_empty());
    }
}
