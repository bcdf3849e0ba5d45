//! The connection manager's MADs as an independent decoder sees them: IPv4 and IPv6
//! exchanges with every message the CM sends (REQ, REP, RTU, REJ with private data, MRA,
//! DREQ, DREP, SIDR_REQ, SIDR_REP) are captured and decoded by tshark, which must show
//! every MAD as InfiniBand CM (`infiniband.cm`) with the values we put in and nothing
//! malformed; every frame's ICRC is checked by our own parser, and by
//! `../shared/oracles/check-roce-pcap` (tshark with an independent ICRC) where it exists.
//!
//! tshark is required (`scripts/test` installs it): the test fails without it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use rnic_hw_model::fabric::CapturedFrame;
use rnic_hw_model::wire;
use rnic_testbench::bench::{self, BenchConfig, Operation};
use rnic_verbs::backend::EmbeddedFabric;
use rnic_verbs::cm::embedded::run_until;
use rnic_verbs::cm::{
    CmConfig, CmEvent, CmEventKind, CmQpInit, ConnParam, ConnectionManager, EventChannel, FabricNeighbours, PortSpace,
};
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{Context, QpCapabilities};

struct Host {
    cm: ConnectionManager,
    channel: EventChannel,
    context: Context,
}

fn host(fabric: &EmbeddedFabric, n: u8) -> Host {
    let device = fabric.add_nic([0x02, 0x52, 0x4e, 0x49, 0x43, n]);
    let config = DriverConfig {
        ipv4_address: Some([192, 0, 2, n]),
        ..DriverConfig::default()
    };
    let context = Context::open_with_config(Box::new(device), &config).unwrap();
    let cm = ConnectionManager::new(CmConfig::seeded(u64::from(n)));
    cm.add_device(&context, Arc::new(FabricNeighbours(fabric.clone())))
        .unwrap();
    let channel = cm.create_event_channel().unwrap();
    Host { cm, channel, context }
}

fn wait(fabric: &EmbeddedFabric, hosts: &[&Host], on: usize, kind: CmEventKind) -> CmEvent {
    let managers: Vec<&ConnectionManager> = hosts.iter().map(|h| &h.cm).collect();
    let mut found = None;
    assert!(
        run_until(fabric, &managers, 300_000_000_000, || {
            if found.is_none() {
                found = hosts[on].channel.get_event();
            }
            found.is_some()
        }),
        "no {kind}"
    );
    let event = found.unwrap();
    assert_eq!(event.kind, kind, "status {}", event.status);
    event
}

fn qp_init() -> CmQpInit<'static> {
    CmQpInit {
        cap: QpCapabilities {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..CmQpInit::default()
    }
}

