//! What the connection manager can be told, with Linux's values as defaults, and the IBA
//! time arithmetic Linux uses for its timers.

use crate::verbs::Mtu;

/// `CMA_CM_RESPONSE_TIMEOUT`: both CM response timeouts of a REQ (4.096 µs × 2^20 ≈ 4.3 s).
pub const CM_RESPONSE_TIMEOUT: u8 = 20;
/// `CMA_MAX_CM_RETRIES`: retransmissions of a REQ, REP, DREQ or SIDR_REQ.
pub const MAX_CM_RETRIES: u8 = 15;
/// Packet lifetime of a synthesised RoCE path. Linux 6.1 over rdma_rxe uses 18 (its REQs
/// carry local ACK timeout 19 and are repeated every 6.1 s; newer kernels use 16).
pub const PACKET_LIFETIME: u8 = 18;
/// `CMA_CM_MRA_SETTING`'s service timeout (4.096 µs × 2^24 ≈ 68.7 s).
pub const MRA_SERVICE_TIMEOUT: u8 = 24;
/// `RDMA_UDP_QKEY`: the Q_Key of UD QPs in the UDP and IB port spaces.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "the device's maximum" in a [`ConnParam`](super::ConnParam).
pub const MAX_RESOURCES: u8 = 0xFF;

/// Linux's `cm_convert_to_ms`: 4.096 µs × 2^n approximated as 2^(n−8) ms, in nanoseconds.
pub fn iba_time_ns(exponent: u8) -> u64 {
    (1u64 << exponent.saturating_sub(8).min(40)) * 1_000_000
}

/// Linux's `cm_ack_timeout`: the local ACK timeout for a peer's ACK delay and the path's
/// packet lifetime, max(ack delay, lifetime + 1) rounded up when the two are close.
pub fn ack_timeout(ca_ack_delay: u8, packet_lifetime: u8) -> u8 {
    let mut timeout = i32::from(packet_lifetime) + 1;
    let delay = i32::from(ca_ack_delay);
    if timeout >= delay {
        timeout += i32::from(delay >= timeout - 1);
    } else {
        timeout = delay + i32::from(timeout >= delay - 1);
    }
    timeout.min(31) as u8
}

/// The connection manager's configuration.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// Seed of the communication IDs, PSNs and ephemeral ports: the same seed gives the
    /// same run on virtual time. `None` seeds from the clock and the process id.
    pub seed: Option<u64>,
    /// CM response timeout sent in REQs (exponent, 4.096 µs × 2^n).
    pub cm_response_timeout: u8,
    /// Retransmissions of REQ, REP, DREQ and SIDR_REQ before giving up.
    pub max_cm_retries: u8,
    /// Packet lifetime of synthesised paths (exponent).
    pub packet_lifetime: u8,
    /// Service timeout of the MRAs this CM sends (exponent).
    pub mra_service_timeout: u8,
    /// Largest path MTU a route gets (the port's active MTU caps it too).
    pub max_path_mtu: Mtu,
    /// Hop limit (IPv4 TTL) of synthesised paths.
    pub hop_limit: u8,
    /// Receive buffers kept posted on each QP1.
    pub receive_buffers: u32,
    /// Send buffers of each QP1 (MADs beyond wait in a bounded backlog).
    pub send_buffers: u32,
    /// The high 32 bits of the transaction IDs this CM starts (Linux: its MAD agent's id).
    pub transaction_id_high: u32,
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            seed: None,
            cm_response_timeout: CM_RESPONSE_TIMEOUT,
            max_cm_retries: MAX_CM_RETRIES,
            packet_lifetime: PACKET_LIFETIME,
            mra_service_timeout: MRA_SERVICE_TIMEOUT,
            max_path_mtu: Mtu::Mtu4096,
            hop_limit: 64,
            receive_buffers: 256,
            send_buffers: 64,
            transaction_id_high: 1,
        }
    }
}

impl CmConfig {
    /// The default configuration with a fixed seed (reproducible runs).
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed: Some(seed),
            ..Self::default()
        }
    }
}

/// xorshift64*: the CM's deterministic source of identifiers.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// A seed from the clock and the process id, for runs that need no reproducibility.
    pub(crate) fn entropy() -> u64 {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        time ^ (u64::from(std::process::id()) << 32) ^ crate::device_access::monotonic_ns().rotate_left(17)
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_timer_arithmetic() {
        assert_eq!(iba_time_ns(20), 4096 * 1_000_000);
        assert_eq!(iba_time_ns(18), 1024 * 1_000_000);
        assert_eq!(iba_time_ns(3), 1_000_000, "below 8 Linux rounds to 1 ms");
        // The REQ interval Linux 6.1 showed on the wire: 2 × lifetime + response timeout.
        assert_eq!(2 * iba_time_ns(18) + iba_time_ns(20), 6144 * 1_000_000);
        assert_eq!(ack_timeout(15, 18), 19, "rxe's ACK delay 15, lifetime 18 (Linux 6.1)");
        assert_eq!(ack_timeout(15, 16), 17, "lifetime 16 (newer kernels)");
        assert_eq!(ack_timeout(20, 10), 20);
        assert_eq!(ack_timeout(12, 11), 13, "close values round up");
        assert_eq!(ack_timeout(31, 31), 31);
    }
}
