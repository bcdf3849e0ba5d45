//! Log pages (storage-and-cm.md B.8, B.10): Error Information entries (64 bytes),
//! SMART / Health Information (512), Firmware Slot Information (512) and the Discovery
//! log page (a 1024-byte header, then 1024 bytes per record).

use super::status::Status;
use super::{check_len, emit_nul_terminated, fixed_view, le, parse_space_padded, WireError};

mod error_field {
    use core::ops::Range;
    pub const ERROR_COUNT: Range<usize> = 0..8;
    pub const SQID: Range<usize> = 8..10;
    pub const CID: Range<usize> = 10..12;
    pub const STATUS: Range<usize> = 12..14;
    pub const PARAMETER_ERROR_LOCATION: Range<usize> = 14..16;
    pub const LBA: Range<usize> = 16..24;
    pub const NSID: Range<usize> = 24..28;
    pub const TRTYPE: usize = 29;
}

fixed_view!(
    /// A view of one Error Information log entry.
    ErrorLogEntry,
    "error log entry",
    64
);

/// The content of an Error Information log entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ErrorLogEntryRepr {
    /// A unique, increasing count of errors (0: the entry is empty).
    pub error_count: u64,
    /// Submission queue of the failed command.
    pub sqid: u16,
    /// Its command identifier.
    pub cid: u16,
    /// The status it completed with.
    pub status: Status,
    /// Byte (bits 7:0) and bit (10:8) of the SQE field that was wrong (0xFFFF: none).
    pub parameter_error_location: u16,
    /// First LBA involved.
    pub lba: u64,
    /// Namespace involved.
    pub nsid: u32,
    /// Transport type (1 RDMA).
    pub trtype: u8,
}

impl ErrorLogEntryRepr {
    /// Bytes of an entry.
    pub const LEN: usize = 64;

    /// Reads an entry.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 64 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &ErrorLogEntry<&T>) -> Result<Self, WireError> {
        use error_field as f;
        view.check_len()?;
        let b = view.buffer.as_ref();
        Ok(Self {
            error_count: le::u64(&b[f::ERROR_COUNT]),
            sqid: le::u16(&b[f::SQID]),
            cid: le::u16(&b[f::CID]),
            status: Status::from_field(le::u16(&b[f::STATUS])).0,
            parameter_error_location: le::u16(&b[f::PARAMETER_ERROR_LOCATION]),
            lba: le::u64(&b[f::LBA]),
            nsid: le::u32(&b[f::NSID]),
            trtype: b[f::TRTYPE],
        })
    }

    /// Writes an entry.
    ///
    /// # Panics
    /// If the buffer is shorter than 64 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut ErrorLogEntry<&mut T>) {
        use error_field as f;
        let b = &mut view.buffer.as_mut()[..Self::LEN];
        b.fill(0);
        le::set_u64(&mut b[f::ERROR_COUNT], self.error_count);
        le::set_u16(&mut b[f::SQID], self.sqid);
        le::set_u16(&mut b[f::CID], self.cid);
        le::set_u16(&mut b[f::STATUS], self.status.to_field(false));
        le::set_u16(&mut b[f::PARAMETER_ERROR_LOCATION], self.parameter_error_location);
        le::set_u64(&mut b[f::LBA], self.lba);
        le::set_u32(&mut b[f::NSID], self.nsid);
        b[f::TRTYPE] = self.trtype;
    }

    /// The 64 bytes.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut bytes = [0u8; 64];
        self.emit(&mut ErrorLogEntry::new_unchecked(&mut bytes[..]));
        bytes
    }
}

mod smart_field {
    use core::ops::Range;
    pub const CRITICAL_WARNING: usize = 0;
    pub const TEMPERATURE: Range<usize> = 1..3;
    pub const AVAILABLE_SPARE: usize = 3;
    pub const AVAILABLE_SPARE_THRESHOLD: usize = 4;
    pub const PERCENTAGE_USED: usize = 5;
    pub const DATA_UNITS_READ: usize = 32;
    pub const DATA_UNITS_WRITTEN: usize = 48;
    pub const HOST_READS: usize = 64;
    pub const HOST_WRITES: usize = 80;
    pub const BUSY_TIME: usize = 96;
    pub const POWER_CYCLES: usize = 112;
    pub const POWER_ON_HOURS: usize = 128;
    pub const UNSAFE_SHUTDOWNS: usize = 144;
    pub const MEDIA_ERRORS: usize = 160;
    pub const ERROR_LOG_ENTRIES: usize = 176;
}

