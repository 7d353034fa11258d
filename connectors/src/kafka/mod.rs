//! Kafka wire formats and the bookkeeping a Kafka source and sink need:
//! JSON request, response and dead-letter records ([`wire`]), explicit
//! partition ownership ([`assign`]) and per-partition offsets that are
//! committed only after every output up to them was acknowledged, with
//! (partition, offset) deduplication ([`offsets`]).
//!
//! Those three are pure (no I/O, no timely types) and tested alone;
//! [`client`] is the rdkafka consumer, producer and admin calls that
//! `grflow serve` drives them with.

pub mod assign;
pub mod client;
pub mod offsets;
pub mod wire;

pub use assign::{fnv1a64, owned_partitions, partition_owner};
pub use client::{
    BrokerProbe, Compression, Delivery, DeliveryCallback, KafkaClientError, KafkaSettings,
    OutputProducer, RawRecord, Refetch, RequestConsumer, Resumed, SendError, StartPosition,
    builtin_features, ensure_topics, partition_count, scan_answered,
};
pub use offsets::{Admission, OffsetBook, OffsetError, PartitionOffsets, RecoveryBounds};
pub use wire::{
    AnswerError, DeadLetter, DecodeLimits, History, MAX_CANDIDATES, MAX_MESSAGE_BYTES, RecordId,
    SCORE_TOLERANCE, WIRE_SCORE_TOLERANCE, WireError, WireRequest, WireResponse, decode_request,
    decode_request_within, round_score,
};
