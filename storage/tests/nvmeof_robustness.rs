//! A hostile or broken host against the target: every malformed capsule is answered with
//! the status the specification gives (or, with nothing to answer, the queue is torn
//! down), counted, and nothing reaches the block device that the protocol did not
//! complete.

mod common;

use common::{Rig, RigConfig};
use rnic_storage::nvmeof::host::{Host, HostConfig, HostError};
use rnic_storage::nvmeof::target::{AllowedHosts, TargetConfig};
use rnic_storage::nvmeof::wire::cm::{CmRejectRepr, CmRejectStatus, CmRequestRepr};
use rnic_storage::nvmeof::wire::command::{BlockRange, Command};
use rnic_storage::nvmeof::wire::cqe::CqeRepr;
use rnic_storage::nvmeof::wire::sgl::SglRepr;
use rnic_storage::nvmeof::wire::status::{InvalidParameter, Status};
use rnic_storage::rdma::{ConnectParams, ConnectionError, Connector, Reactor};
use rnic_verbs::{Context, QpCapabilities, QpInitAttributes, QpType};

fn write(nsid: u32, slba: u64, blocks: u32) -> Command {
    Command::Write(BlockRange {
        nsid,
        slba,
        blocks,
        fua: false,
    })
}

fn raw(host: &mut Host, queue: usize, capsule: &[u8]) -> CqeRepr {
    host.raw_capsule(queue, capsule, true).unwrap().unwrap()
}

fn quiet_host(rig: &Rig) -> HostConfig {
    HostConfig {
        io_queues: 1,
        async_events: false,
        kato_ms: 0,
        reconnect_attempts: 0,
        ..rig.host_config()
    }
}

fn device_block(rig: &Rig, lba: u64) -> Vec<u8> {
    let mut out = vec![0u8; rig.device.block_size() as usize];
    rig.device.read(lba, &mut out).unwrap();
    out
}

#[test]
fn unknown_opcodes_and_bad_flags_are_refused() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(quiet_host(&rig)).unwrap();
    let mut capsule = write(1, 0, 1).to_sqe(0x101, &SglRepr::NO_DATA).to_bytes();
    capsule[0] = 0x7E; // no such NVM opcode
    let cqe = raw(&mut host, 1, &capsule);
    assert_eq!((cqe.cid, cqe.status, cqe.sqid), (0x101, Status::INVALID_OPCODE, 1));
    // An admin opcode on the I/O queue.
    capsule[0] = 0x06;
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::INVALID_OPCODE);
    // PSDT 00b (PRPs) is not for fabrics.
    let mut capsule = write(1, 0, 1).to_sqe(0x102, &SglRepr::NO_DATA).to_bytes();
    capsule[1] = 0x00;
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::INVALID_FIELD);
    // An SGL type fabrics do not carry.
    let capsule = write(1, 0, 1)
        .to_sqe(0x103, &SglRepr::BitBucket { length: 512 })
        .to_bytes();
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // A namespace that does not exist.
    let capsule = Command::Read(BlockRange {
        nsid: 9,
        slba: 0,
        blocks: 1,
        fua: false,
    })
    .to_sqe(0x104, &SglRepr::NO_DATA)
    .to_bytes();
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::INVALID_NAMESPACE_OR_FORMAT);
    let target = rig.target();
    let counters = target.counters();
    assert_eq!(counters.status_count(Status::INVALID_OPCODE), 2);
    assert_eq!(counters.status_count(Status::INVALID_FIELD), 1);
    assert_eq!(counters.status_count(Status::SGL_DESCRIPTOR_TYPE_INVALID), 1);
    assert_eq!(counters.status_count(Status::INVALID_NAMESPACE_OR_FORMAT), 1);
    assert_eq!(counters.queues_torn_down, 0, "answered, not torn down");
    let refused = rnic_diag::Kind::new("nvmf-target", "refused-command");
    assert_eq!(target.diagnostics().count(refused), 5, "each one a diagnostic");
}

