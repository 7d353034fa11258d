//! State the workers of a Kafka job share with each other and with the
//! producer's delivery thread: each worker's offset book (acks arrive on the
//! delivery thread, commits are made by the owning worker), outputs the
//! broker refused for good (to be sent again, a bounded number of times),
//! the job's counters, and why the job must stop early, if it must.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Delivery, OffsetBook, RecordId, partition_owner};

use super::events::KafkaEvent;
use super::lag::{LagChange, LagGauge, LagTable};
use crate::recent_ids::RecentIds;

/// Counters of the Kafka source and sink of a job; logged periodically
/// and summarised at exit.
#[derive(Debug, Default)]
pub struct KafkaCounters {
    /// Records read from the request topic (all kinds).
    pub consumed: AtomicU64,
    /// Records skipped because their offset was consumed or committed before.
    pub duplicates: AtomicU64,
    /// Requests skipped because the response topic already answers them.
    pub already_answered: AtomicU64,
    /// Requests whose `req_id` a request read shortly before (by any
    /// worker of the process, within `kafka.repeat_window`) also carried:
    /// served anyway.
    pub repeated_req_ids: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Inline histories truncated to the model's limit at decode time.
    pub truncated_histories: AtomicU64,
    /// Requests behind the event-time frontier (processed anyway).
    pub late: AtomicU64,
    /// Requests stamped too far in the future, served at the current event
    /// time instead of their own (see `kafka.max_future_ms`).
    pub clamped_ts: AtomicU64,
    pub responses: AtomicU64,
    pub shed: AtomicU64,
    /// Jumps over offsets never read, and the offsets jumped over (see
    /// `Admission::NewAfterGap`).
    pub offset_gaps: AtomicU64,
    pub skipped_offsets: AtomicU64,
    /// Times a partition's log started over below what was read (created
    /// again or cut short while serving; see `Admission::AfterLogReset`).
    pub log_resets: AtomicU64,
    /// Requests answered `stale`: produced longer ago than
    /// `kafka.max_age_ms` when a node got to them.
    pub stale: AtomicU64,
    /// Requests served past their deadline instead of shed because they
    /// were in the request log when the job started (a crashed incarnation
    /// may have answered them with a ranking the restart scan missed).
    pub recovered_unshed: AtomicU64,
    pub unservable: AtomicU64,
    /// Outputs the broker acknowledged.
    pub delivered: AtomicU64,
    /// Outputs offered again after a failed attempt (see `produce_failures`).
    pub resent: AtomicU64,
    /// Failed attempts to produce an output (refused at once or reported
    /// failed by the producer).
    pub produce_failures: AtomicU64,
    /// Outputs that failed `kafka.produce_retries` retries and went to the
    /// dead-letter topic instead, with their source record's position.
    pub undeliverable: AtomicU64,
    /// Times reads were paused because too many requests were in flight.
    pub pauses: AtomicU64,
    /// Offset commits the broker refused (the offsets are sent again).
    pub commit_failures: AtomicU64,
    /// Polls of the request topic that failed (each retried); a count that
    /// keeps rising while nothing is read means a partition stalled.
    pub read_errors: AtomicU64,
    pub newest_event_ms: AtomicU64,
}

/// An output the producer gave up on.
#[derive(Debug, Clone)]
pub struct FailedOutput {
    pub source: RecordId,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// What the broker or client said.
    pub error: String,
}

#[derive(Debug)]
pub struct SharedState {
    request_topic: String,
    books: Vec<Mutex<OffsetBook>>,
    failed: Mutex<Vec<FailedOutput>>,
    /// Failed attempts of the output of each source record still failing.
    /// Shared because a failure reported by the delivery thread may be
    /// picked up by any worker.
    failures: Mutex<HashMap<RecordId, u32>>,
    /// Why the job must stop now (an output that cannot be delivered nor
    /// dead-lettered); every worker checks it.
    fatal: Mutex<Option<String>>,
    is_fatal: AtomicBool,
    /// The shutdown drain ran out of `kafka.drain_timeout_ms`.
    pub drain_timed_out: AtomicBool,
    pub counters: KafkaCounters,
    /// Every partition's lag reading, with when it last moved.
    lag_table: Mutex<LagTable>,
    /// The request topic's partition count as last seen (it only grows);
    /// a worker that owns a partition beyond those it reads adds it.
    pub partitions: std::sync::atomic::AtomicI32,
    /// The last `kafka.repeat_window` req_ids read by any worker of this
    /// process, with where: a producer's retry is seen whichever worker
    /// reads it (the retry may land on another partition). Made by the
    /// first worker that reads a request.
    recent_ids: Mutex<Option<RecentIds<RecordId>>>,
    /// The stamps of requests served at another time (clamped), until
    /// answered: the answer reports them (`sent_ts_ms`).
    clamped: Mutex<HashMap<RecordId, u64>>,
}

/// Clamped requests remembered at most at once; past it an answer goes
/// without `sent_ts_ms` (only a client's matching needs it).
const MAX_CLAMPED: usize = 65_536;

