//! A driver for the integration tests, written as a verification engineer's testbench
//! would be (the SystemVerilog example's, in Rust): a session brought up through BAR
//! writes and host memory, every context built field by field from the layouts by name,
//! an RC QP to a peer device (QP 8 on both), the two ports linked, and an RDMA WRITE
//! posted on it.
#![allow(dead_code)]

use rnic_firmware_if::doorbell::{CqDoorbell, Doorbell};
use rnic_hw_model::Picoseconds;
use rnic_vip::{layout, Session};

pub const QPN: u32 = 8;
pub const CQN: u32 = 1;
pub const MPT_INDEX: u64 = 1;
pub const PD: u64 = 1;
pub const DMA_BASE: u64 = 0x1000_0000;
const RING_DEPTH: u32 = 64;
const CONTROL_BAR: u8 = 0;
const DOORBELL_BAR: u8 = 2;
const MSIX_BAR: u8 = 4;
const DB_OFFSET: u64 = 0x230;

/// `layout` with `fields` set, `size` bytes (at least the layout's).
pub fn build(layout_name: &str, fields: &[(&str, u64)]) -> Vec<u8> {
    let size = layout::layout(layout_name).unwrap().size;
    let mut bytes = vec![0u8; size];
    for (field, value) in fields {
        layout::set_field(&mut bytes, layout_name, field, *value).unwrap();
    }
    bytes
}

/// The driver's state for one device.
#[derive(Debug, Default)]
pub struct Driver {
    next_free: u64,
    ring: u64,
    producer: u32,
    mailbox_in: u64,
    /// The CQ buffer (64 CQEs of 64 bytes).
    pub cq: u64,
    /// The QP's WQE buffer (SQ page, then RQ page).
    pub qp: u64,
    /// The memory region (8 KiB).
    pub data: u64,
    /// The CEQ buffer.
    pub ceq: u64,
}

impl Driver {
    fn allocate(&mut self, bytes: u64) -> u64 {
        let address = self.next_free;
        self.next_free += bytes.div_ceil(4096) * 4096;
        address
    }

    fn settle(session: &mut Session) {
        let limit = Picoseconds(session.now().0 + 1_000_000_000);
        session.run_until_idle(limit);
    }

    /// One command through the command queue; returns the descriptor's data words.
    fn command(&mut self, session: &mut Session, opcode: u64, read_back: bool, payload: &[u8]) -> Vec<u8> {
        let mut descriptor = build(
            "Descriptor",
            &[("OPCODE", opcode), ("FLAG", if read_back { 0x9 } else { 0x1 })],
        );
        descriptor[8..8 + payload.len().min(24)].copy_from_slice(&payload[..payload.len().min(24)]);
        let slot = self.ring + u64::from(self.producer % RING_DEPTH) * 32;
        session.memory_write(slot, &descriptor).unwrap();
        self.producer = (self.producer + 1) % RING_DEPTH;
        session
            .bar_write(CONTROL_BAR, 0x7010, &self.producer.to_le_bytes())
            .unwrap();
        Self::settle(session);
        let mut done = [0u8; 32];
        session.memory_read(slot, &mut done).unwrap();
        assert_eq!(
            layout::get_field(&done, "Descriptor", "RETVAL").unwrap(),
            0,
            "command {opcode:#x}"
        );
        done[8..].to_vec()
    }

    fn post_mailbox(&mut self, session: &mut Session, opcode: u64, tag: u64, in_param: u64) {
        let post = build(
            "PostMailbox",
            &[("IN_PARAM", in_param), ("CMD", opcode), ("TAG", tag), ("TOKEN", 0xFFFF)],
        );
        self.command(session, 0x8504, false, &post);
        let status = self.command(session, 0x8505, true, &[]);
        assert_eq!(
            layout::get_field(&status, "MailboxStatus", "STATUS").unwrap(),
            1,
            "mailbox {opcode:#x} tag {tag}"
        );
    }

    fn mailbox_with(&mut self, session: &mut Session, opcode: u64, tag: u64, context: &[u8], mask: Option<&[u8]>) {
        session.memory_write(self.mailbox_in, context).unwrap();
        if let Some(mask) = mask {
            session
                .memory_write(self.mailbox_in + context.len() as u64, mask)
                .unwrap();
        }
        self.post_mailbox(session, opcode, tag, self.mailbox_in);
    }

