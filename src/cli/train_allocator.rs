//! `grflow train-allocator`: trains the SmartAllocator's PPO base policy
//! offline on the virtual clock (HLEM §IV-A). One iteration replays every
//! (regime, seed) trace once with the current policy sampling its actions
//! (each episode from a different starting α), then makes one PPO update
//! on every node's trajectory. Writes the policy (safetensors, with its
//! provenance) and the learning curve (JSON) beside it.
//!
//! The policy written is a checkpoint chosen the way `kv-emb-opt` chooses
//! its α: every `--select-every` iterations the greedy policy (as
//! `ppo-only` serves it) replays the training traces from the config's α,
//! and the checkpoint with the lowest mean P99 wins. Training samples
//! actions, serving takes the most likely one, and the two can part: a
//! policy whose sampled walk earned a good reward may, taken greedily,
//! drive α to a bound (seen on allocator-tight). Iteration 0, the untrained
//! policy, never moves α, so the written policy is never worse than the
//! config's static α on the training traces.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use grflow_operators::allocator::AllocatorPolicy;
use grflow_operators::allocator::ppo::{ActorCritic, PpoConfig, Step};
use grflow_pipeline::{ReplayOptions, StopRequest, TraceInput};
use grflow_traces::Trace;
use serde::Serialize;

use super::InputError;
use super::bench_allocator::{regimes, virtual_base};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where the policy goes (safetensors); the learning curve is written
    /// beside it as FILE.curve.json.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace the policy already at --out (without it, an existing FILE
    /// is refused before any training).
    #[arg(long)]
    pub force: bool,
    /// Regimes, comma-separated: steady, trend, burst.
    #[arg(long, default_value = "steady,trend,burst")]
    pub regime: String,
    /// Trace seeds per regime: seed-base, seed-base + 1, … (keep them apart
    /// from the bench's 42 and 43).
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// The first training trace's seed (see --seeds).
    #[arg(long, default_value_t = 1000)]
    pub seed_base: u64,
    /// PPO iterations (each replays every regime × seed once).
    #[arg(long, default_value_t = 30)]
    pub iterations: usize,
    /// Base config (default: the embedded one); its trace section sizes the
    /// episodes unless --requests / --rps say otherwise.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A `grflow calibrate` file for the config's preset (else calibrated now).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Requests per episode.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Base request rate of the episodes' traces.
    #[arg(long)]
    pub rps: Option<f64>,
    /// The latency objective of Eq. 5's reward (run.slo_ms.rank of the
    /// runs); the policy is for this SLO.
    #[arg(long)]
    pub slo_ms: Option<f64>,
    /// Seed of the policy's initial weights and of the sampled actions.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Checkpoint selection: evaluate the greedy policy every N iterations
    /// (and at the end) and write the best; 0 writes the last policy.
    #[arg(long, default_value_t = 5)]
    pub select_every: usize,
    /// Selection on held-out traces: N seeds per regime from
    /// --validation-seed-base, never trained on, instead of the training
    /// traces (a checkpoint picked on the traces it learned from partly
    /// fits them). 0 selects on the training traces.
    #[arg(long, default_value_t = 0)]
    pub validation_seeds: u64,
    /// The first validation trace's seed (see --validation-seeds).
    #[arg(long, default_value_t = 2000)]
    pub validation_seed_base: u64,
    /// Also score the parameter mean of the last N scored checkpoints (a
    /// late-training average, steadier than any one of them) and write it
    /// if it scores best. 0 or 1: off.
    #[arg(long, default_value_t = 0)]
    pub average_last: usize,
    /// What selection minimises: `mean` (the greedy policy's mean p99 over
    /// the training traces) or `worst-regime` (the largest, over regimes,
    /// of its mean p99 over the untrained policy's, which holds α at the
    /// config's value: a checkpoint that loses to static α in any regime
    /// scores above 1 and the untrained policy, 1, wins over it).
    #[arg(long, default_value = "mean")]
    pub select_by: SelectBy,
    /// PPO: Adam's learning rate.
    #[arg(long, allow_negative_numbers = true, default_value_t = PpoConfig::default().learning_rate)]
    pub learning_rate: f64,
    /// PPO: passes over each iteration's decisions per update.
    #[arg(long, default_value_t = PpoConfig::default().epochs)]
    pub ppo_epochs: usize,
    /// PPO: weight of the entropy bonus (keeps the sampled policy exploring).
    #[arg(long, allow_negative_numbers = true, default_value_t = PpoConfig::default().entropy_coef)]
    pub entropy_coef: f64,
    /// Start each episode's nodes at different αs (`memory.node_alpha`),
    /// pairs that change from iteration to iteration, instead of one α for
    /// all: walks of ±0.06 from a shared start rarely reach the split
    /// states (one node KV-heavy, another EMB-heavy) where a tight pool
    /// serves best, so the policy never learns what they are worth.
    #[arg(long)]
    pub split_starts: bool,
    /// Print the run's report (policy, curve file, selection, rewards) as
    /// one JSON object on stdout (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
}

