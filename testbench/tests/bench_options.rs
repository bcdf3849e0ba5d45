//! The perftest-shaped options of `rnic-bench`: `--tx-depth`, `--cq-mod` and
//! `--single-buffer` change how the driver posts and polls, never what the NICs deliver.

use rnic_testbench::bench::{run, BenchConfig, BenchError, BenchReport, Operation};

fn write(size: usize, iterations: u64) -> BenchConfig {
    BenchConfig {
        operation: Operation::Write,
        size,
        iterations,
        ..BenchConfig::default()
    }
}

fn ok(config: &BenchConfig) -> BenchReport {
    let (report, _) = run(config).expect("the run completes");
    assert_eq!(report.messages_failed, 0, "{:?}", report.failures);
    assert_eq!(report.messages_ok, config.iterations * config.queue_pairs as u64);
    report
}

fn config_error(config: &BenchConfig) -> String {
    match run(config) {
        Err(BenchError::Config(why)) => why,
        other => panic!("expected a configuration error, got {:?}", other.map(|(r, _)| r)),
    }
}

#[test]
fn cq_moderation_asks_for_one_completion_in_n_and_the_last_and_still_checks_every_message() {
    // 10 messages, one completion in 4: messages 3, 7 and the last (9) are signalled.
    let report = ok(&BenchConfig {
        cq_moderation: 4,
        verify: true,
        ..write(3000, 10)
    });
    assert_eq!(report.bytes_verified, 10 * 3000);
    assert_eq!(report.cqes_written, 3);

    let every = ok(&BenchConfig {
        verify: true,
        ..write(3000, 10)
    });
    assert_eq!(every.cqes_written, 10);
}

#[test]
fn cq_moderation_works_for_every_operation_and_several_queue_pairs() {
    for operation in [Operation::Write, Operation::Read, Operation::Send, Operation::Atomic] {
        ok(&BenchConfig {
            operation,
            cq_moderation: 8,
            queue_pairs: 3,
            verify: true,
            ..write(512, 37)
        });
    }
}

#[test]
fn a_deeper_tx_depth_keeps_more_messages_outstanding() {
    // With a window of 16 a pair can never have more than 16 messages in flight; with 64
    // the same run finishes sooner in virtual time because the link never idles.
    let shallow = ok(&write(1024, 400));
    let deep = ok(&BenchConfig {
        tx_depth: 64,
        ..write(1024, 400)
    });
    assert!(
        deep.sim_time_ps <= shallow.sim_time_ps,
        "deep {} ps, shallow {} ps",
        deep.sim_time_ps,
        shallow.sim_time_ps
    );
}

#[test]
fn a_single_buffer_moves_every_message_through_the_same_bytes() {
    for operation in [Operation::Write, Operation::Read, Operation::Send] {
        let report = ok(&BenchConfig {
            operation,
            single_buffer: true,
            verify: false,
            tx_depth: 32,
            cq_moderation: 16,
            ..write(64 << 10, 100)
        });
        assert_eq!(report.bytes_verified, 0);
    }
}

#[test]
fn impossible_combinations_are_refused_with_the_reason() {
    let why = config_error(&BenchConfig {
        cq_moderation: 17,
        ..write(64, 10)
    });
    assert!(why.contains("cq-mod 17"), "{why}");
    let why = config_error(&BenchConfig {
        cq_moderation: 0,
        ..write(64, 10)
    });
    assert!(why.contains("cq-mod 0"), "{why}");
    let why = config_error(&BenchConfig {
        tx_depth: 0,
        ..write(64, 10)
    });
    assert!(why.contains("tx-depth 0"), "{why}");
    let why = config_error(&BenchConfig {
        single_buffer: true,
        verify: true,
        ..write(64, 10)
    });
    assert!(why.contains("cannot be verified"), "{why}");
    // A latency test keeps one message outstanding: one completion in 2 would never come.
    let why = config_error(&BenchConfig {
        latency_test: true,
        cq_moderation: 2,
        ..write(64, 10)
    });
    assert!(why.contains("cq-mod 2"), "{why}");
}

#[test]
fn progress_reports_climb_to_the_expected_count_and_change_nothing() {
    let config = BenchConfig {
        verify: false,
        ..write(8, 20_000)
    };
    let mut seen = Vec::new();
    let (watched, _) = rnic_testbench::bench::run_with_progress(&config, &mut |p| seen.push(p)).expect("run");
    assert!(seen.len() >= 2, "{} progress reports", seen.len());
    for pair in seen.windows(2) {
        assert!(pair[0].done <= pair[1].done && pair[0].sim_time <= pair[1].sim_time);
    }
    assert!(seen.iter().all(|p| p.expected == 20_000 && p.done <= p.expected));
    assert!(seen.last().unwrap().done > 0);
    let unwatched = ok(&config);
    let strip = |json: String| json.split(",\"wall_time_s\"").next().unwrap().to_string();
    assert_eq!(strip(watched.to_json()), strip(unwatched.to_json()));
}

