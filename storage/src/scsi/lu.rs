//! The SCSI block target: logical units over block devices, and the LUN map a transport
//! (SRP here) hands commands to.
//!
//! A command is handled in two steps, so a transport never moves data a command will
//! not use: [`LunMap::plan`] says which way data flows and how much (from the CDB
//! alone; a bad CDB is refused here, before any data-out is fetched), then
//! [`LunMap::execute`] runs it with the data-out that arrived and fills the data-in.
//! Nothing reaches a block device unless every check passed.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cdb::{Cdb, ReadWrite};
use super::data::{self, mode_page, vpd, BlockLimits, Capacity16, InquiryRepr};
use super::sense::{SenseData, SenseKey, FIXED_SENSE_LEN};
use super::{encode_lun, status};
use crate::block::{self, BlockDevice};

/// How a logical unit presents itself.
#[derive(Debug, Clone)]
pub struct LuConfig {
    /// T10 vendor identification (8 ASCII).
    pub vendor: String,
    /// Product identification (16 ASCII).
    pub product: String,
    /// Revision (4 ASCII).
    pub revision: String,
    /// Unit serial number (VPD 0x80, and the T10 designator of VPD 0x83).
    pub serial: String,
    /// Largest READ/WRITE transfer, bytes (VPD 0xB0).
    pub max_transfer_bytes: u32,
    /// Report a volatile write cache (WCE): initiators then send SYNCHRONIZE CACHE.
    pub write_cache: bool,
    /// Refuse writes (DATA PROTECT) and report write protection.
    pub read_only: bool,
}

impl Default for LuConfig {
    fn default() -> Self {
        Self {
            vendor: "RNIC-EMU".into(),
            product: "RAMDISK".into(),
            revision: "0.1".into(),
            serial: "rnic-emu-0".into(),
            max_transfer_bytes: 256 * 1024,
            write_cache: false,
            read_only: false,
        }
    }
}

/// Which way a command's data flows, and how many bytes the command itself wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// No data.
    None,
    /// Target → initiator, at most this many bytes (allocation length or transfer).
    In(u32),
    /// Initiator → target, exactly this many bytes.
    Out(u32),
}

/// The end of a command: status, sense for CHECK CONDITION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiOutcome {
    /// SCSI status.
    pub status: u8,
    /// Sense data (CHECK CONDITION).
    pub sense: Option<SenseData>,
}

impl ScsiOutcome {
    /// GOOD.
    pub const GOOD: Self = Self {
        status: status::GOOD,
        sense: None,
    };

    /// CHECK CONDITION with `sense`.
    pub fn check_condition(sense: SenseData) -> Self {
        Self {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
        }
    }
}

/// A logical unit: a block device with its SCSI identity.
pub struct LogicalUnit {
    device: Arc<dyn BlockDevice>,
    config: LuConfig,
    naa: [u8; 16],
}

impl std::fmt::Debug for LogicalUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogicalUnit")
            .field("serial", &self.config.serial)
            .field("blocks", &self.device.block_count())
            .field("block_size", &self.device.block_size())
            .finish()
    }
}

/// Most UNMAP descriptors one command may carry.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// Most blocks one UNMAP may deallocate.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 22;

impl LogicalUnit {
    /// A logical unit over `device`.
    pub fn new(device: Arc<dyn BlockDevice>, config: LuConfig) -> Self {
        // NAA 6 (IEEE registered extended) with the locally administered company ID
        // 0x02524E (the emulator's MAC prefix) and a hash of the serial number: stable
        // across runs, distinct between units, so udev's wwn- links are too.
        let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
        for b in config.serial.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
        let mut naa = [0u8; 16];
        naa[0] = 0x60;
        naa[1] = 0x25;
        naa[2] = 0x24;
        naa[3] = 0xE0;
        naa[8..16].copy_from_slice(&hash.to_be_bytes());
        naa[4..8].copy_from_slice(&(hash >> 32).to_be_bytes()[4..8]);
        Self { device, config, naa }
    }

    /// The block device.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// The configuration.
    pub fn config(&self) -> &LuConfig {
        &self.config
    }

    fn max_transfer_blocks(&self) -> u32 {
        (self.config.max_transfer_bytes / self.device.block_size()).max(1)
    }

