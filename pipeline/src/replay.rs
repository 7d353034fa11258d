//! `grflow replay`: runs the serving dataflow over a trace on N timely
//! workers. Responses and error rows stream to their sinks as they are
//! produced (Parquet files, or nowhere once counted); the summary's
//! percentiles come from bounded histograms, so memory does not grow with
//! the number of requests or errors. Windowed statistics and the summary
//! are returned; writing them is the caller's business.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grflow_connectors::parquet::{
    ErrorSink, MemoryRequestSource, ParquetRequestSource, RequestSource, ResponseSink, SinkError,
    SourceError, load_side_tables,
};
use grflow_connectors::{ErrorRow, ResponseRow, WindowRow};
use grflow_operators::allocator::oracle::{OracleEpoch, OracleRecorder, alpha_grid};
use grflow_operators::cache::GuidedPolicy;
use grflow_operators::router::RouterStats;
use grflow_traces::{Request, Trace};

use crate::cluster::ClusterError;
use crate::config::{Clock, Config, Release, Speed};
use crate::dataflow::allocator::AllocatorStats;
use crate::dataflow::source::Pacing;
use crate::dataflow::{self, DataflowParts, JobCounters, ServingParts};
use crate::events::{ScheduledCommand, Target};
use crate::job::{Job, JobError};
use crate::params::ParamsError;
use crate::side::SideTables;
use crate::stop::StopRequest;
use crate::summary::{Interrupted, LatencyTally, ModeTallies, NodeSummary, Summary, sort_windows};
use grflow_operators::allocator::ppo::ActorCritic;
use grflow_operators::allocator::{Allocator, AllocatorPolicy, Learned};

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

/// A file sink the job's workers hand batches of rows to.
trait RowFile<R> {
    /// Takes `rows`, leaving the vector empty.
    fn append(&mut self, rows: &mut Vec<R>) -> Result<(), SinkError>;
    /// Closes the file; returns the most rows the sink held at once
    /// besides what its writer encoded.
    fn close(self) -> Result<usize, SinkError>;
}

impl RowFile<ResponseRow> for ResponseSink {
    fn append(&mut self, rows: &mut Vec<ResponseRow>) -> Result<(), SinkError> {
        let written = self.write(rows);
        rows.clear();
        written
    }

    fn close(self) -> Result<usize, SinkError> {
        // Each batch goes straight to the writer.
        self.finish().map(|_| 0)
    }
}

impl RowFile<ErrorRow> for ErrorSink {
    fn append(&mut self, rows: &mut Vec<ErrorRow>) -> Result<(), SinkError> {
        ErrorSink::append(self, rows)
    }

    fn close(self) -> Result<usize, SinkError> {
        self.finish_with_peak().map(|(_, peak)| peak)
    }
}

/// One of the job's row sinks, shared by the workers (each hands it batches).
enum RowWriter<R, F> {
    Drop,
    File {
        // Boxed: one per job, and it dwarfs the other variants.
        sink: Box<F>,
        /// The first write error; later batches are dropped and replay fails.
        failed: Option<SinkError>,
    },
    Collect(Vec<R>),
}

type ResponseWriter = RowWriter<ResponseRow, ResponseSink>;
type ErrorWriter = RowWriter<ErrorRow, ErrorSink>;

/// The job's response and error writers. `ParquetReplacing` removes the
/// stale files as the responses file is opened.
fn open_writers(output: &ResponseOutput) -> Result<(ResponseWriter, ErrorWriter), SinkError> {
    Ok(match output {
        ResponseOutput::Drop => (RowWriter::Drop, RowWriter::Drop),
        ResponseOutput::Parquet { responses, errors } => (
            RowWriter::file(ResponseSink::create(responses)?),
            RowWriter::file(ErrorSink::create(errors)?),
        ),
        ResponseOutput::ParquetReplacing {
            responses,
            errors,
            stale,
        } => {
            for file in stale.iter().filter(|f| f.exists()) {
                std::fs::remove_file(file).map_err(|source| SinkError::Io {
                    file: file.clone(),
                    source,
                })?;
            }
            (
                RowWriter::file(ResponseSink::create(responses)?),
                RowWriter::file(ErrorSink::create(errors)?),
            )
        }
        ResponseOutput::Collect => (
            RowWriter::Collect(Vec::new()),
            RowWriter::Collect(Vec::new()),
        ),
    })
}

