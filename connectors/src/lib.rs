//! Sources and sinks: Parquet now, Kafka's wire formats and offset
//! bookkeeping (the client comes later). Free of timely types.
pub mod kafka;
pub mod parquet;
pub mod records;

pub use records::{ErrorRow, ResponseRow, SourcePosition, WindowRow};
