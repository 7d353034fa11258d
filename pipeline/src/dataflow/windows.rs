//! Windowed statistics per node with differential dataflow: telemetry
//! becomes a collection keyed by (node, window start) and is reduced to the
//! HLEM Table I state vector. The reduction logic is
//! `grflow_operators::windows::WindowStats`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use differential_dataflow::AsCollection;
use serde::{Deserialize, Serialize};
use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::vec::Map;

use grflow_operators::windows::{WindowStats, window_start};

use crate::events::Telemetry;

/// `WindowStats` with a total order (differential keeps values sorted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrdStats(pub WindowStats);

impl OrdStats {
    fn key(&self) -> [u64; 8] {
        let s = &self.0;
        [
            s.requests,
            s.hot_user_share.to_bits(),
            s.emb_hit_rate.to_bits(),
            s.kv_hit_rate.to_bits(),
            s.mean_seq_len.to_bits(),
            s.slo_violation_share.to_bits(),
            s.p99_ms.to_bits(),
            s.alpha.to_bits(),
        ]
    }
}
impl Eq for OrdStats {}
impl std::hash::Hash for OrdStats {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}
impl PartialOrd for OrdStats {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdStats {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// Net count of each ((node, window_start_ms), statistics) update seen; at
/// the end exactly one entry per key is left with a positive count.
pub type WindowTable = Rc<RefCell<HashMap<((u32, u64), OrdStats), isize>>>;

/// Builds the windowed statistics and keeps this worker's share of the final
/// values in `table` (each key lives on one worker).
pub fn window_stats<'s>(
    telemetry: StreamVec<'s, u64, Telemetry>,
    window_ms: u64,
    table: WindowTable,
) {
    let stats = telemetry
        .map(move |t| {
            (
                ((t.node, window_start(t.ts_ms, window_ms)), t.sample),
                t.ts_ms,
                1isize,
            )
        })
        .as_collection()
        .reduce(|_key, samples, out| {
            let stats =
                WindowStats::from_samples(samples.iter().map(|(s, c)| (*s, (*c).max(0) as u64)));
            out.push((OrdStats(stats), 1isize));
        });
    stats
        .inner
        .sink(Pipeline, "WindowTable", move |(input, _frontier)| {
            let mut table = table.borrow_mut();
            input.for_each(|_cap, data| {
                for (update, _time, diff) in data.drain(..) {
                    let count = table.entry(update.clone()).or_insert(0);
                    *count += diff;
                    if *count == 0 {
                        table.remove(&update);
                    }
                }
            });
        });
}
