//! What `grflow bench allocator` reports: one row per (regime, policy) run,
//! the sweep's points, per-seed and over-seeds reports, and their tables.

use std::collections::BTreeMap;

use grflow_operators::allocator::AllocatorPolicy;
use grflow_operators::allocator::oracle::OracleSummary;
use grflow_pipeline::dataflow::allocator::AllocatorSummary;
use grflow_pipeline::replay::ReplayOutput;
use serde::Serialize;

use super::Run;

#[derive(Debug, Serialize)]
pub(super) struct Row {
    pub(super) regime: String,
    pub(super) policy: String,
    /// α the run started at (kv-emb-opt: the sweep's best on the training
    /// seeds; the `-node` rows: the mean of `node_alpha`).
    pub(super) alpha_start: f64,
    /// The per-node split the run held (kv-emb-opt-node) or started from
    /// (ppo-only-node, smart-node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) node_alpha: Option<Vec<f64>>,
    pub(super) p99_ms: f64,
    pub(super) p50_ms: f64,
    pub(super) slo_satisfaction: f64,
    pub(super) alpha_moves: u64,
    /// Wall time of a decision (`None`: the policy makes none, or made
    /// none in this run: no window had `allocator.min_requests`).
    pub(super) decision_us_mean: Option<f64>,
    pub(super) decision_us_p99: Option<f64>,
    /// The `pid` row's gains (its other rows: `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) pid_gains: Option<PidGains>,
    /// 1 − p99 / p99 of kv-emb-opt (positive: lower p99); `None` when
    /// either run does not compare (see `comparable`), as in the means.
    pub(super) p99_reduction_vs_kv_emb_opt: Option<f64>,
    /// Mean |α − α*| over node-epochs (the oracle's; `None` without it).
    pub(super) oracle_gap: Option<f64>,
    /// Mean over node-epochs of the replayed P99 at the run's α minus the
    /// P99 at α*.
    pub(super) p99_regret_ms: Option<f64>,
    /// Std of α* over epochs (per node, averaged over nodes).
    pub(super) alpha_star_std: Option<f64>,
    /// The gap of the best constant α in hindsight (per node the median
    /// α* of this run): the gap left when α* is jitter around a level.
    pub(super) oracle_gap_best_constant: Option<f64>,
    /// The gap of a controller that knew the previous epoch's α* exactly.
    pub(super) oracle_gap_previous_star: Option<f64>,
    /// Node-epochs the oracle evaluated.
    pub(super) oracle_epochs: u64,
    /// Requests served with a shortened history because the policy left
    /// too little KV share to hold it: such a run's P99 is lower because
    /// its answers use less of the history, so it does not compare with
    /// runs at 0.
    pub(super) truncated_histories: u64,
    /// Requests that got no answer (a run that drops requests has a lower
    /// P99 for it: not comparable).
    pub(super) failed_requests: u64,
    /// Requests that did not fit the KV share alone, served after the node
    /// took pages back from EMB (α lowered on demand).
    pub(super) kv_reclaims: u64,
}

