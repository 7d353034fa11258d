//! `[kafka]`: where `grflow serve` reads requests and writes answers.

use serde::{Deserialize, Serialize};

/// `grflow serve`: the Kafka side of the job (configs/kafka.toml).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSection {
    /// bootstrap.servers; the GRFLOW_KAFKA_BROKERS environment variable overrides it.
    pub brokers: String,
    pub request_topic: String,
    pub response_topic: String,
    pub dead_letter_topic: String,
    /// Consumer group the request offsets are committed under.
    pub group_id: String,
    /// Where a partition without a committed offset starts: "earliest" | "latest".
    pub start: String,
    /// Trace directory whose users.parquet / items.parquet / meta.json serve
    /// hist_len requests and the item catalog; empty = the `[trace]` section's
    /// generated tables (the embedded default).
    pub catalog: String,
    /// After a restart, fetch each partition from its start and skip what was
    /// committed, instead of fetching at the committed offset: needed with
    /// brokers that cannot fetch from inside a record batch (tansu 0.6).
    pub refetch_from_start: bool,
    /// Create missing topics at start with this many partitions (0 = never create).
    pub create_partitions: i32,
    /// Copies of each partition of the topics created at start; -1 = the
    /// broker's `default.replication.factor`.
    pub replication_factor: i32,
    /// A request not answered this long after it was consumed gets a `shed` error record.
    pub deadline_ms: u64,
    /// A request whose `ts_ms` (the producer's stamp) is more than this
    /// behind the wall clock when a node would serve it gets a `stale`
    /// error record: it waited in the broker while the job was behind.
    /// 0 = off (the default: `ts_ms` may be an event time, not a wall
    /// clock). Set it above the clock skew between producers and the job.
    pub max_age_ms: u64,
    /// Per worker: consumed requests without a durable answer before reads pause.
    pub max_in_flight: usize,
    /// Per worker: tokens (history + candidates + 1) of those requests
    /// before reads pause: long histories fill a node with fewer requests.
    pub max_in_flight_tokens: u64,
    /// A partition with no record for this long stops holding back event time.
    pub idle_timeout_ms: u64,
    /// Event time may trail the newest request by at most this much before
    /// older requests count as late (processed, never dropped).
    pub max_skew_ms: u64,
    /// A request whose `ts_ms` is more than this ahead of both the wall
    /// clock and the job's event time is served at the current event time
    /// (counted in `clamped_ts`) and moves no watermark.
    pub max_future_ms: u64,
    /// Per process (its workers together): how many recent `req_id`s are
    /// remembered (at least; up to twice as many, ~30 bytes each) so that
    /// a request repeating one, such as a producer's retry, is counted in
    /// `repeated_req_ids` and logged. It is served all the same. 0 = not
    /// checked.
    pub repeat_window: usize,
    /// Retries of an output the client or broker refused for good, before
    /// it goes to the dead-letter topic as `undeliverable`.
    pub produce_retries: u32,
    /// Wait before the first of those retries; doubles with each (at most 10 s).
    pub produce_retry_backoff_ms: u64,
    /// Longest wait at shutdown for in-flight requests to be answered and
    /// delivered; past it, their offsets stay uncommitted.
    pub drain_timeout_ms: u64,
    /// How often consumed offsets whose answers are durable get committed.
    pub commit_interval_ms: u64,
    /// How often consumer lag and counters are logged.
    pub metrics_interval_ms: u64,
    /// Messages over this size go to the dead-letter topic.
    pub max_message_bytes: usize,
    /// On start, the last N messages of each response-topic partition are
    /// read back so requests answered before a crash are not answered again.
    pub restart_scan: i64,
    /// Extra librdkafka properties, e.g. { "socket.timeout.ms" = "10000" }:
    /// TLS (`security.protocol = "ssl"`, `ssl.ca.location`, ...) and SASL
    /// (`sasl.mechanism = "SCRAM-SHA-256"`, `sasl.username`, ...). The
    /// GRFLOW_KAFKA_SASL_PASSWORD environment variable sets `sasl.password`.
    pub librdkafka: std::collections::BTreeMap<String, String>,
    /// `/readyz` says not ready once no broker has answered a metadata
    /// request (asked every second) for this long; ready again when one
    /// does. 0 = never.
    pub unready_after_ms: u64,
    /// Codec of what `serve` writes: "none", "gzip", "snappy", "lz4", "zstd".
    /// Compressed request topics are read whatever this says.
    pub compression: grflow_connectors::kafka::Compression,
}

impl Default for KafkaSection {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            request_topic: "grflow.requests".into(),
            response_topic: "grflow.responses".into(),
            dead_letter_topic: "grflow.dead-letters".into(),
            group_id: "grflow".into(),
            start: "earliest".into(),
            catalog: String::new(),
            refetch_from_start: false,
            create_partitions: 4,
            replication_factor: -1,
            deadline_ms: 2_000,
            max_age_ms: 0,
            max_in_flight: 2_048,
            max_in_flight_tokens: 262_144,
            idle_timeout_ms: 50,
            max_skew_ms: 2_000,
            max_future_ms: 60_000,
            repeat_window: 100_000,
            produce_retries: 5,
            produce_retry_backoff_ms: 100,
            drain_timeout_ms: 30_000,
            commit_interval_ms: 500,
            metrics_interval_ms: 5_000,
            max_message_bytes: 1 << 20,
            restart_scan: 200_000,
            librdkafka: Default::default(),
            unready_after_ms: 10_000,
            compression: Default::default(),
        }
    }
}
