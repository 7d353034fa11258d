//! One answer per request after a crash, made deterministic on librdkafka's
//! in-process mock cluster (no external broker, so it runs in CI): the
//! real `grflow serve` dataflow, run twice in this process.
//!
//! The race it pins down: a first incarnation answers a request, crashes
//! before the broker has that answer, the answer reaches the response topic
//! only after the restarted job's restart scan looked, and the restarted
//! job (not seeing it) computes the request again. If the recomputation is
//! shed, the request ends with a ranking and a `shed` error record.
//!
//! How each step is forced instead of hoped for:
//! - The first incarnation writes its answers to a separate "in-transit"
//!   topic and commits under another group: to the restarted job, nothing
//!   of it is durable (a crash before its first commit and before any
//!   produce was acknowledged). The test appends those answers to the
//!   response topic after the restart scan: the late arrivals.
//! - Every request carries the same event time, so the restarted job's
//!   node can serve none of them until the partition has been idle for
//!   `idle_timeout_ms` (1,500 ms): each waits at least that long, three
//!   times the restarted job's `deadline_ms` (500), so each is past its
//!   deadline when served. Requests produced after the restart wait as long
//!   and must still be shed: the fix keeps shedding for new work.

#[allow(dead_code)] // the shared helpers serve several test binaries
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use common::kafka::{Tail, produce};
use grflow_connectors::kafka::WireResponse;
use grflow_pipeline::{Config, ServeError, ServeOptions, ServeSummary, serve};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use serde_json::json;

type Mock = MockCluster<'static, DefaultProducerContext>;

/// Requests in the log when the job restarts, and produced after it.
const RECOVERED: u64 = 24;
const NEW: u64 = 6;
const WAIT: Duration = Duration::from_secs(60);

const REQUESTS: &str = "requests";
const RESPONSES: &str = "responses";
const IN_TRANSIT: &str = "in-transit";
const DEAD_LETTERS: &str = "dead-letters";

fn request(i: u64, ts_ms: u64) -> Option<Vec<u8>> {
    let r = json!({
        "req_id": i,
        "user_id": i % 50,
        "ts_ms": ts_ms,
        "candidates": [(i * 7) % 5000, (i * 13 + 1) % 5000, (i * 31 + 2) % 5000, (i * 57 + 3) % 5000],
        "history": [(i * 3) % 5000, (i * 5 + 1) % 5000, 17, 42, 4999],
    });
    Some(serde_json::to_vec(&r).unwrap())
}

fn config(mock: &Mock, group: &str, response_topic: &str, kafka_extra: &str) -> Config {
    let text = format!(
        r#"
[run]
workers = 1
# Requests are made late by holding them until the idle partition releases
# event time (idle_timeout_ms 1500 > deadline_ms 500), which only `complete`
# does; `arrival` would serve them at once.
release = "complete"

[trace]
users = 500
items = 5000
requests = 100

[kafka]
brokers = "{}"
request_topic = "{REQUESTS}"
response_topic = "{response_topic}"
dead_letter_topic = "{DEAD_LETTERS}"
group_id = "{group}"
create_partitions = 0
commit_interval_ms = 100
max_in_flight = 1024
{kafka_extra}
"#,
        mock.bootstrap_servers()
    );
    Config::parse(&text, "kafka_mock_restart").expect("test config")
}

struct Job {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<ServeSummary, ServeError>>,
}

impl Job {
    fn start(config: Config) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || serve(ServeOptions::new(config), flag));
        Self { stop, handle }
    }

    /// Stops reading, drains, commits: the summary as JSON.
    fn stop(self) -> serde_json::Value {
        self.stop.store(true, Ordering::Relaxed);
        let summary = self.handle.join().expect("serve thread").expect("serve");
        serde_json::to_value(summary).unwrap()
    }
}

fn responses(tail: &Tail) -> BTreeMap<u64, Vec<WireResponse>> {
    let mut by_req: BTreeMap<u64, Vec<WireResponse>> = BTreeMap::new();
    for r in &tail.records {
        let response: WireResponse = serde_json::from_slice(&r.payload).expect("a response");
        by_req.entry(response.req_id).or_default().push(response);
    }
    by_req
}