impl Row {
    /// The row of one policy's run on the bench trace, without its
    /// reduction (see `reduction_vs`).
    pub(super) fn of(regime: &str, run: Run, out: &ReplayOutput) -> anyhow::Result<Self> {
        let Run {
            label,
            policy,
            alpha,
            node_alpha,
            gains: pid_gains,
        } = run;
        let oracle = OracleSummary::of(&out.oracle);
        let s = &out.summary;
        let alloc = s.allocator.as_ref();
        let timed = timed(policy, alloc);
        let no_response = || anyhow::anyhow!("{regime} {label}: the run answered no request");
        let latency = s.latency_ms.as_ref().ok_or_else(no_response)?;
        Ok(Row {
            regime: regime.into(),
            policy: label.into(),
            alpha_start: if policy == AllocatorPolicy::KvOpt {
                0.0
            } else {
                alpha
            },
            node_alpha,
            p99_ms: latency.p99,
            p50_ms: latency.p50,
            slo_satisfaction: s.slo_satisfaction.ok_or_else(no_response)?,
            alpha_moves: alloc.map_or(0, |a| a.alpha_moves),
            decision_us_mean: timed.map(|a| a.decision_us_mean),
            decision_us_p99: timed.map(|a| a.decision_us_p99),
            pid_gains,
            p99_reduction_vs_kv_emb_opt: None,
            oracle_gap: oracle.as_ref().map(|o| o.gap),
            p99_regret_ms: oracle.as_ref().map(|o| o.regret_ms),
            alpha_star_std: oracle.as_ref().map(|o| o.alpha_star_std),
            oracle_gap_best_constant: oracle.as_ref().map(|o| o.gap_best_constant),
            oracle_gap_previous_star: oracle.as_ref().and_then(|o| o.gap_previous_star),
            oracle_epochs: out.oracle.len() as u64,
            truncated_histories: s.truncated_histories,
            failed_requests: s.errors,
            kv_reclaims: kv_reclaims(s),
        })
    }

    /// No request failed and no history was cut: its P99 compares with
    /// other runs'.
    pub(super) fn comparable(&self) -> bool {
        self.failed_requests == 0 && self.truncated_histories == 0
    }

    /// 1 − p99 / p99 of `reference` (kv-emb-opt's run, or this one), when
    /// both runs compare.
    pub(super) fn reduction_vs(&self, reference: &Row) -> Option<f64> {
        (self.comparable() && reference.comparable())
            .then(|| 1.0 - self.p99_ms / reference.p99_ms.max(1e-9))
    }

    /// The progress line of the run, which took `wall_s`.
    pub(super) fn line(&self, wall_s: f64) -> String {
        format!(
            "{} {:>10}: p99 {:.4} ms, SLO {:.1}%, alpha moves {}, KV reclaims {}{}{}{} ({wall_s:.0} s)",
            self.regime,
            self.policy,
            self.p99_ms,
            self.slo_satisfaction * 100.0,
            self.alpha_moves,
            self.kv_reclaims,
            if self.failed_requests > 0 {
                format!(
                    ", {} failed requests (not comparable)",
                    self.failed_requests
                )
            } else {
                String::new()
            },
            if self.truncated_histories > 0 {
                format!(
                    ", {} truncated histories (answers changed: not comparable)",
                    self.truncated_histories
                )
            } else {
                String::new()
            },
            match (
                self.oracle_gap,
                self.oracle_gap_best_constant,
                self.p99_regret_ms,
                self.alpha_star_std
            ) {
                (Some(gap), Some(constant), Some(regret), Some(std)) => format!(
                    ", oracle gap {gap:.3} (best constant {constant:.3}), p99 regret {regret:.3} ms, \
                     alpha* std {std:.3}"
                ),
                _ => String::new(),
            },
        )
    }
}

#[derive(Debug, Serialize)]
pub(super) struct SweepPoint {
    pub(super) regime: String,
    pub(super) alpha: f64,
    pub(super) p99_ms: f64,
    /// Mean over the training seeds.
    pub(super) train_p99_ms: f64,
    /// Requests served with a shortened history (past the model's positions
    /// or half the pool, whatever α; such a run's answers differ, so
    /// kv-emb-opt never picks it).
    pub(super) truncated_histories: u64,
    /// Times a request took pages back from EMB because the KV share could
    /// not hold it: α went down on demand, so a high static α does not stay
    /// where it was set.
    pub(super) kv_reclaims: u64,
}

