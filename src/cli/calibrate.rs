//! `grflow calibrate`: fits the virtual clock's cost model on this machine
//! and writes it as JSON (`cost.calibration` reads it back).

use std::path::PathBuf;

use std::sync::Arc;

use anyhow::Context;
use grflow_kernels::cost::CostModel;
use grflow_pipeline::{Clock, Config, ReplayOptions, TraceInput};
use grflow_traces::{Regime, Trace};

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model preset: small | hstu-3l | hstu-6l.
    #[arg(long, default_value = "small")]
    pub preset: String,
    /// Beam width of retrieve requests (`model.beam_width`).
    #[arg(long, default_value_t = 32)]
    pub beam_width: usize,
    /// Per-beam top-k of retrieve requests (`model.beam_top_k`).
    #[arg(long, default_value_t = 32)]
    pub beam_top_k: usize,
    /// The longest prompt timed (cached plus new tokens, within the model's
    /// positions): set it to the longest history the cost model will charge.
    #[arg(long, default_value_t = grflow_kernels::cost::DEFAULT_FITTED_TOKENS)]
    pub max_tokens: usize,
    /// Repetitions per timing (the fastest is kept).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Write the cost model here (JSON).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace the file already at --out (without it, an existing FILE is
    /// refused before any timing).
    #[arg(long)]
    pub force: bool,
    /// Skip measuring the per-request overhead against a real replay.
    #[arg(long)]
    pub no_overhead: bool,
    /// Then validate on the embedded default trace (not used for fitting):
    /// a real replay at 1x (about 70 s) against the virtual clock.
    #[arg(long)]
    pub validate: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if grflow_kernels::ModelConfig::preset(&args.preset).is_none() {
        return Err(InputError::from_display(format!(
            "--preset {:?} is not one of {:?}",
            args.preset,
            grflow_kernels::ModelConfig::PRESETS
        )));
    }
    if args.beam_width == 0 || args.beam_top_k == 0 || args.reps == 0 {
        return Err(InputError::from_display(
            "--beam-width, --beam-top-k and --reps must be >= 1",
        ));
    }
    // The config's bound: a wider beam allocates width² rows (it aborted
    // at 100,000) and no config could use the file.
    let max = grflow_pipeline::config::MAX_BEAM;
    for (flag, v) in [
        ("--beam-width", args.beam_width),
        ("--beam-top-k", args.beam_top_k),
    ] {
        if v > max {
            return Err(InputError::from_display(format!(
                "{flag} must be at most {max} (model.beam_width's bound) (got {v})"
            )));
        }
    }
    let min = grflow_kernels::cost::MIN_FITTED_TOKENS;
    if args.max_tokens < min {
        return Err(InputError::from_display(format!(
            "--max-tokens {} is too short: the cost model is fitted on prompts of {min} tokens \
             at least",
            args.max_tokens
        )));
    }
    // Before the timings, not after them.
    super::check_out_file(&args.out, args.force)?;
    eprintln!("calibrating {} on this machine...", args.preset);
    let cost = grflow_kernels::cost::calibrate_up_to(
        &args.preset,
        args.beam_width,
        args.beam_top_k,
        args.reps,
        args.max_tokens,
    )
    .map_err(InputError::from_display)?;
    let mut cost = cost;
    if !args.no_overhead {
        fit_overhead(&mut cost)?;
    }
    let json = serde_json::to_string_pretty(&cost)?;
    std::fs::write(&args.out, &json).with_context(|| format!("writing {}", args.out.display()))?;
    if args.validate {
        validate(&args)?;
    }
    println!("{json}");
    eprintln!(
        "{} on {} (GEMM {:.1} GFLOP/s), prompts of up to {} tokens, fit within {:.0}% of its \
         timings, overhead {:.3} ms per request ({:.3} ms busy), {:.1} s; wrote {}",
        cost.preset,
        cost.machine,
        cost.gemm_gflops,
        cost.fitted_tokens,
        cost.fit_max_rel_err * 100.0,
        cost.overhead_ms,
        cost.occupancy_ms,
        cost.calibration_s,
        args.out.display()
    );
    Ok(())
}

