//! BTH opcodes (roce-wire §1.4): one const table row per opcode gives its name, operation,
//! extension headers, position in a message and whether it carries payload.
//!
//! Bits 7:5 of an opcode name the transport service (000 RC, 001 UC, 010 RD, 011 UD,
//! 100 CNP), bits 4:0 the operation. The table holds every opcode of §1.4: RC, UC, the two
//! UD SENDs and CNP. RD opcodes (not implemented by any Linux provider) and the reserved and
//! vendor ranges are *unknown*: [`BthOpcode::is_known`] is false and
//! [`parse_frame`](super::parse_frame) rejects them with
//! [`WireError::UnknownOpcode`](super::WireError::UnknownOpcode).

use core::fmt;

bitflags::bitflags! {
    /// The headers that follow the BTH for an opcode, before the payload.
    ///
    /// On the wire they appear in this order: DETH, FETH, RETH, AtomicETH, AETH,
    /// AtomicAckETH, ImmDt, IETH, and CNP's reserved bytes ([`ExtHeaders::wire_len`] sums them).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ExtHeaders: u16 {
        /// RDMA extended transport header (16 bytes: VA, R_Key, DMA length).
        const RETH = 1 << 0;
        /// ACK extended transport header (4 bytes: syndrome, MSN).
        const AETH = 1 << 1;
        /// Atomic extended transport header (28 bytes: VA, R_Key, swap/add, compare).
        const ATOMIC_ETH = 1 << 2;
        /// Atomic acknowledge extended transport header (8 bytes: original remote value).
        const ATOMIC_ACK_ETH = 1 << 3;
        /// Immediate data (4 bytes).
        const IMMDT = 1 << 4;
        /// Invalidate extended transport header (4 bytes: R_Key to invalidate).
        const IETH = 1 << 5;
        /// Datagram extended transport header (8 bytes: Q_Key, source QP).
        const DETH = 1 << 6;
        /// Flush extended transport header (4 bytes; RC FLUSH only, IBA 1.5). Not carried by
        /// [`RoceRepr`](super::RoceRepr): frames with it are rejected as unsupported.
        const FETH = 1 << 7;
        /// The 16 reserved bytes after the BTH of a CNP (zero on emit, ignored on parse).
        const CNP_RESERVED = 1 << 8;
    }
}

/// Size in bytes of each extension header.
pub mod header_len {
    /// RETH.
    pub const RETH: usize = 16;
    /// AETH.
    pub const AETH: usize = 4;
    /// AtomicETH.
    pub const ATOMIC_ETH: usize = 28;
    /// AtomicAckETH.
    pub const ATOMIC_ACK_ETH: usize = 8;
    /// ImmDt.
    pub const IMMDT: usize = 4;
    /// IETH.
    pub const IETH: usize = 4;
    /// DETH.
    pub const DETH: usize = 8;
    /// FETH.
    pub const FETH: usize = 4;
    /// CNP reserved bytes.
    pub const CNP_RESERVED: usize = 16;
}

impl ExtHeaders {
    /// Each extension header with its size ([`header_len`]).
    const SIZES: [(ExtHeaders, usize); 9] = [
        (Self::RETH, header_len::RETH),
        (Self::AETH, header_len::AETH),
        (Self::ATOMIC_ETH, header_len::ATOMIC_ETH),
        (Self::ATOMIC_ACK_ETH, header_len::ATOMIC_ACK_ETH),
        (Self::IMMDT, header_len::IMMDT),
        (Self::IETH, header_len::IETH),
        (Self::DETH, header_len::DETH),
        (Self::FETH, header_len::FETH),
        (Self::CNP_RESERVED, header_len::CNP_RESERVED),
    ];

    /// Total size in bytes of these headers on the wire.
    pub const fn wire_len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        // A `while` loop: `for` is not allowed in a const fn.
        while i < Self::SIZES.len() {
            let (header, len) = Self::SIZES[i];
            if self.contains(header) {
                n += len;
            }
            i += 1;
        }
        n
    }
}

