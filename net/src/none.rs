//! `--net none`: no network. Frames the device transmits are counted and dropped (the
//! server still captures them with `--pcap`); nothing is ever received.

use std::os::fd::BorrowedFd;

use rnic_hw_model::wire::Icrc;

use super::{NetBackend, NetStats};

/// The backend without a network.
#[derive(Debug, Default)]
pub struct NoNetwork {
    stats: NetStats,
}

impl NetBackend for NoNetwork {
    fn describe(&self) -> String {
        "none".into()
    }

    fn send(&mut self, frame: &[u8]) {
        self.stats.tx_dropped += 1;
        tracing::trace!(target: "rnic_emu::net", len = frame.len(), "frame dropped (--net none)");
    }

    /// Nobody sees a dropped frame: its ICRC is not computed.
    fn send_owned(&mut self, frame: Vec<u8>, _icrc: Icrc) -> Vec<u8> {
        self.send(&frame);
        frame
    }

    fn receive(&mut self, _frame: &mut Vec<u8>) -> bool {
        false
    }

    fn pollable_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn stats(&self) -> NetStats {
        self.stats
    }
}
