//! The rdkafka client behind `grflow serve`: a consumer per worker that
//! reads its own partitions in assign mode (no group rebalancing) and
//! commits explicitly, one producer per job whose delivery reports say which
//! request record an output belongs to, topic administration, and the
//! restart scan of the response topic. Blocking calls only; no timely types.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::client_logs::CLIENT_LOGS;
use super::offsets::RecoveryBounds;
use super::wire::{AnsweredRequest, RecordId, WireResponse};

/// How to reach the cluster, and extra librdkafka properties.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaSettings {
    /// `bootstrap.servers`, e.g. "127.0.0.1:9092".
    pub brokers: String,
    /// Consumer group the offsets are committed under.
    pub group_id: String,
    pub client_id: String,
    /// Passed to librdkafka as is (e.g. "socket.timeout.ms").
    pub extra: BTreeMap<String, String>,
    /// How the producer compresses what it writes (answers, dead letters).
    /// Consumers read every codec librdkafka was built with.
    pub compression: Compression,
}

/// A producer's `compression.type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

/// librdkafka's `builtin.features` (e.g. "gzip,snappy,ssl,sasl,...,
/// zstd"): what this build can speak (TLS, SASL mechanisms, codecs).
pub fn builtin_features() -> String {
    ClientConfig::new()
        .create_native_config()
        .and_then(|c| c.get("builtin.features"))
        .unwrap_or_default()
}

impl KafkaSettings {
    fn client_config(&self) -> ClientConfig {
        self.client_config_with(&[])
    }

    /// Our `defaults` for one kind of client, then the user's `extra`
    /// properties, which win.
    fn client_config_with(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        if !self.client_id.is_empty() {
            c.set("client.id", &self.client_id);
        }
        for &(k, v) in defaults {
            c.set(k, v);
        }
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KafkaClientError {
    // The cause is in the message and not a `#[source]`: `error: {:#}`
    // would print it twice.
    #[error("kafka: {what}: {cause}")]
    Kafka { what: String, cause: KafkaError },
    /// No broker answered in time: the usual first-run mistake (a wrong
    /// address, a broker not started), said as such.
    #[error(
        "no Kafka broker answered at {brokers} within {timeout_s} s ({what}: {cause}); is the \
         broker up, and are kafka.brokers (or GRFLOW_KAFKA_BROKERS) and kafka.librdkafka right?{security}"
    )]
    Unreachable {
        brokers: String,
        what: String,
        timeout_s: u64,
        /// librdkafka's words for it.
        cause: String,
        /// With TLS or SASL configured, what else ends this way.
        security: String,
    },
    #[error("topic `{topic}` does not exist on {brokers}")]
    NoSuchTopic { topic: String, brokers: String },
    #[error(
        "creating topic `{topic}` ({partitions} partitions, replication factor {replication}): {reason}"
    )]
    CreateTopic {
        topic: String,
        partitions: i32,
        replication: i32,
        reason: String,
    },
    #[error("kafka admin runtime: {0}")]
    Runtime(String),
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> KafkaClientError {
    let what = what.into();
    move |cause| KafkaClientError::Kafka { what, cause }
}

/// Whether `e` is a call that timed out waiting for any broker.
fn timed_out(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::AdminOp(code) | KafkaError::MetadataFetch(code) => code,
        _ => return false,
    };
    matches!(
        code,
        RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::Resolve
    )
}

/// Like [`kafka`], but a timeout waiting for the brokers becomes
/// [`KafkaClientError::Unreachable`] naming them.
fn kafka_call(
    settings: &KafkaSettings,
    what: impl Into<String>,
    timeout: Duration,
) -> impl FnOnce(KafkaError) -> KafkaClientError {
    let (what, brokers) = (what.into(), settings.brokers.clone());
    let protocol = settings.extra.get("security.protocol").cloned();
    move |cause| {
        if timed_out(&cause) {
            KafkaClientError::Unreachable {
                brokers,
                what,
                timeout_s: timeout.as_secs().max(1),
                cause: cause.to_string(),
                security: security_hint(protocol.as_deref()),
            }
        } else {
            KafkaClientError::Kafka { what, cause }
        }
    }
}

