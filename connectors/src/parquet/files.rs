//! Opening trace files: existence checks, footer, schema check.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use grflow_traces::columnar::{ColumnSpec, check_columns};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::file::metadata::ParquetMetaData;

use super::SourceError;

/// An opened trace file whose footer and columns have been checked.
#[derive(Debug)]
pub(crate) struct CheckedFile {
    pub path: PathBuf,
    pub file: File,
    pub metadata: ArrowReaderMetadata,
}

/// Opens `dir/name`, reads its footer and checks it has `columns`.
pub(crate) fn open_checked(
    dir: &Path,
    name: &str,
    columns: &[ColumnSpec],
) -> Result<CheckedFile, SourceError> {
    if !dir.is_dir() {
        return Err(SourceError::MissingDir {
            dir: dir.to_path_buf(),
        });
    }
    let path = dir.join(name);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SourceError::MissingFile { file: path });
        }
        Err(source) => return Err(SourceError::Io { file: path, source }),
    };
    let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(|e| {
        SourceError::Corrupt {
            file: path.clone(),
            message: e.to_string(),
        }
    })?;
    check_row_counts(&path, metadata.metadata())?;
    // A later schema with compatible columns would otherwise be misread.
    grflow_traces::columnar::check_schema_version(metadata.metadata().file_metadata()).map_err(
        |e| SourceError::Meta {
            file: path.clone(),
            key: grflow_traces::columnar::VERSION_KEY,
            reason: e.to_string(),
        },
    )?;
    check_columns(metadata.schema(), columns).map_err(|e| SourceError::Schema {
        file: path.clone(),
        column: e.column(),
        problem: e.to_string(),
    })?;
    Ok(CheckedFile {
        path,
        file,
        metadata,
    })
}

/// Footer row counts size allocations and per-row records: a negative or
/// inconsistent one is a corrupt file here, not a panic or abort later.
fn check_row_counts(path: &Path, meta: &ParquetMetaData) -> Result<(), SourceError> {
    let corrupt = |message: String| SourceError::Corrupt {
        file: path.to_path_buf(),
        message,
    };
    let mut sum: i64 = 0;
    for (g, group) in meta.row_groups().iter().enumerate() {
        let rows = group.num_rows();
        sum = sum
            .checked_add(rows)
            .filter(|_| rows >= 0)
            .ok_or_else(|| corrupt(format!("row group {g}: invalid row count {rows}")))?;
    }
    let total = meta.file_metadata().num_rows();
    if sum != total {
        return Err(corrupt(format!(
            "the row groups hold {sum} rows, the footer says {total}"
        )));
    }
    Ok(())
}

impl CheckedFile {
    /// Record batches of the given row groups (all when `None`).
    pub fn read(&self, row_groups: Option<Vec<usize>>) -> Result<Vec<RecordBatch>, String> {
        let file = self.file.try_clone().map_err(|e| e.to_string())?;
        let mut builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone());
        if let Some(groups) = row_groups {
            builder = builder.with_row_groups(groups);
        }
        let reader = builder
            .with_batch_size(8192)
            .build()
            .map_err(|e| e.to_string())?;
        reader.map(|b| b.map_err(|e| e.to_string())).collect()
    }

    /// The record batches of row group `g`, one at a time, so that rows
    /// read before an error are kept.
    pub fn read_group(
        &self,
        g: usize,
    ) -> Result<impl Iterator<Item = Result<RecordBatch, String>>, String> {
        let file = self.file.try_clone().map_err(|e| e.to_string())?;
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                .with_row_groups(vec![g])
                .with_batch_size(8192)
                .build()
                .map_err(|e| e.to_string())?;
        Ok(reader.map(|b| b.map_err(|e| e.to_string())))
    }

    /// Least and greatest non-null value of the u64 column `column` in row
    /// group `g`, read from the data (for files written without
    /// statistics); None when the group has none or cannot be read.
    /// `None` when the group cannot be read; `Some(None)` when it holds no
    /// valid value.
    pub fn u64_range(&self, g: usize, column: &str) -> Option<Option<(u64, u64)>> {
        let mut range: Option<(u64, u64)> = None;
        let unreadable = self.each_u64(Some(vec![g]), column, |v, _| {
            range = Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
        })?;
        unreadable.is_empty().then_some(range)
    }

    /// Calls `visit(value, row)` for every valid value of the u64 `column`
    /// in `row_groups` (all when `None`), the row counted from the first
    /// group read. A group that cannot be read is skipped (its rows keep
    /// their numbers) and returned; None when the column is not u64.
    pub fn each_u64(
        &self,
        row_groups: Option<Vec<usize>>,
        column: &str,
        mut visit: impl FnMut(u64, u64),
    ) -> Option<Vec<usize>> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::UInt64Type;
        let sizes = self.row_group_rows();
        let groups = row_groups.unwrap_or_else(|| (0..sizes.len()).collect());
        let mut unreadable = Vec::new();
        let mut start = 0u64;
        for g in groups {
            let mut row = start;
            start += sizes.get(g).copied().unwrap_or(0);
            // One reader per group, so that a corrupt one costs only its rows.
            let reader = self.file.try_clone().ok().and_then(|file| {
                let builder =
                    ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone());
                let mask =
                    parquet::arrow::ProjectionMask::columns(builder.parquet_schema(), [column]);
                builder
                    .with_row_groups(vec![g])
                    .with_projection(mask)
                    .with_batch_size(65_536)
                    .build()
                    .ok()
            });
            let Some(reader) = reader else {
                unreadable.push(g);
                continue;
            };
            for batch in reader {
                let Ok(batch) = batch else {
                    unreadable.push(g);
                    break;
                };
                let values = batch.column(0).as_primitive_opt::<UInt64Type>()?;
                for i in 0..values.len() {
                    if values.is_valid(i) {
                        visit(values.value(i), row);
                    }
                    row += 1;
                }
            }
        }
        Some(unreadable)
    }

    /// Row counts of every row group (checked by `open_checked`).
    pub fn row_group_rows(&self) -> Vec<u64> {
        self.metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows() as u64)
            .collect()
    }
}
