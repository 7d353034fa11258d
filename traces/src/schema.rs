//! In-memory form of a grflow trace. A trace is a directory holding three
//! Parquet tables: `requests.parquet`, `users.parquet`, `items.parquet`
//! (documented in traces/README.md).

use serde::{Deserialize, Serialize};

/// What the request asks the model to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Score the given candidates and return them best first.
    Rank,
    /// Generate items by beam search over semantic IDs (xGR).
    Retrieve,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Rank => "rank",
            Mode::Retrieve => "retrieve",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rank" => Ok(Mode::Rank),
            "retrieve" => Ok(Mode::Retrieve),
            other => Err(format!("unknown mode {other:?} (expected rank|retrieve)")),
        }
    }
}

/// One row of `requests.parquet`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Event time in milliseconds.
    pub ts_ms: u64,
    pub req_id: u64,
    pub user_id: u64,
    /// The request uses the first `hist_len` interactions of the user's history.
    pub hist_len: u32,
    pub candidates: Vec<u32>,
    pub mode: Mode,
    /// The item the user actually interacted with next, when known.
    pub label: Option<u32>,
}

/// One row of `users.parquet`: the user's whole interaction history in time order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserHistory {
    pub user_id: u64,
    pub items: Vec<u32>,
}

impl UserHistory {
    /// Histories numbered by position: the i-th becomes user i, the dense ids
    /// requests refer to (`hist_len` indexes into `items`).
    pub fn numbered(histories: Vec<Vec<u32>>) -> Vec<UserHistory> {
        histories
            .into_iter()
            .enumerate()
            .map(|(u, items)| UserHistory {
                user_id: u as u64,
                items,
            })
            .collect()
    }
}

/// One row of `items.parquet`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub item_id: u32,
    /// One feature id per embedding table (length = `TraceMeta::n_tables`).
    pub feature_ids: Vec<u32>,
    /// Tokens this item occupies in a sequence.
    pub token_len: u8,
    /// Semantic-ID triplet for generative retrieval (each < `TraceMeta::codebook_size`).
    pub sid: [u16; 3],
}

/// Trace-wide facts, stored as Parquet key-value metadata of `items.parquet`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceMeta {
    /// Number of embedding tables T.
    pub n_tables: u16,
    /// Rows of each embedding table (feature ids of table t are < `table_rows[t]`).
    pub table_rows: Vec<u32>,
    pub codebook_size: u16,
    /// Free text: generator and its parameters, or the imported dataset.
    pub source: String,
}

/// A whole trace held in memory (side tables are small; requests are streamed
/// by the Parquet source in the pipeline but held here by generators/importers).
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct Trace {
    pub meta: Option<TraceMeta>,
    pub requests: Vec<Request>,
    pub users: Vec<UserHistory>,
    pub items: Vec<Item>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_histories_take_their_position_as_user_id() {
        let users = UserHistory::numbered(vec![vec![3, 1], vec![], vec![7]]);
        let ids: Vec<u64> = users.iter().map(|u| u.user_id).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(users[0].items, [3, 1]);
        assert!(users[1].items.is_empty());
        assert_eq!(users[2].items, [7]);
    }
}
