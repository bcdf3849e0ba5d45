//! The QP state machine: which MODIFY_QPC transitions the device accepts.
//!
//! hns (§10.1) accepts RESET→{RESET, INIT}; INIT→{RESET, INIT, RTR, ERR};
//! RTR→{RESET, RTS, ERR}; RTS→{RESET, RTS, ERR}; ERR→{RESET, ERR}. SQD, SQE and
//! SQ-draining are never source states. rnic additionally accepts RESET→ERR and
//! RTR→RTR is refused as in hns.

use rnic_firmware_if::context::QpState;

/// Every transition the device accepts, as (from, to) pairs.
pub const LEGAL_TRANSITIONS: &[(QpState, QpState)] = &[
    (QpState::Reset, QpState::Reset),
    (QpState::Reset, QpState::Init),
    (QpState::Reset, QpState::Err),
    (QpState::Init, QpState::Reset),
    (QpState::Init, QpState::Init),
    (QpState::Init, QpState::Rtr),
    (QpState::Init, QpState::Err),
    (QpState::Rtr, QpState::Reset),
    (QpState::Rtr, QpState::Rts),
    (QpState::Rtr, QpState::Err),
    (QpState::Rts, QpState::Reset),
    (QpState::Rts, QpState::Rts),
    (QpState::Rts, QpState::Err),
    (QpState::Err, QpState::Reset),
    (QpState::Err, QpState::Err),
];

/// Whether MODIFY_QPC may move a QP from `from` to `to`.
pub fn is_legal_transition(from: QpState, to: QpState) -> bool {
    LEGAL_TRANSITIONS.contains(&(from, to))
}

/// The states a QP may move to from `from`, for diagnostics.
pub fn allowed_targets(from: QpState) -> Vec<QpState> {
    LEGAL_TRANSITIONS
        .iter()
        .filter(|(f, _)| *f == from)
        .map(|(_, t)| *t)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bring_up_path_is_legal() {
        for (from, to) in [
            (QpState::Reset, QpState::Init),
            (QpState::Init, QpState::Rtr),
            (QpState::Rtr, QpState::Rts),
            (QpState::Rts, QpState::Err),
            (QpState::Err, QpState::Reset),
        ] {
            assert!(is_legal_transition(from, to), "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn skipping_states_is_illegal() {
        assert!(!is_legal_transition(QpState::Reset, QpState::Rtr));
        assert!(!is_legal_transition(QpState::Reset, QpState::Rts));
        assert!(!is_legal_transition(QpState::Init, QpState::Rts));
        assert!(!is_legal_transition(QpState::Rtr, QpState::Init));
        assert!(!is_legal_transition(QpState::Rts, QpState::Rtr));
        assert!(!is_legal_transition(QpState::Err, QpState::Rts));
        assert!(!is_legal_transition(QpState::Rtr, QpState::Rtr));
    }

    #[test]
    fn unsupported_states_are_never_sources_or_targets() {
        for s in [QpState::Sqd, QpState::Sqe, QpState::SqDraining] {
            for t in QpState::ALL {
                assert!(!is_legal_transition(s, *t), "{s:?} -> {t:?}");
                assert!(!is_legal_transition(*t, s), "{t:?} -> {s:?}");
            }
        }
    }

    #[test]
    fn every_state_can_reach_reset_and_error_except_unsupported_ones() {
        for s in [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Err] {
            assert!(allowed_targets(s).contains(&QpState::Reset));
            assert!(allowed_targets(s).contains(&QpState::Err));
        }
    }
}
