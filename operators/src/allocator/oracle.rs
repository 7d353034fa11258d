//! The per-epoch oracle α* of HLEM §V: the epoch's requests as the node
//! served them in the actual run, replayed on the virtual clock from the
//! node's state at the epoch's start at every α of a grid; α* is the α with
//! the lowest P99 (ties: the median of the αs within 1% of the minimum).
//! A grid α is moved to where the run's α moved first in the epoch (its
//! first α command), or at the epoch's second millisecond, where the
//! allocator's commands land, when the run had none; the boundary move and
//! its refill are `set_alpha_at`'s own, so the refill gets the link from
//! that time on, as a command's does in the run.
//! An α at which a request fails is never α*, nor one that serves more
//! requests with a shortened history than the run did in the epoch: a
//! shortened history changes the answer (and costs less), so α* may change
//! no more answers than the α it judges.
//!
//! [`OracleRecorder`] follows one node through a run: it copies the node
//! before the first command or batch of each epoch, records the α
//! commands applied and the batches served, and evaluates an epoch when
//! the next one starts (or at the end). Replaying the recorded commands,
//! each at its own time, reproduces the run.
//! The replay needs a deterministic node: the virtual clock, `complete`
//! release and eviction policies that decide by their state alone (`lru`).

use serde::{Deserialize, Serialize};

use crate::node::{
    ItemCatalog, RankRequest, RankWork, RetrieveRequest, RetrieveWork, ServeError, ServingNode,
};
use crate::retrieval::RetrievalIndex;
use crate::windows::percentile;

/// αs whose P99 lies within this share of the lowest tie for α*.
const TIE_SHARE: f64 = 0.01;

/// The grid α ∈ {0, step, 2·step, …, 1}.
pub fn alpha_grid(step: f64) -> Vec<f64> {
    let n = (1.0 / step.clamp(1e-3, 1.0)).round() as usize;
    (0..=n).map(|i| i as f64 / n as f64).collect()
}

/// A rank request as the node served it.
#[derive(Clone, Debug)]
pub struct OwnedRank {
    pub req_id: u64,
    pub user_id: u64,
    pub candidates: Vec<u32>,
    pub history: Vec<u32>,
}

/// A retrieve request as the node served it.
#[derive(Clone, Debug)]
pub struct OwnedRetrieve {
    pub req_id: u64,
    pub user_id: u64,
    pub history: Vec<u32>,
}

/// A command that moved the node's α in the run (`SetAlpha`, or a
/// `PinAlpha` that moves it): the α it asked for, at its event time. The
/// same request on the same state moves the boundary as far as in the run
/// (pinned KV pages may keep it short of the target) and starts the same
/// refill at the same time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecordedCommand {
    pub now_ms: u64,
    pub alpha: f64,
}

/// One call of [`ServingNode::serve_step`] in the run.
#[derive(Clone, Debug, Default)]
pub struct RecordedBatch {
    pub now_ms: u64,
    /// α the node served it at.
    pub alpha: f64,
    pub rank: Vec<OwnedRank>,
    pub retrieve: Vec<OwnedRetrieve>,
}

impl RecordedBatch {
    /// Serves the batch on `node` as the run did, adding the requests'
    /// latencies and the number served with a shortened history; `None`
    /// when one failed.
    fn replay(
        &self,
        node: &mut ServingNode,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
        latencies: &mut Vec<f64>,
        truncated: &mut u64,
    ) -> Option<()> {
        let rank: Vec<RankWork<'_>> = self
            .rank
            .iter()
            .map(|r| RankWork {
                req: RankRequest {
                    req_id: r.req_id,
                    user_id: r.user_id,
                    candidates: &r.candidates,
                },
                history: &r.history,
                // Epochs come from replays, whose histories are the table's.
                cut_before: false,
            })
            .collect();
        let retrieve: Vec<RetrieveWork<'_>> = self
            .retrieve
            .iter()
            .map(|r| RetrieveWork {
                req: RetrieveRequest {
                    req_id: r.req_id,
                    user_id: r.user_id,
                },
                history: &r.history,
                cut_before: false,
            })
            .collect();
        let (ranked, retrieved) = node.serve_step(self.now_ms, &rank, &retrieve, catalog, index);
        for outcome in ranked.into_iter().chain(retrieved) {
            let served = outcome.ok()?;
            *truncated += u64::from(served.truncated);
            latencies.push(served.modelled_latency_ms);
        }
        Some(())
    }
}

