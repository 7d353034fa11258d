//! `grflow serve` against librdkafka's in-process mock cluster: no external
//! broker, so these run in CI. A broker that stops acknowledging outputs
//! during the shutdown drain (the drain times out, unanswered offsets stay
//! uncommitted), and a broker that refuses every output, dead letters
//! included (the job stops with exit code 1 and says why), and requests
//! stamped far in the future among normal ones (the broker version, with
//! 2,000 requests, is tests/kafka_event_time.rs); answers left on the
//! response topic by an earlier incarnation of the request topic, and a
//! missing dead-letter topic.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::kafka::Serve;
use common::temp::tmp_dir;
use grflow_pipeline::{Config, ServeOptions};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::{MockCluster, MockCoordinator};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};

type Mock = MockCluster<'static, DefaultProducerContext>;

const REQUESTS: &str = "requests";
const RESPONSES: &str = "responses";
const LETTERS: &str = "dead-letters";
const PARTITIONS: i32 = 2;
/// Upper bound for anything that waits; a healthy run needs a fraction.
const WAIT: Duration = Duration::from_secs(20);
/// Broker 2 leads the response topic only; broker 1 everything else,
/// including the group coordinator, so cutting off 2 cuts off only answers.
const RESPONSE_LEADER: i32 = 2;

fn cluster(group: &str) -> Mock {
    let mock = MockCluster::new(3).expect("mock cluster");
    for (topic, partitions, leader) in [
        (REQUESTS, PARTITIONS, 1),
        (RESPONSES, PARTITIONS, RESPONSE_LEADER),
        (LETTERS, 1, 1),
    ] {
        mock.create_topic(topic, partitions, 3).unwrap();
        for p in 0..partitions {
            mock.partition_leader(topic, p, Some(leader)).unwrap();
        }
    }
    mock.coordinator(MockCoordinator::Group(group.into()), 1)
        .unwrap();
    mock
}

fn config_text(brokers: &str, group: &str, kafka_extra: &str) -> String {
    format!(
        r#"
[run]
workers = 2

[trace]
users = 200
items = 2000
requests = 100

[kafka]
brokers = "{brokers}"
request_topic = "{REQUESTS}"
response_topic = "{RESPONSES}"
dead_letter_topic = "{LETTERS}"
group_id = "{group}"
create_partitions = 0
commit_interval_ms = 100
metrics_interval_ms = 1000
{kafka_extra}
"#
    )
}

/// Requests `from..to`, alternating partitions.
fn produce_requests(brokers: &str, from: u64, to: u64) {
    produce_stamped(brokers, from, (from..to).map(|i| 1_000 + i).collect());
}

/// Requests `from..` stamped `stamps`, alternating partitions.
fn produce_stamped(brokers: &str, from: u64, stamps: Vec<u64>) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .create()
        .unwrap();
    for (i, ts) in (from..).zip(stamps) {
        let body = format!(
            r#"{{"req_id":{i},"user_id":{},"ts_ms":{ts},"candidates":[1,2,3],"hist_len":2}}"#,
            i % 200,
        );
        producer
            .send(
                BaseRecord::<(), _>::to(REQUESTS)
                    .partition((i % PARTITIONS as u64) as i32)
                    .payload(&body),
            )
            .expect("send");
    }
    producer.flush(WAIT).expect("flush");
}

/// Reads `topic` from the start until `want` records arrived.
fn read_records(brokers: &str, topic: &str, partitions: i32, want: usize) -> Vec<Vec<u8>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut records = Vec::new();
    while records.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} records on `{topic}`",
            records.len()
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
            records.push(m.payload().unwrap_or_default().to_vec());
        }
    }
    records
}

/// The group's committed offset of each request partition (-1 = none).
fn committed(brokers: &str, group: &str) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(REQUESTS, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    (0..PARTITIONS)
        .map(
            |p| match got.find_partition(REQUESTS, p).unwrap().offset() {
                Offset::Offset(o) => o,
                _ => -1,
            },
        )
        .collect()
}

