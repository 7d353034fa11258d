//! Topic administration and broker probes: partition counts, topic
//! creation and deletion, the readiness check's metadata request.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;

use super::{KafkaClientError, KafkaSettings, kafka, kafka_call};
use crate::kafka::client_logs::LoggedContext;
use crate::kafka::shared::SharedState;

/// Asks the cluster for a topic's metadata, to tell whether a broker
/// answers (readiness): one client kept for every check.
pub struct BrokerProbe {
    consumer: BaseConsumer<LoggedContext>,
    topic: String,
}

impl std::fmt::Debug for BrokerProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerProbe")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// Events served from the probe's queue per check at most: a bound on the
/// work, not a limit anyone reaches (a check a second leaves a handful).
const MAX_DRAINED: usize = 10_000;

impl BrokerProbe {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self, KafkaClientError> {
        Ok(Self {
            consumer: probe_config(settings)
                .create_with_context(LoggedContext)
                .map_err(kafka("creating a metadata client"))?,
            topic: topic.into(),
        })
    }

    /// The topic's partition count when a broker answered within
    /// `timeout` (0 where the answer does not list the topic).
    pub fn check(&self, timeout: Duration) -> Result<i32, KafkaClientError> {
        let metadata = self.consumer.fetch_metadata(Some(&self.topic), timeout);
        self.drain();
        let metadata = metadata.map_err(kafka(format!("metadata of `{}`", self.topic)))?;
        Ok(partitions_listed(&metadata, &self.topic))
    }

    /// Where the topic's `partition` ends, as its leader answers within
    /// `timeout` (a ListOffsets request).
    pub fn log_end(&self, partition: i32, timeout: Duration) -> Result<i64, KafkaClientError> {
        let ends = self
            .consumer
            .fetch_watermarks(&self.topic, partition, timeout);
        self.drain();
        let (_, high) = ends.map_err(kafka(format!("the end of `{}`[{partition}]", self.topic)))?;
        Ok(high)
    }

