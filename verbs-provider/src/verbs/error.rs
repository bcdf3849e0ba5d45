//! Errors of the verbs API. Variants are named after the errno an ibverbs call returns in
//! the same situation ([`VerbsError::errno`] gives the number), and device failures keep
//! the command-queue return code or mailbox completion status that caused them.

use std::fmt;

use rnic_firmware_if::cmdq::ReturnCode;
use rnic_firmware_if::mailbox::MailboxCompletion;

use crate::device_access::AccessError;
use crate::driver::cmdq::CommandError;
use crate::driver::dma::MtrError;
use crate::driver::hem::HemError;
use crate::driver::mailbox::MailboxError;
use crate::driver::DriverError;

/// `EINVAL`.
pub const EINVAL: i32 = 22;
/// `ENOMEM`.
pub const ENOMEM: i32 = 12;
/// `EBUSY`.
pub const EBUSY: i32 = 16;
/// `EIO`.
pub const EIO: i32 = 5;
/// `EFAULT`.
pub const EFAULT: i32 = 14;
/// `ETIMEDOUT`.
pub const ETIMEDOUT: i32 = 110;
/// `EOPNOTSUPP`.
pub const EOPNOTSUPP: i32 = 95;
/// `EAGAIN`.
pub const EAGAIN: i32 = 11;

/// Why a verb failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// An argument is out of range or inconsistent (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No object number, memory or table space left (`ENOMEM`).
    #[error("out of resources: {0}")]
    OutOfResources(String),
    /// The object is still in use by another object (`EBUSY`).
    #[error("busy: {0}")]
    Busy(String),
    /// The operation or attribute is not supported (`EOPNOTSUPP`).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// A mailbox command failed; when the device answered, the error carries its
    /// [`MailboxCompletion`] (see [`VerbsError::mailbox_completion`]).
    #[error("{operation}: {source}")]
    Mailbox {
        /// The verb step that issued the command.
        operation: &'static str,
        /// The failure.
        #[source]
        source: MailboxError,
    },
    /// A command-queue command failed (carries the firmware [`ReturnCode`]).
    #[error("{operation}: {source}")]
    Command {
        /// The verb step that issued the command.
        operation: &'static str,
        /// The failure.
        #[source]
        source: CommandError,
    },
    /// A context-table operation failed.
    #[error("{operation}: {source}")]
    ContextTable {
        /// The verb step.
        operation: &'static str,
        /// The failure.
        #[source]
        source: HemError,
    },
    /// A translation table could not be built.
    #[error("{operation}: {source}")]
    Translation {
        /// The verb step.
        operation: &'static str,
        /// The failure.
        #[source]
        source: MtrError,
    },
    /// DMA memory could not be allocated or accessed.
    #[error("{operation}: {source}")]
    Memory {
        /// The verb step.
        operation: &'static str,
        /// The failure.
        #[source]
        source: AccessError,
    },
    /// Opening the device failed.
    #[error("device bring-up: {0}")]
    BringUp(#[source] DriverError),
    /// Something awaited from the device did not happen in time (`ETIMEDOUT`).
    #[error("timed out: {0}")]
    TimedOut(String),
    /// A work request completed with an error status (`EIO`), for helpers that wait for
    /// completions on the caller's behalf.
    #[error("work request {wr_id:#x} completed with {status:?}")]
    Completion {
        /// The work request.
        wr_id: u64,
        /// Its status.
        status: super::wr::WcStatus,
    },
}

impl VerbsError {
    /// The errno an ibverbs call would return.
    pub fn errno(&self) -> i32 {
        match self {
            Self::InvalidArgument(_) => EINVAL,
            Self::OutOfResources(_) => ENOMEM,
            Self::Busy(_) => EBUSY,
            Self::NotSupported(_) => EOPNOTSUPP,
            Self::Mailbox { source, .. } => mailbox_errno(source),
            Self::Command { source, .. } => command_errno(source),
            Self::ContextTable { source, .. } => match source {
                HemError::TableTooLarge { .. } | HemError::IndexOutOfRange { .. } => EINVAL,
                HemError::Memory { .. } => ENOMEM,
                HemError::Mailbox { source, .. } => mailbox_errno(source),
                HemError::NotInUse { .. } => EIO,
            },
            Self::Translation { source, .. } => match source {
                MtrError::Build(_) => EINVAL,
                MtrError::Memory(_) => ENOMEM,
            },
            Self::Memory { source, .. } => match source {
                AccessError::OutOfMemory { .. } => ENOMEM,
                AccessError::InvalidRequest { .. } => EINVAL,
                AccessError::Unsupported { .. } => EOPNOTSUPP,
                AccessError::Unmapped { .. } | AccessError::UnknownHandle { .. } => EFAULT,
            },
            Self::BringUp(_) => EIO,
            Self::TimedOut(_) => ETIMEDOUT,
            Self::Completion { .. } => EIO,
        }
    }

