//! One worker's Kafka sink: responses and error records on the response
//! topic (key = req_id), dead letters on the dead-letter topic.
//! A record the producer's queue cannot take yet waits here, in order, and
//! is offered again; nothing is dropped.
//!
//! A record the client refuses or the broker rejects for good is retried
//! `max_retries` times with a doubling backoff, aside from the queue so it
//! blocks nothing; then it goes to the dead-letter topic as an
//! `undeliverable` letter naming its source record (its offset is committed
//! once the letter is durable). A dead letter that fails every retry too
//! stops the job ([`SharedState::set_fatal`]). Failures are logged at most
//! once a second, with a count of the lines suppressed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::events::KafkaEvent;
use super::ratelimit::LogLimiter;
use super::shared::{FailedOutput, SharedState};
use super::{DeadLetter, OutputProducer, RecordId, SendError, WireResponse};
use crate::records::{Answer, SourcePosition};
use crate::sink::{Sink, SinkError};

/// Why a record was not taken by [`Produce::send`].
#[derive(Debug)]
pub enum Refused {
    /// The local queue is full: offer it again once it drains.
    QueueFull,
    /// Refused by the client (invalid topic, message too large, ...).
    Error(String),
}

/// What the queue sends through: the job's [`OutputProducer`], or a fault
/// injector in tests. Delivery reports reach [`SharedState::on_delivery`].
pub trait Produce {
    fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        source: RecordId,
    ) -> Result<(), Refused>;
}

impl Produce for OutputProducer {
    fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        source: RecordId,
    ) -> Result<(), Refused> {
        OutputProducer::send(self, topic, key, payload, source).map_err(|e| match e {
            SendError::QueueFull => Refused::QueueFull,
            SendError::Client(e) => Refused::Error(e.to_string()),
        })
    }
}

/// Topics and retry policy of a [`KafkaSink`].
#[derive(Clone, Debug)]
pub struct SinkSettings {
    pub request_topic: String,
    pub response_topic: String,
    pub dead_letter_topic: String,
    /// Retries of an output that failed for good before it is dead-lettered.
    pub max_retries: u32,
    /// Wait before the first retry; doubles with each one (capped at 10 s).
    pub retry_backoff: Duration,
}

#[derive(Debug)]
struct Pending {
    topic: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    source: RecordId,
}

#[allow(missing_debug_implementations)] // holds the producer
pub struct KafkaSink<P: Produce = OutputProducer> {
    producer: Arc<P>,
    shared: Arc<SharedState>,
    settings: SinkSettings,
    unsent: VecDeque<Pending>,
    /// Outputs that failed, each waiting for its next attempt.
    backoff: Vec<(Instant, Pending)>,
    failure_log: LogLimiter,
}

/// The request topic and record an answer belongs to.
fn record_id(position: &SourcePosition) -> Option<(&str, RecordId)> {
    match position {
        SourcePosition::Kafka {
            topic,
            partition,
            offset,
        } => Some((
            topic,
            RecordId {
                partition: *partition,
                offset: *offset,
            },
        )),
        SourcePosition::Parquet { .. } => None,
    }
}

impl<P: Produce> KafkaSink<P> {
    pub fn new(producer: Arc<P>, shared: Arc<SharedState>, settings: SinkSettings) -> Self {
        Self {
            producer,
            shared,
            settings,
            unsent: VecDeque::new(),
            backoff: Vec::new(),
            failure_log: LogLimiter::default(),
        }
    }