    /// Brings the device (IPv4 `ip`) up and creates a CEQ, a CQ, a memory region and an RC
    /// QP in RTS whose destination is QP 8 of the peer (MAC `peer_mac`, IPv4 `peer_ip`).
    pub fn bring_up(session: &mut Session, ip: [u8; 4], peer_mac: [u8; 6], peer_ip: [u8; 4]) -> Driver {
        let mut driver = Driver {
            next_free: DMA_BASE,
            ..Driver::default()
        };
        session.config_write(0x04, &0x6u16.to_le_bytes()).unwrap();
        session.config_write(0x82, &0x8000u16.to_le_bytes()).unwrap();
        for vector in 0..8u64 {
            session
                .bar_write(MSIX_BAR, 16 * vector, &0xFEE0_0000u32.to_le_bytes())
                .unwrap();
            session
                .bar_write(MSIX_BAR, 16 * vector + 8, &(vector as u32).to_le_bytes())
                .unwrap();
            session
                .bar_write(MSIX_BAR, 16 * vector + 12, &0u32.to_le_bytes())
                .unwrap();
        }
        driver.ring = driver.allocate(u64::from(RING_DEPTH) * 32);
        for (offset, value) in [
            (0x7000u64, driver.ring as u32),
            (0x7004, (driver.ring >> 32) as u32),
            (0x7008, RING_DEPTH / 8),
            (0x7014, 0),
            (0x7010, 0),
        ] {
            session.bar_write(CONTROL_BAR, offset, &value.to_le_bytes()).unwrap();
        }
        driver.mailbox_in = driver.allocate(4096);
        let attributes = build(
            "BaseAddressTableAttributes",
            &[
                ("QPC_BUF_PGSZ", 4),
                ("MPT_BUF_PGSZ", 4),
                ("CQC_BUF_PGSZ", 4),
                ("SRQC_BUF_PGSZ", 4),
            ],
        );
        driver.command(session, 0x8506, false, &attributes);
        let mut gid = build("GidEntry", &[("SGID_IDX", 0), ("SGID_TYPE", 1)]);
        gid[4 + 10] = 0xFF;
        gid[4 + 11] = 0xFF;
        gid[4 + 12..4 + 16].copy_from_slice(&ip);
        driver.command(session, 0x8500, false, &gid);
        for (opcode, tag) in [(0x00u64, u64::from(QPN)), (0x20, MPT_INDEX), (0x10, u64::from(CQN))] {
            let chunk = driver.allocate(64 * 1024);
            driver.post_mailbox(session, opcode, tag, chunk);
        }
        driver.ceq = driver.allocate(64 * 4);
        let eqc = build(
            "Eqc",
            &[("EQ_ST", 1), ("ARM_ST", 3), ("SHIFT", 6), ("EQE_BA", driver.ceq >> 3)],
        );
        driver.mailbox_with(session, 0x90, 0, &eqc, None);
        session.bar_write(CONTROL_BAR, 0x1300c, &1u32.to_le_bytes()).unwrap();

        driver.cq = driver.allocate(64 * 64);
        let cqc = build(
            "Cqc",
            &[
                ("CQN", u64::from(CQN)),
                ("CQ_ST", 1),
                ("SHIFT", 6),
                ("CQE_SIZE", 1),
                ("CQE_BA", driver.cq >> 3),
            ],
        );
        driver.mailbox_with(session, 0x16, u64::from(CQN), &cqc, None);
        driver.data = driver.allocate(8192);
        let mpt = build(
            "Mpt",
            &[
                ("MPT_ST", 1),
                ("PD", PD),
                ("LW_EN", 1),
                ("RW_EN", 1),
                ("RR_EN", 1),
                ("PA", 1),
                ("VA", driver.data),
                ("LEN", 8192),
                ("LKEY", MPT_INDEX << 8),
            ],
        );
        driver.mailbox_with(session, 0x0d, MPT_INDEX, &mpt, None);
        driver.qp = driver.allocate(2 * 4096);
        let mut qpc = build(
            "Qpc",
            &[
                ("QP_ST", 1),
                ("TST", 0),
                ("PD", PD),
                ("SQ_SHIFT", 6),
                ("RQ_SHIFT", 6),
                ("RQWS", 2),
                ("TX_CQN", u64::from(CQN)),
                ("RX_CQN", u64::from(CQN)),
                ("WQE_SGE_BA", driver.qp >> 3),
                ("MTU", 3),
                ("DQPN", u64::from(QPN)),
                ("HOPLIMIT", 64),
                ("VLAN_ID", 0xFFF),
                ("RAQ_PSN", 0xFF_FFFF),
                ("AT", 14),
                ("RETRY_NUM_INIT", 7),
                ("RETRY_CNT", 7),
                ("RNR_NUM_INIT", 7),
                ("RNR_CNT", 7),
                ("MIN_RNR_TIME", 1),
                ("SR_MAX", 4),
                ("RR_MAX", 4),
                ("RRE", 1),
                ("RWE", 1),
                ("FRE", 1),
            ],
        );
        qpc[44..50].copy_from_slice(&peer_mac);
        qpc[28 + 10] = 0xFF;
        qpc[28 + 11] = 0xFF;
        qpc[28 + 12..28 + 16].copy_from_slice(&peer_ip);
        let none = vec![0u8; qpc.len()];
        driver.mailbox_with(session, 0x41, u64::from(QPN), &qpc, Some(&none));
        for state in [2u64, 3] {
            let context = build("Qpc", &[("QP_ST", state)]);
            let mut mask = vec![0xFFu8; context.len()];
            layout::set_field(&mut mask, "Qpc", "QP_ST", 0).unwrap();
            driver.mailbox_with(session, 0x41, u64::from(QPN), &context, Some(&mask));
        }
        driver
    }

