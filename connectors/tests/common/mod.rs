//! What the connector tests against librdkafka's mock cluster share: a
//! request's JSON and worker 0's Kafka source over an opened consumer.

#![allow(dead_code)] // each test binary uses its own part

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use grflow_connectors::kafka::{
    KafkaSettings, KafkaSink, KafkaSource, OutputProducer, Refetch, RequestConsumer, Resumed,
    ServedLimits, SharedState, SinkSettings, SourceSettings, StartPosition,
};
use grflow_operators::history::HistoryLimits;

/// A rank request `i` (user `i % 50`, three candidates, a history of three).
pub fn request_payload(i: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "req_id": i,
        "user_id": i % 50,
        "ts_ms": 1_700_000_000_000u64 + i,
        "candidates": [1, 2, 3],
        "history": [4, 5, 6],
    }))
    .unwrap()
}

/// Settings of consumer group `group` on `brokers`, and a consumer of
/// `topic`'s `partitions` opened with them from `start` (resuming where
/// the group committed).
pub fn open_consumer_on(
    brokers: &str,
    topic: &str,
    group: &str,
    partitions: &[i32],
    start: StartPosition,
) -> (KafkaSettings, (RequestConsumer, Vec<Resumed>)) {
    let settings = KafkaSettings {
        brokers: brokers.to_string(),
        group_id: group.into(),
        client_id: format!("kafka-mock-{group}"),
        ..KafkaSettings::default()
    };
    let opened = RequestConsumer::open(
        &settings,
        topic,
        partitions,
        start,
        Refetch::FromCommitted,
        Duration::from_secs(10),
    )
    .unwrap();
    (settings, opened)
}

/// Tokens of a [`request_payload`] request (history, candidates, the
/// instruction).
pub const REQUEST_TOKENS: u64 = 7;

/// Worker 0 (of `shared`'s workers) reading what `consumer` was opened on,
/// its partitions resumed where `resumed` says, with the caps given. Its
/// outputs (dead letters) go to a sink nobody reads, and nothing it reads
/// is answered.
pub fn source_over(
    settings: &KafkaSettings,
    topic: &str,
    (consumer, resumed): (RequestConsumer, Vec<Resumed>),
    shared: &Arc<SharedState>,
    max_in_flight: usize,
    max_in_flight_tokens: u64,
) -> KafkaSource {
    let history = HistoryLimits {
        rank: 100,
        retrieve: 100,
        chunk: 1,
    };
    source_following(
        settings,
        topic,
        (consumer, resumed),
        shared,
        (max_in_flight, max_in_flight_tokens),
        history.into(),
    )
}

/// [`source_over`] decoding with the history limits in `history` (those of
/// the models served, which a model swap changes).
pub fn source_following(
    settings: &KafkaSettings,
    topic: &str,
    (consumer, resumed): (RequestConsumer, Vec<Resumed>),
    shared: &Arc<SharedState>,
    (max_in_flight, max_in_flight_tokens): (usize, u64),
    history: ServedLimits,
) -> KafkaSource {
    for r in &resumed {
        shared.book(0).lock().unwrap().register(r);
    }
    let producer = Arc::new(OutputProducer::new(settings, Arc::new(|_| {})).unwrap());
    let sink = KafkaSink::new(
        producer,
        shared.clone(),
        SinkSettings {
            request_topic: topic.into(),
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
            request_topic: topic.into(),
            dead_letter_topic: "dead-letters".into(),
            max_in_flight,
            max_in_flight_tokens,
            max_message_bytes: 1 << 20,
            max_candidates: 100,
            history,
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
