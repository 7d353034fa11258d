//! `grflow send`: writes a trace's requests to the request topic of a
//! `grflow serve` job, paced by their event times like `replay`, and with
//! `--answers` reads the response topic back and reports what was answered
//! and the end-to-end latency (sent to answer read back). It is the
//! producer for trying the Kafka path and for load tests; a service has its
//! own producers.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use grflow_connectors::kafka::{
    Delivery, History, KafkaClientError, OutputProducer, RecordId, Refetch, RequestConsumer,
    SendError, StartPosition, WireRequest, WireResponse, encode_request, partition_count,
};
use grflow_connectors::parquet::ParquetRequestSource;
use grflow_connectors::{RequestSource, SourceRecord, SourceState};
use grflow_pipeline::{Speed, StopRequest, kafka_settings};
use grflow_traces::Request;
use serde::Serialize;

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The serve job's config: brokers, topics and catalog come from its
    /// [kafka] section (and the generated trace from its [trace] section).
    /// Default: configs/kafka.toml from this directory, else the copy built
    /// into grflow.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// bootstrap.servers; overrides kafka.brokers and GRFLOW_KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Trace directory whose requests to send. Default: kafka.catalog when
    /// set, else the config's [trace] section, generated (the catalog
    /// `serve` then uses), so that users and items match the job's.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Pacing by the requests' event times: 1x, Nx (N times faster) or max.
    #[arg(long, default_value = "1x")]
    pub speed: String,
    /// Send at this fixed rate (requests per second) instead of the trace's
    /// pace: an offered load for a load test.
    #[arg(long, conflicts_with = "speed")]
    pub rps: Option<f64>,
    /// Send at most this many requests (the trace's first N).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Stamp each request's ts_ms with the trace's event time; by default
    /// with the wall clock when it is sent, as a live producer would, so
    /// that a job that runs on sees time move forward however often a
    /// trace is sent.
    #[arg(long)]
    pub trace_ts: bool,
    /// Added to every req_id, so that sending a trace again does not repeat
    /// ids (which `serve` counts in `repeated_req_ids`).
    #[arg(long, default_value_t = 0)]
    pub req_id_offset: u64,
    /// Read the response topic and report the answers and the end-to-end
    /// latency; wait up to --wait-s after the last send for every answer.
    #[arg(long)]
    pub answers: bool,
    /// With --answers: how long to wait for the last answers.
    #[arg(long, default_value_t = 60)]
    pub wait_s: u64,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// What `send` did, as `--json` prints it.
#[derive(Debug, Default, Serialize)]
pub struct SendReport {
    pub brokers: String,
    pub request_topic: String,
    pub trace: String,
    /// Requests handed to the producer and acknowledged by the broker.
    pub sent: u64,
    /// Requests the broker refused for good (not retried).
    pub refused: u64,
    /// Trace rows that could not be read (skipped, each named on stderr).
    pub unreadable: u64,
    pub wall_s: f64,
    pub send_rps: f64,
    /// Stopped by SIGINT/SIGTERM before the trace's end.
    pub interrupted: bool,
    /// With --answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<AnswerReport>,
}

/// The answers read back for the requests sent.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AnswerReport {
    pub response_topic: String,
    pub answered: u64,
    /// Answers with items: a ranking, or generated items (retrieve).
    pub served: u64,
    /// Error records by kind (`shed`, `unservable`).
    pub errors: BTreeMap<String, u64>,
    pub unanswered: u64,
    /// A few of the unanswered req_ids, smallest first.
    pub unanswered_examples: Vec<u64>,
    /// Answers to a request already answered (a restart of the job).
    pub repeated_answers: u64,
    /// Sent to answer read back, milliseconds.
    pub latency_ms: LatencyMs,
    /// Inside the job (consumed to answered: the answers' own
    /// `latency_ms`); the rest of `latency_ms` is the brokers' and the
    /// clients' share.
    pub job_latency_ms: LatencyMs,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// The requests sent and the answers read back, matched by `req_id` and
