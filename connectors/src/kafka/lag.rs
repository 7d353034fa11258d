//! Consumer lag per request partition, and whether it can still be
//! believed.
//!
//! Lag is the high watermark of the partition's last fetch response minus
//! the next offset to consume. librdkafka caches that watermark and keeps
//! it when fetches stop (a broker away, a partition its leader refuses),
//! without saying when it was filled; and the client reports a broker
//! that goes away once, if at all (the mock cluster's leader outage gives
//! the consumer no error). Left alone, the last lag measured before an
//! outage was reported for as long as it lasted.
//!
//! So a reading counts as refreshed only when it moved: the watermark or
//! the read position changed since the previous measurement, which only a
//! fetch that came back does. A reading that has not moved for longer than
//! the table's bound is stale: its lag is unknown (`None`; export NaN),
//! not the last value, until it moves again. The cache cannot tell a
//! partition nobody writes to from one whose fetches fail, so a quiet
//! partition's lag turns unknown after the bound too: an operator sees
//! "no fetch seen for that long", never a healthy number the job cannot
//! vouch for. Every reading has an age (since it last moved) for alerts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a reading that does not move still reports its lag: longer
/// than a reconnect or a quiet spell between requests usually lasts.
pub const LAG_STALE_AFTER: Duration = Duration::from_secs(60);

/// A partition's lag as it may be exported now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LagGauge {
    /// Records behind the end of the partition; `None` when stale
    /// (unknown: export NaN, not the last value).
    pub lag: Option<i64>,
    /// Since the reading last moved (a fetch came back).
    pub age: Duration,
}