    /// The mailbox completion status the device reported, if this error is (or wraps) a
    /// failed mailbox command.
    pub fn mailbox_completion(&self) -> Option<MailboxCompletion> {
        match self {
            Self::Mailbox { source, .. } => source.completion(),
            Self::ContextTable {
                source: HemError::Mailbox { source, .. },
                ..
            } => source.completion(),
            Self::BringUp(DriverError::Mailbox(source)) => source.completion(),
            _ => None,
        }
    }

    /// The command-queue return code, if this error is (or wraps) a failed command.
    pub fn return_code(&self) -> Option<ReturnCode> {
        match self {
            Self::Command { source, .. } => source.return_code(),
            Self::Mailbox {
                source: MailboxError::Command { source, .. },
                ..
            } => source.return_code(),
            Self::BringUp(DriverError::Command(source)) => source.return_code(),
            _ => None,
        }
    }

    pub(crate) fn mailbox(operation: &'static str) -> impl FnOnce(MailboxError) -> Self {
        move |source| Self::Mailbox { operation, source }
    }

    pub(crate) fn context_table(operation: &'static str) -> impl FnOnce(HemError) -> Self {
        move |source| Self::ContextTable { operation, source }
    }

    pub(crate) fn translation(operation: &'static str) -> impl FnOnce(MtrError) -> Self {
        move |source| Self::Translation { operation, source }
    }

    pub(crate) fn memory(operation: &'static str) -> impl FnOnce(AccessError) -> Self {
        move |source| Self::Memory { operation, source }
    }
}

fn command_errno(error: &CommandError) -> i32 {
    match error {
        CommandError::Timeout { .. } => EAGAIN,
        CommandError::Failed { code, .. } => match code {
            ReturnCode::ParameterError | ReturnCode::InfoIllegal | ReturnCode::Invalid => EINVAL,
            ReturnCode::NoAuth => 1, // EPERM
            ReturnCode::NotExist => EOPNOTSUPP,
            _ => EIO,
        },
        CommandError::TooLong { .. } => EINVAL,
        CommandError::Memory(_) => ENOMEM,
        CommandError::ShutDown => EIO,
    }
}

fn mailbox_errno(error: &MailboxError) -> i32 {
    match error {
        MailboxError::Command { source, .. } => command_errno(source),
        MailboxError::Failed { status, .. } => match status {
            MailboxCompletion::InvalidIndex
            | MailboxCompletion::InvalidState
            | MailboxCompletion::InvalidParameter
            | MailboxCompletion::NoContextTable
            | MailboxCompletion::UnknownCommand => EINVAL,
            MailboxCompletion::DmaError => EFAULT,
            MailboxCompletion::None | MailboxCompletion::Success => EIO,
        },
        MailboxError::UnknownStatus { .. } => EIO,
        MailboxError::Timeout { .. } => ETIMEDOUT,
        MailboxError::Memory(_) => ENOMEM,
    }
}

/// A failed destroy. When the object is still alive (it is in use, [`VerbsError::Busy`])
/// it is handed back in `object`; when the teardown went ahead and only a device command
/// failed, the object is gone and `object` is `None`.
pub struct DestroyError<T> {
    /// Why.
    pub error: VerbsError,
    /// The object, if it is still alive.
    pub object: Option<T>,
}

impl<T> DestroyError<T> {
    pub(crate) fn busy(object: T, what: String) -> Self {
        Self {
            error: VerbsError::Busy(what),
            object: Some(object),
        }
    }

    pub(crate) fn gone(error: VerbsError) -> Self {
        Self { error, object: None }
    }

    /// The errno of the failure.
    pub fn errno(&self) -> i32 {
        self.error.errno()
    }
}

impl<T> fmt::Debug for DestroyError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestroyError")
            .field("error", &self.error)
            .field("object_alive", &self.object.is_some())
            .finish()
    }
}

impl<T> fmt::Display for DestroyError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        if self.object.is_some() {
            write!(f, " (the object is still alive)")?;
        }
        Ok(())
    }
}

impl<T> std::error::Error for DestroyError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Result of a verb.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;
