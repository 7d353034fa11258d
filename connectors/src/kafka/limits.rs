//! The history limits a Kafka source decodes with, shared by a serve job
//! and its sources: a cut that keeps every item the models this process
//! has served would keep. A hot model swap changes a node's limits
//! (`ServingNode::history_limits` comes from its model and, for a trained
//! model, its `max_history`); the job notes a model's limits once a node
//! has taken it, and each source reads the cut once per poll. A source that
//! kept the cut of the model it started with would cut every history to
//! it, shorter than a new model that allows longer ones wants.

use std::sync::{Arc, PoisonError, RwLock};

use grflow_operators::history::{CommonCut, HistoryLimits};

/// Every history limits a node of this process has served with, and the
/// cut decoders make: their [`CommonCut`], after which each node's own cut
/// keeps exactly what it would have kept of the whole history. Limits are
/// never forgotten: a node whose swap failed stays on its old model, and in
/// cluster mode the other processes' nodes take the same swaps (a node of
/// another process on a model no node of this one ever took is not
/// covered). Cheap to clone (one shared cell).
#[derive(Clone, Debug)]
pub struct ServedLimits {
    cell: Arc<RwLock<CommonCut>>,
}

impl ServedLimits {
    /// Nodes serving a model with `limits`.
    pub fn new(limits: HistoryLimits) -> Self {
        Self {
            cell: Arc::new(RwLock::new(CommonCut::from(limits))),
        }
    }

    /// A node took a model with `limits`.
    pub fn note(&self, limits: HistoryLimits) {
        // Plain values, consistent after any panic: a poisoned lock is used.
        let mut cut = self.cell.write().unwrap_or_else(PoisonError::into_inner);
        let before = cut.limits().len();
        cut.add(limits);
        if cut.limits().len() > before {
            tracing::info!(
                rank = limits.rank,
                retrieve = limits.retrieve,
                chunk = limits.chunk,
                models = cut.limits().len(),
                "inline histories keep what every model served would keep"
            );
        }
    }

    /// The cut to decode with now.
    pub fn current(&self) -> CommonCut {
        self.cell
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl From<HistoryLimits> for ServedLimits {
    fn from(limits: HistoryLimits) -> Self {
        Self::new(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_operators::history::Task;

    fn limits(max: usize, chunk: usize) -> HistoryLimits {
        HistoryLimits {
            rank: max,
            retrieve: max,
            chunk,
        }
    }

    #[test]
    fn a_new_model_moves_the_cut_and_the_old_ones_stay_covered() {
        let (old, new) = (limits(10, 4), limits(40, 8));
        let served = ServedLimits::new(old);
        let reader = served.clone();
        // 50 items: the old model keeps 10.
        assert_eq!(reader.current().dropped(50, Task::Rank), 40);
        // A node took the new model (34 kept in chunks of 8); a node still
        // on the old one cuts the 34 to the same 10 it would have kept.
        served.note(new);
        let cut = reader.current();
        assert_eq!(cut.dropped(50, Task::Rank), 16);
        let history: Vec<u32> = (0..50).collect();
        let decoded = &history[16..];
        assert_eq!(
            old.keep(decoded, Task::Rank),
            old.keep(&history, Task::Rank)
        );
        assert_eq!(
            new.keep(decoded, Task::Rank),
            new.keep(&history, Task::Rank)
        );
        // Noted twice: nothing changes.
        served.note(new);
        assert_eq!(reader.current(), cut);
    }
}
