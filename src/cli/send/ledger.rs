//! The requests `send` sent and the answers read back: matched, counted
//! by kind, and timed from the send. No I/O. Memory is bounded however
//! long a `--loop` runs: latencies go into histograms (quantiles within
//! 1%) and answered ids into a bounded window.

use std::collections::{BTreeMap, HashMap};

use grflow_connectors::kafka::WireResponse;
use grflow_connectors::recent_ids::RecentIds;
use grflow_pipeline::serve::histogram::LatencyHistogram;
use serde::Serialize;

/// Answered ids remembered (at least this many, at most twice) to tell a
/// repeated answer from another producer's: an answer repeated after more
/// answers than this is ignored, not counted as a repeat.
const ANSWERED_WINDOW: usize = 100_000;

/// The answers read back for the requests sent.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AnswerReport {
    pub response_topic: String,
    pub answered: u64,
    /// Answers with items: a ranking, or generated items (retrieve).
    pub served: u64,
    /// Error records by kind (`shed`, `stale`, `unservable`).
    pub errors: BTreeMap<String, u64>,
    pub unanswered: u64,
    /// A few of the unanswered req_ids, smallest first.
    pub unanswered_examples: Vec<u64>,
    /// Answers to a request already answered (a restart of the job).
    pub repeated_answers: u64,
    /// Sent to answer read back, milliseconds, of the served answers: an
    /// error record has no latency to rank (it counts in `errors`), as in
    /// the job's own summary.
    pub latency_ms: LatencyMs,
    /// Inside the job (consumed to answered: the answers' own
    /// `latency_ms`), of the served answers; the rest of `latency_ms` is
    /// the brokers' and the clients' share.
    pub job_latency_ms: LatencyMs,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// The requests sent and the answers read back, matched by `req_id` and
/// the `ts_ms` sent (an older answer to the same id on a long-lived
/// response topic does not count). Times are nanoseconds from the start.
#[derive(Debug)]
pub struct AnswerLedger {
    /// req_id → (sent at, ts_ms sent) of each send of it not yet answered
    /// (a trace may repeat an id).
    waiting: HashMap<u64, Vec<(u64, u64)>>,
    /// Sends awaiting an answer, over every id.
    waiting_count: usize,
    /// req_id → ts_ms of the answered ones, to tell a repeat from a stranger.
    answered: RecentIds<u64>,
    /// Latencies of the served answers (error records have none).
    latencies_ms: LatencyHistogram,
    job_latencies_ms: LatencyHistogram,
    /// End-to-end latencies of the served answers since the last
    /// [`Self::take_recent`].
    recent_ms: LatencyHistogram,
    /// Answers matched to a send: served ones and error records.
    matched: u64,
    served: u64,
    errors: BTreeMap<String, u64>,
    repeated: u64,
}

impl Default for AnswerLedger {
    fn default() -> Self {
        Self {
            waiting: HashMap::new(),
            waiting_count: 0,
            answered: RecentIds::new(ANSWERED_WINDOW),
            latencies_ms: LatencyHistogram::default(),
            job_latencies_ms: LatencyHistogram::default(),
            recent_ms: LatencyHistogram::default(),
            matched: 0,
            served: 0,
            errors: BTreeMap::new(),
            repeated: 0,
        }
    }
}

impl AnswerLedger {
    pub fn sent(&mut self, req_id: u64, ts_ms: u64, at_ns: u64) {
        self.waiting.entry(req_id).or_default().push((at_ns, ts_ms));
        self.waiting_count += 1;
    }

    /// Takes the oldest send of `req_id` stamped `ts_ms`: when it was sent.
    fn take_sent(&mut self, req_id: u64, ts_ms: u64) -> Option<u64> {
        let sends = self.waiting.get_mut(&req_id)?;
        let i = sends.iter().position(|&(_, ts)| ts == ts_ms)?;
        let (sent_ns, _) = sends.remove(i);
        if sends.is_empty() {
            self.waiting.remove(&req_id);
        }
        self.waiting_count -= 1;
        Some(sent_ns)
    }

