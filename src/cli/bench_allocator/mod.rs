//! `grflow bench allocator`: every regime under every allocator policy in
//! one run, on the virtual clock (deterministic and fast: no model runs).
//! With `--sweep`, static α ∈ {0.0, 0.1, …, 1.0} per regime first, which
//! gives the best static α (`kv-emb-opt`, chosen on training seeds and
//! evaluated on the bench seed) and the per-epoch best static α (how much
//! α* moves over a run); `--node-sweep` then searches one static α per
//! node from there (`kv-emb-opt-node`, the same way). Every policy's run
//! is followed by the oracle α* of HLEM §V (each node's epoch replayed
//! from its state at the epoch's start at every α of the grid), which
//! gives the oracle gap, the P99
//! regret and how much α* moves. An α whose KV share cannot hold the
//! histories (they are truncated, so the answers change) is never
//! kv-emb-opt's pick, an epoch's best, nor α*.

mod plots;
mod report;
mod seed;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use grflow_kernels::bench::gemm_peak_gflops;
use grflow_kernels::cost::machine_name;
use grflow_operators::allocator::AllocatorPolicy;
use grflow_operators::allocator::oracle::std_dev;
use grflow_pipeline::replay::ReplayOutput;
use grflow_pipeline::{Clock, Config, ReleaseSetting, ReplayOptions, TraceInput};
use grflow_traces::{Regime, Trace};

use crate::cli::InputError;
use plots::Plots;
use report::{
    Header, NodeSweep, PidGains, Report, SeedReport, SeedsReport, mean_rows, print_means,
    print_table, rows_array,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Regimes, comma-separated: steady, trend, burst.
    #[arg(long, default_value = "steady,trend,burst")]
    pub regime: String,
    /// Base config (default: the embedded one); its trace section sizes the runs.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A `grflow calibrate` file for the config's preset (else calibrated now).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Also pick the tuned baselines on the training seeds (kv-emb-opt's
    /// static α over {0.0, 0.1, …, 1.0}, pid's gains over a grid) and
    /// replay the bench seed at every static α (the sweep plot).
    #[arg(long)]
    pub sweep: bool,
    /// With --sweep: also search one static α per node (`memory.node_alpha`)
    /// on the training seeds and add its row (`kv-emb-opt-node`): every
    /// split of the sweep's grid for up to two nodes (121 per training
    /// seed), else coordinate descent from the sweep's best (about
    /// nodes × 10 replays per round, two or three rounds). With a PPO
    /// policy, `ppo-only-node` and `smart-node` start from that split.
    #[arg(long, requires = "sweep")]
    pub node_sweep: bool,
    /// Trace seed of the bench runs; the sweeps that pick kv-emb-opt's α
    /// and kv-emb-opt-node's split use seed + 1 (… seed + --train-seeds).
    #[arg(long, default_value_t = 42, conflicts_with = "seeds")]
    pub seed: u64,
    /// Several bench seeds, comma-separated (e.g. 42,44,46,48): the whole
    /// bench on each (its sweeps on that seed + 1 …), then per regime and
    /// policy the mean over them (`mean` in the JSON; the seeds' reports
    /// are `per_seed`, their plots go to `--out`/seed-S).
    #[arg(long)]
    pub seeds: Option<String>,
    /// Seeds benched at once with `--seeds` (each replay also runs the
    /// config's workers; decision times, being wall time, suffer when the
    /// jobs outnumber the cores).
    #[arg(long, default_value_t = 1, requires = "seeds")]
    pub jobs: usize,
    /// Training traces of the sweeps (seeds seed + 1 … seed + N): kv-emb-opt
    /// and kv-emb-opt-node minimise their mean P99. One run's P99 moves by
    /// several percent between neighbouring splits, so a search on one
    /// trace partly fits its noise.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16), requires = "sweep")]
    pub train_seeds: u64,
    /// The PPO policy of the `ppo-only` and `smart` rows (a `grflow
    /// train-allocator` file); default the config's
    /// `allocator.policy_file` when it exists, else those rows are left out.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// The latency objective (run.slo_ms) of every run; a policy is
    /// trained for one SLO, so pass the one it was trained with.
    #[arg(long)]
    pub slo_ms: Option<f64>,
    /// Grid step of the oracle α* (HLEM §V: 0.01, 101 replays of every
    /// epoch; 0.05 costs a fifth of that).
    #[arg(long, default_value_t = 0.01, conflicts_with = "no_oracle")]
    pub oracle_step: f64,
    /// Runs the policies without the oracle (paper-shaped presets: their
    /// 8 nodes and long histories make 101 replays per epoch too slow).
    #[arg(long)]
    pub no_oracle: bool,
    /// Writes SVG plots here: per regime α over time against α* (the
    /// oracle's, per node), P99 per policy, and the sweep's P99 against α.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Prints an array with one row per (regime, policy) (and seed, each
    /// row naming its seed); the machines and cost model go to stderr.
    #[arg(long, conflicts_with = "json_report")]
    pub json: bool,
    /// Prints the whole report as one object instead: the machines and
    /// cost model, the rows, the sweep's points and, with `--seeds`, the
    /// means over the seeds. `--out DIR` always writes it as
    /// DIR/report.json.
    #[arg(long)]
    pub json_report: bool,
}