/// One node's epoch under the oracle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OracleEpoch {
    pub node: u32,
    pub epoch_start_ms: u64,
    pub requests: u64,
    /// α the run served the epoch with: its last batch's, the decision
    /// for the epoch (a command made from the previous window applies from
    /// the epoch's second millisecond).
    pub alpha: f64,
    pub alpha_star: f64,
    /// P99 of the replay of the run's own α over the epoch, and at α*.
    pub p99_at_alpha_ms: f64,
    pub p99_at_star_ms: f64,
    /// P99 the run measured for these requests (the replay at α
    /// reproduces it on a deterministic node).
    pub run_p99_ms: f64,
    /// Requests the run served with a shortened history: the most α* may.
    #[serde(default)]
    pub truncated: u64,
}

/// The epoch's `batches` replayed from `before`, each α move of `moves`
/// applied at its own time, before the batches at or after it (as a
/// command stamped t applies before every request at t): the run's
/// recorded commands reproduce the run, one move replays the epoch at one
/// α. The P99 and how many requests were served with a shortened history;
/// `None` when a request failed (or a move was refused).
pub fn replay_epoch(
    before: &ServingNode,
    moves: &[RecordedCommand],
    batches: &[RecordedBatch],
    catalog: &dyn ItemCatalog,
    index: &RetrievalIndex,
) -> Result<Option<Replayed>, ServeError> {
    Ok(
        replay_served(before, moves, batches, catalog, index)?.map(|r| {
            let mut latencies = r.latencies;
            latencies.sort_by(f64::total_cmp);
            Replayed {
                p99_ms: percentile(&latencies, 0.99),
                truncated: r.truncated,
            }
        }),
    )
}

/// What [`replay_served`] leaves: the node after the epoch and the
/// latencies of its requests in the order served.
#[derive(Debug)]
struct Served {
    #[cfg_attr(not(test), allow(dead_code))] // read by the tests
    node: ServingNode,
    latencies: Vec<f64>,
    truncated: u64,
}

/// [`replay_epoch`] before the P99.
fn replay_served(
    before: &ServingNode,
    moves: &[RecordedCommand],
    batches: &[RecordedBatch],
    catalog: &dyn ItemCatalog,
    index: &RetrievalIndex,
) -> Result<Option<Served>, ServeError> {
    let mut node = before.snapshot()?;
    let mut latencies = Vec::new();
    let mut truncated = 0;
    let mut moves = moves.iter().peekable();
    for b in batches {
        while let Some(m) = moves.next_if(|m| m.now_ms <= b.now_ms) {
            if node.set_alpha_at(m.alpha, m.now_ms).is_err() {
                return Ok(None);
            }
        }
        if b.replay(&mut node, catalog, index, &mut latencies, &mut truncated)
            .is_none()
        {
            return Ok(None);
        }
    }
    Ok(Some(Served {
        node,
        latencies,
        truncated,
    }))
}

/// An epoch replayed at one α.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replayed {
    pub p99_ms: f64,
    /// Requests served with a shortened history.
    pub truncated: u64,
}

/// α* among `(α, P99)` points (`None`: not eligible): the lowest P99, ties
/// within 1% broken by the median α among them. With an even number of
/// ties the median is the mean of the two middle αs (the lower one would
/// lean toward KV by half a step), which may fall between grid points: α*
/// is a reported target (gap, regret), not a replayed α. Its P99 is then
/// the mean of theirs (both within 1% of the lowest).
pub fn alpha_star(points: &[(f64, Option<f64>)]) -> Option<(f64, f64)> {
    let min = points
        .iter()
        .filter_map(|(_, p)| *p)
        .min_by(f64::total_cmp)?;
    let mut near: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|&(a, p)| p.filter(|&p| p <= min * (1.0 + TIE_SHARE)).map(|p| (a, p)))
        .collect();
    near.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (lower, upper) = (near[(near.len() - 1) / 2], near[near.len() / 2]);
    Some(((lower.0 + upper.0) / 2.0, (lower.1 + upper.1) / 2.0))
}

