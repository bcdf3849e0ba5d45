//! The transport's counters over the server's whole life.
//!
//! A function reset (the driver resets the device when it loads and again when it
//! unloads) rebuilds the model's transport, and its counters start again from zero. A
//! client that resets before it detaches would otherwise take its run's retransmissions
//! and ACK timeouts with it: the server's "wire counters" line, logged after the detach,
//! read zero whatever happened on the wire. [`TransportTotals`] adds each earlier life of
//! the counters to the current one.

use rnic_hw_model::transport::TransportCounters;

/// The transport's counters summed over device resets.
#[derive(Debug, Clone, Default)]
pub struct TransportTotals {
    /// Sum of the counters of the transports before the last restart.
    earlier: TransportCounters,
    /// The current transport's counters when last observed.
    seen: TransportCounters,
}

impl TransportTotals {
    /// Takes the device's counters as they are now. Called at least once between a reset
    /// and the next frame (every loop pass does): a reset is recognised by counters that
    /// went back to zero or fell.
    pub fn observe(&mut self, now: TransportCounters) {
        let restarted = now.frames_transmitted < self.seen.frames_transmitted
            || now.frames_received < self.seen.frames_received
            || (now == TransportCounters::default() && self.seen != TransportCounters::default());
        if restarted {
            self.earlier = sum(&self.earlier, &self.seen);
        }
        self.seen = now;
    }

    /// The counters since the server started: the earlier lives and `now`.
    pub fn total(&mut self, now: TransportCounters) -> TransportCounters {
        self.observe(now);
        sum(&self.earlier, &self.seen)
    }
}

fn sum(a: &TransportCounters, b: &TransportCounters) -> TransportCounters {
    TransportCounters {
        frames_transmitted: a.frames_transmitted + b.frames_transmitted,
        frames_received: a.frames_received + b.frames_received,
        frames_dropped: a.frames_dropped + b.frames_dropped,
        loopback_frames: a.loopback_frames + b.loopback_frames,
        transmit_overflows: a.transmit_overflows + b.transmit_overflows,
        retransmitted_packets: a.retransmitted_packets + b.retransmitted_packets,
        retries: a.retries + b.retries,
        ack_timeouts: a.ack_timeouts + b.ack_timeouts,
        rnr_naks_sent: a.rnr_naks_sent + b.rnr_naks_sent,
        rnr_naks_received: a.rnr_naks_received + b.rnr_naks_received,
        naks_sent: a.naks_sent + b.naks_sent,
        naks_received: a.naks_received + b.naks_received,
        out_of_sequence: a.out_of_sequence + b.out_of_sequence,
        duplicate_requests: a.duplicate_requests + b.duplicate_requests,
        duplicate_responses: a.duplicate_responses + b.duplicate_responses,
        qkey_violations: a.qkey_violations + b.qkey_violations,
        messages_dropped: a.messages_dropped + b.messages_dropped,
        icrc_errors: a.icrc_errors + b.icrc_errors,
        responses_dropped: a.responses_dropped + b.responses_dropped,
        doorbells_merged: a.doorbells_merged + b.doorbells_merged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(frames: u64, retransmitted: u64, timeouts: u64) -> TransportCounters {
        TransportCounters {
            frames_transmitted: frames,
            retransmitted_packets: retransmitted,
            ack_timeouts: timeouts,
            ..TransportCounters::default()
        }
    }

    #[test]
    fn counters_survive_a_reset_to_zero() {
        let mut totals = TransportTotals::default();
        totals.observe(counters(100, 7, 1));
        totals.observe(TransportCounters::default());
        let total = totals.total(counters(5, 2, 0));
        assert_eq!(
            (
                total.frames_transmitted,
                total.retransmitted_packets,
                total.ack_timeouts
            ),
            (105, 9, 1)
        );
    }

    #[test]
    fn a_reset_between_two_observations_is_seen_by_the_fall() {
        let mut totals = TransportTotals::default();
        totals.observe(counters(100, 7, 1));
        // Reset, then 40 new frames before the next look.
        let total = totals.total(counters(40, 0, 0));
        assert_eq!((total.frames_transmitted, total.retransmitted_packets), (140, 7));
    }

    #[test]
    fn growing_counters_are_not_added_twice() {
        let mut totals = TransportTotals::default();
        totals.observe(counters(10, 1, 0));
        totals.observe(counters(20, 1, 0));
        assert_eq!(totals.total(counters(30, 2, 1)), counters(30, 2, 1));
    }
}