/// The most splits `--node-sweep` scores one by one (two nodes: 121).
const MAX_GRID: usize = 128;

const SWEEP: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// pid's gains searched on the training seeds (kp × ki × kd): the
/// proportional step spans a tenth of the largest move to saturating it at
/// a 100% overshoot, the integral none to a third of that, the derivative
/// none or some.
const PID_KP: [f64; 3] = [0.02, 0.05, 0.15];
const PID_KI: [f64; 3] = [0.0, 0.01, 0.03];
const PID_KD: [f64; 2] = [0.0, 0.05];

pub fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let regimes = regimes(&args.regime)?;
    super::check_count("--jobs", args.jobs, super::MAX_THREADS)?;
    let seeds = bench_seeds(&args)?;
    // Before calibrating, not after it.
    if let Some(dir) = &args.out {
        super::check_out_dir(dir)?;
    }
    if let Some(p) = &args.policy
        && !p.is_file()
    {
        return Err(InputError::from_display(format!(
            "--policy {}: not a file",
            p.display()
        )));
    }
    let (mut base, cost) = virtual_base(
        args.config.as_deref(),
        args.calibration.as_deref(),
        args.slo_ms,
    )?;
    let policy_file = policy_file(args.policy.as_deref(), &mut base)?;
    let oracle_step = (!args.no_oracle).then_some(args.oracle_step);
    if let Some(step) = oracle_step {
        // Replay's own check, before the sweep (which runs without it).
        grflow_pipeline::replay::check_oracle(&base, step).map_err(InputError::from_display)?;
    }
    let bench = Bench {
        base,
        oracle_step,
        regimes,
        learned: policy_file.is_some(),
        sweep: args.sweep,
        node_sweep: args.node_sweep,
        train_seeds: args.train_seeds,
        tagged: args.seeds.is_some(),
    };
    let done = bench.seeds(&seeds, args.jobs)?;
    let wall_s = started.elapsed().as_secs_f64();
    // After the runs, so that it neither disturbs nor waits for them.
    let header = Header {
        clock: "virtual",
        preset: cost.preset.clone(),
        machine: cost.machine.clone(),
        gemm_gflops: cost.gemm_gflops,
        overhead_ms: cost.overhead_ms * bench.base.cost.overhead_scale,
        occupancy_ms: cost.occupancy_ms * bench.base.cost.overhead_scale,
        compute_scale: bench.base.cost.compute_scale,
        extrapolated_past_tokens: grflow_pipeline::params::extrapolated(&cost, &bench.base),
        host_machine: machine_name(),
        host_gemm_gflops: gemm_peak_gflops(),
        slo_ms: bench.base.run.slo_ms.rank,
        policy_file: policy_file.map(|p| p.display().to_string()),
        requests_per_run: bench.base.trace.requests,
        train_seeds: args.train_seeds,
        oracle_step,
    };
    // The plots go after the report is printed: a failed write loses
    // no figure.
    let (per_seed, plots): (Vec<SeedReport>, Vec<_>) = done
        .into_iter()
        .map(|(r, p)| {
            let seed = r.seed;
            (r, (seed, p))
        })
        .unzip();
    if bench.tagged {
        print_seeds(
            &args,
            SeedsReport {
                header,
                seeds,
                mean: mean_rows(&per_seed),
                per_seed,
                wall_s,
            },
        )?;
    } else {
        let mut seed = per_seed.into_iter().next().context("one seed ran")?;
        // One seed: the run's wall time, setup and calibration included, as
        // this report has always given it.
        seed.wall_s = wall_s;
        print_seed(&args, Report { header, seed })?;
    }
    write_plots(args.out.as_deref(), bench.tagged, &plots)
}

