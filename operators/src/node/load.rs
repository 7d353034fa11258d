//! The node's load in event time: a backlog of tokens drained at the
//! service rate. It gives the router l(n) and each response its modelled
//! latency (deterministic, unlike wall latency). On the virtual clock the
//! node's compute timeline is the backlog instead ([`VirtualLoad`]).

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

/// The load a node on the virtual clock reports to the router: its
/// modelled backlog (the compute timeline ahead of now), not the
/// event-time model above, whose configured rate has nothing to do with
/// the cost model the node is charged from (at HLEM's rates nearly every
/// routing decision was an overload fallback while nodes were busy 5% of
/// the time).
///
/// The router counts load in tokens and drains it at the reported rate, so
/// the backlog is given in tokens at the rate the node has been charged so
/// far: what the in-flight signal of `arrival` mode would count on the
/// modelled device, over the same `node.token_capacity`.
#[derive(Clone, Debug, Default)]
pub struct VirtualLoad {
    tokens: f64,
    ms: f64,
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
    /// Books `tokens` of work charged `ms` on the node's timeline.
    pub fn charge(&mut self, tokens: f64, ms: f64) {
        if tokens.is_finite() && ms.is_finite() && tokens > 0.0 && ms > 0.0 {
            self.tokens += tokens;
            self.ms += ms;
        }
    }

    /// The load at `now_ms` of a node whose model is free at `free_at_ms`,
    /// against `token_capacity`; `service_tokens_per_ms` is the rate
    /// before anything was charged.
    pub fn report(
        &self,
        free_at_ms: f64,
        now_ms: u64,
        token_capacity: f64,
        service_tokens_per_ms: f64,
    ) -> ReportedLoad {
        let rate = if self.ms > 0.0 {
            self.tokens / self.ms
        } else {
            service_tokens_per_ms
        };
        let backlog_ms = (free_at_ms - now_ms as f64).max(0.0);
        ReportedLoad {
            inflight_tokens: backlog_ms * rate,
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
    fn the_virtual_load_is_the_timeline_ahead_in_tokens_at_the_charged_rate() {
        let mut v = VirtualLoad::default();
        // Nothing charged yet: the configured rate; an idle node reads 0.
        let idle = v.report(0.0, 10, 2000.0, 20.0);
        assert_eq!(idle.inflight_tokens, 0.0);
        assert_eq!(
            (idle.token_capacity, idle.service_tokens_per_ms),
            (2000.0, 20.0)
        );
        // 1,000 tokens charged 0.5 ms: 2,000 tokens per ms, a device far
        // faster than the configured 20.
        v.charge(1000.0, 0.5);
        v.charge(0.0, 3.0); // nothing computed: no rate from it
        let r = v.report(60.0, 10, 2000.0, 20.0);
        assert_eq!(r.service_tokens_per_ms, 2000.0);
        // 50 ms of timeline ahead: 100,000 tokens at that rate, against the
        // configured capacity.
        assert_eq!((r.inflight_tokens, r.token_capacity), (100_000.0, 2000.0));
        // Drained at the reported rate, it is gone when the model is free.
        let later = r.inflight_tokens - 50.0 * r.service_tokens_per_ms;
        assert!(later.abs() < 1e-6);
        // A timeline behind now is no backlog.
        assert_eq!(v.report(5.0, 10, 2000.0, 20.0).inflight_tokens, 0.0);
    }
}
