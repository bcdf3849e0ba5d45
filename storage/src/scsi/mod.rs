//! SCSI.
