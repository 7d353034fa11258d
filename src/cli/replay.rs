//! `grflow replay`: the main job on a trace (or the embedded default).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use grflow_connectors::parquet::WindowSink;
use grflow_operators::allocator::oracle::OracleSummary;
use grflow_pipeline::params::ParamsError;
use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{
    Clock, Config, ReleaseSetting, ReplayError, ReplayOptions, ReplayOutput, Speed, StopRequest,
    TraceInput,
};

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace directory (from `grflow gen-trace` or `grflow import`); without
    /// it grflow generates its embedded default trace in memory.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// TOML config; without it the embedded default (configs/default.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Timely workers (= serving nodes); overrides run.workers.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Pacing: max, 1x, 4x, ...; overrides run.speed.
    #[arg(long)]
    pub speed: Option<String>,
    /// Write summary.json, responses.parquet, windows.parquet, errors.parquet and pictures of the run (latency_cdf.svg, hit_rates.svg, alpha.svg) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Prometheus /metrics, /healthz, /readyz and /status on HOST:PORT
    /// while the replay runs (off unless given; port 0 picks one).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// `--clock virtual`: the cost model from `grflow calibrate` (else the
    /// replay calibrates at start); overrides cost.calibration.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Print summary.json to stdout instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// What latency_ms measures: wall (on this machine, from the request's
    /// due time in a paced replay, else its admission, to the response), event (the
    /// node's deterministic backlog model) or virtual (a cost model fitted
    /// by `grflow calibrate` charged on each node's timeline instead of
    /// running the model; see --calibration); overrides run.clock.
    #[arg(long)]
    pub clock: Option<String>,
    /// When router and nodes handle a request: complete (once every input
    /// passed its event time; deterministic), arrival (on arrival) or auto
    /// (complete with --clock event or virtual, else arrival); overrides run.release.
    #[arg(long)]
    pub release: Option<String>,
    /// No progress bar even on a terminal.
    #[arg(long)]
    pub quiet: bool,
    /// Serve a `grflow train` model directory (its item space must be the
    /// trace's catalog); overrides model.weights.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Follow every node with the oracle α* (HLEM §V) on an α grid of this
    /// step (0.01: 101 replays of every epoch): needs --clock virtual and
    /// lru caches. Prints its gap and regret; with --out writes oracle.json.
    #[arg(long)]
    pub oracle_step: Option<f64>,
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ops = super::start_ops(args.metrics_addr.as_deref(), None)?;
    let config = config_of(&args)?;
    let trace = trace_of(&args, &config)?;
    let show_progress = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let (responses, made_out) = response_output(&args, &config)?;
    let process = config.cluster.process;
    let (config_min_requests, config_epoch_ms) =
        (config.allocator.min_requests, config.windows.epoch_ms);
    // Ctrl-C (or SIGTERM) stops reading the trace; what was read is
    // answered and the outputs are written as for a whole run.
    let stop = StopRequest::default();
    super::stop_on_signals(&stop)?;
    let output = grflow_pipeline::replay(ReplayOptions {
        trace,
        config,
        show_progress,
        responses,
        counters: None,
        commands: Vec::new(),
        oracle_step: args.oracle_step,
        stop: Some(stop.clone()),
    });
    if let (Some(made), Some(dir)) = (made_out, &args.out) {
        let empty = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
        if output.is_ok() || !empty {
            made.keep();
        }
    }
    let output = output.map_err(|e| match e {
        // --model set model.weights: the user never wrote the key.
        ReplayError::Params(ParamsError::Weights(w)) if args.model.is_some() => {
            InputError::from_display(format!("--model: {w}"))
        }
        ReplayError::Params(p) => super::params_error(p, args.config.as_deref()),
        e if e.is_input() => InputError::from_display(e),
        other => anyhow::Error::new(other),
    })?;
    if output.follower {
        return follower_done(&args, process, &stop);
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, &output)
            .with_context(|| format!("writing outputs to {}", dir.display()))?;
    }
    if args.oracle_step.is_some() {
        print_oracle(&output.oracle);
    }
    if let Some(a) = &output.summary.allocator {
        warn_if_undecided(a, config_min_requests, config_epoch_ms)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&output.summary)?);
    } else {
        print!("{}", output.summary.human());
        if let Some(dir) = &args.out {
            println!("outputs in {}", dir.display());
        }
    }
    super::StoppedBySignal::check(&stop)?;
    served_something(&output.summary, args.out.as_deref())
}

