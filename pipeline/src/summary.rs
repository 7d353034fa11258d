//! The run summary (summary.json and the human summary).

use serde::{Deserialize, Serialize};

use grflow_connectors::WindowRow;
use grflow_operators::router::RouterStats;
use grflow_operators::windows::percentile;
use grflow_traces::Mode;

use crate::config::SloMs;
use crate::serve::histogram::LatencyHistogram;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl LatencySummary {
    pub fn from_unsorted(mut latencies: Vec<f64>) -> Self {
        latencies.sort_by(f64::total_cmp);
        Self {
            p50: percentile(&latencies, 0.50),
            p95: percentile(&latencies, 0.95),
            p99: percentile(&latencies, 0.99),
            max: latencies.last().copied().unwrap_or(0.0),
        }
    }

    /// Percentiles from a bounded histogram (within 1%); the max is exact.
    /// None when it holds no latency: a 0 ms p99 would read as a fact.
    pub fn from_histogram(h: &LatencyHistogram) -> Option<Self> {
        (h.count() > 0).then(|| Self {
            p50: h.quantile(0.50),
            p95: h.quantile(0.95),
            p99: h.quantile(0.99),
            max: h.max_ms(),
        })
    }
}

/// The latencies of a run in bounded memory: a histogram for percentiles,
/// an exact count of those within the SLO, and the requests answered with
/// an error (shed or unservable), which have no latency to rank but missed
/// the SLO all the same.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LatencyTally {
    histogram: LatencyHistogram,
    within_slo: u64,
    #[serde(default)]
    failed: u64,
}

impl LatencyTally {
    pub fn record(&mut self, latency_ms: f64, slo_ms: f64) {
        self.histogram.record(latency_ms);
        self.within_slo += (latency_ms <= slo_ms) as u64;
    }

    /// `n` requests answered with an error record instead of a response.
    pub fn record_failures(&mut self, n: u64) {
        self.failed += n;
    }

    pub fn merge(&mut self, other: &LatencyTally) {
        self.histogram.merge(&other.histogram);
        self.within_slo += other.within_slo;
        self.failed += other.failed;
    }

    /// Responses recorded (failures not included).
    pub fn count(&self) -> u64 {
        self.histogram.count()
    }

    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// The percentiles; None when no response was recorded.
    pub fn summary(&self) -> Option<LatencySummary> {
        LatencySummary::from_histogram(&self.histogram)
    }

    /// (latency ms, share of requests at or below it) at `points` evenly
    /// spaced quantiles up to 1: the CDF a picture of the run draws.
    pub fn cdf(&self, points: usize) -> Vec<(f64, f64)> {
        if self.count() == 0 {
            return Vec::new();
        }
        (1..=points)
            .map(|i| {
                let q = i as f64 / points as f64;
                (self.histogram.quantile(q), q)
            })
            .collect()
    }

    /// Share of requests answered within the SLO: responses within it over
    /// responses and failures (None when nothing was recorded: 0 would read
    /// as "every one missed"). A shed request is a miss, as a client sees it.
    pub fn slo_satisfaction(&self) -> Option<f64> {
        let requests = self.count() + self.failed;
        (requests > 0).then(|| self.within_slo as f64 / requests as f64)
    }
}

