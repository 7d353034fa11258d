//! What a serve job knows at exit: the latency of its answers (measured as
//! they leave the dataflow, before the sink), each process's part, and the
//! summary `grflow serve` prints.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use serde::Serialize;

use grflow_connectors::kafka::{CountsSnapshot, SharedState};
use grflow_traces::Mode;

use super::histogram::LatencyHistogram;
use crate::config::SloMs;
use crate::summary::{ModeSummaries, ModeTallies};

/// Latency of a process's answers, overall and per request kind against
/// its SLO; shared by the process's workers.
#[derive(Debug)]
pub struct AnswerLatency {
    pub overall: Mutex<LatencyHistogram>,
    /// Since the last metrics interval: a job that ran for weeks would
    /// otherwise hide an hour-long regression in its overall p99.
    recent: Mutex<LatencyHistogram>,
    pub by_mode: Mutex<ModeTallies>,
    slo_ms: SloMs,
}

impl AnswerLatency {
    pub fn new(slo_ms: SloMs) -> Self {
        Self {
            overall: Mutex::default(),
            recent: Mutex::default(),
            by_mode: Mutex::default(),
            slo_ms,
        }
    }

    /// One answer of kind `mode` took `ms`; `failed` for an error record,
    /// which counts as a miss of its kind's SLO and in no latency: a shed
    /// request's time-to-error would otherwise pull the p99 toward the
    /// deadline, and `replay`'s figures (and `bench kafka`'s ratio of the
    /// two) cover responses only.
    pub fn record(&self, ms: f64, mode: Mode, failed: bool) {
        if failed {
            self.by_mode
                .lock()
                .expect("latency lock")
                .record_failure(mode);
            return;
        }
        self.overall.lock().expect("latency lock").record(ms);
        self.recent.lock().expect("latency lock").record(ms);
        self.by_mode
            .lock()
            .expect("latency lock")
            .record(mode, ms, &self.slo_ms);
    }

    pub fn p99_ms(&self) -> f64 {
        self.overall.lock().expect("latency lock").quantile(0.99)
    }

    /// The p99 of the answers since the last call (None when there were
    /// none), and a fresh start for the next interval.
    pub fn take_recent_p99_ms(&self) -> Option<f64> {
        let recent = std::mem::take(&mut *self.recent.lock().expect("latency lock"));
        (recent.count() > 0).then(|| recent.quantile(0.99))
    }
}

/// What one process knows of the job at exit, beyond its workers' own
/// results: counters, latencies, lag, what is still in flight.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct ProcessPart {
    pub counts: CountsSnapshot,
    pub latency: LatencyHistogram,
    pub by_mode: ModeTallies,
    pub lag: BTreeMap<i32, i64>,
    pub in_flight: usize,
    pub drain_timed_out: bool,
    /// Closed windows `windows.out` could not take.
    #[serde(default)]
    pub windows_lost: u64,
}

impl ProcessPart {
    pub fn of(shared: &SharedState, latency: &AnswerLatency, windows_lost: u64) -> Self {
        Self {
            counts: CountsSnapshot::of(&shared.counters),
            latency: latency.overall.lock().expect("latency lock").clone(),
            by_mode: latency.by_mode.lock().expect("latency lock").clone(),
            lag: shared.known_lag(std::time::Instant::now()),
            in_flight: shared.in_flight(),
            drain_timed_out: shared.drain_timed_out.load(Ordering::Relaxed),
            windows_lost,
        }
    }

    pub fn merge(&mut self, o: &Self) {
        self.counts.add(&o.counts);
        self.latency.merge(&o.latency);
        self.by_mode.merge(&o.by_mode);
        self.lag.extend(o.lag.iter().map(|(p, l)| (*p, *l)));
        self.in_flight += o.in_flight;
        self.drain_timed_out |= o.drain_timed_out;
        self.windows_lost += o.windows_lost;
    }
}