    /// Turns an answer into a response record (or an error record) on the
    /// response topic and sends it. An answer to a request that did not
    /// come from Kafka has no record to acknowledge and is skipped.
    pub fn answer(&mut self, answer: Answer) {
        let response = match answer {
            Answer::Response { row, origin } => {
                let Some((topic, source)) = record_id(&origin.position) else {
                    return;
                };
                KafkaEvent::Answered {
                    recovered_late: origin.recovered_late,
                }
                .emit(&self.shared.counters);
                let latency_ms = row.latency_ms;
                WireResponse::ranking(
                    source,
                    row.req_id,
                    row.items,
                    &row.scores,
                    row.model_version,
                )
                .timed(row.node, origin.ts_ms, to_microseconds(latency_ms))
                .requested_on(topic)
            }
            Answer::Error {
                row,
                kind,
                origin,
                latency_ms,
            } => {
                let Some((topic, source)) = record_id(&origin.position) else {
                    return;
                };
                KafkaEvent::ErrorAnswered {
                    kind: kind.as_str(),
                }
                .emit(&self.shared.counters);
                let req_id = row.req_id.unwrap_or_default();
                WireResponse::failed(source, req_id, kind.as_str(), row.reason)
                    .timed(0, origin.ts_ms, to_microseconds(latency_ms))
                    .requested_on(topic)
            }
        };
        let mut response = response;
        response.sent_ts_ms = self.shared.take_clamped(response.source());
        let payload = serde_json::to_vec(&response).expect("responses serialize");
        let key = response.req_id.to_string().into_bytes();
        let topic = self.settings.response_topic.clone();
        self.send(topic, Some(key), payload, response.source());
    }

    /// Sends one record, or keeps it for [`KafkaSink::retry`].
    pub fn send(
        &mut self,
        topic: String,
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        source: RecordId,
    ) {
        self.unsent.push_back(Pending {
            topic,
            key,
            payload,
            source,
        });
        self.retry();
    }

    /// Offers waiting records to the producer again, plus any the producer
    /// gave up on. Returns how many still wait (queued or backing off).
    pub fn retry(&mut self) -> usize {
        self.retry_at(Instant::now())
    }

    /// [`KafkaSink::retry`] at `now` (tests drive the clock).
    pub fn retry_at(&mut self, now: Instant) -> usize {
        for FailedOutput {
            source,
            topic,
            key,
            payload,
            error,
        } in self.shared.take_failed()
        {
            let p = Pending {
                topic,
                key,
                payload,
                source,
            };
            self.failed(p, &error, now);
        }
        if !self.backoff.is_empty() {
            let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.backoff)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            self.backoff = wait;
            for (_, p) in due {
                KafkaEvent::Resent.emit(&self.shared.counters);
                self.unsent.push_back(p);
            }
        }
        while let Some(p) = self.unsent.front() {
            if self.shared.is_fatal() {
                break;
            }
            match self
                .producer
                .send(&p.topic, p.key.as_deref(), &p.payload, p.source)
            {
                Ok(()) => {
                    self.unsent.pop_front();
                }
                Err(Refused::QueueFull) => break,
                Err(Refused::Error(e)) => {
                    // Often temporary (a topic error right after a failed
                    // batch), sometimes not (an invalid topic name): set it
                    // aside so it blocks nothing behind it.
                    let p = self.unsent.pop_front().expect("front exists");
                    self.failed(p, &e, now);
                }
            }
        }
        self.waiting()
    }

    /// An attempt of `p` failed: retry later, dead-letter it, or stop.
    fn failed(&mut self, p: Pending, error: &str, now: Instant) {
        KafkaEvent::ProduceFailed {
            topic: &p.topic,
            error,
        }
        .emit(&self.shared.counters);
        let failures = self.shared.note_failure(p.source);
        let max = self.settings.max_retries;
        let retry = failures <= max;
        if let Some(suppressed) = self.failure_log.admit(now) {
            tracing::error!(
                topic = %p.topic,
                partition = p.source.partition,
                offset = p.source.offset,
                failures,
                max_retries = max,
                suppressed,
                %error,
                "cannot produce; {}",
                if retry { "will retry" } else { "giving up" }
            );
        }
        if retry {
            let shift = (failures - 1).min(16);
            let wait = self
                .settings
                .retry_backoff
                .checked_mul(1u32 << shift)
                .map_or(MAX_BACKOFF, |w| w.min(MAX_BACKOFF));
            self.backoff.push((now + wait, p));
        } else if p.topic != self.settings.dead_letter_topic {
            self.shared.clear_failures(p.source);
            KafkaEvent::Undeliverable {
                topic: &p.topic,
                error,
            }
            .emit(&self.shared.counters);
            let letter = undeliverable(&self.settings.request_topic, &p, error, failures);
            let body = serde_json::to_vec(&letter).expect("dead letters serialize");
            self.unsent.push_back(Pending {
                topic: self.settings.dead_letter_topic.clone(),
                key: None,
                payload: body,
                source: p.source,
            });
        } else {
            self.shared.set_fatal(format!(
                "cannot write to the dead-letter topic `{}` after {failures} attempts \
                 (source record {}[{}] offset {}): {error}",
                p.topic, self.settings.request_topic, p.source.partition, p.source.offset
            ));
        }
    }

    /// Outputs not yet taken by the producer (queued or backing off).
    pub fn waiting(&self) -> usize {
        self.unsent.len() + self.backoff.len()
    }
}