    /// Records an answer read at `at_ns`; answers to requests this run did
    /// not send are ignored. A request the job served at another time than
    /// its stamp (clamped) is matched by the stamp it was sent with.
    pub fn answer(&mut self, r: &WireResponse, at_ns: u64) {
        let ts_ms = r.sent_ts_ms.unwrap_or(r.ts_ms);
        match self.take_sent(r.req_id, ts_ms) {
            Some(sent_ns) => {
                self.answered.observe(r.req_id, ts_ms);
                self.matched += 1;
                match &r.error {
                    // A miss, not a latency: as the job's summary counts it.
                    Some(e) => *self.errors.entry(e.kind.clone()).or_default() += 1,
                    None => {
                        self.served += 1;
                        let ms = at_ns.saturating_sub(sent_ns) as f64 / 1e6;
                        self.latencies_ms.record(ms);
                        self.recent_ms.record(ms);
                        self.job_latencies_ms.record(r.latency_ms);
                    }
                }
            }
            _ if self.answered.get(r.req_id) == Some(ts_ms) => self.repeated += 1,
            _ => {}
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting_count
    }

    /// The end-to-end latencies of the answers served since the last call.
    pub fn take_recent(&mut self) -> LatencyHistogram {
        std::mem::take(&mut self.recent_ms)
    }

    pub fn report(&self, response_topic: &str) -> AnswerReport {
        let mut unanswered: Vec<u64> = self.waiting.keys().copied().collect();
        unanswered.sort_unstable();
        unanswered.truncate(5);
        AnswerReport {
            response_topic: response_topic.to_string(),
            answered: self.matched,
            served: self.served,
            errors: self.errors.clone(),
            unanswered: self.waiting_count as u64,
            unanswered_examples: unanswered,
            repeated_answers: self.repeated,
            latency_ms: LatencyMs::of(&self.latencies_ms),
            job_latency_ms: LatencyMs::of(&self.job_latencies_ms),
        }
    }
}

impl LatencyMs {
    fn of(h: &LatencyHistogram) -> Self {
        LatencyMs {
            p50: h.quantile(0.5),
            p95: h.quantile(0.95),
            p99: h.quantile(0.99),
            max: h.max_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_connectors::kafka::AnswerError;

    fn response(req_id: u64, ts_ms: u64, error: Option<&str>) -> WireResponse {
        WireResponse {
            req_id,
            items: vec![1],
            scores: vec![0.5],
            model_version: "m".into(),
            error: error.map(|kind| AnswerError {
                kind: kind.into(),
                reason: "r".into(),
            }),
            node: 0,
            ts_ms,
            sent_ts_ms: None,
            latency_ms: 1.0,
            topic: "t".into(),
            partition: 0,
            offset: 0,
        }
    }

    /// The job served a far-future stamp at its own time: the answer's
    /// `ts_ms` differs from the send's, `sent_ts_ms` carries the send's.
    #[test]
    fn a_clamped_answer_matches_by_the_stamp_it_was_sent_with() {
        let mut l = AnswerLedger::default();
        l.sent(7, u64::MAX, 0);
        let mut r = response(7, 1_000, None);
        l.answer(&r, 2_000_000);
        assert_eq!(l.waiting(), 1, "no sent_ts_ms: not ours");
        r.sent_ts_ms = Some(u64::MAX);
        l.answer(&r, 2_000_000);
        assert_eq!(l.waiting(), 0);
        assert_eq!(l.report("t").served, 1);
        l.answer(&r, 3_000_000);
        assert_eq!(l.report("t").repeated_answers, 1);
    }

    #[test]
    fn answers_match_by_id_and_time_and_latency_runs_from_the_send() {
        let mut l = AnswerLedger::default();
        for id in 0..4 {
            l.sent(id, 100 + id, id * 1_000_000);
        }
        // An old answer to req 0 (another ts) and one to a request never sent.
        l.answer(&response(0, 5, None), 9_000_000);
        l.answer(&response(77, 100, None), 9_000_000);
        assert_eq!(l.waiting(), 4);
        l.answer(&response(0, 100, None), 3_000_000);
        l.answer(&response(1, 101, Some("shed")), 5_000_000);
        l.answer(&response(2, 102, None), 12_000_000);
        // The same answer again (a job restarted around it).
        l.answer(&response(2, 102, None), 13_000_000);
        let r = l.report("out");
        assert_eq!(r.answered, 3);
        assert_eq!(r.served, 2);
        assert_eq!(r.errors, BTreeMap::from([("shed".to_string(), 1)]));
        assert_eq!(r.unanswered, 1);
        assert_eq!(r.unanswered_examples, vec![3]);
        assert_eq!(r.repeated_answers, 1);
        // Latencies 3 and 10 ms; the shed answer's 4 is none (quantiles
        // within the histogram's 1%).
        assert!(
            (3.0..3.03).contains(&r.latency_ms.p50),
            "{:?}",
            r.latency_ms
        );
        assert_eq!(r.latency_ms.max, 10.0);
        assert_eq!(l.take_recent().count(), 2);
        assert_eq!(l.take_recent().count(), 0, "taken");
    }

    /// An error record counts as an answer and an error, not as a latency,
    /// end to end or in the job (as the job's summary).
    #[test]
    fn error_records_are_no_latency() {
        let mut l = AnswerLedger::default();
        for id in 0..100 {
            l.sent(id, id, 0);
        }
        for id in 0..99 {
            l.answer(&response(id, id, None), 1_000_000);
        }
        let mut shed = response(99, 99, Some("shed"));
        shed.latency_ms = 500.0;
        l.answer(&shed, 500_000_000);
        let r = l.report("out");
        assert_eq!((r.answered, r.served, r.unanswered), (100, 99, 0));
        assert_eq!(r.errors, BTreeMap::from([("shed".to_string(), 1)]));
        assert_eq!(r.latency_ms.max, 1.0, "{:?}", r.latency_ms);
        assert_eq!(r.job_latency_ms.max, 1.0, "{:?}", r.job_latency_ms);
        assert_eq!(l.take_recent().max_ms(), 1.0);
    }

    #[test]
    fn a_req_id_sent_twice_is_answered_twice() {
        // A trace may repeat an id; the same stamp when sent in one ms.
        let mut l = AnswerLedger::default();
        l.sent(7, 100, 0);
        l.sent(7, 100, 2_000_000);
        assert_eq!(l.waiting(), 2);
        l.answer(&response(7, 100, None), 5_000_000);
        l.answer(&response(7, 100, None), 6_000_000);
        let r = l.report("out");
        assert_eq!((r.answered, r.unanswered, r.repeated_answers), (2, 0, 0));
        // Timed from the first send, then the second: 5 and 4 ms.
        assert_eq!(r.latency_ms.max, 5.0);
        // A third answer is a repeat.
        l.answer(&response(7, 100, None), 7_000_000);
        assert_eq!(l.report("out").repeated_answers, 1);
    }
}
