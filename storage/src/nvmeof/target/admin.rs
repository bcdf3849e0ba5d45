//! What the target's admin commands return: Identify data and log pages, built from the
//! target's configuration, the subsystem and the controller.

use crate::nvmeof::wire::command::{cns, log_page, opcode};
use crate::nvmeof::wire::identify::{
    controller_type, emit_active_namespaces, emit_namespace_descriptors, oncs, sgls, IdentifyControllerRepr,
    IdentifyNamespaceRepr, LbaFormat, NamespaceDescriptor, IDENTIFY_LEN,
};
use crate::nvmeof::wire::log::{
    self, emit_discovery_log, emit_firmware_slot_log, DiscoveryLogEntryRepr, ErrorLogEntryRepr, SmartLogRepr,
};
use crate::nvmeof::wire::properties::Version;
use crate::nvmeof::wire::status::Status;

use super::controller::{Controller, AER_LIMIT, ERROR_LOG_ENTRIES};
use super::subsystem::{Subsystem, SubsystemKind};
use super::TargetConfig;

/// Controller attribute: traffic-based keep alive (CTRATT bit 6).
pub const CTRATT_TBKAS: u32 = 1 << 6;

/// Firmware revision reported (the crate's version).
pub const FIRMWARE_REVISION: &str = env!("CARGO_PKG_VERSION");

/// Identify Controller of `controller` in `subsystem`.
pub(crate) fn identify_controller(config: &TargetConfig, subsystem: &Subsystem, controller: &Controller) -> Vec<u8> {
    let discovery = subsystem.kind == SubsystemKind::Discovery;
    let in_capsule = config.in_capsule_data_size;
    IdentifyControllerRepr {
        serial_number: subsystem.serial_number.clone(),
        model_number: subsystem.model_number.clone(),
        firmware_revision: FIRMWARE_REVISION.into(),
        // Several controllers may share the subsystem (and its namespaces).
        cmic: if discovery { 0 } else { 1 << 1 },
        mdts: config.mdts,
        cntlid: controller.cntlid,
        version: Version::V1_3.to_u32(),
        // Namespace Attribute Notices.
        oaes: if discovery { 0 } else { 1 << 8 },
        // Traffic-based keep alive: any command restarts the timer.
        ctratt: CTRATT_TBKAS,
        cntrltype: if discovery {
            controller_type::DISCOVERY
        } else {
            controller_type::IO
        },
        acl: 3,
        aerl: (AER_LIMIT - 1) as u8,
        // Firmware slot 1 read-only, one slot.
        frmw: 0x3,
        // Extended data for Get Log Page (offsets, NUMDU).
        lpa: 1 << 2,
        elpe: (ERROR_LOG_ENTRIES - 1) as u8,
        kas: (config.keep_alive_granularity_ms / 100) as u16,
        sqes: 0x66,
        cqes: 0x44,
        maxcmd: config.max_queue_entries,
        nn: if discovery { 0 } else { subsystem.max_nsid() },
        oncs: if discovery {
            0
        } else {
            oncs::COMPARE | oncs::DATASET_MANAGEMENT | oncs::WRITE_ZEROES
        },
        vwc: u8::from(!discovery),
        sgls: sgls::SUPPORTED | sgls::KEYED | if in_capsule > 0 { sgls::OFFSET } else { 0 },
        mnan: 0,
        subnqn: subsystem.nqn.clone(),
        ioccsz: (64 + in_capsule) / 16,
        iorcsz: 1,
        icdoff: 0,
        ctrattr: 0,
        msdbd: 1,
        ofcs: u16::from(!discovery),
        ..IdentifyControllerRepr::default()
    }
    .to_bytes()
}

/// Identify Namespace of `nsid`; a valid but inactive NSID gets zeroes.
pub(crate) fn identify_namespace(subsystem: &Subsystem, nsid: u32) -> Result<Vec<u8>, Status> {
    if nsid == 0 || nsid == u32::MAX {
        return Err(Status::INVALID_NAMESPACE_OR_FORMAT);
    }
    let Some(namespace) = subsystem.namespaces.get(&nsid) else {
        return Ok(vec![0; IDENTIFY_LEN]);
    };
    let blocks = namespace.device.block_count();
    Ok(IdentifyNamespaceRepr {
        nsze: blocks,
        ncap: blocks,
        nuse: blocks,
        nsfeat: 0,
        flbas: 0,
        nmic: 1,
        // Deallocated blocks read as zeroes; Write Zeroes may deallocate.
        dlfeat: 0x01 | 1 << 3,
        nguid: namespace.nguid,
        eui64: [0; 8],
        lba_formats: vec![LbaFormat {
            ms: 0,
            lbads: namespace.device.block_size().trailing_zeros() as u8,
            rp: 0,
        }],
    }
    .to_bytes())
}

