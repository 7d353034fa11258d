//! The steps in which a long history loses its oldest items, shared by
//! the serving node (`grflow_operators::history`, which explains why it
//! drops whole chunks) and the trainer's evaluation, so that a model is
//! scored on the histories it will be served with.

/// The drop step for `limit`: a quarter of it rounded down to whole blocks
/// of `block` tokens, at least one block, never more than the limit.
pub fn chunk_for(limit: usize, block: usize) -> usize {
    let block = block.max(1);
    let quarter = limit / 4 / block * block;
    quarter.max(block).min(limit).max(1)
}

/// Oldest items to drop from a history of `len` items so that at most
/// `limit` remain: 0 when it fits, otherwise the least multiple of `chunk`
/// that is enough (so at least `limit - chunk + 1` items remain).
pub fn oldest_dropped(len: usize, limit: usize, chunk: usize) -> usize {
    if len <= limit {
        return 0;
    }
    if limit == 0 {
        return len;
    }
    let chunk = chunk.clamp(1, limit);
    (len - limit).div_ceil(chunk) * chunk
}

/// A limit and its drop step: what a history of a trained model keeps
/// (`max_history` items in `block`-token KV blocks), as serving keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryCut {
    pub limit: usize,
    pub chunk: usize,
}

impl HistoryCut {
    pub fn new(limit: usize, block: usize) -> Self {
        Self {
            limit,
            chunk: chunk_for(limit, block),
        }
    }

    /// The most recent items of `history` that are kept.
    pub fn keep<'a>(&self, history: &'a [u32]) -> &'a [u32] {
        &history[oldest_dropped(history.len(), self.limit, self.chunk)..]
    }
}
