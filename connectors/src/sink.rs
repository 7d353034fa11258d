//! What every sink is: it takes the rows a job emits, may hold some (a full
//! producer queue, a row group being filled), and says how many still wait.
//! Parquet files and Kafka topics implement it.

use std::path::PathBuf;

/// Why a sink could not write.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", file.display())]
    Parquet {
        file: PathBuf,
        source: parquet::errors::ParquetError,
    },
}

/// Where rows of type `R` go.
pub trait Sink<R> {
    /// Takes `rows`, in order. Nothing taken is dropped: what cannot go on
    /// yet is held until [`Sink::flush`].
    fn write(&mut self, rows: Vec<R>) -> Result<(), SinkError>;

    /// Offers held rows again; returns how many still wait.
    fn flush(&mut self) -> Result<usize, SinkError>;
}
