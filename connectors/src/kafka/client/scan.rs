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
            // Nothing to read: a partition whose log ends in records never
            // delivered (a transaction's commit marker, aborted records) is
            // done once the consumer's position has passed its end.
            let read_past = positions_past_end(&consumer, response_topic, &ends);
            if !read_past.is_empty() {
                for p in read_past {
                    ends.remove(&p);
                }
                last_progress = std::time::Instant::now();
            }
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

/// The partitions of `ends` whose consumer position has reached their end.
/// librdkafka moves the position past control records it never hands out.
fn positions_past_end(
    consumer: &BaseConsumer<LoggedContext>,
    topic: &str,
    ends: &BTreeMap<i32, i64>,
) -> Vec<i32> {
    let Ok(positions) = consumer.position() else {
        return Vec::new();
    };
    ends.iter()
        .filter(|&(&p, &end)| {
            let position = positions
                .find_partition(topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            read_to_end(position, end, cached_high_watermark(consumer, topic, p))
        })
        .map(|(&p, _)| p)
        .collect()
}

/// Whether a consumer at `position` has read a partition to `end` (or to
/// the fetched high watermark, if further: see `cached_high_watermark`).
fn read_to_end(position: Option<i64>, end: i64, fetched_end: Option<i64>) -> bool {
    position.is_some_and(|o| o >= end.max(fetched_end.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::read_to_end;

    #[test]
    fn a_partition_is_read_once_the_position_passes_the_further_end() {
        // Nothing consumed yet: no position.
        assert!(!read_to_end(None, 10, None));
        // The last record (offset 8) read, a commit marker at 9 skipped.
        assert!(!read_to_end(Some(9), 10, None));
        assert!(read_to_end(Some(10), 10, None));
        assert!(read_to_end(Some(10), 10, Some(7)));
        // The log grew past what ListOffsets said: read on.
        assert!(!read_to_end(Some(10), 10, Some(12)));
        assert!(read_to_end(Some(12), 10, Some(12)));
    }
}