/// What `grflow serve` prints when it stops.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServeSummary {
    pub brokers: String,
    pub request_topic: String,
    pub response_topic: String,
    pub dead_letter_topic: String,
    /// Workers (= serving nodes) of the whole job, over every process.
    pub workers: usize,
    /// Cluster mode: this process's index and the number of processes.
    /// Process 0's counts are the whole job's, every other process's its
    /// own (its workers read and answered them).
    pub process: usize,
    pub processes: usize,
    /// Process 0 in cluster mode: processes whose results did not arrive
    /// in time (a slow drain, a lost process), left out of its counts.
    pub processes_missing: Vec<usize>,
    /// When router and nodes handled requests: "arrival" unless
    /// `run.release = "complete"`.
    pub release: String,
    /// From the dataflow's start (model, catalog and consumers ready, the
    /// cluster connected) to the end of the drain.
    pub wall_s: f64,
    /// Records read from the request topic (every kind; was `consumed`).
    pub requests_in: u64,
    /// Rankings and retrievals answered (was `responses`).
    pub responses_out: u64,
    /// Error records written: shed, stale, unservable and dead-lettered requests.
    pub errors: u64,
    /// responses_out / wall_s.
    pub throughput_rps: f64,
    pub shed: u64,
    /// Answered `stale` (`kafka.max_age_ms`).
    pub stale: u64,
    /// Offsets of the request partitions the consumer jumped over, never
    /// read (transaction markers, records deleted by retention before they
    /// were read, or a broker that returned later records first: tansu 0.6
    /// under a backlog); a request there was not answered.
    pub skipped_offsets: u64,
    /// Times a request partition's log started over below what had been
    /// read while serving (the topic created again, the log cut short):
    /// its records were served from there.
    #[serde(default)]
    pub log_resets: u64,
    pub recovered_unshed: u64,
    pub unservable: u64,
    pub dead_lettered: u64,
    pub duplicates_skipped: u64,
    /// Requests whose `req_id` a request read shortly before also carried
    /// (`kafka.repeat_window`): served, so two answers carry the id.
    pub repeated_req_ids: u64,
    pub already_answered: u64,
    pub late: u64,
    /// Requests whose `ts_ms` was too far in the future: served at the
    /// current event time.
    pub clamped_ts: u64,
    pub delivered: u64,
    pub resent: u64,
    pub produce_failures: u64,
    /// Outputs dead-lettered after failing every retry.
    pub undeliverable: u64,
    /// Offset commits the broker refused (each sent again; `committed`
    /// lists only offsets the final commit got through).
    #[serde(default)]
    pub commit_failures: u64,
    /// Polls of the request topic that failed (each retried).
    #[serde(default)]
    pub read_errors: u64,
    /// The shutdown drain stopped at `kafka.drain_timeout_ms`: what was not
    /// answered by then is not committed and is read again on restart.
    pub drain_timed_out: bool,
    /// Closed windows that `windows.out` could not take (a full disk):
    /// logged and lost, while serving went on.
    pub windows_lost: u64,
    pub pauses: u64,
    pub oov_items: u64,
    /// Requests served with only the most recent part of their history,
    /// counted once per request served, whether it was cut at decode (inline
    /// histories), at its node, or both (`grflow_truncated_histories_total`
    /// counts the decoder's cuts as they happen).
    pub truncated_histories: u64,
    /// Requests for the history (`hist_len` > 0) of a user the catalog's
    /// users table does not know: served with an empty history.
    #[serde(default)]
    pub unknown_user_histories: u64,
    pub in_flight_at_exit: usize,
    /// Latency of the responses; error records are not in it (they count
    /// as misses in `by_mode`) (was `latency_p50_ms`, `latency_p99_ms`,
    /// `latency_max_ms`). Null when the job answered no request with a
    /// response, as each kind's in `by_mode`.
    pub latency_ms: Option<crate::summary::LatencySummary>,
    /// Rankings and retrievals apart, each against its own SLO.
    pub by_mode: ModeSummaries,
    /// Messages behind the end of each request partition at exit.
    pub lag: BTreeMap<i32, i64>,
    pub committed: BTreeMap<i32, i64>,
    pub model_version: String,
    /// Each node's α (EMB share of its pool) when the job stopped, by node.
    pub alpha_at_exit: BTreeMap<usize, f64>,
    /// What moving α cost each node, by node: bytes refilled into the EMB
    /// share after its boundary grew, in all and at most per move (HLEM
    /// §IV-B bounds it by the pages that changed sides).
    pub refill: BTreeMap<usize, RefillSummary>,
    /// What the allocator did (absent when α does not move): windows
    /// decided, `SetAlpha` commands sent, decision time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator: Option<crate::dataflow::allocator::AllocatorSummary>,
}