impl SharedState {
    pub fn new(request_topic: &str, workers: usize) -> Self {
        Self {
            request_topic: request_topic.to_string(),
            books: (0..workers)
                .map(|_| Mutex::new(OffsetBook::new()))
                .collect(),
            failed: Mutex::default(),
            failures: Mutex::default(),
            fatal: Mutex::default(),
            is_fatal: AtomicBool::new(false),
            drain_timed_out: AtomicBool::new(false),
            counters: KafkaCounters::default(),
            lag_table: Mutex::default(),
            partitions: std::sync::atomic::AtomicI32::new(0),
            recent_ids: Mutex::default(),
            clamped: Mutex::default(),
        }
    }

    /// The request at `at` stamped `sent_ts_ms` is served at another time.
    pub fn note_clamped(&self, at: RecordId, sent_ts_ms: u64) {
        let mut clamped = self.clamped.lock().expect("lock");
        if clamped.len() < MAX_CLAMPED {
            clamped.insert(at, sent_ts_ms);
        }
    }

    /// The stamp the request at `at` was sent with, if it was clamped; once.
    pub fn take_clamped(&self, at: RecordId) -> Option<u64> {
        let mut clamped = self.clamped.lock().expect("lock");
        if clamped.is_empty() {
            return None;
        }
        clamped.remove(&at)
    }

    /// Remembers that `req_id` was read at `at` and returns where it was
    /// read first, if a recent request (of any worker of this process, the
    /// last `window` ids at least) carried it. `window` 0: nothing is kept.
    pub fn observe_req_id(&self, window: usize, req_id: u64, at: RecordId) -> Option<RecordId> {
        self.recent_ids
            .lock()
            .expect("lock")
            .get_or_insert_with(|| RecentIds::new(window))
            .observe(req_id, at)
    }

    /// The same state, its partitions' lag going stale after `stale_after`
    /// unmoved instead of [`super::lag::LAG_STALE_AFTER`].
    pub fn with_lag_stale_after(self, stale_after: Duration) -> Self {
        *self.lag_table.lock().expect("lag lock") = LagTable::new(stale_after);
        self
    }

    /// Measures `partition`'s lag at `now` (see [`LagTable::measure`]).
    pub fn measure_lag(
        &self,
        partition: i32,
        high: Option<i64>,
        next: i64,
        now: Instant,
    ) -> LagChange {
        self.lag_table
            .lock()
            .expect("lag lock")
            .measure(partition, high, next, now)
    }

    /// Partitions whose lag readings are due for the broker's answer
    /// (see [`LagTable::to_confirm`]).
    pub fn lag_to_confirm(&self, now: Instant) -> Vec<i32> {
        self.lag_table.lock().expect("lag lock").to_confirm(now)
    }

    /// The broker answered at `now` that `partition` ends at `end` (see
    /// [`LagTable::confirm`]).
    pub fn confirm_lag_end(&self, partition: i32, end: i64, now: Instant) {
        self.lag_table
            .lock()
            .expect("lag lock")
            .confirm(partition, end, now);
    }

    /// Consumer lag per request partition that can still be believed at
    /// `now`: a partition whose lag went stale (see [`super::lag`]) is
    /// left out.
    pub fn known_lag(&self, now: Instant) -> BTreeMap<i32, i64> {
        self.lag_gauges(now)
            .into_iter()
            .filter_map(|(p, g)| Some((p, g.lag?)))
            .collect()
    }

    /// Every measured partition's lag as it may be exported at `now`:
    /// `lag` is `None` (export NaN) for a stale one.
    pub fn lag_gauges(&self, now: Instant) -> BTreeMap<i32, LagGauge> {
        self.lag_table.lock().expect("lag lock").gauges(now)
    }

    /// Records that the request topic has `partitions` partitions now.
    pub fn saw_partitions(&self, partitions: i32) {
        self.partitions.fetch_max(partitions, Ordering::Relaxed);
    }

    /// Workers of the job (one offset book each).
    pub fn workers(&self) -> usize {
        self.books.len()
    }

    pub fn request_topic(&self) -> &str {
        &self.request_topic
    }

    /// The offset book of the worker that reads `partition`.
    pub fn book_of(&self, partition: i32) -> &Mutex<OffsetBook> {
        let owner = partition_owner(&self.request_topic, partition, self.books.len());
        &self.books[owner]
    }

    pub fn book(&self, worker: usize) -> &Mutex<OffsetBook> {
        &self.books[worker]
    }

    /// Records the output of `source` as durable.
    pub fn ack(&self, source: RecordId) {
        let acked = self
            .book_of(source.partition)
            .lock()
            .expect("offset book lock")
            .ack(source.partition, source.offset);
        if let Err(e) = acked {
            tracing::warn!(error = %e, "delivery report for a record not in flight");
        }
    }

    /// What the producer's delivery thread calls.
    pub fn on_delivery(&self, delivery: Delivery) {
        match delivery {
            Delivery::Delivered { source } => {
                KafkaEvent::Delivered.emit(&self.counters);
                self.clear_failures(source);
                self.ack(source);
            }
            Delivery::Failed {
                source,
                topic,
                key,
                payload,
                error,
            } => {
                // Logged (rate-limited) by the worker that sends it again.
                self.failed.lock().expect("failed lock").push(FailedOutput {
                    source,
                    topic,
                    key,
                    payload,
                    error,
                });
            }
        }
    }