/// The config the flags make of `--config` (or the embedded one), checked
/// by flag where a flag set the key, with its warnings and notes said.
fn config_of(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::load(path).map_err(InputError::from_display)?,
        None => Config::embedded(),
    };
    if let Some(m) = &args.model {
        config.model.weights = Some(m.clone());
    }
    if let Some(c) = &args.calibration {
        config.cost.calibration = Some(c.clone());
    }
    if let Some(w) = args.workers {
        super::check_count("--workers", w, super::MAX_THREADS)?;
        config.run.workers = w;
    }
    if let Some(s) = &args.speed {
        s.parse::<Speed>()
            .map_err(|e| InputError::from_display(format!("--speed: {e}")))?;
        config.run.speed = s.clone();
    }
    if let Some(c) = &args.clock {
        config.run.clock = c
            .parse::<Clock>()
            .map_err(|e| InputError::from_display(format!("--clock: {e}")))?;
    }
    if let Some(r) = &args.release {
        config.run.release = r
            .parse::<ReleaseSetting>()
            .map_err(|e| InputError::from_display(format!("--release: {e}")))?;
    }
    args.cluster.apply(&mut config)?;
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    if args.calibration.is_none()
        && config.cost.calibration.is_some()
        && config.run.clock != Clock::Virtual
    {
        eprintln!(
            "note: cost.calibration is used by --clock virtual only; this run's clock is {} \
             and runs the model",
            config.run.clock.as_str()
        );
    }
    if args.calibration.is_some() {
        if config.run.clock != Clock::Virtual {
            // It would be ignored: the run would look like a calibrated one.
            return Err(InputError::from_display(format!(
                "--calibration: only --clock virtual charges a cost model; this run's clock is {}",
                config.run.clock.as_str()
            )));
        }
        // Read as the job's setup will (a small JSON file), to name the
        // flag and not `cost.calibration`, and before the trace is read.
        grflow_pipeline::params::fitted_cost_model(&config)
            .map_err(super::calibration_flag_error)?;
    }
    if config.replay_pacing_is_idle() {
        eprintln!(
            "note: --clock {} with complete release gives the same latencies at any pace; \
             run.speed {:?} only makes this replay slower (--speed max to finish sooner)",
            config.run.clock.as_str(),
            config.run.speed
        );
    }
    Ok(config)
}

/// The trace `--trace` names, or the config's generated one (refused when
/// every generated request would be).
fn trace_of(args: &Args, config: &Config) -> anyhow::Result<TraceInput> {
    Ok(match &args.trace {
        Some(dir) => TraceInput::Parquet(dir.clone()),
        None => {
            let gen_cfg = config
                .trace
                .gen_config()
                .map_err(InputError::from_display)?;
            // A Parquet trace's oversized requests are counted as errors;
            // a generated one would be all oversized, so it is refused.
            if gen_cfg.candidates > config.model.max_candidates {
                return Err(InputError::from_display(format!(
                    "trace.candidates ({}) is more than model.max_candidates ({}): \
                     every generated request would be refused",
                    gen_cfg.candidates, config.model.max_candidates
                )));
            }
            let keys = grflow_traces::generate::BurstSettingNames {
                regime: "trace.regime = \"burst\"",
                requests: "trace.requests",
                rps: "trace.rps",
            };
            // Said under --quiet too, which only hides the progress bar.
            if let Some(warning) = gen_cfg.burst_warning(&keys) {
                eprintln!("{warning}");
            }
            TraceInput::Memory(Arc::new(grflow_traces::generate(&gen_cfg)))
        }
    })
}

/// Where responses and error rows go, and the `--out` directory this run
/// made. Responses stream into responses.parquet.partial as they are
/// produced, renamed once the run has ended well; error rows into sorted
/// runs in errors.parquet.runs, merged into errors.parquet when the job
/// ends. An earlier run's outputs go when the responses file is opened
/// (after the trace, config and model were checked): a run that fails or
/// is interrupted leaves no mix of its files and another run's, and one
/// refused at setup leaves the earlier run's alone. A directory this run
/// makes is removed again if the run is refused at setup (a bad model, a
/// config the job refuses) and left it empty.
fn response_output(
    args: &Args,
    config: &Config,
) -> anyhow::Result<(ResponseOutput, Option<super::OutDir>)> {
    Ok(match &args.out {
        // Process 0 writes the job's outputs; another process leaves --out
        // alone, which may be the same directory (a loopback test, NFS):
        // its cleanup and its own sink used to delete and truncate process
        // 0's responses, and process 0 wrote none.
        Some(_) if config.cluster.process != 0 => (ResponseOutput::Drop, None),
        Some(dir) => (
            ResponseOutput::ParquetReplacing {
                responses: dir.join(PARTIAL_RESPONSES),
                errors: dir.join("errors.parquet"),
                stale: OUTPUT_FILES.iter().map(|name| dir.join(name)).collect(),
            },
            Some(super::OutDir::create(dir)?),
        ),
        None => (ResponseOutput::Drop, None),
    })
}

