//! Everything observable the Kafka source and sink do to a record, as typed events (the
//! model is Vector's `internal_events`): each kind is counted for the
//! summary, counted for `/metrics` and logged in one place,
//! [`KafkaEvent::emit`], instead of at every call site.

use std::sync::atomic::{AtomicU64, Ordering};

use super::shared::KafkaCounters;

/// One thing that happened to a record or an answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KafkaEvent<'a> {
    /// A record was read from the request topic.
    Read { partition: i32, offset: i64 },
    /// Its offset was consumed or committed before (a refetch).
    Duplicate { partition: i32, offset: i64 },
    /// Offsets `first..=last` of a partition were jumped over, never read
    /// (see `Admission::NewAfterGap`).
    OffsetGap {
        partition: i32,
        first: i64,
        last: i64,
    },
    /// It lies below what its partition had read, in a log that now ends
    /// below that (created again or cut short while serving): served, and
    /// the partition's offsets start over at it (see
    /// `Admission::AfterLogReset`).
    LogReset {
        topic: &'a str,
        partition: i32,
        offset: i64,
        read_up_to: i64,
        log_end: i64,
    },
    /// The response topic already answers it (found by the restart scan).
    AlreadyAnswered { partition: i32, offset: i64 },
    /// Its `req_id` was read shortly before at another position: served
    /// anyway, and both answers carry the id.
    RepeatedReqId { partition: i32, offset: i64 },
    /// Its inline history was cut to the model's limit.
    HistoryTruncated { partition: i32, offset: i64 },
    /// Behind the event-time frontier: served anyway.
    Late { partition: i32, offset: i64 },
    /// Its `ts_ms` was too far in the future: served at the current time.
    Clamped {
        partition: i32,
        offset: i64,
        ts_ms: u64,
    },
    /// Unreadable: sent to the dead-letter topic.
    DeadLettered {
        partition: i32,
        offset: i64,
        kind: &'a str,
    },
    /// Reads paused: too many requests or tokens in flight.
    Paused { worker: usize },
    /// A ranking or retrieval was handed to the producer.
    Answered { recovered_late: bool },
    /// An error record (`shed`, `stale`, `unservable`) was handed to the producer.
    ErrorAnswered { kind: &'a str },
    /// The broker acknowledged an output.
    Delivered,
    /// Producing an output failed (it is retried).
    ProduceFailed { topic: &'a str, error: &'a str },
    /// A failed output was offered again.
    Resent,
    /// An output failed every retry and went to the dead-letter topic.
    Undeliverable { topic: &'a str, error: &'a str },
    /// The broker refused an offset commit (the offsets are sent again).
    CommitFailed { worker: usize, error: &'a str },
    /// Reading the request topic failed (a broker away, a read ACL
    /// revoked, an unknown partition): retried at the next poll.
    ReadFailed,
}

impl KafkaEvent<'_> {
    /// Counts the event for the summary (`counters`) and for `/metrics`,
    /// and logs it.
    pub fn emit(self, counters: &KafkaCounters) {
        // Counts one and returns how many so far (the rate-limited logs
        // below write the 1st, 2nd, 4th, ...).
        let counted = |atomic: &AtomicU64, metric: &'static str| {
            metrics::counter!(metric).increment(1);
            atomic.fetch_add(1, Ordering::Relaxed) + 1
        };
        let count = |atomic: &AtomicU64, metric: &'static str| {
            counted(atomic, metric);
        };
        match self {
            Self::Read { .. } => count(&counters.consumed, "grflow_requests_in_total"),
            Self::Duplicate { partition, offset } => {
                count(&counters.duplicates, "grflow_duplicates_total");
                tracing::debug!(partition, offset, "skipped: consumed before");
            }
            Self::OffsetGap {
                partition,
                first,
                last,
            } => {
                let n = (last - first + 1).max(0) as u64;
                let gaps = counters.offset_gaps.fetch_add(1, Ordering::Relaxed) + 1;
                counters.skipped_offsets.fetch_add(n, Ordering::Relaxed);
                metrics::counter!("grflow_skipped_offsets_total").increment(n);
                // Transaction markers leave one such gap per transaction:
                // the 1st, 2nd, 4th, 8th, ... are logged.
                if gaps.is_power_of_two() {
                    tracing::warn!(
                        partition,
                        first,
                        last,
                        gaps,
                        "offsets never read: the consumer jumped over them (transaction markers, \
                         records deleted by retention before they were read, or a broker that \
                         returned later records first, as tansu 0.6 does under a backlog); a \
                         request there is not answered"
                    );
                }
            }
            Self::LogReset {
                topic,
                partition,
                offset,
                read_up_to,
                log_end,
            } => {
                let n = counted(&counters.log_resets, "grflow_log_resets_total");
                // Once per partition per reset, but a topic created again
                // resets all of them: the 1st, 2nd, 4th, ... are logged.
                if n.is_power_of_two() {
                    tracing::warn!(
                        topic,
                        partition,
                        offset,
                        read_up_to,
                        log_end,
                        resets = n,
                        "the partition's log starts over below what was read (the topic was \
                         created again or its log cut short while serving): serving its records \
                         from this offset instead of skipping them as duplicates; records the \
                         old log held may be answered again"
                    );
                }
            }
            Self::AlreadyAnswered { partition, offset } => {
                count(&counters.already_answered, "grflow_already_answered_total");
                tracing::debug!(partition, offset, "skipped: answered before the restart");
            }
            Self::RepeatedReqId { partition, offset } => {
                count(&counters.repeated_req_ids, "grflow_repeated_req_ids_total");
                // The source logs the first repeats, rate-limited, by id.
                tracing::debug!(partition, offset, "req_id read before");
            }
            Self::HistoryTruncated { .. } => count(
                &counters.truncated_histories,
                "grflow_truncated_histories_total",
            ),
            Self::Late { .. } => count(&counters.late, "grflow_late_total"),
            Self::Clamped { .. } => count(&counters.clamped_ts, "grflow_clamped_ts_total"),
            Self::DeadLettered {
                partition,
                offset,
                kind,
            } => {
                counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("grflow_dead_lettered_total", "kind" => kind.to_string())
                    .increment(1);
                tracing::debug!(partition, offset, kind, "dead letter");
            }
            Self::Paused { worker } => {
                count(&counters.pauses, "grflow_pauses_total");
                tracing::debug!(worker, "reads paused: in-flight cap");
            }
            Self::Answered { recovered_late } => {
                counters.responses.fetch_add(1, Ordering::Relaxed);
                if recovered_late {
                    count(&counters.recovered_unshed, "grflow_recovered_unshed_total");
                }
            }
            Self::ErrorAnswered { kind } => {
                let atomic = match kind {
                    "shed" => &counters.shed,
                    "stale" => &counters.stale,
                    _ => &counters.unservable,
                };
                // /metrics has it from the node (`grflow_errors_total`).
                atomic.fetch_add(1, Ordering::Relaxed);
            }
            Self::Delivered => count(&counters.delivered, "grflow_delivered_total"),
            Self::ProduceFailed { topic, error } => {
                count(&counters.produce_failures, "grflow_produce_failures_total");
                // The output queue logs failures rate-limited at warn.
                tracing::debug!(topic, error, "producing an output failed");
            }
            Self::Resent => count(&counters.resent, "grflow_resent_total"),
            Self::CommitFailed { worker, error } => {
                let n = counted(&counters.commit_failures, "grflow_commit_failures_total");
                // A lasting refusal (an ACL) repeats every commit interval:
                // the 1st, 2nd, 4th, 8th, ... are logged.
                if n.is_power_of_two() {
                    tracing::warn!(
                        worker,
                        error,
                        refused_so_far = n,
                        "offset commit refused: the offsets are sent again; until one succeeds \
                         a restart reads the records since the last commit again"
                    );
                }
            }
            // Logged rate-limited by the source, with the error.
            Self::ReadFailed => count(&counters.read_errors, "grflow_read_errors_total"),
            Self::Undeliverable { topic, error } => {
                count(&counters.undeliverable, "grflow_undeliverable_total");
                tracing::error!(
                    topic,
                    error,
                    "an output failed every retry: dead-lettered with its source record"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_counts_where_the_summary_reads_it() {
        let c = KafkaCounters::default();
        let (partition, offset) = (1, 7);
        for e in [
            KafkaEvent::Read { partition, offset },
            KafkaEvent::Read { partition, offset },
            KafkaEvent::Duplicate { partition, offset },
            KafkaEvent::RepeatedReqId { partition, offset },
            KafkaEvent::DeadLettered {
                partition,
                offset,
                kind: "malformed",
            },
            KafkaEvent::Answered {
                recovered_late: true,
            },
            KafkaEvent::OffsetGap {
                partition: 0,
                first: 5,
                last: 7,
            },
            KafkaEvent::ErrorAnswered { kind: "shed" },
            KafkaEvent::ErrorAnswered { kind: "stale" },
            KafkaEvent::ErrorAnswered { kind: "unservable" },
            KafkaEvent::Delivered,
            KafkaEvent::CommitFailed {
                worker: 0,
                error: "refused",
            },
            KafkaEvent::ReadFailed,
            KafkaEvent::LogReset {
                topic: "requests",
                partition,
                offset: 0,
                read_up_to: 900,
                log_end: 3,
            },
        ] {
            e.emit(&c);
        }
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(n(&c.consumed), 2);
        assert_eq!(n(&c.duplicates), 1);
        assert_eq!(n(&c.repeated_req_ids), 1);
        assert_eq!(n(&c.dead_lettered), 1);
        assert_eq!((n(&c.responses), n(&c.recovered_unshed)), (1, 1));
        assert_eq!((n(&c.shed), n(&c.stale), n(&c.unservable)), (1, 1, 1));
        assert_eq!(n(&c.delivered), 1);
        assert_eq!((n(&c.offset_gaps), n(&c.skipped_offsets)), (1, 3));
        assert_eq!(n(&c.commit_failures), 1);
        assert_eq!(n(&c.read_errors), 1);
        assert_eq!(n(&c.log_resets), 1);
    }
}
