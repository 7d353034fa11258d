//! The host→device link: bandwidth, fixed latency and two priority lanes.
//! Miss traffic (a request waits on it) is served first-come first-served;
//! refill after a boundary move is a background job on the low-priority
//! lane, capped in bandwidth, that only uses time the miss lane leaves idle.
//! The link computes durations in nanoseconds of the caller's clock and
//! never sleeps: the node decides how to wait.

use std::collections::VecDeque;

use serde::Deserialize;

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

/// A link with a miss lane and a refill lane.
#[derive(Debug)]
pub struct Link {
    cfg: LinkConfig,
    /// The miss lane is busy until this time.
    miss_busy_until: u64,
    /// Refill jobs (bytes left, tag), oldest first.
    refill: VecDeque<(f64, u64)>,
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
        self.advance(now);
        let start = now.max(self.miss_busy_until);
        let done = start + self.cfg.latency_ns + Self::ns_for(bytes as f64, self.cfg.bytes_per_s);
        self.miss_busy_until = done;
        self.miss_bytes += bytes;
        done
    }

    /// Queues a refill job of `bytes` identified by `tag`.
    pub fn queue_refill(&mut self, bytes: u64, tag: u64) {
        self.refill.push_back((bytes as f64, tag));
        self.refill_queued += bytes as f64;
    }

    /// Runs the refill lane up to `now` in the time the miss lane left idle;
    /// returns the tags of the refill jobs that completed, oldest first.
    pub fn advance(&mut self, now: u64) -> Vec<u64> {
        let mut done = Vec::new();
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
                    done.push(front.1);
                    self.refill.pop_front();
                }
            }
        }
        self.refill_clock = self.refill_clock.max(now);
        if self.refill.is_empty() {
            self.refill_queued = 0.0;
        }
        done
    }

    /// Drops every queued refill job (e.g. the EMB share shrank again).
    pub fn cancel_refill(&mut self) {
        self.refill.clear();
        self.refill_queued = 0.0;
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
        l.queue_refill(1000, 7);
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
}
