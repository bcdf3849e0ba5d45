//! Unmodified rdmacm-utils, perftest `-R` and fio's rdma engine on our librdmacm.so.1:
//! the connection manager of our libibverbs connects two processes on `udp:` loopback
//! addresses. Each test has its own addresses and ports; every program is bounded in time.

mod common;

use common::{command, require, Pair, Running};
use std::time::Duration;

/// Starts the server, then the client; `SRV` in the arguments is the server's address.
fn run(program: &str, server: &[&str], client: &[&str], pair: u8) -> Pair {
    let _turn = common::take_turn();
    let server_ip = format!("127.0.4.{}", 2 * pair + 1);
    let client_ip = format!("127.0.4.{}", 2 * pair + 2);
    let fill = |args: &[&str]| -> Vec<String> { args.iter().map(|a| a.replace("SRV", &server_ip)).collect() };
    let (server_args, client_args) = (fill(server), fill(client));
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let client_args: Vec<&str> = client_args.iter().map(String::as_str).collect();
    let server = spawn_group_logging_listen(program, &server_args, &server_ip);
    // A client whose REQ comes before the server listens is rejected, and the programs
    // do not retry: start it once the server's connection manager says it listens (a
    // loaded host can take seconds to bring the server's device up). A server that never
    // listens is the test's failure to report, after the client has tried.
    server.wait_for_stderr(LISTENING, Duration::from_secs(30));
    let client = spawn_group(program, &client_args, &client_ip);
    let client_pid = client.id();
    let client = client.wait(Duration::from_secs(90));
    kill_group(client_pid);
    let server_pid = server.id();
    let server = server.wait(Duration::from_secs(15));
    kill_group(server_pid);
    Pair { server, client }
}

/// In a process group of its own, so that forked workers (fio's) go with it.
fn spawn_group(program: &str, args: &[&str], ip: &str) -> Running {
    use std::os::unix::process::CommandExt;
    Running::new(
        command(program, args, &format!("udp:{ip}"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}")),
    )
}

/// What our librdmacm logs (target `rnic::cm::listen`) when an id starts listening.
const LISTENING: &str = "rnic::cm::listen";

/// [`spawn_group`] with the connection manager's listen line on stderr.
fn spawn_group_logging_listen(program: &str, args: &[&str], ip: &str) -> Running {
    use std::os::unix::process::CommandExt;
    Running::new(
        command(program, args, &format!("udp:{ip}"))
            .env("RNIC_LOG", "warn,rnic::cm::listen=info")
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}")),
    )
}

fn kill_group(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", "--", &format!("-{pid}")])
        .stderr(std::process::Stdio::null())
        .status();
}

#[test]
fn rping_exchanges_and_verifies_1000_pings() {
    if !require("rping") {
        return;
    }
    let result = run(
        "rping",
        &["-s", "-a", "SRV", "-v", "-C", "1000", "-p", "19500"],
        &["-c", "-a", "SRV", "-v", "-C", "1000", "-p", "19500"],
        1,
    );
    result.assert_success("rping");
    let client = result.client_stdout();
    // rping -v prints every ping it verified; the last one is number 999.
    assert!(client.contains("ping data: rdma-ping-999: "), "{client}");
    assert_eq!(client.matches("ping data: rdma-ping-").count(), 1000, "{client}");
    // rping's server destroys its connection's id before the id's QP (rdma_destroy_id,
    // then ibv_destroy_qp), which librdmacm allows: the QP outlives the id, and no call
    // of the teardown is refused or touches what an earlier one freed.
    let server_log = String::from_utf8_lossy(&result.server.stderr);
    for verb in ["rdma_destroy", "ibv_destroy", "ibv_dealloc", "ibv_dereg"] {
        assert!(!server_log.contains(verb), "{server_log}");
    }
}

#[test]
fn ucmatose_connects_and_transfers() {
    if !require("ucmatose") {
        return;
    }
    let result = run(
        "ucmatose",
        &["-b", "SRV", "-p", "19501"],
        &["-s", "SRV", "-p", "19501"],
        2,
    );
    result.assert_success("ucmatose");
    for side in [result.client_stdout(), result.server_stdout()] {
        assert!(
            side.contains("test complete") && side.contains("return status 0"),
            "{side}"
        );
    }
}

#[test]
fn udaddy_resolves_the_peer_with_sidr_and_sends_datagrams() {
    if !require("udaddy") {
        return;
    }
    // udaddy's -p is the port space; it uses its default port.
    let result = run("udaddy", &["-b", "SRV"], &["-s", "SRV"], 3);
    result.assert_success("udaddy");
    for side in [result.client_stdout(), result.server_stdout()] {
        assert!(
            side.contains("test complete") && side.contains("return status 0"),
            "{side}"
        );
    }
}