impl<R, F: RowFile<R>> RowWriter<R, F> {
    fn file(sink: F) -> Self {
        Self::File {
            sink: Box::new(sink),
            failed: None,
        }
    }

    fn write(&mut self, rows: &mut Vec<R>) {
        match self {
            Self::Drop => rows.clear(),
            Self::File { sink, failed } => {
                if failed.is_none()
                    && let Err(e) = sink.append(rows)
                {
                    *failed = Some(e);
                }
                rows.clear();
            }
            Self::Collect(all) => all.append(rows),
        }
    }

    /// Closes the file; returns what was collected (Collect only) and the
    /// most rows the file's sink held at once (`RowFile::close`).
    fn finish(self) -> Result<(Vec<R>, usize), SinkError> {
        match self {
            Self::Drop => Ok((Vec::new(), 0)),
            Self::File { sink, failed } => match failed {
                Some(e) => Err(e),
                None => sink.close().map(|peak| (Vec::new(), peak)),
            },
            Self::Collect(all) => Ok((all, 0)),
        }
    }
}

/// A worker's hand-off of batches (`dataflow::ResponseBatchSink`,
/// `dataflow::ErrorBatchSink`).
type BatchSink<R> = Box<dyn FnMut(&mut Vec<R>)>;

/// Hands a worker's batches to a shared writer.
fn batch_sink<R: 'static, F: RowFile<R> + 'static>(
    writer: &Arc<Mutex<RowWriter<R, F>>>,
) -> BatchSink<R> {
    let writer = writer.clone();
    Box::new(move |rows| writer.lock().expect("lock").write(rows))
}

/// What one worker hands back when its dataflow is complete (in cluster
/// mode sent to worker 0 as JSON: bincode cannot read every summary field).
#[derive(serde::Serialize, serde::Deserialize)]
struct WorkerResult {
    node: NodeSummary,
    allocator: AllocatorStats,
    router: RouterStats,
    latency: std::collections::BTreeMap<u32, LatencyTally>,
    by_mode: ModeTallies,
    /// The most error rows the worker held before handing them on.
    #[serde(default)]
    pending_errors_peak: usize,
    windows: Vec<WindowRow>,
    oracle: Vec<OracleEpoch>,
    model_version: String,
    /// Cluster mode: the first worker of each process carries the
    /// process's job counters.
    counters: Option<CounterSnapshot>,
}

/// A process's job counters, once its workers are done.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
struct CounterSnapshot {
    requests_in: u64,
    late: u64,
    responses_out: u64,
    /// Error rows, each gone to the job's error sink.
    #[serde(default)]
    errors: u64,
    #[serde(default)]
    newest_ts_ms: u64,
}

impl CounterSnapshot {
    fn of(c: &JobCounters) -> Self {
        Self {
            requests_in: c.source.requests_in.load(Ordering::Relaxed),
            late: c.source.late.load(Ordering::Relaxed),
            responses_out: c.responses_out.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            newest_ts_ms: c.source.newest_ts_ms.load(Ordering::Relaxed),
        }
    }

    fn add(&mut self, o: &Self) {
        self.requests_in += o.requests_in;
        self.late += o.late;
        self.responses_out += o.responses_out;
        self.errors += o.errors;
        self.newest_ts_ms = self.newest_ts_ms.max(o.newest_ts_ms);
    }
}

