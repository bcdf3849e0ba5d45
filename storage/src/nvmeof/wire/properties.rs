//! Controller properties a host reaches with Property Get/Set over fabrics
//! (storage-and-cm.md B.7): CAP, VS, CC and CSTS. Queue-creation registers and doorbells
//! do not exist over fabrics (Connect creates queues).

/// Property offsets.
pub mod offset {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1C;
    /// NVM Subsystem Reset (4 bytes, optional).
    pub const NSSR: u32 = 0x20;
}

/// Controller Capabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cap {
    /// Maximum queue entries supported, 0-based (bits 15:0).
    pub mqes: u16,
    /// Contiguous queues required (bit 16; 1 on fabrics).
    pub cqr: bool,
    /// Arbitration mechanisms supported beyond round robin (bits 18:17).
    pub ams: u8,
    /// Worst-case time to become ready, in 500 ms units (bits 31:24).
    pub timeout: u8,
    /// Doorbell stride (bits 35:32; 0).
    pub dstrd: u8,
    /// NVM subsystem reset supported (bit 36).
    pub nssrs: bool,
    /// Command sets supported (bits 44:37; bit 0 of the field = NVM).
    pub css: u8,
    /// Boot partitions supported (bit 45).
    pub bps: bool,
    /// Memory page size minimum, 2^(12+MPSMIN) (bits 51:48).
    pub mpsmin: u8,
    /// Memory page size maximum (bits 55:52).
    pub mpsmax: u8,
}

/// CSS bit for the NVM command set.
pub const CSS_NVM: u8 = 1 << 0;

impl Cap {
    /// The 64-bit value.
    pub fn to_u64(self) -> u64 {
        u64::from(self.mqes)
            | u64::from(self.cqr) << 16
            | u64::from(self.ams & 0x3) << 17
            | u64::from(self.timeout) << 24
            | u64::from(self.dstrd & 0xF) << 32
            | u64::from(self.nssrs) << 36
            | u64::from(self.css) << 37
            | u64::from(self.bps) << 45
            | u64::from(self.mpsmin & 0xF) << 48
            | u64::from(self.mpsmax & 0xF) << 52
    }

    /// The fields of a 64-bit value (reserved bits ignored).
    pub fn from_u64(value: u64) -> Self {
        Self {
            mqes: value as u16,
            cqr: value & (1 << 16) != 0,
            ams: ((value >> 17) & 0x3) as u8,
            timeout: (value >> 24) as u8,
            dstrd: ((value >> 32) & 0xF) as u8,
            nssrs: value & (1 << 36) != 0,
            css: (value >> 37) as u8,
            bps: value & (1 << 45) != 0,
            mpsmin: ((value >> 48) & 0xF) as u8,
            mpsmax: ((value >> 52) & 0xF) as u8,
        }
    }
}

/// Version: major, minor, tertiary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// Major version (bits 31:16).
    pub major: u16,
    /// Minor version (bits 15:8).
    pub minor: u8,
    /// Tertiary version (bits 7:0).
    pub tertiary: u8,
}

impl Version {
    /// NVMe 1.3, what this target reports (as Linux's nvmet does).
    pub const V1_3: Version = Version {
        major: 1,
        minor: 3,
        tertiary: 0,
    };

    /// The 32-bit value.
    pub fn to_u32(self) -> u32 {
        u32::from(self.major) << 16 | u32::from(self.minor) << 8 | u32::from(self.tertiary)
    }

    /// The fields of a 32-bit value.
    pub fn from_u32(value: u32) -> Self {
        Self {
            major: (value >> 16) as u16,
            minor: (value >> 8) as u8,
            tertiary: value as u8,
        }
    }
}

/// Shutdown notification (CC.SHN).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Shutdown {
    /// 00b: no notification.
    #[default]
    None,
    /// 01b: normal shutdown.
    Normal,
    /// 10b: abrupt shutdown.
    Abrupt,
    /// 11b: reserved.
    Reserved,
}

/// Controller Configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cc {
    /// Enable (bit 0).
    pub enable: bool,
    /// I/O command set selected (bits 6:4; 0 = NVM).
    pub css: u8,
    /// Memory page size, 2^(12+MPS) (bits 10:7).
    pub mps: u8,
    /// Arbitration mechanism selected (bits 13:11).
    pub ams: u8,
    /// Shutdown notification (bits 15:14).
    pub shn: Shutdown,
    /// I/O submission queue entry size, 2^n (bits 19:16; 6 = 64 bytes).
    pub iosqes: u8,
    /// I/O completion queue entry size, 2^n (bits 23:20; 4 = 16 bytes).
    pub iocqes: u8,
}

