//! `grflow serve`: the long-lived Kafka job. SIGINT/SIGTERM stop reading,
//! drain what is in flight (for at most `kafka.drain_timeout_ms`; the
//! summary then says `drain_timed_out: true`), commit, print the summary and
//! exit 0; a second signal exits at once (1). An output that can be neither
//! delivered nor dead-lettered stops the job with an error (1).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use grflow_pipeline::params::ParamsError;
use grflow_pipeline::{ServeError, ServeOptions};
use signal_hook::consts::{SIGINT, SIGTERM};

use super::InputError;

/// Where `serve` answers /metrics and the health checks unless told.
const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub kafka: super::KafkaArgs,
    /// Timely workers (= serving nodes); overrides run.workers.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Consumer group; overrides kafka.group_id.
    #[arg(long)]
    pub group: Option<String>,
    /// Serve a `grflow train` model directory (its item space must be the
    /// catalog's); overrides model.weights.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prometheus /metrics, /healthz, /readyz and /status on HOST:PORT
    /// ("none": off). Default 127.0.0.1:9464, skipped with a warning if
    /// that port is taken; an address given here must bind.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Admin endpoint on a loopback HOST:PORT (off unless given):
    /// `POST /model` with a `grflow train` model directory as the body
    /// swaps every node to it without a restart; `GET /model` says what
    /// each node serves.
    #[arg(long)]
    pub admin_addr: Option<String>,
    /// A model directory, or a symlink to one, served from the start (in
    /// place of --model) and watched every second: when the `model_version`
    /// in its model.json changes, every node swaps to it (as `POST /model`
    /// would).
    #[arg(long)]
    pub model_watch: Option<PathBuf>,
    /// Check everything a start checks (config, side tables, model, every
    /// topic, where each partition would resume, the restart scan,
    /// windows.out), print the findings as JSON and exit: 0 when the job
    /// could start. Consumes, commits, creates and produces nothing.
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut config = args.kafka.load()?;
    if let Some(m) = &args.model {
        config.model.weights = Some(m.clone());
    }
    // A watched model is served from the start, not only once it changes:
    // otherwise a restarted job would go back to --model (or the seeded
    // weights) until the link next moved.
    if let Some(watched) = &args.model_watch {
        // A typo or an unmounted volume would otherwise serve the seeded
        // (or --model's) weights while the watcher waited in silence.
        if !watched.join("model.json").is_file() {
            return Err(InputError::from_display(format!(
                "--model-watch {}: no model.json there (it must be a `grflow train` model \
                 directory, or a link to one, when serve starts: the watched model is served \
                 from the first request)",
                watched.display()
            )));
        }
        let dir = std::fs::canonicalize(watched).unwrap_or_else(|_| watched.clone());
        if let Some(other) = &config.model.weights
            && std::fs::canonicalize(other).ok().as_ref() != Some(&dir)
        {
            tracing::warn!(
                watched = %dir.display(),
                ignored = %other.display(),
                "--model-watch decides the model served from the start; model.weights (or --model) is ignored"
            );
        }
        config.model.weights = Some(dir);
    }
    if let Some(g) = args.group {
        // Past the config's own check, which refuses an empty group.
        if g.trim().is_empty() {
            return Err(InputError::from_display("--group must not be empty"));
        }
        config.kafka.group_id = g;
    }
    if let Some(w) = args.workers {
        super::check_count("--workers", w, super::MAX_THREADS)?;
        config.run.workers = w;
    }
    args.cluster.apply(&mut config)?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    // The flag that set model.weights, if any, names its errors.
    let model_flag = match (&args.model_watch, &args.model) {
        (Some(_), _) => Some("--model-watch"),
        (None, Some(_)) => Some("--model"),
        (None, None) => None,
    };
    let config_path = args.kafka.config_path();
    let to_input = |e: ServeError| match (e, model_flag) {
        (ServeError::Params(ParamsError::Weights(w)), Some(flag)) => {
            InputError::from_display(format!("{flag}: {w}"))
        }
        (ServeError::Params(p), _) => super::params_error(p, config_path.as_deref()),
        (
            e @ (ServeError::Config(_)
            | ServeError::Cluster(_)
            | ServeError::Catalog(_)
            | ServeError::Admin(_)),
            _,
        ) => InputError::from_display(e),
        (other, _) => anyhow::Error::new(other),
    };
    let opts = ServeOptions {
        config,
        admin_addr: args.admin_addr,
        model_watch: args.model_watch,
    };
    if args.check {
        // Bound as a start binds it (a given address that cannot be bound
        // is an error, the default one a warning), and held during the
        // check, so that an --admin-addr on the same port fails here too.
        let _ops = super::start_ops(args.metrics_addr.as_deref(), Some(DEFAULT_METRICS_ADDR))?;
        let report = grflow_pipeline::check_serve(&opts).map_err(to_input)?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    // The first signal asks for a drain; a second exits at once (exit 1).
    grflow_pipeline::on_signals(&[SIGINT, SIGTERM], stop.clone(), None, |_| 1)?;
    let _ops = super::start_ops(args.metrics_addr.as_deref(), Some(DEFAULT_METRICS_ADDR))?;
    tracing::info!(brokers = %opts.config.kafka.brokers, topic = %opts.config.kafka.request_topic,
        workers = opts.config.run.workers, "grflow serve starting");
    let summary = grflow_pipeline::serve(opts, stop).map_err(to_input)?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}