/// `grflow serve` runs as a child here, not on a thread of this process:
/// its `/metrics` counts only its own reads (the recorder is global to a
/// process, and the other tests here serve at the same time), so the test
/// can wait for every request to be read before it stops the job.
#[test]
fn mock_drain_times_out_when_answers_cannot_be_delivered_and_commits_only_answered() {
    const ANSWERED: u64 = 20;
    const STUCK: u64 = 20;
    let group = "drain-timeout";
    let mock = cluster(group);
    let brokers = mock.bootstrap_servers();
    let dir = tmp_dir("drain-timeout");
    let path = dir.join("serve.toml");
    std::fs::write(
        &path,
        config_text(
            &brokers,
            group,
            "deadline_ms = 600000\ndrain_timeout_ms = 1000",
        ),
    )
    .unwrap();
    let metrics = common::http::free_addr();
    let serve = Serve::start_with(&brokers, &path, "serve", &["--metrics-addr", &metrics]);
    produce_requests(&brokers, 0, ANSWERED);
    read_records(&brokers, RESPONSES, PARTITIONS, ANSWERED as usize);

    // Answers can no longer be acknowledged; requests still arrive.
    mock.broker_down(RESPONSE_LEADER).unwrap();
    produce_requests(&brokers, ANSWERED, ANSWERED + STUCK);
    // Stopped once the job has read every request (milliseconds, on a
    // healthy machine).
    let deadline = Instant::now() + WAIT;
    loop {
        let text = common::http::get(&metrics, "/metrics").map(|r| r.1);
        let read = common::http::metric_total(
            text.as_deref().unwrap_or_default(),
            "grflow_requests_in_total",
        );
        if read >= (ANSWERED + STUCK) as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "read {read} of {} requests in {WAIT:?}; stderr:\n{}",
            ANSWERED + STUCK,
            serve.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = Instant::now();
    let summary = serve.stop();
    assert!(
        stopped.elapsed() < WAIT,
        "the drain did not time out: the job ran {:.2?} after the stop",
        stopped.elapsed()
    );
    eprintln!("drain timed out after {:.2?}: {summary}", stopped.elapsed());
    assert_eq!(summary["requests_in"], ANSWERED + STUCK, "{summary}");
    assert_eq!(summary["drain_timed_out"], true, "{summary}");
    assert_eq!(summary["in_flight_at_exit"], STUCK, "{summary}");
    assert_eq!(summary["delivered"], ANSWERED, "{summary}");
    // Only what was answered is committed, here and on the broker.
    let per_partition = (ANSWERED / PARTITIONS as u64) as i64;
    let committed_here: Vec<i64> = summary["committed"]
        .as_object()
        .expect("committed")
        .values()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(
        committed_here,
        vec![per_partition; PARTITIONS as usize],
        "{summary}"
    );
    let deadline = Instant::now() + WAIT;
    loop {
        // The final commit does not wait for the broker: poll for it.
        let on_broker = committed(&brokers, group);
        if on_broker == vec![per_partition; PARTITIONS as usize] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "committed on the broker: {on_broker:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn mock_outputs_refused_everywhere_stop_the_job_with_exit_code_1() {
    let group = "refused";
    let mock = cluster(group);
    let brokers = mock.bootstrap_servers();
    produce_requests(&brokers, 0, 4);
    // Every produce request from now on fails with an error librdkafka
    // does not retry: responses, then their dead letters.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 500],
    );
    let dir = tmp_dir("serve-refused");
    let path = dir.join("serve.toml");
    std::fs::write(
        &path,
        config_text(
            &brokers,
            group,
            "deadline_ms = 600000\nproduce_retries = 2\nproduce_retry_backoff_ms = 10",
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("GRFLOW_KAFKA_BROKERS", &brokers)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn grflow serve");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > WAIT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "grflow serve did not stop on an undeliverable dead letter; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot write to the dead-letter topic `{LETTERS}`"
        )),
        "stderr:\n{stderr}"
    );
    // Rate-limited: a handful of lines, not one per attempt.
    let lines = stderr.matches("cannot produce").count();
    assert!((1..=8).contains(&lines), "{lines} failure lines:\n{stderr}");
    // Nothing was answered, so nothing is committed.
    assert_eq!(committed(&brokers, group), vec![-1; PARTITIONS as usize]);
}

