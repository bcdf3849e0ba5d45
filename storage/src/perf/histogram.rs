//! A latency histogram with log-linear buckets: 64 sub-buckets per power of two, so any
//! recorded value is reported within 1/64 (1.6 %) of itself, in 4 096 counters whatever
//! the number of samples.

/// Sub-buckets per power of two (2^6).
const SUB_BITS: u32 = 6;
const SUB_BUCKETS: u64 = 1 << SUB_BITS;

/// Latencies in nanoseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    total: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; (64 - SUB_BITS as usize + 1) * SUB_BUCKETS as usize],
            total: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }
}

fn bucket_of(value: u64) -> usize {
    if value < SUB_BUCKETS {
        return value as usize;
    }
    let magnitude = 63 - value.leading_zeros() - (SUB_BITS - 1);
    let sub = (value >> (magnitude - 1)) & (SUB_BUCKETS - 1);
    (magnitude as u64 * SUB_BUCKETS + sub) as usize
}

/// The lowest value of bucket `index`.
fn bucket_floor(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB_BUCKETS {
        return index;
    }
    let magnitude = index / SUB_BUCKETS;
    let sub = index % SUB_BUCKETS;
    (SUB_BUCKETS | sub) << (magnitude - 1)
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one latency.
    pub fn record(&mut self, nanoseconds: u64) {
        self.counts[bucket_of(nanoseconds)] += 1;
        self.total += 1;
        self.min = self.min.min(nanoseconds);
        self.max = self.max.max(nanoseconds);
        self.sum += u128::from(nanoseconds);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Smallest sample (0 when empty).
    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }

    /// Largest sample.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The `q`-quantile (0..=1), nearest rank, reported as its bucket's lowest value
    /// (clamped to the recorded minimum and maximum).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_floor(index).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for value in (0..1_000_000u64).step_by(7).chain([u64::MAX / 2, u64::MAX]) {
            let bucket = bucket_of(value);
            assert!(bucket >= last, "{value}");
            last = bucket;
            let floor = bucket_floor(bucket);
            assert!(floor <= value, "{value}: floor {floor}");
            assert!(value - floor <= value / 32 + 1, "{value}: floor {floor}");
        }
    }

    #[test]
    fn quantiles_of_a_uniform_run() {
        let mut h = LatencyHistogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.min(), 1000);
        assert_eq!(h.max(), 10_000_000);
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 5_000_000.0).abs() / 5_000_000.0 < 0.02, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 9_900_000.0).abs() / 9_900_000.0 < 0.02, "{p99}");
        assert!((h.mean() - 5_000_500.0).abs() < 1.0);
        let mut other = LatencyHistogram::new();
        other.record(1);
        h.merge(&other);
        assert_eq!((h.min(), h.count()), (1, 10_001));
    }

    #[test]
    fn empty_and_single() {
        let h = LatencyHistogram::new();
        assert_eq!((h.quantile(0.5), h.min(), h.mean()), (0, 0, 0.0));
        let mut h = LatencyHistogram::new();
        h.record(12_345);
        assert_eq!(h.quantile(0.0), 12_345);
        assert_eq!(h.quantile(0.999), 12_345);
    }
}