/// Per-node figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub node: u32,
    pub responses_out: u64,
    pub alpha: f64,
    pub emb_hit_rate: f64,
    pub kv_hit_rate: f64,
    /// Null when the node served no request (as each kind's in `by_mode`).
    pub latency_ms: Option<LatencySummary>,
    /// Share of this node's responses within the SLO (an error record does
    /// not say which node failed it; the run's figure counts those); null
    /// when the node served no request.
    pub slo_satisfaction: Option<f64>,
    /// Counters of the node's caches and link, for operators.
    pub emb_hits: u64,
    pub emb_lookups: u64,
    pub kv_reused_tokens: u64,
    pub kv_total_tokens: u64,
    pub link_bytes: u64,
    pub oov_items: u64,
    /// Wall time inside the node's serve calls ÷ wall time of the run.
    pub busy_share: f64,
    /// The same share in the node's busiest wall-time interval (one window
    /// long); near 1.0 the node queues requests.
    pub busy_share_peak: f64,
    /// Requests served with only the most recent part of their history.
    #[serde(default)]
    pub truncated_histories: u64,
    /// Requests for the history of a user the users table does not know
    /// (`hist_len` > 0): served with an empty one.
    #[serde(default)]
    pub unknown_user_histories: u64,
    /// Requests that did not fit the KV share alone and were served after
    /// it took pages back from EMB (α lowered on demand).
    #[serde(default)]
    pub kv_reclaims: u64,
    /// User prefix heads dropped because the node's table was full
    /// (node.max_users), and the most it ever held.
    #[serde(default)]
    pub user_head_evictions: u64,
    #[serde(default)]
    pub user_heads_peak: u64,
    /// α moves that changed the boundary, the EMB refill they queued on the
    /// link's low-priority lane (bytes; at most the pages that moved to EMB,
    /// and transferred only with `link.refill_share` of the link), and the
    /// most one move queued (HLEM §IV-B's bounded reallocation traffic).
    #[serde(default)]
    pub alpha_moves: u64,
    #[serde(default)]
    pub refill_bytes: u64,
    #[serde(default)]
    pub refill_bytes_max_per_move: u64,
    /// Model GFLOPs executed (uncached suffixes, candidates, instruction
    /// tokens, decode steps), model calls, requests per call (buckets
    /// 1, 2, 3–4, 5–8, 9–16, 17–32, 33–64, 65+) and wall-time queue wait
    /// before the batch (ms buckets ≤1, ≤2, ≤5, ≤10, ≤20, ≤50, ≤100, ≤200,
    /// ≤500, more).
    #[serde(default)]
    pub model_gflop: f64,
    /// What the node's GEMMs executed (GFLOP) and the wall time inside them
    /// (s): `gemm_gflop / gemm_s` is the GEMM rate the node got in place.
    /// `model_gflop` is the model's FLOPs by formula; this is what the
    /// products ran (attention's own products included).
    #[serde(default)]
    pub gemm_gflop: f64,
    #[serde(default)]
    pub gemm_s: f64,
    /// GEMM calls behind `gemm_gflop` (`gemm_gflop / gemm_calls`: the mean
    /// product's size).
    #[serde(default)]
    pub gemm_calls: u64,
    /// Tokens computed (cached history excluded): with busy_share, the
    /// node's measured service rate (calibrates node.service_tokens_per_ms).
    #[serde(default)]
    pub computed_tokens: u64,
    #[serde(default)]
    pub model_calls: u64,
    #[serde(default)]
    pub batch_size_hist: Vec<u64>,
    #[serde(default)]
    pub queue_wait_hist: Vec<u64>,
    /// The most statistics windows the node's windows operator held open at
    /// once, and the most telemetry samples buffered in them: closed windows
    /// are emitted and forgotten, so these stay bounded however long the run.
    #[serde(default)]
    pub windows_open_peak: u64,
    #[serde(default)]
    pub window_samples_peak: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub trace: String,
    pub workers: usize,
    pub requests_in: u64,
    pub responses_out: u64,
    pub errors: u64,
    /// Records behind their worker's watermark (processed, never dropped).
    pub late_records: u64,
    /// Parquet traces: rows whose req_id an earlier row already carries
    /// (each is served; their answers share the id). Absent when not
    /// checked (in-memory traces, or a req_id column not readable as u64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_req_ids: Option<u64>,
    /// The replay was stopped (SIGINT/SIGTERM) before the trace's end:
    /// every request read was answered, the rest of the trace was not read.
    /// Absent when the whole trace was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interrupted>,
    pub wall_s: f64,
    pub event_time_s: f64,
    pub throughput_rps: f64,
    /// Null when the run answered no request with a response (error records
    /// have no latency).
    pub latency_ms: Option<LatencySummary>,
    /// The rank SLO (`run.slo_ms.rank`); each kind's is in `by_mode`, and
    /// `slo_satisfaction` counts each request against its own kind's.
    pub slo_ms: f64,
    /// Latency of rank and of retrieve requests, each against its SLO.
    #[serde(default)]
    pub by_mode: ModeSummaries,
    /// The clock latency_ms was measured on: "wall" or "event".
    pub clock: String,
    /// When router and nodes handled requests: "complete" or "arrival".
    #[serde(default)]
    pub release: String,
    /// Share of requests answered within their kind's SLO; a request
    /// answered with an error record (shed, unservable) is a miss. Null
    /// when no request was answered at all.
    pub slo_satisfaction: Option<f64>,
    pub emb_hit_rate: f64,
    pub kv_hit_rate: f64,
    /// Requests served with only the most recent part of their history
    /// (the model's limit; oldest items dropped in block-aligned chunks).
    #[serde(default)]
    pub truncated_histories: u64,
    /// Requests for the history (`hist_len` > 0) of a user the users table
    /// does not know, served with an empty history.
    #[serde(default)]
    pub unknown_user_histories: u64,
    pub model_version: String,
    pub nodes: Vec<NodeSummary>,
    pub router: RouterStats,
    pub windows: usize,
    /// What the allocator did (absent when α does not move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<crate::dataflow::allocator::AllocatorSummary>,
}

