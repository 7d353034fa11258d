//! Kafka wire formats and the bookkeeping a Kafka source and sink need:
//! JSON request, response and dead-letter records ([`wire`]), explicit
//! partition ownership ([`assign`]) and per-partition offsets that are
//! committed only after every output up to them was acknowledged, with
//! (partition, offset) deduplication ([`offsets`]).
//!
//! Those three are pure (no I/O, no timely types) and tested alone;
//! [`client`] is the rdkafka consumer, producer and admin calls.
//!
//! On top of them, the source and sink `grflow serve` reads and writes
//! through: [`KafkaSource`] (a [`crate::RequestSource`]: event time per
//! partition in [`clock`], backpressure, dead letters, commits) and
//! [`KafkaSink`] (a [`crate::Sink`] of answers: retries, then dead
//! letters), sharing the offset books and counters of [`SharedState`] with
//! the producer's delivery thread. What they do to a record is a typed
//! [`KafkaEvent`]: counted, exported as a metric, logged. The history
//! limits a source decodes with follow the models served ([`limits`]);
//! consumer lag is reported only while it can be believed ([`lag`]).

pub mod assign;
pub mod client;
pub mod client_logs;
pub mod clock;
pub mod events;
pub mod lag;
pub mod limits;
pub mod offsets;
pub mod ratelimit;
pub mod shared;
pub mod sink;
pub mod source;
pub mod wire;

pub use assign::{fnv1a64, owned_partitions, partition_owner};
pub use client::{
    BrokerProbe, Compression, Delivery, DeliveryCallback, KafkaClientError, KafkaSettings,
    OutputProducer, RawRecord, Refetch, RequestConsumer, Resumed, SendError, StartPosition,
    builtin_features, delete_topics, ensure_topics, partition_count, refused_property,
    scan_answered, scan_answers,
};
pub use events::KafkaEvent;
pub use lag::{LAG_STALE_AFTER, LagChange, LagGauge, LagTable};
pub use limits::ServedLimits;
pub use offsets::{Admission, OffsetBook, OffsetError, PartitionOffsets, RecoveryBounds};
pub use shared::{CountsSnapshot, FailedOutput, KafkaCounters, SharedState};
pub use sink::{KafkaSink, Produce, Refused, SinkSettings};
pub use source::{IDLE_POLL, KafkaSource, QUIET_POLL, SourceSettings, idle_poll};
pub use wire::{
    AnswerError, AnsweredRequest, DeadLetter, DecodeLimits, History, MAX_CANDIDATES,
    MAX_MESSAGE_BYTES, RecordId, SCORE_TOLERANCE, WIRE_SCORE_TOLERANCE, WireError, WireRequest,
    WireResponse, decode_request, decode_request_within, encode_request, round_score,
};