/// One node's refill traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RefillSummary {
    pub alpha_moves: u64,
    pub refill_bytes: u64,
    pub refill_bytes_max_per_move: u64,
    /// Times the KV share took pages back from EMB for a request that did
    /// not fit alone.
    pub kv_reclaims: u64,
}

impl RefillSummary {
    pub fn of(c: &grflow_operators::node::NodeCounters) -> Self {
        Self {
            alpha_moves: c.alpha_moves,
            refill_bytes: c.refill_bytes,
            refill_bytes_max_per_move: c.refill_bytes_max_per_move,
            kv_reclaims: c.kv_reclaims,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_record_is_a_miss_of_its_kind_and_in_no_latency() {
        let latency = AnswerLatency::new(SloMs::both(30.0));
        latency.record(5.0, Mode::Rank, false);
        // A shed request answered at its 500 ms deadline.
        latency.record(500.0, Mode::Retrieve, true);
        let overall = latency.overall.lock().unwrap();
        assert_eq!(overall.count(), 1);
        assert!(overall.quantile(1.0) < 30.0, "{}", overall.quantile(1.0));
        let modes = latency.by_mode.lock().unwrap();
        assert_eq!(modes.failed(), 1);
        let s = modes.summaries(&SloMs::both(30.0));
        assert_eq!((s.rank.responses, s.rank.failed), (1, 0));
        assert_eq!((s.retrieve.responses, s.retrieve.failed), (0, 1));
        assert_eq!(s.retrieve.slo_satisfaction, Some(0.0));
    }

    #[test]
    fn a_job_that_answered_nothing_has_null_latency() {
        // Only a shed request: no response, so no latency to report.
        let latency = AnswerLatency::new(SloMs::both(30.0));
        latency.record(500.0, Mode::Rank, true);
        let mut part = ProcessPart::default();
        part.merge(&ProcessPart {
            latency: latency.overall.lock().unwrap().clone(),
            by_mode: latency.by_mode.lock().unwrap().clone(),
            ..ProcessPart::default()
        });
        let summary = ServeSummary {
            latency_ms: crate::summary::LatencySummary::from_histogram(&part.latency),
            by_mode: part.by_mode.summaries(&SloMs::both(30.0)),
            ..ServeSummary::default()
        };
        assert_eq!(summary.latency_ms, None);
        let json = serde_json::to_value(&summary).unwrap();
        assert!(json["latency_ms"].is_null(), "{json}");
        assert_eq!(
            json["by_mode"]["rank"]["slo_satisfaction"].as_f64(),
            Some(0.0)
        );

        latency.record(5.0, Mode::Rank, false);
        let served =
            crate::summary::LatencySummary::from_histogram(&latency.overall.lock().unwrap());
        assert!(served.is_some_and(|l| l.max == 5.0));
    }

    #[test]
    fn the_recent_p99_is_the_last_intervals_not_the_jobs() {
        let latency = AnswerLatency::new(SloMs::both(30.0));
        assert_eq!(latency.take_recent_p99_ms(), None);
        for _ in 0..100_000 {
            latency.record(5.0, Mode::Rank, false);
        }
        let first = latency.take_recent_p99_ms().unwrap();
        assert!((first - 5.0).abs() < 0.1, "{first}");
        // A regression after weeks of good answers.
        for _ in 0..500 {
            latency.record(800.0, Mode::Rank, false);
        }
        let second = latency.take_recent_p99_ms().unwrap();
        assert!(second >= 790.0, "{second}");
        assert!(latency.p99_ms() < 6.0, "the job's p99 hides it");
        assert_eq!(latency.take_recent_p99_ms(), None);
    }
}
