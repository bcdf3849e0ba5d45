//! pcap files of what went over the wire, for Wireshark, tshark and tcpdump.
//!
//! The classic pcap format: a 24-byte file header (nanosecond-resolution magic, version
//! 2.4, snapshot length, link type Ethernet) and a 16-byte header per frame (timestamp
//! seconds and nanoseconds, kept length, original length), all little-endian whatever the
//! host, so one run gives the same bytes everywhere. Timestamps are virtual time (a run
//! starts at the epoch).
//!
//! Written by hand rather than with the `pcap-file` crate: the format is these 40 bytes of
//! headers, while `pcap-file` 2.x would add a second `syn` (1.x) and a second `thiserror`
//! (1.x) to every build. This module only formats into any `std::io::Write`; opening files
//! is the caller's business (the model makes no OS calls).

use std::io::{self, Write};

use super::CapturedFrame;
use crate::time::Picoseconds;

/// Magic number of a nanosecond-resolution pcap file.
pub const MAGIC_NANOSECONDS: u32 = 0xA1B2_3C4D;
/// Link type Ethernet (frames without FCS).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Longest frame kept whole; a longer one is cut and keeps its original length.
pub const SNAPLEN: u32 = 262_144;

/// A pcap stream being written, one frame at a time.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header to `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&MAGIC_NANOSECONDS.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes());
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // 8..16: time zone offset and timestamp accuracy, both zero.
        header[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&header)?;
        Ok(Self { out, frames: 0 })
    }

    /// Appends one frame seen at virtual time `time`.
    pub fn write_frame(&mut self, time: Picoseconds, bytes: &[u8]) -> io::Result<()> {
        let nanoseconds = time.as_nanos();
        let original = u32::try_from(bytes.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame longer than 4 GiB"))?;
        let kept = &bytes[..bytes.len().min(SNAPLEN as usize)];
        let mut record = [0u8; 16];
        let seconds = u32::try_from(nanoseconds / 1_000_000_000)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "timestamp beyond 2106"))?;
        record[0..4].copy_from_slice(&seconds.to_le_bytes());
        record[4..8].copy_from_slice(&((nanoseconds % 1_000_000_000) as u32).to_le_bytes());
        record[8..12].copy_from_slice(&(kept.len() as u32).to_le_bytes());
        record[12..16].copy_from_slice(&original.to_le_bytes());
        self.out.write_all(&record)?;
        self.out.write_all(kept)?;
        self.frames += 1;
        Ok(())
    }

    /// Appends a captured frame.
    pub fn write(&mut self, frame: &CapturedFrame) -> io::Result<()> {
        self.write_frame(frame.time, &frame.bytes)
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flushes buffered frames to the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Why [`read_pcap`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PcapError {
    /// The input ends inside a header or a frame.
    #[error("pcap truncated at byte {offset}")]
    Truncated {
        /// Where the missing bytes start.
        offset: usize,
    },
    /// Not a little-endian nanosecond pcap of Ethernet frames.
    #[error("not an rnic pcap: {what}")]
    Format {
        /// What is wrong.
        what: &'static str,
    },
}

/// Reads back a pcap written by [`PcapWriter`]: (timestamp in nanoseconds, frame) pairs.
pub fn read_pcap(bytes: &[u8]) -> Result<Vec<(u64, Vec<u8>)>, PcapError> {
    let u32_at = |offset: usize| -> Result<u32, PcapError> {
        let slice = bytes.get(offset..offset + 4).ok_or(PcapError::Truncated { offset })?;
        Ok(u32::from_le_bytes(slice.try_into().expect("four bytes")))
    };
    if u32_at(0)? != MAGIC_NANOSECONDS {
        return Err(PcapError::Format { what: "magic" });
    }
    if u32_at(20)? != LINKTYPE_ETHERNET {
        return Err(PcapError::Format { what: "link type" });
    }
    let mut frames = Vec::new();
    let mut offset = 24;
    while offset < bytes.len() {
        let seconds = u32_at(offset)? as u64;
        let nanoseconds = u32_at(offset + 4)? as u64;
        let kept = u32_at(offset + 8)? as usize;
        let start = offset + 16;
        let frame = bytes
            .get(start..start.saturating_add(kept))
            .ok_or(PcapError::Truncated { offset: start })?;
        frames.push((seconds * 1_000_000_000 + nanoseconds, frame.to_vec()));
        offset = start + kept;
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::DeviceId;

    fn frame(time_ps: u64, bytes: &[u8]) -> CapturedFrame {
        CapturedFrame {
            time: Picoseconds(time_ps),
            from: DeviceId(0),
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn the_file_header_is_the_classic_nanosecond_ethernet_header() {
        let out = PcapWriter::new(Vec::new()).unwrap().finish().unwrap();
        assert_eq!(
            out,
            [0x4D, 0x3C, 0xB2, 0xA1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x04, 0x00, 1, 0, 0, 0]
        );
    }

    #[test]
    fn written_frames_read_back_with_their_virtual_timestamps() {
        let frames = [frame(1_500_000, &[1, 2, 3]), frame(2_000_000_000_123_000, &[9; 60])];
        let mut writer = PcapWriter::new(Vec::new()).unwrap();
        for f in &frames {
            writer.write(f).unwrap();
        }
        assert_eq!(writer.frames(), 2);
        let bytes = writer.finish().unwrap();
        let read = read_pcap(&bytes).unwrap();
        assert_eq!(read, vec![(1_500, vec![1, 2, 3]), (2_000_000_000_123, vec![9; 60])]);
    }

    #[test]
    fn truncated_or_foreign_input_is_refused() {
        let mut writer = PcapWriter::new(Vec::new()).unwrap();
        writer.write(&frame(0, &[7; 10])).unwrap();
        let bytes = writer.finish().unwrap();
        for cut in 0..bytes.len() {
            if cut == 24 {
                continue; // a header alone is a valid, empty file
            }
            assert!(read_pcap(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(read_pcap(&[0u8; 24]), Err(PcapError::Format { what: "magic" }));
    }
}