    /// Asks the broker where each partition whose lag reading nothing
    /// vouched for lately ends ([`SharedState::lag_to_confirm`]), the
    /// longest unconfirmed first, for at most `budget`: a quiet partition
    /// keeps a known lag while its leader answers. A partition whose
    /// leader does not answer is left to turn unknown. Returns the first
    /// error.
    pub fn confirm_lags(&self, shared: &SharedState, budget: Duration) -> Option<KafkaClientError> {
        let started = Instant::now();
        let mut first_error = None;
        for partition in shared.lag_to_confirm(started) {
            let Some(left) = budget
                .checked_sub(started.elapsed())
                .filter(|l| !l.is_zero())
            else {
                break;
            };
            match self.log_end(partition, left) {
                Ok(end) => shared.confirm_lag_end(partition, end, Instant::now()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error
    }

    /// Serves what librdkafka queued for this client since the last check:
    /// its log lines and errors (a broker away for a month posts some at
    /// every reconnect), which nothing else reads, would otherwise pile up.
    /// They go to [`LoggedContext`], rate-limited.
    fn drain(&self) {
        for _ in 0..MAX_DRAINED {
            if self.queued() == 0 {
                return;
            }
            // `None` also after an event that is not a record (a log line).
            drop(self.consumer.poll(Duration::ZERO));
        }
    }

    /// Events waiting in the client's main queue (without a `group.id`,
    /// the queue `poll` serves).
    fn queued(&self) -> usize {
        use rdkafka::bindings as rd;
        let rk = self.consumer.client().native_ptr();
        // SAFETY: `rk` is valid for the life of the consumer; the queue
        // reference taken here is released before returning.
        unsafe {
            let queue = rd::rd_kafka_queue_get_main(rk);
            if queue.is_null() {
                return 0;
            }
            let queued = rd::rd_kafka_queue_length(queue);
            rd::rd_kafka_queue_destroy(queue);
            queued
        }
    }
}

/// The probe's client: the user's properties, but no statistics (nothing
/// would read them; one event per interval for the life of the job).
fn probe_config(settings: &KafkaSettings) -> rdkafka::config::ClientConfig {
    let mut config = settings.client_config();
    config.set("statistics.interval.ms", "0");
    config
}

/// Partitions of `topic` in a metadata answer (0 where it is not listed,
/// or listed with an error).
fn partitions_listed(metadata: &rdkafka::metadata::Metadata, topic: &str) -> i32 {
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32)
}

pub fn partition_count(
    settings: &KafkaSettings,
    topic: &str,
    timeout: Duration,
) -> Result<i32, KafkaClientError> {
    let consumer: BaseConsumer<LoggedContext> = settings
        .client_config()
        .create_with_context(LoggedContext)
        .map_err(kafka("creating a metadata client"))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(kafka_call(
            settings,
            format!("metadata of `{topic}`"),
            timeout,
        ))?;
    let partitions = partitions_listed(&metadata, topic);
    if partitions == 0 {
        return Err(KafkaClientError::NoSuchTopic {
            topic: topic.into(),
            brokers: settings.brokers.clone(),
        });
    }
    Ok(partitions)
}

/// An admin client, its options and a runtime to wait on it with. The
/// operation timeout bounds the broker's side; the request timeout the
/// client's wait for an answer (default socket.timeout.ms, 60 s), which is
/// what a missing broker runs into.
fn admin_session(
    settings: &KafkaSettings,
    timeout: Duration,
) -> Result<
    (
        AdminClient<LoggedContext>,
        AdminOptions,
        tokio::runtime::Runtime,
    ),
    KafkaClientError,
> {
    let admin: AdminClient<LoggedContext> = settings
        .client_config()
        .create_with_context(LoggedContext)
        .map_err(kafka("creating an admin client"))?;
    let opts = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| KafkaClientError::Runtime(e.to_string()))?;
    Ok((admin, opts, runtime))
}

/// Creates the topics that do not exist yet with `replication` copies of
/// each partition (-1: the broker's `default.replication.factor`); existing
/// ones are left alone.
pub fn ensure_topics(
    settings: &KafkaSettings,
    topics: &[(&str, i32)],
    replication: i32,
    timeout: Duration,
) -> Result<(), KafkaClientError> {
    let (admin, opts, runtime) = admin_session(settings, timeout)?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| {
            NewTopic::new(name, *partitions, TopicReplication::Fixed(replication))
        })
        .collect();
    let results = runtime
        .block_on(admin.create_topics(&new, &opts))
        .map_err(kafka_call(settings, "creating topics", timeout))?;
    for result in results {
        if let Err((topic, code)) = result
            && code != RDKafkaErrorCode::TopicAlreadyExists
        {
            let partitions = topics
                .iter()
                .find(|(name, _)| *name == topic)
                .map_or(0, |(_, p)| *p);
            return Err(KafkaClientError::CreateTopic {
                partitions,
                replication,
                topic,
                reason: code.to_string(),
            });
        }
    }
    Ok(())
}

/// Deletes `topics` (a bench's own); the topics the broker did not delete,
/// with why, are the error.
pub fn delete_topics(
    settings: &KafkaSettings,
    topics: &[&str],
    timeout: Duration,
) -> Result<(), KafkaClientError> {
    let (admin, opts, runtime) = admin_session(settings, timeout)?;
    let results = runtime
        .block_on(admin.delete_topics(topics, &opts))
        .map_err(kafka_call(settings, "deleting topics", timeout))?;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|(topic, code)| format!("{topic} ({code})")))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(KafkaClientError::Runtime(format!(
            "topics not deleted: {}",
            failed.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe of a broker that refuses connections (a broker away): what
    /// its client queues (errors, log lines) is served by each check, not
    /// left to pile up for the life of the job, and the user's statistics
    /// interval does not apply to it.
    #[test]
    fn a_probe_serves_its_clients_queue_at_each_check_and_keeps_no_statistics() {
        let settings = KafkaSettings {
            brokers: "127.0.0.1:1".into(),
            extra: [("statistics.interval.ms".to_string(), "1000".to_string())].into(),
            ..KafkaSettings::default()
        };
        assert_eq!(
            probe_config(&settings).get("statistics.interval.ms"),
            Some("0")
        );
        let probe = BrokerProbe::new(&settings, "requests").unwrap();
        let wait = Duration::from_millis(300);
        // What a check left alone would leave behind.
        for _ in 0..3 {
            drop(probe.consumer.fetch_metadata(Some("requests"), wait));
        }
        let piled = probe.queued();
        assert!(piled > 0, "nothing queued by a refused broker");
        for _ in 0..3 {
            assert!(probe.check(wait).is_err(), "no broker at 127.0.0.1:1");
            // At most one that arrived since the drain.
            assert!(
                probe.queued() <= 1,
                "{} queued (was {piled})",
                probe.queued()
            );
        }
    }
}
