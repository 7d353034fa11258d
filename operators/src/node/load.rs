//! The node's load in event time: a backlog of tokens drained at the
//! service rate. It gives the router l(n) and each response its modelled
//! latency (deterministic, unlike wall latency).

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
}
