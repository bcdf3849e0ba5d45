//! A session set up through the RDMA CM on QP1 (REQ/REP/RTU on the wire, as with Linux)
//! decodes as NVMe-oF in tshark: the capture checker finds every RoCEv2 frame exact (its
//! ICRC, tshark's dissector, no malformed frame or error), and tshark's nvme-rdma dissector
//! names Connect, Property Get/Set, Identify, Read and Write and matches every command
//! with its completion.
//!
//! tshark decodes a command capsule only from an RC SEND ONLY (storage-and-cm.md §0.8),
//! so the target's in-capsule data is kept below a path MTU minus the SQE: 512-byte
//! writes ride in the capsule, larger ones go by keyed SGL. tshark is required
//! (`scripts/test` installs it); the test fails, it does not skip, when tshark is missing.

use std::process::Command;
use std::sync::Arc;

use rnic_pcap_check::{check_file, CheckOptions};
use rnic_storage::block::{BlockDevice, RamBackend};
use rnic_storage::nvmeof::embedded::{CmKind, EmbeddedSession, EmbeddedSetup, TARGET_ADDRESS};
use rnic_storage::nvmeof::host::HostConfig;
use rnic_storage::nvmeof::target::{AllowedHosts, Subsystem, TargetConfig};
use rnic_storage::rdma::Reactor;

const SUBNQN: &str = "nqn.2024-01.io.rnic-emu:capture";

#[test]
fn a_session_through_the_rdma_cm_decodes_as_nvme_of() {
    let mut subsystem = Subsystem::nvm(SUBNQN, AllowedHosts::Any);
    let device: Arc<dyn BlockDevice> = Arc::new(RamBackend::new(512, 4096).unwrap());
    subsystem.add_namespace(1, device);
    let mut session = EmbeddedSession::new(
        EmbeddedSetup {
            capture: true,
            cm: CmKind::Rdma { seed: 0x4420 },
            target: TargetConfig {
                listen: TARGET_ADDRESS,
                in_capsule_data_size: 1024,
                ..TargetConfig::default()
            },
            ..EmbeddedSetup::default()
        },
        vec![subsystem],
    )
    .unwrap();
    let mut host = session
        .connect(HostConfig {
            subsystem_nqn: SUBNQN.into(),
            io_queues: 1,
            async_events: false,
            kato_ms: 0,
            ..HostConfig::default()
        })
        .unwrap();
    host.identify_controller().unwrap();
    host.write(1, 0, &[0x5A; 512]).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
    host.write(1, 8, &data).unwrap();
    let mut back = vec![0u8; 8192];
    host.read(1, 8, &mut back).unwrap();
    assert_eq!(back, data);
    host.disconnect().unwrap();
    let mut reactor = session.reactor();
    for _ in 0..2000 {
        reactor.idle(false);
    }
    drop(reactor);
    assert_eq!(session.target().controller_count(), 0);

    let path = std::env::temp_dir().join(format!("rnic-nvmf-capture-{}.pcap", std::process::id()));
    rnic_testbench::pcap::write_pcap(&path, &session.take_capture()).unwrap();
    let report = check_file(&path, &CheckOptions::default()).unwrap();
    assert!(report.problems.is_empty(), "{report:?}");

    // Two passes: a command learns the frame of its completion in the second.
    let output = Command::new("tshark")
        .arg("-2")
        .arg("-r")
        .arg(&path)
        .args([
            "-o",
            "nvme-rdma.subsystem_ports:4420",
            "-T",
            "fields",
            "-E",
            "separator=|",
        ])
        .args([
            "-e",
            "frame.number",
            "-e",
            "infiniband.mad.attributeid",
            "-e",
            "nvme.cmd.opc",
        ])
        .args([
            "-e",
            "nvme.fabrics.cmd.fctype",
            "-e",
            "nvme.cqe_pkt",
            "-e",
            "nvme.fabrics.cqe_pkt",
        ])
        .args([
            "-e",
            "nvme.cqe.cid",
            "-e",
            "nvme-rdma.unknown_data",
            "-e",
            "nvme-rdma.cm.rsp.crqsize",
        ])
        .output()
        .expect("tshark (scripts/test installs it)");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let _ = std::fs::remove_file(&path);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    fn column<'a>(row: &[&'a str], i: usize) -> &'a str {
        row.get(i).copied().unwrap_or("")
    }
    let replies = rows.iter().filter(|r| !column(r, 8).is_empty()).count();
    assert_eq!(replies, 2, "a REP with CRQSIZE per queue:\n{text}");
    assert!(
        rows.iter().all(|r| column(r, 7).is_empty()),
        "undissected NVMe-oF data:\n{text}"
    );
    let commands: Vec<&Vec<&str>> = rows
        .iter()
        .filter(|r| !column(r, 2).is_empty() || !column(r, 3).is_empty())
        .collect();
    let fabrics = |fctype: &str| commands.iter().filter(|r| column(r, 3) == fctype).count();
    let opcode = |opc: &str| {
        commands
            .iter()
            .filter(|r| column(r, 2) == opc && column(r, 3).is_empty())
            .count()
    };
    assert_eq!(fabrics("0x01"), 2, "Connect on the admin and the I/O queue:\n{text}");
    assert!(fabrics("0x04") >= 3, "Property Get CAP, VS, CSTS:\n{text}");
    assert!(fabrics("0x00") >= 2, "Property Set CC (enable, shutdown):\n{text}");
    assert!(
        opcode("0x06") >= 3,
        "Identify controller, namespace list, namespace:\n{text}"
    );
    assert_eq!(opcode("0x01"), 2, "two Writes:\n{text}");
    assert_eq!(opcode("0x02"), 1, "one Read:\n{text}");
    for command in &commands {
        assert!(
            !column(command, 4).is_empty() || !column(command, 5).is_empty(),
            "frame {} has no matched completion:\n{text}",
            column(command, 0)
        );
    }
}
