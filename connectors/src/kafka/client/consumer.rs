//! The request consumer: a worker's own partitions in assign mode, where
//! each resumes, explicit commits with their own answer queue, and the
//! fetched high watermark.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::{KafkaClientError, KafkaSettings, RawRecord, Refetch, Resumed, StartPosition, kafka};
use crate::kafka::client_logs::logged_client_context;
use crate::kafka::offsets::RecoveryBounds;

/// The request consumer's context: keeps what the broker answered to
/// commits, which librdkafka reports only through this callback (the
/// default context drops it, so a refused commit went unnoticed).
#[derive(Debug, Default)]
struct CommitWatch {
    refused: std::sync::Mutex<Vec<String>>,
}

logged_client_context!(CommitWatch);

impl ConsumerContext for CommitWatch {
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        _offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            self.refused
                .lock()
                .expect("commit watch lock")
                .push(e.to_string());
        }
    }
}

/// A queue of its own for one commit's answer: rdkafka 0.39 wraps only the
/// synchronous commit (no deadline) and the asynchronous one, whose answer
/// goes nowhere unless a commit callback is configured.
struct CommitQueue(*mut rdkafka::bindings::rd_kafka_queue_t);

impl CommitQueue {
    /// How long one wait on the queue lasts.
    const POLL: Duration = Duration::from_millis(100);

    /// Sends the commit of `tpl` and waits at most `timeout` for the
    /// broker's answer: whether it came, or the error it was.
    fn commit<C: ConsumerContext>(
        consumer: &BaseConsumer<C>,
        tpl: &TopicPartitionList,
        timeout: Duration,
    ) -> Result<bool, RDKafkaErrorCode> {
        use rdkafka::bindings as rd;
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is valid for the life of `consumer`; the queue is
        // destroyed by `Drop` (librdkafka keeps it alive while the commit
        // still holds it).
        let queue = Self(unsafe { rd::rd_kafka_queue_new(rk) });
        // SAFETY: `tpl` outlives the call (librdkafka copies it); no
        // callback, so the answer comes as an event on `queue`.
        let sent = unsafe {
            rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue.0, None, std::ptr::null_mut())
        };
        if sent != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(sent.into());
        }
        // None: a timeout too long to represent never ends.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(Self::POLL, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Ok(false);
            }
            if let Some(answer) = queue.answer(left.min(Self::POLL)) {
                return answer.map(|()| true);
            }
        }
    }

    /// The commit's answer, if it came within `wait`.
    fn answer(&self, wait: Duration) -> Option<Result<(), RDKafkaErrorCode>> {
        use rdkafka::bindings as rd;
        // SAFETY: the queue is live; an event returned is destroyed below
        // and not used after.
        unsafe {
            let event = rd::rd_kafka_queue_poll(self.0, wait.as_millis().max(1) as i32);
            if event.is_null() {
                return None;
            }
            let kind = rd::rd_kafka_event_type(event);
            let error = rd::rd_kafka_event_error(event);
            rd::rd_kafka_event_destroy(event);
            if kind != rd::RD_KAFKA_EVENT_OFFSET_COMMIT {
                return None;
            }
            Some(
                if error == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    Ok(())
                } else {
                    Err(error.into())
                },
            )
        }
    }
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        // SAFETY: created by `rd_kafka_queue_new`, destroyed once.
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.0) }
    }
}

/// Reads a fixed set of partitions of one topic and commits explicitly.
#[allow(missing_debug_implementations)] // wraps an rdkafka client
pub struct RequestConsumer {
    /// Dropped by hand: see [`RequestConsumer::close`].
    consumer: std::mem::ManuallyDrop<BaseConsumer<CommitWatch>>,
    /// `close` gave up: dropping the client would wait without a deadline.
    abandoned: bool,
    topic: String,
    partitions: Vec<i32>,
    paused: bool,
    refetch: Refetch,
    /// `kafka.start`: whether a partition added later must commit its start.
    start: StartPosition,
    /// Which records were in the log at start (see [`RecoveryBounds`]);
    /// settled by `poll`, hence the cell.
    recovery: std::cell::RefCell<RecoveryBounds>,
}

