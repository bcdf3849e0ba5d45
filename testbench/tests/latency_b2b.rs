//! What makes small messages fast, and the back-to-back preset fitted with it
//! (docs/timing.md, "The back-to-back preset"): inline data travels in the WQE, a direct
//! WQE comes with the doorbell so the NIC fetches nothing, and `hns-100g-b2b`'s one-way
//! SEND latency follows a public `ib_send_lat` measurement of two 100 Gb/s NICs cabled
//! back to back. All on virtual time, which is deterministic: these are not timed tests.

use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::timing::{Stage, TimingParams};
use rnic_testbench::bench::{run, BenchConfig, BenchReport, Operation};

/// perftest's inline threshold on hns-class NICs (`ib_send_lat`'s default).
const INLINE: u32 = 188;

fn latency(operation: Operation, size: usize, preset: &str) -> BenchConfig {
    let timing = TimingParams::preset(preset).unwrap();
    BenchConfig {
        operation,
        size,
        iterations: 20,
        latency_test: true,
        timing,
        preset: preset.into(),
        link_latency: Picoseconds(timing.propagation_ps),
        ..BenchConfig::default()
    }
}

fn fast(config: BenchConfig) -> BenchConfig {
    BenchConfig {
        inline_size: INLINE,
        direct_wqe: true,
        ..config
    }
}

fn ok(config: &BenchConfig) -> BenchReport {
    let (report, _) = run(config).expect("the run completes");
    assert_eq!(report.messages_failed, 0, "{:?}", report.failures);
    assert_eq!(report.messages_ok, config.iterations);
    report
}

#[test]
fn inline_data_and_direct_wqes_deliver_every_byte() {
    // 8 and 32 bytes sit in the WQE; 33..188 in the extended SGE ring; 1 KiB is not inline.
    for operation in [Operation::Write, Operation::Send] {
        for size in [1, 8, 32, 33, 100, 188, 1024] {
            for (inline_size, direct_wqe) in [(INLINE, false), (0, true), (INLINE, true)] {
                let config = BenchConfig {
                    verify: true,
                    inline_size,
                    direct_wqe,
                    ..latency(operation, size, "hns-100g")
                };
                let report = ok(&config);
                assert_eq!(
                    report.bytes_verified,
                    size as u64 * config.iterations,
                    "{operation:?} {size} B inline {inline_size} direct {direct_wqe}"
                );
            }
        }
    }
}

#[test]
fn a_window_of_posts_still_works_with_direct_wqe() {
    // Bandwidth tests post one WQE at a time too, so every post is direct; the device
    // must keep them in order with those it fetches.
    let config = BenchConfig {
        verify: true,
        latency_test: false,
        iterations: 200,
        ..fast(latency(Operation::Write, 64, "hns-100g"))
    };
    let report = ok(&config);
    assert_eq!(report.bytes_verified, 64 * 200);
}

#[test]
fn a_direct_wqe_is_not_fetched_and_inline_data_is_not_read() {
    let plain = ok(&latency(Operation::Write, 8, "hns-100g"));
    let direct = ok(&BenchConfig {
        direct_wqe: true,
        ..latency(Operation::Write, 8, "hns-100g")
    });
    let both = ok(&fast(latency(Operation::Write, 8, "hns-100g")));
    let n = plain.messages_ok;
    assert_eq!(plain.requester_stages.count(Stage::WqeFetch), n);
    assert_eq!(direct.requester_stages.count(Stage::WqeFetch), 0);
    assert_eq!(both.requester_stages.count(Stage::WqeFetch), 0);
    // Inline: the only payload read left is none at all.
    assert_eq!(direct.requester_stages.count(Stage::PayloadRead), n);
    assert_eq!(both.requester_stages.count(Stage::PayloadRead), 0);

    // The saving is the fetch, less the 64-byte write the doorbell now carries.
    let p = TimingParams::hns_100g();
    let fetch = p.wqe_fetch();
    let push = p.pcie_write_transfer(64);
    let per_message = |r: &BenchReport| r.requester_stages.total(Stage::Doorbell).0 / n;
    assert_eq!(per_message(&plain), p.doorbell_ps);
    assert_eq!(per_message(&direct), p.doorbell_ps + push.0);
    let p50 = |r: &BenchReport| (r.lat_us[1] * 1e6).round() as u64;
    assert_eq!(p50(&plain) - p50(&direct), fetch.0 - push.0);
}

#[test]
fn hns_100g_without_the_new_options_is_unchanged() {
    // docs/timing.md's recorded figure: 4.692 µs post → CQE for an 8-byte WRITE.
    let report = ok(&latency(Operation::Write, 8, "hns-100g"));
    assert_eq!((report.lat_us[1] * 1e6).round() as u64, 4_691_796);
    assert!(report.one_way_us.is_none());
}

/// The public `ib_send_lat` figures (RC, MTU 4096, inline below 188 B; t_typical, half a
/// ping-pong, µs) at each size.
const PUBLIC: [(usize, f64); 4] = [(32, 0.83), (1024, 1.58), (4096, 2.26), (32768, 4.56)];
/// How close the preset must stay to them.
const BAND: f64 = 0.05;

#[test]
fn the_back_to_back_preset_follows_the_public_ib_send_lat_curve() {
    let mut previous = 0.0;
    for (size, public) in PUBLIC {
        // One buffer, as perftest's tests use: after the first message its pages are in
        // the translation cache (a buffer per message would miss on every new page).
        let report = ok(&BenchConfig {
            single_buffer: true,
            verify: false,
            ..fast(latency(Operation::Send, size, "hns-100g-b2b"))
        });
        let one_way = report.one_way_us.expect("a SEND latency test reports one way")[1];
        assert!(one_way > previous, "{size} B: {one_way} µs after {previous} µs");
        previous = one_way;
        let ratio = one_way / public;
        assert!(
            (1.0 - BAND..=1.0 + BAND).contains(&ratio),
            "{size} B: {one_way:.3} µs one way, public {public} µs, ratio {ratio:.3}"
        );
    }
}
