//! Parquet sinks of the rows that leave the dataflow: responses.parquet,
//! windows.parquet and errors.parquet. Rows are appended in batches;
//! `finish` writes the footer and closes the file. errors.parquet comes in
//! position order through its own sink (`errors.rs`), which sorts in
//! bounded memory.

mod errors;
mod position;

use std::fs::File;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Float32Builder, Float64Array, ListBuilder, RecordBatch, StringArray,
    UInt32Array, UInt32Builder, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterPropertiesBuilder};

use crate::records::{ErrorRow, ResponseRow, WindowRow};
use crate::sink::{Sink, SinkError};
pub use errors::ErrorSink;

/// Rows per row group (the writer holds one row group in memory).
const ROW_GROUP_ROWS: usize = 64 * 1024;

/// A row type with a fixed Arrow schema.
pub trait SinkRow: Sized {
    /// Version of the file's layout as README documents it, stamped under
    /// `grflow.schema_version` as traces are (a version of this file's
    /// columns, not of the trace layout).
    const SCHEMA_VERSION: &'static str;
    fn schema() -> SchemaRef;
    fn to_batch(rows: &[Self]) -> RecordBatch;
}

/// An open Parquet file receiving rows of type `R`.
pub struct ParquetSink<R: SinkRow> {
    path: PathBuf,
    writer: ArrowWriter<File>,
    rows: u64,
    _rows: PhantomData<fn(&R)>,
}

impl<R: SinkRow> std::fmt::Debug for ParquetSink<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetSink")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .finish()
    }
}

/// responses.parquet.
pub type ResponseSink = ParquetSink<ResponseRow>;
/// windows.parquet.
pub type WindowSink = ParquetSink<WindowRow>;

/// What an output file of `R` is written with: ZSTD, row groups small
/// enough that the one being filled stays small, the layout's version.
fn output_properties<R: SinkRow>() -> WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            grflow_traces::columnar::VERSION_KEY.to_string(),
            R::SCHEMA_VERSION.to_string(),
        )]))
}

impl<R: SinkRow> ParquetSink<R> {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self, SinkError> {
        // Rows stream in for the whole run and the writer buffers a row
        // group in memory: keep row groups small so that buffer stays bounded.
        Self::create_with(path, output_properties::<R>().build())
    }

    /// As `create`, with these writer properties.
    fn create_with(path: &Path, props: WriterProperties) -> Result<Self, SinkError> {
        let file = File::create(path).map_err(|source| SinkError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        let writer = ArrowWriter::try_new(file, R::schema(), Some(props)).map_err(|source| {
            SinkError::Parquet {
                file: path.to_path_buf(),
                source,
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            writer,
            rows: 0,
            _rows: PhantomData,
        })
    }

    /// Appends rows (buffered into row groups by the writer).
    pub fn write(&mut self, rows: &[R]) -> Result<(), SinkError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.writer
            .write(&R::to_batch(rows))
            .map_err(|source| SinkError::Parquet {
                file: self.path.clone(),
                source,
            })?;
        self.rows += rows.len() as u64;
        Ok(())
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Writes the footer and closes the file; returns the rows written.
    pub fn finish(self) -> Result<u64, SinkError> {
        let path = self.path;
        self.writer
            .close()
            .map_err(|source| SinkError::Parquet { file: path, source })?;
        Ok(self.rows)
    }
}

impl<R: SinkRow> Sink<R> for ParquetSink<R> {
    fn write(&mut self, rows: Vec<R>) -> Result<(), SinkError> {
        ParquetSink::write(self, &rows)
    }

    /// Rows go to the writer as they come; the footer waits for `finish`.
    fn flush(&mut self) -> Result<usize, SinkError> {
        Ok(0)
    }
}

fn list_of(dt: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", dt, false)))
}

impl SinkRow for ResponseRow {
    const SCHEMA_VERSION: &'static str = "1";

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("req_id", DataType::UInt64, false),
            Field::new("node", DataType::UInt32, false),
            Field::new("prefix", DataType::Utf8, false),
            Field::new("items", list_of(DataType::UInt32), false),
            Field::new("scores", list_of(DataType::Float32), false),
            Field::new("latency_ms", DataType::Float64, false),
            Field::new("model_version", DataType::Utf8, false),
            Field::new("history_len", DataType::UInt32, false),
            Field::new("kv_reused_tokens", DataType::UInt32, false),
        ]))
    }

    fn to_batch(rows: &[Self]) -> RecordBatch {
        let mut items = ListBuilder::new(UInt32Builder::new()).with_field(Field::new(
            "item",
            DataType::UInt32,
            false,
        ));
        let mut scores = ListBuilder::new(Float32Builder::new()).with_field(Field::new(
            "item",
            DataType::Float32,
            false,
        ));
        for r in rows {
            items.values().append_slice(&r.items);
            items.append(true);
            scores.values().append_slice(&r.scores);
            scores.append(true);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.req_id))),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.node))),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| &r.prefix),
            )),
            Arc::new(items.finish()),
            Arc::new(scores.finish()),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| r.latency_ms),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| &r.model_version),
            )),
            Arc::new(UInt32Array::from_iter_values(
                rows.iter().map(|r| r.history_len),
            )),
            Arc::new(UInt32Array::from_iter_values(
                rows.iter().map(|r| r.kv_reused_tokens),
            )),
        ];
        RecordBatch::try_new(Self::schema(), columns).expect("columns match the schema")
    }
}

