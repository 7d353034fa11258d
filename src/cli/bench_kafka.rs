//! `grflow bench kafka`: one trace served twice in one run, at the same
//! offered rate: through a Kafka broker (`grflow serve` in-process, a paced
//! producer, the response topic read back) and replayed from Parquet.
//! Reports throughput and p99 latency of both and their ratios.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use grflow_connectors::kafka::{
    KafkaSettings, OutputProducer, RecordId, Refetch, RequestConsumer, SendError, StartPosition,
    delete_topics, ensure_topics,
};
use grflow_kernels::bench::gemm_peak_gflops;
use grflow_kernels::cost::machine_name;
use grflow_pipeline::{Config, ReplayOptions, ServeOptions, TraceInput};
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
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

#[derive(Debug, Serialize)]
struct KafkaBench {
    requests: u64,
    offered_rps: f64,
    kafka_rps: f64,
    parquet_rps: f64,
    /// kafka_rps / parquet_rps.
    throughput_ratio: f64,
    /// Consumption to hand-off to the producer (what the job adds).
    kafka_p99_ms: f64,
    /// Admission to response, Parquet replay.
    parquet_p99_ms: f64,
    /// kafka_p99_ms / parquet_p99_ms.
    p99_ratio: f64,
    /// Produce call to the response read back from the broker.
    kafka_end_to_end_p99_ms: f64,
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
    let result = run_both(&args, &brokers, config, &trace, dir.clone());
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let v = serde_json::to_value(&report)?;
        for (k, v) in v.as_object().context("object")? {
            println!("{k:<26} {v}");
        }
    }
    Ok(())
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
    let settings = KafkaSettings {
        brokers: brokers.to_string(),
        group_id: format!("{base}.bench"),
        client_id: "grflow-bench".into(),
        ..KafkaSettings::default()
    };
    let timeout = Duration::from_secs(10);
    ensure_topics(
        &settings,
        &[
            (k.request_topic.as_str(), args.partitions),
            (k.response_topic.as_str(), args.partitions),
            (k.dead_letter_topic.as_str(), 1),
        ],
        k.replication_factor,
        timeout,
    )
    .with_context(|| format!("bench kafka: creating its topics on {brokers}"))?;
    // The bench's topics hold its records: deleted however the run ends.
    let _cleanup = BenchTopics {
        settings: settings.clone(),
        topics: vec![
            k.request_topic.clone(),
            k.response_topic.clone(),
            k.dead_letter_topic.clone(),
        ],
    };

    // The topics exist: the broker answers, so the Parquet half is not
    // spent on a run that cannot finish. Parquet first: it warms nothing
    // the Kafka run uses.
    eprintln!(
        "replaying {} requests from Parquet at {} rps...",
        args.requests, args.rps
    );
    let replayed = grflow_pipeline::replay(ReplayOptions {
        trace: TraceInput::Parquet(dir.clone()),
        config: config.clone(),
        show_progress: false,
        responses: grflow_pipeline::replay::ResponseOutput::Drop,
        counters: None,
        commands: Vec::new(),
        oracle_step: None,
        stop: None,
    })
    .context("Parquet replay")?;
    let parquet_rps = replayed.summary.responses_out as f64 / replayed.summary.wall_s;
    let parquet_p99_ms = replayed.summary.latency_ms.p99;
    eprintln!("serving the same trace through Kafka at {brokers}...");
    let (request_topic, response_topic) = (k.request_topic.clone(), k.response_topic.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let serve_stop = stop.clone();
    let job = std::thread::spawn(move || {
        grflow_pipeline::serve(ServeOptions::new(serve_cfg), serve_stop)
    });
    let all: Vec<i32> = (0..args.partitions).collect();
    let (tail, _) = RequestConsumer::open(
        &settings,
        &response_topic,
        &all,
        StartPosition::Earliest,
        Refetch::FromCommitted,
        timeout,
    )?;
    let producer = OutputProducer::new(&settings, Arc::new(|_| {}))?;
    let origin = trace.requests.first().map_or(0, |r| r.ts_ms);
    let total = trace.requests.len();
    let request_body = |req_id: u64, r: &grflow_traces::Request| {
        serde_json::to_vec(&serde_json::json!({
            "req_id": req_id, "user_id": r.user_id, "ts_ms": r.ts_ms,
            "candidates": r.candidates, "hist_len": r.hist_len,
            "mode": match r.mode { Mode::Rank => "rank", Mode::Retrieve => "retrieve" },
        }))
    };
    // Offer load only once the job answers on every partition: a fixed
    // sleep was sometimes shorter than the consumer group's join, and the
    // requests produced meanwhile arrived as one burst whose queue set the
    // whole run's p99 (the first 5 s window had p99 88 ms, later ones 4-5).
    // The warm-up requests (req_id >= total) count in the job's summary but
    // not in the end-to-end figure.
    if let Some(first) = trace.requests.first() {
        eprintln!("waiting for the job to answer on every partition...");
        for p in 0..args.partitions {
            let id = RecordId {
                partition: p,
                offset: -1 - p as i64,
            };
            let req_id = (total + p as usize) as u64;
            producer.send_to(&request_topic, p, &request_body(req_id, first)?, id)?;
        }
        let ready_by = Instant::now() + Duration::from_secs(120);
        let mut warm = HashSet::new();
        while warm.len() < args.partitions as usize {
            if Instant::now() > ready_by {
                stop.store(true, Ordering::Relaxed);
                bail!(
                    "the job answered {} of {} warm-up requests in 120 s",
                    warm.len(),
                    args.partitions
                );
            }
            while let Some(record) = tail.poll(Duration::from_millis(10)) {
                let v: serde_json::Value =
                    serde_json::from_slice(&record?.payload.unwrap_or_default())?;
                if let Some(req) = v["req_id"].as_u64().filter(|&r| r >= total as u64) {
                    warm.insert(req);
                }
            }
        }
    }
    let started = Instant::now();
    let mut sent_at = vec![Duration::ZERO; trace.requests.len()];
    let mut answered = HashSet::new();
    let mut end_to_end = Vec::with_capacity(trace.requests.len());
    let mut last_answer = started;
    let mut next = 0;
    let deadline = Duration::from_secs_f64(args.requests as f64 / args.rps * 3.0 + 120.0);
    while answered.len() < total {
        if started.elapsed() > deadline {
            stop.store(true, Ordering::Relaxed);
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
            match producer.send_to(&request_topic, partition, &payload, id) {
                Ok(()) => {
                    sent_at[next] = started.elapsed();
                    next += 1;
                }
                Err(SendError::QueueFull) => break,
                Err(e) => return Err(e.into()),
            }
        }
        // Read back what was answered.
        while let Some(record) = tail.poll(Duration::from_millis(1)) {
            let record = record?;
            let v: serde_json::Value = serde_json::from_slice(&record.payload.unwrap_or_default())?;
            let req = v["req_id"].as_u64().context("response without req_id")? as usize;
            if req < total && answered.insert(req) {
                end_to_end.push((started.elapsed() - sent_at[req]).as_secs_f64() * 1e3);
                last_answer = Instant::now();
            }
        }
    }
    let kafka_wall = last_answer.duration_since(started).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let summary = job
        .join()
        .map_err(|_| anyhow::anyhow!("serve thread panicked"))??;
    let kafka_rps = total as f64 / kafka_wall;
    let kafka_p99_ms = summary.latency_ms.p99;
    end_to_end.sort_by(f64::total_cmp);
    let e2e_p99 = end_to_end[((end_to_end.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)];
    Ok(KafkaBench {
        requests: args.requests,
        offered_rps: args.rps,
        kafka_rps,
        parquet_rps,
        throughput_ratio: kafka_rps / parquet_rps,
        kafka_p99_ms,
        parquet_p99_ms,
        p99_ratio: kafka_p99_ms / parquet_p99_ms,
        kafka_end_to_end_p99_ms: e2e_p99,
        workers: args.workers,
        partitions: args.partitions,
        brokers: brokers.to_string(),
        librdkafka: args.librdkafka.iter().cloned().collect(),
        machine: machine_name(),
        // After both runs, so that it disturbs neither.
        gemm_gflops: gemm_peak_gflops(),
    })
}

/// Deletes the bench's topics when dropped; a broker that refuses (or
/// cannot delete topics) gets a note naming them.
struct BenchTopics {
    settings: KafkaSettings,
    topics: Vec<String>,
}

impl Drop for BenchTopics {
    fn drop(&mut self) {
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        if let Err(e) = delete_topics(&self.settings, &names, Duration::from_secs(5)) {
            eprintln!(
                "note: the bench's topics {} were not deleted: {e}",
                names.join(", ")
            );
        }
    }
}
