//! The SRP initiator.
