//! One bench seed: per regime, the static sweep that picks `kv-emb-opt`
//! on the training traces (with `--sweep`), the baselines' settings, and
//! every policy's run on the bench trace with its oracle.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use grflow_operators::allocator::AllocatorPolicy;
use grflow_traces::{Regime, Trace};

use super::plots::Plots;
use super::report::{PidGains, Row, SeedReport, SweepPoint, kv_reclaims};
use super::{Bench, Run, SWEEP, SeedDone, TrainScore, node_sweep, per_epoch_best_std, pid_search};

/// One regime of one seed: its traces, generated once and replayed by
/// every run, and the prefix its progress lines carry.
struct RegimeTraces<'a> {
    tag: &'a str,
    name: String,
    bench: Arc<Trace>,
    /// Seeds + 1 … + train_seeds; only the searches (--sweep) replay them.
    train: Vec<Arc<Trace>>,
}

impl Bench {
    /// Every regime and policy on bench seed `seed` (the sweeps on seed + 1
    /// … seed + train_seeds).
    pub(super) fn seed(&self, seed: u64) -> anyhow::Result<SeedDone> {
        let started = std::time::Instant::now();
        let tag = if self.tagged {
            format!("[seed {seed}] ")
        } else {
            String::new()
        };
        let mut plots = Plots::default();
        let mut report = SeedReport {
            seed,
            rows: Vec::new(),
            sweep: Vec::new(),
            sweep_alpha_star_std: BTreeMap::new(),
            node_sweep: BTreeMap::new(),
            kv_emb_opt_missing: BTreeMap::new(),
            wall_s: 0.0,
        };
        for regime in &self.regimes {
            let traces = RegimeTraces {
                tag: &tag,
                name: regime.as_str().to_string(),
                bench: self.trace(*regime, seed)?,
                train: (1..=self.train_seeds)
                    .filter(|_| self.sweep)
                    .map(|k| self.trace(*regime, seed + k))
                    .collect::<anyhow::Result<Vec<_>>>()?,
            };
            let best_train = if self.sweep {
                self.static_sweep(&traces, seed, &mut report, &mut plots)?
            } else {
                report.kv_emb_opt_missing.insert(
                    traces.name.clone(),
                    "kv-emb-opt is picked on the training seeds by --sweep, which this run \
                     did not have; the reductions against it are left out"
                        .into(),
                );
                None
            };
            let policies = self.policies(&traces, best_train, &mut report)?;
            self.run_policies(&traces, policies, &mut report.rows, &mut plots)?;
        }
        report.wall_s = started.elapsed().as_secs_f64();
        Ok((report, plots))
    }

    /// Mean P99 over the training traces, and what they served with a
    /// history cut short or not at all.
    fn train_score(&self, traces: &RegimeTraces, run: &Run) -> anyhow::Result<TrainScore> {
        let mut score = TrainScore::default();
        for t in &traces.train {
            let out = self.replay(t, run, false)?;
            let latency = (out.summary.latency_ms.as_ref())
                .context("a training trace's run answered no request: no p99")?;
            score.p99_ms += latency.p99 / traces.train.len() as f64;
            score.truncated += out.summary.truncated_histories;
            score.failed += out.summary.errors;
        }
        Ok(score)
    }

