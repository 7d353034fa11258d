//! Event time of one worker's Kafka partitions: each partition's watermark
//! is the newest event time it delivered; the worker may still emit
//! anything at or after the oldest watermark of its *active* partitions.
//! Partitions idle longer than a timeout (or paused for backpressure) stop
//! holding time back, and time never trails the newest event seen anywhere
//! in the job by more than `max_skew_ms`, so one slow producer cannot stall
//! every answer. Records behind the result are late: processed, counted.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, Default)]
struct PartitionTime {
    newest_ts: Option<u64>,
    last_record: Option<Instant>,
}

#[derive(Clone, Debug)]
pub struct PartitionClock {
    partitions: BTreeMap<i32, PartitionTime>,
    idle_after: Duration,
    max_skew_ms: u64,
}

impl PartitionClock {
    pub fn new(partitions: &[i32], idle_after: Duration, max_skew_ms: u64) -> Self {
        Self {
            partitions: partitions
                .iter()
                .map(|&p| (p, PartitionTime::default()))
                .collect(),
            idle_after,
            max_skew_ms,
        }
    }

    /// A record with event time `ts_ms` arrived on `partition` at `now`.
    pub fn observe(&mut self, partition: i32, ts_ms: u64, now: Instant) {
        let p = self.partitions.entry(partition).or_default();
        p.newest_ts = Some(p.newest_ts.map_or(ts_ms, |t| t.max(ts_ms)));
        p.last_record = Some(now);
    }

    /// The newest event time any of this worker's partitions delivered.
    pub fn newest(&self) -> Option<u64> {
        self.partitions.values().filter_map(|p| p.newest_ts).max()
    }

    /// The earliest event time this worker may still emit. `newest_in_job`
    /// is the newest event time any worker has seen; `paused` says reads are
    /// paused, so no partition is active.
    pub fn frontier(&self, now: Instant, paused: bool, newest_in_job: u64) -> u64 {
        let active = self.partitions.values().filter(|p| {
            !paused
                && p.last_record
                    .is_some_and(|t| now.saturating_duration_since(t) < self.idle_after)
        });
        let skew_floor = newest_in_job.saturating_sub(self.max_skew_ms);
        match active.filter_map(|p| p.newest_ts).min() {
            Some(oldest_active) => oldest_active.max(skew_floor),
            // Nothing is coming: release everything seen so far.
            None => newest_in_job.max(self.newest().unwrap_or(0)) + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_millis(100);

    #[test]
    fn the_oldest_active_partition_holds_time() {
        let t0 = Instant::now();
        let mut c = PartitionClock::new(&[0, 1], IDLE, 10_000);
        c.observe(0, 1_000, t0);
        c.observe(1, 1_500, t0);
        assert_eq!(c.frontier(t0, false, 1_500), 1_000);
        c.observe(0, 1_200, t0);
        assert_eq!(c.frontier(t0, false, 1_500), 1_200);
    }

    #[test]
    fn idle_partitions_stop_holding_time() {
        let t0 = Instant::now();
        let mut c = PartitionClock::new(&[0, 1], IDLE, 10_000);
        c.observe(0, 1_000, t0);
        let later = t0 + Duration::from_millis(50);
        c.observe(1, 1_500, later);
        // Partition 0 goes idle first, then both.
        assert_eq!(
            c.frontier(t0 + Duration::from_millis(120), false, 1_500),
            1_500
        );
        assert_eq!(
            c.frontier(t0 + Duration::from_millis(200), false, 1_500),
            1_501
        );
        // The job saw newer events elsewhere: an idle worker releases up to them.
        assert_eq!(
            c.frontier(t0 + Duration::from_millis(200), false, 9_000),
            9_001
        );
    }

    #[test]
    fn paused_reads_release_time_at_once() {
        let t0 = Instant::now();
        let mut c = PartitionClock::new(&[0], IDLE, 10_000);
        c.observe(0, 1_000, t0);
        assert_eq!(c.frontier(t0, true, 1_000), 1_001);
    }

    #[test]
    fn a_slow_partition_cannot_trail_the_job_by_more_than_the_skew() {
        let t0 = Instant::now();
        let mut c = PartitionClock::new(&[0, 1], IDLE, 2_000);
        c.observe(0, 1_000, t0);
        c.observe(1, 50_000, t0);
        assert_eq!(c.frontier(t0, false, 50_000), 48_000);
    }

    #[test]
    fn a_worker_that_saw_nothing_follows_the_job() {
        let c = PartitionClock::new(&[3], IDLE, 2_000);
        let now = Instant::now();
        assert_eq!(c.frontier(now, false, 0), 1);
        assert_eq!(c.frontier(now, false, 7_000), 7_001);
    }
}