/// Latencies of rank and of retrieve responses, each recorded against its
/// own kind's SLO (replay's sink and serve's output queue both keep one).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ModeTallies {
    rank: LatencyTally,
    retrieve: LatencyTally,
}

impl ModeTallies {
    pub fn record(&mut self, mode: Mode, latency_ms: f64, slo_ms: &SloMs) {
        let tally = match mode {
            Mode::Rank => &mut self.rank,
            Mode::Retrieve => &mut self.retrieve,
        };
        tally.record(latency_ms, slo_ms.for_mode(mode));
    }

    /// A request of this kind answered with an error record (shed or
    /// unservable): a miss for its kind's SLO satisfaction.
    pub fn record_failure(&mut self, mode: Mode) {
        match mode {
            Mode::Rank => self.rank.record_failures(1),
            Mode::Retrieve => self.retrieve.record_failures(1),
        }
    }

    /// Failures of both kinds.
    pub fn failed(&self) -> u64 {
        self.rank.failed() + self.retrieve.failed()
    }

    pub fn merge(&mut self, other: &ModeTallies) {
        self.rank.merge(&other.rank);
        self.retrieve.merge(&other.retrieve);
    }

    pub fn summaries(&self, slo_ms: &SloMs) -> ModeSummaries {
        ModeSummaries {
            rank: ModeSummary::new(&self.rank, slo_ms.rank),
            retrieve: ModeSummary::new(&self.retrieve, slo_ms.retrieve),
        }
    }
}

/// Rank and retrieve requests apart.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeSummaries {
    pub rank: ModeSummary,
    pub retrieve: ModeSummary,
}

/// The responses of one request kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeSummary {
    pub responses: u64,
    /// Requests of this kind answered with an error record; they count as
    /// SLO misses in `slo_satisfaction` and not in the latencies.
    #[serde(default)]
    pub failed: u64,
    pub slo_ms: f64,
    /// Null when no request of this kind was served: there is no latency,
    /// and a 0 would read as one.
    pub latency_ms: Option<LatencySummary>,
    /// Null when no request of this kind was answered (0 would read as
    /// "every one missed").
    pub slo_satisfaction: Option<f64>,
}

