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

mod broadcast;
mod broker_watch;
pub mod check;
pub mod histogram;
mod results;
pub mod summary;
mod worker;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{
    AnsweredRequest, BrokerProbe, KafkaClientError, KafkaSettings, OutputProducer, Refetch,
    RequestConsumer, Resumed, ServedLimits, SharedState, SourceSettings, StartPosition,
    ensure_topics, owned_partitions, partition_count, scan_answers,
};
use grflow_connectors::parquet::load_side_tables;
use grflow_operators::node::{NodeCommand, ServingNode};

use crate::cluster::{ClusterError, Topology};
use crate::config::Config;
use crate::events::{NodeControl, Target};
use crate::job::{Job, JobError};
use crate::models::ModelRegistry;
use crate::params::{ParamsError, node_params};
use crate::serving_setup::ServingSetup;
use crate::side::SideTables;
use crate::window_log::WindowLog;
pub use check::CheckReport;
use summary::AnswerLatency;
pub use summary::ServeSummary;
use worker::{Ingest, WorkerContext};

/// Timeout of blocking metadata, commit and watermark calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

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
    let job = Job::prepare(cfg.clone(), side_tables(&cfg)?)?;
    let topo = job.topology();
    let setup = ServingSetup::of(&job);
    // Every node starts with the same parameters, hence the same history
    // limits; a node that takes another model adds its limits to what the
    // sources cut with (through `models`, see `ServedLimits`).
    let history_limits = setup
        .nodes()
        .with_first(ServingNode::history_limits)
        .ok_or_else(|| ServeError::Config("run.workers must be >= 1".into()))?;
    let served_history = ServedLimits::new(history_limits);
    let (partitions, answered) = prepare_topics(&settings, &k)?;

    let models = model_registry(&cfg, &setup, served_history.clone());
    for n in topo.local_workers() {
        models.note_serving(n as u32, &job.model_version);
    }
    let (inboxes, submit) = control_inboxes(topo.threads);
    let watch_models_done = Arc::new(AtomicBool::new(false));
    let model_watch = opts.model_watch.as_ref().map(|path| {
        crate::models::watch(
            path.clone(),
            job.model_version.clone(),
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

    let shared = Arc::new(SharedState::new(&k.request_topic, topo.total()));
    shared.saw_partitions(partitions);
    let latency = Arc::new(AnswerLatency::new(cfg.run.slo_ms));
    let delivery_state = shared.clone();
    let producer = Arc::new(OutputProducer::new(
        &settings,
        Arc::new(move |d| delivery_state.on_delivery(d)),
    )?);
    // Consumers are opened here so that a broker or topic problem fails
    // before any worker starts.
    let ingests = open_ingests(
        &settings,
        &cfg,
        topo,
        partitions,
        &shared,
        &served_history,
        answered,
    )?;
    // Opened before the job starts, so an unwritable path fails at once.
    let window_log = Arc::new(Mutex::new(
        WindowLog::open(&cfg.windows.out).map_err(ServeError::Config)?,
    ));
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
        std::thread::spawn(move || broker_watch::watch_broker(probe, unready_after, &shared, &done))
    };

    // The dataflow's start (after the model load, the restart scan and the
    // cluster's connections), as in replay: wall_s and throughput measure
    // serving, not setup.
    let started: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let failure = crate::worker_failure::WorkerFailure::default();
    let ctx = WorkerContext {
        setup,
        topo,
        shared: shared.clone(),
        failure: failure.clone(),
        latency: latency.clone(),
        producer,
        models,
        started: started.clone(),
        inboxes,
        ingests: Mutex::new(ingests),
        window_log: window_log.clone(),
        job_stop: Arc::new(AtomicBool::new(false)),
        signalled: stop.clone(),
        local_done: Barrier::new(topo.threads),
    };
    let guards = job
        .cluster
        .execute(move |worker| worker::run(worker, &ctx), Some(stop))
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
    let made = results::Made {
        cfg: &cfg,
        topo,
        settings: &settings,
        shared: &shared,
        latency: &latency,
        windows_lost: window_log.lock().expect("window log lock").lost(),
        wall_s: started.get().map_or(0.0, |t| t.elapsed().as_secs_f64()),
    };
    Ok(results::summary(made, results))
}

/// Creates the topics when `kafka.create_partitions` asks, checks the
/// dead-letter topic, and scans the response topic for requests already
/// answered (a restart skips them): the request topic's partition count
/// and those answers.
fn prepare_topics(
    settings: &KafkaSettings,
    k: &crate::config::KafkaSection,
) -> Result<(i32, HashSet<AnsweredRequest>), ServeError> {
    if k.create_partitions > 0 {
        ensure_topics(
            settings,
            &[
                (k.request_topic.as_str(), k.create_partitions),
                (k.response_topic.as_str(), k.create_partitions),
                (k.dead_letter_topic.as_str(), 1),
            ],
            k.replication_factor,
            CALL_TIMEOUT,
        )?;
    }
    let partitions = partition_count(settings, &k.request_topic, CALL_TIMEOUT)?;
    check_dead_letter_topic(settings, &k.dead_letter_topic)?;
    let answered = scan_answers(
        settings,
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
    Ok((partitions, answered))
}

/// Models the admin endpoint or the model watch may swap to, checked
/// against this job's catalog.
fn model_registry(
    cfg: &Config,
    setup: &ServingSetup,
    served_history: ServedLimits,
) -> Arc<ModelRegistry> {
    let cfg = cfg.clone();
    let side = setup.side.clone();
    Arc::new(
        ModelRegistry::new(Box::new(move |path: &str| {
            let mut c = cfg.clone();
            c.model.weights = Some(path.into());
            node_params(&c, &side.meta, &side.catalog()).map_err(|e| e.to_string())
        }))
        .with_history(served_history),
    )
}

/// A local worker's commands for its node (admin endpoint, model watch).
pub(super) type Inbox = Arc<Mutex<VecDeque<NodeControl>>>;

/// One inbox per local worker, and how commands for every node of the job
/// (from the admin endpoint or the model watch) reach them: through the
/// first local worker's inbox, addressed to all.
fn control_inboxes(threads: usize) -> (Vec<Inbox>, crate::admin::Submit) {
    let inboxes: Vec<Inbox> = (0..threads).map(|_| Arc::default()).collect();
    let inbox = inboxes[0].clone();
    let seq = AtomicU64::new(0);
    let submit: crate::admin::Submit = Arc::new(move |command: NodeCommand| {
        inbox.lock().expect("inbox lock").push_back(NodeControl {
            target: Target::All,
            seq: seq.fetch_add(1, Ordering::Relaxed),
            command,
        });
    });
    (inboxes, submit)
}

/// Opens each local worker's request consumer on its share of the
/// partitions, registers where each partition resumes in the worker's
/// offset book, and hands it the restart scan's answers it may meet.
fn open_ingests(
    settings: &KafkaSettings,
    cfg: &Config,
    topo: Topology,
    partitions: i32,
    shared: &SharedState,
    served_history: &ServedLimits,
    answered: HashSet<AnsweredRequest>,
) -> Result<Vec<Option<Ingest>>, ServeError> {
    let k = &cfg.kafka;
    let mut ingests = Vec::with_capacity(topo.threads);
    for w in topo.local_workers() {
        let (consumer, resumed) = open_request_consumer(settings, k, partitions, w, topo.total())?;
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
        ingests.push(Some(Ingest {
            answered: answers_ahead(&answered, &resumed),
            consumer,
            settings: SourceSettings {
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
            },
        }));
    }
    // Each worker holds its share; the whole scan is dropped here.
    Ok(ingests)
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
    fn commands_for_the_job_reach_the_first_inbox_addressed_to_all_in_order() {
        let (inboxes, submit) = control_inboxes(3);
        assert_eq!(inboxes.len(), 3);
        submit(NodeCommand::SetAlpha(0.3));
        submit(NodeCommand::PinAlpha(None));
        let first: Vec<NodeControl> = inboxes[0].lock().unwrap().drain(..).collect();
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|c| c.target == Target::All));
        assert_eq!((first[0].seq, first[1].seq), (0, 1));
        assert!(matches!(first[0].command, NodeCommand::SetAlpha(a) if a == 0.3));
        assert!(inboxes[1..].iter().all(|i| i.lock().unwrap().is_empty()));
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