#[test]
fn mock_far_future_stamps_are_clamped_and_hold_no_request_back() {
    const NORMAL: u64 = 200;
    let group = "far-future";
    let mock = cluster(group);
    let brokers = mock.bootstrap_servers();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Epoch and trace-relative stamps interleaved, and three hostile ones.
    let mut stamps: Vec<u64> = (0..NORMAL)
        .map(|i| if i % 2 == 0 { now + i } else { 1_000 + i * 5 })
        .collect();
    for (k, ts) in [now + 10 * 365 * 86_400_000, now * 1_000, u64::MAX]
        .into_iter()
        .enumerate()
    {
        stamps.insert((k + 1) * NORMAL as usize / 4, ts);
    }
    let total = stamps.len();
    let sent = stamps.clone();
    produce_stamped(&brokers, 0, stamps);
    // The shipped deadline.
    let config = Config::parse(
        &config_text(&brokers, group, "deadline_ms = 2000\nmax_in_flight = 64"),
        "far-future.toml",
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let job_stop = stop.clone();
    let job =
        std::thread::spawn(move || grflow_pipeline::serve(ServeOptions::new(config), job_stop));
    let responses = read_records(&brokers, RESPONSES, PARTITIONS, total);
    stop.store(true, Ordering::Relaxed);
    let summary = job.join().unwrap().expect("serve");
    let mut req_ids = std::collections::BTreeSet::new();
    let mut clamped_answers = 0;
    for r in &responses {
        let v: serde_json::Value = serde_json::from_slice(r).unwrap();
        assert!(v["error"].is_null(), "not served: {v}");
        assert!(
            v["latency_ms"].as_f64().unwrap() <= 2_000.0,
            "too late: {v}"
        );
        let req_id = v["req_id"].as_u64().unwrap();
        req_ids.insert(req_id);
        // A clamped answer says the stamp it was sent with (so `send`
        // can match it); the others are served at their own stamp.
        let own = sent[req_id as usize];
        match v["sent_ts_ms"].as_u64() {
            Some(stamp) => {
                assert_eq!(stamp, own, "{v}");
                assert_ne!(v["ts_ms"].as_u64(), Some(own), "{v}");
                clamped_answers += 1;
            }
            None => assert!(v["sent_ts_ms"].is_null(), "{v}"),
        }
    }
    assert_eq!(req_ids.len(), total, "none missing");
    assert_eq!(clamped_answers, 3);
    assert_eq!(summary.clamped_ts, 3, "{summary:?}");
    assert_eq!(summary.shed, 0, "{summary:?}");
    assert_eq!(summary.responses_out, total as u64, "{summary:?}");
}

#[test]
fn mock_a_committed_offset_past_the_log_end_does_not_skip_new_requests() {
    // The group committed offset 1,000 on a log that has since been
    // created again (or cut short, or the group id was reused): its 20 new
    // records are all below that offset.
    const TOTAL: u64 = 20;
    let group = "past-end";
    let mock = cluster(group);
    let brokers = mock.bootstrap_servers();
    let committer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut old = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        old.add_partition_offset(REQUESTS, p, Offset::Offset(1_000))
            .unwrap();
    }
    committer
        .commit(&old, rdkafka::consumer::CommitMode::Sync)
        .unwrap();
    drop(committer);
    assert_eq!(committed(&brokers, group), vec![1_000; PARTITIONS as usize]);
    produce_requests(&brokers, 0, TOTAL);
    let config = Config::parse(&config_text(&brokers, group, ""), "past-end.toml").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let job_stop = stop.clone();
    let job =
        std::thread::spawn(move || grflow_pipeline::serve(ServeOptions::new(config), job_stop));
    let responses = read_records(&brokers, RESPONSES, PARTITIONS, TOTAL as usize);
    stop.store(true, Ordering::Relaxed);
    let summary = job.join().unwrap().expect("serve");
    let req_ids: std::collections::BTreeSet<u64> = responses
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r).unwrap();
            v["req_id"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(req_ids.len() as u64, TOTAL, "every request answered");
    assert_eq!(summary.responses_out, TOTAL, "{summary:?}");
    assert_eq!(summary.duplicates_skipped, 0, "{summary:?}");
    // The commit now points into the log as it is.
    let now = committed(&brokers, group);
    assert_eq!(now.iter().sum::<i64>(), TOTAL as i64, "{now:?}");
}

