//! Which checkpoint `train-allocator` writes: each scored checkpoint's
//! greedy p99 (the policy as `ppo-only` serves it, from the config's α),
//! the best so far, and the last few kept for `--average-last`.

use std::collections::BTreeMap;

use anyhow::Context;
use grflow_operators::allocator::ppo::ActorCritic;
use grflow_pipeline::{ReplayOptions, TraceInput};

use super::SelectBy;
use super::episodes::{EpisodeTrace, episode_error};

/// The greedy policy's mean p99 (ms) over the training traces, overall and
/// per regime.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Greedy {
    pub(super) mean: f64,
    pub(super) by_regime: BTreeMap<String, f64>,
}

impl Greedy {
    /// The score selection minimises: the mean p99, or the worst regime's
    /// p99 over `untrained`'s in that regime.
    pub(super) fn score(&self, by: SelectBy, untrained: &Greedy) -> f64 {
        if by == SelectBy::Mean {
            return self.mean;
        }
        // NaN (never selected) when a regime has no reference or no p99.
        let mut worst = f64::NEG_INFINITY;
        for (regime, p99) in &self.by_regime {
            let ratio = match untrained.by_regime.get(regime) {
                Some(&u) if u > 0.0 => p99 / u,
                _ => return f64::NAN,
            };
            if ratio.is_nan() {
                return f64::NAN;
            }
            worst = worst.max(ratio);
        }
        worst
    }
}

/// The best checkpoint so far (PPO updates behind it, greedy mean p99,
/// the checkpoint): lowest p99, the earlier on ties.
#[derive(Debug)]
pub(super) struct Selection<T> {
    pub(super) best: Option<(usize, f64, T)>,
}

impl<T> Selection<T> {
    pub(super) fn new() -> Self {
        Self { best: None }
    }

    /// Offers the checkpoint after `updates` PPO updates, taken (`take`)
    /// only when it is the new best (a NaN score never is).
    pub(super) fn offer(&mut self, updates: usize, p99_ms: f64, take: impl FnOnce() -> T) -> bool {
        let better = p99_ms.is_finite() && self.best.as_ref().is_none_or(|b| p99_ms < b.1);
        if better {
            self.best = Some((updates, p99_ms, take()));
        }
        better
    }
}

/// The checkpoints of one training: each scored greedily on the selection
/// traces against the untrained policy's p99s (the first scored), the best
/// so far, and the last `--average-last` for their mean.
pub(super) struct Checkpoints<'a> {
    base: &'a grflow_pipeline::Config,
    traces: &'a [EpisodeTrace],
    work: &'a std::path::Path,
    select_by: SelectBy,
    /// The selection traces, in words (the log says what it scored on).
    select_on: &'a str,
    average_last: usize,
    /// The untrained policy's greedy p99s: α held at the config's.
    untrained: Option<Greedy>,
    /// The best: (policy, its greedy mean p99).
    selection: Selection<(ActorCritic, f64)>,
    /// The last `average_last` scored.
    scored: Vec<(usize, ActorCritic)>,
    /// PPO updates behind the last one scored.
    last_scored: Option<usize>,
}

impl<'a> Checkpoints<'a> {
    /// No checkpoint scored yet; each will be scored on `traces` (described
    /// as `select_on` in the log), replayed from `base` in `work`.
    pub(super) fn new(
        base: &'a grflow_pipeline::Config,
        traces: &'a [EpisodeTrace],
        work: &'a std::path::Path,
        select_by: SelectBy,
        select_on: &'a str,
        average_last: usize,
    ) -> Self {
        Self {
            base,
            traces,
            work,
            select_by,
            select_on,
            average_last,
            untrained: None,
            selection: Selection::new(),
            scored: Vec::new(),
            last_scored: None,
        }
    }

    /// PPO updates behind the last checkpoint scored, if any was.
    pub(super) fn last_scored(&self) -> Option<usize> {
        self.last_scored
    }

    /// The best checkpoint: (PPO updates behind it, its selection score,
    /// (the policy, its greedy mean p99)); none when none scored finite.
    pub(super) fn into_best(self) -> Option<(usize, f64, (ActorCritic, f64))> {
        self.selection.best
    }