fixed_view!(
    /// A view of the SMART / Health Information log page.
    SmartLog,
    "SMART log",
    512
);

/// The content of the SMART / Health Information log page. The 128-bit counters are held
/// as `u64` (their high halves are zero for any count this target can reach).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SmartLogRepr {
    /// Critical warning bits.
    pub critical_warning: u8,
    /// Composite temperature, kelvin.
    pub temperature_kelvin: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Available spare threshold, percent.
    pub available_spare_threshold: u8,
    /// Percentage of life used.
    pub percentage_used: u8,
    /// Data read, in thousands of 512-byte units, rounded up.
    pub data_units_read: u64,
    /// Data written, in thousands of 512-byte units, rounded up.
    pub data_units_written: u64,
    /// Read commands completed.
    pub host_read_commands: u64,
    /// Write commands completed.
    pub host_write_commands: u64,
    /// Minutes the controller was busy with I/O.
    pub controller_busy_time: u64,
    /// Power cycles.
    pub power_cycles: u64,
    /// Power-on hours.
    pub power_on_hours: u64,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u64,
    /// Unrecovered data integrity errors.
    pub media_errors: u64,
    /// Error log entries over the controller's life.
    pub error_log_entries: u64,
}

impl SmartLogRepr {
    /// Bytes of the page.
    pub const LEN: usize = 512;