#[test]
fn mock_refused_commits_are_counted_and_not_reported_as_committed() {
    const TOTAL: u64 = 20;
    let group = "refused-commits";
    let mock = cluster(group);
    let brokers = mock.bootstrap_servers();
    // The group may not commit (as with a missing ACL), for the whole run.
    mock.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 1_000],
    );
    produce_requests(&brokers, 0, TOTAL);
    let config = Config::parse(&config_text(&brokers, group, ""), "refused.toml").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let job_stop = stop.clone();
    let job =
        std::thread::spawn(move || grflow_pipeline::serve(ServeOptions::new(config), job_stop));
    let responses = read_records(&brokers, RESPONSES, PARTITIONS, TOTAL as usize);
    assert_eq!(responses.len() as u64, TOTAL);
    // A few commit intervals (100 ms) with the answers durable.
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Ordering::Relaxed);
    let summary = job.join().unwrap().expect("serve");
    assert_eq!(summary.responses_out, TOTAL, "{summary:?}");
    assert!(summary.commit_failures > 0, "{summary:?}");
    assert!(summary.committed.is_empty(), "{summary:?}");
    assert_eq!(committed(&brokers, group), vec![-1; PARTITIONS as usize]);
}

/// The request topic was deleted and created again under the same name:
/// the response topic still holds answers to its old records, at the
/// positions of the new ones. Only an answer naming the same `req_id`
/// counts as answered; every other request is served.
#[test]
fn mock_answers_to_an_earlier_request_topic_at_the_same_offsets_do_not_skip_requests() {
    use grflow_connectors::kafka::{RecordId, WireResponse};
    const TOTAL: u64 = 20;
    let group = "recreated";
    let mock = cluster(group);
    let brokers = mock.bootstrap_servers();
    // Old answers at every position the new requests take (request `i`
    // lands on partition i % 2 at offset i / 2); the one at partition 0,
    // offset 0 names request 0, which is the new record there too.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    for i in 0..TOTAL {
        let source = RecordId {
            partition: (i % PARTITIONS as u64) as i32,
            offset: (i / PARTITIONS as u64) as i64,
        };
        let req_id = if i == 0 { 0 } else { 1_000_000 + i };
        let old = WireResponse::ranking(source, req_id, vec![1], &[0.5], "old".into())
            .requested_on(REQUESTS);
        let body = serde_json::to_vec(&old).unwrap();
        producer
            .send(
                BaseRecord::<(), _>::to(RESPONSES)
                    .partition(0)
                    .payload(&body),
            )
            .expect("send");
    }
    producer.flush(WAIT).expect("flush");
    produce_requests(&brokers, 0, TOTAL);
    let config = Config::parse(&config_text(&brokers, group, ""), "recreated.toml").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let job_stop = stop.clone();
    let job =
        std::thread::spawn(move || grflow_pipeline::serve(ServeOptions::new(config), job_stop));
    // The old answers, and one new one for each request but request 0.
    let records = read_records(&brokers, RESPONSES, PARTITIONS, 2 * TOTAL as usize - 1);
    stop.store(true, Ordering::Relaxed);
    let summary = job.join().unwrap().expect("serve");
    let answered: std::collections::BTreeSet<u64> = records
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(r).unwrap())
        .filter(|v| v["model_version"] != "old")
        .map(|v| v["req_id"].as_u64().unwrap())
        .collect();
    assert_eq!(answered, (1..TOTAL).collect(), "{summary:?}");
    assert_eq!(summary.already_answered, 1, "{summary:?}");
    assert_eq!(summary.responses_out, TOTAL - 1, "{summary:?}");
    // Every request, answered now or before, is committed.
    let per_partition = (TOTAL / PARTITIONS as u64) as i64;
    assert_eq!(
        summary.committed.values().copied().collect::<Vec<_>>(),
        vec![per_partition; PARTITIONS as usize],
        "{summary:?}"
    );
}

