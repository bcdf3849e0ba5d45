//! QP1, the GSI QP, through the verbs API: created with its special number, always on the
//! GSI Q_Key, receiving 256-byte MADs behind the 40-byte GRH slot (20 zero bytes and the
//! IPv4 header with a valid checksum, as rdma-core's `ibv_init_ah_from_wc` expects).

mod common;

use rnic_verbs::backend::EmbeddedFabric;
use rnic_verbs::driver::DriverConfig;
use rnic_verbs::{
    AccessFlags, AhAttributes, CompletionQueue, Context, Gid, ProtectionDomain, QpAttributeMask, QpAttributes,
    QpCapabilities, QpInitAttributes, QpState, QpType, QueuePair, RecvWorkRequest, SendFlags, SendWorkRequest, Sge,
    UdFields, VerbsError, WcFlags, WcStatus, WrOpcode,
};

const GSI_QKEY: u32 = 0x8001_0000;

struct Host {
    device: rnic_verbs::backend::EmbeddedDevice,
    context: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn host(fabric: &EmbeddedFabric, n: u8) -> Host {
    let mac = [0x02, 0, 0, 0, 0, n];
    let device = fabric.add_nic(mac);
    let config = DriverConfig {
        ipv4_address: Some([192, 0, 2, n]),
        ..DriverConfig::default()
    };
    let context = Context::open_with_config(Box::new(device.clone()), &config).unwrap();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(64, None, 0).unwrap();
    Host {
        device,
        context,
        pd,
        cq,
    }
}

fn attributes(cq: &CompletionQueue) -> QpInitAttributes<'_> {
    QpInitAttributes {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCapabilities {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Ud,
        sq_sig_all: true,
    }
}

/// RESET → INIT → RTR → RTS the way the kernel's MAD layer brings QP1 up; the Q_Key is
/// deliberately left out: the driver and the device give QP1 the GSI Q_Key themselves.
fn bring_up(qp: &QueuePair) {
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::PKEY_INDEX | QpAttributeMask::PORT,
    )
    .unwrap();
    common::to_state(qp, QpState::Rtr).unwrap();
    qp.modify(
        &QpAttributes {
            qp_state: QpState::Rts,
            sq_psn: 0,
            ..QpAttributes::default()
        },
        QpAttributeMask::STATE | QpAttributeMask::SQ_PSN,
    )
    .unwrap();
}

#[test]
fn qp1_is_created_once_per_context_with_its_own_number() {
    let fabric = EmbeddedFabric::default();
    let h = host(&fabric, 1);
    let gsi = h.pd.create_gsi_qp(&attributes(&h.cq)).unwrap();
    assert_eq!(gsi.qp_num(), 1);
    assert_eq!(h.context.objects_in_use().queue_pairs, 1);
    assert!(matches!(
        h.pd.create_gsi_qp(&attributes(&h.cq)),
        Err(VerbsError::Busy(_))
    ));
    let ordinary = h.pd.create_qp(&attributes(&h.cq)).unwrap();
    assert!(ordinary.qp_num() > 1, "ordinary QPs never get QPN 0 or 1");
    let mut rc = attributes(&h.cq);
    rc.qp_type = QpType::Rc;
    assert!(matches!(h.pd.create_gsi_qp(&rc), Err(VerbsError::InvalidArgument(_))));
    bring_up(&gsi);
    assert_eq!(gsi.query().unwrap().qkey, GSI_QKEY, "QP1's QPC holds the GSI Q_Key");
    drop(gsi);
    let again = h.pd.create_gsi_qp(&attributes(&h.cq)).unwrap();
    assert_eq!(again.qp_num(), 1, "QP1 can be created again once destroyed");
    drop(again);
    drop(ordinary);
    assert_eq!(h.context.objects_in_use().queue_pairs, 0);
    common::assert_no_diagnostics(&h.device);
}