/// The default trace replayed for real at 1x and on the virtual clock:
/// p50 and p99 of both and their ratios (virtual / wall).
fn validate(args: &Args) -> anyhow::Result<()> {
    let (preset, calibration) = (&args.preset, &args.out);
    let mut cfg = Config::embedded();
    cfg.model.preset = preset.to_string();
    (cfg.model.beam_width, cfg.model.beam_top_k) = (args.beam_width, args.beam_top_k);
    cfg.windows.out = "none".into();
    let trace = cfg.trace.gen_config().map_err(InputError::from_display)?;
    let trace = Arc::new(grflow_traces::generate(&trace));
    let run = |clock: Clock, speed: &str| -> anyhow::Result<grflow_pipeline::Summary> {
        let mut c = cfg.clone();
        c.run.clock = clock;
        c.run.speed = speed.into();
        c.cost.calibration = Some(calibration.to_path_buf());
        let input = TraceInput::Memory(trace.clone());
        Ok(grflow_pipeline::replay(ReplayOptions::new(input, c))?.summary)
    };
    eprintln!("validating on the default trace: real at 1x, then virtual...");
    let wall = run(Clock::Wall, "1x")?;
    let virt = run(Clock::Virtual, "max")?;
    let no_response = |clock: &str| format!("the {clock}-clock validation run answered no request");
    let w = wall
        .latency_ms
        .as_ref()
        .with_context(|| no_response("wall"))?;
    let v = virt
        .latency_ms
        .as_ref()
        .with_context(|| no_response("virtual"))?;
    let report = serde_json::json!({
        "wall_p50_ms": w.p50, "virtual_p50_ms": v.p50, "p50_ratio": v.p50 / w.p50.max(1e-9),
        "wall_p99_ms": w.p99, "virtual_p99_ms": v.p99, "p99_ratio": v.p99 / w.p99.max(1e-9),
        "wall_s": wall.wall_s, "virtual_wall_s": virt.wall_s,
    });
    eprintln!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// What a request costs besides the model, and how much host time keeps
/// the node busy. The overhead: the median wall latency of a real replay at
/// low load minus the median the cost model alone gives on the same trace.
/// The busy time: what, charged as node time per request, makes the virtual
/// P99 of a Burst replay (where queues build) match the real one; the
/// virtual P99 grows with it, so bisection finds it. Traces with their own
/// seed (not the default's, so that the default replay validates the fit).
pub(crate) fn fit_overhead(cost: &mut CostModel) -> anyhow::Result<()> {
    let mut cfg = Config::embedded();
    cfg.model.preset = cost.preset.clone();
    // The replays search with the beam the model was timed at.
    (cfg.model.beam_width, cfg.model.beam_top_k) = (cost.beam_width, cost.beam_top_k);
    cfg.windows.out = "none".into();
    let mut trace_cfg = cfg.trace.gen_config().map_err(InputError::from_display)?;
    trace_cfg.seed = 7;
    let request_ms = cost.prefill(64, 0) + cost.rank(trace_cfg.candidates, 64);
    let workers = cfg.run.workers as f64;
    // About 20% busy, at most 140 req/s (the source's own cost grows past);
    // 4 s of Steady for the median, about 11 s of Burst for the P99 (its
    // 16th-slowest request).
    let low_rps = (0.2 * workers * 1e3 / request_ms.max(1e-3)).min(140.0);
    // Generated once each: the bisection replays the Burst trace ten times.
    let trace = |regime: Regime, requests: u64| {
        let mut t = trace_cfg.clone();
        (t.regime, t.rps, t.requests) = (regime, low_rps, requests);
        Arc::new(grflow_traces::generate(&t))
    };
    let (steady, burst) = (
        trace(Regime::Steady, ((low_rps * 4.0) as u64).max(100)),
        trace(Regime::Burst, 1600),
    );
    let latency = |trace: &Arc<Trace>, cost: Option<&CostModel>| -> anyhow::Result<(f64, f64)> {
        let mut cfg = cfg.clone();
        (cfg.run.clock, cfg.run.speed) = match cost {
            None => (Clock::Wall, "1x".into()),
            Some(_) => (Clock::Virtual, "max".into()),
        };
        cfg.cost.model = cost.cloned();
        let out =
            grflow_pipeline::replay(ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg))
                .context("calibration replay")?;
        let l = (out.summary.latency_ms.as_ref())
            .context("a calibration replay answered no request")?;
        Ok((l.p50, l.p99))
    };
    eprintln!("measuring the per-request overhead at {low_rps:.0} req/s, real and virtual...");
    let (wall, _) = latency(&steady, None)?;
    cost.overhead_ms = 0.0;
    cost.occupancy_ms = 0.0;
    let (modelled, _) = latency(&steady, Some(cost))?;
    cost.overhead_ms = (wall - modelled).max(0.0);
    eprintln!("  p50 wall {wall:.3} ms, cost model alone {modelled:.3} ms");
    eprintln!("fitting the host time that keeps the node busy on a Burst trace...");
    let (_, wall_p99) = latency(&burst, None)?;
    // The most host time per request the search tries.
    let bound = 3.0 * cost.overhead_ms + request_ms;
    let (mut lo, mut hi) = (0.0, bound);
    for _ in 0..10 {
        cost.occupancy_ms = (lo + hi) / 2.0;
        let (_, p99) = latency(&burst, Some(cost))?;
        if p99 < wall_p99 {
            lo = cost.occupancy_ms
        } else {
            hi = cost.occupancy_ms
        }
    }
    cost.occupancy_ms = (lo + hi) / 2.0;
    eprintln!(
        "  p99 wall {wall_p99:.3} ms; {:.3} ms per request keeps the node busy",
        cost.occupancy_ms
    );
    if bound - cost.occupancy_ms < bound / 256.0 {
        // Queueing behind host work cannot explain this tail: what is left
        // is the machine's (a neighbour, the scheduler), not the model's.
        eprintln!(
            "  warning: that is the search's bound ({bound:.3} ms): the wall p99 stays above \
             every virtual one, so this machine's tail is not queueing on the node"
        );
    }
    Ok(())
}