/// `--seeds`, else `--seed`; each with room for its training seeds.
fn bench_seeds(args: &Args) -> anyhow::Result<Vec<u64>> {
    let seeds = match &args.seeds {
        Some(list) => seed_list(list)?,
        None => vec![args.seed],
    };
    if let Some(s) = seeds
        .iter()
        .find(|s| s.checked_add(args.train_seeds).is_none())
    {
        return Err(InputError::from_display(format!(
            "seed {s}: its training seeds (seed + 1 … seed + {}) pass the largest seed",
            args.train_seeds
        )));
    }
    Ok(seeds)
}

/// One seed's report: the rows (`--json`), the whole report
/// (`--json-report`) or the table; DIR/report.json with `--out`.
fn print_seed(args: &Args, report: Report) -> anyhow::Result<()> {
    write_report(args, &report)?;
    if args.json {
        eprintln!("{}", report.header.machines_line());
        println!("{}", serde_json::to_string(&rows_array([&report.seed]))?);
    } else if args.json_report {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report.header, &report.seed);
    }
    Ok(())
}

/// Several seeds' report: every seed's rows and their means, printed as
/// [`print_seed`] prints one.
fn print_seeds(args: &Args, report: SeedsReport) -> anyhow::Result<()> {
    write_report(args, &report)?;
    if args.json {
        eprintln!("{}", report.header.machines_line());
        println!("{}", serde_json::to_string(&rows_array(&report.per_seed))?);
    } else if args.json_report {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for s in &report.per_seed {
            println!("seed {}:", s.seed);
            print_table(&report.header, s);
        }
        print_means(&report);
    }
    Ok(())
}

/// `--out DIR`: each seed's plots, in DIR for one seed, in DIR/seed-S for
/// several (`tagged`).
fn write_plots(
    out: Option<&std::path::Path>,
    tagged: bool,
    plots: &[(u64, Plots)],
) -> anyhow::Result<()> {
    let Some(dir) = out else {
        return Ok(());
    };
    for (seed, plots) in plots {
        let dir = if tagged {
            dir.join(format!("seed-{seed}"))
        } else {
            dir.to_path_buf()
        };
        for path in plots.write(&dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// `--out DIR`: the whole report as DIR/report.json, beside the plots
/// (written first: the figures outlive a failed plot).
fn write_report(args: &Args, report: &impl serde::Serialize) -> anyhow::Result<()> {
    let Some(dir) = &args.out else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("report.json");
    std::fs::write(&path, serde_json::to_vec(report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `42,44,46` → the seeds, each once, in order.
fn seed_list(list: &str) -> anyhow::Result<Vec<u64>> {
    let mut seeds = Vec::new();
    for (i, s) in list.split(',').enumerate() {
        let seed: u64 = s.trim().parse().map_err(|e| {
            InputError::from_display(format!(
                "--seeds: item {} ({s:?}) is not a seed: {e}",
                i + 1
            ))
        })?;
        if seeds.contains(&seed) {
            return Err(InputError::from_display(format!(
                "--seeds: seed {seed} is given twice"
            )));
        }
        seeds.push(seed);
    }
    Ok(seeds)
}

/// A static α's runs on the training traces: mean P99, and the requests
/// served with a shortened history or not at all (either makes a run
/// incomparable, so such an α is never kv-emb-opt).
#[derive(Clone, Copy, Debug, Default)]
struct TrainScore {
    p99_ms: f64,
    truncated: u64,
    failed: u64,
}

impl TrainScore {
    fn whole(&self) -> bool {
        self.truncated == 0 && self.failed == 0
    }

    /// "N truncated histories, M failed requests" (what is nonzero).
    fn flaws(&self) -> String {
        let mut parts = Vec::new();
        if self.truncated > 0 {
            parts.push(format!("{} truncated histories", self.truncated));
        }
        if self.failed > 0 {
            parts.push(format!("{} failed requests", self.failed));
        }
        parts.join(", ")
    }
}

/// A seed's report and its plots.
type SeedDone = (SeedReport, Plots);

/// What every seed's runs share.
struct Bench {
    base: Config,
    oracle_step: Option<f64>,
    regimes: Vec<Regime>,
    /// A PPO policy was found: the `ppo-only` and `smart` rows run.
    learned: bool,
    sweep: bool,
    node_sweep: bool,
    train_seeds: u64,
    /// Several seeds: progress lines name theirs.
    tagged: bool,
}

impl Bench {
    /// Every seed's report and plots, in `seeds` order, on up to `jobs`
    /// threads (each replay runs the config's workers besides).
    fn seeds(&self, seeds: &[u64], jobs: usize) -> anyhow::Result<Vec<SeedDone>> {
        if jobs <= 1 || seeds.len() <= 1 {
            return seeds.iter().map(|&s| self.seed(s)).collect();
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done: std::sync::Mutex<Vec<(usize, anyhow::Result<SeedDone>)>> =
            std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..jobs.min(seeds.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&seed) = seeds.get(i) else { break };
                        let out = self.seed(seed);
                        done.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((i, out));
                    }
                });
            }
        });
        let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, r)| r).collect()
    }

    /// One replay of `trace` under `policy` from `alpha` (or the per-node
    /// split), followed by the oracle when `oracle` and the bench runs it.
    fn replay(&self, trace: &Arc<Trace>, run: &Run, oracle: bool) -> anyhow::Result<ReplayOutput> {
        let mut cfg = self.base.clone();
        cfg.memory.alpha = run.alpha;
        cfg.memory.node_alpha = run.node_alpha.clone();
        cfg.allocator.policy = run.policy;
        if let Some(g) = run.gains {
            (cfg.allocator.kp, cfg.allocator.ki, cfg.allocator.kd) = (g.kp, g.ki, g.kd);
        }
        let mut opts = ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg);
        opts.oracle_step = self.oracle_step.filter(|_| oracle);
        // Exact percentiles: the summary's come from a histogram of 1%
        // buckets, as coarse as the differences between policies.
        opts.responses = grflow_pipeline::replay::ResponseOutput::Collect;
        let mut out = grflow_pipeline::replay(opts).map_err(|e| match e {
            // The config's setting the oracle cannot run with, or a
            // setting the job refused.
            e @ (grflow_pipeline::replay::ReplayError::Params(_)
            | grflow_pipeline::replay::ReplayError::Cluster(_)
            | grflow_pipeline::replay::ReplayError::Setup(_)) => InputError::from_display(e),
            e => anyhow::Error::new(e).context("replay"),
        })?;
        out.exact_latency();
        Ok(out)
    }
}

