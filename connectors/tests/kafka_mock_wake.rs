//! An idle Kafka source sleeps and is woken by its consumer when a record
//! arrives (librdkafka's in-process mock cluster; the serve tests against
//! tansu run the same path end to end). What is tested is the contract the
//! serve loop relies on: a source whose queue is empty, whose consumer
//! calls back and which has nothing in flight may wait `QUIET_POLL`; a
//! produced record calls the waker; once the record is read the source
//! polls every `IDLE_POLL` again until it is answered.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{
    IDLE_POLL, KafkaSettings, KafkaSink, KafkaSource, OutputProducer, QUIET_POLL, Refetch,
    RequestConsumer, SharedState, SinkSettings, SourceSettings, StartPosition,
};
use grflow_connectors::source::SourceRecord;
use grflow_operators::history::HistoryLimits;
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
    let payload = serde_json::to_vec(&serde_json::json!({
        "req_id": req_id,
        "user_id": 7,
        "ts_ms": 1_700_000_000_000u64 + req_id,
        "candidates": [1, 2, 3],
        "history": [4, 5, 6],
    }))
    .unwrap();
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
    let settings = KafkaSettings {
        brokers: brokers.to_string(),
        group_id: "wake".into(),
        client_id: "kafka-mock-wake".into(),
        ..KafkaSettings::default()
    };
    let (consumer, resumed) = RequestConsumer::open(
        &settings,
        TOPIC,
        &[0],
        StartPosition::Earliest,
        Refetch::FromCommitted,
        Duration::from_secs(10),
    )
    .unwrap();
    for r in &resumed {
        shared.book(0).lock().unwrap().resume(r.partition, r.offset);
    }
    let producer = Arc::new(OutputProducer::new(&settings, Arc::new(|_| {})).unwrap());
    let sink = KafkaSink::new(
        producer,
        shared.clone(),
        SinkSettings {
            request_topic: TOPIC.into(),
            response_topic: "responses".into(),
            dead_letter_topic: "dead-letters".into(),
            max_retries: 1,
            retry_backoff: Duration::from_millis(10),
        },
    );
    KafkaSource::new(
        0,
        consumer,
        SourceSettings {
            request_topic: TOPIC.into(),
            dead_letter_topic: "dead-letters".into(),
            max_in_flight: 1_000,
            max_in_flight_tokens: 1_000_000,
            max_message_bytes: 1 << 20,
            max_candidates: 100,
            history: HistoryLimits {
                rank: 100,
                retrieve: 100,
                chunk: 1,
            },
            idle_timeout: Duration::from_millis(50),
            max_skew_ms: 2_000,
            max_future_ms: u64::MAX,
            repeat_window: 1_000,
            commit_interval: Duration::from_secs(3600),
        },
        shared.clone(),
        Rc::new(RefCell::new(sink)),
        HashSet::new(),
    )
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
