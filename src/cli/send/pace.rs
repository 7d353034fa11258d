//! When `send` sends each request, and what it sends for it. No I/O.

use std::time::Duration;

use grflow_connectors::kafka::{History, WireRequest};
use grflow_pipeline::Speed;
use grflow_traces::Request;

/// The highest `--rps`.
pub const MAX_RPS: f64 = 1e6;

/// When a request is due, from the start of sending.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// By the trace's event times, at this speed.
    Trace(Speed),
    /// At a fixed rate, requests per second.
    Rate(f64),
}

impl Pace {
    /// When the `index`-th request (0-based) with event time `ts_ms` is
    /// due, the trace starting at `origin_ms`; `None`: at once.
    pub fn due(&self, index: u64, ts_ms: u64, origin_ms: u64) -> Option<Duration> {
        match *self {
            // Paced as `replay` paces (a stamp absurdly far ahead waits
            // "forever", Ctrl-C stops it, rather than overflowing).
            Pace::Trace(speed) => speed.wall_time(ts_ms.saturating_sub(origin_ms)),
            Pace::Rate(rps) => {
                Some(Duration::try_from_secs_f64(index as f64 / rps).unwrap_or(Duration::MAX))
            }
        }
    }
}

/// The message for one trace request: its history as a prefix of the
/// catalog's users table, stamped `ts_ms`, its id moved by `offset`.
pub fn wire_request(r: &Request, ts_ms: u64, offset: u64) -> Option<WireRequest> {
    Some(WireRequest {
        req_id: r.req_id.checked_add(offset)?,
        user_id: r.user_id,
        ts_ms,
        candidates: r.candidates.clone(),
        history: History::Prefix(r.hist_len),
        mode: r.mode,
        history_dropped: 0,
    })
}

/// What one pass over the trace spans, learnt during the first pass: a
/// `--loop` moves every later pass past it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TraceSpan {
    requests: u64,
    max_req_id: u64,
    /// The least and greatest event time: a trace need not be in time
    /// order (its row groups may run backwards).
    first_ts_ms: u64,
    last_ts_ms: u64,
}

impl TraceSpan {
    pub fn observe(&mut self, r: &Request) {
        self.first_ts_ms = match self.requests {
            0 => r.ts_ms,
            _ => self.first_ts_ms.min(r.ts_ms),
        };
        self.requests += 1;
        self.max_req_id = self.max_req_id.max(r.req_id);
        self.last_ts_ms = self.last_ts_ms.max(r.ts_ms);
    }

    pub fn is_empty(&self) -> bool {
        self.requests == 0
    }

    /// How pass `pass` (0 = the trace as it is) is moved: (added to each
    /// req_id besides `--req-id-offset`, added to each event time). Ids
    /// move by the trace's largest id + 1, so no pass repeats another's;
    /// event times by the trace's span plus one mean gap between requests,
    /// so paced passes follow each other at the trace's rate and the
    /// stamps of `--trace-ts` keep moving forward. `None` on overflow.
    pub fn shift(&self, pass: u64) -> Option<(u64, u64)> {
        if pass == 0 {
            return Some((0, 0));
        }
        let span = self.last_ts_ms.saturating_sub(self.first_ts_ms);
        let gap = span / self.requests.saturating_sub(1).max(1);
        let period = span.checked_add(gap.max(1))?;
        Some((
            self.max_req_id.checked_add(1)?.checked_mul(pass)?,
            period.checked_mul(pass)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(req_id: u64, ts_ms: u64) -> Request {
        Request {
            ts_ms,
            req_id,
            user_id: 3,
            hist_len: 7,
            candidates: vec![1, 2],
            mode: grflow_traces::Mode::Rank,
            label: None,
        }
    }

    #[test]
    fn later_passes_of_a_loop_move_ids_past_the_trace_and_times_past_its_end() {
        let mut span = TraceSpan::default();
        assert!(span.is_empty());
        // Ids 0..=9 (not in order), event times 1,000..=1,900 every 100 ms.
        for (i, id) in [3, 0, 9, 1, 2, 4, 5, 6, 7, 8].into_iter().enumerate() {
            span.observe(&request(id, 1_000 + 100 * i as u64));
        }
        assert_eq!(span.shift(0), Some((0, 0)));
        // The second pass starts one gap (100 ms) after the first's end.
        assert_eq!(span.shift(1), Some((10, 1_000)));
        assert_eq!(span.shift(3), Some((30, 3_000)));
        // The first request of pass 1 comes after the last of pass 0.
        let (_, dt) = span.shift(1).unwrap();
        assert!(1_000 + dt > 1_900);
        assert_eq!(span.shift(u64::MAX), None, "overflow refused");
        // Out of time order: the span is least to greatest, not first to
        // greatest (pass 1 would overlap pass 0 by 900 ms).
        let mut backwards = TraceSpan::default();
        for (i, id) in (0..10).enumerate() {
            backwards.observe(&request(id, 1_900 - 100 * i as u64));
        }
        assert_eq!(backwards.shift(1), Some((10, 1_000)));
        // One request at one instant: passes 1 ms apart.
        let mut one = TraceSpan::default();
        one.observe(&request(5, 42));
        assert_eq!(one.shift(2), Some((12, 2)));
    }

    #[test]
    fn requests_are_due_by_their_event_time_or_at_a_fixed_rate() {
        let ms = Duration::from_millis;
        assert_eq!(Pace::Trace(Speed::Max).due(5, 9_000, 1_000), None);
        assert_eq!(
            Pace::Trace(Speed::Factor(2.0)).due(5, 3_000, 1_000),
            Some(ms(1_000))
        );
        // A stamp before the first is due at once.
        assert_eq!(
            Pace::Trace(Speed::Factor(1.0)).due(1, 500, 1_000),
            Some(ms(0))
        );
        assert_eq!(Pace::Rate(200.0).due(10, 0, 0), Some(ms(50)));
        assert_eq!(
            Pace::Trace(Speed::Factor(1e-6)).due(0, u64::MAX, 0),
            Some(Duration::MAX),
            "no overflow"
        );
    }

    #[test]
    fn a_trace_request_goes_out_with_its_history_as_a_prefix_and_the_id_moved() {
        let r = Request {
            ts_ms: 5,
            req_id: 10,
            user_id: 3,
            hist_len: 7,
            candidates: vec![1, 2],
            mode: grflow_traces::Mode::Rank,
            label: Some(1),
        };
        let w = wire_request(&r, 1_000, 100).unwrap();
        assert_eq!(
            (w.req_id, w.ts_ms, w.history.clone()),
            (110, 1_000, History::Prefix(7))
        );
        assert!(wire_request(&r, 0, u64::MAX).is_none(), "overflow refused");
    }
}
