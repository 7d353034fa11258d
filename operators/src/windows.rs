//! Windowed node statistics: the state vector of HLEM Table I
//! (requests, hot-user share, EMB hit rate, KV token-reuse rate, mean
//! sequence length, SLO-violation share, p99 latency) per node and window.
//!
//! A window is aggregated as its samples arrive ([`WindowAccumulator`]) and
//! retired once closed, so what a job holds is bounded by its open windows,
//! not by the requests it has served.

use serde::{Deserialize, Serialize};

/// What one request answered by a node contributes to its window: served,
/// or failed (shed past its deadline, or unservable), which counts as a
/// request that missed its SLO and has no latency.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TelemetrySample {
    /// Nanoseconds: whole microseconds cut up to 4% off the p99 of a
    /// 25 µs SLO on the virtual clock.
    pub latency_ns: u64,
    pub hot_user: bool,
    pub emb_hits: u32,
    pub emb_lookups: u32,
    pub kv_reused_tokens: u32,
    pub kv_total_tokens: u32,
    pub seq_len: u32,
    pub slo_violated: bool,
    /// α of the node when it served the request, in thousandths.
    pub alpha_milli: u32,
    /// Served with a truncated history (the KV share could not hold it).
    #[serde(default)]
    pub truncated: bool,
    /// The node's α was pinned by an operator when it served the request.
    #[serde(default)]
    pub alpha_pinned: bool,
    /// Answered with an error instead of a response: only `hot_user`,
    /// `alpha_milli` and `alpha_pinned` are meaningful.
    #[serde(default)]
    pub failed: bool,
    /// The latency scaled to the rank SLO (× `slo_ms.rank` / the request
    /// kind's SLO), which the allocator holds to the rank SLO: a retrieve
    /// request within its own SLO is within it too. None: the latency.
    #[serde(default)]
    pub scaled_latency_ns: Option<u64>,
}

impl TelemetrySample {
    /// A request the node answered with an error (shed or unservable).
    pub fn failed(hot_user: bool, alpha_milli: u32, alpha_pinned: bool) -> Self {
        Self {
            latency_ns: 0,
            hot_user,
            emb_hits: 0,
            emb_lookups: 0,
            kv_reused_tokens: 0,
            kv_total_tokens: 0,
            seq_len: 0,
            slo_violated: true,
            alpha_milli,
            truncated: false,
            alpha_pinned,
            failed: true,
            scaled_latency_ns: None,
        }
    }
}

/// Aggregates of one (node, window). `requests`, `hot_user_share` and
/// `slo_violation_share` count every request the node answered, failed ones
/// included (a shed request missed its SLO), and so does α (a failed
/// request was failed at some α); the latency, hit-rate, length and
/// truncation figures are over the served ones.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct WindowStats {
    pub requests: u64,
    /// Requests answered with an error (shed past the deadline, unservable).
    #[serde(default)]
    pub failed: u64,
    pub hot_user_share: f64,
    pub emb_hit_rate: f64,
    pub kv_hit_rate: f64,
    pub mean_seq_len: f64,
    pub slo_violation_share: f64,
    pub p99_ms: f64,
    pub alpha: f64,
    /// Share of requests served with a truncated history.
    #[serde(default)]
    pub truncated_share: f64,
    /// α of the window's latest request (by event time): the node's α as
    /// the window ended, which an operator's pin or a KV reclaim may have
    /// moved away from what the allocator last set. None where the
    /// samples carry no time.
    #[serde(default)]
    pub alpha_end: Option<f64>,
    /// α was pinned by an operator as the window ended (its latest
    /// request): the node refuses the allocator's moves until released.
    #[serde(default)]
    pub pinned_end: bool,
    /// p99 of the served latencies scaled to the rank SLO (see
    /// [`TelemetrySample::scaled_latency_ns`]): what the allocator compares
    /// with `slo_ms.rank` when rank and retrieve SLOs differ. Equal to
    /// `p99_ms` when they do not; None when nothing was served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_scaled_ms: Option<f64>,
}

/// Start of the window that holds `ts_ms`.
pub fn window_start(ts_ms: u64, window_ms: u64) -> u64 {
    ts_ms - ts_ms % window_ms.max(1)
}