/// The Identify structure a CNS asks for.
pub(crate) fn identify(
    config: &TargetConfig,
    subsystem: &Subsystem,
    controller: &Controller,
    cns_value: u8,
    nsid: u32,
    csi: u8,
) -> Result<Vec<u8>, Status> {
    if subsystem.kind == SubsystemKind::Discovery && cns_value != cns::CONTROLLER {
        return Err(Status::INVALID_FIELD);
    }
    match cns_value {
        cns::CONTROLLER => Ok(identify_controller(config, subsystem, controller)),
        cns::NAMESPACE => identify_namespace(subsystem, nsid),
        cns::ACTIVE_NAMESPACES => {
            if nsid >= 0xFFFF_FFFE {
                return Err(Status::INVALID_NAMESPACE_OR_FORMAT);
            }
            let nsids: Vec<u32> = subsystem.namespaces.keys().copied().collect();
            Ok(emit_active_namespaces(&nsids, nsid))
        }
        cns::NAMESPACE_DESCRIPTORS => {
            let namespace = subsystem
                .namespaces
                .get(&nsid)
                .ok_or(Status::INVALID_NAMESPACE_OR_FORMAT)?;
            Ok(emit_namespace_descriptors(&[
                NamespaceDescriptor::Nguid(namespace.nguid),
                NamespaceDescriptor::Uuid(namespace.uuid),
                NamespaceDescriptor::Csi(0),
            ]))
        }
        // The NVM command set's own Identify structures: nothing beyond the defaults.
        cns::CSI_CONTROLLER if csi == 0 => Ok(vec![0; IDENTIFY_LEN]),
        cns::CSI_NAMESPACE if csi == 0 => {
            if subsystem.namespaces.contains_key(&nsid) {
                Ok(vec![0; IDENTIFY_LEN])
            } else {
                Err(Status::INVALID_NAMESPACE_OR_FORMAT)
            }
        }
        _ => Err(Status::INVALID_FIELD),
    }
}

/// One record of the Discovery log page per NVM subsystem `host_nqn` may connect to.
pub(crate) fn discovery_entries(
    config: &TargetConfig,
    subsystems: &[Subsystem],
    host_nqn: &str,
) -> Vec<DiscoveryLogEntryRepr> {
    subsystems
        .iter()
        .filter(|s| s.kind == SubsystemKind::Nvm && s.allowed_hosts.allows(host_nqn))
        .map(|s| DiscoveryLogEntryRepr {
            trtype: log::trtype::RDMA,
            adrfam: log::adrfam::IPV4,
            subtype: log::subtype::NVM,
            treq: 0,
            portid: config.port_id,
            cntlid: 0xFFFF,
            asqsz: config.max_admin_queue_entries,
            eflags: 0,
            trsvcid: config.listen.port.to_string(),
            subnqn: s.nqn.clone(),
            traddr: config.listen.ip.to_string(),
            // Reliable connected, no provider type given, RDMA CM.
            rdma_qptype: 1,
            rdma_prtype: 1,
            rdma_cms: 1,
            rdma_pkey: 0,
        })
        .collect()
}

/// The Commands Supported and Effects log page: which opcodes this target takes.
pub(crate) fn commands_effects(discovery: bool) -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    let mut set = |index: usize, value: u32| page[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes());
    // CSUPP (bit 0); LBCC (bit 1) for commands that change blocks.
    for opc in [
        opcode::GET_LOG_PAGE,
        opcode::IDENTIFY,
        opcode::ABORT,
        opcode::SET_FEATURES,
        opcode::GET_FEATURES,
        opcode::ASYNC_EVENT_REQUEST,
        opcode::KEEP_ALIVE,
    ] {
        set(usize::from(opc), 1);
    }
    if !discovery {
        for opc in [opcode::READ, opcode::FLUSH, opcode::COMPARE] {
            set(256 + usize::from(opc), 1);
        }
        for opc in [opcode::WRITE, opcode::WRITE_ZEROES, opcode::DATASET_MANAGEMENT] {
            set(256 + usize::from(opc), 0b11);
        }
    }
    page
}