impl RequestConsumer {
    /// Assigns `partitions` of `topic`, each at its committed offset or,
    /// when the group never committed one, at `start`.
    pub fn open(
        settings: &KafkaSettings,
        topic: &str,
        partitions: &[i32],
        start: StartPosition,
        refetch: Refetch,
        timeout: Duration,
    ) -> Result<(Self, Vec<Resumed>), KafkaClientError> {
        let consumer: BaseConsumer<CommitWatch> = settings
            .client_config_with(&[
                ("group.id", &settings.group_id),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "false"),
                // Bounds what librdkafka prefetches while we are paused.
                ("queued.max.messages.kbytes", "16384"),
                ("queued.min.messages", "10000"),
                // Only a position out of range gets here (every partition
                // is assigned at an explicit offset; `start` is applied in
                // `resume_positions`): retention deleted past it, or the log
                // was cut short or created again. "latest" would skip every
                // retained request not read yet; the log's start skips none.
                ("auto.offset.reset", "earliest"),
                // A serving job wants records now, not batched for 500 ms.
                ("fetch.wait.max.ms", "5"),
            ])
            .create_with_context(CommitWatch::default())
            .map_err(kafka("creating the request consumer"))?;
        let Positions {
            assignment,
            resumed,
            listed,
        } = resume_positions(&consumer, topic, partitions, start, refetch, timeout)?;
        consumer
            .assign(&assignment)
            .map_err(kafka(format!("assigning `{topic}` {partitions:?}")))?;
        Ok((
            Self {
                consumer: std::mem::ManuallyDrop::new(consumer),
                abandoned: false,
                topic: topic.to_string(),
                partitions: partitions.to_vec(),
                paused: false,
                refetch,
                start,
                recovery: std::cell::RefCell::new(RecoveryBounds::new(listed)),
            },
            resumed,
        ))
    }

    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    /// Starts reading `added` partitions too (created while the job runs),
    /// each at its committed offset or else from its beginning: every
    /// record in a partition created after the job started is new, whatever
    /// `kafka.start` says. Partitions already read are left alone.
    pub fn add_partitions(
        &mut self,
        added: &[i32],
        timeout: Duration,
    ) -> Result<Vec<Resumed>, KafkaClientError> {
        let added: Vec<i32> = added
            .iter()
            .copied()
            .filter(|p| !self.partitions.contains(p))
            .collect();
        if added.is_empty() {
            return Ok(Vec::new());
        }
        let Positions {
            assignment,
            mut resumed,
            listed,
        } = resume_positions(
            &*self.consumer,
            &self.topic,
            &added,
            StartPosition::Earliest,
            self.refetch,
            timeout,
        )?;
        // Read from 0 now, but a restart under `start = "latest"` would
        // jump to the end of a partition its group never committed.
        for r in &mut resumed {
            r.commit_start |= !r.from_commit && self.start == StartPosition::Latest;
        }
        self.consumer
            .incremental_assign(&assignment)
            .map_err(kafka(format!("adding `{}` {added:?}", self.topic)))?;
        self.recovery.borrow_mut().extend(listed);
        self.partitions.extend(added);
        Ok(resumed)
    }

    /// The next record, waiting at most `timeout`; `None` when none came
    /// (or reads are paused).
    pub fn poll(&self, timeout: Duration) -> Option<Result<RawRecord, KafkaClientError>> {
        if self.partitions.is_empty() {
            self.serve_events(timeout);
            return None;
        }
        if self.paused {
            std::thread::sleep(timeout);
            return None;
        }
        self.consumer.poll(timeout).map(|r| {
            r.map(|m| {
                self.settle(m.partition());
                RawRecord {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis(),
                    payload: m.payload().map(<[u8]>::to_vec),
                }
            })
            .map_err(kafka(format!("reading `{}`", self.topic)))
        })
    }

    /// Serves the consumer's queue for `timeout` while no partition is
    /// read: librdkafka still queues events for it (broker errors while a
    /// broker is away, statistics when `statistics.interval.ms` is set),
    /// and a queue nobody serves grows for as long as the job runs.
    fn serve_events(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        // Bounded, so that a flood of events cannot hold the worker.
        for _ in 0..10_000 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.consumer.poll(left) {
                Some(Err(e)) => tracing::debug!(error = %e, topic = %self.topic, "consumer event"),
                // No partition is assigned, so no record should come; its
                // offset is never committed here, so its owner reads it.
                Some(Ok(m)) => tracing::warn!(
                    partition = m.partition(),
                    offset = m.offset(),
                    "record of a partition this worker does not read: left to its owner"
                ),
                None => return,
            }
        }
    }

    /// Calls `wake` from a librdkafka thread whenever the consumer's queue
    /// turns from empty to non-empty (a record, an error, a commit's
    /// answer), so that an idle reader can sleep instead of polling. It
    /// must not call into this consumer: librdkafka holds the queue's lock.
    pub fn wake_on_arrival(&mut self, wake: impl Fn() + Send + Sync + 'static) {
        self.consumer.set_nonempty_callback(wake);
    }

    /// Whether anything waits in the consumer's queue. `poll` also answers
    /// `None` after handling an event that is not a record (a commit's
    /// answer), with records possibly behind it.
    pub fn has_queued(&self) -> bool {
        use rdkafka::bindings as rd;
        let rk = self.consumer.client().native_ptr();
        // SAFETY: `rk` is valid for the life of the consumer; the queue
        // reference taken here is released before returning.
        unsafe {
            let queue = rd::rd_kafka_queue_get_consumer(rk);
            if queue.is_null() {
                return false;
            }
            let queued = rd::rd_kafka_queue_length(queue);
            rd::rd_kafka_queue_destroy(queue);
            queued > 0
        }
    }

    /// Fixes `partition`'s end of log at start with the high watermark of
    /// the fetch that brought its first record.
    fn settle(&self, partition: i32) {
        let mut recovery = self.recovery.borrow_mut();
        if !recovery.settled(partition) {
            let high = cached_high_watermark(&*self.consumer, &self.topic, partition);
            recovery.settle(partition, high);
        }
    }

    /// Whether the record at `offset` of `partition` was in the log when
    /// this consumer opened: a previous incarnation may have been answering
    /// it when it stopped (see [`RecoveryBounds`]).
    pub fn is_recovered(&self, partition: i32, offset: i64) -> bool {
        self.recovery.borrow().is_recovered(partition, offset)
    }

    /// `partition`'s log started over while serving: none of its records
    /// is recovered from now on (they may be shed and answered stale).
    pub fn log_started_over(&self, partition: i32) {
        self.recovery.borrow_mut().start_over(partition);
    }

    /// The ends of the logs at start, as far as they are known now.
    pub fn recovery_bounds(&self) -> RecoveryBounds {
        self.recovery.borrow().clone()
    }

    /// Stops (or restarts) handing out records. While paused, librdkafka's
    /// fetcher fills its local queue up to `queued.max.messages.kbytes`
    /// (set by [`RequestConsumer::open`]) and then stops fetching, so memory
    /// stays bounded. (librdkafka's own pause/resume is not used: after a
    /// resume, tansu 0.6 never served the partition again.)
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Commits `(partition, next offset to read)` pairs; `sync` waits for
    /// the broker's answer.
    pub fn commit(&self, offsets: &[(i32, i64)], sync: bool) -> Result<(), KafkaClientError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in offsets {
            tpl.add_partition_offset(&self.topic, p, Offset::Offset(o))
                .map_err(kafka("building the commit"))?;
        }
        let mode = if sync {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        self.consumer
            .commit(&tpl, mode)
            .map_err(kafka(format!("committing {offsets:?}")))
    }

    /// Commits `offsets` and waits at most `timeout` for the broker's
    /// answer: `Ok(false)` when none came in time (a sync commit has no
    /// deadline of its own, and a coordinator that is away would hold up a
    /// shutdown), an error when the broker refused it.
    pub fn commit_and_wait(
        &self,
        offsets: &[(i32, i64)],
        timeout: Duration,
    ) -> Result<bool, KafkaClientError> {
        if offsets.is_empty() {
            return Ok(true);
        }
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in offsets {
            tpl.add_partition_offset(&self.topic, p, Offset::Offset(o))
                .map_err(kafka("building the commit"))?;
        }
        let what = || format!("committing {offsets:?}");
        match CommitQueue::commit(&*self.consumer, &tpl, timeout) {
            Ok(answered) => Ok(answered),
            Err(code) => Err(kafka(what())(KafkaError::ConsumerCommit(code))),
        }
    }

    /// Leaves the group's session (assign mode: no rebalance) within
    /// `timeout`; `false` when it did not end in time. librdkafka's close
    /// waits for outstanding commits without a deadline (a coordinator that
    /// is away holds it forever), so a consumer that did not close in time
    /// is leaked instead of dropped: a shutdown must end.
    pub fn close(&mut self, timeout: Duration) -> bool {
        if self.consumer.close_queue().is_err() {
            // Closed already, or never in a group: nothing to wait for.
            return true;
        }
        let deadline = Instant::now().checked_add(timeout);
        while !self.consumer.closed() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.abandoned = true;
                return false;
            }
            // Serves the close (fetched records are dropped: past the last commit).
            drop(self.consumer.poll(Duration::from_millis(10)));
        }
        true
    }

    /// Why the broker refused the commits it answered since the last call
    /// (answers arrive while the consumer polls).
    pub fn take_refused_commits(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .consumer
                .context()
                .refused
                .lock()
                .expect("commit watch lock"),
        )
    }

    /// Where `partition`'s log ends as of the last fetch response (its
    /// high watermark; no broker round trip).
    pub fn log_end(&self, partition: i32) -> Option<i64> {
        cached_high_watermark(&*self.consumer, &self.topic, partition)
    }

    /// High watermarks as of the last fetch response (no broker round trip).
    pub fn cached_high_watermarks(&self) -> Vec<(i32, Option<i64>)> {
        self.partitions
            .iter()
            .map(|&p| (p, cached_high_watermark(&*self.consumer, &self.topic, p)))
            .collect()
    }
}