/// the `ts_ms` sent (an older answer to the same id on a long-lived
/// response topic does not count). Times are nanoseconds from the start.
#[derive(Debug, Default)]
pub struct AnswerLedger {
    /// req_id → (sent at, ts_ms sent).
    waiting: HashMap<u64, (u64, u64)>,
    /// req_id → ts_ms of the answered ones, to tell a repeat from a stranger.
    answered: HashMap<u64, u64>,
    latencies_ms: Vec<f64>,
    job_latencies_ms: Vec<f64>,
    served: u64,
    errors: BTreeMap<String, u64>,
    repeated: u64,
}

impl AnswerLedger {
    pub fn sent(&mut self, req_id: u64, ts_ms: u64, at_ns: u64) {
        self.waiting.insert(req_id, (at_ns, ts_ms));
    }

    /// Records an answer read at `at_ns`; answers to requests this run did
    /// not send are ignored.
    pub fn answer(&mut self, r: &WireResponse, at_ns: u64) {
        match self.waiting.get(&r.req_id) {
            Some(&(sent_ns, ts)) if ts == r.ts_ms => {
                self.waiting.remove(&r.req_id);
                self.answered.insert(r.req_id, ts);
                self.latencies_ms
                    .push(at_ns.saturating_sub(sent_ns) as f64 / 1e6);
                self.job_latencies_ms.push(r.latency_ms);
                match &r.error {
                    Some(e) => *self.errors.entry(e.kind.clone()).or_default() += 1,
                    None => self.served += 1,
                }
            }
            _ if self.answered.get(&r.req_id) == Some(&r.ts_ms) => self.repeated += 1,
            _ => {}
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn report(&self, response_topic: &str) -> AnswerReport {
        let mut unanswered: Vec<u64> = self.waiting.keys().copied().collect();
        unanswered.sort_unstable();
        unanswered.truncate(5);
        AnswerReport {
            response_topic: response_topic.to_string(),
            answered: self.latencies_ms.len() as u64,
            served: self.served,
            errors: self.errors.clone(),
            unanswered: self.waiting.len() as u64,
            unanswered_examples: unanswered,
            repeated_answers: self.repeated,
            latency_ms: LatencyMs::of(&self.latencies_ms),
            job_latency_ms: LatencyMs::of(&self.job_latencies_ms),
        }
    }
}

impl LatencyMs {
    fn of(latencies: &[f64]) -> Self {
        let mut l = latencies.to_vec();
        l.sort_by(f64::total_cmp);
        let q = |p: f64| match l.len() {
            0 => 0.0,
            n => l[((n as f64 * p).ceil() as usize).clamp(1, n) - 1],
        };
        LatencyMs {
            p50: q(0.5),
            p95: q(0.95),
            p99: q(0.99),
            max: l.last().copied().unwrap_or(0.0),
        }
    }
}

/// The highest `--rps`.
const MAX_RPS: f64 = 1e6;

/// When a request is due, from the start of sending.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// By the trace's event times, at this speed.
    Trace(Speed),
    /// At a fixed rate, requests per second.
    Rate(f64),
}

impl Pace {
    /// When the `index`-th request (0-based) with event time `ts_ms` is
    /// due, the trace starting at `origin_ms`; `None`: at once.
    pub fn due(&self, index: u64, ts_ms: u64, origin_ms: u64) -> Option<Duration> {
        let secs = match *self {
            Pace::Trace(Speed::Max) => return None,
            Pace::Trace(Speed::Factor(f)) => ts_ms.saturating_sub(origin_ms) as f64 / 1e3 / f,
            Pace::Rate(rps) => index as f64 / rps,
        };
        // A stamp absurdly far ahead waits "forever" (Ctrl-C stops it)
        // rather than overflowing.
        Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
    }
}

/// The message for one trace request: its history as a prefix of the
/// catalog's users table, stamped `ts_ms`, its id moved by `offset`.
pub fn wire_request(r: &Request, ts_ms: u64, offset: u64) -> Option<WireRequest> {
    Some(WireRequest {
        req_id: r.req_id.checked_add(offset)?,
        user_id: r.user_id,
        ts_ms,
        candidates: r.candidates.clone(),
        history: History::Prefix(r.hist_len),
        mode: r.mode,
        history_dropped: 0,
    })
}

/// A trace's requests in order: generated in memory, or read from Parquet
/// a batch at a time.
enum TraceRequests {
    Memory(std::vec::IntoIter<Request>),
    Parquet {
        source: Box<ParquetRequestSource>,
        pending: std::collections::VecDeque<SourceRecord>,
        done: bool,
    },
}

impl TraceRequests {
    /// The next request, or the position and reason of an unreadable row.
    fn next(&mut self) -> Option<Result<Request, String>> {
        match self {
            TraceRequests::Memory(it) => it.next().map(Ok),
            TraceRequests::Parquet {
                source,
                pending,
                done,
            } => loop {
                if let Some(rec) = pending.pop_front() {
                    return Some(match rec {
                        SourceRecord::Request { request, .. } => Ok(request),
                        SourceRecord::Bad {
                            position, reason, ..
                        } => Err(format!("{position}: {reason}")),
                    });
                }
                if *done {
                    return None;
                }
                match source.poll(1024, 0) {
                    Ok(p) => {
                        pending.extend(p.records);
                        *done = p.state == SourceState::Exhausted;
                    }
                    Err(e) => return Some(Err(e.to_string())),
                }
            },
        }
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = super::kafka_config(args.config.as_deref(), args.brokers.as_deref())?;
    let pace = match args.rps {
        Some(r) if !(r > 0.0 && r <= MAX_RPS) => {
            return Err(InputError::from_display(format!(
                "--rps must be above 0 and at most {MAX_RPS} (got {r})"
            )));
        }
        Some(r) => Pace::Rate(r),
        None => Pace::Trace(
            args.speed
                .parse()
                .map_err(|e| InputError::from_display(format!("--speed: {e}")))?,
        ),
    };
    if args.answers && args.wait_s == 0 {
        return Err(InputError::from_display(
            "--wait-s must be at least 1 with --answers",
        ));
    }
    let catalog = config.kafka.catalog.clone();
    let (mut requests, trace_name) = match (&args.trace, catalog.is_empty()) {
        (Some(dir), _) => {
            if !catalog.is_empty() && !same_dir(dir, Path::new(&catalog)) {
                eprintln!(
                    "warning: the job's catalog is kafka.catalog = {catalog:?}; the requests of {} \
                     name that trace's users and items",
                    dir.display()
                );
            } else if catalog.is_empty() {
                eprintln!(
                    "warning: kafka.catalog is empty, so the job serves the [trace] section's \
                     generated users and items; the requests of {} name its own (set \
                     kafka.catalog = {:?} in the job's config)",
                    dir.display(),
                    dir.display().to_string()
                );
            }
            (open_parquet(dir)?, dir.display().to_string())
        }
        (None, false) => (
            open_parquet(Path::new(&catalog))?,
            format!("{catalog} (kafka.catalog)"),
        ),
        (None, true) => {
            let gen_cfg = config
                .trace
                .gen_config()
                .map_err(InputError::from_display)?;
            let trace = grflow_traces::generate(&gen_cfg);
            (
                TraceRequests::Memory(trace.requests.into_iter()),
                "the config's [trace] section (generated)".to_string(),
            )
        }
    };

    let k = &config.kafka;
    let settings = kafka_settings(&config, format!("grflow-send-{}", std::process::id()));
    let timeout = Duration::from_secs(10);
    // The job creates its topics at start; a missing one is a job not
    // started (or another config), said before anything is sent.
    let need = |topic: &str, key: &str| -> anyhow::Result<i32> {
        partition_count(&settings, topic, timeout).map_err(|e| match e {
            KafkaClientError::NoSuchTopic { .. } => InputError::from_display(format!(
                "{key} {topic:?} does not exist at {}: start `grflow serve` with this config \
                 first (it creates its topics), or create it",
                settings.brokers
            )),
            other => anyhow::Error::new(other),
        })
    };
    need(&k.request_topic, "kafka.request_topic")?;
    let tail = if args.answers {
        let partitions = need(&k.response_topic, "kafka.response_topic")?;
        let mut s = settings.clone();
        // A group of its own, starting at the topic's end: earlier answers
        // are not read, and the job's offsets are not touched.
        s.group_id = format!("grflow-send-{}-{}", std::process::id(), now_unix_ms());
        let all: Vec<i32> = (0..partitions).collect();
        let (c, _) = RequestConsumer::open(
            &s,
            &k.response_topic,
            &all,
            StartPosition::Latest,
            Refetch::FromCommitted,
            timeout,
        )?;
        Some(c)
    } else {
        None
    };

    let refused = Arc::new(AtomicU64::new(0));
    let delivered = Arc::new(AtomicU64::new(0));
    let first_refusal: Arc<Mutex<Option<String>>> = Arc::default();
    let producer = {
        let (refused, delivered, first) =
            (refused.clone(), delivered.clone(), first_refusal.clone());
        OutputProducer::new(
            &settings,
            Arc::new(move |d| match d {
                Delivery::Delivered { .. } => {
                    delivered.fetch_add(1, Ordering::Relaxed);
                }
                Delivery::Failed { source, error, .. } => {
                    refused.fetch_add(1, Ordering::Relaxed);
                    first
                        .lock()
                        .expect("lock")
                        .get_or_insert(format!("request {}: {error}", source.offset));
                }
            }),
        )?
    };

    let stop = StopRequest::default();
    super::stop_on_signals(&stop)?;
    let clock = std::cell::Cell::new(Instant::now());
    let ns = || clock.get().elapsed().as_nanos() as u64;
    let mut ledger = AnswerLedger::default();
    let read_answers = |ledger: &mut AnswerLedger, wait: Duration| -> anyhow::Result<()> {
        let Some(tail) = &tail else {
            std::thread::sleep(wait);
            return Ok(());
        };
        let mut wait = wait;
        while let Some(record) = tail.poll(wait) {
            wait = Duration::ZERO;
            let record = record?;
            // Not an answer of ours (or not JSON): another producer's.
            if let Ok(r) =
                serde_json::from_slice::<WireResponse>(&record.payload.unwrap_or_default())
            {
                ledger.answer(&r, ns());
            }
        }
        Ok(())
    };
    let limit = args.requests.unwrap_or(u64::MAX);
    let mut sent = 0u64;
    let mut unreadable = 0u64;
    let mut origin: Option<u64> = None;
    let mut last_progress = Instant::now();
    while sent < limit && !stop.requested() {
        let Some(next) = requests.next() else { break };
        let r = match next {
            Ok(r) => r,
            Err(e) => {
                unreadable += 1;
                eprintln!("skipped an unreadable trace row: {e}");
                continue;
            }
        };
        let origin = *origin.get_or_insert(r.ts_ms);
        if let Some(due) = pace.due(sent, r.ts_ms, origin) {
            while clock.get().elapsed() < due && !stop.requested() {
                let left = due.saturating_sub(clock.get().elapsed());
                read_answers(&mut ledger, left.min(Duration::from_millis(5)))?;
            }
        }
        let ts = if args.trace_ts {
            r.ts_ms
        } else {
            now_unix_ms()
        };
        let wire = wire_request(&r, ts, args.req_id_offset).ok_or_else(|| {
            InputError::from_display(format!(
                "--req-id-offset {}: req_id {} + offset overflows u64",
                args.req_id_offset, r.req_id
            ))
        })?;
        let payload = encode_request(&wire);
        // A user's requests share a key, so they keep their order on one
        // partition.
        let key = r.user_id.to_string();
        let id = RecordId {
            partition: -1,
            offset: wire.req_id as i64,
        };
        loop {
            match producer.send(&k.request_topic, Some(key.as_bytes()), &payload, id) {
                Ok(()) => break,
                Err(SendError::QueueFull) => read_answers(&mut ledger, Duration::from_millis(1))?,
                Err(SendError::Client(e)) => return Err(e.into()),
            }
        }
        if sent == 0 {
            // The producer connects (and, being idempotent, gets its
            // producer id) with its first record, which took up to half a
            // second on tansu and queued the requests behind it: that wait
            // was the run's tail latency. The first request goes alone and
            // the clock starts at its acknowledgement.
            producer
                .flush(timeout)
                .context("waiting for the broker to acknowledge the first request")?;
            clock.set(Instant::now());
        }
        if tail.is_some() {
            // Only awaited answers are remembered: a long send without
            // --answers holds nothing per request.
            ledger.sent(wire.req_id, ts, ns());
        }
        sent += 1;
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "sent {sent} ({:.0} req/s){}",
                sent as f64 / clock.get().elapsed().as_secs_f64(),
                match &tail {
                    Some(_) => format!(", {} awaiting an answer", ledger.waiting()),
                    None => String::new(),
                }
            );
        }
        if tail.is_some() {
            read_answers(&mut ledger, Duration::ZERO)?;
        }
    }
    let sending_s = clock.get().elapsed().as_secs_f64();
    // Every request acknowledged (or refused) before the answers are
    // awaited; a broker that takes none of them is an error here.
    producer
        .flush(Duration::from_secs(30))
        .context("waiting for the broker to acknowledge the requests")?;
    if tail.is_some() {
        let until = Instant::now() + Duration::from_secs(args.wait_s);
        while ledger.waiting() > 0 && Instant::now() < until && !stop.requested() {
            read_answers(&mut ledger, Duration::from_millis(50))?;
        }
        // One more look: answers read while the stop arrived.
        read_answers(&mut ledger, Duration::ZERO)?;
    }
    let refused_n = refused.load(Ordering::Relaxed);
    let report = SendReport {
        brokers: settings.brokers.clone(),
        request_topic: k.request_topic.clone(),
        trace: trace_name,
        sent: delivered.load(Ordering::Relaxed),
        refused: refused_n,
        unreadable,
        wall_s: sending_s,
        send_rps: sent as f64 / sending_s.max(1e-9),
        interrupted: stop.requested(),
        answers: tail.as_ref().map(|_| ledger.report(&k.response_topic)),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report));
    }
    if let Some(e) = first_refusal.lock().expect("lock").take() {
        eprintln!("warning: the broker refused {refused_n} requests; the first: {e}");
    }
    if stop.requested() {
        return Err(super::StoppedBySignal::of(&stop));
    }
    if let Some(a) = &report.answers
        && a.unanswered > 0
    {
        anyhow::bail!(
            "{} requests unanswered {} s after the last was sent (e.g. req_id {:?}): is `grflow \
             serve` running with this config?",
            a.unanswered,
            args.wait_s,
            a.unanswered_examples
        );
    }
    if refused_n > 0 {
        anyhow::bail!("the broker refused {refused_n} requests");
    }
    Ok(())
}

