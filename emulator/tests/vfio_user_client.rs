//! rnic-verbs' vfio-user client backend (`VfioUserDevice`) against the real server,
//! in-process: the full driver bring-up through the protocol, verbs objects, traffic
//! through a QP connected to itself (the model loops frames for its own MAC back),
//! flush completions, completion interrupts on eventfds, reconnection, and a server that
//! dies under the client.

mod common;

use std::time::{Duration, Instant};

use common::verbs::{connect, pattern, rc_qp, ALL_ACCESS};
use common::*;
use rnic_verbs::backend::{open_device, vfio_user, VfioUserDevice};
use rnic_verbs::device_access::DeviceAccess;
use rnic_verbs::{
    CompletionQueue, Context, PortState, QpAttributeMask, QpAttributes, QpCapabilities, QpInitAttributes, QpState,
    QpType, QueuePair, RdmaFields, RecvWorkRequest, SendFlags, SendWorkRequest, Sge, SrqAttributes, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

const WAIT: Duration = Duration::from_secs(20);
fn open(socket: &std::path::Path) -> Context {
    let device = VfioUserDevice::connect(socket).expect("connect");
    Context::open(Box::new(device)).expect("bring-up over vfio-user")
}

/// RESET → INIT → RTR → RTS with the QP as its own peer: destination QPN = own QPN,
/// DGID = own GID 0, destination MAC = own MAC.
fn connect_to_self(context: &Context, qp: &QueuePair) {
    connect(qp, context, qp.qp_num());
    assert_eq!(qp.query().unwrap().qp_state, QpState::Rts);
}

/// Polls `cq` until `count` completions arrived (wall-clock timeout).
fn poll_n(cq: &CompletionQueue, count: usize) -> Vec<WorkCompletion> {
    let mut out = vec![WorkCompletion::default(); count];
    let mut got = 0;
    let deadline = Instant::now() + WAIT;
    while got < count {
        got += cq.poll(&mut out[got..]).expect("poll");
        assert!(
            Instant::now() < deadline,
            "{got} of {count} completions: {:?}",
            &out[..got]
        );
    }
    // Nothing more than expected.
    let mut extra = [WorkCompletion::default(); 4];
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(cq.poll(&mut extra).unwrap(), 0, "{extra:?}");
    out
}

fn send_wr(wr_id: u64, opcode: WrOpcode, sges: &[Sge]) -> SendWorkRequest<'_> {
    SendWorkRequest {
        wr_id,
        opcode,
        sg_list: sges,
        send_flags: SendFlags::SIGNALED,
        ..SendWorkRequest::default()
    }
}

