//! One worker's Kafka request source: polls its partitions, skips records
//! already consumed or answered, dead-letters what cannot be decoded
//! (through the worker's [`KafkaSink`]), turns the rest into requests,
//! tracks event time, pauses reads when too many requests are in flight,
//! and commits offsets whose answers are durable.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use grflow_traces::Request;

use super::clock::{Entry, PartitionClock, entry_time};
use super::events::KafkaEvent;
use super::lag::LagChange;
use super::limits::ServedLimits;
use super::ratelimit::LogLimiter;
use super::shared::SharedState;
use super::sink::KafkaSink;
use super::{
    Admission, AnsweredRequest, DeadLetter, DecodeLimits, History, RawRecord, RecordId,
    RequestConsumer, WireError, WireRequest, decode_request_within, owned_partitions,
};
use crate::error::SourceError;
use crate::records::{SourcePosition, wall_ms};
use crate::source::{Polled, RequestSource, SourceRecord, SourceState};

/// Settings of a [`KafkaSource`].
#[derive(Clone, Debug)]
pub struct SourceSettings {
    pub request_topic: String,
    pub dead_letter_topic: String,
    pub max_in_flight: usize,
    /// Per worker: tokens of unanswered requests before reads pause.
    pub max_in_flight_tokens: u64,
    pub max_message_bytes: usize,
    /// `model.max_candidates`: more is a `too_many_candidates` dead letter.
    pub max_candidates: usize,
    /// Inline histories keep their most recent items that the nodes serve:
    /// the limits of the models they serve now, read once per poll (a hot
    /// model swap changes them; [`ServedLimits`]).
    pub history: ServedLimits,
    pub idle_timeout: Duration,
    pub max_skew_ms: u64,
    /// A request stamped further than this ahead of both the wall clock
    /// and the job's event time is served at the current event time.
    pub max_future_ms: u64,
    /// How many recent `req_id`s the process's workers remember together
    /// to count a request that repeats one (`repeated_req_ids`); 0 = none.
    pub repeat_window: usize,
    pub commit_interval: Duration,
}

#[allow(missing_debug_implementations)] // holds the consumer
pub struct KafkaSource {
    worker: usize,
    consumer: RequestConsumer,
    settings: SourceSettings,
    shared: Arc<SharedState>,
    /// Where dead letters go: the worker's sink (one producer queue).
    dead_letters: Rc<RefCell<KafkaSink>>,
    clock: PartitionClock,
    /// Request records the response topic already answers (restart scan).
    answered: RestartAnswers,
    last_commit: Instant,
    clamp_log: LogLimiter,
    /// Rate-limits the warnings about repeated `req_id`s (the ids
    /// themselves are remembered in [`SharedState`]).
    repeat_log: LogLimiter,
    /// Rate-limits client errors while polling (a broker away for hours
    /// repeats the same error every second or two).
    poll_error_log: LogLimiter,
    /// The request topic's partition count this source has taken its
    /// partitions from (see [`SharedState::saw_partitions`]).
    known_partitions: i32,
    /// After a failed attempt to add new partitions, when to try again.
    adopt_retry_at: Option<Instant>,
    /// The consumer calls back when records arrive (see
    /// [`KafkaSource::wake_on_arrival`]).
    wakes: bool,
    /// The last poll emptied the consumer's queue.
    drained: bool,
}

/// How soon an idle source polls again when nothing would wake it.
pub const IDLE_POLL: Duration = Duration::from_millis(1);
/// How soon a quiet source polls again (see [`idle_poll`]): for event
/// time, partitions created meanwhile and commits; records wake it at once.
pub const QUIET_POLL: Duration = Duration::from_millis(100);

