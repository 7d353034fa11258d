//! The node's load in event time: a backlog of tokens drained at the
//! service rate. It gives the router l(n) and each response its modelled
//! latency (deterministic, unlike wall latency). On the virtual clock the
//! router sees the requests not yet answered in modelled time instead
//! ([`VirtualLoad`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Tokens queued at the node, as of `at_ms`.
#[derive(Clone, Debug)]
pub struct Backlog {
    tokens: f64,
    at_ms: u64,
    service_tokens_per_ms: f64,
}

impl Backlog {
    pub fn new(service_tokens_per_ms: f64) -> Self {
        Self {
            tokens: 0.0,
            at_ms: 0,
            service_tokens_per_ms,
        }
    }

    /// Tokens still queued at `now_ms` (never negative; a time before the
    /// last addition drains nothing).
    pub fn at(&self, now_ms: u64) -> f64 {
        let drained = self.service_tokens_per_ms * now_ms.saturating_sub(self.at_ms) as f64;
        (self.tokens - drained).max(0.0)
    }

    /// Queues `tokens` of work at `now_ms`; returns the backlog including them.
    pub fn add(&mut self, now_ms: u64, tokens: f64) -> f64 {
        self.tokens = self.at(now_ms) + tokens;
        self.at_ms = self.at_ms.max(now_ms);
        self.tokens
    }

    /// Time to work off `backlog` tokens at the service rate, in ms.
    pub fn drain_ms(&self, backlog: f64) -> f64 {
        backlog / self.service_tokens_per_ms
    }
}

/// The load a node on the virtual clock reports to the router: the tokens
/// of the requests it has not answered yet in modelled time, which is
/// what `arrival` mode's in-flight signal counts on a real node. Not the
/// event-time model above: its configured rate has nothing to do with the
/// cost model the node is charged from (at HLEM's rates nearly every
/// routing decision was an overload fallback while nodes were busy 5% of
/// the time).
#[derive(Clone, Debug, Default)]
pub struct VirtualLoad {
    /// (modelled response time as f64 bits, tokens) of the requests not
    /// known to be answered; non-negative f64 bits order like the values.
    pending: BinaryHeap<Reverse<(u64, u64)>>,
    pending_tokens: u64,
    /// Tokens (whole requests, as the router counts its dispatches and
    /// as `pending_tokens` counts) per model ms charged so far: the rate
    /// the router drains the reported load at between reports. Computed
    /// tokens alone (reused history left out) drained a backlog of whole
    /// requests too slowly by the reuse, 1.5× at a third of reuse.
    charged_tokens: f64,
    charged_ms: f64,
}

/// What a report says about load: in-flight tokens, the tokens at load
/// 1.0 and the tokens served per ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReportedLoad {
    pub inflight_tokens: f64,
    pub token_capacity: f64,
    pub service_tokens_per_ms: f64,
}

impl VirtualLoad {
    /// Books a request of `tokens` whose response is out at `done_ms`,
    /// after `computed` tokens charged `ms` of the node's timeline (a
    /// request that computed nothing sets no rate).
    pub fn book(&mut self, tokens: u64, done_ms: f64, computed: f64, ms: f64) {
        let done = if done_ms.is_finite() {
            done_ms.max(0.0)
        } else {
            0.0
        };
        self.pending.push(Reverse((done.to_bits(), tokens)));
        self.pending_tokens += tokens;
        if computed.is_finite() && ms.is_finite() && computed > 0.0 && ms > 0.0 {
            self.charged_tokens += tokens as f64;
            self.charged_ms += ms;
        }
    }

    /// The load at `now_ms` against `token_capacity`; `service_tokens_per_ms`
    /// is the rate before anything was charged. Forgets the answered.
    pub fn report(
        &mut self,
        now_ms: u64,
        token_capacity: f64,
        service_tokens_per_ms: f64,
    ) -> ReportedLoad {
        let now = (now_ms as f64).to_bits();
        while let Some(Reverse((done, tokens))) = self.pending.peek().copied() {
            if done > now {
                break;
            }
            self.pending.pop();
            self.pending_tokens -= tokens;
        }
        let rate = if self.charged_ms > 0.0 {
            self.charged_tokens / self.charged_ms
        } else {
            service_tokens_per_ms
        };
        ReportedLoad {
            inflight_tokens: self.pending_tokens as f64,
            token_capacity,
            service_tokens_per_ms: rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_drains_at_the_service_rate_and_queues_new_work_on_top() {
        let mut b = Backlog::new(10.0);
        assert_eq!(b.add(100, 50.0), 50.0);
        assert_eq!(b.at(102), 30.0);
        assert_eq!(b.at(200), 0.0, "never negative");
        // Work added at 103 queues behind what is left (20 tokens).
        assert_eq!(b.add(103, 40.0), 60.0);
        assert_eq!(b.drain_ms(60.0), 6.0);
        // A request stamped before the last addition drains nothing.
        assert_eq!(b.add(101, 5.0), 65.0);
        assert_eq!(b.at(103), 65.0);
    }

    #[test]
    fn the_virtual_load_counts_the_tokens_not_yet_answered_in_modelled_time() {
        let mut v = VirtualLoad::default();
        // Nothing booked: the configured rate; an idle node reads 0.
        let idle = v.report(10, 2000.0, 20.0);
        assert_eq!(idle.inflight_tokens, 0.0);
        assert_eq!(
            (idle.token_capacity, idle.service_tokens_per_ms),
            (2000.0, 20.0)
        );
        // Two requests at 10 ms, answered at 12.5 and 15 ms; 500 tokens
        // (1,000 computed) charged 0.5 ms: 1,000 tokens per ms.
        v.book(300, 12.5, 600.0, 0.25);
        v.book(200, 15.0, 400.0, 0.25);
        v.book(50, 11.0, 0.0, 3.0); // nothing computed: no rate from it
        let r = v.report(10, 2000.0, 20.0);
        assert_eq!((r.inflight_tokens, r.token_capacity), (550.0, 2000.0));
        assert_eq!(r.service_tokens_per_ms, 1000.0);
        // Each leaves once its response is out, whatever the booking order.
        assert_eq!(v.report(12, 2000.0, 20.0).inflight_tokens, 500.0);
        assert_eq!(v.report(13, 2000.0, 20.0).inflight_tokens, 200.0);
        assert_eq!(v.report(15, 2000.0, 20.0).inflight_tokens, 0.0);
        assert!(v.pending.is_empty());
    }

    /// The reported load drains in the units it is counted in: a request
    /// of 1,000 tokens that reused 900 of them from its prefix and ran for
    /// 10 ms is gone from a replica's view when it is answered, not after
    /// ten times as long.
    #[test]
    fn the_reported_load_drains_by_its_answer_even_with_reused_history() {
        let mut v = VirtualLoad::default();
        v.book(1000, 20.0, 100.0, 10.0);
        let r = v.report(10, 1000.0, 20.0);
        assert_eq!(r.inflight_tokens, 1000.0);
        // The request is answered at 20 ms: the view drains it by then.
        assert!(
            r.inflight_tokens - r.service_tokens_per_ms * 10.0 <= 0.0,
            "{r:?}"
        );
    }
}