/// The learned rows' policy: `--policy`, else the config's
/// `allocator.policy_file` when it exists (the embedded default's is the
/// shipped policy). Read now, so that a file that is not a policy is the
/// user's error (exit 2) before any run; `base` is set to use it.
fn policy_file(
    arg: Option<&std::path::Path>,
    base: &mut grflow_pipeline::Config,
) -> anyhow::Result<Option<PathBuf>> {
    let file = match arg {
        Some(p) if !p.is_file() => {
            return Err(InputError::from_display(format!(
                "--policy {}: not a file",
                p.display()
            )));
        }
        Some(p) => Some(p.to_path_buf()),
        None => {
            let p = PathBuf::from(&base.allocator.policy_file);
            if !p.is_file() {
                // Said, not silent: the table would just lack two rows.
                eprintln!(
                    "note: allocator.policy_file {} is not a file (relative paths are read from \
                     the working directory); the ppo-only and smart rows are left out (give \
                     --policy FILE to run them)",
                    p.display()
                );
            }
            Some(p).filter(|p| p.is_file())
        }
    };
    if let Some(p) = &file {
        let bytes = std::fs::read(p)
            .map_err(|e| InputError::from_display(format!("--policy {}: {e}", p.display())))?;
        grflow_operators::allocator::ppo::ActorCritic::from_safetensors(&bytes).map_err(|e| {
            InputError::from_display(format!(
                "--policy {} (allocator.policy_file): {e}",
                p.display()
            ))
        })?;
        base.allocator.policy_file = p.display().to_string();
    }
    Ok(file)
}

/// One replay's policy and where it starts.
#[derive(Clone, Debug)]
struct Run {
    label: &'static str,
    policy: AllocatorPolicy,
    alpha: f64,
    /// One α per node instead of `alpha` (`memory.node_alpha`).
    node_alpha: Option<Vec<f64>>,
    /// pid's gains instead of the config's.
    gains: Option<PidGains>,
}

impl Run {
    fn new(label: &'static str, policy: AllocatorPolicy, alpha: f64) -> Self {
        Self {
            label,
            policy,
            alpha,
            node_alpha: None,
            gains: None,
        }
    }
}

