//! Rows that leave the dataflow. Sinks (Parquet now, Kafka later) write these.

use serde::{Deserialize, Serialize};

/// Where a record came from, so errors can name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SourcePosition {
    /// Parquet: file, row group and row within the file (0-based).
    Parquet {
        file: String,
        row_group: u32,
        row: u64,
    },
    /// Kafka: topic, partition and offset.
    Kafka {
        topic: String,
        partition: i32,
        offset: i64,
    },
}

impl std::fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourcePosition::Parquet {
                file,
                row_group,
                row,
            } => {
                write!(f, "{file}: row group {row_group}, row {row}")
            }
            SourcePosition::Kafka {
                topic,
                partition,
                offset,
            } => {
                write!(f, "{topic}[{partition}]@{offset}")
            }
        }
    }
}

/// One row of responses.parquet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponseRow {
    pub req_id: u64,
    pub node: u32,
    /// "user" or "item" (which side was the prefix, BAT).
    pub prefix: String,
    pub items: Vec<u32>,
    pub scores: Vec<f32>,
    pub latency_ms: f64,
    pub model_version: String,
    /// History items the model saw: after a long history was truncated to
    /// its most recent items that fit.
    #[serde(default)]
    pub history_len: u32,
    /// Of those, items whose KV came from the prefix cache.
    #[serde(default)]
    pub kv_reused_tokens: u32,
}

/// One row of windows.parquet: HLEM Table I state vector of one node and window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRow {
    pub node: u32,
    pub window_start_ms: u64,
    pub requests: u64,
    pub hot_user_share: f64,
    pub emb_hit_rate: f64,
    pub kv_hit_rate: f64,
    pub mean_seq_len: f64,
    pub slo_violation_share: f64,
    pub p99_ms: f64,
    pub alpha: f64,
}

/// One row of errors.parquet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorRow {
    /// `SourcePosition` rendered for people.
    pub position: String,
    pub reason: String,
    /// The request id when the record got far enough to have one.
    pub req_id: Option<u64>,
}
