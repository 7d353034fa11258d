//! The host→device link: bandwidth, fixed latency and two priority lanes.
//! Miss traffic (a request waits on it) is served first-come first-served;
//! refill after a boundary move is a background job on the low-priority
//! lane, capped in bandwidth, that only uses time the miss lane leaves idle.
//! The link computes durations in nanoseconds of the caller's clock and
//! never sleeps: the node decides how to wait.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Link parameters.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkConfig {
    /// Bytes per second of the link (PCIe-like).
    pub bytes_per_s: f64,
    /// Fixed latency per miss transfer, ns.
    pub latency_ns: u64,
    /// Cap of the refill lane, bytes per second.
    pub refill_bytes_per_s: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            bytes_per_s: 16e9,
            latency_ns: 10_000,
            refill_bytes_per_s: 2e9,
        }
    }
}

/// Where the refill jobs went: `submitted == completed + pending + cancelled`
/// at every moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RefillCounts {
    pub submitted: u64,
    /// Finished and handed to the caller by [`Link::advance`].
    pub completed: u64,
    /// Queued, or finished but not yet handed over.
    pub pending: u64,
    /// Dropped by [`Link::cancel_refill`] before they finished.
    pub cancelled: u64,
}

/// A link with a miss lane and a refill lane.
#[derive(Clone, Debug)]
pub struct Link {
    cfg: LinkConfig,
    /// The miss lane is busy until this time.
    miss_busy_until: u64,
    /// Refill jobs (bytes left, tag), oldest first.
    refill: VecDeque<(f64, u64)>,
    /// Tags of jobs that finished while the lane ran inside a miss transfer;
    /// the next `advance` hands them over.
    finished: Vec<u64>,
    counts: RefillCounts,
    refill_queued: f64,
    /// Refill has been simulated up to here.
    refill_clock: u64,
    miss_bytes: u64,
    refill_bytes_done: f64,
}

impl Link {
    pub fn new(cfg: LinkConfig) -> Self {
        Self {
            cfg,
            miss_busy_until: 0,
            refill: VecDeque::new(),
            finished: Vec::new(),
            counts: RefillCounts::default(),
            refill_queued: 0.0,
            refill_clock: 0,
            miss_bytes: 0,
            refill_bytes_done: 0.0,
        }
    }

    pub fn config(&self) -> LinkConfig {
        self.cfg
    }

    fn ns_for(bytes: f64, per_s: f64) -> u64 {
        if per_s <= 0.0 {
            return u64::MAX / 4;
        }
        (bytes / per_s * 1e9).ceil() as u64
    }

    /// Schedules a miss transfer of `bytes` issued at `now`; returns when it
    /// completes. Refill never delays it.
    pub fn miss_transfer(&mut self, bytes: u64, now: u64) -> u64 {
        // Jobs finishing here are kept for the next `advance`, not dropped.
        self.run_refill(now);
        let start = now.max(self.miss_busy_until);
        let done = start
            .saturating_add(self.cfg.latency_ns)
            .saturating_add(Self::ns_for(bytes as f64, self.cfg.bytes_per_s));
        self.miss_busy_until = done;
        self.miss_bytes += bytes;
        done
    }

    /// Queues a refill job of `bytes` identified by `tag` at `now`. The lane
    /// is first run up to `now`, so the job gets no credit for idle time
    /// from before it was queued.
    pub fn queue_refill(&mut self, bytes: u64, tag: u64, now: u64) {
        self.run_refill(now);
        self.refill.push_back((bytes as f64, tag));
        self.refill_queued += bytes as f64;
        self.counts.submitted += 1;
    }

    /// Runs the refill lane up to `now` in the time the miss lane left idle;
    /// returns the tags of the refill jobs that completed since the last
    /// call (including those that finished during a miss transfer), oldest
    /// first.
    pub fn advance(&mut self, now: u64) -> Vec<u64> {
        self.run_refill(now);
        self.counts.completed += self.finished.len() as u64;
        std::mem::take(&mut self.finished)
    }

    /// Moves refill bytes up to `now`; finished tags go to `finished`.
    fn run_refill(&mut self, now: u64) {
        let start = self.refill_clock.max(self.miss_busy_until);
        if now > start {
            let mut budget = (now - start) as f64 * 1e-9 * self.refill_bandwidth();
            while budget > 0.0
                && let Some(front) = self.refill.front_mut()
            {
                let used = front.0.min(budget);
                front.0 -= used;
                budget -= used;
                self.refill_queued -= used;
                self.refill_bytes_done += used;
                if front.0 <= 1e-6 {
                    self.finished.push(front.1);
                    self.refill.pop_front();
                }
            }
        }
        self.refill_clock = self.refill_clock.max(now);
        if self.refill.is_empty() {
            self.refill_queued = 0.0;
        }
    }

    /// Drops every unfinished refill job (e.g. the EMB share shrank again)
    /// and returns their tags. Jobs already finished stay due to the next
    /// `advance`: their bytes have crossed the link.
    pub fn cancel_refill(&mut self) -> Vec<u64> {
        let tags: Vec<u64> = self.refill.drain(..).map(|(_, tag)| tag).collect();
        self.counts.cancelled += tags.len() as u64;
        self.refill_queued = 0.0;
        tags
    }

    /// Refill jobs by outcome.
    pub fn refill_counts(&self) -> RefillCounts {
        RefillCounts {
            pending: (self.refill.len() + self.finished.len()) as u64,
            ..self.counts
        }
    }

