//! Measures what doorbell polling costs (CPU while idle and while spinning) and what it
//! buys (doorbell latency through the mapped page vs a trapped REGION_WRITE). A benchmark,
//! not a test: the numbers in docs/guides/emulator.md come from
//!
//! ```text
//! cargo bench -p rnic-emu --bench doorbell_cost
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use rnic_emu::vfio_user::doorbell::DoorbellPages;
use rnic_emu::vfio_user::Polling;
use rnic_firmware_if::doorbell::{Doorbell, DB_OFFSET};

/// CPU time of this process (all threads), from the scheduler's nanosecond accounting.
fn process_cpu() -> Duration {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path().join("schedstat");
        if let Ok(text) = std::fs::read_to_string(path) {
            total += text
                .split_whitespace()
                .next()
                .unwrap_or("0")
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(total)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{label}: n={} p50={:?} p90={:?} p99={:?} max={:?}",
        samples.len(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
        samples[samples.len() - 1]
    );
}

fn one_poll_pass_over_64_idle_pages() {
    let pages = DoorbellPages::new(64).unwrap();
    let passes = 1_000_000;
    let start = Instant::now();
    let mut taken = 0;
    for _ in 0..passes {
        taken += pages.poll(|_, _| {});
    }
    let elapsed = start.elapsed();
    assert_eq!(taken, 0);
    println!("poll pass, 64 idle pages: {:?} per pass", elapsed / passes);
}

fn idle_cpu_cost_without_a_client() {
    let server = start_server("cost-unattached");
    std::thread::sleep(Duration::from_millis(200));
    let window = Duration::from_secs(2);
    let cpu0 = process_cpu();
    std::thread::sleep(window);
    let cpu = process_cpu() - cpu0;
    println!(
        "no client attached: CPU {:.3} % of one core",
        cpu.as_secs_f64() / window.as_secs_f64() * 100.0
    );
    drop(server);
}

fn idle_cpu_cost_per_max_sleep() {
    for max_sleep_us in [1000u64, 200, 50] {
        let server = start_server_with("cost-idle", |o| {
            o.polling = Polling {
                spin: Duration::from_micros(100),
                max_sleep: Duration::from_micros(max_sleep_us),
            }
        });
        let handle = server.handle();
        let client = TestClient::attach(handle.socket());
        std::thread::sleep(Duration::from_millis(200));
        let window = Duration::from_secs(2);
        let (cpu0, passes0) = (process_cpu(), handle.stats().poll_passes);
        std::thread::sleep(window);
        let (cpu1, passes1) = (process_cpu(), handle.stats().poll_passes);
        let cpu = cpu1 - cpu0;
        println!(
            "idle, max_sleep {max_sleep_us} µs: {:.0} wake-ups/s, CPU {:.2} % of one core ({:?} per wake-up)",
            (passes1 - passes0) as f64 / window.as_secs_f64(),
            cpu.as_secs_f64() / window.as_secs_f64() * 100.0,
            cpu / (passes1 - passes0).max(1) as u32
        );
        drop(client);
    }
}

fn doorbell_latency_mapped_vs_trapped() {
    let server = start_server("cost-latency");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    client.enable_device();
    let (_, fds) = client.region_info(2, 256).unwrap();
    let pages = map_doorbells(&fds[0], 64 * 4096);
    let slot = DB_OFFSET as usize;
    let ring = |n: u16| {
        let start = Instant::now();
        assert!(pages.store_u64(slot, Doorbell::sq(0x10, n, 0).as_u64()));
        while pages.load_u64(slot) != Some(0) {
            std::hint::spin_loop();
        }
        start.elapsed()
    };

    // Back to back: the server is spinning.
    let busy: Vec<Duration> = (0..20_000u32).map(|n| ring(n as u16)).collect();
    summary("mapped doorbell, server spinning (store → taken)", busy);

    // After an idle gap longer than the spin window: the server is asleep in back-off.
    let idle: Vec<Duration> = (0..200u32)
        .map(|n| {
            std::thread::sleep(Duration::from_millis(5));
            ring(n as u16)
        })
        .collect();
    summary("mapped doorbell after 5 ms idle (default max_sleep 1 ms)", idle);

    // The same doorbell as a trapped REGION_WRITE round trip.
    let trapped: Vec<Duration> = (0..20_000u32)
        .map(|n| {
            let start = Instant::now();
            client
                .region_write(2, DB_OFFSET, &Doorbell::sq(0x10, n as u16, 0).as_u64().to_le_bytes())
                .unwrap();
            start.elapsed()
        })
        .collect();
    summary("trapped REGION_WRITE doorbell (round trip)", trapped);

    // CPU while a client rings continuously: one core, by design.
    let cpu0 = process_cpu();
    let start = Instant::now();
    let mut n = 0u16;
    while start.elapsed() < Duration::from_secs(1) {
        n = n.wrapping_add(1);
        ring(n);
    }
    let cpu = process_cpu() - cpu0;
    println!(
        "continuous ringing: CPU {:.0} % of one core (client and server together)",
        cpu.as_secs_f64() / start.elapsed().as_secs_f64() * 100.0
    );
}

fn main() {
    one_poll_pass_over_64_idle_pages();
    idle_cpu_cost_without_a_client();
    idle_cpu_cost_per_max_sleep();
    doorbell_latency_mapped_vs_trapped();
}
