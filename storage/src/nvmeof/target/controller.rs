//! A controller: what one host's admin-queue Connect created (the dynamic controller
//! model), with its properties, features, keep-alive timer, outstanding asynchronous
//! event requests and error log.

use std::collections::{BTreeMap, VecDeque};

use crate::nvmeof::wire::command::{feature, PropertySize};
use crate::nvmeof::wire::log::ErrorLogEntryRepr;
use crate::nvmeof::wire::properties::{offset, Cap, Cc, Csts, Shutdown, ShutdownStatus, Version};
use crate::nvmeof::wire::status::Status;

/// Error log entries kept per controller (Identify Controller ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 16;

/// Asynchronous event requests a host may keep outstanding (AERL + 1).
pub const AER_LIMIT: usize = 4;

/// What a Property Set did, for the target to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PropertyEffect {
    /// Nothing beyond the property.
    None,
    /// CC.EN went 1 → 0: the controller reset; its I/O queues go.
    Disabled,
    /// A shutdown was requested (and is complete).
    Shutdown,
}

/// An outstanding Asynchronous Event Request: which queue (the admin queue's id in the
/// target), slot and command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParkedAer {
    pub queue: usize,
    pub slot: usize,
    pub cid: u16,
}

/// One controller.
#[derive(Debug, Clone)]
pub(crate) struct Controller {
    pub cntlid: u16,
    /// Index of its subsystem in the target.
    pub subsystem: usize,
    pub host_nqn: String,
    pub host_id: [u8; 16],
    pub cc: Cc,
    pub csts: Csts,
    /// Keep-alive timeout, ms (0: none).
    pub kato_ms: u32,
    /// When the keep-alive timer expires, ns on the target's clock.
    pub keep_alive_deadline: Option<u64>,
    /// A command arrived since the timer was last restarted (traffic-based keep alive).
    pub traffic_seen: bool,
    /// I/O queues granted by Set Features Number of Queues (1-based).
    pub io_queues_granted: u16,
    pub async_event_config: u32,
    pub volatile_write_cache: bool,
    pub arbitration: u32,
    pub temperature_threshold: u32,
    pub error_recovery: u32,
    pub write_atomicity: u32,
    pub aers: Vec<ParkedAer>,
    /// Events waiting for an AER (CQE DW0 values).
    pub pending_events: VecDeque<u32>,
    pub error_log: VecDeque<ErrorLogEntryRepr>,
    pub error_count: u64,
    /// Target queue ids: the admin queue and the I/O queues by QID.
    pub admin_queue: usize,
    pub io_queues: BTreeMap<u16, usize>,
    /// NSIDs whose attributes changed since the host last read the Changed Namespace List.
    pub changed_namespaces: Vec<u32>,
}

impl Controller {
    /// A new controller, disabled, with every feature at its default.
    pub fn new(
        cntlid: u16,
        subsystem: usize,
        host_nqn: String,
        host_id: [u8; 16],
        admin_queue: usize,
        io_queues: u16,
    ) -> Self {
        Self {
            cntlid,
            subsystem,
            host_nqn,
            host_id,
            cc: Cc::default(),
            csts: Csts::default(),
            kato_ms: 0,
            keep_alive_deadline: None,
            traffic_seen: false,
            io_queues_granted: io_queues,
            async_event_config: 0,
            volatile_write_cache: true,
            arbitration: 0,
            // 0x157 = 343 K: the default over-temperature threshold of most drives.
            temperature_threshold: 0x157,
            error_recovery: 0,
            write_atomicity: 0,
            aers: Vec::new(),
            pending_events: VecDeque::new(),
            error_log: VecDeque::with_capacity(ERROR_LOG_ENTRIES),
            error_count: 0,
            admin_queue,
            io_queues: BTreeMap::new(),
            changed_namespaces: Vec::new(),
        }
    }

    /// Whether the controller takes commands other than Fabrics ones.
    pub fn ready(&self) -> bool {
        self.cc.enable && self.csts.ready
    }

