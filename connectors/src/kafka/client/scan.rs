//! The restart scan: which requests the response topic already answers.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::admin::partition_count;
use super::consumer::cached_high_watermark;
use super::{KafkaClientError, KafkaSettings, kafka};
use crate::kafka::client_logs::LoggedContext;
use crate::kafka::wire::{AnsweredRequest, RecordId, WireResponse};

/// The records of `request_topic` that already have a response on
/// `response_topic`, from the last `lookback` messages of each of its
/// partitions (positions only; see [`scan_answers`] for what the restart
/// decides with).
pub fn scan_answered(
    settings: &KafkaSettings,
    response_topic: &str,
    request_topic: &str,
    lookback: i64,
    timeout: Duration,
) -> Result<HashSet<RecordId>, KafkaClientError> {
    let answers = scan_answers(settings, response_topic, request_topic, lookback, timeout)?;
    Ok(answers.into_iter().map(|a| a.source).collect())
}

/// The answers to records of `request_topic` found in the last `lookback`
/// messages of each partition of `response_topic`, each with the `req_id`
/// it answered. A restarted job skips a request only where both its
/// position and its `req_id` match: a position alone also matches answers
/// to an earlier incarnation of the request topic (deleted and created
/// again), whose records sat at the same offsets.
/// Answers to another request topic sharing the response topic are not
/// counted: their (partition, offset) would hide new requests.
pub fn scan_answers(
    settings: &KafkaSettings,
    response_topic: &str,
    request_topic: &str,
    lookback: i64,
    timeout: Duration,
) -> Result<HashSet<AnsweredRequest>, KafkaClientError> {
    let partitions = partition_count(settings, response_topic, timeout)?;
    let group = format!("{}-restart-scan", settings.group_id);
    let consumer: BaseConsumer<LoggedContext> = settings
        .client_config_with(&[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
        ])
        .create_with_context(LoggedContext)
        .map_err(kafka("creating the restart-scan consumer"))?;
    let mut assignment = TopicPartitionList::new();
    let mut remaining = 0i64;
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(response_topic, p, timeout)
            .map_err(kafka(format!("watermarks of `{response_topic}`[{p}]")))?;
        let from = low.max(high - lookback);
        if from < high {
            assignment
                .add_partition_offset(response_topic, p, Offset::Offset(from))
                .map_err(kafka("building the scan assignment"))?;
            remaining += high - from;
            ends.insert(p, high);
        }
    }
    let mut answered = HashSet::new();
    if ends.is_empty() {
        return Ok(answered);
    }
    consumer
        .assign(&assignment)
        .map_err(kafka("assigning the restart scan"))?;
    let stall = timeout.max(Duration::from_secs(1)) * 4;
    let mut last_progress = std::time::Instant::now();
    while !ends.is_empty() {
        if last_progress.elapsed() > stall {
            return Err(KafkaClientError::Kafka {
                what: format!(
                    "restart scan of `{response_topic}` stalled with {remaining} records left"
                ),
                cause: KafkaError::MessageConsumption(RDKafkaErrorCode::RequestTimedOut),
            });
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.map_err(kafka(format!("reading `{response_topic}`")))?;
        last_progress = std::time::Instant::now();
        let p = message.partition();
        if let Some(payload) = message.payload()
            && let Ok(response) = serde_json::from_slice::<WireResponse>(payload)
            && response.answers_topic(request_topic)
        {
            answered.insert(AnsweredRequest {
                source: response.source(),
                req_id: response.req_id,
            });
        }
        remaining -= 1;
        // The log may end past what ListOffsets said (see
        // `cached_high_watermark`): read to whichever end is further.
        let fetched_end = cached_high_watermark(&consumer, response_topic, p).unwrap_or(0);
        if ends
            .get(&p)
            .is_some_and(|&end| message.offset() + 1 >= end.max(fetched_end))
        {
            ends.remove(&p);
        }
    }
    Ok(answered)
}