impl Cc {
    /// The 32-bit value.
    pub fn to_u32(self) -> u32 {
        let shn = match self.shn {
            Shutdown::None => 0,
            Shutdown::Normal => 1,
            Shutdown::Abrupt => 2,
            Shutdown::Reserved => 3,
        };
        u32::from(self.enable)
            | u32::from(self.css & 0x7) << 4
            | u32::from(self.mps & 0xF) << 7
            | u32::from(self.ams & 0x7) << 11
            | shn << 14
            | u32::from(self.iosqes & 0xF) << 16
            | u32::from(self.iocqes & 0xF) << 20
    }

    /// The fields of a 32-bit value.
    pub fn from_u32(value: u32) -> Self {
        Self {
            enable: value & 1 != 0,
            css: ((value >> 4) & 0x7) as u8,
            mps: ((value >> 7) & 0xF) as u8,
            ams: ((value >> 11) & 0x7) as u8,
            shn: match (value >> 14) & 0x3 {
                0 => Shutdown::None,
                1 => Shutdown::Normal,
                2 => Shutdown::Abrupt,
                _ => Shutdown::Reserved,
            },
            iosqes: ((value >> 16) & 0xF) as u8,
            iocqes: ((value >> 20) & 0xF) as u8,
        }
    }

    /// What a host writes to enable a fabrics controller: 64-byte SQEs, 16-byte CQEs,
    /// 4 KiB pages, NVM, round robin (0x00460001).
    pub const fn enabled() -> Self {
        Self {
            enable: true,
            css: 0,
            mps: 0,
            ams: 0,
            shn: Shutdown::None,
            iosqes: 6,
            iocqes: 4,
        }
    }
}

/// Shutdown status (CSTS.SHST).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ShutdownStatus {
    /// 00b: normal operation.
    #[default]
    Normal,
    /// 01b: shutdown processing occurring.
    Occurring,
    /// 10b: shutdown processing complete.
    Complete,
}

/// Controller Status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Csts {
    /// Ready (bit 0).
    pub ready: bool,
    /// Controller fatal status (bit 1).
    pub fatal: bool,
    /// Shutdown status (bits 3:2).
    pub shst: ShutdownStatus,
    /// NVM subsystem reset occurred (bit 4).
    pub nssro: bool,
    /// Processing paused (bit 5).
    pub paused: bool,
}

impl Csts {
    /// The 32-bit value.
    pub fn to_u32(self) -> u32 {
        let shst = match self.shst {
            ShutdownStatus::Normal => 0,
            ShutdownStatus::Occurring => 1,
            ShutdownStatus::Complete => 2,
        };
        u32::from(self.ready)
            | u32::from(self.fatal) << 1
            | shst << 2
            | u32::from(self.nssro) << 4
            | u32::from(self.paused) << 5
    }

    /// The fields of a 32-bit value (SHST 11b reads as complete).
    pub fn from_u32(value: u32) -> Self {
        Self {
            ready: value & 1 != 0,
            fatal: value & 2 != 0,
            shst: match (value >> 2) & 0x3 {
                0 => ShutdownStatus::Normal,
                1 => ShutdownStatus::Occurring,
                _ => ShutdownStatus::Complete,
            },
            nssro: value & (1 << 4) != 0,
            paused: value & (1 << 5) != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_matches_the_reference_value() {
        // B.7: "a realistic CAP for a 128-deep target: 0x0000_0020_1E01_007F".
        let cap = Cap {
            mqes: 127,
            cqr: true,
            timeout: 30,
            css: CSS_NVM,
            ..Cap::default()
        };
        assert_eq!(cap.to_u64(), 0x0000_0020_1E01_007F);
        assert_eq!(Cap::from_u64(0x0000_0020_1E01_007F), cap);
    }

    #[test]
    fn cc_matches_what_hosts_write() {
        assert_eq!(Cc::enabled().to_u32(), 0x0046_0001);
        assert_eq!(Cc::from_u32(0x0046_0001), Cc::enabled());
        let shutdown = Cc {
            shn: Shutdown::Normal,
            ..Cc::enabled()
        };
        assert_eq!(shutdown.to_u32(), 0x0046_4001);
    }

    #[test]
    fn round_trips() {
        for value in [0u32, 1, 0x0046_0001, 0x00FF_FFFF, 0x0046_C001] {
            assert_eq!(Cc::from_u32(value).to_u32(), value & 0x00FF_FFF1);
        }
        for value in 0..64u32 {
            let csts = Csts::from_u32(value);
            if (value >> 2) & 3 != 3 {
                assert_eq!(csts.to_u32(), value);
            }
        }
        assert_eq!(Version::from_u32(0x0001_0300), Version::V1_3);
        assert_eq!(Version::V1_3.to_u32(), 0x0001_0300);
        let cap = Cap::from_u64(u64::MAX);
        assert_eq!(Cap::from_u64(cap.to_u64()), cap);
    }
}