    /// Scores `policy` (named `what` in the log) on the selection traces.
    fn score(&mut self, what: &str, policy: &ActorCritic) -> anyhow::Result<(Greedy, f64)> {
        let g = greedy_p99(self.base, self.traces, policy, self.work)?;
        let reference = self.untrained.get_or_insert_with(|| g.clone());
        let score = g.score(self.select_by, reference);
        eprintln!(
            "{what}: mean p99 {:.4} ms on the {} ({}), selection score {score:.4}",
            g.mean,
            self.select_on,
            g.by_regime
                .iter()
                .map(|(r, p)| format!("{r} {p:.4}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok((g, score))
    }

    /// Scores `policy` after `updates` PPO updates, offers it to the
    /// selection and keeps it among the recent ones.
    pub(super) fn offer(
        &mut self,
        updates: usize,
        policy: &ActorCritic,
    ) -> anyhow::Result<(Greedy, f64)> {
        let (g, score) = self.score(&format!("greedy policy after {updates} updates"), policy)?;
        self.selection
            .offer(updates, score, || (policy.clone(), g.mean));
        keep_recent(&mut self.scored, self.average_last, updates, policy);
        self.last_scored = Some(updates);
        Ok((g, score))
    }

    /// The parameter mean of the recent checkpoints, offered like the
    /// others (as after `updates`): the updates behind its members when it
    /// is the new best.
    pub(super) fn offer_average(&mut self, updates: usize) -> anyhow::Result<Option<Vec<usize>>> {
        if self.average_last < 2 || self.scored.len() < 2 {
            return Ok(None);
        }
        let members: Vec<usize> = self.scored.iter().map(|(u, _)| *u).collect();
        let nets: Vec<&ActorCritic> = self.scored.iter().map(|(_, p)| p).collect();
        let avg = ActorCritic::average(&nets).context("averaging checkpoints of one shape")?;
        let (g, score) = self.score(
            &format!("mean of the checkpoints after {members:?} updates"),
            &avg,
        )?;
        Ok(self
            .selection
            .offer(updates, score, || (avg, g.mean))
            .then_some(members))
    }
}

/// Keeps the last `n` scored checkpoints (none when `n` < 2: nothing is
/// averaged), `policy` after `updates` updates being the newest.
pub(super) fn keep_recent(
    scored: &mut Vec<(usize, ActorCritic)>,
    n: usize,
    updates: usize,
    policy: &ActorCritic,
) {
    if n < 2 {
        return;
    }
    scored.push((updates, policy.clone()));
    if scored.len() > n {
        scored.remove(0);
    }
}

/// Mean p99 (ms) of `policy` taken greedily (`ppo-only`, no sampling) over
/// `traces`, each from the config's α (what a deployment of it would see),
/// overall and per regime.
pub(super) fn greedy_p99(
    base: &grflow_pipeline::Config,
    traces: &[EpisodeTrace],
    policy: &ActorCritic,
    work: &std::path::Path,
) -> anyhow::Result<Greedy> {
    let path = work.join("greedy.safetensors");
    std::fs::write(&path, policy.to_safetensors())
        .with_context(|| format!("writing {}", path.display()))?;
    let mut by_regime: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for (regime, _, trace) in traces {
        let mut cfg = base.clone();
        cfg.allocator.sample = false;
        cfg.allocator.policy_file = path.display().to_string();
        let out =
            grflow_pipeline::replay(ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg))
                .map_err(|e| episode_error(e, "greedy evaluation episode"))?;
        let e = by_regime.entry(regime.clone()).or_default();
        e.0 += (out.summary.latency_ms.as_ref())
            .context("a greedy evaluation episode answered no request: no p99")?
            .p99;
        e.1 += 1;
    }
    let total: f64 = by_regime.values().map(|(sum, _)| sum).sum();
    Ok(Greedy {
        mean: total / traces.len().max(1) as f64,
        by_regime: by_regime
            .into_iter()
            .map(|(r, (sum, n))| (r, sum / n as f64))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy(mean: f64, by_regime: &[(&str, f64)]) -> Greedy {
        Greedy {
            mean,
            by_regime: by_regime.iter().map(|(r, p)| (r.to_string(), *p)).collect(),
        }
    }

    #[test]
    fn worst_regime_scores_the_regime_that_lost_most_against_static_alpha() {
        let untrained = greedy(0.05, &[("burst", 0.06), ("steady", 0.04), ("trend", 0.05)]);
        // Burst 25% better, trend 10% worse: the mean improves, the worst
        // regime does not.
        let split = greedy(
            0.047,
            &[("burst", 0.045), ("steady", 0.04), ("trend", 0.055)],
        );
        assert!(
            split.score(SelectBy::Mean, &untrained) < untrained.score(SelectBy::Mean, &untrained)
        );
        assert!((split.score(SelectBy::WorstRegime, &untrained) - 1.1).abs() < 1e-9);
        assert_eq!(untrained.score(SelectBy::WorstRegime, &untrained), 1.0);
        // Better everywhere scores under 1.
        let better = greedy(
            0.045,
            &[("burst", 0.054), ("steady", 0.036), ("trend", 0.045)],
        );
        assert!((better.score(SelectBy::WorstRegime, &untrained) - 0.9).abs() < 1e-9);
        // A regime the reference lacks, or a NaN p99, makes no score that
        // selection could take (it never takes a NaN).
        let odd = greedy(0.05, &[("burst", f64::NAN), ("steady", 0.04)]);
        assert!(odd.score(SelectBy::WorstRegime, &untrained).is_nan());
        let unknown = greedy(0.05, &[("paper", 0.01)]);
        assert!(unknown.score(SelectBy::WorstRegime, &untrained).is_nan());
    }

    #[test]
    fn selection_keeps_the_lowest_p99_and_the_earlier_on_ties() {
        let mut s = Selection::new();
        assert!(s.offer(0, 0.060, || "c0"));
        assert!(!s.offer(5, 0.071, || "c5"), "worse");
        assert!(s.offer(10, 0.055, || "c10"));
        assert!(!s.offer(15, 0.055, || "c15"), "a tie keeps the earlier");
        assert!(!s.offer(20, f64::NAN, || "c20"), "NaN never wins");
        assert_eq!(s.best, Some((10, 0.055, "c10")));
        let mut first_nan = Selection::new();
        assert!(!first_nan.offer(0, f64::NAN, || "c0"));
        assert!(first_nan.offer(5, 0.1, || "c5"));
        assert_eq!(first_nan.best, Some((5, 0.1, "c5")));
    }
}
