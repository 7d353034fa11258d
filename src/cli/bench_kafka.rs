//! `grflow bench kafka`: one trace served twice in one run, at the same
//! offered rate: through a Kafka broker (`grflow serve` in-process, a paced
//! producer, the response topic read back) and replayed from Parquet.
//! Reports throughput and p99 latency of both and their ratios.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use grflow_connectors::kafka::{
    KafkaClientError, KafkaSettings, OutputProducer, RecordId, Refetch, RequestConsumer, SendError,
    StartPosition, WireResponse, delete_topics, ensure_topics,
};
use grflow_kernels::bench::gemm_peak_gflops;
use grflow_kernels::cost::machine_name;
use grflow_pipeline::{Config, ReplayOptions, ServeError, ServeOptions, ServeSummary, TraceInput};
use grflow_traces::{Mode, Regime, WriteOptions, generate, write_trace};
use serde::Serialize;

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Broker address; default GRFLOW_KAFKA_BROKERS, else 127.0.0.1:19092.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Requests in the trace.
    #[arg(long, default_value_t = 6000)]
    pub requests: u64,
    /// Offered load, requests per second (steady arrivals, paced in wall time).
    #[arg(long, default_value_t = 300.0)]
    pub rps: f64,
    /// Timely workers (= serving nodes) of both runs.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Partitions of the request and response topics.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Extra librdkafka property of the served job, KEY=VALUE (repeatable),
    /// e.g. fetch.wait.max.ms=20.
    #[arg(long = "librdkafka", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub librdkafka: Vec<(String, String)>,
    /// Pairs of runs (Kafka, then Parquet) one after the other. With more
    /// than one, the report lists every pair and gives the medians of
    /// their ratios (the serving-core target reads the median of 3).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// KEY=VALUE, refused as `serve` refuses it in `kafka.librdkafka`: the
/// bench measures the job `serve` would run, so never one with a property
/// its delivery guarantee forbids (merged after the config's check).
fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => {
            let (k, v) = (k.trim().to_string(), v.trim().to_string());
            match grflow_connectors::kafka::refused_property(&k, &v) {
                Some(why) => Err(format!("{k}={v} refused: {why}")),
                None => Ok((k, v)),
            }
        }
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

#[derive(Clone, Debug, Serialize)]
struct KafkaBench {
    requests: u64,
    offered_rps: f64,
    /// Successful responses per second on each side (error records are
    /// not throughput; they are counted apart below): first request to
    /// last answer through Kafka, the replay's wall time from Parquet.
    kafka_rps: f64,
    parquet_rps: f64,
    /// kafka_rps / parquet_rps.
    throughput_ratio: f64,
    /// Consumption to hand-off to the producer (what the job adds): the
    /// served answers' own `latency_ms`, over the `requests` answers read
    /// back (not the warm-up requests'), exact.
    kafka_p99_ms: f64,
    /// Parquet replay: each request's due time (its event time at the
    /// offered rate) to its response, over the `requests`, exact.
    parquet_p99_ms: f64,
    /// kafka_p99_ms / parquet_p99_ms.
    p99_ratio: f64,
    /// Produce call to the response read back from the broker (served
    /// answers, warm-ups excluded).
    kafka_end_to_end_p99_ms: f64,
    /// Requests answered with an error record (shed, stale, unservable)
    /// through Kafka and in the Parquet replay: none of the latencies
    /// above count them.
    kafka_errors: u64,
    parquet_errors: u64,
    workers: usize,
    partitions: i32,
    brokers: String,
    /// The --librdkafka properties the served job ran with.
    librdkafka: std::collections::BTreeMap<String, String>,
    /// The machine the bench ran on and its GEMM rate (GFLOP/s, one core),
    /// measured after both runs: the latencies and rates above are its.
    machine: String,
    gemm_gflops: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !(args.rps.is_finite() && args.rps > 0.0)
        || args.requests == 0
        || args.workers == 0
        || args.partitions <= 0
    {
        return Err(InputError::from_display(
            "--rps (finite), --requests, --workers and --partitions must be > 0",
        ));
    }
    if !(1..=MAX_RUNS).contains(&args.runs) {
        return Err(InputError::from_display(format!(
            "--runs must be in 1..={MAX_RUNS} (got {})",
            args.runs
        )));
    }
    super::check_count("--workers", args.workers, super::MAX_THREADS)?;
    let brokers = args
        .brokers
        .clone()
        .or_else(|| std::env::var("GRFLOW_KAFKA_BROKERS").ok())
        .unwrap_or_else(|| "127.0.0.1:19092".into());
    let mut config = Config::embedded();
    config.run.workers = args.workers;
    config.run.speed = "1x".into();
    config.trace.regime = "steady".into();
    config.trace.requests = args.requests;
    config.trace.rps = args.rps;
    let gen_cfg = config
        .trace
        .gen_config()
        .map_err(InputError::from_display)?;
    let trace = generate(&gen_cfg);
    debug_assert_eq!(gen_cfg.regime, Regime::Steady);

