//! pcap files of what went over the fabric: [`write_pcap`] writes a whole
//! [`Fabric::take_capture`](rnic_hw_model::fabric::Fabric::take_capture) to a file. The
//! format itself lives in [`rnic_hw_model::fabric::pcap`].

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;

use rnic_hw_model::fabric::pcap::PcapWriter;
use rnic_hw_model::fabric::CapturedFrame;

/// Writes `frames` to a new pcap file at `path` (replacing any file there).
pub fn write_pcap(path: &Path, frames: &[CapturedFrame]) -> io::Result<()> {
    let mut writer = PcapWriter::new(BufWriter::new(File::create(path)?))?;
    for frame in frames {
        writer.write(frame)?;
    }
    writer.finish().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_hw_model::fabric::pcap::read_pcap;
    use rnic_hw_model::fabric::DeviceId;
    use rnic_hw_model::Picoseconds;

    #[test]
    fn a_written_file_reads_back_frame_for_frame() {
        let frames: Vec<CapturedFrame> = (0..5u8)
            .map(|i| CapturedFrame {
                time: Picoseconds(i as u64 * 1_000_000),
                from: DeviceId(0),
                bytes: vec![i; 64],
            })
            .collect();
        let path = std::env::temp_dir().join(format!("rnic-pcap-test-{}.pcap", std::process::id()));
        write_pcap(&path, &frames).unwrap();
        let read = read_pcap(&std::fs::read(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read.len(), 5);
        for (i, (time, bytes)) in read.iter().enumerate() {
            assert_eq!(*time, i as u64 * 1_000);
            assert_eq!(bytes, &vec![i as u8; 64]);
        }
    }
}
