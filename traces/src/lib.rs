//! Trace schemas (Arrow/Parquet), workload generators and importers.
pub mod keystream;
pub mod schema;

pub use schema::{Item, Mode, Request, Trace, TraceMeta, UserHistory};
