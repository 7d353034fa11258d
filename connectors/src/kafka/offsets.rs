//! Offsets between consumption and commit, per partition.
//!
//! Kafka resumes a consumer at its committed offset, so committing offset
//! `c` promises that every record before `c` has its outputs (response or
//! dead letter) durable on the broker. We therefore commit the smallest
//! offset still in flight (or one past the highest consumed when nothing
//! is), and a record seen again at or below what was consumed or committed
//! (a re-fetch, a restart) is reported as a duplicate instead of served
//! twice. Without broker transactions this gives: every record is answered
//! at least once, and twice only when it was in flight at a crash.

use std::collections::BTreeMap;

/// What to do with a consumed record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// First time seen: serve it, then `ack` its offset once its output is durable.
    New,
    /// As `New`, but offsets `first..=last` of its partition, before it,
    /// were never read. Kafka leaves such gaps for transaction markers and
    /// for records deleted by retention before they were read; a broker
    /// that returns later records first (tansu 0.6 asked for an offset
    /// inside a record batch) leaves them too, and requests there are
    /// never answered.
    NewAfterGap { first: i64, last: i64 },
    /// At or below an offset already consumed or committed: skip it.
    Duplicate,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OffsetError {
    #[error("partition {partition}: ack of offset {offset}, which is not in flight")]
    NotInFlight { partition: i32, offset: i64 },
    #[error("partition {partition}: negative offset {offset}")]
    Negative { partition: i32, offset: i64 },
}

/// One partition's consumed, in-flight and committable offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// Offsets below this were committed before (at start) or consumed now.
    next_new: i64,
    /// Offsets in flight with the tokens of their request (0 until weighed).
    in_flight: BTreeMap<i64, u64>,
    /// The last offset handed out by `committable` (to report changes only).
    last_commit: Option<i64>,
    /// The group has no commit to resume from here (see
    /// [`OffsetBook::start_uncommitted`]): the start position is committed
    /// even when it is 0, or a `latest` start would skip what is produced
    /// while the job is down.
    commit_start: bool,
}

impl PartitionOffsets {
    /// A partition whose consumer group committed `committed` (the next
    /// offset to read), or 0 when it never committed.
    pub fn resuming_at(committed: i64) -> Self {
        Self {
            next_new: committed.max(0),
            in_flight: BTreeMap::new(),
            last_commit: (committed > 0).then_some(committed),
            commit_start: false,
        }
    }

    fn consume(&mut self, offset: i64) -> Admission {
        if offset < self.next_new {
            return Admission::Duplicate;
        }
        let admission = match offset > self.next_new {
            true => Admission::NewAfterGap {
                first: self.next_new,
                last: offset - 1,
            },
            false => Admission::New,
        };
        self.next_new = offset + 1;
        self.in_flight.insert(offset, 0);
        admission
    }

    /// The tokens of the acked record, or None if it was not in flight.
    fn ack(&mut self, offset: i64) -> Option<u64> {
        self.in_flight.remove(&offset)
    }

    /// The offset it is safe to commit now: the oldest record still in
    /// flight, or one past the newest consumed when none is.
    pub fn safe_commit(&self) -> i64 {
        self.in_flight
            .first_key_value()
            .map_or(self.next_new, |(&offset, _)| offset)
    }

    /// Records consumed whose output is not yet durable.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The next offset never consumed: lag is the high watermark minus this.
    pub fn next_offset(&self) -> i64 {
        self.next_new
    }
}

/// Offsets of every partition a worker reads.
#[derive(Clone, Debug, Default)]
pub struct OffsetBook {
    partitions: BTreeMap<i32, PartitionOffsets>,
    duplicates: u64,
    /// Tokens of the requests in flight (see [`OffsetBook::weigh`]).
    tokens: u64,
}

