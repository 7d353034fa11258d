//! Partitions created while the job runs, on librdkafka's in-process mock
//! cluster. Neither test broker can grow a topic (tansu 0.6 and the mock
//! both refuse CreatePartitions), so the topic here has all its partitions
//! from the start and the job is told of "new" ones the way serve's broker
//! watcher tells it: through `SharedState::saw_partitions`. What is tested
//! is everything after that signal: the worker that owns a new partition
//! adds it to its consumer (an incremental assignment beside the running
//! one), reads it from its beginning, and books its offsets.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grflow_connectors::SourcePosition;
use grflow_connectors::kafka::{KafkaSource, SharedState, StartPosition, owned_partitions};
use grflow_connectors::source::SourceRecord;
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

const WAIT: Duration = Duration::from_secs(20);
const TOPIC: &str = "requests";
const PER_PARTITION: u64 = 5;

fn produce(brokers: &str, partitions: std::ops::Range<i32>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .create()
        .unwrap();
    for p in partitions {
        for i in 0..PER_PARTITION {
            let payload = common::request_payload(p as u64 * 100 + i);
            producer
                .send(
                    BaseRecord::<(), _>::to(TOPIC)
                        .partition(p)
                        .payload(&payload),
                )
                .expect("send");
        }
    }
    producer.flush(WAIT).expect("flush");
}

/// Polls `source` for `duration`, or until `enough` records per partition.
fn poll_for(
    source: &mut KafkaSource,
    read: &mut BTreeMap<i32, u64>,
    duration: Duration,
    enough: impl Fn(&BTreeMap<i32, u64>) -> bool,
) {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline && !enough(read) {
        for r in source.poll_at(100, Instant::now(), 0).records {
            match r {
                SourceRecord::Request {
                    position: SourcePosition::Kafka { partition, .. },
                    ..
                } => *read.entry(partition).or_default() += 1,
                other => panic!("not a Kafka request: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn mock_a_worker_reads_partitions_created_while_it_runs() {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    mock.create_topic(TOPIC, 4, 1).unwrap();
    mock.create_topic("dead-letters", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    produce(&brokers, 0..4);
    // Two workers; this is worker 0, which owns some of the new partitions.
    let workers = 2;
    let at_start = 1;
    let shared = Arc::new(SharedState::new(TOPIC, workers));
    shared.saw_partitions(at_start);
    let owned = owned_partitions(TOPIC, at_start, 0, workers);
    let (settings, opened) =
        common::open_consumer_on(&brokers, TOPIC, "grow", &owned, StartPosition::Latest);
    let mut source = common::source_over(&settings, TOPIC, opened, &shared, 1_000, 1_000_000);
    let mut read = BTreeMap::new();
    // Before the topic "grows": only what worker 0 owned at start (with
    // `start = latest`, nothing of what was there before it started).
    poll_for(&mut source, &mut read, Duration::from_millis(1_500), |_| {
        false
    });
    assert!(read.is_empty(), "read before growing: {read:?}");

    shared.saw_partitions(4);
    let new_owned: Vec<i32> = owned_partitions(TOPIC, 4, 0, workers)
        .into_iter()
        .filter(|&p| p >= at_start)
        .collect();
    assert!(!new_owned.is_empty(), "worker 0 owns a new partition");
    poll_for(&mut source, &mut read, WAIT, |r| {
        new_owned
            .iter()
            .all(|p| r.get(p).copied() == Some(PER_PARTITION))
    });
    // Every record of its new partitions, from their beginning (records
    // there were produced before the job saw them), and nothing else.
    let expected: BTreeMap<i32, u64> = new_owned.iter().map(|&p| (p, PER_PARTITION)).collect();
    assert_eq!(read, expected);
    let book = shared.book(0).lock().unwrap();
    for &p in &new_owned {
        let offsets = book.partition(p).expect("booked");
        assert_eq!(offsets.next_offset(), PER_PARTITION as i64, "partition {p}");
    }
}

/// A new partition that is still empty when the job stops: under `start =
/// "latest"` its start (offset 0) must be committed, or the next start
/// would find no commit, begin at the end of its log and skip every
/// request produced there while the job was down.
#[test]
fn mock_an_empty_new_partition_under_latest_has_its_start_committed() {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    mock.create_topic(TOPIC, 2, 1).unwrap();
    mock.create_topic("dead-letters", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let shared = Arc::new(SharedState::new(TOPIC, 1));
    shared.saw_partitions(1);
    let (settings, opened) =
        common::open_consumer_on(&brokers, TOPIC, "grow-empty", &[0], StartPosition::Latest);
    let mut source = common::source_over(&settings, TOPIC, opened, &shared, 1_000, 1_000_000);
    shared.saw_partitions(2);
    let mut read = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    while shared.book(0).lock().unwrap().partition(1).is_none() {
        assert!(Instant::now() < deadline, "partition 1 was never adopted");
        poll_for(&mut source, &mut read, Duration::from_millis(50), |_| false);
    }
    assert!(read.is_empty(), "{read:?}");
    let commits = shared.book(0).lock().unwrap().safe_commits();
    assert!(commits.contains(&(1, 0)), "{commits:?}");
}