/// The pid gains of the grid with the lowest mean P99 on the training
/// traces (`replay` scores one set there: mean P99, and whether every
/// request was served whole); sets that cut histories short or fail
/// requests are never picked (`None`: no set was usable).
fn pid_search(
    tag: &str,
    alpha: f64,
    mut replay: impl FnMut(PidGains) -> anyhow::Result<(f64, bool)>,
) -> anyhow::Result<Option<PidGains>> {
    let mut best: Option<(PidGains, f64)> = None;
    for kp in PID_KP {
        for ki in PID_KI {
            for kd in PID_KD {
                let gains = PidGains {
                    kp,
                    ki,
                    kd,
                    searched: true,
                    train_p99_ms: None,
                };
                let (p99, usable) = replay(gains)?;
                eprintln!(
                    "{tag}  pid kp {kp} ki {ki} kd {kd} from alpha {alpha:.2}: p99 {p99:.4} ms \
                     (training){}",
                    if usable { "" } else { ", not comparable" }
                );
                if usable && best.is_none_or(|(_, b)| p99 < b) {
                    best = Some((gains, p99));
                }
            }
        }
    }
    Ok(best.map(|(gains, p99)| PidGains {
        train_p99_ms: Some(p99),
        ..gains
    }))
}

/// The per-node static split with the lowest mean P99 on the training
/// traces (`replay` scores one split there): the whole grid when it has
/// at most `MAX_GRID` splits, else coordinate descent from the sweep's best
/// single α; splits that cut histories short or fail requests are never
/// picked.
fn node_sweep(
    tag: &str,
    regime: &str,
    nodes: usize,
    start: f64,
    single_p99: f64,
    mut replay: impl FnMut(&[f64]) -> anyhow::Result<(f64, bool)>,
) -> anyhow::Result<NodeSweep> {
    use grflow_operators::allocator::split::{Score, search};
    eprintln!("{tag}{regime}: per-node static search from alpha {start:.1}...");
    let searched = search(nodes, start, &SWEEP, MAX_GRID, 4, |a: &[f64]| {
        let (p99, usable) = replay(a)?;
        eprintln!(
            "{tag}  node_alpha {a:?}: p99 {p99:.4} ms (training){}",
            if usable { "" } else { ", not comparable" }
        );
        Ok::<_, anyhow::Error>(if usable {
            Score::Value(p99)
        } else {
            Score::Unusable
        })
    })?
    .context("the sweep's best alpha was not usable on the training seeds")?;
    Ok(NodeSweep {
        node_alpha: searched.alphas,
        train_p99_ms: searched.score,
        train_p99_ms_single_alpha: single_p99,
        evaluations: searched.evaluations,
        method: if searched.rounds == 0 {
            "grid"
        } else {
            "coordinate descent"
        },
        rounds: searched.rounds,
    })
}

/// `steady,trend,burst` → regimes.
pub(crate) fn regimes(list: &str) -> anyhow::Result<Vec<Regime>> {
    let mut out: Vec<Regime> = Vec::new();
    for r in list.split(',') {
        let regime = r
            .trim()
            .parse::<Regime>()
            .map_err(InputError::from_display)?;
        // Twice would run it twice and overwrite its plots and oracle files.
        if out.contains(&regime) {
            return Err(InputError::from_display(format!(
                "--regime: {} is given twice",
                regime.as_str()
            )));
        }
        out.push(regime);
    }
    Ok(out)
}

