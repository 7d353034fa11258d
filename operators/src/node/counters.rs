//! A node's cumulative counters and the histograms of its model calls and
//! queue waits.

use serde::{Deserialize, Serialize};

use super::ServingNode;

/// Cumulative counters of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCounters {
    pub responses: u64,
    pub emb_hits: u64,
    pub emb_lookups: u64,
    pub kv_reused_tokens: u64,
    pub kv_total_tokens: u64,
    pub link_bytes: u64,
    pub oov_items: u64,
    /// Requests that asked for history (`hist_len` > 0, none inline) of a
    /// user the users table does not know: served with an empty history.
    #[serde(default)]
    pub unknown_user_histories: u64,
    /// Requests served with only the most recent part of their history.
    #[serde(default)]
    pub truncated_histories: u64,
    /// Requests that did not fit the KV share alone and were served after
    /// it took pages back from EMB (α lowered).
    #[serde(default)]
    pub kv_reclaims: u64,
    /// User prefix heads dropped because the table was full (max_users).
    pub user_head_evictions: u64,
    /// Model FLOPs executed: uncached history suffixes, candidates and
    /// instruction tokens, decode steps; cached tokens cost nothing.
    #[serde(default)]
    pub model_flops: f64,
    /// Tokens computed (those of the event-time service model: cached
    /// history tokens excluded).
    #[serde(default)]
    pub computed_tokens: u64,
    /// Model calls (a batch of rank requests, or one retrieve request).
    #[serde(default)]
    pub model_calls: u64,
    /// Model calls by requests served together: 1, 2, 3–4, 5–8, … 65+
    /// (see [`BATCH_BUCKETS`]).
    #[serde(default)]
    pub batch_size_hist: Vec<u64>,
    /// Requests by wall time from admission to the start of their batch,
    /// in [`WAIT_BUCKETS_MS`] (the last bucket is everything above).
    #[serde(default)]
    pub queue_wait_hist: Vec<u64>,
    /// α moves that changed the boundary, the refill they queued on the
    /// link's low-priority lane (bytes), and the most one move queued.
    #[serde(default)]
    pub alpha_moves: u64,
    #[serde(default)]
    pub refill_bytes: u64,
    #[serde(default)]
    pub refill_bytes_max_per_move: u64,
    /// What the node's GEMMs executed (lanes included): FLOPs and wall time
    /// inside the products. Beside `model_flops` it shows the GEMM rate the
    /// node gets in place, against the peak of ideal shapes.
    #[serde(default)]
    pub gemm_flops: f64,
    #[serde(default)]
    pub gemm_ns: u64,
    /// GEMM calls behind `gemm_flops`: their mean size shows what batching
    /// changes (larger products, the same FLOPs per request).
    #[serde(default)]
    pub gemm_calls: u64,
}

/// Upper bounds of the batch-size buckets (requests per model call); the
/// last bucket holds everything larger.
pub const BATCH_BUCKETS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Upper bounds (ms) of the queue-wait buckets; the last bucket holds
/// everything larger.
pub const WAIT_BUCKETS_MS: [f64; 9] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0];

/// Adds one to the bucket of `value` under `bounds` (one more bucket above).
fn bump<T: PartialOrd>(hist: &mut Vec<u64>, bounds: &[T], value: T) {
    hist.resize(bounds.len() + 1, 0);
    let i = bounds
        .iter()
        .position(|b| value <= *b)
        .unwrap_or(bounds.len());
    hist[i] += 1;
}

impl ServingNode {
    /// One model call serving `requests` requests together.
    pub(super) fn count_call(&mut self, requests: usize) {
        self.counters.model_calls += 1;
        bump(
            &mut self.counters.batch_size_hist,
            &BATCH_BUCKETS,
            requests as u64,
        );
    }

    /// GEMM work done for this node (a difference of
    /// [`grflow_kernels::gemm_tally`] readings around its model work).
    pub fn count_gemm(&mut self, done: grflow_kernels::GemmTally) {
        self.counters.gemm_flops += done.flop;
        self.counters.gemm_ns += done.nanos;
        self.counters.gemm_calls += done.calls;
    }

    /// `n` requests asked for the history of users the users table does
    /// not know ([`NodeCounters::unknown_user_histories`]).
    pub fn count_unknown_user_histories(&mut self, n: u64) {
        self.counters.unknown_user_histories += n;
    }

    /// A request waited `ms` (wall time) from admission to its batch.
    pub fn record_wait(&mut self, ms: f64) {
        bump(&mut self.counters.queue_wait_hist, &WAIT_BUCKETS_MS, ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::test_params;

    #[test]
    fn a_value_lands_in_the_first_bucket_whose_bound_holds_it_and_above_the_last_in_the_overflow() {
        let mut hist = Vec::new();
        for v in [1, 2, 3, 4, 64, 65, 1_000] {
            bump(&mut hist, &BATCH_BUCKETS, v);
        }
        // 1 | 2 | 3–4 | 5–8 | 9–16 | 17–32 | 33–64 | 65+
        assert_eq!(hist, vec![1, 1, 2, 0, 0, 0, 1, 2]);
    }

    #[test]
    fn calls_and_waits_are_counted_on_the_node() {
        let mut node = ServingNode::new(0, test_params()).unwrap();
        node.count_call(3);
        node.count_call(1);
        node.record_wait(0.5);
        node.record_wait(10_000.0);
        let c = node.counters();
        assert_eq!(c.model_calls, 2);
        assert_eq!(c.batch_size_hist[..3], [1, 0, 1]);
        assert_eq!(c.queue_wait_hist.len(), WAIT_BUCKETS_MS.len() + 1);
        assert_eq!(
            (
                c.queue_wait_hist[0],
                c.queue_wait_hist[WAIT_BUCKETS_MS.len()]
            ),
            (1, 1)
        );
    }
}