#[test]
fn io_beyond_the_namespace_writes_nothing() {
    let mut rig = Rig::new(RigConfig {
        blocks: 1024,
        ..RigConfig::default()
    });
    let mut host = rig.connect(quiet_host(&rig)).unwrap();
    host.write(1, 1023, &[0x11; 512]).unwrap();
    // Two blocks from the last: refused whole.
    let mut capsule = write(1, 1023, 2)
        .to_sqe(
            0x201,
            &SglRepr::InCapsule {
                offset: 0,
                length: 1024,
            },
        )
        .to_bytes()
        .to_vec();
    capsule.extend_from_slice(&[0xEE; 1024]);
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(device_block(&rig, 1023), vec![0x11; 512]);
    // A start LBA that wraps around.
    let capsule = Command::Read(BlockRange {
        nsid: 1,
        slba: u64::MAX,
        blocks: 2,
        fua: false,
    })
    .to_sqe(0x202, &SglRepr::NO_DATA)
    .to_bytes();
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::LBA_OUT_OF_RANGE);
    // Write Zeroes past the end.
    let capsule = Command::WriteZeroes {
        range: BlockRange {
            nsid: 1,
            slba: 1000,
            blocks: 100,
            fua: false,
        },
        deallocate: false,
    }
    .to_sqe(0x203, &SglRepr::NO_DATA)
    .to_bytes();
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::LBA_OUT_OF_RANGE);
    assert_eq!(device_block(&rig, 1023), vec![0x11; 512]);
    assert_eq!(rig.target().counters().status_count(Status::LBA_OUT_OF_RANGE), 3);
}

#[test]
fn sgls_that_do_not_match_the_capsule_or_the_command_are_refused() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(quiet_host(&rig)).unwrap();
    // In-capsule SGL longer than the data in the capsule.
    let mut capsule = write(1, 5, 2)
        .to_sqe(
            0x301,
            &SglRepr::InCapsule {
                offset: 0,
                length: 1024,
            },
        )
        .to_bytes()
        .to_vec();
    capsule.extend_from_slice(&[0xEE; 512]);
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::DATA_SGL_LENGTH_INVALID);
    // In-capsule data at an offset (ICDOFF is 0).
    let mut capsule = write(1, 5, 1)
        .to_sqe(
            0x302,
            &SglRepr::InCapsule {
                offset: 64,
                length: 512,
            },
        )
        .to_bytes()
        .to_vec();
    capsule.extend_from_slice(&[0xEE; 576]);
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::INVALID_SGL_OFFSET);
    // An SGL shorter than the blocks the command names.
    let mut capsule = write(1, 5, 2)
        .to_sqe(0x303, &SglRepr::InCapsule { offset: 0, length: 512 })
        .to_bytes()
        .to_vec();
    capsule.extend_from_slice(&[0xEE; 512]);
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::DATA_SGL_LENGTH_INVALID);
    // Read data cannot go into the capsule.
    let capsule = Command::Read(BlockRange {
        nsid: 1,
        slba: 5,
        blocks: 1,
        fua: false,
    })
    .to_sqe(0x304, &SglRepr::InCapsule { offset: 0, length: 512 })
    .to_bytes()
    .to_vec();
    let mut capsule = capsule;
    capsule.extend_from_slice(&[0; 512]);
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::SGL_DESCRIPTOR_TYPE_INVALID);
    // More than the maximum transfer (MDTS 8: 1 MiB).
    let capsule = Command::Read(BlockRange {
        nsid: 1,
        slba: 0,
        blocks: 4096,
        fua: false,
    })
    .to_sqe(
        0x305,
        &SglRepr::Keyed {
            address: 0x1000,
            length: 4096 * 512,
            key: 1,
            invalidate: false,
        },
    )
    .to_bytes();
    assert_eq!(raw(&mut host, 1, &capsule).status, Status::INVALID_FIELD);
    assert_eq!(device_block(&rig, 5), vec![0; 512], "nothing written");
}