impl ModeSummary {
    pub fn new(tally: &LatencyTally, slo_ms: f64) -> Self {
        Self {
            responses: tally.count(),
            failed: tally.failed(),
            slo_ms,
            latency_ms: tally.summary(),
            slo_satisfaction: tally.slo_satisfaction(),
        }
    }
}

/// Share of latencies within the SLO; None when there are none.
pub fn slo_satisfaction(latencies: &[f64], slo_ms: f64) -> Option<f64> {
    (!latencies.is_empty())
        .then(|| latencies.iter().filter(|&&l| l <= slo_ms).count() as f64 / latencies.len() as f64)
}

/// Where an interrupted replay stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Interrupted {
    /// What stopped it ("SIGINT", "SIGTERM").
    pub signal: String,
    /// Rows (requests) in the whole trace.
    pub trace_rows: u64,
}

impl Summary {
    /// A few lines for people.
    pub fn human(&self) -> String {
        let mut s = String::new();
        if let Some(i) = &self.interrupted {
            s += &format!(
                "interrupted by {}: read {} of the trace's {} requests and answered every one \
                 read; the rest were not read\n",
                i.signal, self.requests_in, i.trace_rows
            );
        }
        s += &format!(
            "requests_in {}  responses_out {}  errors {}  ({} late)\n",
            self.requests_in, self.responses_out, self.errors, self.late_records
        );
        if let Some(n) = self.duplicate_req_ids.filter(|&n| n > 0) {
            s += &format!("{n} rows repeat an earlier row's req_id (all served)\n");
        }
        s += &format!(
            "wall {:.1} s for {:.1} s of event time  throughput {:.0} req/s\n",
            self.wall_s, self.event_time_s, self.throughput_rps
        );
        let figure = |pick: fn(&LatencySummary) -> f64| ms(self.latency_ms.as_ref().map(pick));
        s += &format!(
            "latency ms ({} clock, {} release)  p50 {}  p95 {}  p99 {}  max {}   SLO {} met by {}\n",
            self.clock,
            self.release,
            figure(|l| l.p50),
            figure(|l| l.p95),
            figure(|l| l.p99),
            figure(|l| l.max),
            // Each request is held to its own kind's SLO.
            if self.by_mode.retrieve.responses + self.by_mode.retrieve.failed > 0 {
                format!(
                    "(rank {} ms, retrieve {} ms)",
                    self.by_mode.rank.slo_ms, self.by_mode.retrieve.slo_ms
                )
            } else {
                format!("{} ms", self.slo_ms)
            },
            percent(self.slo_satisfaction)
        );
        for (kind, m) in [
            ("rank", &self.by_mode.rank),
            ("retrieve", &self.by_mode.retrieve),
        ] {
            if let Some(satisfaction) = m.slo_satisfaction {
                let latency = match &m.latency_ms {
                    Some(l) => format!("p50 {:.2}  p99 {:.2} ms", l.p50, l.p99),
                    None => "no latency (none served)".into(),
                };
                s += &format!(
                    "  {kind:<8} {:>7} responses {:>5} failed  {latency}   SLO {} ms met by {:.1}%\n",
                    m.responses,
                    m.failed,
                    m.slo_ms,
                    satisfaction * 100.0
                );
            }
        }
        s += &format!(
            "emb_hit_rate {:.3}  kv_hit_rate {:.3}  truncated_histories {}\n",
            self.emb_hit_rate, self.kv_hit_rate, self.truncated_histories
        );
        if self.unknown_user_histories > 0 {
            s += &format!(
                "unknown_user_histories {}: requests for the history of users not in \
                 users.parquet, served with none\n",
                self.unknown_user_histories
            );
        }
        for n in &self.nodes {
            s += &format!(
                "  node {}: {} responses  alpha {:.2}  emb {:.3}  kv {:.3}  p99 {}  busy {:.2} (peak {:.2})\n",
                n.node,
                n.responses_out,
                n.alpha,
                n.emb_hit_rate,
                n.kv_hit_rate,
                n.latency_ms
                    .as_ref()
                    .map_or_else(|| "-".into(), |l| format!("{:.2} ms", l.p99)),
                n.busy_share,
                n.busy_share_peak
            );
        }
        s += &format!(
            "router: {} decisions  {} kv_hits  {} affinity_wins  {} overload_fallbacks\n",
            self.router.decisions,
            self.router.kv_hits,
            self.router.affinity_wins,
            self.router.overload_fallbacks
        );
        let head_evictions: u64 = self.nodes.iter().map(|n| n.user_head_evictions).sum();
        s += &format!(
            "per-user state evicted: {} affinity  {} hot-user counters  {} node prefix heads\n",
            self.router.affinity_evictions, self.router.hotness_evictions, head_evictions
        );
        s
    }
}