/// What a measurement changed about a partition's staleness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LagChange {
    Unchanged,
    /// Unmoved for longer than the bound: its lag is unknown from now.
    TurnedStale {
        /// The last lag reported.
        lag: i64,
        unmoved_for: Duration,
    },
    /// Stale before, moved now.
    Recovered {
        lag: i64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Reading {
    high: i64,
    next: i64,
    moved_at: Instant,
    /// As of its last measurement (for [`LagChange`]).
    stale: bool,
}

impl Reading {
    fn lag(&self) -> i64 {
        (self.high - self.next).max(0)
    }
}

/// Lag readings of a job's request partitions (see the module doc).
#[derive(Debug)]
pub struct LagTable {
    readings: BTreeMap<i32, Reading>,
    stale_after: Duration,
}

impl Default for LagTable {
    fn default() -> Self {
        Self::new(LAG_STALE_AFTER)
    }
}

impl LagTable {
    /// A table whose readings go stale after `stale_after` unmoved.
    pub fn new(stale_after: Duration) -> Self {
        Self {
            readings: BTreeMap::new(),
            stale_after,
        }
    }

    /// Measures `partition` at `now`: `high` is its high watermark as of
    /// the last fetch response (`None`: none yet), `next` the next offset
    /// to consume. A partition never fetched from is left out.
    pub fn measure(
        &mut self,
        partition: i32,
        high: Option<i64>,
        next: i64,
        now: Instant,
    ) -> LagChange {
        let Some(r) = self.readings.get_mut(&partition) else {
            if let Some(high) = high {
                let reading = Reading {
                    high,
                    next,
                    moved_at: now,
                    stale: false,
                };
                self.readings.insert(partition, reading);
            }
            return LagChange::Unchanged;
        };
        // A watermark the cache lost is no newer than the one kept.
        let high = high.unwrap_or(r.high);
        if (high, next) != (r.high, r.next) {
            (r.high, r.next, r.moved_at) = (high, next, now);
        }
        let was_stale = r.stale;
        let unmoved_for = now.saturating_duration_since(r.moved_at);
        r.stale = unmoved_for > self.stale_after;
        match (was_stale, r.stale) {
            (false, true) => LagChange::TurnedStale {
                lag: r.lag(),
                unmoved_for,
            },
            (true, false) => LagChange::Recovered { lag: r.lag() },
            _ => LagChange::Unchanged,
        }
    }

    /// `partition`'s lag as it may be exported at `now`; `None` if it was
    /// never fetched from. Judged at `now`, not at the last measurement:
    /// a worker that stopped measuring cannot keep its lag fresh.
    pub fn gauge(&self, partition: i32, now: Instant) -> Option<LagGauge> {
        self.readings.get(&partition).map(|r| self.gauge_of(r, now))
    }

    /// Every measured partition's [`LagTable::gauge`] at `now`.
    pub fn gauges(&self, now: Instant) -> BTreeMap<i32, LagGauge> {
        self.readings
            .iter()
            .map(|(&p, r)| (p, self.gauge_of(r, now)))
            .collect()
    }

    fn gauge_of(&self, r: &Reading, now: Instant) -> LagGauge {
        let age = now.saturating_duration_since(r.moved_at);
        LagGauge {
            lag: (age <= self.stale_after).then(|| r.lag()),
            age,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(60);
    const STEP: Duration = Duration::from_secs(5);

    fn known(lag: i64, age: Duration) -> Option<LagGauge> {
        Some(LagGauge {
            lag: Some(lag),
            age,
        })
    }

    fn unknown(age: Duration) -> Option<LagGauge> {
        Some(LagGauge { lag: None, age })
    }

    /// The defect: a broker that goes away freezes the cached watermark,
    /// and the lag measured before went on being reported for the whole
    /// outage.
    #[test]
    fn a_frozen_reading_turns_unknown_after_the_bound_and_back_when_it_moves() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        table.measure(0, Some(10), 8, t0);
        // Within the bound the last lag stands, ageing.
        assert_eq!(
            table.measure(0, Some(10), 8, t0 + BOUND),
            LagChange::Unchanged
        );
        assert_eq!(table.gauge(0, t0 + BOUND), known(2, BOUND));
        let past = t0 + BOUND + STEP;
        assert_eq!(
            table.measure(0, Some(10), 8, past),
            LagChange::TurnedStale {
                lag: 2,
                unmoved_for: BOUND + STEP,
            }
        );
        assert_eq!(table.gauge(0, past), unknown(BOUND + STEP));
        // However long it lasts.
        let later = past + BOUND * 100;
        assert_eq!(table.measure(0, Some(10), 8, later), LagChange::Unchanged);
        assert_eq!(table.gauge(0, later), unknown(later - t0));
        // Fetches again: the watermark moved.
        let back = later + STEP;
        assert_eq!(
            table.measure(0, Some(50), 8, back),
            LagChange::Recovered { lag: 42 }
        );
        assert_eq!(table.gauge(0, back), known(42, Duration::ZERO));
    }

    #[test]
    fn a_reading_that_keeps_moving_stays_known() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        for i in 0..100u32 {
            let now = t0 + STEP * i;
            // Caught up, the end moving with new requests...
            let end = i64::from(i);
            assert_eq!(table.measure(0, Some(end), end, now), LagChange::Unchanged);
            assert_eq!(table.gauge(0, now), known(0, Duration::ZERO));
            // ...or draining a backlog whose end stands still.
            assert_eq!(
                table.measure(1, Some(1_000), end, now),
                LagChange::Unchanged
            );
            assert_eq!(table.gauge(1, now), known(1_000 - end, Duration::ZERO));
        }
    }

    #[test]
    fn a_partition_nobody_measures_goes_stale_when_read() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        table.measure(0, Some(10), 10, t0);
        assert_eq!(table.gauge(0, t0 + BOUND), known(0, BOUND));
        assert_eq!(
            table.gauges(t0 + BOUND + STEP)[&0],
            unknown(BOUND + STEP).unwrap()
        );
    }

    #[test]
    fn partitions_never_fetched_from_are_left_out_and_a_lost_watermark_keeps_the_last() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        table.measure(0, None, 0, t0);
        table.measure(1, Some(7), 3, t0);
        assert_eq!(table.gauge(0, t0), None);
        assert_eq!(
            table.gauges(t0),
            BTreeMap::from([(1, known(4, Duration::ZERO).unwrap())])
        );
        // Read on while the cache has no watermark: the last one counts.
        table.measure(1, None, 5, t0 + STEP);
        assert_eq!(table.gauge(1, t0 + STEP), known(2, Duration::ZERO));
        // Never below 0 (read past a watermark not refreshed yet).
        table.measure(1, None, 9, t0 + STEP * 2);
        assert_eq!(table.gauge(1, t0 + STEP * 2), known(0, Duration::ZERO));
        // Nothing moved: not refreshed.
        table.measure(1, None, 9, t0 + STEP * 3);
        assert_eq!(table.gauge(1, t0 + STEP * 3), known(0, STEP));
    }
}