#[test]
fn a_wrong_rkey_or_address_tears_the_queue_down_and_writes_nothing() {
    for (name, key_xor, address_offset) in [("wrong R_Key", 0x100u32, 0u64), ("unregistered memory", 0, 1 << 40)] {
        let mut rig = Rig::new(RigConfig::default());
        let mut host = rig.connect(quiet_host(&rig)).unwrap();
        let buffer = host.allocate_buffer(0, 4096).unwrap();
        host.write_buffer(0, &buffer, 0, &[0x5A; 4096]).unwrap();
        let SglRepr::Keyed { address, key, .. } = host.buffer_sgl(0, &buffer).unwrap() else {
            unreachable!()
        };
        // The keyed SGL names host memory the target cannot read.
        let capsule = write(1, 100, 8)
            .to_sqe(
                0x401,
                &SglRepr::Keyed {
                    address: address + address_offset,
                    length: 4096,
                    key: key ^ key_xor,
                    invalidate: false,
                },
            )
            .to_bytes();
        let result = host.raw_capsule(1, &capsule, true);
        assert!(
            matches!(result, Err(HostError::Disconnected(_)) | Err(HostError::TimedOut(_))),
            "{name}: {result:?}"
        );
        rig.run_for(1_000_000);
        let target = rig.target();
        assert!(target.counters().rdma_errors >= 1, "{name}");
        assert!(target.counters().queues_torn_down >= 1, "{name}");
        drop(target);
        for lba in 100..108 {
            assert_eq!(device_block(&rig, lba), vec![0; 512], "{name}: block {lba} written");
        }
    }
}

#[test]
fn a_capsule_shorter_than_an_sqe_tears_the_queue_down() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(quiet_host(&rig)).unwrap();
    let _ = host.raw_capsule(1, &[0x02, 0x40, 0x01, 0x00, 0x01], false);
    rig.run_for(1_000_000);
    let target = rig.target();
    assert_eq!(target.counters().malformed_capsules, 1);
    assert_eq!(target.counters().queues_torn_down, 1, "the I/O queue only");
    assert_eq!(target.controller_count(), 1, "the admin queue lives on");
}

#[test]
fn a_reused_command_identifier_is_a_conflict() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig.connect(quiet_host(&rig)).unwrap();
    // An Asynchronous Event Request stays outstanding; a Keep Alive with its CID collides.
    let aer = Command::AsyncEventRequest.to_sqe(0x3FF, &SglRepr::NO_DATA).to_bytes();
    assert!(host.raw_capsule(0, &aer, false).unwrap().is_none());
    let keep_alive = Command::KeepAlive.to_sqe(0x3FF, &SglRepr::NO_DATA).to_bytes();
    host.raw_capsule(0, &keep_alive, false).unwrap();
    rig.run_for(100_000);
    let mut responses = Vec::new();
    for _ in 0..100 {
        let _ = host.poll(&mut Vec::new());
        responses.extend(host.take_raw_responses());
        if !responses.is_empty() {
            break;
        }
        host.reactor().idle(false);
    }
    assert_eq!(responses.len(), 1, "only the Keep Alive is answered");
    assert_eq!(responses[0].status, Status::COMMAND_ID_CONFLICT);
    assert_eq!(rig.target().counters().status_count(Status::COMMAND_ID_CONFLICT), 1);
}