    /// Property Get.
    pub fn property_get(&self, cap: Cap, size: PropertySize, at: u32) -> Result<u64, Status> {
        match (size, at) {
            (PropertySize::Eight, offset::CAP) => Ok(cap.to_u64()),
            (PropertySize::Four, offset::VS) => Ok(u64::from(Version::V1_3.to_u32())),
            (PropertySize::Four, offset::CC) => Ok(u64::from(self.cc.to_u32())),
            (PropertySize::Four, offset::CSTS) => Ok(u64::from(self.csts.to_u32())),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Property Set. Only CC is writable. Enabling with entry sizes, page size,
    /// arbitration or command set the controller does not support sets CSTS.CFS instead
    /// of CSTS.RDY (as Linux's target does).
    pub fn property_set(&mut self, size: PropertySize, at: u32, value: u64) -> Result<PropertyEffect, Status> {
        if (size, at) != (PropertySize::Four, offset::CC) {
            return Err(Status::INVALID_FIELD);
        }
        let new = Cc::from_u32(value as u32);
        let old = self.cc;
        self.cc = new;
        if new.enable && !old.enable {
            let supported = new.iosqes == 6 && new.iocqes == 4 && new.mps == 0 && new.ams == 0 && new.css == 0;
            if supported {
                self.csts.ready = true;
            } else {
                self.csts.fatal = true;
            }
        }
        if !new.enable && old.enable {
            self.csts = Csts::default();
            return Ok(PropertyEffect::Disabled);
        }
        if matches!(new.shn, Shutdown::Normal | Shutdown::Abrupt) && old.shn == Shutdown::None {
            self.csts.shst = ShutdownStatus::Complete;
            return Ok(PropertyEffect::Shutdown);
        }
        if new.shn == Shutdown::None && old.shn != Shutdown::None {
            self.csts.shst = ShutdownStatus::Normal;
        }
        Ok(PropertyEffect::None)
    }

    /// Set Features: the CQE DW0 on success. `max_io_queues` bounds Number of Queues;
    /// `kas_ms` is the keep-alive granularity KATO is rounded up to; a discovery
    /// controller has only the keep-alive timer and asynchronous event configuration.
    pub fn set_feature(
        &mut self,
        fid: u8,
        save: bool,
        value: u32,
        max_io_queues: u16,
        kas_ms: u32,
        discovery: bool,
    ) -> Result<u32, Status> {
        if save {
            return Err(Status::FEATURE_NOT_SAVEABLE);
        }
        if discovery && !matches!(fid, feature::KEEP_ALIVE_TIMER | feature::ASYNC_EVENT_CONFIGURATION) {
            return Err(Status::INVALID_FIELD);
        }
        match fid {
            feature::ARBITRATION => self.arbitration = value,
            feature::POWER_MANAGEMENT => {
                // One power state (NPSS 0): only PS 0 exists.
                if value & 0x1F != 0 {
                    return Err(Status::INVALID_FIELD);
                }
            }
            feature::TEMPERATURE_THRESHOLD => self.temperature_threshold = value,
            feature::ERROR_RECOVERY => self.error_recovery = value,
            feature::VOLATILE_WRITE_CACHE => self.volatile_write_cache = value & 1 != 0,
            feature::NUMBER_OF_QUEUES => {
                let (nsqr, ncqr) = (value & 0xFFFF, value >> 16);
                if nsqr == 0xFFFF || ncqr == 0xFFFF {
                    return Err(Status::INVALID_FIELD);
                }
                let granted = (nsqr.max(ncqr) + 1).min(u32::from(max_io_queues)).max(1) as u16;
                self.io_queues_granted = granted;
                return Ok(u32::from(granted - 1) << 16 | u32::from(granted - 1));
            }
            feature::WRITE_ATOMICITY => self.write_atomicity = value,
            feature::ASYNC_EVENT_CONFIGURATION => self.async_event_config = value,
            feature::KEEP_ALIVE_TIMER => self.kato_ms = round_kato(value, kas_ms),
            _ => return Err(Status::INVALID_FIELD),
        }
        Ok(0)
    }

    /// Get Features: the CQE DW0. SEL 3 (supported capabilities) says every feature is
    /// changeable and none saveable.
    pub fn get_feature(&self, fid: u8, select: u8, discovery: bool) -> Result<u32, Status> {
        if discovery && !matches!(fid, feature::KEEP_ALIVE_TIMER | feature::ASYNC_EVENT_CONFIGURATION) {
            return Err(Status::INVALID_FIELD);
        }
        let current = match fid {
            feature::ARBITRATION => self.arbitration,
            feature::POWER_MANAGEMENT => 0,
            feature::TEMPERATURE_THRESHOLD => self.temperature_threshold,
            feature::ERROR_RECOVERY => self.error_recovery,
            feature::VOLATILE_WRITE_CACHE => u32::from(self.volatile_write_cache),
            feature::NUMBER_OF_QUEUES => {
                let n = u32::from(self.io_queues_granted.max(1) - 1);
                n << 16 | n
            }
            feature::WRITE_ATOMICITY => self.write_atomicity,
            feature::ASYNC_EVENT_CONFIGURATION => self.async_event_config,
            feature::KEEP_ALIVE_TIMER => self.kato_ms,
            _ => return Err(Status::INVALID_FIELD),
        };
        match select {
            0 | 2 => Ok(current),
            1 => Ok(match fid {
                feature::VOLATILE_WRITE_CACHE => 1,
                feature::TEMPERATURE_THRESHOLD => 0x157,
                feature::NUMBER_OF_QUEUES | feature::KEEP_ALIVE_TIMER => current,
                _ => 0,
            }),
            // Changeable (bit 2), not saveable (bit 0), not namespace specific (bit 1).
            3 => Ok(1 << 2),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Records a failed command in the error log (the most recent ERROR_LOG_ENTRIES).
    pub fn log_error(&mut self, mut entry: ErrorLogEntryRepr) {
        self.error_count += 1;
        entry.error_count = self.error_count;
        if self.error_log.len() == ERROR_LOG_ENTRIES {
            self.error_log.pop_back();
        }
        self.error_log.push_front(entry);
    }

    /// Whether the keep-alive timer expired by `now_ns`. Traffic-based keep alive (the
    /// controller says TBKAS, as Linux's target does): any command since the last look
    /// restarts the timer instead.
    pub fn keep_alive_expired(&mut self, now_ns: u64) -> bool {
        if std::mem::take(&mut self.traffic_seen) {
            self.keep_alive(now_ns);
            return false;
        }
        self.keep_alive_deadline.is_some_and(|deadline| now_ns > deadline)
    }

    /// Restarts the keep-alive timer at `now_ns`.
    pub fn keep_alive(&mut self, now_ns: u64) {
        self.keep_alive_deadline = (self.kato_ms > 0).then(|| now_ns + u64::from(self.kato_ms) * 1_000_000);
    }
}

/// KATO rounded up to a multiple of the keep-alive granularity `kas_ms` (0 stays 0).
pub fn round_kato(kato_ms: u32, kas_ms: u32) -> u32 {
    if kato_ms == 0 || kas_ms == 0 {
        return kato_ms;
    }
    kato_ms.div_ceil(kas_ms).saturating_mul(kas_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller() -> Controller {
        Controller::new(1, 0, "nqn.host".into(), [0; 16], 0, 4)
    }

    const CAP: Cap = Cap {
        mqes: 127,
        cqr: true,
        ams: 0,
        timeout: 30,
        dstrd: 0,
        nssrs: false,
        css: 1,
        bps: false,
        mpsmin: 0,
        mpsmax: 0,
    };

    #[test]
    fn enable_sequence_follows_cc_and_csts() {
        let mut c = controller();
        assert_eq!(
            c.property_get(CAP, PropertySize::Eight, offset::CAP),
            Ok(0x0000_0020_1E01_007F)
        );
        assert_eq!(c.property_get(CAP, PropertySize::Four, offset::VS), Ok(0x0001_0300));
        assert_eq!(c.property_get(CAP, PropertySize::Four, offset::CSTS), Ok(0));
        assert!(!c.ready());
        assert_eq!(
            c.property_set(PropertySize::Four, offset::CC, 0x0046_0001),
            Ok(PropertyEffect::None)
        );
        assert_eq!(c.property_get(CAP, PropertySize::Four, offset::CSTS), Ok(1));
        assert!(c.ready());
        // Shutdown: SHST goes to complete.
        assert_eq!(
            c.property_set(PropertySize::Four, offset::CC, 0x0046_4001),
            Ok(PropertyEffect::Shutdown)
        );
        assert_eq!(c.property_get(CAP, PropertySize::Four, offset::CSTS), Ok(0b1001));
        // Disable: RDY clears.
        assert_eq!(
            c.property_set(PropertySize::Four, offset::CC, 0),
            Ok(PropertyEffect::Disabled)
        );
        assert_eq!(c.property_get(CAP, PropertySize::Four, offset::CSTS), Ok(0));
    }

    #[test]
    fn unsupported_configuration_is_fatal() {
        let mut c = controller();
        // IOSQES 7 (128-byte SQEs).
        c.property_set(PropertySize::Four, offset::CC, 0x0047_0001).unwrap();
        assert!(!c.ready());
        assert_eq!(c.property_get(CAP, PropertySize::Four, offset::CSTS), Ok(0b10));
    }

    #[test]
    fn properties_have_fixed_widths_and_only_cc_is_writable() {
        let mut c = controller();
        assert_eq!(
            c.property_get(CAP, PropertySize::Four, offset::CAP),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.property_get(CAP, PropertySize::Eight, offset::CC),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.property_get(CAP, PropertySize::Four, 0x24),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.property_set(PropertySize::Eight, offset::CAP, 0),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.property_set(PropertySize::Four, offset::CSTS, 1),
            Err(Status::INVALID_FIELD)
        );
    }

    #[test]
    fn number_of_queues_is_granted_up_to_the_limit() {
        let mut c = controller();
        // Ask for 8 SQs and 8 CQs (0-based 7): 4 granted.
        assert_eq!(
            c.set_feature(feature::NUMBER_OF_QUEUES, false, 7 << 16 | 7, 4, 1000, false),
            Ok(3 << 16 | 3)
        );
        assert_eq!(c.get_feature(feature::NUMBER_OF_QUEUES, 0, false), Ok(3 << 16 | 3));
        assert_eq!(
            c.set_feature(feature::NUMBER_OF_QUEUES, false, 1, 4, 1000, false),
            Ok(1 << 16 | 1)
        );
        assert_eq!(
            c.set_feature(feature::NUMBER_OF_QUEUES, false, 0xFFFF, 4, 1000, false),
            Err(Status::INVALID_FIELD)
        );
    }

    #[test]
    fn features_reject_saving_unknown_ids_and_discovery_extras() {
        let mut c = controller();
        assert_eq!(
            c.set_feature(feature::VOLATILE_WRITE_CACHE, true, 1, 4, 1000, false),
            Err(Status::FEATURE_NOT_SAVEABLE)
        );
        assert_eq!(
            c.set_feature(0x77, false, 1, 4, 1000, false),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.get_feature(feature::HOST_IDENTIFIER, 0, false),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.set_feature(feature::NUMBER_OF_QUEUES, false, 1, 4, 1000, true),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            c.set_feature(feature::KEEP_ALIVE_TIMER, false, 1500, 4, 1000, true),
            Ok(0)
        );
        assert_eq!(c.get_feature(feature::KEEP_ALIVE_TIMER, 0, true), Ok(2000));
        assert_eq!(
            c.set_feature(feature::VOLATILE_WRITE_CACHE, false, 0, 4, 1000, false),
            Ok(0)
        );
        assert_eq!(c.get_feature(feature::VOLATILE_WRITE_CACHE, 0, false), Ok(0));
        assert_eq!(c.get_feature(feature::VOLATILE_WRITE_CACHE, 1, false), Ok(1));
        assert_eq!(c.get_feature(feature::VOLATILE_WRITE_CACHE, 3, false), Ok(4));
    }

    #[test]
    fn kato_rounds_up_to_the_granularity() {
        assert_eq!(round_kato(0, 1000), 0);
        assert_eq!(round_kato(1, 1000), 1000);
        assert_eq!(round_kato(5000, 1000), 5000);
        assert_eq!(round_kato(5001, 1000), 6000);
        let mut c = controller();
        c.kato_ms = 2000;
        c.keep_alive(10);
        assert_eq!(c.keep_alive_deadline, Some(2_000_000_010));
        assert!(!c.keep_alive_expired(2_000_000_010));
        assert!(c.keep_alive_expired(2_000_000_011));
        // Traffic restarts the timer.
        c.traffic_seen = true;
        assert!(!c.keep_alive_expired(3_000_000_000));
        assert!(!c.keep_alive_expired(4_999_999_999));
        assert!(c.keep_alive_expired(5_000_000_001));
        c.kato_ms = 0;
        c.keep_alive(10);
        assert_eq!(c.keep_alive_deadline, None);
        assert!(!c.keep_alive_expired(u64::MAX));
    }

    #[test]
    fn error_log_keeps_the_most_recent_entries() {
        let mut c = controller();
        for cid in 0..40u16 {
            c.log_error(ErrorLogEntryRepr {
                cid,
                ..ErrorLogEntryRepr::default()
            });
        }
        assert_eq!(c.error_log.len(), ERROR_LOG_ENTRIES);
        assert_eq!(c.error_log[0].cid, 39);
        assert_eq!(c.error_log[0].error_count, 40);
    }
}