    /// The data flow of `cdb`, or the sense refusing it.
    ///
    /// # Errors
    /// CHECK CONDITION sense for an unsupported opcode or an invalid field.
    pub fn plan(&self, cdb: &Cdb) -> Result<DataDirection, SenseData> {
        use DataDirection::{In, Out};
        Ok(match *cdb {
            Cdb::TestUnitReady | Cdb::SynchronizeCache { .. } => DataDirection::None,
            Cdb::RequestSense {
                descriptor,
                allocation_length,
            } => {
                if descriptor {
                    return Err(SenseData::invalid_cdb_field(1, Some(0)));
                }
                In(u32::from(allocation_length))
            }
            Cdb::Inquiry {
                evpd,
                page_code,
                allocation_length,
            } => {
                if !evpd && page_code != 0 {
                    return Err(SenseData::invalid_cdb_field(2, None));
                }
                if evpd && !vpd::ALL.contains(&page_code) {
                    return Err(SenseData::invalid_cdb_field(2, None));
                }
                In(u32::from(allocation_length))
            }
            Cdb::ModeSense {
                page_control,
                page_code,
                subpage,
                allocation_length,
                ..
            } => {
                if page_control == 3 {
                    // Saved values are not supported: SAVING PARAMETERS NOT SUPPORTED.
                    return Err(SenseData::new(SenseKey::IllegalRequest, 0x39, 0x00));
                }
                if !matches!(page_code, mode_page::CACHING | mode_page::CONTROL | mode_page::ALL)
                    || !(subpage == 0 || (subpage == 0xFF && page_code == mode_page::ALL))
                {
                    return Err(SenseData::invalid_cdb_field(2, None));
                }
                In(u32::from(allocation_length))
            }
            Cdb::ReadCapacity10 => In(8),
            Cdb::ReadCapacity16 { allocation_length } => In(allocation_length),
            Cdb::Read(rw) => In(self.check_rw(&rw, false)?),
            Cdb::Write(rw) => Out(self.check_rw(&rw, true)?),
            Cdb::ReportLuns { allocation_length, .. } => In(allocation_length),
            Cdb::Unmap { parameter_list_length } => {
                if self.config.read_only {
                    return Err(SenseData::new(SenseKey::DataProtect, 0x27, 0x00));
                }
                if parameter_list_length != 0 && parameter_list_length < 8 {
                    return Err(SenseData::PARAMETER_LIST_LENGTH_ERROR);
                }
                Out(u32::from(parameter_list_length))
            }
            Cdb::Unsupported { .. } => return Err(SenseData::INVALID_OPCODE),
        })
    }

    fn check_rw(&self, rw: &ReadWrite, write: bool) -> Result<u32, SenseData> {
        if rw.protect != 0 {
            return Err(SenseData::invalid_cdb_field(1, Some(7)));
        }
        if write && self.config.read_only {
            return Err(SenseData::new(SenseKey::DataProtect, 0x27, 0x00));
        }
        if rw.blocks > self.max_transfer_blocks() {
            return Err(SenseData::invalid_cdb_field(if rw.sixteen { 10 } else { 7 }, None));
        }
        if block::check_blocks(rw.lba, u64::from(rw.blocks), self.device.block_count()).is_err() {
            return Err(SenseData::LBA_OUT_OF_RANGE);
        }
        Ok(rw.blocks * self.device.block_size())
    }

    /// Runs `cdb` (already [`Self::plan`]ned) with `data_out`; fills `data_in`
    /// (not clipped to the allocation length: the transport does that).
    pub fn execute(&self, cdb: &Cdb, data_out: &[u8], data_in: &mut Vec<u8>) -> ScsiOutcome {
        data_in.clear();
        match self.run(cdb, data_out, data_in) {
            Ok(()) => ScsiOutcome::GOOD,
            Err(sense) => {
                data_in.clear();
                ScsiOutcome::check_condition(sense)
            }
        }
    }

