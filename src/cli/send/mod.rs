//! `grflow send`: writes a trace's requests to the request topic of a
//! `grflow serve` job, paced by their event times like `replay`, and with
//! `--answers` reads the response topic back and reports what was answered
//! and the end-to-end latency (sent to answer read back). It is the
//! producer for trying the Kafka path and for load tests; a service has its
//! own producers.

mod ledger;
mod pace;
mod trace;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use grflow_connectors::kafka::{
    Delivery, KafkaClientError, OutputProducer, RecordId, Refetch, RequestConsumer, SendError,
    StartPosition, WireResponse, encode_request, partition_count,
};
use grflow_connectors::wall_ms;
use grflow_pipeline::{StopRequest, kafka_settings};
use serde::Serialize;

use super::InputError;
use ledger::{AnswerLedger, AnswerReport};
use pace::{MAX_RPS, Pace, TraceSpan, wire_request};

#[derive(clap::Args, Debug)]
pub struct Args {
    // The serve job's config and brokers: its topics and catalog come from
    // its [kafka] section (the generated trace from its [trace]).
    #[command(flatten)]
    pub kafka: super::KafkaArgs,
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
    /// Send at most this many requests (the trace's first N; with --loop,
    /// in all passes together).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Send the trace again and again until --requests, --duration-s or
    /// Ctrl-C: each pass moves the req_ids past the pass before (no
    /// repeats) and its event times past that pass's end, paced as one long
    /// trace. For load tests that run for hours.
    #[arg(long = "loop")]
    pub loop_trace: bool,
    /// Stop sending after this many seconds (the answers are then awaited
    /// as usual).
    #[arg(long)]
    pub duration_s: Option<f64>,
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
    #[arg(long, default_value_t = 60, requires = "answers")]
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
    /// Passes over the trace from which requests were sent (more than 1
    /// only with --loop).
    pub passes: u64,
    /// With --answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<AnswerReport>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = args.kafka.load()?;
    let (pace, duration) = pace_of(&args)?;
    let (mut requests, trace_name) = trace::requests_for(args.trace.as_deref(), &config)?;

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
    let tail = match args.answers {
        true => {
            let partitions = need(&k.response_topic, "kafka.response_topic")?;
            Some(answers_from_now(
                &settings,
                &k.response_topic,
                partitions,
                timeout,
            )?)
        }
        false => None,
    };

    let deliveries = Deliveries::default();
    let producer = deliveries.producer(&settings)?;
    let stop = StopRequest::default();
    super::stop_on_signals(&stop)?;
    let mut sender = Sender {
        args: &args,
        pace,
        duration,
        producer: &producer,
        topic: &k.request_topic,
        tail: tail.as_ref(),
        stop: &stop,
        clock: Instant::now(),
        ledger: AnswerLedger::default(),
        sent: 0,
        unreadable: 0,
        passes: 0,
        last_progress: Instant::now(),
    };
    sender.send_all(&mut requests)?;
    let sending_s = sender.clock.elapsed().as_secs_f64();
    // Every request acknowledged (or refused) before the answers are
    // awaited; a broker that takes none of them is an error here.
    producer
        .flush(Duration::from_secs(30))
        .context("waiting for the broker to acknowledge the requests")?;
    sender.await_answers()?;
    let refused_n = deliveries.refused.load(Ordering::Relaxed);
    let report = SendReport {
        brokers: settings.brokers.clone(),
        request_topic: k.request_topic.clone(),
        trace: trace_name,
        sent: deliveries.delivered.load(Ordering::Relaxed),
        refused: refused_n,
        unreadable: sender.unreadable,
        wall_s: sending_s,
        send_rps: sender.sent as f64 / sending_s.max(1e-9),
        interrupted: stop.requested(),
        passes: sender.passes,
        answers: tail
            .as_ref()
            .map(|_| sender.ledger.report(&k.response_topic)),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report));
    }
    if let Some(e) = deliveries.first_refusal.lock().expect("lock").take() {
        eprintln!("warning: the broker refused {refused_n} requests; the first: {e}");
    }
    super::StoppedBySignal::check(&stop)?;
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

/// The pace and the time limit the flags ask for, checked by flag.
fn pace_of(args: &Args) -> anyhow::Result<(Pace, Option<Duration>)> {
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
    let duration = match args.duration_s {
        Some(d) => Some(
            Duration::try_from_secs_f64(d)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    InputError::from_display(format!("--duration-s must be above 0 (got {d})"))
                })?,
        ),
        None => None,
    };
    if args.requests == Some(0) {
        return Err(InputError::from_display("--requests must be at least 1"));
    }
    if args.answers && args.wait_s == 0 {
        return Err(InputError::from_display(
            "--wait-s must be at least 1 with --answers",
        ));
    }
    Ok((pace, duration))
}

