//! The 1024 bytes of data a Fabrics Connect carries (storage-and-cm.md B.6): who the host
//! is, which subsystem it wants and, on an I/O queue, which controller the queue joins.
//!
//! | Off | Size | Field |
//! |---|---|---|
//! | 0 | 16 | HOSTID (a UUID) |
//! | 16 | 2 | CNTLID: 0xFFFF on the admin queue ("any"), the allocated ID on I/O queues |
//! | 256 | 256 | SUBNQN, NUL-terminated |
//! | 512 | 256 | HOSTNQN, NUL-terminated |

use super::{emit_nul_terminated, fixed_view, le, parse_nul_terminated, WireError};

/// Bytes of Connect data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// The CNTLID an admin-queue Connect asks for under the dynamic controller model.
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Longest NQN the specification allows (bytes, without the NUL).
pub const MAX_NQN_LEN: usize = 223;

/// Byte offsets of the Connect data fields (also the IPO of a Connect Invalid Parameters).
pub mod offset {
    /// HOSTID.
    pub const HOSTID: u16 = 0;
    /// CNTLID.
    pub const CNTLID: u16 = 16;
    /// SUBNQN.
    pub const SUBNQN: u16 = 256;
    /// HOSTNQN.
    pub const HOSTNQN: u16 = 512;
}

mod field {
    use core::ops::Range;
    pub const HOSTID: Range<usize> = 0..16;
    pub const CNTLID: Range<usize> = 16..18;
    pub const SUBNQN: Range<usize> = 256..512;
    pub const HOSTNQN: Range<usize> = 512..768;
}

fixed_view!(
    /// A view of Connect data.
    ConnectData,
    "Connect data",
    1024
);

impl<T: AsRef<[u8]>> ConnectData<T> {
    /// Host identifier.
    pub fn hostid(&self) -> [u8; 16] {
        let mut id = [0u8; 16];
        id.copy_from_slice(&self.buffer.as_ref()[field::HOSTID]);
        id
    }
    /// Controller ID.
    pub fn cntlid(&self) -> u16 {
        le::u16(&self.buffer.as_ref()[field::CNTLID])
    }
    /// The raw SUBNQN field.
    pub fn subnqn(&self) -> &[u8] {
        &self.buffer.as_ref()[field::SUBNQN]
    }
    /// The raw HOSTNQN field.
    pub fn hostnqn(&self) -> &[u8] {
        &self.buffer.as_ref()[field::HOSTNQN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ConnectData<T> {
    /// Sets the host identifier.
    pub fn set_hostid(&mut self, value: &[u8; 16]) {
        self.buffer.as_mut()[field::HOSTID].copy_from_slice(value);
    }
    /// Sets the controller ID.
    pub fn set_cntlid(&mut self, value: u16) {
        le::set_u16(&mut self.buffer.as_mut()[field::CNTLID], value);
    }
    /// Sets SUBNQN (NUL-padded).
    pub fn set_subnqn(&mut self, value: &str) {
        emit_nul_terminated(&mut self.buffer.as_mut()[field::SUBNQN], value);
    }
    /// Sets HOSTNQN (NUL-padded).
    pub fn set_hostnqn(&mut self, value: &str) {
        emit_nul_terminated(&mut self.buffer.as_mut()[field::HOSTNQN], value);
    }
}

/// The content of Connect data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectDataRepr {
    /// Host identifier (a UUID).
    pub host_id: [u8; 16],
    /// Controller ID ([`CNTLID_DYNAMIC`] on the admin queue).
    pub cntlid: u16,
    /// The subsystem's NQN.
    pub subsystem_nqn: String,
    /// The host's NQN.
    pub host_nqn: String,
}

impl ConnectDataRepr {
    /// Reads Connect data. An NQN must be printable ASCII, end in a NUL inside its
    /// 256-byte field, and be at most 223 bytes long.
    ///
    /// # Errors
    /// [`WireError::Truncated`] below 1024 bytes; [`WireError::Malformed`] with field
    /// "SUBNQN" or "HOSTNQN".
    pub fn parse<T: AsRef<[u8]> + ?Sized>(view: &ConnectData<&T>) -> Result<Self, WireError> {
        view.check_len()?;
        let nqn = |name: &'static str, field: &[u8]| -> Result<String, WireError> {
            let value = parse_nul_terminated("Connect data", name, field)?;
            if value.is_empty() || value.len() > MAX_NQN_LEN {
                return Err(WireError::Malformed {
                    format: "Connect data",
                    field: name,
                    value: value.len() as u64,
                });
            }
            Ok(value)
        };
        Ok(Self {
            host_id: view.hostid(),
            cntlid: view.cntlid(),
            subsystem_nqn: nqn("SUBNQN", view.subnqn())?,
            host_nqn: nqn("HOSTNQN", view.hostnqn())?,
        })
    }

    /// Writes the 1024 bytes, reserved bytes zero.
    ///
    /// # Panics
    /// If the buffer is shorter than 1024 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, view: &mut ConnectData<&mut T>) {
        view.buffer.as_mut()[..CONNECT_DATA_LEN].fill(0);
        view.set_hostid(&self.host_id);
        view.set_cntlid(self.cntlid);
        view.set_subnqn(&self.subsystem_nqn);
        view.set_hostnqn(&self.host_nqn);
    }