#[test]
fn bring_up_objects_loopback_traffic_and_flush_over_vfio_user() {
    let server = start_server("client-e2e");
    let socket = server.handle().socket().to_path_buf();
    let device = VfioUserDevice::connect(&socket).expect("connect");
    assert!(device.doorbells_mapped(), "BAR 2 pages are mmapped");
    assert!(device.vectors() >= 3, "{} MSI-X vectors", device.vectors());
    assert_eq!(device.region(0).size, rnic_firmware_if::regs::BAR0_SIZE);
    let context = Context::open(Box::new(device)).expect("bring-up over vfio-user");

    // Queries.
    let attributes = context.query_device();
    assert_eq!(
        attributes.vendor_id,
        u32::from(rnic_firmware_if::pci::DEFAULT_VENDOR_ID)
    );
    assert!(attributes.max_qp > 0 && attributes.max_cqe > 0);
    let port = context.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!(context.mac_address(), vfio_user::DEFAULT_MAC);
    let gid = context.query_gid(1, 0).unwrap();
    assert_eq!(gid.link_local_mac(), Some(vfio_user::DEFAULT_MAC), "GID 0 {gid}");

    // Objects: PD, an MR of provider memory and one of application memory, CQ, SRQ, QP.
    let pd = context.alloc_pd().unwrap();
    let provider = pd.register_provider_memory(256 << 10, ALL_ACCESS).unwrap();
    let app_bytes = pattern(7, 3 * 4096 + 100);
    let application = pd.register_user_memory(app_bytes.clone(), ALL_ACCESS).unwrap();
    let mut check = vec![0u8; app_bytes.len()];
    application.read(0, &mut check).unwrap();
    assert_eq!(check, app_bytes, "the application's bytes were copied into DMA memory");
    let cq = context.create_cq(64, None, 0).unwrap();
    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 32,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    assert!(srq.query().unwrap().max_wr >= 32);
    let qp = rc_qp(&pd, &cq);
    connect_to_self(&context, &qp);

    // SEND from provider memory into a receive in application memory.
    let message = pattern(42, 3000);
    provider.write(0, &message).unwrap();
    let recv_sge = [Sge::new(application.addr(), 4096, application.lkey())];
    qp.post_recv(&[RecvWorkRequest {
        wr_id: 100,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let send_sge = [Sge::new(provider.addr(), message.len() as u32, provider.lkey())];
    qp.post_send(&[send_wr(1, WrOpcode::Send, &send_sge)]).unwrap();
    let completions = poll_n(&cq, 2);
    assert!(
        completions.iter().all(|wc| wc.status == WcStatus::Success),
        "{completions:?}"
    );
    let recv = completions
        .iter()
        .find(|wc| wc.wr_id == 100)
        .expect("receive completion");
    assert_eq!((recv.opcode, recv.byte_len), (WcOpcode::Recv, message.len() as u32));
    let mut received = vec![0u8; message.len()];
    application.read(0, &mut received).unwrap();
    assert_eq!(received, message, "SEND payload arrived in application memory");

    // RDMA WRITE from application memory into provider memory.
    let write_sge = [Sge::new(application.addr() + 8192, 2000, application.lkey())];
    let mut write = send_wr(2, WrOpcode::RdmaWrite, &write_sge);
    write.rdma = RdmaFields {
        remote_addr: provider.addr() + 0x10000,
        rkey: provider.rkey(),
    };
    qp.post_send(&[write]).unwrap();
    let completions = poll_n(&cq, 1);
    assert_eq!(
        (completions[0].wr_id, completions[0].status, completions[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut written = vec![0u8; 2000];
    provider.read(0x10000, &mut written).unwrap();
    assert_eq!(written, app_bytes[8192..10192], "RDMA WRITE payload arrived");

    // QP to ERR: posted work requests complete flushed.
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Err,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE,
    )
    .unwrap();
    let recv_sges = [Sge::new(provider.addr() + 0x20000, 64, provider.lkey())];
    qp.post_recv(&[
        RecvWorkRequest {
            wr_id: 200,
            sg_list: &recv_sges,
        },
        RecvWorkRequest {
            wr_id: 201,
            sg_list: &recv_sges,
        },
    ])
    .unwrap();
    qp.post_send(&[
        send_wr(300, WrOpcode::Send, &send_sge),
        send_wr(301, WrOpcode::Send, &send_sge),
    ])
    .unwrap();
    let mut flushed: Vec<(u64, WcStatus)> = poll_n(&cq, 4).iter().map(|wc| (wc.wr_id, wc.status)).collect();
    flushed.sort_by_key(|(id, _)| *id);
    assert_eq!(
        flushed,
        [200, 201, 300, 301].map(|id| (id, WcStatus::WrFlushErr)).to_vec()
    );

    // The application gets its Vec back, with what the device wrote into it.
    qp.destroy().unwrap();
    let bytes = application.deregister().unwrap().expect("application bytes");
    assert_eq!(bytes.len(), app_bytes.len());
    assert_eq!(bytes[..message.len()], message[..]);
    assert_eq!(bytes[4096..], app_bytes[4096..]);

    let stats = server.handle().stats();
    assert!(stats.doorbells > 0, "doorbells went through the mapped page: {stats:?}");
    assert!(stats.dma_maps > 0);
    assert_eq!(stats.device.dma_errors, 0, "{stats:?}");
    assert_eq!(stats.frames_transmitted, 0, "nothing left the port");
}

#[test]
fn completion_interrupts_arrive_on_eventfds() {
    let server = start_server("client-irq");
    let context = open(server.handle().socket());
    let pd = context.alloc_pd().unwrap();
    let mr = pd.register_provider_memory(64 << 10, ALL_ACCESS).unwrap();
    let channel = context.create_comp_channel();
    let cq = context.create_cq(16, Some(&channel), 0).unwrap();
    let qp = rc_qp(&pd, &cq);
    connect_to_self(&context, &qp);
    assert!(channel.get_cq_event().is_none());
    let before = server.handle().stats().interrupts;
    cq.req_notify(false);
    let recv_sge = [Sge::new(mr.addr() + 4096, 64, mr.lkey())];
    qp.post_recv(&[RecvWorkRequest {
        wr_id: 1,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let send_sge = [Sge::new(mr.addr(), 64, mr.lkey())];
    qp.post_send(&[send_wr(2, WrOpcode::Send, &send_sge)]).unwrap();
    let started = Instant::now();
    let event = channel.wait_cq_event(5_000_000_000).expect("a completion event");
    assert_eq!(event.cq_number, cq.cq_number());
    assert!(started.elapsed() < Duration::from_secs(5));
    cq.ack_events(1);
    assert_eq!(poll_n(&cq, 2).len(), 2);
    assert!(server.handle().stats().interrupts > before, "an eventfd was written");
}

#[test]
fn wait_interrupt_honours_its_timeout() {
    let server = start_server("client-wait");
    let device = VfioUserDevice::connect(server.handle().socket()).unwrap();
    let started = Instant::now();
    assert!(device.wait_interrupt(20_000_000).is_empty());
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(20) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
    let started = Instant::now();
    device.delay(2_000_000);
    assert!(started.elapsed() >= Duration::from_millis(2));
    // DMA memory: allocation, CPU access, reuse.
    let buffer = device.allocate_dma(10_000, 8192).unwrap();
    assert_eq!(buffer.address() % 8192, 0);
    device.dma_write(buffer.address() + 5, b"hello").unwrap();
    let mut out = [0u8; 5];
    device.dma_read(buffer.address() + 5, &mut out).unwrap();
    assert_eq!(&out, b"hello");
    assert!(device.dma_read(0x10, &mut out).is_err());
    let address = buffer.address();
    device.free_dma(buffer);
    let again = device.allocate_dma(4096, 4096).unwrap();
    assert_eq!(again.address(), address, "freed memory is reused");
    let mut zero = [1u8; 16];
    device.dma_read(again.address(), &mut zero).unwrap();
    assert_eq!(zero, [0; 16], "and handed out zeroed");
    device.free_dma(again);
    assert_eq!(device.dma_buffers_in_use(), 0);
}

#[test]
fn a_new_client_attaches_after_the_previous_one_dropped() {
    let server = start_server("client-reconnect");
    let socket = server.handle().socket().to_path_buf();
    {
        let context = open(&socket);
        let pd = context.alloc_pd().unwrap();
        let _cq = context.create_cq(16, None, 0).unwrap();
        drop(pd);
    }
    let (stats, detached) = server
        .handle()
        .wait_for(WAIT, |s| s.disconnections == 1 && !s.connected);
    assert!(detached, "{stats:?}");
    assert_eq!(stats.dma_maps, 0, "the client's DMA maps are gone");
    let context = open_device(&format!("vfio-user:{}", socket.display()))
        .and_then(|device| {
            Context::open(device)
                .map_err(|e| rnic_verbs::device_access::AccessError::InvalidRequest { reason: e.to_string() })
        })
        .expect("second client");
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(16, None, 0).unwrap();
    let qp = rc_qp(&pd, &cq);
    connect_to_self(&context, &qp);
    assert_eq!(server.handle().stats().connections, 2);
}

#[test]
fn a_server_that_dies_gives_errors_not_panics_or_hangs() {
    let server = start_server("client-dies");
    let socket = server.handle().socket().to_path_buf();
    let device = VfioUserDevice::connect(&socket).unwrap();
    let context = Context::open(Box::new(device)).unwrap();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(16, None, 0).unwrap();
    server.stop().unwrap();
    let started = Instant::now();
    assert!(context.create_cq(16, None, 0).is_err(), "a mailbox command fails");
    assert!(pd.register_provider_memory(4096, ALL_ACCESS).is_err());
    assert!(cq.query().is_err());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    // The CPU side of DMA memory still works: it is ours.
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut wc).unwrap_or(0), 0);
    drop(cq);
    drop(pd);
    drop(context);
    assert!(VfioUserDevice::connect(&socket).is_err(), "nobody listens any more");
}

#[test]
fn device_strings() {
    let server = start_server("client-spec");
    let socket = server.handle().socket().display().to_string();
    let device = open_device(&format!("vfio-user:{socket},mac=02:00:00:00:00:09")).unwrap();
    assert_eq!(device.mac_address(), Some([2, 0, 0, 0, 0, 9]));
    drop(device);
    assert!(open_device("embedded").is_ok());
    for bad in ["", "vfio-user:", "vfio-user:/x,mac=zz", "pci:0000:01:00.0"] {
        assert!(open_device(bad).is_err(), "{bad:?}");
    }
    assert!(open_device("vfio-user:/nonexistent/rnic.sock").is_err());
}

/// Many doorbells in a row to the same register: each waits for the device to take the
/// previous one (the mapped-page rule), so none is lost.
#[test]
fn back_to_back_doorbells_are_not_lost() {
    const COUNT: usize = 48;
    let server = start_server("client-doorbells");
    let context = open(server.handle().socket());
    let pd = context.alloc_pd().unwrap();
    let mr = pd.register_provider_memory(COUNT * 256, ALL_ACCESS).unwrap();
    let cq = context.create_cq(256, None, 0).unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCapabilities {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap();
    connect_to_self(&context, &qp);
    let before = server.handle().stats().doorbells;
    for i in 0..COUNT {
        let sge = [Sge::new(mr.addr() + (i * 256 + 128) as u64, 128, mr.lkey())];
        qp.post_recv(&[RecvWorkRequest {
            wr_id: 1000 + i as u64,
            sg_list: &sge,
        }])
        .unwrap();
    }
    mr.write(0, &pattern(9, COUNT * 256)).unwrap();
    for i in 0..COUNT {
        let sge = [Sge::new(mr.addr() + (i * 256) as u64, 128, mr.lkey())];
        qp.post_send(&[send_wr(i as u64, WrOpcode::Send, &sge)]).unwrap();
    }
    let completions = poll_n(&cq, 2 * COUNT);
    assert!(
        completions.iter().all(|wc| wc.status == WcStatus::Success),
        "{completions:?}"
    );
    let mut bytes = vec![0u8; COUNT * 256];
    mr.read(0, &mut bytes).unwrap();
    for chunk in bytes.chunks(256) {
        assert_eq!(chunk[..128], chunk[128..], "each SEND landed in its receive");
    }
    let taken = server.handle().stats().doorbells - before;
    assert!(taken >= 2 * COUNT as u64, "{taken} doorbells taken from the page");
}

/// The server goes away while the driver is busy: the calls in flight and after fail
/// with errors, within a bounded time.
#[test]
fn a_server_stopped_mid_run_fails_the_calls_in_flight() {
    let server = start_server("client-mid-run");
    let context = open(server.handle().socket());
    let pd = context.alloc_pd().unwrap();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        server.stop().unwrap();
    });
    let started = Instant::now();
    let mut created = Vec::new();
    let failed = loop {
        match context.create_cq(16, None, 0) {
            Ok(cq) => created.push(cq),
            Err(error) => break error,
        }
        assert!(started.elapsed() < Duration::from_secs(60), "never failed");
        if created.len() > 200 {
            // Keep the device's CQ table from filling up before the server stops.
            created.clear();
        }
    };
    stopper.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(60));
    let message = failed.to_string();
    assert!(!message.is_empty());
    assert!(pd.register_provider_memory(8192, ALL_ACCESS).is_err());
    // Dropping everything against a dead server does not hang or panic either.
    drop(created);
    drop(pd);
    drop(context);
}

/// A SEND into a QP whose receives come from an SRQ, and an RDMA READ back, over the
/// loopback path; the SRQ's receive buffer is application memory.
#[test]
fn srq_receive_and_rdma_read_through_a_self_connected_qp() {
    let server = start_server("client-srq");
    let context = open(server.handle().socket());
    let pd = context.alloc_pd().unwrap();
    let provider = pd.register_provider_memory(64 << 10, ALL_ACCESS).unwrap();
    let application = pd.register_user_memory(vec![0u8; 8192], ALL_ACCESS).unwrap();
    let cq = context.create_cq(32, None, 0).unwrap();
    let srq = pd
        .create_srq(&SrqAttributes {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd
        .create_qp(&QpInitAttributes {
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(&srq),
            cap: QpCapabilities {
                max_send_wr: 16,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap();
    connect_to_self(&context, &qp);
    let recv_sge = [Sge::new(application.addr(), 4096, application.lkey())];
    srq.post_srq_recv(&[RecvWorkRequest {
        wr_id: 77,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let message = pattern(3, 1500);
    provider.write(0, &message).unwrap();
    let send_sge = [Sge::new(provider.addr(), 1500, provider.lkey())];
    qp.post_send(&[send_wr(1, WrOpcode::Send, &send_sge)]).unwrap();
    let completions = poll_n(&cq, 2);
    assert!(
        completions.iter().all(|wc| wc.status == WcStatus::Success),
        "{completions:?}"
    );
    assert!(completions.iter().any(|wc| wc.wr_id == 77 && wc.byte_len == 1500));
    // RDMA READ of what arrived, from application memory into provider memory.
    let read_sge = [Sge::new(provider.addr() + 0x8000, 1500, provider.lkey())];
    let mut read = send_wr(2, WrOpcode::RdmaRead, &read_sge);
    read.rdma = RdmaFields {
        remote_addr: application.addr(),
        rkey: application.rkey(),
    };
    qp.post_send(&[read]).unwrap();
    let completions = poll_n(&cq, 1);
    assert_eq!(
        (completions[0].status, completions[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut back = vec![0u8; 1500];
    provider.read(0x8000, &mut back).unwrap();
    assert_eq!(back, message);
}
