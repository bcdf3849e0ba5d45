//! The checker against frames whose verdicts are known (roce-wire §3.3: hand-built frames,
//! three with a bad ICRC; a real rdma_rxe capture), with tshark. These run on every clone:
//! tshark is required (scripts/test installs it), and the second opinion runs too where
//! `shared/oracles` is beside the repository.

use std::path::{Path, PathBuf};

use rnic_pcap_check::capture::read_capture;
use rnic_pcap_check::{check_file, find_shared_oracle, CheckOptions, Report, SharedOracle};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../hw-model/src/wire/testdata")
        .join(name)
}

/// A classic Ethernet pcap of `frames`, in a temporary file named after `name`.
fn write_pcap(name: &str, frames: &[Vec<u8>]) -> PathBuf {
    let mut file = 0xa1b2_c3d4u32.to_le_bytes().to_vec();
    file.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 0, 0, 0]);
    for frame in frames {
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        file.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        file.extend_from_slice(frame);
    }
    let path = std::env::temp_dir().join(format!("rnic-pcap-check-{name}-{}.pcap", std::process::id()));
    std::fs::write(&path, file).unwrap();
    path
}

fn reference_frames() -> Vec<Vec<u8>> {
    let bytes = std::fs::read(testdata("roce-test-frames.pcap")).unwrap();
    read_capture(&bytes).unwrap().into_iter().map(|p| p.bytes).collect()
}

fn frames_with_problems(report: &Report) -> Vec<u64> {
    let mut frames: Vec<u64> = report.problems.iter().filter_map(|p| p.frame).collect();
    frames.dedup();
    frames
}

#[test]
fn the_hand_built_frames_fail_exactly_where_their_icrc_is_bad() {
    let report = check_file(&testdata("roce-test-frames.pcap"), &CheckOptions::default()).unwrap();
    assert_eq!(report.roce_frames, 9);
    assert!(!report.passed(), "{report}");
    // 2: a flipped ICRC bit; 6: the same over IPv6 (its UDP checksum then fails too); 9: the
    // ICRC written big-endian. Frame 3 (a SEND whose payload tshark's RPC-over-RDMA heuristic
    // would call malformed) and 8 (FECN set after the ICRC) pass.
    assert_eq!(frames_with_problems(&report), [2, 6, 9], "{report}");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.frame == Some(6) && p.what.contains("tshark")),
        "{report}"
    );
    if let Some(shared) = &report.shared {
        assert!(!shared.passed, "the second opinion disagrees: {}", shared.output);
    }
}

#[test]
fn the_good_frames_pass() {
    let good: Vec<Vec<u8>> = reference_frames()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| ![1, 5, 8].contains(i))
        .map(|(_, f)| f)
        .collect();
    let path = write_pcap("good", &good);
    let report = check_file(&path, &CheckOptions::default()).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!((report.roce_frames, report.ipv6_frames), (6, 1));
    assert!(
        report.to_string().ends_with("6 RoCEv2 frames, all ICRC good"),
        "{report}"
    );
}

#[test]
fn rdma_rxes_own_capture_passes() {
    let report = check_file(&testdata("rxe-cm-connect-request.pcapng"), &CheckOptions::default()).unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(report.roce_frames, 7);
    assert_eq!(report.frames, 33, "ARP and ICMP around them, read but not RoCEv2");
}

#[test]
fn a_capture_without_roce_checks_nothing_and_fails() {
    let arp_only = vec![{
        let mut frame = vec![0xff; 6];
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        frame.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        frame.resize(60, 0);
        frame
    }];
    let path = write_pcap("empty", &arp_only);
    let report = check_file(&path, &CheckOptions::default()).unwrap();
    assert!(!report.passed(), "{report}");
    assert!(report.problems[0].what.contains("nothing was checked"), "{report}");
    let allowed = check_file(
        &path,
        &CheckOptions {
            allow_empty: true,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(allowed.passed(), "{allowed}");
}

#[test]
fn a_zero_udp_checksum_over_ipv6_passes_only_when_allowed() {
    // Frame 5: IPv6 RC WRITE ONLY with a valid UDP checksum; zero it, as rxe sends.
    let mut frame = reference_frames()[4].clone();
    frame[14 + 40 + 6] = 0;
    frame[14 + 40 + 7] = 0;
    let path = write_pcap("zero-checksum", &[frame]);
    let strict = check_file(&path, &CheckOptions::default()).unwrap();
    assert!(!strict.passed(), "{strict}");
    assert!(strict.problems.iter().all(|p| p.what.contains("tshark")), "{strict}");
    let allowed = check_file(
        &path,
        &CheckOptions {
            allow_zero_udp_checksum: true,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(allowed.passed(), "{allowed}");
}

#[test]
fn a_cut_or_lying_roce_frame_fails() {
    let mut cut = reference_frames()[0].clone();
    cut.truncate(cut.len() - 3);
    let path = write_pcap("cut", &[cut]);
    let report = check_file(
        &path,
        &CheckOptions {
            shared_oracle: SharedOracle::Off,
            ..CheckOptions::default()
        },
    )
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!report.passed(), "{report}");
    assert!(report.shared.is_none());
}

#[test]
fn the_second_opinion_runs_where_it_exists() {
    // On CI shared/oracles is beside the repository; on a user's clone it is not, and then
    // the checker's own checks are the whole verdict (the tests above).
    let Some(script) = find_shared_oracle().unwrap() else {
        eprintln!("no shared/oracles beside the repository: only the project's checks ran");
        return;
    };
    let report = check_file(&testdata("rxe-cm-connect-request.pcapng"), &CheckOptions::default()).unwrap();
    let shared = report.shared.as_ref().expect("the second opinion ran");
    assert_eq!(shared.script, script);
    assert!(shared.passed, "{}", shared.output);
}

#[test]
fn lua_scripts_are_loaded_and_their_errors_count() {
    // A post-dissector that flags every frame, as a dissector for a protocol tshark lacks
    // would flag a malformed field.
    let script = std::env::temp_dir().join(format!("rnic-pcap-check-flag-{}.lua", std::process::id()));
    std::fs::write(
        &script,
        r#"local p = Proto("rnic_test_flag", "rnic-pcap-check test flag")
local flagged = ProtoExpert.new("rnic_test_flag.flagged", "flagged by the test script",
    expert.group.PROTOCOL, expert.severity.ERROR)
p.experts = { flagged }
function p.dissector(tvb, pinfo, tree)
    tree:add(p, tvb(0, 1)):add_proto_expert_info(flagged)
end
register_postdissector(p)
"#,
    )
    .unwrap();
    let mut options = CheckOptions::default();
    options.tshark.lua_scripts.push(script.clone());
    let report = check_file(&testdata("rxe-cm-connect-request.pcapng"), &options).unwrap();
    std::fs::remove_file(&script).unwrap();
    assert!(!report.passed(), "{report}");
    assert_eq!(report.problems.len(), 33, "one per frame: {report}");
    assert!(
        report.problems[0].what.contains("flagged by the test script"),
        "{report}"
    );
}
