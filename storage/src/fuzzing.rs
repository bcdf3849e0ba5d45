//! The storage protocols' parsers under fuzzing: the functions the `nvme_capsules` and
//! `srp_ius` fuzz targets call (`fuzz/`, docs/fuzzing.md) and `tests/fuzz_corpora.rs`
//! replays on the committed corpora. Each takes any bytes, as a target takes them from a
//! host; none may panic, and whatever parses must emit to bytes that parse back to the
//! same representation.

use crate::nvmeof::wire::cm::{parse_cm_request, CmRequestRepr};
use crate::nvmeof::wire::command::{parse_command_capsule, DataPointer, QueueKind};
use crate::nvmeof::wire::connect_data::{parse_connect_data, ConnectDataRepr};
use crate::nvmeof::wire::sgl::parse_sgl;
use crate::nvmeof::wire::sqe::parse_sqe;
use crate::srp::wire::iu::parse_iu;
use crate::srp::wire::login::{parse_compact_login_request, parse_login_request};

/// NVMe over Fabrics: the first byte picks the queue (admin or I/O), the rest is a
/// command capsule (SQE and in-capsule data) as the target receives it. Also tried on the
/// same bytes: SQE, SGL descriptor, Connect data and RDMA-CM private data.
///
/// Invariants: a parsed capsule's data pointer lies inside the capsule (in-capsule data)
/// or is a keyed descriptor of non-zero length; SQE, SGL, Connect data and CM private
/// data round-trip through emit.
pub fn nvme_capsules(data: &[u8]) {
    let Some((&queue, bytes)) = data.split_first() else {
        return;
    };
    let queue = if queue & 1 == 0 {
        QueueKind::Admin
    } else {
        QueueKind::Io
    };
    if let Ok(capsule) = parse_command_capsule(bytes, queue) {
        match &capsule.data {
            DataPointer::InCapsule(range) => assert!(
                range.end <= capsule.in_capsule.len(),
                "in-capsule data {range:?} past the {} bytes after the SQE",
                capsule.in_capsule.len()
            ),
            DataPointer::Keyed { length, .. } => assert!(*length > 0, "a keyed data pointer of no bytes"),
            DataPointer::None => {}
        }
        assert_eq!(parse_sqe(&capsule.sqe.to_bytes()), Ok(capsule.sqe), "SQE round trip");
    }
    if let Ok(sqe) = parse_sqe(bytes) {
        assert_eq!(parse_sqe(&sqe.to_bytes()), Ok(sqe), "SQE round trip");
        if let Ok(sgl) = parse_sgl(&sqe.sgl1) {
            assert_eq!(parse_sgl(&sgl.to_bytes()), Ok(sgl), "SGL descriptor round trip");
        }
    }
    if let Ok(sgl) = parse_sgl(bytes) {
        assert_eq!(parse_sgl(&sgl.to_bytes()), Ok(sgl), "SGL descriptor round trip");
    }
    if let Ok(connect) = parse_connect_data(bytes) {
        let again: Result<ConnectDataRepr, _> = parse_connect_data(&connect.to_bytes());
        assert_eq!(again, Ok(connect), "Connect data round trip");
    }
    if let Ok(request) = parse_cm_request(bytes.get(..CmRequestRepr::LEN).unwrap_or(bytes)) {
        assert_eq!(
            parse_cm_request(&request.to_bytes()),
            Ok(request),
            "CM private data round trip"
        );
    }
}

/// SRP: any bytes as an information unit as the target (or initiator) receives it, and
/// as a login request, full and compact.
///
/// Invariants: whatever parses emits to bytes that parse back to the same IU or login.
pub fn srp_ius(data: &[u8]) {
    if let Ok(iu) = parse_iu(data) {
        let bytes = iu.to_bytes();
        assert_eq!(parse_iu(&bytes).as_ref(), Ok(&iu), "IU round trip");
    }
    if let Ok(login) = parse_login_request(data) {
        assert_eq!(
            parse_login_request(&login.to_bytes()),
            Ok(login),
            "login request round trip"
        );
    }
    if let Ok(login) = parse_compact_login_request(data) {
        assert_eq!(
            parse_compact_login_request(&login.to_compact_bytes()),
            Ok(login),
            "compact login request round trip"
        );
    }
}
