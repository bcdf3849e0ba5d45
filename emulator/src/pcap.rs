//! `--pcap`: every frame the device sends or receives, in the pcap format of
//! [`rnic_hw_model::fabric::pcap`], stamped with wall-clock time.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;

/// A pcap file being written.
pub type PcapWriter = rnic_hw_model::fabric::pcap::PcapWriter<BufWriter<File>>;

/// Creates (truncates) `path` and writes the pcap file header.
pub fn create(path: &Path) -> io::Result<PcapWriter> {
    PcapWriter::new(BufWriter::new(File::create(path)?))
}