    /// Reads the page (the high halves of the 128-bit counters are ignored).
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 512 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &SmartLog<&T>) -> Result<Self, WireError> {
        use smart_field as f;
        view.check_len()?;
        let b = view.buffer.as_ref();
        let counter = |at: usize| le::u64(&b[at..at + 8]);
        Ok(Self {
            critical_warning: b[f::CRITICAL_WARNING],
            temperature_kelvin: le::u16(&b[f::TEMPERATURE]),
            available_spare: b[f::AVAILABLE_SPARE],
            available_spare_threshold: b[f::AVAILABLE_SPARE_THRESHOLD],
            percentage_used: b[f::PERCENTAGE_USED],
            data_units_read: counter(f::DATA_UNITS_READ),
            data_units_written: counter(f::DATA_UNITS_WRITTEN),
            host_read_commands: counter(f::HOST_READS),
            host_write_commands: counter(f::HOST_WRITES),
            controller_busy_time: counter(f::BUSY_TIME),
            power_cycles: counter(f::POWER_CYCLES),
            power_on_hours: counter(f::POWER_ON_HOURS),
            unsafe_shutdowns: counter(f::UNSAFE_SHUTDOWNS),
            media_errors: counter(f::MEDIA_ERRORS),
            error_log_entries: counter(f::ERROR_LOG_ENTRIES),
        })
    }

    /// Writes the page.
    ///
    /// # Panics
    /// If the buffer is shorter than 512 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut SmartLog<&mut T>) {
        use smart_field as f;
        let b = &mut view.buffer.as_mut()[..Self::LEN];
        b.fill(0);
        b[f::CRITICAL_WARNING] = self.critical_warning;
        le::set_u16(&mut b[f::TEMPERATURE], self.temperature_kelvin);
        b[f::AVAILABLE_SPARE] = self.available_spare;
        b[f::AVAILABLE_SPARE_THRESHOLD] = self.available_spare_threshold;
        b[f::PERCENTAGE_USED] = self.percentage_used;
        for (at, value) in [
            (f::DATA_UNITS_READ, self.data_units_read),
            (f::DATA_UNITS_WRITTEN, self.data_units_written),
            (f::HOST_READS, self.host_read_commands),
            (f::HOST_WRITES, self.host_write_commands),
            (f::BUSY_TIME, self.controller_busy_time),
            (f::POWER_CYCLES, self.power_cycles),
            (f::POWER_ON_HOURS, self.power_on_hours),
            (f::UNSAFE_SHUTDOWNS, self.unsafe_shutdowns),
            (f::MEDIA_ERRORS, self.media_errors),
            (f::ERROR_LOG_ENTRIES, self.error_log_entries),
        ] {
            le::set_u64(&mut b[at..at + 8], value);
        }
    }

    /// The 512 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; Self::LEN];
        self.emit(&mut SmartLog::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// The Firmware Slot Information page (512 bytes): slot 1 active, holding `revision`.
pub fn emit_firmware_slot_log(revision: &str) -> Vec<u8> {
    let mut bytes = vec![0u8; 512];
    bytes[0] = 1; // AFI: slot 1 active
    super::emit_space_padded(&mut bytes[8..16], revision);
    bytes
}

/// Transport types (TRTYPE).
pub mod trtype {
    /// RDMA.
    pub const RDMA: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 3;
}

/// Address families (ADRFAM).
pub mod adrfam {
    /// IPv4.
    pub const IPV4: u8 = 1;
    /// IPv6.
    pub const IPV6: u8 = 2;
}

/// Subsystem types (SUBTYPE).
pub mod subtype {
    /// A referral to another discovery service.
    pub const REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The current discovery subsystem.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Bytes of the Discovery log page header, and of each record.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

mod discovery_field {
    use core::ops::Range;
    pub const GENCTR: Range<usize> = 0..8;
    pub const NUMREC: Range<usize> = 8..16;
    pub const RECFMT: Range<usize> = 16..18;
    pub const TRTYPE: usize = 0;
    pub const ADRFAM: usize = 1;
    pub const SUBTYPE: usize = 2;
    pub const TREQ: usize = 3;
    pub const PORTID: Range<usize> = 4..6;
    pub const CNTLID: Range<usize> = 6..8;
    pub const ASQSZ: Range<usize> = 8..10;
    pub const EFLAGS: Range<usize> = 10..12;
    pub const TRSVCID: Range<usize> = 32..64;
    pub const SUBNQN: Range<usize> = 256..512;
    pub const TRADDR: Range<usize> = 512..768;
    pub const RDMA_QPTYPE: usize = 768;
    pub const RDMA_PRTYPE: usize = 769;
    pub const RDMA_CMS: usize = 770;
    pub const RDMA_PKEY: Range<usize> = 776..778;
}

/// The Discovery log page header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DiscoveryLogHeaderRepr {
    /// Generation counter: changes whenever the records change.
    pub genctr: u64,
    /// Number of records.
    pub numrec: u64,
    /// Record format (0).
    pub recfmt: u16,
}

impl DiscoveryLogHeaderRepr {
    /// Reads the header from the first bytes of the page (at least 18).
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 18 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        use discovery_field as f;
        check_len("discovery log header", f::RECFMT.end, bytes.len())?;
        Ok(Self {
            genctr: le::u64(&bytes[f::GENCTR]),
            numrec: le::u64(&bytes[f::NUMREC]),
            recfmt: le::u16(&bytes[f::RECFMT]),
        })
    }

    /// Writes the 1024-byte header.
    ///
    /// # Panics
    /// If the buffer is shorter than 1024 bytes.
    pub fn emit(&self, bytes: &mut [u8]) {
        use discovery_field as f;
        bytes[..DISCOVERY_RECORD_LEN].fill(0);
        le::set_u64(&mut bytes[f::GENCTR], self.genctr);
        le::set_u64(&mut bytes[f::NUMREC], self.numrec);
        le::set_u16(&mut bytes[f::RECFMT], self.recfmt);
    }
}

