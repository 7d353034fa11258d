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

use super::Resumed;

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
    /// As `New`, but below offsets this partition had read up to
    /// (`read_up_to`, exclusive), in a log that now ends before them
    /// (`log_end`): the log was created again or cut short while serving,
    /// and the broker's offsets start over. The partition's book starts
    /// over at this record (see [`OffsetBook::consume_checked`]).
    AfterLogReset { read_up_to: i64, log_end: i64 },
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
    /// In flight when the log started over ([`Admission::AfterLogReset`]):
    /// their records are gone, so they hold no commit back, but their acks
    /// still come (tokens of each; an offset may be orphaned more than once).
    orphans: BTreeMap<i64, Vec<u64>>,
    /// Past the resume point, where records below what was read are no
    /// longer the expected refetch of a restart: a record was admitted
    /// since the partition was registered, or its consumer fetches from the
    /// resume point itself (see [`OffsetBook::register`]).
    admitted: bool,
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
            orphans: BTreeMap::new(),
            admitted: false,
            last_commit: (committed > 0).then_some(committed),
            commit_start: false,
        }
    }

    /// `log_end` is asked only for a record below what was read, once past
    /// the resume point.
    fn consume(&mut self, offset: i64, log_end: impl FnOnce() -> Option<i64>) -> Admission {
        if offset < self.next_new {
            // Kafka hands out an offset once; what comes again is a restart's
            // refetch (before the resume point) or a broker repeating recent
            // records (tansu 0.6), both in a log that still reaches past what
            // was read. A log that ends below it started over.
            let reset = match self.admitted.then(log_end).flatten() {
                Some(end) if end < self.next_new => end,
                _ => return Admission::Duplicate,
            };
            let read_up_to = self.next_new;
            self.start_over(offset);
            self.in_flight.insert(offset, 0);
            return Admission::AfterLogReset {
                read_up_to,
                log_end: reset,
            };
        }
        let admission = match offset > self.next_new {
            true => Admission::NewAfterGap {
                first: self.next_new,
                last: offset - 1,
            },
            false => Admission::New,
        };
        self.next_new = offset + 1;
        self.admitted = true;
        self.in_flight.insert(offset, 0);
        admission
    }

    /// The log starts over at `offset`: what is in flight is orphaned (it
    /// holds no commit of the new log back, and its acks still count), and
    /// the next commit goes out whatever it is, lower than the last one.
    fn start_over(&mut self, offset: i64) {
        for (o, tokens) in std::mem::take(&mut self.in_flight) {
            self.orphans.entry(o).or_default().push(tokens);
        }
        self.next_new = offset + 1;
        self.last_commit = None;
        self.commit_start = true;
    }

    /// The tokens of the acked record, or None if it was not in flight.
    /// An offset both orphaned and in flight again releases the orphan
    /// first: the new record leaves only at the second ack, when both
    /// outputs are durable, so its commit never comes early.
    fn ack(&mut self, offset: i64) -> Option<u64> {
        if let Some(tokens) = self.orphans.get_mut(&offset) {
            let t = tokens.pop();
            if tokens.is_empty() {
                self.orphans.remove(&offset);
            }
            return t;
        }
        self.in_flight.remove(&offset)
    }

    /// The offset it is safe to commit now: the oldest record still in
    /// flight, or one past the newest consumed when none is.
    pub fn safe_commit(&self) -> i64 {
        self.in_flight
            .first_key_value()
            .map_or(self.next_new, |(&offset, _)| offset)
    }

    /// Records consumed whose output is not yet durable (orphans too).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.orphans.values().map(Vec::len).sum::<usize>()
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

    /// Registers a partition as its consumer opened it: committed at once
    /// when `commit_start` (see [`Resumed`]). When the consumer fetches
    /// from `offset` itself, a record below it can only come from a log
    /// that started over, so the log's end is checked from the first
    /// record on; with [`Resumed::refetches_below`] only once a record at
    /// or past `offset` came (before that, lower ones are the refetch).
    pub fn register(&mut self, r: &Resumed) {
        if r.commit_start {
            self.start_uncommitted(r.partition, r.offset);
        } else {
            self.resume(r.partition, r.offset);
        }
        if let Some(p) = self.partitions.get_mut(&r.partition) {
            p.admitted = !r.refetches_below;
        }
    }

    /// A record at `offset` of `partition` arrived.
    pub fn consume(&mut self, partition: i32, offset: i64) -> Result<Admission, OffsetError> {
        self.consume_checked(partition, offset, || None)
    }

    /// As [`Self::consume`], where `log_end` says where the partition's log
    /// ends now (the high watermark of the last fetch). It is asked only
    /// when a record below what was read arrives after the partition passed
    /// its resume point; a log that ends below what was read was created
    /// again or cut short, and the record is [`Admission::AfterLogReset`]:
    /// served, instead of skipped as a duplicate, and the partition's
    /// commits follow the new log from it.
    pub fn consume_checked(
        &mut self,
        partition: i32,
        offset: i64,
        log_end: impl FnOnce() -> Option<i64>,
    ) -> Result<Admission, OffsetError> {
        if offset < 0 {
            return Err(OffsetError::Negative { partition, offset });
        }
        let admission = self
            .partitions
            .entry(partition)
            .or_default()
            .consume(offset, log_end);
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

    /// `partition`'s log started over while serving: no record of the new
    /// log was in flight at a previous incarnation's crash.
    pub fn start_over(&mut self, partition: i32) {
        self.ends.insert(partition, (0, true));
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

    #[test]
    fn a_log_that_starts_over_before_the_first_record_is_served_when_fetched_at_the_commit() {
        let resumed = |refetches_below| Resumed {
            partition: 0,
            offset: 1_000,
            from_commit: true,
            past_end: None,
            commit_start: false,
            refetches_below,
        };
        // Fetched at the commit: a record below it comes from a new log.
        let mut book = OffsetBook::new();
        book.register(&resumed(false));
        assert_eq!(
            book.consume_checked(0, 0, || Some(3)),
            Ok(Admission::AfterLogReset {
                read_up_to: 1_000,
                log_end: 3
            })
        );
        assert_eq!(book.consume_checked(0, 1, || Some(3)), Ok(Admission::New));
        assert_eq!(book.take_commits(), vec![(0, 0)], "the new log's start");
        // The same log read again from its start is skipped.
        let mut book = OffsetBook::new();
        book.register(&resumed(false));
        assert_eq!(
            book.consume_checked(0, 0, || Some(1_200)),
            Ok(Admission::Duplicate)
        );
        // Fetched from the log's start (tansu): the refetch is expected, and
        // a log whose end is not yet known is not taken for a new one.
        let mut book = OffsetBook::new();
        book.register(&resumed(true));
        assert_eq!(
            book.consume_checked(0, 0, || Some(3)),
            Ok(Admission::Duplicate)
        );
        assert_eq!(book.consume_checked(0, 1_000, || None), Ok(Admission::New));
        assert!(matches!(
            book.consume_checked(0, 2, || Some(3)),
            Ok(Admission::AfterLogReset { .. })
        ));
    }

    #[test]
    fn a_log_that_starts_over_recovers_nothing_of_the_new_log() {
        let mut bounds = RecoveryBounds::new([(0, 50_000)]);
        assert!(bounds.is_recovered(0, 10));
        bounds.start_over(0);
        assert!(!bounds.is_recovered(0, 0));
        assert!(!bounds.is_recovered(0, 10));
        assert!(bounds.settled(0), "a later first fetch does not undo it");
        bounds.settle(0, Some(60_000));
        assert!(!bounds.is_recovered(0, 10));
    }

    #[test]
    fn a_log_that_starts_over_below_what_was_read_is_served_and_committed_anew() {
        let mut book = OffsetBook::new();
        book.resume(0, 0);
        for o in 0..10 {
            assert_eq!(book.consume(0, o), Ok(Admission::New));
            book.weigh(0, o, 7);
        }
        for o in 0..5 {
            book.ack(0, o).unwrap();
        }
        assert_eq!(book.take_commits(), vec![(0, 5)]);
        // The topic was created again: its log ends at 3, below 10.
        assert_eq!(
            book.consume_checked(0, 0, || Some(3)),
            Ok(Admission::AfterLogReset {
                read_up_to: 10,
                log_end: 3
            })
        );
        assert_eq!(book.duplicates(), 0);
        // Below the last commit, and sent: a restart resumes in the new log.
        assert_eq!(book.take_commits(), vec![(0, 0)]);
        // The old log's records in flight (5..=9) hold no commit back...
        book.ack(0, 0).unwrap();
        assert_eq!(book.take_commits(), vec![(0, 1)]);
        for o in 1..7 {
            assert_eq!(book.consume(0, o), Ok(Admission::New), "{o}");
        }
        assert_eq!((book.in_flight(), book.in_flight_tokens()), (11, 35));
        // ...and offset 5, in flight in both logs, leaves the book only at
        // its second ack: whichever output the first was, the commit waits.
        book.ack(0, 5).unwrap();
        for o in 1..5 {
            book.ack(0, o).unwrap();
        }
        assert_eq!(book.take_commits(), vec![(0, 5)]);
        book.ack(0, 5).unwrap();
        assert_eq!(book.take_commits(), vec![(0, 6)]);
        for o in [6, 7, 8, 9, 6] {
            book.ack(0, o).unwrap();
        }
        assert_eq!(book.take_commits(), vec![(0, 7)]);
        assert_eq!((book.in_flight(), book.in_flight_tokens()), (0, 0));
        assert!(book.ack(0, 9).is_err(), "acked once");
    }

    #[test]
    fn records_seen_again_in_a_log_that_still_reaches_past_them_are_duplicates() {
        let mut book = OffsetBook::new();
        book.resume(0, 10);
        // A restart's refetch (refetch_from_start): before the resume
        // point, the log's end is not even asked.
        let not_asked = || -> Option<i64> { panic!("log end asked before the resume point") };
        assert_eq!(
            book.consume_checked(0, 3, not_asked),
            Ok(Admission::Duplicate)
        );
        assert_eq!(book.consume(0, 10), Ok(Admission::New));
        assert_eq!(book.consume(0, 11), Ok(Admission::New));
        // A broker repeating a recent record (tansu 0.6), its log reaching
        // past it; or no fetch known: skipped, as before.
        assert_eq!(
            book.consume_checked(0, 10, || Some(12)),
            Ok(Admission::Duplicate)
        );
        assert_eq!(
            book.consume_checked(0, 10, || Some(40)),
            Ok(Admission::Duplicate)
        );
        assert_eq!(
            book.consume_checked(0, 10, || None),
            Ok(Admission::Duplicate)
        );
        assert_eq!(book.duplicates(), 4);
        assert_eq!(book.in_flight(), 2);
    }

    proptest! {
        /// A log that starts over while records of the old one are in
        /// flight: however the acks of both come in (the book cannot tell
        /// an old record's from a new one's at the same offset), a commit
        /// never passes a record of the new log whose output is not durable.
        #[test]
        fn a_log_reset_never_lets_a_commit_pass_an_unacked_new_record(
            old in 1i64..40,
            acked_before in prop::collection::vec(any::<bool>(), 40),
            new in 1i64..60,
            order in prop::collection::vec(any::<prop::sample::Index>(), 100),
        ) {
            let mut book = OffsetBook::new();
            book.resume(0, 0);
            // (offset, of the new log) not yet durable.
            let mut pending: Vec<(i64, bool)> = Vec::new();
            for o in 0..old {
                book.consume(0, o).unwrap();
                if acked_before[o as usize] {
                    book.ack(0, o).unwrap();
                } else {
                    pending.push((o, false));
                }
            }
            book.take_commits();
            let reset = book.consume_checked(0, 0, || Some(0)).unwrap();
            prop_assert_eq!(reset, Admission::AfterLogReset { read_up_to: old, log_end: 0 });
            pending.push((0, true));
            for o in 1..new {
                prop_assert_eq!(book.consume(0, o), Ok(Admission::New));
                pending.push((o, true));
            }
            for ix in order {
                if pending.is_empty() {
                    break;
                }
                let (o, _) = pending.remove(ix.index(pending.len()));
                book.ack(0, o).unwrap();
                for (_, c) in book.take_commits() {
                    prop_assert!(
                        pending.iter().all(|&(p, of_new)| !of_new || p >= c),
                        "commit {} passes {:?}", c, pending
                    );
                }
            }
            for (o, _) in pending {
                book.ack(0, o).unwrap();
            }
            prop_assert_eq!(book.partition(0).map(|p| p.safe_commit()), Some(new));
            prop_assert_eq!((book.in_flight(), book.in_flight_tokens()), (0, 0));
        }
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