impl<P: Produce> Sink<Answer> for KafkaSink<P> {
    /// Never fails: what the producer cannot take yet waits here, what the
    /// broker refuses is retried, then dead-lettered (see the module).
    fn write(&mut self, answers: Vec<Answer>) -> Result<(), SinkError> {
        for a in answers {
            self.answer(a);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<usize, SinkError> {
        Ok(self.retry())
    }
}

/// Milliseconds rounded to whole microseconds, as the wire carries them.
fn to_microseconds(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// Longest wait between two attempts of one output.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The dead letter of an output that could not be delivered: it names the
/// source record (topic, partition, offset) and carries the output's head.
fn undeliverable(request_topic: &str, p: &Pending, error: &str, failures: u32) -> DeadLetter {
    let head = &p.payload[..p.payload.len().min(UNDELIVERABLE_HEAD_BYTES)];
    DeadLetter {
        kind: "undeliverable".into(),
        reason: format!("output to `{}` failed {failures} times: {error}", p.topic),
        topic: request_topic.to_string(),
        partition: p.source.partition,
        offset: p.source.offset,
        payload_bytes: p.payload.len(),
        payload_head: String::from_utf8_lossy(head).into_owned(),
    }
}

/// Bytes of an undeliverable output kept in its dead letter.
const UNDELIVERABLE_HEAD_BYTES: usize = 1024;

#[cfg(test)]
mod tests {
    //! Fault injection: a producer that refuses or fails chosen records,
    //! with delivery reports handed to the real [`SharedState`] the way the
    //! rdkafka delivery thread does. (The real producer against a broker
    //! that fails: tests/serve_mock_faults.rs.)

    use std::sync::Mutex;
    use std::sync::atomic::Ordering;

    use crate::kafka::Delivery;

    use super::*;

    const REQUESTS: &str = "req";
    const RESPONSES: &str = "resp";
    const LETTERS: &str = "dead";

    /// How a record on a topic fails.
    #[derive(Clone, Copy, PartialEq)]
    enum Fault {
        /// `send` refuses it (an invalid topic, a message too large).
        Refuse,
        /// Taken, then reported failed (TOPIC_AUTHORIZATION_FAILED, ...).
        FailLater,
    }

    #[derive(Default)]
    struct FaultyProducer {
        /// (topic, source offset or None for all, fault)
        faults: Vec<(&'static str, Option<i64>, Fault)>,
        /// Every record taken by `send`, in order, not yet reported.
        taken: Mutex<Vec<(String, Vec<u8>, RecordId)>>,
        /// Every attempt: (topic, source offset).
        attempts: Mutex<Vec<(String, i64)>>,
        delivered: Mutex<Vec<(String, Vec<u8>, RecordId)>>,
    }

    impl FaultyProducer {
        fn fault(&self, topic: &str, source: RecordId) -> Option<Fault> {
            self.faults
                .iter()
                .find(|(t, o, _)| *t == topic && o.is_none_or(|o| o == source.offset))
                .map(|f| f.2)
        }

        /// The broker answers everything taken so far.
        fn report(&self, shared: &SharedState) {
            for (topic, payload, source) in std::mem::take(&mut *self.taken.lock().unwrap()) {
                if self.fault(&topic, source) == Some(Fault::FailLater) {
                    shared.on_delivery(Delivery::Failed {
                        source,
                        topic,
                        key: None,
                        payload,
                        error: "Broker: Topic authorization failed".into(),
                    });
                } else {
                    self.delivered
                        .lock()
                        .unwrap()
                        .push((topic, payload, source));
                    shared.on_delivery(Delivery::Delivered { source });
                }
            }
        }

        fn attempts(&self, topic: &str, offset: i64) -> usize {
            let a = self.attempts.lock().unwrap();
            a.iter().filter(|(t, o)| t == topic && *o == offset).count()
        }
    }

    impl Produce for FaultyProducer {
        fn send(
            &self,
            topic: &str,
            _key: Option<&[u8]>,
            payload: &[u8],
            source: RecordId,
        ) -> Result<(), Refused> {
            self.attempts
                .lock()
                .unwrap()
                .push((topic.to_string(), source.offset));
            if self.fault(topic, source) == Some(Fault::Refuse) {
                return Err(Refused::Error("Message size too large".into()));
            }
            self.taken
                .lock()
                .unwrap()
                .push((topic.to_string(), payload.to_vec(), source));
            Ok(())
        }
    }

    const RETRIES: u32 = 3;
    const BACKOFF: Duration = Duration::from_millis(100);

    /// Three consumed requests (offsets 0..3 of partition 0), each answered.
    fn setup(
        faults: Vec<(&'static str, Option<i64>, Fault)>,
    ) -> (
        Arc<FaultyProducer>,
        Arc<SharedState>,
        KafkaSink<FaultyProducer>,
    ) {
        let shared = Arc::new(SharedState::new(REQUESTS, 1));
        {
            let mut book = shared.book(0).lock().unwrap();
            book.resume(0, 0);
            for o in 0..3 {
                book.consume(0, o).unwrap();
            }
        }
        let producer = Arc::new(FaultyProducer {
            faults,
            ..FaultyProducer::default()
        });
        let queue = KafkaSink::new(
            producer.clone(),
            shared.clone(),
            SinkSettings {
                request_topic: REQUESTS.into(),
                response_topic: RESPONSES.into(),
                dead_letter_topic: LETTERS.into(),
                max_retries: RETRIES,
                retry_backoff: BACKOFF,
            },
        );
        (producer, shared, queue)
    }

    fn answer_all(queue: &mut KafkaSink<FaultyProducer>) {
        for offset in 0..3 {
            let source = RecordId {
                partition: 0,
                offset,
            };
            let body = format!(r#"{{"req_id":{offset},"items":[1,2]}}"#).into_bytes();
            queue.send(RESPONSES.into(), Some(b"k".to_vec()), body, source);
        }
    }

    /// Runs the queue for `steps` ticks of 50 ms of a simulated clock.
    fn run(
        queue: &mut KafkaSink<FaultyProducer>,
        producer: &FaultyProducer,
        shared: &SharedState,
        t0: Instant,
        steps: u32,
    ) -> usize {
        let mut waiting = 0;
        for i in 0..steps {
            producer.report(shared);
            waiting = queue.retry_at(t0 + Duration::from_millis(50) * i);
        }
        producer.report(shared);
        waiting
    }

    fn safe_commit(shared: &SharedState) -> i64 {
        shared
            .book(0)
            .lock()
            .unwrap()
            .partition(0)
            .unwrap()
            .safe_commit()
    }

    fn letters(producer: &FaultyProducer) -> Vec<DeadLetter> {
        producer
            .delivered
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, _)| t == LETTERS)
            .map(|(_, p, _)| serde_json::from_slice(p).unwrap())
            .collect()
    }

    fn check_dead_lettered(producer: &FaultyProducer, shared: &SharedState) {
        // One first attempt and RETRIES retries, then the dead letter.
        assert_eq!(producer.attempts(RESPONSES, 1), 1 + RETRIES as usize);
        let letters = letters(producer);
        assert_eq!(letters.len(), 1, "{letters:?}");
        let l = &letters[0];
        assert_eq!(l.kind, "undeliverable");
        assert_eq!((l.topic.as_str(), l.partition, l.offset), (REQUESTS, 0, 1));
        assert!(l.payload_head.starts_with(r#"{"req_id":1,"#), "{l:?}");
        assert!(
            l.reason.contains(RESPONSES) && l.reason.contains("4 times"),
            "{l:?}"
        );
        // The others were delivered, nothing is left, every offset commits.
        let delivered = producer.delivered.lock().unwrap();
        let answered: Vec<i64> = delivered
            .iter()
            .filter(|(t, _, _)| t == RESPONSES)
            .map(|(_, _, s)| s.offset)
            .collect();
        assert_eq!(answered, vec![0, 2]);
        assert_eq!(safe_commit(shared), 3);
        assert_eq!(shared.counters.undeliverable.load(Ordering::Relaxed), 1);
        assert_eq!(
            shared.counters.produce_failures.load(Ordering::Relaxed),
            1 + RETRIES as u64
        );
        assert!(!shared.is_fatal());
    }

    #[test]
    fn a_response_the_broker_fails_for_good_is_dead_lettered_after_bounded_retries() {
        let (producer, shared, mut queue) = setup(vec![(RESPONSES, Some(1), Fault::FailLater)]);
        let t0 = Instant::now();
        answer_all(&mut queue);
        producer.report(&shared);
        // The failure is picked up, and not retried before its backoff.
        assert_eq!(queue.retry_at(t0), 1);
        assert_eq!(queue.retry_at(t0 + BACKOFF / 2), 1);
        assert_eq!(producer.attempts(RESPONSES, 1), 1);
        assert_eq!(queue.retry_at(t0 + BACKOFF), 0);
        assert_eq!(producer.attempts(RESPONSES, 1), 2);
        // 100 + 200 + 400 ms of backoff, then the dead letter.
        assert_eq!(run(&mut queue, &producer, &shared, t0 + BACKOFF, 40), 0);
        check_dead_lettered(&producer, &shared);
    }

    #[test]
    fn a_response_the_client_refuses_blocks_nothing_and_is_dead_lettered() {
        let (producer, shared, mut queue) = setup(vec![(RESPONSES, Some(1), Fault::Refuse)]);
        let t0 = Instant::now();
        answer_all(&mut queue);
        // The refused record waits aside: the one behind it went out.
        assert_eq!(producer.attempts(RESPONSES, 2), 1);
        assert_eq!(queue.waiting(), 1);
        assert_eq!(run(&mut queue, &producer, &shared, t0, 40), 0);
        check_dead_lettered(&producer, &shared);
    }

    #[test]
    fn a_dead_letter_that_fails_too_stops_the_job_and_its_offset_stays_uncommitted() {
        let (producer, shared, mut queue) = setup(vec![
            (RESPONSES, Some(1), Fault::FailLater),
            (LETTERS, None, Fault::Refuse),
        ]);
        let t0 = Instant::now();
        answer_all(&mut queue);
        run(&mut queue, &producer, &shared, t0, 80);
        let reason = shared.fatal().expect("the job must stop");
        assert!(
            reason.contains(&format!("dead-letter topic `{LETTERS}`")),
            "{reason}"
        );
        assert!(reason.contains("offset 1"), "{reason}");
        assert_eq!(producer.attempts(LETTERS, 1), 1 + RETRIES as usize);
        // Offset 1 has no durable answer: the commit stops before it.
        assert_eq!(safe_commit(&shared), 1);
        assert!(letters(&producer).is_empty());
        // Once stopped, nothing more is offered.
        let before = producer.attempts.lock().unwrap().len();
        queue.send(
            RESPONSES.into(),
            None,
            b"{}".to_vec(),
            RecordId {
                partition: 0,
                offset: 2,
            },
        );
        assert_eq!(producer.attempts.lock().unwrap().len(), before);
    }

    fn origin(position: SourcePosition) -> crate::records::Origin {
        crate::records::Origin {
            position,
            ts_ms: 42,
            admitted_ns: 0,
            recovered_late: false,
            mode: grflow_traces::Mode::Rank,
        }
    }

    #[test]
    fn answers_become_response_records_keyed_by_req_id_through_the_sink_trait() {
        use crate::records::{Answer, ErrorKind, ErrorRow, ResponseRow};
        let (producer, shared, mut queue) = setup(Vec::new());
        let kafka = |offset| SourcePosition::Kafka {
            topic: REQUESTS.into(),
            partition: 0,
            offset,
        };
        let ranked = Answer::Response {
            row: ResponseRow {
                req_id: 7,
                node: 3,
                prefix: "user".into(),
                items: vec![5, 9],
                scores: vec![0.5, 0.25],
                latency_ms: 1.234_567,
                model_version: "v1".into(),
                history_len: 0,
                kv_reused_tokens: 0,
            },
            origin: origin(kafka(0)),
        };
        let shed = Answer::Error {
            row: ErrorRow {
                position: "req[0]@1".into(),
                reason: "deadline".into(),
                req_id: Some(8),
            },
            kind: ErrorKind::Shed,
            origin: origin(kafka(1)),
            latency_ms: 31.0,
        };
        // From a Parquet trace: nothing to acknowledge, nothing written.
        let parquet = Answer::Response {
            row: match &ranked {
                Answer::Response { row, .. } => row.clone(),
                Answer::Error { .. } => unreachable!(),
            },
            origin: origin(SourcePosition::Parquet {
                file: "t".into(),
                row_group: 0,
                row: 0,
            }),
        };
        Sink::write(&mut queue, vec![ranked, shed, parquet]).unwrap();
        assert_eq!(Sink::flush(&mut queue).unwrap(), 0);
        producer.report(&shared);
        let delivered = producer.delivered.lock().unwrap();
        let wire: Vec<WireResponse> = delivered
            .iter()
            .map(|(t, p, _)| {
                assert_eq!(t, RESPONSES);
                serde_json::from_slice(p).unwrap()
            })
            .collect();
        assert_eq!(wire.len(), 2, "{wire:?}");
        assert_eq!((wire[0].req_id, wire[0].node, wire[0].ts_ms), (7, 3, 42));
        assert_eq!(wire[0].items, vec![5, 9]);
        assert_eq!(wire[0].latency_ms, 1.235, "rounded to microseconds");
        assert!(wire[0].error.is_none());
        assert_eq!(wire[1].req_id, 8);
        assert_eq!(wire[1].error.as_ref().unwrap().kind, "shed");
        // Each names its request record, topic included (the restart scan).
        for (w, offset) in wire.iter().zip(0..) {
            assert_eq!(
                (w.topic.as_str(), w.partition, w.offset),
                (REQUESTS, 0, offset)
            );
        }
        // Both answers are durable: both offsets commit.
        assert_eq!(safe_commit(&shared), 2);
        assert_eq!(shared.counters.responses.load(Ordering::Relaxed), 1);
        assert_eq!(shared.counters.shed.load(Ordering::Relaxed), 1);
    }
}