/// Transport service of an opcode (bits 7:5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable connected (000).
    Rc,
    /// Unreliable connected (001).
    Uc,
    /// Reliable datagram (010); no opcode of this service is known here.
    Rd,
    /// Unreliable datagram (011).
    Ud,
    /// Congestion notification (100).
    Cnp,
    /// Anything else (XRC 101, reserved 110, vendor 111).
    Other,
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (any variant: plain, with immediate, with invalidate).
    Send,
    /// RDMA WRITE (plain or with immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// Acknowledge (ACK, NAK, RNR NAK).
    Acknowledge,
    /// ATOMIC acknowledge.
    AtomicAcknowledge,
    /// CompareSwap.
    CompareSwap,
    /// FetchAdd.
    FetchAdd,
    /// FLUSH (IBA 1.5).
    Flush,
    /// ATOMIC WRITE (IBA 1.5): RETH + 8 bytes of payload.
    AtomicWrite,
    /// Congestion notification packet.
    Cnp,
}

/// Place of a packet in its message. Opcodes that are not segmented (ACK, READ request,
/// atomics, CNP, ...) are [`Position::Only`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The message's only packet.
    Only,
}

/// A BTH opcode (byte 0 of the BTH). Any byte value can be held; [`BthOpcode::is_known`]
/// says whether it is in the table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BthOpcode(pub u8);

/// One row of the opcode table.
struct OpInfo {
    opcode: BthOpcode,
    name: &'static str,
    operation: Operation,
    headers: ExtHeaders,
    position: Position,
    payload: bool,
}

const fn row(
    opcode: BthOpcode,
    name: &'static str,
    operation: Operation,
    headers: ExtHeaders,
    position: Position,
    payload: bool,
) -> OpInfo {
    OpInfo {
        opcode,
        name,
        operation,
        headers,
        position,
        payload,
    }
}

