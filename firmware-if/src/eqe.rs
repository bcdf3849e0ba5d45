//! Event queue entries (reference sheet §9.1): completion EQEs (CEQE), asynchronous EQEs
//! (AEQE, with a second view for mailbox-completion events) and the owner-bit rule.
//!
//! Entry sizes: HIP08 uses 4-byte CEQEs ([`CEQE_SIZE_HIP08`]) and 16-byte AEQEs
//! ([`AEQE_SIZE_HIP08`]); HIP09 uses 64-byte entries for both ([`EQE_SIZE_64`], EQC
//! `EQE_SIZE` = 1). A 64-byte entry starts with exactly the same layout as the small one
//! and the rest is reserved, so [`Ceqe`], [`Aeqe`] and [`AeqeMailbox`] describe both:
//! `parse` reads the leading bytes of a 64-byte entry and ignores the rest.

use crate::bits::Layout;
use crate::layout;

/// Size of a HIP08 completion EQE in bytes.
pub const CEQE_SIZE_HIP08: usize = 4;
/// Size of a HIP08 asynchronous EQE in bytes.
pub const AEQE_SIZE_HIP08: usize = 16;
/// Size of a HIP09 EQE (completion or asynchronous) in bytes; its leading bytes carry the
/// HIP08 layout and the remainder is reserved (written as zero).
pub const EQE_SIZE_64: usize = 64;

const _: () = assert!(<Ceqe as Layout>::SIZE == CEQE_SIZE_HIP08);
const _: () = assert!(<Aeqe as Layout>::SIZE == AEQE_SIZE_HIP08);
const _: () = assert!(<AeqeMailbox as Layout>::SIZE == AEQE_SIZE_HIP08);

layout! {
    /// Completion event queue entry (`hns_roce_ceqe`): a CQ has a completion to report.
    pub struct Ceqe[4] {
        /// Number of the CQ that generated the event.
        CQN / cq_number / set_cq_number: u32 = 23:0,
        /// Owner bit; see [`eqe_is_valid`].
        OWNER / owner / set_owner: bool = 31:31,
    }
}

layout! {
    /// Asynchronous event queue entry (`hns_roce_aeqe`), queue-event view: an event about a
    /// QP, CQ or SRQ. Mailbox completions (event type 0x13) use [`AeqeMailbox`] instead.
    pub struct Aeqe[16] {
        /// Event type, an [`AsyncEventType`](crate::event::AsyncEventType) value.
        EVENT_TYPE / event_type / set_event_type: u8 = 7:0,
        /// Event sub-type (see [`crate::event`]); 0 when the event has none.
        SUB_TYPE / sub_type / set_sub_type: u8 = 15:8,
        /// Owner bit; see [`eqe_is_valid`].
        OWNER / owner / set_owner: bool = 31:31,
        /// Number of the object the event is about (QPN, CQN or SRQN).
        EVENT_QUEUE_NUM / queue_number / set_queue_number: u32 = 55:32,
    }
}

layout! {
    /// Asynchronous event queue entry, mailbox-completion view (event type 0x13, `MB`):
    /// the completion of an event-mode mailbox command. Shares `EVENT_TYPE`, `SUB_TYPE` and
    /// `OWNER` with [`Aeqe`]; bytes 4..15 overlap `EVENT_QUEUE_NUM`.
    pub struct AeqeMailbox[16] {
        /// Event type; 0x13 for a mailbox completion.
        EVENT_TYPE / event_type / set_event_type: u8 = 7:0,
        /// Event sub-type (unused by mailbox completions, 0).
        SUB_TYPE / sub_type / set_sub_type: u8 = 15:8,
        /// Owner bit; see [`eqe_is_valid`].
        OWNER / owner / set_owner: bool = 31:31,
        /// The command's 64-bit out_param (bytes 4..12).
        OUT_PARAM / out_param / set_out_param: u64 = 95:32,
        /// Token the driver gave the command when posting it.
        TOKEN / token / set_token: u16 = 111:96,
        /// Completion status of the mailbox command (1 = success).
        MB_STATUS / mailbox_status / set_mailbox_status: u8 = 119:112,
    }
}