/// The whole log page `lid` (before the command's offset and length are applied).
pub(crate) fn log_page(
    config: &TargetConfig,
    subsystems: &[Subsystem],
    subsystem_index: usize,
    controller: &mut Controller,
    lid: u8,
    genctr: u64,
    uptime_hours: u64,
) -> Result<Vec<u8>, Status> {
    let subsystem = &subsystems[subsystem_index];
    let discovery = subsystem.kind == SubsystemKind::Discovery;
    match lid {
        log_page::DISCOVERY if discovery => Ok(emit_discovery_log(
            genctr,
            &discovery_entries(config, subsystems, &controller.host_nqn),
        )),
        log_page::ERROR => {
            let mut page = vec![0u8; ERROR_LOG_ENTRIES * ErrorLogEntryRepr::LEN];
            for (i, entry) in controller.error_log.iter().enumerate() {
                page[i * ErrorLogEntryRepr::LEN..(i + 1) * ErrorLogEntryRepr::LEN].copy_from_slice(&entry.to_bytes());
            }
            Ok(page)
        }
        log_page::SMART if !discovery => {
            let c = subsystem.counters;
            // Data units: thousands of 512-byte units, rounded up.
            let units = |bytes: u64| (bytes / 512).div_ceil(1000);
            Ok(SmartLogRepr {
                critical_warning: 0,
                // 37 °C.
                temperature_kelvin: 310,
                available_spare: 100,
                available_spare_threshold: 10,
                percentage_used: 0,
                data_units_read: units(c.bytes_read),
                data_units_written: units(c.bytes_written),
                host_read_commands: c.read_commands,
                host_write_commands: c.write_commands,
                controller_busy_time: 0,
                power_cycles: 1,
                power_on_hours: uptime_hours,
                unsafe_shutdowns: 0,
                media_errors: c.media_errors,
                error_log_entries: controller.error_count,
            }
            .to_bytes())
        }
        log_page::FIRMWARE_SLOT if !discovery => Ok(emit_firmware_slot_log(FIRMWARE_REVISION)),
        log_page::CHANGED_NAMESPACES if !discovery => {
            let mut page = vec![0u8; 4096];
            let changed = std::mem::take(&mut controller.changed_namespaces);
            if changed.len() > 1024 {
                // More than fit: the first entry says "too many" (0xFFFFFFFF).
                page[..4].copy_from_slice(&u32::MAX.to_le_bytes());
            } else {
                for (i, nsid) in changed.iter().enumerate() {
                    page[4 * i..4 * i + 4].copy_from_slice(&nsid.to_le_bytes());
                }
            }
            Ok(page)
        }
        log_page::COMMANDS_EFFECTS => Ok(commands_effects(discovery)),
        _ => Err(Status::INVALID_LOG_PAGE),
    }
}