fn open_parquet(dir: &Path) -> anyhow::Result<TraceRequests> {
    let source = ParquetRequestSource::open(dir, 0, 1)
        .map_err(|e| InputError::from_display(format!("--trace {}: {e}", dir.display())))?;
    Ok(TraceRequests::Parquet {
        source: Box::new(source),
        pending: Default::default(),
        done: false,
    })
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn human(r: &SendReport) -> String {
    let mut s = format!(
        "sent {} requests from {} to {} at {} in {:.1} s ({:.1} req/s){}{}\n",
        r.sent,
        r.trace,
        r.request_topic,
        r.brokers,
        r.wall_s,
        r.send_rps,
        match r.refused {
            0 => String::new(),
            n => format!("; {n} refused by the broker"),
        },
        if r.interrupted {
            "; interrupted before the trace's end"
        } else {
            ""
        }
    );
    if r.unreadable > 0 {
        s += &format!("{} unreadable trace rows skipped\n", r.unreadable);
    }
    if let Some(a) = &r.answers {
        let errors: Vec<String> = a.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        s += &format!(
            "answered {} on {}: {} served, {} errors{}{}\n",
            a.answered,
            a.response_topic,
            a.served,
            a.errors.values().sum::<u64>(),
            match errors.is_empty() {
                true => String::new(),
                false => format!(" ({})", errors.join(", ")),
            },
            match a.unanswered {
                0 => String::new(),
                n => format!("; {n} unanswered, e.g. req_id {:?}", a.unanswered_examples),
            }
        );
        for (what, l) in [
            ("end-to-end (sent to answer read back)", &a.latency_ms),
            ("in the job (consumed to answered)", &a.job_latency_ms),
        ] {
            s += &format!(
                "latency ms {what}  p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2}\n",
                l.p50, l.p95, l.p99, l.max
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_connectors::kafka::AnswerError;

    fn response(req_id: u64, ts_ms: u64, error: Option<&str>) -> WireResponse {
        WireResponse {
            req_id,
            items: vec![1],
            scores: vec![0.5],
            model_version: "m".into(),
            error: error.map(|kind| AnswerError {
                kind: kind.into(),
                reason: "r".into(),
            }),
            node: 0,
            ts_ms,
            latency_ms: 1.0,
            topic: "t".into(),
            partition: 0,
            offset: 0,
        }
    }

    #[test]
    fn answers_match_by_id_and_time_and_latency_runs_from_the_send() {
        let mut l = AnswerLedger::default();
        for id in 0..4 {
            l.sent(id, 100 + id, id * 1_000_000);
        }
        // An old answer to req 0 (another ts) and one to a request never sent.
        l.answer(&response(0, 5, None), 9_000_000);
        l.answer(&response(77, 100, None), 9_000_000);
        assert_eq!(l.waiting(), 4);
        l.answer(&response(0, 100, None), 3_000_000);
        l.answer(&response(1, 101, Some("shed")), 5_000_000);
        l.answer(&response(2, 102, None), 12_000_000);
        // The same answer again (a job restarted around it).
        l.answer(&response(2, 102, None), 13_000_000);
        let r = l.report("out");
        assert_eq!(r.answered, 3);
        assert_eq!(r.served, 2);
        assert_eq!(r.errors, BTreeMap::from([("shed".to_string(), 1)]));
        assert_eq!(r.unanswered, 1);
        assert_eq!(r.unanswered_examples, vec![3]);
        assert_eq!(r.repeated_answers, 1);
        // Latencies 3, 4 and 10 ms.
        assert_eq!(r.latency_ms.p50, 4.0);
        assert_eq!(r.latency_ms.max, 10.0);
    }

    #[test]
    fn requests_are_due_by_their_event_time_or_at_a_fixed_rate() {
        let ms = Duration::from_millis;
        assert_eq!(Pace::Trace(Speed::Max).due(5, 9_000, 1_000), None);
        assert_eq!(
            Pace::Trace(Speed::Factor(2.0)).due(5, 3_000, 1_000),
            Some(ms(1_000))
        );
        // A stamp before the first is due at once.
        assert_eq!(
            Pace::Trace(Speed::Factor(1.0)).due(1, 500, 1_000),
            Some(ms(0))
        );
        assert_eq!(Pace::Rate(200.0).due(10, 0, 0), Some(ms(50)));
        assert_eq!(
            Pace::Trace(Speed::Factor(1e-6)).due(0, u64::MAX, 0),
            Some(Duration::MAX),
            "no overflow"
        );
    }

    #[test]
    fn a_trace_request_goes_out_with_its_history_as_a_prefix_and_the_id_moved() {
        let r = Request {
            ts_ms: 5,
            req_id: 10,
            user_id: 3,
            hist_len: 7,
            candidates: vec![1, 2],
            mode: grflow_traces::Mode::Rank,
            label: Some(1),
        };
        let w = wire_request(&r, 1_000, 100).unwrap();
        assert_eq!(
            (w.req_id, w.ts_ms, w.history.clone()),
            (110, 1_000, History::Prefix(7))
        );
        assert!(wire_request(&r, 0, u64::MAX).is_none(), "overflow refused");
    }
}