#[test]
fn a_mad_travels_from_qp1_to_qp1_with_the_ip_header_in_the_grh_slot() {
    let fabric = EmbeddedFabric::default();
    let (a, b) = (host(&fabric, 1), host(&fabric, 2));
    let gsi_a = a.pd.create_gsi_qp(&attributes(&a.cq)).unwrap();
    let gsi_b = b.pd.create_gsi_qp(&attributes(&b.cq)).unwrap();
    bring_up(&gsi_a);
    bring_up(&gsi_b);
    let access = AccessFlags::LOCAL_WRITE;
    let mr_a = a.pd.register_provider_memory(4096, access).unwrap();
    let mr_b = b.pd.register_provider_memory(4096, access).unwrap();
    let mad: Vec<u8> = (0..256).map(|i| i as u8).collect();
    mr_a.write(0, &mad).unwrap();
    gsi_b
        .post_recv(&[RecvWorkRequest {
            wr_id: 7,
            sg_list: &[Sge::new(mr_b.addr(), 40 + 256, mr_b.lkey())],
        }])
        .unwrap();
    let ah =
        a.pd.create_ah(&AhAttributes {
            dgid: b.context.query_gid(1, 0).unwrap(),
            dmac: b.context.mac_address(),
            hop_limit: 64,
            ..AhAttributes::default()
        })
        .unwrap();
    gsi_a
        .post_send(&[SendWorkRequest {
            wr_id: 1,
            opcode: WrOpcode::Send,
            sg_list: &[Sge::new(mr_a.addr(), 256, mr_a.lkey())],
            send_flags: SendFlags::SIGNALED,
            ud: Some(UdFields {
                ah: &ah,
                remote_qpn: 1,
                remote_qkey: GSI_QKEY,
            }),
            ..SendWorkRequest::default()
        }])
        .unwrap();
    let sent = common::poll_n(&a.device, &a.cq, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let received = common::poll_n(&b.device, &b.cq, 1)[0];
    assert_eq!(received.status, WcStatus::Success);
    assert_eq!((received.wr_id, received.qp_num, received.src_qp), (7, 1, 1));
    assert_eq!(received.byte_len, 40 + 256);
    assert!(received.wc_flags.contains(WcFlags::GRH));
    let mut landed = vec![0u8; 40 + 256];
    mr_b.read(0, &mut landed).unwrap();
    assert_eq!(&landed[..20], &[0u8; 20], "IPv4: 20 zero bytes first");
    let ip = &landed[20..40];
    assert_eq!(ip[0], 0x45, "an IPv4 header of 20 bytes");
    assert_eq!(&ip[12..16], &[192, 0, 2, 1], "source address");
    assert_eq!(&ip[16..20], &[192, 0, 2, 2], "destination address");
    assert_eq!(ipv4_checksum(ip), 0, "the header checksum verifies");
    assert_eq!(&landed[40..], &mad[..]);
    common::assert_no_diagnostics(&a.device);
}

#[test]
fn an_ordinary_ud_qp_cannot_reach_qp1_without_the_gsi_qkey() {
    let fabric = EmbeddedFabric::default();
    let (a, b) = (host(&fabric, 1), host(&fabric, 2));
    let sender = a.pd.create_qp(&attributes(&a.cq)).unwrap();
    common::to_init(&sender);
    common::to_state(&sender, QpState::Rtr).unwrap();
    common::to_rts(&sender);
    let gsi_b = b.pd.create_gsi_qp(&attributes(&b.cq)).unwrap();
    bring_up(&gsi_b);
    let mr_a = a.pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mr_b = b.pd.register_provider_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
    gsi_b
        .post_recv(&[RecvWorkRequest {
            wr_id: 1,
            sg_list: &[Sge::new(mr_b.addr(), 40 + 256, mr_b.lkey())],
        }])
        .unwrap();
    let ah =
        a.pd.create_ah(&AhAttributes {
            dgid: Gid(b.context.query_gid(1, 0).unwrap().raw()),
            dmac: b.context.mac_address(),
            ..AhAttributes::default()
        })
        .unwrap();
    // 0x1111_1111 is the sender's own Q_Key (to_init); bit 31 clear: sent as is.
    sender
        .post_send(&[SendWorkRequest {
            wr_id: 1,
            opcode: WrOpcode::Send,
            sg_list: &[Sge::new(mr_a.addr(), 256, mr_a.lkey())],
            send_flags: SendFlags::SIGNALED,
            ud: Some(UdFields {
                ah: &ah,
                remote_qpn: 1,
                remote_qkey: 0x1111_1111,
            }),
            ..SendWorkRequest::default()
        }])
        .unwrap();
    assert_eq!(common::poll_n(&a.device, &a.cq, 1)[0].status, WcStatus::Success);
    b.device
        .fabric()
        .advance(rnic_hw_model::time::Picoseconds::from_nanos(100_000));
    let mut nothing = [rnic_verbs::WorkCompletion::default(); 1];
    assert_eq!(b.cq.poll(&mut nothing).unwrap(), 0, "dropped at QP1");
    assert_eq!(b.device.with_device(|d| d.transport_counters().qkey_violations), 1);
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}