/// The config every allocator run starts from: `config` (or the embedded
/// one) on the virtual clock, `complete` release, `--speed max`, no window
/// log, `slo_ms` (`--slo-ms`) for both request kinds when given, charging
/// one cost model (from `calibration`, else calibrated now).
pub(crate) fn virtual_base(
    config: Option<&std::path::Path>,
    calibration: Option<&std::path::Path>,
    slo_ms: Option<f64>,
) -> anyhow::Result<(Config, grflow_kernels::cost::CostModel)> {
    let mut base = match config {
        Some(p) => Config::load(p).map_err(InputError::from_display)?,
        None => Config::embedded(),
    };
    if base.memory.node_alpha.is_some() {
        // Sweeps, baselines and training episodes set one α for every node.
        return Err(InputError::from_display(
            "memory.node_alpha: this command sets α itself; remove it from the config \
             (compare per-node α with `grflow replay`)",
        ));
    }
    if let Some(slo) = slo_ms {
        if !(slo.is_finite() && slo > 0.0) {
            return Err(InputError::from_display("--slo-ms must be positive"));
        }
        base.run.slo_ms = grflow_pipeline::SloMs::both(slo);
    }
    base.run.clock = Clock::Virtual;
    base.run.release = ReleaseSetting::Complete;
    base.run.speed = "max".into();
    base.windows.out = "none".into();
    // --calibration wins over the config's own `cost.calibration`; a bad
    // file is the user's input either way.
    if let Some(p) = calibration {
        base.cost.calibration = Some(p.to_path_buf());
    }
    let cost = if base.cost.calibration.is_some() {
        grflow_pipeline::params::fitted_cost_model(&base).map_err(|e| match calibration {
            // The file at fault is the flag's, not one the config named.
            Some(_) => super::calibration_flag_error(e),
            None => InputError::from_display(e),
        })?
    } else {
        eprintln!(
            "calibrating {} (pass --calibration to reuse a file)...",
            base.model.preset
        );
        let mut cost = grflow_pipeline::params::fitted_cost_model(&base)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // As `grflow calibrate` does: without it a request would cost its
        // model time only, far less than a file fitted here charges.
        super::calibrate::fit_overhead(&mut cost)?;
        cost
    };
    if let Some(warning) = grflow_pipeline::params::extrapolation_warning(&cost, &base) {
        eprintln!("note: {warning}");
    }
    // Every run charges this one model (and says nothing more about it).
    base.cost.model = Some(cost.clone());
    Ok((base, cost))
}

/// The std over epochs of the per-epoch best static α: for each window,
/// the α whose run had the lowest p99 (mean over nodes) in it.
fn per_epoch_best_std(runs: &[(f64, ReplayOutput)]) -> f64 {
    let mut per_epoch: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for (alpha, out) in runs {
        if out.summary.truncated_histories > 0 {
            continue;
        }
        let mut by_window: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        // A window that served nothing reports p99 0: not the best α.
        for w in out.windows.iter().filter(|w| w.failed < w.requests) {
            let e = by_window.entry(w.window_start_ms).or_default();
            e.0 += w.p99_ms;
            e.1 += 1.0;
        }
        for (start, (sum, n)) in by_window {
            per_epoch.entry(start).or_default().push((*alpha, sum / n));
        }
    }
    let best: Vec<f64> = per_epoch
        .values()
        .filter_map(|v| v.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|b| b.0))
        .collect();
    std_dev(&best)
}

#[cfg(test)]
mod tests {
    use super::{PID_KD, PID_KI, PID_KP, pid_search, regimes, seed_list};

    #[test]
    fn regime_lists_refuse_a_regime_twice() {
        assert_eq!(regimes("burst, steady").unwrap().len(), 2);
        let twice = regimes("burst,steady,burst").unwrap_err().to_string();
        assert!(twice.contains("burst is given twice"), "{twice}");
    }

    #[test]
    fn pid_search_scores_the_whole_grid_and_keeps_the_lowest_usable_p99() {
        let mut scored = 0;
        // Lowest at kp 0.15, ki 0.03, kd 0.05, which cuts histories short;
        // the best usable set is kp 0.05, ki 0.01, kd 0.
        let best = pid_search("", 0.25, |g| {
            scored += 1;
            let p99 = 1.0 + (g.kp - 0.05).abs() + (g.ki - 0.01).abs() + g.kd;
            let unusable = (g.kp, g.ki, g.kd) == (0.15, 0.03, 0.05);
            Ok((if unusable { 0.0 } else { p99 }, !unusable))
        })
        .unwrap()
        .unwrap();
        assert_eq!(scored, PID_KP.len() * PID_KI.len() * PID_KD.len());
        assert_eq!((best.kp, best.ki, best.kd), (0.05, 0.01, 0.0));
        assert_eq!(best.train_p99_ms, Some(1.0));
        assert!(best.searched);
        let none = pid_search("", 0.25, |_| Ok((1.0, false))).unwrap();
        assert!(none.is_none(), "no usable set: the config's gains");
    }

    #[test]
    fn seed_lists_parse_in_order_and_name_the_bad_item() {
        assert_eq!(seed_list("42, 44,46").unwrap(), vec![42, 44, 46]);
        let bad = seed_list("42,x").unwrap_err().to_string();
        assert!(bad.contains("item 2") && bad.contains("\"x\""), "{bad}");
        let twice = seed_list("42,44,42").unwrap_err().to_string();
        assert!(twice.contains("seed 42 is given twice"), "{twice}");
    }
}
