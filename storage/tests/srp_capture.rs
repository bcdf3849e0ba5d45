//! SRP on the wire: a session between our initiator and target is captured on the
//! embedded fabric and read back by the project's capture checker — every ICRC
//! recomputed, tshark with the project's SRP Lua dissector
//! (testbench/wireshark/srp.lua): no malformed frame, no error; and the dissector
//! finds the IUs the session sent. A capture with a malformed IU must be flagged.

mod srp_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rnic_hw_model::fabric::pcap::PcapWriter;
use rnic_pcap_check::{check_file, project_lua_scripts, CheckOptions};
use rnic_storage::scsi::cdb::{Cdb, ReadWrite};
use rnic_storage::srp::wire::descriptor::DataDescriptor;
use rnic_storage::srp::wire::iu::{CmdRepr, IuRepr};
use srp_common::{pattern, Rig, RigConfig};

/// The embedded NICs address each other by IPv6 link-local GIDs and send UDP checksum
/// 0, as rdma_rxe does; the ICRC protects the frame.
fn options() -> CheckOptions {
    CheckOptions {
        allow_zero_udp_checksum: true,
        ..CheckOptions::default()
    }
}

fn write_capture(rig: &Rig, name: &str) -> PathBuf {
    let frames = rig.fabric.take_capture();
    assert!(!frames.is_empty());
    let path = std::env::temp_dir().join(format!("rnic-srp-{name}-{}.pcap", std::process::id()));
    let mut writer = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    for frame in &frames {
        writer.write_frame(frame.time, &frame.bytes).unwrap();
    }
    writer.flush().unwrap();
    path
}

/// The SRP opcodes tshark's reading of the capture names, frame by frame.
fn srp_opcodes(path: &Path) -> Vec<String> {
    tshark_fields(path, "srprdma", &["srprdma.opcode"])
}

