//! Kafka wire formats and the bookkeeping a Kafka source and sink need:
//! JSON request, response and dead-letter records ([`wire`]), explicit
//! partition ownership ([`assign`]) and per-partition offsets that are
//! committed only after every output up to them was acknowledged, with
//! (partition, offset) deduplication ([`offsets`]).
//!
//! These are pure: no client, no I/O, no timely types, so each is tested
//! alone. The rdkafka consumer/producer that drives them (`grflow serve`)
//! is not written yet.

pub mod assign;
pub mod offsets;
pub mod wire;

pub use assign::{fnv1a64, owned_partitions, partition_owner};
pub use offsets::{Admission, OffsetBook, OffsetError, PartitionOffsets};
pub use wire::{
    DeadLetter, History, MAX_MESSAGE_BYTES, WireError, WireRequest, WireResponse, decode_request,
    round_score,
};
