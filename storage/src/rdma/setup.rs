//! What the command-line tools share to get a NIC and a connection manager going.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rnic_verbs::cm::{CmConfig, KernelNeighbours, NeighbourResolver, StandInNeighbours, StaticNeighbours};
use rnic_verbs::Context;

use super::{Connector, ExchangeCm, Listener, RcPathConfig, RdmaCm, ServiceAddress};

/// Opens the NIC named by `device` (`vfio-user:PATH[,mac=MAC]`, `pci[:BDF]`, `embedded`)
/// with `ip` as GID 0's address.
///
/// # Errors
/// The device string or the bring-up, as text.
pub fn open_context(device: &str, ip: Option<Ipv4Addr>) -> Result<Context, String> {
    let access = rnic_verbs::backend::open_device(device).map_err(|e| format!("{device}: {e}"))?;
    let driver = rnic_verbs::driver::DriverConfig {
        ipv4_address: ip.map(|ip| ip.octets()),
        ..rnic_verbs::driver::DriverConfig::default()
    };
    Context::open_with_config(access, &driver).map_err(|e| format!("{device}: {e}"))
}

/// A neighbour resolver by name: `kernel` (ARP through the host kernel: `rnic-emu --net
/// eth:`), `udp` (the stand-in MACs of `rnic-emu --net udp:`), or `IP=MAC[,IP=MAC…]`.
///
/// # Errors
/// An unknown name or a malformed table.
pub fn neighbours(spec: &str) -> Result<Arc<dyn NeighbourResolver>, String> {
    match spec {
        "kernel" => Ok(Arc::new(KernelNeighbours::new())),
        "udp" => Ok(Arc::new(StandInNeighbours)),
        table => {
            let resolver = StaticNeighbours::new();
            for entry in table.split(',') {
                let (ip, mac) = entry
                    .split_once('=')
                    .ok_or_else(|| format!("neighbours {spec:?}: kernel, udp or IP=MAC,..."))?;
                let ip: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
                let mac = rnic_verbs::backend::vfio_user::parse_mac(mac).ok_or_else(|| format!("bad MAC {mac:?}"))?;
                resolver.insert(ip, mac);
            }
            Ok(Arc::new(resolver))
        }
    }
}

/// Which connection manager a tool uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmChoice {
    /// The RDMA CM on QP1 (interoperates with Linux), finding MACs with the named resolver.
    Rdma {
        /// [`neighbours`] spec.
        neighbours: String,
    },
    /// The TCP exchange between processes of ours.
    Exchange,
}

impl CmChoice {
    /// `rdma` or `exchange`, with the neighbour spec for `rdma`.
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(cm: &str, neighbours: &str) -> Result<Self, String> {
        match cm {
            "rdma" => Ok(CmChoice::Rdma {
                neighbours: neighbours.into(),
            }),
            "exchange" => Ok(CmChoice::Exchange),
            other => Err(format!("--cm {other}: rdma or exchange")),
        }
    }

    fn rdma(context: &Context, neighbours: &str) -> Result<RdmaCm, String> {
        RdmaCm::new(context, self::neighbours(neighbours)?, CmConfig::default()).map_err(|e| e.to_string())
    }

    /// A listener on `address` for a target on `context`.
    ///
    /// # Errors
    /// As text.
    pub fn listen(
        &self,
        context: &Context,
        path: RcPathConfig,
        address: ServiceAddress,
    ) -> Result<Box<dyn Listener>, String> {
        match self {
            CmChoice::Rdma { neighbours } => Ok(Box::new(
                Self::rdma(context, neighbours)?
                    .listen(address)
                    .map_err(|e| e.to_string())?,
            )),
            CmChoice::Exchange => Ok(Box::new(
                ExchangeCm::new(path).listen(address).map_err(|e| e.to_string())?,
            )),
        }
    }

    /// A connector for a host on `context`.
    ///
    /// # Errors
    /// As text.
    pub fn connector(&self, context: &Context, path: RcPathConfig) -> Result<Box<dyn Connector>, String> {
        match self {
            CmChoice::Rdma { neighbours } => Ok(Box::new(Self::rdma(context, neighbours)?.connector())),
            CmChoice::Exchange => Ok(Box::new(ExchangeCm::new(path).connector())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbour_specs() {
        assert!(neighbours("kernel").is_ok());
        assert!(neighbours("udp").is_ok());
        let table = neighbours("10.0.0.2=52:54:00:77:00:02").unwrap();
        assert_eq!(
            table.resolve("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()),
            rnic_verbs::cm::Neighbour::Known([0x52, 0x54, 0, 0x77, 0, 2])
        );
        assert!(neighbours("10.0.0.2").is_err());
        assert!(neighbours("10.0.0.2=zz").is_err());
        assert!(CmChoice::parse("carrier-pigeon", "kernel").is_err());
    }
}
