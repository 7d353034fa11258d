//! Sources and sinks, free of timely types: the [`RequestSource`] and
//! [`Sink`] traits at this root, and their Parquet ([`parquet`]) and Kafka
//! ([`kafka`]) implementations with the bookkeeping each needs.
pub mod error;
pub mod kafka;
pub mod parquet;
pub mod recent_ids;
pub mod records;
pub mod sink;
pub mod source;

pub use error::SourceError;
pub use records::{
    Answer, ErrorKind, ErrorRow, Origin, ResponseRow, SourcePosition, WindowRow, now_ns, wall_ms,
};
pub use sink::{Sink, SinkError};
pub use source::{Polled, RequestSource, SourceRecord, SourceState};