/// What else a call that reached no broker may mean under the configured
/// `security.protocol`: librdkafka reports a refused SASL login or a failed
/// TLS handshake only as a broker that does not answer.
fn security_hint(protocol: Option<&str>) -> String {
    let protocol = protocol.unwrap_or_default().to_ascii_lowercase();
    let sasl = protocol.contains("sasl");
    let tls = protocol.contains("ssl");
    match (sasl, tls) {
        (false, false) => String::new(),
        (true, _) => format!(
            " With security.protocol = {protocol:?}, a refused login ends this way too: check \
             sasl.mechanism, sasl.username and GRFLOW_KAFKA_SASL_PASSWORD{}",
            if tls {
                ", and that ssl.ca.location holds the brokers' CA"
            } else {
                ""
            }
        ),
        (false, true) => format!(
            " With security.protocol = {protocol:?}, a failed TLS handshake ends this way too: \
             check that ssl.ca.location holds the brokers' CA and that their certificates name \
             the addresses in kafka.brokers"
        ),
    }
}

/// Where a partition starts when its group never committed an offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartPosition {
    #[default]
    Earliest,
    Latest,
}

/// Where a partition with a committed offset is fetched from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Refetch {
    /// At the committed offset (any broker that implements Kafka's fetch).
    #[default]
    FromCommitted,
    /// From the start of the partition, skipping records below the committed
    /// offset as duplicates: for brokers that cannot fetch from an offset
    /// inside a record batch (tansu 0.6 returns nothing there).
    FromStart,
}

/// One consumed record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawRecord {
    pub partition: i32,
    pub offset: i64,
    /// The record's broker/producer timestamp, ms since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// `None` for a record without a value (a tombstone).
    pub payload: Option<Vec<u8>>,
}

/// Where a partition's reading starts: records below `offset` count as
/// consumed. Book it with `OffsetBook::resume` when `from_commit`, else with
/// `OffsetBook::start_uncommitted` (a `latest` start is committed then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resumed {
    pub partition: i32,
    pub offset: i64,
    /// Whether `offset` came from a committed offset (a restart).
    pub from_commit: bool,
    /// The group's committed offset when it lay past the end of the log
    /// (the topic was deleted and created again, the log was cut short, or
    /// the group id was used on another topic): it was ignored and the
    /// partition read from the start position, since every record below
    /// it would otherwise be skipped as already consumed.
    pub past_end: Option<i64>,
}

/// Number of partitions of `topic`.
/// Asks the cluster for a topic's metadata, to tell whether a broker
/// answers (readiness): one client kept for every check.
pub struct BrokerProbe {
    consumer: BaseConsumer,
    topic: String,
}

impl std::fmt::Debug for BrokerProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerProbe")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl BrokerProbe {
    pub fn new(settings: &KafkaSettings, topic: &str) -> Result<Self, KafkaClientError> {
        Ok(Self {
            consumer: settings
                .client_config()
                .create()
                .map_err(kafka("creating a metadata client"))?,
            topic: topic.into(),
        })
    }

    /// The topic's partition count when a broker answered within
    /// `timeout` (0 where the answer does not list the topic).
    pub fn check(&self, timeout: Duration) -> Result<i32, KafkaClientError> {
        let metadata = self
            .consumer
            .fetch_metadata(Some(&self.topic), timeout)
            .map_err(kafka(format!("metadata of `{}`", self.topic)))?;
        Ok(partitions_listed(&metadata, &self.topic))
    }
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
    let consumer: BaseConsumer = settings
        .client_config()
        .create()
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
        AdminClient<DefaultClientContext>,
        AdminOptions,
        tokio::runtime::Runtime,
    ),
    KafkaClientError,
> {
    let admin: AdminClient<DefaultClientContext> = settings
        .client_config()
        .create()
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

/// The request consumer's context: keeps what the broker answered to
/// commits, which librdkafka reports only through this callback (the
/// default context drops it, so a refused commit went unnoticed).
#[derive(Debug, Default)]
struct CommitWatch {
    refused: std::sync::Mutex<Vec<String>>,
}

impl ClientContext for CommitWatch {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        CLIENT_LOGS.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        CLIENT_LOGS.error(&error, reason);
    }
}

impl ConsumerContext for CommitWatch {
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        _offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            self.refused
                .lock()
                .expect("commit watch lock")
                .push(e.to_string());
        }
    }
}

/// A queue of its own for one commit's answer: rdkafka 0.39 wraps only the
/// synchronous commit (no deadline) and the asynchronous one, whose answer
/// goes nowhere unless a commit callback is configured.
struct CommitQueue(*mut rdkafka::bindings::rd_kafka_queue_t);

