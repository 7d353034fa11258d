//! One worker of `grflow replay`: reads its shard of the trace through the
//! serving dataflow until it completes, flushes what its sinks still hold,
//! and hands back its node's figures (in cluster mode to worker 0).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use timely::worker::Worker;

use grflow_connectors::WindowRow;
use grflow_connectors::parquet::{MemoryRequestSource, ParquetRequestSource, RequestSource};
use grflow_operators::allocator::oracle::{OracleEpoch, OracleRecorder, alpha_grid};
use grflow_operators::router::RouterStats;
use grflow_traces::Request;

use super::TraceInput;
use super::writers::{ErrorWriter, ResponseWriter, batch_sink};
use crate::cluster::Topology;
use crate::config::Speed;
use crate::dataflow::allocator::AllocatorStats;
use crate::dataflow::source::Pacing;
use crate::dataflow::{self, DataflowParts, JobCounters, WorkerDataflow};
use crate::events::ScheduledCommand;
use crate::serving_setup::ServingSetup;
use crate::stop::StopRequest;
use crate::summary::{LatencyTally, ModeTallies, NodeSummary};
use crate::worker_failure::WorkerFailure;

/// How long worker 0 waits for the other workers' results at the end.
const GATHER_WAIT: Duration = Duration::from_secs(120);

/// Everything the workers of this process share.
pub(super) struct WorkerContext {
    pub setup: ServingSetup,
    pub topo: Topology,
    /// The trace's first event time: it enters when the workers start.
    pub origin_ts_ms: u64,
    pub trace: TraceInput,
    /// The requests of an in-memory trace.
    pub requests: Option<Arc<Vec<Request>>>,
    pub commands: Vec<ScheduledCommand>,
    pub oracle_step: Option<f64>,
    pub counters: Arc<JobCounters>,
    pub writer: Arc<Mutex<ResponseWriter>>,
    pub error_writer: Arc<Mutex<ErrorWriter>>,
    /// A worker's setup that failed once the job ran (its shard of the
    /// trace, the oracle): replay fails with it.
    pub setup_error: Arc<Mutex<Option<String>>>,
    /// When the first worker started: pacing and wall time count from it.
    pub started: Arc<OnceLock<Instant>>,
    pub stop: Option<StopRequest>,
    pub failure: WorkerFailure,
    /// Every local worker is done (cluster mode).
    pub local_done: Barrier,
}

/// What one worker hands back when its dataflow is complete (in cluster
/// mode sent to worker 0 as JSON: bincode cannot read every summary field).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct WorkerResult {
    pub node: NodeSummary,
    pub allocator: AllocatorStats,
    pub router: RouterStats,
    pub latency: BTreeMap<u32, LatencyTally>,
    pub by_mode: ModeTallies,
    /// The most error rows the worker held before handing them on.
    #[serde(default)]
    pub pending_errors_peak: usize,
    pub windows: Vec<WindowRow>,
    pub oracle: Vec<OracleEpoch>,
    pub model_version: String,
    /// Cluster mode: the first worker of each process carries the
    /// process's job counters.
    pub counters: Option<CounterSnapshot>,
}

/// A process's job counters, once its workers are done.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct CounterSnapshot {
    pub requests_in: u64,
    pub late: u64,
    pub responses_out: u64,
    /// Error rows, each gone to the job's error sink.
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub newest_ts_ms: u64,
}

impl CounterSnapshot {
    pub(super) fn of(c: &JobCounters) -> Self {
        Self {
            requests_in: c.source.requests_in.load(Ordering::Relaxed),
            late: c.source.late.load(Ordering::Relaxed),
            responses_out: c.responses_out.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            newest_ts_ms: c.source.newest_ts_ms.load(Ordering::Relaxed),
        }
    }

    pub(super) fn add(&mut self, o: &Self) {
        self.requests_in += o.requests_in;
        self.late += o.late;
        self.responses_out += o.responses_out;
        self.errors += o.errors;
        self.newest_ts_ms = self.newest_ts_ms.max(o.newest_ts_ms);
    }
}