/// How long a source that found nothing to read may wait before polling
/// again. Quiet (the consumer wakes it when records arrive, its queue is
/// empty and no request is unanswered): [`QUIET_POLL`]. Otherwise
/// [`IDLE_POLL`]: paused reads wait for answers, and while requests are in
/// flight, event time and the partitions' idle timeouts move with each poll.
/// `in_flight` is asked last: it locks every worker's offset book.
pub fn idle_poll(wakes: bool, drained: bool, in_flight: impl FnOnce() -> usize) -> Duration {
    if wakes && drained && in_flight() == 0 {
        QUIET_POLL
    } else {
        IDLE_POLL
    }
}

/// Polls that found the queue non-empty after a `None` (an event that is
/// not a record, handled): looked at again at most this often per poll.
const MAX_REQUEUED: usize = 64;

/// The smallest partition count under which `opened` are all partitions.
/// Not the shared count: the broker watcher may have raised it between the
/// consumer's opening and now, and partitions counted there but not opened
/// would never be read. Under-counting is harmless: adopting skips the
/// partitions the consumer reads already.
fn opened_count(opened: &[i32]) -> i32 {
    opened.iter().max().map_or(0, |&p| p + 1)
}

/// How long adding a partition created while the job runs may wait on the
/// broker (committed offset, log end); on failure it is tried again.
const ADD_PARTITION_TIMEOUT: Duration = Duration::from_secs(5);
const ADD_PARTITION_RETRY: Duration = Duration::from_secs(5);

impl SourceSettings {
    /// What a request is decoded within now: the served models' history
    /// limits are read here, once per poll.
    pub fn decode_limits(&self) -> DecodeLimits {
        DecodeLimits {
            max_message_bytes: self.max_message_bytes,
            max_candidates: self.max_candidates,
            history: self.history.current(),
        }
    }
}

impl KafkaSource {
    /// Worker `worker`'s source over `consumer`'s partitions; `answered`
    /// are the requests the response topic already answers (restart scan).
    pub fn new(
        worker: usize,
        consumer: RequestConsumer,
        settings: SourceSettings,
        shared: Arc<SharedState>,
        dead_letters: Rc<RefCell<KafkaSink>>,
        answered: HashSet<AnsweredRequest>,
    ) -> Self {
        let clock = PartitionClock::new(
            consumer.partitions(),
            settings.idle_timeout,
            settings.max_skew_ms,
        );
        let known_partitions = opened_count(consumer.partitions());
        Self {
            worker,
            consumer,
            settings,
            shared,
            dead_letters,
            clock,
            answered: RestartAnswers::new(answered),
            last_commit: Instant::now(),
            clamp_log: LogLimiter::default(),
            repeat_log: LogLimiter::default(),
            poll_error_log: LogLimiter::new(super::client_logs::EVERY),
            known_partitions,
            adopt_retry_at: None,
            wakes: false,
            drained: false,
        }
    }

    /// Calls `wake` from a client thread when records arrive while the
    /// source is idle, so that its operator can sleep (see [`idle_poll`]).
    /// `wake` must only schedule the poll, not poll.
    pub fn wake_on_arrival(&mut self, wake: impl Fn() + Send + Sync + 'static) {
        self.consumer.wake_on_arrival(wake);
        self.wakes = true;
    }

    /// How long to wait before polling again after a poll that was not
    /// `Ready` (see [`idle_poll`]).
    pub fn idle_poll(&self) -> Duration {
        idle_poll(self.wakes, self.drained, || self.shared.in_flight())
    }