impl SinkRow for WindowRow {
    const SCHEMA_VERSION: &'static str = "1";

    fn schema() -> SchemaRef {
        let f64_col = |name| Field::new(name, DataType::Float64, false);
        Arc::new(Schema::new(vec![
            Field::new("node", DataType::UInt32, false),
            Field::new("window_start_ms", DataType::UInt64, false),
            Field::new("requests", DataType::UInt64, false),
            f64_col("hot_user_share"),
            f64_col("emb_hit_rate"),
            f64_col("kv_hit_rate"),
            f64_col("mean_seq_len"),
            f64_col("slo_violation_share"),
            // Null for a window in which the node served nothing.
            Field::new("p99_ms", DataType::Float64, true),
            f64_col("alpha"),
            Field::new("failed", DataType::UInt64, false),
            f64_col("truncated_share"),
            Field::new("alpha_end", DataType::Float64, true),
            Field::new("pinned_end", DataType::Boolean, false),
        ]))
    }

    fn to_batch(rows: &[Self]) -> RecordBatch {
        let f = |get: fn(&WindowRow) -> f64| -> ArrayRef {
            Arc::new(Float64Array::from_iter_values(rows.iter().map(get)))
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.node))),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| r.window_start_ms),
            )),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| r.requests),
            )),
            f(|r| r.hot_user_share),
            f(|r| r.emb_hit_rate),
            f(|r| r.kv_hit_rate),
            f(|r| r.mean_seq_len),
            f(|r| r.slo_violation_share),
            Arc::new(
                rows.iter()
                    .map(WindowRow::served_p99_ms)
                    .collect::<Float64Array>(),
            ),
            f(|r| r.alpha),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.failed))),
            f(|r| r.truncated_share),
            Arc::new(rows.iter().map(|r| r.alpha_end).collect::<Float64Array>()),
            Arc::new(
                rows.iter()
                    .map(|r| Some(r.pinned_end))
                    .collect::<BooleanArray>(),
            ),
        ];
        RecordBatch::try_new(Self::schema(), columns).expect("columns match the schema")
    }
}

impl SinkRow for ErrorRow {
    const SCHEMA_VERSION: &'static str = "1";

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("position", DataType::Utf8, false),
            Field::new("reason", DataType::Utf8, false),
            Field::new("req_id", DataType::UInt64, true),
            // The position's parts, to join a row back to the trace; null
            // where the position names no such part (a Kafka offset, a
            // whole file).
            Field::new("file", DataType::Utf8, true),
            Field::new("row_group", DataType::UInt32, true),
            Field::new("row", DataType::UInt64, true),
        ]))
    }

    fn to_batch(rows: &[Self]) -> RecordBatch {
        let parts: Vec<position::Parts<'_>> = rows
            .iter()
            .map(|r| position::Parts::of(&r.position))
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| &r.position),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| &r.reason),
            )),
            Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.req_id))),
            Arc::new(parts.iter().map(|p| p.file).collect::<StringArray>()),
            Arc::new(parts.iter().map(|p| p.row_group).collect::<UInt32Array>()),
            Arc::new(parts.iter().map(|p| p.row).collect::<UInt64Array>()),
        ];
        RecordBatch::try_new(Self::schema(), columns).expect("columns match the schema")
    }
}
