//! `grflow replay`: runs the serving dataflow over a trace on N timely
//! workers. Responses and error rows stream to their sinks as they are
//! produced (Parquet files, or nowhere once counted); the summary's
//! percentiles come from bounded histograms, so memory does not grow with
//! the number of requests or errors. Windowed statistics and the summary
//! are returned; writing them is the caller's business.

mod assemble;
mod worker;
mod writers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use grflow_connectors::parquet::{
    ErrorSink, ParquetRequestSource, SinkError, SourceError, load_side_tables,
};
use grflow_connectors::{ErrorRow, ResponseRow, WindowRow};
use grflow_operators::allocator::oracle::OracleEpoch;
use grflow_operators::cache::GuidedPolicy;
use grflow_traces::{Request, Trace};

use crate::cluster::ClusterError;
use crate::config::{Clock, Config, Release};
use crate::dataflow::JobCounters;
use crate::events::{ScheduledCommand, Target};
use crate::job::{Job, JobError};
use crate::params::ParamsError;
use crate::serving_setup::ServingSetup;
use crate::side::SideTables;
use crate::stop::StopRequest;
use crate::summary::{Interrupted, Summary};
use assemble::assemble;
use worker::{CounterSnapshot, WorkerContext};
use writers::open_writers;

/// Where the requests come from.
#[derive(Clone, Debug)]
pub enum TraceInput {
    /// A trace directory written by `grflow gen-trace` or `grflow import`.
    Parquet(PathBuf),
    /// A trace held in memory (the embedded default).
    Memory(Arc<Trace>),
}

/// Where responses and error rows go as they are produced.
#[derive(Clone, Debug, Default)]
pub enum ResponseOutput {
    /// Counted and tallied into the summary, then dropped.
    #[default]
    Drop,
    /// Responses appended to a Parquet file (responses.parquet) in the
    /// order produced; error rows to another (errors.parquet), written in
    /// position order when the job ends (sorted in bounded memory,
    /// `ErrorSink`).
    Parquet { responses: PathBuf, errors: PathBuf },
    /// As `Parquet`, after removing `stale` (an earlier run's outputs)
    /// where the responses file is opened, once the job's setup has
    /// passed: a run refused at setup leaves them as they were.
    ParquetReplacing {
        responses: PathBuf,
        errors: PathBuf,
        stale: Vec<PathBuf>,
    },
    /// Kept in memory and returned in `ReplayOutput::responses` and
    /// `ReplayOutput::errors`: for tests and small runs only, since it
    /// grows with the run.
    Collect,
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub trace: TraceInput,
    pub config: Config,
    /// Called about every 200 ms with (requests_in, responses_out + errors, total expected).
    pub show_progress: bool,
    pub responses: ResponseOutput,
    /// Counters the job updates as it runs, for a caller that watches its
    /// progress (e.g. `grflow bench memory`); fresh ones when `None`.
    pub counters: Option<Arc<JobCounters>>,
    /// Commands for the nodes, each applied at its event time (in
    /// `complete` mode exactly between the requests before and at it).
    pub commands: Vec<ScheduledCommand>,
    /// The oracle α* per node and epoch (`windows.epoch_ms`) on an α grid
    /// of this step (HLEM §V uses 0.01): the virtual clock, `complete`
    /// release and `lru` caches only. Each epoch is replayed once per α.
    pub oracle_step: Option<f64>,
    /// Once requested (by a signal handler), the workers read no more of
    /// the trace, answer what they read and end; the summary then says
    /// `interrupted`.
    pub stop: Option<StopRequest>,
}

impl ReplayOptions {
    /// A replay of `trace` under `config` that drops responses, shows no
    /// progress and sends no commands.
    pub fn new(trace: TraceInput, config: Config) -> Self {
        Self {
            trace,
            config,
            show_progress: false,
            responses: ResponseOutput::Drop,
            counters: None,
            commands: Vec::new(),
            oracle_step: None,
            stop: None,
        }
    }
}