/// What every report of the bench starts with.
#[derive(Debug, Serialize)]
pub(super) struct Header {
    pub(super) clock: &'static str,
    pub(super) preset: String,
    /// The machine the cost model was fitted on, and its GEMM rate: every
    /// figure of the virtual clock (P99, SLO, α) depends on these only.
    pub(super) machine: String,
    pub(super) gemm_gflops: f64,
    /// What the runs charge a request besides the model (`overhead_ms`)
    /// and of that the node's busy time, after `cost.overhead_scale`; and
    /// `cost.compute_scale` on the model's time.
    pub(super) overhead_ms: f64,
    pub(super) occupancy_ms: f64,
    pub(super) compute_scale: f64,
    /// The longest prompt the cost model was timed at, when the config's
    /// histories are longer (they are charged by extrapolation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) extrapolated_past_tokens: Option<usize>,
    /// The machine this bench ran on and its GEMM rate, measured after the
    /// runs: the wall-clock figures (`decision_us_*`, `wall_s`) are its.
    pub(super) host_machine: String,
    pub(super) host_gemm_gflops: f64,
    pub(super) slo_ms: f64,
    /// The PPO policy of the `ppo-only` and `smart` rows.
    pub(super) policy_file: Option<String>,
    pub(super) requests_per_run: u64,
    /// Training traces of the sweeps: seeds seed + 1 … seed + this.
    pub(super) train_seeds: u64,
    /// The oracle's α grid step (`None`: not run).
    pub(super) oracle_step: Option<f64>,
}

/// One bench seed's runs.
#[derive(Debug, Serialize)]
pub(super) struct SeedReport {
    pub(super) seed: u64,
    pub(super) rows: Vec<Row>,
    pub(super) sweep: Vec<SweepPoint>,
    /// Per regime: the std over epochs of the per-epoch best static α.
    pub(super) sweep_alpha_star_std: BTreeMap<String, f64>,
    /// Per regime (`--node-sweep`): the per-node split kv-emb-opt-node holds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) node_sweep: BTreeMap<String, NodeSweep>,
    /// Per regime: why there is no kv-emb-opt row (no static α served the
    /// training traces whole), when there is none after a sweep.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) kv_emb_opt_missing: BTreeMap<String, String>,
    pub(super) wall_s: f64,
}

/// `--seed` (one seed): the header and that seed's runs, side by side.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    #[serde(flatten)]
    pub(super) header: Header,
    #[serde(flatten)]
    pub(super) seed: SeedReport,
}

/// `--seeds`: every seed's runs and their means.
#[derive(Debug, Serialize)]
pub(super) struct SeedsReport {
    #[serde(flatten)]
    pub(super) header: Header,
    pub(super) seeds: Vec<u64>,
    /// Per regime and policy, over the seeds.
    pub(super) mean: Vec<MeanRow>,
    pub(super) per_seed: Vec<SeedReport>,
    pub(super) wall_s: f64,
}

/// One (regime, policy) over the seeds of a `--seeds` run.
#[derive(Debug, Serialize)]
pub(super) struct MeanRow {
    pub(super) regime: String,
    pub(super) policy: String,
    /// Seeds that ran it.
    pub(super) seeds: usize,
    /// Of those, runs left out of the P99 figures (not of the SLO minimum
    /// or decision times): requests failed or histories cut, so their P99
    /// does not compare.
    pub(super) seeds_not_comparable: usize,
    /// Over the comparable seeds (`None` when none).
    pub(super) p99_ms_mean: Option<f64>,
    /// Over the seeds whose run had a kv-emb-opt row (`--sweep`).
    pub(super) p99_reduction_vs_kv_emb_opt_mean: Option<f64>,
    pub(super) p99_reduction_vs_kv_emb_opt_min: Option<f64>,
    pub(super) p99_reduction_vs_kv_emb_opt_max: Option<f64>,
    /// Seeds on which its P99 was below `static`'s (not for `static`), of
    /// `seeds_compared_with_static` (both runs comparable).
    pub(super) seeds_below_static: Option<usize>,
    pub(super) seeds_compared_with_static: usize,
    pub(super) slo_satisfaction_min: f64,
    /// Over the seeds (`None`: the policy makes no decisions).
    pub(super) decision_us_p99_max: Option<f64>,
    pub(super) oracle_gap_mean: Option<f64>,
    /// Over the seeds whose run had the oracle, like `oracle_gap_mean`.
    pub(super) p99_regret_ms_mean: Option<f64>,
    pub(super) alpha_star_std_mean: Option<f64>,
}