macro_rules! opcodes {
    ($($(#[$doc:meta])* $name:ident = $value:expr;)*) => {
        impl BthOpcode {
            $($(#[$doc])* pub const $name: BthOpcode = BthOpcode($value);)*
        }
    };
}

opcodes! {
    /// RC SEND First.
    RC_SEND_FIRST = 0x00;
    /// RC SEND Middle.
    RC_SEND_MIDDLE = 0x01;
    /// RC SEND Last.
    RC_SEND_LAST = 0x02;
    /// RC SEND Last with Immediate (ImmDt).
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03;
    /// RC SEND Only.
    RC_SEND_ONLY = 0x04;
    /// RC SEND Only with Immediate (ImmDt).
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05;
    /// RC RDMA WRITE First (RETH).
    RC_RDMA_WRITE_FIRST = 0x06;
    /// RC RDMA WRITE Middle.
    RC_RDMA_WRITE_MIDDLE = 0x07;
    /// RC RDMA WRITE Last.
    RC_RDMA_WRITE_LAST = 0x08;
    /// RC RDMA WRITE Last with Immediate (ImmDt).
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09;
    /// RC RDMA WRITE Only (RETH).
    RC_RDMA_WRITE_ONLY = 0x0A;
    /// RC RDMA WRITE Only with Immediate (RETH, ImmDt).
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B;
    /// RC RDMA READ Request (RETH).
    RC_RDMA_READ_REQUEST = 0x0C;
    /// RC RDMA READ Response First (AETH).
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D;
    /// RC RDMA READ Response Middle.
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E;
    /// RC RDMA READ Response Last (AETH).
    RC_RDMA_READ_RESPONSE_LAST = 0x0F;
    /// RC RDMA READ Response Only (AETH).
    RC_RDMA_READ_RESPONSE_ONLY = 0x10;
    /// RC Acknowledge (AETH).
    RC_ACKNOWLEDGE = 0x11;
    /// RC ATOMIC Acknowledge (AETH, AtomicAckETH).
    RC_ATOMIC_ACKNOWLEDGE = 0x12;
    /// RC CompareSwap (AtomicETH).
    RC_COMPARE_SWAP = 0x13;
    /// RC FetchAdd (AtomicETH).
    RC_FETCH_ADD = 0x14;
    /// RC SEND Last with Invalidate (IETH).
    RC_SEND_LAST_WITH_INVALIDATE = 0x16;
    /// RC SEND Only with Invalidate (IETH).
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17;
    /// RC FLUSH (FETH, RETH; IBA 1.5). Known, but not carried by `RoceRepr`.
    RC_FLUSH = 0x1C;
    /// RC ATOMIC WRITE (RETH + 8-byte payload; IBA 1.5).
    RC_ATOMIC_WRITE = 0x1D;
    /// UC SEND First.
    UC_SEND_FIRST = 0x20;
    /// UC SEND Middle.
    UC_SEND_MIDDLE = 0x21;
    /// UC SEND Last.
    UC_SEND_LAST = 0x22;
    /// UC SEND Last with Immediate (ImmDt).
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23;
    /// UC SEND Only.
    UC_SEND_ONLY = 0x24;
    /// UC SEND Only with Immediate (ImmDt).
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25;
    /// UC RDMA WRITE First (RETH).
    UC_RDMA_WRITE_FIRST = 0x26;
    /// UC RDMA WRITE Middle.
    UC_RDMA_WRITE_MIDDLE = 0x27;
    /// UC RDMA WRITE Last.
    UC_RDMA_WRITE_LAST = 0x28;
    /// UC RDMA WRITE Last with Immediate (ImmDt).
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29;
    /// UC RDMA WRITE Only (RETH).
    UC_RDMA_WRITE_ONLY = 0x2A;
    /// UC RDMA WRITE Only with Immediate (RETH, ImmDt).
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B;
    /// UD SEND Only (DETH).
    UD_SEND_ONLY = 0x64;
    /// UD SEND Only with Immediate (DETH, ImmDt).
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65;
    /// Congestion notification packet (16 reserved bytes after the BTH).
    CNP = 0x81;
}

/// Short names for the table below.
const NONE: ExtHeaders = ExtHeaders::empty();
const RETH: ExtHeaders = ExtHeaders::RETH;
const AETH: ExtHeaders = ExtHeaders::AETH;
const IMMDT: ExtHeaders = ExtHeaders::IMMDT;
const IETH: ExtHeaders = ExtHeaders::IETH;
const DETH: ExtHeaders = ExtHeaders::DETH;
const ATOMIC_ETH: ExtHeaders = ExtHeaders::ATOMIC_ETH;
const RETH_IMMDT: ExtHeaders = ExtHeaders::RETH.union(ExtHeaders::IMMDT);
const DETH_IMMDT: ExtHeaders = ExtHeaders::DETH.union(ExtHeaders::IMMDT);
const AETH_ATOMIC_ACK: ExtHeaders = ExtHeaders::AETH.union(ExtHeaders::ATOMIC_ACK_ETH);
const FETH_RETH: ExtHeaders = ExtHeaders::FETH.union(ExtHeaders::RETH);

use Operation as Op;
use Position::{First, Last, Middle, Only};

/// The opcode table (roce-wire §1.4): opcode, name, operation, headers after the BTH,
/// position, carries payload.
#[rustfmt::skip]
const TABLE: &[OpInfo] = &[
    row(BthOpcode::RC_SEND_FIRST, "RC_SEND_FIRST", Op::Send, NONE, First, true),
    row(BthOpcode::RC_SEND_MIDDLE, "RC_SEND_MIDDLE", Op::Send, NONE, Middle, true),
    row(BthOpcode::RC_SEND_LAST, "RC_SEND_LAST", Op::Send, NONE, Last, true),
    row(BthOpcode::RC_SEND_LAST_WITH_IMMEDIATE, "RC_SEND_LAST_WITH_IMMEDIATE", Op::Send, IMMDT, Last, true),
    row(BthOpcode::RC_SEND_ONLY, "RC_SEND_ONLY", Op::Send, NONE, Only, true),
    row(BthOpcode::RC_SEND_ONLY_WITH_IMMEDIATE, "RC_SEND_ONLY_WITH_IMMEDIATE", Op::Send, IMMDT, Only, true),
    row(BthOpcode::RC_RDMA_WRITE_FIRST, "RC_RDMA_WRITE_FIRST", Op::RdmaWrite, RETH, First, true),
    row(BthOpcode::RC_RDMA_WRITE_MIDDLE, "RC_RDMA_WRITE_MIDDLE", Op::RdmaWrite, NONE, Middle, true),
    row(BthOpcode::RC_RDMA_WRITE_LAST, "RC_RDMA_WRITE_LAST", Op::RdmaWrite, NONE, Last, true),
    row(BthOpcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Op::RdmaWrite, IMMDT, Last, true),
    row(BthOpcode::RC_RDMA_WRITE_ONLY, "RC_RDMA_WRITE_ONLY", Op::RdmaWrite, RETH, Only, true),
    row(BthOpcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Op::RdmaWrite, RETH_IMMDT, Only, true),
    row(BthOpcode::RC_RDMA_READ_REQUEST, "RC_RDMA_READ_REQUEST", Op::RdmaReadRequest, RETH, Only, false),
    row(BthOpcode::RC_RDMA_READ_RESPONSE_FIRST, "RC_RDMA_READ_RESPONSE_FIRST", Op::RdmaReadResponse, AETH, First, true),
    row(BthOpcode::RC_RDMA_READ_RESPONSE_MIDDLE, "RC_RDMA_READ_RESPONSE_MIDDLE", Op::RdmaReadResponse, NONE, Middle, true),
    row(BthOpcode::RC_RDMA_READ_RESPONSE_LAST, "RC_RDMA_READ_RESPONSE_LAST", Op::RdmaReadResponse, AETH, Last, true),
    row(BthOpcode::RC_RDMA_READ_RESPONSE_ONLY, "RC_RDMA_READ_RESPONSE_ONLY", Op::RdmaReadResponse, AETH, Only, true),
    row(BthOpcode::RC_ACKNOWLEDGE, "RC_ACKNOWLEDGE", Op::Acknowledge, AETH, Only, false),
    row(BthOpcode::RC_ATOMIC_ACKNOWLEDGE, "RC_ATOMIC_ACKNOWLEDGE", Op::AtomicAcknowledge, AETH_ATOMIC_ACK, Only, false),
    row(BthOpcode::RC_COMPARE_SWAP, "RC_COMPARE_SWAP", Op::CompareSwap, ATOMIC_ETH, Only, false),
    row(BthOpcode::RC_FETCH_ADD, "RC_FETCH_ADD", Op::FetchAdd, ATOMIC_ETH, Only, false),
    row(BthOpcode::RC_SEND_LAST_WITH_INVALIDATE, "RC_SEND_LAST_WITH_INVALIDATE", Op::Send, IETH, Last, true),
    row(BthOpcode::RC_SEND_ONLY_WITH_INVALIDATE, "RC_SEND_ONLY_WITH_INVALIDATE", Op::Send, IETH, Only, true),
    row(BthOpcode::RC_FLUSH, "RC_FLUSH", Op::Flush, FETH_RETH, Only, false),
    row(BthOpcode::RC_ATOMIC_WRITE, "RC_ATOMIC_WRITE", Op::AtomicWrite, RETH, Only, true),
    row(BthOpcode::UC_SEND_FIRST, "UC_SEND_FIRST", Op::Send, NONE, First, true),
    row(BthOpcode::UC_SEND_MIDDLE, "UC_SEND_MIDDLE", Op::Send, NONE, Middle, true),
    row(BthOpcode::UC_SEND_LAST, "UC_SEND_LAST", Op::Send, NONE, Last, true),
    row(BthOpcode::UC_SEND_LAST_WITH_IMMEDIATE, "UC_SEND_LAST_WITH_IMMEDIATE", Op::Send, IMMDT, Last, true),
    row(BthOpcode::UC_SEND_ONLY, "UC_SEND_ONLY", Op::Send, NONE, Only, true),
    row(BthOpcode::UC_SEND_ONLY_WITH_IMMEDIATE, "UC_SEND_ONLY_WITH_IMMEDIATE", Op::Send, IMMDT, Only, true),
    row(BthOpcode::UC_RDMA_WRITE_FIRST, "UC_RDMA_WRITE_FIRST", Op::RdmaWrite, RETH, First, true),
    row(BthOpcode::UC_RDMA_WRITE_MIDDLE, "UC_RDMA_WRITE_MIDDLE", Op::RdmaWrite, NONE, Middle, true),
    row(BthOpcode::UC_RDMA_WRITE_LAST, "UC_RDMA_WRITE_LAST", Op::RdmaWrite, NONE, Last, true),
    row(BthOpcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Op::RdmaWrite, IMMDT, Last, true),
    row(BthOpcode::UC_RDMA_WRITE_ONLY, "UC_RDMA_WRITE_ONLY", Op::RdmaWrite, RETH, Only, true),
    row(BthOpcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Op::RdmaWrite, RETH_IMMDT, Only, true),
    row(BthOpcode::UD_SEND_ONLY, "UD_SEND_ONLY", Op::Send, DETH, Only, true),
    row(BthOpcode::UD_SEND_ONLY_WITH_IMMEDIATE, "UD_SEND_ONLY_WITH_IMMEDIATE", Op::Send, DETH_IMMDT, Only, true),
    row(BthOpcode::CNP, "CNP", Op::Cnp, ExtHeaders::CNP_RESERVED, Only, false),
];

/// Opcode byte → index into [`TABLE`], or `u8::MAX` when unknown.
const INDEX: [u8; 256] = {
    let mut index = [u8::MAX; 256];
    let mut i = 0;
    while i < TABLE.len() {
        index[TABLE[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    index
};

/// Opcode byte → [`ExtHeaders::wire_len`] of its extension headers (0 when unknown): one
/// load instead of summing the header table for every frame emitted.
const EXTENSION_LEN: [u8; 256] = {
    let mut len = [0u8; 256];
    let mut i = 0;
    while i < TABLE.len() {
        len[TABLE[i].opcode.0 as usize] = TABLE[i].headers.wire_len() as u8;
        i += 1;
    }
    len
};

impl BthOpcode {
    #[inline]
    fn info(self) -> Option<&'static OpInfo> {
        match INDEX[self.0 as usize] {
            u8::MAX => None,
            i => TABLE.get(i as usize),
        }
    }

    /// Every known opcode, in table order.
    pub fn all_known() -> impl Iterator<Item = BthOpcode> {
        TABLE.iter().map(|row| row.opcode)
    }

    /// Whether this opcode is in the table (roce-wire §1.4).
    #[inline]
    pub fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// Transport service, from bits 7:5 (defined for every byte value).
    #[inline]
    pub const fn service(self) -> Service {
        match self.0 >> 5 {
            0b000 => Service::Rc,
            0b001 => Service::Uc,
            0b010 => Service::Rd,
            0b011 => Service::Ud,
            0b100 => Service::Cnp,
            _ => Service::Other,
        }
    }

    /// The operation, or `None` for an unknown opcode.
    #[inline]
    pub fn operation(self) -> Option<Operation> {
        self.info().map(|i| i.operation)
    }

    /// The extension headers that follow the BTH (empty for an unknown opcode).
    #[inline]
    pub fn headers(self) -> ExtHeaders {
        self.info().map_or(ExtHeaders::empty(), |i| i.headers)
    }

    /// Length in bytes of the extension headers after the BTH: `headers().wire_len()`
    /// (0 for an unknown opcode), from a table.
    #[inline]
    pub fn extension_headers_len(self) -> usize {
        usize::from(EXTENSION_LEN[usize::from(self.0)])
    }

    /// Length in bytes of the BTH plus the extension headers.
    #[inline]
    pub fn transport_header_len(self) -> usize {
        super::bth::HEADER_LEN + self.extension_headers_len()
    }

    /// Whether packets with this opcode may carry payload (false for unknown opcodes). A
    /// SEND/WRITE ONLY may still carry zero bytes; ATOMIC WRITE carries exactly 8.
    #[inline]
    pub fn has_payload(self) -> bool {
        self.info().is_some_and(|i| i.payload)
    }

    /// Position in the message; non-segmented and unknown opcodes are [`Position::Only`].
    #[inline]
    pub fn position(self) -> Position {
        self.info().map_or(Position::Only, |i| i.position)
    }

    /// Whether this packet starts a message (FIRST or ONLY).
    #[inline]
    pub fn starts_message(self) -> bool {
        matches!(self.position(), Position::First | Position::Only)
    }

    /// Whether this packet ends a message (LAST or ONLY).
    #[inline]
    pub fn ends_message(self) -> bool {
        matches!(self.position(), Position::Last | Position::Only)
    }

    /// The table name (`"RC_SEND_ONLY"`, ...), or `"UNKNOWN"`.
    #[inline]
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    /// Any SEND (First/Middle/Last/Only, with immediate or invalidate; RC, UC and UD).
    #[inline]
    pub fn is_send(self) -> bool {
        self.operation() == Some(Operation::Send)
    }

    /// Any RDMA WRITE (RC or UC).
    #[inline]
    pub fn is_write(self) -> bool {
        self.operation() == Some(Operation::RdmaWrite)
    }

    /// RDMA READ request.
    #[inline]
    pub fn is_read_request(self) -> bool {
        self.operation() == Some(Operation::RdmaReadRequest)
    }

    /// Any RDMA READ response.
    #[inline]
    pub fn is_read_response(self) -> bool {
        self.operation() == Some(Operation::RdmaReadResponse)
    }

    /// RC Acknowledge (ACK / NAK / RNR NAK), not the ATOMIC Acknowledge.
    #[inline]
    pub fn is_ack(self) -> bool {
        self == Self::RC_ACKNOWLEDGE
    }

    /// RC ATOMIC Acknowledge.
    #[inline]
    pub fn is_atomic_ack(self) -> bool {
        self == Self::RC_ATOMIC_ACKNOWLEDGE
    }

    /// CompareSwap or FetchAdd.
    #[inline]
    pub fn is_atomic(self) -> bool {
        matches!(self.operation(), Some(Operation::CompareSwap | Operation::FetchAdd))
    }

    /// Sent by a responder to a requester: READ responses, Acknowledge, ATOMIC Acknowledge.
    #[inline]
    pub fn is_response(self) -> bool {
        matches!(
            self.operation(),
            Some(Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge)
        )
    }

    /// Sent by a requester: every known opcode except responses and CNP.
    #[inline]
    pub fn is_request(self) -> bool {
        self.is_known() && !self.is_response() && self != Self::CNP
    }

    /// Carries immediate data (ImmDt).
    #[inline]
    pub fn has_immediate(self) -> bool {
        self.headers().contains(ExtHeaders::IMMDT)
    }

    /// Carries an R_Key to invalidate (IETH).
    #[inline]
    pub fn has_invalidate(self) -> bool {
        self.headers().contains(ExtHeaders::IETH)
    }
}

impl fmt::Debug for BthOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BthOpcode({:#04x} {})", self.0, self.name())
    }
}

impl fmt::Display for BthOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_known() {
            f.write_str(self.name())
        } else {
            write!(f, "UNKNOWN({:#04x})", self.0)
        }
    }
}

impl From<u8> for BthOpcode {
    fn from(value: u8) -> Self {
        BthOpcode(value)
    }
}

impl From<BthOpcode> for u8 {
    fn from(value: BthOpcode) -> Self {
        value.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_index_is_consistent() {
        assert_eq!(TABLE.len(), 40);
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(INDEX[row.opcode.0 as usize] as usize, i, "duplicate row {}", row.name);
            assert!(row.opcode.is_known());
            assert_eq!(row.opcode.name(), row.name);
        }
        let known = (0..=255u8).filter(|&b| BthOpcode(b).is_known()).count();
        assert_eq!(known, TABLE.len());
    }

    #[test]
    fn names_match_services() {
        for op in BthOpcode::all_known() {
            let prefix = match op.service() {
                Service::Rc => "RC_",
                Service::Uc => "UC_",
                Service::Ud => "UD_",
                Service::Cnp => "CNP",
                s => panic!("{op}: unexpected service {s:?}"),
            };
            assert!(op.name().starts_with(prefix), "{op}");
        }
    }

    #[test]
    fn uc_mirrors_rc_for_send_and_write() {
        for low in 0x00..=0x0Bu8 {
            let rc = BthOpcode(low);
            let uc = BthOpcode(0x20 | low);
            assert_eq!(rc.headers(), uc.headers());
            assert_eq!(rc.position(), uc.position());
            assert_eq!(rc.operation(), uc.operation());
            assert_eq!(&rc.name()[3..], &uc.name()[3..]);
        }
        // UC has no READ, atomics or ACKs.
        for low in 0x0C..=0x1Fu8 {
            assert!(!BthOpcode(0x20 | low).is_known());
        }
    }

    #[test]
    fn headers_per_spec_table() {
        use BthOpcode as B;
        let cases: &[(BthOpcode, ExtHeaders, usize)] = &[
            (B::RC_SEND_ONLY, NONE, 0),
            (B::RC_SEND_ONLY_WITH_IMMEDIATE, IMMDT, 4),
            (B::RC_RDMA_WRITE_FIRST, RETH, 16),
            (B::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, RETH_IMMDT, 20),
            (B::RC_RDMA_READ_REQUEST, RETH, 16),
            (B::RC_RDMA_READ_RESPONSE_MIDDLE, NONE, 0),
            (B::RC_RDMA_READ_RESPONSE_LAST, AETH, 4),
            (B::RC_ATOMIC_ACKNOWLEDGE, AETH_ATOMIC_ACK, 12),
            (B::RC_COMPARE_SWAP, ATOMIC_ETH, 28),
            (B::RC_SEND_ONLY_WITH_INVALIDATE, IETH, 4),
            (B::UD_SEND_ONLY, DETH, 8),
            (B::UD_SEND_ONLY_WITH_IMMEDIATE, DETH_IMMDT, 12),
            (B::RC_FLUSH, FETH_RETH, 20),
            (B::CNP, ExtHeaders::CNP_RESERVED, 16),
        ];
        for &(op, headers, len) in cases {
            assert_eq!(op.headers(), headers, "{op}");
            assert_eq!(op.headers().wire_len(), len, "{op}");
            assert_eq!(op.transport_header_len(), 12 + len, "{op}");
        }
    }

    #[test]
    fn extension_length_table_agrees_with_the_headers_for_every_byte() {
        for byte in 0..=u8::MAX {
            let op = BthOpcode(byte);
            assert_eq!(op.extension_headers_len(), op.headers().wire_len(), "{op}");
        }
    }

    #[test]
    fn classification() {
        use BthOpcode as B;
        assert!(B::RC_ACKNOWLEDGE.is_ack() && B::RC_ACKNOWLEDGE.is_response());
        assert!(!B::RC_ATOMIC_ACKNOWLEDGE.is_ack() && B::RC_ATOMIC_ACKNOWLEDGE.is_atomic_ack());
        assert!(B::RC_RDMA_READ_RESPONSE_FIRST.is_read_response());
        assert_eq!(B::RC_RDMA_READ_RESPONSE_FIRST.position(), Position::First);
        assert!(B::RC_FETCH_ADD.is_atomic() && B::RC_FETCH_ADD.is_request());
        assert!(!B::RC_FETCH_ADD.has_payload() && !B::RC_ACKNOWLEDGE.has_payload());
        assert!(B::RC_RDMA_READ_REQUEST.is_read_request() && !B::RC_RDMA_READ_REQUEST.has_payload());
        assert!(B::UD_SEND_ONLY_WITH_IMMEDIATE.is_send() && B::UD_SEND_ONLY_WITH_IMMEDIATE.has_immediate());
        assert!(B::RC_SEND_LAST_WITH_INVALIDATE.has_invalidate());
        assert!(B::UC_RDMA_WRITE_MIDDLE.is_write() && !B::UC_RDMA_WRITE_MIDDLE.starts_message());
        assert!(B::RC_SEND_ONLY.starts_message() && B::RC_SEND_ONLY.ends_message());
        assert!(!B::CNP.is_request() && !B::CNP.is_response());
        assert_eq!(B::CNP.service(), Service::Cnp);
        assert_eq!(BthOpcode(0x40).service(), Service::Rd);
        assert!(!BthOpcode(0x40).is_known());
        assert_eq!(BthOpcode(0xE0).service(), Service::Other);
        assert!(!BthOpcode(0x15).is_known());
        assert_eq!(BthOpcode(0x15).headers(), ExtHeaders::empty());
        assert_eq!(format!("{}", BthOpcode(0x15)), "UNKNOWN(0x15)");
        assert_eq!(format!("{}", B::RC_SEND_ONLY), "RC_SEND_ONLY");
    }
}
