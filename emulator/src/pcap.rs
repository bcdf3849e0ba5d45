//! A minimal pcap writer (classic format, nanosecond timestamps, Ethernet link type) for
//! `--pcap`: every frame the device sends or receives. Written by hand because the
//! format is 40 lines and a dependency would be heavier than that.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::Duration;

/// Magic number of a nanosecond-resolution pcap file.
pub const MAGIC_NANOSECONDS: u32 = 0xA1B2_3C4D;
/// Link type: Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Largest frame kept whole.
pub const SNAPLEN: u32 = 65_535;

/// Writes frames to a pcap file.
#[derive(Debug)]
pub struct PcapWriter {
    out: BufWriter<File>,
    frames: u64,
}

impl PcapWriter {
    /// Creates (truncates) `path` and writes the file header.
    pub fn create(path: &Path) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(&MAGIC_NANOSECONDS.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?; // thiszone
        out.write_all(&0u32.to_le_bytes())?; // sigfigs
        out.write_all(&SNAPLEN.to_le_bytes())?;
        out.write_all(&LINKTYPE_ETHERNET.to_le_bytes())?;
        out.flush()?;
        Ok(Self { out, frames: 0 })
    }

    /// Appends one frame captured at `timestamp` (since the Unix epoch).
    pub fn write_frame(&mut self, timestamp: Duration, frame: &[u8]) -> io::Result<()> {
        let captured = frame.len().min(SNAPLEN as usize);
        self.out.write_all(&(timestamp.as_secs() as u32).to_le_bytes())?;
        self.out.write_all(&timestamp.subsec_nanos().to_le_bytes())?;
        self.out.write_all(&(captured as u32).to_le_bytes())?;
        self.out.write_all(&(frame.len() as u32).to_le_bytes())?;
        self.out.write_all(&frame[..captured])?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Flushes buffered frames to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_record_layout() {
        let path = std::env::temp_dir().join(format!("rnic-emu-pcap-{}.pcap", std::process::id()));
        let mut writer = PcapWriter::create(&path).unwrap();
        writer.write_frame(Duration::new(5, 7), &[0xAB; 60]).unwrap();
        writer.flush().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(bytes.len(), 24 + 16 + 60);
        assert_eq!(bytes[0..4], MAGIC_NANOSECONDS.to_le_bytes());
        assert_eq!(bytes[20..24], LINKTYPE_ETHERNET.to_le_bytes());
        assert_eq!(bytes[24..28], 5u32.to_le_bytes());
        assert_eq!(bytes[28..32], 7u32.to_le_bytes());
        assert_eq!(bytes[32..36], 60u32.to_le_bytes());
    }
}