impl CommitQueue {
    /// How long one wait on the queue lasts.
    const POLL: Duration = Duration::from_millis(100);

    /// Sends the commit of `tpl` and waits at most `timeout` for the
    /// broker's answer: whether it came, or the error it was.
    fn commit<C: ConsumerContext>(
        consumer: &BaseConsumer<C>,
        tpl: &TopicPartitionList,
        timeout: Duration,
    ) -> Result<bool, RDKafkaErrorCode> {
        use rdkafka::bindings as rd;
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is valid for the life of `consumer`; the queue is
        // destroyed by `Drop` (librdkafka keeps it alive while the commit
        // still holds it).
        let queue = Self(unsafe { rd::rd_kafka_queue_new(rk) });
        // SAFETY: `tpl` outlives the call (librdkafka copies it); no
        // callback, so the answer comes as an event on `queue`.
        let sent = unsafe {
            rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue.0, None, std::ptr::null_mut())
        };
        if sent != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(sent.into());
        }
        // None: a timeout too long to represent never ends.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(Self::POLL, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Ok(false);
            }
            if let Some(answer) = queue.answer(left.min(Self::POLL)) {
                return answer.map(|()| true);
            }
        }
    }

    /// The commit's answer, if it came within `wait`.
    fn answer(&self, wait: Duration) -> Option<Result<(), RDKafkaErrorCode>> {
        use rdkafka::bindings as rd;
        // SAFETY: the queue is live; an event returned is destroyed below
        // and not used after.
        unsafe {
            let event = rd::rd_kafka_queue_poll(self.0, wait.as_millis().max(1) as i32);
            if event.is_null() {
                return None;
            }
            let kind = rd::rd_kafka_event_type(event);
            let error = rd::rd_kafka_event_error(event);
            rd::rd_kafka_event_destroy(event);
            if kind != rd::RD_KAFKA_EVENT_OFFSET_COMMIT {
                return None;
            }
            Some(
                if error == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    Ok(())
                } else {
                    Err(error.into())
                },
            )
        }
    }
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        // SAFETY: created by `rd_kafka_queue_new`, destroyed once.
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.0) }
    }
}

/// Reads a fixed set of partitions of one topic and commits explicitly.
#[allow(missing_debug_implementations)] // wraps an rdkafka client
pub struct RequestConsumer {
    /// Dropped by hand: see [`RequestConsumer::close`].
    consumer: std::mem::ManuallyDrop<BaseConsumer<CommitWatch>>,
    /// `close` gave up: dropping the client would wait without a deadline.
    abandoned: bool,
    topic: String,
    partitions: Vec<i32>,
    paused: bool,
    refetch: Refetch,
    /// Which records were in the log at start (see [`RecoveryBounds`]);
    /// settled by `poll`, hence the cell.
    recovery: std::cell::RefCell<RecoveryBounds>,
}