    /// Static α over [`SWEEP`] on the bench trace and the training traces:
    /// the sweep's points, the per-epoch best α's spread and its plot go
    /// into `report` and `plots`. Returns the α whose training runs were
    /// whole with the lowest mean P99, and that P99 (`None`, said in
    /// `report.kv_emb_opt_missing`, when no α served them whole).
    fn static_sweep(
        &self,
        traces: &RegimeTraces,
        seed: u64,
        report: &mut SeedReport,
        plots: &mut Plots,
    ) -> anyhow::Result<Option<(f64, f64)>> {
        let (tag, name) = (traces.tag, &traces.name);
        eprintln!("{tag}{name}: static sweep over alpha...");
        let mut best_train: Option<(f64, f64)> = None;
        let mut outs = Vec::new();
        let mut unusable = Vec::new();
        for &alpha in &SWEEP {
            let run = Run::new("sweep", AllocatorPolicy::Static, alpha);
            let bench = self.replay(&traces.bench, &run, false)?;
            let train = self.train_score(traces, &run)?;
            let train_p99 = train.p99_ms;
            let p99 = (bench.summary.latency_ms.as_ref())
                .context("a sweep run answered no request: no p99")?
                .p99;
            let truncated = bench.summary.truncated_histories;
            let reclaims = kv_reclaims(&bench.summary);
            eprintln!(
                "{tag}  alpha {alpha:.1}: p99 {p99:.4} ms (training {train_p99:.4}{}), \
                 truncated histories {truncated}, KV reclaims {reclaims}",
                if train.whole() {
                    String::new()
                } else {
                    format!(": {}", train.flaws())
                }
            );
            if !train.whole() {
                unusable.push(train);
            } else if best_train.is_none_or(|b| train_p99 < b.1) {
                best_train = Some((alpha, train_p99));
            }
            report.sweep.push(SweepPoint {
                regime: name.clone(),
                alpha,
                p99_ms: p99,
                train_p99_ms: train_p99,
                truncated_histories: truncated,
                kv_reclaims: reclaims,
            });
            outs.push((alpha, bench));
        }
        report
            .sweep_alpha_star_std
            .insert(name.clone(), per_epoch_best_std(&outs));
        plots.sweep(name, &outs);
        if best_train.is_none() {
            // Every α cut histories short or failed requests on the
            // training traces: no baseline to measure against. Say so
            // rather than leave its row out unexplained.
            let why = format!(
                "no static alpha served the training traces (seeds {}..={}) whole \
                 (the fewest flaws: {}); kv-emb-opt and the reductions against it are \
                 left out (lower trace.max_history: histories grow by an item per request and \
                 are cut at the model's positions or half the pool; or raise \
                 memory.pool_mib)",
                seed + 1,
                seed + self.train_seeds,
                unusable
                    .iter()
                    .min_by_key(|t| t.truncated + t.failed)
                    .map(TrainScore::flaws)
                    .unwrap_or_default()
            );
            eprintln!("{tag}{name}: {why}");
            report.kv_emb_opt_missing.insert(name.clone(), why);
        }
        Ok(best_train)
    }

    /// The runs of a regime in report order: the baselines picked on
    /// training seeds first (kv-emb-opt is every row's reference), then
    /// `static`, `kv-opt`, `pid` and the learned policies. `--node-sweep`'s
    /// split goes into `report.node_sweep`.
    fn policies(
        &self,
        traces: &RegimeTraces,
        best_train: Option<(f64, f64)>,
        report: &mut SeedReport,
    ) -> anyhow::Result<Vec<Run>> {
        let (tag, name) = (traces.tag, &traces.name);
        let mut policies: Vec<Run> = Vec::new();
        if let Some((alpha, single_p99)) = best_train {
            policies.push(Run::new("kv-emb-opt", AllocatorPolicy::Static, alpha));
            if self.node_sweep {
                let nodes = self.base.run.workers;
                let split = node_sweep(tag, name, nodes, alpha, single_p99, |a| {
                    let score = self.train_score(
                        traces,
                        &Run {
                            node_alpha: Some(a.to_vec()),
                            ..Run::new("split", AllocatorPolicy::Static, alpha)
                        },
                    )?;
                    Ok((score.p99_ms, score.whole()))
                })?;
                policies.push(Run {
                    node_alpha: Some(split.node_alpha.clone()),
                    ..Run::new(
                        "kv-emb-opt-node",
                        AllocatorPolicy::Static,
                        split.mean_alpha(),
                    )
                });
                report.node_sweep.insert(name.clone(), split);
            }
        }
        let configured = self.base.memory.alpha;
        policies.push(Run::new("static", AllocatorPolicy::Static, configured));
        policies.push(Run::new("kv-opt", AllocatorPolicy::KvOpt, configured));
        policies.push(Run {
            gains: Some(self.pid_gains(traces)?),
            ..Run::new("pid", AllocatorPolicy::Pid, configured)
        });
        if self.learned {
            policies.push(Run::new("ppo-only", AllocatorPolicy::PpoOnly, configured));
            policies.push(Run::new("smart", AllocatorPolicy::Smart, configured));
            // The learned controllers started from the split instead of the
            // config's α: tune offline, then let the controller adapt.
            if let Some(split) = report.node_sweep.get(name) {
                for (label, policy) in [
                    ("ppo-only-node", AllocatorPolicy::PpoOnly),
                    ("smart-node", AllocatorPolicy::Smart),
                ] {
                    policies.push(Run {
                        node_alpha: Some(split.node_alpha.clone()),
                        ..Run::new(label, policy, split.mean_alpha())
                    });
                }
            }
        }
        Ok(policies)
    }

