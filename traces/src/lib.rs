//! Trace schemas (Arrow/Parquet), workload generators and importers.
//!
//! A trace is a directory of three Parquet tables (requests, users, items);
//! traces/README.md documents every column. [`generate()`] builds a synthetic
//! trace (HLEM §V regimes), [`import()`] converts public datasets, and
//! [`write_trace`] writes either to disk. Reading lives in the Parquet
//! connector (grflow-connectors), which uses [`columnar`] to decode.
pub mod columnar;
pub mod detmath;
pub mod generate;
pub mod import;
pub mod keystream;
pub mod sampling;
pub mod schema;
pub mod write;

pub use generate::{GenConfig, GenError, Regime, generate};
pub use import::{ImportConfig, ImportError, ImportFormat, import};
pub use schema::{Item, Mode, Request, Trace, TraceMeta, UserHistory};
pub use write::{DEFAULT_ROW_GROUP_ROWS, WriteError, WriteOptions, write_trace};