/// A connection with a slow acceptor (MRA), a rejection with private data, a SIDR
/// exchange and a disconnection, over IPv4.
fn ipv4_exchanges() -> Vec<CapturedFrame> {
    let fabric = EmbeddedFabric::default();
    fabric.set_capture(true);
    let (a, b) = (host(&fabric, 1), host(&fabric, 2));
    let hosts = [&a, &b];
    let server_ip = IpAddr::from([192, 0, 2, 2]);
    let listener = b.channel.create_id(0, PortSpace::Tcp).unwrap();
    listener.bind_addr(SocketAddr::new(server_ip, 4420)).unwrap();
    listener.listen(4).unwrap();
    let connect = |private: &[u8]| {
        let id = a.channel.create_id(0, PortSpace::Tcp).unwrap();
        id.resolve_addr(None, SocketAddr::new(server_ip, 4420), 2000).unwrap();
        wait(&fabric, &hosts, 0, CmEventKind::AddrResolved);
        id.resolve_route(2000).unwrap();
        wait(&fabric, &hosts, 0, CmEventKind::RouteResolved);
        id.create_qp(&qp_init()).unwrap();
        id.connect(&ConnParam {
            private_data: private.to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
        id
    };
    // Rejected, with the consumer's reason in the private data.
    let rejected = connect(b"first");
    let request = wait(&fabric, &hosts, 1, CmEventKind::ConnectRequest);
    request.id.reject(b"not now").unwrap();
    wait(&fabric, &hosts, 0, CmEventKind::Rejected);
    // Accepted after the REQ was repeated once: an MRA goes out.
    let client = connect(b"second");
    let request = wait(&fabric, &hosts, 1, CmEventKind::ConnectRequest);
    let managers = [&a.cm, &b.cm];
    run_until(&fabric, &managers, 7_000_000_000, || false);
    request.id.create_qp(&qp_init()).unwrap();
    request.id.accept(&ConnParam::default()).unwrap();
    wait(&fabric, &hosts, 0, CmEventKind::Established);
    wait(&fabric, &hosts, 1, CmEventKind::Established);
    client.disconnect().unwrap();
    wait(&fabric, &hosts, 1, CmEventKind::Disconnected);
    request.id.disconnect().unwrap();
    wait(&fabric, &hosts, 0, CmEventKind::Disconnected);
    // SIDR.
    let udp = b.channel.create_id(0, PortSpace::Udp).unwrap();
    udp.bind_addr(SocketAddr::new(server_ip, 9000)).unwrap();
    udp.listen(1).unwrap();
    let ud = a.channel.create_id(0, PortSpace::Udp).unwrap();
    ud.resolve_addr(None, SocketAddr::new(server_ip, 9000), 2000).unwrap();
    wait(&fabric, &hosts, 0, CmEventKind::AddrResolved);
    ud.resolve_route(2000).unwrap();
    wait(&fabric, &hosts, 0, CmEventKind::RouteResolved);
    ud.connect(&ConnParam::default()).unwrap();
    let request = wait(&fabric, &hosts, 1, CmEventKind::ConnectRequest);
    request.id.create_qp(&qp_init()).unwrap();
    request.id.accept(&ConnParam::default()).unwrap();
    wait(&fabric, &hosts, 0, CmEventKind::Established);
    drop((rejected, a.context.clone(), b.context.clone()));
    fabric.take_capture()
}

fn tshark_fields(path: &std::path::Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut command = Command::new("tshark");
    command
        .args(["-n", "-r"])
        .arg(path)
        .args(["-Y", filter, "-T", "fields", "-E", "separator=|"]);
    for field in fields {
        command.args(["-e", field]);
    }
    let output = command
        .output()
        .expect("tshark is installed (scripts/test installs it)");
    assert!(
        output.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.split('|').map(str::to_string).collect())
        .collect()
}

/// The shared ICRC oracle, where the reference material is checked out next to us.
fn oracle() -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    [
        std::env::var_os("ROCE_ORACLES_DIR").map(PathBuf::from),
        Some(workspace.join("../shared/oracles")),
    ]
    .into_iter()
    .flatten()
    .map(|dir| dir.join("check-roce-pcap"))
    .find(|path| path.exists())
}

/// Every frame's ICRC and headers (our parser), every MAD decoded by tshark as CM with no
/// malformed field; returns the attribute IDs in order.
fn check(name: &str, frames: &[CapturedFrame], ipv6: bool) -> Vec<String> {
    for frame in frames {
        wire::parse_frame(&frame.bytes).expect("a valid RoCEv2 frame with a good ICRC");
    }
    let path = std::env::temp_dir().join(format!("rnic-cm-{name}-{}.pcap", std::process::id()));
    rnic_testbench::pcap::write_pcap(&path, frames).unwrap();
    let bad = tshark_fields(
        &path,
        "_ws.malformed || _ws.expert.severity >= error && !udp.checksum.bad",
        &["frame.number"],
    );
    let bad: Vec<_> = bad.into_iter().filter(|l| !l[0].is_empty()).collect();
    // IPv6 RoCEv2 frames carry a zero UDP checksum (as rdma_rxe's): tshark calls that an
    // error, nothing else may be one.
    if !ipv6 {
        assert!(
            bad.is_empty(),
            "{name}: malformed or erroneous frames {bad:?} (kept at {})",
            path.display()
        );
    }
    let malformed = tshark_fields(&path, "_ws.malformed", &["frame.number"]);
    assert!(
        malformed.is_empty(),
        "{name}: malformed frames {malformed:?} (kept at {})",
        path.display()
    );
    let mads = tshark_fields(
        &path,
        "infiniband.mad",
        &[
            "infiniband.mad.mgmtclass",
            "infiniband.mad.classversion",
            "infiniband.mad.method",
            "infiniband.mad.attributeid",
            "infiniband.deth.q_key",
            "infiniband.bth.destqp",
        ],
    );
    assert!(!mads.is_empty(), "{name}: no MAD decoded");
    for mad in &mads {
        assert_eq!(
            &mad[..3],
            ["0x07", "0x02", "0x03"],
            "{name}: class CM, version 2, SEND: {mad:?}"
        );
        assert_eq!(mad[4], "0x0000000080010000", "{name}: GSI Q_Key");
        assert_eq!(mad[5], "0x000001", "{name}: to QP1");
    }
    let requests = tshark_fields(
        &path,
        "infiniband.cm.req",
        &[
            "infiniband.cm.req.serviceid",
            "infiniband.cm.req.ip_cm.ipv",
            "infiniband.cm.req.transpsvctype",
            "infiniband.cm.req.maxcmretr",
            "infiniband.cm.req.remoteresptout",
            "infiniband.cm.req.pkey",
        ],
    );
    for request in &requests {
        assert!(
            request[0].starts_with("0x00000000010"),
            "{name}: an RDMA-CM Service ID: {request:?}"
        );
        assert_eq!(
            request[1],
            if ipv6 { "0x06" } else { "0x04" },
            "{name}: IP CM header decoded: {request:?}"
        );
        assert_eq!(&request[2..], ["0x00", "0x0f", "0x14", "0xffff"], "{name}: {request:?}");
    }
    if let Some(oracle) = oracle() {
        let mut command = Command::new(oracle);
        if ipv6 {
            command.arg("--allow-zero-udp-csum");
        }
        let output = command.arg(&path).output().expect("run check-roce-pcap");
        assert!(
            output.status.success(),
            "{name}: check-roce-pcap:\n{}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    std::fs::remove_file(&path).unwrap();
    mads.into_iter().map(|m| m[3].clone()).collect()
}

#[test]
fn every_cm_mad_over_ipv4_decodes_as_infiniband_cm() {
    let frames = ipv4_exchanges();
    let attributes = check("ipv4", &frames, false);
    for (attribute, name) in [
        ("0x0010", "REQ"),
        ("0x0011", "MRA"),
        ("0x0012", "REJ"),
        ("0x0013", "REP"),
        ("0x0014", "RTU"),
        ("0x0015", "DREQ"),
        ("0x0016", "DREP"),
        ("0x0017", "SIDR_REQ"),
        ("0x0018", "SIDR_REP"),
    ] {
        assert!(attributes.iter().any(|a| a == attribute), "no {name} in {attributes:?}");
    }
    assert!(
        frames.iter().all(|f| f.bytes.len() == 322),
        "an IPv4 CM frame is 322 bytes, as Linux's"
    );
}

#[test]
fn rnic_bench_over_the_cm_decodes_too_over_ipv6() {
    let (report, frames) = bench::run(&BenchConfig {
        operation: Operation::Write,
        size: 4096,
        iterations: 20,
        queue_pairs: 2,
        capture: true,
        connection_manager: true,
        ..BenchConfig::default()
    })
    .unwrap();
    assert_eq!(report.messages_ok, 40);
    assert_eq!(report.cm_mads, 2 * 5, "REQ, REP, RTU, DREQ, DREP per pair");
    let attributes = check("bench-ipv6", &frames, true);
    assert_eq!(attributes.len(), 10);
}