impl WindowStats {
    /// Aggregates samples given with their multiplicities, in sorted order
    /// (as differential's reduce presents them; order does not matter here
    /// except that p99 needs latencies, which are sorted first in the key).
    pub fn from_samples<'a>(samples: impl IntoIterator<Item = (&'a TelemetrySample, u64)>) -> Self {
        let (mut n, mut failed) = (0u64, 0u64);
        let (mut hot, mut emb_hits, mut emb_lookups, mut kv_reused, mut kv_total) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut seq, mut violated, mut alpha, mut truncated) = (0u64, 0u64, 0u64, 0u64);
        let mut latencies: Vec<(u64, u64)> = Vec::new();
        let mut scaled: Vec<(u64, u64)> = Vec::new();
        for (s, count) in samples {
            if count == 0 {
                continue;
            }
            n += count;
            hot += s.hot_user as u64 * count;
            violated += s.slo_violated as u64 * count;
            alpha += s.alpha_milli as u64 * count;
            if s.failed {
                failed += count;
                continue;
            }
            emb_hits += s.emb_hits as u64 * count;
            emb_lookups += s.emb_lookups as u64 * count;
            kv_reused += s.kv_reused_tokens as u64 * count;
            kv_total += s.kv_total_tokens as u64 * count;
            seq += s.seq_len as u64 * count;
            truncated += s.truncated as u64 * count;
            latencies.push((s.latency_ns, count));
            scaled.push((s.scaled_latency_ns.unwrap_or(s.latency_ns), count));
        }
        if n == 0 {
            return Self::default();
        }
        latencies.sort_unstable();
        scaled.sort_unstable();
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let served = n - failed;
        Self {
            requests: n,
            failed,
            hot_user_share: ratio(hot, n),
            emb_hit_rate: ratio(emb_hits, emb_lookups),
            kv_hit_rate: ratio(kv_reused, kv_total),
            mean_seq_len: ratio(seq, served),
            slo_violation_share: ratio(violated, n),
            p99_ms: percentile_weighted(&latencies, 0.99) as f64 / 1e6,
            alpha: ratio(alpha, n) / 1000.0,
            truncated_share: ratio(truncated, served),
            alpha_end: None,
            pinned_end: false,
            p99_scaled_ms: (served > 0).then(|| percentile_weighted(&scaled, 0.99) as f64 / 1e6),
        }
    }
}

/// The running aggregate of one open (node, window): sums and the window's
/// latencies (for its exact p99), dropped when the window closes.
#[derive(Clone, Debug, Default)]
pub struct WindowAccumulator {
    requests: u64,
    failed: u64,
    hot: u64,
    emb_hits: u64,
    emb_lookups: u64,
    kv_reused: u64,
    kv_total: u64,
    seq: u64,
    violated: u64,
    alpha_milli: u64,
    truncated: u64,
    latencies_ns: Vec<u64>,
    /// The same, scaled to the rank SLO; empty until a sample is scaled
    /// (equal SLOs: the scaled latency is the latency, not kept twice).
    scaled_ns: Vec<u64>,
    /// (event time, α in thousandths, pinned) of the latest sample; the
    /// larger on a tie, so that the order samples arrive in does not matter.
    latest: Option<(u64, u32, bool)>,
}

impl WindowAccumulator {
    /// Adds the sample of a request served at event time `time_ms`.
    pub fn add(&mut self, time_ms: u64, s: &TelemetrySample) {
        self.latest = self
            .latest
            .max(Some((time_ms, s.alpha_milli, s.alpha_pinned)));
        self.requests += 1;
        self.hot += s.hot_user as u64;
        self.violated += s.slo_violated as u64;
        self.alpha_milli += s.alpha_milli as u64;
        if s.failed {
            self.failed += 1;
            return;
        }
        self.emb_hits += s.emb_hits as u64;
        self.emb_lookups += s.emb_lookups as u64;
        self.kv_reused += s.kv_reused_tokens as u64;
        self.kv_total += s.kv_total_tokens as u64;
        self.seq += s.seq_len as u64;
        self.truncated += s.truncated as u64;
        if let Some(scaled) = s.scaled_latency_ns {
            if self.scaled_ns.is_empty() {
                // The first scaled sample: the unscaled ones before it
                // count at their own latency.
                self.scaled_ns.extend_from_slice(&self.latencies_ns);
            }
            self.scaled_ns.push(scaled);
        } else if !self.scaled_ns.is_empty() {
            self.scaled_ns.push(s.latency_ns);
        }
        self.latencies_ns.push(s.latency_ns);
    }