    /// Starts reading the partitions this worker owns among those created
    /// since it last looked. A failure is logged and tried again 5 s later.
    fn adopt_new_partitions(&mut self, now: Instant) {
        let seen = self.shared.partitions.load(Ordering::Relaxed);
        if seen <= self.known_partitions || self.adopt_retry_at.is_some_and(|at| now < at) {
            return;
        }
        let topic = self.shared.request_topic().to_string();
        let workers = self.shared.workers();
        let owned: Vec<i32> = owned_partitions(&topic, seen, self.worker, workers)
            .into_iter()
            .filter(|&p| p >= self.known_partitions)
            .collect();
        match self.consumer.add_partitions(&owned, ADD_PARTITION_TIMEOUT) {
            Ok(resumed) => {
                let mut book = self
                    .shared
                    .book(self.worker)
                    .lock()
                    .expect("offset book lock");
                for r in &resumed {
                    book.register(r);
                    tracing::info!(
                        worker = self.worker,
                        topic,
                        partition = r.partition,
                        offset = r.offset,
                        from_commit = r.from_commit,
                        "partition created while serving: reading it"
                    );
                }
                self.known_partitions = seen;
                self.adopt_retry_at = None;
            }
            Err(e) => {
                // Each try may wait on the broker: not at every poll.
                self.adopt_retry_at = Some(now + ADD_PARTITION_RETRY);
                tracing::warn!(
                    worker = self.worker,
                    topic,
                    partitions = ?owned,
                    error = %e,
                    "could not start reading new partitions; trying again"
                )
            }
        }
    }

    /// Reads up to `max` records without blocking, at `now`. `emit_floor`
    /// is the earliest time the caller can still emit at: a request older
    /// than that is late and enters at `emit_floor`. The watermark is the
    /// earliest event time this worker may still emit; the state is `Idle`
    /// once the consumer has nothing more to give right now.
    pub fn poll_at(&mut self, max: usize, now: Instant, emit_floor: u64) -> Polled {
        self.adopt_new_partitions(now);
        self.apply_backpressure();
        let mut records = Vec::new();
        let mut state = SourceState::Ready;
        let mut drained = false;
        let mut requeued = 0;
        let wall = wall_ms();
        let limits = self.settings.decode_limits();
        if !self.consumer.is_paused() {
            while records.len() < max {
                match self.consumer.poll(Duration::ZERO) {
                    None if requeued < MAX_REQUEUED && self.consumer.has_queued() => {
                        requeued += 1;
                    }
                    None => {
                        // Empty: the next record turns the queue non-empty
                        // and wakes the source.
                        drained = true;
                        state = SourceState::Idle;
                        break;
                    }
                    Some(Err(e)) => {
                        // Transient client errors (broker down, ...): librdkafka
                        // reconnects by itself; say so and keep going.
                        KafkaEvent::ReadFailed.emit(&self.shared.counters);
                        if let Some(suppressed) = self.poll_error_log.admit(now) {
                            tracing::warn!(
                                worker = self.worker,
                                error = %e,
                                "request consumer{}",
                                super::client_logs::more(suppressed)
                            );
                        }
                        state = SourceState::Idle;
                        break;
                    }
                    Some(Ok(record)) => {
                        if let Some(r) = self.admit(record, &limits, now, emit_floor, wall) {
                            records.push(r);
                        }
                        // Checked per record: one poll may bring hundreds.
                        self.apply_backpressure();
                        if self.consumer.is_paused() {
                            state = SourceState::Idle;
                            break;
                        }
                    }
                }
            }
        } else {
            state = SourceState::Idle;
        }
        self.drained = drained;
        let newest = self.shared.counters.newest_event_ms.load(Ordering::Relaxed);
        let watermark_ms = self.clock.frontier(now, self.consumer.is_paused(), newest);
        if now.duration_since(self.last_commit) >= self.settings.commit_interval {
            self.commit(false);
            self.last_commit = now;
        }
        Polled {
            records,
            watermark_ms,
            state,
        }
    }

    fn admit(
        &mut self,
        record: RawRecord,
        limits: &DecodeLimits,
        now: Instant,
        emit_floor: u64,
        wall_ms: u64,
    ) -> Option<SourceRecord> {
        let source = RecordId {
            partition: record.partition,
            offset: record.offset,
        };
        KafkaEvent::Read {
            partition: source.partition,
            offset: source.offset,
        }
        .emit(&self.shared.counters);
        if !self.admitted(source) {
            return None;
        }
        let payload = record.payload.unwrap_or_default();
        match decode_request_within(&payload, limits) {
            Ok(wire) => self.request(source, wire, now, emit_floor, wall_ms),
            Err(error) => {
                self.dead_letter(source, &error, &payload);
                None
            }
        }
    }

