//! The RDMA-CM IP header: the first 36 bytes of the private data of a REQ or SIDR_REQ whose
//! Service ID is an RDMA-CM one (`00 00 00 00 01` ‖ port space ‖ port), network order.
//!
//! ```text
//!  0 CMA version (0)   1 IP version 7:4 (4 or 6) · reserved   2 source port (2)
//!  4 source IP (16): IPv6, or IPv4 in bytes 16..20 with bytes 4..16 zero
//! 20 destination IP (16): the same rule, IPv4 in bytes 32..36
//! ```
//!
//! The destination port is the low 16 bits of the Service ID.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{be, view, MadError};

/// Bytes of the header.
pub const CMA_HEADER_LEN: usize = 36;
/// The CMA version Linux sends and accepts (a REQ with another one is ignored).
pub const CMA_VERSION: u8 = 0x00;

mod field {
    use core::ops::Range;
    pub const CMA_VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const SOURCE_PORT: Range<usize> = 2..4;
    pub const SOURCE_IP: Range<usize> = 4..20;
    pub const DESTINATION_IP: Range<usize> = 20..36;
}

view!("RDMA-CM IP header", CMA_HEADER_LEN);

/// RDMA-CM port spaces (`enum rdma_ucm_port_space`): the third byte pair of a Service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib,
    /// `RDMA_PS_TCP` (0x0106): connected QPs (RC), REQ/REP/RTU.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD QPs, SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): RC or UD.
    Ib,
}

impl PortSpace {
    /// The 16-bit code.
    pub fn code(self) -> u16 {
        match self {
            Self::Ipoib => 0x0002,
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
            Self::Ib => 0x013F,
        }
    }

    /// The port space of a code.
    pub fn from_code(code: u16) -> Option<Self> {
        match code {
            0x0002 => Some(Self::Ipoib),
            0x0106 => Some(Self::Tcp),
            0x0111 => Some(Self::Udp),
            0x013F => Some(Self::Ib),
            _ => None,
        }
    }

    /// The Service ID of `port` in this space: `(space << 16) | port`, upper 32 bits zero
    /// (TCP 4420 → 0x0000_0000_0106_1144).
    pub fn service_id(self, port: u16) -> u64 {
        (u64::from(self.code()) << 16) | u64::from(port)
    }

    /// The port space and port of an RDMA-CM Service ID, `None` for any other Service ID.
    pub fn split_service_id(service_id: u64) -> Option<(Self, u16)> {
        if service_id >> 32 != 0 {
            return None;
        }
        Self::from_code((service_id >> 16) as u16).map(|space| (space, service_id as u16))
    }
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// CMA version.
    pub fn cma_version(&self) -> u8 {
        self.buffer.as_ref()[field::CMA_VERSION]
    }
    /// IP version (4 bits).
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[field::IP_VERSION] >> 4
    }
    /// Source port.
    pub fn source_port(&self) -> u16 {
        be::u16(&self.buffer.as_ref()[field::SOURCE_PORT])
    }
    /// Source IP field (16 bytes).
    pub fn source_ip(&self) -> [u8; 16] {
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&self.buffer.as_ref()[field::SOURCE_IP]);
        ip
    }
    /// Destination IP field (16 bytes).
    pub fn destination_ip(&self) -> [u8; 16] {
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&self.buffer.as_ref()[field::DESTINATION_IP]);
        ip
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the CMA version.
    pub fn set_cma_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CMA_VERSION] = value;
    }
    /// Sets the IP version (the reserved low nibble becomes zero).
    pub fn set_ip_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::IP_VERSION] = value << 4;
    }
    /// Sets the source port.
    pub fn set_source_port(&mut self, value: u16) {
        be::set_u16(&mut self.buffer.as_mut()[field::SOURCE_PORT], value);
    }
    /// Sets the source IP field.
    pub fn set_source_ip(&mut self, value: &[u8; 16]) {
        self.buffer.as_mut()[field::SOURCE_IP].copy_from_slice(value);
    }
    /// Sets the destination IP field.
    pub fn set_destination_ip(&mut self, value: &[u8; 16]) {
        self.buffer.as_mut()[field::DESTINATION_IP].copy_from_slice(value);
    }
}

/// The semantic content of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// The active side's address and RDMA-CM port.
    pub source: SocketAddr,
    /// The address the active side connects to (its port is in the Service ID).
    pub destination: IpAddr,
}

fn ip_field(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut field = [0u8; 16];
            field[12..].copy_from_slice(&v4.octets());
            field
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHeaderRepr {
    /// Reads the header.
    ///
    /// # Errors
    /// [`MadError::Truncated`]; [`MadError::Malformed`] for a CMA version other than 0
    /// or an IP version other than 4 and 6.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, MadError> {
        packet.check_len()?;
        if packet.cma_version() != CMA_VERSION {
            return Err(MadError::Malformed {
                layer: "RDMA-CM IP header",
                field: "CMA version",
                value: u64::from(packet.cma_version()),
            });
        }
        let (source, destination) = match packet.ip_version() {
            4 => {
                let v4 = |field: [u8; 16]| IpAddr::V4(Ipv4Addr::new(field[12], field[13], field[14], field[15]));
                (v4(packet.source_ip()), v4(packet.destination_ip()))
            }
            6 => (
                IpAddr::V6(Ipv6Addr::from(packet.source_ip())),
                IpAddr::V6(Ipv6Addr::from(packet.destination_ip())),
            ),
            other => {
                return Err(MadError::Malformed {
                    layer: "RDMA-CM IP header",
                    field: "IP version",
                    value: u64::from(other),
                })
            }
        };
        Ok(Self {
            source: SocketAddr::new(source, packet.source_port()),
            destination,
        })
    }

    /// Writes every byte of the header. Source and destination should be of one family;
    /// the IP version follows the source.
    ///
    /// # Panics
    /// If the buffer is shorter than 36 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_cma_version(CMA_VERSION);
        packet.set_ip_version(if self.source.is_ipv4() { 4 } else { 6 });
        packet.set_source_port(self.source.port());
        packet.set_source_ip(&ip_field(self.source.ip()));
        packet.set_destination_ip(&ip_field(self.destination));
    }
}
