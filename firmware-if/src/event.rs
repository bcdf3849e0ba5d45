//! Asynchronous event types and sub-types (reference sheet §9.2), carried in the
//! `EVENT_TYPE` / `SUB_TYPE` bytes of an AEQE ([`crate::eqe::Aeqe`]).

/// Why an event byte could not be interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// `EVENT_TYPE` is not a §9.2 event (0x00, 0x0E, 0x10, 0x11 and ≥ 0x18 are not).
    #[error("unknown async event type {0:#x}")]
    UnknownEventType(u8),
    /// Unknown sub-type of a WQ catastrophic error (0x05).
    #[error("unknown WQ catastrophic error sub-type {0:#x}")]
    UnknownWqCatastrophicSubtype(u8),
    /// Unknown sub-type of a local access violation (0x07).
    #[error("unknown local access violation sub-type {0:#x}")]
    UnknownLocalAccessSubtype(u8),
    /// Unknown sub-type of a doorbell overflow (0x12).
    #[error("unknown doorbell overflow sub-type {0:#x}")]
    UnknownDbOverflowSubtype(u8),
}

/// What an asynchronous event is about: where the driver routes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventObject {
    /// A QP; `EVENT_QUEUE_NUM` is its QPN.
    Qp,
    /// A CQ; `EVENT_QUEUE_NUM` is its CQN.
    Cq,
    /// An SRQ; `EVENT_QUEUE_NUM` is its SRQN.
    Srq,
    /// The port.
    Port,
    /// The device as a whole (logged or handled by the driver itself).
    Device,
    /// An event-mode mailbox command (read the entry as [`crate::eqe::AeqeMailbox`]).
    Mailbox,
}

/// Asynchronous event types (`enum hns_roce_event`, §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AsyncEventType {
    /// Path migrated (QP, IB_EVENT_PATH_MIG).
    PathMig = 0x01,
    /// Path migration failed (QP, PATH_MIG_ERR).
    PathMigFailed = 0x02,
    /// Communication established (QP, COMM_EST).
    CommEst = 0x03,
    /// Send queue drained (QP, SQ_DRAINED).
    SqDrained = 0x04,
    /// Work queue catastrophic error (QP, QP_FATAL, flush); sub-type [`WqCatastrophicSubtype`].
    WqCatasError = 0x05,
    /// Invalid request local work queue error (QP, QP_REQ_ERR, flush).
    InvReqLocalWqError = 0x06,
    /// Local access violation work queue error (QP, QP_ACCESS_ERR, flush); sub-type
    /// [`LocalAccessSubtype`].
    LocalWqAccessError = 0x07,
    /// SRQ limit reached (SRQ, SRQ_LIMIT_REACHED).
    SrqLimitReach = 0x08,
    /// Last WQE reached on a QP attached to an SRQ (QP, QP_LAST_WQE_REACHED).
    SrqLastWqeReach = 0x09,
    /// SRQ catastrophic error (SRQ, SRQ_ERR).
    SrqCatasError = 0x0A,
    /// CQ access error (CQ, CQ_ERR).
    CqAccessError = 0x0B,
    /// CQ overflow (CQ, CQ_ERR).
    CqOverflow = 0x0C,
    /// Invalid CQ id (CQ).
    CqIdInvalid = 0x0D,
    /// Port state change (port).
    PortChange = 0x0F,
    /// Doorbell queue overflow (logged); sub-type [`DbOverflowSubtype`].
    DbOverflow = 0x12,
    /// Mailbox command completion (event-mode commands).
    Mb = 0x13,
    /// CEQ overflow (older headers).
    CeqOverflow = 0x14,
    /// Function-level reset.
    Flr = 0x15,
    /// XRC domain violation (QP, QP_ACCESS_ERR, flush).
    XrcdViolation = 0x16,
    /// Invalid XRC extended transport header (QP, QP_ACCESS_ERR, flush).
    InvalidXrceth = 0x17,
}