/// The body of every worker: serve its shard, hand its result back.
pub(super) fn run(worker: &mut Worker, ctx: &WorkerContext) -> Vec<WorkerResult> {
    let index = worker.index();
    let _watch = ctx.failure.watch(index);
    let peers = worker.peers();
    // Ready once the workers run: in cluster mode every process has
    // connected by now (before, /readyz said ready while the peers were
    // still awaited).
    if ctx.topo.local(index) == Some(0) {
        crate::ops::state().set_started();
    }
    let cfg = &ctx.setup.cfg;
    let pacing = Pacing {
        speed: cfg.speed(),
        origin_ts_ms: ctx.origin_ts_ms,
        start: *ctx.started.get_or_init(Instant::now),
    };
    let allocator_stats: Rc<RefCell<AllocatorStats>> = Rc::default();
    let oracle = ctx.oracle_step.map(|step| {
        Rc::new(RefCell::new(OracleRecorder::new(
            cfg.windows.epoch_ms,
            alpha_grid(step),
        )))
    });
    let mut serving = ctx.setup.parts(
        index,
        peers,
        cfg.run.replay_release(),
        allocator_stats.clone(),
    );
    serving.commands = ctx.commands.clone();
    serving.command_pacing = pacing;
    serving.oracle = oracle.clone();
    let df = dataflow::build(
        worker,
        DataflowParts {
            source: open_source(ctx, index, peers),
            pacing,
            max_ahead_ms: (pacing.speed == Speed::Max).then_some(cfg.run.max_ahead_ms),
            serving,
            counters: ctx.counters.clone(),
            responses: batch_sink(&ctx.writer),
            errors: batch_sink(&ctx.error_writer),
            gather_responses: ctx.topo.is_cluster(),
            stop: ctx.stop.clone(),
        },
    );
    while !df.probe.done() {
        if ctx.failure.failed().is_some() {
            // Another worker panicked: its frontier never moves again.
            // Leave without waiting on it (or on the barrier below);
            // replay reports the failure.
            for id in worker.installed_dataflows() {
                worker.drop_dataflow(id);
            }
            return Vec::new();
        }
        worker.step_or_park(Some(Duration::from_millis(50)));
    }
    // Let the last window updates drain.
    while worker.step() {}
    let oracle = oracle.map_or_else(Vec::new, |o| {
        let mut o = o.borrow_mut();
        o.close(&*ctx.setup.side, &ctx.setup.side.retrieval);
        o.take().unwrap_or_else(|e| {
            *ctx.setup_error.lock().expect("lock") = Some(format!("oracle: {e}"));
            Vec::new()
        })
    });
    let mut result = result_of(ctx, &df, &allocator_stats, oracle);
    if !ctx.topo.is_cluster() {
        return vec![result];
    }
    // Every local worker is done with the job, so the process's counters
    // are final.
    ctx.local_done.wait();
    if ctx.topo.local(index) == Some(0) {
        result.counters = Some(CounterSnapshot::of(&ctx.counters));
    }
    crate::cluster::gather_to_worker_0(worker, &result, GATHER_WAIT)
}

/// Worker `index`'s shard of the trace. A Parquet trace that cannot be
/// opened here (checked at setup, so rare) gives an empty shard and a
/// setup error replay fails with.
fn open_source(ctx: &WorkerContext, index: usize, peers: usize) -> Box<dyn RequestSource> {
    match &ctx.trace {
        TraceInput::Parquet(dir) => match ParquetRequestSource::open(dir, index, peers) {
            Ok(s) => Box::new(s.with_max_candidates(ctx.setup.cfg.model.max_candidates)),
            Err(e) => {
                *ctx.setup_error.lock().expect("lock") = Some(e.to_string());
                Box::new(MemoryRequestSource::new(Arc::new(Vec::new()), index, peers))
            }
        },
        TraceInput::Memory(_) => Box::new(MemoryRequestSource::new(
            ctx.requests.clone().expect("memory trace has requests"),
            index,
            peers,
        )),
    }
}

/// The worker's figures once its dataflow is complete; the sinks' last
/// batches go to the writers first.
fn result_of(
    ctx: &WorkerContext,
    df: &WorkerDataflow,
    allocator_stats: &RefCell<AllocatorStats>,
    oracle: Vec<OracleEpoch>,
) -> WorkerResult {
    let mut outputs = std::mem::take(&mut *df.outputs.borrow_mut());
    // The sinks flush their last batch when their input closes; this only
    // guards against a batch left behind.
    if !outputs.pending_responses.is_empty() {
        ctx.writer
            .lock()
            .expect("lock")
            .write(&mut outputs.pending_responses);
    }
    if !outputs.pending_errors.is_empty() {
        ctx.error_writer
            .lock()
            .expect("lock")
            .write(&mut outputs.pending_errors);
    }
    let node = crate::dataflow::node::lock(&df.node);
    WorkerResult {
        node: node_summary(df, &node),
        allocator: allocator_stats.borrow().clone(),
        router: df.router.borrow().stats().clone(),
        latency: outputs.latency,
        by_mode: outputs.by_mode,
        pending_errors_peak: outputs.pending_errors_peak,
        windows: std::mem::take(&mut outputs.windows),
        oracle,
        model_version: node.model_version().to_string(),
        counters: None,
    }
}

/// The node's line of the summary (latency and SLO figures are added when
/// every worker's tallies are merged).
fn node_summary(df: &WorkerDataflow, node: &grflow_operators::node::ServingNode) -> NodeSummary {
    let gauge = *df.window_gauge.borrow();
    let c = node.counters();
    let busy = df.busy.borrow().shares(crate::events::now_ns());
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    NodeSummary {
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
    }
}
