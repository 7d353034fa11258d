//! Importers of public interaction datasets into the trace schema.
//!
//! Formats: RecBole atomic `.inter` files (tab-separated, typed header such
//! as `user_id:token item_id:token rating:float timestamp:float`),
//! GroupLens `ratings.csv` (`userId,movieId,rating,timestamp`) and
//! SASRec-style `user item` lines (time-ordered per user, no timestamps).
//!
//! Every interaction becomes an event (ts_ms, user, item). Ids are remapped
//! densely in the order of the raw ids (numeric order when an id is a
//! number, ids of one number such as `7`, `07`, `+7` by their text), so the
//! mapping does not depend on file order. Events are ordered by (ts_ms,
//! user_id, item_id). Each event whose user already has a history is a
//! request: history so far, candidates = the true item plus
//! `candidates - 1` (default 99) popularity-sampled negatives, label = the
//! true item. A leading UTF-8 byte order mark is skipped; `ratings.csv`
//! fields may be double-quoted.

mod build;
mod parse;

use std::path::{Path, PathBuf};

pub use build::build_trace;
pub use parse::{RawEvents, parse_movielens, parse_recbole, parse_seq};
// Shared with `keystream`, so `bench cache` reads a file as `import` does.
pub(crate) use parse::{fnv1a, lines, split_csv};

use crate::schema::Trace;

/// Input format of `grflow import`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportFormat {
    /// RecBole `.inter` (tab-separated, typed header).
    Recbole,
    /// GroupLens `ratings.csv`.
    Movielens,
    /// SASRec-style `user item` lines.
    Seq,
}

impl std::str::FromStr for ImportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "recbole" => Ok(ImportFormat::Recbole),
            "movielens" => Ok(ImportFormat::Movielens),
            "seq" => Ok(ImportFormat::Seq),
            other => Err(format!(
                "unknown format {other:?} (expected recbole|movielens|seq)"
            )),
        }
    }
}

impl ImportFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImportFormat::Recbole => "recbole",
            ImportFormat::Movielens => "movielens",
            ImportFormat::Seq => "seq",
        }
    }
}

/// How imported interactions become a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportConfig {
    pub format: ImportFormat,
    /// Seeds the negative sampling and the synthetic item features.
    pub seed: u64,
    /// Candidates per request (true item + negatives).
    pub candidates: usize,
    /// Embedding tables T of the synthetic item catalog.
    pub tables: u16,
    pub codebook_size: u16,
    /// Event-time spacing of interactions without timestamps (seq format):
    /// a file of N lines spans N × `untimed_step_ms`.
    pub untimed_step_ms: u64,
}

impl Default for ImportConfig {
    fn default() -> Self {
        Self {
            format: ImportFormat::Recbole,
            seed: 42,
            candidates: 100,
            tables: 4,
            codebook_size: 256,
            untimed_step_ms: 10,
        }
    }
}

/// Why a dataset could not be imported. Each names the file and, for
/// content errors, the line and field.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: line {line}: field `{field}`: {reason}")]
    Parse {
        file: String,
        line: usize,
        field: String,
        reason: String,
    },
    #[error("{file}: no interactions")]
    Empty { file: String },
    #[error("{file}: {reason}")]
    Config { file: String, reason: String },
}

/// Reads and converts the dataset at `path`.
pub fn import(path: &Path, cfg: &ImportConfig) -> Result<Trace, ImportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    let name = path.display().to_string();
    import_str(&text, &name, cfg)
}

/// Converts dataset text; `name` is used in errors and the trace's source.
pub fn import_str(text: &str, name: &str, cfg: &ImportConfig) -> Result<Trace, ImportError> {
    let events = match cfg.format {
        ImportFormat::Recbole => parse_recbole(text, name, cfg.untimed_step_ms)?,
        ImportFormat::Movielens => parse_movielens(text, name)?,
        ImportFormat::Seq => parse_seq(text, name, cfg.untimed_step_ms)?,
    };
    build_trace(events, name, cfg)
}