    fn run(&self, cdb: &Cdb, data_out: &[u8], data_in: &mut Vec<u8>) -> Result<(), SenseData> {
        let direction = self.plan(cdb)?;
        if let DataDirection::Out(length) = direction {
            if data_out.len() != length as usize {
                return Err(SenseData::INVALID_FIELD_IN_CDB);
            }
        }
        let block_size = self.device.block_size();
        let blocks = self.device.block_count();
        match *cdb {
            Cdb::TestUnitReady => {}
            Cdb::RequestSense { .. } => data_in.extend_from_slice(&SenseData::NONE.to_bytes()[..FIXED_SENSE_LEN]),
            Cdb::Inquiry { evpd: false, .. } => data_in.extend_from_slice(&self.inquiry(0x00).to_bytes()),
            Cdb::Inquiry { page_code, .. } => data_in.extend_from_slice(&self.vpd_page(page_code)),
            Cdb::ModeSense {
                ten,
                dbd,
                page_control,
                page_code,
                ..
            } => {
                let changeable = page_control == 1;
                let mut pages = Vec::new();
                if matches!(page_code, mode_page::CACHING | mode_page::ALL) {
                    pages.extend(data::caching_page(self.config.write_cache, changeable));
                }
                if matches!(page_code, mode_page::CONTROL | mode_page::ALL) {
                    pages.extend(data::control_page(changeable));
                }
                let descriptor = (!dbd).then_some((blocks, block_size));
                data_in.extend(data::mode_parameters(ten, self.config.read_only, descriptor, &pages));
            }
            Cdb::ReadCapacity10 => data_in.extend_from_slice(&data::read_capacity_10(blocks, block_size)),
            Cdb::ReadCapacity16 { .. } => data_in.extend_from_slice(
                &Capacity16 {
                    last_lba: blocks.saturating_sub(1),
                    block_size,
                    lbpme: true,
                    lbprz: true,
                }
                .to_bytes(),
            ),
            Cdb::Read(rw) => {
                data_in.resize((rw.blocks * block_size) as usize, 0);
                self.device
                    .read(rw.lba, data_in)
                    .map_err(|e| backend_sense(&e, SenseData::UNRECOVERED_READ_ERROR))?;
            }
            Cdb::Write(rw) => {
                self.device
                    .write(rw.lba, data_out)
                    .map_err(|e| backend_sense(&e, SenseData::WRITE_ERROR))?;
                if rw.fua {
                    self.device
                        .flush()
                        .map_err(|e| backend_sense(&e, SenseData::WRITE_ERROR))?;
                }
            }
            Cdb::SynchronizeCache { lba, blocks: count } => {
                if count != 0 && block::check_blocks(lba, u64::from(count), blocks).is_err() {
                    return Err(SenseData::LBA_OUT_OF_RANGE);
                }
                self.device
                    .flush()
                    .map_err(|e| backend_sense(&e, SenseData::WRITE_ERROR))?;
            }
            Cdb::Unmap { .. } => self.unmap(data_out)?,
            Cdb::ReportLuns { .. } => data_in.extend(data::report_luns(&[0])),
            Cdb::Unsupported { .. } => return Err(SenseData::INVALID_OPCODE),
        }
        Ok(())
    }

    fn unmap(&self, parameters: &[u8]) -> Result<(), SenseData> {
        let descriptors =
            data::parse_unmap_parameters(parameters).map_err(|_| SenseData::INVALID_FIELD_IN_PARAMETER_LIST)?;
        if descriptors.len() as u32 > MAX_UNMAP_DESCRIPTORS {
            return Err(SenseData::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        let mut total = 0u64;
        // Every descriptor is checked before any block is touched.
        for d in &descriptors {
            block::check_blocks(d.lba, u64::from(d.blocks), self.device.block_count())
                .map_err(|_| SenseData::LBA_OUT_OF_RANGE)?;
            total += u64::from(d.blocks);
        }
        if total > u64::from(MAX_UNMAP_BLOCKS) {
            return Err(SenseData::INVALID_FIELD_IN_PARAMETER_LIST);
        }
        for d in descriptors.iter().filter(|d| d.blocks > 0) {
            self.device
                .deallocate(d.lba, u64::from(d.blocks))
                .map_err(|e| backend_sense(&e, SenseData::WRITE_ERROR))?;
        }
        Ok(())
    }

    /// Standard INQUIRY data with `peripheral` (0x00 here; 0x7F for an absent LU).
    pub fn inquiry(&self, peripheral: u8) -> InquiryRepr {
        InquiryRepr {
            peripheral,
            removable: false,
            version: 0x06,
            hisup: true,
            byte5: 0,
            cmdque: true,
            vendor: self.config.vendor.clone(),
            product: self.config.product.clone(),
            revision: self.config.revision.clone(),
        }
    }

    fn vpd_page(&self, page: u8) -> Vec<u8> {
        let payload = match page {
            vpd::SUPPORTED_PAGES => vpd::ALL.to_vec(),
            vpd::UNIT_SERIAL_NUMBER => self.config.serial.as_bytes().to_vec(),
            vpd::DEVICE_IDENTIFICATION => {
                data::device_identification(self.naa, &self.config.vendor, &self.config.serial)
            }
            vpd::BLOCK_LIMITS => BlockLimits {
                max_transfer_blocks: self.max_transfer_blocks(),
                optimal_transfer_blocks: (65536 / self.device.block_size()).min(self.max_transfer_blocks()),
                max_unmap_blocks: MAX_UNMAP_BLOCKS,
                max_unmap_descriptors: MAX_UNMAP_DESCRIPTORS,
            }
            .to_payload(),
            vpd::BLOCK_DEVICE_CHARACTERISTICS => data::block_device_characteristics(),
            _ => data::logical_block_provisioning(),
        };
        data::vpd_page(0x00, page, &payload)
    }
}

fn backend_sense(error: &block::Error, otherwise: SenseData) -> SenseData {
    tracing::warn!(target: "rnic::diag", "scsi: block backend: {error}");
    match error {
        block::Error::OutOfRange { .. } => SenseData::LBA_OUT_OF_RANGE,
        _ => otherwise,
    }
}

/// The logical units of a target, by LUN number, and what answers for LUNs that do not
/// exist (SPC: INQUIRY with peripheral qualifier 3, REPORT LUNS and REQUEST SENSE on
/// any LUN, everything else LOGICAL UNIT NOT SUPPORTED).
#[derive(Debug, Default)]
pub struct LunMap {
    units: BTreeMap<u16, LogicalUnit>,
}

impl LunMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) LUN `lun`.
    pub fn insert(&mut self, lun: u16, unit: LogicalUnit) {
        self.units.insert(lun, unit);
    }