/// The `pid` row's gains on the error (p99 − τ_SLO) / τ_SLO.
#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct PidGains {
    pub(super) kp: f64,
    pub(super) ki: f64,
    pub(super) kd: f64,
    /// Picked by grid search on the training seeds (`--sweep`), else the
    /// config's `allocator.kp`/`ki`/`kd`.
    pub(super) searched: bool,
    /// The mean P99 they gave on the training seeds (when searched).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) train_p99_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(super) struct NodeSweep {
    /// One α per node, node 0 first: paste as `memory.node_alpha`.
    pub(super) node_alpha: Vec<f64>,
    /// Its mean P99 on the training seeds, against the best single α's.
    pub(super) train_p99_ms: f64,
    pub(super) train_p99_ms_single_alpha: f64,
    /// Splits scored (each one replay per training seed).
    pub(super) evaluations: usize,
    /// `grid` (every split) or `coordinate descent` (`rounds` of it).
    pub(super) method: &'static str,
    pub(super) rounds: usize,
}

impl NodeSweep {
    /// The rows' `alpha_start` for a run from this split.
    pub(super) fn mean_alpha(&self) -> f64 {
        self.node_alpha.iter().sum::<f64>() / self.node_alpha.len() as f64
    }
}

/// The allocator's figures of a run whose decision times mean something:
/// static and kv-opt hold α and time no decision, and a deciding policy
/// that met no window with `allocator.min_requests` timed none either
/// (its summary's 0 µs is no measurement).
fn timed(policy: AllocatorPolicy, alloc: Option<&AllocatorSummary>) -> Option<&AllocatorSummary> {
    let decides = matches!(
        policy,
        AllocatorPolicy::Pid | AllocatorPolicy::PpoOnly | AllocatorPolicy::Smart
    );
    alloc.filter(|a| decides && a.decisions > 0)
}

/// A row of `--json`'s array: the seed it ran on beside its figures.
#[derive(Debug, Serialize)]
pub(super) struct SeedRow<'a> {
    pub(super) seed: u64,
    #[serde(flatten)]
    pub(super) row: &'a Row,
}

/// `--json`: one row per (regime, policy) of every seed, seed by seed.
pub(super) fn rows_array<'a>(seeds: impl IntoIterator<Item = &'a SeedReport>) -> Vec<SeedRow<'a>> {
    seeds
        .into_iter()
        .flat_map(|s| s.rows.iter().map(|row| SeedRow { seed: s.seed, row }))
        .collect()
}

