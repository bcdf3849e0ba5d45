//! Why a connection-manager call failed, with the errno librdmacm would set.

use crate::verbs::VerbsError;

/// A refused connection-manager call.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// An argument is out of range or inconsistent (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The id is not in a state that allows the operation (`EINVAL`).
    #[error("{operation} is not possible while the id is {state}")]
    InvalidState {
        /// The operation (`connect`, `accept`, …).
        operation: &'static str,
        /// The id's state, in words.
        state: String,
    },
    /// The id was destroyed, or its connection manager is gone (`EINVAL`).
    #[error("the id no longer exists")]
    NoSuchId,
    /// No device serves the address (`ENODEV` / `EADDRNOTAVAIL`).
    #[error("no device has address {0}")]
    AddressNotAvailable(String),
    /// Another id is bound to the address and port (`EADDRINUSE`).
    #[error("address {0} in use")]
    AddressInUse(String),
    /// The address and another id's overlap through a wildcard on the same port, and not
    /// both are family-only (`EADDRNOTAVAIL`, as Linux's `cma_check_port`).
    #[error("address {address} overlaps {other} on the same port")]
    AddressOverlaps {
        /// The address asked for.
        address: String,
        /// The other id's address.
        other: String,
    },
    /// No device at all (`ENODEV`).
    #[error("no device: {0}")]
    NoDevice(String),
    /// Resources ran out: ports, identifiers (`ENOMEM`).
    #[error("out of resources: {0}")]
    OutOfResources(String),
    /// The id already has a QP (`EEXIST`... librdmacm returns `EINVAL`).
    #[error("the id already has a QP")]
    QpExists,
    /// The verbs layer refused a step (QP creation or modification, memory).
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    /// An OS call failed (the event channel's descriptor).
    #[error("os: {0}")]
    Os(#[from] std::io::Error),
}

/// `EINVAL`.
pub const EINVAL: i32 = 22;
/// `ENODEV`.
pub const ENODEV: i32 = 19;
/// `ENOMEM`.
pub const ENOMEM: i32 = 12;
/// `EADDRINUSE`.
pub const EADDRINUSE: i32 = 98;
/// `EADDRNOTAVAIL`.
pub const EADDRNOTAVAIL: i32 = 99;
/// `ETIMEDOUT`.
pub const ETIMEDOUT: i32 = 110;
/// `ECONNREFUSED`.
pub const ECONNREFUSED: i32 = 111;
/// `EHOSTUNREACH`.
pub const EHOSTUNREACH: i32 = 113;
/// `ENETUNREACH`.
pub const ENETUNREACH: i32 = 101;

impl CmError {
    /// The errno librdmacm sets for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            Self::InvalidArgument(_) | Self::InvalidState { .. } | Self::NoSuchId | Self::QpExists => EINVAL,
            Self::AddressNotAvailable(_) | Self::AddressOverlaps { .. } => EADDRNOTAVAIL,
            Self::AddressInUse(_) => EADDRINUSE,
            Self::NoDevice(_) => ENODEV,
            Self::OutOfResources(_) => ENOMEM,
            Self::Verbs(e) => e.errno(),
            Self::Os(e) => e.raw_os_error().unwrap_or(EINVAL),
        }
    }
}

/// `Result` with [`CmError`].
pub type Result<T, E = CmError> = std::result::Result<T, E>;
