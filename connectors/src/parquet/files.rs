//! Opening trace files: existence checks, footer, schema check.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use grflow_traces::columnar::{ColumnSpec, check_columns};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};

use super::SourceError;
use super::salvage::Stretch;

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
    // The offset index (page locations) lets a reader skip a damaged page
    // by position instead of through its header and levels; a file without
    // one, or with a damaged one, is read without.
    let with_index = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
    let metadata = ArrowReaderMetadata::load(&file, with_index)
        .or_else(|_| ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()))
        .map_err(|e| SourceError::Corrupt {
            file: path.clone(),
            message: e.to_string(),
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

    /// Indexes of the top-level columns named `names` that the file has,
    /// in file order.
    pub fn roots(&self, names: &[&str]) -> Vec<usize> {
        let schema = self.metadata.schema();
        (0..schema.fields().len())
            .filter(|&i| names.contains(&schema.field(i).name().as_str()))
            .collect()
    }

    /// Rows `skip..skip + take` of row group `g`, top-level columns
    /// `roots` only, in batches of `batch_rows`, one at a time, so that
    /// rows read before an error are kept.
    pub fn read_rows(
        &self,
        g: usize,
        roots: &[usize],
        skip: u64,
        take: u64,
        batch_rows: usize,
    ) -> Result<impl Iterator<Item = Result<RecordBatch, String>>, String> {
        let as_usize = |n: u64| usize::try_from(n).map_err(|e| e.to_string());
        let file = self.file.try_clone().map_err(|e| e.to_string())?;
        let builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone());
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots.iter().copied());
        let selection = RowSelection::from(vec![
            RowSelector::skip(as_usize(skip)?),
            RowSelector::select(as_usize(take)?),
        ]);
        let reader = builder
            .with_row_groups(vec![g])
            .with_projection(mask)
            .with_row_selection(selection)
            .with_batch_size(batch_rows.max(1))
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
    /// group read. What cannot be read is skipped (rows keep their
    /// numbers) and its groups returned, once each; None when the column
    /// is not u64.
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
        let roots = self.roots(&[column]);
        let mut unreadable = Vec::new();
        let mut first = 0u64;
        let mut not_u64 = false;
        for g in groups {
            let rows = sizes.get(g).copied().unwrap_or(0);
            super::salvage::read_rows(self, g, &roots, 0, rows, |stretch| match stretch {
                Stretch::Read { start, batch } => {
                    let Some(values) = batch.column(0).as_primitive_opt::<UInt64Type>() else {
                        not_u64 = true;
                        return;
                    };
                    for i in 0..values.len() {
                        if values.is_valid(i) {
                            visit(values.value(i), first + start + i as u64);
                        }
                    }
                }
                Stretch::Unreadable { .. } => {
                    if unreadable.last() != Some(&g) {
                        unreadable.push(g);
                    }
                }
            });
            if not_u64 {
                return None;
            }
            first += rows;
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
