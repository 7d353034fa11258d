//! One worker of `grflow serve`: builds its dataflow (Kafka source →
//! serving → Kafka sink, plus the window log), steps it until the stop has
//! drained, waits for the broker to acknowledge every answer, commits, and
//! hands its result back (in cluster mode to process 0).

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use timely::dataflow::ProbeHandle;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Probe;
use timely::dataflow::operators::generic::Operator;
use timely::worker::Worker;

use grflow_connectors::Sink;
use grflow_connectors::kafka::{
    AnsweredRequest, KafkaSink, KafkaSource, OutputProducer, RequestConsumer, SharedState,
    SinkSettings, SourceSettings,
};

use super::Inbox;
use super::broadcast::{NewestBroadcast, StopInput, stop_broadcast};
use super::summary::{AnswerLatency, ProcessPart, RefillSummary};
use crate::cluster::Topology;
use crate::config::Release;
use crate::dataflow::allocator::AllocatorStats;
use crate::dataflow::control::{LiveControl, SourceClock};
use crate::dataflow::{self, ServingHandles};
use crate::models::ModelRegistry;
use crate::serving_setup::ServingSetup;
use crate::window_log::WindowLog;
use crate::worker_failure::WorkerFailure;

/// What a consumer's close may take past the drain deadline.
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long process 0 waits for the other processes' results at exit,
/// beyond the longest a process may spend draining and closing after the
/// stop (its own drain may end long before another's).
const GATHER_WAIT: Duration = Duration::from_secs(30);

/// How long a worker with requests in flight (or answers to resend) parks
/// at most between steps: its deadlines, retries and stop checks are due.
const BUSY_PARK: Duration = Duration::from_millis(1);
/// How long a quiet worker parks at most: whatever arrives wakes it sooner,
/// so this bounds only how soon a stop (SIGTERM) is noticed. An idle
/// 2-worker job then costs ~0.025 cores instead of 0.065 (README, Idle cost).
const QUIET_PARK: Duration = Duration::from_millis(100);

/// A worker's request consumer, opened before the job starts (so that a
/// broker or topic problem fails first), with what it reads by.
pub(super) struct Ingest {
    pub consumer: RequestConsumer,
    pub settings: SourceSettings,
    /// The restart scan's answers this worker may meet.
    pub answered: HashSet<AnsweredRequest>,
}

/// Everything the workers of this process share.
pub(super) struct WorkerContext {
    pub setup: ServingSetup,
    pub topo: Topology,
    pub shared: Arc<SharedState>,
    pub failure: WorkerFailure,
    pub latency: Arc<AnswerLatency>,
    pub producer: Arc<OutputProducer>,
    pub models: Arc<ModelRegistry>,
    /// When the first worker started: the dataflow's start.
    pub started: Arc<OnceLock<Instant>>,
    /// One per local worker: commands for its node (admin, model watch).
    pub inboxes: Vec<Inbox>,
    /// One per local worker, taken at its start.
    pub ingests: Mutex<Vec<Option<Ingest>>>,
    pub window_log: Arc<Mutex<WindowLog>>,
    /// What the workers obey: set by this process's signal or by a stop
    /// another process broadcast (every process drains together; one that
    /// left alone would break timely's connections and panic the others).
    pub job_stop: Arc<AtomicBool>,
    /// This process's signal.
    pub signalled: Arc<AtomicBool>,
    /// Every local worker has committed (cluster mode).
    pub local_done: Barrier,
}

/// What one worker hands back (in cluster mode, to process 0 as JSON; the
/// first worker of each process adds its process's part).
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub(super) struct WorkerResult {
    pub committed: Vec<(i32, i64)>,
    pub oov_items: u64,
    pub truncated_histories: u64,
    #[serde(default)]
    pub unknown_user_histories: u64,
    pub model_version: String,
    /// The worker's node's α when the job stopped.
    pub alpha: f64,
    pub refill: RefillSummary,
    /// What this worker's allocators did (no training records).
    pub allocator: AllocatorStats,
    pub process_part: Option<ProcessPart>,
    /// Global worker index.
    pub worker: usize,
}