impl RequestConsumer {
    /// Assigns `partitions` of `topic`, each at its committed offset or,
    /// when the group never committed one, at `start`.
    pub fn open(
        settings: &KafkaSettings,
        topic: &str,
        partitions: &[i32],
        start: StartPosition,
        refetch: Refetch,
        timeout: Duration,
    ) -> Result<(Self, Vec<Resumed>), KafkaClientError> {
        let consumer: BaseConsumer<CommitWatch> = settings
            .client_config_with(&[
                ("group.id", &settings.group_id),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "false"),
                // Bounds what librdkafka prefetches while we are paused.
                ("queued.max.messages.kbytes", "16384"),
                ("queued.min.messages", "10000"),
                // A committed offset out of range (records deleted past it)
                // restarts at the start position instead of jumping silently.
                (
                    "auto.offset.reset",
                    match start {
                        StartPosition::Earliest => "earliest",
                        StartPosition::Latest => "latest",
                    },
                ),
                // A serving job wants records now, not batched for 500 ms.
                ("fetch.wait.max.ms", "5"),
            ])
            .create_with_context(CommitWatch::default())
            .map_err(kafka("creating the request consumer"))?;
        let Positions {
            assignment,
            resumed,
            listed,
        } = resume_positions(&consumer, topic, partitions, start, refetch, timeout)?;
        consumer
            .assign(&assignment)
            .map_err(kafka(format!("assigning `{topic}` {partitions:?}")))?;
        Ok((
            Self {
                consumer: std::mem::ManuallyDrop::new(consumer),
                abandoned: false,
                topic: topic.to_string(),
                partitions: partitions.to_vec(),
                paused: false,
                refetch,
                recovery: std::cell::RefCell::new(RecoveryBounds::new(listed)),
            },
            resumed,
        ))
    }

    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    /// Starts reading `added` partitions too (created while the job runs),
    /// each at its committed offset or else from its beginning: every
    /// record in a partition created after the job started is new, whatever
    /// `kafka.start` says. Partitions already read are left alone.
    pub fn add_partitions(
        &mut self,
        added: &[i32],
        timeout: Duration,
    ) -> Result<Vec<Resumed>, KafkaClientError> {
        let added: Vec<i32> = added
            .iter()
            .copied()
            .filter(|p| !self.partitions.contains(p))
            .collect();
        if added.is_empty() {
            return Ok(Vec::new());
        }
        let Positions {
            assignment,
            resumed,
            listed,
        } = resume_positions(
            &*self.consumer,
            &self.topic,
            &added,
            StartPosition::Earliest,
            self.refetch,
            timeout,
        )?;
        self.consumer
            .incremental_assign(&assignment)
            .map_err(kafka(format!("adding `{}` {added:?}", self.topic)))?;
        self.recovery.borrow_mut().extend(listed);
        self.partitions.extend(added);
        Ok(resumed)
    }

    /// The next record, waiting at most `timeout`; `None` when none came
    /// (or reads are paused).
    pub fn poll(&self, timeout: Duration) -> Option<Result<RawRecord, KafkaClientError>> {
        if self.partitions.is_empty() || self.paused {
            std::thread::sleep(timeout);
            return None;
        }
        self.consumer.poll(timeout).map(|r| {
            r.map(|m| {
                self.settle(m.partition());
                RawRecord {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis(),
                    payload: m.payload().map(<[u8]>::to_vec),
                }
            })
            .map_err(kafka(format!("reading `{}`", self.topic)))
        })
    }

    /// Fixes `partition`'s end of log at start with the high watermark of
    /// the fetch that brought its first record.
    fn settle(&self, partition: i32) {
        let mut recovery = self.recovery.borrow_mut();
        if !recovery.settled(partition) {
            let high = cached_high_watermark(&*self.consumer, &self.topic, partition);
            recovery.settle(partition, high);
        }
    }

    /// Whether the record at `offset` of `partition` was in the log when
    /// this consumer opened: a previous incarnation may have been answering
    /// it when it stopped (see [`RecoveryBounds`]).
    pub fn is_recovered(&self, partition: i32, offset: i64) -> bool {
        self.recovery.borrow().is_recovered(partition, offset)
    }

    /// The ends of the logs at start, as far as they are known now.
    pub fn recovery_bounds(&self) -> RecoveryBounds {
        self.recovery.borrow().clone()
    }

    /// Stops (or restarts) handing out records. While paused, librdkafka's
    /// fetcher fills its local queue up to `queued.max.messages.kbytes`
    /// (set by [`RequestConsumer::open`]) and then stops fetching, so memory
    /// stays bounded. (librdkafka's own pause/resume is not used: after a
    /// resume, tansu 0.6 never served the partition again.)
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Commits `(partition, next offset to read)` pairs; `sync` waits for
    /// the broker's answer.
    pub fn commit(&self, offsets: &[(i32, i64)], sync: bool) -> Result<(), KafkaClientError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in offsets {
            tpl.add_partition_offset(&self.topic, p, Offset::Offset(o))
                .map_err(kafka("building the commit"))?;
        }
        let mode = if sync {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        self.consumer
            .commit(&tpl, mode)
            .map_err(kafka(format!("committing {offsets:?}")))
    }

    /// Commits `offsets` and waits at most `timeout` for the broker's
    /// answer: `Ok(false)` when none came in time (a sync commit has no
    /// deadline of its own, and a coordinator that is away would hold up a
    /// shutdown), an error when the broker refused it.
    pub fn commit_and_wait(
        &self,
        offsets: &[(i32, i64)],
        timeout: Duration,
    ) -> Result<bool, KafkaClientError> {
        if offsets.is_empty() {
            return Ok(true);
        }
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in offsets {
            tpl.add_partition_offset(&self.topic, p, Offset::Offset(o))
                .map_err(kafka("building the commit"))?;
        }
        let what = || format!("committing {offsets:?}");
        match CommitQueue::commit(&*self.consumer, &tpl, timeout) {
            Ok(answered) => Ok(answered),
            Err(code) => Err(kafka(what())(KafkaError::ConsumerCommit(code))),
        }
    }

    /// Leaves the group's session (assign mode: no rebalance) within
    /// `timeout`; `false` when it did not end in time. librdkafka's close
    /// waits for outstanding commits without a deadline (a coordinator that
    /// is away holds it forever), so a consumer that did not close in time
    /// is leaked instead of dropped: a shutdown must end.
    pub fn close(&mut self, timeout: Duration) -> bool {
        if self.consumer.close_queue().is_err() {
            // Closed already, or never in a group: nothing to wait for.
            return true;
        }
        let deadline = Instant::now().checked_add(timeout);
        while !self.consumer.closed() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.abandoned = true;
                return false;
            }
            // Serves the close (fetched records are dropped: past the last commit).
            drop(self.consumer.poll(Duration::from_millis(10)));
        }
        true
    }

    /// Why the broker refused the commits it answered since the last call
    /// (answers arrive while the consumer polls).
    pub fn take_refused_commits(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .consumer
                .context()
                .refused
                .lock()
                .expect("commit watch lock"),
        )
    }

    /// High watermarks as of the last fetch response (no broker round trip).
    pub fn cached_high_watermarks(&self) -> Vec<(i32, Option<i64>)> {
        self.partitions
            .iter()
            .map(|&p| (p, cached_high_watermark(&*self.consumer, &self.topic, p)))
            .collect()
    }
}

