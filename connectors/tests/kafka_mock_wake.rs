//! An idle Kafka source sleeps and is woken by its consumer when a record
//! arrives (librdkafka's in-process mock cluster; the serve tests against
//! tansu run the same path end to end). What is tested is the contract the
//! serve loop relies on: a source whose queue is empty, whose consumer
//! calls back and which has nothing in flight may wait `QUIET_POLL`; a
//! produced record calls the waker; once the record is read the source
//! polls every `IDLE_POLL` again until it is answered.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{IDLE_POLL, KafkaSource, QUIET_POLL, SharedState, StartPosition};
use grflow_connectors::source::SourceRecord;
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

const WAIT: Duration = Duration::from_secs(20);
const TOPIC: &str = "requests";

fn produce_one(brokers: &str, req_id: u64) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .create()
        .unwrap();
    let payload = common::request_payload(req_id);
    producer
        .send(
            BaseRecord::<(), _>::to(TOPIC)
                .partition(0)
                .payload(&payload),
        )
        .expect("send");
    producer.flush(WAIT).expect("flush");
}

fn source(brokers: &str, shared: &Arc<SharedState>) -> KafkaSource {
    let (settings, opened) =
        common::open_consumer_on(brokers, TOPIC, "wake", &[0], StartPosition::Earliest);
    // One unanswered request pauses reads.
    common::source_over(&settings, TOPIC, opened, shared, 1, 1_000_000)
}

/// Polls until the source reads nothing and may sleep `want`.
fn poll_until_idle(source: &mut KafkaSource, want: Duration) -> usize {
    let deadline = Instant::now() + WAIT;
    let mut read = 0;
    loop {
        let polled = source.poll_at(100, Instant::now(), 0);
        read += polled.records.len();
        if polled.records.is_empty() && source.idle_poll() == want {
            return read;
        }
        assert!(
            Instant::now() < deadline,
            "never idle with a wait of {want:?} (last {:?})",
            source.idle_poll()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn mock_an_idle_source_sleeps_until_a_record_wakes_it() {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    mock.create_topic(TOPIC, 1, 1).unwrap();
    mock.create_topic("dead-letters", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let shared = Arc::new(SharedState::new(TOPIC, 1));
    shared.saw_partitions(1);
    let mut source = source(&brokers, &shared);

    // Nothing would wake it: it keeps polling every millisecond.
    assert_eq!(poll_until_idle(&mut source, IDLE_POLL), 0);
    let wakes = Arc::new(AtomicUsize::new(0));
    let counter = wakes.clone();
    source.wake_on_arrival(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(poll_until_idle(&mut source, QUIET_POLL), 0);

    // A record calls the waker while nobody polls.
    let before = wakes.load(Ordering::SeqCst);
    produce_one(&brokers, 1);
    let deadline = Instant::now() + WAIT;
    while wakes.load(Ordering::SeqCst) == before {
        assert!(
            Instant::now() < deadline,
            "the record never woke the source"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut requests = 0;
    let deadline = Instant::now() + WAIT;
    while requests == 0 {
        assert!(Instant::now() < deadline, "woken, but nothing to read");
        for r in source.poll_at(100, Instant::now(), 0).records {
            assert!(matches!(r, SourceRecord::Request { .. }), "{r:?}");
            requests += 1;
        }
    }
    assert_eq!(requests, 1);
    // Read but unanswered: event time must keep moving, so no long sleep.
    assert_eq!(shared.in_flight(), 1);
    assert!(source.poll_at(100, Instant::now(), 0).records.is_empty());
    assert_eq!(source.idle_poll(), IDLE_POLL);
}