/// A worker's dataflow and the handles its loops drive.
struct Running {
    source: Rc<RefCell<KafkaSource>>,
    sink: Rc<RefCell<KafkaSink>>,
    handles: ServingHandles,
    probe: ProbeHandle<u64>,
    allocator_stats: Rc<RefCell<AllocatorStats>>,
    stop_input: StopInput,
    /// Cluster mode: this process's newest event time for the others.
    newest: Option<NewestBroadcast>,
}

/// The body of every worker: serve until the stop has drained, commit,
/// hand the result back.
pub(super) fn run(worker: &mut Worker, ctx: &WorkerContext) -> Vec<WorkerResult> {
    let index = worker.index();
    // A panic here stops the others (through `fatal`) instead of leaving
    // them serving without this worker's partitions.
    let _watch = PanicToFatal {
        shared: ctx.shared.clone(),
        failure: ctx.failure.clone(),
        index,
    };
    let local = ctx.topo.local(index).expect("a local worker");
    // Model, catalog and consumers are set up and (in cluster mode) the
    // other processes connected: the dataflow starts now.
    if local == 0 {
        crate::ops::state().set_started();
    }
    ctx.started.get_or_init(Instant::now);
    let mut running = build(worker, ctx, index, local);
    let mut drain = DrainClock::new(Duration::from_millis(ctx.setup.cfg.kafka.drain_timeout_ms));
    serve_until_drained(worker, ctx, &mut running, local, &mut drain);
    await_deliveries(ctx, &running, index, &mut drain);
    let committed = commit_and_close(ctx, &running, &drain);
    if !running.probe.done() {
        // Left early (drain timeout, fatal error): timely would keep
        // stepping an unfinished dataflow after this closure returns.
        for id in worker.installed_dataflows() {
            worker.drop_dataflow(id);
        }
    }
    // The stop and newest dataflows can complete now.
    let Running {
        handles,
        allocator_stats,
        stop_input,
        newest,
        ..
    } = running;
    drop(stop_input);
    drop(newest);
    let result = result_of(&handles, &allocator_stats, index, committed);
    hand_back(worker, ctx, result, local)
}