impl Drop for RequestConsumer {
    fn drop(&mut self) {
        if !self.abandoned {
            // SAFETY: dropped here only, and never used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.consumer) }
        }
    }
}

/// Where a set of partitions resumes.
struct Positions {
    assignment: TopicPartitionList,
    resumed: Vec<Resumed>,
    /// (partition, end of its log now).
    listed: Vec<(i32, i64)>,
}

/// Where each of `partitions` of `topic` resumes: its committed offset or,
/// when the group never committed one (or committed past the log's end),
/// `start`.
fn resume_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &[i32],
    start: StartPosition,
    refetch: Refetch,
    timeout: Duration,
) -> Result<Positions, KafkaClientError> {
    let mut wanted = TopicPartitionList::new();
    for &p in partitions {
        wanted.add_partition(topic, p);
    }
    let committed = if partitions.is_empty() {
        TopicPartitionList::new()
    } else {
        consumer
            .committed_offsets(wanted, timeout)
            .map_err(kafka(format!("committed offsets of `{topic}`")))?
    };
    // Where each log ends now: records below may have been in flight
    // at a crash of a previous incarnation.
    let mut listed = Vec::with_capacity(partitions.len());
    for &p in partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(kafka(format!("watermarks of `{topic}`[{p}]")))?;
        listed.push((p, high));
    }
    let mut resumed = Vec::with_capacity(partitions.len());
    let mut assignment = TopicPartitionList::new();
    for (&p, &(_, high)) in partitions.iter().zip(&listed) {
        let committed_at = committed
            .find_partition(topic, p)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) if o >= 0 => Some(o),
                _ => None,
            });
        // Only where the broker's log end can be trusted: a broker that
        // needs `Refetch::FromStart` (tansu 0.6) also answers ListOffsets
        // with the last batch's base offset, below a committed offset
        // inside that batch.
        let past_end = committed_at.filter(|&o| o > high && refetch == Refetch::FromCommitted);
        if let Some(o) = past_end {
            tracing::warn!(
                topic,
                partition = p,
                committed = o,
                log_end = high,
                "the group's committed offset is past the end of the log (topic created \
                 again, log cut short, or the group id reused): reading from the start \
                 position instead"
            );
        }
        let from_commit = committed_at.filter(|_| past_end.is_none());
        // `offset`: below it, records count as already consumed.
        let (offset, fetch_from) = match (from_commit, refetch, start) {
            (Some(o), Refetch::FromCommitted, _) => (o, Offset::Offset(o)),
            (Some(o), Refetch::FromStart, _) => (o, Offset::Beginning),
            (None, _, StartPosition::Earliest) => (0, Offset::Beginning),
            // The end listed above, not `End` (resolved later, past records
            // produced meanwhile); the caller commits it even if nothing is
            // read, or the next start would jump to the end again. A broker
            // that needs `FromStart` lists an end that may lie inside the
            // last batch: fetch from its true end, skip below the listed one.
            (None, Refetch::FromCommitted, StartPosition::Latest) => (high, Offset::Offset(high)),
            (None, Refetch::FromStart, StartPosition::Latest) => (high, Offset::End),
        };
        assignment
            .add_partition_offset(topic, p, fetch_from)
            .map_err(kafka("building the assignment"))?;
        resumed.push(Resumed {
            partition: p,
            offset,
            from_commit: from_commit.is_some(),
            past_end,
        });
    }
    Ok(Positions {
        assignment,
        resumed,
        listed,
    })
}