/// Sends a trace's requests, paced, and (with `--answers`) reads the
/// answers as they come.
struct Sender<'a> {
    args: &'a Args,
    pace: Pace,
    duration: Option<Duration>,
    producer: &'a OutputProducer,
    topic: &'a str,
    /// The response topic from its end at start (`--answers`).
    tail: Option<&'a RequestConsumer>,
    stop: &'a StopRequest,
    /// Started again at the first request's acknowledgement.
    clock: Instant,
    ledger: AnswerLedger,
    sent: u64,
    /// Unreadable trace rows (counted in the first pass only).
    unreadable: u64,
    /// Passes from which something was sent (a pass begun when time was
    /// up sent nothing).
    passes: u64,
    last_progress: Instant,
}

impl Sender<'_> {
    /// Nanoseconds on the send clock.
    fn ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    fn time_up(&self) -> bool {
        self.duration.is_some_and(|d| self.clock.elapsed() >= d)
    }

    /// Reads the answers that arrive within `wait` (without `--answers`,
    /// sleeps it).
    fn read_answers(&mut self, wait: Duration) -> anyhow::Result<()> {
        let Some(tail) = self.tail else {
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
                let ns = self.ns();
                self.ledger.answer(&r, ns);
            }
        }
        Ok(())
    }

    /// Sends until the trace ends (every pass of it with `--loop`),
    /// `--requests` were sent, `--duration-s` is up, or a stop is asked.
    fn send_all(&mut self, requests: &mut trace::TraceRequests) -> anyhow::Result<()> {
        let limit = self.args.requests.unwrap_or(u64::MAX);
        let mut origin: Option<u64> = None;
        // The first pass's extent; later passes of --loop are moved past it.
        let mut span = TraceSpan::default();
        let mut pass = 0u64;
        while self.sent < limit && !self.stop.requested() && !self.time_up() {
            let Some(next) = requests.next() else {
                if !self.args.loop_trace || span.is_empty() {
                    break;
                }
                pass += 1;
                requests.rewind()?;
                continue;
            };
            let r = match next {
                Ok(r) => r,
                Err(e) => {
                    // Counted and named once, not once per pass.
                    if pass == 0 {
                        self.unreadable += 1;
                        eprintln!("skipped an unreadable trace row: {e}");
                    }
                    continue;
                }
            };
            if pass == 0 {
                span.observe(&r);
            }
            // This pass's move of the ids, with --req-id-offset, and of the
            // event times.
            let (id_offset, ts_shift) = span
                .shift(pass)
                .and_then(|(id, ts)| Some((id.checked_add(self.args.req_id_offset)?, ts)))
                .ok_or_else(|| {
                    InputError::from_display(format!(
                        "--loop: pass {pass}'s req_ids or event times overflow u64"
                    ))
                })?;
            let ts_ms = r.ts_ms.saturating_add(ts_shift);
            let origin = *origin.get_or_insert(ts_ms);
            if let Some(due) = self.pace.due(self.sent, ts_ms, origin) {
                if self.duration.is_some_and(|d| due >= d) {
                    break;
                }
                while self.clock.elapsed() < due && !self.stop.requested() {
                    let left = due.saturating_sub(self.clock.elapsed());
                    self.read_answers(left.min(Duration::from_millis(5)))?;
                }
            }
            self.send_one(&r, ts_ms, id_offset)?;
            self.passes = pass + 1;
            self.progress(pass);
            if self.tail.is_some() {
                self.read_answers(Duration::ZERO)?;
            }
        }
        Ok(())
    }

    /// Sends `r` stamped `ts_ms` (or the wall clock without `--trace-ts`)
    /// with its req_id moved by `id_offset`.
    fn send_one(
        &mut self,
        r: &grflow_traces::Request,
        ts_ms: u64,
        id_offset: u64,
    ) -> anyhow::Result<()> {
        let ts = if self.args.trace_ts { ts_ms } else { wall_ms() };
        let wire = wire_request(r, ts, id_offset).ok_or_else(|| {
            InputError::from_display(format!(
                "--req-id-offset {}: req_id {} + offset overflows u64",
                self.args.req_id_offset, r.req_id
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
            match self
                .producer
                .send(self.topic, Some(key.as_bytes()), &payload, id)
            {
                Ok(()) => break,
                Err(SendError::QueueFull) => self.read_answers(Duration::from_millis(1))?,
                Err(SendError::Client(e)) => return Err(e.into()),
            }
        }
        if self.sent == 0 {
            // The producer connects (and, being idempotent, gets its
            // producer id) with its first record, which took up to half a
            // second on tansu and queued the requests behind it: that wait
            // was the run's tail latency. The first request goes alone and
            // the clock starts at its acknowledgement.
            self.producer
                .flush(Duration::from_secs(10))
                .context("waiting for the broker to acknowledge the first request")?;
            self.clock = Instant::now();
        }
        if self.tail.is_some() {
            // Only awaited answers are remembered: a long send without
            // --answers holds nothing per request.
            let ns = self.ns();
            self.ledger.sent(wire.req_id, ts, ns);
        }
        self.sent += 1;
        Ok(())
    }

    /// Every 5 s: what was sent, and with `--answers` what came back.
    fn progress(&mut self, pass: u64) {
        if self.last_progress.elapsed() < Duration::from_secs(5) {
            return;
        }
        self.last_progress = Instant::now();
        let answers = match self.tail {
            Some(_) => {
                let recent = self.ledger.take_recent();
                format!(
                    ", {} awaiting an answer; last 5 s: {} served, end-to-end p99 {:.1} ms",
                    self.ledger.waiting(),
                    recent.count(),
                    recent.quantile(0.99)
                )
            }
            None => String::new(),
        };
        eprintln!(
            "sent {} ({:.0} req/s){}{answers}",
            self.sent,
            self.sent as f64 / self.clock.elapsed().as_secs_f64(),
            match pass {
                0 => String::new(),
                p => format!(", pass {}", p + 1),
            },
        );
    }

    /// With `--answers`: reads answers until every request has one,
    /// `--wait-s` is up, or a stop is asked.
    fn await_answers(&mut self) -> anyhow::Result<()> {
        if self.tail.is_none() {
            return Ok(());
        }
        // A wait past what an Instant holds is a wait until stopped.
        let until = Instant::now().checked_add(Duration::from_secs(self.args.wait_s));
        while self.ledger.waiting() > 0
            && until.is_none_or(|until| Instant::now() < until)
            && !self.stop.requested()
        {
            self.read_answers(Duration::from_millis(50))?;
        }
        // One more look: answers read while the stop arrived.
        self.read_answers(Duration::ZERO)
    }
}

/// A consumer of `topic`'s answers from its end on, in a group of its own:
/// earlier answers are not read, and the job's offsets are not touched.
fn answers_from_now(
    settings: &grflow_connectors::kafka::KafkaSettings,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> anyhow::Result<RequestConsumer> {
    let mut s = settings.clone();
    s.group_id = format!("grflow-send-{}-{}", std::process::id(), wall_ms());
    let all: Vec<i32> = (0..partitions).collect();
    let (consumer, _) = RequestConsumer::open(
        &s,
        topic,
        &all,
        StartPosition::Latest,
        Refetch::FromCommitted,
        timeout,
    )?;
    Ok(consumer)
}

/// What the broker said about the requests: acknowledged, refused for
/// good, and the first refusal's reason.
#[derive(Clone, Default)]
struct Deliveries {
    delivered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    first_refusal: Arc<Mutex<Option<String>>>,
}

impl Deliveries {
    /// A producer whose delivery reports are counted here.
    fn producer(
        &self,
        settings: &grflow_connectors::kafka::KafkaSettings,
    ) -> anyhow::Result<OutputProducer> {
        let d = self.clone();
        Ok(OutputProducer::new(
            settings,
            Arc::new(move |report| match report {
                Delivery::Delivered { .. } => {
                    d.delivered.fetch_add(1, Ordering::Relaxed);
                }
                Delivery::Failed { source, error, .. } => {
                    d.refused.fetch_add(1, Ordering::Relaxed);
                    d.first_refusal
                        .lock()
                        .expect("lock")
                        .get_or_insert(format!("request {}: {error}", source.offset));
                }
            }),
        )?)
    }
}

fn human(r: &SendReport) -> String {
    let mut s = format!(
        "sent {} requests from {}{} to {} at {} in {:.1} s ({:.1} req/s){}{}\n",
        r.sent,
        r.trace,
        match r.passes {
            0 | 1 => String::new(),
            n => format!(" ({n} passes)"),
        },
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
