//! A hot model swap changes the history a Kafka source keeps (librdkafka's
//! in-process mock cluster): the source decodes with a cut that keeps what
//! every model served keeps ([`ServedLimits`], which serve updates when a
//! node takes a model), read at each poll, not with the cut of the model
//! it started with. The in-flight token budget counts what was kept.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{KafkaSource, ServedLimits, SharedState, StartPosition};
use grflow_connectors::source::SourceRecord;
use grflow_operators::history::{HistoryLimits, Task};
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

const WAIT: Duration = Duration::from_secs(20);
const TOPIC: &str = "requests";
/// Items in each request's inline history.
const HISTORY: u32 = 50;

fn produce(brokers: &str, req_id: u64) {
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
        "history": (0..HISTORY).collect::<Vec<_>>(),
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

/// The next request's inline history.
fn next_history(source: &mut KafkaSource) -> Vec<u32> {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no request read");
        if let Some(r) = source.poll_at(100, Instant::now(), 0).records.pop() {
            match r {
                SourceRecord::Request {
                    inline_history: Some(h),
                    ..
                } => return h,
                other => panic!("not a request with an inline history: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn limits(max: usize, chunk: usize) -> HistoryLimits {
    HistoryLimits {
        rank: max,
        retrieve: max,
        chunk,
    }
}

#[test]
fn mock_after_a_model_swap_histories_keep_what_the_new_model_keeps() {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    mock.create_topic(TOPIC, 1, 1).unwrap();
    mock.create_topic("dead-letters", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let shared = Arc::new(SharedState::new(TOPIC, 1));
    shared.saw_partitions(1);
    let (settings, opened) =
        common::open_consumer_on(&brokers, TOPIC, "history", &[0], StartPosition::Earliest);
    // The nodes serve the model the job started with: 10 items at most.
    let (old, new) = (limits(10, 4), limits(40, 8));
    let served = ServedLimits::new(old);
    let mut source = common::source_following(
        &settings,
        TOPIC,
        opened,
        &shared,
        (100, 1_000_000),
        served.clone(),
    );
    let tokens = || shared.book(0).lock().unwrap().in_flight_tokens();
    let whole: Vec<u32> = (0..HISTORY).collect();

    produce(&brokers, 1);
    let h = next_history(&mut source);
    assert_eq!(h, (40..HISTORY).collect::<Vec<_>>());
    // History, three candidates and the instruction.
    assert_eq!(tokens(), 10 + 3 + 1);

    // A node took a model that allows 40 items (chunks of 8: 16 dropped).
    // A node still on the old model cuts what arrives to the same 10 items
    // it would have kept of the whole history.
    served.note(new);
    produce(&brokers, 2);
    let h = next_history(&mut source);
    assert_eq!(h, (16..HISTORY).collect::<Vec<_>>());
    assert_eq!(new.keep(&h, Task::Rank), new.keep(&whole, Task::Rank));
    assert_eq!(old.keep(&h, Task::Rank), old.keep(&whole, Task::Rank));
    assert_eq!(tokens(), 14 + (34 + 4));
}