#[test]
fn a_send_counts_when_its_receive_completes_so_no_send_is_left_out_of_the_goodput() {
    // Eight 4 MiB SENDs: the run ends at the last receive completion, before the ACK of
    // the last SEND reaches the requester. Goodput and message rate still count all eight.
    for operation in [Operation::Send, Operation::Write] {
        let report = ok(&BenchConfig {
            operation,
            verify: false,
            ..write(4 << 20, 8)
        });
        let seconds = report.sim_time_ps as f64 * 1e-12;
        let messages = report.msg_rate_mpps * 1e6 * seconds;
        assert!(
            (messages - 8.0).abs() < 1e-3,
            "{operation:?}: {messages} messages counted"
        );
        let bytes = report.bw_gbps * 1e9 * seconds / 8.0;
        assert!(
            (bytes / (8.0 * (4 << 20) as f64) - 1.0).abs() < 1e-5,
            "{operation:?}: {bytes} bytes counted"
        );
    }
}

#[test]
fn wall_mode_reports_the_same_runs_memcpy_beside_its_goodput() {
    use rnic_testbench::bench::Mode;
    let wall = ok(&BenchConfig {
        mode: Mode::Wall,
        verify: false,
        ..write(64 << 10, 20)
    });
    let memcpy = wall.memcpy_gbps.expect("wall mode measures memcpy");
    assert!(memcpy > 0.0);
    assert_eq!(wall.memcpy_ratio(), Some(wall.bw_gbps / memcpy));
    let json = wall.to_json();
    assert!(json.contains(&format!(",\"memcpy_gbps\":{memcpy:.6},")), "{json}");
    assert!(
        json.contains(&format!(",\"memcpy_ratio\":{:.6},", wall.bw_gbps / memcpy)),
        "{json}"
    );
    let header = wall.table_header();
    let row = wall.table_row();
    assert!(
        header.lines().last().unwrap().contains("memcpy[Gb/sec]  BW/memcpy"),
        "{header}"
    );
    assert!(row.contains(&format!(" {:.4} ", wall.bw_gbps / memcpy)), "{row}");

    // Virtual mode has no wall-clock yardstick: its JSON and table are as before.
    let virtual_run = ok(&write(64 << 10, 20));
    assert_eq!(virtual_run.memcpy_gbps, None);
    assert_eq!(virtual_run.frame_floor_mpps, None);
    assert!(virtual_run.to_json().ends_with(",\"messages_expected\":20}"));
    assert!(!virtual_run.table_header().contains("memcpy"));
    assert!(!virtual_run.table_header().contains("floor"));
}

#[test]
fn wall_mode_reports_the_same_runs_frame_floor_beside_its_message_rate() {
    use rnic_testbench::bench::Mode;
    for operation in [Operation::Write, Operation::Read, Operation::Send] {
        let wall = ok(&BenchConfig {
            mode: Mode::Wall,
            verify: false,
            operation,
            ..write(8, 50)
        });
        let floor = wall.frame_floor_mpps.expect("wall mode measures the frame floor");
        assert!(floor.is_finite() && floor > 0.0, "{operation:?}: {floor}");
        assert_eq!(wall.floor_ratio(), Some(wall.msg_rate_mpps / floor));
        // The floor and its ratio end the JSON object and the table's row.
        let json = wall.to_json();
        assert!(
            json.ends_with(&format!(
                ",\"frame_floor_mpps\":{floor:.6},\"floor_ratio\":{:.6}}}",
                wall.msg_rate_mpps / floor
            )),
            "{json}"
        );
        assert!(
            wall.table_header()
                .lines()
                .last()
                .unwrap()
                .ends_with("floor[Mmsg/s]  Rate/floor"),
            "{}",
            wall.table_header()
        );
        assert!(
            wall.table_row()
                .trim_end()
                .ends_with(&format!("{:.4}", wall.msg_rate_mpps / floor)),
            "{}",
            wall.table_row()
        );
    }
    // Atomics are not one operation's data frames: no floor, memcpy still there.
    let atomic = ok(&BenchConfig {
        mode: Mode::Wall,
        verify: false,
        operation: Operation::Atomic,
        ..write(8, 20)
    });
    assert_eq!(atomic.frame_floor_mpps, None);
    assert!(atomic.memcpy_gbps.is_some());
    assert!(atomic
        .to_json()
        .ends_with(&format!(",\"memcpy_ratio\":{:.6}}}", atomic.memcpy_ratio().unwrap())));
    assert!(!atomic.table_header().contains("floor"));
}

#[test]
fn a_short_send_run_whose_send_completions_carry_no_latency_sample_still_reports() {
    // Eight 3000-byte SENDs at MTU 1024: the rates come from the receive completions, and
    // the run used to panic summarising latencies it had no sample of.
    let config = BenchConfig {
        operation: Operation::Send,
        size: 3000,
        iterations: 8,
        mtu: 1024,
        ..BenchConfig::default()
    };
    let report = ok(&config);
    assert!(report.msg_rate_mpps > 0.0);
}
