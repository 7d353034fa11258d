//! The job's output from every worker's result: nodes, latency, windows,
//! oracle and allocator records merged, and the summary made.

use std::collections::{BTreeMap, BTreeSet};

use grflow_connectors::WindowRow;
use grflow_operators::router::RouterStats;

use super::worker::{CounterSnapshot, WorkerResult};
use super::{CDF_POINTS, ReplayOutput};
use crate::config::Config;
use crate::dataflow::allocator::AllocatorStats;
use crate::summary::{LatencyTally, ModeTallies, NodeSummary, Summary, sort_windows};

/// Merges the workers' results into the job's output (`replay` adds the
/// responses, errors and what only it knows: interruption, repeats).
pub(super) fn assemble(
    results: Vec<WorkerResult>,
    cfg: &Config,
    counters: CounterSnapshot,
    workers: usize,
    wall_s: f64,
    trace: String,
) -> ReplayOutput {
    let mut out = ReplayOutput::default();
    let mut router = RouterStats::default();
    let mut nodes = Vec::new();
    let mut versions = BTreeMap::<u32, String>::new();
    let mut latency: BTreeMap<u32, LatencyTally> = Default::default();
    let mut by_mode = ModeTallies::default();
    let mut allocator = AllocatorStats::default();
    for r in results {
        allocator.merge(&r.allocator);
        for (node, tally) in r.latency {
            latency.entry(node).or_default().merge(&tally);
        }
        by_mode.merge(&r.by_mode);
        out.errors_held_peak += r.pending_errors_peak;
        out.windows.extend(r.windows);
        out.oracle.extend(r.oracle);
        router.merge(&r.router);
        versions.insert(r.node.node, r.model_version);
        nodes.push(r.node);
    }
    // Node 0's, whatever order the workers' results came in. Nodes of one
    // job serving different models is a cluster whose processes were
    // started with different configs or --model (or a swap sent to some
    // nodes only): said, not hidden.
    let model_version = versions.values().next().cloned().unwrap_or_default();
    let distinct: BTreeSet<&String> = versions.values().collect();
    if distinct.len() > 1 {
        tracing::warn!(
            ?versions,
            "the nodes ended the run on different models: in cluster mode every \
             process needs the same config, trace and --model"
        );
    }
    sort_windows(&mut out.windows);
    out.oracle.sort_by_key(|e| (e.node, e.epoch_start_ms));
    // Stable: each node's decisions keep their order.
    out.allocator_steps = std::mem::take(&mut allocator.steps);
    out.allocator_steps.sort_by_key(|(node, _)| *node);
    nodes.sort_by_key(|n| n.node);
    let mut overall = LatencyTally::default();
    for n in &mut nodes {
        let tally = latency.remove(&n.node).unwrap_or_default();
        n.slo_satisfaction = tally.slo_satisfaction();
        n.latency_ms = tally.summary();
        overall.merge(&tally);
    }
    // Responses of a node no worker reported (none expected) still count.
    for tally in latency.values() {
        overall.merge(tally);
    }
    // Requests answered with an error record are SLO misses; the record
    // does not name a node, so only the run's and each kind's figure count them.
    overall.record_failures(by_mode.failed());

    out.latency_cdf = overall.cdf(CDF_POINTS);
    let sum = |f: fn(&NodeSummary) -> u64| nodes.iter().map(f).sum::<u64>();
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let event_time_s = event_span_s(&out.windows);
    let responses_out = counters.responses_out;
    out.summary = Summary {
        trace,
        workers,
        requests_in: counters.requests_in,
        responses_out,
        errors: counters.errors,
        late_records: counters.late,
        duplicate_req_ids: None,
        interrupted: None,
        wall_s,
        event_time_s,
        throughput_rps: responses_out as f64 / wall_s.max(1e-9),
        slo_ms: cfg.run.slo_ms.rank,
        by_mode: by_mode.summaries(&cfg.run.slo_ms),
        clock: cfg.run.clock.as_str().to_string(),
        release: cfg.run.replay_release().as_str().to_string(),
        slo_satisfaction: overall.slo_satisfaction(),
        latency_ms: overall.summary(),
        emb_hit_rate: ratio(sum(|n| n.emb_hits), sum(|n| n.emb_lookups)),
        kv_hit_rate: ratio(sum(|n| n.kv_reused_tokens), sum(|n| n.kv_total_tokens)),
        truncated_histories: sum(|n| n.truncated_histories),
        unknown_user_histories: sum(|n| n.unknown_user_histories),
        model_version,
        nodes,
        router,
        windows: out.windows.len(),
        allocator: cfg
            .allocator
            .moves()
            .then(|| allocator.summary(cfg.allocator.policy)),
    };
    out
}

/// Event time covered, from the windows seen (their starts, so short by up
/// to a window): used where the trace's own range is unknown.
fn event_span_s(windows: &[WindowRow]) -> f64 {
    let first = windows.iter().map(|w| w.window_start_ms).min();
    let last = windows.iter().map(|w| w.window_start_ms).max();
    match (first, last) {
        (Some(a), Some(b)) => (b - a) as f64 / 1000.0,
        _ => 0.0,
    }
}