/// What a replay produced.
#[derive(Debug, Default)]
pub struct ReplayOutput {
    /// Cluster mode, a process other than 0: it served its share and sent
    /// its outputs to process 0; everything below is empty.
    pub follower: bool,
    pub summary: Summary,
    /// The latency CDF of every response (`LatencyTally::cdf`).
    pub latency_cdf: Vec<(f64, f64)>,
    /// With `ResponseOutput::Collect` only, sorted by req_id; empty otherwise.
    pub responses: Vec<ResponseRow>,
    pub windows: Vec<WindowRow>,
    /// With `ResponseOutput::Collect` only, in errors.parquet's order
    /// (`ErrorSink::sort`); empty otherwise (`summary.errors` counts them).
    pub errors: Vec<ErrorRow>,
    /// At most this many error rows were held in memory at once: every
    /// worker's batch waiting for the error sink at its largest, plus the
    /// most the error file's sink held (its sort buffer, or the runs it
    /// merged). Without `ResponseOutput::Collect` it does not grow with
    /// the number of errors.
    pub errors_held_peak: usize,
    /// Training (`allocator.sample`): every node's allocator decisions with
    /// their rewards, by node, in order.
    pub allocator_steps: Vec<(u32, grflow_operators::allocator::ppo::Step)>,
    /// With `oracle_step`: α* of every node and epoch, by node then epoch.
    pub oracle: Vec<OracleEpoch>,
}

impl ReplayOutput {
    /// Replaces the summary's latency percentiles (upper edges of 1%-wide
    /// histogram buckets) by the exact nearest-rank ones of the collected
    /// responses, and drops the responses. A run without
    /// `ResponseOutput::Collect` keeps the histogram's. Each kind's figures
    /// in `summary.by_mode` stay the histogram's (a response does not say
    /// which kind of request it answers): see `exact_latency_by_mode`.
    pub fn exact_latency(&mut self) {
        let responses = std::mem::take(&mut self.responses);
        if !responses.is_empty() {
            self.summary.latency_ms = Some(crate::summary::LatencySummary::from_unsorted(
                responses.iter().map(|r| r.latency_ms).collect(),
            ));
        }
    }

    /// As `exact_latency`, and each request kind's percentiles in
    /// `summary.by_mode` exact too, so that a kind's p99 compares with the
    /// run's: each collected response is joined by req_id to the request
    /// of `requests` (the trace replayed) it answers, for its kind. Where
    /// that cannot tell every response's kind (a req_id not in `requests`,
    /// or carried by requests of both kinds), or the kinds' counts differ
    /// from the summary's, `by_mode` keeps the histogram's.
    pub fn exact_latency_by_mode(&mut self, requests: &[Request]) {
        if let Some([rank, retrieve]) = latencies_by_mode(&self.responses, requests) {
            let by_mode = &mut self.summary.by_mode;
            if rank.len() as u64 == by_mode.rank.responses
                && retrieve.len() as u64 == by_mode.retrieve.responses
            {
                for (mode, latencies) in
                    [(&mut by_mode.rank, rank), (&mut by_mode.retrieve, retrieve)]
                {
                    if !latencies.is_empty() {
                        mode.latency_ms =
                            Some(crate::summary::LatencySummary::from_unsorted(latencies));
                    }
                }
            }
        }
        self.exact_latency();
    }
}

/// The latencies of `responses` to rank and to retrieve requests, each
/// response's kind that of its req_id in `requests`; `None` when some
/// response's kind cannot be told (or nothing was collected).
fn latencies_by_mode(responses: &[ResponseRow], requests: &[Request]) -> Option<[Vec<f64>; 2]> {
    use grflow_traces::Mode;
    if responses.is_empty() {
        return None;
    }
    // req_id -> its requests' kind; None where requests of both kinds share it.
    let mut kinds = std::collections::HashMap::<u64, Option<Mode>>::with_capacity(requests.len());
    for r in requests {
        kinds
            .entry(r.req_id)
            .and_modify(|kind| {
                if *kind != Some(r.mode) {
                    *kind = None;
                }
            })
            .or_insert(Some(r.mode));
    }
    let (mut rank, mut retrieve) = (Vec::new(), Vec::new());
    for r in responses {
        match kinds.get(&r.req_id).copied().flatten()? {
            Mode::Rank => rank.push(r.latency_ms),
            Mode::Retrieve => retrieve.push(r.latency_ms),
        }
    }
    Some([rank, retrieve])
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The node parameters (`model.*`, `memory.*`, `cost.*`): typed, so
    /// that the binary can name the flag that set the key.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// `[cluster]`, likewise.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The rest of the setup, in words that name the key.
    #[error("{0}")]
    Setup(String),
    #[error("timely: {0}")]
    Timely(String),
    #[error("worker {0} panicked")]
    WorkerPanicked(usize),
    #[error("writing the responses or errors file: {0}")]
    Sink(#[from] SinkError),
    #[error(
        "process 0 gathered the results of {got} of {want} workers (the others timed out \
         or could not be read): the job's summary would be incomplete"
    )]
    Incomplete { got: usize, want: usize },
}

