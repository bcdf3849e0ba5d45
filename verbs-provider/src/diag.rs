//! The provider's diagnostic kinds ([`rnic_diag`]): what a device, a vfio-user server or
//! the network can make the driver log over and over. Each goes through the process-wide
//! limiter ([`rnic_diag::global`]), so a misbehaving device or a MAD flood leaves a
//! bounded log while every occurrence is still counted.

use rnic_diag::Kind;

/// A mailbox completion event for a token nobody waits for (a device bug or a stale event).
pub const STRAY_MAILBOX_COMPLETION: Kind = Kind::new("driver", "mailbox completion nobody waits for");
/// A mailbox completion event for an older token while waiting for a newer one.
pub const STALE_MAILBOX_COMPLETION: Kind = Kind::new("driver", "stale mailbox completion");
/// A CQE naming a QP the CQ does not serve.
pub const CQE_OF_UNKNOWN_QP: Kind = Kind::new("driver", "CQE of an unknown QP");
/// A receive CQE for a WQE other than the oldest outstanding one.
pub const RECEIVE_CQE_OUT_OF_ORDER: Kind = Kind::new("driver", "receive CQE out of order");
/// A register access outside the function's mapped BARs.
pub const ACCESS_OUTSIDE_BAR: Kind = Kind::new("driver", "register access outside a mapped BAR");
/// A region access the vfio-user server refused.
pub const REGION_ACCESS_REFUSED: Kind = Kind::new("vfio-user client", "region access refused");
/// QP1: polling its CQ failed.
pub const QP1_POLL_FAILED: Kind = Kind::new("cm", "QP1 CQ poll failed");
/// QP1: a MAD's send completed in error.
pub const QP1_SEND_FAILED: Kind = Kind::new("cm", "QP1 send failed");
/// QP1: a receive WQE could not be posted.
pub const QP1_RECEIVE_NOT_POSTED: Kind = Kind::new("cm", "QP1 receive not posted");
/// QP1 was found in ERR and brought back up (or could not be).
pub const QP1_RECOVERY: Kind = Kind::new("cm", "QP1 recovery");
/// QP1: a receive without a usable GRH (the first 40 bytes).
pub const QP1_RECEIVE_WITHOUT_GRH: Kind = Kind::new("cm", "QP1 receive without a GRH");
/// QP1: the send backlog was full and a MAD was dropped.
pub const QP1_BACKLOG_FULL: Kind = Kind::new("cm", "QP1 send backlog full");
/// QP1: the device refused a MAD's send WQE.
pub const QP1_SEND_REFUSED: Kind = Kind::new("cm", "QP1 send refused");