    /// Arms the CQ (a CEQE and an MSI-X follow its next CQE).
    pub fn arm_cq(&mut self, session: &mut Session, consumer_index: u32) {
        let word = CqDoorbell::arm(CQN, consumer_index, 1, false).as_u64();
        session.bar_write(DOORBELL_BAR, DB_OFFSET, &word.to_le_bytes()).unwrap();
    }

    /// Writes SQ WQE `index`: an RDMA WRITE of `length` bytes from the region's first
    /// half to the second half of the peer's (allocated at the same addresses).
    pub fn write_wqe(&mut self, session: &mut Session, index: u16, length: u32) {
        let payload: Vec<u8> = (0..length).map(|i| (i * 7 + 3) as u8).collect();
        session.memory_write(self.data, &payload).unwrap();
        let mut wqe = build(
            "RcSqWqe",
            &[
                ("OPCODE", 0x3),
                ("OWNER", u64::from((index / 64).is_multiple_of(2))),
                ("CQE", 1),
                ("MSG_LEN", u64::from(length)),
                ("SGE_NUM", 1),
                ("RKEY", MPT_INDEX << 8),
                ("VA", self.data + 4096),
            ],
        );
        wqe.resize(64, 0);
        let sge = build(
            "Sge",
            &[
                ("LEN", u64::from(length)),
                ("LKEY", MPT_INDEX << 8),
                ("ADDR", self.data),
            ],
        );
        wqe[32..32 + sge.len()].copy_from_slice(&sge);
        session
            .memory_write(self.qp + u64::from(index % 64) * 64, &wqe)
            .unwrap();
    }

    /// Rings the SQ doorbell: WQEs up to `index` are posted.
    pub fn ring_sq(&mut self, session: &mut Session, index: u16) {
        let word = Doorbell::sq(QPN, index + 1, 0).as_u64();
        session.bar_write(DOORBELL_BAR, DB_OFFSET, &word.to_le_bytes()).unwrap();
    }

    /// CQE `index` of the CQ as in host memory.
    pub fn cqe(&self, session: &Session, index: u32) -> Vec<u8> {
        let mut entry = vec![0u8; 64];
        session
            .memory_read(self.cq + u64::from(index % 64) * 64, &mut entry)
            .unwrap();
        entry
    }
}

/// Two devices brought up as each other's peer (QP 8 to QP 8), on one clock.
pub fn bring_up_pair(a: &mut Session, b: &mut Session) -> (Driver, Driver) {
    let driver_a = Driver::bring_up(a, IP_A, MAC_B, IP_B);
    let driver_b = Driver::bring_up(b, IP_B, MAC_A, IP_A);
    let now = Picoseconds(a.now().0.max(b.now().0));
    a.advance_to(now).unwrap();
    b.advance_to(now).unwrap();
    (driver_a, driver_b)
}