impl ReplayError {
    /// The config or the trace is at fault, not the run: the user's to fix
    /// (exit code 2 in the binary).
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            Self::Source(_) | Self::Params(_) | Self::Cluster(_) | Self::Setup(_)
        )
    }
}

impl From<JobError> for ReplayError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Cluster(e) => Self::Cluster(e),
            JobError::Params(e) => Self::Params(e),
            JobError::Other(m) => Self::Setup(m),
        }
    }
}

/// The trace as the job needs it before the workers start.
struct LoadedTrace {
    side: SideTables,
    /// The requests of an in-memory trace (a Parquet trace is read by the
    /// workers, each its shard).
    requests: Option<Arc<Vec<Request>>>,
    rows: u64,
    /// The first request's event time.
    origin_ts_ms: u64,
    /// The event time the trace covers, first request to last (None where
    /// a row group's range is unknown).
    span_ms: Option<u64>,
    /// What the summary calls it.
    name: String,
}

/// Loads the side tables and looks at the requests (without reading them
/// from a Parquet trace).
fn load_trace(trace: &TraceInput, shard_rows: u32) -> Result<LoadedTrace, ReplayError> {
    let setup = |e: crate::side::SideError| ReplayError::Setup(e.to_string());
    match trace {
        TraceInput::Parquet(dir) => {
            let tables = load_side_tables(dir)?;
            let side = SideTables::new(tables.meta, tables.users, tables.items, shard_rows)
                .map_err(setup)?;
            let info = ParquetRequestSource::inspect(dir)?;
            Ok(LoadedTrace {
                side,
                requests: None,
                rows: info.rows,
                origin_ts_ms: info.min_ts_ms,
                span_ms: (info.rows > 0 && info.max_ts_ms != u64::MAX)
                    .then(|| info.max_ts_ms.saturating_sub(info.min_ts_ms)),
                name: dir.display().to_string(),
            })
        }
        TraceInput::Memory(trace) => {
            let meta = trace
                .meta
                .clone()
                .ok_or_else(|| ReplayError::Setup("in-memory trace has no metadata".into()))?;
            let side = SideTables::new(meta, trace.users.clone(), trace.items.clone(), shard_rows)
                .map_err(setup)?;
            let requests: Arc<Vec<Request>> = Arc::new(trace.requests.clone());
            let (lo, hi) = requests.iter().fold((u64::MAX, 0), |(lo, hi), r| {
                (lo.min(r.ts_ms), hi.max(r.ts_ms))
            });
            Ok(LoadedTrace {
                name: format!("embedded default ({})", side.meta.source),
                side,
                rows: requests.len() as u64,
                origin_ts_ms: requests.first().map_or(0, |r| r.ts_ms),
                span_ms: (lo <= hi).then(|| hi - lo),
                requests: Some(requests),
            })
        }
    }
}

/// Refuses commands for nodes the job does not have, or that are not valid.
fn check_commands(commands: &[ScheduledCommand], workers: usize) -> Result<(), ReplayError> {
    for c in commands {
        if matches!(c.target, Target::Node(n) if n as usize >= workers) {
            return Err(ReplayError::Setup(format!(
                "command {:?} at {} ms is for {:?}, but the job has {workers} nodes",
                c.command, c.at_ms, c.target
            )));
        }
        c.command
            .validate()
            .map_err(|e| ReplayError::Setup(format!("command at {} ms: {e}", c.at_ms)))?;
    }
    Ok(())
}