/// One record of the Discovery log page: where and how to reach a subsystem.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DiscoveryLogEntryRepr {
    /// Transport type ([`trtype`]).
    pub trtype: u8,
    /// Address family ([`adrfam`]).
    pub adrfam: u8,
    /// Subsystem type ([`subtype`]).
    pub subtype: u8,
    /// Transport requirements (bits 1:0 secure channel).
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Admin maximum SQ size.
    pub asqsz: u16,
    /// Entry flags.
    pub eflags: u16,
    /// Transport service identifier (the port, e.g. "4420").
    pub trsvcid: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// Transport address (e.g. "192.168.1.2").
    pub traddr: String,
    /// RDMA QP service type (1: reliable connected).
    pub rdma_qptype: u8,
    /// RDMA provider type (1 none, 4 RoCEv2).
    pub rdma_prtype: u8,
    /// RDMA connection management service (1: RDMA CM).
    pub rdma_cms: u8,
    /// RDMA partition key.
    pub rdma_pkey: u16,
}

impl DiscoveryLogEntryRepr {
    /// Reads a record (1024 bytes). TRSVCID, SUBNQN and TRADDR may be padded with NULs
    /// or spaces.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 1024 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        use discovery_field as f;
        check_len("discovery log entry", DISCOVERY_RECORD_LEN, bytes.len())?;
        let text = |range: core::ops::Range<usize>| {
            let field = &bytes[range];
            let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
            parse_space_padded(&field[..end])
        };
        Ok(Self {
            trtype: bytes[f::TRTYPE],
            adrfam: bytes[f::ADRFAM],
            subtype: bytes[f::SUBTYPE],
            treq: bytes[f::TREQ],
            portid: le::u16(&bytes[f::PORTID]),
            cntlid: le::u16(&bytes[f::CNTLID]),
            asqsz: le::u16(&bytes[f::ASQSZ]),
            eflags: le::u16(&bytes[f::EFLAGS]),
            trsvcid: text(f::TRSVCID),
            subnqn: text(f::SUBNQN),
            traddr: text(f::TRADDR),
            rdma_qptype: bytes[f::RDMA_QPTYPE],
            rdma_prtype: bytes[f::RDMA_PRTYPE],
            rdma_cms: bytes[f::RDMA_CMS],
            rdma_pkey: le::u16(&bytes[f::RDMA_PKEY]),
        })
    }

    /// Writes the 1024-byte record, strings NUL-padded (as Linux's target does).
    ///
    /// # Panics
    /// If the buffer is shorter than 1024 bytes.
    pub fn emit(&self, bytes: &mut [u8]) {
        use discovery_field as f;
        bytes[..DISCOVERY_RECORD_LEN].fill(0);
        bytes[f::TRTYPE] = self.trtype;
        bytes[f::ADRFAM] = self.adrfam;
        bytes[f::SUBTYPE] = self.subtype;
        bytes[f::TREQ] = self.treq;
        le::set_u16(&mut bytes[f::PORTID], self.portid);
        le::set_u16(&mut bytes[f::CNTLID], self.cntlid);
        le::set_u16(&mut bytes[f::ASQSZ], self.asqsz);
        le::set_u16(&mut bytes[f::EFLAGS], self.eflags);
        emit_nul_terminated(&mut bytes[f::TRSVCID], &self.trsvcid);
        emit_nul_terminated(&mut bytes[f::SUBNQN], &self.subnqn);
        emit_nul_terminated(&mut bytes[f::TRADDR], &self.traddr);
        bytes[f::RDMA_QPTYPE] = self.rdma_qptype;
        bytes[f::RDMA_PRTYPE] = self.rdma_prtype;
        bytes[f::RDMA_CMS] = self.rdma_cms;
        le::set_u16(&mut bytes[f::RDMA_PKEY], self.rdma_pkey);
    }
}