/// Per (regime, policy), in the order the rows came, the figures over
/// every seed that ran it.
pub(super) fn mean_rows(per_seed: &[SeedReport]) -> Vec<MeanRow> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in per_seed.iter().flat_map(|s| &s.rows) {
        if !keys.contains(&(r.regime.as_str(), r.policy.as_str())) {
            keys.push((r.regime.as_str(), r.policy.as_str()));
        }
    }
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    keys.into_iter()
        .map(|(regime, policy)| {
            let mut p99 = Vec::new();
            let mut reductions = Vec::new();
            let mut gaps = Vec::new();
            let mut regrets = Vec::new();
            let mut star_stds = Vec::new();
            let mut slo_min = f64::INFINITY;
            let mut decision_max: Option<f64> = None;
            let mut below_static = 0;
            let mut with_static = 0;
            let (mut seeds, mut not_comparable) = (0, 0);
            for s in per_seed {
                let find = |p: &str| s.rows.iter().find(|r| r.regime == regime && r.policy == p);
                let Some(r) = find(policy) else { continue };
                seeds += 1;
                slo_min = slo_min.min(r.slo_satisfaction);
                if let Some(d) = r.decision_us_p99 {
                    decision_max = Some(decision_max.map_or(d, |m| m.max(d)));
                }
                if !r.comparable() {
                    not_comparable += 1;
                    continue;
                }
                p99.push(r.p99_ms);
                // Only against a reference run that compares too.
                if find("kv-emb-opt").is_none_or(Row::comparable) {
                    reductions.extend(r.p99_reduction_vs_kv_emb_opt);
                }
                gaps.extend(r.oracle_gap);
                regrets.extend(r.p99_regret_ms);
                star_stds.extend(r.alpha_star_std);
                if let Some(st) = find("static").filter(|st| st.comparable()) {
                    with_static += 1;
                    below_static += usize::from(r.p99_ms < st.p99_ms);
                }
            }
            let bound = |f: fn(f64, f64) -> f64| reductions.iter().copied().reduce(f);
            MeanRow {
                regime: regime.into(),
                policy: policy.into(),
                seeds,
                seeds_not_comparable: not_comparable,
                p99_ms_mean: mean(&p99),
                p99_reduction_vs_kv_emb_opt_mean: mean(&reductions),
                p99_reduction_vs_kv_emb_opt_min: bound(f64::min),
                p99_reduction_vs_kv_emb_opt_max: bound(f64::max),
                seeds_below_static: (policy != "static" && with_static > 0).then_some(below_static),
                seeds_compared_with_static: with_static,
                slo_satisfaction_min: slo_min,
                decision_us_p99_max: decision_max,
                oracle_gap_mean: mean(&gaps),
                p99_regret_ms_mean: mean(&regrets),
                alpha_star_std_mean: mean(&star_stds),
            }
        })
        .collect()
}

impl Header {
    /// Where the figures come from: the cost model's machine (every
    /// virtual-clock figure) and this one (decision times).
    pub(super) fn machines_line(&self) -> String {
        format!(
            "cost model from {} (GEMM {:.1} GFLOP/s); decision times measured here, on {} (GEMM \
             {:.1} GFLOP/s)",
            self.machine, self.gemm_gflops, self.host_machine, self.host_gemm_gflops
        )
    }
}

