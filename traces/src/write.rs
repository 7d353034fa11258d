//! Writes a [`Trace`] as a trace directory: requests.parquet, users.parquet
//! and items.parquet, zstd-compressed, requests in fixed-size row groups so
//! that row groups can be sharded over workers.
//!
//! The bytes depend only on the trace and the options (and on the pinned
//! parquet version, whose name is in the footer): no clocks, no hash order.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::columnar::{
    ITEMS_FILE, META_KEY, REQUESTS_FILE, SCHEMA_VERSION, USERS_FILE, VERSION_KEY, items_to_batch,
    meta_to_json, requests_to_batch, users_to_batch,
};
use crate::schema::Trace;

/// Default rows per row group of requests.parquet.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 1024;

/// How a trace is laid out on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Rows per row group of requests.parquet (the unit of sharding).
    pub row_group_rows: usize,
    /// zstd level.
    pub zstd_level: i32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
            zstd_level: 3,
        }
    }
}

/// Why a trace could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("trace has no metadata (TraceMeta)")]
    NoMeta,
    #[error("row_group_rows must be >= 1")]
    RowGroupRows,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
}

/// Writes `trace` into directory `dir` (created if needed), replacing the
/// three trace files.
pub fn write_trace(dir: &Path, trace: &Trace, opts: &WriteOptions) -> Result<(), WriteError> {
    let meta = trace.meta.as_ref().ok_or(WriteError::NoMeta)?;
    if opts.row_group_rows == 0 {
        return Err(WriteError::RowGroupRows);
    }
    std::fs::create_dir_all(dir).map_err(|source| WriteError::Io {
        path: dir.to_path_buf(),
        source,
    })?;

    // Each file is written beside its final name and the three are renamed
    // in only once all are complete: a run stopped while writing leaves the
    // trace that was there (a new requests.parquet beside old users and
    // items would still load, as another trace).
    let tmp = |name: &str| dir.join(format!("{name}.tmp"));
    // Requests go in slices of one row group each, so each write closes one group.
    let batches = trace
        .requests
        .chunks(opts.row_group_rows)
        .map(requests_to_batch);
    write_file(&tmp(REQUESTS_FILE), batches, opts, Vec::new())?;
    let users = std::iter::once(users_to_batch(&trace.users));
    write_file(&tmp(USERS_FILE), users, opts, Vec::new())?;
    let items = std::iter::once(items_to_batch(&trace.items));
    write_file(
        &tmp(ITEMS_FILE),
        items,
        opts,
        vec![KeyValue::new(META_KEY.to_string(), meta_to_json(meta))],
    )?;
    for name in [REQUESTS_FILE, USERS_FILE, ITEMS_FILE] {
        let path = dir.join(name);
        std::fs::rename(tmp(name), &path).map_err(|source| WriteError::Io { path, source })?;
    }
    Ok(())
}

fn write_file(
    path: &Path,
    batches: impl Iterator<Item = RecordBatch>,
    opts: &WriteOptions,
    mut kv: Vec<KeyValue>,
) -> Result<(), WriteError> {
    let pq = |source| WriteError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let level = ZstdLevel::try_new(opts.zstd_level).map_err(pq)?;
    kv.insert(
        0,
        KeyValue::new(VERSION_KEY.to_string(), SCHEMA_VERSION.to_string()),
    );
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(opts.row_group_rows))
        .set_key_value_metadata(Some(kv))
        .build();
    let file = File::create(path).map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut batches = batches.peekable();
    let schema = match batches.peek() {
        Some(b) => b.schema(),
        None => crate::columnar::requests_schema(),
    };
    let mut writer = ArrowWriter::try_new(file, schema, Some(props)).map_err(pq)?;
    for batch in batches {
        writer.write(&batch).map_err(pq)?;
        writer.flush().map_err(pq)?;
    }
    writer.close().map_err(pq)?;
    Ok(())
}
