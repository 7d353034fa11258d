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

mod episodes;
mod output;
mod selection;

use std::path::PathBuf;

use anyhow::Context;
use grflow_operators::allocator::AllocatorPolicy;
use grflow_operators::allocator::ppo::{ActorCritic, PpoConfig};
use grflow_pipeline::StopRequest;
use serde::Serialize;

use super::InputError;
use super::bench_allocator::{regimes, virtual_base};
use episodes::{episode_traces, play_iteration, workload};
use output::{
    CurvePoint, FLAT_REWARD_SHARE, Scratch, check_curve_path, curve_path, flat_reward_warning,
    write_replacing,
};
use selection::Checkpoints;

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

pub fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let ppo = check_args(&args)?;
    let regimes = regimes(&args.regime)?;
    super::check_out_file(&args.out, args.force)?;
    let curve_path = curve_path(&args.out);
    check_curve_path(&args.out, &curve_path, args.force)?;
    let (base, cost) = training_base(&args)?;
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
    let select_on = selection_traces(&args);
    let scratch = Scratch::beside(&args.out)?;
    let work = scratch.0.clone();
    let mut policy = ActorCritic::new(args.seed);
    eprintln!(
        "training: {} iterations x {} episodes of {} requests, SLO {slo_ms} ms, {} parameters",
        args.iterations,
        traces.len(),
        base.trace.requests,
        policy.parameters()
    );
    let mut checkpoints = Checkpoints::new(
        &base,
        validation.as_ref().unwrap_or(&traces),
        &work,
        args.select_by,
        &select_on,
        args.average_last,
    );
    // Ctrl-C (or SIGTERM) ends the training after the current episode:
    // the checkpoints so far are scored and the best is written, as at the
    // end of a whole run.
    let stop = StopRequest::default();
    super::stop_on_signals(&stop)?;
    let training = Training {
        args: &args,
        base: &base,
        regimes: regimes.len(),
        traces: &traces,
        policy_path: work.join("current.safetensors"),
        ppo: &ppo,
        stop: &stop,
    };
    let mut curve = Vec::new();
    let mut warned_flat = false;
    for iteration in 0..args.iterations {
        if stop.requested() {
            break;
        }
        let Some(point) = training.iteration(iteration, &mut policy, &mut checkpoints)? else {
            break;
        };
        if !warned_flat && point.best_reward_share >= FLAT_REWARD_SHARE {
            warned_flat = true;
            eprintln!("warning: {}", flat_reward_warning(&point, slo_ms));
        }
        curve.push(point);
    }
    let iterations = curve.len();
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
    if args.select_every > 0 && checkpoints.last_scored() != Some(iterations) {
        checkpoints.offer(iterations, &policy)?;
    }
    // The average of the last checkpoints, a candidate like the others.
    let averaged = checkpoints.offer_average(iterations)?;
    // No selection, or no checkpoint scored (every p99 NaN): the last.
    let (selected_updates, selected, mut policy) = match checkpoints.into_best() {
        Some((updates, score, (chosen, p99))) => (updates, Some((score, p99)), chosen),
        None => (iterations, None, policy),
    };
    let chosen = match (
        selected.map(|(score, _)| score),
        curve.first().and_then(|c| c.selection_score),
    ) {
        (Some(p), Some(u)) => Some(Chosen {
            updates: selected_updates,
            score: p,
            untrained: u,
            averaged: averaged.clone(),
        }),
        _ => None,
    };
    policy.provenance.trained_with = trained_with(&Provenance {
        args: &args,
        base: &base,
        cost: &cost,
        ppo: &ppo,
        regimes: &regimes,
        iterations,
        stopped: stop.requested().then(|| stop.cause()),
        select_on: &select_on,
        chosen,
    });
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
        selected_greedy_p99_ms: selected.map(|(_, p99)| p99),
        untrained_greedy_p99_ms: curve.first().and_then(|c| c.greedy_p99_ms),
        averaged_checkpoints: averaged,
        wall_s: started.elapsed().as_secs_f64(),
    };
    report.print(args.json)?;
    super::StoppedBySignal::check(&stop)
}

impl Report {
    fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
        } else {
            println!(
                "wrote {} ({} parameters, after {} updates) and {}; mean reward {:.4} -> {:.4} in {:.0} s",
                self.policy,
                self.parameters,
                self.selected_updates,
                self.curve,
                self.first_mean_reward,
                self.last_mean_reward,
                self.wall_s
            );
        }
        Ok(())
    }
}

/// The flags' checks that need no file, and PPO's settings from them.
fn check_args(args: &Args) -> anyhow::Result<PpoConfig> {
    if args.iterations == 0 || args.seeds == 0 {
        return Err(InputError::from_display(
            "--iterations and --seeds must be at least 1",
        ));
    }
    let ppo = ppo_config(args)?;
    check_validation_seeds(args)?;
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
    Ok(ppo)
}

/// The episodes' config (virtual clock, `ppo-only` sampling its actions,
/// the flags' workload) and the cost model it charges.
fn training_base(
    args: &Args,
) -> anyhow::Result<(grflow_pipeline::Config, grflow_kernels::cost::CostModel)> {
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
    Ok((base, cost))
}

/// What every iteration of one training shares.
struct Training<'a> {
    args: &'a Args,
    base: &'a grflow_pipeline::Config,
    regimes: usize,
    traces: &'a [episodes::EpisodeTrace],
    /// Where each iteration's episodes read the policy from.
    policy_path: PathBuf,
    ppo: &'a PpoConfig,
    stop: &'a StopRequest,
}

