//! Consumer lag per request partition, and whether it can still be
//! believed.
//!
//! Lag is the partition's end minus the next offset to consume. The end
//! comes from two places: the high watermark of the partition's last fetch
//! response, which librdkafka caches, and the broker's own answer to a
//! ListOffsets request, which the job asks for a partition whose reading
//! has not moved for a while ([`LagTable::to_confirm`], [`LagTable::confirm`]).
//! librdkafka keeps its cached watermark when fetches stop (a broker away,
//! a partition its leader refuses) without saying when it was filled, and
//! the client reports a broker that goes away once, if at all (the mock
//! cluster's leader outage gives the consumer no error). Left alone, the
//! last lag measured before an outage was reported for as long as it
//! lasted.
//!
//! So a reading counts as known only while something vouches for it: the
//! watermark or the read position changed (which only a fetch that came
//! back does), or the broker answered for the partition's end. A reading
//! nothing vouched for for longer than the table's bound is stale: its lag
//! is unknown (`None`; export NaN), not the last value, until one does.
//! Before the broker's answers were asked for, a partition nobody writes
//! to looked the same as one whose fetches fail and its lag turned unknown
//! after the bound; now it stays known while the broker answers for it.
//! Where fetches fail but the broker still answers, the lag follows the
//! broker's end: it grows as records wait. Every reading has an age (since
//! something last vouched for it) for alerts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a reading nothing vouched for still reports its lag: longer
/// than a reconnect usually lasts.
pub const LAG_STALE_AFTER: Duration = Duration::from_secs(60);

/// A reading unconfirmed for this share of the bound is due for the
/// broker's answer: four tries before it turns unknown.
const CONFIRM_AFTER_SHARE: u32 = 4;

/// A partition's lag as it may be exported now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LagGauge {
    /// Records behind the end of the partition; `None` when stale
    /// (unknown: export NaN, not the last value).
    pub lag: Option<i64>,
    /// Since something last vouched for the reading: it moved (a fetch
    /// came back) or the broker answered for the partition's end.
    pub age: Duration,
}