    /// Removes LUN `lun`.
    pub fn remove(&mut self, lun: u16) -> Option<LogicalUnit> {
        self.units.remove(&lun)
    }

    /// LUN `lun`.
    pub fn get(&self, lun: u16) -> Option<&LogicalUnit> {
        self.units.get(&lun)
    }

    /// The LUN numbers, ascending.
    pub fn luns(&self) -> Vec<u16> {
        self.units.keys().copied().collect()
    }

    /// Whether there are no units.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Largest transfer any unit takes, bytes.
    pub fn max_transfer_bytes(&self) -> u32 {
        self.units
            .values()
            .map(|u| u.config.max_transfer_bytes)
            .max()
            .unwrap_or(0)
    }

    /// [`LogicalUnit::plan`] for `lun` (`None`: the LUN field did not decode).
    ///
    /// # Errors
    /// The sense refusing the command.
    pub fn plan(&self, lun: Option<u16>, cdb: &Cdb) -> Result<DataDirection, SenseData> {
        match (cdb, lun.and_then(|l| self.units.get(&l))) {
            (
                Cdb::ReportLuns {
                    allocation_length,
                    select_report,
                },
                _,
            ) => {
                if *allocation_length < 16 || *select_report > 2 {
                    return Err(SenseData::invalid_cdb_field(
                        if *select_report > 2 { 2 } else { 6 },
                        None,
                    ));
                }
                Ok(DataDirection::In(*allocation_length))
            }
            (_, Some(unit)) => unit.plan(cdb),
            (
                Cdb::Inquiry {
                    evpd: false,
                    page_code: 0,
                    allocation_length,
                },
                None,
            ) => Ok(DataDirection::In(u32::from(*allocation_length))),
            (
                Cdb::RequestSense {
                    allocation_length,
                    descriptor: false,
                },
                None,
            ) => Ok(DataDirection::In(u32::from(*allocation_length))),
            (_, None) => Err(SenseData::LUN_NOT_SUPPORTED),
        }
    }

