//! `grflow serve`: the serving dataflow between a Kafka request topic and a
//! response topic, until told to stop. Delivery guarantee (no broker
//! transactions are needed): an offset is committed only after the answers
//! of every record before it are durable, a restarted job skips records the
//! response topic already answers, so every request is answered, and only a
//! request in flight at a crash can be answered twice; such a second answer
//! comes from a fresh computation after the first was lost in flight, or
//! reached the broker only after the restart scan. Records that were in the
//! request log at start are therefore never shed (a late first answer is a
//! ranking), so both answers are the same within the tolerance of
//! `WireResponse::same_answer`.

pub mod check;
pub mod histogram;
pub mod summary;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timely::dataflow::ProbeHandle;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Probe;
use timely::dataflow::operators::generic::Operator;

use grflow_connectors::Sink;
use grflow_connectors::kafka::{
    AnsweredRequest, BrokerProbe, KafkaClientError, KafkaSettings, KafkaSink, KafkaSource,
    OutputProducer, Refetch, RequestConsumer, Resumed, ServedLimits, SharedState, SinkSettings,
    SourceSettings, StartPosition, ensure_topics, owned_partitions, partition_count, scan_answers,
};
use grflow_connectors::parquet::load_side_tables;
use grflow_operators::node::ServingNode;

use crate::cluster::ClusterError;
use crate::config::Config;
use crate::dataflow::allocator::AllocatorStats;
use crate::dataflow::control::{LiveControl, SourceClock};
use crate::dataflow::{self, ServingParts};
use crate::events::{NodeControl, Target};
use crate::job::{Job, JobError};
use crate::models::ModelRegistry;
use crate::params::{ParamsError, node_params};
use crate::side::SideTables;
pub use check::CheckReport;
use grflow_operators::node::NodeCommand;
pub use summary::ServeSummary;
use summary::{AnswerLatency, ProcessPart, RefillSummary};

/// Timeout of blocking metadata, commit and watermark calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// What a consumer's close may take past the drain deadline.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("config: {0}")]
    Config(String),
    /// The node parameters (`model.*`, `memory.*`): typed, so that the
    /// binary can name the flag that set the key.
    #[error("config: {0}")]
    Params(#[from] ParamsError),
    /// `[cluster]`, likewise.
    #[error("config: {0}")]
    Cluster(#[from] ClusterError),
    #[error("kafka.catalog: {0}")]
    Catalog(String),
    #[error(transparent)]
    Kafka(#[from] grflow_connectors::kafka::KafkaClientError),
    /// `--admin-addr` cannot be served (it names the flag itself).
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    #[error("timely: {0}")]
    Timely(String),
    #[error("worker {0} panicked")]
    WorkerPanicked(usize),
    /// An output could neither be delivered nor dead-lettered.
    #[error("stopped: {0}")]
    Fatal(String),
}

impl From<JobError> for ServeError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Cluster(e) => Self::Cluster(e),
            JobError::Params(e) => Self::Params(e),
            JobError::Other(m) => Self::Config(m),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub config: Config,
    /// `--admin-addr`: a loopback HOST:PORT for `POST /model` (hot model
    /// swap); `None` = no admin endpoint.
    pub admin_addr: Option<String>,
    /// `--model-watch`: a model directory (or a link to one) whose version
    /// change swaps every node to it.
    pub model_watch: Option<std::path::PathBuf>,
}

impl ServeOptions {
    /// Serving `config`, with no admin endpoint and no watched model path.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            admin_addr: None,
            model_watch: None,
        }
    }

    fn settings(&self) -> KafkaSettings {
        kafka_settings(&self.config, format!("grflow-{}", std::process::id()))
    }
}

/// How a client of this config's `[kafka]` section reaches the cluster:
/// brokers, group, compression and the librdkafka properties (security
/// included, with `GRFLOW_KAFKA_SASL_PASSWORD` as `sasl.password`).
pub fn kafka_settings(config: &Config, client_id: String) -> KafkaSettings {
    let k = &config.kafka;
    let mut extra = k.librdkafka.clone();
    // A password kept out of the config file.
    if let Ok(p) = std::env::var("GRFLOW_KAFKA_SASL_PASSWORD")
        && !p.is_empty()
    {
        extra.insert("sasl.password".into(), p);
    }
    KafkaSettings {
        brokers: k.brokers.clone(),
        group_id: k.group_id.clone(),
        client_id,
        extra,
        compression: k.compression,
    }
}

fn side_tables(config: &Config) -> Result<SideTables, ServeError> {
    let shard_rows = config.node.shard_rows;
    if config.kafka.catalog.is_empty() {
        let gen_cfg = config.trace.gen_config().map_err(ServeError::Config)?;
        let trace = grflow_traces::generate(&gen_cfg);
        let meta = trace
            .meta
            .ok_or_else(|| ServeError::Catalog("generated trace has no metadata".into()))?;
        SideTables::new(meta, trace.users, trace.items, shard_rows)
    } else {
        let tables = load_side_tables(std::path::Path::new(&config.kafka.catalog))
            // The error names the file (and with it the directory).
            .map_err(|e| ServeError::Catalog(e.to_string()))?;
        SideTables::new(tables.meta, tables.users, tables.items, shard_rows)
    }
    .map_err(|e| ServeError::Catalog(e.to_string()))
}

