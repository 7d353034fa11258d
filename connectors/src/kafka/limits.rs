//! The history limits a Kafka source decodes with, shared by a serve job
//! and its sources: those of the models this process's nodes serve now.
//! A hot model swap changes a node's limits (`ServingNode::history_limits`
//! comes from its model and, for a trained model, its `max_history`); the
//! job notes the node's new limits once the node has taken the model, and
//! each source reads them once per poll. A source that kept the limits of
//! the model it started with would cut every history to them, shorter than
//! a new model that allows longer ones wants.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use grflow_operators::history::HistoryLimits;

/// The history limits of each node of the process, and what decoders cut
/// with: the loosest of them ([`HistoryLimits::loosest`]). Nodes take a
/// swap between batches, one after the other; until the last one has, a
/// request may still reach a node of the old model, so the decoder cuts no
/// history shorter than either model would. Then the nodes cut again to
/// their own limits, which keeps every request within its model's limits
/// whatever the decoder did. A node whose swap failed keeps its old limits
/// here, as it keeps its old model. Cheap to clone (one shared cell).
#[derive(Clone, Debug)]
pub struct ServedLimits {
    cell: Arc<RwLock<Served>>,
}

#[derive(Debug)]
struct Served {
    by_node: BTreeMap<u32, HistoryLimits>,
    /// The loosest of `by_node` (its start value while it is empty).
    cut: HistoryLimits,
}

impl ServedLimits {
    /// Nodes `nodes`, each serving a model with `limits`.
    pub fn new(nodes: impl IntoIterator<Item = u32>, limits: HistoryLimits) -> Self {
        Self {
            cell: Arc::new(RwLock::new(Served {
                by_node: nodes.into_iter().map(|n| (n, limits)).collect(),
                cut: limits,
            })),
        }
    }

    /// The same limits until a node reports its own with [`Self::set`]
    /// (tools and tests with no model swap).
    pub fn fixed(limits: HistoryLimits) -> Self {
        Self::new([], limits)
    }

    /// Node `node` serves a model with `limits` from now on.
    pub fn set(&self, node: u32, limits: HistoryLimits) {
        // Plain values, consistent after any panic: a poisoned lock is used.
        let mut served = self.cell.write().unwrap_or_else(PoisonError::into_inner);
        served.by_node.insert(node, limits);
        let cut = HistoryLimits::loosest(served.by_node.values().copied()).unwrap_or(limits);
        if cut != served.cut {
            tracing::info!(
                node,
                rank = cut.rank,
                retrieve = cut.retrieve,
                chunk = cut.chunk,
                "inline histories are cut to the served models' limits"
            );
            served.cut = cut;
        }
    }

    /// The limits to decode with now.
    pub fn current(&self) -> HistoryLimits {
        self.cell.read().unwrap_or_else(PoisonError::into_inner).cut
    }
}

impl From<HistoryLimits> for ServedLimits {
    fn from(limits: HistoryLimits) -> Self {
        Self::fixed(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, chunk: usize) -> HistoryLimits {
        HistoryLimits {
            rank: max,
            retrieve: max,
            chunk,
        }
    }

    #[test]
    fn every_node_on_the_new_model_cuts_to_its_limits() {
        let (old, new) = (limits(10, 4), limits(40, 8));
        let served = ServedLimits::new([3, 4], old);
        let reader = served.clone();
        assert_eq!(reader.current(), old);
        // Node 3 swapped, node 4 not yet: neither model's cut is undercut.
        served.set(3, new);
        assert_eq!(reader.current(), limits(40, 1));
        served.set(4, new);
        assert_eq!(reader.current(), new);
        // A shorter model: the same once every node serves it.
        served.set(3, old);
        assert_eq!(reader.current(), limits(40, 1));
        served.set(4, old);
        assert_eq!(reader.current(), old);
    }

    #[test]
    fn fixed_limits_follow_the_first_node_that_reports() {
        let served = ServedLimits::from(limits(10, 4));
        assert_eq!(served.current(), limits(10, 4));
        served.set(0, limits(20, 4));
        assert_eq!(served.current(), limits(20, 4));
    }
}