pub fn replay(opts: ReplayOptions) -> Result<ReplayOutput, ReplayError> {
    let cfg = opts.config.clone();
    // Side tables are loaded once and shared by every worker thread.
    let trace = load_trace(&opts.trace, cfg.node.shard_rows)?;
    let meta = trace.side.meta.clone();
    let mut job = Job::prepare(cfg.clone(), trace.side)?;
    let topo = job.topology();
    if topo.is_cluster() {
        // Every process must read one trace (each reads its shard of it):
        // its catalog, length and time span, not its path, which may
        // differ from machine to machine.
        job.cluster.parts.insert(
            "the trace".into(),
            crate::handshake::digest(&(&meta, trace.rows, trace.origin_ts_ms, trace.span_ms)),
        );
    }
    // Process 0 writes the summary, so it alone checks (and warns).
    let duplicate_req_ids = match &opts.trace {
        TraceInput::Parquet(dir) if topo.is_leader() => check_req_ids(dir)?,
        _ => None,
    };
    // Nodes of the whole job; this process runs `topo.local_workers()`.
    let workers = topo.total();
    check_commands(&opts.commands, workers)?;
    if let Some(step) = opts.oracle_step {
        check_oracle(&cfg, step)?;
    }
    // In cluster mode only process 0 writes responses and error rows
    // (gathered to it).
    let response_output = if topo.is_leader() {
        opts.responses.clone()
    } else {
        ResponseOutput::Drop
    };
    let (writer, error_writer) = open_writers(&response_output)?;
    let (writer, error_writer) = (
        Arc::new(Mutex::new(writer)),
        Arc::new(Mutex::new(error_writer)),
    );
    job.publish("replay", serde_json::json!({ "trace": trace.name }));
    let counters = opts.counters.clone().unwrap_or_default();
    // Pacing starts when the workers do: in cluster mode after every
    // process has connected, which may take a while.
    let started: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let setup_error: Arc<Mutex<Option<String>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let progress = opts
        .show_progress
        .then(|| spawn_progress(counters.clone(), trace.rows, done.clone()));
    let failure = crate::worker_failure::WorkerFailure::default();
    let ctx = WorkerContext {
        setup: ServingSetup::of(&job),
        topo,
        origin_ts_ms: trace.origin_ts_ms,
        trace: opts.trace.clone(),
        requests: trace.requests,
        commands: opts.commands.clone(),
        oracle_step: opts.oracle_step,
        counters: counters.clone(),
        writer: writer.clone(),
        error_writer: error_writer.clone(),
        setup_error: setup_error.clone(),
        started: started.clone(),
        stop: opts.stop.clone(),
        failure: failure.clone(),
        local_done: Barrier::new(topo.threads),
    };
    let guards = job
        .cluster
        .execute(
            move |worker| worker::run(worker, &ctx),
            // A stop while waiting for the peers ends the process: nothing
            // was read (otherwise a follower ignored the first SIGTERM).
            opts.stop.as_ref().map(|s| s.flag.clone()),
        )
        .map_err(|e| match e {
            crate::cluster::ExecuteError::Mismatch(m) => ReplayError::Setup(m),
            crate::cluster::ExecuteError::Timely(m) => ReplayError::Timely(m),
        })?;

    let mut results = Vec::with_capacity(workers);
    let joined = guards.join();
    if let Some(worker) = failure.failed() {
        return Err(ReplayError::WorkerPanicked(worker));
    }
    for (i, r) in joined.into_iter().enumerate() {
        let global = topo.local_workers().start + i;
        results.extend(r.map_err(|_| ReplayError::WorkerPanicked(global))?);
    }
    let start = *started.get_or_init(Instant::now);
    done.store(true, Ordering::Relaxed);
    if let Some(handle) = progress {
        let _ = handle.join();
    }
    if let Some(e) = setup_error.lock().expect("lock").take() {
        return Err(ReplayError::Setup(e));
    }
    let wall_s = start.elapsed().as_secs_f64();
    let writer = Arc::try_unwrap(writer)
        .map_err(|_| ReplayError::Setup("a worker still holds the response sink".into()))?
        .into_inner()
        .expect("lock");
    let (mut responses, _) = writer.finish()?;
    let error_writer = Arc::try_unwrap(error_writer)
        .map_err(|_| ReplayError::Setup("a worker still holds the error sink".into()))?
        .into_inner()
        .expect("lock");
    if !topo.is_leader() {
        return Ok(ReplayOutput {
            follower: true,
            ..ReplayOutput::default()
        });
    }
    responses.sort_by_key(|r| r.req_id);
    if results.len() != workers {
        // The error sink goes unfinished: no errors.parquet of a job
        // whose summary cannot be made.
        return Err(ReplayError::Incomplete {
            got: results.len(),
            want: workers,
        });
    }
    // Written now, from the sorted runs the sink spilled as the job ran.
    let (mut errors, errors_held_peak) = error_writer.finish()?;
    ErrorSink::sort(&mut errors);
    let totals = if topo.is_cluster() {
        let mut sum = CounterSnapshot::default();
        for r in &results {
            if let Some(c) = &r.counters {
                sum.add(c);
            }
        }
        sum
    } else {
        CounterSnapshot::of(&counters)
    };
    let mut out = assemble(results, &cfg, totals, workers, wall_s, trace.name);
    match opts.stop.as_ref().filter(|s| s.requested()) {
        // The event time read, not the whole trace's.
        Some(stop) => {
            out.summary.event_time_s =
                totals.newest_ts_ms.saturating_sub(trace.origin_ts_ms) as f64 / 1000.0;
            out.summary.interrupted = Some(Interrupted {
                signal: stop.cause(),
                trace_rows: trace.rows,
            })
        }
        None => {
            if let Some(span) = trace.span_ms {
                out.summary.event_time_s = span as f64 / 1000.0;
            }
        }
    }
    out.summary.duplicate_req_ids = duplicate_req_ids;
    out.responses = responses;
    out.errors = errors;
    out.errors_held_peak += errors_held_peak;
    Ok(out)
}