    /// Whether the offset book takes the record at `source` (new, past a
    /// gap, or after the log started over, each said); a duplicate, or a
    /// position the book cannot place, is skipped.
    fn admitted(&mut self, source: RecordId) -> bool {
        let RecordId { partition, offset } = source;
        let counters = &self.shared.counters;
        let consumer = &self.consumer;
        let admission = self
            .shared
            .book(self.worker)
            .lock()
            .expect("offset book lock")
            .consume_checked(partition, offset, || consumer.log_end(partition));
        match admission {
            Ok(Admission::New) => {}
            Ok(Admission::AfterLogReset {
                read_up_to,
                log_end,
            }) => {
                self.consumer.log_started_over(partition);
                KafkaEvent::LogReset {
                    topic: &self.settings.request_topic,
                    partition,
                    offset,
                    read_up_to,
                    log_end,
                }
                .emit(counters)
            }
            Ok(Admission::NewAfterGap { first, last }) => KafkaEvent::OffsetGap {
                partition,
                first,
                last,
            }
            .emit(counters),
            Ok(Admission::Duplicate) => {
                KafkaEvent::Duplicate { partition, offset }.emit(counters);
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "skipping record");
                return false;
            }
        }
        true
    }

    /// A decoded request: skipped when the response topic answered it
    /// before a restart, otherwise entered at its event time and weighed
    /// (in tokens) in the offset book.
    fn request(
        &mut self,
        source: RecordId,
        wire: WireRequest,
        now: Instant,
        emit_floor: u64,
        wall_ms: u64,
    ) -> Option<SourceRecord> {
        if self.skip_answered(source, wire.req_id) {
            return None;
        }
        self.note_repeat(source, wire.req_id, now);
        if wire.history_dropped > 0 {
            KafkaEvent::HistoryTruncated {
                partition: source.partition,
                offset: source.offset,
            }
            .emit(&self.shared.counters);
        }
        let entry = self.entry(source, wire.ts_ms, now, emit_floor, wall_ms);
        // A clamped request carries the time it is served at, which the
        // response's `ts_ms` reports; a late one keeps its own.
        let ts_ms = match entry {
            Entry::Clamped(at) => at,
            Entry::OnTime(_) | Entry::Late(_) => wire.ts_ms,
        };
        let history_cut = wire.history_dropped > 0;
        let (hist_len, inline_history) = match wire.history {
            History::Prefix(n) => (n, None),
            History::Inline(items) => (items.len() as u32, Some(items)),
        };
        // The router's count: history, candidates, instruction.
        let tokens = hist_len as u64 + wire.candidates.len() as u64 + 1;
        self.shared
            .book(self.worker)
            .lock()
            .expect("offset book lock")
            .weigh(source.partition, source.offset, tokens);
        Some(SourceRecord::Request {
            request: Request {
                ts_ms,
                req_id: wire.req_id,
                user_id: wire.user_id,
                hist_len,
                candidates: wire.candidates,
                mode: wire.mode,
                label: None,
            },
            position: SourcePosition::Kafka {
                topic: self.settings.request_topic.clone(),
                partition: source.partition,
                offset: source.offset,
            },
            inline_history,
            recovered: self.consumer.is_recovered(source.partition, source.offset),
            history_cut,
        })
    }

    /// When a request stamped `ts_ms` enters. Event time tracks the time
    /// the request enters at, so a late request is released like any
    /// other (counted late). A stamp too far in the future (a typo,
    /// microseconds) is served now and moves no watermark: one such
    /// request would otherwise make every later request late.
    fn entry(
        &mut self,
        source: RecordId,
        ts_ms: u64,
        now: Instant,
        emit_floor: u64,
        wall_ms: u64,
    ) -> Entry {
        let RecordId { partition, offset } = source;
        let counters = &self.shared.counters;
        let newest = counters.newest_event_ms.load(Ordering::Relaxed);
        let entry = entry_time(
            ts_ms,
            emit_floor,
            wall_ms,
            newest,
            self.settings.max_future_ms,
        );
        match entry {
            Entry::OnTime(_) => {}
            Entry::Late(_) => KafkaEvent::Late { partition, offset }.emit(counters),
            Entry::Clamped(_) => {
                self.shared.note_clamped(source, ts_ms);
                KafkaEvent::Clamped {
                    partition,
                    offset,
                    ts_ms,
                }
                .emit(counters);
                if let Some(suppressed) = self.clamp_log.admit(now) {
                    tracing::warn!(
                        partition,
                        offset,
                        ts_ms,
                        served_at = entry.at(),
                        max_future_ms = self.settings.max_future_ms,
                        suppressed,
                        "field `ts_ms` is too far ahead of the wall clock and the job's \
                         event time: served at the current event time (clamped_ts)"
                    );
                }
            }
        }
        if !matches!(entry, Entry::Clamped(_)) {
            let enters_at = entry.at();
            self.clock.observe(partition, enters_at, now);
            counters
                .newest_event_ms
                .fetch_max(enters_at, Ordering::Relaxed);
        }
        entry
    }

    /// A record that is not a request goes to the dead-letter topic, with
    /// why (the field and position), and is acked once that is durable.
    fn dead_letter(&mut self, source: RecordId, error: &WireError, payload: &[u8]) {
        KafkaEvent::DeadLettered {
            partition: source.partition,
            offset: source.offset,
            kind: error.kind(),
        }
        .emit(&self.shared.counters);
        let letter = DeadLetter::new(
            error,
            &self.settings.request_topic,
            source.partition,
            source.offset,
            payload,
        );
        let body = serde_json::to_vec(&letter).expect("dead letters serialize");
        self.dead_letters.borrow_mut().send(
            self.settings.dead_letter_topic.clone(),
            None,
            body,
            source,
        );
    }

    /// Whether the request at `source` was answered before a restart (same
    /// position and `req_id`): then its answer is durable, so the offset is
    /// acked for commit without answering again.
    fn skip_answered(&mut self, source: RecordId, req_id: u64) -> bool {
        match self.answered.take(source, req_id) {
            Restarted::Answered => {
                KafkaEvent::AlreadyAnswered {
                    partition: source.partition,
                    offset: source.offset,
                }
                .emit(&self.shared.counters);
                self.shared.ack(source);
                true
            }
            Restarted::Unanswered => false,
            Restarted::OtherRequest { answered_req_id } => {
                if !std::mem::replace(&mut self.answered.warned, true) {
                    tracing::warn!(
                        worker = self.worker,
                        topic = self.settings.request_topic,
                        partition = source.partition,
                        offset = source.offset,
                        req_id,
                        answered_req_id,
                        "the response topic answers another request at this position \
                         (the request topic was created again?): serving it; logged once"
                    );
                }
                false
            }
        }
    }

    /// Counts (and logs, rate-limited) a request whose `req_id` a recent
    /// request at another position carried. It is served all the same:
    /// the two may be different requests under one id, and dropping one
    /// would lose it.
    fn note_repeat(&mut self, source: RecordId, req_id: u64, now: Instant) {
        let window = self.settings.repeat_window;
        let first = match self.shared.observe_req_id(window, req_id, source) {
            // The offset book admits a position once, so the same record is
            // never seen here twice; were it, it would not be a repeat.
            Some(first) if first != source => first,
            _ => return,
        };
        KafkaEvent::RepeatedReqId {
            partition: source.partition,
            offset: source.offset,
        }
        .emit(&self.shared.counters);
        if let Some(suppressed) = self.repeat_log.admit(now) {
            tracing::warn!(
                topic = self.settings.request_topic,
                req_id,
                first_partition = first.partition,
                first_offset = first.offset,
                partition = source.partition,
                offset = source.offset,
                suppressed,
                "field `req_id` repeats a request read before (a producer retry?): \
                 served again, both answers carry the id (repeated_req_ids)"
            );
        }
    }

    /// Pauses reads at either in-flight cap (requests or their tokens);
    /// resumes once both drained to half. Called before each poll and after
    /// each record, so the request cap is never passed and the token cap by
    /// at most the last request's tokens (its weight is known only once it
    /// is decoded; a request heavier than the cap is admitted alone).
    fn apply_backpressure(&mut self) {
        let (in_flight, tokens) = {
            let book = self
                .shared
                .book(self.worker)
                .lock()
                .expect("offset book lock");
            (book.in_flight(), book.in_flight_tokens())
        };
        let paused = self.consumer.is_paused();
        let (max, max_tokens) = (
            self.settings.max_in_flight,
            self.settings.max_in_flight_tokens,
        );
        let want = if paused {
            in_flight > max / 2 || tokens > max_tokens / 2
        } else {
            in_flight >= max || tokens >= max_tokens
        };
        if want != paused {
            if want {
                KafkaEvent::Paused {
                    worker: self.worker,
                }
                .emit(&self.shared.counters);
            }
            self.consumer.set_paused(want);
        }
    }

    /// Commits what moved (periodically), or every partition's safe offset
    /// and waits for the broker (`final_commit`, at shutdown).
    pub fn commit(&mut self, final_commit: bool) -> Vec<(i32, i64)> {
        // Answers to earlier (asynchronous) commits, read while polling.
        self.note_refused_commits();
        let commits = {
            let mut book = self
                .shared
                .book(self.worker)
                .lock()
                .expect("offset book lock");
            if final_commit {
                book.safe_commits()
            } else {
                book.take_commits()
            }
        };
        if let Err(e) = self.consumer.commit(&commits, final_commit) {
            KafkaEvent::CommitFailed {
                worker: self.worker,
                error: &e.to_string(),
            }
            .emit(&self.shared.counters);
            self.shared
                .book(self.worker)
                .lock()
                .expect("offset book lock")
                .forget_commits();
            // Not committed: the summary must not say it is.
            return Vec::new();
        }
        commits
    }

    /// Commits every partition's safe offset (at shutdown) and waits at most
    /// `wait` for the broker: a coordinator that does not answer must not
    /// hold the shutdown past its drain deadline. Unanswered, the offsets
    /// stay at the last commit the broker took, which is safe (answers may
    /// be repeated at restart, none lost), and nothing is reported
    /// committed.
    pub fn commit_within(&mut self, wait: Duration) -> Vec<(i32, i64)> {
        self.note_refused_commits();
        let commits = self.safe_commits();
        let failed = match self.consumer.commit_and_wait(&commits, wait) {
            Ok(true) => false,
            Ok(false) => {
                tracing::warn!(
                    worker = self.worker,
                    wait_ms = wait.as_millis() as u64,
                    offsets = ?commits,
                    "the final offset commit was not answered in time: offsets stay at \
                     the last commit the broker took (answers may be repeated at \
                     restart, none are lost); not reported committed"
                );
                true
            }
            Err(e) => {
                KafkaEvent::CommitFailed {
                    worker: self.worker,
                    error: &e.to_string(),
                }
                .emit(&self.shared.counters);
                true
            }
        };
        if failed { Vec::new() } else { commits }
    }

    /// Closes the consumer within `wait` (see [`RequestConsumer::close`]).
    pub fn close(&mut self, wait: Duration) {
        if !self.consumer.close(wait) {
            tracing::warn!(
                worker = self.worker,
                wait_ms = wait.as_millis() as u64,
                "the request consumer did not close in time (a commit is still \
                 waiting for the broker): left open"
            );
        }
    }

    /// Every partition's offset below which every record is answered.
    fn safe_commits(&self) -> Vec<(i32, i64)> {
        self.shared
            .book(self.worker)
            .lock()
            .expect("offset book lock")
            .safe_commits()
    }

    /// Counts the commits the broker refused since the last look; the next
    /// commit then sends every partition's offset again.
    fn note_refused_commits(&mut self) {
        let refused = self.consumer.take_refused_commits();
        for error in &refused {
            KafkaEvent::CommitFailed {
                worker: self.worker,
                error,
            }
            .emit(&self.shared.counters);
        }
        if !refused.is_empty() {
            self.shared
                .book(self.worker)
                .lock()
                .expect("offset book lock")
                .forget_commits();
        }
    }

    /// Measures consumer lag of this worker's partitions into the shared
    /// table: the high watermark of the last fetch minus the next offset to
    /// consume (partitions not fetched from yet are left out). A reading
    /// that stops moving and that the broker does not answer for turns
    /// unknown after a bound instead of keeping its last value: the cached
    /// watermark freezes when fetches fail (see [`super::lag`]).
    pub fn measure_lag(&self) {
        self.measure_lag_at(Instant::now());
    }

    /// [`KafkaSource::measure_lag`] at `now`.
    pub fn measure_lag_at(&self, now: Instant) {
        let highs = self.consumer.cached_high_watermarks();
        let readings: Vec<(i32, Option<i64>, i64)> = {
            let book = self
                .shared
                .book(self.worker)
                .lock()
                .expect("offset book lock");
            highs
                .into_iter()
                .map(|(p, high)| (p, high, book.partition(p).map_or(0, |o| o.next_offset())))
                .collect()
        };
        for (p, high, next) in readings {
            match self.shared.measure_lag(p, high, next, now) {
                LagChange::Unchanged => {}
                // Warned: neither a fetch nor the partition's leader
                // vouched for it (a quiet partition's leader answers).
                LagChange::TurnedStale {
                    lag,
                    unconfirmed_for,
                } => tracing::warn!(
                    worker = self.worker,
                    topic = self.settings.request_topic,
                    partition = p,
                    last_lag = lag,
                    unconfirmed_for_s = unconfirmed_for.as_secs(),
                    "consumer lag unknown: no fetch moved the partition's end or read \
                     position and its leader did not answer for its end; not reported \
                     until one does"
                ),
                LagChange::Recovered { lag } => tracing::info!(
                    worker = self.worker,
                    topic = self.settings.request_topic,
                    partition = p,
                    lag,
                    "consumer lag known again"
                ),
            }
        }
    }
}

