//! A request source over requests held in memory (grflow's embedded
//! default), with the Parquet source's sharding: chunks of `chunk_rows`
//! requests play the role of row groups, chunk c goes to worker c mod workers.

use std::sync::Arc;

use grflow_traces::{DEFAULT_ROW_GROUP_ROWS, Request};

use super::source::{Staged, suffix_mins};
use crate::error::SourceError;
use crate::records::SourcePosition;
use crate::source::{Polled, RequestSource, SourceRecord, SourceState};

/// File name in the positions of in-memory records.
pub const MEMORY_FILE: &str = "<memory>";

/// A worker's share of an in-memory request list.
#[derive(Debug)]
pub struct MemoryRequestSource {
    requests: Arc<Vec<Request>>,
    chunk_rows: usize,
    /// This worker's chunks, ascending.
    chunks: Vec<usize>,
    /// `later_min[k]`: least ts_ms of chunks[k..].
    later_min: Vec<u64>,
    next_chunk: usize,
    staged: Staged,
}

impl MemoryRequestSource {
    /// Worker `worker` of `workers`, chunks of 1,024 requests (the default
    /// row-group size of a written trace).
    pub fn new(requests: Arc<Vec<Request>>, worker: usize, workers: usize) -> Self {
        Self::with_chunk_rows(requests, worker, workers, DEFAULT_ROW_GROUP_ROWS)
    }

    /// As [`MemoryRequestSource::new`] with chunks of `chunk_rows` requests.
    pub fn with_chunk_rows(
        requests: Arc<Vec<Request>>,
        worker: usize,
        workers: usize,
        chunk_rows: usize,
    ) -> Self {
        assert!(
            workers > 0 && worker < workers,
            "worker {worker} of {workers}"
        );
        let chunk_rows = chunk_rows.max(1);
        let n_chunks = requests.len().div_ceil(chunk_rows);
        let chunks: Vec<usize> = (worker..n_chunks).step_by(workers).collect();
        let mins: Vec<u64> = chunks
            .iter()
            .map(|&c| {
                requests[c * chunk_rows..((c + 1) * chunk_rows).min(requests.len())]
                    .iter()
                    .map(|r| r.ts_ms)
                    .min()
            })
            .map(|m| m.unwrap_or(u64::MAX))
            .collect();
        Self {
            later_min: suffix_mins(&mins),
            requests,
            chunk_rows,
            chunks,
            next_chunk: 0,
            staged: Staged::default(),
        }
    }
}

impl RequestSource for MemoryRequestSource {
    fn poll(&mut self, max: usize, _floor_ms: u64) -> Result<Polled, SourceError> {
        if self.staged.is_done() {
            let Some(&c) = self.chunks.get(self.next_chunk) else {
                return Ok(Polled::exhausted());
            };
            self.next_chunk += 1;
            let start = c * self.chunk_rows;
            let end = (start + self.chunk_rows).min(self.requests.len());
            self.staged = Staged::new(
                (start..end)
                    .map(|row| {
                        SourceRecord::request(
                            self.requests[row].clone(),
                            SourcePosition::Parquet {
                                file: MEMORY_FILE.to_string(),
                                row_group: c as u32,
                                row: row as u64,
                            },
                        )
                    })
                    .collect(),
            );
        }
        let (records, staged_min) = self.staged.take(max.max(1));
        Ok(Polled {
            records,
            watermark_ms: staged_min.min(self.later_min[self.next_chunk]),
            state: SourceState::Ready,
        })
    }
}