/// tshark's `fields` of the frames matching `filter`, one line per frame.
fn tshark_fields(path: &Path, filter: &str, fields: &[&str]) -> Vec<String> {
    let mut command = Command::new("tshark");
    command.arg("-r").arg(path);
    for script in project_lua_scripts() {
        command.arg("-X").arg(format!("lua_script:{}", script.display()));
    }
    command.args([
        "--disable-heuristic",
        "rpcrdma_infiniband",
        "-Y",
        filter,
        "-T",
        "fields",
        "-E",
        "separator=|",
    ]);
    for field in fields {
        command.args(["-e", field]);
    }
    let output = command.output().expect("tshark runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_session_decodes_with_the_srp_dissector_and_nothing_malformed() {
    let mut rig = Rig::new(RigConfig::default());
    rig.fabric.set_capture(true);
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    initiator.inquiry(0).unwrap();
    initiator.read_capacity(0).unwrap();
    // Immediate data and data-out by RDMA READ; data-in by RDMA WRITE.
    initiator.write(0, 0, 512, &pattern(2048, 1)).unwrap();
    initiator.write(0, 64, 512, &pattern(16384, 2)).unwrap();
    let mut back = vec![0u8; 16384];
    initiator.read(0, 64, 512, &mut back).unwrap();
    // CHECK CONDITION with sense; task management.
    assert!(initiator.read_capacity(9).is_err());
    initiator.lun_reset(0).unwrap();
    initiator.logout();
    rig.run_for(1_000_000);
    let path = write_capture(&rig, "session");
    let report = check_file(&path, &options()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    assert!(report.passed(), "{report}\n(capture kept at {})", path.display());
    let opcodes = srp_opcodes(&path);
    for (opcode, name) in [("0x02", "SRP_CMD"), ("0xc1", "SRP_RSP"), ("0x01", "SRP_TSK_MGMT")] {
        assert!(opcodes.iter().any(|o| o == opcode), "no {name} decoded: {opcodes:?}");
    }
    // Every command and every response was claimed: 9 commands (INQUIRY, READ
    // CAPACITY(16), 2 WRITEs, READ, READ CAPACITY(16) and (10) on LUN 9) + 1 task
    // management, each with its response.
    assert_eq!(opcodes.iter().filter(|o| *o == "0xc1").count(), 8, "{opcodes:?}");
    assert_eq!(opcodes.len(), 16, "{opcodes:?}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_dissector_flags_a_malformed_iu() {
    let mut rig = Rig::new(RigConfig::default());
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    rig.fabric.set_capture(true);
    // An SRP_CMD announcing a three-entry indirect data-out table it does not carry.
    let mut iu = IuRepr::Cmd(CmdRepr {
        tag: 42,
        cdb: Cdb::Write(ReadWrite {
            lba: 0,
            blocks: 1,
            ..ReadWrite::default()
        })
        .to_bytes(),
        data_out: DataDescriptor::None,
        ..CmdRepr::default()
    })
    .to_bytes();
    iu[5] = 0x20;
    iu[6] = 3;
    iu.resize(60, 0);
    initiator.send_raw_iu(&iu, true).unwrap();
    initiator.expect_response(42, 0);
    assert_eq!(initiator.wait_completions(1).unwrap().len(), 1);
    let path = write_capture(&rig, "malformed");
    let report = check_file(&path, &options()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!report.passed(), "the malformed SRP_CMD went unnoticed: {report}");
    let text = report.to_string();
    assert!(
        text.contains("Malformed SRP") || text.contains("past the end"),
        "{text}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_login_through_the_rdma_cm_decodes_with_cm_and_srp_fields() {
    let mut rig = Rig::new(RigConfig {
        rdma_cm: true,
        ..RigConfig::default()
    });
    rig.fabric.set_capture(true);
    let mut initiator = rig.login(rig.initiator_config()).unwrap();
    initiator.inquiry(0).unwrap();
    initiator.write(0, 0, 512, &pattern(4096, 5)).unwrap();
    initiator.logout();
    rig.run_for(5_000_000);
    // A refused login: REJ with SRP_LOGIN_REJ.
    let refused = rig.login(rnic_storage::srp::initiator::InitiatorConfig {
        target_port_id: rnic_storage::srp::wire::PortId::new(9, 9),
        ..rig.initiator_config()
    });
    assert!(refused.is_err());
    rig.run_for(5_000_000);
    let path = write_capture(&rig, "rdma-cm");
    let report = check_file(&path, &options()).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.passed(), "{report}\n(capture kept at {})", path.display());
    // The CM: REQ (0x10), REP (0x13), RTU (0x14), REJ (0x12), and DREQ/DREP.
    let cm = tshark_fields(
        &path,
        "infiniband.mad.mgmtclass == 0x07",
        &["infiniband.mad.attributeid", "infiniband.cm.req.serviceid"],
    );
    for attribute in ["0x0010", "0x0013", "0x0014", "0x0012", "0x0015"] {
        assert!(
            cm.iter().any(|row| row.starts_with(attribute)),
            "no CM {attribute}: {cm:?}"
        );
    }
    // Service ID: RDMA-CM, TCP port space, port 5555.
    assert!(cm.iter().any(|row| row.ends_with("0x00000000010615b3")), "{cm:?}");
    // The login in the private data: the compact request's IT IU length, the response's
    // credits, the reject's reason.
    let login = tshark_fields(
        &path,
        "srprdma.login.it_iu_len || srprdma.login.reason",
        &[
            "infiniband.mad.attributeid",
            "srprdma.login.it_iu_len",
            "srprdma.req_lim_delta",
            "srprdma.login.reason",
        ],
    );
    assert!(login.iter().any(|r| r.starts_with("0x0010|8260")), "{login:?}");
    assert!(login.iter().any(|r| r.starts_with("0x0013|8260|128")), "{login:?}");
    assert!(
        login
            .iter()
            .any(|r| r.starts_with("0x0012") && r.ends_with("0x00010003")),
        "{login:?}"
    );
    let opcodes = srp_opcodes(&path);
    assert!(opcodes.iter().filter(|o| *o == "0x02").count() >= 2, "{opcodes:?}");
    std::fs::remove_file(&path).unwrap();
}