/// Distinct req_ids the repeat check holds at once (~20 bytes each): a
/// longer trace is checked in several passes over its req_id column.
const ID_CHECK_PER_PASS: u64 = 4_000_000;

/// Counts the trace's rows whose req_id an earlier row carries, and warns
/// with the first: each is served, so nothing is lost, but their answers
/// cannot be told apart by id.
fn check_req_ids(dir: &std::path::Path) -> Result<Option<u64>, ReplayError> {
    let found = ParquetRequestSource::duplicate_req_ids(dir, ID_CHECK_PER_PASS)?;
    match &found {
        None => tracing::info!(
            "req_ids not checked for repeats: the req_id column cannot be read as u64 (its rows \
             are reported one by one)"
        ),
        Some(d) => {
            if !d.unreadable_groups.is_empty() {
                tracing::warn!(
                    "{}: req_ids of row groups {:?} not checked for repeats: unreadable (their \
                     rows are reported one by one)",
                    dir.join(grflow_traces::columnar::REQUESTS_FILE).display(),
                    d.unreadable_groups
                );
            }
            if let Some((id, first, row)) = d.example {
                tracing::warn!(
                    rows = d.rows,
                    "{}: req_id {id} appears at rows {first} and {row}; {} rows repeat an earlier \
                     row's req_id (each is served, and their answers share the id)",
                    dir.join(grflow_traces::columnar::REQUESTS_FILE).display(),
                    d.rows
                );
            }
        }
    }
    Ok(found.map(|d| d.rows))
}

/// Whether `cfg` can run with the oracle at `step` (`ReplayOptions::
/// oracle_step`; `replay` checks it first): the oracle replays a node's
/// epochs, so it needs a deterministic node.
pub fn check_oracle(cfg: &Config, step: f64) -> Result<(), ReplayError> {
    if !(0.001..=1.0).contains(&step) {
        return Err(ReplayError::Setup(format!(
            "--oracle-step: the oracle's alpha step must be in [0.001, 1] (got {step})"
        )));
    }
    // The grid is 0, step, 2·step, …, 1: a step that does not divide 1
    // would be replaced by one that does, and reported as given.
    let n = (1.0 / step).round();
    if ((1.0 / step) - n).abs() > 1e-6 * n {
        return Err(ReplayError::Setup(format!(
            "--oracle-step {step}: must divide 1 into whole steps (the grid is 0, step, …, 1); \
             the nearest that does is {}",
            1.0 / n
        )));
    }
    if cfg.run.clock != Clock::Virtual || cfg.run.replay_release() != Release::Complete {
        return Err(ReplayError::Setup(
            "the oracle alpha* replays epochs on the virtual clock: it needs run.clock = \"virtual\" \
             and run.release = \"complete\""
                .into(),
        ));
    }
    let m = &cfg.memory;
    for (field, name) in [
        ("emb_policy", &m.emb_policy),
        ("user_kv_policy", &m.user_kv_policy),
        ("item_kv_policy", &m.item_kv_policy),
    ] {
        let copyable = GuidedPolicy::new(name, 1)
            .ok()
            .and_then(|p| p.try_clone())
            .is_some();
        if !copyable {
            return Err(ReplayError::Setup(format!(
                "the oracle alpha* needs eviction policies that decide by their state alone \
                 (lru): memory.{field} = {name:?}"
            )));
        }
    }
    Ok(())
}

/// Points of the latency CDF a run reports.
pub const CDF_POINTS: usize = 200;

fn spawn_progress(
    counters: Arc<JobCounters>,
    total: u64,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} answered  {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        while !done.load(Ordering::Relaxed) {
            let answered = counters.responses_out.load(Ordering::Relaxed)
                + counters.errors.load(Ordering::Relaxed);
            bar.set_position(answered.min(total));
            bar.set_message(format!(
                "{} in",
                counters.source.requests_in.load(Ordering::Relaxed)
            ));
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        bar.finish_and_clear();
    })
}

