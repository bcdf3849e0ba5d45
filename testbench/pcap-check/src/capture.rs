//! Reading capture files: classic pcap (either byte order, micro- or nanosecond stamps)
//! and pcapng (section header, interface description and packet blocks; the rest is
//! skipped). Only Ethernet captures (link type 1) are accepted: every frame the project
//! checks is an Ethernet frame.
//!
//! Hand-written rather than a crate: the pcap crates on crates.io either link libpcap or
//! derive with syn 1, and the workspace builds one syn (see the root Cargo.toml); the two
//! formats take a hundred lines.

/// pcap/pcapng link type of Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// One packet of a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// 1-based position in the file, as tshark's `frame.number`.
    pub number: u64,
    /// The captured bytes.
    pub bytes: Vec<u8>,
    /// The frame's length on the wire (more than `bytes.len()` when the capture cut it).
    pub original_length: u32,
}

/// Why a capture file cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CaptureError {
    /// Neither a pcap nor a pcapng file.
    #[error("not a pcap or pcapng file (magic {0:02x?})")]
    Format([u8; 4]),
    /// The file ends inside a header or a record.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// A block whose length is impossible.
    #[error("bad pcapng block at byte {at}: {why}")]
    Block {
        /// Offset of the block.
        at: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// Not an Ethernet capture.
    #[error("link type {0}, not Ethernet (1)")]
    LinkType(u32),
}

/// The packets of a pcap or pcapng file.
///
/// # Errors
/// A file that is neither format, is cut short, or is not an Ethernet capture.
pub fn read_capture(file: &[u8]) -> Result<Vec<Packet>, CaptureError> {
    let magic: [u8; 4] = file
        .get(..4)
        .ok_or(CaptureError::Truncated(0))?
        .try_into()
        .unwrap_or([0; 4]);
    match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => read_pcapng(file),
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => read_pcap(file, false),
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => read_pcap(file, true),
        other => Err(CaptureError::Format(other)),
    }
}

fn u32_at(file: &[u8], at: usize, big_endian: bool) -> Result<u32, CaptureError> {
    let bytes: [u8; 4] = file
        .get(at..at + 4)
        .ok_or(CaptureError::Truncated(at))?
        .try_into()
        .unwrap_or([0; 4]);
    Ok(if big_endian {
        u32::from_be_bytes(bytes)
    } else {
        u32::from_le_bytes(bytes)
    })
}

fn u16_at(file: &[u8], at: usize, big_endian: bool) -> Result<u16, CaptureError> {
    let bytes: [u8; 2] = file
        .get(at..at + 2)
        .ok_or(CaptureError::Truncated(at))?
        .try_into()
        .unwrap_or([0; 2]);
    Ok(if big_endian {
        u16::from_be_bytes(bytes)
    } else {
        u16::from_le_bytes(bytes)
    })
}

/// Classic pcap: a 24-byte header (link type at 20), then per packet a 16-byte record
/// header (captured length at 8, original length at 12) and the bytes.
fn read_pcap(file: &[u8], big_endian: bool) -> Result<Vec<Packet>, CaptureError> {
    let link_type = u32_at(file, 20, big_endian)? & 0x0FFF_FFFF;
    if link_type != LINKTYPE_ETHERNET {
        return Err(CaptureError::LinkType(link_type));
    }
    let mut packets = Vec::new();
    let mut at = 24;
    while at < file.len() {
        let captured = u32_at(file, at + 8, big_endian)? as usize;
        let original_length = u32_at(file, at + 12, big_endian)?;
        let data = at + 16;
        let bytes = file.get(data..data + captured).ok_or(CaptureError::Truncated(data))?;
        packets.push(Packet {
            number: packets.len() as u64 + 1,
            bytes: bytes.to_vec(),
            original_length,
        });
        at = data + captured;
    }
    Ok(packets)
}

