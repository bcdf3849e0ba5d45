//! A hostile or broken client: malformed, short, oversized and truncated messages,
//! unknown commands, out-of-range regions and vectors, clients that vanish — and one test
//! per defect of the `vfio_user` crate (reference §2.4) showing this server does not have
//! it. After each, the server answers the same client (the stream is in step) or the
//! next one.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use rnic_emu::os;
use rnic_firmware_if::doorbell::{Doorbell, DB_OFFSET};
use rnic_firmware_if::regs;

const WAIT: Duration = Duration::from_secs(5);

// ---- malformed messages ---------------------------------------------------------------

#[test]
fn a_size_below_the_header_is_refused_and_the_stream_stays_in_step() {
    let server = start_server("short-header");
    let mut client = TestClient::attach(server.handle().socket());
    client.send_raw(&header(77, REGION_READ, 8, 0), &[]);
    let reply = client.recv();
    assert_eq!(
        (reply.id, reply.is_error(), reply.error),
        (77, true, libc::EINVAL as u32)
    );
    client.assert_in_sync();
}

#[test]
fn short_payloads_are_refused_for_every_command() {
    let server = start_server("short-payload");
    let mut client = TestClient::attach(server.handle().socket());
    for command in [
        DMA_MAP,
        DMA_UNMAP,
        GET_INFO,
        GET_REGION_INFO,
        GET_IRQ_INFO,
        SET_IRQS,
        REGION_READ,
        REGION_WRITE,
    ] {
        assert_eq!(
            client.request(command, &[1, 2, 3], &[]).unwrap_err(),
            libc::EINVAL,
            "command {command}"
        );
        client.assert_in_sync();
    }
    // REGION_WRITE whose data is shorter and longer than its count.
    let mut payload = access(regs::CSQ_BASE_LOW, 0, 8);
    payload.extend_from_slice(&[0; 4]);
    assert_eq!(client.request(REGION_WRITE, &payload, &[]).unwrap_err(), libc::EINVAL);
    payload.extend_from_slice(&[0; 8]);
    assert_eq!(client.request(REGION_WRITE, &payload, &[]).unwrap_err(), libc::EINVAL);
    client.assert_in_sync();
}

#[test]
fn an_oversized_message_is_drained_and_refused_with_e2big() {
    let server = start_server("oversized");
    let mut client = TestClient::attach(server.handle().socket());
    let data_len = 3 << 20;
    let mut payload = access(0, 0, data_len as u32);
    payload.resize(16 + data_len, 0xA5);
    let writer = client.stream.try_clone().unwrap();
    let id = client.next_id();
    let sender = std::thread::spawn(move || {
        let mut bytes = header(id, REGION_WRITE, (16 + payload.len()) as u32, 0);
        bytes.extend_from_slice(&payload);
        let mut sent = 0;
        while sent < bytes.len() {
            sent += os::send_with_fds(writer.as_fd(), &[&bytes[sent..]], &[]).unwrap();
        }
    });
    let reply = client.recv();
    sender.join().unwrap();
    assert_eq!((reply.id, reply.error), (id, libc::E2BIG as u32));
    client.assert_in_sync();
}

#[test]
fn unknown_and_unsupported_commands_are_refused_with_their_payload_consumed() {
    let server = start_server("unknown");
    let mut client = TestClient::attach(server.handle().socket());
    for (command, errno) in [
        (0u16, libc::EOPNOTSUPP),
        (6, libc::EOPNOTSUPP),  // GET_REGION_IO_FDS
        (11, libc::EINVAL),     // DMA_READ goes server → client
        (12, libc::EINVAL),     // DMA_WRITE likewise
        (14, libc::EOPNOTSUPP), // DIRTY_PAGES (removed)
        (15, libc::EOPNOTSUPP), // REGION_WRITE_MULTI (not advertised)
        (16, libc::EOPNOTSUPP), // DEVICE_FEATURE (migration)
        (99, libc::EOPNOTSUPP),
        (0xFFFF, libc::EOPNOTSUPP),
    ] {
        assert_eq!(
            client.request(command, &[0x5A; 64], &[]).unwrap_err(),
            errno,
            "command {command}"
        );
        client.assert_in_sync();
    }
}

