//! The port's address tables: the GID table and the source-MAC table, as the driver
//! configures them through the firmware (CFG_SGID_TB, CFG_SMAC_TB).
//!
//! [`PortAddresses`] owns both tables and the port's own MAC address. It accepts table
//! reads and writes from the firmware (through the firmware's `Io`) and answers the
//! transport's lookups: the source GID and MAC of a packet, and whether a received frame's
//! destination MAC or GID is this port's.

use rnic_firmware_if::cmdq::GidType;

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidTableEntry {
    /// GID bytes in network order.
    pub gid: [u8; 16],
    /// GID type.
    pub gid_type: GidType,
}

/// The port's address tables: the GID table and the source-MAC table, whose entry 0 is
/// the port's own MAC address until the driver says otherwise.
#[derive(Debug, Clone)]
pub(crate) struct PortAddresses {
    /// GID table.
    gids: Vec<Option<GidTableEntry>>,
    /// Source MAC table.
    smacs: Vec<Option<[u8; 6]>>,
    /// The port's MAC address (the SMAC of last resort).
    mac: [u8; 6],
    /// Each address `smacs` holds, once: what a frame's destination MAC is compared
    /// with. Every frame in and out asks, the firmware writes the tables rarely, and the
    /// tables have as many entries as the device's GID table (a scan of every slot per
    /// frame was ≈ 2 % of a 64 KiB WRITE run's time).
    local_macs: Vec<[u8; 6]>,
    /// Each GID `gids` holds, once: what a frame's destination GID is compared with.
    local_gids: Vec<[u8; 16]>,
}

impl PortAddresses {
    /// The tables after power-on or a function reset: `entries` entries each (at least
    /// one), SMAC 0 = `mac`.
    pub fn new(entries: usize, mac: [u8; 6]) -> Self {
        let mut smacs = vec![None; entries.max(1)];
        smacs[0] = Some(mac);
        Self {
            gids: vec![None; entries.max(1)],
            smacs,
            mac,
            local_macs: vec![mac],
            local_gids: Vec::new(),
        }
    }

    /// The GID table.
    pub fn gids(&self) -> &[Option<GidTableEntry>] {
        &self.gids
    }

    /// The source-MAC table.
    pub fn smacs(&self) -> &[Option<[u8; 6]>] {
        &self.smacs
    }

    /// Sets (or, with None, clears) GID entry `index`; false when `index` is outside the
    /// table.
    pub fn set_gid(&mut self, index: usize, entry: Option<GidTableEntry>) -> bool {
        match self.gids.get_mut(index) {
            Some(slot) => {
                *slot = entry;
                self.local_gids = distinct(self.gids.iter().flatten().map(|entry| entry.gid));
                true
            }
            None => false,
        }
    }

    /// Sets source-MAC entry `index`; false when `index` is outside the table.
    pub fn set_smac(&mut self, index: usize, mac: [u8; 6]) -> bool {
        match self.smacs.get_mut(index) {
            Some(slot) => {
                *slot = Some(mac);
                self.local_macs = distinct(self.smacs.iter().flatten().copied());
                true
            }
            None => false,
        }
    }

    /// The source GID at `index`, if configured.
    #[inline]
    pub fn source_gid(&self, index: u16) -> Option<[u8; 16]> {
        self.gids
            .get(usize::from(index))
            .copied()
            .flatten()
            .map(|entry| entry.gid)
    }

    /// The source MAC of a packet: the SMAC entry `smac_index` names (UD), else the one
    /// at the source GID index, else entry 0, else the port's MAC.
    #[inline]
    pub fn source_mac(&self, smac_index: Option<u8>, sgid_index: u16) -> [u8; 6] {
        let smacs = &self.smacs;
        smac_index
            .map(usize::from)
            .or(Some(usize::from(sgid_index)))
            .and_then(|i| smacs.get(i).copied().flatten())
            .or_else(|| smacs.first().copied().flatten())
            .unwrap_or(self.mac)
    }

    /// Whether `mac` is one of this port's MAC addresses (SMAC table).
    #[inline]
    pub fn is_local_mac(&self, mac: &[u8; 6]) -> bool {
        self.local_macs.contains(mac)
    }