#[test]
fn rdma_server_and_rdma_client_use_the_synchronous_endpoint_api() {
    if !require("rdma_server") || !require("rdma_client") {
        return;
    }
    let _turn = common::take_turn();
    let server = spawn_group_logging_listen("rdma_server", &["-s", "127.0.4.9", "-p", "19503"], "127.0.4.9");
    server.wait_for_stderr(LISTENING, Duration::from_secs(30));
    let client = spawn_group("rdma_client", &["-s", "127.0.4.9", "-p", "19503"], "127.0.4.10");
    let client = client.wait(Duration::from_secs(60));
    let server = server.wait(Duration::from_secs(15));
    let result = Pair { server, client };
    result.assert_success("rdma_server/rdma_client");
    assert!(
        result.client_stdout().contains("rdma_client: end 0"),
        "{}",
        result.client_stdout()
    );
    assert!(
        result.server_stdout().contains("rdma_server: end 0"),
        "{}",
        result.server_stdout()
    );
}

/// qperf's server never destroys its connection's id, only the listener and the event
/// channel, then exits; its client waits for DISCONNECTED after its `rdma_disconnect`.
/// Linux destroys the ids left on a closed channel (the DREP goes out), and so do we.
///
/// Debian's qperf 0.4.11 has a race of its own: its server sends the client the port
/// before it calls `rdma_listen` (fixed upstream after that release, linux-rdma/qperf
/// 118a571 "Fix rdmacm race"), so now and then the client's REQ comes first and is
/// rejected — invalid Service ID, as Linux's CM answers a REQ nobody listens for. A run
/// that failed exactly so (our server's log shows the REJ for the port before the line
/// saying it listens on it) is run again; any other failure fails the test.
#[test]
fn qperf_cm_runs_its_rc_tests_one_connection_after_another() {
    if !require("qperf") {
        return;
    }
    let _turn = common::take_turn();
    let tests = ["rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_bw"];
    let mut raced = Vec::new();
    let (client, stdout, report) = loop {
        let (client, server) = run_qperf(&tests);
        let stdout = String::from_utf8_lossy(&client.stdout).into_owned();
        let server_log = strip_ansi(&String::from_utf8_lossy(&server.stderr));
        let report = format!(
            "qperf -cm1 ({}; earlier runs lost qperf's own race on ports {raced:?})\n--- client stdout\n{stdout}\n\
             --- client stderr\n{}\n--- server stderr\n{server_log}",
            client.status,
            String::from_utf8_lossy(&client.stderr),
        );
        match rejected_before_listening(&server_log) {
            Some(port) if !client.status.success() && raced.len() < 3 => {
                eprintln!("qperf's server sent port {port} before it listened (its own race): running it again");
                raced.push(port);
            }
            _ => break (client, stdout, report),
        }
    };
    assert!(client.status.success(), "{report}");
    for test in tests {
        assert!(stdout.contains(&format!("{test}:")), "{test} missing: {report}");
    }
    // Three bandwidths and one latency, each a positive figure.
    let figures: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split_once('=').map(|(_, v)| v.trim()))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(figures.len() == 4 && figures.iter().all(|f| *f > 0.0), "{report}");
}

/// One qperf server and one client running `tests` over the connection manager; the
/// server logs when it listens.
fn run_qperf(tests: &[&str]) -> (std::process::Output, std::process::Output) {
    let (server_ip, client_ip, port) = ("127.0.4.31", "127.0.4.32", "19530");
    // The server forks a worker per test and listens for ever: it is stopped below.
    let server = spawn_group_logging_listen("qperf", &["--listen_port", port], server_ip);
    common::wait_for_listener(port.parse().expect("port"), Duration::from_secs(30));
    let mut args = vec![
        "--listen_port",
        port,
        "--time",
        "1",
        "--timeout",
        "30",
        "-cm1",
        server_ip,
    ];
    args.extend(tests);
    let client = spawn_group("qperf", &args, client_ip);
    let client = client.wait(Duration::from_secs(120));
    if !client.status.success() {
        // A worker whose REQ came too early goes on to listen: let it say so before it is
        // stopped.
        if let Some((port, _)) = rejected_port(&strip_ansi(&server.stderr_so_far())) {
            server.wait_for_stderr(&format!("0.0.0.0:{port})"), Duration::from_secs(5));
        }
    }
    let server_pid = server.id();
    kill_group(server_pid);
    (client, server.wait(Duration::from_secs(10)))
}