/// What the oracle says about a run, over its node-epochs.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleSummary {
    pub epochs: usize,
    /// Mean |α − α*|.
    pub gap: f64,
    /// Mean P99 at the run's α minus P99 at α*.
    pub regret_ms: f64,
    pub alpha_star_mean: f64,
    /// Std of α* over epochs, per node, averaged over nodes.
    pub alpha_star_std: f64,
    /// The gap of the best constant α in hindsight (per node, the median
    /// of its α*): where α* jitters around a level, a controller that
    /// reads past windows can hardly do better.
    pub gap_best_constant: f64,
    /// Mean |α*ₜ − α*ₜ₋₁| per node: the gap of a controller that knew the
    /// previous epoch's α* exactly (`None` with one epoch per node).
    pub gap_previous_star: Option<f64>,
}

impl OracleSummary {
    /// `None` for a run without evaluated epochs.
    pub fn of(epochs: &[OracleEpoch]) -> Option<Self> {
        if epochs.is_empty() {
            return None;
        }
        let mut by_node: std::collections::BTreeMap<u32, Vec<&OracleEpoch>> = Default::default();
        for e in epochs {
            by_node.entry(e.node).or_default().push(e);
        }
        let per_node: Vec<Vec<f64>> = by_node
            .into_values()
            .map(|mut v| {
                v.sort_by_key(|e| e.epoch_start_ms);
                v.iter().map(|e| e.alpha_star).collect()
            })
            .collect();
        let total_off: f64 = per_node.iter().map(|v| off_median(v)).sum();
        let steps: Vec<f64> = per_node
            .iter()
            .flat_map(|v| v.windows(2).map(|w| (w[1] - w[0]).abs()))
            .collect();
        let mean =
            |f: fn(&OracleEpoch) -> f64| epochs.iter().map(f).sum::<f64>() / epochs.len() as f64;
        Some(Self {
            epochs: epochs.len(),
            gap: mean(|e| (e.alpha - e.alpha_star).abs()),
            regret_ms: mean(|e| e.p99_at_alpha_ms - e.p99_at_star_ms),
            alpha_star_mean: mean(|e| e.alpha_star),
            alpha_star_std: per_node.iter().map(|v| std_dev(v)).sum::<f64>()
                / per_node.len() as f64,
            gap_best_constant: total_off / epochs.len() as f64,
            gap_previous_star: (!steps.is_empty())
                .then(|| steps.iter().sum::<f64>() / steps.len() as f64),
        })
    }
}

/// Σ |a − m| over `v` for a median m: the least total distance of any
/// constant (every median gives it; the lower one is taken).
fn off_median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    let Some(&m) = sorted.get(sorted.len().saturating_sub(1) / 2) else {
        return 0.0;
    };
    v.iter().map(|a| (a - m).abs()).sum()
}