/// Bytes `offset..offset + length` of `page`, zero-padded past its end.
///
/// # Errors
/// [`Status::INVALID_FIELD`] for an offset that is not dword aligned or past the page.
pub(crate) fn log_slice(page: &[u8], offset: u64, length: usize) -> Result<Vec<u8>, Status> {
    if !offset.is_multiple_of(4) || offset > page.len() as u64 {
        return Err(Status::INVALID_FIELD);
    }
    let start = offset as usize;
    let mut out = vec![0u8; length];
    let available = (page.len() - start).min(length);
    out[..available].copy_from_slice(&page[start..start + available]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{BlockDevice, RamBackend};
    use crate::nvmeof::target::subsystem::AllowedHosts;
    use crate::nvmeof::wire::identify::{parse_identify_controller, parse_identify_namespace};
    use crate::nvmeof::wire::log::{DiscoveryLogEntryRepr, DiscoveryLogHeaderRepr};
    use std::sync::Arc;

    fn subsystem() -> Subsystem {
        let mut s = Subsystem::nvm("nqn.2024-01.io.example:a", AllowedHosts::Any);
        let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(4096, 256).unwrap());
        s.add_namespace(1, device);
        s
    }

    #[test]
    fn identify_controller_describes_a_fabrics_controller() {
        let config = TargetConfig::default();
        let s = subsystem();
        let c = Controller::new(7, 0, "nqn.host".into(), [0; 16], 0, 4);
        let id = parse_identify_controller(&identify_controller(&config, &s, &c)).unwrap();
        assert_eq!(id.cntlid, 7);
        assert_eq!(id.cntrltype, controller_type::IO);
        assert_eq!(id.subnqn, "nqn.2024-01.io.example:a");
        assert_eq!(
            id.sgls & (sgls::KEYED | sgls::OFFSET | 0x3),
            sgls::KEYED | sgls::OFFSET | sgls::SUPPORTED
        );
        assert_eq!(id.ioccsz, (64 + 4096) / 16);
        assert_eq!(id.iorcsz, 1);
        assert_eq!(id.icdoff, 0);
        assert_eq!(id.nn, 1);
        assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
        assert_eq!(id.kas, 10);
    }

    #[test]
    fn identify_namespace_and_lists() {
        let config = TargetConfig::default();
        let s = subsystem();
        let c = Controller::new(1, 0, "h".into(), [0; 16], 0, 4);
        let ns = parse_identify_namespace(&identify(&config, &s, &c, cns::NAMESPACE, 1, 0).unwrap()).unwrap();
        assert_eq!((ns.nsze, ns.block_size()), (256, Some(4096)));
        // Inactive but valid NSID: zeroes. NSID 0: invalid.
        assert!(identify(&config, &s, &c, cns::NAMESPACE, 2, 0)
            .unwrap()
            .iter()
            .all(|b| *b == 0));
        assert_eq!(
            identify(&config, &s, &c, cns::NAMESPACE, 0, 0),
            Err(Status::INVALID_NAMESPACE_OR_FORMAT)
        );
        assert_eq!(identify(&config, &s, &c, 0x42, 0, 0), Err(Status::INVALID_FIELD));
        let list = identify(&config, &s, &c, cns::ACTIVE_NAMESPACES, 0, 0).unwrap();
        assert_eq!(&list[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            identify(&config, &s, &c, cns::NAMESPACE_DESCRIPTORS, 9, 0),
            Err(Status::INVALID_NAMESPACE_OR_FORMAT)
        );
    }

    #[test]
    fn discovery_log_lists_only_allowed_subsystems() {
        let config = TargetConfig::default();
        let mut private = Subsystem::nvm("nqn.private", AllowedHosts::Only(vec!["nqn.host:a".into()]));
        private.add_namespace(1, Arc::new(RamBackend::new(512, 8).unwrap()));
        let subsystems = vec![Subsystem::discovery(), subsystem(), private];
        let mut c = Controller::new(1, 0, "nqn.host:b".into(), [0; 16], 0, 0);
        let page = log_page(&config, &subsystems, 0, &mut c, log_page::DISCOVERY, 3, 0).unwrap();
        let header = DiscoveryLogHeaderRepr::parse(&page).unwrap();
        assert_eq!((header.genctr, header.numrec), (3, 1));
        let entry = DiscoveryLogEntryRepr::parse(&page[1024..]).unwrap();
        assert_eq!(entry.subnqn, "nqn.2024-01.io.example:a");
        assert_eq!(entry.trsvcid, "4420");
        c.host_nqn = "nqn.host:a".into();
        let page = log_page(&config, &subsystems, 0, &mut c, log_page::DISCOVERY, 3, 0).unwrap();
        assert_eq!(DiscoveryLogHeaderRepr::parse(&page).unwrap().numrec, 2);
        // The discovery page is the discovery controller's only.
        assert_eq!(
            log_page(&config, &subsystems, 1, &mut c, log_page::DISCOVERY, 3, 0),
            Err(Status::INVALID_LOG_PAGE)
        );
    }

    #[test]
    fn log_slices_apply_offsets() {
        let page: Vec<u8> = (0..16).collect();
        assert_eq!(log_slice(&page, 4, 8).unwrap(), vec![4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(log_slice(&page, 12, 8).unwrap(), vec![12, 13, 14, 15, 0, 0, 0, 0]);
        assert_eq!(log_slice(&page, 2, 4), Err(Status::INVALID_FIELD));
        assert_eq!(log_slice(&page, 20, 4), Err(Status::INVALID_FIELD));
    }
}