/// A latency in ms for people; "-" where nothing was served to measure.
fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// A share as a percentage; "-" where no request was answered.
fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

/// Window rows ordered by (node, window start).
pub fn sort_windows(rows: &mut [WindowRow]) {
    rows.sort_by_key(|w| (w.node, w.window_start_ms));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_with_no_request_reports_null_not_zero() {
        // A rank-only trace printed retrieve's satisfaction as 0.0: "every
        // retrieve request missed its SLO".
        let none = ModeSummary::new(&LatencyTally::default(), 50.0);
        assert_eq!((&none.latency_ms, none.slo_satisfaction), (&None, None));
        let json = serde_json::to_value(&none).unwrap();
        assert!(json["latency_ms"].is_null() && json["slo_satisfaction"].is_null());
        // Only failures: every one missed, and there is no latency.
        let mut failed = LatencyTally::default();
        failed.record_failures(2);
        let m = ModeSummary::new(&failed, 50.0);
        assert_eq!((m.latency_ms, m.slo_satisfaction), (None, Some(0.0)));
        let mut served = LatencyTally::default();
        served.record(10.0, 50.0);
        let m = ModeSummary::new(&served, 50.0);
        assert_eq!(m.slo_satisfaction, Some(1.0));
        assert!(m.latency_ms.is_some_and(|l| l.max == 10.0));
    }

    #[test]
    fn latency_summary_uses_nearest_rank() {
        let s = LatencySummary::from_unsorted((1..=100).rev().map(|x| x as f64).collect());
        assert_eq!(s.p50, 50.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.max, 100.0);
    }

    #[test]
    fn tally_matches_exact_figures_within_a_percent() {
        let mut a = LatencyTally::default();
        let mut b = LatencyTally::default();
        let all: Vec<f64> = (1..=1000).map(|x| x as f64 * 0.05).collect();
        for (i, &l) in all.iter().enumerate() {
            if i % 3 == 0 {
                a.record(l, 30.0)
            } else {
                b.record(l, 30.0)
            }
        }
        a.merge(&b);
        let exact = LatencySummary::from_unsorted(all.clone());
        let got = a.summary().unwrap();
        for (g, e) in [
            (got.p50, exact.p50),
            (got.p95, exact.p95),
            (got.p99, exact.p99),
        ] {
            assert!((g - e).abs() <= e * 0.01, "{g} vs {e}");
        }
        assert_eq!(got.max, exact.max);
        assert_eq!(a.count(), 1000);
        assert_eq!(a.slo_satisfaction(), slo_satisfaction(&all, 30.0));
    }

    #[test]
    fn a_failure_is_a_miss_that_has_no_latency() {
        let mut a = LatencyTally::default();
        a.record(10.0, 30.0);
        a.record(40.0, 30.0);
        a.record_failures(2);
        let mut b = LatencyTally::default();
        b.record_failures(1);
        a.merge(&b);
        assert_eq!((a.count(), a.failed()), (2, 3));
        assert_eq!(a.slo_satisfaction(), Some(1.0 / 5.0));
        assert_eq!(a.summary().map(|l| l.max), Some(40.0));
        let mut only_failed = LatencyTally::default();
        only_failed.record_failures(1);
        assert_eq!(only_failed.slo_satisfaction(), Some(0.0));
        assert_eq!(only_failed.summary(), None);

        let mut modes = ModeTallies::default();
        modes.record(Mode::Rank, 5.0, &SloMs::both(30.0));
        modes.record_failure(Mode::Retrieve);
        let s = modes.summaries(&SloMs::both(30.0));
        assert_eq!((s.rank.responses, s.rank.failed), (1, 0));
        assert_eq!((s.retrieve.responses, s.retrieve.failed), (0, 1));
        assert_eq!(s.retrieve.slo_satisfaction, Some(0.0));
        assert_eq!(modes.failed(), 1);
    }

    #[test]
    fn slo_counts_inclusive() {
        assert_eq!(slo_satisfaction(&[10.0, 30.0, 31.0, 5.0], 30.0), Some(0.75));
        assert_eq!(slo_satisfaction(&[], 30.0), None);
    }

    #[test]
    fn nothing_recorded_is_no_latency_and_no_satisfaction() {
        let empty = LatencyTally::default();
        assert_eq!((empty.summary(), empty.slo_satisfaction()), (None, None));
        assert_eq!(
            LatencySummary::from_histogram(&LatencyHistogram::default()),
            None
        );
    }

    /// A run of two nodes where node 1 got no request, and (`served` false)
    /// one that answered nothing at all.
    fn two_node_run(served: bool) -> Summary {
        let mut tally = LatencyTally::default();
        if served {
            tally.record(2.0, 30.0);
            tally.record(40.0, 30.0);
        }
        let node = |node: u32, tally: &LatencyTally| NodeSummary {
            node,
            responses_out: tally.count(),
            latency_ms: tally.summary(),
            slo_satisfaction: tally.slo_satisfaction(),
            ..NodeSummary::default()
        };
        Summary {
            responses_out: tally.count(),
            latency_ms: tally.summary(),
            slo_satisfaction: tally.slo_satisfaction(),
            nodes: vec![node(0, &tally), node(1, &LatencyTally::default())],
            ..Summary::default()
        }
    }

    #[test]
    fn a_node_that_served_nothing_has_null_latency_and_satisfaction() {
        let s = two_node_run(true);
        let json = serde_json::to_value(&s).unwrap();
        let idle = &json["nodes"][1];
        assert!(idle["latency_ms"].is_null(), "{idle}");
        assert!(idle["slo_satisfaction"].is_null(), "{idle}");
        assert_eq!(json["nodes"][0]["latency_ms"]["p99"].as_f64(), Some(40.0));
        assert_eq!(json["nodes"][0]["slo_satisfaction"].as_f64(), Some(0.5));
        let back: Summary = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);

        let text = s.human();
        assert!(text.contains("p99 40.00 ms  busy"), "{text}");
        assert!(text.contains("node 1: 0 responses"), "{text}");
        let idle = text.lines().find(|l| l.contains("node 1:")).unwrap();
        assert!(idle.contains("p99 -  busy"), "{idle}");
    }

    #[test]
    fn a_run_with_no_response_has_null_latency_and_satisfaction() {
        let s = two_node_run(false);
        let json = serde_json::to_value(&s).unwrap();
        assert!(json["latency_ms"].is_null(), "{json}");
        assert!(json["slo_satisfaction"].is_null(), "{json}");
        let back: Summary = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);

        let text = s.human();
        let latency = text.lines().find(|l| l.starts_with("latency ms")).unwrap();
        assert!(
            latency.contains("p50 -  p95 -  p99 -  max -") && latency.ends_with("met by -"),
            "{latency}"
        );
        for node in text.lines().filter(|l| l.contains("  node ")) {
            assert!(node.contains("p99 -  busy"), "{node}");
        }
    }
}
