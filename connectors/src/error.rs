//! Errors of a request source (the Parquet one today; the Kafka source
//! retries its client errors itself): each names the file and, where it can, the
//! column, row group or row.

use std::path::PathBuf;

/// Why a trace (or part of it) cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{}: trace directory not found", dir.display())]
    MissingDir { dir: PathBuf },
    #[error("{}: missing trace file", file.display())]
    MissingFile { file: PathBuf },
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no rows: {why}", file.display())]
    NoRows { file: PathBuf, why: &'static str },
    #[error("{}: not a readable Parquet file: {message}", file.display())]
    Corrupt { file: PathBuf, message: String },
    #[error("{}: {problem}", file.display())]
    Schema {
        file: PathBuf,
        column: &'static str,
        problem: String,
    },
    #[error("{}: row group {row_group}: unreadable: {message}", file.display())]
    RowGroup {
        file: PathBuf,
        row_group: usize,
        message: String,
    },
    #[error("{}: row {row}: column `{column}`: {reason}", file.display())]
    BadRow {
        file: PathBuf,
        row: u64,
        column: &'static str,
        reason: String,
    },
    #[error("{}: key-value metadata `{key}`: {reason}", file.display())]
    Meta {
        file: PathBuf,
        key: &'static str,
        reason: String,
    },
}

impl SourceError {
    /// Where the error is, for an error record: the file, plus the row
    /// group or row when the error is about one.
    pub fn position(&self) -> String {
        match self {
            SourceError::MissingDir { dir } => dir.display().to_string(),
            SourceError::RowGroup {
                file, row_group, ..
            } => format!("{}: row group {row_group}", file.display()),
            SourceError::BadRow { file, row, .. } => format!("{}: row {row}", file.display()),
            SourceError::MissingFile { file }
            | SourceError::Io { file, .. }
            | SourceError::Corrupt { file, .. }
            | SourceError::NoRows { file, .. }
            | SourceError::Schema { file, .. }
            | SourceError::Meta { file, .. } => file.display().to_string(),
        }
    }
}