impl AsyncEventType {
    /// Every event type, in value order.
    pub const ALL: [AsyncEventType; 20] = [
        Self::PathMig,
        Self::PathMigFailed,
        Self::CommEst,
        Self::SqDrained,
        Self::WqCatasError,
        Self::InvReqLocalWqError,
        Self::LocalWqAccessError,
        Self::SrqLimitReach,
        Self::SrqLastWqeReach,
        Self::SrqCatasError,
        Self::CqAccessError,
        Self::CqOverflow,
        Self::CqIdInvalid,
        Self::PortChange,
        Self::DbOverflow,
        Self::Mb,
        Self::CeqOverflow,
        Self::Flr,
        Self::XrcdViolation,
        Self::InvalidXrceth,
    ];

    /// The kind of object the event is routed to (§9.2 "routed to" column). Events the
    /// sheet lists as logged or device-wide (DB_OVERFLOW, CEQ_OVERFLOW, FLR) are
    /// [`EventObject::Device`].
    pub fn object_kind(self) -> EventObject {
        match self {
            Self::PathMig
            | Self::PathMigFailed
            | Self::CommEst
            | Self::SqDrained
            | Self::WqCatasError
            | Self::InvReqLocalWqError
            | Self::LocalWqAccessError
            | Self::SrqLastWqeReach
            | Self::XrcdViolation
            | Self::InvalidXrceth => EventObject::Qp,
            Self::SrqLimitReach | Self::SrqCatasError => EventObject::Srq,
            Self::CqAccessError | Self::CqOverflow | Self::CqIdInvalid => EventObject::Cq,
            Self::PortChange => EventObject::Port,
            Self::DbOverflow | Self::CeqOverflow | Self::Flr => EventObject::Device,
            Self::Mb => EventObject::Mailbox,
        }
    }

    /// Whether the driver answers this QP event by moving the QP to error and flushing its
    /// outstanding WQEs (§12.2: events 0x05, 0x06, 0x07, 0x16, 0x17).
    pub fn flushes_qp(self) -> bool {
        matches!(
            self,
            Self::WqCatasError
                | Self::InvReqLocalWqError
                | Self::LocalWqAccessError
                | Self::XrcdViolation
                | Self::InvalidXrceth
        )
    }
}

impl From<AsyncEventType> for u8 {
    fn from(value: AsyncEventType) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for AsyncEventType {
    type Error = EventError;

    fn try_from(value: u8) -> Result<Self, EventError> {
        Self::ALL
            .into_iter()
            .find(|e| *e as u8 == value)
            .ok_or(EventError::UnknownEventType(value))
    }
}

/// Sub-types of [`AsyncEventType::WqCatasError`] (0x05).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WqCatastrophicSubtype {
    /// QP context error.
    QpcError = 1,
    /// MTU error.
    MtuError = 2,
    /// WQE base-address (BA) error.
    WqeBaAddrError = 3,
    /// WQE address error.
    WqeAddrError = 4,
    /// SQ WQE shift error.
    SqWqeShiftError = 5,
    /// Service level error.
    SlError = 6,
    /// Port error.
    PortError = 7,
}

impl WqCatastrophicSubtype {
    /// Every sub-type, in value order.
    pub const ALL: [WqCatastrophicSubtype; 7] = [
        Self::QpcError,
        Self::MtuError,
        Self::WqeBaAddrError,
        Self::WqeAddrError,
        Self::SqWqeShiftError,
        Self::SlError,
        Self::PortError,
    ];
}

impl From<WqCatastrophicSubtype> for u8 {
    fn from(value: WqCatastrophicSubtype) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for WqCatastrophicSubtype {
    type Error = EventError;

    fn try_from(value: u8) -> Result<Self, EventError> {
        Self::ALL
            .into_iter()
            .find(|s| *s as u8 == value)
            .ok_or(EventError::UnknownWqCatastrophicSubtype(value))
    }
}

/// Sub-types of [`AsyncEventType::LocalWqAccessError`] (0x07).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LocalAccessSubtype {
    /// R_Key violation.
    RkeyViolation = 1,
    /// Length error.
    LengthError = 2,
    /// Virtual address error.
    VaError = 3,
    /// Protection domain error.
    PdError = 4,
    /// Read/write access error.
    RwAccessError = 5,
    /// Key state error.
    KeyStateError = 6,
    /// Memory region operation error.
    MrOperationError = 7,
}