impl Drop for RequestConsumer {
    fn drop(&mut self) {
        if !self.abandoned {
            // SAFETY: dropped here only, and never used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.consumer) }
        }
    }
}

/// Where a set of partitions resumes.
struct Positions {
    assignment: TopicPartitionList,
    resumed: Vec<Resumed>,
    /// (partition, end of its log now).
    listed: Vec<(i32, i64)>,
}

/// Where each of `partitions` of `topic` resumes: its committed offset or,
/// when the group never committed one (or committed past the log's end),
/// `start`.
fn resume_positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: &[i32],
    start: StartPosition,
    refetch: Refetch,
    timeout: Duration,
) -> Result<Positions, KafkaClientError> {
    let mut wanted = TopicPartitionList::new();
    for &p in partitions {
        wanted.add_partition(topic, p);
    }
    let committed = if partitions.is_empty() {
        TopicPartitionList::new()
    } else {
        consumer
            .committed_offsets(wanted, timeout)
            .map_err(kafka(format!("committed offsets of `{topic}`")))?
    };
    // Where each log ends now: records below may have been in flight
    // at a crash of a previous incarnation.
    let mut listed = Vec::with_capacity(partitions.len());
    for &p in partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(kafka(format!("watermarks of `{topic}`[{p}]")))?;
        listed.push((p, high));
    }
    let mut resumed = Vec::with_capacity(partitions.len());
    let mut assignment = TopicPartitionList::new();
    for (&p, &(_, high)) in partitions.iter().zip(&listed) {
        let committed_at = committed
            .find_partition(topic, p)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) if o >= 0 => Some(o),
                _ => None,
            });
        // Only where the broker's log end can be trusted: a broker that
        // needs `Refetch::FromStart` (tansu 0.6) also answers ListOffsets
        // with the last batch's base offset, below a committed offset
        // inside that batch.
        let past_end = committed_at.filter(|&o| o > high && refetch == Refetch::FromCommitted);
        if let Some(o) = past_end {
            tracing::warn!(
                topic,
                partition = p,
                committed = o,
                log_end = high,
                "the group's committed offset is past the end of the log (topic created \
                 again, log cut short, or the group id reused): reading from the start \
                 position instead"
            );
        }
        let from_commit = committed_at.filter(|_| past_end.is_none());
        // `offset`: below it, records count as already consumed.
        let (offset, fetch_from) = match (from_commit, refetch, start) {
            (Some(o), Refetch::FromCommitted, _) => (o, Offset::Offset(o)),
            (Some(o), Refetch::FromStart, _) => (o, Offset::Beginning),
            (None, _, StartPosition::Earliest) => (0, Offset::Beginning),
            // The end listed above, not `End` (resolved later, past records
            // produced meanwhile); the caller commits it even if nothing is
            // read, or the next start would jump to the end again. A broker
            // that needs `FromStart` lists an end that may lie inside the
            // last batch: fetch from its true end, skip below the listed one.
            (None, Refetch::FromCommitted, StartPosition::Latest) => (high, Offset::Offset(high)),
            (None, Refetch::FromStart, StartPosition::Latest) => (high, Offset::End),
        };
        assignment
            .add_partition_offset(topic, p, fetch_from)
            .map_err(kafka("building the assignment"))?;
        resumed.push(Resumed {
            partition: p,
            offset,
            from_commit: from_commit.is_some(),
            past_end,
            commit_start: from_commit.is_none()
                && (start == StartPosition::Latest || past_end.is_some()),
            refetches_below: refetch == Refetch::FromStart,
        });
    }
    Ok(Positions {
        assignment,
        resumed,
        listed,
    })
}

/// A partition's high watermark as of the consumer's last fetch response.
/// rdkafka 0.39 wraps only the broker round trip (ListOffsets), which tansu
/// 0.6 answers with a batch's base offset instead of the end of the log; the
/// value cached from fetch responses needs the C call.
pub(super) fn cached_high_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid for the life of `consumer`, `topic`
    // is a NUL-terminated string that outlives the call, and the two
    // out-pointers point at live i64s.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}