/// Population standard deviation (0 for no values).
pub fn std_dev(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

/// An epoch being recorded.
#[derive(Debug)]
struct OpenEpoch {
    index: u64,
    /// The node before the epoch's first command or batch.
    before: ServingNode,
    /// The α commands the node applied, in order.
    commands: Vec<RecordedCommand>,
    batches: Vec<RecordedBatch>,
    latencies: Vec<f64>,
    /// Requests the run served with a shortened history.
    truncated: u64,
}

/// Follows one node through a run and evaluates α* per epoch.
#[derive(Debug)]
pub struct OracleRecorder {
    epoch_ms: u64,
    grid: Vec<f64>,
    open: Option<OpenEpoch>,
    done: Vec<OracleEpoch>,
    /// The first reason the oracle could not run (then it stops).
    error: Option<String>,
}

impl OracleRecorder {
    pub fn new(epoch_ms: u64, grid: Vec<f64>) -> Self {
        Self {
            epoch_ms: epoch_ms.max(1),
            grid,
            open: None,
            done: Vec::new(),
            error: None,
        }
    }

    /// The node is about to act at event time `now_ms` (apply a command or
    /// serve a batch): at a new epoch the previous one is evaluated and the
    /// node copied.
    pub fn enter(
        &mut self,
        node: &ServingNode,
        now_ms: u64,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) {
        let epoch = now_ms / self.epoch_ms;
        if self.error.is_some() || self.open.as_ref().is_some_and(|o| o.index == epoch) {
            return;
        }
        self.close(catalog, index);
        match node.snapshot() {
            Ok(before) => {
                self.open = Some(OpenEpoch {
                    index: epoch,
                    before,
                    commands: Vec::new(),
                    batches: Vec::new(),
                    latencies: Vec::new(),
                    truncated: 0,
                })
            }
            Err(e) => self.error = Some(format!("node {}: {e}", node.id())),
        }
    }

    /// A command that moved α, just applied at event time `now_ms` (after
    /// [`OracleRecorder::enter`]): `alpha` is the α it asked for.
    pub fn command(&mut self, now_ms: u64, alpha: f64) {
        if let Some(o) = &mut self.open {
            o.commands.push(RecordedCommand { now_ms, alpha });
        }
    }

    /// A batch the node served, with the latencies of its requests that
    /// were answered and how many of those had their history shortened.
    pub fn record(&mut self, batch: RecordedBatch, latencies: &[f64], truncated: u64) {
        if let Some(o) = &mut self.open {
            o.batches.push(batch);
            o.latencies.extend_from_slice(latencies);
            o.truncated += truncated;
        }
    }

    /// Evaluates the open epoch, if it served anything.
    pub fn close(&mut self, catalog: &dyn ItemCatalog, index: &RetrievalIndex) {
        let Some(o) = self.open.take() else {
            return;
        };
        // The α of the epoch's last batch: the decision for the epoch.
        let Some(alpha) = o.batches.last().map(|b| b.alpha) else {
            return;
        };
        match self.evaluate(&o, alpha, catalog, index) {
            Ok(Some(epoch)) => self.done.push(epoch),
            Ok(None) => {}
            Err(e) => self.error = Some(format!("node {}: {e}", o.before.id())),
        }
    }

    fn evaluate(
        &self,
        o: &OpenEpoch,
        alpha: f64,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) -> Result<Option<OracleEpoch>, ServeError> {
        // Each grid α is moved to where the run first moved α in the epoch
        // or, without a command, where the allocator's would have landed:
        // the epoch's second millisecond (a decision made from the window
        // that closes at the epoch's start applies from there on, so a
        // batch at the epoch's first millisecond is served at the α before
        // it by every policy). Its refill gets the link from then on.
        let epoch_start_ms = o.index * self.epoch_ms;
        let move_ms = o.commands.first().map_or(epoch_start_ms + 1, |c| c.now_ms);
        let mut points = Vec::with_capacity(self.grid.len());
        for &a in &self.grid {
            let at = RecordedCommand {
                now_ms: move_ms,
                alpha: a,
            };
            let replayed = replay_epoch(&o.before, &[at], &o.batches, catalog, index)?;
            // No more changed answers than the run's.
            let eligible = replayed.filter(|r| r.truncated <= o.truncated);
            points.push((a, eligible.map(|r| r.p99_ms)));
        }
        let Some((alpha_star, p99_at_star_ms)) = alpha_star(&points) else {
            return Ok(None);
        };
        let at_alpha = replay_epoch(&o.before, &o.commands, &o.batches, catalog, index)?;
        let mut run = o.latencies.clone();
        run.sort_by(f64::total_cmp);
        let run_p99_ms = percentile(&run, 0.99);
        Ok(Some(OracleEpoch {
            node: o.before.id(),
            epoch_start_ms,
            requests: o
                .batches
                .iter()
                .map(|b| (b.rank.len() + b.retrieve.len()) as u64)
                .sum(),
            alpha,
            alpha_star,
            // The run failed a request: its own P99 stands for it.
            p99_at_alpha_ms: at_alpha.map_or(run_p99_ms, |r| r.p99_ms),
            p99_at_star_ms,
            run_p99_ms,
            truncated: o.truncated,
        }))
    }

    /// Every evaluated epoch (call [`OracleRecorder::close`] first for the
    /// last), or why the oracle could not run.
    pub fn take(&mut self) -> Result<Vec<OracleEpoch>, String> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(std::mem::take(&mut self.done)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{TestCatalog, test_params};

    fn index() -> RetrievalIndex {
        RetrievalIndex::new((0..60u32).map(|i| (i * 3, [(i % 16) as u16, 0, 0])), 16).unwrap()
    }

    fn cost() -> grflow_kernels::cost::CostModel {
        grflow_kernels::cost::CostModel {
            prefill_ms: [0.2, 0.01, 0.0],
            rank_ms: [0.3, 0.0, 0.0],
            beam_ms: [1.0, 0.0],
            ..grflow_kernels::cost::CostModel::given("small", 8, 8)
        }
    }

    /// Epochs of rank requests from a few returning users with long
    /// histories (so KV reuse and EMB hits both matter).
    /// [`batches`] of `epoch`, each `delay_ms` later (an epoch whose first
    /// batch comes well after its start).
    fn batches_after(epoch: u64, n: u64, delay_ms: u64) -> Vec<RecordedBatch> {
        let mut late = batches(epoch, n);
        late.iter_mut().for_each(|b| b.now_ms += delay_ms);
        late
    }

    fn batches(epoch: u64, n: u64) -> Vec<RecordedBatch> {
        (0..n)
            .map(|i| {
                let user = (i * 7 + epoch) % 12;
                let len = 40 + (user as usize * 13) % 80;
                RecordedBatch {
                    now_ms: epoch * 1000 + i * 10,
                    alpha: 0.0,
                    rank: vec![OwnedRank {
                        req_id: epoch * 1000 + i,
                        user_id: user,
                        candidates: (0..30).map(|c| ((c * 31 + i * 17) % 1900) as u32).collect(),
                        history: (0..len)
                            .map(|h| ((user * 101 + h as u64 * 13) % 1900) as u32)
                            .collect(),
                    }],
                    retrieve: Vec::new(),
                }
            })
            .collect()
    }

    fn node() -> ServingNode {
        node_with_pool(test_params().memory.pool_bytes)
    }

    fn node_with_pool(pool_bytes: u64) -> ServingNode {
        let mut params = test_params();
        params.memory.pool_bytes = pool_bytes;
        let mut node = ServingNode::new(0, params).unwrap();
        node.set_virtual(cost());
        node
    }

    #[test]
    fn ties_go_to_the_median_alpha_within_one_percent() {
        let points = [
            (0.0, None),
            (0.1, Some(5.0)),
            (0.2, Some(2.01)),
            (0.3, Some(2.0)),
            (0.4, Some(2.015)),
            (0.5, Some(2.5)),
        ];
        assert_eq!(alpha_star(&points), Some((0.3, 2.0)));
        let points = [(0.2, Some(2.01)), (0.3, Some(2.0)), (0.6, Some(2.0))];
        assert_eq!(alpha_star(&points), Some((0.3, 2.0)));
        // An even number of ties: the mean of the two middle αs, not the
        // lower one (which leans toward KV by half a step).
        let points = [
            (0.1, Some(3.0)),
            (0.2, Some(2.01)),
            (0.3, Some(2.0)),
            (0.4, Some(2.0)),
            (0.5, Some(2.015)),
            (0.6, Some(3.0)),
        ];
        let (star, p99) = alpha_star(&points).unwrap();
        assert!((star - 0.35).abs() < 1e-12, "{star}");
        assert!((p99 - 2.0).abs() < 1e-12, "{p99}");
        let (star, p99) = alpha_star(&[(0.2, Some(2.0)), (0.3, Some(2.01))]).unwrap();
        assert!((star - 0.25).abs() < 1e-12, "{star}");
        assert!((p99 - 2.005).abs() < 1e-12, "{p99}");
        assert_eq!(alpha_star(&[(0.5, None)]), None);
        assert_eq!(alpha_grid(0.01).len(), 101);
        assert_eq!(alpha_grid(0.1)[3], 0.3);
    }

    #[test]
    fn the_summary_averages_over_node_epochs_and_alpha_star_spread_per_node() {
        let e = |node, alpha, alpha_star, at_alpha, at_star| OracleEpoch {
            node,
            epoch_start_ms: 0,
            requests: 1,
            alpha,
            alpha_star,
            p99_at_alpha_ms: at_alpha,
            p99_at_star_ms: at_star,
            run_p99_ms: at_alpha,
            truncated: 0,
        };
        let s = OracleSummary::of(&[
            e(0, 0.2, 0.4, 3.0, 2.0),
            e(0, 0.2, 0.0, 2.0, 2.0),
            e(1, 0.5, 0.5, 1.0, 1.0),
        ])
        .unwrap();
        assert_eq!(s.epochs, 3);
        assert!((s.gap - 0.4 / 3.0).abs() < 1e-12, "{s:?}");
        assert!((s.regret_ms - 1.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert!((s.alpha_star_mean - 0.3).abs() < 1e-12, "{s:?}");
        // Node 0: α* 0.4 and 0.0 (std 0.2); node 1: one epoch (std 0).
        assert!((s.alpha_star_std - 0.1).abs() < 1e-12, "{s:?}");
        // Node 0's median α* 0.2 is 0.2 off each of its two epochs.
        assert!((s.gap_best_constant - 0.4 / 3.0).abs() < 1e-12, "{s:?}");
        // One step on node 0 (0.4 → 0.0), none on node 1.
        assert_eq!(s.gap_previous_star, Some(0.4));
        let one = OracleSummary::of(&[e(1, 0.5, 0.3, 1.0, 1.0)]).unwrap();
        assert_eq!(one.gap_previous_star, None);
        assert!((one.gap_best_constant).abs() < 1e-12);
        assert_eq!(OracleSummary::of(&[]), None);
    }

    #[test]
    fn a_snapshot_serves_like_the_node_it_was_copied_from() {
        let (catalog, index) = (TestCatalog::new(2000), index());
        let mut a = node();
        for b in batches(0, 30) {
            b.replay(&mut a, &catalog, &index, &mut Vec::new(), &mut 0)
                .unwrap();
        }
        a.set_alpha(0.3).unwrap();
        let mut b = a.snapshot().unwrap();
        let (mut la, mut lb) = (Vec::new(), Vec::new());
        for batch in batches(1, 30) {
            batch
                .replay(&mut a, &catalog, &index, &mut la, &mut 0)
                .unwrap();
            batch
                .replay(&mut b, &catalog, &index, &mut lb, &mut 0)
                .unwrap();
        }
        assert_eq!(la, lb);
        assert_eq!(a.counters(), b.counters());
        assert_eq!(a.memory_stats(), b.memory_stats());
        // A policy that learns online is refused by name.
        let mut p = test_params();
        p.memory.emb_policy = "laru".into();
        let e = ServingNode::new(0, p).unwrap().snapshot().unwrap_err();
        assert!(e.to_string().contains("emb_policy"), "{e}");
    }

    #[test]
    fn the_recorder_reproduces_the_run_at_its_alpha_and_finds_a_no_worse_alpha() {
        let (catalog, index) = (TestCatalog::new(2000), index());
        let mut run = node();
        let mut rec = OracleRecorder::new(1000, alpha_grid(0.1));
        for epoch in 0..3 {
            for (i, mut batch) in batches(epoch, 40).into_iter().enumerate() {
                rec.enter(&run, batch.now_ms, &catalog, &index);
                if i == 1 && epoch == 1 {
                    // The allocator's move after the epoch's first batch.
                    run.set_alpha_at(0.7, batch.now_ms).unwrap();
                    rec.command(batch.now_ms, 0.7);
                }
                let (mut lat, mut cut) = (Vec::new(), 0);
                batch.alpha = run.alpha();
                batch
                    .replay(&mut run, &catalog, &index, &mut lat, &mut cut)
                    .unwrap();
                rec.record(batch, &lat, cut);
            }
        }
        rec.close(&catalog, &index);
        let epochs = rec.take().unwrap();
        assert_eq!(epochs.len(), 3);
        for e in &epochs {
            assert_eq!(e.requests, 40);
            // The replay at the run's α is the run.
            assert_eq!(e.p99_at_alpha_ms, e.run_p99_ms, "{e:?}");
            assert!(
                e.p99_at_star_ms <= e.p99_at_alpha_ms * (1.0 + TIE_SHARE),
                "{e:?}"
            );
            assert!((0.0..=1.0).contains(&e.alpha_star));
        }
        assert!((epochs[1].alpha - 0.7).abs() < 0.01, "{:?}", epochs[1]);
        assert_eq!(epochs[2].epoch_start_ms, 2000);
    }

    #[test]
    fn an_epoch_whose_run_shortened_histories_is_judged_against_alphas_that_shorten_no_more() {
        let (catalog, index) = (TestCatalog::new(2000), index());
        let batches = batches(0, 40);
        // A pool this small holds the longer histories only in part (the
        // limit comes from the pool, not the α): each replay shortens the
        // same ones.
        const POOL: u64 = (1 << 18) * 7 / 10;
        let mut run = node_with_pool(POOL);
        run.set_alpha(0.3).unwrap();
        let mut rec = OracleRecorder::new(1000, alpha_grid(0.1));
        let mut cut_in_run = 0;
        for mut batch in batches.clone() {
            rec.enter(&run, batch.now_ms, &catalog, &index);
            let (mut lat, mut cut) = (Vec::new(), 0);
            batch.alpha = run.alpha();
            batch
                .replay(&mut run, &catalog, &index, &mut lat, &mut cut)
                .unwrap();
            cut_in_run += cut;
            rec.record(batch, &lat, cut);
        }
        rec.close(&catalog, &index);
        let e = rec.take().unwrap().remove(0);
        assert!(cut_in_run > 0);
        assert_eq!(e.truncated, cut_in_run);
        assert_eq!(e.p99_at_alpha_ms, e.run_p99_ms);
        assert!(
            e.p99_at_star_ms <= e.p99_at_alpha_ms * (1.0 + TIE_SHARE),
            "{e:?}"
        );
        // Every eligible α shortens no more histories than the run did
        // (moved to at the epoch's second millisecond: the run had no
        // command).
        let mut before = node_with_pool(POOL);
        before.set_alpha(0.3).unwrap();
        let star = RecordedCommand {
            now_ms: 1,
            alpha: e.alpha_star,
        };
        let star = replay_epoch(&before, &[star], &batches, &catalog, &index)
            .unwrap()
            .unwrap();
        assert!(star.truncated <= cut_in_run, "{star:?}");
    }

    /// Serves `batch` on `run` as the node wrapper does, telling `rec`.
    fn serve(
        run: &mut ServingNode,
        rec: &mut OracleRecorder,
        mut batch: RecordedBatch,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) {
        rec.enter(run, batch.now_ms, catalog, index);
        let (mut lat, mut cut) = (Vec::new(), 0);
        batch.alpha = run.alpha();
        batch
            .replay(run, catalog, index, &mut lat, &mut cut)
            .unwrap();
        rec.record(batch, &lat, cut);
    }

    /// A `SetAlpha` stamped `now_ms` as the node wrapper applies it.
    fn command(
        run: &mut ServingNode,
        rec: &mut OracleRecorder,
        now_ms: u64,
        alpha: f64,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) {
        rec.enter(run, now_ms, catalog, index);
        run.apply(&crate::node::NodeCommand::SetAlpha(alpha), now_ms)
            .unwrap();
        rec.command(now_ms, alpha);
    }

    #[test]
    fn a_command_that_grows_alpha_is_replayed_at_its_own_time_with_its_refill() {
        let (catalog, index) = (TestCatalog::new(2000), index());
        let mut run = node_with_pool(1 << 20);
        run.set_alpha(0.6).unwrap();
        let mut rec = OracleRecorder::new(1000, alpha_grid(0.1));
        for batch in batches(0, 40) {
            serve(&mut run, &mut rec, batch, &catalog, &index);
        }
        // Shrinking α evicts EMB rows: what a growing share refills.
        let shrunk = run.set_alpha_at(0.1, 500).unwrap();
        assert!(shrunk.emb_rows_evicted > 100, "{shrunk:?}");
        // The allocator's move at the epoch's second millisecond; the
        // epoch's first batch comes 199 ms later, the refill running
        // meanwhile on the idle link.
        command(&mut run, &mut rec, 1001, 0.7, &catalog, &index);
        for batch in batches_after(1, 40, 200) {
            serve(&mut run, &mut rec, batch, &catalog, &index);
        }
        let o = rec.open.as_ref().unwrap();
        assert_eq!(
            o.commands,
            [RecordedCommand {
                now_ms: 1001,
                alpha: 0.7
            }]
        );
        assert!(o.before.alpha() < 0.11, "copied before the command");
        let replayed = replay_served(&o.before, &o.commands, &o.batches, &catalog, &index)
            .unwrap()
            .unwrap();
        // Request by request, and row by row: the refill placed as many
        // rows before each batch as in the run.
        assert_eq!(replayed.latencies, o.latencies);
        assert_eq!(replayed.node.counters().emb_hits, run.counters().emb_hits);
        assert_eq!(replayed.node.counters(), run.counters());
        assert_eq!(replayed.node.memory_stats(), run.memory_stats());
        // The grid's α at the run's own α is moved at the command's time
        // too: the same requests, the same latencies.
        let at = RecordedCommand {
            now_ms: 1001,
            alpha: 0.7,
        };
        let grid = replay_served(&o.before, &[at], &o.batches, &catalog, &index)
            .unwrap()
            .unwrap();
        assert_eq!(grid.latencies, o.latencies);
        rec.close(&catalog, &index);
        let epochs = rec.take().unwrap();
        assert_eq!(epochs.len(), 2);
        for e in &epochs {
            assert_eq!(e.p99_at_alpha_ms, e.run_p99_ms, "{e:?}");
        }
    }

    #[test]
    fn without_a_command_a_grid_alpha_moves_at_the_epochs_second_millisecond() {
        let (catalog, index) = (TestCatalog::new(2000), index());
        let mut run = node_with_pool(1 << 20);
        run.set_alpha(0.6).unwrap();
        let mut rec = OracleRecorder::new(1000, alpha_grid(0.1));
        for batch in batches(0, 40) {
            serve(&mut run, &mut rec, batch, &catalog, &index);
        }
        command(&mut run, &mut rec, 500, 0.1, &catalog, &index);
        // No command in epoch 1: its grid replay at 0.7 is the run that
        // moved there at 1001 ms (the allocator's time), not one that
        // moved at the first batch.
        let late = batches_after(1, 40, 200);
        let mut moved = run.snapshot().unwrap();
        for batch in late.clone() {
            serve(&mut run, &mut rec, batch, &catalog, &index);
        }
        let o = rec.open.as_ref().unwrap();
        assert!(o.commands.is_empty());
        let mut rec_moved = OracleRecorder::new(1000, alpha_grid(0.1));
        command(&mut moved, &mut rec_moved, 1001, 0.7, &catalog, &index);
        for batch in late {
            serve(&mut moved, &mut rec_moved, batch, &catalog, &index);
        }
        let want = rec_moved.open.as_ref().unwrap();
        let move_ms = o.index * 1000 + 1;
        let at = RecordedCommand {
            now_ms: move_ms,
            alpha: 0.7,
        };
        let grid = replay_served(&o.before, &[at], &o.batches, &catalog, &index)
            .unwrap()
            .unwrap();
        assert_eq!(grid.latencies, want.latencies);
        assert_eq!(grid.node.counters(), moved.counters());
    }
}