/// The port of the first REQ our connection manager rejected because nothing listened
/// on it, and where that line ends in `server_log`.
fn rejected_port(server_log: &str) -> Option<(u16, usize)> {
    let at = server_log.find("REQ for a port nobody listens on")?;
    let line = server_log[at..].lines().next()?;
    let port = line
        .split_once("port=")?
        .1
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((port, at + line.len()))
}

/// The port of a REQ our connection manager rejected because nothing listened on it yet,
/// when the same log later says an id listens on that port: qperf's race, not ours.
fn rejected_before_listening(server_log: &str) -> Option<u16> {
    let (port, end) = rejected_port(server_log)?;
    let listening = format!("{LISTENING}: listening source=Some(0.0.0.0:{port})");
    let (before, after) = server_log.split_at(end);
    (!before.contains(&listening) && after.contains(&listening)).then_some(port)
}

/// `text` without ANSI colour sequences (`ESC [ … m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn the_qperf_race_is_told_from_other_rejections() {
    let raced = " WARN rnic::diag: REQ for a port nobody listens on: REJ invalid Service ID count=1 port=33361 from=127.0.4.32\n \
                 INFO rnic::cm::listen: listening source=Some(0.0.0.0:33361)\n";
    assert_eq!(rejected_before_listening(raced), Some(33361));
    // Nobody listened at all, or the listener was there before: a real rejection.
    let never =
        " WARN rnic::diag: REQ for a port nobody listens on: REJ invalid Service ID count=1 port=33361 from=x\n";
    assert_eq!(rejected_before_listening(never), None);
    let earlier = format!(" INFO rnic::cm::listen: listening source=Some(0.0.0.0:33361)\n{raced}");
    assert_eq!(rejected_before_listening(&earlier), None);
    assert_eq!(strip_ansi("\u{1b}[2mport\u{1b}[0m=1"), "port=1");
}

