//! Sources and sinks: Parquet now, Kafka later. Free of timely types.
pub mod parquet;
pub mod records;

pub use records::{ErrorRow, ResponseRow, SourcePosition, WindowRow};