#[test]
fn mock_late_first_answer_and_a_past_deadline_recomputation_agree() {
    let mock: Mock = MockCluster::new(1).expect("mock cluster");
    for topic in [REQUESTS, RESPONSES, IN_TRANSIT, DEAD_LETTERS] {
        mock.create_topic(topic, 1, 1).expect("create topic");
    }
    let brokers = mock.bootstrap_servers();
    let ts = 1_700_000_000_000;
    let records: Vec<_> = (0..RECOVERED).map(|i| (0, request(i, ts))).collect();
    produce(&brokers, REQUESTS, &records);

    // The first incarnation answers everything, with rankings.
    let first = Job::start(config(
        &mock,
        "first-incarnation",
        IN_TRANSIT,
        "deadline_ms = 600000",
    ));
    let mut in_transit = Tail::new(&brokers, IN_TRANSIT, 1);
    assert!(
        in_transit.read_until(WAIT, |t| t.req_ids.len() as u64 >= RECOVERED),
        "the first incarnation answered {} of {RECOVERED}",
        in_transit.req_ids.len()
    );
    let first = first.stop();
    assert_eq!(first["responses_out"], RECOVERED, "{first}");
    let late = responses(&in_transit);
    assert!(
        late.values().all(|a| a.len() == 1 && a[0].error.is_none()),
        "{late:?}"
    );

    // The restart: its scan of the response topic finds nothing, so it
    // computes every request again, each past its deadline.
    let second = Job::start(config(
        &mock,
        "job",
        RESPONSES,
        "deadline_ms = 500\nidle_timeout_ms = 1500",
    ));
    let mut answers = Tail::new(&brokers, RESPONSES, 1);
    assert!(
        answers.read_until(WAIT, |t| t.req_ids.len() as u64 >= RECOVERED),
        "the restarted job answered {} of {RECOVERED}",
        answers.req_ids.len()
    );
    // Requests that arrive after the restart: new work, shed when late.
    let new: Vec<_> = (RECOVERED..RECOVERED + NEW)
        .map(|i| (0, request(i, ts + 1_000)))
        .collect();
    produce(&brokers, REQUESTS, &new);
    assert!(
        answers.read_until(WAIT, |t| t.req_ids.len() as u64 >= RECOVERED + NEW),
        "the restarted job answered {} of {}",
        answers.req_ids.len(),
        RECOVERED + NEW
    );
    let second = second.stop();

    // The first incarnation's answers reach the response topic now, after
    // the restart scan.
    let late_records: Vec<_> = in_transit
        .records
        .iter()
        .map(|r| (0, Some(r.payload.clone())))
        .collect();
    produce(&brokers, RESPONSES, &late_records);
    let total = (2 * RECOVERED + NEW) as usize;
    assert!(
        answers.read_until(WAIT, |t| t.records.len() >= total),
        "{} of {total} records on the response topic",
        answers.records.len()
    );
    // Reading stopped at `total`: a copy past it shows only if waited for.
    answers.settle(Duration::from_secs(1));
    assert_eq!(
        answers.records.len(),
        total,
        "records on the response topic"
    );

    let by_req = responses(&answers);
    assert_eq!(by_req.len() as u64, RECOVERED + NEW);
    for (req, answers) in by_req.range(..RECOVERED) {
        assert_eq!(answers.len(), 2, "req {req}: {answers:?}");
        assert!(
            answers[0].same_answer(&answers[1]),
            "req {req} got different answers: the restarted job's {:?} and the late first {:?}",
            answers[0],
            answers[1]
        );
    }
    for (req, answers) in by_req.range(RECOVERED..) {
        assert_eq!(answers.len(), 1, "req {req}: {answers:?}");
        let kind = answers[0].error.as_ref().map(|e| e.kind.as_str());
        assert_eq!(kind, Some("shed"), "req {req}, new after the restart");
    }
    assert_eq!(second["recovered_unshed"], RECOVERED, "{second}");
    assert_eq!(second["shed"], NEW, "{second}");
    assert_eq!(second["responses_out"], RECOVERED, "{second}");
}