    /// The 1024 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; CONNECT_DATA_LEN];
        self.emit(&mut ConnectData::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Parses Connect data from bytes (the fuzzing entry point).
///
/// # Errors
/// As [`ConnectDataRepr::parse`].
pub fn parse_connect_data(bytes: &[u8]) -> Result<ConnectDataRepr, WireError> {
    ConnectDataRepr::parse(&ConnectData::new_checked(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBNQN: &str = "nqn.2024-01.io.example:sub1";
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

    /// The reference builder's admin Connect data (Appendix): HOSTID 00..0f, CNTLID
    /// 0xFFFF, its SUBNQN and HOSTNQN.
    fn known_bytes() -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        for (i, byte) in b[0..16].iter_mut().enumerate() {
            *byte = i as u8;
        }
        b[16] = 0xFF;
        b[17] = 0xFF;
        b[256..256 + SUBNQN.len()].copy_from_slice(SUBNQN.as_bytes());
        b[512..512 + HOSTNQN.len()].copy_from_slice(HOSTNQN.as_bytes());
        b
    }

    fn known_repr() -> ConnectDataRepr {
        ConnectDataRepr {
            host_id: core::array::from_fn(|i| i as u8),
            cntlid: CNTLID_DYNAMIC,
            subsystem_nqn: SUBNQN.into(),
            host_nqn: HOSTNQN.into(),
        }
    }

    #[test]
    fn parses_known_bytes() {
        assert_eq!(parse_connect_data(&known_bytes()).unwrap(), known_repr());
    }

    #[test]
    fn emits_known_bytes() {
        let mut bytes = vec![0x55u8; 1024];
        known_repr().emit(&mut ConnectData::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, known_bytes());
    }

    #[test]
    fn round_trips() {
        for length in [1, 16, 100, MAX_NQN_LEN] {
            let repr = ConnectDataRepr {
                host_id: [length as u8; 16],
                cntlid: length as u16,
                subsystem_nqn: "s".repeat(length),
                host_nqn: "h".repeat(length),
            };
            assert_eq!(parse_connect_data(&repr.to_bytes()).unwrap(), repr);
        }
    }

    #[test]
    fn refuses_bad_nqns() {
        let malformed = |bytes: &[u8]| match parse_connect_data(bytes) {
            Err(WireError::Malformed { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        // No NUL in the field.
        let mut bytes = known_bytes();
        bytes[256..512].fill(b'a');
        assert_eq!(malformed(&bytes), "SUBNQN");
        // Empty.
        let mut bytes = known_bytes();
        bytes[512..768].fill(0);
        assert_eq!(malformed(&bytes), "HOSTNQN");
        // Longer than 223 bytes.
        let mut bytes = known_bytes();
        bytes[512..512 + 224].fill(b'h');
        assert_eq!(malformed(&bytes), "HOSTNQN");
        // A control byte.
        let mut bytes = known_bytes();
        bytes[260] = 0x07;
        assert_eq!(malformed(&bytes), "SUBNQN");
    }

    #[test]
    fn rejects_truncated_input() {
        let bytes = known_bytes();
        for len in [0, 16, 255, 511, 767, 1023] {
            assert!(matches!(
                parse_connect_data(&bytes[..len]),
                Err(WireError::Truncated { needed: 1024, .. })
            ));
        }
    }
}