/// `--select-by`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SelectBy {
    Mean,
    WorstRegime,
}

/// The greedy policy's mean p99 (ms) over the training traces, overall and
/// per regime.
#[derive(Clone, Debug, Default, PartialEq)]
struct Greedy {
    mean: f64,
    by_regime: BTreeMap<String, f64>,
}

impl Greedy {
    /// The score selection minimises: the mean p99, or the worst regime's
    /// p99 over `untrained`'s in that regime.
    fn score(&self, by: SelectBy, untrained: &Greedy) -> f64 {
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

#[derive(Debug, Serialize)]
struct CurvePoint {
    iteration: usize,
    /// Mean Eq. 5 reward of the iteration's decisions.
    mean_reward: f64,
    /// Share of them at the best reward (1): near 1 the reward is flat.
    best_reward_share: f64,
    /// Mean p99 (ms) of the iteration's episodes.
    mean_p99_ms: f64,
    decisions: usize,
    entropy: f64,
    approx_kl: f64,
    /// Mean p99 (ms) of the greedy policy before this iteration's update,
    /// from the config's α, on the traces selection scores (the training
    /// traces, or the held-out ones of `--validation-seeds`; selection
    /// points only).
    #[serde(skip_serializing_if = "Option::is_none")]
    greedy_p99_ms: Option<f64>,
    /// The same per regime, and the score selection compared.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    greedy_p99_ms_by_regime: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    selection_score: Option<f64>,
    wall_s: f64,
}

/// The best checkpoint so far (PPO updates behind it, greedy mean p99,
/// the checkpoint): lowest p99, the earlier on ties.
#[derive(Debug)]
struct Selection<T> {
    best: Option<(usize, f64, T)>,
}

impl<T> Selection<T> {
    fn new() -> Self {
        Self { best: None }
    }

    /// Offers the checkpoint after `updates` PPO updates, taken (`take`)
    /// only when it is the new best (a NaN score never is).
    fn offer(&mut self, updates: usize, p99_ms: f64, take: impl FnOnce() -> T) -> bool {
        let better = p99_ms.is_finite() && self.best.as_ref().is_none_or(|b| p99_ms < b.1);
        if better {
            self.best = Some((updates, p99_ms, take()));
        }
        better
    }
}

#[derive(Debug, Serialize)]
struct Report {
    policy: String,
    curve: String,
    parameters: usize,
    preset: String,
    machine: String,
    gemm_gflops: f64,
    slo_ms: f64,
    requests_per_episode: u64,
    episodes_per_iteration: usize,
    /// PPO iterations run (fewer than asked when a signal stopped it).
    iterations: usize,
    /// The signal that stopped the training early, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    interrupted: Option<String>,
    first_mean_reward: f64,
    last_mean_reward: f64,
    /// The first iteration's share of decisions at the best reward (a
    /// warning says so when it is 0.9 or more: the reward was flat).
    first_best_reward_share: f64,
    /// PPO updates behind the written policy, and its greedy mean p99.
    selected_updates: usize,
    selected_greedy_p99_ms: Option<f64>,
    /// The untrained policy's (α held at the config's value).
    untrained_greedy_p99_ms: Option<f64>,
    /// With --average-last: the checkpoints (PPO updates behind each)
    /// whose parameter mean was written, when it scored best.
    #[serde(skip_serializing_if = "Option::is_none")]
    averaged_checkpoints: Option<Vec<usize>>,
    wall_s: f64,
}

/// An iteration with at least this share of its decisions at Eq. 5's best
/// reward is told apart: its advantages are noise.
const FLAT_REWARD_SHARE: f64 = 0.9;

/// Why an iteration whose windows nearly all met the SLO teaches nothing,
/// and what to pass instead.
fn flat_reward_warning(point: &CurvePoint, slo_ms: f64) -> String {
    format!(
        "{:.0}% of iteration {}'s decisions earned Eq. 5's best reward (the window met the SLO of \
         {slo_ms} ms with nothing truncated), so the reward hardly depends on alpha and PPO has \
         little to learn; the episodes' p99 averaged {:.4} ms: train for an SLO that the windows' \
         p99 crosses (--slo-ms near {:.4})",
        point.best_reward_share * 100.0,
        point.iteration,
        point.mean_p99_ms,
        point.mean_p99_ms
    )
}

/// Starting α of episode `k` of an iteration: spread over [0.1, 0.9] so
/// the policy sees both sides of every workload's best α.
fn start_alpha(k: usize, episodes: usize) -> f64 {
    let f = (k as f64 + 0.5) / episodes.max(1) as f64;
    ((0.1 + 0.8 * f) * 100.0).round() / 100.0
}

/// What the episodes replayed besides the trace seeds: the config, the
/// memory and trace settings that shape the trade-off, and the cost model
/// charged (two configs may differ in nothing else).
fn workload(
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

/// Where episode `k` (traces in order regime by regime, `per_regime`
/// seeds each) of `iteration` sits in [`start_alpha`]'s spread: each
/// regime's episodes take every `regimes`-th place, so that every regime
/// starts from low and high α alike (in trace order, Steady would always
/// start low and Burst high, and α in the state would stand for the
/// regime), and the places rotate with the iteration.
fn start_slot(k: usize, regimes: usize, per_regime: usize, iteration: usize) -> usize {
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
fn split_start(k: usize, episodes: usize, nodes: usize, iteration: usize) -> Vec<f64> {
    let n = episodes.max(1);
    let shift = 1 + iteration % (n - 1).max(1);
    (0..nodes)
        .map(|j| start_alpha((k + j * shift) % n, n))
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    if args.iterations == 0 || args.seeds == 0 {
        return Err(InputError::from_display(
            "--iterations and --seeds must be at least 1",
        ));
    }
    let ppo = ppo_config(&args)?;
    check_validation_seeds(&args)?;
    let regimes = regimes(&args.regime)?;
    // Checked here, by flag, and before calibrating: the trace's own check
    // would name `trace.requests` / `trace.rps`, keys the user never wrote.
    if args.requests == Some(0) {
        return Err(InputError::from_display("--requests must be >= 1"));
    }
    if let Some(r) = args.rps
        && !(r.is_finite() && r > 0.0)
    {
        return Err(InputError::from_display(format!(
            "--rps must be a finite number > 0 (got {r})"
        )));
    }
    super::check_out_file(&args.out, args.force)?;
    let curve_path = curve_path(&args.out);
    check_curve_path(&args.out, &curve_path, args.force)?;
    let (mut base, cost) = virtual_base(
        args.config.as_deref(),
        args.calibration.as_deref(),
        args.slo_ms,
    )?;
    if let Some(n) = args.requests {
        base.trace.requests = n;
    }
    if let Some(r) = args.rps {
        base.trace.rps = r;
    }
    base.allocator.policy = AllocatorPolicy::PpoOnly;
    base.allocator.sample = true;
    let slo_ms = base.run.slo_ms.rank;

    let traces = episode_traces(&base, &regimes, args.seed_base, args.seeds)?;
    let validation = if args.validation_seeds > 0 {
        Some(episode_traces(
            &base,
            &regimes,
            args.validation_seed_base,
            args.validation_seeds,
        )?)
    } else {
        None
    };
    let select_traces = validation.as_ref().unwrap_or(&traces);
    let select_on = selection_traces(&args);
    let scratch = Scratch::beside(&args.out)?;
    let work = scratch.0.clone();
    let policy_path = work.join("current.safetensors");
    let mut policy = ActorCritic::new(args.seed);
    let mut curve = Vec::new();
    eprintln!(
        "training: {} iterations x {} episodes of {} requests, SLO {slo_ms} ms, {} parameters",
        args.iterations,
        traces.len(),
        base.trace.requests,
        policy.parameters()
    );
    let mut selection = Selection::new();
    // The untrained policy's greedy p99s (iteration 0's): static α.
    let mut untrained: Option<Greedy> = None;
    // Scores `policy` (named `what` in the log) on the selection traces.
    let mut greedy = |what: &str, policy: &ActorCritic| -> anyhow::Result<(Greedy, f64)> {
        let g = greedy_p99(&base, select_traces, policy, &work)?;
        let reference = untrained.get_or_insert_with(|| g.clone());
        let score = g.score(args.select_by, reference);
        eprintln!(
            "{what}: mean p99 {:.4} ms on the {select_on} ({}), selection score {score:.4}",
            g.mean,
            g.by_regime
                .iter()
                .map(|(r, p)| format!("{r} {p:.4}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok((g, score))
    };
    let mut warned_flat = false;
    // The last --average-last scored checkpoints.
    let mut scored: Vec<(usize, ActorCritic)> = Vec::new();
    // Ctrl-C (or SIGTERM) ends the training after the current episode:
    // the checkpoints so far are scored and the best is written, as at the
    // end of a whole run.
    let stop = StopRequest::default();
    super::stop_on_signals(&stop)?;
    let mut iterations = 0;
    let mut last_scored = None;
    'training: for iteration in 0..args.iterations {
        if stop.requested() {
            break;
        }
        let it_started = std::time::Instant::now();
        let evaluated = if args.select_every > 0 && iteration % args.select_every == 0 {
            let (g, score) = greedy(&format!("greedy policy after {iteration} updates"), &policy)?;
            selection.offer(iteration, score, || (policy.clone(), g.mean));
            keep_recent(&mut scored, args.average_last, iteration, &policy);
            last_scored = Some(iteration);
            Some((g, score))
        } else {
            None
        };
        let greedy_p99_ms = evaluated.as_ref().map(|(g, _)| g.mean);
        std::fs::write(&policy_path, policy.to_safetensors())
            .with_context(|| format!("writing {}", policy_path.display()))?;
        let mut trajectories: Vec<Vec<Step>> = Vec::new();
        let mut p99s = Vec::new();
        for (k, (_, _, trace)) in traces.iter().enumerate() {
            let mut cfg = base.clone();
            let slot = start_slot(k, regimes.len(), args.seeds as usize, iteration);
            cfg.memory.alpha = start_alpha(slot, traces.len());
            if args.split_starts {
                cfg.memory.node_alpha =
                    Some(split_start(slot, traces.len(), base.run.workers, iteration));
            }
            cfg.allocator.policy_file = policy_path.display().to_string();
            cfg.allocator.seed = args.seed ^ ((iteration as u64) << 20) ^ ((k as u64) << 8);
            let out =
                grflow_pipeline::replay(ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg))
                    .map_err(|e| episode_error(e, "training episode"))?;
            let latency = (out.summary.latency_ms.as_ref())
                .context("a training episode answered no request: no p99")?;
            p99s.push(latency.p99);
            let mut by_node: BTreeMap<u32, Vec<Step>> = BTreeMap::new();
            for (node, step) in out.allocator_steps {
                by_node.entry(node).or_default().push(step);
            }
            trajectories.extend(by_node.into_values());
            if stop.requested() {
                // The iteration is not finished: its episodes teach nothing.
                break 'training;
            }
        }
        if trajectories.iter().all(|t| t.is_empty()) {
            // Nothing to learn from: the policy would be written untrained.
            return Err(InputError::from_display(format!(
                "iteration {iteration}: the allocator decided in no window of any episode: \
                 every window had fewer than allocator.min_requests ({}) requests; raise \
                 --requests or --rps, or lower allocator.min_requests or windows.epoch_ms ({} ms)",
                base.allocator.min_requests, base.windows.epoch_ms
            )));
        }
        let stats = policy.update(&trajectories, &ppo, args.seed ^ iteration as u64);
        let point = CurvePoint {
            iteration,
            mean_reward: stats.mean_reward,
            best_reward_share: stats.best_reward_share,
            mean_p99_ms: p99s.iter().sum::<f64>() / p99s.len().max(1) as f64,
            decisions: stats.steps,
            entropy: stats.entropy,
            approx_kl: stats.approx_kl,
            greedy_p99_ms,
            greedy_p99_ms_by_regime: evaluated
                .as_ref()
                .map(|(g, _)| g.by_regime.clone())
                .unwrap_or_default(),
            selection_score: evaluated.map(|(_, score)| score),
            wall_s: it_started.elapsed().as_secs_f64(),
        };
        eprintln!(
            "iteration {:>3}: mean reward {:.4}, mean p99 {:.3} ms, {} decisions, entropy {:.3}, {:.1} s",
            point.iteration,
            point.mean_reward,
            point.mean_p99_ms,
            point.decisions,
            point.entropy,
            point.wall_s
        );
        if !warned_flat && point.best_reward_share >= FLAT_REWARD_SHARE {
            warned_flat = true;
            eprintln!("warning: {}", flat_reward_warning(&point, slo_ms));
        }
        curve.push(point);
        iterations = iteration + 1;
    }
    if stop.requested() {
        if iterations == 0 {
            eprintln!(
                "interrupted by {} before the first update: nothing written",
                stop.cause()
            );
            return super::StoppedBySignal::check(&stop);
        }
        eprintln!(
            "interrupted by {} after {iterations} of {} iterations: scoring the last checkpoint \
             and writing the best so far (again to quit at once)",
            stop.cause(),
            args.iterations
        );
    }
    // The last checkpoint, unless a stop inside an iteration left it
    // scored already (at that iteration's start).
    if args.select_every > 0 && last_scored != Some(iterations) {
        let what = format!("greedy policy after {iterations} updates");
        let (g, last) = greedy(&what, &policy)?;
        selection.offer(iterations, last, || (policy.clone(), g.mean));
        keep_recent(&mut scored, args.average_last, iterations, &policy);
    }
    // The average of the last checkpoints, a candidate like the others.
    let mut averaged: Option<Vec<usize>> = None;
    if args.average_last >= 2 && scored.len() >= 2 {
        let members: Vec<usize> = scored.iter().map(|(u, _)| *u).collect();
        let nets: Vec<&ActorCritic> = scored.iter().map(|(_, p)| p).collect();
        let avg = ActorCritic::average(&nets).context("averaging checkpoints of one shape")?;
        let (g, score) = greedy(
            &format!("mean of the checkpoints after {members:?} updates"),
            &avg,
        )?;
        if selection.offer(iterations, score, || (avg, g.mean)) {
            averaged = Some(members);
        }
    }
    // No selection, or no checkpoint scored (every p99 NaN): the last.
    let (selected_updates, selected, mut policy) = match selection.best {
        Some((updates, score, (chosen, p99))) => (updates, Some((score, p99)), chosen),
        None => (iterations, None, policy),
    };
    let selected_p99 = selected.map(|(_, p99)| p99);
    let untrained_p99 = curve.first().and_then(|c| c.greedy_p99_ms);
    let untrained_score = curve.first().and_then(|c| c.selection_score);
    let regime_list: Vec<&str> = regimes.iter().map(|r| r.as_str()).collect();
    policy.provenance.trained_with = format!(
        "grflow train-allocator: {} iterations{}, regimes {}, trace seeds {}..{}, {} requests at {} rps per episode, \
         SLO {slo_ms} ms, preset {}, virtual clock calibrated on {} (GEMM {:.1} GFLOP/s), compute_scale {}, \
         policy seed {}, PPO learning rate {}, {} epochs, entropy coefficient {}{}; {}; workload: {}",
        iterations,
        match stop.requested() {
            true => format!(
                " (of {} asked; stopped by {})",
                args.iterations,
                stop.cause()
            ),
            false => String::new(),
        },
        regime_list.join(","),
        args.seed_base,
        args.seed_base + args.seeds - 1,
        base.trace.requests,
        base.trace.rps,
        cost.preset,
        cost.machine,
        cost.gemm_gflops,
        base.cost.compute_scale,
        args.seed,
        ppo.learning_rate,
        ppo.epochs,
        ppo.entropy_coef,
        if args.split_starts {
            ", episodes started from per-node splits"
        } else {
            ""
        },
        match (
            selected.map(|(score, _)| score),
            untrained_score,
            args.select_by
        ) {
            (Some(p), Some(u), _) if averaged.is_some() => format!(
                "the parameter mean of the checkpoints after {:?} updates, chosen over each of them \
                 on the {select_on} ({p:.4}; untrained {u:.4})",
                averaged.as_deref().unwrap_or_default()
            ),
            (Some(p), Some(u), SelectBy::Mean) => format!(
                "checkpoint after {selected_updates} updates, chosen by greedy mean p99 on the \
                 {select_on} every {} iterations ({p:.4} ms; untrained {u:.4} ms)",
                args.select_every
            ),
            (Some(p), Some(u), SelectBy::WorstRegime) => format!(
                "checkpoint after {selected_updates} updates, chosen every {} iterations by the worst \
                 regime's greedy mean p99 on the {select_on} over the untrained policy's (static α) \
                 ({p:.4}; untrained {u:.4})",
                args.select_every
            ),
            _ => "the last checkpoint".to_string(),
        },
        workload(&args, &base, &cost)
    );
    policy.provenance.slo_ms = Some(slo_ms);
    write_replacing(&args.out, &policy.to_safetensors())?;
    write_replacing(
        &curve_path,
        serde_json::to_string_pretty(&curve)?.as_bytes(),
    )?;
    drop(scratch);
    let report = Report {
        policy: args.out.display().to_string(),
        curve: curve_path.display().to_string(),
        parameters: policy.parameters(),
        preset: cost.preset.clone(),
        machine: cost.machine.clone(),
        gemm_gflops: cost.gemm_gflops,
        slo_ms,
        requests_per_episode: base.trace.requests,
        episodes_per_iteration: traces.len(),
        iterations,
        interrupted: stop.requested().then(|| stop.cause()),
        first_mean_reward: curve.first().map_or(0.0, |c| c.mean_reward),
        last_mean_reward: curve.last().map_or(0.0, |c| c.mean_reward),
        first_best_reward_share: curve.first().map_or(0.0, |c| c.best_reward_share),
        selected_updates,
        selected_greedy_p99_ms: selected_p99,
        untrained_greedy_p99_ms: untrained_p99,
        averaged_checkpoints: averaged.clone(),
        wall_s: started.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "wrote {} ({} parameters, after {} updates) and {}; mean reward {:.4} -> {:.4} in {:.0} s",
            report.policy,
            report.parameters,
            report.selected_updates,
            report.curve,
            report.first_mean_reward,
            report.last_mean_reward,
            report.wall_s
        );
    }
    super::StoppedBySignal::check(&stop)
}

/// Keeps the last `n` scored checkpoints (none when `n` < 2: nothing is
/// averaged), `policy` after `updates` updates being the newest.
fn keep_recent(
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

/// One trace per (regime, seed) for `seeds` seeds from `seed_base`, sized
/// by `base`'s trace section.
fn episode_traces(
    base: &grflow_pipeline::Config,
    regimes: &[grflow_traces::Regime],
    seed_base: u64,
    seeds: u64,
) -> anyhow::Result<Vec<(String, u64, Arc<Trace>)>> {
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

/// Held-out seeds must be held out: refused by flag when they overlap the
/// training seeds.
fn check_validation_seeds(args: &Args) -> anyhow::Result<()> {
    // Seeds are seed_base + i: past u64::MAX they wrapped to 0, 1, … and
    // could overlap the held-out seeds unseen.
    for (flag, base, n) in [
        ("--seed-base", args.seed_base, args.seeds),
        (
            "--validation-seed-base",
            args.validation_seed_base,
            args.validation_seeds,
        ),
    ] {
        if base.checked_add(n).is_none() {
            return Err(InputError::from_display(format!(
                "{flag} {base} with {n} seeds runs past the largest seed ({})",
                u64::MAX
            )));
        }
    }
    let train = args.seed_base..args.seed_base.saturating_add(args.seeds);
    let held = args.validation_seed_base
        ..args
            .validation_seed_base
            .saturating_add(args.validation_seeds);
    if !held.is_empty() && train.start < held.end && held.start < train.end {
        return Err(InputError::from_display(format!(
            "--validation-seed-base {} with --validation-seeds {} overlaps the training seeds \
             {}..{} (--seed-base, --seeds): validation traces must be held out",
            held.start,
            args.validation_seeds,
            train.start,
            train.end - 1
        )));
    }
    Ok(())
}

/// The traces checkpoints are selected on, for the provenance.
fn selection_traces(args: &Args) -> String {
    if args.validation_seeds == 0 {
        return "training traces".to_string();
    }
    format!(
        "held-out validation traces (seeds {}..{})",
        args.validation_seed_base,
        args.validation_seed_base + args.validation_seeds - 1
    )
}

/// PPO's settings from the flags, checked.
fn ppo_config(args: &Args) -> anyhow::Result<PpoConfig> {
    if !(args.learning_rate.is_finite() && args.learning_rate > 0.0) {
        return Err(InputError::from_display(format!(
            "--learning-rate must be a positive number, got {}",
            args.learning_rate
        )));
    }
    if args.ppo_epochs == 0 {
        return Err(InputError::from_display("--ppo-epochs must be at least 1"));
    }
    if !(args.entropy_coef.is_finite() && args.entropy_coef >= 0.0) {
        return Err(InputError::from_display(format!(
            "--entropy-coef must be a number >= 0, got {}",
            args.entropy_coef
        )));
    }
    Ok(PpoConfig {
        learning_rate: args.learning_rate,
        epochs: args.ppo_epochs,
        entropy_coef: args.entropy_coef,
        ..PpoConfig::default()
    })
}

/// Mean p99 (ms) of `policy` taken greedily (`ppo-only`, no sampling) over
/// `traces`, each from the config's α (what a deployment of it would see),
/// overall and per regime.
fn greedy_p99(
    base: &grflow_pipeline::Config,
    traces: &[(String, u64, Arc<Trace>)],
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

/// A replay's setup error (the config or trace) is the user's to fix:
/// exit code 2, as `grflow replay` gives for the same config.
fn episode_error(e: grflow_pipeline::ReplayError, what: &str) -> anyhow::Error {
    match e {
        e if e.is_input() => InputError::from_display(format!("{what}: {e}")),
        other => anyhow::Error::new(other).context(what.to_string()),
    }
}

/// Where the learning curve of the policy at `out` goes.
fn curve_path(out: &std::path::Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".curve.json");
    PathBuf::from(name)
}

/// The curve is written with the policy, so it is refused as `--out` is:
/// an earlier run's curve is replaced only with `--force`.
fn check_curve_path(
    out: &std::path::Path,
    curve: &std::path::Path,
    force: bool,
) -> anyhow::Result<()> {
    let bad = |why: &str| {
        InputError::from_display(format!(
            "--out {}: its learning curve {} {why}",
            out.display(),
            curve.display()
        ))
    };
    if curve.is_dir() {
        return Err(bad("is a directory; name another --out"));
    }
    if !force && curve.symlink_metadata().is_ok() {
        return Err(bad(
            "already exists; pass --force to replace it, or name another file",
        ));
    }
    Ok(())
}

/// Writes `bytes` to a temporary file beside `path` and renames it over
/// `path`: a failed write leaves the old file whole, and `--force` replaces
/// the file rather than truncating it in place (under a reader, or a hard
/// link to the old one).
fn write_replacing(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// A scratch directory beside `out` for the current policy of each
/// iteration (the runs read it as `allocator.policy_file`), removed when
/// dropped: on success and on every error.
struct Scratch(PathBuf);

impl Scratch {
    /// Made in `out`'s directory, which `check_out_file` has checked.
    fn beside(out: &std::path::Path) -> anyhow::Result<Self> {
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let dir = parent.join(format!(".train-allocator-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            InputError::from_display(format!(
                "--out {}: cannot write in {}: {e}",
                out.display(),
                parent.display()
            ))
        })?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