    /// [`LogicalUnit::execute`] for `lun`.
    pub fn execute(&self, lun: Option<u16>, cdb: &Cdb, data_out: &[u8], data_in: &mut Vec<u8>) -> ScsiOutcome {
        data_in.clear();
        if let Err(sense) = self.plan(lun, cdb) {
            return ScsiOutcome::check_condition(sense);
        }
        match (cdb, lun.and_then(|l| self.units.get(&l))) {
            (Cdb::ReportLuns { .. }, _) => {
                let luns: Vec<u64> = self.units.keys().map(|l| encode_lun(*l)).collect();
                data_in.extend(data::report_luns(&luns));
                ScsiOutcome::GOOD
            }
            (_, Some(unit)) => unit.execute(cdb, data_out, data_in),
            (Cdb::Inquiry { .. }, None) => {
                let any = self.units.values().next();
                let bytes = match any {
                    Some(unit) => unit.inquiry(0x7F).to_bytes(),
                    None => LogicalUnit::new(
                        Arc::new(crate::block::RamBackend::new(512, 1).expect("a 1-block RAM device")),
                        LuConfig::default(),
                    )
                    .inquiry(0x7F)
                    .to_bytes(),
                };
                data_in.extend_from_slice(&bytes);
                ScsiOutcome::GOOD
            }
            (_, None) => {
                data_in.extend_from_slice(&SenseData::LUN_NOT_SUPPORTED.to_bytes());
                ScsiOutcome::GOOD
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::RamBackend;
    use crate::scsi::cdb::opcode;

    fn map() -> LunMap {
        let mut map = LunMap::new();
        for lun in [0u16, 3] {
            let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(512, 1024).unwrap());
            map.insert(
                lun,
                LogicalUnit::new(
                    device,
                    LuConfig {
                        serial: format!("lu{lun}"),
                        max_transfer_bytes: 64 * 1024,
                        ..LuConfig::default()
                    },
                ),
            );
        }
        map
    }

    fn run(map: &LunMap, lun: u16, cdb: Cdb, out: &[u8]) -> (ScsiOutcome, Vec<u8>) {
        let mut data = Vec::new();
        let outcome = map.execute(Some(lun), &cdb, out, &mut data);
        (outcome, data)
    }

    fn rw(lba: u64, blocks: u32) -> ReadWrite {
        ReadWrite {
            lba,
            blocks,
            ..ReadWrite::default()
        }
    }

    #[test]
    fn writes_then_reads_back() {
        let map = map();
        let data: Vec<u8> = (0..2048u32).map(|i| i as u8).collect();
        assert_eq!(map.plan(Some(3), &Cdb::Write(rw(10, 4))), Ok(DataDirection::Out(2048)));
        assert_eq!(run(&map, 3, Cdb::Write(rw(10, 4)), &data).0, ScsiOutcome::GOOD);
        let (outcome, back) = run(&map, 3, Cdb::Read(rw(10, 4)), &[]);
        assert_eq!((outcome, back), (ScsiOutcome::GOOD, data));
        // LUN 0 is another device.
        assert_eq!(run(&map, 0, Cdb::Read(rw(10, 4)), &[]).1, vec![0; 2048]);
    }

    #[test]
    fn refuses_out_of_range_oversized_and_protected_io_before_data_moves() {
        let map = map();
        assert_eq!(
            map.plan(Some(0), &Cdb::Read(rw(1020, 8))),
            Err(SenseData::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            map.plan(Some(0), &Cdb::Read(rw(u64::MAX, 2))),
            Err(SenseData::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            map.plan(Some(0), &Cdb::Write(rw(0, 129))),
            Err(SenseData::invalid_cdb_field(7, None))
        );
        let protected = ReadWrite { protect: 1, ..rw(0, 1) };
        assert!(map.plan(Some(0), &Cdb::Read(protected)).is_err());
        // Data-out of the wrong length never reaches the device.
        let (outcome, _) = run(&map, 0, Cdb::Write(rw(0, 2)), &[0xAA; 512]);
        assert_eq!(outcome.status, status::CHECK_CONDITION);
        assert_eq!(run(&map, 0, Cdb::Read(rw(0, 1)), &[]).1, vec![0; 512]);
    }

    #[test]
    fn unknown_luns_and_opcodes_get_the_sense_linux_expects() {
        let map = map();
        assert_eq!(
            map.plan(Some(9), &Cdb::TestUnitReady),
            Err(SenseData::LUN_NOT_SUPPORTED)
        );
        assert_eq!(map.plan(None, &Cdb::ReadCapacity10), Err(SenseData::LUN_NOT_SUPPORTED));
        let (outcome, data) = run(
            &map,
            9,
            Cdb::Inquiry {
                evpd: false,
                page_code: 0,
                allocation_length: 36,
            },
            &[],
        );
        assert_eq!((outcome, data[0]), (ScsiOutcome::GOOD, 0x7F));
        let start_stop = Cdb::parse(&[0x1B, 0, 0, 0, 1, 0]).unwrap();
        assert_eq!(map.plan(Some(0), &start_stop), Err(SenseData::INVALID_OPCODE));
        let rsoc = Cdb::parse(&[opcode::REPORT_LUNS - 0xA0 + 0xA3, 0x0C, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(map.plan(Some(0), &rsoc), Err(SenseData::INVALID_OPCODE));
    }

    #[test]
    fn report_luns_lists_every_unit_on_any_lun() {
        let map = map();
        let cdb = Cdb::ReportLuns {
            select_report: 0,
            allocation_length: 256,
        };
        let (outcome, data) = run(&map, 7, cdb, &[]);
        assert_eq!(outcome, ScsiOutcome::GOOD);
        assert_eq!(data::parse_report_luns(&data).unwrap(), vec![0, 3 << 48]);
        let short = Cdb::ReportLuns {
            select_report: 0,
            allocation_length: 8,
        };
        assert!(map.plan(Some(0), &short).is_err());
    }

    #[test]
    fn inquiry_vpd_and_capacity_describe_the_device() {
        let map = map();
        let inquiry = |page: u8| Cdb::Inquiry {
            evpd: true,
            page_code: page,
            allocation_length: 255,
        };
        let (_, supported) = run(&map, 0, inquiry(0), &[]);
        assert_eq!(&supported[4..], &vpd::ALL);
        let (_, serial) = run(&map, 3, inquiry(0x80), &[]);
        assert_eq!(&serial[4..], b"lu3");
        let (_, limits) = run(&map, 0, inquiry(0xB0), &[]);
        assert_eq!(BlockLimits::parse(&limits[4..]).unwrap().max_transfer_blocks, 128);
        let (_, ids) = run(&map, 0, inquiry(0x83), &[]);
        let (_, other) = run(&map, 3, inquiry(0x83), &[]);
        assert_ne!(ids, other, "units have distinct designators");
        assert_eq!(ids[8] >> 4, 6, "NAA 6");
        assert!(map.plan(Some(0), &inquiry(0x99)).is_err());
        let (_, rc10) = run(&map, 0, Cdb::ReadCapacity10, &[]);
        assert_eq!(rc10, [0, 0, 3, 0xFF, 0, 0, 2, 0]);
        let (_, rc16) = run(&map, 0, Cdb::ReadCapacity16 { allocation_length: 32 }, &[]);
        assert_eq!(Capacity16::parse(&rc16).unwrap().last_lba, 1023);
        let mode = Cdb::ModeSense {
            ten: false,
            dbd: false,
            page_control: 0,
            page_code: 0x3F,
            subpage: 0,
            allocation_length: 255,
        };
        let (outcome, pages) = run(&map, 0, mode, &[]);
        assert_eq!(outcome, ScsiOutcome::GOOD);
        assert_eq!(pages.len(), 4 + 8 + 20 + 12);
        let saved = Cdb::ModeSense {
            ten: false,
            dbd: false,
            page_control: 3,
            page_code: 0x3F,
            subpage: 0,
            allocation_length: 255,
        };
        assert_eq!(map.plan(Some(0), &saved).unwrap_err().asc, 0x39);
    }

    #[test]
    fn unmap_checks_every_descriptor_before_deallocating() {
        let map = map();
        run(&map, 0, Cdb::Write(rw(0, 4)), &[0xEE; 2048]);
        let bad = data::unmap_parameters(&[
            data::UnmapDescriptor { lba: 0, blocks: 2 },
            data::UnmapDescriptor { lba: 1023, blocks: 2 },
        ]);
        let cdb = Cdb::Unmap {
            parameter_list_length: bad.len() as u16,
        };
        assert_eq!(run(&map, 0, cdb, &bad).0.sense, Some(SenseData::LBA_OUT_OF_RANGE));
        assert_eq!(run(&map, 0, Cdb::Read(rw(0, 1)), &[]).1, vec![0xEE; 512]);
        let good = data::unmap_parameters(&[data::UnmapDescriptor { lba: 1, blocks: 2 }]);
        let cdb = Cdb::Unmap {
            parameter_list_length: good.len() as u16,
        };
        assert_eq!(run(&map, 0, cdb, &good).0, ScsiOutcome::GOOD);
        let (_, back) = run(&map, 0, Cdb::Read(rw(0, 4)), &[]);
        assert_eq!(&back[..512], &[0xEE; 512]);
        assert_eq!(&back[512..1536], &[0; 1024]);
        assert_eq!(&back[1536..], &[0xEE; 512]);
    }
}