/// The whole Discovery log page: header and records.
pub fn emit_discovery_log(genctr: u64, entries: &[DiscoveryLogEntryRepr]) -> Vec<u8> {
    let mut bytes = vec![0u8; DISCOVERY_RECORD_LEN * (1 + entries.len())];
    DiscoveryLogHeaderRepr {
        genctr,
        numrec: entries.len() as u64,
        recfmt: 0,
    }
    .emit(&mut bytes);
    for (i, entry) in entries.iter().enumerate() {
        entry.emit(&mut bytes[DISCOVERY_RECORD_LEN * (i + 1)..]);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_entry_round_trips_at_its_offsets() {
        let entry = ErrorLogEntryRepr {
            error_count: 3,
            sqid: 1,
            cid: 0x42,
            status: Status::LBA_OUT_OF_RANGE,
            parameter_error_location: 0xFFFF,
            lba: 0x1000,
            nsid: 1,
            trtype: trtype::RDMA,
        };
        let bytes = entry.to_bytes();
        assert_eq!(&bytes[0..8], &3u64.to_le_bytes());
        assert_eq!(&bytes[8..14], &[1, 0, 0x42, 0, 0x00, 0x81]);
        assert_eq!(&bytes[16..24], &0x1000u64.to_le_bytes());
        assert_eq!(bytes[29], 1);
        assert_eq!(
            ErrorLogEntryRepr::parse(&ErrorLogEntry::new_checked(&bytes[..]).unwrap()).unwrap(),
            entry
        );
        assert!(ErrorLogEntry::new_checked(&bytes[..63]).is_err());
    }

    #[test]
    fn smart_log_round_trips_at_its_offsets() {
        let smart = SmartLogRepr {
            temperature_kelvin: 310,
            available_spare: 100,
            available_spare_threshold: 10,
            data_units_read: 5,
            data_units_written: 6,
            host_read_commands: 7,
            host_write_commands: 8,
            power_cycles: 1,
            power_on_hours: 2,
            error_log_entries: 9,
            ..SmartLogRepr::default()
        };
        let bytes = smart.to_bytes();
        assert_eq!(&bytes[1..3], &310u16.to_le_bytes());
        assert_eq!(bytes[3], 100);
        assert_eq!(bytes[32], 5);
        assert_eq!(bytes[48], 6);
        assert_eq!(bytes[64], 7);
        assert_eq!(bytes[80], 8);
        assert_eq!(bytes[176], 9);
        assert_eq!(
            SmartLogRepr::parse(&SmartLog::new_checked(&bytes[..]).unwrap()).unwrap(),
            smart
        );
        assert!(SmartLog::new_checked(&bytes[..511]).is_err());
    }

    fn entry() -> DiscoveryLogEntryRepr {
        DiscoveryLogEntryRepr {
            trtype: trtype::RDMA,
            adrfam: adrfam::IPV4,
            subtype: subtype::NVM,
            treq: 0,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.2024-01.io.example:sub1".into(),
            traddr: "192.168.1.2".into(),
            rdma_qptype: 1,
            rdma_prtype: 1,
            rdma_cms: 1,
            rdma_pkey: 0,
        }
    }

    #[test]
    fn discovery_log_sits_at_its_offsets() {
        let page = emit_discovery_log(7, &[entry()]);
        assert_eq!(page.len(), 2048);
        assert_eq!(&page[0..8], &7u64.to_le_bytes());
        assert_eq!(&page[8..16], &1u64.to_le_bytes());
        let record = &page[1024..];
        assert_eq!(&record[0..4], &[1, 1, 2, 0]);
        assert_eq!(&record[6..8], &[0xFF, 0xFF]);
        assert_eq!(&record[32..36], b"4420");
        assert_eq!(&record[256..283], b"nqn.2024-01.io.example:sub1");
        assert_eq!(&record[512..523], b"192.168.1.2");
        assert_eq!(&record[768..771], &[1, 1, 1]);
        assert_eq!(
            DiscoveryLogHeaderRepr::parse(&page).unwrap(),
            DiscoveryLogHeaderRepr {
                genctr: 7,
                numrec: 1,
                recfmt: 0
            }
        );
        assert_eq!(DiscoveryLogEntryRepr::parse(record).unwrap(), entry());
    }

    #[test]
    fn discovery_entry_accepts_space_padding() {
        let mut bytes = vec![0u8; 1024];
        entry().emit(&mut bytes);
        bytes[32..64].copy_from_slice(&[b' '; 32]);
        bytes[32..36].copy_from_slice(b"4420");
        assert_eq!(DiscoveryLogEntryRepr::parse(&bytes).unwrap().trsvcid, "4420");
    }

    #[test]
    fn rejects_truncated_input() {
        assert!(DiscoveryLogHeaderRepr::parse(&[0; 17]).is_err());
        assert!(DiscoveryLogEntryRepr::parse(&[0; 1023]).is_err());
    }
}