    /// pid's gains: searched on the training traces with `--sweep`, else
    /// (or when no set of the grid served them whole) the config's.
    fn pid_gains(&self, traces: &RegimeTraces) -> anyhow::Result<PidGains> {
        let (tag, name) = (traces.tag, &traces.name);
        let configured = self.base.memory.alpha;
        let searched = if self.sweep {
            eprintln!("{tag}{name}: pid gains on the training seeds...");
            let found = pid_search(tag, configured, |g| {
                let score = self.train_score(
                    traces,
                    &Run {
                        gains: Some(g),
                        ..Run::new("pid", AllocatorPolicy::Pid, configured)
                    },
                )?;
                Ok((score.p99_ms, score.whole()))
            })?;
            if found.is_none() {
                eprintln!(
                    "{tag}{name}: no pid gains of the grid served the training traces whole; \
                     pid runs with the config's"
                );
            }
            found
        } else {
            None
        };
        Ok(searched.unwrap_or_else(|| {
            let a = &self.base.allocator;
            PidGains {
                kp: a.kp,
                ki: a.ki,
                kd: a.kd,
                searched: false,
                train_p99_ms: None,
            }
        }))
    }

    /// Each of `policies` on the bench trace with its oracle: a row each,
    /// compared with this regime's kv-emb-opt row (run first).
    fn run_policies(
        &self,
        traces: &RegimeTraces,
        policies: Vec<Run>,
        rows: &mut Vec<Row>,
        plots: &mut Plots,
    ) -> anyhow::Result<()> {
        let name = &traces.name;
        for run in policies {
            let run_started = std::time::Instant::now();
            let out = self.replay(&traces.bench, &run, true)?;
            plots.policy_run(name, run.label, &out);
            let mut row = Row::of(name, run, &out)?;
            // kv-emb-opt runs first: this regime's reference, itself
            // included (null where either run does not compare).
            let reference = if row.policy == "kv-emb-opt" {
                Some(&row)
            } else {
                rows.iter()
                    .find(|r: &&Row| &r.regime == name && r.policy == "kv-emb-opt")
            };
            row.p99_reduction_vs_kv_emb_opt = reference.and_then(|r| row.reduction_vs(r));
            eprintln!(
                "{}{}",
                traces.tag,
                row.line(run_started.elapsed().as_secs_f64())
            );
            rows.push(row);
        }
        Ok(())
    }

    fn trace(&self, regime: Regime, seed: u64) -> anyhow::Result<Arc<Trace>> {
        let mut t = self.base.trace.clone();
        t.regime = regime.as_str().into();
        t.seed = seed;
        let t = t.gen_config().map_err(super::InputError::from_display)?;
        Ok(Arc::new(grflow_traces::generate(&t)))
    }
}