/// What the restart scan says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restarted {
    /// Answered at this position with this `req_id`: skip it.
    Answered,
    /// No answer at this position.
    Unanswered,
    /// An answer at this position names another `req_id`: it belongs to an
    /// earlier incarnation of the request topic, so this request is new.
    OtherRequest { answered_req_id: u64 },
}

/// The restart scan's answers by request position, taken as records come.
#[derive(Debug, Default)]
struct RestartAnswers {
    by_position: HashMap<RecordId, Vec<u64>>,
    /// Whether an answer to another request was already logged.
    warned: bool,
}

impl RestartAnswers {
    fn new(answered: HashSet<AnsweredRequest>) -> Self {
        let mut by_position: HashMap<RecordId, Vec<u64>> = HashMap::new();
        for a in answered {
            by_position.entry(a.source).or_default().push(a.req_id);
        }
        Self {
            by_position,
            warned: false,
        }
    }

    /// Looks up (and forgets) the answers at `source`.
    fn take(&mut self, source: RecordId, req_id: u64) -> Restarted {
        match self.by_position.remove(&source) {
            None => Restarted::Unanswered,
            Some(ids) if ids.contains(&req_id) => Restarted::Answered,
            Some(ids) => Restarted::OtherRequest {
                answered_req_id: ids[0],
            },
        }
    }
}