#[test]
fn a_host_that_overruns_its_queue_is_told_to_retry() {
    let mut rig = Rig::new(RigConfig::default());
    // The host tells the target 4 entries and keeps 32.
    let mut host = rig
        .connect(HostConfig {
            advertised_queue_entries: Some(4),
            io_queues: 0,
            ..quiet_host(&rig)
        })
        .unwrap();
    // Four parked AERs fill the queue; the fifth command overruns it.
    for cid in 0..4u16 {
        let aer = Command::AsyncEventRequest
            .to_sqe(0x200 + cid, &SglRepr::NO_DATA)
            .to_bytes();
        host.raw_capsule(0, &aer, false).unwrap();
    }
    let keep_alive = Command::KeepAlive.to_sqe(0x210, &SglRepr::NO_DATA).to_bytes();
    let cqe = raw(&mut host, 0, &keep_alive);
    assert_eq!(cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(!cqe.status.dnr);
    assert_eq!(rig.target().counters().queue_overruns, 1);
}

#[test]
fn an_unknown_host_nqn_is_refused_at_connect() {
    let mut rig = Rig::new(RigConfig {
        allowed_hosts: AllowedHosts::Only(vec!["nqn.2014-08.org.nvmexpress:uuid:allowed".into()]),
        ..RigConfig::default()
    });
    match rig.connect(quiet_host(&rig)) {
        Err(HostError::Command { command, status, dw0 }) => {
            assert_eq!(command, "Connect");
            assert_eq!(status, Status::CONNECT_INVALID_HOST);
            assert_eq!(InvalidParameter::from_dw0(dw0), InvalidParameter::data(512));
        }
        other => panic!("{other:?}"),
    }
    let allowed = HostConfig {
        host_nqn: "nqn.2014-08.org.nvmexpress:uuid:allowed".into(),
        ..quiet_host(&rig)
    };
    assert!(rig.connect(allowed).is_ok());
    let target = rig.target();
    assert_eq!(target.counters().status_count(Status::CONNECT_INVALID_HOST), 1);
}

#[test]
fn an_unknown_subsystem_is_an_invalid_parameter() {
    let mut rig = Rig::new(RigConfig::default());
    let result = rig.connect(HostConfig {
        subsystem_nqn: "nqn.2024-01.io.rnic-emu:nobody".into(),
        ..quiet_host(&rig)
    });
    match result {
        Err(HostError::Command { status, dw0, .. }) => {
            assert_eq!(status, Status::CONNECT_INVALID_PARAMETERS);
            assert_eq!(InvalidParameter::from_dw0(dw0), InvalidParameter::data(256));
        }
        other => panic!("{other:?}"),
    }
}

/// Connects one RC QP with `private_data` and returns the reject, if any.
fn cm_request(rig: &mut Rig, private_data: Vec<u8>, responder_resources: u8) -> Result<(), ConnectionError> {
    let nic = rig.fabric.add_nic([2, 0, 0, 0, 0, 0x77]);
    let context = Context::open(Box::new(nic)).unwrap();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(16, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    let mut pending = rig
        .cm
        .connector()
        .connect(
            &context,
            &qp,
            &ConnectParams {
                destination: common::ADDRESS,
                private_data,
                responder_resources,
                initiator_depth: 0,
                retry_count: 7,
                rnr_retry_count: 7,
            },
        )
        .unwrap();
    let mut reactor = rig.reactor();
    for _ in 0..1000 {
        if let Some(result) = pending.poll(&qp) {
            return result.map(|_| ());
        }
        reactor.idle(false);
    }
    panic!("no answer");
}

fn rejected_with(result: Result<(), ConnectionError>) -> CmRejectStatus {
    match result {
        Err(ConnectionError::Rejected { private_data }) => {
            use rnic_storage::nvmeof::wire::cm::CmReject;
            CmRejectRepr::parse(&CmReject::new_checked(&private_data[..]).unwrap())
                .unwrap()
                .status
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_cm_private_data_is_rejected_with_its_status() {
    let mut rig = Rig::new(RigConfig {
        target: TargetConfig {
            listen: common::ADDRESS,
            max_io_queues: 4,
            ..TargetConfig::default()
        },
        ..RigConfig::default()
    });
    let request = |qid, hrqsize, hsqsize| {
        CmRequestRepr {
            recfmt: 0,
            qid,
            hrqsize,
            hsqsize,
            cntlid: 0,
        }
        .to_bytes()
        .to_vec()
    };
    assert_eq!(
        rejected_with(cm_request(&mut rig, vec![0; 8], 16)),
        CmRejectStatus::InvalidPrivateDataLength
    );
    let mut bad_format = request(0, 32, 31);
    bad_format[0] = 1;
    assert_eq!(
        rejected_with(cm_request(&mut rig, bad_format, 16)),
        CmRejectStatus::InvalidRecordFormat
    );
    assert_eq!(
        rejected_with(cm_request(&mut rig, request(9, 32, 31), 16)),
        CmRejectStatus::InvalidQid
    );
    assert_eq!(
        rejected_with(cm_request(&mut rig, request(0, 64, 63), 16)),
        CmRejectStatus::InvalidHsqsize
    );
    assert_eq!(
        rejected_with(cm_request(&mut rig, request(1, 256, 255), 16)),
        CmRejectStatus::InvalidHsqsize
    );
    assert_eq!(
        rejected_with(cm_request(&mut rig, request(1, 0, 31), 16)),
        CmRejectStatus::InvalidHrqsize
    );
    assert_eq!(
        rejected_with(cm_request(&mut rig, request(1, 32, 31), 0)),
        CmRejectStatus::InvalidIrd
    );
    assert!(cm_request(&mut rig, request(1, 32, 31), 16).is_ok());
    assert_eq!(rig.target().counters().connections_rejected, 7);
}

#[test]
fn commands_before_connect_and_before_enable_are_sequence_errors() {
    let mut rig = Rig::new(RigConfig::default());
    let mut host = rig
        .connect(HostConfig {
            io_queues: 0,
            ..quiet_host(&rig)
        })
        .unwrap();
    // Disable the controller: Identify is out of sequence, Property Get still works.
    host.property_set(0x14, 0).unwrap();
    let identify = Command::Identify {
        cns: 1,
        cntid: 0,
        nsid: 0,
        csi: 0,
    }
    .to_sqe(0x3F0, &SglRepr::NO_DATA)
    .to_bytes();
    assert_eq!(raw(&mut host, 0, &identify).status, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(
        host.property_get(0x1C, rnic_storage::nvmeof::wire::command::PropertySize::Four)
            .unwrap(),
        0,
        "CSTS.RDY is clear"
    );
}

/// xorshift64*, for the random capsules.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn random_capsules_never_hurt_the_target() {
    let seed = std::env::var("RNIC_TEST_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0x00C0_FFEE);
    let mut rng = Random(seed | 1);
    let mut rig = Rig::new(RigConfig {
        blocks: 4096,
        ..RigConfig::default()
    });
    let before: Vec<u8> = (0..64).flat_map(|lba| device_block(&rig, lba)).collect();
    let mut host = None;
    let mut sent = 0;
    while sent < 1500 {
        let h = match host.as_mut() {
            Some(h) => h,
            None => host.insert(rig.connect(quiet_host(&rig)).unwrap()),
        };
        let length = match rng.next() % 32 {
            0 => (rng.next() % 64) as usize,
            1..=20 => 64,
            _ => 64 + (rng.next() % 600) as usize,
        };
        let mut capsule: Vec<u8> = (0..length).map(|_| rng.next() as u8).collect();
        if length >= 64 {
            if !rng.next().is_multiple_of(4) {
                capsule[1] = 0x40;
            }
            if rng.next().is_multiple_of(2) {
                // Known opcodes with random fields, aimed at the first 64 blocks.
                capsule[0] = [
                    0x00, 0x01, 0x02, 0x05, 0x08, 0x09, 0x06, 0x02, 0x09, 0x0A, 0x0C, 0x18, 0x7F,
                ][(rng.next() % 13) as usize];
                capsule[4..8].copy_from_slice(&1u32.to_le_bytes());
                capsule[44..48].fill(0);
                capsule[40..44].copy_from_slice(&((rng.next() % 64) as u32).to_le_bytes());
                capsule[48..50].copy_from_slice(&((rng.next() % 8) as u16).to_le_bytes());
            }
        }
        let queue = (rng.next() % 2) as usize;
        sent += 1;
        if h.raw_capsule(queue, &capsule, false).is_err() {
            host = None;
            continue;
        }
        for _ in 0..4 {
            let _ = h.poll(&mut Vec::new());
            h.take_raw_responses();
            h.reactor().idle(false);
        }
        if h.poll(&mut Vec::new()).is_err() {
            host = None;
        }
    }
    drop(host);
    rig.run_for(10_000_000);
    // Whatever was written came from commands the target accepted whole; the target
    // still serves a well-behaved host.
    let mut good = rig.connect(quiet_host(&rig)).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
    good.write(1, 3000, &data).unwrap();
    let mut back = vec![0u8; 8192];
    good.read(1, 3000, &mut back).unwrap();
    assert_eq!(back, data);
    let counters = rig.target().counters().clone();
    assert!(counters.capsules_received > 1000, "{counters:?}");
    assert!(counters.commands_failed > 100, "{counters:?}");
    let _ = before;
}