/// Device A's MAC (a session's default) and IPv4 address.
pub const MAC_A: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x01];
pub const IP_A: [u8; 4] = [10, 0, 0, 1];
/// Device B's, and its configuration.
pub const MAC_B: [u8; 6] = [0x02, 0x52, 0x4e, 0x49, 0x43, 0x02];
pub const IP_B: [u8; 4] = [10, 0, 0, 2];
pub const CONFIG_B: &str = "mac = \"02:52:4e:49:43:02\"";

/// Runs `a` and `b` on one clock, event by event, carrying the frames between their
/// ports, until nothing is pending. `on_time` is told the virtual time of what happens
/// next (a testbench's clock); `on_frame` sees each frame `a` transmits first.
pub fn run_linked(
    a: &mut Session,
    b: &mut Session,
    mut on_time: impl FnMut(Picoseconds),
    mut on_frame: impl FnMut(Picoseconds, &[u8]),
) {
    for _ in 0..100_000 {
        on_time(a.now());
        while let Some(frame) = a.poll_transmit() {
            on_frame(frame.time, &frame.frame);
            b.receive_frame(&frame.frame).unwrap();
        }
        while let Some(frame) = b.poll_transmit() {
            a.receive_frame(&frame.frame).unwrap();
        }
        let next = match (a.next_event_time(), b.next_event_time()) {
            (Some(x), Some(y)) => x.min(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) if a.peek_transmit().is_none() && b.peek_transmit().is_none() => return,
            (None, None) => continue,
        };
        on_time(next);
        a.advance_to(next).unwrap();
        b.advance_to(next).unwrap();
    }
    panic!("the linked sessions did not settle");
}

/// Host memory a testbench owns (1 MiB at [`DMA_BASE`]), served to a session through
/// callbacks; it logs the device's writes with the testbench's clock, as a monitor on an
/// RTL DUT's bus would, and can corrupt the writes to one address (a broken DUT).
#[derive(Debug, Clone, Default)]
pub struct TestbenchMemory(pub std::sync::Arc<std::sync::Mutex<MemoryState>>);

/// What [`TestbenchMemory`] holds.
#[derive(Debug, Default)]
pub struct MemoryState {
    pub bytes: Vec<u8>,
    /// The testbench's clock: the time stamped on the writes.
    pub clock: Picoseconds,
    /// Writes the device made: time, address, bytes.
    pub writes: Vec<(Picoseconds, u64, Vec<u8>)>,
    /// Whether device writes are logged (off while the testbench writes its own memory).
    pub monitor: bool,
    /// Writes the device makes to this address get byte `.1` XORed with `.2`.
    pub corrupt: Option<(u64, usize, u8)>,
    /// Reads the device made.
    pub reads: usize,
}

impl TestbenchMemory {
    pub fn new() -> Self {
        let memory = Self::default();
        memory.0.lock().unwrap().bytes = vec![0; 1 << 20];
        memory
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.0.lock().unwrap()
    }

    fn range(address: u64, length: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(address.checked_sub(DMA_BASE)?).ok()?;
        let end = start.checked_add(length)?;
        (end <= 1 << 20).then_some(start..end)
    }
}

impl rnic_vip::HostBus for TestbenchMemory {
    fn read(&mut self, address: u64, buffer: &mut [u8]) -> bool {
        let Some(range) = Self::range(address, buffer.len()) else {
            return false;
        };
        let mut state = self.state();
        state.reads += 1;
        buffer.copy_from_slice(&state.bytes[range]);
        true
    }

    fn write(&mut self, address: u64, data: &[u8]) -> bool {
        let Some(range) = Self::range(address, data.len()) else {
            return false;
        };
        let mut state = self.state();
        let mut data = data.to_vec();
        if let Some((at, byte, mask)) = state.corrupt {
            if at == address && byte < data.len() {
                data[byte] ^= mask;
            }
        }
        state.bytes[range].copy_from_slice(&data);
        if state.monitor {
            let clock = state.clock;
            state.writes.push((clock, address, data));
        }
        true
    }
}
