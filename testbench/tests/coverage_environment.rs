//! `RNIC_COVERAGE=DIR`: the register harness and `rnic-bench` put the verification IP's
//! coverage collector on their devices and each test writes one coverage file; the run
//! itself is the same with or without it.

use rnic_testbench::bench::{run, BenchConfig, Operation};
use rnic_testbench::coverage::{file_for_this_test, ENVIRONMENT};
use rnic_testbench::harness::RegisterHarness;
use rnic_vip::coverage::Coverage;

#[test]
fn with_rnic_coverage_set_a_test_writes_one_file_of_what_its_devices_did_and_runs_the_same() {
    let config = BenchConfig {
        operation: Operation::Write,
        size: 3000,
        iterations: 20,
        mtu: 1024,
        ..BenchConfig::default()
    };
    let (without, _) = run(&config).expect("the run completes");

    let folder = std::env::temp_dir().join(format!("rnic-coverage-test-{}", std::process::id()));
    // This binary has this one test: no other thread reads the environment meanwhile.
    std::env::set_var(ENVIRONMENT, &folder);
    let (with, _) = run(&config).expect("the run completes");
    // A register-harness device of the same test adds into the same file.
    drop(RegisterHarness::new());
    std::env::remove_var(ENVIRONMENT);

    assert_eq!(
        (with.sim_time_ps, with.frames, with.lat_us, with.requester_stages),
        (
            without.sim_time_ps,
            without.frames,
            without.lat_us,
            without.requester_stages
        ),
        "observers watch: the run is the same"
    );
    let path = file_for_this_test(&folder);
    assert!(
        path.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("coverage_environment."),
        "{}",
        path.display()
    );
    let files: Vec<_> = std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files, std::slice::from_ref(&path), "one file for the test");
    let coverage = Coverage::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_dir_all(&folder).unwrap();
    assert_eq!(coverage.runs, 1);
    let bins = |group: &str| &coverage.groups[group].bins;
    // 20 messages of 3000 B at MTU 1024: FIRST, MIDDLE, LAST each, acknowledged.
    assert_eq!(bins("transmitted.opcode_size")["RC_RDMA_WRITE_FIRST/257-1024"], 20);
    assert_eq!(bins("received.opcode_size")["RC_RDMA_WRITE_LAST/257-1024"], 20);
    assert!(bins("received.aeth")["ACK"] > 0);
    assert_eq!(bins("completion.status")["Success"], 20, "the requester's CQEs");
    // Each NIC's QP came up RESET -> INIT -> RTR -> RTS.
    for transition in ["RESET->INIT", "INIT->RTR", "RTR->RTS"] {
        assert_eq!(bins("qp.transition")[transition], 2, "{transition}");
    }
}