/// Without its dead-letter topic the job would stop at the first bad
/// record, and again at every restart: it refuses to start, naming the key.
#[test]
fn mock_a_missing_dead_letter_topic_is_refused_at_start() {
    let group = "no-letters";
    let mock = MockCluster::new(1).expect("mock cluster");
    for topic in [REQUESTS, RESPONSES] {
        mock.create_topic(topic, PARTITIONS, 1).unwrap();
    }
    let brokers = mock.bootstrap_servers();
    let config = Config::parse(&config_text(&brokers, group, ""), "no-letters.toml").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let job_stop = stop.clone();
    let job =
        std::thread::spawn(move || grflow_pipeline::serve(ServeOptions::new(config), job_stop));
    let started = Instant::now();
    while !job.is_finished() && started.elapsed() < WAIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let error = job
        .join()
        .unwrap()
        .expect_err("serve started without dead letters");
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "kafka.dead_letter_topic `{LETTERS}` does not exist"
        )),
        "{message}"
    );
}

/// A stop while the group coordinator is away: the final commit cannot be
/// answered, and the job still stops within its drain deadline, reporting
/// nothing committed; the broker keeps the last commit it took.
#[test]
fn mock_the_final_commit_is_bounded_by_the_drain_deadline() {
    const TOTAL: u64 = 20;
    const COORDINATOR: i32 = 3;
    const DRAIN: Duration = Duration::from_millis(1_000);
    let group = "final-commit";
    let mock = cluster(group);
    // Only commits go to broker 3: requests and answers flow on.
    mock.coordinator(MockCoordinator::Group(group.into()), COORDINATOR)
        .unwrap();
    let brokers = mock.bootstrap_servers();
    produce_requests(&brokers, 0, TOTAL);
    let extra = format!("drain_timeout_ms = {}", DRAIN.as_millis());
    let config = Config::parse(&config_text(&brokers, group, &extra), "final.toml").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let job_stop = stop.clone();
    let job =
        std::thread::spawn(move || grflow_pipeline::serve(ServeOptions::new(config), job_stop));
    read_records(&brokers, RESPONSES, PARTITIONS, TOTAL as usize);
    let per_partition = (TOTAL / PARTITIONS as u64) as i64;
    let deadline = Instant::now() + WAIT;
    while committed(&brokers, group) != vec![per_partition; PARTITIONS as usize] {
        assert!(Instant::now() < deadline, "periodic commits never landed");
        std::thread::sleep(Duration::from_millis(50));
    }

    mock.broker_down(COORDINATOR).unwrap();
    stop.store(true, Ordering::Relaxed);
    let stopped = Instant::now();
    while !job.is_finished() {
        assert!(
            stopped.elapsed() < WAIT,
            "the job still runs {WAIT:?} after the stop: the final commit waits on the coordinator"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = stopped.elapsed();
    let summary = job.join().unwrap().expect("serve");
    assert!(
        took < DRAIN + Duration::from_secs(3),
        "stopped after {took:?}"
    );
    assert!(!summary.drain_timed_out, "{summary:?}");
    assert!(summary.committed.is_empty(), "{summary:?}");
    mock.broker_up(COORDINATOR).unwrap();
    assert_eq!(
        committed(&brokers, group),
        vec![per_partition; PARTITIONS as usize]
    );
}