/// What a measurement changed about a partition's staleness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LagChange {
    Unchanged,
    /// Unconfirmed for longer than the bound: its lag is unknown from now.
    TurnedStale {
        /// The last lag reported.
        lag: i64,
        unconfirmed_for: Duration,
    },
    /// Stale before, vouched for now.
    Recovered {
        lag: i64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Reading {
    /// The cached watermark as last measured.
    high: i64,
    /// The broker's latest answer for the partition's end, where it was
    /// past `high` then (records the consumer had not fetched yet).
    broker_end: Option<i64>,
    next: i64,
    /// When something last vouched for the reading.
    known_at: Instant,
    /// As of its last measurement (for [`LagChange`]).
    stale: bool,
}

impl Reading {
    fn lag(&self) -> i64 {
        (self.high.max(self.broker_end.unwrap_or(i64::MIN)) - self.next).max(0)
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
                    broker_end: None,
                    next,
                    known_at: now,
                    stale: false,
                };
                self.readings.insert(partition, reading);
            }
            return LagChange::Unchanged;
        };
        // A watermark the cache lost is no newer than the one kept.
        let high = high.unwrap_or(r.high);
        if (high, next) != (r.high, r.next) {
            (r.high, r.next, r.known_at) = (high, next, now);
            // A fetch caught up with what the broker said.
            r.broker_end = r.broker_end.filter(|&end| end > high);
        }
        let was_stale = r.stale;
        let unconfirmed_for = now.saturating_duration_since(r.known_at);
        r.stale = unconfirmed_for > self.stale_after;
        match (was_stale, r.stale) {
            (false, true) => LagChange::TurnedStale {
                lag: r.lag(),
                unconfirmed_for,
            },
            (true, false) => LagChange::Recovered { lag: r.lag() },
            _ => LagChange::Unchanged,
        }
    }

    /// Partitions whose readings nothing vouched for for a quarter of the
    /// bound at `now`, the longest unconfirmed first: the ones to ask the
    /// broker about ([`LagTable::confirm`]).
    pub fn to_confirm(&self, now: Instant) -> Vec<i32> {
        let after = self.stale_after / CONFIRM_AFTER_SHARE;
        let mut due: Vec<(Instant, i32)> = self
            .readings
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.known_at) >= after)
            .map(|(&p, r)| (r.known_at, p))
            .collect();
        due.sort();
        due.into_iter().map(|(_, p)| p).collect()
    }

    /// The broker answered at `now` that `partition`'s log ends at `end`:
    /// the reading is known as of now, its end no earlier than that. A
    /// partition this table does not measure is left out.
    pub fn confirm(&mut self, partition: i32, end: i64, now: Instant) {
        if let Some(r) = self.readings.get_mut(&partition) {
            r.broker_end = (end > r.high).then_some(end);
            r.known_at = r.known_at.max(now);
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
        let age = now.saturating_duration_since(r.known_at);
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
                unconfirmed_for: BOUND + STEP,
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

    /// A partition nobody writes to: the reading stands still, and the
    /// broker's answer for its end keeps it known.
    #[test]
    fn a_quiet_partition_the_broker_answers_for_stays_known() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        table.measure(0, Some(10), 10, t0);
        assert!(table.to_confirm(t0 + BOUND / 8).is_empty());
        let mut now = t0;
        for _ in 0..20 {
            now += BOUND / 2;
            // Due once a quarter of the bound went by unconfirmed.
            assert_eq!(table.to_confirm(now), [0]);
            table.confirm(0, 10, now);
            assert!(table.to_confirm(now).is_empty());
            assert_eq!(table.measure(0, Some(10), 10, now), LagChange::Unchanged);
            assert_eq!(table.gauge(0, now), known(0, Duration::ZERO));
        }
        // The broker stops answering: unknown once the bound has passed.
        let later = now + BOUND + STEP;
        assert!(matches!(
            table.measure(0, Some(10), 10, later),
            LagChange::TurnedStale { lag: 0, .. }
        ));
        assert_eq!(table.gauge(0, later), unknown(BOUND + STEP));
        // An answer again: known, and said at the next measurement.
        table.confirm(0, 10, later);
        assert_eq!(
            table.measure(0, Some(10), 10, later),
            LagChange::Recovered { lag: 0 }
        );
        // A partition not measured here is not asked about.
        table.confirm(7, 99, later);
        assert_eq!(table.gauge(7, later), None);
    }

    /// Fetches fail but the broker answers: the lag follows the broker's
    /// end (records wait) until a fetch catches up.
    #[test]
    fn the_brokers_end_past_the_cached_watermark_is_the_lag() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        table.measure(0, Some(10), 8, t0);
        table.confirm(0, 25, t0 + STEP);
        assert_eq!(table.gauge(0, t0 + STEP), known(17, Duration::ZERO));
        // The cache unchanged: the broker's end stands.
        table.measure(0, Some(10), 8, t0 + STEP * 2);
        assert_eq!(table.gauge(0, t0 + STEP * 2), known(17, STEP));
        // A broker answering below the cache (tansu gives the last batch's
        // base offset) vouches for the reading without lowering it.
        table.confirm(0, 9, t0 + STEP * 3);
        assert_eq!(table.gauge(0, t0 + STEP * 3), known(2, Duration::ZERO));
        table.confirm(0, 25, t0 + STEP * 4);
        // A fetch brings the cache past it: the cache counts again.
        table.measure(0, Some(30), 12, t0 + STEP * 5);
        assert_eq!(table.gauge(0, t0 + STEP * 5), known(18, Duration::ZERO));
        // ...and a fetch short of it keeps the broker's end.
        table.confirm(0, 40, t0 + STEP * 6);
        table.measure(0, Some(35), 12, t0 + STEP * 7);
        assert_eq!(table.gauge(0, t0 + STEP * 7), known(28, Duration::ZERO));
    }

    #[test]
    fn partitions_due_for_an_answer_come_longest_unconfirmed_first() {
        let t0 = Instant::now();
        let mut table = LagTable::new(BOUND);
        table.measure(0, Some(1), 1, t0 + STEP);
        table.measure(1, Some(1), 1, t0);
        table.measure(2, Some(1), 1, t0 + BOUND);
        assert_eq!(table.to_confirm(t0 + BOUND / 2), [1, 0]);
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
