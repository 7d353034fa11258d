//! Latency histogram with bounded memory for jobs that run for months:
//! logarithmic buckets 1% wide from 1 µs up, so a quantile is within 1%.

const GROWTH: f64 = 1.01;
const MIN_MS: f64 = 0.001;
const BUCKETS: usize = 2_400; // 1 µs · 1.01^2400 ≈ 6.7 hours

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    total: u64,
    max_ms: f64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            max_ms: 0.0,
        }
    }
}

impl LatencyHistogram {
    fn bucket(ms: f64) -> usize {
        if ms.is_nan() || ms <= MIN_MS {
            return 0;
        }
        ((ms / MIN_MS).ln() / GROWTH.ln())
            .ceil()
            .min((BUCKETS - 1) as f64) as usize
    }

    pub fn record(&mut self, ms: f64) {
        self.counts[Self::bucket(ms)] += 1;
        self.total += 1;
        if ms > self.max_ms {
            self.max_ms = ms;
        }
    }

    /// Adds another histogram's samples (e.g. per-node into overall).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max_ms = self.max_ms.max(other.max_ms);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max_ms(&self) -> f64 {
        self.max_ms
    }

    /// The `q`-quantile (0..=1), as the upper edge of its bucket; 0 when empty.
    /// One that lands in the last bucket, which also holds everything past
    /// the buckets' range, is the largest latency seen: an upper bound, where
    /// the bucket's edge would understate it.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                if i == BUCKETS - 1 {
                    return self.max_ms;
                }
                return (MIN_MS * GROWTH.powi(i as i32)).min(self.max_ms);
            }
        }
        self.max_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_past_the_buckets_range_is_not_cut_at_its_end() {
        // Buckets end near 6.7 hours; a day-long latency is not reported as that.
        let day_ms = 86_400_000.0;
        let mut h = LatencyHistogram::default();
        h.record(1.0);
        h.record(day_ms);
        h.record(2.0 * day_ms);
        assert_eq!(h.quantile(0.99), 2.0 * day_ms);
        assert!(h.quantile(0.5) >= day_ms, "{}", h.quantile(0.5));
        assert!((h.quantile(0.1) - 1.0).abs() <= 0.01);
    }

    #[test]
    fn quantiles_are_within_one_percent() {
        let mut h = LatencyHistogram::default();
        for i in 1..=10_000 {
            h.record(i as f64 * 0.01); // 0.01 .. 100 ms
        }
        for (q, exact) in [(0.5, 50.0), (0.99, 99.0), (1.0, 100.0)] {
            let got = h.quantile(q);
            assert!(
                (got - exact).abs() <= exact * 0.011,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(h.count(), 10_000);
    }

    #[test]
    fn merged_histograms_equal_one_fed_everything() {
        let (mut a, mut b, mut all) = Default::default();
        let (a, b, all): (
            &mut LatencyHistogram,
            &mut LatencyHistogram,
            &mut LatencyHistogram,
        ) = (&mut a, &mut b, &mut all);
        for i in 1..=5_000 {
            let ms = (i * 7 % 1_000) as f64 * 0.1;
            if i % 2 == 0 {
                a.record(ms)
            } else {
                b.record(ms)
            }
            all.record(ms);
        }
        a.merge(b);
        assert_eq!(a.count(), all.count());
        assert_eq!(a.max_ms(), all.max_ms());
        for q in [0.5, 0.95, 0.99, 1.0] {
            assert_eq!(a.quantile(q), all.quantile(q));
        }
    }

    #[test]
    fn empty_and_degenerate_values() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile(0.99), 0.0);
        h.record(0.0);
        h.record(f64::NAN);
        assert_eq!(h.count(), 2);
        assert!(h.quantile(1.0) <= MIN_MS);
    }
}