    /// Bytes waiting on the refill lane.
    pub fn refill_queued_bytes(&self) -> u64 {
        self.refill_queued.max(0.0).round() as u64
    }

    /// Rate of the refill lane while the miss lane is idle, bytes/s.
    pub fn refill_bandwidth(&self) -> f64 {
        self.cfg.refill_bytes_per_s.min(self.cfg.bytes_per_s)
    }

    /// Bytes moved so far: (miss lane, refill lane).
    pub fn bytes_moved(&self) -> (u64, u64) {
        (self.miss_bytes, self.refill_bytes_done.round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> Link {
        // 1 byte/ns, 100 ns latency, refill capped at 0.5 byte/ns.
        Link::new(LinkConfig {
            bytes_per_s: 1e9,
            latency_ns: 100,
            refill_bytes_per_s: 0.5e9,
        })
    }

    #[test]
    fn misses_queue_behind_each_other() {
        let mut l = link();
        assert_eq!(l.miss_transfer(1000, 0), 1100);
        assert_eq!(l.miss_transfer(1000, 500), 2200);
        assert_eq!(l.miss_transfer(10, 5000), 5110);
    }

    #[test]
    fn refill_yields_to_misses_and_respects_its_cap() {
        let mut l = link();
        l.queue_refill(1000, 7, 0);
        assert_eq!(l.refill_queued_bytes(), 1000);
        // A miss at 0 occupies the link until 1100: refill waits.
        assert_eq!(l.miss_transfer(1000, 0), 1100);
        assert!(l.advance(1100).is_empty());
        assert_eq!(l.refill_queued_bytes(), 1000);
        // 1000 ns idle at 0.5 byte/ns moves 500 bytes.
        assert!(l.advance(2100).is_empty());
        assert_eq!(l.refill_queued_bytes(), 500);
        // A miss is not delayed by the pending refill.
        assert_eq!(l.miss_transfer(100, 2100), 2300);
        assert_eq!(l.advance(3300), vec![7]);
        assert_eq!(l.refill_queued_bytes(), 0);
        assert_eq!(l.bytes_moved(), (1100, 1000));
        assert_eq!(l.refill_bandwidth(), 0.5e9);
    }

    #[test]
    fn refill_finishing_during_a_miss_is_handed_over() {
        let mut l = link();
        l.queue_refill(100, 1, 0);
        l.queue_refill(100, 2, 0);
        // Idle from 0 to 1000 at 0.5 byte/ns: both jobs finish before the miss.
        assert_eq!(l.miss_transfer(10, 1000), 1110);
        assert_eq!(l.advance(1110), vec![1, 2]);
        assert!(l.advance(5000).is_empty());
    }

    /// A job queued after the lane sat idle is not credited with that idle
    /// time: it moves bytes only from when it was queued.
    #[test]
    fn refill_is_not_credited_with_time_before_it_was_queued() {
        let mut l = link();
        assert_eq!(l.miss_transfer(10, 0), 110);
        assert!(l.advance(200).is_empty());
        // The lane sits idle from 200 to 10,000; the job arrives at 10,000.
        l.queue_refill(1000, 3, 10_000);
        // 1,000 bytes at 0.5 byte/ns take 2,000 ns from 10,000.
        assert!(l.advance(11_000).is_empty());
        assert_eq!(l.refill_queued_bytes(), 500);
        assert_eq!(l.advance(12_000), vec![3]);
    }

    /// Misses, refills, advances and cancels interleaved at random: every
    /// job is handed over exactly once or cancelled, never lost.
    #[test]
    fn every_refill_job_completes_or_is_accounted_for() {
        use rand::{RngExt, SeedableRng};
        use std::collections::BTreeSet;
        for seed in 0..40u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut l = link();
            let (mut now, mut next_tag) = (0u64, 0u64);
            let mut queued = BTreeSet::new();
            let (mut completed, mut cancelled) = (BTreeSet::new(), BTreeSet::new());
            for _ in 0..400 {
                now += rng.random_range(0..400u64);
                match rng.random_range(0..10u32) {
                    0..=3 => {
                        l.queue_refill(rng.random_range(0..300u64), next_tag, now);
                        queued.insert(next_tag);
                        next_tag += 1;
                    }
                    4..=6 => {
                        l.miss_transfer(rng.random_range(1..500u64), now);
                    }
                    7..=8 => {
                        for t in l.advance(now) {
                            assert!(queued.contains(&t), "seed {seed}: unknown tag {t}");
                            assert!(completed.insert(t), "seed {seed}: tag {t} twice");
                        }
                    }
                    _ => {
                        for t in l.cancel_refill() {
                            assert!(!completed.contains(&t), "seed {seed}: {t} done");
                            assert!(cancelled.insert(t), "seed {seed}: {t} cancelled twice");
                        }
                    }
                }
                let c = l.refill_counts();
                assert_eq!(c.submitted, next_tag, "seed {seed}");
                assert_eq!(
                    c.submitted,
                    c.completed + c.pending + c.cancelled,
                    "seed {seed}: {c:?}"
                );
                assert_eq!(c.completed, completed.len() as u64, "seed {seed}");
                assert_eq!(c.cancelled, cancelled.len() as u64, "seed {seed}");
            }
            // An idle link eventually hands over everything still pending.
            now += 1_000_000_000;
            completed.extend(l.advance(now));
            let c = l.refill_counts();
            assert_eq!(c.pending, 0, "seed {seed}: {c:?}");
            assert_eq!(completed.len() + cancelled.len(), next_tag as usize);
            assert!(completed.is_disjoint(&cancelled));
        }
    }
}