#[test]
fn commands_before_version_are_refused() {
    let server = start_server("before-version");
    let mut client = TestClient::connect(server.handle().socket());
    assert_eq!(client.region_read(0, 0, 4).unwrap_err(), libc::EINVAL);
    client.negotiate();
    client.assert_in_sync();
}

#[test]
fn bad_version_messages_are_refused_and_a_good_one_still_works() {
    let server = start_server("bad-version");
    let mut client = TestClient::connect(server.handle().socket());
    assert_eq!(client.request(VERSION, &[0, 0], &[]).unwrap_err(), libc::EINVAL);
    assert_eq!(client.version(Some("{not json")).unwrap_err(), libc::EINVAL);
    assert_eq!(client.version(Some("[1,2]")).unwrap_err(), libc::EINVAL);
    assert_eq!(
        client
            .version(Some(r#"{"capabilities":{"max_msg_fds":-1}}"#))
            .unwrap_err(),
        libc::EINVAL
    );
    // JSON without its NUL terminator.
    assert_eq!(client.request(VERSION, b"\0\0\0\0{}", &[]).unwrap_err(), libc::EINVAL);
    // Major version 1 does not exist.
    assert_eq!(
        client.request(VERSION, &[1, 0, 0, 0], &[]).unwrap_err(),
        libc::EOPNOTSUPP
    );
    client.negotiate();
    client.assert_in_sync();
}

#[test]
fn regions_and_offsets_out_of_range_are_refused() {
    let server = start_server("ranges");
    let mut client = TestClient::attach(server.handle().socket());
    client.enable_device();
    let cases: [(u32, u64, u32); 9] = [
        (9, 0, 4),                   // no region 9
        (u32::MAX, 0, 4),            // nor 4 billion
        (1, 0, 4),                   // upper half of BAR0: size 0
        (6, 0, 4),                   // no ROM
        (0, regs::BAR0_SIZE, 4),     // just past BAR0
        (0, regs::BAR0_SIZE - 2, 4), // straddling its end
        (0, u64::MAX - 1, 4),        // offset + count wraps
        (7, 4096, 1),                // past config space
        (0, 0, 0),                   // nothing to read
    ];
    for (region, offset, count) in cases {
        assert_eq!(
            client.region_read(region, offset, count).unwrap_err(),
            libc::EINVAL,
            "read region {region} offset {offset:#x} count {count}"
        );
        let mut payload = access(offset, region, count);
        payload.resize(16 + count as usize, 0);
        assert_eq!(
            client.request(REGION_WRITE, &payload, &[]).unwrap_err(),
            libc::EINVAL,
            "write region {region} offset {offset:#x} count {count}"
        );
        client.assert_in_sync();
    }
    // BAR accesses of odd sizes: 3 bytes, or 12 bytes at an unaligned offset.
    assert_eq!(client.region_read(0, 0, 3).unwrap_err(), libc::EINVAL);
    assert_eq!(client.region_read(0, 2, 12).unwrap_err(), libc::EINVAL);
    // Config space takes any size.
    assert_eq!(client.region_read(7, 1, 3).unwrap().len(), 3);
}

#[test]
fn set_irqs_beyond_the_vectors_or_malformed_is_refused() {
    let server = start_server("irqs");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    let fd = os::eventfd().unwrap();
    let one = [fd.as_fd()];
    let cases: Vec<(u32, u32, u32, u32, Vec<u8>, bool)> = vec![
        (DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 6, 1, vec![], true), // vector 6 of 0..6
        (DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 5, 2, vec![], false), // 5..7
        (DATA_NONE | ACTION_TRIGGER, MSIX_INDEX, u32::MAX, 2, vec![], false), // wraps
        (DATA_EVENTFD | ACTION_TRIGGER, 0, 0, 1, vec![], true),          // INTx: none
        (DATA_EVENTFD | ACTION_TRIGGER, 1, 0, 1, vec![], true),          // MSI: none
        (DATA_EVENTFD | ACTION_TRIGGER, 5, 0, 1, vec![], true),          // no index 5
        (DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 0, 2, vec![], true), // 1 fd for 2
        (DATA_NONE | ACTION_TRIGGER, MSIX_INDEX, 0, 1, vec![], true),    // fd without EVENTFD
        (DATA_BOOL | ACTION_TRIGGER, MSIX_INDEX, 0, 1, vec![], false),   // bools missing
        (DATA_BOOL | DATA_NONE | ACTION_TRIGGER, MSIX_INDEX, 0, 1, vec![], false),
        (DATA_NONE | ACTION_MASK | ACTION_UNMASK, MSIX_INDEX, 0, 1, vec![], false),
        (DATA_NONE | ACTION_MASK, MSIX_INDEX, 0, 0, vec![], false), // count 0 only disables
    ];
    for (flags, index, start, count, bools, with_fd) in cases {
        let fds: &[_] = if with_fd { &one } else { &[] };
        assert_eq!(
            client.set_irqs(flags, index, start, count, &bools, fds).unwrap_err(),
            libc::EINVAL,
            "flags {flags:#x} index {index} start {start} count {count}"
        );
        client.assert_in_sync();
    }
    // Mask/unmask eventfds are not implemented: ENOTSUP, not silence.
    assert_eq!(
        client
            .set_irqs(DATA_EVENTFD | ACTION_MASK, MSIX_INDEX, 0, 1, &[], &one)
            .unwrap_err(),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        handle.wait_for(WAIT, |s| s.messages > 20).0.irq_eventfds,
        0,
        "nothing was wired by a refused message"
    );
}

#[test]
fn too_many_or_unexpected_descriptors_are_refused() {
    let server = start_server_with("fds", |o| o.limits.max_msg_fds = 4);
    let mut client = TestClient::attach(server.handle().socket());
    let fds: Vec<_> = (0..5).map(|_| os::eventfd().unwrap()).collect();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    assert_eq!(
        client
            .set_irqs(DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 0, 5, &[], &borrowed)
            .unwrap_err(),
        libc::EINVAL
    );
    client.assert_in_sync();
    // A descriptor on a command that takes none, and two on a DMA_MAP.
    assert_eq!(
        client
            .request(REGION_READ, &access(0, 0, 4), &borrowed[..1])
            .unwrap_err(),
        libc::EINVAL
    );
    let memory = os::memfd_create("two", 4096, true).unwrap();
    let mut map = 32u32.to_le_bytes().to_vec();
    map.extend_from_slice(&3u32.to_le_bytes());
    map.extend_from_slice(&[0; 8]);
    map.extend_from_slice(&0x1000u64.to_le_bytes());
    map.extend_from_slice(&0x1000u64.to_le_bytes());
    assert_eq!(
        client
            .request(DMA_MAP, &map, &[memory.as_fd(), memory.as_fd()])
            .unwrap_err(),
        libc::EINVAL
    );
    client.assert_in_sync();
}

#[test]
fn dma_map_validation() {
    let server = start_server("dma-map");
    let mut client = TestClient::attach(server.handle().socket());
    let memory = os::memfd_create("ram", 8192, true).unwrap();
    // Misaligned, empty, no permission, unknown flag, overlapping, beyond the file, not a file.
    assert_eq!(client.dma_map(None, 0, 0x1001, 4096, 3).unwrap_err(), libc::EINVAL);
    assert_eq!(client.dma_map(None, 0, 0x1000, 0, 3).unwrap_err(), libc::EINVAL);
    assert_eq!(client.dma_map(None, 0, 0x1000, 4096, 0).unwrap_err(), libc::EINVAL);
    assert_eq!(client.dma_map(None, 0, 0x1000, 4096, 7).unwrap_err(), libc::EINVAL);
    client.dma_map(Some(memory.as_fd()), 0, 0x10000, 8192, 3).unwrap();
    assert_eq!(client.dma_map(None, 0, 0x11000, 4096, 3).unwrap_err(), libc::EEXIST);
    assert_eq!(
        client
            .dma_map(Some(memory.as_fd()), 4096, 0x20000, 8192, 3)
            .unwrap_err(),
        libc::EBADF
    );
    let event = os::eventfd().unwrap();
    assert_eq!(
        client.dma_map(Some(event.as_fd()), 0, 0x30000, 4096, 3).unwrap_err(),
        libc::EBADF
    );
    client.assert_in_sync();
}

#[test]
fn dma_map_count_is_limited_by_max_dma_maps() {
    let server = start_server_with("max-maps", |o| o.limits.max_dma_maps = 2);
    let mut client = TestClient::attach(server.handle().socket());
    client.dma_map(None, 0, 0x1000, 4096, 3).unwrap();
    client.dma_map(None, 0, 0x2000, 4096, 3).unwrap();
    assert_eq!(client.dma_map(None, 0, 0x3000, 4096, 3).unwrap_err(), libc::ENOSPC);
}

#[test]
fn a_reply_sent_by_the_client_is_ignored() {
    let server = start_server("client-reply");
    let mut client = TestClient::attach(server.handle().socket());
    client.send_raw(&header(500, REGION_READ, 16, REPLY), &[]);
    let id = client.send(REGION_READ, 0, &access(regs::ID, 0, 4), &[]);
    let reply = client.recv();
    assert_eq!(reply.id, id, "no answer to the stray reply");
}

// ---- vanishing clients ------------------------------------------------------------------

#[test]
fn a_truncated_message_then_a_hang_up_leaves_the_server_ready_for_the_next_client() {
    let server = start_server("truncated");
    let handle = server.handle();
    {
        let client = TestClient::attach(handle.socket());
        let mut bytes = header(9, REGION_WRITE, 16 + 16 + 64, 0);
        bytes.extend_from_slice(&access(0, 0, 64));
        bytes.extend_from_slice(&[1; 10]);
        client.send_raw(&bytes, &[]);
    }
    assert!(handle.wait_for(WAIT, |s| s.disconnections == 1 && !s.connected).1);
    let mut next = TestClient::attach(handle.socket());
    next.assert_in_sync();
}

#[test]
fn a_huge_size_with_no_data_behind_it_cannot_hold_the_server() {
    let server = start_server("huge");
    let handle = server.handle();
    {
        let client = TestClient::attach(handle.socket());
        client.send_raw(&header(1, REGION_WRITE, u32::MAX, 0), &[]);
        client.send_raw(&[0; 1000], &[]);
        // The device loop keeps running while the server waits for the rest.
        let before = handle.stats().poll_passes;
        assert!(handle.wait_for(WAIT, |s| s.poll_passes > before + 10).1);
    }
    assert!(handle.wait_for(WAIT, |s| s.disconnections == 1).1);
    TestClient::attach(handle.socket()).assert_in_sync();
}

#[test]
fn a_second_client_is_refused_while_the_first_keeps_working() {
    let server = start_server("second");
    let handle = server.handle();
    let mut first = TestClient::attach(handle.socket());
    let mut second = TestClient::connect(handle.socket());
    // The server may already have closed it: a failed send is part of the answer.
    let _ = os::send_with_fds(second.stream.as_fd(), &[&header(1, VERSION, 20, 0), &[0; 4]], &[]);
    assert!(second.try_recv().is_err(), "closed without a reply");
    first.assert_in_sync();
    assert!(handle.wait_for(WAIT, |s| s.rejected_connections == 1).1);
}

/// The body of the client process that `a_client_killed_mid_traffic_*` kills: attaches
/// with DMA maps, eventfds and the doorbell page, then rings doorbells and reads
/// registers forever. Skipped unless started by that test.
#[test]
#[ignore = "runs only as the child process of a_client_killed_mid_traffic_leaves_the_server_running"]
fn child_client_process() {
    let Ok(socket) = std::env::var("RNIC_EMU_TEST_CHILD_SOCKET") else {
        return;
    };
    let mut client = TestClient::attach(std::path::Path::new(&socket));
    client.enable_device();
    client.bar0_write32(regs::CSQ_BASE_LOW, 0xABC0);
    let memory = os::memfd_create("child-ram", 1 << 20, true).unwrap();
    client
        .dma_map(Some(memory.as_fd()), 0, 0x4000_0000, 1 << 20, 3)
        .unwrap();
    let fds: Vec<_> = (0..6).map(|_| os::eventfd().unwrap()).collect();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    client
        .set_irqs(DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 0, 6, &[], &borrowed)
        .unwrap();
    let (_, region_fds) = client.region_info(2, 256).unwrap();
    let pages = map_doorbells(&region_fds[0], 64 * 4096);
    println!("ready");
    let mut n = 0u16;
    loop {
        n = n.wrapping_add(1);
        if pages.load_u64(DB_OFFSET as usize) == Some(0) {
            pages.store_u64(DB_OFFSET as usize, Doorbell::sq(0x10, n, 0).as_u64());
        }
        // A message with a payload, so the kill can land in the middle of one.
        let mut payload = access(regs::CSQ_BASE_HIGH, 0, 4);
        payload.extend_from_slice(&0u32.to_le_bytes());
        client.send(REGION_WRITE, NO_REPLY, &payload, &[]);
        client.bar0_read32(regs::ID);
    }
}

#[test]
fn a_client_killed_mid_traffic_leaves_the_server_running_with_device_state_kept() {
    let server = start_server("killed");
    let handle = server.handle();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_client_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RNIC_EMU_TEST_CHILD_SOCKET", handle.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.map(|l| l.contains("ready")).unwrap_or(false)),
        "child attached"
    );
    let (before, attached) = handle.wait_for(WAIT, |s| s.dma_maps == 1 && s.irq_eventfds == 6);
    assert!(attached, "{before:?}");
    // Let traffic flow, then kill -9 in the middle of it.
    assert!(
        handle
            .wait_for(WAIT, |s| s.doorbells > 20 && s.messages > before.messages + 100)
            .1
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let (after, detached) = handle.wait_for(WAIT, |s| s.disconnections == 1 && !s.connected);
    assert!(detached, "{after:?}");
    assert_eq!(
        (after.dma_maps, after.irq_eventfds),
        (0, 0),
        "the dead client's maps and eventfds dropped"
    );

    let mut next = TestClient::attach(handle.socket());
    assert_eq!(next.bar0_read32(regs::CSQ_BASE_LOW), 0xABC0, "device state kept");
    next.assert_in_sync();
    let counters = handle.stats().device;
    assert!(
        counters.doorbells + counters.doorbells_dropped >= 20,
        "device counters kept"
    );
}

#[test]
fn reconnecting_many_times_works() {
    let server = start_server("reconnect");
    let handle = server.handle();
    for round in 0..5u64 {
        let mut client = TestClient::attach(handle.socket());
        client.dma_map(None, 0, 0x1000, 4096, 3).unwrap(); // fresh space each time: no EEXIST
        client.assert_in_sync();
        drop(client);
        assert!(handle.wait_for(WAIT, |s| s.disconnections == round + 1).1);
    }
    assert_eq!(handle.stats().connections, 5);
}

// ---- the vfio_user crate's defects (reference §2.4), one test each ------------------------

/// Defect 2: the crate sends a region's mmap fd only together with sparse areas. Here it
/// comes with every reply for the mappable region, even when the client's argsz is too
/// small for the capability chain.
#[test]
fn defect_mmap_fd_is_sent_without_the_capability_chain() {
    let server = start_server("defect-fd");
    let mut client = TestClient::attach(server.handle().socket());
    let (payload, fds) = client.region_info(2, 32).unwrap();
    assert_eq!(payload.len(), 32, "no room for the chain");
    assert_eq!(le32(&payload, 0), 64, "argsz says how much to ask for");
    assert_eq!(le32(&payload, 12), 0, "cap_offset 0: chain not included");
    // MMAP without CAPS: QEMU rejects CAPS with cap_offset 0, then retries with argsz 64.
    assert_eq!(le32(&payload, 4) & 0b1100, 0b0100, "MMAP, not CAPS");
    assert_eq!(fds.len(), 1, "the fd comes anyway");
    map_doorbells(&fds[0], 64 * 4096);
}

/// Defect 3: an error found before the payload is read leaves the payload in the socket
/// to be parsed as headers. Here: REGION_WRITE to a bad region, SET_IRQS with DATA_BOOL,
/// and an unknown command, each with a 64-byte payload that would look like headers.
#[test]
fn defect_payload_of_a_refused_message_is_consumed() {
    let server = start_server("defect-desync");
    let mut client = TestClient::attach(server.handle().socket());
    let poison = header(0xBEEF, REGION_READ, 32, 0).repeat(4);
    let mut bad_write = access(0, 42, poison.len() as u32);
    bad_write.extend_from_slice(&poison);
    assert_eq!(client.request(REGION_WRITE, &bad_write, &[]).unwrap_err(), libc::EINVAL);
    client.assert_in_sync();
    let mut bools = Vec::new();
    for v in [(20 + 64) as u32, DATA_BOOL | ACTION_TRIGGER, MSIX_INDEX, 0, 64] {
        bools.extend_from_slice(&v.to_le_bytes());
    }
    bools.extend_from_slice(&poison);
    assert_eq!(client.request(SET_IRQS, &bools, &[]).unwrap_err(), libc::EINVAL);
    client.assert_in_sync();
    assert_eq!(client.request(77, &poison, &[]).unwrap_err(), libc::EOPNOTSUPP);
    client.assert_in_sync();
}

/// Defect 4: failures of a No_reply command still produce an error reply. Here they
/// produce nothing.
#[test]
fn defect_no_reply_failures_stay_silent() {
    let server = start_server("defect-noreply");
    let mut client = TestClient::attach(server.handle().socket());
    client.send(REGION_WRITE_MULTI, NO_REPLY, &[0; 40], &[]);
    client.send(REGION_WRITE, NO_REPLY, &access(0, 99, 0), &[]);
    let id = client.send(REGION_READ, 0, &access(regs::ID, 0, 4), &[]);
    let reply = client.recv();
    assert_eq!(
        (reply.id, reply.is_error()),
        (id, false),
        "the first reply is the read's"
    );
    assert!(
        server.handle().wait_for(WAIT, |s| s.errors == 2).1,
        "both failures were counted"
    );
}

/// Defect 5: the crate replies `errno = 0` for every error but EINVAL. Here each error
/// carries its own errno.
#[test]
fn defect_errno_is_preserved() {
    let server = start_server("defect-errno");
    let mut client = TestClient::attach(server.handle().socket());
    assert_eq!(client.dma_unmap(0, 0x7000_0000, 0x1000).unwrap_err(), libc::ENOENT);
    client.dma_map(None, 0, 0x1000, 0x1000, 3).unwrap();
    assert_eq!(client.dma_map(None, 0, 0x1000, 0x1000, 3).unwrap_err(), libc::EEXIST);
    let small = os::memfd_create("small", 4096, true).unwrap();
    assert_eq!(
        client.dma_map(Some(small.as_fd()), 0, 0x10000, 0x2000, 3).unwrap_err(),
        libc::EBADF
    );
    assert_eq!(client.region_read(0, 0, 2 << 20).unwrap_err(), libc::E2BIG);
    assert_eq!(client.request(42, &[], &[]).unwrap_err(), libc::EOPNOTSUPP);
}

/// Defect 6: the crate panics on VERSION without JSON. The JSON is optional.
#[test]
fn defect_version_without_json_is_accepted() {
    let server = start_server("defect-version");
    let handle = server.handle();
    let mut client = TestClient::connect(handle.socket());
    let json = client.version(None).unwrap();
    assert_eq!(json["capabilities"]["max_msg_fds"], 16);
    client.assert_in_sync();
    drop(client);
    assert!(handle.wait_for(WAIT, |s| s.disconnections == 1).1);
    // An empty JSON string (just the NUL) is the same.
    let mut client = TestClient::connect(handle.socket());
    assert!(client.request(VERSION, &[0, 0, 0, 0, 0], &[]).is_ok());
    client.assert_in_sync();
}

/// Defect 7: REGION_READ/WRITE counts are not checked against `max_data_xfer_size`, so a
/// client can make the server allocate gigabytes. Here they are refused with E2BIG.
#[test]
fn defect_transfer_sizes_are_bounded() {
    let server = start_server("defect-size");
    let mut client = TestClient::attach(server.handle().socket());
    assert_eq!(client.region_read(0, 0, 64 << 20).unwrap_err(), libc::E2BIG);
    assert_eq!(client.region_read(0, 0, u32::MAX).unwrap_err(), libc::E2BIG);
    // Exactly the limit is fine on a region that large: config space is 4 KiB, so use a
    // server whose limit is below the region size.
    drop(client);
    let small = start_server_with("defect-size-small", |o| o.limits.max_data_xfer_size = 4096);
    let mut client = TestClient::attach(small.handle().socket());
    assert_eq!(client.region_read(0, 0, 4096).unwrap().len(), 4096);
    assert_eq!(client.region_read(0, 0, 4100).unwrap_err(), libc::E2BIG);
    // A client that announces a smaller receive limit is held to it too.
    let server = start_server("defect-size-client");
    let mut client = TestClient::connect(server.handle().socket());
    client
        .version(Some(r#"{"capabilities":{"max_data_xfer_size":4096}}"#))
        .unwrap();
    assert_eq!(client.region_read(0, 0, 8192).unwrap_err(), libc::E2BIG);
}

/// Defect 8: the crate has UNMAP_ALL at bit 2; the protocol has it at bit 1.
#[test]
fn defect_unmap_all_is_bit_one() {
    let server = start_server("defect-unmap");
    let handle = server.handle();
    let mut client = TestClient::attach(handle.socket());
    for i in 1..=3u64 {
        client.dma_map(None, 0, i << 20, 4096, 3).unwrap();
    }
    assert_eq!(
        client.dma_unmap(1 << 2, 0, 0).unwrap_err(),
        libc::EINVAL,
        "bit 2 means nothing"
    );
    assert_eq!(
        client.dma_unmap(1 << 1, 1 << 20, 4096).unwrap_err(),
        libc::EINVAL,
        "ALL takes no range"
    );
    assert_eq!(
        client.dma_unmap(1 << 0, 1 << 20, 4096).unwrap_err(),
        libc::EOPNOTSUPP,
        "dirty bitmap"
    );
    assert!(handle.wait_for(WAIT, |s| s.dma_maps == 3).1);
    client.dma_unmap(1 << 1, 0, 0).unwrap();
    assert_eq!(handle.wait_for(WAIT, |s| s.dma_maps == 0).0.dma_maps, 0);
}

/// Defect 9: the crate always advertises `max_msg_fds` 1, so QEMU sends one eventfd per
/// SET_IRQS. Here the limit is configurable and a whole table goes in one message.
#[test]
fn defect_capabilities_are_configurable() {
    let server = start_server_with("defect-caps", |o| {
        o.limits.max_msg_fds = 8;
        o.limits.max_data_xfer_size = 65536;
    });
    let mut client = TestClient::connect(server.handle().socket());
    let json = client.negotiate();
    assert_eq!(json["capabilities"]["max_msg_fds"], 8);
    assert_eq!(json["capabilities"]["max_data_xfer_size"], 65536);
    let fds: Vec<_> = (0..6).map(|_| os::eventfd().unwrap()).collect();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    client
        .set_irqs(DATA_EVENTFD | ACTION_TRIGGER, MSIX_INDEX, 0, 6, &[], &borrowed)
        .unwrap();
    assert_eq!(
        server.handle().wait_for(WAIT, |s| s.irq_eventfds == 6).0.irq_eventfds,
        6
    );
}