    /// Whether `gid` is one of this port's GIDs.
    #[inline]
    pub fn is_local_gid(&self, gid: &[u8; 16]) -> bool {
        self.local_gids.contains(gid)
    }
}

/// The values of `values`, each once, in the order they first come.
fn distinct<T: PartialEq>(values: impl Iterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for value in values {
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];

    #[test]
    fn after_power_on_smac_0_is_the_port_mac_and_no_gid_is_set() {
        let port = PortAddresses::new(4, MAC);
        assert_eq!(port.smacs(), &[Some(MAC), None, None, None]);
        assert_eq!(port.gids(), &[None; 4]);
        assert_eq!(port.source_gid(0), None);
        assert!(port.is_local_mac(&MAC));
    }

    #[test]
    fn an_empty_table_still_has_one_entry() {
        let port = PortAddresses::new(0, MAC);
        assert_eq!(port.gids().len(), 1);
        assert_eq!(port.smacs().len(), 1);
    }

    #[test]
    fn writes_outside_the_tables_are_refused_and_change_nothing() {
        let mut port = PortAddresses::new(2, MAC);
        let entry = GidTableEntry {
            gid: [0xfe; 16],
            gid_type: GidType::RoceV2Ipv6,
        };
        assert!(!port.set_gid(2, Some(entry)));
        assert!(!port.set_smac(2, [2, 0, 0, 0, 0, 9]));
        assert_eq!(port.gids(), &[None, None]);
        assert_eq!(port.smacs(), &[Some(MAC), None]);
    }

    #[test]
    fn the_source_mac_follows_the_smac_index_then_the_gid_index_then_entry_0() {
        let mut port = PortAddresses::new(4, MAC);
        let other = [2, 0, 0, 0, 0, 2];
        let third = [2, 0, 0, 0, 0, 3];
        assert!(port.set_smac(1, other));
        assert!(port.set_smac(3, third));
        assert_eq!(port.source_mac(Some(3), 1), third);
        assert_eq!(port.source_mac(None, 1), other);
        assert_eq!(port.source_mac(None, 2), MAC);
        assert_eq!(port.source_mac(Some(200), 1), MAC);
    }

    #[test]
    fn a_configured_gid_is_the_source_gid_and_local() {
        let mut port = PortAddresses::new(2, MAC);
        let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let entry = GidTableEntry {
            gid,
            gid_type: GidType::RoceV2Ipv6,
        };
        assert!(port.set_gid(1, Some(entry)));
        assert_eq!(port.source_gid(1), Some(gid));
        assert!(port.is_local_gid(&gid));
        assert!(port.set_gid(1, None));
        assert!(!port.is_local_gid(&gid));
    }

    #[test]
    fn an_address_is_local_while_any_entry_holds_it() {
        let mut port = PortAddresses::new(4, MAC);
        let other = [2, 0, 0, 0, 0, 2];
        // The same MAC in two entries: local until the last of them is overwritten.
        assert!(port.set_smac(1, other) && port.set_smac(2, other));
        assert!(port.set_smac(1, MAC));
        assert!(port.is_local_mac(&other), "entry 2 still holds it");
        assert!(port.set_smac(2, MAC));
        assert!(!port.is_local_mac(&other));
        // Entry 0's power-on MAC overwritten everywhere: no longer local.
        let third = [2, 0, 0, 0, 0, 3];
        for index in 0..4 {
            assert!(port.set_smac(index, third));
        }
        assert!(!port.is_local_mac(&MAC) && port.is_local_mac(&third));

        let gid = |last: u8| GidTableEntry {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last],
            gid_type: GidType::RoceV2Ipv6,
        };
        assert!(port.set_gid(0, Some(gid(1))) && port.set_gid(3, Some(gid(1))));
        assert!(port.set_gid(0, Some(gid(2))));
        assert!(port.is_local_gid(&gid(1).gid) && port.is_local_gid(&gid(2).gid));
        assert!(port.set_gid(3, None));
        assert!(!port.is_local_gid(&gid(1).gid) && port.is_local_gid(&gid(2).gid));
        // A write outside the table changes nothing.
        assert!(!port.set_gid(4, Some(gid(1))));
        assert!(!port.is_local_gid(&gid(1).gid));
    }
}