impl RequestSource for KafkaSource {
    /// Never fails: client errors are logged and retried by librdkafka.
    fn poll(&mut self, max: usize, floor_ms: u64) -> Result<Polled, SourceError> {
        Ok(self.poll_at(max, Instant::now(), floor_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_quiet_source_that_records_wake_sleeps_long() {
        assert_eq!(idle_poll(true, true, || 0), QUIET_POLL);
        // Nothing would wake it when a record comes.
        assert_eq!(idle_poll(false, true, || 0), IDLE_POLL);
        // Records may still be queued (paused, or the poll stopped early).
        assert_eq!(idle_poll(true, false, || 0), IDLE_POLL);
        // Unanswered requests: event time must keep moving with each poll.
        assert_eq!(idle_poll(true, true, || 1), IDLE_POLL);
    }

    fn at(partition: i32, offset: i64, req_id: u64) -> AnsweredRequest {
        AnsweredRequest {
            source: RecordId { partition, offset },
            req_id,
        }
    }

    #[test]
    fn a_request_is_skipped_only_when_position_and_req_id_match() {
        let mut answers = RestartAnswers::new([at(0, 5, 42), at(1, 5, 7)].into());
        let p0 = RecordId {
            partition: 0,
            offset: 5,
        };
        let p1 = RecordId {
            partition: 1,
            offset: 5,
        };
        assert_eq!(answers.take(p0, 42), Restarted::Answered);
        // A request topic created again: new requests at old positions.
        assert_eq!(
            answers.take(p1, 99),
            Restarted::OtherRequest { answered_req_id: 7 }
        );
        assert_eq!(answers.take(p0, 42), Restarted::Unanswered, "taken once");
    }

    #[test]
    fn a_decode_after_a_model_swap_cuts_to_the_new_models_limits() {
        use grflow_operators::history::{HistoryLimits, Task};
        let limits = |max: usize, chunk: usize| HistoryLimits {
            rank: max,
            retrieve: max,
            chunk,
        };
        let (old, new) = (limits(10, 4), limits(40, 8));
        let served = ServedLimits::new(old);
        let settings = SourceSettings {
            request_topic: "requests".into(),
            dead_letter_topic: "dead-letters".into(),
            max_in_flight: 1,
            max_in_flight_tokens: 1,
            max_message_bytes: 1 << 20,
            max_candidates: 10,
            history: served.clone(),
            idle_timeout: Duration::from_secs(1),
            max_skew_ms: 0,
            max_future_ms: 0,
            repeat_window: 0,
            commit_interval: Duration::from_secs(1),
        };
        let history: Vec<u32> = (0..50).collect();
        let message = serde_json::json!({
            "req_id": 1, "user_id": 2, "ts_ms": 3, "candidates": [1], "history": history,
        })
        .to_string();
        let decoded = |settings: &SourceSettings| {
            let wire = decode_request_within(message.as_bytes(), &settings.decode_limits())
                .expect("a valid request");
            match wire.history {
                History::Inline(items) => (wire.history_dropped, items),
                History::Prefix(_) => panic!("sent inline"),
            }
        };
        // The model the job started with: 50 items over 10, 40 dropped.
        let (dropped, kept) = decoded(&settings);
        assert_eq!((dropped, kept.as_slice()), (40, &history[40..]));
        // The node took a model that allows 40 items: 16 dropped (chunks
        // of 8), the 34 most recent kept, not the old model's 10.
        served.note(new);
        let (dropped, kept) = decoded(&settings);
        assert_eq!((dropped, kept.as_slice()), (16, &history[16..]));
        assert_eq!(new.keep(&history, Task::Rank), kept.as_slice());
    }

    #[test]
    fn answers_from_two_incarnations_at_one_position_both_count() {
        let mut answers = RestartAnswers::new([at(0, 3, 1), at(0, 3, 2)].into());
        let p = RecordId {
            partition: 0,
            offset: 3,
        };
        assert_eq!(answers.take(p, 2), Restarted::Answered);
    }
}