    let dir = std::env::temp_dir().join(format!("grflow-bench-kafka-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_trace(&dir, &trace, &WriteOptions::default()).context("writing the bench trace")?;
    let mut runs = Vec::with_capacity(args.runs);
    for i in 0..args.runs {
        if args.runs > 1 {
            eprintln!("run {} of {}", i + 1, args.runs);
        }
        let result = run_both(&args, &brokers, config.clone(), &trace, dir.clone());
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let run = result?;
        if args.runs > 1 {
            eprintln!(
                "run {}: p99 ratio {:.3} (Kafka {:.2} ms, Parquet {:.2} ms), throughput ratio {:.3}",
                i + 1,
                run.p99_ratio,
                run.kafka_p99_ms,
                run.parquet_p99_ms,
                run.throughput_ratio
            );
        }
        runs.push(run);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let report = match runs.as_slice() {
        [one] => serde_json::to_value(one)?,
        _ => serde_json::to_value(Repeated::of(runs))?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for (k, v) in report.as_object().context("object")? {
            println!("{k:<26} {v}");
        }
    }
    Ok(())
}

/// The most pairs one bench runs (each takes about twice the trace's time).
const MAX_RUNS: usize = 100;

/// `--runs` N > 1: every pair, and the medians of their figures.
#[derive(Debug, Serialize)]
struct Repeated {
    median_p99_ratio: f64,
    median_throughput_ratio: f64,
    median_kafka_p99_ms: f64,
    median_parquet_p99_ms: f64,
    runs: Vec<KafkaBench>,
}

impl Repeated {
    fn of(runs: Vec<KafkaBench>) -> Self {
        let median = |f: fn(&KafkaBench) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        };
        Self {
            median_p99_ratio: median(|r| r.p99_ratio),
            median_throughput_ratio: median(|r| r.throughput_ratio),
            median_kafka_p99_ms: median(|r| r.kafka_p99_ms),
            median_parquet_p99_ms: median(|r| r.parquet_p99_ms),
            runs,
        }
    }
}

fn run_both(
    args: &Args,
    brokers: &str,
    config: Config,
    trace: &grflow_traces::Trace,
    dir: PathBuf,
) -> anyhow::Result<KafkaBench> {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let base = format!("grflow-bench-{nonce}");
    let serve_cfg = serve_config(&config, args, brokers, &base, &dir);
    let settings = KafkaSettings {
        brokers: brokers.to_string(),
        group_id: format!("{base}.bench"),
        client_id: "grflow-bench".into(),
        ..KafkaSettings::default()
    };
    // Made first, so that it drops last: after the serve job is stopped
    // and joined below.
    let mut topics = create_topics(&settings, &serve_cfg, args.partitions)?;
    // The topics exist: the broker answers, so the Parquet half is not
    // spent on a run that cannot finish. Parquet first: it warms nothing
    // the Kafka run uses.
    eprintln!(
        "replaying {} requests from Parquet at {} rps...",
        args.requests, args.rps
    );
    let parquet = replay_parquet(config, dir)?;
    eprintln!("serving the same trace through Kafka at {brokers}...");
    let offered = serve_kafka(args, serve_cfg, &settings, trace, &mut topics)?;
    let c = compare(offered, parquet.side)?;
    Ok(KafkaBench {
        requests: args.requests,
        offered_rps: args.rps,
        kafka_rps: c.kafka_rps,
        parquet_rps: c.parquet_rps,
        throughput_ratio: c.kafka_rps / c.parquet_rps,
        kafka_p99_ms: c.kafka_p99_ms,
        parquet_p99_ms: parquet.p99_ms,
        p99_ratio: c.kafka_p99_ms / parquet.p99_ms,
        kafka_end_to_end_p99_ms: c.kafka_end_to_end_p99_ms,
        kafka_errors: c.kafka_errors,
        parquet_errors: parquet.errors,
        workers: args.workers,
        partitions: args.partitions,
        brokers: brokers.to_string(),
        librdkafka: args.librdkafka.iter().cloned().collect(),
        machine: machine_name(),
        // After both runs, so that it disturbs neither.
        gemm_gflops: gemm_peak_gflops(),
    })
}

/// The serve job's config: the bench's config on fresh topics named after
/// `base`, the trace in `dir` as its catalog.
fn serve_config(config: &Config, args: &Args, brokers: &str, base: &str, dir: &Path) -> Config {
    let mut serve_cfg = config.clone();
    let k = &mut serve_cfg.kafka;
    k.brokers = brokers.to_string();
    k.request_topic = format!("{base}.requests");
    k.response_topic = format!("{base}.responses");
    k.dead_letter_topic = format!("{base}.dead-letters");
    k.group_id = format!("{base}.group");
    k.catalog = dir.display().to_string();
    k.create_partitions = 0;
    // tansu 0.6 (what ./scripts/test.sh runs) cannot fetch from inside a
    // record batch; on Apache Kafka this costs nothing here (fresh topics,
    // no committed offsets to resume from).
    k.refetch_from_start = true;
    k.deadline_ms = 60_000;
    k.librdkafka.extend(args.librdkafka.iter().cloned());
    serve_cfg
}

/// Creates the request, response and dead-letter topics of `serve_cfg`.
/// They hold the bench's records: the returned guard deletes them however
/// the run ends, and those of a creation that failed part way too.
fn create_topics(
    settings: &KafkaSettings,
    serve_cfg: &Config,
    partitions: i32,
) -> anyhow::Result<BenchTopics> {
    let k = &serve_cfg.kafka;
    let mut topics = BenchTopics {
        settings: settings.clone(),
        topics: vec![
            k.request_topic.clone(),
            k.response_topic.clone(),
            k.dead_letter_topic.clone(),
        ],
        held: Held::Part,
    };
    let created = ensure_topics(
        settings,
        &[
            (k.request_topic.as_str(), partitions),
            (k.response_topic.as_str(), partitions),
            (k.dead_letter_topic.as_str(), 1),
        ],
        k.replication_factor,
        Duration::from_secs(10),
    );
    topics.held = match &created {
        Ok(()) => Held::All,
        // The broker refused one: those before it may exist.
        Err(KafkaClientError::CreateTopic { .. }) => Held::Part,
        // No broker answered (or none was asked): nothing to delete, and a
        // deletion would wait as long again.
        Err(_) => Held::Nothing,
    };
    created.with_context(|| format!("bench kafka: creating its topics on {}", k.brokers))?;
    Ok(topics)
}

/// The Parquet half's figures.
struct Replayed {
    side: Side,
    p99_ms: f64,
    errors: u64,
}

/// Replays the trace in `dir` at the config's pace, with exact
/// percentiles, as the Kafka side's are (the summary's are the upper
/// edges of 1%-wide histogram buckets).
fn replay_parquet(config: Config, dir: PathBuf) -> anyhow::Result<Replayed> {
    let mut replayed = grflow_pipeline::replay(ReplayOptions {
        trace: TraceInput::Parquet(dir),
        config,
        show_progress: false,
        responses: grflow_pipeline::replay::ResponseOutput::Collect,
        counters: None,
        commands: Vec::new(),
        oracle_step: None,
        stop: None,
    })
    .context("Parquet replay")?;
    replayed.exact_latency();
    let summary = &replayed.summary;
    Ok(Replayed {
        side: Side {
            responses: summary.responses_out,
            wall_s: summary.wall_s,
        },
        p99_ms: (summary.latency_ms.as_ref())
            .context("the Parquet replay answered no request: no p99 to compare")?
            .p99,
        errors: summary.errors,
    })
}

/// Runs `serve_cfg` in-process, offers the trace to it and reads the
/// answers back; however that ends (an error, a timeout), the job stops
/// and is joined before its topics are deleted, and a job that does not
/// stop keeps them (`Held::InUse`).
fn serve_kafka(
    args: &Args,
    serve_cfg: Config,
    settings: &KafkaSettings,
    trace: &grflow_traces::Trace,
    topics: &mut BenchTopics,
) -> anyhow::Result<Offered> {
    let k = &serve_cfg.kafka;
    let topic_names = (k.request_topic.clone(), k.response_topic.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let serve_stop = stop.clone();
    let job = std::thread::spawn(move || {
        grflow_pipeline::serve(ServeOptions::new(serve_cfg), serve_stop)
    });
    let offered = offer(args, settings, trace, &topic_names, &job);
    stop.store(true, Ordering::Relaxed);
    let served = match join_within(job, JOB_STOP_WAIT) {
        Ok(Ok(summary)) => Ok(summary),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context("the serve job")),
        Err(JoinFailed::Panicked) => Err(anyhow::anyhow!("the serve thread panicked")),
        Err(JoinFailed::Running) => {
            // Deleted under a running job, they could be created again.
            topics.held = Held::InUse;
            Err(anyhow::anyhow!(
                "the serve job did not stop within {} s of being asked",
                JOB_STOP_WAIT.as_secs()
            ))
        }
    };
    match (offered, served) {
        (Ok(m), Ok(_)) => Ok(m),
        (Err(e), Ok(_)) => Err(e),
        (Ok(_), Err(j)) => Err(j),
        (Err(e), Err(j)) => Err(anyhow::anyhow!("{e:#} ({j:#})")),
    }
}

/// How long the bench waits for the serve job to stop once asked.
const JOB_STOP_WAIT: Duration = Duration::from_secs(30);

/// What the Kafka half measured of the trace's requests (the warm-ups
/// left out).
struct Offered {
    /// First request offered to last answer read back, seconds.
    wall_s: f64,
    /// The served answers' own `latency_ms`: consumption to hand-off to
    /// the producer, inside the job.
    job_ms: Vec<f64>,
    /// The served answers' produce call to answer read back, ms.
    end_to_end_ms: Vec<f64>,
    /// Answers that were error records (no latency to rank).
    errors: u64,
}

/// The serve job ended while the bench still offered or waited.
fn ended_early() -> anyhow::Error {
    anyhow::anyhow!("the serve job ended before the bench was done")
}

/// Offers load only once the job answers on every partition: a fixed
/// sleep was sometimes shorter than the consumer group's join, and the
/// requests produced meanwhile arrived as one burst whose queue set the
/// whole run's p99 (the first 5 s window had p99 88 ms, later ones 4-5).
/// One request per partition, `req_ids` from `total` on (in none of the
/// figures), made by `body`; waits up to 120 s for their answers.
fn warm_up_partitions(
    partitions: i32,
    total: usize,
    producer: &OutputProducer,
    tail: &RequestConsumer,
    request_topic: &str,
    body: impl Fn(u64) -> serde_json::Result<Vec<u8>>,
    job: &std::thread::JoinHandle<Result<ServeSummary, ServeError>>,
) -> anyhow::Result<()> {
    for p in 0..partitions {
        let id = RecordId {
            partition: p,
            offset: -1 - p as i64,
        };
        producer.send_to(request_topic, p, &body((total + p as usize) as u64)?, id)?;
    }
    let ready_by = Instant::now() + Duration::from_secs(120);
    let mut warm = HashSet::new();
    while warm.len() < partitions as usize {
        if job.is_finished() {
            return Err(ended_early());
        }
        if Instant::now() > ready_by {
            bail!(
                "the job answered {} of {partitions} warm-up requests in 120 s",
                warm.len()
            );
        }
        while let Some(record) = tail.poll(Duration::from_millis(10)) {
            let answer = read_answer(record?.payload)?;
            if answer.req_id >= total as u64 {
                warm.insert(answer.req_id);
            }
        }
    }
    Ok(())
}

/// Warms the job up (one request per partition, answered), then offers
/// the trace's requests at their due times and reads the answers back
/// until every request is answered.
fn offer(
    args: &Args,
    settings: &KafkaSettings,
    trace: &grflow_traces::Trace,
    (request_topic, response_topic): &(String, String),
    job: &std::thread::JoinHandle<Result<ServeSummary, ServeError>>,
) -> anyhow::Result<Offered> {
    let timeout = Duration::from_secs(10);
    let all: Vec<i32> = (0..args.partitions).collect();
    let (tail, _) = RequestConsumer::open(
        settings,
        response_topic,
        &all,
        StartPosition::Earliest,
        Refetch::FromCommitted,
        timeout,
    )?;
    let producer = OutputProducer::new(settings, Arc::new(|_| {}))?;
    let origin = trace.requests.first().map_or(0, |r| r.ts_ms);
    let total = trace.requests.len();
    let request_body = |req_id: u64, r: &grflow_traces::Request| {
        serde_json::to_vec(&serde_json::json!({
            "req_id": req_id, "user_id": r.user_id, "ts_ms": r.ts_ms,
            "candidates": r.candidates, "hist_len": r.hist_len,
            "mode": match r.mode { Mode::Rank => "rank", Mode::Retrieve => "retrieve" },
        }))
    };
    if let Some(first) = trace.requests.first() {
        eprintln!("waiting for the job to answer on every partition...");
        let warm_up = |req_id| request_body(req_id, first);
        warm_up_partitions(
            args.partitions,
            total,
            &producer,
            &tail,
            request_topic,
            warm_up,
            job,
        )?;
    }
    let started = Instant::now();
    let mut sent_at = vec![Duration::ZERO; total];
    let mut answered = HashSet::new();
    let mut m = Offered {
        wall_s: 0.0,
        job_ms: Vec::with_capacity(total),
        end_to_end_ms: Vec::with_capacity(total),
        errors: 0,
    };
    let mut last_answer = started;
    let mut next = 0;
    let deadline = Duration::from_secs_f64(args.requests as f64 / args.rps * 3.0 + 120.0);
    while answered.len() < total {
        if job.is_finished() {
            return Err(ended_early());
        }
        if started.elapsed() > deadline {
            bail!(
                "only {} of {total} answered after {:.0} s",
                answered.len(),
                deadline.as_secs_f64()
            );
        }
        // Offer every request that is due.
        while next < total {
            let r = &trace.requests[next];
            let due = Duration::from_secs_f64((r.ts_ms - origin) as f64 / 1000.0);
            if started.elapsed() < due {
                break;
            }
            let payload = request_body(next as u64, r)?;
            let partition = (next % args.partitions as usize) as i32;
            let id = RecordId {
                partition,
                offset: next as i64,
            };
            match producer.send_to(request_topic, partition, &payload, id) {
                Ok(()) => {
                    sent_at[next] = started.elapsed();
                    next += 1;
                }
                Err(SendError::QueueFull) => break,
                Err(e) => return Err(e.into()),
            }
        }
        // Read back what was answered: the first answer to each of the
        // trace's requests (not a warm-up's, not a repeat).
        while let Some(record) = tail.poll(Duration::from_millis(1)) {
            let answer = read_answer(record?.payload)?;
            let req = answer.req_id as usize;
            if req < total && answered.insert(req) {
                // As the job's summary: an error record is no latency.
                match answer.error {
                    Some(_) => m.errors += 1,
                    None => {
                        m.end_to_end_ms
                            .push((started.elapsed() - sent_at[req]).as_secs_f64() * 1e3);
                        m.job_ms.push(answer.latency_ms);
                    }
                }
                last_answer = Instant::now();
            }
        }
    }
    m.wall_s = last_answer.duration_since(started).as_secs_f64();
    Ok(m)
}

fn read_answer(payload: Option<Vec<u8>>) -> anyhow::Result<WireResponse> {
    serde_json::from_slice(&payload.unwrap_or_default())
        .context("an answer on the response topic that is not a response record")
}

/// Successful responses of one side and the wall time they took.
#[derive(Clone, Copy, Debug)]
struct Side {
    responses: u64,
    wall_s: f64,
}

impl Side {
    fn rps(self) -> f64 {
        self.responses as f64 / self.wall_s
    }
}

/// The Kafka side's figures, counted as the Parquet side's are.
#[derive(Debug)]
struct Compared {
    kafka_rps: f64,
    parquet_rps: f64,
    kafka_p99_ms: f64,
    kafka_end_to_end_p99_ms: f64,
    kafka_errors: u64,
}

/// Both rates count successful responses only (Parquet's `responses_out`
/// leaves error records out, so the Kafka side does too); with none
/// through Kafka there is no p99 to compare, as with none from Parquet.
fn compare(m: Offered, parquet: Side) -> anyhow::Result<Compared> {
    if m.job_ms.is_empty() {
        bail!(
            "every answer through Kafka was an error record ({}): no p99 to compare",
            m.errors
        );
    }
    let kafka = Side {
        responses: m.job_ms.len() as u64,
        wall_s: m.wall_s,
    };
    Ok(Compared {
        kafka_rps: kafka.rps(),
        parquet_rps: parquet.rps(),
        kafka_p99_ms: p99(m.job_ms),
        kafka_end_to_end_p99_ms: p99(m.end_to_end_ms),
        kafka_errors: m.errors,
    })
}

/// The nearest-rank p99 of a list the caller checked is not empty.
fn p99(latencies: Vec<f64>) -> f64 {
    grflow_pipeline::summary::LatencySummary::from_unsorted(latencies).p99
}

enum JoinFailed {
    Panicked,
    /// Still running when the wait ran out (left detached).
    Running,
}

/// Joins `thread` if it ends within `wait`.
fn join_within<T>(thread: std::thread::JoinHandle<T>, wait: Duration) -> Result<T, JoinFailed> {
    let until = Instant::now() + wait;
    while !thread.is_finished() {
        if Instant::now() >= until {
            return Err(JoinFailed::Running);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    thread.join().map_err(|_| JoinFailed::Panicked)
}

/// Deletes the bench's topics when dropped; a broker that refuses (or
/// cannot delete topics) gets a note naming them.
struct BenchTopics {
    settings: KafkaSettings,
    topics: Vec<String>,
    held: Held,
}

/// Which of its topics the bench holds on the broker.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Held {
    /// Every one: deleted.
    All,
    /// Perhaps some (their creation failed part way): deleted, and a
    /// refusal may be about one never created.
    Part,
    /// None: the broker was not reached.
    Nothing,
    /// Every one, and a serve job that did not stop still uses them: left
    /// (and named), since a deleted topic could be created again by it.
    InUse,
}

impl Drop for BenchTopics {
    fn drop(&mut self) {
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        let after = match self.held {
            Held::Nothing => return,
            Held::InUse => {
                eprintln!(
                    "note: the bench's topics {} were not deleted: the serve job was still running",
                    names.join(", ")
                );
                return;
            }
            Held::All => "",
            Held::Part => " (their creation failed part way: some may not exist)",
        };
        if let Err(e) = delete_topics(&self.settings, &names, Duration::from_secs(5)) {
            eprintln!(
                "note: the bench's topics {} were not deleted{after}: {e}",
                names.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KafkaBench, Offered, Repeated, Side, compare, parse_property};

    fn pair(kafka_p99_ms: f64, parquet_p99_ms: f64, throughput_ratio: f64) -> KafkaBench {
        KafkaBench {
            requests: 100,
            offered_rps: 100.0,
            kafka_rps: 99.0,
            parquet_rps: 99.0,
            throughput_ratio,
            kafka_p99_ms,
            parquet_p99_ms,
            p99_ratio: kafka_p99_ms / parquet_p99_ms,
            kafka_end_to_end_p99_ms: kafka_p99_ms + 30.0,
            kafka_errors: 0,
            parquet_errors: 0,
            workers: 2,
            partitions: 4,
            brokers: "127.0.0.1:19092".into(),
            librdkafka: Default::default(),
            machine: "test".into(),
            gemm_gflops: 100.0,
        }
    }

    #[test]
    fn repeated_runs_report_the_median_of_each_figure() {
        // Each figure's median, not the figures of the median run.
        let three = Repeated::of(vec![
            pair(4.0, 2.0, 0.999),
            pair(9.0, 3.0, 0.997),
            pair(5.0, 4.0, 0.998),
        ]);
        assert_eq!(three.median_p99_ratio, 2.0);
        assert_eq!(three.median_kafka_p99_ms, 5.0);
        assert_eq!(three.median_parquet_p99_ms, 3.0);
        assert_eq!(three.median_throughput_ratio, 0.998);
        assert_eq!(three.runs.len(), 3);
        // An even count takes the mean of the middle two.
        let two = Repeated::of(vec![pair(4.0, 2.0, 1.0), pair(9.0, 3.0, 1.0)]);
        assert_eq!(two.median_kafka_p99_ms, 6.5);
        assert_eq!(two.median_p99_ratio, 2.5);
    }

    fn offered(job_ms: Vec<f64>, errors: u64) -> Offered {
        Offered {
            wall_s: 2.0,
            end_to_end_ms: job_ms.iter().map(|l| l + 10.0).collect(),
            job_ms,
            errors,
        }
    }

    #[test]
    fn both_rates_count_successful_responses_only() {
        // 6 requests through Kafka, 2 answered with an error record; the
        // Parquet side served 4 of its 6 as well, in the same time.
        let parquet = Side {
            responses: 4,
            wall_s: 2.0,
        };
        let c = compare(offered(vec![1.0, 2.0, 3.0, 4.0], 2), parquet).unwrap();
        assert_eq!((c.kafka_rps, c.parquet_rps), (2.0, 2.0));
        assert_eq!(c.kafka_errors, 2);
        assert_eq!(c.kafka_p99_ms, 4.0);
        assert_eq!(c.kafka_end_to_end_p99_ms, 14.0);
    }

    #[test]
    fn only_error_records_through_kafka_is_an_error_not_a_zero_p99() {
        let parquet = Side {
            responses: 4,
            wall_s: 2.0,
        };
        let e = compare(offered(Vec::new(), 6), parquet).unwrap_err();
        assert!(e.to_string().contains("error record"), "{e}");
    }

    #[test]
    fn a_property_serve_refuses_is_refused_here_too() {
        let err = parse_property("acks=0").unwrap_err();
        assert!(err.starts_with("acks=0 refused: must be \"all\""), "{err}");
        assert!(parse_property("enable.auto.commit = true").is_err());
        assert_eq!(
            parse_property("fetch.wait.max.ms=1"),
            Ok(("fetch.wait.max.ms".into(), "1".into()))
        );
        assert!(parse_property("=1").is_err());
    }
}