/// Builds `tests/c/SOURCE` against the installed rdma-core headers and libraries (which
/// the test runs on ours through the library path); None when gcc is missing, or the
/// headers are and the run asked to skip the C programs.
fn compile_c_test(source: &str, name: &str) -> Option<std::path::PathBuf> {
    if !require("gcc") {
        return None;
    }
    if !std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        if std::env::var_os("RNIC_SKIP_RDMA_APPS").is_some() {
            return None;
        }
        panic!("librdmacm-dev is not installed (scripts/test installs it, as root)");
    }
    let source = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    let binary = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let output = std::process::Command::new("gcc")
        .args(["-Wall", "-Werror", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("run gcc");
    assert!(
        output.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(binary)
}

/// Compiles tests/c/`source`, runs it alone on the device `device` (60 s at most) and
/// expects it to succeed and print `expected`; skips where `compile_c_test` does.
fn run_c_program(source: &str, name: &str, args: &[&str], device: &str, expected: &str) {
    let Some(binary) = compile_c_test(source, name) else {
        return;
    };
    let program = binary.to_str().expect("path");
    let output = common::wait_bounded(
        common::command(program, args, device)
            .spawn()
            .unwrap_or_else(|e| panic!("start {source}: {e}")),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(expected),
        "{source} ({})\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A server that exits with its connection up: Linux destroys the process's ids and sends
/// the DREQ, so the client sees DISCONNECTED (tests/c/cm_exit.c).
#[test]
fn a_process_that_exits_with_a_connection_up_disconnects_it() {
    let Some(binary) = compile_c_test("cm_exit.c", "rnic-cm-exit") else {
        return;
    };
    let program = binary.to_str().expect("path");
    let result = run(program, &["server", "SRV", "19531"], &["client", "SRV", "19531"], 17);
    result.assert_success("cm_exit");
    let client = result.client_stdout();
    assert!(
        client.contains("RDMA_CM_EVENT_DISCONNECTED (status 0)") && client.contains("client done"),
        "{client}"
    );
}

/// An id's events live as long as librdmacm lets them: an event of an id destroyed before
/// the application took it is dropped, and `rdma_destroy_id` waits until another thread
/// has acknowledged the id's event it holds. rping's client crashed without this (its CM
/// thread was handed DISCONNECTED for the id its main thread had destroyed, with a NULL
/// context) (tests/c/cm_event_lifetime.c).
#[test]
fn an_ids_events_never_outlive_it_and_its_destruction_waits_for_their_acknowledgement() {
    run_c_program(
        "cm_event_lifetime.c",
        "rnic-cm-event-lifetime",
        &["127.0.4.65"],
        "udp:127.0.4.65",
        "event lifetime: as librdmacm",
    );
}

/// tgtd's iSER portals, 0.0.0.0 and :: on one port, each id family-only
/// (RDMA_OPTION_ID_AFONLY): both bind and listen, as on Linux; without the option the
/// IPv6 wildcard's bind fails with EADDRNOTAVAIL (tests/c/cm_portals.c).
#[test]
fn wildcard_portals_of_both_families_share_a_port_when_family_only() {
    run_c_program(
        "cm_portals.c",
        "rnic-cm-portals",
        &["3260"],
        "udp:127.0.4.61",
        "portals: both wildcards listen",
    );
}

/// tgtd's backing-store completions: the main thread blocks SIGUSR2 after the libraries
/// started their threads and reads it from a signalfd, workers send it with
/// `kill(getpid(), SIGUSR2)`. Every signal reaches the signalfd because the libraries'
/// threads (progress, network reader, CM) block asynchronous signals; before, one of
/// them took SIGUSR2 and its default action ended tgtd at its first READ
/// (tests/c/signalfd_worker.c).
#[test]
fn process_directed_signals_reach_the_application_not_our_threads() {
    run_c_program(
        "signalfd_worker.c",
        "rnic-signalfd-worker",
        &["50"],
        "udp:127.0.4.63",
        "signalfd: 50 of 50 signals read",
    );
}

fn perftest_cm(program: &str, pair: u8) {
    if !require(program) {
        return;
    }
    let port = format!("{}", 19_510 + u32::from(pair));
    let result = run(
        program,
        &["-d", "rnic0", "-R", "-n", "200", "-p", &port],
        &["-d", "rnic0", "-R", "-n", "200", "-p", &port, "SRV"],
        pair,
    );
    result.assert_success(&format!("{program} -R"));
    let numbers = common::perftest_result(&result.client_stdout());
    assert!(
        numbers.len() >= 3 && numbers[2] > 0.0,
        "{program} -R: {}",
        result.client_stdout()
    );
}

#[test]
fn ib_write_bw_connects_through_rdma_cm() {
    perftest_cm("ib_write_bw", 10);
}

#[test]
fn ib_send_bw_connects_through_rdma_cm() {
    perftest_cm("ib_send_bw", 11);
}

#[test]
fn ib_read_lat_connects_through_rdma_cm() {
    perftest_cm("ib_read_lat", 12);
}

/// fio's rdma engine: the reader is the server, the writer the client, `--verify=md5`.
fn fio(verb: &str, pair: u8) {
    fio_with(verb, pair, &[]);
}

/// [`fio`] with more options for the server.
fn fio_with(verb: &str, pair: u8, server_options: &[&str]) {
    if !require("fio") {
        return;
    }
    let port = format!("--port={}", 19_520 + u32::from(pair));
    let verb = format!("--verb={verb}");
    // The engine first: its options (hostname, port, verb) exist only once it is chosen.
    let mut server = vec![
        "--name=server",
        "--ioengine=rdma",
        "--rw=read",
        "--bs=64k",
        "--size=4m",
        "--hostname=SRV",
        &port,
    ];
    server.extend_from_slice(server_options);
    let client = vec![
        "--name=client",
        "--ioengine=rdma",
        "--rw=write",
        "--bs=64k",
        "--size=4m",
        "--verify=md5",
        "--hostname=SRV",
        &port,
        &verb,
    ];
    let result = run("fio", &server, &client, pair);
    result.assert_success(&format!("fio {verb}"));
    let client = result.client_stdout();
    assert!(client.contains("err= 0") && client.contains("io=4096KiB"), "{client}");
    assert!(!client.contains("verify:") || !client.contains("bad"), "{client}");
}

#[test]
fn fio_rdma_write_with_verify() {
    fio("write", 20);
}

#[test]
fn fio_rdma_read_with_verify() {
    fio("read", 21);
}

/// Channel semantics: the client's SENDs land in receives the server posts one per I/O.
/// fio connects with `rnr_retry_count` 0 on both sides (its `rdma_conn_param` is zeroed), so
/// a SEND that finds no receive fails at once with `IBV_WC_RNR_RETRY_EXC_ERR`, on any RDMA
/// device; fio's engine advises a receiving side deeper than the sending side. Here the
/// server posts a receive for every one of the 64 messages before the client, which
/// sleeps 0.5 s after connecting, sends the first: the exchange cannot race. (At depth
/// 16 it passes as long as the server's process is never 16 messages behind; a
/// connection manager thread that spun while idle, as ours did, starved it that long on
/// a 2-core host.)
#[test]
fn fio_send_with_verify() {
    fio_with("send", 22, &["--iodepth=64"]);
}