    /// Samples added so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// The window's statistics; the same as [`WindowStats::from_samples`]
    /// over the samples added.
    pub fn finish(mut self) -> WindowStats {
        let n = self.requests;
        if n == 0 {
            return WindowStats::default();
        }
        self.latencies_ns.sort_unstable();
        self.scaled_ns.sort_unstable();
        let scaled = if self.scaled_ns.is_empty() {
            &self.latencies_ns
        } else {
            &self.scaled_ns
        };
        let served = self.latencies_ns.len();
        // No request served: no latency to take a percentile of.
        let p99 = |sorted: &[u64]| match served {
            0 => 0,
            _ => sorted[((0.99 * served as f64).ceil() as usize).clamp(1, served) - 1],
        };
        let p99_ns = p99(&self.latencies_ns);
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        WindowStats {
            requests: n,
            failed: self.failed,
            hot_user_share: ratio(self.hot, n),
            emb_hit_rate: ratio(self.emb_hits, self.emb_lookups),
            kv_hit_rate: ratio(self.kv_reused, self.kv_total),
            mean_seq_len: ratio(self.seq, served as u64),
            slo_violation_share: ratio(self.violated, n),
            p99_ms: p99_ns as f64 / 1e6,
            alpha: ratio(self.alpha_milli, n) / 1000.0,
            truncated_share: ratio(self.truncated, served as u64),
            alpha_end: self.latest.map(|(_, a, _)| a as f64 / 1000.0),
            pinned_end: self.latest.is_some_and(|(_, _, pinned)| pinned),
            p99_scaled_ms: (served > 0).then(|| p99(scaled) as f64 / 1e6),
        }
    }
}

