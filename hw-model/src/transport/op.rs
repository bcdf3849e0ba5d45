//! BTH opcodes (IBA table 35, roce-wire §1.4) as the engines use them: the low five bits
//! name the operation, bits 7:5 the service (RC 0, UC 1, UD 3).

/// Service bits of an RC opcode.
pub(crate) const RC: u8 = 0x00;
/// Service bits of a UC opcode.
pub(crate) const UC: u8 = 0x20;
/// Service bits of a UD opcode.
pub(crate) const UD: u8 = 0x60;

pub(crate) const SEND_FIRST: u8 = 0x00;
pub(crate) const SEND_MIDDLE: u8 = 0x01;
pub(crate) const SEND_LAST: u8 = 0x02;
pub(crate) const SEND_LAST_IMM: u8 = 0x03;
pub(crate) const SEND_ONLY: u8 = 0x04;
pub(crate) const SEND_ONLY_IMM: u8 = 0x05;
pub(crate) const WRITE_FIRST: u8 = 0x06;
pub(crate) const WRITE_MIDDLE: u8 = 0x07;
pub(crate) const WRITE_LAST: u8 = 0x08;
pub(crate) const WRITE_LAST_IMM: u8 = 0x09;
pub(crate) const WRITE_ONLY: u8 = 0x0A;
pub(crate) const WRITE_ONLY_IMM: u8 = 0x0B;
pub(crate) const READ_REQUEST: u8 = 0x0C;
pub(crate) const READ_RESPONSE_FIRST: u8 = 0x0D;
pub(crate) const READ_RESPONSE_MIDDLE: u8 = 0x0E;
pub(crate) const READ_RESPONSE_LAST: u8 = 0x0F;
pub(crate) const READ_RESPONSE_ONLY: u8 = 0x10;
pub(crate) const ACKNOWLEDGE: u8 = 0x11;
pub(crate) const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
pub(crate) const COMPARE_SWAP: u8 = 0x13;
pub(crate) const FETCH_ADD: u8 = 0x14;
pub(crate) const SEND_LAST_INV: u8 = 0x16;
pub(crate) const SEND_ONLY_INV: u8 = 0x17;

/// The operation bits of an opcode.
pub(crate) const fn operation(opcode: u8) -> u8 {
    opcode & 0x1F
}

/// Whether an RC opcode is a response (READ response, ACK, ATOMIC ACK).
pub(crate) const fn is_response(opcode: u8) -> bool {
    opcode >> 5 == 0 && matches!(operation(opcode), READ_RESPONSE_FIRST..=ATOMIC_ACKNOWLEDGE)
}

/// Whether the operation starts a message (FIRST or ONLY, incl. READ/atomic requests).
pub(crate) const fn is_first(operation: u8) -> bool {
    matches!(
        operation,
        SEND_FIRST
            | SEND_ONLY
            | SEND_ONLY_IMM
            | SEND_ONLY_INV
            | WRITE_FIRST
            | WRITE_ONLY
            | WRITE_ONLY_IMM
            | READ_REQUEST
            | COMPARE_SWAP
            | FETCH_ADD
    )
}

/// Whether the operation ends a message (LAST or ONLY, incl. READ/atomic requests).
pub(crate) const fn is_last(operation: u8) -> bool {
    matches!(
        operation,
        SEND_LAST
            | SEND_LAST_IMM
            | SEND_LAST_INV
            | SEND_ONLY
            | SEND_ONLY_IMM
            | SEND_ONLY_INV
            | WRITE_LAST
            | WRITE_LAST_IMM
            | WRITE_ONLY
            | WRITE_ONLY_IMM
            | READ_REQUEST
            | COMPARE_SWAP
            | FETCH_ADD
    )
}

/// Whether the operation is part of a SEND.
pub(crate) const fn is_send(operation: u8) -> bool {
    matches!(operation, SEND_FIRST..=SEND_ONLY_IMM | SEND_LAST_INV | SEND_ONLY_INV)
}

/// Whether the operation is part of an RDMA WRITE.
pub(crate) const fn is_write(operation: u8) -> bool {
    matches!(operation, WRITE_FIRST..=WRITE_ONLY_IMM)
}

/// Whether the operation carries immediate data.
pub(crate) const fn has_immediate(operation: u8) -> bool {
    matches!(
        operation,
        SEND_LAST_IMM | SEND_ONLY_IMM | WRITE_LAST_IMM | WRITE_ONLY_IMM
    )
}

/// Whether the operation carries an IETH (SEND with invalidate).
pub(crate) const fn has_invalidate(operation: u8) -> bool {
    matches!(operation, SEND_LAST_INV | SEND_ONLY_INV)
}

/// AETH syndrome of an ACK with "no credit information" (rxe and most RNICs send 0x1F).
pub(crate) const AETH_ACK: u8 = 0x1F;
/// AETH syndrome type bits of an RNR NAK.
pub(crate) const AETH_RNR_NAK: u8 = 0x20;
/// AETH syndrome type bits of a NAK.
pub(crate) const AETH_NAK: u8 = 0x60;
/// NAK codes.
pub(crate) const NAK_PSN_SEQUENCE: u8 = 0;
pub(crate) const NAK_INVALID_REQUEST: u8 = 1;
pub(crate) const NAK_REMOTE_ACCESS: u8 = 2;
pub(crate) const NAK_REMOTE_OPERATIONAL: u8 = 3;

/// The opcode of packet `index` (0-based) of a `packets`-packet message whose ONLY,
/// FIRST, MIDDLE and LAST opcodes are given (LAST/ONLY variants already chosen).
pub(crate) const fn position(index: u32, packets: u32, only: u8, first: u8, middle: u8, last: u8) -> u8 {
    if packets == 1 {
        only
    } else if index == 0 {
        first
    } else if index + 1 == packets {
        last
    } else {
        middle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_classes() {
        assert!(is_response(ACKNOWLEDGE));
        assert!(!is_response(UC | ACKNOWLEDGE));
        assert!(is_first(SEND_ONLY_INV) && is_last(SEND_ONLY_INV));
        assert!(!is_first(WRITE_MIDDLE) && !is_last(WRITE_MIDDLE));
        assert!(is_send(SEND_LAST_INV) && !is_send(WRITE_FIRST));
        assert_eq!(position(0, 1, 4, 0, 1, 2), 4);
        assert_eq!(position(0, 3, 4, 0, 1, 2), 0);
        assert_eq!(position(1, 3, 4, 0, 1, 2), 1);
        assert_eq!(position(2, 3, 4, 0, 1, 2), 2);
    }
}