/// What one worker hands back (in cluster mode, to process 0 as JSON; the
/// first worker of each process adds its process's part).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct WorkerResult {
    committed: Vec<(i32, i64)>,
    oov_items: u64,
    truncated_histories: u64,
    #[serde(default)]
    unknown_user_histories: u64,
    model_version: String,
    /// The worker's node's α when the job stopped.
    alpha: f64,
    refill: RefillSummary,
    /// What this worker's allocators did (no training records).
    allocator: AllocatorStats,
    process_part: Option<ProcessPart>,
    /// Global worker index.
    worker: usize,
}

/// How long process 0 waits for the other processes' results at exit,
/// beyond the longest a process may spend draining and closing after the
/// stop (its own drain may end long before another's).
const GATHER_WAIT: Duration = Duration::from_secs(30);

/// What both a start and `serve --check` refuse before anything else:
/// settings for replay or training only, and an `--admin-addr` the endpoint
/// could not start on (it starts only after topics are created).
fn check_before_start(opts: &ServeOptions) -> Result<(), ServeError> {
    check_servable(&opts.config).map_err(ServeError::Config)?;
    if let Some(addr) = &opts.admin_addr {
        crate::admin::AdminServer::check_addr(addr)?;
    }
    Ok(())
}

/// Settings that are for replay or training only: refused before the job
/// starts, naming the key, rather than served.
fn check_servable(cfg: &Config) -> Result<(), String> {
    if cfg.run.clock == crate::config::Clock::Virtual {
        return Err(
            "run.clock = \"virtual\" charges a cost model instead of running the model: \
             it is for replay, not for serving"
                .into(),
        );
    }
    if cfg.allocator.sample {
        // Training keeps one record per decided window, which a job that
        // runs for months would grow without bound.
        return Err(
            "allocator.sample = true is for `grflow train-allocator` only: \
             it samples random α moves and keeps every decision; remove it to serve"
                .into(),
        );
    }
    // A short batch waits this long for company before it is served: at or
    // past the deadline, every request of a quiet period would be shed.
    if cfg.batch.max_wait_ms >= cfg.kafka.deadline_ms as f64 {
        return Err(format!(
            "batch.max_wait_ms ({}) must be less than kafka.deadline_ms ({}): a batch that \
             waits that long to fill sheds every request in it",
            cfg.batch.max_wait_ms, cfg.kafka.deadline_ms
        ));
    }
    Ok(())
}

/// Opens worker `w`'s request consumer on its share of `partitions`, as
/// `kafka.start` and `kafka.refetch_from_start` say: the consumer, and
/// where each of its partitions resumes.
fn open_request_consumer(
    settings: &KafkaSettings,
    k: &crate::config::KafkaSection,
    partitions: i32,
    w: usize,
    workers: usize,
) -> Result<(RequestConsumer, Vec<Resumed>), ServeError> {
    let start = match k.start.as_str() {
        "latest" => StartPosition::Latest,
        _ => StartPosition::Earliest,
    };
    let refetch = if k.refetch_from_start {
        Refetch::FromStart
    } else {
        Refetch::FromCommitted
    };
    let owned = owned_partitions(&k.request_topic, partitions, w, workers);
    Ok(RequestConsumer::open(
        settings,
        &k.request_topic,
        &owned,
        start,
        refetch,
        CALL_TIMEOUT,
    )?)
}

/// The answers of the restart scan a worker may meet: on its partitions
/// (`resumed`), at or past where each resumes (records below are skipped
/// as consumed before answers are looked at, so those would only hold
/// memory for the whole run), and not where the log is gone (a committed
/// offset past its end: they name records of the old log).
fn answers_ahead(
    answered: &HashSet<AnsweredRequest>,
    resumed: &[Resumed],
) -> HashSet<AnsweredRequest> {
    let resumes_at: HashMap<i32, i64> = resumed
        .iter()
        .filter(|r| r.past_end.is_none())
        .map(|r| (r.partition, r.offset))
        .collect();
    answered
        .iter()
        .filter(|a| {
            resumes_at
                .get(&a.source.partition)
                .is_some_and(|&from| a.source.offset >= from)
        })
        .copied()
        .collect()
}