/// A process other than 0 in cluster mode: process 0 writes the job's
/// outputs; this one says so.
fn follower_done(args: &Args, process: usize, stop: &StopRequest) -> anyhow::Result<()> {
    // Process 0 writes the job's summary and files.
    if stop.requested() {
        eprintln!(
            "process {process}: interrupted by {}: stopped reading its share of the trace \
             and answered what it read; process 0 writes the job's outputs",
            stop.cause()
        );
    } else {
        eprintln!("process {process}: done; process 0 writes the job's outputs");
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "process": process, "outputs": "process 0" })
        );
    }
    super::StoppedBySignal::check(stop)
}

fn print_oracle(oracle: &[grflow_operators::allocator::oracle::OracleEpoch]) {
    match OracleSummary::of(oracle) {
        Some(o) => eprintln!(
            "oracle: {} node-epochs, gap mean |alpha - alpha*| {:.3} (best constant alpha \
             {:.3}, last epoch's alpha* {}), p99 regret {:.3} ms, mean alpha* {:.3}",
            o.epochs,
            o.gap,
            o.gap_best_constant,
            o.gap_previous_star
                .map_or("-".to_string(), |g| format!("{g:.3}")),
            o.regret_ms,
            o.alpha_star_mean
        ),
        None => eprintln!("oracle: no epoch served a request"),
    }
}

/// A moving α whose allocator never decided: said, with the keys to change.
fn warn_if_undecided(
    a: &grflow_pipeline::dataflow::allocator::AllocatorSummary,
    min_requests: u64,
    epoch_ms: u64,
) -> anyhow::Result<()> {
    if a.windows > 0 && a.decisions == 0 {
        eprintln!(
            "warning: allocator.policy {} decided in none of {} windows: each had fewer than \
             allocator.min_requests ({}) requests (raise the load, or lower \
             allocator.min_requests or windows.epoch_ms, {} ms); α stayed where it started",
            serde_json::to_string(&a.policy)?,
            a.windows,
            min_requests,
            epoch_ms
        );
    }
    Ok(())
}

/// A replay that answered every request with an error record served
/// nothing: its outputs are written, and it fails so that a script
/// notices (exit 0 read as a good run).
fn served_something(summary: &grflow_pipeline::Summary, out: Option<&Path>) -> anyhow::Result<()> {
    if summary.requests_in == 0 || summary.responses_out > 0 {
        return Ok(());
    }
    let why = match out {
        Some(dir) => format!("{} says why", dir.join("errors.parquet").display()),
        None => "rerun with --out DIR: DIR/errors.parquet says why".into(),
    };
    anyhow::bail!(
        "no request was served: all {} requests read ended as error records ({why})",
        summary.requests_in
    )
}

/// Every file `replay --out` writes (the charts included).
const OUTPUT_FILES: [&str; 9] = [
    "summary.json",
    "responses.parquet",
    PARTIAL_RESPONSES,
    "windows.parquet",
    "errors.parquet",
    "oracle.json",
    "latency_cdf.svg",
    "hit_rates.svg",
    "alpha.svg",
];

/// Where responses stream until the run has ended.
const PARTIAL_RESPONSES: &str = "responses.parquet.partial";

fn write_outputs(dir: &Path, output: &ReplayOutput) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    // Opened at the start of the run: gone means something else removed it.
    let partial = dir.join(PARTIAL_RESPONSES);
    std::fs::rename(&partial, dir.join("responses.parquet")).with_context(|| {
        format!(
            "{} is gone: the responses of this run are lost (did another job \
             or process use --out {} meanwhile?)",
            partial.display(),
            dir.display()
        )
    })?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&output.summary)?,
    )?;
    let mut windows = WindowSink::create(&dir.join("windows.parquet"))?;
    windows.write(&output.windows)?;
    windows.finish()?;
    // errors.parquet was written by the job as it ended.
    if !output.oracle.is_empty() {
        std::fs::write(
            dir.join("oracle.json"),
            serde_json::to_string_pretty(&output.oracle)?,
        )?;
    } else if dir.join("oracle.json").exists() {
        // An earlier run's, which would sit beside this run's summary.
        std::fs::remove_file(dir.join("oracle.json"))?;
    }
    for (name, chart) in grflow_pipeline::run_charts::run_charts(output) {
        std::fs::write(dir.join(name), chart.to_svg())?;
    }
    Ok(())
}
