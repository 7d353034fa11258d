//! The episodes `train-allocator` plays: one trace per (regime, seed),
//! each episode started from its own α (or per-node split), replayed on
//! the virtual clock with the current policy sampling its moves.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use grflow_operators::allocator::ppo::Step;
use grflow_pipeline::{ReplayOptions, StopRequest, TraceInput};
use grflow_traces::Trace;

use super::Args;
use crate::cli::InputError;

/// A training trace: its regime, its seed and the trace.
pub(super) type EpisodeTrace = (String, u64, Arc<Trace>);

/// What one iteration's episodes gave: every node's decisions (one
/// trajectory per node and episode) and each episode's p99 (ms).
pub(super) struct Played {
    pub(super) trajectories: Vec<Vec<Step>>,
    pub(super) p99s: Vec<f64>,
}

/// Plays iteration `iteration`'s episodes with the policy at `policy`:
/// `None` when `stop` was requested before they all ended (an unfinished
/// iteration teaches nothing).
pub(super) fn play_iteration(
    args: &Args,
    base: &grflow_pipeline::Config,
    regimes: usize,
    traces: &[EpisodeTrace],
    policy: &Path,
    iteration: usize,
    stop: &StopRequest,
) -> anyhow::Result<Option<Played>> {
    let mut played = Played {
        trajectories: Vec::new(),
        p99s: Vec::new(),
    };
    for (k, (_, _, trace)) in traces.iter().enumerate() {
        let mut cfg = base.clone();
        let slot = start_slot(k, regimes, args.seeds as usize, iteration);
        cfg.memory.alpha = start_alpha(slot, traces.len());
        if args.split_starts {
            cfg.memory.node_alpha =
                Some(split_start(slot, traces.len(), base.run.workers, iteration));
        }
        cfg.allocator.policy_file = policy.display().to_string();
        cfg.allocator.seed = args.seed ^ ((iteration as u64) << 20) ^ ((k as u64) << 8);
        let out =
            grflow_pipeline::replay(ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg))
                .map_err(|e| episode_error(e, "training episode"))?;
        let latency = (out.summary.latency_ms.as_ref())
            .context("a training episode answered no request: no p99")?;
        played.p99s.push(latency.p99);
        let mut by_node: BTreeMap<u32, Vec<Step>> = BTreeMap::new();
        for (node, step) in out.allocator_steps {
            by_node.entry(node).or_default().push(step);
        }
        played.trajectories.extend(by_node.into_values());
        if stop.requested() {
            return Ok(None);
        }
    }
    Ok(Some(played))
}

/// Starting α of episode `k` of an iteration: spread over [0.1, 0.9] so
/// the policy sees both sides of every workload's best α.
pub(super) fn start_alpha(k: usize, episodes: usize) -> f64 {
    let f = (k as f64 + 0.5) / episodes.max(1) as f64;
    ((0.1 + 0.8 * f) * 100.0).round() / 100.0
}

/// Where episode `k` (traces in order regime by regime, `per_regime`
/// seeds each) of `iteration` sits in [`start_alpha`]'s spread: each
/// regime's episodes take every `regimes`-th place, so that every regime
/// starts from low and high α alike (in trace order, Steady would always
/// start low and Burst high, and α in the state would stand for the
/// regime), and the places rotate with the iteration.
pub(super) fn start_slot(k: usize, regimes: usize, per_regime: usize, iteration: usize) -> usize {
    let (regimes, per_regime) = (regimes.max(1), per_regime.max(1));
    let (regime, seed) = (k / per_regime, k % per_regime);
    (seed * regimes + regime + iteration) % (regimes * per_regime)
}

/// `--split-starts`: the starting α of each of `nodes` nodes in episode
/// `k` of `iteration`. Node 0 starts where [`start_alpha`] says; node j
/// takes the α of the episode j·s further on (mod `episodes`), where the
/// shift s cycles through 1..episodes with the iteration, so that over
/// the iterations every episode starts from many different splits, and
/// (with 2 nodes) never from equal αs.
pub(super) fn split_start(k: usize, episodes: usize, nodes: usize, iteration: usize) -> Vec<f64> {
    let n = episodes.max(1);
    let shift = 1 + iteration % (n - 1).max(1);
    (0..nodes)
        .map(|j| start_alpha((k + j * shift) % n, n))
        .collect()
}