/// One seed's runs as a table on stdout (without `--json`).
pub(super) fn print_table(header: &Header, report: &SeedReport) {
    println!(
        "{:<8} {:<11} {:>6} {:>9} {:>7} {:>6} {:>7} {:>9} {:>10} {:>8}",
        "regime",
        "policy",
        "alpha0",
        "p99 ms",
        "SLO %",
        "moves",
        "gap",
        "gap const",
        "regret ms",
        "a* std"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for r in &report.rows {
        println!(
            "{:<8} {:<11} {:>6.2} {:>9.4} {:>7.1} {:>6} {:>7} {:>9} {:>10} {:>8}",
            r.regime,
            r.policy,
            r.alpha_start,
            r.p99_ms,
            r.slo_satisfaction * 100.0,
            r.alpha_moves,
            opt(r.oracle_gap),
            opt(r.oracle_gap_best_constant),
            opt(r.p99_regret_ms),
            opt(r.alpha_star_std)
        );
    }
    for (regime, std) in &report.sweep_alpha_star_std {
        println!("{regime}: per-epoch best static alpha, std over epochs {std:.3}");
    }
    for (regime, why) in &report.kv_emb_opt_missing {
        println!("{regime}: {why}");
    }
    for (regime, s) in &report.node_sweep {
        println!(
            "{regime}: best per-node split on the training seeds: node_alpha = {:?}",
            s.node_alpha
        );
    }
    println!("{}, {:.0} s", header.machines_line(), report.wall_s);
}

/// The means over the seeds as a table on stdout (without `--json`).
pub(super) fn print_means(report: &SeedsReport) {
    let seeds: Vec<String> = report.seeds.iter().map(u64::to_string).collect();
    println!("mean over seeds {}:", seeds.join(", "));
    println!(
        "{:<8} {:<15} {:>10} {:>22} {:>13} {:>9} {:>8} {:>10}",
        "regime",
        "policy",
        "p99 ms",
        "under kv-emb-opt",
        "below static",
        "SLO min",
        "gap",
        "regret ms"
    );
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
    for m in &report.mean {
        let under = match m.p99_reduction_vs_kv_emb_opt_mean {
            Some(_) => format!(
                "{} ({} to {})",
                pct(m.p99_reduction_vs_kv_emb_opt_mean),
                pct(m.p99_reduction_vs_kv_emb_opt_min),
                pct(m.p99_reduction_vs_kv_emb_opt_max)
            ),
            None => "-".into(),
        };
        let below = m.seeds_below_static.map_or("-".to_string(), |n| {
            format!("{n} of {}", m.seeds_compared_with_static)
        });
        println!(
            "{:<8} {:<15} {:>10} {:>22} {:>13} {:>8.1}% {:>8} {:>10}",
            m.regime,
            m.policy,
            m.p99_ms_mean.map_or("-".to_string(), |p| format!("{p:.4}")),
            under,
            below,
            m.slo_satisfaction_min * 100.0,
            m.oracle_gap_mean
                .map_or("-".to_string(), |g| format!("{g:.3}")),
            m.p99_regret_ms_mean
                .map_or("-".to_string(), |r| format!("{r:.4}"))
        );
        if m.seeds_not_comparable > 0 {
            println!(
                "         ({} of {} seeds left out: requests failed or histories cut)",
                m.seeds_not_comparable, m.seeds
            );
        }
    }
    println!(
        "{} seeds in {:.0} s on {} (GEMM {:.1} GFLOP/s)",
        report.seeds.len(),
        report.wall_s,
        report.header.host_machine,
        report.header.host_gemm_gflops
    );
}

/// Pages taken back from EMB for requests the KV share could not hold, over
/// every node of a run.
pub(super) fn kv_reclaims(s: &grflow_pipeline::Summary) -> u64 {
    s.nodes.iter().map(|n| n.kv_reclaims).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(regime: &str, policy: &str, p99_ms: f64, reduction: Option<f64>) -> Row {
        Row {
            regime: regime.into(),
            policy: policy.into(),
            alpha_start: 0.25,
            node_alpha: None,
            p99_ms,
            p50_ms: p99_ms / 2.0,
            slo_satisfaction: 1.0 - p99_ms / 1e3,
            alpha_moves: 0,
            decision_us_mean: Some(1.0),
            decision_us_p99: Some(p99_ms / 10.0),
            pid_gains: None,
            p99_reduction_vs_kv_emb_opt: reduction,
            oracle_gap: None,
            p99_regret_ms: None,
            alpha_star_std: None,
            oracle_gap_best_constant: None,
            oracle_gap_previous_star: None,
            oracle_epochs: 0,
            truncated_histories: 0,
            failed_requests: 0,
            kv_reclaims: 0,
        }
    }

    fn seed(seed: u64, rows: Vec<Row>) -> SeedReport {
        SeedReport {
            seed,
            rows,
            sweep: Vec::new(),
            sweep_alpha_star_std: BTreeMap::new(),
            node_sweep: BTreeMap::new(),
            kv_emb_opt_missing: BTreeMap::new(),
            wall_s: 1.0,
        }
    }

    #[test]
    fn means_over_seeds_count_the_seeds_below_static_and_bound_the_reduction() {
        let per_seed = [
            seed(
                42,
                vec![
                    row("burst", "static", 50.0, Some(0.0)),
                    row("burst", "smart", 40.0, Some(0.2)),
                ],
            ),
            seed(
                44,
                vec![
                    row("burst", "static", 60.0, Some(-0.1)),
                    row("burst", "smart", 66.0, Some(-0.2)),
                    // A policy only one seed ran.
                    row("burst", "pid", 55.0, None),
                ],
            ),
        ];
        let mean = mean_rows(&per_seed);
        let keys: Vec<(&str, &str)> = mean
            .iter()
            .map(|m| (m.regime.as_str(), m.policy.as_str()))
            .collect();
        // In the order the rows first came.
        assert_eq!(
            keys,
            [("burst", "static"), ("burst", "smart"), ("burst", "pid")]
        );
        let smart = &mean[1];
        assert_eq!(smart.seeds, 2);
        assert!((smart.p99_ms_mean.unwrap() - 53.0).abs() < 1e-12);
        assert_eq!(smart.seeds_below_static, Some(1));
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(close(smart.p99_reduction_vs_kv_emb_opt_mean, 0.0));
        assert!(close(smart.p99_reduction_vs_kv_emb_opt_min, -0.2));
        assert!(close(smart.p99_reduction_vs_kv_emb_opt_max, 0.2));
        assert!((smart.slo_satisfaction_min - 0.934).abs() < 1e-12);
        assert!((smart.decision_us_p99_max.unwrap() - 6.6).abs() < 1e-12);
        assert_eq!(smart.oracle_gap_mean, None);
        // static is never counted against itself.
        assert_eq!(mean[0].seeds_below_static, None);
        let pid = &mean[2];
        assert_eq!((pid.seeds, pid.seeds_below_static), (1, Some(1)));
        assert_eq!(pid.p99_reduction_vs_kv_emb_opt_mean, None);
    }

    #[test]
    fn means_over_seeds_leave_out_runs_that_failed_requests_or_cut_histories() {
        let failed = |mut r: Row| {
            r.failed_requests = 3;
            r
        };
        let cut = |mut r: Row| {
            r.truncated_histories = 1;
            r
        };
        let per_seed = [
            seed(
                42,
                vec![
                    row("burst", "static", 50.0, Some(0.0)),
                    row("burst", "smart", 40.0, Some(0.2)),
                ],
            ),
            seed(
                44,
                vec![
                    row("burst", "static", 60.0, Some(0.0)),
                    // Dropped requests: a low P99 for the wrong reason.
                    failed(row("burst", "smart", 10.0, Some(0.8))),
                ],
            ),
            seed(
                46,
                vec![
                    cut(row("burst", "static", 90.0, Some(0.0))),
                    row("burst", "smart", 80.0, Some(0.1)),
                ],
            ),
        ];
        let mean = mean_rows(&per_seed);
        let smart = &mean[1];
        assert_eq!((smart.seeds, smart.seeds_not_comparable), (3, 1));
        assert!((smart.p99_ms_mean.unwrap() - 60.0).abs() < 1e-12);
        let r = smart.p99_reduction_vs_kv_emb_opt_mean.unwrap();
        assert!((r - 0.15).abs() < 1e-12, "{r}");
        // Only seed 42 has both runs comparable.
        assert_eq!(smart.seeds_below_static, Some(1));
        assert_eq!(smart.seeds_compared_with_static, 1);
        let fixed = &mean[0];
        assert_eq!((fixed.seeds, fixed.seeds_not_comparable), (3, 1));
        assert!((fixed.p99_ms_mean.unwrap() - 55.0).abs() < 1e-12);
    }

    #[test]
    fn a_reduction_under_a_reference_run_that_does_not_compare_is_left_out() {
        let mut reference = row("burst", "kv-emb-opt", 30.0, None);
        reference.failed_requests = 1;
        let per_seed = [
            seed(
                42,
                vec![reference, row("burst", "smart", 40.0, Some(-0.33))],
            ),
            seed(
                44,
                vec![
                    row("burst", "kv-emb-opt", 50.0, None),
                    row("burst", "smart", 40.0, Some(0.2)),
                ],
            ),
        ];
        let smart = &mean_rows(&per_seed)[1];
        assert_eq!((smart.seeds, smart.seeds_not_comparable), (2, 0));
        assert_eq!(smart.p99_reduction_vs_kv_emb_opt_mean, Some(0.2));
    }

    #[test]
    fn a_seeds_reduction_is_null_when_either_run_does_not_compare() {
        let reference = row("burst", "kv-emb-opt", 50.0, None);
        let smart = row("burst", "smart", 25.0, None);
        assert_eq!(smart.reduction_vs(&reference), Some(0.5));
        assert_eq!(reference.reduction_vs(&reference), Some(0.0));
        let mut failed = reference;
        failed.failed_requests = 1;
        assert_eq!(smart.reduction_vs(&failed), None);
        assert_eq!(failed.reduction_vs(&failed), None, "kv-emb-opt's own");
        let mut cut = smart;
        cut.truncated_histories = 2;
        assert_eq!(
            cut.reduction_vs(&row("burst", "kv-emb-opt", 50.0, None)),
            None
        );
    }

    #[test]
    fn a_policy_that_timed_no_decision_has_no_decision_time() {
        let summary = |decisions| AllocatorSummary {
            policy: AllocatorPolicy::Pid,
            windows: 10,
            decisions,
            alpha_moves: 0,
            decision_us_mean: if decisions > 0 { 3.0 } else { 0.0 },
            decision_us_p99: if decisions > 0 { 5.0 } else { 0.0 },
        };
        let none = summary(0);
        let some = summary(4);
        for policy in [
            AllocatorPolicy::Pid,
            AllocatorPolicy::PpoOnly,
            AllocatorPolicy::Smart,
        ] {
            assert!(timed(policy, Some(&none)).is_none(), "{policy:?}");
            assert!(timed(policy, Some(&some)).is_some(), "{policy:?}");
        }
        assert!(timed(AllocatorPolicy::Static, Some(&some)).is_none());
        // Such a row leaves the maximum over seeds to the rows that timed.
        let mut untimed = row("burst", "pid", 40.0, None);
        (untimed.decision_us_mean, untimed.decision_us_p99) = (None, None);
        let per_seed = [
            seed(42, vec![untimed]),
            seed(44, vec![row("burst", "pid", 30.0, None)]),
        ];
        assert_eq!(mean_rows(&per_seed)[0].decision_us_p99_max, Some(3.0));
    }

    #[test]
    fn a_mean_p99_over_no_comparable_seed_is_null_not_zero() {
        let mut failed = row("burst", "smart", 40.0, None);
        failed.failed_requests = 1;
        let m = &mean_rows(&[seed(42, vec![failed])])[0];
        assert_eq!((m.seeds, m.seeds_not_comparable), (1, 1));
        assert_eq!(m.p99_ms_mean, None);
    }

    #[test]
    fn means_over_seeds_carry_the_oracle_figures_of_the_seeds_that_had_it() {
        let oracle = |r: Row, gap: f64, regret: f64, std: f64| Row {
            oracle_gap: Some(gap),
            p99_regret_ms: Some(regret),
            alpha_star_std: Some(std),
            ..r
        };
        let per_seed = [
            seed(
                42,
                vec![oracle(row("trend", "smart", 40.0, None), 0.1, 2.0, 0.2)],
            ),
            seed(
                44,
                vec![oracle(row("trend", "smart", 50.0, None), 0.3, 4.0, 0.1)],
            ),
            // A seed benched without the oracle counts for none of them.
            seed(46, vec![row("trend", "smart", 60.0, None)]),
        ];
        let m = &mean_rows(&per_seed)[0];
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert_eq!(m.seeds, 3);
        assert!(close(m.oracle_gap_mean, 0.2));
        assert!(close(m.p99_regret_ms_mean, 3.0));
        assert!(close(m.alpha_star_std_mean, 0.15));
    }
}