/// The worker's dataflow: its consumer's records through the serving part
/// to the Kafka sink (answers go to the worker that read the request), its
/// node's closed windows to the window log; and the stop and newest-time
/// broadcasts.
fn build(worker: &mut Worker, ctx: &WorkerContext, index: usize, local: usize) -> Running {
    let cfg = &ctx.setup.cfg;
    let stop = ctx.job_stop.clone();
    let clock = Rc::new(SourceClock::default());
    let live = LiveControl {
        inbox: ctx.inboxes[local].clone(),
        clock: clock.clone(),
    };
    let stop_input = stop_broadcast(worker, stop.clone());
    // Cluster mode: every process's newest event time reaches the others
    // (built on every worker, like the stop).
    let newest = ctx
        .topo
        .is_cluster()
        .then(|| NewestBroadcast::new(worker, ctx.shared.clone()));
    let ingest = ctx.ingests.lock().expect("lock")[local]
        .take()
        .expect("one consumer per worker");
    let sink = Rc::new(RefCell::new(KafkaSink::new(
        ctx.producer.clone(),
        ctx.shared.clone(),
        SinkSettings {
            request_topic: cfg.kafka.request_topic.clone(),
            response_topic: cfg.kafka.response_topic.clone(),
            dead_letter_topic: cfg.kafka.dead_letter_topic.clone(),
            max_retries: cfg.kafka.produce_retries,
            retry_backoff: Duration::from_millis(cfg.kafka.produce_retry_backoff_ms),
        },
    )));
    let source = Rc::new(RefCell::new(KafkaSource::new(
        index,
        ingest.consumer,
        ingest.settings,
        ctx.shared.clone(),
        sink.clone(),
        ingest.answered,
    )));
    let release = cfg.run.serve_release();
    let allocator_stats: Rc<RefCell<AllocatorStats>> = Rc::default();
    let mut parts = ctx
        .setup
        .parts(index, worker.peers(), release, allocator_stats.clone());
    parts.deadline = Some(Duration::from_millis(cfg.kafka.deadline_ms));
    parts.max_age = max_age(cfg.kafka.max_age_ms);
    parts.live = Some(live);
    parts.models = Some(ctx.models.clone());
    let probe = ProbeHandle::new();
    let quiet_sleeps = quiet_sleeps(release);
    // One process shares its offset books: no move needed.
    let readers = if ctx.topo.is_cluster() {
        ctx.topo.total()
    } else {
        1
    };
    let handles = worker.dataflow::<u64, _, _>(|scope| {
        let requests = dataflow::kafka::kafka_source(
            scope,
            source.clone(),
            stop.clone(),
            clock.clone(),
            quiet_sleeps,
        );
        let (streams, handles) = dataflow::serving(scope, requests, parts);
        // Answers go back to the worker that read the request (in cluster
        // mode possibly another process): its offset book.
        let answers = dataflow::kafka::answers_to_readers(
            streams.events,
            cfg.kafka.request_topic.clone(),
            readers,
        );
        dataflow::kafka::kafka_sink(
            answers.probe_with(&probe),
            sink.clone(),
            ctx.latency.clone(),
        );
        let window_log = ctx.window_log.clone();
        streams
            .windows
            .sink(Pipeline, "WindowLog", move |(input, _)| {
                input.for_each(|_, data| {
                    // A failure is counted and logged by the log itself:
                    // windows are statistics, serving goes on.
                    let _ = window_log.lock().expect("window log lock").write(data);
                    data.clear();
                });
            });
        handles
    });
    Running {
        source,
        sink,
        handles,
        probe,
        allocator_stats,
        stop_input,
        newest,
    }
}

/// `arrival`: a quiet worker sleeps until something arrives (`complete`
/// steps on, to release held times).
fn quiet_sleeps(release: Release) -> bool {
    release == Release::Arrival
}

/// Steps the dataflow until it completes (the stop drained it), the drain
/// timed out, or the job turned fatal; sends the stop to every process
/// when this one is signalled or fails, and logs the metrics.
fn serve_until_drained(
    worker: &mut Worker,
    ctx: &WorkerContext,
    running: &mut Running,
    local: usize,
    drain: &mut DrainClock,
) {
    let shared = &ctx.shared;
    let metrics_every = Duration::from_millis(ctx.setup.cfg.kafka.metrics_interval_ms);
    let mut last_metrics = Instant::now();
    let mut stop_sent = false;
    let mut said_stopping = false;
    let mut park = BUSY_PARK;
    let quiet_sleeps = quiet_sleeps(ctx.setup.cfg.run.serve_release());
    while !running.probe.done() {
        let fatal = shared.is_fatal();
        // On a fatal error the other processes drain and exit too: they
        // know nothing of it, and this process cannot leave while they
        // keep its connections.
        if !stop_sent && (fatal || ctx.signalled.load(Ordering::Relaxed)) {
            stop_sent = true;
            running.stop_input.send(());
            running.stop_input.flush();
        }
        if fatal {
            if local == 0 {
                let reason = shared.fatal().unwrap_or_default();
                crate::ops::state().set_stopping(reason);
            }
            return;
        }
        if drain.expired(&ctx.job_stop, shared) {
            return;
        }
        if local == 0
            && let Some(newest) = running.newest.as_mut()
        {
            newest.share(shared);
        }
        worker.step_or_park(Some(park));
        if local == 0 && !said_stopping && ctx.job_stop.load(Ordering::Relaxed) {
            said_stopping = true;
            crate::ops::state().set_draining();
            tracing::info!(
                in_flight = shared.in_flight(),
                "stopping: no more reads; draining what is in flight, then committing"
            );
        }
        let retrying = flush(&running.sink);
        // Nothing in flight and nothing to resend: sleep until something
        // arrives (records wake the source; other workers' data, lanes and
        // timers wake the worker) or a stop is asked.
        park = if quiet_sleeps && retrying == 0 && shared.in_flight() == 0 {
            QUIET_PARK
        } else {
            BUSY_PARK
        };
        if last_metrics.elapsed() >= metrics_every {
            last_metrics = Instant::now();
            running.source.borrow().measure_lag();
            if local == 0 {
                log_metrics(shared, &ctx.latency);
            }
        }
    }
}

