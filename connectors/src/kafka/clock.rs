//! Event time of one worker's Kafka partitions: each partition's watermark
//! is the newest event time it delivered; the worker may still emit
//! anything at or after the oldest watermark of its *active* partitions.
//! Partitions idle longer than a timeout (or paused for backpressure) stop
//! holding time back, and time never trails the newest event seen anywhere
//! in the job by more than `max_skew_ms`, so one slow producer cannot stall
//! every answer. Records behind the result are late: processed, counted.
//!
//! Event time comes from outside (the producer's `ts_ms`), so it is not
//! trusted blindly: [`entry_time`] serves a stamp far in the future of both
//! the wall clock and the job's event time at the current time instead, and
//! such a stamp never reaches [`PartitionClock::observe`]. All arithmetic
//! saturates, so no stamp (`u64::MAX` included) can overflow it.

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
            None => newest_in_job
                .max(self.newest().unwrap_or(0))
                .saturating_add(1),
        }
    }
}

/// The time a request enters the dataflow at, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// At its own `ts_ms`.
    OnTime(u64),
    /// Behind what the worker can still emit: at the emit floor.
    Late(u64),
    /// Stamped too far in the future to trust: at the emit floor, and the
    /// stamp must not move any watermark.
    Clamped(u64),
}

impl Entry {
    pub fn at(self) -> u64 {
        match self {
            Entry::OnTime(t) | Entry::Late(t) | Entry::Clamped(t) => t,
        }
    }
}

/// Whether `ts_ms` lies more than `max_future_ms` ahead of both the wall
/// clock (`wall_ms`, ms since the Unix epoch) and the job's event time
/// (`job_ms`). Both must hold: trace-relative stamps are far behind the
/// wall clock, and a job replaying the past runs far behind it too, yet
/// either may be legitimately ahead of the other.
pub fn too_far_ahead(ts_ms: u64, wall_ms: u64, job_ms: u64, max_future_ms: u64) -> bool {
    ts_ms > wall_ms.saturating_add(max_future_ms) && ts_ms > job_ms.saturating_add(max_future_ms)
}

/// Where a request stamped `ts_ms` enters: `emit_floor` is the earliest
/// time the worker can still emit, `job_ms` the newest event time the job
/// admitted (the skew reference of every worker's clock).
pub fn entry_time(
    ts_ms: u64,
    emit_floor: u64,
    wall_ms: u64,
    job_ms: u64,
    max_future_ms: u64,
) -> Entry {
    if too_far_ahead(ts_ms, wall_ms, job_ms.max(emit_floor), max_future_ms) {
        Entry::Clamped(emit_floor)
    } else if ts_ms < emit_floor {
        Entry::Late(emit_floor)
    } else {
        Entry::OnTime(ts_ms)
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

    #[test]
    fn the_frontier_saturates_at_the_end_of_time() {
        let t0 = Instant::now();
        let mut c = PartitionClock::new(&[0, 1], IDLE, 2_000);
        c.observe(0, u64::MAX, t0);
        // Paused or idle: "everything seen + 1" must not wrap to 0 (nor
        // panic in a debug build).
        assert_eq!(c.frontier(t0, true, 0), u64::MAX);
        assert_eq!(c.frontier(t0, true, u64::MAX), u64::MAX);
        let idle = t0 + 2 * IDLE;
        assert_eq!(c.frontier(idle, false, u64::MAX), u64::MAX);
        // Active: the skew floor saturates too.
        c.observe(1, 5, t0);
        assert_eq!(c.frontier(t0, false, u64::MAX), u64::MAX - 2_000);
        let fresh = PartitionClock::new(&[0], IDLE, u64::MAX);
        assert_eq!(fresh.frontier(t0, false, u64::MAX), u64::MAX);
    }

    const WALL: u64 = 1_764_000_000_000; // late 2025, ms since the epoch
    const AHEAD: u64 = 60_000;

    #[test]
    fn normal_stamps_enter_at_their_time_or_late() {
        // Epoch stamps near the wall clock.
        assert_eq!(
            entry_time(WALL, WALL - 10, WALL, WALL - 10, AHEAD),
            Entry::OnTime(WALL)
        );
        // A producer clock a little ahead of ours is still on time.
        assert_eq!(
            entry_time(WALL + 30_000, WALL, WALL, WALL, AHEAD),
            Entry::OnTime(WALL + 30_000)
        );
        // Trace-relative stamps (small numbers), on a trace-relative job.
        assert_eq!(
            entry_time(5_000, 4_000, WALL, 4_500, AHEAD),
            Entry::OnTime(5_000)
        );
        // A gap of hours in a trace-relative trace: far ahead of the job's
        // event time but behind the wall clock, so it is trusted.
        assert_eq!(
            entry_time(10 * 3_600_000, 4_000, WALL, 4_500, AHEAD),
            Entry::OnTime(10 * 3_600_000)
        );
        // Trace-relative stamps in a job that already saw epoch stamps: late.
        assert_eq!(
            entry_time(5_000, WALL, WALL, WALL, AHEAD),
            Entry::Late(WALL)
        );
        // A job replaying the future (its event time is already there).
        let future = WALL + 3_600_000;
        assert_eq!(
            entry_time(future + 10, future, WALL, future, AHEAD),
            Entry::OnTime(future + 10)
        );
    }

    #[test]
    fn far_future_stamps_are_clamped_to_the_emit_floor() {
        let ten_years = WALL + 10 * 365 * 86_400_000;
        let micros = WALL * 1_000;
        for ts in [ten_years, micros, u64::MAX, WALL + AHEAD + 1] {
            assert_eq!(
                entry_time(ts, WALL - 5, WALL, WALL - 3, AHEAD),
                Entry::Clamped(WALL - 5),
                "{ts}"
            );
            // A trace-relative job: the stamp is ahead of both as well.
            assert_eq!(entry_time(ts, 7, WALL, 9, AHEAD), Entry::Clamped(7), "{ts}");
        }
        // Just at the limit: trusted.
        assert_eq!(
            entry_time(WALL + AHEAD, WALL, WALL, WALL, AHEAD),
            Entry::OnTime(WALL + AHEAD)
        );
    }

    #[test]
    fn the_clamp_decision_saturates() {
        assert!(!too_far_ahead(u64::MAX, u64::MAX, 0, 1));
        assert!(!too_far_ahead(u64::MAX, 0, u64::MAX, 1));
        assert!(too_far_ahead(u64::MAX, u64::MAX - 2, u64::MAX - 2, 1));
        // max_future_ms = u64::MAX turns the clamp off.
        assert!(!too_far_ahead(u64::MAX, 0, 0, u64::MAX));
        assert!(too_far_ahead(u64::MAX, 0, 0, u64::MAX - 1));
        assert_eq!(
            entry_time(u64::MAX, u64::MAX, u64::MAX, u64::MAX, 0),
            Entry::OnTime(u64::MAX)
        );
    }

    #[test]
    fn clamped_stamps_never_move_the_clock() {
        // What the ingest does: only entries that are not clamped are observed.
        let t0 = Instant::now();
        let mut c = PartitionClock::new(&[0], IDLE, 2_000);
        let mut job = 0u64;
        for ts in [WALL, u64::MAX, WALL * 1_000, WALL + 1] {
            let e = entry_time(ts, c.frontier(t0, false, job), WALL, job, AHEAD);
            if !matches!(e, Entry::Clamped(_)) {
                c.observe(0, e.at(), t0);
                job = job.max(e.at());
            }
        }
        assert_eq!(c.newest(), Some(WALL + 1));
        assert_eq!(c.frontier(t0, true, job), WALL + 2);
    }
}