/// One trace per (regime, seed) for `seeds` seeds from `seed_base`, sized
/// by `base`'s trace section.
pub(super) fn episode_traces(
    base: &grflow_pipeline::Config,
    regimes: &[grflow_traces::Regime],
    seed_base: u64,
    seeds: u64,
) -> anyhow::Result<Vec<EpisodeTrace>> {
    let mut traces = Vec::new();
    for regime in regimes {
        for i in 0..seeds {
            let mut t = base.trace.clone();
            t.regime = regime.as_str().into();
            t.seed = seed_base + i;
            let g = t.gen_config().map_err(InputError::from_display)?;
            traces.push((
                regime.as_str().to_string(),
                t.seed,
                Arc::new(grflow_traces::generate(&g)),
            ));
        }
    }
    Ok(traces)
}

/// What the episodes replayed besides the trace seeds: the config, the
/// memory and trace settings that shape the trade-off, and the cost model
/// charged (two configs may differ in nothing else).
pub(super) fn workload(
    args: &Args,
    base: &grflow_pipeline::Config,
    cost: &grflow_kernels::cost::CostModel,
) -> String {
    format!(
        "config {}, {} workers, memory.pool_mib {}, trace: {} users, {} items, {} tables, histories {}-{}, \
         cost model {} (overhead {:.4} ms, busy {:.4} ms, overhead_scale {}), starts rotated per regime",
        args.config
            .as_ref()
            .map_or("embedded".to_string(), |p| p.display().to_string()),
        base.run.workers,
        base.memory.pool_mib,
        base.trace.users,
        base.trace.items,
        base.trace.tables,
        base.trace.min_history,
        base.trace.max_history,
        base.cost
            .calibration
            .as_ref()
            .map_or("calibrated in this run".to_string(), |p| p
                .display()
                .to_string()),
        cost.overhead_ms,
        cost.occupancy_ms,
        base.cost.overhead_scale,
    )
}

/// A replay's setup error (the config or trace) is the user's to fix:
/// exit code 2, as `grflow replay` gives for the same config.
pub(super) fn episode_error(e: grflow_pipeline::ReplayError, what: &str) -> anyhow::Error {
    match e {
        e if e.is_input() => InputError::from_display(format!("{what}: {e}")),
        other => anyhow::Error::new(other).context(what.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regime_starts_low_and_high_and_the_starts_rotate() {
        // 3 regimes x 3 seeds, in trace order: Steady's episodes are 0..3.
        let starts = |regime: usize, it: usize| -> Vec<f64> {
            (0..3)
                .map(|seed| start_alpha(start_slot(regime * 3 + seed, 3, 3, it), 9))
                .collect()
        };
        for regime in 0..3 {
            let a = starts(regime, 0);
            let (lo, hi) = (
                a.iter().copied().fold(1.0, f64::min),
                a.iter().copied().fold(0.0, f64::max),
            );
            assert!(lo < 0.35 && hi > 0.65, "regime {regime}: {a:?}");
        }
        // Each iteration's slots are a permutation, and they move.
        for it in 0..4 {
            let mut slots: Vec<usize> = (0..9).map(|k| start_slot(k, 3, 3, it)).collect();
            slots.sort_unstable();
            assert_eq!(slots, (0..9).collect::<Vec<_>>());
        }
        assert_ne!(starts(0, 0), starts(0, 1));
        assert_eq!(start_slot(0, 1, 1, 7), 0, "one episode");
    }

    #[test]
    fn split_starts_part_the_nodes_and_change_with_the_iteration() {
        let pairs: Vec<Vec<f64>> = (0..9).map(|k| split_start(k, 9, 2, 0)).collect();
        // Node 0 starts where one α for all would; node 1 elsewhere.
        for (k, p) in pairs.iter().enumerate() {
            assert_eq!(p[0], start_alpha(k, 9));
            assert_ne!(p[0], p[1], "episode {k}");
        }
        assert_eq!(pairs[0], [0.14, 0.23]);
        assert_eq!(split_start(0, 9, 2, 4), [0.14, 0.59]);
        // Every iteration's shift differs until the cycle repeats.
        let node1: Vec<f64> = (0..8).map(|it| split_start(0, 9, 2, it)[1]).collect();
        let mut distinct = node1.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), 8, "{node1:?}");
        assert_eq!(split_start(0, 9, 2, 8), split_start(0, 9, 2, 0));
        assert_eq!(split_start(3, 9, 3, 0).len(), 3);
        assert_eq!(
            split_start(0, 1, 2, 5),
            [0.5, 0.5],
            "one episode: nothing to part"
        );
    }

    #[test]
    fn episodes_start_spread_over_the_alpha_range() {
        let a: Vec<f64> = (0..4).map(|k| start_alpha(k, 4)).collect();
        assert_eq!(a, [0.2, 0.4, 0.6, 0.8]);
    }
}