/// `kafka.max_age_ms` as a limit; 0 = none.
fn max_age(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Drained: everything this worker will ever send is queued or sent. Waits
/// for the broker to acknowledge it (resending what failed) until the
/// drain's deadline or a fatal error.
fn await_deliveries(ctx: &WorkerContext, running: &Running, index: usize, drain: &mut DrainClock) {
    loop {
        if ctx.shared.is_fatal() || drain.expired(&ctx.job_stop, &ctx.shared) {
            return;
        }
        let waiting = flush(&running.sink);
        if let Err(e) = ctx.producer.flush(drain.flush_wait()) {
            tracing::info!(worker = index, error = %e, "waiting for deliveries");
        }
        if waiting == 0 && ctx.producer.in_flight() == 0 && flush(&running.sink) == 0 {
            return;
        }
    }
}

/// Commits what was answered and closes the consumer; the offsets the
/// broker confirmed.
fn commit_and_close(ctx: &WorkerContext, running: &Running, drain: &DrainClock) -> Vec<(i32, i64)> {
    let shared = &ctx.shared;
    // A drain that ended just before its deadline still gives a healthy
    // broker a moment to answer the commit; one that timed out, or a fatal
    // stop (the broker may be away), only that moment. Either way only a
    // commit the broker answered is reported committed.
    let commit_wait = if shared.drain_timed_out.load(Ordering::Relaxed) || shared.is_fatal() {
        CLOSE_GRACE
    } else {
        drain.time_left().max(CLOSE_GRACE)
    };
    let committed = running.source.borrow_mut().commit_within(commit_wait);
    running.source.borrow().measure_lag();
    // Closing may wait on the broker too (an unanswered commit): bounded
    // the same way, with a moment's grace for a healthy close.
    running
        .source
        .borrow_mut()
        .close(drain.time_left().max(CLOSE_GRACE));
    committed
}

/// The worker's part of the summary, from its node.
fn result_of(
    handles: &ServingHandles,
    allocator_stats: &RefCell<AllocatorStats>,
    index: usize,
    committed: Vec<(i32, i64)>,
) -> WorkerResult {
    let node = crate::dataflow::node::lock(&handles.node);
    let mut allocator = allocator_stats.take();
    // Serving never samples moves, so nothing is recorded; and the result
    // crosses processes in cluster mode.
    allocator.steps.clear();
    let c = node.counters();
    WorkerResult {
        worker: index,
        committed,
        oov_items: c.oov_items,
        truncated_histories: c.truncated_histories,
        unknown_user_histories: c.unknown_user_histories,
        model_version: node.model_version().to_string(),
        alpha: node.alpha(),
        refill: RefillSummary::of(c),
        allocator,
        process_part: None,
    }
}

/// One process: the result as it is. Cluster mode: every worker's result
/// goes to worker 0 (the first worker of each process adds its process's
/// counts once all its workers have committed); a process other than 0
/// keeps its own workers' results too, to print its own part.
fn hand_back(
    worker: &mut Worker,
    ctx: &WorkerContext,
    mut result: WorkerResult,
    local: usize,
) -> Vec<WorkerResult> {
    if !ctx.topo.is_cluster() {
        return vec![result];
    }
    if ctx.failure.failed().is_some() {
        // A worker that panicked never reaches the barrier.
        return Vec::new();
    }
    // Every local worker has committed: the process's counters are final.
    ctx.local_done.wait();
    if local == 0 {
        let lost = ctx.window_log.lock().expect("window log lock").lost();
        result.process_part = Some(ProcessPart::of(&ctx.shared, &ctx.latency, lost));
    }
    let wait =
        Duration::from_millis(ctx.setup.cfg.kafka.drain_timeout_ms) + 2 * CLOSE_GRACE + GATHER_WAIT;
    let gathered = crate::cluster::gather_to_worker_0(worker, &result, wait);
    if worker.index() == 0 {
        gathered
    } else if ctx.topo.is_leader() {
        // Worker 0 of this process holds it already.
        Vec::new()
    } else {
        // Another process prints its own part too.
        vec![result]
    }
}

/// Offers the sink's held outputs again; how many still wait.
fn flush(sink: &RefCell<KafkaSink>) -> usize {
    // The Kafka sink's flush cannot fail (see `KafkaSink::retry`).
    sink.borrow_mut().flush().unwrap_or_default()
}

fn log_metrics(shared: &SharedState, latency: &AnswerLatency) {
    let c = &shared.counters;
    let p99_ms_since_start = latency.p99_ms();
    // The gauge is this interval's: a p99 since start would hardly move
    // after weeks of traffic. No answers: NaN (no p99), not the last one.
    let p99_ms = latency.take_recent_p99_ms();
    // Counters reach /metrics as they happen (`KafkaEvent`); gauges here.
    metrics::gauge!("grflow_in_flight").set(shared.in_flight() as f64);
    metrics::gauge!("grflow_p99_ms").set(p99_ms.unwrap_or(f64::NAN));
    // A lag the job cannot vouch for (no fetch came back for a while) is
    // NaN, with its age beside it, rather than the last value frozen.
    let now = Instant::now();
    let lag = shared.known_lag(now);
    for (partition, g) in shared.lag_gauges(now) {
        let partition = partition.to_string();
        metrics::gauge!("grflow_consumer_lag", "partition" => partition.clone())
            .set(g.lag.map_or(f64::NAN, |l| l as f64));
        metrics::gauge!("grflow_consumer_lag_age_seconds", "partition" => partition)
            .set(g.age.as_secs_f64());
    }
    tracing::info!(
        requests_in = c.consumed.load(Ordering::Relaxed),
        responses_out = c.responses.load(Ordering::Relaxed),
        shed = c.shed.load(Ordering::Relaxed),
        stale = c.stale.load(Ordering::Relaxed),
        skipped_offsets = c.skipped_offsets.load(Ordering::Relaxed),
        log_resets = c.log_resets.load(Ordering::Relaxed),
        recovered_unshed = c.recovered_unshed.load(Ordering::Relaxed),
        dead_lettered = c.dead_lettered.load(Ordering::Relaxed),
        delivered = c.delivered.load(Ordering::Relaxed),
        late = c.late.load(Ordering::Relaxed),
        clamped_ts = c.clamped_ts.load(Ordering::Relaxed),
        repeated_req_ids = c.repeated_req_ids.load(Ordering::Relaxed),
        undeliverable = c.undeliverable.load(Ordering::Relaxed),
        in_flight = shared.in_flight(),
        p99_ms,
        p99_ms_since_start,
        lag = ?lag,
        "serve metrics"
    );
}

/// The shutdown drain's deadline: `timeout` after this worker first sees
/// `stop`. Expiry is shared, so every worker leaves the dataflow together
/// (one that stayed would wait forever for its peers' progress).
struct DrainClock {
    timeout: Duration,
    started: bool,
    deadline: Option<Instant>,
}

impl DrainClock {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            started: false,
            deadline: None,
        }
    }

    fn expired(&mut self, stop: &AtomicBool, shared: &SharedState) -> bool {
        if shared.drain_timed_out.load(Ordering::Relaxed) {
            return true;
        }
        if !self.started && stop.load(Ordering::Relaxed) {
            self.started = true;
            // None: a timeout too long to represent never expires.
            self.deadline = Instant::now().checked_add(self.timeout);
        }
        let expired = self.deadline.is_some_and(|d| Instant::now() >= d);
        if expired && !shared.drain_timed_out.swap(true, Ordering::Relaxed) {
            tracing::error!(
                timeout_ms = self.timeout.as_millis() as u64,
                in_flight = shared.in_flight(),
                "drain timed out: unanswered requests stay uncommitted and are read again on restart"
            );
        }
        expired
    }

    /// Time to the deadline (the whole timeout before it started).
    fn time_left(&self) -> Duration {
        self.deadline.map_or(self.timeout, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// How long one flush may wait without overshooting the deadline.
    fn flush_wait(&self) -> Duration {
        let left = self.deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        left.clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}

/// Marks the job fatal when its worker unwinds, after recording which
/// worker failed.
struct PanicToFatal {
    shared: Arc<SharedState>,
    failure: WorkerFailure,
    index: usize,
}

impl Drop for PanicToFatal {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Recorded first: the others check it once they see `fatal`.
            self.failure.record(self.index);
            self.shared.set_fatal(format!(
                "worker {} panicked (see the panic message above)",
                self.index
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_max_age_is_none() {
        assert_eq!(max_age(0), None);
        assert_eq!(max_age(250), Some(Duration::from_millis(250)));
    }

    #[test]
    fn the_drain_deadline_starts_at_the_stop_and_is_shared() {
        let shared = SharedState::new("requests", 2);
        let stop = AtomicBool::new(false);
        let mut a = DrainClock::new(Duration::from_millis(30));
        let mut b = DrainClock::new(Duration::from_secs(3600));
        // Before the stop nothing expires, and the whole timeout is left.
        assert!(!a.expired(&stop, &shared));
        assert_eq!(a.time_left(), Duration::from_millis(30));
        assert_eq!(a.flush_wait(), Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        assert!(!a.expired(&stop, &shared));
        assert!(a.time_left() <= Duration::from_millis(30));
        assert!(a.flush_wait() <= Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(40));
        assert!(a.expired(&stop, &shared));
        assert_eq!(a.flush_wait(), Duration::from_millis(1));
        // Another worker's clock, far from its own deadline, leaves too.
        assert!(shared.drain_timed_out.load(Ordering::Relaxed));
        assert!(b.expired(&stop, &shared));
    }

    #[test]
    fn a_timeout_too_long_to_represent_never_expires() {
        let shared = SharedState::new("requests", 1);
        let stop = AtomicBool::new(true);
        let mut clock = DrainClock::new(Duration::MAX);
        assert!(!clock.expired(&stop, &shared));
        assert_eq!(clock.time_left(), Duration::MAX);
        assert!(!shared.drain_timed_out.load(Ordering::Relaxed));
    }

    #[test]
    fn a_worker_that_unwinds_makes_the_job_fatal_and_is_named() {
        let shared = Arc::new(SharedState::new("requests", 2));
        let failure = WorkerFailure::default();
        // Dropped without a panic: nothing happens.
        drop(PanicToFatal {
            shared: shared.clone(),
            failure: failure.clone(),
            index: 0,
        });
        assert!(!shared.is_fatal());
        let (s, f) = (shared.clone(), failure.clone());
        let joined = std::thread::spawn(move || {
            let _guard = PanicToFatal {
                shared: s,
                failure: f,
                index: 1,
            };
            panic!("worker 1 fails");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(failure.failed(), Some(1));
        assert!(shared.fatal().is_some_and(|r| r.contains("worker 1")));
    }
}