/// A partition's high watermark as of the consumer's last fetch response.
/// rdkafka 0.39 wraps only the broker round trip (ListOffsets), which tansu
/// 0.6 answers with a batch's base offset instead of the end of the log; the
/// value cached from fetch responses needs the C call.
fn cached_high_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid for the life of `consumer`, `topic`
    // is a NUL-terminated string that outlives the call, and the two
    // out-pointers point at live i64s.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}

/// What the broker said about one output record.
#[derive(Debug)]
pub enum Delivery {
    /// Durable on the broker.
    Delivered { source: RecordId },
    /// Given up on by librdkafka (a permanent error): the caller decides
    /// whether to send it again.
    Failed {
        source: RecordId,
        topic: String,
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        error: String,
    },
}

/// Called on the producer's polling thread for every delivery report.
pub type DeliveryCallback = Arc<dyn Fn(Delivery) + Send + Sync>;

struct DeliveryContext {
    on_delivery: DeliveryCallback,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        CLIENT_LOGS.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        CLIENT_LOGS.error(&error, reason);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<RecordId>;

    fn delivery(&self, result: &DeliveryResult<'_>, source: Self::DeliveryOpaque) {
        let report = match result {
            Ok(_) => Delivery::Delivered { source: *source },
            Err((error, message)) => Delivery::Failed {
                source: *source,
                topic: message.topic().to_string(),
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                error: error.to_string(),
            },
        };
        (self.on_delivery)(report);
    }
}

/// Why an output could not be handed to the producer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The producer's local queue is full: try again after it drains.
    #[error("producer queue full")]
    QueueFull,
    #[error(transparent)]
    Client(#[from] KafkaClientError),
}

/// One producer for a job's outputs (responses, error records, dead letters).
#[allow(missing_debug_implementations)] // wraps an rdkafka client
pub struct OutputProducer {
    producer: ThreadedProducer<DeliveryContext>,
}

impl OutputProducer {
    /// A producer that waits for all in-sync replicas and retries transient
    /// errors without a deadline (a broker outage stalls, it does not drop).
    pub fn new(
        settings: &KafkaSettings,
        on_delivery: DeliveryCallback,
    ) -> Result<Self, KafkaClientError> {
        let producer = settings
            .client_config_with(&[
                ("acks", "all"),
                ("message.timeout.ms", "0"),
                ("linger.ms", "2"),
                // Retries after a lost acknowledgement must not write twice.
                ("enable.idempotence", "true"),
                ("compression.type", settings.compression.as_str()),
            ])
            .create_with_context(DeliveryContext { on_delivery })
            .map_err(kafka("creating the producer"))?;
        Ok(Self { producer })
    }