impl LocalAccessSubtype {
    /// Every sub-type, in value order.
    pub const ALL: [LocalAccessSubtype; 7] = [
        Self::RkeyViolation,
        Self::LengthError,
        Self::VaError,
        Self::PdError,
        Self::RwAccessError,
        Self::KeyStateError,
        Self::MrOperationError,
    ];
}

impl From<LocalAccessSubtype> for u8 {
    fn from(value: LocalAccessSubtype) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for LocalAccessSubtype {
    type Error = EventError;

    fn try_from(value: u8) -> Result<Self, EventError> {
        Self::ALL
            .into_iter()
            .find(|s| *s as u8 == value)
            .ok_or(EventError::UnknownLocalAccessSubtype(value))
    }
}

/// Sub-types of [`AsyncEventType::DbOverflow`] (0x12). SDB = send doorbell queue,
/// ODB = other doorbells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DbOverflowSubtype {
    /// Send doorbell queue overflowed.
    SdbOverflow = 1,
    /// Send doorbell queue almost full.
    SdbAlmostOverflow = 2,
    /// Other-doorbell queue overflowed.
    OdbOverflow = 3,
    /// Other-doorbell queue almost full.
    OdbAlmostOverflow = 4,
    /// Send doorbell queue almost empty.
    SdbAlmostEmpty = 5,
    /// Other-doorbell queue almost empty.
    OdbAlmostEmpty = 6,
}

impl DbOverflowSubtype {
    /// Every sub-type, in value order.
    pub const ALL: [DbOverflowSubtype; 6] = [
        Self::SdbOverflow,
        Self::SdbAlmostOverflow,
        Self::OdbOverflow,
        Self::OdbAlmostOverflow,
        Self::SdbAlmostEmpty,
        Self::OdbAlmostEmpty,
    ];
}

impl From<DbOverflowSubtype> for u8 {
    fn from(value: DbOverflowSubtype) -> u8 {
        value as u8
    }
}

impl TryFrom<u8> for DbOverflowSubtype {
    type Error = EventError;

