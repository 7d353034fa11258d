//! Request planning: before any cache or model work, what a request will be
//! served with (the most recent part of its history that fits) and how many
//! tokens it costs. Refusals that need no work happen here.

use grflow_kernels::SID_STEPS;

use crate::history::{HistoryLimits, Task};

use super::ServeError;

/// What serving one request takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan<'h> {
    /// The history it is served with.
    pub history: &'h [u32],
    /// Whether older items were dropped to fit the model.
    pub truncated: bool,
    /// Tokens of the whole sequence: history, then candidates and the
    /// instruction token (rank) or the beams' decode steps (retrieve).
    pub tokens: usize,
}

impl<'h> Plan<'h> {
    /// User-as-prefix ranking of `candidates` after `history`.
    pub fn rank(
        limits: &HistoryLimits,
        req_id: u64,
        history: &'h [u32],
        candidates: usize,
    ) -> Result<Self, ServeError> {
        if candidates == 0 {
            return Err(ServeError::NoCandidates { req_id });
        }
        let kept = limits.keep(history, Task::Rank);
        Ok(Self {
            history: kept,
            truncated: kept.len() < history.len(),
            tokens: kept.len() + candidates + 1,
        })
    }

    /// Beam search of `beam_width` beams over `SID_STEPS` steps after
    /// `history`; `catalog_empty` means there is nothing to retrieve.
    pub fn retrieve(
        limits: &HistoryLimits,
        req_id: u64,
        history: &'h [u32],
        beam_width: usize,
        catalog_empty: bool,
    ) -> Result<Self, ServeError> {
        if catalog_empty {
            return Err(ServeError::EmptyCatalog { req_id });
        }
        let kept = limits.keep(history, Task::Retrieve);
        Ok(Self {
            history: kept,
            truncated: kept.len() < history.len(),
            tokens: kept.len() + SID_STEPS * beam_width,
        })
    }

    /// Marks the plan truncated when its history was cut before it reached
    /// the node (`cut`), so that a request cut twice counts once.
    pub fn cut_before(mut self, cut: bool) -> Self {
        self.truncated |= cut;
        self
    }

    /// Tokens computed when `reused` history tokens come from the cache.
    pub fn computed_tokens(&self, reused: usize) -> usize {
        self.tokens - reused.min(self.history.len())
    }
}

/// The `k` best of `scores` (ties to the earlier index), as indexes. A NaN
/// ranks last: a broken score never wins.
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let key = |i: usize| {
        let s = scores[i];
        if s.is_nan() { f32::NEG_INFINITY } else { s }
    };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    order.truncate(k);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HistoryLimits {
        HistoryLimits {
            rank: 8,
            retrieve: 6,
            chunk: 2,
        }
    }

    #[test]
    fn rank_keeps_the_most_recent_history_and_counts_candidates_and_the_instruction() {
        let history: Vec<u32> = (0..5).collect();
        let plan = Plan::rank(&limits(), 1, &history, 3).unwrap();
        assert_eq!(
            (plan.history.len(), plan.truncated, plan.tokens),
            (5, false, 9)
        );
        let long: Vec<u32> = (0..11).collect();
        let plan = Plan::rank(&limits(), 1, &long, 3).unwrap();
        assert!(plan.truncated);
        assert!(plan.history.len() <= 8);
        assert_eq!(plan.history.last(), Some(&10), "the most recent items stay");
        assert_eq!(plan.tokens, plan.history.len() + 4);
        assert_eq!(plan.computed_tokens(4), plan.tokens - 4);
    }

    #[test]
    fn retrieve_uses_its_own_limit_and_counts_every_beams_decode_steps() {
        let history: Vec<u32> = (0..7).collect();
        let plan = Plan::retrieve(&limits(), 2, &history, 4, false).unwrap();
        assert!(plan.truncated && plan.history.len() <= 6);
        assert_eq!(plan.tokens, plan.history.len() + SID_STEPS * 4);
    }

    #[test]
    fn requests_that_need_no_work_to_refuse_are_refused_here() {
        assert!(matches!(
            Plan::rank(&limits(), 7, &[1, 2], 0),
            Err(ServeError::NoCandidates { req_id: 7 })
        ));
        assert!(matches!(
            Plan::retrieve(&limits(), 8, &[1, 2], 4, true),
            Err(ServeError::EmptyCatalog { req_id: 8 })
        ));
    }

    #[test]
    fn top_k_orders_by_score_and_breaks_ties_by_position() {
        assert_eq!(top_k(&[0.1, 0.9, 0.5, 0.9], 3), vec![1, 3, 2]);
        assert_eq!(top_k(&[0.3], 5), vec![0]);
        assert!(top_k(&[], 2).is_empty());
        // NaN (either sign) ranks with -inf, after every real score.
        let nan = f32::NAN;
        assert_eq!(top_k(&[nan, 0.5, -nan, -1e30], 4), vec![1, 3, 0, 2]);
    }
}