/// Whether the EQE software finds at free-running consumer index `consumer_index` (queue
/// of `depth` entries, a power of two) is new: `OWNER ^ ((ci & depth) != 0)`, as for CQEs.
pub fn eqe_is_valid(owner: bool, consumer_index: u32, depth: u32) -> bool {
    owner ^ (consumer_index & depth != 0)
}

/// The owner bit the device writes into the EQE at free-running producer index
/// `producer_index`: 1 on lap 0, 0 on lap 1, and so on.
pub fn eqe_owner_bit_for_producer(producer_index: u32, depth: u32) -> bool {
    producer_index & depth == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::{check_fields, LayoutError};

    /// Tiny xorshift64 generator so the round-trip tests are reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Sets every field of `L` to a seeded pseudo-random value, emits, parses back and
    /// checks that every field reads back unchanged; also checks the field table.
    fn assert_round_trip<L: Layout>(seed: u64) {
        check_fields(L::NAME, L::SIZE, L::FIELDS).unwrap();
        let mut rng = XorShift(seed);
        let mut value = L::zeroed();
        let expected: Vec<u64> = L::FIELDS
            .iter()
            .map(|field| {
                let v = rng.next() & field.max_value();
                field.set(value.bytes_mut(), v);
                v
            })
            .collect();
        let mut wire = vec![0u8; L::SIZE];
        value.emit(&mut wire).unwrap();
        let parsed = L::parse(&wire).unwrap();
        for (field, v) in L::FIELDS.iter().zip(expected) {
            assert_eq!(field.get(parsed.bytes()), v, "{}.{}", L::NAME, field.name);
        }
    }

    // ---- Ceqe ----

    /// CQN 0x00ABCD, owner.
    const CEQE_BYTES: [u8; 4] = [0xCD, 0xAB, 0x00, 0x80];

    #[test]
    fn ceqe_parses_known_bytes() {
        let e = Ceqe::parse(&CEQE_BYTES).unwrap();
        assert_eq!(e.cq_number(), 0xABCD);
        assert!(e.owner());
    }

    #[test]
    fn ceqe_emits_known_bytes() {
        let mut e = Ceqe::zeroed();
        e.set_cq_number(0xABCD);
        e.set_owner(true);
        assert_eq!(e.0, CEQE_BYTES);
    }

    #[test]
    fn ceqe_round_trips_every_field() {
        assert_round_trip::<Ceqe>(0x5EED_0021);
    }

    #[test]
    fn ceqe_parse_rejects_truncated_input() {
        assert_eq!(
            Ceqe::parse(&CEQE_BYTES[..3]),
            Err(LayoutError::Truncated {
                layout: "Ceqe",
                expected: 4,
                actual: 3
            })
        );
    }

    #[test]
    fn a_64_byte_ceqe_starts_with_the_4_byte_layout() {
        let mut entry = [0u8; EQE_SIZE_64];
        entry[..4].copy_from_slice(&CEQE_BYTES);
        assert_eq!(Ceqe::parse(&entry).unwrap().cq_number(), 0xABCD);
    }

    // ---- Aeqe ----

    /// LOCAL_WQ_ACCESS_ERROR (7), sub-type 2, owner, QPN 0x012345.
    const AEQE_BYTES: [u8; 16] = [
        0x07, 0x02, 0x00, 0x80, // EVENT_TYPE, SUB_TYPE, OWNER
        0x45, 0x23, 0x01, 0x00, // EVENT_QUEUE_NUM
        0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn aeqe_parses_known_bytes() {
        let e = Aeqe::parse(&AEQE_BYTES).unwrap();
        assert_eq!(e.event_type(), 0x07);
        assert_eq!(e.sub_type(), 0x02);
        assert!(e.owner());
        assert_eq!(e.queue_number(), 0x01_2345);
    }

    #[test]
    fn aeqe_emits_known_bytes() {
        let mut e = Aeqe::zeroed();
        e.set_event_type(0x07);
        e.set_sub_type(0x02);
        e.set_owner(true);
        e.set_queue_number(0x01_2345);
        assert_eq!(e.0, AEQE_BYTES);
    }

    #[test]
    fn aeqe_round_trips_every_field() {
        assert_round_trip::<Aeqe>(0x5EED_0022);
    }

    #[test]
    fn aeqe_parse_rejects_truncated_input() {
        assert_eq!(
            Aeqe::parse(&AEQE_BYTES[..15]),
            Err(LayoutError::Truncated {
                layout: "Aeqe",
                expected: 16,
                actual: 15
            })
        );
    }

    // ---- AeqeMailbox ----

    /// MB (0x13), owner 0, out_param 0x0102030405060708, token 0x21, status 1.
    const AEQE_MB_BYTES: [u8; 16] = [
        0x13, 0x00, 0x00, 0x00, // EVENT_TYPE, SUB_TYPE, OWNER = 0
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // OUT_PARAM
        0x21, 0x00, // TOKEN
        0x01, // MB_STATUS
        0x00,
    ];

    #[test]
    fn aeqe_mailbox_parses_known_bytes() {
        let e = AeqeMailbox::parse(&AEQE_MB_BYTES).unwrap();
        assert_eq!(e.event_type(), 0x13);
        assert_eq!(e.sub_type(), 0);
        assert!(!e.owner());
        assert_eq!(e.out_param(), 0x0102_0304_0506_0708);
        assert_eq!(e.token(), 0x21);
        assert_eq!(e.mailbox_status(), 1);
    }

    #[test]
    fn aeqe_mailbox_emits_known_bytes() {
        let mut e = AeqeMailbox::zeroed();
        e.set_event_type(0x13);
        e.set_out_param(0x0102_0304_0506_0708);
        e.set_token(0x21);
        e.set_mailbox_status(1);
        assert_eq!(e.0, AEQE_MB_BYTES);
    }

    #[test]
    fn aeqe_mailbox_round_trips_every_field() {
        assert_round_trip::<AeqeMailbox>(0x5EED_0023);
    }

    #[test]
    fn aeqe_mailbox_parse_rejects_truncated_input() {
        assert_eq!(
            AeqeMailbox::parse(&AEQE_MB_BYTES[..15]),
            Err(LayoutError::Truncated {
                layout: "AeqeMailbox",
                expected: 16,
                actual: 15
            })
        );
    }

    #[test]
    fn both_aeqe_views_share_type_sub_type_and_owner() {
        for name in ["EVENT_TYPE", "SUB_TYPE", "OWNER"] {
            assert_eq!(
                Aeqe::field(name).map(|f| (f.hi, f.lo)),
                AeqeMailbox::field(name).map(|f| (f.hi, f.lo)),
                "{name}"
            );
        }
        let as_queue_event = Aeqe::parse(&AEQE_MB_BYTES).unwrap();
        assert_eq!(as_queue_event.event_type(), 0x13);
        assert!(!as_queue_event.owner());
    }

    // ---- owner bit ----

    #[test]
    fn eqe_owner_bit_follows_the_cqe_rule() {
        let depth = 16;
        assert!(eqe_owner_bit_for_producer(0, depth));
        assert!(eqe_owner_bit_for_producer(15, depth));
        assert!(!eqe_owner_bit_for_producer(16, depth));
        assert!(eqe_owner_bit_for_producer(32, depth));
        // Zeroed queue: nothing valid on lap 0; stale lap-0 entries invalid on lap 1.
        assert!(!eqe_is_valid(false, 0, depth));
        assert!(eqe_is_valid(true, 0, depth));
        assert!(!eqe_is_valid(true, 16, depth));
        assert!(eqe_is_valid(false, 16, depth));
        for index in 0..4 * depth {
            let owner = eqe_owner_bit_for_producer(index, depth);
            assert!(eqe_is_valid(owner, index, depth), "index {index}");
            assert!(!eqe_is_valid(owner, index + depth, depth), "index {index}");
        }
    }
}