#[cfg(test)]
mod tests {
    use super::{ReplayOptions, ReplayOutput, ResponseOutput, TraceInput};
    use crate::Config;
    use crate::summary::LatencySummary;
    use grflow_connectors::ResponseRow;
    use grflow_traces::{GenConfig, Mode, Regime, Request};
    use std::sync::Arc;

    fn response(req_id: u64, latency_ms: f64) -> ResponseRow {
        ResponseRow {
            req_id,
            node: 0,
            prefix: "user".into(),
            items: vec![1],
            scores: vec![0.5],
            latency_ms,
            model_version: "m".into(),
            history_len: 0,
            kv_reused_tokens: 0,
        }
    }

    fn request(req_id: u64, mode: Mode) -> Request {
        Request {
            ts_ms: req_id,
            req_id,
            user_id: 1,
            hist_len: 0,
            candidates: vec![1],
            mode,
            label: None,
        }
    }

    #[test]
    fn exact_latency_by_mode_gives_each_kind_its_exact_percentiles() {
        // Requests 0..100 rank at 1..=100 ms, 100..110 retrieve at 500..=590.
        let requests: Vec<Request> = (0..110)
            .map(|i| request(i, if i < 100 { Mode::Rank } else { Mode::Retrieve }))
            .collect();
        let latency = |i: u64| {
            if i < 100 {
                (i + 1) as f64
            } else {
                500.0 + 10.0 * (i - 100) as f64
            }
        };
        let collected = || {
            let mut out = ReplayOutput {
                responses: (0..110).map(|i| response(i, latency(i))).collect(),
                ..ReplayOutput::default()
            };
            out.summary.by_mode.rank.responses = 100;
            out.summary.by_mode.retrieve.responses = 10;
            out
        };
        let mut out = collected();
        out.exact_latency_by_mode(&requests);
        assert!(out.responses.is_empty(), "dropped");
        let rank = out.summary.by_mode.rank.latency_ms.clone().unwrap();
        assert_eq!(
            rank,
            LatencySummary {
                p50: 50.0,
                p95: 95.0,
                p99: 99.0,
                max: 100.0
            }
        );
        let retrieve = out.summary.by_mode.retrieve.latency_ms.clone().unwrap();
        assert_eq!(
            (retrieve.p50, retrieve.p99, retrieve.max),
            (540.0, 590.0, 590.0)
        );
        // The run's: 110 responses, nearest rank (the 109th is 580).
        let run = out.summary.latency_ms.clone().unwrap();
        assert_eq!((run.p50, run.p99), (55.0, 580.0));

        // A response whose kind cannot be told: `by_mode` keeps what it had.
        let mut unknown = requests.clone();
        unknown[3].mode = Mode::Retrieve;
        unknown.push(request(3, Mode::Rank));
        let mut out = collected();
        out.exact_latency_by_mode(&unknown);
        assert_eq!(out.summary.by_mode.rank.latency_ms, None);
        assert_eq!(
            out.summary.latency_ms.map(|l| l.p99),
            Some(580.0),
            "the run's still exact"
        );
    }

    /// A replay where every request is rank: the rank p99 is the run's.
    #[test]
    fn replay_of_rank_requests_only_has_rank_p99_equal_to_p99() {
        let trace = grflow_traces::generate(&GenConfig {
            regime: Regime::Steady,
            users: 40,
            items: 500,
            requests: 200,
            rps: 100.0,
            seed: 3,
            retrieve_share: 0.0,
            ..GenConfig::default()
        });
        let requests = trace.requests.clone();
        assert!(requests.iter().all(|r| r.mode == Mode::Rank));
        let mut config = Config::embedded();
        config.run.speed = "max".into();
        let mut opts = ReplayOptions::new(TraceInput::Memory(Arc::new(trace)), config);
        opts.responses = ResponseOutput::Collect;
        let mut out = super::replay(opts).unwrap();
        assert_eq!(out.responses.len(), 200);
        out.exact_latency_by_mode(&requests);
        let s = &out.summary;
        let rank = s.by_mode.rank.latency_ms.as_ref().unwrap();
        assert_eq!(Some(rank), s.latency_ms.as_ref(), "{s:?}");
        assert_eq!(s.by_mode.retrieve.latency_ms, None);
    }
}