    /// Queues one record; its [`Delivery`] names `source`.
    pub fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        source: RecordId,
    ) -> Result<(), SendError> {
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(source)).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.queue(record)
    }

    /// Queues one record for an explicit partition (load generators, tests).
    pub fn send_to(
        &self,
        topic: &str,
        partition: i32,
        payload: &[u8],
        source: RecordId,
    ) -> Result<(), SendError> {
        let record = BaseRecord::<'_, [u8], [u8], _>::with_opaque_to(topic, Box::new(source))
            .payload(payload)
            .partition(partition);
        self.queue(record)
    }

    fn queue(&self, record: BaseRecord<'_, [u8], [u8], Box<RecordId>>) -> Result<(), SendError> {
        let topic = record.topic;
        self.producer.send(record).map_err(|(e, _)| match e {
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => SendError::QueueFull,
            other => SendError::Client(kafka(format!("producing to `{topic}`"))(other)),
        })
    }

    /// Waits until every queued record has a delivery report.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaClientError> {
        self.producer.flush(timeout).map_err(kafka("flush"))
    }

    /// Records queued or in flight to the broker.
    pub fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }
}

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
    let consumer: BaseConsumer = settings
        .client_config_with(&[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
        ])
        .create()
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::producer::{BaseProducer, Producer};

    /// A broker that never answers is named as such; a broker's refusal
    /// keeps its own message; the cause is printed once either way.
    #[test]
    fn timeouts_waiting_for_brokers_say_which_brokers() {
        let settings = KafkaSettings {
            brokers: "10.0.0.9:9092".into(),
            group_id: "g".into(),
            client_id: "c".into(),
            extra: BTreeMap::new(),
            compression: Compression::default(),
        };
        let timeout = Duration::from_secs(10);
        let e = kafka_call(&settings, "creating topics", timeout)(KafkaError::AdminOp(
            RDKafkaErrorCode::OperationTimedOut,
        ));
        // `error: {:#}` prints the chain: this error ends it.
        assert!(std::error::Error::source(&e).is_none());
        let said = e.to_string();
        assert!(
            said.starts_with("no Kafka broker answered at 10.0.0.9:9092 within 10 s"),
            "{said}"
        );
        assert_eq!(said.matches("OperationTimedOut").count(), 1, "{said}");
        let e = kafka_call(&settings, "creating topics", timeout)(KafkaError::AdminOp(
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ));
        assert!(matches!(e, KafkaClientError::Kafka { .. }), "{e}");
    }

    /// With SASL or TLS configured, "no broker answered" also names what
    /// librdkafka reports the same way: a refused login, a failed handshake.
    #[test]
    fn an_unreachable_broker_under_sasl_or_tls_names_the_security_settings() {
        let timeout = Duration::from_secs(10);
        let said = |protocol: Option<&str>| {
            let mut settings = KafkaSettings {
                brokers: "b:9093".into(),
                ..KafkaSettings::default()
            };
            if let Some(p) = protocol {
                settings.extra.insert("security.protocol".into(), p.into());
            }
            kafka_call(&settings, "metadata", timeout)(KafkaError::MetadataFetch(
                RDKafkaErrorCode::BrokerTransportFailure,
            ))
            .to_string()
        };
        assert!(!said(None).contains("security.protocol"));
        let sasl = said(Some("SASL_PLAINTEXT"));
        assert!(sasl.contains("refused login") && sasl.contains("GRFLOW_KAFKA_SASL_PASSWORD"));
        assert!(!sasl.contains("ssl.ca.location"), "{sasl}");
        assert!(said(Some("sasl_ssl")).contains("ssl.ca.location"));
        let tls = said(Some("ssl"));
        assert!(
            tls.contains("TLS handshake") && !tls.contains("sasl"),
            "{tls}"
        );
    }

    /// The build speaks TLS, SASL PLAIN/SCRAM and every codec (rdkafka's
    /// `ssl` and `zstd` features; lz4, snappy and gzip are built in).
    #[test]
    fn librdkafka_is_built_with_tls_sasl_and_every_codec() {
        let features = builtin_features();
        for f in [
            "ssl",
            "sasl_plain",
            "sasl_scram",
            "gzip",
            "snappy",
            "lz4",
            "zstd",
        ] {
            assert!(
                features.split(',').any(|x| x.trim() == f),
                "{f} missing from {features:?}"
            );
        }
    }

    /// A client configured for SASL_SSL with SCRAM is accepted (a build
    /// without OpenSSL refuses these properties at creation).
    #[test]
    fn a_sasl_ssl_scram_client_can_be_created() {
        let settings = KafkaSettings {
            brokers: "127.0.0.1:1".into(),
            extra: [
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "grflow"),
                ("sasl.password", "secret"),
                ("ssl.endpoint.identification.algorithm", "https"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            compression: Compression::Zstd,
            ..KafkaSettings::default()
        };
        let producer: BaseProducer = settings
            .client_config_with(&[("compression.type", settings.compression.as_str())])
            .create()
            .expect("TLS + SCRAM + zstd settings accepted");
        drop(
            producer
                .client()
                .fetch_metadata(None, Duration::from_millis(1)),
        );
    }

    #[test]
    fn compression_names_parse_as_librdkafka_spells_them() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let json = format!("\"{}\"", c.as_str());
            assert_eq!(serde_json::from_str::<Compression>(&json).unwrap(), c);
        }
        assert!(serde_json::from_str::<Compression>("\"brotli\"").is_err());
    }
}