impl Training<'_> {
    /// Iteration `iteration`: scores the policy first when selection is
    /// due, plays every episode with it, and makes one PPO update. `None`
    /// when a stop came before the episodes ended (nothing learned).
    fn iteration(
        &self,
        iteration: usize,
        policy: &mut ActorCritic,
        checkpoints: &mut Checkpoints,
    ) -> anyhow::Result<Option<CurvePoint>> {
        let args = self.args;
        let it_started = std::time::Instant::now();
        let evaluated = if args.select_every > 0 && iteration.is_multiple_of(args.select_every) {
            Some(checkpoints.offer(iteration, policy)?)
        } else {
            None
        };
        std::fs::write(&self.policy_path, policy.to_safetensors())
            .with_context(|| format!("writing {}", self.policy_path.display()))?;
        let Some(played) = play_iteration(
            args,
            self.base,
            self.regimes,
            self.traces,
            &self.policy_path,
            iteration,
            self.stop,
        )?
        else {
            return Ok(None);
        };
        let (trajectories, p99s) = (played.trajectories, played.p99s);
        if trajectories.iter().all(|t| t.is_empty()) {
            // Nothing to learn from: the policy would be written untrained.
            return Err(InputError::from_display(format!(
                "iteration {iteration}: the allocator decided in no window of any episode: \
                 every window had fewer than allocator.min_requests ({}) requests; raise \
                 --requests or --rps, or lower allocator.min_requests or windows.epoch_ms ({} ms)",
                self.base.allocator.min_requests, self.base.windows.epoch_ms
            )));
        }
        let stats = policy.update(&trajectories, self.ppo, args.seed ^ iteration as u64);
        let point = CurvePoint {
            iteration,
            mean_reward: stats.mean_reward,
            best_reward_share: stats.best_reward_share,
            mean_p99_ms: p99s.iter().sum::<f64>() / p99s.len().max(1) as f64,
            decisions: stats.steps,
            entropy: stats.entropy,
            approx_kl: stats.approx_kl,
            greedy_p99_ms: evaluated.as_ref().map(|(g, _)| g.mean),
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
        Ok(Some(point))
    }
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

/// The checkpoint selection chose, for the provenance.
struct Chosen {
    /// PPO updates behind it.
    updates: usize,
    score: f64,
    /// The untrained policy's score.
    untrained: f64,
    /// With --average-last: the checkpoints whose mean it is.
    averaged: Option<Vec<usize>>,
}

/// What the provenance of a trained policy says.
struct Provenance<'a> {
    args: &'a Args,
    base: &'a grflow_pipeline::Config,
    cost: &'a grflow_kernels::cost::CostModel,
    ppo: &'a PpoConfig,
    regimes: &'a [grflow_traces::Regime],
    /// Iterations run.
    iterations: usize,
    /// The signal that stopped the training early.
    stopped: Option<String>,
    /// The traces selection scored on.
    select_on: &'a str,
    /// None: no checkpoint was scored, the last one is written.
    chosen: Option<Chosen>,
}

/// How the policy was trained and chosen, in words (the safetensors
/// file's `trained_with`): enough to rerun it.
fn trained_with(p: &Provenance<'_>) -> String {
    let (args, base, cost, ppo) = (p.args, p.base, p.cost, p.ppo);
    let select_on = p.select_on;
    let regimes: Vec<&str> = p.regimes.iter().map(|r| r.as_str()).collect();
    let stopped = match &p.stopped {
        Some(cause) => format!(" (of {} asked; stopped by {cause})", args.iterations),
        None => String::new(),
    };
    let chosen = match &p.chosen {
        Some(Chosen {
            score,
            untrained,
            averaged: Some(members),
            ..
        }) => format!(
            "the parameter mean of the checkpoints after {members:?} updates, chosen over each of \
             them on the {select_on} ({score:.4}; untrained {untrained:.4})"
        ),
        Some(Chosen {
            updates,
            score,
            untrained,
            ..
        }) => match args.select_by {
            SelectBy::Mean => format!(
                "checkpoint after {updates} updates, chosen by greedy mean p99 on the \
                 {select_on} every {} iterations ({score:.4} ms; untrained {untrained:.4} ms)",
                args.select_every
            ),
            SelectBy::WorstRegime => format!(
                "checkpoint after {updates} updates, chosen every {} iterations by the worst \
                 regime's greedy mean p99 on the {select_on} over the untrained policy's (static α) \
                 ({score:.4}; untrained {untrained:.4})",
                args.select_every
            ),
        },
        None => "the last checkpoint".to_string(),
    };
    format!(
        "grflow train-allocator: {} iterations{stopped}, regimes {}, trace seeds {}..{}, {} requests at {} rps per episode, \
         SLO {} ms, preset {}, virtual clock calibrated on {} (GEMM {:.1} GFLOP/s), compute_scale {}, \
         policy seed {}, PPO learning rate {}, {} epochs, entropy coefficient {}{}; {chosen}; workload: {}",
        p.iterations,
        regimes.join(","),
        args.seed_base,
        args.seed_base + args.seeds - 1,
        base.trace.requests,
        base.trace.rps,
        base.run.slo_ms.rank,
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
        workload(args, base, cost)
    )
}
