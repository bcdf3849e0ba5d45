//! The RoCEv2 transport: requester, responder and completer (being written).
//!
//! The device's network port is two calls: [`Device::poll_transmit`] hands out the next
//! frame the device has put on the wire (at or before the current virtual time), and
//! [`Device::receive_frame`] delivers a frame to the device at the current virtual time.

use crate::device::Device;

impl Device {
    /// The next Ethernet frame (without FCS) the device has transmitted, if any.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// Delivers an Ethernet frame (without FCS) to the device's port now.
    pub fn receive_frame(&mut self, frame: &[u8]) {
        let _ = frame;
    }

    /// Returns a buffer obtained from [`Device::poll_transmit`] for reuse, so the data
    /// path does not allocate per packet.
    pub fn recycle_frame(&mut self, buffer: Vec<u8>) {
        let _ = buffer;
    }
}
