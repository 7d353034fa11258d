//! How busy a serving node is: the share of wall time spent inside its
//! serve calls, over the whole run and in its busiest interval. A node whose
//! busiest interval is near 1.0 queues requests and misses its SLO; the
//! default job keeps it at or below 0.5 so that a slower machine or a burst
//! still has headroom.
//!
//! Times are plain nanosecond counts supplied by the caller (wall clock),
//! so the meter is deterministic under test.

use serde::{Deserialize, Serialize};

/// Busy shares of one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BusyShare {
    /// Busy time ÷ wall time since the meter started.
    pub whole: f64,
    /// The largest busy share of any interval (the last, partial interval
    /// counts once it is at least half an interval long).
    pub peak: f64,
}

#[derive(Clone, Debug)]
pub struct BusyMeter {
    interval_ns: u64,
    origin_ns: u64,
    busy_total_ns: u64,
    /// Index of the interval being filled and its busy time so far.
    bucket: u64,
    bucket_busy_ns: u64,
    peak: f64,
}

impl BusyMeter {
    /// A meter whose intervals of `interval_ns` start at `origin_ns`.
    pub fn new(origin_ns: u64, interval_ns: u64) -> Self {
        Self {
            interval_ns: interval_ns.max(1),
            origin_ns,
            busy_total_ns: 0,
            bucket: 0,
            bucket_busy_ns: 0,
            peak: 0.0,
        }
    }

    /// The node worked from `start_ns` to `end_ns`. Spans are recorded in
    /// order and do not overlap (one node serves one batch at a time).
    pub fn record(&mut self, start_ns: u64, end_ns: u64) {
        let mut s = start_ns.max(self.origin_ns);
        let end = end_ns.max(s);
        self.busy_total_ns = self.busy_total_ns.saturating_add(end - s);
        // A span may cross interval edges: split it.
        while s < end {
            let index = (s - self.origin_ns) / self.interval_ns;
            self.advance_to(index);
            let edge = self
                .origin_ns
                .saturating_add((index + 1).saturating_mul(self.interval_ns));
            let piece_end = end.min(edge);
            self.bucket_busy_ns += piece_end - s;
            s = piece_end;
        }
    }

    /// Closes every interval before `index`.
    fn advance_to(&mut self, index: u64) {
        if index > self.bucket {
            self.peak = self.peak.max(self.share_of(self.bucket_busy_ns));
            self.bucket = index;
            self.bucket_busy_ns = 0;
        }
    }

    fn share_of(&self, busy_ns: u64) -> f64 {
        (busy_ns as f64 / self.interval_ns as f64).min(1.0)
    }

    /// Shares as of `now_ns`.
    pub fn shares(&self, now_ns: u64) -> BusyShare {
        let elapsed = now_ns.saturating_sub(self.origin_ns);
        let whole = if elapsed == 0 {
            0.0
        } else {
            (self.busy_total_ns as f64 / elapsed as f64).min(1.0)
        };
        let bucket_start = self.bucket.saturating_mul(self.interval_ns);
        let in_bucket = elapsed.saturating_sub(bucket_start).min(self.interval_ns);
        let mut peak = self.peak;
        if in_bucket * 2 >= self.interval_ns {
            peak = peak.max((self.bucket_busy_ns as f64 / in_bucket as f64).min(1.0));
        }
        // Some stretch of the run is at least as busy as the run itself: a
        // run shorter than half an interval (it read 0), or one busy mostly
        // in its short tail, would otherwise peak under its whole share.
        peak = peak.max(whole);
        BusyShare { whole, peak }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn whole_share_is_busy_over_elapsed() {
        let mut m = BusyMeter::new(0, 5 * S);
        m.record(0, S);
        m.record(2 * S, 3 * S);
        let s = m.shares(10 * S);
        assert!((s.whole - 0.2).abs() < 1e-12);
        // Two of five seconds in the first interval, none in the second.
        assert!((s.peak - 0.4).abs() < 1e-12);
    }

    #[test]
    fn the_busiest_interval_sets_the_peak() {
        let mut m = BusyMeter::new(100, 5 * S);
        m.record(100, 100 + S); // interval 0: 0.2
        m.record(100 + 5 * S, 100 + 9 * S); // interval 1: 0.8
        m.record(100 + 12 * S, 100 + 13 * S); // interval 2: 0.2
        let s = m.shares(100 + 15 * S);
        assert!((s.peak - 0.8).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn a_span_across_an_edge_is_split() {
        let mut m = BusyMeter::new(0, 10);
        m.record(6, 14); // 4 in interval 0, 4 in interval 1
        m.record(15, 18); // 3 more in interval 1
        let s = m.shares(20);
        assert!((s.peak - 0.7).abs() < 1e-12, "{s:?}");
        assert!((s.whole - 11.0 / 20.0).abs() < 1e-12);
    }

    #[test]
    fn a_short_tail_interval_counts_only_through_the_whole_share() {
        let mut m = BusyMeter::new(0, 10);
        m.record(0, 2);
        m.record(10, 12); // the tail interval is 3 long at `now`
        // Not the tail's 2/3: the run's 4/13, above the first interval's 0.2.
        let s = m.shares(13);
        assert!((s.peak - 4.0 / 13.0).abs() < 1e-12, "{s:?}");
        // Half an interval in, it counts with its real length.
        assert!((m.shares(15).peak - 0.4).abs() < 1e-12);
    }

    #[test]
    fn a_run_shorter_than_half_an_interval_peaks_at_its_whole_share() {
        let mut m = BusyMeter::new(0, 10);
        m.record(0, 3);
        let s = m.shares(4);
        assert!((s.whole - 0.75).abs() < 1e-12);
        assert_eq!(s.peak, s.whole, "{s:?}");
    }

    #[test]
    fn the_peak_is_never_under_the_whole_share() {
        let mut m = BusyMeter::new(0, 10);
        m.record(0, 1);
        m.record(20, 24); // busy mostly in a tail shorter than half an interval
        let s = m.shares(24);
        assert!((s.whole - 5.0 / 24.0).abs() < 1e-12);
        // It read 0.1, the first interval's share.
        assert_eq!(s.peak, s.whole, "{s:?}");
    }

    #[test]
    fn nothing_recorded_is_idle() {
        let m = BusyMeter::new(0, 10);
        assert_eq!(m.shares(0), BusyShare::default());
        assert_eq!(m.shares(100), BusyShare::default());
    }

    #[test]
    fn spans_before_the_origin_are_clipped() {
        let mut m = BusyMeter::new(50, 10);
        m.record(40, 55);
        assert!((m.shares(60).whole - 0.5).abs() < 1e-12);
    }
}