impl OffsetBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a partition at its committed offset (0 when none).
    pub fn resume(&mut self, partition: i32, committed: i64) {
        self.partitions
            .insert(partition, PartitionOffsets::resuming_at(committed));
    }

    /// Registers a partition read from `offset` that its group never
    /// committed (`start = "latest"`: the end of its log at start; or a
    /// partition created while serving, read from 0). The first commit
    /// records that position even if nothing is read and even if it is 0,
    /// so the next start resumes there instead of jumping to the end again.
    pub fn start_uncommitted(&mut self, partition: i32, offset: i64) {
        let mut p = PartitionOffsets::resuming_at(offset);
        p.last_commit = None;
        p.commit_start = true;
        self.partitions.insert(partition, p);
    }

    /// A record at `offset` of `partition` arrived.
    pub fn consume(&mut self, partition: i32, offset: i64) -> Result<Admission, OffsetError> {
        if offset < 0 {
            return Err(OffsetError::Negative { partition, offset });
        }
        let admission = self
            .partitions
            .entry(partition)
            .or_default()
            .consume(offset);
        if admission == Admission::Duplicate {
            self.duplicates += 1;
        }
        Ok(admission)
    }

    /// The output of the record at `offset` is durable on the broker.
    pub fn ack(&mut self, partition: i32, offset: i64) -> Result<(), OffsetError> {
        let acked = self
            .partitions
            .get_mut(&partition)
            .and_then(|p| p.ack(offset));
        match acked {
            Some(tokens) => {
                self.tokens -= tokens;
                Ok(())
            }
            None => Err(OffsetError::NotInFlight { partition, offset }),
        }
    }

    /// The request of an in-flight record brings `tokens` of work (its
    /// history, candidates and instruction), counted until it is acked, so
    /// that reads can pause on work in flight and not only on requests.
    /// A record not in flight is ignored.
    pub fn weigh(&mut self, partition: i32, offset: i64, tokens: u64) {
        let slot = self
            .partitions
            .get_mut(&partition)
            .and_then(|p| p.in_flight.get_mut(&offset));
        if let Some(slot) = slot {
            self.tokens = self.tokens - *slot + tokens;
            *slot = tokens;
        }
    }

    /// Tokens of the requests in flight.
    pub fn in_flight_tokens(&self) -> u64 {
        self.tokens
    }

    /// `(partition, offset)` commits that moved since the last call.
    pub fn take_commits(&mut self) -> Vec<(i32, i64)> {
        let mut out = Vec::new();
        for (&partition, p) in &mut self.partitions {
            let safe = p.safe_commit();
            if p.last_commit.is_none_or(|c| c < safe) && (safe > 0 || p.commit_start) {
                p.last_commit = Some(safe);
                out.push((partition, safe));
            }
        }
        out
    }

    /// The broker refused a commit: the next [`Self::take_commits`] sends
    /// every partition's safe offset again, moved or not.
    pub fn forget_commits(&mut self) {
        for p in self.partitions.values_mut() {
            p.last_commit = None;
        }
    }

    /// Every partition's safe commit, whether or not it moved (for the
    /// final, synchronous commit at shutdown).
    pub fn safe_commits(&self) -> Vec<(i32, i64)> {
        self.partitions
            .iter()
            .filter(|(_, p)| p.safe_commit() > 0 || p.commit_start)
            .map(|(&partition, p)| (partition, p.safe_commit()))
            .collect()
    }

    /// Records in flight over all partitions (the backpressure measure).
    pub fn in_flight(&self) -> usize {
        self.partitions.values().map(|p| p.in_flight()).sum()
    }

    /// Records skipped as already consumed or committed.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    pub fn partition(&self, partition: i32) -> Option<&PartitionOffsets> {
        self.partitions.get(&partition)
    }
}

/// Where each partition's log ended when this job started: records below
/// that may have been consumed by a previous incarnation that crashed with
/// their answers still on the way to the broker. Such an answer can reach
/// the response topic after the restart scan looked, so a recovered record
/// must be answered the way that incarnation most likely answered it (a
/// ranking), never shed; records above it are new and may be shed.
///
/// The end comes from two places, taking the larger: the broker's
/// ListOffsets answer at start ([`RecoveryBounds::new`]) and the high
/// watermark of the fetch that delivered a partition's first record
/// ([`RecoveryBounds::settle`]). Either may be past the true end at start
/// (records produced meanwhile are then treated as recovered, which is
/// safe); the second covers brokers whose ListOffsets answer lies before
/// the end of the log (tansu 0.6 answers a batch's base offset).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryBounds {
    /// partition -> (end of log, settled by a first fetch)
    ends: BTreeMap<i32, (i64, bool)>,
}

impl RecoveryBounds {
    /// `(partition, end of log as listed at start)`; a partition missing
    /// here gets its end from its first fetch.
    pub fn new(listed: impl IntoIterator<Item = (i32, i64)>) -> Self {
        Self {
            ends: listed
                .into_iter()
                .map(|(p, end)| (p, (end.max(0), false)))
                .collect(),
        }
    }