    fn try_from(value: u8) -> Result<Self, EventError> {
        Self::ALL
            .into_iter()
            .find(|s| *s as u8 == value)
            .ok_or(EventError::UnknownDbOverflowSubtype(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_have_the_hns_values_and_routes() {
        use EventObject::*;
        let table = [
            (0x01, AsyncEventType::PathMig, Qp),
            (0x02, AsyncEventType::PathMigFailed, Qp),
            (0x03, AsyncEventType::CommEst, Qp),
            (0x04, AsyncEventType::SqDrained, Qp),
            (0x05, AsyncEventType::WqCatasError, Qp),
            (0x06, AsyncEventType::InvReqLocalWqError, Qp),
            (0x07, AsyncEventType::LocalWqAccessError, Qp),
            (0x08, AsyncEventType::SrqLimitReach, Srq),
            (0x09, AsyncEventType::SrqLastWqeReach, Qp),
            (0x0A, AsyncEventType::SrqCatasError, Srq),
            (0x0B, AsyncEventType::CqAccessError, Cq),
            (0x0C, AsyncEventType::CqOverflow, Cq),
            (0x0D, AsyncEventType::CqIdInvalid, Cq),
            (0x0F, AsyncEventType::PortChange, Port),
            (0x12, AsyncEventType::DbOverflow, Device),
            (0x13, AsyncEventType::Mb, Mailbox),
            (0x14, AsyncEventType::CeqOverflow, Device),
            (0x15, AsyncEventType::Flr, Device),
            (0x16, AsyncEventType::XrcdViolation, Qp),
            (0x17, AsyncEventType::InvalidXrceth, Qp),
        ];
        assert_eq!(table.len(), AsyncEventType::ALL.len());
        for (value, event, object) in table {
            assert_eq!(u8::from(event), value);
            assert_eq!(AsyncEventType::try_from(value), Ok(event));
            assert_eq!(event.object_kind(), object, "{event:?}");
        }
    }

    #[test]
    fn unknown_and_unused_event_types_are_rejected() {
        for value in [0x00, 0x0E, 0x10, 0x11, 0x18, 0xFF] {
            assert_eq!(
                AsyncEventType::try_from(value),
                Err(EventError::UnknownEventType(value))
            );
        }
        for value in 0..=u8::MAX {
            let known = AsyncEventType::ALL.iter().any(|e| *e as u8 == value);
            assert_eq!(AsyncEventType::try_from(value).is_ok(), known, "{value:#x}");
        }
    }

    #[test]
    fn flushing_events_are_the_qp_error_events() {
        let flushing: Vec<u8> = AsyncEventType::ALL
            .into_iter()
            .filter(|e| e.flushes_qp())
            .map(u8::from)
            .collect();
        assert_eq!(flushing, [0x05, 0x06, 0x07, 0x16, 0x17]);
        assert!(AsyncEventType::ALL
            .into_iter()
            .filter(|e| e.flushes_qp())
            .all(|e| e.object_kind() == EventObject::Qp));
    }

    #[test]
    fn wq_catastrophic_subtypes_are_1_to_7() {
        let table = [
            (1, WqCatastrophicSubtype::QpcError),
            (2, WqCatastrophicSubtype::MtuError),
            (3, WqCatastrophicSubtype::WqeBaAddrError),
            (4, WqCatastrophicSubtype::WqeAddrError),
            (5, WqCatastrophicSubtype::SqWqeShiftError),
            (6, WqCatastrophicSubtype::SlError),
            (7, WqCatastrophicSubtype::PortError),
        ];
        assert_eq!(table.len(), WqCatastrophicSubtype::ALL.len());
        for (value, sub) in table {
            assert_eq!(u8::from(sub), value);
            assert_eq!(WqCatastrophicSubtype::try_from(value), Ok(sub));
        }
        for value in [0, 8, 0xFF] {
            assert_eq!(
                WqCatastrophicSubtype::try_from(value),
                Err(EventError::UnknownWqCatastrophicSubtype(value))
            );
        }
    }

    #[test]
    fn local_access_subtypes_are_1_to_7() {
        let table = [
            (1, LocalAccessSubtype::RkeyViolation),
            (2, LocalAccessSubtype::LengthError),
            (3, LocalAccessSubtype::VaError),
            (4, LocalAccessSubtype::PdError),
            (5, LocalAccessSubtype::RwAccessError),
            (6, LocalAccessSubtype::KeyStateError),
            (7, LocalAccessSubtype::MrOperationError),
        ];
        assert_eq!(table.len(), LocalAccessSubtype::ALL.len());
        for (value, sub) in table {
            assert_eq!(u8::from(sub), value);
            assert_eq!(LocalAccessSubtype::try_from(value), Ok(sub));
        }
        for value in [0, 8, 0xFF] {
            assert_eq!(
                LocalAccessSubtype::try_from(value),
                Err(EventError::UnknownLocalAccessSubtype(value))
            );
        }
    }

    #[test]
    fn doorbell_overflow_subtypes_are_1_to_6() {
        let table = [
            (1, DbOverflowSubtype::SdbOverflow),
            (2, DbOverflowSubtype::SdbAlmostOverflow),
            (3, DbOverflowSubtype::OdbOverflow),
            (4, DbOverflowSubtype::OdbAlmostOverflow),
            (5, DbOverflowSubtype::SdbAlmostEmpty),
            (6, DbOverflowSubtype::OdbAlmostEmpty),
        ];
        assert_eq!(table.len(), DbOverflowSubtype::ALL.len());
        for (value, sub) in table {
            assert_eq!(u8::from(sub), value);
            assert_eq!(DbOverflowSubtype::try_from(value), Ok(sub));
        }
        for value in [0, 7, 0xFF] {
            assert_eq!(
                DbOverflowSubtype::try_from(value),
                Err(EventError::UnknownDbOverflowSubtype(value))
            );
        }
    }
}