pub fn replay(opts: ReplayOptions) -> Result<ReplayOutput, ReplayError> {
    let cfg = opts.config.clone();

    // Side tables are loaded once and shared by every worker thread.
    // `span_ms`: the event time the trace covers, first request to last
    // (None where a row group's range is unknown).
    let (side, requests, total, origin_ts, span_ms, trace_name) = match &opts.trace {
        TraceInput::Parquet(dir) => {
            let tables = load_side_tables(dir)?;
            let side =
                SideTables::new(tables.meta, tables.users, tables.items, cfg.node.shard_rows)
                    .map_err(|e| ReplayError::Setup(e.to_string()))?;
            let info = ParquetRequestSource::inspect(dir)?;
            (
                side,
                None,
                info.rows,
                info.min_ts_ms,
                (info.rows > 0 && info.max_ts_ms != u64::MAX)
                    .then(|| info.max_ts_ms.saturating_sub(info.min_ts_ms)),
                dir.display().to_string(),
            )
        }
        TraceInput::Memory(trace) => {
            let meta = trace
                .meta
                .clone()
                .ok_or_else(|| ReplayError::Setup("in-memory trace has no metadata".into()))?;
            let side = SideTables::new(
                meta,
                trace.users.clone(),
                trace.items.clone(),
                cfg.node.shard_rows,
            )
            .map_err(|e| ReplayError::Setup(e.to_string()))?;
            let requests: Arc<Vec<Request>> = Arc::new(trace.requests.clone());
            let origin = requests.first().map_or(0, |r| r.ts_ms);
            let (lo, hi) = requests.iter().fold((u64::MAX, 0), |(lo, hi), r| {
                (lo.min(r.ts_ms), hi.max(r.ts_ms))
            });
            let name = format!("embedded default ({})", side.meta.source);
            (
                side,
                Some(requests),
                trace.requests.len() as u64,
                origin,
                (lo <= hi).then(|| hi - lo),
                name,
            )
        }
    };
    let meta = side.meta.clone();
    let mut job = Job::prepare(cfg.clone(), side)?;
    let topo = job.topology();
    if topo.is_cluster() {
        // Every process must read one trace (each reads its shard of it):
        // its catalog, length and time span, not its path, which may
        // differ from machine to machine.
        job.cluster.parts.insert(
            "the trace".into(),
            crate::handshake::digest(&(&meta, total, origin_ts, span_ms)),
        );
    }
    // Process 0 writes the summary, so it alone checks (and warns).
    let duplicate_req_ids = match &opts.trace {
        TraceInput::Parquet(dir) if topo.is_leader() => check_req_ids(dir)?,
        _ => None,
    };
    // Nodes of the whole job; this process runs `topo.local_workers()`.
    let workers = topo.total();
    let side = job.side.clone();
    let nodes = job.nodes();

    for c in &opts.commands {
        let bad_target = matches!(c.target, Target::Node(n) if n as usize >= workers);
        if bad_target {
            return Err(ReplayError::Setup(format!(
                "command {:?} at {} ms is for {:?}, but the job has {workers} nodes",
                c.command, c.at_ms, c.target
            )));
        }
        c.command
            .validate()
            .map_err(|e| ReplayError::Setup(format!("command at {} ms: {e}", c.at_ms)))?;
    }
    let release = cfg.run.replay_release();
    if let Some(step) = opts.oracle_step {
        check_oracle(&cfg, step)?;
    }
    let oracle_step = opts.oracle_step;
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
    job.publish("replay", serde_json::json!({ "trace": trace_name }));
    let counters = opts.counters.clone().unwrap_or_default();
    // Pacing starts when the workers do: in cluster mode after every
    // process has connected, which may take a while.
    let started: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let speed = cfg.speed();
    let setup_error: Arc<Mutex<Option<String>>> = Arc::default();

    let done = Arc::new(AtomicBool::new(false));
    let progress = opts
        .show_progress
        .then(|| spawn_progress(counters.clone(), total, done.clone()));

    let worker_cfg = cfg.clone();
    let worker_counters = counters.clone();
    let worker_side = side.clone();
    let worker_policy = job.allocator_policy.clone();
    let (pool_pages, max_positions) = (job.pool_pages, job.max_positions);
    let worker_trace = opts.trace.clone();
    let worker_setup_error = setup_error.clone();
    let worker_writer = writer.clone();
    let worker_error_writer = error_writer.clone();
    let worker_commands = opts.commands.clone();
    let worker_started = started.clone();
    let worker_stop = opts.stop.clone();
    let local_done = Arc::new(std::sync::Barrier::new(topo.threads));
    let failure = crate::worker_failure::WorkerFailure::default();
    let worker_failure = failure.clone();
    let guards = job
        .cluster
        .execute(
            move |worker| {
                let index = worker.index();
                let _watch = worker_failure.watch(index);
                let peers = worker.peers();
                // Ready once the workers run: in cluster mode every process
                // has connected by now (before, /readyz said ready while
                // the peers were still awaited).
                if topo.local(index) == Some(0) {
                    crate::ops::state().set_started();
                }
                let pacing = Pacing {
                    speed,
                    origin_ts_ms: origin_ts,
                    start: *worker_started.get_or_init(Instant::now),
                };
                let source: Box<dyn RequestSource> = match &worker_trace {
                    TraceInput::Parquet(dir) => match ParquetRequestSource::open(dir, index, peers)
                    {
                        Ok(s) => Box::new(s.with_max_candidates(worker_cfg.model.max_candidates)),
                        Err(e) => {
                            *worker_setup_error.lock().expect("lock") = Some(e.to_string());
                            Box::new(MemoryRequestSource::new(Arc::new(Vec::new()), index, peers))
                        }
                    },
                    TraceInput::Memory(_) => Box::new(MemoryRequestSource::new(
                        requests.clone().expect("memory trace has requests"),
                        index,
                        peers,
                    )),
                };
                let router = Job::router(&worker_cfg, peers);
                let node = nodes.take(index);
                let allocator_stats: Rc<RefCell<AllocatorStats>> = Default::default();
                let oracle = oracle_step.map(|step| {
                    Rc::new(RefCell::new(OracleRecorder::new(
                        worker_cfg.windows.epoch_ms,
                        alpha_grid(step),
                    )))
                });
                let df = dataflow::build(
                    worker,
                    DataflowParts {
                        source,
                        pacing,
                        max_ahead_ms: (pacing.speed == Speed::Max)
                            .then_some(worker_cfg.run.max_ahead_ms),
                        serving: ServingParts {
                            router,
                            node,
                            side: worker_side.clone(),
                            slo_ms: worker_cfg.run.slo_ms,
                            clock: worker_cfg.run.clock,
                            deadline: None,
                            max_age: None,
                            window_ms: worker_cfg.windows.epoch_ms,
                            release,
                            batch: worker_cfg.batch_policy(),
                            token_capacity: worker_cfg.node.token_capacity,
                            commands: worker_commands.clone(),
                            command_pacing: pacing,
                            controller: allocator_controller(
                                &worker_cfg,
                                release,
                                worker_policy.clone(),
                                pool_pages,
                                max_positions,
                                allocator_stats.clone(),
                            ),
                            live: None,
                            models: None,
                            oracle: oracle.clone(),
                        },
                        counters: worker_counters.clone(),
                        responses: batch_sink(&worker_writer),
                        errors: batch_sink(&worker_error_writer),
                        gather_responses: topo.is_cluster(),
                        stop: worker_stop.clone(),
                    },
                );
                while !df.probe.done() {
                    if worker_failure.failed().is_some() {
                        // Another worker panicked: its frontier never moves
                        // again. Leave without waiting on it (or on the
                        // barrier below); replay reports the failure.
                        for id in worker.installed_dataflows() {
                            worker.drop_dataflow(id);
                        }
                        return Vec::new();
                    }
                    worker.step_or_park(Some(Duration::from_millis(50)));
                }
                // Let the last window updates drain.
                while worker.step() {}

                let mut outputs = std::mem::take(&mut *df.outputs.borrow_mut());
                // The sinks flush their last batch when their input closes;
                // this only guards against a batch left behind.
                if !outputs.pending_responses.is_empty() {
                    worker_writer
                        .lock()
                        .expect("lock")
                        .write(&mut outputs.pending_responses);
                }
                if !outputs.pending_errors.is_empty() {
                    worker_error_writer
                        .lock()
                        .expect("lock")
                        .write(&mut outputs.pending_errors);
                }
                let node = crate::dataflow::node::lock(&df.node);
                let windows = std::mem::take(&mut outputs.windows);
                let oracle = match oracle {
                    Some(o) => {
                        let mut o = o.borrow_mut();
                        o.close(&*worker_side, &worker_side.retrieval);
                        o.take().unwrap_or_else(|e| {
                            *worker_setup_error.lock().expect("lock") =
                                Some(format!("oracle: {e}"));
                            Vec::new()
                        })
                    }
                    None => Vec::new(),
                };
                let gauge = *df.window_gauge.borrow();
                let c = node.counters();
                let busy = df.busy.borrow().shares(crate::events::now_ns());
                let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
                let node_summary = NodeSummary {
                    node: node.id(),
                    responses_out: c.responses,
                    alpha: node.alpha(),
                    emb_hit_rate: ratio(c.emb_hits, c.emb_lookups),
                    kv_hit_rate: ratio(c.kv_reused_tokens, c.kv_total_tokens),
                    emb_hits: c.emb_hits,
                    emb_lookups: c.emb_lookups,
                    kv_reused_tokens: c.kv_reused_tokens,
                    kv_total_tokens: c.kv_total_tokens,
                    link_bytes: c.link_bytes,
                    oov_items: c.oov_items,
                    busy_share: busy.whole,
                    busy_share_peak: busy.peak,
                    truncated_histories: c.truncated_histories,
                    unknown_user_histories: c.unknown_user_histories,
                    kv_reclaims: c.kv_reclaims,
                    user_head_evictions: c.user_head_evictions,
                    user_heads_peak: node.user_heads_peak() as u64,
                    alpha_moves: c.alpha_moves,
                    refill_bytes: c.refill_bytes,
                    refill_bytes_max_per_move: c.refill_bytes_max_per_move,
                    model_gflop: c.model_flops / 1e9,
                    gemm_gflop: c.gemm_flops / 1e9,
                    gemm_s: c.gemm_ns as f64 / 1e9,
                    gemm_calls: c.gemm_calls,
                    computed_tokens: c.computed_tokens,
                    model_calls: c.model_calls,
                    batch_size_hist: c.batch_size_hist.clone(),
                    queue_wait_hist: c.queue_wait_hist.clone(),
                    windows_open_peak: gauge.open_peak as u64,
                    window_samples_peak: gauge.samples_peak,
                    ..NodeSummary::default()
                };
                let mut result = WorkerResult {
                    node: node_summary,
                    allocator: allocator_stats.borrow().clone(),
                    router: df.router.borrow().stats().clone(),
                    latency: outputs.latency,
                    by_mode: outputs.by_mode,
                    pending_errors_peak: outputs.pending_errors_peak,
                    windows,
                    oracle,
                    model_version: node.model_version().to_string(),
                    counters: None,
                };
                drop(node);
                if !topo.is_cluster() {
                    return vec![result];
                }
                // Every local worker is done with the job, so the process's
                // counters are final.
                local_done.wait();
                if topo.local(index) == Some(0) {
                    result.counters = Some(CounterSnapshot::of(&worker_counters));
                }
                crate::cluster::gather_to_worker_0(worker, &result, GATHER_WAIT)
            },
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
    let mut out = assemble(results, &cfg, totals, workers, wall_s, trace_name);
    match opts.stop.as_ref().filter(|s| s.requested()) {
        // The event time read, not the whole trace's.
        Some(stop) => {
            out.summary.event_time_s =
                totals.newest_ts_ms.saturating_sub(origin_ts) as f64 / 1000.0;
            out.summary.interrupted = Some(Interrupted {
                signal: stop.cause(),
                trace_rows: total,
            })
        }
        None => {
            if let Some(span) = span_ms {
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

fn assemble(
    results: Vec<WorkerResult>,
    cfg: &Config,
    counters: CounterSnapshot,
    workers: usize,
    wall_s: f64,
    trace: String,
) -> ReplayOutput {
    let mut out = ReplayOutput::default();
    let mut router = RouterStats::default();
    let mut nodes = Vec::new();
    let mut versions = std::collections::BTreeMap::<u32, String>::new();
    let mut latency: std::collections::BTreeMap<u32, LatencyTally> = Default::default();
    let mut by_mode = ModeTallies::default();
    let mut allocator = AllocatorStats::default();
    for r in results {
        allocator.merge(&r.allocator);
        for (node, tally) in r.latency {
            latency.entry(node).or_default().merge(&tally);
        }
        by_mode.merge(&r.by_mode);
        out.errors_held_peak += r.pending_errors_peak;
        out.windows.extend(r.windows);
        out.oracle.extend(r.oracle);
        router.merge(&r.router);
        versions.insert(r.node.node, r.model_version);
        nodes.push(r.node);
    }
    // Node 0's, whatever order the workers' results came in. Nodes of one
    // job serving different models is a cluster whose processes were
    // started with different configs or --model (or a swap sent to some
    // nodes only): said, not hidden.
    let model_version = versions.values().next().cloned().unwrap_or_default();
    let distinct: std::collections::BTreeSet<&String> = versions.values().collect();
    if distinct.len() > 1 {
        tracing::warn!(
            ?versions,
            "the nodes ended the run on different models: in cluster mode every \
             process needs the same config, trace and --model"
        );
    }
    sort_windows(&mut out.windows);
    out.oracle.sort_by_key(|e| (e.node, e.epoch_start_ms));
    // Stable: each node's decisions keep their order.
    out.allocator_steps = std::mem::take(&mut allocator.steps);
    out.allocator_steps.sort_by_key(|(node, _)| *node);
    nodes.sort_by_key(|n| n.node);
    let mut overall = LatencyTally::default();
    for n in &mut nodes {
        let tally = latency.remove(&n.node).unwrap_or_default();
        n.slo_satisfaction = tally.slo_satisfaction();
        n.latency_ms = tally.summary();
        overall.merge(&tally);
    }
    // Responses of a node no worker reported (none expected) still count.
    for tally in latency.values() {
        overall.merge(tally);
    }
    // Requests answered with an error record are SLO misses; the record
    // does not name a node, so only the run's and each kind's figure count them.
    overall.record_failures(by_mode.failed());

    out.latency_cdf = overall.cdf(CDF_POINTS);
    let sum = |f: fn(&NodeSummary) -> u64| nodes.iter().map(f).sum::<u64>();
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let event_time_s = event_span_s(&out.windows);
    let responses_out = counters.responses_out;
    out.summary = Summary {
        trace,
        workers,
        requests_in: counters.requests_in,
        responses_out,
        errors: counters.errors,
        late_records: counters.late,
        duplicate_req_ids: None,
        interrupted: None,
        wall_s,
        event_time_s,
        throughput_rps: responses_out as f64 / wall_s.max(1e-9),
        slo_ms: cfg.run.slo_ms.rank,
        by_mode: by_mode.summaries(&cfg.run.slo_ms),
        clock: cfg.run.clock.as_str().to_string(),
        release: cfg.run.replay_release().as_str().to_string(),
        slo_satisfaction: overall.slo_satisfaction(),
        latency_ms: overall.summary(),
        emb_hit_rate: ratio(sum(|n| n.emb_hits), sum(|n| n.emb_lookups)),
        kv_hit_rate: ratio(sum(|n| n.kv_reused_tokens), sum(|n| n.kv_total_tokens)),
        truncated_histories: sum(|n| n.truncated_histories),
        unknown_user_histories: sum(|n| n.unknown_user_histories),
        model_version,
        nodes,
        router,
        windows: out.windows.len(),
        allocator: cfg
            .allocator
            .moves()
            .then(|| allocator.summary(cfg.allocator.policy)),
    };
    out
}

/// How long worker 0 waits for the other workers' results at the end.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Points of the latency CDF a run reports.
pub const CDF_POINTS: usize = 200;

/// The allocator as the nodes' controller when α moves at runtime;
/// `policy` is the job's PPO policy (`ppo-only`, `smart`).
pub(crate) fn allocator_controller(
    cfg: &Config,
    release: Release,
    policy: Option<Arc<ActorCritic>>,
    pool_pages: usize,
    max_positions: usize,
    stats: Rc<RefCell<AllocatorStats>>,
) -> Option<dataflow::Controller> {
    if !cfg.allocator.moves() {
        return None;
    }
    let allocator = cfg.allocator.clone();
    let slo_ms = cfg.run.slo_ms.rank;
    // Where each node starts (`memory.node_alpha`), as the job built it.
    let start = cfg.clone();
    let alpha = move |node: u32| start.start_alpha(node as usize);
    let make = move |node: u32| {
        let made = match &policy {
            Some(p) if allocator.learned() => {
                Allocator::with_learned(allocator.clone(), slo_ms, alpha(node), {
                    let learned = Learned::new(
                        p.clone(),
                        max_positions,
                        slo_ms,
                        allocator.policy == AllocatorPolicy::Smart,
                        allocator.sample,
                        allocator.seed.wrapping_add(u64::from(node)),
                    );
                    // `complete` runs stay reproducible: updates at the
                    // epoch boundary, on the worker.
                    match release {
                        Release::Arrival => learned.train_off_path(),
                        Release::Complete => learned,
                    }
                })
            }
            _ => Allocator::new(allocator.clone(), slo_ms, alpha(node)),
        };
        made.with_pool_pages(pool_pages)
    };
    Some(Box::new(move |_events, windows| {
        dataflow::allocator::allocate(windows, make, stats)
    }))
}

/// Event time covered, from the windows seen (their starts, so short by up
/// to a window): used where the trace's own range is unknown.
fn event_span_s(windows: &[WindowRow]) -> f64 {
    let first = windows.iter().map(|w| w.window_start_ms).min();
    let last = windows.iter().map(|w| w.window_start_ms).max();
    match (first, last) {
        (Some(a), Some(b)) => (b - a) as f64 / 1000.0,
        _ => 0.0,
    }
}

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