    /// Partitions read from now on, with their ends as listed now.
    pub fn extend(&mut self, listed: impl IntoIterator<Item = (i32, i64)>) {
        for (p, end) in listed {
            self.ends.entry(p).or_insert((end.max(0), false));
        }
    }

    /// The high watermark known when `partition`'s first record arrives;
    /// later calls change nothing (later ends cover new records).
    pub fn settle(&mut self, partition: i32, fetched_high: Option<i64>) {
        let entry = self.ends.entry(partition).or_insert((0, false));
        if !entry.1 {
            entry.0 = entry.0.max(fetched_high.unwrap_or(0));
            entry.1 = true;
        }
    }

    /// Whether the record at `offset` of `partition` was in the log when
    /// the job started (it may have been in flight at a crash).
    pub fn is_recovered(&self, partition: i32, offset: i64) -> bool {
        self.ends
            .get(&partition)
            .is_some_and(|&(end, _)| offset < end)
    }

    /// Whether `partition`'s first record fixed its end already.
    pub fn settled(&self, partition: i32) -> bool {
        self.ends
            .get(&partition)
            .is_some_and(|&(_, settled)| settled)
    }

    /// The end of `partition`'s log as far as it is known.
    pub fn end(&self, partition: i32) -> Option<i64> {
        self.ends.get(&partition).map(|&(end, _)| end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_start_position_is_committed_though_nothing_was_read() {
        let mut book = OffsetBook::new();
        book.start_uncommitted(0, 7);
        book.resume(1, 9);
        assert_eq!(book.take_commits(), vec![(0, 7)]);
        assert_eq!(book.take_commits(), vec![], "once");
        assert_eq!(book.consume(0, 6), Ok(Admission::Duplicate));
    }

    #[test]
    fn an_uncommitted_start_at_offset_zero_is_committed_too() {
        // An empty partition under `start = "latest"`: without a commit of
        // 0, a restart would start at the end again and skip every request
        // produced while the job was down.
        let mut book = OffsetBook::new();
        book.start_uncommitted(0, 0);
        book.resume(1, 0);
        assert_eq!(book.take_commits(), vec![(0, 0)]);
        assert_eq!(book.take_commits(), vec![], "once");
        assert_eq!(book.safe_commits(), vec![(0, 0)]);
        // A refused commit is sent again.
        book.forget_commits();
        assert_eq!(book.take_commits(), vec![(0, 0)]);
    }

    #[test]
    fn tokens_in_flight_are_counted_until_acked() {
        let mut book = OffsetBook::new();
        for o in 0..3 {
            assert_eq!(book.consume(2, o), Ok(Admission::New));
        }
        book.weigh(2, 0, 100);
        book.weigh(2, 1, 40);
        book.weigh(2, 1, 50); // re-weighed: replaces
        book.weigh(2, 9, 1_000); // not in flight: ignored
        book.weigh(7, 0, 1_000);
        assert_eq!(book.in_flight_tokens(), 150);
        book.ack(2, 0).unwrap();
        assert_eq!(book.in_flight_tokens(), 50);
        assert!(book.ack(2, 0).is_err(), "twice");
        assert_eq!(book.in_flight_tokens(), 50);
        book.ack(2, 1).unwrap();
        book.ack(2, 2).unwrap();
        assert_eq!((book.in_flight(), book.in_flight_tokens()), (0, 0));
    }
    use proptest::prelude::*;

    #[test]
    fn commits_wait_for_the_oldest_unacked_record() {
        let mut book = OffsetBook::new();
        for o in 0..4 {
            assert_eq!(book.consume(3, o), Ok(Admission::New));
        }
        book.ack(3, 1).unwrap();
        book.ack(3, 2).unwrap();
        assert_eq!(book.take_commits(), vec![], "offset 0 is still in flight");
        book.ack(3, 0).unwrap();
        assert_eq!(book.take_commits(), vec![(3, 3)]);
        assert_eq!(book.take_commits(), vec![], "nothing moved");
        book.ack(3, 3).unwrap();
        assert_eq!(book.take_commits(), vec![(3, 4)]);
        assert_eq!(
            book.ack(3, 3),
            Err(OffsetError::NotInFlight {
                partition: 3,
                offset: 3
            })
        );
    }

    #[test]
    fn offsets_jumped_over_are_reported_once() {
        let mut book = OffsetBook::new();
        book.resume(0, 10);
        assert_eq!(book.consume(0, 10), Ok(Admission::New));
        assert_eq!(
            book.consume(0, 14),
            Ok(Admission::NewAfterGap {
                first: 11,
                last: 13
            })
        );
        // The skipped ones arriving late are duplicates by the book (the
        // gap was reported); no new gap.
        assert_eq!(book.consume(0, 12), Ok(Admission::Duplicate));
        assert_eq!(book.consume(0, 15), Ok(Admission::New));
    }

    #[test]
    fn records_below_the_committed_offset_are_duplicates_after_a_restart() {
        let mut book = OffsetBook::new();
        book.resume(0, 10);
        assert_eq!(book.consume(0, 9), Ok(Admission::Duplicate));
        assert_eq!(book.consume(0, 10), Ok(Admission::New));
        assert_eq!(book.consume(0, 10), Ok(Admission::Duplicate));
        assert_eq!(book.duplicates(), 2);
        assert_eq!(
            book.take_commits(),
            vec![],
            "10 is in flight, 10 was committed"
        );
        book.ack(0, 10).unwrap();
        assert_eq!(book.take_commits(), vec![(0, 11)]);
        assert!(book.consume(0, -1).is_err());
    }

    #[test]
    fn records_in_the_log_at_start_are_recovered_and_later_ones_are_new() {
        // Partition 0 listed its end; partition 1's ListOffsets answer lies
        // before the end (tansu), which the first fetch corrects; partition
        // 2 was not listed at all.
        let mut bounds = RecoveryBounds::new([(0, 10), (1, 4)]);
        assert!(bounds.is_recovered(0, 9));
        assert!(!bounds.is_recovered(0, 10));
        bounds.settle(1, Some(25));
        assert!(bounds.is_recovered(1, 24));
        assert!(!bounds.is_recovered(1, 25));
        // Settled once: a later, larger watermark covers records produced
        // after the start, which are new.
        bounds.settle(1, Some(90));
        assert!(!bounds.is_recovered(1, 30));
        // A first fetch below the listed end keeps the listed end.
        bounds.settle(0, Some(3));
        assert_eq!(bounds.end(0), Some(10));
        assert!(!bounds.is_recovered(2, 0));
        bounds.settle(2, None);
        assert!(
            !bounds.is_recovered(2, 0),
            "an empty partition recovers nothing"
        );
        assert_eq!(RecoveryBounds::new([(3, -1)]).end(3), Some(0));
    }

    proptest! {
        /// Whatever the ack order, a commit never passes a record still in
        /// flight, commits only move forward, and once everything is acked
        /// the commit is one past the last offset consumed.
        #[test]
        fn commit_never_passes_an_unacked_record(
            gaps in prop::collection::vec(1i64..4, 1..60),
            order in prop::collection::vec(any::<prop::sample::Index>(), 60),
        ) {
            let mut book = OffsetBook::new();
            let mut offsets = Vec::new();
            let mut o = 0;
            // The first offset not read yet (a partition never resumed
            // starts at 0).
            let mut next = 0;
            for g in gaps {
                o += g;
                // Admitted, and any offsets jumped over named.
                let expected = match o > next {
                    true => Admission::NewAfterGap { first: next, last: o - 1 },
                    false => Admission::New,
                };
                prop_assert_eq!(book.consume(1, o), Ok(expected));
                next = o + 1;
                offsets.push(o);
            }
            let last = o;
            let mut pending = offsets.clone();
            let mut committed = 0;
            for ix in order {
                if pending.is_empty() {
                    break;
                }
                let off = pending.remove(ix.index(pending.len()));
                book.ack(1, off).unwrap();
                for (_, c) in book.take_commits() {
                    prop_assert!(c > committed);
                    prop_assert!(pending.iter().all(|&p| p >= c), "commit {} passes {:?}", c, pending);
                    committed = c;
                }
            }
            for off in pending {
                book.ack(1, off).unwrap();
            }
            let commits = book.take_commits();
            prop_assert_eq!(commits.last().map_or(committed, |c| c.1), last + 1);
            prop_assert_eq!(book.in_flight(), 0);
        }
    }
}