    /// One more failed attempt for the output of `source`; returns how many
    /// it has had.
    pub fn note_failure(&self, source: RecordId) -> u32 {
        let mut failures = self.failures.lock().expect("failures lock");
        let n = failures.entry(source).or_default();
        *n += 1;
        *n
    }

    /// The output of `source` was delivered or replaced: forget its failures.
    pub fn clear_failures(&self, source: RecordId) {
        let mut failures = self.failures.lock().expect("failures lock");
        if !failures.is_empty() {
            failures.remove(&source);
        }
    }

    /// Stops the job: the first reason given is kept.
    pub fn set_fatal(&self, reason: String) {
        let mut fatal = self.fatal.lock().expect("fatal lock");
        if fatal.is_none() {
            tracing::error!(%reason, "stopping the job");
            *fatal = Some(reason);
            self.is_fatal.store(true, Ordering::Release);
        }
    }

    /// Whether the job must stop now (cheap: checked on every step).
    pub fn is_fatal(&self) -> bool {
        self.is_fatal.load(Ordering::Acquire)
    }

    /// Why the job must stop, if it must.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().expect("fatal lock").clone()
    }

    /// Outputs to send again (taken: the caller owns them now).
    pub fn take_failed(&self) -> Vec<FailedOutput> {
        std::mem::take(&mut *self.failed.lock().expect("failed lock"))
    }

    pub fn in_flight(&self) -> usize {
        self.books
            .iter()
            .map(|b| b.lock().expect("offset book lock").in_flight())
            .sum()
    }
}

/// The counters of one process at exit; in cluster mode process 0 adds
/// every process's.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize)]
pub struct CountsSnapshot {
    pub consumed: u64,
    pub duplicates: u64,
    pub already_answered: u64,
    #[serde(default)]
    pub repeated_req_ids: u64,
    pub dead_lettered: u64,
    pub truncated_histories: u64,
    pub late: u64,
    pub clamped_ts: u64,
    pub responses: u64,
    pub shed: u64,
    #[serde(default)]
    pub stale: u64,
    #[serde(default)]
    pub skipped_offsets: u64,
    #[serde(default)]
    pub log_resets: u64,
    pub recovered_unshed: u64,
    pub unservable: u64,
    pub delivered: u64,
    pub resent: u64,
    pub produce_failures: u64,
    pub undeliverable: u64,
    pub pauses: u64,
    #[serde(default)]
    pub commit_failures: u64,
    #[serde(default)]
    pub read_errors: u64,
}

impl CountsSnapshot {
    pub fn of(c: &KafkaCounters) -> Self {
        Self {
            consumed: c.consumed.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            already_answered: c.already_answered.load(Ordering::Relaxed),
            repeated_req_ids: c.repeated_req_ids.load(Ordering::Relaxed),
            dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
            truncated_histories: c.truncated_histories.load(Ordering::Relaxed),
            late: c.late.load(Ordering::Relaxed),
            clamped_ts: c.clamped_ts.load(Ordering::Relaxed),
            responses: c.responses.load(Ordering::Relaxed),
            shed: c.shed.load(Ordering::Relaxed),
            stale: c.stale.load(Ordering::Relaxed),
            skipped_offsets: c.skipped_offsets.load(Ordering::Relaxed),
            log_resets: c.log_resets.load(Ordering::Relaxed),
            recovered_unshed: c.recovered_unshed.load(Ordering::Relaxed),
            unservable: c.unservable.load(Ordering::Relaxed),
            delivered: c.delivered.load(Ordering::Relaxed),
            resent: c.resent.load(Ordering::Relaxed),
            produce_failures: c.produce_failures.load(Ordering::Relaxed),
            undeliverable: c.undeliverable.load(Ordering::Relaxed),
            pauses: c.pauses.load(Ordering::Relaxed),
            commit_failures: c.commit_failures.load(Ordering::Relaxed),
            read_errors: c.read_errors.load(Ordering::Relaxed),
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.consumed += o.consumed;
        self.duplicates += o.duplicates;
        self.already_answered += o.already_answered;
        self.repeated_req_ids += o.repeated_req_ids;
        self.dead_lettered += o.dead_lettered;
        self.truncated_histories += o.truncated_histories;
        self.late += o.late;
        self.clamped_ts += o.clamped_ts;
        self.responses += o.responses;
        self.shed += o.shed;
        self.stale += o.stale;
        self.skipped_offsets += o.skipped_offsets;
        self.log_resets += o.log_resets;
        self.recovered_unshed += o.recovered_unshed;
        self.unservable += o.unservable;
        self.delivered += o.delivered;
        self.resent += o.resent;
        self.produce_failures += o.produce_failures;
        self.undeliverable += o.undeliverable;
        self.pauses += o.pauses;
        self.commit_failures += o.commit_failures;
        self.read_errors += o.read_errors;
    }
}