/// Nearest-rank percentile of sorted (value, count) pairs.
pub fn percentile_weighted(sorted: &[(u64, u64)], q: f64) -> u64 {
    let total: u64 = sorted.iter().map(|(_, c)| c).sum();
    if total == 0 {
        return 0;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for &(v, c) in sorted {
        seen += c;
        if seen >= rank {
            return v;
        }
    }
    sorted.last().map_or(0, |(v, _)| *v)
}

/// Nearest-rank percentile of an ascending slice.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of `latency_us` microseconds.
    fn sample(latency_us: u64, hot: bool, violated: bool) -> TelemetrySample {
        TelemetrySample {
            latency_ns: latency_us * 1_000,
            hot_user: hot,
            emb_hits: 3,
            emb_lookups: 4,
            kv_reused_tokens: 10,
            kv_total_tokens: 40,
            seq_len: 140,
            slo_violated: violated,
            alpha_milli: 500,
            truncated: false,
            alpha_pinned: false,
            failed: false,
            scaled_latency_ns: None,
        }
    }

    #[test]
    fn the_scaled_p99_takes_each_latency_at_its_scale_in_both_aggregations() {
        // 100 requests: 98 at 10 ms, two slow retrieve ones at 90 ms whose
        // SLO is three times the rank one (30 ms scaled).
        let mut samples: Vec<TelemetrySample> =
            (0..98).map(|_| sample(10_000, false, false)).collect();
        for _ in 0..2 {
            samples.push(TelemetrySample {
                scaled_latency_ns: Some(30_000_000),
                ..sample(90_000, false, false)
            });
        }
        samples.push(TelemetrySample::failed(false, 500, false));
        let whole = WindowStats::from_samples(samples.iter().map(|s| (s, 1)));
        let mut acc = WindowAccumulator::default();
        for (t, s) in samples.iter().enumerate() {
            acc.add(t as u64, s);
        }
        let running = acc.finish();
        for w in [&whole, &running] {
            assert_eq!(w.p99_ms, 90.0);
            assert_eq!(w.p99_scaled_ms, Some(30.0));
        }
        // Unscaled samples (equal SLOs) give the p99 itself; no served
        // request, none.
        let plain = WindowStats::from_samples([(&sample(7_000, false, false), 3)]);
        assert_eq!(plain.p99_scaled_ms, Some(plain.p99_ms));
        let mut acc = WindowAccumulator::default();
        for (t, ms) in [7, 3, 9].into_iter().enumerate() {
            acc.add(t as u64, &sample(ms * 1000, false, false));
        }
        let plain = acc.finish();
        assert_eq!((plain.p99_ms, plain.p99_scaled_ms), (9.0, Some(9.0)));
        let none = WindowStats::from_samples([(&TelemetrySample::failed(false, 0, false), 2)]);
        assert_eq!(none.p99_scaled_ms, None);
    }

    #[test]
    fn aggregates_with_multiplicities() {
        let a = sample(1_000, true, false);
        let b = sample(50_000, false, true);
        let w = WindowStats::from_samples([(&a, 3), (&b, 1)]);
        assert_eq!(w.requests, 4);
        assert_eq!(w.hot_user_share, 0.75);
        assert_eq!(w.emb_hit_rate, 0.75);
        assert_eq!(w.kv_hit_rate, 0.25);
        assert_eq!(w.mean_seq_len, 140.0);
        assert_eq!(w.slo_violation_share, 0.25);
        assert_eq!(w.p99_ms, 50.0);
        assert_eq!(w.alpha, 0.5);
    }

    /// A 25.9 µs p99 against a 25 µs SLO: kept in whole microseconds it
    /// read 25 µs, within the SLO that the same window counted as missed.
    #[test]
    fn sub_microsecond_latencies_survive() {
        let s = TelemetrySample {
            latency_ns: 25_900,
            ..sample(0, false, true)
        };
        let w = WindowStats::from_samples([(&s, 1)]);
        assert!((w.p99_ms - 0.0259).abs() < 1e-12, "{}", w.p99_ms);
        let mut acc = WindowAccumulator::default();
        acc.add(1, &s);
        assert!((acc.finish().p99_ms - 0.0259).abs() < 1e-12);
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile_weighted(&[(1, 98), (7, 2)], 0.99), 7);
    }

    #[test]
    fn the_accumulator_agrees_with_the_batch_aggregate() {
        let samples: Vec<TelemetrySample> = (0..257u64)
            .map(|i| {
                let mut s = sample((i * 7_919) % 90_001, i % 3 == 0, i % 5 == 0);
                s.emb_hits = (i % 4) as u32;
                s.kv_reused_tokens = (i % 40) as u32;
                s.seq_len = 100 + (i % 50) as u32;
                s.alpha_milli = 400 + (i % 3) as u32 * 100;
                if i % 11 == 0 {
                    s = TelemetrySample::failed(i % 2 == 0, s.alpha_milli, false);
                }
                s
            })
            .collect();
        let mut acc = WindowAccumulator::default();
        for (i, s) in samples.iter().enumerate() {
            acc.add(i as u64 / 2, s);
        }
        assert_eq!(acc.requests(), 257);
        let batch = WindowStats::from_samples(samples.iter().map(|s| (s, 1)));
        let acc = acc.finish();
        // The batch aggregate has no times, hence no α at the end.
        assert_eq!(acc.alpha_end, Some(0.5));
        assert_eq!(
            acc,
            WindowStats {
                alpha_end: Some(0.5),
                ..batch
            }
        );
        assert_eq!(acc.failed, 24);
        assert_eq!(
            WindowAccumulator::default().finish(),
            WindowStats::default()
        );
    }

    #[test]
    fn failed_requests_count_as_requests_that_missed_the_slo() {
        // A window where half the requests were shed: it read as 2 requests,
        // none late, before failures reached the windows.
        let mut acc = WindowAccumulator::default();
        acc.add(1, &sample(1_000, true, false));
        acc.add(2, &sample(3_000, false, false));
        acc.add(3, &TelemetrySample::failed(true, 500, false));
        acc.add(4, &TelemetrySample::failed(false, 500, false));
        let w = acc.finish();
        assert_eq!((w.requests, w.failed), (4, 2));
        assert_eq!(w.slo_violation_share, 0.5);
        assert_eq!(w.hot_user_share, 0.5);
        // Latency, length and hit rates are the served requests'.
        assert_eq!(w.p99_ms, 3.0);
        assert_eq!(w.mean_seq_len, 140.0);
        assert_eq!(w.emb_hit_rate, 0.75);
        // Every request failed: violated, with no latency to report.
        let mut all = WindowAccumulator::default();
        all.add(1, &TelemetrySample::failed(false, 500, false));
        let w = all.finish();
        assert_eq!((w.requests, w.failed, w.p99_ms), (1, 1, 0.0));
        assert_eq!(w.slo_violation_share, 1.0);
    }

    #[test]
    fn the_alpha_at_the_end_is_the_latest_requests_whatever_the_order() {
        let at = |alpha_milli| TelemetrySample {
            alpha_milli,
            ..sample(1_000, false, false)
        };
        let mut acc = WindowAccumulator::default();
        acc.add(30, &at(300));
        acc.add(10, &at(500));
        acc.add(30, &at(200));
        acc.add(20, &at(700));
        let w = acc.finish();
        assert_eq!(w.alpha_end, Some(0.3));
        assert!((w.alpha - 0.425).abs() < 1e-12);
        assert!(!w.pinned_end);
    }

    #[test]
    fn a_pin_counts_when_it_holds_at_the_windows_end() {
        let at = |alpha_pinned| TelemetrySample {
            alpha_pinned,
            ..sample(1_000, false, false)
        };
        let mut pinned_then_released = WindowAccumulator::default();
        pinned_then_released.add(10, &at(true));
        pinned_then_released.add(20, &at(false));
        assert!(!pinned_then_released.finish().pinned_end);
        let mut pinned = WindowAccumulator::default();
        pinned.add(20, &at(true));
        pinned.add(10, &at(false));
        assert!(pinned.finish().pinned_end);
    }

    #[test]
    fn windows_are_aligned() {
        assert_eq!(window_start(12_345, 5_000), 10_000);
        assert_eq!(window_start(4_999, 5_000), 0);
    }
}