/// Fails unless the dead-letter topic exists: found missing only when the
/// first bad record cannot be written, it would stop the job (the record's
/// offset uncommitted) at every start, a crash loop. Its partition count.
fn check_dead_letter_topic(settings: &KafkaSettings, topic: &str) -> Result<i32, ServeError> {
    match partition_count(settings, topic, CALL_TIMEOUT) {
        Ok(n) => Ok(n),
        Err(KafkaClientError::NoSuchTopic { topic, brokers }) => Err(ServeError::Config(format!(
            "kafka.dead_letter_topic `{topic}` does not exist on {brokers}: create it, \
             or set kafka.create_partitions to create missing topics at start"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Runs until `stop` is set, then drains, commits and returns the summary.
pub fn serve(opts: ServeOptions, stop: Arc<AtomicBool>) -> Result<ServeSummary, ServeError> {
    check_before_start(&opts)?;
    let cfg = opts.config.clone();
    let k = cfg.kafka.clone();
    let settings = opts.settings();
    // The dataflow's start (after the model load, the restart scan and the
    // cluster's connections), as in replay: wall_s and throughput measure
    // serving, not setup.
    let started: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let job = Job::prepare(cfg.clone(), side_tables(&cfg)?)?;
    let topo = job.topology();
    // Nodes of the whole job (N processes × W workers); partitions, offset
    // books and node ids use the global worker index.
    let workers = topo.total();
    let side = job.side.clone();
    let nodes = job.nodes();
    // Every node starts with the same parameters, hence the same history
    // limits; a node that takes another model adds its limits to what the
    // sources cut with (through `models`, see `ServedLimits`).
    let history_limits = nodes
        .with_first(ServingNode::history_limits)
        .ok_or_else(|| ServeError::Config("run.workers must be >= 1".into()))?;
    let served_history = ServedLimits::new(history_limits);
    let model_version = job.model_version.clone();

    if k.create_partitions > 0 {
        ensure_topics(
            &settings,
            &[
                (k.request_topic.as_str(), k.create_partitions),
                (k.response_topic.as_str(), k.create_partitions),
                (k.dead_letter_topic.as_str(), 1),
            ],
            k.replication_factor,
            CALL_TIMEOUT,
        )?;
    }
    let partitions = partition_count(&settings, &k.request_topic, CALL_TIMEOUT)?;
    check_dead_letter_topic(&settings, &k.dead_letter_topic)?;
    let answered = scan_answers(
        &settings,
        &k.response_topic,
        &k.request_topic,
        k.restart_scan,
        CALL_TIMEOUT,
    )?;
    if !answered.is_empty() {
        tracing::info!(
            answered = answered.len(),
            "restart: requests already answered on the response topic will be skipped"
        );
    }

    // Models the admin endpoint may swap to, checked against this catalog.
    let models = {
        let cfg = cfg.clone();
        let side = side.clone();
        Arc::new(
            ModelRegistry::new(Box::new(move |path: &str| {
                let mut c = cfg.clone();
                c.model.weights = Some(path.into());
                node_params(&c, &side.meta, &side.catalog()).map_err(|e| e.to_string())
            }))
            .with_history(served_history.clone()),
        )
    };
    for n in topo.local_workers() {
        models.note_serving(n as u32, &model_version);
    }
    // One inbox per local worker; the admin hands a swap to the first,
    // addressed to every node of the job.
    let inboxes: Vec<Arc<Mutex<VecDeque<NodeControl>>>> =
        (0..topo.threads).map(|_| Arc::default()).collect();
    // Commands for every node of the job, from the admin endpoint or the
    // model watcher: into the first local worker's inbox.
    let submit: crate::admin::Submit = {
        let inbox = inboxes[0].clone();
        let seq = AtomicU64::new(0);
        Arc::new(move |command: NodeCommand| {
            inbox.lock().expect("inbox lock").push_back(NodeControl {
                target: Target::All,
                seq: seq.fetch_add(1, Ordering::Relaxed),
                command,
            });
        })
    };
    let watch_models_done = Arc::new(AtomicBool::new(false));
    let model_watch = opts.model_watch.as_ref().map(|path| {
        crate::models::watch(
            path.clone(),
            model_version.clone(),
            models.clone(),
            submit.clone(),
            watch_models_done.clone(),
        )
    });
    let _admin = match &opts.admin_addr {
        Some(addr) => {
            let server = crate::admin::AdminServer::start(addr, models.clone(), submit.clone())?;
            eprintln!(
                "admin: http://{}/model (POST a model directory to swap)",
                server.local_addr()
            );
            Some(server)
        }
        None => None,
    };

    let shared = Arc::new(SharedState::new(&k.request_topic, workers));
    shared.saw_partitions(partitions);
    let latency = Arc::new(AnswerLatency::new(cfg.run.slo_ms));
    let delivery_state = shared.clone();
    let producer = Arc::new(OutputProducer::new(
        &settings,
        Arc::new(move |d| delivery_state.on_delivery(d)),
    )?);

    // Consumers are opened here so that a broker or topic problem fails
    // before any worker starts.
    let mut ingests = Vec::with_capacity(topo.threads);
    for w in topo.local_workers() {
        let (consumer, resumed) = open_request_consumer(&settings, &k, partitions, w, workers)?;
        {
            let mut book = shared.book(w).lock().expect("offset book lock");
            for r in &resumed {
                // A `commit_start` position is committed at once, even at 0.
                book.register(r);
                tracing::info!(
                    worker = w,
                    partition = r.partition,
                    offset = r.offset,
                    from_commit = r.from_commit,
                    committed_past_end = r.past_end,
                    "reading"
                );
            }
        }
        let mine = answers_ahead(&answered, &resumed);
        let source_settings = SourceSettings {
            request_topic: k.request_topic.clone(),
            dead_letter_topic: k.dead_letter_topic.clone(),
            max_in_flight: k.max_in_flight,
            max_in_flight_tokens: k.max_in_flight_tokens,
            max_message_bytes: k.max_message_bytes,
            max_candidates: cfg.model.max_candidates,
            history: served_history.clone(),
            idle_timeout: Duration::from_millis(k.idle_timeout_ms),
            max_skew_ms: k.max_skew_ms,
            max_future_ms: k.max_future_ms,
            repeat_window: k.repeat_window,
            commit_interval: Duration::from_millis(k.commit_interval_ms),
        };
        ingests.push(Some((consumer, source_settings, mine)));
    }
    // Each worker holds its share; the whole scan is not needed any more.
    drop(answered);
    let ingests = Arc::new(Mutex::new(ingests));

    // Opened before the job starts, so an unwritable path fails at once.
    let window_log = Arc::new(Mutex::new(
        crate::window_log::WindowLog::open(&cfg.windows.out).map_err(ServeError::Config)?,
    ));
    let windows_lost = {
        let log = window_log.clone();
        move || log.lock().expect("window log lock").lost()
    };
    let worker_cfg = cfg.clone();
    let worker_shared = shared.clone();
    let failure = crate::worker_failure::WorkerFailure::default();
    let worker_failure = failure.clone();
    let worker_latency = latency.clone();
    let worker_producer = producer.clone();
    let worker_side = side.clone();
    let worker_policy = job.allocator_policy.clone();
    let (pool_pages, max_positions) = (job.pool_pages, job.max_positions);
    let worker_models = models.clone();
    let worker_started = started.clone();
    let metrics_every = Duration::from_millis(k.metrics_interval_ms);
    job.publish(
        "serve",
        serde_json::json!({
            // What this build's librdkafka speaks (TLS, SASL, codecs).
            "kafka_features": grflow_connectors::kafka::builtin_features(),
            "models": models.report(),
        }),
    );
    let watch_done = Arc::new(AtomicBool::new(false));
    let watch = {
        let probe = BrokerProbe::new(&settings, &k.request_topic)?;
        let unready_after =
            (k.unready_after_ms > 0).then(|| Duration::from_millis(k.unready_after_ms));
        let done = watch_done.clone();
        let shared = shared.clone();
        std::thread::spawn(move || watch_broker(probe, unready_after, &shared, &done))
    };
    // What the workers obey: set by this process's signal or by a stop
    // another process broadcast (every process drains together; one that
    // left alone would break timely's connections and panic the others).
    let job_stop = Arc::new(AtomicBool::new(false));
    let signalled = stop;
    let stop_while_connecting = signalled.clone();
    let local_done = Arc::new(std::sync::Barrier::new(topo.threads));
    let guards = job
        .cluster
        .execute(
            move |worker| {
                let index = worker.index();
                // A panic here stops the others (through `fatal`) instead of
                // leaving them serving without this worker's partitions.
                let _watch = PanicToFatal {
                    shared: worker_shared.clone(),
                    failure: worker_failure.clone(),
                    index,
                };
                let local = topo.local(index).expect("a local worker");
                // Model, catalog and consumers are set up and (in cluster mode) the
                // other processes connected: the dataflow starts now.
                if local == 0 {
                    crate::ops::state().set_started();
                }
                worker_started.get_or_init(Instant::now);
                let stop = job_stop.clone();
                let clock = Rc::new(SourceClock::default());
                let live = LiveControl {
                    inbox: inboxes[local].clone(),
                    clock: clock.clone(),
                };
                let mut stop_input = stop_broadcast(worker, stop.clone());
                let mut stop_sent = false;
                // Cluster mode: every process's newest event time reaches
                // the others (built on every worker, like the stop).
                let mut newest = topo
                    .is_cluster()
                    .then(|| NewestBroadcast::new(worker, worker_shared.clone()));
                let (consumer, source_settings, answered) = ingests.lock().expect("lock")[local]
                    .take()
                    .expect("one consumer per worker");
                let sink = Rc::new(RefCell::new(KafkaSink::new(
                    worker_producer.clone(),
                    worker_shared.clone(),
                    SinkSettings {
                        request_topic: worker_cfg.kafka.request_topic.clone(),
                        response_topic: worker_cfg.kafka.response_topic.clone(),
                        dead_letter_topic: worker_cfg.kafka.dead_letter_topic.clone(),
                        max_retries: worker_cfg.kafka.produce_retries,
                        retry_backoff: Duration::from_millis(
                            worker_cfg.kafka.produce_retry_backoff_ms,
                        ),
                    },
                )));
                let source = Rc::new(RefCell::new(KafkaSource::new(
                    index,
                    consumer,
                    source_settings,
                    worker_shared.clone(),
                    sink.clone(),
                    answered,
                )));
                let router = Job::router(&worker_cfg, worker.peers());
                let node = nodes.take(index);
                let allocator_stats: Rc<RefCell<AllocatorStats>> = Rc::default();
                let probe = ProbeHandle::new();
                let quiet_sleeps =
                    worker_cfg.run.serve_release() == crate::config::Release::Arrival;
                let handles = worker.dataflow::<u64, _, _>(|scope| {
                    let requests = dataflow::kafka::kafka_source(
                        scope,
                        source.clone(),
                        stop.clone(),
                        clock.clone(),
                        quiet_sleeps,
                    );
                    let (streams, handles) = dataflow::serving(
                        scope,
                        requests,
                        ServingParts {
                            router,
                            node,
                            side: worker_side.clone(),
                            slo_ms: worker_cfg.run.slo_ms,
                            clock: worker_cfg.run.clock,
                            deadline: Some(Duration::from_millis(worker_cfg.kafka.deadline_ms)),
                            max_age: match worker_cfg.kafka.max_age_ms {
                                0 => None,
                                ms => Some(Duration::from_millis(ms)),
                            },
                            window_ms: worker_cfg.windows.epoch_ms,
                            release: worker_cfg.run.serve_release(),
                            batch: worker_cfg.batch_policy(),
                            token_capacity: worker_cfg.node.token_capacity,
                            commands: Vec::new(),
                            command_pacing: dataflow::Pacing {
                                speed: crate::config::Speed::Max,
                                origin_ts_ms: 0,
                                start: Instant::now(),
                            },
                            controller: crate::replay::allocator_controller(
                                &worker_cfg,
                                worker_cfg.run.serve_release(),
                                worker_policy.clone(),
                                pool_pages,
                                max_positions,
                                allocator_stats.clone(),
                            ),
                            live: Some(live.clone()),
                            models: Some(worker_models.clone()),
                            oracle: None,
                        },
                    );
                    // Answers go back to the worker that read the request (in
                    // cluster mode possibly another process): its offset book.
                    let answers = dataflow::kafka::answers_to_readers(
                        streams.events,
                        worker_cfg.kafka.request_topic.clone(),
                        // One process shares its offset books: no move needed.
                        if topo.is_cluster() { topo.total() } else { 1 },
                    );
                    dataflow::kafka::kafka_sink(
                        answers.probe_with(&probe),
                        sink.clone(),
                        worker_latency.clone(),
                    );
                    let window_log = window_log.clone();
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

                let mut last_metrics = Instant::now();
                let mut said_stopping = false;
                let mut park = BUSY_PARK;
                let mut drain =
                    DrainClock::new(Duration::from_millis(worker_cfg.kafka.drain_timeout_ms));
                while !probe.done() {
                    let fatal = worker_shared.is_fatal();
                    // On a fatal error the other processes drain and exit
                    // too: they know nothing of it, and this process cannot
                    // leave while they keep its connections.
                    if !stop_sent && (fatal || signalled.load(Ordering::Relaxed)) {
                        stop_sent = true;
                        stop_input.send(());
                        stop_input.flush();
                    }
                    if fatal {
                        if local == 0 {
                            let reason = worker_shared.fatal().unwrap_or_default();
                            crate::ops::state().set_stopping(reason);
                        }
                        break;
                    }
                    if drain.expired(&stop, &worker_shared) {
                        break;
                    }
                    if local == 0
                        && let Some(newest) = newest.as_mut()
                    {
                        newest.share(&worker_shared);
                    }
                    worker.step_or_park(Some(park));
                    if local == 0 && !said_stopping && stop.load(Ordering::Relaxed) {
                        said_stopping = true;
                        crate::ops::state().set_draining();
                        tracing::info!(
                            in_flight = worker_shared.in_flight(),
                            "stopping: no more reads; draining what is in flight, then committing"
                        );
                    }
                    let retrying = flush(&sink);
                    // Nothing in flight and nothing to resend: sleep until
                    // something arrives (records wake the source; other workers'
                    // data, lanes and timers wake the worker) or a stop is asked.
                    park = if quiet_sleeps && retrying == 0 && worker_shared.in_flight() == 0 {
                        QUIET_PARK
                    } else {
                        BUSY_PARK
                    };
                    if last_metrics.elapsed() >= metrics_every {
                        last_metrics = Instant::now();
                        source.borrow().measure_lag();
                        if local == 0 {
                            log_metrics(&worker_shared, &worker_latency);
                        }
                    }
                }
                // Drained: everything this worker will ever send is queued or sent.
                // Wait for the broker to acknowledge it, then commit for good.
                loop {
                    if worker_shared.is_fatal() || drain.expired(&stop, &worker_shared) {
                        break;
                    }
                    let waiting = flush(&sink);
                    if let Err(e) = worker_producer.flush(drain.flush_wait()) {
                        tracing::info!(worker = index, error = %e, "waiting for deliveries");
                    }
                    if waiting == 0 && worker_producer.in_flight() == 0 {
                        let failed_again = flush(&sink);
                        if failed_again == 0 {
                            break;
                        }
                    }
                }
                // A drain that ended just before its deadline still gives a
                // healthy broker a moment to answer the commit; one that timed
                // out, or a fatal stop (the broker may be away), only that
                // moment. Either way only a commit the broker answered is
                // reported committed.
                let commit_wait = if worker_shared.drain_timed_out.load(Ordering::Relaxed)
                    || worker_shared.is_fatal()
                {
                    CLOSE_GRACE
                } else {
                    drain.time_left().max(CLOSE_GRACE)
                };
                let committed = source.borrow_mut().commit_within(commit_wait);
                source.borrow().measure_lag();
                // Closing may wait on the broker too (an unanswered commit): bounded
                // the same way, with a moment's grace for a healthy close.
                source
                    .borrow_mut()
                    .close(drain.time_left().max(CLOSE_GRACE));
                if !probe.done() {
                    // Left early (drain timeout, fatal error): timely would keep
                    // stepping an unfinished dataflow after this closure returns.
                    for id in worker.installed_dataflows() {
                        worker.drop_dataflow(id);
                    }
                }
                // The stop and newest dataflows can complete now.
                drop(stop_input);
                drop(newest);
                let node = crate::dataflow::node::lock(&handles.node);
                let mut allocator = allocator_stats.take();
                // Serving never samples moves, so nothing is recorded; and the
                // result crosses processes in cluster mode.
                allocator.steps.clear();
                let mut result = WorkerResult {
                    worker: index,
                    committed,
                    oov_items: node.counters().oov_items,
                    truncated_histories: node.counters().truncated_histories,
                    unknown_user_histories: node.counters().unknown_user_histories,
                    model_version: node.model_version().to_string(),
                    alpha: node.alpha(),
                    refill: RefillSummary::of(node.counters()),
                    allocator,
                    process_part: None,
                };
                drop(node);
                if !topo.is_cluster() {
                    return vec![result];
                }
                if worker_failure.failed().is_some() {
                    // A worker that panicked never reaches the barrier.
                    return Vec::new();
                }
                // Every local worker has committed: the process's counters are final.
                local_done.wait();
                if local == 0 {
                    let lost = window_log.lock().expect("window log lock").lost();
                    result.process_part =
                        Some(ProcessPart::of(&worker_shared, &worker_latency, lost));
                }
                let wait = Duration::from_millis(worker_cfg.kafka.drain_timeout_ms)
                    + 2 * CLOSE_GRACE
                    + GATHER_WAIT;
                let gathered = crate::cluster::gather_to_worker_0(worker, &result, wait);
                if index == 0 {
                    gathered
                } else if topo.is_leader() {
                    // Worker 0 of this process holds it already.
                    Vec::new()
                } else {
                    // Another process prints its own part too.
                    vec![result]
                }
            },
            Some(stop_while_connecting),
        )
        .map_err(|e| match e {
            crate::cluster::ExecuteError::Mismatch(m) => ServeError::Config(m),
            crate::cluster::ExecuteError::Timely(m) => ServeError::Timely(m),
        })?;

    let joined = guards.join();
    watch_done.store(true, Ordering::Relaxed);
    watch_models_done.store(true, Ordering::Relaxed);
    if let Some(w) = model_watch {
        let _ = w.join();
    }
    let _ = watch.join();
    if let Some(worker) = failure.failed() {
        return Err(ServeError::WorkerPanicked(worker));
    }
    let mut results = Vec::with_capacity(topo.threads);
    for (i, r) in joined.into_iter().enumerate() {
        results.extend(r.map_err(|_| ServeError::WorkerPanicked(topo.local_workers().start + i))?);
    }
    if let Some(reason) = shared.fatal() {
        return Err(ServeError::Fatal(reason));
    }
    let wall_s = started.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
    if !topo.is_cluster() {
        let part = ProcessPart::of(&shared, &latency, windows_lost());
        return Ok(summarise(&cfg, topo, &settings, &part, &results, wall_s));
    }
    // Cluster mode: process 0 received every worker's result and every
    // process's part; the others report their own process.
    let mut part = ProcessPart::default();
    let gathered = results.iter().any(|r| r.process_part.is_some());
    let mut missing = Vec::new();
    if topo.is_leader() && gathered {
        for p in results.iter().filter_map(|r| r.process_part.as_ref()) {
            part.merge(p);
        }
        missing = missing_processes(topo, &results);
        if !missing.is_empty() {
            tracing::warn!(
                ?missing,
                "the results of some processes did not reach process 0 in time: this \
                 summary leaves their counts out (each printed its own)"
            );
        }
    } else {
        part = ProcessPart::of(&shared, &latency, windows_lost());
        results.retain(|r| topo.local(r.worker).is_some());
    }
    let mut summary = summarise(&cfg, topo, &settings, &part, &results, wall_s);
    summary.processes_missing = missing;
    Ok(summary)
}

/// The processes none of whose results arrived at process 0.
fn missing_processes(topo: crate::cluster::Topology, results: &[WorkerResult]) -> Vec<usize> {
    let reported: HashSet<usize> = results
        .iter()
        .filter(|r| r.process_part.is_some())
        .map(|r| r.worker / topo.threads.max(1))
        .collect();
    (0..topo.processes)
        .filter(|p| !reported.contains(p))
        .collect()
}

/// Asks the broker for the request topic's metadata every second. The
/// partition count goes to `shared` (workers start reading partitions
/// created while the job runs). Then it asks where the logs of the
/// partitions whose consumer lag nothing vouched for lately (no requests)
/// end, which keeps their lag known (see `grflow_connectors::kafka::lag`).
/// Readiness follows the broker when `unready_after` is set: after that
/// long without an answer `/readyz` says not ready (and why) until the
/// next answer. Runs until `done`.
fn watch_broker(
    probe: BrokerProbe,
    unready_after: Option<Duration>,
    shared: &SharedState,
    done: &AtomicBool,
) {
    const EVERY: Duration = Duration::from_secs(1);
    let ops = crate::ops::state();
    let mut last_ok = Instant::now();
    let mut unready = false;
    while !done.load(Ordering::Relaxed) {
        let asked = Instant::now();
        match probe.check(EVERY) {
            Ok(partitions) => {
                let before = shared.partitions.load(Ordering::Relaxed);
                if partitions > before {
                    tracing::info!(
                        topic = shared.request_topic(),
                        before,
                        now = partitions,
                        "the request topic has new partitions"
                    );
                    shared.saw_partitions(partitions);
                }
                last_ok = Instant::now();
                if std::mem::take(&mut unready) {
                    tracing::info!("broker reachable again");
                    ops.set_broker_down(None);
                }
                metrics::gauge!("grflow_broker_reachable").set(1.0);
                // Quiet partitions: the broker vouches for their lag.
                if let Some(e) = probe.confirm_lags(shared, EVERY) {
                    tracing::debug!("a request partition's end went unanswered: {e}");
                }
            }
            Err(e) => {
                metrics::gauge!("grflow_broker_reachable").set(0.0);
                if !unready && unready_after.is_some_and(|after| last_ok.elapsed() >= after) {
                    unready = true;
                    let reason = format!(
                        "broker unreachable for {} s: {e}",
                        last_ok.elapsed().as_secs()
                    );
                    tracing::warn!("{reason}; not ready");
                    ops.set_broker_down(Some(reason));
                }
            }
        }
        if let Some(rest) = EVERY.checked_sub(asked.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// A dataflow that carries a stop from any worker to every worker: each
/// sends `()` on the returned input when its process is signalled, and
/// every worker that receives one sets `stop`.
fn stop_broadcast(
    worker: &mut timely::worker::Worker,
    stop: Arc<AtomicBool>,
) -> timely::dataflow::InputHandle<u64, timely::container::CapacityContainerBuilder<Vec<()>>> {
    use timely::dataflow::operators::Inspect;
    use timely::dataflow::operators::vec::Broadcast;
    let mut input = timely::dataflow::InputHandle::new();
    worker.dataflow::<u64, _, _>(|scope| {
        input
            .to_stream(scope)
            .broadcast()
            .inspect(move |_| stop.store(true, Ordering::Relaxed));
    });
    input
}

/// Carries each process's newest request event time to every process in
/// cluster mode. A worker's clock never trails the newest event time in
/// the job by more than `kafka.max_skew_ms`, and a worker whose partitions
/// are idle releases everything up to it; that newest time was each
/// process's own, so a process that read nothing (it owns no busy
/// partition) held its workers' event time at 1 for the whole job: no
/// window ever closed, and under `arrival` every time in flight stayed
/// held.
struct NewestBroadcast {
    input:
        timely::dataflow::InputHandle<u64, timely::container::CapacityContainerBuilder<Vec<u64>>>,
    sent: u64,
    last: Instant,
}

/// How often a process sends its newest event time when it moved.
const NEWEST_EVERY: Duration = Duration::from_millis(50);

impl NewestBroadcast {
    fn new(worker: &mut timely::worker::Worker, shared: Arc<SharedState>) -> Self {
        use timely::dataflow::operators::Inspect;
        use timely::dataflow::operators::vec::Broadcast;
        let mut input = timely::dataflow::InputHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            input.to_stream(scope).broadcast().inspect(move |&t: &u64| {
                shared
                    .counters
                    .newest_event_ms
                    .fetch_max(t, Ordering::Relaxed);
            });
        });
        Self {
            input,
            sent: 0,
            last: Instant::now(),
        }
    }

    /// Sends this process's newest event time if it moved since the last
    /// send, at most every `NEWEST_EVERY` (one worker per process sends).
    fn share(&mut self, shared: &SharedState) {
        let newest = shared.counters.newest_event_ms.load(Ordering::Relaxed);
        if newest > self.sent && self.last.elapsed() >= NEWEST_EVERY {
            self.input.send(newest);
            self.input.flush();
            self.sent = newest;
            self.last = Instant::now();
        }
    }
}

/// How long a worker with requests in flight (or answers to resend) parks
/// at most between steps: its deadlines, retries and stop checks are due.
const BUSY_PARK: Duration = Duration::from_millis(1);
/// How long a quiet worker parks at most: whatever arrives wakes it sooner,
/// so this bounds only how soon a stop (SIGTERM) is noticed. An idle
/// 2-worker job then costs ~0.025 cores instead of 0.065 (README, Idle cost).
const QUIET_PARK: Duration = Duration::from_millis(100);

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

fn summarise(
    cfg: &Config,
    topo: crate::cluster::Topology,
    settings: &KafkaSettings,
    part: &ProcessPart,
    results: &[WorkerResult],
    wall_s: f64,
) -> ServeSummary {
    let c = &part.counts;
    ServeSummary {
        brokers: settings.brokers.clone(),
        request_topic: cfg.kafka.request_topic.clone(),
        response_topic: cfg.kafka.response_topic.clone(),
        dead_letter_topic: cfg.kafka.dead_letter_topic.clone(),
        workers: topo.total(),
        process: topo.process,
        processes: topo.processes,
        processes_missing: Vec::new(),
        release: cfg.run.serve_release().as_str().to_string(),
        wall_s,
        requests_in: c.consumed,
        responses_out: c.responses,
        errors: c.shed + c.stale + c.unservable + c.dead_lettered,
        throughput_rps: c.responses as f64 / wall_s.max(1e-9),
        shed: c.shed,
        stale: c.stale,
        skipped_offsets: c.skipped_offsets,
        log_resets: c.log_resets,
        recovered_unshed: c.recovered_unshed,
        unservable: c.unservable,
        dead_lettered: c.dead_lettered,
        duplicates_skipped: c.duplicates,
        repeated_req_ids: c.repeated_req_ids,
        already_answered: c.already_answered,
        late: c.late,
        clamped_ts: c.clamped_ts,
        delivered: c.delivered,
        resent: c.resent,
        produce_failures: c.produce_failures,
        undeliverable: c.undeliverable,
        commit_failures: c.commit_failures,
        read_errors: c.read_errors,
        drain_timed_out: part.drain_timed_out,
        windows_lost: part.windows_lost,
        pauses: c.pauses,
        oov_items: results.iter().map(|r| r.oov_items).sum(),
        // Counted by the nodes, once per request served: one cut at decode
        // and again by a node still on a shorter model is one request.
        truncated_histories: results.iter().map(|r| r.truncated_histories).sum(),
        unknown_user_histories: results.iter().map(|r| r.unknown_user_histories).sum(),
        in_flight_at_exit: part.in_flight,
        latency_ms: crate::summary::LatencySummary::from_histogram(&part.latency),
        by_mode: part.by_mode.summaries(&cfg.run.slo_ms),
        lag: part.lag.clone(),
        committed: results
            .iter()
            .flat_map(|r| r.committed.iter().copied())
            .collect(),
        // The lowest node's; nodes on different models are warned about.
        model_version: crate::models::version_at_exit(
            results.iter().map(|r| (r.worker, r.model_version.as_str())),
        ),
        alpha_at_exit: results.iter().map(|r| (r.worker, r.alpha)).collect(),
        refill: results.iter().map(|r| (r.worker, r.refill)).collect(),
        allocator: cfg.allocator.moves().then(|| {
            let mut stats = AllocatorStats::default();
            for r in results {
                stats.merge(&r.allocator);
            }
            stats.summary(cfg.allocator.policy)
        }),
    }
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
    failure: crate::worker_failure::WorkerFailure,
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
    fn replay_and_training_settings_are_refused_by_name() {
        assert_eq!(check_servable(&Config::default()), Ok(()));
        let mut cfg = Config::default();
        cfg.run.clock = crate::config::Clock::Virtual;
        let e = check_servable(&cfg).unwrap_err();
        assert!(e.contains("run.clock"), "{e}");
        let mut cfg = Config::default();
        cfg.allocator.sample = true;
        let e = check_servable(&cfg).unwrap_err();
        assert!(e.contains("allocator.sample"), "{e}");
        let mut cfg = Config::default();
        cfg.batch.max_wait_ms = cfg.kafka.deadline_ms as f64;
        let e = check_servable(&cfg).unwrap_err();
        assert!(
            e.contains("batch.max_wait_ms") && e.contains("kafka.deadline_ms"),
            "{e}"
        );
    }

    #[test]
    fn processes_whose_parts_did_not_arrive_are_named() {
        let topo = crate::cluster::Topology {
            processes: 3,
            process: 0,
            threads: 2,
        };
        // Every worker's result from processes 0 and 2, process 1's one
        // worker without its process's part: process 1 is missing.
        let results: Vec<WorkerResult> = [(0, true), (1, false), (3, false), (4, true), (5, false)]
            .into_iter()
            .map(|(worker, part)| WorkerResult {
                worker,
                process_part: part.then(ProcessPart::default),
                ..WorkerResult::default()
            })
            .collect();
        assert_eq!(missing_processes(topo, &results), vec![1]);
        assert!(missing_processes(topo, &[]).len() == 3);
    }

    #[test]
    fn a_worker_keeps_only_the_answers_it_can_still_meet() {
        let answer = |partition, offset| AnsweredRequest {
            source: grflow_connectors::kafka::RecordId { partition, offset },
            req_id: offset as u64,
        };
        let answered: HashSet<AnsweredRequest> = [
            answer(0, 3),  // below where partition 0 resumes
            answer(0, 10), // at it
            answer(0, 12),
            answer(1, 0),  // partition 1's log is gone
            answer(2, 50), // not this worker's partition
        ]
        .into();
        let resumed = |partition, offset, past_end| Resumed {
            partition,
            offset,
            from_commit: true,
            past_end,
            commit_start: false,
            refetches_below: false,
        };
        let mine = answers_ahead(&answered, &[resumed(0, 10, None), resumed(1, 0, Some(900))]);
        assert_eq!(mine, [answer(0, 10), answer(0, 12)].into());
    }
}
