//! Parquet connector: the request source of a trace directory (row groups
//! sharded over workers, batches with watermarks), the loader of its side
//! tables, an in-memory source with the same sharding, and the sinks of
//! responses.parquet, windows.parquet and errors.parquet.

mod files;
mod memory;
mod salvage;
mod side;
mod sink;
mod source;

pub use crate::error::SourceError;
pub use crate::sink::SinkError;
pub use crate::source::{Polled, RequestSource, SourceRecord, SourceState};
pub use memory::{MEMORY_FILE, MemoryRequestSource};
pub use side::{SideTables, load_side_tables};
pub use sink::{ErrorSink, ParquetSink, ResponseSink, SinkRow, WindowSink};
pub use source::{DEFAULT_BATCH_ROWS, DuplicateIds, ParquetRequestSource, TraceInfo};
