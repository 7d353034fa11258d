//! `grflow gen-trace`: writes a synthetic trace (HLEM §V regimes) as a
//! trace directory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use grflow_traces::{GenConfig, Regime, Trace, WriteOptions, generate, write_trace};

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Workload regime: steady, trend or burst.
    #[arg(long, default_value = "steady")]
    pub regime: Regime,
    /// Users (the hottest 5% are the hot users).
    #[arg(long, default_value_t = GenConfig::default().users)]
    pub users: u64,
    /// Items in the catalog.
    #[arg(long, default_value_t = GenConfig::default().items)]
    pub items: u32,
    /// Requests to generate.
    #[arg(long, default_value_t = GenConfig::default().requests)]
    pub requests: u64,
    /// Mean arrival rate (requests per second of event time; bursts double it).
    #[arg(long, default_value_t = GenConfig::default().rps)]
    pub rps: f64,
    /// Seed of the ChaCha8 generator: same seed, same bytes.
    #[arg(long, default_value_t = GenConfig::default().seed)]
    pub seed: u64,
    /// Embedding tables T (table 0 is the item id).
    #[arg(long, default_value_t = GenConfig::default().tables)]
    pub tables: u16,
    /// Share of requests in generative-retrieval mode.
    #[arg(long, default_value_t = GenConfig::default().retrieve_share)]
    pub retrieve_share: f64,
    /// Semantic-ID codebook size C (C³ >= items).
    #[arg(long, default_value_t = GenConfig::default().codebook_size)]
    pub codebook_size: u16,
    /// Candidates per rank request (the label plus popularity-sampled items).
    #[arg(long, default_value_t = GenConfig::default().candidates)]
    pub candidates: usize,
    /// Shortest initial user history (items): lengths are log-uniform in
    /// [min-history, max-history).
    #[arg(long, default_value_t = GenConfig::default().min_history)]
    pub min_history: u32,
    /// Bound of the initial user history (items), exclusive: lengths are
    /// log-uniform in [min-history, max-history) (min-history when equal).
    #[arg(long, default_value_t = GenConfig::default().max_history)]
    pub max_history: u32,
    /// Rows per row group of requests.parquet (the unit of sharding over workers).
    #[arg(long, default_value_t = grflow_traces::DEFAULT_ROW_GROUP_ROWS)]
    pub row_group_rows: usize,
    /// Trace directory to write (requests.parquet, users.parquet, items.parquet).
    #[arg(long)]
    pub out: PathBuf,
    /// No progress display.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let cfg = GenConfig {
        regime: args.regime,
        users: args.users,
        items: args.items,
        requests: args.requests,
        rps: args.rps,
        seed: args.seed,
        tables: args.tables,
        retrieve_share: args.retrieve_share,
        codebook_size: args.codebook_size,
        candidates: args.candidates,
        min_history: args.min_history,
        max_history: args.max_history,
        ..GenConfig::default()
    };
    cfg.validate().map_err(InputError::from_display)?;
    if args.row_group_rows == 0 {
        return Err(InputError::from_display(
            "--row-group-rows must be >= 1 (got 0)",
        ));
    }
    // Before generating: a bad --out would otherwise fail after it.
    check_not_a_model(&args.out)?;
    // A Burst trace too short for a burst is written (tests and small
    // replays use them) but is statistically Steady: say so.
    if let Some(warning) = cfg.burst_warning(&grflow_traces::generate::GEN_TRACE_FLAGS) {
        eprintln!("{warning}");
    }
    // Removed again if the run fails: no empty or half-written trace.
    let out = super::OutDir::create(&args.out)?;
    let start = Instant::now();
    let progress = Progress::new(args.quiet);
    progress.stage(format!(
        "generating {} {} requests",
        cfg.requests,
        cfg.regime.as_str()
    ));
    let trace = generate(&cfg);
    write_and_summarise(&args.out, &trace, args.row_group_rows, &progress, start)?;
    out.keep();
    Ok(())
}

/// Refuses an `--out` holding a `grflow train` model: a trace's
/// items.parquet would replace the model's (gen-trace and import; `train`
/// refuses the other way round).
pub(crate) fn check_not_a_model(out: &std::path::Path) -> anyhow::Result<()> {
    use grflow_train::artifact::{MODEL_JSON, WEIGHTS_FILE};
    if let Some(f) = [MODEL_JSON, WEIGHTS_FILE]
        .into_iter()
        .find(|f| out.join(f).exists())
    {
        return Err(InputError::from_display(format!(
            "--out {}: holds a model ({f}; writing the trace there would replace its \
             items.parquet); choose another directory",
            out.display()
        )));
    }
    Ok(())
}

/// Writes a trace directory and prints its short summary (gen-trace and
/// import end the same way).
pub(crate) fn write_and_summarise(
    out: &std::path::Path,
    trace: &Trace,
    row_group_rows: usize,
    progress: &Progress,
    start: Instant,
) -> anyhow::Result<()> {
    progress.stage(format!("writing {}", out.display()));
    let opts = WriteOptions {
        row_group_rows,
        ..WriteOptions::default()
    };
    write_trace(out, trace, &opts).map_err(InputError::from_display)?;
    progress.done();
    print!("{}", summary(out, trace, row_group_rows, start.elapsed()));
    Ok(())
}

/// A spinner with the current stage on a terminal; nothing otherwise.
pub(crate) struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    pub(crate) fn new(quiet: bool) -> Self {
        use std::io::IsTerminal;
        let show = !quiet && std::io::stderr().is_terminal();
        Self(show.then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        }))
    }

    pub(crate) fn stage(&self, msg: String) {
        if let Some(bar) = &self.0 {
            bar.set_message(msg);
        }
    }

    pub(crate) fn done(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// A few lines a person reads after a trace is written.
pub(crate) fn summary(
    out: &std::path::Path,
    trace: &Trace,
    row_group_rows: usize,
    took: Duration,
) -> String {
    let reqs = &trace.requests;
    let span_s = match (reqs.first(), reqs.last()) {
        (Some(a), Some(b)) => (b.ts_ms - a.ts_ms) as f64 / 1000.0,
        _ => 0.0,
    };
    let min_hist = reqs.iter().map(|r| r.hist_len).min().unwrap_or(0);
    let max_hist = reqs.iter().map(|r| r.hist_len).max().unwrap_or(0);
    let mean_hist = reqs.iter().map(|r| r.hist_len as f64).sum::<f64>() / reqs.len().max(1) as f64;
    let mut s = format!(
        "wrote {}: {} requests over {:.1} s of event time in {} row groups, {} users, {} items\n",
        out.display(),
        reqs.len(),
        span_s,
        reqs.len().div_ceil(row_group_rows),
        trace.users.len(),
        trace.items.len()
    );
    s += &format!(
        "history length per request: min {}, mean {:.1}, max {}\n",
        min_hist, mean_hist, max_hist
    );
    if let Some(meta) = &trace.meta {
        s += &format!("source: {}\n", meta.source);
    }
    s += &format!("took {:.2} s\n", took.as_secs_f64());
    s
}