/// pcapng: blocks of `type, total length, body, total length`; the section header's
/// byte-order magic says how to read its section; interface description blocks give each
/// interface's link type; enhanced (6), simple (3) and obsolete (2) packet blocks carry
/// packets.
fn read_pcapng(file: &[u8]) -> Result<Vec<Packet>, CaptureError> {
    let mut packets = Vec::new();
    let mut big_endian = false;
    let mut interfaces: Vec<u32> = Vec::new();
    let mut at = 0;
    while at < file.len() {
        let block_type = u32_at(file, at, false)?;
        if block_type == 0x0A0D_0D0A {
            big_endian = match file.get(at + 8..at + 12) {
                Some([0x1a, 0x2b, 0x3c, 0x4d]) => true,
                Some([0x4d, 0x3c, 0x2b, 0x1a]) => false,
                Some(_) => {
                    return Err(CaptureError::Block {
                        at,
                        why: "byte-order magic",
                    })
                }
                None => return Err(CaptureError::Truncated(at)),
            };
            interfaces.clear();
        }
        let block_type = u32_at(file, at, big_endian)?;
        let length = u32_at(file, at + 4, big_endian)? as usize;
        if length < 12 || length % 4 != 0 {
            return Err(CaptureError::Block { at, why: "length" });
        }
        let end = at.checked_add(length).ok_or(CaptureError::Truncated(at))?;
        if end > file.len() {
            return Err(CaptureError::Truncated(at));
        }
        let body = &file[at + 8..end - 4];
        let packet = |interface: u32, captured: usize, original_length: u32, data: usize| {
            let link_type = *interfaces.get(interface as usize).ok_or(CaptureError::Block {
                at,
                why: "unknown interface",
            })?;
            if link_type != LINKTYPE_ETHERNET {
                return Err(CaptureError::LinkType(link_type));
            }
            let bytes = body.get(data..data + captured).ok_or(CaptureError::Block {
                at,
                why: "packet longer than its block",
            })?;
            Ok(Packet {
                number: 0,
                bytes: bytes.to_vec(),
                original_length,
            })
        };
        let found = match block_type {
            1 => {
                interfaces.push(u32::from(u16_at(body, 0, big_endian)?));
                None
            }
            6 => Some(packet(
                u32_at(body, 0, big_endian)?,
                u32_at(body, 12, big_endian)? as usize,
                u32_at(body, 16, big_endian)?,
                20,
            )?),
            2 => Some(packet(
                u32::from(u16_at(body, 0, big_endian)?),
                u32_at(body, 12, big_endian)? as usize,
                u32_at(body, 16, big_endian)?,
                20,
            )?),
            3 => {
                let original_length = u32_at(body, 0, big_endian)?;
                let captured = (original_length as usize).min(body.len() - 4);
                Some(packet(0, captured, original_length, 4)?)
            }
            _ => None,
        };
        if let Some(mut found) = found {
            found.number = packets.len() as u64 + 1;
            packets.push(found);
        }
        at = end;
    }
    Ok(packets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap(big_endian: bool, frames: &[&[u8]]) -> Vec<u8> {
        let word = |v: u32| if big_endian { v.to_be_bytes() } else { v.to_le_bytes() };
        let half = |v: u16| if big_endian { v.to_be_bytes() } else { v.to_le_bytes() };
        let mut file = word(0xa1b2_c3d4).to_vec();
        file.extend_from_slice(&half(2));
        file.extend_from_slice(&half(4));
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&word(65535));
        file.extend_from_slice(&word(1));
        for frame in frames {
            file.extend_from_slice(&[0; 8]);
            file.extend_from_slice(&word(frame.len() as u32));
            file.extend_from_slice(&word(frame.len() as u32 + 3));
            file.extend_from_slice(frame);
        }
        file
    }

    #[test]
    fn pcap_in_either_byte_order_reads_frame_for_frame() {
        for big_endian in [false, true] {
            let packets = read_capture(&pcap(big_endian, &[&[1, 2, 3], &[], &[9; 70]])).unwrap();
            assert_eq!(packets.len(), 3);
            assert_eq!(packets[0].bytes, [1, 2, 3]);
            assert_eq!(packets[0].original_length, 6);
            assert_eq!(packets[2].number, 3);
            assert_eq!(packets[2].bytes, [9; 70]);
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_errors() {
        let file = pcap(false, &[&[1, 2, 3, 4]]);
        assert_eq!(read_capture(&file[..file.len() - 1]), Err(CaptureError::Truncated(40)));
        assert!(matches!(read_capture(b"GIF89a"), Err(CaptureError::Format(_))));
        assert_eq!(read_capture(&[]), Err(CaptureError::Truncated(0)));
        let mut cooked = pcap(false, &[]);
        cooked[20] = 113; // Linux cooked capture
        assert_eq!(read_capture(&cooked), Err(CaptureError::LinkType(113)));
    }

    #[test]
    fn pcapng_reads_enhanced_and_simple_packet_blocks() {
        let block = |kind: u32, body: &[u8]| {
            let length = 12 + body.len().next_multiple_of(4);
            let mut out = kind.to_le_bytes().to_vec();
            out.extend_from_slice(&(length as u32).to_le_bytes());
            out.extend_from_slice(body);
            out.resize(length - 4, 0);
            out.extend_from_slice(&(length as u32).to_le_bytes());
            out
        };
        let mut file = block(
            0x0A0D_0D0A,
            &[
                0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
        );
        file.extend(block(1, &[1, 0, 0, 0, 0, 0, 0, 0]));
        let mut epb = vec![0u8; 20];
        epb[12..16].copy_from_slice(&5u32.to_le_bytes());
        epb[16..20].copy_from_slice(&5u32.to_le_bytes());
        epb.extend_from_slice(b"hello");
        file.extend(block(6, &epb));
        file.extend(block(4, &[0; 8])); // name resolution: skipped
        let mut spb = 3u32.to_le_bytes().to_vec();
        spb.extend_from_slice(b"abc");
        file.extend(block(3, &spb));
        let packets = read_capture(&file).unwrap();
        assert_eq!(packets.len(), 2);
        assert_eq!(packets[0].bytes, b"hello");
        assert_eq!(packets[1].bytes, b"abc");
        assert_eq!(packets[1].number, 2);
    }
}
